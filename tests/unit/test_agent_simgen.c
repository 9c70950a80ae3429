/* Unit tests for agent/simgen.c: values built from JSON schemas hold what the schema asks
 * (required keys, types, enum, const, bounds, lengths, item counts, $ref, anyOf, allOf),
 * a seed gives the same value twice, tokens cut JSON text without splitting a UTF-8
 * character, the grammar builder's "Unrecognized schema" check, and logprobs entries. */
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
#include "simgen.h"

/* The value generated for schema text (NULL: no schema), parsed. */
static cJSON *gen(const char *schema_text, uint64_t seed) {
  cJSON *schema = schema_text ? cJSON_Parse(schema_text) : NULL;
  if (schema_text) assert_non_null(schema);
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  uint64_t rng = seed;
  assert_int_equal(ag_simgen_value(&out, schema, &rng), 0);
  cJSON *v = cJSON_Parse(pr_buf_cstr(&out));
  assert_non_null(v);
  pr_buf_free(&out);
  cJSON_Delete(schema);
  return v;
}

static const cJSON *get(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  assert_non_null(v);
  return v;
}

static size_t utf8_len(const char *s) {
  size_t n = 0;
  for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
  return n;
}

static void test_required_properties_and_types(void **state) {
  (void)state;
  static const char schema[] =
      "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\"},"
      "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
      "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7},"
      "\"ratio\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1},"
      "\"ok\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
      "\"minItems\":3},\"short\":{\"type\":\"string\",\"maxLength\":4},"
      "\"long\":{\"type\":\"string\",\"minLength\":40},\"when\":{\"type\":\"string\",\"format\":\"date\"},"
      "\"fixed\":{\"const\":\"K\"},\"maybe\":{\"type\":[\"null\",\"integer\"]},\"skipped\":{\"type\":\"string\"}},"
      "\"required\":[\"location\",\"unit\",\"days\",\"ratio\",\"ok\",\"tags\",\"short\",\"long\",\"when\","
      "\"fixed\",\"maybe\"]}";
  for (uint64_t seed = 1; seed < 40; seed++) {
    cJSON *v = gen(schema, seed);
    assert_true(cJSON_IsObject(v));
    assert_int_equal(cJSON_GetArraySize(v), 11); /* the required ones, not "skipped" */
    assert_true(cJSON_IsString(get(v, "location")) && get(v, "location")->valuestring[0]);
    assert_string_equal(get(v, "unit")->valuestring, "celsius");
    double days = get(v, "days")->valuedouble;
    assert_true(days >= 1 && days <= 7 && days == (double)(int)days);
    double ratio = get(v, "ratio")->valuedouble;
    assert_true(ratio > 0 && ratio < 1);
    assert_true(cJSON_IsBool(get(v, "ok")));
    assert_int_equal(cJSON_GetArraySize(get(v, "tags")), 3);
    assert_true(cJSON_IsString(cJSON_GetArrayItem(get(v, "tags"), 0)));
    assert_true(utf8_len(get(v, "short")->valuestring) <= 4);
    assert_true(utf8_len(get(v, "long")->valuestring) >= 40);
    assert_string_equal(get(v, "when")->valuestring, "2025-02-20");
    assert_string_equal(get(v, "fixed")->valuestring, "K");
    assert_true(cJSON_IsNumber(get(v, "maybe")));
    cJSON_Delete(v);
  }
}

static void test_all_properties_when_none_required(void **state) {
  (void)state;
  cJSON *v = gen("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"object\","
                 "\"properties\":{\"c\":{\"type\":\"null\"}}}}}", 5);
  assert_true(cJSON_IsNumber(get(v, "a")));
  assert_true(cJSON_IsNull(get(get(v, "b"), "c")));
  cJSON_Delete(v);
}

