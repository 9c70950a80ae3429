/* Unit tests for gateway/queue.c: weighted fair queueing (a caller's burst does not
 * starve a caller with a trickle; weights share the class), retries at the very front,
 * both classes, counts by model, and unlinking from the head, the middle and the tail —
 * once: a second removal must leave the rest of the queue alone. Shortest predicted work
 * first within a caller's flow, with aging (injected arrival times): short passes long,
 * a long job is passed only within its aging window, and shares between callers hold. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "auth.h"
#include "gw.h"
#include "queue.h"

#define N 32

static gw_job jobs[N];
static gw_caller callers[2];
static gw_key_conf keys[2];

static gw_job *job(int i, int caller, int prio, const char *model) {
  gw_job *j = &jobs[i];
  memset(j, 0, sizeof(*j));
  j->prio = prio;
  j->caller = caller >= 0 ? &callers[caller] : NULL;
  j->oai.model = model;
  snprintf(j->id, sizeof(j->id), "j%d", i);
  return j;
}

static void setup_callers(double w0, double w1) {
  memset(callers, 0, sizeof(callers));
  memset(keys, 0, sizeof(keys));
  keys[0].name = "a";
  keys[0].weight = w0;
  keys[1].name = "b";
  keys[1].weight = w1;
  callers[0].conf = &keys[0];
  callers[1].conf = &keys[1];
}

/* The ids in class p, head to tail, as "j1 j2 ...". */
static const char *order(const gw_queue *q, int p) {
  static char out[512];
  out[0] = '\0';
  for (const gw_job *j = q->head[p]; j; j = j->qnext) {
    if (out[0]) strcat(out, " ");
    strcat(out, j->id);
    if (j->qnext) assert_ptr_equal(j->qnext->qprev, j);
    else assert_ptr_equal(q->tail[p], j);
  }
  return out;
}

static void enqueue(gw_queue *q, gw_job *j) {
  gw_queue_tag(q, j);
  assert_int_equal(gw_queue_insert(q, j, 0), 0);
}

/* What a planning pass does: the head goes out, and the class's tag moves on. */
static gw_job *dispatch(gw_queue *q, int p) {
  gw_job *j = q->head[p];
  assert_non_null(j);
  assert_int_equal(gw_queue_unlink(q, j), 0);
  if (j->tag > q->vtime[p]) q->vtime[p] = j->tag;
  return j;
}

static void test_a_burst_does_not_starve_a_trickle(void **state) {
  (void)state;
  setup_callers(1, 1);
  gw_queue q;
  memset(&q, 0, sizeof(q));
  for (int i = 0; i < 6; i++) enqueue(&q, job(i, 0, GW_PRIO_INTERACTIVE, "m")); /* a's burst */
  enqueue(&q, job(10, 1, GW_PRIO_INTERACTIVE, "m"));                        /* b arrives late */
  enqueue(&q, job(11, 1, GW_PRIO_INTERACTIVE, "m"));
  /* b's two slot in next to a's first ones, not after all six */
  assert_string_equal(order(&q, 0), "j0 j10 j1 j11 j2 j3 j4 j5");
  assert_int_equal(q.len, 8);
  /* after some of a's run, a new b job still gets the next turn */
  assert_string_equal(dispatch(&q, 0)->id, "j0");
  assert_string_equal(dispatch(&q, 0)->id, "j10");
  assert_string_equal(dispatch(&q, 0)->id, "j1");
  enqueue(&q, job(12, 1, GW_PRIO_INTERACTIVE, "m"));
  assert_string_equal(order(&q, 0), "j11 j2 j12 j3 j4 j5");
}

static void test_weights_share_the_class(void **state) {
  (void)state;
  setup_callers(2, 1); /* a gets two turns for each of b's */
  gw_queue q;
  memset(&q, 0, sizeof(q));
  for (int i = 0; i < 6; i++) enqueue(&q, job(i, 0, GW_PRIO_INTERACTIVE, "m"));
  for (int i = 10; i < 13; i++) enqueue(&q, job(i, 1, GW_PRIO_INTERACTIVE, "m"));
  /* tags: a 0, .5, 1, 1.5, 2, 2.5; b 0, 1, 2 (ties keep arrival order) */
  assert_string_equal(order(&q, 0), "j0 j10 j1 j2 j11 j3 j4 j12 j5");
}

