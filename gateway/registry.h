/* The replica registry: the replicas the gateway knows, from the configuration (main
 * file and replicas_dir) and from agents' heartbeats. Applying a new configuration
 * keeps each surviving replica's object (its leases, learned speed and health) and
 * updates its settings; replicas gone from the config drain and leave once idle. */
#ifndef GW_REGISTRY_H
#define GW_REGISTRY_H

#include <cjson/cJSON.h>

#include "gw.h"

gw_replica *gw_registry_find(gw_server *gw, const char *id);
/* gw_replica_set_strings, and when the models r lists changed, a GW_FLEET_MODELS event
 * (each model's index of its phones follows). Returns 0 or -ENOMEM. */
int gw_registry_set_strings(gw_server *gw, gw_replica *r, const char *url, const char *token,
                            char *const *models, size_t n_models, const char *labels);
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

/* The URL policy refused to connect to r (urlpolicy.h; why: "address 127.0.0.1 refused
 * by upstream.allow_addresses (loopback)"). It cannot be reached as registered, so it is
 * down at once with why as its reason, for the longest cool-down; probes (refused as
 * well, and costing no connection) bring it back only once the policy or its address
 * changed. */
void gw_registry_address_refused(gw_server *gw, gw_replica *r, const char *why);

/* Registrations the gateway refused (a heartbeat whose URL breaks the URL policy, an
 * identity it does not accept...), for the status page and the admin API: the last
 * GW_REFUSED_KEEP, newest first, and counts by reason. */
#define GW_REFUSED_KEEP 32
#define GW_REFUSED_REASONS 16 /* distinct reason codes counted; more count as "_other" */
/* Remember one. id, url and peer (the sender's address) may be NULL and are cut to fit;
 * reason is a code, optionally followed by ": " and details ("url_not_allowed: the URL
 * may not have a query"): the code is the label of
 * fleetgate_registrations_refused_total. Logs nothing (the caller does). */
void gw_registry_note_refused(gw_server *gw, const char *id, const char *url, const char *peer,
                              const char *reason);
/* The remembered refusals as a JSON array, newest first:
 * [{"time_ms", "id", "url", "peer", "reason"}]. */
cJSON *gw_registry_refused_json(const gw_server *gw);
/* The counts by reason code: calls fn once per code seen, in the order first seen. */
void gw_registry_refused_counts(const gw_server *gw,
                                void (*fn)(void *ud, const char *code, uint64_t n), void *ud);
/* Free what note_refused kept (gw_server_free). */
void gw_registry_refused_free(gw_server *gw);

#endif
