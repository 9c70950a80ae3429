/* The gateway process: its loop, listeners, replica registry, queue and jobs.
 * A job is one client request on its way through the gateway (admission, queue,
 * attempts on replicas, the answer). server.c owns the process and the HTTP front,
 * job.c the queue and a job's life, upstream.c one attempt on a replica. */
#ifndef GW_GW_H
#define GW_GW_H

#include <stdint.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <uv.h>

#include "buf.h"
#include "json.h"
#include "heap.h"
#include "idmap.h"
#include "config.h"
#include "hedge.h"
#include "model.h"
#include "outlen.h"
#include "predict.h"
#include "curlm.h"
#include "curlreq.h"
#include "http.h"
#include "oai.h"
#include "replica.h"
#include "scheduler.h"
#include "sink.h"
#include "sse.h"

/* The longest "replica: detail" a job keeps about its last failed attempt. */
#define GW_LAST_ERROR_MAX 256

/* The server's tick (server.c): health, hedges and a planning pass at least this often. */
#define GW_TICK_MS 100

typedef struct gw_server gw_server;
typedef struct gw_job gw_job;
typedef struct gw_probe gw_probe;
typedef struct gw_caller gw_caller;
typedef struct gw_shared gw_shared;
typedef struct gw_admin gw_admin;
typedef struct gw_metrics gw_metrics;
typedef struct gw_events gw_events;
typedef struct gw_refused_log gw_refused_log;
struct gw_heartbeat_msg;    /* heartbeat.h */
struct gw_heartbeat_result;
struct gw_pins;             /* pins.h */

/* What changed about a replica, published once (gw_fleet_publish) to every subscriber
 * server.c wired at start (Redis, the event stream): modules report a change without
 * knowing who listens. */
typedef enum {
  GW_FLEET_STATE = 0, /* its displayed state changed: from (NULL for a new replica) -> to */
  GW_FLEET_DRAIN,     /* drained or enabled through this gateway's admin API */
  GW_FLEET_RATES,     /* learned a new prefill or decode rate */
  GW_FLEET_PROGRESS,  /* its agent reported the progress of its running requests */
  GW_FLEET_ADDED,     /* it joined the registry (config or heartbeat) */
  GW_FLEET_REMOVED,   /* it leaves the registry now (r is freed right after) */
  GW_FLEET_MODELS,    /* the models it lists changed (a reload, a heartbeat) */
  GW_FLEET_SENT,      /* a request went out to it (upstream.c): an answer is now awaited */
} gw_fleet_kind;

typedef struct gw_fleet_event {
  gw_fleet_kind kind;
  gw_replica *r;           /* subscribers may keep their own bookkeeping in it */
  const char *from, *to; /* GW_FLEET_STATE: gw_replica_display_state names */
  const cJSON *running;  /* GW_FLEET_PROGRESS: the status's `running` array */
  uint64_t now_ms;
} gw_fleet_event;

/* A subscriber: called with the user data it subscribed with, for the kinds in its mask. */
typedef void (*gw_fleet_fn)(gw_server *gw, const gw_fleet_event *ev, void *ud);
#define GW_FLEET_MASK(kind) (1u << (kind))
#define GW_FLEET_ALL 0xffffffffu
#define GW_FLEET_SUBSCRIBERS 16

/* A request ended (job.c job_finish): its outcome worked out once, then published to every
 * subscriber (the access log, metrics, the cost ledger, the key's budget, Redis). The job
 * is read-only to them and valid only during the call. */
typedef struct gw_job_ended {
  const struct gw_job *j;
  uint64_t now_ms;
  int status;              /* as logged: 499 when the client left before any status */
  int served;              /* answered whole: a 2xx/3xx, no stream broken off */
  int failed;              /* counted as an error: a 5xx, a 429, a stream ended by an error event */
  const char *model;       /* "" when the request named none */
  const char *caller;      /* the key's name; NULL without keys */
  uint64_t tokens_in, tokens_out;
  double duration_s, queue_wait_s;
  double ttfb_s;           /* < 0: no first byte */
  int admitted;            /* it held one of its key's admissions (released by auth) */
} gw_job_ended;
typedef void (*gw_job_ended_fn)(gw_server *gw, const gw_job_ended *ev, void *ud);
#define GW_JOB_SUBSCRIBERS 16

enum { GW_PRIO_INTERACTIVE = 0, GW_PRIO_BATCH = 1, GW_PRIO_COUNT = 2 };

/* Why an attempt failed; names are used in logs and metrics. */
typedef enum {
  GW_FAIL_NONE = 0,
  GW_FAIL_CONNECT,     /* refused, reset, DNS, TLS */
  GW_FAIL_TIMEOUT,     /* no first byte, or the stream went silent, in the predicted time */
  GW_FAIL_STATUS,      /* 5xx or an auth failure from the replica */
  GW_FAIL_LOADING,     /* 503 Loading model */
  GW_FAIL_PROTOCOL,    /* an answer we could not read */
  GW_FAIL_CUT,         /* the connection broke after the answer had begun (reset mid-stream) */
  GW_FAIL_LOCAL,       /* the gateway's own resources (file descriptors...): not the phone */
  GW_FAIL_DOWN,        /* moved off a phone marked down or loading meanwhile (gw_jobs_leave_down_replicas) */
  GW_FAIL_SLOW,        /* moved off a phone whose progress report shows it far slower (job.c jobs_progress) */
  GW_FAIL_COUNT
} gw_fail_kind;

