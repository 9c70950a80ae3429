/* Unit tests for agent/faults.c: a fault plan's windows, and a slow window's factor
 * (5x when not given; only slow windows take one; the largest of those active wins). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "faults.h"

static int parse(ag_fault_plan *p, const char *text, char *err, size_t n) {
  return ag_fault_plan_parse(p, text, strlen(text), err, n);
}

static void test_windows_and_edges(void **state) {
  (void)state;
  ag_fault_plan p;
  char err[256] = "";
  assert_int_equal(parse(&p, "[{\"at_s\": 5, \"kind\": \"hang\", \"dur_s\": 10},"
                             " {\"at_s\": 8, \"kind\": \"error503\", \"dur_s\": 1}]", err, sizeof(err)), 0);
  assert_int_equal(p.n, 2);
  assert_int_equal(ag_fault_plan_active(&p, 4.9), 0);
  assert_int_equal(ag_fault_plan_active(&p, 5), AG_FAULT_BIT(AG_FAULT_HANG));
  assert_int_equal(ag_fault_plan_active(&p, 8.5), AG_FAULT_BIT(AG_FAULT_HANG) | AG_FAULT_BIT(AG_FAULT_ERROR503));
  assert_int_equal(ag_fault_plan_active(&p, 15), 0);
  assert_true(ag_fault_plan_next_change(&p, 0) == 5);
  assert_true(ag_fault_plan_next_change(&p, 8) == 9);
  assert_true(ag_fault_plan_next_change(&p, 15) < 0);
  assert_true(ag_fault_plan_slow_factor(&p, 6) == 1.0);
  ag_fault_plan_free(&p);
}

static void test_slow_factor(void **state) {
  (void)state;
  ag_fault_plan p;
  char err[256] = "";
  assert_int_equal(parse(&p, "[{\"at_s\": 0, \"kind\": \"slow\", \"dur_s\": 10},"
                             " {\"at_s\": 20, \"kind\": \"slow\", \"dur_s\": 10, \"factor\": 2},"
                             " {\"at_s\": 25, \"kind\": \"slow\", \"dur_s\": 10, \"factor\": 1.5}]",
                         err, sizeof(err)), 0);
  assert_true(ag_fault_plan_slow_factor(&p, 5) == AG_FAULT_SLOW_FACTOR);
  assert_true(ag_fault_plan_slow_factor(&p, 15) == 1.0);
  assert_true(ag_fault_plan_slow_factor(&p, 22) == 2.0);
  assert_true(ag_fault_plan_slow_factor(&p, 27) == 2.0); /* the largest active */
  assert_true(ag_fault_plan_slow_factor(&p, 32) == 1.5);
  assert_true(ag_fault_plan_slow_factor(NULL, 32) == 1.0);
  ag_fault_plan_free(&p);
}

static void test_bad_factors(void **state) {
  (void)state;
  ag_fault_plan p;
  char err[256] = "";
  assert_true(parse(&p, "[{\"at_s\": 0, \"kind\": \"hang\", \"dur_s\": 1, \"factor\": 2}]", err, sizeof(err)) < 0);
  assert_non_null(strstr(err, "only a slow window takes a factor"));
  assert_int_equal(p.n, 0);
  assert_true(parse(&p, "[{\"at_s\": 0, \"kind\": \"slow\", \"dur_s\": 1, \"factor\": 0.5}]", err, sizeof(err)) < 0);
  assert_non_null(strstr(err, "factor"));
  assert_true(parse(&p, "[{\"at_s\": 0, \"kind\": \"slow\", \"dur_s\": 1, \"factor\": \"2\"}]", err, sizeof(err)) < 0);
  assert_true(parse(&p, "[{\"at_s\": 0, \"kind\": \"slow\", \"dur_s\": 1, \"speed\": 2}]", err, sizeof(err)) < 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_windows_and_edges),
    cmocka_unit_test(test_slow_factor),
    cmocka_unit_test(test_bad_factors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
