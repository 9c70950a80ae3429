/* The sim's generated text: noise words, JSON from a schema, tokens, logprobs. See
 * simgen.h. */
#include "simgen.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* Schemas nest; $ref may loop. Past this depth a value is cut short (null). */
#define SG_MAX_DEPTH 16
/* Sub-schemas visited, values generated: type lists and item counts multiply at every
 * level, so a small hostile schema could ask for billions. Past these, the check stops
 * and values are cut short. */
#define SG_MAX_VISITS 100000
#define SG_MAX_VALUES 20000
/* Items generated for an array that asks for more (minItems). */
#define SG_MAX_ITEMS 8
/* Characters a generated string may be padded to (minLength). */
#define SG_MAX_STRING 4096
#define SG_WORD_ID0 100
#define SG_OTHER_ID0 1000
#define SG_OTHER_IDS 31000

/* One token is one short word. A few non-ASCII words keep UTF-8 honest. */
static const char *const sg_words[] = {
  " the", " phone", " model", " token", " quiet", " river", " stone", " light", " paper",
  " orbit", " maple", " signal", " copper", " lantern", " meadow", " pixel", " cloud",
  " garden", " silver", " window", " harbor", " engine", " ember", " falcon", " violet",
  " canyon", " whisper", " nickel", " summit", " tundra", " velvet", " zephyr", " amber",
  " cobalt", " delta", " fjord", " glacier", " hollow", " island", " jasmine", " kettle",
  " lumen", " mosaic", " nectar", " oasis", " prism", " quartz", " ripple", " saffron",
  " timber", " umbra", " vertex", " willow", " yonder", " zenith", " and", " of", " a",
  " Größe", " разли", " café", " naïve", " 東京", " ok",
};
#define SG_N_WORDS (sizeof(sg_words) / sizeof(sg_words[0]))

uint64_t ag_simgen_rand(uint64_t *state) {
  /* xorshift64*: plenty for noise text and ids. */
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 2685821657736338717ull;
}

/* A uniform double in [0, 1). */
static double sg_unit(uint64_t *rng) { return (double)(ag_simgen_rand(rng) >> 11) / 9007199254740992.0; }

const char *ag_simgen_word(uint64_t *rng, int *id) {
  size_t i = ag_simgen_rand(rng) % SG_N_WORDS;
  if (id) *id = SG_WORD_ID0 + (int)i;
  return sg_words[i];
}

/* ---- schemas as llama-server's grammar builder reads them --------------------------- */

static const cJSON *sg_get(const cJSON *obj, const char *key) {
  return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

/* v when it is an array (an object), else NULL: what cJSON_ArrayForEach may walk. */
static const cJSON *sg_arr(const cJSON *v) { return cJSON_IsArray(v) ? v : NULL; }
static const cJSON *sg_obj(const cJSON *v) { return cJSON_IsObject(v) ? v : NULL; }

static int sg_type_is(const cJSON *type, const char *name) {
  return cJSON_IsString(type) && strcmp(type->valuestring, name) == 0;
}

/* nlohmann's empty(): null, and objects and arrays without members. */
static int sg_empty(const cJSON *v) {
  return !v || cJSON_IsNull(v) || ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child);
}

static int sg_known_type(const cJSON *type) {
  static const char *const names[] = {"boolean", "number", "integer", "value", "object",
                                      "array",   "uuid",   "char",    "string", "null"};
  for (size_t i = 0; cJSON_IsString(type) && i < sizeof(names) / sizeof(names[0]); i++)
    if (strcmp(type->valuestring, names[i]) == 0) return 1;
  return 0;
}

static int sg_format_is(const cJSON *schema, const char *const *names) {
  const cJSON *f = sg_get(schema, "format");
  for (; cJSON_IsString(f) && *names; names++)
    if (strcmp(f->valuestring, *names) == 0) return 1;
  return 0;
}

/* One schema check: where its messages go and how much is left to visit. */
typedef struct sg_chk {
  const ag_nl_lits *lits;
  pr_buf *errors;
  int n;      /* messages so far */
  long left;  /* visits left */
} sg_chk;

