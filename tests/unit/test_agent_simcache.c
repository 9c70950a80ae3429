/* Unit tests for agent/simcache.c: the prompt-cache experiment of
 * ../shared/engines/llama-server-qwen35/README.md (steps A1-H1) replayed on token runs
 * shaped like its prompts (a 1,540-token system turn, user turns, Qwen3.5's generation
 * prompt, 4 tokens generated of which 3 are decoded back), with its measured cache_n for
 * the default server and for --ctx-checkpoints 0 and 2 and --checkpoint-min-step 0; the
 * transformer (full) rule; cache_prompt false; the RAM cache's save and restore; text
 * cut into tokens of four code points. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "simcache.h"

#define MAXTOK 4096
#define SYS 1540 /* "<|im_start|>system\n" + 1,535 tokens of rules + "<|im_end|>\n" */

/* A prompt under construction: tokens and where user turns start. */
typedef struct seq {
  ag_simtok t[MAXTOK];
  size_t n;
  size_t users[8];
  size_t nu;
} seq;

static int64_t next_id = 1000000; /* fresh token ids: every question differs */

static void ids(seq *s, int64_t first, size_t count) {
  for (size_t i = 0; i < count; i++) s->t[s->n++] = ag_simtok_id(first + (int64_t)i);
}
static void fresh(seq *s, size_t count) {
  ids(s, next_id, count);
  next_id += (int64_t)count;
}
/* "<|im_start|>user\n": a user turn starts here */
static void user(seq *s) {
  s->users[s->nu++] = s->n;
  ids(s, 50257, 1);
  ids(s, 7220, 1);
  ids(s, 198, 1);
}
static void system_turn(seq *s, int edit_at) {
  for (size_t i = 0; i < SYS; i++) s->t[s->n++] = ag_simtok_id(i == (size_t)edit_at ? 7 : 20000 + (int64_t)i);
}
/* "<|im_end|>\n<|im_start|>assistant\n<think>\n" (thinking) or "...<think>\n\n</think>\n\n" */
static void gen_prompt(seq *s, int thinking) {
  ids(s, 50258, 1);
  ids(s, 198, 1);
  ids(s, 50257, 1);
  ids(s, 562, 1);
  ids(s, 198, 1);
  ids(s, 50290, 1);
  ids(s, 198, 1);
  if (!thinking) ids(s, 40000, 4);
}
/* a whole chat: system, a question of q tokens, the generation prompt */
static void chat(seq *s, size_t q, int edit_at, int thinking) {
  memset(s, 0, sizeof(*s));
  system_turn(s, edit_at);
  user(s);
  fresh(s, q);
  gen_prompt(s, thinking);
}
/* the next turn of a chat: the template drops the last `drop` tokens of the previous
 * prompt (<think>...) and renders the answer (answer tokens), then a new question */
static void next_turn(seq *s, const seq *prev, size_t drop, const ag_simtok *answer, size_t n_answer,
                      size_t q, int thinking) {
  memcpy(s, prev, sizeof(*s));
  s->n = prev->n - drop;
  for (size_t i = 0; i < n_answer; i++) s->t[s->n++] = answer[i];
  ids(s, 50258, 1);
  ids(s, 198, 1);
  user(s);
  fresh(s, q);
  gen_prompt(s, thinking);
}

typedef struct fx {
  ag_simslot slot[2];
  ag_simcache_params par;
  uint64_t task;
  ag_simtok last_gen[4]; /* the last task's 4 generated tokens */
} fx;

/* One request on slot i: cache_n; then the prompt is read and 4 tokens generated, of
 * which the first 3 are decoded into the slot (the last sampled one never is). */
