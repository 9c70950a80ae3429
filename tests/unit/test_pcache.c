/* gateway/pcache.c: what a replica's engine slots hold, and whose, so that a request reuses
 * only its own cache scope's prompts (docs/security.md "Tenants' prompts"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "oai.h"
#include "pcache.h"

enum { A = 11, B = 22 }; /* two cache scopes */

static void prompt(uint64_t *b, size_t n, uint64_t base, size_t shared_with_1000) {
  for (size_t i = 0; i < n; i++) b[i] = i < shared_with_1000 ? 1000 + i : base + i;
}

static int64_t chars(size_t n) { return (int64_t)n * PR_OAI_BLOCK_CHARS; }

/* Pinned: the scope's own slot with the prefix is chosen and reused; another scope's
 * request never reuses it, takes the empty slot first, then rewrites the least recently
 * used one uncached. */
static void test_pinned_slots_keep_scopes_apart(void **state) {
  (void)state;
  gw_pcache c = {0};
  assert_int_equal(gw_pcache_shape(&c, 1, 2), 0);
  uint64_t p[20], q[20];
  prompt(p, 20, 1000, 20);
  prompt(q, 20, 5000, 18); /* shares 18 of 20 blocks with p */
  gw_pcache_pick k = gw_pcache_choose(&c, A, p, 20);
  assert_int_equal(k.slot, 0);
  assert_true(k.reuse); /* empty: nothing to reuse, nothing to leak */
  gw_pcache_sent(&c, k, A, p, 20, chars(20));
  gw_pcache_done(&c, k.slot, 2);
  /* A again with most of it: slot 0, reused */
  k = gw_pcache_choose(&c, A, q, 20);
  assert_int_equal(k.slot, 0);
  assert_true(k.reuse);
  assert_int_equal(gw_pcache_cached_tokens(&c, A, q, 20), 18 * PR_OAI_BLOCK_CHARS / 4);
  /* B with the same prompt: no cached tokens, the empty slot, reuse allowed there */
  assert_int_equal(gw_pcache_cached_tokens(&c, B, p, 20), 0);
  k = gw_pcache_choose(&c, B, p, 20);
  assert_int_equal(k.slot, 1);
  assert_true(k.reuse);
  gw_pcache_sent(&c, k, B, p, 20, chars(20));
  /* slot 1 busy: B's next one may only rewrite A's slot, uncached */
  k = gw_pcache_choose(&c, B, p, 20);
  assert_int_equal(k.slot, 0);
  assert_false(k.reuse);
  gw_pcache_sent(&c, k, B, p, 20, chars(20));
  assert_int_equal(gw_pcache_cached_tokens(&c, A, p, 20), 0); /* A's prompt is gone */
  /* both busy: the engine would choose, so nothing is reused */
  k = gw_pcache_choose(&c, A, p, 20);
  assert_int_equal(k.slot, -1);
  assert_false(k.reuse);
  gw_pcache_free(&c);
}

/* A pinned slot whose content the prompt keeps less than GW_PCACHE_KEEP of is not reused:
 * llama-server would look for a better prompt in its RAM cache, anyone's. Its answer counts
 * in what it holds. */
static void test_pinned_reuse_needs_most_of_the_slot(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 1, 1);
  uint64_t p[20], q[20];
  prompt(p, 20, 1000, 20);
  prompt(q, 20, 7000, 14); /* 14 of 20: 70 %, under 75 % */
  gw_pcache_pick k = gw_pcache_choose(&c, A, p, 20);
  gw_pcache_sent(&c, k, A, p, 20, chars(20));
  gw_pcache_done(&c, 0, 0);
  k = gw_pcache_choose(&c, A, q, 20);
  assert_int_equal(k.slot, 0);
  assert_false(k.reuse);
  assert_int_equal(gw_pcache_cached_tokens(&c, A, q, 20), 0);
  /* 16 of 20 keeps 80 %, unless the answer made the slot longer */
  prompt(q, 20, 7000, 16);
  assert_true(gw_pcache_choose(&c, A, q, 20).reuse);
  gw_pcache_sent(&c, gw_pcache_choose(&c, A, p, 20), A, p, 20, chars(20));
  gw_pcache_done(&c, 0, 200); /* 1,200 characters of answer */
  assert_false(gw_pcache_choose(&c, A, q, 20).reuse);
  gw_pcache_free(&c);
}

