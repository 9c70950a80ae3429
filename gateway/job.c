/* A client request's life in the gateway: admission (validation, model, token cap,
 * context fit, queue bound, a deadline no phone can meet), the queue (priority class,
 * then fair shares, then shortest predicted work first with aging; a retried job goes
 * back to the front), planning passes that dispatch jobs to the replica that
 * finishes them soonest, retries and failover, and the access log line at the end. */
#include <assert.h>
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "caps.h"
#include "cost.h"
#include "err.h"
#include "feat.h"
#include "gw.h"
#include "json.h"
#include "log.h"
#include "metrics.h"
#include "queue.h"
#include "auth.h"
#include "bounds.h"
#include "planrec.h"
#include "registry.h"
#include "responses.h"
#include "shared.h"
#include "scheduler.h"
#include "verdict.h"

/* How long after the last local resource failure new attempts start only as others end. */
#define GW_FD_PRESSURE_MS 1000


/* What the job does with its attempts' news (gw_attempt_ops, given to gw_attempt_start). */
static void job_attempt_failed(gw_job *j, gw_fail_kind kind, const char *detail);
static void job_attempt_refused(gw_job *j, int ambiguous, long status, const char *body, size_t len);
static void job_attempt_done(gw_job *j);
static void job_lease_denied(gw_job *j);
static void job_finish(gw_job *j, int status);
static void job_finish_soon(gw_job *j);
static int job_stream_begin(gw_job *j, const char *replica_id);
static int job_stream_event(gw_job *j, const char *replica_id, const char *payload, size_t len);
static int job_stream_comment(gw_job *j, const char *replica_id, const char *text, size_t len);
static void job_stream_end(gw_job *j);
static int job_note_chunk(gw_job *j, const char *id, const char *text, const char *reasoning, int tool_calls);
static int job_client_behind(gw_job *j);
static void job_respond(gw_job *j, const char *replica_id, int status, const char *ctype,
                        const char *body, size_t len);
static void job_client_stalled(gw_job *j);
static void job_set_last_error(gw_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_answer_began(gw_job *j);
/* ...and the hedges' own, for a hedge's failure, refusal, lease and first byte */
static void hedge_failed(gw_attempt *h, gw_fail_kind kind, const char *detail);
static void hedge_refused(gw_attempt *h);
static void hedge_lease_denied(gw_attempt *h);
static void hedge_began(gw_attempt *h);

/* What an attempt reports, decided by its role: a hedge's failure, refusal, denied lease
 * and first byte are the hedge's business (the running attempt goes on); anything after a
 * hedge's first byte comes once it won and is the running attempt. A lost attempt
 * reports nothing (upstream.c drops what it would say). */
static void att_failed(gw_attempt *a, gw_fail_kind kind, const char *detail) {
  if (a->role == GW_ATT_HEDGE) hedge_failed(a, kind, detail);
  else job_attempt_failed(a->job, kind, detail);
}

static void att_refused(gw_attempt *a, int ambiguous, long status, const char *body, size_t len) {
  if (a->role == GW_ATT_HEDGE) hedge_refused(a);
  else job_attempt_refused(a->job, ambiguous, status, body, len);
}

static void att_done(gw_attempt *a) { job_attempt_done(a->job); }

static void att_lease_denied(gw_attempt *a) {
  if (a->role == GW_ATT_HEDGE) hedge_lease_denied(a);
  else job_lease_denied(a->job);
}

static void att_finish(gw_attempt *a, int status) { job_finish(a->job, status); }

static int att_stream_event(gw_attempt *a, const char *payload, size_t len) {
  return job_stream_event(a->job, a->replica->id, payload, len);
}

static int att_stream_comment(gw_attempt *a, const char *text, size_t len) {
  return job_stream_comment(a->job, a->replica->id, text, len);
}

static void att_stream_end(gw_attempt *a) { job_stream_end(a->job); }

static int att_note_chunk(gw_attempt *a, const char *id, const char *text, const char *reasoning,
                          int tool_calls) {
  return job_note_chunk(a->job, id, text, reasoning, tool_calls);
}

static int att_client_behind(gw_attempt *a) { return job_client_behind(a->job); }

static void att_respond(gw_attempt *a, int status, const char *ctype, const char *body, size_t len) {
  job_respond(a->job, a->replica->id, status, ctype, body, len);
}

static void att_client_stalled(gw_attempt *a) { job_client_stalled(a->job); }

static void att_answer_began(gw_attempt *a) {
  if (a->role == GW_ATT_HEDGE) hedge_began(a);
  else job_answer_began(a->job);
}

static const gw_attempt_ops job_attempt_ops = {
  .failed = att_failed,
  .refused = att_refused,
  .done = att_done,
  .lease_denied = att_lease_denied,
  .finish = att_finish,
  .stream_event = att_stream_event,
  .stream_comment = att_stream_comment,
  .stream_end = att_stream_end,
  .note_chunk = att_note_chunk,
  .client_behind = att_client_behind,
  .respond = att_respond,
  .client_stalled = att_client_stalled,
  .answer_began = att_answer_began,
};

/* ---- the job's states ---------------------------------------------------------------------- */

const char *gw_job_state_name(gw_job_state s) {
  static const char *const names[GW_JOB_STATES] = {"admitting", "queued", "running",
                                                   "streaming", "resuming", "done"};
  return s < GW_JOB_STATES ? names[s] : "unknown";
}

/* legal[from][to]; see the diagram in gw.h */
static const unsigned char legal[GW_JOB_STATES][GW_JOB_STATES] = {
  /*               ADMIT QUEUED RUN STREAM RESUME DONE */
  /* ADMITTING */ {0,    1,     0,  0,     0,     1},
  /* QUEUED    */ {0,    0,     1,  0,     0,     1},
  /* RUNNING   */ {0,    1,     0,  1,     0,     1},
  /* STREAMING */ {0,    0,     0,  0,     1,     1},
  /* RESUMING  */ {0,    0,     0,  1,     0,     1},
  /* DONE      */ {0,    0,     0,  0,     0,     0},
};

int gw_job_move_ok(gw_job_state from, gw_job_state to) {
  return from < GW_JOB_STATES && to < GW_JOB_STATES && legal[from][to];
}

/* The one place a job changes state. An illegal move is a bug: it is logged and, in a
 * build with assertions (the tests'), stops the process where it happened. */
static void job_move(gw_job *j, gw_job_state to) {
  if (!gw_job_move_ok(j->state, to)) {
    pr_error("request %s: illegal move %s -> %s", j->id, gw_job_state_name(j->state),
             gw_job_state_name(to));
    pr_log_flush(); /* the line is written before an assertion stops the process */
    assert(!"illegal job state move");
  }
  j->state = to;
}

/* ---- queue ------------------------------------------------------------------------------ */

/* A job joins the queue (its state moves to QUEUED, or RESUMING for a broken stream) or
 * leaves it (the caller moves it on at once: a dispatch, or DONE). queue.c links. */
static void queue_push(gw_server *gw, gw_job *j, int front) {
  if (gw_queue_insert(&gw->queue, j, front) < 0) return; /* queued already */
  j->model->queued++;
  job_move(j, gw_job_streamed(j) ? GW_JOB_RESUMING : GW_JOB_QUEUED);
}

static void queue_remove(gw_server *gw, gw_job *j) {
  if (gw_queue_unlink(&gw->queue, j) == 0) j->model->queued--;
}

size_t gw_queue_count_model(const gw_server *gw, const char *model) {
  const gw_model *m = gw_models_find(&gw->models, model);
  return m ? m->queued : 0;
}

/* ---- finishing ---------------------------------------------------------------------------- */

static void refusal_free(gw_refusal *f) {
  if (!f) return;
  pr_buf_free(&f->body);
  free(f);
}

static void job_timer_closed(uv_handle_t *h) {
  gw_job *j = h->data;
  gw_server *gw = j->gw;
  if (j->aprev) j->aprev->anext = j->anext;
  else gw->jobs = j->anext;
  if (j->anext) j->anext->aprev = j->aprev;
  pr_oai_free(&j->oai);
  if (j->resp) gw_resp_free(j->resp);
  free(j->resp);
  pr_buf_free(&j->sofar);
  pr_buf_free(&j->sofar_reasoning);
  gw_config_unref(j->conf);
  gw_model_unref(j->model);
  free(j->last_error);
  free(j->waited_for);
  refusal_free(j->held_refusal);
  free(j);
  gw->jobs_alive--;
  if (gw->shutting_down && gw->jobs_alive == 0 && gw->jobs_drained) gw->jobs_drained(gw);
}

/* A count for the access log, printed as cJSON prints it ("%1.15g" is the integer's
 * digits below 1e15) but without its round trip through sprintf and sscanf. */
static void log_count(cJSON *f, const char *name, double v) {
  if (v >= 0 && v < 1e15 && v == (double)(uint64_t)v) {
    char num[24];
    num[sizeof(num) - 1] = '\0';
    cJSON_AddRawToObject(f, name, pr_u64_digits(num + sizeof(num) - 1, (uint64_t)v));
  } else {
    cJSON_AddNumberToObject(f, name, v);
  }
}

/* The access log line of an ended request (a subscriber of ended jobs, the first). */
static void job_access_log(gw_server *gw, const gw_job_ended *ev, void *ud) {
  (void)gw, (void)ud;
  const gw_job *j = ev->j;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", j->id);
  cJSON_AddStringToObject(f, "path", j->resp ? "/v1/responses" : j->path); /* (sent on as a chat) */
  if (ev->caller) cJSON_AddStringToObject(f, "key", ev->caller);
  else cJSON_AddNullToObject(f, "key");
  cJSON_AddStringToObject(f, "model", ev->model);
  cJSON_AddStringToObject(f, "priority", j->prio == GW_PRIO_BATCH ? "batch" : "interactive");
  cJSON_AddBoolToObject(f, "stream", j->oai.stream);
  if (j->replica_id[0]) cJSON_AddStringToObject(f, "replica", j->replica_id);
  else cJSON_AddNullToObject(f, "replica");
  log_count(f, "attempts", j->attempts);
  log_count(f, "queue_wait_ms", ev->queue_wait_s * 1000.0);
  if (ev->ttfb_s >= 0) log_count(f, "ttfb_ms", ev->ttfb_s * 1000.0);
  else cJSON_AddNullToObject(f, "ttfb_ms");
  log_count(f, "duration_ms", ev->duration_s * 1000.0);
  log_count(f, "tokens_in", (double)ev->tokens_in);
  log_count(f, "tokens_out", (double)ev->tokens_out);
  log_count(f, "cached_tokens", (double)j->cached_tokens);
  /* the plan's word on it, in the gateway's estimated tokens (characters / 4) of the
   * estimated prompt: how far the prefix-cache model is right (docs/routing.md) */
  if (j->pred_cached >= 0 && ev->tokens_in > 0) {
    log_count(f, "predicted_cached_tokens", (double)j->pred_cached);
    log_count(f, "estimated_prompt_tokens", (double)j->oai.prompt_tokens);
  }
  log_count(f, "status", ev->status);
  /* the status line said 200, but the answer ended in an error event */
  if (j->stream_failed) cJSON_AddStringToObject(f, "outcome", "stream_error");
  if (j->client_gone) cJSON_AddBoolToObject(f, "client_gone", 1);
  if (j->shadow) cJSON_AddBoolToObject(f, "shadow", 1); /* a check's (verify.c): no caller's */
  if (j->continues) log_count(f, "stream_continued", j->continues);
  if (j->last_error) cJSON_AddStringToObject(f, "last_error", j->last_error);
  if (j->refused_code) {
    /* the request's own fault: which code, and who said so */
    cJSON_AddStringToObject(f, "refused", j->refused_code);
    cJSON_AddStringToObject(f, "refused_by", j->refused_by_replica ? j->replica_id : "gateway");
  }
  /* a check's shadow request is no caller's: its own message, so that the access log
   * lists callers' requests only */
  pr_log_kv(PR_LOG_INFO, j->shadow ? "shadow request" : "request", f);
}

int gw_jobs_subscribe_log(gw_server *gw) { return gw_jobs_subscribe(gw, job_access_log, NULL); }

/* What a request came to, worked out once (gw.h gw_job_ended). */
void gw_job_outcome(const gw_job *j, uint64_t now, gw_job_ended *ev) {
  memset(ev, 0, sizeof(*ev));
  ev->j = j;
  ev->now_ms = now;
  ev->status = j->client_gone && !j->status ? 499 : j->status;
  ev->served = j->status >= 200 && j->status < 400 && !j->stream_failed;
  ev->failed = j->status >= 500 || j->status == 429 || (j->stream_failed && !j->client_gone);
  ev->model = j->oai.model ? j->oai.model : "";
  ev->caller = j->caller && j->caller->name ? j->caller->name : NULL;
  ev->tokens_in = j->tokens_in;
  ev->tokens_out = j->tokens_out;
  ev->duration_s = now > j->arrival_ms ? (double)(now - j->arrival_ms) / 1000.0 : 0;
  uint64_t qend = j->first_dispatch_ms ? j->first_dispatch_ms : now;
  ev->queue_wait_s = qend > j->arrival_ms ? (double)(qend - j->arrival_ms) / 1000.0 : 0;
  ev->ttfb_s = j->ttfb_ms ? (double)(j->ttfb_ms - j->arrival_ms) / 1000.0 : -1;
  ev->admitted = j->caller && j->admitted;
}

/* ---- the deferred-free queue ------------------------------------------------------------ */

/* What is freed or finished at the end of the loop turn (gw_server.defer_head): attempts
 * that lost a hedge's race (their transfers may not be cancelled from inside another's curl
 * callback) and jobs whose client left while an attempt ran (that may have been seen
 * inside a curl callback). The queue is worked off in the check phase, right after the I/O
 * callbacks that filled it and before the next turn's timers (curl's among them) can send
 * anything for them; the idle handle keeps the loop from blocking until then when it was
 * filled outside the I/O phase. An attempt is freed there (gw_attempt_free takes it off its
 * job's list), a job finished (job_finish; its memory goes in its watchdog's close
 * callback, as libuv requires). Whatever is freed or finished sooner (job_finish frees
 * its lost attempts itself) leaves the queue then (gw_defer_forget). */
static void defer_run(gw_server *gw) {
  uv_idle_stop(&gw->reap_idle);
  uv_check_stop(&gw->reap_check);
  int freed = 0;
  while (gw->defer_head) {
    gw_defer *d = gw->defer_head;
    gw_defer_forget(gw, d);
    if (d->kind == GW_DEFER_ATTEMPT) {
      /* a lost attempt: its transfer ends, its slot is free */
      gw_attempt_free((gw_attempt *)((char *)d - offsetof(gw_attempt, defer)));
      freed = 1;
    } else {
      job_finish((gw_job *)((char *)d - offsetof(gw_job, defer)), 0);
    }
  }
  if (freed) gw_plan_soon(gw);
}

static void defer_idle_cb(uv_idle_t *h) { defer_run(h->data); }
static void defer_check_cb(uv_check_t *h) { defer_run(h->data); }

static void defer_push(gw_server *gw, gw_defer *d) {
  if (d->queued) return;
  d->queued = 1;
  d->next = NULL;
  d->prev = gw->defer_tail;
  if (gw->defer_tail) gw->defer_tail->next = d;
  else gw->defer_head = d;
  gw->defer_tail = d;
  if (!uv_is_active((uv_handle_t *)&gw->reap_check)) {
    uv_check_start(&gw->reap_check, defer_check_cb);
    uv_idle_start(&gw->reap_idle, defer_idle_cb);
  }
}

static void job_finish_soon(gw_job *j) {
  if (j->state == GW_JOB_DONE) return;
  defer_push(j->gw, &j->defer);
}

/* ---- hedges ------------------------------------------------------------------------------- */

/* The hedge ends unused (it failed, was refused, lost the race, or its job ended): counted
 * as wasted. Not from inside a curl callback. */
static void hedge_drop(gw_attempt *h) {
  gw_server *gw = h->job->gw;
  gw_attempt_free(h); /* counts it wasted */
  gw_plan_soon(gw);
}

/* ...every hedge of j (the request has its own answer) */
static void hedges_drop(gw_job *j) {
  for (gw_attempt *a = j->atts, *next; a; a = next) {
    next = a->next;
    if (a->role == GW_ATT_HEDGE) hedge_drop(a);
  }
}

/* a lost the race: it reports nothing more, and it is freed (its transfer cancelled, its
 * slot freed) at the end of the turn, since this may run inside one of curl's callbacks. */
static void attempt_lose(gw_attempt *a) {
  a->role = GW_ATT_LOST;
  defer_push(a->job->gw, &a->defer);
}

static void log_hedge(const gw_job *j, const char *decision, const gw_attempt *won,
                      const gw_attempt *lost) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", j->id);
  cJSON_AddStringToObject(f, "decision", decision);
  cJSON_AddStringToObject(f, "replica", won->replica->id);
  if (lost) cJSON_AddStringToObject(f, "other_replica", lost->replica->id);
  pr_log_kv(PR_LOG_INFO, "routing", f);
}

