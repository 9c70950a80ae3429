/* Regression tests for hostile input the gateway once let through or tripped on, found
 * by tests/system/test_hostile.py and the libFuzzer targets in tests/fuzz/. The inputs
 * themselves live in tests/fuzz/regressions/ and the unit suite replays them through the
 * fuzz targets (tests/fuzz/meson.build); these tests check what a caller gets back.
 * Each test names the case it guards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "buf.h"
#include "err.h"
#include "multipart.h"
#include "oai.h"

/* Parse len bytes from an exact-size heap copy; returns the code, fills err. */
static int parse_n(const char *body, size_t len, pr_oai_error *err) {
  pr_oai_req r;
  char *copy = malloc(len ? len : 1);
  memcpy(copy, body, len);
  memset(err, 0, sizeof(*err));
  int rc = pr_oai_parse(&r, PR_OAI_CHAT, copy, len, err);
  pr_oai_free(&r);
  free(copy);
  return rc;
}

static int parse_content(const char *content, size_t clen, pr_oai_error *err) {
  pr_buf b;
  pr_buf_init(&b, 1 << 20);
  assert_int_equal(pr_buf_append_str(&b, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\""), 0);
  assert_int_equal(pr_buf_append(&b, content, clen), 0);
  assert_int_equal(pr_buf_append_str(&b, "\"}]}"), 0);
  int rc = parse_n(b.data, b.len, err);
  pr_buf_free(&b);
  return rc;
}

/* test_hostile.py utf8_*: cJSON passes any bytes through, and the phone's parser then
 * fails on them (after the request has reached it). */
static void test_invalid_utf8_is_refused(void **state) {
  (void)state;
  static const struct {
    const char *what, *bytes;
  } bad[] = {
    {"stray continuation", "a\x80z"},   {"invalid byte", "a\xffz"},
    {"overlong slash", "a\xc0\xafz"},   {"overlong 3-byte", "a\xe0\x80\xafz"},
    {"surrogate", "a\xed\xa0\x80z"},    {"above U+10FFFF", "a\xf4\x90\x80\x80z"},
    {"truncated", "a\xe2\x82"},         {"5-byte form", "a\xf8\x88\x80\x80\x80z"},
    {"lead then ASCII", "a\xc3z"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    pr_oai_error err;
    int rc = parse_content(bad[i].bytes, strlen(bad[i].bytes), &err);
    if (rc >= 0) fail_msg("%s: accepted", bad[i].what);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, "invalid_json");
    assert_non_null(strstr(err.message, "UTF-8"));
  }
  /* and every well-formed sequence still passes, up to U+10FFFF */
  static const char *const good[] = {"caf\xc3\xa9", "\xe2\x82\xac", "\xef\xbf\xbd",
                                     "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf"};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    pr_oai_error err;
    if (parse_content(good[i], strlen(good[i]), &err) < 0)
      fail_msg("valid UTF-8 #%zu refused: %s", i, err.message);
  }
}

/* test_hostile.py json_raw_control_char / json_raw_nul: RFC 8259 wants them escaped. */
static void test_raw_control_characters_in_strings_are_refused(void **state) {
  (void)state;
  pr_oai_error err;
  assert_true(parse_content("a\x01z", 3, &err) < 0);
  assert_string_equal(err.code, "invalid_json");
  assert_true(parse_content("a\0z", 3, &err) < 0);
  assert_true(parse_content("a\nz", 3, &err) < 0);
  /* escaped, they are fine; outside strings, whitespace is fine */
  const char *esc = "a\\u0001\\n\\t\\\\z";
  assert_int_equal(parse_content(esc, strlen(esc), &err), 0);
  const char *ws = "{\n\t\"model\" : \"m\",\r\n \"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
  assert_int_equal(parse_n(ws, strlen(ws), &err), 0);
}

/* test_hostile.py json_huge_array / json_many_messages: 2 MiB of "[0,0,..." became a
 * million cJSON values (~64 MiB) and was forwarded to the phone. */
