/* The capacity advice's arithmetic: from one model's demand (demand.h), its phones and
 * the classes of phone that could be added, the phones needed to meet its targets now and
 * at the next peak -- interactive waits by Erlang C (M/M/c over the pooled slots) scaled by
 * Allen-Cunneen for the answers' measured variability (G/G/c), reviews
 * within their time, batch work by work over time before batch_by -- with the phones lost
 * to churn while replacements start counted, the cheapest class to add, what the fleet
 * would finish by when, and the idle phones that could go. Each figure says what it rests
 * on. Pure: no I/O, no clocks (tests/unit/test_capacity.c); capsvc.c gathers the inputs.
 * docs/capacity.md writes the formulas down. */
#ifndef GW_CAPACITY_H
#define GW_CAPACITY_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "config.h"
#include "demand.h"

#define GW_CAP_NAME_MAX 64
#define GW_CAP_MAX_ADD 100000 /* phones the advice ever says to add of one class */
/* Batches are planned for this much more work than predicted: the gateway's and the
 * phones' overheads between lines, lines run again (B8 measured a batch 5 % slower than
 * its prediction: docs/benchmarks.md) */
#define GW_CAP_BATCH_SLACK 1.1
/* Shadow requests a check of an answer runs (verify.c: the subject's and a witness's
 * answers at temperature 0, unless the request already was deterministic: then one) */
#define GW_CAP_SHADOWS_PER_CHECK 2
/* Answers measured before their variability (service_scv) replaces Erlang C's exponential
 * (Cs^2 = 1): the sample variance of n exponential times is off by about sqrt(8 / n) of
 * itself, 28 % at 100 */
#define GW_CAP_SCV_MIN_SAMPLES 100
/* Arrivals' squared coefficient of variation: Poisson-like (not measured) */
#define GW_CAP_ARRIVALS_SCV 1.0

/* A kind of phone: one the fleet has (measured), or one of the operator's price table. */
typedef struct gw_cap_class {
  char name[GW_CAP_NAME_MAX];
  double prefill_tps, decode_tps; /* per slot */
  int slots;
  double cost_per_day;
  int in_fleet;                   /* phones of it serve the model now */
  int priced;                     /* from capacity.prices */
} gw_cap_class;

/* One phone serving the model. */
typedef struct gw_cap_phone {
  const char *id;
  double prefill_tps, decode_tps; /* per slot, learned */
  int slots;
  double cost_per_day;
  int usable;                     /* takes work (not down, loading or drained) */
  double idle_s;                  /* since it was last sent a request (or joined) */
} gw_cap_phone;

typedef struct gw_cap_input {
  const char *model;
  gw_targets targets;             /* resolved (gw_config_targets) */
  double confidence;
  gw_demand_rate now[GW_DEMAND_CLASSES];  /* the rate over capacity.window_s */
  gw_demand_rate peak[GW_DEMAND_CLASSES]; /* the busiest hour's (interactive + review) */
  int64_t peak_from_ms;           /* when that hour began (0: no peak known) */
  double expected_out;            /* answer tokens to assume with nothing measured */
  double backlog_lines, backlog_in, backlog_out; /* batch work waiting (tokens: estimates) */
  double batch_deadline_s;        /* seconds until it must be done (< 0: no deadline) */
  const char *batch_deadline_basis;
  double startup_s;               /* a new phone's start-up (joining to ready) */
  const char *startup_basis;
  int vet_checks;                 /* answers verified: the checks a newcomer passes before it
                                     has a record (verify.trust_after), each of which may hold
                                     it out of new work for about one service time; 0: none */
  double gone_per_h;              /* share of phones gone per hour */
  const char *churn_basis;
  double idle_release_s;
  double service_scv;             /* the answers' slot times' squared coefficient of variation,
                                     measured (demand.h), over service_samples answers; under
                                     GW_CAP_SCV_MIN_SAMPLES the waits take 1 (Erlang C) */
  double service_samples;
  /* the arrivals the rate now was read from, per class, and over how long (0: no margin):
   * the rate is planned for at its upper bound at the confidence (gw_cap_rate_margin) */
  double rate_count[GW_DEMAND_CLASSES], rate_span_s[GW_DEMAND_CLASSES];
  /* answers verified (verify.c): each check runs the request again as shadow requests;
   * the interactive load is planned with them (docs/capacity.md "Checks count") */
  double verify_share;            /* trusted phones' checks: at most this share of the work
                                     (verify.budget; 0: answers not verified) */
  double verify_owed_per_s;       /* shadow requests a second still owed by the phones
                                     without a record, spread over the window */
  double verify_new_per_s;        /* ...and by each phone added (a newcomer owes them all) */
  const gw_cap_phone *phones;
  size_t n_phones;
  const gw_cap_class *classes;    /* candidates to add (none: only what the fleet has) */
  size_t n_classes;
} gw_cap_input;

