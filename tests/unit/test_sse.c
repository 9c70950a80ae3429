/* Unit tests for proto/sse.c: a real llama-server stream parsed whole, one byte at a
 * time and cut at every byte gives the same events; LF, CRLF and CR endings; comments;
 * multi-line data; the WHATWG dispatch rules; and the caps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "buf.h"
#include "err.h"
#include "sse.h"

/* chat-stream.http's body (llama-server, stream_options.include_usage), with a
 * keep-alive comment as newer builds send during long prefill. */
static const char stream_fixture[] =
    ": keep-alive\n"
    "\n"
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"role\":\"assistant\","
    "\"content\":null}}],\"created\":1795976416,\"id\":\"chatcmpl-KaWQU4o1dQ8V11PHPOFkQWP9dPijkOIO\","
    "\"model\":\"tiny.gguf\",\"system_fingerprint\":\"b0-unknown\",\"object\":\"chat.completion.chunk\"}\n"
    "\n"
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\" \xd1\x80\xd0\xb0\xd0\xb7\xd0\xbb\xd0\xb8\"}}],"
    "\"created\":1795976416,\"id\":\"chatcmpl-KaWQU4o1dQ8V11PHPOFkQWP9dPijkOIO\",\"model\":\"tiny.gguf\","
    "\"system_fingerprint\":\"b0-unknown\",\"object\":\"chat.completion.chunk\"}\n"
    "\n"
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\" Hin\"}}],"
    "\"created\":1795976416,\"id\":\"chatcmpl-KaWQU4o1dQ8V11PHPOFkQWP9dPijkOIO\",\"model\":\"tiny.gguf\","
    "\"system_fingerprint\":\"b0-unknown\",\"object\":\"chat.completion.chunk\"}\n"
    "\n"
    "data: {\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"delta\":{}}],\"created\":1795976416,"
    "\"id\":\"chatcmpl-KaWQU4o1dQ8V11PHPOFkQWP9dPijkOIO\",\"model\":\"tiny.gguf\","
    "\"system_fingerprint\":\"b0-unknown\",\"object\":\"chat.completion.chunk\"}\n"
    "\n"
    "data: {\"choices\":[],\"created\":1795976416,\"id\":\"chatcmpl-KaWQU4o1dQ8V11PHPOFkQWP9dPijkOIO\","
    "\"model\":\"tiny.gguf\",\"system_fingerprint\":\"b0-unknown\",\"object\":\"chat.completion.chunk\","
    "\"usage\":{\"completion_tokens\":4,\"prompt_tokens\":30,\"total_tokens\":34,"
    "\"prompt_tokens_details\":{\"cached_tokens\":29}},\"timings\":{\"cache_n\":29,\"prompt_n\":1,"
    "\"prompt_ms\":0.676,\"prompt_per_token_ms\":0.676,\"prompt_per_second\":1479.2899408284022,"
    "\"predicted_n\":4,\"predicted_ms\":0.785,\"predicted_per_token_ms\":0.19625,"
    "\"predicted_per_second\":5095.541401273885}}\n"
    "\n"
    "data: [DONE]\n"
    "\n";

/* Named events, ids and multi-line data: a line ending counted twice would split
 * these events, which single-line data events would not reveal. */
static const char multi_fixture[] =
    ": comment\n"
    "event: note\n"
    "id: 41\n"
    "data: line one\n"
    "data:\n"
    "data: line three\n"
    "\n"
    "data: {\"a\":1}\n"
    "data: {\"b\":2}\n"
    "\n";

/* Everything the callbacks saw, as text: "E<event>|<id>|<data>\n" per event and
 * "C<text>\n" per comment, so runs can be compared with one string compare. */
typedef struct rec {
  pr_buf log;
  int events, comments;
  int stop_after; /* return 1 from the callback at this event; 0: never */
} rec;

static int on_event(void *ud, const pr_sse_event *ev) {
  rec *r = ud;
  assert_int_equal(strlen(ev->data), ev->data_len);
  assert_int_equal(pr_buf_appendf(&r->log, "E%s|%s|", ev->event, ev->id), 0);
  assert_int_equal(pr_buf_append(&r->log, ev->data, ev->data_len), 0);
  assert_int_equal(pr_buf_append(&r->log, "\n", 1), 0);
  r->events++;
  return r->stop_after && r->events == r->stop_after ? 1 : 0;
}

static int on_comment(void *ud, const char *text, size_t len) {
  rec *r = ud;
  assert_int_equal(pr_buf_append(&r->log, "C", 1), 0);
  assert_int_equal(pr_buf_append(&r->log, text, len), 0);
  assert_int_equal(pr_buf_append(&r->log, "\n", 1), 0);
  r->comments++;
  return 0;
}

