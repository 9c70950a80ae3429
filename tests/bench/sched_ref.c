/* The planner as it was before it was made to scale (scheduler.c at the commit that added
 * this file): a plain scan of every replica for every request. The microbenchmark
 * (plan_bench.c) times it beside gw_sched_plan on the same fleets and checks that both
 * choose alike, field for field. Kept only as that reference; never linked into the
 * gateway. */
#include "sched_ref.h"

#include <stdlib.h>
#include <string.h>

/* Per replica during a pass: the times its usable slots become free, ascending. */
typedef struct plan_rep {
  int cap;
  int reserve;      /* slots batch work leaves free for interactive work (replica.h) */
  int suspect;      /* it failed its last health check: planned only when no other can */
  double slowdown;
  uint64_t *free_at;
  unsigned char *short_at; /* free_at[i] ends short work (a lease, or one planned in the pass) */
} plan_rep;

/* Sorts free_at ascending, and short_at with it. */
static void sort_slots(uint64_t *a, unsigned char *f, int n) {
  for (int i = 1; i < n; i++) {
    uint64_t v = a[i];
    unsigned char g = f[i];
    int j = i - 1;
    while (j >= 0 && a[j] > v) {
      a[j + 1] = a[j];
      f[j + 1] = f[j];
      j--;
    }
    a[j + 1] = v;
    f[j + 1] = g;
  }
}

static void plan_init(plan_rep *p, const gw_replica *r, uint64_t now, uint64_t short_ms) {
  p->cap = gw_replica_capacity(r, now);
  /* overrunning requests, and a hot phone's readings (device.h) */
  p->slowdown = gw_predict_slowdown(r, now);
  p->reserve = -1; /* worked out when a batch request first asks (its share) */
  p->suspect = gw_replica_suspect(r);
  if (p->cap <= 0) return;
  uint64_t ends[GW_MAX_SLOTS];
  unsigned char shorts[GW_MAX_SLOTS];
  int n = 0;
  for (int i = 0; i < GW_MAX_SLOTS; i++) {
    const gw_lease *l = &r->leases[i];
    if (!l->id) continue;
    shorts[n] = l->pred_end_ms > now && l->pred_end_ms - l->start_ms <= short_ms;
    ends[n++] = l->pred_end_ms > now ? l->pred_end_ms : now + (now - l->start_ms) / 4 + 1;
  }
  sort_slots(ends, shorts, n);
  int k = 0;
  for (int i = 0; i < p->cap - n; i++) {
    p->short_at[k] = 0;
    p->free_at[k++] = now;
  }
  for (int i = n > p->cap ? n - p->cap : 0; i < n; i++) {
    p->short_at[k] = shorts[i];
    p->free_at[k++] = ends[i];
  }
}

/* Slots of p free now. */
/* Whether r's own readings (battery, heat: device.h) hold back a slot it has free: it is
 * in rotation and runs fewer requests than its slots, but as many as its readings allow. */
static int device_holds(const gw_replica *r) {
  return r->dev.cap >= 0 && r->state == GW_REPLICA_READY && !gw_replica_draining(r) &&
         r->inflight >= r->dev.cap && r->inflight < r->slots;
}

