/* The admin listener and its JSON API; see admin.h. Every answer is built and sent
 * at once from the loop's own state (nothing here waits), except the event streams,
 * which events.c keeps. Secrets never leave: replica tokens are not shown, and the
 * admin token is checked by bearer.h's rule (SHA-256 digests, constant time). */
#include "capsvc.h"
#include "admin.h"

#include "feat.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "caps.h"
#include "auth.h"
#include "batch.h"
#include "bearer.h"
#include "clock.h"
#include "drains.h"
#include "cost.h"
#include "err.h"
#include "events.h"
#include "json.h"
#include "log.h"
#include "metrics.h"
#include "pins.h"
#include "privfile.h"
#include "placement.h"
#include "registry.h"
#include "session.h"
#include "shared.h"
#include "verify.h"

#define GW_ADMIN_TICK_MS 1000
#define GW_ADMIN_PING_MS 15000
#define GW_ADMIN_MAX_JSON (32u << 20)
#define GW_ADMIN_MAX_BODY (64u << 10)
#define GW_ADMIN_EVENTS_SHOWN 100
#define GW_ADMIN_SESSIONS_FILE "sessions-ended.json" /* in data_dir */
#define GW_ADMIN_SESSIONS_MAX_FILE (256u << 10)

struct gw_admin {
  gw_server *gw;
  pr_http_server *http;      /* the listener in use; NULL: no admin section */
  char *addr;                /* the address http was opened for */
  pr_http_server *next;      /* opened by gw_admin_prepare, not committed yet */
  char *next_addr;
  int prepared;              /* a prepare awaits commit or abort */
  pr_http_server **retired;  /* replaced listeners, closed once their requests are done */
  size_t n_retired;
  uv_timer_t timer;
  uint64_t last_ping_ms;
  uint64_t series_sent;      /* samples taken when the page's streams last got the series */
  gw_session_ended ended;    /* sessions signed out here, until they expire */
  char *ended_path;          /* where they are kept across restarts (data_dir); NULL: memory */
};

static void admin_handle(pr_http_req *req, void *ud);

/* ---- answers ------------------------------------------------------------------------------ */

static void respond_json(pr_http_req *req, int status, cJSON *obj, const char *extra_header) {
  char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
  cJSON_Delete(obj);
  const char *hdrs[] = {"Cache-Control: no-store", "X-Content-Type-Options: nosniff", extra_header, NULL};
  if (!s) {
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":null}}";
    pr_http_respond(req, 500, hdrs, "application/json", oom, sizeof(oom) - 1);
    return;
  }
  pr_http_respond(req, status, hdrs, "application/json", s, strlen(s));
  free(s);
}

static void admin_error(pr_http_req *req, int status, const char *code, const char *extra_header,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* An error in OpenAI's shape, as the client API answers. */
static void admin_error(pr_http_req *req, int status, const char *code, const char *extra_header,
                        const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  pr_buf body;
  pr_buf_init(&body, 16 * 1024);
  pr_oai_error_body(&body, msg,
                    status == 401   ? "authentication_error"
                    : status >= 500 ? "server_error"
                                    : "invalid_request_error",
                    NULL, code);
  const char *hdrs[] = {"Cache-Control: no-store", "X-Content-Type-Options: nosniff", extra_header, NULL};
  pr_http_respond(req, status, hdrs, "application/json", pr_buf_cstr(&body), body.len);
  pr_buf_free(&body);
}

/* ---- the token ---------------------------------------------------------------------------- */

/* 1 when the request carries "Authorization: Bearer <admin token>" (bearer.h's rule). */
static int token_ok(const gw_server *gw, const pr_http_req *req) {
  return pr_bearer_check(pr_http_header_get(req, "authorization"), gw->conf->admin_token) == 0;
}

/* 1 when the request carries a valid session cookie (a browser that logged in once and
 * has not signed out here). */
static int session_ok(const gw_server *gw, const pr_http_req *req) {
  return gw_session_valid(gw->conf->admin_token, pr_http_header_get(req, "cookie"), pr_clock_wall_ms(),
                          gw->conf->admin_session_ttl_s, &gw->admin->ended);
}

/* ---- sessions signed out, kept in data_dir ----------------------------------------------- */

/* Write the ended sessions to data_dir (0600, through a temporary file and a rename); a
 * failure is logged and leaves them in memory only. */
static void ended_save(const gw_admin *a) {
  if (!a->ended_path) return;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "floor_ms", (double)a->ended.floor_ms);
  cJSON *arr = cJSON_AddArrayToObject(o, "ended");
  for (size_t i = 0; i < a->ended.n; i++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "nonce", a->ended.v[i].nonce);
    cJSON_AddNumberToObject(e, "exp_ms", (double)a->ended.v[i].exp_ms);
    cJSON_AddItemToArray(arr, e);
  }
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  int rc = text ? pr_privfile_write(a->ended_path, text, 0) : -ENOMEM;
  if (rc < 0)
    pr_warn("cannot write %s (%s): sessions signed out hold until the gateway restarts", a->ended_path,
            strerror(-rc));
  free(text);
}

/* A time in ms since 1970 that fits an int64_t as it is (a damaged file may say 1e300). */
static int time_ms_ok(double v) { return v >= 0 && v < 1e15; }

/* The sessions signed out before a restart: those not expired yet. */
static void ended_load(gw_admin *a, const char *data_dir) {
  size_t len = strlen(data_dir) + sizeof(GW_ADMIN_SESSIONS_FILE) + 2;
  if (len > 4000 || !(a->ended_path = malloc(len))) return;
  snprintf(a->ended_path, len, "%s/%s", data_dir, GW_ADMIN_SESSIONS_FILE);
  cJSON *o;
  if (gw_datafile_load(a->ended_path, GW_ADMIN_SESSIONS_MAX_FILE, 8, &o, NULL) == 0 && !o)
    return; /* none kept yet */
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "ended");
  const cJSON *floor = cJSON_GetObjectItemCaseSensitive(o, "floor_ms");
  if (!cJSON_IsArray(arr) || !cJSON_IsNumber(floor) || !time_ms_ok(floor->valuedouble)) {
    pr_warn("%s is damaged: sessions signed out before the restart are valid again until they "
            "expire (change the admin token to end them all)", a->ended_path);
    cJSON_Delete(o);
    return;
  }
  int64_t now = pr_clock_wall_ms();
  a->ended.floor_ms = (int64_t)floor->valuedouble;
  const cJSON *it;
  cJSON_ArrayForEach(it, arr) {
    const cJSON *nonce = cJSON_GetObjectItemCaseSensitive(it, "nonce");
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(it, "exp_ms");
    if (cJSON_IsString(nonce) && cJSON_IsNumber(exp) && time_ms_ok(exp->valuedouble))
      gw_session_end(&a->ended, nonce->valuestring, (int64_t)exp->valuedouble, now);
  }
  cJSON_Delete(o);
  if (a->ended.n) pr_info("%zu admin session(s) signed out before the restart stay ended (%s)", a->ended.n,
                          a->ended_path);
}

/* A stream the page opened with the session `nonce` (and no token): ended with it. */
static int stream_of_session(const pr_http_req *req, void *ud) {
  const gw_admin *a = ud;
  char nonce[GW_SESSION_NONCE + 1];
  int64_t exp;
  return !token_ok(a->gw, req) && gw_session_id(pr_http_header_get(req, "cookie"), nonce, &exp) == 0 &&
         gw_session_is_ended(&a->ended, nonce, exp);
}

/* DELETE /admin/v1/session with a valid session: it ends on this gateway now, its open
 * streams with it, and stays ended across restarts (data_dir) until it expires. */
static void session_end(gw_server *gw, const pr_http_req *req) {
  gw_admin *a = gw->admin;
  char nonce[GW_SESSION_NONCE + 1];
  int64_t exp;
  if (!session_ok(gw, req) || gw_session_id(pr_http_header_get(req, "cookie"), nonce, &exp) < 0) return;
  if (gw_session_end(&a->ended, nonce, exp, pr_clock_wall_ms()) != 1) return;
  ended_save(a);
  gw_events_close_if(gw, stream_of_session, a);
  char peer[64];
  pr_http_peer(req, peer, sizeof(peer));
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "peer", peer);
  cJSON_AddNumberToObject(f, "ended_sessions", (double)a->ended.n);
  pr_log_kv(PR_LOG_INFO, "admin session ended", f);
}

