/* Unit tests for proto/buf.c: the cap is a hard limit that leaves the buffer as it was,
 * and the helpers (appendf, consume, steal) keep the NUL-terminated invariant. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "buf.h"
#include "err.h"

static void test_empty_cstr(void **state) {
  pr_buf b;
  pr_buf_init(&b, 16);
  assert_string_equal(pr_buf_cstr(&b), "");
  assert_int_equal(b.len, 0);
  pr_buf_reset(&b); /* must be safe without an allocation */
  pr_buf_free(&b);
  pr_buf_free(&b); /* and freeing twice too */
}

static void test_append_nul_terminated(void **state) {
  pr_buf b;
  pr_buf_init(&b, 1024);
  assert_int_equal(pr_buf_append(&b, "abc", 3), 0);
  assert_int_equal(pr_buf_append_str(&b, "def"), 0);
  assert_int_equal(b.len, 6);
  assert_string_equal(pr_buf_cstr(&b), "abcdef");
  assert_int_equal(b.data[6], '\0');
  /* Growing past the first allocation keeps the content. */
  for (int i = 0; i < 100; i++) assert_int_equal(pr_buf_append(&b, "0123456789", 10), 0);
  assert_int_equal(b.len, 1006);
  assert_memory_equal(b.data, "abcdef0123456789", 16);
  assert_int_equal(b.data[b.len], '\0');
  pr_buf_free(&b);
}

static void test_cap_leaves_buffer_unchanged(void **state) {
  pr_buf b;
  pr_buf_init(&b, 8);
  assert_int_equal(pr_buf_append(&b, "12345", 5), 0);
  assert_int_equal(pr_buf_append(&b, "6789", 4), PR_ETOOLARGE);
  assert_int_equal(b.len, 5);
  assert_string_equal(pr_buf_cstr(&b), "12345");
  assert_int_equal(pr_buf_appendf(&b, "%s", "abcd"), PR_ETOOLARGE);
  assert_string_equal(pr_buf_cstr(&b), "12345");
  /* Exactly at the cap is allowed. */
  assert_int_equal(pr_buf_append(&b, "678", 3), 0);
  assert_int_equal(b.len, 8);
  assert_string_equal(pr_buf_cstr(&b), "12345678");
  assert_int_equal(pr_buf_append(&b, "x", 1), PR_ETOOLARGE);
  assert_int_equal(pr_buf_append(&b, "", 0), 0);
  assert_string_equal(pr_buf_cstr(&b), "12345678");
  pr_buf_free(&b);
}

static void test_cap_zero(void **state) {
  pr_buf b;
  pr_buf_init(&b, 0);
  assert_int_equal(pr_buf_append(&b, "x", 1), PR_ETOOLARGE);
  assert_int_equal(b.len, 0);
  assert_int_equal(pr_buf_append(&b, "", 0), 0);
  assert_string_equal(pr_buf_cstr(&b), "");
  pr_buf_free(&b);
}

static void test_appendf(void **state) {
  pr_buf b;
  pr_buf_init(&b, 4096);
  assert_int_equal(pr_buf_appendf(&b, "%d-%s", 42, "x"), 0);
  assert_int_equal(pr_buf_appendf(&b, "|%05.1f", 3.14159), 0);
  assert_string_equal(pr_buf_cstr(&b), "42-x|003.1");
  assert_int_equal(b.len, strlen("42-x|003.1"));
  char big[1000];
  memset(big, 'z', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  assert_int_equal(pr_buf_appendf(&b, "%s", big), 0);
  assert_int_equal(b.len, 10 + 999);
  assert_int_equal(b.data[b.len - 1], 'z');
  assert_int_equal(b.data[b.len], '\0');
  pr_buf_free(&b);
}

static void test_consume(void **state) {
  pr_buf b;
  pr_buf_init(&b, 64);
  assert_int_equal(pr_buf_append_str(&b, "hello world"), 0);
  pr_buf_consume(&b, 6);
  assert_string_equal(pr_buf_cstr(&b), "world");
  assert_int_equal(b.len, 5);
  pr_buf_consume(&b, 0);
  assert_string_equal(pr_buf_cstr(&b), "world");
  pr_buf_consume(&b, 100);
  assert_int_equal(b.len, 0);
  assert_string_equal(pr_buf_cstr(&b), "");
  /* The allocation is kept and reusable. */
  assert_int_equal(pr_buf_append_str(&b, "again"), 0);
  assert_string_equal(pr_buf_cstr(&b), "again");
  pr_buf_free(&b);
}

static void test_reset_keeps_cap(void **state) {
  pr_buf b;
  pr_buf_init(&b, 4);
  assert_int_equal(pr_buf_append_str(&b, "abcd"), 0);
  pr_buf_reset(&b);
  assert_string_equal(pr_buf_cstr(&b), "");
  assert_int_equal(pr_buf_append_str(&b, "wxyz"), 0);
  assert_int_equal(pr_buf_append_str(&b, "!"), PR_ETOOLARGE);
  pr_buf_free(&b);
}

static void test_steal(void **state) {
  pr_buf b;
  pr_buf_init(&b, 64);
  assert_int_equal(pr_buf_append_str(&b, "payload"), 0);
  size_t len = 0;
  char *p = pr_buf_steal(&b, &len);
  assert_non_null(p);
  assert_int_equal(len, 7);
  assert_string_equal(p, "payload");
  assert_int_equal(b.len, 0);
  assert_null(b.data);
  assert_string_equal(pr_buf_cstr(&b), "");
  free(p);
  /* Stealing from an empty buffer still gives a string the caller can free. */
  p = pr_buf_steal(&b, &len);
  assert_non_null(p);
  assert_int_equal(len, 0);
  assert_string_equal(p, "");
  free(p);
  /* The buffer keeps its cap and works after a steal. */
  assert_int_equal(pr_buf_append_str(&b, "x"), 0);
  pr_buf_free(&b);
}

static void test_binary_data(void **state) {
  pr_buf b;
  pr_buf_init(&b, 64);
  assert_int_equal(pr_buf_append(&b, "a\0b", 3), 0);
  assert_int_equal(b.len, 3);
  assert_memory_equal(b.data, "a\0b", 4);
  pr_buf_free(&b);
}

static void test_u64_digits(void **state) {
  (void)state;
  char num[24];
  num[sizeof(num) - 1] = '\0';
  char *end = num + sizeof(num) - 1;
  assert_string_equal(pr_u64_digits(end, 0), "0");
  assert_string_equal(pr_u64_digits(end, 42), "42");
  assert_string_equal(pr_u64_digits(end, UINT64_MAX), "18446744073709551615");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_empty_cstr),
    cmocka_unit_test(test_append_nul_terminated),
    cmocka_unit_test(test_cap_leaves_buffer_unchanged),
    cmocka_unit_test(test_cap_zero),
    cmocka_unit_test(test_appendf),
    cmocka_unit_test(test_consume),
    cmocka_unit_test(test_reset_keeps_cap),
    cmocka_unit_test(test_steal),
    cmocka_unit_test(test_binary_data),
    cmocka_unit_test(test_u64_digits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
