/* The authenticated front and the relay to the engine; see front.h.
 *
 * A relay's life: the handler parses the request once (completions), builds a curl
 * transfer and adds it to the multi; the write callback passes stream bytes on as they
 * come (or collects whole answers, capped), the done callback ends the client's answer
 * and frees the relay. Nothing is freed or cancelled from inside a curl callback: a
 * client that disappears while one runs (pr_http_write may close the connection and
 * call on_abort synchronously) only clears relay->req, and the callback then returns 0,
 * which makes curl end the transfer and call done. */
#include "caps.h"
#include "front.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/crypto.h>

#include "bearer.h"
#include "buf.h"
#include "err.h"
#include "http.h"
#include "isolate.h"
#include "log.h"
#include "mnn.h"
#include "oai.h"
#include "progress.h"
#include "route.h"
#include "sse.h"

#define AG_FRONT_MAX_BODY PR_CAP_ANSWER /* a whole answer from the engine */
#define AG_FRONT_MAX_EVENT PR_CAP_SSE_EVENT /* one SSE event */
#define AG_FRONT_MAX_SMALL ((size_t)1 << 20)
#define AG_FRONT_CONNECT_TIMEOUT_MS 5000L
#define AG_FRONT_RETRY_AFTER "Retry-After: 5"
/* llama-server's /slots while completions run: read about once a second. It answers
 * between two batches of its work, which on a phone can take many seconds: a long
 * timeout, and one reading at a time. */
#define AG_FRONT_SLOTS_EVERY_MS 1000
#define AG_FRONT_SLOTS_TIMEOUT_MS 60000L
#define AG_FRONT_MAX_SLOTS_BODY ((size_t)4 << 20)

typedef struct ag_relay ag_relay;

/* The front. Owned by its creator; owns the HTTP server, every live relay, and the
 * timer and transfer that read llama-server's /slots. */
struct ag_front {
  uv_loop_t *loop;
  pr_curlm *curlm;          /* borrowed */
  ag_engine *engine;        /* borrowed */
  ag_rates *rates;          /* borrowed */
  ag_front_report_fn report;
  void *ud;
  char *listen, *token;
  char *issued;             /* the token the gateway named (heartbeats); NULL: none yet */
  int require_token;
  pr_http_server http;
  ag_relay *relays;         /* every live relay */
  int inflight;             /* relays of completions */
  uint64_t requests;
  uint64_t refused;         /* requests the allow-list turned away */
  uint64_t refused_logged_ns; /* when the last refusal was logged (one a second) */
  uint64_t refused_quiet;   /* refusals since then, not logged */
  int draining;
  int stopping;
  int closing;              /* handles (server, timer) whose close has not finished */
  void (*on_stopped)(void *arg);
  void *stopped_arg;

  /* Progress of the running requests on llama-server (progress.h). The timer runs
   * while completions are in flight; slots is the reading in flight (slots.easy set
   * while it runs), slots_body its answer (capped). */
  uv_timer_t slots_timer;
  int watching;             /* the timer runs; progress is worth reporting */
  pr_curlreq slots;
  pr_buf slots_body;
  int slots_failing;        /* the last reading failed (logged once) */
  ag_progress progress;

  /* callers' cache scopes kept apart on the engine (isolate.h), for the engine process
   * iso_gen; iso_set 0: not set up yet */
  ag_iso iso;
  unsigned iso_gen;
  int iso_set;
};

/* One forwarded request. Owned by the front's list from the handler until done (or
 * the client's abort outside a curl callback) frees it. req is borrowed and cleared
 * the moment http.c may free it. */
struct ag_relay {
  ag_front *f;
  ag_relay *prev, *next;
  pr_http_req *req;
  pr_curlreq xfer;          /* the engine's request; in the multi until done / cancel */
  pr_buf body;              /* what is sent to the engine */
  pr_buf resp;              /* a whole answer, collected */
  pr_buf out;               /* normalised stream bytes on their way to the client */
  pr_sse_parser sse;
  int sse_on;
  int completion;           /* counts as busy */
  int mnn;                  /* normalise MNN's answer */
  int client_stream;
  int streaming;            /* the engine answers 200 text/event-stream */
  int started;              /* the client's streamed answer has begun */
  int paused;               /* curl paused for the client's sake */
  int in_cb;                /* a curl callback is on the stack */
  int complete;             /* the answer is over (MNN cut); stop reading */
  long status;
  char ctype[128];
  int64_t prompt_tokens;    /* estimate, for rates without timings */
  char request_id[AG_REPORT_MAX_REQUEST_ID + 1]; /* the caller's x-request-id, or "" */
  ag_obs obs;
  int64_t chunks;           /* content chunks seen */
  uint64_t t0, t_first, t_last; /* uv_hrtime() */
  ag_mnn norm;
  int has_norm;
  char errbuf[CURL_ERROR_SIZE];
  /* a gateway named its cache scope (isolate.h): where it went, for its end */
  int iso_on;
  unsigned iso_gen;
  uint64_t iso_scope;
  ag_iso_pick iso_pick;
  uint64_t iso_blocks[AG_ISO_BLOCKS];
  size_t iso_n;
};

