/* Heartbeats to the gateway; see hb.h and docs/protocol.md. */
#include "hb.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "caps.h"
#include "buf.h"
#include "clock.h"
#include "curlreq.h"
#include "err.h"
#include "log.h"
#include "sign.h"

#define AG_HB_MAX_BODY PR_CAP_HEARTBEAT /* what docs/protocol.md allows */
#define AG_HB_MAX_ANSWER PR_CAP_HEARTBEAT
#define AG_HB_DEFAULT_INTERVAL_S 5.0
#define AG_HB_BACKOFF_FIRST_MS 1000u
#define AG_HB_BACKOFF_MAX_MS 30000u
#define AG_HB_TIMEOUT_MS 10000L
#define AG_HB_CONNECT_TIMEOUT_MS 5000L

/* The sender. Owned by its creator; owns its copies of the strings, the timer and the
 * transfer in flight (its request and bodies), which ag_hb_stop cancels. */
struct ag_hb {
  uv_loop_t *loop;
  pr_curlm *curlm;          /* borrowed */
  char *url;                /* gateway + "/fleet/v1/heartbeat" */
  char *public_url, *secret, *ca_file;
  const pr_idkey *key;      /* borrowed */
  char *token;              /* the replica token the gateway last named */
  ag_hb_token_fn token_fn;
  unsigned once_tries;      /* a one-shot report: tries left (0: ordinary heartbeats) */
  ag_hb_once_fn once_fn;
  ag_hb_report_fn report;
  ag_hb_drain_fn drain_fn;
  ag_hb_place_fn place_fn;
  void *ud;
  uv_timer_t timer;
  pr_curlreq xfer;          /* the heartbeat in flight: xfer.easy set while it runs */
  pr_buf body, answer;
  char errbuf[CURL_ERROR_SIZE];
  int64_t last_ts;          /* timestamps must grow strictly (replay protection) */
  unsigned fails;           /* failures in a row */
  double interval_s;
  int drain;                /* what the gateway last said */
  int resend;               /* the URL changed while a heartbeat was in flight */
  uint64_t last_sent_ms;    /* uv_now when the last heartbeat went out */
  int stopping;
  void (*on_stopped)(void *arg);
  void *stopped_arg;
  ag_hb_stats stats;
};

int ag_hb_sign(const char *secret, const char *ts, const char *body, size_t len,
               char out[AG_HB_SIG_LEN + 1]) {
  return pr_sign_heartbeat(secret, ts, body, len, out);
}

uint64_t ag_hb_backoff_ms(unsigned fails) {
  if (fails == 0) return 0;
  uint64_t ms = AG_HB_BACKOFF_FIRST_MS;
  for (unsigned i = 1; i < fails && ms < AG_HB_BACKOFF_MAX_MS; i++) ms *= 2;
  return ms > AG_HB_BACKOFF_MAX_MS ? AG_HB_BACKOFF_MAX_MS : ms;
}

static void hb_send(uv_timer_t *t);

static void hb_arm(ag_hb *hb, uint64_t ms) {
  if (hb->stopping) return;
  uv_timer_start(&hb->timer, hb_send, ms, 0);
}

/* How long until the gateway takes another heartbeat: it refuses a second one within a
 * quarter of the interval, at most a second (docs/protocol.md, 429 heartbeat_rate). */
static uint64_t hb_soonest_ms(const ag_hb *hb) {
  if (!hb->last_sent_ms) return 0;
  double spacing = hb->interval_s * 250.0;
  uint64_t gap = (uint64_t)llround(spacing > 1000.0 ? 1000.0 : spacing) + 50; /* a margin */
  uint64_t since = uv_now(hb->loop) - hb->last_sent_ms;
  return since >= gap ? 0 : gap - since;
}

static void hb_release(ag_hb *hb) {
  pr_curlreq_close(&hb->xfer, hb->curlm);
  pr_buf_reset(&hb->body);
  pr_buf_reset(&hb->answer);
}

static void hb_once_done(ag_hb *hb, CURLcode rc, long status, const char *why);

