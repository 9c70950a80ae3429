/* Placement on the gateway; see placement.h and docs/placement.md. */
#include "placement.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "events.h"
#include "json.h"
#include "log.h"
#include "model.h"
#include "place.h"
#include "privfile.h"
#include "registry.h"

/* Arrivals' moving average has a time constant of a quarter of the horizon; demand below
 * half a request over the horizon is none. */
#define PLACE_DEMAND_MIN 0.5

double gw_placement_demand(const gw_server *gw, const gw_model *m, double horizon_s) {
  (void)gw;
  if (!m) return 0;
  double d = (double)m->queued + m->arr_rate * horizon_s;
  return d < PLACE_DEMAND_MIN ? 0 : d;
}

static int excluded(const gw_server *gw, const gw_model_conf *mc) {
  const gw_model *m = gw_models_find(&gw->models, mc->name);
  if (m && m->place_exclude >= 0) return m->place_exclude;
  return mc->exclude;
}

/* The pin of phone id: the admin API's, else the config's; NULL: none. */
static const char *pin_of(const gw_server *gw, const gw_replica *r) {
  if (r->place.pin[0]) return r->place.pin;
  const gw_config *c = gw->conf;
  for (size_t i = 0; i < c->n_place_pins; i++)
    if (strcmp(c->place_pin_ids[i], r->id) == 0) return c->place_pin_models[i];
  return NULL;
}

static int catalogue_index(const gw_config *c, const char *name) {
  for (size_t i = 0; i < c->n_models; i++)
    if (strcmp(c->model_confs[i].name, name) == 0) return (int)i;
  return -1;
}

/* The catalogue model r serves now (its first that is one), -1: none. */
static int serving(const gw_config *c, const gw_replica *r) {
  for (size_t k = 0; k < r->n_models; k++) {
    int i = catalogue_index(c, r->models[k]);
    if (i >= 0) return i;
  }
  return -1;
}

/* Whole MiB, rounded up, as the agent compares them (it gets ceil of this as mem_mb). */
static double mem_needed_mb(const gw_model_conf *mc) {
  if (mc->mem_mb > 0) return ceil(mc->mem_mb);
  if (mc->size_bytes > 0) return ceil((double)mc->size_bytes / 1048576.0 * 1.2 + 512);
  return 0;
}

/* Whether every pair of the model's labels is among the replica's. */
static int labels_match(const char *want, const char *have) {
  if (!want) return 1;
  cJSON *w = cJSON_Parse(want), *h = have ? cJSON_Parse(have) : NULL;
  int ok = w != NULL;
  for (const cJSON *it = w ? w->child : NULL; ok && it; it = it->next) {
    const cJSON *v = h ? cJSON_GetObjectItemCaseSensitive(h, it->string) : NULL;
    ok = cJSON_IsString(v) && cJSON_IsString(it) && strcmp(v->valuestring, it->valuestring) == 0;
  }
  cJSON_Delete(w);
  cJSON_Delete(h);
  return ok;
}

static int holds(const gw_replica *r, const gw_model_conf *mc) {
  for (size_t i = 0; i < r->report.hold.n_models; i++)
    if (strcmp(r->report.hold.models[i].name, mc->name) == 0 &&
        (!mc->sha256 || strcmp(r->report.hold.models[i].sha256, mc->sha256) == 0))
      return 1;
  return 0;
}

/* Storage an agent keeps free beside a download (the agent's AG_HOLD_DISK_MARGIN_MB). */
#define PLACE_DISK_MARGIN_MB 256.0

/* Why a phone of these figures may not run mc ("" : it may): MemTotal total (< 0
 * unknown), free storage free_mb in its models folder (< 0 unknown; room is not asked
 * when has_file), its labels (JSON, NULL: none). */
static void unfit_by(const gw_model_conf *mc, double total, double free_mb, int has_file, const char *labels,
                     char *why, size_t n) {
  why[0] = 0;
  double need = mem_needed_mb(mc);
  double file_mb = ceil((double)mc->size_bytes / 1048576.0);
  if (mc->min_ram_mb > 0 && !(total >= mc->min_ram_mb))
    snprintf(why, n, "its memory (%.0f MiB) is below the model's min_ram_mb %.0f", total, mc->min_ram_mb);
  else if (need > 0 && total > 0 && total - fmax(2048, total / 4) < need)
    snprintf(why, n, "it can give %.0f MiB of memory and the model needs %.0f",
             total - fmax(2048, total / 4), need);
  else if (mc->size_bytes > 0 && !has_file && free_mb >= 0 && free_mb < file_mb + PLACE_DISK_MARGIN_MB)
    snprintf(why, n, "its models folder has %.0f MiB free and the model's file needs %.0f MiB "
             "(with %.0f to spare)", free_mb, file_mb, PLACE_DISK_MARGIN_MB);
  else if (!labels_match(mc->labels, labels))
    snprintf(why, n, "its labels lack the model's");
}

