/* Unit tests for gateway/device.c and its hooks in replica.c and scheduler.c: which
 * readings hold a phone back (battery under the low mark or the floor while not
 * charging, a temperature over hot_c with its hysteresis, a capped CPU clock), that
 * unknown readings do nothing, and that the plan sees the slot limit and the slowdown,
 * which fades as answers measured while hot arrive. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device.h"
#include "replica.h"
#include "scheduler.h"

static const gw_device_conf conf = {.battery_low_pct = 20, .battery_floor_pct = 10, .hot_c = 45,
                                    .clock_cap_ratio = 0.8, .hot_slowdown = 1.5, .hot_answers = 3};

static gw_device_verdict judge(double bat, int charging, double temp, double ratio, int was_hot) {
  gw_device_verdict v;
  gw_device_judge(&conf, bat, charging, temp, ratio, was_hot, &v);
  return v;
}

static void test_unknown_readings_do_nothing(void **state) {
  (void)state;
  gw_device_verdict v = judge(-1, -1, -1, -1, 0);
  assert_int_equal(v.cap, -1);
  assert_false(v.hot);
  assert_true(v.slowdown == 1.0);
  assert_string_equal(v.why, "");
  /* a low battery whose charging state is unknown is not taken to be draining */
  v = judge(5, -1, -1, -1, 0);
  assert_int_equal(v.cap, -1);
  assert_string_equal(v.why, "");
  /* a cool, uncapped phone with a full battery */
  v = judge(90, 0, 30, 1, 0);
  assert_int_equal(v.cap, -1);
  assert_false(v.hot);
  assert_string_equal(v.why, "");
}

static void test_battery(void **state) {
  (void)state;
  gw_device_verdict v = judge(8, 0, -1, -1, 0);
  assert_int_equal(v.cap, 0);
  assert_non_null(strstr(v.why, "battery 8 % and not charging"));
  assert_non_null(strstr(v.why, "floor of 10 %"));
  v = judge(15, 0, -1, -1, 0);
  assert_int_equal(v.cap, 1);
  assert_non_null(strstr(v.why, "one request at a time"));
  /* the marks are "under": at the mark the phone is spared */
  assert_int_equal(judge(10, 0, -1, -1, 0).cap, 1);
  assert_int_equal(judge(20, 0, -1, -1, 0).cap, -1);
  /* charging lifts both */
  v = judge(3, 1, -1, -1, 0);
  assert_int_equal(v.cap, -1);
  assert_string_equal(v.why, "");
  /* 0 turns a mark off */
  gw_device_conf off = conf;
  off.battery_floor_pct = 0;
  off.battery_low_pct = 0;
  gw_device_judge(&off, 0, 0, -1, -1, 0, &v);
  assert_int_equal(v.cap, -1);
}

static void test_heat(void **state) {
  (void)state;
  gw_device_verdict v = judge(-1, -1, 48, -1, 0);
  assert_true(v.hot);
  assert_true(v.slowdown == 1.5);
  assert_int_equal(v.cap, -1);
  assert_non_null(strstr(v.why, "48.0 °C, over 45 °C"));
  assert_false(judge(-1, -1, 45, -1, 0).hot);
  /* hysteresis: once hot, cool again only 2 °C under the mark */
  assert_true(judge(-1, -1, 44, -1, 1).hot);
  assert_false(judge(-1, -1, 43, -1, 1).hot);
  /* a capped clock: planned at rates x its share (1 / 0.5 = 2x), more than hot_slowdown */
  v = judge(-1, -1, 30, 0.5, 0);
  assert_true(v.hot);
  assert_true(v.slowdown > 1.99 && v.slowdown < 2.01);
  assert_non_null(strstr(v.why, "CPU clock capped to 50 %"));
  assert_false(judge(-1, -1, 30, 0.8, 0).hot);
  /* both: the larger slowdown, both named; with a low battery, both reasons */
  v = judge(15, 0, 50, 0.9, 0);
  assert_true(v.hot);
  assert_int_equal(v.cap, 1);
  assert_true(v.slowdown == 1.5);
  assert_non_null(strstr(v.why, "one request at a time; 50.0 °C"));
  v = judge(-1, -1, 50, 0.25, 0);
  assert_true(v.slowdown > 3.99 && v.slowdown < 4.01);
  /* the slowdown fades over hot_answers answers measured while hot */
  assert_true(gw_device_slowdown_now(2.0, 0, 3) == 2.0);
  double s1 = gw_device_slowdown_now(2.0, 1, 3), s2 = gw_device_slowdown_now(2.0, 2, 3);
  assert_true(s1 < 2.0 && s2 < s1 && s2 > 1.0);
  assert_true(gw_device_slowdown_now(2.0, 3, 3) == 1.0);
  assert_true(gw_device_slowdown_now(1.0, 0, 3) == 1.0);
}

