/* Unit tests for gateway/demand.c, with time passed in: arrivals and tokens per class over
 * a window and the busiest hour of the week; buckets forgotten once the hour (fine) or the
 * week (hours) has passed; a full table of models refusing more; the phones' stays giving
 * the share gone per hour, the mean stay and the median start-up; and the history read
 * back from its JSON giving the same figures (a restart), a broken one refused whole; the
 * answers' slot times giving the mean service and its squared coefficient of variation,
 * kept across a restart, and a history written before they were measured (version 1)
 * still read; the rate since a step up in the load. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "demand.h"

#define S 1000
#define H (3600 * S)
#define T0 ((int64_t)1764900000000) /* 2025-12-05, a Friday: wall-clock ms */

static void near(double got, double want) {
  if (fabs(got - want) > 1e-9 + fabs(want) * 1e-9) fail_msg("got %.12g, want %.12g", got, want);
}

static void test_rate_over_a_window(void **state) {
  (void)state;
  /* T0 is a whole 10 s bucket's start: 200 s of traffic, one interactive request a second
   * (100 prompt tokens, 10 out), one review every 10 s (7,000 in, 8 out) */
  int64_t t0 = T0 - T0 % GW_DEMAND_FINE_MS;
  gw_demand *d = gw_demand_new(t0);
  for (int s = 0; s < 200; s++) {
    assert_int_equal(gw_demand_record(d, "m", GW_DEMAND_INTERACTIVE, t0 + s * S, 1, 100, 10), 0);
    if (s % 10 == 0) assert_int_equal(gw_demand_record(d, "m", GW_DEMAND_REVIEW, t0 + s * S, 1, 7000, 8), 0);
  }
  gw_demand_rate r;
  int64_t now = t0 + 200 * S;
  assert_int_equal(gw_demand_window(d, "m", GW_DEMAND_MASK(GW_DEMAND_INTERACTIVE), now, 100, &r), 0);
  near(r.span_s, 100);
  near(r.requests, 100);
  near(r.arrivals_per_s, 1);
  near(r.mean_in, 100);
  near(r.mean_out, 10);
  /* both interactive classes: 110 requests, tokens averaged over both */
  assert_int_equal(gw_demand_window(d, "m", GW_DEMAND_MASK(GW_DEMAND_INTERACTIVE) |
                                              GW_DEMAND_MASK(GW_DEMAND_REVIEW), now, 100, &r), 0);
  near(r.requests, 110);
  near(r.mean_in, (100.0 * 100 + 10 * 7000) / 110);
  near(r.tok_in_per_s, (100.0 * 100 + 10 * 7000) / 100);
  /* a window longer than the history: the span is the history's */
  assert_int_equal(gw_demand_window(d, "m", GW_DEMAND_MASK(GW_DEMAND_INTERACTIVE), now, 1000, &r), 0);
  near(r.span_s, 200);
  near(r.arrivals_per_s, 1);
  /* another model: nothing */
  assert_int_equal(gw_demand_window(d, "other", GW_DEMAND_ALL, now, 100, &r), -ENOENT);
  near(r.requests, 0);
  /* an hour later the fine buckets have nothing of it */
  assert_int_equal(gw_demand_window(d, "m", GW_DEMAND_ALL, now + 2 * H, 600, &r), 0);
  near(r.requests, 0);
  gw_demand_free(d);
}