static int64_t run(fx *f, int i, const seq *s, int with_spans) {
  ag_simprompt p = {.tok = s->t, .n = s->n, .user_starts = s->users, .n_user = with_spans ? s->nu : 0};
  int64_t c = ag_simcache_begin(&f->slot[i], &p, 1, &f->par);
  assert_int_equal(f->slot[i].n, (size_t)c);
  assert_int_equal(ag_simcache_prefill(&f->slot[i], &p, ++f->task, &f->par), 0);
  assert_int_equal(f->slot[i].n, s->n);
  for (int k = 0; k < 4; k++) f->last_gen[k] = ag_simtok_id(next_id++);
  for (int k = 0; k < 3; k++) assert_int_equal(ag_simslot_push(&f->slot[i], f->last_gen[k]), 0);
  return c;
}

enum { A1, A2, A3, A4, A5, B1, B2, C1, C2, C3, D1, D2, E1, E2, F1, F2, F3, G1, G2, H1, N_STEPS };
static const char *const step_names[] = {"A1", "A2", "A3", "A4", "A5", "B1", "B2", "C1", "C2", "C3",
                                         "D1", "D2", "E1", "E2", "F1", "F2", "F3", "G1", "G2", "H1"};

/* The README's sequence; prompt lengths as measured there (A1 1564, A2 1562, ...). */
static void experiment(const ag_simcache_params *par, int64_t *cache_n, int64_t *n_prompt) {
  fx f;
  memset(&f, 0, sizeof(f));
  f.par = *par;
  seq *s = calloc(1, sizeof(*s)), *prev = calloc(1, sizeof(*prev)), *a1 = calloc(1, sizeof(*a1)),
      *a2 = calloc(1, sizeof(*a2));
  assert_non_null(s);
  static const size_t a_q[] = {14, 12, 7, 8, 9};
  for (int k = 0; k < 5; k++) {
    chat(s, a_q[k], -1, 1);
    if (k == 0) memcpy(a1, s, sizeof(*s));
    if (k == 1) memcpy(a2, s, sizeof(*s));
    n_prompt[A1 + k] = (int64_t)s->n;
    cache_n[A1 + k] = run(&f, 0, s, 1);
  }
  chat(s, 5, -1, 1); /* "Repeat request test." twice */
  for (int k = 0; k < 2; k++) {
    n_prompt[B1 + k] = (int64_t)s->n;
    cache_n[B1 + k] = run(&f, 0, s, 1);
  }
  /* C: a chat; the template re-renders the earlier assistant turn without <think>\n */
  chat(s, 9, -1, 1);
  n_prompt[C1] = (int64_t)s->n;
  cache_n[C1] = run(&f, 0, s, 1);
  memcpy(prev, s, sizeof(*s));
  next_turn(s, prev, 2, NULL, 0, 10, 1);
  n_prompt[C2] = (int64_t)s->n;
  cache_n[C2] = run(&f, 0, s, 1);
  memcpy(prev, s, sizeof(*s));
  next_turn(s, prev, 2, NULL, 0, 9, 1);
  n_prompt[C3] = (int64_t)s->n;
  cache_n[C3] = run(&f, 0, s, 1);
  /* D: thinking off; the answer (4 tokens) is content, rendered after the empty think */
  chat(s, 5, -1, 0);
  n_prompt[D1] = (int64_t)s->n;
  cache_n[D1] = run(&f, 0, s, 1);
  memcpy(prev, s, sizeof(*s));
  next_turn(s, prev, 4, f.last_gen, 4, 8, 0);
  n_prompt[D2] = (int64_t)s->n;
  cache_n[D2] = run(&f, 0, s, 1);
  /* E: /completion with token ids and no message spans; E2 extends E1 exactly */
  chat(s, 5, -1, 1);
  n_prompt[E1] = (int64_t)s->n;
  cache_n[E1] = run(&f, 0, s, 0);
  memcpy(prev, s, sizeof(*s));
  for (int k = 0; k < 4; k++) s->t[s->n++] = f.last_gen[k];
  fresh(s, 17);
  n_prompt[E2] = (int64_t)s->n;
  cache_n[E2] = run(&f, 0, s, 0);
  /* F: A1 again on slot 0, then on slot 1 (empty), then a new question on slot 1 */
  n_prompt[F1] = n_prompt[F2] = (int64_t)a1->n;
  cache_n[F1] = run(&f, 0, a1, 1);
  cache_n[F2] = run(&f, 1, a1, 1);
  chat(s, 7, -1, 1);
  n_prompt[F3] = (int64_t)s->n;
  cache_n[F3] = run(&f, 1, s, 1);
  /* G: the system prompt edited near its end, then near its start (slot 1) */
  chat(s, 13, SYS - 3, 1);
  n_prompt[G1] = (int64_t)s->n;
  cache_n[G1] = run(&f, 1, s, 1);
  chat(s, 13, 9, 1);
  n_prompt[G2] = (int64_t)s->n;
  cache_n[G2] = run(&f, 1, s, 1);
  /* H: no id_slot: slot 0 shares 1,543 tokens with A2, slot 1 only 9 */
  ag_simprompt p = {.tok = a2->t, .n = a2->n};
  assert_true(ag_simtok_lcp(f.slot[0].tok, f.slot[0].n, p.tok, p.n) >
              par->slot_similarity * (double)p.n);
  n_prompt[H1] = (int64_t)a2->n;
  cache_n[H1] = run(&f, 0, a2, 1);
  ag_simslot_free(&f.slot[0]);
  ag_simslot_free(&f.slot[1]);
  free(s);
  free(prev);
  free(a1);
  free(a2);
}

