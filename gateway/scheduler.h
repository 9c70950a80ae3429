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

typedef struct gw_sched_choice {
  int replica;              /* index into the replica array; -1: no candidate at all */
  int now;                  /* 1: a slot is free, dispatch now; 0: wait */
  double finish_s;          /* predicted seconds from now to the end */
  double service_s;         /* predicted seconds of work once started */
  double prefill_s;         /* predicted seconds until the first token once started */
  int64_t cached_tokens;
  double alt_finish_s;      /* best finish among replicas free now (-1: none) */
  int alt_replica;          /* that replica (-1: none) */
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

/* The fleet's best for q now, over the replicas that serve its model and fit it: the
 * shortest predicted service (*svc_best, seconds) on a usable one (on any one when none is
 * usable; -1 when none fits), and the earliest predicted finish (wait for a slot +
 * service) on a usable one (*fin_best; -1: none). *guess is set when some usable one has
 * no learned rates: its speed is a seed, so the finish may be far sooner. The queue
 * ahead is left out: the finish is a lower bound (admission: shortest work first and the
 * deadline check). */
void gw_sched_best(gw_replica *const *replicas, size_t nr, const gw_sched_req *q, uint64_t now_ms,
                   double *svc_best, double *fin_best, int *guess);

/* Plan n requests (in queue order) over nr replicas at now_ms; fills out[i].
 * Replicas with no capacity (down, draining, cooling) are skipped. */
void gw_sched_plan(gw_replica *const *replicas, size_t nr, const gw_sched_req *reqs, size_t n,
                   uint64_t now_ms, gw_sched_choice *out);

#endif
