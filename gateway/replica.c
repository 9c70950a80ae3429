/* Replica bookkeeping: leases on slots, learned speed, passive health; see replica.h. */
#include "replica.h"

#include "feat.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "device.h"
#include "oai.h"
#include "order.h"

/* Weight of a new sample in the moving averages: fast to learn, slow to forget one
 * outlier. The first samples replace the configured seed faster. */
#define GW_EWMA_ALPHA 0.3
/* Rates of a phone nothing is known of, while no phone of its model was measured. */
#define GW_DEFAULT_PREFILL_TPS 50.0
#define GW_DEFAULT_DECODE_TPS 5.0

gw_replica *gw_replica_new(const char *id, const char *url, const char *token,
                           char *const *models, size_t n_models, int slots, int64_t n_ctx,
                           double prefill_tps, double decode_tps, double cost_per_day) {
  gw_replica *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->id = strdup(id);
  r->url = strdup(url);
  r->token = token ? strdup(token) : NULL;
  r->models = calloc(n_models + 1, sizeof(char *));
  if (!r->id || !r->url || !r->models || (token && !r->token)) goto fail;
  for (size_t i = 0; i < n_models; i++) {
    r->models[i] = strdup(models[i]);
    if (!r->models[i]) goto fail;
    r->n_models++;
  }
  r->slots = slots < 1 ? 1 : slots > GW_MAX_SLOTS ? GW_MAX_SLOTS : slots;
  r->n_ctx = n_ctx;
  r->prefill_tps = prefill_tps > 0 ? prefill_tps : GW_DEFAULT_PREFILL_TPS;
  r->decode_tps = decode_tps > 0 ? decode_tps : GW_DEFAULT_DECODE_TPS;
  r->rates_default = (prefill_tps > 0 ? 0 : 1) | (decode_tps > 0 ? 0 : 2);
  r->cost_per_day = cost_per_day > 0 ? cost_per_day : 0;
  r->cost_conf = cost_per_day;
  r->cost_claim = -1;
  r->state = GW_REPLICA_READY;
  r->next_lease = 1;
  r->choices_max = 1;
  /* the parts' own "nothing known yet" */
  r->report = (gw_replica_report)GW_REPLICA_REPORT_UNKNOWN;
  r->dev = (gw_replica_device)GW_REPLICA_DEVICE_NONE;
  gw_pcache_shape(&r->pc, r->slots);
  return r;
fail:
  gw_replica_free(r);
  return NULL;
}

void gw_replica_free(gw_replica *r) {
  if (!r) return;
  free(r->id);
  free(r->url);
  free(r->token);
  free(r->labels);
  for (size_t i = 0; i < r->n_models; i++) free(r->models[i]);
  free(r->models);
  free(r);
}

int gw_replica_set_strings(gw_replica *r, const char *url, const char *token,
                           char *const *models, size_t n_models, const char *labels) {
  char *u = strdup(url);
  char *t = token ? strdup(token) : NULL;
  char *l = labels ? strdup(labels) : NULL;
  char **m = calloc(n_models + 1, sizeof(char *));
  size_t nm = 0;
  int ok = u && (!token || t) && (!labels || l) && m;
  for (size_t i = 0; ok && i < n_models; i++) {
    if (!(m[i] = strdup(models[i]))) ok = 0;
    else nm++;
  }
  if (!ok) {
    free(u);
    free(t);
    free(l);
    for (size_t i = 0; i < nm; i++) free(m[i]);
    free(m);
    return -ENOMEM;
  }
  /* another address (a phone moved to another tunnel): its usual probe time is unknown */
  if (r->url && strcmp(r->url, u) != 0) r->health.probe_srtt_ms = r->health.probe_rttvar_ms = 0;
  free(r->url);
  free(r->token);
  free(r->labels);
  for (size_t i = 0; i < r->n_models; i++) free(r->models[i]);
  free(r->models);
  r->url = u;
  r->token = t;
  r->labels = l;
  r->models = m;
  r->n_models = nm;
  return 0;
}

int gw_replica_held_set(gw_replica *r, uint32_t bits, int on) {
  uint32_t was = r->held;
  bits &= GW_HELD_KEPT;
  if (on) r->held |= bits;
  else r->held &= ~bits;
  return r->held != was;
}

