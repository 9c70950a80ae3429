/* Unit tests for proto/json.c: syntax errors carry a line and column, the depth limit
 * holds, and every getter's failure names the field's path ("replicas[2].slots"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "err.h"
#include "json.h"

static cJSON *parse_ok(const char *s) {
  pr_json_err err;
  memset(&err, 0, sizeof(err));
  cJSON *j = pr_json_parse(s, strlen(s), 0, &err);
  if (!j) fail_msg("parse failed: %s at %d:%d", err.msg, err.line, err.col);
  return j;
}

static void test_parse_ok_not_nul_terminated(void **state) {
  /* An exact-size heap copy without a NUL lets ASan catch reads past the end. */
  const char *src = "{\"a\": [1, 2, {\"b\": \"x\"}]}  \n";
  size_t n = strlen(src);
  char *p = malloc(n);
  memcpy(p, src, n);
  pr_json_err err;
  cJSON *j = pr_json_parse(p, n, 0, &err);
  assert_non_null(j);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "a")), 3);
  cJSON_Delete(j);
  /* Cut inside a string and inside a number: errors, no overread. */
  for (size_t cut = 0; cut < n - 3; cut++) {
    j = pr_json_parse(p, cut, 0, &err);
    assert_null(j);
    assert_true(err.line >= 1);
  }
  free(p);
}

static void test_syntax_error_line_col(void **state) {
  const char *doc = "{\n"
                    "  \"listen\": [\"0.0.0.0:8443\"],\n"
                    "  \"queue\": {\"max\": 10,}\n"
                    "}\n";
  pr_json_err err;
  memset(&err, 0, sizeof(err));
  assert_null(pr_json_parse(doc, strlen(doc), 0, &err));
  assert_int_equal(err.line, 3);
  /* cJSON points at the '}' after the trailing comma or just past it. */
  int col = (int)strlen("  \"queue\": {\"max\": 10,") + 1;
  assert_in_range(err.col, col, col + 1);
  assert_string_equal(err.path, "");
  assert_non_null(strstr(err.msg, "syntax error"));

  /* A missing comma is reported exactly at the next key. */
  const char *doc2 = "{\n  \"a\": 1,\n  \"b\": 2\n  \"c\": 3\n}";
  assert_null(pr_json_parse(doc2, strlen(doc2), 0, &err));
  assert_int_equal(err.line, 4);
  assert_int_equal(err.col, 3);
}

static void test_unterminated(void **state) {
  const char *doc = "{\"a\":\n  \"abc";
  pr_json_err err;
  assert_null(pr_json_parse(doc, strlen(doc), 0, &err));
  assert_int_equal(err.line, 2);
  assert_non_null(strstr(err.msg, "syntax error"));
}

static void test_trailing_garbage(void **state) {
  pr_json_err err;
  const char *doc = "{\"a\":1}\n  x";
  assert_null(pr_json_parse(doc, strlen(doc), 0, &err));
  assert_int_equal(err.line, 2);
  assert_int_equal(err.col, 3);
  /* Only whitespace after the document is fine. */
  cJSON *j = parse_ok("{\"a\":1} \r\n\t ");
  cJSON_Delete(j);
  /* Two documents are not one. */
  assert_null(pr_json_parse("{}{}", 4, 0, &err));
  assert_int_equal(err.col, 3);
}

static void test_empty_document(void **state) {
  pr_json_err err;
  assert_null(pr_json_parse("", 0, 0, &err));
  assert_null(pr_json_parse("  \n ", 4, 0, &err));
  assert_int_equal(err.line, 2);
  assert_null(pr_json_parse(NULL, 0, 0, &err));
}

