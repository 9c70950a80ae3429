/* The finish-soonest planner; see scheduler.h. */
#include "scheduler.h"

#include "oai.h"
#include "order.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const char *const gw_sched_wait_names[GW_WAIT_COUNT] = {
    "", "busy", "faster_phone", "kept_for_short_work", "held_back", "no_phone"};

double gw_sched_wait_weight(double svc_s, double longest_s, double max) {
  if (!(svc_s > 0) || !(longest_s > svc_s) || !(max > 1)) return 1;
  double w = longest_s / svc_s;
  return w < max ? w : max;
}

void gw_sched_best(gw_replica *const *replicas, size_t nr, const gw_sched_req *q, uint64_t now,
                   double *svc_best, double *fin_best, int *guess) {
  double svc_any = -1;
  *svc_best = *fin_best = -1;
  *guess = 0;
  for (size_t i = 0; i < nr; i++) {
    const gw_replica *r = replicas[i];
    if (!gw_predict_fits(r, q)) continue;
    /* as the plan sees it: a hot phone's slowdown too, and a phone that takes no work now
     * at its own pace */
    gw_prediction p = gw_predict(r, q, now);
    double svc = p.service_s;
    if (svc_any < 0 || svc < svc_any) svc_any = svc;
    if (p.capacity <= 0) continue;
    if (!r->prefill_samples || !r->decode_samples) *guess = 1;
    double fin = p.finish_s;
    if (*svc_best < 0 || svc < *svc_best) *svc_best = svc;
    if (*fin_best < 0 || fin < *fin_best) *fin_best = fin;
  }
  if (*svc_best < 0) *svc_best = svc_any;
}

/* Models with fewer usable phones than this are walked whole: a walk is cheaper there than
 * the search's bookkeeping. */
#define PLAN_WALK_MAX 24 /* gw_sched_walk_max may set another */

/* ---- the planner's memory: one arena, kept from pass to pass --------------------------- */

/* What a pass allocates comes from chunks kept between passes (a pass at thousands of phones
 * would otherwise ask the allocator for megabytes each time); the marks of which phones a
 * search met live as long as the context. */
typedef struct arena_chunk {
  struct arena_chunk *next;
  size_t cap, used;
  max_align_t data[];
} arena_chunk;

/* A model's usable phones by a and by b as the last pass that searched it sorted them: the
 * next pass starts its sort from there (pr_order_ints), which costs O(phones) when few
 * phones' rates or slowdowns moved, instead of sorting thousands of phones afresh. The
 * orders are by replica index with the index breaking ties -- a total order, so the result
 * is the one a sort from scratch gives, whatever the start (a replica array that changed
 * between passes only makes the start a worse guess). */
typedef struct sched_order {
  char *model;             /* NULL: a free entry */
  int *a, *b;
  size_t n, cap;
  uint64_t used;           /* the pass that last read it: the oldest goes first */
} sched_order;
#define SCHED_ORDERS 16

struct gw_sched {
  arena_chunk *chunks;
  size_t peak;             /* bytes the largest pass used: one chunk of that from then on */
  unsigned *mark, *cmark;  /* per replica: the search that met it, and that found its cache */
  size_t n_mark;
  unsigned stamp;
  size_t walk_max;         /* models with at most this many usable phones are walked whole */
  sched_order orders[SCHED_ORDERS];
  uint64_t passes;
};

gw_sched *gw_sched_new(void) {
  gw_sched *c = calloc(1, sizeof(gw_sched));
  if (c) c->walk_max = PLAN_WALK_MAX;
  return c;
}

void gw_sched_walk_max(gw_sched *c, size_t n) { c->walk_max = n; }

static void arena_free(arena_chunk *c) {
  while (c) {
    arena_chunk *next = c->next;
    free(c);
    c = next;
  }
}

void gw_sched_free(gw_sched *c) {
  if (!c) return;
  for (size_t i = 0; i < SCHED_ORDERS; i++) {
    free(c->orders[i].model);
    free(c->orders[i].a);
    free(c->orders[i].b);
  }
  arena_free(c->chunks);
  free(c->mark);
  free(c->cmark);
  free(c);
}

static void *arena_alloc(gw_sched *c, size_t n) {
  n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  if (!n) n = sizeof(max_align_t);
  arena_chunk *k = c->chunks;
  if (!k || k->cap - k->used < n) {
    size_t cap = n > c->peak ? n : c->peak;
    if (cap < (1u << 16)) cap = 1u << 16;
    k = malloc(sizeof(*k) + cap);
    if (!k) return NULL;
    k->cap = cap;
    k->used = 0;
    k->next = c->chunks;
    c->chunks = k;
  }
  void *p = (char *)k->data + k->used;
  k->used += n;
  return p;
}

static void *arena_zalloc(gw_sched *c, size_t n) {
  void *p = arena_alloc(c, n);
  if (p) memset(p, 0, n);
  return p;
}

/* The pass is over: everything it allocated goes at once; a pass that needed more than one
 * chunk leaves one chunk of all it used for the next. */
static void arena_reset(gw_sched *c) {
  size_t used = 0;
  int n = 0;
  for (arena_chunk *k = c->chunks; k; k = k->next, n++) used += k->used;
  if (used > c->peak) c->peak = used;
  if (n > 1) {
    arena_free(c->chunks);
    c->chunks = NULL;
  } else if (c->chunks) {
    c->chunks->used = 0;
  }
}

/* ---- a pass's state ------------------------------------------------------------------- */

