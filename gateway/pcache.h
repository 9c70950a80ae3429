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

/* One prompt remembered. */
typedef struct gw_pslot {
  uint64_t scope;      /* whose prompt (the cache scope); 0: none */
  uint64_t blocks[GW_CACHE_BLOCKS];
  size_t n_blocks;
  uint64_t used;       /* when it was last sent (the cache's own counter) */
} gw_pslot;

typedef struct gw_pcache {
  gw_pslot slot[GW_CACHE_PROMPTS];
  int n;               /* entries used: the replica's slots, at most GW_CACHE_PROMPTS */
  int agent;           /* its agent keeps scopes apart, per slot (1) or over its whole
                          engine (2): the phone decides each reuse; 0: this gateway does */
  uint64_t scope;      /* every scope sent there since its engine last loaded: this one, */
  int mixed;           /* ...or several (1), or unknown (2: before a restart); 0 and scope
                          0: nothing */
  uint64_t tick;
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

#endif