static void rec_init(rec *r) {
  memset(r, 0, sizeof(*r));
  pr_buf_init(&r->log, 1 << 20);
}

/* Feeds `s` in pieces cut at the given offsets (sorted, may be empty). Each piece is an
 * exact-size heap copy so ASan sees reads past a feed's end. */
static int feed_cut(pr_sse_parser *p, const char *s, size_t n, const size_t *cuts, size_t ncuts) {
  size_t at = 0;
  for (size_t i = 0; i <= ncuts; i++) {
    size_t end = i < ncuts ? cuts[i] : n;
    size_t len = end - at;
    char *piece = malloc(len ? len : 1);
    memcpy(piece, s + at, len);
    int rc = pr_sse_feed(p, piece, len);
    free(piece);
    if (rc) return rc;
    at = end;
  }
  return 0;
}

static char *run(const char *s, size_t n, const size_t *cuts, size_t ncuts, size_t max, int *rc,
                 int *events) {
  rec r;
  rec_init(&r);
  pr_sse_parser p;
  pr_sse_init(&p, max, on_event, on_comment, &r);
  *rc = feed_cut(&p, s, n, cuts, ncuts);
  if (events) *events = r.events;
  pr_sse_free(&p);
  return pr_buf_steal(&r.log, NULL);
}

static char *run_whole(const char *s, int *events) {
  int rc;
  char *log = run(s, strlen(s), NULL, 0, 1 << 16, &rc, events);
  assert_int_equal(rc, 0);
  return log;
}

static void test_fixture_whole(void **state) {
  int events;
  char *log = run_whole(stream_fixture, &events);
  assert_int_equal(events, 6);
  assert_non_null(strstr(log, "C keep-alive\n"));
  /* Data lose their "data: " prefix; the last is [DONE]. */
  assert_non_null(strstr(log, "E||{\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"role\""));
  size_t n = strlen(log);
  assert_true(n > 12);
  assert_string_equal(log + n - strlen("E||[DONE]\n"), "E||[DONE]\n");
  assert_non_null(strstr(log, "\"cached_tokens\":29"));
  free(log);
}

static void test_fixture_byte_at_a_time(void **state) {
  int events;
  char *whole = run_whole(stream_fixture, NULL);
  size_t n = strlen(stream_fixture);
  size_t *cuts = malloc(n * sizeof(*cuts));
  for (size_t i = 0; i < n - 1; i++) cuts[i] = i + 1;
  int rc;
  char *log = run(stream_fixture, n, cuts, n - 1, 1 << 16, &rc, &events);
  assert_int_equal(rc, 0);
  assert_int_equal(events, 6);
  assert_string_equal(log, whole);
  free(log);
  free(cuts);
  free(whole);
}

static void check_every_split(const char *fixture) {
  char *whole = run_whole(fixture, NULL);
  size_t n = strlen(fixture);
  for (size_t cut = 0; cut <= n; cut++) {
    int rc;
    char *log = run(fixture, n, &cut, 1, 1 << 16, &rc, NULL);
    assert_int_equal(rc, 0);
    if (strcmp(log, whole) != 0) fail_msg("differs when cut at %zu", cut);
    free(log);
  }
  free(whole);
}

static void test_fixture_every_split(void **state) {
  check_every_split(stream_fixture);
  check_every_split(multi_fixture);
}

static void test_multi_fixture(void **state) {
  int events;
  char *log = run_whole(multi_fixture, &events);
  assert_int_equal(events, 2);
  assert_string_equal(log, "C comment\nEnote|41|line one\n\nline three\nE|41|{\"a\":1}\n{\"b\":2}\n");
  free(log);
}

/* The same stream with CRLF or CR endings, cut at every point, reads the same. */
static char *convert_endings(const char *s, const char *nl) {
  pr_buf b;
  pr_buf_init(&b, 1 << 20);
  for (; *s; s++) {
    if (*s == '\n') assert_int_equal(pr_buf_append_str(&b, nl), 0);
    else assert_int_equal(pr_buf_append(&b, s, 1), 0);
  }
  return pr_buf_steal(&b, NULL);
}

static void check_endings_of(const char *fixture, const char *nl) {
  char *whole = run_whole(fixture, NULL);
  char *conv = convert_endings(fixture, nl);
  size_t n = strlen(conv);
  for (size_t cut = 0; cut <= n; cut++) {
    int rc;
    char *log = run(conv, n, &cut, 1, 1 << 16, &rc, NULL);
    assert_int_equal(rc, 0);
    if (strcmp(log, whole) != 0) fail_msg("differs when cut at %zu", cut);
    free(log);
  }
  /* And a byte at a time, where each CR and LF of a CRLF arrive in separate feeds. */
  size_t *cuts = malloc(n * sizeof(*cuts));
  for (size_t i = 0; i < n - 1; i++) cuts[i] = i + 1;
  int rc;
  char *log = run(conv, n, cuts, n - 1, 1 << 16, &rc, NULL);
  assert_string_equal(log, whole);
  free(log);
  free(cuts);
  free(conv);
  free(whole);
}

