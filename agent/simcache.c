/* The sim's prompt cache, checkpoints and RAM cache; see simcache.h. The names in the
 * comments are llama-server's (server-context.cpp, server-task.cpp of b10587). */
#include "simcache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- tokens -------------------------------------------------------------------------- */

ag_simtok ag_simtok_id(int64_t id) {
  ag_simtok t = {.a = (uint64_t)id, .b = AG_SIMTOK_ID};
  return t;
}

static int is_lead(unsigned char c) { return (c & 0xC0) != 0x80; }

int ag_simtok_text(const char *text, size_t len, ag_simtok **out, size_t *n) {
  size_t chars = 0, cap;
  for (size_t i = 0; i < len; i++) chars += is_lead((unsigned char)text[i]);
  cap = (chars + 3) / 4;
  *out = NULL;
  *n = 0;
  ag_simtok *t = calloc(cap ? cap : 1, sizeof(*t));
  if (!t) return -ENOMEM;
  size_t k = 0, i = 0;
  while (i < len && k < cap) {
    /* four code points (at most 16 bytes; longer runs of stray bytes are cut) */
    unsigned char bytes[16] = {0};
    size_t nb = 0, cp = 0;
    while (i < len) {
      if (is_lead((unsigned char)text[i])) {
        if (cp == 4) break;
        cp++;
      }
      if (nb < sizeof(bytes)) bytes[nb++] = (unsigned char)text[i];
      i++;
    }
    memcpy(&t[k].a, bytes, 8);
    memcpy(&t[k].b, bytes + 8, 8);
    k++;
  }
  *out = t;
  *n = k;
  return 0;
}

size_t ag_simtok_pos(const char *text, size_t off) {
  size_t chars = 0;
  for (size_t i = 0; i < off; i++) chars += is_lead((unsigned char)text[i]);
  return chars / 4;
}

static int tok_eq(ag_simtok x, ag_simtok y) { return x.a == y.a && x.b == y.b; }

size_t ag_simtok_lcp(const ag_simtok *a, size_t na, const ag_simtok *b, size_t nb) {
  size_t n = na < nb ? na : nb, i = 0;
  while (i < n && tok_eq(a[i], b[i])) i++;
  return i;
}

/* ---- slots ----------------------------------------------------------------------------- */

void ag_simcache_params_default(ag_simcache_params *p) {
  memset(p, 0, sizeof(*p));
  p->mode = AG_SIMCACHE_FULL;
  p->ctx_checkpoints = 32;
  p->checkpoint_min_step = 8192;
  p->n_batch = 2048;
  p->n_ubatch = 512;
  p->slot_similarity = 0.1;
}

void ag_simslot_free(ag_simslot *s) {
  free(s->tok);
  free(s->cp);
  memset(s, 0, sizeof(*s));
}

void ag_simslot_clear(ag_simslot *s) {
  s->n = 0;
  s->ncp = 0;
}

int ag_simslot_push(ag_simslot *s, ag_simtok t) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    ag_simtok *p = realloc(s->tok, cap * sizeof(*p));
    if (!p) return -ENOMEM;
    s->tok = p;
    s->cap = cap;
  }
  s->tok[s->n++] = t;
  return 0;
}

static int slot_reserve(ag_simslot *s, size_t n) {
  if (n <= s->cap) return 0;
  ag_simtok *p = realloc(s->tok, n * sizeof(*p));
  if (!p) return -ENOMEM;
  s->tok = p;
  s->cap = n;
  return 0;
}

static void cp_erase(ag_simslot *s, size_t i) {
  memmove(&s->cp[i], &s->cp[i + 1], (s->ncp - i - 1) * sizeof(*s->cp));
  s->ncp--;
}

static int slot_copy(ag_simslot *dst, const ag_simslot *src) {
  memset(dst, 0, sizeof(*dst));
  if (src->n && !(dst->tok = malloc(src->n * sizeof(*dst->tok)))) return -ENOMEM;
  if (src->ncp && !(dst->cp = malloc(src->ncp * sizeof(*dst->cp)))) {
    ag_simslot_free(dst);
    return -ENOMEM;
  }
  if (src->n) memcpy(dst->tok, src->tok, src->n * sizeof(*dst->tok));
  if (src->ncp) memcpy(dst->cp, src->cp, src->ncp * sizeof(*dst->cp));
  dst->n = dst->cap = src->n;
  dst->ncp = dst->cpcap = src->ncp;
  return 0;
}

/* ---- message spans ----------------------------------------------------------------------- */

static int is_user_start(const ag_simprompt *p, int64_t pos) {
  for (size_t i = 0; i < p->n_user; i++)
    if ((int64_t)p->user_starts[i] == pos) return 1;
  return 0;
}

static int64_t last_user_pos(const ag_simprompt *p) {
  return p->n_user ? (int64_t)p->user_starts[p->n_user - 1] : -1;
}

