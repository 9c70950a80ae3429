/* HTTP/1.1 server connections on libuv + llhttp; see http.h for the contract.
 * A connection parses one request at a time: llhttp is paused at the end of each
 * message, the handler runs outside the parser, and bytes that arrive meanwhile wait in
 * `pending` until the answer has ended. That keeps pipelined answers in order. */
#include "http.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <llhttp.h>

#include <openssl/err.h>

#include "budget.h"
#include "caps.h"
#include "addr.h"
#include "err.h"
#include "log.h"
#include "oai.h"

enum conn_state {
  CONN_IDLE,      /* between requests: idle timer runs */
  CONN_HEAD,      /* reading request line and headers: header timer */
  CONN_BODY,      /* reading the body: body timer */
  CONN_HANDLING,  /* request handed to the handler, answer not ended */
  CONN_DRAINING,  /* last answer queued; close once it is written */
};

/* A connection. Owned by its server's list; freed in the close callback of the last of
 * its two handles (tcp and timer), never before. */
struct pr_http_conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  pr_http_server *server;
  pr_http_conn *next, *prev;
  llhttp_t parser;
  enum conn_state state;
  pr_http_req *req;      /* the request being read or handled */
  pr_buf pending;        /* bytes read but not parsed yet */
  pr_buf hfield, hvalue; /* the header being read */
  size_t head_bytes;     /* request line + header bytes of the current request */
  size_t queued;         /* bytes handed to uv_write and not yet written */
  int err_status;        /* a limit hit in a parser callback: 413, 431 */
  const char *err_reason; /* why a parser callback refused the request (400) */
  char last_nonws;       /* last byte but SP/HT fed to llhttp before the current input */
  int closing;
  int handles_open;
  int in_feed;           /* conn_feed is on the stack: do not re-enter it */
  int read_stopped;
  int want_drain;        /* pr_http_write returned 1: call on_drain at low water */
  int lingering;         /* shut down our side; reading until EOF or timer */
  unsigned n_req;
  char peer[64];
  SSL *ssl;              /* TLS over memory BIOs when the server has a context; owned */
  BIO *rbio, *wbio;      /* owned by ssl */
  int tls_ready;         /* handshake finished */
  int in_head_fn;        /* the server's head_fn runs: an answer now closes the connection */
  int answered_early;    /* head_fn answered before the body: parse nothing more */
  uint64_t body_announced; /* the current request's Content-Length (0: none or chunked) */
};

typedef struct conn_write {
  uv_write_t w;
  pr_http_conn *conn;
  size_t len;
  char data[];
} conn_write;

static llhttp_settings_t http_settings;

/* Connections of every server in the process share one budget (pr_http_set_process_max_conns):
 * each is a descriptor, and a gateway's request opens a second one to its phone. A server
 * past its own or the process's limit leaves the next connection unaccepted: libuv stops
 * watching its listener until it is accepted, so new clients wait in the kernel's listen
 * queue (as HAProxy's maxconn does) instead of being reset. A closing connection resumes
 * the servers that wait (resume_accepts). One loop per process: plain statics. */
static size_t g_max_conns, g_open_conns;
static pr_http_server *g_waiting;  /* servers holding back an accepted connection */
static uint64_t g_wait_logged_ms;  /* last "limit reached" warning */

static void on_connection(uv_stream_t *ls, int status);

void pr_http_set_process_max_conns(size_t max) { g_max_conns = max; }

/* Request bodies of every connection of the process share one budget, so that many
 * clients each sending a large body cannot together exhaust memory. */
static pr_budget g_body_budget;

void pr_http_set_body_budget(size_t max) { g_body_budget.max = max; }
size_t pr_http_body_bytes(void) { return g_body_budget.used; }

static void body_release(pr_http_req *r) {
  pr_budget_give(&g_body_budget, r->body_reserved);
  r->body_reserved = 0;
}

void pr_http_req_free_body(pr_http_req *req) {
  pr_buf_free(&req->body);
  body_release(req);
}

static int over_budget(const pr_http_server *s) {
  return (s->max_conns && s->n_conns >= s->max_conns) || (g_max_conns && g_open_conns >= g_max_conns);
}

static void waiting_remove(pr_http_server *s) {
  for (pr_http_server **p = &g_waiting; *p; p = &(*p)->next_waiting)
    if (*p == s) {
      *p = s->next_waiting;
      break;
    }
  s->next_waiting = NULL;
  s->accept_waiting = 0;
}

static void resume_accepts(void) {
  for (int guard = 0; g_waiting && guard < 1024; guard++) {
    pr_http_server *s = g_waiting;
    while (s && over_budget(s)) s = s->next_waiting;
    if (!s) return;
    waiting_remove(s);
    on_connection((uv_stream_t *)&s->listener, 0); /* accepts what libuv holds */
  }
}
static int http_settings_ready;

static void conn_close(pr_http_conn *c, int reset);
static void conn_feed(pr_http_conn *c);
static void conn_fail(pr_http_conn *c, int status, const char *message, const char *code);
static void conn_read_start(pr_http_conn *c);

/* ---- limits, reasons ---------------------------------------------------------------- */

void pr_http_limits_default(pr_http_limits *l) {
  l->max_header_bytes = 16 * 1024;
  l->max_headers = 100;
  l->max_body_bytes = 8 * 1024 * 1024;
  l->header_timeout_ms = 10000;
  l->body_timeout_ms = 60000;
  l->idle_timeout_ms = 60000;
  l->max_pending_bytes = 64 * 1024;
  l->max_requests_per_conn = 0;
  l->send_timeout_ms = 60000;
}

const char *pr_http_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