/* ---- small helpers ------------------------------------------------------------------ */

static void respond_json(pr_http_req *req, int status, const char *extra, const char *body, size_t len) {
  const char *hdrs[] = {extra, NULL};
  pr_http_respond(req, status, extra ? hdrs : NULL, "application/json", body, len);
}

static void respond_error(pr_http_req *req, int status, const char *type, const char *code,
                          const char *extra, const char *msg) {
  pr_buf b;
  pr_buf_init(&b, AG_FRONT_MAX_SMALL);
  if (pr_oai_error_body(&b, msg, type, NULL, code) < 0) pr_buf_reset(&b);
  respond_json(req, status, extra, pr_buf_cstr(&b), b.len);
  pr_buf_free(&b);
}

/* Errors the HTTP layer answers itself: OpenAI's shape. */
static void front_http_error(pr_buf *out, const char **ctype, char *header, size_t header_n,
                             int status, const char *message, const char *code,
                             const pr_http_req *req, void *ud) {
  (void)header;
  (void)header_n;
  (void)req;
  (void)ud;
  pr_oai_error_body(out, message, status >= 500 ? "server_error" : "invalid_request_error", NULL, code);
  *ctype = "application/json";
}

/* ---- progress on llama-server's slots ------------------------------------------------ */

static void slots_release(ag_front *f) {
  pr_curlreq_close(&f->slots, f->curlm);
  pr_buf_reset(&f->slots_body);
}

static size_t slots_on_write(char *data, size_t size, size_t nmemb, void *ud) {
  ag_front *f = ud;
  size_t n = size * nmemb;
  return pr_buf_append(&f->slots_body, data, n) == 0 ? n : 0; /* too large: give up */
}

static void slots_done(CURL *easy, CURLcode rc, void *ud) {
  (void)easy;
  ag_front *f = ud;
  long st = pr_curlreq_status(&f->slots);
  pr_curlreq_close(&f->slots, f->curlm);
  /* a reading that arrives after the last completion ended describes nothing we run */
  int ok = f->watching && rc == CURLE_OK && st == 200 &&
           ag_progress_take(&f->progress, pr_buf_cstr(&f->slots_body), f->slots_body.len, uv_hrtime()) == 0;
  pr_buf_reset(&f->slots_body);
  if (ok) {
    f->slots_failing = 0;
    return;
  }
  ag_progress_clear(&f->progress);
  if (f->watching && !f->slots_failing) {
    /* an engine without /slots (or a hiccup) only means no progress to report */
    if (rc != CURLE_OK) pr_debug("engine /slots: %s: no progress reported", curl_easy_strerror(rc));
    else if (st != 200) pr_debug("engine /slots answers HTTP %ld: no progress reported", st);
    else pr_debug("engine /slots: not a JSON array: no progress reported");
    f->slots_failing = 1;
  }
}

static void slots_tick(uv_timer_t *t) {
  ag_front *f = t->data;
  if (f->stopping || f->slots.easy || ag_engine_get_state(f->engine) != AG_ENGINE_READY) return;
  pr_curlreq_opts o;
  ag_engine_request(f->engine, "/slots", &o);
  o.write_fn = slots_on_write;
  o.write_ud = f;
  o.timeout_ms = AG_FRONT_SLOTS_TIMEOUT_MS;
  if (pr_curlreq_open(&f->slots, f->curlm, &o) < 0) return;
  if (pr_curlm_add(f->curlm, f->slots.easy, slots_done, f) < 0) slots_release(f);
}

/* A completion starts: read the engine's slots while any runs (llama-server only: MNN
 * and other servers have no /slots). */
static void slots_watch(ag_front *f) {
  if (f->watching || f->stopping || ag_engine_get_kind(f->engine) != AG_ENGINE_LLAMA) return;
  f->watching = 1;
  uv_timer_start(&f->slots_timer, slots_tick, AG_FRONT_SLOTS_EVERY_MS, AG_FRONT_SLOTS_EVERY_MS);
}

/* The last completion ended. A reading in flight is left to finish (this may run inside
 * a curl callback) and is then ignored. */
static void slots_unwatch(ag_front *f) {
  if (!f->watching) return;
  f->watching = 0;
  if (!f->stopping) uv_timer_stop(&f->slots_timer);
  ag_progress_clear(&f->progress);
}

