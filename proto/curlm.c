/* libcurl multi on libuv; see curlm.h for what is fixed relative to curl's example. */
#include "curlm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "err.h"
#include "idmap.h"

/* One transfer's bookkeeping, owned by pr_curlm from add until done or cancel. */
typedef struct curlm_xfer {
  CURL *easy;
  pr_curlm_done_fn done;
  void *ud;
  struct curlm_xfer *next, *prev;
} curlm_xfer;

/* One socket of curl's, from the first time curl asks us to watch it until curl closes
 * it (CURLOPT_CLOSESOCKETFUNCTION): a kept-alive connection keeps its poll handle between
 * transfers, so that reusing it costs no uv_poll_init (two epoll_ctl) and, for a TCP
 * connection, no stop/start either (two more): it stays polled between transfers and is
 * only stopped if it turns readable meanwhile (see poll_cb). Other sockets (curl's
 * resolver socketpair, which curl closes without the callback) are stopped as soon as
 * curl lets go of them: a started handle on a closed descriptor would take the events of
 * whatever reuses the number. Owned by pr_curlm while in its list, freed in the poll
 * handle's close callback (never before: libuv may still hold it). */
typedef struct curlm_sock {
  uv_poll_t poll;
  curl_socket_t fd;
  int want;    /* what curl asked us to watch; 0 once it removed the socket */
  int polled;  /* what the poll handle watches; 0 when stopped */
  int tcp;     /* a TCP connection: curl closes it through close_socket */
  pr_curlm *m; /* cleared when the socket is dropped: late poll events are ignored */
  struct curlm_sock *next, *prev;
} curlm_sock;

/* Easy handles kept for reuse: enough for the transfers of a busy moment. */
#define CURLM_IDLE_MAX 256

/* One host's DNS cache and kept connections (pr_curlm_dns_attach): a share of libcurl's
 * that shares DNS and connections, owned by pr_curlm (m->dns, by authority) and freed at
 * close, or once no handle has used it for PR_CURLM_DNS_IDLE_MS. */
typedef struct curlm_dns {
  CURLSH *sh;
  unsigned users;  /* easy handles attached */
  uint64_t used_ms; /* loop time the last one let go */
  int orphan;      /* m closed while a handle still used it: freed by the last detach */
  pr_curlm *owner; /* an orphan's m: kept until the orphan's connections are closed */
} curlm_dns;

struct pr_curlm {
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  unsigned running;
  curlm_xfer *xfers;
  curlm_sock *socks;
  curlm_sock **byfd; /* the sockets above by descriptor: curl forgets its own socketp
                      * when it removes a socket, we keep it until the socket closes */
  size_t n_byfd;
  CURL *idle[CURLM_IDLE_MAX]; /* easy handles for reuse, reset */
  size_t n_idle;
  pr_idmap dns;           /* curlm_dns by authority */
  size_t dns_sweep_at;    /* sweep idle caches once this many are kept */
  int closing;
  unsigned orphans; /* host shares still held by a request after close (their connections
                     * close through close_socket, with m) */
  int closed;       /* the timer is closed: m is freed by the last orphan */
  pr_curlm_gate_fn gate; /* where transfers may connect (pr_curlm_set_gate); NULL: anywhere */
  void *gate_ud;
  void (*on_closed)(void *);
  void *closed_arg;
};

static void curlm_check_done(pr_curlm *m) {
  CURLMsg *msg;
  int left;
  while (!m->closing && (msg = curl_multi_info_read(m->multi, &left))) {
    if (msg->msg != CURLMSG_DONE) continue;
    CURL *easy = msg->easy_handle;
    CURLcode result = msg->data.result;
    curlm_xfer *x = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
    if (!x) continue;
    pr_curlm_done_fn done = x->done;
    void *ud = x->ud;
    pr_curlm_cancel(m, easy); /* removes the handle and frees x */
    done(easy, result, ud);
  }
}

static void curlm_action(pr_curlm *m, curl_socket_t fd, int flags) {
  int still;
  curl_multi_socket_action(m->multi, fd, flags, &still);
  curlm_check_done(m);
}

static void sock_poll(curlm_sock *s, int events);

