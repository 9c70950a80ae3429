/* Agents' signed heartbeats; see heartbeat.h. */
#include "heartbeat.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "caps.h"
#include "clock.h"
#include "json.h"
#include "log.h"
#include "registry.h"
#include "shared.h"
#include "sign.h"

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

int gw_heartbeat_apply(gw_server *gw, const char *body, size_t len, int64_t tsv, int remote,
                       gw_replica **out, const char **code, char *msg, size_t msgn) {
  const gw_config *c = gw->conf;
  pr_json_err je;
  cJSON *o = pr_json_parse(body ? body : "", len, 16, &je);
  if (!o || !cJSON_IsObject(o)) {
    cJSON_Delete(o);
    *code = "invalid_json";
    snprintf(msg, msgn, "the heartbeat body must be a JSON object");
    return 400;
  }
  static const char *const keys[] = {"id", "url", "models", "slots", "busy", "n_ctx", "prefill_tps",
                                     "decode_tps", "state", "device", "version", "uptime_s", NULL};
  const char *id = NULL, *url = NULL, *state = NULL, *version = NULL;
  const cJSON *models = NULL, *device = NULL;
  int64_t slots = 1, busy = 0, n_ctx = 0;
  double pre = 0, dec = 0, up = 0;
  int rc = pr_json_check_keys(o, keys, "", &je);
  if (!rc) rc = pr_json_get_str(o, "id", 1, &id, "", &je);
  if (rc >= 0) rc = pr_json_get_str(o, "url", 1, &url, "", &je);
  if (rc >= 0) rc = pr_json_get_arr(o, "models", 1, &models, "", &je);
  if (rc >= 0) rc = pr_json_get_int(o, "slots", 1, 1, GW_MAX_SLOTS, &slots, "", &je);
  if (rc >= 0) rc = pr_json_get_int(o, "busy", 0, 0, GW_MAX_SLOTS, &busy, "", &je);
  if (rc >= 0) rc = pr_json_get_int(o, "n_ctx", 0, 0, INT64_C(1) << 30, &n_ctx, "", &je);
  if (rc >= 0) rc = pr_json_get_double(o, "prefill_tps", 0, 0, 1e7, &pre, "", &je);
  if (rc >= 0) rc = pr_json_get_double(o, "decode_tps", 0, 0, 1e7, &dec, "", &je);
  if (rc >= 0) rc = pr_json_get_double(o, "uptime_s", 0, 0, 1e10, &up, "", &je);
  if (rc >= 0) rc = pr_json_get_str(o, "state", 0, &state, "", &je);
  if (rc >= 0) rc = pr_json_get_str(o, "version", 0, &version, "", &je);
  if (rc >= 0) rc = pr_json_get_obj(o, "device", 0, &device, "", &je);
  if (rc < 0) {
    snprintf(msg, msgn, "%s: %s", je.path, je.msg);
    cJSON_Delete(o);
    *code = "invalid_heartbeat";
    return 400;
  }
  char *mlist[64];
  size_t nm = 0;
  int bad = !valid_id(id) || (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0);
  for (const cJSON *m = models->child; m && !bad; m = m->next) {
    if (!cJSON_IsString(m) || !m->valuestring[0] || nm >= 64) bad = 1;
    else mlist[nm++] = m->valuestring;
  }
  if (bad || nm == 0 || (state && strcmp(state, "ready") && strcmp(state, "loading") &&
                         strcmp(state, "draining"))) {
    cJSON_Delete(o);
    *code = "invalid_heartbeat";
    snprintf(msg, msgn, "id must be 1-64 of [A-Za-z0-9._-], url http(s), models a non-empty list "
             "of names, state ready|loading|draining");
    return 400;
  }
  uint64_t now = uv_now(gw->loop);
  gw_replica *r = gw_registry_find(gw, id);
  if (r && (int64_t)tsv <= r->last_heartbeat_ts) {
    cJSON_Delete(o);
    *code = "replayed_heartbeat";
    snprintf(msg, msgn, "the heartbeat is not newer than the last one accepted");
    return 401;
  }
  int is_new = 0;
  if (!r) {
    size_t nlen = strlen(url);
    while (nlen > 0 && url[nlen - 1] == '/') nlen--;
    char *u = strndup(url, nlen);
    r = u ? gw_replica_new(id, u, c->fleet_replica_token, mlist, nm, (int)slots, n_ctx,
                           pre > 0 ? pre : 50, dec > 0 ? dec : 5, 0)
          : NULL;
    free(u);
    if (!r || gw_registry_add(gw, r)) {
      gw_replica_free(r);
      cJSON_Delete(o);
      *code = "out_of_memory";
      snprintf(msg, msgn, "out of memory");
      return 500;
    }
    r->agent = 1;
    is_new = 1;
    gw_replica_set_state(r, GW_REPLICA_READY, now, "registered by heartbeat");
  } else if (!r->from_file) {
    /* heartbeat-only: the agent's word is the only source of its settings */
    size_t nlen = strlen(url);
    while (nlen > 0 && url[nlen - 1] == '/') nlen--;
    char *u = strndup(url, nlen);
    if (u) gw_replica_set_strings(r, u, c->fleet_replica_token, mlist, nm, r->labels);
    free(u);
    r->slots = (int)slots;
    r->n_ctx = n_ctx;
  } else {
    /* from a file that leaves them out: the agent says */
    gw_replica_learn_shape(r, slots, n_ctx);
  }
  const char *old = gw_replica_display_state(r);
  r->from_heartbeat = 1;
  /* a heartbeat relayed by another gateway is as fresh as its signed timestamp */
  int64_t age = remote ? pr_clock_wall_ms() - (int64_t)tsv : 0;
  if (age < 0) age = 0;
  r->last_heartbeat_ms = now > (uint64_t)age ? now - (uint64_t)age : 0;
  r->last_heartbeat_ts = (int64_t)tsv;
  r->busy_reported = (int)busy;
  r->drain_agent = state && strcmp(state, "draining") == 0;
  if (version) snprintf(r->version, sizeof(r->version), "%s", version);
  gw_replica_seed_rates(r, pre, dec); /* bounded; only until rates are learned here */
  if (device) {
    const cJSON *v;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(device, "battery_pct"))) r->battery_pct = v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(device, "temperature_c"))) r->temperature_c = v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(device, "mem_free_mb"))) r->mem_free_mb = v->valuedouble;
    if (cJSON_IsBool(v = cJSON_GetObjectItemCaseSensitive(device, "charging"))) r->charging = cJSON_IsTrue(v);
  }
  if (state && strcmp(state, "loading") == 0) {
    if (r->state != GW_REPLICA_LOADING) gw_replica_set_state(r, GW_REPLICA_LOADING, now, "agent reports loading");
  } else if (r->state == GW_REPLICA_DOWN && strstr(r->state_reason, "heartbeat")) {
    /* it was out only for silence: a heartbeat is the sign of life it lacked */
    r->probation = 1;
    gw_replica_set_state(r, GW_REPLICA_READY, now, "heartbeats resumed, on probation");
  } else if (r->state == GW_REPLICA_LOADING && !r->from_file) {
    gw_replica_set_state(r, GW_REPLICA_READY, now, "agent reports ready");
  }
  if (is_new) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "event", "replica_registered");
    if (remote) cJSON_AddStringToObject(f, "via", "another gateway");
    cJSON_AddStringToObject(f, "replica", r->id);
    cJSON_AddStringToObject(f, "url", r->url);
    pr_log_kv(PR_LOG_INFO, "replica registered by heartbeat", f);
  } else {
    gw_registry_event(gw, r, old);
  }
  cJSON_Delete(o);
  *out = r;
  return 0;
}


