/* Unit tests for gateway/healthsched.c with injected time: a small discrete-event fleet
 * (phones whose probes answer after a round trip, or never once they hang; answers whose
 * bytes flow; heartbeats) drives the heap as health.c's timer does. It checks the order of
 * the visits, that an idle fleet costs the probes due and not its size, that a busy phone
 * sending bytes is not probed for being busy while a silent one is, that a phone hung
 * before its first byte is still found within busy_interval_s x 1.2 + late_s, and the
 * rules for heartbeats and late verdicts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "healthsched.h"

#define NEVER GW_HSCHED_NEVER

static char *models[] = {"m"};

/* One simulated phone. */
typedef struct phone {
  gw_replica *r;
  pr_heap_node ev;       /* its next event (a probe's answer, an answer's byte) in fleet.events */
  uint64_t rtt_ms;       /* how long its probes take to answer */
  uint64_t hung_at;      /* from then on: no byte, no answer (NEVER: it never hangs) */
  uint64_t answer_at;    /* when its probe in flight answers (NEVER: none, or never) */
  uint64_t byte_every;   /* while it has work: a byte of an answer every this many ms (0: none) */
  uint64_t next_byte;
  unsigned probes, lates, overdue;
  uint64_t first_late_ms, last_probe_ms;
} phone;

typedef struct fleet {
  pr_heap heap, events;
  gw_config c;
  phone *p;
  size_t n;
  uint64_t now, visits;
  uint32_t seed;
  uint64_t order[16]; /* the first visits' phone numbers, in order */
  size_t n_order;
} fleet;

static phone *phone_of(fleet *f, const gw_replica *r) { return &f->p[atoi(r->id + 1)]; }

static uint16_t rnd16(fleet *f) {
  f->seed = f->seed * 1103515245u + 12345u;
  return (uint16_t)(f->seed >> 16);
}

static void event_rekey(fleet *f, phone *p) {
  uint64_t at = p->answer_at < p->next_byte ? p->answer_at : p->next_byte;
  if (at == NEVER) pr_heap_remove(&f->events, &p->ev);
  else assert_int_equal(pr_heap_set(&f->events, &p->ev, at), 0);
}

static int op_probe(void *ud, gw_replica *r, uint64_t now) {
  fleet *f = ud;
  phone *p = phone_of(f, r);
  gw_hsched_probe_sent(r, now, 1);
  p->probes++;
  p->last_probe_ms = now;
  if (f->n_order < 16) f->order[f->n_order++] = (uint64_t)(p - f->p);
  p->answer_at = now >= p->hung_at ? NEVER : now + p->rtt_ms;
  event_rekey(f, p);
  return 0;
}

static void op_late(void *ud, gw_replica *r, uint64_t now) {
  phone *p = phone_of(ud, r);
  if (!p->lates++) p->first_late_ms = now;
}

static void op_overdue(void *ud, gw_replica *r, uint64_t now) {
  phone_of(ud, r)->overdue++;
  gw_replica_set_state(r, GW_REPLICA_DOWN, now, "no heartbeat");
}

static const gw_hsched_ops ops = {.probe = op_probe, .late = op_late, .heartbeat_overdue = op_overdue};

/* interval 5 s, busy 1 s, late 1 s, timeout 3 s, down 15 s, heartbeats 15 s */
static void fleet_init(fleet *f, size_t n) {
  memset(f, 0, sizeof(*f));
  f->c.health_interval_s = 5;
  f->c.health_busy_interval_s = 1;
  f->c.health_late_s = 1;
  f->c.health_timeout_s = 3;
  f->c.health_down_interval_s = 15;
  f->c.heartbeat_timeout_s = 15;
  f->seed = 42;
  f->n = n;
  f->p = calloc(n, sizeof(*f->p));
  assert_non_null(f->p);
  f->now = 1000;
  for (size_t i = 0; i < n; i++) {
    char id[16];
    snprintf(id, sizeof(id), "p%zu", i);
    phone *p = &f->p[i];
    p->r = gw_replica_new(id, "http://127.0.0.1:1", NULL, models, 1, 4, 0, 100, 10, 0);
    assert_non_null(p->r);
    gw_replica_set_state(p->r, GW_REPLICA_READY, 0, "test");
    p->rtt_ms = 5;
    p->hung_at = p->answer_at = p->next_byte = NEVER;
    /* each first probe at a moment of its own in the first interval, as after a start */
    p->r->health.next_probe_ms = p->r->health.next_busy_probe_ms = f->now + (uint64_t)(rnd16(f) % 5000);
    assert_int_equal(gw_hsched_add(&f->heap, p->r), 0);
    gw_hsched_update(&f->heap, &f->c, p->r);
  }
}