/* The message for schema, whose "type" is `type` (one of a list the schema holds). */
static int sg_unrecognized(sg_chk *c, const cJSON *schema, const cJSON *type) {
  const ag_nl_lits *lits = c->lits;
  pr_buf *errors = c->errors;
  int rc = pr_buf_append_str(errors, errors->len ? "\nUnrecognized schema: " : "Unrecognized schema: ");
  c->n++;
  if (rc < 0 || !cJSON_IsObject(schema) || sg_get(schema, "type") == type)
    return rc < 0 ? rc : ag_nl_dump(errors, schema, -1, lits);
  /* a copy of schema with "type" replaced, written key by key */
  const char *sep = "{";
  for (const cJSON *m = schema->child; rc == 0 && m; m = m->next) {
    rc = pr_buf_appendf(errors, "%s", sep);
    sep = ",";
    cJSON key = {.type = cJSON_String, .valuestring = m->string};
    if (rc == 0) rc = ag_nl_dump(errors, &key, -1, NULL);
    if (rc == 0) rc = pr_buf_append_str(errors, ":");
    if (rc == 0) rc = ag_nl_dump(errors, strcmp(m->string, "type") == 0 ? type : m, -1, lits);
  }
  return rc ? rc : pr_buf_append_str(errors, "}");
}

/* The branches of json-schema-to-grammar's visit(), in its order: only the ones that
 * reach sub-schemas or end in "Unrecognized schema" matter here. */
static int sg_check(sg_chk *c, const cJSON *s, const cJSON *type, int depth) {
  static const char *const uuid[] = {"uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5", NULL};
  static const char *const dates[] = {"date", "time", "date-time", NULL};
  if (depth > SG_MAX_DEPTH || c->left-- <= 0) return 0;
  if (!type) type = sg_get(s, "type");
  int untyped = !type || cJSON_IsNull(type), rc = 0;
  const cJSON *alts = sg_get(s, "oneOf") ? sg_get(s, "oneOf") : sg_get(s, "anyOf");
  const cJSON *it, *addl = sg_get(s, "additionalProperties");
  if (sg_get(s, "$ref")) return 0;
  if (alts) {
    cJSON_ArrayForEach(it, sg_arr(alts)) {
      if ((rc = sg_check(c, it, NULL, depth + 1)) < 0) return rc;
    }
    return 0;
  }
  if (cJSON_IsArray(type)) { /* one alternative per type: the schema with that type */
    cJSON_ArrayForEach(it, type) {
      if ((rc = sg_check(c, s, it, depth + 1)) < 0) return rc;
    }
    return 0;
  }
  if (sg_get(s, "const") || sg_get(s, "enum")) return 0;
  if ((untyped || sg_type_is(type, "object")) &&
      (sg_get(s, "properties") || (addl && !cJSON_IsTrue(addl)))) {
    cJSON_ArrayForEach(it, sg_obj(sg_get(s, "properties"))) {
      if ((rc = sg_check(c, it, NULL, depth + 1)) < 0) return rc;
    }
    return cJSON_IsObject(addl) ? sg_check(c, addl, NULL, depth + 1) : 0;
  }
  if ((untyped || sg_type_is(type, "object")) && sg_get(s, "allOf")) {
    cJSON_ArrayForEach(it, sg_arr(sg_get(s, "allOf"))) {
      const cJSON *p, *props = sg_get(it, "properties");
      cJSON_ArrayForEach(p, sg_obj(props)) {
        if ((rc = sg_check(c, p, NULL, depth + 1)) < 0) return rc;
      }
    }
    return 0;
  }
  if ((untyped || sg_type_is(type, "array")) && (sg_get(s, "items") || sg_get(s, "prefixItems"))) {
    const cJSON *items = sg_get(s, "items") ? sg_get(s, "items") : sg_get(s, "prefixItems");
    if (!cJSON_IsArray(items)) return sg_check(c, items, NULL, depth + 1);
    cJSON_ArrayForEach(it, items) {
      if ((rc = sg_check(c, it, NULL, depth + 1)) < 0) return rc;
    }
    return 0;
  }
  if ((untyped || sg_type_is(type, "string")) &&
      (sg_get(s, "pattern") || sg_format_is(s, uuid) || sg_format_is(s, dates)))
    return 0;
  if (sg_type_is(type, "string") && (sg_get(s, "minLength") || sg_get(s, "maxLength"))) return 0;
  if (sg_type_is(type, "integer") && (sg_get(s, "minimum") || sg_get(s, "exclusiveMinimum") ||
                                      sg_get(s, "maximum") || sg_get(s, "exclusiveMaximum")))
    return 0;
  if (sg_empty(s) || sg_type_is(type, "object") || sg_known_type(type)) return 0;
  return sg_unrecognized(c, s, type);
}