static void default_error_fn(pr_buf *out, const char **ctype, char *header, size_t header_n,
                             int status, const char *message, const char *code,
                             const pr_http_req *req, void *ud) {
  (void)ud;
  (void)header;
  (void)header_n;
  (void)req;
  const char *type = status >= 500 ? "server_error" : "invalid_request_error";
  pr_oai_error_body(out, message, type, NULL, code);
  *ctype = "application/json";
}

/* ---- request objects ---------------------------------------------------------------- */

static void req_free(pr_http_req *r) {
  if (!r) return;
  free(r->url);
  free(r->path);
  for (size_t i = 0; i < r->n_headers; i++) {
    free(r->headers[i].name);
    free(r->headers[i].value);
  }
  free(r->headers);
  pr_buf_free(&r->body);
  body_release(r);
  free(r);
}

static pr_http_req *req_new(pr_http_conn *c) {
  pr_http_req *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->conn = c;
  r->server = c->server;
  r->query = "";
  pr_buf_init(&r->body, c->server->limits.max_body_bytes);
  r->max_body = c->server->limits.max_body_bytes;
  r->start_ms = uv_now(c->server->loop);
  return r;
}

const char *pr_http_header_get(const pr_http_req *req, const char *name) {
  for (size_t i = 0; i < req->n_headers; i++)
    if (strcasecmp(req->headers[i].name, name) == 0) return req->headers[i].value;
  return NULL;
}

void pr_http_peer(const pr_http_req *req, char *out, size_t n) {
  snprintf(out, n, "%s", req->conn ? req->conn->peer : "");
}

/* ---- timers -------------------------------------------------------------------------- */

static void conn_timer_cb(uv_timer_t *t) {
  pr_http_conn *c = t->data;
  if (c->closing) return;
  switch (c->state) {
    case CONN_HEAD:
    case CONN_BODY:
      conn_fail(c, 408, "the request was not received in time", "request_timeout");
      break;
    case CONN_IDLE:
      /* idle between requests, or an answer the client stopped reading */
      conn_close(c, c->queued > 0);
      break;
    case CONN_DRAINING:
      conn_close(c, !c->lingering);
      break;
    case CONN_HANDLING:
      break;
  }
}

static void conn_arm(pr_http_conn *c, uint64_t ms) {
  if (c->closing) return;
  if (ms)
    uv_timer_start(&c->timer, conn_timer_cb, ms, 0);
  else
    uv_timer_stop(&c->timer);
}

/* Between requests the clock that runs depends on whether the last answer is still
 * being written: a client that stops reading gets send_timeout, not idle_timeout. */
static void conn_arm_idle(pr_http_conn *c) {
  const pr_http_limits *l = &c->server->limits;
  conn_arm(c, c->queued > 0 ? l->send_timeout_ms : l->idle_timeout_ms);
}

/* ---- writing ------------------------------------------------------------------------- */

static void conn_maybe_finish(pr_http_conn *c);

static void conn_write_cb(uv_write_t *w, int status) {
  conn_write *cw = (conn_write *)w;
  pr_http_conn *c = cw->conn;
  c->queued -= cw->len;
  free(cw);
  if (c->closing) return;
  if (status < 0) {
    conn_close(c, 1);
    return;
  }
  if (c->want_drain && c->queued <= c->server->low_water && c->req && c->state == CONN_HANDLING) {
    c->want_drain = 0;
    if (c->req->on_drain) c->req->on_drain(c->req);
    if (c->closing) return;
  }
  if (c->state == CONN_IDLE) {
    conn_arm_idle(c); /* progress: the send clock starts again */
    if (c->queued <= c->server->low_water) {
      if (c->read_stopped) {
        c->read_stopped = 0;
        conn_read_start(c);
      }
      if (!c->in_feed && c->pending.len) conn_feed(c);
      if (c->closing) return;
    }
  } else if (c->state == CONN_DRAINING && !c->lingering) {
    conn_arm(c, c->server->limits.send_timeout_ms);
  }
  conn_maybe_finish(c);
}

/* The one place bytes leave a connection: the transport hook TLS will wrap. */
/* Bytes onto the socket: plaintext, or TLS records from the write BIO. */
static int conn_send_raw(pr_http_conn *c, const void *a, size_t alen, const void *b, size_t blen) {
  if (c->closing) return PR_ECLOSED;
  size_t len = alen + blen;
  if (len == 0) return 0;
  /* Most answers fit in the socket buffer: write them at once, from the caller's
   * buffers. uv_write would copy them, and its completion re-arms the descriptor in
   * epoll (one more syscall); only what the kernel did not take is queued. libuv refuses
   * (EAGAIN) while earlier writes are queued, which keeps the bytes in order; an error
   * is left to uv_write, which reports it through conn_write_cb as before. */
  uv_buf_t ubs[2];
  unsigned nb = 0;
  if (alen) ubs[nb++] = uv_buf_init((char *)a, (unsigned)alen);
  if (blen) ubs[nb++] = uv_buf_init((char *)b, (unsigned)blen);
  int n = uv_try_write((uv_stream_t *)&c->tcp, ubs, nb);
  if (n > 0) {
    if ((size_t)n == len) return 0;
    size_t skip = (size_t)n;
    if (skip >= alen) {
      skip -= alen;
      b = (const char *)b + skip;
      blen -= skip;
      alen = 0;
    } else {
      a = (const char *)a + skip;
      alen -= skip;
    }
    len -= (size_t)n;
  }
  conn_write *cw = malloc(sizeof(*cw) + len);
  if (!cw) return -ENOMEM;
  cw->conn = c;
  cw->len = len;
  if (alen) memcpy(cw->data, a, alen);
  if (blen) memcpy(cw->data + alen, b, blen);
  uv_buf_t ub = uv_buf_init(cw->data, (unsigned)len);
  int rc = uv_write(&cw->w, (uv_stream_t *)&c->tcp, &ub, 1, conn_write_cb);
  if (rc < 0) {
    free(cw);
    conn_close(c, 1);
    return PR_ECLOSED;
  }
  c->queued += len;
  return 0;
}

