/* Unit tests for proto/multipart.c: an OpenAI SDK upload read whole, a byte at a time and
 * cut at every point gives the same parts; data that looks like a delimiter but is not;
 * the boundary parameter; the bounds; callbacks that stop; sticky errors. */
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

/* Everything the callbacks saw as one string: "<name|filename|ctype>" per part (NULL as
 * "~"), its data as delivered, "<.>" at its end; so runs compare with one strcmp. */
typedef struct rec {
  pr_buf log;
  int begins, datas, ends;
  size_t data_bytes;
  int stop_begin, stop_data, stop_end; /* return 1 from that callback's nth call; 0 never */
  int in_part;
} rec;

static int on_begin(void *ud, const char *name, const char *filename, const char *ctype) {
  rec *r = ud;
  assert_false(r->in_part);
  assert_non_null(name);
  assert_int_equal(pr_buf_appendf(&r->log, "<%s|%s|%s>", name, filename ? filename : "~",
                                  ctype ? ctype : "~"), 0);
  r->in_part = 1;
  return ++r->begins == r->stop_begin;
}

static int on_data(void *ud, const char *data, size_t len) {
  rec *r = ud;
  assert_true(r->in_part);
  assert_true(len > 0);
  assert_int_equal(pr_buf_append(&r->log, data, len), 0);
  r->data_bytes += len;
  return ++r->datas == r->stop_data;
}

static int on_end(void *ud) {
  rec *r = ud;
  assert_true(r->in_part);
  r->in_part = 0;
  assert_int_equal(pr_buf_append_str(&r->log, "<.>"), 0);
  return ++r->ends == r->stop_end;
}

static const pr_multipart_ops ops = {on_begin, on_data, on_end};

static void rec_init(rec *r) {
  memset(r, 0, sizeof(*r));
  pr_buf_init(&r->log, 8 << 20);
}

/* Feeds s in pieces cut at the given offsets (sorted), each an exact-size heap copy so
 * ASan sees a read past a piece, then finishes. Returns the first error or finish's. */
static int feed_cut(pr_multipart *m, const char *s, size_t n, const size_t *cuts, size_t ncuts) {
  size_t at = 0;
  for (size_t i = 0; i <= ncuts; i++) {
    size_t end = i < ncuts ? cuts[i] : n;
    size_t len = end - at;
    char *piece = malloc(len ? len : 1);
    memcpy(piece, s + at, len);
    int rc = pr_multipart_feed(m, piece, len);
    free(piece);
    if (rc) return rc;
    at = end;
  }
  return pr_multipart_finish(m);
}

static char *run_cut(const char *boundary, const char *s, size_t n, const size_t *cuts,
                     size_t ncuts, int *rc) {
  rec r;
  rec_init(&r);
  pr_multipart m;
  pr_multipart_init(&m, boundary, &ops, &r);
  *rc = feed_cut(&m, s, n, cuts, ncuts);
  if (*rc == 0) assert_string_equal(pr_multipart_error(&m), "");
  else assert_true(pr_multipart_error(&m)[0] != '\0');
  char *log = pr_buf_steal(&r.log, NULL);
  return log ? log : strdup("");
}

static char *run(const char *boundary, const char *s, int *rc) {
  return run_cut(boundary, s, strlen(s), NULL, 0, rc);
}

/* The code and message of a body read whole. */
static int run_error(const char *boundary, const char *s, char *msg, size_t msg_n) {
  rec r;
  rec_init(&r);
  pr_multipart m;
  pr_multipart_init(&m, boundary, &ops, &r);
  int rc = pr_multipart_feed(&m, s, strlen(s));
  if (!rc) rc = pr_multipart_finish(&m);
  snprintf(msg, msg_n, "%s", pr_multipart_error(&m));
  pr_buf_free(&r.log);
  return rc;
}

/* What openai-python (httpx) sends for files.create with expires_after. */
#define HB "0d8a1f3e6b2c4a97b5e1c2d3f4a5b6c7"
static const char sdk_body[] =
    "--" HB "\r\n"
    "Content-Disposition: form-data; name=\"purpose\"\r\n"
    "\r\n"
    "batch\r\n"
    "--" HB "\r\n"
    "Content-Disposition: form-data; name=\"expires_after[anchor]\"\r\n"
    "\r\n"
    "created_at\r\n"
    "--" HB "\r\n"
    "Content-Disposition: form-data; name=\"expires_after[seconds]\"\r\n"
    "\r\n"
    "3600\r\n"
    "--" HB "\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"batch.jsonl\"\r\n"
    "Content-Type: application/jsonl\r\n"
    "\r\n"
    "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\"}\n"
    "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\"}\n"
    "\r\n"
    "--" HB "--\r\n";

