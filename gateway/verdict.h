/* What a phone's error answer says: that the phone cannot serve anyone (charge it, try
 * another), or that this request is at fault (answer the caller, leave the phone be).
 * llama-server answers many bad requests with 500 server_error and keeps serving
 * everyone else, so a status alone cannot tell; the body and how fast it came can.
 * Pure functions, no I/O: the rule is docs/routing.md "Phone failures and request
 * errors". */
#ifndef GW_VERDICT_H
#define GW_VERDICT_H

#include <stddef.h>

#include "buf.h"

typedef enum {
  GW_VERDICT_PHONE = 0, /* the phone is failing: refused, 502/503/504, auth, garbage, late */
  GW_VERDICT_LOADING,   /* 503 Loading model: the phone is starting */
  GW_VERDICT_REFUSED,   /* a 4xx with a readable error: the request's fault, final */
  GW_VERDICT_AMBIGUOUS, /* a prompt 5xx with a readable error: the request's fault until a
                           second phone answers it differently */
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
 * ("context_length_exceeded" for llama-server's exceed_context_size_error, else
 * "request_refused"). *code_out (may be NULL) gets that code: a static string. */
int gw_verdict_error_body(const char *body, size_t len, pr_buf *out, const char **code_out);

#endif
