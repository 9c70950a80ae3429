/* The gateway process: listeners and routing of the client API, the replica registry
 * built from the configuration, the periodic tick (deadlines, cool-downs), signals and
 * graceful shutdown (stop accepting, let in-flight work finish up to a deadline, then
 * close every handle so the loop closes cleanly). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "capsvc.h"
#include "caps.h"
#include "clock.h"
#include "admin.h"
#include "err.h"
#include "gw.h"
#include "engprobe.h"
#include "health.h"
#include "events.h"
#include "heartbeat.h"
#include "pins.h"
#include "planrec.h"
#include "scheduler.h"
#include "drains.h"
#include "cachescope.h"
#include "log.h"
#include "auth.h"
#include "batch.h"
#include "bearer.h"
#include "registry.h"
#include "sd.h"
#include "placement.h"
#include "shared.h"
#include "metrics.h"
#include "cost.h"
#include "tls.h"
#include "urlpolicy.h"
#include "verify.h"

static void watch_closed(uv_handle_t *h);

/* The descriptors: kept-alive phone connections for the fleet as it is now, and the
 * clients that leaves room for (gw_idle_conn_cap, gw_conn_budget). */
static void conn_limits(gw_server *gw) {
  uint64_t nf = gw->proc.nofile ? gw->proc.nofile : 1048576;
  size_t idle = gw_idle_conn_cap(nf, gw->n_replicas);
  if (idle == gw->proc.idle_conns || !gw->curlm) return;
  gw->proc.idle_conns = idle;
  if (gw->proc.nofile) pr_http_set_process_max_conns(gw_conn_budget(nf, gw->n_replicas));
  /* each host's connections are a cache of their own (pr_curlm_dns_attach), and libcurl
   * caps each cache at MAXCONNECTS: the fleet's share, per phone */
  curl_multi_setopt(pr_curlm_multi(gw->curlm), CURLMOPT_MAXCONNECTS,
                    (long)gw_idle_conn_per_host(nf, gw->n_replicas));
}

/* A replica joined or left: the limits follow the fleet, in steps of an eighth (a phone
 * joining does not move them each time). */
static void conn_limits_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  if (ev->kind != GW_FLEET_ADDED && ev->kind != GW_FLEET_REMOVED) return;
  uint64_t nf = gw->proc.nofile ? gw->proc.nofile : 1048576;
  size_t want = gw_idle_conn_cap(nf, gw->n_replicas);
  if (want > gw->proc.idle_conns || want + want / 8 < gw->proc.idle_conns) conn_limits(gw);
}

static size_t gw_ready_count(gw_server *gw) {
  size_t n = 0;
  uint64_t now = uv_now(gw->loop);
  for (size_t i = 0; i < gw->n_replicas; i++)
    if (gw_replica_capacity(gw->replicas[i], now) > 0) n++;
  return n;
}

/* The models a caller may use (its key's `models`, when it has a list): a restricted key
 * learns nothing of the fleet's other models. */
static void handle_models(gw_server *gw, pr_http_req *req, const char *rid, const gw_caller *caller) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON *data = cJSON_AddArrayToObject(o, "data");
  uint64_t now = uv_now(gw->loop);
  for (size_t i = 0; i < gw->n_replicas; i++) {
    gw_replica *r = gw->replicas[i];
    if (gw_replica_capacity(r, now) <= 0) continue;
    for (size_t k = 0; k < r->n_models; k++) {
      int seen = !gw_auth_model_allowed(caller, r->models[k]);
      for (cJSON *it = data->child; it && !seen; it = it->next)
        if (strcmp(cJSON_GetObjectItem(it, "id")->valuestring, r->models[k]) == 0) seen = 1;
      if (seen) continue;
      cJSON *m = cJSON_CreateObject();
      cJSON_AddStringToObject(m, "id", r->models[k]);
      cJSON_AddStringToObject(m, "object", "model");
      cJSON_AddNumberToObject(m, "created", 0);
      cJSON_AddStringToObject(m, "owned_by", "fleetgate");
      cJSON_AddItemToArray(data, m);
    }
  }
  gw_respond_json(req, rid, 200, o);
}

/* GET /v1/models/{id}: the model object when some replica serves it (ready or not: a
 * fleet whose phones are all loading still has the model), else OpenAI's 404. */
static void handle_model(gw_server *gw, pr_http_req *req, const char *rid, const char *id,
                         const gw_caller *caller) {
  for (size_t i = 0; *id && gw_auth_model_allowed(caller, id) && i < gw->n_replicas; i++) {
    if (!gw_replica_serves(gw->replicas[i], id)) continue;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "fleetgate");
    gw_respond_json(req, rid, 200, m);
    return;
  }
  gw_respond_error(req, rid, 404, "invalid_request_error", "model", "model_not_found",
                   0, "The model '%.200s' does not exist", id);
}


static int is_completion_path(const char *path) {
  return strcmp(path, "/v1/chat/completions") == 0 || strcmp(path, "/v1/completions") == 0 ||
         strcmp(path, "/v1/responses") == 0;
}

