/* Unit tests for proto/feat.c: reading the answers of both llama-server releases to the
 * feature probes (tests/system/fixtures/feature-*.http) and of other engines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "feat.h"

#define LEN(s) (sizeof(s) - 1)

/* feature-*-b10587.http */
static const char N_B10587[] =
    "{\"error\":{\"code\":400,\"message\":\"Field 'n': Value must be between 1 <= value <= 2, but got 1000\","
    "\"type\":\"invalid_request_error\"}}";
static const char CONT_B10587[] =
    "{\"error\":{\"code\":400,\"message\":\"Cannot set both add_generation_prompt and continue_final_message to "
    "true.\",\"type\":\"invalid_request_error\"}}";
static const char RESP_B10587[] =
    "{\"error\":{\"code\":400,\"message\":\"'input' is required\",\"type\":\"invalid_request_error\"}}";
/* feature-*-2025.http */
static const char N_2025[] =
    "{\"error\":{\"code\":500,\"message\":\"Only one completion choice is allowed\",\"type\":\"server_error\"}}";
static const char CONT_2025[] =
    "{\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"F\"}}],"
    "\"object\":\"chat.completion\"}";
static const char RESP_2025[] = "{\"error\":{\"code\":404,\"message\":\"File Not Found\",\"type\":\"not_found_error\"}}";
static const char LOADING[] = "{\"error\":{\"message\":\"Loading model\",\"type\":\"unavailable_error\",\"code\":503}}";

static void test_b10587_serves_all_three(void **state) {
  (void)state;
  int k = 0;
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CHOICES, 400, N_B10587, LEN(N_B10587), &k), 1);
  assert_int_equal(k, 2); /* its slots */
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CONTINUE, 400, CONT_B10587, LEN(CONT_B10587), NULL), 1);
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_RESPONSES, 400, RESP_B10587, LEN(RESP_B10587), NULL), 1);
}

static void test_the_2025_build_serves_none(void **state) {
  (void)state;
  int k = 7;
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CHOICES, 500, N_2025, LEN(N_2025), &k), 0);
  assert_int_equal(k, 1);
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CONTINUE, 200, CONT_2025, LEN(CONT_2025), NULL), 0);
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_RESPONSES, 404, RESP_2025, LEN(RESP_2025), NULL), 0);
}

static void test_no_verdict_while_loading_or_unreachable(void **state) {
  (void)state;
  for (int p = 0; p < PR_FEAT_PROBES; p++) {
    assert_int_equal(pr_feat_probe_read(p, 503, LOADING, LEN(LOADING), NULL), -1);
    assert_int_equal(pr_feat_probe_read(p, 0, "", 0, NULL), -1);
    assert_int_equal(pr_feat_probe_read(p, 502, "bad gateway", 11, NULL), -1);
  }
}

static void test_a_one_slot_b10587_serves_no_more_than_one(void **state) {
  (void)state;
  static const char one[] = "{\"error\":{\"code\":400,\"message\":\"Field 'n': Value must be between 1 <= value <= 1, "
                            "but got 1000\",\"type\":\"invalid_request_error\"}}";
  int k = 0;
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CHOICES, 400, one, LEN(one), &k), 0);
  assert_int_equal(k, 1);
  /* an engine that answered the choices asked serves them */
  static const char two[] = "{\"choices\":[{\"index\":0},{\"index\":1}]}";
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CHOICES, 200, two, LEN(two), &k), 1);
  assert_int_equal(k, 2);
  /* another refusal of the whole request says nothing of continue_final_message */
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CONTINUE, 400, RESP_B10587, LEN(RESP_B10587), NULL), 0);
}


/* The checkpoint probe's second answer, as measured on both builds: b10587 with the tiny
 * Qwen3.5 reads the last 4 tokens again (cache_n 59, prompt_n 4), the 2025 build with a
 * llama model only the last one (prompt_n 1, and no cache_n at all). */
static void test_checkpoints_probe(void **state) {
  (void)state;
  static const char hyb[] = "{\"content\":\"x\",\"timings\":{\"cache_n\":59,\"prompt_n\":4,\"prompt_ms\":1.3}}";
  static const char tr26[] = "{\"content\":\"x\",\"timings\":{\"cache_n\":62,\"prompt_n\":1,\"prompt_ms\":1.3}}";
  static const char old[] = "{\"content\":\"x\",\"timings\":{\"prompt_n\":1,\"prompt_ms\":1618.1}}";
  static const char cold[] = "{\"content\":\"x\",\"timings\":{\"cache_n\":0,\"prompt_n\":4}}";
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CKPT, 200, hyb, LEN(hyb), NULL), 1);
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CKPT, 200, tr26, LEN(tr26), NULL), 0);
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CKPT, 200, old, LEN(old), NULL), 0);
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CKPT, 200, cold, LEN(cold), NULL), 0);
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CKPT, 404, "{}", 2, NULL), 0);
  assert_int_equal(pr_feat_probe_read(PR_FEAT_PROBE_CKPT_WARM, 200, hyb, LEN(hyb), NULL), 0);
  assert_int_equal(pr_feat_probe_bit(PR_FEAT_PROBE_CKPT), PR_FEAT_CHECKPOINTS);
  assert_int_equal(pr_feat_probe_bit(PR_FEAT_PROBE_CKPT_WARM), 0);
  assert_string_equal(pr_feat_probe_path(PR_FEAT_PROBE_CKPT), "/completion");
  assert_int_equal(PR_FEAT_PROBES_BARE, 3); /* a bare engine is asked the first three */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_b10587_serves_all_three),
      cmocka_unit_test(test_checkpoints_probe),
      cmocka_unit_test(test_the_2025_build_serves_none),
      cmocka_unit_test(test_no_verdict_while_loading_or_unreachable),
      cmocka_unit_test(test_a_one_slot_b10587_serves_no_more_than_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
