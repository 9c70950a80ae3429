/* proto/curlreq.c: what a request built from options puts on the wire (method, path,
 * headers and bearer in order, body), what it refuses (file://), timeouts, and the
 * ownership rule: status is read before close, close leaves nothing behind, a handle
 * from the pool carries nothing of its last request. A scripted server in a thread
 * echoes each request back (or hangs up, or stalls). */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <uv.h>

#include "buf.h"
#include "curlm.h"
#include "curlreq.h"

/* ---- the scripted server ----------------------------------------------------------- */

enum { SRV_ECHO, SRV_HANG_UP, SRV_STALL, SRV_KEEP };
static int srv_fd = -1, srv_port;
static volatile int srv_mode;
static volatile int srv_accepted; /* connections the server saw */
static pthread_t srv_thread;

/* Read one request (headers, then Content-Length bytes of body) into buf. */
static size_t srv_read_request(int c, char *buf, size_t cap) {
  size_t n = 0;
  char *end = NULL;
  while (n < cap - 1 && !(end = strstr(buf, "\r\n\r\n"))) {
    ssize_t k = recv(c, buf + n, cap - 1 - n, 0);
    if (k <= 0) return n;
    n += (size_t)k;
    buf[n] = '\0';
  }
  if (!end) return n;
  const char *cl = strcasestr(buf, "\r\nContent-Length:");
  size_t want = (size_t)(end + 4 - buf) + (cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0);
  while (n < want && n < cap - 1) {
    ssize_t k = recv(c, buf + n, cap - 1 - n, 0);
    if (k <= 0) break;
    n += (size_t)k;
  }
  buf[n] = '\0';
  return n;
}

/* SRV_KEEP: one connection's requests, each answered "ok" and the connection kept, until
 * the client closes it. */
static void *srv_keep(void *arg) {
  int c = (int)(intptr_t)arg;
  char req[4096];
  for (;;) {
    req[0] = '\0';
    if (srv_read_request(c, req, sizeof(req)) == 0) break;
    static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    if (send(c, ok, sizeof(ok) - 1, MSG_NOSIGNAL) < 0) break;
  }
  close(c);
  return NULL;
}

static void *srv_main(void *arg) {
  (void)arg;
  for (;;) {
    int c = accept(srv_fd, NULL, NULL);
    if (c < 0) return NULL; /* the test shut the listener */
    srv_accepted++;
    if (srv_mode == SRV_KEEP) {
      pthread_t t;
      if (pthread_create(&t, NULL, srv_keep, (void *)(intptr_t)c) != 0) close(c);
      else pthread_detach(t);
      continue;
    }
    static char req[65536];
    req[0] = '\0';
    size_t n = srv_read_request(c, req, sizeof(req));
    if (srv_mode == SRV_ECHO) {
      char head[128];
      int hl = snprintf(head, sizeof(head),
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                        "Connection: close\r\n\r\n", n);
      if (send(c, head, (size_t)hl, MSG_NOSIGNAL) < 0 || send(c, req, n, MSG_NOSIGNAL) < 0) {
        /* the client gave up: nothing to tell */
      }
    } else if (srv_mode == SRV_STALL) {
      char b[64];
      while (recv(c, b, sizeof(b), 0) > 0) {
      } /* until the client gives up */
    }
    close(c); /* SRV_HANG_UP: no status line at all */
  }
}