/* At headers-complete, before any body byte is read or 100 Continue is sent: requests
 * that will be refused whatever their body says are answered now (an API key missing or
 * wrong, a heartbeat without its signature headers, heartbeats disabled, a wrong method,
 * an unknown URL), and each route gets the body limit it needs (only the completions and
 * the heartbeat take a body). The answers are the ones the handlers would give after
 * the body; the connection then closes, the body unread. */
static void gw_head(pr_http_req *req, void *ud) {
  gw_server *gw = ud;
  const char *path = req->path;
  int is_post = strcmp(req->method, "POST") == 0;
  if (is_post && strcmp(path, "/fleet/v1/heartbeat") == 0) {
    char rid[128];
    gw_request_id(gw, req, rid, sizeof(rid));
    if (!gw_heartbeat_head(gw, req, rid)) req->max_body = PR_CAP_HEARTBEAT;
    return;
  }
  int completion = is_post && is_completion_path(path);
  /* Only the completions (and the heartbeat above) read a body: no other request holds
   * body bytes (or budget). A body on a GET route passes its 0-byte limit: 413 from the
   * Content-Length (at the first byte of a chunked one); a wrong method or an unknown
   * URL gets gw_handle's 405 or 404 below, now. */
  if (!completion) req->max_body = 0;
  /* GET on a completion path gets its 405 from gw_handle, with or without a key */
  gw_caller *caller = NULL;
  if (gw->conf->n_keys && strncmp(path, "/v1/", 4) == 0 && (is_post || !is_completion_path(path))) {
    const char *why = NULL;
    if (!(caller = gw_auth_identify(gw, req, &why))) {
      char rid[128];
      gw_request_id(gw, req, rid, sizeof(rid));
      int missing = strcmp(why, "missing") == 0;
      /* the completion routes' words are job.c's, the others' gw_handle's */
      gw_respond_error(req, rid, 401, "invalid_request_error", NULL, "invalid_api_key", 0, "%s",
                       !missing      ? "Incorrect API key provided."
                       : completion  ? "You didn't provide an API key. Send it as `Authorization: Bearer KEY`."
                                     : "You didn't provide an API key.");
      return;
    }
  }
  if (completion) return;
  if (gw_batches_route(path)) {
    char rid[128];
    gw_request_id(gw, req, rid, sizeof(rid));
    gw_batches_head(gw, req, rid, caller); /* an upload counts in its key's quotas */
    return;
  }
  int is_get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
  int get_route = strcmp(path, "/v1/models") == 0 || strncmp(path, "/v1/models/", 11) == 0 ||
                  strcmp(path, "/healthz") == 0 || strcmp(path, "/readyz") == 0;
  if (get_route && is_get) return;
  char rid[128];
  gw_request_id(gw, req, rid, sizeof(rid));
  if (get_route || is_completion_path(path))
    gw_respond_error(req, rid, 405, "invalid_request_error", NULL, "method_not_allowed", 0,
                     "%s needs %s", path, get_route ? "GET" : "POST");
  else
    gw_respond_error(req, rid, 404, "invalid_request_error", NULL, "unknown_url", 0,
                     "Unknown request URL: %s %s", req->method, path);
}

