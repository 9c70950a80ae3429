/* Counters, histograms, the 10-second sample ring and the Prometheus rendering; see
 * metrics.h. Label values that clients choose (the model) are bounded: a model no
 * replica serves is counted as "_unknown", and past GW_METRICS_MAX_* series new label
 * sets go to "_other", so a client cannot grow the scrape without limit. */
#include "metrics.h"
#include "shared.h"

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "clock.h"
#include "err.h"
#include "placement.h"
#include "registry.h"

#define GW_METRICS_MAX_MODELS 64
#define GW_METRICS_MAX_REQ_SERIES 1024
#define GW_METRICS_LABEL_MAX 128
#define GW_METRICS_MAX_OUT (16u << 20)
#define GW_RATE_WINDOW_MS 60000

/* Phones are slow: a 3-minute prefill is normal, so the buckets reach 30 minutes. */
static const double hist_bounds[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800};
#define GW_HIST_N (sizeof(hist_bounds) / sizeof(hist_bounds[0]))

typedef struct hist {
  uint64_t bucket[GW_HIST_N]; /* non-cumulative; cumulated when rendered */
  uint64_t count;
  double sum;
} hist;

/* A planning pass takes microseconds on a small fleet and, on a large saturated one, a
 * good share of the loop: buckets from 5 us to 2.5 s, with 2 ms (issue 34's target at
 * p99 for 6,000 phones) a bound of its own. */
