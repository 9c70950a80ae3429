/* Unit tests for gateway/capacity.c: Erlang C and the wait's quantile against values
 * worked out by hand (M/M/1, two servers), and Allen-Cunneen's G/G/c scaling of them; the
 * Poisson quantile; the answers' measured variability scaling the advice's waits (and
 * Erlang C until enough answers are measured); the rate now planned at its upper bound; the advice for a load a
 * fleet cannot carry (the phones it says to add meet the targets, one fewer does not);
 * churn adding phones; the cheapest class chosen; the seed's nightly batch (50,000 reviews
 * of 7,000 tokens on the 9B by 06:00); idle phones released with their saving; reviews no
 * phone can answer in time said to be unreachable. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "capacity.h"

static void near(double got, double want, double tol) {
  if (fabs(got - want) > tol) fail_msg("got %.12g, want %.12g", got, want);
}

static void test_erlang_c_and_quantiles(void **state) {
  (void)state;
  near(gw_cap_erlang_c(2, 1), 1.0 / 3, 1e-12);
  near(gw_cap_erlang_c(1, 0.5), 0.5, 1e-12); /* M/M/1: P(wait) = rho */
  near(gw_cap_erlang_c(3, 3), 1, 0);
  /* M/M/1, rho 0.5, service 1 s: P(W > t) = 0.5 e^{-0.5 t}; 95 %: t = 2 ln 10 */
  near(gw_cap_wait_quantile(1, 0.5, 1, 0.95), 2 * log(10), 1e-9);
  near(gw_cap_wait_quantile(2, 1, 1, 0.5), 0, 0); /* a third wait: the median is 0 */
  assert_true(isinf(gw_cap_wait_quantile(2, 2, 1, 0.95)));
  assert_int_equal(gw_cap_poisson_quantile(0, 0.95), 0);
  assert_int_equal(gw_cap_poisson_quantile(1, 0.95), 3); /* P(<=2) 0.920, P(<=3) 0.981 */
  assert_int_equal(gw_cap_poisson_quantile(1, 0.9), 2);
}

/* Allen-Cunneen: Erlang C's mean wait and its quantile scaled by (Ca^2 + Cs^2) / 2. By hand:
 * two servers at 1 erlang, service 1 s: C = 1/3, M/M/2's mean wait C S / (c - a) = 1/3 s,
 * 90 % not passed S / (c - a) ln(C / 0.1) = ln(10/3) s; three servers at 2 erlangs, service
 * 0.25 s: Erlang B 0.8 / 3.8, C = 4/9, mean wait 1/9 s, 90 %: 0.25 ln(40/9) s. */
static void test_allen_cunneen(void **state) {
  (void)state;
  near(gw_cap_ac_scale(1, 1), 1, 0);
  near(gw_cap_ac_scale(1, 0.5), 0.75, 1e-15);
  near(gw_cap_ac_scale(0, 0), 0, 0); /* D/D/c: no wait */
  near(gw_cap_erlang_c(3, 2), 4.0 / 9, 1e-12);
  /* exponential answers (Cs^2 = 1): Erlang C itself */
  near(gw_cap_wait_mean_ac(2, 1, 1, 1, 1), 1.0 / 3, 1e-12);
  near(gw_cap_wait_quantile_ac(2, 1, 1, 0.9, 1, 1), gw_cap_wait_quantile(2, 1, 1, 0.9), 0);
  near(gw_cap_wait_quantile(2, 1, 1, 0.9), 1.2039728043259361, 1e-12); /* ln(10/3) */
  /* answers half as variable (Cs^2 = 0.5): three quarters of it */
  near(gw_cap_wait_mean_ac(2, 1, 1, 1, 0.5), 0.25, 1e-12);
  near(gw_cap_wait_quantile_ac(2, 1, 1, 0.9, 1, 0.5), 0.75 * 1.2039728043259361, 1e-12);
  /* three slots, 2 erlangs, 0.25 s, Cs^2 0.55 (B8's answers): scale 0.775 */
  near(gw_cap_wait_mean_ac(3, 2, 0.25, 1, 0.55), 0.775 / 9, 1e-12);
  near(gw_cap_wait_quantile_ac(3, 2, 0.25, 0.9, 1, 0.55), 0.775 * 0.25 * log(40.0 / 9), 1e-12);
  near(gw_cap_wait_quantile_ac(3, 2, 0.25, 0.9, 1, 0.55), 0.28900813, 1e-8);
  /* bursty arrivals (Ca^2 = 3) wait twice as long as Poisson ones */
  near(gw_cap_wait_mean_ac(2, 1, 1, 3, 1), 2.0 / 3, 1e-12);
  /* no wait stays none, overload stays unbounded, a nonsense Cs^2 counts as 1 */
  near(gw_cap_wait_quantile_ac(2, 1, 1, 0.5, 1, 0.5), 0, 0);
  assert_true(isinf(gw_cap_wait_quantile_ac(2, 2, 1, 0.9, 1, 0.5)));
  assert_true(isinf(gw_cap_wait_mean_ac(2, 2.5, 1, 1, 0.5)));
  near(gw_cap_wait_mean_ac(2, 1, 1, 1, NAN), 1.0 / 3, 1e-12);
  near(gw_cap_wait_mean_ac(2, 1, 1, 1, -1), 1.0 / 3, 1e-12);
}

