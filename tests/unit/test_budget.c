/* proto/budget.c: the process's budget of buffered body bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "budget.h"
#include "err.h"

static void take_until_full_then_give(void **state) {
  (void)state;
  pr_budget b = {.max = 100};
  assert_int_equal(pr_budget_take(&b, 60), 0);
  assert_int_equal(pr_budget_take(&b, 40), 0); /* exactly full is allowed */
  assert_int_equal(b.used, 100);
  assert_int_equal(pr_budget_take(&b, 1), PR_EBUSY);
  assert_int_equal(b.used, 100); /* a refusal takes nothing */
  pr_budget_give(&b, 60);
  assert_int_equal(b.used, 40);
  assert_int_equal(pr_budget_take(&b, 60), 0);
  assert_int_equal(pr_budget_take(&b, 0), 0);
}

static void huge_asks_do_not_wrap(void **state) {
  (void)state;
  pr_budget b = {.max = 100, .used = 10};
  assert_int_equal(pr_budget_take(&b, SIZE_MAX), PR_EBUSY);
  assert_int_equal(pr_budget_take(&b, SIZE_MAX - 5), PR_EBUSY);
  assert_int_equal(b.used, 10);
}

static void no_limit_still_counts(void **state) {
  (void)state;
  pr_budget b = {0};
  assert_int_equal(pr_budget_take(&b, (size_t)1 << 40), 0);
  assert_int_equal(pr_budget_take(&b, 5), 0);
  assert_int_equal(b.used, ((size_t)1 << 40) + 5);
  pr_budget_give(&b, ((size_t)1 << 40) + 5);
  assert_int_equal(b.used, 0);
}

static void giving_back_more_than_held_stops_at_zero(void **state) {
  (void)state;
  pr_budget b = {.max = 10, .used = 3};
  pr_budget_give(&b, 7);
  assert_int_equal(b.used, 0);
}

static void lowered_limit_refuses_until_drained(void **state) {
  (void)state;
  pr_budget b = {.max = 100, .used = 80};
  b.max = 50; /* a reload lowered it while 80 bytes are held */
  assert_int_equal(pr_budget_take(&b, 1), PR_EBUSY);
  pr_budget_give(&b, 40);
  assert_int_equal(pr_budget_take(&b, 10), 0);
  assert_int_equal(pr_budget_take(&b, 1), PR_EBUSY);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(take_until_full_then_give),
      cmocka_unit_test(huge_asks_do_not_wrap),
      cmocka_unit_test(no_limit_still_counts),
      cmocka_unit_test(giving_back_more_than_held_stops_at_zero),
      cmocka_unit_test(lowered_limit_refuses_until_drained),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