/* ---- a task's start: what is reused ------------------------------------------------------ */

int64_t ag_simcache_begin(ag_simslot *s, const ag_simprompt *p, int cache_prompt,
                          const ag_simcache_params *par) {
  int64_t n_tok = (int64_t)p->n;
  int64_t slot_n = (int64_t)s->n;
  int64_t n_past = cache_prompt ? (int64_t)ag_simtok_lcp(s->tok, s->n, p->tok, p->n) : 0;
  int64_t pos_next = n_past;
  if (par->mode == AG_SIMCACHE_HYBRID) {
    /* the largest position a checkpoint may have to be of use: one token must be read */
    int64_t thold = pos_next - (n_past < n_tok ? 0 : 1);
    if (thold < 0) thold = 0;
    /* the recurrent state is at the slot's last position: when the prompt extends the
     * slot exactly (thold past it) the state itself is used, no checkpoint needed */
    if (n_past > 0 && n_past <= slot_n && slot_n - 1 >= thold) {
      size_t found = s->ncp;
      for (size_t i = s->ncp; i-- > 0;) { /* newest first */
        int64_t pos = s->cp[i].n_tokens - 1;
        if (pos > pos_next) continue;
        if (pos < thold || pos == 0) {
          found = i;
          break;
        }
      }
      if (found < s->ncp) {
        /* restored: reuse stops where the checkpoint was made */
        int64_t at = s->cp[found].n_tokens;
        if (at < pos_next) pos_next = at;
        n_past = pos_next < at ? pos_next : at;
      } else {
        /* "forcing full prompt re-processing due to lack of cache data" */
        pos_next = 0;
        n_past = 0;
      }
    }
    for (size_t i = 0; i < s->ncp;) {
      if (s->cp[i].n_tokens - 1 > pos_next) cp_erase(s, i);
      else i++;
    }
  }
  if (n_past == n_tok && n_past > 0) n_past--; /* the last token is always read again */
  if ((size_t)n_past < s->n) s->n = (size_t)n_past;
  return n_past;
}

/* create_checkpoint(): evict other tasks' checkpoints within min-step of an earlier
 * one, make room, then keep the state after the first n_tokens tokens. */
static int cp_create(ag_simslot *s, int64_t n_tokens, uint64_t task, const ag_simcache_params *par) {
  int64_t last = -1;
  for (size_t i = 0; i < s->ncp;) {
    if (s->cp[i].task != task && last >= 0 && s->cp[i].n_tokens <= last + par->checkpoint_min_step) {
      cp_erase(s, i);
      continue;
    }
    last = s->cp[i].n_tokens;
    i++;
  }
  while (s->ncp > 0 && s->ncp >= (size_t)par->ctx_checkpoints) cp_erase(s, 0);
  if (s->ncp == s->cpcap) {
    size_t cap = s->cpcap ? s->cpcap * 2 : 8;
    ag_simcp *c = realloc(s->cp, cap * sizeof(*c));
    if (!c) return -ENOMEM;
    s->cp = c;
    s->cpcap = cap;
  }
  s->cp[s->ncp].n_tokens = n_tokens;
  s->cp[s->ncp].task = task;
  s->ncp++;
  return 0;
}

int ag_simcache_prefill(ag_simslot *s, const ag_simprompt *p, uint64_t task,
                        const ag_simcache_params *par) {
  int64_t n_tok = (int64_t)p->n;
  int checkpoints = par->mode == AG_SIMCACHE_HYBRID && par->ctx_checkpoints > 0;
  int64_t last_user = last_user_pos(p);
  int64_t tail1 = par->n_batch < 4 + par->n_ubatch ? par->n_batch : 4 + par->n_ubatch;
  int64_t tail2 = par->n_batch < 4 ? par->n_batch : 4;
  if (slot_reserve(s, p->n) < 0) return -ENOMEM;
  while ((int64_t)s->n < n_tok) {
    int64_t start = (int64_t)s->n, in_batch = 0;
    /* one batch: up to n_batch tokens, cut at the last user message (or one a
     * checkpoint min-step past the last checkpoint) and 4 + n_ubatch and 4 tokens
     * before the end, so that a checkpoint can be made there */
    while ((int64_t)s->n < n_tok && in_batch < par->n_batch) {
      s->tok[s->n] = p->tok[s->n];
      s->n++;
      in_batch++;
      int64_t n = (int64_t)s->n;
      if (checkpoints && is_user_start(p, n) &&
          (n == last_user || s->ncp == 0 || n > s->cp[s->ncp - 1].n_tokens + par->checkpoint_min_step))
        break;
      if (checkpoints && (n_tok == n + tail1 || n_tok == n + tail2)) break;
    }
    if (!checkpoints) continue;
    int64_t n = (int64_t)s->n;
    int near_end = n_tok < n + par->n_ubatch;
    int do_cp = 1;
    if (n != n_tok && !is_user_start(p, start) && !near_end) do_cp = 0; /* mid-prompt */
    if (start == 0) do_cp = 0;                                             /* nothing read yet */
    if (do_cp && s->ncp > 0 && start != last_user && !near_end &&
        !(start > s->cp[s->ncp - 1].n_tokens + par->checkpoint_min_step))
      do_cp = 0; /* too close to the last one */
    /* made before the batch is decoded: the state after `start` tokens */
    if (do_cp && cp_create(s, start, task, par) < 0) return -ENOMEM;
  }
  return 0;
}

