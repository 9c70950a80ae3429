/* Loading and validating the gateway's JSON configuration. One table lists every key
 * (section, type, range, default, field, meaning) and drives reading, defaults, range
 * checks, unknown keys and the reference in docs/configuration.md. cJSON parses; the
 * typed getters of proto/json.h check fields and name their path; a small locator then
 * turns that path back into a line and column, so every message reads
 * "file:line:col: field: problem". */
#include "caps.h"
#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "addr.h"
#include "err.h"
#include "idkey.h"
#include "json.h"
#include "log.h"
#include "tls.h"
#include "url.h"

/* ---- locating a path in the source ---------------------------------------------------
 * Only used on error paths, over text cJSON has already accepted, so it can skip values
 * without validating them. */

typedef struct loc_scan {
  const char *p, *end;
} loc_scan;

static void loc_ws(loc_scan *s) {
  while (s->p < s->end && isspace((unsigned char)*s->p)) s->p++;
}

static void loc_string(loc_scan *s) {
  s->p++; /* opening quote */
  while (s->p < s->end && *s->p != '"') s->p += (*s->p == '\\') ? 2 : 1;
  if (s->p < s->end) s->p++;
}

static void loc_value(loc_scan *s) {
  loc_ws(s);
  if (s->p >= s->end) return;
  if (*s->p == '"') {
    loc_string(s);
    return;
  }
  if (*s->p == '{' || *s->p == '[') {
    int depth = 0;
    while (s->p < s->end) {
      char ch = *s->p;
      if (ch == '"') {
        loc_string(s);
        continue;
      }
      if (ch == '{' || ch == '[') depth++;
      if (ch == '}' || ch == ']') {
        depth--;
        if (depth == 0) {
          s->p++;
          return;
        }
      }
      s->p++;
    }
    return;
  }
  while (s->p < s->end && !strchr(",}] \t\r\n", *s->p)) s->p++;
}

/* Offset of the value (or, with want_key, of the key) at path "a.b[2].c" in text;
 * falls back to the deepest part found. */
static size_t loc_find(const char *text, size_t len, const char *path, int want_key) {
  loc_scan s = {text, text + len};
  loc_ws(&s);
  const char *best = s.p;
  const char *q = path;
  while (*q) {
    if (*q == '.') q++;
    if (*q == '[') {
      long idx = strtol(q + 1, (char **)&q, 10);
      if (*q == ']') q++;
      loc_ws(&s);
      if (s.p >= s.end || *s.p != '[') break;
      s.p++;
      for (long i = 0; i < idx; i++) {
        loc_value(&s);
        loc_ws(&s);
        if (s.p < s.end && *s.p == ',') s.p++;
      }
      loc_ws(&s);
      best = s.p;
      continue;
    }
    const char *kend = q;
    while (*kend && *kend != '.' && *kend != '[') kend++;
    size_t klen = (size_t)(kend - q);
    loc_ws(&s);
    if (s.p >= s.end || *s.p != '{') break;
    s.p++;
    int found = 0;
    while (s.p < s.end) {
      loc_ws(&s);
      if (s.p >= s.end || *s.p != '"') break;
      const char *kstart = s.p;
      loc_string(&s);
      size_t have = (size_t)(s.p - kstart) - 2;
      int match = have == klen && memcmp(kstart + 1, q, klen) == 0;
      loc_ws(&s);
      if (s.p < s.end && *s.p == ':') s.p++;
      loc_ws(&s);
      if (match) {
        best = (want_key && !*kend) ? kstart : s.p;
        found = 1;
        break;
      }
      loc_value(&s);
      loc_ws(&s);
      if (s.p < s.end && *s.p == ',') s.p++;
    }
    if (!found) break;
    q = kend;
  }
  return (size_t)(best - text);
}

/* ---- error collection ------------------------------------------------------------------- */

typedef struct cfg_ctx {
  const char *file;
  const char *text;
  size_t len;
  pr_buf *errors;
  int n_errors;
  gw_config *conf;  /* the configuration being built */
  int no_files;     /* GW_CONFIG_NO_FILES: certificates and data_dir are not looked at */
} cfg_ctx;

static void cfg_err_at(cfg_ctx *x, const char *path, int want_key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void cfg_err_at(cfg_ctx *x, const char *path, int want_key, const char *fmt, ...) {
  int line = 1, col = 1;
  size_t off = loc_find(x->text, x->len, path ? path : "", want_key);
  pr_json_position(x->text, x->len, off, &line, &col);
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (path && *path)
    pr_buf_text(x->errors, "%s:%d:%d: %s: %s\n", x->file, line, col, path, msg);
  else
    pr_buf_text(x->errors, "%s:%d:%d: %s\n", x->file, line, col, msg);
  x->n_errors++;
}

/* Report a getter's failure; returns 1 when the getter succeeded or the key was absent. */
static int cfg_check(cfg_ctx *x, int rc, const pr_json_err *e) {
  if (rc >= 0) return 1;
  cfg_err_at(x, e->path, 0, "%s", e->msg);
  return 0;
}

/* Keys of objects that are not sections of the table (a listener, its tls). */
static int cfg_keys(cfg_ctx *x, const cJSON *obj, const char *const *allowed, const char *path) {
  int ok = 1;
  for (const cJSON *it = obj->child; it; it = it->next) {
    int known = 0;
    for (size_t i = 0; allowed[i]; i++)
      if (it->string && strcmp(it->string, allowed[i]) == 0) known = 1;
    if (!known) {
      char p[300];
      pr_json_path_key(p, sizeof(p), path, it->string ? it->string : "");
      cfg_err_at(x, p, 1, "unknown key");
      ok = 0;
    }
  }
  return ok;
}

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

/* ---- the settings table: its shape ---------------------------------------------------
 * Every key of the file is one entry, in the manner of HAProxy's keyword lists: the
 * section it lives in, its type, range and default, the field it fills, and its line in
 * the reference (docs/configuration.md, `fleetgate --print-settings`). cfg_apply walks a
 * section's entries in table order: a scalar is read from its entry alone, a key whose
 * value is more than a scalar (addresses, lists, secrets named by environment variables)
 * names the function that reads it. A section's entries are also its known keys: any
 * other key is an error. */

typedef enum cfg_type {
  CFG_NUM,     /* double */
  CFG_INT,     /* int */
  CFG_INT64,   /* int64_t */
  CFG_SIZE,    /* size_t */
  CFG_BOOL,    /* int, 0 or 1 */
  CFG_STR,     /* char *, owned by the struct */
  CFG_SECTION, /* an object holding the entries of the section named by the key */
  CFG_CUSTOM,  /* read by parse; parse NULL: read by a neighbour's parse */
} cfg_type;

typedef struct cfg_setting cfg_setting;
/* obj: the object that holds the key (it may lack it); path: obj's path; base: the
 * struct the section fills. */
typedef void (*cfg_parse_fn)(cfg_ctx *x, const cJSON *obj, const char *path, void *base,
                             const cfg_setting *s);

struct cfg_setting {
  const char *section;   /* "" top level, "limits", ...; "api_keys", "replicas": each item */
  const char *key;
  cfg_type type;
  double min, max, dflt; /* numbers (bool: dflt) */
  const char *dflt_str;  /* CFG_STR; NULL: none */
  size_t off;            /* the field in gw_config, gw_key_conf or gw_replica_conf */
  cfg_parse_fn parse;    /* CFG_CUSTOM */
  double (*derive)(const void *base); /* a default computed from keys read before */
  const char *doc;       /* the meaning, one line of markdown */
  const char *type_doc, *dflt_doc, *range_doc; /* NULL: derived from the fields above */
};

/* offsetof(S, f) that refuses to compile unless f has type T, so an entry's type and
 * its field cannot disagree. */
#define CFG_FIELD(S, f, T) \
  (offsetof(S, f) + 0 * sizeof(char[_Generic(((S *)0)->f, T : 1, default : -1)]))
#define SET_NUM(sec, k, lo, hi, d, S, f) .section = sec, .key = k, .type = CFG_NUM, \
  .min = lo, .max = hi, .dflt = d, .off = CFG_FIELD(S, f, double)
#define SET_INT(sec, k, lo, hi, d, S, f) .section = sec, .key = k, .type = CFG_INT, \
  .min = lo, .max = hi, .dflt = d, .off = CFG_FIELD(S, f, int)
#define SET_INT64(sec, k, lo, hi, d, S, f) .section = sec, .key = k, .type = CFG_INT64, \
  .min = lo, .max = hi, .dflt = d, .off = CFG_FIELD(S, f, int64_t)
#define SET_SIZE(sec, k, lo, hi, d, S, f) .section = sec, .key = k, .type = CFG_SIZE, \
  .min = lo, .max = hi, .dflt = d, .off = CFG_FIELD(S, f, size_t)
#define SET_BOOL(sec, k, d, S, f) .section = sec, .key = k, .type = CFG_BOOL, .dflt = d, \
  .off = CFG_FIELD(S, f, int)
#define SET_STR(sec, k, d, S, f) .section = sec, .key = k, .type = CFG_STR, .dflt_str = d, \
  .off = CFG_FIELD(S, f, char *)
#define SET_SECTION(k) .section = "", .key = k, .type = CFG_SECTION
#define SET_SUBSECTION(sec, k) .section = sec, .key = k, .type = CFG_SECTION
#define SET_CUSTOM(sec, k, fn) .section = sec, .key = k, .type = CFG_CUSTOM, .parse = fn

static void cfg_apply(cfg_ctx *x, const cJSON *obj, const char *section, const char *path,
                      void *base);

/* ---- keys that are more than a scalar ------------------------------------------------- */

/* "allow_addresses": a list of CIDR strings, each parsed now (url.h, ipnet.h). */
static void cfg_allow_addresses(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                                const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const cJSON *arr = NULL;
  char ap[300];
  pr_json_path_key(ap, sizeof(ap), path, s->key);
  if (!cfg_check(x, pr_json_get_arr(o, s->key, 0, &arr, path, &e), &e) || !arr) return;
  int n = cJSON_GetArraySize(arr);
  c->allow_addresses = calloc((size_t)n + 1, sizeof(*c->allow_addresses));
  if (!c->allow_addresses) {
    cfg_err_at(x, ap, 0, "out of memory");
    return;
  }
  int i = 0;
  for (const cJSON *it = arr->child; it; it = it->next, i++) {
    char ip[320];
    pr_json_path_index(ip, sizeof(ip), ap, i);
    const char *why = NULL;
    if (!cJSON_IsString(it)) {
      cfg_err_at(x, ip, 0, "expected a string such as \"127.0.0.0/8\"");
      continue;
    }
    if (pr_ipnet_parse(it->valuestring, &c->allow_addresses[c->n_allow_addresses], &why) < 0) {
      cfg_err_at(x, ip, 0, "%s, got \"%s\"", why, it->valuestring);
      continue;
    }
    c->n_allow_addresses++;
  }
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

/* A path from the config: relative ones are taken from the main file's folder. */
static char *cfg_path(const cfg_ctx *x, const char *p) {
  if (p[0] == '/') return strdup(p);
  const char *slash = strrchr(x->file, '/');
  if (!slash) return strdup(p);
  size_t n = (size_t)(slash - x->file) + 1 + strlen(p) + 1;
  char *out = malloc(n);
  if (out) snprintf(out, n, "%.*s/%s", (int)(slash - x->file), x->file, p);
  return out;
}

/* "tls": {"cert", "key"}: both needed, and they must load and match (checked now, so
 * --check-config and a reload catch a bad certificate before it is used). */
static void cfg_tls(cfg_ctx *x, const cJSON *tls, const char *path, gw_listen_conf *l) {
  static const char *const keys[] = {"cert", "key", NULL};
  char tp[96];
  pr_json_path_key(tp, sizeof(tp), path, "tls");
  cfg_keys(x, tls, keys, tp);
  pr_json_err e;
  const char *cert = NULL, *key = NULL;
  int ok = cfg_check(x, pr_json_get_str(tls, "cert", 1, &cert, tp, &e), &e);
  ok &= cfg_check(x, pr_json_get_str(tls, "key", 1, &key, tp, &e), &e);
  if (!ok || !cert || !key) return;
  l->tls_cert = cfg_path(x, cert);
  l->tls_key = cfg_path(x, key);
  if (x->no_files) return;
  char err[512];
  SSL_CTX *ctx = pr_tls_server_ctx(l->tls_cert, l->tls_key, err, sizeof(err));
  if (!ctx) cfg_err_at(x, tp, 0, "%s", err);
  SSL_CTX_free(ctx);
}

/* A listen address at path: "HOST:PORT" with a literal host (or localhost, *, [V6]) and
 * a port from 0 to 65535, exactly what the listener will take. Returns 1 when it is. */
static int cfg_listen_addr(cfg_ctx *x, const char *path, const char *addr) {
  struct sockaddr_storage ss;
  const char *why = NULL;
  if (!strchr(addr, ':') || !*(strrchr(addr, ':') + 1)) {
    cfg_err_at(x, path, 0, "expected HOST:PORT, got \"%s\"", addr);
    return 0;
  }
  if (pr_addr_parse(addr, &ss, &why) < 0) {
    cfg_err_at(x, path, 0, "expected HOST:PORT: %s, got \"%s\"", why, addr);
    return 0;
  }
  return 1;
}

/* "listen": "HOST:PORT", or a list of such strings and {"address", "tls"} objects. */
static void cfg_listen(cfg_ctx *x, const cJSON *root, const char *path, void *base,
                       const cfg_setting *s) {
  gw_config *c = base;
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(root, s->key);
  if (!l) {
    c->listen = calloc(1, sizeof(*c->listen));
    c->listen[0].address = strdup("127.0.0.1:8080");
    c->n_listen = 1;
    return;
  }
  if (cJSON_IsString(l)) {
    if (!cfg_listen_addr(x, "listen", l->valuestring)) return;
    c->listen = calloc(1, sizeof(*c->listen));
    c->listen[0].address = strdup(l->valuestring);
    c->n_listen = 1;
    return;
  }
  if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) == 0) {
    cfg_err_at(x, "listen", 0, "expected a non-empty list of listeners");
    return;
  }
  c->listen = calloc((size_t)cJSON_GetArraySize(l), sizeof(*c->listen));
  int i = 0;
  for (const cJSON *it = l->child; it; it = it->next, i++) {
    char p[64];
    pr_json_path_index(p, sizeof(p), "listen", i);
    const char *addr = NULL;
    char ap[80];
    snprintf(ap, sizeof(ap), "%s", p);
    if (cJSON_IsString(it)) {
      addr = it->valuestring;
    } else if (cJSON_IsObject(it)) {
      pr_json_path_key(ap, sizeof(ap), p, "address");
      static const char *const keys[] = {"address", "tls", NULL};
      pr_json_err e;
      cfg_keys(x, it, keys, p);
      cfg_check(x, pr_json_get_str(it, "address", 1, &addr, p, &e), &e);
      const cJSON *tls = NULL;
      if (cfg_check(x, pr_json_get_obj(it, "tls", 0, &tls, p, &e), &e) && tls)
        cfg_tls(x, tls, p, &c->listen[c->n_listen]);
    } else {
      cfg_err_at(x, p, 0, "expected an object with an address");
    }
    if (addr && !cfg_listen_addr(x, ap, addr)) addr = NULL;
    gw_listen_conf *lc = &c->listen[c->n_listen];
    if (addr) {
      lc->address = strdup(addr);
      c->n_listen++;
    } else {
      free(lc->tls_cert);
      free(lc->tls_key);
      lc->tls_cert = lc->tls_key = NULL;
    }
  }
}

static void cfg_log_level(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                          const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *lvl = NULL;
  cfg_check(x, pr_json_get_str(o, s->key, 0, &lvl, path, &e), &e);
  if (lvl && pr_log_level_from_name(lvl) < 0)
    cfg_err_at(x, "log_level", 0, "expected one of debug, info, warn, error");
  c->log_level = strdup(lvl ? lvl : "info");
}

