/* Unit tests for gateway/batch.c's decision on a line's answer: a 2xx and the request's own
 * fault (4xx) are written to the output or error file and not run again; a phone's or the
 * fleet's failure (5xx, 408, 409) runs it again and counts a try; the gateway being busy
 * (429, a full queue, a model not served just now, a deadline, server_busy, a line let go
 * unanswered) runs it again without counting; a gateway shutting down leaves it pending. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "batchrun.h"

enum { WRITE = 0, AGAIN_COUNTED = 1, AGAIN = 2, PENDING = 3 };

static void test_a_lines_answer_is_written_retried_or_kept(void **state) {
  (void)state;
  assert_int_equal(gw_batch_answer_kind(200, NULL), WRITE);
  assert_int_equal(gw_batch_answer_kind(400, "invalid_request_error"), WRITE); /* its own fault */
  assert_int_equal(gw_batch_answer_kind(404, "model_not_found"), AGAIN); /* no phone serves it now */
  assert_int_equal(gw_batch_answer_kind(413, "request_too_large"), WRITE);
  assert_int_equal(gw_batch_answer_kind(500, "upstream_error"), AGAIN_COUNTED);
  assert_int_equal(gw_batch_answer_kind(502, NULL), AGAIN_COUNTED);
  assert_int_equal(gw_batch_answer_kind(408, NULL), AGAIN_COUNTED);
  assert_int_equal(gw_batch_answer_kind(409, NULL), AGAIN_COUNTED);
  assert_int_equal(gw_batch_answer_kind(429, "rate_limited"), AGAIN);
  assert_int_equal(gw_batch_answer_kind(503, "queue_full"), AGAIN);
  assert_int_equal(gw_batch_answer_kind(503, "server_busy"), AGAIN);
  assert_int_equal(gw_batch_answer_kind(504, "deadline_exceeded"), AGAIN);
  assert_int_equal(gw_batch_answer_kind(503, "unanswered"), AGAIN);
  assert_int_equal(gw_batch_answer_kind(503, "shutting_down"), PENDING);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_lines_answer_is_written_retried_or_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
