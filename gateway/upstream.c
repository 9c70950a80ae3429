/* One attempt of a job on one replica, through libcurl's multi interface on the
 * gateway's loop. Streams pass through chunk by chunk with backpressure (curl is
 * paused while the client's output queue is above its high-water mark); non-streamed
 * answers are buffered (capped) so a failure can still be retried elsewhere. A
 * watchdog derived from the prediction catches phones that never answer. */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "cost.h"
#include "caps.h"
#include "err.h"
#include "feat.h"
#include "gw.h"
#include "hedge.h"
#include "json.h"
#include "log.h"
#include "metrics.h"
#include "registry.h"
#include "cachescope.h"
#include "shared.h"
#include "silence.h"
#include "verdict.h"

#define GW_UPSTREAM_RECV_BUFFER 2048L /* curl's per-transfer receive buffer (bytes) */

static void attempt_arm(gw_attempt *a, double seconds);

/* Attempts only move forward: leasing, sent, then an answer or a stream. */
static void attempt_move(gw_attempt *a, gw_attempt_state to) {
  assert(to > a->state && (a->state != GW_ATT_LEASING || to == GW_ATT_SENT));
  a->state = to;
}

/* ---- reading what the replica says --------------------------------------------------------- */

/* Usage and timings as the phone states them. Counts that are no finite number >= 0
 * are not taken (and never converted to an integer they do not fit); the rest is
 * bounded later (usage_bound, attempt_learn). */
/* A usage count as the phone states it; one that is no finite number >= 0 (NaN, 1e999,
 * negative) is replaced by the gateway's own (subst) and the usage marked for rewriting. */
static void take_count(gw_attempt *a, const cJSON *v, int64_t *out, int64_t subst) {
  if (!cJSON_IsNumber(v)) return;
  int64_t n = gw_bound_count(v->valuedouble);
  if (n < 0) {
    n = subst;
    a->usage_bad = 1;
  }
  *out = n;
}

static void attempt_take_usage(gw_attempt *a, const cJSON *root) {
  const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
  int64_t n;
  if (cJSON_IsObject(u)) {
    take_count(a, cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens"), &a->prompt_tokens,
               a->job->oai.prompt_tokens);
    take_count(a, cJSON_GetObjectItemCaseSensitive(u, "completion_tokens"), &a->completion_tokens,
               a->sent_tokens);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
    if (cJSON_IsObject(d) && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(d, "cached_tokens"))) {
      take_count(a, cJSON_GetObjectItemCaseSensitive(d, "cached_tokens"), &a->cached_tokens, 0);
      a->cached_known = 1;
    }
  }
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "timings");
  if (cJSON_IsObject(t)) {
    const cJSON *v;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(t, "prompt_n"))) a->t_prompt_n = v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(t, "prompt_ms"))) a->t_prompt_ms = v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(t, "predicted_n"))) a->t_pred_n = v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(t, "predicted_ms"))) a->t_pred_ms = v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(t, "cache_n")) &&
        (n = gw_bound_count(v->valuedouble)) >= 0) {
      a->cached_tokens = n;
      a->cached_known = 1;
    }
  }
}

/* The most prompt tokens this request can hold (bounds.h). */
static int64_t prompt_max(const gw_job *j) {
  const cJSON *tools = j->oai.root ? cJSON_GetObjectItemCaseSensitive(j->oai.root, "tools") : NULL;
  return gw_usage_prompt_max(j->oai.prompt_tokens, j->oai.body_len, cJSON_IsArray(tools));
}

/* The usage the caller is charged and shown, bounded by the gateway's own estimate, the
 * text relayed to the caller and the cap this attempt was sent (bounds.h); a clamp is
 * logged once per request and counted when it ends. Returns 1 when anything was clamped
 * now. */
static int usage_bound(gw_attempt *a) {
  gw_job *j = a->job;
  int64_t p0 = a->prompt_tokens, c0 = a->completion_tokens;
  int bad = a->usage_bad;
  a->usage_bad = 0;
  if (!gw_usage_clamp(&a->prompt_tokens, &a->completion_tokens, &a->cached_tokens, prompt_max(j),
                      gw_usage_completion_max(a->out_bytes, a->out_chunks, a->max_out)) && !bad)
    return 0;
  if (!j->usage_clamped) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "request_id", j->id);
    cJSON_AddStringToObject(f, "replica", a->replica->id);
    cJSON_AddNumberToObject(f, "prompt_tokens", (double)p0); /* after replacing what is no number */
    cJSON_AddNumberToObject(f, "completion_tokens", (double)c0);
    cJSON_AddNumberToObject(f, "charged_prompt_tokens", (double)a->prompt_tokens);
    cJSON_AddNumberToObject(f, "charged_completion_tokens", (double)a->completion_tokens);
    pr_log_kv(PR_LOG_WARN, "usage clamped: the replica reported more than the gateway believes", f);
  }
  j->usage_clamped = 1;
  return 1;
}

/* What an answer, or a stream's chunk, gives the caller: the text and chunks the
 * completion tokens it is charged are bounded by (bounds.h). */
static void note_relayed(gw_attempt *a, const cJSON *root, const char *raw, size_t len) {
  size_t choices = 0;
  a->out_bytes += (int64_t)pr_oai_answer_text_bytes(root, raw, len, &choices);
  a->out_chunks += (int64_t)choices;
}