static void test_refs_anyof_allof(void **state) {
  (void)state;
  cJSON *v = gen("{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},"
                 "\"required\":[\"x\"]}},\"type\":\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/pt\"},"
                 "\"q\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"integer\",\"minimum\":10,\"maximum\":10}]},"
                 "\"r\":{\"allOf\":[{\"properties\":{\"s\":{\"type\":\"string\"}},\"required\":[\"s\"]},"
                 "{\"properties\":{\"t\":{\"type\":\"boolean\"}},\"required\":[\"t\"]}]}},"
                 "\"required\":[\"p\",\"q\",\"r\"]}", 9);
  assert_true(cJSON_IsNumber(get(get(v, "p"), "x")));
  assert_int_equal(get(v, "q")->valueint, 10);
  assert_true(cJSON_IsString(get(get(v, "r"), "s")));
  assert_true(cJSON_IsBool(get(get(v, "r"), "t")));
  cJSON_Delete(v);
  /* a reference to itself ends, cut short */
  v = gen("{\"type\":\"object\",\"properties\":{\"me\":{\"$ref\":\"#\"}},\"required\":[\"me\"]}", 3);
  assert_true(cJSON_IsObject(v));
  cJSON_Delete(v);
}

static void test_root_is_an_object(void **state) {
  (void)state;
  cJSON *v = gen(NULL, 1); /* json_object without a schema */
  assert_true(cJSON_IsString(get(v, "answer")));
  cJSON_Delete(v);
  v = gen("{}", 1); /* a function without parameters */
  assert_true(cJSON_IsObject(v) && cJSON_GetArraySize(v) == 0);
  cJSON_Delete(v);
  v = gen("{\"type\":\"string\"}", 1);
  assert_true(cJSON_IsObject(v));
  cJSON_Delete(v);
}

static void test_same_seed_same_value(void **state) {
  (void)state;
  static const char schema[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},"
                               "\"n\":{\"type\":\"number\"}}}";
  cJSON *a = gen(schema, 77), *b = gen(schema, 77);
  char *sa = cJSON_PrintUnformatted(a), *sb = cJSON_PrintUnformatted(b);
  assert_string_equal(sa, sb);
  free(sa);
  free(sb);
  cJSON_Delete(a);
  cJSON_Delete(b);
}

static void test_tokens(void **state) {
  (void)state;
  static const char text[] = "{\"location\":\"quiet 東京 café\",\"days\":3,\"x\":[true, null]}";
  size_t len = strlen(text), n = 0;
  char joined[256] = "";
  for (size_t i = 0; i < len;) {
    size_t k = ag_simgen_token_len(text + i, len - i);
    assert_true(k >= 1 && k <= 16);
    /* a token never starts inside a character */
    assert_true(((unsigned char)text[i] & 0xC0) != 0x80);
    strncat(joined, text + i, k);
    i += k;
    n++;
  }
  assert_string_equal(joined, text);
  assert_int_equal(ag_simgen_count_tokens(text, len), (int64_t)n);
  /* words keep their leading space; JSON punctuation comes a few characters at a time */
  assert_int_equal(ag_simgen_token_len("{\"location\"", 11), 2);
  assert_int_equal(ag_simgen_token_len("location\"", 9), 8);
  assert_int_equal(ag_simgen_token_len(" quiet river", 12), 6);
  assert_int_equal(ag_simgen_count_tokens("", 0), 0);
}