/* Move whatever TLS records OpenSSL produced onto the socket. */
static int tls_flush(pr_http_conn *c) {
  int pending = BIO_pending(c->wbio);
  if (pending <= 0) return 0;
  conn_write *cw = malloc(sizeof(*cw) + (size_t)pending);
  if (!cw) return -ENOMEM;
  int n = BIO_read(c->wbio, cw->data, pending);
  int rc = n > 0 ? conn_send_raw(c, cw->data, (size_t)n, NULL, 0) : 0;
  free(cw);
  return rc;
}

/* The one place an answer's bytes leave a connection: the transport hook TLS wraps. */
static int conn_send(pr_http_conn *c, const void *a, size_t alen, const void *b, size_t blen) {
  if (c->closing) return PR_ECLOSED;
  if (!c->ssl) return conn_send_raw(c, a, alen, b, blen);
  if (!c->tls_ready) return PR_ETLS;
  const void *parts[2] = {a, b};
  size_t lens[2] = {alen, blen};
  for (int i = 0; i < 2; i++) {
    if (!lens[i]) continue;
    if (SSL_write(c->ssl, parts[i], (int)lens[i]) <= 0) {
      ERR_clear_error();
      conn_close(c, 1);
      return PR_ECLOSED;
    }
  }
  return tls_flush(c);
}

static const char *http_date(void) {
  static char buf[64];
  static time_t last;
  time_t now = time(NULL);
  if (now != last) {
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    last = now;
  }
  return buf;
}

/* "<a><b>\r\n": the head is put together from pieces, without printf's formatting. */
static int head_line(pr_buf *h, const char *a, const char *b) {
  int rc = pr_buf_append_str(h, a);
  if (!rc && b) rc = pr_buf_append_str(h, b);
  if (!rc) rc = pr_buf_append(h, "\r\n", 2);
  return rc;
}

static int build_head(pr_http_req *req, pr_buf *h, int status, const char *const *headers,
                      const char *ctype) {
  pr_http_server *s = req->server;
  pr_http_conn *c = req->conn;
  if (!req->keep_alive || s->closing || s->no_keepalive || c->in_head_fn ||
      (s->limits.max_requests_per_conn && c->n_req >= s->limits.max_requests_per_conn))
    req->close_after = 1;
  pr_buf_reserve(h, 256);
  int rc;
  if (status >= 100 && status <= 999) {
    char line[16] = "HTTP/1.1 ";
    pr_u64_digits(line + 12, (uint64_t)status);
    line[12] = ' ';
    line[13] = '\0';
    rc = head_line(h, line, pr_http_reason(status));
  } else {
    rc = pr_buf_appendf(h, "HTTP/1.1 %d %s\r\n", status, pr_http_reason(status));
  }
  if (!rc) rc = head_line(h, "Date: ", http_date());
  if (!rc && s->server_name) rc = head_line(h, "Server: ", s->server_name);
  if (!rc && ctype) rc = head_line(h, "Content-Type: ", ctype);
  for (size_t i = 0; !rc && headers && headers[i]; i++) rc = head_line(h, headers[i], NULL);
  if (!rc && req->close_after) rc = pr_buf_append_str(h, "Connection: close\r\n");
  else if (!rc && req->http_minor == 0) rc = pr_buf_append_str(h, "Connection: keep-alive\r\n");
  return rc;
}

/* The answer has ended: free the request and go on with the connection. */
static void conn_request_done(pr_http_conn *c) {
  pr_http_req *r = c->req;
  int close_after = r ? r->close_after : 1;
  c->req = NULL;
  c->want_drain = 0;
  req_free(r);
  if (c->closing) return;
  if (close_after) {
    c->state = CONN_DRAINING;
    conn_maybe_finish(c);
    return;
  }
  c->state = CONN_IDLE;
  llhttp_resume(&c->parser);
  conn_arm_idle(c);
  if (c->read_stopped && !c->closing) {
    c->read_stopped = 0;
    conn_read_start(c);
  }
  if (!c->in_feed && c->pending.len) conn_feed(c);
}

int pr_http_respond(pr_http_req *req, int status, const char *const *headers, const char *ctype,
                    const char *body, size_t len) {
  pr_http_conn *c = req->conn;
  if (req->resp_state != 0) return -EINVAL;
  pr_buf h;
  pr_buf_init(&h, PR_CAP_ERROR_BODY);
  int rc = build_head(req, &h, status, headers, ctype);
  char num[24];
  num[sizeof(num) - 1] = '\0';
  if (!rc) rc = head_line(&h, "Content-Length: ", pr_u64_digits(num + sizeof(num) - 1, len));
  if (!rc) rc = pr_buf_append(&h, "\r\n", 2);
  if (rc) {
    pr_buf_free(&h);
    return rc;
  }
  int head_only = strcmp(req->method, "HEAD") == 0;
  req->resp_status = status;
  req->resp_state = 2;
  req->bytes_out += h.len + (head_only ? 0 : len);
  rc = conn_send(c, h.data, h.len, body, head_only ? 0 : len);
  pr_buf_free(&h);
  conn_request_done(c);
  return rc;
}