/* Why r may not run mc ("" : it may). Its memory, storage and labels are what its
 * heartbeats say (room for the file is not asked of a phone that holds it or serves the
 * model, nor while it switches to it: its download takes the room); the agent checks
 * memory and storage again before it downloads (agent/hold.h, ag_hold_switch_fits) and
 * refuses a switch it cannot hold. */
static void unfit_for(const gw_server *gw, const gw_replica *r, const gw_model_conf *mc,
                      uint64_t now, char *why, size_t n) {
  int has_file = holds(r, mc) || gw_replica_serves(r, mc->name) ||
                 (r->place.switch_ms && strcmp(r->place.want, mc->name) == 0);
  unfit_by(mc, r->report.hold.mem_total_mb, r->report.hold.storage_free_mb, has_file, r->labels, why, n);
  if (!why[0] && r->place.failed_model[0] && strcmp(r->place.failed_model, mc->name) == 0 &&
      now < r->place.failed_ms + (uint64_t)(gw->conf->place_backoff_s * 1000))
    snprintf(why, n, "its switch to it failed lately");
}

static void seen_set(gw_replica *r, const char *model, double pre, double dec) {
  size_t i = 0;
  while (i < r->place.n_seen && strcmp(r->place.seen[i].model, model) != 0) i++;
  if (i == r->place.n_seen) {
    if (i == GW_PLACE_SEEN) i = GW_PLACE_SEEN - 1; /* the last one goes */
    else r->place.n_seen++;
    snprintf(r->place.seen[i].model, sizeof(r->place.seen[i].model), "%s", model);
    r->place.seen[i].prefill_tps = r->place.seen[i].decode_tps = 0;
  }
  if (pre > 0) r->place.seen[i].prefill_tps = pre;
  if (dec > 0) r->place.seen[i].decode_tps = dec;
}

static const double *seen_get(const gw_replica *r, const char *model) {
  for (size_t i = 0; i < r->place.n_seen; i++)
    if (strcmp(r->place.seen[i].model, model) == 0) return &r->place.seen[i].prefill_tps;
  return NULL;
}

static void place_event(gw_server *gw, const char *type, const gw_replica *r, const char *from,
                        const char *to, const char *why, const char *msg) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", type);
  cJSON_AddStringToObject(f, "replica", r->id);
  cJSON_AddStringToObject(f, "from", from);
  cJSON_AddStringToObject(f, "to", to);
  cJSON_AddStringToObject(f, "reason", why);
  pr_log_kv(PR_LOG_INFO, msg, f);
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "replica", r->id);
  cJSON_AddStringToObject(e, "from", from);
  cJSON_AddStringToObject(e, "to", to);
  cJSON_AddStringToObject(e, "reason", why);
  gw_events_add(gw, type, msg, e);
}

static void switch_start(gw_server *gw, gw_replica *r, const char *from, const char *to,
                         const char *reason, uint64_t now) {
  const char *old = gw_replica_display_state(r);
  snprintf(r->place.want, sizeof(r->place.want), "%s", to);
  snprintf(r->place.from, sizeof(r->place.from), "%s", from);
  snprintf(r->place.reason, sizeof(r->place.reason), "%s", reason);
  r->place.switch_ms = now;
  r->place.phase[0] = 0;
  gw_replica_held_set(r, GW_HELD_PLACING, 1);
  gw_model *m = gw_models_get(&gw->models, to, now);
  if (m) m->switches[0]++;
  char msg[512];
  snprintf(msg, sizeof(msg), "%s switches from %s to %s: %s", r->id, from, to, reason);
  place_event(gw, "placement_switch", r, from, to, reason, msg);
  gw_models_replica_changed(&gw->models, r);
  gw_registry_event(gw, r, old);
}