/* Write the bounded usage back into an answer's (or a chunk's) usage object. */
static void usage_rewrite(const gw_attempt *a, cJSON *root) {
  cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
  if (!cJSON_IsObject(u)) return;
  cJSON *v;
  if ((v = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens")))
    cJSON_ReplaceItemInObjectCaseSensitive(u, "prompt_tokens", cJSON_CreateNumber((double)a->prompt_tokens));
  if ((v = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens")))
    cJSON_ReplaceItemInObjectCaseSensitive(u, "completion_tokens",
                                           cJSON_CreateNumber((double)a->completion_tokens));
  if ((v = cJSON_GetObjectItemCaseSensitive(u, "total_tokens")))
    cJSON_ReplaceItemInObjectCaseSensitive(
        u, "total_tokens", cJSON_CreateNumber((double)(a->prompt_tokens + a->completion_tokens)));
  cJSON *d = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
  if (cJSON_IsObject(d) && cJSON_GetObjectItemCaseSensitive(d, "cached_tokens"))
    cJSON_ReplaceItemInObjectCaseSensitive(d, "cached_tokens", cJSON_CreateNumber((double)a->cached_tokens));
}

/* Why the gateway cut a phone's answer off (a byte per attempt: held streams are many);
 * the reason is written out when the attempt ends (cut_detail). */
enum { GW_CUT_NONE = 0, GW_CUT_ANSWER, GW_CUT_STREAM, GW_CUT_TEXT, GW_CUT_CHUNKS, GW_CUT_EVENT_JSON };

/* Cut the phone's answer off: the write callback then fails the transfer, and on_done
 * charges the phone with the reason. Returns 1 (stop). */
static int attempt_cut(gw_attempt *a, unsigned char why) {
  if (!a->cut) a->cut = why;
  return 1;
}

static void cut_detail(const gw_attempt *a, char *out, size_t n) {
  const gw_job *j = a->job;
  switch (a->cut) {
    case GW_CUT_ANSWER:
      snprintf(out, n, "the answer passed %zu bytes, the most for max_tokens %" PRId64, a->answer_cap,
               j->oai.max_tokens);
      break;
    case GW_CUT_STREAM:
      snprintf(out, n, "the stream passed %zu bytes, the most for max_tokens %" PRId64, a->answer_cap,
               j->oai.max_tokens);
      break;
    case GW_CUT_TEXT:
      snprintf(out, n, "the stream's text passed %zu bytes, the most for max_tokens %" PRId64,
               j->sofar.max, j->oai.max_tokens);
      break;
    case GW_CUT_CHUNKS:
      snprintf(out, n, "the stream sent more than %" PRId64 " text chunks for max_tokens %" PRId64,
               a->max_out + 16, a->max_out);
      break;
    default:
      snprintf(out, n, "an event of the stream is not acceptable JSON (UTF-8, nesting at most 64, "
               "at most 100000 values)");
  }
}

/* Write one event to the client; returns non-zero (stop parsing) once the client is gone.
 * The client's stream starts with the phone's first event that is not an error (or a
 * keep-alive comment): a refusal the phone sends as an error event before anything else
 * can still be answered as a plain error, and a phone that fails before its first event
 * can still be replaced without the client noticing. */
static int relay_event(gw_attempt *a, const char *payload, size_t len) {
  return a->ops->stream_event(a, payload, len);
}

/* A stream shows the phone's pace while it runs, long before its final timings: the
 * first token measures the prefill, then every 16 tokens a stretch of decoding. A phone
 * that turned slow (hot, throttled) is learned within seconds, not at the end of a long
 * answer. The final timings then add nothing new (attempt_learn skips them). The first
 * token's prefill is counted on the tokens the plan expected the phone to read; when it
 * comes sooner than even the plan without its slowdown allows, the engine held more of the
 * prompt cached than the gateway knew (a prompt sent again to the phone that just read it,
 * an engine warm from before a restart) and that count would make a pace of it many times
 * the phone's: the same time on the gateway's clock is counted at the end, on the tokens
 * the engine says it read (prefill_at_end). */
static void learn_live(gw_attempt *a) {
  gw_job *j = a->job;
  uint64_t now = uv_now(j->gw->loop);
  a->last_token_ms = now;
  if (a->sent_tokens == 1) {
    a->first_token_ms = now;
    int64_t uncached = j->oai.prompt_tokens - a->pred_cached;
    double ms = (double)(now - a->start_ms);
    if (uncached > 0 && now > a->start_ms) {
      double plain_s = a->pred_prefill_s / (a->pred_slowdown > 1 ? a->pred_slowdown : 1);
      if (ms < plain_s * 1000.0) a->prefill_ms = ms; /* counted at the end: prefill_at_end */
      else gw_replica_observe(a->replica, (double)uncached, ms, 0, 0);
    }
    a->live_ms = now;
    a->live_tokens = 1;
    return;
  }
  if (a->sent_tokens - a->live_tokens >= 16 && now > a->live_ms) {
    gw_replica_observe(a->replica, 0, 0, (double)(a->sent_tokens - a->live_tokens),
                       (double)(now - a->live_ms));
    a->live_ms = now;
    a->live_tokens = a->sent_tokens;
    a->learned_live = 1;
  }
}

/* Every event of a streamed answer passes through here on its way to the client: usage
 * and timings are noted, the text so far is kept (to continue on another phone if this
 * one fails), and an error event from the phone is held back — the gateway decides what
 * the client sees then. */
static int on_sse_event(void *ud, const pr_sse_event *ev) {
  gw_attempt *a = ud;
  gw_job *j = a->job;
  if (ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0) {
    a->got_done = 1;
    return relay_event(a, ev->data, ev->data_len);
  }
  /* an event that looks like JSON is held to a client body's caps; other text is not
   * ours to judge and passes as it came */
  size_t k = 0;
  while (k < ev->data_len && (ev->data[k] == ' ' || ev->data[k] == '\t')) k++;
  if (k == ev->data_len || (ev->data[k] != '{' && ev->data[k] != '['))
    return relay_event(a, ev->data, ev->data_len);
  cJSON *root = NULL;
  pr_oai_error oe;
  if (pr_oai_parse_answer(ev->data, ev->data_len, &root, &oe) < 0)
    return attempt_cut(a, GW_CUT_EVENT_JSON);
  if (cJSON_GetObjectItemCaseSensitive(root, "error")) {
    /* kept for the verdict when the stream ends (on_done): a refusal or a failure */
    a->stream_error = 1;
    pr_buf_reset(&a->resp);
    if (pr_buf_append(&a->resp, ev->data, ev->data_len)) pr_buf_reset(&a->resp);
    cJSON_Delete(root);
    return 0;
  }
  note_relayed(a, root, ev->data, ev->data_len); /* before its usage: a chunk may carry both */
  attempt_take_usage(a, root);
  int clamped = cJSON_GetObjectItemCaseSensitive(root, "usage") && usage_bound(a);
  if (clamped) usage_rewrite(a, root);
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
  const char *text = pr_oai_chunk_text(root);
  /* a thinking model's reasoning is as much of the answer: kept to go on with, counted
   * as tokens (the silence watchdog, live rates, the chunk bound) */
  const char *reasoning = pr_oai_chunk_reasoning(root);
  if (a->ops->note_chunk(a, cJSON_IsString(id) ? id->valuestring : NULL, text, reasoning,
                         pr_oai_chunk_has_tool_calls(root))) {
    cJSON_Delete(root);
    return attempt_cut(a, GW_CUT_TEXT);
  }
  if (text || reasoning) {
    a->sent_tokens++;
    /* one token a chunk at most (llama-server sends one; others fewer, larger) */
    if (a->sent_tokens > a->max_out + 16) {
      cJSON_Delete(root);
      return attempt_cut(a, GW_CUT_CHUNKS);
    }
    learn_live(a);
  }
  int rc;
  if (j->continues > 0 || clamped) {
    if (j->continues > 0 && pr_oai_continue_chunk(root, j->stream_id, j->sofar_tokens)) {
      cJSON_Delete(root);
      return 0;
    }
    char *out = cJSON_PrintUnformatted(root);
    rc = out ? relay_event(a, out, strlen(out)) : 1;
    free(out);
  } else {
    rc = relay_event(a, ev->data, ev->data_len);
  }
  cJSON_Delete(root);
  return rc;
}

/* SSE comments (llama-server's keep-alives during a long prefill) go through too. */
static int on_sse_comment(void *ud, const char *text, size_t len) {
  gw_attempt *a = ud;
  return a->ops->stream_comment(a, text, len);
}

/* ---- curl callbacks (never finish or cancel anything from here) ------------------------------ */

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud) {
  gw_attempt *a = ud;
  size_t n = size * nmemb;
  gw_job *j = a->job;
  if (a->role == GW_ATT_LOST) return 0; /* the other attempt's answer came first: freed at the turn's end */
  if (!gw_sink_open(&j->sink)) return 0; /* the client left: finishing at the turn's end */
  uint64_t now = uv_now(j->gw->loop);
  if (!a->first_byte_ms) {
    a->first_byte_ms = now;
    curl_easy_getinfo(a->xfer.easy, CURLINFO_RESPONSE_CODE, &a->status);
    char *ct = NULL; /* curl's own copy, valid while the transfer lives */
    curl_easy_getinfo(a->xfer.easy, CURLINFO_CONTENT_TYPE, &ct);
    attempt_move(a, a->status == 200 && j->oai.stream && ct && strstr(ct, "text/event-stream")
                        ? GW_ATT_STREAM : GW_ATT_ANSWER);
    /* a hedged request: the first answer wins (the job swaps attempts, never cancels here) */
    if (a->ops->answer_began) a->ops->answer_began(a);
  }
  a->last_byte_ms = a->heard_ms = now;
  gw_replica_alive(a->replica, now); /* a phone sending bytes needs no check for being busy */
  if (a->state != GW_ATT_STREAM) {
    if (pr_buf_append(&a->resp, data, n)) {
      attempt_cut(a, GW_CUT_ANSWER);
      return 0;
    }
    attempt_arm(a, a->worst_s * 2 + j->conf->stream_idle_timeout_s);
    return n;
  }
  int behind = a->ops->client_behind(a);
  if (behind < 0) return 0;
  if (behind) {
    /* the client is slow, not the phone: wait for it, but not forever */
    a->paused = 1;
    attempt_arm(a, j->conf->send_timeout_s);
    return CURL_WRITEFUNC_PAUSE;
  }
  a->stream_bytes += n;
  if (a->stream_bytes > a->answer_cap) {
    attempt_cut(a, GW_CUT_STREAM);
    return 0;
  }
  if (pr_sse_feed(&a->sse, data, n) != 0) return 0; /* too large, cut, or the client left */
  attempt_arm(a, gw_attempt_silence_s(a, now, 0)); /* the others' prompts are counted if it fires */
  return n;
}




/* ---- finishing an attempt --------------------------------------------------------------------- */

gw_fail_kind gw_attempt_fail_kind(CURLcode rc) {
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT: return GW_FAIL_TIMEOUT;
    case CURLE_WRITE_ERROR:
    case CURLE_BAD_CONTENT_ENCODING:
    case CURLE_WEIRD_SERVER_REPLY: return GW_FAIL_PROTOCOL;
    default: return GW_FAIL_CONNECT;
  }
}

/* The phone's timings for this answer were far from the gateway's clock, which won:
 * counted always, logged at most once a minute per replica (a liar answers often). */
#define GW_DISAGREE_LOG_MS 60000
static void timings_disagreed(gw_attempt *a, const gw_timings *said, const gw_timings *learned,
                              double pre_wall, double dec_wall, double total_wall) {
  gw_replica *r = a->replica;
  uint64_t now = uv_now(a->job->gw->loop);
  r->served.n_timings_disagreed++;
  if (r->served.disagree_log_ms && now < r->served.disagree_log_ms + GW_DISAGREE_LOG_MS) {
    r->served.disagree_unlogged++;
    return;
  }
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", a->job->id);
  cJSON_AddStringToObject(f, "replica", r->id);
  cJSON_AddNumberToObject(f, "reported_prompt_ms", round(said->prompt_ms * 10) / 10);
  cJSON_AddNumberToObject(f, "reported_predicted_ms", round(said->pred_ms * 10) / 10);
  if (total_wall > 0) {
    cJSON_AddNumberToObject(f, "observed_total_ms", total_wall);
  } else {
    cJSON_AddNumberToObject(f, "observed_prompt_ms", pre_wall);
    cJSON_AddNumberToObject(f, "observed_predicted_ms", dec_wall);
  }
  cJSON_AddNumberToObject(f, "learned_prompt_ms", round(learned->prompt_ms * 10) / 10);
  cJSON_AddNumberToObject(f, "learned_predicted_ms", round(learned->pred_ms * 10) / 10);
  cJSON_AddNumberToObject(f, "trust_factor", a->job->conf->timings_trust_factor);
  cJSON_AddNumberToObject(f, "disagreed_total", (double)r->served.n_timings_disagreed);
  cJSON_AddNumberToObject(f, "not_logged", r->served.disagree_unlogged);
  pr_log_kv(PR_LOG_WARN, "timings disagreed: learned from the gateway's clock", f);
  r->served.disagree_log_ms = now;
  r->served.disagree_unlogged = 0;
}

/* t's prompt count turned into the gateway's own (gw_own_evaluated: the phone's time is for
 * its tokens, learned per token of the gateway's count; 0: none learned). Returns it. */
static double own_prompt_count(const gw_attempt *a, gw_timings *t) {
  const gw_job *j = a->job;
  double own = gw_own_evaluated((double)j->oai.prompt_tokens,
                                (double)(j->oai.prompt_tokens - a->pred_cached),
                                (double)a->prompt_tokens, t->prompt_n);
  if (isfinite(t->prompt_n) && t->prompt_n > 0) t->prompt_n = own;
  return own;
}

/* How much of the hit it was planned on the engine confirmed (pcache.h, the learned share):
 * the share of the prompt the engine reused (cache_n over its prompt tokens) over the share
 * the prediction said (before the learned share, over the gateway's estimate), since the
 * engine's tokenizer is not the gateway's. Only a predicted hit teaches it; every answer
 * that says its prompt tokens teaches the engine's tokens per estimated token. */
static void cache_learn(gw_attempt *a) {
  gw_job *j = a->job;
  gw_replica *r = a->replica;
  if (a->cached_known && a->prompt_tokens > 0 && a->reuse_was)
    gw_pcache_learn_tokens(&r->pc, j->oai.model, a->prompt_tokens, j->oai.prompt_tokens, uv_now(j->gw->loop));
  if (!a->cached_known || a->pred_cached <= 0 || a->prompt_tokens <= 0 || j->oai.prompt_tokens <= 0 ||
      !(a->pred_share > 0) || !a->reuse_was)
    return;
  double raw = (double)a->pred_cached / a->pred_share;
  double confirmed = ((double)a->cached_tokens / (double)a->prompt_tokens) / (raw / (double)j->oai.prompt_tokens);
  gw_pcache_learn(&r->pc, j->oai.model, confirmed, uv_now(j->gw->loop));
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "request_id", j->id);
  cJSON_AddStringToObject(f, "replica", r->id);
  cJSON_AddNumberToObject(f, "predicted_cached_tokens", (double)a->pred_cached);
  cJSON_AddNumberToObject(f, "cache_n", (double)a->cached_tokens);
  cJSON_AddNumberToObject(f, "prompt_tokens", (double)a->prompt_tokens);
  cJSON_AddNumberToObject(f, "confirmed", round(confirmed * 1000) / 1000);
  cJSON_AddNumberToObject(f, "share", round(gw_pcache_share(&r->pc, j->oai.model) * 1000) / 1000);
  cJSON_AddBoolToObject(f, "checkpoints", r->pc.hybrid);
  pr_log_kv(PR_LOG_DEBUG, "cache confirmed", f);
}

/* A stream's first token that came sooner than its plan allowed (learn_live): its time on
 * the gateway's clock over the prompt tokens the engine says it read, in the gateway's
 * count and never more than the plan's (a phone that claims to have read more buys no
 * speed) -- its share of its prompt when it says what it took from its cache, else its
 * timings' count of tokens read (llama.cpp of 2025 streams no cache count) at the tokens
 * per estimated token learned for the model; nothing when it says neither (any pace could
 * be made of an unknown hit), nor for fewer tokens than a pace is learned from. Whatever
 * the phone claims of its own times plays no part. */
static void prefill_at_end(gw_attempt *a) {
  const gw_job *j = a->job;
  if (!(a->prefill_ms > 0)) return;
  double cap = (double)(j->oai.prompt_tokens - a->pred_cached), own;
  int64_t read;
  if (a->cached_known && a->prompt_tokens > 0) {
    own = gw_own_evaluated((double)j->oai.prompt_tokens, cap, (double)a->prompt_tokens,
                           (double)(a->prompt_tokens - a->cached_tokens));
  } else if ((read = gw_bound_count(a->t_prompt_n)) > 0) {
    own = (double)read / gw_pcache_token_ratio(&a->replica->pc, j->oai.model);
    if (own > cap) own = cap;
  } else {
    return;
  }
  gw_replica_observe(a->replica, own, a->prefill_ms, 0, 0);
}

/* finished: the answer ended as it should (a whole answer, or a stream's [DONE]), so its
 * length says how long such answers are. */
static void attempt_learn(gw_attempt *a, int finished) {
  gw_job *j = a->job;
  gw_replica *r = a->replica;
  gw_server *gw = j->gw;
  /* streams without include_usage still carry llama-server's timings */
  int64_t n;
  if (a->completion_tokens <= 0 && (n = gw_bound_count(a->t_pred_n)) > 0) a->completion_tokens = n;
  if (a->prompt_tokens <= 0 && (n = gw_bound_count(a->t_prompt_n)) > 0)
    a->prompt_tokens = n + a->cached_tokens;
  /* Builds of llama-server that report neither prompt_tokens_details nor timings.cache_n
   * still say how many prompt tokens they evaluated (timings.prompt_n): the rest of the
   * prompt came from the cache. */
  if (!a->cached_known && a->prompt_tokens > 0 && (n = gw_bound_count(a->t_prompt_n)) > 0 &&
      n < a->prompt_tokens)
    a->cached_tokens = a->prompt_tokens - n;
  usage_bound(a);
  cache_learn(a);
  prefill_at_end(a);
  if (a->learned_live) {
    /* measured while it streamed */
  } else if (a->t_prompt_ms > 0 || a->t_pred_ms > 0 || !isfinite(a->t_prompt_ms) ||
             !isfinite(a->t_pred_ms)) {
    /* the phone's own word, within what the gateway's clock saw: the first byte of a
     * stream comes after its prefill and the rest is decoding; a whole answer's first
     * byte comes after both */
    gw_timings t = {a->state == GW_ATT_STREAM && a->live_tokens ? 0 : a->t_prompt_n, a->t_prompt_ms,
                    a->t_pred_n, a->t_pred_ms};
    double pre_wall = 0, dec_wall = 0, total_wall = 0;
    if (a->first_byte_ms > a->launch_ms && a->launch_ms) {
      if (a->state == GW_ATT_STREAM) {
        pre_wall = (double)(a->first_byte_ms - a->launch_ms);
        dec_wall = (double)(a->last_byte_ms - a->first_byte_ms);
      } else {
        total_wall = (double)(a->first_byte_ms - a->launch_ms);
      }
    }
    double max_prompt = (double)prompt_max(j);
    gw_timings said = t;
    double own_prompt = own_prompt_count(a, &t);
    int disagreed = 0;
    gw_verify_timings(&t, own_prompt, (double)a->completion_tokens, max_prompt, (double)a->max_out + 1,
                      pre_wall, dec_wall, total_wall, j->conf->timings_trust_factor, &disagreed);
    if (disagreed) timings_disagreed(a, &said, &t, pre_wall, dec_wall, total_wall);
    gw_replica_observe(r, t.prompt_n, t.prompt_ms, t.pred_n, t.pred_ms);
  } else if (a->state == GW_ATT_STREAM && a->first_byte_ms) {
    /* no timings (not llama-server): time to first byte is the prefill, the rest decode;
     * the counts are the phone's usage, so they buy no more speed than the gateway's own
     * counts show */
    gw_timings t = {a->prefill_ms > 0 ? 0 : (double)(a->prompt_tokens - a->cached_tokens),
                    (double)(a->first_byte_ms - a->start_ms),
                    (double)(a->completion_tokens - 1), (double)(a->last_byte_ms - a->first_byte_ms)};
    double own_prompt = own_prompt_count(a, &t);
    gw_bound_timings(&t, own_prompt, (double)a->sent_tokens - 1, 0, 0, t.prompt_ms, t.pred_ms, 0);
    gw_replica_observe(r, t.prompt_n, t.prompt_ms, t.pred_n, t.pred_ms);
  }
  gw_fleet_publish(gw, &(gw_fleet_event){.kind = GW_FLEET_RATES, .r = r});
  j->tokens_in = (uint64_t)(a->prompt_tokens > 0 ? a->prompt_tokens : j->oai.prompt_tokens);
  j->tokens_out = (uint64_t)(a->completion_tokens > 0 ? a->completion_tokens : 0) +
                  (uint64_t)j->sofar_tokens; /* what earlier phones of a continued stream sent */
  j->cached_tokens = a->cached_tokens;
  j->pred_cached = a->pred_cached;
  r->served.tokens_in += j->tokens_in;
  r->served.tokens_out += j->tokens_out;
  r->served.last_latency_s = (double)(uv_now(gw->loop) - a->start_ms) / 1000.0;
  /* the whole answer, a continued stream's earlier text too; a stream is at least what the
   * gateway relayed (a phone cannot make such answers look shorter than they are) */
  double out = (double)(a->completion_tokens > 0 ? a->completion_tokens : 0);
  if (a->state == GW_ATT_STREAM && (double)a->sent_tokens > out) out = (double)a->sent_tokens;
  /* a check's shadow repeats a caller's answer, learnt already (and may be cut shorter) */
  if (finished && out > 0 && !j->shadow)
    gw_model_learn_out(&gw->models, j->model, j->oai.max_tokens, out + (double)j->sofar_tokens,
                       uv_now(gw->loop));
}

static void on_done(CURL *easy, CURLcode rc, void *ud) {
  (void)easy;
  gw_attempt *a = ud;
  gw_job *j = a->job;
  if (a->role == GW_ATT_LOST) return; /* the other attempt won: freed at the turn's end */
  if (a->role == GW_ATT_RUNNING) uv_timer_stop(&j->watchdog); /* the job's timer is its attempt's, not a hedge's */
  if (!gw_sink_open(&j->sink)) {
    a->ops->finish(a, 0); /* the client left */
    return;
  }
  if (rc != CURLE_OK && a->cut) {
    char detail[160];
    cut_detail(a, detail, sizeof(detail));
    a->ops->failed(a, GW_FAIL_PROTOCOL, detail); /* the gateway cut it off: the phone's fault */
    return;
  }
  if (rc != CURLE_OK) {
    char detail[CURL_ERROR_SIZE + 64];
    snprintf(detail, sizeof(detail), "%s", pr_curlreq_error(&a->xfer, rc));
    /* the URL policy refused the phone's address: it cannot be reached as registered */
    if (pr_curlreq_refused(&a->xfer)) gw_registry_address_refused(j->gw, a->replica, pr_curlreq_refused(&a->xfer));
    /* the gateway itself ran out of something (file descriptors, memory, local ports):
     * not the phone's fault */
    long os_err = a->local_errno;
    if (!os_err) curl_easy_getinfo(a->xfer.easy, CURLINFO_OS_ERRNO, &os_err);
    if (rc == CURLE_OUT_OF_MEMORY || gw_local_errno((int)os_err)) {
      snprintf(detail, sizeof(detail), "the gateway is out of resources: %s",
               os_err ? strerror((int)os_err) : curl_easy_strerror(rc));
      a->ops->failed(a, GW_FAIL_LOCAL, detail);
      return;
    }
    gw_fail_kind kind = gw_attempt_fail_kind(rc);
    /* a reset after the answer began is not a failure to connect */
    if (kind == GW_FAIL_CONNECT && a->first_byte_ms) kind = GW_FAIL_CUT;
    a->ops->failed(a, kind, detail);
    return;
  }
  if (!a->first_byte_ms) curl_easy_getinfo(a->xfer.easy, CURLINFO_RESPONSE_CODE, &a->status);
  uint64_t now = uv_now(j->gw->loop);
  double elapsed = (double)((a->first_byte_ms ? a->first_byte_ms : now) - a->launch_ms) / 1000.0;
  const char *eb = a->resp.data ? a->resp.data : "";
  if (a->state == GW_ATT_STREAM) {
    if (a->got_done && !a->stream_error) {
      attempt_learn(a, 1);
      a->ops->stream_end(a);
      a->ops->done(a);
      return;
    }
    if (!a->stream_error) {
      attempt_learn(a, 0); /* cut short: its rates, not its length */
      a->ops->failed(a, GW_FAIL_PROTOCOL, "the stream ended without [DONE]");
      return;
    }
    /* An error event. Before the client's stream began it is judged like a whole error
     * answer; once text went out, promptness means nothing (it is read as prompt) */
    long est = gw_verdict_event_status(eb, a->resp.len);
    gw_verdict v = gw_verdict_of(est, eb, a->resp.len, gw_job_streamed(j) ? 0 : elapsed,
                                 j->conf->refusal_window_s);
    if (v == GW_VERDICT_REFUSED || v == GW_VERDICT_AMBIGUOUS || v == GW_VERDICT_UNPARSABLE) {
      a->ops->refused(a, v == GW_VERDICT_UNPARSABLE ? GW_REFUSED_UNPARSABLE : v == GW_VERDICT_AMBIGUOUS, est, eb,
                      a->resp.len);
    } else {
      char detail[96];
      snprintf(detail, sizeof(detail), "an error event (%ld) in the stream", est);
      a->ops->failed(a, v == GW_VERDICT_LOADING ? GW_FAIL_LOADING : GW_FAIL_PROTOCOL, detail);
    }
    return;
  }
  long st = a->status;
  if (st == 200) {
    if (j->oai.stream) {
      /* a whole answer to a stream (or to a stream's continuation): the phone's failure,
       * never something to send on a stream the client may already be reading */
      a->ops->failed(a, GW_FAIL_PROTOCOL, "asked for a stream, got a whole answer");
      return;
    }
    cJSON *root = NULL;
    pr_oai_error oe;
    if (pr_oai_parse_answer(eb, a->resp.len, &root, &oe) < 0 || !cJSON_IsObject(root)) {
      char detail[200];
      snprintf(detail, sizeof(detail), "the answer is not an acceptable JSON object%s%.150s",
               root ? "" : ": ", root ? "" : oe.message);
      cJSON_Delete(root);
      a->ops->failed(a, GW_FAIL_PROTOCOL, detail);
      return;
    }
    note_relayed(a, root, eb, a->resp.len);
    attempt_take_usage(a, root);
    attempt_learn(a, 1);
    char *fixed = NULL;
    if (j->usage_clamped) {
      /* what the caller is shown is what it is charged */
      usage_rewrite(a, root);
      fixed = cJSON_PrintUnformatted(root);
    }
    cJSON_Delete(root);
    if (fixed) a->ops->respond(a, 200, "application/json", fixed, strlen(fixed));
    else a->ops->respond(a, 200, "application/json", a->resp.data, a->resp.len);
    free(fixed);
    a->ops->done(a);
    return;
  }
  gw_verdict v = gw_verdict_of(st, eb, a->resp.len, elapsed, j->conf->refusal_window_s);
  if (gw_job_streamed(j) && (v == GW_VERDICT_REFUSED || v == GW_VERDICT_AMBIGUOUS)) {
    /* the phone continuing a started stream answered a plain error: the request was the
     * gateway's own (the text so far to go on with), so this is the continuation's
     * failure — another phone goes on, or the client's stream ends with an error event */
    char detail[128];
    snprintf(detail, sizeof(detail), "the stream's continuation was answered HTTP %ld, not a stream", st);
    /* not charged: the carried text may well be what it refused (a context overflow) */
    j->continuation_refused = 1;
    a->ops->failed(a, GW_FAIL_STATUS, detail);
    return;
  }
  switch (v) {
    case GW_VERDICT_LOADING:
      a->ops->failed(a, GW_FAIL_LOADING, "503 Loading model");
      return;
    case GW_VERDICT_REFUSED:
      a->ops->refused(a, 0, st, eb, a->resp.len);
      return;
    case GW_VERDICT_AMBIGUOUS:
      a->ops->refused(a, 1, st, eb, a->resp.len);
      return;
    case GW_VERDICT_UNPARSABLE:
      a->ops->refused(a, GW_REFUSED_UNPARSABLE, st, eb, a->resp.len);
      return;
    case GW_VERDICT_PHONE:
      break;
  }
  char detail[160];
  snprintf(detail, sizeof(detail), "HTTP %ld%s", st,
           st >= 500 && elapsed > j->conf->refusal_window_s ? " (late)" : "");
  a->ops->failed(a, GW_FAIL_STATUS, detail);
}

/* ---- the watchdog ------------------------------------------------------------------------------ */

/* The phone's expected gap between tokens of a (seconds; 0 unknown): its learned decode
 * rate, slowed as the planner sees it. */
static double expected_gap_s(const gw_attempt *a, uint64_t now) {
  const gw_replica *r = a->replica;
  return r->decode_tps > 0 ? gw_replica_slowdown(r, now) / r->decode_tps : 0;
}

/* How long a started stream may be silent (silence.h): from its first token on, a few
 * times its phone's pace; before it (a prefill, perhaps with keep-alive comments),
 * stream_idle_timeout_s. With cover, the other requests reading their prompts on the
 * same phone (they hold its streams back: one batch each) extend it. */
double gw_attempt_silence_s(const gw_attempt *a, uint64_t now, int cover) {
  const gw_config *c = a->job->conf;
  if (a->sent_tokens < 1) return c->stream_idle_timeout_s;
  const gw_replica *r = a->replica;
  double slow = gw_predict_slowdown(r, now), cover_s = 0; /* as planned */
  for (int i = 0; cover && i < GW_MAX_SLOTS; i++) {
    const gw_attempt *o = r->leases[i].owner;
    if (!r->leases[i].id || !o || o == a || r->leases[i].id != o->lease) continue; /* (once per request) */
    if (o->state == GW_ATT_SENT || (o->state == GW_ATT_STREAM && o->sent_tokens == 0))
      cover_s += gw_silence_cover_s((double)(o->job->oai.prompt_tokens - o->pred_cached),
                                    r->prefill_tps, slow);
  }
  double seen = a->sent_tokens >= 2 && a->last_token_ms > a->first_token_ms
                    ? (double)(a->last_token_ms - a->first_token_ms) / 1000.0 / (double)(a->sent_tokens - 1)
                    : 0;
  gw_silence_in in = {.factor = c->stream_silence_factor, .floor_s = c->stream_silence_min_s,
                      .idle_max_s = c->stream_idle_timeout_s, .decode_tps = r->decode_tps,
                      .slowdown = slow, .seen_gap_s = seen, .cover_s = cover_s};
  return gw_silence_limit_s(&in);
}

int gw_attempt_flowing(const gw_attempt *a, uint64_t now) {
  if (!a->heard_ms || now < a->heard_ms) return a->heard_ms != 0;
  double quiet = (double)(now - a->heard_ms) / 1000.0, gap = expected_gap_s(a, now) * 2;
  return quiet < (gap > 1 ? gap : 1);
}

static void watchdog_cb(uv_timer_t *t) {
  gw_job *j = t->data;
  gw_attempt *a = gw_job_running(j);
  if (!a) return;
  if (a->paused && gw_sink_open(&j->sink)) {
    a->ops->client_stalled(a); /* let go of the client and of the phone's slot */
    return;
  }
  uint64_t now = uv_now(j->gw->loop);
  char detail[200];
  if (a->state == GW_ATT_STREAM && a->sent_tokens > 0) {
    /* the silence watchdog: is the silence explained by prompts read beside it? */
    double limit = gw_attempt_silence_s(a, now, 1), quiet = (double)(now - a->heard_ms) / 1000.0;
    if (quiet + 0.01 < limit) {
      attempt_arm(a, limit - quiet);
      return;
    }
    if (limit < j->conf->stream_idle_timeout_s) {
      double gap = expected_gap_s(a, now);
      snprintf(detail, sizeof(detail),
               "the stream fell silent for %.1f s after %" PRId64 " tokens (limit %.1f s; "
               "expected %.3f s between tokens)", quiet, a->sent_tokens, limit, gap);
      gw_attempt_cancel(a);
      a->ops->failed(a, GW_FAIL_TIMEOUT, detail);
      return;
    }
  }
  if (!a->first_byte_ms)
    snprintf(detail, sizeof(detail), "no answer within %.1f s",
             (double)(uv_now(j->gw->loop) - a->start_ms) / 1000.0);
  else
    snprintf(detail, sizeof(detail), "the answer stalled for %.1f s",
             (double)(uv_now(j->gw->loop) - a->last_byte_ms) / 1000.0);
  gw_attempt_cancel(a);
  a->ops->failed(a, GW_FAIL_TIMEOUT, detail);
}

/* The longest any watchdog waits: no prediction, however odd the rates it came from, can
 * put a phone out of the watchdog's reach. */
#define GW_WATCHDOG_MAX_S (7 * 86400.0)

static void attempt_arm(gw_attempt *a, double seconds) {
  gw_job *j = a->job;
  /* a hedge has no timer of its own: the running attempt's watchdog covers the wait, and a
   * hedge that takes over is armed then (gw_attempt_rearm) */
  if (j->state == GW_JOB_DONE || a->role != GW_ATT_RUNNING) return;
  if (!isfinite(seconds)) seconds = j->conf->timeout_min_s;
  if (seconds > GW_WATCHDOG_MAX_S) seconds = GW_WATCHDOG_MAX_S;
  if (seconds < 0.05) seconds = 0.05;
  uv_timer_start(&j->watchdog, watchdog_cb, (uint64_t)(seconds * 1000.0), 0);
}

/* ---- start, cancel, free --------------------------------------------------------------------- */

/* The body for a's phone: the request (or its continuation), uncached unless a may reuse
 * the phone's cache, pinned to a's slot if it has one. The transfer, once open, sends the
 * new body. */
static int attempt_render(gw_attempt *a) {
  gw_job *j = a->job;
  int rc = pr_oai_set_cache(&j->oai, a->reuse, -1); /* a caller's "id_slot" never goes through */
  if (rc < 0) return rc;
  a->req_body.len = 0;
  /* a phone that serves continue_final_message goes on inside the answer so far, its
   * reasoning included, and repeats none of it (docs/routing.md "Streaming") */
  pr_oai_cont_mode mode = a->replica->features & PR_FEAT_CONTINUE ? PR_OAI_CONT_FINAL : PR_OAI_CONT_PREFILL;
  rc = j->continues > 0 ? pr_oai_render_continuation(&j->oai, pr_buf_cstr(&j->sofar), pr_buf_cstr(&j->sofar_reasoning),
                                                    mode, j->oai.max_tokens - j->sofar_tokens, &a->req_body)
                        : pr_oai_render(&j->oai, &a->req_body);
  if (rc < 0) return rc;
  a->reuse_was = a->reuse;
  if (a->xfer.easy) {
    curl_easy_setopt(a->xfer.easy, CURLOPT_POSTFIELDS, a->req_body.data);
    curl_easy_setopt(a->xfer.easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)a->req_body.len);
  }
  return 0;
}

