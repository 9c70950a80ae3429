/* The agent's settings from a file and the environment; see conf.h. */
#include "conf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "err.h"
#include "json.h"

#define AG_CONF_MAX_FILE ((size_t)1 << 20)
#define AG_CONF_MAX_WORD 4096

void ag_conf_init(ag_conf *c) {
  memset(c, 0, sizeof(*c));
  c->measure = c->insecure = -1;
  c->ready_timeout_s = c->restart_max_s = c->stop_timeout_s = -1;
}

void ag_conf_free(ag_conf *c) {
  for (size_t i = 0; i < c->n_store; i++) free(c->store[i]);
  free(c->store);
  c->store = NULL;
  c->n_store = c->cap_store = 0;
}

const char *ag_conf_keep(ag_conf *c, const char *s, size_t len) {
  if (c->n_store == c->cap_store) {
    size_t cap = c->cap_store ? c->cap_store * 2 : 16;
    char **ns = realloc(c->store, cap * sizeof(*ns));
    if (!ns) return NULL;
    c->store = ns;
    c->cap_store = cap;
  }
  char *p = strndup(s, len);
  if (!p) return NULL;
  c->store[c->n_store++] = p;
  return p;
}

int ag_conf_split(ag_conf *c, const char *s, const char **out, size_t max) {
  char word[AG_CONF_MAX_WORD];
  size_t n = 0;
  const char *p = s;
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (!*p) break;
    size_t wl = 0;
    while (*p && *p != ' ' && *p != '\t' && *p != '\n') {
      char ch = *p++;
      if (ch == '\'') {
        while (*p && *p != '\'') {
          if (wl + 1 >= sizeof(word)) return PR_ETOOLARGE;
          word[wl++] = *p++;
        }
        if (*p != '\'') return -EINVAL;
        p++;
      } else if (ch == '"') {
        while (*p && *p != '"') {
          if (*p == '\\' && (p[1] == '"' || p[1] == '\\')) p++;
          if (wl + 1 >= sizeof(word)) return PR_ETOOLARGE;
          word[wl++] = *p++;
        }
        if (*p != '"') return -EINVAL;
        p++;
      } else {
        if (ch == '\\' && *p) ch = *p++;
        if (wl + 1 >= sizeof(word)) return PR_ETOOLARGE;
        word[wl++] = ch;
      }
    }
    if (n >= max) return PR_ETOOLARGE;
    const char *w = ag_conf_keep(c, word, wl);
    if (!w) return -ENOMEM;
    out[n++] = w;
  }
  return (int)n;
}

/* Placeholders seen in examples and how-tos; a token equal to one (any case) is
 * refused even when long enough. */
static const char *const token_placeholders[] = {
  "REPLACE_WITH_A_LONG_RANDOM_TOKEN", "changeme-changeme", "change-me-please-now", "your-replica-token",
  "your-replica-token-here", "replica-token-here", "please-change-me", "insecure-default-token",
  "0123456789abcdef", "1234567890123456", "abcdefghijklmnop", "fleetgate-replica-token",
  NULL};

int ag_conf_check_token(const char *token, char *why, size_t whyn) {
  size_t n = token ? strlen(token) : 0;
  if (n == 0) {
    snprintf(why, whyn, "FLEETGATE_REPLICA_TOKEN is set but empty");
    return -EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)token[i];
    if (c <= ' ' || c >= 0x7f) {
      snprintf(why, whyn, "FLEETGATE_REPLICA_TOKEN holds a space, control or non-ASCII character");
      return -EINVAL;
    }
  }
  if (n < AG_CONF_TOKEN_MIN) {
    snprintf(why, whyn, "FLEETGATE_REPLICA_TOKEN is shorter than %d characters", AG_CONF_TOKEN_MIN);
    return -EINVAL;
  }
  if (strspn(token, (char[]){token[0], '\0'}) == n) {
    snprintf(why, whyn, "FLEETGATE_REPLICA_TOKEN is one character repeated");
    return -EINVAL;
  }
  for (size_t i = 0; token_placeholders[i]; i++) {
    if (strcasecmp(token, token_placeholders[i]) == 0) {
      snprintf(why, whyn, "FLEETGATE_REPLICA_TOKEN is an example placeholder, not a secret");
      return -EINVAL;
    }
  }
  return 0;
}

int ag_conf_parse_threads(const char *s, int *out, size_t *n) {
  *n = 0;
  const char *p = s;
  for (;;) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || v < 1 || v > 1024 || *n >= AG_ENGINE_MAX_TUNE) return -EINVAL;
    out[(*n)++] = (int)v;
    if (*end == '\0') return 0;
    if (*end != ',') return -EINVAL;
    p = end + 1;
  }
}

