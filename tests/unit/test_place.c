/* Unit tests for gateway/place.c, placement's decision, with injected time: demand moves
 * phones (the fastest first), a model with demand keeps a phone, steady demand moves
 * nothing more (no flapping), the phone a quiet model keeps is a slow one (a swap), a minimum stay, hysteresis, the switching budget, pins,
 * exclusions, phones that may not run a model, a switch that would not pay off, and rates
 * predicted for a model a phone never ran. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "place.h"

#define NM 2
#define NP 6

typedef struct fleet {
  gw_place_model m[NM];
  gw_place_phone p[NP];
  double pre[NP][NM], dec[NP][NM];
  unsigned char allowed[NP][NM], holds[NP][NM];
  gw_place_params pp;
  size_t np;
} fleet;

/* Model 0 small (800 MB), model 1 large (9000 MB). Phones 0-1 fast, the rest slow; all on
 * model 0, measured there only. */
static void fleet_init(fleet *f, size_t np) {
  memset(f, 0, sizeof(*f));
  f->np = np;
  f->m[0] = (gw_place_model){.name = "small", .size_mb = 800, .prompt_tokens = 100, .out_tokens = 20};
  f->m[1] = (gw_place_model){.name = "big", .size_mb = 9000, .prompt_tokens = 2000, .out_tokens = 50};
  f->pp = (gw_place_params){.horizon_s = 300, .min_stay_s = 60, .hysteresis = 0.25,
                            .max_switching = 2, .load_mb_s = 1000, .fetch_mb_s = 500};
  for (size_t i = 0; i < np; i++) {
    double speed = i < 2 ? 4 : 1;
    f->pre[i][0] = 400 * speed;
    f->dec[i][0] = 40 * speed;
    f->allowed[i][0] = f->allowed[i][1] = 1;
    f->p[i] = (gw_place_phone){.id = "p", .cur = 0, .want = 0, .pinned = -1, .movable = 1,
                               .since_ms = 0, .slots = 2, .prefill = f->pre[i],
                               .decode = f->dec[i], .allowed = f->allowed[i], .holds = f->holds[i]};
  }
}

/* A pass at now; the moves' phones are then taken as switched (their switch ended). */
static size_t pass(fleet *f, uint64_t now, gw_place_move *mv, size_t cap) {
  size_t n = gw_place_decide(&f->pp, f->m, NM, f->p, f->np, now, mv, cap);
  return n;
}

static void settle(fleet *f, uint64_t now) {
  for (size_t i = 0; i < f->np; i++)
    if (f->p[i].switching) {
      f->p[i].switching = 0;
      f->p[i].cur = f->p[i].want;
      f->p[i].since_ms = now;
    }
}

static void test_fast_phones_first(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, NP);
  f.m[0].demand = 50;    /* a few guards */
  f.m[1].demand = 3000;  /* a large batch for the big model, which no phone runs */
  gw_place_move mv[8];
  size_t n = pass(&f, 100000, mv, 8);
  assert_int_equal(n, 2); /* the switching budget */
  /* the two fast phones go first */
  assert_true(mv[0].phone < 2 && mv[1].phone < 2);
  assert_int_equal(mv[0].to, 1);
  assert_non_null(strstr(mv[0].reason, "no phone"));
  assert_true(mv[0].switch_s > 9000.0 / 500); /* downloaded and loaded */
  /* while they switch no more phones go (the budget), and the small model keeps phones */
  assert_int_equal(pass(&f, 101000, mv, 8), 0);
  settle(&f, 130000);
  /* then slow phones follow, but the small model with demand keeps a steady phone */
  for (uint64_t t = 200000; t < 2000000; t += 100000) {
    pass(&f, t, mv, 8);
    settle(&f, t + 10000);
  }
  size_t on_small = 0;
  for (size_t i = 0; i < NP; i++) on_small += f.p[i].cur == 0;
  assert_true(on_small >= 1);
  assert_true(on_small < NP - 2);
}

