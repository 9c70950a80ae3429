/* JSON text as nlohmann::ordered_json writes it, for the sim's copies of llama-server's
 * error messages, which embed parts of the request as `dump()` (compact) or `dump(2)`
 * (two-space indentation, ": " after keys). cJSON's printer differs in whitespace and in
 * numbers (it prints 3.0 as 3 and 1e15 as 1e+15), so numbers are written from the
 * request's own literals where they are known: an integer literal that fits 64 bits
 * stays an integer, anything else is a double in nlohmann's shortest form (0.5, 3.0,
 * 1e+20, 1e-05). Pure code: no I/O. */
#ifndef AG_NLJSON_H
#define AG_NLJSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "buf.h"

/* Where each number node of a parsed tree has its literal in the text it came from (the
 * i-th number of the tree in pre-order is the i-th number literal of the text). Owned by
 * the caller: ag_nl_lits_free releases it. When the counts differ (the tree was edited,
 * or is not from that text) there are none, and numbers are written from cJSON's
 * doubles. */
typedef struct ag_nl_lit {
  const cJSON *node; /* a number node of the tree */
  size_t off, len;   /* its literal in the text */
} ag_nl_lit;

typedef struct ag_nl_lits {
  const char *text;  /* borrowed: the document the tree was parsed from */
  ag_nl_lit *lit;    /* owned, n long, sorted by node address */
  size_t n;
} ag_nl_lits;

/* Find the number literals of text, the document root was parsed from. Returns 0 or
 * -ENOMEM (lits is then empty but usable). */
int ag_nl_lits_scan(ag_nl_lits *lits, const cJSON *root, const char *text, size_t len);
void ag_nl_lits_free(ag_nl_lits *lits);

/* item (root or any node under it) as nlohmann writes it: indent < 0 compact, else
 * that many spaces per level. lits may be NULL. Returns 0, -ENOMEM or PR_ETOOLARGE. */
int ag_nl_dump(pr_buf *out, const cJSON *item, int indent, const ag_nl_lits *lits);

/* nlohmann's name for item's type ("null", "boolean", "number", "string", "array",
 * "object"), as its exceptions say it. */
const char *ag_nl_type_name(const cJSON *item);

#endif
