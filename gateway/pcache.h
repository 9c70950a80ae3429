/* A replica's prompt cache as the gateway models it: what its engine's slots hold (each
 * prompt's fingerprints and length, and whose it was), so that plans can count the tokens a
 * request will find cached, and so that no request reuses what another cache scope left
 * on the phone (docs/security.md "Tenants' prompts", docs/routing.md "Prefix cache").
 *
 * Two ways to know. A llama-server (or the sim) whose slot count is known takes each
 * request on the slot the gateway names ("id_slot": pinned): the gateway then knows what
 * every slot holds and whose it is, and a request may reuse a slot's prefix only when the
 * slot holds its own scope's prompt (or nothing) and keeps at least GW_PCACHE_KEEP of it
 * (llama-server b10587 consults its RAM cache of every earlier prompt when a pinned slot
 * would lose more than half of what it holds). Any other engine chooses its slot itself,
 * so the whole engine counts: a request may reuse only while every prompt sent there since
 * it last loaded its model was its scope's; the slots' memory then only estimates what is
 * cached, as llama-server chooses (--slot-prompt-similarity). A request that may not reuse
 * is sent with "cache_prompt": false. Pure: no I/O, no clock. */
#ifndef GW_PCACHE_H
#define GW_PCACHE_H

#include <stddef.h>
#include <stdint.h>

#define GW_CACHE_PROMPTS 4   /* prompts remembered when the engine picks its slots */
#define GW_CACHE_BLOCKS 128  /* blocks of each prompt remembered (PR_OAI_BLOCK_CHARS characters) */
#define GW_PCACHE_KEEP 0.75  /* a pinned slot is reused only when the prompt keeps this share
                                of what it holds (the engine's own bound is a half) */
#define GW_PCACHE_ANSWER_CHARS 6 /* characters counted per answer token a slot holds (a
                                    generous 4: the bound above must not be passed) */

/* What one slot holds. */
typedef struct gw_pslot {
  uint64_t scope;      /* whose prompt (the cache scope); 0: none */
  int foreign;         /* it may hold a prompt sent before the gateway knew (a restart):
                          reused by nobody until a request of the gateway's rewrites it */
  int busy;            /* pinned: a request holds it */
  uint64_t blocks[GW_CACHE_BLOCKS];
  size_t n_blocks;
  int64_t chars;       /* what it holds, in characters: the prompt, then the answer */
  uint64_t used;       /* when it was last given a prompt (the cache's own counter) */
} gw_pslot;

typedef struct gw_pcache {
  gw_pslot *slot;      /* owned, n long */
  int n;
  int pinned;          /* requests name their slot */
  uint64_t scope;      /* every scope sent there since the engine last loaded: this one, */
  int mixed;           /* ...or several (1), or unknown (2: before a restart); 0 and scope
                          0: nothing */
  uint64_t tick;
  /* kept in step with others by their owners */
  uint64_t logged;     /* what the log last says the engine may hold (cachescope.c) */
  int reset_pending;   /* the engine loaded again: Redis must forget what it held (shared.c) */
  int unshared;        /* sent a request while Redis was away: the other gateways must learn
                          it holds several scopes' prompts (shared.c) */
} gw_pcache;

/* Where a request goes and what it may reuse (gw_pcache_pick). */
typedef struct gw_pcache_pick {
  int slot;            /* the engine slot to name; -1: the engine chooses */
  int reuse;           /* it may reuse the cache; 0: "cache_prompt": false */
} gw_pcache_pick;

/* Size it: n slots named by the gateway (pinned), or the engine's choice with
 * min(n, GW_CACHE_PROMPTS) prompts remembered. A slot it did not track before holds what
 * the engine as a whole may hold. Returns 0 or -ENOMEM (then it is left as it was). */
int gw_pcache_shape(gw_pcache *c, int pinned, int n);
void gw_pcache_free(gw_pcache *c);
/* The engine loaded its model again: it holds nothing. */
void gw_pcache_reset(gw_pcache *c);
/* What the engine as a whole may hold, from before (the log, cachescope.h): mixed 0 with
 * scope 0: nothing, with a scope: that scope's alone; 1 several; 2 unknown. */
void gw_pcache_restore(gw_pcache *c, uint64_t scope, int mixed);
/* Another gateway (Redis) says: several scopes' prompts (mix), or scope's alone (hold). */
void gw_pcache_mix(gw_pcache *c);
void gw_pcache_hold(gw_pcache *c, uint64_t scope);
/* Whether the engine as a whole holds only scope's prompts (or none). */
int gw_pcache_alone(const gw_pcache *c, uint64_t scope);
/* The slot and the reuse for a request of scope with these fingerprints, of chars
 * characters: pinned, the free slot that serves it best (its own scope's with the longest
 * prefix that keeps enough, then an empty one, then its own scope's, then another's, the
 * least recently used first); -1 when none is free. */
gw_pcache_pick gw_pcache_choose(const gw_pcache *c, uint64_t scope, const uint64_t *blocks,
                                size_t n);
/* The request went out as picked: the slot (or the engine) holds its prompt now. */
void gw_pcache_sent(gw_pcache *c, gw_pcache_pick p, uint64_t scope, const uint64_t *blocks,
                    size_t n, int64_t chars);
/* The request on slot ended having had answer_tokens generated: the slot is free and
 * holds them too. */
void gw_pcache_done(gw_pcache *c, int slot, int64_t answer_tokens);
/* Prompt tokens a request of scope with these fingerprints may find cached (estimate:
 * matching blocks x PR_OAI_BLOCK_CHARS / 4); 0 where it may not reuse. */
int64_t gw_pcache_cached_tokens(const gw_pcache *c, uint64_t scope, const uint64_t *blocks,
                                size_t n);
/* The same when the leading blocks each slot shares with the prompt are known (common[i] for
 * slot i, pr_oai_common_blocks of its blocks and the prompt's): the planner keeps them from
 * one request to the next. */
int64_t gw_pcache_cached_tokens_common(const gw_pcache *c, uint64_t scope, const size_t *common);

#endif