static int free_slots(const plan_rep *p, uint64_t now) {
  int n = 0;
  while (n < p->cap && p->free_at[n] <= now) n++;
  return n;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The quick phones of a model in a pass: usable (a phone that failed its last health check
 * is not), serving it, reading prompts at or above
 * the median pace of those (the upper middle for an even count). The pace is as planned:
 * a hot phone, or one overrunning its predictions, is planned slower and is no quicker
 * than that (its kept slots would serve short work slowly). */
typedef struct quick_set {
  const char *model; /* NULL: not worked out yet */
  double min_tps;
  double q_a, q_b;   /* the least slowdown / rate of them: work short on the quickest is
                        what their kept slots are for */
} quick_set;

static double planned_tps(const plan_rep *p, const gw_replica *r) {
  return p->slowdown > 0 ? r->prefill_tps / p->slowdown : r->prefill_tps;
}

static void quick_init(quick_set *qs, const plan_rep *pr, gw_replica *const *replicas, size_t nr,
                       const char *model, double *scratch) {
  size_t k = 0;
  for (size_t j = 0; j < nr; j++)
    if (pr[j].cap > 0 && !pr[j].suspect && gw_replica_serves(replicas[j], model))
      scratch[k++] = planned_tps(&pr[j], replicas[j]);
  qsort(scratch, k, sizeof(*scratch), cmp_double);
  qs->model = model;
  qs->min_tps = k ? scratch[k / 2] : 0;
  int first = 1;
  for (size_t j = 0; j < nr; j++) {
    if (!(pr[j].cap > 0 && !pr[j].suspect && gw_replica_serves(replicas[j], model)) ||
        planned_tps(&pr[j], replicas[j]) < qs->min_tps)
      continue;
    double a = pr[j].slowdown / replicas[j]->prefill_tps, b = pr[j].slowdown / replicas[j]->decode_tps;
    if (first || a < qs->q_a) qs->q_a = a;
    if (first || b < qs->q_b) qs->q_b = b;
    first = 0;
  }
}

static int quick(const quick_set *qs, const plan_rep *p, const gw_replica *r, const char *model) {
  return p->cap > 0 && !p->suspect && planned_tps(p, r) >= qs->min_tps && gw_replica_serves(r, model);
}

/* How q's quick phones' slots stand for short work: the quick phones keep
 * q->short_reserve slots free or running short work (a guard's message on a kept slot
 * keeps it: the next slot that frees is not kept in its place), and at most a quarter of
 * their slots. Returns 2 when every free quick slot is kept (longer work may take none of
 * them) and so is every slot running short work, 1 when no slot is free but those running
 * short work are kept (longer work may not plan on them: they stay kept when they free), 0
 * when nothing is kept. */
static int short_kept(const quick_set *qs, const plan_rep *pr, gw_replica *const *replicas,
                      size_t nr, const gw_sched_req *q, uint64_t now) {
  int slots = 0, nfree = 0, nshort = 0;
  uint64_t short_ms = (uint64_t)(q->short_s * 1000.0);
  for (size_t j = 0; j < nr; j++) {
    const gw_replica *r = replicas[j];
    if (!quick(qs, &pr[j], r, q->model)) continue;
    slots += pr[j].cap;
    nfree += free_slots(&pr[j], now);
    for (int i = 0; i < GW_MAX_SLOTS; i++) {
      const gw_lease *l = &r->leases[i];
      if (l->id && l->pred_end_ms > now && l->pred_end_ms - l->start_ms <= short_ms) nshort++;
    }
  }
  int keep = q->short_reserve < slots / 4 ? q->short_reserve : slots / 4;
  if (keep <= 0 || nfree + nshort > keep) return 0;
  return nfree > 0 ? 2 : 1;
}

/* The wait weights of a pass (gw_sched_req.wait_weight_max): each request that asks and
 * is long interactive work gets its service on the usable phone quickest for it (over
 * all that fit when none is usable), worked out now, not at its arrival; then the
 * longest of its model sets its weight. Fills w[i]: 1 is plain; 0 while to be weighed. */
static void wait_weights(const plan_rep *pr, gw_replica *const *replicas, size_t nr,
                         const gw_sched_req *reqs, size_t n, double *w) {
  size_t asking = 0;
  for (size_t i = 0; i < n; i++) {
    const gw_sched_req *q = &reqs[i];
    w[i] = q->wait_weight_max > 1 && !q->batch && !q->take_free ? 0 : 1;
    asking += w[i] == 0;
  }
  /* one request alone is the longest of its model: no services to work out */
  double *svc = asking >= 2 ? calloc(n, sizeof(*svc)) : NULL;
  if (!svc) {
    for (size_t i = 0; i < n; i++) w[i] = 1;
    return;
  }
  for (size_t i = 0; i < n; i++) {
    if (w[i] != 0) continue;
    double best = -1, any = -1;
    for (size_t j = 0; j < nr; j++) {
      if (!gw_predict_fits(replicas[j], &reqs[i])) continue;
      double v = gw_predict_service_s(replicas[j], &reqs[i], pr[j].slowdown, NULL, NULL);
      if (any < 0 || v < any) any = v;
      if (pr[j].cap > 0 && (best < 0 || v < best)) best = v;
    }
    svc[i] = best >= 0 ? best : any;
    if (!(svc[i] > reqs[i].short_s)) w[i] = 1; /* short work, or none fits: plain */
  }
  for (size_t i = 0; i < n; i++) {
    if (w[i] != 0) continue;
    /* the first long request of its model: the model's longest, then each one's weight
     * (at least 1, so each is weighed once) */
    const char *model = reqs[i].model;
    double longest = 0;
    for (size_t k = i; k < n; k++)
      if (w[k] == 0 && svc[k] > longest && strcmp(reqs[k].model, model) == 0) longest = svc[k];
    for (size_t k = i; k < n; k++)
      if (w[k] == 0 && strcmp(reqs[k].model, model) == 0)
        w[k] = gw_sched_wait_weight(svc[k], longest, reqs[k].wait_weight_max);
  }
  free(svc);
}

void ref_sched_plan(gw_replica *const *replicas, size_t nr, const gw_sched_req *reqs, size_t n,
                   uint64_t now, gw_sched_choice *out) {
  plan_rep *pr = calloc(nr ? nr : 1, sizeof(*pr));
  uint64_t *times = calloc(nr ? nr * GW_MAX_SLOTS : 1, sizeof(uint64_t));
  unsigned char *shorts = calloc(nr ? nr * GW_MAX_SLOTS : 1, 1);
  if (!pr || !times || !shorts) {
    for (size_t i = 0; i < n; i++) out[i] = (gw_sched_choice){-1, 0, -1, 0, 0, 0, -1, -1, GW_WAIT_NONE};
    free(pr);
    free(times);
    free(shorts);
    return;
  }
  double short_s = 0;
  for (size_t i = 0; i < n; i++)
    if (reqs[i].short_s > short_s) short_s = reqs[i].short_s;
  for (size_t j = 0; j < nr; j++) {
    pr[j].free_at = times + j * GW_MAX_SLOTS;
    pr[j].short_at = shorts + j * GW_MAX_SLOTS;
    plan_init(&pr[j], replicas[j], now, (uint64_t)(short_s * 1000.0));
  }
  double *weights = calloc(n ? n : 1, sizeof(*weights));
  if (weights) wait_weights(pr, replicas, nr, reqs, n, weights);
  quick_set qs = {NULL, 0, 0, 0};
  double *scratch = NULL;
  for (size_t i = 0; i < n; i++) {
    const gw_sched_req *q = &reqs[i];
    gw_sched_choice best = {-1, 0, -1, 0, 0, 0, -1, -1, GW_WAIT_NONE};
    gw_sched_choice free_best = best; /* the best among replicas with a slot free now */
    gw_sched_choice explore = best;   /* the best among those never measured */
    /* the phone is chosen on wait x wait_weight + service; finish_s stays the plain time */
    double best_cost = 0, ww = weights ? weights[i] : 1;
    int best_slot = 0, pass_avoid = 0, pass_suspect = 0, any_suspect = 0, any_sound = 0, kept = 0;
    /* why it might wait while something is free (gw_sched_wait; counted, never decided on) */
    int any_fit = 0, kept_free = 0, held_free = 0;
    if (q->short_reserve > 0) {
      if (!qs.model || strcmp(qs.model, q->model) != 0) {
        if (!scratch) scratch = malloc((nr ? nr : 1) * sizeof(*scratch));
        if (scratch) quick_init(&qs, pr, replicas, nr, q->model, scratch);
      }
      if (qs.model && strcmp(qs.model, q->model) == 0) kept = short_kept(&qs, pr, replicas, nr, q, now);
    }
  again:
    for (size_t j = 0; j < nr; j++) {
      const gw_replica *r = replicas[j];
      if (!gw_predict_fits(r, q)) continue;
      if (device_holds(r)) held_free = 1;
      if (pr[j].cap <= 0) continue;
      any_fit = 1;
      if (!pass_avoid && q->avoid == r) continue;
      if (pr[j].suspect && !pass_suspect) {
        any_suspect = 1;
        if (free_slots(&pr[j], now) > 0) held_free = 1;
        continue;
      }
      if (!pr[j].suspect) any_sound = 1; /* batch work turned away here waits for it */
      double pre;
      int64_t cached;
      double svc = gw_predict_service_s(r, q, pr[j].slowdown, &pre, &cached);
      /* work that is not short leaves the quick phones' kept slots to short work: it plans
       * on the slot that frees after them here (when the pass took none of them), and not
       * on a slot running short work, which stays kept when it frees */
      int slot = 0;
      double out_t = q->expected_out < (double)q->max_tokens ? q->expected_out : (double)q->max_tokens;
      int short_here = !(svc > q->short_s) || (double)q->prompt_tokens * qs.q_a + out_t * qs.q_b <= q->short_s;
      if (kept && !short_here && quick(&qs, &pr[j], r, q->model)) {
        int nfree = free_slots(&pr[j], now);
        if (kept == 2 && nfree > 0) slot = nfree;
        while (slot < pr[j].cap && pr[j].short_at[slot]) slot++;
        if (nfree > 0 && slot >= nfree) kept_free = 1;
        if (slot >= pr[j].cap) continue;
      }
      /* batch work takes no slot interactive work is likely to want here soon: only the
       * free slots beyond the reserve, unless it is short enough to hold one back no
       * longer than batch_borrow_s */
      if (q->batch && pr[j].reserve < 0)
        pr[j].reserve = gw_replica_interactive_reserve(r, now, q->batch_reserve);
      if (q->batch) {
        int nfree = free_slots(&pr[j], now);
        if (nfree <= pr[j].reserve && !(nfree > 0 && svc <= q->batch_borrow_s)) {
          if (nfree > 0) held_free = 1;
          continue;
        }
      }
      double wait = (double)(pr[j].free_at[slot] - now) / 1000.0;
      double fin = wait + svc, cost = wait * ww + svc;
      if (best.replica < 0 || cost < best_cost) {
        best_cost = cost;
        best.replica = (int)j;
        best.finish_s = fin;
        best.service_s = svc;
        best.prefill_s = pre;
        best.cached_tokens = cached;
        best.now = pr[j].free_at[slot] <= now;
        best_slot = slot;
      }
      if (pr[j].free_at[slot] <= now && (best.alt_replica < 0 || fin < best.alt_finish_s)) {
        best.alt_replica = (int)j;
        best.alt_finish_s = fin;
        free_best = (gw_sched_choice){(int)j, 1, fin, svc, pre, cached, -1, -1, GW_WAIT_NONE};
      }
      if (pr[j].free_at[slot] <= now && gw_replica_unknown(r) &&
          (explore.replica < 0 || fin < explore.finish_s))
        explore = (gw_sched_choice){(int)j, 1, fin, svc, pre, cached, -1, -1, GW_WAIT_NONE};
    }
    if (best.replica < 0 && kept) {
      kept = 0; /* only a phone whose slots are kept can serve it: they are not kept from it */
      goto again;
    }
    if (best.replica < 0 && any_suspect && !pass_suspect && !(q->batch && any_sound)) {
      pass_suspect = 1; /* only phones that failed a health check can serve it: one of them */
      goto again;
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
      best_cost = best.finish_s;
      best_slot = 0;
    }
    if (q->explore > 0 && explore.replica >= 0 && best.replica != explore.replica &&
        explore.finish_s <= best_cost * (1 + q->explore) &&
        (!(q->short_s > 0) || explore.finish_s - best_cost <= q->short_s)) {
      /* little to lose (a share of the best finish, and no more than short work's time):
       * the phone nobody measured yet gets it, and is measured */
      explore.alt_replica = best.alt_replica;
      explore.alt_finish_s = best.alt_finish_s;
      best = explore;
      best_slot = 0;
    }
    if (best.replica < 0)
      best.wait = held_free ? GW_WAIT_HELD : any_fit ? GW_WAIT_BUSY : GW_WAIT_NO_PHONE;
    else if (!best.now)
      best.wait = kept_free              ? GW_WAIT_KEPT
                  : best.alt_replica >= 0 ? GW_WAIT_FASTER
                  : held_free             ? GW_WAIT_HELD
                                          : GW_WAIT_BUSY;
    if (best.replica >= 0) {
      plan_rep *p = &pr[best.replica];
      uint64_t start = p->free_at[best_slot] > now ? p->free_at[best_slot] : now;
      p->free_at[best_slot] = start + (uint64_t)(best.service_s * 1000.0) + 1;
      p->short_at[best_slot] = q->short_s > 0 && best.service_s <= q->short_s;
      sort_slots(p->free_at, p->short_at, p->cap);
    }
    out[i] = best;
  }
  free(scratch);
  free(weights);
  free(pr);
  free(times);
  free(shorts);
}
