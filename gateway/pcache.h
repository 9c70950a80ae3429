/* A replica's prompt cache as the gateway models it: the last prompts it sent there, and
 * whose they were (API keys' cache scopes), so that plans can count the tokens a request
 * will find cached, and so that no request reuses what another scope left on the phone
 * (docs/security.md "Tenants' prompts", docs/routing.md "Prefix cache").
 *
 * Who keeps scopes apart. A phone whose agent says it does (its status's
 * `cache_isolation`: "slots" or "engine") is told each request's scope
 * (x-fleetgate-cache-scope) and decides itself: the agent is its engine's only client,
 * knows what each slot was given and whether the engine read it, and when it started the
 * engine afresh (agent/isolate.h). Any other phone (a bare llama-server, an older agent) is
 * kept apart here, as a whole: a request may reuse only while every prompt sent there
 * since the gateway last saw its engine load its model was its scope's; otherwise it is
 * sent with "cache_prompt": false. Pure: no I/O, no clock. */
#ifndef GW_PCACHE_H
#define GW_PCACHE_H

#include <stddef.h>
#include <stdint.h>

#define GW_CACHE_PROMPTS 4   /* prompts remembered per replica */
#define GW_CACHE_BLOCKS 128  /* blocks of each prompt remembered (PR_OAI_BLOCK_CHARS characters) */
#define GW_CACHE_CKPTS 8     /* context checkpoints remembered per slot (hybrid engines) */
#define GW_CACHE_SHARES 4    /* models whose confirmed share is learned per replica */

/* How llama-server b10587 places context checkpoints (its defaults; docs/sim.md and
 * docs/routing.md "Prefix cache" say where each comes from), in estimated tokens. */
#define GW_CKPT_MIN_STEP 8192 /* --checkpoint-min-step */
#define GW_CKPT_N_BATCH 2048  /* -b: a prompt is read in batches of this many at most */
#define GW_CKPT_TAIL_FAR 516  /* 4 + n_ubatch (512) before the end */
#define GW_CKPT_TAIL_NEAR 4   /* 4 before the end */
#define GW_CKPT_NEAR 512      /* a batch ending closer than n_ubatch to the end is "near" */

/* A context checkpoint the engine keeps in a slot (hybrid engines): the state after `at`
 * tokens, made for the request `task`; fp fingerprints the prompt before it when the
 * gateway can tell a later prompt shares that much exactly (the start of the last user
 * turn: the prompt before it; 4 before the end: the whole prompt), else 0. */
typedef struct gw_pckpt {
  int64_t at;          /* estimated tokens before it; for one counted from the end: */
  int64_t end, tail;   /* ...the prompt's estimated tokens and the engine's tokens before
                          its end (tail 0: `at` as it is), placed with the engine's tokens
                          per estimated token learned when it is read (gw_pcache_token_ratio) */
  uint64_t fp;
  uint64_t task;
} gw_pckpt;

/* One prompt remembered. */
typedef struct gw_pslot {
  uint64_t scope;      /* whose prompt (the cache scope); 0: none */
  uint64_t blocks[GW_CACHE_BLOCKS];
  size_t n_blocks;
  uint64_t used;       /* when it was last sent (the cache's own counter) */
  gw_pckpt ck[GW_CACHE_CKPTS]; /* hybrid engines: its checkpoints, oldest first */
  int n_ck;
} gw_pslot;

/* What a prompt offers a checkpoint model (pr_oai_req's fields of the same names). */
typedef struct gw_pquery {
  const uint64_t *blocks;
  size_t n_blocks;
  int64_t prompt_tokens; /* estimated */
  int64_t user_at;       /* tokens before the last user turn; -1: none */
  uint64_t user_fp, full_fp;
  const char *model;     /* its model: the engine's tokens per estimated token learned for it
                            place the checkpoints counted from the end (NULL: 1) */
} gw_pquery;

/* The share of its predicted hits a replica's engine confirmed for one model (the answers'
 * cache_n and prompt_n against the prediction): a weighted mean whose weight is bounded and
 * halves every GW_CACHE_SHARE_HALF_S, so that new answers outweigh old ones. */
typedef struct gw_pshare {
  char model[64];      /* "" unused */
  double share;        /* confirmed / predicted, 0 .. GW_CACHE_SHARE_MAX */
  double weight;       /* answers behind it (decayed), at most GW_CACHE_SHARE_WEIGHT */
  double ratio;        /* the engine's prompt tokens per estimated one (its tokenizer)... */
  double rweight;      /* ...and the answers behind it, as weight */
  uint64_t at_ms;      /* last answer */
} gw_pshare;
#define GW_CACHE_SHARE_MAX 2.0
#define GW_CACHE_SHARE_WEIGHT 4.0
#define GW_CACHE_SHARE_HALF_S 600.0
#define GW_CACHE_SHARE_PRIOR 0.5 /* the weight of "as predicted" (1) in the planned share */