/* A completion ends (still in the list). When it was paired with a slot, that slot
 * leaves the report now rather than at the next reading: the rest stay paired. */
static void slots_forget(ag_front *f, const ag_relay *r) {
  if (!f->watching || f->progress.truncated || f->progress.n != (size_t)f->inflight) return;
  size_t older = 0; /* the list is newest first: completions after r came before it */
  for (const ag_relay *o = r->next; o; o = o->next) older += o->completion != 0;
  ag_progress_forget(&f->progress, older);
}

/* ---- the relay --------------------------------------------------------------------- */

static void relay_free(ag_relay *r) {
  ag_front *f = r->f;
  pr_http_req_let_go(r->req);
  pr_curlreq_close(&r->xfer, f->curlm); /* a running one: closes the engine connection, freeing its slot */
  if (r->prev) r->prev->next = r->next;
  else f->relays = r->next;
  if (r->next) r->next->prev = r->prev;
  if (r->completion) slots_forget(f, r);
  if (r->completion && --f->inflight == 0) slots_unwatch(f);
  /* the engine read the prompt into the slot when it answered 200; anything else leaves
   * the slot's content unknown (an engine started since holds none of it) */
  if (r->iso_on && f->iso_set && r->iso_gen == f->iso_gen)
    ag_iso_end(&f->iso, r->iso_pick, r->iso_scope, r->iso_blocks, r->iso_n, r->status == 200);
  pr_buf_free(&r->body);
  pr_buf_free(&r->resp);
  pr_buf_free(&r->out);
  pr_sse_free(&r->sse);
  if (r->has_norm) ag_mnn_free(&r->norm);
  free(r);
}

/* Take the client's request from the relay: the caller answers it now. */
static pr_http_req *relay_take_req(ag_relay *r) {
  pr_http_req *req = r->req;
  r->req = NULL;
  return pr_http_req_let_go(req);
}

/* What the answer taught about the engine's speed. */
static void relay_learn(ag_relay *r) {
  ag_obs *o = &r->obs;
  if (o->prompt_ms > 0 || o->predicted_ms > 0) {
    ag_rates_observe(r->f->rates, o->prompt_n, o->prompt_ms, o->predicted_n, o->predicted_ms);
    return;
  }
  if (!r->streaming || !r->t_first) return;
  /* no timings (MNN, other servers): time to the first token is the prefill */
  int64_t p = o->prompt_tokens > 0 ? o->prompt_tokens : r->prompt_tokens;
  ag_rates_observe(r->f->rates, (double)p, (double)(r->t_first - r->t0) / 1e6, (double)(r->chunks - 1),
                   (double)(r->t_last - r->t_first) / 1e6);
}

static int relay_on_event(void *ud, const pr_sse_event *ev) {
  ag_relay *r = ud;
  if (r->mnn) {
    if (r->complete) return 0;
    int rc = ag_mnn_event(&r->norm, ev->data, ev->data_len, &r->out);
    if (rc < 0) return rc;
    if (rc == 1) r->complete = 1;
  }
  if (ev->data_len < 2 || ev->data[0] != '{') return 0;
  cJSON *root = cJSON_ParseWithLength(ev->data, ev->data_len);
  if (!root) return 0;
  ag_obs_take(&r->obs, root);
  if (pr_oai_chunk_text(root)) {
    uint64_t now = uv_hrtime();
    if (!r->t_first) r->t_first = now;
    r->t_last = now;
    r->chunks++;
  }
  cJSON_Delete(root);
  return 0;
}

/* Start the client's streamed answer with the engine's status and content type. */
static int relay_start(ag_relay *r) {
  if (r->started) return 0;
  const char *hdrs[] = {"Cache-Control: no-cache", "X-Accel-Buffering: no", NULL};
  r->in_cb++;
  int rc = pr_http_start(r->req, 200, hdrs, "text/event-stream");
  r->in_cb--;
  r->started = 1;
  return r->req ? rc : PR_ECLOSED;
}

static int relay_write(ag_relay *r, const char *data, size_t n) {
  if (!n) return 0;
  r->in_cb++;
  int rc = r->req ? pr_http_write(r->req, data, n) : PR_ECLOSED;
  r->in_cb--;
  if (!r->req) return PR_ECLOSED;
  return rc < 0 ? rc : 0;
}