static void test_too_many_json_values_are_refused(void **state) {
  (void)state;
  pr_buf b;
  pr_buf_init(&b, 8 << 20);
  assert_int_equal(pr_buf_append_str(&b, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"x\":[0"), 0);
  for (int i = 0; i < 100000; i++) assert_int_equal(pr_buf_append_str(&b, ",0"), 0);
  assert_int_equal(pr_buf_append_str(&b, "]}"), 0);
  pr_oai_error err;
  assert_true(parse_n(b.data, b.len, &err) < 0);
  assert_int_equal(err.status, 400);
  assert_non_null(strstr(err.message, "values"));
  /* commas and brackets inside strings are text, not values */
  pr_buf_reset(&b);
  assert_int_equal(pr_buf_append_str(&b, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\""), 0);
  for (int i = 0; i < 200000; i++) assert_int_equal(pr_buf_append_str(&b, ",[{"), 0);
  assert_int_equal(pr_buf_append_str(&b, "\\\",\"}]}"), 0);
  assert_int_equal(parse_n(b.data, b.len, &err), 0);
  pr_buf_free(&b);
}

/* The data of a body's parts, for the multipart cases. */
typedef struct mp_sink {
  char data[256];
  size_t len;
} mp_sink;

static int mp_on_data(void *ud, const char *p, size_t n) {
  mp_sink *s = ud;
  assert_true(s->len + n <= sizeof(s->data));
  memcpy(s->data + s->len, p, n);
  s->len += n;
  return 0;
}

/* Reads body (boundary "b") in pieces of `piece` bytes, each an exact-size copy, and
 * finishes; the code, and the message in err. */
static int mp_read(const char *body, size_t len, size_t piece, mp_sink *s, char *err, size_t errn) {
  static const pr_multipart_ops ops = {NULL, mp_on_data, NULL};
  pr_multipart m;
  memset(s, 0, sizeof(*s));
  pr_multipart_init(&m, "b", &ops, s);
  int rc = 0;
  for (size_t at = 0; at < len && !rc; at += piece) {
    size_t n = len - at < piece ? len - at : piece;
    char *copy = malloc(n);
    memcpy(copy, body + at, n);
    rc = pr_multipart_feed(&m, copy, n);
    free(copy);
  }
  if (!rc) rc = pr_multipart_finish(&m);
  snprintf(err, errn, "%s", pr_multipart_error(&m));
  return rc;
}

/* fuzz_multipart/held_dash_after_boundary: "\r\n--b-" held back at the end of a feed, then
 * a byte other than '-': the held '-' was delivered as a NUL (it is not in the delimiter
 * the held bytes are copied from). */
static void test_multipart_held_dash_is_data(void **state) {
  (void)state;
  static const char body[] = "--b\r\nContent-Disposition: form-data; name=a\r\n\r\n\r\n--b-x\r\n--b--";
  for (size_t piece = 1; piece < sizeof(body); piece++) {
    mp_sink s;
    char err[96];
    assert_int_equal(mp_read(body, sizeof(body) - 1, piece, &s, err, sizeof(err)), 0);
    assert_int_equal(s.len, 7);
    assert_memory_equal(s.data, "\r\n--b-x", 7);
  }
}

/* fuzz_multipart/preamble_bound_vs_bare_lf: a preamble past its bound, then a boundary
 * line ending in a bare LF, was PR_EPARSE read whole and PR_ETOOLARGE read in pieces (the
 * preamble was counted when delivered, and whole it was not delivered before the LF). */
static void test_multipart_error_does_not_depend_on_cuts(void **state) {
  (void)state;
  char body[1100];
  for (size_t pre = 1000; pre <= 1030; pre += 30) {
    memset(body, 'p', pre);
    memcpy(body + pre, "\r\n--b\n", 6);
    for (size_t piece = 1; piece <= pre + 6; piece++) {
      mp_sink s;
      char err[96];
      int rc = mp_read(body, pre + 6, piece, &s, err, sizeof(err));
      if (pre == 1000) {
        assert_int_equal(rc, PR_EPARSE);
        assert_string_equal(err, "boundary line ends in a bare LF (CRLF required)");
      } else {
        assert_int_equal(rc, PR_ETOOLARGE);
        assert_string_equal(err, "more than 1024 bytes before the first boundary line");
      }
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_invalid_utf8_is_refused),
    cmocka_unit_test(test_raw_control_characters_in_strings_are_refused),
    cmocka_unit_test(test_too_many_json_values_are_refused),
    cmocka_unit_test(test_multipart_held_dash_is_data),
    cmocka_unit_test(test_multipart_error_does_not_depend_on_cuts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
