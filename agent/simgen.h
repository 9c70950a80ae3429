/* What the simulated phone "generates": noise words for text, and for tool calls and
 * response_format a JSON value built from a JSON schema (the required properties, or all
 * of them when none is required, each with a plausible value for its type), cut into
 * tokens the way a tokenizer would cut JSON text. Also the per-token logprobs entries
 * llama-server sends. Pure code over cJSON: no I/O, no clock; randomness comes from the
 * caller's state, so a seeded sim answers the same way every time. */
#ifndef AG_SIMGEN_H
#define AG_SIMGEN_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "nljson.h"

/* xorshift64*: next pseudo-random number; *state must not be 0. */
uint64_t ag_simgen_rand(uint64_t *state);

/* A noise word, one token, most with a leading space (" quiet"); *id (may be NULL) gets
 * its token id. */
const char *ag_simgen_word(uint64_t *rng, int *id);

/* Check schema as llama-server's grammar builder (json-schema-to-grammar) reads it:
 * first its "$ref"s ("#/..." pointers that lead nowhere add "Error resolving ref <ref>:
 * <step> not in <dump>", other forms but https:// "Unsupported ref: <ref>"), then each
 * sub-schema it cannot turn into a grammar (a type it does not know, a schema that is a
 * string or a number, an object with neither type nor anything it understands) adds
 * "Unrecognized schema: <dump>"; one line of `errors` each. Returns how many were found,
 * or a negative code. lits (may be NULL) keeps the request's number literals. */
int ag_simgen_check_schema(const cJSON *schema, const ag_nl_lits *lits, pr_buf *errors);

/* A JSON value that validates against schema, compact, into out. The root is always an
 * object (tool arguments and json_object content must be one): a schema that is NULL,
 * empty or not about an object gives {"answer":"<words>"}. $ref ("#/..." pointers into
 * schema), anyOf/oneOf (the first), allOf (merged), const, enum (the first), type lists
 * (the first that is not "null"), string formats, lengths, bounds and item counts are
 * honoured; "pattern" is not. Returns 0, -ENOMEM or PR_ETOOLARGE. */
int ag_simgen_value(pr_buf *out, const cJSON *schema, uint64_t *rng);

/* Length in bytes of the token at the start of text (len > 0): a word with its leading
 * space, or up to three punctuation characters, never a part of a UTF-8 character. */
size_t ag_simgen_token_len(const char *text, size_t len);
/* How many tokens text is cut into. */
int64_t ag_simgen_count_tokens(const char *text, size_t len);

/* The id of a generated token, as its logprobs entry says: a word of the list keeps
 * its own, any other piece gets one from its bytes. */
int ag_simgen_token_id(const char *tok, size_t len);

/* One entry of logprobs.content, as llama-server writes it:
 * {"id","token","bytes","logprob","top_logprobs":[{"id","token","bytes","logprob"},...]},
 * with `top` alternatives (the token itself first), appended to out. */
int ag_simgen_logprob(pr_buf *out, const char *token, size_t len, int top, uint64_t *rng);

#endif
