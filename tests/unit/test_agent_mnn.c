/* Unit tests for agent/mnn.c: MNN's stream normalised (finish_reason "" to null, the
 * cap enforced with a finish chunk, usage and [DONE]; a whole answer built for clients
 * that did not stream), its errors turned into OpenAI's object, and fake usage replaced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "buf.h"
#include "err.h"
#include "mnn.h"
#include "sse.h"

static const char *chunk(char *buf, size_t n, const char *content, const char *finish) {
  snprintf(buf, n,
           "{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"qwen\","
           "\"choices\":[{\"index\":0,\"delta\":{%s%s%s},\"finish_reason\":\"%s\"}]}",
           content ? "\"content\":\"" : "", content ? content : "", content ? "\"" : "", finish);
  return buf;
}

/* One MNN chunk into the normaliser (the chunk is built before its length is taken). */
static int feed(ag_mnn *m, const char *content, const char *finish, pr_buf *out) {
  char b[512];
  chunk(b, sizeof(b), content, finish);
  return ag_mnn_event(m, b, strlen(b), out);
}

/* The data payloads of the SSE events in out. */
typedef struct events {
  char *data[64];
  size_t n;
} events;

static int collect(void *ud, const pr_sse_event *ev) {
  events *e = ud;
  if (e->n < 64) e->data[e->n++] = strndup(ev->data, ev->data_len);
  return 0;
}

static void parse_events(const pr_buf *out, events *e) {
  pr_sse_parser p;
  memset(e, 0, sizeof(*e));
  pr_sse_init(&p, 1 << 20, collect, NULL, e);
  assert_int_equal(pr_sse_feed(&p, out->data ? out->data : "", out->len), 0);
  pr_sse_free(&p);
}

static void free_events(events *e) {
  for (size_t i = 0; i < e->n; i++) free(e->data[i]);
}

static void test_stream_cut_at_cap(void **state) {
  (void)state;
  ag_mnn m;
  pr_buf out;
  ag_mnn_init(&m, 1, 1, 1, 3, 40);
  pr_buf_init(&out, 1 << 20);
  assert_int_equal(feed(&m, " a", "", &out), 0);
  assert_int_equal(feed(&m, " b", "", &out), 0);
  assert_int_equal(feed(&m, " c", "", &out), 1);
  assert_true(m.complete);
  /* more from MNN is ignored */
  assert_int_equal(feed(&m, " d", "", &out), 1);
  events e;
  parse_events(&out, &e);
  assert_int_equal(e.n, 6); /* 3 chunks, finish, usage, [DONE] */
  for (int i = 0; i < 3; i++) {
    cJSON *o = cJSON_Parse(e.data[i]);
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")));
    cJSON_Delete(o);
  }
  cJSON *fin = cJSON_Parse(e.data[3]);
  const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(fin, "choices"), 0);
  assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "length");
  assert_string_equal(cJSON_GetObjectItem(fin, "id")->valuestring, "c1");
  assert_string_equal(cJSON_GetObjectItem(fin, "model")->valuestring, "qwen");
  cJSON_Delete(fin);
  cJSON *u = cJSON_Parse(e.data[4]);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(u, "choices")), 0);
  const cJSON *usage = cJSON_GetObjectItem(u, "usage");
  assert_int_equal(cJSON_GetObjectItem(usage, "prompt_tokens")->valueint, 40);
  assert_int_equal(cJSON_GetObjectItem(usage, "completion_tokens")->valueint, 3);
  assert_int_equal(cJSON_GetObjectItem(usage, "total_tokens")->valueint, 43);
  cJSON_Delete(u);
  assert_string_equal(e.data[5], "[DONE]");
  free_events(&e);
  pr_buf_free(&out);
  ag_mnn_free(&m);
}

static void test_stream_engine_finishes(void **state) {
  (void)state;
  ag_mnn m;
  pr_buf out;
  ag_mnn_init(&m, 1, 1, 0, -1, 10);
  pr_buf_init(&out, 1 << 20);
  assert_int_equal(feed(&m, "hi", "", &out), 0);
  assert_int_equal(feed(&m, NULL, "stop", &out), 0);
  assert_int_equal(ag_mnn_event(&m, "[DONE]", 6, &out), 1);
  events e;
  parse_events(&out, &e);
  assert_int_equal(e.n, 3); /* no usage without include_usage, no extra finish chunk */
  assert_non_null(strstr(e.data[1], "\"finish_reason\":\"stop\""));
  assert_string_equal(e.data[2], "[DONE]");
  free_events(&e);
  pr_buf_free(&out);
  ag_mnn_free(&m);
}