static void hb_failed(ag_hb *hb, const char *why) {
  if (hb->once_fn) { /* a one-shot report counts its tries */
    hb_once_done(hb, CURLE_SEND_ERROR, 0, why);
    return;
  }
  hb->fails++;
  hb->stats.failed++;
  uint64_t ms = ag_hb_backoff_ms(hb->fails);
  /* Say it on the first failure and then now and again, not on every try. */
  if (hb->fails == 1 || hb->fails % 10 == 0)
    pr_warn("heartbeat to %s failed (%u in a row): %s; next try in %.1f s", hb->url, hb->fails, why,
            (double)ms / 1000.0);
  hb_arm(hb, ms);
}

/* 202: the gateway waits for an operator to approve this phone's key. */
static void hb_pending(ag_hb *hb) {
  cJSON *o = cJSON_ParseWithLength(hb->answer.data ? hb->answer.data : "", hb->answer.len);
  const cJSON *iv = cJSON_GetObjectItemCaseSensitive(o, "interval_s");
  if (cJSON_IsNumber(iv) && iv->valuedouble >= 0.05 && iv->valuedouble <= 3600)
    hb->interval_s = iv->valuedouble;
  cJSON_Delete(o);
  if (hb->stats.pending++ == 0)
    pr_warn("the gateway %s waits for an operator to approve this phone: key %s", hb->url,
            pr_idkey_public(hb->key));
  hb->fails = 0;
  hb_arm(hb, (uint64_t)llround(hb->interval_s * 1000.0));
}

/* The gateway's answer: {"accepted":true,"interval_s":5,"drain":false,...}. */
static void hb_take_token(ag_hb *hb, const cJSON *t) {
  if (!cJSON_IsString(t) || !t->valuestring[0] || strlen(t->valuestring) > 256) return;
  if (hb->token && strcmp(hb->token, t->valuestring) == 0) return;
  char *nt = strdup(t->valuestring);
  if (!nt) return;
  if (hb->token) OPENSSL_cleanse(hb->token, strlen(hb->token));
  free(hb->token);
  hb->token = nt;
  if (hb->token_fn) hb->token_fn(hb->ud, nt);
}

static const char *str_or_null(const cJSON *o, const char *key, size_t max) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) && v->valuestring[0] && strlen(v->valuestring) <= max ? v->valuestring : NULL;
}

/* The answer's `place`: the model the gateway means this phone to run (placement). */
static void hb_take_place(ag_hb *hb, const cJSON *p) {
  if (!cJSON_IsObject(p)) {
    hb->place_fn(hb->ud, NULL);
    return;
  }
  ag_place pl;
  memset(&pl, 0, sizeof(pl));
  pl.model = str_or_null(p, "model", 64);
  pl.url = str_or_null(p, "url", 1000);
  pl.sha256 = str_or_null(p, "sha256", 64);
  pl.reason = str_or_null(p, "reason", 300);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, "size_bytes");
  if (cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble < 1e15) pl.size_bytes = (int64_t)v->valuedouble;
  v = cJSON_GetObjectItemCaseSensitive(p, "mem_mb");
  if (cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble < 1e9) pl.mem_mb = v->valuedouble;
  v = cJSON_GetObjectItemCaseSensitive(p, "n_ctx");
  if (cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble < 1e10) pl.n_ctx = (int64_t)v->valuedouble;
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(p, "engine_args");
  for (const cJSON *it = cJSON_IsArray(a) ? a->child : NULL; it && pl.n_engine_args < AG_PLACE_MAX_ARGS; it = it->next)
    if (cJSON_IsString(it)) pl.engine_args[pl.n_engine_args++] = it->valuestring;
  if (!pl.model || (pl.sha256 && strlen(pl.sha256) != 64)) {
    pr_warn("the gateway's place is not understood: no model, or a digest that is not 64 hex digits");
    hb->place_fn(hb->ud, NULL);
    return;
  }
  hb->place_fn(hb->ud, &pl);
}

