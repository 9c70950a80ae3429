/* The simulated phone (`fleetgate-agent --engine sim`): llama-server's HTTP API on one
 * libuv loop, with a phone's timing and a phone's failures.
 *
 * Timing. A prompt of P tokens (characters / 4 of the rendered prompt, see proto/oai.h)
 * of which C are found in the slot's cache takes (P - C) / prefill_tps seconds to read;
 * then one token comes every 1 / decode_tps seconds. Every duration, including
 * --loading-s and the fault plan's at_s and dur_s, is in simulated seconds and is divided
 * by --time-scale to get wall-clock time. `timings` in answers report wall-clock
 * milliseconds, as a client measuring the phone would see them. Each slot runs at the
 * configured rates however many others are busy (a real phone shares its compute; the
 * sim keeps it simple).
 *
 * Slots. --slots requests run at once; the rest wait in a FIFO (requests_deferred), as
 * in llama-server. A new request takes the idle slot whose last prompt shares the
 * longest prefix with its own (if similar enough, else the least recently used one)
 * and reuses it: cache_n = common prefix characters / 4, never the whole prompt. A client that disconnects frees its slot at once.
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
 *
 * Requests are read as llama-server reads them (simreq.h): the ones it refuses get its
 * status and message. A required tool call, response_format and logprobs are answered
 * in its shapes, with the JSON built from the request's schema (simgen.h). */
#include "sim.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "bearer.h"
#include "buf.h"
#include "err.h"
#include "http.h"
#include "json.h"
#include "llsrv.h"
#include "log.h"
#include "oai.h"
#include "simgen.h"
#include "simreq.h"
#include "sse.h"

/* A non-streamed answer holds its whole text; cap it far above any sane cap. */
#define AG_SIM_MAX_ANSWER ((size_t)64 << 20)
/* Small bodies: errors, /props, /slots, chunks. */
#define AG_SIM_MAX_SMALL ((size_t)4 << 20)
/* How much earlier than due a timer may act (uv timers have millisecond resolution). */
#define AG_SIM_SLACK_NS 1000000ull
#define AG_SIM_RELISTEN_MS 50
#define AG_SIM_ID_CHARS 32
/* llama-server's default --slot-prompt-similarity. */
#define AG_SIM_SLOT_SIMILARITY 0.1

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
  uv_timer_t timer;      /* drives the running job: end of prefill, then each token */
  ag_job *job;           /* the running job, NULL when idle; the job is the sim's */
  char *cache;           /* the last prompt this slot read, its "KV cache"; owned */
  size_t cache_len;
  uint64_t last_used_ns; /* breaks ties between equally good idle slots: LRU first */
  ag_llsrv_slot info;    /* what /slots shows about the last task */
};

/* One completion request. Owned by the sim's list of live jobs from arrival until its
 * answer ended or its client left (job_end frees it). The HTTP request is borrowed:
 * req is cleared the moment http.c may free it. */
struct ag_job {
  ag_sim *sim;
  pr_http_req *req;
  ag_job *prev, *next;   /* the sim's live jobs */
  ag_job *qnext;         /* the deferred FIFO */
  ag_slot *slot;         /* while on a slot */
  ag_job_state state;
  int in_call;           /* an HTTP call is on the stack: on_abort only clears req */
  int has_oai;
  pr_oai_req oai;        /* the parsed request; owned */
  int chat, stream, include_usage;
  int64_t cap;           /* -1: none */
  int64_t n_target;      /* tokens to generate */
  const char *finish;    /* "length", "stop" or "tool_calls" */
  int64_t n_prompt, cache_n, prompt_n, n_gen;
  double prompt_ms, predicted_ms, step_ms;
  uint64_t due_ns;       /* uv_hrtime() when the next step is due */
  int drop;              /* a drop fault caught this job */
  int64_t drop_after;    /* tokens a dropped stream sends before the reset */
  int started;           /* stream headers sent */
  uint64_t arrived_ns;
  char request_id[AG_REPORT_MAX_REQUEST_ID + 1]; /* the caller's x-request-id, or "" */
  int64_t created;
  char id[16 + AG_SIM_ID_CHARS];
  pr_buf text;           /* non-streamed answer text (a tool call's arguments); owned */
  ag_simreq_shape shape; /* noise words, a tool call or JSON content */
  char *tool_name;       /* the function a tool call calls; owned */
  char tool_id[8 + AG_SIM_ID_CHARS];
  pr_buf plan;           /* the JSON a tool call or JSON answer generates; owned */
  size_t plan_pos;       /* bytes of plan generated so far */
  int top_logprobs;      /* > 0: each token carries logprobs with that many alternatives */
  pr_buf lp;             /* non-streamed: the logprobs entries so far, comma-separated; owned */
};

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

