/* The HTTP/1.1 server connection layer both daemons serve with: libuv streams parsed by
 * llhttp, with limits enforced in the parser callbacks (header bytes, header count, body
 * bytes, header read time, idle time), keep-alive, pipelining (one request at a time per
 * connection, answered in order), Expect: 100-continue, chunked request bodies, and
 * responses whole, fixed-length or chunked (SSE) with write backpressure.
 *
 * Ownership: the server owns its connections; a connection owns its current request.
 * A handler receives a complete request and must answer it exactly once, either with
 * pr_http_respond() or pr_http_start() ... pr_http_write() ... pr_http_end(), possibly
 * later from another callback; once pr_http_respond or pr_http_end returns, the request
 * is freed (its bytes are queued on the connection). If the client goes away first, the request's on_abort
 * callback runs (set it when the answer will come later); after on_abort returns the
 * request is freed and must not be touched again. The handler's own per-request state
 * hangs off req->data. All bytes go through one transport hook (plain TCP now, TLS
 * with memory BIOs later) so TLS slots in without touching the HTTP code. */
#ifndef PR_HTTP_H
#define PR_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>
#include <uv.h>

#include "buf.h"

typedef struct pr_http_server pr_http_server;
typedef struct pr_http_conn pr_http_conn;
typedef struct pr_http_req pr_http_req;

typedef struct pr_http_limits {
  size_t max_header_bytes;      /* request line + headers; 431 past it (default 16 KiB) */
  size_t max_headers;           /* 431 past it (default 100) */
  size_t max_body_bytes;        /* 413 past it (default 8 MiB) */
  uint64_t header_timeout_ms;   /* from a request's first byte to its last header (10 s) */
  uint64_t body_timeout_ms;     /* from the last header to the last body byte (60 s) */
  uint64_t idle_timeout_ms;     /* keep-alive wait between requests (60 s) */
  size_t max_pending_bytes;     /* pipelined bytes buffered while a request runs (64 KiB) */
  unsigned max_requests_per_conn; /* 0: unlimited */
  uint64_t send_timeout_ms;     /* an answer makes no write progress this long: close (60 s) */
} pr_http_limits;

void pr_http_limits_default(pr_http_limits *l);

typedef struct pr_http_header {
  char *name;  /* as sent */
  char *value; /* leading/trailing spaces removed */
} pr_http_header;

typedef void (*pr_http_handler_fn)(pr_http_req *req, void *ud);
/* Runs when the headers of a request that has a body (a Content-Length above 0, or
 * chunked) are complete: before 100 Continue is sent and before any body byte is read
 * (req has method, url, path, query and headers). A request without a body goes
 * straight to the handler, which can answer it as well and keep the connection. It
 * may refuse the request at once with pr_http_respond (never a streamed answer): the
 * answer says Connection: close and the connection closes after it without reading
 * the body (a short lingering close discards what the client still sends). Or it may
 * lower this request's body limit by setting req->max_body. Doing neither lets the
 * request go on. `ud` is the server's handler data. */
typedef void (*pr_http_head_fn)(pr_http_req *req, void *ud);
/* Formats an error body for errors the HTTP layer answers itself (400, 408, 413, 431).
 * Default: OpenAI's error shape. Sets content type via *ctype, and may write one extra
 * header line ("Name: value") into `header` (size header_n). `req` holds whatever of
 * the request was read (its headers may be incomplete). */
typedef void (*pr_http_error_fn)(pr_buf *out, const char **ctype, char *header, size_t header_n,
                                 int status, const char *message, const char *code,
                                 const pr_http_req *req, void *ud);

struct pr_http_req {
  pr_http_conn *conn;
  pr_http_server *server;
  char method[16];
  char *url;              /* raw request target */
  char *path;             /* target without query, NUL-terminated */
  char *query;            /* after '?', or "" */
  pr_http_header *headers;
  size_t n_headers;
  pr_buf body;
  size_t max_body;        /* this request's body limit, at most the server's unless streamed (head_fn) */
  size_t body_reserved;   /* bytes of the process's body budget this request holds */
  int http_minor;         /* 0 or 1 */
  int keep_alive;         /* what the client asked and the protocol allows */
  uint64_t start_ms;      /* uv_now() when the first byte arrived */
  void *data;             /* the handler's per-request state */
  /* Called when the client goes away (or the server is reset) before the answer ended. */
  void (*on_abort)(pr_http_req *req);
  /* Called when the queued response bytes drop below the low-water mark after
   * pr_http_write returned 1 (backpressure). */
  void (*on_drain)(pr_http_req *req);
  /* A streamed body (set by the head hook): each piece of the body goes to on_body_data
   * as it arrives instead of into `body`, which stays empty and holds none of the body
   * budget; max_body (the head hook's, which may pass the server's max_body_bytes here)
   * still bounds the total (413), and the body timeout counts from the
   * last piece rather than the head. on_body_data may answer the request at once with
   * pr_http_respond (never a streamed answer): the rest of the body is not read and the
   * connection closes after the answer. It returns 0, or non-zero to drop the connection
   * without an answer. If the connection ends before the handler got the request,
   * on_abort runs (when set). */
  int (*on_body_data)(pr_http_req *req, const char *at, size_t n);
  uint64_t body_seen;     /* bytes of a streamed body so far */
  /* response state, managed by http.c */
  int resp_state;         /* 0 none, 1 started, 2 ended */
  int resp_chunked;
  int resp_status;
  int close_after;        /* send Connection: close and close after this answer */
  uint64_t bytes_out;
};