static void hb_accepted(ag_hb *hb) {
  cJSON *o = cJSON_ParseWithLength(hb->answer.data ? hb->answer.data : "", hb->answer.len);
  const cJSON *iv = cJSON_GetObjectItemCaseSensitive(o, "interval_s");
  const cJSON *dr = cJSON_GetObjectItemCaseSensitive(o, "drain");
  if (cJSON_IsNumber(iv) && iv->valuedouble >= 0.05 && iv->valuedouble <= 3600)
    hb->interval_s = iv->valuedouble;
  int drain = cJSON_IsTrue(dr);
  hb_take_token(hb, cJSON_GetObjectItemCaseSensitive(o, "replica_token"));
  if (hb->place_fn) hb_take_place(hb, cJSON_GetObjectItemCaseSensitive(o, "place"));
  cJSON_Delete(o);
  if (hb->fails || hb->stats.pending) pr_info("heartbeats accepted%s by %s", hb->stats.accepted ? " again" : "", hb->url);
  else if (hb->stats.accepted == 0) pr_info("heartbeat accepted by %s (every %.2f s)", hb->url, hb->interval_s);
  hb->fails = 0;
  hb->stats.accepted++;
  hb->stats.interval_s = hb->interval_s;
  if (drain != hb->drain) {
    hb->drain = drain;
    hb->stats.drain = drain;
    pr_info("the gateway %s", drain ? "asks to drain: refusing new work" : "no longer asks to drain");
    if (hb->drain_fn) hb->drain_fn(hb->ud, drain);
  }
  hb_arm(hb, (uint64_t)llround(hb->interval_s * 1000.0));
}

/* A one-shot report's answer: done when the gateway answered 200, or refused it (4xx
 * other than 429: asking again changes nothing), or every try failed. */
static void hb_once_done(ag_hb *hb, CURLcode rc, long status, const char *why) {
  char what[AG_HB_MAX_ANSWER > 600 ? 600 : AG_HB_MAX_ANSWER];
  int ok = rc == CURLE_OK && status == 200;
  int final = ok || (rc == CURLE_OK && status >= 400 && status < 500 && status != 429);
  if (ok) snprintf(what, sizeof(what), "%.*s", (int)(hb->answer.len < 500 ? hb->answer.len : 500),
                   hb->answer.data ? hb->answer.data : "");
  else snprintf(what, sizeof(what), "%s", rc == CURLE_OK && status == 202 ? "enrolment pending" : why);
  char *whole = ok && hb->answer.data ? strndup(hb->answer.data, hb->answer.len) : NULL;
  pr_buf_reset(&hb->body);
  pr_buf_reset(&hb->answer);
  if (ok) hb->stats.accepted++;
  else hb->stats.failed++;
  if (!final && --hb->once_tries > 0) {
    hb->fails++;
    uint64_t ms = ag_hb_backoff_ms(hb->fails);
    pr_warn("report to %s failed: %s; trying again in %.1f s", hb->url, what, (double)ms / 1000.0);
    hb_arm(hb, ms);
    return;
  }
  ag_hb_once_fn fn = hb->once_fn;
  hb->once_fn = NULL; /* once */
  fn(hb->ud, ok, ok && whole ? whole : what);
  free(whole);
}

static void hb_done(CURL *easy, CURLcode rc, void *ud) {
  (void)easy;
  ag_hb *hb = ud;
  long status = pr_curlreq_status(&hb->xfer);
  char why[CURL_ERROR_SIZE + 320] = "";
  if (rc != CURLE_OK) {
    snprintf(why, sizeof(why), "%s", hb->errbuf[0] ? hb->errbuf : curl_easy_strerror(rc));
  } else if (status != 200 && status != 202) {
    /* The gateway's error names its reason in error.code. */
    cJSON *o = cJSON_ParseWithLength(hb->answer.data ? hb->answer.data : "", hb->answer.len);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    const cJSON *c = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "code") : NULL;
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : NULL;
    snprintf(why, sizeof(why), "HTTP %ld %s: %.200s", status, cJSON_IsString(c) ? c->valuestring : "",
             cJSON_IsString(m) ? m->valuestring : "");
    cJSON_Delete(o);
  }
  /* pr_curlm removed the handle before calling: it is ours to let go of. */
  pr_curlreq_close(&hb->xfer, hb->curlm);
  if (hb->once_fn) {
    hb_once_done(hb, rc, status, why);
    return;
  }
  if (rc == CURLE_OK && status == 200) hb_accepted(hb);
  else if (rc == CURLE_OK && status == 202) hb_pending(hb);
  else hb_failed(hb, why);
  pr_buf_reset(&hb->body);
  pr_buf_reset(&hb->answer);
  if (hb->resend) { /* a new URL waits: say it now, whatever the pace */
    hb->resend = 0;
    hb_arm(hb, hb_soonest_ms(hb));
  }
}

