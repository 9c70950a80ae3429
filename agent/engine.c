/* The supervised or attached engine; see engine.h. */
#include "engine.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "conf.h"
#include "err.h"
#include "log.h"
#include "feat.h"
#include "oai.h"
#include "sse.h"

#define AG_ENGINE_PROBE_LOADING_MS 250
#define AG_ENGINE_PROBE_DOWN_MS 1000
#define AG_ENGINE_PROBE_READY_MS 5000
#define AG_ENGINE_PROBE_TIMEOUT_MS 3000L
#define AG_ENGINE_MAX_PROBE_BODY ((size_t)1 << 20)
#define AG_ENGINE_MAX_MODELS AG_REPORT_MAX_MODELS
#define AG_ENGINE_RESTART_FIRST_MS 500
/* A run this long resets the restart back-off. */
#define AG_ENGINE_STABLE_MS 60000
#define AG_ENGINE_MEASURE_TOKENS 16
#define AG_ENGINE_MEASURE_TIMEOUT_MS 300000L
#define AG_ENGINE_MAX_SSE ((size_t)1 << 20)
#define AG_ENGINE_MAX_ENV 4096

/* A started or attached llama-server is asked, once per engine process, for its /props and
 * then what it serves (feat.h): one probe after the other, before /v1/models. */
typedef enum { PROBE_HEALTH, PROBE_PROPS, PROBE_FEAT, PROBE_MODELS } probe_step;

/* The engine. Owned by its creator. Owns: copies of every configured string, the child
 * process handle (open from spawn until its close callback), three timers, the probe
 * and measure transfers in flight, and the model names learnt. */
struct ag_engine {
  uv_loop_t *loop;
  pr_curlm *curlm;         /* borrowed */
  ag_rates *rates;         /* borrowed */
  ag_engine_state_fn on_state;
  void *ud;
  ag_engine_kind kind;
  char *upstream, *api_key, *command, *threads_arg, *model;
  char **args;             /* n_args copies */
  size_t n_args;
  int tune[AG_ENGINE_MAX_TUNE];
  size_t n_tune;
  int cfg_slots;
  int64_t cfg_n_ctx;
  int want_measure;
  double ready_timeout_s, restart_max_s, stop_timeout_s;

  ag_engine_state state;
  int slots;
  int64_t n_ctx;
  char *models[AG_ENGINE_MAX_MODELS];
  size_t n_models;
  const char *health_path; /* "/health" or "/v1/models" */

  /* the child */
  uv_process_t proc;
  int proc_open;           /* handle initialised and not yet closed */
  int proc_running;        /* exited not yet seen */
  int expect_exit;         /* we asked it to stop (tuning, restart, shutdown) */
  long pid;
  unsigned restarts;
  unsigned generation;     /* engine processes started: a new one holds no prompt */
  int add_cache_ram;       /* llama-server: "--cache-ram 0" is added to its arguments */
  int ram_off;             /* it keeps no RAM prompt cache (isolate.h: slots can be named) */
  int ever_ready;          /* this process answered once */
  int props_slots;         /* the engine's /props total_slots; 0: not said */
  char build[64];          /* /props build_info ("b10587-3f545becc"); "" not said */
  char *template_caps;     /* /props chat_template_caps as JSON text; NULL not said (owned) */
  unsigned features;       /* what it serves (feat.h PR_FEAT_*), from the probes */
  int choices_max;         /* the most "n" it serves at once (1: no more than one) */
  int feat_known;          /* the probes of this engine process all answered */
  pr_feat_probe feat_i;    /* the probe in flight (PROBE_FEAT) */
  unsigned quick_exits;    /* exits in a row without a stable run: back-off exponent */
  uint64_t started_ms;
  int threads;             /* thread count passed, 0: none */

  /* tuning */
  int tuning;
  size_t tune_i;
  double tune_pre[AG_ENGINE_MAX_TUNE], tune_dec[AG_ENGINE_MAX_TUNE];

  uv_timer_t probe_timer, restart_timer, kill_timer;
  int handles_open;

  /* the probe in flight (probe.easy set while it runs) */
  pr_curlreq probe;
  probe_step step;
  pr_buf probe_body;

  /* the measurement in flight (meas.easy set while it runs) */
  pr_curlreq meas;
  pr_buf meas_req;
  pr_sse_parser meas_sse;
  ag_obs meas_obs;
  uint64_t meas_t0, meas_first, meas_last;
  int64_t meas_chunks, meas_prompt_tokens;
  int measured;

  int stopping;
  void (*on_stopped)(void *arg);
  void *stopped_arg;
};

static void engine_spawn(ag_engine *e);
static void probe_arm(ag_engine *e, uint64_t ms);
static void measure_start(ag_engine *e);
static void kill_cb(uv_timer_t *t);
static void timer_closed(uv_handle_t *h);

const char *ag_engine_state_name(ag_engine_state st) {
  switch (st) {
    case AG_ENGINE_READY: return "ready";
    case AG_ENGINE_DOWN: return "down";
    default: return "loading";
  }
}

const char *ag_engine_kind_name(ag_engine_kind k) {
  switch (k) {
    case AG_ENGINE_OPENAI: return "openai";
    case AG_ENGINE_MNN: return "mnn";
    default: return "llama";
  }
}

