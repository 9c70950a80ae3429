/* The gateway's configuration: one JSON main file (see docs/configuration.md). Loading
 * builds a complete gw_config or fails with every problem reported as
 * "file:line:col: message"; nothing is half-applied. A gw_config is immutable once
 * loaded and owns all of its strings. */
#ifndef GW_CONFIG_H
#define GW_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "device.h"
#include "idmap.h"
#include "ipnet.h"

typedef struct gw_replica_conf {
  char *id;
  char *url;          /* base URL without trailing slash: "https://abc.acu.run" */
  char **models;
  size_t n_models;
  int slots;          /* 0: not given, learned from the replica (/props or the agent) */
  char *token;        /* resolved from token_env (or "token" for tests); may be NULL */
  double cost_per_day; /* < 0: not given (the phone's heartbeat may say) */
  double prefill_tps; /* seeds for the learned rates */
  double decode_tps;
  int64_t n_ctx;      /* context per slot; 0: not given, learned like slots (else large) */
  int drain;
  int agent;          /* fronted by fleetgate-agent: probe /agent/v1/status */
  int heartbeats;     /* its phone may send heartbeats for this id */
  char *key;          /* the phone's public key, pinned here (implies heartbeats); NULL: none */
  char *labels;       /* the labels object as compact JSON, or NULL */
  char *file;         /* where it was defined, for messages */
  int line, col;
} gw_replica_conf;

/* A model's capacity targets (capacity.h): what the advice plans phones for. Unset
 * figures (< 0; batch_by_min -2) take the `capacity` section's. */
typedef struct gw_targets {
  double interactive_wait_s; /* interactive requests' wait, at the confidence, at most this */
  double review_within_s;    /* reviews (long interactive prompts) answered within this */
  int batch_by_min;          /* batch work done by this minute of the day, local time
                                (-1: within batch.completion_window_s of its creation) */
} gw_targets;

/* One model of the catalogue (the config's `models`): what placement needs to put it on a
 * phone (docs/placement.md). Strings owned. */
typedef struct gw_model_conf {
  char *name;
  char *url;           /* where phones download its GGUF; NULL: phones must hold it already */
  char *sha256;        /* the file's SHA-256, 64 lowercase hex digits; NULL with url NULL */
  int64_t size_bytes;  /* the file's size; 0: not given */
  double mem_mb;       /* memory it needs on a phone; 0: the file's size + 20 % + 512 MiB */
  int64_t n_ctx;       /* context per slot to run it with; 0: the engine's default */
  char **engine_args;  /* more arguments for the engine (llama-server) with this model */
  size_t n_engine_args;
  char *labels;        /* a JSON object every pair of which a phone's labels must have; NULL */
  double min_ram_mb;   /* phones with less memory (MemTotal) may not run it; 0: none */
  int exclude;         /* placement puts no phone on it (phones already on it stay) */
  gw_targets targets;  /* its capacity targets (-1, -2: the `capacity` section's) */
} gw_model_conf;

/* What one API key may hold of the Batch API at once (docs/configuration.md, `batch.quota`
 * and each key's own): 0 is no limit. A key's entry left out is -1 while loading and
 * takes `batch.quota`'s once the file is read. */
typedef struct gw_bquota {
  int64_t files;           /* files stored: uploads and batch output files */
  int64_t file_bytes;      /* their bytes, with the uploads still arriving */
  double uploads_per_min;  /* uploads begun per minute (a bucket that holds this many) */
  int64_t batches;         /* batches that have not ended (waiting for a run slot or not) */
  int64_t validating;      /* of them, batches being validated or waiting to be */
  int64_t lines;           /* lines of its batches not answered yet */
} gw_bquota;

/* A caller: an API key, known only by the SHA-256 of the key. */
typedef struct gw_key_conf {
  char *name;
  unsigned char sha256[32];
  double rpm;         /* requests per minute; 0: no limit */
  double tpm;         /* tokens per minute (prompt + completion, from usage); 0: no limit */
  int concurrency;    /* requests queued or running at once; 0: no limit */
  int priority;       /* 0 interactive, 1 batch: the class of its requests (the most it may ask) */
  double weight;      /* share of the fleet within its class, relative to other callers */
  char **models;      /* allowed models; NULL: all */
  size_t n_models;
  char *cache_scope;  /* keys naming one scope share phones' prompt caches (docs/security.md,
                         "Tenants' prompts"); NULL: the key's own name, a scope of its own */
  uint64_t scope_id;  /* the scope's id (gw_cache_scope_id; never 0) */
  gw_bquota quota;    /* its Batch API quotas (resolved: never -1 once loaded) */
} gw_key_conf;

