/* The simulated phone (`fleetgate-agent --engine sim`): llama-server's HTTP API on one
 * libuv loop, with a phone's timing and a phone's failures.
 *
 * Releases. It answers like the llama-server of August 2026 (b10587) by default, or
 * of February 2025 (--sim-release 2025): refusals (simreq.h), answer and chunk shapes,
 * /props, /slots, /metrics, /v1/models (llsrv.h), "n" > 1, /v1/responses (simresp.h),
 * the context limit (2026: a prompt of n_ctx tokens or more is refused, generation
 * stops at the context; 2025: the prompt is cut and the context shifts), the late 500
 * of an answer its chat parser refuses, and what "cache_prompt": false leaves behind.
 *
 * Timing. A prompt of P tokens (characters / 4 of the rendered prompt, see proto/oai.h,
 * or the token ids of a /v1/completions prompt) of which C are found in the slot's cache
 * takes (P - C) / prefill_tps seconds to read; then one token comes every 1 / decode_tps
 * seconds. Every duration, including --loading-s and the fault plan's at_s and dur_s, is
 * in simulated seconds and is divided by --time-scale to get wall-clock time. `timings`
 * in answers report wall-clock milliseconds, as a client measuring the phone would see
 * them. Each slot runs at the configured rates however many others are busy.
 *
 * Slots. --slots requests run at once (a request with "n": k takes k slots); the rest
 * wait, as in llama-server, and start in arrival order as their slots free up
 * ("id_slot" pins one). A new request takes the idle slot whose tokens share the
 * longest prefix with its prompt (if similar enough, else the least recently used one)
 * and reuses what simcache.h says: the common prefix (--cache-mode full) or up to the
 * newest context checkpoint inside it (hybrid). A client that disconnects frees its
 * slots at once.
 *
 * Faults (--fault-plan FILE, a JSON list of {"at_s", "kind", "dur_s"}; times from the
 * process start):
 *   offline   the listener closes and every connection is reset; listens again after
 *   hang      requests are read and never answered; running ones freeze; a hung request
 *             stays hung (and keeps its slot) until its client gives up
 *   error503  new requests, /health included, get 503 unavailable_error
 *   slow      prefill and decode steps taken in the window are 5x slower (or the
 *             window's "factor")
 *   drop      streams are reset after a few tokens; other completions are reset
 *             instead of answered
 *   fast_timings  answers' timings claim ten times the speed they ran at (a liar)
 *   unparsable    answers ending in the window are b10587's late 500: whole ones a 500,
 *             streams an error event after their tokens
 *
 * Requests are read as llama-server reads them (simreq.h): the ones it refuses get its
 * status and message. A required tool call, response_format and logprobs are answered
 * in its shapes, with the JSON built from the request's schema (simgen.h). */
#include "sim.h"

#include "feat.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "bearer.h"
#include "buf.h"
#include "err.h"
#include "http.h"
#include "json.h"
#include "llsrv.h"
#include "log.h"
#include "oai.h"
#include "hold.h"
#include "isolate.h"
#include "simcache.h"
#include "simgen.h"
#include "simreq.h"
#include "simresp.h"
#include "sse.h"

/* A non-streamed answer holds its whole text; cap it far above any sane cap. */
#define AG_SIM_MAX_ANSWER ((size_t)64 << 20)
/* Small bodies: errors, /props, /slots, chunks. */
#define AG_SIM_MAX_SMALL ((size_t)4 << 20)
/* How much earlier than due a timer may act (uv timers have millisecond resolution). */
#define AG_SIM_SLACK_NS 1000000ull
#define AG_SIM_RELISTEN_MS 50
#define AG_SIM_ID_CHARS 32
/* The id of a tool call's first token (the call's start), in the sim's vocabulary. */
#define AG_SIM_TOOL_START_ID 50

typedef struct ag_slot ag_slot;
typedef struct ag_job ag_job;

typedef enum {
  AG_JOB_DEFERRED, /* in the FIFO, waiting for a slot */
  AG_JOB_PREFILL,  /* on a slot, reading the prompt */
  AG_JOB_DECODE,   /* on a slot, generating */
  AG_JOB_HUNG,     /* never answered (hang fault); on a slot or not */
} ag_job_state;

/* One slot of the phone. Owned by the sim (an array); its timer is closed by
 * ag_sim_stop. */
struct ag_slot {
  ag_sim *sim;
  int id;
  uv_timer_t timer;      /* drives the running job (its first choice's slot only) */
  ag_job *job;           /* the job using it, NULL when idle; the job is the sim's */
  ag_simslot cache;      /* the tokens it read and decoded, its checkpoints; owned */
  uint64_t last_used_ns; /* breaks ties between equally good idle slots */
  ag_llsrv_slot info;    /* what /slots shows about the last task */
};

/* One choice of a job ("n" > 1 gives several), each on a slot of its own as
 * llama-server runs child tasks. Buffers owned by the job. */
typedef struct ag_choice {
  ag_slot *slot;
  int64_t cache_n, prompt_n; /* of the prompt, on its slot */
  double prompt_ms;
  int keep;              /* its slot keeps what it reads (2025 with cache_prompt false: no) */
  pr_buf text;           /* whole answers: the text (reasoning, a call's arguments) */
  pr_buf plan;           /* the JSON a tool call or JSON answer generates */
  size_t plan_pos;       /* bytes of plan generated so far */
  pr_buf lp;             /* whole answers: the logprobs entries so far, comma-separated */
  char tool_id[8 + AG_SIM_ID_CHARS];
  int32_t *gen;          /* the generated tokens' ids, for the slot's cache */
  size_t n_gen_ids, gen_cap;
  unsigned kinds;        /* /v1/responses streams: the item kinds begun ('r', 'c', 'f' bits) */
} ag_choice;

/* One completion request. Owned by the sim's list of live jobs from arrival until its
 * answer ended or its client left (job_end frees it). The HTTP request is borrowed:
 * req is cleared the moment http.c may free it. */
struct ag_job {
  ag_sim *sim;
  pr_http_req *req;
  ag_job *prev, *next;   /* the sim's live jobs */
  ag_job *qnext;         /* the deferred FIFO */
  ag_slot *slot;         /* the first choice's slot, while on one (its timer drives the job) */
  ag_job_state state;
  int in_call;           /* an HTTP call is on the stack: on_abort only clears req */
  int has_oai;
  pr_oai_req oai;        /* the parsed request; owned */
  int chat, resp, stream, include_usage;
  int reasoning;         /* chat text is reasoning_content (a thinking model, not turned off) */
  int cache_prompt, id_slot;
  int iso_on;            /* a gateway named its cache scope: kept apart (isolate.h) */
  uint64_t iso_scope;
  ag_iso_pick iso_pick;
  int iso_read;          /* it was given a slot: the slot holds its prompt */
  int64_t cap;           /* -1: none */
  int64_t n_target;      /* tokens to generate */
  const char *finish;    /* "length", "stop" or "tool_calls" */
  int64_t n_prompt, cache_n, prompt_n, n_gen; /* cache_n and prompt_n: the first choice's */
  double prompt_ms, predicted_ms, step_ms;    /* prompt_ms: the longest choice's */
  ag_simtok *ptok;       /* the prompt's tokens; owned */
  size_t pn;
  size_t *users;         /* where its user messages start; owned */
  size_t nu;
  int nch;
  ag_choice *ch;         /* nch; owned */
  uint64_t due_ns;       /* uv_hrtime() when the next step is due */
  int drop;              /* a drop fault caught this job */
  int64_t drop_after;    /* tokens a dropped stream sends before the reset */
  int started;           /* stream headers sent */
  uint64_t arrived_ns;
  char request_id[AG_REPORT_MAX_REQUEST_ID + 1]; /* the caller's x-request-id, or "" */
  int64_t created;
  char id[16 + AG_SIM_ID_CHARS];
  char rs_id[8 + AG_SIM_ID_CHARS], msg_id[8 + AG_SIM_ID_CHARS]; /* /v1/responses items */
  ag_simreq_shape shape; /* noise words, a tool call or JSON content */
  char *tool_name;       /* the function a tool call calls; owned */
  int top_logprobs;      /* > 0: each token carries logprobs with that many alternatives */
  uint64_t rng;          /* what it generates comes from here: drawn from the prompt under
                            deterministic decoding (job_seed), else from the sim's */
  int fake;              /* a fake fault answered it (faults.h): its plan is the fake text */
};

#define AG_SIM_HELD_MAX 16
#define AG_SIM_SWITCH_POLL_MS 50
enum { AG_SIM_SW_NONE = 0, AG_SIM_SW_DRAINING, AG_SIM_SW_FETCHING, AG_SIM_SW_LOADING, AG_SIM_SW_FAILED };

/* The simulated phone. Owned by whoever called ag_sim_new; ag_sim_free releases it
 * after ag_sim_stop's callback (or before any handle was started). */
struct ag_sim {
  uv_loop_t *loop;
  pr_http_server http;
  char *listen_addr, *model, *id, *token; /* owned copies */
  char *issued;          /* the token the gateway named; NULL: none yet */
  int require_token;
  char *bound_addr;      /* listen_addr with the port actually bound (relisten); owned */
  int n_slots;
  double prefill_tps, decode_tps, time_scale, loading_s;
  int64_t n_ctx;
  int release, thinking;
  ag_simcache_params cache;
  ag_simram ram;         /* the RAM prompt cache (2026); owned */
  ag_iso iso;            /* callers' cache scopes kept apart, as the agent does (isolate.h) */
  ag_fault_plan faults;  /* owned copy */
  ag_slot *slots;        /* n_slots; owned */
  ag_job *jobs;          /* every live job */
  ag_job *q_head, *q_tail;
  size_t n_deferred;
  uv_timer_t fault_timer;    /* wakes at the next fault window edge */
  uv_timer_t relisten_timer; /* retries listening after an offline window */
  uint64_t t0_ns;            /* uv_hrtime() at start: simulated time 0 */
  int64_t start_unix;
  int offline;               /* an offline fault closed the listener */
  unsigned faults_now;       /* what the fault timer last applied */
  uint64_t rng;
  uint64_t next_task;
  ag_llsrv_metrics m;
  int stopping;
  ag_sim_flavour flavour;
  ag_sim_route_fn route;
  void *route_ud;
  int draining;              /* new completions get 503 */
  /* a switch of models (ag_sim_place_set) */
  uv_timer_t switch_timer;   /* looks at the switch every AG_SIM_SWITCH_POLL_MS */
  double model_mb, load_mb_s, fetch_mb_s;
  double storage_free_mb;    /* its simulated models folder's; < 0 unknown */
  char *corrupt_model;       /* owned */
  char held[AG_SIM_HELD_MAX][65]; /* the models it holds on its "disk" */
  size_t n_held;
  int sw_phase;              /* AG_SIM_SW_* */
  char sw_to[65], sw_url[1001], sw_why[320];
  double sw_size_mb, sw_until_s;
  int log_phone;             /* log lines say which phone (cfg->log_phone) */
  ag_rates rates;            /* learnt from the sim's own answers' timings */
  uint64_t n_completions;
  int handles_open;          /* timers not yet closed + 1 for the HTTP server */
  void (*on_stopped)(ag_sim *s, void *ud);
  void *stopped_ud;
};

/* ---- small helpers --------------------------------------------------------------- */

static uint64_t sim_rand(ag_sim *s) { return ag_simgen_rand(&s->rng); }

static char *sim_strdup(const char *p) { return p ? strdup(p) : NULL; }

/* Simulated seconds since start. */
static double sim_now_s(const ag_sim *s) {
  return (double)(uv_hrtime() - s->t0_ns) / 1e9 * s->time_scale;
}

static unsigned sim_faults(const ag_sim *s) { return ag_fault_plan_active(&s->faults, sim_now_s(s)); }

static int sim_loading(const ag_sim *s) { return sim_now_s(s) < s->loading_s; }

static int sim_r26(const ag_sim *s) { return s->release != AG_SIM_RELEASE_2025; }

/* The release whose shapes the answers take (MNN's are reshaped from 2026's). */
static int sim_shapes(const ag_sim *s) {
  return s->flavour == AG_SIM_MNN || sim_r26(s) ? AG_LLSRV_2026 : AG_LLSRV_2025;
}