/* Everything on the client listener comes through here. */
static void gw_handle(pr_http_req *req, void *ud) {
  gw_server *gw = ud;
  const char *path = req->path;
  int is_post = strcmp(req->method, "POST") == 0;
  int is_get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
  if (is_completion_path(path)) {
    if (!is_post) {
      char rid0[128];
      gw_request_id(gw, req, rid0, sizeof(rid0));
      gw_respond_error(req, rid0, 405, "invalid_request_error", NULL, "method_not_allowed", 0,
                       "%s needs POST", path);
      return;
    }
    if (pr_http_header_get(req, "x-fleetgate-hop")) {
      /* a gateway's own request to a phone came back here: the phone's URL leads to a
       * gateway (a load balancer, a public name). Refused, or it would loop */
      char rid0[128];
      gw_request_id(gw, req, rid0, sizeof(rid0));
      gw_respond_error(req, rid0, 508, "server_error", NULL, "loop_detected", 0,
                       "the request came from a fleetgate gateway: a replica URL leads back "
                       "to a gateway");
      return;
    }
    gw_job_start(gw, req, path);
    return;
  }
  char rid[128];
  gw_request_id(gw, req, rid, sizeof(rid));
  const char *why = NULL;
  gw_caller *caller = NULL;
  if (is_post && strcmp(path, "/fleet/v1/heartbeat") == 0) {
    gw_heartbeat_handle(gw, req, rid); /* signed: no API key */
  } else if (gw->conf->n_keys && strncmp(path, "/v1/", 4) == 0 &&
             !(caller = gw_auth_identify(gw, req, &why))) {
    gw_batches_let_go(req);
    gw_respond_error(req, rid, 401, "invalid_request_error", NULL, "invalid_api_key", 0, "%s",
                     strcmp(why, "missing") == 0 ? "You didn't provide an API key."
                                                 : "Incorrect API key provided.");
  } else if (gw_batches_route(path)) {
    gw_batches_handle(gw, req, rid, caller);
  } else if (is_get && strcmp(path, "/v1/models") == 0) {
    handle_models(gw, req, rid, caller);
  } else if (is_get && strncmp(path, "/v1/models/", 11) == 0) {
    handle_model(gw, req, rid, path + 11, caller);
  } else if (is_get && strcmp(path, "/healthz") == 0) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", gw->shutting_down ? "shutting_down" : "ok");
    gw_respond_json(req, rid, gw->shutting_down ? 503 : 200, o);
  } else if (is_get && strcmp(path, "/readyz") == 0) {
    size_t ready = gw_ready_count(gw);
    cJSON *o = cJSON_CreateObject();
    int ok = ready > 0 && !gw->shutting_down;
    cJSON_AddStringToObject(o, "status", ok ? "ready" : "not_ready");
    /* the size of the fleet and its queue are the operator's business: the status alone
     * is what a load balancer needs */
    if (gw->conf->readyz_counts ||
        (gw->conf->admin_token &&
         pr_bearer_check(pr_http_header_get(req, "authorization"), gw->conf->admin_token) == 0)) {
      cJSON_AddNumberToObject(o, "replicas_ready", (double)ready);
      cJSON_AddNumberToObject(o, "replicas", (double)gw->n_replicas);
      cJSON_AddNumberToObject(o, "queued", (double)gw->queue.len);
    }
    gw_respond_json(req, rid, ok ? 200 : 503, o);
  } else if (strcmp(path, "/v1/models") == 0 || strncmp(path, "/v1/models/", 11) == 0 ||
             strcmp(path, "/healthz") == 0 || strcmp(path, "/readyz") == 0) {
    gw_respond_error(req, rid, 405, "invalid_request_error", NULL, "method_not_allowed", 0,
                     "%s needs GET", path);
  } else {
    gw_respond_error(req, rid, 404, "invalid_request_error", NULL, "unknown_url", 0,
                     "Unknown request URL: %s %s", req->method, path);
  }
}

/* Log lines written during a loop turn go out together just before the loop waits
 * again: batched under load, at once when idle. */
static void log_flush_cb(uv_prepare_t *p) {
  (void)p;
  pr_log_flush();
}

static void tick_cb(uv_timer_t *t) {
  gw_server *gw = t->data;
  uint64_t now = uv_now(gw->loop);
  int probing = gw->conf->health_interval_s > 0;
  /* with active checks, health.c's heap moves replicas between states as they fall due */
  for (size_t i = 0; !probing && i < gw->n_replicas; i++) {
    gw_replica *r = gw->replicas[i];
    const char *old = gw_replica_display_state(r);
    if (r->state == GW_REPLICA_LOADING && !probing && now >= r->down_until_ms)
      gw_replica_set_state(r, GW_REPLICA_READY, now, "loading wait over");
    else if (!probing)
      gw_replica_tick(r, now); /* without probes, a cool-down's end brings it back */
    gw_registry_event(gw, r, old);
  }
  gw_registry_sweep(gw, now);
  gw_heartbeat_expire_pins(gw);
  if (gw->fd_pressure_until_ms && gw->fd_credit < 1) gw->fd_credit = 1; /* probe again */
  gw_jobs_leave_down_replicas(gw, now);
  gw_jobs_hedge(gw, now);
  gw_verify_tick(gw, now);
  gw_placement_tick(gw, now);
  for (size_t i = 0; i < gw->proc.n_retired;) {
    if (pr_http_server_inflight(gw->proc.retired[i]) == 0) {
      pr_http_server_close(gw->proc.retired[i], (void (*)(pr_http_server *))free);
      gw->proc.retired[i] = gw->proc.retired[--gw->proc.n_retired];
    } else {
      i++;
    }
  }
  /* a new session ticket key every tls_ticket_rotate_s (12 h by default) */
  int rot = pr_tls_ticket_tick(now, (uint64_t)(gw->conf->tls_ticket_rotate_s * 1000));
  if (rot == 1) pr_info("TLS session ticket key rotated (key %" PRIu64 ")", pr_tls_ticket_generation());
  else if (rot < 0) pr_warn("cannot make a new TLS session ticket key: %s", pr_strerror(rot));
  gw_plan_soon(gw);
}

static void on_signal(uv_signal_t *s, int signum) {
  gw_server *gw = s->data;
  if (signum == SIGHUP) {
    /* systemd shows "reloading" until READY=1 (Type=notify-reload waits for it); after
     * a refusal the running config still serves, so READY=1 all the same */
    if (gw->shutting_down) return;
    pr_sd_notify_reloading();
    int rc = gw_server_reload(gw, "SIGHUP", NULL, NULL);
    pr_sd_notify(rc ? "READY=1\nSTATUS=serving; the last reload was refused (see the log)"
                    : "READY=1\nSTATUS=serving");
    return;
  }
  pr_info("received %s: finishing in-flight requests, then exiting",
          signum == SIGTERM ? "SIGTERM" : "SIGINT");
  gw_server_shutdown(gw);
}

