/* The capacity advice as a service of the gateway: it measures the demand (every request
 * that ends, demand.h) and the fleet's churn (fleet events), keeps them in
 * data_dir/demand.json across restarts (written on libuv's thread pool once a minute, and
 * at the end), works the advice out every few seconds from each model's phones, targets
 * and batch backlog (capacity.h), serves it (GET /admin/v1/capacity, POST
 * /admin/v1/capacity/what-if, the status page, /metrics), and runs the operator's scale
 * hook when it changes, rate-limited and within its spending cap. docs/capacity.md. */
#ifndef GW_CAPSVC_H
#define GW_CAPSVC_H

#include <cjson/cJSON.h>

#include "buf.h"
#include "demand.h"
#include "gw.h"

typedef struct gw_capsvc gw_capsvc;

/* After data_dir's other state is open: reads demand.json, starts the timer. 0 or -ENOMEM. */
int gw_capsvc_init(gw_server *gw);
/* Shutdown: the timer stops, the hook's child is let go. */
void gw_capsvc_shutdown(gw_server *gw);
/* After the loop: the history written (synchronously), everything freed. */
void gw_capsvc_free(gw_server *gw);

/* Fleet events: phones join, get ready, are sent work and leave. */
void gw_capsvc_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
/* A request reaches the queue (job.c): counted in its model's demand, with its prompt's
 * estimated tokens; and when it ends (beside the cost ledger) its answer's tokens. */
void gw_capsvc_job_demand(gw_server *gw, const gw_job *j, int ended);
/* ...the end as a subscriber of ended requests (gw_jobs_subscribe). */
void gw_capsvc_on_job_ended(gw_server *gw, const gw_job_ended *ev, void *ud);

/* The measured demand, for any module (model placement reads it per gw_model); NULL
 * before init. */
const gw_demand *gw_capsvc_demand(const gw_server *gw);
/* One model's demand of the classes in mask over the last window_s (the figures of
 * gw_demand_window). -ENOENT: nothing measured for it. */
int gw_model_demand(const gw_server *gw, const gw_model *m, unsigned mask, double window_s,
                    gw_demand_rate *out);

/* The advice now (GET /admin/v1/capacity). */
cJSON *gw_capsvc_json(gw_server *gw);
/* The advice for a plan (POST /admin/v1/capacity/what-if): NULL with *status and the error
 * (OpenAI's body) in err when the plan is not understood. */
cJSON *gw_capsvc_what_if(gw_server *gw, const char *body, size_t len, int *status, pr_buf *err);
/* The page's panel: each model's advice in short. */
cJSON *gw_capsvc_summary(gw_server *gw);
/* The fleetgate_capacity_* series of /metrics. */
int gw_capsvc_render(gw_server *gw, pr_buf *out);

#endif
