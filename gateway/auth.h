/* Callers: API keys (stored as SHA-256, compared in constant time; the key itself is
 * never kept or logged), and each caller's limits — requests per minute and tokens per
 * minute as token buckets, concurrent requests as a count — plus its share of the queue
 * (weighted fair queueing, see job.c). Caller state outlives reloads: a key keeps its
 * buckets and counts by name. */
#ifndef GW_AUTH_H
#define GW_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "gw.h"

struct gw_caller {
  char *name;
  const gw_key_conf *conf;   /* in gw->conf; NULL once the key was removed */
  double rpm_tokens, tpm_tokens;
  uint64_t rpm_ms, tpm_ms;   /* when the buckets were last refilled */
  int inflight;              /* requests admitted and not finished */
  double last_tag[GW_PRIO_COUNT]; /* fair queueing: finish tag of its last request */
  uint64_t n_requests, n_limited;
  gw_caller *next;
};

/* SHA-256 of key as 64 lowercase hex digits into out[65]. */
void gw_auth_hash_hex(const char *key, size_t len, char out[65]);
/* The caller presenting req's key (Authorization: Bearer, or x-api-key). NULL when the
 * key is missing or unknown; *why says which. Only call with api_keys configured. */
gw_caller *gw_auth_identify(gw_server *gw, const pr_http_req *req, const char **why);
/* The caller of the key named name; NULL when no such key. */
gw_caller *gw_auth_caller(gw_server *gw, const char *name);
/* 1 when c may use model: its key has no `models` list or names it (also 1 for NULL, a
 * gateway without keys). What a restricted key is told of the fleet's models goes
 * through this: it never learns of the others. */
int gw_auth_model_allowed(const gw_caller *c, const char *model);
/* Admission for a request of `model`: allowed model (403), priority no higher than the
 * key's (403), concurrency, requests and tokens per minute (429 with *retry_after_s).
 * *prio comes in as asked and leaves as granted. Returns 0 (and counts the request in
 * flight), or the HTTP status with code and msg filled. */
int gw_auth_admit(gw_server *gw, gw_caller *c, const char *model, int *prio, int *retry_after_s,
                  const char **code, char *msg, size_t n, unsigned rate_share, int readmit);
/* rate_share: 0 leaves the per-minute budgets to Redis; N >= 1 counts them here with 1/N
 * of each limit (N gateways and no Redis). readmit: the request is already counted in
 * flight (a second, local decision after Redis failed). */
/* A request that is not a completion but counts against the key's requests per minute (an
 * upload, a batch's creation): one taken from the bucket gw_auth_admit uses, at 1/rate_share
 * of the key's rpm. Returns 0, or 429 with *retry_after_s and msg filled (the bucket
 * untouched). */
int gw_auth_take_request(gw_server *gw, gw_caller *c, unsigned rate_share, int *retry_after_s,
                         char *msg, size_t n);
/* A request admitted with gw_auth_admit ended, having used `tokens`: counted here
 * against this gateway's bucket, which refills at 1/rate_share of the key's tpm (as in
 * gw_auth_admit); rate_share 0: Redis counts them. */
void gw_auth_release(gw_server *gw, gw_caller *c, uint64_t tokens, unsigned rate_share);
/* After a reload: point callers at their new key settings, add new keys. */
void gw_auth_apply(gw_server *gw, const gw_config *conf);
void gw_auth_free(gw_server *gw);

#endif
