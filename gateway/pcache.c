/* A replica's prompt cache as the gateway models it; see pcache.h. */
#include "pcache.h"

#include <math.h>
#include <stdio.h>
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
    c->slot[i].n_ck = 0;
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
    if (c->slot[i].scope != scope) c->slot[i].n_blocks = 0, c->slot[i].n_ck = 0;
}

static int alone(const gw_pcache *c, uint64_t scope) {
  return !c->mixed && (c->scope == 0 || c->scope == scope);
}

int gw_pcache_may_reuse(const gw_pcache *c, uint64_t scope) { return c->agent || alone(c, scope); }

/* The slot a prompt lands in: llama-server reuses the slot whose prompt is most similar,
 * if at least half of this one matches (--slot-prompt-similarity, 0.5 by default), else its
 * least recently used slot: the entry that shares most with this prompt, when that much,
 * else the oldest (an agent that names slots chooses much the same way, within a scope). */
static int choose(const gw_pcache *c, uint64_t scope, const uint64_t *blocks, size_t n) {
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
  return best;
}

/* Whether a request is remembered at all; the scope bookkeeping of every request sent. */
static int remembered(gw_pcache *c, uint64_t scope, int reuse, size_t n) {
  /* every scope sent there, whoever decides: what the engine as a whole may hold */
  if (!c->mixed && c->scope == 0) c->scope = scope;
  else if (!c->mixed && c->scope != scope) gw_pcache_mix(c);
  return !((!reuse && !c->agent) || n == 0 || c->n < 1); /* nobody reuses it: nothing to remember */
}

static void put(gw_pslot *s, gw_pcache *c, uint64_t scope, const uint64_t *blocks, size_t n) {
  if (s->scope != scope) s->n_ck = 0;
  s->scope = scope;
  memcpy(s->blocks, blocks, n * sizeof(*blocks));
  s->n_blocks = n;
  s->used = ++c->tick;
}

void gw_pcache_sent(gw_pcache *c, uint64_t scope, int reuse, const uint64_t *blocks, size_t n) {
  if (!remembered(c, scope, reuse, n)) return;
  if (n > GW_CACHE_BLOCKS) n = GW_CACHE_BLOCKS;
  put(&c->slot[choose(c, scope, blocks, n)], c, scope, blocks, n);
}

/* ---- context checkpoints (hybrid engines) ---------------------------------------------- */

/* Where a checkpoint is, in estimated tokens, at the engine's tokens per estimated token. */
static int64_t ck_at(const gw_pckpt *k, double ratio) {
  if (!k->tail) return k->at;
  int64_t back = llround((double)k->tail / ratio);
  return k->end - (back < 1 ? 1 : back);
}

/* The newest checkpoint of s that q can restore (server-context.cpp: the common prefix, then
 * the newest checkpoint inside it that leaves a token to read): inside the `common` leading
 * blocks s shares with q, or fingerprinted as the same prompt before it. 0: none. */
static int64_t slot_ckpt(const gw_pslot *s, size_t common, const gw_pquery *q, double ratio) {
  int64_t lcp = (int64_t)(common * PR_OAI_BLOCK_CHARS / 4), best = 0;
  for (int i = 0; i < s->n_ck; i++) {
    const gw_pckpt *k = &s->ck[i];
    int64_t at = ck_at(k, ratio);
    int same = k->fp && (k->fp == q->user_fp || k->fp == q->full_fp);
    if ((same || at <= lcp) && at < q->prompt_tokens && at > best) best = at;
  }
  return best;
}

/* create_checkpoint(): first the checkpoints of other requests that lie within the min-step
 * of an earlier one go, then the oldest while the slot is full. */
static void ckpt_create(gw_pslot *s, gw_pckpt ck, int64_t step, double ratio) {
  int64_t last = -1;
  for (int i = 0; i < s->n_ck;) {
    int64_t at = ck_at(&s->ck[i], ratio);
    if (s->ck[i].task != ck.task && last >= 0 && at <= last + step) {
      memmove(&s->ck[i], &s->ck[i + 1], (size_t)(s->n_ck - i - 1) * sizeof(*s->ck));
      s->n_ck--;
      continue;
    }
    last = at;
    i++;
  }
  if (s->n_ck == GW_CACHE_CKPTS) {
    memmove(&s->ck[0], &s->ck[1], (size_t)(s->n_ck - 1) * sizeof(*s->ck));
    s->n_ck--;
  }
  s->ck[s->n_ck++] = ck;
}