/* ---- fleet, admin, redis ---- */

static void cfg_fleet_secret(cfg_ctx *x, const cJSON *fl, const char *path, void *base,
                             const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *senv = NULL;
  if (!cfg_check(x, pr_json_get_str(fl, s->key, 1, &senv, path, &e), &e) || !senv) return;
  const char *val = getenv(senv);
  c->fleet_secret_env = strdup(senv);
  if (!val || strlen(val) < 16)
    cfg_err_at(x, "fleet.secret_env", 0,
               "environment variable %s must hold the fleet secret (at least 16 characters)", senv);
  else
    c->fleet_secret = strdup(val);
}

static void cfg_fleet_token(cfg_ctx *x, const cJSON *fl, const char *path, void *base,
                            const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *tenv = NULL;
  if (!cfg_check(x, pr_json_get_str(fl, s->key, 0, &tenv, path, &e), &e) || !tenv) return;
  const char *val = getenv(tenv);
  if (!val || strlen(val) < 16)
    cfg_err_at(x, "fleet.replica_token_env", 0,
               "environment variable %s must hold a secret of at least 16 characters", tenv);
  else if (c->fleet_secret && strcmp(val, c->fleet_secret) == 0)
    cfg_err_at(x, "fleet.replica_token_env", 0,
               "%s holds the fleet secret, which every phone has: phones' tokens must come from a "
               "secret only the gateways know", tenv);
  else if (strlen(val) > 255)
    cfg_err_at(x, "fleet.replica_token_env", 0, "environment variable %s: at most 255 characters", tenv);
  else
    c->fleet_replica_token = strdup(val);
}

/* costs.currency: a short name shown beside every amount (and a metric label). */
static void cfg_cost_currency(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                              const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *v = NULL;
  if (o && !cfg_check(x, pr_json_get_str(o, s->key, 0, &v, path, &e), &e)) return;
  if (!v) v = "ACU";
  size_t n = strlen(v);
  int ok = n >= 1 && n <= 16;
  for (const char *p = v; ok && *p; p++)
    ok = isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.' || *p == '$';
  if (!ok) {
    cfg_err_at(x, "costs.currency", 0, "expected 1 to 16 of [A-Za-z0-9_.$-]");
    return;
  }
  free(c->cost_currency);
  c->cost_currency = xstrdup(v);
}

static void cfg_fleet_enrol(cfg_ctx *x, const cJSON *fl, const char *path, void *base,
                            const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(fl, s->key, 0, &v, path, &e), &e) || !v) return;
  if (strcmp(v, "approve") == 0) c->fleet_enrol_approve = 1;
  else if (strcmp(v, "open") != 0) cfg_err_at(x, "fleet.enrol", 0, "expected \"open\" or \"approve\"");
}

/* A path in the config is relative to the main file's folder. */
static char *cfg_resolve_path(const cfg_ctx *x, const char *p) {
  char full[4096];
  const char *slash = strrchr(x->file, '/');
  if (p[0] == '/' || !slash) snprintf(full, sizeof(full), "%s", p);
  else snprintf(full, sizeof(full), "%.*s/%s", (int)(slash - x->file), x->file, p);
  return strdup(full);
}

static void cfg_fleet_pins_file(cfg_ctx *x, const cJSON *fl, const char *path, void *base,
                                const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(fl, s->key, 0, &v, path, &e), &e) || !v) return;
  if (!*v) cfg_err_at(x, "fleet.pins_file", 0, "expected a file name");
  else c->fleet_pins_file = cfg_resolve_path(x, v);
}

static void cfg_verify_canaries(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                                const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 0, &v, path, &e), &e) || !v) return;
  if (!*v) cfg_err_at(x, "verify.canaries_file", 0, "expected a file name");
  else c->verify_canaries_file = cfg_resolve_path(x, v);
}

static void cfg_data_dir(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                         const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 0, &v, path, &e), &e) || !v) return;
  if (!*v) {
    cfg_err_at(x, "data_dir", 0, "expected a folder name");
    return;
  }
  c->data_dir = cfg_resolve_path(x, v);
  if (x->no_files) return;
  /* said now, at start or at --check-config, rather than at the first upload */
  struct stat st;
  if (stat(c->data_dir, &st) != 0)
    cfg_err_at(x, "data_dir", 0, "%s: %s (create it, owned by the gateway's user)", c->data_dir,
               strerror(errno));
  else if (!S_ISDIR(st.st_mode))
    cfg_err_at(x, "data_dir", 0, "%s is not a folder", c->data_dir);
  else if (access(c->data_dir, W_OK | X_OK) != 0)
    cfg_err_at(x, "data_dir", 0, "%s is not writable by this process: %s", c->data_dir,
               strerror(errno));
}

/* With an admin section there is an admin listener, on 127.0.0.1:9090 unless told. */
static void cfg_admin_listen(cfg_ctx *x, const cJSON *a, const char *path, void *base,
                             const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *addr = "127.0.0.1:9090";
  cfg_check(x, pr_json_get_str(a, s->key, 0, &addr, path, &e), &e);
  cfg_listen_addr(x, "admin.listen", addr);
  c->admin_listen = strdup(addr);
}

/* token_env or token (this reads both): one is required, of at least 16 characters. */
static void cfg_admin_token(cfg_ctx *x, const cJSON *a, const char *path, void *base,
                            const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *tenv = NULL, *tok = NULL;
  cfg_check(x, pr_json_get_str(a, s->key, 0, &tenv, path, &e), &e);
  cfg_check(x, pr_json_get_str(a, "token", 0, &tok, path, &e), &e);
  if (tenv) {
    tok = getenv(tenv);
    if (!tok || !*tok) {
      cfg_err_at(x, "admin.token_env", 0, "environment variable %s is not set", tenv);
      tok = NULL;
    }
  } else if (!tok) {
    cfg_err_at(x, "admin", 0, "token_env (or token) is required: the admin API needs a token");
  }
  if (tok && strlen(tok) < 16) {
    cfg_err_at(x, tenv ? "admin.token_env" : "admin.token", 0,
               "the admin token must be at least 16 characters");
    tok = NULL;
  }
  if (tok) c->admin_token = strdup(tok);
}

/* redis.key_env: the gateways' shared sealing key, required with a redis section: at
 * least 32 characters, and not the fleet secret (phones know that one). The gateway's id
 * goes into every sealed message, so it is checked here too. */
static void cfg_redis_key(cfg_ctx *x, const cJSON *rd, const char *path, void *base, const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *kenv = NULL;
  if (c->gateway_id && (!*c->gateway_id || strlen(c->gateway_id) > 63 ||
                        strpbrk(c->gateway_id, " \t\r\n\v\f") != NULL))
    cfg_err_at(x, "redis.gateway_id", 0, "expected 1 to 63 characters without blanks");
  if (!cfg_check(x, pr_json_get_str(rd, s->key, 1, &kenv, path, &e), &e) || !kenv) return;
  const char *val = getenv(kenv);
  if (!val || strlen(val) < 32)
    cfg_err_at(x, "redis.key_env", 0,
               "environment variable %s must hold the gateways' shared key (at least 32 characters, "
               "e.g. from 'openssl rand -hex 32')", kenv);
  else if (c->fleet_secret && strcmp(val, c->fleet_secret) == 0)
    cfg_err_at(x, "redis.key_env", 0, "the gateways' key must not be the fleet secret (every phone has that)");
  else
    c->redis_key = strdup(val);
}

/* redis.password_env: the password, from the environment rather than the URL. */
static void cfg_redis_password(cfg_ctx *x, const cJSON *rd, const char *path, void *base,
                               const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *penv = NULL;
  if (!cfg_check(x, pr_json_get_str(rd, s->key, 0, &penv, path, &e), &e)) return;
  if (!penv) {
    if (c->redis_username && !c->redis_password)
      cfg_err_at(x, "redis.username", 0, "a username needs a password (password_env, or in url)");
    return;
  }
  const char *val = getenv(penv);
  if (c->redis_password)
    cfg_err_at(x, "redis.password_env", 0, "give the password in url or in password_env, not both");
  else if (!val || !*val)
    cfg_err_at(x, "redis.password_env", 0, "environment variable %s is not set", penv);
  else
    c->redis_password = strdup(val);
}

/* redis://[:PASSWORD@]HOST[:PORT][/DB], parsed with libcurl's URL parser. */
static void cfg_redis_url(cfg_ctx *x, const cJSON *rd, const char *rpath, void *base,
                          const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *url = NULL;
  if (!cfg_check(x, pr_json_get_str(rd, s->key, 1, &url, rpath, &e), &e) || !url) return;
  CURLU *h = curl_url();
  char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *pw = NULL;
  int ok = h && curl_url_set(h, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK &&
           curl_url_get(h, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
           strcmp(scheme, "redis") == 0 && curl_url_get(h, CURLUPART_HOST, &host, 0) == CURLUE_OK;
  if (ok) {
    c->redis_host = strdup(host);
    c->redis_port = 6379;
    if (curl_url_get(h, CURLUPART_PORT, &port, 0) == CURLUE_OK) c->redis_port = atoi(port);
    if (curl_url_get(h, CURLUPART_PATH, &path, 0) == CURLUE_OK && path[0] == '/' && path[1])
      c->redis_db = atoi(path + 1);
    if (curl_url_get(h, CURLUPART_PASSWORD, &pw, CURLU_URLDECODE) == CURLUE_OK && *pw)
      c->redis_password = strdup(pw);
    char *user = NULL;
    if (curl_url_get(h, CURLUPART_USER, &user, 0) == CURLUE_OK && *user)
      cfg_err_at(x, "redis.url", 0, "put the user in redis.username, not in the URL");
    curl_free(user);
  } else {
    cfg_err_at(x, "redis.url", 0, "expected redis://[:PASSWORD@]HOST[:PORT][/DB]");
  }
  curl_free(scheme);
  curl_free(host);
  curl_free(port);
  curl_free(path);
  curl_free(pw);
  curl_url_cleanup(h);
}

/* ---- api_keys: name, key_sha256, limits, priority class, weight, allowed models ---- */

static void cfg_key_name(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                         const cfg_setting *s) {
  gw_key_conf *k = base;
  pr_json_err e;
  const char *name = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 1, &name, p, &e), &e) || !name) return;
  k->name = strdup(name);
  const gw_config *c = x->conf;
  for (const gw_key_conf *other = c->keys; other < k; other++)
    if (other->name && strcmp(other->name, name) == 0) {
      char np[80];
      pr_json_path_key(np, sizeof(np), p, "name");
      cfg_err_at(x, np, 0, "duplicate key name \"%s\"", name);
    }
}

static void cfg_key_sha256(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                           const cfg_setting *s) {
  gw_key_conf *k = base;
  pr_json_err e;
  const char *hex = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 1, &hex, p, &e), &e) || !hex) return;
  char hp[80];
  pr_json_path_key(hp, sizeof(hp), p, "key_sha256");
  int ok = strlen(hex) == 64;
  for (int b = 0; ok && b < 32; b++) {
    int hi = hexval(hex[2 * b]), lo = hexval(hex[2 * b + 1]);
    if (hi < 0 || lo < 0) ok = 0;
    else k->sha256[b] = (unsigned char)(hi << 4 | lo);
  }
  if (!ok) cfg_err_at(x, hp, 0, "expected 64 hex digits (the line `fleetgate --hash-key` prints)");
}

static void cfg_key_priority(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                             const cfg_setting *s) {
  gw_key_conf *k = base;
  pr_json_err e;
  const char *prio = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 0, &prio, p, &e), &e) || !prio) return;
  if (strcmp(prio, "interactive") == 0) {
    k->priority = 0;
  } else if (strcmp(prio, "batch") == 0) {
    k->priority = 1;
  } else {
    char pp[80];
    pr_json_path_key(pp, sizeof(pp), p, "priority");
    cfg_err_at(x, pp, 0, "expected \"interactive\" or \"batch\"");
  }
}

static void cfg_key_models(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                           const cfg_setting *s) {
  gw_key_conf *k = base;
  pr_json_err e;
  const cJSON *models = NULL;
  if (!cfg_check(x, pr_json_get_arr(o, s->key, 0, &models, p, &e), &e) || !models) return;
  k->models = calloc((size_t)cJSON_GetArraySize(models) + 1, sizeof(char *));
  for (const cJSON *m = models->child; m && k->models; m = m->next) {
    if (cJSON_IsString(m) && m->valuestring[0]) k->models[k->n_models++] = strdup(m->valuestring);
    else cfg_err_at(x, p, 0, "models: expected a list of model names");
  }
}

static void cfg_key_cache_scope(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                                const cfg_setting *s) {
  gw_key_conf *k = base;
  pr_json_err e;
  const char *scope = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 0, &scope, p, &e), &e) || !scope) return;
  if (!scope[0]) {
    char sp[80];
    pr_json_path_key(sp, sizeof(sp), p, "cache_scope");
    cfg_err_at(x, sp, 0, "expected a non-empty scope name (leave it out for a scope of the key's own)");
    return;
  }
  k->cache_scope = strdup(scope);
}

uint64_t gw_cache_scope_id(const char *name) {
  /* a scope named like a key and a key's own scope are one: both are just the name */
  static const char tag[] = "fleetgate cache scope\n";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  uint64_t v = 0;
  if (ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
      EVP_DigestUpdate(ctx, tag, sizeof(tag) - 1) == 1 &&
      EVP_DigestUpdate(ctx, name, strlen(name)) == 1 && EVP_DigestFinal_ex(ctx, md, &n) == 1 && n >= 8)
    for (int i = 0; i < 8; i++) v = (v << 8) | md[i];
  EVP_MD_CTX_free(ctx);
  /* 0 is no scope, GW_CACHE_SCOPE_OPEN the open gateway's */
  return v > GW_CACHE_SCOPE_OPEN ? v : GW_CACHE_SCOPE_OPEN + 1;
}

static void cfg_api_keys(cfg_ctx *x, const cJSON *root, const char *path, void *base,
                         const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const cJSON *arr = NULL;
  if (!cfg_check(x, pr_json_get_arr(root, s->key, 0, &arr, path, &e), &e) || !arr) return;
  int n = cJSON_GetArraySize(arr);
  if (n == 0) {
    cfg_err_at(x, "api_keys", 0, "an empty list would lock every caller out; leave api_keys out to run open");
    return;
  }
  c->keys = calloc((size_t)n + 1, sizeof(*c->keys));
  if (!c->keys) return;
  int i = 0;
  for (const cJSON *o = arr->child; o; o = o->next, i++) {
    char p[64];
    pr_json_path_index(p, sizeof(p), "api_keys", i);
    if (!cJSON_IsObject(o)) {
      cfg_err_at(x, p, 0, "expected an object");
      continue;
    }
    gw_key_conf *k = &c->keys[c->n_keys++];
    cfg_apply(x, o, "api_keys", p, k);
    const char *scope = k->cache_scope ? k->cache_scope : k->name;
    k->scope_id = gw_cache_scope_id(scope ? scope : "");
  }
  c->n_cache_scopes = 0;
  for (size_t a = 0; a < c->n_keys; a++) {
    size_t b = 0;
    while (b < a && c->keys[b].scope_id != c->keys[a].scope_id) b++;
    if (b == a) c->n_cache_scopes++;
  }
}

/* ---- models: what the fleet is to serve ---- */

/* Each entry's name (models[i].name). */
static void cfg_model_name(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                           const cfg_setting *s) {
  gw_model_conf *mc = base;
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 1, &v, p, &e), &e) || !v) return;
  char np[80];
  pr_json_path_key(np, sizeof(np), p, "name");
  if (!v[0] || strlen(v) > 64) {
    cfg_err_at(x, np, 0, "expected a model name (1-64 characters)");
    return;
  }
  const gw_config *c = x->conf;
  for (size_t i = 0; i < c->n_models; i++)
    if (c->models[i] && strcmp(c->models[i], v) == 0) {
      cfg_err_at(x, np, 0, "duplicate model \"%s\"", v);
      return;
    }
  mc->name = strdup(v);
}