static void deny(pr_http_req *req);

/* Answers 401 (403 for a session's write without the CSRF header) and returns 0 unless
 * the request may go on. */
static int authorize(gw_server *gw, pr_http_req *req, int write) {
  if (!write && gw->conf->admin_public_read) return 1;
  if (token_ok(gw, req)) return 1;
  if (session_ok(gw, req)) {
    /* another site can make a browser send the cookie (a form, an image), never a header
     * of ours without a CORS preflight, which this listener never grants */
    if (!write || pr_http_header_get(req, "x-fleetgate-csrf")) return 1;
    admin_error(req, 403, "csrf_header_missing", NULL,
                "a change made with a session cookie needs the header X-Fleetgate-CSRF: 1 "
                "(the status page sends it), or the admin token");
    return 0;
  }
  deny(req);
  return 0;
}

static void deny(pr_http_req *req) {
  int given = pr_http_header_get(req, "authorization") != NULL;
  admin_error(req, 401, given ? "invalid_admin_token" : "missing_admin_token",
              "WWW-Authenticate: Bearer realm=\"fleetgate admin\"",
              given ? "the admin token is not valid"
                    : "this needs the admin token: Authorization: Bearer <token>");
}

/* ---- JSON views --------------------------------------------------------------------------- */

static double round3(double v) { return round(v * 1000) / 1000; }

/* Seconds since loop time t (ms), or null when t is 0. */
static void add_ago(cJSON *o, const char *key, uint64_t now, uint64_t t) {
  if (!t) cJSON_AddNullToObject(o, key);
  else cJSON_AddNumberToObject(o, key, round3((double)(now - t) / 1000.0));
}

static void add_num_or_null(cJSON *o, const char *key, double v, int known) {
  if (known) cJSON_AddNumberToObject(o, key, round3(v));
  else cJSON_AddNullToObject(o, key);
}

/* When the gateway last heard from r: its last heartbeat, or now while it passes its
 * health checks (a replica that stops answering goes down within fall x interval),
 * or the moment it went down. */
static uint64_t last_seen(const gw_server *gw, const gw_replica *r, uint64_t now) {
  uint64_t t = r->report.last_heartbeat_ms;
  uint64_t checked = r->state == GW_REPLICA_DOWN ? r->state_since_ms : now;
  if (gw->conf->health_interval_s <= 0 && !r->ident.from_heartbeat && r->state != GW_REPLICA_DOWN)
    checked = 0; /* no checks, no heartbeats: nothing heard */
  return checked > t ? checked : t;
}

/* Whose prompts r's engine may hold (replica.h): a scope's name, "several", "unknown"
 * (from before a restart), or "none". */
static const char *cache_holder(const gw_server *gw, const gw_replica *r) {
  if (r->pc.agent == 1) return "its agent's, slot by slot";
  if (r->pc.agent) return "its agent's, the engine as a whole";
  if (r->pc.mixed == 1) return "several";
  if (r->pc.mixed) return "unknown";
  if (!r->pc.scope) return "none";
  if (r->pc.scope == GW_CACHE_SCOPE_OPEN) return "everyone";
  const gw_config *c = gw->conf;
  for (size_t i = 0; i < c->n_keys; i++)
    if (c->keys[i].scope_id == r->pc.scope)
      return c->keys[i].cache_scope ? c->keys[i].cache_scope : c->keys[i].name;
  return "a scope no longer configured";
}