static void switch_end(gw_server *gw, gw_replica *r, int ok, const char *why, uint64_t now) {
  const char *old = gw_replica_display_state(r);
  char from[GW_HOLD_NAME_MAX + 1], to[GW_HOLD_NAME_MAX + 1];
  snprintf(from, sizeof(from), "%s", r->place.from);
  snprintf(to, sizeof(to), "%s", r->place.want);
  gw_model *m = gw_models_get(&gw->models, to, now);
  char msg[600];
  if (ok) {
    if (m) m->switches[1]++;
    /* its learned rates were the old model's: keep them as such, start the new one's from
     * what it did on it before, else its own claim (the next heartbeat) */
    if (gw_replica_measured(r)) seen_set(r, from, r->prefill_samples ? r->prefill_tps : 0,
                                         r->decode_samples ? r->decode_tps : 0);
    const double *s = seen_get(r, to);
    /* until measured (or claimed by its next heartbeat): what it did on the model before,
     * else its old rates scaled by the files' sizes */
    const gw_model_conf *fc = gw_config_model(gw->conf, from), *tc = gw_config_model(gw->conf, to);
    double ratio = fc && tc && fc->size_bytes > 0 && tc->size_bytes > 0
                       ? (double)fc->size_bytes / (double)tc->size_bytes : 1;
    gw_replica_rates_restart(r, s && s[0] > 0 ? s[0] : r->prefill_tps * ratio,
                             s && s[1] > 0 ? s[1] : r->decode_tps * ratio);
    gw_pcache_reset(&r->pc); /* a new engine holds no prompt */
    r->place.since_ms = now;
    snprintf(msg, sizeof(msg), "%s now serves %s (was %s) after %.1f s", r->id, to, from,
             (double)(now - r->place.switch_ms) / 1000.0);
    place_event(gw, "placement_switched", r, from, to, r->place.reason, msg);
  } else {
    if (m) m->switches[2]++;
    snprintf(r->place.failed, sizeof(r->place.failed), "switch to %s failed: %s", to, why);
    snprintf(r->place.failed_model, sizeof(r->place.failed_model), "%s", to);
    r->place.failed_ms = now;
    snprintf(r->place.want, sizeof(r->place.want), "%s", from);
    snprintf(msg, sizeof(msg), "%s stays on %s: its switch to %s failed: %s", r->id, from, to, why);
    place_event(gw, "placement_switch_failed", r, from, to, why, msg);
  }
  r->place.switch_ms = 0;
  r->place.phase[0] = 0;
  gw_replica_held_set(r, GW_HELD_PLACING, 0);
  gw_models_replica_changed(&gw->models, r);
  gw_registry_event(gw, r, old);
  gw_plan_soon(gw);
}

void gw_placement_heartbeat(gw_server *gw, gw_replica *r, const char *state, int can_switch,
                            const gw_place_report *rep, uint64_t now) {
  r->place.can_switch = can_switch;
  if (!r->place.since_ms) r->place.since_ms = now;
  if (!r->place.switch_ms) return;
  if (rep && rep->to[0] && strcmp(rep->to, r->place.want) == 0) {
    snprintf(r->place.phase, sizeof(r->place.phase), "%s", rep->phase);
    if (strcmp(rep->phase, "failed") == 0) {
      switch_end(gw, r, 0, rep->why[0] ? rep->why : "its agent says it failed", now);
      return;
    }
  }
  if (gw_replica_serves(r, r->place.want) && (!state || strcmp(state, "ready") == 0) &&
      r->state == GW_REPLICA_READY && !(rep && rep->to[0]))
    switch_end(gw, r, 1, NULL, now);
}

/* What a phone needs to run mc: {model, url, sha256, size_bytes, mem_mb, n_ctx,
 * engine_args} (docs/protocol.md), as key of o. */
static cJSON *model_object(cJSON *o, const char *key, const gw_model_conf *mc) {
  cJSON *p = cJSON_AddObjectToObject(o, key);
  if (!p) return NULL;
  cJSON_AddStringToObject(p, "model", mc->name);
  if (mc->url) cJSON_AddStringToObject(p, "url", mc->url);
  if (mc->sha256) cJSON_AddStringToObject(p, "sha256", mc->sha256);
  if (mc->size_bytes) cJSON_AddNumberToObject(p, "size_bytes", (double)mc->size_bytes);
  double mem = mem_needed_mb(mc);
  if (mem > 0) cJSON_AddNumberToObject(p, "mem_mb", mem);
  if (mc->n_ctx) cJSON_AddNumberToObject(p, "n_ctx", (double)mc->n_ctx);
  cJSON *a = cJSON_AddArrayToObject(p, "engine_args");
  for (size_t i = 0; a && i < mc->n_engine_args; i++)
    cJSON_AddItemToArray(a, cJSON_CreateString(mc->engine_args[i]));
  return p;
}

void gw_placement_answer(gw_server *gw, const gw_replica *r, cJSON *reply) {
  if (!r->place.switch_ms || !r->place.want[0]) return;
  const gw_model_conf *mc = gw_config_model(gw->conf, r->place.want);
  cJSON *p = mc ? model_object(reply, "place", mc) : NULL;
  if (p) cJSON_AddStringToObject(p, "reason", r->place.reason);
}

/* Whether an agent can start on mc from an `instead` answer: it takes a model whose
 * name can name its file (1-64 of A-Z a-z 0-9 . _ -, no leading dot), whose url is
 * http(s) with no space, quote, backslash, backquote or $ (run.sh reads it as a value),
 * whose sha256 is 64 hex digits and whose size it knows (agent/main.c instead_lines;
 * the catalogue allows more, for phones that switch). Offering another, the phone could
 * not take it and ended its run unlisted. */
