/* Unit tests for proto/hash.c and proto/idmap.c: SipHash-2-4 through OpenSSL against the
 * reference vectors of its authors' paper, the process's keyed hash stable within the
 * process, and the map against a plain array: keys with NUL bytes, replacing, removing,
 * 50,000 entries, and ids that share long prefixes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hash.h"
#include "idmap.h"

/* SipHash-2-4 with the key 00 01 .. 0f, of the messages 00, 00 01, ... (the paper's
 * appendix, as the little-endian 64-bit values its test vectors spell byte by byte). */
static void test_siphash_matches_the_reference_vectors(void **state) {
  (void)state;
  static const uint64_t want[] = {
      0x726fdb47dd0e0e31ull, 0x74f839c593dc67fdull, 0x0d6c8009d9a94f5aull, 0x85676696d7fb7e2dull,
      0xcf2794e0277187b7ull, 0x18765564cd99a68dull, 0xcbc9466e58fee3ceull, 0xab0200f58b01d137ull,
      0x93f5f5799a932462ull, 0x9e0082df0ba9e4b0ull, 0x7a5dbbc594ddb9f3ull, 0xf4b32f46226bada7ull,
      0x751e8fbc860ee5fbull, 0x14ea5627c0843d90ull, 0xf723ca908e7af2eeull, 0xa129ca6149be45e5ull,
  };
  unsigned char key[16], msg[16];
  for (int i = 0; i < 16; i++) key[i] = msg[i] = (unsigned char)i;
  for (size_t n = 0; n < sizeof(want) / sizeof(want[0]); n++) {
    uint64_t v = 0;
    assert_int_equal(pr_siphash24(key, msg, n, &v), 0);
    assert_true(v == want[n]);
  }
}

static void test_the_process_hash_is_stable_and_keyed(void **state) {
  (void)state;
  assert_true(pr_hash64("pixel-07", 8) == pr_hash64("pixel-07", 8));
  assert_true(pr_hash64("pixel-07", 8) != pr_hash64("pixel-08", 8));
  /* not the reference key's hash: the process drew a key of its own */
  unsigned char key[16];
  for (int i = 0; i < 16; i++) key[i] = (unsigned char)i;
  uint64_t ref = 0;
  assert_int_equal(pr_siphash24(key, "", 0, &ref), 0);
  assert_true(pr_hash64("", 0) != ref);
}

static void test_put_get_replace_delete(void **state) {
  (void)state;
  pr_idmap m = PR_IDMAP_INIT;
  int a, b, c;
  assert_null(pr_idmap_get_str(&m, "a"));
  assert_int_equal(pr_idmap_count(&m), 0);
  assert_int_equal(pr_idmap_put_str(&m, "a", &a), 0);
  assert_int_equal(pr_idmap_put_str(&m, "b", &b), 0);
  assert_ptr_equal(pr_idmap_get_str(&m, "a"), &a);
  assert_ptr_equal(pr_idmap_get_str(&m, "b"), &b);
  assert_null(pr_idmap_get_str(&m, "ab"));
  assert_null(pr_idmap_get_str(&m, ""));
  assert_null(pr_idmap_get_str(&m, NULL));
  assert_int_equal(pr_idmap_put_str(&m, "a", &c), 0); /* replaced, not added */
  assert_ptr_equal(pr_idmap_get_str(&m, "a"), &c);
  assert_int_equal(pr_idmap_count(&m), 2);
  /* keys are bytes: a NUL inside counts, and the map keeps its own copy */
  char k1[] = {'x', 0, 'y'}, k2[] = {'x', 0, 'z'};
  assert_int_equal(pr_idmap_put(&m, k1, 3, &a), 0);
  assert_int_equal(pr_idmap_put(&m, k2, 3, &b), 0);
  k1[2] = 'q';
  assert_null(pr_idmap_get(&m, k1, 3));
  k1[2] = 'y';
  assert_ptr_equal(pr_idmap_get(&m, k1, 3), &a);
  assert_ptr_equal(pr_idmap_get(&m, k2, 3), &b);
  assert_null(pr_idmap_get(&m, "x", 1));
  assert_int_equal(pr_idmap_del_str(&m, "a"), 0);
  assert_int_equal(pr_idmap_del_str(&m, "a"), -ENOENT);
  assert_null(pr_idmap_get_str(&m, "a"));
  assert_ptr_equal(pr_idmap_get_str(&m, "b"), &b);
  assert_int_equal(pr_idmap_count(&m), 3);
  pr_idmap_clear(&m);
  assert_int_equal(pr_idmap_count(&m), 0);
  assert_null(pr_idmap_get_str(&m, "b"));
  /* usable again after a clear */
  assert_int_equal(pr_idmap_put_str(&m, "b", &b), 0);
  assert_ptr_equal(pr_idmap_get_str(&m, "b"), &b);
  pr_idmap_clear(&m);
}

#define MANY 50000

static void test_many_ids_against_an_array(void **state) {
  (void)state;
  pr_idmap m = PR_IDMAP_INIT;
  static char ids[MANY][48];
  static int in[MANY];
  memset(in, 0, sizeof(in));
  /* a fleet's ids: long shared prefixes, differing at the end */
  for (int i = 0; i < MANY; i++) {
    snprintf(ids[i], sizeof(ids[i]), "acurast-phone-%08d", i);
    assert_int_equal(pr_idmap_put_str(&m, ids[i], ids[i]), 0);
    in[i] = 1;
  }
  assert_int_equal(pr_idmap_count(&m), MANY);
  srand(3);
  for (int step = 0; step < 100000; step++) {
    int i = rand() % MANY;
    if (rand() % 3 == 0) {
      assert_int_equal(pr_idmap_del_str(&m, ids[i]), in[i] ? 0 : -ENOENT);
      in[i] = 0;
    } else if (rand() % 2) {
      assert_int_equal(pr_idmap_put_str(&m, ids[i], ids[i]), 0);
      in[i] = 1;
    }
    int k = rand() % MANY;
    assert_ptr_equal(pr_idmap_get_str(&m, ids[k]), in[k] ? ids[k] : NULL);
  }
  size_t n = 0;
  for (int i = 0; i < MANY; i++) {
    n += (size_t)in[i];
    assert_ptr_equal(pr_idmap_get_str(&m, ids[i]), in[i] ? ids[i] : NULL);
  }
  assert_int_equal(pr_idmap_count(&m), n);
  assert_null(pr_idmap_get_str(&m, "acurast-phone-"));
  pr_idmap_clear(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_siphash_matches_the_reference_vectors),
      cmocka_unit_test(test_the_process_hash_is_stable_and_keyed),
      cmocka_unit_test(test_put_get_replace_delete),
      cmocka_unit_test(test_many_ids_against_an_array),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