/* models[i].url: where phones download the model's GGUF (http or https). */
static void cfg_model_url(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                          const cfg_setting *s) {
  gw_model_conf *mc = base;
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 0, &v, p, &e), &e) || !v) return;
  char up[80];
  pr_json_path_key(up, sizeof(up), p, s->key);
  int ok = (strncmp(v, "https://", 8) == 0 && v[8]) || (strncmp(v, "http://", 7) == 0 && v[7]);
  for (const char *q = v; ok && *q; q++)
    if ((unsigned char)*q <= ' ' || (unsigned char)*q >= 127) ok = 0;
  if (!ok || strlen(v) > 1000) {
    cfg_err_at(x, up, 0, "expected an http:// or https:// URL of at most 1000 visible characters");
    return;
  }
  mc->url = strdup(v);
}

/* models[i].sha256: 64 hex digits, kept in lowercase. */
static void cfg_model_sha256(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                             const cfg_setting *s) {
  gw_model_conf *mc = base;
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 0, &v, p, &e), &e) || !v) return;
  char sp[80];
  pr_json_path_key(sp, sizeof(sp), p, s->key);
  int ok = strlen(v) == 64;
  for (size_t i = 0; ok && i < 64; i++) ok = hexval(v[i]) >= 0;
  if (!ok) {
    cfg_err_at(x, sp, 0, "expected the file's SHA-256 as 64 hex digits");
    return;
  }
  mc->sha256 = strdup(v);
  for (char *q = mc->sha256; mc->sha256 && *q; q++)
    if (*q >= 'A' && *q <= 'F') *q = (char)(*q - 'A' + 'a');
}

/* models[i].engine_args: a list of strings, at most 32. */
static void cfg_model_engine_args(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                                  const cfg_setting *s) {
  gw_model_conf *mc = base;
  pr_json_err e;
  const cJSON *arr = NULL;
  if (!cfg_check(x, pr_json_get_arr(o, s->key, 0, &arr, p, &e), &e) || !arr) return;
  char ap[80];
  pr_json_path_key(ap, sizeof(ap), p, s->key);
  int n = cJSON_GetArraySize(arr);
  if (n > 32) {
    cfg_err_at(x, ap, 0, "at most 32 arguments");
    return;
  }
  mc->engine_args = calloc((size_t)n + 1, sizeof(char *));
  if (!mc->engine_args) return;
  int i = 0;
  for (const cJSON *it = arr->child; it; it = it->next, i++) {
    if (!cJSON_IsString(it) || strlen(it->valuestring) > 256) {
      char ip[100];
      pr_json_path_index(ip, sizeof(ip), ap, i);
      cfg_err_at(x, ip, 0, "expected a string of at most 256 characters");
      continue;
    }
    mc->engine_args[mc->n_engine_args++] = strdup(it->valuestring);
  }
}

/* models[i].labels: an object of strings a phone's labels must all have. */
static void cfg_model_labels(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                             const cfg_setting *s) {
  gw_model_conf *mc = base;
  pr_json_err e;
  const cJSON *obj = NULL;
  if (!cfg_check(x, pr_json_get_obj(o, s->key, 0, &obj, p, &e), &e) || !obj) return;
  for (const cJSON *it = obj->child; it; it = it->next)
    if (!cJSON_IsString(it)) {
      char lp[160], kp[200];
      pr_json_path_key(lp, sizeof(lp), p, s->key);
      pr_json_path_key(kp, sizeof(kp), lp, it->string ? it->string : "");
      cfg_err_at(x, kp, 0, "expected a string (the value the phone's label must have)");
      return;
    }
  mc->labels = pr_json_print(obj);
}

static void cfg_model_conf_free(gw_model_conf *mc) {
  free(mc->name);
  free(mc->url);
  free(mc->sha256);
  for (size_t i = 0; i < mc->n_engine_args; i++) free(mc->engine_args[i]);
  free(mc->engine_args);
  free(mc->labels);
  memset(mc, 0, sizeof(*mc));
}

static void cfg_models(cfg_ctx *x, const cJSON *root, const char *path, void *base,
                       const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const cJSON *arr = NULL;
  if (!cfg_check(x, pr_json_get_arr(root, s->key, 0, &arr, path, &e), &e) || !arr) return;
  size_t n = (size_t)cJSON_GetArraySize(arr) + 1;
  c->models = calloc(n, sizeof(*c->models));
  c->model_targets = calloc(n, sizeof(*c->model_targets));
  c->model_confs = calloc(n, sizeof(*c->model_confs));
  if (!c->models || !c->model_targets || !c->model_confs) return;
  int i = 0;
  for (const cJSON *o = arr->child; o; o = o->next, i++) {
    char p[64];
    pr_json_path_index(p, sizeof(p), "models", i);
    if (!cJSON_IsObject(o)) {
      cfg_err_at(x, p, 0, "expected an object");
      continue;
    }
    gw_model_conf *mc = &c->model_confs[c->n_models];
    mc->targets = (gw_targets){.interactive_wait_s = -1, .review_within_s = -1, .batch_by_min = -2};
    cfg_apply(x, o, "models", p, mc);
    c->model_targets[c->n_models] = mc->targets;
    if ((mc->url != NULL) != (mc->sha256 != NULL))
      cfg_err_at(x, p, 0, "url and sha256 go together: a phone checks what it downloads");
    if (mc->name && (c->models[c->n_models] = strdup(mc->name))) c->n_models++;
    else cfg_model_conf_free(mc);
  }
}

const gw_model_conf *gw_config_model(const gw_config *c, const char *name) {
  for (size_t i = 0; c->model_confs && i < c->n_models; i++)
    if (strcmp(c->model_confs[i].name, name) == 0) return &c->model_confs[i];
  return NULL;
}

/* placement.pins: {"phone id": "model"}, each model one of the catalogue's. */
static void cfg_place_pins(cfg_ctx *x, const cJSON *o, const char *p, void *base,
                           const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const cJSON *obj = NULL;
  if (!cfg_check(x, pr_json_get_obj(o, s->key, 0, &obj, p, &e), &e) || !obj) return;
  size_t n = (size_t)cJSON_GetArraySize(obj) + 1;
  c->place_pin_ids = calloc(n, sizeof(char *));
  c->place_pin_models = calloc(n, sizeof(char *));
  if (!c->place_pin_ids || !c->place_pin_models) return;
  char pp[80];
  pr_json_path_key(pp, sizeof(pp), p, s->key);
  for (const cJSON *it = obj->child; it; it = it->next) {
    char kp[200];
    pr_json_path_key(kp, sizeof(kp), pp, it->string ? it->string : "");
    if (!cJSON_IsString(it) || !gw_config_model(c, it->valuestring)) {
      cfg_err_at(x, kp, 0, "expected the name of a model of `models`");
      continue;
    }
    c->place_pin_ids[c->n_place_pins] = strdup(it->string);
    c->place_pin_models[c->n_place_pins++] = strdup(it->valuestring);
  }
}

/* ---- capacity: targets, the operator's price table, the scale hook ---- */

/* "batch_by": "HH:MM" (local time) into minutes of the day; in `models[i].targets` the
 * field is in a gw_model_conf, in `capacity` in the gw_config. */
static void cfg_batch_by_into(cfg_ctx *x, const cJSON *o, const char *path, int *out) {
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(o, "batch_by", 0, &v, path, &e), &e) || !v) return;
  char bp[300];
  pr_json_path_key(bp, sizeof(bp), path, "batch_by");
  unsigned h, m;
  char tail;
  if (strlen(v) != 5 || sscanf(v, "%2u:%2u%c", &h, &m, &tail) != 2 || v[2] != ':' || h > 23 ||
      m > 59) {
    cfg_err_at(x, bp, 0, "expected a time of day \"HH:MM\" (00:00 to 23:59), got \"%s\"", v);
    return;
  }
  *out = (int)(h * 60 + m);
}

static void cfg_batch_by(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                         const cfg_setting *s) {
  (void)s;
  cfg_batch_by_into(x, o, path, &((gw_config *)base)->targets.batch_by_min);
}

static void cfg_model_batch_by(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                               const cfg_setting *s) {
  (void)s;
  cfg_batch_by_into(x, o, path, &((gw_model_conf *)base)->targets.batch_by_min);
}

/* A list of non-empty strings at o[key] into a NULL-ended array; 0 or -1 (reported). */
static int cfg_str_list(cfg_ctx *x, const cJSON *o, const char *key, const char *path,
                        char ***out, size_t *n) {
  pr_json_err e;
  const cJSON *arr = NULL;
  if (!cfg_check(x, pr_json_get_arr(o, key, 0, &arr, path, &e), &e)) return -1;
  if (!arr) return 0;
  char ap[300];
  pr_json_path_key(ap, sizeof(ap), path, key);
  *out = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof(char *));
  if (!*out) return -1;
  for (const cJSON *it = arr->child; it; it = it->next) {
    if (!cJSON_IsString(it) || !it->valuestring[0] || strlen(it->valuestring) > 4096) {
      cfg_err_at(x, ap, 0, "expected a list of non-empty strings");
      return -1;
    }
    (*out)[(*n)++] = strdup(it->valuestring);
  }
  return 0;
}

/* "prices": [{"name", "cost_per_day", "prefill_tps", "decode_tps", "slots", "models"}] */
static void cfg_prices(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                       const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const cJSON *arr = NULL;
  if (!cfg_check(x, pr_json_get_arr(o, s->key, 0, &arr, path, &e), &e) || !arr) return;
  char ap[300];
  pr_json_path_key(ap, sizeof(ap), path, s->key);
  int n = cJSON_GetArraySize(arr);
  if (n > 64) {
    cfg_err_at(x, ap, 0, "at most 64 phone classes");
    return;
  }
  c->prices = calloc((size_t)n + 1, sizeof(*c->prices));
  if (!c->prices) return;
  static const char *const keys[] = {"name", "cost_per_day", "prefill_tps", "decode_tps",
                                     "slots", "models", NULL};
  int i = 0;
  for (const cJSON *it = arr->child; it; it = it->next, i++) {
    char ip[320];
    pr_json_path_index(ip, sizeof(ip), ap, i);
    if (!cJSON_IsObject(it)) {
      cfg_err_at(x, ip, 0, "expected an object");
      continue;
    }
    cfg_keys(x, it, keys, ip);
    gw_price_conf *pc = &c->prices[c->n_prices];
    const char *name = NULL;
    double cost = 0, pre = 0, dec = 0;
    int64_t slots = 1;
    int ok = cfg_check(x, pr_json_get_str(it, "name", 1, &name, ip, &e), &e);
    ok &= cfg_check(x, pr_json_get_double(it, "cost_per_day", 1, 0, 1e6, &cost, ip, &e), &e);
    ok &= cfg_check(x, pr_json_get_double(it, "prefill_tps", 1, 0.001, 1e7, &pre, ip, &e), &e);
    ok &= cfg_check(x, pr_json_get_double(it, "decode_tps", 1, 0.001, 1e7, &dec, ip, &e), &e);
    ok &= cfg_check(x, pr_json_get_int(it, "slots", 0, 1, 64, &slots, ip, &e), &e);
    if (!ok || !name) continue;
    if (!name[0] || strlen(name) > 63) {
      cfg_err_at(x, ip, 0, "name: expected 1 to 63 characters");
      continue;
    }
    for (size_t k = 0; k < c->n_prices; k++)
      if (strcmp(c->prices[k].name, name) == 0) cfg_err_at(x, ip, 0, "duplicate class \"%s\"", name);
    pc->name = strdup(name);
    pc->cost_per_day = cost;
    pc->prefill_tps = pre;
    pc->decode_tps = dec;
    pc->slots = (int)slots;
    (void)cfg_str_list(x, it, "models", ip, &pc->models, &pc->n_models);
    c->n_prices++;
  }
}

static void cfg_hook_command(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                             const cfg_setting *s) {
  gw_config *c = base;
  if (cfg_str_list(x, o, s->key, path, &c->hook_command, &c->n_hook_command) == 0 &&
      c->hook_command && c->n_hook_command == 0) {
    char p[300];
    pr_json_path_key(p, sizeof(p), path, s->key);
    cfg_err_at(x, p, 0, "expected a program and its arguments, not an empty list");
  }
}

static void cfg_hook_url(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                         const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 0, &v, path, &e), &e) || !v) return;
  char p[300];
  pr_json_path_key(p, sizeof(p), path, s->key);
  if (strncmp(v, "http://", 7) != 0 && strncmp(v, "https://", 8) != 0) {
    cfg_err_at(x, p, 0, "expected an http:// or https:// URL, got \"%s\"", v);
    return;
  }
  if (c->hook_command) cfg_err_at(x, p, 0, "give a command or a url, not both");
  c->hook_url = strdup(v);
}

/* The hook needs its spending cap: fleetgate never asks for rent without one. */
static void cfg_capacity_check(cfg_ctx *x, const gw_config *c) {
  if ((c->hook_command || c->hook_url) && !(c->hook_max_cost_per_day > 0))
    cfg_err_at(x, "capacity.hook", 0, "a hook needs max_cost_per_day, the most rent per day "
                                      "its asks may add in 24 hours");
  /* a class of no price would pass any cap: the hook is never asked for one (capsvc.c), and
   * the operator's own table is told so now */
  for (size_t i = 0; (c->hook_command || c->hook_url) && i < c->n_prices; i++) {
    if (c->prices[i].cost_per_day > 0) continue;
    char p[80];
    snprintf(p, sizeof(p), "capacity.prices[%zu].cost_per_day", i);
    cfg_err_at(x, p, 0, "must be above 0 with a hook (class \"%s\"): the hook is never asked "
               "for phones the spending cap cannot count", c->prices[i].name);
  }
  if ((c->hook_command || c->hook_url) && !c->data_dir)
    cfg_err_at(x, "capacity.hook", 0, "a hook needs data_dir: its asks of the last 24 hours are "
                                      "kept there, so that a restart does not lift max_cost_per_day");
}

static double dflt_review_within(const void *base) { return ((const gw_config *)base)->queue_timeout_s; }

/* ---- replicas: from the main file and from replicas_dir ---- */

static void cfg_replica_id(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                           const cfg_setting *s) {
  gw_replica_conf *r = base;
  pr_json_err e;
  const char *id = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 1, &id, path, &e), &e) || !id) return;
  if (!*id) cfg_err_at(x, path, 0, "a replica id must not be empty");
  r->id = strdup(id);
  char ip[300];
  pr_json_path_key(ip, sizeof(ip), path, "id");
  pr_json_position(x->text, x->len, loc_find(x->text, x->len, ip, 0), &r->line, &r->col);
}

static void cfg_replica_url(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                            const cfg_setting *s) {
  gw_replica_conf *r = base;
  pr_json_err e;
  const char *u = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 1, &u, path, &e), &e) || !u) return;
  char p[300];
  pr_json_path_key(p, sizeof(p), path, "url");
  const char *why = NULL;
  if (pr_url_base_check(u, x->conf->allow_http, NULL, &why) < 0) cfg_err_at(x, p, 0, "%s", why);
  size_t l = strlen(u);
  while (l > 0 && u[l - 1] == '/') l--;
  r->url = strndup(u, l);
}

static void cfg_replica_models(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                               const cfg_setting *s) {
  gw_replica_conf *r = base;
  pr_json_err e;
  const cJSON *models = NULL;
  if (!cfg_check(x, pr_json_get_arr(o, s->key, 1, &models, path, &e), &e) || !models) return;
  int n = cJSON_GetArraySize(models);
  char mp[300];
  pr_json_path_key(mp, sizeof(mp), path, "models");
  if (n == 0) cfg_err_at(x, mp, 0, "a replica must serve at least one model");
  r->models = calloc((size_t)n + 1, sizeof(char *));
  int i = 0;
  for (const cJSON *m = models->child; m; m = m->next, i++) {
    if (!cJSON_IsString(m) || !m->valuestring[0]) {
      char ip[320];
      pr_json_path_index(ip, sizeof(ip), mp, i);
      cfg_err_at(x, ip, 0, "expected a non-empty string");
      continue;
    }
    r->models[r->n_models++] = strdup(m->valuestring);
  }
}

