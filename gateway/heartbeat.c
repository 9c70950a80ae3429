/* Agents' signed heartbeats; see heartbeat.h. */
#include "heartbeat.h"

#include <inttypes.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "caps.h"
#include "clock.h"
#include "idkey.h"
#include "config.h"
#include "err.h"
#include "events.h"
#include "health.h"
#include "json.h"
#include "log.h"
#include "pins.h"
#include "registry.h"
#include "placement.h"
#include "shared.h"
#include "sign.h"
#include "urlpolicy.h"

#define GW_HEARTBEAT_MAX_BODY PR_CAP_HEARTBEAT

static int valid_id(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 64) return 0;
  for (const char *p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '-' || *p == '_' || *p == '.'))
      return 0;
  return 1;
}

int gw_heartbeat_verify(const char *secret, const char *ts, const char *body, size_t len,
                        const char *sig) {
  return pr_sign_verify(secret, ts, body, len, sig) == 0;
}

static void refuse(pr_http_req *req, const char *rid, int status, const char *code, const char *msg,
                   const char *why_log) {
  char peer[64];
  pr_http_peer(req, peer, sizeof(peer));
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", "heartbeat_refused");
  cJSON_AddStringToObject(f, "peer", peer);
  cJSON_AddStringToObject(f, "reason", why_log ? why_log : msg);
  pr_log_kv(PR_LOG_WARN, "heartbeat refused", f);
  gw_respond_error(req, rid, status, status == 401 ? "authentication_error" : "invalid_request_error",
                   NULL, code, 0, "%s", msg);
}


int gw_heartbeat_phone_token(const gw_server *gw, const char *id, const char *key, char out[72]) {
  if (!gw->enrol.token_secret[0]) return PR_EMISSING;
  char msg[160], sig[PR_SIGN_LEN + 1];
  int n = snprintf(msg, sizeof(msg), "%s\n%s", id, key);
  if (n < 0 || (size_t)n >= sizeof(msg)) return PR_ETOOLARGE;
  int rc = pr_sign_heartbeat(gw->enrol.token_secret, "replica-token", msg, (size_t)n, sig);
  if (rc < 0) return rc;
  snprintf(out, 72, "fgr-%s", sig + sizeof(PR_SIGN_PREFIX) - 1);
  return 0;
}

void gw_heartbeat_token_secret(gw_server *gw) {
  const gw_config *c = gw->conf;
  char *s = gw->enrol.token_secret;
  const size_t n = sizeof(gw->enrol.token_secret);
  /* never the fleet secret: every phone holds it, and could work out the others' tokens */
  if (c->fleet_replica_token) snprintf(s, n, "%s", c->fleet_replica_token);
  else if (c->redis_key) snprintf(s, n, "%s", c->redis_key); /* every gateway has it, no phone */
  else if (!gw->pins || gw_pins_secret(gw->pins, s) < 0) {
    /* kept nowhere: this process's own, and phones learn the new one at their next
     * heartbeat after a restart */
    if (gw->enrol.token_secret_random[0]) {
      memcpy(s, gw->enrol.token_secret_random, 65);
      return;
    }
    unsigned char rnd[32];
    if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
      s[0] = '\0';
      return;
    }
    for (size_t i = 0; i < sizeof(rnd); i++) snprintf(s + 2 * i, 3, "%02x", rnd[i]);
    OPENSSL_cleanse(rnd, sizeof(rnd));
    memcpy(gw->enrol.token_secret_random, s, 65); /* 64 hex digits and the NUL */
  }
}

static int fail(gw_heartbeat_result *o, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(gw_heartbeat_result *o, int status, const char *code, const char *fmt, ...) {
  o->status = status;
  o->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->msg, sizeof(o->msg), fmt, ap);
  va_end(ap);
  return status;
}

/* One device figure into *out: a plausible number is taken; null says the agent cannot
 * read it now (unknown, -1); anything else (absent, infinite, absurd) leaves it as it was. */
static void device_num(const cJSON *device, const char *key, double lo, double hi, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(device, key);
  if (cJSON_IsNull(v)) *out = -1;
  else if (cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi) *out = v->valuedouble;
}

/* 1 - max characters of visible ASCII (what a phone's words may hold when shown). */
static int visible_text(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n == 0 || n > max) return 0;
  for (const char *p = s; *p; p++)
    if (*p < ' ' || *p > '~') return 0;
  return 1;
}

/* `held`: the model files the phone's agent checked, [{"name","sha256"}], at most
 * GW_HOLD_MAX_MODELS, each name 1-64 of [A-Za-z0-9._-] and each digest 64 lowercase hex
 * digits. 0 and the list in out, or -1 with what is wrong in why. */
/* `labels`: what the phone says it is, {"name": "value"}, at most GW_HB_LABELS_MAX pairs,
 * each name 1-64 of [A-Za-z0-9._-] and each value 1-128 visible ASCII characters. 0 and
 * the object as compact JSON in *out (NULL for {}), or -1 with what is wrong in why. */
#define GW_HB_LABELS_MAX 16
static int parse_labels(const cJSON *o, char **out, char *why, size_t n) {
  *out = NULL;
  int k = 0;
  for (const cJSON *it = o->child; it; it = it->next, k++) {
    if (k >= GW_HB_LABELS_MAX || !valid_id(it->string) || !cJSON_IsString(it) ||
        !visible_text(it->valuestring, 128)) {
      snprintf(why, n, "labels: an object of at most %d pairs, each name 1-64 of [A-Za-z0-9._-] "
               "and each value a string of 1-128 visible ASCII characters", GW_HB_LABELS_MAX);
      return -1;
    }
  }
  if (k && !(*out = pr_json_print(o))) {
    snprintf(why, n, "out of memory");
    return -1;
  }
  return 0;
}

