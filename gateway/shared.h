/* Shared state in Redis, so several gateways can serve one fleet (docs/scaling.md):
 * slot leases (an atomic Lua check-and-add with an expiry, renewed while a request runs:
 * two gateways never overbook a phone, and a dead gateway's leases expire), per-key rate
 * and token limits counted globally, the registry of heartbeat-registered phones and
 * health verdicts pushed to every gateway over pub/sub, learned speeds, and the number of
 * gateways alive. hiredis's async API runs on the gateway's libuv loop; every command has
 * a deadline, so a slow Redis never stalls anything: past it, or when the connection
 * drops, the gateway carries on from its own view (each phone's slots divided by the
 * gateways last seen) and resyncs when Redis is back. */
#ifndef GW_SHARED_H
#define GW_SHARED_H

#include "buf.h"
#include "gw.h"
#include "idkey.h"
#include "sign.h"

/* Connect when the configuration names a Redis (no-op otherwise). */
int gw_shared_start(gw_server *gw);
/* After a reload: reconnect if the Redis settings changed. */
void gw_shared_apply(gw_server *gw);
void gw_shared_stop(gw_server *gw);
/* 1 while Redis answers; 0 when there is none or it is unreachable (degraded). */
int gw_shared_usable(const gw_server *gw);
/* Gateways seen alive in Redis lately (this one included; 1 without Redis). */
unsigned gw_shared_gateways(const gw_server *gw);
/* 1 when a Redis is configured but unreachable. */
int gw_shared_degraded(const gw_server *gw);

/* Take a lease on one of a's replica's slots before the request is sent. Returns 0
 * when the answer will come later through done(a, granted): 1 granted, 0 full elsewhere,
 * -1 Redis failed (go on with the local view); or a negative code when Redis cannot be
 * used (the caller then goes on with its own view). */
typedef void (*gw_shared_lease_cb)(gw_attempt *a, int granted);
int gw_shared_lease(gw_server *gw, gw_attempt *a, gw_shared_lease_cb done);
/* The attempt ended (or is dropped): give its lease back, or forget a pending ask. */
void gw_shared_lease_end(gw_server *gw, gw_attempt *a);

/* Global admission for a key's rpm/tpm limits. Returns 0 when the answer will come
 * through done(j, ok, which, rpm_tokens, tpm_tokens) (ok 1/0, or -1 when Redis failed:
 * decide locally), or a negative code when Redis cannot be used. */
typedef void (*gw_shared_admit_cb)(gw_job *j, int ok, const char *which, double rpm_tokens,
                                   double tpm_tokens);
int gw_shared_admit(gw_server *gw, gw_job *j, gw_shared_admit_cb done);
/* Forget a pending admission (the job is going away). */
void gw_shared_admit_forget(gw_job *j);
/* Count tokens a key used against its global per-minute budget. */
void gw_shared_debit(gw_server *gw, gw_caller *c, uint64_t tokens);
/* Keys' budgets as a subscriber of ended jobs (gw_jobs_subscribe): the admission a request
 * held is given back and its tokens charged, here and, with Redis, to the shared budget. */
void gw_shared_on_job_ended(gw_server *gw, const gw_job_ended *ev, void *ud);

/* Registry: publish an accepted heartbeat (its timestamp, signatures and body) to the other
 * gateways; publish a local health verdict; share learned speeds. */
struct gw_heartbeat_msg;
void gw_shared_publish_heartbeat(gw_server *gw, const char *id, const struct gw_heartbeat_msg *m);
void gw_shared_publish_state(gw_server *gw, const gw_replica *r);
/* Redis as a fleet subscriber (gw_fleet_subscribe): a local verdict, an admin drain and
 * learned rates go to the other gateways. */
void gw_shared_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
void gw_shared_publish_rates(gw_server *gw, gw_replica *r);
/* An admin drained or enabled r here: tell the other gateways. */
void gw_shared_publish_drain(gw_server *gw, const gw_replica *r);
/* A quarantine or a release of id decided here (verify.c): kept in Redis, told to the
 * other gateways; without Redis now, shared when it is back (the newest verdict wins). */
void gw_shared_publish_verdict(gw_server *gw, const char *id);

/* fleetgate_redis_messages_refused_total{reason} (zeros without Redis) for /metrics. */
void gw_shared_metrics(const gw_server *gw, pr_buf *out);

/* ---- what goes through Redis, read and merged (pure: no Redis; shared.c's own use) ---- */

/* The value kept under hb:ID: "TS\nFLEETSIG\nKEYSIG\nBODY" (FLEETSIG "-" when the
 * heartbeat had none), the heartbeat as its phone signed it; malloc'd and NUL-ended
 * (*len without the NUL), NULL when out of memory. */
char *gw_shared_hb_encode(const struct gw_heartbeat_msg *m, size_t *len);
/* Its reading: hb holds the fields, m points into hb and into val (the body). 0, or -1
 * when a line is missing or too long or TS is not positive decimal milliseconds. */
typedef struct gw_shared_hb {
  char ts[24];
  char fsig[PR_SIGN_LEN + 2];
  char ksig[PR_IDKEY_SIG_LEN + 2];
} gw_shared_hb;
int gw_shared_hb_decode(const char *val, size_t vlen, gw_shared_hb *hb, struct gw_heartbeat_msg *m);
/* Whether a relayed heartbeat signed at tsv is worth applying: 1; 0 when the phone's last
 * accepted one (known_ts; 0 none) is as new, or tsv is older than the relay keeps it
 * (heartbeat.timeout_s x 10) or further ahead than fleet.max_skew_s. */
int gw_shared_hb_fresh(const gw_config *c, int64_t known_ts, int64_t tsv, int64_t now_wall_ms);
/* An event message read: "state ID down GATEWAY REASON" or "drain ID on|off GATEWAY". */
typedef struct gw_shared_msg {
  char id[128], from[64];
  const char *reason; /* state: points into the message ("" none) */
  int on;             /* drain: on (1) or off (0) */
} gw_shared_msg;
/* 1 to apply; 0 to ignore (malformed, this gateway's own (self), a state other than
 * down); -1 refused: the message names a gateway other than its seal's sender, or a
 * drain neither on nor off. */
int gw_shared_read_state(const char *msg, const char *self, const char *sender, gw_shared_msg *out);
int gw_shared_read_drain(const char *msg, const char *self, const char *sender, gw_shared_msg *out);
/* Another gateway found r down (m): a ready r goes down for health.cooldown_s with the
 * reason "gateway FROM: REASON", marked remote so it is not published again. 1 when r
 * changed; 0 (NULL, or not ready: nothing to do). */
int gw_shared_take_down(const gw_config *c, gw_replica *r, const gw_shared_msg *m, uint64_t now);
/* A stored speed, "PREFILL DECODE": 0 with both, else -1. */
int gw_shared_read_rates(const char *val, size_t vlen, double *pre, double *dec);

#endif