/* Wall-clock milliseconds that `sim_s` simulated seconds take, under the active faults. */
static double sim_wall_ms(const ag_sim *s, double sim_s) {
  double ms = sim_s * 1000.0 / s->time_scale;
  if (sim_faults(s) & AG_FAULT_BIT(AG_FAULT_FAKE)) ms /= AG_FAULT_FAKE_SPEEDUP; /* no work done */
  return ms * ag_fault_plan_slow_factor(&s->faults, sim_now_s(s));
}

static uint64_t ms_to_ns(double ms) { return (uint64_t)llround(ms * 1e6); }

/* ---- answering --------------------------------------------------------------------- */

static void sim_respond(pr_http_req *req, int status, const char *ctype, const char *body,
                        size_t len, const char *extra_header) {
  const char *headers[3] = {AG_LLSRV_CORS_HEADER, extra_header, NULL};
  pr_http_respond(req, status, headers, ctype, body, len);
}

static void sim_respond_buf(pr_http_req *req, int status, const char *ctype, const pr_buf *body,
                            const char *extra_header) {
  sim_respond(req, status, ctype, pr_buf_cstr(body), body->len, extra_header);
}

/* MNN's error shape: {"error":"<message>"}. */
static int sim_is_mnn(const pr_http_req *req) {
  const ag_sim *s = req->server->ud;
  return s->flavour == AG_SIM_MNN;
}

static int sim_mnn_error(pr_buf *b, const char *msg) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "error", msg);
  char *txt = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  int rc = txt ? pr_buf_append_str(b, txt) : -ENOMEM;
  free(txt);
  return rc;
}

/* An error in the shape llama-server gives errors raised by a handler. */
static void sim_respond_error(pr_http_req *req, int status, const char *type, const char *msg) {
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_ANSWER); /* refusals quote the request */
  if ((sim_is_mnn(req) ? sim_mnn_error(&b, msg) : ag_llsrv_error(&b, status, type, msg)) < 0) pr_buf_reset(&b);
  sim_respond_buf(req, status, AG_LLSRV_JSON_CTYPE, &b, NULL);
  pr_buf_free(&b);
}

/* An error answered before any handler runs (404, loading): the same shape, as both
 * builds write it. */
static void sim_respond_error_early(pr_http_req *req, int status, const char *type,
                                    const char *msg) {
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  if ((sim_is_mnn(req) ? sim_mnn_error(&b, msg) : ag_llsrv_error(&b, status, type, msg)) < 0)
    pr_buf_reset(&b);
  sim_respond_buf(req, status, AG_LLSRV_JSON_CTYPE, &b, NULL);
  pr_buf_free(&b);
}

static void sim_respond_body(pr_http_req *req, int rc, pr_buf *b, const char *ctype,
                             const char *extra_header) {
  if (rc < 0)
    sim_respond_error(req, 500, AG_LLSRV_E_SERVER, pr_strerror(rc));
  else
    sim_respond_buf(req, 200, ctype, b, extra_header);
}

/* Errors the HTTP layer answers itself (malformed request, 413, 431, 408). */
static void sim_http_error(pr_buf *out, const char **ctype, char *header, size_t header_n,
                           int status, const char *message, const char *code,
                           const pr_http_req *req, void *ud) {
  (void)code;
  (void)ud;
  (void)header;
  (void)header_n;
  (void)req;
  ag_llsrv_error(out, status, status >= 500 ? AG_LLSRV_E_SERVER : AG_LLSRV_E_INVALID, message);
  *ctype = AG_LLSRV_JSON_CTYPE;
}

/* ---- jobs -------------------------------------------------------------------------- */

static void sim_dispatch(ag_sim *s);
static void slot_tick(uv_timer_t *t);
static void job_on_abort(pr_http_req *req);

static ag_job *job_new(ag_sim *s, pr_http_req *req) {
  ag_job *j = calloc(1, sizeof(*j));
  if (!j) return NULL;
  j->sim = s;
  j->req = req;
  j->cap = -1;
  j->cache_prompt = 1;
  j->id_slot = -1;
  j->arrived_ns = uv_hrtime();
  ag_report_copy_id(j->request_id, pr_http_header_get(req, "x-request-id"));
  j->next = s->jobs;
  if (s->jobs) s->jobs->prev = j;
  s->jobs = j;
  return j;
}

/* Give the job n choices (their buffers empty). Returns 0 or -ENOMEM. */
static int job_choices(ag_job *j, int n) {
  j->ch = calloc((size_t)n, sizeof(*j->ch));
  if (!j->ch) return -ENOMEM;
  j->nch = n;
  for (int i = 0; i < n; i++) {
    pr_buf_init(&j->ch[i].text, AG_SIM_MAX_ANSWER);
    pr_buf_init(&j->ch[i].plan, AG_SIM_MAX_ANSWER);
    pr_buf_init(&j->ch[i].lp, AG_SIM_MAX_ANSWER);
    j->ch[i].keep = 1;
  }
  return 0;
}

/* Take the job off its slots and out of the FIFO. Each slot keeps what it read and
 * decoded: the prompt and every generated token but the last, which llama-server
 * samples and never feeds back. */
static void job_detach(ag_job *j) {
  ag_sim *s = j->sim;
  for (int i = 0; i < j->nch; i++) {
    ag_choice *c = &j->ch[i];
    ag_slot *slot = c->slot;
    if (!slot) continue;
    if (slot == j->slot) uv_timer_stop(&slot->timer);
    slot->job = NULL;
    slot->last_used_ns = uv_hrtime();
    slot->info.n_decoded = j->n_gen;
    for (size_t k = 0; c->keep && k + 1 < c->n_gen_ids; k++)
      if (ag_simslot_push(&slot->cache, ag_simtok_id(c->gen[k])) < 0) break;
    c->slot = NULL;
  }
  j->slot = NULL;
  if (j->state == AG_JOB_DEFERRED) {
    ag_job **pp = &s->q_head;
    ag_job *prev = NULL;
    while (*pp && *pp != j) {
      prev = *pp;
      pp = &(*pp)->qnext;
    }
    if (*pp) {
      *pp = j->qnext;
      if (s->q_tail == j) s->q_tail = prev;
      s->n_deferred--;
    }
    j->qnext = NULL;
  }
}

/* The job is over (answered, reset or abandoned): free it and give its slots to the
 * waiting requests. The HTTP request must already be answered or gone. */
static void job_end(ag_job *j) {
  ag_sim *s = j->sim;
  pr_http_req_let_go(j->req);
  job_detach(j);
  if (j->iso_on)
    ag_iso_end(&s->iso, j->iso_pick, j->iso_scope, j->oai.blocks, j->oai.n_blocks, j->iso_read);
  if (j->prev) j->prev->next = j->next;
  else s->jobs = j->next;
  if (j->next) j->next->prev = j->prev;
  if (j->has_oai) pr_oai_free(&j->oai);
  for (int i = 0; i < j->nch; i++) {
    pr_buf_free(&j->ch[i].text);
    pr_buf_free(&j->ch[i].plan);
    pr_buf_free(&j->ch[i].lp);
    free(j->ch[i].gen);
  }
  free(j->ch);
  free(j->ptok);
  free(j->users);
  free(j->tool_name);
  free(j);
  sim_dispatch(s);
}

static void job_log(const ag_job *j, const char *outcome) {
  if (!pr_log_enabled(PR_LOG_INFO)) return;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "id", j->id);
  cJSON_AddStringToObject(f, "outcome", outcome);
  if (j->request_id[0]) cJSON_AddStringToObject(f, "request_id", j->request_id);
  cJSON_AddBoolToObject(f, "stream", j->stream);
  cJSON_AddNumberToObject(f, "prompt_tokens", (double)j->n_prompt);
  cJSON_AddNumberToObject(f, "cache_n", (double)j->cache_n);
  cJSON_AddNumberToObject(f, "predicted_n", (double)j->n_gen);
  if (j->nch > 1) cJSON_AddNumberToObject(f, "choices", j->nch);
  cJSON_AddNumberToObject(f, "ms", (double)(uv_hrtime() - j->arrived_ns) / 1e6);
  if (j->sim->log_phone) cJSON_AddStringToObject(f, "phone", j->sim->id);
  pr_log_kv(PR_LOG_INFO, "request", f);
}

/* The client left (or the server reset the connection). http.c frees req after this
 * returns. When an HTTP call of ours is on the stack, its caller ends the job. */
static void job_on_abort(pr_http_req *req) {
  ag_job *j = req->data;
  if (!j) return;
  j->req = NULL;
  if (j->in_call) return;
  job_log(j, "client_gone");
  job_end(j);
}

/* Reset the connection, as a phone that drops off the network would. */
static void job_reset(ag_job *j, const char *why) {
  if (j->req) {
    pr_http_req *req = j->req;
    j->req = NULL;
    req->data = NULL;
    pr_http_abort(req);
  }
  job_log(j, why);
  job_end(j);
}

/* Send stream bytes. Returns 0, or PR_ECLOSED when the client went away meanwhile (the
 * caller then ends the job). Output backpressure is not applied: an answer is bounded
 * by its token count and a phone does not pause generation for a slow reader either. */
static int job_write(ag_job *j, const pr_buf *b) {
  if (!j->req) return PR_ECLOSED;
  j->in_call = 1;
  int rc = 0;
  if (!j->started) {
    const char *headers[] = {AG_LLSRV_CORS_HEADER, "X-Accel-Buffering: no", NULL};
    rc = pr_http_start(j->req, 200, headers, AG_LLSRV_SSE_CTYPE);
    j->started = 1;
  }
  if (rc >= 0 && j->req && b->len) rc = pr_http_write(j->req, b->data, b->len);
  j->in_call = 0;
  if (!j->req) return PR_ECLOSED;
  return rc < 0 ? rc : 0;
}

/* ---- what the answers say ------------------------------------------------------------ */

static void job_answer_ids(const ag_job *j, int index, ag_llsrv_answer *a) {
  memset(a, 0, sizeof(*a));
  a->chat = j->chat;
  a->id = j->id;
  a->created = j->created;
  a->model = j->sim->model;
  a->fingerprint = j->sim->id;
  a->tool_name = j->shape == AG_SIMREQ_TOOL_CALL ? j->tool_name : NULL;
  a->tool_id = j->ch[index].tool_id;
  a->release = sim_shapes(j->sim);
  a->index = index;
  a->reasoning = j->reasoning;
}

static void job_timings(const ag_job *j, int index, ag_llsrv_timings *t) {
  const ag_choice *c = &j->ch[index];
  t->cache_n = c->cache_n;
  t->prompt_n = c->prompt_n;
  t->prompt_ms = c->prompt_ms;
  t->predicted_n = j->n_gen;
  t->predicted_ms = j->predicted_ms;
  if (sim_faults(j->sim) & AG_FAULT_BIT(AG_FAULT_FAST_TIMINGS)) {
    /* a lying phone: its answers claim a speed it does not have */
    t->prompt_ms /= AG_FAULT_FAST_TIMINGS_FACTOR;
    t->predicted_ms /= AG_FAULT_FAST_TIMINGS_FACTOR;
  }
}

/* Give a llama-server shaped answer or chunk MNN's looks: finish_reason "" instead of
 * null, no timings, and (whole answers) usage all zeros. Rewrites json in place. */
static int sim_mnn_reshape(pr_buf *json, int whole) {
  cJSON *root = cJSON_ParseWithLength(json->data ? json->data : "", json->len);
  if (!root) return -ENOMEM;
  cJSON *c;
  cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "choices")) {
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(c, "finish_reason")))
      cJSON_ReplaceItemInObjectCaseSensitive(c, "finish_reason", cJSON_CreateString(""));
  }
  cJSON_DeleteItemFromObjectCaseSensitive(root, "timings");
  cJSON_DeleteItemFromObjectCaseSensitive(root, "system_fingerprint");
  cJSON_DeleteItemFromObjectCaseSensitive(root, "usage");
  if (whole) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", 0);
    cJSON_AddNumberToObject(u, "completion_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", 0);
    cJSON_AddItemToObject(root, "usage", u);
  }
  char *txt = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!txt) return -ENOMEM;
  pr_buf_reset(json);
  int rc = pr_buf_append_str(json, txt);
  free(txt);
  return rc;
}