/* token_env or token (this reads both); token_env wins. */
static void cfg_replica_token(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                              const cfg_setting *s) {
  gw_replica_conf *r = base;
  pr_json_err e;
  const char *tenv = NULL, *tok = NULL;
  cfg_check(x, pr_json_get_str(o, s->key, 0, &tenv, path, &e), &e);
  cfg_check(x, pr_json_get_str(o, "token", 0, &tok, path, &e), &e);
  if (tenv) {
    const char *val = getenv(tenv);
    char p[300];
    pr_json_path_key(p, sizeof(p), path, "token_env");
    if (!val || !*val)
      cfg_err_at(x, p, 0, "environment variable %s is not set", tenv);
    else
      r->token = strdup(val);
  } else if (tok) {
    r->token = strdup(tok);
  }
}

static void cfg_replica_labels(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                               const cfg_setting *s) {
  gw_replica_conf *r = base;
  pr_json_err e;
  const cJSON *labels = NULL;
  if (cfg_check(x, pr_json_get_obj(o, s->key, 0, &labels, path, &e), &e) && labels)
    r->labels = pr_json_print(labels);
}

static void cfg_replica_key(cfg_ctx *x, const cJSON *o, const char *path, void *base,
                            const cfg_setting *s) {
  gw_replica_conf *r = base;
  pr_json_err e;
  const char *v = NULL;
  if (!cfg_check(x, pr_json_get_str(o, s->key, 0, &v, path, &e), &e) || !v) return;
  char p[256];
  snprintf(p, sizeof(p), "%s.key", path);
  if (!pr_idkey_valid_public(v))
    cfg_err_at(x, p, 0, "expected an Ed25519 public key: base64 of 32 bytes (44 characters, "
               "as `fleetgate-agent --print-key` shows it)");
  else
    r->key = strdup(v);
}

static void cfg_replica(cfg_ctx *x, const cJSON *o, const char *path, gw_replica_conf *r) {
  if (!cJSON_IsObject(o)) {
    cfg_err_at(x, path, 0, "expected an object");
    return;
  }
  cfg_apply(x, o, "replicas", path, r);
  r->file = xstrdup(x->file);
}

/* Add the replicas of `node` (an array, or one object when base is "") to c, refusing
 * ids already defined anywhere, and naming where the first definition was. */
static void cfg_replica_list(cfg_ctx *x, const cJSON *node, const char *base, gw_config *c) {
  int n = cJSON_IsArray(node) ? cJSON_GetArraySize(node) : 1;
  gw_replica_conf *grown = realloc(c->replicas, (c->n_replicas + (size_t)n + 1) * sizeof(*grown));
  if (!grown) {
    cfg_err_at(x, base, 0, "out of memory");
    return;
  }
  c->replicas = grown;
  int i = 0;
  const cJSON *it = cJSON_IsArray(node) ? node->child : node;
  for (; it; it = cJSON_IsArray(node) ? it->next : NULL, i++) {
    char p[64];
    if (cJSON_IsArray(node)) pr_json_path_index(p, sizeof(p), base, i);
    else snprintf(p, sizeof(p), "%s", base);
    gw_replica_conf *r = &c->replicas[c->n_replicas++];
    memset(r, 0, sizeof(*r));
    cfg_replica(x, it, p, r);
    if (!r->id) continue;
    /* found by id (gw_config_replica): a fleet of thousands loads in one pass */
    uintptr_t j = (uintptr_t)pr_idmap_get_str(&c->replica_index, r->id);
    if (j) {
      const gw_replica_conf *o = &c->replicas[j - 1];
      char ip[80];
      pr_json_path_key(ip, sizeof(ip), p, "id");
      cfg_err_at(x, ip, 0, "duplicate replica id \"%s\" (also defined at %s:%d:%d)", r->id,
                 o->file ? o->file : "?", o->line, o->col);
    } else if (pr_idmap_put_str(&c->replica_index, r->id, (void *)(uintptr_t)c->n_replicas) < 0) {
      cfg_err_at(x, p, 0, "out of memory");
    }
  }
}

static void cfg_replicas(cfg_ctx *x, const cJSON *root, const char *path, void *base,
                         const cfg_setting *s) {
  pr_json_err e;
  const cJSON *reps = NULL;
  if (cfg_check(x, pr_json_get_arr(root, s->key, 0, &reps, path, &e), &e) && reps)
    cfg_replica_list(x, reps, "replicas", base);
}

static int cfg_read_file(const char *path, pr_buf *text, pr_buf *errors) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    int e = errno;
    pr_buf_text(errors, "%s:0:0: cannot open: %s\n", path, strerror(e));
    return -e;
  }
  char chunk[8192];
  size_t n;
  int rc = 0;
  while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
    if ((rc = pr_buf_append(text, chunk, n))) break;
  fclose(fp);
  if (rc) pr_buf_text(errors, "%s:0:0: file too large\n", path);
  return rc;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.json in dir (relative to the main file's folder), in name order; each holds
 * one replica object or a list of them. Read synchronously: this runs at start and on
 * reload, never on a request's path. */
static void cfg_replicas_dir(cfg_ctx *main_x, const cJSON *root, const char *rpath, void *base,
                             const cfg_setting *s) {
  gw_config *c = base;
  pr_json_err je;
  const char *dir = NULL;
  if (!cfg_check(main_x, pr_json_get_str(root, s->key, 0, &dir, rpath, &je), &je) || !dir) return;
  char full[4096];
  if (dir[0] == '/') {
    snprintf(full, sizeof(full), "%s", dir);
  } else {
    const char *slash = strrchr(main_x->file, '/');
    if (slash)
      snprintf(full, sizeof(full), "%.*s/%s", (int)(slash - main_x->file), main_x->file, dir);
    else
      snprintf(full, sizeof(full), "%s", dir);
  }
  c->replicas_dir = strdup(full);
  DIR *d = opendir(full);
  if (!d) {
    cfg_err_at(main_x, "replicas_dir", 0, "cannot open directory %s: %s", full, strerror(errno));
    return;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (de->d_name[0] == '.' || l < 6 || strcmp(de->d_name + l - 5, ".json") != 0) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      char **nn = realloc(names, cap * sizeof(*nn));
      if (!nn) break;
      names = nn;
    }
    names[n++] = strdup(de->d_name);
  }
  closedir(d);
  if (n) qsort(names, n, sizeof(*names), cmp_str);
  for (size_t i = 0; i < n; i++) {
    char path[4600];
    snprintf(path, sizeof(path), "%s/%s", full, names[i]);
    free(names[i]);
    pr_buf text;
    pr_buf_init(&text, PR_CAP_CONFIG_FILE);
    if (cfg_read_file(path, &text, main_x->errors)) {
      main_x->n_errors++;
      pr_buf_free(&text);
      continue;
    }
    cfg_ctx x = {NULL, pr_buf_cstr(&text), text.len, main_x->errors, 0, c, main_x->no_files};
    /* replica confs keep their file name: it must outlive this loop */
    char *keep = strdup(path);
    x.file = keep;
    cJSON *froot = pr_json_parse(x.text, x.len, 64, &je);
    if (!froot) {
      pr_buf_text(x.errors, "%s:%d:%d: %s\n", path, je.line, je.col, je.msg);
      x.n_errors++;
    } else if (cJSON_IsArray(froot) || cJSON_IsObject(froot)) {
      cfg_replica_list(&x, froot, "", c);
    } else {
      cfg_err_at(&x, "", 0, "a replica file holds one replica object or a list of them");
    }
    main_x->n_errors += x.n_errors;
    cJSON_Delete(froot);
    pr_buf_free(&text);
    free(keep);
  }
  free(names);
}

static double derive_down_interval(const void *base) {
  return ((const gw_config *)base)->health_interval_s * 3;
}

/* ---- the settings table ----------------------------------------------------------------
 * In the order keys are read (and listed in the reference); a section's entries follow
 * its SET_SECTION line's order among the sections. */

#define GC gw_config
#define KC gw_key_conf
#define RC gw_replica_conf
#define MC gw_model_conf
#define POW2(n) ((double)(INT64_C(1) << (n)))