/* The running attempt's answer began: if a hedge runs beside it, the hedge lost. A hedge
 * that had become the running attempt (its rival failed) won. */
static void job_answer_began(gw_job *j) {
  gw_attempt *a = gw_job_running(j);
  if (!a || a->status != 200) return;
  if (a->hedge == 1) {
    a->hedge = 2; /* an answer that failed (a 503, a 500) is no win: freed, it counts wasted */
    gw_metrics_hedge(j->gw, GW_HEDGE_WON);
  }
  for (gw_attempt *h = j->atts; h; h = h->next) {
    if (h->role != GW_ATT_HEDGE) continue;
    log_hedge(j, "hedge_lost", a, h);
    attempt_lose(h); /* counted wasted when it is freed */
  }
}

/* The hedge h becomes the running attempt (its rival lost or failed and is no longer the
 * running one). */
static void hedge_take_over(gw_attempt *h) {
  gw_job *j = h->job;
  h->role = GW_ATT_RUNNING;
  snprintf(j->replica_id, sizeof(j->replica_id), "%s", h->replica->id);
}

/* The hedge's first byte: a 200 is the first answer, and wins; an error answer is judged
 * when it ends (hedge_failed, hedge_refused) while the running attempt goes on. */
static void hedge_began(gw_attempt *h) {
  gw_job *j = h->job;
  if (h->status != 200) return;
  gw_attempt *a = gw_job_running(j);
  log_hedge(j, "hedge_won", h, a);
  if (a) attempt_lose(a);
  hedge_take_over(h);
  job_answer_began(j);
}

static void job_charge(gw_job *j, gw_replica *r, gw_fail_kind kind, const char *detail,
                       int not_the_phone, uint64_t now);
static void job_log_failure(const gw_job *j, const gw_replica *r, gw_fail_kind kind,
                            const char *detail);

/* The hedge failed as a phone fails: its phone is charged; the running attempt goes on. */
static void hedge_failed(gw_attempt *h, gw_fail_kind kind, const char *detail) {
  gw_job *j = h->job;
  gw_replica *r = h->replica;
  hedge_drop(h);
  if (j->client_gone) return;
  gw_metrics_attempt_failed(j->gw, kind);
  job_charge(j, r, kind, detail, 0, uv_now(j->gw->loop));
  job_log_failure(j, r, kind, detail);
}

/* A hedge's refusal is not taken up: the running attempt gives the request's own answer. */
static void hedge_refused(gw_attempt *h) { hedge_drop(h); }

static void hedge_lease_denied(gw_attempt *h) {
  h->job->attempts--;
  hedge_drop(h);
}

static void job_finish(gw_job *j, int status) {
  if (j->state == GW_JOB_DONE) return;
  gw_server *gw = j->gw;
  gw_defer_forget(gw, &j->defer);
  queue_remove(gw, j);
  job_move(j, GW_JOB_DONE);
  if (status) j->status = status;
  /* its attempts, whatever their role: cancelled and freed (a lost one leaves the
   * deferred-free queue) */
  while (j->atts) gw_attempt_free(j->atts);
  gw_sink_close(&j->sink);
  gw_shared_admit_forget(j); /* a Redis admission still on its way finds no job */
  /* the outcome, worked out once, to the access log, the key's budget, metrics and the
   * cost ledger (subscribed in that order by server.c) */
  gw_job_ended ev;
  gw_job_outcome(j, uv_now(gw->loop), &ev);
  gw_jobs_publish(gw, &ev);
  j->admitted = 0;
  uv_timer_stop(&j->watchdog);
  uv_close((uv_handle_t *)&j->watchdog, job_timer_closed);
  gw_plan_soon(gw);
}

static void job_fail(gw_job *j, int status, const char *type, const char *code, int retry_after,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void job_fail_stream(gw_job *j, const char *message);
static int job_admit_local(gw_job *j, int rates);
static void job_enqueue(gw_job *j);
static void job_admit(gw_job *j, int prio_asked);
static void job_answer_refusal(gw_job *j);

/* Answer the client with an error and finish. */
static void job_fail(gw_job *j, int status, const char *type, const char *code, int retry_after,
                     const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (gw_job_streamed(j)) {
    /* a started stream has had its status line: it can only end with an error event */
    job_fail_stream(j, msg);
    return;
  }
  gw_sink_error(&j->sink, j->id, status, type, NULL, code, retry_after, msg);
  job_finish(j, status);
}

/* A stream already started: end it with this OpenAI-style error event (no [DONE]). */
static void job_end_stream(gw_job *j, const pr_buf *body) {
  if (gw_sink_open(&j->sink)) {
    pr_buf ev;
    pr_buf_init(&ev, body->len * 2 + PR_CAP_SSE_EVENT);
    int rc = j->resp ? gw_resp_fail(j->resp, body->data, body->len, &ev) : pr_sse_write_data(&ev, body->data, body->len);
    if (!rc && gw_sink_write(&j->sink, ev.data, ev.len) >= 0)
      gw_sink_stream_end(&j->sink);
    else
      gw_sink_abort(&j->sink);
    pr_buf_free(&ev);
  }
  job_finish(j, 200);
}

/* A stream already started and no phone can go on with it: counted as failed, with the
 * tokens the client did get. */
static void job_fail_stream(gw_job *j, const char *message) {
  j->stream_failed = 1;
  j->tokens_out = j->sofar_tokens > 0 ? (uint64_t)j->sofar_tokens : 0;
  if (!j->tokens_in && j->oai.prompt_tokens > 0) j->tokens_in = (uint64_t)j->oai.prompt_tokens;
  pr_buf body;
  pr_buf_init(&body, PR_CAP_ERROR_BODY);
  pr_oai_error_body(&body, message, "server_error", NULL, "upstream_stream_error");
  job_end_stream(j, &body);
  pr_buf_free(&body);
}

/* A rough "when will a slot be free for this model": the soonest predicted free slot
 * among the replicas that serve it, plus the queue ahead spread over their slots. */
static int retry_after_s(gw_server *gw, const gw_model *m) {
  uint64_t now = uv_now(gw->loop), best = UINT64_MAX;
  for (size_t i = 0; m && i < m->n_phones; i++) {
    uint64_t w = gw_replica_wait_ms(m->phones[i], now);
    if (w < best) best = w;
  }
  if (best == UINT64_MAX) return (int)(gw->conf->cooldown_s + 1);
  int s = (int)(best / 1000) + 1;
  return s > 600 ? 600 : s;
}

/* ---- what a phone must serve ---------------------------------------------------------------- */

/* The engine features (proto/feat.h) a phone must serve to take j now, or to go on with
 * its stream (continuing): only an engine that continues a final assistant message can go
 * on with a thinking answer's reasoning. */
static unsigned job_needs(const gw_job *j, int continuing) {
  unsigned n = 0;
  if ((continuing || j->continues > 0) && j->sofar_reasoning.len > 0) n |= PR_FEAT_CONTINUE;
  if (j->oai.choices > 1) n |= PR_FEAT_CHOICES;
  return n;
}

/* A plan of j asks for what its phone must serve, and as many of its slots as choices. */
static void job_sched_needs(const gw_job *j, gw_sched_req *q) {
  q->needs = job_needs(j, 0);
  q->choices = j->oai.choices;
}

/* ---- slots kept for short work (scheduler.short_reserve) ---- */

/* Short work for m was planned now. */
static void short_note(gw_model *m, uint64_t now) { m->short_ms = now ? now : 1; }

/* What a plan of j needs to leave the quick phones' kept slots to short work: kept only
 * while short work for its model came lately (scheduler.short_recent_s), so a fleet that
 * serves none loses nothing; and as long after the gateway started, before it can know
 * (else the first seconds' long work fills every quick slot before the first guard's
 * message comes). */
static void short_fields(const gw_server *gw, const gw_job *j, gw_sched_req *q, uint64_t now) {
  const gw_model *m = j->model;
  uint64_t recent = (uint64_t)(j->conf->short_recent_s * 1000.0);
  q->short_s = j->conf->short_s;
  int lately = (m->short_ms && now < m->short_ms + recent) || now < gw->started_ms + recent;
  q->short_reserve = lately ? gw_model_short_slots(m, now, j->conf->short_recent_s, j->conf->short_s,
                                                   j->conf->short_wait_p, j->conf->short_reserve)
                            : 0;
  q->short_rate = q->short_reserve > 0 ? gw_model_short_rate(m, now, j->conf->short_recent_s) : 0;
  q->short_wait_p = j->conf->short_wait_p;
}

/* What a plan or a prediction reads of j (predict.h), in one place, for what it is for. */
typedef enum {
  REQ_PREDICT, /* admission: its size, expected answer and cache scope */
  REQ_QUEUED,  /* a planning pass: also its class, the phone its last attempt failed on, the
                  config's batch room, exploration and wait weights, short work's kept slots */
  REQ_HEDGE,   /* a second attempt: anywhere but the phone it runs on (avoid), leaving short
                  work's kept slots to it, on plain finish times */
  REQ_MOVE,    /* leaving a phone that turned slow (avoid): likewise */
} req_use;

static gw_sched_req job_sched_req(const gw_server *gw, const gw_job *j, uint64_t now, req_use use,
                                  const gw_replica *avoid) {
  gw_sched_req q = {.model = j->oai.model, .prompt_tokens = j->oai.prompt_tokens,
                    .max_tokens = j->oai.max_tokens, .expected_out = j->expected_out,
                    .blocks = j->oai.blocks, .n_blocks = j->oai.n_blocks,
                    .user_at = j->oai.user_at, .user_fp = j->oai.user_fp, .full_fp = j->oai.full_fp,
                    .cache_scope = j->cache_scope};
  job_sched_needs(j, &q);
  if (j->oai.cache_off) {
    /* its own "cache_prompt": false: the engine reads it all, wherever it goes (a check's
     * fresh re-ask, a canary asked afresh; a caller's). Planned as a hit, the first token
     * came later than planned and a stream taught a pace of the few tokens planned over
     * the whole prompt's time */
    q.blocks = NULL;
    q.n_blocks = 0;
    q.user_at = -1;
    q.user_fp = q.full_fp = 0;
  }
  if (use == REQ_PREDICT) return q;
  q.avoid = avoid;
  short_fields(gw, j, &q, now);
  if (use != REQ_QUEUED) return q;
  q.avoid = j->avoid;
  q.batch = j->prio == GW_PRIO_BATCH;
  q.take_free = j->take_free;
  q.batch_reserve = j->conf->batch_reserve;
  q.batch_borrow_s = j->conf->batch_borrow_s;
  q.explore = j->conf->explore_cost;
  q.wait_weight_max = j->conf->wait_weight_max;
  q.fill_idle = j->conf->fill_idle;
  /* the time it may still wait to start: its deadline in the queue, which a stream
   * continuing on another phone has cut to its silence limit (job_stream_failed), less a
   * tick (the next pass may come that much later, and expires it first). Such a stream's
   * client waits in silence: it is not kept from the slots kept for short work */
  double left_s = j->deadline_ms > now ? (double)(j->deadline_ms - now) / 1000.0 : 0;
  double tick_s = GW_TICK_MS / 1000.0;
  q.start_by_s = left_s - tick_s > 0.001 ? left_s - tick_s : 0.001;
  if (gw_job_streamed(j)) q.short_reserve = 0;
  double mean;
  /* over half a time constant at least: a model's first request alone is no steady load */
  gw_load_read(&j->model->load, now, j->conf->load_window_s, j->conf->load_window_s / 2, &q.load_erlangs,
               &mean);
  return q;
}

/* ---- shortest work first, deadline check --------------------------------------------------- */

/* The fleet's best for j now (gw_sched_best) over its model's phones (no other fits it),
 * written down when plans are recorded. */
static void job_predict(gw_server *gw, const gw_job *j, uint64_t now, double *svc_best,
                        double *fin_best, int *guess) {
  gw_sched_req q = job_sched_req(gw, j, now, REQ_PREDICT, NULL);
  gw_sched_best(j->model->phones, j->model->n_phones, &q, now, svc_best, fin_best, guess);
  if (gw->planrec)
    gw_planrec_predict(gw->planrec, gw->replicas, gw->n_replicas, &q, now, *svc_best, *fin_best, *guess);
}

/* Refuse j at once (503 deadline_unreachable) when even its earliest predicted finish,
 * divided by deadline_margin, is past its deadline; returns 1 when it did. Never on the
 * word of a replica without learned rates, nor when no replica is usable (one may come
 * back in time). Sets j->ready (shortest work first, queue.h) as it goes. */
static int job_deadline_unreachable(gw_job *j, uint64_t now) {
  gw_server *gw = j->gw;
  double svc, fin;
  int guess;
  job_predict(gw, j, now, &svc, &fin, &guess);
  j->svc_best = svc;
  /* a batch's lines keep their prefix-group order (gw_sched_req.take_free) */
  double k = j->take_free ? 0 : j->conf->aging_factor;
  j->ready = (double)j->arrival_ms + (svc > 0 ? k * svc * 1000.0 : 0);
  if (j->take_free || guess || fin < 0) return 0;
  double left_s = now < j->deadline_ms ? (double)(j->deadline_ms - now) / 1000.0 : 0;
  if (fin / j->conf->deadline_margin <= left_s) return 0;
  gw_metrics_deadline_unreachable(gw);
  job_fail(j, 503, "server_error", "deadline_unreachable", retry_after_s(gw, j->model),
           "no replica can finish this request within its deadline: the earliest predicted "
           "finish is in %.1f s, the deadline in %.1f s",
           fin, left_s);
  return 1;
}

/* ---- attempt outcomes ---------------------------------------------------------------------- */

/* Whether another ready replica could take the rest of a broken stream (its engine must
 * continue a thinking answer's reasoning: job_needs). */
static int other_replica_ready(gw_server *gw, const gw_job *j, const gw_replica *failed) {
  (void)gw;
  unsigned needs = job_needs(j, 1);
  for (size_t i = 0; i < j->model->n_phones; i++) {
    const gw_replica *r = j->model->phones[i];
    if (r == failed || r->state != GW_REPLICA_READY || gw_replica_draining(r)) continue;
    if (gw_replica_serves_features(r, needs, j->oai.choices)) return 1;
  }
  return 0;
}

/* Whether another replica serving the model has a slot free now: a refusal is only
 * checked on a phone that can answer at once (a caller must not wait minutes behind
 * long prompts to hear that its request is bad). */
static int other_replica_free(gw_server *gw, const gw_job *j, const gw_replica *refused,
                              uint64_t now) {
  (void)gw;
  for (size_t i = 0; i < j->model->n_phones; i++) {
    const gw_replica *r = j->model->phones[i];
    if (r == refused) continue;
    if (!gw_replica_serves_features(r, job_needs(j, gw_job_streamed(j)), j->oai.choices)) continue;
    if (r->n_ctx > 0 && j->oai.prompt_tokens + j->oai.max_tokens > r->n_ctx) continue;
    if (gw_replica_wait_ms(r, now) == 0) return 1;
  }
  return 0;
}

static void job_set_last_error(gw_job *j, const char *fmt, ...) {
  if (!j->last_error && !(j->last_error = malloc(GW_LAST_ERROR_MAX))) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->last_error, GW_LAST_ERROR_MAX, fmt, ap);
  va_end(ap);
}