/* Append one SSE event with a chunk of kind k for choice index. */
static int job_chunk(const ag_job *j, int index, pr_buf *out, ag_llsrv_chunk_kind k, const char *text,
                     const ag_llsrv_timings *t, const char *logprobs) {
  ag_llsrv_answer a;
  pr_buf json;
  job_answer_ids(j, index, &a);
  pr_buf_init(&json, AG_SIM_MAX_SMALL);
  int rc = ag_llsrv_chunk(&json, &a, k, text, j->finish, t, logprobs);
  if (rc == 0 && j->sim->flavour == AG_SIM_MNN) rc = sim_mnn_reshape(&json, 0);
  if (rc == 0) rc = pr_sse_write_data(out, json.data, json.len);
  pr_buf_free(&json);
  return rc;
}

/* A /v1/responses answer as it stands, for choice 0. */
static void job_resp(const ag_job *j, ag_simresp *r, char *call_id) {
  const ag_choice *c = &j->ch[0];
  memset(r, 0, sizeof(*r));
  r->id = j->id;
  r->rs_id = j->rs_id;
  r->msg_id = j->msg_id;
  r->model = j->sim->model;
  r->created = j->created;
  const char *text = pr_buf_cstr(&c->text);
  r->reasoning = j->reasoning ? text : "";
  r->content = j->reasoning || j->shape == AG_SIMREQ_TOOL_CALL ? "" : text;
  if (j->shape == AG_SIMREQ_TOOL_CALL) {
    snprintf(call_id, 8 + AG_SIM_ID_CHARS, "%s", c->tool_id + 5); /* after "call_" */
    r->tool_name = j->tool_name;
    r->call_id = call_id;
    r->arguments = text;
  }
}

/* ---- tokens -------------------------------------------------------------------------- */

/* The next token of choice c: a noise word, or the next piece of its planned JSON. A
 * tool call's first token is its start (the function's name), which has no text: *len
 * is 0. *id is the token's id. */
static const char *job_next_token(ag_job *j, ag_choice *c, size_t *len, int *id) {
  if (j->shape == AG_SIMREQ_TEXT && !j->fake) {
    const char *w = ag_simgen_word(&j->rng, id);
    if (!j->stream && j->n_gen == 0 && w[0] == ' ') w++; /* a whole answer does not start with a space */
    *len = strlen(w);
    return w;
  }
  *len = 0;
  *id = AG_SIM_TOOL_START_ID;
  if ((j->shape == AG_SIMREQ_TOOL_CALL && j->n_gen == 0) || c->plan_pos >= c->plan.len) return "";
  const char *p = c->plan.data + c->plan_pos;
  *len = ag_simgen_token_len(p, c->plan.len - c->plan_pos);
  *id = ag_simgen_token_id(p, *len);
  c->plan_pos += *len;
  return p;
}

/* A whole answer keeps the token, and its logprobs entry (lp, may be empty). A
 * /v1/responses stream keeps its text too: its done events repeat it. */
static int job_keep(ag_choice *c, const char *tok, size_t len, const pr_buf *lp) {
  int rc = pr_buf_append(&c->text, tok, len);
  if (rc == 0 && lp->len && c->lp.len) rc = pr_buf_append_str(&c->lp, ",");
  if (rc == 0 && lp->len) rc = pr_buf_append(&c->lp, lp->data, lp->len);
  return rc;
}

/* A /v1/responses stream: the events of one token (response.created first). */
static int job_send_resp(ag_job *j, ag_choice *c, const char *tok, pr_buf *b) {
  ag_simresp r;
  char call_id[8 + AG_SIM_ID_CHARS];
  job_resp(j, &r, call_id);
  int rc = j->n_gen == 0 ? ag_simresp_ev_start(b, &r) : 0;
  char kind = j->shape == AG_SIMREQ_TOOL_CALL ? (j->n_gen == 0 ? 'f' : 'a') : j->reasoning ? 'r' : 'c';
  unsigned bit = 1u << (kind - 'a');
  if (rc == 0 && (kind == 'f' || tok[0])) rc = ag_simresp_ev_token(b, &r, kind, !(c->kinds & bit), tok);
  c->kinds |= bit;
  return rc;
}

/* A stream sends the token at once; in 2026 a chat choice's first one comes after its
 * role chunk. */
static int job_send(ag_job *j, int index, const char *tok, const pr_buf *lp, pr_buf *b) {
  int rc = 0;
  if (j->resp) return job_send_resp(j, &j->ch[index], tok, b);
  if (j->n_gen == 0 && j->chat && j->sim->flavour != AG_SIM_MNN && sim_shapes(j->sim) == AG_LLSRV_2026)
    rc = job_chunk(j, index, b, AG_LLSRV_CHUNK_ROLE, NULL, NULL, NULL);
  ag_llsrv_chunk_kind k = AG_LLSRV_CHUNK_TEXT;
  if (j->shape == AG_SIMREQ_TOOL_CALL) k = j->n_gen == 0 ? AG_LLSRV_CHUNK_TOOL_START : AG_LLSRV_CHUNK_TOOL_ARGS;
  if (rc == 0) rc = job_chunk(j, index, b, k, tok, NULL, lp->len ? lp->data : NULL);
  return rc;
}

static int choice_note_id(ag_choice *c, int id) {
  if (c->n_gen_ids == c->gen_cap) {
    size_t cap = c->gen_cap ? c->gen_cap * 2 : 64;
    int32_t *g = realloc(c->gen, cap * sizeof(*g));
    if (!g) return -ENOMEM;
    c->gen = g;
    c->gen_cap = cap;
  }
  c->gen[c->n_gen_ids++] = id;
  return 0;
}

/* Emit one generated token of every choice. Returns 0, or a negative code when the job
 * is over. */
static int job_emit(ag_job *j) {
  pr_buf b, lp;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  pr_buf_init(&lp, AG_SIM_MAX_SMALL);
  int rc = 0;
  for (int i = 0; rc == 0 && i < j->nch; i++) {
    ag_choice *c = &j->ch[i];
    char tok[64]; /* a word or a few characters (ag_simgen_token_len) */
    size_t len;
    int id;
    const char *p = job_next_token(j, c, &len, &id);
    if (len >= sizeof(tok)) {
      rc = PR_ETOOLARGE;
      break;
    }
    memcpy(tok, p, len);
    tok[len] = '\0';
    pr_buf_reset(&lp);
    if (j->top_logprobs > 0 && len) rc = ag_simgen_logprob(&lp, tok, len, j->top_logprobs, &j->rng);
    if (rc == 0) rc = choice_note_id(c, id);
    if (rc == 0 && (!j->stream || j->resp)) rc = job_keep(c, tok, len, &lp);
    if (rc == 0 && j->stream) rc = job_send(j, i, tok, &lp, &b);
  }
  if (rc == 0 && j->stream) rc = job_write(j, &b);
  pr_buf_free(&lp);
  pr_buf_free(&b);
  return rc;
}

/* The message of b10587's late 500: its chat parser did not accept the output. */
static void job_unparsable_message(const ag_job *j, char *msg, size_t n) {
  snprintf(msg, n, "The model produced output that does not match the expected %s format",
           j->sim->thinking && j->chat ? "peg-native" : "Content-only");
}

/* A stream's end: each choice's finish (and usage) chunks, then [DONE]; a /v1/responses
 * stream's done events; or, under the unparsable fault, an error event instead. */
static int job_stream_end(ag_job *j, int unparsable, pr_buf *b) {
  ag_llsrv_timings t;
  int rc = 0;
  if (unparsable) {
    /* data: {"error":{"code":500,"message":...,"type":"server_error"}}, and no [DONE] */
    char msg[160];
    pr_buf e;
    job_unparsable_message(j, msg, sizeof(msg));
    pr_buf_init(&e, AG_SIM_MAX_SMALL);
    rc = ag_llsrv_error(&e, 500, AG_LLSRV_E_SERVER, msg);
    if (rc == 0) rc = pr_sse_write_data(b, e.data, e.len);
    pr_buf_free(&e);
    return rc;
  }
  if (j->resp) {
    ag_simresp r;
    char call_id[8 + AG_SIM_ID_CHARS];
    job_resp(j, &r, call_id);
    job_timings(j, 0, &t);
    return ag_simresp_ev_done(b, &r, &t);
  }
  int r26 = sim_shapes(j->sim) == AG_LLSRV_2026;
  for (int i = 0; rc == 0 && i < j->nch; i++) {
    job_timings(j, i, &t);
    /* usage on its own chunk (2026 chats that ask for it), else on the finish chunk */
    int own_usage = j->chat && r26 && j->include_usage;
    rc = job_chunk(j, i, b, AG_LLSRV_CHUNK_FINISH, NULL, own_usage ? NULL : &t, NULL);
    if (rc == 0 && own_usage) rc = job_chunk(j, i, b, AG_LLSRV_CHUNK_USAGE, NULL, &t, NULL);
  }
  if (rc == 0) rc = pr_buf_append_str(b, "data: [DONE]\n\n");
  return rc;
}

/* A whole answer's body: every choice, or the /v1/responses object. */
static int job_whole_body(ag_job *j, pr_buf *b) {
  ag_llsrv_timings t;
  job_timings(j, 0, &t);
  if (j->resp) {
    ag_simresp r;
    char call_id[8 + AG_SIM_ID_CHARS];
    job_resp(j, &r, call_id);
    return ag_simresp_whole(b, &r, &t);
  }
  ag_llsrv_choice *ch = calloc((size_t)j->nch, sizeof(*ch));
  if (!ch) return -ENOMEM;
  for (int i = 0; i < j->nch; i++) {
    ch[i].text = j->ch[i].text.data ? j->ch[i].text.data : "";
    ch[i].len = j->ch[i].text.len;
    ch[i].finish = j->finish;
    ch[i].logprobs = j->top_logprobs > 0 ? pr_buf_cstr(&j->ch[i].lp) : NULL;
    ch[i].tool_id = j->ch[i].tool_id;
  }
  ag_llsrv_answer a;
  job_answer_ids(j, 0, &a);
  int rc = ag_llsrv_answer_body(b, &a, ch, (size_t)j->nch, &t);
  free(ch);
  if (rc == 0 && j->sim->flavour == AG_SIM_MNN) rc = sim_mnn_reshape(b, 1);
  return rc;
}

/* The last token is out: send the end of the answer and end the job. */
static void job_finish(ag_job *j) {
  ag_llsrv_timings t;
  pr_buf b;
  int rc;
  ag_sim *s = j->sim;
  int unparsable = sim_r26(s) && (sim_faults(s) & AG_FAULT_BIT(AG_FAULT_UNPARSABLE));
  job_timings(j, 0, &t);
  ag_rates_observe(&s->rates, (double)t.prompt_n, t.prompt_ms, (double)t.predicted_n, t.predicted_ms);
  pr_buf_init(&b, AG_SIM_MAX_ANSWER);
  if (j->stream) {
    rc = job_stream_end(j, unparsable, &b);
    if (rc == 0) rc = job_write(j, &b);
    if (rc < 0 && j->req) {
      pr_buf_free(&b);
      job_reset(j, "write_failed");
      return;
    }
    if (j->req) {
      pr_http_req *req = pr_http_req_let_go(j->req);
      j->req = NULL;
      pr_http_end(req);
    }
  } else if (unparsable) {
    char msg[160];
    job_unparsable_message(j, msg, sizeof(msg));
    rc = 0;
    if (j->req) {
      pr_http_req *req = pr_http_req_let_go(j->req);
      j->req = NULL;
      sim_respond_error(req, 500, AG_LLSRV_E_SERVER, msg);
    }
  } else {
    rc = job_whole_body(j, &b);
    if (j->req) {
      pr_http_req *req = pr_http_req_let_go(j->req);
      j->req = NULL;
      sim_respond_body(req, rc, &b, AG_LLSRV_JSON_CTYPE, NULL);
    }
  }
  pr_buf_free(&b);
  job_log(j, rc < 0 ? "client_gone" : unparsable ? "unparsable" : j->finish);
  job_end(j);
}

/* ---- slots ----------------------------------------------------------------------------- */

static void slot_arm(ag_slot *slot, uint64_t due_ns) {
  uint64_t now = uv_hrtime();
  uint64_t ms = due_ns > now ? (due_ns - now + 999999) / 1000000 : 0;
  uv_timer_start(&slot->timer, slot_tick, ms, 0);
}

static int slot_busy_count(const ag_sim *s) {
  int n = 0;
  for (int i = 0; i < s->n_slots; i++) n += s->slots[i].job != NULL;
  return n;
}

static ag_simprompt job_prompt(const ag_job *j) {
  ag_simprompt p = {.tok = j->ptok, .n = j->pn, .user_starts = j->users, .n_user = j->nu};
  return p;
}

