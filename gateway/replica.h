/* A replica: one OpenAI-compatible server (a phone's agent, a bare llama-server, ...)
 * as the gateway sees it: what it serves, how many slots it has and how many the
 * gateway is using, how fast it has been, and whether it may take work. No I/O here:
 * the scheduler and the tests use it directly. Owned by the gateway's registry; the
 * strings are the replica's own copies. */
#ifndef GW_REPLICA_H
#define GW_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "heap.h"
#include <cjson/cJSON.h>

#include "pcache.h"

#define GW_MAX_SLOTS 64
#define GW_INTERACTIVE_PEAK_S 60.0 /* how long interactive work's peak on a phone is kept */

/* Health states. Draining is not a state but a reason on top (gw_replica_draining): a
 * draining replica keeps its health state, takes no new work and finishes what runs. */
typedef enum {
  GW_REPLICA_READY = 0,
  GW_REPLICA_DOWN,
  GW_REPLICA_LOADING,
} gw_replica_state;

/* What a phone says it can hold (its heartbeats: docs/protocol.md): its memory, the free
 * storage of its models folder, the model files on its disk that its agent checked (by
 * name and SHA-256), and the model it is loading. Figures < 0 are unknown. Plain data,
 * kept apart from what routing reads: placement will. */
#define GW_HOLD_MAX_MODELS 16
#define GW_HOLD_NAME_MAX 64
typedef struct gw_hold_model {
  char name[GW_HOLD_NAME_MAX + 1];
  char sha256[65];
} gw_hold_model;

/* Why a phone is held back from new work: one bit per reason. The reasons a module
 * decides are kept in gw_replica.held, each changed only through gw_replica_held_set by the
 * module that owns it; the others are worked out from the replica's figures when asked
 * (gw_replica_held_why). */
#define GW_HELD_DOWN (1u << 0)        /* health: failed (state DOWN; replica.c, health.c) */
#define GW_HELD_LOADING (1u << 1)     /* loading its model (state LOADING) */
#define GW_HELD_REMOVED (1u << 2)     /* kept: gone from the config, or its enrolment released
                                         (registry.c, admin.c): drains, then leaves */
#define GW_HELD_DRAIN_CONF (1u << 3)  /* kept: "drain": true in its file (registry.c) */
#define GW_HELD_DRAIN_ADMIN (1u << 4) /* kept: drained through the admin API, here or at
                                         another gateway (admin.c, shared.c, drains.c) */
#define GW_HELD_DRAIN_AGENT (1u << 5) /* kept: its agent reports draining (heartbeat.c) */
#define GW_HELD_PLACING (1u << 6)     /* kept: placement switches it to another model
                                         (placement.c) */
#define GW_HELD_QUARANTINED (1u << 7) /* kept: found faking its answers (verify.c) */
#define GW_HELD_CHECK (1u << 8)       /* kept: a check of it is undecided (verify.c): no new
                                         caller work; its shadow requests still run */
#define GW_HELD_PROBATION (1u << 9)   /* kept: back from down, one slot until a success
                                         (replica.c, health.c, heartbeat.c): holds it back
                                         while that slot is in use */
#define GW_HELD_SHARE (1u << 10)      /* without a record: at its share cap (gw_replicas_trust) */
#define GW_HELD_DEVICE (1u << 11)     /* its readings (battery, heat) limit it (device.h) */
#define GW_HELD_REMOTE (1u << 12)     /* other gateways' requests hold its slots (Redis) */
#define GW_HELD_BUSY (1u << 13)       /* every slot it has (or its share while Redis is
                                         away) is in use */
#define GW_HELD_N 14
/* The kept reasons that are drains: it finishes what runs and takes nothing new. */
#define GW_HELD_DRAINS (GW_HELD_REMOVED | GW_HELD_DRAIN_CONF | GW_HELD_DRAIN_ADMIN | \
                        GW_HELD_DRAIN_AGENT | GW_HELD_PLACING | GW_HELD_QUARANTINED)