/* What the failure says about the phone: marked (failure count, loading), or not when the
 * gateway itself, an earlier verdict or the request is to blame. */
static void job_charge(gw_job *j, gw_replica *r, gw_fail_kind kind, const char *detail,
                       int not_the_phone, uint64_t now) {
  gw_server *gw = j->gw;
  const char *old = gw_replica_display_state(r);
  int changed;
  if (not_the_phone || kind == GW_FAIL_LOCAL || kind == GW_FAIL_DOWN || kind == GW_FAIL_SLOW) {
    changed = 0; /* the phone is not to blame, already marked, or merely slow */
  } else if (kind == GW_FAIL_LOADING) {
    r->down_until_ms = now + (uint64_t)(gw->conf->cooldown_s * 1000);
    changed = r->state != GW_REPLICA_LOADING;
    /* the agent answers so for an engine that stopped answering a while, too: only a bare
     * engine's says it holds no prompt (pcache.h) */
    gw_replica_engine_loading(r, now, "503 Loading model", !r->ident.agent && !r->pc.agent);
  } else {
    char reason[160];
    snprintf(reason, sizeof(reason), "%s: %s", gw_fail_name(kind), detail);
    changed = gw_replica_failure(r, now, gw->conf->fail_threshold, gw->conf->cooldown_s,
                                 gw->conf->cooldown_max_s, reason);
  }
  if (changed) gw_registry_event(gw, r, old);
}

static void job_log_failure(const gw_job *j, const gw_replica *r, gw_fail_kind kind,
                            const char *detail) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", j->id);
  cJSON_AddStringToObject(f, "replica", r ? r->id : "");
  cJSON_AddStringToObject(f, "reason", gw_fail_name(kind));
  cJSON_AddStringToObject(f, "detail", detail);
  cJSON_AddNumberToObject(f, "attempt", j->attempts);
  cJSON_AddBoolToObject(f, "stream_started", gw_job_streamed(j));
  /* local failures are summed up once per episode (job_wait_for_descriptors) */
  pr_log_kv(kind == GW_FAIL_LOCAL                        ? PR_LOG_DEBUG
            : kind == GW_FAIL_DOWN || kind == GW_FAIL_SLOW ? PR_LOG_INFO
                                                           : PR_LOG_WARN,
            "attempt failed", f);
}

/* A started stream whose phone failed goes on on another phone, the text so far as the
 * assistant's message; only when that is impossible does it end with an error event. */
static void job_stream_failed(gw_job *j, gw_replica *r, int64_t sent, uint64_t now) {
  gw_server *gw = j->gw;
  j->sofar_tokens += sent;
  /* a half-written tool call cannot be handed to another phone to finish */
  if (j->retries_left > 0 && now < j->deadline_ms && !gw->shutting_down && !j->no_continue &&
      j->sofar_tokens < j->oai.max_tokens && other_replica_ready(gw, j, r)) {
    /* the client waits in silence meanwhile: not longer than a stalled stream may */
    uint64_t limit = now + (uint64_t)(j->conf->stream_idle_timeout_s * 1000);
    if (limit < j->deadline_ms) {
      if (!j->deadline_kept_ms) j->deadline_kept_ms = j->deadline_ms; /* given back at its start */
      j->deadline_ms = limit;
    }
    j->retries_left--;
    j->continues++;
    j->avoid = r;
    gw->n_retries++;
    queue_push(gw, j, 1);
    gw_plan_soon(gw);
    return;
  }
  job_fail_stream(j, "the replica serving this stream failed before the answer was complete");
}

/* The gateway ran out of descriptors (every held request costs two: client and phone).
 * The request waits in the queue, at its head and without spending a retry, until an
 * attempt ends and frees one; its deadline still bounds the wait, so the client gets an
 * answer or the usual deadline error, never a dropped request. */
static void job_wait_for_descriptors(gw_job *j, const char *detail, uint64_t now) {
  gw_server *gw = j->gw;
  if (!gw->fd_pressure_until_ms) {
    cJSON *w = cJSON_CreateObject();
    cJSON_AddStringToObject(w, "detail", detail);
    cJSON_AddNumberToObject(w, "queued", (double)gw->queue.len + 1);
    pr_log_kv(PR_LOG_WARN, "out of local resources: new attempts wait for running ones to end", w);
  }
  gw->fd_pressure_until_ms = now + GW_FD_PRESSURE_MS;
  gw->fd_credit = 0;
  j->avoid = NULL;
  queue_push(gw, j, 1); /* the next attempt ending (or the tick's probe) plans again */
}

static void job_attempt_failed(gw_job *j, gw_fail_kind kind, const char *detail) {
  gw_server *gw = j->gw;
  gw_attempt *a = gw_job_running(j);
  gw_replica *r = a ? a->replica : NULL;
  int64_t a_sent = a ? a->sent_tokens : 0;
  uint64_t now = uv_now(gw->loop);
  if (a) gw_attempt_free(a);
  if (gw->fd_pressure_until_ms) gw->fd_credit++; /* its descriptor is free (local: reset below) */
  j->last_fail = kind;
  /* The same request timing out before its first byte on a second phone says more about
   * the request (a prompt or grammar that takes far longer than its size suggests) than
   * about either phone: the second is not charged, and the caller is told. */
  int timed_out_twice = kind == GW_FAIL_TIMEOUT && !gw_job_streamed(j) && j->timeouts++ > 0;
  int cont_refused = j->continuation_refused;
  j->continuation_refused = 0;
  if (!timed_out_twice) gw_metrics_attempt_failed(gw, kind);
  job_set_last_error(j, "%s: %s", r ? r->id : "?", detail);
  if (j->client_gone) {
    job_finish(j, 0);
    return;
  }
  if (r) job_charge(j, r, kind, detail, timed_out_twice || cont_refused, now);
  job_log_failure(j, r, kind, detail);
  gw_attempt *h = gw_job_hedge(j);
  if (h && !gw_job_streamed(j) && !gw->shutting_down) {
    /* the request is on a second phone already: that one goes on, no retry spent */
    log_hedge(j, "hedge_takes_over", h, NULL);
    hedge_take_over(h);
    gw_attempt_rearm(h);
    gw_plan_soon(gw);
    return;
  }
  hedges_drop(j);
  if (gw_job_streamed(j)) {
    job_stream_failed(j, r, a_sent, now);
  } else if (gw->shutting_down) {
    job_fail(j, 503, "server_error", "shutting_down", 5, "the gateway is shutting down");
  } else if (j->held_refusal &&
             (now >= j->deadline_ms || (j->recheck_until_ms && now >= j->recheck_until_ms))) {
    job_answer_refusal(j); /* no phone said otherwise in time: the refusal stands */
  } else if (now >= j->deadline_ms) {
    job_fail(j, 503, "server_error", "deadline_exceeded", retry_after_s(gw, j->model),
             "no replica could answer within the request's deadline (last error: %s)",
             j->last_error ? j->last_error : "");
  } else if (kind == GW_FAIL_LOCAL) {
    job_wait_for_descriptors(j, detail, now);
  } else if (kind == GW_FAIL_SLOW) {
    /* the gateway's own choice, made once per request: no retry is spent */
    j->avoid = r;
    queue_push(gw, j, 1);
    gw_plan_soon(gw);
  } else if (timed_out_twice) {
    j->refused_code = "request_timeout";
    j->refused_by_replica = 1;
    job_fail(j, 504, "server_error", "request_timeout", 0,
             "the request timed out on two replicas before its first byte (last: %s); it is "
             "not tried again", j->last_error ? j->last_error : "");
  } else if (j->retries_left <= 0 && j->held_refusal) {
    job_answer_refusal(j); /* a phone refused it and no other could say otherwise */
  } else if (j->retries_left <= 0) {
    job_fail(j, 502, "server_error", "upstream_failed", 0,
             "all %d attempts failed; last error: %s", j->attempts, j->last_error ? j->last_error : "");
  } else if (!job_deadline_unreachable(j, now)) {
    j->retries_left--;
    j->avoid = r;
    gw->n_retries++;
    gw_metrics_retry(gw, kind);
    queue_push(gw, j, 1);
    gw_plan_soon(gw);
  }
}

/* Answer the caller with the refusal held in j (the phone's reason, our code). */
static void job_answer_refusal(gw_job *j) {
  gw_refusal *f = j->held_refusal;
  j->held_refusal = NULL;
  j->refused_code = f->code;
  j->refused_by_replica = 1;
  snprintf(j->replica_id, sizeof(j->replica_id), "%s", f->replica);
  if (gw_job_streamed(j)) {
    job_end_stream(j, &f->body);
    refusal_free(f);
    return;
  }
  job_respond(j, f->replica, f->status, "application/json", f->body.data, f->body.len);
  job_finish(j, f->status);
  refusal_free(f);
}

/* A phone whose last answers were this many refusals has its further refusals checked. */
#define GW_REFUSALS_IN_ROW 2

/* Whether a phone of j's model other than r, ready, serving what j needs, says a context
 * larger than n_ctx (what r's engine said it has) that holds a prompt of prompt_tokens (the
 * engine's own count) and j's cap. */
static int other_replica_holds(const gw_job *j, const gw_replica *r, int64_t prompt_tokens, int64_t n_ctx) {
  for (size_t i = 0; i < j->model->n_phones; i++) {
    const gw_replica *o = j->model->phones[i];
    if (o == r || o->state != GW_REPLICA_READY || gw_replica_draining(o)) continue;
    if (!gw_replica_serves_features(o, job_needs(j, gw_job_streamed(j)), j->oai.choices)) continue;
    if (o->n_ctx > n_ctx && prompt_tokens + j->oai.max_tokens <= o->n_ctx) return 1;
  }
  return 0;
}

