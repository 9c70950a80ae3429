/* A replica's prompt cache as the gateway models it; see pcache.h. */
#include "pcache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "oai.h"

/* A slot that holds nothing the gateway does not know of: what the engine as a whole may
 * hold, for a slot the gateway starts to track. */
static void slot_as_engine(const gw_pcache *c, gw_pslot *s) {
  memset(s, 0, sizeof(*s));
  if (c->mixed) s->foreign = 1;
  else s->scope = c->scope;
}

int gw_pcache_shape(gw_pcache *c, int pinned, int n) {
  if (!pinned && n > GW_CACHE_PROMPTS) n = GW_CACHE_PROMPTS;
  if (n < 1) n = 1;
  if (c->slot && c->n == n && c->pinned == pinned) return 0;
  gw_pslot *s = calloc((size_t)n, sizeof(*s));
  if (!s) return -ENOMEM;
  for (int i = 0; i < n; i++) {
    /* the same mode keeps what its slots held; a change of mode keeps only what the engine
     * as a whole may hold (a slot named before is not the engine's choice now) */
    if (c->slot && c->pinned == pinned && i < c->n) {
      s[i] = c->slot[i];
      s[i].busy = 0;
    } else {
      slot_as_engine(c, &s[i]);
    }
  }
  free(c->slot);
  c->slot = s;
  c->n = n;
  c->pinned = pinned;
  return 0;
}

void gw_pcache_free(gw_pcache *c) {
  free(c->slot);
  memset(c, 0, sizeof(*c));
}

void gw_pcache_reset(gw_pcache *c) {
  c->scope = 0;
  c->mixed = 0;
  for (int i = 0; i < c->n; i++) {
    int busy = c->slot[i].busy;
    slot_as_engine(c, &c->slot[i]);
    c->slot[i].busy = busy;
  }
}

void gw_pcache_restore(gw_pcache *c, uint64_t scope, int mixed) {
  c->scope = mixed ? 0 : scope;
  c->mixed = mixed;
  for (int i = 0; i < c->n; i++) slot_as_engine(c, &c->slot[i]);
}

void gw_pcache_mix(gw_pcache *c) {
  if (c->mixed == 1) return;
  c->mixed = 1;
  c->scope = 0;
  if (!c->pinned)
    for (int i = 0; i < c->n; i++) slot_as_engine(c, &c->slot[i]); /* nobody reuses them now */
}

void gw_pcache_hold(gw_pcache *c, uint64_t scope) {
  if (!c->mixed && c->scope == scope) return;
  c->mixed = 0;
  c->scope = scope;
  for (int i = 0; i < c->n; i++)
    if (c->slot[i].foreign || c->slot[i].scope != scope) slot_as_engine(c, &c->slot[i]);
}

int gw_pcache_alone(const gw_pcache *c, uint64_t scope) {
  return !c->mixed && (c->scope == 0 || c->scope == scope);
}

/* Whether a prompt sharing `common` blocks with what s holds keeps enough of it. */
static int keeps(const gw_pslot *s, size_t common) {
  if (s->chars <= 0) return 1;
  return (double)common * PR_OAI_BLOCK_CHARS >= GW_PCACHE_KEEP * (double)s->chars;
}

/* The blocks of s a prompt of scope may reuse: 0 unless s is its scope's and the prompt
 * keeps enough of it. */
static size_t reusable(const gw_pslot *s, uint64_t scope, const uint64_t *blocks, size_t n) {
  if (s->foreign || s->scope != scope) return 0;
  size_t common = pr_oai_common_blocks(s->blocks, s->n_blocks, blocks, n);
  return keeps(s, common) ? common : 0;
}

