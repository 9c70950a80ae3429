/* nlohmann::ordered_json's dump() and dump(2), over a cJSON tree; see nljson.h. */
#include "nljson.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

const char *ag_nl_type_name(const cJSON *item) {
  if (cJSON_IsNull(item)) return "null";
  if (cJSON_IsBool(item)) return "boolean";
  if (cJSON_IsNumber(item)) return "number";
  if (cJSON_IsString(item)) return "string";
  if (cJSON_IsArray(item)) return "array";
  if (cJSON_IsObject(item)) return "object";
  return "discarded";
}

/* ---- number literals --------------------------------------------------------------- */

static int is_num_char(char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

static size_t count_numbers(const cJSON *node) {
  size_t n = cJSON_IsNumber(node) ? 1 : 0;
  for (const cJSON *c = node->child; c; c = c->next) n += count_numbers(c);
  return n;
}

/* The number nodes in pre-order, which is the order of their literals in the text. */
static void collect_numbers(const cJSON *node, ag_nl_lit *lit, size_t *i) {
  if (cJSON_IsNumber(node)) lit[(*i)++].node = node;
  for (const cJSON *c = node->child; c; c = c->next) collect_numbers(c, lit, i);
}

static int lit_cmp(const void *a, const void *b) {
  const void *x = ((const ag_nl_lit *)a)->node, *y = ((const ag_nl_lit *)b)->node;
  return x < y ? -1 : x > y;
}

int ag_nl_lits_scan(ag_nl_lits *lits, const cJSON *root, const char *text, size_t len) {
  memset(lits, 0, sizeof(*lits));
  size_t want = root ? count_numbers(root) : 0;
  if (!want) return 0;
  ag_nl_lit *lit = calloc(want, sizeof(*lit));
  if (!lit) return -ENOMEM;
  size_t k = 0;
  collect_numbers(root, lit, &k);
  /* Numbers are the only tokens outside strings that start with a digit or '-'. */
  size_t n = 0;
  int in_str = 0;
  for (size_t i = 0; i < len && n <= want; i++) {
    char c = text[i];
    if (in_str) {
      if (c == '\\') i++;
      else if (c == '"') in_str = 0;
    } else if (c == '"') {
      in_str = 1;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = i;
      while (i + 1 < len && is_num_char(text[i + 1])) i++;
      if (n < want) {
        lit[n].off = start;
        lit[n].len = i + 1 - start;
      }
      n++;
    }
  }
  if (n != want) { /* not the text this tree came from: fall back on the doubles */
    free(lit);
    return 0;
  }
  qsort(lit, want, sizeof(*lit), lit_cmp);
  lits->text = text;
  lits->lit = lit;
  lits->n = want;
  return 0;
}

void ag_nl_lits_free(ag_nl_lits *lits) {
  free(lits->lit);
  memset(lits, 0, sizeof(*lits));
}

/* The literal of a number node, or NULL. */
static const char *find_lit(const ag_nl_lits *lits, const cJSON *node, size_t *len) {
  if (!lits || !lits->n) return NULL;
  ag_nl_lit key = {.node = node};
  const ag_nl_lit *hit = bsearch(&key, lits->lit, lits->n, sizeof(key), lit_cmp);
  if (!hit) return NULL;
  *len = hit->len;
  return lits->text + hit->off;
}

/* ---- numbers as nlohmann writes them -------------------------------------------- */

/* nlohmann's dtoa: the shortest digits that read back as d, then fixed notation when the
 * decimal point falls within (-4, 15] of them, else d.ddde+XX; always a '.' or an 'e'. */
static int nl_double(pr_buf *out, double d) {
  if (!isfinite(d)) return pr_buf_append_str(out, "null");
  if (signbit(d)) {
    int rc = pr_buf_append_str(out, "-");
    if (rc < 0) return rc;
    d = -d;
  }
  if (d == 0) return pr_buf_append_str(out, "0.0");
  char sci[40];
  for (int p = 0; p < 17; p++) {
    snprintf(sci, sizeof(sci), "%.*e", p, d);
    if (strtod(sci, NULL) == d) break;
  }
  char dig[24];
  int k = 0;
  const char *e = strchr(sci, 'e');
  for (const char *p = sci; p < e && k < (int)sizeof(dig) - 1; p++)
    if (*p >= '0' && *p <= '9') dig[k++] = *p;
  while (k > 1 && dig[k - 1] == '0') k--;
  dig[k] = '\0';
  int n = atoi(e + 1) + 1; /* where the decimal point goes, counted in digits */
  if (k <= n && n <= 15) {
    int rc = pr_buf_append_str(out, dig);
    for (int i = k; rc == 0 && i < n; i++) rc = pr_buf_append_str(out, "0");
    return rc ? rc : pr_buf_append_str(out, ".0");
  }
  if (0 < n && n <= 15) return pr_buf_appendf(out, "%.*s.%s", n, dig, dig + n);
  if (-4 < n && n <= 0) return pr_buf_appendf(out, "0.%.*s%s", -n, "000", dig);
  int x = n - 1;
  return pr_buf_appendf(out, "%.1s%s%se%c%02d", dig, k > 1 ? "." : "", dig + 1, x < 0 ? '-' : '+',
                        x < 0 ? -x : x);
}

static int nl_number(pr_buf *out, const cJSON *item, const ag_nl_lits *lits) {
  size_t len = 0;
  const char *lit = find_lit(lits, item, &len);
  char txt[64];
  if (lit && len < sizeof(txt)) {
    memcpy(txt, lit, len);
    txt[len] = '\0';
    if (strspn(txt + (txt[0] == '-'), "0123456789") == len - (txt[0] == '-')) {
      /* an integer literal stays one while it fits 64 bits, signed or not */
      char *end;
      errno = 0;
      if (txt[0] == '-') {
        long long v = strtoll(txt, &end, 10);
        if (!errno) return pr_buf_appendf(out, "%lld", v);
      } else {
        unsigned long long v = strtoull(txt, &end, 10);
        if (!errno) return pr_buf_appendf(out, "%llu", v);
      }
    }
    return nl_double(out, strtod(txt, NULL));
  }
  double d = item->valuedouble;
  if (d == floor(d) && fabs(d) < 9.2e18) return pr_buf_appendf(out, "%" PRId64, (int64_t)d);
  return nl_double(out, d);
}

static int nl_string(pr_buf *out, const char *s) {
  int rc = pr_buf_append_str(out, "\"");
  for (const unsigned char *p = (const unsigned char *)s; rc == 0 && *p; p++) {
    const unsigned char *run = p;
    while (*p >= 0x20 && *p != '"' && *p != '\\') p++;
    if (p > run) rc = pr_buf_append(out, run, (size_t)(p - run));
    if (rc < 0 || !*p) break;
    switch (*p) {
      case '"': rc = pr_buf_append_str(out, "\\\""); break;
      case '\\': rc = pr_buf_append_str(out, "\\\\"); break;
      case '\b': rc = pr_buf_append_str(out, "\\b"); break;
      case '\f': rc = pr_buf_append_str(out, "\\f"); break;
      case '\n': rc = pr_buf_append_str(out, "\\n"); break;
      case '\r': rc = pr_buf_append_str(out, "\\r"); break;
      case '\t': rc = pr_buf_append_str(out, "\\t"); break;
      default: rc = pr_buf_appendf(out, "\\u%04x", *p); break;
    }
  }
  if (rc == 0) rc = pr_buf_append_str(out, "\"");
  return rc;
}

static int nl_newline(pr_buf *out, int indent, int level) {
  if (indent < 0) return 0;
  int rc = pr_buf_append_str(out, "\n");
  for (int i = 0; rc == 0 && i < indent * level; i++) rc = pr_buf_append_str(out, " ");
  return rc;
}

/* ordered_json keeps a key where it first appeared, with the value it had last. */
static const cJSON *first_of_key(const cJSON *obj, const cJSON *c) {
  for (const cJSON *o = obj->child; o != c; o = o->next)
    if (strcmp(o->string, c->string) == 0) return o;
  return NULL;
}

static const cJSON *last_of_key(const cJSON *c) {
  const cJSON *last = c;
  for (const cJSON *o = c->next; o; o = o->next)
    if (strcmp(o->string, c->string) == 0) last = o;
  return last;
}

static int nl_value(pr_buf *out, const cJSON *item, int indent, int level, const ag_nl_lits *lits) {
  if (cJSON_IsNull(item)) return pr_buf_append_str(out, "null");
  if (cJSON_IsTrue(item)) return pr_buf_append_str(out, "true");
  if (cJSON_IsFalse(item)) return pr_buf_append_str(out, "false");
  if (cJSON_IsNumber(item)) return nl_number(out, item, lits);
  if (cJSON_IsString(item)) return nl_string(out, item->valuestring ? item->valuestring : "");
  int obj = cJSON_IsObject(item);
  if (!obj && !cJSON_IsArray(item)) return pr_buf_append_str(out, "null");
  if (!item->child) return pr_buf_append_str(out, obj ? "{}" : "[]");
  int rc = pr_buf_append_str(out, obj ? "{" : "[");
  int first = 1;
  for (const cJSON *c = item->child; rc == 0 && c; c = c->next) {
    const cJSON *v = c;
    if (obj && c->string) {
      if (first_of_key(item, c)) continue;
      v = last_of_key(c);
    }
    if (!first) rc = pr_buf_append_str(out, ",");
    first = 0;
    if (rc == 0) rc = nl_newline(out, indent, level + 1);
    if (rc == 0 && obj) rc = nl_string(out, c->string ? c->string : "");
    if (rc == 0 && obj) rc = pr_buf_append_str(out, indent < 0 ? ":" : ": ");
    if (rc == 0) rc = nl_value(out, v, indent, level + 1, lits);
  }
  if (rc == 0) rc = nl_newline(out, indent, level);
  if (rc == 0) rc = pr_buf_append_str(out, obj ? "}" : "]");
  return rc;
}

int ag_nl_dump(pr_buf *out, const cJSON *item, int indent, const ag_nl_lits *lits) {
  return nl_value(out, item, indent, 0, lits);
}
