/* One prediction: how long a request takes on a replica, in one place for every reader —
 * admission (shortest work first, the deadline check), the planner, hedges, moves off a
 * slow phone, the watchdog's limits and the admin API. A phone is planned at its learned
 * rates stretched by its slowdown, which is the worst overrun of its running requests
 * (gw_replica_slowdown) times its device's (gw_replica_device_slowdown: a hot or
 * clock-capped phone); the prompt tokens its prefix cache holds for the request's cache
 * scope are not read again (pcache.h); a running request's remaining time follows its
 * phone's progress report. docs/routing.md section 3 writes the same formulas down.
 * Pure: no I/O, no clocks; the caller passes the time. */
#ifndef GW_PREDICT_H
#define GW_PREDICT_H

#include <stddef.h>
#include <stdint.h>

#include "replica.h"

/* A request as predictions and plans read it (gw_sched_plan takes them in queue order;
 * job.c fills them in one constructor, job_sched_req). */
typedef struct gw_sched_req {
  const char *model;
  int64_t prompt_tokens;
  int64_t max_tokens;       /* the cap that will be sent */
  double expected_out;      /* expected output tokens (<= max_tokens) */
  const uint64_t *blocks;   /* prompt fingerprints */
  size_t n_blocks;
  int64_t user_at;          /* a chat's last user turn and fingerprints (pr_oai_req's): what a */
  uint64_t user_fp, full_fp; /* hybrid engine's checkpoints serve (pcache.h gw_pquery); 0: none */
  uint64_t cache_scope;     /* its key's cache scope: it reuses none of another scope's
                               prompts (pcache.h) */
  const gw_replica *avoid;  /* a replica that just failed this request (NULL: none) */
  unsigned needs;           /* engine features (proto/feat.h) a phone must serve to take it:
                               PR_FEAT_CONTINUE to go on with a thinking answer, ... */
  int choices;              /* "n": the choices it asks, each on a slot of the same phone
                               (0 or 1: one) */
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
  double start_by_s;        /* it must start within this many seconds (its deadline in the
                               queue; a stream continuing on another phone waits in silence
                               for at most upstream.stream_idle_timeout_s): when the phone
                               it would wait for frees later than that, it is planned again
                               among the phones that start it in time, kept slots open to
                               it (0: no limit) */
  double explore;           /* a phone whose speed is unknown (gw_replica_unknown) with a
                               free slot takes the request when it is predicted to finish
                               it within (1 + explore) x the best finish, and no more than
                               short_s later: measuring it costs little then (0: never) */
  double short_s;           /* work predicted to hold a slot at most this long is short */
  int short_reserve;        /* work that is not short leaves this many free slots on the
                               model's quick phones (prefill at or above the median of the
                               usable phones serving it) to short work, and at most a
                               quarter of those phones' slots (0: no reserve) */
  double short_rate;        /* short work's arrivals per second for the model lately (0: not
                               known: kept slots stay kept) */
  double short_wait_p;      /* the chance of a wait over short_s the kept slots are sized
                               to: a free kept slot is left to longer work when short work
                               is no likelier than this to come before the next quick slot
                               busy with longer work frees, less short_s (scheduler.c,
                               short_kept; 0: kept slots stay kept) */
  double wait_weight_max;   /* long interactive work shorter than the longest of its model
                               among the requests of the pass that have this above 1
                               chooses its phone on wait x weight + service, weight =
                               gw_sched_wait_weight(its best service, the longest's, this);
                               finish_s stays the plain time (0 or 1: plain finish times) */
  int fill_idle;            /* long interactive work planned to wait for a busy phone may
                               be taken by a phone left idle by the pass, when the phones
                               faster for it cannot clear the work waiting for them and
                               the work that comes (load_erlangs) before the idle phone
                               would finish it (scheduler.c, "the queue as a whole") */
  double load_erlangs;      /* its model's interactive work lately: slot-seconds of work
                               planned per second (0: none measured) */
} gw_sched_req;

/* What r would do with q at now. */
typedef struct gw_prediction {
  int fits;           /* r serves q's model and its context holds prompt + cap */
  int capacity;       /* slots r may use now (0: it takes no work now) */
  double slowdown;    /* the stretch of its learned rates (>= 1) */
  int64_t cached;     /* prompt tokens found in its prefix cache */
  double prefill_s;   /* seconds until the first token, once started */
  double service_s;   /* seconds of work, once started */
  double wait_s;      /* seconds until a usable slot frees (0: one is free; -1: none) */
  double finish_s;    /* wait + service (-1: no usable slot) */
} gw_prediction;

/* Whether r can serve q at all: serves the model and the features q needs (its choices
 * included), and the context fits prompt + cap. */
int gw_predict_fits(const gw_replica *r, const gw_sched_req *q);
/* How much slower than its learned rates r is planned now: its overrun times its device's. */
double gw_predict_slowdown(const gw_replica *r, uint64_t now_ms);
/* Predicted work on r once started (seconds), its prefill part and the tokens found
 * cached, at a slowdown the caller worked out (gw_predict_slowdown; the planner works it
 * out once per phone and pass). */
double gw_predict_service_s(const gw_replica *r, const gw_sched_req *q, double slowdown,
                            double *prefill_s, int64_t *cached);
/* The same when the tokens its prefix cache holds for q are known already (the planner
 * knows a phone holds none of a request's first block). */
double gw_predict_service_cached_s(const gw_replica *r, const gw_sched_req *q, double slowdown,
                                   int64_t cached_tokens, double *prefill_s, int64_t *cached);
/* ...and its formula, on a phone's rates (the planner keeps them beside its own state). */
double gw_predict_service_rates_s(double prefill_tps, double decode_tps, const gw_sched_req *q,
                                  double slowdown, int64_t cached_tokens, double *prefill_s,
                                  int64_t *cached);
/* Everything at once. */
gw_prediction gw_predict(const gw_replica *r, const gw_sched_req *q, uint64_t now_ms);

/* What an agent last reported about one request on its phone (job.c jobs_progress). Allocated
 * with the first report: most attempts never get one. Unknown: < 0. */
typedef struct gw_progress {
  int64_t prompt_tokens, prompt_done, decoded;
  double prefill_tps, decode_tps;   /* wall-clock tokens/s */
} gw_progress;

/* Seconds a running request still needs on its phone at the pace its progress report p
 * says: the prompt left at the reported prefill pace, then the expected answer (expected_out,
 * at most max_tokens) less what was decoded, at least one token, at the reported decode pace,
 * or when none is reported at planned_decode_tps slowed as the prefill was
 * (p->prefill_tps / planned_prefill_tps). */
double gw_predict_remaining_s(const gw_progress *p, int64_t max_tokens, double expected_out,
                              double planned_prefill_tps, double planned_decode_tps);

#endif