const char *gw_fail_name(gw_fail_kind k);

/* A phone's refusal of a request, as the caller will get it (job.c job_attempt_refused). */
typedef struct gw_refusal {
  int status;              /* the status the caller gets */
  const char *code;        /* our code (static) */
  char replica[128];       /* who refused */
  int contested;           /* a phone without a record (or refusing in a row) refused: if
                              another phone answers, the refusal is charged to it */
  pr_buf body;             /* the OpenAI error body */
} gw_refusal;


/* What an attempt tells its owner, and the only calls upstream.c makes into it: each
 * callback gets the attempt that speaks (its job is a->job), and the owner decides by the
 * attempt's role (gw_attempt_role) what it means; job.c fills the one table. After failed,
 * refused, done, lease_denied, finish or client_stalled the attempt may be gone (its owner
 * freed it). */
#define GW_REFUSED_UNPARSABLE 2
typedef struct gw_attempt gw_attempt;
typedef struct gw_attempt_ops {
  void (*failed)(gw_attempt *a, gw_fail_kind kind, const char *detail);
  /* an answer about the request (verdict.h): final (a 4xx) or ambiguous (a prompt 5xx:
   * a second phone is asked once, neither is charged); status is the HTTP status or an
   * error event's code; ambiguous is GW_REFUSED_UNPARSABLE for a model's output its
   * engine could not read back (verdict.h GW_VERDICT_UNPARSABLE) */
  void (*refused)(gw_attempt *a, int ambiguous, long status, const char *body, size_t len);
  void (*done)(gw_attempt *a);
  /* the Redis lease was refused (full with other gateways' requests): no attempt used */
  void (*lease_denied)(gw_attempt *a);
  void (*finish)(gw_attempt *a, int status);
  /* a streamed answer; these return non-zero once the client is gone. The client's
   * stream begins with the first event or comment */
  int (*stream_event)(gw_attempt *a, const char *payload, size_t len);
  int (*stream_comment)(gw_attempt *a, const char *text, size_t len);
  void (*stream_end)(gw_attempt *a);
  /* a chunk on its way: its id, its text and its reasoning (NULL none), whether it has
   * tool-call deltas; non-zero: the stream's text passed its cap (the phone's failure) */
  int (*note_chunk)(gw_attempt *a, const char *id, const char *text, const char *reasoning, int tool_calls);
  /* 1: the client is behind (pause until gw_attempt_resume), 0, < 0 gone */
  int (*client_behind)(gw_attempt *a);
  /* the whole answer (done follows) */
  void (*respond)(gw_attempt *a, int status, const char *ctype, const char *body, size_t len);
  /* the client stopped reading a stream for send_timeout_s */
  void (*client_stalled)(gw_attempt *a);
  /* the answer's first byte arrived (status known; inside a curl callback: nothing may be
   * cancelled from here). A hedged job decides here which attempt won. NULL: not asked */
  void (*answer_began)(gw_attempt *a);
} gw_attempt_ops;

/* What an attempt is to its job (docs/core.md "A job's attempts"): the running attempt,
 * whose answer is the request's (at most one); a hedge beside it while its first byte is
 * overdue (at most one today: job.c jobs_hedge starts one a request); or an attempt that
 * lost the race, which reports nothing more and waits on the server's deferred-free queue
 * for the end of the loop turn. */
typedef enum {
  GW_ATT_RUNNING = 0,
  GW_ATT_HEDGE,
  GW_ATT_LOST,
} gw_attempt_role;

/* An entry of the server's deferred-free queue (gw_server.defer_head): an attempt to free,
 * or a job to finish, once the current callbacks are over (job.c defer_run, in the loop's
 * check phase), as Redis frees its clients_to_close before it sleeps. Embedded in
 * gw_attempt and gw_job. */
enum { GW_DEFER_ATTEMPT = 1, GW_DEFER_JOB = 2 };
typedef struct gw_defer {
  struct gw_defer *next, *prev;
  unsigned char kind;      /* GW_DEFER_ATTEMPT or GW_DEFER_JOB */
  unsigned char queued;
} gw_defer;

/* An attempt's life: it may wait for its Redis lease, then the request is out until the
 * first byte tells a whole answer from an event stream. It only moves forward
 * (gw_attempt_move in upstream.c); how it ends is its job's business (gw_attempt_ops). */
typedef enum {
  GW_ATT_LEASING = 0, /* asking Redis for a slot lease; nothing sent */
  GW_ATT_SENT,        /* the request is out; no byte back yet */
  GW_ATT_ANSWER,      /* a whole answer (or an error answer) is arriving, buffered */
  GW_ATT_STREAM,      /* a 200 event stream is being relayed */
} gw_attempt_state;

/* One attempt of a job on one replica. Owned by its job, on its list of attempts
 * (gw_job.atts), and freed by it (gw_attempt_free unlinks it) before the job lets go of
 * it: job is never NULL. Its role says what it is to the job (gw_attempt_role). */