static size_t relay_on_write(char *data, size_t size, size_t nmemb, void *ud) {
  ag_relay *r = ud;
  size_t n = size * nmemb;
  if (!r->req || r->complete) return 0; /* client gone, or the answer is over: stop */
  if (!r->status) {
    r->status = pr_curlreq_status(&r->xfer);
    char *ct = NULL;
    curl_easy_getinfo(r->xfer.easy, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(r->ctype, sizeof(r->ctype), "%s", ct ? ct : "application/json");
    r->streaming = r->status == 200 && strstr(r->ctype, "text/event-stream") != NULL;
    r->sse_on = r->streaming;
  }
  if (!r->streaming) return pr_buf_append(&r->resp, data, n) == 0 ? n : 0;
  int to_client = r->mnn ? r->client_stream : 1;
  if (to_client) {
    r->in_cb++;
    int behind = pr_http_want_drain(r->req);
    r->in_cb--;
    if (behind < 0 || !r->req) return 0;
    if (behind) { /* the client is slow, not the engine: wait for it (on_drain) */
      r->paused = 1;
      return CURL_WRITEFUNC_PAUSE;
    }
    if (relay_start(r) < 0) return 0;
  }
  int rc = pr_sse_feed(&r->sse, data, n);
  if (rc < 0) return 0;
  if (r->mnn) {
    if (to_client && r->out.len) rc = relay_write(r, r->out.data, r->out.len);
    pr_buf_reset(&r->out);
  } else {
    rc = relay_write(r, data, n);
  }
  if (rc < 0) return 0;
  return r->complete ? 0 : n; /* 0 after an MNN cut: curl ends the transfer, done ends ours */
}

static void relay_on_drain(pr_http_req *req) {
  ag_relay *r = req->data;
  if (!r || !r->paused || !r->xfer.easy) return;
  r->paused = 0;
  curl_easy_pause(r->xfer.easy, CURLPAUSE_CONT); /* may run relay_on_write at once */
}

static void relay_on_abort(pr_http_req *req) {
  ag_relay *r = req->data;
  if (!r) return;
  r->req = NULL;
  if (r->in_cb) return; /* the curl callback on the stack returns 0; done frees */
  relay_free(r);        /* cancels the engine's request */
}

static void relay_respond_whole(ag_relay *r) {
  pr_http_req *req = relay_take_req(r);
  if (!req) return;
  const char *ctype = r->ctype[0] ? r->ctype : "application/json";
  if (!r->mnn) {
    const char *hdrs[] = {NULL};
    pr_http_respond(req, (int)r->status, hdrs, ctype, pr_buf_cstr(&r->resp), r->resp.len);
    return;
  }
  pr_buf b;
  pr_buf_init(&b, AG_FRONT_MAX_BODY);
  int status = (int)r->status;
  if (status != 200) ag_mnn_error_body(status, pr_buf_cstr(&r->resp), r->resp.len, &b);
  else ag_mnn_fix_whole(&r->norm, pr_buf_cstr(&r->resp), r->resp.len, &b);
  pr_http_respond(req, status, NULL, "application/json", pr_buf_cstr(&b), b.len);
  pr_buf_free(&b);
}

static void relay_done(CURL *easy, CURLcode rc, void *ud) {
  ag_relay *r = ud;
  ag_front *f = r->f;
  (void)easy;
  /* a status that never reached relay_on_write (no body, or no answer at all: 0) is
   * read before the handle goes (curlreq.h's rule) */
  if (!r->status) r->status = pr_curlreq_status(&r->xfer);
  pr_curlreq_close(&r->xfer, f->curlm); /* pr_curlm removed it already */
  if (!r->req) { /* the client went away during a callback */
    relay_free(r);
    return;
  }
  int clean = rc == CURLE_OK || r->complete;
  if (!clean && !r->started && !r->complete && (r->status == 0 || !r->streaming)) {
    /* nothing usable came: the engine is unreachable or broke off */
    char msg[CURL_ERROR_SIZE + 64];
    snprintf(msg, sizeof(msg), "the engine did not answer: %s", r->errbuf[0] ? r->errbuf : curl_easy_strerror(rc));
    pr_warn("%s", msg);
    ag_engine_suspect(f->engine);
    respond_error(relay_take_req(r), 502, "server_error", "engine_unreachable", NULL, msg);
    relay_free(r);
    return;
  }
  if (r->streaming) relay_learn(r);
  if (r->streaming && r->mnn) {
    if (!r->complete) ag_mnn_eof(&r->norm, rc == CURLE_OK, &r->out);
    if (r->client_stream) {
      if (r->out.len) relay_write(r, r->out.data, r->out.len); /* may lose the client */
      if (r->req) pr_http_end(relay_take_req(r));
    } else if (r->norm.error_status) {
      pr_http_req *req = relay_take_req(r);
      pr_http_respond(req, r->norm.error_status, NULL, "application/json", pr_buf_cstr(&r->norm.err), r->norm.err.len);
    } else {
      pr_buf b;
      pr_buf_init(&b, AG_FRONT_MAX_BODY);
      ag_mnn_whole(&r->norm, &b);
      pr_http_respond(relay_take_req(r), 200, NULL, "application/json", pr_buf_cstr(&b), b.len);
      pr_buf_free(&b);
    }
    relay_free(r);
    return;
  }
  if (r->streaming) {
    if (!r->started) relay_start(r); /* an empty stream */
    pr_http_req *req = relay_take_req(r);
    if (!req) {
      /* the client went away while the stream started */
    } else if (rc == CURLE_OK) {
      pr_http_end(req);
    } else {
      /* the engine broke off mid-stream: so do we, as the phone would have */
      pr_warn("the engine broke off a stream: %s", r->errbuf[0] ? r->errbuf : curl_easy_strerror(rc));
      pr_http_abort(req);
    }
    relay_free(r);
    return;
  }
  if (r->status == 200) ag_obs_take_text(&r->obs, pr_buf_cstr(&r->resp), r->resp.len);
  relay_learn(r);
  relay_respond_whole(r);
  relay_free(r);
}

/* A request whose messages (or prompt) the agent's parser refuses goes to MNN as it
 * came, so that the client gets the engine's own verdict: servers built on llama.cpp
 * refuse a malformed message with 500 and a message saying what is wrong, and the
 * gateway, not the agent, decides what that means. Should the engine answer it, the
 * answer is normalised with what can be read of the request: its stream flags, no cap. */
static int relay_prepare_as_is(ag_relay *r, int chat, const char *body, size_t len) {
  cJSON *root = cJSON_ParseWithLength(body, len);
  int stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "stream"));
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
  int usage = stream && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
  cJSON_Delete(root);
  r->client_stream = stream;
  r->prompt_tokens = (int64_t)(len / 4);
  ag_mnn_init(&r->norm, chat, stream, usage, -1, r->prompt_tokens);
  r->has_norm = 1;
  return pr_buf_append(&r->body, body, len);
}