static void test_sdk_upload(void **state) {
  int rc;
  char *log = run(HB, sdk_body, &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log,
      "<purpose|~|~>batch<.>"
      "<expires_after[anchor]|~|~>created_at<.>"
      "<expires_after[seconds]|~|~>3600<.>"
      "<file|batch.jsonl|application/jsonl>"
      "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\"}\n"
      "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\"}\n<.>");
  free(log);
}

/* openai-node sends through undici's FormData: a boundary of dashes and digits, the file
 * as application/octet-stream. */
#define NB "----formdata-undici-094315268761"
static void test_node_upload(void **state) {
  static const char body[] =
      "--" NB "\r\n"
      "Content-Disposition: form-data; name=\"purpose\"\r\n"
      "\r\n"
      "fine-tune\r\n"
      "--" NB "\r\n"
      "Content-Disposition: form-data; name=\"file\"; filename=\"train.jsonl\"\r\n"
      "Content-Type: application/octet-stream\r\n"
      "\r\n"
      "{\"messages\":[]}\r\n"
      "--" NB "--";
  int rc;
  char *log = run(NB, body, &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log, "<purpose|~|~>fine-tune<.>"
                           "<file|train.jsonl|application/octet-stream>{\"messages\":[]}<.>");
  free(log);
}

/* Part data that holds delimiter look-alikes: CRLF "--" boundary followed by something
 * else than CRLF or "--", the delimiter less its last byte, after a bare LF or without
 * its CRLF, and data that ends in a CR or "-" right before the real delimiter. (Data
 * ending in CRLF "--" boundary would itself be a delimiter: senders pick a boundary that
 * is not in the data.) */
#define TB "----b0undary"
static const char *const tricky_data[] = {
    "",
    "\r\n",
    "\r\n--\r\n",
    "\r\n--" TB "X",
    "\r\n-" TB "\r\n",
    "\r\n--" TB "-x",
    "\r\n--" TB "\rZ",
    "\r\n--" TB " \r\n",           /* no transport padding */
    "\n--" TB "\r\n",               /* a bare LF */
    "--" TB "\r\n",                  /* right after the headers' CRLFCRLF */
    "\r\n--" TB "\n",
    "\r\r\r\n--" TB "-\r",           /* ends in a CR before the delimiter */
    "\r\n---" TB,                    /* one dash too many */
    "\r\n------b0undar\r\n--" TB "\r",
    "\r\r\r",
    "--" TB "--\r\n--" TB "-",
};
#define NTRICKY (sizeof(tricky_data) / sizeof(tricky_data[0]))

static void tricky_body(pr_buf *body, pr_buf *want, int preamble) {
  pr_buf_init(body, 1 << 20);
  pr_buf_init(want, 1 << 20);
  if (preamble) pr_buf_text(body, "This is a preamble.\r\n--" TB "x\r\n-- " TB "\r\n");
  for (size_t i = 0; i < NTRICKY; i++) {
    pr_buf_text(body, "--" TB "\r\nContent-Disposition: form-data; name=\"p%zu\"%s\r\n%s\r\n",
                i, i % 2 ? "; filename=\"f.bin\"" : "",
                i % 3 ? "Content-Type: application/octet-stream\r\n" : "");
    pr_buf_text(body, "%s\r\n", tricky_data[i]);
    pr_buf_text(want, "<p%zu|%s|%s>%s<.>", i, i % 2 ? "f.bin" : "~",
                i % 3 ? "application/octet-stream" : "~", tricky_data[i]);
  }
  pr_buf_text(body, "--" TB "--\r\nepilogue\r\n--" TB "\r\n");
  assert_false(body->cut);
  assert_false(want->cut);
}

