/* gateway/pcache.c: the prompts a replica was sent and whose they were, so that a request
 * reuses only its own cache scope's prompts (docs/security.md "Tenants' prompts"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>

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


/* ---- hybrid engines: checkpoints and the learned share ---------------------------------- */

/* A chat of the engine README's cache experiment in the gateway's tokens: a 1,540-token
 * system part (the same blocks and the same fingerprint before the user turn), then a user
 * turn that differs with `q` (its blocks from the 25th on, and the whole prompt's
 * fingerprint), n tokens in all. */
static gw_pquery chat(uint64_t *b, uint64_t sys, int q, int64_t n) {
  size_t nb = (size_t)(n * 4 / PR_OAI_BLOCK_CHARS);
  for (size_t i = 0; i < nb; i++) b[i] = i < 24 ? sys * 1000 + i : sys * 1000 + 500 + (uint64_t)q * 50 + i;
  gw_pquery pq = {.blocks = b, .n_blocks = nb, .prompt_tokens = n, .user_at = 1540,
                  .user_fp = sys * 7 + 1, .full_fp = sys * 100000 + (uint64_t)q * 10000 + (uint64_t)n};
  return pq;
}

static int64_t hyb(gw_pcache *c, const gw_pquery *q) { return gw_pcache_cached_tokens_pq(c, A, q, "m"); }

/* The README's table, steps A1-C1 and G2, as the gateway predicts them: a new question after
 * the same system prompt reuses the user turn's checkpoint (1,540), an identical prompt all
 * but its last 4 tokens, and the next new question only the checkpoint 516 before the first
 * prompt's end (1,048): the repeat's checkpoint erased the system prompt's (min-step). An
 * edit near the start reuses nothing. A transformer (not hybrid) reuses the shared blocks. */
static void test_hybrid_checkpoints_as_b10587_keeps_them(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 1);
  c.hybrid = 1;
  uint64_t b[64];
  static const struct {
    int q;
    int64_t n, want;
  } steps[] = {{1, 1564, 0},    {2, 1562, 1540}, {3, 1557, 1540}, {4, 1558, 1540}, {5, 1559, 1540},
               {6, 1555, 1540}, {6, 1555, 1551}, {7, 1559, 1048}};
  for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
    gw_pquery q = chat(b, 1, steps[i].q, steps[i].n);
    assert_int_equal(hyb(&c, &q), steps[i].want);
    gw_pcache_sent_q(&c, A, 1, &q);
  }
  /* G2: the system prompt edited near its start: no block, no fingerprint in common */
  gw_pquery g = chat(b, 2, 8, 1563);
  assert_int_equal(hyb(&c, &g), 0);
  /* another scope finds nothing, hybrid or not */
  gw_pquery q = chat(b, 1, 9, 1560);
  assert_int_equal(gw_pcache_cached_tokens_pq(&c, B, &q, "m"), 0);
  /* the same sequence on a transformer: the shared blocks, checkpoints or not */
  gw_pcache t = {0};
  gw_pcache_shape(&t, 1);
  q = chat(b, 1, 1, 1564);
  gw_pcache_sent_q(&t, A, 1, &q);
  q = chat(b, 1, 6, 1555);
  assert_int_equal(gw_pcache_cached_tokens_pq(&t, A, &q, "m"), 24 * PR_OAI_BLOCK_CHARS / 4);
  gw_pcache_sent_q(&t, A, 1, &q);
  assert_int_equal(gw_pcache_cached_tokens_pq(&t, A, &q, "m"), gw_pcache_cached_tokens(&t, A, q.blocks, q.n_blocks));
  assert_int_equal(t.slot[0].n_ck, 0);
}

/* A system prompt shorter than a block: the engine may restore the checkpoint at the user
 * turn's start (the fingerprint says the prompt before it is the same), but a hit of fewer
 * than a block's tokens is not planned on — the planner finds the phones holding cached
 * tokens by a prompt's first block, and a walk of every phone must find the same. The slot
 * still keeps the checkpoint as the engine does. */
static int has_ckpt(const gw_pslot *s, int64_t at) {
  for (int i = 0; i < s->n_ck; i++)
    if (s->ck[i].at == at && !s->ck[i].tail) return 1;
  return 0;
}

static void test_hybrid_under_a_block_counts_nothing(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 1);
  c.hybrid = 1;
  uint64_t b1[8], b2[8];
  for (int i = 0; i < 8; i++) b1[i] = 100 + (uint64_t)i, b2[i] = 200 + (uint64_t)i;
  gw_pquery q1 = {.blocks = b1, .n_blocks = 8, .prompt_tokens = 520, .user_at = 14, .user_fp = 77,
                  .full_fp = 1};
  gw_pquery q2 = {.blocks = b2, .n_blocks = 8, .prompt_tokens = 530, .user_at = 14, .user_fp = 77,
                  .full_fp = 2};
  gw_pcache_sent_q(&c, A, 1, &q1);
  assert_true(has_ckpt(&c.slot[0], 14));
  assert_int_equal(hyb(&c, &q2), 0);
  /* with the first block shared the same checkpoint counts */
  b2[0] = b1[0];
  assert_int_equal(hyb(&c, &q2), 14);
  b2[0] = 200;
  /* sent there, the engine restored it: the slot keeps it and makes its own */
  gw_pcache_sent_q(&c, A, 1, &q2);
  assert_true(has_ckpt(&c.slot[0], 14));
}

/* "cache_prompt": false reuses nothing and leaves the new prompt's checkpoints behind; a
 * slot taken by another scope keeps none of the old ones. */