static void job_attempt_refused(gw_job *j, int ambiguous, long status, const char *body, size_t len) {
  gw_server *gw = j->gw;
  gw_attempt *a = gw_job_running(j);
  gw_replica *r = a ? a->replica : NULL;
  int64_t a_sent = a ? a->sent_tokens : 0;
  uint64_t now = uv_now(gw->loop);
  /* the model's output could not be read back (b10587's late 500): the request is tried
   * once more on another phone, and is at fault when that says the same; neither phone is */
  int unparsable = ambiguous == GW_REFUSED_UNPARSABLE;
  /* a prompt longer than this phone's context (b10587 says its count): a phone of a larger
   * context may take it, planned on the engine's count; the phone is not at fault */
  int64_t ctx_prompt = -1, ctx_n = -1;
  int context = gw_verdict_context(body, len, &ctx_prompt, &ctx_n) && ctx_n > 0;
  if (context && ctx_prompt > j->oai.prompt_tokens) j->oai.prompt_tokens = ctx_prompt;
  gw_refusal *f = calloc(1, sizeof(*f));
  if (f) {
    /* a 4xx keeps its status; a 5xx refusal is a bad request all the same */
    f->status = !ambiguous && status >= 400 && status < 500 ? (int)status : 400;
    snprintf(f->replica, sizeof(f->replica), "%s", r ? r->id : "");
    pr_buf_init(&f->body, PR_CAP_ERROR_BODY);
    if (gw_verdict_error_body(body, len, &f->body, &f->code) < 0) {
      refusal_free(f);
      f = NULL;
    }
  }
  if (a) gw_attempt_free(a); /* its slot is free again; the phone is not charged */
  hedges_drop(j); /* the request's own answer: no second phone needed */
  if (gw->fd_pressure_until_ms) gw->fd_credit++;
  j->refusals++;
  /* A phone without a record, or one refusing in a row, is not believed at once: a rogue
   * could turn every request away at no cost. Another phone is asked; if it answers, the
   * refusal is charged (job_attempt_done). */
  int contested = r && !ambiguous && !context &&
                  ((gw->conf->trust_after_answers > 0 &&
                    r->n_ok < (uint64_t)gw->conf->trust_after_answers) ||
                   r->refusals_in_row >= GW_REFUSALS_IN_ROW);
  if (r) r->refusals_in_row++;
  if (f) f->contested = contested;
  if (gw_job_streamed(j)) j->sofar_tokens += a_sent;
  job_set_last_error(j, "%s: refused the request (HTTP %ld)", r ? r->id : "?", status);
  /* settled: a 4xx, a second phone's refusal, or no other phone to ask in time */
  /* (a request that already failed on a phone is not sent round again for this) */
  int again = j->refusals < 2 && f && !j->client_gone && !gw->shutting_down && now < j->deadline_ms &&
              (!gw_job_streamed(j) || (!j->no_continue && j->sofar_tokens < j->oai.max_tokens));
  int check;
  if (unparsable) /* (a whole generation went into it: a busy phone is worth waiting for) */
    check = again && other_replica_ready(gw, j, r);
  else if (context)
    check = again && other_replica_holds(j, r, j->oai.prompt_tokens, ctx_n);
  else
    check = (ambiguous || (contested && j->last_fail == GW_FAIL_NONE)) && again && other_replica_free(gw, j, r, now);
  cJSON *lf = cJSON_CreateObject();
  cJSON_AddStringToObject(lf, "request_id", j->id);
  cJSON_AddStringToObject(lf, "replica", r ? r->id : "");
  cJSON_AddNumberToObject(lf, "status", (double)status);
  cJSON_AddStringToObject(lf, "code", f ? f->code : "request_refused");
  cJSON_AddStringToObject(lf, "decision", check ? "ask_another_replica" : "answer_caller");
  cJSON_AddBoolToObject(lf, "stream_started", gw_job_streamed(j));
  /* the phone's message is not logged: it quotes the caller's messages and tools */
  pr_log_kv(PR_LOG_INFO, "request refused", lf);
  refusal_free(j->held_refusal);
  j->held_refusal = f;
  if (j->client_gone) {
    job_finish(j, 0);
    return;
  }
  if (check) {
    gw_metrics_refusal_check(gw);
    /* the second phone must take it soon, or the refusal stands (plan_expire); one of a
     * larger context, or one to write the answer again, within the deadline */
    j->recheck_until_ms = unparsable || context ? j->deadline_ms
                                                : now + (uint64_t)(j->conf->refusal_window_s * 1000) + 1000;
    j->avoid = r;
    if (gw_job_streamed(j)) j->continues++;
    queue_push(gw, j, 1);
    gw_plan_soon(gw);
    return;
  }
  if (!f) {
    job_fail(j, 502, "server_error", "upstream_failed", 0, "the replica refused the request");
    return;
  }
  job_answer_refusal(j);
}

void gw_jobs_leave_down_replicas(gw_server *gw, uint64_t now) {
  for (gw_job *j = gw->jobs, *next; j; j = next) {
    next = j->anext;
    gw_attempt *a = gw_job_running(j);
    if (!a || a->state == GW_ATT_LEASING || !gw_sink_open(&j->sink) || j->retries_left <= 0 ||
        gw->shutting_down)
      continue;
    gw_replica *r = a->replica;
    if (r->state != GW_REPLICA_DOWN && r->state != GW_REPLICA_LOADING) continue;
    /* an answer still arriving is left to finish: its bytes say more than the probes */
    if (a->state != GW_ATT_SENT && gw_attempt_flowing(a, now)) continue;
    /* a started stream moves only where it can go on (else its watchdogs end it) */
    int streamed = gw_job_streamed(j);
    if (streamed && (j->no_continue || j->sofar_tokens + a->sent_tokens >= j->oai.max_tokens ||
                     now >= j->deadline_ms || !other_replica_ready(gw, j, r)))
      continue;
    /* its health checks failed (or it restarted): what it was given is lost */
    char detail[200];
    const char *state = r->state == GW_REPLICA_DOWN ? "down" : "loading";
    if (streamed)
      snprintf(detail, sizeof(detail), "the replica went %s; its stream was silent for %.1f s "
               "after %" PRId64 " tokens; continued elsewhere", state,
               (double)(now - (a->heard_ms ? a->heard_ms : a->start_ms)) / 1000, a->sent_tokens);
    else
      snprintf(detail, sizeof(detail), "the replica went %s after %.1f s without %s; moved", state,
               (double)(now - a->start_ms) / 1000,
               a->state == GW_ATT_SENT ? "an answer" : "the rest of its answer");
    gw_attempt_cancel(a);
    job_attempt_failed(j, GW_FAIL_DOWN, detail);
  }
}

/* ---- progress reports ------------------------------------------------------------------ */

/* A request moves off its phone when the phone reads its prompt at less than this share
 * of the pace the plan counted on... */
#define GW_SLOW_PACE 0.5
/* ...and another phone would finish it, from scratch, in at most this share of the time
 * the slow one still needs. */
#define GW_MOVE_GAIN 0.6

/* The attempt on r that the agent knows as request id rid, or NULL: also when two of
 * them share it (a client may send the same x-request-id twice). */
static gw_attempt *attempt_on(gw_replica *r, const char *rid) {
  gw_attempt *hit = NULL;
  for (int i = 0; i < GW_MAX_SLOTS; i++) {
    gw_attempt *a = r->leases[i].owner;
    if (!r->leases[i].id || !a || !a->job || strcmp(a->job->id, rid) != 0) continue;
    if (hit && hit != a) return NULL; /* (a request of several choices holds several) */
    hit = a;
  }
  return hit;
}

/* The paces the plan counted on for a (tokens/s; -1 unknown): the replica's rates as
 * the plan used them, slowdown included. */
static double planned_prefill_tps(const gw_job *j, const gw_attempt *a) {
  double tokens = (double)(j->oai.prompt_tokens - a->pred_cached);
  return tokens > 0 && a->pred_prefill_s > 0 ? tokens / a->pred_prefill_s : -1;
}

static double planned_decode_tps(const gw_job *j, const gw_attempt *a) {
  double out = j->expected_out < (double)j->oai.max_tokens ? j->expected_out : (double)j->oai.max_tokens;
  double s = a->pred_service_s - a->pred_prefill_s;
  return out > 0 && s > 0 ? out / s : -1;
}

/* Seconds the phone still needs for this request at the pace it reports. */
static double remaining_here_s(const gw_job *j, const gw_attempt *a, double plan_prefill) {
  return gw_predict_remaining_s(a->prog, j->oai.max_tokens, j->expected_out, plan_prefill,
                                planned_decode_tps(j, a));
}

/* Whether j, on a's phone, is a candidate to move: waiting for its first byte on a phone
 * that reads its prompt at less than GW_SLOW_PACE of the pace its plan counted on. */
static int move_candidate(const gw_server *gw, const gw_job *j, const gw_attempt *a, uint64_t now) {
  if (a->role != GW_ATT_RUNNING || gw_job_hedge(j) || j->pin[0] || a->state != GW_ATT_SENT || gw_job_streamed(j) ||
      !gw_sink_open(&j->sink) || j->moved_slow || gw->shutting_down || now >= j->deadline_ms)
    return 0;
  double plan = planned_prefill_tps(j, a);
  return a->prog->prefill_tps > 0 && plan > 0 && a->prog->prompt_tokens > 0 &&
         a->prog->prefill_tps < plan * GW_SLOW_PACE;
}

static void log_move(const gw_job *j, const gw_attempt *a, double plan, double here,
                     const gw_replica *to, double finish_s) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", j->id);
  cJSON_AddStringToObject(f, "decision", "move");
  cJSON_AddStringToObject(f, "replica", a->replica->id);
  cJSON_AddNumberToObject(f, "prefill_tps", round(a->prog->prefill_tps * 10) / 10);
  cJSON_AddNumberToObject(f, "planned_prefill_tps", round(plan * 10) / 10);
  cJSON_AddNumberToObject(f, "remaining_here_s", round(here * 1000) / 1000);
  cJSON_AddStringToObject(f, "to_replica", to->id);
  cJSON_AddNumberToObject(f, "predicted_finish_s", round(finish_s * 1000) / 1000);
  pr_log_kv(PR_LOG_INFO, "routing", f);
}

/* Plan the candidates elsewhere together (so two of them do not count on the same free
 * slot) and move each that would finish there in at most GW_MOVE_GAIN of its time here. */
static void move_off_slow(gw_server *gw, gw_replica *r, gw_attempt **cand, int n, uint64_t now) {
  gw_sched_req q[GW_MAX_SLOTS] = {{0}};
  gw_sched_choice ch[GW_MAX_SLOTS];
  gw_job *jobs[GW_MAX_SLOTS];
  double here[GW_MAX_SLOTS], plan[GW_MAX_SLOTS];
  for (int i = 0; i < n; i++) {
    gw_job *j = cand[i]->job;
    jobs[i] = j;
    plan[i] = planned_prefill_tps(j, cand[i]);
    here[i] = remaining_here_s(j, cand[i], plan[i]);
    q[i] = job_sched_req(gw, j, now, REQ_MOVE, r); /* a move leaves short work's slots to it too */
  }
  gw_sched_plan_with(gw->sched, gw->replicas, gw->n_replicas, q, (size_t)n, now, ch);
  if (gw->planrec) gw_planrec_plan(gw->planrec, GW_PLANREC_MOVE, gw->replicas, gw->n_replicas, q, (size_t)n, now, ch);
  for (int i = 0; i < n; i++) {
    if (ch[i].replica < 0 || gw->replicas[ch[i].replica] == r || ch[i].finish_s > here[i] * GW_MOVE_GAIN)
      continue;
    gw_attempt *a = cand[i];
    gw_job *j = jobs[i];
    const gw_replica *to = gw->replicas[ch[i].replica];
    log_move(j, a, plan[i], here[i], to, ch[i].finish_s);
    char detail[200];
    snprintf(detail, sizeof(detail),
             "the replica reads the prompt at %.0f tokens/s (planned %.0f): %.1f s left there, "
             "%.1f s on %s; moved", a->prog->prefill_tps, plan[i], here[i], ch[i].finish_s, to->id);
    j->moved_slow = 1;
    gw_attempt_cancel(a);
    job_attempt_failed(j, GW_FAIL_SLOW, detail);
  }
}

static void jobs_progress(gw_server *gw, gw_replica *r, const cJSON *running, uint64_t now);

void gw_jobs_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  if (ev->kind == GW_FLEET_PROGRESS) jobs_progress(gw, ev->r, ev->running, ev->now_ms);
  if (ev->kind == GW_FLEET_ADDED) gw_plan_soon(gw); /* new capacity for what waits */
}