void ag_engine_config_default(ag_engine_config *c) {
  memset(c, 0, sizeof(*c));
  c->threads_arg = "--threads";
  c->ready_timeout_s = 600;
  c->restart_max_s = 30;
  c->stop_timeout_s = 10;
}

int ag_engine_pick_fastest(const double *prefill_tps, const double *decode_tps, size_t n) {
  int best = -1;
  double best_s = 0;
  for (size_t i = 0; i < n; i++) {
    if (!(prefill_tps[i] > 0) || !(decode_tps[i] > 0)) continue;
    double s = 1000.0 / prefill_tps[i] + 100.0 / decode_tps[i];
    if (best < 0 || s < best_s) {
      best = (int)i;
      best_s = s;
    }
  }
  return best;
}

/* ---- state ------------------------------------------------------------------------- */

static void engine_set_state(ag_engine *e, ag_engine_state st, const char *why) {
  if (e->state == st) return;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "from", ag_engine_state_name(e->state));
  cJSON_AddStringToObject(f, "to", ag_engine_state_name(st));
  cJSON_AddStringToObject(f, "reason", why);
  pr_log_kv(st == AG_ENGINE_DOWN ? PR_LOG_WARN : PR_LOG_INFO, "engine state changed", f);
  e->state = st;
  if (e->on_state && !e->stopping) e->on_state(e->ud, st);
}

/* What a failed probe means: a started engine that is still running is loading (it
 * does not listen yet); an attached one, or a dead child, is down. */
static ag_engine_state engine_not_ready_state(const ag_engine *e) {
  if (e->command) return e->proc_running ? AG_ENGINE_LOADING : AG_ENGINE_DOWN;
  return e->state == AG_ENGINE_READY ? AG_ENGINE_DOWN : e->state;
}

static void models_clear(ag_engine *e) {
  for (size_t i = 0; i < e->n_models; i++) free(e->models[i]);
  e->n_models = 0;
}

/* ---- HTTP to the engine ------------------------------------------------------------- */

void ag_engine_request(const ag_engine *e, const char *path, pr_curlreq_opts *o) {
  memset(o, 0, sizeof(*o));
  o->base = e->upstream;
  o->path = path;
  o->bearer = e->api_key;
  o->connect_timeout_ms = 2000; /* the engine is on this machine */
  o->user_agent = "fleetgate-agent/" FLEETGATE_VERSION;
}

static void probe_release(ag_engine *e) {
  pr_curlreq_close(&e->probe, e->curlm);
  pr_buf_reset(&e->probe_body);
}

static size_t probe_on_write(char *data, size_t size, size_t nmemb, void *ud) {
  ag_engine *e = ud;
  size_t n = size * nmemb;
  return pr_buf_append(&e->probe_body, data, n) == 0 ? n : 0;
}

static void probe_done(CURL *easy, CURLcode rc, void *ud);

static void probe_start(ag_engine *e, probe_step step) {
  if (e->stopping || e->probe.easy) return;
  const char *path = step == PROBE_HEALTH ? e->health_path
                     : step == PROBE_PROPS ? "/props"
                     : step == PROBE_FEAT  ? pr_feat_probe_path(e->feat_i)
                                           : "/v1/models";
  e->step = step;
  pr_buf_reset(&e->probe_body);
  pr_curlreq_opts o;
  ag_engine_request(e, path, &o);
  static const char *const json_hdr[] = {"Content-Type: application/json", NULL};
  if (step == PROBE_FEAT) {
    o.method = "POST";
    o.body = pr_feat_probe_body(e->feat_i);
    o.body_len = strlen(o.body);
    o.headers = json_hdr;
  }
  o.timeout_ms = AG_ENGINE_PROBE_TIMEOUT_MS;
  o.write_fn = probe_on_write;
  o.write_ud = e;
  if (pr_curlreq_open(&e->probe, e->curlm, &o) < 0) {
    probe_arm(e, AG_ENGINE_PROBE_DOWN_MS);
    return;
  }
  if (pr_curlm_add(e->curlm, e->probe.easy, probe_done, e) < 0) {
    probe_release(e);
    probe_arm(e, AG_ENGINE_PROBE_DOWN_MS);
  }
}

static void probe_cb(uv_timer_t *t) { probe_start(t->data, PROBE_HEALTH); }

static void probe_arm(ag_engine *e, uint64_t ms) {
  if (e->stopping) return;
  uv_timer_start(&e->probe_timer, probe_cb, ms, 0);
}