static void shutdown_deadline_cb(uv_timer_t *t) {
  gw_server *gw = t->data;
  pr_warn("shutdown deadline reached: answering what is left with errors");
  gw_jobs_abandon(gw); /* each job answers its client with an error and finishes */
}

static void close_handle(uv_handle_t *h) {
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void curlm_closed(void *arg) { (void)arg; }

static void http_closed_free(pr_http_server *s) { free(s); }

void gw_server_shutdown(gw_server *gw) {
  if (!gw->shutting_down) {
    gw->shutting_down = 1;
    pr_sd_notify("STOPPING=1\nSTATUS=finishing in-flight requests");
    for (size_t i = 0; i < gw->proc.n_http; i++) {
      pr_http_server_stop_listening(gw->proc.http[i]);
      pr_http_server_close_idle(gw->proc.http[i]);
    }
    gw_admin_shutdown(gw);
    gw_capsvc_shutdown(gw);
    /* batch lines in flight are let go now (they run again at the next start) rather
     * than holding the shutdown for minutes; what was answered is written */
    gw_batches_close(gw);
    /* may end the last jobs: jobs_drained then runs this again, which closes all */
    gw_jobs_abandon_shadows(gw);
    if (gw->jobs_alive > 0) {
      uv_timer_start(&gw->proc.shutdown_timer, shutdown_deadline_cb,
                     (uint64_t)(gw->conf->shutdown_timeout_s * 1000), 0);
      return;
    }
  }
  if (gw->jobs_alive > 0 || gw->proc.handles_closed) return;
  gw->proc.handles_closed = 1;
  /* nothing in flight: close every handle */
  for (size_t i = 0; i < gw->proc.n_http; i++) {
    pr_http_server_close(gw->proc.http[i], http_closed_free);
    free(gw->proc.http_addr[i]);
  }
  gw->proc.n_http = 0;
  for (size_t i = 0; i < gw->proc.n_retired; i++) pr_http_server_close(gw->proc.retired[i], http_closed_free);
  gw->proc.n_retired = 0;
  gw_admin_close(gw);
  gw_health_stop(gw);
  gw_engprobe_stop(gw);
  gw_shared_stop(gw);
  if (gw->curlm) {
    pr_curlm_close(gw->curlm, curlm_closed, NULL);
    gw->curlm = NULL;
  }
  uv_timer_stop(&gw->tick);
  uv_timer_stop(&gw->health.timer);
  uv_timer_stop(&gw->proc.shutdown_timer);
  uv_timer_stop(&gw->proc.reload_timer);
  close_handle((uv_handle_t *)&gw->tick);
  close_handle((uv_handle_t *)&gw->health.timer);
  close_handle((uv_handle_t *)&gw->proc.shutdown_timer);
  close_handle((uv_handle_t *)&gw->proc.reload_timer);
  gw_jobs_close(gw, NULL);
  uv_prepare_stop(&gw->proc.log_flush);
  close_handle((uv_handle_t *)&gw->proc.log_flush);
  close_handle((uv_handle_t *)&gw->proc.sig_term);
  close_handle((uv_handle_t *)&gw->proc.sig_int);
  close_handle((uv_handle_t *)&gw->proc.sig_hup);
  if (gw->proc.dir_watch) {
    uv_fs_event_stop(gw->proc.dir_watch);
    uv_close((uv_handle_t *)gw->proc.dir_watch, watch_closed);
    gw->proc.dir_watch = NULL;
  }
}

static void gw_error_body(pr_buf *out, const char **ctype, char *header, size_t header_n,
                          int status, const char *message, const char *code,
                          const pr_http_req *req, void *ud) {
  char rid[128];
  gw_request_id(ud, req, rid, sizeof(rid));
  snprintf(header, header_n, "x-request-id: %s", rid);
  pr_oai_error_body(out, message, status >= 500 ? "server_error" : "invalid_request_error", NULL,
                    code);
  *ctype = "application/json";
}

static void set_limits(pr_http_server *s, const gw_config *conf) {
  s->limits.max_body_bytes = conf->max_body_bytes;
  s->limits.header_timeout_ms = (uint64_t)(conf->header_timeout_s * 1000);
  s->limits.body_timeout_ms = (uint64_t)(conf->header_timeout_s * 1000) * 6;
  s->limits.idle_timeout_ms = (uint64_t)(conf->idle_timeout_s * 1000);
  s->limits.send_timeout_ms = (uint64_t)(conf->send_timeout_s * 1000);
  s->max_conns = conf->max_connections;
  pr_http_set_body_budget(conf->body_budget_bytes); /* one budget for the process */
}

/* Open the listeners conf names; a listener whose address is unchanged keeps its
 * socket; one no longer named stops accepting and closes once its requests are done. */
static int apply_listeners(gw_server *gw, const gw_config *conf) {
  pr_http_server **next = calloc(conf->n_listen + 1, sizeof(*next));
  if (!next) return -ENOMEM;
  int rc = 0;
  size_t n = 0;
  for (size_t i = 0; i < conf->n_listen && !rc; i++) {
    const char *addr = conf->listen[i].address;
    pr_http_server *s = NULL;
    for (size_t k = 0; k < gw->proc.n_http; k++) {
      if (gw->proc.http[k] && strcmp(gw->proc.http_addr[k], addr) == 0) {
        s = gw->proc.http[k];
        gw->proc.http[k] = NULL;
        break;
      }
    }
    if (!s) {
      s = calloc(1, sizeof(*s));
      if (!s) {
        rc = -ENOMEM;
        break;
      }
      pr_http_server_init(s, gw->loop, gw_handle, gw);
      s->head_fn = gw_head;
      s->server_name = "fleetgate";
      s->error_fn = gw_error_body;
      s->error_ud = gw;
      rc = pr_http_server_listen(s, addr);
      if (rc) {
        pr_error("cannot listen on %s: %s", addr, uv_strerror(rc));
        pr_http_server_close(s, http_closed_free);
        break;
      }
      pr_info("listening on %s (port %d)%s", addr, pr_http_server_port(s),
              conf->listen[i].tls_cert ? " with TLS" : "");
    }
    set_limits(s, conf);
    next[n++] = s;
  }
  /* certificates are (re)loaded for every listener: a reload picks up renewed files */
  SSL_CTX **ctxs = calloc(conf->n_listen + 1, sizeof(*ctxs));
  if (!ctxs && !rc) rc = -ENOMEM;
  for (size_t i = 0; !rc && i < n; i++) {
    const gw_listen_conf *lc = &conf->listen[i];
    if (!lc->tls_cert) continue;
    char err[512];
    ctxs[i] = pr_tls_server_ctx(lc->tls_cert, lc->tls_key, err, sizeof(err));
    if (!ctxs[i]) {
      pr_error("listener %s: %s", lc->address, err);
      rc = -EINVAL;
    }
  }
  if (!rc) {
    for (size_t i = 0; i < n; i++) {
      if (conf->listen[i].tls_cert || next[i]->tls) pr_http_server_set_tls(next[i], ctxs[i]);
    }
  } else if (ctxs) {
    for (size_t i = 0; i < n; i++) SSL_CTX_free(ctxs[i]);
  }
  free(ctxs);
  if (rc) {
    /* put back what we took; close what we opened */
    for (size_t i = 0; i < n; i++) {
      int found = 0;
      for (size_t k = 0; k < gw->proc.n_http; k++)
        if (!gw->proc.http[k] && strcmp(gw->proc.http_addr[k], conf->listen[i].address) == 0 && !found) {
          gw->proc.http[k] = next[i];
          found = 1;
        }
      if (!found) pr_http_server_close(next[i], http_closed_free);
    }
    free(next);
    return rc;
  }
  for (size_t k = 0; k < gw->proc.n_http; k++) {
    if (!gw->proc.http[k]) continue;
    pr_info("no longer listening on %s", gw->proc.http_addr[k]);
    pr_http_server_stop_listening(gw->proc.http[k]);
    pr_http_server_close_idle(gw->proc.http[k]);
    pr_http_server **rt = realloc(gw->proc.retired, (gw->proc.n_retired + 1) * sizeof(*rt));
    if (rt) {
      gw->proc.retired = rt;
      gw->proc.retired[gw->proc.n_retired++] = gw->proc.http[k];
    } else {
      pr_http_server_close(gw->proc.http[k], http_closed_free);
    }
  }
  for (size_t k = 0; k < gw->proc.n_http; k++) free(gw->proc.http_addr[k]);
  free(gw->proc.http_addr);
  free(gw->proc.http);
  gw->proc.http = next;
  gw->proc.n_http = n;
  gw->proc.http_addr = calloc(n + 1, sizeof(char *));
  for (size_t i = 0; i < n && gw->proc.http_addr; i++) gw->proc.http_addr[i] = strdup(conf->listen[i].address);
  return 0;
}

static void reload_timer_cb(uv_timer_t *t) {
  gw_server *gw = t->data;
  gw_server_reload(gw, "replicas_dir changed", NULL, NULL);
}

static void dir_event_cb(uv_fs_event_t *h, const char *filename, int events, int status) {
  gw_server *gw = h->data;
  (void)events;
  if (status < 0 || gw->shutting_down) return;
  /* editors write temporary and backup files: only *.json names matter */
  if (filename) {
    size_t l = strlen(filename);
    if (l < 5 || strcmp(filename + l - 5, ".json") != 0) return;
  }
  uv_timer_start(&gw->proc.reload_timer, reload_timer_cb, 300, 0);
}

static void watch_closed(uv_handle_t *h) { free(h); }

/* Watch conf's replicas_dir (a new handle when the folder changed). */
static void watch_dir(gw_server *gw, const gw_config *conf) {
  const char *dir = conf->replicas_dir;
  if (gw->proc.dir_watch && dir && gw->proc.watched_dir && strcmp(gw->proc.watched_dir, dir) == 0) return;
  if (gw->proc.dir_watch) {
    uv_fs_event_stop(gw->proc.dir_watch);
    uv_close((uv_handle_t *)gw->proc.dir_watch, watch_closed);
    gw->proc.dir_watch = NULL;
  }
  free(gw->proc.watched_dir);
  gw->proc.watched_dir = dir ? strdup(dir) : NULL;
  if (!dir) return;
  uv_fs_event_t *w = calloc(1, sizeof(*w));
  if (!w) return;
  uv_fs_event_init(gw->loop, w);
  w->data = gw;
  if (uv_fs_event_start(w, dir_event_cb, dir, 0) == 0) {
    gw->proc.dir_watch = w;
  } else {
    uv_close((uv_handle_t *)w, watch_closed);
    pr_warn("cannot watch %s for changes: reload with SIGHUP", dir);
  }
}

int gw_server_reload(gw_server *gw, const char *why, pr_buf *errors_out, cJSON *changes_out) {
  if (gw->shutting_down) return -ECANCELED;
  pr_buf errors;
  pr_buf_init(&errors, PR_CAP_REPORT);
  gw_config *next = NULL;
  int rc = gw_config_load(gw->conf->path, &next, &errors);
  if (rc) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "event", "reload_refused");
    cJSON_AddStringToObject(f, "trigger", why);
    cJSON_AddStringToObject(f, "errors", pr_buf_cstr(&errors));
    pr_log_kv(PR_LOG_ERROR, "configuration reload refused; the running configuration is unchanged", f);
    if (errors_out) pr_buf_bytes(errors_out, errors.data ? errors.data : "", errors.len);
    gw_admin_reloaded(gw, why, rc, pr_buf_cstr(&errors), NULL);
    pr_buf_free(&errors);
    return rc;
  }
  pr_buf_free(&errors);
  rc = gw_admin_prepare(gw, next);
  if (!rc) rc = apply_listeners(gw, next);
  if (rc) {
    gw_admin_abort(gw);
    gw_admin_reloaded(gw, why, rc, "cannot open a listener", NULL);
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "event", "reload_refused");
    cJSON_AddStringToObject(f, "trigger", why);
    cJSON_AddStringToObject(f, "errors", "cannot open a listener");
    pr_log_kv(PR_LOG_ERROR, "configuration reload refused; the running configuration is unchanged", f);
    if (errors_out) pr_buf_text(errors_out, "%s: cannot open a listener: %s\n", next->path, uv_strerror(rc));
    gw_config_unref(next);
    return rc;
  }
  cJSON *changes = cJSON_CreateObject();
  gw_registry_apply(gw, next, changes);
  gw_models_configure(&gw->models, next->models, next->n_models, uv_now(gw->loop));
  gw_models_trim(&gw->models);
  gw_auth_apply(gw, next);
  gw_config *old = gw->conf;
  if ((old->data_dir == NULL) != (next->data_dir == NULL) ||
      (old->data_dir && strcmp(old->data_dir, next->data_dir) != 0)) {
    /* the open store and its running batches stay where they are */
    cJSON_AddStringToObject(changes, "data_dir", "changes at the next start");
    pr_warn("data_dir changed: the Batch API keeps %s until the gateway restarts",
            gw->batches ? old->data_dir : "off");
  }
  gw->conf = next;
  gw_config_unref(old);
  char verr[512];
  if (gw_verify_reload(gw, verr, sizeof(verr)) < 0) {
    /* the rest applies: the canaries the gateway had stay */
    pr_warn("verify.canaries_file: %s; the canaries loaded before are kept", verr);
    cJSON_AddStringToObject(changes, "verify.canaries_file", "refused: the canaries loaded before are kept");
  }
  gw_heartbeat_token_secret(gw); /* phones learn a changed token at their next heartbeat */
  gw_health_reconfigured(gw);    /* intervals may have changed, replicas left or came back */
  for (size_t i = 0; i < gw->n_replicas; i++) /* scheduler.device's thresholds may have moved */
    gw_heartbeat_device(gw, gw->replicas[i]);
  gw_admin_commit(gw);
  gw_shared_apply(gw);
  if (next->log_level) pr_log_set_level(pr_log_level_from_name(next->log_level));
  watch_dir(gw, next);
  cJSON *f = cJSON_Duplicate(changes, 1);
  cJSON_AddStringToObject(f, "event", "config_reloaded");
  cJSON_AddStringToObject(f, "trigger", why);
  pr_log_kv(PR_LOG_INFO, "configuration reloaded", f);
  gw_admin_reloaded(gw, why, 0, NULL, changes);
  if (changes_out) {
    for (cJSON *it = changes->child; it; it = it->next)
      cJSON_AddItemToObject(changes_out, it->string, cJSON_Duplicate(it, 1));
  }
  cJSON_Delete(changes);
  gw_plan_soon(gw);
  return 0;
}

