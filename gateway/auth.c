/* API keys, per-caller limits; see auth.h. */
#include "auth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "bearer.h"
#include "idmap.h"
#include "log.h"

void gw_auth_hash_hex(const char *key, size_t len, char out[65]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (EVP_Digest(key, len, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32) {
    memset(out, '0', 64);
  } else {
    for (unsigned i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
  }
  out[64] = '\0';
}

gw_caller *gw_auth_caller(gw_server *gw, const char *name) {
  return pr_idmap_get_str(&gw->caller_names, name);
}

void gw_auth_apply(gw_server *gw, const gw_config *conf) {
  for (gw_caller *c = gw->callers; c; c = c->next) c->conf = NULL;
  pr_idmap_clear(&gw->caller_keys); /* the new config's digests, below */
  for (size_t i = 0; i < conf->n_keys; i++) {
    const gw_key_conf *k = &conf->keys[i];
    gw_caller *c = gw_auth_caller(gw, k->name);
    if (!c) {
      c = calloc(1, sizeof(*c));
      if (!c || !(c->name = strdup(k->name)) || pr_idmap_put_str(&gw->caller_names, c->name, c) < 0) {
        if (c) free(c->name);
        free(c);
        pr_error("api key %s: out of memory: it is refused until the next reload", k->name);
        continue;
      }
      c->rpm_tokens = k->rpm;
      c->tpm_tokens = k->tpm;
      c->rpm_ms = c->tpm_ms = uv_now(gw->loop);
      c->next = gw->callers;
      gw->callers = c;
    }
    if (pr_idmap_put(&gw->caller_keys, k->sha256, sizeof(k->sha256), c) < 0) {
      pr_error("api key %s: out of memory: it is refused until the next reload", k->name);
      continue;
    }
    c->conf = k;
    /* a lowered limit applies at once */
    if (k->rpm > 0 && c->rpm_tokens > k->rpm) c->rpm_tokens = k->rpm;
    if (k->tpm > 0 && c->tpm_tokens > k->tpm) c->tpm_tokens = k->tpm;
  }
}

void gw_auth_free(gw_server *gw) {
  pr_idmap_clear(&gw->caller_keys);
  pr_idmap_clear(&gw->caller_names);
  gw_caller *c = gw->callers;
  while (c) {
    gw_caller *next = c->next;
    free(c->name);
    free(c);
    c = next;
  }
  gw->callers = NULL;
}

gw_caller *gw_auth_identify(gw_server *gw, const pr_http_req *req, const char **why) {
  const char *key = pr_bearer_token(pr_http_header_get(req, "authorization"));
  if (!key) key = pr_http_header_get(req, "x-api-key");
  if (!key || !*key) {
    *why = "missing";
    return NULL;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (EVP_Digest(key, strlen(key), md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32) {
    *why = "unknown";
    return NULL;
  }
  /* found by the digest's keyed hash (idmap.h), the digests compared in constant time:
   * the time a lookup takes says nothing of the keys configured, and the gateway's cost
   * per request stays the same with ten keys or ten thousand */
  gw_caller *found = pr_idmap_get(&gw->caller_keys, md, 32);
  if (found && !found->conf) found = NULL;
  if (!found) *why = "unknown";
  return found;
}

int gw_auth_model_allowed(const gw_caller *c, const char *model) {
  const gw_key_conf *k = c ? c->conf : NULL;
  if (!k || !k->n_models) return 1;
  for (size_t i = 0; i < k->n_models; i++)
    if (strcmp(k->models[i], model) == 0) return 1;
  return 0;
}

static void refill(double *tokens, uint64_t *last_ms, double per_minute, uint64_t now) {
  double add = (double)(now - *last_ms) * per_minute / 60000.0;
  *last_ms = now;
  *tokens += add;
  if (*tokens > per_minute) *tokens = per_minute;
}

/* The key's requests-per-minute bucket (rpm: this gateway's share), refilled to now: 1
 * when it holds less than one request (counted as limited, with the wait and the message
 * for the answer), else 0; the caller takes the request when it admits it. */
static int rpm_short(gw_caller *c, const gw_key_conf *k, double rpm, uint64_t now,
                     int *retry_after_s, char *msg, size_t n) {
  refill(&c->rpm_tokens, &c->rpm_ms, rpm, now);
  if (c->rpm_tokens >= 1) return 0;
  c->n_limited++;
  *retry_after_s = (int)ceil((1 - c->rpm_tokens) * 60.0 / rpm);
  if (*retry_after_s < 1) *retry_after_s = 1;
  snprintf(msg, n, "rate limit reached for requests per minute on key `%s`: limit %g", k->name,
           k->rpm);
  return 1;
}

int gw_auth_admit(gw_server *gw, gw_caller *c, const char *model, int *prio, int *retry_after_s,
                  const char **code, char *msg, size_t n, unsigned rate_share, int readmit) {
  const gw_key_conf *k = c->conf;
  uint64_t now = uv_now(gw->loop);
  *retry_after_s = 0;
  c->n_requests++;
  if (!k) {
    *code = "invalid_api_key";
    snprintf(msg, n, "this API key was removed");
    return 401;
  }
  if (!gw_auth_model_allowed(c, model)) {
    *code = "model_not_allowed";
    snprintf(msg, n, "the key `%s` may not use the model `%s`", k->name, model);
    return 403;
  }
  if (*prio < k->priority) {
    *code = "priority_not_allowed";
    snprintf(msg, n, "the key `%s` may only send batch requests", k->name);
    return 403;
  }
  if (*prio < k->priority) *prio = k->priority;
  if (k->concurrency > 0 && !readmit && c->inflight >= k->concurrency) {
    c->n_limited++;
    *code = "rate_limit_exceeded";
    *retry_after_s = 1;
    snprintf(msg, n, "too many concurrent requests for key `%s`: limit %d", k->name, k->concurrency);
    return 429;
  }
  double rpm = rate_share ? k->rpm / rate_share : 0;
  double tpm = rate_share ? k->tpm / rate_share : 0;
  if (rpm > 0 && rpm_short(c, k, rpm, now, retry_after_s, msg, n)) {
    *code = "rate_limit_exceeded";
    return 429;
  }
  if (tpm > 0) {
    refill(&c->tpm_tokens, &c->tpm_ms, tpm, now);
    if (c->tpm_tokens <= 0) {
      c->n_limited++;
      *code = "rate_limit_exceeded";
      *retry_after_s = (int)ceil((1 - c->tpm_tokens) * 60.0 / tpm);
      if (*retry_after_s < 1) *retry_after_s = 1;
      snprintf(msg, n, "rate limit reached for tokens per minute on key `%s`: limit %g", k->name,
               k->tpm);
      return 429;
    }
  }
  if (rpm > 0) c->rpm_tokens -= 1;
  if (!readmit) c->inflight++;
  return 0;
}

void gw_auth_release(gw_server *gw, gw_caller *c, uint64_t tokens, unsigned rate_share) {
  c->inflight--;
  if (rate_share && c->conf && c->conf->tpm > 0) {
    /* the bucket refills at this gateway's share, as gw_auth_admit refills it */
    refill(&c->tpm_tokens, &c->tpm_ms, c->conf->tpm / rate_share, uv_now(gw->loop));
    c->tpm_tokens -= (double)tokens; /* may go into debt: the next request waits it out */
  }
}

int gw_auth_take_request(gw_server *gw, gw_caller *c, unsigned rate_share, int *retry_after_s,
                         char *msg, size_t n) {
  const gw_key_conf *k = c->conf;
  *retry_after_s = 0;
  c->n_requests++;
  double rpm = k && rate_share ? k->rpm / rate_share : 0;
  if (rpm <= 0) return 0;
  if (rpm_short(c, k, rpm, uv_now(gw->loop), retry_after_s, msg, n)) return 429;
  c->rpm_tokens -= 1;
  return 0;
}
