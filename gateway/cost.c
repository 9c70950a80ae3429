/* Cost accounting over the registry and the running attempts; see cost.h. A replica's
 * price per slot is its cost_per_day over its slots (or over the requests it runs, should
 * they ever be more), so the requests on one phone never use more than the phone costs:
 * the models' and keys' costs add up to the fleet's busy cost, and the rest of what the
 * fleet cost is idle. */
#include "cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "err.h"
#include "ledger.h"

struct gw_cost {
  gw_ledger *ledger;
  uint64_t last_ms; /* the fleet's cost is in the ledger up to here */
};

int gw_cost_init(gw_server *gw) {
  uint64_t now = uv_now(gw->loop);
  gw->cost = calloc(1, sizeof(*gw->cost));
  if (!gw->cost || !(gw->cost->ledger = gw_ledger_new(now))) {
    free(gw->cost);
    gw->cost = NULL;
    return -ENOMEM;
  }
  gw->cost->last_ms = now;
  return 0;
}

void gw_cost_free(gw_server *gw) {
  if (!gw->cost) return;
  gw_ledger_free(gw->cost->ledger);
  free(gw->cost);
  gw->cost = NULL;
}

static const char *currency(const gw_server *gw) {
  return gw->conf && gw->conf->cost_currency ? gw->conf->cost_currency : "ACU";
}

/* What one slot of r costs per day. */
static double slot_price(const gw_replica *r) {
  int n = r->slots > r->inflight ? r->slots : r->inflight;
  return n > 0 && r->cost_per_day > 0 ? r->cost_per_day / n : 0;
}

/* a's slot time since it was last counted, up to now. */
static void attempt_use(gw_server *gw, gw_attempt *a, uint64_t now) {
  uint64_t from = a->cost_ms ? a->cost_ms : a->start_ms;
  if (now > from && a->replica) {
    const gw_job *j = a->job;
    gw_ledger_use(gw->cost->ledger, from, now, slot_price(a->replica), j->oai.model,
                  j->caller && j->caller->name ? j->caller->name : NULL);
  }
  if (now > from) a->cost_ms = now;
}

void gw_cost_tick(gw_server *gw, uint64_t now) {
  gw_cost *c = gw->cost;
  if (!c) return;
  if (now > c->last_ms) {
    double per_day = 0, down = 0;
    for (size_t i = 0; i < gw->n_replicas; i++) {
      const gw_replica *r = gw->replicas[i];
      per_day += r->cost_per_day;
      if (r->state != GW_REPLICA_READY) down += r->cost_per_day;
    }
    gw_ledger_fleet(c->ledger, c->last_ms, now, per_day, down);
    c->last_ms = now;
  }
  for (size_t i = 0; i < gw->n_replicas; i++) {
    gw_replica *r = gw->replicas[i];
    for (int k = 0; r->inflight > 0 && k < GW_MAX_SLOTS; k++)
      if (r->leases[k].id && r->leases[k].owner) attempt_use(gw, r->leases[k].owner, now);
  }
}

void gw_cost_attempt_end(gw_server *gw, gw_attempt *a) {
  if (gw->cost && a) attempt_use(gw, a, uv_now(gw->loop));
}

void gw_cost_on_job_ended(gw_server *gw, const gw_job_ended *ev, void *ud) {
  (void)ud;
  if (!gw->cost || !ev->served) return; /* failed: not served */
  gw_ledger_served(gw->cost->ledger, ev->now_ms, ev->model, ev->caller, ev->tokens_in + ev->tokens_out);
}

/* ---- readings ---------------------------------------------------------------------------- */

/* cost per `per` of n (1,000 requests, a million tokens), or null without any. */
static void add_per(cJSON *o, const char *key, double cost, uint64_t n, double per) {
  if (n) cJSON_AddNumberToObject(o, key, cost / (double)n * per);
  else cJSON_AddNullToObject(o, key);
}