static const cfg_setting settings[] = {
  /* the top level */
  {SET_CUSTOM("", "listen", cfg_listen), .type_doc = "string or list",
   .dflt_doc = "`127.0.0.1:8080`", .range_doc = "HOST:PORT",
   .doc = "where the client API is served: an address, or a list of addresses, each with or "
          "without TLS ([below](#listen))"},
  {SET_SECTION("limits"), .doc = "the HTTP front's limits and timeouts"},
  {SET_SECTION("queue"), .doc = "each model's queue of waiting requests"},
  {SET_SECTION("scheduler"), .doc = "retries and what the scheduler assumes before it has seen answers"},
  {SET_SECTION("upstream"), .doc = "calls to replicas: TLS and timeouts"},
  {SET_SECTION("health"), .doc = "active checks and passive health"},
  {SET_SECTION("fleet"), .doc = "agents' signed heartbeats; without it they are refused"},
  {SET_SECTION("costs"), .doc = "the currency of every `cost_per_day` and how much of a phone's "
                                "own price is believed ([operations](operations.md#costs))"},
  {SET_NUM("", "shutdown_timeout_s", 0, 86400, 30, GC, shutdown_timeout_s),
   .doc = "on SIGTERM/SIGINT, how long running and queued requests may still finish "
          "([below](#shutdown_timeout_s))"},
  {SET_CUSTOM("", "log_level", cfg_log_level), .type_doc = "string", .dflt_doc = "`info`",
   .range_doc = "`debug`, `info`, `warn`, `error`",
   .doc = "the least severe log lines written; `--log-level` overrides it"},
  {SET_NUM("", "tls_ticket_rotate_s", 1, 86400 * 7, 43200, GC, tls_ticket_rotate_s),
   .doc = "how often the TLS session ticket key is replaced: tickets sealed by the key "
          "before the current one still resume (and are renewed), older ones do not, so a "
          "ticket or a key found later opens at most two periods of sessions "
          "([security](security.md#tls))"},
  {SET_SECTION("admin"), .doc = "the status page, `/metrics` and the admin API on a listener of "
                                "their own; without it there is none"},
  {SET_SECTION("redis"), .doc = "one Redis shared by several gateways; without it all state is "
                                "in memory"},
  {SET_CUSTOM("", "data_dir", cfg_data_dir), .type_doc = "string", .dflt_doc = "— (no Batch API)",
   .range_doc = "an existing folder, relative to the main file's folder",
   .doc = "where the Batch API keeps its database (`batch.db`, SQLite) and its files "
          "(`files/`), and where the admin's drains, signed-out sessions, placement pins and "
          "phones' answer records and quarantines are kept across restarts (`drains.json`, "
          "`sessions-ended.json`, `placement-pins.json`, `verify.json`); "
          "it must exist and be writable at start. Without it `/v1/files` and "
          "`/v1/batches` answer 404 `batches_disabled` ([batch](batch.md)) and a restart "
          "lifts every admin drain and placement pin"},
  {SET_SECTION("batch"), .doc = "the Batch API's limits ([batch](batch.md)); needs `data_dir`"},
  {SET_SECTION("verify"), .doc = "answers verified: cross-checks, canaries and quarantine "
                                 "([routing](routing.md#answers-verified))"},
  {SET_SECTION("capacity"), .doc = "the targets the capacity advice plans phones for, the "
                                   "classes of phone the operator can rent, and the scale hook "
                                   "([capacity](capacity.md))"},
  {SET_CUSTOM("", "api_keys", cfg_api_keys), .type_doc = "list of objects",
   .dflt_doc = "— (open)", .range_doc = "non-empty",
   .doc = "the callers and their limits; without it anyone may call"},
  {SET_CUSTOM("", "models", cfg_models), .type_doc = "list of objects", .dflt_doc = "—",
   .range_doc = "unique names",
   .doc = "models the fleet is to serve, and the catalogue placement reads: a request for one "
          "is queued while no phone lists it ([below](#models--what-the-fleet-serves))"},
  {SET_SECTION("placement"), .doc = "which phone runs which model, from demand "
                                    "([placement](placement.md)); off unless enabled"},
  {SET_CUSTOM("", "replicas", cfg_replicas), .type_doc = "list of objects", .dflt_doc = "—",
   .range_doc = "unique ids", .doc = "the replicas the gateway routes to"},
  {SET_CUSTOM("", "replicas_dir", cfg_replicas_dir), .type_doc = "string", .dflt_doc = "—",
   .range_doc = "—",
   .doc = "a folder of `*.json` files holding more replicas ([below](#replicas_dir))"},

  {SET_SIZE("limits", "max_body_bytes", 1024, POW2(32), 8u << 20, GC, max_body_bytes),
   .dflt_doc = "8388608 (8 MiB)",
   .doc = "larger completion request bodies get 413 `request_too_large`, from the "
          "`Content-Length` before the body is read (heartbeats, the admin API and the other "
          "routes take at most 64 KiB)"},
  {SET_NUM("limits", "header_timeout_s", 0.1, 3600, 10, GC, header_timeout_s),
   .doc = "from a request's first byte to its last header; the body then has 6× this long "
          "(60 s by default); late requests get 408 `request_timeout`"},
  {SET_NUM("limits", "idle_timeout_s", 0.1, 86400, 60, GC, idle_timeout_s),
   .doc = "how long an idle keep-alive connection is kept"},
  {SET_NUM("limits", "send_timeout_s", 0.1, 86400, 60, GC, send_timeout_s),
   .doc = "a client that reads nothing of its answer for this long is disconnected (and a "
          "stream's phone slot freed)"},
  {SET_SIZE("limits", "body_budget_bytes", 65536, POW2(40), 512u << 20, GC, body_budget_bytes),
   .dflt_doc = "536870912 (512 MiB)",
   .doc = "request body bytes all connections together may hold at once (a body with a "
          "`Content-Length` counts in full from its headers); a request whose body would pass "
          "it gets 503 `server_busy` with `Retry-After` before its body is read "
          "([security](security.md#size-limits))"},
  {SET_SIZE("limits", "max_connections", 1, 1000000, 10000, GC, max_connections),
   .doc = "per listener: connections past this are not accepted but wait in the listen queue "
          "until one closes"},

  {SET_SIZE("queue", "max", 1, 10000000, 1000, GC, queue_max),
   .doc = "requests that may *wait* per model; one more gets 429 `queue_full`. Running "
          "requests do not count"},
  {SET_NUM("queue", "timeout_s", 0.1, 86400 * 7, 600, GC, queue_timeout_s),
   .doc = "a request's deadline, counted from its arrival; a request still waiting (or between "
          "retries) when it passes gets 503 `deadline_exceeded`. The `x-fleetgate-timeout` "
          "header can shorten it"},

  {SET_INT("scheduler", "retries", 0, 100, 3, GC, retries),
   .doc = "further attempts on other replicas after the first fails (so at most `retries + 1` "
          "attempts)"},
  {SET_INT64("scheduler", "default_max_tokens", 1, POW2(30), 1024, GC, default_max_tokens),
   .doc = "the token cap sent upstream when the client gave none (reduced to what fits the "
          "largest `n_ctx` among the model's replicas, when all of them have one). "
          "llama-server's own default is unlimited, so a cap is always sent"},
  {SET_NUM("scheduler", "expected_output_tokens", 1, 1e9, 128, GC, expected_output_tokens),
   .doc = "the answer length the scheduler assumes until it has seen answers; then it uses a "
          "moving average of real answer lengths for the request's model and cap, or over "
          "all answers while that pair has none (never more than the request's cap; "
          "[routing](routing.md#3-finish-soonest-scheduling))"},
  {SET_NUM("scheduler", "batch_reserve", 0, 1, 1, GC, batch_reserve),
   .doc = "the share of the recent peak of interactive requests on each phone (a peak that "
          "fades with a time constant of 60 s) whose slots batch-class requests leave free "
          "there: `1` keeps interactive latency as without batches, lower values give batches "
          "more of the phones interactive traffic also uses ([routing](routing.md#2-the-queue))"},
  {SET_NUM("scheduler", "batch_borrow_s", 0, 3600, 1, GC, batch_borrow_s),
   .doc = "a batch-class request predicted to hold a slot no longer than this may take one of "
          "the slots `batch_reserve` keeps for interactive work: it delays an interactive "
          "request by that much at most; `0`: never"},
  {SET_NUM("scheduler", "rates_drift_s", 0, 1e9, 1800, GC, rates_drift_s),
   .doc = "a phone's learned rates, while no answer refreshes them, drift toward the fleet's "
          "prior for its model (the median of the measured phones serving it): the distance, "
          "in ratio, shrinks by e every this many seconds, so a phone that looked slow once is "
          "tried again ([routing](routing.md#priors-drift-and-exploration)); `0`: no drift"},
  {SET_NUM("scheduler", "explore_cost", 0, 100, 0.5, GC, explore_cost),
   .doc = "a phone whose speed is unknown (nothing measured yet, and a rate not configured) with "
          "a free slot takes a request predicted to finish there within (1 + this) × the best "
          "phone's finish, so that it is measured "
          "([routing](routing.md#priors-drift-and-exploration)); `0`: never"},
  {SET_NUM("scheduler", "timings_trust_factor", 0, 1000, 2, GC, timings_trust_factor),
   .doc = "a phone's `timings` teach its rates only while the time they predict is within "
          "this factor of the gateway's own clock for that answer (or 250 ms of it); "
          "otherwise the clock wins, and the disagreement is logged and counted "
          "(`fleetgate_timings_disagreed_total`; [security](security.md#untrusted-answers)); "
          "`0`: not checked (the 2× floor stays)"},
  {SET_NUM("scheduler", "hedge_budget", 0, 1, 0.05, GC, hedge_budget),
   .doc = "the most extra phone work hedges may take: this share of the slot-seconds all "
          "attempts used over the last 5 minutes (running ones included). A request whose "
          "first byte is overdue gets a second attempt on a free phone that would finish it "
          "sooner; the first answer wins and the other is cancelled "
          "([routing](routing.md#hedging)); `0` turns hedging off"},
  {SET_INT("scheduler", "hedge_min_running", 0, 1000, 2, GC, hedge_min_running),
   .doc = "hedges of requests on a phone that failed its health check, or whose check is "
          "late, that may run at once beyond `hedge_budget`: a gateway that just started, or "
          "after a quiet spell, has hardly any budget, and such a phone is not expected to "
          "answer (the request would wait for it to be marked down). At most this many "
          "phone slots of extra work; `0`: the budget alone"},
  {SET_NUM("scheduler", "hedge_factor", 1, 100, 1.5, GC, hedge_factor),
   .doc = "a request's first byte is overdue (a candidate for a hedge) once it waited its "
          "predicted time × this + `hedge_min_s`; for a prompt of at most 512 tokens the "
          "margin past the prediction is halved"},
  {SET_NUM("scheduler", "hedge_min_s", 0, 86400, 2, GC, hedge_min_s),
   .doc = "the part of the hedge margin that does not grow with the prediction (seconds)"},
  {SET_NUM("scheduler", "short_s", 0, 86400, 2, GC, short_s),
   .doc = "a request predicted to hold a slot of the quickest phone that can take it at most "
          "this long (seconds) is short work, wherever it goes: an always-on guard's message, a "
          "classifier's prompt; see `short_reserve`"},
  {SET_INT("scheduler", "short_reserve", 0, 1000, 3, GC, short_reserve),
   .doc = "at most this many slots on the model's quick phones (reading prompts at or above "
          "the median pace of the usable phones serving it, at their planned pace) that longer "
          "work leaves free while short work for the model came in the last `short_recent_s` "
          "(slots running short work count as kept), so that a short request finds a slot at "
          "once instead of waiting for a review to end: as many as the short work that came "
          "needs (`short_wait_p`), and never more than a quarter of those phones' slots "
          "([routing](routing.md#slots-kept-for-short-work)); `0`: none kept"},
  {SET_NUM("scheduler", "short_wait_p", 0, 1, 0.05, GC, short_wait_p),
   .doc = "the slots kept for short work are the fewest (at least 1, at most `short_reserve`) "
          "with which a short request waits longer than `short_s` for one with at most this "
          "probability, by the short work of the last `short_recent_s`: its arrival rate and "
          "service time (Erlang C); and a free kept slot is left to longer work while a short "
          "request is no likelier than this to come before a quick slot busy with longer work "
          "frees, less `short_s`; `0`: always `short_reserve`, kept whatever comes"},
  {SET_NUM("scheduler", "short_recent_s", 0, 86400, 60, GC, short_recent_s),
   .doc = "how recently short work for a model must have come for `short_reserve` to keep its "
          "slots; a gateway that started less than this ago keeps them for every model, as it "
          "cannot know yet (else the first seconds' long work takes every quick slot before "
          "the first guard's message); `0`: never kept"},
  {SET_INT("scheduler", "trust_after_answers", 0, 1000000, 8, GC, trust_after_answers),
   .doc = "good answers after which a phone's share of the work is no longer capped: before, "
          "it holds at most 1 + its good answers, or as many as the other phones' usable slots "
          "together, requests at once, however fast it claims to be "
          "([routing](routing.md#phones-without-a-record)); `0` turns the cap off"},
  {SET_NUM("scheduler", "aging_factor", 0, 1e6, 0.5, GC, aging_factor),
   .doc = "shortest work first within a caller's share: waiting requests are ordered by "
          "arrival + this x their predicted service time, so a short request passes long "
          "ones, and a request is passed only by requests that arrive less than this x its "
          "own predicted time after it ([routing](routing.md#2-the-queue)); `0`: arrival "
          "order"},
  {SET_NUM("scheduler", "wait_weight_max", 1, 100, 2, GC, wait_weight_max),
   .doc = "when long work of several sizes waits, a request shorter than the longest weighs "
          "its wait for a busy faster phone by (the longest one's predicted time ÷ its own), "
          "at most this, against a phone free now or sooner: a chat takes a free slower phone sooner "
          "and leaves the fast ones to the reviews that need them, instead of both queueing "
          "for the fast phones while the slower ones idle "
          "([routing](routing.md#waiting-for-a-faster-phone)); `1`: every request plans on "
          "plain finish times"},
  {SET_BOOL("scheduler", "fill_idle", 1, GC, fill_idle),
   .doc = "plan the queue, not one request at a time: a phone the plan leaves idle while long "
          "work waits for busier, faster phones takes the waiting request it finishes soonest, "
          "when the phones faster for it cannot clear the work waiting for them and the work that "
          "comes (the model's work per second lately) before the idle phone would finish it "
          "([routing](routing.md#the-queue-as-a-whole-idle-phones)); `false`: each request "
          "waits for the phone that finishes it soonest"},
  {SET_NUM("scheduler", "load_window_s", 0.1, 86400, 60, GC, load_window_s),
   .doc = "the time constant of a model's interactive work per second, the `fill_idle` rule's "
          "work that comes: an average of about this long, read over half of it at least (a "
          "model's first requests alone are no steady load); shorter follows a load that "
          "changes sooner and reads a steady one less surely. A fleet of simulated phones run K "
          "times faster than life divides it by K, like every other time setting "
          "([sim](sim.md#time-scale))"},
  {SET_NUM("scheduler", "deadline_margin", 1, 1000, 2, GC, deadline_margin),
   .doc = "how far off the predictions may be before a request is refused at once: one whose "
          "earliest predicted finish on any usable replica, divided by this, is still past "
          "its deadline gets 503 `deadline_unreachable` on arrival instead of waiting for "
          "it ([routing](routing.md#deadline-check)); only replicas with learned rates are "
          "trusted to say so"},
  {SET_SUBSECTION("scheduler", "device"),
   .doc = "what phones' own readings (battery, charging, temperature, CPU clock cap) do to "
          "the work they get ([below](#schedulerdevice), [routing](routing.md#device-aware-routing))"},
  {SET_NUM("scheduler.device", "battery_low_pct", 0, 100, 20, GC, device.battery_low_pct),
   .doc = "a phone whose battery is under this while it says it is not charging takes one "
          "request at a time; `0`: never"},
  {SET_NUM("scheduler.device", "battery_floor_pct", 0, 100, 10, GC, device.battery_floor_pct),
   .doc = "under this, not charging: no new work (requests running finish); it takes work "
          "again once it charges or is back at the floor. Not a drain: nobody lifts it; `0`: never"},
  {SET_NUM("scheduler.device", "hot_c", 0, 200, 45, GC, device.hot_c),
   .doc = "a phone over this temperature (°C) is hot: planned `hot_slowdown` slower; it is cool "
          "again 2 °C below it; `0`: never"},
  {SET_NUM("scheduler.device", "clock_cap_ratio", 0, 1, 0.8, GC, device.clock_cap_ratio),
   .doc = "a phone whose CPU clock is capped under this share of its top (`cpu_max_freq_ratio`) "
          "is hot too: planned at its rates × that share; `0`: never"},
  {SET_NUM("scheduler.device", "hot_slowdown", 1, 20, 1.5, GC, device.hot_slowdown),
   .doc = "how much slower a phone hot by temperature is planned (the clock cap's slowdown "
          "when that is larger)"},
  {SET_INT("scheduler.device", "hot_answers", 1, 1000, 3, GC, device.hot_answers),
   .doc = "answers measured while hot over which the slowdown fades away: by then the learned "
          "rates say how fast the hot phone is, and the heat is not counted twice"},

  {SET_STR("upstream", "ca_file", NULL, GC, ca_file), .dflt_doc = "libcurl's CA store",
   .doc = "CA bundle (PEM) for `https://` replica URLs"},
  {SET_BOOL("upstream", "tls_verify", 1, GC, tls_verify),
   .doc = "`false` disables certificate and host name checks"},
  {SET_BOOL("upstream", "allow_http", 0, GC, allow_http),
   .doc = "let replica URLs be plain `http://` (files and heartbeats alike); otherwise only "
          "`https://` loads or registers ([URL policy](security.md#url-policy))"},
  {SET_CUSTOM("upstream", "allow_addresses", cfg_allow_addresses), .type_doc = "list of strings",
   .dflt_doc = "`[]`", .range_doc = "CIDRs, IPv4 or IPv6",
   .doc = "loopback, private, link-local and other special-purpose addresses the gateway may "
          "still connect to, e.g. `[\"127.0.0.0/8\", \"::1/128\"]`; every other such address "
          "is refused where the connection is made ([URL policy](security.md#url-policy))"},
  {SET_NUM("upstream", "connect_timeout_s", 0.1, 600, 10, GC, connect_timeout_s),
   .doc = "TCP + TLS connect timeout"},
  {SET_NUM("upstream", "timeout_margin", 1, 100, 3, GC, timeout_margin),
   .doc = "multiplier on the predicted time in the first-byte timeout"},
  {SET_NUM("upstream", "timeout_min_s", 0.1, 86400, 30, GC, timeout_min_s),
   .doc = "added to it: first-byte timeout = predicted × `timeout_margin` + `timeout_min_s`"},
  {SET_NUM("upstream", "stream_idle_timeout_s", 0.1, 86400, 60, GC, stream_idle_timeout_s),
   .doc = "longest silence allowed once an answer has started"},
  {SET_NUM("upstream", "stream_silence_factor", 0, 1000, 10, GC, stream_silence_factor),
   .doc = "a started stream silent for longer than this many times its phone's expected gap "
          "between tokens (from its learned decode rate, or the stream's own pace when "
          "slower), and at least `stream_silence_min_s`, is cut, charged to the phone and "
          "continued on another ([routing](routing.md#a-phone-that-falls-silent)); `0` leaves "
          "only `stream_idle_timeout_s`"},
  {SET_NUM("upstream", "stream_silence_min_s", 0.1, 86400, 5, GC, stream_silence_min_s),
   .doc = "the least silence that cuts a started stream (above)"},
  {SET_SIZE("upstream", "answer_bytes_per_token", 16, POW2(20), 1024, GC, answer_bytes_per_token),
   .doc = "what a phone may send for a request, as bytes per token of its `max_tokens`: a whole "
          "answer's body and all of a stream's bytes are capped at 256 KiB + `max_tokens` × "
          "this (× 16 when it asks for log-probabilities), at most 32 MiB; a phone passing it "
          "failed ([security](security.md#untrusted-answers))"},
  {SET_NUM("upstream", "refusal_window_s", 0, 600, 10, GC, refusal_window_s),
   .doc = "a 5xx with a readable error body that comes sooner than this after the request went "
          "out may be the request's fault, not the phone's "
          "([routing](routing.md#phone-failures-and-request-errors)); 0 treats every 5xx as "
          "the phone's"},

  {SET_NUM("health", "interval_s", 0, 86400, 5, GC, health_interval_s),
   .doc = "time between probes of a replica (±20 % jitter); `0` turns active checks off"},
  {SET_NUM("health", "timeout_s", 0.05, 3600, 3, GC, health_timeout_s),
   .doc = "a probe not answered in this time failed"},
  {SET_NUM("health", "down_interval_s", 0.05, 86400, 15, GC, health_down_interval_s),
   .derive = derive_down_interval, .dflt_doc = "3 × `interval_s`",
   .doc = "probe interval while a replica is `down`: phones pay for every wake-up"},
  {SET_NUM("health", "idle_probes_per_s", 0, 1e6, 250, GC, health_idle_probes_per_s),
   .doc = "the most probes a second the gateway's idle phones get, together: in a fleet of more "
          "than `interval_s` × this many replicas, a replica that is idle and not `down` is probed "
          "every replicas ÷ this seconds (±20 %) instead of every `interval_s` (6,000 phones at the "
          "default: every 24 s). Busy and `down` replicas are probed as before. Each probe wakes a "
          "phone and costs the gateway ~0.1 ms of CPU ([scaling](scaling.md#one-gateway-at-fleet-scale)); "
          "`0`: every `interval_s`, whatever the fleet's size"},
  {SET_NUM("health", "busy_interval_s", 0, 86400, 1, GC, health_busy_interval_s),
   .doc = "probe interval while a request runs on a replica and nothing is heard from it (its "
          "answers' bytes and its agent's heartbeats are proof of life: [health](health.md#proof-of-life); "
          "never longer than `interval_s`): a phone that hangs with work on it is found in about "
          "this plus `late_s` ([routing](routing.md#hedging)); `0` probes it at `interval_s`"},
  {SET_NUM("health", "late_s", 0, 3600, 1, GC, health_late_s),
   .doc = "a probe still unanswered after this long (or after the replica's usual probe time "
          "plus four times its variation, when that is longer), with nothing else heard from the "
          "replica since it went out, makes the replica *suspect* "
          "until it answers: requests waiting there for their first byte hedge, and new work "
          "goes elsewhere while another replica can take it. It is not marked down for it "
          "(`timeout_s` and `fall` do that). At or above `timeout_s`, or `0`: off"},
  {SET_INT("health", "rise", 1, 1000, 2, GC, rise),
   .doc = "consecutive probe successes that bring a `down` replica back (on probation)"},
  {SET_INT("health", "fall", 1, 1000, 2, GC, fail_threshold),
   .doc = "consecutive failed probes, or consecutive failed requests, that take a replica "
          "`down`"},
  {SET_NUM("health", "cooldown_s", 0.01, 86400, 5, GC, cooldown_s),
   .doc = "after real requests failed, the replica stays `down` at least this long; doubles "
          "with each ejection in a row; also how long a replica that answered \"503 Loading "
          "model\" is left alone when there are no probes"},
  {SET_NUM("health", "cooldown_max_s", 0.01, 86400 * 7, 120, GC, cooldown_max_s),
   .doc = "the cool-down never grows beyond this"},
  {SET_BOOL("health", "readyz_counts", 0, GC, readyz_counts),
   .doc = "show the fleet counts (`replicas_ready`, `replicas`, `queued`) on `/readyz` to "
          "anyone; without it only a request with the admin token (`Authorization: Bearer "
          "<token>`) sees them, others get the status alone"},

  {SET_CUSTOM("fleet", "secret_env", cfg_fleet_secret), .type_doc = "string",
   .dflt_doc = "**required**", .range_doc = "—",
   .doc = "environment variable holding the fleet secret (at least 16 characters) that signs "
          "heartbeats"},
  {SET_CUSTOM("fleet", "replica_token_env", cfg_fleet_token), .type_doc = "string",
   .dflt_doc = "see the text", .range_doc = "16–255 characters, not the fleet secret",
   .doc = "environment variable holding the secret, known to the gateways only (never give it "
          "to phones), that each heartbeat-registered phone's own token is derived from "
          "(HMAC-SHA256 over its id and key; the phone learns it from the heartbeat answer). "
          "Without it: `redis.key_env`'s key, else a random secret kept in `fleet.pins_file`, "
          "else one made at each start. Replicas from files with a `token_env` use that instead"},
  {SET_CUSTOM("fleet", "enrol", cfg_fleet_enrol), .type_doc = "string", .dflt_doc = "`open`",
   .range_doc = "`open`, `approve`",
   .doc = "how a new phone's key is pinned to its id: `open`, at its first heartbeat signed "
          "with the fleet secret; `approve`, once an operator approves it "
          "(`POST /admin/v1/enrolments/ID/approve`) ([security](security.md#phones-identities))"},
  {SET_CUSTOM("fleet", "pins_file", cfg_fleet_pins_file), .type_doc = "string",
   .dflt_doc = "— (in memory)", .range_doc = "a path, relative to the main file's folder",
   .doc = "SQLite file that keeps the pins (which key owns which id) across restarts; "
          "without it a restarted gateway pins afresh. Made and kept mode 0600 whatever the "
          "umask: it may hold the secret phones' tokens derive from "
          "([security](security.md#files-that-hold-secrets))"},
  {SET_NUM("fleet", "pin_ttl_s", 60, 86400.0 * 3650, 86400, GC, fleet_pin_ttl_s),
   .doc = "a pin whose phone has not been heard this long (and is no longer in the "
          "registry) is released: its id may then enrol with another key"},
  {SET_SIZE("fleet", "max_replicas", 1, 1000000, 1024, GC, fleet_max_replicas),
   .doc = "pins (enrolled and pending) at most; further enrolments get 503 `registry_full`"},
  {SET_NUM("fleet", "max_enrolments_per_min", 0.1, 1e6, 60, GC, fleet_enrol_per_min),
   .doc = "new phones enrolled per minute at most (a token bucket of this size); more get "
          "429 `enrolment_rate`"},
  {SET_NUM("fleet", "heartbeat_timeout_s", 0.1, 86400, 15, GC, heartbeat_timeout_s),
   .doc = "a replica whose heartbeats stop for this long leaves rotation (`down`); a "
          "heartbeat-only replica silent for 10× this long leaves the registry"},
  {SET_NUM("fleet", "heartbeat_interval_s", 0.05, 3600, 5, GC, heartbeat_interval_s),
   .doc = "the interval the gateway tells agents to use"},
  {SET_NUM("fleet", "max_skew_s", 0.1, 3600, 30, GC, heartbeat_max_skew_s),
   .doc = "heartbeats whose signed timestamp is further than this from the gateway's clock "
          "are refused"},

  {SET_CUSTOM("costs", "currency", cfg_cost_currency), .type_doc = "string", .dflt_doc = "`ACU`",
   .range_doc = "1–16 of `A-Za-z0-9_.$-`",
   .doc = "the unit of every `cost_per_day` (replica files and heartbeats alike), shown beside "
          "the amounts on the status page, in the admin API and as `fleetgate_cost_info`'s label"},
  {SET_NUM("costs", "max_claimed_per_day", 0, 1e9, 100, GC, cost_claim_max),
   .doc = "a phone's own `cost_per_day` (its heartbeat's) is believed up to this; more is cut "
          "to it. A replica file's `cost_per_day` always wins over the phone's"},

  {SET_CUSTOM("admin", "listen", cfg_admin_listen), .type_doc = "string",
   .dflt_doc = "`127.0.0.1:9090`", .range_doc = "HOST:PORT",
   .doc = "where the admin listener accepts connections, written as for [`listen`](#listen); "
          "keep it on a private address"},
  {SET_CUSTOM("admin", "token_env", cfg_admin_token), .type_doc = "string",
   .dflt_doc = "**required** (or `token`)", .range_doc = "—",
   .doc = "environment variable holding the admin token (at least 16 characters); every admin "
          "request but `/healthz` and the page itself must send `Authorization: Bearer "
          "<token>` (or, from a browser that logged in, its session cookie: `session_ttl_s`)"},
  {SET_CUSTOM("admin", "token", NULL), .type_doc = "string", .dflt_doc = "—", .range_doc = "—",
   .doc = "the token itself, for tests; prefer `token_env`"},
  {SET_BOOL("admin", "public_read", 0, GC, admin_public_read),
   .doc = "let reads (`GET` of the status data, `/metrics`, the `/admin/v1` lists) through "
          "without the token; drain, enable and reload still need it"},
  {SET_NUM("admin", "session_ttl_s", 0, 2592000, 43200, GC, admin_session_ttl_s),
   .doc = "how long a browser stays signed in after one login with the token (`POST "
          "/admin/v1/session` sets an HttpOnly, SameSite=Strict session cookie, signed and "
          "expiring, never the token itself); 0: no sessions, every request sends the token"},

  {SET_CUSTOM("redis", "url", cfg_redis_url), .type_doc = "string", .dflt_doc = "**required**",
   .range_doc = "`redis://[:PASSWORD@]HOST[:PORT][/DB]`",
   .doc = "the Redis server every gateway of the fleet shares"},
  {SET_STR("redis", "prefix", "fleetgate:", GC, redis_prefix),
   .doc = "every key and the pub/sub channel start with it (several fleets can share a Redis)"},
  {SET_NUM("redis", "timeout_s", 0.01, 60, 1, GC, redis_timeout_s),
   .doc = "a command not answered in this time means Redis is down "
          "([scaling](scaling.md))"},
  {SET_NUM("redis", "lease_ttl_s", 1, 3600, 15, GC, lease_ttl_s),
   .doc = "life of a slot lease; renewed every third of it while the request runs"},
  {SET_STR("redis", "gateway_id", NULL, GC, gateway_id), .dflt_doc = "`HOST:PID`",
   .doc = "this gateway's name among its peers (1 to 63 characters, no blanks)"},
  {SET_CUSTOM("redis", "key_env", cfg_redis_key), .type_doc = "string", .dflt_doc = "**required**",
   .range_doc = "—",
   .doc = "environment variable holding the key (at least 32 characters, the same on every gateway, not "
          "the fleet secret) that seals every message and shared value between gateways "
          "([scaling](scaling.md#sealed-messages))"},
  {SET_NUM("redis", "message_window_s", 1, 3600, 30, GC, redis_window_s),
   .doc = "a sealed pub/sub message further than this from the gateway's clock is refused as stale"},
  {SET_STR("redis", "username", NULL, GC, redis_username), .dflt_doc = "—",
   .doc = "a Redis 6 ACL user: the gateway sends `AUTH USERNAME PASSWORD` first on each connection "
          "([scaling](scaling.md#redis-access))"},
  {SET_CUSTOM("redis", "password_env", cfg_redis_password), .type_doc = "string", .dflt_doc = "—",
   .range_doc = "—",
   .doc = "environment variable holding the Redis password (instead of the one in `url`)"},

  {SET_SIZE("batch", "max_file_bytes", 1024, POW2(40), 200u << 20, GC, batch_max_file_bytes),
   .dflt_doc = "209715200 (200 MiB)",
   .doc = "an uploaded file's bytes at most; a larger upload gets 413 `file_too_large` and "
          "nothing of it is kept"},
  {SET_SIZE("batch", "max_lines", 1, 10000000, 50000, GC, batch_max_lines),
   .doc = "lines of one batch's input at most; more fail the batch at validation "
          "(`too_many_lines`)"},
  {SET_NUM("batch", "completion_window_s", 1, 86400.0 * 30, 86400, GC, batch_window_s),
   .doc = "what `completion_window: \"24h\"` means: a batch not finished this long after it "
          "was created expires, and its lines not run are answered `batch_expired`"},
  {SET_BOOL("verify", "enabled", 1, GC, verify_enabled),
   .doc = "a share of the answers is asked again of other phones under deterministic decoding "
          "and compared, canaries are asked, and a phone that loses "
          "`quarantine_after` votes is quarantined ([routing](routing.md#answers-verified))"},
  {SET_NUM("verify", "budget", 0, 1, 0.03, GC, verify_budget),
   .doc = "the most phone work shadow requests may take: this share of the slot-seconds all "
          "attempts used over the last 5 minutes (as `scheduler.hedge_budget`); in the cost "
          "ledger as `_verification`, never a caller's"},
  {SET_INT("verify", "min_running", 0, 1000, 2, GC, verify_min_running),
   .doc = "checks of phones without a record (fewer than `trust_after` passed checks in a row, "
          "or a lost vote) that may run at once beyond `budget`: a fleet that just started has "
          "no budget yet, and its newcomers must be checked first"},
  {SET_INT("verify", "trust_after", 1, 1000000, 5, GC, verify_trust_after),
   .doc = "passed checks in a row that give a phone a record: until then `newcomer_rate` of its "
          "answers are checked; a lost vote starts the count again"},
  {SET_NUM("verify", "newcomer_rate", 0, 1, 0.5, GC, verify_newcomer_rate),
   .doc = "the share of a phone's answers checked while it has no record; with one, "
          "`newcomer_rate × trust_after / passed checks`, never under `min_rate`"},
  {SET_NUM("verify", "min_rate", 0, 1, 0.01, GC, verify_min_rate),
   .doc = "the least share of a long-trusted phone's answers that is checked"},
  {SET_INT("verify", "quarantine_after", 1, 1000, 2, GC, verify_quarantine_after),
   .doc = "lost votes and wrong canary answers (since it last had a record) that quarantine a "
          "phone: no work until an operator releases it"},
  {SET_INT("verify", "ahead", 1, 1000000, 4, GC, verify_ahead),
   .doc = "a phone without a record that answered this many requests since its last passed "
          "check, times the square of one more than the checks it passed in a row (4, 16, 36, "
          "...), takes no new work while "
          "a check of it is undecided (a faker answers at once: it would otherwise take most of "
          "the traffic before its first check is decided)"},
  {SET_INT("verify", "compare_words", 1, 100000, 32, GC, verify_compare_words),
   .doc = "two answers agree when their first this many words (whitespace-separated, of the "
          "generated text: content, reasoning, tool calls) are the same"},
  {SET_INT("verify", "shadow_max_tokens", 0, 1000000, 128, GC, verify_shadow_max_tokens),
   .doc = "a check of a sampled caller's request sends two shadow requests (the checked "
          "phone's and a witness's, at temperature 0), each decoding at most this many tokens "
          "(never fewer than twice `compare_words`): both stop at the same token and only the "
          "first words are compared; 0: as many as the caller asked for. Not capped: the "
          "shadows of a request at temperature 0 (a cap the caller did not send would tell "
          "them apart), of one with `tools` or a `response_format`"},
  {SET_NUM("verify", "timeout_s", 1, 86400, 300, GC, verify_timeout_s),
   .doc = "a shadow request's deadline; a check whose shadow could not be answered in time "
          "is undecided, and nobody is charged"},
  {SET_CUSTOM("verify", "canaries_file", cfg_verify_canaries), .type_doc = "string",
   .dflt_doc = "— (none)", .range_doc = "a path, relative to the main file's folder",
   .doc = "the operator's canaries: a JSON list of `{\"model\", \"prompt\", \"expect\" or "
          "\"expect_regex\", \"max_tokens\"}` asked of each phone now and then "
          "([routing](routing.md#canaries))"},
  {SET_NUM("verify", "canary_interval_s", 1, 86400.0 * 365, 600, GC, verify_canary_interval_s),
   .doc = "each phone serving a canary's model is asked one about this often (a random time "
          "between half and one and a half times it)"},
  {SET_INT("batch", "line_retries", 0, 100, 2, GC, batch_line_retries),
   .doc = "a line that still failed on phones after the scheduler's own retries is run "
          "again this many times (later, from the batch's window) before its error is written"},
  {SET_SIZE("batch", "window", 0, 100000, 0, GC, batch_window),
   .doc = "lines of one batch in flight at once (queued or running); 0: as many as the "
          "fleet has usable slots for its model, shared between the keys running batches of "
          "that model by their weights, and a key's share between its batches"},
  {SET_BOOL("batch", "sync", 1, GC, batch_sync),
   .doc = "output lines reach the disk (`fdatasync`) before the database counts them, so a "
          "power cut loses no counted line; off, only a crash of the process is survived"},
  {SET_SIZE("batch", "max_line_bytes", 1024, POW2(32), 1u << 20, GC, batch_max_line_bytes),
   .dflt_doc = "1048576 (1 MiB)",
   .doc = "an input line's bytes at most (and never more than `limits.max_body_bytes`): a "
          "longer line fails its batch at validation as soon as it is seen (`line_too_long`); "
          "a validation holds at most this plus 2 MiB of the file in memory"},
  {SET_INT("batch", "validations", 1, 64, 2, GC, batch_validations),
   .doc = "batches validated at once on this gateway; the others stay `validating` and wait "
          "their turn (the admin API shows them queued), keys without a validation first"},
  {SET_SIZE("batch", "max_running", 1, 100000, 256, GC, batch_max_running),
   .doc = "batches that run lines (or are validated) at once; the others, however many, wait "
          "their turn with the status OpenAI shows (`validating`, `in_progress`), keys taking "
          "turns (one holding more than its share of a full window gives a slot back), and "
          "are cancelled and expire as usual ([batch](batch.md#many-batches))"},
  {SET_NUM("batch", "output_expires_s", 0, 86400.0 * 3650, 2592000, GC, batch_output_expires_s),
   .dflt_doc = "2592000 (30 days)",
   .doc = "a batch's output and error files expire (are deleted) this long after the batch "
          "ends, as OpenAI's do; 0: never"},
  {SET_NUM("batch", "file_expires_s", 0, 86400.0 * 3650, 2592000, GC, batch_file_expires_s),
   .dflt_doc = "2592000 (30 days)",
   .doc = "an upload without `expires_after` expires this long after it was made (OpenAI's "
          "default for `purpose: \"batch\"`); 0: never. An input file is kept until its "
          "batches have ended"},
  {SET_SUBSECTION("batch", "quota"),
   .doc = "what each API key may hold at once, unless its `api_keys` entry says otherwise "
          "([security](security.md#callers-against-each-other)); 0: no limit"},
  {SET_INT64("batch.quota", "files", 0, 1e9, 10000, GC, batch_quota.files),
   .doc = "files a key keeps stored (uploads and batch output files); one more upload gets 403 "
          "`file_quota_exceeded`"},
  {SET_INT64("batch.quota", "file_bytes", 0, POW2(40), POW2(31), GC, batch_quota.file_bytes),
   .dflt_doc = "2147483648 (2 GiB)",
   .doc = "bytes of a key's stored files and uploads arriving; an upload that would pass it is "
          "refused from its `Content-Length`, or stopped as it passes, with 403 "
          "`file_quota_exceeded`, and nothing of it is kept"},
  {SET_NUM("batch.quota", "uploads_per_min", 0, 1e6, 60, GC, batch_quota.uploads_per_min),
   .doc = "uploads a key may begin per minute (a bucket that holds this many); more get 429 "
          "`rate_limit_exceeded` with `Retry-After`. Uploads and batch creations also count "
          "against the key's `rpm`"},
  {SET_INT64("batch.quota", "batches", 0, 1e9, 100, GC, batch_quota.batches),
   .doc = "a key's batches that have not ended; one more gets 429 `batch_quota_exceeded`"},
  {SET_INT64("batch.quota", "validating", 0, 1e9, 4, GC, batch_quota.validating),
   .doc = "a key's batches being validated (or waiting to be); one more gets 429 "
          "`batch_quota_exceeded`"},
  {SET_INT64("batch.quota", "lines", 0, 1e12, 500000, GC, batch_quota.lines),
   .doc = "lines of a key's batches not answered yet; a batch that would pass it fails at "
          "validation (`line_quota_exceeded`), and a key at it gets 429 "
          "`line_quota_exceeded` for new batches"},

  {SET_NUM("capacity", "interactive_wait_s", 0.01, 86400, 2, GC, targets.interactive_wait_s),
   .doc = "target: an interactive request waits at most this long for a phone, `confidence` "
          "of the time (the advice's Erlang-C arithmetic; [capacity](capacity.md))"},
  {SET_NUM("capacity", "review_within_s", 1, 86400 * 7, 600, GC, targets.review_within_s),
   .derive = dflt_review_within, .dflt_doc = "`queue.timeout_s`",
   .doc = "target: a review (an interactive prompt of `review_prompt_tokens` or more) is "
          "answered within this long, wait and work, `confidence` of the time"},
  {SET_CUSTOM("capacity", "batch_by", cfg_batch_by), .type_doc = "string",
   .dflt_doc = "— (`batch.completion_window_s` after each batch's creation)",
   .range_doc = "`HH:MM`",
   .doc = "target: the batch work waiting now is done by this time of day, in the gateway's "
          "time zone (the next such time)"},
  {SET_INT64("capacity", "review_prompt_tokens", 1, 1e9, 2048, GC, review_prompt_tokens),
   .doc = "an interactive request whose prompt is estimated at this many tokens or more is a "
          "review (its own target and its own demand figures)"},
  {SET_NUM("capacity", "confidence", 0.5, 0.999, 0.95, GC, cap_confidence),
   .doc = "the share of the time the targets are to be met: the wait's quantile, and the "
          "quantile of the phones lost to churn while replacements start"},
  {SET_NUM("capacity", "window_s", 10, 86400, 300, GC, cap_window_s),
   .doc = "the demand *now* is the arrival rate over this last window, or since the load's "
          "last step up within it when that is busier (a growing load); the checks newcomers "
          "owe are spread over it (the next peak: the busiest hour of the last week)"},
  {SET_NUM("capacity", "startup_s", 0, 86400, 600, GC, cap_startup_s),
   .doc = "how long a rented phone takes from its first heartbeat until it is first ready to "
          "take work, until the fleet's own phones have shown it"},
  {SET_NUM("capacity", "idle_release_s", 60, 86400 * 7, 3600, GC, cap_idle_release_s),
   .doc = "a phone sent no request for this long, while the advice needs fewer phones than "
          "the fleet has, is listed as one to release (with the saving)"},
  {SET_CUSTOM("capacity", "prices", cfg_prices), .type_doc = "list of objects", .dflt_doc = "—",
   .range_doc = "at most 64",
   .doc = "phone classes the operator can rent: `name`, `cost_per_day` (above 0 with a hook), per-slot "
          "`prefill_tps` and `decode_tps`, `slots` (1), `models` (any); without it the advice "
          "prices the fleet's own classes"},
  {SET_SUBSECTION("capacity", "hook"),
   .doc = "a program run (or URL called) with the advice when it changes ([below](#capacityhook))"},
  {SET_CUSTOM("capacity.hook", "command", cfg_hook_command), .type_doc = "list of strings",
   .dflt_doc = "—", .range_doc = "a program and its arguments",
   .doc = "run with these arguments (no shell), the advice's JSON on its standard input"},
  {SET_CUSTOM("capacity.hook", "url", cfg_hook_url), .type_doc = "string", .dflt_doc = "—",
   .range_doc = "`http://` or `https://`",
   .doc = "POSTed the advice's JSON instead (not both)"},
  {SET_NUM("capacity.hook", "threshold", 1, 1e6, 1, GC, hook_threshold),
   .doc = "the phones advised for some model (or those it would release) must differ by this "
          "many from what the hook was last given before it runs again"},
  {SET_NUM("capacity.hook", "min_interval_s", 1, 86400, 600, GC, hook_min_interval_s),
   .doc = "the hook runs at most once in this long"},
  {SET_NUM("capacity.hook", "max_cost_per_day", 0, 1e9, 0, GC, hook_max_cost_per_day),
   .dflt_doc = "**required** with a hook",
   .doc = "the spending cap: the phones the hook is asked to add over any 24 hours cost at most "
          "this much per day together; an ask is cut to fit, and none is made once it is spent. "
          "The asks are kept in `data_dir` (required with a hook), so a restart does not lift it"},
  {SET_NUM("capacity.hook", "timeout_s", 1, 3600, 60, GC, hook_timeout_s),
   .doc = "a hook still running after this long is killed (and counted failed)"},

  {SET_CUSTOM("api_keys", "name", cfg_key_name), .type_doc = "string",
   .dflt_doc = "**required**", .range_doc = "unique",
   .doc = "the caller, in logs and metrics"},
  {SET_CUSTOM("api_keys", "key_sha256", cfg_key_sha256), .type_doc = "string",
   .dflt_doc = "**required**", .range_doc = "64 hex digits", .doc = "SHA-256 of the key"},
  {SET_NUM("api_keys", "rpm", 0, 1e9, 0, KC, rpm), .dflt_doc = "0 (none)",
   .doc = "requests per minute (a token bucket that holds `rpm` and refills `rpm`/60 per "
          "second)"},
  {SET_NUM("api_keys", "tpm", 0, 1e12, 0, KC, tpm), .dflt_doc = "0 (none)",
   .doc = "tokens per minute, counted from each answer's usage (prompt + completion) when it "
          "ends; a key in debt is refused until it refills"},
  {SET_INT("api_keys", "concurrency", 0, 1000000, 0, KC, concurrency), .dflt_doc = "0 (none)",
   .doc = "requests queued or running at once"},
  {SET_CUSTOM("api_keys", "priority", cfg_key_priority), .type_doc = "string",
   .dflt_doc = "`interactive`", .range_doc = "`interactive`, `batch`",
   .doc = "the class of the key's requests; `x-fleetgate-priority` may lower it, never raise "
          "it (403 `priority_not_allowed`)"},
  {SET_NUM("api_keys", "weight", 0.001, 1e6, 1, KC, weight),
   .doc = "share of the fleet within its class, relative to other keys (weighted fair "
          "queueing: callers with waiting work are served in proportion to their weights, "
          "whatever their burst sizes)"},
  {SET_CUSTOM("api_keys", "models", cfg_key_models), .type_doc = "list of strings",
   .dflt_doc = "all", .range_doc = "—",
   .doc = "the models the key may use (403 `model_not_allowed` otherwise)"},
  {SET_INT64("api_keys", "files", 0, 1e9, -1, KC, quota.files),
   .dflt_doc = "`batch.quota`'s", .doc = "the key's own `batch.quota.files`"},
  {SET_INT64("api_keys", "file_bytes", 0, POW2(40), -1, KC, quota.file_bytes),
   .dflt_doc = "`batch.quota`'s", .doc = "the key's own `batch.quota.file_bytes`"},
  {SET_NUM("api_keys", "uploads_per_min", 0, 1e6, -1, KC, quota.uploads_per_min),
   .dflt_doc = "`batch.quota`'s", .doc = "the key's own `batch.quota.uploads_per_min`"},
  {SET_INT64("api_keys", "batches", 0, 1e9, -1, KC, quota.batches),
   .dflt_doc = "`batch.quota`'s", .doc = "the key's own `batch.quota.batches`"},
  {SET_INT64("api_keys", "validating", 0, 1e9, -1, KC, quota.validating),
   .dflt_doc = "`batch.quota`'s", .doc = "the key's own `batch.quota.validating`"},
  {SET_INT64("api_keys", "lines", 0, 1e12, -1, KC, quota.lines),
   .dflt_doc = "`batch.quota`'s", .doc = "the key's own `batch.quota.lines`"},

  {SET_CUSTOM("api_keys", "cache_scope", cfg_key_cache_scope), .type_doc = "string",
   .dflt_doc = "the key's `name`", .range_doc = "non-empty",
   .doc = "keys naming the same scope share the phones' prompt caches; a key never reuses, "
          "nor can time or read, a prefix another scope left on a phone ([security]"
          "(security.md#tenants-prompts))"},

  {SET_CUSTOM("models", "name", cfg_model_name), .type_doc = "string",
   .dflt_doc = "**required**", .range_doc = "unique, non-empty",
   .doc = "the model, as requests name it (matched exactly)"},
  {SET_SUBSECTION("models", "targets"),
   .doc = "this model's own capacity targets ([capacity](capacity.md)); what it leaves out is "
          "the `capacity` section's"},
  {SET_NUM("models.targets", "interactive_wait_s", 0.01, 86400, -1, MC, targets.interactive_wait_s),
   .dflt_doc = "`capacity.interactive_wait_s`", .doc = "as `capacity.interactive_wait_s`, for this model"},
  {SET_NUM("models.targets", "review_within_s", 1, 86400 * 7, -1, MC, targets.review_within_s),
   .dflt_doc = "`capacity.review_within_s`", .doc = "as `capacity.review_within_s`, for this model"},
  {SET_CUSTOM("models.targets", "batch_by", cfg_model_batch_by), .type_doc = "string",
   .dflt_doc = "`capacity.batch_by`", .range_doc = "`HH:MM`",
   .doc = "as `capacity.batch_by`, for this model"},
  {SET_CUSTOM("models", "url", cfg_model_url), .type_doc = "string", .dflt_doc = "—",
   .range_doc = "`http(s)://…`, with `sha256`",
   .doc = "where a phone downloads the model's GGUF file when placement puts it there and it "
          "does not hold it (`fleetgate-agent fetch`: resumed, digest checked)"},
  {SET_CUSTOM("models", "sha256", cfg_model_sha256), .type_doc = "string", .dflt_doc = "—",
   .range_doc = "64 hex digits, with `url`",
   .doc = "the file's SHA-256: a download that differs is thrown away and the phone stays on "
          "its model; a phone holding a file of this digest needs no download"},
  {SET_INT64("models", "size_bytes", 0, POW2(44), 0, MC, size_bytes), .dflt_doc = "0 (unknown)",
   .doc = "the file's size: what a switch to it costs (download and load time), the memory "
          "it needs when `mem_mb` is left out, and the storage: a phone whose models folder has "
          "less free than this and 256 MiB (its heartbeats' `storage_free_mb`) never gets it "
          "unless it holds the file"},
  {SET_NUM("models", "mem_mb", 0, 1e8, 0, MC, mem_mb), .dflt_doc = "from `size_bytes`",
   .doc = "memory (MiB) a phone needs to run it; left out, the file's size + 20 % + 512 MiB. A "
          "phone whose MemTotal less max(2 GiB, a quarter) is smaller never gets it"},
  {SET_INT64("models", "n_ctx", 0, POW2(30), 0, MC, n_ctx), .dflt_doc = "0 (the engine's)",
   .doc = "context per slot the engine runs it with (llama-server `--ctx-size`, × slots)"},
  {SET_CUSTOM("models", "engine_args", cfg_model_engine_args), .type_doc = "list of strings",
   .dflt_doc = "—", .range_doc = "at most 32",
   .doc = "more arguments for the engine with this model (after the agent's own)"},
  {SET_CUSTOM("models", "labels", cfg_model_labels), .type_doc = "object", .dflt_doc = "—",
   .range_doc = "string values",
   .doc = "only phones whose `labels` (their replica entry's; for a phone that joins by "
          "heartbeat, those its agent says: `fleetgate-agent --label`) have every one of these "
          "pairs may run it"},
  {SET_NUM("models", "min_ram_mb", 0, 1e8, 0, MC, min_ram_mb), .dflt_doc = "0 (none)",
   .doc = "only phones reporting at least this MemTotal (MiB) may run it"},
  {SET_BOOL("models", "exclude", 0, MC, exclude),
   .doc = "`true`: placement puts no further phone on it (phones on it stay; the admin API "
          "can change it at run time)"},

  {SET_BOOL("placement", "enabled", 0, GC, place_enabled),
   .doc = "`true`: the gateway decides which model each phone registered by heartbeat runs, "
          "and tells its agent in the heartbeat's answer ([placement](placement.md))"},
  {SET_NUM("placement", "interval_s", 0.1, 3600, 5, GC, place_interval_s),
   .doc = "how often placement weighs demand against the phones"},
  {SET_NUM("placement", "horizon_s", 1, 86400, 300, GC, place_horizon_s),
   .doc = "demand is the queue plus the arrivals expected over this long; a switch must pay "
          "for its download and load time within it"},
  {SET_NUM("placement", "min_stay_s", 0, 86400, 120, GC, place_min_stay_s),
   .doc = "a phone stays on a model at least this long after it switched (or joined)"},
  {SET_NUM("placement", "hysteresis", 0, 0.95, 0.25, GC, place_hysteresis),
   .doc = "a move is made only when the model giving the phone stays, after it, less loaded "
          "than the one taking it was by the factor 1 + this (so the move back never looks "
          "good under the same demand)"},
  {SET_NUM("placement", "max_switching", 0, 1, 0.25, GC, place_max_switching),
   .doc = "share of the phones that may be switching at once (at least one)"},
  {SET_NUM("placement", "failure_backoff_s", 0, 86400 * 7, 600, GC, place_backoff_s),
   .doc = "after a phone failed to switch to a model (download, digest, load), it is not sent "
          "to that model again for this long"},
  {SET_NUM("placement", "idle_s", 0, 86400 * 7, 600, GC, place_idle_s),
   .doc = "a model asked for within this long keeps at least one phone"},
  {SET_NUM("placement", "load_mb_s", 0.01, 1e6, 200, GC, place_load_mb_s),
   .doc = "MiB a phone loads per second: a switch's load time, from the model's `size_bytes`"},
  {SET_NUM("placement", "fetch_mb_s", 0.01, 1e6, 20, GC, place_fetch_mb_s),
   .doc = "MiB a phone downloads per second: a switch's download time when it does not hold "
          "the model"},
  {SET_CUSTOM("placement", "pins", cfg_place_pins), .type_doc = "object", .dflt_doc = "—",
   .range_doc = "phone id → a model of `models`",
   .doc = "phones placement keeps on a model (the admin API can pin more at run time)"},

  {SET_CUSTOM("replicas", "id", cfg_replica_id), .type_doc = "string",
   .dflt_doc = "**required**", .range_doc = "unique",
   .doc = "the name in logs and in the `x-fleetgate-replica` header"},
  {SET_CUSTOM("replicas", "url", cfg_replica_url), .type_doc = "string",
   .dflt_doc = "**required**", .range_doc = "`https://HOST[:PORT][/PATH]`",
   .doc = "base URL; the gateway appends `/v1/chat/completions` or `/v1/completions`. "
          "Trailing `/` are removed. No query, fragment, userinfo, `%` or dot segments; "
          "`http://` only with `upstream.allow_http` ([URL policy](security.md#url-policy))"},
  {SET_CUSTOM("replicas", "models", cfg_replica_models), .type_doc = "list of strings",
   .dflt_doc = "**required**", .range_doc = "non-empty, no empty names",
   .doc = "model names this replica serves; requests are matched exactly"},
  {SET_INT("replicas", "slots", 1, 64, 0, RC, slots), .dflt_doc = "learned",
   .doc = "requests the replica runs at once; the gateway never sends more. Left out, it is "
          "learned: a bare llama-server's `/props` `total_slots` (read after its first good "
          "`/health` probe and again whenever it comes back from `loading` or `down`), or the "
          "agent's status and heartbeat `slots`; 1 until then"},
  {SET_CUSTOM("replicas", "token_env", cfg_replica_token), .type_doc = "string",
   .dflt_doc = "—", .range_doc = "—",
   .doc = "name of an environment variable holding the replica's token, sent as "
          "`Authorization: Bearer …`. Must be set and non-empty when the file is loaded (also "
          "for `--check-config`)"},
  {SET_CUSTOM("replicas", "token", NULL), .type_doc = "string", .dflt_doc = "—",
   .range_doc = "—",
   .doc = "the token itself (for tests); `token_env` wins when both are given"},
  {SET_NUM("replicas", "prefill_tps", 0.001, 1e9, -1, RC, prefill_tps),
   .dflt_doc = "the fleet's, else 50",
   .doc = "starting value for the learned prompt-reading rate (tokens/s, per slot). Left out, "
          "the median of the measured phones of its model, else 50 "
          "([routing](routing.md#priors-drift-and-exploration))"},
  {SET_NUM("replicas", "decode_tps", 0.001, 1e9, -1, RC, decode_tps),
   .dflt_doc = "the fleet's, else 5",
   .doc = "starting value for the learned generation rate (tokens/s, per slot). Left out, "
          "the median of the measured phones of its model, else 5"},
  {SET_INT64("replicas", "n_ctx", 0, POW2(40), 0, RC, n_ctx), .dflt_doc = "learned",
   .doc = "context size per slot in tokens. Left out (or 0), it is learned like `slots` "
          "(llama-server's `/props` `default_generation_settings.n_ctx`, the agent's `n_ctx`); "
          "while unknown, prompt + cap is never checked against it"},
  {SET_NUM("replicas", "cost_per_day", 0, 1e9, -1, RC, cost_per_day),
   .dflt_doc = "the phone's, else 0",
   .doc = "what the replica costs per day, in `costs.currency`, whatever its state: the "
          "cost accounting's input ([operations](operations.md#costs)); not used for "
          "routing. Left out, the `cost_per_day` its heartbeats say (capped by "
          "`costs.max_claimed_per_day`), else 0"},
  {SET_CUSTOM("replicas", "labels", cfg_replica_labels), .type_doc = "object", .dflt_doc = "—",
   .range_doc = "—", .doc = "free-form pairs: placement's `models[].labels` and capacity's "
                            "`class` read them; a heartbeat's `labels` do not replace them"},
  {SET_BOOL("replicas", "drain", 0, RC, drain),
   .doc = "`true`: the replica takes no new requests and finishes what runs (state "
          "`draining`)"},
  {SET_BOOL("replicas", "heartbeats", 0, RC, heartbeats),
   .doc = "the phone may send heartbeats for this id (it enrols its key like any phone); "
          "without it (or `key`) heartbeats naming the id get 403 `id_reserved`"},
  {SET_CUSTOM("replicas", "key", cfg_replica_key), .type_doc = "string", .dflt_doc = "—",
   .range_doc = "base64 Ed25519 public key",
   .doc = "the phone's public key (`fleetgate-agent --print-key`), pinned by the file: only "
          "heartbeats signed by it are taken for this id"},
  {SET_BOOL("replicas", "agent", 0, RC, agent),
   .doc = "the replica runs `fleetgate-agent`: probe its `/agent/v1/status`, whose progress "
          "reports let the gateway notice a phone that turned slow and move requests off it "
          "([routing](routing.md))"},
};