static cJSON *replica_json(const gw_server *gw, const gw_replica *r, uint64_t now, uint64_t wall) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "state", gw_metrics_replica_category(r));
  cJSON_AddStringToObject(o, "health", gw_replica_state_name(r->state));
  cJSON_AddStringToObject(o, "reason", gw_replica_reason(r));
  if (r->ident.key[0]) cJSON_AddStringToObject(o, "key", r->ident.key);
  cJSON_AddNumberToObject(o, "state_since_ms", (double)(wall - (now - r->state_since_ms)));
  cJSON_AddNumberToObject(o, "state_for_s", round3((double)(now - r->state_since_ms) / 1000.0));
  cJSON_AddBoolToObject(o, "draining", gw_replica_draining(r));
  cJSON *dr = cJSON_AddObjectToObject(o, "drain");
  cJSON_AddBoolToObject(dr, "admin", gw_replica_has(r, GW_HELD_DRAIN_ADMIN));
  cJSON_AddBoolToObject(dr, "config", gw_replica_has(r, GW_HELD_DRAIN_CONF));
  cJSON_AddBoolToObject(dr, "agent", gw_replica_has(r, GW_HELD_DRAIN_AGENT));
  cJSON_AddBoolToObject(dr, "removed", gw_replica_has(r, GW_HELD_REMOVED));
  cJSON_AddBoolToObject(o, "probation", gw_replica_has(r, GW_HELD_PROBATION));
  cJSON_AddBoolToObject(o, "quarantined", gw_replica_has(r, GW_HELD_QUARANTINED));
  cJSON_AddBoolToObject(o, "held_for_check", gw_replica_has(r, GW_HELD_CHECK));
  cJSON_AddStringToObject(o, "url", r->url);
  cJSON *models = cJSON_AddArrayToObject(o, "models");
  for (size_t i = 0; i < r->n_models; i++) cJSON_AddItemToArray(models, cJSON_CreateString(r->models[i]));
  cJSON_AddStringToObject(o, "source", r->ident.from_file ? "config" : r->ident.from_heartbeat ? "heartbeat" : "none");
  cJSON_AddNumberToObject(o, "slots", r->slots);
  cJSON_AddNumberToObject(o, "slots_busy", r->inflight);
  cJSON_AddNumberToObject(o, "n_ctx", (double)r->n_ctx);
  cJSON_AddNumberToObject(o, "prefill_tps", round3(r->prefill_tps));
  cJSON_AddNumberToObject(o, "decode_tps", round3(r->decode_tps));
  add_num_or_null(o, "latency_s", r->served.last_latency_s, r->served.last_latency_s > 0);
  cJSON_AddNumberToObject(o, "successes", (double)r->n_ok);
  cJSON_AddNumberToObject(o, "failures", (double)r->n_failed);
  cJSON_AddNumberToObject(o, "consecutive_failures", r->consecutive_failures);
  cJSON_AddStringToObject(o, "last_error", r->health.last_probe_error);
  /* its last health check failed, or the one in flight is late: new work goes elsewhere */
  cJSON_AddBoolToObject(o, "suspect", gw_replica_suspect(r));
  add_num_or_null(o, "probe_s", r->health.probe_srtt_ms / 1000.0, r->health.probe_srtt_ms > 0);
  /* whose prompts its engine may reuse (docs/security.md "Tenants' prompts") */
  cJSON_AddStringToObject(o, "prompt_cache", cache_holder(gw, r));
  /* who keeps the scopes apart there: its agent, or this gateway (the whole engine) */
  cJSON_AddStringToObject(o, "cache_isolation", r->pc.agent ? "agent" : "gateway");
  /* its engine's build and what it serves (proto/feat.h; null: not known yet) */
  if (r->build[0]) cJSON_AddStringToObject(o, "engine_build", r->build);
  else cJSON_AddNullToObject(o, "engine_build");
  if (r->feat_known) {
    cJSON *f = cJSON_AddObjectToObject(o, "engine_features");
    cJSON_AddNumberToObject(f, "choices", r->choices_max);
    cJSON_AddBoolToObject(f, "continue_final_message", (r->features & PR_FEAT_CONTINUE) != 0);
    cJSON_AddBoolToObject(f, "responses", (r->features & PR_FEAT_RESPONSES) != 0);
    cJSON_AddBoolToObject(f, "cache_checkpoints", (r->features & PR_FEAT_CHECKPOINTS) != 0);
  } else {
    cJSON_AddNullToObject(o, "engine_features");
  }
  cJSON_AddNumberToObject(o, "tokens_in", (double)r->served.tokens_in);
  cJSON_AddNumberToObject(o, "tokens_out", (double)r->served.tokens_out);
  add_ago(o, "last_seen_s", now, last_seen(gw, r, now));
  add_ago(o, "last_heartbeat_s", now, r->report.last_heartbeat_ms);
  add_num_or_null(o, "battery_pct", r->report.battery_pct, r->report.battery_pct >= 0);
  if (r->report.charging < 0) cJSON_AddNullToObject(o, "charging");
  else cJSON_AddBoolToObject(o, "charging", r->report.charging);
  add_num_or_null(o, "temperature_c", r->report.temperature_c, r->report.temperature_c >= 0);
  add_num_or_null(o, "mem_free_mb", r->report.mem_free_mb, r->report.mem_free_mb >= 0);
  add_num_or_null(o, "cpu_max_freq_ratio", r->report.cpu_max_freq_ratio, r->report.cpu_max_freq_ratio >= 0);
  /* what it can hold (docs/protocol.md): its memory, its models folder's free storage, the
   * model files its agent checked (null: its agent does not say) and the model it loads */
  add_num_or_null(o, "mem_total_mb", r->report.hold.mem_total_mb, r->report.hold.mem_total_mb >= 0);
  add_num_or_null(o, "storage_free_mb", r->report.hold.storage_free_mb, r->report.hold.storage_free_mb >= 0);
  if (r->report.hold.models_known) {
    cJSON *held = cJSON_AddArrayToObject(o, "held");
    for (size_t i = 0; held && i < r->report.hold.n_models; i++) {
      cJSON *h = cJSON_CreateObject();
      cJSON_AddStringToObject(h, "name", r->report.hold.models[i].name);
      cJSON_AddStringToObject(h, "sha256", r->report.hold.models[i].sha256);
      cJSON_AddItemToArray(held, h);
    }
  } else {
    cJSON_AddNullToObject(o, "held");
  }
  if (r->report.hold.loading[0]) cJSON_AddStringToObject(o, "loading", r->report.hold.loading);
  else cJSON_AddNullToObject(o, "loading");
  /* placement (placement.h): the model meant for it, a switch under way, the last failure */
  cJSON_AddBoolToObject(dr, "placement", gw_replica_has(r, GW_HELD_PLACING));
  if (r->place.want[0]) cJSON_AddStringToObject(o, "desired_model", r->place.want);
  else cJSON_AddNullToObject(o, "desired_model");
  if (r->place.switch_ms) {
    cJSON *sw = cJSON_AddObjectToObject(o, "switch");
    cJSON_AddStringToObject(sw, "from", r->place.from);
    cJSON_AddStringToObject(sw, "to", r->place.want);
    cJSON_AddStringToObject(sw, "phase", r->place.phase[0] ? r->place.phase : "asked");
    cJSON_AddNumberToObject(sw, "for_s", round3((double)(now - r->place.switch_ms) / 1000.0));
    cJSON_AddStringToObject(sw, "reason", r->place.reason);
  } else {
    cJSON_AddNullToObject(o, "switch");
  }
  if (r->place.failed[0]) cJSON_AddStringToObject(o, "switch_failed", r->place.failed);
  else cJSON_AddNullToObject(o, "switch_failed");
  /* what the readings do to its work (device.h): why, its slot limit, its slowdown now */
  if (r->dev.held_back[0]) cJSON_AddStringToObject(o, "held_back", r->dev.held_back);
  else cJSON_AddNullToObject(o, "held_back");
  add_num_or_null(o, "device_slots", r->dev.cap, r->dev.cap >= 0);
  cJSON_AddNumberToObject(o, "device_slowdown", round3(gw_replica_device_slowdown(r)));
  /* the whole stretch plans put on its rates now (predict.h), and when a slot frees */
  cJSON_AddNumberToObject(o, "slowdown", round3(gw_predict_slowdown(r, now)));
  uint64_t wait = gw_replica_wait_ms(r, now);
  add_num_or_null(o, "slot_free_s", (double)wait / 1000.0, wait != UINT64_MAX);
  cJSON_AddNumberToObject(o, "cost_per_day", r->cost_per_day);
  /* where the price comes from: the replica's file, its phone's heartbeats, or nowhere */
  cJSON_AddStringToObject(o, "cost_source", r->cost_conf >= 0 ? "config" : r->cost_claim >= 0 ? "phone" : "none");
  if (r->report.version[0]) cJSON_AddStringToObject(o, "version", r->report.version);
  cJSON *labels = r->labels ? cJSON_Parse(r->labels) : NULL;
  cJSON_AddItemToObject(o, "labels", labels ? labels : cJSON_CreateObject());
  return o;
}

static cJSON *replicas_json(const gw_server *gw) {
  uint64_t now = uv_now(gw->loop), wall = (uint64_t)pr_clock_wall_ms();
  cJSON *arr = cJSON_CreateArray();
  for (size_t i = 0; arr && i < gw->n_replicas; i++)
    cJSON_AddItemToArray(arr, replica_json(gw, gw->replicas[i], now, wall));
  return arr;
}

static cJSON *summary_json(const gw_server *gw) {
  uint64_t now = uv_now(gw->loop);
  gw_fleet_counts fc;
  gw_metrics_fleet_counts(gw, &fc);
  double req_s, tok_s, err;
  gw_metrics_rates(gw, now, &req_s, &tok_s, &err);
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddStringToObject(o, "version", FLEETGATE_VERSION);
  cJSON_AddNumberToObject(o, "time_ms", (double)(uint64_t)pr_clock_wall_ms());
  cJSON_AddBoolToObject(o, "shutting_down", gw->shutting_down);
  cJSON *c = cJSON_AddObjectToObject(o, "replicas");
  cJSON_AddNumberToObject(c, "ready", (double)fc.ready);
  cJSON_AddNumberToObject(c, "busy", (double)fc.busy);
  cJSON_AddNumberToObject(c, "loading", (double)fc.loading);
  cJSON_AddNumberToObject(c, "down", (double)fc.down);
  cJSON_AddNumberToObject(c, "draining", (double)fc.draining);
  cJSON_AddNumberToObject(c, "total", (double)fc.total);
  cJSON *s = cJSON_AddObjectToObject(o, "slots");
  cJSON_AddNumberToObject(s, "total", fc.slots_total);
  cJSON_AddNumberToObject(s, "busy", fc.slots_busy);
  cJSON_AddNumberToObject(o, "requests_per_s", round3(req_s));
  cJSON_AddNumberToObject(o, "tokens_per_s", round3(tok_s));
  cJSON_AddNumberToObject(o, "error_rate", round3(err));
  cJSON_AddNumberToObject(o, "cost_per_day", round3(fc.cost_per_day));
  cJSON_AddNumberToObject(o, "requests_active", (double)gw->jobs_alive);
  return o;
}

/* Each API key (or `anonymous`, the one caller of a gateway without keys): its limits,
 * what it asked and was refused, and its Batch API use against its quotas. */
static cJSON *keys_json(gw_server *gw) {
  cJSON *o = cJSON_CreateObject();
  cJSON *data = cJSON_AddArrayToObject(o, "keys");
  const gw_config *c = gw->conf;
  for (size_t i = 0; i < (c->n_keys ? c->n_keys : 1); i++) {
    const gw_key_conf *k = c->n_keys ? &c->keys[i] : NULL;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "key", k ? k->name : "anonymous");
    if (k) {
      cJSON *lim = cJSON_AddObjectToObject(j, "limits");
      cJSON_AddNumberToObject(lim, "rpm", k->rpm);
      cJSON_AddNumberToObject(lim, "tpm", k->tpm);
      cJSON_AddNumberToObject(lim, "concurrency", k->concurrency);
      cJSON_AddStringToObject(lim, "priority", k->priority ? "batch" : "interactive");
      cJSON_AddNumberToObject(lim, "weight", k->weight);
      if (k->n_models) {
        cJSON *m = cJSON_AddArrayToObject(lim, "models");
        for (size_t n = 0; n < k->n_models; n++) cJSON_AddItemToArray(m, cJSON_CreateString(k->models[n]));
      } else {
        cJSON_AddNullToObject(lim, "models");
      }
      const gw_caller *cl = gw_auth_caller(gw, k->name);
      cJSON_AddNumberToObject(j, "requests", cl ? (double)cl->n_requests : 0);
      cJSON_AddNumberToObject(j, "limited", cl ? (double)cl->n_limited : 0);
      cJSON_AddNumberToObject(j, "in_flight", cl ? (double)cl->inflight : 0);
    }
    cJSON *b = gw_batches_key_json(gw, k ? k->name : "");
    if (b) cJSON_AddItemToObject(j, "batch", b);
    else cJSON_AddNullToObject(j, "batch");
    cJSON_AddItemToArray(data, j);
  }
  return o;
}

