/* Unit tests for gateway/config.c: a valid file loads with its defaults; each kind of
 * mistake is reported as file:line:col: path: message pointing at the right place. */
#include <fcntl.h>
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

/* The same where the column does not matter: only the message. */
static void expect_message(const char *text, const char *want) {
  gw_config *c = NULL;
  pr_buf e;
  assert_true(load(text, &c, &e) < 0);
  assert_null(c);
  if (!strstr(pr_buf_cstr(&e), want)) fail_msg("want %s, got: %s", want, pr_buf_cstr(&e));
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
  expect_error("{\n  \"replicas\": [\n    {\"id\": \"a\", \"url\": \"https://x\", \"models\": [\"m\"]},\n"
               "    {\"id\": \"b\", \"url\": \"https://y\", \"models\": [\"m\"], \"slots\": \"two\"}\n  ]\n}\n",
               4, 63, "replicas[1].slots");
}

static void test_unknown_key_position(void **state) {
  expect_error("{\n  \"queue\": {\"max\": 10,\n            \"timeout\": 5}\n}\n", 3, 13, "queue.timeout: unknown key");
}

static void test_duplicate_id(void **state) {
  expect_error("{\"replicas\": [\n {\"id\": \"a\", \"url\": \"https://x\", \"models\": [\"m\"]},\n"
               " {\"id\": \"a\", \"url\": \"https://y\", \"models\": [\"m\"]}]}",
               3, 9, "duplicate replica id");
}

/* The models the fleet is to serve: names kept in order, each named once, a name required. */
static void test_models(void **state) {
  (void)state;
  gw_config *c = NULL;
  pr_buf e;
  int rc = load("{\"models\": [{\"name\": \"qwen3.5-9b\"}, {\"name\": \"later\"}]}", &c, &e);
  if (rc) fail_msg("%s", pr_buf_cstr(&e));
  assert_int_equal(c->n_models, 2);
  assert_string_equal(c->models[0], "qwen3.5-9b");
  assert_string_equal(c->models[1], "later");
  gw_config_unref(c);
  pr_buf_free(&e);
  expect_error("{\"models\": [{\"name\": \"m\"},\n {\"name\": \"m\"}]}", 2, 11, "models[1].name: duplicate model \"m\"");
  expect_message("{\"models\": [{\"nme\": \"m\"}]}", "models[0].nme: unknown key");
  expect_message("{\"models\": [{}]}", "models[0].name: missing");
  expect_message("{\"models\": [{\"name\": \"\"}]}", "models[0].name: expected a model name");
  expect_message("{\"models\": [\"m\"]}", "models[0]: expected an object");
}

static void test_bad_url_and_env(void **state) {
  expect_error("{\"replicas\": [{\"id\": \"a\", \"url\": \"ftp://x\", \"models\": [\"m\"]}]}", 1, 34,
               "replicas[0].url");
  expect_error("{\"replicas\": [{\"id\": \"a\", \"url\": \"https://x\", \"models\": [\"m\"],\n"
               "  \"token_env\": \"FLEETGATE_SURELY_UNSET_VAR\"}]}",
               2, 16, "FLEETGATE_SURELY_UNSET_VAR is not set");
}

/* The URL policy at load: https only unless upstream.allow_http, nothing but a host, a
 * port and a plain path; allow_addresses parsed as CIDRs, each error where it is. */
