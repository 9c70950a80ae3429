/* What a phone's error answer says: that the phone cannot serve anyone (charge it, try
 * another), or that this request is at fault (answer the caller, leave the phone be).
 * llama-server answers many bad requests with 500 server_error and keeps serving
 * everyone else, so a status alone cannot tell; the body and how fast it came can.
 * Pure functions, no I/O: the rule is docs/routing.md "Phone failures and request
 * errors". */
#ifndef GW_VERDICT_H
#define GW_VERDICT_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

typedef enum {
  GW_VERDICT_PHONE = 0, /* the phone is failing: refused, 502/503/504, auth, garbage, late */
  GW_VERDICT_LOADING,   /* 503 Loading model: the phone is starting */
  GW_VERDICT_REFUSED,   /* a 4xx with a readable error: the request's fault, final */
  GW_VERDICT_AMBIGUOUS, /* a prompt 5xx with a readable error: the request's fault until a
                           second phone answers it differently */
  GW_VERDICT_UNPARSABLE, /* a 500 saying the model's output did not match its chat
                            template's format (b10587, after the whole generation: invalid
                            UTF-8, a broken tool call): tried once on a second phone, the
                            request's fault when that says the same; never the phone's */
} gw_verdict;

/* Error bodies larger than this are not read as a refusal (a phone's refusal is small). */
#define GW_VERDICT_MAX_BODY (64u * 1024)
/* The longest phone message passed on to a caller (bytes, cut on a UTF-8 boundary). */
#define GW_VERDICT_MAX_MESSAGE 2048

/* The verdict on a non-200 answer with this status and body that came elapsed_s after
 * the request went out; window_s is how prompt a refusal must be (upstream.refusal_window_s). */
gw_verdict gw_verdict_of(long status, const char *body, size_t len, double elapsed_s,
                         double window_s);

/* The status an error event in a stream stands for: its integer "code" when that is an
 * HTTP error status (llama-server's shape), else 500. */
long gw_verdict_event_status(const char *data, size_t len);

/* The caller's answer to a refusal, in OpenAI's error shape: type invalid_request_error,
 * the phone's message (capped), the phone's param when it gave one, and our code
 * ("context_length_exceeded" for llama-server's exceed_context_size_error, with OpenAI's
 * message and param "messages" when it says n_prompt_tokens and n_ctx; "model_output_
 * unparsable" for GW_VERDICT_UNPARSABLE's; else "request_refused"). *code_out (may be
 * NULL) gets that code: a static string. */
int gw_verdict_error_body(const char *body, size_t len, pr_buf *out, const char **code_out);

/* llama-server's exceed_context_size_error (b10587: 400 with n_prompt_tokens and n_ctx):
 * 1 with the numbers (either may be -1 when not given), 0 when body is no such error. */
int gw_verdict_context(const char *body, size_t len, int64_t *n_prompt_tokens, int64_t *n_ctx);

#endif