static void poll_cb(uv_poll_t *p, int status, int events) {
  curlm_sock *s = p->data;
  pr_curlm *m = s->m;
  if (!m) return;
  if (!s->want) {
    /* an idle kept-alive connection turned readable (the server closed it, most
     * likely): curl is not watching it, so stop until curl wants it again (it checks
     * the connection before reusing it) */
    sock_poll(s, 0);
    return;
  }
  int flags = 0;
  if (status < 0) {
    /* libuv stopped the poll on POLLERR: let curl read or write and find the real error
     * itself, and watch again if it still wants the socket */
    s->polled = 0;
    flags = CURL_CSELECT_IN | CURL_CSELECT_OUT;
  }
  if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  curlm_action(m, s->fd, flags);
  /* s was dropped in curlm_action when s->m is cleared; it is freed only later */
  if (status < 0 && s->m && !m->closing && s->want && !s->polled) sock_poll(s, s->want);
}

static void sock_closed(uv_handle_t *h) { free(h->data); }

/* Watch `events` (0: stop). Every uv_poll_start costs epoll_ctl calls, so a socket
 * already watched for the same events is left as it is. */
static void sock_poll(curlm_sock *s, int events) {
  if (events == s->polled) return;
  if (events) {
    if (uv_poll_start(&s->poll, events, poll_cb) < 0) events = 0;
  } else {
    uv_poll_stop(&s->poll);
  }
  s->polled = events;
}

static void sock_drop(pr_curlm *m, curlm_sock *s) {
  if (s->prev) s->prev->next = s->next;
  else m->socks = s->next;
  if (s->next) s->next->prev = s->prev;
  if (s->fd >= 0 && (size_t)s->fd < m->n_byfd && m->byfd[s->fd] == s) m->byfd[s->fd] = NULL;
  s->m = NULL;
  uv_close((uv_handle_t *)&s->poll, sock_closed); /* stops it */
}

static curlm_sock *sock_find(pr_curlm *m, curl_socket_t fd) {
  return fd >= 0 && (size_t)fd < m->n_byfd ? m->byfd[fd] : NULL;
}

static curlm_sock *sock_new(pr_curlm *m, curl_socket_t fd) {
  if (fd < 0) return NULL;
  if ((size_t)fd >= m->n_byfd) {
    size_t n = m->n_byfd ? m->n_byfd : 64;
    while (n <= (size_t)fd) n *= 2;
    curlm_sock **v = realloc(m->byfd, n * sizeof(*v));
    if (!v) return NULL;
    memset(v + m->n_byfd, 0, (n - m->n_byfd) * sizeof(*v));
    m->byfd = v;
    m->n_byfd = n;
  }
  curlm_sock *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  s->fd = fd;
  s->m = m;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  s->tcp = getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
           (ss.ss_family == AF_INET || ss.ss_family == AF_INET6);
  if (uv_poll_init_socket(m->loop, &s->poll, fd) < 0) {
    free(s);
    return NULL;
  }
  s->poll.data = s;
  s->next = m->socks;
  if (m->socks) m->socks->prev = s;
  m->socks = s;
  m->byfd[fd] = s;
  return s;
}

/* A TCP socket with a peer: a connection curl may keep alive (and then closes through
 * close_socket). One still connecting is not: curl closes a connect attempt it gives up
 * (a transfer cancelled while it connects, a lost happy-eyeballs race) with a plain
 * close(), after or before removing it, and a handle left started on it would make
 * libuv abort in epoll_ctl (EBADF) or take the events of the next descriptor with its
 * number (tests/unit/test_curlm.c). */
static int connected(curl_socket_t fd) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  return getpeername(fd, (struct sockaddr *)&ss, &sl) == 0;
}

static int socket_cb(CURL *easy, curl_socket_t fd, int action, void *userp, void *socketp) {
  (void)easy;
  pr_curlm *m = userp;
  curlm_sock *s = socketp ? socketp : sock_find(m, fd);
  if (action == CURL_POLL_REMOVE) {
    /* curl is done with the socket for now. A TCP connection stays polled (lazily,
     * see poll_cb) until it is reused or closed through close_socket; a socket still
     * connecting does not (see connected). Anything else is
     * stopped at once: curl closes its resolver's socketpair without
     * CURLOPT_CLOSESOCKETFUNCTION, and a started handle on a closed descriptor would take
     * the events of whatever reuses the number (a client accepted next would never be
     * read: tests/unit/test_curlm.c). */
    if (s) {
      s->want = 0;
      if (m->closing) sock_drop(m, s);
      else if (!s->tcp || !connected(fd)) sock_poll(s, 0);
    }
    return 0;
  }
  if (!s) {
    s = sock_new(m, fd);
    if (!s) return -1;
  }
  if (!socketp) curl_multi_assign(m->multi, fd, s);
  int events = 0;
  if (action == CURL_POLL_IN || action == CURL_POLL_INOUT) events |= UV_READABLE;
  if (action == CURL_POLL_OUT || action == CURL_POLL_INOUT) events |= UV_WRITABLE;
  s->want = events;
  sock_poll(s, events);
  return 0;
}

