/* Unit tests for gateway/seal.c: sealed messages open only with the same key, for the
 * same channel or key, within the window, once (pub/sub) and never from ourselves; the
 * MAC is checked against an independent HMAC. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/hmac.h>

#include "seal.h"

#define KEY "0123456789abcdef0123456789abcdef"
#define CHAN "fleetgate:events"
#define NOW INT64_C(1764600000000)

static char *wrap(gw_seal *s, const char *ctx, int64_t now, const char *payload, size_t *len) {
  char *out = NULL;
  assert_int_equal(gw_seal_wrap(s, ctx, now, payload, strlen(payload), &out, len), 0);
  return out;
}

static gw_seal_verdict open_(gw_seal *s, const char *ctx, int64_t now, int once, const char *m, size_t n,
                             char *payload_out) {
  const char *p;
  size_t pl;
  char from[GW_SEAL_MAX_ID];
  gw_seal_verdict v = gw_seal_open(s, ctx, now, once, 60000, m, n, &p, &pl, from);
  if (payload_out) {
    payload_out[0] = '\0';
    if (p) snprintf(payload_out, 256, "%.*s|%s", (int)pl, p, from);
  }
  return v;
}

static void test_round_trip_and_independent_mac(void **state) {
  (void)state;
  gw_seal a, b;
  assert_int_equal(gw_seal_init(&a, KEY, "gw0", 30), 0);
  assert_int_equal(gw_seal_init(&b, KEY, "gw1", 30), 0);
  size_t n;
  char *m = wrap(&a, CHAN, NOW, "drain p0 on gw0", &n);
  char got[256];
  assert_int_equal(open_(&b, CHAN, NOW + 5, 1, m, n, got), GW_SEAL_OK);
  assert_string_equal(got, "drain p0 on gw0|gw0");
  /* the head is "fg1 gw0 SEQ TS MAC\n"; the MAC is HMAC(key, "fg1 CHAN gw0 SEQ TS\n" payload) */
  unsigned long long seq;
  long long ts;
  char hex[65];
  assert_int_equal(sscanf(m, "fg1 gw0 %llu %lld %64s", &seq, &ts, hex), 3);
  assert_true(seq >= (unsigned long long)NOW * 1000 && ts == NOW);
  char signed_text[256];
  int sl = snprintf(signed_text, sizeof(signed_text), "fg1 %s gw0 %llu %lld\ndrain p0 on gw0", CHAN, seq, ts);
  unsigned char mac[32];
  unsigned int ml = 0;
  HMAC(EVP_sha256(), KEY, (int)strlen(KEY), (unsigned char *)signed_text, (size_t)sl, mac, &ml);
  char want[65];
  for (int i = 0; i < 32; i++) snprintf(want + 2 * i, 3, "%02x", mac[i]);
  assert_string_equal(hex, want);
  /* the same message again is a replay; the sender's own echo is quiet */
  assert_int_equal(open_(&b, CHAN, NOW + 6, 1, m, n, NULL), GW_SEAL_REPLAY);
  assert_int_equal(open_(&a, CHAN, NOW + 6, 1, m, n, NULL), GW_SEAL_SELF);
  /* newer ones go on being accepted, even in the same millisecond */
  free(m);
  for (int i = 0; i < 3; i++) {
    m = wrap(&a, CHAN, NOW, "hb p1", &n);
    assert_int_equal(open_(&b, CHAN, NOW, 1, m, n, NULL), GW_SEAL_OK);
    free(m);
  }
  gw_seal_free(&a);
  gw_seal_free(&b);
}

static void test_what_is_refused(void **state) {
  (void)state;
  gw_seal a, b, other;
  assert_int_equal(gw_seal_init(&a, KEY, "gw0", 30), 0);
  assert_int_equal(gw_seal_init(&b, KEY, "gw1", 30), 0);
  assert_int_equal(gw_seal_init(&other, "another-key-another-key-another-key", "gw9", 30), 0);
  size_t n;
  char *m = wrap(&a, CHAN, NOW, "state p0 down gw0 timeout", &n);
  /* unsealed, truncated, or garbage */
  static const char plain[] = "drain p0 on gw0";
  assert_int_equal(open_(&b, CHAN, NOW, 1, plain, sizeof(plain) - 1, NULL), GW_SEAL_FORMAT);
  assert_int_equal(open_(&b, CHAN, NOW, 1, m, 20, NULL), GW_SEAL_FORMAT);
  assert_int_equal(open_(&b, CHAN, NOW, 1, "fg1 gw0 1 2 zz\nx", 16, NULL), GW_SEAL_FORMAT);
  assert_int_equal(open_(&b, CHAN, NOW, 1, "", 0, NULL), GW_SEAL_FORMAT);
  /* another channel or key, another key, a changed byte */
  assert_int_equal(open_(&b, "fleetgate:hb:p0", NOW, 0, m, n, NULL), GW_SEAL_MAC);
  assert_int_equal(open_(&other, CHAN, NOW, 1, m, n, NULL), GW_SEAL_MAC);
  m[n - 1] ^= 1;
  assert_int_equal(open_(&b, CHAN, NOW, 1, m, n, NULL), GW_SEAL_MAC);
  m[n - 1] ^= 1;
  /* a forged sender name breaks the MAC too */
  char *forged = strdup(m);
  memcpy(forged + 4, "gw2", 3);
  assert_int_equal(open_(&b, CHAN, NOW, 1, forged, n, NULL), GW_SEAL_MAC);
  free(forged);
  /* outside the window, either way (pub/sub) */
  assert_int_equal(open_(&b, CHAN, NOW + 31000, 1, m, n, NULL), GW_SEAL_STALE);
  assert_int_equal(open_(&b, CHAN, NOW - 31000, 1, m, n, NULL), GW_SEAL_STALE);
  assert_int_equal(open_(&b, CHAN, NOW + 29000, 1, m, n, NULL), GW_SEAL_OK);
  /* a stored value may be older (max age 60 s here) and is read again and again */
  free(m);
  m = wrap(&a, "fleetgate:hb:p0", NOW, "123\n{}", &n);
  assert_int_equal(open_(&b, "fleetgate:hb:p0", NOW + 50000, 0, m, n, NULL), GW_SEAL_OK);
  assert_int_equal(open_(&b, "fleetgate:hb:p0", NOW + 50000, 0, m, n, NULL), GW_SEAL_OK);
  assert_int_equal(open_(&b, "fleetgate:hb:p0", NOW + 61000, 0, m, n, NULL), GW_SEAL_STALE);
  /* our own stored values are ours to read again (a gateway restarted with its id) */
  assert_int_equal(open_(&a, "fleetgate:hb:p0", NOW + 1000, 0, m, n, NULL), GW_SEAL_OK);
  free(m);
  /* a restarted sender goes on above its old sequence numbers */
  gw_seal_free(&a);
  assert_int_equal(gw_seal_init(&a, KEY, "gw0", 30), 0);
  m = wrap(&a, CHAN, NOW + 1, "hb p2", &n);
  assert_int_equal(open_(&b, CHAN, NOW + 1, 1, m, n, NULL), GW_SEAL_OK);
  free(m);
  gw_seal_free(&a);
  gw_seal_free(&b);
  gw_seal_free(&other);
  assert_int_equal(gw_seal_init(&a, KEY, "gw 0", 30), -EINVAL);
  assert_int_equal(gw_seal_init(&a, "", "gw0", 30), -EINVAL);
  assert_string_equal(gw_seal_verdict_name(GW_SEAL_REPLAY), "replay");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_round_trip_and_independent_mac),
    cmocka_unit_test(test_what_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