int pr_http_start(pr_http_req *req, int status, const char *const *headers, const char *ctype) {
  if (req->resp_state != 0) return -EINVAL;
  pr_buf h;
  pr_buf_init(&h, PR_CAP_ERROR_BODY);
  if (req->http_minor == 0) req->close_after = 1; /* HTTP/1.0: the body ends at close */
  int rc = build_head(req, &h, status, headers, ctype);
  req->resp_chunked = req->http_minor >= 1;
  if (!rc && req->resp_chunked) rc = pr_buf_append_str(&h, "Transfer-Encoding: chunked\r\n");
  if (!rc) rc = pr_buf_append_str(&h, "\r\n");
  if (rc) {
    pr_buf_free(&h);
    return rc;
  }
  req->resp_status = status;
  req->resp_state = 1;
  req->bytes_out += h.len;
  rc = conn_send(req->conn, h.data, h.len, NULL, 0);
  pr_buf_free(&h);
  return rc;
}

int pr_http_write(pr_http_req *req, const void *data, size_t len) {
  pr_http_conn *c = req->conn;
  if (req->resp_state != 1) return -EINVAL;
  if (c->closing) return PR_ECLOSED;
  if (len == 0) return c->queued > c->server->high_water;
  int rc;
  if (req->resp_chunked) {
    char sz[24];
    int n = snprintf(sz, sizeof(sz), "%zx\r\n", len);
    /* chunk header + data in one write, trailing CRLF joins the next write's header */
    rc = conn_send(c, sz, (size_t)n, data, len);
    if (!rc) rc = conn_send(c, "\r\n", 2, NULL, 0);
  } else {
    rc = conn_send(c, data, len, NULL, 0);
  }
  if (rc) return rc;
  req->bytes_out += len;
  if (c->queued > c->server->high_water) {
    c->want_drain = 1;
    return 1;
  }
  return 0;
}

int pr_http_end(pr_http_req *req) {
  pr_http_conn *c = req->conn;
  if (req->resp_state != 1) return -EINVAL;
  req->resp_state = 2;
  int rc = 0;
  if (req->resp_chunked) rc = conn_send(c, "0\r\n\r\n", 5, NULL, 0);
  conn_request_done(c);
  return rc;
}

int pr_http_want_drain(pr_http_req *req) {
  pr_http_conn *c = req->conn;
  if (c->closing) return PR_ECLOSED;
  if (c->queued > c->server->high_water) {
    c->want_drain = 1;
    return 1;
  }
  return 0;
}

pr_http_req *pr_http_req_let_go(pr_http_req *req) {
  if (req) {
    req->data = NULL;
    req->on_abort = NULL;
    req->on_drain = NULL;
  }
  return req;
}

void pr_http_abort(pr_http_req *req) {
  pr_http_conn *c = req->conn;
  req->on_abort = NULL;
  conn_close(c, 1);
}

size_t pr_http_queued(const pr_http_req *req) { return req->conn ? req->conn->queued : 0; }

/* ---- closing --------------------------------------------------------------------------- */

/* The server is done once no connection is open or still closing (their close
 * callbacks reach the server) and the listener is closed. */
static void server_maybe_closed(pr_http_server *s) {
  if (!s->closing || s->n_conns || s->conns_closing || s->listening || s->listener_closing) return;
  if (s->tls) {
    SSL_CTX_free(s->tls);
    s->tls = NULL;
  }
  if (s->on_closed) {
    void (*cb)(pr_http_server *) = s->on_closed;
    s->on_closed = NULL;
    cb(s);
  }
}

static void conn_handle_closed(uv_handle_t *h) {
  pr_http_conn *c = h->data;
  if (--c->handles_open > 0) return;
  pr_http_server *s = c->server;
  s->conns_closing--;
  if (c->ssl) SSL_free(c->ssl); /* frees its BIOs */
  pr_buf_free(&c->pending);
  pr_buf_free(&c->hfield);
  pr_buf_free(&c->hvalue);
  free(c);
  server_maybe_closed(s);
  if (g_waiting) resume_accepts(); /* its descriptor is closed now */
}

static void conn_close(pr_http_conn *c, int reset) {
  if (c->closing) return;
  c->closing = 1;
  pr_http_server *s = c->server;
  pr_http_req *r = c->req;
  c->req = NULL;
  if (r && r->resp_state != 2 && r->on_abort &&
      (c->state == CONN_HANDLING || (r->on_body_data && c->state != CONN_DRAINING)))
    r->on_abort(r);
  req_free(r);
  /* unlink */
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->n_conns--;
  g_open_conns--;
  s->conns_closing++;
  uv_timer_stop(&c->timer);
  uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
  if (reset && uv_tcp_close_reset(&c->tcp, conn_handle_closed) == 0) return;
  uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
}

static void conn_shutdown_cb(uv_shutdown_t *sr, int status) {
  (void)status;
  free(sr);
}

/* Close after the last answer is written. Our side is shut down first and unread input
 * is drained for a moment (a lingering close), so a client still sending its body gets
 * our error answer instead of a reset. */
static void conn_maybe_finish(pr_http_conn *c) {
  if (c->closing || c->state != CONN_DRAINING || c->lingering) return;
  if (c->queued > 0) {
    if (!uv_is_active((uv_handle_t *)&c->timer)) conn_arm(c, c->server->limits.send_timeout_ms);
    return;
  }
  c->lingering = 1;
  if (c->ssl && c->tls_ready) {
    SSL_shutdown(c->ssl); /* close_notify, so the client knows the answer is complete */
    ERR_clear_error();
    tls_flush(c);
    if (c->closing) return;
  }
  uv_shutdown_t *sr = malloc(sizeof(*sr));
  if (!sr || uv_shutdown(sr, (uv_stream_t *)&c->tcp, conn_shutdown_cb) < 0) {
    free(sr);
    conn_close(c, 0);
    return;
  }
  uv_timer_start(&c->timer, conn_timer_cb, 2000, 0);
}

