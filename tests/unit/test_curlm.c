/* proto/curlm.c against libuv: descriptors curl closes behind our back must not keep a
 * poll watcher that steals the events of whatever reuses the number. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
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
  g_done = 1;
  pr_curlm_easy_release(g_m, e);
  /* a transfer may end inside a timer's callback: libuv 1.44's UV_RUN_ONCE would then go
   * on to wait for I/O that never comes */
  if (ud) uv_stop(ud);
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
  assert_int_equal(pr_curlm_add(g_m, e, on_done, &loop), 0);
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


/* Poll handles still started on a descriptor that is no longer open. libuv adds a
 * started handle to epoll at the next turn of the loop and aborts when the descriptor is
 * gone (EBADF); one already added would take the events of whatever reuses the number. */
static void count_stale(uv_handle_t *h, void *arg) {
  if (h->type != UV_POLL || !uv_is_active(h) || uv_is_closing(h)) return;
  uv_os_fd_t fd;
  if (uv_fileno(h, &fd) == 0 && fcntl(fd, F_GETFD) == -1) ++*(int *)arg;
}

/* A connection refused: curl watches its socket for the connect, removes it, and closes
 * it without CURLOPT_CLOSESOCKETFUNCTION. Regression: the socket, taken for a kept-alive
 * connection, stayed polled after the remove, and at the next turn libuv aborted in
 * epoll_ctl (seen at a gateway's shutdown, while a phone that had stopped was probed). */
static void test_refused_connect_leaves_no_poll_on_a_closed_descriptor(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(pr_curlm_new(&g_m, &loop), 0);
  /* a port nobody listens on: bound, then closed */
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(getsockname(l, (struct sockaddr *)&a, &al), 0);
  close(l);
  char url[64];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/health", ntohs(a.sin_port));
  for (int n = 0; n < 20; n++) {
    g_done = 0;
    CURL *e = pr_curlm_easy(g_m);
    assert_non_null(e);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 1500L);
    assert_int_equal(pr_curlm_add(g_m, e, on_done, &loop), 0);
    for (int i = 0; i < 10000 && !g_done; i++) {
      uv_run(&loop, UV_RUN_ONCE);
      int stale = 0;
      uv_walk(&loop, count_stale, &stale);
      assert_int_equal(stale, 0);
    }
    assert_true(g_done);
  }
  pr_curlm_close(g_m, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* The same for a transfer cancelled while it connects (a gateway shutting down, a client
 * that left): curl closes a socket whose connect has not finished without telling
 * anyone ("never published"), after or before removing it. The connect is held pending
 * by a loopback listener whose backlog is full and which never accepts. */
static void test_cancel_while_connecting_leaves_no_poll_on_a_closed_descriptor(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(pr_curlm_new(&g_m, &loop), 0);
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(l, 0), 0);
  assert_int_equal(getsockname(l, (struct sockaddr *)&a, &al), 0);
  int fill[4];
  for (int i = 0; i < 4; i++) { /* the backlog: later SYNs are dropped, connects hang */
    fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    (void)!connect(fill[i], (struct sockaddr *)&a, sizeof(a));
  }
  usleep(100 * 1000);
  char url[64];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/", ntohs(a.sin_port));
  for (int n = 0; n < 10; n++) {
    g_done = 0;
    CURL *e = pr_curlm_easy(g_m);
    assert_non_null(e);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 20000L);
    assert_int_equal(pr_curlm_add(g_m, e, on_done, &loop), 0);
    for (int i = 0; i < 5; i++) uv_run(&loop, UV_RUN_NOWAIT); /* connecting */
    assert_false(g_done);
    pr_curlm_cancel(g_m, e);
    pr_curlm_easy_release(g_m, e);
    int stale = 0;
    uv_walk(&loop, count_stale, &stale);
    assert_int_equal(stale, 0);
    uv_run(&loop, UV_RUN_NOWAIT); /* libuv's epoll_ctl for what is still started */
  }
  pr_curlm_close(g_m, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  for (int i = 0; i < 4; i++) close(fill[i]);
  close(l);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resolver_descriptor_reuse),
      cmocka_unit_test(test_refused_connect_leaves_no_poll_on_a_closed_descriptor),
      cmocka_unit_test(test_cancel_while_connecting_leaves_no_poll_on_a_closed_descriptor),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
