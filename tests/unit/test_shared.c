/* Unit tests for gateway/shared.c's reading and merging of what gateways share through
 * Redis, without a Redis: a heartbeat stored as its phone signed it reads back whole (its
 * body's newlines too) and still verifies; a damaged record is dropped; a relayed
 * heartbeat is applied only when newer than the phone's last one and within the relay's
 * age; another gateway's "down" takes a ready phone down for the cool-down with its
 * reason and is not published again, while this gateway's own messages, and one whose
 * named gateway is not its sender, are not applied; drains and stored speeds read back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "heartbeat.h"
#include "replica.h"
#include "shared.h"
#include "sign.h"

static const char BODY[] = "{\"id\":\"p1\",\n\"url\":\"http://127.0.0.1:9\"}\n";

static void test_a_stored_heartbeat_reads_back_as_signed(void **state) {
  (void)state;
  char sig[PR_SIGN_LEN + 1];
  assert_int_equal(pr_sign_heartbeat("fleet-secret", "1700000000000", BODY, strlen(BODY), sig), 0);
  gw_heartbeat_msg m = {.ts = "1700000000000", .tsv = INT64_C(1700000000000), .fleet_sig = sig,
                        .key_sig = "ed25519=AAAA", .body = BODY, .len = strlen(BODY)};
  size_t len;
  char *val = gw_shared_hb_encode(&m, &len);
  assert_non_null(val);
  gw_shared_hb hb;
  gw_heartbeat_msg back;
  assert_int_equal(gw_shared_hb_decode(val, len, &hb, &back), 0);
  assert_int_equal(back.tsv, m.tsv);
  assert_string_equal(back.ts, "1700000000000");
  assert_string_equal(back.fleet_sig, sig);
  assert_string_equal(back.key_sig, "ed25519=AAAA");
  assert_int_equal(back.len, strlen(BODY));
  assert_memory_equal(back.body, BODY, strlen(BODY));
  /* every gateway verifies it again, as the phone signed it */
  assert_int_equal(gw_heartbeat_verify("fleet-secret", back.ts, back.body, back.len, back.fleet_sig), 1);
  free(val);

  /* an enrolled phone's heartbeat has no fleet signature: it reads back as none */
  m.fleet_sig = NULL;
  val = gw_shared_hb_encode(&m, &len);
  assert_non_null(val);
  assert_int_equal(gw_shared_hb_decode(val, len, &hb, &back), 0);
  assert_null(back.fleet_sig);
  free(val);
}