static void test_schema_check(void **state) {
  (void)state;
  static const struct {
    const char *schema, *errors;
  } cases[] = {
    {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\"}}}", ""},
    {"{}", ""},
    {"null", ""},
    {"[]", ""},
    {"\"x\"", "Unrecognized schema: \"x\""},
    {"5", "Unrecognized schema: 5"},
    {"{\"type\":\"bogus\"}", "Unrecognized schema: {\"type\":\"bogus\"}"},
    /* what the real server says about these (February 2025 build) */
    {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"bogus\"},\"y\":{\"description\":\"q\"}}}",
     "Unrecognized schema: {\"type\":\"bogus\"}\nUnrecognized schema: {\"description\":\"q\"}"},
    {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":[\"string\",\"bogus\",5],\"minimum\":1.0}}}",
     "Unrecognized schema: {\"type\":\"bogus\",\"minimum\":1.0}\nUnrecognized schema: {\"type\":5,\"minimum\":1.0}"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    cJSON *s = cJSON_Parse(cases[i].schema);
    assert_non_null(s);
    ag_nl_lits lits;
    assert_int_equal(ag_nl_lits_scan(&lits, s, cases[i].schema, strlen(cases[i].schema)), 0);
    pr_buf errors;
    pr_buf_init(&errors, 1 << 20);
    int n = ag_simgen_check_schema(s, &lits, &errors);
    assert_string_equal(pr_buf_cstr(&errors), cases[i].errors);
    assert_int_equal(n > 0, cases[i].errors[0] != '\0');
    pr_buf_free(&errors);
    ag_nl_lits_free(&lits);
    cJSON_Delete(s);
  }
}

/* Lists of types and item counts multiply at every level: both stay bounded. */
static void test_hostile_schemas_stay_small(void **state) {
  (void)state;
  pr_buf text;
  pr_buf_init(&text, 1 << 20);
  /* ten levels, each an object whose one property has forty types */
  assert_int_equal(pr_buf_append_str(&text, "{\"type\":\"object\"}"), 0);
  for (int i = 0; i < 10; i++) {
    pr_buf next;
    pr_buf_init(&next, 1 << 20);
    assert_int_equal(pr_buf_append_str(&next, "{\"type\":["), 0);
    for (int t = 0; t < 40; t++) assert_int_equal(pr_buf_appendf(&next, "%s\"object\"", t ? "," : ""), 0);
    assert_int_equal(pr_buf_appendf(&next, "],\"properties\":{\"p\":%s}}", text.data), 0);
    pr_buf_free(&text);
    text = next;
  }
  cJSON *s = cJSON_Parse(text.data);
  assert_non_null(s);
  pr_buf errors;
  pr_buf_init(&errors, 1 << 20);
  assert_int_equal(ag_simgen_check_schema(s, NULL, &errors), 0);
  pr_buf_free(&errors);
  cJSON_Delete(s);
  pr_buf_free(&text);
  /* arrays of eight arrays of eight ..., sixteen deep */
  static const char deep[] = "{\"$defs\":{\"a\":{\"type\":\"array\",\"minItems\":8,\"items\":{\"$ref\":\"#/$defs/a\"}}},"
                             "\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/a\"}}}";
  cJSON *v = gen(deep, 3);
  char *out = cJSON_PrintUnformatted(v);
  assert_true(strlen(out) < 1000000);
  free(out);
  cJSON_Delete(v);
}

static void test_logprob_entry(void **state) {
  (void)state;
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  uint64_t rng = 42;
  assert_int_equal(ag_simgen_logprob(&out, " caf\xc3\xa9", 6, 3, &rng), 0);
  cJSON *e = cJSON_Parse(out.data);
  assert_non_null(e);
  assert_string_equal(get(e, "token")->valuestring, " caf\xc3\xa9");
  assert_true(cJSON_IsNumber(get(e, "id")));
  const cJSON *bytes = get(e, "bytes");
  assert_int_equal(cJSON_GetArraySize(bytes), 6);
  assert_int_equal(cJSON_GetArrayItem(bytes, 4)->valueint, 0xc3);
  double lp = get(e, "logprob")->valuedouble;
  assert_true(lp < 0);
  const cJSON *top = get(e, "top_logprobs");
  assert_int_equal(cJSON_GetArraySize(top), 3);
  assert_string_equal(get(top->child, "token")->valuestring, " caf\xc3\xa9");
  double prev = 0;
  const cJSON *c;
  cJSON_ArrayForEach(c, top) {
    double v = get(c, "logprob")->valuedouble;
    assert_true(v <= prev);
    prev = v;
    assert_null(cJSON_GetObjectItemCaseSensitive(c, "top_logprobs"));
  }
  cJSON_Delete(e);
  pr_buf_free(&out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_required_properties_and_types),
    cmocka_unit_test(test_all_properties_when_none_required),
    cmocka_unit_test(test_refs_anyof_allof),
    cmocka_unit_test(test_root_is_an_object),
    cmocka_unit_test(test_same_seed_same_value),
    cmocka_unit_test(test_tokens),
    cmocka_unit_test(test_schema_check),
    cmocka_unit_test(test_hostile_schemas_stay_small),
    cmocka_unit_test(test_logprob_entry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
