/* What a phone says about its own answer is a claim, not a measurement: its timings,
 * its usage and the size of what it sends. These pure functions bound each claim by
 * what the gateway knows itself (its own clock, its prompt estimate, the request's
 * token cap), so a lying or broken phone can neither win every plan, disable its
 * watchdog, lock a caller out of its budget, nor fill the gateway's memory
 * (docs/security.md "Untrusted answers"). */
#ifndef GW_BOUNDS_H
#define GW_BOUNDS_H

#include <stddef.h>
#include <stdint.h>

/* Learned rates (tokens/s) stay within these, whatever the source (an answer's
 * timings, an agent's heartbeat, another gateway through Redis). */
#define GW_RATE_MIN 0.001
#define GW_RATE_MAX 1e6
/* A phone's own timings may claim at most this much more speed than the gateway's clock
 * saw (its times are floored at the wall-clock time / this factor). */
#define GW_RATE_WALL_FACTOR 2.0
/* Usage the caller is charged: prompt tokens at most this multiple of the gateway's
 * estimate of its messages, or the request body's bytes (tools, schemas and the like are
 * prompt too, and no token is shorter than a byte) when more, plus the slack (the chat
 * template); completion tokens at most the request's cap. */
#define GW_USAGE_PROMPT_FACTOR 4
#define GW_USAGE_PROMPT_SLACK 256
#define GW_USAGE_TOOLS_SLACK 2048 /* a template's preamble on how to call tools */
/* Completion tokens at most what the caller was given: one a byte of the answer's text,
 * one a chunk (a token may show no text: the one that ends the answer, an incomplete
 * UTF-8 character held back), and this slack for what engines take out of the text
 * (stop words, thinking tags). */
#define GW_USAGE_COMPLETION_SLACK 16
/* The slack on top of max_tokens × bytes per token for an answer's bytes, the factor
 * for answers with log-probabilities, and the text a stream may carry per token. */
#define GW_ANSWER_SLACK ((size_t)256 << 10)
#define GW_ANSWER_LOGPROBS_FACTOR 16
#define GW_TEXT_BYTES_PER_TOKEN 128
#define GW_TEXT_SLACK ((size_t)4 << 10)

/* A rate made safe to learn: NaN, infinities and values <= 0 give 0 (not learned); the
 * rest is clamped to [GW_RATE_MIN, GW_RATE_MAX]. */
double gw_bound_rate(double tps);

/* A phone's timings (counts and milliseconds) as learned. A count or time that is not a
 * finite number >= 0 voids its pair (set to 0: not learned); counts are capped at
 * max_prompt_n / max_pred_n (<= 0: no cap). Then the gateway's clock bounds the paces:
 * the time a part's claimed pace predicts for the gateway's own count of its tokens
 * (own_prompt_n: its estimate of the prompt not cached; own_pred_n: the tokens it
 * relayed or was told, within the cap; <= 0: the phone's count) is at least the
 * wall-clock time of that part / GW_RATE_WALL_FACTOR (prefill_wall_ms: sent to the
 * first byte of a stream; decode_wall_ms: first to last byte; <= 0 unknown). For a whole
 * answer only the whole is seen (total_wall_ms: sent to its first byte, after prefill
 * and decode), and both times are stretched alike until their prediction reaches that
 * floor. Returns 1 when anything was changed. */
typedef struct gw_timings {
  double prompt_n, prompt_ms, pred_n, pred_ms;
} gw_timings;
int gw_bound_timings(gw_timings *t, double own_prompt_n, double own_pred_n, double max_prompt_n,
                     double max_pred_n, double prefill_wall_ms, double decode_wall_ms,
                     double total_wall_ms);

/* A disagreement smaller than this (ms) is latency (the network, HTTP), not a lie. */
#define GW_TRUST_SLACK_MS 250.0
/* gw_bound_timings, and first (after voiding and capping) trust but verify: each part the
 * gateway timed (as above: a stream's prefill and decoding, a whole answer's total) must
 * predict, for the gateway's own count, a time within [wall / trust_factor, wall ×
 * trust_factor], or differ from wall by at most GW_TRUST_SLACK_MS. A part that does not
 * is taken from the gateway's clock instead: its time becomes the wall-clock time (a
 * whole answer's two times are scaled alike to the total, as the phone split them; with
 * no time claimed at all, the total is split evenly between the parts with tokens), and
 * *disagreed is set to 1. trust_factor < 1 (0): no check. Returns 1 when anything was
 * changed, as gw_bound_timings. */
