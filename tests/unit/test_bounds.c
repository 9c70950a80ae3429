/* Unit tests for gateway/bounds.c (what a phone claims, bounded: rates, timings, usage,
 * an answer's size, the share of a phone without a record) and for where replica.c
 * applies them (learned and seeded rates, the share cap in the capacity). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bounds.h"
#include "caps.h"
#include "replica.h"

static char *models[] = {"m"};

static gw_replica *rep(const char *id, int slots) {
  gw_replica *r = gw_replica_new(id, "http://127.0.0.1:1", NULL, models, 1, slots, 0, 100, 10, 0);
  assert_non_null(r);
  return r;
}

static void test_rate(void **state) {
  (void)state;
  assert_true(gw_bound_rate(NAN) == 0);
  assert_true(gw_bound_rate(INFINITY) == 0);
  assert_true(gw_bound_rate(-INFINITY) == 0);
  assert_true(gw_bound_rate(0) == 0);
  assert_true(gw_bound_rate(-5) == 0);
  assert_true(gw_bound_rate(1e308) == GW_RATE_MAX);
  assert_true(gw_bound_rate(1e-300) == GW_RATE_MIN);
  assert_true(gw_bound_rate(123.5) == 123.5);
}

static void test_count(void **state) {
  (void)state;
  assert_int_equal(gw_bound_count(NAN), -1);
  assert_int_equal(gw_bound_count(INFINITY), -1);
  assert_int_equal(gw_bound_count(-1), -1);
  assert_int_equal(gw_bound_count(1e308), INT64_C(1000000000000));
  assert_int_equal(gw_bound_count(42.9), 42);
}

static void test_timings(void **state) {
  (void)state;
  /* honest: nothing changes */
  gw_timings t = {100, 500, 20, 1000};
  assert_int_equal(gw_bound_timings(&t, 100, 20, 1000, 64, 600, 1100, 0), 0);
  assert_true(t.prompt_ms == 500 && t.pred_ms == 1000);
  /* infinitely fast (1e308 tokens in 1e-300 ms): counts capped, and each pace predicts
   * at least half of what the gateway's clock saw for its own count of tokens */
  t = (gw_timings){1e308, 1e-300, 1e308, 1e-300};
  assert_int_equal(gw_bound_timings(&t, 100, 20, 1000, 65, 400, 2000, 0), 1);
  assert_true(t.prompt_n == 1000 && t.pred_n == 65);
  assert_true(fabs(100 * t.prompt_ms / t.prompt_n - 200) < 1e-6);
  assert_true(fabs(20 * t.pred_ms / t.pred_n - 1000) < 1e-6);
  /* a whole answer: both end before its first byte; stretched alike */
  t = (gw_timings){100, 1, 10, 3};
  assert_int_equal(gw_bound_timings(&t, 100, 10, 1000, 64, 0, 0, 800), 1);
  assert_true(fabs(t.prompt_ms + t.pred_ms - 400) < 1e-9);
  assert_true(fabs(t.prompt_ms * 3 - t.pred_ms) < 1e-9);
  /* no time at all: the floor is shared; inflated counts buy no speed for own counts */
  t = (gw_timings){1e12, 0, 1e12, 0};
  gw_bound_timings(&t, 16, 2, 320, 9, 0, 0, 800);
  assert_true(fabs(16 * t.prompt_ms / t.prompt_n - 200) < 1e-6);
  assert_true(fabs(2 * t.pred_ms / t.pred_n - 200) < 1e-6);
  /* NaN and infinities void their pair (1e999 parses as inf) */
  t = (gw_timings){INFINITY, INFINITY, 10, NAN};
  assert_int_equal(gw_bound_timings(&t, 100, 10, 1000, 64, 100, 100, 0), 1);
  assert_true(t.prompt_n == 0 && t.prompt_ms == 0 && t.pred_n == 0 && t.pred_ms == 0);
  t = (gw_timings){-5, 10, 10, -1};
  gw_bound_timings(&t, 100, 10, 1000, 64, 0, 0, 0);
  assert_true(t.prompt_n == 0 && t.pred_n == 0);
}