/* Wall-clock milliseconds that `sim_s` simulated seconds take, under the active faults. */
static double sim_wall_ms(const ag_sim *s, double sim_s) {
  double ms = sim_s * 1000.0 / s->time_scale;
  return ms * ag_fault_plan_slow_factor(&s->faults, sim_now_s(s));
}

/* Code points in the first n bytes of p: the unit of the characters / 4 estimate. */
static size_t utf8_chars(const char *p, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++)
    if (((unsigned char)p[i] & 0xC0) != 0x80) c++;
  return c;
}

static size_t common_prefix(const char *a, size_t na, const char *b, size_t nb) {
  size_t n = na < nb ? na : nb, i = 0;
  if (!a || !b) return 0;
  while (i < n && a[i] == b[i]) i++;
  return i;
}


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

/* An error in the shape of llama-server's routing layer (404, loading). */
static void sim_respond_error_early(pr_http_req *req, int status, const char *type,
                                    const char *msg) {
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  if ((sim_is_mnn(req) ? sim_mnn_error(&b, msg) : ag_llsrv_error_early(&b, status, type, msg)) < 0)
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
  j->arrived_ns = uv_hrtime();
  ag_report_copy_id(j->request_id, pr_http_header_get(req, "x-request-id"));
  pr_buf_init(&j->text, AG_SIM_MAX_ANSWER);
  pr_buf_init(&j->plan, AG_SIM_MAX_ANSWER);
  pr_buf_init(&j->lp, AG_SIM_MAX_ANSWER);
  j->next = s->jobs;
  if (s->jobs) s->jobs->prev = j;
  s->jobs = j;
  return j;
}

