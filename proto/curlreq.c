/* Outgoing HTTP requests on libcurl easy handles; see curlreq.h. */
#include "curlreq.h"

#include <errno.h>
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
  if (o->local_errno) {
    /* a socket() failure (EMFILE...) is this process's own, not the peer's */
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, pr_curlm_open_socket);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, o->local_errno);
  }
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

long pr_curlreq_status(const pr_curlreq *q) {
  long st = 0;
  if (q->easy && curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &st) != CURLE_OK) st = 0;
  return st;
}

void pr_curlreq_close(pr_curlreq *q, pr_curlm *m) {
  if (q->easy) {
    if (m) pr_curlm_cancel(m, q->easy); /* nothing when it is not in the multi */
    pr_curlm_easy_release(m, q->easy);
    q->easy = NULL;
  }
  curl_slist_free_all(q->hdrs);
  q->hdrs = NULL;
}