static const char *const held_names[GW_HELD_N] = {
    "down", "loading", "removed", "drained_config", "drained_admin", "drained_agent", "placing",
    "quarantined", "held_for_check", "probation", "share_cap", "device", "other_gateways", "busy",
};

const char *gw_replica_held_name(uint32_t bit) {
  for (int i = 0; i < GW_HELD_N; i++)
    if (bit == 1u << i) return held_names[i];
  return NULL;
}

const char *gw_replica_held_names(uint32_t why, char *buf, size_t cap) {
  size_t k = 0;
  if (cap) buf[0] = '\0';
  for (int i = 0; i < GW_HELD_N && cap; i++) {
    if (!(why & (1u << i))) continue;
    int n = snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", held_names[i]);
    if (n < 0 || (size_t)n >= cap - k) {
      buf[k] = '\0'; /* whole names only */
      break;
    }
    k += (size_t)n;
  }
  return buf;
}

int gw_replica_draining(const gw_replica *r) { return gw_replica_has(r, GW_HELD_DRAINS); }

const char *gw_replica_display_state(const gw_replica *r) {
  if (gw_replica_has(r, GW_HELD_QUARANTINED)) return "quarantined";
  if (r->state == GW_REPLICA_READY && gw_replica_draining(r)) return "draining";
  return gw_replica_state_name(r->state);
}

const char *gw_replica_reason(const gw_replica *r) {
  if (gw_replica_has(r, GW_HELD_QUARANTINED)) return "quarantined: its answers disagreed with other phones' (an operator releases it)";
  if (r->state != GW_REPLICA_READY || !gw_replica_draining(r)) return r->state_reason;
  if (gw_replica_has(r, GW_HELD_REMOVED))
    return r->ident.from_heartbeat ? "its enrolment was released: finishes what runs, then leaves"
                             : "removed from the configuration: finishes what runs, then leaves";
  if (gw_replica_has(r, GW_HELD_DRAIN_ADMIN))
    return strncmp(r->state_reason, "drained by gateway", 18) == 0 ? r->state_reason : "drained by an admin";
  if (gw_replica_has(r, GW_HELD_DRAIN_CONF)) return "\"drain\": true in its configuration";
  if (gw_replica_has(r, GW_HELD_PLACING)) return "switching models (placement): finishes what runs, then loads another";
  return "its agent reports draining";
}

int gw_replica_set_cost(gw_replica *r, double conf, double claim) {
  double was = r->cost_per_day;
  r->cost_conf = conf;
  r->cost_claim = claim;
  r->cost_per_day = conf >= 0 ? conf : claim >= 0 ? claim : 0;
  return r->cost_per_day != was;
}

const char *gw_replica_state_name(gw_replica_state s) {
  switch (s) {
    case GW_REPLICA_READY: return "ready";
    case GW_REPLICA_DOWN: return "down";
    case GW_REPLICA_LOADING: return "loading";
  }
  return "unknown";
}

int gw_replica_serves(const gw_replica *r, const char *model) {
  for (size_t i = 0; i < r->n_models; i++)
    if (strcmp(r->models[i], model) == 0) return 1;
  return 0;
}

int gw_replica_learn_shape(gw_replica *r, int64_t slots, int64_t n_ctx) {
  int changed = 0;
  if (r->slots_auto && slots >= 1) {
    int s = slots > GW_MAX_SLOTS ? GW_MAX_SLOTS : (int)slots;
    changed |= s != r->slots;
    r->slots = s;
    gw_pcache_shape(&r->pc, s);
  }
  if (r->n_ctx_auto && n_ctx > 0 && n_ctx <= (INT64_C(1) << 30)) {
    changed |= n_ctx != r->n_ctx;
    r->n_ctx = n_ctx;
  }
  return changed;
}

void gw_replica_set_build(gw_replica *r, const char *build) {
  size_t k = 0;
  for (const char *c = build ? build : ""; *c && k + 1 < sizeof(r->build); c++)
    if (*c > 0x20 && *c < 0x7f) r->build[k++] = *c;
  r->build[k] = '\0';
}