int gw_verify_timings(gw_timings *t, double own_prompt_n, double own_pred_n, double max_prompt_n,
                      double max_pred_n, double prefill_wall_ms, double decode_wall_ms,
                      double total_wall_ms, double trust_factor, int *disagreed);

/* The prompt tokens a phone evaluated (not taken from its cache), in the gateway's own
 * count, which is what plans are made in: the phone's tokenizer is not the gateway's
 * estimate (llama.cpp's tiny test model makes about four tokens of what the estimate
 * calls one; CJK text and code differ too), so its evaluated share of its own total
 * (phone_eval / phone_total, at most 1) is applied to the gateway's estimate of the
 * whole prompt (own_total), and the result is never more than own_cap (the gateway's
 * estimate of the prompt not cached: a phone's counts buy no more speed than that).
 * phone_total or phone_eval unknown (not a finite number > 0): own_cap. Never < 0. */
double gw_own_evaluated(double own_total, double own_cap, double phone_total, double phone_eval);

/* A count a phone reports (usage, timings' counts) as an integer: -1 when it is not a
 * finite number, or is negative; capped at 1e12 (no double-to-integer overflow). */
int64_t gw_bound_count(double v);

/* The most prompt tokens a request can have: max(GW_USAGE_PROMPT_FACTOR × est_prompt,
 * body_bytes) + GW_USAGE_PROMPT_SLACK, + GW_USAGE_TOOLS_SLACK when it carries tools. */
int64_t gw_usage_prompt_max(int64_t est_prompt, size_t body_bytes, int tools);
/* The most completion tokens a caller is charged for one attempt: text_bytes (the
 * generated text relayed to it: content, reasoning, tool calls; pr_oai_answer_text_bytes)
 * + chunks (a stream's events with choices, or a whole answer's choices) +
 * GW_USAGE_COMPLETION_SLACK, never more than cap (the cap the attempt was sent; <= 0:
 * none). */
int64_t gw_usage_completion_max(int64_t text_bytes, int64_t chunks, int64_t cap);
/* The usage a caller is charged for one attempt: prompt tokens at most prompt_max,
 * completion tokens at most max_completion (gw_usage_completion_max), cached
 * tokens at most the prompt. Unknown (< 0) values stay unknown. Returns 1 when anything
 * was clamped. */
int gw_usage_clamp(int64_t *prompt, int64_t *completion, int64_t *cached, int64_t prompt_max,
                   int64_t max_completion);

/* The most bytes a phone may send for a request capped at max_tokens: a whole answer's
 * body, or all of a stream's events: GW_ANSWER_SLACK + max_tokens × bytes_per_token
 * (× GW_ANSWER_LOGPROBS_FACTOR with log-probabilities), at most hard_max. */
size_t gw_answer_cap(int64_t max_tokens, size_t bytes_per_token, int logprobs, size_t hard_max);
/* The most text a stream may carry for max_tokens (what is kept to continue it on
 * another phone): GW_TEXT_SLACK + max_tokens × GW_TEXT_BYTES_PER_TOKEN, at most hard_max. */
size_t gw_text_cap(int64_t max_tokens, size_t hard_max);

/* The share cap of a phone without a record: how many requests it may hold at once
 * after n_ok good answers, when the rest of the fleet has others_slots usable slots.
 * 0 means no cap: the phone has trust_after good answers or more (trust_after 0 turns
 * the cap off), or no other phone could take its work. Otherwise the larger of
 * 1 + n_ok (it earns a slot with each good answer) and others_slots: never more than
 * the rest of the fleet together, so at most half of the work in flight. */
int gw_trust_cap(uint64_t n_ok, int trust_after, int others_slots);

/* How many requests the phones without a record may hold together: the usable slots of
 * the trusted phones (trusted_slots), or the slots they earned between them (earned: the
 * sum of their good answers, each counted up to its own slots) when that is more. Many
 * ids of one owner thus take no more than the trusted fleet beside them. -1 means no
 * cap: no trusted phone at all (a fresh fleet fills as before). */
int64_t gw_trust_group_cap(int trusted_slots, int64_t earned);

/* A rate a phone claims (heartbeat or config seed) before anything was learned of it:
 * not believed beyond the fastest rate learned of any phone (fleet_max; <= 0: none
 * learned yet, the claim stands). */
double gw_bound_seed(double tps, double fleet_max);

#endif