/* a may not reuse its phone's cache after all (Redis is away or failed, the log could not
 * be written): the phone counts as holding several scopes' prompts from now on, and it goes
 * there uncached. A phone whose agent keeps scopes apart decides itself. */
static void attempt_no_reuse(gw_attempt *a) {
  if (a->replica->pc.agent) return;
  if (a->job->gw->shared) a->replica->pc.unshared = 1; /* Redis did not see this one */
  if (!a->reuse) return;
  a->reuse = 0;
  gw_pcache_mix(&a->replica->pc);
}

static int attempt_launch(gw_attempt *a) {
  gw_job *j = a->job;
  const gw_config *c = j->conf;
  /* what its engine may hold is logged before it does; unlogged, nobody may count on it */
  if (gw_cachescope_note(j->gw, a->replica) < 0 && a->reuse && !a->replica->pc.agent) {
    attempt_no_reuse(a);
    (void)gw_cachescope_note(j->gw, a->replica);
    int rc = attempt_render(a);
    if (rc < 0) return rc;
  }
  if (!a->reuse) gw_metrics_cache_isolated(j->gw);
  int rc = pr_curlm_add(j->gw->curlm, a->xfer.easy, on_done, a);
  if (rc < 0) return rc;
  attempt_move(a, GW_ATT_SENT);
  a->launch_ms = uv_now(j->gw->loop);
  /* an answer is awaited there now: health checks a phone with work more often */
  gw_fleet_publish(j->gw, &(gw_fleet_event){.kind = GW_FLEET_SENT, .r = a->replica, .now_ms = a->launch_ms});
  /* the first byte of a stream comes after the prefill; a whole answer after all of it,
   * at worst the whole cap (this request's own: no other caller moves it) */
  double first = j->oai.stream ? a->pred_prefill_s : a->worst_s;
  attempt_arm(a, first * c->timeout_margin + c->timeout_min_s);
  return 0;
}

