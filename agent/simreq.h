/* A completion request read the way llama-server (a build of February 2025, --jinja)
 * reads it before queueing it: the requests it refuses, with its status and its exact
 * message, and what the others ask of the answer (a tool call, JSON content, logprobs).
 * llama-server refuses most request faults with 500 server_error, not 400: its handler
 * turns every exception into a 500, and the messages embed the offending part of the
 * request as nlohmann::json writes it (nljson.h). Pure code: no I/O. */
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

/* What a request asks of its answer. Pointers are borrowed from the parsed body. */
typedef struct ag_simreq {
  ag_simreq_shape shape;
  const char *tool_name; /* TOOL_CALL */
  const cJSON *schema;   /* TOOL_CALL: the function's parameters; JSON: the schema or NULL */
  int top_logprobs;      /* > 0: logprobs with this many alternatives per token */
} ag_simreq;

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
 * /v1/chat/completions' rules, else /v1/completions'. Returns 0 with req filled when
 * llama-server would take the request, 1 with ref filled when it would refuse it, or a
 * negative code (-ENOMEM, PR_ETOOLARGE). Checks in llama-server's order; the first
 * fault found is the one reported. Where llama-server accepts a body that the sim's
 * own parser (pr_oai_parse) refuses, this says 0 and the sim answers that parser's
 * 400. Unlike the February 2025 build, `tools` with `"stream": true` are taken (newer
 * builds stream tool calls). */
int ag_simreq_read(const cJSON *root, const char *text, size_t len, int chat, ag_simreq *req,
                   ag_simreq_refusal *ref);

#endif
