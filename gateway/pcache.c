/* A replica's prompt cache as the gateway models it; see pcache.h. */
#include "pcache.h"

#include <string.h>

#include "oai.h"

void gw_pcache_shape(gw_pcache *c, int slots) {
  int n = slots < 1 ? 1 : slots > GW_CACHE_PROMPTS ? GW_CACHE_PROMPTS : slots;
  for (int i = n; i < c->n; i++) c->slot[i].n_blocks = 0;
  c->n = n;
}

static void forget(gw_pcache *c) {
  for (int i = 0; i < GW_CACHE_PROMPTS; i++) {
    c->slot[i].n_blocks = 0;
    c->slot[i].scope = 0;
  }
}

void gw_pcache_reset(gw_pcache *c) {
  c->scope = 0;
  c->mixed = 0;
  forget(c);
}

void gw_pcache_restore(gw_pcache *c, uint64_t scope, int mixed) {
  c->scope = mixed ? 0 : scope;
  c->mixed = mixed;
  forget(c);
}

void gw_pcache_mix(gw_pcache *c) {
  if (c->mixed == 1) return;
  c->mixed = 1;
  c->scope = 0;
  if (!c->agent) forget(c); /* nobody reuses them now */
}

void gw_pcache_hold(gw_pcache *c, uint64_t scope) {
  if (!c->mixed && c->scope == scope) return;
  c->mixed = 0;
  c->scope = scope;
  for (int i = 0; i < GW_CACHE_PROMPTS; i++)
    if (c->slot[i].scope != scope) c->slot[i].n_blocks = 0;
}

static int alone(const gw_pcache *c, uint64_t scope) {
  return !c->mixed && (c->scope == 0 || c->scope == scope);
}

int gw_pcache_may_reuse(const gw_pcache *c, uint64_t scope) { return c->agent || alone(c, scope); }

void gw_pcache_sent(gw_pcache *c, uint64_t scope, int reuse, const uint64_t *blocks, size_t n) {
  /* every scope sent there, whoever decides: what the engine as a whole may hold */
  if (!c->mixed && c->scope == 0) c->scope = scope;
  else if (!c->mixed && c->scope != scope) gw_pcache_mix(c);
  if ((!reuse && !c->agent) || n == 0 || c->n < 1) return; /* nobody reuses it: nothing to remember */
  /* llama-server reuses the slot whose prompt is most similar, if at least half of this
   * one matches (--slot-prompt-similarity, 0.5 by default), else its least recently used
   * slot: replace the entry that shares most with this prompt, when that much, else the
   * oldest (an agent that names slots chooses much the same way, within a scope) */
  if (n > GW_CACHE_BLOCKS) n = GW_CACHE_BLOCKS;
  int best = 0;
  size_t best_common = 0;
  for (int i = 0; i < c->n; i++) {
    const gw_pslot *s = &c->slot[i];
    size_t k = s->scope == scope ? pr_oai_common_blocks(s->blocks, s->n_blocks, blocks, n) : 0;
    if (k > best_common) {
      best_common = k;
      best = i;
    }
  }
  if (best_common * 2 < n) {
    best = 0;
    for (int i = 1; i < c->n; i++)
      if (c->slot[i].used < c->slot[best].used) best = i;
  }
  gw_pslot *s = &c->slot[best];
  s->scope = scope;
  memcpy(s->blocks, blocks, n * sizeof(*blocks));
  s->n_blocks = n;
  s->used = ++c->tick;
}

int64_t gw_pcache_cached_tokens(const gw_pcache *c, uint64_t scope, const uint64_t *blocks,
                                size_t n) {
  if (!gw_pcache_may_reuse(c, scope)) return 0;
  size_t best = 0;
  for (int i = 0; i < c->n; i++) {
    const gw_pslot *s = &c->slot[i];
    size_t k = s->scope == scope ? pr_oai_common_blocks(s->blocks, s->n_blocks, blocks, n) : 0;
    if (k > best) best = k;
  }
  return (int64_t)(best * PR_OAI_BLOCK_CHARS / 4);
}

int64_t gw_pcache_cached_tokens_common(const gw_pcache *c, uint64_t scope, const size_t *common) {
  if (!gw_pcache_may_reuse(c, scope)) return 0;
  size_t best = 0;
  for (int i = 0; i < c->n; i++) {
    size_t k = c->slot[i].scope == scope ? common[i] : 0;
    if (k > best) best = k;
  }
  return (int64_t)(best * PR_OAI_BLOCK_CHARS / 4);
}