/* One choice starts on its slot: what the slot reuses, and the prompt read into it
 * (the cache's bookkeeping is done at once; the time it takes is the prefill's). */
static void choice_start(ag_job *j, ag_choice *c, ag_slot *slot) {
  ag_sim *s = j->sim;
  ag_simprompt p = job_prompt(j);
  uint64_t task = s->next_task++;
  c->slot = slot;
  slot->job = j;
  if (!sim_r26(s) && !j->cache_prompt) {
    /* the 2025 build neither reuses nor keeps anything for such a request */
    ag_simslot_clear(&slot->cache);
    c->cache_n = 0;
    c->keep = 0;
  } else {
    c->cache_n = ag_simcache_begin(&slot->cache, &p, j->cache_prompt, &s->cache);
    if (ag_simcache_prefill(&slot->cache, &p, task, &s->cache) < 0) {
      ag_simslot_clear(&slot->cache); /* out of memory: the slot forgets */
      c->keep = 0;
    }
  }
  c->prompt_n = j->n_prompt - c->cache_n;
  c->prompt_ms = sim_wall_ms(s, (double)c->prompt_n / s->prefill_tps);
  slot->info.has_task = 1;
  slot->info.id_task = (int64_t)task;
  slot->info.n_prompt_tokens = j->n_prompt;
  slot->info.n_prompt_tokens_processed = c->prompt_n;
  slot->info.n_prompt_tokens_cache = c->cache_n;
  slot->info.n_predict = j->cap;
  slot->info.stream = j->stream;
  slot->info.n_decoded = 0;
}

/* Put a deferred job on its slots and start reading its prompt. */
static void job_start(ag_job *j, ag_slot *const *slots, int by_lru) {
  ag_sim *s = j->sim;
  ag_simprompt p = job_prompt(j);
  /* llama-server saves the chosen slot to its RAM cache and restores a better prompt
   * from it when it chose the slot by age, or the slot would lose most of what it
   * holds (2026; child slots never) */
  if (sim_r26(s) && s->ram.limit_tokens > 0 &&
      ag_simcache_wants_ram(&slots[0]->cache, &p, j->id_slot >= 0, by_lru, &s->cache))
    (void)ag_simram_swap(&s->ram, &slots[0]->cache, &p);
  double longest = 0;
  for (int i = 0; i < j->nch; i++) {
    choice_start(j, &j->ch[i], slots[i]);
    if (j->ch[i].prompt_ms > longest) longest = j->ch[i].prompt_ms;
  }
  j->state = AG_JOB_PREFILL;
  j->slot = slots[0];
  j->iso_read = 1;
  j->cache_n = j->ch[0].cache_n;
  j->prompt_n = j->ch[0].prompt_n;
  j->prompt_ms = j->ch[0].prompt_ms;
  if ((uint64_t)j->n_prompt > s->m.n_tokens_max) s->m.n_tokens_max = (uint64_t)j->n_prompt;
  j->due_ns = uv_hrtime() + ms_to_ns(longest);
  slot_arm(j->slot, j->due_ns);
}

/* The idle slot llama-server gives j: the one "id_slot" names (NULL while busy); else
 * the one whose tokens share the longest prefix with j's prompt, if that is more than
 * --slot-prompt-similarity of it; else the least recently used (b10587 takes the last
 * of equals, the 2025 build the first). *by_lru says which rule chose it. */
static ag_slot *sim_pick_slot(ag_sim *s, const ag_job *j, int *by_lru) {
  *by_lru = 0;
  /* b10587 takes an id past its slots modulo their count (server-context.cpp,
   * get_slot_by_id); the 2025 build waits forever for one: the sim ignores it there */
  if (j->id_slot >= 0 && (j->id_slot < s->n_slots || sim_r26(s))) {
    ag_slot *slot = &s->slots[j->id_slot % s->n_slots];
    return slot->job ? NULL : slot;
  }
  ag_slot *similar = NULL, *lru = NULL;
  double best = 0;
  for (int i = 0; i < s->n_slots; i++) {
    ag_slot *slot = &s->slots[i];
    if (slot->job) continue;
    if (slot->cache.n > 0 && j->pn > 0) {
      double f = (double)ag_simtok_lcp(slot->cache.tok, slot->cache.n, j->ptok, j->pn) / (double)j->pn;
      if (f > best && f > s->cache.slot_similarity) {
        best = f;
        similar = slot;
      }
    }
    if (!lru || slot->last_used_ns < lru->last_used_ns ||
        (sim_r26(s) && slot->last_used_ns == lru->last_used_ns))
      lru = slot;
  }
  if (similar) return similar;
  *by_lru = lru != NULL;
  return lru;
}

/* The slots j needs now: its own, then (n > 1) the first other idle ones, as
 * llama-server gives child tasks. Returns 1 with slots filled, 0 when j must wait. */
static int sim_place(ag_sim *s, const ag_job *j, ag_slot **slots, int *by_lru) {
  slots[0] = sim_pick_slot(s, j, by_lru);
  if (!slots[0]) return 0;
  int k = 1;
  for (int i = 0; i < s->n_slots && k < j->nch; i++)
    if (!s->slots[i].job && &s->slots[i] != slots[0]) slots[k++] = &s->slots[i];
  return k == j->nch;
}

/* Start deferred jobs, in arrival order, as their slots free up (one waiting for a
 * pinned or for several slots does not hold up the others). Arms timers only; never
 * answers, so it is safe to call from any callback, on_abort included. */
static void sim_dispatch(ag_sim *s) {
  ag_job *prev = NULL;
  for (ag_job *j = s->q_head, *next; j && !s->stopping; j = next) {
    next = j->qnext;
    ag_slot *one[1], **slots = j->nch > 1 ? calloc((size_t)j->nch, sizeof(*slots)) : one;
    int by_lru = 0;
    if (slots && sim_place(s, j, slots, &by_lru)) {
      if (prev) prev->qnext = next;
      else s->q_head = next;
      if (s->q_tail == j) s->q_tail = prev;
      j->qnext = NULL;
      s->n_deferred--;
      job_start(j, slots, by_lru);
    } else {
      prev = j;
    }
    if (slots != one) free(slots);
  }
  s->m.requests_deferred = s->n_deferred;
  s->m.requests_processing = (uint64_t)slot_busy_count(s);
}

static void sim_enqueue(ag_sim *s, ag_job *j) {
  j->state = AG_JOB_DEFERRED;
  if (s->q_tail) s->q_tail->qnext = j;
  else s->q_head = j;
  s->q_tail = j;
  s->n_deferred++;
  sim_dispatch(s);
}

/* The first choice's slot timer: the prompt has been read, or tokens are due. */
static void slot_tick(uv_timer_t *t) {
  ag_slot *slot = t->data;
  ag_job *j = slot->job;
  ag_sim *s = slot->sim;
  if (!j || j->slot != slot || s->stopping) return;
  unsigned faults = sim_faults(s);
  if (faults & AG_FAULT_BIT(AG_FAULT_HANG)) {
    j->state = AG_JOB_HUNG; /* frozen until the client gives up; keeps the slot */
    return;
  }
  if ((faults & AG_FAULT_BIT(AG_FAULT_DROP)) && !j->drop) {
    j->drop = 1;
    j->drop_after = j->n_gen + 1 + (int64_t)(sim_rand(s) % 4);
  }
  if (j->drop && !j->stream) {
    job_reset(j, "dropped");
    return;
  }
  uint64_t now = uv_hrtime();
  if (j->due_ns > now + AG_SIM_SLACK_NS) {
    slot_arm(slot, j->due_ns);
    return;
  }
  if (j->state == AG_JOB_PREFILL) {
    for (int i = 0; i < j->nch; i++) {
      s->m.prompt_tokens_total += (uint64_t)j->ch[i].prompt_n;
      s->m.prompt_tokens_cached_total += (uint64_t)j->ch[i].cache_n;
      s->m.prompt_seconds_total += j->ch[i].prompt_ms / 1000.0;
    }
    s->m.n_decode_total++;
    s->m.n_busy_slots_total += (uint64_t)slot_busy_count(s);
    j->state = AG_JOB_DECODE;
    j->step_ms = sim_wall_ms(s, 1.0 / s->decode_tps);
    j->due_ns += ms_to_ns(j->step_ms);
    slot_arm(slot, j->due_ns);
    return;
  }
  while (j->due_ns <= now + AG_SIM_SLACK_NS) {
    if (job_emit(j) < 0) {
      if (j->req) {
        job_reset(j, "write_failed");
      } else {
        job_log(j, "client_gone");
        job_end(j);
      }
      return;
    }
    j->n_gen++;
    j->predicted_ms += j->step_ms;
    for (int i = 0; i < j->nch; i++) j->ch[i].slot->info.n_decoded = j->n_gen;
    s->m.tokens_predicted_total += (uint64_t)j->nch;
    s->m.tokens_predicted_seconds_total += j->step_ms / 1000.0 * j->nch;
    s->m.n_decode_total++;
    s->m.n_busy_slots_total += (uint64_t)slot_busy_count(s);
    if (j->drop && (j->n_gen >= j->drop_after || j->n_gen >= j->n_target)) {
      job_reset(j, "dropped");
      return;
    }
    if (j->n_gen >= j->n_target) {
      job_finish(j);
      return;
    }
    j->step_ms = sim_wall_ms(s, 1.0 / s->decode_tps);
    j->due_ns += ms_to_ns(j->step_ms);
  }
  slot_arm(slot, j->due_ns);
}

/* ---- endpoints --------------------------------------------------------------------- */

/* prefix and AG_SIM_ID_CHARS random letters and digits: llama-server names
 * completions and chat completions alike ("chatcmpl-"), tool calls "call_". */
static void sim_gen_id(ag_sim *s, const char *prefix, char *out, size_t n) {
  static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  char rnd[AG_SIM_ID_CHARS + 1];
  for (int i = 0; i < AG_SIM_ID_CHARS; i++) rnd[i] = alnum[sim_rand(s) % (sizeof(alnum) - 1)];
  rnd[AG_SIM_ID_CHARS] = '\0';
  snprintf(out, n, "%s%s", prefix, rnd);
}

/* The prompt of token ids, and the user turns its message_delimiters (each a list of
 * token ids, the sim's stand-in for llama-server's delimiter strings) mark in it. */
static int job_token_prompt(ag_job *j, const cJSON *ids, const cJSON *delims) {
  const cJSON *t;
  size_t n = (size_t)cJSON_GetArraySize(ids), k = 0;
  j->ptok = calloc(n ? n : 1, sizeof(*j->ptok));
  if (!j->ptok) return -ENOMEM;
  cJSON_ArrayForEach(t, ids) j->ptok[k++] = ag_simtok_id((int64_t)t->valuedouble);
  j->pn = k;
  if (!delims) return 0;
  /* llama-server's split(): at each position the first delimiter that matches */
  for (size_t i = 0; i < j->pn; i++) {
    const cJSON *d;
    cJSON_ArrayForEach(d, delims) {
      const cJSON *seq = cJSON_GetObjectItemCaseSensitive(d, "delimiter"), *role = cJSON_GetObjectItemCaseSensitive(d, "role");
      int len = cJSON_IsArray(seq) ? cJSON_GetArraySize(seq) : 0, m = 0;
      if (len == 0 || i + (size_t)len > j->pn) continue;
      cJSON_ArrayForEach(t, seq) {
        if (!cJSON_IsNumber(t) || j->ptok[i + (size_t)m].a != (uint64_t)(int64_t)t->valuedouble) break;
        m++;
      }
      if (m != len) continue;
      if (cJSON_IsString(role) && strcmp(role->valuestring, "user") == 0) {
        size_t *u = realloc(j->users, (j->nu + 1) * sizeof(*u));
        if (!u) return -ENOMEM;
        j->users = u;
        j->users[j->nu++] = i;
      }
      break;
    }
  }
  return 0;
}

/* A text prompt's tokens (four code points each), and where text's user delimiters
 * start: "<|im_start|>user" for a chat (the ChatML the sim renders), a completion's
 * message_delimiters strings otherwise. */