/* What keeps callers apart on this engine, for the process running now (isolate.h):
 * named slots on a llama-server started without a RAM cache, else the whole engine; an
 * engine found running may hold anyone's prompts. */
static void front_iso_sync(ag_front *f) {
  unsigned gen = ag_engine_generation(f->engine);
  if (f->iso_set && gen == f->iso_gen) return;
  int named = ag_engine_slots_named(f->engine);
  if (ag_iso_init(&f->iso, named ? AG_ISO_SLOTS : AG_ISO_ENGINE, ag_engine_slot_count(f->engine),
                  ag_engine_supervised(f->engine)) < 0)
    pr_warn("isolation: out of memory; the whole engine counts");
  f->iso_gen = gen;
  f->iso_set = 1;
}

/* A gateway named the request's cache scope: the slot it takes and whether it may reuse
 * are the agent's choice, not the caller's (docs/security.md "Tenants' prompts"). */
static int relay_isolate(ag_relay *r, pr_oai_req *oai, const char *scope) {
  ag_front *f = r->f;
  front_iso_sync(f);
  r->iso_on = 1;
  r->iso_gen = f->iso_gen;
  r->iso_scope = ag_iso_scope_of(scope);
  r->iso_n = oai->n_blocks < AG_ISO_BLOCKS ? oai->n_blocks : AG_ISO_BLOCKS;
  if (r->iso_n) memcpy(r->iso_blocks, oai->blocks, r->iso_n * sizeof(*oai->blocks));
  r->iso_pick = ag_iso_start(&f->iso, r->iso_scope, oai->blocks, oai->n_blocks);
  return pr_oai_set_cache(oai, r->iso_pick.reuse, r->iso_pick.slot);
}

/* Prepare the body sent to the engine; for MNN always ask for a stream. */
static int relay_prepare(ag_relay *r, pr_http_req *req, int chat) {
  const char *body = req->body.data ? req->body.data : "";
  size_t len = req->body.len;
  if (!r->completion) return pr_buf_append(&r->body, body, len);
  pr_oai_req oai;
  pr_oai_error err;
  memset(&err, 0, sizeof(err));
  if (pr_oai_parse(&oai, chat ? PR_OAI_CHAT : PR_OAI_COMPLETION, body, len, &err) < 0) {
    if (!r->mnn) return pr_buf_append(&r->body, body, len); /* the engine answers it its way */
    if (strncmp(err.param, "messages", 8) == 0 || strncmp(err.param, "prompt", 6) == 0)
      return relay_prepare_as_is(r, chat, body, len);
    respond_error(relay_take_req(r), err.status ? err.status : 400, err.type ? err.type : "invalid_request_error",
                  err.code, NULL, err.message);
    return PR_EPARSE;
  }
  r->prompt_tokens = oai.prompt_tokens;
  r->client_stream = oai.stream;
  int rc;
  if (r->mnn) {
    ag_mnn_init(&r->norm, chat, oai.stream, oai.stream && oai.include_usage, oai.max_tokens,
                oai.prompt_tokens);
    r->has_norm = 1;
    cJSON_DeleteItemFromObjectCaseSensitive(oai.root, "stream");
    cJSON_AddBoolToObject(oai.root, "stream", 1);
    rc = pr_oai_render(&oai, &r->body);
  } else {
    const char *scope = pr_http_header_get(req, "x-fleetgate-cache-scope");
    if (scope && ag_engine_get_kind(r->f->engine) == AG_ENGINE_LLAMA) {
      rc = relay_isolate(r, &oai, scope);
      if (rc == 0) rc = pr_oai_render(&oai, &r->body);
    } else {
      rc = pr_buf_append(&r->body, body, len);
    }
  }
  pr_oai_free(&oai);
  return rc;
}

