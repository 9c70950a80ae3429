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

#endif