static const double plan_bounds[] = {0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
                                     0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
#define GW_PLAN_HIST_N (sizeof(plan_bounds) / sizeof(plan_bounds[0]))

typedef struct model_stats {
  char model[GW_METRICS_LABEL_MAX];
  hist duration, ttfb, queue_wait;
  uint64_t tokens_in, tokens_out;
} model_stats;

typedef struct req_series {
  uint16_t model;  /* index into models */
  int status;
  char caller[GW_METRICS_LABEL_MAX];
  uint64_t n;
} req_series;

typedef struct sample {
  uint64_t t_ms;   /* wall clock, ms since the epoch */
  uint64_t mono_ms;
  uint64_t requests, errors, tokens;
  uint32_t queue, busy;
} sample;

/* Requests refused as their own fault, by who refused them and our code (codes are the
 * gateway's own static strings, so the table stays small). */
#define GW_METRICS_MAX_REFUSALS 48
typedef struct refusal_series {
  const char *code;
  int by_replica;
  uint64_t n;
} refusal_series;

struct gw_metrics {
  uint64_t start_wall_ms;
  model_stats models[GW_METRICS_MAX_MODELS];
  size_t n_models;
  req_series *reqs;                   /* GW_METRICS_MAX_REQ_SERIES entries */
  size_t n_reqs;
  uint64_t failures[GW_FAIL_COUNT], retries[GW_FAIL_COUNT],
      failovers[GW_FAIL_COUNT];
  uint64_t reloads_ok, reloads_refused;
  refusal_series refusals[GW_METRICS_MAX_REFUSALS];
  size_t n_refusals;
  uint64_t refusal_checks;            /* ambiguous refusals sent to a second phone */
  uint64_t deadline_unreachable;      /* answered 503 at once: no phone could finish in time */
  uint64_t cache_isolated;            /* attempts sent uncached: other scopes' prompts may be there */
  uint64_t hedges[GW_HEDGE_OUTCOMES];  /* second attempts: started, won, wasted */
  double slot_s[2];                   /* phone slot time of attempts: [0] regular, [1] hedges */
  uint64_t usage_clamped;             /* requests whose phone reported more usage than believed */
  uint64_t plan_bucket[GW_PLAN_HIST_N]; /* planning passes by duration (non-cumulative) */
  uint64_t plan_count;
  double plan_sum;
  /* cumulative totals the samples and rates are taken from */
  uint64_t requests, errors, tokens;
  sample ring[GW_METRICS_SAMPLES];
  size_t ring_head, ring_n;           /* next slot to write; samples held */
  uint64_t samples_taken;
  sample base;                        /* the start: rates before the first minute */
};

gw_metrics *gw_metrics_new(uint64_t now_ms) {
  gw_metrics *m = calloc(1, sizeof(*m));
  if (!m) return NULL;
  m->reqs = calloc(GW_METRICS_MAX_REQ_SERIES, sizeof(*m->reqs));
  if (!m->reqs) {
    free(m);
    return NULL;
  }
  m->start_wall_ms = (uint64_t)pr_clock_wall_ms();
  m->base.t_ms = m->start_wall_ms;
  m->base.mono_ms = now_ms;
  return m;
}

void gw_metrics_free(gw_metrics *m) {
  if (!m) return;
  free(m->reqs);
  free(m);
}

/* ---- counting ----------------------------------------------------------------------------- */

static void hist_observe(hist *h, double v) {
  if (!(v >= 0) || !isfinite(v)) v = 0;
  size_t i = 0;
  while (i < GW_HIST_N && v > hist_bounds[i]) i++;
  if (i < GW_HIST_N) h->bucket[i]++;
  h->count++;
  h->sum += v;
}

/* The stats of a model label; "_other" once the table is full (its last entry). */
static model_stats *model_slot(gw_metrics *m, const char *model) {
  for (size_t i = 0; i < m->n_models; i++)
    if (strcmp(m->models[i].model, model) == 0) return &m->models[i];
  if (m->n_models + 1 >= GW_METRICS_MAX_MODELS) model = "_other";
  for (size_t i = 0; i < m->n_models; i++)
    if (strcmp(m->models[i].model, model) == 0) return &m->models[i];
  model_stats *s = &m->models[m->n_models++];
  snprintf(s->model, sizeof(s->model), "%s", model);
  return s;
}

/* The caller label: the API key's name (configured names only, never what a client
 * sent), or "anonymous" when the gateway has no api_keys or the key was refused. */
static const char *job_caller(const gw_job *j) {
  return j->caller && j->caller->name ? j->caller->name : "anonymous";
}

/* A model label a client cannot invent: the model when some replica serves it. */
static const char *model_label(const gw_server *gw, const char *model) {
  if (!model || !*model) return "_unknown";
  for (size_t i = 0; i < gw->n_replicas; i++)
    if (gw_replica_serves(gw->replicas[i], model)) return model;
  return "_unknown";
}

#define GW_STATUS_STREAM_ERROR (-1) /* the label "stream_error" */

void gw_metrics_on_job_ended(gw_server *gw, const gw_job_ended *ev, void *ud) {
  (void)ud;
  gw_metrics *m = gw->metrics;
  if (!m) return;
  const gw_job *j = ev->j;
  if (j->usage_clamped) m->usage_clamped++;
  model_stats *ms = model_slot(m, model_label(gw, j->oai.model));
  uint16_t mi = (uint16_t)(ms - m->models);
  /* the status label: GW_STATUS_STREAM_ERROR for a stream that began with 200 and ended in
   * an error event (the client did not get its answer) */
  int status = j->stream_failed && !j->client_gone ? GW_STATUS_STREAM_ERROR : ev->status;
  const char *caller = job_caller(j);
  req_series *rs = NULL;
  for (size_t i = 0; i < m->n_reqs && !rs; i++)
    if (m->reqs[i].model == mi && m->reqs[i].status == status && strcmp(m->reqs[i].caller, caller) == 0)
      rs = &m->reqs[i];
  if (!rs && m->n_reqs < GW_METRICS_MAX_REQ_SERIES) {
    rs = &m->reqs[m->n_reqs++];
    rs->model = mi;
    rs->status = status;
    snprintf(rs->caller, sizeof(rs->caller), "%s", caller);
  }
  if (rs) rs->n++;
  hist_observe(&ms->duration, ev->duration_s);
  if (ev->ttfb_s >= 0) hist_observe(&ms->ttfb, ev->ttfb_s);
  hist_observe(&ms->queue_wait, ev->queue_wait_s);
  ms->tokens_in += ev->tokens_in;
  ms->tokens_out += ev->tokens_out;
  int failed = ev->failed;
  /* a request that failed on one replica and was then answered by another attempt */
  if (!failed && status >= 200 && status < 400 && j->attempts > 1 && j->last_fail > GW_FAIL_NONE &&
      j->last_fail < GW_FAIL_COUNT) /* a hedge that won is no failover */
    m->failovers[j->last_fail]++;
  if (j->refused_code) {
    refusal_series *f = NULL;
    for (size_t i = 0; i < m->n_refusals && !f; i++)
      if (m->refusals[i].by_replica == j->refused_by_replica && strcmp(m->refusals[i].code, j->refused_code) == 0)
        f = &m->refusals[i];
    if (!f && m->n_refusals < GW_METRICS_MAX_REFUSALS) {
      f = &m->refusals[m->n_refusals++];
      f->code = j->refused_code;
      f->by_replica = j->refused_by_replica;
    }
    if (f) f->n++;
  }
  m->requests++;
  if (failed) m->errors++;
  m->tokens += ev->tokens_in + ev->tokens_out;
}

void gw_metrics_attempt_failed(gw_server *gw, gw_fail_kind kind) {
  if (gw->metrics && kind < GW_FAIL_COUNT) gw->metrics->failures[kind]++;
}

void gw_metrics_hedge(gw_server *gw, gw_hedge_outcome o) {
  if (gw->metrics && o < GW_HEDGE_OUTCOMES) gw->metrics->hedges[o]++;
}

void gw_metrics_slot_seconds(gw_server *gw, double s, int hedge) {
  if (gw->metrics && s > 0 && isfinite(s)) gw->metrics->slot_s[hedge ? 1 : 0] += s;
}

void gw_metrics_plan_pass(gw_server *gw, double seconds) {
  gw_metrics *m = gw->metrics;
  if (!m) return;
  if (!(seconds >= 0) || !isfinite(seconds)) seconds = 0;
  size_t i = 0;
  while (i < GW_PLAN_HIST_N && seconds > plan_bounds[i]) i++;
  if (i < GW_PLAN_HIST_N) m->plan_bucket[i]++;
  m->plan_count++;
  m->plan_sum += seconds;
}

void gw_metrics_refusal_check(gw_server *gw) {
  if (gw->metrics) gw->metrics->refusal_checks++;
}

void gw_metrics_cache_isolated(gw_server *gw) {
  if (gw->metrics) gw->metrics->cache_isolated++;
}

void gw_metrics_deadline_unreachable(gw_server *gw) {
  if (gw->metrics) gw->metrics->deadline_unreachable++;
}

void gw_metrics_retry(gw_server *gw, gw_fail_kind kind) {
  if (gw->metrics && kind < GW_FAIL_COUNT) gw->metrics->retries[kind]++;
}

void gw_metrics_reload(gw_server *gw, int ok) {
  if (!gw->metrics) return;
  if (ok) gw->metrics->reloads_ok++;
  else gw->metrics->reloads_refused++;
}

/* ---- the fleet at a glance ---------------------------------------------------------------- */

const char *gw_metrics_replica_category(const gw_replica *r) {
  if (r->state == GW_REPLICA_DOWN) return "down";
  if (r->state == GW_REPLICA_LOADING) return "loading";
  if (gw_replica_has(r, GW_HELD_QUARANTINED)) return "quarantined";
  if (gw_replica_draining(r)) return "draining";
  return r->inflight > 0 ? "busy" : "ready";
}

void gw_metrics_fleet_counts(const gw_server *gw, gw_fleet_counts *c) {
  memset(c, 0, sizeof(*c));
  for (size_t i = 0; i < gw->n_replicas; i++) {
    const gw_replica *r = gw->replicas[i];
    const char *cat = gw_metrics_replica_category(r);
    if (strcmp(cat, "down") == 0) c->down++;
    else if (strcmp(cat, "loading") == 0) c->loading++;
    else if (strcmp(cat, "draining") == 0 || strcmp(cat, "quarantined") == 0) c->draining++;
    else if (strcmp(cat, "busy") == 0) c->busy++;
    else c->ready++;
    c->total++;
    c->slots_total += r->slots;
    c->slots_busy += r->inflight;
    c->cost_per_day += r->cost_per_day;
  }
}

/* ---- samples and rates -------------------------------------------------------------------- */

static const sample *ring_at(const gw_metrics *m, size_t k) {
  /* k = 0: the oldest sample held */
  size_t first = (m->ring_head + GW_METRICS_SAMPLES - m->ring_n) % GW_METRICS_SAMPLES;
  return &m->ring[(first + k) % GW_METRICS_SAMPLES];
}

void gw_metrics_tick(gw_server *gw, uint64_t now_ms) {
  gw_metrics *m = gw->metrics;
  if (!m) return;
  if (m->ring_n > 0) {
    const sample *last = ring_at(m, m->ring_n - 1);
    if (now_ms - last->mono_ms < GW_METRICS_SAMPLE_MS) return;
  }
  gw_fleet_counts fc;
  gw_metrics_fleet_counts(gw, &fc);
  sample *s = &m->ring[m->ring_head];
  s->t_ms = (uint64_t)pr_clock_wall_ms();
  s->mono_ms = now_ms;
  s->requests = m->requests;
  s->errors = m->errors;
  s->tokens = m->tokens;
  s->queue = (uint32_t)gw->queue.len;
  s->busy = (uint32_t)(fc.slots_busy > 0 ? fc.slots_busy : 0);
  m->ring_head = (m->ring_head + 1) % GW_METRICS_SAMPLES;
  if (m->ring_n < GW_METRICS_SAMPLES) m->ring_n++;
  m->samples_taken++;
}

uint64_t gw_metrics_sample_count(const gw_server *gw) { return gw->metrics ? gw->metrics->samples_taken : 0; }

void gw_metrics_rates(const gw_server *gw, uint64_t now_ms, double *req_s, double *tok_s,
                      double *error_rate) {
  const gw_metrics *m = gw->metrics;
  *req_s = *tok_s = *error_rate = 0;
  if (!m) return;
  /* from the newest sample at least a minute old (or the oldest one, or the start) */
  const sample *from = &m->base;
  for (size_t k = m->ring_n; k-- > 0;) {
    const sample *s = ring_at(m, k);
    from = s;
    if (now_ms - s->mono_ms >= GW_RATE_WINDOW_MS) break;
  }
  if (m->ring_n == 0 || now_ms - from->mono_ms < 1000) from = &m->base;
  double dt = (double)(now_ms - from->mono_ms) / 1000.0;
  if (dt < 1) dt = 1;
  uint64_t dreq = m->requests - from->requests;
  *req_s = (double)dreq / dt;
  *tok_s = (double)(m->tokens - from->tokens) / dt;
  *error_rate = dreq ? (double)(m->errors - from->errors) / (double)dreq : 0;
}

static double round3(double v) { return round(v * 1000) / 1000; }

cJSON *gw_metrics_series_json(const gw_server *gw) {
  const gw_metrics *m = gw->metrics;
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddNumberToObject(o, "interval_s", GW_METRICS_SAMPLE_MS / 1000);
  cJSON *t = cJSON_AddArrayToObject(o, "t");
  cJSON *rq = cJSON_AddArrayToObject(o, "req_s");
  cJSON *tk = cJSON_AddArrayToObject(o, "tok_s");
  cJSON *q = cJSON_AddArrayToObject(o, "queue");
  cJSON *b = cJSON_AddArrayToObject(o, "busy");
  if (!m) return o;
  const sample *prev = &m->base;
  for (size_t k = 0; k < m->ring_n; k++) {
    const sample *s = ring_at(m, k);
    double dt = (double)(s->mono_ms - prev->mono_ms) / 1000.0;
    if (dt <= 0) dt = 1;
    cJSON_AddItemToArray(t, cJSON_CreateNumber((double)s->t_ms));
    cJSON_AddItemToArray(rq, cJSON_CreateNumber(round3((double)(s->requests - prev->requests) / dt)));
    cJSON_AddItemToArray(tk, cJSON_CreateNumber(round3((double)(s->tokens - prev->tokens) / dt)));
    cJSON_AddItemToArray(q, cJSON_CreateNumber(s->queue));
    cJSON_AddItemToArray(b, cJSON_CreateNumber(s->busy));
    prev = s;
  }
  return o;
}

/* ---- Prometheus text ---------------------------------------------------------------------- */

/* A label value with \ " and newline escaped; cut at GW_METRICS_LABEL_MAX bytes. */
static void put_label(pr_buf *out, const char *v) {
  size_t n = 0;
  for (const char *p = v ? v : ""; *p && n < GW_METRICS_LABEL_MAX; p++, n++) {
    if (*p == '\\') pr_buf_bytes(out, "\\\\", 2);
    else if (*p == '"') pr_buf_bytes(out, "\\\"", 2);
    else if (*p == '\n') pr_buf_bytes(out, "\\n", 2);
    else pr_buf_bytes(out, p, 1);
  }
}

static void head(pr_buf *out, const char *name, const char *type, const char *help) {
  pr_buf_text(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{k="v"} value, with one label (or none when k is NULL). */
static void put1(pr_buf *out, const char *name, const char *k, const char *v, double val) {
  pr_buf_text(out, "%s", name);
  if (k) {
    pr_buf_text(out, "{%s=\"", k);
    put_label(out, v);
    pr_buf_text(out, "%s", "\"}");
  }
  if (val == floor(val) && fabs(val) < 1e15) pr_buf_text(out, " %.0f\n", val);
  else pr_buf_text(out, " %.10g\n", val);
}

static void put_hist(pr_buf *out, const char *name, const gw_metrics *m, size_t off) {
  for (size_t i = 0; i < m->n_models; i++) {
    const hist *h = (const hist *)((const char *)&m->models[i] + off);
    uint64_t cum = 0;
    for (size_t b = 0; b < GW_HIST_N; b++) {
      cum += h->bucket[b];
      pr_buf_text(out, "%s_bucket{model=\"", name);
      put_label(out, m->models[i].model);
      pr_buf_text(out, "\",le=\"%g\"} %" PRIu64 "\n", hist_bounds[b], cum);
    }
    pr_buf_text(out, "%s_bucket{model=\"", name);
    put_label(out, m->models[i].model);
    pr_buf_text(out, "\",le=\"+Inf\"} %" PRIu64 "\n", h->count);
    pr_buf_text(out, "%s_sum{model=\"", name);
    put_label(out, m->models[i].model);
    pr_buf_text(out, "\"} %.6f\n%s_count{model=\"", h->sum, name);
    put_label(out, m->models[i].model);
    pr_buf_text(out, "\"} %" PRIu64 "\n", h->count);
  }
}

static void put_reasons(pr_buf *out, const char *name, const uint64_t *v) {
  for (int k = GW_FAIL_CONNECT; k < GW_FAIL_COUNT; k++)
    put1(out, name, "reason", gw_fail_name((gw_fail_kind)k), (double)v[k]);
}

typedef struct queue_model {
  const char *model;
  size_t n;
  uint64_t oldest_ms;
} queue_model;

/* Per-model queue depth and oldest arrival; *n_out entries in a malloc'd array. */
static queue_model *queue_by_model(const gw_server *gw, size_t *n_out) {
  *n_out = 0;
  queue_model *qm = calloc(gw->queue.len + 1, sizeof(*qm));
  if (!qm) return NULL;
  size_t n = 0;
  for (int p = 0; p < GW_PRIO_COUNT; p++) {
    for (const gw_job *j = gw->queue.head[p]; j; j = j->qnext) {
      queue_model *e = NULL;
      for (size_t i = 0; i < n && !e; i++)
        if (strcmp(qm[i].model, j->oai.model) == 0) e = &qm[i];
      if (!e) {
        e = &qm[n++];
        e->model = j->oai.model;
        e->oldest_ms = j->arrival_ms;
      }
      e->n++;
      if (j->arrival_ms < e->oldest_ms) e->oldest_ms = j->arrival_ms;
    }
  }
  *n_out = n;
  return qm;
}

cJSON *gw_metrics_queue_json(const gw_server *gw) {
  uint64_t now = uv_now(gw->loop);
  size_t nq = 0;
  queue_model *qm = queue_by_model(gw, &nq);
  cJSON *o = cJSON_CreateObject();
  if (!o) {
    free(qm);
    return NULL;
  }
  uint64_t oldest = now;
  cJSON_AddNumberToObject(o, "depth", (double)gw->queue.len);
  cJSON *arr = cJSON_AddArrayToObject(o, "models");
  for (size_t i = 0; qm && i < nq; i++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "model", qm[i].model);
    cJSON_AddNumberToObject(e, "depth", (double)qm[i].n);
    cJSON_AddNumberToObject(e, "oldest_wait_s", round3((double)(now - qm[i].oldest_ms) / 1000.0));
    cJSON_AddItemToArray(arr, e);
    if (qm[i].oldest_ms < oldest) oldest = qm[i].oldest_ms;
  }
  cJSON_AddNumberToObject(o, "oldest_wait_s", round3((double)(now - oldest) / 1000.0));
  size_t per[GW_PRIO_COUNT] = {0};
  for (int p = 0; p < GW_PRIO_COUNT; p++)
    for (const gw_job *j = gw->queue.head[p]; j; j = j->qnext) per[p]++;
  cJSON_AddNumberToObject(o, "interactive", (double)per[GW_PRIO_INTERACTIVE]);
  cJSON_AddNumberToObject(o, "batch", (double)per[GW_PRIO_BATCH]);
  /* why the last planning pass left them waiting (routing.md, "Why requests wait") */
  cJSON *why = cJSON_AddObjectToObject(o, "waiting");
  for (int k = GW_WAIT_BUSY; why && k < GW_WAIT_COUNT; k++)
    cJSON_AddNumberToObject(why, gw_sched_wait_names[k], (double)gw->plan_waits.n[k]);
  cJSON_AddNumberToObject(o, "idle_while_waiting_s", round3(gw_idle_while_waiting_s(gw, now)));
  free(qm);
  return o;
}

static void put_refused(void *ud, const char *code, uint64_t n) {
  put1(ud, "fleetgate_registrations_refused_total", "reason", code, (double)n);
}

static void render_replicas(gw_server *gw, pr_buf *out) {
  static const char *const cats[] = {"ready", "busy", "loading", "down", "draining"};
  gw_fleet_counts fc;
  gw_metrics_fleet_counts(gw, &fc);
  head(out, "fleetgate_replicas", "gauge", "Replicas by state (ready, busy, loading, down, draining).");
  const size_t counts[] = {fc.ready, fc.busy, fc.loading, fc.down, fc.draining};
  for (size_t k = 0; k < 5; k++) put1(out, "fleetgate_replicas", "state", cats[k], (double)counts[k]);
  head(out, "fleetgate_fleet_cost_per_day", "gauge", "Sum of the replicas' configured cost per day.");
  put1(out, "fleetgate_fleet_cost_per_day", NULL, NULL, fc.cost_per_day);

  head(out, "fleetgate_replica_up", "gauge", "1 when the replica passes its health checks (state ready).");
  for (size_t i = 0; i < gw->n_replicas; i++)
    put1(out, "fleetgate_replica_up", "replica", gw->replicas[i]->id,
         gw->replicas[i]->state == GW_REPLICA_READY ? 1 : 0);
  head(out, "fleetgate_replica_state", "gauge", "1 for the replica's current state, 0 for the others.");
  for (size_t i = 0; i < gw->n_replicas; i++) {
    const char *cat = gw_metrics_replica_category(gw->replicas[i]);
    for (size_t k = 0; k < 5; k++) {
      pr_buf_text(out, "%s", "fleetgate_replica_state{replica=\"");
      put_label(out, gw->replicas[i]->id);
      pr_buf_text(out, "\",state=\"%s\"} %d\n", cats[k], strcmp(cat, cats[k]) == 0);
    }
  }
  struct {
    const char *name, *type, *help;
  } const g[] = {
      {"fleetgate_replica_slots", "gauge", "Slots (requests at once) of the replica."},
      {"fleetgate_replica_slots_busy", "gauge", "Slots the gateway is using on the replica now."},
      {"fleetgate_replica_prefill_tokens_per_second", "gauge", "Measured prompt reading speed."},
      {"fleetgate_replica_decode_tokens_per_second", "gauge", "Measured generation speed."},
      {"fleetgate_replica_latency_seconds", "gauge", "Duration of the replica's last request."},
      {"fleetgate_replica_failures_total", "counter", "Failed attempts on the replica."},
      {"fleetgate_replica_successes_total", "counter", "Successful attempts on the replica."},
      {"fleetgate_timings_disagreed_total", "counter",
       "Answers whose timings the gateway's own clock overruled (scheduler.timings_trust_factor)."},
      {"fleetgate_replica_cost_per_day", "gauge", "What the replica costs per day: its replica file's cost_per_day, else the price its heartbeats claim (capped)."},
      {"fleetgate_replica_battery_ratio", "gauge", "Battery charge reported by the agent (0-1)."},
      {"fleetgate_replica_temperature_celsius", "gauge", "Device temperature reported by the agent."},
      {"fleetgate_replica_memory_available_bytes", "gauge", "Memory available on the phone, reported by the agent."},
      {"fleetgate_replica_cpu_max_freq_ratio", "gauge",
       "CPU clock cap over the CPU's top clock reported by the agent (1: not throttled)."},
  };
  for (size_t k = 0; k < sizeof(g) / sizeof(g[0]); k++) {
    head(out, g[k].name, g[k].type, g[k].help);
    for (size_t i = 0; i < gw->n_replicas; i++) {
      const gw_replica *r = gw->replicas[i];
      double v;
      switch (k) {
        case 0: v = r->slots; break;
        case 1: v = r->inflight; break;
        case 2: v = r->prefill_tps; break;
        case 3: v = r->decode_tps; break;
        case 4: v = r->served.last_latency_s; break;
        case 5: v = (double)r->n_failed; break;
        case 6: v = (double)r->n_ok; break;
        case 7: v = (double)r->served.n_timings_disagreed; break;
        case 8: v = r->cost_per_day; break;
        case 9: v = r->report.battery_pct / 100.0; break;
        case 10: v = r->report.temperature_c; break;
        case 11: v = r->report.mem_free_mb * 1048576.0; break;
        default: v = r->report.cpu_max_freq_ratio; break;
      }
      /* the agent's device figures: negative means not reported */
      if (k >= 9 && v < 0) continue;
      put1(out, g[k].name, "replica", r->id, v);
    }
  }
}

int gw_metrics_render(gw_server *gw, pr_buf *out) {
  gw_metrics *m = gw->metrics;
  if (!m) return -ENOENT;
  uint64_t now = uv_now(gw->loop);
  head(out, "fleetgate_build_info", "gauge", "The gateway's version.");
  put1(out, "fleetgate_build_info", "version", FLEETGATE_VERSION, 1);
  head(out, "fleetgate_start_time_seconds", "gauge", "When the gateway started, in seconds since the epoch.");
  pr_buf_text(out, "fleetgate_start_time_seconds %.3f\n", (double)m->start_wall_ms / 1000.0);

  head(out, "fleetgate_requests_total", "counter",
       "Finished client requests by model, HTTP status and caller (API key name).");
  for (size_t i = 0; i < m->n_reqs; i++) {
    const req_series *s = &m->reqs[i];
    pr_buf_text(out, "%s", "fleetgate_requests_total{model=\"");
    put_label(out, m->models[s->model].model);
    if (s->status == GW_STATUS_STREAM_ERROR)
      pr_buf_text(out, "%s", "\",status=\"stream_error\",caller=\"");
    else
      pr_buf_text(out, "\",status=\"%d\",caller=\"", s->status);
    put_label(out, s->caller);
    pr_buf_text(out, "\"} %" PRIu64 "\n", s->n);
  }
  head(out, "fleetgate_requests_active", "gauge", "Client requests queued or running.");
  put1(out, "fleetgate_requests_active", NULL, NULL, (double)gw->jobs_alive);
  head(out, "fleetgate_body_bytes_buffered", "gauge",
       "Request body bytes held now against limits.body_budget_bytes (all listeners).");
  put1(out, "fleetgate_body_bytes_buffered", NULL, NULL, (double)pr_http_body_bytes());
  head(out, "fleetgate_request_duration_seconds", "histogram",
       "Time from a request's arrival to its last byte.");
  put_hist(out, "fleetgate_request_duration_seconds", m, offsetof(model_stats, duration));
  head(out, "fleetgate_time_to_first_byte_seconds", "histogram",
       "Time from a request's arrival to the first byte of its answer.");
  put_hist(out, "fleetgate_time_to_first_byte_seconds", m, offsetof(model_stats, ttfb));
  head(out, "fleetgate_queue_wait_seconds", "histogram",
       "Time a request waited in the queue before its first attempt.");
  put_hist(out, "fleetgate_queue_wait_seconds", m, offsetof(model_stats, queue_wait));

  size_t nq = 0;
  queue_model *qm = queue_by_model(gw, &nq);
  head(out, "fleetgate_queue_depth", "gauge", "Requests waiting in the queue, by model.");
  for (size_t i = 0; qm && i < nq; i++) put1(out, "fleetgate_queue_depth", "model", qm[i].model, (double)qm[i].n);
  head(out, "fleetgate_queue_oldest_wait_seconds", "gauge", "How long the oldest queued request has waited, by model.");
  for (size_t i = 0; qm && i < nq; i++)
    put1(out, "fleetgate_queue_oldest_wait_seconds", "model", qm[i].model,
         (double)(now - qm[i].oldest_ms) / 1000.0);
  free(qm);
  head(out, "fleetgate_queue_waiting", "gauge",
       "Requests the last planning pass left waiting, by why: busy (every slot they could take "
       "is busy), faster_phone, kept_for_short_work, held_back, no_phone.");
  for (int k = GW_WAIT_BUSY; k < GW_WAIT_COUNT; k++)
    put1(out, "fleetgate_queue_waiting", "reason", gw_sched_wait_names[k], (double)gw->plan_waits.n[k]);
  head(out, "fleetgate_idle_while_waiting_seconds_total", "counter",
       "Slot-seconds phones stayed idle while requests waited with a free slot they could take "
       "(faster_phone, kept_for_short_work, held_back), at most one slot a waiting request.");
  put1(out, "fleetgate_idle_while_waiting_seconds_total", NULL, NULL, gw_idle_while_waiting_s(gw, now));

  head(out, "fleetgate_upstream_failures_total", "counter", "Failed attempts on replicas, by reason.");
  put_reasons(out, "fleetgate_upstream_failures_total", m->failures);
  head(out, "fleetgate_health_checks_total", "counter",
       "Health checks sent to replicas (probes: agent status, /health, /v1/models).");
  put1(out, "fleetgate_health_checks_total", NULL, NULL, (double)gw->health.n_probes);
  head(out, "fleetgate_health_visits_total", "counter",
       "Times the health scheduler looked at a replica because something was due for it (a "
       "probe, a late verdict, a heartbeat limit): its cost follows the work due, not the "
       "fleet's size.");
  put1(out, "fleetgate_health_visits_total", NULL, NULL, (double)gw->health.n_visits);
  head(out, "fleetgate_retries_total", "counter",
       "Failed attempts whose request went back to the queue to run again, by reason.");
  put_reasons(out, "fleetgate_retries_total", m->retries);
  head(out, "fleetgate_failovers_total", "counter",
       "Requests answered after an earlier attempt failed, by the reason of the last failure.");
  put_reasons(out, "fleetgate_failovers_total", m->failovers);

  head(out, "fleetgate_request_refusals_total", "counter",
       "Requests refused as their own fault (never counted as a replica failure), by who "
       "refused them (gateway or replica) and code.");
  for (size_t i = 0; i < m->n_refusals; i++)
    pr_buf_text(out, "fleetgate_request_refusals_total{source=\"%s\",code=\"%s\"} %" PRIu64 "\n",
                   m->refusals[i].by_replica ? "replica" : "gateway", m->refusals[i].code,
                   m->refusals[i].n);
  head(out, "fleetgate_refusal_checks_total", "counter",
       "Ambiguous refusals (a prompt 5xx with an error body) asked once more of another replica.");
  put1(out, "fleetgate_refusal_checks_total", NULL, NULL, (double)m->refusal_checks);
  head(out, "fleetgate_deadline_unreachable_total", "counter",
       "Requests answered 503 deadline_unreachable on arrival or retry: even the earliest "
       "predicted finish on any usable replica was past their deadline.");
  put1(out, "fleetgate_deadline_unreachable_total", NULL, NULL, (double)m->deadline_unreachable);
  head(out, "fleetgate_cache_isolated_total", "counter",
       "Attempts sent with \"cache_prompt\": false because the phone's engine may hold another "
       "cache scope's prompts (api_keys' cache_scope): what keeping callers apart costs.");
  put1(out, "fleetgate_cache_isolated_total", NULL, NULL, (double)m->cache_isolated);
  head(out, "fleetgate_hedges_total", "counter",
       "Second attempts started for requests whose first byte was overdue (started), those "
       "whose answer came first (won), and those cancelled or failed unused (wasted).");
  static const char *const hedge_names[GW_HEDGE_OUTCOMES] = {"started", "won", "wasted"};
  for (int k = 0; k < GW_HEDGE_OUTCOMES; k++)
    put1(out, "fleetgate_hedges_total", "outcome", hedge_names[k], (double)m->hedges[k]);
  head(out, "fleetgate_slot_seconds_total", "counter",
       "Phone slot time held by attempts that ended, in seconds: hedges (second attempts) and "
       "the rest (regular); the hedges' share is what scheduler.hedge_budget caps.");
  put1(out, "fleetgate_slot_seconds_total", "attempt", "regular", m->slot_s[0]);
  put1(out, "fleetgate_slot_seconds_total", "attempt", "hedge", m->slot_s[1]);
  /* answers verified (verify.c): gw->vstats */
  head(out, "fleetgate_verify_checks_total", "counter",
       "Answers checked against another phone's under deterministic decoding, by outcome: agreed, "
       "disagreed (sent to a third phone), undecided (a shadow unanswered, or no majority).");
  put1(out, "fleetgate_verify_checks_total", "outcome", "agreed", (double)gw->vfy.stats.agreed);
  put1(out, "fleetgate_verify_checks_total", "outcome", "disagreed", (double)gw->vfy.stats.disagreed);
  put1(out, "fleetgate_verify_checks_total", "outcome", "undecided", (double)gw->vfy.stats.undecided);
  head(out, "fleetgate_verify_votes_total", "counter",
       "Disagreements a third phone decided (all), and those in which a phone lost (lost).");
  put1(out, "fleetgate_verify_votes_total", "result", "all", (double)gw->vfy.stats.votes);
  put1(out, "fleetgate_verify_votes_total", "result", "lost", (double)gw->vfy.stats.votes_lost);
  head(out, "fleetgate_verify_canaries_total", "counter", "Canaries asked (all) and answered wrong (failed).");
  put1(out, "fleetgate_verify_canaries_total", "result", "all", (double)gw->vfy.stats.canaries);
  put1(out, "fleetgate_verify_canaries_total", "result", "failed", (double)gw->vfy.stats.canaries_failed);
  head(out, "fleetgate_verify_quarantines_total", "counter", "Phones quarantined for their answers.");
  put1(out, "fleetgate_verify_quarantines_total", NULL, NULL, (double)gw->vfy.stats.quarantines);
  head(out, "fleetgate_verify_shadow_requests_total", "counter", "Shadow requests sent (no caller receives them).");
  put1(out, "fleetgate_verify_shadow_requests_total", NULL, NULL, (double)gw->vfy.stats.shadows);
  head(out, "fleetgate_verify_slot_seconds_total", "counter",
       "Phone slot time shadow requests held, in seconds: what verify.budget caps.");
  put1(out, "fleetgate_verify_slot_seconds_total", NULL, NULL, gw->vfy.stats.slot_s);
  size_t nquar = 0;
  for (size_t i = 0; i < gw->n_replicas; i++) nquar += gw_replica_has(gw->replicas[i], GW_HELD_QUARANTINED) ? 1 : 0;
  head(out, "fleetgate_replicas_quarantined", "gauge", "Replicas in the registry that are quarantined.");
  put1(out, "fleetgate_replicas_quarantined", NULL, NULL, (double)nquar);
  head(out, "fleetgate_usage_clamped_total", "counter",
       "Requests whose replica reported more usage than the gateway believes (charged as clamped).");
  put1(out, "fleetgate_usage_clamped_total", NULL, NULL, (double)m->usage_clamped);

  head(out, "fleetgate_plan_pass_seconds", "histogram",
       "Time a planning pass took (passes that found queued requests or waiting hedges).");
  uint64_t cum = 0;
  for (size_t b = 0; b < GW_PLAN_HIST_N; b++) {
    cum += m->plan_bucket[b];
    pr_buf_text(out, "fleetgate_plan_pass_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", plan_bounds[b], cum);
  }
  pr_buf_text(out, "fleetgate_plan_pass_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", m->plan_count);
  pr_buf_text(out, "fleetgate_plan_pass_seconds_sum %.9f\nfleetgate_plan_pass_seconds_count %" PRIu64 "\n",
              m->plan_sum, m->plan_count);

  head(out, "fleetgate_tokens_in_total", "counter", "Prompt tokens of answered requests, by model.");
  for (size_t i = 0; i < m->n_models; i++)
    put1(out, "fleetgate_tokens_in_total", "model", m->models[i].model, (double)m->models[i].tokens_in);
  head(out, "fleetgate_tokens_out_total", "counter", "Generated tokens of answered requests, by model.");
  for (size_t i = 0; i < m->n_models; i++)
    put1(out, "fleetgate_tokens_out_total", "model", m->models[i].model, (double)m->models[i].tokens_out);

  head(out, "fleetgate_registrations_refused_total", "counter",
       "Replica registrations refused (a heartbeat's URL against the URL policy...), by reason.");
  gw_registry_refused_counts(gw, put_refused, out);
  head(out, "fleetgate_config_reloads_total", "counter", "Configuration reloads, applied or refused.");
  put1(out, "fleetgate_config_reloads_total", "result", "applied", (double)m->reloads_ok);
  put1(out, "fleetgate_config_reloads_total", "result", "refused", (double)m->reloads_refused);

  render_replicas(gw, out);
  gw_placement_metrics(gw, out);
  gw_shared_metrics(gw, out);
  /* Appends are capped by out's maximum. One that failed left out within a line's length
   * (< 1 KiB: labels are cut) of it: a cut scrape is an error, not a lie. */
  return out->cut ? PR_ETOOLARGE : 0;
}