static int conf_str(ag_conf *c, const cJSON *o, const char *key, const char **dst, pr_json_err *je) {
  const char *v = NULL;
  int rc = pr_json_get_str(o, key, 0, &v, "", je);
  if (rc != 0) return rc < 0 ? rc : 0;
  *dst = ag_conf_keep(c, v, strlen(v));
  return *dst ? 0 : -ENOMEM;
}

static int conf_num(const cJSON *o, const char *key, double min, double max, double *dst, pr_json_err *je) {
  double v;
  int rc = pr_json_get_double(o, key, 0, min, max, &v, "", je);
  if (rc == 0) *dst = v;
  return rc < 0 ? rc : 0;
}

static int conf_bool(const cJSON *o, const char *key, int *dst, pr_json_err *je) {
  int v;
  int rc = pr_json_get_bool(o, key, 0, &v, "", je);
  if (rc == 0) *dst = v;
  return rc < 0 ? rc : 0;
}

int ag_conf_load_file(ag_conf *c, const char *path, char *err, size_t errn) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    snprintf(err, errn, "%s: %s", path, strerror(errno));
    return -errno;
  }
  char *text = malloc(AG_CONF_MAX_FILE + 1);
  size_t len = text ? fread(text, 1, AG_CONF_MAX_FILE + 1, fp) : 0;
  fclose(fp);
  if (!text) return -ENOMEM;
  if (len > AG_CONF_MAX_FILE) {
    free(text);
    snprintf(err, errn, "%s: larger than %zu bytes", path, AG_CONF_MAX_FILE);
    return PR_ETOOLARGE;
  }
  pr_json_err je;
  memset(&je, 0, sizeof(je));
  cJSON *o = pr_json_parse(text, len, 16, &je);
  free(text);
  if (!o) {
    snprintf(err, errn, "%s:%d:%d: %s", path, je.line, je.col, je.msg);
    return PR_EPARSE;
  }
  static const char *const keys[] = {
    "engine", "listen", "id", "model", "gateway", "public_url", "gateway_ca", "upstream", "command", "args",
    "threads_arg", "tune_threads", "measure", "insecure_private_network", "slots", "n_ctx",
    "ready_timeout_s", "restart_max_s", "stop_timeout_s", "models_dir", NULL};
  int rc = cJSON_IsObject(o) ? pr_json_check_keys(o, keys, "", &je) : PR_ETYPE;
  if (rc == PR_ETYPE && !cJSON_IsObject(o)) snprintf(je.msg, sizeof(je.msg), "expected a JSON object");
  if (!rc) rc = conf_str(c, o, "engine", &c->engine, &je);
  if (!rc) rc = conf_str(c, o, "listen", &c->listen, &je);
  if (!rc) rc = conf_str(c, o, "id", &c->id, &je);
  if (!rc) rc = conf_str(c, o, "model", &c->model, &je);
  if (!rc) rc = conf_str(c, o, "gateway", &c->gateway, &je);
  if (!rc) rc = conf_str(c, o, "public_url", &c->public_url, &je);
  if (!rc) rc = conf_str(c, o, "gateway_ca", &c->gateway_ca, &je);
  if (!rc) rc = conf_str(c, o, "upstream", &c->upstream, &je);
  if (!rc) rc = conf_str(c, o, "command", &c->command, &je);
  if (!rc) rc = conf_str(c, o, "threads_arg", &c->threads_arg, &je);
  if (!rc) rc = conf_str(c, o, "models_dir", &c->models_dir, &je);
  if (!rc) rc = conf_bool(o, "measure", &c->measure, &je);
  if (!rc) rc = conf_bool(o, "insecure_private_network", &c->insecure, &je);
  double d = -1;
  if (!rc && !(rc = conf_num(o, "slots", 1, 1024, &d, &je)) && d > 0) c->slots = (int)d;
  d = -1;
  if (!rc && !(rc = conf_num(o, "n_ctx", 1, 2147483647.0, &d, &je)) && d > 0) c->n_ctx = (int64_t)d;
  if (!rc) rc = conf_num(o, "ready_timeout_s", 0, 86400, &c->ready_timeout_s, &je);
  if (!rc) rc = conf_num(o, "restart_max_s", 0.5, 3600, &c->restart_max_s, &je);
  if (!rc) rc = conf_num(o, "stop_timeout_s", 0, 3600, &c->stop_timeout_s, &je);
  const cJSON *arr = NULL;
  if (!rc && (rc = pr_json_get_arr(o, "args", 0, &arr, "", &je)) == 0) {
    c->n_args = 0;
    c->args_set = 1;
    int i = 0;
    for (const cJSON *a = arr->child; a && !rc; a = a->next, i++) {
      if (!cJSON_IsString(a) || c->n_args >= AG_ENGINE_MAX_ARGS) {
        pr_json_path_index(je.path, sizeof(je.path), "args", i);
        snprintf(je.msg, sizeof(je.msg), cJSON_IsString(a) ? "too many arguments" : "expected a string");
        rc = PR_ETYPE;
      } else if (!(c->args[c->n_args++] = ag_conf_keep(c, a->valuestring, strlen(a->valuestring)))) {
        rc = -ENOMEM;
      }
    }
  } else if (rc == 1) {
    rc = 0;
  }
  if (!rc && (rc = pr_json_get_arr(o, "tune_threads", 0, &arr, "", &je)) == 0) {
    c->n_tune = 0;
    for (const cJSON *a = arr->child; a && !rc; a = a->next) {
      if (!cJSON_IsNumber(a) || a->valuedouble < 1 || a->valuedouble > 1024 || c->n_tune >= AG_ENGINE_MAX_TUNE) {
        snprintf(je.path, sizeof(je.path), "tune_threads");
        snprintf(je.msg, sizeof(je.msg), "expected 1 to %d thread counts, each 1 - 1024", AG_ENGINE_MAX_TUNE);
        rc = PR_ERANGE;
      } else {
        c->tune[c->n_tune++] = (int)a->valuedouble;
      }
    }
  } else if (rc == 1) {
    rc = 0;
  }
  cJSON_Delete(o);
  if (rc < 0) {
    snprintf(err, errn, "%s: %s: %s", path, je.path[0] ? je.path : "(document)", je.msg[0] ? je.msg : pr_strerror(rc));
    return rc;
  }
  return 0;
}

