/* libFuzzer target: the gateway's config loader (gw_config_load) on a file holding the
 * input, in a private folder with a replicas.d/ beside it. A config is either loaded or
 * refused with at least one "file:line:col: message" line, never both or neither; a
 * loaded one holds only listen addresses the listeners will take and replica URLs that
 * follow the URL rule. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "addr.h"
#include "url.h"
#include "config.h"

static char dir[256], path[300], replica[300];

/* the private folder goes when the run ends */
static void cleanup(void) {
  char sub[300];
  unlink(path);
  unlink(replica);
  snprintf(sub, sizeof(sub), "%s/replicas.d", dir);
  rmdir(sub);
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  snprintf(dir, sizeof(dir), "/tmp/fuzz_config.XXXXXX");
  if (!mkdtemp(dir)) abort();
  snprintf(path, sizeof(path), "%s/fleetgate.json", dir);
  char sub[300];
  snprintf(sub, sizeof(sub), "%s/replicas.d", dir);
  mkdir(sub, 0700);
  snprintf(replica, sizeof(replica), "%s/replicas.d/pixel-02.json", dir);
  atexit(cleanup);
  FILE *f = fopen(replica, "w");
  if (!f) abort();
  fputs("{\"id\": \"pixel-02\", \"url\": \"https://127.0.0.1:9\", \"models\": [\"m\"], \"slots\": 2}\n", f);
  fclose(f);
  /* variables configs may name, long enough to be accepted, so those paths are reached too */
  setenv("FLEETGATE_FLEET_SECRET", "fuzz-fleet-secret-16", 1);
  setenv("PIXEL01_TOKEN", "fuzz-token", 1);
  setenv("FLEETGATE_ADMIN_TOKEN", "fuzz-admin-token-16", 1);
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
    struct sockaddr_storage ss;
    for (size_t i = 0; i < c->n_listen; i++)
      if (pr_addr_parse(c->listen[i].address, &ss, NULL) < 0) abort();
    if (c->admin_listen && pr_addr_parse(c->admin_listen, &ss, NULL) < 0) abort();
    /* every replica URL loaded follows the URL rule (url.h) */
    for (size_t i = 0; i < c->n_replicas; i++)
      if (pr_url_base_check(c->replicas[i].url, c->allow_http, NULL, NULL) < 0) abort();
    gw_config_unref(c);
  } else {
    if (c || rc > 0 || errors.len == 0) abort();
  }
  pr_buf_free(&errors);
  return 0;
}
