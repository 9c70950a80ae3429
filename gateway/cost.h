/* Cost accounting: what the fleet's phones cost (each replica's cost_per_day, accrued
 * every second it is in the registry, whatever its state), the share of it that the
 * requests used (the slot time of their attempts, at each replica's price per slot),
 * by model, by API key and for the fleet, over the last hour and day (ledger.h), and
 * what stayed idle. Shown by the admin API (/admin/v1/costs, the status page) and in
 * /metrics. docs/operations.md ("Costs") gives the arithmetic. gw->cost is owned by the
 * gw_server (made and freed with the metrics, in admin.c). */
#ifndef GW_COST_H
#define GW_COST_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "gw.h"

typedef struct gw_cost gw_cost;

int gw_cost_init(gw_server *gw);
void gw_cost_free(gw_server *gw);

/* Bring the ledger up to now: the fleet's cost since the last call, and the slot time
 * of every request running now (about once a second, and before every reading). */
void gw_cost_tick(gw_server *gw, uint64_t now_ms);
/* An attempt gives its slot back (before gw_replica_release): its last slot time. */
void gw_cost_attempt_end(gw_server *gw, gw_attempt *a);
/* A request ended (a subscriber of gw_jobs_subscribe): counted as served when it was
 * answered whole. */
void gw_cost_on_job_ended(gw_server *gw, const gw_job_ended *ev, void *ud);

/* The /admin/v1/costs object: {"currency", "cost_per_day", "hour": window, "day": window}
 * (docs/operations.md). active_only: only the models and keys with cost or requests in
 * the window (the status page's stream). */
cJSON *gw_cost_json(gw_server *gw, int active_only);
/* The cost series of /metrics (Prometheus text). */
int gw_cost_render(gw_server *gw, pr_buf *out);

#endif
