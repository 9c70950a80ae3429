/* Unit tests for gateway/model.c: the models and their phones, kept from fleet events (a
 * replica added, leaving, changing its models), in the registry's order; configured models
 * without phones; what a model learned kept while it is among the recently used idle ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gw.h"
#include "model.h"

static gw_replica *rep(const char *id, uint64_t seq, char **models, size_t n) {
  gw_replica *r = gw_replica_new(id, "http://127.0.0.1:1", NULL, models, n, 1, 0, 10, 1, 0);
  assert_non_null(r);
  r->ident.reg_seq = seq;
  return r;
}

static void test_phones_follow_events(void **state) {
  (void)state;
  gw_server gw;
  memset(&gw, 0, sizeof(gw));
  char *ab[] = {"a", "b"}, *a[] = {"a"}, *b[] = {"b"};
  gw_replica *r1 = rep("r1", 1, ab, 2), *r2 = rep("r2", 2, a, 1), *r3 = rep("r3", 3, b, 1);
  gw_fleet_event ev = {.kind = GW_FLEET_ADDED, .r = r2, .now_ms = 10};
  gw_models_on_fleet(&gw, &ev, NULL);
  ev.r = r1;
  gw_models_on_fleet(&gw, &ev, NULL);
  ev.r = r3;
  gw_models_on_fleet(&gw, &ev, NULL);
  gw_model *ma = gw_models_find(&gw.models, "a"), *mb = gw_models_find(&gw.models, "b");
  assert_non_null(ma);
  assert_non_null(mb);
  assert_null(gw_models_find(&gw.models, "c"));
  /* in the registry's order, whatever order the events came in */
  assert_int_equal(ma->n_phones, 2);
  assert_ptr_equal(ma->phones[0], r1);
  assert_ptr_equal(ma->phones[1], r2);
  assert_int_equal(mb->n_phones, 2);
  assert_ptr_equal(mb->phones[0], r1);
  assert_ptr_equal(mb->phones[1], r3);
  /* r1 now serves only b: it leaves a's phones, keeps its place in b's */
  uint64_t gen = ma->gen;
  assert_int_equal(gw_replica_set_strings(r1, r1->url, NULL, b, 1, NULL), 0);
  ev.kind = GW_FLEET_MODELS;
  ev.r = r1;
  gw_models_on_fleet(&gw, &ev, NULL);
  assert_int_equal(ma->n_phones, 1);
  assert_ptr_equal(ma->phones[0], r2);
  assert_true(ma->gen > gen);
  assert_int_equal(mb->n_phones, 2);
  assert_ptr_equal(mb->phones[0], r1);
  /* and back to both: its place in a's list again */
  assert_int_equal(gw_replica_set_strings(r1, r1->url, NULL, ab, 2, NULL), 0);
  gw_models_on_fleet(&gw, &ev, NULL);
  assert_ptr_equal(ma->phones[0], r1);
  /* a state change moves its models' gen, nothing else */
  gen = mb->gen;
  ev.kind = GW_FLEET_STATE;
  ev.r = r3;
  gw_models_on_fleet(&gw, &ev, NULL);
  assert_true(mb->gen > gen);
  assert_int_equal(mb->n_phones, 2);
  /* r2 leaves: a keeps r1; a model whose last phone left is no longer known */
  ev.kind = GW_FLEET_REMOVED;
  ev.r = r2;
  gw_models_on_fleet(&gw, &ev, NULL);
  assert_int_equal(ma->n_phones, 1);
  ev.r = r1;
  gw_models_on_fleet(&gw, &ev, NULL);
  assert_int_equal(ma->n_phones, 0);
  assert_false(gw_model_known(gw_models_find(&gw.models, "a")));
  assert_true(gw_model_known(mb));
  gw_models_free(&gw.models);
  gw_replica_free(r1);
  gw_replica_free(r2);
  gw_replica_free(r3);
}

static void test_configured_without_phones(void **state) {
  (void)state;
  gw_models ms;
  memset(&ms, 0, sizeof(ms));
  char *names[] = {"planned", "other"};
  assert_int_equal(gw_models_configure(&ms, names, 2, 5), 0);
  gw_model *p = gw_models_find(&ms, "planned");
  assert_non_null(p);
  assert_true(gw_model_known(p));
  assert_int_equal(p->n_phones, 0);
  /* a reload that drops it: no longer known, and let go once idle ones are too many */
  assert_int_equal(gw_models_configure(&ms, names + 1, 1, 6), 0);
  assert_false(gw_model_known(p));
  assert_true(gw_model_known(gw_models_find(&ms, "other")));
  gw_models_free(&ms);
}