/* /props: total_slots and default_generation_settings.n_ctx. */
static void probe_take_props(ag_engine *e, const cJSON *o) {
  const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "total_slots");
  int known = cJSON_IsNumber(ts) && ts->valuedouble >= 1 && ts->valuedouble <= 4096;
  /* the engine's own count, whatever the operator says the phone should take: the slots a
   * request can name (b10587 takes an id past them modulo their count) */
  e->props_slots = known ? (int)ts->valuedouble : 0;
  if (!e->cfg_slots && known) e->slots = (int)ts->valuedouble;
  const cJSON *dg = cJSON_GetObjectItemCaseSensitive(o, "default_generation_settings");
  const cJSON *nc = cJSON_IsObject(dg) ? cJSON_GetObjectItemCaseSensitive(dg, "n_ctx") : NULL;
  if (!e->cfg_n_ctx && cJSON_IsNumber(nc) && nc->valuedouble >= 1 && nc->valuedouble < 1e9)
    e->n_ctx = (int64_t)nc->valuedouble;
  /* which build, and what its chat template can do (reported as they are, for operators) */
  const cJSON *bi = cJSON_GetObjectItemCaseSensitive(o, "build_info");
  e->build[0] = '\0';
  if (cJSON_IsString(bi)) {
    size_t k = 0;
    for (const char *c = bi->valuestring; *c && k + 1 < sizeof(e->build); c++)
      if (*c > 0x20 && *c < 0x7f) e->build[k++] = *c; /* printable only: it goes into a report */
    e->build[k] = '\0';
  }
  free(e->template_caps);
  e->template_caps = NULL;
  const cJSON *caps = cJSON_GetObjectItemCaseSensitive(o, "chat_template_caps");
  if (cJSON_IsObject(caps)) {
    cJSON *keep = cJSON_CreateObject(); /* booleans only, at most 32 */
    const cJSON *it;
    int n = 0;
    cJSON_ArrayForEach(it, caps) {
      if (n++ >= 32 || !it->string || strlen(it->string) > 64 || !cJSON_IsBool(it)) continue;
      cJSON_AddBoolToObject(keep, it->string, cJSON_IsTrue(it));
    }
    e->template_caps = cJSON_PrintUnformatted(keep);
    cJSON_Delete(keep);
  }
}

/* /v1/models: data[].id (and llama-server's data[].meta.n_ctx when /props said none). */
static void probe_take_models(ag_engine *e, const cJSON *o) {
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(o, "data");
  if (!cJSON_IsArray(data)) return;
  if (!e->model) models_clear(e);
  const cJSON *d;
  cJSON_ArrayForEach(d, data) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(d, "id");
    if (!e->model && cJSON_IsString(id) && id->valuestring[0] && e->n_models < AG_ENGINE_MAX_MODELS) {
      char *s = strndup(id->valuestring, 256);
      if (s) e->models[e->n_models++] = s;
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(d, "meta");
    const cJSON *nc = cJSON_IsObject(meta) ? cJSON_GetObjectItemCaseSensitive(meta, "n_ctx") : NULL;
    if (!e->cfg_n_ctx && e->n_ctx <= 0 && cJSON_IsNumber(nc) && nc->valuedouble >= 1 && nc->valuedouble < 1e9)
      e->n_ctx = (int64_t)nc->valuedouble;
  }
}

static void engine_became_ready(ag_engine *e) {
  if (e->meas.easy) return; /* a measurement runs: it decides */
  if (!e->slots) e->slots = 1;
  if (e->tuning || (e->want_measure && !e->measured)) {
    /* measure before taking work: the answer must be the engine's alone */
    measure_start(e);
    return;
  }
  e->ever_ready = 1;
  engine_set_state(e, AG_ENGINE_READY, "the engine answers");
  probe_arm(e, AG_ENGINE_PROBE_READY_MS);
}

