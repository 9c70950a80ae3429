/* The capacity advice's arithmetic; see capacity.h and docs/capacity.md. */
#include "capacity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double gw_cap_erlang_c(int c, double a) {
  if (c <= 0 || a >= (double)c) return 1;
  if (a <= 0) return 0;
  double b = 1; /* Erlang B by its recurrence, stable for any c */
  for (int k = 1; k <= c; k++) b = a * b / ((double)k + a * b);
  return (double)c * b / ((double)c - a * (1 - b));
}

double gw_cap_wait_quantile(int c, double a, double service_s, double conf) {
  if (a <= 0) return 0;
  if (c <= 0 || a >= (double)c) return INFINITY;
  double pw = gw_cap_erlang_c(c, a);
  double tail = 1 - conf;
  if (pw <= tail) return 0;
  return service_s / ((double)c - a) * log(pw / tail);
}

double gw_cap_ac_scale(double ca2, double cs2) {
  if (!(ca2 >= 0) || !isfinite(ca2)) ca2 = 1;
  if (!(cs2 >= 0) || !isfinite(cs2)) cs2 = 1;
  return (ca2 + cs2) / 2;
}

double gw_cap_wait_mean_ac(int c, double a, double service_s, double ca2, double cs2) {
  if (a <= 0) return 0;
  if (c <= 0 || a >= (double)c) return INFINITY;
  return gw_cap_ac_scale(ca2, cs2) * gw_cap_erlang_c(c, a) * service_s / ((double)c - a);
}

double gw_cap_wait_quantile_ac(int c, double a, double service_s, double conf, double ca2, double cs2) {
  double w = gw_cap_wait_quantile(c, a, service_s, conf);
  return isfinite(w) && w > 0 ? w * gw_cap_ac_scale(ca2, cs2) : w;
}

