/* Unit tests for proto/heap.c: the earliest member always on top, keys moved both ways,
 * members taken out from anywhere, checked against a plain array after every step of a
 * long random sequence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "heap.h"

#define N 500

/* The heap property and each member's place, walked over the whole array. */
static void check(const pr_heap *h) {
  for (size_t i = 0; i < h->n; i++) {
    assert_int_equal(h->v[i]->pos, i + 1);
    if (i) assert_true(h->v[(i - 1) / 2]->key <= h->v[i]->key);
  }
}

/* The smallest key among the members of the reference (in[i] set), or UINT64_MAX. */
static uint64_t ref_min(const pr_heap_node *x, const int *in) {
  uint64_t m = UINT64_MAX;
  for (int i = 0; i < N; i++)
    if (in[i] && x[i].key < m) m = x[i].key;
  return m;
}

static void test_the_earliest_is_on_top(void **state) {
  (void)state;
  pr_heap h = PR_HEAP_INIT;
  pr_heap_node x[5] = {{0}};
  uint64_t keys[5] = {50, 10, 40, 10, 30};
  for (int i = 0; i < 5; i++) assert_int_equal(pr_heap_set(&h, &x[i], keys[i]), 0);
  assert_int_equal(h.n, 5);
  assert_int_equal(pr_heap_min(&h)->key, 10);
  /* taken out in key order, whatever order they came in */
  uint64_t last = 0;
  for (int i = 0; i < 5; i++) {
    pr_heap_node *m = pr_heap_min(&h);
    assert_true(m->key >= last);
    last = m->key;
    pr_heap_remove(&h, m);
    assert_false(pr_heap_member(m));
    check(&h);
  }
  assert_null(pr_heap_min(&h));
  pr_heap_free(&h);
}

static void test_a_key_moves_both_ways(void **state) {
  (void)state;
  pr_heap h = PR_HEAP_INIT;
  pr_heap_node x[3] = {{0}};
  pr_heap_set(&h, &x[0], 100);
  pr_heap_set(&h, &x[1], 200);
  pr_heap_set(&h, &x[2], 300);
  assert_ptr_equal(pr_heap_min(&h), &x[0]);
  pr_heap_set(&h, &x[2], 50); /* sooner: to the top */
  assert_ptr_equal(pr_heap_min(&h), &x[2]);
  pr_heap_set(&h, &x[2], 1000); /* later: down again */
  assert_ptr_equal(pr_heap_min(&h), &x[0]);
  assert_int_equal(h.n, 3); /* moving adds nothing */
  check(&h);
  pr_heap_remove(&h, &x[1]);
  pr_heap_remove(&h, &x[1]); /* twice: nothing */
  assert_int_equal(h.n, 2);
  check(&h);
  pr_heap_free(&h);
}

static void test_random_steps_match_a_plain_array(void **state) {
  (void)state;
  pr_heap h = PR_HEAP_INIT;
  pr_heap_node x[N];
  int in[N];
  memset(x, 0, sizeof(x));
  memset(in, 0, sizeof(in));
  srand(7);
  for (int step = 0; step < 20000; step++) {
    int i = rand() % N;
    int op = rand() % 4;
    if (op < 2) { /* put in, or move (often to a key others have too) */
      assert_int_equal(pr_heap_set(&h, &x[i], (uint64_t)(rand() % 1000)), 0);
      in[i] = 1;
    } else if (op == 2) { /* take out from anywhere */
      pr_heap_remove(&h, &x[i]);
      in[i] = 0;
    } else if (h.n) { /* take out the earliest */
      pr_heap_node *m = pr_heap_min(&h);
      assert_int_equal(m->key, ref_min(x, in));
      in[m - x] = 0;
      pr_heap_remove(&h, m);
    }
    size_t n = 0;
    for (int k = 0; k < N; k++) n += (size_t)in[k];
    assert_int_equal(h.n, n);
    assert_int_equal(pr_heap_min(&h) ? pr_heap_min(&h)->key : UINT64_MAX, ref_min(x, in));
    if (step % 97 == 0) check(&h);
  }
  check(&h);
  pr_heap_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_earliest_is_on_top),
      cmocka_unit_test(test_a_key_moves_both_ways),
      cmocka_unit_test(test_random_steps_match_a_plain_array),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
