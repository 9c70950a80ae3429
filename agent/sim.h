/* The simulated phone behind `fleetgate-agent --engine sim`: an HTTP server that a
 * client cannot tell from llama.cpp's llama-server by its API, with slots, prefill and
 * decode rates, a prompt cache per slot, a start-up loading time, a time scale and a
 * fault plan. Every test, demo and benchmark uses it as a fleet. */
#ifndef AG_SIM_H
#define AG_SIM_H

#include <stdint.h>

#include <uv.h>

#include "faults.h"
#include "http.h"
#include "report.h"
#include "simcache.h"

typedef struct ag_sim ag_sim;

/* Which llama.cpp release's llama-server it answers like. */
#define AG_SIM_RELEASE_2025 2025 /* February 2025 (commit c392e509) */
#define AG_SIM_RELEASE_2026 2026 /* August 2026 (b10587), the default */

/* Which server the sim imitates. */
typedef enum {
  AG_SIM_LLAMA = 0, /* llama.cpp's llama-server */
  /* MNN's `mnncli serve` with its quirks: no /health, /props, /slots or /metrics; one
   * slot; errors as {"error":"<string>"}; streamed chunks with finish_reason "" until
   * the last; max_tokens and stream_options ignored; no timings; usage all zeros. */
  AG_SIM_MNN,
} ag_sim_flavour;

/* Extra routes (the agent's own, e.g. /agent/v1/status): called for every authorised
 * request before the sim's routes; returns 1 when it answered the request. */
typedef int (*ag_sim_route_fn)(pr_http_req *req, void *ud);

/* Settings of one simulated phone. Strings and the fault plan are borrowed for the
 * duration of ag_sim_new, which copies them. Durations (loading_s, fault times) are in
 * simulated seconds: the sim divides them by time_scale, like prefill and decode. */
typedef struct ag_sim_config {
  const char *listen;       /* "HOST:PORT"; port 0 picks a free one */
  const char *model;        /* served model name (model, model_alias, /v1/models id) */
  const char *id;           /* system_fingerprint; NULL: "sim-<port>" */
  const char *token;        /* callers must send "Authorization: Bearer <token>"; NULL: anyone */
  int require_token;        /* even without one: callers need the one the gateway names */
  int slots;                /* requests generated at once; more wait in a FIFO */
  double prefill_tps;       /* prompt tokens per simulated second, per slot */
  double decode_tps;        /* generated tokens per simulated second, per slot */
  int64_t n_ctx;            /* context size of each slot */
  double time_scale;        /* > 1 runs faster than real time */
  double loading_s;         /* answer 503 "Loading model" this long after start */
  const ag_fault_plan *faults; /* may be NULL */
  uint64_t seed;            /* of the pseudo-random text and ids; 0: from the clock */
  ag_sim_flavour flavour;
  int release;              /* AG_SIM_RELEASE_2025 or AG_SIM_RELEASE_2026 */
  int thinking;             /* a thinking model: chat text is reasoning_content */
  ag_simcache_mode cache_mode; /* how a slot's cache is reused (full: a transformer) */
  int ctx_checkpoints;      /* hybrid: checkpoints kept per slot (--ctx-checkpoints) */
  int64_t checkpoint_min_step; /* hybrid: --checkpoint-min-step */
  int64_t cache_ram;        /* tokens the RAM prompt cache holds (2026); 0 off, -1: the
                             * default (hybrid AG_SIM_CACHE_RAM_TOKENS, full 0) */
  double model_mb;          /* its model file's size (--model-bytes): a switch scales its
                             * rates by old size / new size; 0: unknown (no scaling) */
  double load_mb_s;         /* a switch loads this many MiB per simulated second */
  double fetch_mb_s;        /* ...after downloading a model it does not hold at this */
  const char *corrupt_model; /* a download of this model has the wrong digest (tests) */
  double storage_free_mb;   /* its simulated models folder's free storage, MiB: a switch
                             * to a model it cannot hold (ag_hold_switch_fits) is refused,
                             * a download takes its size; < 0 unknown (not checked, not said) */
  ag_sim_route_fn route;    /* may be NULL */
  void *route_ud;
  int log_phone;            /* name the phone ("phone": id) in its request and fault log
                             * lines: several phones share the process's log */
} ag_sim_config;

