/* Answers verified (docs/routing.md "Answers verified", docs/security.md): a share of the
 * answers phones give is asked again, under deterministic decoding, of the phone that gave
 * it and of another one with a good record (shadow requests: no caller receives them, and
 * a phone cannot tell them from a caller's); answers that disagree go to a third phone,
 * and the phone that loses the vote is charged. The operator's canaries (prompts with
 * known answers) are asked of each phone now and then. A phone charged
 * `verify.quarantine_after` times is quarantined: no work, its answers since its last
 * passed check listed, its batch lines run again, until an operator releases it.
 *
 * What is kept per phone id (a record) outlives the replica: a quarantined phone that
 * leaves and comes back is still quarantined. The budget is a share of the phone work,
 * as hedging's (gw->verify_ledger). The rule for agreement and the rate of checks are
 * pure functions (tests/unit/test_verify.c). server.c wires the module: gw_verify_init
 * sets gw->answered and gw->quarantined; the tick calls gw_verify_tick. */
#ifndef GW_VERIFY_H
#define GW_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "gw.h"

typedef struct gw_verify gw_verify;

/* Whether two answers' texts agree: their first `words` whitespace-separated words are
 * the same (runs of whitespace and the ends do not count). Returns 1 or 0. */
int gw_verify_agree(const char *a, const char *b, int words);
/* The share of a phone's answers to check: 1 while it owes a check (it lost a vote);
 * newcomer_rate until it passed trust_after checks in a row; then newcomer_rate x
 * trust_after / passed, never under min_rate. */
double gw_verify_rate(unsigned passed_in_row, uint64_t passed, int owes, int trust_after,
                      double newcomer_rate, double min_rate);
/* The answers since its last passed check a phone without a record gives before a check
 * of it, undecided, holds it out of new work: ahead x (1 + passed_in_row), ahead alone once
 * it lost a vote (strikes). */
size_t gw_verify_hold_after(int ahead, unsigned passed_in_row, unsigned strikes);
/* The generated text of a whole answer (chat: content, reasoning_content, tool calls'
 * names and arguments of the first choice; completions: text), appended to out. Returns 0,
 * or a negative code (not an answer). */
int gw_verify_answer_text(const char *body, size_t len, pr_buf *out);

/* Set up (gw->verify, the hooks); the canaries file of the config is read: a bad one is
 * an error (err says why). Returns 0 or a negative code. */
int gw_verify_init(gw_server *gw, char *err, size_t errn);
/* A reload: the canaries file again (an error keeps the canaries it had). */
int gw_verify_reload(gw_server *gw, char *err, size_t errn);
void gw_verify_free(gw_server *gw);
/* Canaries due, and holds to clear. */
void gw_verify_tick(gw_server *gw, uint64_t now_ms);
/* A fleet subscriber: a phone that joins again under a quarantined id is quarantined. */
void gw_verify_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);

/* Whether the phone of this id is quarantined (1) or not (0). */
int gw_verify_is_quarantined(gw_server *gw, const char *id);
/* The passed checks in a row the phone of this id still needs for a record (trust_after
 * for one never checked, 0 for a trusted or quarantined one), or -1 when answers are not
 * verified: the capacity advice counts the checks still to come (capacity.c). */
int gw_verify_passes_owed(gw_server *gw, const char *id);
/* Every record ({"phones": [...], "quarantined": [...], "stats": {...}}). */
cJSON *gw_verify_json(gw_server *gw);
/* One phone's record with its evidence, or NULL when the gateway has none. */
cJSON *gw_verify_phone_json(gw_server *gw, const char *id);
/* The requests a quarantined phone answered since its last passed check, or NULL when it
 * is not quarantined. */
cJSON *gw_verify_answers_json(gw_server *gw, const char *id);
/* An operator releases a quarantined phone (who: for the log). Returns 0, or PR_EUNKNOWN
 * when it is not quarantined. It starts again without a record. */
int gw_verify_release(gw_server *gw, const char *id, const char *who);

/* Kept across restarts: with data_dir, every phone's record (checks passed, strikes, a
 * quarantine with its evidence and listed answers, an operator's release) is written to
 * data_dir/verify.json (at once for a quarantine or a release, otherwise within 10 s, on
 * the thread pool) and read by gw_verify_init; a damaged file is kept aside as
 * verify.json.damaged.
 *
 * Shared (shared.c, with Redis): a quarantine or a release is a verdict. What other
 * gateways should know of id's: {"state": "quarantined"|"released", "at_ms", and for a
 * quarantine "strikes", "last_pass_ms", "evidence", "answers", "not_listed"}; NULL when
 * this gateway has none. */
cJSON *gw_verify_verdict_json(gw_server *gw, const char *id);
/* Another gateway's verdict (from: its id), applied when it is newer than this gateway's
 * own (wall clock): a quarantine takes the phone out of work here too, a release puts it
 * back. Returns 1 when this gateway's verdict is the newer one (the caller shares it). */
int gw_verify_apply_verdict(gw_server *gw, const char *id, const cJSON *o, const char *from);
/* fn for each phone with a verdict here (a resync shares those Redis lacks). */
void gw_verify_each_verdict(gw_server *gw, void (*fn)(gw_server *gw, const char *id, void *ud), void *ud);

#endif
