/* Order statistics and nearly-sorted arrays (order.h). */
#include "order.h"

#include <math.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void swap_d(double *v, size_t i, size_t j) {
  double t = v[i];
  v[i] = v[j];
  v[j] = t;
}

double pr_select_double(double *v, size_t n, size_t k) {
  if (n == 0 || k >= n) return 0;
  for (size_t i = 0; i < n; i++)
    if (isnan(v[i])) {
      qsort(v, n, sizeof(*v), cmp_double);
      return v[k];
    }
  size_t lo = 0, hi = n - 1, rounds = 0, max_rounds = 16;
  for (size_t m = n; m > 1; m /= 2) max_rounds += 2;
  while (lo < hi) {
    if (++rounds > max_rounds) {
      /* pivots this poor are an input made against the median of three: what is left is
       * sorted (O(n log n) at worst, never quadratic) */
      qsort(v + lo, hi - lo + 1, sizeof(*v), cmp_double);
      return v[k];
    }
    /* the median of three to v[lo]: sorted input stays linear */
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid] < v[lo]) swap_d(v, mid, lo);
    if (v[hi] < v[lo]) swap_d(v, hi, lo);
    if (v[hi] < v[mid]) swap_d(v, hi, mid);
    swap_d(v, lo, mid);
    double pivot = v[lo];
    /* Hoare's partition of [lo, hi]: [lo, j] <= pivot <= [j + 1, hi] */
    size_t i = lo, j = hi + 1;
    for (;;) {
      do i++; while (i <= hi && v[i] < pivot);
      do j--; while (v[j] > pivot);
      if (i >= j) break;
      swap_d(v, i, j);
    }
    swap_d(v, lo, j); /* the pivot to its place: [lo, j) <= v[j] <= (j, hi] */
    if (j == k) return v[j];
    if (k < j) hi = j - 1;
    else lo = j + 1;
  }
  return v[k];
}

int pr_order_ints(int *v, size_t n, pr_order_cmp cmp, void *ctx, size_t max_moves) {
  size_t moves = 0;
  for (size_t i = 1; i < n; i++) {
    int x = v[i];
    size_t j = i;
    while (j > 0 && cmp(&v[j - 1], &x, ctx) > 0) {
      v[j] = v[j - 1];
      j--;
      if (++moves > max_moves) {
        v[j] = x; /* v is a permutation again: the full sort takes it from here */
        qsort_r(v, n, sizeof(*v), cmp, ctx);
        return 1;
      }
    }
    v[j] = x;
  }
  return 0;
}
