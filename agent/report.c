/* The agent's report: rates learnt from answers, device readings, and the status and
 * heartbeat documents. See report.h. */
#include "report.h"

#include "feat.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "json.h"

/* Weight of a new sample in the moving average. */
#define AG_RATES_ALPHA 0.3
/* Shorter prefills (a cached prompt) measure overhead more than speed. */
#define AG_RATES_MIN_PROMPT 8

/* ---- rates --------------------------------------------------------------------------- */

void ag_rates_init(ag_rates *r) { memset(r, 0, sizeof(*r)); }

void ag_rates_seed(ag_rates *r, double prefill_tps, double decode_tps) {
  if (r->prefill_samples == 0 && prefill_tps > 0) r->prefill_tps = prefill_tps;
  if (r->decode_samples == 0 && decode_tps > 0) r->decode_tps = decode_tps;
  r->seeded = 1;
}

static void rates_mix(double *avg, unsigned *samples, double v) {
  if (!(v > 0) || !isfinite(v)) return;
  *avg = *samples == 0 ? v : *avg * (1.0 - AG_RATES_ALPHA) + v * AG_RATES_ALPHA;
  (*samples)++;
}

void ag_rates_observe(ag_rates *r, double prompt_n, double prompt_ms, double predicted_n,
                      double predicted_ms) {
  if (prompt_n >= AG_RATES_MIN_PROMPT && prompt_ms > 0) rates_mix(&r->prefill_tps, &r->prefill_samples, prompt_n * 1000.0 / prompt_ms);
  if (predicted_n >= 1 && predicted_ms > 0)
    rates_mix(&r->decode_tps, &r->decode_samples, predicted_n * 1000.0 / predicted_ms);
}

const char *ag_rates_source(const ag_rates *r) {
  if (r->prefill_samples || r->decode_samples) return "measured";
  return r->seeded ? "configured" : "none";
}

/* ---- observations ------------------------------------------------------------------ */

void ag_obs_init(ag_obs *o) {
  o->prompt_n = o->prompt_ms = o->predicted_n = o->predicted_ms = -1;
  o->prompt_tokens = o->completion_tokens = -1;
}

static void obs_num(const cJSON *obj, const char *key, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) *out = v->valuedouble;
}

void ag_obs_take(ag_obs *o, const cJSON *root) {
  if (!cJSON_IsObject(root)) return;
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "timings");
  if (cJSON_IsObject(t)) {
    obs_num(t, "prompt_n", &o->prompt_n);
    obs_num(t, "prompt_ms", &o->prompt_ms);
    obs_num(t, "predicted_n", &o->predicted_n);
    obs_num(t, "predicted_ms", &o->predicted_ms);
  }
  const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
  if (cJSON_IsObject(u)) {
    double p = -1, c = -1;
    obs_num(u, "prompt_tokens", &p);
    obs_num(u, "completion_tokens", &c);
    if (p >= 0) o->prompt_tokens = (int64_t)p;
    if (c >= 0) o->completion_tokens = (int64_t)c;
  }
}

void ag_obs_take_text(ag_obs *o, const char *text, size_t len) {
  if (len == 0 || (text[0] != '{' && text[0] != ' ')) return;
  cJSON *root = cJSON_ParseWithLength(text, len);
  ag_obs_take(o, root);
  cJSON_Delete(root);
}

/* ---- documents --------------------------------------------------------------------- */

static void add_num_or_null(cJSON *o, const char *key, double v, int known) {
  if (known) cJSON_AddNumberToObject(o, key, v);
  else cJSON_AddNullToObject(o, key);
}

static double round1(double v) { return round(v * 10.0) / 10.0; }

/* The device object; the status also says where the temperature came from. The free
 * storage is the models folder's (hold.h), said only where there is one. */
