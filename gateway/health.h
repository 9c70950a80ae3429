/* Active health checks: a small GET per replica every interval (with jitter so phones
 * are not probed in lockstep, and less often while one is down): the agent's status
 * when the replica runs fleetgate-agent, else llama-server's /health, else /v1/models
 * for servers without /health (MNN). `rise` successes bring a replica back (on
 * probation), `fall` failures take it out; 503 "Loading model" means loading. A phone
 * busy in a long prefill still answers its probe, so busy never reads as dead. */
#ifndef GW_HEALTH_H
#define GW_HEALTH_H

#include "gw.h"

/* Scheduling. Each replica waits in a heap (gw_server.health_heap) by the earliest moment
 * health has something to do for it: its next probe, the moment its probe in flight turns
 * late, the limit of its heartbeats. One timer fires for the earliest, and each firing
 * visits only the replicas due: the cost is the probes due, not the fleet's size. */

/* The fleet's changes (server.c subscribes it): a replica joins the heap when it joins the
 * registry and leaves it when it leaves; its state changing or a request sent to it
 * (GW_FLEET_SENT: a busy phone is checked more often) moves it in the heap. */
void gw_health_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
/* A heartbeat of r was accepted (heartbeat.c, after its last_heartbeat_ms was set); its
 * agent says running requests are on the phone. Proof of life when that is at least
 * the requests this gateway sent there (docs/health.md, "Proof of life"). */
void gw_health_heartbeat(gw_server *gw, gw_replica *r, int running);
/* The configuration changed (intervals, replicas removed or back): every replica is
 * scheduled again. */
void gw_health_reconfigured(gw_server *gw);
/* What a health check's outcome does to r at now (probe_result's decision, without the
 * events and the next probe's scheduling): ok, or loading (1: the engine is loading; 2: a
 * bare llama-server's own 503 Loading model, a process that just started), else failed
 * with why. fail_threshold failures in a row take a ready phone down; rise passes in a row
 * bring a down one back on probation, once its down_until_ms passed and unless its
 * heartbeats stopped; one pass brings a loading one back. */
void gw_health_verdict(const gw_config *c, gw_replica *r, uint64_t now, int ok, int loading, const char *why);
/* Cancel every probe in flight (shutdown). */
void gw_health_stop(gw_server *gw);
/* Let go of the heap (gw_server_free). */
void gw_health_free(gw_server *gw);

#endif