static int startable(const gw_model_conf *mc) {
  size_t n = strlen(mc->name);
  if (n == 0 || n > 64 || mc->name[0] == '.' || strspn(mc->name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                   "0123456789._-") != n)
    return 0;
  if (!mc->url || (strncmp(mc->url, "https://", 8) != 0 && strncmp(mc->url, "http://", 7) != 0) ||
      strlen(mc->url) > 1000)
    return 0;
  for (const char *u = mc->url; *u; u++)
    if (*u <= ' ' || *u > '~' || strchr("'\"\\`$", *u)) return 0;
  if (!mc->sha256 || strlen(mc->sha256) != 64 || strspn(mc->sha256, "0123456789abcdefABCDEF") != 64) return 0;
  return mc->size_bytes > 0;
}

int gw_placement_instead(gw_server *gw, const char *model, double mem_total_mb, double storage_free_mb,
                         const char *labels, char *pick, size_t pn) {
  const gw_config *c = gw->conf;
  pick[0] = 0;
  if (!c->place_enabled || c->n_models == 0) return -1;
  const gw_model_conf *best = NULL;
  double best_demand = -1;
  for (size_t i = 0; i < c->n_models; i++) {
    const gw_model_conf *mc = &c->model_confs[i];
    char why[200];
    if (strcmp(mc->name, model) == 0 || excluded(gw, mc) || !startable(mc)) continue;
    unfit_by(mc, mem_total_mb, storage_free_mb, 0, labels, why, sizeof(why));
    if (why[0]) continue;
    /* the one with the most demand now; among equals the largest (the most it can do) */
    double d = gw_placement_demand(gw, gw_models_find(&gw->models, mc->name), c->place_horizon_s);
    if (!best || d > best_demand || (d == best_demand && mc->size_bytes > best->size_bytes)) {
      best = mc;
      best_demand = d;
    }
  }
  if (!best) return 0;
  snprintf(pick, pn, "%s", best->name);
  return 1;
}

void gw_placement_instead_answer(gw_server *gw, const char *model, cJSON *reply) {
  const gw_model_conf *mc = gw_config_model(gw->conf, model);
  if (mc) model_object(reply, "instead", mc);
}

/* Demand's inputs, once a pass: each model's arrivals and the sizes of its requests, each
 * phone's rates on the model it serves. */
static void measure(gw_server *gw, uint64_t now) {
  const gw_config *c = gw->conf;
  double tau = c->place_horizon_s / 4 > 1 ? c->place_horizon_s / 4 : 1;
  for (size_t i = 0; i < c->n_models; i++) {
    gw_model *m = gw_models_get(&gw->models, c->model_confs[i].name, now);
    if (!m) continue;
    if (m->arrivals > m->arr_seen) m->asked_ms = now;
    if (m->queued) m->asked_ms = now;
    if (m->arr_ms && now > m->arr_ms) {
      double dt = (double)(now - m->arr_ms) / 1000.0;
      double inst = (double)(m->arrivals - m->arr_seen) / dt;
      m->arr_rate += (1 - exp(-dt / tau)) * (inst - m->arr_rate);
    }
    m->arr_seen = m->arrivals;
    m->arr_ms = now;
  }
  for (size_t k = 0; k < gw->n_replicas; k++) {
    gw_replica *r = gw->replicas[k];
    int cur = serving(c, r);
    if (cur >= 0 && !gw_replica_has(r, GW_HELD_PLACING)) {
      const char *name = c->model_confs[cur].name;
      /* measured here, else what the phone claims of itself */
      seen_set(r, name, r->prefill_samples || (r->rates_claimed & 1) ? r->prefill_tps : 0,
               r->decode_samples || (r->rates_claimed & 2) ? r->decode_tps : 0);
      gw_model *m = gw_models_find(&gw->models, name);
      uint64_t n = r->n_ok > r->place.answers ? r->n_ok - r->place.answers : 0;
      if (m && n > 0 && r->place.read && r->served.tokens_in >= r->place.tokens_in &&
          r->served.tokens_out >= r->place.tokens_out) {
        double pin = (double)(r->served.tokens_in - r->place.tokens_in) / (double)n;
        double pout = (double)(r->served.tokens_out - r->place.tokens_out) / (double)n;
        m->avg_prompt = m->avg_prompt > 0 ? 0.8 * m->avg_prompt + 0.2 * pin : pin;
        m->avg_out = m->avg_out > 0 ? 0.8 * m->avg_out + 0.2 * pout : pout;
      }
    }
    r->place.answers = r->n_ok;
    r->place.read = 1;
    r->place.tokens_in = r->served.tokens_in;
    r->place.tokens_out = r->served.tokens_out;
  }
}

