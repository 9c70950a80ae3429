/* Unit tests for gateway/registry.c's fleet events: a replica added, a state change
 * (published once, and not at all when nothing changed), and a removed replica that
 * leaves once idle reach every subscriber in order, each with its own user data and only
 * the kinds of its mask, with injected time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "gw.h"
#include "registry.h"
#include "replica.h"

static char seen[2][1024];

static void record(int who, const gw_fleet_event *ev) {
  static const char *const kinds[] = {"state", "drain", "rates", "progress", "added", "removed", "models", "sent"};
  char one[160];
  if (ev->kind == GW_FLEET_STATE)
    snprintf(one, sizeof(one), "%s %s %s>%s;", kinds[ev->kind], ev->r->id, ev->from ? ev->from : "-", ev->to);
  else
    snprintf(one, sizeof(one), "%s %s;", kinds[ev->kind], ev->r->id);
  strncat(seen[who], one, sizeof(seen[who]) - strlen(seen[who]) - 1);
}

/* ud: which record it writes */
static void sub(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)gw;
  record(*(const int *)ud, ev);
}

static void test_fleet_events_reach_every_subscriber(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  loop.time = 5000;
  gw_config conf;
  memset(&conf, 0, sizeof(conf));
  conf.heartbeat_timeout_s = 15;
  gw_server gw;
  memset(&gw, 0, sizeof(gw));
  gw.loop = &loop;
  gw.conf = &conf;
  memset(seen, 0, sizeof(seen));
  static const int who[2] = {0, 1};
  assert_int_equal(gw_fleet_subscribe(&gw, GW_FLEET_ALL, sub, (void *)&who[0]), 0);
  /* the second asks only for state changes */
  assert_int_equal(gw_fleet_subscribe(&gw, GW_FLEET_MASK(GW_FLEET_STATE), sub, (void *)&who[1]), 0);
  char *models[] = {"m"};
  gw_replica *r = gw_replica_new("p1", "http://127.0.0.1:1", NULL, models, 1, 2, 0, 100, 10, 0);
  assert_non_null(r);
  assert_int_equal(gw_registry_add(&gw, r), 0);
  assert_ptr_equal(gw_registry_find(&gw, "p1"), r);

  const char *old = gw_replica_display_state(r);
  gw_replica_set_state(r, GW_REPLICA_DOWN, loop.time, "test");
  gw_registry_event(&gw, r, old);
  old = gw_replica_display_state(r);
  gw_registry_event(&gw, r, old); /* nothing changed: nothing published */
  gw_replica_set_state(r, GW_REPLICA_READY, loop.time, "back");
  gw_registry_event(&gw, r, old);

  /* removed from the config: it leaves once idle, at the next sweep */
  gw_replica_held_set(r, GW_HELD_REMOVED, 1);
  r->inflight = 1;
  gw_registry_sweep(&gw, loop.time);
  assert_int_equal(gw.n_replicas, 1);
  r->inflight = 0;
  gw_registry_sweep(&gw, loop.time);
  assert_int_equal(gw.n_replicas, 0);
  assert_null(gw_registry_find(&gw, "p1"));

  assert_string_equal(seen[0], "added p1;state p1 ready>down;state p1 down>ready;removed p1;");
  assert_string_equal(seen[1], "state p1 ready>down;state p1 down>ready;");
  /* more subscribers than there is room for are refused, not dropped silently */
  for (int i = 2; i < GW_FLEET_SUBSCRIBERS; i++)
    assert_int_equal(gw_fleet_subscribe(&gw, GW_FLEET_ALL, sub, (void *)&who[0]), 0);
  assert_int_equal(gw_fleet_subscribe(&gw, GW_FLEET_ALL, sub, (void *)&who[0]), -ENOSPC);
  pr_idmap_clear(&gw.reg.ids);
  free(gw.replicas);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Ids are found by their hash: every one of a large fleet, none that is not there, and
 * none once it left the registry (the others still). */
static void test_replicas_are_found_by_id(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  gw_config conf;
  memset(&conf, 0, sizeof(conf));
  conf.heartbeat_timeout_s = 15;
  gw_server gw;
  memset(&gw, 0, sizeof(gw));
  gw.loop = &loop;
  gw.conf = &conf;
  char *models[] = {"m"};
  enum { N = 5000 };
  for (int i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof(id), "phone-%05d", i);
    gw_replica *r = gw_replica_new(id, "http://127.0.0.1:1", NULL, models, 1, 1, 0, 100, 10, 0);
    assert_non_null(r);
    assert_int_equal(gw_registry_add(&gw, r), 0);
  }
  for (int i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof(id), "phone-%05d", i);
    gw_replica *r = gw_registry_find(&gw, id);
    assert_non_null(r);
    assert_string_equal(r->id, id);
    if (i % 2) gw_replica_held_set(r, GW_HELD_REMOVED, 1); /* every other one leaves at the next sweep */
  }
  assert_null(gw_registry_find(&gw, "phone-"));
  assert_null(gw_registry_find(&gw, "phone-05000"));
  gw_registry_sweep(&gw, 1000);
  assert_int_equal(gw.n_replicas, N / 2);
  for (int i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof(id), "phone-%05d", i);
    gw_replica *r = gw_registry_find(&gw, id);
    if (i % 2) assert_null(r);
    else assert_true(r && strcmp(r->id, id) == 0);
  }
  pr_idmap_clear(&gw.reg.ids);
  for (size_t i = 0; i < gw.n_replicas; i++) gw_replica_free(gw.replicas[i]);
  free(gw.replicas);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_fleet_events_reach_every_subscriber),
    cmocka_unit_test(test_replicas_are_found_by_id),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