static void test_verify_timings(void **state) {
  (void)state;
  int off = -1;
  /* agreeing within the factor: the phone's word is learned as it came */
  gw_timings t = {100, 600, 20, 900};
  assert_int_equal(gw_verify_timings(&t, 100, 20, 1000, 64, 1000, 1000, 0, 2, &off), 0);
  assert_int_equal(off, 0);
  assert_true(t.prompt_ms == 600 && t.pred_ms == 900);
  /* a stream whose phone claims 10x slower than it ran: each part from the clock */
  t = (gw_timings){100, 10000, 20, 9000};
  assert_int_equal(gw_verify_timings(&t, 100, 20, 1000, 64, 1000, 900, 0, 2, &off), 1);
  assert_int_equal(off, 1);
  assert_true(fabs(t.prompt_ms - 1000) < 1e-9 && fabs(t.pred_ms - 900) < 1e-9);
  /* the same claim is believed without the check (no ceiling, only the 2x floor) */
  t = (gw_timings){100, 10000, 20, 9000};
  assert_int_equal(gw_verify_timings(&t, 100, 20, 1000, 64, 1000, 900, 0, 0, &off), 0);
  assert_int_equal(off, 0);
  assert_true(t.prompt_ms == 10000);
  /* a whole answer claimed 10x faster: the total is the clock's, split as claimed (the
   * 2x floor alone would learn it at twice its speed) */
  t = (gw_timings){100, 50, 20, 150};
  assert_int_equal(gw_verify_timings(&t, 100, 20, 1000, 64, 0, 0, 2000, 2, &off), 1);
  assert_int_equal(off, 1);
  assert_true(fabs(t.prompt_ms - 500) < 1e-9 && fabs(t.pred_ms - 1500) < 1e-9);
  /* paces are compared for the gateway's own counts: 1,000 claimed tokens in 100 ms for
   * the 100 it sent is a 10 ms prefill, against the clock's 1,000 */
  t = (gw_timings){1000, 100, 0, 0};
  gw_verify_timings(&t, 100, 0, 1000, 64, 1000, 0, 0, 2, &off);
  assert_int_equal(off, 1);
  assert_true(fabs(100 * t.prompt_ms / t.prompt_n - 1000) < 1e-9);
  /* no time claimed at all: the clock's total, shared */
  t = (gw_timings){100, 0, 20, 0};
  gw_verify_timings(&t, 100, 20, 1000, 64, 0, 0, 1000, 2, &off);
  assert_int_equal(off, 1);
  assert_true(fabs(t.prompt_ms - 500) < 1e-9 && fabs(t.pred_ms - 500) < 1e-9);
  /* within 250 ms is latency, not a lie: not counted, the 2x floor still applies */
  t = (gw_timings){100, 20, 0, 0};
  gw_verify_timings(&t, 100, 0, 1000, 64, 200, 0, 0, 2, &off);
  assert_int_equal(off, 0);
  assert_true(fabs(t.prompt_ms - 100) < 1e-9);
  /* a looser factor believes more */
  t = (gw_timings){100, 3000, 0, 0};
  gw_verify_timings(&t, 100, 0, 1000, 64, 1000, 0, 0, 4, &off);
  assert_int_equal(off, 0);
  assert_true(t.prompt_ms == 3000);
  /* NaN is voided before any check, and disagrees with nothing */
  t = (gw_timings){100, NAN, 20, 900};
  gw_verify_timings(&t, 100, 20, 1000, 64, 1000, 1000, 0, 2, &off);
  assert_int_equal(off, 0);
  assert_true(t.prompt_n == 0 && t.pred_ms == 900);
}

