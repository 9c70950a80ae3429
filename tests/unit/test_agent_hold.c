/* Unit tests for agent/hold.c: the rules (the memory a phone gives a model, the memory a
 * model needs, whether it fits, with the words said), model file names, digests read a
 * chunk at a time and stopped between chunks, the digest cache by size and modification
 * time, the folder's scan, and the watcher on a real libuv loop working digests out on the
 * thread pool, once per file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "hold.h"

#define SHA_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define SHA_EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static int setup(void **state) {
  char *root = strdup("/tmp/fg-agent-holdXXXXXX");
  if (!root || !mkdtemp(root)) return -1;
  *state = root;
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", (char *)*state);
  int rc = system(cmd);
  free(*state);
  return rc == 0 ? 0 : -1;
}

static void put(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(text, fp);
  assert_int_equal(fclose(fp), 0);
}

/* name's size and modification time in ns. */
static void stat_of(const char *dir, const char *name, uint64_t *bytes, int64_t *mt) {
  char path[1024];
  struct stat st;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  assert_int_equal(stat(path, &st), 0);
  *bytes = (uint64_t)st.st_size;
  *mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

/* Give name another modification time (a second later), as a rewrite would. */
static void touch_later(const char *dir, const char *name) {
  char path[1024];
  struct stat st;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  assert_int_equal(stat(path, &st), 0);
  struct timeval tv[2] = {{st.st_atim.tv_sec, 0}, {st.st_mtim.tv_sec + 1, 0}};
  assert_int_equal(utimes(path, tv), 0);
}

static void test_rules(void **state) {
  (void)state;
  /* a phone keeps max(2 GiB, a quarter) of MemTotal for Android */
  assert_true(ag_hold_usable_mb(7474) == 5426);   /* an 8 GB phone */
  assert_true(ag_hold_usable_mb(11264) == 8448);  /* a 12 GB phone */
  assert_true(ag_hold_usable_mb(1500) == 0);
  assert_true(ag_hold_usable_mb(-1) < 0);
  /* the file, 20 % of it and 512 MiB: the seed's 9B at Q4_K_M needs 7013 MiB */
  assert_true(ag_hold_need_mem_mb(5680000000ULL) == 7013);
  assert_true(ag_hold_need_mem_mb(0) == 512);
  assert_true(ag_hold_need_mem_mb(1048576) == 514); /* 1.2 MiB + 512, rounded up */

  char why[512];
  assert_int_equal(ag_hold_fits("qwen3.5-9b", 5680000000ULL, 0, 7474, 50000, 0, why, sizeof(why)), 0);
  assert_string_equal(why, "cannot hold qwen3.5-9b: it needs 7013 MiB of memory and this phone can give it "
                           "5426 MiB (MemTotal 7474 MiB less 2048 MiB kept for Android)");
  assert_int_equal(ag_hold_fits("qwen3.5-9b", 5680000000ULL, 0, 11264, 50000, 0, why, sizeof(why)), 1);
  assert_string_equal(why, "qwen3.5-9b fits: 7013 of 8448 MiB of memory, 5673 of 50000 MiB of storage");
  /* storage: what is not there yet, and 256 MiB to spare */
  assert_int_equal(ag_hold_fits("m", 5680000000ULL, 0, 11264, 5000, 0, why, sizeof(why)), 0);
  assert_string_equal(why, "cannot hold m: its file needs 5417 MiB more of storage in the models folder "
                           "(with 256 MiB to spare) and 5000 MiB are free");
  /* half of it downloaded already (a broken download's part): half is needed */
  assert_int_equal(ag_hold_fits("m", 5680000000ULL, 0, 11264, 3000, 2840000000ULL, why, sizeof(why)), 1);
  /* the whole file there: no storage needed */
  assert_int_equal(ag_hold_fits("m", 5680000000ULL, 0, 11264, 0, 5680000000ULL, why, sizeof(why)), 1);
  assert_string_equal(why, "m fits: 7013 of 8448 MiB of memory, its file is there");
  /* the need given outright wins over the size */
  assert_int_equal(ag_hold_fits("m", 600000000ULL, 9000, 11264, 50000, 0, why, sizeof(why)), 0);
  assert_int_equal(ag_hold_fits("m", 0, 8000, 11264, -1, 0, why, sizeof(why)), 1);
  assert_string_equal(why, "m fits: 8000 of 8448 MiB of memory, no size given");
  /* what cannot be read is not held against the phone */
  assert_int_equal(ag_hold_fits("m", 5680000000ULL, 0, -1, -1, 0, why, sizeof(why)), 1);
  assert_string_equal(why, "m fits: memory unknown (not checked), storage unknown (not checked)");
}

/* A switch the gateway asks for is checked before anything is drained or downloaded: the
 * memory the catalogue gives, and the storage of what of the file is not there yet. */
static void test_switch_rule(void **state) {
  (void)state;
  char why[512];
  const char *d9 = "9999999999999999999999999999999999999999999999999999999999999999";
  ag_hold_file held[2];
  memset(held, 0, sizeof(held));
  snprintf(held[0].file, sizeof(held[0].file), "guard-0.8b.gguf");
  snprintf(held[0].name, sizeof(held[0].name), "guard-0.8b");
  held[0].bytes = 838860800ULL;
  snprintf(held[1].file, sizeof(held[1].file), "review-9b.gguf");
  snprintf(held[1].name, sizeof(held[1].name), "review-9b");
  held[1].bytes = 9437184000ULL;
  /* 9000 MiB to download, 1000 MiB free: refused, with the figures */
  assert_int_equal(ag_hold_switch_fits("review-9b", 9437184000ULL, 0, d9, 16000, 1000, held, 1, 0, why,
                                       sizeof(why)), 0);
  assert_string_equal(why, "cannot hold review-9b: its file needs 9000 MiB more of storage in the models folder "
                           "(with 256 MiB to spare) and 1000 MiB are free");
  /* the catalogue's memory need, not the size's, on a phone of 8 GB */
  assert_int_equal(ag_hold_switch_fits("review-9b", 9437184000ULL, 11000, d9, 7474, 50000, held, 1, 0, why,
                                       sizeof(why)), 0);
  assert_string_equal(why, "cannot hold review-9b: it needs 11000 MiB of memory and this phone can give it "
                           "5426 MiB (MemTotal 7474 MiB less 2048 MiB kept for Android)");
  /* held with the catalogue's digest: no storage needed */
  snprintf(held[1].sha256, sizeof(held[1].sha256), "%s", d9);
  assert_int_equal(ag_hold_switch_fits("review-9b", 9437184000ULL, 0, d9, 16000, 0, held, 2, 0, why,
                                       sizeof(why)), 1);
  assert_string_equal(why, "review-9b fits: 11312 of 12000 MiB of memory, its file is there");
  /* held with another digest: downloaded anew beside it */
  memset(held[1].sha256, 'a', 64);
  assert_int_equal(ag_hold_switch_fits("review-9b", 9437184000ULL, 0, d9, 16000, 5000, held, 2, 0, why,
                                       sizeof(why)), 0);
  /* its digest not worked out yet: the same size counts as the file */
  held[1].sha256[0] = 0;
  assert_int_equal(ag_hold_switch_fits("review-9b", 9437184000ULL, 0, d9, 16000, 0, held, 2, 0, why,
                                       sizeof(why)), 1);
  held[1].bytes = 1000;
  assert_int_equal(ag_hold_switch_fits("review-9b", 9437184000ULL, 0, d9, 16000, 5000, held, 2, 0, why,
                                       sizeof(why)), 0);
  /* a broken download's part counts: 5000 of 9000 MiB there, 4000 + 256 needed */
  assert_int_equal(ag_hold_switch_fits("review-9b", 9437184000ULL, 0, d9, 16000, 4300, held, 2,
                                       5242880000ULL, why, sizeof(why)), 1);
  assert_int_equal(ag_hold_switch_fits("review-9b", 9437184000ULL, 0, d9, 16000, 4200, held, 2,
                                       5242880000ULL, why, sizeof(why)), 0);
  /* memory and storage unknown: not checked */
  assert_int_equal(ag_hold_switch_fits("review-9b", 9437184000ULL, 0, NULL, -1, -1, NULL, 0, 0, why,
                                       sizeof(why)), 1);
}

static void test_names(void **state) {
  (void)state;
  char n[AG_HOLD_NAME_MAX + 1];
  assert_int_equal(ag_hold_model_name("qwen3.5-9b.gguf", n), 0);
  assert_string_equal(n, "qwen3.5-9b");
  assert_int_equal(ag_hold_model_name("Tiny_Q4.GGUF", n), 0);
  assert_string_equal(n, "Tiny_Q4");
  static const char *const no[] = {".hidden.gguf", "a b.gguf", "model.gguf.part", ".gguf", "gguf", "x.bin",
                                   "m\xc3\xa9.gguf", "a/b.gguf", ""};
  for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) assert_int_equal(ag_hold_model_name(no[i], n), -EINVAL);
  char longname[80];
  memset(longname, 'a', 65);
  strcpy(longname + 65, ".gguf");
  assert_int_equal(ag_hold_model_name(longname, n), -EINVAL);
  strcpy(longname + 64, ".gguf");
  assert_int_equal(ag_hold_model_name(longname, n), 0);
}