static void probe_done(CURL *easy, CURLcode rc, void *ud) {
  (void)easy;
  ag_engine *e = ud;
  long st = pr_curlreq_status(&e->probe);
  pr_curlreq_close(&e->probe, e->curlm);
  if (e->stopping) return;
  cJSON *o = st == 200 ? cJSON_ParseWithLength(e->probe_body.data ? e->probe_body.data : "", e->probe_body.len) : NULL;
  probe_step step = e->step;
  char why[160];

  if (step == PROBE_HEALTH) {
    int models_path = strcmp(e->health_path, "/v1/models") == 0;
    if (rc == CURLE_OK && (st == 404 || st == 405) && !models_path && e->kind == AG_ENGINE_OPENAI) {
      /* no /health on this server: ask /v1/models from now on */
      e->health_path = "/v1/models";
      cJSON_Delete(o);
      probe_start(e, PROBE_HEALTH);
      return;
    }
    if (rc == CURLE_OK && st == 200) {
      if (e->state == AG_ENGINE_READY || e->meas.easy) {
        probe_arm(e, AG_ENGINE_PROBE_READY_MS);
      } else if (models_path) {
        probe_take_models(e, o);
        engine_became_ready(e);
      } else {
        probe_start(e, e->kind == AG_ENGINE_MNN ? PROBE_MODELS : PROBE_PROPS);
      }
      cJSON_Delete(o);
      return;
    }
    if (rc == CURLE_OK && st == 503) {
      snprintf(why, sizeof(why), "%s answers 503 (loading)", e->health_path);
      engine_set_state(e, e->command && !e->proc_running ? AG_ENGINE_DOWN : AG_ENGINE_LOADING, why);
    } else {
      if (rc != CURLE_OK) snprintf(why, sizeof(why), "%s: %s", e->health_path, curl_easy_strerror(rc));
      else snprintf(why, sizeof(why), "%s answers HTTP %ld", e->health_path, st);
      engine_set_state(e, engine_not_ready_state(e), why);
    }
    cJSON_Delete(o);
    if (e->command && e->proc_running && e->state == AG_ENGINE_LOADING && e->ready_timeout_s > 0 &&
        uv_now(e->loop) - e->started_ms > (uint64_t)(e->ready_timeout_s * 1000)) {
      /* loading forever is a failure like a crash: kill it, the exit restarts it */
      pr_warn("the engine (pid %ld) is not ready after %.0f s: killing it", e->pid, e->ready_timeout_s);
      uv_process_kill(&e->proc, SIGKILL);
      return;
    }
    probe_arm(e, e->state == AG_ENGINE_LOADING ? AG_ENGINE_PROBE_LOADING_MS : AG_ENGINE_PROBE_DOWN_MS);
    return;
  }
  if (step == PROBE_PROPS) {
    if (o) probe_take_props(e, o); /* a server without /props keeps the defaults */
    cJSON_Delete(o);
    if (e->kind == AG_ENGINE_LLAMA && !e->feat_known) {
      /* what this engine serves: asked of every llama-server process once (feat.h) */
      e->feat_i = 0;
      e->features = 0;
      e->choices_max = 1;
      probe_start(e, PROBE_FEAT);
      return;
    }
    probe_start(e, PROBE_MODELS);
    return;
  }
  if (step == PROBE_FEAT) {
    int choices = 1;
    int v = rc == CURLE_OK ? pr_feat_probe_read(e->feat_i, st, e->probe_body.data, e->probe_body.len, &choices)
                           : -1;
    cJSON_Delete(o);
    if (v < 0) {
      /* no verdict (it is loading, or failed): asked again at the next readiness check */
      probe_arm(e, AG_ENGINE_PROBE_LOADING_MS);
      return;
    }
    if (v) e->features |= pr_feat_probe_bit(e->feat_i);
    if (e->feat_i == PR_FEAT_PROBE_CHOICES) e->choices_max = v ? choices : 1;
    if (++e->feat_i < PR_FEAT_PROBES) {
      probe_start(e, PROBE_FEAT);
      return;
    }
    e->feat_known = 1;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "build", e->build);
    cJSON_AddNumberToObject(f, "choices", e->choices_max);
    cJSON_AddBoolToObject(f, "continue_final_message", (e->features & PR_FEAT_CONTINUE) != 0);
    cJSON_AddBoolToObject(f, "responses", (e->features & PR_FEAT_RESPONSES) != 0);
    cJSON_AddBoolToObject(f, "cache_checkpoints", (e->features & PR_FEAT_CHECKPOINTS) != 0);
    pr_log_kv(PR_LOG_INFO, "engine features", f);
    probe_start(e, PROBE_MODELS);
    return;
  }
  /* PROBE_MODELS */
  if (o) probe_take_models(e, o);
  cJSON_Delete(o);
  if (rc == CURLE_OK && st == 200) {
    engine_became_ready(e);
  } else {
    probe_arm(e, AG_ENGINE_PROBE_LOADING_MS);
  }
}

void ag_engine_suspect(ag_engine *e) {
  if (!e || e->stopping || e->probe.easy) return;
  probe_arm(e, 0);
}

/* ---- measuring ---------------------------------------------------------------------- */

static void measure_release(ag_engine *e) {
  pr_curlreq_close(&e->meas, e->curlm);
  pr_buf_reset(&e->meas_req);
  pr_sse_reset(&e->meas_sse);
}

static int measure_on_event(void *ud, const pr_sse_event *ev) {
  ag_engine *e = ud;
  if (ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0) return 0;
  cJSON *root = cJSON_ParseWithLength(ev->data, ev->data_len);
  if (!root) return 0;
  ag_obs_take(&e->meas_obs, root);
  if (pr_oai_chunk_text(root) || pr_oai_chunk_reasoning(root)) { /* a thinking model's tokens count */
    uint64_t now = uv_hrtime();
    if (!e->meas_first) e->meas_first = now;
    e->meas_last = now;
    e->meas_chunks++;
  }
  cJSON_Delete(root);
  return 0;
}

static size_t measure_on_write(char *data, size_t size, size_t nmemb, void *ud) {
  ag_engine *e = ud;
  size_t n = size * nmemb;
  if (pr_sse_feed(&e->meas_sse, data, n) < 0) return 0;
  /* MNN ignores max_tokens: stop it ourselves once we have enough */
  if (e->meas_chunks >= AG_ENGINE_MEASURE_TOKENS + 1 && e->meas_obs.predicted_ms < 0) return 0;
  return n;
}

static void measure_finish(ag_engine *e, double pre, double dec) {
  if (e->tuning) {
    e->tune_pre[e->tune_i] = pre;
    e->tune_dec[e->tune_i] = dec;
    pr_info("tuning: %d threads: prefill %.1f tok/s, decode %.1f tok/s", e->threads, pre, dec);
    /* stop this run; the exit callback starts the next one */
    e->expect_exit = 1;
    if (e->proc_running) {
      uv_process_kill(&e->proc, SIGTERM);
      uv_timer_start(&e->kill_timer, kill_cb, (uint64_t)(e->stop_timeout_s * 1000), 0);
    }
    return;
  }
  e->measured = 1;
  if (pre > 0 || dec > 0) {
    ag_rates_observe(e->rates, pre > 0 ? 1000 : 0, pre > 0 ? 1000.0 * 1000.0 / pre : 0,
                     dec > 0 ? 1000 : 0, dec > 0 ? 1000.0 * 1000.0 / dec : 0);
    pr_info("measured the engine: prefill %.1f tok/s, decode %.1f tok/s", pre, dec);
  } else {
    pr_warn("could not measure the engine (no timings and no tokens in its answer)");
  }
  e->ever_ready = 1;
  engine_set_state(e, AG_ENGINE_READY, "the engine answers");
  probe_arm(e, AG_ENGINE_PROBE_READY_MS);
}

