/* Loading and validating the gateway's JSON configuration. cJSON parses; the typed
 * getters of proto/json.h check fields and name their path; a small locator then turns
 * that path back into a line and column of the file, so every message reads
 * "file:line:col: field: problem". */
#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "addr.h"
#include "err.h"
#include "json.h"
#include "log.h"
#include "tls.h"

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
    pr_buf_appendf(x->errors, "%s:%d:%d: %s: %s\n", x->file, line, col, path, msg);
  else
    pr_buf_appendf(x->errors, "%s:%d:%d: %s\n", x->file, line, col, msg);
  x->n_errors++;
}

/* Report a getter's failure; returns 1 when the getter succeeded or the key was absent. */
static int cfg_check(cfg_ctx *x, int rc, const pr_json_err *e) {
  if (rc >= 0) return 1;
  cfg_err_at(x, e->path, 0, "%s", e->msg);
  return 0;
}

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

/* ---- sections ------------------------------------------------------------------------- */

static int valid_url(const char *u) {
  if (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0) return 0;
  CURLU *h = curl_url();
  if (!h) return 0;
  int ok = curl_url_set(h, CURLUPART_URL, u, 0) == CURLUE_OK;
  char *host = NULL;
  if (ok && (curl_url_get(h, CURLUPART_HOST, &host, 0) != CURLUE_OK || !host || !*host)) ok = 0;
  curl_free(host);
  curl_url_cleanup(h);
  return ok;
}