static void test_digest(void **state) {
  const char *dir = *state;
  char path[1024], hex[65];
  uint64_t bytes;
  int64_t mt;
  put(dir, "abc.gguf", "abc");
  snprintf(path, sizeof(path), "%s/abc.gguf", dir);
  assert_int_equal(ag_hold_digest_file(path, NULL, hex, &bytes, &mt), 0);
  assert_string_equal(hex, SHA_ABC);
  assert_int_equal(bytes, 3);
  put(dir, "empty.gguf", "");
  snprintf(path, sizeof(path), "%s/empty.gguf", dir);
  assert_int_equal(ag_hold_digest_file(path, NULL, hex, &bytes, &mt), 0);
  assert_string_equal(hex, SHA_EMPTY);
  /* a file of several chunks, against the digest of the same bytes in one go is not at
   * hand here: its digest must not change when read again, and a stop ends it */
  char *big = malloc(3 * AG_HOLD_CHUNK + 7);
  assert_non_null(big);
  for (size_t i = 0; i < 3 * AG_HOLD_CHUNK + 6; i++) big[i] = (char)('a' + i % 26);
  big[3 * AG_HOLD_CHUNK + 6] = '\0';
  put(dir, "big.gguf", big);
  free(big);
  snprintf(path, sizeof(path), "%s/big.gguf", dir);
  char again[65];
  assert_int_equal(ag_hold_digest_file(path, NULL, hex, &bytes, &mt), 0);
  assert_int_equal(bytes, 3 * AG_HOLD_CHUNK + 6);
  assert_int_equal(ag_hold_digest_file(path, NULL, again, &bytes, &mt), 0);
  assert_string_equal(hex, again);
  atomic_int stop;
  atomic_init(&stop, 1);
  assert_int_equal(ag_hold_digest_file(path, &stop, again, &bytes, &mt), -ECANCELED);
  snprintf(path, sizeof(path), "%s/missing.gguf", dir);
  assert_int_equal(ag_hold_digest_file(path, NULL, hex, &bytes, &mt), -ENOENT);
  assert_int_equal(ag_hold_digest_file(dir, NULL, hex, &bytes, &mt), -EINVAL); /* a folder */
}

