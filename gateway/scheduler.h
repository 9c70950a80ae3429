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

#include "replica.h"

typedef struct gw_sched_req {
  const char *model;
  int64_t prompt_tokens;
  int64_t max_tokens;       /* the cap that will be sent */
  double expected_out;      /* expected output tokens (<= max_tokens) */
  const uint64_t *blocks;   /* prompt fingerprints */
  size_t n_blocks;
  uint64_t cache_scope;     /* its key's cache scope: it reuses none of another scope's
                               prompts (pcache.h) */
  const gw_replica *avoid;  /* a replica that just failed this request (NULL: none) */
  int batch;                /* batch-class work: it leaves the slots interactive work is
                               likely to want soon (gw_replica_interactive_reserve) free */
  double batch_reserve;     /* ...that share of interactive work's recent peak (the same
                               for every request of a pass) */
  double batch_borrow_s;    /* ...unless it would hold the slot no longer than this */
  int take_free;            /* throughput work (a Batch API line): take a slot free now
                               rather than wait for a busier phone that finishes sooner.
                               Its lines run in prefix-group order, so a phone that reads a
                               prefix cold serves the group's next lines warm; requests
                               that arrive in any order would thrash the phones' caches */
  double explore;           /* a phone whose speed is unknown (gw_replica_unknown) with a
                               free slot takes the request when it is predicted to finish
                               it within (1 + explore) x the best finish, and no more than
                               short_s later: measuring it costs little then (0: never) */
  double short_s;           /* work predicted to hold a slot at most this long is short */
  int short_reserve;        /* work that is not short leaves this many free slots on the
                               model's quick phones (prefill at or above the median of the
                               usable phones serving it) to short work, and at most a
                               quarter of those phones' slots (0: no reserve) */
  double wait_weight_max;   /* long interactive work shorter than the longest of its model
                               among the requests of the pass that have this above 1
                               chooses its phone on wait x weight + service, weight =
                               gw_sched_wait_weight(its best service, the longest's, this);
                               finish_s stays the plain time (0 or 1: plain finish times) */
} gw_sched_req;

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

/* Whether r can serve q at all: serves the model, and the context fits prompt + cap. */
int gw_sched_fits(const gw_replica *r, const gw_sched_req *q);
/* Predicted work on r once started (seconds), and its prefill part; slowdown (>= 1)
 * stretches both (gw_replica_slowdown). */
double gw_sched_service_s(const gw_replica *r, const gw_sched_req *q, double slowdown,
                          double *prefill_s, int64_t *cached);

/* How much a wait weighs for long work of svc_s seconds planned beside longer work of
 * longest_s (the longest long work of its model in the pass; each is the request's
 * service on the usable phone quickest for it): longest_s / svc_s, between 1 and max.
 * The longest work plans on plain finish times; shorter long work waits for a busy fast
 * phone only while that beats a free slower phone by more (routing.md, "Waiting for a
 * faster phone"). 1 when svc_s is not positive. */
double gw_sched_wait_weight(double svc_s, double longest_s, double max);

/* Plan n requests (in queue order) over nr replicas at now_ms; fills out[i].
 * Replicas with no capacity (down, draining, cooling) are skipped. */
void gw_sched_plan(gw_replica *const *replicas, size_t nr, const gw_sched_req *reqs, size_t n,
                   uint64_t now_ms, gw_sched_choice *out);

#endif
