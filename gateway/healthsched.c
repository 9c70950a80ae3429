/* When health has something to do for each replica; see healthsched.h. */
#include "healthsched.h"

#include <math.h>
#include <stddef.h>

#define GW_HSCHED_GRID_MS 100

static gw_replica *replica_of(pr_heap_node *m) {
  return (gw_replica *)((char *)m - offsetof(gw_replica, health.health_at));
}

double gw_hsched_busy_interval_s(const gw_config *c) {
  double b = c->health_busy_interval_s;
  return b > 0 && b < c->health_interval_s ? b : c->health_interval_s;
}

double gw_hsched_idle_interval_s(const gw_config *c, size_t replicas) {
  double every = c->health_interval_s;
  if (every > 0 && c->health_idle_probes_per_s > 0) {
    double spread = (double)replicas / c->health_idle_probes_per_s;
    if (spread > every) every = spread;
  }
  return every;
}

uint64_t gw_hsched_probe_due(const gw_config *c, const gw_replica *r) {
  if (c->health_interval_s <= 0 || gw_replica_has(r, GW_HELD_REMOVED) || r->health.probing) return GW_HSCHED_NEVER;
  uint64_t due = r->health.next_probe_ms;
  if (r->inflight > 0 && r->state != GW_REPLICA_DOWN) {
    uint64_t busy = r->health.next_busy_probe_ms;
    uint64_t heard = r->health.alive_ms + r->health.busy_gap_ms;
    if (r->health.alive_ms && heard > busy) busy = heard;
    if (busy < due) due = busy;
  }
  return due;
}

/* The later of when r's probe went out and when r was last heard from. */
static uint64_t late_from(const gw_replica *r) {
  return r->health.alive_ms > r->health.probe_start_ms ? r->health.alive_ms : r->health.probe_start_ms;
}

uint64_t gw_hsched_late_at(const gw_config *c, const gw_replica *r) {
  if (!r->health.probing || !r->health.probe_start_ms || r->health.probe_late_ms) return GW_HSCHED_NEVER;
  double after = gw_hsched_probe_late_ms(r, c->health_late_s, c->health_timeout_s);
  if (after <= 0) return GW_HSCHED_NEVER;
  if (r->health.probe_due_ms) return r->health.probe_due_ms + 1;
  return late_from(r) + (uint64_t)ceil(after);
}

uint64_t gw_hsched_heartbeat_due(const gw_config *c, const gw_replica *r) {
  if (!r->report.last_heartbeat_ms || r->state == GW_REPLICA_DOWN) return GW_HSCHED_NEVER;
  /* overdue once more than the timeout has passed: the first whole millisecond past it */
  return r->report.last_heartbeat_ms + (uint64_t)floor(c->heartbeat_timeout_s * 1000) + 1;
}

uint64_t gw_hsched_next(const gw_config *c, const gw_replica *r) {
  uint64_t at = gw_hsched_probe_due(c, r), l = gw_hsched_late_at(c, r), h = gw_hsched_heartbeat_due(c, r);
  if (l < at) at = l;
  return h < at ? h : at;
}

void gw_hsched_probe_sent(gw_replica *r, uint64_t now, int timed) {
  r->health.probing = 1;
  r->health.probe_start_ms = timed ? now : 0;
  r->health.probe_late_ms = r->health.probe_due_ms = 0;
}

void gw_hsched_probe_over(gw_replica *r) {
  r->health.probing = 0;
  r->health.probe_start_ms = r->health.probe_late_ms = r->health.probe_due_ms = 0;
}

static uint64_t jittered(double seconds, uint16_t rnd) {
  double f = 0.8 + 0.4 * (double)rnd / 65535.0; /* 0.8 .. 1.2 */
  return (uint64_t)(seconds * 1000.0 * f);
}

void gw_hsched_probe_ended(const gw_config *c, gw_replica *r, uint64_t now, double every_s,
                           const uint16_t rnd[2]) {
  /* on a grid of GW_HSCHED_GRID_MS: the probes of a slot go out in one wake-up of the
   * gateway, and their answers come back in a few (their times are jittered already) */
  uint64_t at = now + jittered(every_s, rnd[0]);
  r->health.next_probe_ms = (at + GW_HSCHED_GRID_MS - 1) / GW_HSCHED_GRID_MS * GW_HSCHED_GRID_MS;
  double busy = gw_hsched_busy_interval_s(c);
  uint64_t gap = busy < every_s ? jittered(busy, rnd[1]) : r->health.next_probe_ms - now;
  r->health.busy_gap_ms = gap > UINT32_MAX ? UINT32_MAX : (uint32_t)gap;
  r->health.next_busy_probe_ms = now + r->health.busy_gap_ms;
}