static void test_steady_demand_no_flapping(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, NP);
  f.m[0].demand = 400;
  f.m[1].demand = 3000;
  gw_place_move mv[8];
  size_t total = 0;
  for (uint64_t t = 100000; t < 3000000; t += 20000) {
    total += pass(&f, t, mv, 8);
    settle(&f, t + 5000);
  }
  /* it converges: moves stop, and later passes move nothing */
  assert_true(total <= NP);
  for (uint64_t t = 3000000; t < 6000000; t += 20000) {
    assert_int_equal(pass(&f, t, mv, 8), 0);
    settle(&f, t);
  }
}

static void test_back_when_demand_moves(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 4);
  f.m[1].demand = 3000;
  gw_place_move mv[8];
  for (uint64_t t = 100000; t < 1000000; t += 100000) {
    pass(&f, t, mv, 8);
    settle(&f, t + 1000);
  }
  size_t on_big = 0;
  for (size_t i = 0; i < 4; i++) on_big += f.p[i].cur == 1;
  assert_true(on_big >= 3); /* nobody asks for the small model: it need keep none */
  /* night is over: guards again, the batch done but asked for lately (keep) */
  f.m[1].demand = 0;
  f.m[1].keep = 1;
  f.m[0].demand = 20000;
  for (uint64_t t = 1000000; t < 3000000; t += 100000) {
    pass(&f, t, mv, 8);
    settle(&f, t + 1000);
  }
  on_big = 0;
  for (size_t i = 0; i < 4; i++) on_big += f.p[i].cur == 1;
  assert_int_equal(on_big, 1); /* kept one, the rest came back */
  /* no longer asked for: the last one goes too */
  f.m[1].keep = 0;
  pass(&f, 4000000, mv, 8);
  settle(&f, 4000001);
  on_big = 0;
  for (size_t i = 0; i < 4; i++) on_big += f.p[i].cur == 1;
  assert_int_equal(on_big, 0);
}

/* The phone a model keeps (asked for lately, or little demand) is one that does least
 * where the demand is: a fast phone kept there is swapped for a slow one. */
static void test_the_phone_kept_is_a_slow_one(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 4);
  for (size_t i = 0; i < 4; i++) { /* measured on both, both on their disks */
    f.pre[i][1] = f.pre[i][0] / 11;
    f.dec[i][1] = f.dec[i][0] / 11;
    f.holds[i][0] = f.holds[i][1] = 1;
  }
  /* the morning after a night's batch: the fastest phone stayed on the big model the
   * longest (the others left it while its backlog was served) */
  f.p[0].cur = f.p[0].want = 1;
  f.m[1].keep = 1; /* the batch is done, asked for lately */
  f.m[0].demand = 20000;
  gw_place_move mv[8];
  int swapped = 0;
  for (uint64_t t = 100000; t < 3000000; t += 100000) {
    size_t n = pass(&f, t, mv, 8);
    for (size_t k = 0; k < n; k++) swapped |= strstr(mv[k].reason, "takes its place") != NULL;
    settle(&f, t + 1000);
  }
  size_t on_big = 0, fast_on_big = 0;
  for (size_t i = 0; i < 4; i++) {
    on_big += f.p[i].cur == 1;
    fast_on_big += i < 2 && f.p[i].cur == 1;
  }
  assert_int_equal(on_big, 1);
  assert_int_equal(fast_on_big, 0);
  assert_true(swapped);
  /* steady now: the kept slow phone is not swapped back */
  size_t again = 0;
  for (uint64_t t = 3000000; t < 4000000; t += 100000) again += pass(&f, t, mv, 8);
  assert_int_equal(again, 0);
}

