/* The simulated phone's prompt cache, token by token, as llama-server keeps it: what a
 * slot holds (the tokens it read and decoded), how much of a new prompt it reuses, and
 * for a hybrid model (Qwen3.5: linear-attention layers whose state cannot be cut back)
 * the context checkpoints that reuse stops at, plus the RAM prompt cache that slots are
 * saved to and restored from. Mirrors tools/server/server-context.cpp of llama.cpp
 * b10587 (the August 2026 build in ../shared/engines/llama-server-qwen35/); its README
 * measures the same rules. Pure code: no I/O, no clock. */
#ifndef AG_SIMCACHE_H
#define AG_SIMCACHE_H

#include <stddef.h>
#include <stdint.h>

/* One token. Text prompts are cut into tokens of 4 code points (the characters / 4
 * estimate the gateway uses), each kept whole in its 16 bytes; a token id (a prompt sent
 * as ids, a generated token) has b == AG_SIMTOK_ID, which no UTF-8 text can be. */
typedef struct ag_simtok {
  uint64_t a, b;
} ag_simtok;

#define AG_SIMTOK_ID UINT64_MAX

ag_simtok ag_simtok_id(int64_t id);
/* Tokens of text (4 code points each, the last one shorter) into *out (malloc'd, the
 * caller's) and *n. Returns 0 or -ENOMEM. */
int ag_simtok_text(const char *text, size_t len, ag_simtok **out, size_t *n);
/* Where token positions start: the token index of byte offset off of text (floor). */
size_t ag_simtok_pos(const char *text, size_t off);
/* Longest common prefix of two token runs. */
size_t ag_simtok_lcp(const ag_simtok *a, size_t na, const ag_simtok *b, size_t nb);

typedef enum {
  AG_SIMCACHE_FULL = 0, /* a transformer: any common prefix is reused */
  AG_SIMCACHE_HYBRID,   /* a hybrid model: reuse stops at the newest checkpoint inside it */
} ag_simcache_mode;

/* llama-server's settings that govern reuse (its defaults in brackets). */
typedef struct ag_simcache_params {
  ag_simcache_mode mode;
  int ctx_checkpoints;         /* --ctx-checkpoints [32]: most checkpoints per slot; 0: none */
  int64_t checkpoint_min_step; /* --checkpoint-min-step [8192] */
  int64_t n_batch;             /* -b [2048]: tokens read per batch at most */
  int64_t n_ubatch;            /* -ub [512]: a checkpoint comes 4 + this before the end */
  double slot_similarity;      /* --slot-prompt-similarity [0.1] */
} ag_simcache_params;

void ag_simcache_params_default(ag_simcache_params *p);

/* A context checkpoint: the recurrent state after the first n_tokens tokens, saved by
 * the task `task` (position n_tokens - 1). */
typedef struct ag_simcp {
  int64_t n_tokens;
  uint64_t task;
} ag_simcp;

/* What a slot (or an entry of the RAM cache) holds. Arrays owned; zeroed is empty. */
typedef struct ag_simslot {
  ag_simtok *tok;
  size_t n, cap;
  ag_simcp *cp;
  size_t ncp, cpcap;
} ag_simslot;

void ag_simslot_free(ag_simslot *s);
/* Empty it (memory kept). */
void ag_simslot_clear(ag_simslot *s);
/* Append one token that was read or decoded. Returns 0 or -ENOMEM. */
int ag_simslot_push(ag_simslot *s, ag_simtok t);

/* A prompt as the cache sees it: its tokens and where user messages start (ascending
 * token positions; the chat template's message delimiters found in the prompt). */
typedef struct ag_simprompt {
  const ag_simtok *tok;
  size_t n;
  const size_t *user_starts;
  size_t n_user;
} ag_simprompt;

/* A task starts on slot s: how many of p's tokens come from the cache (cache_n); s is
 * left holding just those, its checkpoints past them erased. cache_prompt 0 reuses
 * nothing (the request's "cache_prompt": false). At least one token is always read. */
int64_t ag_simcache_begin(ag_simslot *s, const ag_simprompt *p, int cache_prompt,
                          const ag_simcache_params *par);
/* Read the rest of p into s in llama-server's batches, creating the checkpoints it
 * creates (hybrid mode) on behalf of `task`. Returns 0 or -ENOMEM. */
int ag_simcache_prefill(ag_simslot *s, const ag_simprompt *p, uint64_t task,
                        const ag_simcache_params *par);

/* llama-server's RAM prompt cache (--cache-ram): slots saved whole (tokens and
 * checkpoints), at most limit_tokens tokens in all, oldest dropped first. */
typedef struct ag_simram {
  ag_simslot *e;  /* entries, oldest first; owned */
  size_t n, cap;
  int64_t limit_tokens; /* 0: the cache is off */
} ag_simram;

void ag_simram_free(ag_simram *r);
/* The slot chosen for p is about to be reused (llama-server picked it as least
 * recently used, or it would keep less than half of what it holds): save s in r, then
 * put in s the entry that shares the most with p, if one keeps at least a quarter of
 * itself and beats what s holds. Returns 1 when an entry was restored, 0 when not, or
 * -ENOMEM. */
int ag_simram_swap(ag_simram *r, ag_simslot *s, const ag_simprompt *p);

/* Whether the slot that llama-server's chooser picked for p must go through the RAM
 * cache: `by_lru` (no slot was similar enough), or it keeps less than half of what it
 * holds (f_keep < 0.5), which for a slot pinned with id_slot holding something unlike
 * p is always so. An empty pinned slot never does. */
int ag_simcache_wants_ram(const ag_simslot *s, const ag_simprompt *p, int pinned, int by_lru,
                          const ag_simcache_params *par);

#endif