static cJSON *device_json(const ag_report *r, int status) {
  const ag_device *d = &r->device;
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  add_num_or_null(o, "battery_pct", d->battery_pct, d->battery_pct >= 0 && d->battery_pct <= 100);
  if (d->charging >= 0) cJSON_AddBoolToObject(o, "charging", d->charging);
  else cJSON_AddNullToObject(o, "charging");
  add_num_or_null(o, "temperature_c", round1(d->temperature_c), d->temperature_c > AG_DEVICE_UNKNOWN_TEMP);
  if (status) {
    if (d->temp_source) cJSON_AddStringToObject(o, "temperature_source", d->temp_source);
    else cJSON_AddNullToObject(o, "temperature_source");
  }
  add_num_or_null(o, "mem_free_mb", d->mem_free_mb, d->mem_free_mb >= 0);
  add_num_or_null(o, "mem_total_mb", d->mem_total_mb, d->mem_total_mb >= 0);
  if (r->models_dir || r->storage_said)
    add_num_or_null(o, "storage_free_mb", r->storage_free_mb, r->storage_free_mb >= 0);
  add_num_or_null(o, "cpu_max_freq_ratio", round(d->cpu_max_freq_ratio * 1000.0) / 1000.0,
                  d->cpu_max_freq_ratio >= 0 && d->cpu_max_freq_ratio <= 1);
  return o;
}

/* A name the gateway shows as it is: 1 - AG_HOLD_NAME_MAX visible ASCII characters. */
static int visible_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > AG_HOLD_NAME_MAX) return 0;
  for (; *s; s++)
    if (*s < ' ' || *s > '~') return 0;
  return 1;
}

/* The model files on the disk: the status lists every one (a digest still being worked
 * out is null); a heartbeat names only those whose digest is known, with it. */
static cJSON *held_json(const ag_report *r, int status) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; a && i < r->n_held && i < AG_REPORT_MAX_HELD; i++) {
    const ag_held *h = &r->held[i];
    if (!status && !h->sha256[0]) continue;
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddItemToArray(a, o);
    cJSON_AddStringToObject(o, "name", h->name);
    if (status) {
      cJSON_AddStringToObject(o, "file", h->file);
      cJSON_AddNumberToObject(o, "bytes", (double)h->bytes);
    }
    if (h->sha256[0]) cJSON_AddStringToObject(o, "sha256", h->sha256);
    else cJSON_AddNullToObject(o, "sha256");
  }
  return a;
}

static int emit(cJSON *root, pr_buf *out) {
  int rc = pr_json_append(out, root);
  cJSON_Delete(root);
  return rc;
}

static cJSON *models_json(const ag_report *r) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; a && i < r->n_models; i++) cJSON_AddItemToArray(a, cJSON_CreateString(r->models[i]));
  return a;
}

const char *ag_report_hb_state(const ag_report *r) {
  if (r->unfit) return "unfit";
  if (r->draining) return "draining";
  return strcmp(r->engine_state, "ready") == 0 ? "ready" : "loading";
}

void ag_report_copy_id(char *out, const char *id) {
  out[0] = '\0';
  if (!id) return;
  size_t n = strnlen(id, AG_REPORT_MAX_REQUEST_ID + 1);
  if (n > AG_REPORT_MAX_REQUEST_ID) return;
  for (size_t i = 0; i < n; i++)
    if (id[i] <= ' ' || id[i] > '~') return;
  memcpy(out, id, n + 1);
}

static cJSON *running_json(const ag_report *r) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; a && i < r->n_running && i < AG_REPORT_MAX_SLOTS; i++) {
    const ag_running *run = &r->running[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddItemToArray(a, o);
    if (run->request_id[0]) cJSON_AddStringToObject(o, "request_id", run->request_id);
    else cJSON_AddNullToObject(o, "request_id");
    add_num_or_null(o, "prompt_tokens", (double)run->prompt_tokens, run->prompt_tokens >= 0);
    add_num_or_null(o, "prompt_done", (double)run->prompt_done, run->prompt_done >= 0);
    add_num_or_null(o, "decoded", (double)run->decoded, run->decoded >= 0);
    add_num_or_null(o, "prefill_tps", round1(run->prefill_tps), run->prefill_tps > 0);
    add_num_or_null(o, "decode_tps", round1(run->decode_tps), run->decode_tps > 0);
  }
  return a;
}