/* Every socket curl closes passes here (curl keeps the callback with the connection,
 * whichever handle closes it): its poll handle must be closed first, or libuv would go
 * on watching a descriptor number the kernel may hand to the next connection. */
static int close_socket(void *clientp, curl_socket_t fd) {
  pr_curlm *m = clientp;
  curlm_sock *s = sock_find(m, fd);
  if (s) sock_drop(m, s);
  return close(fd);
}

static void timer_cb(uv_timer_t *t) {
  pr_curlm *m = t->data;
  if (m->closing) return;
  curlm_action(m, CURL_SOCKET_TIMEOUT, 0);
}

/* curl asks for a timer; it always fires from the loop, never from inside this
 * callback, so curl is not re-entered. */
static int timer_fn(CURLM *multi, long timeout_ms, void *userp) {
  (void)multi;
  pr_curlm *m = userp;
  if (m->closing) return 0;
  if (timeout_ms < 0)
    uv_timer_stop(&m->timer);
  else
    uv_timer_start(&m->timer, timer_cb, (uint64_t)timeout_ms, 0);
  return 0;
}

int pr_curlm_new(pr_curlm **out, uv_loop_t *loop) {
  pr_curlm *m = calloc(1, sizeof(*m));
  if (!m) return -ENOMEM;
  m->loop = loop;
  m->dns_sweep_at = 64;
  m->multi = curl_multi_init();
  if (!m->multi) {
    free(m);
    return -ENOMEM;
  }
  uv_timer_init(loop, &m->timer);
  m->timer.data = m;
  curl_multi_setopt(m->multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
  curl_multi_setopt(m->multi, CURLMOPT_SOCKETDATA, m);
  curl_multi_setopt(m->multi, CURLMOPT_TIMERFUNCTION, timer_fn);
  curl_multi_setopt(m->multi, CURLMOPT_TIMERDATA, m);
  *out = m;
  return 0;
}

CURLM *pr_curlm_multi(pr_curlm *m) { return m->multi; }

void pr_curlm_set_gate(pr_curlm *m, pr_curlm_gate_fn fn, void *ud) {
  m->gate = fn;
  m->gate_ud = ud;
}

pr_curlm_gate_fn pr_curlm_gate(const pr_curlm *m, void **ud) {
  if (!m || !m->gate) return NULL;
  *ud = m->gate_ud;
  return m->gate;
}
unsigned pr_curlm_running(const pr_curlm *m) { return m->running; }

int pr_curlm_add(pr_curlm *m, CURL *easy, pr_curlm_done_fn done, void *ud) {
  if (m->closing) return PR_ECLOSED;
  curlm_xfer *x = calloc(1, sizeof(*x));
  if (!x) return -ENOMEM;
  x->easy = easy;
  x->done = done;
  x->ud = ud;
  curl_easy_setopt(easy, CURLOPT_PRIVATE, x);
  curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, close_socket);
  curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, m);
  if (curl_multi_add_handle(m->multi, easy) != CURLM_OK) {
    curl_easy_setopt(easy, CURLOPT_PRIVATE, NULL);
    free(x);
    return PR_ECURL;
  }
  x->next = m->xfers;
  if (m->xfers) m->xfers->prev = x;
  m->xfers = x;
  m->running++;
  return 0;
}

void pr_curlm_cancel(pr_curlm *m, CURL *easy) {
  curlm_xfer *x = NULL;
  curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
  if (!x) return; /* not running (finished or never added) */
  curl_multi_remove_handle(m->multi, easy);
  curl_easy_setopt(easy, CURLOPT_PRIVATE, NULL);
  if (x->prev) x->prev->next = x->next;
  else m->xfers = x->next;
  if (x->next) x->next->prev = x->prev;
  free(x);
  m->running--;
}

CURL *pr_curlm_easy(pr_curlm *m) {
  if (m && m->n_idle) return m->idle[--m->n_idle];
  return curl_easy_init();
}

