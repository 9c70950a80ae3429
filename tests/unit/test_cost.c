/* Unit tests for gateway/cost.c with injected time (uv_now reads loop->time, set by hand):
 * a request is charged its phone's price per slot-second (the phone's cost_per_day over
 * its slots) to its model and its API key; a request of several choices pays for every
 * slot it holds; a shadow request's slot time is verification's, never a caller's; the
 * rest of the fleet's cost is idle; and the Prometheus series escape a key's name. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "auth.h"
#include "buf.h"
#include "cost.h"
#include "gw.h"
#include "registry.h"
#include "replica.h"

#define T0 10000000u /* injected: ms */

typedef struct fixture {
  uv_loop_t loop;
  gw_config conf;
  gw_server gw;
  gw_replica *r;
  gw_caller caller;
  gw_job job;
  gw_attempt att;
} fixture;

/* One phone of 4 slots costing 345,600 a day: one slot costs exactly 1 a second. */
static fixture *fx_new(const char *key) {
  fixture *f = calloc(1, sizeof(*f));
  assert_non_null(f);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  f->loop.time = T0;
  f->conf.heartbeat_timeout_s = 15;
  f->gw.loop = &f->loop;
  f->gw.conf = &f->conf;
  assert_int_equal(gw_cost_init(&f->gw), 0);
  char *models[] = {"m"};
  f->r = gw_replica_new("p1", "http://127.0.0.1:1", NULL, models, 1, 4, 0, 100, 10, 4 * 86400.0);
  assert_non_null(f->r);
  gw_replica_set_state(f->r, GW_REPLICA_READY, T0, "test");
  assert_int_equal(gw_registry_add(&f->gw, f->r), 0);
  f->caller.name = (char *)key;
  f->job.caller = key ? &f->caller : NULL;
  f->job.oai.model = "m";
  f->att.job = &f->job;
  f->att.replica = f->r;
  return f;
}

/* The attempt takes a slot at the loop's time. */
static void start(fixture *f) {
  f->att.start_ms = f->loop.time;
  f->att.lease = gw_replica_acquire(f->r, f->loop.time, 10000, &f->att);
  assert_true(f->att.lease != 0);
}

static void end(fixture *f) {
  gw_cost_attempt_end(&f->gw, &f->att);
  gw_replica_release(f->r, f->att.lease);
}

static void fx_free(fixture *f) {
  gw_cost_free(&f->gw);
  for (size_t i = 0; i < f->gw.n_replicas; i++) gw_replica_free(f->gw.replicas[i]);
  free(f->gw.replicas);
  pr_idmap_clear(&f->gw.reg.ids);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  free(f);
}

/* hour.<list>[name].cost of /admin/v1/costs */
static double row_cost(cJSON *costs, const char *list, const char *field, const char *name) {
  const cJSON *rows = cJSON_GetObjectItem(cJSON_GetObjectItem(costs, "hour"), list);
  const cJSON *row;
  cJSON_ArrayForEach(row, rows) {
    if (strcmp(cJSON_GetObjectItem(row, field)->valuestring, name) == 0)
      return cJSON_GetObjectItem(row, "cost")->valuedouble;
  }
  return -1;
}

static double fleet_num(cJSON *costs, const char *k) {
  return cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(costs, "hour"), "fleet"), k)->valuedouble;
}

static void test_a_request_is_charged_per_slot_second(void **state) {
  (void)state;
  fixture *f = fx_new("team");
  start(f);
  f->loop.time += 4000;
  gw_cost_tick(&f->gw, f->loop.time); /* counted while it runs... */
  f->loop.time += 6000;
  end(f); /* ...and up to its end: 10 slot-seconds */
  f->loop.time += 10000;
  cJSON *c = gw_cost_json(&f->gw, 0);
  assert_true(fabs(row_cost(c, "models", "model", "m") - 10) < 1e-6);
  assert_true(fabs(row_cost(c, "keys", "key", "team") - 10) < 1e-6);
  /* the phone cost 4 a second for 20 s; the request used 10 of the 80, the rest was idle */
  assert_true(fabs(fleet_num(c, "cost") - 80) < 1e-6);
  assert_true(fabs(fleet_num(c, "busy_cost") - 10) < 1e-6);
  assert_true(fabs(fleet_num(c, "idle_cost") - 70) < 1e-6);
  cJSON_Delete(c);
  fx_free(f);
}

