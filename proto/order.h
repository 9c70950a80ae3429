/* Order statistics and nearly-sorted arrays: what a planning pass needs every time it runs
 * over thousands of phones, without sorting them all again.
 *
 * pr_select_double: the k-th smallest of n doubles (0-based), in O(n) on average
 * (Hoare's selection, the median of three as pivot; past 2 log2 n + 16 rounds of poor
 * pivots, what is left is sorted: O(n log n) at worst); v is reordered. The value is the
 * one a sort would put at v[k] -- a median read this way is the sorted one. NaN has no
 * place in an order: with one in v the whole array is sorted (qsort, NaN compared equal to
 * everything, as the callers' sort did) and v[k] returned.
 *
 * pr_order_ints: sorts n ints by a strict total order (cmp never answers 0 for two
 * different members) starting from the order v is in: insertion sort while the members out
 * of place are few (O(n + the moves)), qsort_r of the whole once the moves pass
 * `max_moves`. The order is total, so the result is the one qsort_r gives, whatever the
 * start: a pass that keeps last pass's order as its start sorts again in O(n) when little
 * changed. Pure: no clock, no libuv. */
#ifndef PR_ORDER_H
#define PR_ORDER_H

#include <stddef.h>

double pr_select_double(double *v, size_t n, size_t k);

typedef int (*pr_order_cmp)(const void *x, const void *y, void *ctx);
/* Returns 1 when it fell back to a full sort, 0 when the insertion sort was enough. */
int pr_order_ints(int *v, size_t n, pr_order_cmp cmp, void *ctx, size_t max_moves);

#endif