/* The reasons kept in gw_replica.held. */
#define GW_HELD_KEPT (GW_HELD_DRAINS | GW_HELD_CHECK | GW_HELD_PROBATION)

typedef struct gw_replica_hold {
  double mem_total_mb;          /* MemTotal */
  double storage_free_mb;       /* free in its models folder */
  gw_hold_model models[GW_HOLD_MAX_MODELS];
  size_t n_models;
  int models_known;             /* its agent said which (an older one does not) */
  char loading[GW_HOLD_NAME_MAX + 1]; /* the model it is loading ("": none) */
} gw_replica_hold;

#define GW_PLACE_SEEN 8
/* Where placement (placement.c, docs/placement.md) means this phone to be, and how its
 * switch goes. Plain data; heartbeats report the agent's side (gw_placement_heartbeat).
 * owner: placement.c */
typedef struct gw_replica_place {
  char want[GW_HOLD_NAME_MAX + 1];   /* the model placement means for it ("": none) */
  char from[GW_HOLD_NAME_MAX + 1];   /* the model it served when its switch began */
  char reason[200];                  /* why it was moved */
  char pin[GW_HOLD_NAME_MAX + 1];    /* an operator's pin through the admin API ("": none) */
  uint64_t since_ms;                 /* when it came to its model (joined, or switched) */
  uint64_t switch_ms;                /* when its switch began; 0: none under way */
  int can_switch;                    /* its agent says it can switch models (heartbeats) */
  char phase[16];                    /* the agent's word on the switch: draining, fetching,
                                        loading, failed ("": none yet) */
  char failed[320];                  /* the last failed switch and why ("": none) */
  char failed_model[GW_HOLD_NAME_MAX + 1];
  uint64_t failed_ms;
  uint64_t tokens_in, tokens_out, answers; /* its counters at the last pass (demand's sizes) */
  int read;                          /* they were read once */
  struct {
    char model[GW_HOLD_NAME_MAX + 1];
    double prefill_tps, decode_tps;  /* measured while it served that model */
  } seen[GW_PLACE_SEEN];
  size_t n_seen;
} gw_replica_place;

/* One request running on a replica, as far as the scheduler needs to know. */
typedef struct gw_lease {
  uint64_t id;          /* 0: free entry */
  uint64_t start_ms;
  uint64_t pred_end_ms; /* predicted finish */
  void *owner;          /* the gateway's attempt holding it (borrowed; NULL in tests) */
  int batch;            /* held by batch-class work (gw_replica_acquire_class) */
} gw_lease;

/* A replica's parts. Each is written by the module named as its owner (and changed
 * elsewhere only through that module's functions); any module reads them. The rest of
 * gw_replica -- what it is and serves, its slots and leases, its learned rates, its
 * health state and the passive health that moves it, its flag word -- is replica.c's,
 * written through the functions below. tests/tools/replica_writes.py counts the writes
 * made from outside each field's owner. */

/* Active health: probes and proof of life. owner: health.c healthsched.c */
typedef struct gw_replica_probes {
  int probe_ok, probe_fail;     /* consecutive results */
  uint64_t probe_fail_ms;       /* when the last failed one ended */
  uint64_t next_probe_ms;
  uint64_t next_busy_probe_ms;  /* the earliest next one while a request runs on it
                                   (health.busy_interval_s after the last one ended) */
  uint64_t alive_ms;            /* its last proof of life: a byte of an answer, a heartbeat
                                   that counts its requests, an answered probe (0: none;
                                   gw_replica_alive) */
  uint32_t busy_gap_ms;         /* busy_interval_s with this round's jitter: a busy phone is
                                   probed once nothing was heard from it for this long */
  int probing;                  /* a probe is in flight */
  pr_heap_node health_at;       /* when health.c looks at it next, in its heap */
  uint64_t probe_start_ms;      /* when the health probe in flight went out (0: none, or /props) */
  uint64_t probe_late_ms;       /* when that probe was found late (health.late_s); 0: it is not */
  uint64_t probe_due_ms;        /* when it was first seen past its late bound, a verdict that
                                   waits one loop turn (its answer may be unread); 0: not yet */
  double probe_srtt_ms, probe_rttvar_ms; /* how long its good probes take, and how much that
                                            varies (RFC 6298's smoothing, gw_replica_probe_took);
                                            srtt 0: none yet */
  int probe_path;               /* 0 agent status, 1 /health, 2 /v1/models */
  char last_probe_error[256];
} gw_replica_probes;

