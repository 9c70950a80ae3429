/* Unit tests for the bridge's JSON-RPC lines (agent/tunrpc.c): the requests' exact shape,
 * answers taken and junk refused (wrong id, error, non-https or foreign URLs, oversize),
 * and the tunnel key's round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "err.h"
#include "tunrpc.h"

static void test_start_request_has_the_reference_shape(void **state) {
  (void)state;
  pr_buf b;
  pr_buf_init(&b, 1 << 16);
  ag_tunspec s = {.relays = {"relay-1.mainnet.acurast.com:4433", "r2.example:1"}, .n_relays = 2,
                  .domain = "acu.run", .local_addr = "127.0.0.1:8080", .key_b64 = "QUJD"};
  assert_int_equal(ag_tunrpc_start_request(&b, &s, 7), 0);
  assert_true(b.len > 1 && b.data[b.len - 1] == '\n');
  assert_null(memchr(b.data, '\n', b.len - 1));
  cJSON *o = cJSON_ParseWithLength(b.data, b.len);
  assert_non_null(o);
  assert_string_equal(cJSON_GetObjectItem(o, "jsonrpc")->valuestring, "2.0");
  assert_string_equal(cJSON_GetObjectItem(o, "method")->valuestring, "tunnel_start");
  assert_int_equal(cJSON_GetObjectItem(o, "id")->valueint, 7);
  cJSON *p = cJSON_GetObjectItem(o, "params");
  assert_true(cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1);
  cJSON *spec = cJSON_GetArrayItem(p, 0);
  cJSON *addrs = cJSON_GetObjectItem(spec, "serverAddrs");
  assert_int_equal(cJSON_GetArraySize(addrs), 2);
  assert_string_equal(cJSON_GetArrayItem(addrs, 0)->valuestring, "relay-1.mainnet.acurast.com:4433");
  assert_string_equal(cJSON_GetObjectItem(spec, "domainSuffix")->valuestring, "acu.run");
  assert_string_equal(cJSON_GetObjectItem(spec, "localAddr")->valuestring, "127.0.0.1:8080");
  cJSON *k = cJSON_GetObjectItem(spec, "primaryKey");
  assert_string_equal(cJSON_GetObjectItem(k, "algorithm")->valuestring, "Secp256r1");
  assert_string_equal(cJSON_GetObjectItem(k, "bytes")->valuestring, "QUJD");
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(spec, "acmeStaging")));
  cJSON_Delete(o);
  pr_buf_reset(&b);
  assert_int_equal(ag_tunrpc_request(&b, "tunnel_status", 8), 0);
  assert_string_equal(pr_buf_cstr(&b), "{\"jsonrpc\":\"2.0\",\"method\":\"tunnel_status\",\"params\":[],\"id\":8}\n");
  pr_buf_free(&b);
}

static int start(const char *line, ag_tunnel_info *info) {
  char why[200];
  int rc = ag_tunrpc_parse_start(line, strlen(line), 3, "acu.run", info, why, sizeof(why));
  assert_true(strlen(why) > 0);
  return rc;
}

static void test_start_answers(void **state) {
  (void)state;
  ag_tunnel_info i;
  assert_int_equal(start("{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://abc123.acu.run:8443\","
                         "\"clientId\":\"abc123\"},\"id\":3}\n", &i), 0);
  assert_string_equal(i.url, "https://abc123.acu.run:8443");
  assert_string_equal(i.client_id, "abc123");
  assert_int_equal(start("{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://X.ACU.RUN\",\"clientId\":\"X\","
                         "\"secondaryUrl\":\"https://y.acu.run\"},\"id\":3}", &i), 0);
  /* junk */
  static const char *const bad[] = {
      "",
      "not json",
      "[1]",
      "{\"jsonrpc\":\"1.0\",\"result\":{\"url\":\"https://a.acu.run\",\"clientId\":\"a\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://a.acu.run\",\"clientId\":\"a\"},\"id\":4}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://a.acu.run\",\"clientId\":\"a\"}}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"http://a.acu.run\",\"clientId\":\"a\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://a.evil.example\",\"clientId\":\"a\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://acu.run\",\"clientId\":\"a\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://a.xacu.run\",\"clientId\":\"a\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://1.2.3.4\",\"clientId\":\"a\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://u@a.acu.run\",\"clientId\":\"a\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://a.acu.run/?q\",\"clientId\":\"a\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://a.acu.run\",\"clientId\":\"a b\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://a.acu.run\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":5,\"clientId\":\"a\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":\"https://a.acu.run\",\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"error\":{\"code\":-1,\"message\":\"no relay\"},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{},\"error\":{},\"id\":3}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://a.acu.run\",\"clientId\":\"a\"},\"id\":3}\n{}",
  };
  for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
    int rc = start(bad[k], &i);
    if (rc >= 0) fail_msg("accepted: %s", bad[k]);
    assert_string_equal(i.url, "");
  }
  char why[200];
  assert_int_equal(ag_tunrpc_parse_start("{\"jsonrpc\":\"2.0\",\"error\":{\"message\":\"no\\u0001relay\"},\"id\":3}",
                                         60, 3, "acu.run", &i, why, sizeof(why)), -EPROTO);
  assert_non_null(strstr(why, "no?relay"));
  /* oversize */
  size_t n = AG_TUNRPC_MAX_LINE + 10;
  char *big = malloc(n + 1);
  memset(big, ' ', n);
  big[n] = '\0';
  assert_int_equal(ag_tunrpc_parse_start(big, n, 3, "acu.run", &i, why, sizeof(why)), PR_ETOOLARGE);
  free(big);
}