static void measure_done(CURL *easy, CURLcode rc, void *ud) {
  (void)easy;
  ag_engine *e = ud;
  long st = pr_curlreq_status(&e->meas);
  pr_curlreq_close(&e->meas, e->curlm);
  if (e->stopping) return;
  double pre = -1, dec = -1;
  const ag_obs *o = &e->meas_obs;
  if (o->prompt_ms > 0 && o->prompt_n >= 1) pre = o->prompt_n * 1000.0 / o->prompt_ms;
  if (o->predicted_ms > 0 && o->predicted_n >= 1) dec = o->predicted_n * 1000.0 / o->predicted_ms;
  /* no timings (MNN, other servers): the time to the first token is the prefill */
  if (pre < 0 && e->meas_first > e->meas_t0)
    pre = (double)e->meas_prompt_tokens * 1e9 / (double)(e->meas_first - e->meas_t0);
  if (dec < 0 && e->meas_chunks > 1 && e->meas_last > e->meas_first)
    dec = (double)(e->meas_chunks - 1) * 1e9 / (double)(e->meas_last - e->meas_first);
  if (st != 200) {
    pr_warn("measuring: the engine answered HTTP %ld (%s)", st, curl_easy_strerror(rc));
    pre = dec = -1;
  }
  pr_sse_reset(&e->meas_sse);
  measure_finish(e, pre, dec);
}

static void measure_start(ag_engine *e) {
  ag_obs_init(&e->meas_obs);
  e->meas_first = e->meas_last = 0;
  e->meas_chunks = 0;
  pr_buf_reset(&e->meas_req);
  /* A fresh prompt each time (the nonce) so no prefix cache shortens the prefill. */
  unsigned nonce = (unsigned)(uv_hrtime() & 0xffffff);
  int rc = pr_buf_appendf(&e->meas_req,
    "{\"model\":\"%s\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
    "\"cache_prompt\":false,\"max_tokens\":%d,\"messages\":[{\"role\":\"user\",\"content\":"
    "\"[%06x] Measure how fast you read and write. Count slowly from one to twenty in words, "
    "one number per line, and then describe a quiet river at dawn in a few short sentences, "
    "mentioning the light, the water, the birds and the stones along the bank.\"}]}",
    e->n_models ? e->models[0] : "default", AG_ENGINE_MEASURE_TOKENS, nonce);
  /* characters / 4, as the gateway estimates */
  e->meas_prompt_tokens = (int64_t)(e->meas_req.len / 4);
  static const char *const hdrs[] = {"Content-Type: application/json", NULL};
  pr_curlreq_opts o;
  ag_engine_request(e, "/v1/chat/completions", &o);
  o.headers = hdrs;
  o.body = e->meas_req.data;
  o.body_len = e->meas_req.len;
  o.timeout_ms = AG_ENGINE_MEASURE_TIMEOUT_MS;
  o.write_fn = measure_on_write;
  o.write_ud = e;
  if (rc < 0 || pr_curlreq_open(&e->meas, e->curlm, &o) < 0) {
    measure_release(e);
    measure_finish(e, -1, -1);
    return;
  }
  e->meas_t0 = uv_hrtime();
  if (pr_curlm_add(e->curlm, e->meas.easy, measure_done, e) < 0) {
    measure_release(e);
    measure_finish(e, -1, -1);
  }
}

/* ---- the child process --------------------------------------------------------------- */

static void proc_closed(uv_handle_t *h) {
  ag_engine *e = h->data;
  e->proc_open = 0;
  e->handles_open--;
  if (e->stopping && e->handles_open == 0 && e->on_stopped) e->on_stopped(e->stopped_arg);
}

static void restart_cb(uv_timer_t *t) {
  ag_engine *e = t->data;
  if (e->stopping) return;
  if (e->proc_open) { /* the old handle is still closing */
    uv_timer_start(&e->restart_timer, restart_cb, 20, 0);
    return;
  }
  engine_spawn(e);
}

static void kill_cb(uv_timer_t *t) {
  ag_engine *e = t->data;
  if (!e->proc_running) return;
  pr_warn("the engine (pid %ld) ignored SIGTERM for %.0f s: SIGKILL", e->pid, e->stop_timeout_s);
  uv_process_kill(&e->proc, SIGKILL);
}

/* What to do after the tuning runs: the best thread count, for good. */
static void tune_next(ag_engine *e) {
  e->tune_i++;
  if (e->tune_i < e->n_tune) {
    e->threads = e->tune[e->tune_i];
    return;
  }
  int best = ag_engine_pick_fastest(e->tune_pre, e->tune_dec, e->n_tune);
  e->tuning = 0;
  e->threads = best >= 0 ? e->tune[best] : e->tune[0];
  pr_info("tuning done: keeping %d threads", e->threads);
  if (best >= 0) {
    /* the tuning run already measured this configuration */
    ag_rates_observe(e->rates, 1000, 1e6 / e->tune_pre[best], 1000, 1e6 / e->tune_dec[best]);
    e->measured = 1;
  }
}