typedef struct gw_listen_conf {
  char *address;
  char *tls_cert;     /* PEM chain, leaf first; NULL: plain HTTP */
  char *tls_key;
} gw_listen_conf;


/* A phone class the operator can rent (capacity.prices). */
typedef struct gw_price_conf {
  char *name;
  double cost_per_day;
  double prefill_tps, decode_tps; /* per slot */
  int slots;
  char **models;                  /* models it can serve; NULL: any */
  size_t n_models;
} gw_price_conf;

typedef struct gw_config {
  int refs;           /* jobs hold a reference: they finish on the config they started with */
  char *path;
  char *replicas_dir; /* resolved against the main file's folder; NULL: none */
  gw_listen_conf *listen;
  size_t n_listen;

  /* HTTP front limits */
  size_t max_body_bytes;
  double header_timeout_s;
  double idle_timeout_s;
  double send_timeout_s;     /* a client that reads nothing this long is let go */
  size_t max_connections;
  size_t body_budget_bytes;  /* request body bytes buffered at once, all connections */

  /* queue and scheduling */
  size_t queue_max;          /* per model */
  double queue_timeout_s;    /* default deadline */
  int retries;               /* further attempts after the first */
  int64_t default_max_tokens;
  double expected_output_tokens; /* seed for the expected answer length */
  int trust_after_answers;   /* good answers before a phone's share is uncapped (0: never capped) */
  double batch_reserve;      /* share of interactive work's recent peak on a phone that batch
                                work leaves free there (replica.h) */
  double batch_borrow_s;     /* ...unless it holds the slot no longer than this */
  double wait_weight_max;    /* shorter long work weighs its wait for a busy fast phone by
                                the longest waiting work's time / its own, at most this */
  double aging_factor;       /* shortest work first: ready = arrival + this x predicted service */
  double deadline_margin;    /* refuse at once only when predicted finish / this > deadline */
  gw_device_conf device;     /* scheduler.device: what phones' readings do (device.h) */
  double rates_drift_s;      /* learned rates not refreshed drift to the fleet's prior (replica.h) */
  double explore_cost;       /* extra predicted time (a share) that measuring a new phone may cost */
  double timings_trust_factor; /* a phone's timings are learned within this factor of the clock */
  double hedge_budget;       /* hedges' share of the phone work (slot-seconds; 0: no hedging) */
  int hedge_min_running;     /* hedges off a suspect phone allowed beyond the budget, at once */
  double hedge_factor;       /* a first byte is overdue past the prediction x this... */
  double hedge_min_s;        /* ...+ this (half the margin for short prompts) */
  double short_s;            /* work predicted to hold a slot at most this long is short... */
  int short_reserve;         /* ...and longer work leaves this many quick slots free for it */
  double short_recent_s;     /* ...while short work came this recently (or since start) */
  int fill_idle;             /* a phone left idle takes long work the faster phones cannot
                                clear before it would finish it (scheduler.c) */
  double load_window_s;      /* ...weighing the model's work per second over this (gw_load) */
  double short_wait_p;       /* ...as many as keep P(a short request waits > short_s) under
                                this, by the short work that came (0: short_reserve) */

  /* upstream */
  char *ca_file;
  int tls_verify;
  int allow_http;            /* replica URLs may be http:// (tests, a demo on one machine) */
  pr_ipnet *allow_addresses; /* special-purpose ranges connections may reach anyway */
  size_t n_allow_addresses;
  double connect_timeout_s;
  double timeout_margin;     /* predicted time × margin + min = watchdog */
  double timeout_min_s;
  double stream_idle_timeout_s;
  double stream_silence_factor; /* a started stream silent for k x its phone's gap between tokens... */
  double stream_silence_min_s;  /* ...and at least this long goes on elsewhere (silence.h); k 0: off */
  double refusal_window_s;  /* a 5xx error body sooner than this may be the request's fault */
  size_t answer_bytes_per_token; /* an answer's bytes: 256 KiB + max_tokens x this (bounds.h) */

  /* active health checks (interval 0: none) */
  double health_interval_s;
  double health_timeout_s;
  double health_down_interval_s; /* slower probing while a replica is down */
  double health_idle_probes_per_s; /* idle probes a second at most, fleet-wide (0: no cap) */
  double health_busy_interval_s; /* faster probing while a request runs on it (0: interval_s) */
  double health_late_s;          /* a probe this late makes its replica suspect (0: never) */
  int rise;                  /* consecutive probe successes that bring a replica back */
  int readyz_counts;         /* /readyz shows the fleet counts without the admin token */
  /* passive health; `fall` also counts failed probes */
  int fail_threshold;        /* consecutive failures that eject a replica */
  double cooldown_s;         /* first cool-down; doubles while it keeps failing */
  double cooldown_max_s;

  /* agents' heartbeats */
  char *fleet_secret;        /* from the environment variable named by fleet.secret_env */
  char *fleet_secret_env;
  char *fleet_replica_token; /* secret each heartbeat phone's own token is derived from (NULL: the fleet secret) */
  int fleet_enrol_approve;   /* fleet.enrol "approve": new phones wait for an operator */
  char *fleet_pins_file;     /* SQLite file of phone key pins, resolved; NULL: memory only */
  /* answers verified (verify.c, docs/routing.md "Answers verified") */
  int verify_enabled;        /* cross-checks and canaries at all */
  double verify_budget;      /* shadow requests' share of the phone work (slot-seconds) */
  int verify_min_running;    /* checks of phones without a record allowed beyond it, at once */
  int verify_trust_after;    /* passed checks in a row that make a record */
  double verify_newcomer_rate; /* share of a phone's answers checked before then */
  double verify_min_rate;    /* ...the least share afterwards */
  int verify_quarantine_after; /* lost votes (and failed canaries) that quarantine a phone */
  int verify_ahead;          /* answers a phone without a record gives while a check of it is
                                undecided before it is held */
  int verify_compare_words;  /* leading words of two answers compared */
  int verify_shadow_max_tokens; /* a non-deterministic request's shadows decode at most this; 0: no cap */
  double verify_timeout_s;   /* a shadow request's deadline */
  char *verify_canaries_file; /* operator's canaries, resolved; NULL none */
  double verify_canary_interval_s; /* each phone is asked a canary about this often */
  double fleet_pin_ttl_s;    /* a pin whose phone was silent this long is released */
  size_t fleet_max_replicas; /* pins (enrolled and pending) at most */
  double fleet_enrol_per_min; /* new enrolments accepted per minute, fleet-wide on this gateway */
  double heartbeat_timeout_s;
  double heartbeat_interval_s; /* what the gateway tells agents */
  double heartbeat_max_skew_s; /* timestamps further off are refused */

  double shutdown_timeout_s;
  char *log_level;
  double tls_ticket_rotate_s; /* a new TLS session ticket key this often */

  /* the admin listener: status page, /metrics, admin API (admin.c); NULL: none */
  char *admin_listen;
  char *admin_token;         /* required with an admin section; from admin.token_env */
  int admin_public_read;     /* GETs of the page's data and /metrics need no token */
  double admin_session_ttl_s; /* how long a browser's login (session cookie) lasts; 0: none */

  /* cost accounting (cost.c) */
  char *cost_currency;       /* "ACU" unless costs.currency says */
  double cost_claim_max;     /* a phone's own cost_per_day is believed up to this */

  gw_replica_conf *replicas;
  size_t n_replicas;
  pr_idmap replica_index;  /* id -> its place in replicas + 1 (gw_config_replica) */

  /* Redis shared state (several gateways, one fleet); host NULL: everything local */
  char *redis_host;
  int redis_port;
  int redis_db;
  char *redis_password;      /* from the URL or redis.password_env */
  char *redis_username;      /* Redis 6 ACL user: AUTH USER PASSWORD; NULL: AUTH PASSWORD */
  char *redis_key;           /* the gateways' shared key that seals messages (seal.h) */
  double redis_window_s;     /* sealed messages further than this from now are stale */
  char *redis_prefix;
  double redis_timeout_s;    /* a command not answered in this time: Redis counts as down */
  double lease_ttl_s;        /* a slot lease's life, renewed while the request runs */
  char *gateway_id;          /* this gateway's name among its peers (default: host:pid) */

  /* the Batch API (batch.c): its state and files live under data_dir; NULL: it is off */
  char *data_dir;            /* resolved against the main file's folder */
  size_t batch_max_file_bytes; /* an uploaded file's bytes at most */
  size_t batch_max_lines;    /* a batch input's lines at most */
  double batch_window_s;     /* what completion_window "24h" means (tests shorten it) */
  int batch_line_retries;    /* a line that failed on phones is run again this many times */
  size_t batch_window;       /* lines of one batch in flight at once; 0: the fleet's free slots */
  int batch_sync;            /* output lines reach the disk (fdatasync) before they count */
  size_t batch_max_line_bytes; /* a longer input line fails its batch at once (line_too_long) */
  int batch_validations;     /* batches validated at once, gateway-wide (each holds a line's bytes) */
  size_t batch_max_running;  /* batches with a run (a window of lines) at once; the rest wait */
  double batch_output_expires_s; /* output and error files expire this long after the batch ends (0: never) */
  double batch_file_expires_s;   /* an upload without expires_after expires this long after (0: never) */
  gw_bquota batch_quota;     /* each key's quotas unless its entry says (batch.quota) */

  char **models;      /* the models the fleet is to serve (`models`), whether or not a phone
                         lists them yet */
  size_t n_models;
  gw_targets *model_targets; /* each configured model's own targets (models[i].targets) */

  /* capacity advice (capacity.h, capsvc.c) */
  gw_targets targets;        /* capacity.*: every model's unless its entry says */
  int64_t review_prompt_tokens; /* an interactive prompt this long is a review */
  double cap_confidence;     /* the share of time the targets are to be met */
  double cap_window_s;       /* demand "now" is the rate over this window */
  double cap_startup_s;      /* a new phone's start-up, until measured */
  double cap_idle_release_s; /* a phone idle this long may be released */
  gw_price_conf *prices;     /* capacity.prices: the classes the operator can rent */
  size_t n_prices;
  char **hook_command;       /* capacity.hook.command: argv (NULL: none) */
  size_t n_hook_command;
  char *hook_url;            /* capacity.hook.url (NULL: none) */
  double hook_threshold;     /* phones the advice must change by before the hook runs again */
  double hook_min_interval_s;
  double hook_max_cost_per_day; /* the most rent per day its asks may add in 24 hours */
  double hook_timeout_s;
  gw_model_conf *model_confs; /* the same models' catalogue entries, in the same order */

  /* placement (docs/placement.md): which phone runs which model */
  int place_enabled;         /* the gateway moves phones between models */
  double place_interval_s;   /* how often placement looks */
  double place_horizon_s;    /* demand is weighed over this long (and a switch must pay off in it) */
  double place_min_stay_s;   /* a phone stays on a model at least this long */
  double place_hysteresis;   /* a move must cut the busiest model's load by this share */
  double place_max_switching; /* share of the phones switching at once (at least one) */
  double place_backoff_s;    /* after a failed switch, that phone is not sent to that model again for this long */
  double place_idle_s;       /* a model asked for this recently keeps at least one phone */
  double place_load_mb_s;    /* MiB a phone loads per second, to cost a switch */
  double place_fetch_mb_s;   /* MiB a phone downloads per second, to cost a switch */
  char **place_pin_ids;      /* placement.pins: phone id -> model */
  char **place_pin_models;
  size_t n_place_pins;
  gw_key_conf *keys;  /* NULL and 0: no api_keys, the gateway is open */
  size_t n_keys;
  size_t n_cache_scopes; /* distinct cache scopes of the keys (0 for an open gateway: one) */
} gw_config;