static void test_tricky_data_whole(void **state) {
  for (int pre = 0; pre <= 1; pre++) {
    pr_buf body, want;
    tricky_body(&body, &want, pre);
    int rc;
    char *log = run_cut(TB, body.data, body.len, NULL, 0, &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(log, want.data);
    free(log);
    pr_buf_free(&body);
    pr_buf_free(&want);
  }
}

static void check_splits(const char *boundary, const char *s, size_t n, const char *want) {
  int rc;
  /* two pieces, cut at every offset */
  for (size_t cut = 0; cut <= n; cut++) {
    char *log = run_cut(boundary, s, n, &cut, 1, &rc);
    if (rc != 0 || strcmp(log, want) != 0) fail_msg("differs when cut at %zu (rc %d)", cut, rc);
    free(log);
  }
  /* three pieces, at every offset, the middle one a few bytes or about a delimiter long
   * (so a delimiter can start in one piece, span one and end in the next) */
  size_t dl = 4 + strlen(boundary);
  const size_t mid[] = {1, 2, 3, dl - 1, dl, dl + 1, dl + 2};
  for (size_t a = 0; a <= n; a++) {
    for (size_t j = 0; j < sizeof(mid) / sizeof(mid[0]) && a + mid[j] <= n; j++) {
      size_t cuts[2] = {a, a + mid[j]};
      char *log = run_cut(boundary, s, n, cuts, 2, &rc);
      if (rc != 0 || strcmp(log, want) != 0) fail_msg("differs when cut at %zu, %zu", a, cuts[1]);
      free(log);
    }
  }
  /* a byte at a time */
  size_t *cuts = malloc(n * sizeof(*cuts));
  for (size_t i = 0; i + 1 < n; i++) cuts[i] = i + 1;
  char *log = run_cut(boundary, s, n, cuts, n - 1, &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log, want);
  free(log);
  free(cuts);
}

static void test_tricky_data_every_split(void **state) {
  for (int pre = 0; pre <= 1; pre++) {
    pr_buf body, want;
    tricky_body(&body, &want, pre);
    check_splits(TB, body.data, body.len, want.data);
    pr_buf_free(&body);
    pr_buf_free(&want);
  }
}

static void test_sdk_every_split(void **state) {
  int rc;
  char *want = run(HB, sdk_body, &rc);
  assert_int_equal(rc, 0);
  check_splits(HB, sdk_body, strlen(sdk_body), want);
  free(want);
}

/* A part is never held whole: a 1 MiB file fed in 16 KiB pieces reaches the caller in
 * about as many pieces, byte for byte, and the reader is one small struct. */
static void test_streams_large_part(void **state) {
  assert_true(sizeof(pr_multipart) < 4096);
  const size_t size = 1 << 20, piece = 16 << 10;
  pr_buf body;
  pr_buf_init(&body, size + 4096);
  pr_buf_text(&body, "--" TB "\r\nContent-Disposition: form-data; name=\"file\"; "
                     "filename=\"big.bin\"\r\n\r\n");
  size_t head = body.len;
  uint32_t x = 12345;
  for (size_t i = 0; i < size; i++) {
    x = x * 1103515245u + 12345u;
    char c = (char)(x >> 16);
    pr_buf_bytes(&body, i % 1000 == 0 ? "\r" : &c, 1); /* plenty of CRs to match on */
  }
  pr_buf_text(&body, "\r\n--" TB "--\r\n");
  assert_false(body.cut);
  rec r;
  rec_init(&r);
  pr_multipart m;
  pr_multipart_init(&m, TB, &ops, &r);
  for (size_t at = 0; at < body.len; at += piece) {
    size_t n = body.len - at < piece ? body.len - at : piece;
    assert_int_equal(pr_multipart_feed(&m, body.data + at, n), 0);
  }
  assert_int_equal(pr_multipart_finish(&m), 0);
  assert_int_equal(r.data_bytes, size);
  assert_int_equal(r.ends, 1);
  /* one call per piece, plus a few where a held CR is given back */
  assert_true(r.datas <= (int)(body.len / piece) * 3 + 3);
  const char *log = pr_buf_cstr(&r.log);
  size_t lhead = strlen("<file|big.bin|~>");
  assert_memory_equal(log + lhead, body.data + head, size);
  pr_buf_free(&r.log);
  pr_buf_free(&body);
}

static void test_boundary_param(void **state) {
  char b[PR_MULTIPART_BOUNDARY_MAX + 1];
  static const struct {
    const char *ct, *want;
  } good[] = {
      {"multipart/form-data; boundary=abc", "abc"},
      {"multipart/form-data; boundary=\"abc\"", "abc"},
      {"Multipart/Form-Data; BOUNDARY=abc", "abc"},
      {"  multipart/form-data ;boundary = abc ; charset=utf-8", "abc"},
      {"multipart/form-data; charset=utf-8; boundary=" NB, NB},
      {"multipart/form-data; boundary=\"a b:c=d?e/f,g(h)'+_.\"", "a b:c=d?e/f,g(h)'+_."},
      {"multipart/form-data; boundary=\"a\\bc\"", "abc"},
      {"multipart/form-data; boundary====_Part_1", "===_Part_1"},
      {"multipart/form-data; boundary=x;", "x"},
      {"multipart/form-data; boundary=1234567890123456789012345678901234567890123456789012345678"
       "901234567890",
       "1234567890123456789012345678901234567890123456789012345678901234567890"},
  };
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    memset(b, 'z', sizeof(b));
    int rc = pr_multipart_boundary(good[i].ct, b, sizeof(b));
    if (rc) fail_msg("%s: %d", good[i].ct, rc);
    assert_string_equal(b, good[i].want);
  }
  static const char *const bad[] = {
      NULL,
      "",
      "multipart/form-data",
      "multipart/form-data;",
      "multipart/form-data; boundary=",
      "multipart/form-data; boundary=\"\"",
      "multipart/form-data; boundary=\"abc",
      "multipart/form-data; boundary=\"abc \"",     /* ends in a space */
      "multipart/form-data; boundary=a\"b",
      "multipart/form-data; boundary=ab\x01",
      "multipart/form-data; boundary=a\xc3\xa9",
      "multipart/form-data; boundary=a*b",
      "multipart/form-data; boundary=\"a\rb\"",
      "multipart/form-data; boundary=\"a\nb\"",
      "multipart/form-data; boundary=a; boundary=a", /* twice */
      "multipart/form-data; boundary=a b",
      "multipart/form-data boundary=a",
      "multipart/form-dataX; boundary=a",
      "multipart/mixed; boundary=a",
      "application/x-www-form-urlencoded",
      "multipart/form-data; =a",
      "multipart/form-data; boundary",
      "multipart/form-data; boundary=12345678901234567890123456789012345678901234567890123456789"
      "0123456789012",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int rc = pr_multipart_boundary(bad[i], b, sizeof(b));
    if (rc != PR_EPARSE) fail_msg("bad #%zu (%s) gave %d", i, bad[i] ? bad[i] : "NULL", rc);
  }
  /* an output too small for it */
  assert_int_equal(pr_multipart_boundary("multipart/form-data; boundary=abc", b, 3), PR_ETOOLARGE);
  assert_int_equal(pr_multipart_boundary("multipart/form-data; boundary=abc", b, 4), 0);
}