static void proc_exit_cb(uv_process_t *p, int64_t status, int sig) {
  ag_engine *e = p->data;
  e->proc_running = 0;
  uv_timer_stop(&e->kill_timer);
  uv_close((uv_handle_t *)p, proc_closed);
  measure_release(e);
  probe_release(e);
  uv_timer_stop(&e->probe_timer);
  cJSON *f = cJSON_CreateObject();
  cJSON_AddNumberToObject(f, "pid", (double)e->pid);
  cJSON_AddNumberToObject(f, "exit_status", (double)status);
  cJSON_AddNumberToObject(f, "signal", sig);
  pr_log_kv(e->expect_exit ? PR_LOG_INFO : PR_LOG_WARN, "engine exited", f);
  e->pid = 0;
  if (e->stopping) {
    if (!uv_is_closing((uv_handle_t *)&e->kill_timer)) uv_close((uv_handle_t *)&e->kill_timer, timer_closed);
    return;
  }
  uint64_t delay = AG_ENGINE_RESTART_FIRST_MS;
  if (e->add_cache_ram && !e->ever_ready && status != 0 && !e->expect_exit) {
    /* a llama-server older than its RAM prompt cache refuses the option ("invalid
     * argument: --cache-ram") and exits at once: without it, the whole engine counts for
     * keeping callers apart (isolate.h), since it cannot be told apart from a newer one
     * that failed for another reason */
    e->add_cache_ram = 0;
    e->ram_off = 0;
    pr_warn("the engine exited before answering with --cache-ram 0: started again without it "
            "(an older llama-server); callers are kept apart on the whole engine");
    delay = 0;
    uv_timer_start(&e->restart_timer, restart_cb, delay, 0);
    return;
  }
  if (e->expect_exit) {
    e->expect_exit = 0;
    if (e->tuning) tune_next(e);
    delay = 0;
  } else {
    uint64_t ran = uv_now(e->loop) - e->started_ms;
    if (ran >= AG_ENGINE_STABLE_MS) e->quick_exits = 0;
    for (unsigned i = 0; i < e->quick_exits && delay < (uint64_t)(e->restart_max_s * 1000); i++) delay *= 2;
    if (delay > (uint64_t)(e->restart_max_s * 1000)) delay = (uint64_t)(e->restart_max_s * 1000);
    e->quick_exits++;
    e->restarts++;
    char why[96];
    snprintf(why, sizeof(why), "the engine process exited; restart in %.1f s", (double)delay / 1000.0);
    engine_set_state(e, AG_ENGINE_DOWN, why);
  }
  uv_timer_start(&e->restart_timer, restart_cb, delay, 0);
}

/* The agent's environment without its secrets: main.c took them out of it at start
 * (ag_secrets_take), and a variable set since is left out here too, so the engine never
 * sees the replica token, the fleet secret, the phone's or the tunnel's private key, or
 * the engine's API key. The array is malloc'd; its strings are environ's. */
static char **engine_env(const ag_engine *e) {
  (void)e;
  extern char **environ;
  size_t n = 0;
  while (environ[n] && n < AG_ENGINE_MAX_ENV) n++;
  char **env = calloc(n + 1, sizeof(char *));
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (!ag_secrets_is_secret_entry(environ[i])) env[k++] = environ[i];
  env[k] = NULL;
  return env;
}

static void engine_spawn(ag_engine *e) {
  char *argv[AG_ENGINE_MAX_ARGS + 6];
  char threads[16];
  size_t n = 0;
  argv[n++] = e->command;
  for (size_t i = 0; i < e->n_args; i++) argv[n++] = e->args[i];
  if (e->add_cache_ram) {
    argv[n++] = "--cache-ram";
    argv[n++] = "0";
  }
  if (e->threads > 0) {
    snprintf(threads, sizeof(threads), "%d", e->threads);
    argv[n++] = e->threads_arg;
    argv[n++] = threads;
  }
  argv[n] = NULL;
  uv_process_options_t o;
  uv_stdio_container_t stdio[3];
  memset(&o, 0, sizeof(o));
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_INHERIT_FD;
  stdio[1].data.fd = 2; /* the engine's output goes to our log stream, not stdout */
  stdio[2].flags = UV_INHERIT_FD;
  stdio[2].data.fd = 2;
  o.file = e->command;
  o.args = argv;
  o.exit_cb = proc_exit_cb;
  o.stdio = stdio;
  o.stdio_count = 3;
  o.env = engine_env(e);
  if (!o.env) {
    engine_set_state(e, AG_ENGINE_DOWN, "out of memory starting the engine");
    uv_timer_start(&e->restart_timer, restart_cb, (uint64_t)(e->restart_max_s * 1000), 0);
    return;
  }
  e->proc.data = e;
  int rc = uv_spawn(e->loop, &e->proc, &o);
  free(o.env);
  e->proc_open = 1;
  e->handles_open++;
  e->started_ms = uv_now(e->loop);
  if (rc < 0) {
    /* uv_spawn initialised the handle even on failure: close it, retry later */
    uv_close((uv_handle_t *)&e->proc, proc_closed);
    e->quick_exits++;
    e->restarts++;
    uint64_t delay = (uint64_t)(e->restart_max_s * 1000);
    char why[256];
    snprintf(why, sizeof(why), "cannot start %s: %s; retry in %.0f s", e->command, uv_strerror(rc),
             (double)delay / 1000.0);
    engine_set_state(e, AG_ENGINE_DOWN, why);
    uv_timer_start(&e->restart_timer, restart_cb, delay, 0);
    return;
  }
  e->proc_running = 1;
  e->pid = e->proc.pid;
  e->generation++;
  e->props_slots = 0; /* this process says its own, once it answers */
  e->feat_known = 0;   /* ...and what it serves */
  e->ever_ready = 0;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddNumberToObject(f, "pid", (double)e->pid);
  cJSON_AddStringToObject(f, "command", e->command);
  if (e->threads) cJSON_AddNumberToObject(f, "threads", e->threads);
  pr_log_kv(PR_LOG_INFO, "engine started", f);
  engine_set_state(e, AG_ENGINE_LOADING, "the engine process started");
  probe_arm(e, AG_ENGINE_PROBE_LOADING_MS);
}

