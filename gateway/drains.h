/* Admin drains kept across restarts: the ids an admin drained through the API and has
 * not enabled since, written to data_dir/drains.json at each change and read at start,
 * so a restart (a new fleet section, an upgrade) does not put drained phones back to
 * work. A replica that joins the registry (its config at start, or a phone's first
 * heartbeat after the restart) gets its drain back; one that leaves the registry takes
 * its drain with it, as it always did. Without data_dir the drains live only in memory.
 * The set is owned by the gw_server (gw->drains), freed by gw_drains_free. */
#ifndef GW_DRAINS_H
#define GW_DRAINS_H

#include "gw.h"

#define GW_DRAINS_MAX 4096 /* ids kept; more drains still apply, but only until a restart */
#define GW_DRAINS_FILE "drains.json"

/* Read data_dir/drains.json (absent: none) into gw->drains. A damaged file is logged and
 * read as empty; 0, or -ENOMEM. Call before the registry is first filled. */
int gw_drains_open(gw_server *gw);
/* An admin drained (1) or enabled (0) replica id: remember it and write the file. */
void gw_drains_set(gw_server *gw, const char *id, int drained);
/* The set as a fleet subscriber: a replica joining gets its kept drain. */
void gw_drains_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
void gw_drains_free(gw_server *gw);

#endif