static void check_column(const ag_simcache_params *par, const int64_t *want) {
  int64_t got[N_STEPS], n_prompt[N_STEPS];
  experiment(par, got, n_prompt);
  for (int i = 0; i < N_STEPS; i++) {
    if (got[i] != want[i])
      fail_msg("step %s (prompt %lld tokens): cache_n %lld, the engine's %lld", step_names[i],
               (long long)n_prompt[i], (long long)got[i], (long long)want[i]);
  }
}

static void test_prompts_have_the_readmes_lengths(void **state) {
  (void)state;
  static const int64_t want[N_STEPS] = {1564, 1562, 1557, 1558, 1559, 1555, 1555, 1559, 1579, 1598,
                                        1559, 1583, 1555, 1576, 1564, 1564, 1557, 1563, 1563, 1562};
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  par.mode = AG_SIMCACHE_HYBRID;
  int64_t got[N_STEPS], n_prompt[N_STEPS];
  experiment(&par, got, n_prompt);
  for (int i = 0; i < N_STEPS; i++)
    if (n_prompt[i] != want[i]) fail_msg("step %s: %lld tokens", step_names[i], (long long)n_prompt[i]);
}

static void test_default_server(void **state) {
  (void)state;
  static const int64_t want[N_STEPS] = {0,    1540, 1540, 1540, 1540, 1540, 1551, 1048, 1555, 1575,
                                        1048, 1555, 1048, 1558, 1048, 0,    1540, 1048, 0,    1540};
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  par.mode = AG_SIMCACHE_HYBRID;
  check_column(&par, want);
}

static void test_no_checkpoints(void **state) {
  (void)state;
  static const int64_t want[N_STEPS] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1558, 0, 0, 0, 0, 0, 0};
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  par.mode = AG_SIMCACHE_HYBRID;
  par.ctx_checkpoints = 0;
  check_column(&par, want);
}

static void test_two_checkpoints(void **state) {
  (void)state;
  static const int64_t want[N_STEPS] = {0,    1540, 1540, 1540, 1540, 1540, 1551, 1540, 1555, 1575,
                                        0,    1555, 0,    1558, 0,    0,    1540, 0,    0,    1540};
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  par.mode = AG_SIMCACHE_HYBRID;
  par.ctx_checkpoints = 2;
  check_column(&par, want);
}

