/* Placement on the gateway (docs/placement.md): every `placement.interval_s` it measures
 * the demand per catalogue model (gw_placement_demand: its queue and its arrivals), reads
 * each phone's speed per model and what it holds, asks place.c where each phone should
 * be, and starts the switches: the phone is drained here at once (no new work, its slots
 * counted out), its agent is told in the heartbeat's answer (`place`), and the switch ends
 * when its heartbeats list the new model and say it is ready, or when they say it failed
 * (the phone stays on its model, the pair is barred for `failure_backoff_s`). Events,
 * metrics and the admin API's placements come from here. */
#ifndef GW_PLACEMENT_H
#define GW_PLACEMENT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "gw.h"

/* What a heartbeat said of a switch (its `switch` object); all "" when it said nothing. */
typedef struct gw_place_report {
  char to[65];
  char phase[16];
  char why[320];
} gw_place_report;

/* A switch not finished this long after it began is given up (ms). */
#define GW_PLACE_SWITCH_TIMEOUT_MS (30 * 60 * 1000)

/* Demand of a model over the horizon (requests): its queue plus its arrival rate times
 * horizon_s. The one place demand is measured: capacity advice may swap it. */
double gw_placement_demand(const gw_server *gw, const struct gw_model *m, double horizon_s);
/* The tick: a pass when interval_s has gone by (and the catalogue, and placement, are on). */
void gw_placement_tick(gw_server *gw, uint64_t now_ms);
/* A heartbeat of r was applied (state: its `state`, or NULL; can_switch: its agent says it
 * can switch models), with what it said of a switch. */
void gw_placement_heartbeat(gw_server *gw, gw_replica *r, const char *state, int can_switch,
                            const gw_place_report *rep, uint64_t now_ms);
/* Adds `place` to a heartbeat's answer for r while a switch is asked of it. */
void gw_placement_answer(gw_server *gw, const gw_replica *r, cJSON *reply);
/* A phone that cannot hold its model (an agent's report, state "unfit"): the catalogue
 * model it can hold instead, from its report's MemTotal and free storage (< 0 unknown)
 * and labels (JSON, NULL: none) -- not model, not excluded, one with a url; the one with
 * the most demand, among equals the largest. 1 and its name in pick; 0 none fits; -1
 * placement is off or has no catalogue (nothing to offer). */
int gw_placement_instead(gw_server *gw, const char *model, double mem_total_mb, double storage_free_mb,
                         const char *labels, char *pick, size_t pn);
/* Adds `instead` (the model's url, sha256, size, memory, context, engine arguments) to
 * the answer of such a report. */
void gw_placement_instead_answer(gw_server *gw, const char *model, cJSON *reply);
/* The admin API's view: {"enabled", "models": [...], "phones": [...]}. */
cJSON *gw_placement_json(gw_server *gw);
/* Operators: pin phone id to model (NULL: unpin); exclude a model (or not). Return 0, or
 * -ENOENT (no such phone / model: why says) or -EINVAL. */
int gw_placement_pin(gw_server *gw, const char *id, const char *model, char *why, size_t n);
int gw_placement_exclude(gw_server *gw, const char *model, int exclude, char *why, size_t n);
/* Operators' pins through the admin API kept across restarts: data_dir/placement-pins.json
 * ({"pins": {"replica id": "model"}}), written at each pin or unpin and read at start (a
 * damaged file is logged and read as empty; without data_dir they live in memory only). A
 * replica joining the registry gets its kept pin back (a pin to a model that left the
 * catalogue is dropped, said in the log); one leaving it takes its pin with it, as with
 * admin drains. Open before the registry is first filled; 0 or -ENOMEM. */
#define GW_PLACE_PINS_FILE "placement-pins.json"
#define GW_PLACE_PINS_MAX 4096
int gw_placement_pins_open(gw_server *gw);
void gw_placement_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
void gw_placement_pins_free(gw_server *gw);
/* Prometheus lines: phones per model, switches. */
void gw_placement_metrics(gw_server *gw, pr_buf *out);

#endif
