/* llama.cpp's llama-server as seen on the wire, in two releases (the build of February
 * 2025 and b10587 of August 2026; tests/system/test_sim.py compares them live): the
 * bodies of /props, /slots, /metrics, /v1/models, completion answers and stream
 * chunks, and its error shape. Builders only: they fill a pr_buf and know nothing of
 * connections or time, so the simulated phone and the tests share one copy of the
 * shapes. Every function returns 0 or a negative code (-ENOMEM, PR_ETOOLARGE). */
#ifndef AG_LLSRV_H
#define AG_LLSRV_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"

/* Response headers every llama-server answer carries besides Server: llama.cpp. */
#define AG_LLSRV_CORS_HEADER "Access-Control-Allow-Origin: "
#define AG_LLSRV_JSON_CTYPE "application/json; charset=utf-8"
#define AG_LLSRV_SSE_CTYPE "text/event-stream"
#define AG_LLSRV_METRICS_CTYPE "text/plain; version=0.0.4"

/* The releases whose shapes differ. */
#define AG_LLSRV_2025 2025
#define AG_LLSRV_2026 2026

/* Error types and the statuses llama-server pairs them with. */
#define AG_LLSRV_E_INVALID "invalid_request_error"         /* 400 */
#define AG_LLSRV_E_AUTH "authentication_error"             /* 401 */
#define AG_LLSRV_E_NOT_FOUND "not_found_error"             /* 404 */
#define AG_LLSRV_E_SERVER "server_error"                   /* 500 */
#define AG_LLSRV_E_UNAVAILABLE "unavailable_error"         /* 503 */
#define AG_LLSRV_E_CONTEXT "exceed_context_size_error"     /* 400 */
#define AG_LLSRV_E_NOT_SUPPORTED "not_supported_error"     /* 501 */

/* {"error":{"code":C,"message":M,"type":T}}: the shape of errors raised while handling
 * a request. */
int ag_llsrv_error(pr_buf *out, int code, const char *type, const char *message);
/* 400 exceed_context_size_error with n_prompt_tokens and n_ctx. */
int ag_llsrv_error_context(pr_buf *out, int64_t n_prompt_tokens, int64_t n_ctx);

/* What one answer reports about its own timing (timings and usage objects). Times are
 * milliseconds. */
typedef struct ag_llsrv_timings {
  int64_t cache_n;     /* prompt tokens reused from the slot's cache */
  int64_t prompt_n;    /* prompt tokens computed */
  double prompt_ms;
  int64_t predicted_n; /* tokens generated */
  double predicted_ms;
} ag_llsrv_timings;

/* Add "timings" to obj, floats written as llama-server writes them. */
void ag_llsrv_add_timings(cJSON *obj, const ag_llsrv_timings *t, int release);

/* Identity of one completion answer, shared by all its chunks. Strings are borrowed. */
typedef struct ag_llsrv_answer {
  int chat;                /* 1: chat.completion(.chunk), 0: text_completion */
  const char *id;          /* "chatcmpl-..." */
  int64_t created;         /* unix seconds */
  const char *model;
  const char *fingerprint; /* system_fingerprint */
  const char *tool_name;   /* chat: the answer is a call of this function, NULL for text */
  const char *tool_id;     /* ... with this call id ("call_..."; chunks) */
  int release;             /* AG_LLSRV_2025 or AG_LLSRV_2026 (0: 2026) */
  int index;               /* chunks: the choice they belong to */
  int reasoning;           /* chat: the text is reasoning_content; content is "" */
} ag_llsrv_answer;

/* One choice of a whole answer. */
typedef struct ag_llsrv_choice {
  const char *text;        /* content, reasoning or a tool call's arguments */
  size_t len;
  const char *finish;
  const char *logprobs;    /* logprobs.content entries, comma-separated, or NULL */
  const char *tool_id;     /* the call's id, for a tool call */
} ag_llsrv_choice;