int gw_server_init(gw_server *gw, uv_loop_t *loop, gw_config *conf) {
  memset(gw, 0, sizeof(*gw));
  gw->loop = loop;
  gw->conf = gw_config_ref(conf);
  gw->started_ms = uv_now(loop);
  unsigned char rnd[4];
  if (RAND_bytes(rnd, sizeof(rnd)) != 1) memset(rnd, 0, sizeof(rnd));
  snprintf(gw->id_prefix, sizeof(gw->id_prefix), "%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3]);

  /* every handle first, so a failure below can still close them all */
  uv_timer_init(loop, &gw->tick);
  gw->tick.data = gw;
  uv_timer_init(loop, &gw->health.timer);
  gw->health.timer.data = gw;
  uv_timer_init(loop, &gw->proc.shutdown_timer);
  gw->proc.shutdown_timer.data = gw;
  uv_timer_init(loop, &gw->proc.reload_timer);
  gw->proc.reload_timer.data = gw;
  gw_jobs_init(gw);
  gw->jobs_drained = gw_server_shutdown;
  gw->reload = gw_server_reload;
  gw->job_demand = gw_capsvc_job_demand;
  gw->apply_heartbeat = gw_heartbeat_apply;
  /* who hears of a replica's state change: Redis (to the other gateways), then the
   * event stream (admin API, status page) */
  const unsigned joined = GW_FLEET_MASK(GW_FLEET_ADDED) | GW_FLEET_MASK(GW_FLEET_REMOVED);
  /* first: the others plan on its index */
  gw_fleet_subscribe(gw, joined | GW_FLEET_MASK(GW_FLEET_MODELS) | GW_FLEET_MASK(GW_FLEET_STATE) |
                         GW_FLEET_MASK(GW_FLEET_DRAIN), gw_models_on_fleet, NULL);
  gw_fleet_subscribe(gw, GW_FLEET_MASK(GW_FLEET_STATE) | GW_FLEET_MASK(GW_FLEET_DRAIN) |
                         GW_FLEET_MASK(GW_FLEET_RATES), gw_shared_on_fleet, NULL);
  gw_fleet_subscribe(gw, GW_FLEET_MASK(GW_FLEET_STATE), gw_events_on_fleet, NULL);
  /* progress reports may move a request; a new phone may take what waits */
  gw_fleet_subscribe(gw, GW_FLEET_MASK(GW_FLEET_PROGRESS) | GW_FLEET_MASK(GW_FLEET_ADDED),
                     gw_jobs_on_fleet, NULL);
  gw_fleet_subscribe(gw, joined, gw_drains_on_fleet, NULL); /* a joining replica gets its kept drain */
  gw_fleet_subscribe(gw, joined, gw_placement_on_fleet, NULL); /* ...and its kept placement pin */
  /* ...and what its engine may hold */
  gw_fleet_subscribe(gw, GW_FLEET_MASK(GW_FLEET_ADDED), gw_cachescope_on_fleet, NULL);
  /* when each replica is checked next */
  gw_fleet_subscribe(gw, joined | GW_FLEET_MASK(GW_FLEET_STATE) | GW_FLEET_MASK(GW_FLEET_SENT),
                     gw_health_on_fleet, NULL);
  gw_fleet_subscribe(gw, joined, conn_limits_on_fleet, NULL); /* connections kept for the fleet's size */
  /* an ended request's outcome: the access log, the key's budget, metrics, the cost ledger */
  gw_jobs_subscribe_log(gw);
  gw_jobs_subscribe(gw, gw_shared_on_job_ended, NULL);
  gw_jobs_subscribe(gw, gw_metrics_on_job_ended, NULL);
  gw_jobs_subscribe(gw, gw_cost_on_job_ended, NULL);
  gw_fleet_subscribe(gw, GW_FLEET_MASK(GW_FLEET_REMOVED), gw_engprobe_on_fleet, NULL); /* a leaving replica's feature probe ends */
  /* ...and its quarantine, if it had one (answers verified) */
  gw_fleet_subscribe(gw, GW_FLEET_MASK(GW_FLEET_ADDED), gw_verify_on_fleet, NULL);
  /* phones' stays, start-ups and idleness, and each request's answer (capacity) */
  gw_fleet_subscribe(gw, joined | GW_FLEET_MASK(GW_FLEET_STATE) | GW_FLEET_MASK(GW_FLEET_RATES) |
                         GW_FLEET_MASK(GW_FLEET_SENT), gw_capsvc_on_fleet, NULL);
  gw_jobs_subscribe(gw, gw_capsvc_on_job_ended, NULL);
  uv_prepare_init(loop, &gw->proc.log_flush);
  uv_prepare_start(&gw->proc.log_flush, log_flush_cb);
  uv_signal_init(loop, &gw->proc.sig_term);
  gw->proc.sig_term.data = gw;
  uv_signal_init(loop, &gw->proc.sig_int);
  gw->proc.sig_int.data = gw;
  uv_signal_init(loop, &gw->proc.sig_hup);
  gw->proc.sig_hup.data = gw;

  int rc;
  const char *rec = getenv("FLEETGATE_RECORD_PLANS");
  if (rec && *rec) {
    rc = gw_planrec_open(&gw->planrec, rec);
    if (rc) {
      pr_error("FLEETGATE_RECORD_PLANS=%s: %s", rec, pr_strerror(rc));
      return rc;
    }
    pr_warn("recording every plan in %s (FLEETGATE_RECORD_PLANS): a debugging aid that writes "
            "on the event loop", rec);
  }
  rc = gw_admin_init(gw); /* its timer, and the metrics and events it serves */
  if (rc) return rc;
  char perr[512];
  rc = gw_pins_open(&gw->pins, conf->fleet_pins_file, perr, sizeof(perr));
  if (rc) {
    pr_error("%s", perr);
    return rc;
  }
  gw_heartbeat_token_secret(gw);
  rc = gw_drains_open(gw);
  if (rc) return rc;
  rc = gw_placement_pins_open(gw);
  if (rc) return rc;
  rc = gw_cachescope_open(gw);
  if (rc) return rc;
  rc = gw_batches_open(gw, perr, sizeof(perr));
  if (rc) {
    pr_error("the Batch API cannot start: %s", perr);
    return rc;
  }
  if (gw->batches) pr_info("batches: state in %s/batch.db", conf->data_dir);
  gw->verdict = gw_shared_publish_verdict; /* verify.c's quarantines and releases, to Redis */
  rc = gw_verify_init(gw, perr, sizeof(perr));
  if (rc) {
    pr_error("verify.canaries_file: %s", perr);
    return rc;
  }
  rc = gw_capsvc_init(gw); /* the demand's history in data_dir, the advice's timer */
  if (rc) return rc;
  if (conf->fleet_secret)
    pr_info("phone pins: %zu enrolled, %zu pending (%s)", gw_pins_count(gw->pins, GW_PIN_PINNED),
            gw_pins_count(gw->pins, GW_PIN_PENDING),
            conf->fleet_pins_file ? conf->fleet_pins_file : "in memory: fleet.pins_file keeps them");
  rc = pr_curlm_new(&gw->curlm, loop);
  if (rc) return rc;
  /* every connection to a replica (requests, probes, /props) passes the URL policy */
  pr_curlm_set_gate(gw->curlm, gw_url_gate, gw);
  /* Descriptors (the limit main.c raised to the hard one): never accept more clients than
   * there are descriptors for them and for the phone connections their requests open
   * (HAProxy derives maxconn the same way): the rest wait in the listen queue. A reserve
   * stays for listeners, logs, Redis, health probes and gw_idle_conn_cap kept-alive phone
   * connections. */
  struct rlimit nofile;
  gw->proc.nofile = 0;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY)
    gw->proc.nofile = (uint64_t)nofile.rlim_cur;
  conn_limits(gw); /* again as the fleet grows (conn_limits_on_fleet) */
  cJSON *changes = cJSON_CreateObject();
  rc = gw_registry_apply(gw, conf, changes);
  if (!rc) rc = gw_models_configure(&gw->models, conf->models, conf->n_models, uv_now(loop));
  cJSON_Delete(changes);
  if (rc) return rc;
  gw_auth_apply(gw, conf);
  rc = apply_listeners(gw, conf);
  if (!rc) rc = gw_admin_prepare(gw, conf);
  if (rc) return rc;
  gw_admin_commit(gw);
  rc = gw_shared_start(gw);
  if (rc) return rc;
  uv_timer_start(&gw->tick, tick_cb, GW_TICK_MS, GW_TICK_MS);
  uv_signal_start(&gw->proc.sig_term, on_signal, SIGTERM);
  uv_signal_start(&gw->proc.sig_int, on_signal, SIGINT);
  uv_signal_start(&gw->proc.sig_hup, on_signal, SIGHUP);
  watch_dir(gw, conf);
  if (conf->n_keys)
    pr_info("fleetgate %s serving %zu replica(s) to %zu API key(s)", FLEETGATE_VERSION,
            gw->n_replicas, conf->n_keys);
  else
    pr_warn("fleetgate %s serving %zu replica(s) WITHOUT api_keys: the gateway is open to "
            "anyone who can reach it",
            FLEETGATE_VERSION, gw->n_replicas);
  return 0;
}

