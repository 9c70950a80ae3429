/* When health has something to do for each replica, and doing only that: the rules that
 * time active checks (the next probe, a busy phone's proof of life, the moment a probe in
 * flight turns late, the limit of its heartbeats) and the heap that keeps every replica
 * by the earliest of them. Pure: time is given, and what is due is done through the
 * callbacks health.c gives (a probe, a log line, a state change); the unit tests drive it
 * with injected time (tests/unit/test_healthsched.c). docs/health.md says the rules. */
#ifndef GW_HEALTHSCHED_H
#define GW_HEALTHSCHED_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "heap.h"
#include "replica.h"

#define GW_HSCHED_NEVER UINT64_MAX

/* How often a replica with a request on it is probed at most: health.busy_interval_s,
 * never less often than health.interval_s. */
double gw_hsched_busy_interval_s(const gw_config *c);

/* How often a replica that is not down is probed when idle, in a fleet of `replicas`:
 * health.interval_s, or replicas / health.idle_probes_per_s when that is longer, so that
 * the idle fleet's probes stay within that many a second whatever its size (0: no cap). */
double gw_hsched_idle_interval_s(const gw_config *c, size_t replicas);

/* When r's next probe is due (NEVER: active checks are off, one is in flight, or r left
 * the configuration). Idle, every health.interval_s (down_interval_s while down). With a
 * request on it and not down, also busy_gap_ms after the later of its last probe's end
 * and its last proof of life (gw_replica_alive): a phone whose answers' bytes flow, or
 * whose agent's heartbeats count its requests, is not probed for being busy. */
uint64_t gw_hsched_probe_due(const gw_config *c, const gw_replica *r);
/* When the probe in flight to r is judged late (NEVER: it cannot be, or is already): its
 * bound (gw_hsched_probe_late_ms) after the later of when it went out and r's last proof
 * of life; once past it, one loop turn later (gw_hsched_late). */
uint64_t gw_hsched_late_at(const gw_config *c, const gw_replica *r);
/* When r's heartbeats are overdue: fleet.heartbeat_timeout_s after the last (NEVER: it
 * sends none, or it is down already). */
uint64_t gw_hsched_heartbeat_due(const gw_config *c, const gw_replica *r);
/* The earliest of the three. */
uint64_t gw_hsched_next(const gw_config *c, const gw_replica *r);

/* A probe went out to r at now (timed: a health check, whose lateness counts; /props is
 * not). */
void gw_hsched_probe_sent(gw_replica *r, uint64_t now, int timed);
/* r's probe is over (answered, failed or cancelled): nothing in flight any more. */
void gw_hsched_probe_over(gw_replica *r);
/* r's probe ended at now (or none could start): the next in every_s (interval_s, or
 * down_interval_s while down), and the busy gap of this round (busy_interval_s), each
 * with ±20 % jitter from rnd (two random 16-bit numbers: 0 is 0.8x, 65535 1.2x) so phones
 * are not woken in lockstep. */
void gw_hsched_probe_ended(const gw_config *c, gw_replica *r, uint64_t now, double every_s,
                           const uint16_t rnd[2]);
/* A heartbeat of r was accepted (its last_heartbeat_ms is set), whose agent says `running`
 * requests are on the phone: proof of life when that is at least the requests this
 * gateway sent there (they reached it); with fewer, one may be lost on its way (a tunnel
 * that broke) and it proves nothing. */
void gw_hsched_heartbeat(gw_replica *r, int running);
/* Judge r's probe in flight at now: 1 when it turned late now (probe_late_ms is set);
 * 0 when it is not late, or the verdict waits for the next loop turn (timers run before
 * the loop reads its sockets: after the gateway's own loop stalled, an answer may be there
 * unread). */
int gw_hsched_late(const gw_config *c, gw_replica *r, uint64_t now);

/* What health.c does for what falls due. */
typedef struct gw_hsched_ops {
  /* start a probe of r (a check: gw_hsched_probe_sent follows); < 0 when it cannot */
  int (*probe)(void *ud, gw_replica *r, uint64_t now);
  /* r's probe turned late (log it, plan again) */
  void (*late)(void *ud, gw_replica *r, uint64_t now);
  /* r's heartbeats stopped: out of rotation */
  void (*heartbeat_overdue)(void *ud, gw_replica *r, uint64_t now);
} gw_hsched_ops;

/* The heap: r joins it (at NEVER, then gw_hsched_update), moves in it, leaves it. Only
 * joining allocates: -ENOMEM. */
int gw_hsched_add(pr_heap *h, gw_replica *r);
void gw_hsched_update(pr_heap *h, const gw_config *c, gw_replica *r);
void gw_hsched_remove(pr_heap *h, gw_replica *r);
/* The earliest moment anything is due (NEVER: nothing). */
uint64_t gw_hsched_earliest(const pr_heap *h);
/* Do what is due at now for every replica due, each once, the earliest first: its
 * heartbeats' limit, its probe's late verdict, its next probe (probes_ok 0: none is
 * started, as when shutting down). Returns how many probes turned late; *visited counts
 * the replicas visited (may be NULL). The cost is the replicas due, not the fleet. */
int gw_hsched_run(pr_heap *h, const gw_config *c, uint64_t now, int probes_ok,
                  const gw_hsched_ops *ops, void *ud, uint64_t *visited);

/* A good health probe of r took ms: its usual probe time and the variation of it, smoothed
 * as RFC 6298 smooths a round-trip time. late_ms > 0: the probe was found late at that
 * bound, and counts as at most twice it (a stall of seconds would otherwise raise the bound
 * past the timeout for the next ten probes; a tunnel that is really slower still raises it,
 * doubling at each late probe). */
void gw_hsched_probe_took(gw_replica *r, double ms, double late_ms);
/* After how many ms a probe in flight to r is late (health.late_s): late_s, or r's usual
 * probe time plus four times its variation when that is longer, so that a phone behind a
 * slow tunnel is not suspected for being as slow as usual. 0: never (late_s 0, or the
 * bound is not under timeout_s, when the probe fails first). */
double gw_hsched_probe_late_ms(const gw_replica *r, double late_s, double timeout_s);

#endif