void gw_placement_tick(gw_server *gw, uint64_t now) {
  const gw_config *c = gw->conf;
  if (!c->place_enabled || c->n_models == 0) return;
  if (gw->place_pass_ms && now < gw->place_pass_ms + (uint64_t)(c->place_interval_s * 1000)) return;
  gw->place_pass_ms = now;
  measure(gw, now);
  /* switches that never ended */
  for (size_t k = 0; k < gw->n_replicas; k++) {
    gw_replica *r = gw->replicas[k];
    if (r->place.switch_ms && now > r->place.switch_ms + GW_PLACE_SWITCH_TIMEOUT_MS)
      switch_end(gw, r, 0, "it did not end within 30 minutes", now);
    else if (r->place.switch_ms && !gw_config_model(c, r->place.want))
      switch_end(gw, r, 0, "the model left the configuration's models (a reload)", now);
  }
  size_t nm = c->n_models, np = 0;
  gw_place_model *ms = calloc(nm, sizeof(*ms));
  gw_place_phone *ps = calloc(gw->n_replicas + 1, sizeof(*ps));
  gw_replica **rs = calloc(gw->n_replicas + 1, sizeof(*rs));
  double *rates = calloc((gw->n_replicas + 1) * nm * 2, sizeof(double));
  unsigned char *flags = calloc((gw->n_replicas + 1) * nm * 2, 1);
  gw_place_move *mv = calloc(gw->n_replicas + 1, sizeof(*mv));
  if (!ms || !ps || !rs || !rates || !flags || !mv) goto done;
  for (size_t i = 0; i < nm; i++) {
    const gw_model_conf *mc = &c->model_confs[i];
    gw_model *m = gw_models_find(&gw->models, mc->name);
    ms[i].name = mc->name;
    ms[i].demand = gw_placement_demand(gw, m, c->place_horizon_s);
    ms[i].prompt_tokens = m ? m->avg_prompt : 0;
    ms[i].out_tokens = m ? m->avg_out : 0;
    ms[i].size_mb = (double)mc->size_bytes / 1048576.0;
    ms[i].exclude = excluded(gw, mc);
    ms[i].keep = m && m->asked_ms && now < m->asked_ms + (uint64_t)(c->place_idle_s * 1000);
  }
  for (size_t k = 0; k < gw->n_replicas; k++) {
    gw_replica *r = gw->replicas[k];
    int cur = serving(c, r);
    int switching = gw_replica_has(r, GW_HELD_PLACING) && r->place.switch_ms;
    if (cur < 0 && !switching) continue;
    if (!switching && (r->state != GW_REPLICA_READY || gw_replica_has(r, GW_HELD_REMOVED | GW_HELD_DRAIN_ADMIN | GW_HELD_DRAIN_CONF)))
      continue;
    gw_place_phone *ph = &ps[np];
    double *pre = &rates[np * nm * 2], *dec = pre + nm;
    unsigned char *al = &flags[np * nm * 2], *ho = al + nm;
    for (size_t i = 0; i < nm; i++) {
      const double *s = seen_get(r, c->model_confs[i].name);
      pre[i] = s ? s[0] : 0;
      dec[i] = s ? s[1] : 0;
      char why[200];
      unfit_for(gw, r, &c->model_confs[i], now, why, sizeof(why));
      al[i] = why[0] == 0;
      ho[i] = (unsigned char)holds(r, &c->model_confs[i]);
    }
    const char *pin = pin_of(gw, r);
    ph->id = r->id;
    ph->cur = switching ? catalogue_index(c, r->place.from) : cur;
    ph->want = switching ? catalogue_index(c, r->place.want) : cur;
    ph->switching = switching;
    ph->pinned = pin ? catalogue_index(c, pin) : -1;
    if (ph->pinned >= 0 && !al[ph->pinned]) ph->pinned = -1;
    ph->movable = r->ident.from_heartbeat && !r->ident.from_file && !gw_replica_has(r, GW_HELD_DRAIN_AGENT) &&
                  r->place.can_switch;
    ph->since_ms = r->place.since_ms;
    ph->slots = r->slots;
    ph->prefill = pre;
    ph->decode = dec;
    ph->allowed = al;
    ph->holds = ho;
    if (ph->want < 0) continue;
    rs[np++] = r;
  }
  gw_place_params pp = {
      .horizon_s = c->place_horizon_s,
      .min_stay_s = c->place_min_stay_s,
      .hysteresis = c->place_hysteresis,
      .max_switching = (size_t)floor(c->place_max_switching * (double)np),
      .load_mb_s = c->place_load_mb_s,
      .fetch_mb_s = c->place_fetch_mb_s,
  };
  if (pp.max_switching < 1) pp.max_switching = 1;
  size_t n = gw_place_decide(&pp, ms, nm, ps, np, now, mv, np);
  for (size_t i = 0; i < nm; i++) {
    gw_model *m = gw_models_get(&gw->models, ms[i].name, now);
    if (!m) continue;
    m->place_demand = ms[i].demand;
    m->place_capacity = ms[i].capacity;
    m->place_load = ms[i].load;
  }
  for (size_t i = 0; i < n; i++) {
    gw_replica *r = rs[mv[i].phone];
    const char *from = mv[i].from >= 0 ? ms[mv[i].from].name : (r->n_models ? r->models[0] : "");
    switch_start(gw, r, from, ms[mv[i].to].name, mv[i].reason, now);
  }
done:
  free(ms);
  free(ps);
  free(rs);
  free(rates);
  free(flags);
  free(mv);
}