/* The `switch` object: {"to", "phase", "why"}; returns 0, or -1 when it is not that. */
static int parse_switch(const cJSON *sw, gw_place_report *out) {
  static const char *const keys[] = {"to", "phase", "why", NULL};
  pr_json_err je;
  const char *to = NULL, *phase = NULL, *why = NULL;
  if (pr_json_check_keys(sw, keys, "switch", &je) != 0) return -1;
  if (pr_json_get_str(sw, "to", 1, &to, "switch", &je) < 0 ||
      pr_json_get_str(sw, "phase", 1, &phase, "switch", &je) < 0 ||
      pr_json_get_str(sw, "why", 0, &why, "switch", &je) < 0)
    return -1;
  static const char *const phases[] = {"draining", "fetching", "loading", "failed", NULL};
  int ok = 0;
  for (size_t i = 0; phases[i]; i++) ok |= strcmp(phase, phases[i]) == 0;
  if (!ok || !visible_text(to, GW_HOLD_NAME_MAX) || (why && !visible_text(why, 300)) ||
      ((why != NULL) != (strcmp(phase, "failed") == 0)))
    return -1;
  snprintf(out->to, sizeof(out->to), "%s", to);
  snprintf(out->phase, sizeof(out->phase), "%s", phase);
  snprintf(out->why, sizeof(out->why), "%s", why ? why : "");
  return 0;
}

static int parse_held(const cJSON *held, gw_hold_model *out, size_t *n, char *why, size_t whyn) {
  static const char *const keys[] = {"name", "sha256", NULL};
  *n = 0;
  int i = 0;
  for (const cJSON *e = held->child; e; e = e->next, i++) {
    pr_json_err je;
    memset(&je, 0, sizeof(je));
    const char *name = NULL, *sha = NULL;
    char base[32];
    snprintf(base, sizeof(base), "held[%d]", i);
    if (*n >= GW_HOLD_MAX_MODELS) {
      snprintf(why, whyn, "held: at most %d models", GW_HOLD_MAX_MODELS);
      return -1;
    }
    int rc = cJSON_IsObject(e) ? pr_json_check_keys(e, keys, base, &je) : -1;
    if (rc == 0) rc = pr_json_get_str(e, "name", 1, &name, base, &je);
    if (rc >= 0) rc = pr_json_get_str(e, "sha256", 1, &sha, base, &je);
    if (rc < 0 || !cJSON_IsObject(e)) {
      snprintf(why, whyn, "%s: %s", je.path[0] ? je.path : base, je.msg[0] ? je.msg : "expected an object");
      return -1;
    }
    int ok = valid_id(name) && strlen(sha) == 64;
    for (const char *p = sha; ok && *p; p++) ok = (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f');
    if (!ok) {
      snprintf(why, whyn, "%s: name must be 1-64 of [A-Za-z0-9._-] and sha256 64 lowercase hex digits", base);
      return -1;
    }
    snprintf(out[*n].name, sizeof(out[*n].name), "%s", name);
    snprintf(out[*n].sha256, sizeof(out[*n].sha256), "%s", sha);
    (*n)++;
  }
  return 0;
}

/* A phone that cannot hold its model says so once (state "unfit", no url) and stops: it is
 * listed with the refused registrations when it speaks for the fleet -- signed by the key
 * pinned to its id, or with the fleet secret for an id no other key holds. Nothing is
 * pinned or registered; a replica its key already registered (a kept identity) goes down
 * at once. 0 with o->unfit set, or an error status in o. */
static int heartbeat_unfit(gw_server *gw, const gw_heartbeat_msg *m, const char *id, const char *key,
                           const char *why, const char *model, const cJSON *device, const char *labels,
                           gw_heartbeat_result *o) {
  const gw_config *c = gw->conf;
  const gw_replica_conf *rc = gw_config_replica(c, id);
  const gw_pin *pin = rc && rc->key ? NULL : gw_pins_find(gw->pins, id);
  const char *pinned = rc && rc->key ? rc->key : pin ? pin->key : NULL;
  if (pr_idkey_verify(key, m->ts, m->body, m->len, m->key_sig) != 0)
    return fail(o, 401, "invalid_signature", "the heartbeat's key signature does not match its key");
  if (!pinned || strcmp(pinned, key) != 0) {
    if (!m->fleet_sig)
      return fail(o, 401, "missing_signature",
                  "the heartbeat needs x-fleetgate-signature (the fleet secret) until the phone's key "
                  "is enrolled, and a key signature by the enrolled key after");
    if (!gw_heartbeat_verify(c->fleet_secret, m->ts, m->body, m->len, m->fleet_sig))
      return fail(o, 401, "invalid_signature", "the heartbeat's signature does not match");
    if (pinned)
      return fail(o, 401, "key_mismatch", "%s is enrolled with another key; an operator can release it "
                  "(DELETE /admin/v1/enrolments/%s)", id, id);
  }
  gw_replica *r = gw_registry_find(gw, id);
  if (r && m->tsv <= r->report.last_heartbeat_ts)
    return fail(o, 401, "replayed_heartbeat", "the heartbeat is not newer than the last one accepted");
  o->member = 1;
  o->unfit = 1;
  o->code = "cannot_hold";
  snprintf(o->msg, sizeof(o->msg), "%s", why);
  /* with placement, a model of the catalogue it can hold is offered instead; with none,
   * the reason says so */
  double mem = -1, storage = -1;
  if (device) {
    device_num(device, "mem_total_mb", 0, 1e8, &mem);
    device_num(device, "storage_free_mb", 0, 1e12, &storage);
  }
  /* not to a phone of the config file (placement never moves those), nor, with enrolment
   * by approval, to one not approved yet (the catalogue's urls are the operator's) */
  int offer = !rc && (!c->fleet_enrol_approve ||
                      (pin && pin->state == GW_PIN_PINNED && strcmp(pin->key, key) == 0));
  int found = offer ? gw_placement_instead(gw, model, mem, storage, labels, o->instead, sizeof(o->instead)) : -1;
  if (found == 0)
    snprintf(o->msg, sizeof(o->msg), "%s; nor can it hold any other model of the catalogue", why);
  else if (found == 1)
    snprintf(o->msg, sizeof(o->msg), "%s; placement offered it %s instead", why, o->instead);
  if (r && pinned && strcmp(r->ident.key, key) == 0) {
    uint64_t now = uv_now(gw->loop);
    const char *old = gw_replica_display_state(r);
    char reason[128];
    snprintf(reason, sizeof(reason), "its phone cannot hold its model: %s", why);
    r->report.last_heartbeat_ts = m->tsv;
    gw_replica_held_set(r, GW_HELD_PROBATION, 0);
    gw_replica_take_down(r, now, now + (uint64_t)(c->cooldown_max_s * 1000.0), reason, 0);
    gw_registry_event(gw, r, old);
  }
  return 0;
}

/* The enrolment budget: a token bucket of fleet.max_enrolments_per_min. */
static int enrol_allowed(gw_server *gw, uint64_t now) {
  double cap = gw->conf->fleet_enrol_per_min;
  if (!gw->enrol.ms) gw->enrol.tokens = cap;
  else gw->enrol.tokens += (double)(now - gw->enrol.ms) * cap / 60000.0;
  if (gw->enrol.tokens > cap) gw->enrol.tokens = cap;
  gw->enrol.ms = now ? now : 1;
  if (gw->enrol.tokens < 1) return 0;
  gw->enrol.tokens -= 1;
  return 1;
}

static void log_enrolment(const char *what, const char *id, const char *url, const char *key, int remote) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", "phone_enrolled");
  cJSON_AddStringToObject(f, "replica", id);
  cJSON_AddStringToObject(f, "url", url);
  cJSON_AddStringToObject(f, "key", key);
  cJSON_AddStringToObject(f, "pin", what);
  if (remote) cJSON_AddStringToObject(f, "via", "another gateway");
  pr_log_kv(PR_LOG_INFO, "phone enrolled", f);
}

