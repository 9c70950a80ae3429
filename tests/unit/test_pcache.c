/* gateway/pcache.c: the prompts a replica was sent and whose they were, so that a request
 * reuses only its own cache scope's prompts (docs/security.md "Tenants' prompts"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "oai.h"
#include "pcache.h"

enum { A = 11, B = 22 }; /* two cache scopes */

static void prompt(uint64_t *b, size_t n, uint64_t base) {
  for (size_t i = 0; i < n; i++) b[i] = base + i;
}

static const int64_t FULL = 10 * PR_OAI_BLOCK_CHARS / 4;

/* The gateway keeps scopes apart on a phone without an agent that does: a scope reuses
 * only while the engine holds its prompts alone; once another scope sent there, nobody
 * does, until the engine loads again. */
static void test_the_whole_engine_counts(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 2);
  uint64_t p[10];
  prompt(p, 10, 1000);
  assert_true(gw_pcache_may_reuse(&c, A));
  gw_pcache_sent(&c, A, 1, p, 10);
  assert_int_equal(gw_pcache_cached_tokens(&c, A, p, 10), FULL);
  assert_int_equal(gw_pcache_cached_tokens(&c, B, p, 10), 0);
  assert_false(gw_pcache_may_reuse(&c, B));
  gw_pcache_sent(&c, B, 0, p, 10); /* sent uncached: the engine may hold both now */
  assert_false(gw_pcache_may_reuse(&c, A));
  assert_int_equal(gw_pcache_cached_tokens(&c, A, p, 10), 0);
  assert_int_equal(c.mixed, 1);
  gw_pcache_reset(&c); /* the engine loaded its model again */
  assert_true(gw_pcache_may_reuse(&c, B));
  assert_int_equal(gw_pcache_cached_tokens(&c, A, p, 10), 0);
}

/* Unknown after a restart (the log knew nothing): nobody reuses until a reload. */
static void test_unknown_is_reused_by_nobody(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 1);
  gw_pcache_restore(&c, 0, 2);
  assert_false(gw_pcache_may_reuse(&c, A));
  gw_pcache_restore(&c, A, 0); /* the log said: A's alone */
  assert_true(gw_pcache_may_reuse(&c, A));
  assert_false(gw_pcache_may_reuse(&c, B));
}

/* A phone whose agent keeps scopes apart decides each reuse: the gateway only predicts,
 * from each scope's own prompts. */
static void test_an_agent_decides(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 2);
  c.agent = 1;
  uint64_t p[10], q[10];
  prompt(p, 10, 1000);
  prompt(q, 10, 5000);
  gw_pcache_sent(&c, A, 1, p, 10);
  gw_pcache_sent(&c, B, 1, q, 10);
  assert_true(gw_pcache_may_reuse(&c, A));
  assert_true(gw_pcache_may_reuse(&c, B));
  assert_int_equal(gw_pcache_cached_tokens(&c, A, p, 10), FULL);
  assert_int_equal(gw_pcache_cached_tokens(&c, B, q, 10), FULL);
  assert_int_equal(gw_pcache_cached_tokens(&c, B, p, 10), 0); /* A's prompt: not B's to count on */
}

/* Redis's word: several scopes (mix), or one's alone (hold). */
static void test_redis_mixes_and_holds(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 1);
  uint64_t p[10];
  prompt(p, 10, 1000);
  gw_pcache_sent(&c, A, 1, p, 10);
  gw_pcache_mix(&c);
  assert_false(gw_pcache_may_reuse(&c, A));
  assert_int_equal(gw_pcache_cached_tokens(&c, A, p, 10), 0);
  gw_pcache_hold(&c, B);
  assert_true(gw_pcache_may_reuse(&c, B));
  assert_false(gw_pcache_may_reuse(&c, A));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_whole_engine_counts),
      cmocka_unit_test(test_unknown_is_reused_by_nobody),
      cmocka_unit_test(test_an_agent_decides),
      cmocka_unit_test(test_redis_mixes_and_holds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
