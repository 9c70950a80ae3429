/* The capacity advice as a service; see capsvc.h and docs/capacity.md. */
#include "capsvc.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "batchrun.h"
#include "bstore.h"
#include "capacity.h"
#include "clock.h"
#include "curlreq.h"
#include "err.h"
#include "idmap.h"
#include "json.h"
#include "log.h"
#include "oai.h"
#include "privfile.h"
#include "verify.h"

#define CAP_TICK_MS 2000u          /* the timer's period (the advice: gw_cap_refresh_gap_ms) */
#define CAP_SAVE_MS 60000          /* the history is written this often */
#define CAP_FILE "demand.json"
#define CAP_MAX_FILE (64u << 20)
#define CAP_ASKS 256               /* the hook's asks remembered (24 hours of them) */
#define CAP_HOOK_FILE "scale_hook.json" /* the asks of the last 24 hours, kept in data_dir */
#define CAP_HOOK_MAX_FILE (1u << 20)
#define CAP_DAY_MS 86400000
#define CAP_MAX_PHONES 100000      /* phones of one model the advice reads */
#define CAP_LATE_MIN 10            /* requests the window's recent span needs to read a rate by */
#define CAP_STEP_Z 2.0             /* a bucket this many standard deviations below the rate after
                                      it is a step in the load (gw_demand_recent) */
#define CAP_START_GRACE_MS 5000    /* phones listed this soon after the start were not starting */

typedef struct seen {
  int64_t last_ms; /* wall ms it was last sent a request, or joined */
} seen;

typedef struct ask {
  int64_t at_ms;
  double cost_per_day;
  char model[GW_CAP_NAME_MAX * 2];
  int phones;
  int unknown; /* not an ask: the ledger was found damaged, and the cap is taken as spent */
} ask;

typedef struct model_result {
  char name[GW_CAP_NAME_MAX * 2];
  gw_cap_result r;
} model_result;

struct gw_capsvc {
  gw_server *gw;
  gw_demand *demand;
  char *path;                 /* data_dir/demand.json; NULL: memory only */
  uv_timer_t timer;
  int timer_on;
  int64_t started_ms;
  int64_t saved_ms;
  int settled;                /* stays from before the restart settled */
  uint64_t refresh_at;        /* loop ms the timer works the advice out again */
  /* the write on the thread pool */
  uv_work_t work;
  int saving;
  char *save_text;
  int save_rc;
  pr_idmap seen;              /* replica id -> seen (owned) */
  /* the last advice */
  cJSON *advice;
  model_result *results;
  size_t n_results;
  /* the scale hook */
  uv_process_t proc;
  uv_pipe_t in;
  uv_write_t wreq;
  uv_timer_t hook_timer;
  int hook_running, hook_handles;
  char *hook_body;
  pr_curlreq hook_req;
  int64_t hook_last_ms;
  cJSON *hook_sent;           /* model -> {target_phones, release} last given */
  ask asks[CAP_ASKS];
  size_t n_asks;
  uint64_t hook_runs, hook_failed, hook_capped, hook_unpriced;
  int capped_said, unpriced_said;
  char unpriced_why[GW_CAP_NAME_MAX * 4 + 160]; /* the last ask not made for want of a price */
  /* the asks kept in data_dir (NULL: no data_dir): written before the hook runs */
  char *hook_path;
  uv_work_t hook_work;
  char *ledger_text;
  int ledger_rc;
  char *hook_pending;         /* the advice to hand the hook once its asks are written */
  double pend_cost, pend_total;
};

static gw_capsvc *svc(const gw_server *gw) { return gw->capacity; }

const gw_demand *gw_capsvc_demand(const gw_server *gw) { return svc(gw) ? svc(gw)->demand : NULL; }

int gw_model_demand(const gw_server *gw, const gw_model *m, unsigned mask, double window_s,
                    gw_demand_rate *out) {
  const gw_demand *d = gw_capsvc_demand(gw);
  if (!d || !m) {
    memset(out, 0, sizeof(*out));
    return -ENOENT;
  }
  return gw_demand_window(d, m->name, mask, pr_clock_wall_ms(), window_s, out);
}

/* ---- measuring ---------------------------------------------------------------------------- */

static gw_demand_class class_of(const gw_job *j) {
  if (j->prio == GW_PRIO_BATCH) return GW_DEMAND_BATCH;
  return j->oai.prompt_tokens >= j->conf->review_prompt_tokens ? GW_DEMAND_REVIEW : GW_DEMAND_INTERACTIVE;
}

/* The wall-clock time of j's arrival: now less how long ago it arrived on the loop's clock. */
static int64_t arrived_at(const gw_server *gw, const gw_job *j) {
  uint64_t loop_now = uv_now(gw->loop);
  return pr_clock_wall_ms() - (int64_t)(loop_now > j->arrival_ms ? loop_now - j->arrival_ms : 0);
}

/* A check's shadow request (verify.c) is no caller's demand: the advice counts the checks
 * on their own (capacity.c, checks_per_s), so they are not measured here. */
static void job_arrived(gw_server *gw, const gw_job *j) {
  gw_capsvc *c = svc(gw);
  if (!c || !j->oai.model || j->shadow) return;
  int rc = gw_demand_record_ended(c->demand, j->oai.model, class_of(j), arrived_at(gw, j), 1,
                                  (double)j->oai.prompt_tokens, 0, 0);
  if (rc == -ENOSPC) pr_debug("capacity: model %s not measured (the table is full)", j->oai.model);
}

static void job_done(gw_server *gw, const gw_job *j) {
  gw_capsvc *c = svc(gw);
  if (!c || !j->oai.model || j->shadow || j->status < 200 || j->status >= 300 || j->stream_failed)
    return; /* not answered (or a check's) */
  int64_t at = arrived_at(gw, j);
  (void)gw_demand_record_ended(c->demand, j->oai.model, class_of(j), at, 0, 0, 1, (double)j->tokens_out);
  /* how long the answer held its slot: the answers' variability for the advice's waits */
  if (j->service_ms > 0)
    (void)gw_demand_record_service(c->demand, j->oai.model, class_of(j), at, (double)j->service_ms / 1000.0);
}

void gw_capsvc_job_demand(gw_server *gw, const gw_job *j, int ended) {
  if (ended) job_done(gw, j);
  else job_arrived(gw, j);
}

void gw_capsvc_on_job_ended(gw_server *gw, const gw_job_ended *ev, void *ud) {
  (void)ud;
  if (ev->served) job_done(gw, ev->j);
}

static seen *seen_of(gw_capsvc *c, const char *id) {
  seen *s = pr_idmap_get_str(&c->seen, id);
  if (s) return s;
  s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  if (pr_idmap_put_str(&c->seen, id, s) < 0) {
    free(s);
    return NULL;
  }
  return s;
}

void gw_capsvc_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  gw_capsvc *c = svc(gw);
  if (!c) return;
  int64_t now = pr_clock_wall_ms();
  const char *id = ev->r->id;
  seen *s;
  switch (ev->kind) {
    case GW_FLEET_ADDED:
      gw_demand_phone_join(c->demand, id, now, now - c->started_ms > CAP_START_GRACE_MS);
      if ((s = seen_of(c, id))) s->last_ms = now;
      break;
    case GW_FLEET_REMOVED:
      gw_demand_phone_leave(c->demand, id, now);
      if ((s = pr_idmap_get_str(&c->seen, id))) {
        (void)pr_idmap_del_str(&c->seen, id);
        free(s);
      }
      break;
    case GW_FLEET_STATE:
      if (ev->to && strcmp(ev->to, "ready") == 0) gw_demand_phone_answered(c->demand, id, now);
      break;
    case GW_FLEET_RATES:
      gw_demand_phone_answered(c->demand, id, now);
      break;
    case GW_FLEET_SENT:
      if ((s = seen_of(c, id))) s->last_ms = now;
      break;
    case GW_FLEET_DRAIN:
    case GW_FLEET_PROGRESS:
    case GW_FLEET_MODELS:
      break;
  }
}