double gw_cap_normal_quantile(double p) {
  if (!(p > 0)) return -INFINITY;
  if (!(p < 1)) return INFINITY;
  double lo = -40, hi = 40; /* bisection on the normal's distribution function */
  for (int i = 0; i < 200 && hi - lo > 1e-13; i++) {
    double mid = (lo + hi) / 2;
    if (0.5 * erfc(-mid / sqrt(2.0)) < p) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

double gw_cap_rate_margin(double count, double span_s, double conf) {
  if (!(count > 0) || !(span_s > 0) || !(conf > 0.5)) return 0;
  double z = gw_cap_normal_quantile(conf);
  return isfinite(z) ? z * sqrt(count) / span_s : 0;
}

int gw_cap_poisson_quantile(double mean, double conf) {
  if (!(mean > 0)) return 0;
  double p = exp(-mean), cum = p;
  int n = 0;
  while (cum < conf && n < 1000000) {
    n++;
    p *= mean / n;
    cum += p;
  }
  return n;
}

/* ---- the pool: the phones as M/M/c reads them -------------------------------------------- */

/* Tokens per request of a mix. */
typedef struct mix {
  double in, out;
} mix;

static double service(double pre, double dec, mix m) {
  return (pre > 0 ? m.in / pre : 0) + (dec > 0 ? m.out / dec : 0);
}

typedef struct pool {
  int slots, phones;
  double mu_int;   /* requests/s the slots complete at full use, interactive mix */
  double mu_rev;   /* the same for reviews alone */
  double thr_b;    /* batch lines/s */
  double cost;
  double best_rev; /* the quickest review on any of its phones (s) */
  int added;       /* of its phones, those the advice adds (newcomers to verification) */
} pool;

static void pool_add(pool *p, double pre, double dec, int slots, double cost, int n, mix mi,
                     mix mr, mix mb) {
  if (n <= 0 || slots <= 0) return;
  double si = service(pre, dec, mi), sr = service(pre, dec, mr), sb = service(pre, dec, mb);
  p->slots += slots * n;
  p->phones += n;
  p->cost += cost * n;
  if (si > 0) p->mu_int += (double)(slots * n) / si;
  if (sr > 0) p->mu_rev += (double)(slots * n) / sr;
  if (sb > 0) p->thr_b += (double)(slots * n) / sb;
  if (sr > 0 && (p->best_rev == 0 || sr < p->best_rev)) p->best_rev = sr;
}

/* The interactive demand the pool is checked against. */
typedef struct load {
  double lambda;   /* interactive + review arrivals/s */
  double lambda_r; /* of them, reviews */
  mix mi, mr;
  /* answers' checks: shadow requests of the interactive mix, per second (verify.c) */
  double v_share;  /* trusted phones': this share of lambda at most */
  double v_owed;   /* owed by the phones without a record now */
  double v_new;    /* owed by each phone added */
  double ca2, cs2; /* arrivals' and service times' squared coefficients of variation */
  double margin;   /* arrivals/s added to lambda: the rate's estimate's upper bound at the
                      confidence (now: read from a few hundred arrivals, it is noisy) */
} load;

/* Requests a second the pool's slots take: the callers' and the checks' shadows. */
static double offered(const pool *p, const load *l) {
  if (l->lambda <= 0) return 0;
  return (l->lambda + l->margin) * (1 + l->v_share) + l->v_owed + (double)p->added * l->v_new;
}

typedef struct verdict {
  double service_s, erlangs, wait_q, review_q, review_service_s, checks_per_s;
  int met;
  int review_unreachable;
} verdict;

static verdict judge(const pool *p, const load *l, const gw_targets *t, double conf) {
  verdict v = {0};
  v.met = 1;
  if (l->lambda <= 0) return v;
  if (p->slots <= 0 || p->mu_int <= 0) {
    v.met = 0;
    v.wait_q = INFINITY;
    v.review_q = INFINITY;
    return v;
  }
  v.service_s = (double)p->slots / p->mu_int;
  double lam = offered(p, l);
  v.checks_per_s = lam - (l->lambda + l->margin);
  v.erlangs = lam * v.service_s;
  v.wait_q = gw_cap_wait_quantile_ac(p->slots, v.erlangs, v.service_s, conf, l->ca2, l->cs2);
  if (!(v.wait_q <= t->interactive_wait_s)) v.met = 0;
  if (l->lambda_r > 0) {
    v.review_service_s = p->mu_rev > 0 ? (double)p->slots / p->mu_rev : INFINITY;
    v.review_q = v.wait_q + v.review_service_s;
    if (p->best_rev > t->review_within_s) v.review_unreachable = 1;
    if (!(v.review_q <= t->review_within_s)) v.met = 0;
  }
  return v;
}

/* The pool of the usable phones, less those marked in skip. */
static pool fleet_pool(const gw_cap_input *in, const unsigned char *skip, mix mi, mix mr, mix mb) {
  pool p = {0};
  for (size_t i = 0; i < in->n_phones; i++) {
    const gw_cap_phone *ph = &in->phones[i];
    if (!ph->usable || (skip && skip[i])) continue;
    pool_add(&p, ph->prefill_tps, ph->decode_tps, ph->slots, ph->cost_per_day, 1, mi, mr, mb);
  }
  return p;
}

static pool with(pool p, const gw_cap_class *k, int n, mix mi, mix mr, mix mb) {
  pool_add(&p, k->prefill_tps, k->decode_tps, k->slots, k->cost_per_day, n, mi, mr, mb);
  if (n > 0) p.added += n;
  return p;
}

/* The fewest phones of k that, added to base, meet the targets for l (-1: none do). */
static int fewest(const pool *base, const gw_cap_class *k, const load *l, const gw_targets *t,
                  double conf, mix mi, mix mr, mix mb) {
  if (judge(base, l, t, conf).met) return 0;
  pool most = with(*base, k, GW_CAP_MAX_ADD, mi, mr, mb);
  if (!judge(&most, l, t, conf).met) return -1;
  int lo = 0, hi = GW_CAP_MAX_ADD; /* lo fails, hi meets */
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    pool p = with(*base, k, mid, mi, mr, mb);
    if (judge(&p, l, t, conf).met) hi = mid;
    else lo = mid;
  }
  return hi;
}

/* Phones lost to churn while their replacements start, at the confidence. */
static int churn_extra(const gw_cap_input *in, int phones) {
  double mean = in->gone_per_h * (double)phones * in->startup_s / 3600.0;
  return gw_cap_poisson_quantile(mean, in->confidence);
}

/* Whether p still meets l with its `extra` most capable phones gone (churn's margin). The
 * phones' own capacities are compared per slot-rate, so the loss is the worst case. */
static int meets_less(const gw_cap_input *in, const unsigned char *skip0, int extra, const load *l,
                      const gw_targets *t, mix mi, mix mr, mix mb) {
  unsigned char *skip = calloc(in->n_phones ? in->n_phones : 1, 1);
  if (!skip) return 0;
  if (skip0) memcpy(skip, skip0, in->n_phones);
  for (int e = 0; e < extra; e++) {
    size_t best = in->n_phones;
    double bc = -1;
    for (size_t i = 0; i < in->n_phones; i++) {
      const gw_cap_phone *ph = &in->phones[i];
      if (!ph->usable || skip[i]) continue;
      double s = service(ph->prefill_tps, ph->decode_tps, mi);
      double c = s > 0 ? ph->slots / s : 0;
      if (c > bc) {
        bc = c;
        best = i;
      }
    }
    if (best == in->n_phones) break;
    skip[best] = 1;
  }
  pool p = fleet_pool(in, skip, mi, mr, mb);
  int ok = judge(&p, l, t, in->confidence).met;
  free(skip);
  return ok;
}

/* ---- the batch: work over time -------------------------------------------------------------- */

/* Seconds until `lines` are done at thr lines/s now and k phones of t lines/s each from
 * startup on (-1: never). */
static double batch_finish(double lines, double thr, double t, int k, double startup) {
  if (lines <= 0) return 0;
  if (thr > 0 && lines <= thr * startup) return lines / thr;
  double all = thr + (double)k * t;
  if (all <= 0) return -1;
  return (lines + (double)k * t * startup) / all;
}

/* ---- the JSON ------------------------------------------------------------------------------- */

static void num(cJSON *o, const char *k, double v) {
  if (isfinite(v)) cJSON_AddNumberToObject(o, k, round(v * 1000) / 1000);
  else cJSON_AddNullToObject(o, k);
}

static cJSON *rate_json(const gw_demand_rate *r) {
  cJSON *o = cJSON_CreateObject();
  num(o, "arrivals_per_s", r->arrivals_per_s);
  num(o, "prompt_tokens", r->mean_in);
  num(o, "output_tokens", r->mean_out);
  num(o, "requests", r->requests);
  num(o, "answered", r->ended);
  num(o, "span_s", r->span_s);
  num(o, "served", r->served);
  num(o, "service_s", r->service_s);
  num(o, "service_scv", r->served >= 2 ? r->service_scv : NAN);
  return o;
}

static mix mix_of(const gw_demand_rate *a, const gw_demand_rate *b, double expected_out) {
  double n = a->requests + (b ? b->requests : 0), e = a->ended + (b ? b->ended : 0);
  mix m = {0, expected_out};
  if (n > 0) m.in = (a->mean_in * a->requests + (b ? b->mean_in * b->requests : 0)) / n;
  if (e > 0) m.out = (a->mean_out * a->ended + (b ? b->mean_out * b->ended : 0)) / e;
  return m;
}

static load load_of(const gw_demand_rate *r, double expected_out, const gw_cap_input *in) {
  load l = {.v_share = in->verify_share, .v_owed = in->verify_owed_per_s,
            .v_new = in->verify_new_per_s, .ca2 = GW_CAP_ARRIVALS_SCV, .cs2 = 1};
  if (in->service_samples >= GW_CAP_SCV_MIN_SAMPLES && isfinite(in->service_scv) && in->service_scv >= 0)
    l.cs2 = in->service_scv;
  l.lambda = r[GW_DEMAND_INTERACTIVE].arrivals_per_s + r[GW_DEMAND_REVIEW].arrivals_per_s;
  l.lambda_r = r[GW_DEMAND_REVIEW].arrivals_per_s;
  l.mi = mix_of(&r[GW_DEMAND_INTERACTIVE], &r[GW_DEMAND_REVIEW], expected_out);
  l.mr = mix_of(&r[GW_DEMAND_REVIEW], NULL, expected_out);
  return l;
}

static cJSON *verdict_json(const verdict *v, const load *l, const gw_targets *t, const pool *p) {
  cJSON *o = cJSON_CreateObject();
  num(o, "arrivals_per_s", l->lambda);
  num(o, "arrivals_margin_per_s", l->margin);
  num(o, "checks_per_s", v->checks_per_s);
  num(o, "phones", p->phones);
  num(o, "slots", p->slots);
  num(o, "service_s", v->service_s);
  num(o, "load_erlangs", v->erlangs);
  num(o, "wait_s", v->wait_q);
  num(o, "wait_target_s", t->interactive_wait_s);
  num(o, "wait_scale", gw_cap_ac_scale(l->ca2, l->cs2));
  if (l->lambda_r > 0) {
    num(o, "review_s", v->review_q);
    num(o, "review_target_s", t->review_within_s);
  }
  cJSON_AddBoolToObject(o, "met", v->met);
  return o;
}

cJSON *gw_capacity_advise(const gw_cap_input *in, gw_cap_result *res) {
  memset(res, 0, sizeof(*res));
  const gw_targets *t = &in->targets;
  double conf = in->confidence;
  load now = load_of(in->now, in->expected_out, in);
  /* the rate now is an estimate from the arrivals counted: planned for its upper bound at
   * the confidence, the classes' Poisson variances added */
  {
    double var = 0;
    for (int k = GW_DEMAND_INTERACTIVE; k <= GW_DEMAND_REVIEW; k++)
      if (in->rate_span_s[k] > 0 && in->rate_count[k] > 0)
        var += in->rate_count[k] / (in->rate_span_s[k] * in->rate_span_s[k]);
    double z = conf > 0.5 ? gw_cap_normal_quantile(conf) : 0;
    if (now.lambda > 0 && var > 0 && isfinite(z)) now.margin = z * sqrt(var);
  }
  /* the next peak: the busiest hour of the week, or now when that is busier */
  load peak = load_of(in->peak, in->expected_out, in);
  if (peak.lambda < now.lambda || peak.lambda <= 0) peak = now;
  else peak.v_owed = 0; /* today's phones have their records by then */
  mix mi = now.mi, mr = now.mr;
  if (peak.lambda > now.lambda) {
    mi = peak.mi;
    mr = peak.mr;
  }
  mix mb = {in->expected_out * 8, in->expected_out};
  if (in->backlog_lines > 0) {
    mb.in = in->backlog_in / in->backlog_lines;
    mb.out = in->backlog_out / in->backlog_lines;
  } else if (in->now[GW_DEMAND_BATCH].requests > 0) {
    mb = mix_of(&in->now[GW_DEMAND_BATCH], NULL, in->expected_out);
  }

  pool fleet = fleet_pool(in, NULL, mi, mr, mb);
  pool fleet_now = fleet_pool(in, NULL, now.mi, now.mr, mb);
  /* A newcomer's first checks (answers verified) may each hold it out of new work until
   * they are decided, about one service time of the interactive mix (its request again on
   * it and on a witness): counted as part of its start-up. The fleet's mean service, or
   * the quickest candidate's when there is no fleet. */
  double vet_service = fleet.mu_int > 0 ? (double)fleet.slots / fleet.mu_int : 0;
  for (size_t k = 0; vet_service <= 0 && k < in->n_classes; k++)
    vet_service = service(in->classes[k].prefill_tps, in->classes[k].decode_tps, mi);
  double vet_s = in->vet_checks > 0 ? (double)in->vet_checks * vet_service : 0;
  gw_cap_input vin = *in;
  vin.startup_s = in->startup_s + vet_s;
  const gw_cap_input *given = in;
  in = &vin; /* below, the start-up includes the checks' holds */
  verdict v_now = judge(&fleet_now, &now, t, conf);
  verdict v_peak = judge(&fleet, &peak, t, conf);
  res->phones_now = fleet.phones;
  res->join_s = in->startup_s;
  res->cost_per_day_now = fleet.cost;
  res->wait_q_s = isfinite(v_now.wait_q) ? v_now.wait_q : -1;
  res->wait_scale = gw_cap_ac_scale(now.ca2, now.cs2);

  /* the batch backlog on today's phones, after the interactive work's share of the slots */
  double u = fleet_now.slots > 0 ? v_now.erlangs / fleet_now.slots : 0;
  if (u > 1) u = 1;
  double thr = (1 - u) * fleet.thr_b;
  double fin_now = batch_finish(in->backlog_lines, thr, 0, 0, in->startup_s);
  res->batch_finish_s = fin_now;

  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "model", in->model);
  cJSON *tj = cJSON_AddObjectToObject(o, "targets");
  num(tj, "interactive_wait_s", t->interactive_wait_s);
  num(tj, "review_within_s", t->review_within_s);
  if (t->batch_by_min >= 0) {
    char hm[16];
    snprintf(hm, sizeof(hm), "%02d:%02d", t->batch_by_min / 60, t->batch_by_min % 60);
    cJSON_AddStringToObject(tj, "batch_by", hm);
  } else {
    cJSON_AddNullToObject(tj, "batch_by");
  }
  num(tj, "confidence", conf);

  cJSON *dj = cJSON_AddObjectToObject(o, "demand");
  cJSON *dn = cJSON_AddObjectToObject(dj, "now");
  cJSON *dp = cJSON_AddObjectToObject(dj, "peak");
  for (int c = 0; c < GW_DEMAND_CLASSES; c++) {
    cJSON_AddItemToObject(dn, gw_demand_class_name(c), rate_json(&in->now[c]));
    cJSON_AddItemToObject(dp, gw_demand_class_name(c), rate_json(&in->peak[c]));
  }
  num(dp, "from_ms", (double)in->peak_from_ms);
  cJSON_AddStringToObject(dj, "basis", "requests counted as they reached this gateway's queue "
                                        "(now: over capacity.window_s, or since the load's last step up "
                                        "within it when busier; demand.json keeps them across restarts); prompt tokens: "
                                        "the request's estimate; answer tokens: the usage of those "
                                        "answered; service: how long those answers held a slot; "
                                        "checks' shadow requests are not demand (interactive.checks_per_s)");

  cJSON *cj = cJSON_AddObjectToObject(o, "churn");
  num(cj, "gone_per_h", in->gone_per_h);
  num(cj, "startup_s", given->startup_s);
  cJSON_AddStringToObject(cj, "startup_basis", in->startup_basis ? in->startup_basis : "");
  num(cj, "checks_hold_s", vet_s);
  cJSON_AddStringToObject(cj, "checks_hold_basis",
                          in->vet_checks > 0 ? "answers verified: a newcomer's first verify.trust_after checks "
                                               "may each hold it out of new work for about one mean service time"
                                             : "answers not verified: no hold");
  num(cj, "join_s", in->startup_s);
  cJSON_AddStringToObject(cj, "basis", in->churn_basis ? in->churn_basis : "");

  /* every candidate class: the phones of it each target needs */
  cJSON *classes = cJSON_AddArrayToObject(o, "classes");
  int best = -1, best_add = 0, best_now = 0, best_peak = 0, best_batch = 0;
  double best_cost = 0;
  int unreachable_all = in->n_classes > 0;
  double deadline = in->batch_deadline_s;
  for (size_t k = 0; k < in->n_classes; k++) {
    const gw_cap_class *cl = &in->classes[k];
    int a_now = fewest(&fleet_now, cl, &now, t, conf, now.mi, now.mr, mb);
    int a_peak = fewest(&fleet, cl, &peak, t, conf, mi, mr, mb);
    int a_batch = 0;
    double tj1 = 0;
    {
      pool one = {0};
      pool_add(&one, cl->prefill_tps, cl->decode_tps, cl->slots, 0, 1, mi, mr, mb);
      tj1 = one.thr_b;
    }
    int batch_unreachable = 0;
    if (in->backlog_lines > 0 && deadline >= 0 && !(fin_now >= 0 && fin_now * GW_CAP_BATCH_SLACK <= deadline)) {
      /* a phone that leaves mid-way did half its share on average */
      double keep = 1 - fmin(0.9, in->gone_per_h * deadline / 3600.0 / 2);
      if (deadline <= in->startup_s || tj1 <= 0) {
        batch_unreachable = 1;
      } else {
        double need = (in->backlog_lines * GW_CAP_BATCH_SLACK - thr * deadline) /
                      (tj1 * keep * (deadline - in->startup_s));
        a_batch = (int)ceil(need - 1e-9);
        if (a_batch > GW_CAP_MAX_ADD) batch_unreachable = 1;
      }
    }
    int ok = a_now >= 0 && a_peak >= 0 && !batch_unreachable;
    int x_now = a_now >= 0 ? a_now + (a_now > 0 || !meets_less(in, NULL, churn_extra(in, fleet.phones), &now, t, now.mi, now.mr, mb)
                                          ? churn_extra(in, fleet.phones + a_now) : 0)
                           : -1;
    int x_peak = a_peak >= 0 ? a_peak + (a_peak > 0 || !meets_less(in, NULL, churn_extra(in, fleet.phones), &peak, t, mi, mr, mb)
                                             ? churn_extra(in, fleet.phones + a_peak) : 0)
                             : -1;
    int add = 0;
    if (ok) {
      add = x_now > x_peak ? x_now : x_peak;
      if (a_batch > add) add = a_batch;
    }
    double cost = (double)add * cl->cost_per_day;
    cJSON *co = cJSON_CreateObject();
    cJSON_AddStringToObject(co, "class", cl->name);
    cJSON_AddStringToObject(co, "source", cl->priced ? "capacity.prices" : "the fleet's own phones");
    num(co, "cost_per_day", cl->cost_per_day);
    num(co, "slots", cl->slots);
    num(co, "prefill_tps", cl->prefill_tps);
    num(co, "decode_tps", cl->decode_tps);
    num(co, "add_now", x_now);
    num(co, "add_peak", x_peak);
    num(co, "add_batch", batch_unreachable ? -1 : a_batch);
    if (ok) {
      num(co, "add", add);
      num(co, "added_cost_per_day", cost);
    } else {
      cJSON_AddNullToObject(co, "add");
      cJSON_AddStringToObject(co, "unreachable", a_now < 0 || a_peak < 0
                                                     ? "no number of these phones meets the interactive targets (a review alone takes too long on it)"
                                                     : "the batch cannot finish by its deadline: new phones start too late");
    }
    cJSON_AddItemToArray(classes, co);
    if (!ok) continue;
    unreachable_all = 0;
    if (best < 0 || cost < best_cost || (cost == best_cost && add < best_add)) {
      best = (int)k;
      best_add = add;
      best_cost = cost;
      best_now = x_now;
      best_peak = x_peak;
      best_batch = a_batch;
    }
  }
  res->unreachable = unreachable_all || v_now.review_unreachable;

  cJSON *ij = cJSON_AddObjectToObject(o, "interactive");
  cJSON_AddItemToObject(ij, "now", verdict_json(&v_now, &now, t, &fleet_now));
  cJSON_AddItemToObject(ij, "peak", verdict_json(&v_peak, &peak, t, &fleet));
  /* what the waits' scale rests on: the answers' variability, measured or assumed */
  cJSON *vj = cJSON_AddObjectToObject(ij, "variability");
  num(vj, "arrivals_scv", now.ca2);
  cJSON_AddStringToObject(vj, "arrivals_basis", "assumed Poisson-like (1): not measured");
  num(vj, "service_scv", now.cs2);
  num(vj, "service_scv_measured", in->service_samples > 0 ? in->service_scv : NAN);
  num(vj, "service_samples", in->service_samples);
  char vb[200];
  if (in->service_samples >= GW_CAP_SCV_MIN_SAMPLES)
    snprintf(vb, sizeof(vb), "measured: the slot times of %.0f answers (interactive and reviews) in the last hour",
             in->service_samples);
  else
    snprintf(vb, sizeof(vb), "assumed exponential (1, Erlang C): %.0f answers measured in the last hour, fewer than %d",
             in->service_samples, GW_CAP_SCV_MIN_SAMPLES);
  cJSON_AddStringToObject(vj, "service_basis", vb);
  num(vj, "wait_scale", gw_cap_ac_scale(now.ca2, now.cs2));
  cJSON_AddStringToObject(ij, "basis", "Allen-Cunneen (G/G/c): Erlang C's wait scaled by (Ca^2 + Cs^2) / 2 "
                                       "(variability.wait_scale); c = the usable phones' slots, service = "
                                       "the slots over what they complete per second at their "
                                       "learned rates for the measured prompt and answer lengths; "
                                       "arrivals: the callers' (now: planned at the rate's upper "
                                       "bound at `confidence`, arrivals_margin_per_s more, from the "
                                       "arrivals it was read from) and the answer checks' shadow "
                                       "requests (checks_per_s: verify.budget's share, those the "
                                       "phones without a record owe, and those each phone added "
                                       "owes); wait_s is the wait not passed by `confidence` of "
                                       "requests: waiting with Erlang C's probability, for an "
                                       "exponential time of Erlang C's mean times the scale");

  /* the batch: finish on today's phones, with k more */
  cJSON *bj = cJSON_AddObjectToObject(o, "batch");
  num(bj, "lines", in->backlog_lines);
  num(bj, "prompt_tokens", in->backlog_in);
  num(bj, "output_tokens", in->backlog_out);
  num(bj, "lines_per_s", thr);
  num(bj, "finish_s", fin_now);
  num(bj, "deadline_s", deadline);
  cJSON_AddStringToObject(bj, "deadline_basis", in->batch_deadline_basis ? in->batch_deadline_basis : "");
  if (best >= 0) {
    pool one = {0};
    pool_add(&one, in->classes[best].prefill_tps, in->classes[best].decode_tps, in->classes[best].slots,
             0, 1, mi, mr, mb);
    cJSON *fw = cJSON_AddArrayToObject(bj, "finish_with");
    static const int ks[] = {1, 2, 5, 10, 50, 100};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]) && in->backlog_lines > 0; i++) {
      cJSON *e = cJSON_CreateObject();
      num(e, "add", ks[i]);
      num(e, "finish_s", batch_finish(in->backlog_lines, thr, one.thr_b, ks[i], in->startup_s));
      cJSON_AddItemToArray(fw, e);
    }
    if (best_batch > 0) {
      num(bj, "add", best_batch);
      num(bj, "finish_with_add_s", batch_finish(in->backlog_lines, thr, one.thr_b, best_batch, in->startup_s));
    }
  }
  cJSON_AddStringToObject(bj, "basis", "work over time: each line's estimated prompt and answer "
                                       "tokens at each phone's learned rates, on the slots the "
                                       "interactive load leaves; added phones work from their "
                                       "start-up on; phones are planned for 10 % more work than "
                                       "predicted (finish_s is the plain prediction)");

  /* release: idle phones the targets do not need (checked with churn's margin kept) */
  unsigned char *skip = calloc(in->n_phones ? in->n_phones : 1, 1);
  cJSON *rel = cJSON_CreateArray();
  if (skip && best_add == 0 && !res->unreachable) {
    for (;;) {
      size_t pick = in->n_phones;
      double worst = -1;
      for (size_t i = 0; i < in->n_phones; i++) {
        const gw_cap_phone *ph = &in->phones[i];
        if (!ph->usable || skip[i] || ph->idle_s < in->idle_release_s) continue;
        double s = service(ph->prefill_tps, ph->decode_tps, mi);
        double per = s > 0 ? ph->cost_per_day / (ph->slots / s) : ph->cost_per_day;
        if (per > worst) {
          worst = per;
          pick = i;
        }
      }
      if (pick == in->n_phones) break;
      skip[pick] = 1;
      int extra = churn_extra(in, res->phones_now - res->release - 1);
      pool p = fleet_pool(in, skip, mi, mr, mb);
      double u2 = p.slots > 0 ? judge(&p, &now, t, conf).erlangs / p.slots : 1;
      double fin = batch_finish(in->backlog_lines, (1 - fmin(1, u2)) * p.thr_b, 0, 0, 0);
      int batch_ok = in->backlog_lines <= 0 || deadline < 0 ||
                     (fin >= 0 && fin * GW_CAP_BATCH_SLACK <= deadline);
      if (!batch_ok || !meets_less(in, skip, extra, &now, t, now.mi, now.mr, mb) ||
          !meets_less(in, skip, extra, &peak, t, mi, mr, mb)) {
        skip[pick] = 0;
        break;
      }
      res->release++;
      res->release_saving_per_day += in->phones[pick].cost_per_day;
      cJSON_AddItemToArray(rel, cJSON_CreateString(in->phones[pick].id));
    }
  }
  free(skip);

  res->add_now = best_now > 0 ? best_now : 0;
  res->add_peak = best_peak > 0 ? best_peak : 0;
  res->add_batch = best_batch;
  res->add = best_add;
  if (best >= 0) {
    snprintf(res->best, sizeof(res->best), "%s", in->classes[best].name);
    res->best_cost_per_day = in->classes[best].cost_per_day;
  }
  res->met_now = v_now.met && v_peak.met && (in->backlog_lines <= 0 || deadline < 0 ||
                                             (fin_now >= 0 && fin_now * GW_CAP_BATCH_SLACK <= deadline));
  res->target_phones = res->phones_now + res->add - res->release;
  res->advised_cost_per_day = res->cost_per_day_now + best_cost - res->release_saving_per_day;

  cJSON *aj = cJSON_AddObjectToObject(o, "advice");
  num(aj, "phones_now", res->phones_now);
  num(aj, "add", res->add);
  num(aj, "add_now", res->add_now);
  num(aj, "add_peak", res->add_peak);
  num(aj, "add_batch", res->add_batch);
  if (best >= 0) cJSON_AddStringToObject(aj, "class", res->best);
  else cJSON_AddNullToObject(aj, "class");
  num(aj, "release", res->release);
  cJSON_AddItemToObject(aj, "release_ids", rel);
  num(aj, "release_saving_per_day", res->release_saving_per_day);
  num(aj, "target_phones", res->target_phones);
  num(aj, "cost_per_day_now", res->cost_per_day_now);
  num(aj, "cost_per_day", res->advised_cost_per_day);
  num(aj, "added_cost_per_day", best_cost);
  cJSON_AddBoolToObject(aj, "met_now", res->met_now);
  cJSON_AddBoolToObject(aj, "unreachable", res->unreachable);
  cJSON_AddStringToObject(aj, "basis", "the cheapest class per day that meets every target now, at "
                                       "the next peak and for the batch, with the phones churn takes "
                                       "while replacements start (a Poisson quantile at "
                                       "`confidence`); release: idle phones whose going keeps "
                                       "every target met with that margin");
  return o;
}

uint64_t gw_cap_refresh_gap_ms(double took_ms) {
  double gap = took_ms * GW_CAP_REFRESH_SHARE;
  if (!(gap > GW_CAP_REFRESH_MS)) return GW_CAP_REFRESH_MS; /* also a NaN or negative time */
  return gap < 3600000.0 ? (uint64_t)gap : 3600000u;
}