/* The prompt is read from `from` on, in batches cut where checkpoints go (the last user
 * turn, 516 and 4 before the end, else every GW_CKPT_N_BATCH); a checkpoint is made at the
 * start of a batch (past 0) that begins the last user turn or ends near the prompt's end, as
 * server-context.cpp does (docs/sim.md "Prompt cache" has the same rules for the sim). */
static void ckpt_read(gw_pslot *s, int64_t from, const gw_pquery *q, uint64_t task, double ratio) {
  /* the engine's counts, in the gateway's estimated tokens */
  int64_t far = llround(GW_CKPT_TAIL_FAR / ratio), nearby = llround(GW_CKPT_TAIL_NEAR / ratio);
  int64_t batch = llround(GW_CKPT_N_BATCH / ratio), near_n = llround(GW_CKPT_NEAR / ratio);
  int64_t step = llround(GW_CKPT_MIN_STEP / ratio);
  if (nearby < 1) nearby = 1;
  if (batch < 1) batch = 1;
  int64_t n = q->prompt_tokens;
  int64_t cuts[3] = {q->user_at, n - far, n - nearby};
  for (int64_t start = from; start < n;) {
    int64_t end = start + batch < n ? start + batch : n;
    for (int i = 0; i < 3; i++)
      if (cuts[i] > start && cuts[i] < end) end = cuts[i];
    int near = n < end + near_n, user = start == q->user_at;
    int make = start > 0 && (user || near);
    if (make && s->n_ck > 0 && !user && !near && start <= ck_at(&s->ck[s->n_ck - 1], ratio) + step)
      make = 0;
    if (make) {
      gw_pckpt ck = {.at = start, .task = task};
      if (user) ck.fp = q->user_fp;
      else if (start == n - nearby) ck.fp = q->full_fp, ck.end = n, ck.tail = GW_CKPT_TAIL_NEAR;
      else if (start == n - far) ck.end = n, ck.tail = GW_CKPT_TAIL_FAR;
      ckpt_create(s, ck, step, ratio);
    }
    start = end;
  }
}

void gw_pcache_sent_q(gw_pcache *c, uint64_t scope, int reuse, const gw_pquery *q) {
  size_t n = q->n_blocks;
  if (!remembered(c, scope, reuse, n)) return;
  if (n > GW_CACHE_BLOCKS) n = GW_CACHE_BLOCKS;
  gw_pslot *s = &c->slot[choose(c, scope, q->blocks, n)];
  int64_t from = 0;
  double ratio = gw_pcache_token_ratio(c, q->model);
  if (c->hybrid) {
    if (s->scope == scope && reuse)
      from = slot_ckpt(s, pr_oai_common_blocks(s->blocks, s->n_blocks, q->blocks, n), q, ratio);
    else
      s->n_ck = 0;
  }
  put(s, c, scope, q->blocks, n);
  if (!c->hybrid) return;
  /* the checkpoints past the one restored are erased; the prompt's own are made */
  int k = 0;
  for (int i = 0; i < s->n_ck; i++)
    if (ck_at(&s->ck[i], ratio) <= from) s->ck[k++] = s->ck[i];
  s->n_ck = k;
  ckpt_read(s, from, q, c->tick, ratio);
}

int64_t gw_pcache_cached_tokens_q(const gw_pcache *c, uint64_t scope, const size_t *common,
                                  const gw_pquery *q, const char *model) {
  if (!c->hybrid) return gw_pcache_cached_tokens_common(c, scope, common);
  if (!gw_pcache_may_reuse(c, scope)) return 0;
  int64_t best = 0;
  double ratio = gw_pcache_token_ratio(c, model);
  /* a slot that does not share the prompt's first block counts nothing, although the engine
     may restore a checkpoint inside it (a system prompt shorter than a block, at most
     PR_OAI_BLOCK_CHARS / 4 tokens): too little to plan on, and the planner's search finds
     the phones holding cached tokens for a prompt by its first block (scheduler.c
     cache_phones), where a walk of every phone must find the same */
  for (int i = 0; i < c->n; i++) {
    int64_t k = c->slot[i].scope == scope && common[i] > 0 ? slot_ckpt(&c->slot[i], common[i], q, ratio) : 0;
    if (k > best) best = k;
  }
  return (int64_t)llround((double)best * gw_pcache_share(c, model));
}

