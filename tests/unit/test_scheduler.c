/* Unit tests for gateway/scheduler.c and gateway/replica.c: the finish-soonest choice,
 * waiting for a fast busy phone, reservations within a pass, context fit, leases,
 * learned rates, passive health with growing cool-downs and probation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "feat.h"
#include "gw.h"
#include "oai.h"
#include "replica.h"
#include "healthsched.h"
#include "scheduler.h"

static char *models[] = {"m"};

static gw_replica *rep(const char *id, int slots, double pre, double dec, int64_t n_ctx) {
  gw_replica *r = gw_replica_new(id, "http://127.0.0.1:1", NULL, models, 1, slots, n_ctx, pre, dec, 0);
  assert_non_null(r);
  return r;
}

static gw_sched_req req(int64_t prompt, int64_t cap) {
  gw_sched_req q = {.model = "m", .prompt_tokens = prompt, .max_tokens = cap, .expected_out = (double)cap};
  return q;
}

static void test_prefers_faster_free(void **state) {
  gw_replica *r[2] = {rep("slow", 1, 10, 1, 0), rep("fast", 1, 100, 10, 0)};
  gw_sched_req q = req(1000, 10);
  gw_sched_choice c;
  gw_sched_plan(r, 2, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  assert_true(c.now);
  /* 1000/100 + 10/10 = 11 s */
  assert_true(c.finish_s > 10.9 && c.finish_s < 11.1);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

