/* JSON helpers over cJSON: whole-document parsing with a depth limit and a line and
 * column for syntax errors, and typed getters whose errors name the field's path, so
 * config files and request bodies fail with a message a person can act on. */
#include "json.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "err.h"

#define JSON_DEFAULT_DEPTH 64

static void err_set(pr_json_err *err, const char *path, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void err_set(pr_json_err *err, const char *path, int line, int col, const char *fmt, ...) {
  if (!err) return;
  snprintf(err->path, sizeof(err->path), "%s", path ? path : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
  va_end(ap);
  err->line = line;
  err->col = col;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* cJSON's own limit is 1000 and not adjustable per call, so the depth is checked before
 * cJSON sees the text. Returns the offset of the first bracket past max_depth, or len. */
static size_t depth_scan(const char *text, size_t len, int max_depth) {
  int depth = 0, in_str = 0;
  for (size_t i = 0; i < len; i++) {
    /* most of a request is string content: pass it quickly */
    if (in_str) {
      while (i + 8 <= len && pr_json_plain8((const unsigned char *)text + i)) i += 8;
      while (i < len && text[i] != '"' && text[i] != '\\') i++;
    }
    if (i >= len) break;
    char c = text[i];
    if (in_str) {
      if (c == '\\') i++;
      else if (c == '"') in_str = 0;
    } else if (c == '"') {
      in_str = 1;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
  return len;
}

void pr_json_position(const char *text, size_t len, size_t off, int *line, int *col) {
  int l = 1, c = 1;
  if (off > len) off = len;
  for (size_t i = 0; i < off; i++) {
    unsigned char ch = (unsigned char)text[i];
    if (ch == '\n') {
      l++;
      c = 1;
    } else if ((ch & 0xC0) != 0x80) {
      /* Columns count characters, not UTF-8 bytes, as editors show them. */
      c++;
    }
  }
  if (line) *line = l;
  if (col) *col = c;
}

cJSON *pr_json_parse(const char *text, size_t len, int max_depth, pr_json_err *err) {
  int line, col;
  if (max_depth <= 0) max_depth = JSON_DEFAULT_DEPTH;
  if (!text) len = 0;
  size_t deep = depth_scan(text, len, max_depth);
  if (deep < len) {
    pr_json_position(text, len, deep, &line, &col);
    err_set(err, "", line, col, "nesting deeper than %d levels", max_depth);
    return NULL;
  }
  size_t i = 0;
  while (i < len && is_ws(text[i])) i++;
  if (i == len) {
    pr_json_position(text, len, len, &line, &col);
    err_set(err, "", line, col, "syntax error: empty document");
    return NULL;
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!root) {
    size_t off = end && end >= text ? (size_t)(end - text) : 0;
    pr_json_position(text, len, off, &line, &col);
    /* cJSON's error offset is approximate (it may be one past the culprit, and the
     * last byte for a truncated document), so the message stays plain. */
    err_set(err, "", line, col, "syntax error");
    return NULL;
  }
  size_t off = end && end >= text ? (size_t)(end - text) : len;
  while (off < len && is_ws(text[off])) off++;
  if (off < len) {
    pr_json_position(text, len, off, &line, &col);
    err_set(err, "", line, col, "syntax error: unexpected data after the document");
    cJSON_Delete(root);
    return NULL;
  }
  return root;
}

void pr_json_path_key(char *out, size_t n, const char *base, const char *key) {
  if (!n) return;
  if (base && *base) snprintf(out, n, "%s.%s", base, key);
  else snprintf(out, n, "%s", key);
}

void pr_json_path_index(char *out, size_t n, const char *base, int index) {
  if (!n) return;
  snprintf(out, n, "%s[%d]", base ? base : "", index);
}

/* Shared start of every getter: finds the key, or says why there is nothing to read.
 * Returns 0 with *item set, 1 for absent-and-optional, or a negative code. */
static int lookup(const cJSON *obj, const char *key, int required, const cJSON **item,
                  const char *path, pr_json_err *err) {
  if (!cJSON_IsObject(obj)) {
    err_set(err, path, 0, 0, "expected an object");
    return PR_ETYPE;
  }
  *item = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (*item) return 0;
  if (!required) return 1;
  char p[sizeof(err->path)];
  pr_json_path_key(p, sizeof(p), path, key);
  err_set(err, p, 0, 0, "missing");
  return PR_EMISSING;
}

static int field_err(pr_json_err *err, const char *path, const char *key, int code,
                     const char *msg) {
  char p[sizeof(err->path)];
  pr_json_path_key(p, sizeof(p), path, key);
  err_set(err, p, 0, 0, "%s", msg);
  return code;
}

int pr_json_get_str(const cJSON *obj, const char *key, int required, const char **out,
                    const char *path, pr_json_err *err) {
  const cJSON *it;
  int rc = lookup(obj, key, required, &it, path, err);
  if (rc) return rc;
  if (!cJSON_IsString(it) || !it->valuestring)
    return field_err(err, path, key, PR_ETYPE, "expected a string");
  *out = it->valuestring;
  return 0;
}

int pr_json_get_bool(const cJSON *obj, const char *key, int required, int *out,
                     const char *path, pr_json_err *err) {
  const cJSON *it;
  int rc = lookup(obj, key, required, &it, path, err);
  if (rc) return rc;
  if (!cJSON_IsBool(it)) return field_err(err, path, key, PR_ETYPE, "expected a boolean");
  *out = cJSON_IsTrue(it) ? 1 : 0;
  return 0;
}

int pr_json_get_int(const cJSON *obj, const char *key, int required, int64_t min, int64_t max,
                    int64_t *out, const char *path, pr_json_err *err) {
  const cJSON *it;
  int rc = lookup(obj, key, required, &it, path, err);
  if (rc) return rc;
  if (!cJSON_IsNumber(it)) return field_err(err, path, key, PR_ETYPE, "expected an integer");
  double d = it->valuedouble;
  if (!isfinite(d) || d != floor(d))
    return field_err(err, path, key, PR_ETYPE, "expected an integer");
  /* 2^63 is exactly representable; anything at or past it cannot be an int64_t. */
  if (d < (double)min || d > (double)max || d >= 9223372036854775808.0) {
    char msg[128];
    snprintf(msg, sizeof(msg), "must be between %lld and %lld", (long long)min,
             (long long)max);
    return field_err(err, path, key, PR_ERANGE, msg);
  }
  int64_t v = (int64_t)d;
  /* The double comparison above rounds near 2^53 and beyond; recheck exactly. */
  if (v < min || v > max) {
    char msg[128];
    snprintf(msg, sizeof(msg), "must be between %lld and %lld", (long long)min,
             (long long)max);
    return field_err(err, path, key, PR_ERANGE, msg);
  }
  *out = v;
  return 0;
}

int pr_json_get_double(const cJSON *obj, const char *key, int required, double min, double max,
                       double *out, const char *path, pr_json_err *err) {
  const cJSON *it;
  int rc = lookup(obj, key, required, &it, path, err);
  if (rc) return rc;
  if (!cJSON_IsNumber(it)) return field_err(err, path, key, PR_ETYPE, "expected a number");
  double d = it->valuedouble;
  /* cJSON turns 1e999 into infinity; no config value means that. */
  if (!isfinite(d) || d < min || d > max) {
    char msg[128];
    snprintf(msg, sizeof(msg), "must be between %g and %g", min, max);
    return field_err(err, path, key, PR_ERANGE, msg);
  }
  *out = d;
  return 0;
}

double pr_json_num_or(const cJSON *obj, const char *key, double min, double max, double dflt) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsNumber(it) || !(it->valuedouble >= min && it->valuedouble <= max)) return dflt;
  return it->valuedouble;
}

int pr_json_get_obj(const cJSON *obj, const char *key, int required, const cJSON **out,
                    const char *path, pr_json_err *err) {
  const cJSON *it;
  int rc = lookup(obj, key, required, &it, path, err);
  if (rc) return rc;
  if (!cJSON_IsObject(it)) return field_err(err, path, key, PR_ETYPE, "expected an object");
  *out = it;
  return 0;
}

int pr_json_get_arr(const cJSON *obj, const char *key, int required, const cJSON **out,
                    const char *path, pr_json_err *err) {
  const cJSON *it;
  int rc = lookup(obj, key, required, &it, path, err);
  if (rc) return rc;
  if (!cJSON_IsArray(it)) return field_err(err, path, key, PR_ETYPE, "expected an array");
  *out = it;
  return 0;
}

int pr_json_check_keys(const cJSON *obj, const char *const *allowed, const char *path,
                       pr_json_err *err) {
  if (!cJSON_IsObject(obj)) {
    err_set(err, path, 0, 0, "expected an object");
    return PR_ETYPE;
  }
  for (const cJSON *it = obj->child; it; it = it->next) {
    int ok = 0;
    for (const char *const *a = allowed; a && *a; a++) {
      if (it->string && strcmp(*a, it->string) == 0) {
        ok = 1;
        break;
      }
    }
    if (!ok) return field_err(err, path, it->string ? it->string : "", PR_EUNKNOWN,
                              "unknown key");
  }
  return 0;
}

char *pr_json_print(const cJSON *item) { return cJSON_PrintUnformatted(item); }

int pr_json_append(pr_buf *out, const cJSON *item) {
  /* Print in place when the caller made room (cJSON would otherwise grow its own buffer
   * by doublings and we would copy the result); else, or when it does not fit, the
   * usual way. */
  size_t room = out->cap > out->len ? out->cap - out->len : 0;
  if (room >= 256) {
    if (room <= out->max - out->len + 1 && room <= INT_MAX &&
        cJSON_PrintPreallocated((cJSON *)item, out->data + out->len, (int)room, 0)) {
      out->len += strlen(out->data + out->len);
      return 0;
    }
    out->data[out->len] = '\0';
  }
  char *s = cJSON_PrintUnformatted(item);
  if (!s) return -ENOMEM;
  int rc = pr_buf_append_str(out, s);
  cJSON_free(s);
  return rc;
}