int64_t gw_pcache_cached_tokens_pq(const gw_pcache *c, uint64_t scope, const gw_pquery *q,
                                   const char *model) {
  if (!c->hybrid) return gw_pcache_cached_tokens(c, scope, q->blocks, q->n_blocks);
  size_t common[GW_CACHE_PROMPTS] = {0};
  for (int i = 0; i < c->n; i++)
    common[i] = pr_oai_common_blocks(c->slot[i].blocks, c->slot[i].n_blocks, q->blocks, q->n_blocks);
  return gw_pcache_cached_tokens_q(c, scope, common, q, model);
}

/* ---- the learned share --------------------------------------------------------------- */

static const gw_pshare *share_find(const gw_pcache *c, const char *model) {
  for (int i = 0; i < GW_CACHE_SHARES; i++)
    if (c->share[i].model[0] && model && strncmp(c->share[i].model, model, sizeof(c->share[i].model) - 1) == 0)
      return &c->share[i];
  return NULL;
}

double gw_pcache_share(const gw_pcache *c, const char *model) {
  const gw_pshare *s = share_find(c, model);
  if (!s || !(s->weight > 0)) return 1.0;
  return (s->share * s->weight + GW_CACHE_SHARE_PRIOR) / (s->weight + GW_CACHE_SHARE_PRIOR);
}

static gw_pshare *share_take(gw_pcache *c, const char *model) {
  gw_pshare *s = (gw_pshare *)share_find(c, model);
  if (s) return s;
  s = &c->share[0];
  for (int i = 0; i < GW_CACHE_SHARES; i++) {
    if (!c->share[i].model[0]) {
      s = &c->share[i];
      break;
    }
    if (c->share[i].at_ms < s->at_ms) s = &c->share[i];
  }
  memset(s, 0, sizeof(*s));
  snprintf(s->model, sizeof(s->model), "%s", model);
  return s;
}

/* A weighted mean whose weight halves every GW_CACHE_SHARE_HALF_S and is capped. */
static void mean_add(double *mean, double *weight, double v, uint64_t at_ms, uint64_t now_ms) {
  if (now_ms > at_ms) *weight *= exp2(-(double)(now_ms - at_ms) / 1000.0 / GW_CACHE_SHARE_HALF_S);
  *mean = (*mean * *weight + v) / (*weight + 1);
  *weight += 1;
  if (*weight > GW_CACHE_SHARE_WEIGHT) *weight = GW_CACHE_SHARE_WEIGHT;
}

void gw_pcache_learn(gw_pcache *c, const char *model, double confirmed, uint64_t now_ms) {
  if (!model || !model[0] || !isfinite(confirmed)) return;
  if (confirmed < 0) confirmed = 0;
  if (confirmed > GW_CACHE_SHARE_MAX) confirmed = GW_CACHE_SHARE_MAX;
  gw_pshare *s = share_take(c, model);
  mean_add(&s->share, &s->weight, confirmed, s->at_ms, now_ms);
  if (now_ms > s->at_ms) s->at_ms = now_ms;
}

void gw_pcache_learn_tokens(gw_pcache *c, const char *model, int64_t engine, int64_t estimate,
                            uint64_t now_ms) {
  if (!model || !model[0] || engine <= 0 || estimate <= 0) return;
  double r = (double)engine / (double)estimate;
  if (r < 0.1) r = 0.1;
  if (r > 10) r = 10;
  gw_pshare *s = share_take(c, model);
  mean_add(&s->ratio, &s->rweight, r, s->at_ms, now_ms);
  if (now_ms > s->at_ms) s->at_ms = now_ms;
}

double gw_pcache_token_ratio(const gw_pcache *c, const char *model) {
  const gw_pshare *s = share_find(c, model);
  return s && s->rweight > 0 && s->ratio > 0 ? s->ratio : 1.0;
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
