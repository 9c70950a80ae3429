/* Where a job's answer goes. Today the client's HTTP connection; tomorrow a batch
 * output file or a hedged twin. The job writes through these calls only, and the sink
 * tells its owner, through the callbacks given when it was opened, that the reader went
 * away or drained. A sink is open until it has answered (respond, stream_end, abort) or
 * its reader left; every call on a closed sink is a no-op returning PR_ECLOSED.
 * Also here: answering a bare request with an OpenAI error (gw_respond_error). */
#ifndef GW_SINK_H
#define GW_SINK_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "http.h"

typedef struct gw_sink gw_sink;

typedef struct gw_sink_ops {
  int (*stream_start)(gw_sink *s, const char *const *hdrs, const char *ctype);
  int (*write)(gw_sink *s, const char *data, size_t len);
  int (*behind)(gw_sink *s);
  int (*stream_end)(gw_sink *s);
  int (*respond)(gw_sink *s, int status, const char *const *hdrs, const char *ctype,
                 const char *body, size_t len);
  void (*abort)(gw_sink *s);
  void (*close)(gw_sink *s); /* let go without answering (the owner is done) */
} gw_sink_ops;

struct gw_sink {
  const gw_sink_ops *ops;    /* NULL: closed */
  void *ctx;                 /* the implementation's (client: the pr_http_req) */
  void *owner;               /* handed to the callbacks */
  void (*on_gone)(void *owner);    /* the reader left before the answer was complete */
  void (*on_drain)(void *owner);   /* the reader caught up (after behind() said 1) */
};

/* Open s on a client request: req's callbacks now lead to on_gone / on_drain. */
void gw_sink_client(gw_sink *s, pr_http_req *req, void *owner, void (*on_gone)(void *),
                    void (*on_drain)(void *));

/* Open s on an implementation of the calls (a batch line's writer): ctx is its own. */
void gw_sink_attach(gw_sink *s, const gw_sink_ops *ops, void *ctx, void *owner,
                  void (*on_gone)(void *), void (*on_drain)(void *));
/* The reader of s gives up on the answer (a batch cancelled or expired): the owner hears
 * on_gone, as when a client leaves; the sink closes. */
void gw_sink_gone(gw_sink *s);

static inline int gw_sink_open(const gw_sink *s) { return s->ops != NULL; }
/* Begin a streamed answer (status 200). */
int gw_sink_stream_start(gw_sink *s, const char *const *hdrs, const char *ctype);
/* Bytes of a started stream; 1: the reader is behind (wait for on_drain). */
int gw_sink_write(gw_sink *s, const char *data, size_t len);
/* 1 when the reader is behind (on_drain follows), 0 not, PR_ECLOSED gone. */
int gw_sink_behind(gw_sink *s);
/* End a started stream; the sink closes. */
int gw_sink_stream_end(gw_sink *s);
/* A whole answer; the sink closes. */
int gw_sink_respond(gw_sink *s, int status, const char *const *hdrs, const char *ctype,
                    const char *body, size_t len);
/* An OpenAI-shaped error answer with x-request-id (and Retry-After / retry-after-ms when
 * retry_after_s > 0); the sink closes. */
int gw_sink_error(gw_sink *s, const char *request_id, int status, const char *type,
                  const char *param, const char *code, int retry_after_s, const char *message);
/* Reset the reader's connection without an answer; the sink closes (no on_gone). */
void gw_sink_abort(gw_sink *s);
/* Let go of the reader without answering; the sink closes (no on_gone). */
void gw_sink_close(gw_sink *s);

/* Answer a request that has no job with obj as JSON and x-request-id (obj is freed; 500
 * when it cannot be printed). */
void gw_respond_json(pr_http_req *req, const char *request_id, int status, cJSON *obj);
/* Answer a request that has no job with an OpenAI error (x-request-id, Retry-After). */
void gw_respond_error(pr_http_req *req, const char *request_id, int status, const char *type,
                      const char *param, const char *code, int retry_after_s, const char *fmt,
                      ...) __attribute__((format(printf, 8, 9)));

#endif