static int job_text_prompt(ag_job *j, const cJSON *delims) {
  const pr_buf *p = &j->oai.prompt;
  const char *text = p->data ? p->data : "";
  if (ag_simtok_text(text, p->len, &j->ptok, &j->pn) < 0) return -ENOMEM;
  for (size_t off = 0; off < p->len; off++) {
    const char *found = NULL;
    const cJSON *d;
    if (j->chat) {
      if (strncmp(text + off, "<|im_start|>user", 16) == 0) found = "user";
    } else {
      cJSON_ArrayForEach(d, delims) {
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(d, "delimiter");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(d, "role");
        size_t len = cJSON_IsString(str) ? strlen(str->valuestring) : 0;
        if (len == 0 || len > p->len - off || memcmp(text + off, str->valuestring, len) != 0) continue;
        found = cJSON_IsString(role) ? role->valuestring : "";
        break;
      }
    }
    if (!found || strcmp(found, "user") != 0) continue;
    size_t pos = ag_simtok_pos(text, off);
    if (j->nu && j->users[j->nu - 1] == pos) continue;
    size_t *u = realloc(j->users, (j->nu + 1) * sizeof(*u));
    if (!u) return -ENOMEM;
    j->users = u;
    j->users[j->nu++] = pos;
  }
  return 0;
}

/* Where what j generates comes from. Under deterministic decoding ("temperature": 0, which
 * is greedy, or a "seed" with any other temperature) a real engine running one GGUF answers
 * the same prompt with the same text, whatever its threads: the stream is drawn from a
 * digest of the model, the prompt (messages or prompt, tools, response_format) and, when
 * sampling, the seed. A substitute fault is another model: another digest. Otherwise the
 * sim's own stream. */
static void job_seed(ag_job *j, const cJSON *root) {
  ag_sim *s = j->sim;
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "temperature");
  const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
  int greedy = cJSON_IsNumber(t) && t->valuedouble <= 0;
  int seeded = cJSON_IsNumber(seed) && seed->valuedouble >= 0;
  j->rng = sim_rand(s);
  if (!greedy && !seeded) return;
  static const char *const keys[] = {"messages", "prompt", "input", "tools", "response_format", NULL};
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned mdlen = 0;
  int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
           EVP_DigestUpdate(ctx, s->model, strlen(s->model) + 1) == 1;
  if (ok && (sim_faults(s) & AG_FAULT_BIT(AG_FAULT_SUBSTITUTE)))
    ok = EVP_DigestUpdate(ctx, "substitute", 11) == 1; /* another model's weights */
  for (int i = 0; ok && keys[i]; i++) {
    char *txt = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(root, keys[i]));
    ok = EVP_DigestUpdate(ctx, keys[i], strlen(keys[i]) + 1) == 1 &&
         (!txt || EVP_DigestUpdate(ctx, txt, strlen(txt) + 1) == 1);
    free(txt);
  }
  if (ok && !greedy) {
    char num[32];
    snprintf(num, sizeof(num), "seed %.0f", seed->valuedouble);
    ok = EVP_DigestUpdate(ctx, num, strlen(num)) == 1;
  }
  if (ok) ok = EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen >= 8;
  EVP_MD_CTX_free(ctx);
  if (!ok) return; /* out of memory: the sim's own stream */
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | md[i];
  j->rng = v ? v : 1;
}

/* A fake fault's answer (faults.h): its text, or a few random words, planned as a JSON
 * answer's text is, for every choice. Text answers only. Returns 0 or -ENOMEM. */
static int job_fake_plan(ag_job *j) {
  ag_sim *s = j->sim;
  const ag_fault *f = ag_fault_plan_fake(&s->faults, sim_now_s(s));
  if (!f || j->shape != AG_SIMREQ_TEXT || s->flavour == AG_SIM_MNN) return 0;
  j->fake = 1;
  pr_buf *plan = &j->ch[0].plan;
  int rc = 0;
  if (f->random) {
    int n = 3 + (int)(sim_rand(s) % 6);
    for (int i = 0; rc == 0 && i < n; i++) {
      const char *w = ag_simgen_word(&s->rng, NULL);
      rc = pr_buf_append_str(plan, i == 0 && w[0] == ' ' ? w + 1 : w);
    }
  } else {
    rc = pr_buf_append_str(plan, f->text);
  }
  for (int i = 1; rc == 0 && i < j->nch; i++) rc = pr_buf_append(&j->ch[i].plan, plan->data, plan->len);
  return rc;
}

/* What the request asks of the answer, read as llama-server reads it. Returns 0, or 1
 * when the request was refused (answered here, the job not queued). The MNN flavour
 * refuses the same requests as the 2025 build, in its own error shape, and answers all
 * others with text: MNN's server has no tool calls, JSON mode or logprobs. */
static int job_read(ag_job *j, const cJSON *root, const char *body, size_t len, ag_simreq *sr) {
  ag_sim *s = j->sim;
  ag_simreq_refusal ref;
  ag_simreq_refusal_init(&ref);
  ag_simreq_opts opts = {.release = s->flavour == AG_SIM_MNN ? AG_SIMREQ_2025 : s->release,
                         .n_parallel = s->n_slots, .stream_tools = s->flavour == AG_SIM_MNN};
  int rc = ag_simreq_read(root, body, len, j->chat, &opts, sr, &ref);
  if (rc == 0) rc = job_choices(j, s->flavour == AG_SIM_MNN || j->resp ? 1 : sr->n);
  if (rc == 0 && s->flavour != AG_SIM_MNN) {
    /* what the answer will say is decided now, while the request's schema exists */
    j->shape = sr->shape;
    j->top_logprobs = sr->top_logprobs;
    j->cache_prompt = sr->cache_prompt;
    j->id_slot = sr->id_slot;
    j->reasoning = s->thinking && j->chat && sr->thinking != 0 && sr->shape == AG_SIMREQ_TEXT;
    if (sr->shape == AG_SIMREQ_TOOL_CALL && !(j->tool_name = strdup(sr->tool_name))) rc = -ENOMEM;
    if (rc == 0 && sr->shape != AG_SIMREQ_TEXT) rc = ag_simgen_value(&j->ch[0].plan, sr->schema, &j->rng);
    for (int i = 0; rc == 0 && i < j->nch; i++) {
      sim_gen_id(s, "call_", j->ch[i].tool_id, sizeof(j->ch[i].tool_id));
      /* every choice of a call or JSON answer says the same */
      if (i > 0) rc = pr_buf_append(&j->ch[i].plan, j->ch[0].plan.data, j->ch[0].plan.len);
    }
  }
  if (rc > 0) sim_respond_error(j->req, ref.status, ref.type, pr_buf_cstr(&ref.message));
  else if (rc < 0) sim_respond_error(j->req, 500, AG_LLSRV_E_SERVER, pr_strerror(rc));
  ag_simreq_refusal_free(&ref);
  return rc != 0;
}

/* Tokens a tool call or JSON answer takes in full (a call's start is one), or 0 for
 * noise text, whose length is chosen instead. */
static int64_t job_planned_tokens(const ag_job *j) {
  if (j->shape == AG_SIMREQ_TEXT && j->fake) return ag_simgen_count_tokens(j->ch[0].plan.data, j->ch[0].plan.len);
  if (j->shape == AG_SIMREQ_TEXT) return 0;
  return (j->shape == AG_SIMREQ_TOOL_CALL) + ag_simgen_count_tokens(j->ch[0].plan.data, j->ch[0].plan.len);
}

/* The body pr_oai_parse is to read, when it is not the one that came: llama-server
 * takes bodies without "model" (the served model is filled in), and a prompt of token
 * ids (the sim reads it itself; pr_oai_parse sees an empty one). Returns a malloc'd
 * copy, or NULL when none is needed. */
static char *sim_patch_body(ag_sim *s, cJSON *root, int token_prompt, size_t *len) {
  if (!cJSON_IsObject(root)) return NULL;
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
  int model = !(cJSON_IsString(m) && m->valuestring[0]);
  if (!model && !token_prompt) return NULL;
  if (model) {
    cJSON_DeleteItemFromObjectCaseSensitive(root, "model");
    if (!cJSON_AddStringToObject(root, "model", s->model)) return NULL;
  }
  if (token_prompt) cJSON_ReplaceItemInObjectCaseSensitive(root, "prompt", cJSON_CreateString(""));
  char *txt = cJSON_PrintUnformatted(root);
  if (txt) *len = strlen(txt);
  return txt;
}

/* How many tokens the job writes and why it stops: a tool call or JSON ends when its JSON
 * does (unless the cap or the context cuts it), text at the cap, or without one at a
 * pseudo-random length. b10587 stops at the end of the slot's context ("length"); the
 * 2025 build shifts the context and goes on. */
static void job_plan_length(ag_job *j) {
  ag_sim *s = j->sim;
  int64_t planned = job_planned_tokens(j);
  int64_t room = sim_r26(s) ? s->n_ctx - j->n_prompt : INT64_MAX;
  if (room < 1) room = 1;
  if (planned > 0) {
    j->n_target = planned;
    j->finish = j->shape == AG_SIMREQ_TOOL_CALL ? "tool_calls" : "stop";
  } else if (j->cap > 0) {
    j->n_target = j->cap;
    j->finish = "length";
  } else {
    j->n_target = 16 + (int64_t)(ag_simgen_rand(&j->rng) % 49);
    j->finish = "stop";
  }
  if (j->cap > 0 && j->cap < j->n_target) {
    j->n_target = j->cap;
    j->finish = "length";
  }
  if (j->n_target > room) {
    j->n_target = room;
    j->finish = "length";
  }
}

/* The 2025 build cuts a prompt that fills the context: it keeps the last part, whole
 * halves of the context dropped from the front (n_keep 0), and goes on. */
static void job_truncate_2025(ag_job *j, int64_t n_ctx) {
  int64_t block = n_ctx / 2;
  if ((int64_t)j->pn < n_ctx || block < 1) return;
  size_t cut = (size_t)(((int64_t)j->pn - block) / block * block);
  memmove(j->ptok, j->ptok + cut, (j->pn - cut) * sizeof(*j->ptok));
  j->pn -= cut;
  size_t k = 0;
  for (size_t i = 0; i < j->nu; i++)
    if (j->users[i] >= cut) j->users[k++] = j->users[i] - cut;
  j->nu = k;
}

/* Refused as llama-server refuses it, or not parsed by the sim's own parser: answered
 * here (1), or 0 to go on with j->oai filled, or a negative code (answered too). */
static int job_parse(ag_job *j, cJSON *root, const char *body, size_t len) {
  ag_sim *s = j->sim;
  ag_simreq sr;
  job_seed(j, root);
  if (job_read(j, root, body, len, &sr)) return 1;
  if (job_fake_plan(j) < 0) {
    sim_respond_error(j->req, 500, AG_LLSRV_E_SERVER, "out of memory");
    return 1;
  }
  const cJSON *ids = sr.token_ids;
  cJSON *delims = sr.delimiters ? cJSON_Duplicate(sr.delimiters, 1) : NULL;
  cJSON *id_copy = ids ? cJSON_Duplicate(ids, 1) : NULL;
  size_t plen = 0;
  char *patched = sim_patch_body(s, root, ids != NULL, &plen);
  pr_oai_error oerr;
  memset(&oerr, 0, sizeof(oerr));
  int rc = pr_oai_parse(&j->oai, j->chat ? PR_OAI_CHAT : PR_OAI_COMPLETION, patched ? patched : body,
                        patched ? plen : len, &oerr);
  free(patched);
  if (rc < 0) {
    cJSON_Delete(delims);
    cJSON_Delete(id_copy);
    sim_respond_error(j->req, oerr.status ? oerr.status : 400,
                      oerr.status >= 500 ? AG_LLSRV_E_SERVER : AG_LLSRV_E_INVALID, oerr.message);
    return 1;
  }
  j->has_oai = 1;
  rc = id_copy ? job_token_prompt(j, id_copy, delims) : job_text_prompt(j, delims);
  cJSON_Delete(delims);
  cJSON_Delete(id_copy);
  if (rc < 0) {
    sim_respond_error(j->req, 500, AG_LLSRV_E_SERVER, "out of memory");
    return 1;
  }
  return 0;
}

/* 2026: a prompt as long as the context or longer is refused (400, plain JSON even for
 * a stream); MNN's flavour refuses one longer than it. Returns 1 when refused. */
