/* Unit tests for the flag word of replica.h: why a phone is held back from new work.
 * Each reason alone holds a phone back, is the only reason given and is named; with none
 * the phone takes work; the kept reasons change only through gw_replica_held_set; the
 * status page's state and reason are drawn from them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "replica.h"

#define NOW 1000000

static gw_replica *phone(void) {
  char *models[] = {"m"};
  gw_replica *r = gw_replica_new("p1", "http://127.0.0.1:1", NULL, models, 1, 2, 4096, 100, 10, 0);
  assert_non_null(r);
  return r;
}

/* r is held back by `bit` alone, named `name`, and may use `cap` slots */
static void held_by(const gw_replica *r, uint32_t bit, const char *name, int cap) {
  uint32_t why = 0xffffffffu;
  assert_int_equal(gw_replica_admits(r, NOW, 0, &why), cap);
  assert_int_equal(why, bit);
  assert_int_equal(gw_replica_held_why(r, NOW), bit);
  assert_string_equal(gw_replica_held_name(bit), name);
  char buf[64];
  assert_string_equal(gw_replica_held_names(why, buf, sizeof(buf)), name);
}

static void test_none_takes_work(void **state) {
  (void)state;
  gw_replica *r = phone();
  uint32_t why = 0xffffffffu;
  assert_int_equal(gw_replica_admits(r, NOW, 0, &why), 2);
  assert_int_equal(why, 0);
  assert_int_equal(r->held, 0);
  assert_false(gw_replica_draining(r));
  assert_string_equal(gw_replica_display_state(r), "ready");
  char buf[16];
  assert_string_equal(gw_replica_held_names(0, buf, sizeof(buf)), "");
  /* one request of two slots: still takes one more */
  uint64_t l = gw_replica_acquire(r, NOW, 1000, NULL);
  assert_int_equal(gw_replica_held_why(r, NOW), 0);
  gw_replica_release(r, l);
  gw_replica_free(r);
}

static void test_each_kept_reason_alone(void **state) {
  (void)state;
  static const struct {
    uint32_t bit;
    const char *name, *shown, *reason;
  } kept[] = {
      {GW_HELD_REMOVED, "removed", "draining", "removed from the configuration: finishes what runs, then leaves"},
      {GW_HELD_DRAIN_CONF, "drained_config", "draining", "\"drain\": true in its configuration"},
      {GW_HELD_DRAIN_ADMIN, "drained_admin", "draining", "drained by an admin"},
      {GW_HELD_DRAIN_AGENT, "drained_agent", "draining", "its agent reports draining"},
      {GW_HELD_PLACING, "placing", "draining",
       "switching models (placement): finishes what runs, then loads another"},
      {GW_HELD_QUARANTINED, "quarantined", "quarantined",
       "quarantined: its answers disagreed with other phones' (an operator releases it)"},
      {GW_HELD_CHECK, "held_for_check", "ready", ""},
  };
  for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
    gw_replica *r = phone();
    assert_int_equal(gw_replica_held_set(r, kept[i].bit, 1), 1);
    assert_int_equal(gw_replica_held_set(r, kept[i].bit, 1), 0); /* no change */
    assert_int_equal(r->held, kept[i].bit);
    held_by(r, kept[i].bit, kept[i].name, 0);
    assert_int_equal(gw_replica_capacity(r, NOW), 0);
    assert_int_equal(gw_replica_draining(r), (kept[i].bit & GW_HELD_DRAINS) != 0);
    assert_string_equal(gw_replica_display_state(r), kept[i].shown);
    assert_string_equal(gw_replica_reason(r), kept[i].reason);
    /* a check's shadow requests pass a hold for the check, and only that */
    assert_int_equal(gw_replica_capacity_checked(r, NOW), kept[i].bit == GW_HELD_CHECK ? 2 : 0);
    uint32_t why = 0;
    gw_replica_admits(r, NOW, GW_HELD_CHECK, &why);
    assert_int_equal(why, kept[i].bit == GW_HELD_CHECK ? 0 : kept[i].bit);
    assert_int_equal(gw_replica_held_set(r, kept[i].bit, 0), 1);
    assert_int_equal(gw_replica_held_why(r, NOW), 0);
    assert_int_equal(gw_replica_capacity(r, NOW), 2);
    gw_replica_free(r);
  }
}