static void test_several_choices_pay_for_every_slot(void **state) {
  (void)state;
  fixture *f = fx_new("team");
  f->att.n_more = 2; /* "n": 3 slots on the phone */
  start(f);
  f->loop.time += 5000;
  end(f);
  cJSON *c = gw_cost_json(&f->gw, 0);
  assert_true(fabs(row_cost(c, "keys", "key", "team") - 15) < 1e-6);
  cJSON_Delete(c);
  fx_free(f);
}

static void test_a_shadow_request_is_verifications_not_the_callers(void **state) {
  (void)state;
  fixture *f = fx_new("team");
  f->job.shadow = 1;
  start(f);
  f->loop.time += 3000;
  end(f);
  cJSON *c = gw_cost_json(&f->gw, 0);
  assert_true(fabs(row_cost(c, "keys", "key", GW_COST_VERIFICATION) - 3) < 1e-6);
  assert_true(row_cost(c, "keys", "key", "team") < 0);
  /* and a check served no caller: no request counted */
  gw_job_ended ev = {.j = &f->job, .now_ms = f->loop.time, .served = 1, .model = "m", .caller = "team",
                     .tokens_in = 10, .tokens_out = 5};
  gw_cost_on_job_ended(&f->gw, &ev, NULL);
  cJSON_Delete(c);
  c = gw_cost_json(&f->gw, 0);
  assert_int_equal((int)fleet_num(c, "requests"), 0);
  cJSON_Delete(c);
  fx_free(f);
}

static void test_a_down_phone_costs_and_is_counted_down(void **state) {
  (void)state;
  fixture *f = fx_new(NULL);
  gw_replica_set_state(f->r, GW_REPLICA_DOWN, f->loop.time, "test");
  f->loop.time += 2000;
  cJSON *c = gw_cost_json(&f->gw, 0);
  assert_true(fabs(fleet_num(c, "cost") - 8) < 1e-6);
  assert_true(fabs(fleet_num(c, "down_cost") - 8) < 1e-6);
  assert_true(fabs(fleet_num(c, "idle_cost") - 8) < 1e-6);
  cJSON_Delete(c);
  fx_free(f);
}

static void test_served_requests_price_per_1k_and_escape_the_key(void **state) {
  (void)state;
  fixture *f = fx_new("te\"am\\x");
  start(f);
  f->loop.time += 2000;
  end(f);
  gw_job_ended ev = {.j = &f->job, .now_ms = f->loop.time, .served = 1, .model = "m",
                     .caller = "te\"am\\x", .tokens_in = 60, .tokens_out = 40};
  gw_cost_on_job_ended(&f->gw, &ev, NULL);
  ev.served = 0; /* a failed request is not served */
  gw_cost_on_job_ended(&f->gw, &ev, NULL);
  pr_buf out;
  pr_buf_init(&out, 1u << 20);
  assert_int_equal(gw_cost_render(&f->gw, &out), 0);
  const char *text = pr_buf_cstr(&out);
  /* 2 slot-seconds for one request: 2,000 per 1,000 requests; 100 tokens: 20,000 per million */
  assert_non_null(strstr(text, "\nfleetgate_cost_per_1k_requests{model=\"m\"} 2000\n"));
  assert_non_null(strstr(text, "\nfleetgate_cost_per_million_tokens{model=\"m\"} 20000\n"));
  assert_non_null(strstr(text, "\nfleetgate_caller_cost_per_1k_requests{caller=\"te\\\"am\\\\x\"} 2000\n"));
  assert_non_null(strstr(text, "\nfleetgate_cost_info{currency=\"ACU\"} 1\n"));
  pr_buf_free(&out);
  fx_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_request_is_charged_per_slot_second),
      cmocka_unit_test(test_several_choices_pay_for_every_slot),
      cmocka_unit_test(test_a_shadow_request_is_verifications_not_the_callers),
      cmocka_unit_test(test_a_down_phone_costs_and_is_counted_down),
      cmocka_unit_test(test_served_requests_price_per_1k_and_escape_the_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
