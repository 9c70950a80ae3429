/* The models: every model the fleet serves (some replica lists it) or is configured to
 * serve (the config's `models`), each with what is per model: its waiting requests'
 * count (queue.max), the answer lengths learned for it (outlen.h), when short work for it
 * last came (scheduler.short_reserve), and an index of its phones, kept from fleet events
 * (a replica added, leaving, changing state or its models) rather than found by scanning
 * every replica. A job holds its model (gw_model_ref) from admission to its end.
 *
 * A model that is neither configured, nor served, nor held by a job is kept for what it
 * learned while it stays among the GW_MODELS_IDLE most recently used such models (a phone
 * that leaves and comes back finds its model's answer lengths), then let go. No libuv; the
 * caller passes the time. */
#ifndef GW_MODEL_H
#define GW_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "outlen.h"
#include "replica.h"

#define GW_MODELS_IDLE 64 /* models kept for what they learned while nothing refers to them */

/* Work that came: its slot-seconds and its count, each decayed with a time constant, since
 * the first at first_ms (gw_load_note, gw_load_read). */
typedef struct gw_load {
  double work_s, n;
  uint64_t first_ms, upd_ms;
} gw_load;

/* Work of service_s started now. */
void gw_load_note(gw_load *l, double service_s, double tau_s, uint64_t now_ms);
/* The offered load over the last tau_s (*erlangs: slot-seconds per second; a steady rate
 * of such work reads as rate x mean service from its first on, read over at least min_s) and the mean service
 * (*mean_s). Returns 0, or -1 when nothing was measured yet. */
int gw_load_read(const gw_load *l, uint64_t now_ms, double tau_s, double min_s, double *erlangs,
                 double *mean_s);

typedef struct gw_model {
  char *name;
  int configured;         /* named in the config's `models` */
  size_t queued;          /* requests waiting for it, both classes (job.c keeps the count) */
  gw_outlen lengths;      /* answer lengths learned for it, by cap (outlen.h) */
  uint64_t short_ms;      /* when short work for it was last planned (0: never) */
  gw_load short_load;     /* the short work that came: short on the quickest phone, wherever
                             it went (gw_model_short_note; its rate: short_rate) */
  gw_load load;           /* all its interactive work (gw_model_load_note) */
  gw_replica **phones;    /* the replicas that list it, in the registry's order (owned array,
                             borrowed replicas) */
  size_t n_phones, cap_phones;
  uint64_t gen;           /* bumped whenever its phones change: one joins, leaves, changes
                             state or drains */
  unsigned refs;          /* jobs holding it */
  uint64_t arrivals;      /* requests admitted for it since start (gw_model_ref): placement
                             reads its demand from these and `queued` */
  uint64_t used_ms;       /* last looked up or learned from: the idle ones kept are the
                             most recently used */
  /* placement's (placement.c): demand measured from arrivals and the queue, the sizes of
   * its requests, what the last pass found, switches to it, an operator's exclusion */
  double arr_rate;        /* arrivals a second, a moving average */
  uint64_t arr_seen, arr_ms; /* arrivals and the time at its last pass */
  uint64_t asked_ms;      /* when a request for it last came (0: never) */
  double avg_prompt, avg_out; /* tokens of its answered requests, moving averages (0: none) */
  double place_demand, place_capacity, place_load;
  int place_exclude;      /* -1: as the config says; 0, 1: the admin API's */
  uint64_t switches[3];   /* switches to it: started, done, failed */
  /* one planning pass's bookkeeping (job.c plan_window) */
  uint64_t pass;
  size_t window, taken;
} gw_model;

typedef struct gw_models {
  gw_model **m;           /* sorted by name (owned) */
  size_t n, cap;
  double all_lengths;     /* the average answer length over every model (outlen.h) */
} gw_models;

gw_model *gw_models_find(const gw_models *ms, const char *name);
/* The model named so, made when missing (not configured, no phones yet). NULL: out of memory. */
gw_model *gw_models_get(gw_models *ms, const char *name, uint64_t now_ms);
/* Exactly these models are configured now (a reload may name others). Returns 0 or -ENOMEM. */
int gw_models_configure(gw_models *ms, char *const *names, size_t n, uint64_t now_ms);
/* r joined the registry (or its models changed: it is taken out of the models it no longer
 * lists and put into those it lists now). Phones keep the order of their reg_seq. Returns 0
 * or -ENOMEM. */
int gw_models_replica_sync(gw_models *ms, gw_replica *r, uint64_t now_ms);
/* r leaves the registry: out of every model. */
void gw_models_replica_gone(gw_models *ms, gw_replica *r);
/* Something about r that plans read changed (its state, a drain): its models' gen moves. */
void gw_models_replica_changed(gw_models *ms, const gw_replica *r);
/* Whether some replica lists the model, or the config names it. */
int gw_model_known(const gw_model *m);
void gw_model_ref(gw_model *m);
/* Let go of a job's hold; the model may be freed by the next gw_models_trim. */
void gw_model_unref(gw_model *m);
/* Short work for m started now and is predicted to hold a quick phone's slot service_s
 * (its arrival rate and service time, decayed with the time constant tau_s). */
void gw_model_short_note(gw_model *m, double service_s, double tau_s, uint64_t now_ms);
/* The slots that keep a short request's wait for one of them beyond wait_s under the
 * probability p, by the short work m had over the last tau_s (its offered load a = rate x
 * mean service: the least k with ErlangC(k, a) x exp(-(k - a) x wait_s / service) <= p),
 * at least 1 and at most max; max when nothing has been measured yet, or p is 0 (a fixed
 * number). scheduler.short_reserve's kept slots (routing.md). */
int gw_model_short_slots(const gw_model *m, uint64_t now_ms, double tau_s, double wait_s, double p, int max);
/* Short work's arrivals per second for m over the last tau_s (0 when none was measured):
 * how likely one comes before a quick slot frees. */
double gw_model_short_rate(const gw_model *m, uint64_t now_ms, double tau_s);
/* The least k (>= 1) of servers with the probability that a request waits beyond wait_s
 * at most p, offered load a erlangs of mean service svc_s (M/M/k: Erlang C); max when
 * none up to max is. */
int gw_short_slots_for(double a, double svc_s, double wait_s, double p, int max);

/* Free models nothing refers to beyond the GW_MODELS_IDLE most recently used of them. */
void gw_models_trim(gw_models *ms);
void gw_models_free(gw_models *ms);

/* The answer length to plan a request for m (NULL: a model not known) with this cap on,
 * and an answer of n tokens to learn (gw_outlen_expect, gw_outlen_learn). */
double gw_model_expect_out(const gw_models *ms, const gw_model *m, int64_t cap, double fallback);
void gw_model_learn_out(gw_models *ms, gw_model *m, int64_t cap, double n, uint64_t now_ms);

#endif