static void test_invalid_boundary_at_init(void **state) {
  static const char *const bad[] = {NULL, "", "a\r", "ends ", "x\ny",
      "12345678901234567890123456789012345678901234567890123456789012345678901"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    rec r;
    rec_init(&r);
    pr_multipart m;
    pr_multipart_init(&m, bad[i], &ops, &r);
    assert_int_equal(pr_multipart_feed(&m, "--a\r\n", 5), PR_EPARSE);
    assert_int_equal(pr_multipart_finish(&m), PR_EPARSE);
    assert_string_equal(pr_multipart_error(&m), "invalid boundary");
    pr_buf_free(&r.log);
  }
}

#define PART(h, d) "--b\r\n" h "\r\n\r\n" d "\r\n"

static void test_headers(void **state) {
  int rc;
  /* quoted-pair escapes undone, percent escapes kept, filename* ignored, unquoted
   * values, header and parameter names in any case, blanks around values trimmed */
  char *log = run("b",
      PART("content-disposition: Form-Data; NAME=purpose", "x")
      PART("Content-Disposition: form-data; name=\"file\"; filename=\"a\\\"b\\\\c %22d.jsonl\"", "y")
      PART("Content-Disposition: form-data; name=\"f\"; filename*=UTF-8''%e2%82%ac.txt;"
           " filename=\"e.txt\"\r\nCONTENT-TYPE:   text/plain; charset=utf-8  ", "z")
      PART("Content-Disposition: form-data; name=\"g\"; filename*=UTF-8''x.txt", "")
      PART("Content-Disposition:form-data;name=\"h\";filename=\"\"\r\nContent-Type:", "w")
      PART("X-Other: whatever\r\nContent-Disposition: form-data ; name = \"i\" ; size=3;\r\n"
           "Content-Transfer-Encoding: base64", "v")
      PART("Content-Disposition: form-data; name=\"caf\xc3\xa9\"; filename=\"\xe2\x82\xac\tx\"", "")
      "--b--",
      &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log,
      "<purpose|~|~>x<.>"
      "<file|a\"b\\c %22d.jsonl|~>y<.>"
      "<f|e.txt|text/plain; charset=utf-8>z<.>"
      "<g|~|~><.>"
      "<h||>w<.>"
      "<i|~|~>v<.>"
      "<caf\xc3\xa9|\xe2\x82\xac\tx|~><.>");
  free(log);

  /* 255 bytes of name and filename fit; 256 do not */
  char big[2048], msg[128];
  char v255[256], v256[257];
  memset(v255, 'n', 255);
  v255[255] = '\0';
  memset(v256, 'n', 256);
  v256[256] = '\0';
  snprintf(big, sizeof(big), PART("Content-Disposition: form-data; name=\"%s\"; filename=\"%s\"",
                                   "") "--b--", v255, v255);
  log = run("b", big, &rc);
  assert_int_equal(rc, 0);
  free(log);
  snprintf(big, sizeof(big), PART("Content-Disposition: form-data; name=\"%s\"", "") "--b--", v256);
  assert_int_equal(run_error("b", big, msg, sizeof(msg)), PR_ETOOLARGE);
  assert_string_equal(msg, "part 1: name longer than 255 bytes");
  snprintf(big, sizeof(big), PART("Content-Disposition: form-data; name=a; filename=%s", "") "--b--",
           v256);
  assert_int_equal(run_error("b", big, msg, sizeof(msg)), PR_ETOOLARGE);
  assert_string_equal(msg, "part 1: filename longer than 255 bytes");
  snprintf(big, sizeof(big), PART("Content-Disposition: form-data; name=a\r\nContent-Type: %s", "")
           "--b--", v256);
  assert_int_equal(run_error("b", big, msg, sizeof(msg)), PR_ETOOLARGE);
  assert_string_equal(msg, "part 1: Content-Type longer than 255 bytes");
  /* an ignored parameter may be longer */
  snprintf(big, sizeof(big), PART("Content-Disposition: form-data; name=a; filename*=%s", "")
           "--b--", v256);
  log = run("b", big, &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log, "<a|~|~><.>");
  free(log);
}

