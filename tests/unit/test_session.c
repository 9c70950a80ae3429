/* gateway/session.c: admin session values are signed under the admin token, expire, and
 * are found among a browser's other cookies; anything altered is nobody's session. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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
  assert_int_equal(gw_session_valid(TOKEN, c, NOW, 60), 1);
  assert_int_equal(gw_session_valid(TOKEN, c, NOW + 59999, 60), 1);
  assert_int_equal(gw_session_valid(TOKEN, c, NOW + 60000, 60), 0); /* expired */
  /* alone in the header, and first */
  snprintf(c, sizeof(c), "%s=%s", GW_SESSION_COOKIE, v);
  assert_int_equal(gw_session_valid(TOKEN, c, NOW, 60), 1);
  /* sessions turned off, or shortened far below what this one claims */
  assert_int_equal(gw_session_valid(TOKEN, c, NOW, 0), 0);
  assert_int_equal(gw_session_valid(TOKEN, c, NOW - 3600 * 1000, 60), 0);
}

static void test_other_token_or_altered_value_is_refused(void **state) {
  (void)state;
  char v[GW_SESSION_MAX], c[256];
  assert_int_equal(gw_session_make(TOKEN, NOW, 60, v, sizeof(v)), 0);
  cookie_of(v, c, sizeof(c));
  assert_int_equal(gw_session_valid("another-admin-token-000", c, NOW, 60), 0);
  for (size_t i = 0; i < strlen(v); i++) {
    char w[GW_SESSION_MAX];
    memcpy(w, v, sizeof(w));
    w[i] = w[i] == '1' ? '2' : '1';
    cookie_of(w, c, sizeof(c));
    assert_int_equal(gw_session_valid(TOKEN, c, NOW, 60), 0);
  }
  assert_int_equal(gw_session_valid(TOKEN, NULL, NOW, 60), 0);
  assert_int_equal(gw_session_valid(TOKEN, "fleetgate_session=", NOW, 60), 0);
  assert_int_equal(gw_session_valid(TOKEN, "xfleetgate_session=abc", NOW, 60), 0);
  assert_int_equal(gw_session_make("", NOW, 60, v, sizeof(v)), -EINVAL);
  assert_int_equal(gw_session_make(TOKEN, NOW, 60, v, 20), -ENOSPC);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_made_value_is_valid_until_it_expires),
      cmocka_unit_test(test_other_token_or_altered_value_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