static void test_min_stay_and_hysteresis(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, NP);
  f.m[1].demand = 3000;
  for (size_t i = 0; i < NP; i++) f.p[i].since_ms = 100000; /* all joined at 100 s */
  gw_place_move mv[8];
  assert_int_equal(pass(&f, 150000, mv, 8), 0); /* min_stay_s 60 */
  assert_true(pass(&f, 161000, mv, 8) > 0);
  /* nearly balanced (two equal phones each, loads 0.9 and 0.8): nothing moves */
  fleet g;
  fleet_init(&g, 6);
  for (size_t i = 0; i < 6; i++) {
    g.pre[i][0] = g.pre[i][1] = 400;
    g.dec[i][0] = g.dec[i][1] = 40;
  }
  g.p[2].cur = g.p[2].want = g.p[3].cur = g.p[3].want = 1;
  g.p[4].cur = g.p[4].want = g.p[5].cur = g.p[5].want = -1; /* not on a model of these */
  g.p[4].movable = g.p[5].movable = 0;
  double c0 = gw_place_capacity(g.m, NM, g.p, 6, 0, 0);
  double c1 = gw_place_capacity(g.m, NM, g.p, 6, 2, 1);
  g.m[0].demand = 2 * c0 * 300 * 0.9;
  g.m[1].demand = 2 * c1 * 300 * 0.8;
  assert_int_equal(pass(&g, 1000000, mv, 8), 0);
  assert_float_equal(g.m[0].load, 0.9, 1e-9);
  /* far apart (0.9 and 0.2): one phone moves, and not a second back */
  g.m[1].demand = 2 * c1 * 300 * 0.2;
  assert_int_equal(pass(&g, 1000000, mv, 8), 1);
  assert_int_equal(mv[0].to, 0);
  settle(&g, 1000000);
  assert_int_equal(pass(&g, 2000000, mv, 8), 0);
}

static void test_pins_exclusions_allowed(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, NP);
  f.m[1].demand = 3000;
  f.p[5].pinned = 1;   /* a slow phone an operator pins to the big model: at once */
  f.p[5].since_ms = 99000; /* despite the minimum stay */
  f.allowed[0][1] = 0; /* a fast phone too small for the big model */
  gw_place_move mv[8];
  size_t n = pass(&f, 100000, mv, 8);
  assert_true(n >= 1);
  assert_int_equal(mv[0].phone, 5);
  assert_non_null(strstr(mv[0].reason, "pinned"));
  for (size_t i = 0; i < n; i++) assert_int_not_equal(mv[i].phone, 0);
  /* excluded: nobody goes */
  fleet g;
  fleet_init(&g, NP);
  g.m[1].demand = 3000;
  g.m[1].exclude = 1;
  assert_int_equal(pass(&g, 100000, mv, 8), 0);
  /* a switch longer than the horizon does not pay off */
  fleet h;
  fleet_init(&h, NP);
  h.m[1].demand = 3000;
  h.pp.fetch_mb_s = 10; /* 900 s to download */
  assert_int_equal(pass(&h, 100000, mv, 8), 0);
  /* unless the phone holds the file */
  h.holds[3][1] = 1;
  n = pass(&h, 100000, mv, 8);
  assert_int_equal(n, 1);
  assert_int_equal(mv[0].phone, 3);
}

static void test_predicted_rates(void **state) {
  (void)state;
  fleet f;
  fleet_init(&f, 3);
  double pre, dec;
  /* nobody ran the big model: by the files' sizes */
  gw_place_rates(f.m, NM, f.p, 3, 0, 1, &pre, &dec);
  assert_float_equal(dec, 160 * 800.0 / 9000, 1e-9);
  /* one phone ran both: the fleet's ratio (its big / its small) scales the others */
  f.pre[2][1] = 100;
  f.dec[2][1] = 4; /* phone 2: 40 on small, 4 on big: the big model is 10x slower */
  gw_place_rates(f.m, NM, f.p, 3, 0, 1, &pre, &dec);
  assert_float_equal(dec, 160 * 4.0 / 40, 1e-9); /* medians: small 160 (of 160,160,40), big 4 */
  /* its own measurement wins */
  gw_place_rates(f.m, NM, f.p, 3, 2, 1, &pre, &dec);
  assert_float_equal(dec, 4, 1e-9);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fast_phones_first),
      cmocka_unit_test(test_steady_demand_no_flapping),
      cmocka_unit_test(test_back_when_demand_moves),
      cmocka_unit_test(test_the_phone_kept_is_a_slow_one),
      cmocka_unit_test(test_min_stay_and_hysteresis),
      cmocka_unit_test(test_pins_exclusions_allowed),
      cmocka_unit_test(test_predicted_rates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