static void test_peak_is_the_busiest_hour_of_the_week(void **state) {
  (void)state;
  int64_t h0 = (T0 / H) * H;
  gw_demand *d = gw_demand_new(h0);
  /* hour 0: 360 requests; hour 5: 1,800; hour 30: 720 */
  for (int i = 0; i < 360; i++) gw_demand_record(d, "m", GW_DEMAND_INTERACTIVE, h0 + i * 10 * S, 1, 50, 5);
  for (int i = 0; i < 1800; i++) gw_demand_record(d, "m", GW_DEMAND_INTERACTIVE, h0 + 5 * H + i * 2 * S, 1, 80, 5);
  for (int i = 0; i < 720; i++) gw_demand_record(d, "m", GW_DEMAND_BATCH, h0 + 30 * H + i * 5 * S, 1, 80, 5);
  gw_demand_rate r;
  assert_int_equal(gw_demand_peak(d, "m", GW_DEMAND_ALL, h0 + 40 * H, &r), 0);
  near(r.arrivals_per_s, 0.5);
  near(r.mean_in, 80);
  assert_int_equal(r.from_ms, h0 + 5 * H);
  assert_int_equal(gw_demand_hour(d, "m", GW_DEMAND_MASK(GW_DEMAND_BATCH), h0 + 5 * H, h0 + 40 * H, &r), 0);
  near(r.requests, 0);
  assert_int_equal(gw_demand_hour(d, "m", GW_DEMAND_MASK(GW_DEMAND_INTERACTIVE), h0 + 5 * H, h0 + 40 * H, &r), 0);
  near(r.requests, 1800);
  assert_int_equal(gw_demand_hour(d, "m", GW_DEMAND_ALL, h0 + 6 * H, h0 + 40 * H, &r), -ENOENT);
  /* the batch class alone: hour 30 */
  assert_int_equal(gw_demand_peak(d, "m", GW_DEMAND_MASK(GW_DEMAND_BATCH), h0 + 40 * H, &r), 0);
  assert_int_equal(r.from_ms, h0 + 30 * H);
  near(r.arrivals_per_s, 0.2);
  /* a week after hour 5 it is forgotten: hour 30 is the peak of what is left */
  assert_int_equal(gw_demand_peak(d, "m", GW_DEMAND_ALL, h0 + 5 * H + 168 * H, &r), 0);
  assert_int_equal(r.from_ms, h0 + 30 * H);
  assert_int_equal(gw_demand_peak(d, "m", GW_DEMAND_ALL, h0 + 400 * H, &r), -ENOENT);
  gw_demand_free(d);
}

static void test_models_are_bounded(void **state) {
  (void)state;
  gw_demand *d = gw_demand_new(T0);
  char name[32];
  for (int i = 0; i < GW_DEMAND_MAX_MODELS; i++) {
    snprintf(name, sizeof(name), "m%d", i);
    assert_int_equal(gw_demand_record(d, name, GW_DEMAND_INTERACTIVE, T0, 1, 1, 1), 0);
  }
  assert_int_equal(gw_demand_record(d, "one-more", GW_DEMAND_INTERACTIVE, T0, 1, 1, 1), -ENOSPC);
  assert_int_equal(gw_demand_record(d, "m0", GW_DEMAND_INTERACTIVE, T0, 1, 1, 1), 0);
  assert_int_equal(gw_demand_models(d), GW_DEMAND_MAX_MODELS);
  gw_demand_free(d);
}

static void test_churn(void **state) {
  (void)state;
  gw_demand *d = gw_demand_new(T0);
  /* ten phones join at T0; each answers first after 60 + 10 i s; four leave after 10 h */
  char id[16];
  for (int i = 0; i < 10; i++) {
    snprintf(id, sizeof(id), "p%d", i);
    gw_demand_phone_join(d, id, T0, 1);
    gw_demand_phone_answered(d, id, T0 + (60 + 10 * i) * S);
    gw_demand_phone_answered(d, id, T0 + 5000 * S); /* only the first counts */
    if (i < 4) gw_demand_phone_leave(d, id, T0 + 10 * H);
  }
  gw_churn c;
  gw_demand_churn(d, T0 + 20 * H, &c);
  assert_int_equal(c.phones_now, 6);
  assert_int_equal(c.departures, 4);
  near(c.phone_hours, 4 * 10 + 6 * 20);
  near(c.gone_per_h, 4.0 / 160);
  near(c.mean_stay_h, 160.0 / 4);
  assert_int_equal(c.startup_samples, 10);
  near(c.startup_s, (100 + 110) / 2.0);
  /* a phone that comes back is a new stay; one still here joining again is not */
  gw_demand_phone_join(d, "p0", T0 + 11 * H, 1);
  gw_demand_phone_join(d, "p9", T0 + 11 * H, 1);
  gw_demand_churn(d, T0 + 20 * H, &c);
  assert_int_equal(c.phones_now, 7);
  gw_demand_free(d);
}

