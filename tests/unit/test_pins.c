/* gateway/pins.c: phone key pins in memory and in a SQLite file: the cap, approval,
 * release, expiry (a replica still in the registry keeps its pin), and what survives a
 * reopen (pins, their state, a URL change; rows that are not ours are skipped), and the
 * file's mode (0600 whatever the umask: it holds the secret phones' tokens derive from). */
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
#include <sqlite3.h>

#include "err.h"
#include "pins.h"

static const char K1[] = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
static const char K2[] = "tTd5PY/T+TBz9fmC7mJbdGeDQozAT7FO8pkMN0d7TxU=";

static void test_memory_pins(void **state) {
  (void)state;
  gw_pins *p = NULL;
  char err[256];
  assert_int_equal(gw_pins_open(&p, NULL, err, sizeof(err)), 0);
  assert_null(gw_pins_path(p));
  assert_int_equal(gw_pins_put(p, "a", K1, "https://a.acu.run", GW_PIN_PINNED, 1000, 2), 0);
  assert_int_equal(gw_pins_put(p, "b", K2, "https://b.acu.run", GW_PIN_PENDING, 1000, 2), 0);
  /* full: a third id is refused, replacing a known one is not */
  assert_int_equal(gw_pins_put(p, "c", K1, "https://c", GW_PIN_PINNED, 1000, 2), PR_ETOOLARGE);
  assert_int_equal(gw_pins_put(p, "a", K2, "https://a2", GW_PIN_PINNED, 2000, 2), 0);
  assert_string_equal(gw_pins_find(p, "a")->key, K2);
  assert_string_equal(gw_pins_find(p, "a")->url, "https://a2");
  assert_null(gw_pins_find(p, "c"));
  assert_int_equal(gw_pins_count(p, GW_PIN_PINNED), 1);
  assert_int_equal(gw_pins_count(p, GW_PIN_PENDING), 1);
  assert_int_equal(gw_pins_approve(p, "b"), 0);
  assert_int_equal(gw_pins_find(p, "b")->state, GW_PIN_PINNED);
  assert_int_equal(gw_pins_approve(p, "nobody"), -ENOENT);
  assert_int_equal(gw_pins_remove(p, "b"), 0);
  assert_int_equal(gw_pins_remove(p, "b"), -ENOENT);
  assert_int_equal(gw_pins_total(p), 1);
  /* malformed keys are never pinned */
  assert_int_equal(gw_pins_put(p, "d", "short", "https://d", GW_PIN_PINNED, 1, 10), PR_EPARSE);
  gw_pins_close(p);
}

/* Pins are found by their id's hash among many; a pin removed from the middle leaves every
 * other one found, in place (a pin found stays put), and listed once. */
static void test_many_pins_are_found_by_id(void **state) {
  (void)state;
  gw_pins *p = NULL;
  char err[256];
  assert_int_equal(gw_pins_open(&p, NULL, err, sizeof(err)), 0);
  enum { N = 3000 };
  gw_pin *at[N];
  for (int i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof(id), "phone-%04d", i);
    assert_int_equal(gw_pins_put(p, id, i % 2 ? K1 : K2, "https://x", i % 3 ? GW_PIN_PINNED : GW_PIN_PENDING,
                                 1000, N), 0);
    at[i] = gw_pins_find(p, id);
    assert_non_null(at[i]);
  }
  assert_int_equal(gw_pins_count(p, GW_PIN_PENDING), N / 3);
  assert_int_equal(gw_pins_count(p, GW_PIN_PINNED), N - N / 3);
  for (int i = 0; i < N; i += 7) {
    char id[32];
    snprintf(id, sizeof(id), "phone-%04d", i);
    assert_int_equal(gw_pins_remove(p, id), 0);
  }
  size_t left = 0, pending = 0;
  for (int i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof(id), "phone-%04d", i);
    gw_pin *pin = gw_pins_find(p, id);
    if (i % 7 == 0) {
      assert_null(pin);
      continue;
    }
    assert_ptr_equal(pin, at[i]); /* the same pin, where it was */
    assert_string_equal(pin->id, id);
    left++;
    pending += i % 3 == 0;
  }
  assert_int_equal(gw_pins_total(p), left);
  assert_int_equal(gw_pins_count(p, GW_PIN_PENDING), pending);
  /* the listing holds each pin once */
  size_t seen = 0;
  for (size_t i = 0; i < gw_pins_total(p); i++) {
    gw_pin *pin = gw_pins_at(p, i);
    assert_ptr_equal(gw_pins_find(p, pin->id), pin);
    seen++;
  }
  assert_int_equal(seen, left);
  assert_null(gw_pins_at(p, left));
  gw_pins_close(p);
}

static int keep_a(void *ud, const char *id) {
  (void)ud;
  return strcmp(id, "a") == 0;
}