/* ---- life cycle -------------------------------------------------------------------- */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

int ag_engine_new(ag_engine **out, uv_loop_t *loop, pr_curlm *curlm, const ag_engine_config *cfg,
                  ag_rates *rates, ag_engine_state_fn on_state, void *ud) {
  *out = NULL;
  if (!cfg->upstream || cfg->n_args > AG_ENGINE_MAX_ARGS || cfg->n_tune > AG_ENGINE_MAX_TUNE) return -EINVAL;
  ag_engine *e = calloc(1, sizeof(*e));
  if (!e) return -ENOMEM;
  e->loop = loop;
  e->curlm = curlm;
  e->rates = rates;
  e->on_state = on_state;
  e->ud = ud;
  e->kind = cfg->kind;
  size_t ul = strlen(cfg->upstream);
  while (ul > 0 && cfg->upstream[ul - 1] == '/') ul--;
  e->upstream = strndup(cfg->upstream, ul);
  e->api_key = dup_or_null(cfg->api_key);
  e->command = dup_or_null(cfg->command);
  e->threads_arg = strdup(cfg->threads_arg ? cfg->threads_arg : "--threads");
  e->model = dup_or_null(cfg->model);
  e->args = calloc(cfg->n_args + 1, sizeof(char *));
  int oom = !e->upstream || (cfg->api_key && !e->api_key) || (cfg->command && !e->command) ||
            !e->threads_arg || (cfg->model && !e->model) || !e->args;
  for (size_t i = 0; !oom && i < cfg->n_args; i++) {
    e->args[i] = strdup(cfg->args[i]);
    if (!e->args[i]) oom = 1;
    else e->n_args++;
  }
  if (oom) {
    ag_engine_free(e);
    return -ENOMEM;
  }
  for (size_t i = 0; i < cfg->n_tune; i++) e->tune[i] = cfg->tune_threads[i];
  e->n_tune = cfg->command ? cfg->n_tune : 0;
  e->cfg_slots = cfg->slots;
  e->cfg_n_ctx = cfg->n_ctx;
  e->slots = cfg->slots > 0 ? cfg->slots : cfg->kind == AG_ENGINE_MNN ? 1 : 0;
  e->n_ctx = cfg->n_ctx;
  e->want_measure = cfg->measure;
  e->ready_timeout_s = cfg->ready_timeout_s;
  e->restart_max_s = cfg->restart_max_s > 0.5 ? cfg->restart_max_s : 0.5;
  e->stop_timeout_s = cfg->stop_timeout_s;
  e->health_path = cfg->kind == AG_ENGINE_MNN ? "/v1/models" : "/health";
  if (cfg->kind == AG_ENGINE_LLAMA && cfg->command) {
    /* no RAM prompt cache of every caller's prompts: "--cache-ram 0" unless the operator's
     * own arguments say (docs/security.md "Tenants' prompts") */
    int said = -1;
    for (size_t i = 0; i < e->n_args; i++)
      if (strcmp(e->args[i], "--cache-ram") == 0 || strcmp(e->args[i], "-cram") == 0)
        said = i + 1 < e->n_args && strcmp(e->args[i + 1], "0") == 0;
    e->add_cache_ram = said < 0;
    e->ram_off = said != 0;
  }
  e->state = AG_ENGINE_LOADING;
  if (e->model) e->models[e->n_models++] = strdup(e->model);
  pr_buf_init(&e->probe_body, AG_ENGINE_MAX_PROBE_BODY);
  pr_buf_init(&e->meas_req, 8192);
  pr_sse_init(&e->meas_sse, AG_ENGINE_MAX_SSE, measure_on_event, NULL, e);
  uv_timer_init(loop, &e->probe_timer);
  uv_timer_init(loop, &e->restart_timer);
  uv_timer_init(loop, &e->kill_timer);
  e->probe_timer.data = e->restart_timer.data = e->kill_timer.data = e;
  e->handles_open = 3;
  *out = e;
  return 0;
}

int ag_engine_start(ag_engine *e) {
  if (e->command) {
    if (e->n_tune) {
      e->tuning = 1;
      e->tune_i = 0;
      e->threads = e->tune[0];
    }
    engine_spawn(e);
  } else {
    probe_arm(e, 0);
  }
  return 0;
}

static void timer_closed(uv_handle_t *h) {
  ag_engine *e = h->data;
  e->handles_open--;
  if (e->handles_open == 0 && e->on_stopped) e->on_stopped(e->stopped_arg);
}

