/* Job answers into a client connection, and OpenAI error answers; see sink.h. */
#include "sink.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "caps.h"
#include "err.h"
#include "oai.h"

/* ---- the client sink ------------------------------------------------------------------------- */

/* The request lets go of its callbacks: nothing it does later reaches the owner. */
static pr_http_req *client_detach(gw_sink *s) {
  pr_http_req *req = s->ctx;
  s->ops = NULL;
  s->ctx = NULL;
  return pr_http_req_let_go(req);
}

static void client_on_abort(pr_http_req *req) {
  gw_sink *s = req->data;
  if (!s) return;
  client_detach(s); /* the request is gone once this returns */
  if (s->on_gone) s->on_gone(s->owner);
}

static void client_on_drain(pr_http_req *req) {
  gw_sink *s = req->data;
  if (s && s->on_drain) s->on_drain(s->owner);
}

static int client_stream_start(gw_sink *s, const char *const *hdrs, const char *ctype) {
  return pr_http_start(s->ctx, 200, hdrs, ctype);
}

static int client_write(gw_sink *s, const char *data, size_t len) {
  return pr_http_write(s->ctx, data, len);
}

static int client_behind(gw_sink *s) { return pr_http_want_drain(s->ctx); }

static int client_stream_end(gw_sink *s) { return pr_http_end(client_detach(s)); }

static int client_respond(gw_sink *s, int status, const char *const *hdrs, const char *ctype,
                          const char *body, size_t len) {
  return pr_http_respond(client_detach(s), status, hdrs, ctype, body, len);
}

static void client_abort(gw_sink *s) { pr_http_abort(client_detach(s)); }

static void client_close(gw_sink *s) { client_detach(s); }

static const gw_sink_ops client_ops = {
  client_stream_start, client_write, client_behind, client_stream_end,
  client_respond, client_abort, client_close,
};

void gw_sink_client(gw_sink *s, pr_http_req *req, void *owner, void (*on_gone)(void *),
                    void (*on_drain)(void *)) {
  s->ops = &client_ops;
  s->ctx = req;
  s->owner = owner;
  s->on_gone = on_gone;
  s->on_drain = on_drain;
  req->data = s;
  req->on_abort = client_on_abort;
  req->on_drain = client_on_drain;
}

void gw_sink_attach(gw_sink *s, const gw_sink_ops *ops, void *ctx, void *owner,
                  void (*on_gone)(void *), void (*on_drain)(void *)) {
  s->ops = ops;
  s->ctx = ctx;
  s->owner = owner;
  s->on_gone = on_gone;
  s->on_drain = on_drain;
}

void gw_sink_gone(gw_sink *s) {
  if (!s->ops) return;
  s->ops = NULL;
  s->ctx = NULL;
  if (s->on_gone) s->on_gone(s->owner);
}

/* ---- calls ----------------------------------------------------------------------------------- */

int gw_sink_stream_start(gw_sink *s, const char *const *hdrs, const char *ctype) {
  return s->ops ? s->ops->stream_start(s, hdrs, ctype) : PR_ECLOSED;
}

int gw_sink_write(gw_sink *s, const char *data, size_t len) {
  return s->ops ? s->ops->write(s, data, len) : PR_ECLOSED;
}

int gw_sink_behind(gw_sink *s) { return s->ops ? s->ops->behind(s) : PR_ECLOSED; }

int gw_sink_stream_end(gw_sink *s) { return s->ops ? s->ops->stream_end(s) : PR_ECLOSED; }

int gw_sink_respond(gw_sink *s, int status, const char *const *hdrs, const char *ctype,
                    const char *body, size_t len) {
  return s->ops ? s->ops->respond(s, status, hdrs, ctype, body, len) : PR_ECLOSED;
}

void gw_sink_abort(gw_sink *s) {
  if (s->ops) s->ops->abort(s);
}

void gw_sink_close(gw_sink *s) {
  if (s->ops) s->ops->close(s);
}

/* The headers of an error answer: x-request-id, and Retry-After with retry-after-ms
 * (the official clients honour both). Storage is the caller's. */
typedef struct error_heads {
  char rid[160], ra[48], ra_ms[64];
  const char *list[4];
} error_heads;

static const char *const *error_headers(error_heads *h, const char *request_id, int retry_after_s) {
  int n = 0;
  if (request_id) {
    snprintf(h->rid, sizeof(h->rid), "x-request-id: %s", request_id);
    h->list[n++] = h->rid;
  }
  if (retry_after_s > 0) {
    snprintf(h->ra, sizeof(h->ra), "Retry-After: %d", retry_after_s);
    h->list[n++] = h->ra;
    snprintf(h->ra_ms, sizeof(h->ra_ms), "retry-after-ms: %d", retry_after_s * 1000);
    h->list[n++] = h->ra_ms;
  }
  h->list[n] = NULL;
  return h->list;
}

int gw_sink_error(gw_sink *s, const char *request_id, int status, const char *type,
                  const char *param, const char *code, int retry_after_s, const char *message) {
  if (!s->ops) return PR_ECLOSED;
  pr_buf body;
  pr_buf_init(&body, PR_CAP_ERROR_BODY);
  error_heads h;
  int rc = pr_oai_error_body(&body, message, type, param, code);
  if (!rc)
    rc = gw_sink_respond(s, status, error_headers(&h, request_id, retry_after_s),
                         "application/json", body.data, body.len);
  else
    gw_sink_abort(s);
  pr_buf_free(&body);
  return rc;
}

void gw_respond_json(pr_http_req *req, const char *request_id, int status, cJSON *obj) {
  char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
  cJSON_Delete(obj);
  if (!s) {
    gw_respond_error(req, request_id, 500, "server_error", NULL, NULL, 0, "out of memory");
    return;
  }
  error_heads h;
  pr_http_respond(req, status, error_headers(&h, request_id, 0), "application/json", s, strlen(s));
  free(s);
}

void gw_respond_error(pr_http_req *req, const char *request_id, int status, const char *type,
                      const char *param, const char *code, int retry_after_s, const char *fmt,
                      ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  pr_buf body;
  pr_buf_init(&body, PR_CAP_ERROR_BODY);
  pr_oai_error_body(&body, msg, type, param, code);
  error_heads h;
  pr_http_respond(req, status, error_headers(&h, request_id, retry_after_s), "application/json",
                  body.data, body.len);
  pr_buf_free(&body);
}
