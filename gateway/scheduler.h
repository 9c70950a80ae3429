/* Scheduling: pick the replica that will *finish* each request soonest.
 * predicted finish = wait for a free slot + uncached prompt tokens / prefill rate
 *                    + expected output tokens / decode rate.
 * A planning pass walks the queue in order (priority class, then arrival) and, for
 * each request, either dispatches it now to a replica with a free slot or lets it wait
 * for a busier replica that still finishes it sooner; a waiting request reserves that
 * replica's next free slot for the rest of the pass, so later requests plan around it.
 * Pure computation: no I/O, no clocks; the caller passes `now`. */
#ifndef GW_SCHEDULER_H
#define GW_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "predict.h"
#include "replica.h"


/* Why a request of a pass waits, when something could have served it now (the status
 * page's queue card, fleetgate_queue_waiting): a free phone, a free slot kept or held, or
 * no usable phone at all. A request waiting only because every usable slot is busy is
 * GW_WAIT_BUSY. */
typedef enum gw_sched_wait {
  GW_WAIT_NONE = 0,   /* dispatched now (or a hedge's plan) */
  GW_WAIT_BUSY,       /* every slot it could take is busy */
  GW_WAIT_FASTER,     /* a phone is free, and a busier one finishes it sooner */
  GW_WAIT_KEPT,       /* the free slots it could take are kept for short work */
  GW_WAIT_HELD,       /* the free slots it could take are held back: left to interactive
                         work (batch), on a phone that failed its last health check, or
                         on a phone its own readings hold back (battery, heat) */
  GW_WAIT_NO_PHONE,   /* no usable phone serves its model with the context it needs */
  GW_WAIT_COUNT
} gw_sched_wait;

/* The reasons' names, as the admin API and the metric give them. */
extern const char *const gw_sched_wait_names[GW_WAIT_COUNT];

typedef struct gw_sched_choice {
  int replica;              /* index into the replica array; -1: no candidate at all */
  int now;                  /* 1: a slot is free, dispatch now; 0: wait */
  double finish_s;          /* predicted seconds from now to the end */
  double service_s;         /* predicted seconds of work once started */
  double prefill_s;         /* predicted seconds until the first token once started */
  int64_t cached_tokens;
  double alt_finish_s;      /* best finish among replicas free now (-1: none) */
  int alt_replica;          /* that replica (-1: none) */
  int wait;                 /* gw_sched_wait: why it waits (now 0 or no replica) */
} gw_sched_choice;


/* How much a wait weighs for long work of svc_s seconds planned beside longer work of
 * longest_s (the longest long work of its model in the pass; each is the request's
 * service on the usable phone quickest for it): longest_s / svc_s, between 1 and max.
 * The longest work plans on plain finish times; shorter long work waits for a busy fast
 * phone only while that beats a free slower phone by more (routing.md, "Waiting for a
 * faster phone"). 1 when svc_s is not positive. */
double gw_sched_wait_weight(double svc_s, double longest_s, double max);

/* The fleet's best for q now, over the replicas that serve its model and fit it: the
 * shortest predicted service (*svc_best, seconds) on a usable one (on any one when none is
 * usable; -1 when none fits), and the earliest predicted finish (wait for a slot +
 * service) on a usable one (*fin_best; -1: none). *guess is set when some usable one has
 * no learned rates: its speed is a seed, so the finish may be far sooner. The queue
 * ahead is left out: the finish is a lower bound (admission: shortest work first and the
 * deadline check). Each phone's prediction is the plan's (gw_predict: its overrun and its
 * device's slowdown). */
void gw_sched_best(gw_replica *const *replicas, size_t nr, const gw_sched_req *q, uint64_t now_ms,
                   double *svc_best, double *fin_best, int *guess);

/* The planner's memory, kept from pass to pass (a pass at thousands of phones would
 * otherwise allocate megabytes each time); one per caller, never shared by two plans at
 * once. */
typedef struct gw_sched gw_sched;
gw_sched *gw_sched_new(void);
void gw_sched_free(gw_sched *s);
/* Models with at most n usable phones are planned by walking every phone (24 by default);
 * larger ones by the search (scheduler.c, "threshold"), which chooses alike. Tests set 0 to
 * search everywhere. */
void gw_sched_walk_max(gw_sched *s, size_t n);

/* Plan n requests (in queue order) over nr replicas at now_ms; fills out[i].
 * Replicas with no capacity (down, draining, cooling) are skipped. */
void gw_sched_plan(gw_replica *const *replicas, size_t nr, const gw_sched_req *reqs, size_t n,
                   uint64_t now_ms, gw_sched_choice *out);
/* The same with the memory of s (gw_sched_plan makes and frees one; s NULL: likewise). */
void gw_sched_plan_with(gw_sched *s, gw_replica *const *replicas, size_t nr, const gw_sched_req *reqs,
                        size_t n, uint64_t now_ms, gw_sched_choice *out);

#endif