/* Who may speak for id with key, and is this message theirs: 0 to go on, 202 pending,
 * else an error status in o. */
static int heartbeat_identity(gw_server *gw, const gw_heartbeat_msg *m, int remote, const char *id,
                              const char *key, const char *url, gw_heartbeat_result *o) {
  const gw_config *c = gw->conf;
  const gw_replica_conf *rc = gw_config_replica(c, id);
  const char *pinned = rc && rc->key ? rc->key : NULL;
  gw_pin *pin = pinned ? NULL : gw_pins_find(gw->pins, id);
  if (pin) pinned = pin->key;
  /* the phone that owns the id, speaking with its key */
  if (pinned && strcmp(pinned, key) == 0 && pr_idkey_verify(pinned, m->ts, m->body, m->len, m->key_sig) == 0) {
    if (pin && pin->state == GW_PIN_PENDING) {
      gw_pins_seen(gw->pins, pin, NULL, pr_clock_wall_ms()); /* waiting, not gone */
      return fail(o, 202, "enrolment_pending", "waiting for an operator to approve %s", id);
    }
    return 0;
  }
  /* anyone else must be of the fleet before learning anything about the id (enrolled,
   * reserved or free): one answer for all strangers */
  if (!m->fleet_sig)
    return fail(o, 401, "missing_signature",
                "the heartbeat needs x-fleetgate-signature (the fleet secret) until the phone's key "
                "is enrolled, and a key signature by the enrolled key after");
  if (!gw_heartbeat_verify(c->fleet_secret, m->ts, m->body, m->len, m->fleet_sig))
    return fail(o, 401, "invalid_signature", "the heartbeat's signature does not match");
  o->member = 1;
  if (rc && !rc->heartbeats && !rc->key)
    return fail(o, 403, "id_reserved",
                "replica %s is defined in the configuration without \"heartbeats\": true; its "
                "heartbeats are not taken", id);
  if (pinned && strcmp(pinned, key) != 0)
    return fail(o, 401, "key_mismatch",
                "%s is enrolled with another key; an operator can release it "
                "(DELETE /admin/v1/enrolments/%s)", id, id);
  if (pr_idkey_verify(key, m->ts, m->body, m->len, m->key_sig) != 0)
    return fail(o, 401, "invalid_signature", "the heartbeat's key signature does not match its key");
  uint64_t now = uv_now(gw->loop);
  if (gw_pins_total(gw->pins) >= c->fleet_max_replicas)
    return fail(o, 503, "registry_full", "the fleet has %zu phones enrolled or pending "
                "(fleet.max_replicas)", gw_pins_total(gw->pins));
  if (!enrol_allowed(gw, now))
    return fail(o, 429, "enrolment_rate", "too many new phones at once "
                "(fleet.max_enrolments_per_min); try again later");
  gw_pin_state st = c->fleet_enrol_approve ? GW_PIN_PENDING : GW_PIN_PINNED;
  int prc = gw_pins_put(gw->pins, id, key, url, st, pr_clock_wall_ms(), c->fleet_max_replicas);
  if (prc == PR_ETOOLARGE)
    return fail(o, 503, "registry_full", "the fleet is full (fleet.max_replicas)");
  if (prc < 0) return fail(o, 500, "internal_error", "cannot keep the pin: %s", pr_strerror(prc));
  log_enrolment(st == GW_PIN_PENDING ? "pending" : "pinned", id, url, key, remote);
  if (st == GW_PIN_PENDING)
    return fail(o, 202, "enrolment_pending", "waiting for an operator to approve %s", id);
  return 0;
}