static gw_targets targets(void) { return (gw_targets){.interactive_wait_s = 1, .review_within_s = 600, .batch_by_min = -1}; }

static gw_cap_class cls(const char *name, double pre, double dec, int slots, double cost) {
  gw_cap_class k = {.prefill_tps = pre, .decode_tps = dec, .slots = slots, .cost_per_day = cost};
  snprintf(k.name, sizeof(k.name), "%s", name);
  return k;
}

/* An interactive load of lambda/s, 200 prompt tokens and 10 out, on n phones of 1 slot at
 * 1,000 / 20 tokens/s (a service of 0.7 s). */
static gw_cap_input interactive(double lambda, gw_cap_phone *ph, size_t n, gw_cap_class *k, size_t nk) {
  gw_cap_input in = {.model = "m", .targets = targets(), .confidence = 0.95, .expected_out = 10,
                     .batch_deadline_s = -1, .startup_s = 30, .phones = ph, .n_phones = n,
                     .classes = k, .n_classes = nk, .idle_release_s = 600};
  in.now[GW_DEMAND_INTERACTIVE] = (gw_demand_rate){.arrivals_per_s = lambda, .mean_in = 200,
                                                   .mean_out = 10, .requests = lambda * 300, .ended = lambda * 300,
                                                   .span_s = 300};
  for (size_t i = 0; i < n; i++)
    ph[i] = (gw_cap_phone){.id = "p", .prefill_tps = 1000, .decode_tps = 20, .slots = 1,
                           .cost_per_day = 0.57, .usable = 1};
  return in;
}

static int met_with(const gw_cap_input *base, int extra_phones) {
  /* the fleet grown by extra phones of class 0, judged again: met_now */
  gw_cap_phone ph[64];
  gw_cap_input in = *base;
  memcpy(ph, base->phones, base->n_phones * sizeof(*ph));
  for (int i = 0; i < extra_phones; i++)
    ph[base->n_phones + i] = (gw_cap_phone){.id = "new", .prefill_tps = base->classes[0].prefill_tps,
                                            .decode_tps = base->classes[0].decode_tps,
                                            .slots = base->classes[0].slots, .usable = 1};
  in.phones = ph;
  in.n_phones = base->n_phones + (size_t)extra_phones;
  gw_cap_result r;
  cJSON_Delete(gw_capacity_advise(&in, &r));
  return r.met_now;
}

static void test_advice_meets_and_one_fewer_does_not(void **state) {
  (void)state;
  gw_cap_phone ph[64];
  gw_cap_class k[1] = {cls("same", 1000, 20, 1, 0.57)};
  /* 5 requests/s of 0.7 s: 3.5 erlangs on 2 slots */
  gw_cap_input in = interactive(5, ph, 2, k, 1);
  gw_cap_result r;
  cJSON *j = gw_capacity_advise(&in, &r);
  assert_non_null(j);
  assert_false(r.met_now);
  assert_true(r.wait_q_s < 0); /* unbounded: more work than slots */
  assert_true(r.add > 0);
  assert_string_equal(r.best, "same");
  assert_true(met_with(&in, r.add));
  assert_false(met_with(&in, r.add - 1));
  near(r.advised_cost_per_day, 0.57 * (2 + r.add), 1e-9);
  assert_int_equal(r.target_phones, 2 + r.add);
  cJSON_Delete(j);
}

