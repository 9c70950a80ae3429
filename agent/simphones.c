/* The phones one sim process hosts: --phones N or --phones-file FILE into one sim
 * configuration per phone. See simphones.h. */
#include "simphones.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "buf.h"
#include "err.h"
#include "json.h"

static int phones_err(char *err, size_t errn, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int phones_err(char *err, size_t errn, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errn) vsnprintf(err, errn, fmt, ap);
  va_end(ap);
  return rc;
}

int ag_simphones_token(const char *base, const char *id, char out[AG_SIMPHONES_TOKEN_LEN + 1]) {
  unsigned char mac[32];
  size_t n = 0;
  if (!EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, base, strlen(base), (const unsigned char *)id,
                 strlen(id), mac, sizeof(mac), &n) || n != sizeof(mac))
    return PR_ETLS;
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof(mac); i++) {
    out[2 * i] = hex[mac[i] >> 4];
    out[2 * i + 1] = hex[mac[i] & 15];
  }
  out[AG_SIMPHONES_TOKEN_LEN] = '\0';
  return 0;
}

/* The rule --id follows: 1-64 characters of A-Z a-z 0-9 . _ - */
static int id_ok(const char *id) {
  size_t n = strlen(id);
  return n > 0 && n <= 64 &&
         strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

static char *dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *s = malloc((size_t)n + 1);
  if (!s) return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

static int read_file(const char *path, pr_buf *text, char *err, size_t errn) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return phones_err(err, errn, -errno, "%s: %s", path, strerror(errno));
  char chunk[65536];
  size_t n;
  int rc = 0;
  while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
    if ((rc = pr_buf_append(text, chunk, n)) < 0) break;
  if (rc == 0 && ferror(fp)) rc = -EIO;
  fclose(fp);
  if (rc < 0) return phones_err(err, errn, rc, "%s: %s", path, pr_strerror(rc));
  return 0;
}

/* One file entry's settings over the phone's (which start as the base's). where names
 * the entry in messages ("FILE: [3]"), path the entry alone ("[3]"). */
static int apply_entry(ag_simphone *ph, const cJSON *e, const char *file, const char *path,
                       const char *where, char *err, size_t errn) {
  static const char *const keys[] = {"id", "listen", "slots", "prefill_tps", "decode_tps", "n_ctx",
                                     "loading_s", "fault_plan", "sysfs_root", "cost_per_day",
                                     "storage_free_mb", NULL};
  pr_json_err je;
  memset(&je, 0, sizeof(je));
  if (!cJSON_IsObject(e)) return phones_err(err, errn, PR_ETYPE, "%s: expected an object", where);
  const char *id = NULL, *listen = NULL, *root = NULL;
  int64_t slots = ph->sc.slots, n_ctx = ph->sc.n_ctx;
  int rc;
  if ((rc = pr_json_check_keys(e, keys, path, &je)) < 0 ||
      (rc = pr_json_get_str(e, "id", 0, &id, path, &je)) < 0 ||
      (rc = pr_json_get_str(e, "listen", 0, &listen, path, &je)) < 0 ||
      (rc = pr_json_get_int(e, "slots", 0, 1, 1024, &slots, path, &je)) < 0 ||
      (rc = pr_json_get_double(e, "prefill_tps", 0, 1e-9, 1e12, &ph->sc.prefill_tps, path, &je)) < 0 ||
      (rc = pr_json_get_double(e, "decode_tps", 0, 1e-9, 1e12, &ph->sc.decode_tps, path, &je)) < 0 ||
      (rc = pr_json_get_int(e, "n_ctx", 0, 1, INT32_MAX, &n_ctx, path, &je)) < 0 ||
      (rc = pr_json_get_double(e, "loading_s", 0, 0, 1e9, &ph->sc.loading_s, path, &je)) < 0 ||
      (rc = pr_json_get_str(e, "sysfs_root", 0, &root, path, &je)) < 0 ||
      (rc = pr_json_get_double(e, "cost_per_day", 0, 0, 1e9, &ph->cost_per_day, path, &je)) < 0 ||
      (rc = pr_json_get_double(e, "storage_free_mb", 0, 0, 1e12, &ph->sc.storage_free_mb, path, &je)) < 0)
    return phones_err(err, errn, rc, "%s: %s: %s", file, je.path, je.msg);
  ph->sc.slots = (int)slots;
  ph->sc.n_ctx = n_ctx;
  if (id && !(ph->id = strdup(id))) return -ENOMEM;
  if (listen && !(ph->listen = strdup(listen))) return -ENOMEM;
  if (root) {
    struct stat sb;
    if (stat(root, &sb) < 0 || !S_ISDIR(sb.st_mode))
      return phones_err(err, errn, -ENOTDIR, "%s.sysfs_root: not a directory: '%s'", where, root);
    if (!(ph->sysfs_root = strdup(root))) return -ENOMEM;
  }
  const cJSON *plan = cJSON_GetObjectItemCaseSensitive(e, "fault_plan");
  if (plan) {
    char base[300], msg[1024];
    ag_fault_plan_free(&ph->plan); /* the entry's plan replaces the command line's */
    if (cJSON_IsString(plan)) {
      rc = ag_fault_plan_load(&ph->plan, plan->valuestring, msg, sizeof(msg));
    } else {
      snprintf(base, sizeof(base), "%s.fault_plan", path);
      rc = ag_fault_plan_from_json(&ph->plan, plan, base, msg, sizeof(msg));
    }
    if (rc < 0) return phones_err(err, errn, rc, "%s.fault_plan: %s", where, msg);
  }
  return 0;
}