int ag_report_status_json(const ag_report *r, pr_buf *out) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return -ENOMEM;
  cJSON_AddStringToObject(o, "id", r->id ? r->id : "");
  cJSON_AddStringToObject(o, "engine", r->engine);
  cJSON_AddStringToObject(o, "engine_state", r->engine_state);
  cJSON_AddBoolToObject(o, "draining", r->draining);
  cJSON_AddNumberToObject(o, "slots", r->slots);
  cJSON_AddNumberToObject(o, "busy", r->busy);
  cJSON_AddNumberToObject(o, "queued", r->queued);
  add_num_or_null(o, "n_ctx", (double)r->n_ctx, r->n_ctx > 0);
  cJSON_AddItemToObject(o, "models", models_json(r));
  add_num_or_null(o, "prefill_tps", round1(r->rates.prefill_tps), r->rates.prefill_tps > 0);
  add_num_or_null(o, "decode_tps", round1(r->rates.decode_tps), r->rates.decode_tps > 0);
  cJSON_AddStringToObject(o, "rates_source", ag_rates_source(&r->rates));
  cJSON_AddItemToObject(o, "device", device_json(r, 1));
  /* what the phone holds and loads (docs/agent.md "What the phone holds") */
  if (r->models_dir) cJSON_AddStringToObject(o, "models_dir", r->models_dir);
  else cJSON_AddNullToObject(o, "models_dir");
  if (r->models_dir && r->held_known) cJSON_AddItemToObject(o, "held", held_json(r, 1));
  else cJSON_AddNullToObject(o, "held");
  if (r->loading_model || r->loading_file) {
    cJSON *l = cJSON_AddObjectToObject(o, "loading");
    if (r->loading_model) cJSON_AddStringToObject(l, "model", r->loading_model);
    else cJSON_AddNullToObject(l, "model");
    if (r->loading_file) cJSON_AddStringToObject(l, "file", r->loading_file);
    else cJSON_AddNullToObject(l, "file");
  } else {
    cJSON_AddNullToObject(o, "loading");
  }
  if (r->switch_to && r->switch_phase) {
    cJSON *sw = cJSON_AddObjectToObject(o, "switch");
    cJSON_AddStringToObject(sw, "to", r->switch_to);
    cJSON_AddStringToObject(sw, "phase", r->switch_phase);
    if (r->switch_why) cJSON_AddStringToObject(sw, "why", r->switch_why);
    else cJSON_AddNullToObject(sw, "why");
  } else {
    cJSON_AddNullToObject(o, "switch");
  }
  cJSON_AddStringToObject(o, "version", FLEETGATE_VERSION);
  cJSON_AddNumberToObject(o, "uptime_s", round1(r->uptime_s));
  add_num_or_null(o, "engine_pid", (double)r->engine_pid, r->engine_pid > 0);
  cJSON_AddNumberToObject(o, "engine_restarts", r->engine_restarts);
  /* how the agent keeps callers' prompts apart on the engine (docs/security.md) */
  cJSON_AddStringToObject(o, "cache_isolation", r->cache_isolation ? r->cache_isolation : "none");
  /* what the engine is and serves (feat.h): the gateway routes by it (docs/agent.md) */
  if (r->engine_build) cJSON_AddStringToObject(o, "engine_build", r->engine_build);
  else cJSON_AddNullToObject(o, "engine_build");
  if (r->features_known) {
    cJSON *f = cJSON_AddObjectToObject(o, "engine_features");
    /* keeping callers apart by naming slots (isolate.h), the agent cannot keep a request's
     * other choices to its caller's slots (the engine places them): one choice then */
    int slots_named = r->cache_isolation && strcmp(r->cache_isolation, "slots") == 0;
    cJSON_AddNumberToObject(f, "choices",
                            r->choices_max > 1 && (r->features & PR_FEAT_CHOICES) && !slots_named ? r->choices_max : 1);
    cJSON_AddBoolToObject(f, "continue_final_message", (r->features & PR_FEAT_CONTINUE) != 0);
    cJSON_AddBoolToObject(f, "responses", (r->features & PR_FEAT_RESPONSES) != 0);
    cJSON_AddBoolToObject(f, "cache_checkpoints", (r->features & PR_FEAT_CHECKPOINTS) != 0);
  } else {
    cJSON_AddNullToObject(o, "engine_features");
  }
  cJSON *caps = r->template_caps ? cJSON_Parse(r->template_caps) : NULL;
  if (caps) cJSON_AddItemToObject(o, "chat_template_caps", caps);
  else cJSON_AddNullToObject(o, "chat_template_caps");
  cJSON_AddNumberToObject(o, "requests", (double)r->requests);
  cJSON_AddItemToObject(o, "running", running_json(r));
  return emit(o, out);
}

