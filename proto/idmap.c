/* A key-to-pointer map on uthash; see idmap.h. */
#include "idmap.h"

#include <errno.h>
#include <stdlib.h>

#include <openssl/crypto.h>

#include "hash.h"

/* uthash's choices, made before it is included: the keyed hash, keys compared in
 * constant time (an API key's digest is a key), and an allocation failure reported to the
 * caller instead of exit() (the entry is then not in the table: hh.tbl stays NULL). */
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = (unsigned)pr_hash64((keyptr), (keylen)))
#define HASH_KEYCMP(a, b, n) CRYPTO_memcmp((a), (b), (n))
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

struct pr_idmap_entry {
  UT_hash_handle hh;
  void *value;
  unsigned char key[]; /* its own copy */
};

typedef struct pr_idmap_entry entry;

static entry *find(const pr_idmap *m, const void *key, size_t len) {
  entry *e = NULL;
  entry *head = m->head;
  HASH_FIND(hh, head, key, len, e);
  return e;
}

int pr_idmap_put(pr_idmap *m, const void *key, size_t len, void *value) {
  entry *e = find(m, key, len);
  if (e) {
    e->value = value;
    return 0;
  }
  if (len > UINT32_MAX || !(e = malloc(sizeof(*e) + len + 1))) return -ENOMEM;
  memcpy(e->key, key, len);
  e->key[len] = '\0';
  e->value = value;
  HASH_ADD_KEYPTR(hh, m->head, e->key, len, e);
  if (!e->hh.tbl) { /* uthash could not make room for it */
    free(e);
    return -ENOMEM;
  }
  return 0;
}

void *pr_idmap_get(const pr_idmap *m, const void *key, size_t len) {
  entry *e = find(m, key, len);
  return e ? e->value : NULL;
}

int pr_idmap_del(pr_idmap *m, const void *key, size_t len) {
  entry *e = find(m, key, len);
  if (!e) return -ENOENT;
  HASH_DEL(m->head, e);
  free(e);
  return 0;
}

size_t pr_idmap_count(const pr_idmap *m) {
  const entry *head = m->head;
  return head ? HASH_COUNT(head) : 0;
}

void pr_idmap_clear(pr_idmap *m) {
  entry *e, *tmp;
  HASH_ITER(hh, m->head, e, tmp) {
    HASH_DEL(m->head, e);
    free(e);
  }
  m->head = NULL;
}

void pr_idmap_sweep(pr_idmap *m, int (*keep)(void *value, void *ud), void *ud) {
  entry *e, *tmp;
  HASH_ITER(hh, m->head, e, tmp) {
    if (keep(e->value, ud)) continue;
    HASH_DEL(m->head, e);
    free(e);
  }
}