/* What its agent's heartbeats say of it. owner: heartbeat.c */
typedef struct gw_replica_report {
  uint64_t last_heartbeat_ms;   /* loop time of the last valid heartbeat; 0 none */
  int64_t last_heartbeat_ts;    /* its signed timestamp (ms): older ones are replays */
  int busy_reported;
  double battery_pct, temperature_c, mem_free_mb; /* < 0: unknown */
  double cpu_max_freq_ratio;    /* the CPU clock's cap over its top (0-1); < 0 unknown */
  int charging;                 /* -1 unknown */
  char version[32];
  gw_replica_hold hold;         /* what it can hold (memory, storage, models on its disk) */
} gw_replica_report;

/* A replica's report before its first heartbeat: every reading unknown. */
#define GW_REPLICA_REPORT_UNKNOWN                                                            \
  {.battery_pct = -1, .temperature_c = -1, .mem_free_mb = -1, .cpu_max_freq_ratio = -1,   \
   .charging = -1, .hold = {.mem_total_mb = -1, .storage_free_mb = -1}}

/* Device-aware routing (device.h), judged from each heartbeat's readings
 * (gw_heartbeat_device). owner: heartbeat.c */
typedef struct gw_replica_device {
  int cap;                      /* most requests at once: -1 no limit, 0 no new work */
  int hot;                      /* hot or clock-capped */
  double slow;                  /* how much slower it is planned while hot, in full (1: not) */
  unsigned pre0, dec0;          /* its rate samples when it turned hot */
  int hot_answers;              /* answers measured while hot over which slow fades */
  char held_back[192];          /* why the readings hold it back ("": they do not) */
  int cap_shown, hot_shown;     /* the hold last announced (events) */
} gw_replica_device;
/* Before any reading: no limit, no slowdown. */
#define GW_REPLICA_DEVICE_NONE {.cap = -1, .slow = 1.0}

/* Several gateways over Redis. owner: shared.c */
typedef struct gw_replica_shared {
  int share_div;                /* >1 while Redis is away: use slots / share_div */
  int remote_busy;              /* slots other gateways held at the last lease answer */
  uint64_t remote_busy_until;   /* that answer is trusted until then */
  uint64_t rates_shared_ms;
} gw_replica_shared;

/* Who it is and where it comes from. owner: registry.c heartbeat.c */
typedef struct gw_replica_ident {
  uint64_t reg_seq;       /* its place in the registry's order (registry.c); a model lists
                             its phones in this order (model.h) */
  int agent;              /* fronted by fleetgate-agent (probe /agent/v1/status first) */
  char key[48];           /* the phone's public key its heartbeats are signed with ("": none) */
  int from_file;          /* defined in the main file or replicas_dir */
  int from_heartbeat;     /* an agent's heartbeats registered or refresh it */
} gw_replica_ident;

/* What its answers came to. owner: upstream.c */
typedef struct gw_replica_served {
  uint64_t tokens_in, tokens_out;
  double last_latency_s;
  uint64_t n_timings_disagreed; /* answers whose timings the gateway's clock overruled */
  uint64_t disagree_log_ms;     /* when that was last logged (rate-limited) */
  unsigned disagree_unlogged;   /* disagreements since */
} gw_replica_served;

/* The scheduler's figures, worked out before each planning pass and as leases come and
 * go. owner: replica.c */
typedef struct gw_replica_sched {
  int trust_cap;            /* without a record yet: most requests at once, when
                               trust_capped (gw_replicas_trust sets both before each
                               planning pass) */
  int trust_capped;
  int founder;              /* listed by the operator (a file, the admin API) while no phone
                               had a record yet: a fresh fleet's own, never capped */
  /* interactive work here: slots it holds now and a decaying peak of them, which
   * batch work leaves free (gw_replica_interactive_reserve) */
  int inter_busy;
  double inter_peak;
  uint64_t inter_peak_ms;
} gw_replica_sched;