int ag_report_heartbeat_json(const ag_report *r, const char *url, const char *key, pr_buf *out) {
  if (r->n_models == 0) return PR_EMISSING;
  cJSON *o = cJSON_CreateObject();
  if (!o) return -ENOMEM;
  int slots = r->slots < 1 ? 1 : r->slots > AG_REPORT_MAX_SLOTS ? AG_REPORT_MAX_SLOTS : r->slots;
  int busy = r->busy < 0 ? 0 : r->busy > slots ? slots : r->busy;
  cJSON_AddStringToObject(o, "id", r->id);
  if (url) cJSON_AddStringToObject(o, "url", url);
  else if (!r->unfit) {
    cJSON_Delete(o);
    return -EINVAL;
  }
  if (key) cJSON_AddStringToObject(o, "key", key);
  cJSON_AddItemToObject(o, "models", models_json(r));
  cJSON_AddNumberToObject(o, "slots", slots);
  cJSON_AddNumberToObject(o, "busy", busy);
  if (r->n_ctx > 0) cJSON_AddNumberToObject(o, "n_ctx", (double)r->n_ctx);
  if (r->rates.prefill_tps > 0) cJSON_AddNumberToObject(o, "prefill_tps", round1(r->rates.prefill_tps));
  if (r->rates.decode_tps > 0) cJSON_AddNumberToObject(o, "decode_tps", round1(r->rates.decode_tps));
  cJSON_AddStringToObject(o, "state", ag_report_hb_state(r));
  if (r->unfit) {
    /* the gateway takes 1-500 visible ASCII characters */
    char why[501];
    size_t n = 0;
    for (const char *p = r->unfit; *p && n < sizeof(why) - 1; p++) why[n++] = *p >= ' ' && *p <= '~' ? *p : '?';
    why[n] = '\0';
    cJSON_AddStringToObject(o, "unfit", n ? why : "cannot hold its model");
  }
  cJSON_AddItemToObject(o, "device", device_json(r, 0));
  /* kept small: the held models' names and digests, the model being loaded */
  if (r->models_dir && r->held_known) cJSON_AddItemToObject(o, "held", held_json(r, 0));
  if (r->loading_model && visible_name(r->loading_model)) cJSON_AddStringToObject(o, "loading", r->loading_model);
  if (r->can_switch) cJSON_AddBoolToObject(o, "can_switch", 1);
  if (r->switch_to && r->switch_phase && visible_name(r->switch_to)) {
    cJSON *sw = cJSON_AddObjectToObject(o, "switch");
    cJSON_AddStringToObject(sw, "to", r->switch_to);
    cJSON_AddStringToObject(sw, "phase", r->switch_phase);
    if (strcmp(r->switch_phase, "failed") == 0) {
      /* the gateway takes 1-300 visible ASCII characters */
      char why[301];
      size_t n = 0;
      for (const char *p = r->switch_why ? r->switch_why : ""; *p && n < sizeof(why) - 1; p++)
        why[n++] = *p >= ' ' && *p <= '~' ? *p : '?';
      why[n] = '\0';
      cJSON_AddStringToObject(sw, "why", n ? why : "the switch failed");
    }
  }
  cJSON_AddStringToObject(o, "version", FLEETGATE_VERSION);
  cJSON_AddNumberToObject(o, "uptime_s", floor(r->uptime_s));
  if (r->cost_per_day > 0 && r->cost_per_day <= 1e9) cJSON_AddNumberToObject(o, "cost_per_day", r->cost_per_day);
  cJSON *labels = r->labels ? cJSON_Parse(r->labels) : NULL;
  if (cJSON_IsObject(labels)) cJSON_AddItemToObject(o, "labels", labels);
  else cJSON_Delete(labels);
  return emit(o, out);
}
