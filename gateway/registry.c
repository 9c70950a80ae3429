/* The replica registry; see registry.h. */
#include "registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "events.h"
#include "log.h"
#include "shared.h"

gw_replica *gw_registry_find(gw_server *gw, const char *id) {
  return pr_idmap_get_str(&gw->reg.ids, id);
}

int gw_registry_add(gw_server *gw, gw_replica *r) {
  if (gw->n_replicas == gw->reg.cap_replicas) {
    size_t cap = gw->reg.cap_replicas ? gw->reg.cap_replicas * 2 : 16;
    gw_replica **nr = realloc(gw->replicas, cap * sizeof(*nr));
    if (!nr) return -ENOMEM;
    gw->replicas = nr;
    gw->reg.cap_replicas = cap;
  }
  if (pr_idmap_put_str(&gw->reg.ids, r->id, r) < 0) return -ENOMEM;
  gw->replicas[gw->n_replicas++] = r;
  r->ident.reg_seq = ++gw->reg.seq;
  gw_fleet_publish(gw, &(gw_fleet_event){.kind = GW_FLEET_ADDED, .r = r, .now_ms = uv_now(gw->loop)});
  return 0;
}

void gw_registry_event(gw_server *gw, gw_replica *r, const char *old_state) {
  const char *now_state = gw_replica_display_state(r);
  if (old_state && strcmp(old_state, now_state) == 0) return;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", "replica_state");
  cJSON_AddStringToObject(f, "replica", r->id);
  cJSON_AddStringToObject(f, "from", old_state ? old_state : "none");
  cJSON_AddStringToObject(f, "to", now_state);
  cJSON_AddStringToObject(f, "reason", gw_replica_reason(r));
  pr_log_kv(r->state == GW_REPLICA_READY ? PR_LOG_INFO : PR_LOG_WARN, "replica state changed", f);
  gw_fleet_publish(gw, &(gw_fleet_event){.kind = GW_FLEET_STATE, .r = r, .from = old_state,
                                          .to = now_state});
}

static int str_eq(const char *a, const char *b) {
  if (!a || !b) return a == b;
  return strcmp(a, b) == 0;
}

static int models_eq(const gw_replica *r, const gw_replica_conf *c) {
  if (r->n_models != c->n_models) return 0;
  for (size_t i = 0; i < c->n_models; i++)
    if (strcmp(r->models[i], c->models[i]) != 0) return 0;
  return 1;
}

static int same_models(const gw_replica *r, char *const *models, size_t n) {
  if (r->n_models != n) return 0;
  for (size_t i = 0; i < n; i++)
    if (strcmp(r->models[i], models[i]) != 0) return 0;
  return 1;
}

int gw_registry_set_strings(gw_server *gw, gw_replica *r, const char *url, const char *token,
                            char *const *models, size_t n_models, const char *labels) {
  int same = same_models(r, models, n_models);
  int rc = gw_replica_set_strings(r, url, token, models, n_models, labels);
  if (rc == 0 && !same)
    gw_fleet_publish(gw, &(gw_fleet_event){.kind = GW_FLEET_MODELS, .r = r, .now_ms = uv_now(gw->loop)});
  return rc;
}

/* Settings from the file win over whatever a heartbeat said. Returns 1 when anything
 * changed. */
static int apply_conf(gw_server *gw, gw_replica *r, const gw_replica_conf *c) {
  int changed = !str_eq(r->url, c->url) || !str_eq(r->token, c->token) || !models_eq(r, c) ||
                !str_eq(r->labels, c->labels) || (c->slots && r->slots != c->slots) ||
                (c->n_ctx && r->n_ctx != c->n_ctx) || r->slots_auto != !c->slots ||
                r->n_ctx_auto != !c->n_ctx ||
                r->cost_conf != c->cost_per_day || gw_replica_has(r, GW_HELD_DRAIN_CONF) != c->drain ||
                r->ident.agent != c->agent;
  if (!changed) return 0;
  if (gw_registry_set_strings(gw, r, c->url, c->token, c->models, c->n_models, c->labels)) return 0;
  gw_replica_configure_shape(r, c->slots, c->n_ctx);
  gw_replica_set_cost(r, c->cost_per_day, r->cost_claim);
  gw_replica_held_set(r, GW_HELD_DRAIN_CONF, c->drain);
  r->ident.agent = c->agent;
  return 1;
}

