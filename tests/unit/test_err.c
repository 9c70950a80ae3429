/* Unit tests for proto/err.c: every code has a name and a message, and unknown codes
 * still give something printable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "err.h"

static void test_own_codes(void **state) {
  static const struct {
    int code;
    const char *name;
  } want[] = {
    {PR_ETOOLARGE, "ETOOLARGE"}, {PR_EPARSE, "EPARSE"},     {PR_ETYPE, "ETYPE"},
    {PR_EMISSING, "EMISSING"},   {PR_ERANGE, "ERANGE"},     {PR_ECLOSED, "ECLOSED"},
    {PR_ECURL, "ECURL"},         {PR_ETLS, "ETLS"},         {PR_EUNKNOWN, "EUNKNOWN"},
    {PR_EBUSY, "EBUSY"},
  };
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    assert_string_equal(pr_errname(want[i].code), want[i].name);
    const char *msg = pr_strerror(want[i].code);
    assert_non_null(msg);
    assert_true(strlen(msg) > 0);
    assert_string_not_equal(msg, "unknown error");
  }
  assert_string_equal(pr_strerror(PR_ETOOLARGE), "too large");
}

static void test_errno_codes(void **state) {
  assert_string_equal(pr_errname(-ENOMEM), "ENOMEM");
  assert_string_equal(pr_errname(-EINVAL), "EINVAL");
  assert_string_equal(pr_errname(-ECONNREFUSED), "ECONNREFUSED");
  assert_string_equal(pr_errname(-ETIMEDOUT), "ETIMEDOUT");
  assert_string_equal(pr_strerror(-ENOMEM), "out of memory");
  /* errno values outside the table fall back to strerror. */
  assert_string_equal(pr_errname(-ENOTDIR), "EOTHER");
  assert_string_equal(pr_strerror(-ENOTDIR), strerror(ENOTDIR));
}

static void test_zero_and_unknown(void **state) {
  assert_string_equal(pr_errname(0), "OK");
  assert_string_equal(pr_strerror(0), "success");
  assert_string_equal(pr_errname(-4999), "EOTHER");
  assert_string_equal(pr_strerror(-4999), "unknown error");
  assert_non_null(pr_errname(12345));
  assert_non_null(pr_strerror(12345));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_own_codes),
    cmocka_unit_test(test_errno_codes),
    cmocka_unit_test(test_zero_and_unknown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