/* The answers' measured variability: with Cs^2 0.3 measured over 200 answers the waits are
 * Erlang C's times 0.65 and the advice one phone leaner (7 requests/s of 0.7 s: Erlang C
 * meets the 1 s target at 95 % with 7 slots, Allen-Cunneen with 6); with 50 answers
 * measured it is Erlang C's; the JSON says which and on how many. */
static void test_measured_variability_scales_waits(void **state) {
  (void)state;
  gw_cap_phone ph[64];
  gw_cap_class k[1] = {cls("same", 1000, 20, 1, 0.57)};
  gw_cap_input in = interactive(7, ph, 6, k, 1);
  gw_cap_result ec, ac, few;
  in.service_scv = 0.3;
  in.service_samples = 50; /* too few: Erlang C */
  cJSON *jf = gw_capacity_advise(&in, &few);
  in.service_samples = 0;
  in.service_scv = 0;
  cJSON_Delete(gw_capacity_advise(&in, &ec));
  in.service_scv = 0.3;
  in.service_samples = 200;
  cJSON *j = gw_capacity_advise(&in, &ac);
  near(ec.wait_scale, 1, 0);
  near(few.wait_scale, 1, 0);
  near(ac.wait_scale, 0.65, 1e-12);
  near(few.wait_q_s, ec.wait_q_s, 0);
  assert_true(ec.wait_q_s > 1); /* 6 slots at 4.9 erlangs: not met by Erlang C... */
  near(ac.wait_q_s, 0.65 * ec.wait_q_s, 1e-9);
  assert_true(ac.wait_q_s <= 1); /* ...met by the measured answers */
  assert_false(ec.met_now);
  assert_true(ac.met_now);
  assert_int_equal(ec.add, 1);
  assert_int_equal(ac.add, 0);
  assert_int_equal(few.add, 1);
  /* what it rests on */
  const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "interactive"), "variability");
  assert_non_null(v);
  near(cJSON_GetObjectItem(v, "service_scv")->valuedouble, 0.3, 1e-12);
  near(cJSON_GetObjectItem(v, "service_samples")->valuedouble, 200, 0);
  near(cJSON_GetObjectItem(v, "arrivals_scv")->valuedouble, 1, 0);
  near(cJSON_GetObjectItem(v, "wait_scale")->valuedouble, 0.65, 1e-12);
  assert_non_null(strstr(cJSON_GetObjectItem(v, "service_basis")->valuestring, "measured"));
  v = cJSON_GetObjectItem(cJSON_GetObjectItem(jf, "interactive"), "variability");
  near(cJSON_GetObjectItem(v, "service_scv")->valuedouble, 1, 0);
  near(cJSON_GetObjectItem(v, "service_scv_measured")->valuedouble, 0.3, 1e-12);
  near(cJSON_GetObjectItem(v, "service_samples")->valuedouble, 50, 0);
  assert_non_null(strstr(cJSON_GetObjectItem(v, "service_basis")->valuestring, "assumed exponential"));
  cJSON_Delete(j);
  cJSON_Delete(jf);
}

/* The rate now is read from a count of arrivals: planned at its upper bound at the
 * confidence. 7 a second read from 2,100 arrivals over 300 s: z(0.95) sqrt(2100) / 300 =
 * 0.2513 a second more; from 210 over 30 s: 0.7945. */
