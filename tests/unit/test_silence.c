/* Unit tests for gateway/silence.c: how long a started stream may be silent before it is
 * taken to another phone. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "silence.h"

static gw_silence_in base(void) {
  return (gw_silence_in){.factor = 10, .floor_s = 5, .idle_max_s = 60, .decode_tps = 10,
                         .slowdown = 1, .seen_gap_s = 0, .cover_s = 0};
}

static void test_a_fast_phone_gets_the_floor(void **state) {
  (void)state;
  gw_silence_in in = base(); /* 10 x 0.1 s = 1 s < 5 s */
  assert_float_equal(gw_silence_limit_s(&in), 5, 1e-9);
}

static void test_a_slow_phone_gets_k_gaps(void **state) {
  (void)state;
  gw_silence_in in = base();
  in.decode_tps = 0.5; /* 2 s a token: 20 s */
  assert_float_equal(gw_silence_limit_s(&in), 20, 1e-9);
  in.slowdown = 2; /* the planner sees it 2x slower: 40 s */
  assert_float_equal(gw_silence_limit_s(&in), 40, 1e-9);
  in.slowdown = 0.1; /* a slowdown below 1 is no speed-up */
  assert_float_equal(gw_silence_limit_s(&in), 20, 1e-9);
}

static void test_the_streams_own_pace_counts_when_slower(void **state) {
  (void)state;
  gw_silence_in in = base();
  in.seen_gap_s = 1.5; /* it has been sending a token every 1.5 s: 15 s */
  assert_float_equal(gw_silence_limit_s(&in), 15, 1e-9);
  in.seen_gap_s = 0.01; /* faster than learned: the learned pace stands */
  assert_float_equal(gw_silence_limit_s(&in), 5, 1e-9);
}

static void test_prompts_read_beside_it_extend_the_limit(void **state) {
  (void)state;
  gw_silence_in in = base();
  in.cover_s = gw_silence_cover_s(7000, 100, 1); /* one batch: 2048 / 100 */
  assert_float_equal(in.cover_s, 20.48, 1e-9);
  assert_float_equal(gw_silence_limit_s(&in), 25.48, 1e-9);
  assert_float_equal(gw_silence_cover_s(500, 100, 2), 10, 1e-9);
  assert_float_equal(gw_silence_cover_s(0, 100, 1), 0, 1e-9);
  assert_float_equal(gw_silence_cover_s(500, 0, 1), 0, 1e-9);
  assert_float_equal(gw_silence_cover_s(500, NAN, 1), 0, 1e-9);
}

static void test_never_beyond_the_idle_timeout(void **state) {
  (void)state;
  gw_silence_in in = base();
  in.decode_tps = 0.01; /* 1,000 s */
  assert_float_equal(gw_silence_limit_s(&in), 60, 1e-9);
  in = base();
  in.floor_s = 100;
  assert_float_equal(gw_silence_limit_s(&in), 60, 1e-9);
  in = base();
  in.cover_s = INFINITY;
  assert_float_equal(gw_silence_limit_s(&in), 60, 1e-9);
}

static void test_off_or_unknown(void **state) {
  (void)state;
  gw_silence_in in = base();
  in.factor = 0; /* off: only the idle timeout */
  assert_float_equal(gw_silence_limit_s(&in), 60, 1e-9);
  in.factor = NAN;
  assert_float_equal(gw_silence_limit_s(&in), 60, 1e-9);
  in = base();
  in.decode_tps = 0; /* no rate known: the floor */
  assert_float_equal(gw_silence_limit_s(&in), 5, 1e-9);
  in.decode_tps = NAN;
  in.seen_gap_s = NAN;
  assert_float_equal(gw_silence_limit_s(&in), 5, 1e-9);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_a_fast_phone_gets_the_floor),
    cmocka_unit_test(test_a_slow_phone_gets_k_gaps),
    cmocka_unit_test(test_the_streams_own_pace_counts_when_slower),
    cmocka_unit_test(test_prompts_read_beside_it_extend_the_limit),
    cmocka_unit_test(test_never_beyond_the_idle_timeout),
    cmocka_unit_test(test_off_or_unknown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
