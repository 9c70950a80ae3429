/* Fault plans for the simulated phone: parsing the plan file and answering "what is
 * active now" and "when does that change next". See faults.h. */
#include "faults.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "err.h"
#include "json.h"

/* A plan file is a short hand-written list; refuse anything absurd. */
#define AG_FAULT_PLAN_MAX_BYTES (1u << 20)
#define AG_FAULT_PLAN_MAX_ENTRIES 10000

static const char *const ag_fault_names[AG_FAULT__COUNT] = {
  [AG_FAULT_OFFLINE] = "offline", [AG_FAULT_HANG] = "hang", [AG_FAULT_ERROR503] = "error503",
  [AG_FAULT_SLOW] = "slow",       [AG_FAULT_DROP] = "drop",
  [AG_FAULT_FAST_TIMINGS] = "fast_timings",
  [AG_FAULT_UNPARSABLE] = "unparsable", [AG_FAULT_FAKE] = "fake",
  [AG_FAULT_SUBSTITUTE] = "substitute",
};

const char *ag_fault_kind_name(ag_fault_kind k) {
  return (unsigned)k < AG_FAULT__COUNT ? ag_fault_names[k] : "?";
}

static int fault_kind_from_name(const char *name, ag_fault_kind *out) {
  for (int i = 0; i < AG_FAULT__COUNT; i++) {
    if (strcmp(name, ag_fault_names[i]) == 0) {
      *out = (ag_fault_kind)i;
      return 0;
    }
  }
  return PR_EUNKNOWN;
}

static int fault_err(char *err, size_t errn, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fault_err(char *err, size_t errn, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errn) vsnprintf(err, errn, fmt, ap);
  va_end(ap);
  return rc;
}

int ag_fault_plan_parse(ag_fault_plan *p, const char *text, size_t len, char *err, size_t errn) {
  pr_json_err jerr;
  memset(&jerr, 0, sizeof(jerr));
  p->v = NULL;
  p->n = 0;
  cJSON *root = pr_json_parse(text, len, 0, &jerr);
  if (!root)
    return fault_err(err, errn, PR_EPARSE, "%d:%d: %s", jerr.line, jerr.col, jerr.msg);
  int rc = ag_fault_plan_from_json(p, root, "", err, errn);
  cJSON_Delete(root);
  return rc;
}

int ag_fault_plan_from_json(ag_fault_plan *p, const cJSON *root, const char *base, char *err, size_t errn) {
  static const char *const keys[] = {"at_s", "kind", "dur_s", "factor", "text", "random", NULL};
  pr_json_err jerr;
  memset(&jerr, 0, sizeof(jerr));
  p->v = NULL;
  p->n = 0;
  int rc = 0;
  if (!cJSON_IsArray(root)) {
    rc = fault_err(err, errn, PR_ETYPE, "%s%sexpected a JSON array of {\"at_s\", \"kind\", \"dur_s\"}",
                   base, *base ? ": " : "");
    goto out;
  }
  int n = cJSON_GetArraySize(root);
  if (n > AG_FAULT_PLAN_MAX_ENTRIES) {
    rc = fault_err(err, errn, PR_ETOOLARGE, "%s%smore than %d entries", base, *base ? ": " : "",
                   AG_FAULT_PLAN_MAX_ENTRIES);
    goto out;
  }
  if (n == 0) goto out; /* an empty plan is valid: the phone never misbehaves */
  p->v = calloc((size_t)n, sizeof(*p->v));
  if (!p->v) {
    rc = fault_err(err, errn, -ENOMEM, "out of memory");
    goto out;
  }
  int i = 0;
  for (const cJSON *it = root->child; it; it = it->next, i++) {
    char path[160];
    const char *kind = NULL;
    ag_fault *f = &p->v[i];
    pr_json_path_index(path, sizeof(path), base, i);
    if (!cJSON_IsObject(it)) {
      rc = fault_err(err, errn, PR_ETYPE, "%s: expected an object", path);
      goto out;
    }
    if ((rc = pr_json_check_keys(it, keys, path, &jerr)) < 0 ||
        (rc = pr_json_get_double(it, "at_s", 1, 0.0, 1e9, &f->at_s, path, &jerr)) < 0 ||
        (rc = pr_json_get_double(it, "dur_s", 1, 0.0, 1e9, &f->dur_s, path, &jerr)) < 0 ||
        (rc = pr_json_get_str(it, "kind", 1, &kind, path, &jerr)) < 0) {
      rc = fault_err(err, errn, rc, "%s: %s", jerr.path, jerr.msg);
      goto out;
    }
    if (!(f->dur_s > 0.0)) {
      rc = fault_err(err, errn, PR_ERANGE, "%s.dur_s: must be greater than 0", path);
      goto out;
    }
    if (fault_kind_from_name(kind, &f->kind) < 0) {
      rc = fault_err(err, errn, PR_EUNKNOWN,
                     "%s.kind: unknown kind \"%s\" (expected offline, hang, error503, slow, drop, fast_timings, unparsable, fake or substitute)",
                     path, kind);
      goto out;
    }
    f->factor = AG_FAULT_SLOW_FACTOR;
    if (cJSON_GetObjectItemCaseSensitive(it, "factor")) {
      if (f->kind != AG_FAULT_SLOW) {
        rc = fault_err(err, errn, PR_EUNKNOWN, "%s.factor: only a slow window takes a factor", path);
        goto out;
      }
      if ((rc = pr_json_get_double(it, "factor", 1, 1.0, 100.0, &f->factor, path, &jerr)) < 0) {
        rc = fault_err(err, errn, rc, "%s: %s", jerr.path, jerr.msg);
        goto out;
      }
    }
    const cJSON *txt = cJSON_GetObjectItemCaseSensitive(it, "text");
    const cJSON *rnd = cJSON_GetObjectItemCaseSensitive(it, "random");
    if ((txt || rnd) && f->kind != AG_FAULT_FAKE) {
      rc = fault_err(err, errn, PR_EUNKNOWN, "%s.%s: only a fake window takes it", path, txt ? "text" : "random");
      goto out;
    }
    if (rnd && !cJSON_IsBool(rnd)) {
      rc = fault_err(err, errn, PR_ETYPE, "%s.random: expected true or false", path);
      goto out;
    }
    f->random = cJSON_IsTrue(rnd);
    if (txt && (!cJSON_IsString(txt) || !txt->valuestring[0] || strlen(txt->valuestring) >= AG_FAULT_TEXT_MAX)) {
      rc = fault_err(err, errn, PR_ERANGE, "%s.text: expected a string of 1 to %d bytes", path, AG_FAULT_TEXT_MAX - 1);
      goto out;
    }
    if (f->kind == AG_FAULT_FAKE && !f->random)
      snprintf(f->text, sizeof(f->text), "%s", txt ? txt->valuestring : AG_FAULT_FAKE_TEXT);
  }
  p->n = (size_t)n;
  rc = 0;
out:
  if (rc < 0) ag_fault_plan_free(p);
  return rc;
}

