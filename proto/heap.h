/* A min-heap of moments: members embed a pr_heap_node (their key, a loop time in ms, and
 * their place in the heap), so a member's key moves or it leaves in O(log n) without a
 * search, and the earliest is found in O(1). It is what lets a daemon wake for the work
 * that is due rather than scan everything it holds (libuv keeps its timers the same way;
 * HAProxy its wait queue). One array of pointers, grown as needed; nothing is allocated
 * per member and no member is owned. Pure: no clock, no libuv. */
#ifndef PR_HEAP_H
#define PR_HEAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct pr_heap_node {
  uint64_t key;  /* when it is due */
  size_t pos;    /* its place in the heap + 1; 0: not in one */
} pr_heap_node;

typedef struct pr_heap {
  pr_heap_node **v;
  size_t n, cap;
} pr_heap;

#define PR_HEAP_INIT {NULL, 0, 0}

/* Put x in h with key, or move it to key if it is in h already. Returns 0, or -ENOMEM
 * (x is then not in h, or stays where it was with its old key). */
int pr_heap_set(pr_heap *h, pr_heap_node *x, uint64_t key);
/* Take x out of h (nothing when it is not in it). */
void pr_heap_remove(pr_heap *h, pr_heap_node *x);
/* The member with the smallest key (NULL: empty); it stays in h. */
static inline pr_heap_node *pr_heap_min(const pr_heap *h) { return h->n ? h->v[0] : NULL; }
/* Whether x is in a heap. */
static inline int pr_heap_member(const pr_heap_node *x) { return x->pos != 0; }
/* Let go of the array; members are left as they are (their pos no longer means anything:
 * call this only when they are going away too, or clear them first). */
void pr_heap_free(pr_heap *h);

#endif
