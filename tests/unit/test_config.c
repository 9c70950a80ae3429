/* Unit tests for gateway/config.c: a valid file loads with its defaults; each kind of
 * mistake is reported as file:line:col: path: message pointing at the right place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "buf.h"
#include "config.h"

static char path[64];

static int load(const char *text, gw_config **c, pr_buf *errs) {
  snprintf(path, sizeof(path), "/tmp/fg-config-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  pr_buf_init(errs, 1 << 16);
  int rc = gw_config_load(path, c, errs);
  unlink(path);
  return rc;
}

/* The error text must contain "PATH:LINE:COL: want". */
static void expect_error(const char *text, int line, int col, const char *want) {
  gw_config *c = NULL;
  pr_buf e;
  assert_true(load(text, &c, &e) < 0);
  assert_null(c);
  char prefix[128];
  snprintf(prefix, sizeof(prefix), "%s:%d:%d: ", path, line, col);
  const char *got = pr_buf_cstr(&e);
  if (!strstr(got, prefix) || !strstr(got, want)) fail_msg("want %s%s, got: %s", prefix, want, got);
  pr_buf_free(&e);
}

static void test_valid_with_defaults(void **state) {
  gw_config *c = NULL;
  pr_buf e;
  int rc = load("{\"listen\":[{\"address\":\"127.0.0.1:0\"}],\n"
                " \"replicas\":[{\"id\":\"p1\",\"url\":\"https://abc.acu.run/\",\"models\":[\"m\"],"
                "\"slots\":2,\"token_env\":\"FLEETGATE_TEST_TOKEN\",\"n_ctx\":4096}]}",
                &c, &e);
  if (rc) fail_msg("%s", pr_buf_cstr(&e));
  assert_non_null(c);
  assert_int_equal(c->n_listen, 1);
  assert_int_equal(c->n_replicas, 1);
  assert_string_equal(c->replicas[0].url, "https://abc.acu.run"); /* trailing slash dropped */
  assert_string_equal(c->replicas[0].token, "s3cret");
  assert_int_equal(c->replicas[0].slots, 2);
  assert_int_equal(c->queue_max, 1000);
  assert_int_equal(c->retries, 3);
  assert_int_equal(c->tls_verify, 1);
  gw_config_unref(c);
  pr_buf_free(&e);
}

static void test_syntax_error_position(void **state) {
  expect_error("{\n  \"listen\": [\n    {\"address\": \"127.0.0.1:1\"},,\n  ]\n}\n", 3, 32, "");
}

static void test_wrong_type_position(void **state) {
  expect_error("{\n  \"replicas\": [\n    {\"id\": \"a\", \"url\": \"http://x\", \"models\": [\"m\"]},\n"
               "    {\"id\": \"b\", \"url\": \"http://y\", \"models\": [\"m\"], \"slots\": \"two\"}\n  ]\n}\n",
               4, 62, "replicas[1].slots");
}

static void test_unknown_key_position(void **state) {
  expect_error("{\n  \"queue\": {\"max\": 10,\n            \"timeout\": 5}\n}\n", 3, 13, "queue.timeout: unknown key");
}

static void test_duplicate_id(void **state) {
  expect_error("{\"replicas\": [\n {\"id\": \"a\", \"url\": \"http://x\", \"models\": [\"m\"]},\n"
               " {\"id\": \"a\", \"url\": \"http://y\", \"models\": [\"m\"]}]}",
               3, 9, "duplicate replica id");
}

static void test_bad_url_and_env(void **state) {
  expect_error("{\"replicas\": [{\"id\": \"a\", \"url\": \"ftp://x\", \"models\": [\"m\"]}]}", 1, 34,
               "replicas[0].url");
  expect_error("{\"replicas\": [{\"id\": \"a\", \"url\": \"http://x\", \"models\": [\"m\"],\n"
               "  \"token_env\": \"FLEETGATE_SURELY_UNSET_VAR\"}]}",
               2, 16, "FLEETGATE_SURELY_UNSET_VAR is not set");
}