struct pr_http_server {
  uv_loop_t *loop;
  uv_tcp_t listener;
  int listening;
  int listener_closing;
  pr_http_limits limits;
  pr_http_handler_fn handler;
  void *ud;
  pr_http_head_fn head_fn;      /* optional: decide at headers-complete (see pr_http_head_fn) */
  pr_http_error_fn error_fn;
  void *error_ud;
  const char *server_name;     /* "Server:" header, may be NULL */
  size_t low_water, high_water; /* backpressure marks for queued output (16 KiB / 256 KiB) */
  pr_http_conn *conns;          /* intrusive list of open connections */
  size_t n_conns;
  size_t conns_closing;         /* closed, waiting for their handles' close callbacks */
  size_t max_conns;             /* past it new connections wait unaccepted; 0 unlimited */
  int accept_waiting;           /* holding a connection back (see pr_http_set_process_max_conns) */
  struct pr_http_server *next_waiting;
  int closing;
  int no_keepalive;             /* graceful shutdown: answers say Connection: close */
  void (*on_closed)(pr_http_server *s); /* after pr_http_server_close finished */
  uint64_t n_requests;          /* requests received since start */
  SSL_CTX *tls;                 /* HTTPS when set; one reference owned by the server */
};

/* A limit on the connections of all servers in the process together (0: none). Past it
 * (or past a server's own max_conns) new connections are not accepted but wait in the
 * kernel's listen queue until an open one closes. */
void pr_http_set_process_max_conns(size_t max);

/* A budget on the request body bytes that all servers of the process buffer together
 * (0: none). Every body takes budget as its bytes arrive, never on the word of its
 * Content-Length (a client that announces a body and sends nothing holds none); a
 * request whose body would take the total past it is answered 503 `server_busy` with
 * Retry-After there, part-way through its body, and the connection closes. The bytes
 * go back when the request's body is freed (pr_http_req_free_body or the end of the
 * request). */
void pr_http_set_body_budget(size_t max);
/* Body bytes held against the budget now (counted with or without a budget). */
size_t pr_http_body_bytes(void);

/* Set up a server on loop; listen with pr_http_server_listen. */
void pr_http_server_init(pr_http_server *s, uv_loop_t *loop, pr_http_handler_fn handler, void *ud);
/* Bind and listen on "HOST:PORT" ("[::1]:PORT" for IPv6). Returns 0 or a negative code;
 * after a failure, release the server with pr_http_server_close (not free). */
int pr_http_server_listen(pr_http_server *s, const char *addr);
/* The port actually bound (useful with port 0). */
int pr_http_server_port(pr_http_server *s);
/* Serve TLS on new connections with ctx (the server takes over the caller's reference;
 * NULL: plain HTTP). Connections already open keep the context they started with. */
void pr_http_server_set_tls(pr_http_server *s, SSL_CTX *ctx);
/* Stop accepting; open connections continue. */
void pr_http_server_stop_listening(pr_http_server *s);
/* Graceful shutdown step: connections with no request in flight close once their
 * answers are written, and all answers from now on carry Connection: close. */
void pr_http_server_close_idle(pr_http_server *s);
/* Reset every connection (RST), aborting requests in flight. */
void pr_http_server_reset_all(pr_http_server *s);
/* Number of requests in flight. */
size_t pr_http_server_inflight(const pr_http_server *s);
/* Stop listening and close every connection; on_closed runs when all handles are closed. */
void pr_http_server_close(pr_http_server *s, void (*on_closed)(pr_http_server *s));

/* Request accessors. Header lookup is case-insensitive; NULL when absent. */
const char *pr_http_header_get(const pr_http_req *req, const char *name);
/* Peer address as text ("127.0.0.1"). */
void pr_http_peer(const pr_http_req *req, char *out, size_t n);

/* Answer whole: status, extra headers as a NULL-terminated list of
 * "Name: value" strings (may be NULL), content type and body. Content-Length,
 * Connection and Server are added. Returns 0, or PR_ECLOSED when the client is gone. */
int pr_http_respond(pr_http_req *req, int status, const char *const *headers, const char *ctype,
                    const char *body, size_t len);

/* Start a streamed answer (Transfer-Encoding: chunked; HTTP/1.0 clients get close-
 * delimited bodies). Then pr_http_write any number of times and pr_http_end. */
int pr_http_start(pr_http_req *req, int status, const char *const *headers, const char *ctype);
/* Queue body bytes. Returns 0 when the output queue is below the high-water mark, 1
 * when it is above it (stop producing until on_drain), or PR_ECLOSED. */
int pr_http_write(pr_http_req *req, const void *data, size_t len);
/* Whether the client is behind: returns 1 (and arranges for on_drain to run once the
 * output drains) when the queued bytes are above the high-water mark, else 0, or
 * PR_ECLOSED. For producers that check before they write. */
int pr_http_want_drain(pr_http_req *req);
/* Finish a streamed answer. The request is freed before this returns. */
int pr_http_end(pr_http_req *req);
/* Drop the connection now (RST), as a phone that vanishes would. Frees the request
 * without calling on_abort. */
void pr_http_abort(pr_http_req *req);
/* The owner lets go of req: its data, on_abort and on_drain are cleared, so nothing the
 * connection does later reaches the owner. Returns req (for answering it next); NULL in,
 * NULL out. */
pr_http_req *pr_http_req_let_go(pr_http_req *req);
/* Free the request body now (the handler has parsed it) and give its bytes back to the
 * process's body budget. */
void pr_http_req_free_body(pr_http_req *req);
/* Bytes queued for this request's connection and not yet written. */
size_t pr_http_queued(const pr_http_req *req);

/* Status reason phrase ("OK", "Not Found"...). */
const char *pr_http_reason(int status);

#endif