/* ---- the history in data_dir -------------------------------------------------------------- */

static void save_work(uv_work_t *w) {
  gw_capsvc *c = w->data;
  c->save_rc = pr_privfile_write(c->path, c->save_text, 1);
}

static void save_done(uv_work_t *w, int status) {
  gw_capsvc *c = w->data;
  c->saving = 0;
  if (status == 0 && c->save_rc)
    pr_warn("capacity: cannot write %s (%s): the demand's history since then is lost at a restart",
            c->path, strerror(-c->save_rc));
  free(c->save_text);
  c->save_text = NULL;
}

static char *history_text(gw_capsvc *c, int64_t now) {
  cJSON *o = gw_demand_to_json(c->demand, now);
  char *s = o ? cJSON_PrintUnformatted(o) : NULL;
  cJSON_Delete(o);
  return s;
}

static void save_async(gw_capsvc *c, int64_t now) {
  if (!c->path || c->saving) return;
  c->save_text = history_text(c, now);
  if (!c->save_text) return;
  c->work.data = c;
  if (uv_queue_work(c->gw->loop, &c->work, save_work, save_done) == 0) {
    c->saving = 1;
    c->saved_ms = now;
  } else {
    free(c->save_text);
    c->save_text = NULL;
  }
}

static void load(gw_capsvc *c) {
  cJSON *o;
  int rc = gw_datafile_load(c->path, CAP_MAX_FILE, 8, &o, NULL);
  if (!rc && !o) return; /* none kept yet */
  if (!o || gw_demand_from_json(c->demand, o, pr_clock_wall_ms()) < 0)
    pr_warn("capacity: %s is damaged: the demand's history starts again", c->path);
  else
    pr_info("capacity: demand since %lld ms kept in %s", (long long)gw_demand_since(c->demand), c->path);
  cJSON_Delete(o);
}

/* ---- the advice ------------------------------------------------------------------------- */

/* The batch work waiting for each model. */
typedef struct backlog {
  const char *model;
  double lines, in, out;
  int64_t soonest_expiry; /* Unix seconds (0: none) */
  double expect_out;
} backlog;

static void backlog_add(void *ud, const gw_bstore_backlog *b) {
  backlog *bl = ud;
  if (strcmp(b->model, bl->model) != 0 || b->pending <= 0) return;
  double lines = (double)b->pending;
  /* tokens per line: what its answered lines measured, else its own bytes / 4 (the same
   * estimate as a prompt's: characters / 4) and the model's learned answer length */
  double in = b->completed > 0 && b->input_tokens > 0 ? (double)b->input_tokens / (double)b->completed
                                                      : (double)b->pending_bytes / 4.0 / lines;
  double out = b->completed > 0 && b->output_tokens > 0 ? (double)b->output_tokens / (double)b->completed
                                                        : bl->expect_out;
  bl->lines += lines;
  bl->in += in * lines;
  bl->out += out * lines;
  if (b->expires_at > 0 && (!bl->soonest_expiry || b->expires_at < bl->soonest_expiry))
    bl->soonest_expiry = b->expires_at;
}

/* Seconds from now (wall ms) to the next minute-of-day mod in local time. */
static double until_local(int64_t now_ms, int mod) {
  time_t t = (time_t)(now_ms / 1000);
  struct tm tm;
  localtime_r(&t, &tm);
  tm.tm_hour = mod / 60;
  tm.tm_min = mod % 60;
  tm.tm_sec = 0;
  tm.tm_isdst = -1;
  time_t at = mktime(&tm);
  if (at <= t) {
    tm.tm_mday++;
    tm.tm_isdst = -1;
    at = mktime(&tm);
  }
  return (double)at - (double)now_ms / 1000.0;
}

static double sig2(double x) {
  if (!(x > 0)) return 0;
  double p = pow(10, floor(log10(x)) - 1);
  return round(x / p) * p;
}

/* The class a phone belongs to: its labels' "class", else its shape. */
static void class_name(const gw_replica *r, char *out, size_t n) {
  if (r->labels) {
    cJSON *l = cJSON_Parse(r->labels);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(l, "class");
    if (cJSON_IsString(k) && k->valuestring[0]) {
      snprintf(out, n, "%.60s", k->valuestring);
      cJSON_Delete(l);
      return;
    }
    cJSON_Delete(l);
  }
  /* two significant digits of each rate: phones measured a little apart are one class */
  snprintf(out, n, "%d slot%s, %g/%g tok/s", r->slots, r->slots == 1 ? "" : "s", sig2(r->prefill_tps),
           sig2(r->decode_tps));
}

typedef struct what_if {
  int set;
  const char *model;
  double lines, in, out;          /* a planned batch (tokens per line) */
  gw_targets targets;             /* < 0 / -2: unchanged */
  double arrivals_per_s;          /* added interactive arrivals (< 0: none) */
} what_if;

/* ch: the fleet's churn this week (gw_demand_churn), worked out once for every model of
 * a pass: it walks every stay remembered (GW_DEMAND_SESSIONS), and a fleet of thousands
 * of phones may serve thousands of models. */