static void test_own_evaluated(void **state) {
  (void)state;
  /* a tokenizer that makes 4 tokens of each the estimate counts: 1,600 evaluated of
   * 1,600 is the whole 400 the gateway estimated */
  assert_true(fabs(gw_own_evaluated(400, 400, 1600, 1600) - 400) < 1e-9);
  /* 1,580 of 1,600 from the cache: 20 evaluated are 5 of the gateway's */
  assert_true(fabs(gw_own_evaluated(400, 400, 1600, 20) - 5) < 1e-9);
  /* the gateway expected 300 cached: a phone that says it evaluated all of it gets no
   * more than the 100 the gateway sent uncached */
  assert_true(fabs(gw_own_evaluated(400, 100, 1600, 1600) - 100) < 1e-9);
  /* a count beyond its own total is the whole prompt, no more */
  assert_true(fabs(gw_own_evaluated(400, 400, 100, 5000) - 400) < 1e-9);
  /* unknown or nonsense counts: the gateway's own estimate */
  assert_true(fabs(gw_own_evaluated(400, 250, 0, 100) - 250) < 1e-9);
  assert_true(fabs(gw_own_evaluated(400, 250, NAN, 100) - 250) < 1e-9);
  assert_true(fabs(gw_own_evaluated(400, 250, 1600, INFINITY) - 250) < 1e-9);
  assert_true(fabs(gw_own_evaluated(400, 250, -3, 100) - 250) < 1e-9);
  assert_true(gw_own_evaluated(400, -50, 1600, 100) == 0);
  assert_true(gw_own_evaluated(0, 0, 1600, 100) == 0);
}

static void test_usage(void **state) {
  (void)state;
  assert_int_equal(gw_usage_prompt_max(25, 40, 0), 25 * GW_USAGE_PROMPT_FACTOR + GW_USAGE_PROMPT_SLACK);
  /* tools and schemas are prompt the estimate does not count: the body's bytes bound it */
  assert_int_equal(gw_usage_prompt_max(18, 3000, 0), 3000 + GW_USAGE_PROMPT_SLACK);
  assert_int_equal(gw_usage_prompt_max(18, 400, 1), 400 + GW_USAGE_PROMPT_SLACK + GW_USAGE_TOOLS_SLACK);
  int64_t pmax = gw_usage_prompt_max(25, 40, 0);
  int64_t p = 30, c = 8, k = 0;
  assert_int_equal(gw_usage_clamp(&p, &c, &k, pmax, 8), 0);
  assert_true(p == 30 && c == 8);
  p = INT64_C(1000000000000000), c = INT64_C(1000000000000), k = INT64_C(1000000000000);
  assert_int_equal(gw_usage_clamp(&p, &c, &k, pmax, 8), 1);
  assert_int_equal(p, pmax);
  assert_int_equal(c, 8);
  assert_int_equal(k, p);
  /* unknown stays unknown */
  p = -1, c = -1, k = 0;
  assert_int_equal(gw_usage_clamp(&p, &c, &k, pmax, 8), 0);
  assert_true(p == -1 && c == -1);
  /* completion tokens: at most a byte of text and a chunk each, + the slack, within the cap */
  assert_int_equal(gw_usage_completion_max(5, 1, 250), 5 + 1 + GW_USAGE_COMPLETION_SLACK);
  assert_int_equal(gw_usage_completion_max(0, 0, 250), GW_USAGE_COMPLETION_SLACK);
  assert_int_equal(gw_usage_completion_max(3000, 1200, 1500), 1500);
  assert_int_equal(gw_usage_completion_max(-4, -1, 0), GW_USAGE_COMPLETION_SLACK); /* no cap */
  p = 5, c = 250, k = 0;
  assert_int_equal(gw_usage_clamp(&p, &c, &k, pmax, gw_usage_completion_max(5, 1, 250)), 1);
  assert_int_equal(c, 5 + 1 + GW_USAGE_COMPLETION_SLACK);
  p = 5, c = 4, k = 0; /* an honest count stands */
  assert_int_equal(gw_usage_clamp(&p, &c, &k, pmax, gw_usage_completion_max(21, 1, 250)), 0);
  assert_int_equal(c, 4);
}

static void test_answer_caps(void **state) {
  (void)state;
  assert_int_equal(gw_answer_cap(8, 1024, 0, PR_CAP_ANSWER), GW_ANSWER_SLACK + 8 * 1024);
  assert_int_equal(gw_answer_cap(8, 1024, 1, PR_CAP_ANSWER), GW_ANSWER_SLACK + 8 * 1024 * 16);
  assert_int_equal(gw_answer_cap(INT64_C(1) << 40, 1024, 0, PR_CAP_ANSWER), PR_CAP_ANSWER);
  assert_true(gw_answer_cap(1024, 1024, 0, PR_CAP_ANSWER) < PR_CAP_ANSWER / 16);
  assert_int_equal(gw_text_cap(100, PR_CAP_STREAM_TEXT), GW_TEXT_SLACK + 100 * GW_TEXT_BYTES_PER_TOKEN);
  assert_int_equal(gw_text_cap(INT64_C(1) << 40, PR_CAP_STREAM_TEXT), PR_CAP_STREAM_TEXT);
}