static void fleet_free(fleet *f) {
  for (size_t i = 0; i < f->n; i++) gw_replica_free(f->p[i].r);
  free(f->p);
  pr_heap_free(&f->heap);
  pr_heap_free(&f->events);
}

/* A request on p from now on; its answer's bytes every byte_every ms (0: none yet). */
static void busy(fleet *f, phone *p, uint64_t byte_every) {
  gw_replica_acquire(p->r, f->now, 600000, NULL);
  p->byte_every = byte_every;
  p->next_byte = byte_every ? f->now + byte_every : NEVER;
  event_rekey(f, p);
  gw_hsched_update(&f->heap, &f->c, p->r); /* health.c does this at GW_FLEET_SENT */
}

/* Run the fleet until `until`: at each moment, the phones' events, then health's visits,
 * as health.c's timer runs them. */
static void run(fleet *f, uint64_t until) {
  for (;;) {
    uint64_t h = gw_hsched_earliest(&f->heap);
    const pr_heap_node *e = pr_heap_min(&f->events);
    uint64_t at = e && e->key < h ? e->key : h;
    if (at > until) break;
    if (at > f->now) f->now = at;
    while ((e = pr_heap_min(&f->events)) && e->key <= f->now) {
      phone *p = (phone *)((char *)e - offsetof(phone, ev));
      if (p->answer_at <= f->now && f->now >= p->hung_at) { /* hung meanwhile: it never will */
        p->answer_at = NEVER;
      } else if (p->answer_at <= f->now) { /* its probe answered */
        p->answer_at = NEVER;
        gw_replica_alive(p->r, f->now);
        gw_hsched_probe_over(p->r);
        uint16_t rnd[2] = {rnd16(f), rnd16(f)};
        gw_hsched_probe_ended(&f->c, p->r, f->now, gw_hsched_idle_interval_s(&f->c, f->n), rnd); /* as health.c */
        gw_hsched_update(&f->heap, &f->c, p->r);
      }
      if (p->next_byte <= f->now) { /* a byte of its answer */
        if (f->now >= p->hung_at) {
          p->next_byte = NEVER;
        } else {
          gw_replica_alive(p->r, f->now); /* upstream.c's on_write */
          p->next_byte = f->now + p->byte_every;
        }
      }
      event_rekey(f, p);
    }
    gw_hsched_run(&f->heap, &f->c, f->now, 1, &ops, f, &f->visits);
  }
  f->now = until;
}

static void test_visits_come_in_the_order_due(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 6);
  uint64_t due[6] = {4000, 1500, 3000, 1500, 2500, 9000};
  for (size_t i = 0; i < 6; i++) {
    f.p[i].r->health.next_probe_ms = due[i];
    gw_hsched_update(&f.heap, &f.c, f.p[i].r);
  }
  assert_int_equal(gw_hsched_earliest(&f.heap), 1500);
  /* nothing is done before its moment */
  assert_int_equal(gw_hsched_run(&f.heap, &f.c, 1499, 1, &ops, &f, &f.visits), 0);
  assert_int_equal(f.visits, 0);
  run(&f, 4500);
  assert_int_equal(f.n_order, 5);
  assert_true((f.order[0] == 1 && f.order[1] == 3) || (f.order[0] == 3 && f.order[1] == 1));
  assert_int_equal(f.order[2], 4);
  assert_int_equal(f.order[3], 2);
  assert_int_equal(f.order[4], 0);
  assert_int_equal(f.p[5].probes, 0); /* not due yet */
  for (size_t i = 0; i < 5; i++) assert_int_equal(f.p[i].last_probe_ms, due[i]); /* at its moment */
  fleet_free(&f);
}