/* Per replica during a pass: the times its usable slots become free, ascending. */
typedef struct plan_rep {
  int cap;
  int reserve;      /* slots batch work leaves free for interactive work (replica.h) */
  int suspect;      /* it failed its last health check: planned only when no other can */
  double slowdown;
  double a, b;      /* slowdown / prefill rate, slowdown / decode rate: a lower bound of a
                       request's service here is prompt x a + answer x b (no cache) */
  double prefill_tps, decode_tps; /* the replica's, kept here with what else a search reads */
  int64_t n_ctx;
  int unknown;      /* gw_replica_unknown */
  int hybrid;       /* its prompt cache restores checkpoints (pcache.h): what it finds cached
                       is counted in learned tokens, not in blocks */
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
  /* p->cap: gw_replica_capacity, worked out by the caller (it lays the slots out by it) */
  /* overrunning requests, and a hot phone's readings (device.h) */
  p->slowdown = gw_predict_slowdown(r, now);
  p->a = p->slowdown / r->prefill_tps;
  p->b = p->slowdown / r->decode_tps;
  p->prefill_tps = r->prefill_tps;
  p->decode_tps = r->decode_tps;
  p->n_ctx = r->n_ctx;
  p->unknown = gw_replica_unknown(r);
  p->hybrid = r->pc.hybrid;
  p->reserve = -1; /* worked out when a batch request first asks (its share) */
  p->suspect = gw_replica_suspect(r);
  if (p->cap <= 0) return;
  uint64_t ends[GW_MAX_SLOTS];
  unsigned char shorts[GW_MAX_SLOTS];
  int n = 0;
  for (int i = 0; i < GW_MAX_SLOTS && n < r->inflight; i++) {
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
static int free_slots(const plan_rep *p, uint64_t now) {
  int n = 0;
  while (n < p->cap && p->free_at[n] <= now) n++;
  return n;
}

/* Whether r's own readings (battery, heat: device.h) hold back a slot it has free: it is
 * in rotation and runs fewer requests than its slots, but as many as its readings allow. */
static int device_holds(const gw_replica *r) {
  return r->dev.cap >= 0 && r->state == GW_REPLICA_READY && !gw_replica_draining(r) &&
         r->inflight >= r->dev.cap && r->inflight < r->slots;
}

static double planned_tps(const plan_rep *p, const gw_replica *r) {
  return p->slowdown > 0 ? r->prefill_tps / p->slowdown : r->prefill_tps;
}

/* The earliest ends of the quick phones' slots busy with longer work a pass keeps: a free
 * kept slot may be left to longer work when the next of them free soon (short_kept). */
#define PLAN_KEEP_ENDS 16

/* One model of a pass: its phones, and the indexes the search reads. Made when the pass
 * first meets a request for it; the phones' order is the replica array's. */
typedef struct plan_model {
  const char *name;
  int *all;            /* every replica serving it, ascending */
  size_t n_all;
  int *use;            /* of them, those that may take work now (cap > 0) */
  size_t n_use;
  int *by_a, *by_b;    /* use, by a and by b ascending (the search's sorted lists) */
  int *fa, *fb;        /* those with a slot free at the pass's start, by a and by b */
  int *fa_next, *fb_next; /* links past the ones that have no slot free any more */
  size_t n_free;
  int *ua, *ub, *ua_next, *ub_next; /* the same of those never measured (explored) */
  size_t n_unknown;
  /* the phones in groups of like prefill pace (by a, about the square root of their number
   * each), those with no slot free now in a min-heap per group on when one frees: a
   * group's phones cost a request at least wait x weight + prompt x min a + answer x min b */
  struct plan_group {
    int *h;            /* the heap (a slice of heaps) */
    size_t n;
    double min_a, min_b;
  } *groups;
  size_t n_groups;
  int *heaps;
  int *gof;            /* each replica's group (nr long) */
  int *hpos;           /* each replica's place in its group's heap; -1: a slot free now, -2:
                          not usable for the model (nr long) */
  /* the quick phones (slots kept for short work), worked out when a request asks */
  int quick_ready;
  double min_tps;      /* quick: usable, not suspect, planned prefill at least this */
  unsigned char *quick; /* per replica (nr long) */
  int q_slots, q_free; /* their slots, and of them free now in the pass */
  double q_a, q_b;     /* the least a and b of them: a request whose prompt x q_a + answer x
                          q_b is at most short_s is short work on the quickest of them */
  uint64_t q_ends[PLAN_KEEP_ENDS]; /* when their slots busy with longer work free, earliest
                                       first (the first n_ends of them) */
  int n_ends;
  uint64_t q_short_ms; /* the short_s the count below is for (~0: none yet) */
  int q_short;         /* leases running short work on them */
  /* the first fingerprint each usable phone's prompt cache holds, sorted: a request can find
   * cached tokens only on the phones listed under its own first fingerprint */
  struct cache_entry {
    uint64_t fp;
    int j, k;             /* replica j's slot k... */
    const uint64_t *sb;   /* ...its fingerprints and how many (the slot's own, borrowed) */
    size_t sn;
    size_t common;        /* the leading blocks it shares with the bucket's last request */
    const uint64_t *qb;   /* (in a bucket's first entry) that request's fingerprints... */
    size_t qn;            /* ...and how many */
  } *cache;
  size_t n_cache;
  int cache_ready;
  /* scratch for one request: the phones of its bucket, each with a lower bound of its cost
   * (bucket_bounds), as many as the entries at most */
  struct bucket_phone {
    double lb;      /* wait for its first slot x weight + service with the most it may hold
                       cached; its service alone for a phone with a slot free */
    int j;
    size_t i, next; /* its entries of the bucket [i, next) */
    int done;       /* considered already */
  } *bp;
  /* for why its requests wait (gw_sched_wait: counted, never decided on) */
  unsigned char *member; /* per replica (nr long): usable for it (in use) */
  int free_now;          /* of use, phones with a slot free in the pass, kept up to date */
  int *held;             /* of all, phones whose own readings hold a free slot back */
  size_t n_held;
  int64_t ctx_max;       /* the largest context of use (INT64_MAX: one not known) */
} plan_model;

/* The quick phones of a model in a pass: usable (a phone that failed its last health check
 * is not), serving it, reading prompts at or above the median pace of those (the upper
 * middle for an even count). The pace is as planned: a hot phone, or one overrunning its
 * predictions, is planned slower and is no quicker than that (its kept slots would serve
 * short work slowly). */
static int quick_init(gw_sched *ctx, plan_model *m, const plan_rep *pr, gw_replica *const *replicas,
                      uint64_t now, size_t nr) {
  double *v = arena_alloc(ctx, (m->n_use ? m->n_use : 1) * sizeof(*v));
  m->quick = arena_zalloc(ctx, nr ? nr : 1);
  if (!v || !m->quick) return -1;
  size_t k = 0;
  for (size_t i = 0; i < m->n_use; i++) {
    int j = m->use[i];
    if (!pr[j].suspect) v[k++] = planned_tps(&pr[j], replicas[j]);
  }
  m->min_tps = k ? pr_select_double(v, k, k / 2) : 0; /* the sorted v[k / 2] */
  for (size_t i = 0; i < m->n_use; i++) {
    int j = m->use[i];
    if (pr[j].suspect || planned_tps(&pr[j], replicas[j]) < m->min_tps) continue;
    if (!m->q_slots || pr[j].a < m->q_a) m->q_a = pr[j].a;
    if (!m->q_slots || pr[j].b < m->q_b) m->q_b = pr[j].b;
    m->quick[j] = 1;
    m->q_slots += pr[j].cap;
    m->q_free += free_slots(&pr[j], now);
    for (int s = 0; s < pr[j].cap; s++) {
      uint64_t e = pr[j].free_at[s];
      if (e <= now || pr[j].short_at[s]) continue;
      /* the earliest PLAN_KEEP_ENDS, in order: a later one than all kept is dropped */
      if (m->n_ends == PLAN_KEEP_ENDS && e >= m->q_ends[PLAN_KEEP_ENDS - 1]) continue;
      int at = m->n_ends < PLAN_KEEP_ENDS ? m->n_ends++ : PLAN_KEEP_ENDS - 1;
      for (; at > 0 && m->q_ends[at - 1] > e; at--) m->q_ends[at] = m->q_ends[at - 1];
      m->q_ends[at] = e;
    }
  }
  m->q_short_ms = UINT64_MAX;
  m->quick_ready = 1;
  return 0;
}

/* How q's quick phones' slots stand for short work: the quick phones keep
 * q->short_reserve slots free or running short work (a guard's message on a kept slot
 * keeps it: the next slot that frees is not kept in its place), and at most a quarter of
 * their slots. Returns 2 when every free quick slot is kept (longer work may take none of
 * them) and so is every slot running short work, 1 when no slot is free but those running
 * short work are kept (longer work may not plan on them: they stay kept when they free), 0
 * when nothing is kept. The counts are the pass's, kept up to date as it reserves slots. */
static int short_kept(plan_model *m, gw_replica *const *replicas, const gw_sched_req *q,
                      uint64_t now) {
  uint64_t short_ms = (uint64_t)(q->short_s * 1000.0);
  if (m->q_short_ms != short_ms) { /* running short work, by the leases: fixed in a pass */
    m->q_short = 0;
    for (size_t i = 0; i < m->n_use; i++) {
      const gw_replica *r = replicas[m->use[i]];
      if (!m->quick[m->use[i]]) continue;
      for (int k = 0, seen = 0; k < GW_MAX_SLOTS && seen < r->inflight; k++) {
        const gw_lease *l = &r->leases[k];
        if (!l->id) continue;
        seen++;
        if (l->pred_end_ms > now && l->pred_end_ms - l->start_ms <= short_ms) m->q_short++;
      }
    }
    m->q_short_ms = short_ms;
  }
  int keep = q->short_reserve < m->q_slots / 4 ? q->short_reserve : m->q_slots / 4;
  if (keep <= 0 || m->q_free + m->q_short > keep) return 0;
  if (m->q_free <= 0) return 1;
  /* The free kept slots idle only for short work that comes before a quick slot busy with
   * longer work frees to take it in their place: the q_free-th such slot frees in t, and a
   * short request that comes after t - short_s waits at most short_s for it. When one
   * comes before that no likelier than short_wait_p (the chance the slots are sized to),
   * 1 - exp(-rate x (t - short_s)) <= p, keeping them finishes nothing sooner: longer
   * work may take them. */
  if (q->short_rate > 0 && q->short_wait_p > 0 && q->short_wait_p < 1 && m->q_free <= m->n_ends) {
    double t = (double)(m->q_ends[m->q_free - 1] - now) / 1000.0 - q->short_s;
    if (q->short_rate * (t > 0 ? t : 0) <= -log1p(-q->short_wait_p)) return 0;
  }
  return 2;
}

/* ---- the heap of when each phone's next slot frees ----------------------------------- */

typedef struct plan_group plan_group;

static int heap_less(const plan_rep *pr, const int *h, size_t x, size_t y) {
  uint64_t a = pr[h[x]].free_at[0], b = pr[h[y]].free_at[0];
  return a < b || (a == b && h[x] < h[y]);
}

static void heap_swap(plan_group *g, int *hpos, size_t x, size_t y) {
  int t = g->h[x];
  g->h[x] = g->h[y];
  g->h[y] = t;
  hpos[g->h[x]] = (int)x;
  hpos[g->h[y]] = (int)y;
}

static void heap_up(plan_group *g, int *hpos, const plan_rep *pr, size_t x) {
  while (x > 0 && heap_less(pr, g->h, x, (x - 1) / 2)) {
    heap_swap(g, hpos, x, (x - 1) / 2);
    x = (x - 1) / 2;
  }
}

static void heap_down(plan_group *g, int *hpos, const plan_rep *pr, size_t x) {
  for (;;) {
    size_t l = 2 * x + 1, r = l + 1, s = x;
    if (l < g->n && heap_less(pr, g->h, l, s)) s = l;
    if (r < g->n && heap_less(pr, g->h, r, s)) s = r;
    if (s == x) return;
    heap_swap(g, hpos, x, s);
    x = s;
  }
}

/* ---- the search: ordered steps that decide whether a phone may take a request ------- */

/* One request's search, as one walk of the candidates would see them. */
/* No phone: what a search starts from, and a plan that could not be made. */
#define CHOICE_NONE ((gw_sched_choice){-1, 0, -1, 0, 0, 0, -1, -1, GW_WAIT_NONE})

typedef struct search {
  const gw_sched_req *q;
  const struct plan_model *m; /* its model in the pass */
  double ww;                /* its wait weight */
  double out_tokens;        /* min(expected_out, max_tokens) */
  int kept, pass_avoid, pass_suspect, any_suspect, any_sound;
  int cache_known;          /* the phones its first fingerprint is cached on are marked
                               (plan.cmark): any other holds none of its prompt */
  int known_j;              /* a phone whose cached tokens for it are worked out already
                               (-1: none)... */
  int64_t known_cached;     /* ...and they */
  gw_sched_choice best;     /* the least cost; ties: the lowest index */
  double best_cost;
  int best_slot;
  gw_sched_choice free_best; /* the earliest finish among phones with a slot free now */
  gw_sched_choice explore;   /* ...among those never measured */
  uint64_t start_by_ms;      /* only phones whose slots free within this (step_start_by; 0:
                                any) */
} search;

typedef struct plan {
  gw_sched *ctx;
  gw_replica *const *replicas;
  size_t nr;
  plan_rep *pr;
  uint64_t now;
  unsigned *mark;           /* the search that last looked at each replica */
  unsigned *cmark;          /* ...and that found its first fingerprint in its cache */
  unsigned stamp;
  plan_model **models;      /* the models met in the pass, each made when first met */
  size_t n_models;
  int walk_all;             /* every model is walked (batch requests of the pass read the
                               batch room with different shares: step_batch_room) */
  double *lb;               /* scratch: each group's bound for one request */
  uint64_t *times;          /* every replica's free_at, one after the other... */
  uint64_t *free0;          /* ...and as the pass found them (NULL: no request fills idle
                               phones) */
} plan;

/* A phone the request could be planned on, as the steps fill it in. */
typedef struct cand {
  int j, slot;
  int last;         /* the last of the slots it takes: slot + choices - 1 (step_choices) */
  double svc, pre;
  int64_t cached;
} cand;

/* The steps, in order; each returns 0 to turn the phone away. */

/* Its context holds prompt + cap, and its engine serves what the request needs (the
 * search meets only phones that serve the model and may take work now). */
static int fits_here(const plan *p, const gw_sched_req *q, int j) {
  const plan_rep *r = &p->pr[j];
  if (r->n_ctx > 0 && q->prompt_tokens + q->max_tokens > r->n_ctx) return 0;
  return !(q->needs || q->choices > 1) || gw_replica_serves_features(p->replicas[j], q->needs, q->choices);
}

static int step_fits(const plan *p, search *s, cand *c) { return fits_here(p, s->q, c->j); }

/* Not the phone the request just failed on, while another can take it. */
static int step_avoid(const plan *p, search *s, cand *c) {
  return s->pass_avoid || s->q->avoid != p->replicas[c->j];
}

/* Not a phone that failed its last health check, while a sound one can take it. */
static int step_suspect(const plan *p, search *s, cand *c) {
  if (p->pr[c->j].suspect && !s->pass_suspect) {
    s->any_suspect = 1;
    return 0;
  }
  if (!p->pr[c->j].suspect) s->any_sound = 1; /* batch work turned away here waits for it */
  return 1;
}

/* What it would take: the one prediction (predict.h) at the pass's slowdown. */
static int step_service(const plan *p, search *s, cand *c) {
  if (c->j == s->known_j)
    c->svc = gw_predict_service_rates_s(p->pr[c->j].prefill_tps, p->pr[c->j].decode_tps, s->q,
                                        p->pr[c->j].slowdown, s->known_cached, &c->pre, &c->cached);
  else if (s->cache_known && p->cmark[c->j] != p->stamp)
    c->svc = gw_predict_service_rates_s(p->pr[c->j].prefill_tps, p->pr[c->j].decode_tps, s->q,
                                        p->pr[c->j].slowdown, 0, &c->pre, &c->cached);
  else
    c->svc = gw_predict_service_s(p->replicas[c->j], s->q, p->pr[c->j].slowdown, &c->pre, &c->cached);
  c->slot = 0;
  return 1;
}

/* Whether q is the short work the quick phones keep slots for: short on this phone, or on
 * the quickest of them (a guard's message that takes a little over short_s on a quick
 * phone of median pace is still what the slot there is kept for). */
static int kept_for(const plan_model *m, const gw_sched_req *q, double svc, double out_tokens) {
  return !(svc > q->short_s) || (double)q->prompt_tokens * m->q_a + out_tokens * m->q_b <= q->short_s;
}

/* Work that is not short leaves the quick phones' kept slots to short work: it plans on the
 * slot that frees after them here (when the pass took none of them), and not on a slot
 * running short work, which stays kept when it frees. */
/* The slot longer work plans on at a quick phone whose slots are kept (short_kept's
 * answer): past the free ones when all of them are kept, and past any running short work;
 * r->cap when none is left to it. */
static int kept_slot(const plan_rep *r, int kept, int nfree) {
  int slot = kept == 2 && nfree > 0 ? nfree : 0;
  while (slot < r->cap && r->short_at[slot]) slot++;
  return slot;
}

static int step_kept_slots(const plan *p, search *s, cand *c) {
  const plan_rep *r = &p->pr[c->j];
  if (!s->kept || !s->m->quick[c->j] || kept_for(s->m, s->q, c->svc, s->out_tokens)) return 1;
  c->slot = kept_slot(r, s->kept, free_slots(r, p->now));
  return c->slot < r->cap;
}

/* Batch work takes no slot interactive work is likely to want here soon: only the free
 * slots beyond the reserve, unless it is short enough to hold one back no longer than
 * batch_borrow_s. */
static int step_batch_room(const plan *p, search *s, cand *c) {
  if (!s->q->batch) return 1;
  plan_rep *r = &p->pr[c->j];
  if (r->reserve < 0) r->reserve = gw_replica_interactive_reserve(p->replicas[c->j], p->now, s->q->batch_reserve);
  int nfree = free_slots(r, p->now), k = s->q->choices > 1 ? s->q->choices : 1;
  return !(nfree - (k - 1) <= r->reserve && !(nfree >= k && c->svc <= s->q->batch_borrow_s));
}

/* A request of several choices ("n") takes as many slots of the phone at once: from the
 * slot the steps before chose, it starts when the last of them frees. A phone of fewer
 * usable slots cannot take it now. */
static int step_choices(const plan *p, search *s, cand *c) {
  c->last = c->slot + (s->q->choices > 1 ? s->q->choices - 1 : 0);
  return c->last < p->pr[c->j].cap;
}

/* Its slots free in time to start it (search.start_by_ms: a request near its deadline in
 * the queue). */
static int step_start_by(const plan *p, search *s, cand *c) {
  return !s->start_by_ms || p->pr[c->j].free_at[c->last] <= p->now + s->start_by_ms;
}

typedef int (*plan_step)(const plan *p, search *s, cand *c);
static const plan_step steps[] = {step_fits, step_avoid, step_suspect, step_service,
                                  step_kept_slots, step_batch_room, step_choices, step_start_by};

/* The score: the phone is chosen on wait x wait_weight + service (finish_s stays the plain
 * time); ties go to the lowest index, as a walk in order would leave them. The best phone
 * free now, and the best free one never measured, are kept beside it. */
static void consider(const plan *p, search *s, int j) {
  cand c = {.j = j};
  for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++)
    if (!steps[k](p, s, &c)) return;
  const plan_rep *r = &p->pr[j];
  double wait = (double)(r->free_at[c.last] - p->now) / 1000.0;
  double fin = wait + c.svc, cost = wait * s->ww + c.svc;
  if (s->best.replica < 0 || cost < s->best_cost || (cost == s->best_cost && j < s->best.replica)) {
    s->best_cost = cost;
    s->best.replica = j;
    s->best.finish_s = fin;
    s->best.service_s = c.svc;
    s->best.prefill_s = c.pre;
    s->best.cached_tokens = c.cached;
    s->best.now = r->free_at[c.last] <= p->now;
    s->best_slot = c.slot;
  }
  if (r->free_at[c.last] > p->now) return;
  if (s->best.alt_replica < 0 || fin < s->best.alt_finish_s ||
      (fin == s->best.alt_finish_s && j < s->best.alt_replica)) {
    s->best.alt_replica = j;
    s->best.alt_finish_s = fin;
    s->free_best = (gw_sched_choice){j, 1, fin, c.svc, c.pre, c.cached, -1, -1, GW_WAIT_NONE};
  }
  if (r->unknown &&
      (s->explore.replica < 0 || fin < s->explore.finish_s ||
       (fin == s->explore.finish_s && j < s->explore.replica)))
    s->explore = (gw_sched_choice){j, 1, fin, c.svc, c.pre, c.cached, -1, -1, GW_WAIT_NONE};
}

/* The bounds are computed with other roundings than the predictions they bound: they are
 * lowered by this share so that a bound never passes the value it bounds. */
#define PLAN_BOUND_SLACK 1e-9

/* The phones a request's first fingerprint may find cached tokens on (the prompt cache's
 * first blocks of every usable phone of the model), sorted once per pass when asked. */
static int cmp_cache(const void *x, const void *y) {
  const struct cache_entry *a = x, *b = y;
  return a->fp < b->fp ? -1 : a->fp > b->fp ? 1 : a->j != b->j ? a->j - b->j : a->k - b->k;
}

/* m->cache sorted by (fp, j, k). It is collected in (j, k) order, so a stable sort by the
 * fingerprint alone is that order: a radix sort of its eight bytes (a byte all entries share
 * is skipped), O(entries) where a sort by comparison was O(entries log entries) -- twelve
 * thousand at 6,000 phones each pass. */
static int cache_sort(gw_sched *ctx, plan_model *m) {
  size_t n = m->n_cache;
  if (n < 64) {
    qsort(m->cache, n, sizeof(*m->cache), cmp_cache);
    return 0;
  }
  struct fp_at {
    uint64_t fp;
    size_t i;
  } *a = arena_alloc(ctx, n * sizeof(*a)), *b = arena_alloc(ctx, n * sizeof(*b));
  struct cache_entry *out = arena_alloc(ctx, n * sizeof(*out));
  if (!a || !b || !out) return -1;
  for (size_t i = 0; i < n; i++) a[i] = (struct fp_at){m->cache[i].fp, i};
  for (unsigned shift = 0; shift < 64; shift += 8) {
    size_t at[257] = {0};
    for (size_t i = 0; i < n; i++) at[((a[i].fp >> shift) & 255) + 1]++;
    int one = 0;
    for (size_t d = 1; d <= 256 && !one; d++) one = at[d] == n;
    if (one) continue; /* every entry has this byte alike: the order stays */
    for (size_t d = 1; d <= 256; d++) at[d] += at[d - 1];
    for (size_t i = 0; i < n; i++) b[at[(a[i].fp >> shift) & 255]++] = a[i];
    struct fp_at *t = a;
    a = b;
    b = t;
  }
  for (size_t i = 0; i < n; i++) out[i] = m->cache[a[i].i];
  m->cache = out;
  return 0;
}

static int cache_init(gw_sched *ctx, plan_model *m, gw_replica *const *replicas) {
  size_t n = 0;
  for (size_t i = 0; i < m->n_use; i++) n += (size_t)replicas[m->use[i]]->pc.n;
  m->cache = arena_alloc(ctx, (n ? n : 1) * sizeof(*m->cache));
  if (!m->cache) return -1;
  for (size_t i = 0; i < m->n_use; i++) {
    const gw_pcache *pc = &replicas[m->use[i]]->pc;
    for (int k = 0; k < pc->n; k++)
      if (pc->slot[k].n_blocks)
        m->cache[m->n_cache++] = (struct cache_entry){pc->slot[k].blocks[0], m->use[i], k,
                                                      pc->slot[k].blocks, pc->slot[k].n_blocks, 0, NULL, 0};
  }
  if (cache_sort(ctx, m) < 0) return -1;
  m->bp = arena_alloc(ctx, (m->n_cache ? m->n_cache : 1) * sizeof(*m->bp));
  if (!m->bp) return -1;
  m->cache_ready = 1;
  return 0;
}

/* Every usable phone of the model, in order: the plain walk. */
static void walk(plan *p, search *s, const plan_model *m) {
  for (size_t i = 0; i < m->n_use; i++) consider(p, s, m->use[i]);
}

/* A group's phones in the order of when their next slot frees, read off its heap without
 * changing it: a best-first walk of the heap's tree (front: the frontier, a small min-heap
 * of heap places). */
typedef struct heap_walk {
  const plan_group *g;
  const plan_rep *pr;
  size_t *front;
  size_t n;
} heap_walk;

static void hw_push(heap_walk *w, size_t x) {
  size_t i = w->n++;
  w->front[i] = x;
  while (i > 0) {
    size_t up = (i - 1) / 2;
    if (!heap_less(w->pr, w->g->h, w->front[i], w->front[up])) break;
    size_t t = w->front[i];
    w->front[i] = w->front[up];
    w->front[up] = t;
    i = up;
  }
}

static int hw_pop(heap_walk *w) {
  if (w->n == 0) return -1;
  size_t top = w->front[0];
  w->front[0] = w->front[--w->n];
  for (size_t i = 0;;) {
    size_t l = 2 * i + 1, r = l + 1, s = i;
    if (l < w->n && heap_less(w->pr, w->g->h, w->front[l], w->front[s])) s = l;
    if (r < w->n && heap_less(w->pr, w->g->h, w->front[r], w->front[s])) s = r;
    if (s == i) break;
    size_t t = w->front[i];
    w->front[i] = w->front[s];
    w->front[s] = t;
    i = s;
  }
  if (2 * top + 1 < w->g->n) hw_push(w, 2 * top + 1);
  if (2 * top + 2 < w->g->n) hw_push(w, 2 * top + 2);
  return w->g->h[top];
}

/* The next phone of a free list (fa or fb) at or after i that still has a slot free: links
 * past the others are shortened as they are followed (a phone only leaves the free set in
 * a pass). */
static size_t free_next(const plan *p, const int *list, int *next, size_t n, size_t i) {
  size_t r = i;
  while (r < n && p->pr[list[r]].free_at[0] > p->now) r = (size_t)next[r];
  while (i < r) {
    size_t t = (size_t)next[i];
    next[i] = (int)r;
    i = t;
  }
  return r;
}

static void search_begin(plan *p) {
  if (++p->ctx->stamp == 0) {
    memset(p->mark, 0, p->nr * sizeof(*p->mark));
    memset(p->cmark, 0, p->nr * sizeof(*p->cmark));
    p->ctx->stamp = 1;
  }
  p->stamp = p->ctx->stamp;
}

/* The phones the request's first fingerprint is cached on: marked, and (consider: 1)
 * considered at once. */
static size_t cache_first(const plan_model *m, uint64_t fp) {
  size_t lo = 0, hi = m->n_cache;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (m->cache[mid].fp < fp) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The bucket of entries under q's first fingerprint [*lo, *hi), each entry's shared blocks
 * brought from the bucket's last request to q: with d the blocks q shares with that request,
 * a slot that shared fewer than d with it shares as many with q, one that shared more shares
 * exactly d, and only one that shared exactly d is compared on from there (the longest
 * common prefix, exactly: no fingerprint is taken to stand for another). */
static void cache_bucket(plan_model *m, const gw_sched_req *q, size_t *lo, size_t *hi) {
  size_t a = cache_first(m, q->blocks[0]), b = a;
  while (b < m->n_cache && m->cache[b].fp == q->blocks[0]) b++;
  *lo = a;
  *hi = b;
  if (a == b) return;
  struct cache_entry *first = &m->cache[a];
  if (first->qb == q->blocks && first->qn == q->n_blocks) return; /* brought to q already */
  size_t d = first->qb ? pr_oai_common_blocks(first->qb, first->qn, q->blocks, q->n_blocks) : 0;
  for (size_t i = a; i < b; i++) {
    struct cache_entry *e = &m->cache[i];
    if (!first->qb) {
      e->common = pr_oai_common_blocks(e->sb, e->sn, q->blocks, q->n_blocks);
    } else if (e->common > d) {
      e->common = d;
    } else if (e->common == d) {
      size_t n = e->sn < q->n_blocks ? e->sn : q->n_blocks, c = d;
      while (c < n && e->sb[c] == q->blocks[c]) c++;
      e->common = c;
    } /* fewer than d: as many */
  }
  first->qb = q->blocks;
  first->qn = q->n_blocks;
}

/* The prompt tokens replica j may find cached for q, from its entries [i, *next) of the bucket
 * (its other slots share not even q's first block). */
static int64_t cache_tokens(const plan *p, const plan_model *m, const gw_sched_req *q, size_t i,
                            size_t hi, size_t *next) {
  int j = m->cache[i].j;
  const gw_pcache *pc = &p->replicas[j]->pc;
  size_t common[GW_MAX_SLOTS];
  int n = pc->n < GW_MAX_SLOTS ? pc->n : GW_MAX_SLOTS;
  memset(common, 0, (size_t)n * sizeof(*common));
  for (; i < hi && m->cache[i].j == j; i++)
    if (m->cache[i].k < n) common[m->cache[i].k] = m->cache[i].common;
  *next = i;
  if (!pc->hybrid) return gw_pcache_cached_tokens_common(pc, q->cache_scope, common);
  gw_pquery pq = {.blocks = q->blocks, .n_blocks = q->n_blocks, .prompt_tokens = q->prompt_tokens,
                  .user_at = q->user_at, .user_fp = q->user_fp, .full_fp = q->full_fp,
                  .model = q->model};
  return gw_pcache_cached_tokens_q(pc, q->cache_scope, common, &pq, q->model);
}

/* The phones of q's bucket [lo, hi), each once, marked met (mark) and cached (cmark), with a
 * lower bound of its cost for q in m->bp: wait for its first slot x ww + what is left of the
 * prompt x a + answer x b, as the walks bound a phone, with the most it may find cached --
 * its entries' longest run shared with q (cache_bucket; their scope may make it none), or
 * the whole prompt for a hybrid cache (its checkpoints are placed in learned tokens, not in
 * blocks). ww 0: the bound of its service alone. Returns how many. */
static size_t bucket_bounds(plan *p, const search *s, plan_model *m, size_t lo, size_t hi, double ww) {
  const gw_sched_req *q = s->q;
  double P = (double)q->prompt_tokens, O = s->out_tokens;
  size_t n = 0;
  for (size_t i = lo, next; i < hi; i = next) {
    int j = m->cache[i].j;
    size_t common = 0;
    for (next = i; next < hi && m->cache[next].j == j; next++)
      if (m->cache[next].common > common) common = m->cache[next].common;
    if (p->cmark[j] == p->stamp) continue;
    p->cmark[j] = p->mark[j] = p->stamp;
    const plan_rep *r = &p->pr[j];
    double cu = r->hybrid ? P : (double)(common * PR_OAI_BLOCK_CHARS / 4);
    if (cu > P - 1) cu = P - 1; /* as the prediction leaves one token to read */
    if (cu < 0) cu = 0;
    double wait = (double)(r->free_at[0] - p->now) / 1000.0;
    m->bp[n++] = (struct bucket_phone){(wait * ww + (P - cu) * r->a + O * r->b) * (1 - PLAN_BOUND_SLACK),
                                       j, i, next, 0};
  }
  return n;
}

/* The bucket's phone of least bound (of those with a slot free now: free 1); nb: none. */
static size_t bucket_least(const plan *p, const plan_model *m, size_t nb, int free) {
  size_t best = nb;
  for (size_t k = 0; k < nb; k++)
    if ((!free || p->pr[m->bp[k].j].free_at[0] <= p->now) && (best == nb || m->bp[k].lb < m->bp[best].lb))
      best = k;
  return best;
}

/* The bucket's phone k considered, with the tokens it holds for q. */
static void bucket_meet(plan *p, search *s, plan_model *m, size_t nb, size_t hi, size_t k) {
  if (k >= nb || m->bp[k].done) return;
  struct bucket_phone *b = &m->bp[k];
  size_t next;
  b->done = 1;
  s->known_j = b->j;
  s->known_cached = cache_tokens(p, m, s->q, b->i, hi, &next);
  consider(p, s, b->j);
  s->known_j = -1;
}

/* The phones q's first fingerprint is cached on (every other holds none of its prompt: the
 * walks bound them uncached). The two of least bound are considered first (they set the
 * bounds the walks stop at); *hi: the bucket's end. Returns how many (m->bp). */
static size_t cache_first_phones(plan *p, search *s, plan_model *m, size_t *hi) {
  const gw_sched_req *q = s->q;
  *hi = 0;
  /* a prompt shorter than a block finds nothing cached anywhere */
  s->cache_known = m->cache_ready || !q->n_blocks;
  if (!q->n_blocks || !m->cache_ready) return 0;
  size_t lo;
  cache_bucket(m, q, &lo, hi);
  size_t nb = bucket_bounds(p, s, m, lo, *hi, s->ww);
  bucket_meet(p, s, m, nb, *hi, bucket_least(p, m, nb, 0));
  bucket_meet(p, s, m, nb, *hi, bucket_least(p, m, nb, 1));
  return nb;
}

/* The rest of the bucket, once the walks are done: a phone is considered unless its bound
 * passes the best cost and it could not be the best free phone either (it has no slot free,
 * or its bound passes that phone's finish too); one never measured always is (it may be
 * explored). What the walks and these find is what considering every one finds. */
static void cache_rest(plan *p, search *s, plan_model *m, size_t nb, size_t hi) {
  for (size_t k = 0; k < nb; k++) {
    const struct bucket_phone *b = &m->bp[k];
    if (b->done) continue;
    const plan_rep *r = &p->pr[b->j];
    if (s->best.replica >= 0 && !r->unknown && b->lb > s->best_cost &&
        (r->free_at[0] > p->now || (s->best.alt_replica >= 0 && b->lb > s->best.alt_finish_s)))
      continue;
    bucket_meet(p, s, m, nb, hi, k);
  }
}

static void meet(plan *p, search *s, int j) {
  if (p->mark[j] == p->stamp) return;
  p->mark[j] = p->stamp;
  consider(p, s, j);
}

/* A pair of free lists (the same phones by a and by b) walked in turn until the phones not
 * met are bounded past the best cost and the best finish among free phones, and (explore)
 * past the finish at which a never-measured phone would be explored. */
static void free_walk(plan *p, search *s, const int *la, const int *lb, int *na, int *nb, size_t n,
                      int explore) {
  const gw_sched_req *q = s->q;
  double P = (double)q->prompt_tokens, O = s->out_tokens;
  size_t ia = free_next(p, la, na, n, 0), ib = free_next(p, lb, nb, n, 0);
  while (ia < n && ib < n) {
    int ja = la[ia], jb = lb[ib];
    meet(p, s, ja);
    meet(p, s, jb);
    ia = free_next(p, la, na, n, ia + 1);
    ib = free_next(p, lb, nb, n, ib + 1);
    if (s->best.replica < 0 || s->best.alt_replica < 0) continue;
    double tau = (P * p->pr[ja].a + O * p->pr[jb].b) * (1 - PLAN_BOUND_SLACK);
    double need = s->best_cost > s->best.alt_finish_s ? s->best_cost : s->best.alt_finish_s;
    if (explore) {
      double bound = s->best_cost * (1 + q->explore);
      if (q->short_s > 0 && s->best_cost + q->short_s < bound) bound = s->best_cost + q->short_s;
      if (bound > need) need = bound;
    }
    if (tau > need) return;
  }
}

/* The busy phones, group by group (threshold). */
static void busy_groups(plan *p, search *s, plan_model *m, size_t *front) {
  const gw_sched_req *q = s->q;
  double P = (double)q->prompt_tokens, O = s->out_tokens;
  double *lb = p->lb;
  for (size_t g = 0; g < m->n_groups; g++) {
    const plan_group *G = &m->groups[g];
    lb[g] = G->n ? ((double)(p->pr[G->h[0]].free_at[0] - p->now) / 1000.0 * s->ww + P * G->min_a + O * G->min_b) *
                       (1 - PLAN_BOUND_SLACK)
                 : -1;
  }
  for (;;) {
    size_t g = m->n_groups;
    for (size_t k = 0; k < m->n_groups; k++)
      if (lb[k] >= 0 && (g == m->n_groups || lb[k] < lb[g])) g = k;
    if (g == m->n_groups || (s->best.replica >= 0 && lb[g] > s->best_cost)) return;
    lb[g] = -1;
    const plan_group *G = &m->groups[g];
    heap_walk w = {G, p->pr, front, 0};
    hw_push(&w, 0);
    for (int j; (j = hw_pop(&w)) >= 0;) {
      double wc = (double)(p->pr[j].free_at[0] - p->now) / 1000.0;
      if (s->best.replica >= 0 &&
          (wc * s->ww + P * G->min_a + O * G->min_b) * (1 - PLAN_BOUND_SLACK) > s->best_cost)
        break;
      meet(p, s, j);
    }
  }
}

/* The search proper (Fagin's threshold algorithm over sorted lists). First the two phones
 * of least bound the request may find cached tokens on, then the phones with a slot free
 * now, by their prefill pace and their decode pace in turn: the free ones not met yet take
 * at least prompt x a + answer x b at the lists' current places, and the walk of them stops
 * once that bound passes the best cost and the best finish among free phones (the free
 * phones never measured are listed apart, and walked on until the bound also passes the
 * finish at which one would be explored). Then the busy phones, group by group (groups of
 * like prefill pace) in the order of their bounds, each by when its next slot frees: a busy
 * phone not met takes at least wait x weight + prompt x min a + answer x min b of its
 * group, and the walk stops once no group's bound is under the best cost. Last, the rest of
 * the phones that hold its first block, where their own bound (with what they may hold
 * cached) is not past what they could change (cache_rest). What it finds is what a walk of
 * every phone finds, ties included (consider breaks them by index). */
static void threshold(plan *p, search *s, plan_model *m, size_t *front) {
  const gw_sched_req *q = s->q;
  search_begin(p);
  size_t hi, nb = cache_first_phones(p, s, m, &hi);
  free_walk(p, s, m->fa, m->fb, m->fa_next, m->fb_next, m->n_free, 0);
  free_walk(p, s, m->ua, m->ub, m->ua_next, m->ub_next, m->n_unknown, q->explore > 0);
  busy_groups(p, s, m, front);
  cache_rest(p, s, m, nb, hi);
}

static void search_run(plan *p, search *s, plan_model *m, size_t *front) {
  if (!m->groups) walk(p, s, m);
  else threshold(p, s, m, front);
}

/* ---- the pass -------------------------------------------------------------------------- */

static plan_model *model_of(plan *p, const char *name) {
  for (size_t k = 0; k < p->n_models; k++)
    if (strcmp(p->models[k]->name, name) == 0) return p->models[k];
  return NULL;
}

static int cmp_by_a(const void *x, const void *y, void *ctx) {
  const plan_rep *pr = ctx;
  int i = *(const int *)x, j = *(const int *)y;
  return pr[i].a < pr[j].a ? -1 : pr[i].a > pr[j].a ? 1 : i - j;
}

static int cmp_by_b(const void *x, const void *y, void *ctx) {
  const plan_rep *pr = ctx;
  int i = *(const int *)x, j = *(const int *)y;
  return pr[i].b < pr[j].b ? -1 : pr[i].b > pr[j].b ? 1 : i - j;
}

/* The order kept for model (sched_order): its own, else the oldest entry taken for it;
 * NULL when none can be (out of memory: the pass sorts from scratch). */
static sched_order *order_of(gw_sched *c, const char *model) {
  sched_order *o = NULL;
  for (size_t i = 0; i < SCHED_ORDERS; i++) {
    sched_order *e = &c->orders[i];
    if (e->model && strcmp(e->model, model) == 0) {
      e->used = c->passes;
      return e;
    }
    if (!o || !e->model || (o->model && e->used < o->used)) o = e;
  }
  char *name = strdup(model);
  if (!name) return NULL;
  free(o->model);
  o->model = name;
  o->n = 0;
  o->used = c->passes;
  return o;
}

/* out (m->n_use long): the phones of m in the order prev gave them (those still usable),
 * then the others -- a permutation of m->use, the start of the sort. */
static void order_start(plan *p, const plan_model *m, const int *prev, size_t n_prev, int *out) {
  size_t k = 0;
  search_begin(p);
  for (size_t i = 0; i < n_prev; i++) {
    int j = prev[i];
    if (j < 0 || (size_t)j >= p->nr || !m->member[j] || p->mark[j] == p->stamp) continue;
    p->mark[j] = p->stamp;
    out[k++] = j;
  }
  for (size_t i = 0; i < m->n_use; i++) {
    int j = m->use[i];
    if (p->mark[j] == p->stamp) continue;
    p->mark[j] = p->stamp;
    out[k++] = j;
  }
}

/* The pass's orders kept for the next one (none when out of memory: it sorts from scratch). */
static void order_keep(sched_order *o, const int *a, const int *b, size_t n) {
  if (!o) return;
  if (n > o->cap) {
    int *na = realloc(o->a, n * sizeof(int));
    if (na) o->a = na;
    int *nb = realloc(o->b, n * sizeof(int));
    if (nb) o->b = nb;
    if (!na || !nb) {
      o->n = 0;
      return;
    }
    o->cap = n;
  }
  memcpy(o->a, a, n * sizeof(int));
  memcpy(o->b, b, n * sizeof(int));
  o->n = n;
}

/* Moves an insertion sort from last pass's order may make before it sorts from scratch:
 * a few per phone (a pass where many phones' rates moved costs a sort, as before). */
#define PLAN_ORDER_MOVES(n) (4 * (n) + 64)

/* The model's phones and its sorted lists. */
/* A plan of fewer requests than this walks every phone: sorting thousands of phones costs more
 * than walking them a few times (a hedge's plan, a move's). */
#define PLAN_SEARCH_MIN_REQS 8

static int model_init(plan *p, plan_model *m, const char *name, size_t n_reqs) {
  memset(m, 0, sizeof(*m));
  m->name = name;
  size_t nr = p->nr ? p->nr : 1;
  m->all = arena_alloc(p->ctx, nr * sizeof(int));
  m->use = arena_alloc(p->ctx, nr * sizeof(int));
  m->hpos = arena_alloc(p->ctx, nr * sizeof(int));
  if (!m->all || !m->use || !m->hpos) return -1;
  m->member = arena_zalloc(p->ctx, nr);
  m->held = arena_alloc(p->ctx, nr * sizeof(int));
  if (!m->member || !m->held) return -1;
  for (size_t j = 0; j < p->nr; j++) {
    m->hpos[j] = -2;
    if (!gw_replica_serves(p->replicas[j], name)) continue;
    m->all[m->n_all++] = (int)j;
    if (device_holds(p->replicas[j])) m->held[m->n_held++] = (int)j;
    if (p->pr[j].cap <= 0) continue;
    m->use[m->n_use++] = (int)j;
    m->member[j] = 1;
    if (free_slots(&p->pr[j], p->now) > 0) m->free_now++;
    int64_t ctx = p->pr[j].n_ctx > 0 ? p->pr[j].n_ctx : INT64_MAX;
    if (ctx > m->ctx_max) m->ctx_max = ctx;
  }
  if (m->n_use <= p->ctx->walk_max || m->n_use == 0 || p->walk_all) return 0;
  if (p->ctx->walk_max && n_reqs < PLAN_SEARCH_MIN_REQS) return 0;
  size_t n = m->n_use;
  m->by_a = arena_alloc(p->ctx, n * sizeof(int));
  m->by_b = arena_alloc(p->ctx, n * sizeof(int));
  size_t k = 4;
  while ((k + 1) * (k + 1) <= n) k++;
  if (k > n) k = n;
  m->groups = arena_zalloc(p->ctx, k * sizeof(*m->groups));
  m->heaps = arena_alloc(p->ctx, n * sizeof(int));
  m->gof = arena_alloc(p->ctx, p->nr * sizeof(int));
  if (!m->by_a || !m->by_b || !m->groups || !m->heaps || !m->gof) return -1;
  m->n_groups = k;
  m->fa = arena_alloc(p->ctx, n * sizeof(int));
  m->fb = arena_alloc(p->ctx, n * sizeof(int));
  m->fa_next = arena_alloc(p->ctx, (n + 1) * sizeof(int));
  m->fb_next = arena_alloc(p->ctx, (n + 1) * sizeof(int));
  m->ua = arena_alloc(p->ctx, n * sizeof(int));
  m->ub = arena_alloc(p->ctx, n * sizeof(int));
  m->ua_next = arena_alloc(p->ctx, (n + 1) * sizeof(int));
  m->ub_next = arena_alloc(p->ctx, (n + 1) * sizeof(int));
  if (!m->fa || !m->fb || !m->fa_next || !m->fb_next || !m->ua || !m->ub || !m->ua_next || !m->ub_next)
    return -1;
  sched_order *o = order_of(p->ctx, name);
  order_start(p, m, o ? o->a : NULL, o ? o->n : 0, m->by_a);
  order_start(p, m, o ? o->b : NULL, o ? o->n : 0, m->by_b);
  pr_order_ints(m->by_a, n, cmp_by_a, p->pr, PLAN_ORDER_MOVES(n));
  pr_order_ints(m->by_b, n, cmp_by_b, p->pr, PLAN_ORDER_MOVES(n));
  order_keep(o, m->by_a, m->by_b, n);
  for (size_t i = 0; i < n; i++) {
    int j = m->by_a[i];
    if (p->pr[j].free_at[0] > p->now) continue;
    if (p->pr[j].unknown) m->ua[m->n_unknown++] = j;
    else m->fa[m->n_free++] = j;
  }
  for (size_t i = 0, nb = 0, nu = 0; i < n; i++) {
    int j = m->by_b[i];
    if (p->pr[j].free_at[0] > p->now) continue;
    if (p->pr[j].unknown) m->ub[nu++] = j;
    else m->fb[nb++] = j;
  }
  for (size_t i = 0; i <= m->n_free; i++) m->fa_next[i] = m->fb_next[i] = (int)i + 1;
  for (size_t i = 0; i <= m->n_unknown; i++) m->ua_next[i] = m->ub_next[i] = (int)i + 1;
  /* groups: consecutive runs of by_a, each heap the busy ones of its run */
  for (size_t g = 0, at = 0; g < k; g++) {
    size_t end = n * (g + 1) / k;
    plan_group *G = &m->groups[g];
    G->h = m->heaps + at;
    G->min_a = p->pr[m->by_a[at]].a;
    G->min_b = p->pr[m->by_a[at]].b;
    for (size_t i = at; i < end; i++) {
      int j = m->by_a[i];
      m->gof[j] = (int)g;
      m->hpos[j] = -1;
      if (p->pr[j].b < G->min_b) G->min_b = p->pr[j].b;
      if (p->pr[j].free_at[0] <= p->now) continue;
      G->h[G->n] = j;
      m->hpos[j] = (int)G->n++;
    }
    for (size_t i = G->n / 2; i-- > 0;) heap_down(G, m->hpos, p->pr, i);
    at = end;
  }
  return 0;
}

/* The shortest service of q over the usable phones of m that fit it (-1: none), by the same
 * search without waits (a walk for a small model); then over every phone that fits when none
 * is usable. */
static void service_min(plan *p, const search *s, int j, double *best) {
  if (j < 0 || p->mark[j] == p->stamp) return;
  p->mark[j] = p->stamp;
  const plan_rep *r = &p->pr[j];
  const gw_sched_req *q = s->q;
  if (!fits_here(p, q, j)) return;
  double v = s->cache_known && p->cmark[j] != p->stamp
                 ? gw_predict_service_rates_s(r->prefill_tps, r->decode_tps, q, r->slowdown, 0, NULL, NULL)
                 : gw_predict_service_s(p->replicas[j], q, r->slowdown, NULL, NULL);
  if (*best < 0 || v < *best) *best = v;
}

static double best_service(plan *p, const gw_sched_req *q, plan_model *m) {
  double best = -1, any = -1, O = q->expected_out < (double)q->max_tokens ? q->expected_out : (double)q->max_tokens;
  search s = {.q = q, .known_j = -1, .out_tokens = O};
  if (!m->groups) {
    search_begin(p);
    for (size_t i = 0; i < m->n_use; i++) service_min(p, &s, m->use[i], &best);
  } else {
    search_begin(p);
    s.cache_known = m->cache_ready || !q->n_blocks;
    if (q->n_blocks && m->cache_ready) {
      /* the phones holding its first block: the one of least bound first, then each whose
       * bound does not pass the best so far */
      size_t lo, hi, next;
      cache_bucket(m, q, &lo, &hi);
      size_t nb = bucket_bounds(p, &s, m, lo, hi, 0), first = bucket_least(p, m, nb, 0);
      for (size_t t = 0; t < nb; t++) {
        size_t k = t == 0 ? first : t == first ? 0 : t;
        const struct bucket_phone *b = &m->bp[k];
        if (best >= 0 && b->lb > best) continue;
        if (!fits_here(p, q, b->j)) continue;
        const plan_rep *r = &p->pr[b->j];
        int64_t c = cache_tokens(p, m, q, b->i, hi, &next);
        double v = gw_predict_service_rates_s(r->prefill_tps, r->decode_tps, q, r->slowdown, c, NULL, NULL);
        if (best < 0 || v < best) best = v;
      }
    }
    for (size_t k = 0; k < m->n_use; k++) {
      int ja = m->by_a[k], jb = m->by_b[k];
      service_min(p, &s, ja, &best);
      service_min(p, &s, jb, &best);
      if (best >= 0 && ((double)q->prompt_tokens * p->pr[ja].a + O * p->pr[jb].b) * (1 - PLAN_BOUND_SLACK) > best)
        break;
    }
  }
  if (best >= 0) return best;
  for (size_t i = 0; i < m->n_all; i++) {
    int j = m->all[i];
    if (!gw_predict_fits(p->replicas[j], q)) continue;
    double v = gw_predict_service_s(p->replicas[j], q, p->pr[j].slowdown, NULL, NULL);
    if (any < 0 || v < any) any = v;
  }
  return any;
}

/* The wait weights of a pass (gw_sched_req.wait_weight_max): each request that asks and
 * is long interactive work gets its service on the usable phone quickest for it (over
 * all that fit when none is usable), worked out now, not at its arrival; then the
 * longest of its model sets its weight. Fills w[i]: 1 is plain; 0 while to be weighed. */
static void wait_weights(plan *p, const gw_sched_req *reqs, plan_model **rm, size_t n, double *w) {
  size_t asking = 0;
  for (size_t i = 0; i < n; i++) {
    const gw_sched_req *q = &reqs[i];
    w[i] = q->wait_weight_max > 1 && !q->batch && !q->take_free ? 0 : 1;
    asking += w[i] == 0;
  }
  /* one request alone is the longest of its model: no services to work out */
  double *svc = asking >= 2 ? arena_zalloc(p->ctx, n * sizeof(*svc)) : NULL;
  if (!svc) {
    for (size_t i = 0; i < n; i++) w[i] = 1;
    return;
  }
  for (size_t i = 0; i < n; i++) {
    if (w[i] != 0) continue;
    svc[i] = rm[i] ? best_service(p, &reqs[i], rm[i]) : -1;
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
}

/* A slot of replica j was reserved: its place among the phones freeing next moves, and a
 * quick phone's free slot taken is one fewer free. */
static void reserved(plan *p, int j, int was_free, int free_taken) {
  for (size_t k = 0; k < p->n_models; k++) {
    plan_model *m = p->models[k];
    if (m->groups && m->hpos[j] >= 0) {
      heap_down(&m->groups[m->gof[j]], m->hpos, p->pr, (size_t)m->hpos[j]); /* free_at[0] only grows */
    } else if (m->groups && m->hpos[j] == -1 && p->pr[j].free_at[0] > p->now) {
      plan_group *G = &m->groups[m->gof[j]]; /* its last free slot was taken */
      G->h[G->n] = j;
      m->hpos[j] = (int)G->n++;
      heap_up(G, m->hpos, p->pr, (size_t)m->hpos[j]);
    }
    if (m->quick_ready && m->quick[j]) m->q_free -= free_taken;
    if (was_free && m->member[j] && p->pr[j].free_at[0] > p->now) m->free_now--;
  }
}

/* What phone j, with a slot free now, tells of why q waits (wait_reason). */
static void reason_at(const plan *p, const search *s, const plan_model *m, int j, int kept, int *kept_free,
                      int *held_free) {
  const gw_sched_req *q = s->q;
  const plan_rep *r = &p->pr[j];
  if (!fits_here(p, q, j)) return;
  int nfree = free_slots(r, p->now);
  if (nfree <= 0 || (q->avoid == p->replicas[j] && !s->pass_avoid)) return;
  if (r->suspect) *held_free = 1;
  int first = q->avoid != p->replicas[j] && !r->suspect, last = !r->suspect || s->pass_suspect;
  if (!(first && kept) && !(last && q->batch)) return;
  double pre;
  int64_t cached;
  double svc = gw_predict_service_s(p->replicas[j], q, r->slowdown, &pre, &cached);
  int in_kept = m->quick && m->quick[j] && !kept_for(m, q, svc, s->out_tokens);
  if (first && kept && in_kept && kept_slot(r, kept, nfree) >= nfree) *kept_free = 1;
  if (last && q->batch) {
    /* the last pass's kept slots turn it away first */
    if (s->kept && in_kept && kept_slot(r, s->kept, nfree) >= r->cap) return;
    int reserve = r->reserve >= 0 ? r->reserve
                                  : gw_replica_interactive_reserve(p->replicas[j], p->now, q->batch_reserve);
    if (nfree <= reserve && !(svc <= q->batch_borrow_s)) *held_free = 1;
  }
}

/* reason_at of each phone of a free list (fa or ua) that still has a slot free. */
static void reasons_of(const plan *p, const search *s, const plan_model *m, const int *list, int *next,
                       size_t n, int kept, int *kept_free, int *held_free) {
  for (size_t i = free_next(p, list, next, n, 0); i < n; i = free_next(p, list, next, n, i + 1))
    reason_at(p, s, m, list[i], kept, kept_free, held_free);
}

/* Why a request that does not start now waits (gw_sched_wait), as a walk of every phone
 * of its model would see it: a phone whose own readings hold a free slot back, a
 * suspect's free slot, batch room, short work's kept slots, a faster phone. Counted, never
 * decided on: it reads the pass and changes nothing. Without a free slot anywhere in the
 * pass (the usual case at saturation) the held phones and the largest context say it. */
static int wait_reason(plan *p, const search *s, plan_model *m, const gw_sched_choice *best,
                       int kept) {
  const gw_sched_req *q = s->q;
  int any_fit = 0, kept_free = 0, held_free = 0;
  for (size_t i = 0; i < m->n_held && !held_free; i++) {
    const plan_rep *r = &p->pr[m->held[i]];
    held_free = !(r->n_ctx > 0 && q->prompt_tokens + q->max_tokens > r->n_ctx);
  }
  if (m->free_now <= 0) {
    any_fit = m->n_use > 0 && q->prompt_tokens + q->max_tokens <= m->ctx_max;
  } else {
    /* the passes the search made (pass 1 with the kept slots it started with, the last with
     * what it ended with) as a walk would have made them, their findings together: read
     * off the phones with a slot free now (the search's free lists, when it has them) */
    for (size_t i = 0; i < m->n_use && !any_fit; i++) any_fit = fits_here(p, q, m->use[i]);
    if (!m->groups) {
      for (size_t i = 0; i < m->n_use; i++) reason_at(p, s, m, m->use[i], kept, &kept_free, &held_free);
    } else {
      reasons_of(p, s, m, m->fa, m->fa_next, m->n_free, kept, &kept_free, &held_free);
      reasons_of(p, s, m, m->ua, m->ua_next, m->n_unknown, kept, &kept_free, &held_free);
    }
  }
  if (best->replica < 0) return held_free ? GW_WAIT_HELD : any_fit ? GW_WAIT_BUSY : GW_WAIT_NO_PHONE;
  return kept_free ? GW_WAIT_KEPT : best->alt_replica >= 0 ? GW_WAIT_FASTER : held_free ? GW_WAIT_HELD : GW_WAIT_BUSY;
}

/* ---- the queue as a whole: an idle phone takes work the faster phones cannot clear ---- */

/* At most this many requests are weighed for one idle phone, and this many idle phones
 * in a pass: the phase reads a few, however large the fleet and the queue. */
#define FILL_CANDIDATES 32
#define FILL_PHONES 64

/* Whether q may start now on the free slot of replica j as the steps see it (its context,
 * the phone it just failed on, kept slots for short work); fills c. */
static int fill_fits(plan *p, plan_model *m, gw_replica *const *replicas, const gw_sched_req *q, int j,
                     cand *c) {
  search s = {.q = q, .m = m, .ww = 1, .known_j = -1};
  s.out_tokens = q->expected_out < (double)q->max_tokens ? q->expected_out : (double)q->max_tokens;
  if (q->short_reserve > 0 && m->quick_ready) s.kept = short_kept(m, replicas, q, p->now);
  *c = (cand){.j = j};
  for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++)
    if (!steps[k](p, &s, c)) return 0;
  /* all its slots free now: several choices start together (step_choices) */
  return c->last < p->pr[j].cap && p->pr[j].free_at[c->last] <= p->now;
}

/* After the requests are planned one by one (each on its own soonest finish), a phone of
 * the model may be left idle while long work waits for busier, faster phones. Such a
 * request R waits well for itself, but every request queued behind it on those phones,
 * and every one that comes meanwhile, waits its service longer. So for each idle phone
 * (the fastest first), the waiting request it would finish soonest (the shortest there:
 * the tail of the queue grows least; among equals the one that loses least, (finish here -
 * finish planned) / its planned service) takes it when the phones faster for R cannot
 * clear the work waiting for them plus the work that comes before this phone would finish
 * R:
 *
 *     queued + load_erlangs x T  >  sum over their slots of max(0, T - busy until)
 *
 * T: R's service here (it starts now); queued: the planned service of the pass's
 * requests waiting on those phones; load_erlangs: the model's work per second lately;
 * busy until: when each slot frees of the work already running. Otherwise the phone is
 * left idle: the queue is predicted to end sooner without it. Short work, batch work,
 * batch lines (take_free) and requests that do not ask (fill_idle) are not moved. */
static void fill_idle(plan *p, gw_replica *const *replicas, const gw_sched_req *reqs, plan_model **rm,
                      size_t n, gw_sched_choice *out) {
  size_t *w = arena_alloc(p->ctx, (n ? n : 1) * sizeof(*w));
  int *idle = arena_alloc(p->ctx, (p->nr ? p->nr : 1) * sizeof(*idle));
  unsigned char *moved = arena_zalloc(p->ctx, n ? n : 1);
  if (!w || !idle || !moved) return;
  int phones_left = FILL_PHONES;
  for (size_t mi = 0; mi < p->n_models && phones_left > 0; mi++) {
    plan_model *m = p->models[mi];
    size_t nw = 0;
    for (size_t i = 0; i < n; i++) {
      const gw_sched_req *q = &reqs[i];
      if (rm[i] == m && q->fill_idle && !q->batch && !q->take_free && out[i].replica >= 0 && !out[i].now &&
          out[i].service_s > q->short_s)
        w[nw++] = i;
    }
    if (!nw) continue;
    size_t ni = 0;
    for (size_t k = 0; k < m->n_use; k++) {
      int j = m->use[k];
      if (!p->pr[j].suspect && p->pr[j].free_at[0] <= p->now) idle[ni++] = j;
    }
    /* the fastest idle phones first (by prefill pace, then index) */
    for (size_t x = 1; x < ni; x++) {
      int v = idle[x];
      size_t y = x;
      while (y > 0 && (p->pr[idle[y - 1]].a > p->pr[v].a || (p->pr[idle[y - 1]].a == p->pr[v].a && idle[y - 1] > v))) {
        idle[y] = idle[y - 1];
        y--;
      }
      idle[y] = v;
    }
    size_t left = nw;
    for (size_t x = 0; x < ni && left > 0 && phones_left > 0; x++, phones_left--) {
      int j = idle[x];
      while (left > 0 && p->pr[j].free_at[0] <= p->now) {
        /* the request it finishes soonest, then the one that loses least, the latest first */
        size_t best = n;
        double best_loss = 0, best_t = 0;
        cand bc = {0};
        int seen = 0;
        for (size_t y = nw; y-- > 0 && seen < FILL_CANDIDATES;) {
          size_t i = w[y];
          if (moved[i]) continue;
          seen++;
          cand c;
          if (!fill_fits(p, m, replicas, &reqs[i], j, &c)) continue;
          double loss = (c.svc - out[i].finish_s) / (out[i].service_s > 0 ? out[i].service_s : 1e-9);
          if (best == n || c.svc < best_t || (c.svc == best_t && loss < best_loss)) {
            best = i;
            best_loss = loss;
            best_t = c.svc;
            bc = c;
          }
        }
        if (best == n) break;
        const gw_sched_req *q = &reqs[best];
        double T = bc.svc, P = (double)q->prompt_tokens;
        double O = q->expected_out < (double)q->max_tokens ? q->expected_out : (double)q->max_tokens;
        /* the phones faster for it (at their paces, without cache): their slots' time before
         * T, and the work waiting for them */
        search_begin(p);
        double room = 0, queued = 0;
        for (size_t k = 0; k < m->n_use; k++) {
          int g = m->use[k];
          const plan_rep *r = &p->pr[g];
          if (g == j || r->suspect || !(P * r->a + O * r->b < T)) continue;
          p->mark[g] = p->stamp;
          const uint64_t *f0 = p->free0 + (r->free_at - p->times);
          for (int k2 = 0; k2 < r->cap; k2++) {
            double busy = f0[k2] > p->now ? (double)(f0[k2] - p->now) / 1000.0 : 0;
            if (busy < T) room += T - busy;
          }
        }
        for (size_t y = 0; y < nw; y++) {
          size_t i = w[y];
          if (!moved[i] && p->mark[out[i].replica] == p->stamp) queued += out[i].service_s;
        }
        double load = q->load_erlangs > 0 ? q->load_erlangs : 0;
        if (!(queued + load * T > room)) break; /* the faster phones clear it sooner: j idles */
        moved[best] = 1;
        left--;
        plan_rep *r = &p->pr[j];
        for (int k = bc.slot; k <= bc.last; k++) { /* as many as its choices, as the pass does */
          r->free_at[k] = p->now + (uint64_t)(T * 1000.0) + 1;
          r->short_at[k] = 0;
        }
        sort_slots(r->free_at, r->short_at, r->cap);
        reserved(p, j, 1, bc.last - bc.slot + 1);
        out[best] = (gw_sched_choice){j, 1, T, T, bc.pre, bc.cached, T, j, GW_WAIT_NONE};
      }
    }
  }
}

/* The marks grow with the fleet; new ones are 0, which no search's stamp is. */
static int marks_fit(gw_sched *c, size_t nr) {
  if (nr <= c->n_mark) return 0;
  unsigned *m = realloc(c->mark, nr * sizeof(*m));
  if (m) c->mark = m;
  unsigned *k = realloc(c->cmark, nr * sizeof(*k));
  if (k) c->cmark = k;
  if (!m || !k) return -1;
  memset(c->mark + c->n_mark, 0, (nr - c->n_mark) * sizeof(*m));
  memset(c->cmark + c->n_mark, 0, (nr - c->n_mark) * sizeof(*k));
  c->n_mark = nr;
  return 0;
}

void gw_sched_plan(gw_replica *const *replicas, size_t nr, const gw_sched_req *reqs, size_t n,
                   uint64_t now, gw_sched_choice *out) {
  gw_sched *c = gw_sched_new();
  if (!c) {
    for (size_t i = 0; i < n; i++) out[i] = CHOICE_NONE;
    return;
  }
  gw_sched_plan_with(c, replicas, nr, reqs, n, now, out);
  gw_sched_free(c);
}

void gw_sched_plan_with(gw_sched *ctx, gw_replica *const *replicas, size_t nr, const gw_sched_req *reqs,
                        size_t n, uint64_t now, gw_sched_choice *out) {
  if (!ctx) {
    gw_sched_plan(replicas, nr, reqs, n, now, out);
    return;
  }
  plan p = {.ctx = ctx, .replicas = replicas, .nr = nr, .now = now};
  ctx->passes++;
  size_t nr1 = nr ? nr : 1;
  int ok = marks_fit(ctx, nr1) == 0;
  p.mark = ctx->mark;
  p.cmark = ctx->cmark;
  p.pr = arena_alloc(ctx, nr1 * sizeof(*p.pr));
  p.models = arena_alloc(ctx, (n ? n : 1) * sizeof(*p.models)); /* each made as met */
  plan_model **rm = arena_zalloc(ctx, (n ? n : 1) * sizeof(*rm));
  double *weights = arena_zalloc(ctx, (n ? n : 1) * sizeof(*weights));
  size_t *front = arena_alloc(ctx, (nr1 + 1) * sizeof(*front));
  p.lb = arena_alloc(ctx, nr1 * sizeof(*p.lb));
  ok = ok && p.pr && p.models && rm && weights && front && p.lb;
  double short_s = 0;
  for (size_t i = 0; ok && i < n; i++)
    if (reqs[i].short_s > short_s) short_s = reqs[i].short_s;
  /* the slots' times, laid out by each phone's capacity */
  size_t slots = 0;
  for (size_t j = 0; ok && j < nr; j++) {
    p.pr[j].cap = gw_replica_capacity(replicas[j], now);
    if (p.pr[j].cap > 0) slots += (size_t)p.pr[j].cap;
  }
  uint64_t *times = ok ? arena_alloc(ctx, (slots ? slots : 1) * sizeof(uint64_t)) : NULL;
  unsigned char *shorts = ok ? arena_alloc(ctx, slots ? slots : 1) : NULL;
  ok = ok && times && shorts;
  for (size_t j = 0, at = 0; ok && j < nr; j++) {
    p.pr[j].free_at = times + at;
    p.pr[j].short_at = shorts + at;
    if (p.pr[j].cap > 0) at += (size_t)p.pr[j].cap;
    plan_init(&p.pr[j], replicas[j], now, (uint64_t)(short_s * 1000.0));
  }
  p.times = times;
  int fills = 0;
  for (size_t i = 0; ok && i < n && !fills; i++) fills = reqs[i].fill_idle;
  if (ok && fills && (p.free0 = arena_alloc(ctx, (slots ? slots : 1) * sizeof(uint64_t))) != NULL)
    memcpy(p.free0, times, slots * sizeof(uint64_t));
  /* A phone's batch room is worked out with the share of the first batch request that asks
   * for it (step_batch_room). Requests admitted under configurations of different
   * batch_reserve (a reload) would find it worked out with another's share, in an order the
   * search does not keep: such a pass walks, as the planner always did. */
  for (size_t i = 0, first = n; i < n && !p.walk_all; i++) {
    if (!reqs[i].batch) continue;
    if (first == n) first = i;
    else if (reqs[i].batch_reserve != reqs[first].batch_reserve) p.walk_all = 1;
  }
  /* each request's model, and its indexes */
  for (size_t i = 0; ok && i < n; i++) {
    rm[i] = i && strcmp(reqs[i].model, reqs[i - 1].model) == 0 ? rm[i - 1] : model_of(&p, reqs[i].model);
    if (!rm[i]) {
      rm[i] = p.models[p.n_models] = arena_alloc(ctx, sizeof(plan_model));
      if (!rm[i]) {
        ok = 0;
        break;
      }
      p.n_models++;
      if (model_init(&p, rm[i], reqs[i].model, n) < 0) ok = 0;
    }
    if (ok && reqs[i].n_blocks && rm[i]->groups && !rm[i]->cache_ready && cache_init(ctx, rm[i], replicas) < 0) ok = 0;
  }
  if (ok) wait_weights(&p, reqs, rm, n, weights);
  for (size_t i = 0; i < n; i++) {
    const gw_sched_req *q = &reqs[i];
    search s = {.q = q, .ww = weights[i], .known_j = -1};
    s.best = s.free_best = s.explore = CHOICE_NONE;
    if (!ok) {
      out[i] = s.best;
      out[i].wait = GW_WAIT_NO_PHONE;
      continue;
    }
    plan_model *m = rm[i];
    s.m = m;
    s.out_tokens = q->expected_out < (double)q->max_tokens ? q->expected_out : (double)q->max_tokens;
    if (q->short_reserve > 0) {
      if (!m->quick_ready && quick_init(ctx, m, p.pr, replicas, now, nr) < 0) {
        out[i] = s.best;
        continue;
      }
      s.kept = short_kept(m, replicas, q, now);
    }
    int kept0 = s.kept;
    for (;;) {
      search_run(&p, &s, m, front);
      if (s.best.replica >= 0) break;
      if (s.kept) {
        s.kept = 0; /* only a phone whose slots are kept can serve it: they are not kept from it */
      } else if (s.any_suspect && !s.pass_suspect && !(q->batch && s.any_sound)) {
        s.pass_suspect = 1; /* only phones that failed a health check can serve it: one of them */
      } else if (q->avoid && !s.pass_avoid) {
        s.pass_avoid = 1; /* only the replica that failed can serve it: allow it again */
      } else {
        break;
      }
    }
    gw_sched_choice best = s.best;
    if (q->take_free && !best.now && s.free_best.replica >= 0) {
      /* throughput work: a free phone now beats a sooner finish later */
      s.free_best.alt_replica = best.alt_replica;
      s.free_best.alt_finish_s = best.alt_finish_s;
      best = s.free_best;
      s.best_cost = best.finish_s;
      s.best_slot = 0;
    }
    if (q->start_by_s > 0 && !best.now && best.replica >= 0 && best.finish_s - best.service_s > q->start_by_s) {
      /* the phone it would wait for frees past the time it may wait (a continuing
       * stream's client waits in silence; a request past its deadline in the queue
       * fails): planned again among the phones that start it in time, a busy one that
       * frees soon enough or one free now. The slots kept for short work stay kept (a
       * caller's own short x-fleetgate-timeout must not open them to its long work; a
       * continuing stream asks with none kept, job.c) */
      search s2 = {.q = q, .m = m, .ww = s.ww, .out_tokens = s.out_tokens, .known_j = -1, .kept = kept0,
                   .pass_avoid = s.pass_avoid, .pass_suspect = s.pass_suspect,
                   .start_by_ms = q->start_by_s * 1000.0 >= 1 ? (uint64_t)(q->start_by_s * 1000.0) : 1};
      s2.best = s2.free_best = s2.explore = CHOICE_NONE;
      search_run(&p, &s2, m, front);
      if (s2.best.replica >= 0) {
        best = s2.best;
        s.best_cost = s2.best_cost;
        s.best_slot = s2.best_slot;
      }
    }
    if (q->explore > 0 && s.explore.replica >= 0 && best.replica != s.explore.replica &&
        s.explore.finish_s <= s.best_cost * (1 + q->explore) &&
        (!(q->short_s > 0) || s.explore.finish_s - s.best_cost <= q->short_s)) {
      /* little to lose (a share of the best finish, and no more than short work's time):
       * the phone nobody measured yet gets it, and is measured */
      s.explore.alt_replica = best.alt_replica;
      s.explore.alt_finish_s = best.alt_finish_s;
      best = s.explore;
      s.best_slot = 0;
    }
    if (!best.now) best.wait = wait_reason(&p, &s, m, &best, kept0);
    if (best.replica >= 0) {
      /* its slots (as many as its choices, from the one planned on) start together, when
       * the last of them frees, and free together */
      plan_rep *r = &p.pr[best.replica];
      int last = s.best_slot + (q->choices > 1 ? q->choices - 1 : 0), free_taken = 0;
      if (last >= r->cap) last = r->cap - 1; /* (a choice made above fits: step_choices) */
      int was_free = r->free_at[s.best_slot] <= now;
      uint64_t start = r->free_at[last] > now ? r->free_at[last] : now;
      for (int k = s.best_slot; k <= last; k++) {
        free_taken += r->free_at[k] <= now;
        r->free_at[k] = start + (uint64_t)(best.service_s * 1000.0) + 1;
        r->short_at[k] = q->short_s > 0 && best.service_s <= q->short_s;
      }
      sort_slots(r->free_at, r->short_at, r->cap);
      reserved(&p, best.replica, was_free, free_taken);
    }
    out[i] = best;
  }
  if (ok && p.free0) fill_idle(&p, replicas, reqs, rm, n, out);
  arena_reset(ctx);
}