static void test_rate_margin(void **state) {
  (void)state;
  near(gw_cap_normal_quantile(0.5), 0, 1e-9);
  near(gw_cap_normal_quantile(0.95), 1.6448536269514722, 1e-9);
  near(gw_cap_normal_quantile(0.9), 1.2815515655446004, 1e-9);
  near(gw_cap_rate_margin(2100, 300, 0.95), 1.6448536269514722 * sqrt(2100) / 300, 1e-9);
  near(gw_cap_rate_margin(210, 30, 0.95), 0.79454, 1e-5);
  near(gw_cap_rate_margin(0, 30, 0.95), 0, 0);
  near(gw_cap_rate_margin(210, 30, 0.5), 0, 0);
  gw_cap_phone ph[64];
  gw_cap_class k[1] = {cls("same", 1000, 20, 1, 0.57)};
  gw_cap_input in = interactive(7, ph, 6, k, 1);
  gw_cap_result plain, wide;
  cJSON *j0 = gw_capacity_advise(&in, &plain);
  in.rate_count[GW_DEMAND_INTERACTIVE] = 210;
  in.rate_span_s[GW_DEMAND_INTERACTIVE] = 30;
  cJSON *j = gw_capacity_advise(&in, &wide);
  const cJSON *n0 = cJSON_GetObjectItem(cJSON_GetObjectItem(j0, "interactive"), "now");
  const cJSON *n = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "interactive"), "now");
  near(cJSON_GetObjectItem(n0, "arrivals_margin_per_s")->valuedouble, 0, 0);
  near(cJSON_GetObjectItem(n, "arrivals_margin_per_s")->valuedouble, 0.795, 1e-3); /* as rounded */
  near(cJSON_GetObjectItem(n, "arrivals_per_s")->valuedouble, 7, 0); /* as read */
  /* 0.7 s a request: the load grows by the margin's share of it */
  near(cJSON_GetObjectItem(n, "load_erlangs")->valuedouble - cJSON_GetObjectItem(n0, "load_erlangs")->valuedouble,
       0.79454 * 0.7, 2e-3);
  near(cJSON_GetObjectItem(n, "checks_per_s")->valuedouble, 0, 0);
  assert_true(wide.wait_q_s > plain.wait_q_s);
  assert_true(wide.add >= plain.add);
  cJSON_Delete(j0);
  cJSON_Delete(j);
}

static void test_churn_adds_phones(void **state) {
  (void)state;
  gw_cap_phone ph[64];
  gw_cap_class k[1] = {cls("same", 1000, 20, 1, 0.57)};
  gw_cap_input in = interactive(5, ph, 2, k, 1);
  gw_cap_result calm, churny;
  cJSON_Delete(gw_capacity_advise(&in, &calm));
  in.gone_per_h = 0.5;   /* half the phones gone each hour... */
  in.startup_s = 1800;   /* ...and half an hour to start one */
  cJSON_Delete(gw_capacity_advise(&in, &churny));
  /* about 0.25 x 8 phones are missing at any time: Poisson(2)'s 95 % quantile is 5 */
  assert_int_equal(churny.add - calm.add, gw_cap_poisson_quantile(0.5 * (2 + (calm.add)) * 0.5, 0.95));
}

/* Answers' checks are load: the shadow requests of verify.budget's share, those the phones
 * without a record still owe, and those each added phone owes, counted as arrivals. */
static void test_checks_count(void **state) {
  (void)state;
  gw_cap_phone ph[64];
  gw_cap_class k[1] = {cls("same", 1000, 20, 1, 0.57)};
  gw_cap_input in = interactive(5, ph, 2, k, 1);
  gw_cap_result plain, budget, owed, fresh;
  cJSON_Delete(gw_capacity_advise(&in, &plain));
  in.verify_share = 0.2; /* a fifth more requests: 4.2 erlangs */
  cJSON *j = gw_capacity_advise(&in, &budget);
  cJSON *now = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "interactive"), "now");
  near(cJSON_GetObjectItem(now, "checks_per_s")->valuedouble, 1.0, 1e-9);
  near(cJSON_GetObjectItem(now, "load_erlangs")->valuedouble, 6 * 0.7, 1e-3);
  cJSON_Delete(j);
  in.verify_share = 0;
  in.verify_owed_per_s = 1.0;
  cJSON_Delete(gw_capacity_advise(&in, &owed));
  near(owed.add, budget.add, 0); /* the same arrivals, owed instead of a share */
  in.verify_owed_per_s = 0;
  in.verify_new_per_s = 0.25; /* each phone added brings a quarter of a request a second */
  cJSON_Delete(gw_capacity_advise(&in, &fresh));
  assert_true(budget.add > plain.add);
  assert_true(fresh.add > plain.add);
  /* the phones added carry the checks they bring: n phones meet 5 + n/4 requests/s */
  for (int n = fresh.add - 1; n <= fresh.add; n++) {
    gw_cap_input again = interactive(5 + 0.25 * n, ph, 2, k, 1);
    gw_cap_result r;
    cJSON_Delete(gw_capacity_advise(&again, &r));
    if (n == fresh.add) assert_true(r.add <= n);
    else assert_true(r.add > n);
  }
}

