/* libFuzzer target: the HTTP/1.1 request path of proto/http.c exactly as the daemons run
 * it (llhttp with http.c's settings and callbacks, limits, pipelining, error answers,
 * lingering close). http.c keeps its parser behind a libuv stream, so each input goes
 * through a real loopback connection: the bytes are written (cut where the first byte
 * says, to vary the reads), our side shuts down, and the loop runs until the server has
 * closed the connection. A request that never ends, or a server that never closes, is a
 * hang (abort). Every answer must be a well-formed status line. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http.h"

static uv_loop_t *loop;
static pr_http_server srv;
static int port;

static void handler(pr_http_req *req, void *ud) {
  (void)ud;
  /* some answers streamed, some whole, like the gateway's */
  if (req->body.len && (req->body.data[0] & 1)) {
    pr_http_start(req, 200, NULL, "text/event-stream");
    pr_http_write(req, "data: x\n\n", 9);
    pr_http_write(req, req->body.data, req->body.len > 64 ? 64 : req->body.len);
    pr_http_end(req);
    return;
  }
  char body[128];
  int n = snprintf(body, sizeof(body), "{\"path\":%zu,\"headers\":%zu,\"body\":%zu}",
                   strlen(req->path), req->n_headers, req->body.len);
  pr_http_respond(req, 200, NULL, "application/json", body, (size_t)n);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  loop = uv_default_loop();
  pr_http_server_init(&srv, loop, handler, NULL);
  srv.limits.max_header_bytes = 4096;
  srv.limits.max_headers = 32;
  srv.limits.max_body_bytes = 16384;
  srv.limits.max_pending_bytes = 8192;
  srv.limits.header_timeout_ms = 5000;
  srv.limits.body_timeout_ms = 5000;
  if (pr_http_server_listen(&srv, "127.0.0.1:0")) abort();
  port = pr_http_server_port(&srv);
  return 0;
}

/* A fresh client connection. Each comes from its own 127.x.y.z address and is closed
 * with a reset, so thousands of runs a second do not run out of ports in TIME_WAIT. */
static int client_connect(void) {
  static uint32_t seq;
  for (int attempt = 0; attempt < 100; attempt++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) abort();
    struct sockaddr_in src, dst;
    memset(&src, 0, sizeof(src));
    memset(&dst, 0, sizeof(dst));
    seq++;
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(0x7f000000u | (1 + seq % 0xfffffe));
    dst.sin_family = AF_INET;
    dst.sin_port = htons((uint16_t)port);
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct linger lg = {1, 0};
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&src, sizeof(src)) == 0 &&
        connect(fd, (struct sockaddr *)&dst, sizeof(dst)) == 0) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      return fd;
    }
    close(fd);
    uv_run(loop, UV_RUN_NOWAIT); /* let the server accept what is queued */
  }
  fprintf(stderr, "fuzz_http: cannot connect to the server: %s\n", strerror(errno));
  abort();
}

/* Run the loop and read the client side until the server closed and forgot the
 * connection. Returns 0, or -1 after too many rounds (a hang). */
static int pump(int fd, char **resp, size_t *rlen, int *eof) {
  for (int round = 0; round < 20000; round++) {
    uv_run(loop, UV_RUN_NOWAIT);
    char buf[65536];
    for (;;) {
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        if (*rlen < (1u << 20)) {
          char *r = realloc(*resp, *rlen + (size_t)n);
          if (!r) abort();
          memcpy(r + *rlen, buf, (size_t)n);
          *resp = r;
          *rlen += (size_t)n;
        }
        continue;
      }
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) *eof = 1;
      break;
    }
    if (*eof && srv.n_conns == 0) return 0;
    struct pollfd pf[2] = {{uv_backend_fd(loop), POLLIN, 0}, {fd, POLLIN, 0}};
    int t = uv_backend_timeout(loop);
    poll(pf, *eof ? 1 : 2, t < 0 || t > 50 ? 50 : t);
  }
  return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 65536) return 0;
  size_t cut = data[0] % (size);
  data++;
  size--;
  int fd = client_connect();
  char *resp = NULL;
  size_t rlen = 0;
  int eof = 0;
  /* the first piece, a round of the loop (so the server reads it alone), the rest */
  if (cut && send(fd, data, cut, MSG_NOSIGNAL) < 0 && errno != EAGAIN) eof = 1;
  uv_run(loop, UV_RUN_NOWAIT);
  size_t off = cut;
  for (int i = 0; off < size && i < 1000; i++) {
    ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n > 0) off += (size_t)n;
    else if (errno != EAGAIN && errno != EWOULDBLOCK) break;
    uv_run(loop, UV_RUN_NOWAIT);
  }
  shutdown(fd, SHUT_WR);
  if (pump(fd, &resp, &rlen, &eof) < 0) {
    fprintf(stderr, "fuzz_http: the server never closed the connection\n");
    abort();
  }
  close(fd);
  /* whatever came back is a sequence of answers, each starting with a status line */
  if (rlen && (rlen < 12 || memcmp(resp, "HTTP/1.1 ", 9) != 0)) {
    fprintf(stderr, "fuzz_http: not an HTTP answer: %.*s\n", (int)(rlen > 80 ? 80 : rlen), resp);
    abort();
  }
  free(resp);
  return 0;
}