void gw_heartbeat_handle(gw_server *gw, pr_http_req *req, const char *rid) {
  const gw_config *c = gw->conf;
  if (!c->fleet_secret) {
    gw_respond_error(req, rid, 404, "invalid_request_error", NULL, "heartbeats_disabled", 0,
                     "heartbeats are not enabled on this gateway (no fleet.secret_env)");
    return;
  }
  if (req->body.len > GW_HEARTBEAT_MAX_BODY) {
    refuse(req, rid, 413, "request_too_large", "heartbeat body too large", NULL);
    return;
  }
  const char *ts = pr_http_header_get(req, "x-fleetgate-timestamp");
  const char *sig = pr_http_header_get(req, "x-fleetgate-signature");
  if (!ts || !sig) {
    refuse(req, rid, 401, "missing_signature",
           "a heartbeat needs x-fleetgate-timestamp and x-fleetgate-signature", NULL);
    return;
  }
  char *end;
  long long tsv = strtoll(ts, &end, 10);
  if (end == ts || *end || tsv <= 0) {
    refuse(req, rid, 401, "invalid_timestamp", "x-fleetgate-timestamp must be milliseconds since the epoch", NULL);
    return;
  }
  if (!gw_heartbeat_verify(c->fleet_secret, ts, req->body.data, req->body.len, sig)) {
    refuse(req, rid, 401, "invalid_signature", "the heartbeat's signature does not match", NULL);
    return;
  }
  int64_t skew = pr_clock_wall_ms() - (int64_t)tsv;
  if (skew < 0) skew = -skew;
  if ((double)skew > c->heartbeat_max_skew_s * 1000) {
    refuse(req, rid, 401, "stale_timestamp", "the heartbeat's timestamp is outside the allowed window", NULL);
    return;
  }
  const char *code = NULL;
  char msg[600];
  gw_replica *r = NULL;
  int st = gw_heartbeat_apply(gw, req->body.data, req->body.len, (int64_t)tsv, 0, &r, &code, msg,
                              sizeof(msg));
  if (st) {
    refuse(req, rid, st, code, msg, NULL);
    return;
  }
  gw_shared_publish_heartbeat(gw, r->id, (int64_t)tsv, req->body.data, req->body.len);
  cJSON *reply = cJSON_CreateObject();
  cJSON_AddStringToObject(reply, "id", r->id);
  cJSON_AddBoolToObject(reply, "accepted", 1);
  cJSON_AddNumberToObject(reply, "interval_s", c->heartbeat_interval_s);
  cJSON_AddBoolToObject(reply, "drain", r->removed || r->drain_conf || r->drain_admin);
  cJSON_AddStringToObject(reply, "state", gw_replica_display_state(r));
  char *s = cJSON_PrintUnformatted(reply);
  cJSON_Delete(reply);
  char h1[160];
  snprintf(h1, sizeof(h1), "x-request-id: %s", rid);
  const char *hdrs[] = {h1, NULL};
  pr_http_respond(req, 200, hdrs, "application/json", s ? s : "{}", s ? strlen(s) : 2);
  free(s);
  gw_plan_soon(gw);
}