static void test_cache(void **state) {
  const char *dir = *state;
  char hex[65];
  uint64_t b1, b2;
  int64_t m1, m2;
  put(dir, "a.gguf", "abc");
  put(dir, "b.gguf", "");
  stat_of(dir, "a.gguf", &b1, &m1);
  stat_of(dir, "b.gguf", &b2, &m2);
  assert_int_equal(ag_hold_cache_lookup(dir, "a.gguf", b1, m1, hex), -ENOENT); /* no file yet */
  assert_int_equal(ag_hold_cache_store(dir, "a.gguf", b1, m1, SHA_ABC), 0);
  assert_int_equal(ag_hold_cache_store(dir, "b.gguf", b2, m2, SHA_EMPTY), 0);
  assert_int_equal(ag_hold_cache_lookup(dir, "a.gguf", b1, m1, hex), 0);
  assert_string_equal(hex, SHA_ABC);
  assert_int_equal(ag_hold_cache_lookup(dir, "b.gguf", b2, m2, hex), 0);
  assert_string_equal(hex, SHA_EMPTY);
  /* another size or time is another file */
  assert_int_equal(ag_hold_cache_lookup(dir, "a.gguf", b1 + 1, m1, hex), -ENOENT);
  assert_int_equal(ag_hold_cache_lookup(dir, "a.gguf", b1, m1 + 1, hex), -ENOENT);
  /* refused: not a digest, a path */
  assert_int_equal(ag_hold_cache_store(dir, "a.gguf", b1, m1, "ABC"), -EINVAL);
  assert_int_equal(ag_hold_cache_store(dir, "x/a.gguf", b1, m1, SHA_ABC), -EINVAL);
  /* b changes and a goes: the next store drops both stale entries */
  char path[1024];
  snprintf(path, sizeof(path), "%s/a.gguf", dir);
  assert_int_equal(unlink(path), 0);
  touch_later(dir, "b.gguf");
  put(dir, "c.gguf", "abc");
  uint64_t b3;
  int64_t m3;
  stat_of(dir, "c.gguf", &b3, &m3);
  assert_int_equal(ag_hold_cache_store(dir, "c.gguf", b3, m3, SHA_ABC), 0);
  snprintf(path, sizeof(path), "%s/" AG_HOLD_CACHE_FILE, dir);
  FILE *fp = fopen(path, "r");
  assert_non_null(fp);
  char text[4096];
  size_t n = fread(text, 1, sizeof(text) - 1, fp);
  fclose(fp);
  text[n] = '\0';
  assert_null(strstr(text, " a.gguf\n"));
  assert_null(strstr(text, " b.gguf\n"));
  assert_non_null(strstr(text, " c.gguf\n"));
  /* a damaged file costs digests, never wrong ones */
  put(dir, AG_HOLD_CACHE_FILE, "garbage\nzz 3 4 c.gguf\n" SHA_ABC " x y c.gguf\n");
  assert_int_equal(ag_hold_cache_lookup(dir, "c.gguf", b3, m3, hex), -ENOENT);
  char line[256];
  snprintf(line, sizeof(line), "# a comment\n%s %llu %lld c.gguf\n", SHA_ABC, (unsigned long long)b3, (long long)m3);
  put(dir, AG_HOLD_CACHE_FILE, line);
  assert_int_equal(ag_hold_cache_lookup(dir, "c.gguf", b3, m3, hex), 0);
}

