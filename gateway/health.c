/* Active health checks and heartbeat freshness, scheduled by a heap; see health.h. */
#include "health.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>

#include <openssl/rand.h>

#include "curlreq.h"
#include "json.h"
#include "log.h"
#include "healthsched.h"
#include "engprobe.h"
#include "registry.h"

#define GW_PROBE_MAX_BODY (256u << 10)
/* curl's receive buffer per probe (16 KiB by default): a status is a few hundred bytes,
 * and at a start every phone is probed at about the same time */
#define GW_PROBE_RECV_BUFFER 2048L
/* New replicas' first probes go out at most this many a second: a gateway starting with
 * 6,000 phones would otherwise hold 6,000 probes at once (~21 KiB each, kept by the heap
 * as resident memory long after they ended), and every phone's first wake-up at once */
#define GW_HEALTH_FIRST_PER_S 1000

/* One probe in flight; owned by itself, freed when curl is done with it (or at
 * gw_health_stop). Owns its request (curlreq.h's rule). */
struct gw_probe {
  struct gw_probe *next, *prev; /* the gateway's list of probes in flight */
  gw_server *gw;
  gw_replica *r;
  pr_curlreq xfer;
  pr_buf body;
  int path;
  int local_errno;
  char errbuf[CURL_ERROR_SIZE];
};

/* The kinds of probe, in the order a replica of unknown kind is tried; PROBE_PROPS is
 * not a health check: it reads a bare llama-server's slots and context after a good one. */
enum { PROBE_AGENT = 0, PROBE_HEALTH = 1, PROBE_MODELS = 2, PROBE_PROPS = 3 };
static const char *const probe_paths[] = {"/agent/v1/status", "/health", "/v1/models", "/props"};

static size_t probe_write(char *data, size_t size, size_t nmemb, void *ud) {
  gw_probe *p = ud;
  return pr_buf_append(&p->body, data, size * nmemb) ? 0 : size * nmemb;
}

static void probe_free(gw_probe *p) {
  gw_server *gw = p->gw;
  if (p->prev) p->prev->next = p->next;
  else if (gw->health.probes == p) gw->health.probes = p->next;
  if (p->next) p->next->prev = p->prev;
  pr_curlreq_close(&p->xfer, gw->curlm);
  pr_buf_free(&p->body);
  free(p);
}

static int probe_start(gw_server *gw, gw_replica *r, int path);
static void health_schedule(gw_server *gw, gw_replica *r);

/* When r is probed next: in every seconds, or sooner while a request runs on it
 * (healthsched.h), with jitter so that phones are not woken in lockstep. */
static void probe_again(gw_server *gw, gw_replica *r, uint64_t now, double every) {
  uint16_t rnd[2];
  if (RAND_bytes((unsigned char *)rnd, sizeof(rnd)) != 1) rnd[0] = rnd[1] = 32768;
  gw_hsched_probe_ended(gw->conf, r, now, every, rnd);
}

/* An agent that stopped sending heartbeats stays out, however its probes go. */
static int heartbeat_stale(const gw_config *c, const gw_replica *r, uint64_t now) {
  return r->report.last_heartbeat_ms && (double)(now - r->report.last_heartbeat_ms) > c->heartbeat_timeout_s * 1000;
}

void gw_health_verdict(const gw_config *c, gw_replica *r, uint64_t now, int ok, int loading, const char *why) {
  snprintf(r->health.last_probe_error, sizeof(r->health.last_probe_error), "%s", ok ? "" : why);
  /* an engine that was down or loading may come back with other -np / -c settings, or
   * another build (a bare one's /props is read again, and what it serves asked again) */
  gw_replica_engine_unsure(r, !ok, loading);
  if (loading) {
    r->health.probe_ok = r->health.probe_fail = 0;
    /* a bare llama-server's own 503 Loading model (loading 2) comes only from a process that
     * just started: it holds no prompt; an agent says "loading" of an engine that stopped
     * answering for a while too (pcache.h) */
    gw_replica_engine_loading(r, now, why, loading == 2);
  } else if (ok) {
    r->health.probe_fail = 0;
    r->health.probe_ok++;
    if (r->state == GW_REPLICA_LOADING && r->health.probe_ok >= 1) {
      gw_replica_set_state(r, GW_REPLICA_READY, now, "health check passed");
    } else if (r->state == GW_REPLICA_DOWN && r->health.probe_ok >= c->rise && now >= r->down_until_ms &&
               !heartbeat_stale(c, r, now)) {
      /* one slot until a real request succeeds */
      gw_replica_probation(r, now, "health checks passed, on probation");
    }
  } else {
    r->health.probe_ok = 0;
    r->health.probe_fail++;
    r->health.probe_fail_ms = now;
    if (r->state != GW_REPLICA_DOWN && r->health.probe_fail >= c->fail_threshold) {
      char reason[160];
      snprintf(reason, sizeof(reason), "health check failed %d times: %s", r->health.probe_fail, why);
      gw_replica_take_down(r, now, now, reason, 0);
    }
  }
}