static void conn_fail(pr_http_conn *c, int status, const char *message, const char *code) {
  if (c->closing) return;
  pr_http_server *s = c->server;
  if (c->state == CONN_HANDLING || c->state == CONN_DRAINING) {
    conn_close(c, 0);
    return;
  }
  /* Answer on a fresh request object: the parse state is unusable from here on. */
  pr_http_req *r = c->req ? c->req : req_new(c);
  if (!r) {
    conn_close(c, 1);
    return;
  }
  c->req = r;
  if (r->on_body_data) {
    /* a streamed body that will never reach the handler: its owner lets go now */
    void (*gone)(pr_http_req *) = r->on_abort;
    r->on_abort = NULL;
    r->on_body_data = NULL;
    if (gone) gone(r); /* it finds its state in r->data */
    r->data = NULL;
  }
  c->state = CONN_HANDLING;
  r->close_after = 1;
  r->keep_alive = 0;
  if (!r->method[0]) snprintf(r->method, sizeof(r->method), "GET");
  r->resp_state = 0;
  pr_buf body;
  pr_buf_init(&body, PR_CAP_ERROR_BODY);
  const char *ctype = "application/json";
  pr_http_error_fn fn = s->error_fn ? s->error_fn : default_error_fn;
  char extra[256] = "";
  fn(&body, &ctype, extra, sizeof(extra), status, message, code, r, s->error_ud);
  const char *hdrs[3] = {NULL, NULL, NULL};
  size_t nh = 0;
  if (extra[0]) hdrs[nh++] = extra;
  if (status == 503) hdrs[nh++] = "Retry-After: 1";
  pr_http_respond(r, status, nh ? hdrs : NULL, ctype, body.data ? body.data : "", body.len);
  pr_buf_free(&body);
  if (!c->closing) {
    c->state = CONN_DRAINING;
    conn_maybe_finish(c);
  }
}

/* ---- parsing ------------------------------------------------------------------------ */

#define CONN(p) ((pr_http_conn *)(p)->data)

static int count_head(pr_http_conn *c, size_t n) {
  c->head_bytes += n;
  if (c->head_bytes > c->server->limits.max_header_bytes) {
    c->err_status = 431;
    return -1;
  }
  return 0;
}

static int on_message_begin(llhttp_t *p) {
  pr_http_conn *c = CONN(p);
  if (!c->req) c->req = req_new(c);
  if (!c->req) return -1;
  c->head_bytes = 0;
  c->state = CONN_HEAD;
  conn_arm(c, c->server->limits.header_timeout_ms);
  return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n) {
  pr_http_conn *c = CONN(p);
  if (count_head(c, n)) return -1;
  pr_http_req *r = c->req;
  size_t old = r->url ? strlen(r->url) : 0;
  char *u = realloc(r->url, old + n + 1);
  if (!u) return -1;
  memcpy(u + old, at, n);
  u[old + n] = '\0';
  r->url = u;
  return 0;
}

static int push_header(pr_http_conn *c) {
  pr_http_req *r = c->req;
  if (r->n_headers >= c->server->limits.max_headers) {
    c->err_status = 431;
    return -1;
  }
  pr_http_header *h = realloc(r->headers, (r->n_headers + 1) * sizeof(*h));
  if (!h) return -1;
  r->headers = h;
  const char *v = pr_buf_cstr(&c->hvalue);
  size_t vl = c->hvalue.len;
  while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
  while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) vl--;
  h[r->n_headers].name = strdup(pr_buf_cstr(&c->hfield));
  h[r->n_headers].value = strndup(v, vl);
  if (!h[r->n_headers].name || !h[r->n_headers].value) {
    free(h[r->n_headers].name);
    free(h[r->n_headers].value);
    return -1;
  }
  r->n_headers++;
  pr_buf_reset(&c->hfield);
  pr_buf_reset(&c->hvalue);
  return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n) {
  pr_http_conn *c = CONN(p);
  if (count_head(c, n)) return -1;
  return pr_buf_append(&c->hfield, at, n) ? -1 : 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n) {
  pr_http_conn *c = CONN(p);
  if (count_head(c, n)) return -1;
  /* llhttp 8 joins an obs-fold continuation line to the value silently; refuse it
   * (RFC 9112 5.2). Such a span follows a line end with only SP/HT between. */
  const char *b = at;
  while (b > c->pending.data && (b[-1] == ' ' || b[-1] == '\t')) b--;
  if ((b > c->pending.data ? b[-1] : c->last_nonws) == '\n') {
    c->err_reason = "obsolete line folding in a header";
    return -1;
  }
  return pr_buf_append(&c->hvalue, at, n) ? -1 : 0;
}

static int on_header_value_complete(llhttp_t *p) {
  pr_http_conn *c = CONN(p);
  if (c->state != CONN_BODY && c->hfield.len == 0) {
    c->err_reason = "empty header name";
    return -1;
  }
  if (c->state == CONN_BODY) {
    /* a chunked body's trailer: never taken as a header */
    pr_buf_reset(&c->hfield);
    pr_buf_reset(&c->hvalue);
    return 0;
  }
  return push_header(c) ? -1 : 0;
}