static void test_scan(void **state) {
  const char *dir = *state;
  put(dir, "b.gguf", "abc");
  put(dir, "a.gguf", "");
  put(dir, "notes.txt", "not a model");
  put(dir, ".hidden.gguf", "hidden");
  put(dir, "c.gguf.part", "half");
  char sub[1024];
  snprintf(sub, sizeof(sub), "%s/dir.gguf", dir);
  assert_int_equal(mkdir(sub, 0700), 0);
  uint64_t b;
  int64_t m;
  stat_of(dir, "b.gguf", &b, &m);
  assert_int_equal(ag_hold_cache_store(dir, "b.gguf", b, m, SHA_ABC), 0);
  ag_hold_file f[4];
  size_t n = 9;
  double free_mb = -2;
  assert_int_equal(ag_hold_scan_dir(dir, f, 4, &n, &free_mb), 0);
  assert_int_equal(n, 2);
  assert_string_equal(f[0].file, "a.gguf");
  assert_string_equal(f[0].name, "a");
  assert_string_equal(f[0].sha256, ""); /* not known yet */
  assert_string_equal(f[1].file, "b.gguf");
  assert_int_equal(f[1].bytes, 3);
  assert_string_equal(f[1].sha256, SHA_ABC); /* from the cache */
  assert_true(free_mb >= 0);
  /* at most max, the first by name */
  assert_int_equal(ag_hold_scan_dir(dir, f, 1, &n, &free_mb), 0);
  assert_int_equal(n, 1);
  assert_string_equal(f[0].file, "a.gguf");
  char gone[1024];
  snprintf(gone, sizeof(gone), "%s/nowhere", dir);
  assert_int_equal(ag_hold_scan_dir(gone, f, 4, &n, &free_mb), -ENOENT);
  assert_int_equal(n, 0);
  assert_true(free_mb < 0);
}