cJSON *gw_placement_json(gw_server *gw) {
  const gw_config *c = gw->conf;
  uint64_t now = uv_now(gw->loop);
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddBoolToObject(o, "enabled", c->place_enabled);
  cJSON *ma = cJSON_AddArrayToObject(o, "models");
  for (size_t i = 0; ma && i < c->n_models; i++) {
    const gw_model_conf *mc = &c->model_confs[i];
    const gw_model *m = gw_models_find(&gw->models, mc->name);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "model", mc->name);
    size_t serving_n = 0, switching_to = 0;
    for (size_t k = 0; k < gw->n_replicas; k++) {
      const gw_replica *r = gw->replicas[k];
      if (r->place.switch_ms && strcmp(r->place.want, mc->name) == 0) switching_to++;
      else if (gw_replica_serves(r, mc->name) && r->state == GW_REPLICA_READY && !gw_replica_draining(r))
        serving_n++;
    }
    cJSON_AddNumberToObject(e, "phones", (double)serving_n);
    cJSON_AddNumberToObject(e, "switching_to", (double)switching_to);
    cJSON_AddNumberToObject(e, "queued", m ? (double)m->queued : 0);
    cJSON_AddNumberToObject(e, "arrivals_per_s", m ? m->arr_rate : 0);
    cJSON_AddNumberToObject(e, "demand", m ? m->place_demand : 0);
    cJSON_AddNumberToObject(e, "capacity_per_s", m ? m->place_capacity : 0);
    if (m && m->place_load < 1e9) cJSON_AddNumberToObject(e, "load", m->place_load);
    else cJSON_AddNullToObject(e, "load");
    cJSON_AddBoolToObject(e, "excluded", excluded(gw, mc));
    cJSON *sw = cJSON_AddObjectToObject(e, "switches");
    cJSON_AddNumberToObject(sw, "started", m ? (double)m->switches[0] : 0);
    cJSON_AddNumberToObject(sw, "done", m ? (double)m->switches[1] : 0);
    cJSON_AddNumberToObject(sw, "failed", m ? (double)m->switches[2] : 0);
    cJSON_AddItemToArray(ma, e);
  }
  cJSON *pa = cJSON_AddArrayToObject(o, "phones");
  for (size_t k = 0; pa && k < gw->n_replicas; k++) {
    const gw_replica *r = gw->replicas[k];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "id", r->id);
    int cur = serving(c, r);
    cJSON *ml = cJSON_AddArrayToObject(e, "models");
    for (size_t i = 0; ml && i < r->n_models; i++) cJSON_AddItemToArray(ml, cJSON_CreateString(r->models[i]));
    if (r->place.want[0]) cJSON_AddStringToObject(e, "desired", r->place.want);
    else if (cur >= 0) cJSON_AddStringToObject(e, "desired", c->model_confs[cur].name);
    else cJSON_AddNullToObject(e, "desired");
    cJSON_AddBoolToObject(e, "placed", r->ident.from_heartbeat && !r->ident.from_file && r->place.can_switch);
    if (r->place.switch_ms) {
      cJSON *s = cJSON_AddObjectToObject(e, "switch");
      cJSON_AddStringToObject(s, "from", r->place.from);
      cJSON_AddStringToObject(s, "to", r->place.want);
      cJSON_AddStringToObject(s, "phase", r->place.phase[0] ? r->place.phase : "asked");
      cJSON_AddNumberToObject(s, "for_s", (double)(now - r->place.switch_ms) / 1000.0);
      cJSON_AddStringToObject(s, "reason", r->place.reason);
    } else {
      cJSON_AddNullToObject(e, "switch");
    }
    const char *pin = pin_of(gw, r);
    if (pin) cJSON_AddStringToObject(e, "pin", pin);
    else cJSON_AddNullToObject(e, "pin");
    if (r->place.failed[0]) cJSON_AddStringToObject(e, "last_failure", r->place.failed);
    else cJSON_AddNullToObject(e, "last_failure");
    if (r->place.since_ms) cJSON_AddNumberToObject(e, "on_model_s", (double)(now - r->place.since_ms) / 1000.0);
    /* the catalogue models it may not run now, and why (memory, storage, labels, a failure) */
    cJSON *no = cJSON_AddObjectToObject(e, "may_not_run");
    for (size_t i = 0; no && i < c->n_models; i++) {
      char why[200];
      unfit_for(gw, r, &c->model_confs[i], now, why, sizeof(why));
      if (why[0]) cJSON_AddStringToObject(no, c->model_confs[i].name, why);
    }
    cJSON_AddItemToArray(pa, e);
  }
  return o;
}