void pr_curlm_easy_release(pr_curlm *m, CURL *easy) {
  if (!easy) return;
  if (m && !m->closing && m->n_idle < CURLM_IDLE_MAX) {
    /* back to defaults; what curl_easy_init would allocate again stays */
    curl_easy_reset(easy);
    m->idle[m->n_idle++] = easy;
    return;
  }
  curl_easy_cleanup(easy);
}

static int dns_drop(void *value, void *ud) {
  (void)ud;
  curlm_dns *d = value;
  if (d->users) {
    d->orphan = 1; /* its last handle frees it (pr_curlm_dns_detach) */
    d->owner = ud;
    if (d->owner) d->owner->orphans++;
    return 0;
  }
  curl_share_cleanup(d->sh);
  free(d);
  return 0;
}

/* Keep a cache in use, or used lately. */
static int dns_keep(void *value, void *ud) {
  curlm_dns *d = value;
  uint64_t now = *(const uint64_t *)ud;
  if (d->users || now - d->used_ms < PR_CURLM_DNS_IDLE_MS) return 1;
  return dns_drop(d, NULL); /* not in use: no orphan */
}

void *pr_curlm_dns_attach(pr_curlm *m, CURL *easy, const char *authority, size_t len) {
  if (!m || m->closing || !len) return NULL;
  curlm_dns *d = pr_idmap_get(&m->dns, authority, len);
  if (!d) {
    if (pr_idmap_count(&m->dns) >= m->dns_sweep_at) {
      /* amortised: a sweep when the count doubled since the last */
      uint64_t now = uv_now(m->loop);
      pr_idmap_sweep(&m->dns, dns_keep, &now);
      m->dns_sweep_at = 2 * pr_idmap_count(&m->dns) + 64;
    }
    d = calloc(1, sizeof(*d));
    if (!d || !(d->sh = curl_share_init()) ||
        curl_share_setopt(d->sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK ||
        curl_share_setopt(d->sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK ||
        pr_idmap_put(&m->dns, authority, len, d) < 0) {
      if (d && d->sh) curl_share_cleanup(d->sh);
      free(d);
      return NULL;
    }
  }
  if (curl_easy_setopt(easy, CURLOPT_SHARE, d->sh) != CURLE_OK) return NULL;
  d->users++;
  return d;
}

void pr_curlm_dns_detach(pr_curlm *m, CURL *easy, void *dns) {
  curlm_dns *d = dns;
  if (!d) return;
  curl_easy_setopt(easy, CURLOPT_SHARE, NULL);
  d->users--;
  if (d->orphan && !d->users) {
    pr_curlm *o = d->owner;
    curl_share_cleanup(d->sh); /* closes its kept connections: close_socket, with o */
    free(d);
    if (o && --o->orphans == 0 && o->closed) {
      free(o->byfd);
      free(o);
    }
    return;
  }
  if (m && m->loop) d->used_ms = uv_now(m->loop);
}

size_t pr_curlm_dns_caches(const pr_curlm *m) { return m ? pr_idmap_count(&m->dns) : 0; }

static void timer_closed(uv_handle_t *h) {
  pr_curlm *m = h->data;
  void (*cb)(void *) = m->on_closed;
  void *arg = m->closed_arg;
  if (m->orphans) {
    m->closed = 1; /* the last orphan's detach frees it */
  } else {
    free(m->byfd);
    free(m);
  }
  if (cb) cb(arg);
}

void pr_curlm_close(pr_curlm *m, void (*on_closed)(void *arg), void *arg) {
  if (m->closing) return;
  m->on_closed = on_closed;
  m->closed_arg = arg;
  while (m->xfers) pr_curlm_cancel(m, m->xfers->easy);
  m->closing = 1;
  while (m->n_idle) curl_easy_cleanup(m->idle[--m->n_idle]);
  curl_multi_cleanup(m->multi); /* may still call socket_cb with CURL_POLL_REMOVE */
  m->multi = NULL;
  /* the hosts' DNS caches; one a request still holds (its owner closes it later, with
   * m NULL) goes with that request's handle */
  pr_idmap_sweep(&m->dns, dns_drop, m);
  while (m->socks) sock_drop(m, m->socks);
  uv_timer_stop(&m->timer);
  uv_close((uv_handle_t *)&m->timer, timer_closed);
}