struct gw_attempt {
  gw_job *job;
  gw_attempt *next, *prev; /* its job's attempts, in the order they started */
  gw_attempt_role role;
  gw_defer defer;          /* on the deferred-free queue (a lost attempt) */
  const gw_attempt_ops *ops; /* how it reports to its job */
  gw_replica *replica;
  uint64_t lease;
  uint64_t *more_leases;   /* a request of several choices ("n"): the other slots it holds
                              on the same phone (n_more of them) */
  int n_more;
  pr_curlreq xfer;         /* the upstream request (curlreq.h's ownership rule) */
  pr_buf req_body;         /* the body sent upstream */
  pr_buf resp;             /* non-streamed answer, or the error body of a failed stream */
  pr_sse_parser sse;       /* streamed answer, parsed to watch usage and errors */
  long status;             /* upstream HTTP status once known */
  gw_attempt_state state;  /* leasing, sent, answer or stream (gw_attempt_state) */
  int paused;              /* curl is paused for backpressure */
  int got_done;            /* [DONE] seen */
  int stream_error;        /* an error event arrived in the stream (held back) */
  int64_t sent_tokens;     /* chunks with text (content or reasoning) this attempt relayed */
  int64_t pred_cached;     /* prompt tokens the plan expected cached on the phone */
  double pred_share;       /* ...the learned share it was planned on (pcache.h; 1: none) */
  unsigned char reuse;     /* the phone may reuse its prompt cache for it (pcache.h); 0:
                              sent with "cache_prompt": false. Redis's lease answer may
                              clear it (shared.c) */
  unsigned char reuse_was; /* what the body was rendered with */
  uint64_t live_ms;        /* live learning (streams): the last sample's time... */
  int64_t live_tokens;     /* ...and token count */
  int learned_live;
  double prefill_ms;       /* its first token came this soon, sooner than its plan allowed
                              (learn_live): counted at its end on what the engine says it
                              read (0: not so) */
  double pred_slowdown;    /* the slowdown its plan was made with (pred_prefill_s has it) */
  uint64_t start_ms;
  uint64_t cost_ms;        /* its slot time is in the cost ledger up to here (cost.c); 0: none yet */
  uint64_t launch_ms;      /* when the request went out (after the Redis lease, if any) */
  uint64_t first_byte_ms;  /* upstream's first body byte */
  uint64_t last_byte_ms;
  uint64_t heard_ms;        /* the silence watchdog counts from here: the last byte, or a resume */
  uint64_t first_token_ms, last_token_ms; /* a stream's own pace (the silence watchdog) */
  double pred_prefill_s, pred_service_s;
  double worst_s;          /* planned prefill + the request's whole cap: the watchdog's base */
  char errbuf[CURL_ERROR_SIZE];
  int local_errno;         /* the gateway could not open a socket (EMFILE...) */
  /* the slot lease in Redis, when gateways share state (shared.c) */
  char rlease[128];        /* its member name; "" none */
  void *rlease_cmd;        /* the pending ask; NULL when answered */
  int rlease_held;
  uint64_t rlease_renew_ms;
  /* usage and timings learned from the answer */
  int64_t prompt_tokens, completion_tokens, cached_tokens;
  unsigned char cached_known; /* the answer said how many prompt tokens were cached */
  double t_prompt_n, t_prompt_ms, t_pred_n, t_pred_ms;
  /* bounds on the answer (bounds.h): its bytes, the tokens it may carry */
  size_t answer_cap;       /* a whole answer's body, or all of a stream's bytes */
  size_t stream_bytes;     /* a stream's bytes so far */
  int64_t max_out;         /* the cap this attempt was sent (max_tokens, or what is left) */
  int64_t out_bytes, out_chunks; /* generated text relayed, and its chunks (choices) */
  unsigned char cut;       /* why the gateway cut the answer off (upstream.c's GW_CUT_*; 0 not) */
  unsigned char usage_bad; /* a usage count was no finite number >= 0: replaced, to rewrite */
  gw_progress *prog;       /* the agent's latest progress report; NULL: none yet (owned) */
  unsigned char hedge;     /* started as a hedge (job.c jobs_hedge): 1, 2 once it won (the
                              metrics' won and wasted hedges, the hedge budget's share) */
};

/* A job's life. Every move goes through job_move (job.c), which refuses the others:
 *
 *   ADMITTING ──▶ QUEUED ◀──────▶ RUNNING ──▶ STREAMING ◀──▶ RESUMING
 *       │            │              │             │              │
 *       └────────────┴──────────────┴─────┬───────┴──────────────┘
 *                                          ▼
 *                                        DONE
 *
 * RUNNING → QUEUED is a retry (or a refusal checked elsewhere, or a lease refused),
 * STREAMING → RESUMING a broken stream queued to go on on another phone. */
typedef enum {
  GW_JOB_ADMITTING = 0, /* being checked; may wait for Redis's global admission */
  GW_JOB_QUEUED,        /* in the queue, nothing sent to the client yet */
  GW_JOB_RUNNING,       /* an attempt (gw_job_running) is on a replica; nothing sent yet */
  GW_JOB_STREAMING,     /* an attempt is on a replica and the client's stream has begun */
  GW_JOB_RESUMING,      /* its stream broke off: in the queue to go on on another phone */
  GW_JOB_DONE,          /* answered or the client gone: access-logged, its timer closing */
  GW_JOB_STATES
} gw_job_state;

const char *gw_job_state_name(gw_job_state s);
/* Whether from -> to is a legal move (the table job_move checks). */
int gw_job_move_ok(gw_job_state from, gw_job_state to);