static void test_depth_limit(void **state) {
  char doc[512];
  pr_json_err err;
  /* 5 levels pass a limit of 5, 6 do not. */
  strcpy(doc, "[[[[{\"a\":1}]]]]");
  cJSON *j = pr_json_parse(doc, strlen(doc), 5, &err);
  assert_non_null(j);
  cJSON_Delete(j);
  strcpy(doc, "[[[[[{\"a\":1}]]]]]");
  assert_null(pr_json_parse(doc, strlen(doc), 5, &err));
  assert_int_equal(err.line, 1);
  assert_int_equal(err.col, 6);
  assert_non_null(strstr(err.msg, "nesting"));
  /* Brackets inside strings (and escaped quotes) do not count. */
  strcpy(doc, "{\"a\":\"[[[[[[[[\\\"[[[[[[\"}");
  j = pr_json_parse(doc, strlen(doc), 2, &err);
  assert_non_null(j);
  cJSON_Delete(j);
  /* The default limit is 64. */
  memset(doc, '[', 65);
  memset(doc + 65, ']', 65);
  assert_null(pr_json_parse(doc, 130, 0, &err));
  j = pr_json_parse(doc + 1, 128, 0, &err);
  assert_non_null(j);
  cJSON_Delete(j);
}

static void test_position(void **state) {
  const char *t = "ab\ncd\n\xc3\xa9x";
  int line, col;
  pr_json_position(t, strlen(t), 0, &line, &col);
  assert_int_equal(line, 1);
  assert_int_equal(col, 1);
  pr_json_position(t, strlen(t), 4, &line, &col);
  assert_int_equal(line, 2);
  assert_int_equal(col, 2);
  /* A two-byte character is one column. */
  pr_json_position(t, strlen(t), 8, &line, &col);
  assert_int_equal(line, 3);
  assert_int_equal(col, 2);
  /* Past the end clamps to the end. */
  pr_json_position(t, strlen(t), 1000, &line, &col);
  assert_int_equal(line, 3);
  assert_int_equal(col, 3);
}

static void test_paths(void **state) {
  char p[64];
  pr_json_path_key(p, sizeof(p), "", "replicas");
  assert_string_equal(p, "replicas");
  char q[64];
  pr_json_path_index(q, sizeof(q), "replicas", 2);
  assert_string_equal(q, "replicas[2]");
  pr_json_path_key(p, sizeof(p), q, "slots");
  assert_string_equal(p, "replicas[2].slots");
  pr_json_path_key(p, sizeof(p), NULL, "x");
  assert_string_equal(p, "x");
  /* Truncation stays NUL-terminated. */
  char small[8];
  pr_json_path_key(small, sizeof(small), "abcdef", "ghijk");
  assert_int_equal(strlen(small), 7);
}

static const char *fleet =
    "{\"replicas\": ["
    " {\"id\": \"a\", \"slots\": 1},"
    " {\"id\": \"b\", \"slots\": 2},"
    " {\"id\": \"c\", \"slots\": 1.5, \"big\": 1e30, \"neg\": -3, \"cost\": 0.6,"
    "  \"on\": true, \"name\": 7, \"labels\": {}, \"models\": [], \"nul\": null,"
    "  \"inf\": 1e999}"
    "]}";

static const cJSON *replica(const cJSON *root, int i) {
  return cJSON_GetArrayItem(cJSON_GetObjectItem(root, "replicas"), i);
}

static void test_get_int(void **state) {
  cJSON *root = parse_ok(fleet);
  pr_json_err err;
  int64_t v = -7;
  assert_int_equal(pr_json_get_int(replica(root, 1), "slots", 1, 1, 64, &v, "replicas[1]", &err), 0);
  assert_int_equal(v, 2);
  /* Not a whole number. */
  v = -7;
  assert_int_equal(pr_json_get_int(replica(root, 2), "slots", 1, 1, 64, &v, "replicas[2]", &err),
                   PR_ETYPE);
  assert_string_equal(err.path, "replicas[2].slots");
  assert_string_equal(err.msg, "expected an integer");
  assert_int_equal(v, -7);
  /* Out of range, both sides, and beyond int64. */
  assert_int_equal(pr_json_get_int(replica(root, 2), "neg", 1, 0, 10, &v, "replicas[2]", &err),
                   PR_ERANGE);
  assert_string_equal(err.path, "replicas[2].neg");
  assert_string_equal(err.msg, "must be between 0 and 10");
  assert_int_equal(pr_json_get_int(replica(root, 1), "slots", 1, 0, 1, &v, "replicas[1]", &err),
                   PR_ERANGE);
  assert_int_equal(pr_json_get_int(replica(root, 2), "big", 1, INT64_MIN, INT64_MAX, &v,
                                   "replicas[2]", &err), PR_ERANGE);
  assert_int_equal(pr_json_get_int(replica(root, 2), "inf", 1, INT64_MIN, INT64_MAX, &v,
                                   "replicas[2]", &err), PR_ETYPE);
  /* Wrong types, null included. */
  assert_int_equal(pr_json_get_int(replica(root, 2), "id", 1, 0, 10, &v, "replicas[2]", &err),
                   PR_ETYPE);
  assert_string_equal(err.path, "replicas[2].id");
  assert_int_equal(pr_json_get_int(replica(root, 2), "nul", 0, 0, 10, &v, "replicas[2]", &err),
                   PR_ETYPE);
  /* Missing: an error when required, 1 and untouched when optional. */
  assert_int_equal(pr_json_get_int(replica(root, 0), "ctx", 1, 0, 10, &v, "replicas[0]", &err),
                   PR_EMISSING);
  assert_string_equal(err.path, "replicas[0].ctx");
  assert_string_equal(err.msg, "missing");
  v = 99;
  assert_int_equal(pr_json_get_int(replica(root, 0), "ctx", 0, 0, 10, &v, "replicas[0]", &err), 1);
  assert_int_equal(v, 99);
  cJSON_Delete(root);
}