int gw_heartbeat_pace(const gw_config *c, const gw_replica *r, int64_t tsv, uint64_t now, int remote) {
  if (r && tsv <= r->report.last_heartbeat_ts) return 401;
  /* one phone, one heartbeat per quarter interval (at most a second apart) */
  double spacing_ms = c->heartbeat_interval_s * 250.0;
  if (spacing_ms > 1000) spacing_ms = 1000;
  if (!remote && r && r->report.last_heartbeat_ms && r->ident.from_heartbeat &&
      (double)(now - r->report.last_heartbeat_ms) < spacing_ms)
    return 429;
  return 0;
}

void gw_heartbeat_apply(gw_server *gw, const gw_heartbeat_msg *m, int remote, gw_heartbeat_result *o) {
  memset(o, 0, sizeof(*o));
  const gw_config *c = gw->conf;
  pr_json_err je;
  cJSON *obj = pr_json_parse(m->body ? m->body : "", m->len, 16, &je);
  if (!obj || !cJSON_IsObject(obj)) {
    cJSON_Delete(obj);
    fail(o, 400, "invalid_json", "the heartbeat body must be a JSON object");
    return;
  }
  static const char *const keys[] = {"id", "url", "key", "models", "slots", "busy", "n_ctx",
                                     "prefill_tps", "decode_tps", "state", "device", "version",
                                     "uptime_s", "cost_per_day", "held", "loading", "unfit", "switch", "can_switch",
                                     "labels", NULL};
  const char *id = NULL, *url = NULL, *key = NULL, *state = NULL, *version = NULL;
  const char *loading = NULL, *unfit = NULL;
  const cJSON *models = NULL, *device = NULL, *held = NULL, *sw = NULL, *labels = NULL;
  int64_t slots = 1, busy = 0, n_ctx = 0;
  double pre = 0, dec = 0, up = 0, cost = -1;
  int rc = pr_json_check_keys(obj, keys, "", &je);
  if (!rc) rc = pr_json_get_str(obj, "id", 1, &id, "", &je);
  if (rc >= 0) rc = pr_json_get_str(obj, "state", 0, &state, "", &je);
  /* a phone that cannot hold its model opened nothing: its report has no url */
  if (rc >= 0) rc = pr_json_get_str(obj, "url", !(state && strcmp(state, "unfit") == 0), &url, "", &je);
  if (rc >= 0) rc = pr_json_get_str(obj, "key", 1, &key, "", &je);
  if (rc >= 0) rc = pr_json_get_arr(obj, "models", 1, &models, "", &je);
  if (rc >= 0) rc = pr_json_get_int(obj, "slots", 1, 1, GW_MAX_SLOTS, &slots, "", &je);
  if (rc >= 0) rc = pr_json_get_int(obj, "busy", 0, 0, GW_MAX_SLOTS, &busy, "", &je);
  if (rc >= 0) rc = pr_json_get_int(obj, "n_ctx", 0, 0, INT64_C(1) << 30, &n_ctx, "", &je);
  if (rc >= 0) rc = pr_json_get_double(obj, "prefill_tps", 0, 0, 1e7, &pre, "", &je);
  if (rc >= 0) rc = pr_json_get_double(obj, "decode_tps", 0, 0, 1e7, &dec, "", &je);
  if (rc >= 0) rc = pr_json_get_double(obj, "uptime_s", 0, 0, 1e10, &up, "", &je);
  if (rc >= 0) rc = pr_json_get_double(obj, "cost_per_day", 0, 0, 1e9, &cost, "", &je);
  if (rc >= 0) rc = pr_json_get_str(obj, "version", 0, &version, "", &je);
  if (rc >= 0) rc = pr_json_get_obj(obj, "device", 0, &device, "", &je);
  if (rc >= 0) rc = pr_json_get_arr(obj, "held", 0, &held, "", &je);
  if (rc >= 0) rc = pr_json_get_str(obj, "loading", 0, &loading, "", &je);
  if (rc >= 0) rc = pr_json_get_str(obj, "unfit", 0, &unfit, "", &je);
  if (rc >= 0) rc = pr_json_get_obj(obj, "switch", 0, &sw, "", &je);
  if (rc >= 0) rc = pr_json_get_obj(obj, "labels", 0, &labels, "", &je);
  int can_switch = 0;
  if (rc >= 0) rc = pr_json_get_bool(obj, "can_switch", 0, &can_switch, "", &je);
  if (rc < 0) {
    fail(o, 400, "invalid_heartbeat", "%s: %s", je.path, je.msg);
    cJSON_Delete(obj);
    return;
  }
  char *mlist[64];
  size_t nm = 0;
  int bad = !valid_id(id);
  for (const cJSON *mo = models->child; mo && !bad; mo = mo->next) {
    if (!cJSON_IsString(mo) || !mo->valuestring[0] || nm >= 64) bad = 1;
    else mlist[nm++] = mo->valuestring;
  }
  int is_unfit = state && strcmp(state, "unfit") == 0;
  if (bad || nm == 0 || (state && strcmp(state, "ready") && strcmp(state, "loading") &&
                         strcmp(state, "draining") && !is_unfit)) {
    cJSON_Delete(obj);
    fail(o, 400, "invalid_heartbeat", "id must be 1-64 of [A-Za-z0-9._-], models a "
         "non-empty list of names, state ready|loading|draining|unfit");
    return;
  }
  /* what the phone holds (docs/protocol.md): checked whole before anything is applied */
  gw_hold_model hold_models[GW_HOLD_MAX_MODELS];
  size_t n_hold = 0;
  char hwhy[540] = "";
  if (held && parse_held(held, hold_models, &n_hold, hwhy, sizeof(hwhy)) < 0) {
    /* said in hwhy */
  } else if (loading && !visible_text(loading, GW_HOLD_NAME_MAX)) {
    snprintf(hwhy, sizeof(hwhy), "loading: 1-64 visible ASCII characters (a model's name)");
  } else if (is_unfit != (unfit != NULL) || (unfit && !visible_text(unfit, 500))) {
    snprintf(hwhy, sizeof(hwhy), "unfit: 1-500 visible ASCII characters, with state \"unfit\" only");
  }
  /* a switch of models the agent is making (placement.h) */
  gw_place_report prep;
  memset(&prep, 0, sizeof(prep));
  if (!hwhy[0] && sw && parse_switch(sw, &prep) < 0)
    snprintf(hwhy, sizeof(hwhy), "switch: {\"to\": a model's name, \"phase\": draining|fetching|"
             "loading|failed, \"why\": 1-300 visible ASCII characters (failed only)}");
  /* the labels it says it has (placement's `labels`, capacity's class): a phone of the
   * configuration file keeps its file's */
  char *label_json = NULL;
  if (!hwhy[0] && labels) parse_labels(labels, &label_json, hwhy, sizeof(hwhy));
  if (hwhy[0]) {
    free(label_json);
    cJSON_Delete(obj);
    fail(o, 400, "invalid_heartbeat", "%s", hwhy);
    return;
  }
  snprintf(o->id, sizeof(o->id), "%s", id);
  snprintf(o->url, sizeof(o->url), "%s", url ? url : "");
  if (!pr_idkey_valid_public(key)) {
    cJSON_Delete(obj);
    free(label_json);
    fail(o, 400, "invalid_heartbeat", "key must be the phone's Ed25519 public key (base64 of 32 bytes)");
    return;
  }
  if (is_unfit) {
    heartbeat_unfit(gw, m, id, key, unfit, mlist[0], device, label_json, o);
    cJSON_Delete(obj);
    free(label_json);
    return;
  }
  char uwhy[256];
  if (gw_url_check(c, url, uwhy, sizeof(uwhy), NULL) < 0) {
    /* the URL policy (urlpolicy.h): nothing of this heartbeat is applied, no key pinned;
     * shown to operators when a phone of the fleet sent it */
    const gw_pin *pin = gw_pins_find(gw->pins, id);
    o->member = (m->fleet_sig && gw_heartbeat_verify(c->fleet_secret, m->ts, m->body, m->len, m->fleet_sig)) ||
                (pin && strcmp(pin->key, key) == 0 && pr_idkey_verify(pin->key, m->ts, m->body, m->len, m->key_sig) == 0);
    cJSON_Delete(obj);
    free(label_json);
    fail(o, 400, "url_not_allowed", "url: %s", uwhy);
    return;
  }
  size_t nlen = strlen(url);
  while (nlen > 0 && url[nlen - 1] == '/') nlen--;
  char *u = strndup(url, nlen);
  if (!u) {
    cJSON_Delete(obj);
    free(label_json);
    fail(o, 500, "out_of_memory", "out of memory");
    return;
  }
  uint64_t now = uv_now(gw->loop);
  gw_replica *r = gw_registry_find(gw, id);
  /* who speaks first (so a stranger learns nothing of the id's last timestamp), then
   * replays */
  if (heartbeat_identity(gw, m, remote, id, key, u, o)) {
    free(u);
    cJSON_Delete(obj);
    free(label_json);
    return;
  }
  int pace = gw_heartbeat_pace(c, r, m->tsv, now, remote);
  if (pace == 401) {
    free(u);
    cJSON_Delete(obj);
    free(label_json);
    fail(o, 401, "replayed_heartbeat", "the heartbeat is not newer than the last one accepted");
    return;
  }
  if (pace == 429) {
    free(u);
    cJSON_Delete(obj);
    free(label_json);
    fail(o, 429, "heartbeat_rate", "heartbeats for %s come faster than the gateway asked "
         "(every %.2f s)", o->id, c->heartbeat_interval_s);
    return;
  }
  const gw_replica_conf *fconf = gw_config_replica(c, id);
  char token[72];
  int have_token = gw_heartbeat_phone_token(gw, id, key, token) == 0;
  gw_pin *pin = gw_pins_find(gw->pins, id);
  if (pin) {
    if (strcmp(pin->url, u) != 0 && pin->url[0])
      pr_info("replica %s moved from %s to %s (signed by its key)", id, pin->url, u);
    gw_pins_seen(gw->pins, pin, u, pr_clock_wall_ms());
  }
  int is_new = 0;
  if (!r) {
    /* rates it claims are seeded below (bounded); without, the fleet's prior */
    r = gw_replica_new(id, u, have_token ? token : NULL, mlist, nm, (int)slots, n_ctx, 0, 0, 0);
    if (!r || gw_registry_add(gw, r)) {
      gw_replica_free(r);
      free(u);
      cJSON_Delete(obj);
    free(label_json);
      fail(o, 500, "out_of_memory", "out of memory");
      return;
    }
    r->ident.agent = 1;
    is_new = 1;
    if (label_json && gw_replica_set_strings(r, r->url, r->token, r->models, r->n_models, label_json))
      pr_warn("replica %s: its labels are not kept (out of memory)", id);
    gw_replica_set_state(r, GW_REPLICA_READY, now, "registered by heartbeat");
  } else if (!r->ident.from_file) {
    /* heartbeat-only: the phone's signed word is the only source of its settings */
    if (strcmp(r->url, u) != 0 && !is_new)
      pr_info("replica %s now at %s", id, u);
    gw_registry_set_strings(gw, r, u, have_token ? token : NULL, mlist, nm, label_json);
    gw_replica_set_shape(r, (int)slots, n_ctx);
  } else {
    /* from a file that leaves them out: the agent says; a file without a token of its
     * own calls the phone with its derived one */
    gw_replica_learn_shape(r, slots, n_ctx);
    if (fconf && !fconf->token && have_token && (!r->token || strcmp(r->token, token) != 0))
      gw_replica_set_strings(r, r->url, token, r->models, r->n_models, r->labels);
  }
  free(u);
  const char *old = gw_replica_display_state(r);
  r->ident.from_heartbeat = 1;
  snprintf(r->ident.key, sizeof(r->ident.key), "%s", key);
  /* a heartbeat relayed by another gateway is as fresh as its signed timestamp */
  int64_t age = remote ? pr_clock_wall_ms() - m->tsv : 0;
  if (age < 0) age = 0;
  r->report.last_heartbeat_ms = now > (uint64_t)age ? now - (uint64_t)age : 0;
  r->report.last_heartbeat_ts = m->tsv;
  r->report.busy_reported = (int)busy;
  int agent_drained = gw_replica_has(r, GW_HELD_DRAIN_AGENT);
  gw_replica_held_set(r, GW_HELD_DRAIN_AGENT, state && strcmp(state, "draining") == 0);
  if (agent_drained && !gw_replica_has(r, GW_HELD_DRAIN_AGENT) && r->state == GW_REPLICA_READY && !gw_replica_draining(r))
    gw_replica_set_reason(r, "its agent stopped draining");
  if (version) snprintf(r->report.version, sizeof(r->report.version), "%s", version);
  gw_replica_seed_rates(r, pre, dec); /* bounded; only until rates are learned here */
  /* the phone's price: believed up to costs.max_claimed_per_day, and only where no file
   * gives one (each heartbeat's replaces the last; one without it claims nothing) */
  if (cost > c->cost_claim_max) cost = c->cost_claim_max;
  gw_replica_set_cost(r, r->ident.from_file ? r->cost_conf : -1, cost);
  if (device) {
    /* shown to operators and in metrics */
    device_num(device, "battery_pct", 0, 100, &r->report.battery_pct);
    device_num(device, "temperature_c", -60, 200, &r->report.temperature_c);
    device_num(device, "mem_free_mb", 0, 1e8, &r->report.mem_free_mb);
    device_num(device, "cpu_max_freq_ratio", 0, 1, &r->report.cpu_max_freq_ratio);
    device_num(device, "mem_total_mb", 0, 1e8, &r->report.hold.mem_total_mb);
    device_num(device, "storage_free_mb", 0, 1e12, &r->report.hold.storage_free_mb);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(device, "charging");
    if (cJSON_IsBool(v)) r->report.charging = cJSON_IsTrue(v);
    else if (cJSON_IsNull(v)) r->report.charging = -1;
  }
  /* the models on its disk: each heartbeat's list replaces the last; one without says
   * nothing of them (an agent that does not report them) */
  memcpy(r->report.hold.models, hold_models, n_hold * sizeof(hold_models[0]));
  r->report.hold.n_models = n_hold;
  r->report.hold.models_known = held != NULL;
  snprintf(r->report.hold.loading, sizeof(r->report.hold.loading), "%s", loading ? loading : "");
  if (state && strcmp(state, "loading") == 0) {
    gw_replica_engine_loading(r, now, "agent reports loading", 0);
  } else if (r->state == GW_REPLICA_DOWN && strstr(r->state_reason, "heartbeat")) {
    /* it was out only for silence: a heartbeat is the sign of life it lacked */
    gw_replica_held_set(r, GW_HELD_PROBATION, 1);
    gw_replica_set_state(r, GW_REPLICA_READY, now, "heartbeats resumed, on probation");
  } else if (r->state == GW_REPLICA_LOADING && !r->ident.from_file) {
    gw_replica_set_state(r, GW_REPLICA_READY, now, "agent reports ready");
  }
  if (is_new) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "event", "replica_registered");
    if (remote) cJSON_AddStringToObject(f, "via", "another gateway");
    cJSON_AddStringToObject(f, "replica", r->id);
    cJSON_AddStringToObject(f, "url", r->url);
    pr_log_kv(PR_LOG_INFO, "replica registered by heartbeat", f);
    char msg[512];
    snprintf(msg, sizeof(msg), "%s joined the fleet by heartbeat%s: %s", r->id,
             remote ? " (through another gateway)" : "", r->url);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "replica", r->id);
    cJSON_AddStringToObject(e, "url", r->url);
    cJSON_AddStringToObject(e, "source", remote ? "another gateway" : "heartbeat");
    gw_events_add(gw, "replica_registered", msg, e);
  } else {
    gw_registry_event(gw, r, old);
  }
  gw_placement_heartbeat(gw, r, state, can_switch, &prep, now); /* a switch of models ends (placement.h) */
  gw_heartbeat_device(gw, r); /* what its readings do to its work (device.h) */
  gw_health_heartbeat(gw, r, (int)busy); /* proof of life; its heartbeats' new limit */
  cJSON_Delete(obj);
  free(label_json);
  o->r = r;
}