static void front_relay(ag_front *f, pr_http_req *req, const ag_route *route) {
  int chat = route->chat;
  int completion = route->completion;
  ag_engine_state st = ag_engine_get_state(f->engine);
  if (completion && f->draining) {
    respond_error(req, 503, "unavailable_error", "draining", AG_FRONT_RETRY_AFTER,
                  "this replica is draining: it finishes running requests and takes no new ones");
    return;
  }
  if (st != AG_ENGINE_READY) {
    if (st == AG_ENGINE_LOADING)
      respond_error(req, 503, "unavailable_error", "model_loading", AG_FRONT_RETRY_AFTER, "Loading model");
    else
      respond_error(req, 503, "unavailable_error", "engine_down", AG_FRONT_RETRY_AFTER,
                    "the engine is down; the agent is restarting it");
    return;
  }
  ag_relay *r = calloc(1, sizeof(*r));
  if (!r) {
    respond_error(req, 500, "server_error", NULL, NULL, "out of memory");
    return;
  }
  r->f = f;
  r->req = req;
  r->completion = completion;
  r->mnn = completion && ag_engine_get_kind(f->engine) == AG_ENGINE_MNN;
  r->t0 = uv_hrtime();
  ag_obs_init(&r->obs);
  pr_buf_init(&r->body, AG_FRONT_MAX_BODY);
  pr_buf_init(&r->resp, AG_FRONT_MAX_BODY);
  pr_buf_init(&r->out, AG_FRONT_MAX_BODY);
  pr_sse_init(&r->sse, AG_FRONT_MAX_EVENT, relay_on_event, NULL, r);
  r->next = f->relays;
  if (f->relays) f->relays->prev = r;
  f->relays = r;
  if (completion) {
    ag_report_copy_id(r->request_id, pr_http_header_get(req, "x-request-id"));
    f->inflight++;
    slots_watch(f);
  }
  f->requests++;

  int rc = relay_prepare(r, req, chat);
  if (rc == PR_EPARSE) { /* answered */
    relay_free(r);
    return;
  }
  /* the caller's content type, accept and request id go on; "Expect:" stops curl from
   * asking for (and waiting on) 100 Continue before a large body */
  static const char *const pass[] = {"Content-Type", "Accept", "x-request-id"};
  char lines[3][600];
  const char *hdrs[5];
  size_t nh = 0;
  for (size_t i = 0; i < 3; i++) {
    const char *v = pr_http_header_get(req, pass[i]);
    if (!v) continue;
    snprintf(lines[nh], sizeof(lines[nh]), "%s: %s", pass[i], v);
    hdrs[nh] = lines[nh];
    nh++;
  }
  hdrs[nh++] = "Expect:";
  hdrs[nh] = NULL;
  pr_curlreq_opts o;
  ag_engine_request(f->engine, route->path, &o); /* the allow-list's own bytes */
  o.method = route->method;
  o.body = r->body.data ? r->body.data : "";
  o.body_len = r->body.len;
  o.headers = hdrs;
  o.write_fn = relay_on_write;
  o.write_ud = r;
  o.errbuf = r->errbuf;
  o.buffer_size = 4096; /* per stream; events are small (see gateway/upstream.c) */
  o.connect_timeout_ms = AG_FRONT_CONNECT_TIMEOUT_MS;
  o.http11 = 1;
  if (rc < 0 || pr_curlreq_open(&r->xfer, f->curlm, &o) < 0) {
    respond_error(relay_take_req(r), 500, "server_error", NULL, NULL, "cannot forward the request");
    relay_free(r);
    return;
  }
  req->data = r;
  req->on_abort = relay_on_abort;
  req->on_drain = relay_on_drain;
  rc = pr_curlm_add(f->curlm, r->xfer.easy, relay_done, r);
  if (rc < 0) {
    respond_error(relay_take_req(r), 500, "server_error", NULL, NULL, "cannot forward the request");
    relay_free(r);
  }
}