static void test_bad_headers(void **state) {
  static const struct {
    const char *body, *msg;
  } bad[] = {
      {PART("Content-Type: text/plain", "x") "--b--", "part 1: no Content-Disposition header"},
      {PART("Content-Disposition: form-data", "x") "--b--", "part 1: no name in Content-Disposition"},
      {PART("Content-Disposition: form-data; filename=\"a\"", "x") "--b--",
       "part 1: no name in Content-Disposition"},
      {PART("Content-Disposition: form-data; name=\"\"", "x") "--b--",
       "part 1: empty name in Content-Disposition"},
      {PART("Content-Disposition: form-data; name=a", "x")
       PART("Content-Disposition: attachment; name=b", "x") "--b--",
       "part 2: Content-Disposition is not form-data"},
      {PART("Content-Disposition: form-datas; name=b", "x") "--b--",
       "part 1: Content-Disposition is not form-data"},
      {PART("Content-Disposition: form-data; name=a; name=b", "x") "--b--",
       "part 1: two name parameters"},
      {PART("Content-Disposition: form-data; name=a; filename=b; FILENAME=c", "x") "--b--",
       "part 1: two FILENAME parameters"},
      {PART("Content-Disposition: form-data; name=a\r\nContent-Disposition: form-data; name=a", "x")
       "--b--", "part 1: two Content-Disposition headers"},
      {PART("Content-Disposition: form-data; name=a\r\nContent-Type: a/b\r\ncontent-type: a/b", "x")
       "--b--", "part 1: two Content-Type headers"},
      {PART("Content-Disposition: form-data; name=\"a", "x") "--b--",
       "part 1: malformed Content-Disposition"},
      {PART("Content-Disposition: form-data; name=a\"b", "x") "--b--",
       "part 1: malformed Content-Disposition"},
      {PART("Content-Disposition: form-data; name", "x") "--b--", "part 1: malformed Content-Disposition"},
      {PART("Content-Disposition: form-data; name=", "x") "--b--", "part 1: malformed Content-Disposition"},
      {PART("Content-Disposition: form-data; name=a b", "x") "--b--",
       "part 1: malformed Content-Disposition"},
      {PART("Content-Disposition: form-data; name=\"a\\", "x") "--b--",
       "part 1: malformed Content-Disposition"},
      {PART("Content-Disposition: form-data;\r\n name=a", "x") "--b--", "part 1: folded header line"},
      {PART("Content-Disposition form-data; name=a", "x") "--b--", "part 1: malformed header line"},
      {PART(": form-data; name=a", "x") "--b--", "part 1: malformed header line"},
      {PART("Content Disposition: form-data; name=a", "x") "--b--", "part 1: malformed header line"},
      {PART("Content-Disposition: form-data; name=\"a\x01\"", "x") "--b--",
       "part 1: control character in a header"},
      {PART("Content-Disposition: form-data; name=\"a\x7f\"", "x") "--b--",
       "part 1: control character in a header"},
      {"--b\r\nContent-Disposition: form-data; name=a\n\r\nx\r\n--b--",
       "part 1: header line ends in a bare LF (CRLF required)"},
      {"--b\r\nContent-Disposition: form-data; name=a\r\n\nx\r\n--b--",
       "part 1: header line ends in a bare LF (CRLF required)"},
      {"--b\r\nContent-Disposition: form-data; name=a\rX\r\n\r\nx\r\n--b--",
       "part 1: CR without LF in the headers"},
      {"--b\nContent-Disposition: form-data; name=a\n\nx\n--b--\n",
       "boundary line ends in a bare LF (CRLF required)"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char msg[128];
    int rc = run_error("b", bad[i].body, msg, sizeof(msg));
    if (rc != PR_EPARSE || strcmp(msg, bad[i].msg) != 0)
      fail_msg("bad #%zu: %d \"%s\", want \"%s\"", i, rc, msg, bad[i].msg);
  }
  /* a NUL byte in a header, which strlen-based input cannot carry */
  static const char nul[] = "--b\r\nContent-Disposition: form-data; name=\"a\0\"\r\n\r\n\r\n--b--";
  int rc;
  char *log = run_cut("b", nul, sizeof(nul) - 1, NULL, 0, &rc);
  assert_int_equal(rc, PR_EPARSE);
  free(log);
}

/* LF-only bodies are refused at the first boundary line; an LF "delimiter" inside CRLF
 * data is data. */
static void test_line_endings(void **state) {
  int rc;
  char *log = run("b", PART("Content-Disposition: form-data; name=a", "1\n--b\n2\n--b--\n3") "--b--", &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log, "<a|~|~>1\n--b\n2\n--b--\n3<.>");
  free(log);
  char msg[128];
  assert_int_equal(run_error("b", "pre\r\n--b\n", msg, sizeof(msg)), PR_EPARSE);
  assert_string_equal(msg, "boundary line ends in a bare LF (CRLF required)");
}

static void test_preamble(void **state) {
  int rc;
  /* "--b" at the start of a line but followed by other bytes, or without the CRLF in
   * front, is preamble */
  char *log = run("b", "--bx\r\n--b \r\n\n--b\r\nx--b\r\n" PART("Content-Disposition: form-data; name=a", "1")
                  "--b--", &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log, "<a|~|~>1<.>");
  free(log);
  /* an empty line before the first boundary */
  log = run("b", "\r\n" PART("Content-Disposition: form-data; name=a", "1") "--b--", &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log, "<a|~|~>1<.>");
  free(log);
  /* 1024 bytes of preamble (the CRLF before the boundary is the delimiter's) are skipped;
   * one more byte is too many */
  char body[2048];
  for (int extra = 0; extra <= 1; extra++) {
    size_t n = 1024 + (size_t)extra;
    memset(body, 'p', n);
    snprintf(body + n, sizeof(body) - n, "\r\n" PART("Content-Disposition: form-data; name=a", "1")
             "--b--");
    char msg[128];
    rc = run_error("b", body, msg, sizeof(msg));
    if (!extra) {
      assert_int_equal(rc, 0);
    } else {
      assert_int_equal(rc, PR_ETOOLARGE);
      assert_string_equal(msg, "more than 1024 bytes before the first boundary line");
    }
  }
  /* and a long preamble is refused while it arrives, not at the end */
  rec r;
  rec_init(&r);
  pr_multipart m;
  pr_multipart_init(&m, "b", &ops, &r);
  int got = 0;
  for (int i = 0; i < 100 && !got; i++) got = pr_multipart_feed(&m, "0123456789\r\n--b-", 16);
  assert_int_equal(got, PR_ETOOLARGE);
  pr_buf_free(&r.log);
}

static void test_truncated(void **state) {
  static const struct {
    const char *body, *msg;
  } cut[] = {
      {"", "no boundary line in the body"},
      {"preamble only", "no boundary line in the body"},
      {"--b", "no boundary line in the body"},
      {"--b\r", "no boundary line in the body"},
      {"--b\r\n", "part 1: the body ends in the part's headers"},
      {"--b\r\nContent-Disposition: form-data; name=a\r\n", "part 1: the body ends in the part's headers"},
      {"--b\r\nContent-Disposition: form-data; name=a\r\n\r", "part 1: the body ends in the part's headers"},
      {PART("Content-Disposition: form-data; name=a", "data"), "part 1: the body ends before the closing boundary"},
      {PART("Content-Disposition: form-data; name=a", "data") "--b", "part 1: the body ends before the closing boundary"},
      {PART("Content-Disposition: form-data; name=a", "data") "--b-", "part 1: the body ends before the closing boundary"},
      {PART("Content-Disposition: form-data; name=a", "data") "--b\r", "part 1: the body ends before the closing boundary"},
      {PART("Content-Disposition: form-data; name=a", "data") "--b\r\n", "part 2: the body ends in the part's headers"},
      {PART("Content-Disposition: form-data; name=a", "data") "--bb--", "part 1: the body ends before the closing boundary"},
  };
  for (size_t i = 0; i < sizeof(cut) / sizeof(cut[0]); i++) {
    char msg[128];
    int rc = run_error("b", cut[i].body, msg, sizeof(msg));
    if (rc != PR_EPARSE || strcmp(msg, cut[i].msg) != 0)
      fail_msg("cut #%zu: %d \"%s\", want \"%s\"", i, rc, msg, cut[i].msg);
  }
  /* The unfinished part got no part_end, and its held-back "\r\n--b" was not delivered. */
  int rc;
  char *log = run("b", PART("Content-Disposition: form-data; name=a", "data") "--b", &rc);
  assert_int_equal(rc, PR_EPARSE);
  assert_string_equal(log, "<a|~|~>data");
  free(log);
}

static void test_epilogue_and_empty_forms(void **state) {
  int rc;
  char *log = run("b", PART("Content-Disposition: form-data; name=a", "1")
                  "--b--\r\nanything\r\n--b\r\nContent-Disposition: form-data; name=z\r\n\r\n\x01\n", &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log, "<a|~|~>1<.>");
  free(log);
  /* a closing boundary right away: no parts, which the caller refuses if it wants one */
  log = run("b", "--b--", &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log, "");
  free(log);
  /* empty data, and data that is only CRLF */
  log = run("b", "--b\r\nContent-Disposition: form-data; name=a\r\n\r\n\r\n--b\r\n"
                 "Content-Disposition: form-data; name=c\r\n\r\n\r\n\r\n--b--", &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(log, "<a|~|~><.><c|~|~>\r\n<.>");
  free(log);
}

static void test_header_bounds(void **state) {
  char body[16384], msg[128];
  char line[1100];
  /* a 1024-byte header line fits, 1025 does not */
  for (int extra = 0; extra <= 1; extra++) {
    size_t n = 1024 + (size_t)extra - strlen("X-Pad: ");
    memset(line, 'x', n);
    line[n] = '\0';
    snprintf(body, sizeof(body), PART("Content-Disposition: form-data; name=a", "1")
             PART("X-Pad: %s\r\nContent-Disposition: form-data; name=b", "2") "--b--", line);
    int rc = run_error("b", body, msg, sizeof(msg));
    if (!extra) {
      assert_int_equal(rc, 0);
    } else {
      assert_int_equal(rc, PR_ETOOLARGE);
      assert_string_equal(msg, "part 2: header line longer than 1024 bytes");
    }
  }
  /* 8192 bytes of header block (CRLFs and the empty line counted) fit, 8193 do not */
  for (int extra = 0; extra <= 1; extra++) {
    size_t at = 0;
    at += (size_t)snprintf(body + at, sizeof(body) - at, "--b\r\n");
    size_t block = 0;
    const char *cd = "Content-Disposition: form-data; name=a\r\n";
    at += (size_t)snprintf(body + at, sizeof(body) - at, "%s", cd);
    block += strlen(cd);
    /* lines of 1000 bytes + CRLF until what is left fits one shorter line */
    while (8192 - block - 2 > 1002) {
      memset(line, 'x', 1000);
      memcpy(line, "X-Pad: ", 7);
      line[1000] = '\0';
      at += (size_t)snprintf(body + at, sizeof(body) - at, "%s\r\n", line);
      block += 1002;
    }
    size_t last = 8192 - block - 2 - 2 + (size_t)extra; /* its CRLF, and the empty line */
    memset(line, 'y', last);
    memcpy(line, "X-Pad: ", 7);
    line[last] = '\0';
    at += (size_t)snprintf(body + at, sizeof(body) - at, "%s\r\n\r\ndata\r\n--b--", line);
    int rc = run_error("b", body, msg, sizeof(msg));
    if (!extra) {
      assert_int_equal(rc, 0);
    } else {
      assert_int_equal(rc, PR_ETOOLARGE);
      assert_string_equal(msg, "part 1: headers longer than 8192 bytes");
    }
  }
}

static void test_part_count(void **state) {
  char body[4096], msg[128];
  for (int parts = 16; parts <= 17; parts++) {
    size_t at = 0;
    for (int i = 0; i < parts; i++)
      at += (size_t)snprintf(body + at, sizeof(body) - at,
                             PART("Content-Disposition: form-data; name=p%d", "v"), i);
    snprintf(body + at, sizeof(body) - at, "--b--");
    int rc = run_error("b", body, msg, sizeof(msg));
    if (parts == 16) {
      assert_int_equal(rc, 0);
    } else {
      assert_int_equal(rc, PR_ETOOLARGE);
      assert_string_equal(msg, "more than 16 parts");
    }
  }
}

static void test_callbacks_stop(void **state) {
  const char *body = PART("Content-Disposition: form-data; name=a", "1")
                     PART("Content-Disposition: form-data; name=b; filename=x", "2") "--b--";
  for (int which = 0; which < 3; which++) {
    rec r;
    rec_init(&r);
    if (which == 0) r.stop_begin = 2;
    if (which == 1) r.stop_data = 2;
    if (which == 2) r.stop_end = 1;
    pr_multipart m;
    pr_multipart_init(&m, "b", &ops, &r);
    assert_int_equal(pr_multipart_feed(&m, body, strlen(body)), PR_ECLOSED);
    const char *want[] = {"<a|~|~>1<.><b|x|~>", "<a|~|~>1<.><b|x|~>2", "<a|~|~>1<.>"};
    assert_string_equal(pr_buf_cstr(&r.log), want[which]);
    assert_non_null(strstr(pr_multipart_error(&m), "stopped"));
    /* sticky: nothing more is delivered */
    int calls = r.begins + r.datas + r.ends;
    assert_int_equal(pr_multipart_feed(&m, "--b--", 5), PR_ECLOSED);
    assert_int_equal(pr_multipart_finish(&m), PR_ECLOSED);
    assert_int_equal(r.begins + r.datas + r.ends, calls);
    pr_buf_free(&r.log);
  }
  /* NULL callbacks, and NULL ops, read the body all the same */
  pr_multipart_ops none = {NULL, NULL, NULL};
  pr_multipart m;
  pr_multipart_init(&m, "b", &none, NULL);
  assert_int_equal(pr_multipart_feed(&m, body, strlen(body)), 0);
  assert_int_equal(pr_multipart_finish(&m), 0);
  pr_multipart_init(&m, "b", NULL, NULL);
  assert_int_equal(pr_multipart_feed(&m, body, strlen(body)), 0);
  assert_int_equal(pr_multipart_finish(&m), 0);
}

static void test_errors_sticky(void **state) {
  rec r;
  rec_init(&r);
  pr_multipart m;
  pr_multipart_init(&m, "b", &ops, &r);
  const char *bad = "--b\r\nContent-Disposition: form-data\r\n\r\n";
  assert_int_equal(pr_multipart_feed(&m, bad, strlen(bad)), PR_EPARSE);
  char msg[128];
  snprintf(msg, sizeof(msg), "%s", pr_multipart_error(&m));
  assert_string_equal(msg, "part 1: no name in Content-Disposition");
  const char *good = PART("Content-Disposition: form-data; name=a", "1") "--b--";
  assert_int_equal(pr_multipart_feed(&m, good, strlen(good)), PR_EPARSE);
  assert_int_equal(pr_multipart_feed(&m, "", 0), PR_EPARSE);
  assert_int_equal(pr_multipart_finish(&m), PR_EPARSE);
  assert_string_equal(pr_multipart_error(&m), msg);
  assert_int_equal(r.begins, 0);
  /* a truncation found by finish is sticky too */
  pr_multipart_init(&m, "b", &ops, &r);
  assert_int_equal(pr_multipart_feed(&m, "--b\r\n", 5), 0);
  assert_int_equal(pr_multipart_finish(&m), PR_EPARSE);
  assert_int_equal(pr_multipart_feed(&m, "--b--", 5), PR_EPARSE);
  /* after a good finish, more bytes are epilogue */
  pr_multipart_init(&m, "b", &ops, &r);
  assert_int_equal(pr_multipart_feed(&m, good, strlen(good)), 0);
  assert_int_equal(pr_multipart_finish(&m), 0);
  assert_int_equal(pr_multipart_feed(&m, "junk", 4), 0);
  assert_int_equal(pr_multipart_finish(&m), 0);
  pr_buf_free(&r.log);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sdk_upload),
      cmocka_unit_test(test_node_upload),
      cmocka_unit_test(test_tricky_data_whole),
      cmocka_unit_test(test_tricky_data_every_split),
      cmocka_unit_test(test_sdk_every_split),
      cmocka_unit_test(test_streams_large_part),
      cmocka_unit_test(test_boundary_param),
      cmocka_unit_test(test_invalid_boundary_at_init),
      cmocka_unit_test(test_headers),
      cmocka_unit_test(test_bad_headers),
      cmocka_unit_test(test_line_endings),
      cmocka_unit_test(test_preamble),
      cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_epilogue_and_empty_forms),
      cmocka_unit_test(test_header_bounds),
      cmocka_unit_test(test_part_count),
      cmocka_unit_test(test_callbacks_stop),
      cmocka_unit_test(test_errors_sticky),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
