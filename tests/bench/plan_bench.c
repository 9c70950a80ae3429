/* The planner's microbenchmark: a fleet of N phones x S slots, busy as a saturated fleet is,
 * and Q queued requests of B2's mix, planned by the gateway's real objects — what a planning
 * pass does (priors, seeds' bounds, trust caps, then gw_sched_plan over the requests) — and
 * by the planner as it was before it was made to scale (sched_ref.c), in the same run, on
 * the same fleet. Each pass's choices are compared field for field: the run fails if they
 * differ anywhere.
 *
 *   plan_bench [--phones N] [--slots S] [--queued Q] [--passes K] [--free F] [--seed X]
 *              [--cached C] [--models K] [--search] [--mixed-reserve] [--fill-idle L] [--hybrid H]
 *              [--churn] [--no-ref]
 *              [--json]
 *
 * --free: the share of slots free (default 0.02); --cached: system prompts each phone's prompt
 * cache holds (default 2 of the 4 the reviews use; 0: none); --models: 1 to 4 models, each phone
 * serving one or two; --search: the search even for models of few phones; --mixed-reserve: half
 * the batch work admitted under another batch_reserve (a reload); --hybrid H: H % of the phones'
 * prompt caches restore checkpoints (a hybrid model's engine: cached tokens are what a
 * checkpoint holds, pcache.h), the reviews carrying their user turn's place and fingerprints;
 * --churn: between passes some phones' rates move (new answers) and some phones change places
 * in the replica array (phones left and joined: what the planner kept of the last pass no
 * longer fits); --fill-idle L: every request
 * asks for the queue as a whole (gw_sched_req.fill_idle, its model's load L erlangs): the reference
 * has no such phase, so a choice may differ from it only as that phase changes one — a request
 * planned to wait there starts now on a phone left idle, at its plain service — and every other
 * choice is compared as before; --no-ref: time only the current planner
 * (the reference takes seconds a pass at 6,000 phones). Prints per pass: median and p99 in
 * ms of each, and their ratio. No libuv: the time is passed in, as the gateway's loop would. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "feat.h"
#include "predict.h"
#include "replica.h"
#include "scheduler.h"
#include "sched_ref.h"

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void) { /* xorshift64: a reproducible fleet, not a secret */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static double unif(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Four system prompts a review shares its first blocks with (a phone's cache holds some). */
#define SYSTEM_PROMPTS 4
#define SYSTEM_BLOCKS 80
#define REVIEW_BLOCKS 110

static uint64_t system_fp[SYSTEM_PROMPTS][SYSTEM_BLOCKS];

static char *model_names[] = {"m", "m1", "m2", "m3"};
static int n_model_names = 1; /* --models */
static int cached_prompts = 2; /* system prompts each phone's cache holds (--cached) */
static int mixed_reserve;      /* half the batch work under another batch_reserve (--mixed-reserve) */
static double fill_load = -1;  /* --fill-idle: every request asks, with this load (-1: none asks) */
static int hybrid_pct;         /* --hybrid: the share of phones with hybrid caches, percent */
static int churn;              /* --churn: rates move and phones change places between passes */

/* Phone classes of fleet-profiles.json (qwen3.5-0.8b on a flagship, then 0.55x and 0.3x). */
static gw_replica *make_phone(int i, int slots, uint64_t now, double free_share) {
  static const double speed[3] = {1.0, 0.55, 0.3};
  char id[32];
  snprintf(id, sizeof(id), "phone-%05d", i);
  double f = speed[i % 3] * (0.9 + 0.2 * unif());
  /* one model, or (--models) one or two of them */
  size_t first = (size_t)(rnd() % (uint64_t)n_model_names), nm = n_model_names > 1 && unif() < 0.3 ? 2 : 1;
  char *mine[2] = {model_names[first], model_names[(first + 1) % (size_t)n_model_names]};
  gw_replica *r = gw_replica_new(id, "http://127.0.0.1:1", NULL, mine, nm, slots,
                                 unif() < 0.1 ? 2048 : 8192, 466.7 * f, 40.0 * f, 0);
  if (!r) return NULL;
  r->prefill_samples = r->decode_samples = 20;
  r->n_ok = 100;
  if (unif() < 0.01) { /* new: unknown rates, explored */
    r->prefill_samples = r->decode_samples = 0;
    r->rates_default = 3;
    r->n_ok = 0;
  }
  if (unif() < 0.01) { /* hot */
    r->dev.hot = 1;
    r->dev.slow = 1.5;
    r->dev.pre0 = r->prefill_samples;
    r->dev.dec0 = r->decode_samples;
  }
  if (unif() < 0.005) r->health.probe_fail = 1; /* suspect */
  if (unif() < 0.005) r->state = GW_REPLICA_DOWN;
  for (int s = 0; s < slots; s++) {
    if (unif() < free_share) continue;
    /* running work: a filter, a chat or a review, some past their prediction */
    double kind = unif();
    uint64_t pred = kind < 0.4 ? 300 : kind < 0.7 ? 8000 : 40000;
    uint64_t elapsed = (uint64_t)((double)pred * 1.3 * unif());
    gw_replica_acquire_class(r, now - elapsed, pred, NULL, unif() < 0.1);
  }
  /* one phone in 97 low on battery: its readings hold its free slots back (no draw of the
   * random sequence, so the fleets stay those of the recorded figures) */
  if (i % 97 == 13 && r->inflight < slots) r->dev.cap = r->inflight;
  /* interactive work's recent peak here, above what it holds now: batch work leaves room */
  r->sched.inter_peak = r->sched.inter_busy + (double)(rnd() % 3);
  r->sched.inter_peak_ms = now;
  /* (--hybrid: drawn only then, so the other fleets stay those of the recorded figures) */
  if (hybrid_pct > 0 && (int)(rnd() % 100) < hybrid_pct) {
    r->features |= PR_FEAT_CHECKPOINTS;
    r->pc.hybrid = 1;
  }
  /* the engine's prompt memory: a system prompt or two */
  for (int k = 0; k < cached_prompts; k++) {
    int sp = (int)(rnd() % SYSTEM_PROMPTS);
    uint64_t b[REVIEW_BLOCKS];
    memcpy(b, system_fp[sp], sizeof(system_fp[sp]));
    for (int x = SYSTEM_BLOCKS; x < REVIEW_BLOCKS; x++) b[x] = rnd();
    if (hybrid_pct > 0) {
      /* a review as the gateway saw it go: its user turn after the system prompt, checkpoints
       * where the engine makes them (a hybrid cache), or its blocks */
      gw_pquery pq = {.blocks = b, .n_blocks = REVIEW_BLOCKS, .prompt_tokens = 7000,
                      .user_at = SYSTEM_BLOCKS * 64 - (int64_t)(rnd() % 64), .user_fp = rnd() % 4 + 1,
                      .full_fp = rnd(), .model = model_names[first]};
      gw_pcache_sent_q(&r->pc, 1, 1, &pq);
    } else {
      gw_pcache_sent(&r->pc, 1, 1, b, REVIEW_BLOCKS);
    }
  }
  return r;
}

/* B2's mix: half filters, a fifth reviews (a system prompt's blocks, then their own), the
 * rest chats; a tenth in the batch class. */
static void make_request(gw_sched_req *q, uint64_t *blocks, gw_replica **rs, int phones) {
  double k = unif();
  memset(q, 0, sizeof(*q));
  q->model = model_names[rnd() % (uint64_t)n_model_names];
  q->cache_scope = 1;
  if (k < 0.5) {
    q->prompt_tokens = 100, q->max_tokens = 4, q->expected_out = 4;
  } else if (k < 0.7) {
    q->prompt_tokens = 7000, q->max_tokens = 8, q->expected_out = 2;
    int sp = (int)(rnd() % SYSTEM_PROMPTS);
    memcpy(blocks, system_fp[sp], sizeof(system_fp[sp]));
    for (int x = SYSTEM_BLOCKS; x < REVIEW_BLOCKS; x++) blocks[x] = rnd();
    q->blocks = blocks;
    q->n_blocks = REVIEW_BLOCKS;
    if (hybrid_pct > 0) { /* its user turn: where the system prompt ends, a few kinds of case */
      q->user_at = SYSTEM_BLOCKS * 64 - (int64_t)(rnd() % 64);
      q->user_fp = rnd() % 4 + 1;
      q->full_fp = rnd();
    }
  } else {
    q->prompt_tokens = 500, q->max_tokens = 300, q->expected_out = 200;
  }
  q->batch = unif() < 0.1;
  q->batch_reserve = mixed_reserve && unif() < 0.5 ? 0.5 : 1;
  q->batch_borrow_s = 5;
  q->explore = q->batch ? 0 : 0.5;
  q->short_s = 2;
  q->short_reserve = 3;
  q->wait_weight_max = q->batch ? 0 : 2;
  if (unif() < 0.05) q->avoid = rs[rnd() % (uint64_t)phones]; /* a retry */
  if (q->batch && unif() < 0.5) q->take_free = 1;               /* a Batch API line */
  if (fill_load >= 0) q->fill_idle = 1, q->load_erlangs = fill_load;
}

/* The gateway's way: one planner memory for every pass. */
static gw_sched *sched_mem;

static void plan_now(gw_replica *const *rs, size_t nr, const gw_sched_req *q, size_t n, uint64_t now,
                     gw_sched_choice *out) {
  gw_sched_plan_with(sched_mem, rs, nr, q, n, now, out);
}

typedef void (*plan_fn)(gw_replica *const *, size_t, const gw_sched_req *, size_t, uint64_t,
                        gw_sched_choice *);

/* One pass as plan_pass does it; returns its seconds. */
static double pass(plan_fn fn, gw_replica **rs, size_t nr, const gw_sched_req *q, size_t n,
                   uint64_t now, gw_sched_choice *out) {
  double t0 = now_s();
  gw_replicas_priors(rs, nr, now, 1800);
  gw_replicas_bound_seeds(rs, nr);
  gw_replicas_trust(rs, nr, 8, now);
  fn(rs, nr, q, n, now, out);
  return now_s() - t0;
}

/* --churn, between passes: one phone in fifty answers at another pace, and one in a hundred
 * changes places with another in the replica array. */
static void churn_fleet(gw_replica **rs, int phones) {
  for (int i = 0; i < phones / 50 + 1; i++) {
    gw_replica *r = rs[rnd() % (uint64_t)phones];
    double f = 0.3 + unif();
    gw_replica_observe(r, 7000, 7000 / (466.7 * f) * 1000, 8, 8 / (40.0 * f) * 1000);
  }
  for (int i = 0; i < phones / 100 + 1; i++) {
    int x = (int)(rnd() % (uint64_t)phones), y = (int)(rnd() % (uint64_t)phones);
    gw_replica *t = rs[x];
    rs[x] = rs[y];
    rs[y] = t;
  }
}

static int same(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

/* a (fill_idle) took a free phone now where b waits: the one change the queue as a whole makes */
static int filled(const gw_sched_choice *a, const gw_sched_choice *b) {
  return fill_load >= 0 && a->now && !b->now && b->replica >= 0 && a->wait == GW_WAIT_NONE &&
         a->finish_s == a->service_s && a->alt_replica == a->replica && a->finish_s > b->finish_s;
}

static long n_filled;

static long differs(const gw_sched_choice *a, const gw_sched_choice *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (filled(&a[i], &b[i])) {
      n_filled++;
      continue;
    }
    if (a[i].replica != b[i].replica || a[i].now != b[i].now || !same(a[i].finish_s, b[i].finish_s) ||
        !same(a[i].service_s, b[i].service_s) || !same(a[i].prefill_s, b[i].prefill_s) ||
        a[i].cached_tokens != b[i].cached_tokens || !same(a[i].alt_finish_s, b[i].alt_finish_s) ||
        a[i].alt_replica != b[i].alt_replica || a[i].wait != b[i].wait)
      return (long)i;
  }
  return -1;
}

static double pct(double *v, int n, double p) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  int k = (int)ceil(p * n) - 1;
  return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

int main(int argc, char **argv) {
  int phones = 100, slots = 4, queued = 1000, passes = 5, ref = 1, json = 0, search_all = 0;
  double free_share = 0.02;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--phones") == 0 && v) phones = atoi(v), i++;
    else if (strcmp(a, "--slots") == 0 && v) slots = atoi(v), i++;
    else if (strcmp(a, "--queued") == 0 && v) queued = atoi(v), i++;
    else if (strcmp(a, "--passes") == 0 && v) passes = atoi(v), i++;
    else if (strcmp(a, "--free") == 0 && v) free_share = atof(v), i++;
    else if (strcmp(a, "--seed") == 0 && v) rng_state = strtoull(v, NULL, 10) | 1, i++;
    else if (strcmp(a, "--cached") == 0 && v) cached_prompts = atoi(v), i++;
    else if (strcmp(a, "--models") == 0 && v) n_model_names = atoi(v), i++;
    else if (strcmp(a, "--search") == 0) search_all = 1;
    else if (strcmp(a, "--mixed-reserve") == 0) mixed_reserve = 1;
    else if (strcmp(a, "--fill-idle") == 0 && v) fill_load = atof(v), i++;
    else if (strcmp(a, "--hybrid") == 0 && v) hybrid_pct = atoi(v), i++;
    else if (strcmp(a, "--churn") == 0) churn = 1;
    else if (strcmp(a, "--no-ref") == 0) ref = 0;
    else if (strcmp(a, "--json") == 0) json = 1;
    else {
      fprintf(stderr, "usage: %s [--phones N] [--slots S] [--queued Q] [--passes K] [--free F] "
                      "[--seed X] [--cached C] [--models K] [--search] [--mixed-reserve] [--fill-idle L] [--hybrid H] "
                      "[--churn] [--no-ref] "
                      "[--json]\n", argv[0]);
      return 2;
    }
  }
  if (phones < 1 || slots < 1 || slots > GW_MAX_SLOTS || queued < 0 || passes < 1 || n_model_names < 1 ||
      n_model_names > 4)
    return 2;
  for (int s = 0; s < SYSTEM_PROMPTS; s++)
    for (int b = 0; b < SYSTEM_BLOCKS; b++) system_fp[s][b] = rnd();
  uint64_t now = 10000000;
  if (!(sched_mem = gw_sched_new())) return 1;
  if (search_all) gw_sched_walk_max(sched_mem, 0);
  gw_replica **rs = calloc((size_t)phones, sizeof(*rs));
  gw_sched_req *q = calloc((size_t)queued + 1, sizeof(*q));
  uint64_t *blocks = calloc(((size_t)queued + 1) * REVIEW_BLOCKS, sizeof(*blocks));
  gw_sched_choice *a = calloc((size_t)queued + 1, sizeof(*a)), *b = calloc((size_t)queued + 1, sizeof(*b));
  double *ta = calloc((size_t)passes, sizeof(double)), *tb = calloc((size_t)passes, sizeof(double));
  if (!rs || !q || !blocks || !a || !b || !ta || !tb) return 1;
  for (int i = 0; i < phones; i++)
    if (!(rs[i] = make_phone(i, slots, now, free_share))) return 1;
  for (int i = 0; i < queued; i++) make_request(&q[i], blocks + (size_t)i * REVIEW_BLOCKS, rs, phones);
  int bad = 0;
  for (int p = 0; p < passes; p++) {
    uint64_t t = now + (uint64_t)p * 100; /* a pass every tick */
    if (churn && p > 0) churn_fleet(rs, phones);
    ta[p] = pass(plan_now, rs, (size_t)phones, q, (size_t)queued, t, a);
    if (ref) {
      tb[p] = pass(ref_sched_plan, rs, (size_t)phones, q, (size_t)queued, t, b);
      long d = differs(a, b, (size_t)queued);
      if (d >= 0) {
        fprintf(stderr, "pass %d: request %ld planned differently: replica %d now %d finish %.17g, "
                        "reference %d %d %.17g\n", p, d, a[d].replica, a[d].now, a[d].finish_s,
                b[d].replica, b[d].now, b[d].finish_s);
        bad = 1;
      }
    }
  }
  int now_n = 0;
  for (int i = 0; i < queued; i++) now_n += a[i].now;
  double med = pct(ta, passes, 0.5) * 1e3, p99 = pct(ta, passes, 0.99) * 1e3;
  double rmed = ref ? pct(tb, passes, 0.5) * 1e3 : 0, rp99 = ref ? pct(tb, passes, 0.99) * 1e3 : 0;
  if (json)
    printf("{\"phones\":%d,\"slots\":%d,\"queued\":%d,\"passes\":%d,\"dispatched\":%d,\"pass_ms_p50\":%.3f,"
           "\"pass_ms_p99\":%.3f,\"ref_ms_p50\":%.3f,\"ref_ms_p99\":%.3f,\"same\":%s,\"filled\":%ld}\n",
           phones, slots, queued, passes, now_n, med, p99, rmed, rp99, bad ? "false" : "true", n_filled);
  else if (ref)
    printf("%5d phones x %d slots, %6d queued (%d start now): pass %9.3f ms p50, %9.3f ms p99; "
           "before %9.3f / %9.3f ms: %.1fx faster; choices %s", phones, slots, queued, now_n, med,
           p99, rmed, rp99, med > 0 ? rmed / med : 0, bad ? "DIFFER" : "identical");
  if (ref && !json)
    printf(fill_load >= 0 ? " (but %ld moved onto idle phones over the passes)\n" : "\n", n_filled);
  else
    printf("%5d phones x %d slots, %6d queued (%d start now): pass %9.3f ms p50, %9.3f ms p99\n",
           phones, slots, queued, now_n, med, p99);
  for (int i = 0; i < phones; i++) gw_replica_free(rs[i]);
  free(rs);
  free(q);
  free(blocks);
  free(a);
  free(b);
  free(ta);
  free(tb);
  gw_sched_free(sched_mem);
  return bad;
}