static void test_trust_cap(void **state) {
  (void)state;
  assert_int_equal(gw_trust_cap(0, 8, 1), 1);   /* earns a slot per good answer */
  assert_int_equal(gw_trust_cap(3, 8, 1), 4);
  assert_int_equal(gw_trust_cap(0, 8, 2), 2);   /* as many as the others together */
  assert_int_equal(gw_trust_cap(0, 8, 40), 40); /* a big fleet warms at once */
  assert_int_equal(gw_trust_cap(8, 8, 2), 0);   /* a record: no cap */
  assert_int_equal(gw_trust_cap(0, 0, 2), 0);   /* turned off */
  assert_int_equal(gw_trust_cap(0, 8, 0), 0);   /* no other phone: nothing to share */
}

static void test_replica_learning_bounded(void **state) {
  (void)state;
  gw_replica *r = rep("a", 1);
  gw_replica_observe(r, 1e308, 1e-300, 1e308, 1e-300);
  assert_true(isfinite(r->prefill_tps) && r->prefill_tps <= GW_RATE_MAX);
  assert_true(isfinite(r->decode_tps) && r->decode_tps <= GW_RATE_MAX);
  gw_replica_observe(r, INFINITY, INFINITY, NAN, NAN);
  assert_true(isfinite(r->prefill_tps) && isfinite(r->decode_tps));
  gw_replica_free(r);
  /* seeds from heartbeats and Redis: only finite, positive, bounded, before learning */
  r = rep("b", 1);
  gw_replica_seed_rates(r, INFINITY, NAN);
  assert_true(r->prefill_tps == 100 && r->decode_tps == 10);
  gw_replica_seed_rates(r, 1e300, 20);
  assert_true(r->prefill_tps == GW_RATE_MAX && r->decode_tps == 20);
  gw_replica_observe(r, 100, 1000, 10, 1000);
  gw_replica_seed_rates(r, 5, 5);
  assert_true(r->prefill_tps != 5 && r->decode_tps != 5);
  gw_replica_free(r);
}

static void test_replica_share_cap(void **state) {
  (void)state;
  gw_replica *liar = rep("liar", 8), *a = rep("a", 1), *b = rep("b", 1);
  gw_replica *rs[] = {liar, a, b};
  liar->ident.from_heartbeat = 1; /* it registered itself: never one of the fleet's founders */
  /* no trusted phone (a fresh fleet): no cap, every phone fills */
  gw_replicas_trust(rs, 3, 8, 0);
  assert_int_equal(gw_replica_capacity(liar, 0), 8);
  assert_int_equal(gw_replica_capacity(a, 0), 1);
  a->n_ok = b->n_ok = 8; /* a and b have records: the liar gets their slots */
  gw_replicas_trust(rs, 3, 8, 0);
  assert_int_equal(gw_replica_capacity(liar, 0), 2);
  assert_int_equal(gw_replica_capacity(a, 0), 1);
  liar->n_ok = 3;
  gw_replicas_trust(rs, 3, 8, 0);
  assert_int_equal(gw_replica_capacity(liar, 0), 3); /* earned 1 + 3, the group earned 3 */
  liar->n_ok = 8;
  gw_replicas_trust(rs, 3, 8, 0);
  assert_int_equal(gw_replica_capacity(liar, 0), 8);
  /* alone, a phone keeps its slots: nobody else could take the work */
  liar->n_ok = 0;
  gw_replicas_trust(rs, 1, 8, 0);
  assert_int_equal(gw_replica_capacity(liar, 0), 8);
  gw_replica_free(liar);
  gw_replica_free(a);
  gw_replica_free(b);
}

/* The phones the operator listed while no phone had a record are the fleet's founders:
 * the first record caps none of them (B2's 24 phones would fall to a few requests at a
 * time); a phone listed later, or one that registered itself, is capped until it earns
 * its record. */
