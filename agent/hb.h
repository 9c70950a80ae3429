/* Signed heartbeats to the gateway (docs/protocol.md): every interval_s the gateway
 * asks for (5 s until it said otherwise), POST URL/fleet/v1/heartbeat with the agent's
 * report and its public key, signed by the phone's own key (Ed25519 over
 * "timestamp.body") and, while it has it, with HMAC-SHA256 under the fleet secret (what
 * enrols the key). While the gateway is unreachable or refuses, the next try waits 1, 2,
 * 4 ... up to 30 s; a pending enrolment waits an interval. A `drain` in the answer is
 * passed to the owner, who stops taking new work; a `replica_token`, the token the
 * gateway will call this phone with, too. */
#ifndef AG_HB_H
#define AG_HB_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "curlm.h"
#include "report.h"
#include "idkey.h"
#include "sign.h"

typedef struct ag_hb ag_hb;

/* Fills *r with the current report (strings must stay valid until the call returns
 * to the loop). */
typedef void (*ag_hb_report_fn)(void *ud, ag_report *r);
/* The gateway asks to drain (1) or no longer (0); called on changes only. */
typedef void (*ag_hb_drain_fn)(void *ud, int drain);
/* The gateway named the token it calls this phone with (on changes only). */
typedef void (*ag_hb_token_fn)(void *ud, const char *token);
/* Placement (docs/protocol.md): the model the gateway asks this phone to run, from its
 * answer's `place`; NULL fields are absent. Strings are borrowed for the call. */
#define AG_PLACE_MAX_ARGS 32
typedef struct ag_place {
  const char *model, *url, *sha256, *reason;
  int64_t size_bytes, n_ctx;   /* 0: not given */
  double mem_mb;               /* the memory the catalogue says it needs; 0: not given */
  const char *engine_args[AG_PLACE_MAX_ARGS];
  size_t n_engine_args;
} ag_place;
/* Every accepted answer: what it asks (NULL: no switch asked). */
typedef void (*ag_hb_place_fn)(void *ud, const ag_place *p);
/* A one-shot report ended: the gateway took it (ok 1), or said no or could not be reached
 * (ok 0); what is what it answered (its whole body when ok), or why it failed. */
typedef void (*ag_hb_once_fn)(void *ud, int ok, const char *what);

/* Strings are copied by ag_hb_new. */
typedef struct ag_hb_config {
  const char *gateway;    /* base URL of the gateway's client listener */
  const char *public_url; /* where the gateway reaches this agent; NULL: none yet (nothing
                           * is sent before ag_hb_set_public_url names one) */
  const char *secret;     /* fleet secret; NULL: none (the gateway pins the key in a file) */
  const char *ca_file;    /* PEM bundle that verifies an https gateway; NULL: the system's */
  const pr_idkey *key;    /* the phone's identity key (borrowed: outlives the sender) */
  ag_hb_token_fn token_fn; /* may be NULL */
  /* One report instead of a heartbeat every interval (an unfit phone's, which needs no
   * public URL): sent at most once_tries times (a refusal other than 429 ends it at
   * once), then once_fn. 0: ordinary heartbeats. */
  unsigned once_tries;
  ag_hb_once_fn once_fn;
} ag_hb_config;

#define AG_HB_SIG_LEN PR_SIGN_LEN

/* out = "sha256=" + hex HMAC-SHA256(secret, ts "." body); out holds AG_HB_SIG_LEN + 1.
 * pr_sign_heartbeat (sign.h) under the agent's name. */
int ag_hb_sign(const char *secret, const char *ts, const char *body, size_t len,
               char out[AG_HB_SIG_LEN + 1]);

/* The delay before try number `fails` + 1 after `fails` failures in a row (ms). */
uint64_t ag_hb_backoff_ms(unsigned fails);

/* Create the sender; nothing is sent before ag_hb_start. The loop and curlm are
 * borrowed and must outlive it. Owned by the caller: ag_hb_stop, then ag_hb_free once
 * on_stopped ran. */
int ag_hb_new(ag_hb **out, uv_loop_t *loop, pr_curlm *curlm, const ag_hb_config *cfg,
              ag_hb_report_fn report, ag_hb_drain_fn drain, void *ud);
void ag_hb_start(ag_hb *hb);
/* Hear the gateway's placement (each accepted answer). */
void ag_hb_on_place(ag_hb *hb, ag_hb_place_fn fn);
/* Send the next heartbeat now (e.g. when the engine became ready). */
void ag_hb_kick(ag_hb *hb);
/* The agent's public URL changed (a tunnel reopened): every heartbeat from now on names
 * url, and one goes at once (after the one in flight, if any). Returns 0 or -ENOMEM. */
int ag_hb_set_public_url(ag_hb *hb, const char *url);
/* Cancel what is in flight and close the timer; on_stopped runs once it is closed. */
void ag_hb_stop(ag_hb *hb, void (*on_stopped)(void *arg), void *arg);
void ag_hb_free(ag_hb *hb);

/* Counters for tests and logs. */
typedef struct ag_hb_stats {
  uint64_t sent, accepted, failed, pending;
  double interval_s;
  int drain;
} ag_hb_stats;
void ag_hb_get_stats(const ag_hb *hb, ag_hb_stats *st);

#endif