int ag_conf_load_env(ag_conf *c, const char *(*getenv_fn)(const char *), char *err, size_t errn) {
  const char *v;
  if ((v = getenv_fn("FLEETGATE_ENGINE_COMMAND")) && *v && !(c->command = ag_conf_keep(c, v, strlen(v))))
    return -ENOMEM;
  if ((v = getenv_fn("FLEETGATE_ENGINE_UPSTREAM")) && *v && !(c->upstream = ag_conf_keep(c, v, strlen(v))))
    return -ENOMEM;
  if ((v = getenv_fn("FLEETGATE_ENGINE_API_KEY")) && *v && !(c->api_key = ag_conf_keep(c, v, strlen(v))))
    return -ENOMEM;
  if ((v = getenv_fn("FLEETGATE_ENGINE_ARGS"))) {
    int n = ag_conf_split(c, v, c->args, AG_ENGINE_MAX_ARGS);
    if (n < 0) {
      snprintf(err, errn, "FLEETGATE_ENGINE_ARGS: %s", n == -EINVAL ? "unterminated quote" : "too many or too long words");
      return n;
    }
    c->n_args = (size_t)n;
    c->args_set = 1;
  }
  return 0;
}

/* ---- secrets ---------------------------------------------------------------------------- */

static const char *const secret_names[AG_SECRETS_N] = {
    "FLEETGATE_FLEET_SECRET", "FLEETGATE_REPLICA_TOKEN", "FLEETGATE_AGENT_KEY",
    "FLEETGATE_TUNNEL_KEY",   "FLEETGATE_ENGINE_API_KEY",
};

/* Where the value of entry begins when it is NAME=value, else 0. */
static size_t value_at(const char *entry, const char *name) {
  size_t n = strlen(name);
  return strncmp(entry, name, n) == 0 && entry[n] == '=' ? n + 1 : 0;
}

int ag_secrets_take(ag_secrets *s) {
  extern char **environ;
  int rc = 0;
  for (size_t i = 0; i < AG_SECRETS_N; i++) {
    /* every entry of the name (getenv reads the first), each overwritten in place: the
     * initial environment is what /proc/PID/environ shows, whatever unsetenv does */
    for (char **e = environ; e && *e; e++) {
      size_t at = value_at(*e, secret_names[i]);
      if (!at) continue;
      char *v = *e + at;
      if (!s->value[i] && !(s->value[i] = strdup(v))) rc = -ENOMEM;
      OPENSSL_cleanse(v, strlen(v));
    }
    unsetenv(secret_names[i]);
  }
  return rc;
}

const char *ag_secrets_get(const ag_secrets *s, const char *name) {
  for (size_t i = 0; i < AG_SECRETS_N; i++)
    if (strcmp(name, secret_names[i]) == 0) return s->value[i];
  return NULL;
}

int ag_secrets_is_secret_entry(const char *entry) {
  for (size_t i = 0; i < AG_SECRETS_N; i++)
    if (value_at(entry, secret_names[i])) return 1;
  return 0;
}

void ag_secrets_free(ag_secrets *s) {
  for (size_t i = 0; i < AG_SECRETS_N; i++) {
    if (s->value[i]) OPENSSL_cleanse(s->value[i], strlen(s->value[i]));
    free(s->value[i]);
    s->value[i] = NULL;
  }
}