static void test_an_idle_fleet_costs_its_probes_not_its_size(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 6000);
  run(&f, 1000 + 60000);
  uint64_t probes = 0;
  for (size_t i = 0; i < f.n; i++) probes += f.p[i].probes;
  /* one probe per phone every 5 s (±20 %): 72,000 in a minute */
  assert_true(probes > 64000 && probes < 80000);
  /* each visit started a probe: nothing was scanned for nothing (a 100 ms tick over every
   * phone would have looked 3,600,000 times) */
  assert_int_equal(f.visits, probes);
  fleet_free(&f);
}

static void test_a_busy_phone_is_probed_while_nothing_is_heard_from_it(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 3);
  busy(&f, &f.p[0], 200); /* a stream: a chunk every 200 ms */
  busy(&f, &f.p[1], 0);   /* a long prefill, or a whole answer: nothing until the end */
  /* p[2] idle */
  run(&f, 1000 + 30000);
  /* the stream's bytes are its proof of life: only its regular checks (every 5 s) */
  assert_true(f.p[0].probes >= 5 && f.p[0].probes <= 8);
  /* nothing heard: checked every busy_interval_s (1 s ±20 %) */
  assert_true(f.p[1].probes >= 22 && f.p[1].probes <= 32);
  assert_true(f.p[2].probes >= 5 && f.p[2].probes <= 8);
  assert_int_equal(f.p[0].lates + f.p[1].lates + f.p[2].lates, 0);
  fleet_free(&f);
}

/* p hangs at t (no byte, no answer): found late within busy 1 s x 1.2 + late 1 s (+ the
 * turn the verdict waits), whether or not bytes flowed before */
static void hung_is_found(uint64_t byte_every) {
  fleet f;
  fleet_init(&f, 2);
  busy(&f, &f.p[0], byte_every);
  run(&f, 10000);
  assert_int_equal(f.p[0].lates, 0);
  uint64_t t = 10000 + 321;
  f.p[0].hung_at = t;
  run(&f, 30000);
  assert_int_equal(f.p[0].lates, 1);
  assert_true(f.p[0].first_late_ms > t);
  assert_true(f.p[0].first_late_ms - t <= 1200 + 1000 + 2);
  assert_int_equal(f.p[1].lates, 0);
  fleet_free(&f);
}

static void test_a_phone_hung_before_its_first_byte_is_found_as_fast(void **state) {
  (void)state;
  hung_is_found(0);   /* waiting for its first byte: probed every second, as before */
  hung_is_found(150); /* its stream stops: the probe goes out a second after the last byte */
}

static void test_heartbeats_are_proof_only_with_the_requests_on_them(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 2);
  busy(&f, &f.p[0], 0);
  busy(&f, &f.p[1], 0);
  /* both phones' agents heartbeat every 500 ms; p0's counts its request, p1's does not
   * (it never got there) */
  for (uint64_t t = f.now + 500; t <= 31000; t += 500) {
    run(&f, t);
    f.p[0].r->report.last_heartbeat_ms = f.p[1].r->report.last_heartbeat_ms = t;
    gw_hsched_heartbeat(f.p[0].r, 1);
    gw_hsched_heartbeat(f.p[1].r, 0);
    gw_hsched_update(&f.heap, &f.c, f.p[0].r);
    gw_hsched_update(&f.heap, &f.c, f.p[1].r);
  }
  assert_true(f.p[0].probes <= 8);  /* its regular checks only */
  assert_true(f.p[1].probes >= 22); /* every second, as if no heartbeat came */
  assert_int_equal(f.p[0].overdue + f.p[1].overdue, 0);
  fleet_free(&f);
}