typedef enum {
  AG_LLSRV_CHUNK_ROLE,       /* chat only (2026): delta {"role":"assistant","content":null} */
  AG_LLSRV_CHUNK_TEXT,       /* a piece of generated text */
  AG_LLSRV_CHUNK_TOOL_START, /* chat: delta tool_calls [{index, id, type, function: {name,
                              * arguments ""}}] */
  AG_LLSRV_CHUNK_TOOL_ARGS,  /* chat: delta tool_calls [{index, function: {arguments: text}}] */
  AG_LLSRV_CHUNK_FINISH,     /* finish_reason set, empty delta / text */
  AG_LLSRV_CHUNK_USAGE,      /* chat (2026): choices [], usage and timings
                              * (stream_options.include_usage) */
} ag_llsrv_chunk_kind;

/* One stream chunk's JSON (no SSE framing) into out. `text` is used by TEXT and
 * TOOL_ARGS, `finish` by FINISH. `t` is required by USAGE and, when not NULL, adds
 * "timings" to a FINISH chunk (llama-server puts timings on the last chunk of a
 * choice), and "usage" too where that release puts it there (text completions; chats
 * of 2025). `logprobs`, when not NULL, is the JSON text of the chunk's logprobs.content
 * entries, comma-separated (TEXT, TOOL_ARGS). */
int ag_llsrv_chunk(pr_buf *out, const ag_llsrv_answer *a, ag_llsrv_chunk_kind kind,
                   const char *text, const char *finish, const ag_llsrv_timings *t,
                   const char *logprobs);
/* A whole (non-streamed) answer with n choices (index 0, 1, ...), usage and timings
 * (the first choice's: llama-server reports the first task's). For a tool call
 * (a->tool_name) each text is the call's arguments. */
int ag_llsrv_answer_body(pr_buf *out, const ag_llsrv_answer *a, const ag_llsrv_choice *ch,
                         size_t n, const ag_llsrv_timings *t);

/* GET /props. */
int ag_llsrv_props(pr_buf *out, int release, const char *model, int64_t n_ctx, int total_slots,
                   const char *build_info);
/* GET /v1/models. */
int ag_llsrv_models(pr_buf *out, int release, const char *model, int64_t n_ctx, int64_t created);

/* What /slots shows about one slot. */
typedef struct ag_llsrv_slot {
  int id;
  int64_t n_ctx;
  int is_processing;
  int has_task;        /* 0: the slot never ran a task; only id/n_ctx/... are shown */
  int64_t id_task;
  int64_t n_prompt_tokens;
  int64_t n_prompt_tokens_processed;
  int64_t n_prompt_tokens_cache;
  int64_t n_predict;   /* the task's cap, -1 for none */
  int stream;
  int64_t n_decoded;
} ag_llsrv_slot;

/* GET /slots: a JSON array, one object per slot. */
int ag_llsrv_slots(pr_buf *out, int release, const ag_llsrv_slot *slots, size_t n);

/* Counters and gauges of GET /metrics. */
typedef struct ag_llsrv_metrics {
  int release;                 /* AG_LLSRV_2025 or AG_LLSRV_2026 (0: 2026) */
  uint64_t prompt_tokens_total;
  uint64_t prompt_tokens_cached_total;
  uint64_t kv_cache_tokens;    /* tokens the slots hold (2025) */
  double prompt_seconds_total;
  uint64_t tokens_predicted_total;
  double tokens_predicted_seconds_total;
  uint64_t n_decode_total;
  uint64_t n_tokens_max;
  uint64_t n_busy_slots_total; /* busy slots summed over decode calls (for the average) */
  uint64_t requests_processing;
  uint64_t requests_deferred;
} ag_llsrv_metrics;

/* Prometheus text, the same names, HELP and TYPE lines as llama-server --metrics. */
int ag_llsrv_metrics_text(pr_buf *out, const ag_llsrv_metrics *m);

#endif
