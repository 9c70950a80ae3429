/* What an engine serves beyond one chat or text completion, found out by asking it: llama.cpp
 * releases differ (the build of February 2025 refuses "n" > 1 with a 500 and has no
 * /v1/responses; b10587 of August 2026 serves both and continues a final assistant message
 * with "continue_final_message"), and /props says nothing of it. Each feature has a probe the
 * engine answers at once without generating (a refusal proves it understood the request),
 * or, where it does not know the feature, with one token at most. Pure: the requests and
 * how to read their answers; the agent (agent/engine.c) and the gateway (for a bare engine,
 * gateway/engprobe.c) send them. */
#ifndef PR_FEAT_H
#define PR_FEAT_H

#include <stddef.h>

/* Feature bits (a replica's, an agent's report). */
#define PR_FEAT_CHOICES 0x1   /* serves "n" > 1: each choice on a slot of its own */
#define PR_FEAT_CONTINUE 0x2  /* continues a final assistant message, its reasoning included
                                 ("continue_final_message": true with "add_generation_prompt":
                                 false), without echoing it */
#define PR_FEAT_RESPONSES 0x4 /* serves POST /v1/responses */
#define PR_FEAT_ALL (PR_FEAT_CHOICES | PR_FEAT_CONTINUE | PR_FEAT_RESPONSES)
#define PR_FEAT_CHECKPOINTS 0x8 /* its prompt cache is reused only up to context checkpoints
                                   (a hybrid model such as Qwen3.5 on b10587): an identical
                                   prompt sent again reads its last 4 tokens again, where a
                                   transformer reads 1 (gateway/pcache.h models them) */

/* The probes, in the order they are sent. The first three each answer alone, and the
 * gateway sends them to a bare engine too (PR_FEAT_PROBES_BARE); the last two are one
 * question, asked by an agent of the engine it started or attached (its slot 0 holds a
 * probe's prompt afterwards, which no tenant's prompt is): the same prompt twice on slot 0,
 * the second answer's timings say how much of it came back from the cache. */
typedef enum {
  PR_FEAT_PROBE_CHOICES = 0,
  PR_FEAT_PROBE_CONTINUE,
  PR_FEAT_PROBE_RESPONSES,
  PR_FEAT_PROBE_CKPT_WARM, /* the prompt read once (any answer will do) */
  PR_FEAT_PROBE_CKPT,      /* ...and again: prompt_n 4 with cache_n > 0 is a checkpoint */
  PR_FEAT_PROBES
} pr_feat_probe;
#define PR_FEAT_PROBES_BARE PR_FEAT_PROBE_CKPT_WARM
/* The feature bit each probe's verdict sets (0: none). */
unsigned pr_feat_probe_bit(pr_feat_probe p);

/* The request of a probe: its path and JSON body (static strings). */
const char *pr_feat_probe_path(pr_feat_probe p);
const char *pr_feat_probe_body(pr_feat_probe p);

/* What an answer (status, body) to probe p says: 1 the engine serves the feature, 0 it does
 * not, -1 no verdict (a transport failure, a 503 while loading, a 5xx that is no refusal of
 * the feature: ask again later). For PR_FEAT_PROBE_CHOICES, *choices (may be NULL) gets the
 * most choices the engine serves at once (its slot count, as its refusal of the probe's
 * "n" says), else 1. */
int pr_feat_probe_read(pr_feat_probe p, long status, const char *body, size_t len, int *choices);

/* The names of the feature bits, for reports: "choices", "continue_final_message",
 * "responses", "cache_checkpoints". */
const char *pr_feat_name(unsigned bit);

#endif