/* Unknown (after a restart): nobody reuses, until a pinned request rewrites the slot;
 * a reset (the engine loaded again) empties everything. */
static void test_unknown_slots_heal_when_rewritten(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 1, 2);
  gw_pcache_restore(&c, 0, 2);
  uint64_t p[8];
  prompt(p, 8, 1000, 8);
  gw_pcache_pick k = gw_pcache_choose(&c, A, p, 8);
  assert_false(k.reuse);
  gw_pcache_sent(&c, k, A, p, 8, chars(8));
  gw_pcache_done(&c, k.slot, 1);
  k = gw_pcache_choose(&c, A, p, 8);
  assert_int_equal(k.slot, 0); /* its own, kept: reused */
  assert_true(k.reuse);
  assert_int_equal(c.mixed, 2); /* the engine as a whole is still unknown */
  gw_pcache_reset(&c);
  assert_int_equal(c.mixed, 0);
  assert_int_equal(gw_pcache_cached_tokens(&c, A, p, 8), 0);
  assert_true(gw_pcache_choose(&c, B, p, 8).reuse);
  gw_pcache_free(&c);
}

/* The engine chooses its slots: a scope reuses only while the engine holds its prompts
 * alone; once another scope sent there, nobody does, until the engine loads again. */
static void test_engine_choice_counts_the_whole_engine(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 0, 2);
  uint64_t p[10];
  prompt(p, 10, 1000, 10);
  gw_pcache_pick k = gw_pcache_choose(&c, A, p, 10);
  assert_int_equal(k.slot, -1);
  assert_true(k.reuse);
  gw_pcache_sent(&c, k, A, p, 10, chars(10));
  assert_int_equal(gw_pcache_cached_tokens(&c, A, p, 10), 10 * PR_OAI_BLOCK_CHARS / 4);
  assert_true(gw_pcache_alone(&c, A));
  k = gw_pcache_choose(&c, B, p, 10);
  assert_false(k.reuse);
  assert_int_equal(gw_pcache_cached_tokens(&c, B, p, 10), 0);
  gw_pcache_sent(&c, k, B, p, 10, chars(10));
  assert_false(gw_pcache_choose(&c, A, p, 10).reuse);
  assert_int_equal(gw_pcache_cached_tokens(&c, A, p, 10), 0);
  /* Redis says it holds A's alone (another gateway saw it load again) */
  gw_pcache_hold(&c, A);
  assert_true(gw_pcache_choose(&c, A, p, 10).reuse);
  gw_pcache_reset(&c);
  assert_true(gw_pcache_choose(&c, B, p, 10).reuse);
  gw_pcache_free(&c);
}

/* From the engine's choice to pinned slots: each slot starts from what the engine as a
 * whole may hold. */
static void test_shape_change_keeps_what_the_engine_holds(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 0, 4);
  uint64_t p[6];
  prompt(p, 6, 1000, 6);
  gw_pcache_sent(&c, gw_pcache_choose(&c, A, p, 6), A, p, 6, chars(6));
  assert_int_equal(gw_pcache_shape(&c, 1, 3), 0);
  assert_int_equal(c.n, 3);
  assert_true(gw_pcache_choose(&c, A, p, 6).reuse);   /* its own scope's only */
  assert_false(gw_pcache_choose(&c, B, p, 6).reuse);  /* every slot may hold A's */
  gw_pcache_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pinned_slots_keep_scopes_apart),
      cmocka_unit_test(test_pinned_reuse_needs_most_of_the_slot),
      cmocka_unit_test(test_unknown_slots_heal_when_rewritten),
      cmocka_unit_test(test_engine_choice_counts_the_whole_engine),
      cmocka_unit_test(test_shape_change_keeps_what_the_engine_holds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