/* One error line ("\n" between lines). */
static int sg_error_line(sg_chk *c) {
  c->n++;
  return c->errors->len ? pr_buf_append_str(c->errors, "\n") : 0;
}

/* resolve_refs(): every "#/..." $ref is looked up from the root first; a step that is
 * not there stops it with "Error resolving ref <ref>: <step> not in <where it looked>".
 * Refs that are neither local nor https:// are "Unsupported ref". Each ref is checked
 * once; an object holding $ref is not looked into further. */
static int sg_check_refs(sg_chk *c, const cJSON *root, const cJSON *n, const cJSON **seen, size_t *n_seen,
                         size_t cap, int depth) {
  const cJSON *it;
  int rc = 0;
  if (depth > SG_MAX_DEPTH || c->left-- <= 0) return 0;
  if (cJSON_IsArray(n) || (cJSON_IsObject(n) && !sg_get(n, "$ref"))) {
    cJSON_ArrayForEach(it, n) {
      if ((rc = sg_check_refs(c, root, it, seen, n_seen, cap, depth + 1)) < 0) return rc;
    }
    return 0;
  }
  const cJSON *ref = sg_get(n, "$ref");
  if (!cJSON_IsString(ref)) return 0;
  for (size_t i = 0; i < *n_seen; i++)
    if (strcmp(seen[i]->valuestring, ref->valuestring) == 0) return 0;
  if (*n_seen < cap) seen[(*n_seen)++] = ref;
  const char *r = ref->valuestring;
  if (strncmp(r, "https://", 8) == 0) return 0; /* fetched by the real server: not here */
  if (strncmp(r, "#/", 2) != 0) {
    if ((rc = sg_error_line(c)) == 0) rc = pr_buf_appendf(c->errors, "Unsupported ref: %s", r);
    return rc;
  }
  const cJSON *target = root;
  for (const char *p = r + 2;;) {
    const char *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    char sel[256];
    snprintf(sel, sizeof(sel), "%.*s", (int)len, p);
    const cJSON *next = NULL;
    if (cJSON_IsObject(target)) {
      next = sg_get(target, sel);
    } else if (cJSON_IsArray(target)) {
      char *end;
      unsigned long long k = strtoull(sel, &end, 10);
      if (end != sel && k < (unsigned long long)cJSON_GetArraySize(target)) next = cJSON_GetArrayItem(target, (int)k);
    }
    if (!next) {
      if ((rc = sg_error_line(c)) == 0)
        rc = pr_buf_appendf(c->errors, "Error resolving ref %s: %s not in ", r, sel);
      return rc ? rc : ag_nl_dump(c->errors, target, -1, c->lits);
    }
    target = next;
    if (!slash) break;
    p = slash + 1;
  }
  return 0;
}

int ag_simgen_check_schema(const cJSON *schema, const ag_nl_lits *lits, pr_buf *errors) {
  sg_chk c = {.lits = lits, .errors = errors, .left = SG_MAX_VISITS};
  const cJSON *seen[64];
  size_t n_seen = 0;
  int rc = sg_check_refs(&c, schema, schema, seen, &n_seen, sizeof(seen) / sizeof(seen[0]), 0);
  c.left = SG_MAX_VISITS;
  if (rc == 0) rc = sg_check(&c, schema, NULL, 0);
  return rc < 0 ? rc : c.n;
}

/* ---- values from schemas ------------------------------------------------------------ */

typedef struct sg_gen {
  const cJSON *root; /* for "#/..." references */
  uint64_t *rng;
  long left;         /* values left to generate */
} sg_gen;

static cJSON *sg_value(sg_gen *g, const cJSON *s, int depth);

/* "#/a/b" inside the root schema (JSON pointer, ~0 and ~1 unescaped), or NULL. */
static const cJSON *sg_resolve(const sg_gen *g, const cJSON *ref) {
  if (!cJSON_IsString(ref) || strncmp(ref->valuestring, "#", 1) != 0) return NULL;
  const cJSON *at = g->root;
  const char *p = ref->valuestring + 1;
  while (at && *p == '/') {
    char key[256];
    size_t n = 0;
    for (p++; *p && *p != '/' && n + 1 < sizeof(key); p++) {
      if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) key[n++] = *++p == '0' ? '~' : '/';
      else key[n++] = *p;
    }
    key[n] = '\0';
    at = cJSON_IsObject(at) ? cJSON_GetObjectItemCaseSensitive(at, key) : NULL;
  }
  return *p ? NULL : at;
}