static void test_heartbeats_that_stop_take_a_phone_out_at_their_limit(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 1);
  f.c.health_interval_s = 0; /* no active checks: the heartbeats' limit still falls due */
  gw_replica *r = f.p[0].r;
  r->report.last_heartbeat_ms = 2000;
  gw_hsched_update(&f.heap, &f.c, r);
  assert_int_equal(gw_hsched_earliest(&f.heap), 2000 + 15000 + 1);
  gw_hsched_run(&f.heap, &f.c, 17000, 1, &ops, &f, NULL); /* 15 s: not more than the limit */
  assert_int_equal(f.p[0].overdue, 0);
  gw_hsched_run(&f.heap, &f.c, 17001, 1, &ops, &f, NULL);
  assert_int_equal(f.p[0].overdue, 1);
  assert_int_equal(r->state, GW_REPLICA_DOWN);
  assert_int_equal(gw_hsched_earliest(&f.heap), NEVER); /* down: nothing more to do */
  assert_int_equal(f.p[0].probes, 0);
  fleet_free(&f);
}

static void test_a_late_verdict_waits_a_turn_and_yields_to_proof_of_life(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 1);
  gw_replica *r = f.p[0].r;
  gw_hsched_probe_sent(r, 5000, 1);
  gw_hsched_update(&f.heap, &f.c, r);
  assert_int_equal(gw_hsched_earliest(&f.heap), 6000); /* late_s after it went out */
  /* at its moment the verdict waits one loop turn (an answer may be there unread) */
  assert_int_equal(gw_hsched_run(&f.heap, &f.c, 6000, 1, &ops, &f, NULL), 0);
  assert_int_equal(r->health.probe_late_ms, 0);
  assert_int_equal(gw_hsched_earliest(&f.heap), 6001);
  assert_int_equal(gw_hsched_run(&f.heap, &f.c, 6001, 1, &ops, &f, NULL), 1);
  assert_int_equal(r->health.probe_late_ms, 6001);
  assert_true(gw_replica_suspect(r));
  assert_int_equal(gw_hsched_earliest(&f.heap), NEVER); /* late once; its end is curl's */
  gw_hsched_probe_over(r);
  assert_false(gw_replica_suspect(r));

  /* a byte of an answer after the probe went out: the bound counts from that byte */
  gw_hsched_probe_sent(r, 10000, 1);
  gw_replica_alive(r, 10700);
  gw_hsched_update(&f.heap, &f.c, r);
  assert_int_equal(gw_hsched_earliest(&f.heap), 11700);
  /* ...also when it comes while the verdict waits its turn */
  gw_hsched_run(&f.heap, &f.c, 11700, 1, &ops, &f, NULL);
  assert_int_equal(r->health.probe_due_ms, 11700);
  gw_replica_alive(r, 11700);
  assert_int_equal(gw_hsched_run(&f.heap, &f.c, 11701, 1, &ops, &f, NULL), 0);
  assert_int_equal(r->health.probe_late_ms, 0);
  assert_int_equal(gw_hsched_earliest(&f.heap), 12700);
  /* late_s 0: never late */
  f.c.health_late_s = 0;
  gw_hsched_update(&f.heap, &f.c, r);
  assert_int_equal(gw_hsched_late_at(&f.c, r), NEVER);
  fleet_free(&f);
}

/* health.idle_probes_per_s: the idle interval grows with the fleet past interval_s x the
 * budget, and only then */
static void test_the_idle_interval_follows_the_fleet(void **state) {
  (void)state;
  gw_config c = {.health_interval_s = 5, .health_idle_probes_per_s = 250};
  assert_true(gw_hsched_idle_interval_s(&c, 12) == 5);
  assert_true(gw_hsched_idle_interval_s(&c, 1250) == 5);
  assert_true(gw_hsched_idle_interval_s(&c, 6000) == 24);
  c.health_idle_probes_per_s = 0; /* no cap */
  assert_true(gw_hsched_idle_interval_s(&c, 6000) == 5);
  c.health_idle_probes_per_s = 250;
  c.health_interval_s = 0; /* active checks off stay off */
  assert_true(gw_hsched_idle_interval_s(&c, 6000) == 0);
}