int gw_replica_take_features(gw_replica *r, const cJSON *features, const cJSON *build) {
  unsigned f = 0;
  int choices = 1, known = cJSON_IsObject(features);
  if (known) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(features, "choices");
    if (cJSON_IsNumber(c) && c->valuedouble >= 2 && c->valuedouble <= GW_MAX_SLOTS) {
      choices = (int)c->valuedouble;
      f |= PR_FEAT_CHOICES;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(features, "continue_final_message"))) f |= PR_FEAT_CONTINUE;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(features, "responses"))) f |= PR_FEAT_RESPONSES;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(features, "cache_checkpoints"))) f |= PR_FEAT_CHECKPOINTS;
  }
  char old[sizeof(r->build)];
  memcpy(old, r->build, sizeof(old));
  gw_replica_set_build(r, cJSON_IsString(build) ? build->valuestring : "");
  int changed = f != r->features || choices != r->choices_max || known != r->feat_known ||
                strcmp(old, r->build) != 0;
  r->features = f;
  r->choices_max = choices;
  r->feat_known = known;
  r->pc.hybrid = (f & PR_FEAT_CHECKPOINTS) != 0;
  return changed;
}

int gw_replica_serves_features(const gw_replica *r, unsigned needs, int choices) {
  if ((r->features & needs) != needs) return 0;
  return choices <= 1 || ((r->features & PR_FEAT_CHOICES) && choices <= r->choices_max && choices <= r->slots);
}

/* The one predicate: the slots r may use now, and (why) what holds it back. */
int gw_replica_admits(const gw_replica *r, uint64_t now_ms, uint32_t ignore, uint32_t *why) {
  uint32_t stop = r->held & (GW_HELD_DRAINS | GW_HELD_CHECK) & ~ignore;
  if (r->state == GW_REPLICA_DOWN) stop |= GW_HELD_DOWN;
  if (r->state == GW_REPLICA_LOADING) stop |= GW_HELD_LOADING;
  if (stop) {
    if (why) *why = stop;
    return 0;
  }
  int cap = r->slots;
  if (r->shared.share_div > 1) {
    cap = r->slots / r->shared.share_div; /* Redis away: a conservative share, at least one */
    if (cap < 1) cap = 1;
  }
  int own = cap;
  if (gw_replica_has(r, GW_HELD_PROBATION)) cap = 1;
  if (r->sched.trust_capped && cap > r->sched.trust_cap) cap = r->sched.trust_cap; /* no record yet */
  if (r->dev.cap >= 0 && cap > r->dev.cap) cap = r->dev.cap; /* low battery (device.h) */
  int remote = 0;
  if (now_ms < r->shared.remote_busy_until) {
    remote = r->shared.remote_busy > 0;
    cap -= r->shared.remote_busy; /* other gateways' requests, as Redis last said */
    if (cap < 0) cap = 0;
  }
  if (why) {
    uint32_t w = 0;
    if (r->inflight >= cap) {
      if (r->inflight >= own) w |= GW_HELD_BUSY;
      if (gw_replica_has(r, GW_HELD_PROBATION) && r->inflight >= 1) w |= GW_HELD_PROBATION;
      if (r->sched.trust_capped && r->inflight >= r->sched.trust_cap) w |= GW_HELD_SHARE;
      if (r->dev.cap >= 0 && r->inflight >= r->dev.cap) w |= GW_HELD_DEVICE;
      if (remote) w |= GW_HELD_REMOTE;
    }
    *why = w & ~ignore;
  }
  return cap;
}

uint32_t gw_replica_held_why(const gw_replica *r, uint64_t now_ms) {
  uint32_t why = 0;
  gw_replica_admits(r, now_ms, 0, &why);
  return why;
}

int gw_replica_capacity(const gw_replica *r, uint64_t now_ms) { return gw_replica_admits(r, now_ms, 0, NULL); }

int gw_replica_capacity_checked(const gw_replica *r, uint64_t now_ms) {
  return gw_replica_admits(r, now_ms, GW_HELD_CHECK, NULL);
}

static uint64_t lease_end(const gw_lease *l, uint64_t now_ms) {
  if (l->pred_end_ms > now_ms) return l->pred_end_ms;
  return now_ms + (now_ms - l->start_ms) / 4 + 1;
}