static void test_hybrid_no_reuse_starts_over(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 1);
  c.hybrid = 1;
  c.agent = 1;
  uint64_t b[64];
  gw_pquery q = chat(b, 1, 1, 1564);
  gw_pcache_sent_q(&c, A, 1, &q);
  q = chat(b, 1, 2, 1562);
  gw_pcache_sent_q(&c, A, 0, &q);
  assert_int_equal(c.slot[0].n_ck, 3); /* 1046, 1540, 1558: this prompt's own */
  assert_int_equal(c.slot[0].ck[0].at, 1562 - 516);
  q = chat(b, 1, 3, 1557);
  assert_int_equal(hyb(&c, &q), 1540);
  gw_pcache_sent_q(&c, B, 1, &q);
  assert_int_equal(gw_pcache_cached_tokens_pq(&c, A, &q, "m"), 0);
}

/* The learned share, with injected answers: planned on after a few, weighed against "as
 * predicted" (1); it follows new answers, forgets old ones with time, is kept for a bounded
 * number of models, and multiplies only a hybrid engine's hits. */
static void test_learned_share(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 1);
  assert_true(gw_pcache_share(&c, "m") == 1.0);
  for (int i = 0; i < 10; i++) gw_pcache_learn(&c, "m", 0.8, 1000 + (uint64_t)i * 1000);
  double s = gw_pcache_share(&c, "m");
  assert_true(s > 0.8 && s < 0.83); /* (4 x 0.8 + 0.5) / 4.5 */
  assert_true(gw_pcache_share(&c, "other") == 1.0);
  /* new answers outweigh old ones: ten at 0.4 bring it most of the way */
  for (int i = 0; i < 10; i++) gw_pcache_learn(&c, "m", 0.4, 20000 + (uint64_t)i * 1000);
  s = gw_pcache_share(&c, "m");
  assert_true(s > 0.4 && s < 0.55);
  /* an hour later (six half-lives) one answer is most of what is known */
  gw_pcache_learn(&c, "m", 1.0, 20000 + 3600 * 1000);
  s = gw_pcache_share(&c, "m");
  assert_true(s > 0.85);
  /* bounded: a fifth model takes the place of the one least recently taught */
  gw_pcache_learn(&c, "a", 0.5, 5000000);
  gw_pcache_learn(&c, "b", 0.5, 5000001);
  gw_pcache_learn(&c, "c", 0.5, 5000002);
  gw_pcache_learn(&c, "d", 0.5, 5000003);
  assert_true(gw_pcache_share(&c, "m") == 1.0);
  assert_true(gw_pcache_share(&c, "a") < 1.0);
  /* nonsense is bounded */
  gw_pcache_learn(&c, "d", 1e9, 5000004);
  assert_true(gw_pcache_share(&c, "d") <= GW_CACHE_SHARE_MAX);
  /* applied to a hybrid engine's hit, not to a transformer's */
  uint64_t b[64];
  gw_pquery q = chat(b, 1, 1, 1564);
  gw_pcache_sent_q(&c, A, 1, &q);
  q = chat(b, 1, 2, 1562);
  int64_t plain = gw_pcache_cached_tokens_pq(&c, A, &q, "a");
  assert_int_equal(plain, 24 * PR_OAI_BLOCK_CHARS / 4);
  gw_pcache h = {0};
  gw_pcache_shape(&h, 1);
  h.hybrid = 1;
  q = chat(b, 1, 1, 1564);
  gw_pcache_sent_q(&h, A, 1, &q);
  for (int i = 0; i < 10; i++) gw_pcache_learn(&h, "a", 0.5, 1000 + (uint64_t)i);
  q = chat(b, 1, 2, 1562);
  int64_t half = gw_pcache_cached_tokens_pq(&h, A, &q, "a");
  assert_true(half > 1540 / 2 && half < 1540 * 6 / 10);
}

/* The checkpoints counted from the end are the engine's tokens: with 2 of its tokens per
 * estimated one learned, they sit 258 and 2 estimated tokens before the end. */
static void test_checkpoints_in_the_engines_tokens(void **state) {
  (void)state;
  gw_pcache c = {0};
  gw_pcache_shape(&c, 1);
  c.hybrid = 1;
  for (int i = 0; i < 10; i++) gw_pcache_learn_tokens(&c, "m", 3128, 1564, 1000);
  assert_true(fabs(gw_pcache_token_ratio(&c, "m") - 2.0) < 1e-9);
  assert_true(gw_pcache_token_ratio(&c, "other") == 1.0);
  uint64_t b[64];
  gw_pquery q = chat(b, 1, 1, 1564);
  q.model = "m";
  gw_pcache_sent_q(&c, A, 1, &q);
  assert_int_equal(c.slot[0].n_ck, 3);
  assert_int_equal(c.slot[0].ck[0].at, 1564 - 258);
  assert_int_equal(c.slot[0].ck[1].at, 1540);
  assert_int_equal(c.slot[0].ck[2].at, 1564 - 2);
  assert_int_equal(gw_pcache_cached_tokens_pq(&c, A, &q, "m"), 1562); /* the same prompt again */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_whole_engine_counts),
      cmocka_unit_test(test_hybrid_checkpoints_as_b10587_keeps_them),
      cmocka_unit_test(test_hybrid_no_reuse_starts_over),
      cmocka_unit_test(test_hybrid_under_a_block_counts_nothing),
      cmocka_unit_test(test_learned_share),
      cmocka_unit_test(test_checkpoints_in_the_engines_tokens),
      cmocka_unit_test(test_unknown_is_reused_by_nobody),
      cmocka_unit_test(test_an_agent_decides),
      cmocka_unit_test(test_redis_mixes_and_holds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
