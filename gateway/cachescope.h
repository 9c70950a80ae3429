/* Whose prompts each phone's engine may hold, kept across restarts (docs/security.md,
 * "Tenants' prompts"). A request may reuse a phone's prompt cache only when every prompt
 * the engine may hold came from its own cache scope (pcache.h); a
 * gateway that restarted must not take a phone that holds one key's prompts for an empty
 * one. So each widening of what a phone may hold (none -> a scope, a scope -> several)
 * is appended to data_dir/cache-scopes.log before the request that widens it goes out,
 * and the log is read (and compacted) at start. A phone the log does not know holds
 * "unknown" prompts, reused by nobody, until its engine is seen loading its model again
 * (gw_replica_engine_loading) -- unless the configuration has a single scope, when
 * there is nobody to keep apart. Without data_dir nothing is kept. The store is owned by
 * the gw_server (gw->cachescopes), freed by gw_cachescope_free. */
#ifndef GW_CACHESCOPE_H
#define GW_CACHESCOPE_H

#include "gw.h"

#define GW_CACHESCOPE_FILE "cache-scopes.log"
#define GW_CACHESCOPE_MAX 100000 /* phones remembered; the log's compaction keeps at most these */

/* Read data_dir/cache-scopes.log (absent: nothing known), write it back compacted and
 * open it for appending. A damaged line is skipped and logged. 0, or a negative code. */
int gw_cachescope_open(gw_server *gw);
/* Before r's engine is sent a request: append what it may hold now, when that widened
 * since the last line about it, and make it reach the disk. Returns 0, or a negative code
 * when it could not be written (then nobody may count on what r holds). Phones whose
 * agent keeps scopes apart are not logged: the agent knows. */
int gw_cachescope_note(gw_server *gw, gw_replica *r);
/* The store as a fleet subscriber: a replica joining gets what its engine may hold. */
void gw_cachescope_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
void gw_cachescope_free(gw_server *gw);

#endif
