/* proto/idkey.c: Ed25519 identity keys against RFC 8032's first test key (its public
 * key, and a signature made with `openssl pkeyutl -sign -rawin`), the key file forms,
 * and every way a signature or a public key can be wrong. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "err.h"
#include "idkey.h"

/* RFC 8032 7.1 TEST 1: the secret key as PKCS#8 DER, base64, and its public key */
static const char RFC_DER_B64[] = "MC4CAQAwBQYDK2VwBCIEIJ1hsZ3v/VpguoRK9JLsLMREScVpezJpGXA7rAMcrn9g";
static const char RFC_PEM[] =
    "-----BEGIN PRIVATE KEY-----\n"
    "MC4CAQAwBQYDK2VwBCIEIJ1hsZ3v/VpguoRK9JLsLMREScVpezJpGXA7rAMcrn9g\n"
    "-----END PRIVATE KEY-----\n";
static const char RFC_PUB[] = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
/* printf '%s' '1700000000000.{"id":"a"}' | openssl pkeyutl -sign -inkey k.pem -rawin */
static const char RFC_SIG[] =
    "ed25519=dEXpmK1Kk8rI5zbLF6BQC2kQPHgs94SX+6VMv7rVW+l8yZs767haE0/nGK5J1LzgDPUVXXj8gO6EWwPVXk0ZDQ==";

static void test_known_key_and_signature(void **state) {
  (void)state;
  pr_idkey *a = NULL, *b = NULL;
  assert_int_equal(pr_idkey_from_text(&a, RFC_DER_B64, strlen(RFC_DER_B64)), 0);
  assert_int_equal(pr_idkey_from_text(&b, RFC_PEM, strlen(RFC_PEM)), 0);
  assert_string_equal(pr_idkey_public(a), RFC_PUB);
  assert_string_equal(pr_idkey_public(b), RFC_PUB);
  char sig[PR_IDKEY_SIG_LEN + 1];
  assert_int_equal(pr_idkey_sign(a, "1700000000000", "{\"id\":\"a\"}", 10, sig), 0);
  /* Ed25519 is deterministic: the same bytes OpenSSL's command line makes */
  assert_string_equal(sig, RFC_SIG);
  assert_int_equal(strlen(sig), PR_IDKEY_SIG_LEN);
  assert_int_equal(pr_idkey_verify(RFC_PUB, "1700000000000", "{\"id\":\"a\"}", 10, RFC_SIG), 0);
  pr_idkey_free(a);
  pr_idkey_free(b);
}

static void test_wrong_signatures_fail(void **state) {
  (void)state;
  const char *body = "{\"id\":\"a\"}";
  /* another body, another timestamp */
  assert_int_equal(pr_idkey_verify(RFC_PUB, "1700000000000", "{\"id\":\"b\"}", 10, RFC_SIG), -EACCES);
  assert_int_equal(pr_idkey_verify(RFC_PUB, "1700000000001", body, 10, RFC_SIG), -EACCES);
  /* another key */
  pr_idkey *k = NULL;
  assert_int_equal(pr_idkey_generate(&k), 0);
  assert_int_equal(pr_idkey_verify(pr_idkey_public(k), "1700000000000", body, 10, RFC_SIG), -EACCES);
  /* one bit of the signature */
  char bad[sizeof(RFC_SIG)];
  memcpy(bad, RFC_SIG, sizeof(RFC_SIG));
  bad[20] = bad[20] == 'A' ? 'B' : 'A';
  assert_int_equal(pr_idkey_verify(RFC_PUB, "1700000000000", body, 10, bad), -EACCES);
  /* malformed: prefix, length, padding, characters */
  assert_int_equal(pr_idkey_verify(RFC_PUB, "1700000000000", body, 10, RFC_SIG + 8), PR_EPARSE);
  assert_int_equal(pr_idkey_verify(RFC_PUB, "1700000000000", body, 10, "ed25519="), PR_EPARSE);
  assert_int_equal(pr_idkey_verify(RFC_PUB, "1700000000000", body, 10, "sha256=00"), PR_EPARSE);
  memcpy(bad, RFC_SIG, sizeof(RFC_SIG));
  bad[sizeof(RFC_SIG) - 3] = '*';
  assert_int_equal(pr_idkey_verify(RFC_PUB, "1700000000000", body, 10, bad), PR_EPARSE);
  assert_int_equal(pr_idkey_verify(RFC_PUB, "1700000000000", body, 10, NULL), PR_EPARSE);
  /* a public key that is not one */
  assert_int_equal(pr_idkey_verify("abc", "1700000000000", body, 10, RFC_SIG), PR_EPARSE);
  assert_int_equal(pr_idkey_verify(NULL, "1700000000000", body, 10, RFC_SIG), PR_EPARSE);
  pr_idkey_free(k);
}