static void test_history_survives_a_restart(void **state) {
  (void)state;
  int64_t t0 = T0 - T0 % GW_DEMAND_HOUR_MS;
  gw_demand *d = gw_demand_new(t0);
  for (int s = 0; s < 1800; s++) gw_demand_record(d, "m", (gw_demand_class)(s % 3), t0 + s * S, 1, 100 + s % 7, 9);
  gw_demand_phone_join(d, "gone", t0, 1);
  gw_demand_phone_answered(d, "gone", t0 + 90 * S);
  gw_demand_phone_leave(d, "gone", t0 + 600 * S);
  gw_demand_phone_join(d, "stays", t0 + 10 * S, 1);
  gw_demand_phone_join(d, "vanishes", t0 + 10 * S, 0);
  int64_t now = t0 + 1800 * S;
  cJSON *j = gw_demand_to_json(d, now);
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  /* a new process, started 30 s later */
  gw_demand *e = gw_demand_new(now + 30 * S);
  cJSON *back = cJSON_Parse(text);
  assert_int_equal(gw_demand_from_json(e, back, now + 30 * S), 0);
  cJSON_Delete(back);
  assert_int_equal(gw_demand_since(e), t0);
  gw_demand_rate a, b;
  for (unsigned mask = 1; mask <= GW_DEMAND_ALL; mask++) {
    gw_demand_window(d, "m", mask, now, 900, &a);
    gw_demand_window(e, "m", mask, now, 900, &b);
    near(b.requests, a.requests);
    near(b.mean_in, a.mean_in);
    near(b.arrivals_per_s, a.arrivals_per_s);
  }
  /* the phones: "stays" comes back; "vanishes" does not and ends when the history was saved */
  gw_demand_phone_join(e, "stays", now + 40 * S, 1);
  gw_demand_phone_settle(e, now);
  gw_churn c;
  gw_demand_churn(e, now + 60 * S, &c);
  assert_int_equal(c.phones_now, 1);
  assert_int_equal(c.departures, 2);
  near(c.startup_s, 90);
  /* a broken history is refused whole */
  gw_demand *f = gw_demand_new(now);
  cJSON *bad = cJSON_Parse("{\"version\":1,\"since_ms\":1,\"models\":[{\"name\":\"m\",\"fine\":[[1,7,1,1,1,1]],\"hour\":[]}],\"stays\":[]}");
  assert_int_equal(gw_demand_from_json(f, bad, now), -EINVAL);
  assert_int_equal(gw_demand_models(f), 0);
  cJSON_Delete(bad);
  free(text);
  gw_demand_free(d);
  gw_demand_free(e);
  gw_demand_free(f);
}

/* Slot times of 1, 2, 3 and 4 s: mean 2.5 s, sample variance 5/3, Cs^2 = (5/3) / 6.25. */
static void test_service_variability(void **state) {
  (void)state;
  int64_t t0 = T0 - T0 % GW_DEMAND_HOUR_MS;
  gw_demand *d = gw_demand_new(t0);
  for (int i = 1; i <= 4; i++)
    assert_int_equal(gw_demand_record_service(d, "m", GW_DEMAND_INTERACTIVE, t0 + i * S, i), 0);
  assert_int_equal(gw_demand_record_service(d, "m", GW_DEMAND_REVIEW, t0 + 5 * S, 100), 0);
  assert_int_equal(gw_demand_record_service(d, "m", GW_DEMAND_INTERACTIVE, t0, -1), -EINVAL);
  assert_int_equal(gw_demand_record_service(d, "m", GW_DEMAND_INTERACTIVE, t0, NAN), -EINVAL);
  gw_demand_rate r;
  int64_t now = t0 + 60 * S;
  assert_int_equal(gw_demand_window(d, "m", GW_DEMAND_MASK(GW_DEMAND_INTERACTIVE), now, 600, &r), 0);
  near(r.served, 4);
  near(r.service_s, 2.5);
  near(r.service_scv, (5.0 / 3) / 6.25);
  near(r.requests, 0); /* slot times are no arrivals */
  /* with the review: 1, 2, 3, 4, 100 */
  assert_int_equal(gw_demand_window(d, "m", GW_DEMAND_MASK(GW_DEMAND_INTERACTIVE) |
                                              GW_DEMAND_MASK(GW_DEMAND_REVIEW), now, 600, &r), 0);
  near(r.served, 5);
  near(r.service_s, 22);
  near(r.service_scv, ((1 + 4 + 9 + 16 + 10000) - 5 * 22.0 * 22) / 4 / (22.0 * 22));
  /* the hour's buckets hold them too */
  assert_int_equal(gw_demand_hour(d, "m", GW_DEMAND_MASK(GW_DEMAND_INTERACTIVE), t0, t0 + 20 * 60 * S, &r), 0);
  near(r.served, 4);
  near(r.service_scv, (5.0 / 3) / 6.25);
  /* one answer: a mean, no variability; none: nothing */
  assert_int_equal(gw_demand_record_service(d, "one", GW_DEMAND_INTERACTIVE, t0, 0.5), 0);
  assert_int_equal(gw_demand_window(d, "one", GW_DEMAND_ALL, now, 600, &r), 0);
  near(r.service_s, 0.5);
  near(r.service_scv, 0);
  assert_int_equal(gw_demand_window(d, "m", GW_DEMAND_MASK(GW_DEMAND_BATCH), now, 600, &r), 0);
  near(r.served, 0);
  near(r.service_s, 0);
  /* an hour and more later the fine buckets have forgotten them */
  assert_int_equal(gw_demand_window(d, "m", GW_DEMAND_ALL, now + 2 * H, 600, &r), 0);
  near(r.served, 0);
  gw_demand_free(d);
}

