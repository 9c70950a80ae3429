/* Unit tests for gateway/metrics.c's exposition, rendered into a buffer with injected time
 * (uv_now reads loop->time): a finished request is counted by model, status and caller,
 * with the caller's name escaped (\ " and newline) and a model no phone serves read as
 * "_unknown" (a client cannot invent labels); a stream broken by an error event is
 * status="stream_error"; histograms are cumulative; a request answered after a failure
 * counts as a failover; every line of the scrape is a comment or one sample; and a scrape
 * that does not fit is an error, not a cut list. */
#include <inttypes.h>
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
#include "err.h"
#include "gw.h"
#include "metrics.h"
#include "registry.h"
#include "replica.h"

typedef struct fixture {
  uv_loop_t loop;
  gw_config conf;
  gw_server gw;
} fixture;

static fixture *fx_new(const char *replica_id) {
  fixture *f = calloc(1, sizeof(*f));
  assert_non_null(f);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  f->loop.time = 7000000;
  f->conf.heartbeat_timeout_s = 15;
  f->gw.loop = &f->loop;
  f->gw.conf = &f->conf;
  f->gw.metrics = gw_metrics_new(f->loop.time);
  assert_non_null(f->gw.metrics);
  char *models[] = {"m"};
  gw_replica *r = gw_replica_new(replica_id, "http://127.0.0.1:1", NULL, models, 1, 2, 0, 100, 10, 0);
  assert_non_null(r);
  gw_replica_set_state(r, GW_REPLICA_READY, f->loop.time, "test");
  assert_int_equal(gw_registry_add(&f->gw, r), 0);
  return f;
}

static void fx_free(fixture *f) {
  gw_metrics_free(f->gw.metrics);
  for (size_t i = 0; i < f->gw.n_replicas; i++) gw_replica_free(f->gw.replicas[i]);
  free(f->gw.replicas);
  pr_idmap_clear(&f->gw.reg.ids);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  free(f);
}

/* A request of model by caller (NULL: anonymous) ended with status after duration_s. */
static void ended(fixture *f, gw_job *j, const char *model, gw_caller *caller, int status, double duration_s) {
  j->oai.model = model;
  j->caller = caller;
  gw_job_ended ev = {.j = j, .now_ms = f->loop.time, .status = status,
                     .served = status >= 200 && status < 400 && !j->stream_failed,
                     .failed = status >= 500 || j->stream_failed, .model = model,
                     .caller = caller ? caller->name : NULL, .tokens_in = 30, .tokens_out = 12,
                     .duration_s = duration_s, .queue_wait_s = 0.01, .ttfb_s = 0.2};
  gw_metrics_on_job_ended(&f->gw, &ev, NULL);
}

static char *scrape(fixture *f) {
  pr_buf out;
  pr_buf_init(&out, 4u << 20);
  assert_int_equal(gw_metrics_render(&f->gw, &out), 0);
  char *s = strdup(pr_buf_cstr(&out));
  pr_buf_free(&out);
  return s;
}

static void has(const char *text, const char *line) {
  char want[512];
  snprintf(want, sizeof(want), "\n%s\n", line);
  if (!strstr(text, want)) fail_msg("no line %s", line);
}

static void test_requests_are_counted_by_model_status_and_escaped_caller(void **state) {
  (void)state;
  fixture *f = fx_new("p1");
  gw_caller team = {.name = "te\"am\\1\nx"};
  gw_job a = {0}, b = {0}, c = {0};
  ended(f, &a, "m", &team, 200, 0.3);
  ended(f, &b, "m", &team, 200, 0.3);
  ended(f, &c, "made-up", NULL, 404, 0.001); /* no phone serves it */
  char *text = scrape(f);
  has(text, "fleetgate_requests_total{model=\"m\",status=\"200\",caller=\"te\\\"am\\\\1\\nx\"} 2");
  has(text, "fleetgate_requests_total{model=\"_unknown\",status=\"404\",caller=\"anonymous\"} 1");
  assert_null(strstr(text, "made-up"));
  has(text, "fleetgate_tokens_in_total{model=\"m\"} 60");
  has(text, "fleetgate_tokens_out_total{model=\"m\"} 24");
  free(text);
  fx_free(f);
}

