/* What the agent reports about itself and its phone: measured engine rates (a moving
 * average over answers' `timings`), device readings (battery, temperature, free memory
 * from /sys and /proc; anything missing is unknown, never an error), and the two JSON
 * documents built from them: GET /agent/v1/status and the heartbeat body of
 * docs/protocol.md. No I/O (device.c reads the device files). */
#ifndef AG_REPORT_H
#define AG_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "device.h"

/* Heartbeat bodies may hold at most this many models and slots (docs/protocol.md). */
#define AG_REPORT_MAX_MODELS 16
#define AG_REPORT_MAX_SLOTS 64
/* Model files on the phone's disk reported (hold.h), and their names' length. */
#define AG_REPORT_MAX_HELD 16
#define AG_HOLD_NAME_MAX 64

/* Measured rates: exponentially weighted moving averages of tokens per second. A rate
 * is unknown (<= 0) until its first sample. Seeds (e.g. the sim's configured rates)
 * count as no sample: the first measurement replaces them. Plain data, no ownership. */
typedef struct ag_rates {
  double prefill_tps, decode_tps;
  unsigned prefill_samples, decode_samples;
  int seeded;               /* the values are seeds, not measurements */
} ag_rates;

void ag_rates_init(ag_rates *r);
void ag_rates_seed(ag_rates *r, double prefill_tps, double decode_tps);
/* One answer's timings (llama-server's prompt_n/prompt_ms, predicted_n/predicted_ms).
 * A side with ms <= 0, no token, or (prefill) fewer than 8 tokens is ignored. */
void ag_rates_observe(ag_rates *r, double prompt_n, double prompt_ms, double predicted_n,
                      double predicted_ms);
/* "measured", "configured" (seeds only) or "none". */
const char *ag_rates_source(const ag_rates *r);

/* What one answer said about itself: usage and llama-server's timings (-1: absent). */
typedef struct ag_obs {
  double prompt_n, prompt_ms, predicted_n, predicted_ms; /* timings */
  int64_t prompt_tokens, completion_tokens;              /* usage */
} ag_obs;

void ag_obs_init(ag_obs *o);
/* Take usage and timings from an answer or a stream chunk, when present. */
void ag_obs_take(ag_obs *o, const cJSON *root);
/* Same, from JSON text (a non-JSON payload is ignored). */
void ag_obs_take_text(ag_obs *o, const char *text, size_t len);

/* One request the engine is working on now (it has a slot), as far as the agent can
 * tell: how much of its prompt has been read, how many tokens it has generated, and the
 * pace it has had so far. The gateway compares this with what another phone would do
 * (docs/routing.md "Progress"). Unknown numbers are < 0. Plain data. */
#define AG_REPORT_MAX_REQUEST_ID 127
typedef struct ag_running {
  char request_id[AG_REPORT_MAX_REQUEST_ID + 1]; /* the caller's x-request-id; "" unknown */
  int64_t prompt_tokens;   /* the prompt's size */
  int64_t prompt_done;     /* prompt tokens read so far, cached ones included */
  int64_t decoded;         /* tokens generated so far */
  double prefill_tps;      /* this request's prefill pace (wall-clock tokens/s) */
  double decode_tps;       /* its decode pace, once it generates */
} ag_running;

/* Copy a caller's request id into out (AG_REPORT_MAX_REQUEST_ID + 1 bytes): at most
 * AG_REPORT_MAX_REQUEST_ID printable ASCII characters, else "" (unknown). */
void ag_report_copy_id(char *out, const char *id);

/* A model file the phone holds (hold.h). Plain data. */
typedef struct ag_held {
  char name[AG_HOLD_NAME_MAX + 1];  /* the file's name without ".gguf" */
  char file[AG_HOLD_NAME_MAX + 6];
  uint64_t bytes;
  char sha256[65];                  /* lowercase hex; "" while it is worked out */
} ag_held;

/* Everything that /agent/v1/status and a heartbeat say. Strings are borrowed. */
typedef struct ag_report {
  const char *id;
  const char *engine;        /* "sim", "llama", "openai", "mnn" */
  const char *engine_state;  /* "ready", "loading" or "down" */
  int draining;              /* refusing new work (drain asked by the gateway) */
  int slots, busy, queued;   /* queued: requests waiting for a slot (beyond busy) */
  int64_t n_ctx;             /* <= 0: unknown */
  const char *models[AG_REPORT_MAX_MODELS];
  size_t n_models;
  ag_rates rates;
  ag_device device;
  double uptime_s;
  long engine_pid;           /* managed engine process, 0 when none */
  unsigned engine_restarts;
  uint64_t requests;         /* requests forwarded (or served) since start */
  double cost_per_day;       /* what the phone costs per day (--cost-per-day); sent when > 0 */
  const char *labels;        /* its labels (--label) as a JSON object; NULL: none sent */
  const char *cache_isolation; /* "slots", "engine" (isolate.h), NULL: none */
  const char *engine_build;  /* the engine's build as its /props says; NULL unknown */
  const char *template_caps; /* its chat template's capabilities (/props), JSON; NULL unknown */
  int features_known;        /* the engine's features were asked (feat.h); 0: not yet */
  unsigned features;         /* PR_FEAT_* it serves */
  int choices_max;           /* the most "n" it serves at once (>= 1) */
  ag_running running[AG_REPORT_MAX_SLOTS]; /* requests on a slot now (status only) */
  size_t n_running;
  /* what the phone holds (hold.h): models_dir NULL when no folder is known (nothing below
   * is said then); storage_free_mb < 0 unknown; held[] only once a scan ended (held_known) */
  const char *models_dir;
  double storage_free_mb;
  int storage_said;          /* storage_free_mb is said without a models folder (a sim's) */
  ag_held held[AG_REPORT_MAX_HELD];
  size_t n_held;
  int held_known;
  const char *loading_model;  /* the model the engine is loading (NULL: none, or ready) */
  const char *loading_file;   /* its file, when known */
  int can_switch;             /* its engine can switch models when the gateway asks */
  const char *switch_to;      /* a switch of models under way (placement): the model, */
  const char *switch_phase;   /* draining, fetching, loading or failed, */
  const char *switch_why;     /* and why it failed (NULL otherwise) */
  const char *unfit;          /* the phone cannot hold its model, and why: the heartbeat's
                                 state is "unfit" and needs no url (docs/protocol.md) */
} ag_report;

/* GET /agent/v1/status: a JSON object (see docs/agent.md). */
int ag_report_status_json(const ag_report *r, pr_buf *out);
/* The heartbeat body (docs/protocol.md's keys only) for an agent reachable at url (NULL
 * only for an unfit report). Returns PR_EMISSING when there is no model to report yet.
 * key: the phone's public key (idkey.h), sent as `key`. */
int ag_report_heartbeat_json(const ag_report *r, const char *url, const char *key, pr_buf *out);

/* "ready"/"loading"/"draining"/"unfit": the heartbeat's state for this report. */
const char *ag_report_hb_state(const ag_report *r);

#endif