/* ---- the front's own endpoints ----------------------------------------------------------- */

const char *ag_front_cache_isolation(const ag_front *f) {
  if (ag_engine_get_kind(f->engine) != AG_ENGINE_LLAMA) return NULL; /* it cannot keep them apart */
  if (f->iso_set && f->iso_gen == ag_engine_generation(f->engine)) return ag_iso_mode_name(f->iso.mode);
  return ag_iso_mode_name(ag_engine_slots_named(f->engine) ? AG_ISO_SLOTS : AG_ISO_ENGINE);
}

static void front_status(ag_front *f, pr_http_req *req) {
  ag_report rep;
  memset(&rep, 0, sizeof(rep));
  f->report(f->ud, &rep);
  rep.cache_isolation = ag_front_cache_isolation(f);
  pr_buf b;
  pr_buf_init(&b, AG_FRONT_MAX_SMALL);
  if (ag_report_status_json(&rep, &b) < 0) respond_error(req, 500, "server_error", NULL, NULL, "out of memory");
  else respond_json(req, 200, "Cache-Control: no-store", b.data, b.len);
  pr_buf_free(&b);
}

static void front_health(ag_front *f, pr_http_req *req) {
  ag_engine_state st = ag_engine_get_state(f->engine);
  if (st == AG_ENGINE_READY) {
    static const char ok[] = "{\"status\":\"ok\"}";
    respond_json(req, 200, NULL, ok, sizeof(ok) - 1);
  } else {
    respond_error(req, 503, "unavailable_error", st == AG_ENGINE_LOADING ? "model_loading" : "engine_down",
                  AG_FRONT_RETRY_AFTER, st == AG_ENGINE_LOADING ? "Loading model" : "the engine is down");
  }
}

/* The one bearer rule (proto/bearer.h), against the token the gateway named, else the
 * configured one; with neither, only a front that asks for none lets callers in. */
static int front_authorized(const ag_front *f, const pr_http_req *req) {
  const char *h = pr_http_header_get(req, "Authorization");
  /* once the gateway has named this phone's own token, only that one opens it: a
   * configured token may be shared by every phone of a deployment */
  if (f->issued) return pr_bearer_check(h, f->issued) == 0;
  if (f->token) return pr_bearer_check(h, f->token) == 0;
  return !f->require_token;
}

int ag_front_set_issued_token(ag_front *f, const char *token) {
  char *t = token ? strdup(token) : NULL;
  if (token && !t) return -ENOMEM;
  if (f->issued) OPENSSL_cleanse(f->issued, strlen(f->issued));
  free(f->issued);
  f->issued = t;
  return 0;
}

/* A refusal by the allow-list: answered, counted, and logged at most once a second
 * (a caller with the token probing paths should not flood the phone's log). */
static void front_refuse(ag_front *f, pr_http_req *req, const ag_route *route) {
  f->refused++;
  uint64_t now = uv_hrtime();
  if (!f->refused_logged_ns || now - f->refused_logged_ns >= (uint64_t)1000000000) {
    char target[201]; /* the caller's bytes, printable ASCII only, for the log */
    size_t n = 0;
    for (const char *p = req->url ? req->url : ""; *p && n < sizeof(target) - 1; p++)
      target[n++] = *p > ' ' && *p < 0x7f ? *p : '?';
    target[n] = '\0';
    pr_warn("refused %.16s %s: %s (and %" PRIu64 " more since the last such line)", req->method, target,
            route->kind == AG_ROUTE_BAD_PATH ? "not a plain path"
            : route->kind == AG_ROUTE_QUERY  ? "a query string on a relayed path"
            : route->kind == AG_ROUTE_METHOD ? "method not allowed"
                                             : "not a path the agent serves",
            f->refused_quiet);
    f->refused_logged_ns = now;
    f->refused_quiet = 0;
  } else {
    f->refused_quiet++;
  }
  switch (route->kind) {
    case AG_ROUTE_BAD_PATH:
      respond_error(req, 400, "invalid_request_error", "invalid_path", NULL,
                    "the path must be plain: no dot segments, empty segments, percent escapes or backslashes");
      break;
    case AG_ROUTE_QUERY:
      respond_error(req, 400, "invalid_request_error", "query_not_allowed", NULL,
                    "the agent relays no query strings");
      break;
    case AG_ROUTE_METHOD:
      respond_error(req, 405, "invalid_request_error", "method_not_allowed", route->allow,
                    "method not allowed on this path");
      break;
    default:
      respond_error(req, 404, "not_found_error", "unknown_path", NULL, "no such path on this agent");
      break;
  }
}

/* At headers-complete, before the body is read: without a token the front takes, the
 * request is refused now (the connection closes, the body unread). */