static cJSON *fleet_json(const gw_ledger_sum *s) {
  cJSON *o = cJSON_CreateObject();
  double idle = s->cost > s->busy ? s->cost - s->busy : 0;
  cJSON_AddNumberToObject(o, "cost", s->cost);
  cJSON_AddNumberToObject(o, "busy_cost", s->busy);
  cJSON_AddNumberToObject(o, "idle_cost", idle);
  cJSON_AddNumberToObject(o, "down_cost", s->down);
  if (s->cost > 0) cJSON_AddNumberToObject(o, "idle_share", idle / s->cost);
  else cJSON_AddNullToObject(o, "idle_share");
  cJSON_AddNumberToObject(o, "requests", (double)s->requests);
  cJSON_AddNumberToObject(o, "tokens", (double)s->tokens);
  add_per(o, "cost_per_1k_requests", s->cost, s->requests, 1e3);
  add_per(o, "cost_per_million_tokens", s->cost, s->tokens, 1e6);
  add_per(o, "busy_cost_per_1k_requests", s->busy, s->requests, 1e3);
  add_per(o, "busy_cost_per_million_tokens", s->busy, s->tokens, 1e6);
  return o;
}

static cJSON *row_json(const char *field, const char *name, const gw_ledger_sum *s, double busy) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, field, name);
  cJSON_AddNumberToObject(o, "cost", s->busy);
  if (busy > 0) cJSON_AddNumberToObject(o, "share", s->busy / busy);
  else cJSON_AddNullToObject(o, "share");
  cJSON_AddNumberToObject(o, "requests", (double)s->requests);
  cJSON_AddNumberToObject(o, "tokens", (double)s->tokens);
  add_per(o, "cost_per_1k_requests", s->busy, s->requests, 1e3);
  add_per(o, "cost_per_million_tokens", s->busy, s->tokens, 1e6);
  return o;
}

static cJSON *window_json(gw_server *gw, uint64_t now, gw_ledger_window w, int active_only) {
  gw_ledger *l = gw->cost->ledger;
  gw_ledger_sum f;
  gw_ledger_sum_of(l, now, w, GW_LEDGER_MODEL, NULL, &f);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "window_s", round(f.span_s * 1000) / 1000);
  cJSON_AddItemToObject(o, "fleet", fleet_json(&f));
  static const char *const lists[] = {"models", "keys"}, *const fields[] = {"model", "key"};
  for (int kind = GW_LEDGER_MODEL; kind <= GW_LEDGER_KEY; kind++) {
    cJSON *arr = cJSON_AddArrayToObject(o, lists[kind]);
    for (size_t i = 0; i < gw_ledger_count(l, (gw_ledger_kind)kind); i++) {
      const char *name = gw_ledger_name(l, (gw_ledger_kind)kind, i);
      gw_ledger_sum s;
      gw_ledger_sum_of(l, now, w, (gw_ledger_kind)kind, name, &s);
      if (active_only && !(s.busy > 0) && !s.requests) continue;
      cJSON_AddItemToArray(arr, row_json(fields[kind], name, &s, f.busy));
    }
  }
  return o;
}

cJSON *gw_cost_json(gw_server *gw, int active_only) {
  cJSON *o = cJSON_CreateObject();
  if (!o || !gw->cost) return o;
  uint64_t now = uv_now(gw->loop);
  gw_cost_tick(gw, now);
  double per_day = 0;
  for (size_t i = 0; i < gw->n_replicas; i++) per_day += gw->replicas[i]->cost_per_day;
  cJSON_AddStringToObject(o, "currency", currency(gw));
  cJSON_AddNumberToObject(o, "cost_per_day", per_day);
  cJSON_AddItemToObject(o, "hour", window_json(gw, now, GW_LEDGER_HOUR, active_only));
  cJSON_AddItemToObject(o, "day", window_json(gw, now, GW_LEDGER_DAY, active_only));
  gw_ledger_sum t;
  gw_ledger_totals(gw->cost->ledger, now, &t);
  cJSON *since = cJSON_AddObjectToObject(o, "since_start");
  cJSON_AddNumberToObject(since, "window_s", round(t.span_s * 1000) / 1000);
  cJSON_AddNumberToObject(since, "cost", t.cost);
  cJSON_AddNumberToObject(since, "busy_cost", t.busy);
  cJSON_AddNumberToObject(since, "idle_cost", t.cost > t.busy ? t.cost - t.busy : 0);
  cJSON_AddNumberToObject(since, "requests", (double)t.requests);
  cJSON_AddNumberToObject(since, "tokens", (double)t.tokens);
  return o;
}

/* ---- Prometheus -------------------------------------------------------------------------- */

static void put_value(pr_buf *out, double v) { pr_buf_text(out, " %.9g\n", v); }

