/* gateway/session.c: admin session values are signed under the admin token, expire, and
 * are found among a browser's other cookies; anything altered is nobody's session; a
 * session ended (signed out) stays refused until it expires, in a bounded set. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "session.h"

static const char TOKEN[] = "admin-token-0123456789";
static const int64_t NOW = 1795976416000;

static void cookie_of(const char *v, char *out, size_t n) {
  snprintf(out, n, "theme=dark; %s=%s; other=1", GW_SESSION_COOKIE, v);
}

static void test_made_value_is_valid_until_it_expires(void **state) {
  (void)state;
  char v[GW_SESSION_MAX], c[256];
  assert_int_equal(gw_session_make(TOKEN, NOW, 60, v, sizeof(v)), 0);
  assert_null(strstr(v, TOKEN));
  cookie_of(v, c, sizeof(c));
  assert_int_equal(gw_session_valid(TOKEN, c, NOW, 60, NULL), 1);
  assert_int_equal(gw_session_valid(TOKEN, c, NOW + 59999, 60, NULL), 1);
  assert_int_equal(gw_session_valid(TOKEN, c, NOW + 60000, 60, NULL), 0); /* expired */
  /* alone in the header, and first */
  snprintf(c, sizeof(c), "%s=%s", GW_SESSION_COOKIE, v);
  assert_int_equal(gw_session_valid(TOKEN, c, NOW, 60, NULL), 1);
  /* sessions turned off, or shortened far below what this one claims */
  assert_int_equal(gw_session_valid(TOKEN, c, NOW, 0, NULL), 0);
  assert_int_equal(gw_session_valid(TOKEN, c, NOW - 3600 * 1000, 60, NULL), 0);
}

static void test_other_token_or_altered_value_is_refused(void **state) {
  (void)state;
  char v[GW_SESSION_MAX], c[256];
  assert_int_equal(gw_session_make(TOKEN, NOW, 60, v, sizeof(v)), 0);
  cookie_of(v, c, sizeof(c));
  assert_int_equal(gw_session_valid("another-admin-token-000", c, NOW, 60, NULL), 0);
  for (size_t i = 0; i < strlen(v); i++) {
    char w[GW_SESSION_MAX];
    memcpy(w, v, sizeof(w));
    w[i] = w[i] == '1' ? '2' : '1';
    cookie_of(w, c, sizeof(c));
    assert_int_equal(gw_session_valid(TOKEN, c, NOW, 60, NULL), 0);
  }
  assert_int_equal(gw_session_valid(TOKEN, NULL, NOW, 60, NULL), 0);
  assert_int_equal(gw_session_valid(TOKEN, "fleetgate_session=", NOW, 60, NULL), 0);
  assert_int_equal(gw_session_valid(TOKEN, "xfleetgate_session=abc", NOW, 60, NULL), 0);
  assert_int_equal(gw_session_make("", NOW, 60, v, sizeof(v)), -EINVAL);
  assert_int_equal(gw_session_make(TOKEN, NOW, 60, v, 20), -ENOSPC);
}

static void test_ended_session_is_refused_until_it_expires(void **state) {
  (void)state;
  gw_session_ended *e = calloc(1, sizeof(*e));
  assert_non_null(e);
  char v1[GW_SESSION_MAX], v2[GW_SESSION_MAX], c1[256], c2[256], nonce[GW_SESSION_NONCE + 1];
  assert_int_equal(gw_session_make(TOKEN, NOW, 60, v1, sizeof(v1)), 0);
  assert_int_equal(gw_session_make(TOKEN, NOW, 60, v2, sizeof(v2)), 0);
  cookie_of(v1, c1, sizeof(c1));
  cookie_of(v2, c2, sizeof(c2));
  int64_t exp;
  assert_int_equal(gw_session_id(c1, nonce, &exp), 0);
  assert_int_equal(exp, NOW + 60000);
  assert_int_equal(strlen(nonce), GW_SESSION_NONCE);
  assert_non_null(strstr(v1, nonce));
  assert_int_equal(gw_session_valid(TOKEN, c1, NOW, 60, e), 1);
  assert_int_equal(gw_session_end(e, nonce, exp, NOW + 10), 1);
  assert_int_equal(gw_session_end(e, nonce, exp, NOW + 10), 0); /* once */
  assert_int_equal(gw_session_valid(TOKEN, c1, NOW + 20, 60, e), 0);
  assert_int_equal(gw_session_valid(TOKEN, c1, NOW + 20, 60, NULL), 1); /* the value itself is sound */
  assert_int_equal(gw_session_valid(TOKEN, c2, NOW + 20, 60, e), 1);  /* the other browser's goes on */
  /* the same nonce with another expiry is another (forged) value: the MAC refuses it */
  assert_int_equal(gw_session_is_ended(e, nonce, exp + 1), 0);
  assert_int_equal(gw_session_end(e, "not-hex", exp, NOW), -EINVAL);
  assert_int_equal(gw_session_id("theme=dark", nonce, &exp), -1);
  /* expired entries leave the set at the next end */
  char other[GW_SESSION_NONCE + 1];
  memset(other, 'a', GW_SESSION_NONCE);
  other[GW_SESSION_NONCE] = '\0';
  assert_int_equal(gw_session_end(e, other, NOW + 120000, NOW + 60000), 1);
  assert_int_equal(e->n, 1);
  assert_int_equal(gw_session_end(e, other, NOW + 500, NOW + 60000), 0); /* expired already */
  free(e);
}

/* More sessions ended than the set holds: the one expiring first leaves and the floor
 * rises to its expiry, so no ended session is ever valid again; the set stays bounded. */
static void test_ended_set_is_bounded(void **state) {
  (void)state;
  gw_session_ended *e = calloc(1, sizeof(*e));
  assert_non_null(e);
  char nonce[GW_SESSION_NONCE + 1];
  for (int i = 0; i < GW_SESSION_ENDED_MAX + 10; i++) {
    snprintf(nonce, sizeof(nonce), "%032x", i);
    assert_int_equal(gw_session_end(e, nonce, NOW + 1000 + i, NOW), 1);
    assert_true(e->n <= GW_SESSION_ENDED_MAX);
  }
  for (int i = 0; i < GW_SESSION_ENDED_MAX + 10; i++) {
    snprintf(nonce, sizeof(nonce), "%032x", i);
    assert_int_equal(gw_session_is_ended(e, nonce, NOW + 1000 + i), 1);
  }
  assert_int_equal(e->floor_ms, NOW + 1000 + 9);
  assert_int_equal(e->n, GW_SESSION_ENDED_MAX);
  /* a session made later, expiring after the floor, is not touched */
  snprintf(nonce, sizeof(nonce), "%032x", 99999);
  assert_int_equal(gw_session_is_ended(e, nonce, NOW + 60000), 0);
  free(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_made_value_is_valid_until_it_expires),
      cmocka_unit_test(test_other_token_or_altered_value_is_refused),
      cmocka_unit_test(test_ended_session_is_refused_until_it_expires),
      cmocka_unit_test(test_ended_set_is_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