struct gw_job {
  gw_server *gw;
  gw_config *conf;         /* a reference: the job finishes on the config it started with */
  gw_job_state state;
  gw_sink sink;            /* where the answer goes; closed once answered or gone */
  char id[128];
  char path[32];           /* "/v1/chat/completions" or "/v1/completions" */
  pr_oai_req oai;
  gw_model *model;         /* its model, held (gw_model_ref) from admission to the end; NULL
                              before job_fit found it */
  int prio;
  int take_free;           /* a batch line: takes a phone free now over a sooner finish later */
  int client_gone;         /* why it ended: the client left (499 when nothing was sent) */
  gw_defer defer;          /* on the deferred-free queue: to finish at the end of this loop turn */
  gw_job *anext, *aprev;   /* all live jobs (gw->jobs) */
  gw_caller *caller;       /* the API key's caller; NULL when the gateway is open */
  int admitted;            /* counted in the caller's in-flight requests */
  void *admit_cmd;         /* a pending global admission in Redis (shared.c) */
  double tag;              /* fair queueing: start tag within its class */
  uint64_t seq;            /* arrival order, for equal tags */
  double ready;            /* shortest work first: arrival (ms) + aging_factor x predicted
                              service (ms); its caller's waiting jobs take the caller's tags
                              in this order (queue.h). 0 for all: arrival order */
  double svc_best;         /* at admission, its shortest service on any usable phone (s; -1:
                              none): short work there is what a kept slot takes wherever it
                              runs (gw_model_short_note) */
  int qfront;              /* linked at the front of its class (a retry), out of tag order */
  gw_job *qprev, *qnext;   /* queue links, while QUEUED or RESUMING */
  uint64_t arrival_ms, deadline_ms, first_dispatch_ms, end_ms, ttfb_ms;
  uint64_t deadline_kept_ms; /* a continuing stream's deadline before its silence limit cut
                                it (job_stream_failed), given back as it starts again (0:
                                none) */
  int attempts;
  int retries_left;
  gw_replica *avoid;       /* the replica that failed last, to prefer others */
  gw_attempt *atts;        /* its attempts (running, hedge, lost), oldest first; read them
                              with gw_job_running, gw_job_hedge, GW_JOB_EACH_ATTEMPT */
  int hedged;              /* a hedge was started (at most one per request) */
  int hedge_wait;          /* its phone failed a health check and the phone that finishes it
                              soonest is busy: a hedge waits for that phone's next slot, ahead
                              of the queue (gw_jobs_hedge, the planning pass) */
  pr_buf sofar;            /* the answer's text relayed so far (streams): its content... */
  pr_buf sofar_reasoning;  /* ...and its reasoning (a thinking model's reasoning_content) */
  int64_t sofar_tokens;    /* their tokens (chunks with text or reasoning) */
  struct gw_resp *resp;     /* a /v1/responses request: its translation (responses.h); NULL
                              for chat and text completions */
  char stream_id[96];      /* the id of the first stream's chunks, kept when continuing */
  int continues;           /* how many times the stream moved to another phone (> 0: the
                              attempts continue the first one's answer) */
  int moved_slow;          /* it left a phone that turned slow (at most once) */
  int no_continue;         /* the answer so far cannot be handed on (a tool-call delta went
                              out, or its text passed sofar's cap): a broken stream ends */
  int timeouts;            /* attempts that timed out before the first byte */
  int continuation_refused; /* the last attempt, continuing a stream, was refused: not
                               charged (upstream.c; job.c job_attempt_failed clears it) */
  int refusals;            /* phones that refused it (job.c job_attempt_refused) */
  struct gw_refusal *held_refusal; /* the first ambiguous refusal, while a second phone
                                      checks it; NULL none (owned) */
  uint64_t recheck_until_ms; /* ...which must start by then, or the refusal stands */
  const char *refused_code; /* why it was refused (a static string; NULL: not refused)... */
  int refused_by_replica;   /* ...by a phone (1) or by the gateway itself (0) */
  int status;              /* what the client got */
  int stream_failed;       /* a started stream ended with an upstream_stream_error event */
  char replica_id[128];    /* last replica that served */
  char *last_error;        /* "replica: detail" of the last failed attempt; NULL none (owned) */
  gw_fail_kind last_fail;
  uint64_t tokens_in, tokens_out;
  uint64_t service_ms;     /* the answering attempt's slot time, its start to its end (0: none) */
  double expected_out;
  uv_timer_t watchdog;     /* the running attempt's watchdog (upstream.c); closed in DONE */
  int64_t cached_tokens;
  int64_t pred_cached;      /* what the answering attempt was planned to find cached (-1: no
                               answer), in the gateway's estimated tokens */
  uint64_t cache_scope;    /* its key's prompt-cache scope (pcache.h), set when it is
                              queued */
  int usage_clamped;       /* a phone's usage was more than the gateway believes (bounds.h) */
  char *waited_for;        /* the busy replica it chose to wait for; NULL none (owned) */
  /* a shadow request (verify.c): no caller receives it, it runs on the phone pin names
   * only (dispatched before each planning pass, never hedged or moved elsewhere), its
   * slot time is verification's in the cost ledger, and its answer is not itself checked */
  int shadow;
  char pin[128];           /* "" any phone */
  uint64_t shadow_scope;   /* the cache scope it is sent under (the checked request's) */
};

/* Two classes (interactive before batch); within a class jobs are ordered by their
 * fair-queueing tag, then arrival. */
