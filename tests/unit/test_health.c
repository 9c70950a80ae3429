/* Unit tests for gateway/health.c's decisions with injected time (gw_health_verdict: what a
 * health check's outcome does to a phone): a ready phone is marked down after
 * health.fail_threshold failures in a row and not before; a pass in between starts the
 * count again; a down phone comes back on probation after health.rise passes, but not
 * before its down_until_ms nor while its agent's heartbeats are overdue; a loading engine
 * is loading, not down, and one pass brings it back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "health.h"
#include "replica.h"

#define T0 5000000u

static gw_config conf;

static gw_replica *phone(void) {
  memset(&conf, 0, sizeof(conf));
  conf.fail_threshold = 3;
  conf.rise = 2;
  conf.heartbeat_timeout_s = 15;
  char *models[] = {"m"};
  gw_replica *r = gw_replica_new("p1", "http://127.0.0.1:1", NULL, models, 1, 2, 0, 100, 10, 0);
  assert_non_null(r);
  gw_replica_set_state(r, GW_REPLICA_READY, T0, "test");
  return r;
}

static void test_a_phone_is_marked_down_after_fail_threshold_failures(void **state) {
  (void)state;
  gw_replica *r = phone();
  gw_health_verdict(&conf, r, T0 + 1000, 0, 0, "/health connection refused");
  gw_health_verdict(&conf, r, T0 + 2000, 0, 0, "/health connection refused");
  assert_int_equal(r->state, GW_REPLICA_READY); /* two are not enough */
  assert_string_equal(r->health.last_probe_error, "/health connection refused");
  gw_health_verdict(&conf, r, T0 + 3000, 0, 0, "/health connection refused");
  assert_int_equal(r->state, GW_REPLICA_DOWN);
  assert_string_equal(r->state_reason, "health check failed 3 times: /health connection refused");
  assert_int_equal(r->down_until_ms, T0 + 3000);
  gw_replica_free(r);
}

static void test_a_pass_between_failures_starts_the_count_again(void **state) {
  (void)state;
  gw_replica *r = phone();
  gw_health_verdict(&conf, r, T0 + 1000, 0, 0, "x");
  gw_health_verdict(&conf, r, T0 + 2000, 0, 0, "x");
  gw_health_verdict(&conf, r, T0 + 3000, 1, 0, "");
  assert_string_equal(r->health.last_probe_error, "");
  gw_health_verdict(&conf, r, T0 + 4000, 0, 0, "x");
  gw_health_verdict(&conf, r, T0 + 5000, 0, 0, "x");
  assert_int_equal(r->state, GW_REPLICA_READY);
  gw_health_verdict(&conf, r, T0 + 6000, 0, 0, "x");
  assert_int_equal(r->state, GW_REPLICA_DOWN);
  gw_replica_free(r);
}

static void test_a_down_phone_comes_back_on_probation_after_rise_passes(void **state) {
  (void)state;
  gw_replica *r = phone();
  for (int i = 1; i <= 3; i++) gw_health_verdict(&conf, r, T0 + (uint64_t)i * 1000, 0, 0, "x");
  assert_int_equal(r->state, GW_REPLICA_DOWN);
  gw_health_verdict(&conf, r, T0 + 10000, 1, 0, "");
  assert_int_equal(r->state, GW_REPLICA_DOWN); /* one pass: rise is 2 */
  gw_health_verdict(&conf, r, T0 + 11000, 1, 0, "");
  assert_int_equal(r->state, GW_REPLICA_READY);
  assert_int_equal(gw_replica_has(r, GW_HELD_PROBATION), 1); /* one slot until a real request succeeds */
  assert_string_equal(r->state_reason, "health checks passed, on probation");
  gw_replica_free(r);
}

static void test_a_down_phone_stays_down_before_its_time_or_without_heartbeats(void **state) {
  (void)state;
  gw_replica *r = phone();
  gw_replica_set_state(r, GW_REPLICA_DOWN, T0, "failures");
  r->down_until_ms = T0 + 30000; /* kept out for a cool-down */
  for (int i = 1; i <= 4; i++) gw_health_verdict(&conf, r, T0 + (uint64_t)i * 1000, 1, 0, "");
  assert_int_equal(r->state, GW_REPLICA_DOWN);
  gw_health_verdict(&conf, r, T0 + 30000, 1, 0, "");
  assert_int_equal(r->state, GW_REPLICA_READY);
  gw_replica_free(r);

  /* an agent whose heartbeats stopped stays out, however its probes go */
  r = phone();
  gw_replica_set_state(r, GW_REPLICA_DOWN, T0, "no heartbeat");
  r->down_until_ms = T0;
  r->report.last_heartbeat_ms = T0;
  for (int i = 1; i <= 4; i++) gw_health_verdict(&conf, r, T0 + 15000 + (uint64_t)i * 1000, 1, 0, "");
  assert_int_equal(r->state, GW_REPLICA_DOWN);
  r->report.last_heartbeat_ms = T0 + 19500; /* it speaks again */
  gw_health_verdict(&conf, r, T0 + 20000, 1, 0, "");
  assert_int_equal(r->state, GW_REPLICA_READY);
  gw_replica_free(r);
}

static void test_a_loading_engine_is_loading_not_down(void **state) {
  (void)state;
  gw_replica *r = phone();
  gw_health_verdict(&conf, r, T0 + 1000, 0, 0, "x");
  gw_health_verdict(&conf, r, T0 + 2000, 0, 0, "x");
  /* 503 Loading model: not a third failure, and the count starts again */
  for (int i = 0; i < 4; i++) gw_health_verdict(&conf, r, T0 + 3000 + (uint64_t)i * 1000, 0, 1, "503 Loading model");
  assert_int_equal(r->state, GW_REPLICA_LOADING);
  assert_int_equal(r->health.probe_fail, 0);
  assert_int_equal(r->props_due, 1); /* its shape is read again once it is back */
  gw_health_verdict(&conf, r, T0 + 9000, 1, 0, "");
  assert_int_equal(r->state, GW_REPLICA_READY);
  assert_int_equal(gw_replica_has(r, GW_HELD_PROBATION), 0);
  gw_replica_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_phone_is_marked_down_after_fail_threshold_failures),
      cmocka_unit_test(test_a_pass_between_failures_starts_the_count_again),
      cmocka_unit_test(test_a_down_phone_comes_back_on_probation_after_rise_passes),
      cmocka_unit_test(test_a_down_phone_stays_down_before_its_time_or_without_heartbeats),
      cmocka_unit_test(test_a_loading_engine_is_loading_not_down),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