static void test_waits_for_fast_busy_phone(void **state) {
  gw_replica *r[2] = {rep("slow", 1, 10, 1, 0), rep("fast", 1, 100, 10, 0)};
  uint64_t now = 100000;
  /* fast is busy for 2 more seconds; slow is free but needs 110 s */
  gw_replica_acquire(r[1], now - 1000, 3000, NULL);
  gw_sched_req q = req(1000, 10);
  gw_sched_choice c;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_false(c.now);
  assert_int_equal(c.alt_replica, 0);
  assert_true(c.finish_s < c.alt_finish_s);
  /* batch work takes the free slow phone: throughput before one line's finish */
  q.take_free = 1;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_true(c.now);
  assert_true(c.service_s > 100);
  q.take_free = 0;
  /* one that may wait at most 1 s to start (a continuing stream's silence limit, a
   * deadline in the queue) takes the free phone: fast frees in 2 s */
  q.start_by_s = 1;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_true(c.now);
  assert_int_equal(c.alt_replica, 0);
  /* with 3 s to start it waits for fast, as it would with no limit */
  q.start_by_s = 3;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_false(c.now);
  q.start_by_s = 0;
  /* if fast were busy for 200 s, the slow free phone wins */
  gw_replica_release(r[1], 1);
  gw_replica_acquire(r[1], now, 200000, NULL);
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_true(c.now);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* A request that may wait at most start_by_s to start takes the phone that finishes it
 * soonest among those that start it in time: a busy one that frees soon enough before a
 * much slower free one. */
static void test_start_by_prefers_a_phone_that_starts_in_time(void **state) {
  (void)state;
  gw_replica *r[3] = {rep("slow", 1, 10, 1, 0), rep("mid", 1, 50, 5, 0), rep("fast", 1, 100, 10, 0)};
  uint64_t now = 100000;
  gw_replica_acquire(r[2], now, 10000, NULL); /* fast: free in 10 s, finishes at 21 s */
  gw_replica_acquire(r[1], now, 1000, NULL);  /* mid: free in 1 s, finishes at 23 s */
  gw_sched_req q = req(1000, 10);             /* slow, free: 110 s */
  gw_sched_choice c;
  gw_sched_plan(r, 3, &q, 1, now, &c);
  assert_int_equal(c.replica, 2);
  q.start_by_s = 4;
  gw_sched_plan(r, 3, &q, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_false(c.now);
  assert_true(fabs(c.finish_s - 23) < 0.01);
  /* none starts it within 0.5 s but the free one */
  q.start_by_s = 0.5;
  gw_sched_plan(r, 3, &q, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_true(c.now);
  for (int i = 0; i < 3; i++) gw_replica_free(r[i]);
}

/* A wait weighed by wait_weight: the weight from the sizes, and the choice it changes. */
static void test_wait_weight(void **state) {
  /* the longest work plans on plain times; shorter work by the ratio, at most max */
  assert_true(gw_sched_wait_weight(15.2, 15.2, 2) == 1);
  assert_true(fabs(gw_sched_wait_weight(10, 15, 2) - 1.5) < 1e-9);
  assert_true(gw_sched_wait_weight(5, 15, 2) == 2);
  assert_true(gw_sched_wait_weight(5, 15, 1) == 1);   /* 1: off */
  assert_true(gw_sched_wait_weight(0, 15, 2) == 1);   /* nothing known */
  assert_true(gw_sched_wait_weight(20, 15, 2) == 1);  /* longer than the longest: plain */

  /* fast: 1 slot busy for 10 more s; slow: free, 3.3x slower. A chat of 8 s on fast
   * (26.7 s on slow) waits for fast: 10 + 8 = 18 s beats 26.7 s. */
  gw_replica *r[2] = {rep("slow", 1, 30, 3, 0), rep("fast", 1, 100, 10, 0)};
  uint64_t now = 100000;
  gw_replica_acquire(r[1], now, 10000, NULL);
  gw_sched_req q[2] = {req(300, 50), req(2000, 2)}; /* chat: 3 + 5 = 8 s on fast; review 20.2 s */
  q[0].wait_weight_max = q[1].wait_weight_max = 2;
  gw_sched_choice c[2];
  /* alone, the chat is the longest long work of the pass: plain finish times, it waits */
  gw_sched_plan(r, 2, q, 1, now, c);
  assert_int_equal(c[0].replica, 1);
  assert_false(c[0].now);
  assert_true(fabs(c[0].finish_s - 18.0) < 0.01);
  /* beside the review, its wait weighs min(2, 20.2 / 8) = 2: 2 x 10 + 8 = 28 > 26.7, it
   * takes slow now; the review, the longest, still waits for fast (10 + 20.2 s) */
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_int_equal(c[0].replica, 0);
  assert_true(c[0].now);
  assert_true(fabs(c[0].finish_s - (300.0 / 30 + 50.0 / 3)) < 0.01); /* the plain time */
  assert_int_equal(c[1].replica, 1);
  assert_false(c[1].now);
  assert_true(fabs(c[1].finish_s - 30.2) < 0.01);
  /* wait_weight_max 1: plain finish times, the chat waits for fast (and the review after it) */
  q[0].wait_weight_max = q[1].wait_weight_max = 1;
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_int_equal(c[0].replica, 1);
  assert_false(c[0].now);
  q[0].wait_weight_max = q[1].wait_weight_max = 2;
  /* short work is not weighed (a chat of 8 s is short when short_s is 10) */
  q[0].short_s = q[1].short_s = 10;
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_int_equal(c[0].replica, 1);
  assert_false(c[0].now);
  q[0].short_s = q[1].short_s = 0;
  /* nor beside another model's longer work */
  q[1].model = "other";
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_int_equal(c[0].replica, 1);
  assert_false(c[0].now);
  q[1].model = "m";
  /* nor beside batch work */
  q[1].batch = 1;
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_int_equal(c[0].replica, 1);
  assert_false(c[0].now);
  q[1].batch = 0;
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* The queue as a whole (fill_idle): a phone the plan leaves idle takes the waiting request
 * that loses least there when the faster phones cannot clear their queue and the work that
 * comes before it would finish; else it idles. */
static void test_fill_idle(void **state) {
  (void)state;
  /* fast: 1 slot busy for 10 more s; slow: free, 3.3x slower. Reviews of 20.2 s on fast,
   * 67.3 s on slow: two wait for fast (finish 30.2 and 50.4 s, both before 67.3 s). */
  gw_replica *r[2] = {rep("slow", 1, 30, 3, 0), rep("fast", 1, 100, 10, 0)};
  uint64_t now = 100000;
  gw_replica_acquire(r[1], now, 10000, NULL);
  gw_sched_req q[2] = {req(2000, 2), req(2000, 2)};
  q[0].fill_idle = q[1].fill_idle = 1;
  gw_sched_choice c[2];
  /* nothing comes: fast clears both by 50.4 s (queued 40.4 s of work < its 57.3 s before
   * 67.3 s): slow idles, both wait */
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_int_equal(c[0].replica, 1);
  assert_false(c[0].now);
  assert_int_equal(c[1].replica, 1);
  assert_false(c[1].now);
  assert_int_equal(c[1].wait, GW_WAIT_FASTER);
  /* half a slot of work a second comes: 40.4 + 0.5 x 67.3 = 74 > 57.3: fast cannot clear
   * it before slow would finish; the second (it loses 16.9 s, the first 37.1 s) takes slow */
  q[0].load_erlangs = q[1].load_erlangs = 0.5;
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_int_equal(c[0].replica, 1);
  assert_false(c[0].now);
  assert_int_equal(c[1].replica, 0);
  assert_true(c[1].now);
  assert_int_equal(c[1].wait, GW_WAIT_NONE);
  assert_true(fabs(c[1].finish_s - (2000.0 / 30 + 2.0 / 3)) < 0.01);
  assert_true(fabs(c[1].service_s - c[1].finish_s) < 1e-9);
  assert_int_equal(c[1].alt_replica, 0); /* the best free phone: the one it takes */
  assert_true(c[1].alt_finish_s == c[1].finish_s);
  /* off: each waits for the phone that finishes it soonest */
  q[0].fill_idle = q[1].fill_idle = 0;
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_int_equal(c[1].replica, 1);
  assert_false(c[1].now);
  q[0].fill_idle = q[1].fill_idle = 1;
  /* short work is not moved (short_s 100: a review is short), nor batch work */
  q[0].short_s = q[1].short_s = 100;
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_false(c[1].now);
  q[0].short_s = q[1].short_s = 0;
  q[0].batch = q[1].batch = 1; /* (batch work plans by its own rules: room for interactive work) */
  gw_sched_choice off[2];
  gw_sched_plan(r, 2, q, 2, now, c);
  q[0].fill_idle = q[1].fill_idle = 0;
  gw_sched_plan(r, 2, q, 2, now, off);
  assert_memory_equal(c, off, sizeof(c));
  q[0].fill_idle = q[1].fill_idle = 1;
  q[0].batch = q[1].batch = 0;
  /* a request that just failed on slow does not go back to it */
  q[1].avoid = r[0];
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_int_equal(c[0].replica, 0);  /* the first takes it: the second may not */
  assert_true(c[0].now);
  assert_int_equal(c[1].replica, 1);
  assert_false(c[1].now);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* The queue as a whole moves a request of several choices onto an idle phone only with
 * as many slots free, and takes them all: one free slot of two is not two. */
static void test_fill_idle_takes_every_slot_of_its_choices(void **state) {
  (void)state;
  gw_replica *r[2] = {rep("slow", 2, 30, 3, 0), rep("fast", 2, 100, 10, 0)};
  for (int i = 0; i < 2; i++) gw_replica_set_features(r[i], PR_FEAT_CHOICES, 2);
  uint64_t now = 100000;
  gw_replica_acquire(r[1], now, 10000, NULL);
  gw_replica_acquire(r[1], now, 10000, NULL);
  gw_replica_acquire(r[0], now, 1000000, NULL); /* slow: one slot of two free */
  gw_sched_req q[2] = {req(2000, 2), req(2000, 2)};
  for (int i = 0; i < 2; i++) {
    q[i].fill_idle = 1;
    q[i].load_erlangs = 2; /* more work coming than fast's two slots clear (40.4 + 2 x 67.3
                              > 2 x 57.3 s): an idle phone takes what it can */
    q[i].choices = 2;
  }
  gw_sched_choice c[2];
  gw_sched_plan(r, 2, q, 2, now, c);
  for (int i = 0; i < 2; i++) assert_false(c[i].now); /* (before: the second took slow's one slot) */
  /* both of slow's slots free: the second takes them both, and the first still waits
   * (before: each took one) */
  gw_replica_release(r[0], 1);
  gw_sched_plan(r, 2, q, 2, now, c);
  assert_false(c[0].now);
  assert_int_equal(c[1].replica, 0);
  assert_true(c[1].now);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* A slot kept for short work on a quick phone of median pace serves the short work it is
 * kept for, though a guard's message takes a little over short_s there (it is short on the
 * quickest phone); long work still leaves it. */
static void test_kept_slot_serves_short_work_of_the_quickest(void **state) {
  (void)state;
  gw_replica *r[3] = {rep("fast", 2, 1000, 100, 0), rep("mid", 2, 500, 50, 0), rep("slow", 2, 100, 10, 0)};
  uint64_t now = 100000;
  gw_replica_acquire(r[0], now, 10000, NULL);
  gw_replica_acquire(r[0], now, 10000, NULL);
  gw_replica_acquire(r[1], now, 10000, NULL);
  /* quick: fast and mid (4 slots: one kept); mid's free slot is the one kept */
  gw_sched_req q = req(100, 4); /* 0.14 s on fast, 0.28 s on mid, 1.4 s on slow */
  q.short_s = 0.2;
  q.short_reserve = 1;
  gw_sched_choice c;
  gw_sched_plan(r, 3, &q, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_true(c.now);
  /* a review leaves it: the slow phone, free, or a wait */
  gw_sched_req l = req(2000, 4); /* 2.04 s on fast (after 10 s), 4.08 s on mid, 20.4 s on slow */
  l.short_s = 0.2;
  l.short_reserve = 1;
  gw_sched_plan(r, 3, &l, 1, now, &c);
  assert_int_not_equal(c.replica, 1);
  /* nor when it may not wait for fast (its own short deadline): the free slow phone */
  l.start_by_s = 0.5;
  gw_sched_plan(r, 3, &l, 1, now, &c);
  assert_int_equal(c.replica, 2);
  assert_true(c.now);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
  gw_replica_free(r[2]);
}

static void test_batch_leaves_interactive_room(void **state) {
  (void)state;
  gw_replica *r[2] = {rep("flag", 4, 100, 10, 0), rep("budget", 2, 10, 1, 0)};
  uint64_t now = 1000000;
  /* interactive work held 3 of flag's slots a moment ago */
  uint64_t l[3];
  for (int i = 0; i < 3; i++) l[i] = gw_replica_acquire(r[0], now - 2000, 1000, NULL);
  for (int i = 0; i < 3; i++) gw_replica_release(r[0], l[i]);
  assert_int_equal(gw_replica_interactive_reserve(r[0], now, 1), 3);
  assert_int_equal(gw_replica_interactive_reserve(r[1], now, 1), 0);
  /* batch lines: one slot of flag (4 free, 3 kept), then the budget phone */
  gw_sched_req q[4];
  for (int i = 0; i < 4; i++) {
    q[i] = req(100, 10);
    q[i].batch = q[i].take_free = 1;
    q[i].batch_reserve = 1;
  }
  gw_sched_choice c[4];
  gw_sched_plan(r, 2, q, 4, now, c);
  assert_int_equal(c[0].replica, 0);
  assert_true(c[0].now);
  assert_int_equal(c[1].replica, 1);
  assert_int_equal(c[2].replica, 1);
  assert_int_equal(c[3].replica, -1); /* nothing left that interactive work does not want */
  /* a batch slot held does not raise the peak; an interactive request is not held back */
  uint64_t b = gw_replica_acquire_class(r[0], now, 1000, NULL, 1);
  assert_int_equal(gw_replica_interactive_reserve(r[0], now, 1), 3);
  gw_sched_req in = req(100, 10);
  gw_sched_plan(r, 2, &in, 1, now, c);
  assert_int_equal(c[0].replica, 0);
  assert_true(c[0].now);
  gw_replica_release(r[0], b);
  /* half the peak held back: two of flag's four slots go to batch work */
  assert_int_equal(gw_replica_interactive_reserve(r[0], now, 0.5), 2);
  /* the peak fades within minutes of interactive work leaving */
  assert_int_equal(gw_replica_interactive_reserve(r[0], now + 60000, 1), 1); /* 3 x e^-1 */
  assert_int_equal(gw_replica_interactive_reserve(r[0], now + 300000, 1), 0);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

static void test_reservations_spread_work(void **state) {
  /* one phone with 2 slots: two requests go now, the third waits and reserves */
  gw_replica *r[2] = {rep("a", 2, 100, 10, 0), rep("b", 1, 50, 5, 0)};
  gw_sched_req q[4] = {req(100, 10), req(100, 10), req(100, 10), req(100, 10)};
  gw_sched_choice c[4];
  gw_sched_plan(r, 2, q, 4, 5000, c);
  assert_int_equal(c[0].replica, 0);
  assert_true(c[0].now);
  assert_int_equal(c[1].replica, 0);
  assert_true(c[1].now);
  /* a is full: b finishes in 2+2=4 s, a frees in 2 s and needs 2 more: 4 s too, either */
  assert_true(c[2].replica >= 0);
  int n_now = 0;
  for (int i = 0; i < 4; i++) n_now += c[i].now;
  assert_true(n_now <= 3); /* never more dispatches than free slots */
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

static void test_context_fit_and_model(void **state) {
  gw_replica *r[2] = {rep("small", 1, 100, 10, 2048), rep("big", 1, 10, 1, 8192)};
  gw_sched_req q = req(4000, 100);
  gw_sched_choice c;
  gw_sched_plan(r, 2, &q, 1, 0, &c);
  assert_int_equal(c.replica, 1); /* only big fits, though slower */
  gw_sched_req other = {.model = "other", .prompt_tokens = 10, .max_tokens = 10, .expected_out = 10};
  gw_sched_plan(r, 2, &other, 1, 0, &c);
  assert_int_equal(c.replica, -1);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

static void test_avoid_failed_replica(void **state) {
  gw_replica *r[2] = {rep("fast", 1, 100, 10, 0), rep("slow", 1, 10, 1, 0)};
  gw_sched_req q = req(100, 10);
  q.avoid = r[0];
  gw_sched_choice c;
  gw_sched_plan(r, 2, &q, 1, 0, &c);
  assert_int_equal(c.replica, 1);
  /* when only the failed one can serve, it is used again */
  gw_sched_plan(r, 1, &q, 1, 0, &c);
  assert_int_equal(c.replica, 0);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* A prompt of scope 1 went to r, the engine choosing its slot. */
static void sent(gw_replica *r, const uint64_t *blocks, size_t n) {
  gw_pcache_sent(&r->pc, 1, 1, blocks, n);
}

static void test_cached_prefix_lowers_prediction(void **state) {
  gw_replica *r[2] = {rep("a", 1, 100, 10, 0), rep("b", 1, 100, 10, 0)};
  uint64_t blocks[20];
  for (int i = 0; i < 20; i++) blocks[i] = 1000 + (uint64_t)i;
  sent(r[1], blocks, 20);
  gw_sched_req q = req(20 * PR_OAI_BLOCK_CHARS / 4 + 10, 4);
  q.blocks = blocks;
  q.n_blocks = 20;
  q.cache_scope = 1;
  gw_sched_choice c;
  gw_sched_plan(r, 2, &q, 1, 0, &c);
  assert_int_equal(c.replica, 1);
  assert_int_equal(c.cached_tokens, 20 * PR_OAI_BLOCK_CHARS / 4);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* As llama-server picks a slot: a prompt that shares under half of itself with a cached
 * one (a preamble) goes to the oldest slot and leaves that one cached; one sharing more
 * replaces it. */
static void test_prompt_memory_follows_slot_similarity(void **state) {
  gw_replica *r = rep("two", 2, 100, 10, 0);
  uint64_t a[20], b[20], c[20];
  for (int i = 0; i < 20; i++) {
    a[i] = 1000 + (uint64_t)i;
    b[i] = i < 2 ? a[i] : 2000 + (uint64_t)i; /* shares 2 of 20 blocks */
    c[i] = i < 15 ? a[i] : 3000 + (uint64_t)i; /* shares 15 of 20 */
  }
  const int64_t full = 20 * PR_OAI_BLOCK_CHARS / 4;
  sent(r, a, 20);
  sent(r, b, 20);
  assert_int_equal(gw_pcache_cached_tokens(&r->pc, 1, a, 20), full);
  assert_int_equal(gw_pcache_cached_tokens(&r->pc, 1, b, 20), full);
  sent(r, c, 20); /* most like a: takes a's slot */
  assert_int_equal(gw_pcache_cached_tokens(&r->pc, 1, c, 20), full);
  assert_int_equal(gw_pcache_cached_tokens(&r->pc, 1, b, 20), full);
  assert_int_equal(gw_pcache_cached_tokens(&r->pc, 1, a, 20), 15 * PR_OAI_BLOCK_CHARS / 4);
  gw_replica_free(r);
}

static void test_overrunning_phone_looks_slower(void **state) {
  gw_replica *r[2] = {rep("turned-slow", 2, 100, 10, 0), rep("steady", 1, 60, 6, 0)};
  uint64_t now = 100000;
  gw_sched_req q = req(600, 10);
  gw_sched_choice c;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, 0); /* 7 s against 11.7 s */
  /* a request predicted to take 7 s has run 35 s on it: it runs 5x slower now */
  gw_replica_acquire(r[0], now - 35000, 7000, NULL);
  assert_true(gw_replica_slowdown(r[0], now) > 4.9 && gw_replica_slowdown(r[0], now) < 5.1);
  assert_true(gw_replica_slowdown(r[1], now) == 1.0);
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, 1); /* its free slot would take ~35 s */
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

static void test_leases_and_wait(void **state) {
  gw_replica *r = rep("a", 2, 100, 10, 0);
  assert_int_equal(gw_replica_wait_ms(r, 0), 0);
  uint64_t l1 = gw_replica_acquire(r, 0, 5000, NULL);
  uint64_t l2 = gw_replica_acquire(r, 0, 3000, NULL);
  assert_int_equal(r->inflight, 2);
  assert_int_equal(gw_replica_wait_ms(r, 1000), 2000);
  /* overrunning: at 10 s both are late; wait = a quarter of the elapsed time */
  assert_int_equal(gw_replica_wait_ms(r, 10000), 2501);
  gw_replica_release(r, l2);
  gw_replica_release(r, l2); /* twice is harmless */
  assert_int_equal(r->inflight, 1);
  assert_int_equal(gw_replica_wait_ms(r, 1000), 0);
  gw_replica_release(r, l1);
  assert_int_equal(r->inflight, 0);
  gw_replica_free(r);
}

static void test_learning_rates(void **state) {
  gw_replica *r = rep("a", 1, 50, 5, 0);
  for (int i = 0; i < 20; i++) gw_replica_observe(r, 1000, 5000, 100, 5000); /* 200, 20 t/s */
  assert_true(r->prefill_tps > 195 && r->prefill_tps < 205);
  assert_true(r->decode_tps > 19.5 && r->decode_tps < 20.5);
  /* tiny samples are ignored */
  gw_replica_observe(r, 1, 1000, 1, 1000);
  assert_true(r->prefill_tps > 195);
  gw_replica_free(r);
}

static void test_health_cooldown_probation(void **state) {
  gw_replica *r = rep("a", 4, 50, 5, 0);
  assert_int_equal(gw_replica_capacity(r, 0), 4);
  assert_int_equal(gw_replica_failure(r, 0, 2, 1.0, 8.0, "x"), 0);
  assert_int_equal(gw_replica_failure(r, 0, 2, 1.0, 8.0, "x"), 1);
  assert_int_equal(r->state, GW_REPLICA_DOWN);
  assert_int_equal(gw_replica_capacity(r, 0), 0);
  assert_int_equal(gw_replica_tick(r, 500), 0);
  assert_int_equal(gw_replica_tick(r, 1000), 1);
  assert_int_equal(r->state, GW_REPLICA_READY);
  assert_int_equal(gw_replica_capacity(r, 1000), 1); /* probation: one slot */
  /* failing on probation ejects at once, for twice as long */
  assert_int_equal(gw_replica_failure(r, 1000, 2, 1.0, 8.0, "x"), 1);
  assert_int_equal(r->down_until_ms, 3000);
  gw_replica_tick(r, 3000);
  assert_int_equal(gw_replica_success(r, 3000), 1);
  assert_int_equal(gw_replica_capacity(r, 3000), 4);
  gw_replica_free(r);
}

/* Clients accepted at most for an open-files limit: two descriptors each (client and
 * phone), after a reserve for the daemon's own and kept-alive phone connections. */
static void test_descriptor_budget(void **state) {
  (void)state;
  assert_int_equal(gw_idle_conn_cap(20000, 0), 312);
  assert_int_equal(gw_conn_budget(20000, 0), (20000 - 32 - 312) / 2);
  assert_int_equal(gw_idle_conn_cap(90, 0), 4);
  assert_int_equal(gw_conn_budget(90, 0), 27);
  assert_int_equal(gw_idle_conn_cap(1048576, 0), 1024);
  assert_int_equal(gw_conn_budget(1048576, 0), (1048576 - 32 - 1024) / 2);
  /* a fleet larger than that keeps a connection per phone (and an eighth more), up to a
   * third of the descriptors; the clients' share shrinks by as much */
  assert_int_equal(gw_idle_conn_cap(20000, 100), 312);
  assert_int_equal(gw_idle_conn_cap(1048576, 6000), 6000 + 750);
  assert_int_equal(gw_idle_conn_cap(20000, 6000), 20000 / 3);
  assert_int_equal(gw_conn_budget(20000, 6000), (20000 - 32 - 20000 / 3) / 2);
  for (uint64_t nf = 0; nf < 100; nf++) { /* tiny limits still let one client in */
    size_t b = gw_conn_budget(nf, 0);
    assert_true(b >= 1);
    if (nf > 40) assert_true(2 * b + 32 + gw_idle_conn_cap(nf, 0) <= nf);
  }
  for (size_t phones = 0; phones < 50000; phones += 997) /* never more than there is room for */
    assert_true(2 * gw_conn_budget(20000, phones) + 32 + gw_idle_conn_cap(20000, phones) <= 20000);
  /* each host's cache keeps its share (libcurl's MAXCONNECTS caps each host's cache):
   * a few phones keep many each, a large fleet one each, however small the limit */
  assert_int_equal(gw_idle_conn_per_host(20000, 0), 312);
  assert_int_equal(gw_idle_conn_per_host(20000, 12), 312 / 12);
  assert_int_equal(gw_idle_conn_per_host(1048576, 6000), 1);
  assert_int_equal(gw_idle_conn_per_host(20000, 6000), 1);
  assert_int_equal(gw_idle_conn_per_host(90, 1000), 1);
  for (size_t phones = 1; phones < 50000; phones += 997) /* the fleet's kept ones fit the cap */
    if (phones <= gw_idle_conn_cap(20000, phones))
      assert_true(phones * gw_idle_conn_per_host(20000, phones) <= gw_idle_conn_cap(20000, phones));
}

/* Slots kept for short work: 2 quick phones (4 slots each, 1000 tokens/s) and 2 slow
 * ones (4 slots, 100 tokens/s); the median pace is 1000, so the quick set is 8 slots and
 * a reserve of 1 (at most 8 / 4 = 2) holds. */
static void test_short_reserve(void **state) {
  gw_replica *r[4] = {rep("q1", 4, 1000, 100, 0), rep("q2", 4, 1000, 100, 0),
                      rep("s1", 4, 100, 10, 0), rep("s2", 4, 100, 10, 0)};
  uint64_t now = 1000000;
  for (int i = 0; i < 4; i++) gw_replica_acquire(r[0], now - 1000, 60000, NULL); /* q1 full */
  for (int i = 0; i < 3; i++) gw_replica_acquire(r[1], now - 1000, 30000, NULL); /* q2: 1 free */
  gw_sched_req lng = req(7000, 8), shrt = req(100, 4);
  lng.short_s = shrt.short_s = 2;
  lng.short_reserve = shrt.short_reserve = 1;
  gw_sched_choice c;
  /* the long request leaves q2's last free slot: it plans on a slot that frees later or a
   * slow phone (7000 / 1000 + 29 s wait vs 70 s on s1: it waits for q2's next slot) */
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_false(c.now);
  assert_true(c.finish_s > 36.0 && c.finish_s < 36.2); /* 29 s + 7 s + 0.08 s */
  /* the short one takes the kept slot at once */
  gw_sched_plan(r, 4, &shrt, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_true(c.now);
  /* in one pass, long then short: the short one still finds the kept slot */
  gw_sched_req both[2] = {lng, shrt};
  gw_sched_choice cs[2];
  gw_sched_plan(r, 4, both, 2, now, cs);
  assert_int_equal(cs[0].replica, 1);
  assert_false(cs[0].now);
  assert_int_equal(cs[1].replica, 1);
  assert_true(cs[1].now);
  /* without the reserve, the long request takes it */
  lng.short_reserve = 0;
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_true(c.now);
  /* two quick slots free: the long request takes one, a second long one not the other */
  lng.short_reserve = 1;
  gw_replica_release(r[1], r[1]->leases[0].id);
  gw_sched_req two[2] = {lng, lng};
  gw_sched_plan(r, 4, two, 2, now, cs);
  assert_int_equal(cs[0].replica, 1);
  assert_true(cs[0].now);
  assert_true(cs[1].replica >= 0);
  assert_false(cs[1].replica == 1 && cs[1].now);
  /* short work running on a quick slot keeps that slot's place: with a guard's message on
   * q1, q2's one free slot is not kept, and the long request takes it */
  gw_replica_acquire(r[1], now, 30000, NULL); /* back to one free */
  gw_replica_release(r[0], r[0]->leases[0].id);
  uint64_t g = gw_replica_acquire(r[0], now - 100, 500, NULL); /* a 0.5 s job, running */
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_true(c.now);
  /* ...and once it ended, the slot is kept again */
  gw_replica_release(r[0], g);
  gw_replica_acquire(r[0], now - 1000, 60000, NULL);
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_false(c.now);
  /* work short on that phone (within short_s) may take the kept slot whatever it is */
  gw_sched_req mid = req(1500, 8);            /* 1.5 s + 0.08 s on q2 */
  mid.short_s = 2;
  mid.short_reserve = 1;
  gw_sched_plan(r, 4, &mid, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_true(c.now);
  for (int i = 0; i < 4; i++) gw_replica_free(r[i]);
}

/* A slot running short work stays kept when it frees, so long work does not plan on it:
 * in one pass, a long request ahead of a short one leaves it to the short one, which
 * would else find it taken and go to a slow phone. */
static void test_short_reserve_busy_kept_slot(void **state) {
  (void)state;
  gw_replica *r[4] = {rep("q1", 4, 1000, 100, 0), rep("q2", 4, 1000, 100, 0),
                      rep("s1", 4, 100, 10, 0), rep("s2", 4, 100, 10, 0)};
  uint64_t now = 1000000;
  for (int i = 0; i < 4; i++) gw_replica_acquire(r[0], now - 1000, 60000, NULL); /* q1 full */
  for (int i = 0; i < 3; i++) gw_replica_acquire(r[1], now - 1000, 30000, NULL);
  gw_replica_acquire(r[1], now - 200, 500, NULL); /* q2's 4th: short work, 0.3 s to go */
  gw_sched_req lng = req(7000, 8), shrt = req(100, 4);
  lng.short_s = shrt.short_s = 2;
  lng.short_reserve = shrt.short_reserve = 1;
  gw_sched_req both[2] = {lng, shrt};
  gw_sched_choice cs[2];
  gw_sched_plan(r, 4, both, 2, now, cs);
  /* the long one plans on q2's next long-work slot: 29 s + 7.08 s (not 0.3 s + 7.08 s) */
  assert_int_equal(cs[0].replica, 1);
  assert_false(cs[0].now);
  assert_true(cs[0].finish_s > 36.0 && cs[0].finish_s < 36.2);
  /* the short one waits 0.3 s for the kept slot (0.44 s) rather than 1.4 s on s1 */
  assert_int_equal(cs[1].replica, 1);
  assert_false(cs[1].now);
  assert_true(cs[1].finish_s > 0.43 && cs[1].finish_s < 0.45);
  /* nothing kept: the long one plans on the slot that frees first */
  both[0].short_reserve = both[1].short_reserve = 0;
  gw_sched_plan(r, 4, both, 2, now, cs);
  assert_int_equal(cs[0].replica, 1);
  assert_true(cs[0].finish_s > 7.3 && cs[0].finish_s < 7.5);
  assert_int_equal(cs[1].replica, 2);
  for (int i = 0; i < 4; i++) gw_replica_free(r[i]);
}

/* A free kept slot is left to long work when short work is unlikely to come before the next
 * quick slot busy with long work frees (less short_s): as likely as short_wait_p at most. The
 * fleet of test_short_reserve: q2's one free slot is kept, its other slots free in 29 s. */
static void test_short_reserve_released_when_unlikely(void **state) {
  (void)state;
  gw_replica *r[4] = {rep("q1", 4, 1000, 100, 0), rep("q2", 4, 1000, 100, 0),
                      rep("s1", 4, 100, 10, 0), rep("s2", 4, 100, 10, 0)};
  uint64_t now = 1000000;
  for (int i = 0; i < 4; i++) gw_replica_acquire(r[0], now - 1000, 60000, NULL); /* q1 full */
  for (int i = 0; i < 3; i++) gw_replica_acquire(r[1], now - 1000, 30000, NULL); /* q2: 1 free */
  gw_sched_req lng = req(7000, 8);
  lng.short_s = 2;
  lng.short_reserve = 1;
  lng.short_wait_p = 0.05;
  gw_sched_choice c;
  /* short work's rate not known: kept */
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_false(c.now);
  /* one short request in 1,000 s: 1 - exp(-0.001 x (29 - 2)) = 0.027 <= 0.05: released,
   * the long request takes the slot now (7.08 s, not 36.1 s) */
  lng.short_rate = 0.001;
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_true(c.now);
  assert_true(c.finish_s > 7.0 && c.finish_s < 7.2);
  assert_int_equal(c.wait, GW_WAIT_NONE);
  /* one in 100 s: 1 - exp(-0.27) = 0.24 > 0.05: kept, as it was */
  lng.short_rate = 0.01;
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_false(c.now);
  assert_int_equal(c.wait, GW_WAIT_KEPT);
  /* one in 100 s, but q2's next slot frees in 4 s: 1 - exp(-0.01 x 2) = 0.02: released */
  gw_replica_release(r[1], r[1]->leases[0].id);
  gw_replica_acquire(r[1], now - 1000, 5000, NULL);
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_true(c.now);
  /* a slot running short work is no slot that frees for it: at short_s 6 q2's 4 s one is
   * a guard's message (5 s: short), kept with the free one (2 kept), and the next slot of
   * long work frees in 29 s: 1 - exp(-0.01 x 23) = 0.21: kept again */
  lng.short_s = 6;
  lng.short_reserve = 2;
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_false(c.replica == 1 && c.now);
  assert_int_equal(c.wait, GW_WAIT_KEPT);
  /* short_wait_p 0 (a fixed number kept): kept whatever the rate */
  lng.short_s = 2;
  lng.short_reserve = 1;
  lng.short_rate = 0.001;
  lng.short_wait_p = 0;
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_false(c.now);
  /* a short request takes the kept slot as ever */
  gw_sched_req shrt = req(100, 4);
  shrt.short_s = 2;
  shrt.short_reserve = 1;
  shrt.short_rate = 0.01;
  shrt.short_wait_p = 0.05;
  gw_sched_plan(r, 4, &shrt, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_true(c.now);
  for (int i = 0; i < 4; i++) gw_replica_free(r[i]);
}

/* A hot phone planned 3x slower is not quick, however fast its learned rates: the kept
 * slot is on the cool phones, and long work may take the hot phone's free slot. */
static void test_short_reserve_not_on_a_hot_phone(void **state) {
  (void)state;
  gw_replica *r[4] = {rep("hot", 4, 1000, 100, 0), rep("q2", 4, 900, 100, 0),
                      rep("s1", 4, 100, 10, 0), rep("q3", 4, 900, 100, 0)};
  uint64_t now = 1000000;
  r[0]->dev.hot = 1;
  r[0]->dev.slow = 3;
  r[0]->dev.pre0 = r[0]->prefill_samples;
  r[0]->dev.dec0 = r[0]->decode_samples;
  assert_true(gw_replica_device_slowdown(r[0]) > 2.9);
  for (int i = 0; i < 3; i++) gw_replica_acquire(r[0], now - 1000, 60000, NULL); /* hot: 1 free */
  for (int i = 0; i < 4; i++) gw_replica_acquire(r[3], now - 1000, 60000, NULL); /* q3 full */
  for (int i = 0; i < 3; i++) gw_replica_acquire(r[1], now - 1000, 30000, NULL); /* q2: 1 free */
  gw_sched_req lng = req(700, 8);
  lng.short_s = 0.5;
  lng.short_reserve = 1; /* quick: q2 and q3 (8 slots): 1 kept, q2's */
  gw_sched_choice c;
  /* 700 / 900 s on q2 would beat 700 / 333 on the hot phone, but q2's free slot is kept:
   * the long request takes the hot phone's (counted quick by its rates, it was kept) */
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_true(c.now);
  for (int i = 0; i < 4; i++) gw_replica_free(r[i]);
}

/* A request only a phone whose slots are kept can serve (its context fits nowhere else)
 * is not left without a phone: the kept slot is not kept from it. */
static void test_short_reserve_only_phone_that_fits(void **state) {
  /* big (1 slot, free) and q2 (4, full) are quick: 5 slots keep 1, big's */
  gw_replica *r[4] = {rep("big", 1, 1000, 100, 16384), rep("q2", 4, 1000, 100, 4096),
                      rep("s1", 4, 100, 10, 4096), rep("s2", 4, 100, 10, 4096)};
  uint64_t now = 1000000;
  for (int i = 0; i < 4; i++) gw_replica_acquire(r[1], now - 1000, 30000, NULL);
  gw_sched_req lng = req(7000, 8); /* fits only on big */
  lng.short_s = 2;
  lng.short_reserve = 1;
  gw_sched_choice c;
  gw_sched_plan(r, 4, &lng, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_true(c.now);
  /* one that fits elsewhere leaves it: s1 now (30.8 s) beats q2 in 29 s (+ 3.08 s) */
  gw_sched_req small = req(3000, 8);
  small.short_s = 2;
  small.short_reserve = 1;
  gw_sched_plan(r, 4, &small, 1, now, &c);
  assert_int_equal(c.replica, 2);
  assert_true(c.now);
  for (int i = 0; i < 4; i++) gw_replica_free(r[i]);
}

/* The reserve is at most a quarter of the quick slots: a fleet of 3 quick slots keeps none. */
static void test_short_reserve_small_fleet(void **state) {
  gw_replica *r[2] = {rep("q", 3, 1000, 100, 0), rep("s", 1, 100, 10, 0)};
  uint64_t now = 1000000;
  gw_replica_acquire(r[0], now - 1000, 60000, NULL);
  gw_replica_acquire(r[0], now - 1000, 60000, NULL);
  gw_sched_req lng = req(7000, 8);
  lng.short_s = 2;
  lng.short_reserve = 1;
  gw_sched_choice c;
  gw_sched_plan(r, 2, &lng, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_true(c.now);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* A phone that failed its last health check (not yet marked down) takes no new work
 * while another can: here the slow phone, 10x slower, rather than the fast one that
 * stopped answering its checks. Nothing else serving the model, it is used. It keeps no
 * slots for short work either. */
static void test_suspect_phone_last(void **state) {
  (void)state;
  gw_replica *r[2] = {rep("slow", 1, 10, 1, 0), rep("fast", 1, 100, 10, 0)};
  for (int i = 0; i < 2; i++) gw_replica_set_state(r[i], GW_REPLICA_READY, 1000, "test");
  gw_sched_req q = req(1000, 10);
  gw_sched_choice c;
  gw_sched_plan(r, 2, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  r[1]->health.probe_fail = 1;
  r[1]->health.probe_fail_ms = 1000;
  assert_true(gw_replica_suspect(r[1]));
  gw_sched_plan(r, 2, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 0);
  assert_true(c.now);
  /* the slow phone busy for 200 s: waiting for it still beats a phone not expected to answer */
  uint64_t lease = gw_replica_acquire(r[0], 1000, 200000, NULL);
  gw_sched_plan(r, 2, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 0);
  assert_false(c.now);
  gw_replica_release(r[0], lease);
  /* batch work, the slow phone full: it waits for a sound phone rather than take the
   * suspect one's free slot (a won hedge leaves such slots on a hung phone) */
  lease = gw_replica_acquire(r[0], 1000, 200000, NULL);
  gw_sched_req b = req(1000, 10);
  b.batch = 1;
  b.batch_reserve = 1;
  gw_sched_plan(r, 2, &b, 1, 1000, &c);
  assert_int_equal(c.replica, -1);
  gw_replica_release(r[0], lease);
  /* the only phone of the model: used */
  gw_sched_plan(&r[1], 1, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 0);
  gw_sched_plan(&r[1], 1, &b, 1, 1000, &c);
  assert_int_equal(c.replica, 0);
  /* a passed check clears it */
  r[1]->health.probe_fail = 0;
  assert_false(gw_replica_suspect(r[1]));
  gw_sched_plan(r, 2, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* Why a request waits (gw_sched_choice.wait, the status page's queue card): every slot
 * busy, a free phone slower than a busy one, a free quick slot kept for short work, free
 * slots held back (batch work's reserve, a suspect phone, a phone's readings), or no
 * phone for its model; none when it runs now. */
static void test_wait_reasons(void **state) {
  (void)state;
  gw_replica *r[2] = {rep("slow", 1, 10, 1, 0), rep("fast", 1, 100, 10, 0)};
  for (int i = 0; i < 2; i++) gw_replica_set_state(r[i], GW_REPLICA_READY, 1000, "test");
  uint64_t now = 100000;
  gw_sched_req q = req(1000, 10);
  gw_sched_choice c;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_true(c.now);
  assert_int_equal(c.wait, GW_WAIT_NONE);
  /* fast busy 2 s more, slow free (110 s): it waits for fast */
  uint64_t lf = gw_replica_acquire(r[1], now - 1000, 3000, NULL);
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_false(c.now);
  assert_int_equal(c.wait, GW_WAIT_FASTER);
  assert_string_equal(gw_sched_wait_names[c.wait], "faster_phone");
  /* both busy: plain queueing */
  uint64_t ls = gw_replica_acquire(r[0], now - 1000, 3000, NULL);
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_false(c.now);
  assert_int_equal(c.wait, GW_WAIT_BUSY);
  /* another model: no phone */
  gw_sched_req other = q;
  other.model = "other";
  gw_sched_plan(r, 2, &other, 1, now, &c);
  assert_int_equal(c.replica, -1);
  assert_int_equal(c.wait, GW_WAIT_NO_PHONE);
  /* fast free but suspect, slow busy: the request waits for slow, fast's slot held back */
  gw_replica_release(r[1], lf);
  r[1]->health.probe_fail = 1;
  r[1]->health.probe_fail_ms = now;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_false(c.now);
  assert_int_equal(c.wait, GW_WAIT_HELD);
  r[1]->health.probe_fail = 0;
  /* fast's readings allow it no request (battery): held back, and not "no phone" */
  r[1]->dev.cap = 0;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_int_equal(c.wait, GW_WAIT_HELD);
  gw_replica_release(r[0], ls);
  ls = gw_replica_acquire(r[0], now - 1000, 200000, NULL);
  r[0]->state = GW_REPLICA_DOWN;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_int_equal(c.replica, -1);
  assert_int_equal(c.wait, GW_WAIT_HELD);
  r[1]->dev.cap = -1;
  gw_sched_plan(r, 2, &q, 1, now, &c);
  assert_true(c.now);
  assert_int_equal(c.wait, GW_WAIT_NONE);
  gw_replica_set_state(r[0], GW_REPLICA_READY, now, "test");
  gw_replica_release(r[0], ls);
  /* batch work leaves fast's free slot to interactive work that wanted it a moment ago */
  uint64_t li = gw_replica_acquire(r[1], now - 2000, 1000, NULL);
  gw_replica_release(r[1], li);
  ls = gw_replica_acquire(r[0], now - 1000, 200000, NULL);
  gw_sched_req b = req(1000, 10);
  b.batch = b.take_free = 1;
  b.batch_reserve = 1;
  gw_sched_plan(r, 2, &b, 1, now, &c);
  assert_int_equal(c.replica, -1);
  assert_int_equal(c.wait, GW_WAIT_HELD);
  gw_replica_release(r[0], ls);
  for (int i = 0; i < 2; i++) gw_replica_free(r[i]);

  /* a quick phone's last free slot kept for short work, a slow phone free: kept */
  gw_replica *k[3] = {rep("q1", 4, 1000, 100, 0), rep("q2", 4, 1000, 100, 0), rep("s1", 4, 100, 10, 0)};
  for (int i = 0; i < 4; i++) gw_replica_acquire(k[0], now - 1000, 60000, NULL);
  for (int i = 0; i < 3; i++) gw_replica_acquire(k[1], now - 1000, 30000, NULL);
  gw_sched_req lng = req(7000, 8);
  lng.short_s = 2;
  lng.short_reserve = 1;
  gw_sched_plan(k, 3, &lng, 1, now, &c);
  assert_int_equal(c.replica, 1);
  assert_false(c.now);
  assert_int_equal(c.wait, GW_WAIT_KEPT);
  assert_string_equal(gw_sched_wait_names[c.wait], "kept_for_short_work");
  for (int i = 0; i < 3; i++) gw_replica_free(k[i]);
}

/* A health probe in flight that is late makes its phone suspect as a failed one does;
 * when it is late comes from health.late_s, or the phone's usual probe time plus four
 * times its variation when that is longer, and never at or past the probe's timeout. */
static void test_late_probe(void **state) {
  (void)state;
  gw_replica *r[2] = {rep("slow", 1, 10, 1, 0), rep("fast", 1, 100, 10, 0)};
  for (int i = 0; i < 2; i++) gw_replica_set_state(r[i], GW_REPLICA_READY, 1000, "test");
  /* nothing learned yet: late_s itself; off at 0, and at or above the timeout */
  assert_true(gw_hsched_probe_late_ms(r[1], 1, 3) == 1000);
  assert_true(gw_hsched_probe_late_ms(r[1], 0, 3) == 0);
  assert_true(gw_hsched_probe_late_ms(r[1], 3, 3) == 0);
  /* quick probes (20 ms, steady): still late_s */
  for (int i = 0; i < 20; i++) gw_hsched_probe_took(r[1], 20, 0);
  assert_true(fabs(r[1]->health.probe_srtt_ms - 20) < 0.5);
  assert_true(r[1]->health.probe_rttvar_ms < 1);
  assert_true(gw_hsched_probe_late_ms(r[1], 1, 3) == 1000);
  /* a phone behind a slow tunnel: 600-1000 ms probes; late only past its usual + 4 x var */
  gw_replica *t = rep("tunnel", 1, 100, 10, 0);
  for (int i = 0; i < 40; i++) gw_hsched_probe_took(t, i % 2 ? 600 : 1000, 0);
  double late = gw_hsched_probe_late_ms(t, 1, 10);
  assert_true(late > 1000 + 400 && late < 10000);
  assert_true(fabs(late - (t->health.probe_srtt_ms + 4 * t->health.probe_rttvar_ms)) < 1e-9);
  /* ... and off when that reaches the timeout: the timeout's failure comes first */
  assert_true(gw_hsched_probe_late_ms(t, 1, late / 1000) == 0);
  /* a stall of 2.9 s on a quick phone, found late at 1 s, counts as 2 s: the bound stays
   * under a 3 s timeout, where the whole 2.9 s would have turned late checks off */
  gw_replica *qk = rep("quick", 1, 100, 10, 0), *qk2 = rep("quick2", 1, 100, 10, 0);
  for (int i = 0; i < 20; i++) {
    gw_hsched_probe_took(qk, 50, 0);
    gw_hsched_probe_took(qk2, 50, 0);
  }
  gw_hsched_probe_took(qk, 2900, 1000);
  gw_hsched_probe_took(qk2, 2900, 0);
  assert_true(gw_hsched_probe_late_ms(qk, 1, 3) > 1000 && gw_hsched_probe_late_ms(qk, 1, 3) < 3000);
  assert_true(gw_hsched_probe_late_ms(qk2, 1, 3) == 0);
  /* a tunnel that is really slower (1.5 s) is still learned: no longer late after a few */
  int late_probes = 0;
  for (int i = 0; i < 30; i++) {
    double bound = gw_hsched_probe_late_ms(qk, 1, 3);
    int is_late = bound > 0 && 1500 > bound;
    late_probes += is_late;
    gw_hsched_probe_took(qk, 1500, is_late ? bound : 0);
  }
  assert_true(late_probes < 10);
  assert_true(gw_hsched_probe_late_ms(qk, 1, 3) > 1500);
  /* another URL: the usual time is forgotten */
  assert_int_equal(gw_replica_set_strings(qk, qk->url, NULL, models, 1, NULL), 0);
  assert_true(qk->health.probe_srtt_ms > 0);
  assert_int_equal(gw_replica_set_strings(qk, "http://127.0.0.1:9/elsewhere", NULL, models, 1, NULL), 0);
  assert_true(qk->health.probe_srtt_ms == 0 && qk->health.probe_rttvar_ms == 0);
  assert_true(gw_hsched_probe_late_ms(qk, 1, 3) == 1000);
  gw_replica_free(qk);
  gw_replica_free(qk2);
  /* the plan: the late phone is left while another can serve; its probe's end clears it */
  gw_sched_req q = req(1000, 10);
  gw_sched_choice c;
  gw_sched_plan(r, 2, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  r[1]->health.probe_late_ms = 1000;
  assert_true(gw_replica_suspect(r[1]));
  gw_sched_plan(r, 2, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 0);
  r[1]->health.probe_late_ms = 0;
  assert_false(gw_replica_suspect(r[1]));
  gw_sched_plan(r, 2, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  /* down is down, not suspect */
  r[1]->health.probe_late_ms = 1000;
  gw_replica_set_state(r[1], GW_REPLICA_DOWN, 1000, "test");
  assert_false(gw_replica_suspect(r[1]));
  gw_replica_free(t);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* Admission predicts a phone as the plan does: a hot phone planned 3x slower is 3x slower
 * for the deadline check and the queue's order too (it was planned at its learned rates
 * there, so a request only a hot phone could serve was let in with a third of its time,
 * and ordered as shorter than it is). A phone that takes no work now is at its own pace. */
static void test_admission_predicts_as_the_plan(void **state) {
  (void)state;
  gw_replica *r[2] = {rep("hot", 1, 100, 10, 0), rep("down", 1, 1000, 100, 0)};
  r[0]->prefill_samples = r[0]->decode_samples = 9; /* measured: the finish is no guess */
  r[0]->dev.hot = 1;
  r[0]->dev.slow = 3;
  r[0]->dev.pre0 = r[0]->dev.dec0 = 9;
  uint64_t now = 100000;
  gw_sched_req q = req(1000, 10); /* 10 s + 1 s at its rates */
  gw_sched_choice c;
  gw_sched_plan(r, 1, &q, 1, now, &c);
  assert_int_equal(c.replica, 0);
  assert_true(c.finish_s > 32.9 && c.finish_s < 33.1);
  double svc, fin;
  int guess;
  gw_sched_best(r, 1, &q, now, &svc, &fin, &guess);
  assert_true(fin == c.finish_s && svc == c.service_s);
  assert_false(guess);
  /* down, and 5x behind on the request it still holds: planned 5x slower for the queue's
   * order as well, when it is the only phone that fits */
  r[1]->state = GW_REPLICA_DOWN;
  gw_replica_acquire(r[1], now - 5000, 1000, NULL);
  gw_sched_best(&r[1], 1, &q, now, &svc, &fin, &guess);
  assert_true(fin < 0);
  assert_true(svc > 5.4 && svc < 5.6); /* (1 + 0.1) x 5 */
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

/* A request of several choices ("n") takes as many slots of one phone whose engine writes
 * that many at once: it starts when the last of them frees, and they free together. */
static gw_replica *rep_choices(const char *id, int slots, int choices_max) {
  gw_replica *r = rep(id, slots, 100, 10, 0);
  r->feat_known = 1;
  r->features = choices_max > 1 ? PR_FEAT_CHOICES : 0;
  r->choices_max = choices_max;
  return r;
}

static void test_choices_take_slots_together(void **state) {
  (void)state;
  /* a: 4 slots, writes 4 at once, two of them busy (5 s and 10 s left); b: a 2025 engine
   * (one choice) with 4 free slots; c: 2 slots, writes 2 at once */
  gw_replica *r[3] = {rep_choices("a", 4, 4), rep_choices("b", 4, 1), rep_choices("c", 2, 2)};
  uint64_t now = 100000;
  gw_replica_acquire(r[0], now, 5000, NULL);
  gw_replica_acquire(r[0], now, 10000, NULL);
  gw_sched_req q[4] = {req(1000, 10), req(1000, 10), req(1000, 10), req(1000, 10)};
  q[0].choices = 3; /* only a writes 3: its third slot frees in 5 s */
  q[0].needs = PR_FEAT_CHOICES;
  q[1].choices = 2; /* c has 2 free */
  q[1].needs = PR_FEAT_CHOICES;
  q[2].choices = 3; /* a again: its slots free at 10 s and, the 3 taken together, at 16 s */
  q[2].needs = PR_FEAT_CHOICES;
  /* q[3]: one choice, b is free */
  gw_sched_choice c[4];
  gw_sched_plan(r, 3, q, 4, now, c);
  double svc = 1000.0 / 100 + 10.0 / 10; /* 11 s */
  assert_int_equal(c[0].replica, 0);
  assert_false(c[0].now);
  assert_true(fabs(c[0].finish_s - (5 + svc)) < 0.01);
  assert_int_equal(c[1].replica, 2);
  assert_true(c[1].now);
  /* a's slots: the 3 taken free together at 5 + 11 s, the 4th at 10 s: a third slot at 16 s */
  assert_int_equal(c[2].replica, 0);
  assert_false(c[2].now);
  assert_true(fabs(c[2].finish_s - (5 + svc + 0.001 + svc)) < 0.01);
  assert_int_equal(c[3].replica, 1);
  assert_true(c[3].now);
  /* more choices than any phone writes: nothing fits */
  gw_sched_req big = req(1000, 10);
  big.choices = 5;
  big.needs = PR_FEAT_CHOICES;
  gw_sched_plan(r, 3, &big, 1, now, c);
  assert_int_equal(c[0].replica, -1);
  assert_int_equal(c[0].wait, GW_WAIT_NO_PHONE);
  for (int i = 0; i < 3; i++) gw_replica_free(r[i]);
}

/* The search finds for requests of several choices what a walk of every phone finds. */
static void test_choices_search_as_walk(void **state) {
  (void)state;
  enum { NR = 80, NQ = 40 };
  gw_replica *r[NR];
  uint64_t now = 1000000, seed = 12345;
  for (int i = 0; i < NR; i++) {
    char id[16];
    snprintf(id, sizeof(id), "p%d", i);
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int slots = 1 + (int)((seed >> 33) % 4);
    int cm = (seed >> 40) % 3 == 0 ? 1 : slots;
    r[i] = rep_choices(id, slots, cm);
    r[i]->prefill_tps = 50 + (double)((seed >> 20) % 200);
    r[i]->decode_tps = 5 + (double)((seed >> 12) % 20);
    r[i]->prefill_samples = r[i]->decode_samples = 5;
    int busy = (int)((seed >> 50) % (unsigned)(slots + 1));
    for (int k = 0; k < busy; k++) gw_replica_acquire(r[i], now - 1000, 2000 + 3000 * (uint64_t)k + (seed >> 55), NULL);
  }
  gw_sched_req q[NQ];
  for (int i = 0; i < NQ; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    q[i] = req(100 + (int64_t)((seed >> 30) % 3000), 10 + (int64_t)((seed >> 20) % 200));
    q[i].choices = 1 + (int)((seed >> 45) % 4);
    q[i].needs = q[i].choices > 1 ? PR_FEAT_CHOICES : 0;
    /* a third may wait no longer than 0.5-4.5 s to start (planned again on the phones
     * that start it in time) */
    q[i].start_by_s = (seed >> 52) % 3 == 0 ? 0.5 + (double)((seed >> 56) % 5) : 0;
  }
  gw_sched *walked = gw_sched_new(), *searched = gw_sched_new();
  assert_non_null(walked);
  assert_non_null(searched);
  gw_sched_walk_max(walked, (size_t)-1);
  gw_sched_walk_max(searched, 0);
  gw_sched_choice a[NQ], b[NQ];
  gw_sched_plan_with(walked, r, NR, q, NQ, now, a);
  gw_sched_plan_with(searched, r, NR, q, NQ, now, b);
  int placed = 0, waiting = 0;
  for (int i = 0; i < NQ; i++) {
    assert_int_equal(a[i].replica, b[i].replica);
    assert_int_equal(a[i].now, b[i].now);
    assert_true(a[i].finish_s == b[i].finish_s);
    assert_int_equal(a[i].alt_replica, b[i].alt_replica);
    assert_int_equal(a[i].wait, b[i].wait);
    if (a[i].replica >= 0 && q[i].choices > 1) {
      const gw_replica *p = r[a[i].replica];
      assert_true((p->features & PR_FEAT_CHOICES) && p->choices_max >= q[i].choices && p->slots >= q[i].choices);
      placed++;
      waiting += !a[i].now;
    }
  }
  assert_true(placed > 5 && waiting > 0);
  gw_sched_free(walked);
  gw_sched_free(searched);
  for (int i = 0; i < NR; i++) gw_replica_free(r[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefers_faster_free),
      cmocka_unit_test(test_waits_for_fast_busy_phone),
      cmocka_unit_test(test_wait_weight),
      cmocka_unit_test(test_start_by_prefers_a_phone_that_starts_in_time),
    cmocka_unit_test(test_fill_idle),
    cmocka_unit_test(test_fill_idle_takes_every_slot_of_its_choices),
      cmocka_unit_test(test_kept_slot_serves_short_work_of_the_quickest),
      cmocka_unit_test(test_reservations_spread_work),
      cmocka_unit_test(test_batch_leaves_interactive_room),
      cmocka_unit_test(test_context_fit_and_model),
      cmocka_unit_test(test_avoid_failed_replica),
      cmocka_unit_test(test_cached_prefix_lowers_prediction),
      cmocka_unit_test(test_prompt_memory_follows_slot_similarity),
      cmocka_unit_test(test_overrunning_phone_looks_slower),
      cmocka_unit_test(test_leases_and_wait),
      cmocka_unit_test(test_learning_rates),
      cmocka_unit_test(test_health_cooldown_probation),
      cmocka_unit_test(test_descriptor_budget),
      cmocka_unit_test(test_short_reserve),
      cmocka_unit_test(test_short_reserve_small_fleet),
      cmocka_unit_test(test_short_reserve_not_on_a_hot_phone),
      cmocka_unit_test(test_short_reserve_only_phone_that_fits),
      cmocka_unit_test(test_suspect_phone_last),
      cmocka_unit_test(test_short_reserve_busy_kept_slot),
      cmocka_unit_test(test_short_reserve_released_when_unlikely),
      cmocka_unit_test(test_late_probe),
      cmocka_unit_test(test_admission_predicts_as_the_plan),
      cmocka_unit_test(test_wait_reasons),
      cmocka_unit_test(test_choices_take_slots_together),
      cmocka_unit_test(test_choices_search_as_walk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
