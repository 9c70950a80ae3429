/* Unit tests for proto/order.c: every order statistic of random, repeated, sorted, reversed
 * and constant arrays is the sorted array's, a NaN falls back to the sort; a nearly sorted
 * array of ints comes out as qsort_r leaves it, by insertion while few move and by the full
 * sort past the bound, from any start. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "order.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64: reproducible */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Every k of v (n long) against the sorted copy. */
static void check_all_k(const double *v, size_t n) {
  double *sorted = malloc(n * sizeof(*v)), *w = malloc(n * sizeof(*v));
  assert_non_null(sorted);
  assert_non_null(w);
  memcpy(sorted, v, n * sizeof(*v));
  qsort(sorted, n, sizeof(*v), cmp_double);
  for (size_t k = 0; k < n; k++) {
    memcpy(w, v, n * sizeof(*v));
    double got = pr_select_double(w, n, k);
    assert_true(got == sorted[k]);
    /* w is still the same values */
    qsort(w, n, sizeof(*v), cmp_double);
    assert_memory_equal(w, sorted, n * sizeof(*v));
  }
  free(sorted);
  free(w);
}

static void test_select_shapes(void **state) {
  (void)state;
  double v[97];
  for (size_t n = 1; n <= 97; n += (n < 10 ? 1 : 13)) {
    for (size_t i = 0; i < n; i++) v[i] = (double)(rnd() % 1000) / 7.0; /* random */
    check_all_k(v, n);
    for (size_t i = 0; i < n; i++) v[i] = (double)(rnd() % 3); /* many repeated */
    check_all_k(v, n);
    for (size_t i = 0; i < n; i++) v[i] = (double)i; /* sorted */
    check_all_k(v, n);
    for (size_t i = 0; i < n; i++) v[i] = (double)(n - i); /* reversed */
    check_all_k(v, n);
    for (size_t i = 0; i < n; i++) v[i] = 4.25; /* constant */
    check_all_k(v, n);
    for (size_t i = 0; i < n; i++) v[i] = i % 2 ? -1.0 / (double)(i + 1) : INFINITY; /* signs, infinities */
    check_all_k(v, n);
  }
  assert_true(pr_select_double(v, 0, 0) == 0);
  assert_true(pr_select_double(v, 3, 3) == 0);
}

static void test_select_nan(void **state) {
  (void)state;
  double v[] = {3, NAN, 1, 2}, w[4];
  memcpy(w, v, sizeof(v));
  qsort(w, 4, sizeof(*w), cmp_double);
  double x = pr_select_double(v, 4, 2);
  assert_true((isnan(x) && isnan(w[2])) || x == w[2]); /* as the sort left it */
}

/* A strict total order: by key, then by index. */
static int by_key(const void *x, const void *y, void *ctx) {
  const double *key = ctx;
  int i = *(const int *)x, j = *(const int *)y;
  return key[i] < key[j] ? -1 : key[i] > key[j] ? 1 : i - j;
}

static void test_order_ints(void **state) {
  (void)state;
  enum { N = 600 };
  double key[N];
  int v[N], ref[N];
  for (int round = 0; round < 40; round++) {
    for (int i = 0; i < N; i++) key[i] = (double)(rnd() % 50); /* ties broken by index */
    for (int i = 0; i < N; i++) ref[i] = i;
    qsort_r(ref, N, sizeof(int), by_key, key);
    /* nearly sorted: the sorted order with a few keys changed since */
    memcpy(v, ref, sizeof(v));
    int changed = (int)(rnd() % 8);
    for (int c = 0; c < changed; c++) key[rnd() % N] = (double)(rnd() % 50);
    for (int i = 0; i < N; i++) ref[i] = i;
    qsort_r(ref, N, sizeof(int), by_key, key);
    int full = pr_order_ints(v, N, by_key, key, 8 * N);
    assert_memory_equal(v, ref, sizeof(v));
    assert_int_equal(full, 0);
    /* any start, and a bound the moves pass: the same order by the full sort */
    for (int i = N - 1; i > 0; i--) {
      int k = (int)(rnd() % (uint64_t)(i + 1)), t = v[i];
      v[i] = v[k];
      v[k] = t;
    }
    full = pr_order_ints(v, N, by_key, key, N / 4);
    assert_memory_equal(v, ref, sizeof(v));
    assert_int_equal(full, 1);
  }
  pr_order_ints(v, 0, by_key, key, 0);
  pr_order_ints(v, 1, by_key, key, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_select_shapes),
      cmocka_unit_test(test_select_nan),
      cmocka_unit_test(test_order_ints),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