static size_t hb_on_write(char *data, size_t size, size_t nmemb, void *ud) {
  ag_hb *hb = ud;
  size_t n = size * nmemb;
  return pr_buf_append(&hb->answer, data, n) == 0 ? n : 0;
}

static void hb_send(uv_timer_t *t) {
  ag_hb *hb = t->data;
  if (hb->stopping || hb->xfer.easy) return;
  ag_report r;
  memset(&r, 0, sizeof(r));
  hb->report(hb->ud, &r);
  if (!hb->public_url && !r.unfit) { /* no URL yet: ag_hb_set_public_url sends the first */
    hb_arm(hb, AG_HB_BACKOFF_MAX_MS);
    return;
  }
  pr_buf_reset(&hb->body);
  int rc = ag_report_heartbeat_json(&r, hb->public_url, pr_idkey_public(hb->key), &hb->body);
  if (rc == PR_EMISSING) { /* no model known yet (engine still loading): try again soon */
    hb_arm(hb, AG_HB_BACKOFF_FIRST_MS);
    return;
  }
  if (rc < 0) {
    hb_failed(hb, pr_strerror(rc));
    return;
  }
  int64_t ts = pr_clock_wall_ms();
  if (ts <= hb->last_ts) ts = hb->last_ts + 1;
  hb->last_ts = ts;
  char tss[32], sig[AG_HB_SIG_LEN + 1], ksig[PR_IDKEY_SIG_LEN + 1], h1[64], h2[128], h3[160];
  snprintf(tss, sizeof(tss), "%" PRId64, ts);
  if ((hb->secret && ag_hb_sign(hb->secret, tss, hb->body.data, hb->body.len, sig) < 0) ||
      pr_idkey_sign(hb->key, tss, hb->body.data, hb->body.len, ksig) < 0) {
    hb_failed(hb, "cannot compute the signature");
    return;
  }
  snprintf(h1, sizeof(h1), "x-fleetgate-timestamp: %s", tss);
  snprintf(h3, sizeof(h3), "x-fleetgate-key-signature: %s", ksig);
  if (hb->secret) snprintf(h2, sizeof(h2), "x-fleetgate-signature: %s", sig);
  const char *const lines[] = {"Content-Type: application/json", "Expect:", h1, h3,
                               hb->secret ? h2 : NULL, NULL};
  const pr_curlreq_opts o = {
      .base = hb->url,
      .body = hb->body.data ? hb->body.data : "",
      .body_len = hb->body.len,
      .headers = lines,
      .write_fn = hb_on_write,
      .write_ud = hb,
      .errbuf = hb->errbuf,
      .timeout_ms = AG_HB_TIMEOUT_MS,
      .connect_timeout_ms = AG_HB_CONNECT_TIMEOUT_MS,
      .ca_file = hb->ca_file,
      .user_agent = "fleetgate-agent/" FLEETGATE_VERSION,
  };
  if (pr_curlreq_open(&hb->xfer, hb->curlm, &o) < 0) {
    hb_failed(hb, "out of memory");
    return;
  }
  hb->stats.sent++;
  hb->last_sent_ms = uv_now(hb->loop);
  rc = pr_curlm_add(hb->curlm, hb->xfer.easy, hb_done, hb);
  if (rc < 0) {
    hb_release(hb);
    hb_failed(hb, pr_strerror(rc));
  }
}