/* A few noise words, without the first one's leading space. */
static cJSON *sg_words_string(sg_gen *g, size_t min_chars, size_t max_chars) {
  char txt[SG_MAX_STRING + 64];
  size_t n = 0, chars = 0;
  int words = 2 + (int)(ag_simgen_rand(g->rng) % 2);
  if (min_chars > SG_MAX_STRING) min_chars = SG_MAX_STRING;
  for (int i = 0; i < words || chars < min_chars; i++) {
    const char *w = ag_simgen_word(g->rng, NULL);
    if (n == 0 && w[0] == ' ') w++;
    size_t wl = strlen(w);
    if (n + wl >= sizeof(txt)) break;
    memcpy(txt + n, w, wl);
    n += wl;
    for (size_t k = 0; k < wl; k++) chars += ((unsigned char)w[k] & 0xC0) != 0x80;
  }
  txt[n] = '\0';
  /* maxLength counts characters: cut at a character boundary */
  size_t c = 0;
  for (size_t i = 0; i < n; i++) {
    if (((unsigned char)txt[i] & 0xC0) != 0x80 && c++ == max_chars) {
      txt[i] = '\0';
      break;
    }
  }
  return cJSON_CreateString(txt);
}

static cJSON *sg_string(sg_gen *g, const cJSON *s) {
  const cJSON *f = sg_get(s, "format");
  char txt[64];
  if (cJSON_IsString(f)) {
    const char *v = NULL;
    if (strcmp(f->valuestring, "date-time") == 0) v = "2025-02-20T12:00:00Z";
    else if (strcmp(f->valuestring, "date") == 0) v = "2025-02-20";
    else if (strcmp(f->valuestring, "time") == 0) v = "12:00:00";
    else if (strcmp(f->valuestring, "email") == 0) v = "someone@example.com";
    else if (strcmp(f->valuestring, "uri") == 0 || strcmp(f->valuestring, "url") == 0) v = "https://example.com/";
    else if (strcmp(f->valuestring, "hostname") == 0) v = "example.com";
    else if (strcmp(f->valuestring, "ipv4") == 0) v = "192.0.2.1";
    else if (strncmp(f->valuestring, "uuid", 4) == 0) {
      uint64_t a = ag_simgen_rand(g->rng), b = ag_simgen_rand(g->rng);
      snprintf(txt, sizeof(txt), "%08x-%04x-4%03x-a%03x-%012llx", (unsigned)(a >> 32),
               (unsigned)(a >> 16) & 0xffff, (unsigned)a & 0xfff, (unsigned)(b >> 52) & 0xfff,
               (unsigned long long)(b & 0xffffffffffffull));
      v = txt;
    }
    if (v) return cJSON_CreateString(v);
  }
  const cJSON *mn = sg_get(s, "minLength"), *mx = sg_get(s, "maxLength");
  size_t min_chars = cJSON_IsNumber(mn) && mn->valuedouble > 0 ? (size_t)mn->valuedouble : 0;
  size_t max_chars = cJSON_IsNumber(mx) && mx->valuedouble >= 0 ? (size_t)mx->valuedouble : (size_t)-1;
  return sg_words_string(g, min_chars, max_chars);
}

/* Bounds of a number schema; exclusive ones are moved inwards by `step`. */
static void sg_bounds(const cJSON *s, double step, double *lo, double *hi, int *has_lo, int *has_hi) {
  const cJSON *v;
  *has_lo = *has_hi = 0;
  if (cJSON_IsNumber(v = sg_get(s, "minimum"))) *lo = v->valuedouble, *has_lo = 1;
  if (cJSON_IsNumber(v = sg_get(s, "exclusiveMinimum"))) *lo = v->valuedouble + step, *has_lo = 1;
  if (cJSON_IsNumber(v = sg_get(s, "maximum"))) *hi = v->valuedouble, *has_hi = 1;
  if (cJSON_IsNumber(v = sg_get(s, "exclusiveMaximum"))) *hi = v->valuedouble - step, *has_hi = 1;
  if (!*has_lo) *lo = *has_hi ? fmin(1, *hi) - (*hi < 1 ? 100 : 0) : 1;
  if (!*has_hi) *hi = *lo + 99;
  if (*hi < *lo) *hi = *lo;
}