static void test_a_damaged_heartbeat_record_is_dropped(void **state) {
  (void)state;
  gw_shared_hb hb;
  gw_heartbeat_msg m;
  static const char *const bad[] = {
      "",                                  /* nothing */
      "1700000000000\n-\n",                /* no key signature line */
      "17e11\n-\ned25519=AAAA\n{}",        /* not milliseconds */
      "0\n-\ned25519=AAAA\n{}",            /* not positive */
      "17000000000000000000000000\n-\ned25519=AAAA\n{}", /* a timestamp too long */
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(gw_shared_hb_decode(bad[i], strlen(bad[i]), &hb, &m), -1);
  /* a whole record whose fleet signature is longer than any: dropped, not copied */
  char longsig[120];
  memset(longsig, 'a', sizeof(longsig));
  memcpy(longsig, "1\n", 2);
  memcpy(longsig + sizeof(longsig) - 6, "\nk\n{}", 6);
  assert_int_equal(gw_shared_hb_decode(longsig, sizeof(longsig), &hb, &m), -1);
  assert_int_equal(gw_shared_hb_decode("5\n-\nk\n", 6, &hb, &m), 0); /* an empty body is a body */
  assert_int_equal(m.len, 0);
}

static void test_a_relayed_heartbeat_is_taken_when_newer_and_young_enough(void **state) {
  (void)state;
  gw_config c;
  memset(&c, 0, sizeof(c));
  c.heartbeat_timeout_s = 15; /* the relay keeps one 150 s */
  c.heartbeat_max_skew_s = 30;
  const int64_t now = INT64_C(1700000000000);
  assert_int_equal(gw_shared_hb_fresh(&c, 0, now - 1000, now), 1);
  assert_int_equal(gw_shared_hb_fresh(&c, now - 1000, now - 1000, now), 0); /* seen */
  assert_int_equal(gw_shared_hb_fresh(&c, now - 500, now - 1000, now), 0);  /* older */
  assert_int_equal(gw_shared_hb_fresh(&c, now - 2000, now - 1000, now), 1);
  assert_int_equal(gw_shared_hb_fresh(&c, 0, now - 150000, now), 1);
  assert_int_equal(gw_shared_hb_fresh(&c, 0, now - 150001, now), 0); /* older than kept */
  assert_int_equal(gw_shared_hb_fresh(&c, 0, now + 30000, now), 1);
  assert_int_equal(gw_shared_hb_fresh(&c, 0, now + 30001, now), 0);  /* from the future */
}

static void test_another_gateways_down_takes_a_ready_phone_down(void **state) {
  (void)state;
  gw_shared_msg sm;
  assert_int_equal(gw_shared_read_state("state p1 down g2 health check failed 3 times: x", "g1", "g2", &sm), 1);
  assert_string_equal(sm.id, "p1");
  assert_string_equal(sm.from, "g2");
  assert_string_equal(sm.reason, "health check failed 3 times: x");
  /* our own message back, a state other than down, a malformed one: nothing */
  assert_int_equal(gw_shared_read_state("state p1 down g1 x", "g1", "g1", &sm), 0);
  assert_int_equal(gw_shared_read_state("state p1 ready g2 x", "g1", "g2", &sm), 0);
  assert_int_equal(gw_shared_read_state("state p1", "g1", "g2", &sm), 0);
  /* a gateway speaking for another: refused */
  assert_int_equal(gw_shared_read_state("state p1 down g3 x", "g1", "g2", &sm), -1);

  gw_config c;
  memset(&c, 0, sizeof(c));
  c.cooldown_s = 10;
  char *models[] = {"m"};
  gw_replica *r = gw_replica_new("p1", "http://127.0.0.1:1", NULL, models, 1, 2, 0, 100, 10, 0);
  assert_non_null(r);
  gw_replica_set_state(r, GW_REPLICA_READY, 1000, "test");
  assert_int_equal(gw_shared_read_state("state p1 down g2 no answer", "g1", "g2", &sm), 1);
  assert_int_equal(gw_shared_take_down(&c, r, &sm, 50000), 1);
  assert_int_equal(r->state, GW_REPLICA_DOWN);
  assert_string_equal(r->state_reason, "gateway g2: no answer");
  assert_int_equal(r->down_until_ms, 60000);
  assert_int_equal(r->state_remote, 1); /* not published again by this gateway */
  /* already down: nothing changes */
  assert_int_equal(gw_shared_read_state("state p1 down g3 later", "g1", "g3", &sm), 1);
  assert_int_equal(gw_shared_take_down(&c, r, &sm, 55000), 0);
  assert_string_equal(r->state_reason, "gateway g2: no answer");
  assert_int_equal(gw_shared_take_down(&c, NULL, &sm, 55000), 0);
  gw_replica_free(r);
}

static void test_drains_and_speeds_read_back(void **state) {
  (void)state;
  gw_shared_msg sm;
  assert_int_equal(gw_shared_read_drain("drain p1 on g2", "g1", "g2", &sm), 1);
  assert_true(sm.on);
  assert_string_equal(sm.id, "p1");
  assert_int_equal(gw_shared_read_drain("drain p1 off g2", "g1", "g2", &sm), 1);
  assert_false(sm.on);
  assert_int_equal(gw_shared_read_drain("drain p1 on g1", "g1", "g1", &sm), 0);
  assert_int_equal(gw_shared_read_drain("drain p1 maybe g2", "g1", "g2", &sm), -1);
  assert_int_equal(gw_shared_read_drain("drain p1 on g3", "g1", "g2", &sm), -1);

  double pre = 0, dec = 0;
  assert_int_equal(gw_shared_read_rates("812.500 14.250", 14, &pre, &dec), 0);
  assert_true(pre == 812.5 && dec == 14.25);
  assert_int_equal(gw_shared_read_rates("812.500", 7, &pre, &dec), -1);
  char big[100];
  memset(big, '1', sizeof(big));
  assert_int_equal(gw_shared_read_rates(big, sizeof(big), &pre, &dec), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_stored_heartbeat_reads_back_as_signed),
      cmocka_unit_test(test_a_damaged_heartbeat_record_is_dropped),
      cmocka_unit_test(test_a_relayed_heartbeat_is_taken_when_newer_and_young_enough),
      cmocka_unit_test(test_another_gateways_down_takes_a_ready_phone_down),
      cmocka_unit_test(test_drains_and_speeds_read_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