static int pin_in_registry(void *ud, const char *id) {
  gw_server *gw = ud;
  return gw_registry_find(gw, id) != NULL;
}

void gw_heartbeat_expire_pins(gw_server *gw) {
  if (!gw->pins) return;
  /* a pending key whose phone stopped asking goes after 10 heartbeat timeouts */
  size_t n = gw_pins_expire(gw->pins, pr_clock_wall_ms(), (int64_t)(gw->conf->fleet_pin_ttl_s * 1000),
                            (int64_t)(gw->conf->heartbeat_timeout_s * 10 * 1000),
                            pin_in_registry, gw);
  if (n) pr_info("released %zu pin(s) of phones silent for more than %.0f s (fleet.pin_ttl_s)", n,
                 gw->conf->fleet_pin_ttl_s);
}

void gw_heartbeat_device(gw_server *gw, gw_replica *r) {
  const gw_device_conf *c = &gw->conf->device;
  gw_device_verdict v;
  gw_device_judge(c, r->report.battery_pct, r->report.charging, r->report.temperature_c, r->report.cpu_max_freq_ratio,
                  r->dev.hot, &v);
  if (v.hot && !r->dev.hot) {
    /* answers from now on are measured while hot: they take the slowdown's place */
    r->dev.pre0 = r->prefill_samples;
    r->dev.dec0 = r->decode_samples;
  }
  r->dev.cap = v.cap;
  r->dev.hot = v.hot;
  r->dev.slow = v.slowdown;
  r->dev.hot_answers = c->hot_answers;
  /* people hear of it when it starts, changes in kind and ends, not at each reading */
  int was_held = r->dev.held_back[0] != 0;
  if (!was_held && !v.why[0]) return;
  char kind_was[16], kind_now[16];
  snprintf(kind_was, sizeof(kind_was), "%d%d%d", r->dev.cap_shown, r->dev.hot_shown, was_held);
  r->dev.cap_shown = v.cap;
  r->dev.hot_shown = v.hot;
  snprintf(kind_now, sizeof(kind_now), "%d%d%d", v.cap, v.hot, v.why[0] != 0);
  snprintf(r->dev.held_back, sizeof(r->dev.held_back), "%s", v.why);
  if (strcmp(kind_was, kind_now) == 0) return;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", v.why[0] ? "replica_held_back" : "replica_held_back_ended");
  cJSON_AddStringToObject(f, "replica", r->id);
  if (v.why[0]) cJSON_AddStringToObject(f, "held_back", v.why);
  else cJSON_AddNullToObject(f, "held_back");
  pr_log_kv(PR_LOG_INFO, v.why[0] ? "replica held back" : "replica no longer held back", f);
  char msg[300];
  if (v.why[0]) snprintf(msg, sizeof(msg), "%s is held back: %s", r->id, v.why);
  else snprintf(msg, sizeof(msg), "%s is no longer held back by its readings", r->id);
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "replica", r->id);
  if (v.why[0]) cJSON_AddStringToObject(e, "held_back", v.why);
  else cJSON_AddNullToObject(e, "held_back");
  gw_events_add(gw, v.why[0] ? "replica_held_back" : "replica_held_back_ended", msg, e);
}