#undef GC
#undef KC
#undef RC
#undef MC

#define N_SETTINGS (sizeof(settings) / sizeof(settings[0]))

static const cfg_setting *cfg_find(const char *section, const char *key) {
  for (size_t i = 0; i < N_SETTINGS; i++)
    if (strcmp(settings[i].section, section) == 0 && strcmp(settings[i].key, key) == 0)
      return &settings[i];
  return NULL;
}

/* Read the keys of `section` from obj (NULL: the section is absent) into base, in table
 * order: scalars take their default when absent; custom keys are read only when obj is
 * there; unknown keys are reported first. */
static void cfg_apply(cfg_ctx *x, const cJSON *obj, const char *section, const char *path,
                      void *base) {
  for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next) {
    if (it->string && cfg_find(section, it->string)) continue;
    char p[300];
    pr_json_path_key(p, sizeof(p), path, it->string ? it->string : "");
    cfg_err_at(x, p, 1, "unknown key");
  }
  for (size_t i = 0; i < N_SETTINGS; i++) {
    const cfg_setting *s = &settings[i];
    if (strcmp(s->section, section) != 0) continue;
    void *field = (char *)base + s->off;
    pr_json_err e;
    double d = s->derive ? s->derive(base) : s->dflt;
    int64_t v = (int64_t)s->dflt;
    int b = s->dflt != 0;
    const char *str = s->dflt_str;
    switch (s->type) {
      case CFG_SECTION: {
        const cJSON *sub = NULL;
        char sp[300];
        pr_json_path_key(sp, sizeof(sp), path, s->key);
        if (obj) cfg_check(x, pr_json_get_obj(obj, s->key, 0, &sub, path, &e), &e);
        /* a section inside a section is named by both: "scheduler.device" */
        char sn[64];
        snprintf(sn, sizeof(sn), "%s%s%s", section, *section ? "." : "", s->key);
        cfg_apply(x, sub, sn, sp, base);
        break;
      }
      case CFG_CUSTOM:
        if (obj && s->parse) s->parse(x, obj, path, base, s);
        break;
      case CFG_NUM:
        if (obj) cfg_check(x, pr_json_get_double(obj, s->key, 0, s->min, s->max, &d, path, &e), &e);
        *(double *)field = d;
        break;
      case CFG_INT:
      case CFG_INT64:
      case CFG_SIZE:
        if (obj)
          cfg_check(x, pr_json_get_int(obj, s->key, 0, (int64_t)s->min, (int64_t)s->max, &v, path, &e), &e);
        if (s->type == CFG_INT) *(int *)field = (int)v;
        else if (s->type == CFG_INT64) *(int64_t *)field = v;
        else *(size_t *)field = (size_t)v;
        break;
      case CFG_BOOL:
        if (obj) cfg_check(x, pr_json_get_bool(obj, s->key, 0, &b, path, &e), &e);
        *(int *)field = b;
        break;
      case CFG_STR:
        if (obj) cfg_check(x, pr_json_get_str(obj, s->key, 0, &str, path, &e), &e);
        free(*(char **)field);
        *(char **)field = xstrdup(str);
        break;
    }
  }
}