/* The prompt-cache scope of the open gateway (no api_keys): every caller shares it. */
#define GW_CACHE_SCOPE_OPEN 1
/* The id of the cache scope called name: 64 bits of its SHA-256, never 0 nor
 * GW_CACHE_SCOPE_OPEN. */
uint64_t gw_cache_scope_id(const char *name);

/* Load and validate path. On failure returns a negative code and appends one line
 * "file:line:col: message\n" per problem to errors. */
int gw_config_load(const char *path, gw_config **out, pr_buf *errors);
/* The same with flags: GW_CONFIG_NO_FILES checks the file alone, before the files it
 * names exist (`fleetgate --check-config FILE --no-files`): listeners' certificates and
 * keys are not read, data_dir is not looked for. Secrets from the environment, replica
 * files and everything else are checked as at a start. */
#define GW_CONFIG_NO_FILES 1
int gw_config_load_opts(const char *path, int flags, gw_config **out, pr_buf *errors);
/* Reference counting: gw_config_load returns one reference. */
gw_config *gw_config_ref(gw_config *c);
void gw_config_unref(gw_config *c);
const gw_replica_conf *gw_config_replica(const gw_config *c, const char *id);
/* A model's capacity targets: its `models[i].targets`, the rest the `capacity` section's. */
gw_targets gw_config_targets(const gw_config *c, const char *model);
/* The catalogue entry of a model (NULL: the config does not name it). */
const gw_model_conf *gw_config_model(const gw_config *c, const char *name);
/* Append the reference of every key the loader knows to out, as markdown: one table per
 * section ("### top level", "### `limits`", ...) with each key's type, default, range and
 * meaning, from the same table that drives loading. `fleetgate --print-settings` prints
 * it; docs/configuration.md holds the same tables. Returns 0 or a negative code. */
int gw_config_settings_markdown(pr_buf *out);

#endif