/* A heartbeat refused for its URL, remembered for the status page (registry.h) when it
 * comes from someone with a say in the fleet: signed with the fleet secret, or by the
 * key pinned to its id. Anyone else's is only logged, so strangers cannot fill the list. */
static void note_refused(gw_server *gw, pr_http_req *req, const gw_heartbeat_result *res) {
  char peer[64], reason[640];
  pr_http_peer(req, peer, sizeof(peer));
  snprintf(reason, sizeof(reason), "%s: %s", res->code, res->msg);
  gw_registry_note_refused(gw, res->id[0] ? res->id : NULL, res->url[0] ? res->url : NULL, peer, reason);
}

/* A phone of the fleet that cannot hold its model: listed with the refused registrations
 * (reason "cannot_hold: ..."), logged, an event; answered 200, accepted false. */
static void heartbeat_unfit_answer(gw_server *gw, pr_http_req *req, const char *rid,
                                   const gw_heartbeat_result *res) {
  const char *instead = res->instead[0] ? res->instead : NULL;
  /* listed even when offered another model: an agent that cannot take the offer (one
   * older than it) ends its run all the same, and the list is where an operator looks */
  note_refused(gw, req, res);
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", "phone_cannot_hold");
  cJSON_AddStringToObject(f, "replica", res->id);
  cJSON_AddStringToObject(f, "reason", res->msg);
  if (instead) cJSON_AddStringToObject(f, "instead", instead);
  pr_log_kv(PR_LOG_WARN, instead ? "phone cannot hold its model: offered another" : "phone cannot hold its model", f);
  char msg[900];
  if (instead)
    snprintf(msg, sizeof(msg), "%s cannot hold its model and was offered %s: %s", res->id, instead, res->msg);
  else
    snprintf(msg, sizeof(msg), "%s cannot hold its model and stopped: %s", res->id, res->msg);
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "replica", res->id);
  cJSON_AddStringToObject(e, "reason", res->msg);
  if (instead) cJSON_AddStringToObject(e, "instead", instead);
  gw_events_add(gw, "phone_cannot_hold", msg, e);
  cJSON *reply = cJSON_CreateObject();
  cJSON_AddStringToObject(reply, "id", res->id);
  cJSON_AddBoolToObject(reply, "accepted", 0);
  cJSON_AddStringToObject(reply, "state", "unfit");
  if (instead) gw_placement_instead_answer(gw, instead, reply);
  char *s = cJSON_PrintUnformatted(reply);
  cJSON_Delete(reply);
  char h1[160];
  snprintf(h1, sizeof(h1), "x-request-id: %s", rid);
  const char *hdrs[] = {h1, NULL};
  pr_http_respond(req, 200, hdrs, "application/json", s ? s : "{}", s ? strlen(s) : 2);
  free(s);
}