/* "HOST:PORT" into its host part's length and the port (-1 when it is not a number). */
static void split_listen(const char *listen, size_t *host_len, long *port) {
  const char *colon = strrchr(listen, ':');
  *host_len = colon ? (size_t)(colon - listen) : strlen(listen);
  *port = -1;
  if (!colon || !colon[1]) return;
  char *end;
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  if (!errno && *end == '\0' && p >= 0 && p <= 65535) *port = p;
}

static int cmp_id(const void *a, const void *b) {
  const ag_simphone *x = *(const ag_simphone *const *)a, *y = *(const ag_simphone *const *)b;
  return strcmp(x->id, y->id);
}

/* Every id once: sorted, neighbours compared. */
static int check_distinct(ag_simphones *p, const char *file, char *err, size_t errn) {
  ag_simphone **v = malloc(p->n * sizeof(*v));
  if (!v) return -ENOMEM;
  for (size_t i = 0; i < p->n; i++) v[i] = &p->v[i];
  qsort(v, p->n, sizeof(*v), cmp_id);
  int rc = 0;
  for (size_t i = 1; i < p->n && rc == 0; i++) {
    if (strcmp(v[i - 1]->id, v[i]->id) != 0) continue;
    size_t a = (size_t)(v[i - 1] - p->v), b = (size_t)(v[i] - p->v);
    if (a > b) {
      size_t t = a;
      a = b;
      b = t;
    }
    rc = phones_err(err, errn, -EEXIST, "%s%sphone %zu has the id '%s' of phone %zu: ids must be distinct",
                    file ? file : "", file ? ": " : "", b + 1, v[i]->id, a + 1);
  }
  free(v);
  return rc;
}