uint64_t gw_replica_wait_ms(const gw_replica *r, uint64_t now_ms) {
  int cap = gw_replica_capacity(r, now_ms);
  if (cap <= 0) return UINT64_MAX;
  if (r->inflight < cap) return 0;
  /* the (inflight - cap + 1)-th earliest end frees a usable slot */
  uint64_t ends[GW_MAX_SLOTS];
  int n = 0;
  for (int i = 0; i < GW_MAX_SLOTS && n < r->inflight; i++)
    if (r->leases[i].id) ends[n++] = lease_end(&r->leases[i], now_ms);
  int k = r->inflight - cap;
  for (int i = 0; i <= k && i < n; i++) {
    int m = i;
    for (int j = i + 1; j < n; j++)
      if (ends[j] < ends[m]) m = j;
    uint64_t t = ends[i];
    ends[i] = ends[m];
    ends[m] = t;
  }
  return k < n ? ends[k] - now_ms : 0;
}

double gw_replica_slowdown(const gw_replica *r, uint64_t now_ms) {
  double worst = 1.0;
  for (int i = 0, seen = 0; i < GW_MAX_SLOTS && seen < r->inflight; i++) {
    const gw_lease *l = &r->leases[i];
    if (!l->id) continue;
    seen++;
    double pred = (double)(l->pred_end_ms - l->start_ms);
    if (pred < 100) pred = 100;
    /* late by a quarter of its prediction, and by a quarter second at least */
    double late = pred / 4 > 250 ? pred / 4 : 250;
    if ((double)now_ms < (double)l->pred_end_ms + late) continue;
    double ratio = (double)(now_ms - l->start_ms) / pred;
    if (ratio > worst) worst = ratio;
  }
  return worst > 20 ? 20 : worst;
}

double gw_replica_device_slowdown(const gw_replica *r) {
  if (!r->dev.hot) return 1.0;
  unsigned pre = r->prefill_samples - r->dev.pre0, dec = r->decode_samples - r->dev.dec0;
  return gw_device_slowdown_now(r->dev.slow, pre > dec ? pre : dec, r->dev.hot_answers);
}

static double inter_peak_now(const gw_replica *r, uint64_t now_ms) {
  double age = now_ms > r->sched.inter_peak_ms ? (double)(now_ms - r->sched.inter_peak_ms) / 1000.0 : 0;
  double p = r->sched.inter_peak * exp(-age / GW_INTERACTIVE_PEAK_S);
  return p > r->sched.inter_busy ? p : (double)r->sched.inter_busy;
}

static void inter_note(gw_replica *r, int delta, uint64_t now_ms) {
  r->sched.inter_peak = inter_peak_now(r, now_ms);
  r->sched.inter_busy += delta;
  if (r->sched.inter_busy < 0) r->sched.inter_busy = 0;
  if (r->sched.inter_busy > r->sched.inter_peak) r->sched.inter_peak = r->sched.inter_busy;
  r->sched.inter_peak_ms = now_ms;
}

int gw_replica_interactive_reserve(const gw_replica *r, uint64_t now_ms, double share) {
  /* a peak decayed to a fraction of a slot no longer holds one back */
  int want = (int)ceil(inter_peak_now(r, now_ms) * share - 0.25);
  return want > r->sched.inter_busy ? want - r->sched.inter_busy : 0;
}

uint64_t gw_replica_acquire(gw_replica *r, uint64_t now_ms, uint64_t pred_ms, void *owner) {
  return gw_replica_acquire_class(r, now_ms, pred_ms, owner, 0);
}

uint64_t gw_replica_acquire_class(gw_replica *r, uint64_t now_ms, uint64_t pred_ms, void *owner,
                                  int batch) {
  for (int i = 0; i < GW_MAX_SLOTS; i++) {
    if (r->leases[i].id) continue;
    r->leases[i].id = r->next_lease++;
    r->leases[i].start_ms = now_ms;
    r->leases[i].pred_end_ms = now_ms + pred_ms;
    r->leases[i].owner = owner;
    r->leases[i].batch = batch;
    r->inflight++;
    if (!batch) inter_note(r, 1, now_ms);
    return r->leases[i].id;
  }
  return 0;
}

