/* Asking a bare llama-server (a replica without an agent) what it serves: the probes of
 * proto/feat.h, one after the other, once per engine process (again after it was
 * loading), when its /props shows a llama-server. An agent asks its own engine and says
 * so in its status (health.c reads it). */
#ifndef GW_ENGPROBE_H
#define GW_ENGPROBE_H

#include "gw.h"

/* Start asking r (nothing when it is being asked already). Returns 0 or a negative code. */
int gw_engprobe_start(gw_server *gw, gw_replica *r);
/* Forget r's probe (a replica leaving the registry): a fleet subscriber. */
void gw_engprobe_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
/* Cancel every probe (shutdown). */
void gw_engprobe_stop(gw_server *gw);

#endif