int ag_fault_plan_load(ag_fault_plan *p, const char *path, char *err, size_t errn) {
  p->v = NULL;
  p->n = 0;
  FILE *fp = fopen(path, "rb");
  if (!fp) return fault_err(err, errn, -errno, "%s: %s", path, strerror(errno));
  pr_buf text;
  pr_buf_init(&text, AG_FAULT_PLAN_MAX_BYTES);
  char chunk[4096];
  size_t n;
  int rc = 0;
  while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0) {
    if ((rc = pr_buf_append(&text, chunk, n)) < 0) break;
  }
  if (rc == 0 && ferror(fp)) rc = -EIO;
  fclose(fp);
  if (rc < 0) {
    pr_buf_free(&text);
    return fault_err(err, errn, rc, "%s: %s", path, pr_strerror(rc));
  }
  char msg[512];
  rc = ag_fault_plan_parse(p, text.data ? text.data : "", text.len, msg, sizeof(msg));
  pr_buf_free(&text);
  if (rc < 0) return fault_err(err, errn, rc, "%s: %s", path, msg);
  return 0;
}

int ag_fault_plan_copy(ag_fault_plan *dst, const ag_fault_plan *src) {
  dst->v = NULL;
  dst->n = 0;
  if (!src || src->n == 0) return 0;
  dst->v = malloc(src->n * sizeof(*dst->v));
  if (!dst->v) return -ENOMEM;
  memcpy(dst->v, src->v, src->n * sizeof(*dst->v));
  dst->n = src->n;
  return 0;
}

void ag_fault_plan_free(ag_fault_plan *p) {
  free(p->v);
  p->v = NULL;
  p->n = 0;
}

unsigned ag_fault_plan_active(const ag_fault_plan *p, double t) {
  unsigned set = 0;
  for (size_t i = 0; p && i < p->n; i++) {
    const ag_fault *f = &p->v[i];
    if (t >= f->at_s && t < f->at_s + f->dur_s) set |= AG_FAULT_BIT(f->kind);
  }
  return set;
}

double ag_fault_plan_slow_factor(const ag_fault_plan *p, double t) {
  double k = 1.0;
  for (size_t i = 0; p && i < p->n; i++) {
    const ag_fault *f = &p->v[i];
    if (f->kind == AG_FAULT_SLOW && t >= f->at_s && t < f->at_s + f->dur_s && f->factor > k) k = f->factor;
  }
  return k;
}

const ag_fault *ag_fault_plan_fake(const ag_fault_plan *p, double t) {
  for (size_t i = 0; p && i < p->n; i++) {
    const ag_fault *f = &p->v[i];
    if (f->kind == AG_FAULT_FAKE && t >= f->at_s && t < f->at_s + f->dur_s) return f;
  }
  return NULL;
}

double ag_fault_plan_next_change(const ag_fault_plan *p, double t) {
  double next = -1.0;
  for (size_t i = 0; p && i < p->n; i++) {
    const double edges[2] = {p->v[i].at_s, p->v[i].at_s + p->v[i].dur_s};
    for (int e = 0; e < 2; e++)
      if (edges[e] > t && (next < 0.0 || edges[e] < next)) next = edges[e];
  }
  return next;
}