static int srv_start(void **state) {
  (void)state;
  srv_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  if (srv_fd < 0 || bind(srv_fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(srv_fd, 8) < 0 ||
      getsockname(srv_fd, (struct sockaddr *)&a, &al) < 0)
    return -1;
  srv_port = ntohs(a.sin_port);
  return pthread_create(&srv_thread, NULL, srv_main, NULL);
}

static int srv_stop(void **state) {
  (void)state;
  shutdown(srv_fd, SHUT_RDWR);
  pthread_join(srv_thread, NULL);
  close(srv_fd);
  return 0;
}

static char base_url[64];
static const char *base(void) {
  snprintf(base_url, sizeof(base_url), "http://127.0.0.1:%d", srv_port);
  return base_url;
}

static size_t collect(char *data, size_t size, size_t nmemb, void *ud) {
  return pr_buf_append(ud, data, size * nmemb) == 0 ? size * nmemb : 0;
}

/* Run q to its end outside any multi (blocking; the server is another thread). */
static CURLcode perform(pr_curlreq *q) { return curl_easy_perform(q->easy); }

/* ---- what goes on the wire ---------------------------------------------------------- */

static void test_get_with_headers_and_bearer(void **state) {
  (void)state;
  srv_mode = SRV_ECHO;
  pr_buf got;
  pr_buf_init(&got, 1 << 20);
  const char *const lines[] = {"X-One: 1", "Expect:", NULL};
  const pr_curlreq_opts o = {.base = base(), .path = "/v1/models?x=1", .headers = lines,
                             .bearer = "tok-123", .write_fn = collect, .write_ud = &got,
                             .user_agent = "fleetgate-test/1", .http11 = 1};
  pr_curlreq q = {0};
  assert_int_equal(pr_curlreq_open(&q, NULL, &o), 0);
  assert_non_null(q.easy);
  assert_int_equal(pr_curlreq_status(&q), 0); /* nothing ran yet */
  assert_int_equal(perform(&q), CURLE_OK);
  assert_int_equal(pr_curlreq_status(&q), 200);
  const char *s = pr_buf_cstr(&got);
  assert_true(strncmp(s, "GET /v1/models?x=1 HTTP/1.1\r\n", 29) == 0);
  const char *one = strstr(s, "\r\nX-One: 1\r\n"), *auth = strstr(s, "\r\nAuthorization: Bearer tok-123\r\n");
  assert_non_null(one);
  assert_non_null(auth);
  assert_true(one < auth); /* the bearer comes after the caller's lines */
  assert_non_null(strstr(s, "\r\nUser-Agent: fleetgate-test/1\r\n"));
  assert_null(strstr(s, "Expect"));
  pr_curlreq_close(&q, NULL);
  assert_null(q.easy);
  assert_null(q.hdrs);
  assert_int_equal(pr_curlreq_status(&q), 0);
  pr_curlreq_close(&q, NULL); /* twice is harmless */
  pr_buf_free(&got);
}

static void test_methods_and_bodies(void **state) {
  (void)state;
  srv_mode = SRV_ECHO;
  static const struct {
    const char *method, *body, *want_line, *want_body;
  } cases[] = {
      {NULL, "hello", "POST /p HTTP/1.1\r\n", "\r\n\r\nhello"},  /* a body means POST */
      {"POST", NULL, "POST /p HTTP/1.1\r\n", "Content-Length: 0"}, /* POST without one */
      {"PUT", "{}", "PUT /p HTTP/1.1\r\n", "\r\n\r\n{}"},
      {"DELETE", NULL, "DELETE /p HTTP/1.1\r\n", "Content-Length: 0"},
      {"GET", "ignored", "GET /p HTTP/1.1\r\n", NULL},              /* GET sends no body */
      {NULL, NULL, "GET /p HTTP/1.1\r\n", NULL},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    pr_buf got;
    pr_buf_init(&got, 1 << 20);
    pr_curlreq_opts o = {.base = base(), .path = "/p", .method = cases[i].method,
                         .body = cases[i].body, .body_len = cases[i].body ? strlen(cases[i].body) : 0,
                         .write_fn = collect, .write_ud = &got, .http11 = 1};
    pr_curlreq q = {0};
    assert_int_equal(pr_curlreq_open(&q, NULL, &o), 0);
    assert_int_equal(perform(&q), CURLE_OK);
    const char *s = pr_buf_cstr(&got);
    assert_true(strncmp(s, cases[i].want_line, strlen(cases[i].want_line)) == 0);
    if (cases[i].want_body) assert_non_null(strstr(s, cases[i].want_body));
    else assert_null(strstr(s, "ignored"));
    pr_curlreq_close(&q, NULL);
    pr_buf_free(&got);
  }
}

/* A URL from a phone or a config must not make curl read files or speak other protocols. */
static void test_only_http_and_https(void **state) {
  (void)state;
  char err[CURL_ERROR_SIZE];
  const pr_curlreq_opts o = {.base = "file:///etc/hostname", .errbuf = err};
  pr_curlreq q = {0};
  assert_int_equal(pr_curlreq_open(&q, NULL, &o), 0);
  assert_int_equal(perform(&q), CURLE_UNSUPPORTED_PROTOCOL);
  assert_true(err[0] != '\0');
  pr_curlreq_close(&q, NULL);
}

static void test_timeout(void **state) {
  (void)state;
  srv_mode = SRV_STALL;
  const pr_curlreq_opts o = {.base = base(), .path = "/slow", .timeout_ms = 200};
  pr_curlreq q = {0};
  assert_int_equal(pr_curlreq_open(&q, NULL, &o), 0);
  assert_int_equal(perform(&q), CURLE_OPERATION_TIMEDOUT);
  assert_int_equal(pr_curlreq_status(&q), 0);
  pr_curlreq_close(&q, NULL);
}

static void test_open_refuses(void **state) {
  (void)state;
  pr_curlreq q = {0};
  const pr_curlreq_opts none = {.path = "/x"};
  assert_int_equal(pr_curlreq_open(&q, NULL, &none), -EINVAL);
  assert_null(q.easy);
  const pr_curlreq_opts o = {.base = base()};
  assert_int_equal(pr_curlreq_open(&q, NULL, &o), 0);
  CURL *e = q.easy;
  assert_int_equal(pr_curlreq_open(&q, NULL, &o), -EBUSY); /* an open one is left alone */
  assert_ptr_equal(q.easy, e);
  pr_curlreq_close(&q, NULL);
}

/* ---- the ownership rule, through pr_curlm on a loop ------------------------------------ */

typedef struct {
  pr_curlreq q;
  pr_curlm *m;
  uv_loop_t *loop;
  int done;
  CURLcode rc;
  long status;
} xfer;

/* The pattern every owner follows: read from the handle, then close it. */
static void on_done(CURL *easy, CURLcode rc, void *ud) {
  xfer *x = ud;
  assert_ptr_equal(easy, x->q.easy);
  x->rc = rc;
  x->status = pr_curlreq_status(&x->q);
  pr_curlreq_close(&x->q, x->m);
  x->done = 1;
  /* a transfer may end inside a timer's callback (a kept connection answered at once):
   * libuv 1.44's UV_RUN_ONCE would then go on to wait for I/O that never comes */
  if (x->loop) uv_stop(x->loop);
}

static void run_until_done(uv_loop_t *loop, xfer *x) {
  x->loop = loop;
  for (int i = 0; i < 100000 && !x->done; i++) uv_run(loop, UV_RUN_ONCE);
  assert_true(x->done);
}

/* An engine that hangs up before a status line (the agent relay's old use-after-free):
 * the done callback reads status 0 and closes; nothing is left. */
static void test_done_reads_then_closes(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  xfer x = {0};
  assert_int_equal(pr_curlm_new(&x.m, &loop), 0);
  srv_mode = SRV_HANG_UP;
  const pr_curlreq_opts o = {.base = base(), .path = "/v1/chat/completions", .body = "{}", .body_len = 2};
  assert_int_equal(pr_curlreq_open(&x.q, x.m, &o), 0);
  assert_int_equal(pr_curlm_add(x.m, x.q.easy, on_done, &x), 0);
  run_until_done(&loop, &x);
  assert_int_equal(x.rc, CURLE_GOT_NOTHING);
  assert_int_equal(x.status, 0);
  assert_null(x.q.easy);
  assert_int_equal(pr_curlm_running(x.m), 0);

  /* and one that answers */
  srv_mode = SRV_ECHO;
  x.done = 0;
  assert_int_equal(pr_curlreq_open(&x.q, x.m, &o), 0);
  assert_int_equal(pr_curlm_add(x.m, x.q.easy, on_done, &x), 0);
  run_until_done(&loop, &x);
  assert_int_equal(x.rc, CURLE_OK);
  assert_int_equal(x.status, 200);

  /* closing one that runs cancels it: done never comes */
  srv_mode = SRV_STALL;
  x.done = 0;
  assert_int_equal(pr_curlreq_open(&x.q, x.m, &o), 0);
  assert_int_equal(pr_curlm_add(x.m, x.q.easy, on_done, &x), 0);
  for (int i = 0; i < 20; i++) uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(pr_curlm_running(x.m), 1);
  pr_curlreq_close(&x.q, x.m);
  assert_int_equal(pr_curlm_running(x.m), 0);
  assert_null(x.q.easy);
  for (int i = 0; i < 20; i++) uv_run(&loop, UV_RUN_NOWAIT);
  assert_false(x.done);

  pr_curlm_close(x.m, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Each host gets a DNS cache of its own (libcurl 7.88 prunes the whole cache a transfer
 * used at its end: one for a fleet costs O(phones) a transfer): requests to one host share
 * it, to another host get another; a request still open when the multi closes keeps its
 * cache until it is closed itself (run under valgrind/ASan: nothing leaks or dangles). */
static void test_each_host_has_a_dns_cache_of_its_own(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  xfer x = {0};
  assert_int_equal(pr_curlm_new(&x.m, &loop), 0);
  srv_mode = SRV_ECHO;
  const pr_curlreq_opts o = {.base = base(), .path = "/a"};
  for (int i = 0; i < 3; i++) { /* one host, three requests: one cache */
    x.done = 0;
    assert_int_equal(pr_curlreq_open(&x.q, x.m, &o), 0);
    assert_non_null(x.q.dns);
    assert_int_equal(pr_curlm_add(x.m, x.q.easy, on_done, &x), 0);
    run_until_done(&loop, &x);
    assert_int_equal(x.status, 200);
    assert_null(x.q.dns);
  }
  assert_int_equal(pr_curlm_dns_caches(x.m), 1);
  /* the same server by another name (another authority): another cache */
  char other[64];
  snprintf(other, sizeof(other), "http://localhost:%d", srv_port);
  const pr_curlreq_opts o2 = {.base = other, .path = "/b"};
  x.done = 0;
  assert_int_equal(pr_curlreq_open(&x.q, x.m, &o2), 0);
  assert_int_equal(pr_curlm_add(x.m, x.q.easy, on_done, &x), 0);
  run_until_done(&loop, &x);
  assert_int_equal(x.status, 200);
  assert_int_equal(pr_curlm_dns_caches(x.m), 2);
  /* one still open when the multi closes: its cache goes with it */
  pr_curlreq held = {0};
  assert_int_equal(pr_curlreq_open(&held, x.m, &o), 0);
  assert_non_null(held.dns);
  pr_curlm_close(x.m, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  pr_curlreq_close(&held, NULL);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Each host keeps its connections in a cache of its own, capped by MAXCONNECTS per host
 * (libcurl 7.88 walks every connection of the cache a transfer used when it is removed:
 * one cache for a fleet costs O(phones) a probe). With a cap of one, a request to another
 * host does not close the first host's kept connection: the third request reuses it. */
static void test_each_host_keeps_its_own_connections(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  xfer x = {0};
  assert_int_equal(pr_curlm_new(&x.m, &loop), 0);
  curl_multi_setopt(pr_curlm_multi(x.m), CURLMOPT_MAXCONNECTS, 1L);
  srv_mode = SRV_KEEP;
  int before = srv_accepted;
  char other[64];
  snprintf(other, sizeof(other), "http://localhost:%d", srv_port); /* the same server, another host */
  const pr_curlreq_opts a = {.base = base(), .path = "/a"}, b = {.base = other, .path = "/b"};
  const pr_curlreq_opts *order[] = {&a, &b, &a, &b};
  for (int i = 0; i < 4; i++) {
    x.done = 0;
    assert_int_equal(pr_curlreq_open(&x.q, x.m, order[i]), 0);
    assert_int_equal(pr_curlm_add(x.m, x.q.easy, on_done, &x), 0);
    run_until_done(&loop, &x);
    assert_int_equal(x.rc, CURLE_OK);
    assert_int_equal(x.status, 200);
  }
  assert_int_equal(srv_accepted - before, 2); /* one connection a host, each reused */
  pr_curlm_close(x.m, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  srv_mode = SRV_ECHO;
}

/* A handle given back to the pool comes out again with nothing of its last request: no
 * bearer, no body, no method. */
static void test_pooled_handle_starts_clean(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  pr_curlm *m;
  assert_int_equal(pr_curlm_new(&m, &loop), 0);
  const char *const lines[] = {"X-Old: yes", NULL};
  const pr_curlreq_opts first = {.base = base(), .path = "/first", .method = "PUT", .body = "old",
                                 .body_len = 3, .headers = lines, .bearer = "old-token",
                                 .user_agent = "old-agent"};
  pr_curlreq q = {0};
  assert_int_equal(pr_curlreq_open(&q, m, &first), 0);
  CURL *e = q.easy;
  pr_curlreq_close(&q, m);

  srv_mode = SRV_ECHO;
  pr_buf got;
  pr_buf_init(&got, 1 << 20);
  const pr_curlreq_opts second = {.base = base(), .path = "/second", .write_fn = collect, .write_ud = &got};
  assert_int_equal(pr_curlreq_open(&q, m, &second), 0);
  assert_ptr_equal(q.easy, e); /* the same handle, reused */
  assert_int_equal(perform(&q), CURLE_OK);
  const char *s = pr_buf_cstr(&got);
  assert_true(strncmp(s, "GET /second ", 12) == 0);
  assert_null(strstr(s, "old"));
  assert_null(strstr(s, "Authorization"));
  pr_curlreq_close(&q, m);
  pr_buf_free(&got);

  pr_curlm_close(m, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* The multi's gate (curlm.h) sees every address before a connection is made: refused,
 * the server never sees a connection and the request says why; let through, it runs,
 * with no proxy from the environment in between. */
static int gate_calls;
static int gate(void *ud, const struct sockaddr *sa, char *why, size_t n) {
  gate_calls++;
  if (*(int *)ud && sa->sa_family == AF_INET) {
    snprintf(why, n, "address 127.0.0.1 refused by the test");
    return -EACCES;
  }
  return 0;
}

static void test_gate(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  xfer x = {.loop = &loop};
  assert_int_equal(pr_curlm_new(&x.m, &loop), 0);
  int refuse = 1;
  pr_curlm_set_gate(x.m, gate, &refuse);
  srv_mode = SRV_ECHO;
  int before = srv_accepted;
  char err[CURL_ERROR_SIZE];
  int local = 0;
  const pr_curlreq_opts o = {.base = base(), .path = "/p", .errbuf = err, .local_errno = &local};
  assert_int_equal(pr_curlreq_open(&x.q, x.m, &o), 0);
  assert_null(pr_curlreq_refused(&x.q));
  assert_int_equal(pr_curlm_add(x.m, x.q.easy, on_done, &x), 0);
  /* on_done closes: keep what it says first */
  for (int i = 0; i < 100000 && pr_curlm_running(x.m); i++) uv_run(&loop, UV_RUN_ONCE);
  assert_true(x.done);
  assert_int_equal(x.rc, CURLE_COULDNT_CONNECT);
  assert_non_null(pr_curlreq_refused(&x.q));
  assert_string_equal(pr_curlreq_error(&x.q, x.rc), "address 127.0.0.1 refused by the test");
  assert_int_equal(local, 0); /* not a shortage of the process's own */
  assert_true(gate_calls >= 1);
  usleep(100 * 1000);
  assert_int_equal(srv_accepted, before);

  /* let through: it runs, and http_proxy (a dead proxy) is not used */
  setenv("http_proxy", "http://127.0.0.1:1", 1);
  refuse = 0;
  x.done = 0;
  assert_int_equal(pr_curlreq_open(&x.q, x.m, &o), 0);
  assert_null(pr_curlreq_refused(&x.q)); /* a new request forgets the last refusal */
  assert_int_equal(pr_curlm_add(x.m, x.q.easy, on_done, &x), 0);
  run_until_done(&loop, &x);
  unsetenv("http_proxy");
  assert_int_equal(x.rc, CURLE_OK);
  assert_int_equal(x.status, 200);
  assert_int_equal(srv_accepted, before + 1);

  pr_curlm_close(x.m, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_with_headers_and_bearer),
      cmocka_unit_test(test_each_host_has_a_dns_cache_of_its_own),
      cmocka_unit_test(test_each_host_keeps_its_own_connections),
      cmocka_unit_test(test_methods_and_bodies),
      cmocka_unit_test(test_only_http_and_https),
      cmocka_unit_test(test_timeout),
      cmocka_unit_test(test_open_refuses),
      cmocka_unit_test(test_done_reads_then_closes),
      cmocka_unit_test(test_pooled_handle_starts_clean),
      cmocka_unit_test(test_gate),
  };
  int rc = cmocka_run_group_tests(tests, srv_start, srv_stop);
  curl_global_cleanup();
  return rc;
}