static void jobs_progress(gw_server *gw, gw_replica *r, const cJSON *running, uint64_t now) {
  if (!cJSON_IsArray(running)) return;
  gw_attempt *seen[GW_MAX_SLOTS], *cand[GW_MAX_SLOTS];
  const cJSON *entry[GW_MAX_SLOTS];
  int n_seen = 0, n_cand = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, running) {
    if (n_seen == GW_MAX_SLOTS) break;
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(e, "request_id");
    gw_attempt *a = cJSON_IsString(rid) ? attempt_on(r, rid->valuestring) : NULL;
    if (!a) continue;
    seen[n_seen] = a;
    entry[n_seen++] = e;
  }
  for (int i = 0; i < n_seen; i++) {
    gw_attempt *a = seen[i];
    int twice = 0; /* two entries with one id: the other is someone else's request */
    for (int k = 0; k < n_seen && !twice; k++) twice = k != i && seen[k] == a;
    if (twice || (!a->prog && !(a->prog = malloc(sizeof(*a->prog))))) continue;
    e = entry[i];
    gw_progress *p = a->prog;
    /* unknown: -1; a pace of 0 counts as unknown too (every use wants one > 0) */
    p->prompt_tokens = (int64_t)pr_json_num_or(e, "prompt_tokens", 0, 1e12, -1);
    p->prompt_done = (int64_t)pr_json_num_or(e, "prompt_done", 0, 1e12, -1);
    p->decoded = (int64_t)pr_json_num_or(e, "decoded", 0, 1e12, -1);
    p->prefill_tps = pr_json_num_or(e, "prefill_tps", 0, 1e9, -1);
    p->decode_tps = pr_json_num_or(e, "decode_tps", 0, 1e9, -1);
    if (p->decoded < 0) p->decoded = 0;
    if (p->prompt_done < 0 || p->prompt_tokens < 0) p->prefill_tps = -1; /* no use */
    /* a phone reading a prompt at under half its learned pace changed (hot, throttled,
     * busy with something else): believed now, not when this long prompt is done */
    if (p->prefill_tps > 0 && p->prompt_done < p->prompt_tokens && p->prefill_tps < r->prefill_tps * GW_SLOW_PACE)
      gw_replica_observe(r, 1000.0, 1000.0 * 1000.0 / p->prefill_tps, 0, 0);
    if (move_candidate(gw, a->job, a, now)) cand[n_cand++] = a;
  }
  if (n_cand) move_off_slow(gw, r, cand, n_cand, now);
}

static void job_attempt_done(gw_job *j) {
  gw_attempt *a = gw_job_running(j);
  hedges_drop(j);
  if (j->gw->fd_pressure_until_ms) {
    j->gw->fd_credit++;
    gw_plan_soon(j->gw);
  }
  if (a) {
    gw_replica *r = a->replica;
    const char *old = gw_replica_display_state(r);
    uint64_t now = uv_now(j->gw->loop);
    j->service_ms = now > a->start_ms ? now - a->start_ms : 0; /* capsvc.c: the answers' variability */
    r->refusals_in_row = 0;
    gw_refusal *f = j->held_refusal;
    if (f && f->contested && strcmp(f->replica, r->id) != 0) {
      /* another phone answered what it refused: the refusal was the phone's failure */
      gw_replica *rr = gw_registry_find(j->gw, f->replica);
      f->contested = 0;
      if (rr) {
        gw_metrics_attempt_failed(j->gw, GW_FAIL_STATUS);
        job_charge(j, rr, GW_FAIL_STATUS, "its refusal was contradicted by another replica", 0,
                   uv_now(j->gw->loop));
      }
    }
    /* a shadow request's answer is no good answer toward a record (verify.c) */
    if (j->shadow ? gw_replica_answered(r, uv_now(j->gw->loop)) : gw_replica_success(r, uv_now(j->gw->loop))) {
      snprintf(r->state_reason, sizeof(r->state_reason), "a request succeeded: probation over");
      gw_registry_event(j->gw, r, old);
    }
    if (gw_job_streamed(j) && !j->shadow && j->gw->answered) j->gw->answered(j->gw, j, r->id, NULL, 0);
    gw_attempt_free(a);
  }
  job_finish(j, 0);
}

/* ---- the client side --------------------------------------------------------------------- */

/* The client went away (the sink has closed). While an attempt runs this can be inside
 * a curl callback (a write to a dead socket), so the transfer is cancelled at the end of
 * the loop turn, not from here; nothing reaches the client meanwhile. */
static void job_client_gone(void *owner) {
  gw_job *j = owner;
  j->client_gone = 1;
  if (j->state == GW_JOB_RUNNING || j->state == GW_JOB_STREAMING) job_finish_soon(j);
  else job_finish(j, 0);
}

static void job_client_drained(void *owner) {
  gw_job *j = owner;
  gw_attempt *a = gw_job_running(j);
  if (a) gw_attempt_resume(a);
}

/* ---- the answer, as upstream.c hands it over --------------------------------------------- */

/* A whole answer with the request's id and the replica that gave it. */
static void job_respond(gw_job *j, const char *replica_id, int status, const char *ctype,
                        const char *body, size_t len) {
  char h1[160], h2[192];
  snprintf(h1, sizeof(h1), "x-request-id: %s", j->id);
  snprintf(h2, sizeof(h2), "x-fleetgate-replica: %s", replica_id);
  const char *hdrs[] = {h1, h2, NULL};
  j->status = status;
  j->ttfb_ms = uv_now(j->gw->loop);
  /* a caller's answer: verification notes who gave it, and may check it (verify.c) */
  if (status == 200 && !j->shadow && j->gw->answered) j->gw->answered(j->gw, j, replica_id, body, len);
  if (j->resp && status == 200) {
    /* a Response, from the chat completion */
    pr_buf out;
    pr_buf_init(&out, PR_CAP_ANSWER + 4096);
    if (gw_resp_whole(j->resp, body, len, &out) == 0)
      gw_sink_respond(&j->sink, status, hdrs, ctype, out.data, out.len);
    else
      gw_sink_error(&j->sink, j->id, 502, "server_error", NULL, "upstream_failed", 0,
                    "the replica's answer could not be made a Response");
    pr_buf_free(&out);
    return;
  }
  gw_sink_respond(&j->sink, status, hdrs, ctype, body, len);
}


static int job_stream_begin(gw_job *j, const char *replica_id) {
  if (!gw_sink_open(&j->sink)) return -1;
  if (gw_job_streamed(j)) return 0;
  char h1[160], h2[192];
  snprintf(h1, sizeof(h1), "x-request-id: %s", j->id);
  snprintf(h2, sizeof(h2), "x-fleetgate-replica: %s", replica_id);
  const char *hdrs[] = {h1, h2, "Cache-Control: no-cache", "X-Accel-Buffering: no", NULL};
  if (gw_sink_stream_start(&j->sink, hdrs, "text/event-stream") < 0) return -1;
  job_move(j, GW_JOB_STREAMING);
  j->status = 200;
  j->ttfb_ms = uv_now(j->gw->loop);
  return 0;
}

static int job_stream_event(gw_job *j, const char *replica_id, const char *payload, size_t len) {
  if (job_stream_begin(j, replica_id) < 0) return 1;
  pr_buf ev;
  pr_buf_init(&ev, len * 4 + PR_CAP_SSE_EVENT);
  /* a Responses stream: the chunk's events (none for a chunk that says nothing) */
  int rc = j->resp ? gw_resp_chunk(j->resp, payload, len, &ev) : pr_sse_write_data(&ev, payload, len);
  if (!rc && !ev.len) {
    pr_buf_free(&ev);
    return !gw_sink_open(&j->sink);
  }
  if (!rc) rc = gw_sink_write(&j->sink, ev.data, ev.len) < 0;
  pr_buf_free(&ev);
  return rc || !gw_sink_open(&j->sink);
}

static int job_stream_comment(gw_job *j, const char *replica_id, const char *text, size_t len) {
  if (job_stream_begin(j, replica_id) < 0) return 1;
  pr_buf ev;
  pr_buf_init(&ev, len + 8);
  int rc = pr_buf_append(&ev, ":", 1) || pr_buf_append(&ev, text, len) ||
           pr_buf_append(&ev, "\n\n", 2) || gw_sink_write(&j->sink, ev.data, ev.len) < 0;
  pr_buf_free(&ev);
  return rc || !gw_sink_open(&j->sink);
}

static int job_note_chunk(gw_job *j, const char *id, const char *text, const char *reasoning, int tool_calls) {
  if (!j->stream_id[0] && id) snprintf(j->stream_id, sizeof(j->stream_id), "%s", id);
  if (tool_calls) j->no_continue = 1;
  /* past its cap (bounds.h: a function of the request's max_tokens; content and reasoning
   * together) the text is more than any honest phone sends for this request: that phone
   * failed, and the answer so far is not known whole, so no other phone goes on with it */
  size_t add = (text ? strlen(text) : 0) + (reasoning ? strlen(reasoning) : 0);
  if (add && (j->sofar.len + j->sofar_reasoning.len + add > j->sofar.max ||
              (text && pr_buf_append_str(&j->sofar, text)) ||
              (reasoning && pr_buf_append_str(&j->sofar_reasoning, reasoning)))) {
    j->no_continue = 1;
    return 1;
  }
  return 0;
}

static int job_client_behind(gw_job *j) { return gw_sink_behind(&j->sink); }

static void job_stream_end(gw_job *j) { gw_sink_stream_end(&j->sink); }

static void job_client_stalled(gw_job *j) {
  j->client_gone = 1;
  job_set_last_error(j, "the client stopped reading for %.0f s", j->conf->send_timeout_s);
  gw_sink_abort(&j->sink);
  job_finish(j, 0);
}

/* The models served that caller may use (all of them without a restricted key). */
static void models_served(gw_server *gw, const gw_caller *caller, pr_buf *out) {
  for (size_t i = 0; i < gw->n_replicas; i++) {
    gw_replica *r = gw->replicas[i];
    for (size_t k = 0; k < r->n_models; k++) {
      int seen = !gw_auth_model_allowed(caller, r->models[k]);
      for (size_t p = 0; p < i && !seen; p++)
        if (gw_replica_serves(gw->replicas[p], r->models[k])) seen = 1;
      for (size_t q = 0; q < k && !seen; q++)
        if (strcmp(r->models[q], r->models[k]) == 0) seen = 1;
      if (!seen) pr_buf_text(out, "%s%s", out->len ? ", " : "", r->models[k]); /* cut: fewer named */
    }
  }
}

/* Refuse the request as its own fault (a 4xx with our code and the field at fault). */
static void job_refuse(gw_job *j, int status, const char *param, const char *code,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void job_refuse(gw_job *j, int status, const char *param, const char *code,
                       const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  j->refused_code = code ? code : "invalid_request";
  gw_sink_error(&j->sink, j->id, status, "invalid_request_error", param, code, 0, msg);
  job_finish(j, status);
}

/* More than one choice ("n"): only a phone whose engine writes that many at once, each on
 * a slot of its own, takes it (the planner's step_choices). Refused (400, returns 1) when
 * no phone of its model does; while one of them is still being asked what its engine
 * serves (or none serves the model yet) it waits, and each planning pass looks again
 * (gw->choices_unsure). Gateways sharing Redis lease one slot per request: refused. */
static int job_choices_refused(gw_job *j) {
  gw_server *gw = j->gw;
  if (j->oai.choices <= 1) return 0;
  int most = 1, unsure = j->model->n_phones == 0;
  for (size_t i = 0; i < j->model->n_phones; i++) {
    const gw_replica *r = j->model->phones[i];
    int k = r->choices_max < r->slots ? r->choices_max : r->slots;
    if (!r->feat_known) unsure = 1;
    else if ((r->features & PR_FEAT_CHOICES) && k > most) most = k;
  }
  const char *name = cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j->oai.root, "n")) ? "n" : "n_cmpl";
  if (gw->shared) {
    job_refuse(j, 400, name, "unsupported_value",
               "Invalid '%s': gateways that share Redis answer one choice per request (got %d); "
               "send one request per choice.", name, j->oai.choices);
    return 1;
  }
  if (j->oai.choices <= most) return 0;
  if (unsure) {
    gw->choices_unsure = 1;
    return 0;
  }
  job_refuse(j, 400, name, "unsupported_value",
             "Invalid '%s': no replica serving the model `%s` writes more than %d choice%s at once "
             "(got %d); send fewer, or one request per choice.", name, j->oai.model, most,
             most == 1 ? "" : "s", j->oai.choices);
  return 1;
}

static gw_job *job_new(gw_server *gw, const char *id, const char *path) {
  gw_job *j = calloc(1, sizeof(*j));
  if (!j) return NULL;
  j->pred_cached = -1; /* no answer yet */
  j->gw = gw;
  j->defer.kind = GW_DEFER_JOB;
  j->conf = gw_config_ref(gw->conf);
  j->state = GW_JOB_ADMITTING;
  pr_buf_init(&j->sofar, PR_CAP_STREAM_TEXT);
  pr_buf_init(&j->sofar_reasoning, PR_CAP_STREAM_TEXT);
  gw->jobs_alive++;
  j->anext = gw->jobs;
  if (gw->jobs) gw->jobs->aprev = j;
  gw->jobs = j;
  snprintf(j->id, sizeof(j->id), "%s", id);
  snprintf(j->path, sizeof(j->path), "%s", path);
  uv_timer_init(gw->loop, &j->watchdog);
  j->watchdog.data = j;
  j->arrival_ms = uv_now(gw->loop);
  return j;
}