static int job_too_long(ag_job *j) {
  ag_sim *s = j->sim;
  int mnn = s->flavour == AG_SIM_MNN;
  if (!sim_r26(s) && !mnn) {
    job_truncate_2025(j, s->n_ctx);
    j->n_prompt = j->pn > 0 ? (int64_t)j->pn : 1;
    return 0;
  }
  if (mnn ? j->n_prompt <= s->n_ctx : j->n_prompt < s->n_ctx) return 0;
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  ag_llsrv_error_context(&b, j->n_prompt, s->n_ctx);
  pr_http_req *req = j->req;
  j->req = NULL;
  job_log(j, "exceeds_context");
  job_end(j);
  sim_respond_buf(req, 400, AG_LLSRV_JSON_CTYPE, &b, NULL);
  pr_buf_free(&b);
  return 1;
}

/* A completion, chat completion (chat) or, on b10587, Responses request (resp: its
 * body converted to a chat's first). */
static void sim_completion(ag_sim *s, pr_http_req *req, int chat, int resp) {
  const char *body = req->body.data ? req->body.data : "";
  size_t len = req->body.len;
  s->n_completions++;
  if (s->draining || s->sw_phase == AG_SIM_SW_DRAINING || s->sw_phase == AG_SIM_SW_FETCHING) {
    static const char hdr[] = "Retry-After: 5";
    pr_buf b;
    pr_buf_init(&b, AG_SIM_MAX_SMALL);
    if (pr_oai_error_body(&b, "this replica is draining: it finishes running requests and takes no new ones",
                          "unavailable_error", NULL, "draining") < 0)
      pr_buf_reset(&b);
    sim_respond_buf(req, 503, AG_LLSRV_JSON_CTYPE, &b, hdr);
    pr_buf_free(&b);
    return;
  }
  pr_json_err jerr;
  memset(&jerr, 0, sizeof(jerr));
  cJSON *root = pr_json_parse(body, len, 0, &jerr);
  if (!root) {
    /* llama-server answers malformed JSON with nlohmann::json's exception text. */
    char msg[600];
    size_t k = 0;
    while (k < len && (body[k] == ' ' || body[k] == '\t' || body[k] == '\n' || body[k] == '\r')) k++;
    if (k == len)
      snprintf(msg, sizeof(msg), "[json.exception.parse_error.101] parse error at line 1, column 1: attempting "
               "to parse an empty input; check that your input string or stream contains the expected JSON");
    else
      snprintf(msg, sizeof(msg),
               "[json.exception.parse_error.101] parse error at line %d, column %d: syntax error "
               "while parsing value - %s", jerr.line, jerr.col, jerr.msg);
    sim_respond_error(req, 500, AG_LLSRV_E_SERVER, msg);
    return;
  }
  char *converted = NULL;
  if (resp) {
    cJSON *c = NULL;
    ag_simreq_refusal ref;
    ag_simreq_refusal_init(&ref);
    int rc = ag_simresp_to_chat(root, &c, &ref);
    if (rc > 0) sim_respond_error(req, ref.status, ref.type, pr_buf_cstr(&ref.message));
    else if (rc < 0) sim_respond_error(req, 500, AG_LLSRV_E_SERVER, pr_strerror(rc));
    ag_simreq_refusal_free(&ref);
    cJSON_Delete(root);
    root = c;
    converted = c ? cJSON_PrintUnformatted(c) : NULL;
    if (!root || !converted) {
      if (root && !converted) sim_respond_error(req, 500, AG_LLSRV_E_SERVER, "out of memory");
      cJSON_Delete(root);
      free(converted);
      return;
    }
    body = converted;
    len = strlen(converted);
  }
  ag_job *j = job_new(s, req);
  if (!j) {
    cJSON_Delete(root);
    free(converted);
    sim_respond_error(req, 500, AG_LLSRV_E_SERVER, "out of memory");
    return;
  }
  j->chat = chat || resp;
  j->resp = resp;
  int refused = job_parse(j, root, body, len);
  cJSON_Delete(root);
  free(converted);
  if (refused) {
    j->req = NULL;
    job_end(j);
    return;
  }
  j->stream = j->oai.stream;
  j->include_usage = j->oai.stream && j->oai.include_usage && s->flavour != AG_SIM_MNN;
  j->cap = s->flavour == AG_SIM_MNN ? -1 : j->oai.max_tokens; /* MNN ignores the cap */
  j->n_prompt = j->pn > 0 ? (int64_t)j->pn : 1;
  j->created = (int64_t)time(NULL);
  sim_gen_id(s, resp ? "resp_" : "chatcmpl-", j->id, sizeof(j->id));
  sim_gen_id(s, "rs_", j->rs_id, sizeof(j->rs_id));
  sim_gen_id(s, "msg_", j->msg_id, sizeof(j->msg_id));
  if (job_too_long(j)) return;
  job_plan_length(j);
  if (sim_faults(s) & AG_FAULT_BIT(AG_FAULT_DROP)) {
    j->drop = 1;
    j->drop_after = 1 + (int64_t)(sim_rand(s) % 4);
    if (!j->stream) {
      job_reset(j, "dropped");
      return;
    }
  }
  /* a gateway named the caller's cache scope: the slot and the reuse are the agent's
   * choice, not the caller's (docs/security.md "Tenants' prompts") */
  const char *scope = pr_http_header_get(req, "x-fleetgate-cache-scope");
  if (scope && j->nch == 1 && s->flavour != AG_SIM_MNN) {
    j->iso_on = 1;
    j->iso_scope = ag_iso_scope_of(scope);
    j->iso_pick = ag_iso_start(&s->iso, j->iso_scope, j->oai.blocks, j->oai.n_blocks);
    j->id_slot = j->iso_pick.slot;
    j->cache_prompt = j->cache_prompt && j->iso_pick.reuse;
  }
  req->data = j;
  req->on_abort = job_on_abort;
  sim_enqueue(s, j);
}

static void sim_props(ag_sim *s, pr_http_req *req) {
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  char build[64];
  snprintf(build, sizeof(build), "b0-fleetgate-sim-%s", FLEETGATE_VERSION);
  int rc = ag_llsrv_props(&b, sim_shapes(s), s->model, s->n_ctx, s->n_slots, build);
  sim_respond_body(req, rc, &b, AG_LLSRV_JSON_CTYPE, NULL);
  pr_buf_free(&b);
}

static int query_flag(const char *query, const char *name) {
  size_t n = strlen(name);
  for (const char *p = query; p && *p;) {
    if (strncmp(p, name, n) == 0 && p[n] == '=') return p[n + 1] == '1' || strncmp(p + n + 1, "true", 4) == 0;
    p = strchr(p, '&');
    if (p) p++;
  }
  return 0;
}

/* Prompt tokens a job's first choice has computed so far: a prefill advances evenly
 * over its duration (llama-server advances a batch at a time). */
static int64_t job_prompt_processed(const ag_job *j, uint64_t now_ns) {
  if (j->state != AG_JOB_PREFILL) return j->prompt_n;
  if (!(j->prompt_ms > 0) || j->prompt_n <= 0) return 0;
  uint64_t total = ms_to_ns(j->prompt_ms);
  uint64_t left = j->due_ns > now_ns ? j->due_ns - now_ns : 0;
  if (left >= total) return 0;
  return (int64_t)((double)j->prompt_n * (double)(total - left) / (double)total);
}

static void sim_slots(ag_sim *s, pr_http_req *req) {
  if (query_flag(req->query, "fail_on_no_slot") && slot_busy_count(s) == s->n_slots) {
    sim_respond_error(req, 503, AG_LLSRV_E_UNAVAILABLE, "no slot available");
    return;
  }
  ag_llsrv_slot *info = calloc((size_t)s->n_slots, sizeof(*info));
  if (!info) {
    sim_respond_error(req, 500, AG_LLSRV_E_SERVER, "out of memory");
    return;
  }
  for (int i = 0; i < s->n_slots; i++) {
    info[i] = s->slots[i].info;
    info[i].id = i;
    info[i].n_ctx = s->n_ctx;
    info[i].is_processing = s->slots[i].job != NULL;
    if (s->slots[i].job && s->slots[i].job->slot == &s->slots[i])
      info[i].n_prompt_tokens_processed = job_prompt_processed(s->slots[i].job, uv_hrtime());
  }
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  int rc = ag_llsrv_slots(&b, sim_shapes(s), info, (size_t)s->n_slots);
  free(info);
  sim_respond_body(req, rc, &b, AG_LLSRV_JSON_CTYPE, NULL);
  pr_buf_free(&b);
}

static void sim_metrics(ag_sim *s, pr_http_req *req) {
  pr_buf b;
  char hdr[64];
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  s->m.release = sim_shapes(s);
  s->m.requests_deferred = s->n_deferred;
  s->m.requests_processing = (uint64_t)slot_busy_count(s);
  s->m.kv_cache_tokens = 0;
  for (int i = 0; i < s->n_slots; i++) s->m.kv_cache_tokens += s->slots[i].cache.n;
  int rc = ag_llsrv_metrics_text(&b, &s->m);
  snprintf(hdr, sizeof(hdr), "Process-Start-Time-Unix: %" PRId64, s->start_unix);
  sim_respond_body(req, rc, &b, AG_LLSRV_METRICS_CTYPE, hdr);
  pr_buf_free(&b);
}

static void sim_models(ag_sim *s, pr_http_req *req) {
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  int rc = ag_llsrv_models(&b, sim_shapes(s), s->model, s->n_ctx, s->start_unix);
  sim_respond_body(req, rc, &b, AG_LLSRV_JSON_CTYPE, NULL);
  pr_buf_free(&b);
}

/* Embeddings: this phone serves none. b10587 says so (501); the 2025 build, its model's
 * pooling being "none", refuses the OpenAI endpoint with a 400. */
static void sim_embeddings(ag_sim *s, pr_http_req *req, int oai) {
  if (sim_r26(s))
    sim_respond_error(req, 501, AG_LLSRV_E_NOT_SUPPORTED,
                      "This server does not support embeddings. Start it with `--embeddings`");
  else if (oai)
    sim_respond_error(req, 400, AG_LLSRV_E_INVALID,
                      "Pooling type 'none' is not OAI compatible. Please use a different pooling type");
  else
    sim_respond_error_early(req, 404, AG_LLSRV_E_NOT_FOUND, "File Not Found");
}

/* The one bearer rule (proto/bearer.h): "Authorization: Bearer <token>", constant time. */
static int sim_authorized(const ag_sim *s, const pr_http_req *req) {
  const char *h = pr_http_header_get(req, "Authorization");
  /* once the gateway has named this phone's own token, only that one opens it: a
   * configured token may be shared by every phone of a deployment */
  if (s->issued) return pr_bearer_check(h, s->issued) == 0;
  if (s->token) return pr_bearer_check(h, s->token) == 0;
  return !s->require_token;
}

int ag_sim_set_issued_token(ag_sim *s, const char *token) {
  char *t = token ? strdup(token) : NULL;
  if (token && !t) return -ENOMEM;
  free(s->issued);
  s->issued = t;
  return 0;
}

/* A request that the hang fault swallows: kept until its client gives up. */
static void sim_hang(ag_sim *s, pr_http_req *req) {
  ag_job *j = job_new(s, req);
  if (!j) {
    pr_http_abort(req);
    return;
  }
  snprintf(j->id, sizeof(j->id), "hung");
  j->state = AG_JOB_HUNG;
  req->data = j;
  req->on_abort = job_on_abort;
  job_log(j, "hung"); /* when it came; a second line says when its client gave up */
}

static int is_path(const char *path, const char *a, const char *b) {
  return strcmp(path, a) == 0 || (b && strcmp(path, b) == 0);
}