static void test_min_step_zero(void **state) {
  (void)state;
  static const int64_t want[N_STEPS] = {0,    1540, 1540, 1540, 1540, 1540, 1551, 1540, 1555, 1575,
                                        1540, 1555, 1540, 1558, 1540, 0,    1540, 1048, 0,    1540};
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  par.mode = AG_SIMCACHE_HYBRID;
  par.checkpoint_min_step = 0;
  check_column(&par, want);
}

/* The README's last column: the same run with a 77-token system prompt (the first
 * checkpoint is then the user turn's, which survives). */
static void test_short_system_prompt(void **state) {
  (void)state;
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  par.mode = AG_SIMCACHE_HYBRID;
  ag_simslot slot = {0};
  seq *s = calloc(1, sizeof(*s));
  /* 82 tokens before the question, as measured; A2 then reuses exactly those */
  for (int k = 0; k < 3; k++) {
    memset(s, 0, sizeof(*s));
    ids(s, 30000, 82);
    user(s);
    fresh(s, 12);
    gen_prompt(s, 1);
    s->users[0] = 82;
    ag_simprompt p = {.tok = s->t, .n = s->n, .user_starts = s->users, .n_user = s->nu};
    int64_t c = ag_simcache_begin(&slot, &p, 1, &par);
    assert_int_equal(c, k == 0 ? 0 : 82);
    assert_int_equal(ag_simcache_prefill(&slot, &p, (uint64_t)k + 1, &par), 0);
    /* a prompt shorter than 4 + n_ubatch: checkpoints at the user turn and 4 before the end */
    assert_int_equal(slot.ncp, k == 0 ? 2 : 3); /* the first task's 82 stays, as the first one */
    assert_int_equal(slot.cp[0].n_tokens, 82);
    assert_int_equal(slot.cp[slot.ncp - 1].n_tokens, (int64_t)s->n - 4);
  }
  ag_simslot_free(&slot);
  free(s);
}

/* A transformer reuses the whole common prefix, less the last token of an identical
 * prompt; a token id never equals a piece of text. */
static void test_full_mode(void **state) {
  (void)state;
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  ag_simslot slot = {0};
  seq *s = calloc(1, sizeof(*s));
  chat(s, 10, -1, 1);
  ag_simprompt p = {.tok = s->t, .n = s->n, .user_starts = s->users, .n_user = s->nu};
  assert_int_equal(ag_simcache_begin(&slot, &p, 1, &par), 0);
  assert_int_equal(ag_simcache_prefill(&slot, &p, 1, &par), 0);
  assert_int_equal(slot.ncp, 0);
  assert_int_equal(ag_simcache_begin(&slot, &p, 1, &par), (int64_t)s->n - 1);
  assert_int_equal(ag_simcache_prefill(&slot, &p, 2, &par), 0);
  s->n -= 3;
  fresh(s, 20);
  p.n = s->n;
  assert_int_equal(ag_simcache_begin(&slot, &p, 1, &par), (int64_t)s->n - 20);
  /* cache_prompt false: nothing reused, the slot then holds the new prompt */
  assert_int_equal(ag_simcache_prefill(&slot, &p, 3, &par), 0);
  assert_int_equal(ag_simcache_begin(&slot, &p, 0, &par), 0);
  assert_int_equal(slot.n, 0);
  assert_int_equal(ag_simcache_prefill(&slot, &p, 4, &par), 0);
  assert_int_equal(ag_simcache_begin(&slot, &p, 1, &par), (int64_t)s->n - 1);
  ag_simslot_free(&slot);
  free(s);
}

/* cache_prompt false on a hybrid slot: cache_n 0 and its checkpoints gone, but the new
 * prompt's own checkpoints are made, so the next request reuses them (b10587). */