static void test_idle_models_keep_what_they_learned(void **state) {
  (void)state;
  gw_models ms;
  memset(&ms, 0, sizeof(ms));
  /* a model whose phones left keeps its answer lengths while it is among the
   * GW_MODELS_IDLE most recently used idle ones */
  gw_model *m = gw_models_get(&ms, "m", 1);
  gw_model_learn_out(&ms, m, 300, 250, 1);
  gw_model_ref(m); /* a job holds it: never let go */
  for (int i = 0; i < GW_MODELS_IDLE + 10; i++) {
    char name[32];
    snprintf(name, sizeof(name), "idle-%03d", i);
    gw_model *o = gw_models_get(&ms, name, (uint64_t)(10 + i));
    gw_model_learn_out(&ms, o, 16, 10, (uint64_t)(10 + i));
  }
  gw_models_trim(&ms);
  assert_int_equal(ms.n, GW_MODELS_IDLE + 1);
  assert_non_null(gw_models_find(&ms, "m"));
  assert_null(gw_models_find(&ms, "idle-000")); /* the least recently used went */
  assert_non_null(gw_models_find(&ms, "idle-073"));
  assert_true(gw_model_expect_out(&ms, m, 300, 128) == 250);
  /* let go of by its job, it is the oldest idle one: the next trim frees it */
  gw_model_unref(m);
  gw_models_get(&ms, "newcomer", 1000);
  gw_models_trim(&ms);
  assert_null(gw_models_find(&ms, "m"));
  /* names are kept sorted: found by bisection */
  for (size_t i = 1; i < ms.n; i++) assert_true(strcmp(ms.m[i - 1]->name, ms.m[i]->name) < 0);
  gw_models_free(&ms);
}

/* The slots kept for short work follow the short work that comes: the fewest with which a
 * short request waits beyond short_s with at most the chosen probability (Erlang C). */
static void test_short_slots_follow_the_short_work(void **state) {
  (void)state;
  /* a light load: 0.072 erlangs of 1.6 s filters: one slot (M/M/1: P(wait) = 0.072, beyond
   * 2 s 0.072 x exp(-0.928 x 2 / 1.6) = 0.023) */
  assert_int_equal(gw_short_slots_for(0.072, 1.6, 2, 0.05, 3), 1);
  /* beyond 0 s: P(wait) itself, 0.072 > 0.05 with one slot, 0.0024 with two */
  assert_int_equal(gw_short_slots_for(0.072, 1.6, 0, 0.05, 3), 2);
  /* a heavy one: 2 erlangs of 0.3 s work need more than 2 slots, capped by the maximum */
  assert_int_equal(gw_short_slots_for(2.0, 0.3, 2, 0.05, 3), 3);
  assert_int_equal(gw_short_slots_for(2.0, 0.3, 2, 0.05, 8), 3);
  assert_int_equal(gw_short_slots_for(2.0, 0.3, 0, 0.05, 8), 6);
  /* a probability of 0: the maximum, a fixed number; none when the maximum is 0 */
  assert_int_equal(gw_short_slots_for(0.01, 1, 2, 0, 3), 3);
  assert_int_equal(gw_short_slots_for(0.01, 1, 2, 0.05, 0), 0);

  gw_model m;
  memset(&m, 0, sizeof(m));
  /* nothing measured yet: the maximum */
  assert_int_equal(gw_model_short_slots(&m, 1000, 60, 2, 0.05, 3), 3);
  /* a filter of 1.6 s every 20 s for two minutes: 0.08 erlangs, one slot */
  for (uint64_t t = 1000; t <= 121000; t += 20000) gw_model_short_note(&m, 1.6, 60, t);
  assert_int_equal(gw_model_short_slots(&m, 121000, 60, 2, 0.05, 3), 1);
  /* then ten a second for ten seconds: 16 erlangs over the last minute's window, the maximum */
  for (uint64_t t = 121100; t <= 131000; t += 100) gw_model_short_note(&m, 1.6, 60, t);
  assert_int_equal(gw_model_short_slots(&m, 131000, 60, 2, 0.05, 3), 3);
  /* ...and it decays back once they stop */
  assert_int_equal(gw_model_short_slots(&m, 131000 + 600000, 60, 2, 0.05, 3), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_phones_follow_events),
    cmocka_unit_test(test_configured_without_phones),
    cmocka_unit_test(test_idle_models_keep_what_they_learned),
    cmocka_unit_test(test_short_slots_follow_the_short_work),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