void gw_attempt_rearm(gw_attempt *a) {
  gw_job *j = a->job;
  const gw_config *c = j->conf;
  if (a->state == GW_ATT_LEASING) {
    /* launching arms it; until then the timer of the attempt this one replaces (a hedge
     * taking over) must not fire on it */
    uv_timer_stop(&j->watchdog);
    return;
  }
  uint64_t now = uv_now(j->gw->loop);
  if (a->state == GW_ATT_SENT) {
    double first = (j->oai.stream ? a->pred_prefill_s : a->worst_s) * c->timeout_margin + c->timeout_min_s;
    attempt_arm(a, first - (double)(now - a->launch_ms) / 1000.0);
  } else {
    attempt_arm(a, c->stream_idle_timeout_s);
  }
}

void gw_attempt_lease_result(gw_attempt *a, int granted) {
  gw_job *j = a->job;
  /* the client left while Redis answered: the job finishes at the turn's end, and the
   * request must not reach a phone (gw_attempt_cancel gives the lease back); a hedge's
   * race already lost: the same */
  if (!gw_sink_open(&j->sink) || a->role == GW_ATT_LOST) return;
  if (granted == 0) {
    a->ops->lease_denied(a);
    return;
  }
  int rc = 0;
  /* Redis knows what every gateway sent there: it may forbid the reuse this one allowed
   * (shared.c sets reuse from the lease's answer; Redis failing leaves nobody sure) */
  if (granted < 0 && a->reuse) attempt_no_reuse(a);
  if (a->reuse_was && !a->reuse) rc = attempt_render(a);
  if (rc == 0) rc = attempt_launch(a);
  if (rc < 0) a->ops->failed(a, GW_FAIL_PROTOCOL, pr_strerror(rc));
}

