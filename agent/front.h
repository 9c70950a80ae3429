/* The agent's authenticated front: where the phone's tunnel points. Every request must
 * carry "Authorization: Bearer <replica token>" (bearer.h's rule) or gets 401
 * in OpenAI's error shape. An exact allow-list of OpenAI calls (route.h) is forwarded to
 * the engine through libcurl with
 * streaming and backpressure both ways (curl is paused while the client's output queue
 * is above its high-water mark); a client that goes away cancels the engine's request,
 * which frees its slot. MNN's answers are normalised on the way (mnn.h). Answers'
 * timings feed the measured rates. GET /agent/v1/status and GET /health report the
 * agent and its engine; while completions run on llama-server, its /slots is read about
 * once a second to report each request's progress. While draining, new completions get
 * 503 and running ones finish. */
#ifndef AG_FRONT_H
#define AG_FRONT_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "curlm.h"
#include "engine.h"
#include "report.h"

typedef struct ag_front ag_front;

/* Fills *r with the agent's whole report (for /agent/v1/status). */
typedef void (*ag_front_report_fn)(void *ud, ag_report *r);

/* Strings are copied by ag_front_new. */
typedef struct ag_front_config {
  const char *listen;  /* "HOST:PORT" */
  const char *token;   /* NULL: no token asked (private network only) */
  int require_token;   /* even without one: callers need the one the gateway names */
} ag_front_config;

/* Create the front. loop, curlm, engine and rates are borrowed and must outlive it.
 * Owned by the caller: ag_front_stop, then ag_front_free once on_stopped ran. */
int ag_front_new(ag_front **out, uv_loop_t *loop, pr_curlm *curlm, ag_engine *engine,
                 ag_rates *rates, const ag_front_config *cfg, ag_front_report_fn report, void *ud);
int ag_front_listen(ag_front *f);
int ag_front_port(ag_front *f);
/* The token the gateway said it calls this phone with (heartbeat answers): from then on
 * the only one accepted (the configured one no longer is). */
int ag_front_set_issued_token(ag_front *f, const char *token);
/* Refuse new completions (503) and let running ones finish; 0 takes work again. */
void ag_front_set_draining(ag_front *f, int draining);
int ag_front_draining(const ag_front *f);
/* Completions being relayed now. */
int ag_front_inflight(const ag_front *f);
uint64_t ag_front_requests(const ag_front *f);
/* The requests llama-server is working on, as its /slots showed them at the last
 * reading (about once a second while completions run), with the callers' request ids
 * when they can be paired (progress.h). At most cap entries; 0 for other engines and
 * while nothing runs. */
size_t ag_front_running(const ag_front *f, ag_running *out, size_t cap);
/* Stop listening and end every relay (their engine requests are cancelled). */
void ag_front_stop(ag_front *f, void (*on_stopped)(void *arg), void *arg);
void ag_front_free(ag_front *f);

/* How callers' cache scopes are kept apart on the engine (isolate.h): "slots", "engine",
 * or NULL when the agent cannot (an engine other than llama-server). */
const char *ag_front_cache_isolation(const ag_front *f);

#endif