static void test_hybrid_cache_prompt_false(void **state) {
  (void)state;
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  par.mode = AG_SIMCACHE_HYBRID;
  ag_simslot slot = {0};
  seq *s = calloc(1, sizeof(*s));
  chat(s, 10, -1, 1);
  ag_simprompt p = {.tok = s->t, .n = s->n, .user_starts = s->users, .n_user = s->nu};
  assert_int_equal(ag_simcache_begin(&slot, &p, 1, &par), 0);
  assert_int_equal(ag_simcache_prefill(&slot, &p, 1, &par), 0);
  assert_int_equal(slot.ncp, 3); /* 1048 (4 + 512 before the end), 1540 (user), end - 4 */
  assert_int_equal(slot.cp[0].n_tokens, (int64_t)s->n - 516);
  assert_int_equal(slot.cp[1].n_tokens, SYS);
  assert_int_equal(slot.cp[2].n_tokens, (int64_t)s->n - 4);
  assert_int_equal(ag_simcache_begin(&slot, &p, 0, &par), 0);
  assert_int_equal(slot.ncp, 0);
  assert_int_equal(ag_simcache_prefill(&slot, &p, 2, &par), 0);
  assert_int_equal(ag_simcache_begin(&slot, &p, 1, &par), (int64_t)s->n - 4);
  ag_simslot_free(&slot);
  free(s);
}

/* Long prompts are read n_batch tokens at a time; with min-step 8192 only the last user
 * turn, 516 and 4 before the end get checkpoints; the per-slot cap drops the oldest. */
static void test_long_prompt_and_cap(void **state) {
  (void)state;
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  par.mode = AG_SIMCACHE_HYBRID;
  par.n_batch = 1024; /* batches of 1024: no checkpoint mid-prompt */
  ag_simslot slot = {0};
  seq *s = calloc(1, sizeof(*s));
  ids(s, 1, 3000);
  user(s);
  fresh(s, 50);
  ag_simprompt p = {.tok = s->t, .n = s->n, .user_starts = s->users, .n_user = s->nu};
  assert_int_equal(ag_simcache_begin(&slot, &p, 1, &par), 0);
  assert_int_equal(ag_simcache_prefill(&slot, &p, 1, &par), 0);
  assert_int_equal(slot.ncp, 3);
  assert_int_equal(slot.cp[0].n_tokens, (int64_t)s->n - 516);
  assert_int_equal(slot.cp[1].n_tokens, 3000);
  assert_int_equal(slot.cp[2].n_tokens, (int64_t)s->n - 4);
  ag_simslot_clear(&slot);
  par.ctx_checkpoints = 2;
  assert_int_equal(ag_simcache_prefill(&slot, &p, 2, &par), 0);
  assert_int_equal(slot.ncp, 2);
  assert_int_equal(slot.cp[0].n_tokens, 3000);
  ag_simslot_free(&slot);
  free(s);
}

/* The RAM cache: a slot is saved before it is reused; a later prompt that shares most of
 * a saved one gets it back (with its checkpoints); one that keeps under a quarter of an
 * entry does not; the token limit drops the oldest. */