static void test_expiry_spares_replicas_in_the_registry(void **state) {
  (void)state;
  gw_pins *p = NULL;
  char err[256];
  assert_int_equal(gw_pins_open(&p, NULL, err, sizeof(err)), 0);
  assert_int_equal(gw_pins_put(p, "a", K1, "u", GW_PIN_PINNED, 0, 10), 0);
  assert_int_equal(gw_pins_put(p, "b", K2, "u", GW_PIN_PINNED, 0, 10), 0);
  assert_int_equal(gw_pins_put(p, "c", K2, "u", GW_PIN_PINNED, 0, 10), 0);
  gw_pins_seen(p, gw_pins_find(p, "c"), NULL, 9000);
  /* ttl 5 s at t = 10 s: b went silent at 0 and goes; a is kept; c was heard at 9 s */
  assert_int_equal(gw_pins_expire(p, 10000, 5000, 5000, keep_a, NULL), 1);
  assert_non_null(gw_pins_find(p, "a"));
  assert_null(gw_pins_find(p, "b"));
  assert_non_null(gw_pins_find(p, "c"));
  assert_int_equal(gw_pins_expire(p, 20000, 5000, 5000, NULL, NULL), 2);
  assert_int_equal(gw_pins_total(p), 0);
  gw_pins_close(p);
}

static void test_file_pins_survive_a_reopen(void **state) {
  (void)state;
  char dir[] = "/tmp/fg-pins-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256], err[256];
  snprintf(path, sizeof(path), "%s/pins.sqlite", dir);
  gw_pins *p = NULL;
  assert_int_equal(gw_pins_open(&p, path, err, sizeof(err)), 0);
  assert_string_equal(gw_pins_path(p), path);
  assert_int_equal(gw_pins_put(p, "a", K1, "https://a", GW_PIN_PINNED, 1000, 10), 0);
  assert_int_equal(gw_pins_put(p, "b", K2, "https://b", GW_PIN_PENDING, 1000, 10), 0);
  assert_int_equal(gw_pins_put(p, "gone", K2, "https://g", GW_PIN_PINNED, 1000, 10), 0);
  assert_int_equal(gw_pins_remove(p, "gone"), 0);
  assert_int_equal(gw_pins_seen(p, gw_pins_find(p, "a"), "https://a-moved", 5000), 0);
  gw_pins_close(p);
  /* a row someone else wrote, with a key that is not one: skipped on load */
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "INSERT INTO pins VALUES ('x', 'not-a-key', 'u', 'pinned', 1, 1)",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  sqlite3_close(db);
  assert_int_equal(gw_pins_open(&p, path, err, sizeof(err)), 0);
  assert_int_equal(gw_pins_total(p), 2);
  gw_pin *a = gw_pins_find(p, "a");
  assert_non_null(a);
  assert_string_equal(a->key, K1);
  assert_string_equal(a->url, "https://a-moved");
  assert_int_equal(a->seen_ms, 5000);
  assert_int_equal(a->enrolled_ms, 1000);
  assert_int_equal(gw_pins_find(p, "b")->state, GW_PIN_PENDING);
  assert_int_equal(gw_pins_approve(p, "b"), 0);
  assert_null(gw_pins_find(p, "gone"));
  assert_null(gw_pins_find(p, "x"));
  gw_pins_close(p);
  assert_int_equal(gw_pins_open(&p, path, err, sizeof(err)), 0);
  assert_int_equal(gw_pins_find(p, "b")->state, GW_PIN_PINNED);
  gw_pins_close(p);
  char cmd[400];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static unsigned mode_of(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return (unsigned)(st.st_mode & 07777);
}

static void test_file_is_private_whatever_the_umask(void **state) {
  (void)state;
  mode_t old = umask(022);
  char dir[] = "/tmp/fg-pins-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256], side[300], err[256];
  snprintf(path, sizeof(path), "%s/pins.sqlite", dir);
  gw_pins *p = NULL;
  assert_int_equal(gw_pins_open(&p, path, err, sizeof(err)), 0);
  char secret[65];
  assert_int_equal(gw_pins_secret(p, secret), 0);
  assert_int_equal(gw_pins_put(p, "a", K1, "https://a", GW_PIN_PINNED, 1000, 10), 0);
  /* the database, and the WAL and shared memory SQLite keeps beside it while open */
  assert_int_equal(mode_of(path), 0600);
  snprintf(side, sizeof(side), "%s-wal", path);
  assert_int_equal(mode_of(side), 0600);
  snprintf(side, sizeof(side), "%s-shm", path);
  assert_int_equal(mode_of(side), 0600);
  gw_pins_close(p);
  /* a file made open to others (an older gateway, a copy): tightened at the next open,
   * a leftover journal too */
  assert_int_equal(chmod(path, 0644), 0);
  snprintf(side, sizeof(side), "%s-journal", path);
  FILE *f = fopen(side, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(chmod(side, 0664), 0);
  assert_int_equal(gw_pins_open(&p, path, err, sizeof(err)), 0);
  assert_int_equal(mode_of(path), 0600);
  assert_int_equal(mode_of(side), 0600);
  char again[65];
  assert_int_equal(gw_pins_secret(p, again), 0);
  assert_string_equal(secret, again);
  gw_pins_close(p);
  umask(old);
  char cmd[400];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_unusable_file_is_an_error(void **state) {
  (void)state;
  gw_pins *p = NULL;
  char err[256] = "";
  assert_int_equal(gw_pins_open(&p, "/nonexistent-dir/pins.sqlite", err, sizeof(err)), -EIO);
  assert_null(p);
  assert_non_null(strstr(err, "/nonexistent-dir/pins.sqlite"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memory_pins),
      cmocka_unit_test(test_many_pins_are_found_by_id),
      cmocka_unit_test(test_expiry_spares_replicas_in_the_registry),
      cmocka_unit_test(test_file_pins_survive_a_reopen),
      cmocka_unit_test(test_file_is_private_whatever_the_umask),
      cmocka_unit_test(test_unusable_file_is_an_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