static void probe_result(gw_server *gw, gw_replica *r, int ok, int loading, const char *why) {
  const gw_config *c = gw->conf;
  uint64_t now = uv_now(gw->loop);
  const char *old = gw_replica_display_state(r);
  gw_health_verdict(c, r, now, ok, loading, why);
  gw_registry_event(gw, r, old);
  double every = r->state == GW_REPLICA_DOWN ? c->health_down_interval_s
                 : gw_hsched_idle_interval_s(c, gw->n_replicas);
  probe_again(gw, r, now, every);
  gw_plan_soon(gw);
}

static void probe_judge(gw_probe *p, CURLcode rc);

/* A probe ended: judged (probe_judge, which frees it or starts the next kind), and its
 * replica's next visit scheduled. */
static void probe_done(CURL *easy, CURLcode rc, void *ud) {
  (void)easy;
  gw_probe *p = ud;
  gw_server *gw = p->gw;
  gw_replica *r = p->r;
  /* any answer at all is proof that the phone is there */
  if (rc == CURLE_OK) gw_replica_alive(r, uv_now(gw->loop));
  probe_judge(p, rc);
  health_schedule(gw, r);
}

static void probe_judge(gw_probe *p, CURLcode rc) {
  gw_server *gw = p->gw;
  gw_replica *r = p->r;
  uint64_t took = r->health.probe_start_ms ? uv_now(gw->loop) - r->health.probe_start_ms : 0;
  int was_late = r->health.probe_late_ms != 0;
  double late_ms = was_late ? gw_hsched_probe_late_ms(r, gw->conf->health_late_s, gw->conf->health_timeout_s) : 0;
  gw_hsched_probe_over(r);
  if (gw->shutting_down) {
    probe_free(p);
    return;
  }
  long st = pr_curlreq_status(&p->xfer);
  if (rc == CURLE_OK && st == 200 && p->path != PROBE_PROPS) gw_hsched_probe_took(r, (double)took, late_ms);
  if (was_late && rc == CURLE_OK)
    pr_info("replica %s: its late health check answered after %.2f s", r->id, (double)took / 1000.0);
  const char *body = pr_buf_cstr(&p->body);
  char why[400];
  if (p->path == PROBE_PROPS) {
    /* llama-server's total_slots and per-slot context; a server without /props (not
     * llama-server) is not asked again */
    gw_replica_props_due(r, 0);
    cJSON *o = rc == CURLE_OK && st == 200 ? cJSON_ParseWithLength(p->body.data ? p->body.data : "", p->body.len) : NULL;
    const cJSON *dg = o ? cJSON_GetObjectItemCaseSensitive(o, "default_generation_settings") : NULL;
    double slots = pr_json_num_or(o, "total_slots", 1, GW_MAX_SLOTS * 16.0, -1);
    double n_ctx = pr_json_num_or(dg, "n_ctx", 1, (double)(INT64_C(1) << 30), -1);
    /* a llama-server: its build, and what it serves (engprobe.c asks, once per process);
     * anything else serves what every engine does */
    const cJSON *bi = o ? cJSON_GetObjectItemCaseSensitive(o, "build_info") : NULL;
    if (cJSON_IsString(bi)) gw_replica_set_build(r, bi->valuestring);
    if (o && dg && !r->feat_known) gw_engprobe_start(gw, r);
    else if (!o && !r->feat_known) {
      gw_replica_set_features(r, r->features, r->choices_max);
      gw_plan_soon(gw);
    }
    if (o && gw_replica_learn_shape(r, (int64_t)slots, (int64_t)n_ctx)) {
      cJSON *f = cJSON_CreateObject();
      cJSON_AddStringToObject(f, "replica", r->id);
      cJSON_AddNumberToObject(f, "slots", r->slots);
      cJSON_AddNumberToObject(f, "n_ctx", (double)r->n_ctx);
      pr_log_kv(PR_LOG_INFO, "replica shape from /props", f);
      gw_plan_soon(gw);
    }
    cJSON_Delete(o);
    probe_free(p);
    return;
  }
  if (rc != CURLE_OK && gw_local_errno(p->local_errno)) {
    /* the gateway, not the phone, is short of descriptors: no verdict, try again later */
    probe_again(gw, r, uv_now(gw->loop), gw_hsched_idle_interval_s(gw->conf, gw->n_replicas));
  } else if (rc != CURLE_OK) {
    snprintf(why, sizeof(why), "%s %s", probe_paths[p->path], pr_curlreq_error(&p->xfer, rc));
    /* the URL policy refused its address: no probe can pass, so it is down at once */
    if (pr_curlreq_refused(&p->xfer)) gw_registry_address_refused(gw, r, pr_curlreq_refused(&p->xfer));
    probe_result(gw, r, 0, 0, why);
  } else if ((st == 404 || st == 405) && p->path < PROBE_MODELS) {
    /* this server lacks that endpoint: try the next kind of probe at once */
    r->health.probe_path = p->path + 1;
    int next = p->path + 1;
    probe_free(p);
    if (probe_start(gw, r, next) < 0) probe_result(gw, r, 0, 0, "cannot start a probe");
    return;
  } else if (st == 503 && strstr(body, "Loading model")) {
    probe_result(gw, r, 0, p->path != 0 && !r->ident.agent && !r->pc.agent ? 2 : 1, "503 Loading model");
  } else if (st == 200 && p->path == 0) {
    /* the agent's status says whether its engine is ready */
    cJSON *o = cJSON_ParseWithLength(p->body.data ? p->body.data : "", p->body.len);
    const cJSON *es = o ? cJSON_GetObjectItemCaseSensitive(o, "engine_state") : NULL;
    if (cJSON_IsString(es) && strcmp(es->valuestring, "ready") != 0) {
      snprintf(why, sizeof(why), "agent reports engine %s", es->valuestring);
      probe_result(gw, r, 0, strcmp(es->valuestring, "loading") == 0, why);
    } else {
      gw_replica_learn_shape(r, (int64_t)pr_json_num_or(o, "slots", 1, 1e6, -1),
                             (int64_t)pr_json_num_or(o, "n_ctx", 1, 1e12, -1));
      /* the agent keeps callers' cache scopes apart itself (pcache.h): "slots" or "engine" */
      const cJSON *iso = cJSON_GetObjectItemCaseSensitive(o, "cache_isolation");
      r->pc.agent = !cJSON_IsString(iso) ? 0 : strcmp(iso->valuestring, "slots") == 0 ? 1
                    : strcmp(iso->valuestring, "engine") == 0 ? 2 : 0;
      /* what its engine is and serves (feat.h): unknown until the agent has asked it */
      if (gw_replica_take_features(r, cJSON_GetObjectItemCaseSensitive(o, "engine_features"),
                                   cJSON_GetObjectItemCaseSensitive(o, "engine_build")))
        gw_plan_soon(gw); /* what waited to know what it serves may go, or be refused */
      probe_result(gw, r, 1, 0, "");
      /* what each request on the phone has got to: may move one off a phone that slowed */
      if (r->state == GW_REPLICA_READY)
        gw_fleet_publish(gw, &(gw_fleet_event){.kind = GW_FLEET_PROGRESS, .r = r,
                                                .running = cJSON_GetObjectItemCaseSensitive(o, "running"),
                                                .now_ms = uv_now(gw->loop)});
    }
    cJSON_Delete(o);
  } else if (st == 200) {
    probe_result(gw, r, 1, 0, "");
    if (p->path == PROBE_HEALTH && r->props_due) {
      probe_free(p);
      if (probe_start(gw, r, PROBE_PROPS) < 0) gw_replica_props_due(r, 0);
      return;
    }
  } else {
    snprintf(why, sizeof(why), "%s answered HTTP %ld", probe_paths[p->path], st);
    probe_result(gw, r, 0, 0, why);
  }
  probe_free(p);
}