static cJSON *advise_model(gw_capsvc *c, gw_model *m, int64_t now, const what_if *wi,
                           const gw_churn *chp, gw_cap_result *res) {
  gw_server *gw = c->gw;
  const gw_config *conf = gw->conf;
  gw_cap_input in = {.model = m->name, .targets = gw_config_targets(conf, m->name),
                     .confidence = conf->cap_confidence, .idle_release_s = conf->cap_idle_release_s};
  if (wi && wi->set) {
    if (wi->targets.interactive_wait_s >= 0) in.targets.interactive_wait_s = wi->targets.interactive_wait_s;
    if (wi->targets.review_within_s >= 0) in.targets.review_within_s = wi->targets.review_within_s;
    if (wi->targets.batch_by_min >= -1) in.targets.batch_by_min = wi->targets.batch_by_min;
  }
  in.expected_out = gw_model_expect_out(&gw->models, m, conf->default_max_tokens,
                                        conf->expected_output_tokens);
  for (int k = 0; k < GW_DEMAND_CLASSES; k++) {
    (void)gw_demand_window(c->demand, m->name, GW_DEMAND_MASK(k), now, conf->cap_window_s, &in.now[k]);
    /* a growing load is read where it has got to: since its last step up within the
     * window, when that is busier (and counted enough requests to say so) */
    gw_demand_rate late;
    in.rate_count[k] = in.now[k].requests;
    in.rate_span_s[k] = in.now[k].span_s;
    if (k != GW_DEMAND_BATCH &&
        gw_demand_recent(c->demand, m->name, GW_DEMAND_MASK(k), now, conf->cap_window_s, CAP_STEP_Z, &late) == 0 &&
        late.requests >= CAP_LATE_MIN && late.arrivals_per_s > in.now[k].arrivals_per_s) {
      in.now[k].arrivals_per_s = late.arrivals_per_s;
      in.rate_count[k] = late.requests; /* what the rate's margin rests on */
      in.rate_span_s[k] = late.span_s;
    }
  }
  /* the answers' slot times over the last hour (interactive and reviews): how much they
   * vary, for the waits (Allen-Cunneen; Erlang C until enough are measured) */
  gw_demand_rate sv;
  if (gw_demand_window(c->demand, m->name, GW_DEMAND_MASK(GW_DEMAND_INTERACTIVE) | GW_DEMAND_MASK(GW_DEMAND_REVIEW),
                       now, 3600, &sv) == 0) {
    in.service_scv = sv.service_scv;
    in.service_samples = sv.served;
  }
  if (wi && wi->set && wi->arrivals_per_s > 0) {
    gw_demand_rate *r = &in.now[GW_DEMAND_INTERACTIVE];
    double extra = wi->arrivals_per_s * (r->span_s > 0 ? r->span_s : conf->cap_window_s);
    if (r->requests <= 0) {
      r->mean_in = wi->in > 0 ? wi->in : 100;
      r->mean_out = wi->out > 0 ? wi->out : in.expected_out;
      r->span_s = conf->cap_window_s;
    }
    r->requests += extra;
    r->arrivals_per_s += wi->arrivals_per_s;
  }
  gw_demand_rate pk;
  if (gw_demand_peak(c->demand, m->name, GW_DEMAND_MASK(GW_DEMAND_INTERACTIVE) | GW_DEMAND_MASK(GW_DEMAND_REVIEW),
                     now, &pk) == 0) {
    in.peak_from_ms = pk.from_ms;
    for (int k = 0; k < GW_DEMAND_CLASSES; k++)
      (void)gw_demand_hour(c->demand, m->name, GW_DEMAND_MASK(k), pk.from_ms, now, &in.peak[k]);
  }
  /* the batch backlog, and its deadline */
  backlog bl = {.model = m->name, .expect_out = in.expected_out};
  gw_bstore *st = gw_batches_store(gw);
  if (st && gw_bstore_backlog_each(st, backlog_add, &bl) < 0)
    pr_warn("capacity: cannot read the batch backlog: %s", gw_bstore_error(st));
  if (wi && wi->set && wi->lines > 0) {
    bl.lines += wi->lines;
    bl.in += wi->lines * wi->in;
    bl.out += wi->lines * (wi->out > 0 ? wi->out : in.expected_out);
  }
  in.backlog_lines = bl.lines;
  in.backlog_in = bl.in;
  in.backlog_out = bl.out;
  in.batch_deadline_s = -1;
  char dbasis[160];
  if (in.targets.batch_by_min >= 0) {
    in.batch_deadline_s = until_local(now, in.targets.batch_by_min);
    snprintf(dbasis, sizeof(dbasis), "batch_by %02d:%02d, the gateway's local time",
             in.targets.batch_by_min / 60, in.targets.batch_by_min % 60);
  } else if (bl.soonest_expiry) {
    in.batch_deadline_s = (double)bl.soonest_expiry - (double)now / 1000.0;
    if (in.batch_deadline_s < 0) in.batch_deadline_s = 0;
    snprintf(dbasis, sizeof(dbasis), "the soonest expiry of its batches (batch.completion_window_s)");
  } else if (wi && wi->set && wi->lines > 0) {
    in.batch_deadline_s = conf->batch_window_s;
    snprintf(dbasis, sizeof(dbasis), "batch.completion_window_s from now");
  } else {
    snprintf(dbasis, sizeof(dbasis), "no batch waits");
  }
  in.batch_deadline_basis = dbasis;
  /* churn and start-up */
  const gw_churn ch = *chp;
  char sbasis[160], cbasis[200];
  in.startup_s = conf->cap_startup_s;
  if (ch.startup_samples >= 3) {
    in.startup_s = ch.startup_s;
    snprintf(sbasis, sizeof(sbasis), "the median of %zu phones from joining to ready, this week",
             ch.startup_samples);
  } else {
    snprintf(sbasis, sizeof(sbasis), "capacity.startup_s (%zu phones measured: fewer than 3)",
             ch.startup_samples);
  }
  in.startup_basis = sbasis;
  /* answers verified: a newcomer's first checks may hold it (capacity.c adds them) */
  in.vet_checks = conf->verify_enabled ? conf->verify_trust_after : 0;
  in.gone_per_h = ch.gone_per_h;
  snprintf(cbasis, sizeof(cbasis), "%zu phones gone in %.1f phone-hours this week (%zu here now)",
           ch.departures, ch.phone_hours, ch.phones_now);
  in.churn_basis = cbasis;
  /* its phones */
  size_t np = m->n_phones < CAP_MAX_PHONES ? m->n_phones : CAP_MAX_PHONES;
  gw_cap_phone *ph = calloc(np ? np : 1, sizeof(*ph));
  gw_cap_class *cls = calloc(np + conf->n_prices + 1, sizeof(*cls));
  int *cls_n = calloc(np + conf->n_prices + 1, sizeof(int));
  size_t ncls = 0;
  if (!ph || !cls || !cls_n) {
    free(ph);
    free(cls);
    free(cls_n);
    return NULL;
  }
  for (size_t i = 0; i < np; i++) {
    const gw_replica *r = m->phones[i];
    seen *s = pr_idmap_get_str(&c->seen, r->id);
    ph[i] = (gw_cap_phone){.id = r->id, .prefill_tps = r->prefill_tps, .decode_tps = r->decode_tps,
                           .slots = r->slots > 0 ? r->slots : 1, .cost_per_day = r->cost_per_day,
                           .usable = r->state == GW_REPLICA_READY && !gw_replica_draining(r),
                           .idle_s = s ? (double)(now - s->last_ms) / 1000.0 : 0};
    if (conf->n_prices) continue;
    char name[GW_CAP_NAME_MAX];
    class_name(r, name, sizeof(name));
    size_t k = 0;
    while (k < ncls && strcmp(cls[k].name, name) != 0) k++;
    if (k == ncls) {
      snprintf(cls[k].name, sizeof(cls[k].name), "%s", name);
      cls[k].in_fleet = 1;
      ncls++;
    }
    cls[k].prefill_tps += ph[i].prefill_tps;
    cls[k].decode_tps += ph[i].decode_tps;
    cls[k].slots += ph[i].slots;
    cls[k].cost_per_day += ph[i].cost_per_day;
    cls_n[k]++;
  }
  for (size_t k = 0; k < ncls; k++) { /* the averages */
    double n = cls_n[k];
    cls[k].prefill_tps /= n;
    cls[k].decode_tps /= n;
    cls[k].slots = (int)lround(cls[k].slots / n);
    if (cls[k].slots < 1) cls[k].slots = 1;
    cls[k].cost_per_day /= n;
  }
  for (size_t p = 0; p < conf->n_prices; p++) {
    const gw_price_conf *pc = &conf->prices[p];
    int serves = !pc->models;
    for (size_t k = 0; k < pc->n_models && !serves; k++) serves = strcmp(pc->models[k], m->name) == 0;
    if (!serves) continue;
    gw_cap_class *k = &cls[ncls++];
    snprintf(k->name, sizeof(k->name), "%s", pc->name);
    k->prefill_tps = pc->prefill_tps;
    k->decode_tps = pc->decode_tps;
    k->slots = pc->slots;
    k->cost_per_day = pc->cost_per_day;
    k->priced = 1;
  }
  /* answers' checks still to come: the phones without a record owe trust_after passes in a
   * row, each check GW_CAP_SHADOWS_PER_CHECK shadow requests; trusted phones' checks stay
   * within verify.budget */
  if (gw->vfy.state && conf->verify_enabled) {
    double owed = 0, span = conf->cap_window_s > 0 ? conf->cap_window_s : 1;
    for (size_t i = 0; i < np; i++)
      if (ph[i].usable) owed += gw_verify_passes_owed(gw, ph[i].id);
    in.verify_share = conf->verify_budget;
    in.verify_owed_per_s = GW_CAP_SHADOWS_PER_CHECK * owed / span;
    in.verify_new_per_s = GW_CAP_SHADOWS_PER_CHECK * (double)conf->verify_trust_after / span;
  }
  in.phones = ph;
  in.n_phones = np;
  in.classes = cls;
  in.n_classes = ncls;
  cJSON *o = gw_capacity_advise(&in, res);
  free(ph);
  free(cls);
  free(cls_n);
  return o;
}

/* Whether the advice should speak of m: configured, served, or measured. */
static int worth(gw_capsvc *c, const gw_model *m) {
  if (gw_model_known(m)) return 1;
  for (size_t i = 0; i < gw_demand_models(c->demand); i++)
    if (strcmp(gw_demand_model(c->demand, i), m->name) == 0) return 1;
  return 0;
}