void gw_hsched_heartbeat(gw_replica *r, int running) {
  if (running >= r->inflight) gw_replica_alive(r, r->report.last_heartbeat_ms);
}

int gw_hsched_late(const gw_config *c, gw_replica *r, uint64_t now) {
  if (!r->health.probing || !r->health.probe_start_ms || r->health.probe_late_ms) return 0;
  double after = gw_hsched_probe_late_ms(r, c->health_late_s, c->health_timeout_s);
  if (after <= 0) return 0;
  uint64_t from = late_from(r);
  if (now < from || (double)(now - from) < after) { /* exact: no slack, it is a verdict */
    r->health.probe_due_ms = 0; /* heard from since it was seen past its bound: counted from then */
    return 0;
  }
  if (!r->health.probe_due_ms || now <= r->health.probe_due_ms) {
    if (!r->health.probe_due_ms) r->health.probe_due_ms = now; /* judged at a later turn, after a poll */
    return 0;
  }
  r->health.probe_late_ms = now;
  return 1;
}

int gw_hsched_add(pr_heap *h, gw_replica *r) {
  return pr_heap_member(&r->health.health_at) ? 0 : pr_heap_set(h, &r->health.health_at, GW_HSCHED_NEVER);
}

void gw_hsched_update(pr_heap *h, const gw_config *c, gw_replica *r) {
  /* a member only moves: nothing is allocated, nothing can fail */
  if (pr_heap_member(&r->health.health_at)) (void)pr_heap_set(h, &r->health.health_at, gw_hsched_next(c, r));
}

void gw_hsched_remove(pr_heap *h, gw_replica *r) { pr_heap_remove(h, &r->health.health_at); }

uint64_t gw_hsched_earliest(const pr_heap *h) {
  const pr_heap_node *m = pr_heap_min(h);
  return m ? m->key : GW_HSCHED_NEVER;
}

int gw_hsched_run(pr_heap *h, const gw_config *c, uint64_t now, int probes_ok,
                  const gw_hsched_ops *ops, void *ud, uint64_t *visited) {
  int late = 0;
  /* each replica due is visited once: a visit leaves it due later, at the next
   * millisecond at the soonest (a late verdict waiting for a loop turn) */
  for (size_t left = h->n; left > 0; left--) {
    pr_heap_node *m = pr_heap_min(h);
    if (!m || m->key > now) break;
    gw_replica *r = replica_of(m);
    if (visited) (*visited)++;
    if (gw_hsched_heartbeat_due(c, r) <= now) ops->heartbeat_overdue(ud, r, now);
    if (r->health.probing) {
      if (gw_hsched_late(c, r, now)) {
        late++;
        ops->late(ud, r, now);
      }
    } else if (probes_ok && gw_hsched_probe_due(c, r) <= now) {
      (void)ops->probe(ud, r, now); /* it sets r's next probe when none could start */
    }
    gw_hsched_update(h, c, r);
    if (pr_heap_member(m) && m->key <= now) (void)pr_heap_set(h, m, now + 1);
  }
  return late;
}

double gw_hsched_probe_late_ms(const gw_replica *r, double late_s, double timeout_s) {
  double ms = late_s * 1000;
  if (ms <= 0) return 0;
  double usual = r->health.probe_srtt_ms + 4 * r->health.probe_rttvar_ms;
  if (r->health.probe_srtt_ms > 0 && usual > ms) ms = usual;
  return ms < timeout_s * 1000 ? ms : 0;
}

void gw_hsched_probe_took(gw_replica *r, double ms, double late_ms) {
  if (!(ms >= 0)) return;
  if (late_ms > 0 && ms > 2 * late_ms) ms = 2 * late_ms;
  if (r->health.probe_srtt_ms <= 0) {
    r->health.probe_srtt_ms = ms > 0.1 ? ms : 0.1; /* > 0: "a sample was taken" */
    r->health.probe_rttvar_ms = ms / 2;
    return;
  }
  r->health.probe_rttvar_ms = 0.75 * r->health.probe_rttvar_ms + 0.25 * fabs(r->health.probe_srtt_ms - ms);
  r->health.probe_srtt_ms = 0.875 * r->health.probe_srtt_ms + 0.125 * ms;
}