static int probe_start(gw_server *gw, gw_replica *r, int path) {
  const gw_config *c = gw->conf;
  gw_probe *p = calloc(1, sizeof(*p));
  if (!p) return -ENOMEM;
  p->gw = gw;
  p->r = r;
  p->path = path;
  pr_buf_init(&p->body, GW_PROBE_MAX_BODY);
  const pr_curlreq_opts o = {
      .base = r->url,
      .path = probe_paths[path],
      .bearer = r->token,
      .write_fn = probe_write,
      .write_ud = p,
      .errbuf = p->errbuf,
      .local_errno = &p->local_errno,
      .timeout_ms = (long)(c->health_timeout_s * 1000),
      .connect_timeout_ms = (long)(c->health_timeout_s * 1000),
      .insecure = !c->tls_verify,
      .ca_file = c->ca_file,
      .user_agent = "fleetgate/" FLEETGATE_VERSION " health",
      .buffer_size = GW_PROBE_RECV_BUFFER,
  };
  if (pr_curlreq_open(&p->xfer, gw->curlm, &o) < 0 ||
      pr_curlm_add(gw->curlm, p->xfer.easy, probe_done, p) < 0) {
    probe_free(p);
    return -ENOMEM;
  }
  gw_hsched_probe_sent(r, uv_now(gw->loop), path != PROBE_PROPS);
  if (path != PROBE_PROPS) gw->health.n_probes++;
  p->next = gw->health.probes;
  if (gw->health.probes) gw->health.probes->prev = p;
  gw->health.probes = p;
  return 0;
}

