/* Unit tests for the agent front's allow-list (agent/route.c) and the replica token's
 * check (agent/conf.c): what reaches the engine, and what is refused with which answer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "conf.h"
#include "route.h"

static ag_route_kind kind(const char *method, const char *url) {
  ag_route r;
  ag_route_find(method, url, &r);
  return r.kind;
}

static void test_allow_listed_calls_are_relayed(void **state) {
  (void)state;
  ag_route r;
  ag_route_find("POST", "/v1/chat/completions", &r);
  assert_int_equal(r.kind, AG_ROUTE_RELAY);
  assert_string_equal(r.path, "/v1/chat/completions");
  assert_string_equal(r.method, "POST");
  assert_true(r.completion && r.chat);
  ag_route_find("POST", "/v1/completions", &r);
  assert_int_equal(r.kind, AG_ROUTE_RELAY);
  assert_true(r.completion && !r.chat);
  ag_route_find("GET", "/v1/models", &r);
  assert_int_equal(r.kind, AG_ROUTE_RELAY);
  assert_false(r.completion);
  assert_int_equal(kind("GET", "/agent/v1/status"), AG_ROUTE_STATUS);
  assert_int_equal(kind("GET", "/health"), AG_ROUTE_HEALTH);
  assert_int_equal(kind("GET", "/v1/health"), AG_ROUTE_HEALTH);
  assert_int_equal(kind("GET", "/health?x=1"), AG_ROUTE_HEALTH); /* own endpoints forward nothing */
}

static void test_traversal_and_odd_paths_are_refused(void **state) {
  (void)state;
  static const char *const bad[] = {
    "/v1/../slots", "/v1/../slots/0?action=save", "/v1/%2e%2e/slots", "/v1/%2E%2E/slots",
    "/v1/chat/completions/../../props", "/v1//models", "//v1/models", "/v1/./models", "/v1/models/.",
    "/v1/models/..", "/v1\\..\\slots", "/v1/%2fslots", "/v1/%5cslots", "/v1/models%00", "v1/models", "",
    "/v1/chat/completions\t", "/v1/mod els", "http://127.0.0.1/v1/models", "*", "/.", "/..",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ag_route r;
    ag_route_find("POST", bad[i], &r);
    if (r.kind != AG_ROUTE_BAD_PATH) fail_msg("%s: kind %d, expected a bad path", bad[i], r.kind);
  }
  assert_int_equal(kind("GET", NULL), AG_ROUTE_BAD_PATH);
}

static void test_other_paths_are_not_found(void **state) {
  (void)state;
  static const char *const other[] = {
    "/slots", "/slots/0", "/props", "/metrics", "/tokenize", "/detokenize", "/lora-adapters", "/completion",
    "/v1/embeddings", "/v1/models/tiny", "/v1/models/", "/v1/chat/completions/", "/v1/", "/", "/V1/models",
    "/v1/chat/completions.json", "/agent/v1/status/", "/infill", "/apply-template",
  };
  for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
    if (kind("GET", other[i]) != AG_ROUTE_NOT_FOUND) fail_msg("GET %s: not refused as unknown", other[i]);
    if (kind("POST", other[i]) != AG_ROUTE_NOT_FOUND) fail_msg("POST %s: not refused as unknown", other[i]);
  }
}

static void test_wrong_methods_and_queries(void **state) {
  (void)state;
  ag_route r;
  ag_route_find("GET", "/v1/chat/completions", &r);
  assert_int_equal(r.kind, AG_ROUTE_METHOD);
  assert_string_equal(r.allow, "Allow: POST");
  ag_route_find("POST", "/v1/models", &r);
  assert_int_equal(r.kind, AG_ROUTE_METHOD);
  assert_string_equal(r.allow, "Allow: GET");
  assert_int_equal(kind("DELETE", "/v1/completions"), AG_ROUTE_METHOD);
  assert_int_equal(kind("HEAD", "/v1/models"), AG_ROUTE_METHOD);
  assert_int_equal(kind("post", "/v1/completions"), AG_ROUTE_METHOD); /* methods are case-sensitive */
  assert_int_equal(kind("POST", "/health"), AG_ROUTE_METHOD);
  assert_int_equal(kind("PUT", "/agent/v1/status"), AG_ROUTE_METHOD);
  assert_int_equal(kind("POST", "/v1/chat/completions?x=1"), AG_ROUTE_QUERY);
  assert_int_equal(kind("POST", "/v1/chat/completions?"), AG_ROUTE_QUERY);
  assert_int_equal(kind("GET", "/v1/models?limit=1"), AG_ROUTE_QUERY);
  assert_int_equal(kind("POST", "/v1/chat/completions#x"), AG_ROUTE_QUERY);
  assert_int_equal(kind("POST", "/v1/../slots/0?action=save"), AG_ROUTE_BAD_PATH);
}

static void test_tokens(void **state) {
  (void)state;
  char why[160];
  assert_int_equal(ag_conf_check_token("agent-s3cret-token", why, sizeof(why)), 0);
  assert_int_equal(ag_conf_check_token("3f9a0c1b7e2d4a6f8b1c3e5d7f9a0b2c", why, sizeof(why)), 0);
  static const char *const weak[] = {
    "", "changeme", "s3cret", "fifteen-chars-x", "REPLACE_WITH_A_LONG_RANDOM_TOKEN",
    "replace_with_a_long_random_token", "Changeme-Changeme", "aaaaaaaaaaaaaaaaaaaa", "a token with spaces ok",
    "tab\tinside-a-long-token", "trailing-space-token ", "non-ascii-tok\xc3\xa9n-here",
  };
  for (size_t i = 0; i < sizeof(weak) / sizeof(weak[0]); i++) {
    why[0] = '\0';
    if (ag_conf_check_token(weak[i], why, sizeof(why)) == 0) fail_msg("'%s' accepted", weak[i]);
    assert_true(strstr(why, "FLEETGATE_REPLICA_TOKEN") != NULL);
  }
  assert_int_equal(ag_conf_check_token(NULL, why, sizeof(why)), -EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_allow_listed_calls_are_relayed),
    cmocka_unit_test(test_traversal_and_odd_paths_are_refused),
    cmocka_unit_test(test_other_paths_are_not_found),
    cmocka_unit_test(test_wrong_methods_and_queries),
    cmocka_unit_test(test_tokens),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