/* The slot times survive a restart (version 2), and a version 1 history (no slot times,
 * cells of six numbers) still reads. */
static void test_service_persisted_and_old_format_read(void **state) {
  (void)state;
  int64_t t0 = T0 - T0 % GW_DEMAND_HOUR_MS;
  gw_demand *d = gw_demand_new(t0);
  for (int i = 0; i < 300; i++) {
    gw_demand_record(d, "m", GW_DEMAND_INTERACTIVE, t0 + i * S, 1, 100, 20);
    gw_demand_record_service(d, "m", GW_DEMAND_INTERACTIVE, t0 + i * S, 0.1 + 0.01 * (i % 17));
  }
  int64_t now = t0 + 300 * S;
  cJSON *j = gw_demand_to_json(d, now);
  near(cJSON_GetObjectItem(j, "version")->valuedouble, 2);
  const cJSON *fine = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "models"), 0), "fine");
  assert_int_equal(cJSON_GetArraySize(cJSON_GetArrayItem(fine, 0)), 9);
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  gw_demand *e = gw_demand_new(now + 5 * S);
  cJSON *back = cJSON_Parse(text);
  assert_int_equal(gw_demand_from_json(e, back, now + 5 * S), 0);
  cJSON_Delete(back);
  gw_demand_rate a, b;
  gw_demand_window(d, "m", GW_DEMAND_ALL, now, 3600, &a);
  gw_demand_window(e, "m", GW_DEMAND_ALL, now, 3600, &b);
  near(a.served, 300);
  near(b.served, a.served);
  near(b.service_s, a.service_s);
  near(b.service_scv, a.service_scv);
  assert_true(a.service_scv > 0);
  gw_demand_hour(e, "m", GW_DEMAND_ALL, t0, now + 11 * 60 * S, &b);
  near(b.served, 300);
  free(text);
  /* what a gateway wrote before slot times were measured */
  char old[512];
  snprintf(old, sizeof(old),
           "{\"version\":1,\"since_ms\":%lld,\"saved_ms\":%lld,\"models\":[{\"name\":\"m\","
           "\"fine\":[[%lld,0,30,3000,29,580]],\"hour\":[[%lld,0,30,3000,29,580]]}],"
           "\"stays\":[[\"p1\",%lld,%lld,0]]}",
           (long long)t0, (long long)(t0 + 30 * S), (long long)(t0 / GW_DEMAND_FINE_MS),
           (long long)(t0 / GW_DEMAND_HOUR_MS), (long long)t0, (long long)(t0 + 9 * S));
  gw_demand *f = gw_demand_new(t0 + 40 * S);
  back = cJSON_Parse(old);
  assert_non_null(back);
  assert_int_equal(gw_demand_from_json(f, back, t0 + 40 * S), 0);
  cJSON_Delete(back);
  gw_demand_window(f, "m", GW_DEMAND_ALL, t0 + 40 * S, 600, &b);
  near(b.requests, 30);
  near(b.ended, 29);
  near(b.mean_out, 20);
  near(b.served, 0); /* no slot times: the advice takes Erlang C's until answers are measured */
  near(b.service_scv, 0);
  /* a version 1 history with cells of nine numbers is not one a gateway wrote */
  back = cJSON_Parse("{\"version\":1,\"since_ms\":1,\"models\":[{\"name\":\"m\","
                     "\"fine\":[[1,0,1,1,1,1,1,1,1]],\"hour\":[]}],\"stays\":[]}");
  gw_demand *g = gw_demand_new(t0);
  assert_int_equal(gw_demand_from_json(g, back, t0), -EINVAL);
  cJSON_Delete(back);
  gw_demand_free(d);
  gw_demand_free(e);
  gw_demand_free(f);
  gw_demand_free(g);
}