/* The page's snapshot; `full` adds the last hour's series and the recent events. */
static cJSON *status_json(const gw_server *gw, int full) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddItemToObject(o, "summary", summary_json(gw));
  cJSON_AddItemToObject(o, "queue", gw_metrics_queue_json(gw));
  cJSON_AddItemToObject(o, "replicas", replicas_json(gw));
  cJSON_AddItemToObject(o, "refused_registrations", gw_registry_refused_json(gw));
  cJSON *en = cJSON_AddObjectToObject(o, "enrolments");
  cJSON_AddNumberToObject(en, "pinned", gw->pins ? (double)gw_pins_count(gw->pins, GW_PIN_PINNED) : 0);
  cJSON_AddNumberToObject(en, "pending", gw->pins ? (double)gw_pins_count(gw->pins, GW_PIN_PENDING) : 0);
  cJSON_AddStringToObject(en, "mode", gw->conf->fleet_enrol_approve ? "approve" : "open");
  cJSON_AddItemToObject(o, "batches", gw_batches_admin_list((gw_server *)gw));
  cJSON *keys = keys_json((gw_server *)gw);
  cJSON_AddItemToObject(o, "keys", cJSON_DetachItemFromObject(keys, "keys"));
  cJSON_Delete(keys);
  cJSON_AddItemToObject(o, "costs", gw_cost_json((gw_server *)gw, 1));
  cJSON_AddItemToObject(o, "verification", gw_verify_json((gw_server *)gw));
  cJSON_AddItemToObject(o, "capacity", gw_capsvc_summary((gw_server *)gw));
  if (full) {
    cJSON_AddItemToObject(o, "series", gw_metrics_series_json(gw));
    cJSON_AddItemToObject(o, "events", gw_events_json(gw, 0, GW_ADMIN_EVENTS_SHOWN));
  }
  return o;
}

/* ---- endpoints ---------------------------------------------------------------------------- */

static int wants_stream(const pr_http_req *req) {
  const char *a = pr_http_header_get(req, "accept");
  return a && strstr(a, "text/event-stream") != NULL;
}

static uint64_t last_event_id(const pr_http_req *req) {
  const char *v = pr_http_header_get(req, "last-event-id");
  if (!v) {
    /* ?after=N, for clients that cannot set headers */
    const char *q = strstr(req->query, "after=");
    if (q && (q == req->query || q[-1] == '&')) v = q + 6;
  }
  return v ? strtoull(v, NULL, 10) : 0;
}

static void handle_status(gw_server *gw, pr_http_req *req) {
  if (!wants_stream(req)) {
    respond_json(req, 200, status_json(gw, 1), NULL);
    return;
  }
  /* the first message is the whole picture; from then on snapshots and events */
  cJSON *full = status_json(gw, 1);
  char *s = full ? cJSON_PrintUnformatted(full) : NULL;
  cJSON_Delete(full);
  int rc = s ? gw_events_subscribe(gw, req, GW_SUB_STATUS, 0, "hello", s) : -ENOMEM;
  free(s);
  if (rc == PR_EBUSY)
    admin_error(req, 503, "too_many_streams", "Retry-After: 10", "too many event streams are open");
  else if (rc == -ENOMEM)
    admin_error(req, 500, NULL, NULL, "out of memory");
}

static void handle_events(gw_server *gw, pr_http_req *req) {
  uint64_t after = last_event_id(req);
  if (!wants_stream(req)) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "events", gw_events_json(gw, after, GW_EVENTS_KEEP));
    respond_json(req, 200, o, NULL);
    return;
  }
  int rc = gw_events_subscribe(gw, req, GW_SUB_EVENTS, after, NULL, NULL);
  if (rc == PR_EBUSY)
    admin_error(req, 503, "too_many_streams", "Retry-After: 10", "too many event streams are open");
}

/* The Batch API's series (batch.c counts; metrics.c sits below the jobs it reports on,
 * and the batches sit above them). */
static int batch_metrics(gw_server *gw, pr_buf *out) {
  gw_batch_stats b;
  gw_batches_stats(gw, &b);
  pr_buf_text(out, "# HELP fleetgate_batch_lines_total Batch lines ended since start, by how: "
                   "completed (output file), failed (error file), expired (the window ended).\n"
                   "# TYPE fleetgate_batch_lines_total counter\n"
                   "fleetgate_batch_lines_total{state=\"completed\"} %" PRIu64 "\n"
                   "fleetgate_batch_lines_total{state=\"failed\"} %" PRIu64 "\n"
                   "fleetgate_batch_lines_total{state=\"expired\"} %" PRIu64 "\n",
              b.lines_completed, b.lines_failed, b.lines_expired);
  pr_buf_text(out, "# HELP fleetgate_batches_running Batches in progress on this gateway.\n"
                   "# TYPE fleetgate_batches_running gauge\n"
                   "fleetgate_batches_running %zu\n"
                   "# HELP fleetgate_batch_lines_waiting Lines of batches not ended that are not "
                   "queued or on a phone: not started yet, or waiting to be tried again.\n"
                   "# TYPE fleetgate_batch_lines_waiting gauge\n"
                   "fleetgate_batch_lines_waiting %zu\n"
                   "# HELP fleetgate_batch_lines_in_flight Lines of running batches queued or on "
                   "a phone now.\n"
                   "# TYPE fleetgate_batch_lines_in_flight gauge\n"
                   "fleetgate_batch_lines_in_flight %zu\n"
                   "# HELP fleetgate_batches_queued Batches not ended waiting for a run slot "
                   "(batch.max_running).\n"
                   "# TYPE fleetgate_batches_queued gauge\n"
                   "fleetgate_batches_queued %zu\n",
              b.running, b.lines_waiting, b.lines_in_flight, b.queued);
  return out->cut ? PR_ETOOLARGE : 0;
}

static void handle_metrics(gw_server *gw, pr_http_req *req) {
  pr_buf out;
  pr_buf_init(&out, GW_ADMIN_MAX_JSON);
  int rc = gw_metrics_render(gw, &out);
  if (!rc) rc = batch_metrics(gw, &out);
  if (!rc) rc = gw_cost_render(gw, &out);
  if (!rc) rc = gw_capsvc_render(gw, &out);
  if (rc) {
    pr_buf_free(&out);
    admin_error(req, 500, "metrics_too_large", NULL, "the metrics do not fit in %u bytes", GW_ADMIN_MAX_JSON);
    return;
  }
  const char *hdrs[] = {"Cache-Control: no-store", NULL};
  pr_http_respond(req, 200, hdrs, "text/plain; version=0.0.4; charset=utf-8", pr_buf_cstr(&out), out.len);
  pr_buf_free(&out);
}