static void test_get_double(void **state) {
  cJSON *root = parse_ok(fleet);
  pr_json_err err;
  double d = 0;
  assert_int_equal(pr_json_get_double(replica(root, 2), "cost", 1, 0, 100, &d, "replicas[2]", &err), 0);
  assert_true(d > 0.59 && d < 0.61);
  assert_int_equal(pr_json_get_double(replica(root, 2), "neg", 1, 0, 100, &d, "replicas[2]", &err),
                   PR_ERANGE);
  assert_string_equal(err.path, "replicas[2].neg");
  assert_int_equal(pr_json_get_double(replica(root, 2), "inf", 1, -1e308, 1e308, &d,
                                      "replicas[2]", &err), PR_ERANGE);
  assert_int_equal(pr_json_get_double(replica(root, 2), "on", 1, 0, 1, &d, "replicas[2]", &err),
                   PR_ETYPE);
  assert_string_equal(err.msg, "expected a number");
  assert_int_equal(pr_json_get_double(replica(root, 2), "zzz", 1, 0, 1, &d, "replicas[2]", &err),
                   PR_EMISSING);
  assert_int_equal(pr_json_get_double(replica(root, 2), "zzz", 0, 0, 1, &d, "replicas[2]", &err), 1);
  /* the lenient getter: anything but a number in range is the default */
  assert_true(pr_json_num_or(replica(root, 2), "cost", 0, 100, -1) > 0.59);
  assert_true(pr_json_num_or(replica(root, 2), "neg", 0, 100, -1) == -1);
  assert_true(pr_json_num_or(replica(root, 2), "inf", -1e308, 1e308, -1) == -1);
  assert_true(pr_json_num_or(replica(root, 2), "on", 0, 1, -1) == -1);
  assert_true(pr_json_num_or(replica(root, 2), "zzz", 0, 1, 7) == 7);
  cJSON_Delete(root);
}

static void test_get_str_bool(void **state) {
  cJSON *root = parse_ok(fleet);
  pr_json_err err;
  const char *s = NULL;
  assert_int_equal(pr_json_get_str(replica(root, 0), "id", 1, &s, "replicas[0]", &err), 0);
  assert_string_equal(s, "a");
  assert_int_equal(pr_json_get_str(replica(root, 2), "name", 1, &s, "replicas[2]", &err), PR_ETYPE);
  assert_string_equal(err.path, "replicas[2].name");
  assert_string_equal(err.msg, "expected a string");
  assert_int_equal(pr_json_get_str(replica(root, 2), "url", 1, &s, "replicas[2]", &err),
                   PR_EMISSING);
  assert_string_equal(err.path, "replicas[2].url");
  assert_int_equal(pr_json_get_str(replica(root, 2), "url", 0, &s, "replicas[2]", &err), 1);

  int b = -1;
  assert_int_equal(pr_json_get_bool(replica(root, 2), "on", 1, &b, "replicas[2]", &err), 0);
  assert_int_equal(b, 1);
  assert_int_equal(pr_json_get_bool(replica(root, 2), "slots", 1, &b, "replicas[2]", &err),
                   PR_ETYPE);
  assert_string_equal(err.path, "replicas[2].slots");
  assert_string_equal(err.msg, "expected a boolean");
  assert_int_equal(pr_json_get_bool(replica(root, 2), "off", 1, &b, "replicas[2]", &err),
                   PR_EMISSING);
  assert_int_equal(pr_json_get_bool(replica(root, 2), "off", 0, &b, "replicas[2]", &err), 1);
  assert_int_equal(b, 1);
  cJSON_Delete(root);
}

