/* OpenAI request inspection and OpenAI-shaped error bodies. A request body is parsed
 * once: endpoint kind, model, stream flag, include_usage, the token cap under its three
 * names (n_predict > max_completion_tokens > max_tokens, llama-server's precedence),
 * the rendered prompt text, an estimated prompt-token count (characters / 4), and
 * fingerprints of the prompt's leading blocks for prefix-cache matching. */
#ifndef PR_OAI_H
#define PR_OAI_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"

typedef enum { PR_OAI_CHAT = 0, PR_OAI_COMPLETION = 1 } pr_oai_kind;

/* Where the token cap came from. */
typedef enum {
  PR_OAI_CAP_NONE = 0,
  PR_OAI_CAP_MAX_TOKENS,            /* "max_tokens" */
  PR_OAI_CAP_MAX_COMPLETION_TOKENS, /* "max_completion_tokens" */
  PR_OAI_CAP_N_PREDICT,             /* "n_predict" (llama.cpp) */
} pr_oai_cap_field;

/* Characters per prefix block: the granularity of prefix fingerprints. */
#define PR_OAI_BLOCK_CHARS 256
/* Prompts longer than this many blocks only fingerprint their first blocks. */
#define PR_OAI_MAX_BLOCKS 256

typedef struct pr_oai_req {
  pr_oai_kind kind;
  cJSON *root;            /* owned: the parsed body */
  const char *model;      /* points into root */
  int stream;             /* "stream": true */
  int include_usage;      /* "stream_options": {"include_usage": true} */
  int64_t max_tokens;     /* the effective cap; -1 when none was given */
  pr_oai_cap_field cap_field;
  pr_buf prompt;          /* rendered prompt text (chat: ChatML, see oai.c) */
  int64_t prompt_tokens;  /* estimate: ceil(prompt characters / 4), at least 1 */
  size_t n_blocks;        /* full PR_OAI_BLOCK_CHARS blocks of the prompt fingerprinted */
  uint64_t *blocks;       /* owned, n_blocks long: blocks[i] fingerprints prompt[0 .. (i+1)*BLOCK) */
  int64_t user_at;        /* estimated tokens (characters / 4) before the last user turn of a
                             chat ("<|im_start|>user" of the rendered prompt), where a hybrid
                             engine makes a context checkpoint; -1: none (a completion) */
  uint64_t user_fp;       /* fingerprint of the prompt before it (0: none) */
  uint64_t full_fp;       /* fingerprint of the whole prompt (0: empty) */
  size_t body_len;        /* of the parsed body: the size pr_oai_render makes room for */
  cJSON *cache_orig;      /* owned: the client's "cache_prompt" (pr_oai_set_cache); NULL none */
  int choices;            /* "n" (or llama-server's "n_cmpl"): the choices asked, 1 when
                             absent or not a whole number >= 1 (pr_oai_check_fleet refuses those) */
  int cache_seen;         /* cache_orig was taken */
  int cache_off;          /* the client itself sent "cache_prompt": false: the engine reuses
                             nothing it cached for this request, wherever it goes (whatever
                             pr_oai_set_cache later puts in the body for a phone) */
} pr_oai_req;

/* An error to answer with, in OpenAI's terms. */
typedef struct pr_oai_error {
  int status;           /* HTTP status: 400 */
  char message[512];
  const char *type;     /* "invalid_request_error" */
  char param[64];       /* "" for null */
  const char *code;     /* NULL for null, else e.g. "invalid_json" */
} pr_oai_error;

/* Parse and validate a request body. Checks: a JSON object (depth-limited), "model"
 * a non-empty string, chat: "messages" a non-empty array of objects each with a string
 * "role" and a "content" that is a string, null, or an array of parts with "text";
 * completion: "prompt" a string or an array of strings; "stream" a boolean when present;
 * the token caps positive integers when present. On error returns a negative code and
 * fills err with status 400, type "invalid_request_error", the param and a message. */
int pr_oai_parse(pr_oai_req *r, pr_oai_kind kind, const char *body, size_t len,
                 pr_oai_error *err);
void pr_oai_free(pr_oai_req *r);
/* Parse JSON a phone sent (a whole answer, or one event of a stream) under the caps a
 * client's body has: UTF-8 only, no raw control characters in strings, nesting at most
 * 64 deep, at most 100,000 values. Returns 0 with *out the tree (the caller's), or a
 * negative code (PR_ETOOLARGE: too many values; PR_EPARSE: anything else) with *out
 * NULL and err's message saying why. */
/* Whether the request asks for log-probabilities ("logprobs": true or a number > 0,
 * "top_logprobs" or llama.cpp's "n_probs" > 0): its answer is many times larger. */
int pr_oai_wants_logprobs(const pr_oai_req *r);
int pr_oai_parse_answer(const char *text, size_t len, cJSON **out, pr_oai_error *err);
/* The most choices ("n") a request may ask; which phones serve how many is the gateway's
 * business (engine features, proto/feat.h). */
#define PR_OAI_MAX_CHOICES 64