void gw_replica_release(gw_replica *r, uint64_t lease) {
  if (!lease) return;
  for (int i = 0; i < GW_MAX_SLOTS; i++) {
    if (r->leases[i].id == lease) {
      /* the peak is not moved here: it decays from where it was */
      if (!r->leases[i].batch && r->sched.inter_busy > 0) r->sched.inter_busy--;
      memset(&r->leases[i], 0, sizeof(r->leases[i]));
      r->inflight--;
      return;
    }
  }
}

void gw_replica_cache_reset(gw_replica *r) { gw_pcache_reset(&r->pc); }

static double ewma(double old, double sample, unsigned *n) {
  double a = *n < 3 ? 0.6 : GW_EWMA_ALPHA;
  /* a phone that changed pace (throttled when hot, or freed of another load) is
   * believed quickly */
  if (sample > old * 2 || sample < old / 2) a = 0.6;
  (*n)++;
  return old + a * (sample - old);
}

void gw_replica_observe(gw_replica *r, double prompt_n, double prompt_ms, double predicted_n,
                        double predicted_ms) {
  /* tiny samples say more about latency than speed; a sample that is not a finite
   * positive rate is none, and no sample moves a rate out of [GW_RATE_MIN, GW_RATE_MAX] */
  double pre = prompt_n >= 16 && prompt_ms > 0 ? gw_bound_rate(prompt_n * 1000.0 / prompt_ms) : 0;
  double dec = predicted_n >= 2 && predicted_ms > 0 ? gw_bound_rate(predicted_n * 1000.0 / predicted_ms) : 0;
  if (pre > 0) r->prefill_tps = gw_bound_rate(ewma(r->prefill_tps, pre, &r->prefill_samples));
  if (dec > 0) r->decode_tps = gw_bound_rate(ewma(r->decode_tps, dec, &r->decode_samples));
}

void gw_replica_seed_rates(gw_replica *r, double prefill_tps, double decode_tps) {
  double pre = gw_bound_rate(prefill_tps), dec = gw_bound_rate(decode_tps);
  if (r->prefill_samples == 0 && pre > 0) {
    r->prefill_tps = pre;
    r->rates_claimed |= 1;
    r->rates_default &= ~1;
  }
  if (r->decode_samples == 0 && dec > 0) {
    r->decode_tps = dec;
    r->rates_claimed |= 2;
    r->rates_default &= ~2;
  }
}

int gw_replica_measured(const gw_replica *r) { return r->prefill_samples + r->decode_samples > 0; }

int gw_replica_suspect(const gw_replica *r) {
  return (r->health.probe_fail > 0 || r->health.probe_late_ms) && r->state == GW_REPLICA_READY;
}

int gw_replica_unknown(const gw_replica *r) {
  return !gw_replica_measured(r) && (r->rates_default | r->rates_claimed) != 0;
}

static int shares_model(const gw_replica *a, const gw_replica *b) {
  for (size_t i = 0; i < a->n_models; i++)
    if (gw_replica_serves(b, a->models[i])) return 1;
  return 0;
}

/* (reorders v: the order statistics are selected, not sorted for, proto/order.h) */
static double median(double *v, size_t n) {
  if (n == 0) return 0;
  double hi = pr_select_double(v, n, n / 2);
  return n % 2 ? hi : (pr_select_double(v, n, n / 2 - 1) + hi) / 2;
}

void gw_replicas_prior(gw_replica *const *rs, size_t n, const gw_replica *r, double *prefill_tps,
                       double *decode_tps) {
  *prefill_tps = *decode_tps = 0;
  double *pre = malloc((n ? n : 1) * sizeof(*pre)), *dec = malloc((n ? n : 1) * sizeof(*dec));
  if (!pre || !dec) {
    free(pre);
    free(dec);
    return;
  }
  size_t np = 0, nd = 0;
  for (size_t i = 0; i < n; i++) {
    if (rs[i] != r && !shares_model(r, rs[i])) continue;
    /* a rate measured here, or the operator's figure; never a phone's own claim */
    if (rs[i]->prefill_samples || !((rs[i]->rates_default | rs[i]->rates_claimed) & 1))
      pre[np++] = rs[i]->prefill_tps;
    if (rs[i]->decode_samples || !((rs[i]->rates_default | rs[i]->rates_claimed) & 2))
      dec[nd++] = rs[i]->decode_tps;
  }
  *prefill_tps = median(pre, np);
  *decode_tps = median(dec, nd);
  free(pre);
  free(dec);
}

