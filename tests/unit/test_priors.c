/* Unit tests for what the gateway assumes of phones it has not measured (gateway/replica.c
 * gw_replicas_prior, gw_replicas_priors) and for exploration in gateway/scheduler.c: the
 * prior is the median of the measured phones of the model, stale rates drift back to it,
 * and an unmeasured phone is tried when that costs little, deterministically. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "replica.h"
#include "scheduler.h"

static char *model_m[] = {"m"};
static char *model_o[] = {"other"};

static gw_replica *rep(const char *id, char **models, double pre, double dec) {
  gw_replica *r = gw_replica_new(id, "http://127.0.0.1:1", NULL, models, 1, 1, 0, pre, dec, 0);
  assert_non_null(r);
  return r;
}

/* A phone measured at these rates (first samples replace the seed quickly; several do so
 * exactly enough for the tests). */
static gw_replica *measured(const char *id, char **models, double pre, double dec) {
  gw_replica *r = rep(id, models, 0, 0);
  for (int i = 0; i < 40; i++) gw_replica_observe(r, pre, 1000, dec, 1000);
  assert_true(fabs(r->prefill_tps - pre) < pre * 1e-3 && fabs(r->decode_tps - dec) < dec * 1e-3);
  return r;
}

static void free_all(gw_replica **rs, size_t n) {
  for (size_t i = 0; i < n; i++) gw_replica_free(rs[i]);
}

static void test_prior_is_median_of_model(void **state) {
  (void)state;
  gw_replica *rs[6] = {measured("a", model_m, 100, 10), measured("b", model_m, 200, 20),
                       measured("c", model_m, 2000, 500), /* the fastest sets nothing */
                       measured("x", model_o, 9000, 900), /* another model's */
                       rep("new", model_m, 0, 0), rep("seeded", model_m, 30, 3)};
  double pre, dec;
  /* measured 100, 200, 2000 and the operator's 30: the middle two's mean */
  gw_replicas_priors(rs, 6, 1000, 1800);
  assert_true(fabs(rs[4]->prefill_tps - 150) < 0.5 && fabs(rs[4]->decode_tps - 15) < 0.05);
  /* the operator's seed stands */
  assert_true(rs[5]->prefill_tps == 30 && rs[5]->decode_tps == 3);
  /* without it, an odd count's middle */
  gw_replica *m3[4] = {rs[0], rs[1], rs[2], rs[4]};
  gw_replicas_prior(m3, 4, rs[4], &pre, &dec);
  assert_true(fabs(pre - 200) < 0.5 && fabs(dec - 20) < 0.05);
  /* an unmeasured phone of a model nobody measured keeps the fixed defaults */
  gw_replica *lone = rep("lone", model_o, 0, 0);
  gw_replica_free(rs[3]);
  rs[3] = lone;
  gw_replicas_priors(rs, 6, 1000, 1800);
  assert_true(lone->prefill_tps == 50 && lone->decode_tps == 5);
  /* a claimed (heartbeat) rate is not replaced, and is no part of the prior */
  gw_replica *two[3] = {measured("p", model_m, 100, 10), measured("q", model_m, 300, 30),
                        rep("claims", model_m, 0, 0)};
  gw_replica_seed_rates(two[2], 1000, 100);
  gw_replicas_prior(two, 3, two[2], &pre, &dec);
  assert_true(fabs(pre - 200) < 0.5 && fabs(dec - 20) < 0.05);
  gw_replicas_priors(two, 3, 1000, 1800);
  assert_true(two[2]->prefill_tps == 1000 && two[2]->decode_tps == 100);
  /* once measured, a phone learns from its start at the prior */
  gw_replicas_priors(rs, 6, 1000, 1800);
  gw_replica_observe(rs[4], 400, 1000, 40, 1000);
  assert_true(rs[4]->decode_tps > 20 && rs[4]->decode_tps < 40);
  free_all(rs, 6);
  free_all(two, 3);
}

/* Phones of different lists of models, one after the other: each list's prior is worked
 * out from the rates as the call found them, whatever the fleet's order (it was worked out
 * again for every phone whose list differed from the last one's, after the phones before
 * it had drifted: the order decided, and a fleet of mixed lists paid a median over the
 * whole fleet per phone) */