/* Drain or enable through the API: kept across reloads (drain_admin) until changed. */
static void handle_drain(gw_server *gw, pr_http_req *req, gw_replica *r, int drain) {
  uint64_t now = uv_now(gw->loop);
  const char *old = gw_metrics_replica_category(r);
  int was = gw_replica_has(r, GW_HELD_DRAIN_ADMIN);
  gw_replica_held_set(r, GW_HELD_DRAIN_ADMIN, drain);
  if (was != drain) gw_drains_set(gw, r->id, drain); /* kept across restarts (data_dir) */
  /* every gateway drains it */
  if (was != drain) gw_fleet_publish(gw, &(gw_fleet_event){.kind = GW_FLEET_DRAIN, .r = r});
  const char *cur = gw_metrics_replica_category(r);
  char peer[64];
  pr_http_peer(req, peer, sizeof(peer));
  if (was != drain) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "event", drain ? "replica_drained" : "replica_enabled");
    cJSON_AddStringToObject(f, "replica", r->id);
    cJSON_AddStringToObject(f, "peer", peer);
    cJSON_AddStringToObject(f, "state", cur);
    pr_log_kv(PR_LOG_INFO, drain ? "replica drained through the admin API" : "replica enabled through the admin API", f);
    char msg[512];
    if (drain)
      snprintf(msg, sizeof(msg), "%s drained by an admin: no new work (was %s)", r->id, old);
    else if (!gw_replica_has(r, GW_HELD_REMOVED | GW_HELD_DRAIN_CONF) && gw_replica_has(r, GW_HELD_DRAIN_AGENT))
      /* the agent drains because this gateway told it to: the next heartbeat's answer
       * tells it to stop, and then it takes work */
      snprintf(msg, sizeof(msg),
               "%s enabled by an admin: takes work again once its agent has heard it (the answer to "
               "its next heartbeat tells it; the heartbeat after shows it)", r->id);
    else if (gw_replica_draining(r))
      snprintf(msg, sizeof(msg), "%s enabled by an admin, but still draining (%s)", r->id,
               gw_replica_has(r, GW_HELD_REMOVED) ? "removed from the configuration" : "\"drain\": true in its configuration");
    else
      snprintf(msg, sizeof(msg), "%s enabled by an admin: takes work again (%s)", r->id, cur);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "replica", r->id);
    cJSON_AddStringToObject(e, "from", old);
    cJSON_AddStringToObject(e, "to", cur);
    cJSON_AddStringToObject(e, "source", "admin");
    gw_events_add(gw, drain ? "replica_drained" : "replica_enabled", msg, e);
    gw_plan_soon(gw);
  }
  respond_json(req, 200, replica_json(gw, r, now, (uint64_t)pr_clock_wall_ms()), NULL);
}

/* POST /admin/v1/capacity/what-if: the advice for a planned batch or changed targets. */
static void handle_what_if(gw_server *gw, pr_http_req *req) {
  pr_buf err;
  pr_buf_init(&err, 16 * 1024);
  int status = 400;
  cJSON *o = gw_capsvc_what_if(gw, pr_buf_cstr(&req->body), req->body.len, &status, &err);
  if (o) {
    respond_json(req, 200, o, NULL);
  } else {
    const char *hdrs[] = {"Cache-Control: no-store", "X-Content-Type-Options: nosniff", NULL};
    pr_http_respond(req, status, hdrs, "application/json", pr_buf_cstr(&err), err.len);
  }
  pr_buf_free(&err);
}

static void handle_reload(gw_server *gw, pr_http_req *req) {
  pr_buf errors;
  pr_buf_init(&errors, PR_CAP_REPORT);
  cJSON *changes = cJSON_CreateObject();
  int rc = gw->reload(gw, "admin API", &errors, changes);
  if (rc == 0) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "reloaded", 1);
    static const char *const keys[] = {"added", "removed", "changed"};
    for (size_t i = 0; i < 3; i++)
      if (!cJSON_GetObjectItemCaseSensitive(changes, keys[i])) cJSON_AddArrayToObject(changes, keys[i]);
    cJSON_AddItemToObject(o, "changes", changes);
    respond_json(req, 200, o, NULL);
    pr_buf_free(&errors);
    return;
  }
  cJSON_Delete(changes);
  const char *msg = gw->shutting_down ? "the gateway is shutting down"
                                      : "configuration reload refused; the running configuration is unchanged";
  pr_buf body;
  pr_buf_init(&body, 2 << 20);
  pr_oai_error_body(&body, msg, "invalid_request_error", NULL, gw->shutting_down ? "shutting_down" : "reload_refused");
  cJSON *o = cJSON_Parse(pr_buf_cstr(&body));
  pr_buf_free(&body);
  if (!o) o = cJSON_CreateObject();
  cJSON_AddBoolToObject(o, "reloaded", 0);
  cJSON *arr = cJSON_AddArrayToObject(o, "errors");
  const char *p = pr_buf_cstr(&errors);
  while (*p) {
    size_t n = strcspn(p, "\n");
    char *line = strndup(p, n);
    if (line && *line) cJSON_AddItemToArray(arr, cJSON_CreateString(line));
    free(line);
    p += n;
    if (*p) p++;
  }
  pr_buf_free(&errors);
  respond_json(req, gw->shutting_down ? 503 : 422, o, NULL);
}

/* Decode %XX in a path segment of n bytes into out (size cap); 0, or -1 when bad. */
static int path_segment(const char *s, size_t n, char *out, size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    if (ch == '%') {
      if (i + 2 >= n) return -1;
      if (!isxdigit((unsigned char)s[i + 1]) || !isxdigit((unsigned char)s[i + 2])) return -1;
      char hex[3] = {s[i + 1], s[i + 2], 0};
      ch = (char)strtol(hex, NULL, 16);
      i += 2;
    }
    if (ch == '\0' || k + 1 >= cap) return -1;
    out[k++] = ch;
  }
  out[k] = '\0';
  return k ? 0 : -1;
}

static void method_not_allowed(pr_http_req *req, const char *allow) {
  char h[64];
  snprintf(h, sizeof(h), "Allow: %s", allow);
  admin_error(req, 405, "method_not_allowed", h, "%s %s: use %s", req->method, req->path, allow);
}

/* POST /admin/v1/session: the admin token, once, buys a browser a session cookie (the
 * token only: a session cannot renew itself). GET says whether this browser has one;
 * DELETE ends it there. The cookie's Path is /admin/v1/: the page's reads and actions,
 * nothing else. */
static void handle_session(gw_server *gw, pr_http_req *req, int is_get, int is_post) {
  int is_delete = strcmp(req->method, "DELETE") == 0;
  if (!is_get && !is_post && !is_delete) return method_not_allowed(req, "GET, POST, DELETE");
  if (is_get) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "session", session_ok(gw, req));
    cJSON_AddBoolToObject(o, "read_needs_token", !gw->conf->admin_public_read);
    cJSON_AddBoolToObject(o, "sessions", gw->conf->admin_session_ttl_s > 0);
    respond_json(req, 200, o, NULL);
    return;
  }
  /* Secure when the browser reached us over TLS: ours, or a proxy's that says so (a
   * client that claims it only keeps its own cookie off plain HTTP) */
  const char *fwd = pr_http_header_get(req, "x-forwarded-proto");
  const char *secure = req->server->tls || (fwd && strcasecmp(fwd, "https") == 0) ? "; Secure" : "";
  char hdr[GW_SESSION_MAX + 160];
  if (is_delete) {
    session_end(gw, req);
    snprintf(hdr, sizeof(hdr), "Set-Cookie: %s=; Path=/admin/v1/; Max-Age=0; HttpOnly; SameSite=Strict%s",
             GW_SESSION_COOKIE, secure);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "session", 0);
    respond_json(req, 200, o, hdr);
    return;
  }
  if (!token_ok(gw, req)) return deny(req);
  double ttl = gw->conf->admin_session_ttl_s;
  if (ttl <= 0) {
    admin_error(req, 404, "sessions_disabled", NULL,
                "admin.session_ttl_s is 0: send the admin token with every request");
    return;
  }
  char v[GW_SESSION_MAX];
  int64_t now = pr_clock_wall_ms();
  if (gw_session_make(gw->conf->admin_token, now, ttl, v, sizeof(v))) {
    admin_error(req, 500, "internal_error", NULL, "cannot make a session");
    return;
  }
  snprintf(hdr, sizeof(hdr), "Set-Cookie: %s=%s; Path=/admin/v1/; Max-Age=%lld; HttpOnly; SameSite=Strict%s",
           GW_SESSION_COOKIE, v, (long long)ttl, secure);
  char peer[64];
  pr_http_peer(req, peer, sizeof(peer));
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "peer", peer);
  cJSON_AddNumberToObject(f, "ttl_s", ttl);
  pr_log_kv(PR_LOG_INFO, "admin session opened", f);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddBoolToObject(o, "session", 1);
  cJSON_AddNumberToObject(o, "expires_ms", (double)(now + (int64_t)(ttl * 1000)));
  respond_json(req, 200, o, hdr);
}

