/* The tunnel's life on the bridge socket; see tunnel.h. libuv 1.44's uv_pipe_connect
 * takes a NUL-terminated path and so cannot name an abstract socket: each call opens a
 * non-blocking AF_UNIX socket itself, connects it (immediate for Unix sockets, or
 * refused) and hands it to a uv_pipe_t with uv_pipe_open. */
#include "tunnel.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "err.h"
#include "log.h"

#define TUN_CALL_TIMEOUT_MS 10000
#define TUN_POLL_DEFAULT_MS 3000
#define TUN_BACKOFF_FIRST_MS 1000u
#define TUN_BACKOFF_MAX_MS 30000u
#define TUN_STATUS_ERRORS_REOPEN 3

enum { CALL_START, CALL_STATUS };

/* One bridge call: its own connection. Owned by itself: freed once both handles are
 * closed; t is cleared when the tunnel lets go of it (then its answer is dropped). */
typedef struct tun_call {
  ag_tunnel *t;
  int kind, id;
  uv_pipe_t pipe;
  uv_timer_t deadline;
  uv_write_t wr;
  int open_handles;
  int finished;
  pr_buf out, in;
  char rbuf[4096];
} tun_call;

/* The tunnel. Owned by its creator; owns its strings, the timer and (through t) the call
 * in flight. */
struct ag_tunnel {
  uv_loop_t *loop;
  char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
  size_t sock_len;
  char *relays[AG_TUNRPC_MAX_RELAYS];
  size_t n_relays;
  char *domain, *key_b64, *local_addr;
  uint64_t poll_ms;
  ag_tunnel_url_fn url_fn;
  void *ud;
  uv_timer_t timer;         /* the next call */
  int next_kind;
  tun_call *call;           /* in flight, or NULL */
  int next_id;
  unsigned fails;           /* opens since the tunnel last ran */
  unsigned status_errors;   /* unreadable statuses in a row */
  int last_status;
  char url[AG_TUNRPC_URL_MAX + 1];
  int stopping;
  void (*on_stopped)(void *arg);
  void *stopped_arg;
};

uint64_t ag_tunnel_backoff_ms(unsigned fails) {
  if (fails == 0) return 0;
  uint64_t ms = TUN_BACKOFF_FIRST_MS;
  for (unsigned i = 1; i < fails && ms < TUN_BACKOFF_MAX_MS; i++) ms *= 2;
  return ms > TUN_BACKOFF_MAX_MS ? TUN_BACKOFF_MAX_MS : ms;
}

static uint64_t jitter(uint64_t ms) {
  unsigned char r[2] = {0, 0};
  if (RAND_bytes(r, sizeof(r)) != 1) return ms;
  double f = 0.75 + 0.5 * ((double)(r[0] << 8 | r[1]) / 65535.0); /* 0.75 .. 1.25 */
  return (uint64_t)((double)ms * f);
}

static void tun_fire(uv_timer_t *h);

static void tun_arm(ag_tunnel *t, int kind, uint64_t ms) {
  if (t->stopping) return;
  t->next_kind = kind;
  uv_timer_start(&t->timer, tun_fire, ms, 0);
}

/* ---- what an answer means --------------------------------------------------------------- */

static void tun_reopen(ag_tunnel *t, const char *why) {
  t->fails++;
  uint64_t ms = jitter(ag_tunnel_backoff_ms(t->fails));
  pr_warn("tunnel: %s; opening it again in %.1f s", why, (double)ms / 1000.0);
  tun_arm(t, CALL_START, ms);
}

static void tun_started(ag_tunnel *t, int rc, const char *line, size_t len) {
  ag_tunnel_info info;
  char why[300];
  if (rc == 0) rc = ag_tunrpc_parse_start(line, len, t->next_id, t->domain, &info, why, sizeof(why));
  else snprintf(why, sizeof(why), "%s", pr_strerror(rc));
  if (rc < 0) {
    char msg[360];
    snprintf(msg, sizeof(msg), "tunnel_start %s: %s",
             rc == PR_EPARSE || rc == PR_ETYPE || rc == PR_EMISSING || rc == PR_ERANGE || rc == PR_ETOOLARGE
                 ? "answer refused" : "failed", why);
    tun_reopen(t, msg);
    return;
  }
  t->status_errors = 0;
  int changed = strcmp(t->url, info.url) != 0;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "url", info.url);
  cJSON_AddStringToObject(f, "client_id", info.client_id);
  cJSON_AddBoolToObject(f, "changed", changed);
  pr_log_kv(PR_LOG_INFO, "tunnel open", f);
  if (changed) {
    snprintf(t->url, sizeof(t->url), "%s", info.url);
    if (t->url_fn) t->url_fn(t->ud, t->url);
  }
  tun_arm(t, CALL_STATUS, t->poll_ms);
}