static void test_a_broken_stream_is_a_stream_error_and_a_failover_is_counted(void **state) {
  (void)state;
  fixture *f = fx_new("p1");
  gw_job s = {.stream_failed = 1};
  ended(f, &s, "m", NULL, 200, 1);
  gw_job moved = {.attempts = 2, .last_fail = GW_FAIL_CONNECT}; /* answered by a second phone */
  ended(f, &moved, "m", NULL, 200, 1);
  char *text = scrape(f);
  has(text, "fleetgate_requests_total{model=\"m\",status=\"stream_error\",caller=\"anonymous\"} 1");
  has(text, "fleetgate_requests_total{model=\"m\",status=\"200\",caller=\"anonymous\"} 1");
  char line[128];
  snprintf(line, sizeof(line), "fleetgate_failovers_total{reason=\"%s\"} 1", gw_fail_name(GW_FAIL_CONNECT));
  has(text, line);
  free(text);
  fx_free(f);
}

static void test_histograms_are_cumulative(void **state) {
  (void)state;
  fixture *f = fx_new("p1");
  gw_job a = {0}, b = {0};
  ended(f, &a, "m", NULL, 200, 0.3);
  ended(f, &b, "m", NULL, 200, 7);
  char *text = scrape(f);
  has(text, "fleetgate_request_duration_seconds_bucket{model=\"m\",le=\"0.25\"} 0");
  has(text, "fleetgate_request_duration_seconds_bucket{model=\"m\",le=\"0.5\"} 1");
  has(text, "fleetgate_request_duration_seconds_bucket{model=\"m\",le=\"5\"} 1");
  has(text, "fleetgate_request_duration_seconds_bucket{model=\"m\",le=\"10\"} 2");
  has(text, "fleetgate_request_duration_seconds_bucket{model=\"m\",le=\"+Inf\"} 2");
  has(text, "fleetgate_request_duration_seconds_sum{model=\"m\"} 7.300000");
  has(text, "fleetgate_request_duration_seconds_count{model=\"m\"} 2");
  free(text);
  fx_free(f);
}

/* A phone whose id holds a newline and a quote: its samples stay one line each. */
static void test_every_line_is_a_comment_or_one_sample(void **state) {
  (void)state;
  fixture *f = fx_new("p\"1\nx");
  gw_job a = {0};
  ended(f, &a, "m", NULL, 200, 0.3);
  char *text = scrape(f);
  has(text, "fleetgate_replica_up{replica=\"p\\\"1\\nx\"} 1");
  has(text, "fleetgate_replica_state{replica=\"p\\\"1\\nx\",state=\"ready\"} 1");
  has(text, "fleetgate_replicas{state=\"ready\"} 1");
  size_t lines = 0;
  for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save), lines++) {
    if (l[0] == '#') {
      assert_true(strncmp(l, "# HELP fleetgate_", 17) == 0 || strncmp(l, "# TYPE fleetgate_", 17) == 0);
      continue;
    }
    assert_true(strncmp(l, "fleetgate_", 10) == 0);
    /* name, optional {labels} whose quotes pair up, one space, a number */
    const char *p = l;
    while (*p && *p != '{' && *p != ' ') p++;
    if (*p == '{') {
      int in = 0;
      for (p++; *p && (in || *p != '}'); p++) {
        if (in && *p == '\\') p++;
        else if (*p == '"') in = !in;
      }
      assert_int_equal(*p, '}');
      p++;
    }
    assert_int_equal(*p, ' ');
    char *end;
    (void)strtod(p + 1, &end);
    if (*end != '\0') fail_msg("not one sample: %s", l);
  }
  assert_true(lines > 100);
  free(text);
  fx_free(f);
}

static void test_a_scrape_that_does_not_fit_is_an_error(void **state) {
  (void)state;
  fixture *f = fx_new("p1");
  pr_buf out;
  pr_buf_init(&out, 2048);
  assert_int_equal(gw_metrics_render(&f->gw, &out), PR_ETOOLARGE);
  pr_buf_free(&out);
  fx_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_requests_are_counted_by_model_status_and_escaped_caller),
      cmocka_unit_test(test_a_broken_stream_is_a_stream_error_and_a_failover_is_counted),
      cmocka_unit_test(test_histograms_are_cumulative),
      cmocka_unit_test(test_every_line_is_a_comment_or_one_sample),
      cmocka_unit_test(test_a_scrape_that_does_not_fit_is_an_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