static void test_priors_per_list_as_found(void **state) {
  (void)state;
  gw_replica *rs[4] = {measured("fast", model_m, 1000, 100), measured("x", model_o, 500, 50),
                       measured("a", model_m, 100, 10), rep("new", model_m, 0, 0)};
  gw_replica *ss[4] = {rep("new", model_m, 0, 0), measured("a", model_m, 100, 10),
                       measured("x", model_o, 500, 50), measured("fast", model_m, 1000, 100)};
  uint64_t t0 = 10000;
  gw_replicas_priors(rs, 4, t0, 1800);
  gw_replicas_priors(ss, 4, t0, 1800);
  assert_true(fabs(rs[3]->prefill_tps - 550) < 0.5 && fabs(rs[3]->decode_tps - 55) < 0.05);
  /* a time constant later the measured ones drift toward 550 / 55 (the prior of the rates
   * as found: 1000 and 100), and the new one is given that prior, not one worked out after
   * "fast" had drifted (392.6) */
  gw_replicas_priors(rs, 4, t0 + 1800000, 1800);
  gw_replicas_priors(ss, 4, t0 + 1800000, 1800);
  assert_true(fabs(rs[3]->prefill_tps - 550) < 0.5 && fabs(rs[3]->decode_tps - 55) < 0.05);
  double want = 550 * pow(1000.0 / 550, exp(-1.0));
  assert_true(fabs(rs[0]->prefill_tps - want) < 0.01 * want);
  /* the same fleet in the other order: the same rates */
  for (int i = 0; i < 4; i++) {
    assert_true(rs[i]->prefill_tps == ss[3 - i]->prefill_tps);
    assert_true(rs[i]->decode_tps == ss[3 - i]->decode_tps);
  }
  free_all(rs, 4);
  free_all(ss, 4);
}

static void test_drift_toward_prior(void **state) {
  (void)state;
  gw_replica *rs[3] = {measured("fast", model_m, 1000, 100), measured("a", model_m, 100, 10),
                       measured("b", model_m, 100, 10)};
  gw_replica *ss[3] = {measured("fast", model_m, 1000, 100), measured("a", model_m, 100, 10),
                       measured("b", model_m, 100, 10)};
  uint64_t t0 = 10000;
  gw_replicas_priors(rs, 3, t0, 1800);
  gw_replicas_priors(ss, 3, t0, 1800);
  /* within a second: no step */
  gw_replicas_priors(rs, 3, t0 + 500, 1800);
  assert_true(fabs(rs[0]->decode_tps - 100) < 0.1);
  /* one time constant without a sample: the log-distance to the prior (10) shrinks by e */
  gw_replicas_priors(rs, 3, t0 + 1800000, 1800);
  double want = 10 * pow(10, exp(-1.0));
  assert_true(fabs(rs[0]->decode_tps - want) < 0.01 * want);
  assert_true(fabs(rs[1]->decode_tps - 10) < 0.01); /* at the prior already */
  /* stepping often is the same drift as stepping once */
  for (int i = 1; i <= 60; i++) gw_replicas_priors(ss, 3, t0 + (uint64_t)i * 30000, 1800);
  assert_true(fabs(ss[0]->decode_tps - rs[0]->decode_tps) < 0.001 * want);
  /* a fresh sample stops the drift for that step: the answer is the news */
  gw_replica_observe(rs[0], 0, 0, 100, 1000);
  double after = rs[0]->decode_tps;
  gw_replicas_priors(rs, 3, t0 + 3600000, 1800);
  assert_true(rs[0]->decode_tps == after);
  /* no drift when switched off */
  double pre = rs[0]->prefill_tps;
  gw_replicas_priors(rs, 3, t0 + 7200000, 0);
  assert_true(rs[0]->prefill_tps == pre);
  free_all(rs, 3);
  free_all(ss, 3);
}

static gw_sched_req req(double explore) {
  gw_sched_req q = {.model = "m", .prompt_tokens = 100, .max_tokens = 10, .expected_out = 10,
                    .explore = explore};
  return q;
}