static cJSON *sg_integer(sg_gen *g, const cJSON *s) {
  double lo, hi;
  int has_lo, has_hi;
  sg_bounds(s, 1, &lo, &hi, &has_lo, &has_hi);
  lo = ceil(lo);
  hi = floor(hi);
  if (hi < lo) hi = lo;
  double span = hi - lo;
  double v = lo + (span < 1e15 ? floor(sg_unit(g->rng) * (span + 1)) : 0);
  const cJSON *m = sg_get(s, "multipleOf");
  if (cJSON_IsNumber(m) && m->valuedouble >= 1) {
    double k = ceil(lo / m->valuedouble) * m->valuedouble;
    v = k <= hi || !has_hi ? k : v;
  }
  return cJSON_CreateNumber(v);
}

static cJSON *sg_number(sg_gen *g, const cJSON *s) {
  double lo, hi;
  int has_lo, has_hi;
  sg_bounds(s, 0, &lo, &hi, &has_lo, &has_hi);
  const cJSON *m = sg_get(s, "multipleOf");
  if (cJSON_IsNumber(m) && m->valuedouble > 0)
    return cJSON_CreateNumber((ceil(lo / m->valuedouble) + (sg_get(s, "exclusiveMinimum") ? 1 : 0)) * m->valuedouble);
  /* two decimals, strictly inside the bounds (exclusive ones too) */
  double v = round((lo + (hi - lo) * (0.25 + 0.5 * sg_unit(g->rng))) * 100) / 100;
  if (!(v > lo && v < hi)) v = (lo + hi) / 2;
  return cJSON_CreateNumber(v);
}

/* Properties of an object schema into obj: the required ones, or all when none is. */
static int sg_fill_object(sg_gen *g, cJSON *obj, const cJSON *s, int depth) {
  const cJSON *props = sg_get(s, "properties"), *req = sg_get(s, "required"), *it;
  int any_required = 0;
  cJSON_ArrayForEach(it, sg_arr(req)) {
    if (!cJSON_IsString(it) || cJSON_GetObjectItemCaseSensitive(obj, it->valuestring)) continue;
    any_required = 1;
    cJSON *v = sg_value(g, sg_get(props, it->valuestring), depth + 1);
    if (!v || !cJSON_AddItemToObject(obj, it->valuestring, v)) {
      cJSON_Delete(v);
      return -ENOMEM;
    }
  }
  if (any_required) return 0;
  cJSON_ArrayForEach(it, sg_obj(props)) {
    if (cJSON_GetObjectItemCaseSensitive(obj, it->string)) continue;
    cJSON *v = sg_value(g, it, depth + 1);
    if (!v || !cJSON_AddItemToObject(obj, it->string, v)) {
      cJSON_Delete(v);
      return -ENOMEM;
    }
  }
  return 0;
}

static cJSON *sg_array(sg_gen *g, const cJSON *s, int depth) {
  const cJSON *mn = sg_get(s, "minItems"), *mx = sg_get(s, "maxItems");
  const cJSON *items = sg_get(s, "items"), *prefix = sg_get(s, "prefixItems");
  if (cJSON_IsArray(items)) prefix = items, items = NULL; /* draft-4 tuples */
  int n = cJSON_IsNumber(mn) && mn->valuedouble > 1 ? (int)fmin(mn->valuedouble, SG_MAX_ITEMS) : 1;
  int np = cJSON_IsArray(prefix) ? cJSON_GetArraySize(prefix) : 0;
  if (np > n) n = np > SG_MAX_ITEMS ? SG_MAX_ITEMS : np;
  if (cJSON_IsNumber(mx) && mx->valuedouble < n) n = mx->valuedouble > 0 ? (int)mx->valuedouble : 0;
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; arr && i < n; i++) {
    const cJSON *is = i < np ? cJSON_GetArrayItem(prefix, i) : items;
    cJSON *v = sg_value(g, is, depth + 1);
    if (!v) {
      cJSON_Delete(arr);
      return NULL;
    }
    cJSON_AddItemToArray(arr, v);
  }
  return arr;
}

/* The type a schema is about: its "type" (the first of a list that is not "null"), else
 * what its keywords suggest. */