/* Answers verified: a newcomer's first checks may each hold it for about one service
 * time; the advice counts them as start-up, as if the phone took that much longer to start. */
static void test_checks_hold_counts_as_start_up(void **state) {
  (void)state;
  gw_cap_phone ph[64];
  gw_cap_class k[1] = {cls("same", 1000, 20, 1, 0.57)};
  gw_cap_input in = interactive(5, ph, 2, k, 1);
  in.gone_per_h = 0.5;
  in.startup_s = 1800;
  gw_cap_result checked, longer;
  in.vet_checks = 5;
  cJSON *j = gw_capacity_advise(&in, &checked);
  const cJSON *churn = cJSON_GetObjectItemCaseSensitive(j, "churn");
  double hold = cJSON_GetObjectItemCaseSensitive(churn, "checks_hold_s")->valuedouble;
  double service = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "interactive"), "now"), "service_s")->valuedouble;
  assert_true(hold > 0);
  near(hold, 5 * service, 0.01);
  near(cJSON_GetObjectItemCaseSensitive(churn, "startup_s")->valuedouble, 1800, 1e-9);
  near(cJSON_GetObjectItemCaseSensitive(churn, "join_s")->valuedouble, 1800 + hold, 0.01);
  cJSON_Delete(j);
  in.vet_checks = 0;
  in.startup_s = 1800 + hold;
  cJSON_Delete(gw_capacity_advise(&in, &longer));
  assert_int_equal(checked.add, longer.add);
  /* without checks there is no hold */
  in.startup_s = 1800;
  j = gw_capacity_advise(&in, &longer);
  near(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "churn"), "checks_hold_s")->valuedouble, 0, 1e-12);
  cJSON_Delete(j);
}

static void test_cheapest_class(void **state) {
  (void)state;
  gw_cap_phone ph[64];
  /* a flagship twice as fast at 1.03 a day, a budget phone at 0.57: work per ACU decides */
  gw_cap_class k[2] = {cls("flagship", 2000, 40, 1, 1.03), cls("budget", 1000, 20, 1, 0.57)};
  gw_cap_input in = interactive(20, ph, 2, k, 2);
  gw_cap_result r;
  cJSON *j = gw_capacity_advise(&in, &r);
  cJSON *cl = cJSON_GetObjectItem(j, "classes");
  double add_f = cJSON_GetObjectItem(cJSON_GetArrayItem(cl, 0), "add")->valuedouble;
  double add_b = cJSON_GetObjectItem(cJSON_GetArrayItem(cl, 1), "add")->valuedouble;
  assert_true(add_f < add_b);
  const char *want = add_f * 1.03 <= add_b * 0.57 ? "flagship" : "budget";
  assert_string_equal(r.best, want);
  cJSON_Delete(j);
}

/* The seed's numbers: 50,000 reviews of ~7,000 prompt tokens and ~8 out on the 9B, 3 min
 * 15 s of prefill on the best phone (35.9 tokens/s), 4 tokens/s decoding, one slot; from
 * 22:00 to 06:00 (8 h) with phones that start in 10 minutes and nothing rented yet. */
static void test_seed_nightly_batch(void **state) {
  (void)state;
  gw_cap_class k[2] = {cls("flagship-now", 7000.0 / 195, 4, 1, 1.03),
                       cls("flagship-planned", 7000.0 / 195, 4, 1, 0.57)};
  gw_cap_input in = {.model = "qwen3.5-9b", .targets = targets(), .confidence = 0.95,
                     .expected_out = 8, .backlog_lines = 50000, .backlog_in = 50000.0 * 7000,
                     .backlog_out = 50000.0 * 8, .batch_deadline_s = 8 * 3600, .startup_s = 600,
                     .classes = k, .n_classes = 1, .idle_release_s = 3600};
  gw_cap_result r;
  cJSON *j = gw_capacity_advise(&in, &r);
  /* a line takes 195 + 2 s; each phone works 8 h - 10 min; planned with 10 % to spare:
   * 50,000 x 197 x 1.1 / 28,200 = 384.2 */
  assert_int_equal(r.add_batch, 385);
  assert_int_equal(r.add, 385);
  near(r.advised_cost_per_day, 385 * 1.03, 1e-9);
  near(r.batch_finish_s, -1, 0); /* no phone today: never */
  cJSON_Delete(j);
  in.classes = k + 1; /* matched ahead of time, at the average price */
  j = gw_capacity_advise(&in, &r);
  near(r.advised_cost_per_day, 385 * 0.57, 1e-9);
  cJSON_Delete(j);
  /* a deadline nearer than a phone's start-up cannot be met by renting */
  in.batch_deadline_s = 300;
  j = gw_capacity_advise(&in, &r);
  assert_true(r.unreachable);
  cJSON_Delete(j);
}

