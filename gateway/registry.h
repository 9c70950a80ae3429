/* The replica registry: the replicas the gateway knows, from the configuration (main
 * file and replicas_dir) and from agents' heartbeats. Applying a new configuration
 * keeps each surviving replica's object (its leases, learned speed and health) and
 * updates its settings; replicas gone from the config drain and leave once idle. */
#ifndef GW_REGISTRY_H
#define GW_REGISTRY_H

#include <cjson/cJSON.h>

#include "gw.h"

gw_replica *gw_registry_find(gw_server *gw, const char *id);
/* Take r into the registry (the registry owns it from now on). */
int gw_registry_add(gw_server *gw, gw_replica *r);
/* Bring the registry in line with conf. Fills `changes` (an object) with arrays
 * "added", "removed", "changed" of replica ids. */
int gw_registry_apply(gw_server *gw, const gw_config *conf, cJSON *changes);
/* Drop replicas that were removed and have nothing running, and heartbeat-only
 * replicas silent for long. */
void gw_registry_sweep(gw_server *gw, uint64_t now_ms);
/* Log a state change as an event (and remember it for the status page later). */
void gw_registry_event(gw_server *gw, gw_replica *r, const char *old_state);

#endif