static void sim_on_request(pr_http_req *req, void *ud) {
  ag_sim *s = ud;
  int get = strcmp(req->method, "GET") == 0, post = strcmp(req->method, "POST") == 0;
  int mnn = s->flavour == AG_SIM_MNN;
  int health = !mnn && get && is_path(req->path, "/health", "/v1/health");
  unsigned faults = sim_faults(s);
  pr_debug("%s %s", req->method, req->url);

  if (faults & AG_FAULT_BIT(AG_FAULT_HANG)) {
    sim_hang(s, req);
    return;
  }
  if (!health && !sim_authorized(s, req)) {
    sim_respond_error(req, 401, AG_LLSRV_E_AUTH, "Invalid API Key");
    return;
  }
  if (s->route && s->route(req, s->route_ud)) return;
  if (sim_loading(s)) {
    sim_respond_error_early(req, 503, AG_LLSRV_E_UNAVAILABLE, "Loading model");
    return;
  }
  if (faults & AG_FAULT_BIT(AG_FAULT_ERROR503)) {
    sim_respond_error(req, 503, AG_LLSRV_E_UNAVAILABLE, "Service Unavailable");
    return;
  }
  if (health) {
    static const char ok[] = "{\"status\":\"ok\"}";
    sim_respond(req, 200, AG_LLSRV_JSON_CTYPE, ok, sizeof(ok) - 1, NULL);
  } else if (mnn && !is_path(req->path, "/v1/models", "/v1/chat/completions") &&
             !is_path(req->path, "/v1/completions", NULL)) {
    sim_respond(req, 404, AG_LLSRV_JSON_CTYPE, "{\"error\":\"Not Found\"}", 21, NULL);
  } else if (get && is_path(req->path, "/props", NULL)) {
    sim_props(s, req);
  } else if (get && is_path(req->path, "/slots", NULL)) {
    sim_slots(s, req);
  } else if (get && is_path(req->path, "/metrics", NULL)) {
    sim_metrics(s, req);
  } else if (get && is_path(req->path, "/v1/models", "/models")) {
    sim_models(s, req);
  } else if (post && is_path(req->path, "/v1/chat/completions", "/chat/completions")) {
    sim_completion(s, req, 1, 0);
  } else if (post && is_path(req->path, "/v1/completions", "/completions")) {
    sim_completion(s, req, 0, 0);
  } else if (post && !mnn && sim_r26(s) && is_path(req->path, "/v1/responses", "/responses")) {
    sim_completion(s, req, 1, 1);
  } else if (post && !mnn && is_path(req->path, "/v1/embeddings", NULL)) {
    sim_embeddings(s, req, 1);
  } else if (post && !mnn && is_path(req->path, "/embeddings", "/embedding")) {
    sim_embeddings(s, req, 0);
  } else {
    sim_respond_error_early(req, 404, AG_LLSRV_E_NOT_FOUND, "File Not Found");
  }
}

/* ---- faults over time ------------------------------------------------------------- */

/* An info line about the phone itself, naming it when several share the log. */
static void sim_log_info(const ag_sim *s, const char *msg) {
  if (!pr_log_enabled(PR_LOG_INFO)) return;
  cJSON *f = NULL;
  if (s->log_phone && (f = cJSON_CreateObject())) cJSON_AddStringToObject(f, "phone", s->id);
  pr_log_kv(PR_LOG_INFO, msg, f);
}

static void sim_relisten_cb(uv_timer_t *t) {
  ag_sim *s = t->data;
  if (s->stopping || !s->offline) return;
  if (sim_faults(s) & AG_FAULT_BIT(AG_FAULT_OFFLINE)) return; /* the fault timer will call */
  int rc = pr_http_server_listen(&s->http, s->bound_addr);
  if (rc < 0) {
    pr_debug("listen again on %s: %s", s->bound_addr, pr_strerror(rc));
    uv_timer_start(&s->relisten_timer, sim_relisten_cb, AG_SIM_RELISTEN_MS, 0);
    return;
  }
  s->offline = 0;
  char msg[300];
  snprintf(msg, sizeof(msg), "fault offline ended: listening again on %s", s->bound_addr);
  sim_log_info(s, msg);
}

static void sim_fault_cb(uv_timer_t *t);

static void sim_fault_arm(ag_sim *s) {
  double now = sim_now_s(s);
  double next = ag_fault_plan_next_change(&s->faults, now);
  if (next < 0) return;
  double ms = (next - now) * 1000.0 / s->time_scale;
  uv_timer_start(&s->fault_timer, sim_fault_cb, (uint64_t)ceil(ms < 0 ? 0 : ms), 0);
}

static void sim_fault_cb(uv_timer_t *t) {
  ag_sim *s = t->data;
  if (s->stopping) return;
  unsigned now = sim_faults(s);
  for (int k = 0; k < AG_FAULT__COUNT; k++) {
    unsigned bit = AG_FAULT_BIT(k);
    if ((now & bit) != (s->faults_now & bit)) {
      char msg[64];
      snprintf(msg, sizeof(msg), "fault %s %s", ag_fault_kind_name((ag_fault_kind)k), (now & bit) ? "begins" : "ends");
      sim_log_info(s, msg);
    }
  }
  s->faults_now = now;
  if ((now & AG_FAULT_BIT(AG_FAULT_OFFLINE)) && !s->offline) {
    s->offline = 1;
    uv_timer_stop(&s->relisten_timer);
    pr_http_server_stop_listening(&s->http);
    pr_http_server_reset_all(&s->http); /* on_abort ends every job */
  } else if (!(now & AG_FAULT_BIT(AG_FAULT_OFFLINE)) && s->offline) {
    sim_relisten_cb(&s->relisten_timer);
  }
  sim_fault_arm(s);
}

/* ---- life cycle ------------------------------------------------------------------ */

void ag_sim_config_default(ag_sim_config *c) {
  ag_simcache_params p;
  ag_simcache_params_default(&p);
  memset(c, 0, sizeof(*c));
  c->slots = 1;
  c->prefill_tps = 100.0;
  c->decode_tps = 10.0;
  c->n_ctx = 4096;
  c->time_scale = 1.0;
  c->storage_free_mb = -1;
  c->release = AG_SIM_RELEASE_2026;
  c->cache_mode = AG_SIMCACHE_FULL;
  c->ctx_checkpoints = p.ctx_checkpoints;
  c->checkpoint_min_step = p.checkpoint_min_step;
  c->cache_ram = -1;
}

int ag_sim_config_check(const ag_sim_config *c, char *err, size_t errn) {
  const char *msg = NULL;
  if (!c->listen || !*c->listen) msg = "--listen HOST:PORT is required";
  else if (!c->model || !*c->model) msg = "--model NAME is required";
  else if (c->slots < 1 || c->slots > 1024) msg = "--slots must be between 1 and 1024";
  else if (!(c->prefill_tps > 0) || !isfinite(c->prefill_tps)) msg = "--prefill-tps must be > 0";
  else if (!(c->decode_tps > 0) || !isfinite(c->decode_tps)) msg = "--decode-tps must be > 0";
  else if (c->n_ctx < 1 || c->n_ctx > INT32_MAX) msg = "--n-ctx must be between 1 and 2^31-1";
  else if (!(c->time_scale > 0) || !isfinite(c->time_scale)) msg = "--time-scale must be > 0";
  else if (!(c->loading_s >= 0) || !isfinite(c->loading_s)) msg = "--loading-s must be >= 0";
  else if (c->release != AG_SIM_RELEASE_2025 && c->release != AG_SIM_RELEASE_2026)
    msg = "--sim-release must be 2025 or 2026";
  else if (c->cache_mode == AG_SIMCACHE_HYBRID && c->release == AG_SIM_RELEASE_2025)
    msg = "--cache-mode hybrid needs --sim-release 2026 (the 2025 build cannot load a hybrid model)";
  else if (c->cache_mode == AG_SIMCACHE_HYBRID && c->flavour == AG_SIM_MNN)
    msg = "--cache-mode hybrid is llama-server's (not with --flavour mnn)";
  else if (c->ctx_checkpoints < 0 || c->ctx_checkpoints > 1024) msg = "--ctx-checkpoints must be between 0 and 1024";
  else if (c->checkpoint_min_step < 0 || c->checkpoint_min_step > INT32_MAX)
    msg = "--checkpoint-min-step must be between 0 and 2^31-1";
  else if (c->cache_ram < -1 || c->cache_ram > ((int64_t)1 << 40)) msg = "--cache-ram must be between 0 and 2^40 tokens";
  if (!msg) return 0;
  snprintf(err, errn, "%s", msg);
  return -EINVAL;
}

int ag_sim_new(ag_sim **out, uv_loop_t *loop, const ag_sim_config *cfg) {
  *out = NULL;
  ag_sim *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  s->loop = loop;
  s->listen_addr = sim_strdup(cfg->listen);
  s->model = sim_strdup(cfg->model);
  s->id = sim_strdup(cfg->id);
  s->token = cfg->token && *cfg->token ? sim_strdup(cfg->token) : NULL;
  s->require_token = cfg->require_token;
  s->slots = calloc((size_t)(cfg->slots > 0 ? cfg->slots : 1), sizeof(*s->slots));
  if (!s->listen_addr || !s->model || (cfg->id && !s->id) || (cfg->token && *cfg->token && !s->token) ||
      !s->slots || ag_fault_plan_copy(&s->faults, cfg->faults) < 0) {
    ag_sim_free(s);
    return -ENOMEM;
  }
  s->n_slots = cfg->flavour == AG_SIM_MNN ? 1 : cfg->slots; /* MNN serialises requests */
  s->flavour = cfg->flavour;
  s->route = cfg->route;
  s->route_ud = cfg->route_ud;
  s->log_phone = cfg->log_phone;
  ag_rates_init(&s->rates);
  ag_rates_seed(&s->rates, cfg->prefill_tps * cfg->time_scale, cfg->decode_tps * cfg->time_scale);
  s->prefill_tps = cfg->prefill_tps;
  s->decode_tps = cfg->decode_tps;
  s->time_scale = cfg->time_scale;
  s->loading_s = cfg->loading_s;
  s->n_ctx = cfg->n_ctx;
  s->release = cfg->release == AG_SIM_RELEASE_2025 ? AG_SIM_RELEASE_2025 : AG_SIM_RELEASE_2026;
  s->thinking = cfg->thinking;
  ag_simcache_params_default(&s->cache);
  s->cache.mode = cfg->cache_mode;
  s->cache.ctx_checkpoints = cfg->ctx_checkpoints;
  s->cache.checkpoint_min_step = cfg->checkpoint_min_step;
  s->ram.limit_tokens = cfg->cache_ram >= 0 ? cfg->cache_ram
                        : cfg->cache_mode == AG_SIMCACHE_HYBRID ? AG_SIM_CACHE_RAM_TOKENS : 0;
  /* slots named only where no RAM cache holds every caller's prompts; a fresh engine */
  if (ag_iso_init(&s->iso, s->ram.limit_tokens > 0 ? AG_ISO_ENGINE : AG_ISO_SLOTS, s->n_slots, 1) < 0) {
    ag_sim_free(s);
    return -ENOMEM;
  }
  s->rng = cfg->seed ? cfg->seed : (uint64_t)time(NULL) ^ (uv_hrtime() << 16) ^ 0x9E3779B97F4A7C15ull;
  if (!s->rng) s->rng = 1;
  s->t0_ns = uv_hrtime();
  s->start_unix = (int64_t)time(NULL);

  pr_http_server_init(&s->http, loop, sim_on_request, s);
  s->http.server_name = "llama.cpp";
  s->http.error_fn = sim_http_error;
  /* cpp-httplib's keep-alive policy, which llama-server keeps: a connection idle for
   * 5 s is closed, and none serves more than 100 requests. Clients that pool
   * connections must cope with both on a real phone, so the sim does the same. */
  s->http.limits.idle_timeout_ms = 5000;
  s->http.limits.max_requests_per_conn = 100;
  for (int i = 0; i < s->n_slots; i++) {
    s->slots[i].sim = s;
    s->slots[i].id = i;
    uv_timer_init(loop, &s->slots[i].timer);
    s->slots[i].timer.data = &s->slots[i];
  }
  uv_timer_init(loop, &s->fault_timer);
  uv_timer_init(loop, &s->relisten_timer);
  uv_timer_init(loop, &s->switch_timer);
  s->fault_timer.data = s;
  s->relisten_timer.data = s;
  s->switch_timer.data = s;
  s->handles_open = s->n_slots + 3 + 1;
  s->model_mb = cfg->model_mb;
  s->load_mb_s = cfg->load_mb_s > 0 ? cfg->load_mb_s : 200;
  s->fetch_mb_s = cfg->fetch_mb_s > 0 ? cfg->fetch_mb_s : 20;
  s->storage_free_mb = cfg->storage_free_mb;
  if (cfg->corrupt_model && !(s->corrupt_model = strdup(cfg->corrupt_model))) {
    ag_sim_free(s);
    return -ENOMEM;
  }
  snprintf(s->held[0], sizeof(s->held[0]), "%s", s->model);
  s->n_held = 1;
  *out = s;
  return 0;
}

/* "HOST:PORT" with the port replaced by the one bound. */
static char *sim_addr_with_port(const char *addr, int port) {
  const char *colon = strrchr(addr, ':');
  size_t hl = colon ? (size_t)(colon - addr) : 0;
  size_t n = hl + 8;
  char *out = malloc(n);
  if (out) snprintf(out, n, "%.*s:%d", (int)hl, addr, port);
  return out;
}