/* The figures the hook, the metrics and the tests read (the JSON says the rest). */
typedef struct gw_cap_result {
  int phones_now;                 /* usable phones serving it */
  double cost_per_day_now;
  int met_now;                    /* the targets are met by the fleet as it stands */
  int add_now, add_peak;          /* phones of `best` to add to meet them now / at the peak,
                                     churn counted (0: none) */
  int add_batch;                  /* ...to finish the batch backlog by its deadline */
  int add;                        /* the most of those: what to rent */
  int release;                    /* idle phones that could go */
  double release_saving_per_day;
  char best[GW_CAP_NAME_MAX];     /* the class to add ("" none) */
  double best_cost_per_day;       /* one phone of it */
  int target_phones;              /* phones_now + add - release */
  double advised_cost_per_day;    /* the fleet's cost per day after the advice */
  double wait_q_s;                /* interactive wait at the confidence as it stands (-1: unbounded) */
  double wait_scale;              /* Allen-Cunneen's (Ca^2 + Cs^2) / 2 the waits were scaled by */
  double batch_finish_s;          /* the backlog done in this long on today's phones (-1: never) */
  int unreachable;                /* a target no number of these phones meets */
  double join_s;                  /* how long a phone added takes to be of use: joining to
                                     ready (measured, or capacity.startup_s) and its first
                                     checks' holds (the churn's join_s) */
} gw_cap_result;

/* Erlang C: the probability that a request waits, c servers, offered load a (erlangs).
 * 1 when a >= c. */
double gw_cap_erlang_c(int c, double a);
/* The wait that a share conf of requests do not exceed: M/M/c, c slots, offered load a,
 * mean service service_s. INFINITY when a >= c. */
double gw_cap_wait_quantile(int c, double a, double service_s, double conf);
/* Allen-Cunneen's scale for G/G/c waits: (ca2 + cs2) / 2, the arrivals' and the service
 * times' squared coefficients of variation (1 and 1: M/M/c, Erlang C itself). */
double gw_cap_ac_scale(double ca2, double cs2);
/* The mean wait, G/G/c by Allen-Cunneen: Erlang C's mean wait C(c, a) S / (c - a) times
 * gw_cap_ac_scale. INFINITY when a >= c. */
double gw_cap_wait_mean_ac(int c, double a, double service_s, double ca2, double cs2);
/* The wait not passed by a share conf, G/G/c: a request waits with probability C(c, a)
 * and, when it does, for an exponential time of mean scale S / (c - a) (M/M/c's, scaled
 * as Allen-Cunneen scales the mean), so gw_cap_wait_quantile times the scale. */
double gw_cap_wait_quantile_ac(int c, double a, double service_s, double conf, double ca2, double cs2);
/* The standard normal's quantile: z with P(Z <= z) = p. */
double gw_cap_normal_quantile(double p);
/* A Poisson rate read as count arrivals in span_s seconds: what its upper bound at conf
 * adds to count / span_s, z(conf) sqrt(count) / span_s (normal approximation; 0 for
 * conf <= 0.5 or nothing counted). */
double gw_cap_rate_margin(double count, double span_s, double conf);
/* The smallest n with P(Poisson(mean) <= n) >= conf. */
int gw_cap_poisson_quantile(double mean, double conf);

/* The advice for one model: *res filled, and its JSON (NULL: out of memory). */
cJSON *gw_capacity_advise(const gw_cap_input *in, gw_cap_result *res);

/* The advice is worked out again every GW_CAP_REFRESH_MS, or, when working it out took
 * took_ms (a fleet serving thousands of models: ~20 us a model), every
 * GW_CAP_REFRESH_SHARE times that, so it never holds more than 1 % of the loop. */
#define GW_CAP_REFRESH_MS 2000u
#define GW_CAP_REFRESH_SHARE 100
uint64_t gw_cap_refresh_gap_ms(double took_ms);

#endif
