/* Unit tests for gateway/verdict.c: which error answers are a phone's failure and which
 * are the request's fault, with the real llama-server bodies from
 * tests/system/fixtures/. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "verdict.h"

#define LEN(s) (sizeof(s) - 1)

static const char N2[] =
    "{\"error\":{\"code\":500,\"message\":\"Only one completion choice is allowed\",\"type\":\"server_error\"}}";
static const char TOOLS[] =
    "{\"error\":{\"code\":500,\"message\":\"Failed to parse tools: [json.exception.out_of_range.403] "
    "key 'description' not found; tools = [\\n  {\\n    \\\"type\\\": \\\"function\\\"\\n  }\\n]\","
    "\"type\":\"server_error\"}}";
static const char CONTEXT[] =
    "{\"error\":{\"code\":400,\"message\":\"request (5028 tokens) exceeds the available context size "
    "(2048 tokens), try increasing it\",\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":5028,"
    "\"n_ctx\":2048}}";
/* b10587 after a whole generation it could not read back (tests/system/fixtures/unparsable-b10587.http) */
static const char UNPARSABLE[] =
    "{\"error\":{\"code\":500,\"message\":\"The model produced output that does not match the expected "
    "peg-native format\",\"type\":\"server_error\"}}";
static const char LOADING[] =
    "{\"error\":{\"message\":\"Loading model\",\"type\":\"unavailable_error\",\"code\":503}}";
static const char MNN[] = "{\"error\":\"Only one completion choice is allowed\"}";
static const char HTML[] = "<html><body><h1>500 Internal Server Error</h1></body></html>";

static void test_prompt_500_with_an_error_body_is_ambiguous(void **state) {
  (void)state;
  assert_int_equal(gw_verdict_of(500, N2, LEN(N2), 0.2, 10), GW_VERDICT_AMBIGUOUS);
  assert_int_equal(gw_verdict_of(500, TOOLS, LEN(TOOLS), 0.2, 10), GW_VERDICT_AMBIGUOUS);
  assert_int_equal(gw_verdict_of(500, MNN, LEN(MNN), 1, 10), GW_VERDICT_AMBIGUOUS);
  assert_int_equal(gw_verdict_of(501, N2, LEN(N2), 1, 10), GW_VERDICT_AMBIGUOUS);
}

static void test_late_or_unreadable_500_is_the_phone(void **state) {
  (void)state;
  /* after minutes of work a 500 is the phone breaking down */
  assert_int_equal(gw_verdict_of(500, N2, LEN(N2), 180, 10), GW_VERDICT_PHONE);
  /* 508 loop_detected: the phone's URL leads back to a gateway, prompt or not */
  assert_int_equal(gw_verdict_of(508, N2, LEN(N2), 0.1, 10), GW_VERDICT_PHONE);
  assert_int_equal(gw_verdict_of(500, HTML, LEN(HTML), 0.1, 10), GW_VERDICT_PHONE);
  assert_int_equal(gw_verdict_of(500, "", 0, 0.1, 10), GW_VERDICT_PHONE);
  assert_int_equal(gw_verdict_of(500, "{\"error\":{}}", 12, 0.1, 10), GW_VERDICT_PHONE);
  assert_int_equal(gw_verdict_of(500, "{\"error\":\"\"}", 11, 0.1, 10), GW_VERDICT_PHONE);
  assert_int_equal(gw_verdict_of(500, "{\"error\":{\"message\":\"x\"}", 24, 0.1, 10), GW_VERDICT_PHONE);
  /* a window of 0 turns the rule off */
  assert_int_equal(gw_verdict_of(500, N2, LEN(N2), 0.001, 0), GW_VERDICT_PHONE);
}

/* The late 500 of an output the engine cannot read back is what it is, however late. */
static void test_unparsable_output_is_its_own_verdict(void **state) {
  (void)state;
  assert_int_equal(gw_verdict_of(500, UNPARSABLE, LEN(UNPARSABLE), 0.1, 10), GW_VERDICT_UNPARSABLE);
  assert_int_equal(gw_verdict_of(500, UNPARSABLE, LEN(UNPARSABLE), 300, 10), GW_VERDICT_UNPARSABLE);
  /* as an error event in a stream (its code 500) */
  assert_int_equal(gw_verdict_event_status(UNPARSABLE, LEN(UNPARSABLE)), 500);
  /* another late 500 is still the phone's */
  assert_int_equal(gw_verdict_of(500, N2, LEN(N2), 300, 10), GW_VERDICT_PHONE);
  assert_int_equal(gw_verdict_of(503, UNPARSABLE, LEN(UNPARSABLE), 0.1, 10), GW_VERDICT_PHONE);
}

static void test_gateway_statuses_are_the_phone(void **state) {
  (void)state;
  static const long phone[] = {502, 503, 504, 401, 403, 404, 405, 407, 408, 429, 301, 204};
  for (size_t i = 0; i < sizeof(phone) / sizeof(phone[0]); i++)
    assert_int_equal(gw_verdict_of(phone[i], N2, LEN(N2), 0.1, 10), GW_VERDICT_PHONE);
  assert_int_equal(gw_verdict_of(503, LOADING, LEN(LOADING), 0.1, 10), GW_VERDICT_LOADING);
  assert_int_equal(gw_verdict_of(503, LOADING, LEN(LOADING), 100, 10), GW_VERDICT_LOADING);
}