typedef struct gw_queue {
  gw_job *head[GW_PRIO_COUNT], *tail[GW_PRIO_COUNT];
  size_t len;
  double vtime[GW_PRIO_COUNT];   /* the tag of the last job dispatched in each class */
  double anon_tag[GW_PRIO_COUNT]; /* last finish tag of the anonymous flow (no api_keys) */
  uint64_t next_seq;
} gw_queue;

/* gw_server's parts: each is written by the module named as its owner; others read it
 * (docs/core.md "Who owns what"). */

/* The process: listeners, signals, reloads, shutdown, descriptors. owner: server.c */
typedef struct gw_server_proc {
  pr_http_server **http;   /* one per listener, each owned here */
  char **http_addr;        /* the address each was opened for */
  size_t n_http;
  pr_http_server **retired; /* listeners dropped by a reload, closing once idle */
  size_t n_retired;
  uv_signal_t sig_hup;
  uv_fs_event_t *dir_watch; /* replicas_dir changes; freed in its close callback */
  char *watched_dir;
  uv_timer_t reload_timer; /* debounce: an editor's save is one reload */
  uv_signal_t sig_term, sig_int;
  uv_timer_t shutdown_timer;
  int handles_closed;      /* gw_server_shutdown closed every handle (once) */
  uv_prepare_t log_flush;  /* writes the turn's log lines before the loop waits */
  uint64_t nofile;         /* the open-files limit (0: none), and the kept-alive phone */
  size_t idle_conns;       /* connections allowed for it now (gw_idle_conn_cap) */
} gw_server_proc;

/* The registry's own bookkeeping (the list itself is gw_server.replicas). owner: registry.c */
typedef struct gw_server_registry {
  size_t cap_replicas;
  pr_idmap ids;            /* the replicas by id */
  gw_refused_log *refused; /* registrations refused lately; NULL: none yet */
  uint64_t seq;            /* the last gw_replica.ident.reg_seq given */
} gw_server_registry;

/* Active health checks. owner: health.c */
typedef struct gw_server_health {
  gw_probe *probes;        /* health checks in flight */
  uv_timer_t timer;        /* the earliest moment in heap */
  uint64_t due_ms;         /* when timer fires; 0: not armed */
  uint64_t first_ms;       /* when the next new replica's first probe may go */
  pr_heap heap;            /* each replica (its health.health_at) by when health.c looks at it
                              next: its next probe, a probe's late moment, its heartbeat's limit */
  uint64_t n_probes;       /* health checks started */
  uint64_t n_visits;       /* replicas the heap woke it for */
} gw_server_health;

/* Enrolment by heartbeat: its budget and the phones' tokens' secret. owner: heartbeat.c */
typedef struct gw_server_enrol {
  double tokens;           /* the enrolment budget */
  char token_secret[256];  /* what phones' tokens are derived from */
  char token_secret_random[65];
  uint64_t ms;
} gw_server_enrol;

/* Answers verified (docs/routing.md "Answers verified"). owner: verify.c upstream.c (a
 * shadow request's slot time) */
typedef struct gw_server_verify {
  struct gw_verify *state; /* records, checks, canaries (verify.c) */
  gw_hedge_ledger ledger;  /* phone work and shadow requests' share (verify.budget) */
  struct {
    uint64_t checks, agreed, disagreed, votes, votes_lost, undecided, quarantines, released;
    uint64_t canaries, canaries_failed, shadows;
    double slot_s;         /* shadow requests' slot-seconds */
  } stats;
} gw_server_verify;

/* Who hears of fleet changes and of ended requests. owner: common.c */
typedef struct gw_server_subs {
  struct {
    gw_fleet_fn fn;
    void *ud;
    unsigned mask;
  } fleet[GW_FLEET_SUBSCRIBERS]; /* gw_fleet_subscribe */
  int n_fleet;
  struct {
    gw_job_ended_fn fn;
    void *ud;
  } jobs[GW_JOB_SUBSCRIBERS]; /* gw_jobs_subscribe */
  int n_jobs;
} gw_server_subs;