static void test_no_callers_is_arrival_order_and_retries_go_first(void **state) {
  (void)state;
  gw_queue q;
  memset(&q, 0, sizeof(q));
  for (int i = 0; i < 4; i++) enqueue(&q, job(i, -1, GW_PRIO_INTERACTIVE, i % 2 ? "x" : "m"));
  assert_string_equal(order(&q, 0), "j0 j1 j2 j3");
  gw_job *r = dispatch(&q, 0);
  assert_int_equal(gw_queue_insert(&q, r, 1), 0); /* failed: back to the very front */
  assert_string_equal(order(&q, 0), "j0 j1 j2 j3");
  assert_int_equal(gw_queue_insert(&q, r, 1), -EEXIST); /* never twice */
  assert_string_equal(order(&q, 0), "j0 j1 j2 j3");
  /* batch jobs wait in their own class; counts see both */
  enqueue(&q, job(20, -1, GW_PRIO_BATCH, "m"));
  assert_string_equal(order(&q, GW_PRIO_BATCH), "j20");
  assert_int_equal(gw_queue_count(&q, "m"), 3);
  assert_int_equal(gw_queue_count(&q, "x"), 2);
  assert_int_equal(q.len, 5);
}

static void test_unlink_anywhere_once(void **state) {
  (void)state;
  gw_queue q;
  memset(&q, 0, sizeof(q));
  for (int i = 0; i < 5; i++) enqueue(&q, job(i, -1, GW_PRIO_INTERACTIVE, "m"));
  assert_int_equal(gw_queue_unlink(&q, &jobs[2]), 0); /* middle */
  assert_string_equal(order(&q, 0), "j0 j1 j3 j4");
  assert_int_equal(gw_queue_unlink(&q, &jobs[0]), 0); /* head */
  assert_int_equal(gw_queue_unlink(&q, &jobs[4]), 0); /* tail */
  assert_string_equal(order(&q, 0), "j1 j3");
  /* a second removal (an expired job answered, then finished) changes nothing */
  assert_int_equal(gw_queue_unlink(&q, &jobs[0]), -ENOENT);
  assert_int_equal(gw_queue_unlink(&q, &jobs[2]), -ENOENT);
  assert_int_equal(gw_queue_unlink(&q, &jobs[4]), -ENOENT);
  assert_string_equal(order(&q, 0), "j1 j3");
  assert_int_equal(q.len, 2);
  assert_false(gw_queue_has(&q, &jobs[0]));
  assert_true(gw_queue_has(&q, &jobs[1]) && gw_queue_has(&q, &jobs[3]));
  assert_int_equal(gw_queue_unlink(&q, &jobs[1]), 0);
  assert_int_equal(gw_queue_unlink(&q, &jobs[3]), 0);
  assert_null(q.head[0]);
  assert_null(q.tail[0]);
  assert_int_equal(q.len, 0);
}

/* A job as job.c makes it: arrival at t ms, predicted service svc_s, aging factor k. */
static gw_job *sjf(int i, int caller, uint64_t t, double svc_s, double k) {
  gw_job *j = job(i, caller, GW_PRIO_INTERACTIVE, "m");
  j->arrival_ms = t;
  j->ready = (double)t + k * svc_s * 1000.0;
  return j;
}

static void test_short_work_passes_long_work(void **state) {
  (void)state;
  gw_queue q;
  memset(&q, 0, sizeof(q));
  enqueue(&q, sjf(0, -1, 0, 180, 4));   /* a 7k-token review: 3 minutes */
  enqueue(&q, sjf(1, -1, 10, 180, 4));
  enqueue(&q, sjf(2, -1, 20, 0.1, 4));  /* a 100-token filter */
  enqueue(&q, sjf(3, -1, 30, 60, 4));
  enqueue(&q, sjf(4, -1, 40, 0.2, 4));
  assert_string_equal(order(&q, 0), "j2 j4 j3 j0 j1");
  /* the flow's tags stay where they were, in ready order */
  double t = -1;
  for (const gw_job *j = q.head[0]; j; j = j->qnext) {
    assert_true(j->tag > t);
    t = j->tag;
  }
  assert_int_equal(q.len, 5);
  /* a retry at the front is neither passed nor moved */
  gw_job *r = dispatch(&q, 0);
  assert_string_equal(r->id, "j2");
  assert_int_equal(gw_queue_insert(&q, r, 1), 0);
  enqueue(&q, sjf(5, -1, 50, 0.05, 4));
  assert_string_equal(order(&q, 0), "j2 j5 j4 j3 j0 j1");
}