static void test_founders_are_not_capped(void **state) {
  (void)state;
  gw_replica *a = rep("a", 1), *b = rep("b", 4), *hb = rep("hb", 4), *late = rep("late", 4);
  hb->ident.from_heartbeat = 1;
  gw_replica *rs[] = {a, b, hb, late};
  gw_replicas_trust(rs, 3, 8, 0); /* a fresh fleet of a, b and hb */
  assert_true(a->sched.founder && b->sched.founder);
  assert_false(hb->sched.founder);
  a->n_ok = 8; /* the first record */
  gw_replicas_trust(rs, 4, 8, 0);
  assert_int_equal(gw_replica_capacity(b, 0), 4); /* a founder: its own 4 (capped: 1) */
  assert_false(late->sched.founder);
  /* hb and late share the trusted slots (a's and b's 5) as a group */
  assert_int_equal(gw_replica_capacity(hb, 0) + gw_replica_capacity(late, 0), 5);
  late->n_ok = 8;
  gw_replicas_trust(rs, 4, 8, 0);
  assert_int_equal(gw_replica_capacity(late, 0), 4);
  gw_replica_free(a);
  gw_replica_free(b);
  gw_replica_free(hb);
  gw_replica_free(late);
}

static void test_replica_share_cap_group(void **state) {
  (void)state;
  /* three untrusted ids of 8 slots beside one trusted 2-slot phone: 2 between them */
  gw_replica *h = rep("h", 2), *x = rep("x", 8), *y = rep("y", 8), *z = rep("z", 8);
  gw_replica *rs[] = {x, y, h, z};
  h->n_ok = 8;
  gw_replicas_trust(rs, 4, 8, 0);
  int sum = gw_replica_capacity(x, 0) + gw_replica_capacity(y, 0) + gw_replica_capacity(z, 0);
  assert_int_equal(sum, 2);
  assert_int_equal(gw_replica_capacity(h, 0), 2);
  /* what they hold counts: with 2 in flight on x, none more for y or z */
  x->inflight = 2;
  gw_replicas_trust(rs, 4, 8, 0);
  assert_int_equal(gw_replica_capacity(x, 0), 2);
  assert_int_equal(gw_replica_capacity(y, 0), 0);
  assert_int_equal(gw_replica_capacity(z, 0), 0);
  x->inflight = 0;
  gw_replica_free(h);
  gw_replica_free(x);
  gw_replica_free(y);
  gw_replica_free(z);
}

static void test_trust_group_and_seed(void **state) {
  (void)state;
  assert_int_equal(gw_trust_group_cap(0, 5), -1); /* no trusted phone: no cap */
  assert_int_equal(gw_trust_group_cap(2, 0), 2);
  assert_int_equal(gw_trust_group_cap(2, 9), 9); /* earned by good answers */
  assert_true(gw_bound_seed(1e7, 0) == 1e7);     /* nothing learned yet */
  assert_true(gw_bound_seed(1e7, 50) == 50);
  assert_true(gw_bound_seed(20, 50) == 20);
  gw_replica *rogue = rep("rogue", 64), *h = rep("h", 2);
  gw_replica *rs[] = {rogue, h};
  gw_replica_seed_rates(rogue, 1e7, 1e7);
  gw_replicas_bound_seeds(rs, 2);
  assert_true(rogue->prefill_tps == GW_RATE_MAX || rogue->prefill_tps >= 1e6);
  gw_replica_observe(h, 100, 1000, 10, 1000); /* h: 100 and 10 tokens/s, learned */
  gw_replicas_bound_seeds(rs, 2);
  assert_true(rogue->prefill_tps <= h->prefill_tps && rogue->decode_tps <= h->decode_tps);
  gw_replica_free(rogue);
  gw_replica_free(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rate),
      cmocka_unit_test(test_count),
      cmocka_unit_test(test_timings),
      cmocka_unit_test(test_verify_timings),
      cmocka_unit_test(test_own_evaluated),
      cmocka_unit_test(test_usage),
      cmocka_unit_test(test_answer_caps),
      cmocka_unit_test(test_trust_cap),
      cmocka_unit_test(test_replica_learning_bounded),
      cmocka_unit_test(test_replica_share_cap),
      cmocka_unit_test(test_founders_are_not_capped),
      cmocka_unit_test(test_replica_share_cap_group),
      cmocka_unit_test(test_trust_group_and_seed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