/* The checks that need no body; 1 when req was answered. Fills *tsv. */
static int heartbeat_headers(gw_server *gw, pr_http_req *req, const char *rid, int64_t *tsv) {
  const gw_config *c = gw->conf;
  if (!c->fleet_secret) {
    gw_respond_error(req, rid, 404, "invalid_request_error", NULL, "heartbeats_disabled", 0,
                     "heartbeats are not enabled on this gateway (no fleet.secret_env)");
    return 1;
  }
  const char *ts = pr_http_header_get(req, "x-fleetgate-timestamp");
  if (!ts || !pr_http_header_get(req, "x-fleetgate-key-signature")) {
    refuse(req, rid, 401, "missing_signature",
           "a heartbeat needs x-fleetgate-timestamp and x-fleetgate-key-signature (the phone's "
           "own key), and x-fleetgate-signature (the fleet secret) until the phone is enrolled",
           NULL);
    return 1;
  }
  const char *code = gw_heartbeat_check_ts(ts, pr_clock_wall_ms(), c->heartbeat_max_skew_s, tsv);
  if (code && strcmp(code, "invalid_timestamp") == 0) {
    refuse(req, rid, 401, "invalid_timestamp", "x-fleetgate-timestamp must be milliseconds since the epoch", NULL);
    return 1;
  }
  if (code) {
    refuse(req, rid, 401, "stale_timestamp", "the heartbeat's timestamp is outside the allowed window", NULL);
    return 1;
  }
  return 0;
}