/* The key, the body and the gateway's own headers. Returns 0, or the job was answered. */
static int job_read_request(gw_job *j, pr_http_req *req, const char **prio) {
  gw_server *gw = j->gw;
  const gw_config *c = j->conf;
  if (c->n_keys) {
    const char *why = NULL;
    j->caller = gw_auth_identify(gw, req, &why);
    if (!j->caller) {
      job_fail(j, 401, "invalid_request_error", "invalid_api_key", 0, "%s",
               strcmp(why, "missing") == 0
                   ? "You didn't provide an API key. Send it as `Authorization: Bearer KEY`."
                   : "Incorrect API key provided.");
      return -1;
    }
  }
  pr_oai_kind kind = strcmp(j->path, "/v1/completions") == 0 ? PR_OAI_COMPLETION : PR_OAI_CHAT;
  pr_oai_error oe;
  memset(&oe, 0, sizeof(oe));
  const char *body = req->body.data ? req->body.data : "";
  size_t body_len = req->body.len;
  pr_buf chat;
  pr_buf_init(&chat, PR_CAP_ANSWER);
  if (strcmp(j->path, "/v1/responses") == 0) {
    /* the Responses API: a chat completion from here on, answered as a Response */
    char hex[48];
    size_t n = 0;
    for (const char *p = j->id; *p && n + 1 < sizeof(hex); p++)
      if (isalnum((unsigned char)*p)) hex[n++] = *p;
    hex[n] = '\0';
    j->resp = malloc(sizeof(*j->resp));
    if (!j->resp || gw_resp_translate(j->resp, body, body_len, hex, (int64_t)time(NULL), &chat, &oe) < 0) {
      pr_buf_free(&chat);
      if (!j->resp) pr_oai_error_set(&oe, 500, "server_error", NULL, NULL, "out of memory");
      if (oe.status >= 500) job_fail(j, oe.status, "server_error", oe.code, 0, "%s", oe.message);
      else job_refuse(j, oe.status ? oe.status : 400, oe.param[0] ? oe.param : NULL, oe.code, "%s", oe.message);
      return -1;
    }
    snprintf(j->path, sizeof(j->path), "/v1/chat/completions");
    body = chat.data ? chat.data : "";
    body_len = chat.len;
  }
  int bad = pr_oai_parse(&j->oai, kind, body, body_len, &oe) < 0 || pr_oai_check_fleet(&j->oai, &oe) < 0;
  pr_buf_free(&chat);
  if (bad) {
    if (oe.status >= 500) {
      job_fail(j, oe.status, "server_error", oe.code, 0, "%s", oe.message);
      return -1;
    }
    job_refuse(j, oe.status ? oe.status : 400, oe.param[0] ? oe.param : NULL, oe.code, "%s", oe.message);
    return -1;
  }
  /* From here on the parsed tree is the request: the body as received and the rendered
   * prompt text are not read again, and a held request (a 7,000-token review waits
   * minutes) should not keep either (each ~28 KB for a fraud review). */
  pr_http_req_free_body(req); /* and its bytes go back to the body budget */
  pr_oai_drop_prompt(&j->oai);
  /* priority class and deadline */
  *prio = pr_http_header_get(req, "x-fleetgate-priority");
  if (*prio && strcasecmp(*prio, "batch") == 0) j->prio = GW_PRIO_BATCH;
  else if (*prio && strcasecmp(*prio, "interactive") != 0) {
    job_refuse(j, 400, NULL, "invalid_priority", "x-fleetgate-priority must be \"interactive\" or \"batch\"");
    return -1;
  }
  double timeout_s = c->queue_timeout_s;
  const char *tmo = pr_http_header_get(req, "x-fleetgate-timeout");
  if (tmo) {
    char *end;
    double t = strtod(tmo, &end);
    if (end == tmo || *end || !(t > 0) || !isfinite(t)) {
      job_refuse(j, 400, NULL, "invalid_timeout", "x-fleetgate-timeout must be a positive number of seconds");
      return -1;
    }
    if (t < timeout_s) timeout_s = t;
  }
  j->deadline_ms = j->arrival_ms + (uint64_t)(timeout_s * 1000.0);
  j->retries_left = c->retries;
  return 0;
}

/* Some replica serves the model, and prompt + cap fit the largest context among them;
 * the cap sent upstream is settled. Returns 0, or the job was answered. */
static int job_fit(gw_job *j) {
  gw_server *gw = j->gw;
  const gw_config *c = j->conf;
  const char *model = j->oai.model;
  /* a key limited to some models is refused any other before it could learn whether
   * the fleet serves it */
  if (!gw_auth_model_allowed(j->caller, model)) {
    job_fail(j, 403, "permission_error", "model_not_allowed", 0,
             "the key `%s` may not use the model `%s`", j->caller->conf->name, model);
    return -1;
  }
  /* a model no phone lists is refused, unless the config names it: its requests wait for
   * a phone (until their deadline) */
  gw_model *m = gw_models_find(&gw->models, model);
  if (!gw_model_known(m)) {
    pr_buf list;
    pr_buf_init(&list, PR_CAP_ERROR_BODY);
    models_served(gw, j->caller, &list);
    job_refuse(j, 404, NULL, "model_not_found",
               "The model `%s` does not exist or is not served by this fleet. Models served: %s",
               model, list.len ? pr_buf_cstr(&list) : "(none)");
    pr_buf_free(&list);
    return -1;
  }
  j->model = m;
  gw_model_ref(m);
  m->used_ms = uv_now(gw->loop);
  /* the largest context of its phones; unknown while one does not say, or none serves it */
  int ctx_unknown = m->n_phones == 0;
  int64_t max_ctx = 0;
  for (size_t i = 0; i < m->n_phones; i++) {
    const gw_replica *r = m->phones[i];
    if (r->n_ctx <= 0) ctx_unknown = 1;
    else if (r->n_ctx > max_ctx) max_ctx = r->n_ctx;
  }
  if (job_choices_refused(j)) return -1;
  /* always send a cap: llama-server's default is unlimited */
  int64_t cap = j->oai.max_tokens;
  if (cap <= 0) {
    cap = c->default_max_tokens;
    if (!ctx_unknown && max_ctx - j->oai.prompt_tokens < cap) cap = max_ctx - j->oai.prompt_tokens;
  }
  if (!ctx_unknown && (cap <= 0 || j->oai.prompt_tokens + cap > max_ctx)) {
    job_refuse(j, 400, "messages", "context_length_exceeded",
               "This model's maximum context length is %" PRId64 " tokens. However, you "
               "requested about %" PRId64 " tokens (%" PRId64 " in the prompt, %" PRId64
               " for the completion).", max_ctx, j->oai.prompt_tokens + (cap > 0 ? cap : 0),
               j->oai.prompt_tokens, cap > 0 ? cap : 0);
    return -1;
  }
  pr_oai_set_max_tokens(&j->oai, cap);
  /* a stream of several choices interleaves them: no single text so far to hand on */
  if (j->oai.choices > 1) j->no_continue = 1;
  j->sofar.max = gw_text_cap(cap, PR_CAP_STREAM_TEXT); /* the text a stream may carry... */
  j->sofar_reasoning.max = j->sofar.max;                 /* (both parts together: job_note_chunk) */
  j->expected_out = gw_model_expect_out(&gw->models, m, cap, c->expected_output_tokens);
  return 0;
}

void gw_job_start(gw_server *gw, pr_http_req *req, const char *path) {
  char id[128];
  gw_request_id(gw, req, id, sizeof(id));
  gw->n_requests++;
  if (gw->shutting_down) {
    gw_respond_error(req, id, 503, "server_error", NULL, "shutting_down", 5,
                     "the gateway is shutting down");
    return;
  }
  gw_job *j = job_new(gw, id, path);
  if (!j) {
    gw_respond_error(req, id, 500, "server_error", NULL, NULL, 0, "out of memory");
    return;
  }
  gw_sink_client(&j->sink, req, j, job_client_gone, job_client_drained);
  const char *prio = NULL;
  if (job_read_request(j, req, &prio) < 0 || job_fit(j) < 0) return;
  job_admit(j, prio != NULL);
}

/* Admission against the caller's key (models, class, concurrency; the per-minute budgets
 * in Redis when the gateways share state, else here), then the queue. */
static void job_admit(gw_job *j, int prio_asked) {
  gw_server *gw = j->gw;
  if (j->caller) {
    /* without the header a request runs in its key's class */
    if (!prio_asked && j->caller->conf) j->prio = j->caller->conf->priority;
    /* models, class and concurrency here; the per-minute budgets in Redis when the
     * gateways share state, else here */
    int shared = gw_shared_usable(gw);
    /* Redis away: this gateway's share of the per-minute budgets, from the start */
    if (!job_admit_local(j, shared ? 0 : gw_shared_degraded(gw) ? 2 : 1)) return;
    if (shared && gw_shared_admit(gw, j, gw_job_admit_result) == 0) return; /* it goes on there */
    if (shared && !job_admit_local(j, gw_shared_degraded(gw) ? 2 : 1)) return;
  }
  job_enqueue(j);
}

gw_sink *gw_job_start_line(gw_server *gw, const gw_job_line *l) {
  gw->n_requests++;
  gw_job *j = job_new(gw, l->id, l->path);
  gw_sink s;
  if (!j) {
    /* the sink was never opened on a job: answer through a sink of our own */
    gw_sink_attach(&s, l->ops, l->ctx, NULL, NULL, NULL);
    gw_sink_error(&s, l->id, 500, "server_error", NULL, NULL, 0, "out of memory");
    return NULL;
  }
  gw_sink_attach(&j->sink, l->ops, l->ctx, j, job_client_gone, job_client_drained);
  if (gw->shutting_down) {
    job_fail(j, 503, "server_error", "shutting_down", 5, "the gateway is shutting down");
    return NULL;
  }
  j->caller = l->caller;
  j->prio = GW_PRIO_BATCH;
  j->take_free = 1; /* a batch's lines come in prefix-group order: see gw_sched_req */
  j->shadow = l->shadow;
  j->shadow_scope = l->cache_scope;
  if (l->pin) snprintf(j->pin, sizeof(j->pin), "%s", l->pin);
  pr_oai_kind kind = strcmp(j->path, "/v1/completions") == 0 ? PR_OAI_COMPLETION : PR_OAI_CHAT;
  pr_oai_error oe;
  memset(&oe, 0, sizeof(oe));
  if (pr_oai_parse(&j->oai, kind, l->body, l->len, &oe) < 0 || pr_oai_check_fleet(&j->oai, &oe) < 0) {
    if (oe.status >= 500)
      job_fail(j, oe.status, "server_error", oe.code, 0, "%s", oe.message);
    else
      job_refuse(j, oe.status ? oe.status : 400, oe.param[0] ? oe.param : NULL, oe.code, "%s", oe.message);
    return NULL;
  }
  pr_oai_drop_prompt(&j->oai);
  if (j->oai.stream && !j->shadow) {
    job_refuse(j, 400, "stream", "stream_not_supported", "a batch line cannot stream its answer");
    return NULL;
  }
  j->deadline_ms = l->deadline_ms > j->arrival_ms ? l->deadline_ms : j->arrival_ms + 1;
  j->retries_left = j->conf->retries;
  if (job_fit(j) < 0) return NULL;
  job_admit(j, 1);
  return gw_sink_open(&j->sink) ? &j->sink : NULL;
}

/* Admission against the caller's key: rates 0 skips the per-minute budgets, 1 counts
 * them here, 2 counts them here with this gateway's share (Redis away). Returns 1 when
 * admitted; else the job has been answered. */
static int job_admit_local(gw_job *j, int rates) {
  gw_server *gw = j->gw;
  char msg[256];
  const char *code = NULL;
  int retry = 0;
  unsigned share = rates == 2 ? gw_shared_gateways(gw) : 1;
  int st = gw_auth_admit(gw, j->caller, j->oai.model, &j->prio, &retry, &code, msg, sizeof(msg),
                         rates ? share : 0, j->admitted);
  if (st) {
    job_fail(j, st,
             st == 429 ? "rate_limit_error" : st == 403 ? "permission_error" : "invalid_request_error",
             code, retry, "%s", msg);
    return 0;
  }
  j->admitted = 1;
  return 1;
}

/* Into the queue (bounded per model), in fair-queueing order, shortest work first
 * within the caller's share; a deadline no replica can meet is refused here. */
static void job_enqueue(gw_job *j) {
  gw_server *gw = j->gw;
  const gw_config *c = j->conf;
  const char *model = j->oai.model;
  if (gw->job_demand) gw->job_demand(gw, j, 0);
  /* whose prompts it may reuse on a phone: its key's scope, kept for its whole life */
  j->cache_scope = j->shadow ? j->shadow_scope
                  : !j->caller ? GW_CACHE_SCOPE_OPEN
                  : j->caller->conf ? j->caller->conf->scope_id
                                    : gw_cache_scope_id(j->caller->name); /* a key removed since: its own */
  if (j->model->queued >= c->queue_max) {
    job_fail(j, 429, "rate_limit_error", "queue_full", retry_after_s(gw, j->model),
             "the queue for model `%s` is full (%zu waiting); retry later", model, c->queue_max);
    return;
  }
  if (job_deadline_unreachable(j, uv_now(gw->loop))) return;
  gw_queue_tag(&gw->queue, j);
  queue_push(gw, j, 0);
  gw_plan_soon(gw);
}

void gw_job_admit_result(gw_job *j, int ok, const char *which, double rpm_tokens,
                         double tpm_tokens) {
  if (j->state == GW_JOB_DONE) return;
  if (ok < 0) {
    /* Redis failed: decide with this gateway's share of the budgets */
    if (!job_admit_local(j, 2)) return;
  } else if (!ok) {
    const gw_key_conf *k = j->caller->conf;
    int tpm = which && strcmp(which, "tpm") == 0;
    double rate = k ? (tpm ? k->tpm : k->rpm) : 0;
    double missing = tpm ? 1 - tpm_tokens : 1 - rpm_tokens;
    int retry = rate > 0 ? (int)ceil(missing * 60.0 / rate) : 1;
    if (retry < 1) retry = 1;
    j->caller->n_limited++;
    job_fail(j, 429, "rate_limit_error", "rate_limit_exceeded", retry,
             "rate limit reached for %s per minute on key `%s` (across all gateways): limit %g",
             tpm ? "tokens" : "requests", j->caller->name, rate);
    return;
  }
  job_enqueue(j);
}

static void job_lease_denied(gw_job *j) {
  /* full elsewhere: not a failure of the phone, nor an attempt used up */
  gw_attempt *a = gw_job_running(j);
  hedges_drop(j);
  if (a) gw_attempt_free(a);
  j->attempts--;
  if (j->client_gone) {
    job_finish(j, 0);
    return;
  }
  queue_push(j->gw, j, 1);
  gw_plan_soon(j->gw);
}

/* ---- planning ------------------------------------------------------------------------------ */

/* The shutdown deadline: every job still alive is answered now — queued ones and whole
 * answers with 503, started streams with an error event. */