struct gw_server {
  uv_loop_t *loop;
  gw_config *conf;
  pr_curlm *curlm;
  gw_replica **replicas;   /* the registry (registry.c writes it, every module reads it) */
  size_t n_replicas;
  struct gw_engprobe *engprobes; /* bare engines' feature probes in flight (engprobe.c) */
  gw_queue queue;
  gw_job *jobs;            /* every live job */
  gw_caller *callers;      /* API keys' runtime state (auth.c) */
  pr_idmap caller_names;   /* the same by key name, and by the key's SHA-256 while it is */
  pr_idmap caller_keys;    /* configured (auth.c) */
  gw_shared *shared;       /* Redis shared state (shared.c); NULL without redis */
  uv_timer_t tick;         /* deadlines, cool-downs, replanning */
  int shutting_down;
  int plan_pending;
  uint64_t plan_passes;    /* planning passes run (job.c: a model's window is worked out once
                              per pass) */
  uv_idle_t plan_idle;     /* runs a planning pass once per loop turn when asked */
  uv_idle_cb plan_cb;      /* the pass (job.c registers it: gw_jobs_init) */
  /* the deferred-free queue (gw_defer): attempts to free and jobs to finish once the
   * current callbacks are over, in the order queued (job.c defer_run) */
  gw_defer *defer_head, *defer_tail;
  gw_hedge_ledger hedge_ledger; /* phone work and hedges' share, for scheduler.hedge_budget */
  size_t hedge_waiting;         /* jobs with hedge_wait set, at most (recounted by each pass) */
  int choices_unsure;           /* a request of several choices waits to learn what its
                                   model's phones serve (job.c job_choices_refused) */
  /* the last planning pass's waiting requests by why they wait (gw_sched_wait): filled by
   * job.c's plan_pass, read by the admin API's queue and fleetgate_queue_waiting */
  struct {
    size_t n[GW_WAIT_COUNT];
    /* phone time idle while requests waited: slots free after the pass (that take work)
     * while requests wait with a free slot they could take (faster_phone,
     * kept_for_short_work, held_back), at most one a request, integrated from pass to pass
     * (gw_idle_while_waiting_s) */
    size_t idle_slots;
    uint64_t idle_since_ms;
    double idle_slot_s;
  } plan_waits;
  uint64_t started_ms;     /* the loop's time when the gateway started */
  uv_check_t reap_check;   /* the deferred-free queue (defer_head) is worked off in the check
                              phase (job.c defer_run)... */
  uv_idle_t reap_idle;     /* ...and the loop does not block while it is not empty */
  size_t jobs_alive;
  uint64_t next_id;
  char id_prefix[16];
  /* counters */
  uint64_t n_requests, n_retries;
  /* Out of descriptors (or memory, or local ports): an attempt that could not open its
   * socket goes back to the queue, and until fd_pressure_until_ms new attempts start only
   * as earlier ones end (fd_credit; the tick adds one probe). See job.c job_wait_for_descriptors. */
  uint64_t fd_pressure_until_ms; /* 0: no pressure */
  int fd_credit;
  gw_models models;        /* every model served or configured, with its queue count,
                              answer lengths, short work and phones (model.h) */
  struct gw_planrec *planrec; /* plans written down (FLEETGATE_RECORD_PLANS, planrec.h); NULL: off */
  struct gw_sched *sched;  /* the planner's memory, kept from plan to plan (scheduler.h); made by
                              gw_jobs_init, freed by gw_server_free */
  int exit_code;
  uint64_t place_pass_ms;  /* placement's last pass (placement.c); 0: none yet */
  /* hooks server.c sets, so the modules below it need not call it by name (docs/core.md) */
  void (*jobs_drained)(gw_server *gw); /* the last job ended while shutting down */
  int (*reload)(gw_server *gw, const char *why, pr_buf *errors, cJSON *changes);
  /* a request reaches the queue (job.c calls it with ended 0): counted in the demand
   * (capsvc.c, which hears of its end as a gw_jobs_subscribe subscriber) */
  void (*job_demand)(gw_server *gw, const gw_job *j, int ended);
  /* a heartbeat relayed by another gateway through Redis (heartbeat.c's) */
  void (*apply_heartbeat)(gw_server *gw, const struct gw_heartbeat_msg *m, int remote,
                          struct gw_heartbeat_result *out);
  struct gw_pins *pins;    /* phones' key pins (pins.c), opened at start */
  struct gw_drains *drains; /* admin drains kept in data_dir (drains.c), opened at start */
  struct gw_place_pins *place_pins; /* operators' placement pins kept in data_dir (placement.c) */
  struct gw_cachescopes *cachescopes; /* what phones' engines may hold (cachescope.c) */
  /* operators' view (admin.c, metrics.c, events.c); each owned here, freed by
   * gw_server_free after the admin listener and its timer closed */
  gw_admin *admin;
  gw_metrics *metrics;
  struct gw_cost *cost;    /* the cost accounting (cost.c) */
  struct gw_batches *batches; /* the Batch API (batch.c); NULL without data_dir */
  /* answers verified (verify.c, docs/routing.md "Answers verified"), wired by server.c:
   * job.c tells it of every caller's answer, batch.c asks it whether a phone is
   * quarantined */
  void (*answered)(gw_server *gw, gw_job *j, const char *replica_id, const char *body, size_t len);
  int (*quarantined)(gw_server *gw, const char *replica_id);
  /* a quarantine or a release decided here, for the other gateways (server.c sets it to
   * gw_shared_publish_verdict; NULL: nobody to tell) */
  void (*verdict)(gw_server *gw, const char *replica_id);
  /* ...and what shared.c reads and applies of them (gw_verify_init sets these to
   * gw_verify_verdict_json, gw_verify_apply_verdict and gw_verify_each_verdict) */
  cJSON *(*verdict_json)(gw_server *gw, const char *replica_id);
  int (*apply_verdict)(gw_server *gw, const char *replica_id, const cJSON *o, const char *from);
  void (*each_verdict)(gw_server *gw, void (*fn)(gw_server *gw, const char *id, void *ud), void *ud);
  struct gw_capsvc *capacity; /* demand, churn, the capacity advice and its hook (capsvc.c) */
  gw_events *events;

  /* the parts, each its module's */
  gw_server_proc proc;     /* server.c */
  gw_server_registry reg;  /* registry.c */
  gw_server_health health; /* health.c */
  gw_server_enrol enrol;   /* heartbeat.c */
  gw_server_verify vfy;    /* verify.c */
  gw_server_subs subs;     /* common.c */
};