static void test_exploration(void **state) {
  (void)state;
  gw_replica *rs[3] = {measured("slow", model_m, 100, 10), measured("fast", model_m, 200, 20),
                       rep("new", model_m, 0, 0)};
  gw_replicas_priors(rs, 3, 1000, 1800);
  /* fast: 100/200 + 10/20 = 1 s; new at the prior (150, 15): 1.33 s */
  gw_sched_choice c;
  gw_sched_req q = req(0);
  gw_sched_plan(rs, 3, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  q = req(0.2); /* 33 % longer is more than it may cost */
  gw_sched_plan(rs, 3, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  for (int i = 0; i < 3; i++) { /* the same inputs, the same choice */
    q = req(0.5);
    gw_sched_plan(rs, 3, &q, 1, 1000, &c);
    assert_int_equal(c.replica, 2);
    assert_true(c.now);
    assert_true(c.finish_s > 1.3 && c.finish_s < 1.4);
  }
  /* exploring costs no more than short work's time: 0.33 s later is little beside
   * short_s 1 s, too much beside 0.2 s */
  q.short_s = 1;
  gw_sched_plan(rs, 3, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 2);
  q.short_s = 0.2;
  gw_sched_plan(rs, 3, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  q.short_s = 0;
  /* a busy unmeasured phone is not waited for to explore */
  uint64_t lease = gw_replica_acquire(rs[2], 1000, 5000, NULL);
  gw_sched_plan(rs, 3, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  gw_replica_release(rs[2], lease);
  /* once measured, it competes on its rates alone */
  gw_replica_observe(rs[2], 100, 1000, 10, 1000);
  gw_sched_plan(rs, 3, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  /* two requests in one pass: one explores, the next goes where it finishes soonest */
  gw_replica *ts[3] = {measured("slow", model_m, 100, 10), measured("fast", model_m, 200, 20),
                       rep("new", model_m, 0, 0)};
  gw_replicas_priors(ts, 3, 1000, 1800);
  gw_sched_req qs[2] = {req(0.5), req(0.5)};
  gw_sched_choice cs[2];
  gw_sched_plan(ts, 3, qs, 2, 1000, cs);
  assert_int_equal(cs[0].replica, 2);
  assert_int_equal(cs[1].replica, 1);
  free_all(rs, 3);
  free_all(ts, 3);
}

/* Rates an operator configured are known: such a phone is planned at them, not explored,
 * even before its first answer. A phone's own claim is not knowledge: it is explored. */
static void test_configured_rates_not_explored(void **state) {
  (void)state;
  /* fast: 1 s; "set" configured at 150 / 15: 1.33 s, within 1.5x: explored were it unknown */
  gw_replica *rs[3] = {measured("slow", model_m, 100, 10), measured("fast", model_m, 200, 20),
                       rep("set", model_m, 150, 15)};
  gw_replicas_priors(rs, 3, 1000, 1800);
  assert_false(gw_replica_measured(rs[2]));
  assert_false(gw_replica_unknown(rs[2]));
  gw_sched_req q = req(0.5);
  gw_sched_choice c;
  gw_sched_plan(rs, 3, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 1);
  /* only one rate configured: the other is planned at the prior, so it is explored */
  gw_replica *half = rep("half", model_m, 150, 0);
  gw_replica *hs[3] = {rs[0], rs[1], half};
  gw_replicas_priors(hs, 3, 1000, 1800);
  assert_true(gw_replica_unknown(half));
  gw_sched_plan(hs, 3, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 2);
  /* claimed by the phone (a heartbeat): explored */
  gw_replica *claim = rep("claim", model_m, 0, 0);
  gw_replica_seed_rates(claim, 150, 15);
  gw_replica *cs[3] = {rs[0], rs[1], claim};
  gw_replicas_priors(cs, 3, 1000, 1800);
  assert_true(gw_replica_unknown(claim));
  gw_sched_plan(cs, 3, &q, 1, 1000, &c);
  assert_int_equal(c.replica, 2);
  /* and once it answered, it is known */
  gw_replica_observe(claim, 150, 1000, 15, 1000);
  assert_false(gw_replica_unknown(claim));
  gw_replica_free(half);
  gw_replica_free(claim);
  free_all(rs, 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prior_is_median_of_model),
      cmocka_unit_test(test_priors_per_list_as_found),
      cmocka_unit_test(test_drift_toward_prior),
      cmocka_unit_test(test_exploration),
      cmocka_unit_test(test_configured_rates_not_explored),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