static void test_start_answer_one_byte_short_is_refused(void **state) {
  (void)state;
  const char *ok = "{\"jsonrpc\":\"2.0\",\"result\":{\"url\":\"https://abc.acu.run\",\"clientId\":\"abc\"},\"id\":3}";
  ag_tunnel_info i;
  char why[200];
  for (size_t n = 0; n < strlen(ok); n++)
    assert_true(ag_tunrpc_parse_start(ok, n, 3, "acu.run", &i, why, sizeof(why)) < 0);
  assert_int_equal(ag_tunrpc_parse_start(ok, strlen(ok), 3, "acu.run", &i, why, sizeof(why)), 0);
}

static void test_status_answers(void **state) {
  (void)state;
  char why[200];
  int st = 99;
  const char *l = "{\"jsonrpc\":\"2.0\",\"result\":{\"status\":1},\"id\":9}\n";
  assert_int_equal(ag_tunrpc_parse_status(l, strlen(l), 9, &st, why, sizeof(why)), 0);
  assert_int_equal(st, AG_TUN_RUNNING);
  l = "{\"jsonrpc\":\"2.0\",\"result\":{\"status\":-1},\"id\":9}";
  assert_int_equal(ag_tunrpc_parse_status(l, strlen(l), 9, &st, why, sizeof(why)), 0);
  assert_int_equal(st, AG_TUN_NONE);
  static const char *const bad[] = {
      "{\"jsonrpc\":\"2.0\",\"result\":{\"status\":4},\"id\":9}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"status\":1.5},\"id\":9}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"status\":\"1\"},\"id\":9}",
      "{\"jsonrpc\":\"2.0\",\"result\":{},\"id\":9}",
      "{\"jsonrpc\":\"2.0\",\"result\":{\"status\":1},\"id\":\"9\"}",
  };
  for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
    assert_true(ag_tunrpc_parse_status(bad[k], strlen(bad[k]), 9, &st, why, sizeof(why)) < 0);
  l = "{\"jsonrpc\":\"2.0\",\"result\":{},\"id\":2}";
  assert_int_equal(ag_tunrpc_parse_ok(l, strlen(l), 2, why, sizeof(why)), 0);
  assert_string_equal(ag_tunrpc_status_name(AG_TUN_FAILED), "failed");
}

static void test_settings(void **state) {
  (void)state;
  assert_int_equal(ag_tunrpc_check_relay("relay-1.mainnet.acurast.com:4433"), 0);
  assert_int_equal(ag_tunrpc_check_relay("127.0.0.1:1"), 0);
  assert_true(ag_tunrpc_check_relay("relay:0") < 0);
  assert_true(ag_tunrpc_check_relay("relay") < 0);
  assert_true(ag_tunrpc_check_relay(":44") < 0);
  assert_true(ag_tunrpc_check_relay("re lay:44") < 0);
  assert_int_equal(ag_tunrpc_check_domain("acu.run"), 0);
  assert_int_equal(ag_tunrpc_check_domain("localhost"), 0);
  assert_true(ag_tunrpc_check_domain("acu..run") < 0);
  assert_true(ag_tunrpc_check_domain("-a.run") < 0);
  assert_true(ag_tunrpc_check_domain("") < 0);
}

static void test_key_round_trip(void **state) {
  (void)state;
  char *a = NULL, *b = NULL;
  assert_int_equal(ag_tunkey_generate(&a), 0);
  assert_true(strlen(a) > 100 && strlen(a) < 300);
  assert_int_equal(ag_tunkey_from_text(a, &b), 0);
  assert_string_equal(a, b); /* the same key, the same bytes */
  free(b);
  /* whitespace is ignored */
  size_t n = strlen(a);
  char *spaced = malloc(n + 4);
  snprintf(spaced, n + 4, " %.*s\n%s\n", 20, a, a + 20);
  assert_int_equal(ag_tunkey_from_text(spaced, &b), 0);
  assert_string_equal(a, b);
  free(b);
  free(spaced);
  char *c = NULL;
  assert_int_equal(ag_tunkey_generate(&c), 0);
  assert_string_not_equal(a, c);
  free(a);
  free(c);
  assert_int_equal(ag_tunkey_from_text("not base64!", &b), PR_EPARSE);
  assert_int_equal(ag_tunkey_from_text("QUJDRA==", &b), PR_EPARSE);
  assert_null(b);
  /* an Ed25519 PKCS#8 key: parsed, but not P-256 */
  assert_int_equal(ag_tunkey_from_text("MC4CAQAwBQYDK2VwBCIEIEm0Mf0O7sMgcJvMZzG1EJrnEMaoLqsHqgtOLdB5Ql1H", &b), PR_ETYPE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_start_request_has_the_reference_shape),
      cmocka_unit_test(test_start_answers),
      cmocka_unit_test(test_start_answer_one_byte_short_is_refused),
      cmocka_unit_test(test_status_answers),
      cmocka_unit_test(test_settings),
      cmocka_unit_test(test_key_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