/* ---- the reference ------------------------------------------------------------------- */

/* A bound or default as the reference writes it: 2^32, 1e9, 86400, 0.05. */
static void fmt_num(char *out, size_t n, double v) {
  if (v == floor(v) && fabs(v) < 1e15) {
    int64_t i = (int64_t)v;
    if (i >= (INT64_C(1) << 20) && (i & (i - 1)) == 0) {
      int e = 0;
      while ((INT64_C(1) << e) < i) e++;
      snprintf(out, n, "2^%d", e);
      return;
    }
    if (i >= 1000000) {
      int e = 0;
      int64_t p = 1;
      while (p < i) {
        p *= 10;
        e++;
      }
      if (p == i) {
        snprintf(out, n, "1e%d", e);
        return;
      }
    }
    snprintf(out, n, "%" PRId64, i);
    return;
  }
  snprintf(out, n, "%g", v);
}

static int cfg_setting_row(pr_buf *out, const cfg_setting *s) {
  static const char *const types[] = {
    [CFG_NUM] = "number", [CFG_INT] = "integer", [CFG_INT64] = "integer", [CFG_SIZE] = "integer",
    [CFG_BOOL] = "boolean", [CFG_STR] = "string", [CFG_SECTION] = "object", [CFG_CUSTOM] = "—",
  };
  char dflt[64] = "—", range[80] = "—", lo[32], hi[32];
  switch (s->type) {
    case CFG_NUM:
    case CFG_INT:
    case CFG_INT64:
    case CFG_SIZE:
      fmt_num(dflt, sizeof(dflt), s->dflt);
      fmt_num(lo, sizeof(lo), s->min);
      fmt_num(hi, sizeof(hi), s->max);
      snprintf(range, sizeof(range), "%s – %s", lo, hi);
      break;
    case CFG_BOOL:
      snprintf(dflt, sizeof(dflt), "`%s`", s->dflt != 0 ? "true" : "false");
      break;
    case CFG_STR:
      if (s->dflt_str) snprintf(dflt, sizeof(dflt), "`%s`", s->dflt_str);
      break;
    case CFG_SECTION:
    case CFG_CUSTOM:
      break;
  }
  return pr_buf_appendf(out, "| `%s` | %s | %s | %s | %s |\n", s->key,
                        s->type_doc ? s->type_doc : types[s->type],
                        s->dflt_doc ? s->dflt_doc : dflt, s->range_doc ? s->range_doc : range,
                        s->doc);
}