static void test_idle_phones_released(void **state) {
  (void)state;
  gw_cap_phone ph[64];
  gw_cap_class k[1] = {cls("same", 1000, 20, 1, 0.57)};
  /* 0.2 requests/s of 0.7 s on 6 phones: two carry it; three idle for an hour, one of
   * them dearer, are listed dearest first while the rest still meet the target */
  gw_cap_input in = interactive(0.2, ph, 6, k, 1);
  const char *ids[6] = {"a", "b", "c", "d", "e", "f"};
  for (int i = 0; i < 6; i++) {
    ph[i].id = ids[i];
    ph[i].idle_s = i >= 3 ? 4000 : 5;
  }
  ph[4].cost_per_day = 1.03;
  gw_cap_result r;
  cJSON *j = gw_capacity_advise(&in, &r);
  assert_true(r.met_now);
  assert_int_equal(r.add, 0);
  assert_int_equal(r.release, 3);
  near(r.release_saving_per_day, 0.57 * 2 + 1.03, 1e-9);
  cJSON *rel = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "advice"), "release_ids");
  assert_string_equal(cJSON_GetArrayItem(rel, 0)->valuestring, "e");
  cJSON_Delete(j);
  /* with more load only some can go */
  in.now[GW_DEMAND_INTERACTIVE].arrivals_per_s = 3;
  j = gw_capacity_advise(&in, &r);
  assert_true(r.release < 3);
  cJSON_Delete(j);
}

static void test_reviews_unreachable(void **state) {
  (void)state;
  gw_cap_phone ph[64];
  gw_cap_class k[1] = {cls("slow", 10, 2, 1, 0.57)};
  gw_cap_input in = interactive(0.01, ph, 1, k, 1);
  in.now[GW_DEMAND_REVIEW] = (gw_demand_rate){.arrivals_per_s = 0.001, .mean_in = 7000,
                                              .mean_out = 8, .requests = 1, .ended = 1, .span_s = 1000};
  for (int i = 0; i < 1; i++) ph[i].prefill_tps = 10;
  in.targets.review_within_s = 60; /* 700 s of prefill on any of them */
  gw_cap_result r;
  cJSON *j = gw_capacity_advise(&in, &r);
  assert_true(r.unreachable);
  assert_int_equal(r.add, 0);
  cJSON_Delete(j);
}

/* The advice is worked out every 2 s while that is cheap; when it takes long (thousands of
 * models), a hundred times as long apart: never more than 1 % of the loop. */
static void test_refresh_keeps_to_its_share(void **state) {
  (void)state;
  assert_int_equal(gw_cap_refresh_gap_ms(0.3), 2000);
  assert_int_equal(gw_cap_refresh_gap_ms(20), 2000);
  assert_int_equal(gw_cap_refresh_gap_ms(140), 14000);
  assert_int_equal(gw_cap_refresh_gap_ms(-1), 2000);
  assert_int_equal(gw_cap_refresh_gap_ms(0.0 / 0.0), 2000);
  assert_int_equal(gw_cap_refresh_gap_ms(1e9), 3600000); /* at least once an hour */
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_erlang_c_and_quantiles),
    cmocka_unit_test(test_allen_cunneen),
    cmocka_unit_test(test_measured_variability_scales_waits),
    cmocka_unit_test(test_rate_margin),
    cmocka_unit_test(test_advice_meets_and_one_fewer_does_not),
    cmocka_unit_test(test_churn_adds_phones),
    cmocka_unit_test(test_checks_count),
    cmocka_unit_test(test_checks_hold_counts_as_start_up),
    cmocka_unit_test(test_cheapest_class),
    cmocka_unit_test(test_seed_nightly_batch),
    cmocka_unit_test(test_idle_phones_released),
    cmocka_unit_test(test_reviews_unreachable),
    cmocka_unit_test(test_refresh_keeps_to_its_share),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
