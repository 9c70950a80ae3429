/* Active health checks: a small GET per replica every interval (with jitter so phones
 * are not probed in lockstep, and less often while one is down): the agent's status
 * when the replica runs fleetgate-agent, else llama-server's /health, else /v1/models
 * for servers without /health (MNN). `rise` successes bring a replica back (on
 * probation), `fall` failures take it out; 503 "Loading model" means loading. A phone
 * busy in a long prefill still answers its probe, so busy never reads as dead. */
#ifndef GW_HEALTH_H
#define GW_HEALTH_H

#include "gw.h"

/* Start the probes that are due; called from the gateway's tick. */
void gw_health_tick(gw_server *gw, uint64_t now_ms);
/* Cancel every probe in flight (shutdown). */
void gw_health_stop(gw_server *gw);
/* Heartbeat freshness: agents that stopped sending leave rotation. */
void gw_health_heartbeats(gw_server *gw, uint64_t now_ms);

#endif
