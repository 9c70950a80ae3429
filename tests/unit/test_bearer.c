/* proto/bearer.c: the one Authorization rule: "Bearer" in any case, one or more spaces,
 * a non-empty token, compared whole. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "bearer.h"
#include "err.h"

static const char TOKEN[] = "agent-s3cret-token";

static void test_token_extraction(void **state) {
  (void)state;
  assert_string_equal(pr_bearer_token("Bearer abc"), "abc");
  assert_string_equal(pr_bearer_token("bearer abc"), "abc");
  assert_string_equal(pr_bearer_token("BEARER abc"), "abc");
  assert_string_equal(pr_bearer_token("bEaReR abc"), "abc");
  assert_string_equal(pr_bearer_token("Bearer    abc"), "abc"); /* 1*SP */
  assert_string_equal(pr_bearer_token("Bearer a b"), "a b");    /* to the end of the value */
  assert_null(pr_bearer_token(NULL));
  assert_null(pr_bearer_token(""));
  assert_null(pr_bearer_token("Bearer"));
  assert_null(pr_bearer_token("Bearer "));
  assert_null(pr_bearer_token("Bearer    "));
  assert_null(pr_bearer_token("Bearerabc"));    /* no space: another word */
  assert_null(pr_bearer_token("Bearer\tabc"));  /* SP only, as RFC 7235 says */
  assert_null(pr_bearer_token("Basic YWxhZGRpbjpvcGVuc2VzYW1l"));
  assert_null(pr_bearer_token("Token abc"));
  assert_null(pr_bearer_token(" Bearer abc")); /* the HTTP layer trims; a raw one is not ours */
}

static void test_right_token(void **state) {
  (void)state;
  assert_int_equal(pr_bearer_check("Bearer agent-s3cret-token", TOKEN), 0);
  assert_int_equal(pr_bearer_check("bearer agent-s3cret-token", TOKEN), 0);
  assert_int_equal(pr_bearer_check("BEARER  agent-s3cret-token", TOKEN), 0);
}

static void test_missing_header_or_token(void **state) {
  (void)state;
  assert_int_equal(pr_bearer_check(NULL, TOKEN), PR_EMISSING);
  assert_int_equal(pr_bearer_check("", TOKEN), PR_EMISSING);
  assert_int_equal(pr_bearer_check("Bearer", TOKEN), PR_EMISSING);
  assert_int_equal(pr_bearer_check("Bearer ", TOKEN), PR_EMISSING); /* empty token */
  /* another scheme, even with the right secret in it */
  assert_int_equal(pr_bearer_check("Basic agent-s3cret-token", TOKEN), PR_EMISSING);
  assert_int_equal(pr_bearer_check("agent-s3cret-token", TOKEN), PR_EMISSING);
  assert_int_equal(pr_bearer_check("Bearer:agent-s3cret-token", TOKEN), PR_EMISSING);
}

static void test_wrong_token(void **state) {
  (void)state;
  assert_int_equal(pr_bearer_check("Bearer wrong", TOKEN), -EACCES);
  assert_int_equal(pr_bearer_check("Bearer agent-s3cret-toke", TOKEN), -EACCES);       /* shorter */
  assert_int_equal(pr_bearer_check("Bearer agent-s3cret-token2", TOKEN), -EACCES);     /* longer */
  assert_int_equal(pr_bearer_check("Bearer agent-s3cret-tokenagent", TOKEN), -EACCES); /* prefix */
  assert_int_equal(pr_bearer_check("Bearer AGENT-S3CRET-TOKEN", TOKEN), -EACCES);      /* the token's case counts */
  assert_int_equal(pr_bearer_check("Bearer agent-s3cret-token ", TOKEN), -EACCES);     /* untrimmed space is part of it */
  assert_int_equal(pr_bearer_check("Bearer a", "a\0b"), 0);                            /* C strings */
}

/* Nothing to compare with: nobody is let in, not even with an empty-looking token. */
static void test_no_expected_token(void **state) {
  (void)state;
  assert_int_equal(pr_bearer_check("Bearer x", NULL), -EACCES);
  assert_int_equal(pr_bearer_check("Bearer x", ""), -EACCES);
  assert_int_equal(pr_bearer_check("Bearer ", ""), PR_EMISSING);
  assert_int_equal(pr_bearer_check(NULL, NULL), PR_EMISSING);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_token_extraction),
      cmocka_unit_test(test_right_token),
      cmocka_unit_test(test_missing_header_or_token),
      cmocka_unit_test(test_wrong_token),
      cmocka_unit_test(test_no_expected_token),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