/* 6,000 idle phones at idle_probes_per_s 250: about 250 probes a second (not 1,200), and a
 * phone with a request on it among them is still probed every busy_interval_s while
 * nothing is heard from it, and found hung as fast as in a small fleet. */
static void test_a_large_idle_fleet_keeps_to_its_probe_budget(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 6000);
  f.c.health_idle_probes_per_s = 250;
  busy(&f, &f.p[0], 0); /* nothing until the end */
  run(&f, 1000 + 120000);
  uint64_t probes = 0;
  for (size_t i = 1; i < f.n; i++) probes += f.p[i].probes;
  /* the first round (every phone within 5 s, as set up), then every 24 s ±20 %: 6,000 +
   * about 6,000 x 115 / 24 = 28,750 in two minutes */
  assert_true(probes > 31000 && probes < 38500);
  assert_true(f.p[0].probes >= 90); /* every 1 s ±20 % */
  uint64_t t = f.now + 321;
  run(&f, t);
  f.p[0].hung_at = t;
  run(&f, t + 10000);
  assert_int_equal(f.p[0].lates, 1);
  assert_true(f.p[0].first_late_ms - t <= 1200 + 1000 + 2);
  fleet_free(&f);
}

static void test_the_busy_gap_and_the_next_probe_carry_jitter(void **state) {
  (void)state;
  gw_config c = {.health_interval_s = 5, .health_busy_interval_s = 1};
  gw_replica *r = gw_replica_new("p0", "http://127.0.0.1:1", NULL, models, 1, 1, 0, 100, 10, 0);
  const uint16_t lo[2] = {0, 0}, hi[2] = {65535, 65535};
  gw_hsched_probe_ended(&c, r, 1000, 5, lo);
  assert_int_equal(r->health.next_probe_ms, 1000 + 4000);
  assert_int_equal(r->health.busy_gap_ms, 800);
  gw_hsched_probe_ended(&c, r, 1000, 5, hi);
  assert_int_equal(r->health.next_probe_ms, 1000 + 6000);
  assert_int_equal(r->health.busy_gap_ms, 1200);
  /* busy_interval_s at or over interval_s: a busy phone is checked as an idle one */
  c.health_busy_interval_s = 10;
  gw_hsched_probe_ended(&c, r, 1000, 5, hi);
  assert_int_equal(r->health.next_busy_probe_ms, r->health.next_probe_ms);
  /* no busy checks while it is down (every down_interval_s) */
  gw_replica_acquire(r, 1000, 1000, NULL);
  gw_replica_set_state(r, GW_REPLICA_DOWN, 1000, "test");
  c.health_busy_interval_s = 1;
  gw_hsched_probe_ended(&c, r, 1000, 15, lo);
  assert_int_equal(gw_hsched_probe_due(&c, r), 1000 + 12000);
  gw_replica_set_state(r, GW_REPLICA_READY, 1000, "test");
  assert_int_equal(gw_hsched_probe_due(&c, r), 1000 + 800);
  /* removed from the configuration: no more probes */
  gw_replica_held_set(r, GW_HELD_REMOVED, 1);
  assert_int_equal(gw_hsched_probe_due(&c, r), NEVER);
  gw_replica_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_visits_come_in_the_order_due),
      cmocka_unit_test(test_an_idle_fleet_costs_its_probes_not_its_size),
      cmocka_unit_test(test_a_busy_phone_is_probed_while_nothing_is_heard_from_it),
      cmocka_unit_test(test_a_phone_hung_before_its_first_byte_is_found_as_fast),
      cmocka_unit_test(test_heartbeats_are_proof_only_with_the_requests_on_them),
      cmocka_unit_test(test_heartbeats_that_stop_take_a_phone_out_at_their_limit),
      cmocka_unit_test(test_a_late_verdict_waits_a_turn_and_yields_to_proof_of_life),
      cmocka_unit_test(test_the_busy_gap_and_the_next_probe_carry_jitter),
      cmocka_unit_test(test_the_idle_interval_follows_the_fleet),
      cmocka_unit_test(test_a_large_idle_fleet_keeps_to_its_probe_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