/* a at the end of its job's list of attempts (they are few: a running one, a hedge, one
 * lost for the rest of the turn), and off it */
static void attempt_link(gw_attempt *a) {
  gw_attempt **p = &a->job->atts, *prev = NULL;
  while (*p) {
    prev = *p;
    p = &(*p)->next;
  }
  a->prev = prev;
  a->next = NULL;
  *p = a;
}

static void attempt_unlink(gw_attempt *a) {
  gw_job *j = a->job;
  if (a->prev) a->prev->next = a->next;
  else if (j->atts == a) j->atts = a->next;
  if (a->next) a->next->prev = a->prev;
  a->next = a->prev = NULL;
}

int gw_attempt_start(gw_job *j, const gw_attempt_ops *ops, gw_replica *r, double pred_prefill_s,
                     double pred_service_s, int64_t pred_cached, gw_attempt_role role,
                     gw_attempt **out) {
  gw_server *gw = j->gw;
  const gw_config *c = j->conf;
  gw_attempt *a = calloc(1, sizeof(*a));
  if (!a) return -ENOMEM;
  a->job = j;
  a->ops = ops;
  a->role = role;
  a->defer.kind = GW_DEFER_ATTEMPT;
  a->pred_share = r->pc.hybrid ? gw_pcache_share(&r->pc, j->oai.model) : 1.0;
  a->replica = r;
  a->pred_prefill_s = pred_prefill_s;
  a->pred_service_s = pred_service_s;
  a->pred_cached = pred_cached;
  a->start_ms = uv_now(gw->loop);
  /* the longest this request may take here: its prefill as planned, then its whole cap */
  double slow = gw_predict_slowdown(r, a->start_ms);
  a->pred_slowdown = slow;
  a->worst_s = pred_prefill_s + (r->decode_tps > 0 ? (double)j->oai.max_tokens / r->decode_tps * slow : 0);
  if (a->worst_s < pred_service_s) a->worst_s = pred_service_s;
  if (!isfinite(a->worst_s) || a->worst_s < 0) a->worst_s = 0; /* then timeout_min_s bounds it */
  /* what the phone may send is bounded by the tokens it was asked for (bounds.h) */
  a->max_out = j->continues > 0 ? j->oai.max_tokens - j->sofar_tokens : j->oai.max_tokens;
  if (a->max_out < 1) a->max_out = 1;
  a->answer_cap = gw_answer_cap(j->oai.max_tokens, c->answer_bytes_per_token,
                                pr_oai_wants_logprobs(&j->oai), PR_CAP_ANSWER);
  pr_buf_init(&a->req_body, PR_CAP_ANSWER);
  pr_buf_init(&a->resp, a->answer_cap);
  pr_sse_init(&a->sse, PR_CAP_SSE_EVENT, on_sse_event, on_sse_comment, a);
  attempt_link(a); /* on its job's list before it can report anything */
  if (role == GW_ATT_RUNNING) snprintf(j->replica_id, sizeof(j->replica_id), "%s", r->id);
  a->lease = gw_replica_acquire_class(r, a->start_ms, (uint64_t)(pred_service_s * 1000.0), a,
                                      j->prio == GW_PRIO_BATCH);
  /* several choices are written at once, each on a slot of the phone: as many leases */
  if (j->oai.choices > 1 && (a->more_leases = calloc((size_t)j->oai.choices - 1, sizeof(uint64_t))))
    for (int k = 1; k < j->oai.choices; k++) {
      uint64_t l = gw_replica_acquire_class(r, a->start_ms, (uint64_t)(pred_service_s * 1000.0), a,
                                            j->prio == GW_PRIO_BATCH);
      if (l) a->more_leases[a->n_more++] = l;
    }

  /* whether the phone may reuse what it cached: only its own scope's prompts (pcache.h).
   * A phone whose agent keeps scopes apart is told the scope and decides; for any other,
   * with other gateways Redis has the last word (the lease), and Redis away nobody knows
   * what the others sent there */
  a->reuse = gw_pcache_may_reuse(&r->pc, j->cache_scope);
  if (!r->pc.agent && gw_shared_usable(gw)) a->reuse = 1; /* Redis decides with the lease (shared.c) */
  else if (gw_shared_degraded(gw)) attempt_no_reuse(a);
  int rc = attempt_render(a);
  if (rc < 0) goto fail;
  gw_pquery pq = {.blocks = j->oai.blocks, .n_blocks = j->oai.n_blocks, .prompt_tokens = j->oai.prompt_tokens,
                  .user_at = j->oai.user_at, .user_fp = j->oai.user_fp, .full_fp = j->oai.full_fp,
                  .model = j->oai.model};
  gw_pcache_sent_q(&r->pc, j->cache_scope, a->reuse, &pq);

  char rid[160], scope[64];
  snprintf(rid, sizeof(rid), "x-request-id: %s", j->id);
  snprintf(scope, sizeof(scope), "x-fleetgate-cache-scope: %016" PRIx64, j->cache_scope);
  /* a phone URL that leads back to a gateway is refused there (server.c gw_handle) */
  char hop[192];
  snprintf(hop, sizeof(hop), "x-fleetgate-hop: %s",
           j->conf->gateway_id && j->conf->gateway_id[0] ? j->conf->gateway_id : "gateway");
  const char *const lines[] = {"Content-Type: application/json", "Expect:", rid, hop, scope, NULL};
  const pr_curlreq_opts o = {
      .base = r->url,
      .path = j->path,
      .method = "POST",
      .body = a->req_body.data,
      .body_len = a->req_body.len,
      .headers = lines,
      .bearer = r->token,
      .write_fn = on_write,
      .write_ud = a,
      .errbuf = a->errbuf,
      .local_errno = &a->local_errno, /* a socket() failure (EMFILE...) is the gateway's own */
      .tcp_keepalive = 1,
      /* curl's receive buffer is allocated per transfer (16 KiB by default) and lives as
       * long as the request: phones send events of a few hundred bytes and answers of a
       * few KiB, so 2 KiB costs a few more reads for a long whole answer and saves 14 KiB
       * per held request (B3; a fraud review is held for minutes). */
      .buffer_size = GW_UPSTREAM_RECV_BUFFER,
      .http11 = 1,
      .connect_timeout_ms = (long)(c->connect_timeout_s * 1000),
      .insecure = !c->tls_verify,
      .ca_file = c->ca_file,
      .user_agent = "fleetgate/" FLEETGATE_VERSION,
  };
  rc = pr_curlreq_open(&a->xfer, gw->curlm, &o);
  if (rc < 0) goto fail;

  /* with other gateways, a lease in Redis first; the answer launches the request */
  if (gw_shared_lease(gw, a, gw_attempt_lease_result) == 0) {
    if (out) *out = a;
    return 0;
  }
  if (gw->shared && a->reuse) {
    attempt_no_reuse(a); /* Redis could not be asked */
    if ((rc = attempt_render(a)) < 0) goto fail;
  }
  rc = attempt_launch(a);
  if (rc < 0) goto fail;
  if (out) *out = a;
  return 0;
fail:
  gw_attempt_free(a); /* off the job's list again */
  return rc;
}

