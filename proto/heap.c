/* A binary min-heap of moments; see heap.h. */
#include "heap.h"

#include <errno.h>
#include <stdlib.h>

static void place(pr_heap *h, size_t i, pr_heap_node *x) {
  h->v[i] = x;
  x->pos = i + 1;
}

static void sift_up(pr_heap *h, size_t i) {
  pr_heap_node *x = h->v[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (h->v[parent]->key <= x->key) break;
    place(h, i, h->v[parent]);
    i = parent;
  }
  place(h, i, x);
}

static void sift_down(pr_heap *h, size_t i) {
  pr_heap_node *x = h->v[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && h->v[c + 1]->key < h->v[c]->key) c++;
    if (x->key <= h->v[c]->key) break;
    place(h, i, h->v[c]);
    i = c;
  }
  place(h, i, x);
}

int pr_heap_set(pr_heap *h, pr_heap_node *x, uint64_t key) {
  if (x->pos) {
    size_t i = x->pos - 1;
    uint64_t old = x->key;
    x->key = key;
    if (key < old) sift_up(h, i);
    else if (key > old) sift_down(h, i);
    return 0;
  }
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 64;
    pr_heap_node **nv = realloc(h->v, cap * sizeof(*nv));
    if (!nv) return -ENOMEM;
    h->v = nv;
    h->cap = cap;
  }
  x->key = key;
  place(h, h->n++, x);
  sift_up(h, h->n - 1);
  return 0;
}

void pr_heap_remove(pr_heap *h, pr_heap_node *x) {
  if (!x->pos) return;
  size_t i = x->pos - 1;
  x->pos = 0;
  pr_heap_node *last = h->v[--h->n];
  if (i == h->n) return; /* it was the last one */
  place(h, i, last);
  /* the one moved into its place may belong above it or below it */
  if (i > 0 && h->v[(i - 1) / 2]->key > last->key) sift_up(h, i);
  else sift_down(h, i);
}

void pr_heap_free(pr_heap *h) {
  free(h->v);
  h->v = NULL;
  h->n = h->cap = 0;
}
