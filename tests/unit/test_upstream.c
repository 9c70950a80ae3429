/* Unit tests for gateway/upstream.c's decisions with injected time: how long a started
 * stream may stay silent before its watchdog fails it (the idle limit before its first
 * token, a few times its phone's pace after, its own slower pace, a neighbour reading its
 * prompt on the same phone), whether an answer is still flowing (a phone marked down whose
 * stream still flows is left alone), and what a transfer's end says of the phone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gw.h"
#include "replica.h"

#define T0 9000000u

typedef struct fixture {
  gw_config conf;
  gw_replica *r;
  gw_job job, other_job;
  gw_attempt a, other;
} fixture;

/* A phone decoding 10 tokens/s and reading prompts at 100/s; silence: 5 x the gap, at
 * least 2 s, at most 60 s. */
static fixture *fx_new(void) {
  fixture *f = calloc(1, sizeof(*f));
  assert_non_null(f);
  f->conf.stream_idle_timeout_s = 60;
  f->conf.stream_silence_factor = 5;
  f->conf.stream_silence_min_s = 2;
  char *models[] = {"m"};
  f->r = gw_replica_new("p1", "http://127.0.0.1:1", NULL, models, 1, 4, 0, 100, 10, 0);
  assert_non_null(f->r);
  gw_replica_set_state(f->r, GW_REPLICA_READY, T0, "test");
  f->job.conf = f->other_job.conf = &f->conf;
  f->a.job = &f->job;
  f->a.replica = f->r;
  f->a.state = GW_ATT_STREAM;
  f->a.lease = gw_replica_acquire(f->r, T0, 10000, &f->a);
  return f;
}

static void fx_free(fixture *f) {
  gw_replica_free(f->r);
  free(f);
}

static void test_a_stream_may_be_silent_for_its_prefill_then_for_its_pace(void **state) {
  (void)state;
  fixture *f = fx_new();
  /* before its first token: the prompt is being read, the idle limit holds */
  assert_true(gw_attempt_silence_s(&f->a, T0, 0) == 60);
  /* then 5 x 0.1 s, at least 2 s */
  f->a.sent_tokens = 1;
  assert_true(gw_attempt_silence_s(&f->a, T0, 0) == 2);
  /* its own pace, slower than the phone's: 20 tokens over 9.5 s, a 0.5 s gap */
  f->a.sent_tokens = 20;
  f->a.first_token_ms = T0;
  f->a.last_token_ms = T0 + 9500;
  double s = gw_attempt_silence_s(&f->a, T0 + 9500, 0);
  assert_true(s > 2.49 && s < 2.51);
  fx_free(f);
}

static void test_a_neighbour_reading_its_prompt_extends_the_silence(void **state) {
  (void)state;
  fixture *f = fx_new();
  f->a.sent_tokens = 1;
  /* another request on the phone, sent, 300 prompt tokens to read at 100/s: 3 s more */
  f->other_job.oai.prompt_tokens = 300;
  f->other.job = &f->other_job;
  f->other.replica = f->r;
  f->other.state = GW_ATT_SENT;
  f->other.lease = gw_replica_acquire(f->r, T0, 10000, &f->other);
  double s = gw_attempt_silence_s(&f->a, T0, 1);
  assert_true(s > 4.99 && s < 5.01);
  assert_true(gw_attempt_silence_s(&f->a, T0, 0) == 2); /* without cover */
  /* once it streams its own tokens it no longer holds this one back */
  f->other.state = GW_ATT_STREAM;
  f->other.sent_tokens = 3;
  assert_true(gw_attempt_silence_s(&f->a, T0, 1) == 2);
  fx_free(f);
}

static void test_an_answer_flows_while_bytes_come_at_its_pace(void **state) {
  (void)state;
  fixture *f = fx_new();
  assert_false(gw_attempt_flowing(&f->a, T0)); /* nothing heard yet */
  f->a.heard_ms = T0;
  assert_true(gw_attempt_flowing(&f->a, T0 + 999));   /* at least the last second */
  assert_false(gw_attempt_flowing(&f->a, T0 + 1000));
  f->r->decode_tps = 1; /* a slow phone: twice its 1 s gap */
  assert_true(gw_attempt_flowing(&f->a, T0 + 1999));
  assert_false(gw_attempt_flowing(&f->a, T0 + 2000));
  fx_free(f);
}

static void test_a_transfers_end_says_what_failed(void **state) {
  (void)state;
  assert_int_equal(gw_attempt_fail_kind(CURLE_OPERATION_TIMEDOUT), GW_FAIL_TIMEOUT);
  assert_int_equal(gw_attempt_fail_kind(CURLE_WEIRD_SERVER_REPLY), GW_FAIL_PROTOCOL);
  assert_int_equal(gw_attempt_fail_kind(CURLE_BAD_CONTENT_ENCODING), GW_FAIL_PROTOCOL);
  assert_int_equal(gw_attempt_fail_kind(CURLE_WRITE_ERROR), GW_FAIL_PROTOCOL);
  assert_int_equal(gw_attempt_fail_kind(CURLE_COULDNT_CONNECT), GW_FAIL_CONNECT);
  assert_int_equal(gw_attempt_fail_kind(CURLE_RECV_ERROR), GW_FAIL_CONNECT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_stream_may_be_silent_for_its_prefill_then_for_its_pace),
      cmocka_unit_test(test_a_neighbour_reading_its_prompt_extends_the_silence),
      cmocka_unit_test(test_an_answer_flows_while_bytes_come_at_its_pace),
      cmocka_unit_test(test_a_transfers_end_says_what_failed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
