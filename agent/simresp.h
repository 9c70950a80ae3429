/* OpenAI's Responses API (POST /v1/responses) as llama-server b10587 serves it: the
 * request becomes a chat completion body (server_chat_convert_responses_to_chatcmpl:
 * instructions a system message, input items messages, max_output_tokens max_tokens,
 * reasoning.effort reasoning_effort), and the answer becomes a "response" object, or
 * its named server-sent events when streamed. The February 2025 build has no such
 * endpoint. Pure code over cJSON: no I/O. */
#ifndef AG_SIMRESP_H
#define AG_SIMRESP_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "llsrv.h"
#include "simreq.h"

/* The chat completion body for a Responses request. Returns 0 with *chat (the
 * caller's), 1 with ref filled (400 invalid_request_error: what b10587 says), or a
 * negative code. */
int ag_simresp_to_chat(const cJSON *body, cJSON **chat, ag_simreq_refusal *ref);

/* One answer's identity and what it says. Strings borrowed. */
typedef struct ag_simresp {
  const char *id;        /* "resp_..." */
  const char *rs_id;     /* the reasoning item's "rs_..." */
  const char *msg_id;    /* the message item's "msg_..." */
  const char *model;
  int64_t created;
  const char *reasoning; /* the whole reasoning so far ("" for none) */
  const char *content;   /* the whole text so far ("" for none) */
  const char *tool_name; /* a function call, or NULL */
  const char *call_id;   /* its id (the part after "fc_" / "call_") */
  const char *arguments; /* its arguments so far */
} ag_simresp;

/* The whole answer: {"completed_at","created_at","id","model","object","output","status",
 * "usage"} with output items for reasoning, text and a call, in that order. */
int ag_simresp_whole(pr_buf *out, const ag_simresp *r, const ag_llsrv_timings *t);

/* Streamed events, SSE-framed ("event: NAME\ndata: JSON\n\n"), appended to out. */
/* response.created and response.in_progress (before the first token's events). */
int ag_simresp_ev_start(pr_buf *out, const ag_simresp *r);
/* One token: the item's added events the first time its kind appears (reasoning,
 * message text, function call), then its delta. kind: 'r' reasoning, 'c' content,
 * 'f' the call's start (no text), 'a' its arguments. */
int ag_simresp_ev_token(pr_buf *out, const ag_simresp *r, char kind, int first_of_kind, const char *text);
/* The end: the done events of each item and response.completed with usage and timings. */
int ag_simresp_ev_done(pr_buf *out, const ag_simresp *r, const ag_llsrv_timings *t);

#endif