/* The RAM prompt cache's size when --cache-ram is not given, in hybrid mode. */
#define AG_SIM_CACHE_RAM_TOKENS 131072

/* What the sim reports about itself (for /agent/v1/status and heartbeats). */
typedef struct ag_sim_stats {
  int slots, busy, deferred;
  int64_t n_ctx;
  const char *model;        /* borrowed from the sim */
  int loading;              /* in --loading-s */
  int down;                 /* an error503, offline or hang fault is active */
  ag_rates rates;           /* seeded with the configured rates x time scale */
  uint64_t requests;        /* completions received */
  const char *cache_isolation; /* how callers' cache scopes are kept apart (isolate.h) */
  const char *build;        /* its /props build_info */
  unsigned features;        /* what its release serves (feat.h) */
  int choices_max;
  double storage_free_mb;   /* its simulated models folder's (config's, less downloads); < 0 none */
} ag_sim_stats;

void ag_sim_config_default(ag_sim_config *c);
/* Check a configuration; on error returns -EINVAL with a message in err. */
int ag_sim_config_check(const ag_sim_config *c, char *err, size_t errn);

/* Create a sim on loop; nothing listens yet. Returns 0 or a negative code. */
int ag_sim_new(ag_sim **out, uv_loop_t *loop, const ag_sim_config *cfg);
/* Bind and listen on cfg->listen, start the fault plan's clock. */
int ag_sim_listen(ag_sim *s);
/* The bound port, or -1 when not listening. */
int ag_sim_port(ag_sim *s);
/* The replica id (system_fingerprint). */
const char *ag_sim_id(const ag_sim *s);
/* Current load, rates and state. */
void ag_sim_get_stats(const ag_sim *s, ag_sim_stats *st);
/* The jobs on a slot now (hung ones left out), at most cap, into out; returns how many. */
size_t ag_sim_running(const ag_sim *s, ag_running *out, size_t cap);
/* Answer new completions with 503 (running ones finish); 0 takes work again. */
void ag_sim_set_draining(ag_sim *s, int draining);
/* The token the gateway said it calls this phone with: from then on the only one
 * accepted (cfg->token no longer is). */
int ag_sim_set_issued_token(ag_sim *s, const char *token);
/* Placement (docs/sim.md "Switching models"): the model the gateway asks it to run (NULL:
 * none asked). A switch drains (running requests finish, new ones get 503), downloads
 * the model unless it holds it (size / fetch_mb_s, a url needed), loads it (size /
 * load_mb_s: 503 "Loading model"), then serves it with its rates scaled by the sizes; a
 * download of corrupt_model, or a model it lacks with no url, fails and it stays on its
 * model; one it cannot hold (its memory, its storage_free_mb: ag_hold_switch_fits) is
 * refused at once, before it drains. Strings are copied. */
typedef struct ag_sim_place {
  const char *model, *url, *sha256;
  int64_t size_bytes;
  double mem_mb;            /* the memory the catalogue says it needs; 0: from its size */
  double mem_total_mb;      /* the phone's MemTotal (its device readings); < 0 unknown */
} ag_sim_place;
void ag_sim_place_set(ag_sim *s, const ag_sim_place *p);
/* The switch under way or the last failed one: to NULL when none. */
void ag_sim_switch_get(const ag_sim *s, const char **to, const char **phase, const char **why);
/* Stop listening, end every request in flight and close every handle; on_stopped runs
 * once they are all closed. Call once, also after a failed ag_sim_listen. */
void ag_sim_stop(ag_sim *s, void (*on_stopped)(ag_sim *s, void *ud), void *ud);
/* Free a sim that never started handles, or one whose on_stopped has run. */
void ag_sim_free(ag_sim *s);

#endif
