/* libFuzzer target: the gateway's config loader (gw_config_load) on a file holding the
 * input, in a private folder with a replicas.d/ beside it. A config is either loaded or
 * refused with at least one "file:line:col: message" line, never both or neither. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"

static char dir[256], path[300];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  snprintf(dir, sizeof(dir), "/tmp/fuzz_config.XXXXXX");
  if (!mkdtemp(dir)) abort();
  snprintf(path, sizeof(path), "%s/fleetgate.json", dir);
  char sub[300];
  snprintf(sub, sizeof(sub), "%s/replicas.d", dir);
  mkdir(sub, 0700);
  snprintf(sub, sizeof(sub), "%s/replicas.d/pixel-02.json", dir);
  FILE *f = fopen(sub, "w");
  if (!f) abort();
  fputs("{\"id\": \"pixel-02\", \"url\": \"http://127.0.0.1:9\", \"models\": [\"m\"], \"slots\": 2}\n", f);
  fclose(f);
  /* variables configs may name, so those paths are reached too */
  setenv("FLEETGATE_FLEET_SECRET", "fuzz-secret", 1);
  setenv("PIXEL01_TOKEN", "fuzz-token", 1);
  setenv("FLEETGATE_ADMIN_TOKEN", "fuzz-admin", 1);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  gw_config *c = NULL;
  pr_buf errors;
  pr_buf_init(&errors, 1 << 20);
  int rc = gw_config_load(path, &c, &errors);
  if (rc == 0) {
    if (!c) abort();
    gw_config_unref(c);
  } else {
    if (c || rc > 0 || errors.len == 0) abort();
  }
  pr_buf_free(&errors);
  return 0;
}