static void test_4xx_with_an_error_body_is_refused(void **state) {
  (void)state;
  assert_int_equal(gw_verdict_of(400, CONTEXT, LEN(CONTEXT), 0.1, 10), GW_VERDICT_REFUSED);
  /* a 4xx is final whenever it comes */
  assert_int_equal(gw_verdict_of(400, CONTEXT, LEN(CONTEXT), 300, 10), GW_VERDICT_REFUSED);
  assert_int_equal(gw_verdict_of(422, MNN, LEN(MNN), 0.1, 10), GW_VERDICT_REFUSED);
  /* a proxy's HTML 400 page says nothing about the request */
  assert_int_equal(gw_verdict_of(400, HTML, LEN(HTML), 0.1, 10), GW_VERDICT_PHONE);
}

static void test_event_status(void **state) {
  (void)state;
  assert_int_equal(gw_verdict_event_status(CONTEXT, LEN(CONTEXT)), 400);
  assert_int_equal(gw_verdict_event_status(N2, LEN(N2)), 500);
  assert_int_equal(gw_verdict_event_status(MNN, LEN(MNN)), 500);
  assert_int_equal(gw_verdict_event_status("{\"error\":{\"code\":200}}", 22), 500);
  assert_int_equal(gw_verdict_event_status("nonsense", 8), 500);
}

static cJSON *error_of(const char *body, size_t len, const char **code) {
  pr_buf out;
  pr_buf_init(&out, 64 * 1024);
  assert_int_equal(gw_verdict_error_body(body, len, &out, code), 0);
  cJSON *root = cJSON_ParseWithLength(out.data, out.len);
  pr_buf_free(&out);
  assert_non_null(root);
  return root;
}

static void test_error_body_is_openais_shape_with_the_phones_message(void **state) {
  (void)state;
  const char *code = NULL;
  cJSON *root = error_of(TOOLS, LEN(TOOLS), &code);
  const cJSON *e = cJSON_GetObjectItem(root, "error");
  assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
  assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, "request_refused");
  assert_string_equal(code, "request_refused");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(e, "param")));
  assert_non_null(strstr(cJSON_GetObjectItem(e, "message")->valuestring, "Failed to parse tools"));
  cJSON_Delete(root);

  /* b10587's context error: OpenAI's code, words and param, with the engine's numbers */
  root = error_of(CONTEXT, LEN(CONTEXT), &code);
  e = cJSON_GetObjectItem(root, "error");
  assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, "context_length_exceeded");
  assert_string_equal(code, "context_length_exceeded");
  assert_string_equal(cJSON_GetObjectItem(e, "param")->valuestring, "messages");
  assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring,
                      "This model's maximum context length is 2048 tokens. However, your messages "
                      "resulted in 5028 tokens. Please reduce the length of the messages.");
  cJSON_Delete(root);
  int64_t np, nc;
  assert_int_equal(gw_verdict_context(CONTEXT, LEN(CONTEXT), &np, &nc), 1);
  assert_int_equal(np, 5028);
  assert_int_equal(nc, 2048);
  assert_int_equal(gw_verdict_context(TOOLS, LEN(TOOLS), &np, &nc), 0);
  assert_int_equal(np, -1);

  root = error_of(UNPARSABLE, LEN(UNPARSABLE), &code);
  e = cJSON_GetObjectItem(root, "error");
  assert_string_equal(code, "model_output_unparsable");
  assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
  cJSON_Delete(root);

  root = error_of(MNN, LEN(MNN), &code);
  e = cJSON_GetObjectItem(root, "error");
  assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring, "Only one completion choice is allowed");
  cJSON_Delete(root);
}

static void test_long_messages_are_cut_on_a_character(void **state) {
  (void)state;
  /* "é" (2 bytes) repeated past the cap: the cut must not split one */
  char body[3 * GW_VERDICT_MAX_MESSAGE + 64];
  size_t n = (size_t)snprintf(body, sizeof(body), "{\"error\":\"x");
  for (int i = 0; i < GW_VERDICT_MAX_MESSAGE; i++) {
    body[n++] = (char)0xC3;
    body[n++] = (char)0xA9;
  }
  n += (size_t)snprintf(body + n, sizeof(body) - n, "\"}");
  cJSON *root = error_of(body, n, NULL);
  const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "error"), "message")->valuestring;
  size_t len = strlen(msg);
  assert_true(len <= GW_VERDICT_MAX_MESSAGE);
  assert_true(len >= GW_VERDICT_MAX_MESSAGE - 1);
  assert_int_equal((unsigned char)msg[len - 1], 0xA9); /* ends on a whole character */
  cJSON_Delete(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_prompt_500_with_an_error_body_is_ambiguous),
    cmocka_unit_test(test_late_or_unreadable_500_is_the_phone),
    cmocka_unit_test(test_unparsable_output_is_its_own_verdict),
    cmocka_unit_test(test_gateway_statuses_are_the_phone),
    cmocka_unit_test(test_4xx_with_an_error_body_is_refused),
    cmocka_unit_test(test_event_status),
    cmocka_unit_test(test_error_body_is_openais_shape_with_the_phones_message),
    cmocka_unit_test(test_long_messages_are_cut_on_a_character),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
