/* Unit tests for agent/nljson.c: JSON written as nlohmann::ordered_json writes it, checked
 * against text a real llama-server (February 2025 build) sent back in its error messages:
 * dump(2)'s indentation, compact dump(), numbers from the request's literals, string
 * escapes and duplicate keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "buf.h"
#include "nljson.h"

/* dump(text parsed, indent) with the literals of text. */
static char *dump(const char *text, int indent) {
  cJSON *root = cJSON_Parse(text);
  assert_non_null(root);
  ag_nl_lits lits;
  assert_int_equal(ag_nl_lits_scan(&lits, root, text, strlen(text)), 0);
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  assert_int_equal(ag_nl_dump(&out, root, indent, &lits), 0);
  ag_nl_lits_free(&lits);
  cJSON_Delete(root);
  char *s = strdup(pr_buf_cstr(&out));
  pr_buf_free(&out);
  return s;
}

static void expect(const char *text, int indent, const char *want) {
  char *got = dump(text, indent);
  assert_string_equal(got, want);
  free(got);
}

static void test_indented_like_error_tools_capture(void **state) {
  (void)state;
  /* the tools of tests/system/fixtures/error-tools.http, as the server quoted them */
  expect("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
         "\"properties\":{\"x\":{\"type\":\"string\"}}}}}]",
         2,
         "[\n  {\n    \"type\": \"function\",\n    \"function\": {\n      \"name\": \"f\",\n"
         "      \"parameters\": {\n        \"type\": \"object\",\n        \"properties\": {\n"
         "          \"x\": {\n            \"type\": \"string\"\n          }\n        }\n      }\n"
         "    }\n  }\n]");
  expect("\"hi\"", 2, "\"hi\"");
  expect("[1]", 2, "[\n  1\n]");
}

static void test_empty_containers(void **state) {
  (void)state;
  static const char in[] = "{\"a\":[],\"b\":{},\"c\":[{}],\"d\":[[]]}";
  expect(in, -1, "{\"a\":[],\"b\":{},\"c\":[{}],\"d\":[[]]}");
  expect(in, 2, "{\n  \"a\": [],\n  \"b\": {},\n  \"c\": [\n    {}\n  ],\n  \"d\": [\n    []\n  ]\n}");
  expect("[]", 2, "[]");
  expect("{}", -1, "{}");
}

static void test_numbers_from_literals(void **state) {
  (void)state;
  expect("[-9223372036854775808, 9223372036854775807, 18446744073709551615, 18446744073709551616,"
         " -9223372036854775809, 1E5, 1e15, 1e16, 123456789012345680000, 0.1, 0.0001, 0.00001,"
         " 1.7976931348623157e308, 5e-324, 2.5E-3, -0, 0.30000000000000004, -0.0, 3.0, 1.5, 1e300, 42]",
         -1,
         "[-9223372036854775808,9223372036854775807,18446744073709551615,1.8446744073709552e+19,"
         "-9.223372036854776e+18,100000.0,1e+15,1e+16,1.2345678901234568e+20,0.1,0.0001,1e-05,"
         "1.7976931348623157e+308,5e-324,0.0025,0,0.30000000000000004,-0.0,3.0,1.5,1e+300,42]");
  /* digits inside strings are not literals */
  expect("{\"a-1\":\"2e5\",\"b\":-7.50}", -1, "{\"a-1\":\"2e5\",\"b\":-7.5}");
}

static void test_numbers_without_literals(void **state) {
  (void)state;
  cJSON *a = cJSON_CreateArray();
  cJSON_AddItemToArray(a, cJSON_CreateNumber(7));
  cJSON_AddItemToArray(a, cJSON_CreateNumber(2.5));
  cJSON_AddItemToArray(a, cJSON_CreateNumber(1e20));
  cJSON_AddItemToArray(a, cJSON_CreateNumber(-0.001));
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  assert_int_equal(ag_nl_dump(&out, a, -1, NULL), 0);
  assert_string_equal(out.data, "[7,2.5,1e+20,-0.001]");
  /* literals of another text (a count that does not match) are not used */
  ag_nl_lits lits;
  assert_int_equal(ag_nl_lits_scan(&lits, a, "[1]", 3), 0);
  assert_int_equal(lits.n, 0);
  pr_buf_free(&out);
  cJSON_Delete(a);
}

static void test_strings(void **state) {
  (void)state;
  /* é raw, the escapes nlohmann writes, DEL and '/' as they are */
  expect("[\"\xc3\xa9\\u00e9\\n\\\"\\\\/\\u0001\\u007f\\t\\b\\f\\r\"]", -1,
         "[\"\xc3\xa9\xc3\xa9\\n\\\"\\\\/\\u0001\x7f\\t\\b\\f\\r\"]");
}

static void test_duplicate_keys(void **state) {
  (void)state;
  /* ordered_json: the first position, the last value */
  expect("{\"role\":\"user\",\"content\":\"ok\",\"content\":42,\"role\":\"x\"}", -1,
         "{\"role\":\"x\",\"content\":42}");
}

static void test_type_names(void **state) {
  (void)state;
  static const char *const want[] = {"null", "boolean", "number", "string", "array", "object"};
  cJSON *items[] = {cJSON_CreateNull(), cJSON_CreateTrue(), cJSON_CreateNumber(1),
                    cJSON_CreateString("s"), cJSON_CreateArray(), cJSON_CreateObject()};
  for (size_t i = 0; i < 6; i++) {
    assert_string_equal(ag_nl_type_name(items[i]), want[i]);
    cJSON_Delete(items[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_indented_like_error_tools_capture),
    cmocka_unit_test(test_empty_containers),
    cmocka_unit_test(test_numbers_from_literals),
    cmocka_unit_test(test_numbers_without_literals),
    cmocka_unit_test(test_strings),
    cmocka_unit_test(test_duplicate_keys),
    cmocka_unit_test(test_type_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