static void test_public_key_form(void **state) {
  (void)state;
  assert_true(pr_idkey_valid_public(RFC_PUB));
  assert_false(pr_idkey_valid_public(""));
  assert_false(pr_idkey_valid_public("11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo")); /* no pad */
  assert_false(pr_idkey_valid_public("11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURp=")); /* not canonical */
  assert_false(pr_idkey_valid_public("11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=="));
  assert_false(pr_idkey_valid_public("11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcH\nRo="));
}

static void test_generated_keys_sign_and_differ(void **state) {
  (void)state;
  pr_idkey *a = NULL, *b = NULL;
  assert_int_equal(pr_idkey_generate(&a), 0);
  assert_int_equal(pr_idkey_generate(&b), 0);
  assert_string_not_equal(pr_idkey_public(a), pr_idkey_public(b));
  assert_true(pr_idkey_valid_public(pr_idkey_public(a)));
  char sig[PR_IDKEY_SIG_LEN + 1];
  assert_int_equal(pr_idkey_sign(a, "5", NULL, 0, sig), 0);
  assert_int_equal(pr_idkey_verify(pr_idkey_public(a), "5", NULL, 0, sig), 0);
  assert_int_equal(pr_idkey_verify(pr_idkey_public(b), "5", NULL, 0, sig), -EACCES);
  pr_idkey_free(a);
  pr_idkey_free(b);
}

static void test_text_forms_refused(void **state) {
  (void)state;
  pr_idkey *k = NULL;
  assert_int_equal(pr_idkey_from_text(&k, "", 0), PR_EPARSE);
  assert_int_equal(pr_idkey_from_text(&k, "not a key", 9), PR_EPARSE);
  assert_int_equal(pr_idkey_from_text(&k, RFC_PUB, strlen(RFC_PUB)), PR_EPARSE);
  assert_null(k);
  /* an EC P-256 key (what Acurast's tunnel takes) is a key, but not ours */
  static const char p256[] =
      "-----BEGIN PRIVATE KEY-----\n"
      "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg6DnzQJuRUwuHPu6g\n"
      "USNmWHT0YxP+IYpSnsBJ3qWwoRqhRANCAARWsHh78RajGmdplBmPr2MiH/6/xJnz\n"
      "hmBvThSc3iNBb9ICVFYCZVgWUVAutPMORcTfODj+9KEervXWldtxgjRz\n"
      "-----END PRIVATE KEY-----\n";
  assert_int_equal(pr_idkey_from_text(&k, p256, strlen(p256)), PR_ETYPE);
  assert_null(k);
}

static void test_key_file_created_once_and_private(void **state) {
  (void)state;
  char dir[] = "/tmp/fg-idkey-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256], err[256];
  snprintf(path, sizeof(path), "%s/agent.key", dir);
  pr_idkey *a = NULL, *b = NULL;
  assert_int_equal(pr_idkey_load_file(&a, path, 0, err, sizeof(err)), -ENOENT);
  assert_int_equal(pr_idkey_load_file(&a, path, 1, err, sizeof(err)), 0);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  /* loaded again: the same key, not a new one */
  assert_int_equal(pr_idkey_load_file(&b, path, 1, err, sizeof(err)), 0);
  assert_string_equal(pr_idkey_public(a), pr_idkey_public(b));
  pr_idkey_free(b);
  /* a key others may read is refused */
  chmod(path, 0644);
  assert_int_equal(pr_idkey_load_file(&b, path, 1, err, sizeof(err)), -EPERM);
  assert_non_null(strstr(err, "chmod 600"));
  unlink(path);
  rmdir(dir);
  pr_idkey_free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_key_and_signature),
      cmocka_unit_test(test_wrong_signatures_fail),
      cmocka_unit_test(test_public_key_form),
      cmocka_unit_test(test_generated_keys_sign_and_differ),
      cmocka_unit_test(test_text_forms_refused),
      cmocka_unit_test(test_key_file_created_once_and_private),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