static gw_replica *replica_from_conf(const gw_replica_conf *c, uint64_t now, int probing) {
  gw_replica *r = gw_replica_new(c->id, c->url, c->token, c->models, c->n_models,
                                 c->slots ? c->slots : 1, c->n_ctx, c->prefill_tps,
                                 c->decode_tps, c->cost_per_day);
  if (!r) return NULL;
  gw_replica_configure_shape(r, c->slots, c->n_ctx); /* (unconfigured: /props are read) */
  if (c->labels) r->labels = strdup(c->labels);
  gw_replica_held_set(r, GW_HELD_DRAIN_CONF, c->drain);
  r->ident.agent = c->agent;
  r->ident.from_file = 1;
  /* with active checks a new replica takes work once a probe has seen it answer */
  if (probing) gw_replica_set_state(r, GW_REPLICA_LOADING, now, "not checked yet");
  else gw_replica_set_state(r, GW_REPLICA_READY, now, "configured");
  return r;
}

static void add_id(cJSON *changes, const char *key, const char *id) {
  cJSON *arr = cJSON_GetObjectItemCaseSensitive(changes, key);
  if (!arr) arr = cJSON_AddArrayToObject(changes, key);
  cJSON_AddItemToArray(arr, cJSON_CreateString(id));
}

int gw_registry_apply(gw_server *gw, const gw_config *conf, cJSON *changes) {
  uint64_t now = uv_now(gw->loop);
  int probing = conf->health_interval_s > 0;
  /* mark what the new config no longer has */
  for (size_t i = 0; i < gw->n_replicas; i++) {
    gw_replica *r = gw->replicas[i];
    if (!r->ident.from_file || gw_config_replica(conf, r->id)) continue;
    const char *old = gw_replica_display_state(r);
    r->ident.from_file = 0;
    gw_replica_set_cost(r, -1, r->cost_claim); /* now only its phone says what it costs */
    if (!r->ident.from_heartbeat) {
      gw_replica_held_set(r, GW_HELD_REMOVED, 1);
      gw_replica_set_reason(r, "removed from the configuration");
      gw_registry_event(gw, r, old);
    }
    add_id(changes, "removed", r->id);
  }
  for (size_t i = 0; i < conf->n_replicas; i++) {
    const gw_replica_conf *c = &conf->replicas[i];
    gw_replica *r = gw_registry_find(gw, c->id);
    if (!r) {
      r = replica_from_conf(c, now, probing);
      if (!r || gw_registry_add(gw, r)) {
        gw_replica_free(r);
        return -ENOMEM;
      }
      add_id(changes, "added", c->id);
      continue;
    }
    const char *old = gw_replica_display_state(r);
    int was_removed = gw_replica_has(r, GW_HELD_REMOVED);
    gw_replica_held_set(r, GW_HELD_REMOVED, 0);
    r->ident.from_file = 1;
    if (apply_conf(gw, r, c) || was_removed) add_id(changes, was_removed ? "added" : "changed", c->id);
    gw_registry_event(gw, r, old);
  }
  return 0;
}

void gw_registry_sweep(gw_server *gw, uint64_t now) {
  double silent_max_ms = gw->conf->heartbeat_timeout_s * 10 * 1000;
  size_t k = 0;
  for (size_t i = 0; i < gw->n_replicas; i++) {
    gw_replica *r = gw->replicas[i];
    int gone = gw_replica_has(r, GW_HELD_REMOVED) && r->inflight == 0 && !r->health.probing;
    if (!gone && r->ident.from_heartbeat && !r->ident.from_file && r->inflight == 0 && !r->health.probing &&
        r->report.last_heartbeat_ms && (double)(now - r->report.last_heartbeat_ms) > silent_max_ms)
      gone = 1;
    if (gone) {
      const char *why = !gw_replica_has(r, GW_HELD_REMOVED)       ? "no heartbeat for 10 × fleet.heartbeat_timeout_s"
                        : r->ident.from_heartbeat ? "its enrolment was released, nothing left running"
                                            : "removed from the configuration, nothing left running";
      cJSON *f = cJSON_CreateObject();
      cJSON_AddStringToObject(f, "event", "replica_removed");
      cJSON_AddStringToObject(f, "replica", r->id);
      cJSON_AddStringToObject(f, "reason", why);
      pr_log_kv(PR_LOG_INFO, "replica left the registry", f);
      char msg[512];
      snprintf(msg, sizeof(msg), "%s left the registry: %s", r->id, why);
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "replica", r->id);
      cJSON_AddStringToObject(e, "reason", why);
      gw_events_add(gw, "replica_removed", msg, e);
      gw_fleet_publish(gw, &(gw_fleet_event){.kind = GW_FLEET_REMOVED, .r = r});
      pr_idmap_del_str(&gw->reg.ids, r->id);
      gw_replica_free(r);
      continue;
    }
    gw->replicas[k++] = r;
  }
  gw->n_replicas = k;
}