static void cfg_replica(cfg_ctx *x, const cJSON *o, const char *path, gw_replica_conf *r) {
  static const char *const keys[] = {"id", "url", "models", "slots", "token_env", "token",
                                     "cost_per_day", "prefill_tps", "decode_tps", "n_ctx",
                                     "labels", "drain", "agent", NULL};
  pr_json_err e;
  const char *s = NULL;
  if (!cJSON_IsObject(o)) {
    cfg_err_at(x, path, 0, "expected an object");
    return;
  }
  cfg_keys(x, o, keys, path);
  if (cfg_check(x, pr_json_get_str(o, "id", 1, &s, path, &e), &e) && s) {
    if (!*s) cfg_err_at(x, path, 0, "a replica id must not be empty");
    r->id = xstrdup(s);
    char ip[300];
    pr_json_path_key(ip, sizeof(ip), path, "id");
    pr_json_position(x->text, x->len, loc_find(x->text, x->len, ip, 0), &r->line, &r->col);
  }
  s = NULL;
  if (cfg_check(x, pr_json_get_str(o, "url", 1, &s, path, &e), &e) && s) {
    char p[300];
    pr_json_path_key(p, sizeof(p), path, "url");
    if (!valid_url(s)) cfg_err_at(x, p, 0, "expected an http:// or https:// URL with a host");
    size_t l = strlen(s);
    while (l > 0 && s[l - 1] == '/') l--;
    r->url = strndup(s, l);
  }
  const cJSON *models = NULL;
  if (cfg_check(x, pr_json_get_arr(o, "models", 1, &models, path, &e), &e) && models) {
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
  int64_t v = 0;
  if (cfg_check(x, pr_json_get_int(o, "slots", 0, 1, 64, &v, path, &e), &e)) r->slots = (int)v;
  const char *tenv = NULL, *tok = NULL;
  cfg_check(x, pr_json_get_str(o, "token_env", 0, &tenv, path, &e), &e);
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
  double d = 0;
  if (cfg_check(x, pr_json_get_double(o, "cost_per_day", 0, 0, 1e9, &d, path, &e), &e))
    r->cost_per_day = d;
  d = 50;
  if (cfg_check(x, pr_json_get_double(o, "prefill_tps", 0, 0.001, 1e9, &d, path, &e), &e))
    r->prefill_tps = d;
  d = 5;
  if (cfg_check(x, pr_json_get_double(o, "decode_tps", 0, 0.001, 1e9, &d, path, &e), &e))
    r->decode_tps = d;
  v = 0;
  if (cfg_check(x, pr_json_get_int(o, "n_ctx", 0, 0, INT64_C(1) << 40, &v, path, &e), &e))
    r->n_ctx = v;
  int b = 0;
  if (cfg_check(x, pr_json_get_bool(o, "drain", 0, &b, path, &e), &e)) r->drain = b;
  b = 0;
  if (cfg_check(x, pr_json_get_bool(o, "agent", 0, &b, path, &e), &e)) r->agent = b;
  const cJSON *labels = NULL;
  if (cfg_check(x, pr_json_get_obj(o, "labels", 0, &labels, path, &e), &e) && labels)
    r->labels = pr_json_print(labels);
  r->file = xstrdup(x->file);
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

static double cfg_num(cfg_ctx *x, const cJSON *o, const char *key, double min, double max,
                      double dflt, const char *path);
static int64_t cfg_int(cfg_ctx *x, const cJSON *o, const char *key, int64_t min, int64_t max,
                       int64_t dflt, const char *path);

/* redis://[:PASSWORD@]HOST[:PORT][/DB], parsed with libcurl's URL parser. */
static void cfg_redis_url(cfg_ctx *x, const char *url, gw_config *c) {
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

/* api_keys: name, key_sha256, limits, priority class, weight, allowed models. */
static void cfg_keys_section(cfg_ctx *x, const cJSON *arr, gw_config *c) {
  int n = cJSON_GetArraySize(arr);
  c->keys = calloc((size_t)n + 1, sizeof(*c->keys));
  if (!c->keys) return;
  int i = 0;
  for (const cJSON *o = arr->child; o; o = o->next, i++) {
    static const char *const keys[] = {"name", "key_sha256", "rpm", "tpm", "concurrency",
                                       "priority", "weight", "models", NULL};
    char p[64];
    pr_json_path_index(p, sizeof(p), "api_keys", i);
    if (!cJSON_IsObject(o)) {
      cfg_err_at(x, p, 0, "expected an object");
      continue;
    }
    cfg_keys(x, o, keys, p);
    gw_key_conf *k = &c->keys[c->n_keys++];
    pr_json_err e;
    const char *name = NULL, *hex = NULL, *prio = NULL;
    if (cfg_check(x, pr_json_get_str(o, "name", 1, &name, p, &e), &e) && name) {
      k->name = strdup(name);
      for (size_t j = 0; j + 1 < c->n_keys; j++)
        if (c->keys[j].name && strcmp(c->keys[j].name, name) == 0) {
          char np[80];
          pr_json_path_key(np, sizeof(np), p, "name");
          cfg_err_at(x, np, 0, "duplicate key name \"%s\"", name);
        }
    }
    if (cfg_check(x, pr_json_get_str(o, "key_sha256", 1, &hex, p, &e), &e) && hex) {
      char hp[80];
      pr_json_path_key(hp, sizeof(hp), p, "key_sha256");
      int ok = strlen(hex) == 64;
      for (int b = 0; ok && b < 32; b++) {
        int hi = hexval(hex[2 * b]), lo = hexval(hex[2 * b + 1]);
        if (hi < 0 || lo < 0) ok = 0;
        else k->sha256[b] = (unsigned char)(hi << 4 | lo);
      }
      if (!ok)
        cfg_err_at(x, hp, 0, "expected 64 hex digits (the line `fleetgate --hash-key` prints)");
    }
    k->rpm = cfg_num(x, o, "rpm", 0, 1e9, 0, p);
    k->tpm = cfg_num(x, o, "tpm", 0, 1e12, 0, p);
    k->concurrency = (int)cfg_int(x, o, "concurrency", 0, 1000000, 0, p);
    k->weight = cfg_num(x, o, "weight", 0.001, 1e6, 1, p);
    if (cfg_check(x, pr_json_get_str(o, "priority", 0, &prio, p, &e), &e) && prio) {
      if (strcmp(prio, "interactive") == 0) k->priority = 0;
      else if (strcmp(prio, "batch") == 0) k->priority = 1;
      else {
        char pp[80];
        pr_json_path_key(pp, sizeof(pp), p, "priority");
        cfg_err_at(x, pp, 0, "expected \"interactive\" or \"batch\"");
      }
    }
    const cJSON *models = NULL;
    if (cfg_check(x, pr_json_get_arr(o, "models", 0, &models, p, &e), &e) && models) {
      k->models = calloc((size_t)cJSON_GetArraySize(models) + 1, sizeof(char *));
      for (const cJSON *m = models->child; m && k->models; m = m->next) {
        if (cJSON_IsString(m) && m->valuestring[0]) k->models[k->n_models++] = strdup(m->valuestring);
        else cfg_err_at(x, p, 0, "models: expected a list of model names");
      }
    }
  }
}

static void cfg_replica_free(gw_replica_conf *r) {
  free(r->id);
  free(r->url);
  for (size_t i = 0; i < r->n_models; i++) free(r->models[i]);
  free(r->models);
  free(r->token);
  free(r->labels);
  free(r->file);
}

static void gw_config_free(gw_config *c) {
  if (!c) return;
  free(c->path);
  free(c->replicas_dir);
  free(c->fleet_secret);
  free(c->fleet_secret_env);
  free(c->fleet_replica_token);
  free(c->redis_host);
  free(c->redis_password);
  free(c->redis_prefix);
  free(c->gateway_id);
  for (size_t i = 0; i < c->n_listen; i++) {
    free(c->listen[i].address);
    free(c->listen[i].tls_cert);
    free(c->listen[i].tls_key);
  }
  free(c->listen);
  free(c->ca_file);
  free(c->log_level);
  free(c->admin_listen);
  free(c->admin_token);
  for (size_t i = 0; i < c->n_replicas; i++) cfg_replica_free(&c->replicas[i]);
  free(c->replicas);
  for (size_t i = 0; i < c->n_keys; i++) {
    free(c->keys[i].name);
    for (size_t m = 0; m < c->keys[i].n_models; m++) free(c->keys[i].models[m]);
    free(c->keys[i].models);
  }
  free(c->keys);
  free(c);
}

static void cfg_defaults(gw_config *c) {
  c->max_body_bytes = 8u << 20;
  c->header_timeout_s = 10;
  c->idle_timeout_s = 60;
  c->send_timeout_s = 60;
  c->max_connections = 10000;
  c->queue_max = 1000;
  c->queue_timeout_s = 600;
  c->retries = 3;
  c->default_max_tokens = 1024;
  c->expected_output_tokens = 128;
  c->tls_verify = 1;
  c->connect_timeout_s = 10;
  c->timeout_margin = 3;
  c->timeout_min_s = 30;
  c->stream_idle_timeout_s = 60;
  c->refusal_window_s = 10;
  c->health_interval_s = 5;
  c->health_timeout_s = 3;
  c->health_down_interval_s = 15;
  c->rise = 2;
  c->fail_threshold = 2;
  c->heartbeat_timeout_s = 15;
  c->heartbeat_interval_s = 5;
  c->heartbeat_max_skew_s = 30;
  c->cooldown_s = 5;
  c->cooldown_max_s = 120;
  c->shutdown_timeout_s = 30;
}

static double cfg_num(cfg_ctx *x, const cJSON *o, const char *key, double min, double max,
                      double dflt, const char *path) {
  pr_json_err e;
  double d = dflt;
  if (o) cfg_check(x, pr_json_get_double(o, key, 0, min, max, &d, path, &e), &e);
  return d;
}

static int64_t cfg_int(cfg_ctx *x, const cJSON *o, const char *key, int64_t min, int64_t max,
                       int64_t dflt, const char *path) {
  pr_json_err e;
  int64_t v = dflt;
  if (o) cfg_check(x, pr_json_get_int(o, key, 0, min, max, &v, path, &e), &e);
  return v;
}

static const cJSON *cfg_section(cfg_ctx *x, const cJSON *root, const char *key,
                                const char *const *keys) {
  pr_json_err e;
  const cJSON *o = NULL;
  if (!cfg_check(x, pr_json_get_obj(root, key, 0, &o, "", &e), &e) || !o) return NULL;
  cfg_keys(x, o, keys, key);
  return o;
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

static void cfg_listen(cfg_ctx *x, const cJSON *root, gw_config *c) {
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(root, "listen");
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

/* "admin": {"listen", "token_env" | "token", "public_read"}; the token is required. */
static void cfg_admin(cfg_ctx *x, const cJSON *root, gw_config *c) {
  static const char *const keys[] = {"listen", "token_env", "token", "public_read", NULL};
  const cJSON *a = cfg_section(x, root, "admin", keys);
  if (!a) return;
  pr_json_err e;
  const char *addr = "127.0.0.1:9090", *tenv = NULL, *tok = NULL;
  cfg_check(x, pr_json_get_str(a, "listen", 0, &addr, "admin", &e), &e);
  cfg_listen_addr(x, "admin.listen", addr);
  c->admin_listen = strdup(addr);
  cfg_check(x, pr_json_get_str(a, "token_env", 0, &tenv, "admin", &e), &e);
  cfg_check(x, pr_json_get_str(a, "token", 0, &tok, "admin", &e), &e);
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
  int b = 0;
  if (cfg_check(x, pr_json_get_bool(a, "public_read", 0, &b, "admin", &e), &e)) c->admin_public_read = b;
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
    for (size_t j = 0; r->id && j + 1 < c->n_replicas; j++) {
      const gw_replica_conf *o = &c->replicas[j];
      if (o->id && strcmp(o->id, r->id) == 0) {
        char ip[80];
        pr_json_path_key(ip, sizeof(ip), p, "id");
        cfg_err_at(x, ip, 0, "duplicate replica id \"%s\" (also defined at %s:%d:%d)", r->id,
                   o->file ? o->file : "?", o->line, o->col);
        break;
      }
    }
  }
}

static int cfg_read_file(const char *path, pr_buf *text, pr_buf *errors) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    int e = errno;
    pr_buf_appendf(errors, "%s:0:0: cannot open: %s\n", path, strerror(e));
    return -e;
  }
  char chunk[8192];
  size_t n;
  int rc = 0;
  while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
    if ((rc = pr_buf_append(text, chunk, n))) break;
  fclose(fp);
  if (rc) pr_buf_appendf(errors, "%s:0:0: file too large\n", path);
  return rc;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.json in dir (relative to the main file's folder), in name order; each holds
 * one replica object or a list of them. Read synchronously: this runs at start and on
 * reload, never on a request's path. */
static void cfg_replicas_dir(cfg_ctx *main_x, const char *dir, gw_config *c) {
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
    pr_buf_init(&text, 4u << 20);
    if (cfg_read_file(path, &text, main_x->errors)) {
      main_x->n_errors++;
      pr_buf_free(&text);
      continue;
    }
    cfg_ctx x = {NULL, pr_buf_cstr(&text), text.len, main_x->errors, 0};
    /* replica confs keep their file name: it must outlive this loop */
    char *keep = strdup(path);
    x.file = keep;
    pr_json_err je;
    cJSON *root = pr_json_parse(x.text, x.len, 64, &je);
    if (!root) {
      pr_buf_appendf(x.errors, "%s:%d:%d: %s\n", path, je.line, je.col, je.msg);
      x.n_errors++;
    } else if (cJSON_IsArray(root) || cJSON_IsObject(root)) {
      cfg_replica_list(&x, root, "", c);
    } else {
      cfg_err_at(&x, "", 0, "a replica file holds one replica object or a list of them");
    }
    main_x->n_errors += x.n_errors;
    cJSON_Delete(root);
    pr_buf_free(&text);
    free(keep);
  }
  free(names);
}

int gw_config_load(const char *path, gw_config **out, pr_buf *errors) {
  *out = NULL;
  pr_buf text;
  pr_buf_init(&text, 16u << 20);
  int rc = cfg_read_file(path, &text, errors);
  if (rc) {
    pr_buf_free(&text);
    return rc;
  }
  cfg_ctx x = {path, pr_buf_cstr(&text), text.len, errors, 0};
  pr_json_err je;
  cJSON *root = pr_json_parse(x.text, x.len, 64, &je);
  if (!root) {
    pr_buf_appendf(errors, "%s:%d:%d: %s\n", path, je.line, je.col, je.msg);
    pr_buf_free(&text);
    return PR_EPARSE;
  }
  gw_config *c = calloc(1, sizeof(*c));
  c->path = strdup(path);
  cfg_defaults(c);
  if (!cJSON_IsObject(root)) {
    cfg_err_at(&x, "", 0, "the configuration must be a JSON object");
    goto done;
  }
  static const char *const top[] = {"listen", "limits", "queue", "scheduler", "upstream",
                                    "health", "fleet", "shutdown_timeout_s", "log_level",
                                    "replicas", "replicas_dir", "admin", "api_keys", "redis",
                                    NULL};
  cfg_keys(&x, root, top, "");
  cfg_listen(&x, root, c);

  static const char *const lim_keys[] = {"max_body_bytes", "header_timeout_s", "idle_timeout_s",
                                         "send_timeout_s", "max_connections", NULL};
  const cJSON *lim = cfg_section(&x, root, "limits", lim_keys);
  c->max_body_bytes = (size_t)cfg_int(&x, lim, "max_body_bytes", 1024, INT64_C(1) << 32,
                                      (int64_t)c->max_body_bytes, "limits");
  c->header_timeout_s = cfg_num(&x, lim, "header_timeout_s", 0.1, 3600, c->header_timeout_s, "limits");
  c->idle_timeout_s = cfg_num(&x, lim, "idle_timeout_s", 0.1, 86400, c->idle_timeout_s, "limits");
  c->send_timeout_s = cfg_num(&x, lim, "send_timeout_s", 0.1, 86400, c->send_timeout_s, "limits");
  c->max_connections = (size_t)cfg_int(&x, lim, "max_connections", 1, 1000000,
                                       (int64_t)c->max_connections, "limits");

  static const char *const q_keys[] = {"max", "timeout_s", NULL};
  const cJSON *q = cfg_section(&x, root, "queue", q_keys);
  c->queue_max = (size_t)cfg_int(&x, q, "max", 1, 10000000, (int64_t)c->queue_max, "queue");
  c->queue_timeout_s = cfg_num(&x, q, "timeout_s", 0.1, 86400 * 7, c->queue_timeout_s, "queue");

  static const char *const s_keys[] = {"retries", "default_max_tokens", "expected_output_tokens",
                                       NULL};
  const cJSON *sch = cfg_section(&x, root, "scheduler", s_keys);
  c->retries = (int)cfg_int(&x, sch, "retries", 0, 100, c->retries, "scheduler");
  c->default_max_tokens = cfg_int(&x, sch, "default_max_tokens", 1, INT64_C(1) << 30,
                                  c->default_max_tokens, "scheduler");
  c->expected_output_tokens = cfg_num(&x, sch, "expected_output_tokens", 1, 1e9,
                                      c->expected_output_tokens, "scheduler");

  static const char *const u_keys[] = {"ca_file", "tls_verify", "connect_timeout_s",
                                       "timeout_margin", "timeout_min_s",
                                       "stream_idle_timeout_s", "refusal_window_s", NULL};
  const cJSON *up = cfg_section(&x, root, "upstream", u_keys);
  if (up) {
    const char *ca = NULL;
    int b = 1;
    cfg_check(&x, pr_json_get_str(up, "ca_file", 0, &ca, "upstream", &je), &je);
    if (ca) c->ca_file = strdup(ca);
    if (cfg_check(&x, pr_json_get_bool(up, "tls_verify", 0, &b, "upstream", &je), &je))
      c->tls_verify = b;
  }
  c->connect_timeout_s = cfg_num(&x, up, "connect_timeout_s", 0.1, 600, c->connect_timeout_s, "upstream");
  c->timeout_margin = cfg_num(&x, up, "timeout_margin", 1, 100, c->timeout_margin, "upstream");
  c->timeout_min_s = cfg_num(&x, up, "timeout_min_s", 0.1, 86400, c->timeout_min_s, "upstream");
  c->stream_idle_timeout_s = cfg_num(&x, up, "stream_idle_timeout_s", 0.1, 86400,
                                     c->stream_idle_timeout_s, "upstream");
  c->refusal_window_s = cfg_num(&x, up, "refusal_window_s", 0, 600, c->refusal_window_s, "upstream");

  static const char *const h_keys[] = {"interval_s", "timeout_s", "down_interval_s", "rise",
                                       "fall", "cooldown_s", "cooldown_max_s", NULL};
  const cJSON *h = cfg_section(&x, root, "health", h_keys);
  c->health_interval_s = cfg_num(&x, h, "interval_s", 0, 86400, c->health_interval_s, "health");
  c->health_timeout_s = cfg_num(&x, h, "timeout_s", 0.05, 3600, c->health_timeout_s, "health");
  c->health_down_interval_s = cfg_num(&x, h, "down_interval_s", 0.05, 86400,
                                      c->health_interval_s * 3, "health");
  c->rise = (int)cfg_int(&x, h, "rise", 1, 1000, c->rise, "health");
  c->fail_threshold = (int)cfg_int(&x, h, "fall", 1, 1000, c->fail_threshold, "health");
  c->cooldown_s = cfg_num(&x, h, "cooldown_s", 0.01, 86400, c->cooldown_s, "health");
  c->cooldown_max_s = cfg_num(&x, h, "cooldown_max_s", 0.01, 86400 * 7, c->cooldown_max_s, "health");

  static const char *const f_keys[] = {"secret_env", "replica_token_env", "heartbeat_timeout_s",
                                       "heartbeat_interval_s", "max_skew_s", NULL};
  const cJSON *fl = cfg_section(&x, root, "fleet", f_keys);
  if (fl) {
    const char *senv = NULL;
    if (cfg_check(&x, pr_json_get_str(fl, "secret_env", 1, &senv, "fleet", &je), &je) && senv) {
      const char *val = getenv(senv);
      c->fleet_secret_env = strdup(senv);
      if (!val || strlen(val) < 16)
        cfg_err_at(&x, "fleet.secret_env", 0,
                   "environment variable %s must hold the fleet secret (at least 16 characters)",
                   senv);
      else
        c->fleet_secret = strdup(val);
    }
    const char *tenv = NULL;
    if (cfg_check(&x, pr_json_get_str(fl, "replica_token_env", 0, &tenv, "fleet", &je), &je) &&
        tenv) {
      const char *val = getenv(tenv);
      if (!val || !*val)
        cfg_err_at(&x, "fleet.replica_token_env", 0, "environment variable %s is not set", tenv);
      else
        c->fleet_replica_token = strdup(val);
    }
  }
  c->heartbeat_timeout_s = cfg_num(&x, fl, "heartbeat_timeout_s", 0.1, 86400, c->heartbeat_timeout_s, "fleet");
  c->heartbeat_interval_s = cfg_num(&x, fl, "heartbeat_interval_s", 0.05, 3600, c->heartbeat_interval_s, "fleet");
  c->heartbeat_max_skew_s = cfg_num(&x, fl, "max_skew_s", 0.1, 3600, c->heartbeat_max_skew_s, "fleet");

  c->shutdown_timeout_s = cfg_num(&x, root, "shutdown_timeout_s", 0, 86400, c->shutdown_timeout_s, "");
  const char *lvl = NULL;
  cfg_check(&x, pr_json_get_str(root, "log_level", 0, &lvl, "", &je), &je);
  if (lvl && pr_log_level_from_name(lvl) < 0)
    cfg_err_at(&x, "log_level", 0, "expected one of debug, info, warn, error");
  c->log_level = strdup(lvl ? lvl : "info");
  cfg_admin(&x, root, c);

  static const char *const r_keys[] = {"url", "prefix", "timeout_s", "lease_ttl_s", "gateway_id",
                                       NULL};
  const cJSON *rd = cfg_section(&x, root, "redis", r_keys);
  if (rd) {
    const char *url = NULL, *prefix = NULL, *gid = NULL;
    if (cfg_check(&x, pr_json_get_str(rd, "url", 1, &url, "redis", &je), &je) && url)
      cfg_redis_url(&x, url, c);
    cfg_check(&x, pr_json_get_str(rd, "prefix", 0, &prefix, "redis", &je), &je);
    c->redis_prefix = strdup(prefix ? prefix : "fleetgate:");
    if (cfg_check(&x, pr_json_get_str(rd, "gateway_id", 0, &gid, "redis", &je), &je) && gid)
      c->gateway_id = strdup(gid);
    c->redis_timeout_s = cfg_num(&x, rd, "timeout_s", 0.01, 60, 1, "redis");
    c->lease_ttl_s = cfg_num(&x, rd, "lease_ttl_s", 1, 3600, 15, "redis");
  }

  const cJSON *akeys = NULL;
  if (cfg_check(&x, pr_json_get_arr(root, "api_keys", 0, &akeys, "", &je), &je) && akeys) {
    if (cJSON_GetArraySize(akeys) == 0)
      cfg_err_at(&x, "api_keys", 0, "an empty list would lock every caller out; leave api_keys out to run open");
    else
      cfg_keys_section(&x, akeys, c);
  }

  const cJSON *reps = NULL;
  if (cfg_check(&x, pr_json_get_arr(root, "replicas", 0, &reps, "", &je), &je) && reps)
    cfg_replica_list(&x, reps, "replicas", c);
  const char *rdir = NULL;
  if (cfg_check(&x, pr_json_get_str(root, "replicas_dir", 0, &rdir, "", &je), &je) && rdir)
    cfg_replicas_dir(&x, rdir, c);

done:
  cJSON_Delete(root);
  pr_buf_free(&text);
  if (x.n_errors) {
    gw_config_free(c);
    return PR_EPARSE;
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

const gw_replica_conf *gw_config_replica(const gw_config *c, const char *id) {
  for (size_t i = 0; i < c->n_replicas; i++)
    if (strcmp(c->replicas[i].id, id) == 0) return &c->replicas[i];
  return NULL;
}
