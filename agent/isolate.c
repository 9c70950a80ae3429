/* Callers kept apart on this phone's prompt cache; see isolate.h. */
#include "isolate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "oai.h"

int ag_iso_init(ag_iso *s, ag_iso_mode mode, int n, int known) {
  ag_iso_free(s);
  s->mode = mode;
  s->mixed = known ? 0 : 2;
  if (mode != AG_ISO_SLOTS) return 0;
  if (n < 1) n = 1;
  s->slot = calloc((size_t)n, sizeof(*s->slot));
  if (!s->slot) {
    s->mode = AG_ISO_ENGINE; /* without its table, the whole engine counts */
    return -ENOMEM;
  }
  s->n = n;
  for (int i = 0; i < n; i++) s->slot[i].unknown = !known;
  return 0;
}

void ag_iso_free(ag_iso *s) {
  free(s->slot);
  memset(s, 0, sizeof(*s));
}

uint64_t ag_iso_scope_of(const char *h) {
  if (!h || strlen(h) != 16) return AG_ISO_NO_SCOPE;
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char c = h[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return AG_ISO_NO_SCOPE;
    v = v << 4 | (uint64_t)d;
  }
  return v ? v : AG_ISO_NO_SCOPE;
}

const char *ag_iso_mode_name(ag_iso_mode m) { return m == AG_ISO_SLOTS ? "slots" : "engine"; }

ag_iso_pick ag_iso_start(ag_iso *s, uint64_t scope, const uint64_t *blocks, size_t n) {
  ag_iso_pick p = {-1, 0};
  if (s->mode != AG_ISO_SLOTS) {
    p.reuse = !s->mixed && (s->scope == 0 || s->scope == scope);
    /* every prompt sent counts, answered or not: the engine may keep it */
    if (!p.reuse) s->mixed = s->mixed ? s->mixed : 1;
    else s->scope = scope;
    return p;
  }
  /* rank: 3 + shared blocks (its own), 2 empty, 1 unknown, 0 another's; busy last */
  double best = -1;
  for (int i = 0; i < s->n; i++) {
    const ag_iso_slot *t = &s->slot[i];
    double rank;
    if (t->unknown) rank = 1;
    else if (t->scope == 0) rank = 2;
    else if (t->scope == scope) rank = 3 + (double)pr_oai_common_blocks(t->blocks, t->n_blocks, blocks, n);
    else rank = 0;
    if (t->busy) rank = -1.0 / (1 + t->busy); /* the engine waits for it: the least busy */
    if (p.slot < 0 || rank > best || (rank == best && t->used < s->slot[p.slot].used)) {
      best = rank;
      p.slot = i;
    }
  }
  ag_iso_slot *t = &s->slot[p.slot];
  p.reuse = best >= 2;
  t->busy++;
  t->used = ++s->tick;
  /* until the engine answers, nobody may count on what it holds */
  if (!p.reuse) {
    t->unknown = 1;
    t->scope = 0;
  }
  return p;
}

void ag_iso_end(ag_iso *s, ag_iso_pick p, uint64_t scope, const uint64_t *blocks, size_t n,
                int read) {
  if (s->mode != AG_ISO_SLOTS || p.slot < 0 || p.slot >= s->n) return;
  ag_iso_slot *t = &s->slot[p.slot];
  if (t->busy > 0) t->busy--;
  if (!read) {
    /* refused, failed or cut off before the engine answered: the slot may hold what it
     * held, or part of this: anyone's */
    t->unknown = 1;
    t->scope = 0;
    t->n_blocks = 0;
    return;
  }
  if (t->busy > 0) return; /* a request named to it after this one decides what it holds */
  if (n > AG_ISO_BLOCKS) n = AG_ISO_BLOCKS;
  t->unknown = 0;
  t->scope = scope;
  if (n) memcpy(t->blocks, blocks, n * sizeof(*blocks));
  t->n_blocks = n;
}