int ag_hb_new(ag_hb **out, uv_loop_t *loop, pr_curlm *curlm, const ag_hb_config *cfg,
              ag_hb_report_fn report, ag_hb_drain_fn drain, void *ud) {
  *out = NULL;
  if (!cfg->key) return -EINVAL;
  ag_hb *hb = calloc(1, sizeof(*hb));
  if (!hb) return -ENOMEM;
  size_t gl = strlen(cfg->gateway);
  while (gl > 0 && cfg->gateway[gl - 1] == '/') gl--;
  size_t n = gl + sizeof("/fleet/v1/heartbeat");
  hb->url = malloc(n);
  hb->public_url = cfg->public_url ? strdup(cfg->public_url) : NULL;
  hb->secret = cfg->secret ? strdup(cfg->secret) : NULL;
  hb->ca_file = cfg->ca_file ? strdup(cfg->ca_file) : NULL;
  if (!hb->url || (cfg->public_url && !hb->public_url) || (cfg->secret && !hb->secret) || (cfg->ca_file && !hb->ca_file)) {
    free(hb->url);
    free(hb->public_url);
    free(hb->secret);
    free(hb->ca_file);
    free(hb);
    return -ENOMEM;
  }
  snprintf(hb->url, n, "%.*s/fleet/v1/heartbeat", (int)gl, cfg->gateway);
  hb->loop = loop;
  hb->curlm = curlm;
  hb->report = report;
  hb->drain_fn = drain;
  hb->token_fn = cfg->token_fn;
  hb->once_tries = cfg->once_tries;
  hb->once_fn = cfg->once_tries ? cfg->once_fn : NULL;
  hb->key = cfg->key;
  hb->ud = ud;
  hb->interval_s = AG_HB_DEFAULT_INTERVAL_S;
  pr_buf_init(&hb->body, AG_HB_MAX_BODY);
  pr_buf_init(&hb->answer, AG_HB_MAX_ANSWER);
  uv_timer_init(loop, &hb->timer);
  hb->timer.data = hb;
  *out = hb;
  return 0;
}

void ag_hb_start(ag_hb *hb) { hb_arm(hb, 0); }

void ag_hb_on_place(ag_hb *hb, ag_hb_place_fn fn) { hb->place_fn = fn; }

void ag_hb_kick(ag_hb *hb) {
  if (!hb || hb->stopping || hb->xfer.easy || hb->fails) return; /* a back-off keeps its pace */
  hb_arm(hb, 0);
}

int ag_hb_set_public_url(ag_hb *hb, const char *url) {
  char *u = strdup(url);
  if (!u) return -ENOMEM;
  free(hb->public_url);
  hb->public_url = u;
  if (hb->stopping) return 0;
  if (hb->xfer.easy) hb->resend = 1;
  else hb_arm(hb, hb_soonest_ms(hb));
  return 0;
}

static void hb_timer_closed(uv_handle_t *h) {
  ag_hb *hb = h->data;
  if (hb->on_stopped) hb->on_stopped(hb->stopped_arg);
}

void ag_hb_stop(ag_hb *hb, void (*on_stopped)(void *arg), void *arg) {
  if (hb->stopping) return;
  hb->stopping = 1;
  hb->on_stopped = on_stopped;
  hb->stopped_arg = arg;
  hb_release(hb);
  uv_close((uv_handle_t *)&hb->timer, hb_timer_closed);
}

void ag_hb_free(ag_hb *hb) {
  if (!hb) return;
  hb_release(hb);
  pr_buf_free(&hb->body);
  pr_buf_free(&hb->answer);
  free(hb->url);
  free(hb->public_url);
  if (hb->secret) OPENSSL_cleanse(hb->secret, strlen(hb->secret));
  free(hb->secret);
  if (hb->token) OPENSSL_cleanse(hb->token, strlen(hb->token));
  free(hb->token);
  free(hb->ca_file);
  free(hb);
}

void ag_hb_get_stats(const ag_hb *hb, ag_hb_stats *st) {
  *st = hb->stats;
  st->interval_s = hb->interval_s;
}