/* One rate's step: the prior for a rate never measured (default: the fixed default), a
 * drift toward it for one not refreshed. */
static void prior_step(gw_replica *r, int bit, double *tps, unsigned samples, double prior,
                       double dflt, int due, double dt_s, double drift_s) {
  int k = bit == 1 ? 0 : 1;
  if (samples == 0) {
    if (r->rates_default & bit) *tps = prior > 0 ? prior : dflt;
  } else if (!due) {
    return;
  } else if (samples == r->drift_seen[k] && drift_s > 0 && prior > 0 && dt_s > 0) {
    /* not refreshed since the last step (a refresh starts the drift again from there) */
    double w = exp(-dt_s / drift_s);
    *tps = gw_bound_rate(exp(log(prior) + (log(*tps) - log(prior)) * w));
  }
  r->drift_seen[k] = samples;
}

static int same_models(const gw_replica *a, const gw_replica *b) {
  if (!a || a->n_models != b->n_models) return 0;
  for (size_t i = 0; i < a->n_models; i++)
    if (strcmp(a->models[i], b->models[i]) != 0) return 0;
  return 1;
}

/* A rate not refreshed steps toward the prior once a second. */
static int prior_due(const gw_replica *r, uint64_t now_ms) {
  return r->drift_ms == 0 || now_ms >= r->drift_ms + 1000;
}

static int prior_wanted(const gw_replica *r, uint64_t now_ms) {
  int unmeasured = (r->prefill_samples == 0 && (r->rates_default & 1)) ||
                   (r->decode_samples == 0 && (r->rates_default & 2));
  return unmeasured || prior_due(r, now_ms);
}

typedef struct prior_list {
  const gw_replica *r; /* the first phone of the list */
  double pre, dec;
} prior_list;

/* r's list among the n worked out (n: not there). */
static size_t prior_list_of(const prior_list *lists, size_t n, const gw_replica *r) {
  size_t k = 0;
  while (k < n && !same_models(lists[k].r, r)) k++;
  return k;
}

void gw_replicas_priors(gw_replica *const *rs, size_t n, uint64_t now_ms, double drift_s) {
  /* a prior is worked out once per list of models, from the rates as the call found them:
   * first every list wanted, then each phone's step. A fleet whose phones serve different
   * lists (placement's) worked a median over the whole fleet out again for every phone
   * whose list differed from the last one's -- O(phones^2) once a second, seconds at
   * 6,000 phones. Out of memory: the lists not held are worked out as their phones come,
   * the last one's reused */
  prior_list *lists = NULL, last = {NULL, 0, 0};
  size_t n_lists = 0, cap = 0;
  for (size_t i = 0; i < n; i++) {
    if (!prior_wanted(rs[i], now_ms) || prior_list_of(lists, n_lists, rs[i]) < n_lists) continue;
    if (n_lists == cap) {
      prior_list *l = realloc(lists, (cap ? 2 * cap : 8) * sizeof(*l));
      if (!l) break;
      lists = l;
      cap = cap ? 2 * cap : 8;
    }
    lists[n_lists].r = rs[i];
    gw_replicas_prior(rs, n, rs[i], &lists[n_lists].pre, &lists[n_lists].dec);
    n_lists++;
  }
  for (size_t i = 0; i < n; i++) {
    gw_replica *r = rs[i];
    if (!prior_wanted(r, now_ms)) continue;
    int due = prior_due(r, now_ms);
    size_t k = prior_list_of(lists, n_lists, r);
    if (k == n_lists && !same_models(last.r, r)) {
      last.r = r;
      gw_replicas_prior(rs, n, r, &last.pre, &last.dec);
    }
    const prior_list *l = k < n_lists ? &lists[k] : &last;
    double dt = r->drift_ms && due ? (double)(now_ms - r->drift_ms) / 1000.0 : 0;
    prior_step(r, 1, &r->prefill_tps, r->prefill_samples, l->pre, GW_DEFAULT_PREFILL_TPS, due, dt, drift_s);
    prior_step(r, 2, &r->decode_tps, r->decode_samples, l->dec, GW_DEFAULT_DECODE_TPS, due, dt, drift_s);
    if (due) r->drift_ms = now_ms;
  }
  free(lists);
}