static void test_stream_eof(void **state) {
  (void)state;
  ag_mnn m;
  pr_buf out;
  /* clean EOF without [DONE] or a finish: closed properly */
  ag_mnn_init(&m, 1, 1, 0, -1, 10);
  pr_buf_init(&out, 1 << 20);
  feed(&m, "x", "", &out);
  assert_int_equal(ag_mnn_eof(&m, 1, &out), 0);
  events e;
  parse_events(&out, &e);
  assert_int_equal(e.n, 3);
  assert_non_null(strstr(e.data[1], "\"finish_reason\":\"stop\""));
  assert_string_equal(e.data[2], "[DONE]");
  free_events(&e);
  ag_mnn_free(&m);
  /* broken off: an error event, no [DONE] */
  pr_buf_reset(&out);
  ag_mnn_init(&m, 1, 1, 0, -1, 10);
  feed(&m, "x", "", &out);
  assert_int_equal(ag_mnn_eof(&m, 0, &out), 0);
  parse_events(&out, &e);
  assert_int_equal(e.n, 2);
  assert_non_null(strstr(e.data[1], "\"error\":{\"message\""));
  assert_int_equal(m.error_status, 502);
  free_events(&e);
  ag_mnn_free(&m);
  pr_buf_free(&out);
}

static void test_whole_answer(void **state) {
  (void)state;
  ag_mnn m;
  pr_buf out, body;
  ag_mnn_init(&m, 1, 0, 0, 2, 25);
  pr_buf_init(&out, 1 << 20);
  pr_buf_init(&body, 1 << 20);
  assert_int_equal(feed(&m, "Hello", "", &out), 0);
  assert_int_equal(feed(&m, " world", "", &out), 1);
  assert_int_equal(out.len, 0); /* nothing streamed */
  assert_int_equal(ag_mnn_whole(&m, &body), 0);
  cJSON *o = cJSON_Parse(body.data);
  assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
  const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content")->valuestring,
                      "Hello world");
  assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "length");
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "completion_tokens")->valueint, 2);
  cJSON_Delete(o);
  pr_buf_free(&out);
  pr_buf_free(&body);
  ag_mnn_free(&m);
}

static void test_errors(void **state) {
  (void)state;
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  static const char mnn[] = "{\"error\":\"context too long\"}";
  assert_int_equal(ag_mnn_error_body(400, mnn, sizeof(mnn) - 1, &out), 0);
  cJSON *o = cJSON_Parse(out.data);
  const cJSON *e = cJSON_GetObjectItem(o, "error");
  assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring, "context too long");
  assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(e, "param")));
  assert_non_null(cJSON_GetObjectItem(e, "code"));
  cJSON_Delete(o);
  pr_buf_reset(&out);
  assert_int_equal(ag_mnn_error_body(503, "Loading model\nmore", 18, &out), 0);
  assert_non_null(strstr(out.data, "\"message\":\"Loading model\""));
  assert_non_null(strstr(out.data, "\"type\":\"unavailable_error\""));
  assert_non_null(strstr(out.data, "\"code\":\"model_loading\""));
  pr_buf_free(&out);
}

/* A refusal that quotes the request (llama.cpp's "Failed to parse messages: ...;
 * messages = [...]") reaches the client whole, in OpenAI's shape, with the status. */
static void test_long_error_kept_whole(void **state) {
  (void)state;
  char msg[4096];
  memset(msg, 'm', sizeof(msg) - 1);
  msg[sizeof(msg) - 1] = '\0';
  cJSON *in = cJSON_CreateObject();
  cJSON_AddStringToObject(in, "error", msg);
  char *body = cJSON_PrintUnformatted(in);
  cJSON_Delete(in);
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  assert_int_equal(ag_mnn_error_body(500, body, strlen(body), &out), 0);
  cJSON *o = cJSON_Parse(out.data);
  const cJSON *e = cJSON_GetObjectItem(o, "error");
  assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring, msg);
  assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "server_error");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(e, "param")));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(e, "code")));
  cJSON_Delete(o);
  free(body);
  pr_buf_free(&out);
}

static void test_fix_whole_fake_usage(void **state) {
  (void)state;
  ag_mnn m;
  pr_buf out;
  static const char body[] =
      "{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
      "\"assistant\",\"content\":\"abcdefgh\"},\"finish_reason\":\"\"}],\"usage\":{\"prompt_tokens\":0,"
      "\"completion_tokens\":0,\"total_tokens\":0}}";
  ag_mnn_init(&m, 1, 0, 0, -1, 12);
  pr_buf_init(&out, 1 << 20);
  assert_int_equal(ag_mnn_fix_whole(&m, body, sizeof(body) - 1, &out), 0);
  cJSON *o = cJSON_Parse(out.data);
  const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "stop");
  const cJSON *u = cJSON_GetObjectItem(o, "usage");
  assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 12);
  assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 2);
  cJSON_Delete(o);
  pr_buf_free(&out);
  ag_mnn_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_stream_cut_at_cap),
    cmocka_unit_test(test_stream_engine_finishes),
    cmocka_unit_test(test_stream_eof),
    cmocka_unit_test(test_whole_answer),
    cmocka_unit_test(test_errors),
    cmocka_unit_test(test_long_error_kept_whole),
    cmocka_unit_test(test_fix_whole_fake_usage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
