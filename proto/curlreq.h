/* One outgoing HTTP request on a libcurl easy handle, set up the same way wherever a
 * daemon calls out (health probes, the agent's relay, engine reads, heartbeats): URL,
 * method and body, header lines and a bearer token, timeouts, TLS checks, and what every
 * transfer needs (no signals, http and https only, no redirects, nothing written to
 * stdout). A handle set up from a multi with a gate (curlm.h) has every address it
 * connects to checked by the gate, and uses no proxy.
 *
 * Who owns the handle, once for all: the owner keeps a pr_curlreq in its own state and
 * owns its easy handle and header list from pr_curlreq_open until pr_curlreq_close, the
 * one call that lets go of them. Close cancels the transfer if it still runs in the
 * multi, gives the handle back to pr_curlm's pool (or cleans it up) and frees the
 * headers; pr_curlm never frees a handle. When pr_curlm calls the owner's done callback
 * the transfer is over and out of the multi but the handle is still the owner's: read
 * what is needed from it (pr_curlreq_status, curl_easy_getinfo(q->easy, ...)) first,
 * then close. Close leaves q->easy NULL: a late read finds no handle instead of freed
 * memory. */
#ifndef PR_CURLREQ_H
#define PR_CURLREQ_H

#include <stddef.h>

#include <curl/curl.h>

#include "curlm.h" /* a NULL pr_curlm: handles are not pooled, and there is no gate */

/* What the request is. Strings are copied by pr_curlreq_open except body, which curl
 * reads while the transfer runs: it must stay put until pr_curlreq_close. */
typedef struct pr_curlreq_opts {
  const char *base;            /* "http(s)://host[:port][/prefix]" */
  const char *path;            /* appended to base as it is ("/v1/models?x=1"); NULL: none */
  const char *method;          /* NULL: POST when body is set, else GET */
  const char *body;            /* sent for any method but GET; NULL: empty */
  size_t body_len;
  const char *const *headers;  /* header lines ("Name: value", "Expect:"), NULL-terminated */
  const char *bearer;          /* adds "Authorization: Bearer <bearer>" after them; NULL: none */
  curl_write_callback write_fn; /* NULL: the answer's body is dropped */
  void *write_ud;
  char *errbuf;                /* CURL_ERROR_SIZE bytes the owner keeps, or NULL */
  int *local_errno;            /* set: why socket() failed goes there (EMFILE...) */
  long timeout_ms;             /* the whole transfer; 0: none */
  long connect_timeout_ms;     /* 0: curl's (300 s) */
  long buffer_size;            /* receive buffer; 0: curl's (16 KiB) */
  int http11;                  /* HTTP/1.1 only */
  int tcp_keepalive;           /* TCP keep-alive probes on the connection */
  int insecure;                /* skip the peer's certificate and name checks */
  const char *ca_file;         /* PEM bundle to verify with; NULL: the system's */
  const char *user_agent;      /* NULL: none */
} pr_curlreq_opts;

/* The request's curl resources; zero-initialised means closed. It must stay put while
 * the transfer runs: curl's socket hooks find it by its address. */
typedef struct pr_curlreq {
  CURL *easy;                  /* NULL when closed */
  struct curl_slist *hdrs;
  pr_curlm_gate_fn gate;       /* the multi's gate when opened (curlm.h); NULL: none */
  void *gate_ud;
  int *local_errno;            /* opts.local_errno */
  char *errbuf;                /* opts.errbuf */
  char refused[192];           /* why the gate refused the last address; "" none */
  void *dns;                   /* its host's DNS cache (pr_curlm_dns_attach); NULL: the multi's */
} pr_curlreq;

/* Set up a request: a handle from m's pool (or a new one), every option from o. The
 * owner then starts it with pr_curlm_add(m, q->easy, done, ud). Returns 0; -EBUSY when
 * q is not closed; -EINVAL without a base URL; -ENOMEM (q stays closed). */
int pr_curlreq_open(pr_curlreq *q, pr_curlm *m, const pr_curlreq_opts *o);
/* Why the multi's gate refused to let the transfer connect ("address 127.0.0.1 ..."),
 * or NULL when it did not. Valid until the next pr_curlreq_open. */
const char *pr_curlreq_refused(const pr_curlreq *q);
/* What went wrong, for logs and state reasons: the gate's refusal, else curl's error
 * buffer when one was given and set, else curl_easy_strerror(rc). */
const char *pr_curlreq_error(const pr_curlreq *q, CURLcode rc);
/* The answer's HTTP status; 0 when none arrived or q is closed. */
long pr_curlreq_status(const pr_curlreq *q);
/* Let go of the handle and headers (see the rule above); m: the pool the handle came
 * from, or NULL once it has closed. Safe on a closed q; never call it from inside one
 * of curl's callbacks for this transfer. */
void pr_curlreq_close(pr_curlreq *q, pr_curlm *m);

#endif