int ag_sim_listen(ag_sim *s) {
  int rc = pr_http_server_listen(&s->http, s->listen_addr);
  if (rc < 0) return rc;
  int port = pr_http_server_port(&s->http);
  s->bound_addr = sim_addr_with_port(s->listen_addr, port);
  if (!s->id) {
    char id[32];
    snprintf(id, sizeof(id), "sim-%d", port);
    s->id = strdup(id);
  }
  if (!s->bound_addr || !s->id) return -ENOMEM;
  s->t0_ns = uv_hrtime();
  /* Apply what is active at time 0 (a plan may start offline) and arm the next edge. */
  uv_timer_start(&s->fault_timer, sim_fault_cb, 0, 0);
  return 0;
}

int ag_sim_port(ag_sim *s) { return pr_http_server_port(&s->http); }

void ag_sim_get_stats(const ag_sim *s, ag_sim_stats *st) {
  memset(st, 0, sizeof(*st));
  st->slots = s->n_slots;
  st->busy = slot_busy_count(s);
  st->deferred = (int)s->n_deferred;
  st->n_ctx = s->n_ctx;
  st->model = s->model;
  unsigned f = sim_faults(s);
  st->loading = sim_loading(s);
  st->down = (f & (AG_FAULT_BIT(AG_FAULT_ERROR503) | AG_FAULT_BIT(AG_FAULT_HANG) | AG_FAULT_BIT(AG_FAULT_OFFLINE))) != 0;
  st->rates = s->rates;
  st->requests = s->n_completions;
  st->storage_free_mb = s->storage_free_mb;
  st->cache_isolation = s->flavour == AG_SIM_MNN ? NULL : ag_iso_mode_name(s->iso.mode);
  /* b10587's features (feat.h), as the probes find them on the real one; the 2025 build's
   * none; MNN's none (the agent fronting MNN asks nothing) */
  st->build = "b0-fleetgate-sim-" FLEETGATE_VERSION;
  int r26 = s->flavour != AG_SIM_MNN && sim_r26(s);
  st->features = r26 ? PR_FEAT_ALL : 0;
  if (s->n_slots < 2) st->features &= ~(unsigned)PR_FEAT_CHOICES;
  /* what the agent's probe finds on b10587 serving a hybrid model (its checkpoints) */
  if (r26 && s->cache.mode == AG_SIMCACHE_HYBRID && s->cache.ctx_checkpoints > 0)
    st->features |= PR_FEAT_CHECKPOINTS;
  st->choices_max = r26 && s->n_slots > 1 ? s->n_slots : 1;
}

size_t ag_sim_running(const ag_sim *s, ag_running *out, size_t cap) {
  uint64_t now = uv_hrtime();
  size_t n = 0;
  for (int i = 0; i < s->n_slots && n < cap; i++) {
    const ag_job *j = s->slots[i].job;
    if (!j || j->slot != &s->slots[i] || (j->state != AG_JOB_PREFILL && j->state != AG_JOB_DECODE)) continue;
    ag_running *run = &out[n++];
    memcpy(run->request_id, j->request_id, sizeof(run->request_id));
    run->prompt_tokens = j->n_prompt;
    run->prompt_done = j->cache_n + job_prompt_processed(j, now);
    run->decoded = j->n_gen;
    run->prefill_tps = j->prompt_n > 0 && j->prompt_ms > 0 ? (double)j->prompt_n * 1000.0 / j->prompt_ms : -1;
    run->decode_tps = j->state == AG_JOB_DECODE && j->step_ms > 0 ? 1000.0 / j->step_ms : -1;
  }
  return n;
}

void ag_sim_set_draining(ag_sim *s, int draining) { s->draining = draining; }

/* ---- switching models (placement) ----------------------------------------------------- */

static int sim_holds(const ag_sim *s, const char *model) {
  for (size_t i = 0; i < s->n_held; i++)
    if (strcmp(s->held[i], model) == 0) return 1;
  return 0;
}

static void sim_switch_fail(ag_sim *s, const char *fmt, const char *arg) {
  snprintf(s->sw_why, sizeof(s->sw_why), fmt, arg);
  s->sw_phase = AG_SIM_SW_FAILED;
  uv_timer_stop(&s->switch_timer);
  pr_warn("%s%s%sswitch to %s failed: %s; it stays on %s", s->log_phone ? "phone " : "",
          s->log_phone ? s->id : "", s->log_phone ? ": " : "", s->sw_to, s->sw_why, s->model);
}

static void sim_switch_load(ag_sim *s) {
  double factor = s->model_mb > 0 && s->sw_size_mb > 0 ? s->model_mb / s->sw_size_mb : 1;
  char *name = strdup(s->sw_to);
  if (!name) {
    sim_switch_fail(s, "%s", "out of memory");
    return;
  }
  pr_info("%s%s%sloads %s (was %s): %.0f MiB at %.0f MiB/s", s->log_phone ? "phone " : "",
          s->log_phone ? s->id : "", s->log_phone ? ": " : "", name, s->model, s->sw_size_mb, s->load_mb_s);
  free(s->model);
  s->model = name;
  s->prefill_tps *= factor;
  s->decode_tps *= factor;
  ag_rates_init(&s->rates);
  ag_rates_seed(&s->rates, s->prefill_tps * s->time_scale, s->decode_tps * s->time_scale);
  if (s->sw_size_mb > 0) s->model_mb = s->sw_size_mb;
  s->loading_s = sim_now_s(s) + (s->sw_size_mb > 0 ? s->sw_size_mb / s->load_mb_s : 0);
  s->sw_phase = AG_SIM_SW_LOADING;
}

static void sim_switch_cb(uv_timer_t *t) {
  ag_sim *s = t->data;
  double now = sim_now_s(s);
  switch (s->sw_phase) {
    case AG_SIM_SW_DRAINING:
      if (slot_busy_count(s) > 0 || s->n_deferred > 0) return; /* running requests finish */
      if (sim_holds(s, s->sw_to)) {
        sim_switch_load(s);
      } else if (!s->sw_url[0]) {
        sim_switch_fail(s, "it does not hold %s and the gateway gave no url to download it from", s->sw_to);
      } else {
        s->sw_phase = AG_SIM_SW_FETCHING;
        s->sw_until_s = now + (s->sw_size_mb > 0 ? s->sw_size_mb / s->fetch_mb_s : 0);
      }
      return;
    case AG_SIM_SW_FETCHING:
      if (now < s->sw_until_s) return;
      if (s->corrupt_model && strcmp(s->corrupt_model, s->sw_to) == 0) {
        sim_switch_fail(s, "the download of %s does not have the catalogue's SHA-256: thrown away", s->sw_to);
        return;
      }
      if (s->n_held < AG_SIM_HELD_MAX) snprintf(s->held[s->n_held++], sizeof(s->held[0]), "%s", s->sw_to);
      if (s->storage_free_mb >= 0) /* the file takes its room */
        s->storage_free_mb = s->storage_free_mb > s->sw_size_mb ? floor(s->storage_free_mb - s->sw_size_mb) : 0;
      sim_switch_load(s);
      return;
    case AG_SIM_SW_LOADING:
      if (sim_loading(s)) return;
      pr_info("%s%s%snow serves %s", s->log_phone ? "phone " : "", s->log_phone ? s->id : "",
              s->log_phone ? ": " : "", s->model);
      s->sw_phase = AG_SIM_SW_NONE;
      uv_timer_stop(&s->switch_timer);
      return;
    default:
      uv_timer_stop(&s->switch_timer);
  }
}

void ag_sim_place_set(ag_sim *s, const ag_sim_place *p) {
  if (s->stopping) return;
  if (!p) {
    /* the gateway asks nothing (any longer): a failure was heard; a drain not begun to
     * load is given up */
    if (s->sw_phase == AG_SIM_SW_FAILED || s->sw_phase == AG_SIM_SW_DRAINING ||
        s->sw_phase == AG_SIM_SW_FETCHING) {
      s->sw_phase = AG_SIM_SW_NONE;
      uv_timer_stop(&s->switch_timer);
    }
    return;
  }
  if (s->sw_phase == AG_SIM_SW_LOADING) return; /* one at a time */
  if (s->sw_phase != AG_SIM_SW_NONE && strcmp(s->sw_to, p->model) == 0) return;
  if (s->sw_phase == AG_SIM_SW_NONE && strcmp(s->model, p->model) == 0) return;
  snprintf(s->sw_to, sizeof(s->sw_to), "%s", p->model);
  snprintf(s->sw_url, sizeof(s->sw_url), "%s", p->url ? p->url : "");
  s->sw_why[0] = 0;
  s->sw_size_mb = p->size_bytes > 0 ? (double)p->size_bytes / 1048576.0 : 0;
  /* one it cannot hold is refused before it drains: it goes on serving its model */
  uint64_t bytes = p->size_bytes > 0 ? (uint64_t)p->size_bytes : 0;
  char why[320];
  if (!ag_hold_fits(s->sw_to, bytes, p->mem_mb, p->mem_total_mb, s->storage_free_mb,
                    sim_holds(s, s->sw_to) ? bytes : 0, why, sizeof(why))) {
    sim_switch_fail(s, "%s", why);
    return;
  }
  s->sw_phase = AG_SIM_SW_DRAINING;
  pr_info("%s%s%sswitches from %s to %s: draining", s->log_phone ? "phone " : "",
          s->log_phone ? s->id : "", s->log_phone ? ": " : "", s->model, s->sw_to);
  uv_timer_start(&s->switch_timer, sim_switch_cb, 0, AG_SIM_SWITCH_POLL_MS);
}

void ag_sim_switch_get(const ag_sim *s, const char **to, const char **phase, const char **why) {
  static const char *const names[] = {NULL, "draining", "fetching", "loading", "failed"};
  *to = s->sw_phase ? s->sw_to : NULL;
  *phase = names[s->sw_phase];
  *why = s->sw_phase == AG_SIM_SW_FAILED ? s->sw_why : NULL;
}

const char *ag_sim_id(const ag_sim *s) { return s->id; }

static void sim_maybe_stopped(ag_sim *s) {
  if (s->handles_open > 0 || !s->on_stopped) return;
  void (*cb)(ag_sim *, void *) = s->on_stopped;
  s->on_stopped = NULL;
  cb(s, s->stopped_ud);
}

static void sim_timer_closed(uv_handle_t *h) {
  ag_sim *s = h->data;
  s->handles_open--;
  sim_maybe_stopped(s);
}

static void slot_timer_closed(uv_handle_t *h) {
  ag_sim *s = ((ag_slot *)h->data)->sim;
  s->handles_open--;
  sim_maybe_stopped(s);
}

static void sim_http_closed(pr_http_server *http) {
  ag_sim *s = http->ud;
  s->handles_open--;
  sim_maybe_stopped(s);
}

void ag_sim_stop(ag_sim *s, void (*on_stopped)(ag_sim *s, void *ud), void *ud) {
  if (s->stopping) return;
  s->stopping = 1; /* from here no deferred job starts */
  s->on_stopped = on_stopped;
  s->stopped_ud = ud;
  /* Deferred, running and hung jobs end through on_abort as their connections close. */
  pr_http_server_close(&s->http, sim_http_closed);
  /* Jobs whose connection is gone but that are still listed (none expected) end here. */
  for (ag_job *j = s->jobs, *next; j; j = next) {
    next = j->next; /* job_end starts nothing while stopping: next stays valid */
    pr_http_req_let_go(j->req);
    j->req = NULL;
    job_end(j);
  }
  for (int i = 0; i < s->n_slots; i++) uv_close((uv_handle_t *)&s->slots[i].timer, slot_timer_closed);
  uv_close((uv_handle_t *)&s->fault_timer, sim_timer_closed);
  uv_close((uv_handle_t *)&s->relisten_timer, sim_timer_closed);
  uv_close((uv_handle_t *)&s->switch_timer, sim_timer_closed);
}

void ag_sim_free(ag_sim *s) {
  if (!s) return;
  for (int i = 0; s->slots && i < s->n_slots; i++) ag_simslot_free(&s->slots[i].cache);
  ag_simram_free(&s->ram);
  ag_iso_free(&s->iso);
  free(s->slots);
  ag_fault_plan_free(&s->faults);
  free(s->listen_addr);
  free(s->bound_addr);
  free(s->model);
  free(s->id);
  free(s->token);
  free(s->issued);
  free(s->corrupt_model);
  free(s);
}