typedef struct gw_replica {
  char *id;
  char *url;
  char *token;
  char **models;
  size_t n_models;
  int slots;
  int64_t n_ctx;          /* per slot; 0 = unknown */
  int slots_auto;         /* slots not configured: taken from what the replica says */
  int n_ctx_auto;         /* likewise n_ctx */
  int props_due;          /* (bare llama-server) read /props after the next good probe */
  double cost_per_day;    /* what it costs (gw_replica_set_cost): its file's, else its phone's */
  double cost_conf;       /* its file's cost_per_day; < 0: none */
  double cost_claim;      /* what its heartbeats say (capped); < 0: nothing */
  char *labels;           /* JSON object text, or NULL */

  /* why it is held back from new work, as its modules decided (GW_HELD_KEPT bits; only
   * gw_replica_held_set changes it) */
  uint32_t held;

  gw_replica_state state;
  uint64_t state_since_ms;
  int state_remote;       /* the state is another gateway's verdict (Redis): not sent back */
  char state_reason[128];

  /* learned speed (tokens per second), moving averages seeded from config */
  double prefill_tps, decode_tps;
  unsigned prefill_samples, decode_samples;
  int rates_claimed;        /* 1 prefill, 2 decode: seeded by the phone's own claim (a
                               heartbeat, Redis), not by the operator's config */
  int rates_default;        /* 1 prefill, 2 decode: neither configured nor claimed: until
                               measured, planned at the fleet's prior (gw_replicas_priors) */
  unsigned drift_seen[2];   /* sample counts at the last drift step: a change is a refresh */
  uint64_t drift_ms;        /* loop time of the last drift step (0: none yet) */

  /* work in flight */
  int inflight;
  gw_lease leases[GW_MAX_SLOTS];
  uint64_t next_lease;

  /* passive health */
  int consecutive_failures;
  unsigned down_count;      /* how many times in a row it was ejected (cool-down grows) */
  uint64_t down_until_ms;   /* while DOWN: earliest time to try again */
  int refusals_in_row;      /* refusals since its last good answer (job.c) */

  /* what its engine serves (proto/feat.h): its agent's status says, or, for a bare
   * llama-server, the gateway asks (engprobe.c), once per engine process */
  unsigned features;        /* PR_FEAT_*; 0 until known */
  int choices_max;          /* the most "n" it serves at once (1: none beyond one) */
  int feat_known;           /* features learned of the engine running now */
  char build[64];           /* its engine's build (/props build_info), "" unknown */

  /* what its engine's prompt cache holds, and whose (pcache.h) */
  gw_pcache pc;

  /* counters */
  uint64_t n_ok, n_failed;

  /* the parts, each its module's */
  gw_replica_ident ident;       /* registry.c, heartbeat.c */
  gw_replica_probes health;     /* health.c, healthsched.c */
  gw_replica_report report;     /* heartbeat.c */
  gw_replica_device dev;        /* heartbeat.c (device.c judges) */
  gw_replica_place place;       /* placement.c */
  gw_replica_shared shared;     /* shared.c */
  gw_replica_served served;     /* upstream.c */
  gw_replica_sched sched;       /* replica.c */
} gw_replica;

/* Create from settings; copies the strings. Returns NULL on allocation failure. */
gw_replica *gw_replica_new(const char *id, const char *url, const char *token,
                           char *const *models, size_t n_models, int slots, int64_t n_ctx,
                           double prefill_tps, double decode_tps, double cost_per_day);
void gw_replica_free(gw_replica *r);

/* Set where its cost per day comes from (either < 0: not given): the file's figure wins
 * over the phone's claim, and with neither it costs 0. Returns 1 when cost_per_day changed. */
int gw_replica_set_cost(gw_replica *r, double conf, double claim);