/* ---- the RAM cache ---------------------------------------------------------------------- */

void ag_simram_free(ag_simram *r) {
  for (size_t i = 0; i < r->n; i++) ag_simslot_free(&r->e[i]);
  free(r->e);
  r->e = NULL;
  r->n = r->cap = 0;
}

static void ram_erase(ag_simram *r, size_t i) {
  ag_simslot_free(&r->e[i]);
  memmove(&r->e[i], &r->e[i + 1], (r->n - i - 1) * sizeof(*r->e));
  r->n--;
}

static int64_t ram_tokens(const ag_simram *r) {
  int64_t n = 0;
  for (size_t i = 0; i < r->n; i++) n += (int64_t)r->e[i].n;
  return n;
}

/* server_prompt_cache::alloc: a slot already held whole by an entry is not saved
 * again; entries that the slot holds whole are replaced by it. */
static int ram_save(ag_simram *r, const ag_simslot *s) {
  if (s->n == 0 || (int64_t)s->n > r->limit_tokens) return 0;
  for (size_t i = 0; i < r->n; i++)
    if (ag_simtok_lcp(r->e[i].tok, r->e[i].n, s->tok, s->n) == s->n) return 0;
  for (size_t i = 0; i < r->n;) {
    if (ag_simtok_lcp(r->e[i].tok, r->e[i].n, s->tok, s->n) == r->e[i].n) ram_erase(r, i);
    else i++;
  }
  while (r->n > 0 && ram_tokens(r) + (int64_t)s->n > r->limit_tokens) ram_erase(r, 0);
  if (r->n == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 8;
    ag_simslot *e = realloc(r->e, cap * sizeof(*e));
    if (!e) return -ENOMEM;
    r->e = e;
    r->cap = cap;
  }
  int rc = slot_copy(&r->e[r->n], s);
  if (rc == 0) r->n++;
  return rc;
}

/* server_prompt_cache::load: the entry that keeps more of itself and covers more of the
 * prompt than the slot does, ignoring entries that would keep under a quarter. */
static int ram_load(ag_simram *r, ag_simslot *s, const ag_simprompt *p) {
  size_t lcp = ag_simtok_lcp(s->tok, s->n, p->tok, p->n);
  double keep_best = s->n ? (double)lcp / (double)s->n : -1.0;
  double sim_best = p->n ? (double)lcp / (double)p->n : 0.0;
  size_t best = r->n;
  for (size_t i = 0; i < r->n; i++) {
    size_t l = ag_simtok_lcp(r->e[i].tok, r->e[i].n, p->tok, p->n);
    double keep = r->e[i].n ? (double)l / (double)r->e[i].n : 0.0;
    double sim = p->n ? (double)l / (double)p->n : 0.0;
    if (keep < 0.25) continue;
    if (keep_best < keep && sim_best < sim) {
      keep_best = keep;
      sim_best = sim;
      best = i;
    }
  }
  if (best == r->n) return 0;
  ag_simslot_free(s);
  *s = r->e[best];
  memmove(&r->e[best], &r->e[best + 1], (r->n - best - 1) * sizeof(*r->e));
  r->n--;
  return 1;
}

int ag_simram_swap(ag_simram *r, ag_simslot *s, const ag_simprompt *p) {
  if (r->limit_tokens <= 0) return 0;
  int rc = ram_save(r, s);
  if (rc < 0) return rc;
  rc = ram_load(r, s, p);
  while (r->n > 0 && ram_tokens(r) > r->limit_tokens) ram_erase(r, 0);
  return rc;
}

int ag_simcache_wants_ram(const ag_simslot *s, const ag_simprompt *p, int pinned, int by_lru,
                          const ag_simcache_params *par) {
  (void)pinned;
  if (by_lru) return 1;
  if (s->n == 0) return 0; /* f_keep is 0 / 0 */
  size_t lcp = ag_simtok_lcp(s->tok, s->n, p->tok, p->n);
  double sim = p->n ? (double)lcp / (double)p->n : 0.0;
  double kept = sim > par->slot_similarity ? (double)lcp : 0.0;
  return kept / (double)s->n < 0.5;
}