/* "{id}[/action]" after a route's prefix: the id decoded into id, *action what follows the
 * slash (NULL: none). Answers 400 with what is expected and returns -1 when the id is bad. */
static int route_id(pr_http_req *req, const char *rest, char *id, size_t n, const char **action,
                    const char *expected) {
  const char *slash = strchr(rest, '/');
  size_t idlen = slash ? (size_t)(slash - rest) : strlen(rest);
  *action = slash ? slash + 1 : NULL;
  if (path_segment(rest, idlen, id, n) < 0) {
    admin_error(req, 400, "invalid_replica_id", NULL, "%s", expected);
    return -1;
  }
  return 0;
}

/* /admin/v1/replicas/{id}[/drain|/enable] */
static void route_replica(gw_server *gw, pr_http_req *req, const char *rest, int is_get, int is_post) {
  const char *action;
  char id[256];
  if (route_id(req, rest, id, sizeof(id), &action, "a replica id is expected after /admin/v1/replicas/") < 0) return;
  int drain = action && strcmp(action, "drain") == 0;
  int enable = action && strcmp(action, "enable") == 0;
  if (action && !drain && !enable) {
    admin_error(req, 404, "unknown_url", NULL, "unknown admin URL: %s %s", req->method, req->path);
    return;
  }
  if (action ? !is_post : !is_get) {
    method_not_allowed(req, action ? "POST" : "GET");
    return;
  }
  if (!authorize(gw, req, action != NULL)) return;
  gw_replica *r = gw_registry_find(gw, id);
  if (!r) {
    admin_error(req, 404, "replica_not_found", NULL, "no replica with id \"%s\"", id);
    return;
  }
  if (!action) respond_json(req, 200, replica_json(gw, r, uv_now(gw->loop), (uint64_t)pr_clock_wall_ms()), NULL);
  else handle_drain(gw, req, r, drain);
}

/* ---- placements (placement.h) ---- */

/* POST /admin/v1/placements/pin {"replica", "model" (null: unpin)} and
 * POST /admin/v1/placements/exclude {"model", "exclude"}. */
static void handle_placement_action(gw_server *gw, pr_http_req *req, int pin) {
  pr_json_err je;
  cJSON *o = req->body.len ? pr_json_parse(req->body.data, req->body.len, 4, &je) : NULL;
  const char *id = NULL, *model = NULL;
  int exclude = 0, rc = -1;
  const cJSON *mv = o ? cJSON_GetObjectItemCaseSensitive(o, "model") : NULL;
  if (o && cJSON_IsObject(o)) {
    static const char *const pin_keys[] = {"replica", "model", NULL};
    static const char *const ex_keys[] = {"model", "exclude", NULL};
    rc = pr_json_check_keys(o, pin ? pin_keys : ex_keys, "", &je);
    if (!rc && pin) rc = pr_json_get_str(o, "replica", 1, &id, "", &je);
    if (rc >= 0 && pin && !cJSON_IsNull(mv)) rc = pr_json_get_str(o, "model", 1, &model, "", &je);
    if (rc >= 0 && !pin) rc = pr_json_get_str(o, "model", 1, &model, "", &je);
    if (rc >= 0 && !pin) rc = pr_json_get_bool(o, "exclude", 1, &exclude, "", &je);
  }
  if (rc < 0) {
    cJSON_Delete(o);
    admin_error(req, 400, "invalid_request", NULL,
                pin ? "expected {\"replica\": ID, \"model\": NAME or null}"
                    : "expected {\"model\": NAME, \"exclude\": true or false}");
    return;
  }
  char why[300] = "";
  int r = pin ? gw_placement_pin(gw, id, model, why, sizeof(why))
              : gw_placement_exclude(gw, model, exclude, why, sizeof(why));
  cJSON_Delete(o);
  if (r == -ENOENT) {
    admin_error(req, 404, pin ? "replica_not_found" : "model_not_found", NULL, "%s", why);
    return;
  }
  if (r < 0) {
    admin_error(req, 400, "invalid_request", NULL, "%s", why);
    return;
  }
  respond_json(req, 200, gw_placement_json(gw), NULL);
}

/* ---- enrolments: the phones' key pins (pins.h) ---- */

static cJSON *pin_json(gw_server *gw, const gw_pin *p) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", p->id);
  cJSON_AddStringToObject(o, "key", p->key);
  cJSON_AddStringToObject(o, "url", p->url);
  cJSON_AddStringToObject(o, "state", p->state == GW_PIN_PENDING ? "pending" : "pinned");
  cJSON_AddNumberToObject(o, "enrolled_ms", (double)p->enrolled_ms);
  cJSON_AddNumberToObject(o, "seen_ms", (double)p->seen_ms);
  cJSON_AddBoolToObject(o, "in_registry", gw_registry_find(gw, p->id) != NULL);
  return o;
}

static void handle_enrolments(gw_server *gw, pr_http_req *req) {
  cJSON *o = cJSON_CreateObject();
  cJSON *arr = cJSON_AddArrayToObject(o, "enrolments");
  for (size_t i = 0; gw->pins && i < gw_pins_total(gw->pins); i++)
    cJSON_AddItemToArray(arr, pin_json(gw, gw_pins_at(gw->pins, i)));
  cJSON_AddNumberToObject(o, "pinned", gw->pins ? (double)gw_pins_count(gw->pins, GW_PIN_PINNED) : 0);
  cJSON_AddNumberToObject(o, "pending", gw->pins ? (double)gw_pins_count(gw->pins, GW_PIN_PENDING) : 0);
  cJSON_AddStringToObject(o, "mode", gw->conf->fleet_enrol_approve ? "approve" : "open");
  respond_json(req, 200, o, NULL);
}

