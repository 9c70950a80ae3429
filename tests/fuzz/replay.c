/* A main for the libFuzzer targets without libFuzzer: it calls the target's
 * LLVMFuzzerInitialize (when it has one), then LLVMFuzzerTestOneInput once per file, for
 * each file named and each file in each folder named (in name order). Built with any
 * compiler, so `meson test --suite unit` replays tests/fuzz/regressions/ through the
 * targets' own entry points under gcc, valgrind and the sanitizer builds alike. A target
 * aborts when a property it checks fails; no input at all is a failure too (a replay of
 * nothing would pass for ever). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

/* Feed one file, from a buffer of exactly its size (so a read past it is caught). */
static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t cap = 4096, len = 0;
  uint8_t *buf = malloc(cap);
  size_t n;
  while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
    len += n;
    if (len == cap) {
      uint8_t *grown = realloc(buf, cap *= 2);
      if (!grown) free(buf);
      buf = grown;
    }
  }
  fclose(f);
  if (!buf) {
    fprintf(stderr, "replay: %s: out of memory\n", path);
    return -1;
  }
  uint8_t *exact = malloc(len ? len : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, len);
  free(buf);
  fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
  LLVMFuzzerTestOneInput(exact, len);
  free(exact);
  return 0;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file in dir, in name order (README.md and dot files left out); returns
 * how many were fed, or -1. */
static int replay_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.' || strcmp(de->d_name, "README.md") == 0) continue;
    if (n == cap) {
      char **grown = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof(*names));
      if (!grown) break;
      names = grown;
    }
    names[n++] = strdup(de->d_name);
  }
  closedir(d);
  if (n) qsort(names, n, sizeof(*names), cmp_name);
  int fed = 0;
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    free(names[i]);
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      if (replay_file(path) < 0) fed = -1;
      else if (fed >= 0) fed++;
    }
  }
  free(names);
  return fed;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
    return 2;
  }
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  int total = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    int fed;
    if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) fed = replay_dir(argv[i]);
    else fed = replay_file(argv[i]) < 0 ? -1 : 1;
    if (fed < 0) return 1;
    total += fed;
  }
  if (total == 0) {
    fprintf(stderr, "replay: no input found\n");
    return 1;
  }
  fprintf(stderr, "replay: %d input(s), no finding\n", total);
  return 0;
}
