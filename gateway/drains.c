/* Admin drains kept in data_dir; see drains.h. The file is small (ids only) and written
 * only when an admin drains or enables, so it is written at once: a temporary file, then
 * rename(), never a half-written file. */
#include "drains.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "json.h"
#include "log.h"
#include "privfile.h"
#include "replica.h"

typedef struct gw_drains {
  char *path;  /* data_dir/drains.json; NULL: memory only */
  char **ids;  /* owned */
  size_t n;
} gw_drains;

static int find(const gw_drains *d, const char *id) {
  for (size_t i = 0; i < d->n; i++)
    if (strcmp(d->ids[i], id) == 0) return (int)i;
  return -1;
}

static int add(gw_drains *d, const char *id) {
  if (find(d, id) >= 0) return 0;
  if (d->n >= GW_DRAINS_MAX) return -ENOSPC;
  char **ids = realloc(d->ids, (d->n + 1) * sizeof(*ids));
  if (!ids) return -ENOMEM;
  d->ids = ids;
  if (!(d->ids[d->n] = strdup(id))) return -ENOMEM;
  d->n++;
  return 0;
}

static void drop(gw_drains *d, const char *id) {
  int i = find(d, id);
  if (i < 0) return;
  free(d->ids[i]);
  d->ids[i] = d->ids[--d->n];
}

static void save(const gw_drains *d) {
  if (!d->path) return;
  cJSON *o = cJSON_CreateObject();
  cJSON *arr = cJSON_AddArrayToObject(o, "drained");
  for (size_t i = 0; i < d->n; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(d->ids[i]));
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  int rc = s ? pr_privfile_write(d->path, s, 0) : -ENOMEM;
  if (rc < 0)
    pr_warn("cannot write %s (%s): the admin drains hold until the gateway restarts", d->path,
            strerror(-rc));
  free(s);
}

int gw_drains_open(gw_server *gw) {
  gw_drains *d = calloc(1, sizeof(*d));
  if (!d) return -ENOMEM;
  gw->drains = d;
  const char *dir = gw->conf->data_dir;
  if (!dir) return 0;
  size_t len = strlen(dir) + sizeof(GW_DRAINS_FILE) + 2;
  if (len > 4000 || !(d->path = malloc(len))) return -ENOMEM;
  snprintf(d->path, len, "%s/%s", dir, GW_DRAINS_FILE);
  cJSON *o;
  int rc = gw_datafile_load(d->path, GW_DRAINS_MAX * 140, 8, &o, NULL);
  if (rc == -ENOMEM) return rc;
  if (!rc && !o) return 0; /* none kept yet */
  const cJSON *arr = o ? cJSON_GetObjectItemCaseSensitive(o, "drained") : NULL;
  if (!cJSON_IsArray(arr)) {
    pr_warn("%s is damaged: no admin drain is restored", d->path);
    cJSON_Delete(o);
    return 0;
  }
  const cJSON *it;
  cJSON_ArrayForEach(it, arr) {
    if (cJSON_IsString(it) && it->valuestring[0] && strlen(it->valuestring) < 128 &&
        add(d, it->valuestring) == -ENOMEM) {
      cJSON_Delete(o);
      return -ENOMEM;
    }
  }
  cJSON_Delete(o);
  if (d->n) pr_info("%zu admin drain(s) kept from before the restart (%s)", d->n, d->path);
  return 0;
}

void gw_drains_set(gw_server *gw, const char *id, int drained) {
  gw_drains *d = gw->drains;
  if (!d) return;
  if (drained) {
    if (add(d, id) == -ENOSPC) pr_warn("more than %d admin drains: %s's holds until a restart", GW_DRAINS_MAX, id);
  } else {
    drop(d, id);
  }
  save(d);
}

void gw_drains_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  gw_drains *d = gw->drains;
  if (!d || !ev->r) return;
  if (ev->kind == GW_FLEET_ADDED && find(d, ev->r->id) >= 0) {
    gw_replica_held_set(ev->r, GW_HELD_DRAIN_ADMIN, 1);
  } else if (ev->kind == GW_FLEET_REMOVED && find(d, ev->r->id) >= 0) {
    drop(d, ev->r->id);
    save(d);
  }
}

void gw_drains_free(gw_server *gw) {
  gw_drains *d = gw->drains;
  if (!d) return;
  for (size_t i = 0; i < d->n; i++) free(d->ids[i]);
  free(d->ids);
  free(d->path);
  free(d);
  gw->drains = NULL;
}
