/* agent/isolate.c: the agent keeps callers' cache scopes apart on its engine
 * (docs/security.md "Tenants' prompts"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "isolate.h"

enum { A = 11, B = 22 };

static void prompt(uint64_t *b, size_t n, uint64_t base) {
  for (size_t i = 0; i < n; i++) b[i] = base + i;
}

/* Named slots: each scope keeps slots of its own; a request reuses only its own scope's
 * slot, takes an empty one before it rewrites another's (uncached), and all slots busy
 * the least busy one, uncached. */
static void test_slots_keep_scopes_apart(void **state) {
  (void)state;
  ag_iso s = {0};
  assert_int_equal(ag_iso_init(&s, AG_ISO_SLOTS, 2, 1), 0);
  uint64_t p[8], q[8];
  prompt(p, 8, 100);
  prompt(q, 8, 900);
  ag_iso_pick a = ag_iso_start(&s, A, p, 8);
  assert_int_equal(a.slot, 0);
  assert_true(a.reuse); /* empty and known: nothing of anyone's there */
  ag_iso_end(&s, a, A, p, 8, 1);
  ag_iso_pick b = ag_iso_start(&s, B, p, 8); /* B guesses A's prompt */
  assert_int_equal(b.slot, 1);               /* the empty slot, not A's */
  assert_true(b.reuse);
  ag_iso_end(&s, b, B, p, 8, 1);
  a = ag_iso_start(&s, A, p, 8);
  assert_int_equal(a.slot, 0);
  assert_true(a.reuse);
  ag_iso_pick b2 = ag_iso_start(&s, B, q, 8); /* its own, free */
  assert_int_equal(b2.slot, 1);
  assert_true(b2.reuse);
  /* both busy: the engine waits for the least busy one, and nothing is reused */
  ag_iso_pick c = ag_iso_start(&s, B, q, 8);
  assert_false(c.reuse);
  ag_iso_end(&s, a, A, p, 8, 1);
  ag_iso_end(&s, b2, B, q, 8, 1);
  ag_iso_end(&s, c, B, q, 8, 1);
  /* c waited for slot 0 (both as busy, the older): B's prompt came after A's there, and
   * slot 1 is B's too: A has nothing of its own left */
  assert_true(s.slot[0].scope == B && s.slot[1].scope == B);
  ag_iso_pick d = ag_iso_start(&s, A, p, 8);
  assert_false(d.reuse);
  ag_iso_free(&s);
}

/* A request the engine did not answer with a 200 (refused at once, failed, cut off before
 * the engine answered) leaves its slot unknown: the slot may still hold the prompt it held
 * before, another scope's. */
static void test_a_refused_request_leaves_the_slot_unknown(void **state) {
  (void)state;
  ag_iso s = {0};
  ag_iso_init(&s, AG_ISO_SLOTS, 1, 1);
  uint64_t v[8], g[8];
  prompt(v, 8, 100);
  prompt(g, 8, 100); /* the attacker's guess: the victim's prompt */
  ag_iso_pick p = ag_iso_start(&s, A, v, 8);
  ag_iso_end(&s, p, A, v, 8, 1);
  p = ag_iso_start(&s, B, g, 8);
  assert_false(p.reuse); /* A's slot: rewritten uncached */
  ag_iso_end(&s, p, B, g, 8, 0); /* ...but the engine refused it: still A's prompt */
  p = ag_iso_start(&s, B, g, 8);
  assert_false(p.reuse); /* not "B's own slot" */
  ag_iso_end(&s, p, B, g, 8, 1);
  p = ag_iso_start(&s, B, g, 8);
  assert_true(p.reuse); /* now it is */
  ag_iso_end(&s, p, B, g, 8, 1);
  ag_iso_free(&s);
}

/* An engine the agent found running may hold anyone's prompts: no slot is reused until the
 * agent's own uncached request rewrites it. */
static void test_an_engine_found_running_is_unknown(void **state) {
  (void)state;
  ag_iso s = {0};
  ag_iso_init(&s, AG_ISO_SLOTS, 1, 0);
  uint64_t p[4];
  prompt(p, 4, 1);
  ag_iso_pick k = ag_iso_start(&s, A, p, 4);
  assert_false(k.reuse);
  ag_iso_end(&s, k, A, p, 4, 1);
  k = ag_iso_start(&s, A, p, 4);
  assert_true(k.reuse);
  ag_iso_end(&s, k, A, p, 4, 1);
  ag_iso_free(&s);
  ag_iso_init(&s, AG_ISO_ENGINE, 1, 0);
  assert_false(ag_iso_start(&s, A, p, 4).reuse);
  assert_false(ag_iso_start(&s, A, p, 4).reuse);
  ag_iso_free(&s);
}

/* The whole engine: a scope reuses while every prompt since the engine started was its
 * own; a second scope's request makes the engine reused by nobody. */
static void test_the_whole_engine(void **state) {
  (void)state;
  ag_iso s = {0};
  ag_iso_init(&s, AG_ISO_ENGINE, 4, 1);
  uint64_t p[4];
  prompt(p, 4, 1);
  ag_iso_pick k = ag_iso_start(&s, A, p, 4);
  assert_int_equal(k.slot, -1);
  assert_true(k.reuse);
  assert_true(ag_iso_start(&s, A, p, 4).reuse);
  assert_false(ag_iso_start(&s, B, p, 4).reuse);
  assert_false(ag_iso_start(&s, A, p, 4).reuse);
  ag_iso_free(&s);
}

static void test_scope_header(void **state) {
  (void)state;
  assert_true(ag_iso_scope_of("00000000000000ff") == 0xff);
  assert_true(ag_iso_scope_of(NULL) == AG_ISO_NO_SCOPE);
  assert_true(ag_iso_scope_of("00000000000000FF") == AG_ISO_NO_SCOPE); /* lowercase only */
  assert_true(ag_iso_scope_of("ff") == AG_ISO_NO_SCOPE);
  assert_true(ag_iso_scope_of("0000000000000000") == AG_ISO_NO_SCOPE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slots_keep_scopes_apart),
      cmocka_unit_test(test_a_refused_request_leaves_the_slot_unknown),
      cmocka_unit_test(test_an_engine_found_running_is_unknown),
      cmocka_unit_test(test_the_whole_engine),
      cmocka_unit_test(test_scope_header),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
