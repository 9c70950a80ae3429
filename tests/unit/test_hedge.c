/* Unit tests for gateway/hedge.c: when a second attempt starts for an overdue request,
 * and the budget that caps the extra phone work (injected time throughout). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "hedge.h"

/* A 2,000-token prompt predicted to need 10 s for its first byte, 12 s in all, on a phone
 * with hedge_factor 1.5 and hedge_min_s 2: overdue after 10 x 1.5 + 2 = 17 s. */
static gw_hedge_in base(void) {
  return (gw_hedge_in){.elapsed_s = 18, .expected_first_s = 10, .expected_total_s = 12,
                       .prompt_tokens = 2000, .factor = 1.5, .min_s = 2, .alt_finish_s = 3,
                       .alt_service_s = 3, .budget_left_s = 10};
}

static void test_the_margin_comes_from_the_prediction(void **state) {
  (void)state;
  assert_float_equal(gw_hedge_overdue_s(10, 2000, 1.5, 2), 17, 1e-9);
  assert_float_equal(gw_hedge_overdue_s(100, 2000, 1.5, 2), 152, 1e-9);
  gw_hedge_in in = base();
  in.elapsed_s = 16.9;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_NOT_OVERDUE);
  in.elapsed_s = 17;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_YES);
  in.expected_first_s = 100; /* a long prefill is normal, not overdue */
  in.expected_total_s = 110;
  in.elapsed_s = 60;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_NOT_OVERDUE);
}

static void test_short_prompts_hedge_earlier(void **state) {
  (void)state;
  /* the margin past the expectation is halved: 10 + (5 + 2) / 2 */
  assert_float_equal(gw_hedge_overdue_s(10, 512, 1.5, 2), 13.5, 1e-9);
  assert_float_equal(gw_hedge_overdue_s(10, 513, 1.5, 2), 17, 1e-9);
  gw_hedge_in in = base();
  in.elapsed_s = 14;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_NOT_OVERDUE);
  in.prompt_tokens = 100;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_YES);
}

static void test_odd_inputs_never_hedge_at_once(void **state) {
  (void)state;
  assert_float_equal(gw_hedge_overdue_s(-1, 2000, 0.5, -3), 0, 1e-9);
  gw_hedge_in in = base();
  in.elapsed_s = 0.0 / 0.0;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_NOT_OVERDUE);
}

static void test_a_free_phone_must_finish_sooner(void **state) {
  (void)state;
  gw_hedge_in in = base();
  in.alt_finish_s = -1;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_PHONE);
  /* 18 s run of 12 planned: it needs another quarter of its run, 4.5 s */
  assert_float_equal(gw_hedge_remaining_s(18, 12), 4.5, 1e-9);
  assert_float_equal(gw_hedge_remaining_s(5, 12), 7, 1e-9);
  in.alt_finish_s = 4.5;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_GAIN);
  in.alt_finish_s = 4.4;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_YES);
  /* the longer it hangs, the more a slow free phone is worth */
  in.alt_finish_s = 19; /* 80 s run: 20 s left there */
  in.elapsed_s = 80;
  in.alt_service_s = 1;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_YES);
}

/* A phone that failed a health check since the request was sent: hedged at once, to any
 * free phone, within the budget. */
static void test_a_suspect_phone_is_hedged_at_once(void **state) {
  (void)state;
  gw_hedge_in in = base();
  in.elapsed_s = 3; /* 14 s before it is overdue */
  in.alt_finish_s = 11; /* later than the 9 s its prediction has left */
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_NOT_OVERDUE);
  in.suspect = 1;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_YES);
  in.alt_finish_s = -1;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_PHONE);
  in.alt_finish_s = 11;
  in.alt_service_s = 11;
  in.budget_left_s = 10;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_BUDGET);
}

static void test_the_budget_caps_hedges(void **state) {
  (void)state;
  gw_hedge_in in = base();
  in.alt_service_s = 10.5;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_BUDGET);
  in.alt_service_s = 10;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_YES);
  in.budget_left_s = 0;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_BUDGET);
}

/* Off a suspect phone, hedge_min_running hedges may run beyond the budget (a fresh
 * gateway has hardly any); an overdue request on a sound phone gets no such allowance. */
static void test_a_few_suspect_hedges_run_beyond_the_budget(void **state) {
  (void)state;
  gw_hedge_in in = base();
  in.budget_left_s = 0;
  in.min_running = 2;
  in.elapsed_s = 80; /* overdue */
  in.alt_service_s = 1;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_BUDGET); /* not suspect */
  in.suspect = 1;
  in.running = 0;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_YES);
  in.running = 1;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_YES);
  in.running = 2;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_BUDGET);
  in.min_running = 0;
  in.running = 0;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_NO_BUDGET);
  in.budget_left_s = 1; /* within the budget, however many run */
  in.running = 5;
  assert_int_equal(gw_hedge_decide(&in), GW_HEDGE_YES);
}

static void test_the_ledger_is_a_sliding_window(void **state) {
  (void)state;
  gw_hedge_ledger l;
  memset(&l, 0, sizeof(l));
  uint64_t t0 = 1000000;
  assert_float_equal(gw_hedge_budget_left(&l, t0, 0.05, 0, 0), 0, 1e-9); /* no work: no hedges */
  gw_hedge_note(&l, t0, 100, 0);
  assert_float_equal(gw_hedge_budget_left(&l, t0, 0.05, 0, 0), 5, 1e-9);
  gw_hedge_note(&l, t0 + 5000, 3, 1); /* 103 s of work, 3 of them hedges */
  assert_float_equal(gw_hedge_budget_left(&l, t0 + 5000, 0.05, 0, 0), 0.05 * 103 - 3, 1e-9);
  /* running attempts count as they go */
  assert_float_equal(gw_hedge_budget_left(&l, t0 + 5000, 0.05, 20, 1), 0.05 * 123 - 4, 1e-9);
  gw_hedge_note(&l, t0 + 5000, 100, 1); /* overspent: nothing left, never below 0 */
  assert_float_equal(gw_hedge_budget_left(&l, t0 + 5000, 0.05, 0, 0), 0, 1e-9);
  /* 300 s later the window has moved on: the old work and hedges are forgotten */
  uint64_t later = t0 + (uint64_t)GW_HEDGE_BUCKETS * GW_HEDGE_BUCKET_MS + GW_HEDGE_BUCKET_MS;
  assert_float_equal(gw_hedge_budget_left(&l, later, 0.05, 0, 0), 0, 1e-9);
  gw_hedge_note(&l, later, 40, 0);
  assert_float_equal(gw_hedge_budget_left(&l, later, 0.05, 0, 0), 2, 1e-9);
  assert_float_equal(gw_hedge_budget_left(&l, later, 0, 0, 0), 0, 1e-9); /* budget 0: off */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_margin_comes_from_the_prediction),
      cmocka_unit_test(test_short_prompts_hedge_earlier),
      cmocka_unit_test(test_odd_inputs_never_hedge_at_once),
      cmocka_unit_test(test_a_free_phone_must_finish_sooner),
      cmocka_unit_test(test_a_suspect_phone_is_hedged_at_once),
      cmocka_unit_test(test_the_budget_caps_hedges),
      cmocka_unit_test(test_a_few_suspect_hedges_run_beyond_the_budget),
      cmocka_unit_test(test_the_ledger_is_a_sliding_window),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
