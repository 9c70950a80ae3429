/* proto/clock.c: the wall clock in milliseconds agrees with the system's own view of
 * the epoch (heartbeat timestamps are compared across machines). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>
#include <time.h>

#include <cmocka.h>

#include "clock.h"

static void test_wall_ms_is_epoch_milliseconds(void **state) {
  (void)state;
  struct timeval before, after;
  gettimeofday(&before, NULL);
  int64_t ms = pr_clock_wall_ms();
  gettimeofday(&after, NULL);
  int64_t lo = (int64_t)before.tv_sec * 1000 + before.tv_usec / 1000;
  int64_t hi = (int64_t)after.tv_sec * 1000 + after.tv_usec / 1000;
  assert_true(ms >= lo && ms <= hi + 1);
  /* milliseconds, not seconds or microseconds: after 2020 and before 2100 */
  assert_true(ms > INT64_C(1577836800000) && ms < INT64_C(4102444800000));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wall_ms_is_epoch_milliseconds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