static int on_headers_complete(llhttp_t *p) {
  pr_http_conn *c = CONN(p);
  pr_http_req *r = c->req;
  pr_http_server *s = c->server;
  pr_buf_free(&c->hfield); /* every header is in r->headers now */
  pr_buf_free(&c->hvalue);
  snprintf(r->method, sizeof(r->method), "%s", llhttp_method_name((llhttp_method_t)p->method));
  r->http_minor = p->http_major == 1 ? p->http_minor : 0;
  r->keep_alive = llhttp_should_keep_alive(p);
  if (p->http_major != 1) {
    c->err_status = 505;
    return -1;
  }
  /* RFC 9112 3.2: an HTTP/1.1 request has exactly one Host */
  size_t hosts = 0;
  for (size_t i = 0; i < r->n_headers; i++) hosts += strcasecmp(r->headers[i].name, "Host") == 0;
  if (hosts > 1 || (hosts == 0 && r->http_minor >= 1)) {
    c->err_reason = hosts ? "more than one Host header" : "no Host header";
    return -1;
  }
  p->upgrade = 0; /* we never switch protocols: an Upgrade request is a plain request */
  if (!r->url) r->url = strdup("/");
  char *q = r->url ? strchr(r->url, '?') : NULL;
  r->path = q ? strndup(r->url, (size_t)(q - r->url)) : strdup(r->url ? r->url : "/");
  if (!r->path) return -1;
  r->query = q ? q + 1 : "";
  /* The owner decides from the head alone (a missing key, a route's own body limit)
   * before anything of the body is read or 100 Continue invites it. */
  int has_body = (p->flags & F_CHUNKED) || ((p->flags & F_CONTENT_LENGTH) && p->content_length > 0);
  if (s->head_fn && has_body) {
    c->in_head_fn = 1;
    s->head_fn(r, s->ud);
    c->in_head_fn = 0;
    if (c->req != r || c->closing) {
      /* answered (and r freed): the body is never read; the parser stops here */
      c->answered_early = 1;
      return -1;
    }
    /* a streamed body is held nowhere here: its owner's limit stands (an upload) */
    if (!r->on_body_data && r->max_body > s->limits.max_body_bytes) r->max_body = s->limits.max_body_bytes;
    r->body.max = r->max_body;
  }
  if ((p->flags & F_CONTENT_LENGTH) && p->content_length > r->max_body) {
    c->err_status = 413;
    return -1;
  }
  /* Nothing is taken on the client's word: the body takes budget and memory as its
   * bytes arrive (on_body), so a connection that announces a body and sends none holds
   * neither. */
  c->body_announced = (p->flags & F_CONTENT_LENGTH) ? p->content_length : 0;
  const char *expect = pr_http_header_get(r, "Expect");
  if (expect) {
    if (strcasecmp(expect, "100-continue") != 0) {
      c->err_status = 417;
      return -1;
    }
    if (r->http_minor >= 1) conn_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, NULL, 0);
  }
  c->state = CONN_BODY;
  conn_arm(c, s->limits.body_timeout_ms);
  return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n) {
  pr_http_conn *c = CONN(p);
  pr_http_req *r = c->req;
  if (r->on_body_data) {
    if (r->body_seen + n > r->max_body) {
      c->err_status = 413;
      return -1;
    }
    r->body_seen += n;
    conn_arm(c, c->server->limits.body_timeout_ms);
    c->in_head_fn = 1; /* an answer now closes the connection, as the head hook's does */
    int rc = r->on_body_data(r, at, n);
    c->in_head_fn = 0;
    if (c->req != r || c->closing) {
      c->answered_early = 1;
      return -1;
    }
    if (rc) {
      conn_close(c, 1);
      c->answered_early = 1;
      return -1;
    }
    return 0;
  }
  if (r->body.len + n > r->max_body) {
    c->err_status = 413;
    return -1;
  }
  /* every body takes budget as it arrives; one that would pass the budget part-way is
   * answered 503 server_busy and the connection closes (the rest is not read) */
  size_t want = r->body.len + n;
  if (want > r->body_reserved) {
    if (pr_budget_take(&g_body_budget, want - r->body_reserved)) {
      c->err_status = 503;
      return -1;
    }
    r->body_reserved = want;
  }
  /* a body with a Content-Length in one allocation rather than a doubling per packet,
   * made once its first bytes are here; only a modest size on the client's word */
  if (!r->body.data && c->body_announced)
    pr_buf_reserve(&r->body, c->body_announced < 65536 ? (size_t)c->body_announced : 65536);
  if (pr_buf_append(&r->body, at, n)) {
    c->err_status = 413;
    return -1;
  }
  return 0;
}

/* Chunk extensions are skipped, but not without end (Node's CVE-2024-22019): their
 * bytes count against the header limit. */
static int on_chunk_extension(llhttp_t *p, const char *at, size_t n) {
  (void)at;
  pr_http_conn *c = CONN(p);
  c->head_bytes += n;
  if (c->head_bytes <= c->server->limits.max_header_bytes) return 0;
  c->err_reason = "chunk extensions too long";
  return -1;
}

static int on_message_complete(llhttp_t *p) {
  pr_http_conn *c = CONN(p);
  c->state = CONN_HANDLING;
  c->n_req++;
  c->server->n_requests++;
  uv_timer_stop(&c->timer);
  return HPE_PAUSED;
}

static void settings_init(void) {
  if (http_settings_ready) return;
  llhttp_settings_init(&http_settings);
  http_settings.on_message_begin = on_message_begin;
  http_settings.on_url = on_url;
  http_settings.on_header_field = on_header_field;
  http_settings.on_header_value = on_header_value;
  http_settings.on_header_value_complete = on_header_value_complete;
  http_settings.on_headers_complete = on_headers_complete;
  http_settings.on_body = on_body;
  http_settings.on_message_complete = on_message_complete;
  http_settings.on_chunk_extension_name = on_chunk_extension;
  http_settings.on_chunk_extension_value = on_chunk_extension;
  http_settings_ready = 1;
}

/* Parse what is pending until a request is complete, then hand it to the handler.
 * Loops rather than recursing so a burst of pipelined requests answered synchronously
 * does not grow the stack. */
