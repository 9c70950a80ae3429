/* The LLM server the agent fronts: llama.cpp's llama-server (started and supervised by
 * the agent, or attached to with --upstream), MNN, or any OpenAI-compatible server.
 *
 * A started engine runs as a child process (uv_spawn, never a blocking call): the agent
 * waits until it answers as ready, restarts it with a doubling back-off (0.5 s up to
 * restart_max_s) when it exits, and on stop sends SIGTERM, then SIGKILL after
 * stop_timeout_s. Readiness: llama `GET /health` (503 = loading); openai `/health`,
 * or `/v1/models` when it has none; mnn `/v1/models`. Once ready it learns slots and
 * context from `/props` (llama, openai when present) and model names from `/v1/models`,
 * then checks every few seconds that it still answers.
 *
 * Optionally it measures the engine with a short prompt (--measure) and, for a started
 * llama-server, tries several thread counts (--tune-threads) and keeps the fastest. */
#ifndef AG_ENGINE_H
#define AG_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include <uv.h>

#include "curlm.h"
#include "curlreq.h"
#include "report.h"

typedef enum { AG_ENGINE_LLAMA = 0, AG_ENGINE_OPENAI, AG_ENGINE_MNN } ag_engine_kind;
typedef enum { AG_ENGINE_LOADING = 0, AG_ENGINE_READY, AG_ENGINE_DOWN } ag_engine_state;

#define AG_ENGINE_MAX_ARGS 128
#define AG_ENGINE_MAX_TUNE 16

/* Settings; strings and arrays are copied by ag_engine_new. */
typedef struct ag_engine_config {
  ag_engine_kind kind;
  const char *upstream;      /* base URL of the engine's HTTP API */
  const char *api_key;       /* sent as "Authorization: Bearer" to the engine; may be NULL */
  const char *command;       /* program to start; NULL: attach to a running engine */
  const char *const *args;   /* its arguments (not argv[0]) */
  size_t n_args;
  const char *threads_arg;   /* the option that sets threads ("--threads") */
  const int *tune_threads;   /* thread counts to try at start; n_tune 0: none */
  size_t n_tune;
  const char *model;         /* model name to report; NULL: what /v1/models says */
  int slots;                 /* 0: from /props (llama), else 1 */
  int64_t n_ctx;             /* 0: from /props */
  int measure;               /* send a short prompt once ready to measure rates */
  double ready_timeout_s;    /* a started engine not ready by then is restarted */
  double restart_max_s;      /* back-off cap between restarts */
  double stop_timeout_s;     /* SIGTERM → SIGKILL */
} ag_engine_config;

void ag_engine_config_default(ag_engine_config *c);

typedef struct ag_engine ag_engine;
/* Called when the engine's state changes. */
typedef void (*ag_engine_state_fn)(void *ud, ag_engine_state st);

/* Create; nothing starts before ag_engine_start. loop, curlm and rates are borrowed
 * (rates receives what --measure finds). Owned by the caller: ag_engine_stop, then
 * ag_engine_free after on_stopped. */
int ag_engine_new(ag_engine **out, uv_loop_t *loop, pr_curlm *curlm, const ag_engine_config *cfg,
                  ag_rates *rates, ag_engine_state_fn on_state, void *ud);
/* Start the engine process (or the probes of an attached one). 0 or a negative code. */
int ag_engine_start(ag_engine *e);
/* A request could not reach the engine: probe it now. */
void ag_engine_suspect(ag_engine *e);
/* A started engine runs from now on with these arguments (not argv[0]) and reports this
 * model name: the process is stopped (SIGTERM, then SIGKILL) and started again at once,
 * loading. Copies the strings. Returns 0, -EINVAL (an attached engine, too many
 * arguments) or -ENOMEM (nothing changed then). */
int ag_engine_restart_with(ag_engine *e, const char *model, const char *const *args, size_t n_args);
/* Its arguments now (borrowed until the next ag_engine_restart_with). */
const char *const *ag_engine_args(const ag_engine *e, size_t *n);
const char *ag_engine_model(const ag_engine *e);
/* Stop probing, stop the process (SIGTERM, then SIGKILL), close every handle. */
void ag_engine_stop(ag_engine *e, void (*on_stopped)(void *arg), void *arg);
void ag_engine_free(ag_engine *e);

ag_engine_state ag_engine_get_state(const ag_engine *e);
const char *ag_engine_state_name(ag_engine_state st);
const char *ag_engine_kind_name(ag_engine_kind k);
ag_engine_kind ag_engine_get_kind(const ag_engine *e);
/* Engine processes the agent started so far (0: none; an attached engine stays 0): a new
 * number is an engine that holds no prompt. */
unsigned ag_engine_generation(const ag_engine *e);
/* Whether requests can name its slots and nothing but its slots caches prompts: a
 * llama-server the agent started without a RAM prompt cache, its slot count known. */
int ag_engine_slots_named(const ag_engine *e);
int ag_engine_slot_count(const ag_engine *e);
/* Whether the agent started the engine (else it found it running). */
int ag_engine_supervised(const ag_engine *e);
const char *ag_engine_upstream(const ag_engine *e);
/* Fills *o (all of it) for a request to the engine's path: its base URL, its API key as
 * the bearer token, a short connect timeout, the agent's user agent. The caller adds the
 * rest and opens it with pr_curlreq_open, which also says who owns the handle. */
void ag_engine_request(const ag_engine *e, const char *path, pr_curlreq_opts *o);
const char *ag_engine_api_key(const ag_engine *e);
/* Slots, context, models, engine state, pid and restarts into r (strings borrowed
 * from the engine until its next state change). */
void ag_engine_fill_report(const ag_engine *e, ag_report *r);

/* The fastest of several measured configurations: the lowest predicted time for a
 * reference job of 1000 prompt tokens and 100 generated ones. Returns the index, or
 * -1 when none has both rates. */
int ag_engine_pick_fastest(const double *prefill_tps, const double *decode_tps, size_t n);

#endif