int ag_simphones_build(ag_simphones *out, const ag_simphones_spec *spec, char *err, size_t errn) {
  memset(out, 0, sizeof(*out));
  const ag_sim_config *base = spec->base;
  cJSON *root = NULL;
  pr_buf text;
  pr_buf_init(&text, AG_SIMPHONES_FILE_MAX);
  size_t n = spec->count;
  int rc = 0;
  if (spec->file) {
    pr_json_err je;
    memset(&je, 0, sizeof(je));
    if ((rc = read_file(spec->file, &text, err, errn)) < 0) goto out;
    root = pr_json_parse(text.data ? text.data : "", text.len, 0, &je);
    if (!root) {
      rc = phones_err(err, errn, PR_EPARSE, "%s:%d:%d: %s", spec->file, je.line, je.col, je.msg);
      goto out;
    }
    if (!cJSON_IsArray(root)) {
      rc = phones_err(err, errn, PR_ETYPE, "%s: expected a JSON array of phones ({\"id\", \"slots\", ...})",
                      spec->file);
      goto out;
    }
    n = (size_t)cJSON_GetArraySize(root);
  }
  if (n == 0 || n > AG_SIMPHONES_MAX) {
    rc = phones_err(err, errn, -ERANGE, "%s%sbetween 1 and %d phones, not %zu", spec->file ? spec->file : "",
                    spec->file ? ": " : "", AG_SIMPHONES_MAX, n);
    goto out;
  }
  out->v = calloc(n, sizeof(*out->v));
  if (!out->v) {
    rc = -ENOMEM;
    goto out;
  }
  out->n = n;
  size_t host_len;
  long port0;
  split_listen(base->listen ? base->listen : "", &host_len, &port0);
  const char *prefix = base->id ? base->id : AG_SIMPHONES_ID_PREFIX;
  const cJSON *e = root ? root->child : NULL;
  for (size_t i = 0; i < n; i++, e = e ? e->next : NULL) {
    ag_simphone *ph = &out->v[i];
    char path[32], where[300], why[600];
    pr_json_path_index(path, sizeof(path), "", (int)i);
    snprintf(where, sizeof(where), "%s%s%s", spec->file ? spec->file : "", spec->file ? ": " : "",
             spec->file ? path : "");
    if (!spec->file) snprintf(where, sizeof(where), "phone %zu", i + 1);
    ph->sc = *base;
    ph->cost_per_day = spec->cost_per_day;
    if ((rc = ag_fault_plan_copy(&ph->plan, base->faults)) < 0) goto out;
    if (e && (rc = apply_entry(ph, e, spec->file, path, where, err, errn)) < 0) goto out;
    if (!ph->id && !(ph->id = dup_printf("%s-%zu", prefix, i + 1))) {
      rc = -ENOMEM;
      goto out;
    }
    if (!id_ok(ph->id)) {
      rc = phones_err(err, errn, -EINVAL, "%s: id '%s': 1-64 characters of A-Z a-z 0-9 . _ -", where, ph->id);
      goto out;
    }
    if (!ph->listen) {
      if (port0 < 0) {
        rc = phones_err(err, errn, -EINVAL, "--listen: expected HOST:PORT");
        goto out;
      }
      long port = port0 == 0 ? 0 : port0 + (long)i;
      if (port > 65535) {
        rc = phones_err(err, errn, -ERANGE, "--listen: port %ld + %zu phones passes 65535 (port 0 lets each pick one)",
                        port0, n);
        goto out;
      }
      if (!(ph->listen = dup_printf("%.*s:%ld", (int)host_len, base->listen, port))) {
        rc = -ENOMEM;
        goto out;
      }
    }
    if (base->token && *base->token) {
      char tok[AG_SIMPHONES_TOKEN_LEN + 1];
      if ((rc = ag_simphones_token(base->token, ph->id, tok)) < 0 || !(ph->token = strdup(tok))) {
        rc = rc < 0 ? rc : -ENOMEM;
        goto out;
      }
    }
    ph->sc.id = ph->id;
    ph->sc.listen = ph->listen;
    ph->sc.token = ph->token;
    ph->sc.faults = &ph->plan;
    if ((rc = ag_sim_config_check(&ph->sc, why, sizeof(why))) < 0) {
      phones_err(err, errn, rc, "%s: %s", where, why);
      goto out;
    }
  }
  rc = check_distinct(out, spec->file, err, errn);
out:
  if (rc == -ENOMEM) phones_err(err, errn, rc, "out of memory");
  cJSON_Delete(root);
  pr_buf_free(&text);
  if (rc < 0) ag_simphones_free(out);
  return rc;
}

void ag_simphones_free(ag_simphones *p) {
  for (size_t i = 0; p->v && i < p->n; i++) {
    ag_simphone *ph = &p->v[i];
    ag_fault_plan_free(&ph->plan);
    free(ph->id);
    free(ph->listen);
    if (ph->token) memset(ph->token, 0, strlen(ph->token));
    free(ph->token);
    free(ph->sysfs_root);
  }
  free(p->v);
  p->v = NULL;
  p->n = 0;
}