void ag_engine_stop(ag_engine *e, void (*on_stopped)(void *arg), void *arg) {
  if (e->stopping) return;
  e->stopping = 1;
  e->on_stopped = on_stopped;
  e->stopped_arg = arg;
  probe_release(e);
  measure_release(e);
  uv_close((uv_handle_t *)&e->probe_timer, timer_closed);
  uv_close((uv_handle_t *)&e->restart_timer, timer_closed);
  if (e->proc_running) {
    pr_info("stopping the engine (pid %ld)", e->pid);
    e->expect_exit = 1;
    uv_process_kill(&e->proc, SIGTERM);
    /* the kill timer closes once the process is gone (proc_exit_cb): closed now, it would
     * never fire, and an engine that does not heed SIGTERM would hold the agent's exit */
    uv_timer_start(&e->kill_timer, kill_cb, (uint64_t)(e->stop_timeout_s * 1000), 0);
  } else {
    uv_close((uv_handle_t *)&e->kill_timer, timer_closed);
  }
}

int ag_engine_restart_with(ag_engine *e, const char *model, const char *const *args, size_t n_args) {
  if (!e->command || e->stopping || n_args > AG_ENGINE_MAX_ARGS) return -EINVAL;
  char **na = calloc(n_args + 1, sizeof(char *));
  char *nm = model ? strdup(model) : NULL;
  int oom = !na || (model && !nm);
  for (size_t i = 0; !oom && i < n_args; i++)
    if (!(na[i] = strdup(args[i]))) oom = 1;
  if (oom) {
    for (size_t i = 0; na && i < n_args; i++) free(na[i]);
    free(na);
    free(nm);
    return -ENOMEM;
  }
  for (size_t i = 0; i < e->n_args; i++) free(e->args[i]);
  free(e->args);
  e->args = na;
  e->n_args = n_args;
  free(e->model);
  e->model = nm;
  models_clear(e);
  if (e->model && (e->models[0] = strdup(e->model))) e->n_models = 1;
  e->quick_exits = 0;
  e->measured = 0;
  probe_release(e);
  measure_release(e);
  uv_timer_stop(&e->probe_timer);
  engine_set_state(e, AG_ENGINE_LOADING, "restarting with another model");
  if (e->proc_running) {
    pr_info("restarting the engine (pid %ld) with %s", e->pid, model ? model : "new arguments");
    e->expect_exit = 1; /* proc_exit_cb starts it again at once, with these arguments */
    uv_process_kill(&e->proc, SIGTERM);
    uv_timer_start(&e->kill_timer, kill_cb, (uint64_t)(e->stop_timeout_s * 1000), 0);
  } else {
    uv_timer_start(&e->restart_timer, restart_cb, 0, 0);
  }
  return 0;
}

const char *const *ag_engine_args(const ag_engine *e, size_t *n) {
  *n = e->n_args;
  return (const char *const *)e->args;
}

const char *ag_engine_model(const ag_engine *e) { return e->model; }

void ag_engine_free(ag_engine *e) {
  if (!e) return;
  probe_release(e);
  measure_release(e);
  pr_buf_free(&e->probe_body);
  pr_buf_free(&e->meas_req);
  pr_sse_free(&e->meas_sse);
  models_clear(e);
  free(e->template_caps);
  for (size_t i = 0; e->args && i < e->n_args; i++) free(e->args[i]);
  free(e->args);
  free(e->upstream);
  free(e->api_key);
  free(e->command);
  free(e->threads_arg);
  free(e->model);
  free(e);
}

ag_engine_state ag_engine_get_state(const ag_engine *e) { return e->state; }
unsigned ag_engine_generation(const ag_engine *e) { return e->generation; }
int ag_engine_slots_named(const ag_engine *e) {
  return e->kind == AG_ENGINE_LLAMA && e->command && e->ram_off && e->props_slots > 0;
}
int ag_engine_slot_count(const ag_engine *e) { return e->props_slots > 0 ? e->props_slots : e->slots; }
int ag_engine_supervised(const ag_engine *e) { return e->command != NULL; }
ag_engine_kind ag_engine_get_kind(const ag_engine *e) { return e->kind; }
const char *ag_engine_upstream(const ag_engine *e) { return e->upstream; }
const char *ag_engine_api_key(const ag_engine *e) { return e->api_key; }

void ag_engine_fill_report(const ag_engine *e, ag_report *r) {
  r->engine = ag_engine_kind_name(e->kind);
  r->engine_state = ag_engine_state_name(e->state);
  r->slots = e->slots > 0 ? e->slots : 1;
  r->n_ctx = e->n_ctx;
  r->n_models = 0;
  for (size_t i = 0; i < e->n_models && i < AG_REPORT_MAX_MODELS; i++) r->models[r->n_models++] = e->models[i];
  r->engine_pid = e->pid;
  r->engine_restarts = e->restarts;
  r->engine_build = e->build[0] ? e->build : NULL;
  r->template_caps = e->template_caps;
  r->features_known = e->kind != AG_ENGINE_LLAMA || e->feat_known;
  r->features = e->kind == AG_ENGINE_LLAMA ? e->features : 0;
  r->choices_max = e->kind == AG_ENGINE_LLAMA && e->choices_max > 1 ? e->choices_max : 1;
}