int gw_config_settings_markdown(pr_buf *out) {
  int rc = 0;
  for (size_t i = 0; i < N_SETTINGS && rc == 0; i++) {
    const char *sec = settings[i].section;
    int seen = 0;
    for (size_t j = 0; j < i && !seen; j++) seen = strcmp(settings[j].section, sec) == 0;
    if (seen) continue;
    if (*sec) rc = pr_buf_appendf(out, "%s### `%s`\n\n", i ? "\n" : "", sec);
    else rc = pr_buf_appendf(out, "%s### top level\n\n", i ? "\n" : "");
    if (rc == 0) rc = pr_buf_append_str(out, "| key | type | default | range | meaning |\n"
                                             "|---|---|---|---|---|\n");
    for (size_t j = i; j < N_SETTINGS && rc == 0; j++)
      if (strcmp(settings[j].section, sec) == 0) rc = cfg_setting_row(out, &settings[j]);
  }
  return rc;
}

/* ---- loading ---------------------------------------------------------------------------- */

static void cfg_replica_free(gw_replica_conf *r) {
  free(r->id);
  free(r->url);
  for (size_t i = 0; i < r->n_models; i++) free(r->models[i]);
  free(r->models);
  free(r->token);
  free(r->labels);
  free(r->key);
  free(r->file);
}

static void gw_config_free(gw_config *c) {
  if (!c) return;
  free(c->path);
  free(c->replicas_dir);
  free(c->fleet_secret);
  free(c->fleet_secret_env);
  free(c->fleet_replica_token);
  free(c->fleet_pins_file);
  free(c->verify_canaries_file);
  free(c->data_dir);
  free(c->redis_host);
  if (c->redis_password) OPENSSL_cleanse(c->redis_password, strlen(c->redis_password));
  free(c->redis_password);
  free(c->redis_username);
  if (c->redis_key) OPENSSL_cleanse(c->redis_key, strlen(c->redis_key));
  free(c->redis_key);
  free(c->redis_prefix);
  free(c->gateway_id);
  for (size_t i = 0; i < c->n_listen; i++) {
    free(c->listen[i].address);
    free(c->listen[i].tls_cert);
    free(c->listen[i].tls_key);
  }
  free(c->listen);
  free(c->ca_file);
  free(c->allow_addresses);
  free(c->log_level);
  free(c->admin_listen);
  free(c->admin_token);
  free(c->cost_currency);
  pr_idmap_clear(&c->replica_index);
  for (size_t i = 0; i < c->n_replicas; i++) cfg_replica_free(&c->replicas[i]);
  free(c->replicas);
  for (size_t i = 0; i < c->n_models; i++) {
    free(c->models[i]);
    if (c->model_confs) cfg_model_conf_free(&c->model_confs[i]);
  }
  free(c->models);
  free(c->model_targets);
  for (size_t i = 0; i < c->n_prices; i++) {
    free(c->prices[i].name);
    for (size_t m = 0; m < c->prices[i].n_models; m++) free(c->prices[i].models[m]);
    free(c->prices[i].models);
  }
  free(c->prices);
  for (size_t i = 0; i < c->n_hook_command; i++) free(c->hook_command[i]);
  free(c->hook_command);
  free(c->hook_url);
  free(c->model_confs);
  for (size_t i = 0; i < c->n_place_pins; i++) {
    free(c->place_pin_ids[i]);
    free(c->place_pin_models[i]);
  }
  free(c->place_pin_ids);
  free(c->place_pin_models);
  for (size_t i = 0; i < c->n_keys; i++) {
    free(c->keys[i].name);
    for (size_t m = 0; m < c->keys[i].n_models; m++) free(c->keys[i].models[m]);
    free(c->keys[i].models);
    free(c->keys[i].cache_scope);
  }
  free(c->keys);
  free(c);
}

int gw_config_load(const char *path, gw_config **out, pr_buf *errors) {
  return gw_config_load_opts(path, 0, out, errors);
}

int gw_config_load_opts(const char *path, int flags, gw_config **out, pr_buf *errors) {
  *out = NULL;
  pr_buf text;
  pr_buf_init(&text, PR_CAP_CONFIG_FILE);
  int rc = cfg_read_file(path, &text, errors);
  if (rc) {
    pr_buf_free(&text);
    return rc;
  }
  cfg_ctx x = {path, pr_buf_cstr(&text), text.len, errors, 0, NULL, !!(flags & GW_CONFIG_NO_FILES)};
  pr_json_err je;
  cJSON *root = pr_json_parse(x.text, x.len, 64, &je);
  if (!root) {
    pr_buf_text(errors, "%s:%d:%d: %s\n", path, je.line, je.col, je.msg);
    pr_buf_free(&text);
    return PR_EPARSE;
  }
  gw_config *c = calloc(1, sizeof(*c));
  c->path = strdup(path);
  x.conf = c;
  c->targets.batch_by_min = -1;
  if (cJSON_IsObject(root)) {
    cfg_apply(&x, root, "", "", c);
    cfg_capacity_check(&x, c);
  } else cfg_err_at(&x, "", 0, "the configuration must be a JSON object");
  cJSON_Delete(root);
  pr_buf_free(&text);
  if (x.n_errors) {
    gw_config_free(c);
    return PR_EPARSE;
  }
  /* a key's quotas it does not give are batch.quota's */
  for (size_t i = 0; i < c->n_keys; i++) {
    gw_bquota *q = &c->keys[i].quota;
    const gw_bquota *d = &c->batch_quota;
    if (q->files < 0) q->files = d->files;
    if (q->file_bytes < 0) q->file_bytes = d->file_bytes;
    if (q->uploads_per_min < 0) q->uploads_per_min = d->uploads_per_min;
    if (q->batches < 0) q->batches = d->batches;
    if (q->validating < 0) q->validating = d->validating;
    if (q->lines < 0) q->lines = d->lines;
  }
  c->refs = 1;
  *out = c;
  return 0;
}

gw_config *gw_config_ref(gw_config *c) {
  c->refs++;
  return c;
}

void gw_config_unref(gw_config *c) {
  if (c && --c->refs <= 0) gw_config_free(c);
}

gw_targets gw_config_targets(const gw_config *c, const char *model) {
  gw_targets t = c->targets;
  for (size_t i = 0; model && c->model_targets && i < c->n_models; i++) {
    if (strcmp(c->models[i], model) != 0) continue;
    const gw_targets *m = &c->model_targets[i];
    if (m->interactive_wait_s >= 0) t.interactive_wait_s = m->interactive_wait_s;
    if (m->review_within_s >= 0) t.review_within_s = m->review_within_s;
    if (m->batch_by_min >= -1) t.batch_by_min = m->batch_by_min;
  }
  return t;
}

const gw_replica_conf *gw_config_replica(const gw_config *c, const char *id) {
  uintptr_t i = (uintptr_t)pr_idmap_get_str(&c->replica_index, id);
  return i ? &c->replicas[i - 1] : NULL;
}
