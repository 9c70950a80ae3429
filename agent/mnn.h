/* MNN's `mnncli serve` normalised to what OpenAI clients and the gateway expect
 * (docs/agent.md, "MNN normalisation"): its streamed chunks carry
 * finish_reason "" until the last (→ null), it ignores max_tokens (the agent counts the
 * generated chunks, one token each, and ends the answer after the cap with a
 * finish_reason "length" chunk and [DONE]), it ignores stream_options and fakes usage
 * (the agent estimates it: prompt characters / 4, chunks counted), and its errors are
 * {"error":"<string>"} (→ OpenAI's error object).
 *
 * The agent always asks MNN for a stream; for a client that asked for a whole answer
 * the normaliser collects the text and builds the answer at the end. Pure code: bytes
 * in, bytes out, no I/O. */
#ifndef AG_MNN_H
#define AG_MNN_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/* One answer's normalisation state. Owned by the relay; ag_mnn_free releases it. */
typedef struct ag_mnn {
  int chat;               /* chat.completion(.chunk) or text_completion */
  int client_stream;      /* the client asked for a stream */
  int include_usage;      /* ... with stream_options.include_usage */
  int64_t cap;            /* token cap, -1: none */
  int64_t prompt_tokens;  /* the estimate sent in usage */
  int64_t n_tokens;       /* content chunks passed on */
  int64_t real_prompt, real_completion; /* MNN's usage when it looks real, else -1 */
  int complete;           /* the answer is over (cut, finished, or failed) */
  int saw_finish;         /* MNN sent a non-empty finish_reason */
  int error_status;       /* an error event arrived: the status to answer with */
  char finish[24];        /* the finish_reason to report */
  char id[96], model[128], fingerprint[96];
  int64_t created;
  pr_buf text;            /* whole answers: the collected content (capped) */
  pr_buf err;             /* an error event's OpenAI-shaped body */
} ag_mnn;

void ag_mnn_init(ag_mnn *m, int chat, int client_stream, int include_usage, int64_t cap,
                 int64_t prompt_tokens);
void ag_mnn_free(ag_mnn *m);

/* One SSE data payload from MNN. For streaming clients, appends the SSE events the
 * client gets to out. Returns 0 to go on, 1 when the answer is complete (for a stream,
 * out then ends with [DONE] or an error event; stop reading from MNN), or a negative
 * code (PR_ETOOLARGE). */
int ag_mnn_event(ag_mnn *m, const char *data, size_t len, pr_buf *out);
/* MNN's stream ended (EOF) before the answer was complete. `clean`: MNN closed the
 * stream normally. For a stream, appends the closing events (finish chunk, usage,
 * [DONE]) when clean, else an error event. */
int ag_mnn_eof(ag_mnn *m, int clean, pr_buf *out);
/* The whole answer for a client that did not ask for a stream (after complete). */
int ag_mnn_whole(ag_mnn *m, pr_buf *out);

/* Any error body MNN sent (its {"error":"..."}, an OpenAI object, or plain text) as
 * OpenAI's {"error":{"message","type","param","code"}} for that HTTP status. The message
 * is kept whole (a refusal may quote the request); plain text keeps its first line. */
int ag_mnn_error_body(int status, const char *body, size_t len, pr_buf *out);
/* A whole (non-streamed) MNN answer with finish_reason "" → "stop" and usage
 * estimated when it is fake (zeros or missing); rewritten into out. */
int ag_mnn_fix_whole(ag_mnn *m, const char *body, size_t len, pr_buf *out);

/* The OpenAI error type for an HTTP status. */
const char *ag_mnn_error_type(int status);

#endif