static cJSON *advise_all(gw_capsvc *c, const what_if *wi, model_result **results, size_t *n_results) {
  gw_server *gw = c->gw;
  int64_t now = pr_clock_wall_ms();
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddStringToObject(o, "object", "capacity.advice");
  cJSON_AddNumberToObject(o, "generated_at", (double)(now / 1000));
  cJSON_AddStringToObject(o, "currency", gw->conf->cost_currency ? gw->conf->cost_currency : "ACU");
  cJSON_AddNumberToObject(o, "window_s", gw->conf->cap_window_s);
  gw_churn ch;
  gw_demand_churn(c->demand, now, &ch);
  cJSON *cj = cJSON_AddObjectToObject(o, "churn");
  cJSON_AddNumberToObject(cj, "phones_now", (double)ch.phones_now);
  cJSON_AddNumberToObject(cj, "departures_week", (double)ch.departures);
  cJSON_AddNumberToObject(cj, "phone_hours_week", round(ch.phone_hours * 1000) / 1000);
  cJSON_AddNumberToObject(cj, "gone_per_h", round(ch.gone_per_h * 1e6) / 1e6);
  if (ch.mean_stay_h >= 0) cJSON_AddNumberToObject(cj, "mean_stay_h", round(ch.mean_stay_h * 1000) / 1000);
  else cJSON_AddNullToObject(cj, "mean_stay_h");
  if (ch.startup_s >= 0) cJSON_AddNumberToObject(cj, "startup_s", round(ch.startup_s * 1000) / 1000);
  else cJSON_AddNullToObject(cj, "startup_s");
  cJSON_AddNumberToObject(cj, "startup_samples", (double)ch.startup_samples);
  cJSON *ms = cJSON_AddArrayToObject(o, "models");
  model_result *res = calloc(gw->models.n ? gw->models.n : 1, sizeof(*res));
  size_t n = 0;
  double cost_now = 0, cost_adv = 0;
  for (size_t i = 0; res && i < gw->models.n; i++) {
    gw_model *m = gw->models.m[i];
    if (!worth(c, m)) continue;
    if (wi && wi->set && wi->model && strcmp(wi->model, m->name) != 0) continue;
    gw_cap_result r;
    cJSON *mo = advise_model(c, m, now, wi, &ch, &r);
    if (!mo) continue;
    cJSON_AddItemToArray(ms, mo);
    snprintf(res[n].name, sizeof(res[n].name), "%s", m->name);
    res[n++].r = r;
    cost_now += r.cost_per_day_now;
    cost_adv += r.advised_cost_per_day;
  }
  cJSON_AddNumberToObject(o, "cost_per_day_now", round(cost_now * 1e6) / 1e6);
  cJSON_AddNumberToObject(o, "cost_per_day_advised", round(cost_adv * 1e6) / 1e6);
  if (results) {
    *results = res;
    *n_results = n;
  } else {
    free(res);
  }
  return o;
}

/* ---- the scale hook ----------------------------------------------------------------------- */

static double asked_24h(gw_capsvc *c, int64_t now) {
  double sum = 0;
  for (size_t i = 0; i < c->n_asks; i++)
    if (now - c->asks[i].at_ms < 86400000) sum += c->asks[i].cost_per_day;
  return sum;
}

/* Phones asked of the hook for model within the last ms: still starting, not to be asked
 * for again. */
static int pending(gw_capsvc *c, const char *model, int64_t now, int64_t ms) {
  int n = 0;
  for (size_t i = 0; i < c->n_asks; i++)
    if (now - c->asks[i].at_ms < ms && strcmp(c->asks[i].model, model) == 0) n += c->asks[i].phones;
  return n;
}

/* Phones asked for within the start-up the advice counts (the fleet's measured one, or
 * capacity.startup_s, and a newcomer's checks) and a minimum interval are on their way:
 * with the configured start-up alone, phones slower to join than it says were asked for
 * again before the first ones could come. */
static int64_t starting_ms(const gw_config *conf, const gw_cap_result *r) {
  return (int64_t)((r->join_s + conf->hook_min_interval_s) * 1000);
}

static void remember_ask(gw_capsvc *c, int64_t now, const char *model, int phones, double cost) {
  size_t k = c->n_asks;
  if (k == CAP_ASKS) { /* the oldest goes */
    size_t old = 0;
    for (size_t i = 1; i < k; i++)
      if (c->asks[i].at_ms < c->asks[old].at_ms) old = i;
    k = old;
  } else {
    c->n_asks++;
  }
  c->asks[k] = (ask){.at_ms = now, .cost_per_day = cost, .phones = phones};
  snprintf(c->asks[k].model, sizeof(c->asks[k].model), "%s", model);
}

/* ---- the ledger: the hook's asks kept in data_dir ---------------------------------------- */

/* The asks of the last 24 hours, what the hook was last given, and when it last ran. */
static char *ledger_text(gw_capsvc *c, int64_t now) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "version", 1);
  cJSON *arr = cJSON_AddArrayToObject(o, "asks");
  for (size_t i = 0; arr && i < c->n_asks; i++) {
    const ask *a = &c->asks[i];
    if (now - a->at_ms >= CAP_DAY_MS) continue;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "at_ms", (double)a->at_ms);
    cJSON_AddStringToObject(e, "model", a->model);
    cJSON_AddNumberToObject(e, "phones", a->phones);
    cJSON_AddNumberToObject(e, "cost_per_day", a->cost_per_day);
    if (a->unknown) cJSON_AddBoolToObject(e, "unknown", 1);
    cJSON_AddItemToArray(arr, e);
  }
  cJSON_AddItemToObject(o, "sent", c->hook_sent ? cJSON_Duplicate(c->hook_sent, 1) : cJSON_CreateObject());
  cJSON_AddNumberToObject(o, "last_run_ms", (double)c->hook_last_ms);
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return text;
}

static int num_in(const cJSON *o, const char *key, double lo, double hi, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
    return -EBADMSG;
  *out = v->valuedouble;
  return 0;
}

static int damaged(const char **why, const char *what) {
  *why = what;
  return -EBADMSG;
}

/* The ledger's document into c: 0, or -EBADMSG with what is wrong in *why. Asks older
 * than 24 hours are dropped; a time ahead of now (a clock set back) counts from now. */
static int ledger_read(gw_capsvc *c, const cJSON *o, int64_t now, const char **why) {
  double v, last;
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "asks");
  const cJSON *sent = cJSON_GetObjectItemCaseSensitive(o, "sent");
  if (num_in(o, "version", 1, 1, &v) < 0) return damaged(why, "not version 1");
  if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > CAP_ASKS)
    return damaged(why, "no list of asks");
  if (!cJSON_IsObject(sent)) return damaged(why, "no \"sent\" object");
  if (num_in(o, "last_run_ms", 0, 1e15, &last) < 0) return damaged(why, "no last_run_ms");
  const cJSON *it;
  cJSON_ArrayForEach(it, arr) {
    double at, phones, cost;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(it, "model");
    const cJSON *unknown = cJSON_GetObjectItemCaseSensitive(it, "unknown");
    if (num_in(it, "at_ms", 0, 1e15, &at) < 0 || num_in(it, "phones", 0, 1e9, &phones) < 0 ||
        num_in(it, "cost_per_day", 0, 1e15, &cost) < 0 || !cJSON_IsString(model) ||
        strlen(model->valuestring) >= sizeof(c->asks[0].model) || (unknown && !cJSON_IsBool(unknown)))
      return damaged(why, "an ask without its time, model, phones or cost");
    int64_t at_ms = (int64_t)at < now ? (int64_t)at : now;
    if (now - at_ms >= CAP_DAY_MS) continue;
    ask *a = &c->asks[c->n_asks++];
    *a = (ask){.at_ms = at_ms, .cost_per_day = cost, .phones = (int)phones, .unknown = cJSON_IsTrue(unknown)};
    snprintf(a->model, sizeof(a->model), "%s", model->valuestring);
  }
  cJSON_ArrayForEach(it, sent) {
    double t, r;
    if (!cJSON_IsObject(it) || num_in(it, "target_phones", 0, 1e9, &t) < 0 || num_in(it, "release", 0, 1e9, &r) < 0)
      return damaged(why, "a model's last advice without target_phones or release");
  }
  c->hook_sent = cJSON_Duplicate(sent, 1);
  c->hook_last_ms = (int64_t)last < now ? (int64_t)last : now;
  if (!c->hook_sent) return damaged(why, "out of memory");
  return 0;
}

