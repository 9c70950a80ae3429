/* Answer lengths per model and cap bucket (gateway/outlen.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "outlen.h"

static void test_fallback_then_all_then_class(void **state) {
  (void)state;
  gw_outlen t;
  memset(&t, 0, sizeof(t));
  /* nothing seen: the configured length, within the cap */
  assert_true(gw_outlen_expect(&t, "m", 300, 128) == 128);
  assert_true(gw_outlen_expect(&t, "m", 4, 128) == 4);
  /* one verdict of 8 tokens: every class not seen yet plans on it */
  gw_outlen_learn(&t, "m", 8, 8, 1000);
  assert_true(gw_outlen_expect(&t, "m", 300, 128) == 8);
  assert_true(gw_outlen_expect(&t, "other", 300, 128) == 8);
  /* chats of 300: their class learns 300 while the verdicts' stays at 8 */
  for (int i = 0; i < 5; i++) gw_outlen_learn(&t, "m", 300, 300, 2000 + i);
  assert_true(fabs(gw_outlen_expect(&t, "m", 300, 128) - 300) < 1e-9);
  assert_true(fabs(gw_outlen_expect(&t, "m", 8, 128) - 8) < 1e-9);
  /* a cap in the same power-of-two bucket shares the class, within its own cap */
  assert_true(fabs(gw_outlen_expect(&t, "m", 511, 128) - 300) < 1e-9);
  assert_true(fabs(gw_outlen_expect(&t, "m", 260, 128) - 260) < 1e-9);
  /* another model's chats are not this one's: the average over all answers */
  double all = gw_outlen_expect(&t, "n", 300, 128);
  assert_true(all > 8 && all < 300);
}

static void test_learns_quickly_then_smoothly(void **state) {
  (void)state;
  gw_outlen t;
  memset(&t, 0, sizeof(t));
  gw_outlen_learn(&t, "m", 1024, 100, 1);
  assert_true(gw_outlen_expect(&t, "m", 1024, 128) == 100);
  gw_outlen_learn(&t, "m", 1024, 300, 2); /* early answers weigh half */
  assert_true(fabs(gw_outlen_expect(&t, "m", 1024, 128) - 200) < 1e-9);
  for (int i = 0; i < 3; i++) gw_outlen_learn(&t, "m", 1024, 200, 3 + i);
  gw_outlen_learn(&t, "m", 1024, 1200, 10); /* later, one long answer moves it a tenth */
  double e = gw_outlen_expect(&t, "m", 1024, 128);
  assert_true(e > 250 && e < 350);
}

static void test_bad_input_and_overflow(void **state) {
  (void)state;
  gw_outlen t;
  memset(&t, 0, sizeof(t));
  gw_outlen_learn(&t, "m", 16, NAN, 1);
  gw_outlen_learn(&t, "m", 16, -5, 1);
  gw_outlen_learn(&t, "m", 16, INFINITY, 1);
  assert_true(gw_outlen_expect(&t, "m", 16, 10) == 10); /* none learned */
  gw_outlen_learn(&t, "m", 16, 1e9, 1);                 /* more than the cap: the cap */
  assert_true(gw_outlen_expect(&t, "m", 16, 10) == 16);
  assert_true(gw_outlen_expect(&t, NULL, 16, 10) == 16); /* no model: the overall average */
  assert_true(gw_outlen_expect(&t, "m", 0, 10) == 1);    /* no cap is no answer */
  /* more classes than the table holds: the oldest goes, the newest are kept */
  char name[32];
  for (int i = 0; i < GW_OUTLEN_CLASSES + 10; i++) {
    snprintf(name, sizeof(name), "model-%d", i);
    gw_outlen_learn(&t, name, 64, (double)(i % 50) + 1, (uint64_t)(100 + i));
  }
  snprintf(name, sizeof(name), "model-%d", GW_OUTLEN_CLASSES + 9);
  assert_true(fabs(gw_outlen_expect(&t, name, 64, 10) - (double)((GW_OUTLEN_CLASSES + 9) % 50 + 1)) < 1e-9);
  /* a name longer than the table's is told apart on its first GW_OUTLEN_MODEL - 1 bytes */
  char longname[300];
  memset(longname, 'x', sizeof(longname) - 1);
  longname[sizeof(longname) - 1] = 0;
  gw_outlen_learn(&t, longname, 4096, 3000, 1000);
  assert_true(fabs(gw_outlen_expect(&t, longname, 4096, 10) - 3000) < 1e-9);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fallback_then_all_then_class),
      cmocka_unit_test(test_learns_quickly_then_smoothly),
      cmocka_unit_test(test_bad_input_and_overflow),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