/* Take the job off its slot (the slot keeps its cache) and out of the FIFO. */
static void job_detach(ag_job *j) {
  ag_sim *s = j->sim;
  if (j->slot) {
    uv_timer_stop(&j->slot->timer);
    j->slot->job = NULL;
    j->slot->last_used_ns = uv_hrtime();
    j->slot->info.n_decoded = j->n_gen;
    j->slot = NULL;
  }
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

/* The job is over (answered, reset or abandoned): free it and give its slot to the next
 * waiting request. The HTTP request must already be answered or gone. */
static void job_end(ag_job *j) {
  ag_sim *s = j->sim;
  pr_http_req_let_go(j->req);
  job_detach(j);
  if (j->prev) j->prev->next = j->next;
  else s->jobs = j->next;
  if (j->next) j->next->prev = j->prev;
  if (j->has_oai) pr_oai_free(&j->oai);
  pr_buf_free(&j->text);
  pr_buf_free(&j->plan);
  pr_buf_free(&j->lp);
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
  cJSON_AddNumberToObject(f, "ms", (double)(uv_hrtime() - j->arrived_ns) / 1e6);
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
  if (rc >= 0 && j->req) rc = pr_http_write(j->req, b->data, b->len);
  j->in_call = 0;
  if (!j->req) return PR_ECLOSED;
  return rc < 0 ? rc : 0;
}

static void job_answer_ids(const ag_job *j, ag_llsrv_answer *a) {
  a->chat = j->chat;
  a->id = j->id;
  a->created = j->created;
  a->model = j->sim->model;
  a->fingerprint = j->sim->id;
  a->tool_name = j->shape == AG_SIMREQ_TOOL_CALL ? j->tool_name : NULL;
  a->tool_id = j->tool_id;
}

static void job_timings(const ag_job *j, ag_llsrv_timings *t) {
  t->cache_n = j->cache_n;
  t->prompt_n = j->prompt_n;
  t->prompt_ms = j->prompt_ms;
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
  if (whole) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", 0);
    cJSON_AddNumberToObject(u, "completion_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", 0);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "usage");
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

/* Append one SSE event with a chunk of kind k. */
static int job_chunk(const ag_job *j, pr_buf *out, ag_llsrv_chunk_kind k, const char *text,
                     const ag_llsrv_timings *t, const char *logprobs) {
  ag_llsrv_answer a;
  pr_buf json;
  job_answer_ids(j, &a);
  pr_buf_init(&json, AG_SIM_MAX_SMALL);
  int rc = ag_llsrv_chunk(&json, &a, k, text, j->finish, t, logprobs);
  if (rc == 0 && j->sim->flavour == AG_SIM_MNN) rc = sim_mnn_reshape(&json, 0);
  if (rc == 0) rc = pr_sse_write_data(out, json.data, json.len);
  pr_buf_free(&json);
  return rc;
}

/* The next token: a noise word, or the next piece of the planned JSON. A tool call's
 * first token is its start (the function's name), which has no text: *len is 0. */
static const char *job_next_token(ag_job *j, size_t *len) {
  if (j->shape == AG_SIMREQ_TEXT) {
    const char *w = ag_simgen_word(&j->sim->rng, NULL);
    if (!j->stream && j->n_gen == 0 && w[0] == ' ') w++; /* a whole answer does not start with a space */
    *len = strlen(w);
    return w;
  }
  *len = 0;
  if ((j->shape == AG_SIMREQ_TOOL_CALL && j->n_gen == 0) || j->plan_pos >= j->plan.len) return "";
  const char *p = j->plan.data + j->plan_pos;
  *len = ag_simgen_token_len(p, j->plan.len - j->plan_pos);
  j->plan_pos += *len;
  return p;
}

/* A whole answer keeps the token, and its logprobs entry (lp, may be empty). */
static int job_keep(ag_job *j, const char *tok, size_t len, const pr_buf *lp) {
  int rc = pr_buf_append(&j->text, tok, len);
  if (rc == 0 && lp->len && j->lp.len) rc = pr_buf_append_str(&j->lp, ",");
  if (rc == 0 && lp->len) rc = pr_buf_append(&j->lp, lp->data, lp->len);
  return rc;
}

/* A stream sends the token at once: a chat's first one after the role chunk. */
static int job_send(ag_job *j, const char *tok, const pr_buf *lp) {
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  int rc = 0;
  if (j->n_gen == 0 && j->chat && j->sim->flavour != AG_SIM_MNN)
    rc = job_chunk(j, &b, AG_LLSRV_CHUNK_ROLE, NULL, NULL, NULL);
  ag_llsrv_chunk_kind k = AG_LLSRV_CHUNK_TEXT;
  if (j->shape == AG_SIMREQ_TOOL_CALL) k = j->n_gen == 0 ? AG_LLSRV_CHUNK_TOOL_START : AG_LLSRV_CHUNK_TOOL_ARGS;
  if (rc == 0) rc = job_chunk(j, &b, k, tok, NULL, lp->len ? lp->data : NULL);
  if (rc == 0) rc = job_write(j, &b);
  pr_buf_free(&b);
  return rc;
}

/* Emit one generated token. Returns 0, or a negative code when the job is over. */
static int job_emit(ag_job *j) {
  char tok[64]; /* a word or a few characters (ag_simgen_token_len) */
  size_t len;
  const char *p = job_next_token(j, &len);
  if (len >= sizeof(tok)) return PR_ETOOLARGE;
  memcpy(tok, p, len);
  tok[len] = '\0';
  pr_buf lp;
  pr_buf_init(&lp, AG_SIM_MAX_SMALL);
  int rc = 0;
  if (j->top_logprobs > 0 && len) rc = ag_simgen_logprob(&lp, tok, len, j->top_logprobs, &j->sim->rng);
  if (rc == 0) rc = j->stream ? job_send(j, tok, &lp) : job_keep(j, tok, len, &lp);
  pr_buf_free(&lp);
  return rc;
}

/* The last token is out: send the end of the answer and end the job. */
static void job_finish(ag_job *j) {
  ag_llsrv_timings t;
  pr_buf b;
  int rc;
  job_timings(j, &t);
  ag_rates_observe(&j->sim->rates, (double)t.prompt_n, t.prompt_ms, (double)t.predicted_n, t.predicted_ms);
  pr_buf_init(&b, AG_SIM_MAX_ANSWER);
  if (j->stream) {
    /* llama-server puts timings on the last chunk before [DONE]. */
    rc = job_chunk(j, &b, AG_LLSRV_CHUNK_FINISH, NULL, j->include_usage ? NULL : &t, NULL);
    if (rc == 0 && j->include_usage) rc = job_chunk(j, &b, AG_LLSRV_CHUNK_USAGE, NULL, &t, NULL);
    if (rc == 0) rc = pr_buf_append_str(&b, "data: [DONE]\n\n");
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
  } else {
    ag_llsrv_answer a;
    job_answer_ids(j, &a);
    rc = ag_llsrv_answer_body(&b, &a, j->text.data, j->text.len, j->finish, &t,
                              j->top_logprobs > 0 ? pr_buf_cstr(&j->lp) : NULL);
    if (rc == 0 && j->sim->flavour == AG_SIM_MNN) rc = sim_mnn_reshape(&b, 1);
    if (j->req) {
      pr_http_req *req = pr_http_req_let_go(j->req);
      j->req = NULL;
      sim_respond_body(req, rc, &b, AG_LLSRV_JSON_CTYPE, NULL);
    }
  }
  pr_buf_free(&b);
  job_log(j, rc == 0 ? j->finish : "client_gone");
  job_end(j);
}

static void slot_arm(ag_slot *slot, uint64_t due_ns) {
  uint64_t now = uv_hrtime();
  uint64_t ms = due_ns > now ? (due_ns - now + 999999) / 1000000 : 0;
  uv_timer_start(&slot->timer, slot_tick, ms, 0);
}

static uint64_t ms_to_ns(double ms) { return (uint64_t)llround(ms * 1e6); }

static int slot_busy_count(const ag_sim *s) {
  int n = 0;
  for (int i = 0; i < s->n_slots; i++) n += s->slots[i].job != NULL;
  return n;
}

/* Put a deferred job on an idle slot and start reading its prompt. */
static void job_start(ag_job *j, ag_slot *slot) {
  ag_sim *s = j->sim;
  const pr_buf *p = &j->oai.prompt;
  /* "cache_prompt": false reuses nothing, and the slot keeps the prompt all the same (as
   * llama-server b10587 does) */
  const cJSON *cp = cJSON_GetObjectItemCaseSensitive(j->oai.root, "cache_prompt");
  size_t common = cJSON_IsFalse(cp) ? 0 : common_prefix(slot->cache, slot->cache_len, p->data, p->len);
  int64_t cached = (int64_t)(utf8_chars(p->data, common) / 4);
  /* At least one token is always computed, as in llama-server. */
  j->cache_n = cached < j->n_prompt - 1 ? cached : j->n_prompt - 1;
  if (j->cache_n < 0) j->cache_n = 0;
  j->prompt_n = j->n_prompt - j->cache_n;

  char *copy = p->len ? malloc(p->len) : NULL;
  free(slot->cache);
  slot->cache = copy;
  slot->cache_len = copy ? p->len : 0;
  if (copy) memcpy(copy, p->data, p->len);

  j->state = AG_JOB_PREFILL;
  j->slot = slot;
  slot->job = j;
  slot->info.has_task = 1;
  slot->info.id_task = (int64_t)s->next_task++;
  slot->info.n_prompt_tokens = j->n_prompt;
  slot->info.n_prompt_tokens_processed = j->prompt_n;
  slot->info.n_prompt_tokens_cache = j->cache_n;
  slot->info.n_predict = j->cap;
  slot->info.stream = j->stream;
  slot->info.n_decoded = 0;
  if ((uint64_t)j->n_prompt > s->m.n_tokens_max) s->m.n_tokens_max = (uint64_t)j->n_prompt;

  j->prompt_ms = sim_wall_ms(s, (double)j->prompt_n / s->prefill_tps);
  j->due_ns = uv_hrtime() + ms_to_ns(j->prompt_ms);
  slot_arm(slot, j->due_ns);
}

/* The idle slot for j, as llama-server chooses: the one whose cached prompt shares the
 * longest prefix with j's, if that prefix is more than AG_SIM_SLOT_SIMILARITY of j's
 * prompt (--slot-prompt-similarity); else the least recently used idle slot, so that
 * an unrelated prompt does not evict a cache that a free slot could spare. NULL when
 * every slot is busy. */
static ag_slot *sim_pick_slot(ag_sim *s, const ag_job *j) {
  /* "id_slot" names the slot: that one, once it is idle (one out of range is ignored, as
   * llama-server b10587 does) */
  const cJSON *pin = j->has_oai ? cJSON_GetObjectItemCaseSensitive(j->oai.root, "id_slot") : NULL;
  if (cJSON_IsNumber(pin) && pin->valuedouble >= 0 && pin->valuedouble < s->n_slots) {
    ag_slot *slot = &s->slots[(int)pin->valuedouble];
    return slot->job ? NULL : slot;
  }
  ag_slot *similar = NULL, *lru = NULL;
  size_t best_common = 0;
  const pr_buf *p = &j->oai.prompt;
  for (int i = 0; i < s->n_slots; i++) {
    ag_slot *slot = &s->slots[i];
    if (slot->job) continue;
    size_t c = common_prefix(slot->cache, slot->cache_len, p->data, p->len);
    if (c > 0 && (double)c > AG_SIM_SLOT_SIMILARITY * (double)p->len &&
        (!similar || c > best_common)) {
      similar = slot;
      best_common = c;
    }
    if (!lru || slot->last_used_ns < lru->last_used_ns) lru = slot;
  }
  return similar ? similar : lru;
}

/* Start deferred jobs while slots are free. Arms timers only; never answers, so it is
 * safe to call from any callback, on_abort included. */
static void sim_dispatch(ag_sim *s) {
  ag_slot *slot;
  /* in arrival order; a job waiting for the slot it named lets later ones by */
  ag_job *prev = NULL;
  for (ag_job *j = s->q_head; j && !s->stopping;) {
    ag_job *next = j->qnext;
    if ((slot = sim_pick_slot(s, j)) != NULL) {
      if (prev) prev->qnext = next;
      else s->q_head = next;
      if (s->q_tail == j) s->q_tail = prev;
      j->qnext = NULL;
      s->n_deferred--;
      job_start(j, slot);
    } else {
      prev = j;
    }
    j = next;
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

/* The slot's timer: the prompt has been read, or tokens are due. */
static void slot_tick(uv_timer_t *t) {
  ag_slot *slot = t->data;
  ag_job *j = slot->job;
  ag_sim *s = slot->sim;
  if (!j || s->stopping) return;
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
    s->m.prompt_tokens_total += (uint64_t)j->prompt_n;
    s->m.prompt_seconds_total += j->prompt_ms / 1000.0;
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
    slot->info.n_decoded = j->n_gen;
    s->m.tokens_predicted_total++;
    s->m.tokens_predicted_seconds_total += j->step_ms / 1000.0;
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

/* What the request asks of the answer, read as llama-server reads it. Returns 0, or 1
 * when the request was refused (answered here, the job not queued). The MNN flavour
 * refuses the same requests in its own error shape and answers all others with text:
 * MNN's server has no tool calls, JSON mode or logprobs. */
static int job_read(ag_job *j, const cJSON *root, const char *body, size_t len) {
  ag_sim *s = j->sim;
  ag_simreq sr;
  ag_simreq_refusal ref;
  ag_simreq_refusal_init(&ref);
  int rc = ag_simreq_read(root, body, len, j->chat, &sr, &ref);
  if (rc == 0 && s->flavour != AG_SIM_MNN) {
    /* what the answer will say is decided now, while the request's schema exists */
    j->shape = sr.shape;
    j->top_logprobs = sr.top_logprobs;
    if (sr.shape == AG_SIMREQ_TOOL_CALL) {
      sim_gen_id(s, "call_", j->tool_id, sizeof(j->tool_id));
      if (!(j->tool_name = strdup(sr.tool_name))) rc = -ENOMEM;
    }
    if (rc == 0 && sr.shape != AG_SIMREQ_TEXT) rc = ag_simgen_value(&j->plan, sr.schema, &s->rng);
  }
  if (rc > 0) sim_respond_error(j->req, ref.status, ref.type, pr_buf_cstr(&ref.message));
  else if (rc < 0) sim_respond_error(j->req, 500, AG_LLSRV_E_SERVER, pr_strerror(rc));
  ag_simreq_refusal_free(&ref);
  return rc != 0;
}

/* Tokens a tool call or JSON answer takes in full (a call's start is one), or 0 for
 * noise text, whose length is chosen instead. */
static int64_t job_planned_tokens(const ag_job *j) {
  if (j->shape == AG_SIMREQ_TEXT) return 0;
  return (j->shape == AG_SIMREQ_TOOL_CALL) + ag_simgen_count_tokens(j->plan.data, j->plan.len);
}

/* llama-server takes bodies without "model"; pr_oai_parse does not. Returns a malloc'd
 * copy of the body with the served model filled in, or NULL when none is needed. */
static char *sim_patch_model(ag_sim *s, cJSON *root, size_t *len) {
  if (!cJSON_IsObject(root)) return NULL;
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (cJSON_IsString(m) && m->valuestring[0]) return NULL;
  cJSON_DeleteItemFromObjectCaseSensitive(root, "model");
  if (!cJSON_AddStringToObject(root, "model", s->model)) return NULL;
  char *txt = cJSON_PrintUnformatted(root);
  if (txt) *len = strlen(txt);
  return txt;
}

/* How many tokens the job writes and why it stops: a tool call or JSON ends when its JSON
 * does (unless the cap or the context cuts it), text at the cap, or without one at a
 * pseudo-random length or the end of the context. */
static void job_plan_length(ag_job *j) {
  ag_sim *s = j->sim;
  int64_t planned = job_planned_tokens(j);
  if (planned > 0) {
    /* a tool call or JSON ends when its JSON does, unless the cap or the context cuts it */
    int64_t room = s->n_ctx - j->n_prompt;
    j->n_target = planned;
    j->finish = j->shape == AG_SIMREQ_TOOL_CALL ? "tool_calls" : "stop";
    if ((j->cap > 0 && j->cap < planned) || (j->cap <= 0 && planned >= room)) {
      j->n_target = j->cap > 0 ? j->cap : room > 1 ? room : 1;
      j->finish = "length";
    }
  } else if (j->cap > 0) {
    j->n_target = j->cap;
    j->finish = "length";
  } else {
    /* No cap: stop at a pseudo-random length, or at the end of the context. */
    int64_t room = s->n_ctx - j->n_prompt;
    j->n_target = 16 + (int64_t)(sim_rand(s) % 49);
    j->finish = "stop";
    if (j->n_target >= room) {
      j->n_target = room > 1 ? room : 1;
      j->finish = "length";
    }
  }
}

static void sim_completion(ag_sim *s, pr_http_req *req, int chat) {
  const char *body = req->body.data ? req->body.data : "";
  size_t len = req->body.len;
  s->n_completions++;
  if (s->draining) {
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
    snprintf(msg, sizeof(msg),
             "[json.exception.parse_error.101] parse error at line %d, column %d: syntax error "
             "while parsing value - %s", jerr.line, jerr.col, jerr.msg);
    sim_respond_error(req, 500, AG_LLSRV_E_SERVER, msg);
    return;
  }
  ag_job *j = job_new(s, req);
  if (!j) {
    cJSON_Delete(root);
    sim_respond_error(req, 500, AG_LLSRV_E_SERVER, "out of memory");
    return;
  }
  j->chat = chat;
  if (job_read(j, root, body, len)) {
    cJSON_Delete(root);
    j->req = NULL;
    job_end(j);
    return;
  }
  size_t plen = 0;
  char *patched = sim_patch_model(s, root, &plen);
  cJSON_Delete(root);

  pr_oai_error oerr;
  memset(&oerr, 0, sizeof(oerr));
  int rc = pr_oai_parse(&j->oai, chat ? PR_OAI_CHAT : PR_OAI_COMPLETION,
                        patched ? patched : body, patched ? plen : len, &oerr);
  free(patched);
  if (rc < 0) {
    j->req = NULL;
    job_end(j);
    sim_respond_error(req, oerr.status ? oerr.status : 400,
                      oerr.status >= 500 ? AG_LLSRV_E_SERVER : AG_LLSRV_E_INVALID, oerr.message);
    return;
  }
  j->has_oai = 1;
  j->stream = j->oai.stream;
  j->include_usage = j->oai.stream && j->oai.include_usage && s->flavour != AG_SIM_MNN;
  j->cap = s->flavour == AG_SIM_MNN ? -1 : j->oai.max_tokens; /* MNN ignores the cap */
  j->n_prompt = j->oai.prompt_tokens;
  j->created = (int64_t)time(NULL);
  sim_gen_id(s, "chatcmpl-", j->id, sizeof(j->id));

  int64_t need = j->n_prompt + (j->cap > 0 ? j->cap : 0);
  if (need > s->n_ctx) {
    pr_buf b;
    pr_buf_init(&b, AG_SIM_MAX_SMALL);
    ag_llsrv_error_context(&b, j->n_prompt, s->n_ctx);
    j->req = NULL;
    job_log(j, "exceeds_context");
    job_end(j);
    sim_respond_buf(req, 400, AG_LLSRV_JSON_CTYPE, &b, NULL);
    pr_buf_free(&b);
    return;
  }
  job_plan_length(j);
  if (sim_faults(s) & AG_FAULT_BIT(AG_FAULT_DROP)) {
    j->drop = 1;
    j->drop_after = 1 + (int64_t)(sim_rand(s) % 4);
    if (!j->stream) {
      job_reset(j, "dropped");
      return;
    }
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
  int rc = ag_llsrv_props(&b, s->model, s->n_ctx, s->n_slots, build);
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

/* Prompt tokens a job on a slot has computed so far: a prefill advances evenly over
 * its duration (llama-server advances a batch at a time). */
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
    if (s->slots[i].job) info[i].n_prompt_tokens_processed = job_prompt_processed(s->slots[i].job, uv_hrtime());
  }
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  int rc = ag_llsrv_slots(&b, info, (size_t)s->n_slots);
  free(info);
  sim_respond_body(req, rc, &b, AG_LLSRV_JSON_CTYPE, NULL);
  pr_buf_free(&b);
}

static void sim_metrics(ag_sim *s, pr_http_req *req) {
  pr_buf b;
  char hdr[64];
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  s->m.requests_deferred = s->n_deferred;
  s->m.requests_processing = (uint64_t)slot_busy_count(s);
  int rc = ag_llsrv_metrics_text(&b, &s->m);
  snprintf(hdr, sizeof(hdr), "Process-Start-Time-Unix: %" PRId64, s->start_unix);
  sim_respond_body(req, rc, &b, AG_LLSRV_METRICS_CTYPE, hdr);
  pr_buf_free(&b);
}

static void sim_models(ag_sim *s, pr_http_req *req) {
  pr_buf b;
  pr_buf_init(&b, AG_SIM_MAX_SMALL);
  int rc = ag_llsrv_models(&b, s->model, s->n_ctx, s->start_unix);
  sim_respond_body(req, rc, &b, AG_LLSRV_JSON_CTYPE, NULL);
  pr_buf_free(&b);
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
    sim_completion(s, req, 1);
  } else if (post && is_path(req->path, "/v1/completions", "/completions")) {
    sim_completion(s, req, 0);
  } else {
    sim_respond_error_early(req, 404, AG_LLSRV_E_NOT_FOUND, "File Not Found");
  }
}

/* ---- faults over time ------------------------------------------------------------- */

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
  pr_info("fault offline ended: listening again on %s", s->bound_addr);
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
    if ((now & bit) != (s->faults_now & bit))
      pr_info("fault %s %s", ag_fault_kind_name((ag_fault_kind)k), (now & bit) ? "begins" : "ends");
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
  memset(c, 0, sizeof(*c));
  c->slots = 1;
  c->prefill_tps = 100.0;
  c->decode_tps = 10.0;
  c->n_ctx = 4096;
  c->time_scale = 1.0;
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
  ag_rates_init(&s->rates);
  ag_rates_seed(&s->rates, cfg->prefill_tps * cfg->time_scale, cfg->decode_tps * cfg->time_scale);
  s->prefill_tps = cfg->prefill_tps;
  s->decode_tps = cfg->decode_tps;
  s->time_scale = cfg->time_scale;
  s->loading_s = cfg->loading_s;
  s->n_ctx = cfg->n_ctx;
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
  s->fault_timer.data = s;
  s->relisten_timer.data = s;
  s->handles_open = s->n_slots + 2 + 1;
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
}

size_t ag_sim_running(const ag_sim *s, ag_running *out, size_t cap) {
  uint64_t now = uv_hrtime();
  size_t n = 0;
  for (int i = 0; i < s->n_slots && n < cap; i++) {
    const ag_job *j = s->slots[i].job;
    if (!j || (j->state != AG_JOB_PREFILL && j->state != AG_JOB_DECODE)) continue;
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
}

void ag_sim_free(ag_sim *s) {
  if (!s) return;
  for (int i = 0; s->slots && i < s->n_slots; i++) free(s->slots[i].cache);
  free(s->slots);
  ag_fault_plan_free(&s->faults);
  free(s->listen_addr);
  free(s->bound_addr);
  free(s->model);
  free(s->id);
  free(s->token);
  free(s->issued);
  free(s);
}