/* r's probe turned late (gw_hsched_late), nothing else heard from it meanwhile: r is
 * suspect until the probe ends (gw_replica_suspect), so what waits there hedges
 * (gw_jobs_hedge, after the visits) and new work goes elsewhere. */
static void probe_late(void *ud, gw_replica *r, uint64_t now) {
  gw_server *gw = ud;
  /* a phone marked down (or loading) is not suspect: its late probes are kept for the
   * hedge of a request still on it (hedge_suspect), but said only when that matters */
  if (r->state != GW_REPLICA_READY && r->inflight <= 0) return;
  double after = gw_hsched_probe_late_ms(r, gw->conf->health_late_s, gw->conf->health_timeout_s);
  snprintf(r->health.last_probe_error, sizeof(r->health.last_probe_error), "health check unanswered after %.2f s",
           (double)(now - r->health.probe_start_ms) / 1000.0);
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "replica", r->id);
  cJSON_AddNumberToObject(f, "waited_s", (double)(now - r->health.probe_start_ms) / 1000.0);
  cJSON_AddNumberToObject(f, "late_after_s", round(after) / 1000.0);
  cJSON_AddNumberToObject(f, "inflight", r->inflight);
  pr_log_kv(PR_LOG_INFO, "health check late: replica suspect", f);
  gw_plan_soon(gw);
}

/* Its heartbeats stopped: out of rotation, whatever its probes say. */
static void heartbeat_overdue(void *ud, gw_replica *r, uint64_t now) {
  gw_server *gw = ud;
  const char *old = gw_replica_display_state(r);
  char reason[96];
  snprintf(reason, sizeof(reason), "no heartbeat for %.0f s", (double)(now - r->report.last_heartbeat_ms) / 1000.0);
  gw_replica_take_down(r, now, now, reason, 0);
  /* a replica from a file goes back to what the file and the probes say of it: it is
   * not kept out for good by heartbeats that stopped (or were never its own) */
  if (r->ident.from_file) {
    r->ident.from_heartbeat = 0;
    r->report.last_heartbeat_ms = 0;
  }
  gw_registry_event(gw, r, old);
}