/* ---- operators' pins kept in data_dir (placement.h) ------------------------------------- */

typedef struct gw_place_pins {
  char *path;  /* data_dir/placement-pins.json; NULL: memory only */
  cJSON *map;  /* {"replica id": "model"} */
} gw_place_pins;

/* Written whole at each change (a temporary file, then rename(): never half a file), 0600
 * as everything under data_dir. */
static void pins_save(const gw_place_pins *k) {
  if (!k || !k->path) return;
  cJSON *o = cJSON_CreateObject();
  cJSON *m = o ? cJSON_Duplicate(k->map, 1) : NULL;
  if (m) cJSON_AddItemToObject(o, "pins", m);
  char *s = m ? cJSON_PrintUnformatted(o) : NULL;
  cJSON_Delete(o);
  int rc = s ? pr_privfile_write(k->path, s, 0) : -ENOMEM;
  if (rc < 0)
    pr_warn("cannot write %s (%s): the placement pins hold until the gateway restarts", k->path,
            strerror(-rc));
  free(s);
}

static void pins_keep(gw_server *gw, const char *id, const char *model) {
  gw_place_pins *k = gw->place_pins;
  if (!k) return;
  cJSON_DeleteItemFromObjectCaseSensitive(k->map, id);
  if (model && cJSON_GetArraySize(k->map) >= GW_PLACE_PINS_MAX) {
    pr_warn("more than %d placement pins: %s's holds until a restart", GW_PLACE_PINS_MAX, id);
  } else if (model) {
    cJSON_AddStringToObject(k->map, id, model);
  }
  pins_save(k);
}

int gw_placement_pins_open(gw_server *gw) {
  gw_place_pins *k = calloc(1, sizeof(*k));
  if (!k || !(k->map = cJSON_CreateObject())) {
    free(k);
    return -ENOMEM;
  }
  gw->place_pins = k;
  const char *dir = gw->conf->data_dir;
  if (!dir) return 0;
  size_t len = strlen(dir) + sizeof(GW_PLACE_PINS_FILE) + 2;
  if (len > 4000 || !(k->path = malloc(len))) return -ENOMEM;
  snprintf(k->path, len, "%s/%s", dir, GW_PLACE_PINS_FILE);
  cJSON *o;
  int rc = gw_datafile_load(k->path, (size_t)GW_PLACE_PINS_MAX * 220, 8, &o, NULL);
  if (rc == -ENOMEM) return rc;
  if (!rc && !o) return 0; /* none kept yet */
  const cJSON *pins = o ? cJSON_GetObjectItemCaseSensitive(o, "pins") : NULL;
  if (!cJSON_IsObject(pins)) {
    pr_warn("%s is damaged: no placement pin is restored", k->path);
    cJSON_Delete(o);
    return 0;
  }
  const cJSON *it;
  cJSON_ArrayForEach(it, pins) {
    if (cJSON_IsString(it) && it->string[0] && strlen(it->string) < 128 && it->valuestring[0] &&
        strlen(it->valuestring) <= GW_HOLD_NAME_MAX && !cJSON_GetObjectItemCaseSensitive(k->map, it->string) &&
        cJSON_GetArraySize(k->map) < GW_PLACE_PINS_MAX && !cJSON_AddStringToObject(k->map, it->string, it->valuestring)) {
      cJSON_Delete(o);
      return -ENOMEM;
    }
  }
  cJSON_Delete(o);
  int kept = cJSON_GetArraySize(k->map);
  if (kept) pr_info("%d placement pin(s) kept from before the restart (%s)", kept, k->path);
  return 0;
}

void gw_placement_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  gw_place_pins *k = gw->place_pins;
  if (!k || !ev->r) return;
  const cJSON *pin = cJSON_GetObjectItemCaseSensitive(k->map, ev->r->id);
  if (!cJSON_IsString(pin)) return;
  if (ev->kind == GW_FLEET_REMOVED) {
    pins_keep(gw, ev->r->id, NULL);
  } else if (ev->kind == GW_FLEET_ADDED) {
    if (!gw_config_model(gw->conf, pin->valuestring)) {
      pr_warn("%s's placement pin to %s is dropped: the model is not in the configuration's models",
              ev->r->id, pin->valuestring);
      pins_keep(gw, ev->r->id, NULL);
      return;
    }
    snprintf(ev->r->place.pin, sizeof(ev->r->place.pin), "%s", pin->valuestring);
    gw->place_pass_ms = 0; /* look again at once */
  }
}

void gw_placement_pins_free(gw_server *gw) {
  gw_place_pins *k = gw->place_pins;
  if (!k) return;
  cJSON_Delete(k->map);
  free(k->path);
  free(k);
  gw->place_pins = NULL;
}