/* At the start: the asks of the last 24 hours from data_dir. A ledger that cannot be read
 * does not lift the cap: what the hook was asked to rent is then unknown, so the cap is
 * taken as spent -- an entry of max_cost_per_day now, written back at once so that further
 * restarts do not push it later -- and the hook asks for nothing for 24 hours. */
static void ledger_load(gw_capsvc *c) {
  const gw_config *conf = c->gw->conf;
  int64_t now = pr_clock_wall_ms();
  cJSON *o;
  pr_json_err je;
  int rc = gw_datafile_load(c->hook_path, CAP_HOOK_MAX_FILE, 8, &o, &je);
  if (!rc && !o) return; /* none kept yet */
  const char *why = rc == -ENOMEM ? "out of memory" : "not JSON, or too large";
  if (!rc && ledger_read(c, o, now, &why) == 0) {
    cJSON_Delete(o);
    if (c->n_asks)
      pr_info("capacity: the scale hook's asks of the last 24 hours read from %s: %g of "
              "max_cost_per_day %g", c->hook_path, asked_24h(c, now), conf->hook_max_cost_per_day);
    return;
  }
  cJSON_Delete(o);
  cJSON_Delete(c->hook_sent);
  c->hook_sent = NULL;
  c->asks[0] = (ask){.at_ms = now, .cost_per_day = conf->hook_max_cost_per_day, .unknown = 1};
  c->n_asks = 1;
  pr_error("capacity: %s is damaged (%s): what the scale hook was asked to rent in the last 24 "
           "hours is unknown, so capacity.hook.max_cost_per_day is taken as spent and the hook "
           "asks for no phone for 24 hours (remove the file to lift that once the rentals it "
           "recorded are known)", c->hook_path, why);
  char *text = ledger_text(c, now);
  rc = text ? pr_privfile_write(c->hook_path, text, 1) : -ENOMEM;
  if (rc) pr_warn("capacity: cannot write %s (%s)", c->hook_path, strerror(-rc));
  free(text);
}

static void hook_launch(gw_capsvc *c, char *body);

static void ledger_work(uv_work_t *w) {
  gw_capsvc *c = w->data;
  c->ledger_rc = pr_privfile_write(c->hook_path, c->ledger_text, 1);
}

/* The asks are on disk: now the hook may run with them. */
static void ledger_done(uv_work_t *w, int status) {
  gw_capsvc *c = w->data;
  char *body = c->hook_pending;
  c->hook_pending = NULL;
  free(c->ledger_text);
  c->ledger_text = NULL;
  c->hook_running = 0;
  if (status != 0 || c->ledger_rc) {
    c->hook_failed++;
    pr_warn("capacity: the scale hook is not run: its asks cannot be written to %s (%s), and "
            "asks not kept would be forgotten at a restart (they count against max_cost_per_day "
            "all the same)", c->hook_path, strerror(status ? ECANCELED : -c->ledger_rc));
    free(body);
    return;
  }
  if (c->gw->shutting_down) {
    pr_info("capacity: the scale hook is not run: the gateway is stopping (its asks, kept in "
            "%s, count against max_cost_per_day)", c->hook_path);
    free(body);
    return;
  }
  hook_launch(c, body);
}

/* The asks just remembered written to data_dir first (on the thread pool, fsync'd), then
 * the hook run: a hook that has run has its asks on disk, whatever happens to the gateway
 * after. */
static void ledger_then_run(gw_capsvc *c, char *body, int64_t now) {
  c->ledger_text = ledger_text(c, now);
  c->hook_pending = body;
  c->hook_work.data = c;
  if (c->ledger_text && uv_queue_work(c->gw->loop, &c->hook_work, ledger_work, ledger_done) == 0) {
    c->hook_running = 1; /* no other run until this one is done */
    return;
  }
  c->ledger_rc = -ENOMEM;
  ledger_done(&c->hook_work, 0);
}

static cJSON *hook_json(gw_capsvc *c) {
  cJSON *o = cJSON_CreateObject();
  const gw_config *conf = c->gw->conf;
  cJSON_AddStringToObject(o, "kind", conf->hook_command ? "command" : conf->hook_url ? "url" : "none");
  if (conf->hook_command || conf->hook_url) {
    int64_t now = pr_clock_wall_ms();
    cJSON_AddNumberToObject(o, "max_cost_per_day", conf->hook_max_cost_per_day);
    cJSON_AddNumberToObject(o, "asked_cost_per_day_24h", round(asked_24h(c, now) * 1e6) / 1e6);
    cJSON_AddNumberToObject(o, "runs", (double)c->hook_runs);
    cJSON_AddNumberToObject(o, "failed", (double)c->hook_failed);
    cJSON_AddNumberToObject(o, "capped", (double)c->hook_capped);
    cJSON_AddNumberToObject(o, "unpriced", (double)c->hook_unpriced);
    if (c->hook_unpriced) cJSON_AddStringToObject(o, "unpriced_reason", c->unpriced_why);
    cJSON_AddBoolToObject(o, "running", c->hook_running);
    if (c->hook_last_ms) cJSON_AddNumberToObject(o, "last_run_at", (double)(c->hook_last_ms / 1000));
    if (c->hook_path) cJSON_AddStringToObject(o, "ledger", c->hook_path);
    int64_t unknown_until = 0;
    for (size_t i = 0; i < c->n_asks; i++)
      if (c->asks[i].unknown && now - c->asks[i].at_ms < CAP_DAY_MS) unknown_until = c->asks[i].at_ms + CAP_DAY_MS;
    if (unknown_until) /* the ledger was found damaged: the cap is taken as spent until then */
      cJSON_AddNumberToObject(o, "spending_unknown_until", (double)(unknown_until / 1000));
  }
  return o;
}

static void hook_handle_closed(uv_handle_t *h) {
  gw_capsvc *c = h->data;
  if (--c->hook_handles == 0) {
    c->hook_running = 0;
    free(c->hook_body);
    c->hook_body = NULL;
  }
}

static void hook_exit(uv_process_t *p, int64_t status, int sig) {
  gw_capsvc *c = p->data;
  if (status != 0 || sig) {
    c->hook_failed++;
    pr_warn("capacity: the scale hook ended with status %lld%s%s", (long long)status,
            sig ? ", signal " : "", sig ? strsignal(sig) : "");
  } else {
    pr_info("capacity: the scale hook ran");
  }
  uv_timer_stop(&c->hook_timer);
  uv_close((uv_handle_t *)p, hook_handle_closed);
  uv_close((uv_handle_t *)&c->hook_timer, hook_handle_closed);
}

static void hook_timeout(uv_timer_t *t) {
  gw_capsvc *c = t->data;
  pr_warn("capacity: the scale hook ran past capacity.hook.timeout_s: killed");
  uv_process_kill(&c->proc, SIGKILL);
}

static void hook_written(uv_write_t *w, int status) {
  gw_capsvc *c = w->data;
  (void)status;
  uv_close((uv_handle_t *)&c->in, hook_handle_closed);
}

static void hook_url_done(CURL *easy, CURLcode rc, void *ud) {
  gw_capsvc *c = ud;
  (void)easy;
  long st = pr_curlreq_status(&c->hook_req);
  if (rc != CURLE_OK || st < 200 || st >= 300) {
    c->hook_failed++;
    pr_warn("capacity: the scale hook's URL answered %ld (%s)", st,
            rc != CURLE_OK ? pr_curlreq_error(&c->hook_req, rc) : "not a 2xx");
  } else {
    pr_info("capacity: the scale hook's URL answered %ld", st);
  }
  pr_curlreq_close(&c->hook_req, c->gw->curlm);
  c->hook_running = 0;
  free(c->hook_body);
  c->hook_body = NULL;
}