static void test_aging_factor_zero_is_arrival_order(void **state) {
  (void)state;
  gw_queue q;
  memset(&q, 0, sizeof(q));
  enqueue(&q, sjf(0, -1, 0, 180, 0));
  enqueue(&q, sjf(1, -1, 10, 0.1, 0));
  enqueue(&q, sjf(2, -1, 20, 60, 0));
  enqueue(&q, sjf(3, -1, 20, 0.1, 0)); /* same arrival: arrival order still */
  assert_string_equal(order(&q, 0), "j0 j1 j2 j3");
}

/* Under overload (one short job arrives per step and one job leaves per step), the long
 * job is passed only by short jobs that arrive less than k x its predicted time after it,
 * and then runs: its wait is bounded, not starved. */
static void test_aging_bounds_the_wait_of_long_work(void **state) {
  (void)state;
  static gw_job many[200];
  gw_queue q;
  memset(&q, 0, sizeof(q));
  const double k = 4, long_s = 10; /* passed by arrivals within 40 s */
  enqueue(&q, sjf(0, -1, 0, long_s, k));
  enqueue(&q, sjf(1, -1, 0, 0.1, k)); /* a short one already there goes first */
  uint64_t long_out = 0;
  int passed_after = 0;
  for (int step = 1; step < 200 && !long_out; step++) {
    uint64_t t = (uint64_t)step * 500;
    gw_job *s = &many[step];
    memset(s, 0, sizeof(*s));
    s->prio = GW_PRIO_INTERACTIVE;
    s->oai.model = "m";
    snprintf(s->id, sizeof(s->id), "s%d", step);
    s->arrival_ms = t;
    s->ready = (double)t + k * 0.1 * 1000.0;
    enqueue(&q, s);
    gw_job *d = dispatch(&q, 0);
    if (d == &jobs[0]) long_out = t;
    else if (d->arrival_ms + 0.4 * 1000 > 40000) passed_after++; /* ready after the long one */
  }
  assert_true(long_out > 0);
  /* the shorts that arrived in its 40 s window went first; then its turn came */
  assert_true(long_out >= 39000);
  assert_true(long_out <= 41000);
  assert_int_equal(passed_after, 0);
}

/* Shortest work first reorders a caller's own jobs only: a flow of long jobs keeps its
 * share against a flow of short ones, and a caller's short job moves ahead of its own
 * long ones, not of another caller's turn. */
static void test_fair_shares_hold_with_shortest_first(void **state) {
  (void)state;
  setup_callers(1, 1);
  gw_queue q;
  memset(&q, 0, sizeof(q));
  for (int i = 0; i < 4; i++) {
    gw_job *j = sjf(i, 0, (uint64_t)i, 100, 4); /* a: long reviews */
    j->caller = &callers[0];
    enqueue(&q, j);
  }
  gw_job *j = sjf(4, 0, 4, 0.1, 4); /* a's short filter */
  j->caller = &callers[0];
  enqueue(&q, j);
  for (int i = 10; i < 13; i++) {
    gw_job *b = sjf(i, 1, (uint64_t)i, 0.05, 4); /* b: shorter still */
    b->caller = &callers[1];
    enqueue(&q, b);
  }
  /* tags: a 0 1 2 3 4 in ready order (j4 first), b 0 1 2; ties keep arrival order */
  assert_string_equal(order(&q, 0), "j4 j10 j0 j11 j1 j12 j2 j3");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_a_burst_does_not_starve_a_trickle),
    cmocka_unit_test(test_weights_share_the_class),
    cmocka_unit_test(test_no_callers_is_arrival_order_and_retries_go_first),
    cmocka_unit_test(test_unlink_anywhere_once),
    cmocka_unit_test(test_short_work_passes_long_work),
    cmocka_unit_test(test_aging_factor_zero_is_arrival_order),
    cmocka_unit_test(test_aging_bounds_the_wait_of_long_work),
    cmocka_unit_test(test_fair_shares_hold_with_shortest_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