static const char *sg_kind(const cJSON *s) {
  const cJSON *type = sg_get(s, "type"), *it;
  if (cJSON_IsString(type)) return type->valuestring;
  if (cJSON_IsArray(type)) {
    const char *first = NULL;
    cJSON_ArrayForEach(it, type) {
      if (!cJSON_IsString(it)) continue;
      if (strcmp(it->valuestring, "null") != 0) return it->valuestring;
      if (!first) first = it->valuestring;
    }
    if (first) return first;
  }
  if (sg_get(s, "properties") || sg_get(s, "required") || sg_get(s, "additionalProperties")) return "object";
  if (sg_get(s, "items") || sg_get(s, "prefixItems")) return "array";
  if (sg_get(s, "minimum") || sg_get(s, "maximum")) return "number";
  return "string";
}

static cJSON *sg_value(sg_gen *g, const cJSON *s, int depth) {
  if (depth > SG_MAX_DEPTH || g->left-- <= 0) return cJSON_CreateNull();
  if (!cJSON_IsObject(s)) return sg_words_string(g, 0, (size_t)-1);
  const cJSON *ref = sg_get(s, "$ref");
  if (ref) {
    const cJSON *target = sg_resolve(g, ref);
    return target ? sg_value(g, target, depth + 1) : sg_words_string(g, 0, (size_t)-1);
  }
  const cJSON *alts = sg_get(s, "anyOf") ? sg_get(s, "anyOf") : sg_get(s, "oneOf"), *it;
  if (cJSON_IsArray(alts) && alts->child) {
    const cJSON *pick = alts->child; /* the first that is not just null */
    cJSON_ArrayForEach(it, alts) {
      if (!sg_type_is(sg_get(it, "type"), "null")) {
        pick = it;
        break;
      }
    }
    return sg_value(g, pick, depth + 1);
  }
  const cJSON *all = sg_get(s, "allOf");
  if (cJSON_IsArray(all) && all->child) { /* every part's properties in one object */
    cJSON *obj = cJSON_CreateObject();
    cJSON_ArrayForEach(it, all) {
      const cJSON *part = sg_get(it, "$ref") ? sg_resolve(g, sg_get(it, "$ref")) : it;
      if (obj && part && sg_fill_object(g, obj, part, depth) < 0) {
        cJSON_Delete(obj);
        return NULL;
      }
    }
    if (obj && sg_fill_object(g, obj, s, depth) < 0) {
      cJSON_Delete(obj);
      return NULL;
    }
    return obj;
  }
  if (sg_get(s, "const")) return cJSON_Duplicate(sg_get(s, "const"), 1);
  const cJSON *en = sg_get(s, "enum");
  if (cJSON_IsArray(en) && en->child) return cJSON_Duplicate(en->child, 1);
  const char *kind = sg_kind(s);
  if (strcmp(kind, "object") == 0) {
    cJSON *obj = cJSON_CreateObject();
    if (obj && sg_fill_object(g, obj, s, depth) < 0) {
      cJSON_Delete(obj);
      return NULL;
    }
    return obj;
  }
  if (strcmp(kind, "array") == 0) return sg_array(g, s, depth);
  if (strcmp(kind, "integer") == 0) return sg_integer(g, s);
  if (strcmp(kind, "number") == 0) return sg_number(g, s);
  if (strcmp(kind, "boolean") == 0) return cJSON_CreateBool(ag_simgen_rand(g->rng) & 1);
  if (strcmp(kind, "null") == 0) return cJSON_CreateNull();
  return sg_string(g, s);
}

int ag_simgen_value(pr_buf *out, const cJSON *schema, uint64_t *rng) {
  sg_gen g = {.root = schema, .rng = rng, .left = SG_MAX_VALUES};
  cJSON *v;
  if (!schema) {
    v = cJSON_CreateObject();
    if (v && !cJSON_AddItemToObject(v, "answer", sg_words_string(&g, 0, (size_t)-1))) {
      cJSON_Delete(v);
      v = NULL;
    }
  } else {
    v = sg_value(&g, schema, 0);
    if (v && !cJSON_IsObject(v)) {
      cJSON_Delete(v);
      v = cJSON_CreateObject();
    }
  }
  if (!v) return -ENOMEM;
  char *txt = cJSON_PrintUnformatted(v);
  cJSON_Delete(v);
  if (!txt) return -ENOMEM;
  int rc = pr_buf_append_str(out, txt);
  free(txt);
  return rc;
}

/* ---- tokens ------------------------------------------------------------------------- */

static int sg_word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c >= 0x80;
}