const char *gw_replica_state_name(gw_replica_state s);
/* Whether any of `bits` (GW_HELD_*) is among the reasons kept in r->held. */
static inline int gw_replica_has(const gw_replica *r, uint32_t bits) { return (r->held & bits) != 0; }
/* Set (on) or clear one or more kept reasons (GW_HELD_KEPT bits); returns 1 when r->held
 * changed. The module that owns a reason (see GW_HELD_*) is the one that calls it. */
int gw_replica_held_set(gw_replica *r, uint32_t bits, int on);
/* Whether r can take new work now, and if not why: returns the slots it may use (0: none)
 * and puts in *why (when not NULL) every GW_HELD_* reason that holds it back from one
 * more request now -- the kept ones that stop all new work, the health state, and each
 * limit its requests in flight have reached (probation, its share cap, its readings,
 * other gateways' requests, its slots). ignore: reasons not counted (GW_HELD_CHECK for a
 * check's shadow requests). *why is 0 exactly when it can take one more request. */
int gw_replica_admits(const gw_replica *r, uint64_t now_ms, uint32_t ignore, uint32_t *why);
/* The reasons r takes no new work now (gw_replica_admits's why; 0: it takes some). */
uint32_t gw_replica_held_why(const gw_replica *r, uint64_t now_ms);
/* A reason's name ("down", "drained_admin", "share_cap", ...; one bit), as the admin API
 * and the status page show it; NULL for no single known bit. */
const char *gw_replica_held_name(uint32_t bit);
/* The names of the bits in `why`, lowest first, joined with ", " into buf (cap bytes);
 * returns buf ("" when why is 0). */
const char *gw_replica_held_names(uint32_t why, char *buf, size_t cap);
int gw_replica_draining(const gw_replica *r);
/* The state to show: "draining" when any drain applies and it is otherwise ready. */
const char *gw_replica_display_state(const gw_replica *r);
/* Why it is in its displayed state: while healthy but draining, which drain holds it
 * (the health reason says nothing then); otherwise the last health or failure reason. */
const char *gw_replica_reason(const gw_replica *r);
/* Replace the strings (url, token, models, labels); returns 0 or -ENOMEM. */
int gw_replica_set_strings(gw_replica *r, const char *url, const char *token,
                           char *const *models, size_t n_models, const char *labels);
int gw_replica_serves(const gw_replica *r, const char *model);
/* Slots the gateway may use now (0 when it may take no work). */
int gw_replica_capacity(const gw_replica *r, uint64_t now_ms);
/* The same for a check's shadow requests (verify.c): a hold for an undecided check does
 * not stop them (they decide it); every other limit does (probation, the share of a phone
 * without a record, its readings, other gateways' requests). */
int gw_replica_capacity_checked(const gw_replica *r, uint64_t now_ms);
/* Predicted time until a slot is free: 0 when one is free now. A request running past
 * its prediction is assumed to need a quarter of its elapsed time more, so an
 * overrunning phone looks ever less attractive instead of always "about to finish". */
uint64_t gw_replica_wait_ms(const gw_replica *r, uint64_t now_ms);

/* How much slower than learned the replica is running right now, from requests that
 * overran their prediction by a quarter (and 250 ms): the worst elapsed/predicted ratio
 * (1.0 when none; at most 20). A phone that turns slow shows it long before its first
 * slow answer ends and teaches the moving averages. */
double gw_replica_slowdown(const gw_replica *r, uint64_t now_ms);
/* How much slower than its learned rates a hot phone is planned now (1: not hot): its
 * readings' slowdown, fading as answers measured while hot teach the rates (device.h). */
double gw_replica_device_slowdown(const gw_replica *r);
/* What the replica says of its slots and context per slot (/props, the agent's status or
 * heartbeat; <= 0: not said), taken where the config left them out. Slots are capped at
 * GW_MAX_SLOTS. Returns 1 when anything changed. */
int gw_replica_learn_shape(gw_replica *r, int64_t slots, int64_t n_ctx);
/* Its engine's build as reported (printable ASCII kept, cut to fit). */
void gw_replica_set_build(gw_replica *r, const char *build);
/* What its agent's status says the engine serves: `features` the status's engine_features
 * ({"choices": N, "continue_final_message": bool, "responses": bool}; null or absent: not
 * known yet, nothing assumed), `build` its engine_build. Returns 1 when anything changed. */