static void test_health_states(void **state) {
  (void)state;
  gw_replica *r = phone();
  gw_replica_set_state(r, GW_REPLICA_DOWN, NOW, "probe failed");
  held_by(r, GW_HELD_DOWN, "down", 0);
  assert_string_equal(gw_replica_display_state(r), "down");
  gw_replica_set_state(r, GW_REPLICA_LOADING, NOW, "loading model");
  held_by(r, GW_HELD_LOADING, "loading", 0);
  assert_string_equal(gw_replica_reason(r), "loading model");
  /* a drained phone that is down gives both */
  gw_replica_set_state(r, GW_REPLICA_DOWN, NOW, "probe failed");
  gw_replica_held_set(r, GW_HELD_DRAIN_ADMIN, 1);
  assert_int_equal(gw_replica_held_why(r, NOW), GW_HELD_DOWN | GW_HELD_DRAIN_ADMIN);
  char buf[64];
  assert_string_equal(gw_replica_held_names(GW_HELD_DOWN | GW_HELD_DRAIN_ADMIN, buf, sizeof(buf)),
                      "down, drained_admin");
  gw_replica_set_state(r, GW_REPLICA_READY, NOW, "");
  gw_replica_held_set(r, GW_HELD_DRAIN_ADMIN, 0);
  assert_int_equal(gw_replica_held_why(r, NOW), 0);
  gw_replica_free(r);
}

/* the limits hold it back only once its requests in flight reach them */
static void test_limits(void **state) {
  (void)state;
  gw_replica *r = phone();
  /* probation: one slot, free -- takes work; in use -- held back by probation alone */
  gw_replica_held_set(r, GW_HELD_PROBATION, 1);
  assert_int_equal(gw_replica_held_why(r, NOW), 0);
  assert_int_equal(gw_replica_capacity(r, NOW), 1);
  uint64_t l = gw_replica_acquire(r, NOW, 1000, NULL);
  held_by(r, GW_HELD_PROBATION, "probation", 1);
  /* a success ends it: the second slot takes work */
  assert_int_equal(gw_replica_success(r, NOW), 1);
  assert_int_equal(r->held, 0);
  assert_int_equal(gw_replica_held_why(r, NOW), 0);
  gw_replica_release(r, l);
  gw_replica_free(r);

  /* its share cap (a phone without a record) */
  r = phone();
  r->sched.trust_capped = 1;
  r->sched.trust_cap = 0;
  held_by(r, GW_HELD_SHARE, "share_cap", 0);
  r->sched.trust_cap = 1;
  assert_int_equal(gw_replica_held_why(r, NOW), 0);
  gw_replica_free(r);

  /* its readings (a low battery: no new work) */
  r = phone();
  r->dev.cap = 0;
  held_by(r, GW_HELD_DEVICE, "device", 0);
  gw_replica_free(r);

  /* other gateways' requests, while Redis's word holds */
  r = phone();
  r->shared.remote_busy = 2;
  r->shared.remote_busy_until = NOW + 1;
  held_by(r, GW_HELD_REMOTE, "other_gateways", 0);
  r->shared.remote_busy_until = NOW;
  assert_int_equal(gw_replica_held_why(r, NOW), 0);
  gw_replica_free(r);

  /* every slot in use */
  r = phone();
  gw_replica_acquire(r, NOW, 1000, NULL);
  gw_replica_acquire(r, NOW, 1000, NULL);
  held_by(r, GW_HELD_BUSY, "busy", 2);
  gw_replica_free(r);
}

static void test_names(void **state) {
  (void)state;
  for (int i = 0; i < GW_HELD_N; i++) {
    const char *n = gw_replica_held_name(1u << i);
    assert_non_null(n);
    for (int j = 0; j < i; j++) assert_string_not_equal(n, gw_replica_held_name(1u << j));
  }
  assert_null(gw_replica_held_name(0));
  assert_null(gw_replica_held_name(GW_HELD_DOWN | GW_HELD_BUSY));
  assert_null(gw_replica_held_name(1u << GW_HELD_N));
  /* a buffer too short keeps whole names only */
  char buf[12];
  assert_string_equal(gw_replica_held_names(GW_HELD_DOWN | GW_HELD_QUARANTINED, buf, sizeof(buf)), "down");
  /* only the kept reasons are kept */
  gw_replica *r = phone();
  assert_int_equal(gw_replica_held_set(r, GW_HELD_DOWN | GW_HELD_BUSY, 1), 0);
  assert_int_equal(r->held, 0);
  gw_replica_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_none_takes_work), cmocka_unit_test(test_each_kept_reason_alone),
      cmocka_unit_test(test_health_states), cmocka_unit_test(test_limits), cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