static void tun_status(ag_tunnel *t, int rc, const char *line, size_t len) {
  int st = AG_TUN_NONE;
  char why[300];
  if (rc == 0) rc = ag_tunrpc_parse_status(line, len, t->next_id, &st, why, sizeof(why));
  else snprintf(why, sizeof(why), "%s", pr_strerror(rc));
  if (rc < 0) {
    t->status_errors++;
    pr_warn("tunnel: tunnel_status %s (%u in a row): %s",
            rc == PR_EPARSE || rc == PR_ETYPE || rc == PR_EMISSING || rc == PR_ERANGE || rc == PR_ETOOLARGE
                ? "answer refused" : "failed", t->status_errors, why);
    if (t->status_errors >= TUN_STATUS_ERRORS_REOPEN) {
      t->status_errors = 0;
      tun_reopen(t, "its status cannot be read");
    } else {
      tun_arm(t, CALL_STATUS, t->poll_ms);
    }
    return;
  }
  t->status_errors = 0;
  if (st != t->last_status) pr_info("tunnel %s", ag_tunrpc_status_name(st));
  t->last_status = st;
  if (st == AG_TUN_RUNNING || st == AG_TUN_STARTING) {
    if (st == AG_TUN_RUNNING) t->fails = 0;
    tun_arm(t, CALL_STATUS, t->poll_ms);
    return;
  }
  char msg[64];
  snprintf(msg, sizeof(msg), "the tunnel is %s", ag_tunrpc_status_name(st));
  tun_reopen(t, msg);
}

/* ---- one call ------------------------------------------------------------------------ */

static void call_closed(uv_handle_t *h) {
  tun_call *c = h->data;
  if (--c->open_handles > 0) return;
  if (c->out.data) OPENSSL_cleanse(c->out.data, c->out.len); /* it held the key */
  pr_buf_free(&c->out);
  pr_buf_free(&c->in);
  free(c);
}

/* The call is over (rc 0: the answer is in c->in): tell the tunnel, close the handles. */
static void call_finish(tun_call *c, int rc) {
  if (c->finished) return;
  c->finished = 1;
  ag_tunnel *t = c->t;
  if (t) {
    t->call = NULL;
    c->t = NULL;
    const char *line = c->in.data ? c->in.data : "";
    if (c->kind == CALL_START) tun_started(t, rc, line, c->in.len);
    else tun_status(t, rc, line, c->in.len);
  }
  uv_read_stop((uv_stream_t *)&c->pipe);
  uv_close((uv_handle_t *)&c->pipe, call_closed);
  uv_close((uv_handle_t *)&c->deadline, call_closed);
}

static void call_timeout(uv_timer_t *h) { call_finish(h->data, -ETIMEDOUT); }

static void call_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  tun_call *c = h->data;
  (void)hint;
  *buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
}

static void call_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  tun_call *c = s->data;
  if (n == UV_EOF) {
    call_finish(c, c->in.len ? 0 : PR_ECLOSED);
    return;
  }
  if (n < 0) {
    call_finish(c, (int)n);
    return;
  }
  if (n == 0) return;
  const char *nl = memchr(buf->base, '\n', (size_t)n);
  size_t take = nl ? (size_t)(nl - buf->base) : (size_t)n;
  if (pr_buf_append(&c->in, buf->base, take) < 0) {
    call_finish(c, PR_ETOOLARGE);
    return;
  }
  if (nl) call_finish(c, 0); /* one line is the whole answer */
}

static void call_written(uv_write_t *w, int status) {
  tun_call *c = w->data;
  if (status < 0) call_finish(c, status);
}

/* Connect to the bridge and send the request in c->out. 0, or a negative code with
 * nothing left open. */
static int call_open(ag_tunnel *t, tun_call *c) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path + 1, t->sock, t->sock_len); /* sun_path[0] = '\0': abstract */
  socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + t->sock_len);
  if (connect(fd, (struct sockaddr *)&sa, sl) < 0) {
    /* a Unix socket connects at once or not at all (EAGAIN: its backlog is full) */
    int e = errno;
    close(fd);
    return -e;
  }
  int rc = uv_pipe_init(t->loop, &c->pipe, 0);
  if (rc < 0) {
    close(fd);
    return rc;
  }
  c->pipe.data = c;
  c->open_handles = 1;
  uv_timer_init(t->loop, &c->deadline);
  c->deadline.data = c;
  c->open_handles = 2;
  if ((rc = uv_pipe_open(&c->pipe, fd)) < 0) {
    close(fd);
    return rc;
  }
  uv_timer_start(&c->deadline, call_timeout, TUN_CALL_TIMEOUT_MS, 0);
  uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
  c->wr.data = c;
  if ((rc = uv_write(&c->wr, (uv_stream_t *)&c->pipe, &b, 1, call_written)) < 0) return rc;
  return uv_read_start((uv_stream_t *)&c->pipe, call_alloc, call_read);
}