void gw_registry_address_refused(gw_server *gw, gw_replica *r, const char *why) {
  uint64_t now = uv_now(gw->loop);
  if (r->state == GW_REPLICA_DOWN && strcmp(r->state_reason, why) == 0) return;
  const char *old = gw_replica_display_state(r);
  gw_replica_held_set(r, GW_HELD_PROBATION, 0);
  /* (coming back takes `rise` fresh probes: gw_replica_set_state forgets the good ones) */
  gw_replica_take_down(r, now, now + (uint64_t)(gw->conf->cooldown_max_s * 1000.0), why, 0);
  gw_registry_event(gw, r, old);
}

/* ---- refused registrations ---------------------------------------------------------------- */

typedef struct refused_entry {
  int64_t time_ms;
  char id[72];
  char url[160];
  char peer[64];
  char reason[256];
} refused_entry;

struct gw_refused_log {
  refused_entry ring[GW_REFUSED_KEEP];
  size_t head, n;            /* next slot to write; entries held */
  char codes[GW_REFUSED_REASONS][40];
  uint64_t counts[GW_REFUSED_REASONS];
  size_t n_codes;
};

/* text, cut to n bytes with "..." when longer; "" for NULL. Bytes outside printable
 * ASCII become '?': what a stranger sent is shown, never interpreted. */
static void cut(char *out, size_t n, const char *text) {
  snprintf(out, n, "%s", text ? text : "");
  if (text && strlen(text) >= n && n > 4) snprintf(out + n - 4, 4, "...");
  for (char *c = out; *c; c++)
    if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f) *c = '?';
}

void gw_registry_note_refused(gw_server *gw, const char *id, const char *url, const char *peer,
                              const char *reason) {
  if (!gw->reg.refused && !(gw->reg.refused = calloc(1, sizeof(*gw->reg.refused)))) return;
  struct gw_refused_log *l = gw->reg.refused;
  refused_entry *e = &l->ring[l->head];
  l->head = (l->head + 1) % GW_REFUSED_KEEP;
  if (l->n < GW_REFUSED_KEEP) l->n++;
  e->time_ms = pr_clock_wall_ms();
  cut(e->id, sizeof(e->id), id);
  cut(e->url, sizeof(e->url), url);
  cut(e->peer, sizeof(e->peer), peer);
  cut(e->reason, sizeof(e->reason), reason ? reason : "refused");
  /* the code: up to ':' or a space, letters, digits and '_' only (a metric label) */
  char code[40];
  size_t k = 0;
  for (const char *c = reason ? reason : "refused"; *c && *c != ':' && *c != ' ' && k + 1 < sizeof(code); c++)
    code[k++] = (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' ? *c : '_';
  code[k] = '\0';
  if (!k) snprintf(code, sizeof(code), "refused");
  size_t i = 0;
  while (i < l->n_codes && strcmp(l->codes[i], code) != 0) i++;
  if (i == l->n_codes) {
    if (l->n_codes + 1 >= GW_REFUSED_REASONS) snprintf(code, sizeof(code), "_other");
    i = 0;
    while (i < l->n_codes && strcmp(l->codes[i], code) != 0) i++;
    if (i == l->n_codes) snprintf(l->codes[l->n_codes++], sizeof(l->codes[0]), "%s", code);
  }
  l->counts[i]++;
}

cJSON *gw_registry_refused_json(const gw_server *gw) {
  cJSON *arr = cJSON_CreateArray();
  const struct gw_refused_log *l = gw->reg.refused;
  for (size_t k = 0; arr && l && k < l->n; k++) {
    const refused_entry *e = &l->ring[(l->head + GW_REFUSED_KEEP - 1 - k) % GW_REFUSED_KEEP];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "time_ms", (double)e->time_ms);
    cJSON_AddStringToObject(o, "id", e->id);
    cJSON_AddStringToObject(o, "url", e->url);
    cJSON_AddStringToObject(o, "peer", e->peer);
    cJSON_AddStringToObject(o, "reason", e->reason);
    cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

void gw_registry_refused_counts(const gw_server *gw,
                                void (*fn)(void *ud, const char *code, uint64_t n), void *ud) {
  const struct gw_refused_log *l = gw->reg.refused;
  for (size_t i = 0; l && i < l->n_codes; i++) fn(ud, l->codes[i], l->counts[i]);
}

void gw_registry_refused_free(gw_server *gw) {
  free(gw->reg.refused);
  gw->reg.refused = NULL;
}