/* A probe is due: the agent's status for an agent, else the kind that answered last. */
static int probe_due_now(void *ud, gw_replica *r, uint64_t now) {
  gw_server *gw = ud;
  int path = r->health.probe_path ? r->health.probe_path : (r->ident.agent || r->ident.from_heartbeat ? 0 : 1);
  int rc = probe_start(gw, r, path);
  if (rc < 0) probe_again(gw, r, now, gw_hsched_idle_interval_s(gw->conf, gw->n_replicas));
  return rc;
}

static const gw_hsched_ops health_ops = {
    .probe = probe_due_now,
    .late = probe_late,
    .heartbeat_overdue = heartbeat_overdue,
};

/* Arm the health timer for the earliest moment in the heap, unless it fires sooner. */
static void health_timer_cb(uv_timer_t *t);
static void health_arm(gw_server *gw) {
  if (gw->shutting_down || uv_is_closing((uv_handle_t *)&gw->health.timer)) return;
  uint64_t at = gw_hsched_earliest(&gw->health.heap);
  if (at == GW_HSCHED_NEVER) {
    uv_timer_stop(&gw->health.timer);
    return;
  }
  if (uv_is_active((uv_handle_t *)&gw->health.timer) && gw->health.due_ms <= at) return;
  uint64_t now = uv_now(gw->loop);
  gw->health.due_ms = at;
  uv_timer_start(&gw->health.timer, health_timer_cb, at > now ? at - now : 0, 0);
}

static void health_schedule(gw_server *gw, gw_replica *r) {
  gw_hsched_update(&gw->health.heap, gw->conf, r);
  health_arm(gw);
}

static void health_timer_cb(uv_timer_t *t) {
  gw_server *gw = t->data;
  uint64_t now = uv_now(gw->loop);
  if (gw->shutting_down) return;
  int late = gw_hsched_run(&gw->health.heap, gw->conf, now, gw->curlm != NULL, &health_ops, gw,
                           &gw->health.n_visits);
  if (late > 0) gw_jobs_hedge(gw, now); /* what waits on a late phone */
  health_arm(gw);
}

void gw_health_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  gw_replica *r = ev->r;
  switch (ev->kind) {
    case GW_FLEET_ADDED:
      if (gw_hsched_add(&gw->health.heap, r) < 0) {
        pr_error("replica %s: out of memory: its health is not checked", r->id);
        return;
      }
      if (!r->health.next_probe_ms) { /* never probed: its first probe in turn */
        uint64_t now = uv_now(gw->loop);
        if (gw->health.first_ms < now) gw->health.first_ms = now;
        /* in slots of 100 ms, as later probes (healthsched.c): one wake-up for each slot */
        r->health.next_probe_ms = r->health.next_busy_probe_ms = (gw->health.first_ms + 99) / 100 * 100;
        gw->health.first_ms += 1000 / GW_HEALTH_FIRST_PER_S;
      }
      health_schedule(gw, r);
      break;
    case GW_FLEET_REMOVED:
      gw_hsched_remove(&gw->health.heap, r);
      break;
    case GW_FLEET_STATE: /* checked less often while down; a busy phone more often, */
    case GW_FLEET_SENT:  /* from when it gets work */
      health_schedule(gw, r);
      break;
    case GW_FLEET_DRAIN:
    case GW_FLEET_RATES:
    case GW_FLEET_PROGRESS:
    case GW_FLEET_MODELS:
      break;
  }
}

void gw_health_heartbeat(gw_server *gw, gw_replica *r, int running) {
  gw_hsched_heartbeat(r, running);
  health_schedule(gw, r);
}

void gw_health_reconfigured(gw_server *gw) {
  for (size_t i = 0; i < gw->n_replicas; i++) gw_hsched_update(&gw->health.heap, gw->conf, gw->replicas[i]);
  health_arm(gw);
}

void gw_health_stop(gw_server *gw) {
  while (gw->health.probes) {
    gw_hsched_probe_over(gw->health.probes->r);
    probe_free(gw->health.probes);
  }
}

void gw_health_free(gw_server *gw) {
  for (size_t i = 0; i < gw->n_replicas; i++) gw->replicas[i]->health.health_at.pos = 0;
  pr_heap_free(&gw->health.heap);
}