static void test_get_obj_arr(void **state) {
  cJSON *root = parse_ok(fleet);
  pr_json_err err;
  const cJSON *o = NULL;
  assert_int_equal(pr_json_get_arr(root, "replicas", 1, &o, "", &err), 0);
  assert_int_equal(cJSON_GetArraySize(o), 3);
  assert_int_equal(pr_json_get_obj(replica(root, 2), "labels", 1, &o, "replicas[2]", &err), 0);
  assert_true(cJSON_IsObject(o));
  assert_int_equal(pr_json_get_obj(replica(root, 2), "models", 1, &o, "replicas[2]", &err),
                   PR_ETYPE);
  assert_string_equal(err.path, "replicas[2].models");
  assert_string_equal(err.msg, "expected an object");
  assert_int_equal(pr_json_get_arr(replica(root, 2), "labels", 1, &o, "replicas[2]", &err),
                   PR_ETYPE);
  assert_string_equal(err.path, "replicas[2].labels");
  assert_string_equal(err.msg, "expected an array");
  assert_int_equal(pr_json_get_arr(root, "listen", 1, &o, "", &err), PR_EMISSING);
  /* At the document's top level the path is just the key. */
  assert_string_equal(err.path, "listen");
  assert_int_equal(pr_json_get_obj(root, "listen", 0, &o, "", &err), 1);
  /* The parent itself not being an object names the parent. */
  const cJSON *arr = cJSON_GetObjectItem(root, "replicas");
  assert_int_equal(pr_json_get_str(arr, "id", 1, (const char **)&o, "replicas", &err), PR_ETYPE);
  assert_string_equal(err.path, "replicas");
  cJSON_Delete(root);
}

static void test_check_keys(void **state) {
  cJSON *root = parse_ok("{\"queue\": {\"max\": 1, \"timeout_s\": 2, \"timeuot_s\": 3}}");
  pr_json_err err;
  static const char *const root_keys[] = {"queue", "listen", NULL};
  static const char *const queue_keys[] = {"max", "timeout_s", NULL};
  static const char *const none[] = {NULL};
  assert_int_equal(pr_json_check_keys(root, root_keys, "", &err), 0);
  const cJSON *q = cJSON_GetObjectItem(root, "queue");
  assert_int_equal(pr_json_check_keys(q, queue_keys, "queue", &err), PR_EUNKNOWN);
  assert_string_equal(err.path, "queue.timeuot_s");
  assert_string_equal(err.msg, "unknown key");
  assert_int_equal(pr_json_check_keys(root, none, "", &err), PR_EUNKNOWN);
  assert_string_equal(err.path, "queue");
  assert_int_equal(pr_json_check_keys(cJSON_GetObjectItem(q, "max"), queue_keys, "queue.max", &err),
                   PR_ETYPE);
  cJSON_Delete(root);
}

static void test_print(void **state) {
  cJSON *root = parse_ok("{ \"a\" : [ 1 , \"x\\ny\" ] ,\n \"b\": null }");
  char *s = pr_json_print(root);
  assert_string_equal(s, "{\"a\":[1,\"x\\ny\"],\"b\":null}");
  cJSON_free(s);
  cJSON_Delete(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_parse_ok_not_nul_terminated),
    cmocka_unit_test(test_syntax_error_line_col),
    cmocka_unit_test(test_unterminated),
    cmocka_unit_test(test_trailing_garbage),
    cmocka_unit_test(test_empty_document),
    cmocka_unit_test(test_depth_limit),
    cmocka_unit_test(test_position),
    cmocka_unit_test(test_paths),
    cmocka_unit_test(test_get_int),
    cmocka_unit_test(test_get_double),
    cmocka_unit_test(test_get_str_bool),
    cmocka_unit_test(test_get_obj_arr),
    cmocka_unit_test(test_check_keys),
    cmocka_unit_test(test_print),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
