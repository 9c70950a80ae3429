/* Unit tests for gateway/auth.c's limits with injected time: requests per minute as a
 * token bucket (a burst of the whole minute's budget, then one every 60/rpm s), tokens
 * per minute charged after the answer (debt waits out), concurrency, models, priority,
 * and a gateway's 1/N share while Redis is away. The loop's clock is set by hand
 * (uv_now reads loop->time), so nothing here waits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "auth.h"
#include "gw.h"

typedef struct fixture {
  uv_loop_t loop;
  gw_server gw;
  gw_key_conf key;
  gw_caller caller;
} fixture;

static fixture *fx_new(double rpm, double tpm, int concurrency) {
  static fixture f;
  memset(&f, 0, sizeof(f));
  assert_int_equal(uv_loop_init(&f.loop), 0);
  f.loop.time = 1000000; /* injected: ms */
  f.gw.loop = &f.loop;
  f.key.name = "team";
  f.key.rpm = rpm;
  f.key.tpm = tpm;
  f.key.concurrency = concurrency;
  f.key.weight = 1;
  f.caller.name = "team";
  f.caller.conf = &f.key;
  f.caller.rpm_tokens = rpm;
  f.caller.tpm_tokens = tpm;
  f.caller.rpm_ms = f.caller.tpm_ms = f.loop.time;
  return &f;
}

static void fx_free(fixture *f) { assert_int_equal(uv_loop_close(&f->loop), 0); }

static int admit(fixture *f, const char *model, int prio, int share, int *retry, const char **code) {
  char msg[256];
  int p = prio;
  return gw_auth_admit(&f->gw, &f->caller, model, &p, retry, code, msg, sizeof(msg), (unsigned)share, 0);
}

static void test_rpm_is_a_bucket_of_one_minute(void **state) {
  (void)state;
  fixture *f = fx_new(6, 0, 0); /* one every 10 s, a burst of 6 */
  int retry;
  const char *code;
  for (int i = 0; i < 6; i++) {
    assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 0);
    gw_auth_release(&f->gw, &f->caller, 0, 1);
  }
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 429);
  assert_string_equal(code, "rate_limit_exceeded");
  assert_int_equal(retry, 10);
  f->loop.time += 4000; /* 0.4 of a request back: still 6 s to wait */
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 429);
  assert_int_equal(retry, 6);
  f->loop.time += 6000;
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 0);
  gw_auth_release(&f->gw, &f->caller, 0, 1);
  /* an hour idle refills to the minute's budget, not more */
  f->loop.time += 3600 * 1000;
  for (int i = 0; i < 6; i++) {
    assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 0);
    gw_auth_release(&f->gw, &f->caller, 0, 1);
  }
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 429);
  assert_int_equal(f->caller.n_limited, 3);
  fx_free(f);
}

static void test_tpm_is_charged_after_the_answer_and_debt_waits(void **state) {
  (void)state;
  fixture *f = fx_new(0, 600, 0); /* 10 tokens a second */
  int retry;
  const char *code;
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 0);
  gw_auth_release(&f->gw, &f->caller, 900, 1); /* 300 in debt */
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 429);
  assert_int_equal(retry, 31); /* (1 + 300) / 10 per s */
  f->loop.time += 30000;
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 429); /* at 0: not yet */
  f->loop.time += 1000;
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 0);
  gw_auth_release(&f->gw, &f->caller, 5, 0); /* shared: Redis counts the tokens */
  assert_true(f->caller.tpm_tokens > 9.9 && f->caller.tpm_tokens < 10.1);
  fx_free(f);
}

static void test_concurrency_models_and_priority(void **state) {
  (void)state;
  fixture *f = fx_new(0, 0, 2);
  static char *models[] = {"m"};
  f->key.models = models;
  f->key.n_models = 1;
  int retry;
  const char *code;
  assert_int_equal(admit(f, "other", 0, 1, &retry, &code), 403);
  assert_string_equal(code, "model_not_allowed");
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 0);
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 0);
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 429);
  assert_int_equal(retry, 1);
  gw_auth_release(&f->gw, &f->caller, 0, 1);
  assert_int_equal(admit(f, "m", 0, 1, &retry, &code), 0);
  f->key.priority = GW_PRIO_BATCH; /* a batch key may not ask for interactive */
  assert_int_equal(admit(f, "m", GW_PRIO_INTERACTIVE, 1, &retry, &code), 403);
  assert_string_equal(code, "priority_not_allowed");
  fx_free(f);
}

static void test_a_share_divides_the_budget_and_zero_leaves_it_to_redis(void **state) {
  (void)state;
  fixture *f = fx_new(6, 0, 0);
  int retry;
  const char *code;
  /* three gateways without Redis: this one takes 2 of the 6 a minute */
  f->caller.rpm_tokens = 2;
  assert_int_equal(admit(f, "m", 0, 3, &retry, &code), 0);
  assert_int_equal(admit(f, "m", 0, 3, &retry, &code), 0);
  assert_int_equal(admit(f, "m", 0, 3, &retry, &code), 429);
  assert_int_equal(retry, 30); /* one every 30 s at 2 a minute */
  /* share 0: Redis decides the per-minute budgets, only concurrency is local */
  for (int i = 0; i < 20; i++) assert_int_equal(admit(f, "m", 0, 0, &retry, &code), 0);
  fx_free(f);
}