/* server.c */
int gw_server_init(gw_server *gw, uv_loop_t *loop, gw_config *conf);
int gw_server_run(gw_server *gw);
void gw_server_shutdown(gw_server *gw);
void gw_server_free(gw_server *gw);
/* Load the config file again and apply it if all of it is valid. Returns 0, or a
 * negative code with the errors in `errors` (when not NULL); fills `changes`. */
int gw_server_reload(gw_server *gw, const char *why, pr_buf *errors, cJSON *changes);
size_t gw_queue_count_model(const gw_server *gw, const char *model);
/* model.c: the models' phone index follows the fleet's events (subscribed first). */
void gw_models_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
/* common.c: fleet changes to their subscribers, in the order they subscribed, each for the
 * kinds in its mask (GW_FLEET_MASK(kind) | ..., or GW_FLEET_ALL). Returns 0, or -ENOSPC. */
int gw_fleet_subscribe(gw_server *gw, unsigned mask, gw_fleet_fn fn, void *ud);
void gw_fleet_publish(gw_server *gw, const gw_fleet_event *ev);
/* common.c: ended requests to their subscribers, in the order they subscribed. Returns 0,
 * or -ENOSPC. */
int gw_jobs_subscribe(gw_server *gw, gw_job_ended_fn fn, void *ud);
void gw_jobs_publish(gw_server *gw, const gw_job_ended *ev);
/* The request's id: the client's x-request-id when it is printable ASCII and short
 * enough, else a new one. */
void gw_request_id(gw_server *gw, const pr_http_req *req, char *out, size_t n);

/* job.c */
/* The job module's loop handles (planning pass, deferred-free queue); closed by gw_jobs_close, each
 * with closed() as its close callback. */
void gw_jobs_init(gw_server *gw);

void gw_jobs_close(gw_server *gw, uv_close_cb closed);
void gw_job_start(gw_server *gw, pr_http_req *req, const char *path);
/* A request that comes from no client connection (a batch line): its body, the route,
 * the key it runs under (NULL: an open gateway), its deadline (loop time) and the sink
 * its answer goes to. It runs in the batch class. */
typedef struct gw_job_line {
  const char *path;        /* "/v1/chat/completions" or "/v1/completions" */
  const char *body;
  size_t len;
  gw_caller *caller;
  uint64_t deadline_ms;
  const char *id;          /* the request id */
  const gw_sink_ops *ops;  /* the sink's calls and their context */
  void *ctx;
  /* a shadow request (verify.c): only on the phone `pin` names, under cache_scope */
  int shadow;
  const char *pin;
  uint64_t cache_scope;
} gw_job_line;
/* Start it: the answer (or an error, perhaps before this returns) reaches the sink once,
 * unless the sink's reader gives up first (gw_sink_gone on the sink returned: the job's,
 * valid while it is open; NULL when it was answered already). The body is read before
 * this returns. */
gw_sink *gw_job_start_line(gw_server *gw, const gw_job_line *l);
/* Ask for a planning pass at the end of this loop turn. */
void gw_plan_soon(gw_server *gw);
/* Answer every live job now (the shutdown deadline). */
void gw_jobs_abandon(gw_server *gw);
void gw_jobs_abandon_shadows(gw_server *gw);
/* Requests on a phone marked down or loading meanwhile (its health checks failed, so it
 * will not answer them either) move to another phone, spending a retry: those waiting for
 * their first byte, and started streams and arriving answers that stopped flowing (a
 * stream goes on with the text so far). Called by the tick. */
void gw_jobs_leave_down_replicas(gw_server *gw, uint64_t now_ms);
/* Requests whose first byte is overdue get a second attempt on a free phone that would
 * finish them sooner, within scheduler.hedge_budget (docs/routing.md "Hedging"). Called by
 * the tick. */
void gw_jobs_hedge(gw_server *gw, uint64_t now_ms);
/* The jobs as a fleet subscriber. A progress report (GW_FLEET_PROGRESS: the `running`
 * array of an agent's status): note each request's progress, learn a pace far below the
 * phone's rates at once, and move a request that would finish much sooner elsewhere
 * (GW_FAIL_SLOW; docs/routing.md "Progress"). A new replica: plan again. */
/* What a request came to (the event every ended job publishes), and the access log's
 * subscription to it. */
void gw_job_outcome(const gw_job *j, uint64_t now, gw_job_ended *ev);
int gw_jobs_subscribe_log(gw_server *gw);
void gw_jobs_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
/* Answer every queued job with an error (shutdown). */
void gw_queue_flush(gw_server *gw, int status, const char *message);
/* Whether the client's stream has begun (STREAMING or RESUMING). */
/* Slot-seconds phones stayed idle while requests waited with a slot free for them, since
 * the gateway started (fleetgate_idle_while_waiting_seconds_total; job.c's passes count). */
static inline double gw_idle_while_waiting_s(const gw_server *gw, uint64_t now) {
  double s = gw->plan_waits.idle_slot_s;
  if (gw->plan_waits.idle_slots && now > gw->plan_waits.idle_since_ms)
    s += (double)gw->plan_waits.idle_slots * (double)(now - gw->plan_waits.idle_since_ms) / 1000.0;
  return s;
}

static inline int gw_job_streamed(const gw_job *j) {
  return j->state == GW_JOB_STREAMING || j->state == GW_JOB_RESUMING;
}