int gw_server_run(gw_server *gw) { return uv_run(gw->loop, UV_RUN_DEFAULT); }

void gw_server_free(gw_server *gw) {
  gw_health_free(gw);
  pr_idmap_clear(&gw->reg.ids);
  for (size_t i = 0; i < gw->n_replicas; i++) gw_replica_free(gw->replicas[i]);
  free(gw->replicas);
  gw_registry_refused_free(gw);
  for (size_t i = 0; i < gw->proc.n_http; i++) free(gw->proc.http_addr ? gw->proc.http_addr[i] : NULL);
  free(gw->proc.http_addr);
  free(gw->proc.http);
  free(gw->proc.retired);
  free(gw->proc.watched_dir);
  gw_auth_free(gw);
  gw_verify_free(gw);
  gw_admin_free(gw);
  gw_capsvc_free(gw);
  gw_pins_close(gw->pins);
  gw->pins = NULL;
  gw_drains_free(gw);
  gw_placement_pins_free(gw);
  gw_cachescope_free(gw);
  gw_models_free(&gw->models);
  gw_sched_free(gw->sched);
  gw->sched = NULL;
  gw_planrec_close(gw->planrec);
  gw->planrec = NULL;
  gw_config_unref(gw->conf);
  gw->conf = NULL;
}