static void put_labelled(pr_buf *out, const char *metric, const char *label, const char *value, double v) {
  pr_buf_text(out, "%s{%s=\"", metric, label);
  for (const char *p = value; *p; p++) {
    if (*p == '\\') pr_buf_bytes(out, "\\\\", 2);
    else if (*p == '"') pr_buf_bytes(out, "\\\"", 2);
    else if (*p == '\n') pr_buf_bytes(out, "\\n", 2);
    else pr_buf_bytes(out, p, 1);
  }
  pr_buf_text(out, "%s", "\"}");
  put_value(out, v);
}

static void head(pr_buf *out, const char *name, const char *type, const char *help) {
  pr_buf_text(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One gauge per model or key with requests served in the last hour: cost per `per`. */
static void put_per(pr_buf *out, gw_ledger *l, uint64_t now, gw_ledger_kind kind, const char *metric,
                    const char *label, int tokens, const char *help) {
  head(out, metric, "gauge", help);
  for (size_t i = 0; i < gw_ledger_count(l, kind); i++) {
    const char *name = gw_ledger_name(l, kind, i);
    gw_ledger_sum s;
    gw_ledger_sum_of(l, now, GW_LEDGER_HOUR, kind, name, &s);
    uint64_t n = tokens ? s.tokens : s.requests;
    if (n) put_labelled(out, metric, label, name, s.busy / (double)n * (tokens ? 1e6 : 1e3));
  }
}

int gw_cost_render(gw_server *gw, pr_buf *out) {
  if (!gw->cost) return 0;
  uint64_t now = uv_now(gw->loop);
  gw_cost_tick(gw, now);
  gw_ledger *l = gw->cost->ledger;
  gw_ledger_sum f, t;
  gw_ledger_sum_of(l, now, GW_LEDGER_HOUR, GW_LEDGER_MODEL, NULL, &f);
  gw_ledger_totals(l, now, &t);
  head(out, "fleetgate_cost_info", "gauge", "Always 1; the currency label is the unit of every cost (costs.currency).");
  put_labelled(out, "fleetgate_cost_info", "currency", currency(gw), 1);
  put_per(out, l, now, GW_LEDGER_MODEL, "fleetgate_cost_per_1k_requests", "model", 0,
          "Cost of the slot time a model's requests used over the last hour, per 1,000 requests served.");
  put_per(out, l, now, GW_LEDGER_MODEL, "fleetgate_cost_per_million_tokens", "model", 1,
          "Cost of the slot time a model's requests used over the last hour, per million tokens served.");
  put_per(out, l, now, GW_LEDGER_KEY, "fleetgate_caller_cost_per_1k_requests", "caller", 0,
          "Cost of the slot time an API key's requests used over the last hour, per 1,000 requests served.");
  put_per(out, l, now, GW_LEDGER_KEY, "fleetgate_caller_cost_per_million_tokens", "caller", 1,
          "Cost of the slot time an API key's requests used over the last hour, per million tokens served.");
  head(out, "fleetgate_fleet_cost_per_1k_requests", "gauge",
       "What the whole fleet cost over the last hour (idle included) per 1,000 requests served.");
  if (f.requests) pr_buf_text(out, "fleetgate_fleet_cost_per_1k_requests %.9g\n", f.cost / (double)f.requests * 1e3);
  head(out, "fleetgate_fleet_cost_per_million_tokens", "gauge",
       "What the whole fleet cost over the last hour (idle included) per million tokens served.");
  if (f.tokens) pr_buf_text(out, "fleetgate_fleet_cost_per_million_tokens %.9g\n", f.cost / (double)f.tokens * 1e6);
  double idle = f.cost > f.busy ? f.cost - f.busy : 0;
  head(out, "fleetgate_fleet_cost_last_hour", "gauge", "What the fleet cost over the last hour.");
  pr_buf_text(out, "fleetgate_fleet_cost_last_hour %.9g\n", f.cost);
  head(out, "fleetgate_fleet_idle_cost_last_hour", "gauge",
       "The part of the last hour's fleet cost that no request used (phones waiting, down or loading).");
  pr_buf_text(out, "fleetgate_fleet_idle_cost_last_hour %.9g\n", idle);
  head(out, "fleetgate_fleet_cost_total", "counter", "What the fleet cost since the gateway started.");
  pr_buf_text(out, "fleetgate_fleet_cost_total %.9g\n", t.cost);
  head(out, "fleetgate_fleet_busy_cost_total", "counter",
       "The part of fleetgate_fleet_cost_total that requests used (their slot time).");
  pr_buf_text(out, "fleetgate_fleet_busy_cost_total %.9g\n", t.busy);
  return out->cut ? PR_ETOOLARGE : 0;
}