static int hook_start(gw_capsvc *c, char *body) {
  const gw_config *conf = c->gw->conf;
  c->hook_body = body;
  if (conf->hook_url) {
    static const char *const hdrs[] = {"Content-Type: application/json", NULL};
    pr_curlreq_opts o = {.base = conf->hook_url, .body = body, .body_len = strlen(body),
                         .headers = hdrs, .timeout_ms = (long)(conf->hook_timeout_s * 1000),
                         .connect_timeout_ms = 10000, .ca_file = conf->ca_file,
                         .user_agent = "fleetgate-capacity"};
    /* the operator's own endpoint: not a phone, so not the phones' URL policy (no gate) */
    int rc = pr_curlreq_open(&c->hook_req, NULL, &o);
    if (!rc) rc = pr_curlm_add(c->gw->curlm, c->hook_req.easy, hook_url_done, c);
    if (rc) {
      pr_curlreq_close(&c->hook_req, NULL);
      c->hook_body = NULL;
      return rc;
    }
    c->hook_running = 1;
    return 0;
  }
  uv_loop_t *loop = c->gw->loop;
  uv_pipe_init(loop, &c->in, 0);
  c->in.data = c;
  uv_stdio_container_t io[3] = {
    {.flags = UV_CREATE_PIPE | UV_READABLE_PIPE, .data.stream = (uv_stream_t *)&c->in},
    {.flags = UV_IGNORE},
    {.flags = UV_INHERIT_FD, .data.fd = 2},
  };
  uv_process_options_t po = {.file = conf->hook_command[0], .args = conf->hook_command,
                             .exit_cb = hook_exit, .stdio = io, .stdio_count = 3};
  c->proc.data = c;
  int rc = uv_spawn(loop, &c->proc, &po);
  if (rc) {
    c->hook_handles = 2;
    c->hook_running = 1;
    uv_close((uv_handle_t *)&c->proc, hook_handle_closed);
    uv_close((uv_handle_t *)&c->in, hook_handle_closed);
    return rc;
  }
  c->hook_running = 1;
  c->hook_handles = 3;
  uv_timer_init(loop, &c->hook_timer);
  c->hook_timer.data = c;
  uv_timer_start(&c->hook_timer, hook_timeout, (uint64_t)(conf->hook_timeout_s * 1000), 0);
  uv_buf_t b = uv_buf_init(body, (unsigned)strlen(body));
  c->wreq.data = c;
  if (uv_write(&c->wreq, (uv_stream_t *)&c->in, &b, 1, hook_written) != 0)
    uv_close((uv_handle_t *)&c->in, hook_handle_closed);
  return 0;
}

/* After each new advice: run the hook when some model's phones moved by the threshold,
 * no sooner than min_interval_s after the last run, with the phones to add cut to what
 * the spending cap leaves. */
static void hook_maybe(gw_capsvc *c, const cJSON *advice) {
  gw_server *gw = c->gw;
  const gw_config *conf = gw->conf;
  if ((!conf->hook_command && !conf->hook_url) || c->hook_running || gw->shutting_down) return;
  int64_t now = pr_clock_wall_ms();
  if (c->hook_last_ms && now - c->hook_last_ms < (int64_t)(conf->hook_min_interval_s * 1000)) return;
  if (!c->hook_sent) c->hook_sent = cJSON_CreateObject();
  int moved = 0;
  for (size_t i = 0; i < c->n_results; i++) {
    const gw_cap_result *r = &c->results[i].r;
    const cJSON *last = cJSON_GetObjectItemCaseSensitive(c->hook_sent, c->results[i].name);
    const cJSON *last_t = cJSON_GetObjectItemCaseSensitive(last, "target_phones");
    const cJSON *last_r = cJSON_GetObjectItemCaseSensitive(last, "release");
    double was = cJSON_IsNumber(last_t) ? last_t->valuedouble : r->phones_now;
    double was_release = cJSON_IsNumber(last_r) ? last_r->valuedouble : 0;
    int short_of = r->add - pending(c, c->results[i].name, now, starting_ms(conf, r));
    /* the advice moved (the phones it wants, or those it would release), or the fleet is
     * still short of what was asked a while ago; a release the hook was given already is
     * not given again while it stands */
    if (fabs((double)r->target_phones - was) >= conf->hook_threshold ||
        short_of >= conf->hook_threshold || fabs((double)r->release - was_release) >= conf->hook_threshold)
      moved = 1;
  }
  if (!moved) return;
  /* the asks, cut to the cap */
  double left = conf->hook_max_cost_per_day - asked_24h(c, now);
  cJSON *o = cJSON_Duplicate(advice, 1);
  cJSON *asks = cJSON_AddArrayToObject(o, "asks");
  int *adds = calloc(c->n_results ? c->n_results : 1, sizeof(int));
  if (!adds) {
    cJSON_Delete(o);
    return;
  }
  double cost = 0;
  int anything = 0, capped = 0, unpriced = 0;
  for (size_t i = 0; i < c->n_results; i++) {
    const gw_cap_result *r = &c->results[i].r;
    int add = r->add - pending(c, c->results[i].name, now, starting_ms(conf, r));
    if (add < 0) add = 0;
    char why[sizeof(c->unpriced_why)] = "";
    if (add > 0 && !(r->best_cost_per_day > 0)) {
      /* a phone without a price would pass any cap: not asked for */
      snprintf(why, sizeof(why), "%s: class \"%s\" has no price above 0 (capacity.prices, or "
               "its phones' cost_per_day), so the spending cap cannot count it", c->results[i].name, r->best);
      snprintf(c->unpriced_why, sizeof(c->unpriced_why), "%s", why);
      add = 0;
      unpriced = 1;
    }
    if (add > 0) {
      int fits = left - cost > 0 ? (int)floor((left - cost) / r->best_cost_per_day + 1e-9) : 0;
      if (fits < add) {
        add = fits;
        capped = 1;
      }
    }
    cost += add * r->best_cost_per_day;
    if (add > 0 || r->release > 0) anything = 1;
    adds[i] = add;
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "model", c->results[i].name);
    cJSON_AddNumberToObject(a, "phones_now", r->phones_now);
    cJSON_AddNumberToObject(a, "add", add);
    cJSON_AddNumberToObject(a, "advised_add", r->add);
    if (r->best[0]) cJSON_AddStringToObject(a, "class", r->best);
    cJSON_AddNumberToObject(a, "release", r->release);
    cJSON_AddNumberToObject(a, "target_phones", r->phones_now + add - r->release);
    if (why[0]) cJSON_AddStringToObject(a, "not_asked", why);
    cJSON_AddItemToArray(asks, a);
  }
  if (unpriced) {
    c->hook_unpriced++;
    if (!c->unpriced_said)
      pr_warn("capacity: the scale hook is not asked for phones of a class without a price: %s",
              c->unpriced_why);
    c->unpriced_said = 1;
  } else {
    c->unpriced_said = 0;
  }
  cJSON *sp = cJSON_AddObjectToObject(o, "spending");
  cJSON_AddNumberToObject(sp, "max_cost_per_day", conf->hook_max_cost_per_day);
  cJSON_AddNumberToObject(sp, "asked_cost_per_day_24h", round((conf->hook_max_cost_per_day - left) * 1e6) / 1e6);
  cJSON_AddNumberToObject(sp, "this_ask_cost_per_day", round(cost * 1e6) / 1e6);
  cJSON_AddBoolToObject(sp, "capped", capped);
  if (capped) c->hook_capped++;
  if (!anything) {
    if (capped && !c->capped_said) {
      pr_warn("capacity: the scale hook is not run: its asks over 24 hours reached "
              "capacity.hook.max_cost_per_day (%g)", conf->hook_max_cost_per_day);
      c->capped_said = 1;
    }
    cJSON_Delete(o);
    free(adds);
    c->hook_last_ms = now; /* not again before min_interval_s */
    return;
  }
  c->capped_said = 0;
  char *body = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!body) {
    free(adds);
    return;
  }
  c->hook_last_ms = now;
  /* the asks count from now, whether or not the hook then runs */
  for (size_t i = 0; i < c->n_results; i++) {
    const gw_cap_result *r = &c->results[i].r;
    if (adds[i] > 0) remember_ask(c, now, c->results[i].name, adds[i], adds[i] * r->best_cost_per_day);
    cJSON_DeleteItemFromObjectCaseSensitive(c->hook_sent, c->results[i].name);
    cJSON *given = cJSON_AddObjectToObject(c->hook_sent, c->results[i].name);
    cJSON_AddNumberToObject(given, "target_phones", r->target_phones);
    cJSON_AddNumberToObject(given, "release", r->release);
  }
  free(adds);
  c->pend_cost = cost;
  c->pend_total = conf->hook_max_cost_per_day - left + cost;
  if (c->hook_path) ledger_then_run(c, body, now);
  else hook_launch(c, body);
}