void gw_replicas_trust(gw_replica *const *rs, size_t n, int trust_after, uint64_t now_ms) {
  /* the capacities each phone would have without this cap */
  for (size_t i = 0; i < n; i++) rs[i]->sched.trust_cap = rs[i]->sched.trust_capped = 0;
  if (trust_after <= 0) return;
  int record = 0;
  for (size_t i = 0; i < n && !record; i++) record = rs[i]->n_ok >= (uint64_t)trust_after;
  /* a fresh fleet: the phones the operator listed are its founders. Without this, the
   * first phone to earn a record would cap every other one at once (B2's 24 phones fell
   * to a few requests at a time for their first answers) */
  if (!record)
    for (size_t i = 0; i < n; i++)
      if (!rs[i]->ident.from_heartbeat) rs[i]->sched.founder = 1;
  int trusted = 0;
  for (size_t i = 0; i < n; i++)
    /* a hold for an undecided check (verify.c) is a moment's: it changes no share */
    if (rs[i]->n_ok >= (uint64_t)trust_after || rs[i]->sched.founder)
      trusted += gw_replica_capacity_checked(rs[i], now_ms);
  if (trusted <= 0 || !record) return; /* no trusted phone (a fresh fleet): no cap */
  int64_t earned = 0, used = 0;
  int room = 0;
  for (size_t i = 0; i < n; i++) {
    gw_replica *r = rs[i];
    if (r->n_ok >= (uint64_t)trust_after || r->sched.founder) continue;
    int own = gw_replica_capacity_checked(r, now_ms);
    int cap = gw_trust_cap(r->n_ok, trust_after, trusted);
    if (cap <= 0 || cap > own) cap = own;
    earned += r->n_ok < (uint64_t)own ? (int64_t)r->n_ok : own;
    used += r->inflight;
    /* trust_cap holds the phone's own cap until the group's room is shared out */
    r->sched.trust_cap = cap;
    r->sched.trust_capped = 1;
    room += cap > r->inflight ? cap - r->inflight : 0;
  }
  int64_t left = gw_trust_group_cap(trusted, earned) - used;
  if (left > room) left = room;
  if (left < 0) left = 0;
  /* one more request at a time to each phone with room, until the group's room is spent */
  int *give = calloc(n, sizeof(*give));
  if (!give) {
    for (size_t i = 0; i < n; i++)
      if (rs[i]->sched.trust_capped) rs[i]->sched.trust_cap = rs[i]->inflight; /* no room: the safe side */
    return;
  }
  while (left > 0) {
    int64_t before = left;
    for (size_t i = 0; i < n && left > 0; i++) {
      gw_replica *r = rs[i];
      if (!r->sched.trust_capped || r->inflight + give[i] >= r->sched.trust_cap) continue;
      give[i]++;
      left--;
    }
    if (left == before) break;
  }
  for (size_t i = 0; i < n; i++)
    if (rs[i]->sched.trust_capped) rs[i]->sched.trust_cap = rs[i]->inflight + give[i];
  free(give);
}

void gw_replicas_bound_seeds(gw_replica *const *rs, size_t n) {
  double pre = 0, dec = 0;
  for (size_t i = 0; i < n; i++) {
    if (rs[i]->prefill_samples && rs[i]->prefill_tps > pre) pre = rs[i]->prefill_tps;
    if (rs[i]->decode_samples && rs[i]->decode_tps > dec) dec = rs[i]->decode_tps;
  }
  for (size_t i = 0; i < n; i++) {
    gw_replica *r = rs[i];
    if (!r->prefill_samples && (r->rates_claimed & 1)) r->prefill_tps = gw_bound_seed(r->prefill_tps, pre);
    if (!r->decode_samples && (r->rates_claimed & 2)) r->decode_tps = gw_bound_seed(r->decode_tps, dec);
  }
}

void gw_replica_set_state(gw_replica *r, gw_replica_state s, uint64_t now_ms, const char *reason) {
  r->state_remote = 0; /* a verdict of its own, unless the caller says otherwise */
  if (s == GW_REPLICA_DOWN) r->health.probe_ok = 0; /* coming back takes `rise` fresh successes */
  r->state = s;
  r->state_since_ms = now_ms;
  snprintf(r->state_reason, sizeof(r->state_reason), "%s", reason ? reason : "");
}

