/* proto/curlm.c against libuv: descriptors curl closes behind our back must not keep a
 * poll watcher that steals the events of whatever reuses the number. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <uv.h>

#include "curlm.h"

static pr_curlm *g_m;
static int g_done, g_read;

static void on_done(CURL *e, CURLcode rc, void *ud) {
  (void)rc;
  (void)ud;
  g_done = 1;
  pr_curlm_easy_release(g_m, e);
}

static void on_alloc(uv_handle_t *h, size_t n, uv_buf_t *b) {
  static char buf[64];
  (void)h;
  (void)n;
  *b = uv_buf_init(buf, sizeof(buf));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  (void)b;
  if (n > 0) g_read = 1;
  uv_read_stop(s);
}

static void on_timeout(uv_timer_t *t) { uv_stop(t->loop); }

static void noop_close(uv_handle_t *h) { (void)h; }

/* A transfer to a host name runs curl's threaded resolver, whose socketpair curl watches
 * through the socket callback and then closes itself (not through
 * CURLOPT_CLOSESOCKETFUNCTION). The next descriptor the process opens gets that number:
 * it must be read like any other (regression: a still-started poll handle on the old
 * number took its events, and a client accepted next was never read). */
static void test_resolver_descriptor_reuse(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(pr_curlm_new(&g_m, &loop), 0);
  CURL *e = pr_curlm_easy(g_m);
  assert_non_null(e);
  /* .invalid never resolves (RFC 6761); without DNS the lookup times out instead */
  curl_easy_setopt(e, CURLOPT_URL, "http://fleetgate-test.invalid:9/");
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 1500L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  assert_int_equal(pr_curlm_add(g_m, e, on_done, NULL), 0);
  for (int i = 0; i < 10000 && !g_done; i++) uv_run(&loop, UV_RUN_ONCE);
  assert_true(g_done);

  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  uv_pipe_t p;
  uv_pipe_init(&loop, &p, 0);
  assert_int_equal(uv_pipe_open(&p, sv[0]), 0);
  assert_int_equal(uv_read_start((uv_stream_t *)&p, on_alloc, on_read), 0);
  uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(write(sv[1], "hello", 5), 5);
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  uv_timer_start(&t, on_timeout, 2000, 0);
  for (int i = 0; i < 1000 && !g_read; i++) uv_run(&loop, UV_RUN_ONCE);
  assert_true(g_read);

  uv_timer_stop(&t);
  uv_close((uv_handle_t *)&t, noop_close);
  uv_close((uv_handle_t *)&p, noop_close);
  close(sv[1]);
  pr_curlm_close(g_m, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resolver_descriptor_reuse),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