static void hook_launch(gw_capsvc *c, char *body) {
  int rc = hook_start(c, body);
  if (rc) {
    c->hook_failed++;
    pr_warn("capacity: cannot run the scale hook: %s", uv_strerror(rc));
    if (!c->hook_body) free(body);
    return;
  }
  c->hook_runs++;
  pr_info("capacity: scale hook run (asks %g a day of rent; %g of %g in 24 hours)", c->pend_cost,
          c->pend_total, c->gw->conf->hook_max_cost_per_day);
}

/* ---- the timer ---------------------------------------------------------------------------- */

static void refresh(gw_capsvc *c, int hook) {
  model_result *res = NULL;
  size_t n = 0;
  cJSON *a = advise_all(c, NULL, &res, &n);
  if (!a) return;
  cJSON_Delete(c->advice);
  free(c->results);
  c->advice = a;
  c->results = res;
  c->n_results = n;
  if (hook) hook_maybe(c, a);
}

static void tick(uv_timer_t *t) {
  gw_capsvc *c = t->data;
  int64_t now = pr_clock_wall_ms();
  if (!c->settled && now - c->started_ms > (int64_t)(c->gw->conf->heartbeat_timeout_s * 2000) + 5000) {
    /* phones from before the restart that did not come back left when it was written */
    gw_demand_phone_settle(c->demand, c->saved_ms ? c->saved_ms : c->started_ms);
    c->settled = 1;
  }
  uint64_t at = uv_now(c->gw->loop);
  if (at >= c->refresh_at) { /* at most 1 % of the loop, however many models (capacity.h) */
    uint64_t t0 = uv_hrtime();
    refresh(c, 1);
    c->refresh_at = at + gw_cap_refresh_gap_ms((double)(uv_hrtime() - t0) / 1e6) - CAP_TICK_MS / 2;
  }
  if (now - c->saved_ms >= CAP_SAVE_MS) save_async(c, now);
}

/* ---- the API ------------------------------------------------------------------------------ */

cJSON *gw_capsvc_json(gw_server *gw) {
  gw_capsvc *c = svc(gw);
  if (!c) return cJSON_CreateObject();
  refresh(c, 0); /* a reading runs no hook: the timer does */
  cJSON *o = c->advice ? cJSON_Duplicate(c->advice, 1) : cJSON_CreateObject();
  cJSON_AddItemToObject(o, "hook", hook_json(c));
  return o;
}

static int bad(int *status, pr_buf *err, const char *param, const char *msg) {
  *status = 400;
  pr_oai_error_body(err, msg, "invalid_request_error", param, "invalid_what_if");
  return -1;
}

static int num_field(const cJSON *o, const char *key, double lo, double hi, double *out,
                     const char *param, int *status, pr_buf *err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v) return 0;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
    char msg[200];
    snprintf(msg, sizeof(msg), "%s must be a number from %g to %g", param, lo, hi);
    return bad(status, err, param, msg);
  }
  *out = v->valuedouble;
  return 0;
}

cJSON *gw_capsvc_what_if(gw_server *gw, const char *body, size_t len, int *status, pr_buf *err) {
  gw_capsvc *c = svc(gw);
  pr_json_err je;
  cJSON *o = pr_json_parse(body, len, 8, &je);
  if (!cJSON_IsObject(o)) {
    cJSON_Delete(o);
    bad(status, err, NULL, "the body must be a JSON object: {\"model\", \"batch\": {\"lines\", "
                           "\"prompt_tokens\", \"output_tokens\"}, \"targets\": {...}, "
                           "\"arrivals_per_s\"}");
    return NULL;
  }
  static const char *const keys[] = {"model", "batch", "targets", "arrivals_per_s", NULL};
  for (const cJSON *it = o->child; it; it = it->next) {
    int known = 0;
    for (size_t i = 0; keys[i]; i++) known |= it->string && strcmp(it->string, keys[i]) == 0;
    if (!known) {
      char msg[200];
      snprintf(msg, sizeof(msg), "unknown field \"%.60s\"", it->string ? it->string : "");
      bad(status, err, it->string, msg);
      cJSON_Delete(o);
      return NULL;
    }
  }
  what_if wi = {.set = 1, .targets = {-1, -1, -2}, .arrivals_per_s = -1};
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
  int rc = 0;
  if (!cJSON_IsString(model) || !gw_model_known(gw_models_find(&gw->models, model->valuestring))) {
    char msg[300];
    snprintf(msg, sizeof(msg), cJSON_IsString(model) ? "no model \"%.128s\" is served or configured"
                                                     : "model: a model's name is required",
             cJSON_IsString(model) ? model->valuestring : "");
    *status = cJSON_IsString(model) ? 404 : 400;
    pr_oai_error_body(err, msg, "invalid_request_error", "model",
                      cJSON_IsString(model) ? "model_not_found" : "invalid_what_if");
    cJSON_Delete(o);
    return NULL;
  }
  wi.model = model->valuestring;
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "batch");
  if (b) {
    if (!cJSON_IsObject(b)) rc = bad(status, err, "batch", "batch must be an object");
    if (!rc) rc = num_field(b, "lines", 1, 1e9, &wi.lines, "batch.lines", status, err);
    if (!rc) rc = num_field(b, "prompt_tokens", 1, 1e7, &wi.in, "batch.prompt_tokens", status, err);
    if (!rc) rc = num_field(b, "output_tokens", 0, 1e7, &wi.out, "batch.output_tokens", status, err);
    if (!rc && (wi.lines <= 0 || wi.in <= 0))
      rc = bad(status, err, "batch", "a planned batch needs lines and prompt_tokens (per line)");
  }
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "targets");
  if (!rc && t) {
    if (!cJSON_IsObject(t)) rc = bad(status, err, "targets", "targets must be an object");
    if (!rc) rc = num_field(t, "interactive_wait_s", 0.01, 86400, &wi.targets.interactive_wait_s,
                            "targets.interactive_wait_s", status, err);
    if (!rc) rc = num_field(t, "review_within_s", 1, 604800, &wi.targets.review_within_s,
                            "targets.review_within_s", status, err);
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(t, "batch_by");
    unsigned h, m;
    char tail;
    if (!rc && by) {
      if (!cJSON_IsString(by) || strlen(by->valuestring) != 5 ||
          sscanf(by->valuestring, "%2u:%2u%c", &h, &m, &tail) != 2 || by->valuestring[2] != ':' ||
          h > 23 || m > 59)
        rc = bad(status, err, "targets.batch_by", "targets.batch_by must be a time of day \"HH:MM\"");
      else
        wi.targets.batch_by_min = (int)(h * 60 + m);
    }
  }
  if (!rc) rc = num_field(o, "arrivals_per_s", 0, 1e6, &wi.arrivals_per_s, "arrivals_per_s", status, err);
  if (rc) {
    cJSON_Delete(o);
    return NULL;
  }
  cJSON *a = advise_all(c, &wi, NULL, NULL);
  cJSON_Delete(o);
  if (!a) {
    *status = 500;
    pr_oai_error_body(err, "out of memory", "server_error", NULL, "internal_error");
    return NULL;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(a, "object");
  cJSON_AddStringToObject(a, "object", "capacity.what_if");
  return a;
}