static void test_url_policy(void **state) {
  expect_error("{\"replicas\": [\n {\"id\": \"a\", \"url\": \"http://x\", \"models\": [\"m\"]}]}", 2, 21,
               "replicas[0].url: plain http:// is not allowed (set upstream.allow_http)");
  expect_error("{\"replicas\": [{\"id\": \"a\", \"url\": \"https://h:9200/idx/_search?q=\", \"models\": [\"m\"]}]}",
               1, 34, "replicas[0].url: the URL may not have a query");
  expect_error("{\"replicas\": [{\"id\": \"a\", \"url\": \"https://a:b@h\", \"models\": [\"m\"]}]}", 1, 34,
               "userinfo");
  expect_error("{\"replicas\": [{\"id\": \"a\", \"url\": \"https://h/../admin\", \"models\": [\"m\"]}]}", 1, 34,
               "\"..\" segments");
  expect_error("{\"upstream\": {\"allow_addresses\": [\"127.0.0.0/8\",\n  \"10.0.0.1/8\"]}}", 2, 3,
               "upstream.allow_addresses[1]: the address has bits set past the prefix length");
  expect_error("{\"upstream\": {\"allow_addresses\": [\"localhost\"]}}", 1, 35,
               "upstream.allow_addresses[0]: expected an IPv4 or IPv6 range");
  expect_error("{\"upstream\": {\"allow_addresses\": \"127.0.0.0/8\"}}", 1, 34, "upstream.allow_addresses: expected an array");
  expect_error("{\"upstream\": {\"allow_http\": 1}}", 1, 29, "upstream.allow_http: expected a boolean");
  gw_config *c = NULL;
  pr_buf e;
  if (load("{\"upstream\": {\"allow_http\": true, \"allow_addresses\": [\"127.0.0.0/8\", \"::1/128\"]},\n"
           " \"replicas\": [{\"id\": \"a\", \"url\": \"http://127.0.0.1:9/v1prefix/\", \"models\": [\"m\"]}]}",
           &c, &e))
    fail_msg("%s", pr_buf_cstr(&e));
  assert_int_equal(c->allow_http, 1);
  assert_int_equal(c->n_allow_addresses, 2);
  assert_int_equal(c->allow_addresses[1].prefix, 128);
  assert_string_equal(c->replicas[0].url, "http://127.0.0.1:9/v1prefix");
  gw_config_unref(c);
  pr_buf_free(&e);
  /* the defaults: https only, no range allowed */
  assert_int_equal(load("{}", &c, &e), 0);
  assert_int_equal(c->allow_http, 0);
  assert_int_equal(c->n_allow_addresses, 0);
  gw_config_unref(c);
  pr_buf_free(&e);
}

static void test_range(void **state) {
  expect_error("{\"replicas\": [{\"id\": \"a\", \"url\": \"https://x\", \"models\": [\"m\"], \"slots\": 0}]}",
               1, 73, "replicas[0].slots");
  expect_error("{\"queue\": {\"timeout_s\": -1}}", 1, 25, "queue.timeout_s");
}

/* costs: the currency shown with every amount, a phone's claim's cap, and a replica's
 * cost_per_day left out (< 0: its phone may say) or given. */
