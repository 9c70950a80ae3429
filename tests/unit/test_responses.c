/* Unit tests for gateway/responses.c: a /v1/responses body made a chat completion, the
 * refusals of what the gateway cannot do properly, a chat answer made a Response, and a
 * chat stream made Responses events (their order, sequence numbers and texts). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "responses.h"

static cJSON *translate_ok(gw_resp *r, const char *body) {
  pr_buf chat;
  pr_buf_init(&chat, 1 << 20);
  pr_oai_error err;
  memset(&err, 0, sizeof(err));
  int rc = gw_resp_translate(r, body, strlen(body), "abc123", 1700000000, &chat, &err);
  if (rc) fail_msg("%s", err.message);
  cJSON *o = cJSON_ParseWithLength(chat.data, chat.len);
  pr_buf_free(&chat);
  assert_non_null(o);
  return o;
}

static void refused(const char *body, const char *param) {
  gw_resp r;
  pr_buf chat;
  pr_buf_init(&chat, 1 << 20);
  pr_oai_error err;
  memset(&err, 0, sizeof(err));
  assert_true(gw_resp_translate(&r, body, strlen(body), "x", 1, &chat, &err) < 0);
  assert_int_equal(err.status, 400);
  assert_string_equal(err.param, param);
  pr_buf_free(&chat);
  gw_resp_free(&r);
}

static void test_request_becomes_a_chat_completion(void **state) {
  (void)state;
  gw_resp r;
  cJSON *c = translate_ok(&r, "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":\"Hi\","
                              "\"max_output_tokens\":9,\"temperature\":0.5,\"stream\":true,"
                              "\"reasoning\":{\"effort\":\"low\"},"
                              "\"text\":{\"format\":{\"type\":\"json_object\"}}}");
  assert_string_equal(cJSON_GetObjectItem(c, "model")->valuestring, "m");
  const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
  assert_int_equal(cJSON_GetArraySize(msgs), 2);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 0), "role")->valuestring, "system");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 1), "content")->valuestring, "Hi");
  assert_int_equal(cJSON_GetObjectItem(c, "max_tokens")->valueint, 9);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(c, "stream")));
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "stream_options"), "include_usage")));
  assert_string_equal(cJSON_GetObjectItem(c, "reasoning_effort")->valuestring, "low");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "response_format"), "type")->valuestring, "json_object");
  assert_string_equal(r.id, "resp_abc123");
  cJSON_Delete(c);
  gw_resp_free(&r);
  /* a list of messages: text parts joined, developer as system */
  c = translate_ok(&r, "{\"model\":\"m\",\"input\":[{\"role\":\"developer\",\"content\":\"rules\"},"
                       "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
                       "{\"type\":\"input_text\",\"text\":\"b\"}]},"
                       "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"c\"}]}]}");
  msgs = cJSON_GetObjectItem(c, "messages");
  assert_int_equal(cJSON_GetArraySize(msgs), 3);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 0), "role")->valuestring, "system");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 1), "content")->valuestring, "ab");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 2), "role")->valuestring, "assistant");
  assert_null(cJSON_GetObjectItem(c, "stream"));
  cJSON_Delete(c);
  gw_resp_free(&r);
}

static void test_what_is_not_served_is_refused(void **state) {
  (void)state;
  refused("{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id");
  refused("{\"model\":\"m\",\"input\":\"x\",\"store\":true}", "store");
  refused("{\"model\":\"m\",\"input\":\"x\",\"background\":true}", "background");
  refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools");
  refused("{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"o\"}]}", "input[0]");
  refused("{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}",
          "input[0].content[0].type");
  refused("{\"model\":\"m\"}", "input");
  refused("{\"input\":\"x\"}", "model");
  refused("{\"model\":\"m\",\"input\":[]}", "input");
  refused("{\"model\":\"m\",\"input\":\"x\",\"stream\":\"yes\"}", "stream");
  refused("{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":\"9\"}", "max_output_tokens");
  refused("{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens");
  /* store false, an empty tools list and a null previous_response_id are fine */
  gw_resp r;
  cJSON *c = translate_ok(&r, "{\"model\":\"m\",\"input\":\"x\",\"store\":false,\"tools\":[],"
                              "\"previous_response_id\":null}");
  cJSON_Delete(c);
  gw_resp_free(&r);
}

static cJSON *parse(const pr_buf *b) {
  cJSON *o = cJSON_ParseWithLength(b->data, b->len);
  assert_non_null(o);
  return o;
}