static void jobs_abandon(gw_server *gw, int shadows_only) {
  gw_job *j = gw->jobs;
  while (j) {
    gw_job *next = j->anext;
    if (j->state != GW_JOB_DONE && (!shadows_only || j->shadow)) {
      gw_attempt *a = gw_job_running(j);
      if (a) {
        if (gw_job_streamed(j)) j->sofar_tokens += a->sent_tokens;
        gw_attempt_free(a);
      }
      if (gw_job_streamed(j))
        job_fail_stream(j, "the gateway is shutting down");
      else
        job_fail(j, 503, "server_error", "shutting_down", 5, "the gateway is shutting down");
    }
    j = next;
  }
}

void gw_jobs_abandon(gw_server *gw) { jobs_abandon(gw, 0); }

/* A shutdown's start: the checks' shadow requests (no caller waits for them) end now,
 * undecided, instead of holding the shutdown until they are done. */
void gw_jobs_abandon_shadows(gw_server *gw) { jobs_abandon(gw, 1); }

void gw_queue_flush(gw_server *gw, int status, const char *message) {
  for (int p = 0; p < GW_PRIO_COUNT; p++) {
    while (gw->queue.head[p]) {
      gw_job *j = gw->queue.head[p];
      queue_remove(gw, j);
      if (gw_job_streamed(j))
        job_fail_stream(j, message); /* a stream waiting to continue */
      else
        job_fail(j, status, "server_error", "shutting_down", 5, "%s", message);
    }
  }
}

static void plan_expire(gw_server *gw, uint64_t now) {
  int unsure = gw->choices_unsure;
  gw->choices_unsure = 0; /* set again by a request that still waits to know */
  for (int p = 0; p < GW_PRIO_COUNT; p++) {
    gw_job *j = gw->queue.head[p];
    while (j) {
      gw_job *next = j->qnext;
      if (unsure && j->oai.choices > 1 && !gw_job_streamed(j) && j->attempts == 0 && job_choices_refused(j)) {
        /* (refused: what its model's phones serve is known now) */
      } else if (j->held_refusal && (now >= j->deadline_ms || now >= j->recheck_until_ms)) {
        /* no other phone took it in time to say otherwise: the refusal stands */
        queue_remove(gw, j);
        job_answer_refusal(j);
      } else if (now >= j->deadline_ms && gw_job_streamed(j)) {
        queue_remove(gw, j);
        job_fail_stream(j, "no replica could continue this stream in time");
      } else if (now >= j->deadline_ms) {
        queue_remove(gw, j);
        job_fail(j, 503, "server_error", "deadline_exceeded", retry_after_s(gw, j->model),
                 "no replica could take the request within its deadline%s%s",
                 j->last_error ? "; last error: " : "", j->last_error ? j->last_error : "");
      }
      j = next;
    }
  }
}


/* The jobs a pass looks at, in queue order: each model's first jobs only, so a long
 * queue for a busy model neither costs much nor hides another model's jobs. The window
 * must reach as deep as a job that a free slow phone would finish sooner than the fast
 * phones it queues for: about (usable slots) x (speed ratio between phones); 8x covers
 * real fleets. Returns how many were put in jobs/reqs (sized gw->queue.len). */
static size_t plan_window(gw_server *gw, uint64_t now, gw_job **jobs, gw_sched_req *reqs) {
  size_t n = 0;
  uint64_t pass = ++gw->plan_passes;
  for (int p = 0; p < GW_PRIO_COUNT; p++) {
    for (gw_job *j = gw->queue.head[p]; j; j = j->qnext) {
      gw_model *m = j->model;
      if (j->pin[0]) continue; /* its phone is chosen: plan_pinned */
      if (m->pass != pass) {
        m->pass = pass;
        m->taken = m->window = 0;
        for (size_t i = 0; i < m->n_phones; i++) {
          int c = gw_replica_capacity(m->phones[i], now);
          if (c > 0) m->window += (size_t)c;
        }
        m->window = m->window * 8 + 32;
      }
      if (m->taken >= m->window) continue;
      m->taken++;
      jobs[n] = j;
      reqs[n] = job_sched_req(gw, j, now, REQ_QUEUED, NULL);
      n++;
    }
  }
  return n;
}

/* A job waits for a busier replica that finishes it sooner than any free one: say so once. */
static void plan_log_wait(gw_server *gw, gw_job *j, const gw_replica *r, const gw_sched_choice *ch) {
  if (ch->alt_replica < 0 || j->waited_for) return;
  j->waited_for = strdup(r->id); /* NULL when out of memory: only the log loses it */
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", j->id);
  cJSON_AddStringToObject(f, "decision", "wait");
  cJSON_AddStringToObject(f, "replica", r->id);
  cJSON_AddNumberToObject(f, "predicted_finish_s", round(ch->finish_s * 1000) / 1000);
  cJSON_AddStringToObject(f, "free_replica", gw->replicas[ch->alt_replica]->id);
  cJSON_AddNumberToObject(f, "free_replica_finish_s", round(ch->alt_finish_s * 1000) / 1000);
  pr_log_kv(PR_LOG_INFO, "routing", f);
}

static void plan_dispatch(gw_server *gw, gw_job *j, gw_replica *r, const gw_sched_choice *ch,
                          uint64_t now) {
  queue_remove(gw, j);
  if (j->deadline_kept_ms) {
    /* a continuing stream goes on: its silence limit is over, and a later failure may
     * continue it again within its own deadline (else a second cut after the first
     * limit ended it with an error event, retries left or not) */
    j->deadline_ms = j->deadline_kept_ms;
    j->deadline_kept_ms = 0;
  }
  job_move(j, gw_job_streamed(j) ? GW_JOB_STREAMING : GW_JOB_RUNNING);
  if (j->tag > gw->queue.vtime[j->prio]) gw->queue.vtime[j->prio] = j->tag;
  if (!j->first_dispatch_ms) j->first_dispatch_ms = now;
  j->attempts++;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", j->id);
  cJSON_AddStringToObject(f, "decision", "dispatch");
  cJSON_AddStringToObject(f, "replica", r->id);
  cJSON_AddNumberToObject(f, "attempt", j->attempts);
  cJSON_AddNumberToObject(f, "predicted_finish_s", round(ch->finish_s * 1000) / 1000);
  cJSON_AddNumberToObject(f, "predicted_cached_tokens", (double)ch->cached_tokens);
  if (j->waited_for) cJSON_AddStringToObject(f, "waited_for", j->waited_for);
  pr_log_kv(PR_LOG_DEBUG, "routing", f);
  int rc = gw_attempt_start(j, &job_attempt_ops, r, ch->prefill_s, ch->service_s, ch->cached_tokens,
                            GW_ATT_RUNNING, NULL);
  /* could not even start (out of memory): count it as a failed attempt */
  if (rc < 0) job_attempt_failed(j, GW_FAIL_PROTOCOL, pr_strerror(rc));
}

static int hedge_waits(const gw_server *gw, const gw_job *j, uint64_t now);
static gw_sched_req hedge_req(const gw_server *gw, const gw_job *j, uint64_t now);
static void hedge_waited(gw_server *gw, gw_job *j, gw_replica *r, const gw_sched_choice *ch,
                         uint64_t now, double *budget, int *n_hedges);

static void hedge_wait_end(gw_server *gw, gw_job *j) {
  j->hedge_wait = 0;
  if (gw->hedge_waiting) gw->hedge_waiting--;
}

/* The waiting hedges still standing (clearing those that no longer do), and how many. */
static size_t hedge_waiters(gw_server *gw, uint64_t now) {
  size_t n = 0;
  if (!gw->hedge_waiting) return 0;
  for (gw_job *j = gw->jobs; j; j = j->anext) {
    if (!j->hedge_wait) continue;
    if (hedge_waits(gw, j, now)) n++;
    else j->hedge_wait = 0;
  }
  gw->hedge_waiting = n;
  return n;
}

/* Requests pinned to one phone (shadow requests, verify.c) go out first, each as soon as
 * its phone has a slot it may use (gw_replica_capacity_checked): the phone's hold for an
 * undecided check does not stop them (they decide it); a phone that is down, drained,
 * quarantined or no longer serves the model answers them at once with an error. */
static void plan_pinned(gw_server *gw, uint64_t now) {
  for (int p = 0; p < GW_PRIO_COUNT; p++) {
    gw_job *j = gw->queue.head[p];
    while (j) {
      gw_job *next = j->qnext;
      if (!j->pin[0]) {
        j = next;
        continue;
      }
      gw_replica *r = gw_registry_find(gw, j->pin);
      int slots = r ? gw_replica_capacity_checked(r, now) : 0;
      if (!r || r->state == GW_REPLICA_DOWN || gw_replica_draining(r) || !gw_replica_serves(r, j->oai.model) ||
          (r->state == GW_REPLICA_READY && slots == 0)) {
        /* its phone will not take it soon: answered at once, not at its deadline (a check
         * waiting for it would hold the phone it checks) */
        queue_remove(gw, j);
        job_fail(j, 503, "server_error", "replica_unavailable", 0,
                 "the replica %s cannot take this request now", j->pin);
      } else if (r->state == GW_REPLICA_READY && r->inflight < slots) {
        /* the one prediction, its prompt cache included: a check's shadow to the phone that
         * just answered the caller finds the prompt there (planned as read afresh, its
         * first token came at once and its stream taught a prefill pace ten times the
         * phone's, the phone then took reviews it could not finish: B2 on a fresh gateway) */
        gw_sched_req q = job_sched_req(gw, j, now, REQ_PREDICT, NULL);
        gw_prediction pd = gw_predict(r, &q, now);
        gw_sched_choice ch;
        memset(&ch, 0, sizeof(ch));
        ch.replica = -1;
        ch.now = 1;
        ch.prefill_s = pd.prefill_s;
        ch.service_s = pd.service_s;
        ch.cached_tokens = pd.cached;
        ch.finish_s = ch.service_s;
        plan_dispatch(gw, j, r, &ch, now);
      }
      j = next;
    }
  }
}

/* After a pass: the slots left free (on phones that take work) while requests wait with a
 * free slot they could take, at most one a request, counted from now to the next pass. */
static void plan_idle_count(gw_server *gw, uint64_t now) {
  size_t waiting = gw->plan_waits.n[GW_WAIT_FASTER] + gw->plan_waits.n[GW_WAIT_KEPT] +
                   gw->plan_waits.n[GW_WAIT_HELD], free_slots = 0;
  for (size_t i = 0; waiting && i < gw->n_replicas; i++) {
    int c = gw_replica_capacity(gw->replicas[i], now) - gw->replicas[i]->inflight;
    if (c > 0) free_slots += (size_t)c;
  }
  gw->plan_waits.idle_slots = free_slots < waiting ? free_slots : waiting;
}

/* Returns 1 when the pass found work to plan (queued requests or waiting hedges, and
 * phones), 0 when it had nothing to do: only the former are timed (metrics.h). */
static int plan_pass(gw_server *gw) {
  uint64_t now = uv_now(gw->loop);
  plan_expire(gw, now);
  if (gw->fd_pressure_until_ms && now >= gw->fd_pressure_until_ms) gw->fd_pressure_until_ms = 0;
  size_t nw = hedge_waiters(gw, now);
  gw->plan_waits.idle_slot_s = gw_idle_while_waiting_s(gw, now);
  gw->plan_waits.idle_slots = 0;
  gw->plan_waits.idle_since_ms = now;
  memset(gw->plan_waits.n, 0, sizeof(gw->plan_waits.n));
  /* with no phone at all, or none taking work, every queued request waits for one */
  gw->plan_waits.n[GW_WAIT_NO_PHONE] = gw->queue.len;
  if ((gw->queue.len == 0 && nw == 0) || gw->n_replicas == 0) return 0;
  /* phones never measured start from the fleet's prior; stale rates drift back to it */
  gw_replicas_priors(gw->replicas, gw->n_replicas, now, gw->conf->rates_drift_s);
  /* phones without a record take a bounded share, however fast they claim to be */
  gw_replicas_bound_seeds(gw->replicas, gw->n_replicas); /* claimed rates: not beyond the fleet's */
  gw_replicas_trust(gw->replicas, gw->n_replicas, gw->conf->trust_after_answers, now);
  /* shadow requests first, within the shares just worked out (a phone without a record
   * takes them within its group's share, as callers' requests) */
  plan_pinned(gw, now);
  size_t cap_total = 0;
  for (size_t i = 0; i < gw->n_replicas; i++) {
    int c = gw_replica_capacity(gw->replicas[i], now);
    if (c > 0) cap_total += (size_t)c;
  }
  if (cap_total == 0) return 1;
  gw->plan_waits.n[GW_WAIT_NO_PHONE] = 0; /* the plan says why each waits */
  size_t max_n = gw->queue.len + nw;
  gw_job **jobs = calloc(max_n, sizeof(*jobs));
  gw_sched_req *reqs = calloc(max_n, sizeof(*reqs));
  gw_sched_choice *out = calloc(max_n, sizeof(*out));
  size_t n = 0;
  if (jobs && reqs && out) {
    /* waiting hedges first: each takes the next slot of the phone that finishes it soonest */
    for (gw_job *j = gw->jobs; j && n < nw; j = j->anext)
      if (j->hedge_wait) jobs[n++] = j;
    nw = n;
    for (size_t i = 0; i < nw / 2; i++) { /* gw->jobs is newest first: the oldest waited longest */
      gw_job *t = jobs[i];
      jobs[i] = jobs[nw - 1 - i];
      jobs[nw - 1 - i] = t;
    }
    for (size_t i = 0; i < nw; i++) reqs[i] = hedge_req(gw, jobs[i], now);
    n += plan_window(gw, now, jobs + n, reqs + n);
  }
  gw_sched_plan_with(gw->sched, gw->replicas, gw->n_replicas, reqs, n, now, out);
  if (gw->planrec && n) gw_planrec_plan(gw->planrec, GW_PLANREC_PASS, gw->replicas, gw->n_replicas, reqs, n, now, out);
  double hedge_budget = -1;
  int n_hedges = 0;
  for (size_t i = 0; i < n; i++) {
    gw_sched_choice *ch = &out[i];
    if (i >= nw && (ch->replica < 0 || !ch->now)) gw->plan_waits.n[ch->wait]++;
    if (ch->replica < 0) continue;
    if (i < nw) {
      gw_replica *hr = gw->replicas[ch->replica];
      if (hr == gw_job_running(jobs[i])->replica) {
        hedge_wait_end(gw, jobs[i]); /* no other phone can take it now: nothing to wait for */
      } else if (ch->now) {
        hedge_waited(gw, jobs[i], hr, ch, now, &hedge_budget, &n_hedges);
      }
      continue; /* else its phone's next slot stays its own in this pass */
    }
    /* short work: short on the quickest phone (its service there), wherever this pass
     * puts it -- what a kept slot takes (scheduler.c, kept_for). Counted by where it went,
     * a guard's message a slower phone took because no kept slot was free was not short
     * work: once longer work had the kept slots, short work stopped "coming", nothing was
     * kept for the next message and the messages never came back to the quick phones (B7,
     * a fleet's pace: the filters' p95 a review's length). */
    double svc_short = jobs[i]->svc_best > 0 && jobs[i]->svc_best < ch->service_s ? jobs[i]->svc_best
                                                                                  : ch->service_s;
    int is_short = jobs[i]->prio != GW_PRIO_BATCH && svc_short <= jobs[i]->conf->short_s;
    if (is_short) short_note(jobs[i]->model, now);
    gw_replica *r = gw->replicas[ch->replica];
    if (!ch->now) {
      plan_log_wait(gw, jobs[i], r, ch);
      continue;
    }
    if (gw->fd_pressure_until_ms) {
      if (now >= gw->fd_pressure_until_ms) gw->fd_pressure_until_ms = 0; /* try freely again */
      else if (gw->fd_credit <= 0) break; /* wait for a running attempt to end */
      else gw->fd_credit--;
    }
    /* short work's arrival rate and service time on a quick phone size the slots kept for
     * it; its rate says how likely it comes before a quick slot frees */
    if (is_short) gw_model_short_note(jobs[i]->model, svc_short, jobs[i]->conf->short_recent_s, now);
    /* the model's interactive work lately: what an idle phone weighs (gw_sched_req.fill_idle) */
    if (jobs[i]->prio != GW_PRIO_BATCH)
      gw_load_note(&jobs[i]->model->load, ch->service_s, jobs[i]->conf->load_window_s, now);
    plan_dispatch(gw, jobs[i], r, ch, now);
  }
  plan_idle_count(gw, now);
  free(jobs);
  free(reqs);
  free(out);
  return 1;
}