static void test_costs(void **state) {
  (void)state;
  gw_config *c = NULL;
  pr_buf e;
  int rc = load("{\"costs\": {\"currency\": \"EUR\", \"max_claimed_per_day\": 2},\n"
                " \"replicas\": [{\"id\": \"a\", \"url\": \"https://x\", \"models\": [\"m\"]},"
                " {\"id\": \"b\", \"url\": \"https://y\", \"models\": [\"m\"], \"cost_per_day\": 0}]}",
                &c, &e);
  if (rc) fail_msg("%s", pr_buf_cstr(&e));
  assert_string_equal(c->cost_currency, "EUR");
  assert_true(c->cost_claim_max == 2);
  assert_true(c->replicas[0].cost_per_day < 0);
  assert_true(c->replicas[1].cost_per_day == 0);
  gw_config_unref(c);
  pr_buf_free(&e);
  rc = load("{}", &c, &e);
  assert_int_equal(rc, 0);
  assert_null(c->cost_currency); /* "ACU" where it is shown */
  assert_true(c->cost_claim_max == 100);
  gw_config_unref(c);
  pr_buf_free(&e);
  expect_message("{\"costs\": {\"currency\": \"euro \\\"sign\\\"\"}}", "costs.currency: expected 1 to 16");
  expect_message("{\"costs\": {\"currency\": \"\"}}", "costs.currency");
  expect_message("{\"costs\": {\"max_claimed_per_day\": -1}}", "costs.max_claimed_per_day");
  expect_message("{\"replicas\": [{\"id\": \"a\", \"url\": \"https://x\", \"models\": [\"m\"], "
                 "\"cost_per_day\": -0.5}]}", "replicas[0].cost_per_day");
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

/* A file without settings gets the defaults the settings table states (and that the
 * gateway has always had). */
static void test_defaults(void **state) {
  gw_config *c = NULL;
  pr_buf e;
  if (load("{}", &c, &e)) fail_msg("%s", pr_buf_cstr(&e));
  assert_int_equal(c->n_listen, 1);
  assert_string_equal(c->listen[0].address, "127.0.0.1:8080");
  assert_int_equal(c->max_body_bytes, 8u << 20);
  assert_true(c->header_timeout_s == 10 && c->idle_timeout_s == 60 && c->send_timeout_s == 60);
  assert_int_equal(c->max_connections, 10000);
  assert_int_equal(c->queue_max, 1000);
  assert_true(c->queue_timeout_s == 600);
  assert_int_equal(c->retries, 3);
  assert_int_equal(c->default_max_tokens, 1024);
  assert_true(c->expected_output_tokens == 128);
  assert_null(c->ca_file);
  assert_int_equal(c->tls_verify, 1);
  assert_true(c->connect_timeout_s == 10 && c->timeout_margin == 3 && c->timeout_min_s == 30);
  assert_true(c->stream_idle_timeout_s == 60 && c->refusal_window_s == 10);
  assert_true(c->health_interval_s == 5 && c->health_timeout_s == 3);
  assert_true(c->health_down_interval_s == 15);
  assert_int_equal(c->rise, 2);
  assert_int_equal(c->fail_threshold, 2);
  assert_true(c->cooldown_s == 5 && c->cooldown_max_s == 120);
  assert_null(c->fleet_secret);
  assert_true(c->heartbeat_timeout_s == 15 && c->heartbeat_interval_s == 5 &&
              c->heartbeat_max_skew_s == 30);
  assert_true(c->shutdown_timeout_s == 30);
  assert_string_equal(c->log_level, "info");
  assert_null(c->admin_listen); /* no admin section: no admin listener */
  assert_null(c->admin_token);
  assert_int_equal(c->admin_public_read, 0);
  assert_null(c->redis_host);
  assert_null(c->keys);
  assert_int_equal(c->n_replicas, 0);
  gw_config_unref(c);
  pr_buf_free(&e);
  /* health.down_interval_s follows interval_s when left out; an admin section listens
   * on 127.0.0.1:9090; an item's scalars take their defaults */
  if (load("{\"health\": {\"interval_s\": 2}, \"admin\": {\"token\": \"0123456789abcdef\"},\n"
           " \"api_keys\": [{\"name\": \"k\", \"key_sha256\": \"" 
           "00000000000000000000000000000000000000000000000000000000000000ff\"}],\n"
           " \"replicas\": [{\"id\": \"a\", \"url\": \"https://x\", \"models\": [\"m\"]}],\n"
           " \"redis\": {\"url\": \"redis://h\", \"key_env\": \"FG_TEST_REDIS_KEY\"}}",
           &c, &e))
    fail_msg("%s", pr_buf_cstr(&e));
  assert_true(c->health_down_interval_s == 6);
  assert_string_equal(c->admin_listen, "127.0.0.1:9090");
  assert_int_equal(c->n_keys, 1);
  assert_true(c->keys[0].rpm == 0 && c->keys[0].tpm == 0 && c->keys[0].weight == 1);
  assert_int_equal(c->keys[0].concurrency, 0);
  assert_int_equal(c->keys[0].priority, 0);
  assert_int_equal(c->keys[0].sha256[31], 0xff);
  assert_int_equal(c->replicas[0].slots, 0);
  /* not given: the fleet's prior, else 50 and 5 (gw_replica_new) */
  assert_true(c->replicas[0].prefill_tps < 0 && c->replicas[0].decode_tps < 0);
  assert_int_equal(c->replicas[0].n_ctx, 0);
  assert_string_equal(c->redis_host, "h");
  assert_int_equal(c->redis_port, 6379);
  assert_string_equal(c->redis_prefix, "fleetgate:");
  assert_true(c->redis_timeout_s == 1 && c->lease_ttl_s == 15);
  assert_string_equal(c->redis_key, "0123456789abcdef0123456789abcdef");
  assert_true(c->redis_window_s == 30);
  assert_null(c->redis_username);
  assert_null(c->redis_password);
  gw_config_unref(c);
  pr_buf_free(&e);
}

/* Every section refuses keys the table does not list for it, items of lists included. */
static void test_unknown_keys_in_every_section(void **state) {
  expect_error("{\"limits\": {\"max_body\": 1}}", 1, 13, "limits.max_body: unknown key");
  expect_error("{\"health\": {\"falls\": 1}}", 1, 13, "health.falls: unknown key");
  expect_error("{\"redis\": {\"url\": \"redis://h\", \"db\": 1}}", 1, 32, "redis.db: unknown key");
  expect_error("{\"api_keys\": [{\"name\": \"k\", \"rmp\": 1}]}", 1, 29, "api_keys[0].rmp: unknown key");
  expect_error("{\"timeout_s\": 1}", 1, 2, "timeout_s: unknown key");
  /* a section's own keys are not known elsewhere */
  expect_error("{\"queue\": {\"retries\": 1}}", 1, 12, "queue.retries: unknown key");
}

/* The reference is printed from the table: each section, with types, defaults, ranges. */
static void test_settings_markdown(void **state) {
  pr_buf b;
  pr_buf_init(&b, 1 << 20);
  assert_int_equal(gw_config_settings_markdown(&b), 0);
  const char *md = pr_buf_cstr(&b);
  static const char *const want[] = {
    "### top level\n\n| key | type | default | range | meaning |\n|---|---|---|---|---|\n| `listen` |",
    "\n### `health`\n",
    "| `refusal_window_s` | number | 10 | 0 – 600 | ",
    "| `max_body_bytes` | integer | 8388608 (8 MiB) | 1024 – 2^32 | ",
    "| `down_interval_s` | number | 3 × `interval_s` | 0.05 – 86400 | ",
    "| `tls_verify` | boolean | `true` | — | ",
    "| `prefix` | string | `fleetgate:` | — | ",
    "| `tpm` | number | 0 (none) | 0 – 1e12 | ",
    "| `n_ctx` | integer | learned | 0 – 2^40 | ",
  };
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    if (!strstr(md, want[i])) fail_msg("missing %s in:\n%s", want[i], md);
  pr_buf_free(&b);
}

static void test_missing_file(void **state) {
  gw_config *c = NULL;
  pr_buf e;
  pr_buf_init(&e, 4096);
  assert_true(gw_config_load("/nonexistent/fleetgate.json", &c, &e) < 0);
  assert_non_null(strstr(pr_buf_cstr(&e), "/nonexistent/fleetgate.json:0:0: cannot open"));
  pr_buf_free(&e);
}

/* GW_CONFIG_NO_FILES (--check-config --no-files): certificates and data_dir that do not
 * exist yet are not an error, and their paths are kept; everything else still is. */
static void test_no_files(void **state) {
  (void)state;
  const char *text = "{\"listen\": [{\"address\": \"127.0.0.1:8443\", \"tls\": "
                     "{\"cert\": \"/nonexistent/fullchain.pem\", \"key\": \"/nonexistent/key.pem\"}}],\n"
                     " \"data_dir\": \"/nonexistent/fleetgate\"}";
  gw_config *c = NULL;
  pr_buf e;
  assert_true(load(text, &c, &e) < 0); /* at a start: both said */
  assert_non_null(strstr(pr_buf_cstr(&e), "listen[0].tls: cannot load the certificate chain"));
  assert_non_null(strstr(pr_buf_cstr(&e), "data_dir: /nonexistent/fleetgate: No such file"));
  pr_buf_free(&e);
  char p[64];
  snprintf(p, sizeof(p), "/tmp/fg-config-XXXXXX");
  int fd = mkstemp(p);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  pr_buf_init(&e, 4096);
  assert_int_equal(gw_config_load_opts(p, GW_CONFIG_NO_FILES, &c, &e), 0);
  assert_string_equal(c->listen[0].tls_cert, "/nonexistent/fullchain.pem");
  assert_string_equal(c->data_dir, "/nonexistent/fleetgate");
  gw_config_unref(c);
  pr_buf_free(&e);
  /* the rest is checked as always */
  const char *bad = "{\"listen\": \"127.0.0.1:8080\", \"data_dir\": \"/nonexistent\", \"queue\": {\"max\": -5}}";
  fd = open(p, O_WRONLY | O_TRUNC);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, bad, strlen(bad)), (ssize_t)strlen(bad));
  close(fd);
  pr_buf_init(&e, 4096);
  c = NULL;
  assert_true(gw_config_load_opts(p, GW_CONFIG_NO_FILES, &c, &e) < 0);
  assert_null(c);
  assert_non_null(strstr(pr_buf_cstr(&e), "queue.max"));
  assert_null(strstr(pr_buf_cstr(&e), "data_dir"));
  pr_buf_free(&e);
  unlink(p);
}

