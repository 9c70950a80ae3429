/* Unit tests for gateway/predict.c, the one prediction, with the time passed in: learned
 * rates stretched by an overrun and by a hot phone's slowdown together, the prefix cache
 * of the request's own scope, the wait for a usable slot, what does not fit, and a running
 * request's remaining time from its phone's progress report. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "oai.h"
#include "predict.h"
#include "replica.h"

static char *models[] = {"m"};

static gw_replica *rep(int slots, double pre, double dec, int64_t n_ctx) {
  gw_replica *r = gw_replica_new("r", "http://127.0.0.1:1", NULL, models, 1, slots, n_ctx, pre, dec, 0);
  assert_non_null(r);
  return r;
}

static int near(double a, double b) { return fabs(a - b) < 1e-9 * (fabs(b) + 1); }

static void test_rates_and_slowdowns(void **state) {
  (void)state;
  gw_replica *r = rep(2, 1000, 10, 0);
  gw_sched_req q = {.model = "m", .prompt_tokens = 2000, .max_tokens = 50, .expected_out = 20};
  uint64_t now = 100000;
  gw_prediction p = gw_predict(r, &q, now);
  assert_true(p.fits);
  assert_int_equal(p.capacity, 2);
  assert_true(p.slowdown == 1);
  assert_true(near(p.prefill_s, 2.0));     /* 2000 / 1000 */
  assert_true(near(p.service_s, 4.0));     /* + 20 / 10 */
  assert_true(p.wait_s == 0 && near(p.finish_s, 4.0));
  /* a request 4x past its prediction: everything on the phone is planned 4x slower */
  gw_replica_acquire(r, now - 4000, 1000, NULL);
  p = gw_predict(r, &q, now);
  assert_true(near(p.slowdown, 4.0));
  assert_true(near(p.service_s, 16.0));
  assert_true(p.wait_s == 0); /* its other slot is free */
  /* and hot, 1.5x: the two stretches multiply, in every reader's prediction alike */
  r->dev.hot = 1;
  r->dev.slow = 1.5;
  r->dev.pre0 = r->prefill_samples;
  r->dev.dec0 = r->decode_samples;
  p = gw_predict(r, &q, now);
  assert_true(near(p.slowdown, 6.0));
  assert_true(near(gw_predict_slowdown(r, now), 6.0));
  assert_true(near(p.prefill_s, 12.0) && near(p.service_s, 24.0));
  /* the second slot taken: the wait is for the earliest end (the overrun one: a quarter of
   * its 4 s so far, and a millisecond) */
  gw_replica_acquire(r, now, 10000, NULL);
  p = gw_predict(r, &q, now);
  assert_true(near(p.wait_s, 1.001));
  assert_true(near(p.finish_s, 1.001 + 24.0));
  /* the answer planned is never more than the cap */
  q.expected_out = 500;
  assert_true(near(gw_predict_service_s(r, &q, 1.0, NULL, NULL), 2.0 + 5.0));
  gw_replica_free(r);
}

static void test_fit_and_no_capacity(void **state) {
  (void)state;
  gw_replica *r = rep(1, 100, 10, 4096);
  gw_sched_req q = {.model = "m", .prompt_tokens = 4000, .max_tokens = 100, .expected_out = 10};
  gw_prediction p = gw_predict(r, &q, 0);
  assert_false(p.fits); /* 4000 + 100 > 4096 */
  q.max_tokens = 96;
  assert_true(gw_predict(r, &q, 0).fits);
  q.model = "other";
  assert_false(gw_predict(r, &q, 0).fits);
  q.model = "m";
  r->state = GW_REPLICA_DOWN;
  p = gw_predict(r, &q, 0);
  assert_int_equal(p.capacity, 0);
  assert_true(p.wait_s < 0 && p.finish_s < 0); /* no slot will free for it */
  assert_true(p.service_s > 0);                 /* its service is still known */
  gw_replica_free(r);
}

static void test_prefix_cache_of_its_own_scope(void **state) {
  (void)state;
  gw_replica *r = rep(1, 100, 10, 0);
  uint64_t blocks[8];
  for (int i = 0; i < 8; i++) blocks[i] = 1000 + (uint64_t)i;
  gw_pcache_sent(&r->pc, 7, 1, blocks, 8);
  int64_t cached_tokens = 8 * PR_OAI_BLOCK_CHARS / 4;
  gw_sched_req q = {.model = "m", .prompt_tokens = cached_tokens + 100, .max_tokens = 10,
                    .expected_out = 10, .blocks = blocks, .n_blocks = 8, .cache_scope = 7};
  gw_prediction p = gw_predict(r, &q, 0);
  assert_int_equal(p.cached, cached_tokens);
  assert_true(near(p.prefill_s, 1.0)); /* only the 100 tokens not cached are read */
  q.cache_scope = 8;                   /* another key's prompt: nothing of it is reused */
  p = gw_predict(r, &q, 0);
  assert_int_equal(p.cached, 0);
  /* a prompt wholly cached still reads its last token */
  q.cache_scope = 7;
  q.prompt_tokens = cached_tokens;
  p = gw_predict(r, &q, 0);
  assert_int_equal(p.cached, cached_tokens - 1);
  assert_true(near(p.prefill_s, 0.01));
  gw_replica_free(r);
}

static void test_remaining_from_progress(void **state) {
  (void)state;
  /* 1000 of 3000 prompt tokens read at 100/s, decoding reported at 5/s */
  gw_progress p = {.prompt_tokens = 3000, .prompt_done = 1000, .decoded = 0, .prefill_tps = 100,
                   .decode_tps = 5};
  assert_true(near(gw_predict_remaining_s(&p, 50, 20, 400, 10), 20.0 + 4.0));
  /* no decode pace reported: the planned one, slowed as the prefill was (100 of 400) */
  p.decode_tps = -1;
  assert_true(near(gw_predict_remaining_s(&p, 50, 20, 400, 10), 20.0 + 20 / 2.5));
  /* decoding past the expected length: at least one token more, never past the cap */
  p.prompt_done = 3000;
  p.decoded = 30;
  p.decode_tps = 5;
  assert_true(near(gw_predict_remaining_s(&p, 50, 20, 400, 10), 0.2));
  p.decoded = 49;
  assert_true(near(gw_predict_remaining_s(&p, 50, 80, 400, 10), 0.2));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_rates_and_slowdowns),
    cmocka_unit_test(test_fit_and_no_capacity),
    cmocka_unit_test(test_prefix_cache_of_its_own_scope),
    cmocka_unit_test(test_remaining_from_progress),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
