/* Unit tests for gateway/ledger.c, the cost accounting's arithmetic, on a fake clock:
 * two phones, three requests and a phone down for a while, checked against the sums
 * worked out by hand (docs/operations.md "Costs"); the hour forgetting its first minute
 * (a request that ran across a minute's end keeps only the part after it); the day
 * forgetting everything after 24 hours; names beyond the table's room going to _other. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ledger.h"

#define S 1000u                     /* a second, in ms */
#define DAY_S 86400.0
/* 10 h and 30 s of loop time: half way through minute 600, hour 10 */
#define T0 (10u * GW_LEDGER_HOUR_MS + 30u * S)

static void near(double got, double want) {
  double tol = 1e-12 + fabs(want) * 1e-9;
  if (fabs(got - want) > tol) fail_msg("got %.15g, want %.15g", got, want);
}

/* The fleet as in the seed: a 0.57-a-day phone A with 2 slots, a 1.03-a-day phone B with
 * 1, accrued second by second for 90 s as the gateway's tick does; B down the last 10 s. */
static gw_ledger *scenario(void) {
  gw_ledger *l = gw_ledger_new(T0);
  assert_non_null(l);
  for (uint64_t t = T0; t < T0 + 90 * S; t += S)
    gw_ledger_fleet(l, t, t + S, 0.57 + 1.03, t >= T0 + 80 * S ? 1.03 : 0);
  /* r1: m1 for alpha on A, [10 s, 40 s): across minute 600's end at 30 s, fed in two
   * pieces as a tick and then the release would */
  gw_ledger_use(l, T0 + 10 * S, T0 + 25 * S, 0.57 / 2, "m1", "alpha");
  gw_ledger_use(l, T0 + 25 * S, T0 + 40 * S, 0.57 / 2, "m1", "alpha");
  gw_ledger_served(l, T0 + 40 * S, "m1", "alpha", 100);
  /* r2: m2 for beta on B, [50 s, 60 s) */
  gw_ledger_use(l, T0 + 50 * S, T0 + 60 * S, 1.03 / 1, "m2", "beta");
  gw_ledger_served(l, T0 + 60 * S, "m2", "beta", 50);
  /* r3: m1 for beta on A, [60 s, 80 s) */
  gw_ledger_use(l, T0 + 60 * S, T0 + 80 * S, 0.57 / 2, "m1", "beta");
  gw_ledger_served(l, T0 + 80 * S, "m1", "beta", 30);
  /* a request that failed: its slot time counts, it was not served */
  gw_ledger_use(l, T0 + 82 * S, T0 + 84 * S, 0.57 / 2, "m2", NULL);
  return l;
}

static void test_hand_computation(void **state) {
  (void)state;
  gw_ledger *l = scenario();
  const uint64_t now = T0 + 90 * S;
  gw_ledger_sum f, s;
  for (int w = GW_LEDGER_HOUR; w <= GW_LEDGER_DAY; w++) {
    gw_ledger_sum_of(l, now, (gw_ledger_window)w, GW_LEDGER_MODEL, NULL, &f);
    near(f.span_s, 90);                              /* since the start: less than the window */
    near(f.cost, 1.6 * 90 / DAY_S);                  /* 0.00166666… */
    double busy = (0.285 * (30 + 20 + 2) + 1.03 * 10) / DAY_S;
    near(f.busy, busy);
    near(f.down, 1.03 * 10 / DAY_S);
    assert_int_equal(f.requests, 3);
    assert_int_equal(f.tokens, 180);

    gw_ledger_sum_of(l, now, (gw_ledger_window)w, GW_LEDGER_MODEL, "m1", &s);
    near(s.busy, 0.285 * 50 / DAY_S);                /* 30 s + 20 s of one of A's slots */
    assert_int_equal(s.requests, 2);
    assert_int_equal(s.tokens, 130);
    near(s.busy / (double)s.requests * 1e3, 0.285 * 50 / DAY_S / 2 * 1e3);   /* per 1k requests */
    near(s.busy / (double)s.tokens * 1e6, 0.285 * 50 / DAY_S / 130 * 1e6);   /* per 1M tokens */
    near(s.busy / (double)s.requests * 1e3, 8.24652777777778e-2);           /* the number itself */

    gw_ledger_sum_of(l, now, (gw_ledger_window)w, GW_LEDGER_MODEL, "m2", &s);
    near(s.busy, (1.03 * 10 + 0.285 * 2) / DAY_S);   /* the failed attempt is m2's cost too */
    assert_int_equal(s.requests, 1);

    gw_ledger_sum_of(l, now, (gw_ledger_window)w, GW_LEDGER_KEY, "beta", &s);
    near(s.busy, (1.03 * 10 + 0.285 * 20) / DAY_S);
    assert_int_equal(s.requests, 2);
    assert_int_equal(s.tokens, 80);
    gw_ledger_sum_of(l, now, (gw_ledger_window)w, GW_LEDGER_KEY, "anonymous", &s);
    near(s.busy, 0.285 * 2 / DAY_S);
    assert_int_equal(s.requests, 0);
    gw_ledger_sum_of(l, now, (gw_ledger_window)w, GW_LEDGER_KEY, "nobody", &s);
    near(s.busy, 0);

    /* the models' costs, and the keys', add up to the fleet's busy cost */
    for (int kind = GW_LEDGER_MODEL; kind <= GW_LEDGER_KEY; kind++) {
      double sum = 0;
      for (size_t i = 0; i < gw_ledger_count(l, (gw_ledger_kind)kind); i++) {
        gw_ledger_sum_of(l, now, (gw_ledger_window)w, (gw_ledger_kind)kind,
                         gw_ledger_name(l, (gw_ledger_kind)kind, i), &s);
        sum += s.busy;
      }
      near(sum, busy);
    }
  }
  assert_int_equal(gw_ledger_count(l, GW_LEDGER_MODEL), 2);
  assert_string_equal(gw_ledger_name(l, GW_LEDGER_KEY, 2), "anonymous");
  gw_ledger_totals(l, now, &f);
  near(f.cost, 1.6 * 90 / DAY_S);
  near(f.span_s, 90);
  gw_ledger_free(l);
}