static void test_ram_cache(void **state) {
  (void)state;
  ag_simcache_params par;
  ag_simcache_params_default(&par);
  par.mode = AG_SIMCACHE_HYBRID;
  ag_simram ram = {.limit_tokens = 4000};
  ag_simslot slot = {0};
  seq *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
  chat(a, 10, -1, 1);
  memset(b, 0, sizeof(*b));
  ids(b, 90000, 1200);
  user(b);
  fresh(b, 10);
  ag_simprompt pa = {.tok = a->t, .n = a->n, .user_starts = a->users, .n_user = a->nu};
  ag_simprompt pb = {.tok = b->t, .n = b->n, .user_starts = b->users, .n_user = b->nu};
  assert_int_equal(ag_simcache_prefill(&slot, &pa, 1, &par), 0);
  /* b is unlike the slot: a pinned slot goes through the cache, an empty one not */
  assert_true(ag_simcache_wants_ram(&slot, &pb, 1, 0, &par));
  assert_false(ag_simcache_wants_ram(&slot, &pa, 1, 0, &par));
  ag_simslot empty = {0};
  assert_false(ag_simcache_wants_ram(&empty, &pb, 1, 0, &par));
  assert_int_equal(ag_simram_swap(&ram, &slot, &pb), 0); /* a saved, nothing like b */
  assert_int_equal(ram.n, 1);
  assert_int_equal(ag_simcache_begin(&slot, &pb, 1, &par), 0);
  assert_int_equal(ag_simcache_prefill(&slot, &pb, 2, &par), 0);
  /* a new question after a's system prompt: a comes back from RAM, checkpoints too */
  seq *a2 = calloc(1, sizeof(*a2));
  chat(a2, 12, -1, 1);
  ag_simprompt pa2 = {.tok = a2->t, .n = a2->n, .user_starts = a2->users, .n_user = a2->nu};
  assert_int_equal(ag_simram_swap(&ram, &slot, &pa2), 1);
  assert_int_equal(slot.n, a->n);
  assert_int_equal(ram.n, 1); /* b saved, a taken out */
  assert_int_equal(ag_simcache_begin(&slot, &pa2, 1, &par), SYS);
  /* an entry sharing under a quarter of itself stays where it is */
  seq *c = calloc(1, sizeof(*c));
  ids(c, 90000, 200);
  fresh(c, 2000);
  ag_simprompt pc = {.tok = c->t, .n = c->n};
  assert_int_equal(ag_simcache_prefill(&slot, &pa2, 3, &par), 0);
  assert_int_equal(ag_simram_swap(&ram, &slot, &pc), 0);
  /* the limit: b's 1,213 + a2's 1,562 + c's 2,200 > 4,000 drops the oldest */
  assert_int_equal(ag_simcache_begin(&slot, &pc, 1, &par), 0);
  assert_int_equal(ag_simcache_prefill(&slot, &pc, 4, &par), 0);
  assert_int_equal(ag_simram_swap(&ram, &slot, &pa), 1);
  int64_t total = 0;
  for (size_t i = 0; i < ram.n; i++) total += (int64_t)ram.e[i].n;
  assert_true(total <= 4000);
  ag_simram_free(&ram);
  ag_simslot_free(&slot);
  free(a);
  free(a2);
  free(b);
  free(c);
}

/* Text becomes tokens of four code points, kept whole; positions count them. */
static void test_text_tokens(void **state) {
  (void)state;
  const char *t = "abcdéfgh東京ij";
  ag_simtok *tok;
  size_t n;
  assert_int_equal(ag_simtok_text(t, strlen(t), &tok, &n), 0);
  assert_int_equal(n, 3); /* abcd éfgh 東京ij */
  ag_simtok *tok2;
  size_t n2;
  const char *u = "abcdéfgh東京ik";
  assert_int_equal(ag_simtok_text(u, strlen(u), &tok2, &n2), 0);
  assert_int_equal(ag_simtok_lcp(tok, n, tok2, n2), 2);
  assert_int_equal(ag_simtok_pos(t, strlen("abcdéfgh")), 2);
  assert_int_equal(ag_simtok_pos(t, 3), 0);
  ag_simtok id = ag_simtok_id(0x61626364);
  assert_true(id.a != tok[0].a || id.b != tok[0].b);
  free(tok);
  free(tok2);
  assert_int_equal(ag_simtok_text("", 0, &tok, &n), 0);
  assert_int_equal(n, 0);
  free(tok);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_prompts_have_the_readmes_lengths),
    cmocka_unit_test(test_default_server),
    cmocka_unit_test(test_no_checkpoints),
    cmocka_unit_test(test_two_checkpoints),
    cmocka_unit_test(test_min_step_zero),
    cmocka_unit_test(test_short_system_prompt),
    cmocka_unit_test(test_full_mode),
    cmocka_unit_test(test_hybrid_cache_prompt_false),
    cmocka_unit_test(test_long_prompt_and_cap),
    cmocka_unit_test(test_ram_cache),
    cmocka_unit_test(test_text_tokens),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
