/* Unit tests for gateway/outlen.c: answer lengths learned per cap bucket of a model, the
 * fallbacks (every model's average, then the configured guess), bounds by the cap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "outlen.h"

static void test_buckets_and_fallbacks(void **state) {
  (void)state;
  gw_outlen m, other;
  double all = 0;
  memset(&m, 0, sizeof(m));
  memset(&other, 0, sizeof(other));
  /* nothing learned: the configured guess, never more than the cap */
  assert_true(gw_outlen_expect(&m, all, 300, 128) == 128);
  assert_true(gw_outlen_expect(&m, all, 4, 128) == 4);
  /* one verdict of 8 tokens: a chat's bucket has none yet and plans on the overall average */
  gw_outlen_learn(&m, &all, 8, 8);
  assert_true(gw_outlen_expect(&m, all, 300, 128) == 8);
  assert_true(gw_outlen_expect(&other, all, 300, 128) == 8);
  /* chats of 300 tokens: their own bucket, not the verdicts' */
  for (int i = 0; i < 5; i++) gw_outlen_learn(&m, &all, 300, 300);
  assert_true(fabs(gw_outlen_expect(&m, all, 300, 128) - 300) < 1e-9);
  assert_true(fabs(gw_outlen_expect(&m, all, 8, 128) - 8) < 1e-9);
  /* a cap in the same power-of-two bucket shares it, within its own cap */
  assert_true(fabs(gw_outlen_expect(&m, all, 511, 128) - 300) < 1e-9);
  assert_true(fabs(gw_outlen_expect(&m, all, 260, 128) - 260) < 1e-9);
  /* another model's chats are not this one's: the average over all answers */
  double a = gw_outlen_expect(&other, all, 300, 128);
  assert_true(a > 8 && a < 300);
  assert_true(gw_outlen_expect(NULL, all, 300, 128) == a); /* a model not known: the same */
}

static void test_learns_quickly_then_smoothly(void **state) {
  (void)state;
  gw_outlen t;
  double all = 0;
  memset(&t, 0, sizeof(t));
  gw_outlen_learn(&t, &all, 1024, 100);
  assert_true(gw_outlen_expect(&t, all, 1024, 128) == 100);
  gw_outlen_learn(&t, &all, 1024, 300); /* early answers weigh half */
  assert_true(fabs(gw_outlen_expect(&t, all, 1024, 128) - 200) < 1e-9);
  for (int i = 0; i < 3; i++) gw_outlen_learn(&t, &all, 1024, 200);
  gw_outlen_learn(&t, &all, 1024, 1200); /* later, one long answer moves it a tenth */
  double e = gw_outlen_expect(&t, all, 1024, 128);
  assert_true(e > 250 && e < 350);
}

static void test_bad_samples_and_bounds(void **state) {
  (void)state;
  gw_outlen t;
  double all = 0;
  memset(&t, 0, sizeof(t));
  gw_outlen_learn(&t, &all, 16, NAN);
  gw_outlen_learn(&t, &all, 16, -5);
  gw_outlen_learn(&t, &all, 16, INFINITY);
  assert_true(gw_outlen_expect(&t, all, 16, 10) == 10); /* none learned */
  gw_outlen_learn(&t, &all, 16, 1e9);                  /* more than the cap: the cap */
  assert_true(gw_outlen_expect(&t, all, 16, 10) == 16);
  assert_true(gw_outlen_expect(NULL, all, 16, 10) == 16); /* no model: the overall average */
  assert_true(gw_outlen_expect(&t, all, 0, 10) == 1);     /* no cap is no answer */
  /* the largest caps share the last bucket */
  gw_outlen_learn(&t, &all, INT64_MAX, 3000);
  assert_true(fabs(gw_outlen_expect(&t, all, INT64_C(1) << 62, 10) - 3000) < 1e-9);
  /* an answer to a request without a cap teaches only the overall average */
  double before = all;
  gw_outlen_learn(NULL, &all, 0, 100);
  assert_true(all != before);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_buckets_and_fallbacks),
    cmocka_unit_test(test_learns_quickly_then_smoothly),
    cmocka_unit_test(test_bad_samples_and_bounds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