/* A job's attempts (docs/core.md "A job's attempts"): each one, oldest first (a may not be
 * freed inside the loop: walk a->next by hand for that)... */
#define GW_JOB_EACH_ATTEMPT(j, a) for (gw_attempt *a = (j)->atts; a; a = a->next)
/* ...the first in a role; NULL none */
static inline gw_attempt *gw_job_attempt(const gw_job *j, gw_attempt_role role) {
  for (gw_attempt *a = j->atts; a; a = a->next)
    if (a->role == role) return a;
  return NULL;
}
/* ...the running attempt (its answer is the request's), and a hedge beside it */
static inline gw_attempt *gw_job_running(const gw_job *j) { return gw_job_attempt(j, GW_ATT_RUNNING); }
static inline gw_attempt *gw_job_hedge(const gw_job *j) { return gw_job_attempt(j, GW_ATT_HEDGE); }

/* common.c: read one of data_dir's JSON files (capsvc's demand, verify's records, the
 * admin's drains, placement's pins, signed-out sessions): made 0600 first if others could
 * read it (said in a warning), then read whole and parsed with depth. Returns 0 with *out
 * the document, 0 with *out NULL when there is no such file, -EBADMSG when it is not JSON
 * (what the parser said in *err, if not NULL) or not under cap bytes (damaged: the caller
 * says what is lost), -ENOMEM. */
int gw_datafile_load(const char *path, size_t cap, int depth, cJSON **out, pr_json_err *err);

/* common.c: d off the deferred-free queue, if it is on it (its owner is freed or finished
 * now). */
void gw_defer_forget(gw_server *gw, gw_defer *d);

/* upstream.c */
/* 1 for errno values that mean the gateway ran out of its own resources. */
int gw_local_errno(int e);
/* Kept-alive phone connections curl may hold idle, for an open-files limit of nofile and
 * a fleet of `phones`: nofile/64 (4 to 1,024), or one per phone and an eighth more when
 * that is larger, up to nofile/3. A probe or request that finds no connection to its
 * phone opens one (a TLS handshake, on real phones), and libcurl 7.88 looks through every
 * kept connection to close the oldest: a fleet larger than the cap pays both on nearly
 * every probe. */
size_t gw_idle_conn_cap(uint64_t nofile, size_t phones);
/* The same, as connections kept per host: each host (phone) keeps its connections in a
 * cache of its own (proto/curlm.c: libcurl 7.88 walks the whole cache a transfer used
 * when the transfer ends, so one cache for a fleet costs O(phones) a probe), and libcurl's
 * CURLMOPT_MAXCONNECTS caps each cache: gw_idle_conn_cap over the phones, at least 1. */
size_t gw_idle_conn_per_host(uint64_t nofile, size_t phones);
/* Client connections to accept at most for an open-files limit of nofile: each may
 * open a phone connection too, and a reserve stays for everything else (the kept-alive
 * phone connections of gw_idle_conn_cap among it). */
size_t gw_conn_budget(uint64_t nofile, size_t phones);
/* Start an attempt of job on r in role (GW_ATT_RUNNING or GW_ATT_HEDGE): it is on the job's
 * list of attempts before it can report anything, and off it again when this fails.
 * Returns 0 (*out, when not NULL, is the attempt) or a negative code. */
int gw_attempt_start(gw_job *job, const gw_attempt_ops *ops, gw_replica *r, double pred_prefill_s,
                     double pred_service_s, int64_t pred_cached, gw_attempt_role role,
                     gw_attempt **out);
/* a (a hedge) became the job's running attempt: its watchdog counts on from when it was
 * sent. */
void gw_attempt_rearm(gw_attempt *a);
/* Stop the attempt (client gone, watchdog, shutdown): the transfer is cancelled, the
 * slot released. Never call from inside a curl callback. */
void gw_attempt_cancel(gw_attempt *a);
/* Cancel a, take it off its job's list (and off the deferred-free queue) and free it.
 * Never from inside a curl callback: a lost attempt waits for the turn's end (job.c). */
void gw_attempt_free(gw_attempt *a);
/* The Redis lease for a is decided: 1 granted, 0 full elsewhere, -1 Redis failed (go on
 * with the local view). */
void gw_attempt_lease_result(gw_attempt *a, int granted);
/* A global admission answered: ok 1/0, or -1 when Redis failed (decide locally). */
void gw_job_admit_result(gw_job *j, int ok, const char *which, double rpm_tokens,
                         double tpm_tokens);
/* The client drained its output: resume a paused stream. */
void gw_attempt_resume(gw_attempt *a);
/* Whether a's answer is still arriving: a byte came within twice the phone's expected gap
 * between tokens, and at least the last second (a stream on a phone marked down that still
 * flows is left alone: its bytes say more than the probes). */
int gw_attempt_flowing(const gw_attempt *a, uint64_t now_ms);
/* How long a's started stream may stay silent before its watchdog fails it (silence.h):
 * before its first token stream_idle_timeout_s; after, a few times its phone's pace as the
 * planner sees it (or its own, when slower); with cover, extended by the other requests
 * still reading their prompts on the same phone. */
double gw_attempt_silence_s(const gw_attempt *a, uint64_t now, int cover);
/* What an ended transfer's curl code says of the phone: a timeout, an answer that could
 * not be read (protocol), else a failed connection. */
gw_fail_kind gw_attempt_fail_kind(CURLcode rc);

#endif