size_t ag_simgen_token_len(const char *text, size_t len) {
  const unsigned char *s = (const unsigned char *)text;
  size_t i = s[0] == ' ' && len > 1 && sg_word_byte(s[1]) ? 1 : 0;
  if (sg_word_byte(s[i])) {
    size_t start = i;
    while (i < len && sg_word_byte(s[i]) && i - start < 10) i++;
    while (i < len && (s[i] & 0xC0) == 0x80) i++; /* finish the character */
    return i;
  }
  i = 1;
  while (i < len && i < 3 && !sg_word_byte(s[i]) && !(s[i] == ' ' && i + 1 < len && sg_word_byte(s[i + 1])))
    i++;
  return i;
}

int64_t ag_simgen_count_tokens(const char *text, size_t len) {
  int64_t n = 0;
  for (size_t i = 0; i < len; i += ag_simgen_token_len(text + i, len - i)) n++;
  return n;
}

/* ---- logprobs ----------------------------------------------------------------------- */

/* A word of the list keeps its id; any other token gets one from its bytes (FNV-1a). */
static int sg_token_id(const char *tok, size_t len) {
  for (size_t i = 0; i < SG_N_WORDS; i++) {
    /* a whole answer's first word comes without its space: the same token still */
    const char *w = sg_words[i];
    size_t wl = strlen(w);
    if ((wl == len && memcmp(w, tok, len) == 0) || (wl == len + 1 && w[0] == ' ' && memcmp(w + 1, tok, len) == 0))
      return SG_WORD_ID0 + (int)i;
  }
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)tok[i]) * 16777619u;
  return SG_OTHER_ID0 + (int)(h % SG_OTHER_IDS);
}

int ag_simgen_token_id(const char *tok, size_t len) { return sg_token_id(tok, len); }

/* {"id","token","bytes","logprob"}: the part an entry and its alternatives share. */
static cJSON *sg_candidate(const char *tok, size_t len, double logprob) {
  cJSON *o = cJSON_CreateObject();
  char *copy = malloc(len + 1);
  cJSON *bytes = cJSON_CreateArray();
  if (!o || !copy || !bytes) {
    cJSON_Delete(o);
    cJSON_Delete(bytes);
    free(copy);
    return NULL;
  }
  memcpy(copy, tok, len);
  copy[len] = '\0';
  cJSON_AddNumberToObject(o, "id", sg_token_id(tok, len));
  cJSON_AddStringToObject(o, "token", copy);
  free(copy);
  for (size_t i = 0; i < len; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)tok[i]));
  cJSON_AddItemToObject(o, "bytes", bytes);
  cJSON_AddNumberToObject(o, "logprob", logprob);
  return o;
}

int ag_simgen_logprob(pr_buf *out, const char *token, size_t len, int top, uint64_t *rng) {
  double lp = -(0.05 + 3.0 * sg_unit(rng));
  cJSON *e = sg_candidate(token, len, lp);
  cJSON *alts = e ? cJSON_AddArrayToObject(e, "top_logprobs") : NULL;
  if (!alts) {
    cJSON_Delete(e);
    return -ENOMEM;
  }
  /* the token itself, then other words, each less likely than the one before */
  size_t used[SG_N_WORDS];
  int n_used = 0;
  for (int i = 0; i < top; i++) {
    const char *w = token;
    size_t wl = len;
    if (i > 0) {
      size_t k = 0;
      for (int tries = 0; tries < 8; tries++) {
        k = ag_simgen_rand(rng) % SG_N_WORDS;
        int dup = strlen(sg_words[k]) == len && memcmp(sg_words[k], token, len) == 0;
        for (int u = 0; u < n_used && !dup; u++) dup = used[u] == k;
        if (!dup) break;
      }
      if (n_used < (int)SG_N_WORDS) used[n_used++] = k;
      w = sg_words[k];
      wl = strlen(w);
      lp -= 0.1 + 0.5 * sg_unit(rng);
    }
    cJSON *c = sg_candidate(w, wl, lp);
    if (!c) {
      cJSON_Delete(e);
      return -ENOMEM;
    }
    cJSON_AddItemToArray(alts, c);
  }
  char *txt = cJSON_PrintUnformatted(e);
  cJSON_Delete(e);
  if (!txt) return -ENOMEM;
  int rc = pr_buf_append_str(out, txt);
  free(txt);
  return rc;
}
