/* Unit tests for gateway/heartbeat.c's decisions with injected time: a heartbeat signed
 * with the fleet secret passes and one signed otherwise (another secret, another body or
 * timestamp, a cut or malformed signature) is refused; a timestamp that is not
 * milliseconds, or is further than fleet.max_skew_s from the gateway's clock either way,
 * is refused; a heartbeat not newer than the last one accepted is a replay; and a phone
 * sending heartbeats faster than a quarter of its interval (at most a second apart) is
 * refused 429, while one relayed by another gateway is not paced here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "heartbeat.h"
#include "replica.h"
#include "sign.h"

static const char BODY[] = "{\"id\":\"p1\",\"url\":\"http://127.0.0.1:9\"}";

static void test_only_the_fleet_secrets_signature_passes(void **state) {
  (void)state;
  char sig[128];
  assert_int_equal(pr_sign_heartbeat("fleet-secret", "1700000000000", BODY, strlen(BODY), sig), 0);
  assert_int_equal(gw_heartbeat_verify("fleet-secret", "1700000000000", BODY, strlen(BODY), sig), 1);
  /* another secret, another timestamp, another body */
  assert_int_equal(gw_heartbeat_verify("other-secret", "1700000000000", BODY, strlen(BODY), sig), 0);
  assert_int_equal(gw_heartbeat_verify("fleet-secret", "1700000000001", BODY, strlen(BODY), sig), 0);
  assert_int_equal(gw_heartbeat_verify("fleet-secret", "1700000000000", BODY, strlen(BODY) - 1, sig), 0);
  /* any case of hex is the same signature; a cut or prefixless one is not */
  char upper[128];
  snprintf(upper, sizeof(upper), "sha256=");
  for (size_t i = 7; sig[i]; i++) upper[i] = (char)(sig[i] >= 'a' && sig[i] <= 'f' ? sig[i] - 32 : sig[i]);
  upper[strlen(sig)] = '\0';
  assert_int_equal(gw_heartbeat_verify("fleet-secret", "1700000000000", BODY, strlen(BODY), upper), 1);
  char cut[128];
  snprintf(cut, sizeof(cut), "%.*s", (int)strlen(sig) - 1, sig);
  assert_int_equal(gw_heartbeat_verify("fleet-secret", "1700000000000", BODY, strlen(BODY), cut), 0);
  assert_int_equal(gw_heartbeat_verify("fleet-secret", "1700000000000", BODY, strlen(BODY), sig + 7), 0);
  assert_int_equal(gw_heartbeat_verify("fleet-secret", "1700000000000", BODY, strlen(BODY), ""), 0);
}

static void test_a_timestamp_outside_the_window_is_refused(void **state) {
  (void)state;
  const int64_t now = INT64_C(1700000000000);
  int64_t tsv = 0;
  assert_null(gw_heartbeat_check_ts("1700000029000", now, 30, &tsv));
  assert_int_equal(tsv, INT64_C(1700000029000));
  assert_null(gw_heartbeat_check_ts("1699999970000", now, 30, &tsv)); /* 30 s behind: the edge */
  assert_string_equal(gw_heartbeat_check_ts("1699999969999", now, 30, &tsv), "stale_timestamp");
  assert_string_equal(gw_heartbeat_check_ts("1700000030001", now, 30, &tsv), "stale_timestamp");
  assert_string_equal(gw_heartbeat_check_ts("1700000000", now, 30, &tsv), "stale_timestamp"); /* seconds */
  assert_string_equal(gw_heartbeat_check_ts("", now, 30, &tsv), "invalid_timestamp");
  assert_string_equal(gw_heartbeat_check_ts("17e11", now, 30, &tsv), "invalid_timestamp");
  assert_string_equal(gw_heartbeat_check_ts("-5", now, 30, &tsv), "invalid_timestamp");
  assert_string_equal(gw_heartbeat_check_ts("1700000000000 ", now, 30, &tsv), "invalid_timestamp");
}

static gw_replica *heard(uint64_t at, int64_t tsv) {
  char *models[] = {"m"};
  gw_replica *r = gw_replica_new("p1", "http://127.0.0.1:1", NULL, models, 1, 2, 0, 100, 10, 0);
  assert_non_null(r);
  r->ident.from_heartbeat = 1;
  r->report.last_heartbeat_ms = at;
  r->report.last_heartbeat_ts = tsv;
  return r;
}

static void test_a_replayed_heartbeat_is_refused(void **state) {
  (void)state;
  gw_config c;
  memset(&c, 0, sizeof(c));
  c.heartbeat_interval_s = 5;
  gw_replica *r = heard(100000, 5000);
  assert_int_equal(gw_heartbeat_pace(&c, r, 5000, 200000, 0), 401);
  assert_int_equal(gw_heartbeat_pace(&c, r, 4999, 200000, 0), 401);
  assert_int_equal(gw_heartbeat_pace(&c, r, 5000, 200000, 1), 401); /* relayed too */
  assert_int_equal(gw_heartbeat_pace(&c, r, 5001, 200000, 0), 0);
  /* a phone the registry does not hold has nothing to replay */
  assert_int_equal(gw_heartbeat_pace(&c, NULL, 1, 200000, 0), 0);
  gw_replica_free(r);
}

static void test_heartbeats_faster_than_a_quarter_interval_are_refused(void **state) {
  (void)state;
  gw_config c;
  memset(&c, 0, sizeof(c));
  c.heartbeat_interval_s = 2; /* a quarter: 500 ms */
  gw_replica *r = heard(100000, 5000);
  assert_int_equal(gw_heartbeat_pace(&c, r, 5400, 100400, 0), 429);
  assert_int_equal(gw_heartbeat_pace(&c, r, 5499, 100499, 0), 429);
  assert_int_equal(gw_heartbeat_pace(&c, r, 5500, 100500, 0), 0);
  /* relayed by another gateway: that gateway paced it */
  assert_int_equal(gw_heartbeat_pace(&c, r, 5400, 100400, 1), 0);
  /* a long interval still lets one through each second */
  c.heartbeat_interval_s = 15;
  assert_int_equal(gw_heartbeat_pace(&c, r, 5900, 100900, 0), 429);
  assert_int_equal(gw_heartbeat_pace(&c, r, 6000, 101000, 0), 0);
  /* a phone from a file that never spoke by heartbeat is not paced */
  r->ident.from_heartbeat = 0;
  assert_int_equal(gw_heartbeat_pace(&c, r, 5100, 100100, 0), 0);
  gw_replica_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_only_the_fleet_secrets_signature_passes),
      cmocka_unit_test(test_a_timestamp_outside_the_window_is_refused),
      cmocka_unit_test(test_a_replayed_heartbeat_is_refused),
      cmocka_unit_test(test_heartbeats_faster_than_a_quarter_interval_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