static void check_endings(const char *nl) {
  check_endings_of(stream_fixture, nl);
  check_endings_of(multi_fixture, nl);
}

static void test_crlf(void **state) { check_endings("\r\n"); }
static void test_cr(void **state) { check_endings("\r"); }

static void test_mixed_endings(void **state) {
  int events;
  /* CR CR is two line ends (a blank line), CRLF one, LF one. */
  char *log = run_whole("data: a\r\rdata: b\r\n\r\ndata: c\n\r\n", &events);
  assert_int_equal(events, 3);
  assert_string_equal(log, "E||a\nE||b\nE||c\n");
  free(log);
}

static void test_multiline_and_fields(void **state) {
  int events;
  char *log = run_whole("event: update\n"
                        "id: 7\n"
                        "data: first\n"
                        "data:second\n"
                        "data:  third\n"
                        "data\n"
                        "retry: 1000\n"
                        "unknown: x\n"
                        "\n",
                        &events);
  assert_int_equal(events, 1);
  /* One leading space is stripped, not two; a bare "data" adds an empty line. */
  assert_string_equal(log, "Eupdate|7|first\nsecond\n third\n\n");
  free(log);
}

static void test_event_name_resets_id_persists(void **state) {
  char *log = run_whole("event: a\nid: 1\ndata: x\n\ndata: y\n\nid\ndata: z\n\n", NULL);
  /* The event name belongs to one event; the id is the stream's last event ID until a
   * later "id" line (here an empty one) replaces it. */
  assert_string_equal(log, "Ea|1|x\nE|1|y\nE||z\n");
  free(log);
}

static void test_no_data_no_event(void **state) {
  int events;
  /* Blank lines alone, and an event with a name but no data, dispatch nothing; the
   * name does not leak into the next event. */
  char *log = run_whole("\n\n\nevent: ping\n\ndata: x\n\n", &events);
  assert_int_equal(events, 1);
  assert_string_equal(log, "E||x\n");
  free(log);
  /* "data:" with nothing after it is an event with empty data. */
  log = run_whole("data:\n\n", &events);
  assert_int_equal(events, 1);
  assert_string_equal(log, "E||\n");
  free(log);
  /* An event not ended by a blank line is not dispatched. */
  log = run_whole("data: partial\n", &events);
  assert_int_equal(events, 0);
  free(log);
}

static void test_comments(void **state) {
  int events;
  char *log = run_whole(":\n: ping\n:x:y\ndata: a\n: inside\ndata: b\n\n", &events);
  assert_int_equal(events, 1);
  /* Comment text is everything after the colon; comments do not break an event. */
  assert_string_equal(log, "C\nC ping\nCx:y\nC inside\nE||a\nb\n");
  free(log);
  /* Without a comment callback, comments are skipped. */
  rec r;
  rec_init(&r);
  pr_sse_parser p;
  pr_sse_init(&p, 1024, on_event, NULL, &r);
  assert_int_equal(pr_sse_feed(&p, ": hi\ndata: z\n\n", 14), 0);
  assert_string_equal(pr_buf_cstr(&r.log), "E||z\n");
  pr_sse_free(&p);
  pr_buf_free(&r.log);
}

static void test_callback_stops(void **state) {
  rec r;
  rec_init(&r);
  r.stop_after = 2;
  pr_sse_parser p;
  pr_sse_init(&p, 1024, on_event, on_comment, &r);
  const char *s = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
  assert_int_equal(pr_sse_feed(&p, s, strlen(s)), 1);
  assert_int_equal(r.events, 2);
  pr_sse_free(&p);
  pr_buf_free(&r.log);
}

static void test_line_cap(void **state) {
  int rc, events;
  /* 16 bytes per line: "data: " + 10 fits, + 11 does not, whole or cut. */
  char *log = run("data: 0123456789\n\n", 18, NULL, 0, 16, &rc, &events);
  assert_int_equal(rc, 0);
  assert_int_equal(events, 1);
  free(log);
  log = run("data: 0123456789A\n\n", 19, NULL, 0, 16, &rc, &events);
  assert_int_equal(rc, PR_ETOOLARGE);
  assert_int_equal(events, 0);
  free(log);
  size_t cut = 3;
  log = run("data: 0123456789A\n\n", 19, &cut, 1, 16, &rc, &events);
  assert_int_equal(rc, PR_ETOOLARGE);
  free(log);
  /* A line that never ends is refused once it passes the cap, not buffered forever. */
  rec r;
  rec_init(&r);
  pr_sse_parser p;
  pr_sse_init(&p, 16, on_event, on_comment, &r);
  int got = 0;
  for (int i = 0; i < 100 && !got; i++) got = pr_sse_feed(&p, "xxxx", 4);
  assert_int_equal(got, PR_ETOOLARGE);
  assert_true(p.line.len <= 16);
  pr_sse_free(&p);
  pr_buf_free(&r.log);
}