int gw_placement_pin(gw_server *gw, const char *id, const char *model, char *why, size_t n) {
  gw_replica *r = gw_registry_find(gw, id);
  if (!r) {
    snprintf(why, n, "no replica `%s`", id);
    return -ENOENT;
  }
  if (model && !gw_config_model(gw->conf, model)) {
    snprintf(why, n, "`%s` is not a model of the configuration's `models`", model);
    return -EINVAL;
  }
  if (model && !(r->ident.from_heartbeat && !r->ident.from_file)) {
    snprintf(why, n, "`%s` is a replica of the configuration file: its models are the file's", id);
    return -EINVAL;
  }
  if (model && !r->place.can_switch) {
    snprintf(why, n, "`%s`'s agent does not say it can switch models (can_switch)", id);
    return -EINVAL;
  }
  char unfit[200] = "";
  if (model) unfit_for(gw, r, gw_config_model(gw->conf, model), uv_now(gw->loop), unfit, sizeof(unfit));
  if (unfit[0]) {
    snprintf(why, n, "`%s` may not run `%s`: %s", id, model, unfit);
    return -EINVAL;
  }
  snprintf(r->place.pin, sizeof(r->place.pin), "%s", model ? model : "");
  pins_keep(gw, id, model); /* kept across restarts (data_dir) */
  char msg[300];
  snprintf(msg, sizeof(msg), model ? "%s pinned to %s by an admin" : "%s unpinned by an admin%s", id,
           model ? model : "");
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "replica", id);
  if (model) cJSON_AddStringToObject(e, "pin", model);
  else cJSON_AddNullToObject(e, "pin");
  gw_events_add(gw, "placement_pin", msg, e);
  gw->place_pass_ms = 0; /* look again at once */
  return 0;
}

int gw_placement_exclude(gw_server *gw, const char *model, int exclude, char *why, size_t n) {
  if (!gw_config_model(gw->conf, model)) {
    snprintf(why, n, "`%s` is not a model of the configuration's `models`", model);
    return -ENOENT;
  }
  gw_model *m = gw_models_get(&gw->models, model, uv_now(gw->loop));
  if (!m) {
    snprintf(why, n, "out of memory");
    return -ENOMEM;
  }
  m->place_exclude = exclude ? 1 : 0;
  char msg[200];
  snprintf(msg, sizeof(msg), "%s %s placement by an admin", model, exclude ? "excluded from" : "allowed again in");
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "model", model);
  cJSON_AddBoolToObject(e, "excluded", exclude);
  gw_events_add(gw, "placement_exclude", msg, e);
  gw->place_pass_ms = 0;
  return 0;
}

static void put_label(pr_buf *out, const char *v) {
  for (const char *p = v; *p; p++) {
    if (*p == '\\' || *p == '"') pr_buf_bytes(out, "\\", 1);
    if (*p == '\n') pr_buf_bytes(out, "\\n", 2);
    else pr_buf_bytes(out, p, 1);
  }
}

void gw_placement_metrics(gw_server *gw, pr_buf *out) {
  const gw_config *c = gw->conf;
  if (c->n_models == 0) return;
  pr_buf_text(out, "# HELP fleetgate_model_phones Phones serving each catalogue model now "
                   "(ready, not draining), and those switching to it.\n"
                   "# TYPE fleetgate_model_phones gauge\n");
  for (size_t i = 0; i < c->n_models; i++) {
    const char *name = c->model_confs[i].name;
    size_t n = 0, sw = 0;
    for (size_t k = 0; k < gw->n_replicas; k++) {
      const gw_replica *r = gw->replicas[k];
      if (r->place.switch_ms && strcmp(r->place.want, name) == 0) sw++;
      else if (gw_replica_serves(r, name) && r->state == GW_REPLICA_READY && !gw_replica_draining(r)) n++;
    }
    pr_buf_text(out, "fleetgate_model_phones{model=\"");
    put_label(out, name);
    pr_buf_text(out, "\",state=\"serving\"} %zu\nfleetgate_model_phones{model=\"", n);
    put_label(out, name);
    pr_buf_text(out, "\",state=\"switching_to\"} %zu\n", sw);
  }
  pr_buf_text(out, "# HELP fleetgate_placement_switches_total Phones placement moved to each "
                   "model: switches started, done and failed.\n"
                   "# TYPE fleetgate_placement_switches_total counter\n");
  static const char *const outcome[3] = {"started", "done", "failed"};
  for (size_t i = 0; i < c->n_models; i++) {
    const gw_model *m = gw_models_find(&gw->models, c->model_confs[i].name);
    for (int k = 0; k < 3; k++) {
      pr_buf_text(out, "fleetgate_placement_switches_total{model=\"");
      put_label(out, c->model_confs[i].name);
      pr_buf_text(out, "\",outcome=\"%s\"} %llu\n", outcome[k],
                  (unsigned long long)(m ? m->switches[k] : 0));
    }
  }
}
