/* A completion request read the way llama-server reads it before queueing it: the
 * requests it refuses, with its status and its exact message, and what the others ask
 * of the answer (a tool call, JSON content, logprobs, choices, thinking, the cache).
 * Two releases: the build of February 2025 (--jinja) turns every exception into a 500
 * server_error and quotes the messages; the build of August 2026 (b10587) answers most
 * request faults with 400 invalid_request_error in shorter words, serves "n" up to its
 * slot count and checks each field's type ("Field 'stream': ..."). Messages embed the
 * offending part of the request as nlohmann::json writes it (nljson.h). Pure code: no
 * I/O. */
#ifndef AG_SIMREQ_H
#define AG_SIMREQ_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "buf.h"

/* What the answer is. */
typedef enum {
  AG_SIMREQ_TEXT = 0,  /* noise words */
  AG_SIMREQ_TOOL_CALL, /* one call of `function` with arguments built from `schema` */
  AG_SIMREQ_JSON,      /* content that is JSON following `schema` (NULL: any object) */
} ag_simreq_shape;

/* The llama.cpp release whose server is imitated. */
#define AG_SIMREQ_2025 2025
#define AG_SIMREQ_2026 2026

/* What a request asks of its answer. Pointers are borrowed from the parsed body. */
typedef struct ag_simreq {
  ag_simreq_shape shape;
  const char *tool_name; /* TOOL_CALL */
  const cJSON *schema;   /* TOOL_CALL: the function's parameters; JSON: the schema or NULL */
  int top_logprobs;      /* > 0: logprobs with this many alternatives per token */
  int n;                 /* choices ("n"; 1 in the 2025 release) */
  int thinking;          /* -1: as the model does; 0: turned off (chat_template_kwargs
                          * enable_thinking false, reasoning_effort "none"); 1: turned on */
  int cache_prompt;      /* "cache_prompt" (default 1): reuse the slot's cache */
  int id_slot;           /* "id_slot": the slot asked for, -1 for any */
  const cJSON *token_ids;  /* completions: a prompt of token ids (an array of integers) */
  const cJSON *delimiters; /* completions: "message_delimiters" (an array), or NULL */
} ag_simreq;

/* Which server, and how many slots it has ("n" may not exceed them in 2026). */
typedef struct ag_simreq_opts {
  int release;    /* AG_SIMREQ_2025 or AG_SIMREQ_2026 */
  int n_parallel;
  int stream_tools; /* 2025: take `tools` with "stream": true (the MNN flavour, which has
                     * always taken them), where that build refuses them */
} ag_simreq_opts;

/* A refusal: HTTP status, llama-server error type and message. The message is owned:
 * ag_simreq_refusal_free releases it. */
typedef struct ag_simreq_refusal {
  int status;
  const char *type;
  pr_buf message;
} ag_simreq_refusal;

void ag_simreq_refusal_init(ag_simreq_refusal *ref);
void ag_simreq_refusal_free(ag_simreq_refusal *ref);

/* Read a completion body: root was parsed from text (len bytes); chat selects
 * /v1/chat/completions' rules, else /v1/completions'; opts NULL is the 2025 release
 * with one slot. Returns 0 with req filled when llama-server would take the request, 1
 * with ref filled when it would refuse it, or a negative code (-ENOMEM, PR_ETOOLARGE).
 * Checks in llama-server's order; the first fault found is the one reported. Where
 * llama-server accepts a body that the sim's own parser (pr_oai_parse) refuses, this
 * says 0 and the sim answers that parser's 400. */
int ag_simreq_read(const cJSON *root, const char *text, size_t len, int chat,
                   const ag_simreq_opts *opts, ag_simreq *req, ag_simreq_refusal *ref);

#endif