/* The sealing key is required with a redis section, long, and not the fleet secret;
 * the password comes from the URL or password_env; the gateway id has no blanks. */
static void test_redis_key_user_and_password(void **state) {
  (void)state;
  expect_error("{\"redis\": {\"url\": \"redis://h\"}}", 1, 11, "redis.key_env: missing");
  expect_message("{\"redis\": {\"url\": \"redis://h\", \"key_env\": \"FG_TEST_SHORT\"}}", "redis.key_env: environment variable FG_TEST_SHORT must hold the gateways' shared key");
  expect_message("{\"redis\": {\"url\": \"redis://h\", \"key_env\": \"FG_TEST_UNSET_VARIABLE\"}}", "at least 32 characters");
  expect_message("{\"fleet\": {\"secret_env\": \"FG_TEST_REDIS_KEY\"},\n"
               " \"redis\": {\"url\": \"redis://h\", \"key_env\": \"FG_TEST_REDIS_KEY\"}}", "must not be the fleet secret");
  expect_message("{\"redis\": {\"url\": \"redis://:pw@h\", \"key_env\": \"FG_TEST_REDIS_KEY\",\n"
               " \"password_env\": \"FG_TEST_REDIS_PASSWORD\"}}", "not both");
  expect_message("{\"redis\": {\"url\": \"redis://h\", \"key_env\": \"FG_TEST_REDIS_KEY\",\n"
               " \"password_env\": \"FG_TEST_UNSET_VARIABLE\"}}", "is not set");
  expect_message("{\"redis\": {\"url\": \"redis://h\", \"key_env\": \"FG_TEST_REDIS_KEY\",\n"
               " \"username\": \"fleetgate\"}}", "redis.username: a username needs a password");
  expect_message("{\"redis\": {\"url\": \"redis://fleetgate:pw@h\", \"key_env\": \"FG_TEST_REDIS_KEY\"}}",
                 "redis.url: put the user in redis.username");
  expect_message("{\"redis\": {\"url\": \"redis://h\", \"key_env\": \"FG_TEST_REDIS_KEY\",\n"
               " \"gateway_id\": \"gw 1\"}}", "redis.gateway_id: expected 1 to 63 characters without blanks");
  gw_config *c = NULL;
  pr_buf e;
  if (load("{\"redis\": {\"url\": \"redis://h:7000/2\", \"key_env\": \"FG_TEST_REDIS_KEY\",\n"
           " \"username\": \"fleetgate\", \"password_env\": \"FG_TEST_REDIS_PASSWORD\", \"message_window_s\": 5}}",
           &c, &e))
    fail_msg("%s", pr_buf_cstr(&e));
  assert_string_equal(c->redis_username, "fleetgate");
  assert_string_equal(c->redis_password, "redis-password-from-env");
  assert_int_equal(c->redis_port, 7000);
  assert_int_equal(c->redis_db, 2);
  assert_true(c->redis_window_s == 5);
  gw_config_unref(c);
  pr_buf_free(&e);
}

int main(void) {
  setenv("FG_TEST_REDIS_KEY", "0123456789abcdef0123456789abcdef", 1);
  setenv("FG_TEST_SHORT", "0123456789abcdef", 1);
  setenv("FG_TEST_REDIS_PASSWORD", "redis-password-from-env", 1);
  unsetenv("FG_TEST_UNSET_VARIABLE");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_with_defaults),   cmocka_unit_test(test_syntax_error_position),
      cmocka_unit_test(test_wrong_type_position),   cmocka_unit_test(test_unknown_key_position),
      cmocka_unit_test(test_duplicate_id),          cmocka_unit_test(test_bad_url_and_env),
      cmocka_unit_test(test_models),
      cmocka_unit_test(test_range),                 cmocka_unit_test(test_costs),
      cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_no_files),
      cmocka_unit_test(test_listen_addresses_checked),
      cmocka_unit_test(test_defaults),              cmocka_unit_test(test_unknown_keys_in_every_section),
      cmocka_unit_test(test_settings_markdown),     cmocka_unit_test(test_url_policy),
      cmocka_unit_test(test_redis_key_user_and_password),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