static void conn_feed(pr_http_conn *c) {
  c->in_feed = 1;
  while (!c->closing && c->pending.len && c->queued <= c->server->high_water &&
         (c->state == CONN_IDLE || c->state == CONN_HEAD || c->state == CONN_BODY)) {
    llhttp_errno_t e = llhttp_execute(&c->parser, c->pending.data, c->pending.len);
    if (e == HPE_OK) {
      for (size_t i = c->pending.len; i-- > 0;)
        if (c->pending.data[i] != ' ' && c->pending.data[i] != '\t') {
          c->last_nonws = c->pending.data[i];
          break;
        }
      pr_buf_reset(&c->pending);
      break;
    }
    if (c->answered_early) {
      /* head_fn answered: what follows the head is never parsed */
      pr_buf_reset(&c->pending);
      break;
    }
    if (e == HPE_PAUSED) {
      const char *pos = llhttp_get_error_pos(&c->parser);
      size_t used = pos ? (size_t)(pos - c->pending.data) : c->pending.len;
      pr_buf_consume(&c->pending, used);
      pr_http_req *r = c->req;
      c->server->handler(r, c->server->ud);
      continue; /* the handler may have answered at once; then parse on */
    }
    int status = c->err_status ? c->err_status : 400;
    const char *msg = status == 413   ? "the request body is too large"
                      : status == 503 ? "the gateway is holding too many request bodies; retry shortly"
                      : status == 431 ? "the request headers are too large or too many"
                      : status == 417 ? "unsupported Expect header"
                      : status == 505 ? "only HTTP/1.0 and HTTP/1.1 are served here"
                      : c->err_reason ? c->err_reason
                                      : llhttp_get_error_reason(&c->parser);
    const char *code = status == 413   ? "request_too_large"
                       : status == 503 ? "server_busy"
                       : status == 431 ? "headers_too_large"
                       : status == 417 ? "expectation_failed"
                       : status == 505 ? "http_version_not_supported"
                                       : "bad_request";
    char m[256];
    snprintf(m, sizeof(m), "%s%s", status == 400 ? "malformed HTTP request: " : "",
             msg ? msg : "parse error");
    pr_buf_reset(&c->pending);
    conn_fail(c, status, m, code);
    break;
  }
  /* A connection mostly waits: for the answer of a request it sent (minutes for a long
   * prompt on a phone) or for its next request. Keep no read buffer sized for the last
   * request meanwhile (a 7,000-token review leaves ~28 KiB). */
  if (c->pending.len == 0) pr_buf_free(&c->pending);
  c->in_feed = 0;
}

static void conn_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  static char slab[64 * 1024]; /* one loop, one reader at a time: data is copied at once */
  *buf = uv_buf_init(slab, sizeof(slab));
}

static void conn_on_plain(pr_http_conn *c, const char *data, size_t n);

/* Records from the socket: handshake first, then decrypt whatever is complete. */
static void tls_input(pr_http_conn *c, const char *data, size_t n) {
  if (BIO_write(c->rbio, data, (int)n) != (int)n) {
    conn_close(c, 1);
    return;
  }
  if (!c->tls_ready) {
    int r = SSL_do_handshake(c->ssl);
    tls_flush(c);
    if (c->closing) return;
    if (r != 1) {
      int e = SSL_get_error(c->ssl, r);
      ERR_clear_error();
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) conn_close(c, 1);
      return;
    }
    c->tls_ready = 1;
  }
  static char plain[16 * 1024];
  for (;;) {
    int r = SSL_read(c->ssl, plain, sizeof(plain));
    if (r > 0) {
      conn_on_plain(c, plain, (size_t)r);
      if (c->closing) return;
      continue;
    }
    int e = SSL_get_error(c->ssl, r);
    ERR_clear_error();
    tls_flush(c); /* session tickets, key updates */
    if (c->closing) return;
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return;
    /* close_notify or a TLS error: the client is done */
    conn_close(c, e != SSL_ERROR_ZERO_RETURN);
    return;
  }
}

static void conn_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  pr_http_conn *c = st->data;
  if (c->closing) return;
  if (nread < 0) {
    /* EOF or error: whatever is in flight is abandoned by the client. */
    conn_close(c, nread != UV_EOF);
    return;
  }
  if (nread == 0) return;
  if (c->lingering) return; /* discard input after our last answer */
  if (c->ssl)
    tls_input(c, buf->base, (size_t)nread);
  else
    conn_on_plain(c, buf->base, (size_t)nread);
}

/* Request bytes in the clear, from the socket or out of TLS. */
static void conn_on_plain(pr_http_conn *c, const char *data, size_t n) {
  uv_stream_t *st = (uv_stream_t *)&c->tcp;
  if (pr_buf_append(&c->pending, data, n)) {
    conn_close(c, 1);
    return;
  }
  if (c->state == CONN_HANDLING || c->state == CONN_DRAINING ||
      c->queued > c->server->high_water) {
    /* pipelined bytes wait (for the answer to end, or for the client to read what it was
     * sent); stop reading when too many pile up */
    if (c->pending.len > c->server->limits.max_pending_bytes) {
      uv_read_stop(st);
      c->read_stopped = 1;
    }
    return;
  }
  if (!c->in_feed) conn_feed(c);
}

static void conn_read_start(pr_http_conn *c) {
  uv_read_start((uv_stream_t *)&c->tcp, conn_alloc_cb, conn_read_cb);
}

/* ---- the server ---------------------------------------------------------------------- */

void pr_http_server_set_tls(pr_http_server *s, SSL_CTX *ctx) {
  if (s->tls) SSL_CTX_free(s->tls); /* live connections keep their own reference */
  s->tls = ctx;
}