/* What a whole fleet would refuse, checked by the gateway after pr_oai_parse (not by the
 * sim, which answers as llama-server does): "n" (or llama-server's "n_cmpl") that is no
 * whole number from 1 to PR_OAI_MAX_CHOICES, or the two names with different values; and
 * "tools" not in OpenAI's shape (a list of {"type":"function", "function":{"name",...}});
 * none of them, nor "cache_prompt", "id_slot" or "slot_id", given twice. Whether a phone
 * serves more than one choice is for the gateway to say. Returns 0, or fills err (400). */
int pr_oai_check_fleet(const pr_oai_req *r, pr_oai_error *err);
/* Free the rendered prompt text once it is no longer needed (prompt_tokens and the
 * fingerprints stay). */
void pr_oai_drop_prompt(pr_oai_req *r);

/* Set the cap sent upstream: writes "max_tokens" (and rewrites whichever of the three
 * names the client used) to `cap`, and updates r->max_tokens. */
int pr_oai_set_max_tokens(pr_oai_req *r, int64_t cap);
/* Serialise the (possibly edited) request into out. */
int pr_oai_render(const pr_oai_req *r, pr_buf *out);
/* How the request uses one phone's prompt cache, set before it is rendered for that
 * phone: reuse 0 sends "cache_prompt": false (llama-server then reuses no prefix it
 * cached), 1 what the client said; id_slot >= 0 pins it to that slot of the engine, -1
 * leaves the choice to the engine. A client's own "id_slot" (or "slot_id") never goes
 * through. Returns 0 or -ENOMEM. */
int pr_oai_set_cache(pr_oai_req *r, int reuse, int id_slot);

/* The text a streamed chunk carries in its first choice (chat: delta.content;
 * completions: text), or NULL when it carries none. Points into chunk. */
const char *pr_oai_chunk_text(const cJSON *chunk);
/* The reasoning a chat chunk carries in its first choice (delta.reasoning_content, as
 * llama-server's thinking models write it, or delta.reasoning), or NULL. Points into chunk. */
const char *pr_oai_chunk_reasoning(const cJSON *chunk);

/* The bytes of generated text an answer (or a streamed chunk) carries, over all its
 * choices: content, reasoning_content, reasoning and refusal of the message (or delta),
 * tool calls' function names and arguments, and a text completion's text. `answer` is
 * `raw` (raw_len bytes) parsed; a "\u0000" escape in raw, which ends cJSON's copy of a
 * string early, counts as the one byte it stands for, and what follows it too. *choices
 * (if not NULL) gets the number of choices it holds. What a caller was actually given,
 * for bounding the completion tokens it is charged (the gateway's bounds.h). */
size_t pr_oai_answer_text_bytes(const cJSON *answer, const char *raw, size_t raw_len, size_t *choices);

/* How a phone goes on with an answer another one broke off (chat). */
typedef enum {
  PR_OAI_CONT_PREFILL = 0, /* the text so far as a last assistant message, as it is: older
                              engines start a new turn after it (the 2025 build), and b10587
                              repeats it in its answer; reasoning cannot be carried */
  PR_OAI_CONT_FINAL,       /* an engine that serves continue_final_message (feat.h): the
                              assistant message carries the reasoning so far
                              (reasoning_content) and the content so far, with
                              "continue_final_message": true and "add_generation_prompt":
                              false; the engine goes on inside it and repeats nothing */
} pr_oai_cont_mode;

/* The request again, for another phone to go on with an answer the first one broke off:
 * the text so far is the assistant's message to continue (chat, in `mode`; `reasoning`
 * may be NULL or "") or is appended to the prompt (completions), and every cap the client
 * used, and max_tokens, is `left` (at least 1). Everything else the request carries
 * (tools, response_format, stop, seed, chat_template_kwargs...) is kept. */
int pr_oai_render_continuation(const pr_oai_req *r, const char *sofar, const char *reasoning,
                               pr_oai_cont_mode mode, int64_t left, pr_buf *out);
/* Rewrite, in place, a chunk of the phone that continues a stream so the client reads
 * one answer: the role chunk goes (returns 1: drop the chunk) unless it carries text,
 * reasoning or tool calls (then only "role" goes), the chunk takes the first stream's id (when not
 * ""), and usage counts the tokens_before sent by earlier phones. */
int pr_oai_continue_chunk(cJSON *chunk, const char *stream_id, int64_t tokens_before);

/* Whether a streamed chunk's first choice carries tool-call deltas. */
int pr_oai_chunk_has_tool_calls(const cJSON *chunk);

/* Number of leading blocks two fingerprint lists share. */
size_t pr_oai_common_blocks(const uint64_t *a, size_t na, const uint64_t *b, size_t nb);

/* {"error":{"message":...,"type":...,"param":...|null,"code":...|null}} into out;
 * param/code NULL or "" give null. */
int pr_oai_error_body(pr_buf *out, const char *message, const char *type, const char *param,
                      const char *code);
/* Fill err conveniently. */
void pr_oai_error_set(pr_oai_error *err, int status, const char *type, const char *param,
                      const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Render chat messages as the prompt text the prefix cache and token estimate use:
 * "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then "<|im_start|>assistant\n". */
int pr_oai_render_chatml(const cJSON *messages, pr_buf *out);

#endif
