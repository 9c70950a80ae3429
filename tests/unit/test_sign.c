/* proto/sign.c: heartbeat signatures against known answers computed with
 * `printf '%s' 'TS.BODY' | openssl dgst -sha256 -hmac SECRET`, and every way a
 * signature can be wrong: key, timestamp, body, length, prefix, digits. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "err.h"
#include "sign.h"

static const char SECRET[] = "fleet-secret-0123456789abcdef";
static const char TS[] = "1795976416000";
static const char BODY[] =
    "{\"id\":\"pixel-07\",\"url\":\"https://abc123.acu.run\",\"models\":[\"qwen3.5-0.8b\"],\"slots\":4}";
/* openssl dgst -sha256 -hmac fleet-secret-0123456789abcdef over TS "." BODY */
static const char WANT[] = "sha256=a195b21f1bfdd6c9502038a0d94447cfded46ddb47d1c13acb7ee7ee0399696a";

static void test_known_answers(void **state) {
  (void)state;
  char sig[PR_SIGN_LEN + 1];
  assert_int_equal(pr_sign_heartbeat(SECRET, TS, BODY, strlen(BODY), sig), 0);
  assert_string_equal(sig, WANT);
  assert_int_equal(strlen(sig), PR_SIGN_LEN);
  /* an empty body: the message is "TS." */
  assert_int_equal(pr_sign_heartbeat(SECRET, "1700000000000", NULL, 0, sig), 0);
  assert_string_equal(sig, "sha256=c627f2cfdb26120f6d1707e9faf25f9b235bd0ca37a2bd64d55a370010251562");
  /* the body is counted, not read to a NUL */
  assert_int_equal(pr_sign_heartbeat(SECRET, "1795976416001", "a\0b", 3, sig), 0);
  assert_string_equal(sig, "sha256=5200f6a907392554eb8340a8ce18d5501bb5dcfc22332b44718fe16dfcdb294d");
  /* an empty key is still HMAC's (zero-padded) key */
  assert_int_equal(pr_sign_heartbeat("", "1", "x", 1, sig), 0);
  assert_string_equal(sig, "sha256=d356c76f2be16120eca994746a279fd612267e791d245c4745ebbf0f98fc31f2");
}

static void test_verify_accepts_the_right_signature(void **state) {
  (void)state;
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, strlen(BODY), WANT), 0);
  char sig[PR_SIGN_LEN + 1];
  assert_int_equal(pr_sign_heartbeat(SECRET, TS, NULL, 0, sig), 0);
  assert_int_equal(pr_sign_verify(SECRET, TS, NULL, 0, sig), 0);
  assert_int_equal(pr_sign_verify(SECRET, TS, "", 0, sig), 0);
}

static void test_verify_refuses_wrong_inputs(void **state) {
  (void)state;
  size_t n = strlen(BODY);
  assert_int_equal(pr_sign_verify("fleet-secret-0123456789abcdeF", TS, BODY, n, WANT), -EACCES);
  assert_int_equal(pr_sign_verify("", TS, BODY, n, WANT), -EACCES);
  assert_int_equal(pr_sign_verify(SECRET, "1795976416001", BODY, n, WANT), -EACCES);
  assert_int_equal(pr_sign_verify(SECRET, "", BODY, n, WANT), -EACCES);
  /* the timestamp and body are joined by the dot: moving it changes the message */
  assert_int_equal(pr_sign_verify(SECRET, "1795976416000.", BODY, n, WANT), -EACCES);
  char tampered[sizeof(BODY)];
  memcpy(tampered, BODY, sizeof(BODY));
  tampered[n - 2] = '5'; /* "slots":5 */
  assert_int_equal(pr_sign_verify(SECRET, TS, tampered, n, WANT), -EACCES);
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n - 1, WANT), -EACCES); /* truncated */
  /* one digit off, first and last */
  char sig[sizeof(WANT)];
  memcpy(sig, WANT, sizeof(WANT));
  sig[7] = 'b';
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, sig), -EACCES);
  memcpy(sig, WANT, sizeof(WANT));
  sig[PR_SIGN_LEN - 1] = 'b';
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, sig), -EACCES);
}

static void test_verify_refuses_malformed_signatures(void **state) {
  (void)state;
  size_t n = strlen(BODY);
  char sig[sizeof(WANT) + 2];
  /* 63 and 65 digits */
  memcpy(sig, WANT, sizeof(WANT));
  sig[PR_SIGN_LEN - 1] = '\0';
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, sig), PR_EPARSE);
  memcpy(sig, WANT, sizeof(WANT));
  sig[PR_SIGN_LEN] = '0';
  sig[PR_SIGN_LEN + 1] = '\0';
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, sig), PR_EPARSE);
  /* the bare digits, another prefix, the prefix in capitals, nothing */
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, WANT + 7), PR_EPARSE);
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, "sha512=a195b21f1bfdd6c9502038a0d94447cfded46ddb47d1c13acb7ee7ee0399696a"), PR_EPARSE);
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, "SHA256=a195b21f1bfdd6c9502038a0d94447cfded46ddb47d1c13acb7ee7ee0399696a"), PR_EPARSE);
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, ""), PR_EPARSE);
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, NULL), PR_EPARSE);
  /* 64 characters that are not all hex digits */
  memcpy(sig, WANT, sizeof(WANT));
  sig[20] = 'g';
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, sig), PR_EPARSE);
  memcpy(sig, WANT, sizeof(WANT));
  sig[20] = ' ';
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, n, sig), PR_EPARSE);
}

/* The agent signs in lowercase; the gateway has always accepted either case (a
 * hand-made or other client's signature in capitals): the rule is kept. */
static void test_verify_accepts_uppercase_hex(void **state) {
  (void)state;
  char sig[sizeof(WANT)];
  memcpy(sig, WANT, sizeof(WANT));
  for (size_t i = 7; i < PR_SIGN_LEN; i++)
    if (sig[i] >= 'a' && sig[i] <= 'f') sig[i] = (char)(sig[i] - 'a' + 'A');
  assert_string_not_equal(sig, WANT);
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, strlen(BODY), sig), 0);
  sig[7] = 'a'; /* mixed case */
  assert_int_equal(pr_sign_verify(SECRET, TS, BODY, strlen(BODY), sig), 0);
}

/* A 64 KiB body (the protocol's cap) signs and verifies like a short one. */
static void test_large_body(void **state) {
  (void)state;
  static char big[64 << 10];
  memset(big, 'x', sizeof(big));
  char sig[PR_SIGN_LEN + 1];
  assert_int_equal(pr_sign_heartbeat(SECRET, TS, big, sizeof(big), sig), 0);
  assert_int_equal(pr_sign_verify(SECRET, TS, big, sizeof(big), sig), 0);
  big[sizeof(big) - 1] = 'y';
  assert_int_equal(pr_sign_verify(SECRET, TS, big, sizeof(big), sig), -EACCES);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_answers),
      cmocka_unit_test(test_verify_accepts_the_right_signature),
      cmocka_unit_test(test_verify_refuses_wrong_inputs),
      cmocka_unit_test(test_verify_refuses_malformed_signatures),
      cmocka_unit_test(test_verify_accepts_uppercase_hex),
      cmocka_unit_test(test_large_body),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