static char *models[] = {"m"};

static gw_replica *rep(const char *id) {
  gw_replica *r = gw_replica_new(id, "http://127.0.0.1:1", NULL, models, 1, 4, 0, 100, 10, 0);
  assert_non_null(r);
  return r;
}

/* what heartbeat.c does with a verdict */
static void apply(gw_replica *r, const gw_device_verdict *v) {
  if (v->hot && !r->dev.hot) {
    r->dev.pre0 = r->prefill_samples;
    r->dev.dec0 = r->decode_samples;
  }
  r->dev.cap = v->cap;
  r->dev.hot = v->hot;
  r->dev.slow = v->slowdown;
  r->dev.hot_answers = conf.hot_answers;
}

static void test_plan_sees_it(void **state) {
  (void)state;
  gw_replica *r[2] = {rep("a"), rep("b")};
  uint64_t now = 100000;
  assert_int_equal(gw_replica_capacity(r[0], now), 4);
  gw_device_verdict v = judge(8, 0, -1, -1, 0);
  apply(r[0], &v);
  assert_int_equal(gw_replica_capacity(r[0], now), 0);
  v = judge(15, 0, -1, -1, 0);
  apply(r[0], &v);
  assert_int_equal(gw_replica_capacity(r[0], now), 1);
  v = judge(15, 1, -1, -1, 0);
  apply(r[0], &v);
  assert_int_equal(gw_replica_capacity(r[0], now), 4);

  /* a's floor: every request goes to b, even when b is busy */
  v = judge(8, 0, -1, -1, 0);
  apply(r[0], &v);
  gw_sched_req q = {.model = "m", .prompt_tokens = 1000, .max_tokens = 10, .expected_out = 10};
  gw_sched_choice c[6];
  gw_sched_req qs[6] = {q, q, q, q, q, q};
  gw_sched_plan(r, 2, qs, 6, now, c);
  for (int i = 0; i < 6; i++) assert_int_equal(c[i].replica, 1);

  /* a hot by its clock (half): planned twice as long as the identical cool b */
  v = judge(90, 0, 30, 0.5, 0);
  apply(r[0], &v);
  assert_true(gw_replica_device_slowdown(r[0]) == 2.0);
  gw_sched_choice ca, cb;
  gw_replica *only_a[1] = {r[0]}, *only_b[1] = {r[1]};
  gw_sched_plan(only_a, 1, &q, 1, now, &ca);
  gw_sched_plan(only_b, 1, &q, 1, now, &cb);
  assert_true(ca.finish_s > cb.finish_s * 1.99 && ca.finish_s < cb.finish_s * 2.01);
  /* with both free, the cool one is chosen */
  gw_sched_plan(r, 2, &q, 1, now, &ca);
  assert_int_equal(ca.replica, 1);
  /* answers measured while hot take the slowdown's place */
  gw_replica_observe(r[0], 1000, 20000, 100, 20000);
  double s1 = gw_replica_device_slowdown(r[0]);
  assert_true(s1 < 2.0 && s1 > 1.0);
  for (int i = 0; i < 2; i++) gw_replica_observe(r[0], 1000, 20000, 100, 20000);
  assert_true(gw_replica_device_slowdown(r[0]) == 1.0);
  /* a fresh spell of heat, after cooling down, starts in full again */
  v = judge(90, 0, 30, 1, 0);
  apply(r[0], &v);
  assert_true(gw_replica_device_slowdown(r[0]) == 1.0);
  v = judge(90, 0, 50, 1, 0);
  apply(r[0], &v);
  assert_true(gw_replica_device_slowdown(r[0]) == 1.5);
  gw_replica_free(r[0]);
  gw_replica_free(r[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unknown_readings_do_nothing),
      cmocka_unit_test(test_battery),
      cmocka_unit_test(test_heat),
      cmocka_unit_test(test_plan_sees_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