cJSON *gw_capsvc_summary(gw_server *gw) {
  gw_capsvc *c = svc(gw);
  cJSON *arr = cJSON_CreateArray();
  for (size_t i = 0; c && i < c->n_results; i++) {
    const gw_cap_result *r = &c->results[i].r;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", c->results[i].name);
    cJSON_AddNumberToObject(o, "phones_now", r->phones_now);
    cJSON_AddNumberToObject(o, "add", r->add);
    cJSON_AddStringToObject(o, "class", r->best);
    cJSON_AddNumberToObject(o, "release", r->release);
    cJSON_AddNumberToObject(o, "target_phones", r->target_phones);
    cJSON_AddBoolToObject(o, "met_now", r->met_now);
    cJSON_AddNumberToObject(o, "cost_per_day_now", round(r->cost_per_day_now * 1000) / 1000);
    cJSON_AddNumberToObject(o, "cost_per_day", round(r->advised_cost_per_day * 1000) / 1000);
    if (r->wait_q_s >= 0) cJSON_AddNumberToObject(o, "wait_s", round(r->wait_q_s * 1000) / 1000);
    else cJSON_AddNullToObject(o, "wait_s");
    if (r->batch_finish_s >= 0) cJSON_AddNumberToObject(o, "batch_finish_s", round(r->batch_finish_s));
    else cJSON_AddNullToObject(o, "batch_finish_s");
    cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

/* A Prometheus label value: \ " and newline escaped. */
static void escape_label(const char *v, char *out, size_t n) {
  size_t k = 0;
  for (const char *p = v; *p && k + 3 < n; p++) {
    if (*p == '\\' || *p == '"') out[k++] = '\\';
    if (*p == '\n') {
      out[k++] = '\\';
      out[k++] = 'n';
      continue;
    }
    out[k++] = *p;
  }
  out[k] = 0;
}

int gw_capsvc_render(gw_server *gw, pr_buf *out) {
  gw_capsvc *c = svc(gw);
  if (!c) return 0;
  static const struct {
    const char *name, *help;
  } series[] = {
    {"fleetgate_capacity_phones", "usable phones serving the model now"},
    {"fleetgate_capacity_phones_advised", "phones the capacity advice says the model needs (now, at the next peak, for the batch)"},
    {"fleetgate_capacity_add", "phones of the advised class to add"},
    {"fleetgate_capacity_release", "idle phones the advice says could be released"},
    {"fleetgate_capacity_targets_met", "1 when the fleet as it stands meets the model's targets"},
    {"fleetgate_capacity_wait_seconds", "interactive wait at capacity.confidence on the fleet as it stands (-1: unbounded)"},
    {"fleetgate_capacity_batch_finish_seconds", "seconds until the batch backlog is done on today's phones (-1: never)"},
    {"fleetgate_capacity_cost_per_day", "the model's phones' cost per day after the advice"},
  };
  int rc = 0;
  for (size_t s = 0; s < sizeof(series) / sizeof(series[0]) && !rc; s++) {
    rc = pr_buf_appendf(out, "# HELP %s %s\n# TYPE %s gauge\n", series[s].name, series[s].help,
                        series[s].name);
    for (size_t i = 0; i < c->n_results && !rc; i++) {
      const gw_cap_result *r = &c->results[i].r;
      const double v[] = {r->phones_now, r->target_phones, r->add, r->release, r->met_now,
                          r->wait_q_s, r->batch_finish_s, r->advised_cost_per_day};
      char label[2 * sizeof(c->results[i].name)];
      escape_label(c->results[i].name, label, sizeof(label));
      rc = pr_buf_appendf(out, "%s{model=\"%s\"} %.6g\n", series[s].name, label, v[s]);
    }
  }
  if (!rc)
    rc = pr_buf_appendf(out,
                        "# HELP fleetgate_capacity_hook_runs_total scale hook runs, by how they ended\n"
                        "# TYPE fleetgate_capacity_hook_runs_total counter\n"
                        "fleetgate_capacity_hook_runs_total{result=\"started\"} %llu\n"
                        "fleetgate_capacity_hook_runs_total{result=\"failed\"} %llu\n"
                        "fleetgate_capacity_hook_runs_total{result=\"capped\"} %llu\n"
                        "fleetgate_capacity_hook_runs_total{result=\"unpriced\"} %llu\n",
                        (unsigned long long)c->hook_runs, (unsigned long long)c->hook_failed,
                        (unsigned long long)c->hook_capped, (unsigned long long)c->hook_unpriced);
  return rc ? rc : (out->cut ? PR_ETOOLARGE : 0);
}

/* ---- life --------------------------------------------------------------------------------- */

int gw_capsvc_init(gw_server *gw) {
  gw_capsvc *c = calloc(1, sizeof(*c));
  if (!c) return -ENOMEM;
  c->gw = gw;
  c->started_ms = pr_clock_wall_ms();
  c->demand = gw_demand_new(c->started_ms);
  if (!c->demand) {
    free(c);
    return -ENOMEM;
  }
  gw->capacity = c;
  if (gw->conf->data_dir) {
    size_t n = strlen(gw->conf->data_dir) + sizeof(CAP_FILE) + 2;
    if (n > 4000 || !(c->path = malloc(n))) return -ENOMEM;
    snprintf(c->path, n, "%s/%s", gw->conf->data_dir, CAP_FILE);
    load(c);
    if (gw->conf->hook_command || gw->conf->hook_url) {
      n = strlen(gw->conf->data_dir) + sizeof(CAP_HOOK_FILE) + 2;
      if (!(c->hook_path = malloc(n))) return -ENOMEM;
      snprintf(c->hook_path, n, "%s/%s", gw->conf->data_dir, CAP_HOOK_FILE);
      ledger_load(c);
    }
  }
  c->saved_ms = c->started_ms;
  /* the phones listed before this start (file replicas) were not starting */
  int64_t now = c->started_ms;
  for (size_t i = 0; i < gw->n_replicas; i++) {
    gw_demand_phone_join(c->demand, gw->replicas[i]->id, now, 0);
    seen *s = seen_of(c, gw->replicas[i]->id);
    if (s) s->last_ms = now;
  }
  uv_timer_init(gw->loop, &c->timer);
  c->timer.data = c;
  uv_timer_start(&c->timer, tick, CAP_TICK_MS, CAP_TICK_MS);
  c->timer_on = 1;
  return 0;
}

void gw_capsvc_shutdown(gw_server *gw) {
  gw_capsvc *c = svc(gw);
  if (!c) return;
  if (c->timer_on) {
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, NULL);
    c->timer_on = 0;
  }
  if (c->hook_running && gw->conf->hook_command && c->hook_handles == 3)
    pr_info("capacity: the scale hook still runs; it is left to finish on its own");
  if (c->hook_running && gw->conf->hook_url) {
    pr_curlreq_close(&c->hook_req, gw->curlm);
    c->hook_running = 0;
  }
}

static int free_seen(void *v, void *ud) {
  (void)ud;
  free(v);
  return 0;
}

void gw_capsvc_free(gw_server *gw) {
  gw_capsvc *c = svc(gw);
  if (!c) return;
  if (c->path && !c->saving) {
    char *s = history_text(c, pr_clock_wall_ms());
    int rc = s ? pr_privfile_write(c->path, s, 1) : -ENOMEM;
    if (rc) pr_warn("capacity: cannot write %s (%s)", c->path, strerror(-rc));
    free(s);
  }
  pr_idmap_sweep(&c->seen, free_seen, NULL);
  gw_demand_free(c->demand);
  cJSON_Delete(c->advice);
  cJSON_Delete(c->hook_sent);
  free(c->results);
  free(c->hook_body);
  free(c->save_text);
  free(c->path);
  free(c->hook_path);
  free(c->ledger_text);
  free(c->hook_pending);
  free(c);
  gw->capacity = NULL;
}
