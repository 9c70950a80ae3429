/* proto/privfile.c: secret-holding files made and kept 0600 whatever the umask; files
 * found open to others tightened and reported; other kinds of file left alone. */
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

#include "privfile.h"

static unsigned mode_of(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return (unsigned)(st.st_mode & 07777);
}

static void touch(const char *path, unsigned mode) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(chmod(path, mode), 0);
}

static void test_keep(void **state) {
  (void)state;
  mode_t old = umask(0);
  char dir[] = "/tmp/fg-privfile-XXXXXX", path[256];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/secret", dir);
  unsigned was = 0;
  /* missing: created 0600 even with umask 0; without create nothing happens */
  assert_int_equal(pr_privfile_keep(path, 0, &was), 0);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(pr_privfile_keep(path, 1, &was), 0);
  assert_int_equal(mode_of(path), 0600);
  assert_int_equal(pr_privfile_keep(path, 1, &was), 0);
  /* open to the group, to others, executable by others: tightened, the old mode said */
  static const unsigned loose[] = {0644, 0640, 0604, 0660, 0601, 0777};
  for (size_t i = 0; i < sizeof(loose) / sizeof(loose[0]); i++) {
    assert_int_equal(chmod(path, loose[i]), 0);
    assert_int_equal(pr_privfile_keep(path, 0, &was), 1);
    assert_int_equal(was, loose[i]);
    assert_int_equal(mode_of(path), 0600);
  }
  /* stricter than 0600 is kept as it is */
  assert_int_equal(chmod(path, 0400), 0);
  assert_int_equal(pr_privfile_keep(path, 1, NULL), 0);
  assert_int_equal(mode_of(path), 0400);
  /* not a regular file: left alone */
  assert_int_equal(pr_privfile_keep(dir, 0, &was), 0);
  assert_int_equal(pr_privfile_keep("/nonexistent-dir/x", 1, &was), -ENOENT);
  umask(old);
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_keep_sqlite(void **state) {
  (void)state;
  mode_t old = umask(022);
  char dir[] = "/tmp/fg-privfile-XXXXXX", path[256], side[300], note[1024];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/x.db", dir);
  assert_int_equal(pr_privfile_keep_sqlite(path, note, sizeof(note)), 0);
  assert_string_equal(note, "");
  assert_int_equal(mode_of(path), 0600);
  /* no side file is made; those there are tightened and named */
  snprintf(side, sizeof(side), "%s-journal", path);
  assert_int_equal(access(side, F_OK), -1);
  snprintf(side, sizeof(side), "%s-wal", path);
  touch(side, 0644);
  assert_int_equal(chmod(path, 0640), 0);
  assert_int_equal(pr_privfile_keep_sqlite(path, note, sizeof(note)), 2);
  char want[1024];
  snprintf(want, sizeof(want), "%s (was 0640), %s-wal (was 0644)", path, path);
  assert_string_equal(note, want);
  assert_int_equal(mode_of(path), 0600);
  assert_int_equal(mode_of(side), 0600);
  snprintf(side, sizeof(side), "%s-shm", path);
  assert_int_equal(access(side, F_OK), -1);
  umask(old);
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void read_back(const char *path, const char *want) {
  char buf[64] = {0};
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  assert_int_equal(n, strlen(want));
  assert_string_equal(buf, want);
}

/* A data file replaced as a whole: 0600 whatever the umask, a stale .tmp open to others
 * tightened, the old text gone, nothing left beside it; a folder missing is an error. */
static void test_write(void **state) {
  (void)state;
  mode_t old = umask(0);
  char dir[] = "/tmp/fg-privfile-XXXXXX", path[256], tmp[300];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/records.json", dir);
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  for (int sync = 0; sync <= 1; sync++) {
    touch(tmp, 0666); /* a stale one, left open to others */
    assert_int_equal(pr_privfile_write(path, sync ? "{\"b\":2}" : "{\"a\":1, \"longer\":true}", sync), 0);
    read_back(path, sync ? "{\"b\":2}" : "{\"a\":1, \"longer\":true}");
    assert_int_equal(mode_of(path), 0600);
    assert_int_equal(access(tmp, F_OK), -1);
  }
  char missing[300];
  snprintf(missing, sizeof(missing), "%s/no-such-folder/x.json", dir);
  assert_int_equal(pr_privfile_write(missing, "{}", 1), -ENOENT);
  umask(old);
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_keep),
      cmocka_unit_test(test_keep_sqlite),
      cmocka_unit_test(test_write),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