typedef struct gw_pcache {
  gw_pslot slot[GW_CACHE_PROMPTS];
  int n;               /* entries used: the replica's slots, at most GW_CACHE_PROMPTS */
  int agent;           /* its agent keeps scopes apart, per slot (1) or over its whole
                          engine (2): the phone decides each reuse; 0: this gateway does */
  uint64_t scope;      /* every scope sent there since its engine last loaded: this one, */
  int mixed;           /* ...or several (1), or unknown (2: before a restart); 0 and scope
                          0: nothing */
  uint64_t tick;
  int hybrid;          /* its engine reuses only up to context checkpoints (PR_FEAT_CHECKPOINTS):
                          predictions follow the checkpoints and the learned share */
  gw_pshare share[GW_CACHE_SHARES];
  /* kept in step with others by their owners */
  uint64_t logged;     /* what the log last says the engine may hold (cachescope.c) */
  int unshared;        /* sent a request while Redis was away: the other gateways must
                          learn it holds several scopes' prompts (shared.c) */
} gw_pcache;

/* How many prompts to remember (the replica's slots; at most GW_CACHE_PROMPTS). */
void gw_pcache_shape(gw_pcache *c, int slots);
/* The engine loaded its model again: it holds nothing. */
void gw_pcache_reset(gw_pcache *c);
/* What the engine as a whole may hold, from before (the log, cachescope.h): mixed 0 with
 * scope 0: nothing, with a scope: that scope's alone; 1 several; 2 unknown. */
void gw_pcache_restore(gw_pcache *c, uint64_t scope, int mixed);
/* Another gateway (Redis) says: several scopes' prompts (mix), or scope's alone (hold). */
void gw_pcache_mix(gw_pcache *c);
void gw_pcache_hold(gw_pcache *c, uint64_t scope);
/* Whether a request of scope may reuse what the phone cached, as far as this gateway
 * decides: its agent decides (1), or the engine holds only scope's prompts (or none). */
int gw_pcache_may_reuse(const gw_pcache *c, uint64_t scope);
/* A request of scope with these fingerprints went there (reuse: as gw_pcache_may_reuse
 * said, or less): the engine may hold its prompt now. */
void gw_pcache_sent(gw_pcache *c, uint64_t scope, int reuse, const uint64_t *blocks, size_t n);
/* Prompt tokens a request of scope with these fingerprints may find cached (estimate:
 * matching blocks x PR_OAI_BLOCK_CHARS / 4, over its own scope's prompts); 0 where it may
 * not reuse. */
int64_t gw_pcache_cached_tokens(const gw_pcache *c, uint64_t scope, const uint64_t *blocks,
                                size_t n);
/* The same when the leading blocks each slot shares with the prompt are known (common[i] for
 * slot i, pr_oai_common_blocks of its blocks and the prompt's): the planner keeps them from
 * one request to the next. */
int64_t gw_pcache_cached_tokens_common(const gw_pcache *c, uint64_t scope, const size_t *common);

/* The same with the checkpoint model and the learned share when the engine is hybrid
 * (c->hybrid; otherwise exactly gw_pcache_cached_tokens_common): for each remembered slot
 * the newest checkpoint the prompt can use — one inside the leading blocks it shares, or
 * one whose fingerprint says the prompt before it is the same — and of the slots the most,
 * times the share learned for model (gw_pcache_share). */
int64_t gw_pcache_cached_tokens_q(const gw_pcache *c, uint64_t scope, const size_t *common,
                                  const gw_pquery *q, const char *model);
/* Both steps for a prompt whose shared blocks are not known yet. */
int64_t gw_pcache_cached_tokens_pq(const gw_pcache *c, uint64_t scope, const gw_pquery *q,
                                   const char *model);
/* A request went there (as gw_pcache_sent), with what a checkpoint model needs: on a hybrid
 * engine the slot it lands in keeps the checkpoints it reused and those its prompt makes
 * (the start of the last user turn, 516 and 4 tokens before the end), and the engine's
 * eviction (min-step spacing, GW_CACHE_CKPTS at most). */
void gw_pcache_sent_q(gw_pcache *c, uint64_t scope, int reuse, const gw_pquery *q);

/* The share planned on for model: the learned share weighed against GW_CACHE_SHARE_PRIOR of
 * 1 (as predicted); 1 when nothing was learned. */
double gw_pcache_share(const gw_pcache *c, const char *model);
/* An answer of model confirmed `confirmed` of a predicted hit (cache_n / prompt tokens as
 * the engine counts them, over predicted cached / prompt tokens as the gateway estimates
 * them): learned at now_ms. The least recently taught model gives way to a new one. */
void gw_pcache_learn(gw_pcache *c, const char *model, double confirmed, uint64_t now_ms);
/* An answer of model counted `engine` prompt tokens where the gateway estimated `estimate`:
 * the engine's tokens per estimated token, learned the same way (0.1 .. 10). */
void gw_pcache_learn_tokens(gw_pcache *c, const char *model, int64_t engine, int64_t estimate,
                            uint64_t now_ms);
/* The engine's prompt tokens per estimated token for model (1 when nothing was learned). */
double gw_pcache_token_ratio(const gw_pcache *c, const char *model);

#endif