int gw_replica_take_features(gw_replica *r, const cJSON *features, const cJSON *build);
/* Whether r serves everything of `needs` (PR_FEAT_* bits) and, for choices > 1, that many
 * choices at once on its own slots. */
int gw_replica_serves_features(const gw_replica *r, unsigned needs, int choices);
/* Take a slot for a request predicted to take pred_ms; returns the lease id. owner is
 * kept with the lease (progress reports find their request through it). */
uint64_t gw_replica_acquire(gw_replica *r, uint64_t now_ms, uint64_t pred_ms, void *owner);
void gw_replica_release(gw_replica *r, uint64_t lease);
/* The same for a class of work: 0 interactive (gw_replica_acquire's), 1 batch. */
uint64_t gw_replica_acquire_class(gw_replica *r, uint64_t now_ms, uint64_t pred_ms, void *owner,
                                  int batch);
/* Slots batch work should leave free on r for interactive work about to come: `share`
 * of the recent peak of interactive slots here (decaying with a time constant of
 * GW_INTERACTIVE_PEAK_S) less those interactive work holds now. */
int gw_replica_interactive_reserve(const gw_replica *r, uint64_t now_ms, double share);

/* r's engine is known to hold no prompt (it is loading its model again). */
void gw_replica_cache_reset(gw_replica *r);

/* Learn from a finished request: prompt tokens computed and the time they took,
 * tokens generated and the time they took (ms). Non-positive values, and samples that
 * are no finite rate, are ignored; rates stay within GW_RATE_MIN..GW_RATE_MAX. */
void gw_replica_observe(gw_replica *r, double prompt_n, double prompt_ms, double predicted_n,
                        double predicted_ms);

/* Rates an agent's heartbeat or another gateway (Redis) says, taken only while nothing
 * was learned here and only when finite and positive, clamped to the bounds of
 * bounds.h. */
void gw_replica_seed_rates(gw_replica *r, double prefill_tps, double decode_tps);

/* Whether any of r's rates was measured here (an answer, a progress report). */
int gw_replica_measured(const gw_replica *r);
/* Whether nothing is known of r's speed: nothing measured yet, and some rate the operator
 * did not configure (planned at the fleet's prior, or at the phone's own claim). Such a
 * phone is explored (gw_sched_req.explore); one whose rates the operator set is planned
 * at them until its answers correct them. */
int gw_replica_unknown(const gw_replica *r);
/* Whether r failed its last health check, or the one in flight is late (health.late_s),
 * and it is not marked down yet (that takes health.fall failures): not expected to
 * answer, so new work goes elsewhere while any other phone can take it (gw_sched_plan),
 * and its running requests are hedged. */
int gw_replica_suspect(const gw_replica *r);
/* Something came from r at now_ms (a byte of an answer, a heartbeat that counts the
 * requests sent there, an answered probe): it is alive then, which puts off the next check
 * of a busy phone (health.c; docs/health.md, "Proof of life"). */
static inline void gw_replica_alive(gw_replica *r, uint64_t now_ms) {
  if (now_ms > r->health.alive_ms) r->health.alive_ms = now_ms;
}

/* The fleet's prior for r: the median of the known rates of the replicas among rs that
 * share a model with r, r included; a rate is known when it was measured here or the
 * operator configured it (a phone's own claim is not). A rate no replica knows is 0. A
 * robust middle, not the fastest: one fast (or lying) phone does not set every
 * newcomer's start. */
void gw_replicas_prior(gw_replica *const *rs, size_t n, const gw_replica *r, double *prefill_tps,
                       double *decode_tps);

/* Before a planning pass: a rate never measured and neither configured nor claimed
 * (rates_default) is set to the prior (else the fixed defaults, 50 and 5 tokens/s); a
 * measured rate not refreshed drifts toward the prior, geometrically, by a factor
 * e^(-t / drift_s) of the log-distance over t seconds without a new sample (drift_s <= 0:
 * no drift). Steps at most once a second. */