void gw_replica_engine_loading(gw_replica *r, uint64_t now_ms, const char *reason, int fresh) {
  if (r->state != GW_REPLICA_LOADING) gw_replica_set_state(r, GW_REPLICA_LOADING, now_ms, reason);
  if (fresh) gw_replica_cache_reset(r);
}

void gw_replica_take_down(gw_replica *r, uint64_t now_ms, uint64_t until_ms, const char *reason,
                          int remote) {
  r->down_until_ms = until_ms;
  gw_replica_set_state(r, GW_REPLICA_DOWN, now_ms, reason);
  r->state_remote = remote != 0;
}

void gw_replica_probation(gw_replica *r, uint64_t now_ms, const char *reason) {
  gw_replica_held_set(r, GW_HELD_PROBATION, 1);
  r->consecutive_failures = 0;
  gw_replica_set_state(r, GW_REPLICA_READY, now_ms, reason);
}

void gw_replica_set_reason(gw_replica *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->state_reason, sizeof(r->state_reason), fmt, ap);
  va_end(ap);
}

void gw_replica_engine_unsure(gw_replica *r, int failed, int loading) {
  if (failed || loading) r->props_due = 1;
  if (loading && !r->ident.agent) r->feat_known = 0;
}

void gw_replica_props_due(gw_replica *r, int due) { r->props_due = due != 0; }

void gw_replica_set_features(gw_replica *r, unsigned features, int choices_max) {
  r->features = features;
  r->choices_max = choices_max > 1 ? choices_max : 1;
  r->feat_known = 1;
}

void gw_replica_configure_shape(gw_replica *r, int slots, int64_t n_ctx) {
  /* a configured value wins; an unconfigured one keeps what the replica said */
  if (slots) r->slots = slots;
  if (n_ctx) r->n_ctx = n_ctx;
  if (!r->slots_auto && !slots) r->props_due = 1;
  if (!r->n_ctx_auto && !n_ctx) r->props_due = 1;
  r->slots_auto = !slots;
  r->n_ctx_auto = !n_ctx;
}

void gw_replica_set_shape(gw_replica *r, int slots, int64_t n_ctx) {
  r->slots = slots;
  r->n_ctx = n_ctx;
}

void gw_replica_rates_restart(gw_replica *r, double prefill_tps, double decode_tps) {
  r->prefill_samples = r->decode_samples = 0;
  r->rates_claimed = 0;
  r->prefill_tps = prefill_tps;
  r->decode_tps = decode_tps;
}

int gw_replica_success(gw_replica *r, uint64_t now_ms) {
  r->n_ok++;
  return gw_replica_answered(r, now_ms);
}

int gw_replica_answered(gw_replica *r, uint64_t now_ms) {
  (void)now_ms;
  r->consecutive_failures = 0;
  r->down_count = 0;
  return gw_replica_held_set(r, GW_HELD_PROBATION, 0);
}

int gw_replica_failure(gw_replica *r, uint64_t now_ms, int threshold, double cooldown_s,
                       double cooldown_max_s, const char *reason) {
  r->n_failed++;
  r->consecutive_failures++;
  /* on probation one failure is enough: it was given one chance */
  if (r->state != GW_REPLICA_READY) return 0;
  if (r->consecutive_failures < threshold && !gw_replica_has(r, GW_HELD_PROBATION)) return 0;
  double cd = cooldown_s;
  for (unsigned i = 0; i < r->down_count && cd < cooldown_max_s; i++) cd *= 2;
  if (cd > cooldown_max_s) cd = cooldown_max_s;
  r->down_count++;
  r->down_until_ms = now_ms + (uint64_t)(cd * 1000.0);
  gw_replica_held_set(r, GW_HELD_PROBATION, 0);
  gw_replica_set_state(r, GW_REPLICA_DOWN, now_ms, reason);
  return 1;
}

int gw_replica_tick(gw_replica *r, uint64_t now_ms) {
  if (r->state == GW_REPLICA_DOWN && now_ms >= r->down_until_ms) {
    gw_replica_probation(r, now_ms, "cool-down over, on probation");
    return 1;
  }
  return 0;
}