/* ---- the watcher on a loop ------------------------------------------------------------ */

static int stopped;
static void on_stopped(void *arg) {
  (void)arg;
  stopped++;
}

/* Turn the loop until the report shows n files with digests (bounded: 10 s). */
static void run_until_digests(uv_loop_t *loop, ag_hold *h, size_t n, ag_report *r) {
  for (int i = 0; i < 2000; i++) {
    uv_run(loop, UV_RUN_NOWAIT);
    memset(r, 0, sizeof(*r));
    ag_hold_fill_report(h, r);
    size_t known = 0;
    for (size_t k = 0; k < r->n_held; k++) known += r->held[k].sha256[0] != 0;
    if (r->held_known && r->n_held == n && known == n) return;
    usleep(5000);
  }
  fail_msg("the digests were not worked out in time");
}

static void test_watcher(void **state) {
  const char *dir = *state;
  put(dir, "abc.gguf", "abc");
  put(dir, "empty.gguf", "");
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  ag_hold *h;
  assert_int_equal(ag_hold_new(&h, &loop, dir), 0);
  ag_report r;
  memset(&r, 0, sizeof(r));
  ag_hold_fill_report(h, &r);
  assert_string_equal(r.models_dir, dir);
  assert_false(r.held_known); /* nothing looked at yet */
  ag_hold_start(h);
  run_until_digests(&loop, h, 2, &r);
  assert_string_equal(r.held[0].name, "abc");
  assert_string_equal(r.held[0].sha256, SHA_ABC);
  assert_string_equal(r.held[1].sha256, SHA_EMPTY);
  assert_true(r.storage_free_mb >= 0);
  /* kept in the cache file, so a restart reads neither file again */
  uint64_t b;
  int64_t m;
  char hex[65];
  stat_of(dir, "abc.gguf", &b, &m);
  assert_int_equal(ag_hold_cache_lookup(dir, "abc.gguf", b, m, hex), 0);
  assert_string_equal(hex, SHA_ABC);
  /* a file rewritten: its new digest, after a scan */
  put(dir, "abc.gguf", "");
  touch_later(dir, "abc.gguf");
  put(dir, "new.gguf", "abc");
  ag_hold_rescan(h);
  run_until_digests(&loop, h, 3, &r);
  assert_string_equal(r.held[0].name, "abc");
  assert_string_equal(r.held[0].sha256, SHA_EMPTY);
  assert_string_equal(r.held[2].name, "new");
  assert_string_equal(r.held[2].sha256, SHA_ABC);
  stopped = 0;
  ag_hold_stop(h, on_stopped, NULL);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(stopped, 1);
  ag_hold_free(h);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Stopped while a digest runs: it ends at its next chunk and the loop closes. */
static void test_watcher_stops_a_digest(void **state) {
  const char *dir = *state;
  char path[1024];
  snprintf(path, sizeof(path), "%s/large.gguf", dir);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  assert_int_equal(ftruncate(fileno(fp), (off_t)512 << 20), 0); /* 512 MiB, sparse */
  fclose(fp);
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  ag_hold *h;
  assert_int_equal(ag_hold_new(&h, &loop, dir), 0);
  ag_hold_start(h);
  for (int i = 0; i < 20; i++) { /* the scan, then the digest under way */
    uv_run(&loop, UV_RUN_NOWAIT);
    usleep(2000);
  }
  stopped = 0;
  ag_hold_stop(h, on_stopped, NULL);
  uint64_t t0 = uv_hrtime();
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_true(uv_hrtime() - t0 < 5000000000ULL);
  assert_int_equal(stopped, 1);
  ag_hold_free(h);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_rules),
    cmocka_unit_test(test_switch_rule),
    cmocka_unit_test(test_names),
    cmocka_unit_test_setup_teardown(test_digest, setup, teardown),
    cmocka_unit_test_setup_teardown(test_cache, setup, teardown),
    cmocka_unit_test_setup_teardown(test_scan, setup, teardown),
    cmocka_unit_test_setup_teardown(test_watcher, setup, teardown),
    cmocka_unit_test_setup_teardown(test_watcher_stops_a_digest, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