static void front_on_head(pr_http_req *req, void *ud) {
  ag_front *f = ud;
  if (!front_authorized(f, req))
    respond_error(req, 401, "authentication_error", "invalid_api_key", "WWW-Authenticate: Bearer",
                  "a valid replica token is required (Authorization: Bearer ...)");
}

static void front_on_request(pr_http_req *req, void *ud) {
  ag_front *f = ud;
  pr_debug("%s %s", req->method, req->url);
  if (!front_authorized(f, req)) {
    respond_error(req, 401, "authentication_error", "invalid_api_key", "WWW-Authenticate: Bearer",
                  "a valid replica token is required (Authorization: Bearer ...)");
    return;
  }
  ag_route route;
  ag_route_find(req->method, req->url, &route);
  switch (route.kind) {
    case AG_ROUTE_STATUS: front_status(f, req); break;
    case AG_ROUTE_HEALTH: front_health(f, req); break;
    case AG_ROUTE_RELAY: front_relay(f, req, &route); break;
    default: front_refuse(f, req, &route); break;
  }
}

/* ---- life cycle -------------------------------------------------------------------- */

int ag_front_new(ag_front **out, uv_loop_t *loop, pr_curlm *curlm, ag_engine *engine,
                 ag_rates *rates, const ag_front_config *cfg, ag_front_report_fn report, void *ud) {
  *out = NULL;
  ag_front *f = calloc(1, sizeof(*f));
  if (!f) return -ENOMEM;
  f->listen = strdup(cfg->listen);
  f->token = cfg->token ? strdup(cfg->token) : NULL;
  f->require_token = cfg->require_token;
  if (!f->listen || (cfg->token && !f->token)) {
    free(f->listen);
    free(f->token);
    free(f);
    return -ENOMEM;
  }
  f->loop = loop;
  f->curlm = curlm;
  f->engine = engine;
  f->rates = rates;
  f->report = report;
  f->ud = ud;
  pr_http_server_init(&f->http, loop, front_on_request, f);
  f->http.head_fn = front_on_head;
  f->http.server_name = "fleetgate-agent";
  f->http.error_fn = front_http_error;
  pr_buf_init(&f->slots_body, AG_FRONT_MAX_SLOTS_BODY);
  uv_timer_init(loop, &f->slots_timer);
  f->slots_timer.data = f;
  *out = f;
  return 0;
}

int ag_front_listen(ag_front *f) { return pr_http_server_listen(&f->http, f->listen); }
int ag_front_port(ag_front *f) { return pr_http_server_port(&f->http); }
void ag_front_set_draining(ag_front *f, int draining) { f->draining = draining; }
int ag_front_draining(const ag_front *f) { return f->draining; }
int ag_front_inflight(const ag_front *f) { return f->inflight; }
uint64_t ag_front_requests(const ag_front *f) { return f->requests; }

size_t ag_front_running(const ag_front *f, ag_running *out, size_t cap) {
  if (!f->watching) return 0;
  /* the relay list is newest first: ids go in from the end to read in arrival order */
  const char *ids[AG_PROGRESS_MAX_SLOTS];
  size_t n = (size_t)f->inflight, i = n;
  int fits = n <= AG_PROGRESS_MAX_SLOTS;
  for (const ag_relay *r = f->relays; fits && r && i > 0; r = r->next)
    if (r->completion) ids[--i] = r->request_id;
  return ag_progress_fill(&f->progress, uv_hrtime(), fits && i == 0 ? ids : NULL, n, out, cap);
}

static void front_one_closed(ag_front *f) {
  if (--f->closing == 0 && f->on_stopped) f->on_stopped(f->stopped_arg);
}

static void front_http_closed(pr_http_server *http) { front_one_closed(http->ud); }

static void front_timer_closed(uv_handle_t *h) { front_one_closed(h->data); }

void ag_front_stop(ag_front *f, void (*on_stopped)(void *arg), void *arg) {
  if (f->stopping) return;
  f->stopping = 1;
  f->on_stopped = on_stopped;
  f->stopped_arg = arg;
  f->closing = 2;
  slots_release(f);
  uv_close((uv_handle_t *)&f->slots_timer, front_timer_closed);
  /* every connection closes: on_abort frees each relay and cancels its transfer */
  pr_http_server_close(&f->http, front_http_closed);
  while (f->relays) relay_free(f->relays);
}

void ag_front_free(ag_front *f) {
  if (!f) return;
  while (f->relays) relay_free(f->relays);
  slots_release(f);
  pr_buf_free(&f->slots_body);
  ag_iso_free(&f->iso);
  free(f->listen);
  if (f->token) OPENSSL_cleanse(f->token, strlen(f->token));
  free(f->token);
  ag_front_set_issued_token(f, NULL);
  free(f);
}