static void test_range(void **state) {
  expect_error("{\"replicas\": [{\"id\": \"a\", \"url\": \"http://x\", \"models\": [\"m\"], \"slots\": 0}]}",
               1, 72, "replicas[0].slots");
  expect_error("{\"queue\": {\"timeout_s\": -1}}", 1, 25, "queue.timeout_s");
}

/* Listen addresses are checked when the file loads, in each of their three places, so
 * --check-config and a reload catch what the listener would refuse at start. */
static void test_listen_addresses_checked(void **state) {
  /* the string form */
  expect_error("{\"listen\": \"127.0.0.1\"}", 1, 12, "listen: expected HOST:PORT, got \"127.0.0.1\"");
  expect_error("{\"listen\": \"127.0.0.1:99999\"}", 1, 12, "listen: expected HOST:PORT: the port must be");
  expect_error("{\"listen\": \"999.1.1.1:27085\"}", 1, 12, "listen: expected HOST:PORT: the host must be");
  expect_error("{\"listen\": \"example.com:80\"}", 1, 12, "names are not looked up");
  expect_error("{\"listen\": \"127.0.0.1:http\"}", 1, 12, "the port must be");
  /* the list form: strings and objects */
  expect_error("{\"listen\": [\"127.0.0.1:1\",\n  \"127.0.0.1\"]}", 2, 3,
               "listen[1]: expected HOST:PORT, got \"127.0.0.1\"");
  expect_error("{\"listen\": [{\"address\": \"127.0.0.1\"}]}", 1, 25,
               "listen[0].address: expected HOST:PORT, got \"127.0.0.1\"");
  expect_error("{\"listen\": [{\"address\": \"127.0.0.1:99999\"}]}", 1, 25,
               "listen[0].address: expected HOST:PORT: the port must be");
  expect_error("{\"listen\": [{\"address\": \"999.1.1.1:27085\"}]}", 1, 25,
               "listen[0].address: expected HOST:PORT: the host must be");
  expect_error("{\"listen\": [{\"address\": \"[::1:8080\"}]}", 1, 25, "listen[0].address");
  /* the admin listener */
  expect_error("{\"admin\": {\"token\": \"0123456789abcdef\",\n  \"listen\": \"127.0.0.1:99999\"}}", 2, 13,
               "admin.listen: expected HOST:PORT: the port must be");
  expect_error("{\"admin\": {\"token\": \"0123456789abcdef\", \"listen\": \"127.0.0.1\"}}", 1, 51,
               "admin.listen: expected HOST:PORT, got");
  expect_error("{\"admin\": {\"token\": \"0123456789abcdef\", \"listen\": \"999.1.1.1:1\"}}", 1, 51,
               "admin.listen: expected HOST:PORT: the host must be");
  /* every form the listener takes still loads */
  gw_config *c = NULL;
  pr_buf e;
  int rc = load("{\"listen\": [\"127.0.0.1:0\", \"localhost:65535\", \"[::1]:0\", \"[::]:8080\",\n"
                "  \"0.0.0.0:1\", \"*:2\", \":3\", {\"address\": \"10.1.2.3:4\"}],\n"
                " \"admin\": {\"token\": \"0123456789abcdef\", \"listen\": \"[::1]:0\"}}",
                &c, &e);
  if (rc) fail_msg("%s", pr_buf_cstr(&e));
  assert_int_equal(c->n_listen, 8);
  assert_string_equal(c->listen[2].address, "[::1]:0");
  assert_string_equal(c->admin_listen, "[::1]:0");
  gw_config_unref(c);
  pr_buf_free(&e);
}

static void test_missing_file(void **state) {
  gw_config *c = NULL;
  pr_buf e;
  pr_buf_init(&e, 4096);
  assert_true(gw_config_load("/nonexistent/fleetgate.json", &c, &e) < 0);
  assert_non_null(strstr(pr_buf_cstr(&e), "/nonexistent/fleetgate.json:0:0: cannot open"));
  pr_buf_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_with_defaults),   cmocka_unit_test(test_syntax_error_position),
      cmocka_unit_test(test_wrong_type_position),   cmocka_unit_test(test_unknown_key_position),
      cmocka_unit_test(test_duplicate_id),          cmocka_unit_test(test_bad_url_and_env),
      cmocka_unit_test(test_range),                 cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_listen_addresses_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
