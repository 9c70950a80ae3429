/* JSON helpers over cJSON: parsing with a line and column on syntax errors, and typed
 * getters that report the path of a bad field ("replicas[2].slots: expected an
 * integer"). The getters never allocate: strings point into the cJSON tree. */
#ifndef PR_JSON_H
#define PR_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "buf.h"

typedef struct pr_json_err {
  char path[256];  /* "replicas[2].slots", "" for the document itself */
  char msg[256];   /* "expected an integer", "missing", "syntax error" */
  int line, col;   /* 1-based position for syntax errors; 0 when unknown */
} pr_json_err;

/* Parse a whole document of len bytes (need not be NUL-terminated). Trailing
 * non-space bytes are an error. Nesting deeper than max_depth (0: 64) is refused.
 * On failure returns NULL and fills err (line/col of the offending byte). */
cJSON *pr_json_parse(const char *text, size_t len, int max_depth, pr_json_err *err);

/* Line and column (1-based) of byte offset `off` in text. */
void pr_json_position(const char *text, size_t len, size_t off, int *line, int *col);

/* Whether the 8 bytes at p are plain string content: printable ASCII, neither '"' nor
 * '\\' (scanners pass such runs a word at a time). Exact: a borrow in the subtractions
 * reaches a higher byte only from a byte that is itself not plain. */
static inline int pr_json_plain8(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
  uint64_t quote = v ^ (ones * '"'), bslash = v ^ (ones * '\\');
  return ((v | (v - ones * 0x20) | (quote - ones) | (bslash - ones)) & high) == 0;
}

/* Build "base.key" or "base[i]" into out (size n). */
void pr_json_path_key(char *out, size_t n, const char *base, const char *key);
void pr_json_path_index(char *out, size_t n, const char *base, int index);

/* Typed getters. `obj` must be an object; `path` is obj's own path for messages.
 * Return 0 and set *out when the key is present with the right type; return 1 and
 * leave *out untouched when the key is absent and !required; otherwise return a
 * negative code (PR_EMISSING, PR_ETYPE, PR_ERANGE) and fill err with the key's path. */
int pr_json_get_str(const cJSON *obj, const char *key, int required, const char **out,
                    const char *path, pr_json_err *err);
int pr_json_get_bool(const cJSON *obj, const char *key, int required, int *out,
                     const char *path, pr_json_err *err);
/* Integers must be whole numbers within [min, max]. */
int pr_json_get_int(const cJSON *obj, const char *key, int required, int64_t min, int64_t max,
                    int64_t *out, const char *path, pr_json_err *err);
int pr_json_get_double(const cJSON *obj, const char *key, int required, double min, double max,
                       double *out, const char *path, pr_json_err *err);
/* obj[key] when it is a finite number within [min, max], else dflt: for reports where a
 * missing, null or odd value only means "unknown". */
double pr_json_num_or(const cJSON *obj, const char *key, double min, double max, double dflt);
/* Objects and arrays: *out points at the child item. */
int pr_json_get_obj(const cJSON *obj, const char *key, int required, const cJSON **out,
                    const char *path, pr_json_err *err);
int pr_json_get_arr(const cJSON *obj, const char *key, int required, const cJSON **out,
                    const char *path, pr_json_err *err);

/* Refuse keys of obj that are not in the NULL-terminated list `allowed`:
 * returns PR_EUNKNOWN with err naming the first unknown key's path. */
int pr_json_check_keys(const cJSON *obj, const char *const *allowed, const char *path,
                       pr_json_err *err);

/* Serialise item without whitespace at the end of out. Returns 0, -ENOMEM or
 * PR_ETOOLARGE. */
int pr_json_append(pr_buf *out, const cJSON *item);

/* Serialise without whitespace into a malloc'd string (cJSON_PrintUnformatted). */
char *pr_json_print(const cJSON *item);

#endif