/* /admin/v1/enrolments/{id}: GET one, DELETE releases it; /approve pins a pending one. */
static void route_enrolment(gw_server *gw, pr_http_req *req, const char *rest, int is_get, int is_post) {
  const char *action;
  char id[256];
  if (route_id(req, rest, id, sizeof(id), &action, "a phone id is expected after /admin/v1/enrolments/") < 0) return;
  int approve = action && strcmp(action, "approve") == 0;
  int del = strcmp(req->method, "DELETE") == 0;
  if (action && !approve) {
    admin_error(req, 404, "unknown_url", NULL, "unknown admin URL: %s %s", req->method, req->path);
    return;
  }
  if (approve ? !is_post : !(is_get || del)) {
    method_not_allowed(req, approve ? "POST" : "GET, DELETE");
    return;
  }
  if (!authorize(gw, req, approve || del)) return;
  gw_pin *pin = gw->pins ? gw_pins_find(gw->pins, id) : NULL;
  if (!pin) {
    admin_error(req, 404, "enrolment_not_found", NULL, "no phone enrolled or pending as \"%s\"", id);
    return;
  }
  if (is_get && !del) {
    respond_json(req, 200, pin_json(gw, pin), NULL);
    return;
  }
  int rc = approve ? gw_pins_approve(gw->pins, id) : gw_pins_remove(gw->pins, id);
  if (rc < 0) {
    admin_error(req, 500, "internal_error", NULL, "cannot change the pins file: %s", pr_strerror(rc));
    return;
  }
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", approve ? "enrolment_approved" : "enrolment_released");
  cJSON_AddStringToObject(f, "replica", id);
  pr_log_kv(PR_LOG_INFO, approve ? "enrolment approved" : "enrolment released", f);
  /* a released phone speaks for nobody until it enrols again: its heartbeat-only replica
   * drains and leaves the registry */
  gw_replica *r = del ? gw_registry_find(gw, id) : NULL;
  if (r && !r->ident.from_file) {
    const char *old = gw_replica_display_state(r);
    gw_replica_held_set(r, GW_HELD_REMOVED, 1);
    gw_registry_event(gw, r, old);
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", id);
  cJSON_AddStringToObject(o, "state", approve ? "pinned" : "released");
  respond_json(req, 200, o, NULL);
}

/* /admin/v1/quarantine/{id}: GET its record and evidence; /answers: what it answered since
 * its last passed check; POST /release: an operator's decision lets it work again. */
static void route_quarantine(gw_server *gw, pr_http_req *req, const char *rest, int is_get, int is_post) {
  const char *action;
  char id[256];
  if (route_id(req, rest, id, sizeof(id), &action, "a phone id is expected after /admin/v1/quarantine/") < 0) return;
  int release = action && strcmp(action, "release") == 0;
  int answers = action && strcmp(action, "answers") == 0;
  if (action && !release && !answers) {
    admin_error(req, 404, "unknown_url", NULL, "unknown admin URL: %s %s", req->method, req->path);
    return;
  }
  if (release ? !is_post : !is_get) {
    method_not_allowed(req, release ? "POST" : "GET");
    return;
  }
  if (!authorize(gw, req, release)) return;
  if (release) {
    char peer[64];
    pr_http_peer(req, peer, sizeof(peer));
    if (gw_verify_release(gw, id, peer) < 0) {
      admin_error(req, 409, "not_quarantined", NULL, "the phone \"%s\" is not quarantined", id);
      return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "state", "released");
    respond_json(req, 200, o, NULL);
    return;
  }
  cJSON *o = answers ? gw_verify_answers_json(gw, id) : gw_verify_phone_json(gw, id);
  if (!o) {
    if (answers)
      admin_error(req, 404, "not_quarantined", NULL, "the phone \"%s\" is not quarantined", id);
    else
      admin_error(req, 404, "replica_not_found", NULL, "no answers of a phone \"%s\" were verified", id);
    return;
  }
  respond_json(req, 200, o, NULL);
}

/* /admin/v1/batches/{id}/cancel: any key's batch. */
static void route_batch(gw_server *gw, pr_http_req *req, const char *rest, int is_post) {
  const char *slash = strchr(rest, '/');
  if (!slash || strcmp(slash, "/cancel") != 0 || slash == rest || slash - rest > 64) {
    admin_error(req, 404, "unknown_url", NULL, "unknown admin URL: %s %s", req->method, req->path);
    return;
  }
  if (!is_post) {
    method_not_allowed(req, "POST");
    return;
  }
  if (!authorize(gw, req, 1)) return;
  char id[80];
  snprintf(id, sizeof(id), "%.*s", (int)(slash - rest), rest);
  cJSON *o = NULL;
  int rc = gw_batches_admin_cancel(gw, id, &o);
  if (rc == PR_EUNKNOWN) {
    admin_error(req, 404, "batch_not_found", NULL, "no batch \"%s\"", id);
  } else if (rc == PR_ERANGE) {
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "status");
    admin_error(req, 409, "batch_not_cancellable", NULL, "the batch %s is %s: it cannot be cancelled",
                id, cJSON_IsString(st) ? st->valuestring : "ended");
    cJSON_Delete(o);
  } else if (rc || !o) {
    cJSON_Delete(o);
    admin_error(req, 500, "internal_error", NULL, "cannot cancel the batch: %s", pr_strerror(rc));
  } else {
    char peer[64];
    pr_http_peer(req, peer, sizeof(peer));
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "batch", id);
    cJSON_AddStringToObject(f, "peer", peer);
    pr_log_kv(PR_LOG_INFO, "batch cancelled by an admin", f);
    respond_json(req, 200, o, NULL);
  }
}

/* At headers-complete, before any body byte is read or 100 Continue is sent: the API
 * (`/metrics`, `/admin/v1/...`) without the token it needs gets its 401 now and the
 * connection closes, the body unread. A GET or HEAD is a read, anything else a write;
 * the page and /healthz need no token. */
static void admin_head(pr_http_req *req, void *ud) {
  gw_server *gw = ud;
  const char *p = req->path;
  /* Only the API's POSTs keep a (small) body, once their token is checked: they act on
   * their URL alone, but a client that sends them `{}` is served as before. Any other
   * body gets 413 from its Content-Length (at its first byte when chunked), so that no
   * request without the token holds buffered body bytes. */
  req->max_body = 0;
  if (strcmp(p, "/metrics") != 0 && strncmp(p, "/admin/v1/", 10) != 0) return;
  if (strcmp(p, "/admin/v1/session") == 0) {
    /* a login needs the token itself; anyone may ask or drop a cookie (GET, DELETE) */
    if (strcmp(req->method, "POST") != 0) return;
    if (token_ok(gw, req)) req->max_body = GW_ADMIN_MAX_BODY;
    else deny(req);
    return;
  }
  int is_get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
  if (authorize(gw, req, !is_get) && strcmp(req->method, "POST") == 0)
    req->max_body = GW_ADMIN_MAX_BODY;
}

static void admin_handle(pr_http_req *req, void *ud) {
  gw_server *gw = ud;
  const char *p = req->path;
  int is_get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
  int is_post = strcmp(req->method, "POST") == 0;
  if (strcmp(p, "/healthz") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", gw->shutting_down ? "shutting_down" : "ok");
    /* the status page asks before it reads, so it never shows a 401 in the console */
    cJSON_AddBoolToObject(o, "read_needs_token", !gw->conf->admin_public_read);
    respond_json(req, gw->shutting_down ? 503 : 200, o, NULL);
  } else if (strcmp(p, "/") == 0 || strcmp(p, "/index.html") == 0) {
    /* the page holds no data: it asks for the token and then reads the API */
    if (!is_get) return method_not_allowed(req, "GET");
    gw_statuspage_serve(req);
  } else if (strcmp(p, "/metrics") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) handle_metrics(gw, req);
  } else if (strcmp(p, "/admin/v1/status") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) handle_status(gw, req);
  } else if (strcmp(p, "/admin/v1/replicas") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (!authorize(gw, req, 0)) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "replicas", replicas_json(gw));
    cJSON_AddItemToObject(o, "summary", summary_json(gw));
    respond_json(req, 200, o, NULL);
  } else if (strncmp(p, "/admin/v1/replicas/", 19) == 0) {
    route_replica(gw, req, p + 19, is_get, is_post);
  } else if (strcmp(p, "/admin/v1/placements") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) respond_json(req, 200, gw_placement_json(gw), NULL);
  } else if (strcmp(p, "/admin/v1/placements/pin") == 0 ||
             strcmp(p, "/admin/v1/placements/exclude") == 0) {
    if (!is_post) return method_not_allowed(req, "POST");
    if (authorize(gw, req, 1)) handle_placement_action(gw, req, p[21] == 'p');
  } else if (strcmp(p, "/admin/v1/enrolments") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) handle_enrolments(gw, req);
  } else if (strncmp(p, "/admin/v1/enrolments/", 21) == 0) {
    route_enrolment(gw, req, p + 21, is_get, is_post);
  } else if (strcmp(p, "/admin/v1/batches") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) respond_json(req, 200, gw_batches_admin_list(gw), NULL);
  } else if (strncmp(p, "/admin/v1/batches/", 18) == 0) {
    route_batch(gw, req, p + 18, is_post);
  } else if (strcmp(p, "/admin/v1/quarantine") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) respond_json(req, 200, gw_verify_json(gw), NULL);
  } else if (strncmp(p, "/admin/v1/quarantine/", 21) == 0) {
    route_quarantine(gw, req, p + 21, is_get, is_post);
  } else if (strcmp(p, "/admin/v1/keys") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) respond_json(req, 200, keys_json(gw), NULL);
  } else if (strcmp(p, "/admin/v1/costs") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) respond_json(req, 200, gw_cost_json(gw, 0), NULL);
  } else if (strcmp(p, "/admin/v1/capacity") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) respond_json(req, 200, gw_capsvc_json(gw), NULL);
  } else if (strcmp(p, "/admin/v1/capacity/what-if") == 0) {
    if (!is_post) return method_not_allowed(req, "POST");
    if (authorize(gw, req, 1)) handle_what_if(gw, req);
  } else if (strcmp(p, "/admin/v1/queue") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) respond_json(req, 200, gw_metrics_queue_json(gw), NULL);
  } else if (strcmp(p, "/admin/v1/events") == 0) {
    if (!is_get) return method_not_allowed(req, "GET");
    if (authorize(gw, req, 0)) handle_events(gw, req);
  } else if (strcmp(p, "/admin/v1/session") == 0) {
    handle_session(gw, req, is_get, is_post);
  } else if (strcmp(p, "/admin/v1/reload") == 0) {
    if (!is_post) return method_not_allowed(req, "POST");
    if (authorize(gw, req, 1)) handle_reload(gw, req);
  } else {
    admin_error(req, 404, "unknown_url", NULL, "unknown admin URL: %s %s", req->method, p);
  }
}