static void test_event_cap(void **state) {
  int rc, events;
  /* Each line fits in 16 bytes but the joined data (6 + 1 + 6 + 1 + 6 = 20) does not. */
  const char *s = "data: 012345\ndata: 012345\ndata: 012345\n\n";
  char *log = run(s, strlen(s), NULL, 0, 16, &rc, &events);
  assert_int_equal(rc, PR_ETOOLARGE);
  assert_int_equal(events, 0);
  free(log);
  /* 6 + 1 + 6 = 13 fits. */
  s = "data: 012345\ndata: 012345\n\n";
  log = run(s, strlen(s), NULL, 0, 16, &rc, &events);
  assert_int_equal(rc, 0);
  assert_int_equal(events, 1);
  free(log);
}

static void test_reset(void **state) {
  rec r;
  rec_init(&r);
  pr_sse_parser p;
  pr_sse_init(&p, 1024, on_event, on_comment, &r);
  /* A half-received event, then the stream restarts elsewhere. */
  assert_int_equal(pr_sse_feed(&p, "event: e\nid: 9\ndata: old\nda", 27), 0);
  pr_sse_reset(&p);
  assert_int_equal(pr_sse_feed(&p, "data: new\n\n", 11), 0);
  assert_string_equal(pr_buf_cstr(&r.log), "E||new\n");
  /* A CR pending at reset does not swallow the next stream's first LF. */
  pr_buf_reset(&r.log);
  assert_int_equal(pr_sse_feed(&p, "data: a\r", 8), 0);
  pr_sse_reset(&p);
  assert_int_equal(pr_sse_feed(&p, "\ndata: b\n\n", 10), 0);
  assert_string_equal(pr_buf_cstr(&r.log), "E||b\n");
  pr_sse_free(&p);
  pr_buf_free(&r.log);
}

static void test_write_data(void **state) {
  pr_buf out;
  pr_buf_init(&out, 1024);
  const char *json = "{\"choices\":[]}";
  assert_int_equal(pr_sse_write_data(&out, json, strlen(json)), 0);
  assert_string_equal(pr_buf_cstr(&out), "data: {\"choices\":[]}\n\n");
  assert_int_equal(pr_sse_write_data(&out, "[DONE]", 6), 0);
  assert_string_equal(pr_buf_cstr(&out), "data: {\"choices\":[]}\n\ndata: [DONE]\n\n");
  pr_buf_reset(&out);
  /* Line breaks in the payload become separate data lines and read back the same. */
  assert_int_equal(pr_sse_write_data(&out, "a\nb\r\nc", 6), 0);
  assert_string_equal(pr_buf_cstr(&out), "data: a\ndata: b\ndata: c\n\n");
  int events;
  char *log = run_whole(pr_buf_cstr(&out), &events);
  assert_string_equal(log, "E||a\nb\nc\n");
  free(log);
  pr_buf_free(&out);
  /* Past the cap the output buffer is left as it was. */
  pr_buf_init(&out, 12);
  assert_int_equal(pr_sse_write_data(&out, "x", 1), 0);
  assert_int_equal(pr_sse_write_data(&out, "y", 1), PR_ETOOLARGE);
  assert_string_equal(pr_buf_cstr(&out), "data: x\n\n");
  pr_buf_free(&out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_fixture_whole),
    cmocka_unit_test(test_fixture_byte_at_a_time),
    cmocka_unit_test(test_fixture_every_split),
    cmocka_unit_test(test_multi_fixture),
    cmocka_unit_test(test_crlf),
    cmocka_unit_test(test_cr),
    cmocka_unit_test(test_mixed_endings),
    cmocka_unit_test(test_multiline_and_fields),
    cmocka_unit_test(test_event_name_resets_id_persists),
    cmocka_unit_test(test_no_data_no_event),
    cmocka_unit_test(test_comments),
    cmocka_unit_test(test_callback_stops),
    cmocka_unit_test(test_line_cap),
    cmocka_unit_test(test_event_cap),
    cmocka_unit_test(test_reset),
    cmocka_unit_test(test_write_data),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