static void tun_fire(uv_timer_t *h) {
  ag_tunnel *t = h->data;
  if (t->stopping || t->call) return;
  tun_call *c = calloc(1, sizeof(*c));
  if (!c) {
    tun_arm(t, t->next_kind, TUN_BACKOFF_FIRST_MS);
    return;
  }
  c->t = t;
  c->kind = t->next_kind;
  c->id = ++t->next_id;
  pr_buf_init(&c->out, AG_TUNRPC_MAX_LINE);
  pr_buf_init(&c->in, AG_TUNRPC_MAX_LINE + 1);
  int rc;
  if (c->kind == CALL_START) {
    ag_tunspec spec = {.n_relays = t->n_relays, .domain = t->domain, .local_addr = t->local_addr,
                       .key_b64 = t->key_b64};
    for (size_t i = 0; i < t->n_relays; i++) spec.relays[i] = t->relays[i];
    rc = ag_tunrpc_start_request(&c->out, &spec, c->id);
  } else {
    rc = ag_tunrpc_request(&c->out, "tunnel_status", c->id);
  }
  t->call = c;
  if (rc == 0) rc = call_open(t, c);
  if (rc < 0) {
    if (c->open_handles) {
      call_finish(c, rc);
    } else {
      t->call = NULL;
      c->t = NULL;
      if (c->out.data) OPENSSL_cleanse(c->out.data, c->out.len);
      pr_buf_free(&c->out);
      pr_buf_free(&c->in);
      free(c);
      if (t->next_kind == CALL_START) tun_started(t, rc, "", 0);
      else tun_status(t, rc, "", 0);
    }
  }
}

/* ---- the owner's side -------------------------------------------------------------------- */

int ag_tunnel_new(ag_tunnel **out, uv_loop_t *loop, const ag_tunnel_config *cfg) {
  *out = NULL;
  size_t sl = strlen(cfg->socket_name);
  ag_tunnel *t = calloc(1, sizeof(*t));
  if (!t) return -ENOMEM;
  if (sl == 0 || sl >= sizeof(t->sock) - 1 || cfg->spec.n_relays == 0 ||
      cfg->spec.n_relays > AG_TUNRPC_MAX_RELAYS) {
    free(t);
    return -EINVAL;
  }
  memcpy(t->sock, cfg->socket_name, sl);
  t->sock_len = sl;
  int ok = 1;
  for (size_t i = 0; i < cfg->spec.n_relays; i++) ok = ok && (t->relays[i] = strdup(cfg->spec.relays[i]));
  t->n_relays = cfg->spec.n_relays;
  ok = ok && (t->domain = strdup(cfg->spec.domain));
  if (ok && cfg->spec.key_b64) ok = (t->key_b64 = strdup(cfg->spec.key_b64)) != NULL;
  if (!ok) {
    ag_tunnel_free(t);
    return -ENOMEM;
  }
  t->loop = loop;
  t->poll_ms = cfg->poll_s > 0 ? (uint64_t)(cfg->poll_s * 1000.0) : TUN_POLL_DEFAULT_MS;
  t->url_fn = cfg->url_fn;
  t->ud = cfg->ud;
  t->last_status = -2;
  uv_timer_init(loop, &t->timer);
  t->timer.data = t;
  *out = t;
  return 0;
}

int ag_tunnel_start(ag_tunnel *t, const char *local_addr) {
  free(t->local_addr);
  if (!(t->local_addr = strdup(local_addr))) return -ENOMEM;
  tun_arm(t, CALL_START, 0);
  return 0;
}

static void tun_timer_closed(uv_handle_t *h) {
  ag_tunnel *t = h->data;
  if (t->on_stopped) t->on_stopped(t->stopped_arg);
}

void ag_tunnel_stop(ag_tunnel *t, void (*on_stopped)(void *arg), void *arg) {
  if (t->stopping) return;
  t->stopping = 1;
  t->on_stopped = on_stopped;
  t->stopped_arg = arg;
  if (t->call) {
    tun_call *c = t->call;
    t->call = NULL;
    c->t = NULL; /* its answer is no longer wanted */
    call_finish(c, PR_ECLOSED);
  }
  uv_close((uv_handle_t *)&t->timer, tun_timer_closed);
}

void ag_tunnel_free(ag_tunnel *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n_relays; i++) free(t->relays[i]);
  free(t->domain);
  if (t->key_b64) OPENSSL_cleanse(t->key_b64, strlen(t->key_b64));
  free(t->key_b64);
  free(t->local_addr);
  free(t);
}
