/* A map from a key (an id, a digest: bytes) to a pointer the caller owns: uthash's table
 * (Debian's uthash-dev) with the keys hashed by pr_hash64 (keyed SipHash, so strangers'
 * ids cannot be made to collide) and compared in constant time. Each entry keeps a copy
 * of its key; values are borrowed. Lookups, insertions and removals are O(1) on average
 * whatever the number of entries (the registry's phones, the pins, the API keys). */
#ifndef PR_IDMAP_H
#define PR_IDMAP_H

#include <stddef.h>
#include <string.h>

struct pr_idmap_entry;

typedef struct pr_idmap {
  struct pr_idmap_entry *head; /* uthash's head (NULL: empty) */
} pr_idmap;

#define PR_IDMAP_INIT {NULL}

/* Map key to value (replacing what it mapped to). Returns 0, or -ENOMEM (the map is as
 * it was). */
int pr_idmap_put(pr_idmap *m, const void *key, size_t len, void *value);
/* What key maps to; NULL when nothing. */
void *pr_idmap_get(const pr_idmap *m, const void *key, size_t len);
/* Forget key: 0, or -ENOENT. */
int pr_idmap_del(pr_idmap *m, const void *key, size_t len);
size_t pr_idmap_count(const pr_idmap *m);
/* Forget everything (the values are the caller's). */
void pr_idmap_clear(pr_idmap *m);
/* Call keep(value, ud) for every entry, in no set order, and forget those for which it
 * returns 0 (the callback may free their values). */
void pr_idmap_sweep(pr_idmap *m, int (*keep)(void *value, void *ud), void *ud);

/* The same with a NUL-terminated string as the key. */
static inline int pr_idmap_put_str(pr_idmap *m, const char *s, void *value) {
  return pr_idmap_put(m, s, strlen(s), value);
}
static inline void *pr_idmap_get_str(const pr_idmap *m, const char *s) {
  return s ? pr_idmap_get(m, s, strlen(s)) : NULL;
}
static inline int pr_idmap_del_str(pr_idmap *m, const char *s) { return pr_idmap_del(m, s, strlen(s)); }

#endif