/* Redis away, two gateways: the tokens bucket refills at half the key's tpm whether the
 * refill happens at admission or at the end of a request, so a long request does not
 * earn this gateway tokens at the full rate. */
static void test_a_share_refills_tpm_at_the_share_also_when_a_request_ends(void **state) {
  (void)state;
  fixture *f = fx_new(0, 600, 0); /* 600 a minute: 300 for each of two gateways, 5 a s */
  int retry;
  const char *code;
  assert_int_equal(admit(f, "m", 0, 2, &retry, &code), 0);
  assert_true(f->caller.tpm_tokens > 299.9 && f->caller.tpm_tokens < 300.1); /* capped at the share */
  f->loop.time += 20000; /* a 20 s request: 100 tokens at the share (200 at the full rate) */
  gw_auth_release(&f->gw, &f->caller, 400, 2);
  assert_true(f->caller.tpm_tokens > -100.1 && f->caller.tpm_tokens < -99.9);
  assert_int_equal(admit(f, "m", 0, 2, &retry, &code), 429);
  assert_int_equal(retry, 21); /* (1 + 100) / 5 per s */
  f->loop.time += 21000;
  assert_int_equal(admit(f, "m", 0, 2, &retry, &code), 0);
  fx_free(f);
}

/* A caller is found by its key's digest among many keys; an unknown, a missing and a
 * removed key are refused, and a key keeps its caller (its buckets) across a reload. */
static void test_callers_are_found_by_their_key(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  loop.time = 1000;
  gw_server gw;
  memset(&gw, 0, sizeof(gw));
  gw.loop = &loop;
  enum { N = 2000 };
  static gw_key_conf keys[N];
  static char names[N][32];
  memset(keys, 0, sizeof(keys));
  for (int i = 0; i < N; i++) {
    char key[64], hex[65];
    snprintf(names[i], sizeof(names[i]), "tenant-%d", i);
    snprintf(key, sizeof(key), "sk-secret-%d", i);
    gw_auth_hash_hex(key, strlen(key), hex);
    for (int b = 0; b < 32; b++) {
      unsigned v;
      sscanf(hex + 2 * b, "%2x", &v);
      keys[i].sha256[b] = (unsigned char)v;
    }
    keys[i].name = names[i];
    keys[i].weight = 1;
  }
  gw_config conf;
  memset(&conf, 0, sizeof(conf));
  conf.keys = keys;
  conf.n_keys = N;
  gw_auth_apply(&gw, &conf);
  pr_http_header h = {"Authorization", NULL};
  pr_http_req req;
  memset(&req, 0, sizeof(req));
  req.headers = &h;
  req.n_headers = 1;
  const char *why = NULL;
  char bearer[80];
  for (int i = 0; i < N; i += 13) {
    snprintf(bearer, sizeof(bearer), "Bearer sk-secret-%d", i);
    h.value = bearer;
    gw_caller *c = gw_auth_identify(&gw, &req, &why);
    assert_non_null(c);
    assert_string_equal(c->name, names[i]);
    assert_ptr_equal(gw_auth_caller(&gw, names[i]), c);
  }
  h.value = "Bearer sk-secret-";
  assert_null(gw_auth_identify(&gw, &req, &why));
  assert_string_equal(why, "unknown");
  h.name = "x-other";
  assert_null(gw_auth_identify(&gw, &req, &why));
  assert_string_equal(why, "missing");
  h.name = "x-api-key";
  h.value = "sk-secret-7";
  gw_caller *seven = gw_auth_identify(&gw, &req, &why);
  assert_true(seven && strcmp(seven->name, "tenant-7") == 0);
  /* a reload without key 7: refused; key 8 keeps its caller */
  gw_caller *eight = gw_auth_caller(&gw, "tenant-8");
  conf.keys = keys + 8;
  conf.n_keys = N - 8;
  gw_auth_apply(&gw, &conf);
  assert_null(gw_auth_identify(&gw, &req, &why));
  h.value = "sk-secret-8";
  assert_ptr_equal(gw_auth_identify(&gw, &req, &why), eight);
  gw_auth_free(&gw);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_rpm_is_a_bucket_of_one_minute),
    cmocka_unit_test(test_tpm_is_charged_after_the_answer_and_debt_waits),
    cmocka_unit_test(test_concurrency_models_and_priority),
    cmocka_unit_test(test_a_share_divides_the_budget_and_zero_leaves_it_to_redis),
    cmocka_unit_test(test_a_share_refills_tpm_at_the_share_also_when_a_request_ends),
    cmocka_unit_test(test_callers_are_found_by_their_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
