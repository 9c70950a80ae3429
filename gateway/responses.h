/* OpenAI's Responses API (POST /v1/responses) on top of chat completions: a request is
 * translated into a chat completion, which the gateway routes, queues, plans, retries,
 * hedges and continues as any other; its answer (whole, or each streamed chunk) is
 * translated back into a Response object or Responses streaming events. The gateway stores
 * no response: previous_response_id, store: true and background are refused, and so are
 * what a chat completion cannot carry (tools, images, files). docs/api.md says which fields
 * are served. Pure: no I/O, no clocks (the caller passes the time and the id). */
#ifndef GW_RESPONSES_H
#define GW_RESPONSES_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "oai.h"

typedef struct gw_resp {
  char id[48];           /* "resp_..." */
  char msg_id[48];       /* its message item */
  char rs_id[48];        /* its reasoning item */
  int64_t created_at;
  cJSON *echo;           /* the request's fields a Response repeats (owned) */
  /* the stream, as it goes */
  int64_t seq;           /* the next event's sequence_number */
  int started;           /* response.created went out */
  int rs_open, msg_open; /* an item added and not done yet */
  int rs_index, msg_index; /* their output_index (-1: none) */
  int n_items;
  pr_buf text, reasoning;
  int64_t in_tokens, out_tokens, cached_tokens, reasoning_tokens;
  int have_usage;
  char finish[24];       /* the chat answer's finish_reason */
  char model[128];
} gw_resp;

/* Translate a /v1/responses body into a chat completion body (chat); id_hex names the
 * response (its items take it too); now_s is created_at. Returns 0, or fills err (400: a
 * field that is wrong, or one this gateway does not serve) and returns < 0. r is freed by
 * gw_resp_free in either case. */
int gw_resp_translate(gw_resp *r, const char *body, size_t len, const char *id_hex, int64_t now_s,
                      pr_buf *chat, pr_oai_error *err);
/* A whole chat completion answer into a Response object. */
int gw_resp_whole(gw_resp *r, const char *chat, size_t len, pr_buf *out);
/* One streamed chat chunk's data ("[DONE]" ends the response) into Responses events (SSE,
 * "event: TYPE\ndata: JSON\n\n" each) appended to out; a chunk without anything to say
 * appends nothing. */
int gw_resp_chunk(gw_resp *r, const char *data, size_t len, pr_buf *out);
/* A stream that ends with an error (an OpenAI error body): the "error" event and
 * response.failed. */
int gw_resp_fail(gw_resp *r, const char *error_body, size_t len, pr_buf *out);
void gw_resp_free(gw_resp *r);

#endif