/* The rate now of a load that stepped up: 2 a second until 60 s, nothing for 5 s, then 7 a
 * second from 65 s, read at 95 s over a 60 s window: the window says 4.15 a second, the
 * span since the step (70 - 95 s: the bucket of the step itself is below the rate after
 * it by more than two standard deviations) 7. A flat load with a noisy bucket, and one
 * that fell, read over the whole window. */
static void test_recent_rate_after_a_step(void **state) {
  (void)state;
  int64_t t0 = T0 - T0 % GW_DEMAND_HOUR_MS;
  gw_demand *d = gw_demand_new(t0);
  for (int i = 0; i < 120; i++) gw_demand_record(d, "m", GW_DEMAND_INTERACTIVE, t0 + i * 500, 1, 100, 20);
  for (int i = 0; i < 210; i++) gw_demand_record(d, "m", GW_DEMAND_INTERACTIVE, t0 + 65 * S + i * 1000 / 7, 1, 100, 20);
  int64_t now = t0 + 95 * S;
  gw_demand_rate w, r;
  assert_int_equal(gw_demand_window(d, "m", GW_DEMAND_ALL, now, 60, &w), 0);
  near(w.requests, 270);
  near(w.arrivals_per_s, 270.0 / 65);
  assert_int_equal(gw_demand_recent(d, "m", GW_DEMAND_ALL, now, 60, 2, &r), 0);
  assert_int_equal(r.from_ms, t0 + 70 * S);
  near(r.span_s, 25);
  near(r.requests, 175);
  near(r.arrivals_per_s, 7);
  assert_int_equal(gw_demand_recent(d, "other", GW_DEMAND_ALL, now, 60, 2, &r), -ENOENT);
  gw_demand_free(d);
  /* flat at 5 a second, one bucket 45 (within two standard deviations of 50) */
  d = gw_demand_new(t0);
  for (int b = 0; b < 10; b++) gw_demand_record(d, "m", GW_DEMAND_INTERACTIVE, t0 + b * 10 * S, b == 4 ? 45 : 50, 0, 0);
  now = t0 + 100 * S;
  assert_int_equal(gw_demand_recent(d, "m", GW_DEMAND_ALL, now, 60, 2, &r), 0);
  assert_int_equal(r.from_ms, t0 + 40 * S);
  near(r.requests, 295);
  near(r.span_s, 60);
  gw_demand_free(d);
  /* fell from 10 a second to 2: the whole window (older buckets are busier) */
  d = gw_demand_new(t0);
  for (int b = 0; b < 10; b++) gw_demand_record(d, "m", GW_DEMAND_INTERACTIVE, t0 + b * 10 * S, b < 7 ? 100 : 20, 0, 0);
  assert_int_equal(gw_demand_recent(d, "m", GW_DEMAND_ALL, now, 60, 2, &r), 0);
  near(r.span_s, 60);
  near(r.requests, 3 * 100 + 3 * 20);
  gw_demand_free(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_rate_over_a_window),
    cmocka_unit_test(test_peak_is_the_busiest_hour_of_the_week),
    cmocka_unit_test(test_models_are_bounded),
    cmocka_unit_test(test_churn),
    cmocka_unit_test(test_history_survives_a_restart),
    cmocka_unit_test(test_service_variability),
    cmocka_unit_test(test_service_persisted_and_old_format_read),
    cmocka_unit_test(test_recent_rate_after_a_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