void gw_attempt_cancel(gw_attempt *a) {
  if (a->rlease_cmd || a->rlease_held) gw_shared_lease_end(a->job->gw, a);
  if (a->xfer.easy && a->state != GW_ATT_LEASING) pr_curlm_cancel(a->job->gw->curlm, a->xfer.easy);
  if (a->lease) {
    gw_server *gw = a->job->gw;
    uint64_t now = uv_now(gw->loop);
    double held_s = (double)(now - a->start_ms) / 1000.0;
    /* the hedge budget's window: all phone work, and the hedges' share of it */
    gw_hedge_note(&gw->hedge_ledger, now, held_s, a->hedge);
    /* verification's budget: all phone work, and the shadow requests' share (verify.c) */
    gw_hedge_note(&gw->vfy.ledger, now, held_s, a->job->shadow);
    if (a->job->shadow && held_s > 0) gw->vfy.stats.slot_s += held_s;
    gw_metrics_slot_seconds(gw, held_s, a->hedge);
    gw_cost_attempt_end(a->job->gw, a);
    gw_replica_release(a->replica, a->lease);
    a->lease = 0;
  }
  for (int k = 0; k < a->n_more; k++) gw_replica_release(a->replica, a->more_leases[k]);
  a->n_more = 0;
  free(a->more_leases);
  a->more_leases = NULL;
}

void gw_attempt_free(gw_attempt *a) {
  if (!a) return;
  attempt_unlink(a);
  gw_defer_forget(a->job->gw, &a->defer);
  /* a hedge that never gave the request its answer (dropped, lost the race, failed, or
   * its job ended): counted here, once, whichever way it ended */
  if (a->hedge == 1) gw_metrics_hedge(a->job->gw, GW_HEDGE_WASTED);
  gw_attempt_cancel(a);
  pr_curlreq_close(&a->xfer, a->job->gw->curlm);
  pr_buf_free(&a->req_body);
  pr_buf_free(&a->resp);
  pr_sse_free(&a->sse);
  free(a->prog);
  free(a);
}

void gw_attempt_resume(gw_attempt *a) {
  if (!a->paused || !a->xfer.easy) return;
  a->paused = 0;
  a->heard_ms = uv_now(a->job->gw->loop); /* the client's wait is not the phone's silence */
  attempt_arm(a, gw_attempt_silence_s(a, a->heard_ms, 0));
  curl_easy_pause(a->xfer.easy, CURLPAUSE_CONT);
}