gw_pcache_pick gw_pcache_choose(const gw_pcache *c, uint64_t scope, const uint64_t *blocks,
                                size_t n) {
  gw_pcache_pick p = {-1, gw_pcache_alone(c, scope)};
  if (!c->pinned) return p;
  /* rank: 3 + reusable blocks (its own, kept), 2 empty, 1 its own rewritten, 0 another's */
  double best = -1;
  uint64_t best_used = 0;
  for (int i = 0; i < c->n; i++) {
    const gw_pslot *s = &c->slot[i];
    if (s->busy) continue;
    double rank;
    int mine = !s->foreign && s->scope == scope;
    if (mine) {
      size_t common = pr_oai_common_blocks(s->blocks, s->n_blocks, blocks, n);
      rank = keeps(s, common) ? 3.0 + (double)common : 1.0;
    } else {
      rank = !s->foreign && s->scope == 0 ? 2.0 : 0.0;
    }
    if (rank > best || (rank == best && s->used < best_used)) {
      best = rank;
      best_used = s->used;
      p.slot = i;
    }
  }
  p.reuse = best >= 2.0;
  return p;
}

/* Every scope sent to the engine since it last loaded. */
static void engine_add(gw_pcache *c, uint64_t scope) {
  if (c->mixed) return;
  if (c->scope == 0) c->scope = scope;
  else if (c->scope != scope) gw_pcache_mix(c);
}

static void slot_fill(gw_pcache *c, gw_pslot *s, uint64_t scope, const uint64_t *blocks, size_t n,
                      int64_t chars) {
  if (n > GW_CACHE_BLOCKS) n = GW_CACHE_BLOCKS;
  s->scope = scope;
  s->foreign = 0;
  if (n) memcpy(s->blocks, blocks, n * sizeof(*blocks)); /* a prompt under one block has none */
  s->n_blocks = n;
  s->chars = chars > 0 ? chars : 0;
  s->used = ++c->tick;
}

void gw_pcache_sent(gw_pcache *c, gw_pcache_pick p, uint64_t scope, const uint64_t *blocks,
                    size_t n, int64_t chars) {
  int was_alone = gw_pcache_alone(c, scope);
  engine_add(c, scope);
  if (c->pinned && p.slot >= 0 && p.slot < c->n) {
    gw_pslot *s = &c->slot[p.slot];
    s->busy = 1;
    /* sent uncached, it reads the whole prompt: the slot holds this prompt alone */
    slot_fill(c, s, scope, blocks, n, chars);
    return;
  }
  if (c->pinned) {
    /* the engine chose: any slot may hold it now */
    for (int i = 0; i < c->n; i++)
      if (c->slot[i].scope != scope) c->slot[i].foreign = 1;
    return;
  }
  if (!was_alone || n == 0) return; /* nobody reuses what it holds: nothing to remember */
  /* llama-server reuses the slot whose prompt is most similar, if at least half of this
   * one matches (--slot-prompt-similarity, 0.5 by default), else its least recently used
   * slot: replace the entry that shares most with this prompt, when that much, else the
   * oldest. */
  if (n > GW_CACHE_BLOCKS) n = GW_CACHE_BLOCKS;
  int best = 0;
  size_t best_common = 0;
  for (int i = 0; i < c->n; i++) {
    size_t k = pr_oai_common_blocks(c->slot[i].blocks, c->slot[i].n_blocks, blocks, n);
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
  slot_fill(c, &c->slot[best], scope, blocks, n, chars);
}

void gw_pcache_done(gw_pcache *c, int slot, int64_t answer_tokens) {
  if (!c->pinned || slot < 0 || slot >= c->n) return;
  gw_pslot *s = &c->slot[slot];
  s->busy = 0;
  if (answer_tokens > 0) s->chars += answer_tokens * GW_PCACHE_ANSWER_CHARS;
}

int64_t gw_pcache_cached_tokens(const gw_pcache *c, uint64_t scope, const uint64_t *blocks,
                                size_t n) {
  if (!c->pinned && !gw_pcache_alone(c, scope)) return 0;
  size_t best = 0;
  for (int i = 0; i < c->n; i++) {
    size_t k = c->pinned ? reusable(&c->slot[i], scope, blocks, n)
                         : pr_oai_common_blocks(c->slot[i].blocks, c->slot[i].n_blocks, blocks, n);
    if (k > best) best = k;
  }
  return (int64_t)(best * PR_OAI_BLOCK_CHARS / 4);
}