void pr_http_server_init(pr_http_server *s, uv_loop_t *loop, pr_http_handler_fn handler, void *ud) {
  memset(s, 0, sizeof(*s));
  settings_init();
  s->loop = loop;
  s->handler = handler;
  s->ud = ud;
  pr_http_limits_default(&s->limits);
  s->low_water = 16 * 1024;
  s->high_water = 256 * 1024;
}

static void on_connection(uv_stream_t *ls, int status) {
  pr_http_server *s = ls->data;
  if (status < 0) return;
  if (!s->closing && over_budget(s)) {
    if (!s->accept_waiting) {
      s->accept_waiting = 1;
      s->next_waiting = g_waiting;
      g_waiting = s;
    }
    uint64_t now = uv_now(s->loop);
    if (!g_wait_logged_ms || now - g_wait_logged_ms >= 10000) {
      g_wait_logged_ms = now;
      pr_warn("connection limit reached (%zu open; listener limit %zu, process limit %zu): "
              "new connections wait in the listen queue", g_open_conns, s->max_conns, g_max_conns);
    }
    return; /* not accepted: libuv pauses this listener until resume_accepts */
  }
  pr_http_conn *c = calloc(1, sizeof(*c));
  if (!c) return;
  c->server = s;
  uv_tcp_init(s->loop, &c->tcp);
  uv_timer_init(s->loop, &c->timer);
  c->tcp.data = c;
  c->timer.data = c;
  c->handles_open = 2;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_conns++;
  g_open_conns++;
  if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0 || s->closing) {
    conn_close(c, 1);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6)
      uv_ip6_name((struct sockaddr_in6 *)&ss, c->peer, sizeof(c->peer));
    else
      uv_ip4_name((struct sockaddr_in *)&ss, c->peer, sizeof(c->peer));
  }
  pr_buf_init(&c->pending, s->limits.max_pending_bytes + 128 * 1024);
  pr_buf_init(&c->hfield, s->limits.max_header_bytes);
  pr_buf_init(&c->hvalue, s->limits.max_header_bytes);
  llhttp_init(&c->parser, HTTP_REQUEST, &http_settings);
  c->parser.data = c;
  if (s->tls) {
    c->ssl = SSL_new(s->tls);
    c->rbio = BIO_new(BIO_s_mem());
    c->wbio = BIO_new(BIO_s_mem());
    if (!c->ssl || !c->rbio || !c->wbio) {
      BIO_free(c->rbio);
      BIO_free(c->wbio);
      conn_close(c, 1);
      return;
    }
    SSL_set_bio(c->ssl, c->rbio, c->wbio);
    SSL_set_accept_state(c->ssl);
  }
  c->state = CONN_IDLE;
  conn_arm(c, s->limits.header_timeout_ms); /* a new connection must start a request soon */
  conn_read_start(c);
}

static void listener_closed(uv_handle_t *h);

int pr_http_server_listen(pr_http_server *s, const char *addr) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof(ss));
  if (s->listening || s->listener_closing) return -EBUSY;
  int rc = pr_addr_parse(addr, &ss, NULL);
  if (rc) return -EINVAL;
  uv_tcp_init(s->loop, &s->listener);
  s->listener.data = s;
  rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&ss, 0);
  if (!rc) rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
  if (rc) {
    /* the handle must finish closing before the server's memory may go:
     * pr_http_server_close() waits for it */
    s->listener_closing = 1;
    uv_close((uv_handle_t *)&s->listener, listener_closed);
    return rc;
  }
  s->listening = 1;
  return 0;
}

int pr_http_server_port(pr_http_server *s) {
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  if (!s->listening || uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len)) return -1;
  if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void listener_closed(uv_handle_t *h) {
  pr_http_server *s = h->data;
  s->listener_closing = 0;
  server_maybe_closed(s);
}

void pr_http_server_stop_listening(pr_http_server *s) {
  if (s->accept_waiting) waiting_remove(s); /* libuv closes the connection it holds */
  if (!s->listening) return;
  s->listening = 0;
  s->listener_closing = 1;
  uv_close((uv_handle_t *)&s->listener, listener_closed);
}

/* Idle connections close once what they were sent is written (a lingering close);
 * from now on every answer says Connection: close. */
void pr_http_server_close_idle(pr_http_server *s) {
  s->no_keepalive = 1;
  pr_http_conn *c = s->conns;
  while (c) {
    pr_http_conn *next = c->next;
    if (c->state == CONN_IDLE || c->state == CONN_HEAD) {
      c->state = CONN_DRAINING;
      pr_buf_reset(&c->pending);
      conn_maybe_finish(c);
    }
    c = next;
  }
}

void pr_http_server_reset_all(pr_http_server *s) {
  pr_http_conn *c = s->conns;
  while (c) {
    pr_http_conn *next = c->next;
    conn_close(c, 1);
    c = next;
  }
}

size_t pr_http_server_inflight(const pr_http_server *s) {
  size_t n = 0;
  for (pr_http_conn *c = s->conns; c; c = c->next)
    if (c->state == CONN_HANDLING) n++;
  return n;
}

void pr_http_server_close(pr_http_server *s, void (*on_closed)(pr_http_server *s)) {
  s->closing = 1;
  s->on_closed = on_closed;
  pr_http_server_stop_listening(s);
  pr_http_conn *c = s->conns;
  while (c) {
    pr_http_conn *next = c->next;
    /* what was already answered is still delivered (bounded by send_timeout) */
    if ((c->state == CONN_IDLE || c->state == CONN_DRAINING) && c->queued > 0) {
      c->state = CONN_DRAINING;
      conn_maybe_finish(c);
    } else {
      conn_close(c, 0);
    }
    c = next;
  }
  server_maybe_closed(s);
}