static void test_the_hour_forgets_its_oldest_minute(void **state) {
  (void)state;
  gw_ledger *l = scenario();
  /* minute 660: the hour holds minutes 601-660, no longer 600 ([10 h, 10 h 1 min)) */
  const uint64_t now = 11u * GW_LEDGER_HOUR_MS + 15 * S;
  gw_ledger_sum f, s;
  gw_ledger_sum_of(l, now, GW_LEDGER_HOUR, GW_LEDGER_MODEL, NULL, &f);
  near(f.span_s, 59 * 60 + 15);                   /* from minute 601's start */
  near(f.cost, 1.6 * 60 / DAY_S);                 /* [10 h 1 min, 10 h 2 min): 60 of the 90 s */
  gw_ledger_sum_of(l, now, GW_LEDGER_HOUR, GW_LEDGER_MODEL, "m1", &s);
  near(s.busy, 0.285 * (10 + 20) / DAY_S);        /* r1 keeps its last 10 s */
  assert_int_equal(s.requests, 2);                /* both were served in minute 601 */
  /* the day still has it all */
  gw_ledger_sum_of(l, now, GW_LEDGER_DAY, GW_LEDGER_MODEL, NULL, &f);
  near(f.cost, 1.6 * 90 / DAY_S);
  near(f.span_s, 3600 - 30 + 15);
  /* an hour on: the hour has nothing */
  gw_ledger_sum_of(l, now + GW_LEDGER_HOUR_MS, GW_LEDGER_HOUR, GW_LEDGER_MODEL, NULL, &f);
  near(f.cost, 0);
  assert_int_equal(f.requests, 0);
  near(f.span_s, 59 * 60 + 15);
  /* and 24 hours on, neither has the day */
  gw_ledger_sum_of(l, now + 24u * GW_LEDGER_HOUR_MS, GW_LEDGER_DAY, GW_LEDGER_MODEL, "m1", &s);
  near(s.busy, 0);
  assert_int_equal(s.requests, 0);
  gw_ledger_sum_of(l, now + 24u * GW_LEDGER_HOUR_MS, GW_LEDGER_DAY, GW_LEDGER_MODEL, NULL, &f);
  near(f.cost, 0);
  near(f.span_s, 23 * 3600 + 15);
  /* since the start keeps counting */
  gw_ledger_totals(l, now, &f);
  near(f.cost, 1.6 * 90 / DAY_S);
  assert_int_equal(f.requests, 3);
  gw_ledger_free(l);
}

static void test_a_long_span_lands_in_its_buckets(void **state) {
  (void)state;
  gw_ledger *l = gw_ledger_new(0);
  /* 3 hours at 24 a day: one per hour. At 3 h sharp the hour holds this minute (just
   * begun) and the 59 before it: 59 minutes of the span */
  gw_ledger_fleet(l, 0, 3u * GW_LEDGER_HOUR_MS, 24, 0);
  gw_ledger_sum f;
  gw_ledger_sum_of(l, 3u * GW_LEDGER_HOUR_MS, GW_LEDGER_HOUR, GW_LEDGER_MODEL, NULL, &f);
  near(f.cost, 59.0 / 60);
  near(f.span_s, 59 * 60);
  gw_ledger_sum_of(l, 3u * GW_LEDGER_HOUR_MS, GW_LEDGER_DAY, GW_LEDGER_MODEL, NULL, &f);
  near(f.cost, 3);
  /* a price of 0 or less costs nothing */
  gw_ledger_use(l, 0, 1000, -5, "m", "k");
  gw_ledger_sum_of(l, 3u * GW_LEDGER_HOUR_MS, GW_LEDGER_DAY, GW_LEDGER_MODEL, NULL, &f);
  near(f.busy, 0);
  gw_ledger_free(l);
}

static void test_names_are_bounded(void **state) {
  (void)state;
  gw_ledger *l = gw_ledger_new(0);
  char name[32];
  for (int i = 0; i < GW_LEDGER_MAX_MODELS + 10; i++) {
    snprintf(name, sizeof(name), "model-%d", i);
    gw_ledger_served(l, 1000, name, NULL, 1);
  }
  assert_int_equal(gw_ledger_count(l, GW_LEDGER_MODEL), GW_LEDGER_MAX_MODELS);
  assert_string_equal(gw_ledger_name(l, GW_LEDGER_MODEL, GW_LEDGER_MAX_MODELS - 1), "_other");
  gw_ledger_sum s;
  gw_ledger_sum_of(l, 2000, GW_LEDGER_HOUR, GW_LEDGER_MODEL, "_other", &s);
  assert_int_equal(s.requests, 11);
  assert_int_equal(gw_ledger_count(l, GW_LEDGER_KEY), 1);
  assert_string_equal(gw_ledger_name(l, GW_LEDGER_KEY, 0), "anonymous");
  gw_ledger_free(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_hand_computation),
    cmocka_unit_test(test_the_hour_forgets_its_oldest_minute),
    cmocka_unit_test(test_a_long_span_lands_in_its_buckets),
    cmocka_unit_test(test_names_are_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
