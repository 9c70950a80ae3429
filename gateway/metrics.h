/* The gateway's own numbers: counters and histograms of finished requests, failed
 * attempts and reloads; a ring of 10-second samples (the status page's charts and
 * rates over the last hour); and their Prometheus text rendering together with gauges
 * read from the registry and the queue at scrape time. No I/O: admin.c serves it and
 * drives the sampling. The gw_metrics is owned by the gw_server (gw->metrics). */
#ifndef GW_METRICS_H
#define GW_METRICS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "gw.h"

#define GW_METRICS_SAMPLE_MS 10000 /* one chart point every 10 s */
#define GW_METRICS_SAMPLES 360     /* an hour of them */

gw_metrics *gw_metrics_new(uint64_t now_ms);
void gw_metrics_free(gw_metrics *m);

/* Hooks, one call each where the event happens; all accept gw->metrics == NULL. */
/* an ended request (a subscriber of gw_jobs_subscribe): its series, histograms, failovers,
 * refusals and a clamped usage */
void gw_metrics_on_job_ended(gw_server *gw, const gw_job_ended *ev, void *ud);
void gw_metrics_attempt_failed(gw_server *gw, gw_fail_kind kind);      /* every failed attempt */
void gw_metrics_retry(gw_server *gw, gw_fail_kind kind);               /* a failed job requeued */
void gw_metrics_refusal_check(gw_server *gw); /* an ambiguous refusal asked of another phone */
void gw_metrics_deadline_unreachable(gw_server *gw); /* a 503 deadline_unreachable */
void gw_metrics_cache_isolated(gw_server *gw); /* an attempt sent uncached, to keep scopes apart */
typedef enum { GW_HEDGE_STARTED = 0, GW_HEDGE_WON, GW_HEDGE_WASTED, GW_HEDGE_OUTCOMES } gw_hedge_outcome;
void gw_metrics_hedge(gw_server *gw, gw_hedge_outcome o); /* a hedge started, won or was wasted */
void gw_metrics_slot_seconds(gw_server *gw, double s, int hedge); /* an attempt let go of its slot */
void gw_metrics_reload(gw_server *gw, int ok);                         /* a reload applied/refused */
void gw_metrics_plan_pass(gw_server *gw, double seconds); /* a planning pass that found work */

/* Take a sample when the last is GW_METRICS_SAMPLE_MS old (call about once a second). */
void gw_metrics_tick(gw_server *gw, uint64_t now_ms);
/* Samples taken since start (grows by one every GW_METRICS_SAMPLE_MS). */
uint64_t gw_metrics_sample_count(const gw_server *gw);

/* The fleet as the status page counts it: every replica in exactly one of these. */
typedef struct gw_fleet_counts {
  size_t ready, busy, loading, down, draining, total;
  int slots_total, slots_busy;
  double cost_per_day;
} gw_fleet_counts;
void gw_metrics_fleet_counts(const gw_server *gw, gw_fleet_counts *out);
/* "ready", "busy", "loading", "down" or "draining". */
const char *gw_metrics_replica_category(const gw_replica *r);

/* Rates over about the last minute: requests/s, tokens (in + out)/s, and the share of
 * requests that failed (5xx or 429) among those finished. */
void gw_metrics_rates(const gw_server *gw, uint64_t now_ms, double *req_s, double *tok_s,
                      double *error_rate);
/* The last hour's samples as {"interval_s", "t": [...], "req_s": [...], "tok_s": [...],
 * "queue": [...], "busy": [...]} (t in ms since the epoch). */
cJSON *gw_metrics_series_json(const gw_server *gw);

/* The queue: {"depth", "oldest_wait_s", "interactive", "batch",
 * "models": [{"model", "depth", "oldest_wait_s"}]}. */
cJSON *gw_metrics_queue_json(const gw_server *gw);

/* Append the Prometheus text exposition (format 0.0.4) to out. */
int gw_metrics_render(gw_server *gw, pr_buf *out);

#endif