const char *gw_heartbeat_check_ts(const char *ts, int64_t now_wall_ms, double max_skew_s, int64_t *tsv) {
  char *end;
  long long v = strtoll(ts, &end, 10);
  if (end == ts || *end || v <= 0) return "invalid_timestamp";
  int64_t skew = now_wall_ms - (int64_t)v;
  if (skew < 0) skew = -skew;
  if ((double)skew > max_skew_s * 1000) return "stale_timestamp";
  *tsv = (int64_t)v;
  return NULL;
}

int gw_heartbeat_head(gw_server *gw, pr_http_req *req, const char *rid) {
  int64_t tsv;
  return heartbeat_headers(gw, req, rid, &tsv);
}

void gw_heartbeat_handle(gw_server *gw, pr_http_req *req, const char *rid) {
  const gw_config *c = gw->conf;
  int64_t tsv = 0;
  if (heartbeat_headers(gw, req, rid, &tsv)) return;
  if (req->body.len > GW_HEARTBEAT_MAX_BODY) {
    refuse(req, rid, 413, "request_too_large", "heartbeat body too large", NULL);
    return;
  }
  gw_heartbeat_msg m = {
      .ts = pr_http_header_get(req, "x-fleetgate-timestamp"),
      .tsv = tsv,
      .fleet_sig = pr_http_header_get(req, "x-fleetgate-signature"),
      .key_sig = pr_http_header_get(req, "x-fleetgate-key-signature"),
      .body = req->body.data,
      .len = req->body.len,
  };
  gw_heartbeat_result res;
  gw_heartbeat_apply(gw, &m, 0, &res);
  if (res.unfit) {
    heartbeat_unfit_answer(gw, req, rid, &res);
    return;
  }
  if (res.status == 202) {
    cJSON *reply = cJSON_CreateObject();
    cJSON_AddStringToObject(reply, "id", res.id);
    cJSON_AddBoolToObject(reply, "accepted", 0);
    cJSON_AddStringToObject(reply, "enrolment", "pending");
    cJSON_AddNumberToObject(reply, "interval_s", c->heartbeat_interval_s);
    char *s = cJSON_PrintUnformatted(reply);
    cJSON_Delete(reply);
    pr_http_respond(req, 202, NULL, "application/json", s ? s : "{}", s ? strlen(s) : 2);
    free(s);
    return;
  }
  if (res.status) {
    /* what an operator should see: a phone of the fleet (it signed with the fleet secret
     * or its pinned key) that could not register, and why */
    static const char *const listed[] = {"url_not_allowed", "key_mismatch", "id_reserved",
                                         "registry_full", "enrolment_rate", NULL};
    for (size_t i = 0; res.code && listed[i]; i++)
      if (res.member && strcmp(res.code, listed[i]) == 0) note_refused(gw, req, &res);
    char why[700];
    snprintf(why, sizeof(why), "%s%s%s", res.id, res.id[0] ? ": " : "", res.msg);
    refuse(req, rid, res.status, res.code, res.msg, why);
    return;
  }
  gw_replica *r = res.r;
  gw_shared_publish_heartbeat(gw, r->id, &m);
  cJSON *reply = cJSON_CreateObject();
  cJSON_AddStringToObject(reply, "id", r->id);
  cJSON_AddBoolToObject(reply, "accepted", 1);
  cJSON_AddStringToObject(reply, "enrolment", "pinned");
  cJSON_AddNumberToObject(reply, "interval_s", c->heartbeat_interval_s);
  /* a switch of models is not a drain: the agent drains for it on its own (`place`) */
  cJSON_AddBoolToObject(reply, "drain", gw_replica_has(r, GW_HELD_REMOVED | GW_HELD_DRAIN_CONF | GW_HELD_DRAIN_ADMIN));
  cJSON_AddStringToObject(reply, "state", gw_replica_display_state(r));
  gw_placement_answer(gw, r, reply); /* a switch of models asked of it (placement.h) */
  /* the token this gateway calls the phone with, unless its file gives one of its own */
  const gw_replica_conf *fconf = gw_config_replica(c, r->id);
  char token[72];
  if (!(fconf && fconf->token) && gw_heartbeat_phone_token(gw, r->id, r->ident.key, token) == 0)
    cJSON_AddStringToObject(reply, "replica_token", token);
  char *s = cJSON_PrintUnformatted(reply);
  cJSON_Delete(reply);
  OPENSSL_cleanse(token, sizeof(token));
  char h1[160];
  snprintf(h1, sizeof(h1), "x-request-id: %s", rid);
  const char *hdrs[] = {h1, NULL};
  pr_http_respond(req, 200, hdrs, "application/json", s ? s : "{}", s ? strlen(s) : 2);
  if (s) OPENSSL_cleanse(s, strlen(s));
  free(s);
  gw_plan_soon(gw);
}
