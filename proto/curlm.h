/* libcurl's multi interface driven by a libuv loop (the pattern of curl's
 * docs/examples/multi-uv.c), hardened: socket contexts are freed only in their close
 * callback, poll errors are passed to curl as CURL_CSELECT_ERR, curl's timer is never
 * served re-entrantly, and callbacks that fire after pr_curlm_close find a cleared owner
 * and return. A transfer's owner keeps its CURL easy handle; when it finishes, `done`
 * runs after the handle was removed from the multi, and the owner cleans it up. */
#ifndef PR_CURLM_H
#define PR_CURLM_H

#include <curl/curl.h>
#include <uv.h>

typedef struct pr_curlm pr_curlm;

/* result: CURLE_OK or the transfer's error; errbuf: curl's message when one was set
 * with CURLOPT_ERRORBUFFER by the owner, else curl_easy_strerror(result). */
typedef void (*pr_curlm_done_fn)(CURL *easy, CURLcode result, void *ud);

/* Create a multi handle on loop. Returns 0 or -ENOMEM. */
int pr_curlm_new(pr_curlm **out, uv_loop_t *loop);
CURLM *pr_curlm_multi(pr_curlm *m);
/* Start a transfer. pr_curlm uses the easy handle's CURLOPT_PRIVATE; owners keep
 * their own state in `ud`. */
int pr_curlm_add(pr_curlm *m, CURL *easy, pr_curlm_done_fn done, void *ud);
/* Cancel a running transfer: it is removed at once and `done` is not called. */
void pr_curlm_cancel(pr_curlm *m, CURL *easy);
/* An easy handle with default options: a reused one when there is one (curl_easy_init
 * costs an allocation of several KiB, and its buffers more on the first transfer), else
 * a new one. m may be NULL. */
CURL *pr_curlm_easy(pr_curlm *m);
/* Give back a handle that is not running (cancelled or done); it is reset and kept, or
 * cleaned up when m is NULL, closing or has enough. */
void pr_curlm_easy_release(pr_curlm *m, CURL *easy);
/* The gate: asked about every address a transfer of this multi is about to connect to
 * (libcurl's open-socket hook, so no connection is made when it says no), and again
 * about a kept-alive connection before a transfer uses it (the pre-request hook: the
 * rule may have changed since the connection was opened). Returns 0 to let it through;
 * anything else refuses it, with why (n bytes) saying so. Set with pr_curlm_set_gate;
 * pr_curlreq_open installs it on every handle it sets up from this multi, and also makes
 * sure such a handle uses no proxy and follows no redirect. */
typedef int (*pr_curlm_gate_fn)(void *ud, const struct sockaddr *sa, char *why, size_t n);
/* fn NULL: no gate (the default). ud must outlive the multi or the next call. */
void pr_curlm_set_gate(pr_curlm *m, pr_curlm_gate_fn fn, void *ud);
/* The gate set, or NULL (and *ud untouched); m may be NULL. */
pr_curlm_gate_fn pr_curlm_gate(const pr_curlm *m, void **ud);
/* A DNS cache for one host (a base URL's authority, "host:port"): the easy handle uses it
 * instead of the multi's, until pr_curlm_dns_detach. libcurl prunes every entry of the
 * cache a transfer used when the transfer ends (7.88's multi_done), so one cache for a
 * fleet of N phones costs O(N) a transfer; one per host costs O(1). Returns the cache to
 * detach, or NULL (none could be made: the multi's cache serves). m may be NULL. */
void *pr_curlm_dns_attach(pr_curlm *m, CURL *easy, const char *authority, size_t len);
/* The easy handle no longer uses it (before it is reset or cleaned up). A cache nobody
 * used for PR_CURLM_DNS_IDLE_MS is dropped, a few at a time. */
void pr_curlm_dns_detach(pr_curlm *m, CURL *easy, void *dns);
/* How many host caches are kept (tests). */
size_t pr_curlm_dns_caches(const pr_curlm *m);
#define PR_CURLM_DNS_IDLE_MS (10 * 60 * 1000)
/* Number of transfers running. */
unsigned pr_curlm_running(const pr_curlm *m);
/* Cancel whatever still runs (without `done`), clean up, close every handle; the
 * object is freed once libuv has closed them all. on_closed may be NULL. */
void pr_curlm_close(pr_curlm *m, void (*on_closed)(void *arg), void *arg);

#endif