/* ---- the timer ---------------------------------------------------------------------------- */

static void http_closed_free(pr_http_server *s) { free(s); }

static void send_series(gw_server *gw) {
  cJSON *series = gw_metrics_series_json(gw);
  char *s = series ? cJSON_PrintUnformatted(series) : NULL;
  cJSON_Delete(series);
  if (s) gw_events_send(gw, GW_SUB_STATUS, "series", s, strlen(s));
  free(s);
}

static void admin_tick(uv_timer_t *t) {
  gw_admin *a = t->data;
  gw_server *gw = a->gw;
  uint64_t now = uv_now(gw->loop);
  gw_metrics_tick(gw, now);
  gw_cost_tick(gw, now);
  if (gw_events_count(gw, GW_SUB_STATUS) > 0) {
    cJSON *st = status_json(gw, 0);
    char *s = st ? cJSON_PrintUnformatted(st) : NULL;
    cJSON_Delete(st);
    if (s) gw_events_send(gw, GW_SUB_STATUS, "status", s, strlen(s));
    free(s);
    uint64_t n = gw_metrics_sample_count(gw);
    if (n != a->series_sent) {
      a->series_sent = n;
      send_series(gw);
    }
  }
  if (now - a->last_ping_ms >= GW_ADMIN_PING_MS) {
    a->last_ping_ms = now;
    gw_events_ping(gw);
  }
  for (size_t i = 0; i < a->n_retired;) {
    if (pr_http_server_inflight(a->retired[i]) == 0) {
      pr_http_server_close(a->retired[i], http_closed_free);
      a->retired[i] = a->retired[--a->n_retired];
    } else {
      i++;
    }
  }
}

/* ---- life --------------------------------------------------------------------------------- */

int gw_admin_init(gw_server *gw) {
  gw_admin *a = calloc(1, sizeof(*a));
  if (!a) return -ENOMEM;
  a->gw = gw;
  uv_timer_init(gw->loop, &a->timer);
  a->timer.data = a;
  gw->admin = a;
  gw->metrics = gw_metrics_new(uv_now(gw->loop));
  gw->events = gw_events_new();
  if (!gw->metrics || !gw->events || gw_cost_init(gw)) return -ENOMEM;
  a->last_ping_ms = uv_now(gw->loop);
  if (gw->conf->data_dir) ended_load(a, gw->conf->data_dir);
  uv_timer_start(&a->timer, admin_tick, GW_ADMIN_TICK_MS, GW_ADMIN_TICK_MS);
  gw_metrics_tick(gw, uv_now(gw->loop));
  return 0;
}

static void set_limits(pr_http_server *s, const gw_config *conf) {
  s->limits.max_body_bytes = GW_ADMIN_MAX_BODY;
  s->limits.header_timeout_ms = (uint64_t)(conf->header_timeout_s * 1000);
  s->limits.idle_timeout_ms = (uint64_t)(conf->idle_timeout_s * 1000);
  s->limits.send_timeout_ms = (uint64_t)(conf->send_timeout_s * 1000);
  s->max_conns = 256;
}

int gw_admin_prepare(gw_server *gw, const gw_config *conf) {
  gw_admin *a = gw->admin;
  if (!a) return -ENOMEM;
  a->prepared = 1;
  a->next = NULL;
  free(a->next_addr);
  a->next_addr = NULL;
  if (!conf->admin_listen) return 0;
  a->next_addr = strdup(conf->admin_listen);
  if (!a->next_addr) return -ENOMEM;
  if (a->http && a->addr && strcmp(a->addr, conf->admin_listen) == 0) {
    a->next = a->http; /* unchanged: keep the socket */
    set_limits(a->next, conf);
    return 0;
  }
  pr_http_server *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  pr_http_server_init(s, gw->loop, admin_handle, gw);
  s->head_fn = admin_head;
  s->server_name = "fleetgate";
  set_limits(s, conf);
  int rc = pr_http_server_listen(s, conf->admin_listen);
  if (rc) {
    pr_error("cannot listen on %s (admin): %s", conf->admin_listen, uv_strerror(rc));
    pr_http_server_close(s, http_closed_free);
    return rc;
  }
  pr_info("admin listening on %s (port %d): status page, /metrics, /admin/v1/", conf->admin_listen,
          pr_http_server_port(s));
  a->next = s;
  return 0;
}

static void retire(gw_admin *a, pr_http_server *s) {
  gw_events_close_all(a->gw, s);
  pr_http_server_stop_listening(s);
  pr_http_server_close_idle(s);
  pr_http_server **rt = realloc(a->retired, (a->n_retired + 1) * sizeof(*rt));
  if (rt) {
    a->retired = rt;
    a->retired[a->n_retired++] = s;
  } else {
    pr_http_server_close(s, http_closed_free);
  }
}

void gw_admin_commit(gw_server *gw) {
  gw_admin *a = gw->admin;
  if (!a || !a->prepared) return;
  a->prepared = 0;
  if (a->http && a->http != a->next) {
    pr_info("admin no longer listening on %s", a->addr);
    retire(a, a->http);
  }
  a->http = a->next;
  free(a->addr);
  a->addr = a->next_addr;
  a->next = NULL;
  a->next_addr = NULL;
}

void gw_admin_abort(gw_server *gw) {
  gw_admin *a = gw->admin;
  if (!a || !a->prepared) return;
  a->prepared = 0;
  if (a->next && a->next != a->http) pr_http_server_close(a->next, http_closed_free);
  a->next = NULL;
  free(a->next_addr);
  a->next_addr = NULL;
}

void gw_admin_reloaded(gw_server *gw, const char *why, int rc, const char *errors, const cJSON *changes) {
  gw_metrics_reload(gw, rc == 0);
  gw_events_reload(gw, why, rc, errors, changes);
}

void gw_admin_shutdown(gw_server *gw) {
  gw_admin *a = gw->admin;
  if (!a) return;
  gw_events_close_all(gw, NULL);
  if (a->http) {
    pr_http_server_stop_listening(a->http);
    pr_http_server_close_idle(a->http);
  }
}

void gw_admin_close(gw_server *gw) {
  gw_admin *a = gw->admin;
  if (!a) return;
  gw_admin_abort(gw);
  gw_events_close_all(gw, NULL);
  if (a->http) pr_http_server_close(a->http, http_closed_free);
  a->http = NULL;
  for (size_t i = 0; i < a->n_retired; i++) pr_http_server_close(a->retired[i], http_closed_free);
  a->n_retired = 0;
  uv_timer_stop(&a->timer);
  if (!uv_is_closing((uv_handle_t *)&a->timer)) uv_close((uv_handle_t *)&a->timer, NULL);
}

void gw_admin_free(gw_server *gw) {
  gw_admin *a = gw->admin;
  if (a) {
    free(a->addr);
    free(a->next_addr);
    free(a->retired);
    free(a->ended_path);
    free(a);
  }
  gw->admin = NULL;
  gw_metrics_free(gw->metrics);
  gw->metrics = NULL;
  gw_cost_free(gw);
  gw_events_free(gw->events);
  gw->events = NULL;
}
