/* The finish-soonest planner; see scheduler.h. */
#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

int gw_sched_fits(const gw_replica *r, const gw_sched_req *q) {
  if (!gw_replica_serves(r, q->model)) return 0;
  if (r->n_ctx > 0 && q->prompt_tokens + q->max_tokens > r->n_ctx) return 0;
  return 1;
}

double gw_sched_service_s(const gw_replica *r, const gw_sched_req *q, double slowdown,
                          double *prefill_s, int64_t *cached) {
  int64_t c = gw_replica_cached_tokens(r, q->blocks, q->n_blocks);
  if (c >= q->prompt_tokens) c = q->prompt_tokens - 1;
  if (c < 0) c = 0;
  double pre = (double)(q->prompt_tokens - c) / r->prefill_tps * slowdown;
  double out = q->expected_out;
  if (out > (double)q->max_tokens) out = (double)q->max_tokens;
  double dec = out / r->decode_tps * slowdown;
  if (prefill_s) *prefill_s = pre;
  if (cached) *cached = c;
  return pre + dec;
}

/* Per replica during a pass: the times its usable slots become free, ascending. */
typedef struct plan_rep {
  int cap;
  int reserve;      /* slots batch work leaves free for interactive work (replica.h) */
  double slowdown;
  uint64_t *free_at;
} plan_rep;

static void sort_u64(uint64_t *a, int n) {
  for (int i = 1; i < n; i++) {
    uint64_t v = a[i];
    int j = i - 1;
    while (j >= 0 && a[j] > v) {
      a[j + 1] = a[j];
      j--;
    }
    a[j + 1] = v;
  }
}

static void plan_init(plan_rep *p, const gw_replica *r, uint64_t now) {
  p->cap = gw_replica_capacity(r, now);
  /* overrunning requests, and a hot phone's readings (device.h) */
  p->slowdown = gw_replica_slowdown(r, now) * gw_replica_device_slowdown(r);
  p->reserve = -1; /* worked out when a batch request first asks (its share) */
  if (p->cap <= 0) return;
  uint64_t ends[GW_MAX_SLOTS];
  int n = 0;
  for (int i = 0; i < GW_MAX_SLOTS; i++) {
    const gw_lease *l = &r->leases[i];
    if (!l->id) continue;
    ends[n++] = l->pred_end_ms > now ? l->pred_end_ms : now + (now - l->start_ms) / 4 + 1;
  }
  sort_u64(ends, n);
  int k = 0;
  for (int i = 0; i < p->cap - n; i++) p->free_at[k++] = now;
  for (int i = n > p->cap ? n - p->cap : 0; i < n; i++) p->free_at[k++] = ends[i];
}

/* Slots of p free now. */
static int free_slots(const plan_rep *p, uint64_t now) {
  int n = 0;
  while (n < p->cap && p->free_at[n] <= now) n++;
  return n;
}

void gw_sched_plan(gw_replica *const *replicas, size_t nr, const gw_sched_req *reqs, size_t n,
                   uint64_t now, gw_sched_choice *out) {
  plan_rep *pr = calloc(nr ? nr : 1, sizeof(*pr));
  uint64_t *times = calloc(nr ? nr * GW_MAX_SLOTS : 1, sizeof(uint64_t));
  if (!pr || !times) {
    for (size_t i = 0; i < n; i++) out[i] = (gw_sched_choice){-1, 0, -1, 0, 0, 0, -1, -1};
    free(pr);
    free(times);
    return;
  }
  for (size_t j = 0; j < nr; j++) {
    pr[j].free_at = times + j * GW_MAX_SLOTS;
    plan_init(&pr[j], replicas[j], now);
  }
  for (size_t i = 0; i < n; i++) {
    const gw_sched_req *q = &reqs[i];
    gw_sched_choice best = {-1, 0, -1, 0, 0, 0, -1, -1};
    gw_sched_choice free_best = best; /* the best among replicas with a slot free now */
    gw_sched_choice explore = best;   /* the best among those never measured */
    int pass_avoid = 0;
  again:
    for (size_t j = 0; j < nr; j++) {
      const gw_replica *r = replicas[j];
      if (pr[j].cap <= 0 || !gw_sched_fits(r, q)) continue;
      if (!pass_avoid && q->avoid == r) continue;
      double pre;
      int64_t cached;
      double svc = gw_sched_service_s(r, q, pr[j].slowdown, &pre, &cached);
      /* batch work takes no slot interactive work is likely to want here soon: only the
       * free slots beyond the reserve, unless it is short enough to hold one back no
       * longer than batch_borrow_s */
      if (q->batch && pr[j].reserve < 0)
        pr[j].reserve = gw_replica_interactive_reserve(r, now, q->batch_reserve);
      if (q->batch) {
        int nfree = free_slots(&pr[j], now);
        if (nfree <= pr[j].reserve && !(nfree > 0 && svc <= q->batch_borrow_s)) continue;
      }
      double wait = (double)(pr[j].free_at[0] - now) / 1000.0;
      double fin = wait + svc;
      if (best.replica < 0 || fin < best.finish_s) {
        best.replica = (int)j;
        best.finish_s = fin;
        best.service_s = svc;
        best.prefill_s = pre;
        best.cached_tokens = cached;
        best.now = pr[j].free_at[0] <= now;
      }
      if (pr[j].free_at[0] <= now && (best.alt_replica < 0 || fin < best.alt_finish_s)) {
        best.alt_replica = (int)j;
        best.alt_finish_s = fin;
        free_best = (gw_sched_choice){(int)j, 1, fin, svc, pre, cached, -1, -1};
      }
      if (pr[j].free_at[0] <= now && !gw_replica_measured(r) &&
          (explore.replica < 0 || fin < explore.finish_s))
        explore = (gw_sched_choice){(int)j, 1, fin, svc, pre, cached, -1, -1};
    }
    if (best.replica < 0 && q->avoid && !pass_avoid) {
      pass_avoid = 1; /* only the replica that failed can serve it: allow it again */
      goto again;
    }
    if (q->take_free && !best.now && free_best.replica >= 0) {
      /* throughput work: a free phone now beats a sooner finish later */
      free_best.alt_replica = best.alt_replica;
      free_best.alt_finish_s = best.alt_finish_s;
      best = free_best;
    }
    if (q->explore > 0 && explore.replica >= 0 && best.replica != explore.replica &&
        explore.finish_s <= best.finish_s * (1 + q->explore)) {
      /* little to lose: the phone nobody measured yet gets it, and is measured */
      explore.alt_replica = best.alt_replica;
      explore.alt_finish_s = best.alt_finish_s;
      best = explore;
    }
    if (best.replica >= 0) {
      plan_rep *p = &pr[best.replica];
      uint64_t start = p->free_at[0] > now ? p->free_at[0] : now;
      p->free_at[0] = start + (uint64_t)(best.service_s * 1000.0) + 1;
      sort_u64(p->free_at, p->cap);
    }
    out[i] = best;
  }
  free(pr);
  free(times);
}
