/* Outgoing HTTP requests on libcurl easy handles; see curlreq.h. */
#include "curlreq.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "curlm.h"

/* An answer nobody reads still has to go somewhere: curl's default is stdout. */
static size_t curlreq_discard(char *data, size_t size, size_t nmemb, void *ud) {
  (void)data;
  (void)ud;
  return size * nmemb;
}

/* Every socket of a gated transfer: the gate sees the address before any connection
 * is made (a name that resolves to loopback, or changes its answer between two
 * resolutions, is caught here, where it is used). A socket() failure of the process's own
 * (EMFILE...) is told apart from a peer that refuses connections. */
static curl_socket_t curlreq_open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *addr) {
  pr_curlreq *q = ud;
  if (q->gate && purpose == CURLSOCKTYPE_IPCXN) {
    char why[sizeof(q->refused)] = "";
    if (q->gate(q->gate_ud, &addr->addr, why, sizeof(why)) != 0) {
      snprintf(q->refused, sizeof(q->refused), "%s", why[0] ? why : "address refused");
      errno = EACCES; /* not a shortage of the process's own (EMFILE...) */
      return CURL_SOCKET_BAD;
    }
  }
  curl_socket_t s = socket(addr->family, addr->socktype, addr->protocol);
  if (s == CURL_SOCKET_BAD && q->local_errno) *q->local_errno = errno;
  return s;
}

/* A kept-alive connection is asked again before a request goes out on it. */
static int curlreq_prereq(void *ud, char *primary_ip, char *local_ip, int primary_port, int local_port) {
  (void)local_ip;
  (void)local_port;
  pr_curlreq *q = ud;
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof(ss));
  struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
  if (inet_pton(AF_INET, primary_ip, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)primary_port);
  } else if (inet_pton(AF_INET6, primary_ip, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)primary_port);
  } else {
    snprintf(q->refused, sizeof(q->refused), "connected to an address that cannot be checked");
    return CURL_PREREQFUNC_ABORT;
  }
  char why[sizeof(q->refused)] = "";
  if (q->gate(q->gate_ud, (struct sockaddr *)&ss, why, sizeof(why)) != 0) {
    snprintf(q->refused, sizeof(q->refused), "%s", why[0] ? why : "address refused");
    return CURL_PREREQFUNC_ABORT;
  }
  return CURL_PREREQFUNC_OK;
}

static int curlreq_headers(pr_curlreq *q, const pr_curlreq_opts *o) {
  for (const char *const *h = o->headers; h && *h; h++) {
    struct curl_slist *n = curl_slist_append(q->hdrs, *h);
    if (!n) return -ENOMEM;
    q->hdrs = n;
  }
  if (o->bearer) {
    size_t len = sizeof("Authorization: Bearer ") + strlen(o->bearer);
    char *line = malloc(len);
    if (!line) return -ENOMEM;
    snprintf(line, len, "Authorization: Bearer %s", o->bearer);
    struct curl_slist *n = curl_slist_append(q->hdrs, line);
    free(line);
    if (!n) return -ENOMEM;
    q->hdrs = n;
  }
  return 0;
}

int pr_curlreq_open(pr_curlreq *q, pr_curlm *m, const pr_curlreq_opts *o) {
  if (q->easy) return -EBUSY;
  if (!o->base) return -EINVAL;
  q->hdrs = NULL;
  q->refused[0] = '\0';
  q->errbuf = o->errbuf;
  q->local_errno = o->local_errno;
  q->gate = pr_curlm_gate(m, &q->gate_ud);
  const char *path = o->path ? o->path : "";
  size_t ul = strlen(o->base) + strlen(path) + 1;
  char *url = malloc(ul); /* curl keeps its own copy */
  if (!url) return -ENOMEM;
  snprintf(url, ul, "%s%s", o->base, path);
  CURL *e = pr_curlm_easy(m);
  if (!e || curlreq_headers(q, o) < 0 || curl_easy_setopt(e, CURLOPT_URL, url) != CURLE_OK) {
    free(url);
    curl_slist_free_all(q->hdrs);
    q->hdrs = NULL;
    pr_curlm_easy_release(m, e);
    return -ENOMEM;
  }
  free(url);
  q->easy = e;
  /* a DNS cache of the host's own: "host[:port]" between "//" and the next '/' of the base */
  const char *auth = strstr(o->base, "//");
  auth = auth ? auth + 2 : o->base;
  q->dns = pr_curlm_dns_attach(m, e, auth, strcspn(auth, "/"));
  if (q->hdrs) curl_easy_setopt(e, CURLOPT_HTTPHEADER, q->hdrs);
  int get = o->method ? strcmp(o->method, "GET") == 0 : o->body == NULL;
  if (get) {
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, o->body ? o->body : "");
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(o->body ? o->body_len : 0));
    if (o->method && strcmp(o->method, "POST") != 0) curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, o->method);
  }
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, o->write_fn ? o->write_fn : curlreq_discard);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, o->write_ud);
  if (o->errbuf) {
    o->errbuf[0] = '\0';
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, o->errbuf);
  }
  if (o->local_errno || q->gate) {
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, curlreq_open_socket);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, q);
  }
  if (q->gate) {
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, curlreq_prereq);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, q);
    /* the gate checks where the transfer connects: no proxy from the environment
     * (http_proxy, https_proxy, all_proxy) may stand in between */
    curl_easy_setopt(e, CURLOPT_PROXY, "");
  }
  /* a Location: answer is the peer's answer, never a second request elsewhere */
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L); /* no SIGALRM around DNS in a libuv process */
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  if (o->tcp_keepalive) curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  if (o->timeout_ms > 0) curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, o->timeout_ms);
  if (o->connect_timeout_ms > 0) curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, o->connect_timeout_ms);
  if (o->buffer_size > 0) curl_easy_setopt(e, CURLOPT_BUFFERSIZE, o->buffer_size);
  if (o->http11) curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, o->insecure ? 0L : 1L);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, o->insecure ? 0L : 2L);
  if (o->ca_file) curl_easy_setopt(e, CURLOPT_CAINFO, o->ca_file);
  if (o->user_agent) curl_easy_setopt(e, CURLOPT_USERAGENT, o->user_agent);
  /* a URL from a phone or a config file must not reach file://, gopher:// ... */
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  return 0;
}

const char *pr_curlreq_refused(const pr_curlreq *q) { return q->refused[0] ? q->refused : NULL; }

const char *pr_curlreq_error(const pr_curlreq *q, CURLcode rc) {
  if (q->refused[0]) return q->refused;
  if (q->errbuf && q->errbuf[0]) return q->errbuf;
  return curl_easy_strerror(rc);
}

long pr_curlreq_status(const pr_curlreq *q) {
  long st = 0;
  if (q->easy && curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &st) != CURLE_OK) st = 0;
  return st;
}

void pr_curlreq_close(pr_curlreq *q, pr_curlm *m) {
  if (q->easy) {
    if (m) pr_curlm_cancel(m, q->easy); /* nothing when it is not in the multi */
    pr_curlm_dns_detach(m, q->easy, q->dns);
    q->dns = NULL;
    pr_curlm_easy_release(m, q->easy);
    q->easy = NULL;
  }
  curl_slist_free_all(q->hdrs);
  q->hdrs = NULL;
}