static void test_answer_becomes_a_response(void **state) {
  (void)state;
  gw_resp r;
  cJSON_Delete(translate_ok(&r, "{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":4,\"temperature\":0}"));
  const char *chat = "{\"id\":\"c1\",\"object\":\"chat.completion\",\"model\":\"m-q4\",\"choices\":[{\"index\":0,"
                     "\"message\":{\"role\":\"assistant\",\"content\":\"Hello\",\"reasoning_content\":\"hmm\"},"
                     "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":4,"
                     "\"total_tokens\":11,\"prompt_tokens_details\":{\"cached_tokens\":3}}}";
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  assert_int_equal(gw_resp_whole(&r, chat, strlen(chat), &out), 0);
  cJSON *o = parse(&out);
  assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "response");
  assert_string_equal(cJSON_GetObjectItem(o, "status")->valuestring, "incomplete");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "incomplete_details"), "reason")->valuestring,
                      "max_output_tokens");
  assert_string_equal(cJSON_GetObjectItem(o, "model")->valuestring, "m-q4");
  assert_int_equal(cJSON_GetObjectItem(o, "max_output_tokens")->valueint, 4);
  assert_true(cJSON_GetObjectItem(o, "temperature")->valuedouble == 0);
  const cJSON *output = cJSON_GetObjectItem(o, "output");
  assert_int_equal(cJSON_GetArraySize(output), 2);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(output, 0), "type")->valuestring, "reasoning");
  const cJSON *m = cJSON_GetArrayItem(output, 1);
  assert_string_equal(cJSON_GetObjectItem(m, "type")->valuestring, "message");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "content"), 0), "text")->valuestring,
                      "Hello");
  const cJSON *u = cJSON_GetObjectItem(o, "usage");
  assert_int_equal(cJSON_GetObjectItem(u, "input_tokens")->valueint, 7);
  assert_int_equal(cJSON_GetObjectItem(u, "output_tokens")->valueint, 4);
  assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 11);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(u, "input_tokens_details"), "cached_tokens")->valueint, 3);
  cJSON_Delete(o);
  pr_buf_free(&out);
  gw_resp_free(&r);
}

/* The events' types in order, and that each carries its sequence number. */
static int events(const pr_buf *b, char types[][48], int max, cJSON **last) {
  int n = 0;
  const char *p = b->data, *end = b->data + b->len;
  while (p < end && n < max) {
    assert_true(strncmp(p, "event: ", 7) == 0);
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    snprintf(types[n], 48, "%.*s", (int)(nl - p - 7), p + 7);
    const char *d = nl + 1;
    assert_true(strncmp(d, "data: ", 6) == 0);
    const char *dnl = memchr(d, '\n', (size_t)(end - d));
    cJSON *o = cJSON_ParseWithLength(d + 6, (size_t)(dnl - d - 6));
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "type")->valuestring, types[n]);
    assert_int_equal(cJSON_GetObjectItem(o, "sequence_number")->valueint, n);
    if (last) {
      cJSON_Delete(*last);
      *last = o;
    } else {
      cJSON_Delete(o);
    }
    n++;
    p = dnl + 2;
  }
  return n;
}

static void test_stream_becomes_events(void **state) {
  (void)state;
  gw_resp r;
  cJSON_Delete(translate_ok(&r, "{\"model\":\"m\",\"input\":\"x\",\"stream\":true}"));
  static const char *const chunks[] = {
      "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}],\"model\":\"m\"}",
      "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think\"}}]}",
      "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}",
      "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}",
      "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}",
      "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}",
      "[DONE]",
  };
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++)
    assert_int_equal(gw_resp_chunk(&r, chunks[i], strlen(chunks[i]), &out), 0);
  char types[32][48];
  cJSON *last = NULL;
  int n = events(&out, types, 32, &last);
  static const char *const want[] = {
      "response.created", "response.in_progress", "response.output_item.added",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done", "response.completed"};
  assert_int_equal(n, (int)(sizeof(want) / sizeof(want[0])));
  for (int i = 0; i < n; i++) assert_string_equal(types[i], want[i]);
  const cJSON *resp = cJSON_GetObjectItem(last, "response");
  assert_string_equal(cJSON_GetObjectItem(resp, "status")->valuestring, "completed");
  const cJSON *output = cJSON_GetObjectItem(resp, "output");
  assert_int_equal(cJSON_GetArraySize(output), 2);
  const cJSON *m = cJSON_GetArrayItem(output, 1);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "content"), 0), "text")->valuestring,
                      "Hello");
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(resp, "usage"), "output_tokens")->valueint, 3);
  cJSON_Delete(last);
  /* a stream that fails: an error event, then response.failed */
  pr_buf_reset(&out);
  const char *err = "{\"error\":{\"message\":\"gone\",\"type\":\"server_error\",\"param\":null,\"code\":\"upstream_stream_error\"}}";
  assert_int_equal(gw_resp_fail(&r, err, strlen(err), &out), 0);
  cJSON *o = cJSON_ParseWithLength(strstr(out.data, "data: ") + 6, (size_t)(strchr(strstr(out.data, "data: "), '\n') - strstr(out.data, "data: ") - 6));
  assert_string_equal(cJSON_GetObjectItem(o, "type")->valuestring, "error");
  assert_string_equal(cJSON_GetObjectItem(o, "code")->valuestring, "upstream_stream_error");
  cJSON_Delete(o);
  assert_non_null(strstr(out.data, "event: response.failed\n"));
  pr_buf_free(&out);
  gw_resp_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_request_becomes_a_chat_completion),
      cmocka_unit_test(test_what_is_not_served_is_refused),
      cmocka_unit_test(test_answer_becomes_a_response),
      cmocka_unit_test(test_stream_becomes_events),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