void gw_replicas_priors(gw_replica *const *rs, size_t n, uint64_t now_ms, double drift_s);

/* The share cap of phones without a record for the n replicas rs: each one's own
 * (gw_trust_cap in bounds.h, against the trusted phones' usable slots) and the group's
 * (gw_trust_group_cap), the group's room shared out one request at a time. */
void gw_replicas_trust(gw_replica *const *rs, size_t n, int trust_after, uint64_t now_ms);

/* Rates seeded from claims (gw_replica_seed_rates; nothing learned here yet) are lowered
 * to the fastest rate learned of any of the n replicas rs (gw_bound_seed). The
 * operator's configured seeds are left as they are. */
void gw_replicas_bound_seeds(gw_replica *const *rs, size_t n);

/* Passive health. A success clears the failure count and ends probation; the n-th
 * consecutive failure (threshold) takes the replica DOWN for a cool-down that doubles
 * with each ejection in a row, up to cooldown_max_s. Returns 1 when the state changed. */
int gw_replica_success(gw_replica *r, uint64_t now_ms);
/* A success that counts toward no record (n_ok: a check's shadow request, verify.c, is no
 * good answer until it is compared): its health only. */
int gw_replica_answered(gw_replica *r, uint64_t now_ms);
int gw_replica_failure(gw_replica *r, uint64_t now_ms, int threshold, double cooldown_s,
                       double cooldown_max_s, const char *reason);
/* A DOWN replica whose cool-down ended comes back on probation (one slot).
 * Returns 1 when the state changed. */
int gw_replica_tick(gw_replica *r, uint64_t now_ms);
void gw_replica_set_state(gw_replica *r, gw_replica_state s, uint64_t now_ms, const char *reason);
/* Mark r DOWN for `reason` until until_ms at least (its cool-down); remote: the verdict is
 * another gateway's (Redis), not to be sent back. */
void gw_replica_take_down(gw_replica *r, uint64_t now_ms, uint64_t until_ms, const char *reason,
                          int remote);
/* Back from DOWN on probation (one slot until a success), its failures forgotten. */
void gw_replica_probation(gw_replica *r, uint64_t now_ms, const char *reason);
/* Say why it is in its state (printf-style; its state does not change). */
void gw_replica_set_reason(gw_replica *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* What a health check's outcome says of its engine: after a failure or while loading its
 * /props are read again at the next good probe (a bare engine may come back with other
 * settings), and a bare engine that loads is asked again what it serves. */
void gw_replica_engine_unsure(gw_replica *r, int failed, int loading);
/* Whether /props is still to be read (0: read, or not there to read). */
void gw_replica_props_due(gw_replica *r, int due);
/* What its engine serves as learned (engprobe.c: PR_FEAT_* bits and the most choices at
 * once; health.c: a server that is no llama-server serves what every engine does). */
void gw_replica_set_features(gw_replica *r, unsigned features, int choices_max);
/* Its slots and context per slot as the configuration gives them (0: not configured,
 * then taken from what the replica says: gw_replica_learn_shape, /props). */
void gw_replica_configure_shape(gw_replica *r, int slots, int64_t n_ctx);
/* Its slots and context per slot as the heartbeats of a phone without a file say them. */
void gw_replica_set_shape(gw_replica *r, int slots, int64_t n_ctx);
/* It serves another model now (placement): nothing measured of the new one; planned at
 * these rates until measured or claimed. */
void gw_replica_rates_restart(gw_replica *r, double prefill_tps, double decode_tps);
/* It says it is loading its model (a probe, the agent, a 503 Loading model): LOADING.
 * fresh: a bare engine's own "503 Loading model", which only a process that just started
 * says -- it holds no prompt (gw_replica_cache_reset); an agent says "loading" also for an
 * engine that stopped answering for a while, which holds what it held. */
void gw_replica_engine_loading(gw_replica *r, uint64_t now_ms, const char *reason, int fresh);

#endif