static void plan_idle_cb(uv_idle_t *h) {
  gw_server *gw = h->data;
  uv_idle_stop(h);
  gw->plan_pending = 0;
  uint64_t t0 = uv_hrtime();
  if (plan_pass(gw)) gw_metrics_plan_pass(gw, (double)(uv_hrtime() - t0) / 1e9);
}

void gw_jobs_init(gw_server *gw) {
  gw->sched = gw_sched_new(); /* NULL (out of memory): each plan makes its own */
  uv_idle_init(gw->loop, &gw->plan_idle);
  gw->plan_idle.data = gw;
  gw->plan_cb = plan_idle_cb;
  uv_idle_init(gw->loop, &gw->reap_idle);
  gw->reap_idle.data = gw;
  uv_check_init(gw->loop, &gw->reap_check);
  gw->reap_check.data = gw;
}

void gw_jobs_close(gw_server *gw, uv_close_cb closed) {
  uv_idle_stop(&gw->plan_idle);
  uv_idle_stop(&gw->reap_idle);
  uv_check_stop(&gw->reap_check);
  uv_handle_t *hs[] = {(uv_handle_t *)&gw->plan_idle, (uv_handle_t *)&gw->reap_idle,
                       (uv_handle_t *)&gw->reap_check};
  for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++)
    if (!uv_is_closing(hs[i])) uv_close(hs[i], closed); /* shutdown may come twice */
}


/* ---- hedging ---------------------------------------------------------------------------- */

/* Slot-seconds the running attempts have used so far, the hedges' part of them, and how
 * many hedges run (n_hedges may be NULL). */
static void running_work(const gw_server *gw, uint64_t now, double *all, double *hedges, int *n_hedges) {
  *all = *hedges = 0;
  if (n_hedges) *n_hedges = 0;
  for (const gw_job *j = gw->jobs; j; j = j->anext) {
    GW_JOB_EACH_ATTEMPT(j, a) {
      if (a->role == GW_ATT_LOST || !a->lease) continue; /* (a lost one is freed this turn) */
      double s = now > a->start_ms ? (double)(now - a->start_ms) / 1000.0 : 0;
      *all += s;
      /* a hedge running counts what it is expected to take, not only what it took so far:
       * else hedges started in the same moment would each see the whole budget left */
      if (a->hedge) *hedges += a->pred_service_s > s && isfinite(a->pred_service_s) ? a->pred_service_s : s;
      if (a->hedge && n_hedges) (*n_hedges)++;
    }
  }
}

/* Why a suspect phone is (hedge_suspect), for the routing log. */
static const char *suspect_why(const gw_replica *r) {
  return r->health.probe_fail > 0 ? "its phone failed a health check" : "its phone's health check is late";
}

static void hedge_start(gw_server *gw, gw_job *j, gw_replica *r, const gw_sched_choice *ch,
                        const gw_hedge_in *in) {
  j->hedged = 1;
  j->attempts++;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", j->id);
  cJSON_AddStringToObject(f, "decision", "hedge");
  cJSON_AddStringToObject(f, "replica", r->id);
  const gw_replica *overdue = gw_job_running(j)->replica;
  cJSON_AddStringToObject(f, "overdue_replica", overdue->id);
  cJSON_AddNumberToObject(f, "waited_s", round(in->elapsed_s * 1000) / 1000);
  if (in->suspect) cJSON_AddStringToObject(f, "why", suspect_why(overdue));
  cJSON_AddNumberToObject(f, "expected_first_byte_s", round(in->expected_first_s * 1000) / 1000);
  cJSON_AddNumberToObject(f, "remaining_there_s",
                          round(gw_hedge_remaining_s(in->elapsed_s, in->expected_total_s) * 1000) / 1000);
  cJSON_AddNumberToObject(f, "predicted_finish_s", round(ch->finish_s * 1000) / 1000);
  pr_log_kv(PR_LOG_INFO, "routing", f);
  gw_attempt *h = NULL;
  if (gw_attempt_start(j, &job_attempt_ops, r, ch->prefill_s, ch->service_s, ch->cached_tokens,
                       GW_ATT_HEDGE, &h) < 0) {
    j->attempts--;
    return;
  }
  h->hedge = 1;
  gw_metrics_hedge(gw, GW_HEDGE_STARTED);
}

/* Whether j could take a hedge now: interactive, still waiting for its first byte, none
 * started yet (at most one per request). */
static int hedge_candidate(const gw_job *j, uint64_t now) {
  const gw_attempt *a = gw_job_running(j);
  return a && !gw_job_hedge(j) && !j->hedged && j->state == GW_JOB_RUNNING && a->state == GW_ATT_SENT &&
         j->conf->hedge_budget > 0 && j->prio != GW_PRIO_BATCH && !j->held_refusal &&
         gw_sink_open(&j->sink) && now < j->deadline_ms && now >= a->launch_ms;
}

/* Whether a's phone failed a health check since a was sent and has passed none since,
 * or the check in flight turned late (health.late_s) since: not expected to answer.
 * Still ready (health.fall not reached), or marked down with a request that could not be
 * moved off it (no retry left): either way only a hedge takes it elsewhere. */
static int hedge_suspect(const gw_attempt *a) {
  const gw_replica *r = a->replica;
  return ((r->health.probe_fail > 0 && r->health.probe_fail_ms > a->launch_ms) ||
          r->health.probe_late_ms > a->launch_ms) &&
         (r->state == GW_REPLICA_READY || r->state == GW_REPLICA_DOWN);
}

static gw_hedge_in hedge_in(const gw_job *j, uint64_t now) {
  const gw_attempt *a = gw_job_running(j);
  const gw_config *c = j->conf;
  return (gw_hedge_in){.elapsed_s = (double)(now - a->launch_ms) / 1000.0,
                       .expected_first_s = j->oai.stream ? a->pred_prefill_s : a->pred_service_s,
                       .expected_total_s = a->pred_service_s,
                       .prompt_tokens = j->oai.prompt_tokens - a->pred_cached,
                       .factor = c->hedge_factor, .min_s = c->hedge_min_s, .alt_finish_s = -1,
                       .suspect = hedge_suspect(a), .min_running = c->hedge_min_running};
}

/* What a plan of j's hedge asks: anywhere but the phone it runs on, leaving short work's
 * kept slots to it. */
static gw_sched_req hedge_req(const gw_server *gw, const gw_job *j, uint64_t now) {
  return job_sched_req(gw, j, now, REQ_HEDGE, gw_job_running(j)->replica);
}

/* Whether j's waiting hedge still stands: the request still waits for its first byte on
 * the same attempt, and that phone has not answered a health check since it failed one
 * (passed: nothing to hedge; marked down, the request is usually moved to the queue's
 * front, which ends the attempt). */
static int hedge_waits(const gw_server *gw, const gw_job *j, uint64_t now) {
  return j->hedge_wait && !gw->shutting_down && !gw->fd_pressure_until_ms &&
         hedge_candidate(j, now) && hedge_suspect(gw_job_running(j));
}

static void hedge_wait_log(const gw_job *j, const gw_replica *r, const gw_sched_choice *ch,
                           const gw_hedge_in *in) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", j->id);
  cJSON_AddStringToObject(f, "decision", "hedge_wait");
  cJSON_AddStringToObject(f, "replica", r->id);
  const gw_replica *overdue = gw_job_running(j)->replica;
  cJSON_AddStringToObject(f, "overdue_replica", overdue->id);
  char why[120];
  snprintf(why, sizeof(why), "%s; the phone that finishes it soonest is busy", suspect_why(overdue));
  cJSON_AddStringToObject(f, "why", why);
  cJSON_AddNumberToObject(f, "waited_s", round(in->elapsed_s * 1000) / 1000);
  cJSON_AddNumberToObject(f, "predicted_finish_s", round(ch->finish_s * 1000) / 1000);
  pr_log_kv(PR_LOG_INFO, "routing", f);
}

void gw_jobs_hedge(gw_server *gw, uint64_t now) {
  if (gw->shutting_down || gw->fd_pressure_until_ms) return;
  int have_work = 0, n_hedges = 0;
  double running = 0, running_hedges = 0;
  for (gw_job *j = gw->jobs, *next; j; j = next) {
    next = j->anext;
    if (!hedge_candidate(j, now)) continue;
    if (j->hedge_wait) {
      if (hedge_waits(gw, j, now)) continue; /* the planning pass starts it */
      hedge_wait_end(gw, j);
    }
    gw_attempt *a = gw_job_running(j);
    const gw_config *c = j->conf;
    gw_hedge_in in = hedge_in(j, now);
    if (!in.suspect &&
        in.elapsed_s < gw_hedge_overdue_s(in.expected_first_s, in.prompt_tokens, in.factor, in.min_s))
      continue;
    gw_sched_req q = hedge_req(gw, j, now);
    gw_sched_choice ch;
    gw_sched_plan_with(gw->sched, gw->replicas, gw->n_replicas, &q, 1, now, &ch);
    if (gw->planrec) gw_planrec_plan(gw->planrec, GW_PLANREC_HEDGE, gw->replicas, gw->n_replicas, &q, 1, now, &ch);
    gw_replica *r = ch.replica >= 0 ? gw->replicas[ch.replica] : NULL;
    if (r == a->replica) r = NULL;
    if (r && ch.now) {
      in.alt_finish_s = ch.finish_s;
      in.alt_service_s = ch.service_s;
    }
    if (!have_work) {
      running_work(gw, now, &running, &running_hedges, &n_hedges);
      have_work = 1;
    }
    in.budget_left_s = gw_hedge_budget_left(&gw->hedge_ledger, now, c->hedge_budget, running,
                                            running_hedges);
    in.running = n_hedges;
    if (gw_hedge_decide(&in) == GW_HEDGE_YES) {
      hedge_start(gw, j, r, &ch, &in);
      have_work = 0; /* the new hedge's slot counts from now on */
    } else if (in.suspect && r && !ch.now &&
               (ch.service_s <= in.budget_left_s || in.running < in.min_running)) {
      /* its phone is not expected to answer, and the phone that finishes it soonest is
       * busy: the hedge takes that phone's next slot, ahead of the queue */
      j->hedge_wait = 1;
      gw->hedge_waiting++;
      hedge_wait_log(j, r, &ch, &in);
      gw_plan_soon(gw);
    }
  }
}

/* A planning pass found a waiting hedge's phone free: start it there, if the budget still
 * allows (others may have started meanwhile). budget: the hedge budget left, < 0 until
 * worked out; n_hedges: the hedges running, with it. */
static void hedge_waited(gw_server *gw, gw_job *j, gw_replica *r, const gw_sched_choice *ch,
                         uint64_t now, double *budget, int *n_hedges) {
  gw_hedge_in in = hedge_in(j, now);
  if (*budget < 0) {
    double running, running_hedges;
    running_work(gw, now, &running, &running_hedges, n_hedges);
    *budget = gw_hedge_budget_left(&gw->hedge_ledger, now, j->conf->hedge_budget, running, running_hedges);
  }
  in.alt_finish_s = ch->finish_s;
  in.alt_service_s = ch->service_s;
  in.budget_left_s = *budget;
  in.running = *n_hedges;
  hedge_wait_end(gw, j);
  if (gw_hedge_decide(&in) != GW_HEDGE_YES) return; /* spent: the attempt keeps its chance */
  hedge_start(gw, j, r, ch, &in);
  *budget = in.budget_left_s - ch->service_s;
  (*n_hedges)++;
}
