/* Demand and supply as measured: what each model was asked for (arrivals, prompt tokens
 * and answer tokens, by class: interactive, review, batch) and how long its answers held a
 * slot (their count, sum and sum of squares: the mean service time and its squared
 * coefficient of variation) in bounded time buckets -- 10 s
 * buckets for the last hour, hour buckets for the last week -- and the fleet's churn: when
 * each phone joined, was first ready to take work and left, for how long phones stay, the
 * share gone per hour and how long a new phone takes from joining to ready. Times are wall-clock Unix
 * milliseconds passed by the caller (the figures outlive restarts: gw_demand_to_json and
 * gw_demand_from_json, which capsvc.c keeps in data_dir/demand.json). Pure: no I/O, no
 * clocks (tests/unit/test_demand.c). Any module may read the figures of a model
 * (gw_demand_rate, gw_demand_peak); docs/capacity.md says how the advice uses them. */
#ifndef GW_DEMAND_H
#define GW_DEMAND_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

typedef enum {
  GW_DEMAND_INTERACTIVE = 0, /* interactive, a prompt under capacity.review_prompt_tokens */
  GW_DEMAND_REVIEW,          /* interactive, a long prompt */
  GW_DEMAND_BATCH,           /* the batch class (x-fleetgate-priority, a key's, Batch API lines) */
  GW_DEMAND_CLASSES
} gw_demand_class;

#define GW_DEMAND_FINE_MS 10000u     /* fine buckets: 10 s... */
#define GW_DEMAND_FINE 360           /* ...for the last hour */
#define GW_DEMAND_HOUR_MS 3600000u   /* hour buckets... */
#define GW_DEMAND_HOURS 168          /* ...for the last week */
#define GW_DEMAND_MAX_MODELS 64      /* more models are not measured (counted in dropped) */
#define GW_DEMAND_SESSIONS 8192      /* phones' stays remembered (the oldest go first) */
#define GW_DEMAND_ID_MAX 128

const char *gw_demand_class_name(gw_demand_class c);
/* 1 class bit per class: the classes a reading adds up */
#define GW_DEMAND_MASK(c) (1u << (c))
#define GW_DEMAND_ALL 7u

typedef struct gw_demand gw_demand;

/* A rate over a span: arrivals and tokens per second, and per request. */
typedef struct gw_demand_rate {
  double arrivals_per_s, tok_in_per_s, tok_out_per_s;
  double mean_in, mean_out; /* tokens per request (0: no request) */
  double requests;          /* requests counted */
  double ended;             /* of them, answered (mean_out is over these) */
  double span_s;            /* seconds the figures cover */
  int64_t from_ms;          /* where the span begins */
  double served;            /* answers whose slot time was measured */
  double service_s;         /* their mean slot time (0: none) */
  double service_scv;       /* its squared coefficient of variation, variance / mean^2 (the
                               sample variance, n - 1; 0 with fewer than 2 answers) */
} gw_demand_rate;

/* The fleet's churn over the last week. */
typedef struct gw_churn {
  size_t phones_now;        /* stays not ended */
  size_t departures;        /* stays ended in the week */
  double phone_hours;       /* hours phones were present in the week */
  double gone_per_h;        /* departures / phone_hours: the share of phones gone per hour */
  double mean_stay_h;       /* phone_hours / departures (-1: no departure yet) */
  double startup_s;         /* median from joining to first ready (-1: none measured) */
  size_t startup_samples;
} gw_churn;

gw_demand *gw_demand_new(int64_t now_ms);
void gw_demand_free(gw_demand *d);

/* arrivals requests of model in class c that arrived at at_ms, with tokens (a request
 * is counted when it arrives, with its prompt's estimate, and its answer's tokens are
 * added to the same bucket, with arrivals 0, when it ends). Returns 0, or -ENOSPC when
 * GW_DEMAND_MAX_MODELS other models are measured already, -ENOMEM. */
int gw_demand_record(gw_demand *d, const char *model, gw_demand_class c, int64_t at_ms,
                     double arrivals, double tok_in, double tok_out);
/* The same with the answered count apart (gw_demand_record: as many as arrived). */
int gw_demand_record_ended(gw_demand *d, const char *model, gw_demand_class c, int64_t at_ms,
                           double arrivals, double tok_in, double ended, double tok_out);
/* An answer of model in class c, to a request that arrived at at_ms, held its phone's
 * slot for service_s seconds (from the attempt's start to its end). Returns as
 * gw_demand_record does; a negative or non-finite time is not counted (-EINVAL). */
int gw_demand_record_service(gw_demand *d, const char *model, gw_demand_class c, int64_t at_ms,
                             double service_s);
/* The rate of model's requests of the classes in mask over the last window_s seconds (at
 * most an hour: the fine buckets), or since the figures began when that is later. A model
 * not measured: zeros (returns -ENOENT). */
int gw_demand_window(const gw_demand *d, const char *model, unsigned mask, int64_t now_ms,
                   double window_s, gw_demand_rate *out);
/* The arrival rate now, for a load that may have grown within the window: from the newest
 * two fine buckets (the one running and the one before it), extended one bucket back at a
 * time while that bucket's arrivals are not fewer than the rate so far predicts for it by
 * more than z standard deviations (Poisson): a step up in the load (or its start, after a
 * quiet spell) ends the span there, noise does not. out holds the span's from_ms, span_s,
 * requests and arrivals_per_s; never before window_s ago (the oldest bucket as
 * gw_demand_window takes it). A load that fell reads over the whole window (the older,
 * busier buckets extend it). -ENOENT: the model is not measured. */
int gw_demand_recent(const gw_demand *d, const char *model, unsigned mask, int64_t now_ms,
                     double window_s, double z, gw_demand_rate *out);
/* The busiest whole hour of the last week for model's classes in mask (by arrivals; the
 * hour now running counts at its rate so far once 10 minutes of it have passed). -ENOENT:
 * nothing measured. */
int gw_demand_peak(const gw_demand *d, const char *model, unsigned mask, int64_t now_ms,
                   gw_demand_rate *out);
/* The figures of the hour that began at hour_ms (a peak's from_ms) for the classes in
 * mask, counted as gw_demand_peak counts them. -ENOENT: not kept. */
int gw_demand_hour(const gw_demand *d, const char *model, unsigned mask, int64_t hour_ms,
                   int64_t now_ms, gw_demand_rate *out);
/* The measured models; i < gw_demand_models. */
size_t gw_demand_models(const gw_demand *d);
const char *gw_demand_model(const gw_demand *d, size_t i);
/* When the figures began (the first start whose history was kept). */
int64_t gw_demand_since(const gw_demand *d);

/* Phones. join: it joined (a heartbeat, the config) -- a stay already open for this id
 * (kept from before a restart) goes on; answered: it is ready to take work, or answered a
 * request (capsvc.c calls it at both; the first of a stay, in practice its first moment
 * ready, since a phone answers only once ready, is its start-up's end, measured
 * only when measure_startup: a phone listed when the gateway started was not starting);
 * leave: it left the registry. */
void gw_demand_phone_join(gw_demand *d, const char *id, int64_t now_ms, int measure_startup);
void gw_demand_phone_answered(gw_demand *d, const char *id, int64_t now_ms);
void gw_demand_phone_leave(gw_demand *d, const char *id, int64_t now_ms);
/* Stays read back from before a restart whose phone has not come back: ended at
 * ended_ms (when the history was last saved). */
void gw_demand_phone_settle(gw_demand *d, int64_t ended_ms);
void gw_demand_churn(const gw_demand *d, int64_t now_ms, gw_churn *out);

/* The whole history as JSON, and back (a history that does not read is refused whole:
 * -EINVAL, d unchanged). Buckets older than the week, and stays ended before it, are
 * left out. Version 2 writes a bucket's answers' slot times (three more numbers) where it
 * has some; a version 1 history (without them) still reads. */
cJSON *gw_demand_to_json(const gw_demand *d, int64_t now_ms);
int gw_demand_from_json(gw_demand *d, const cJSON *o, int64_t now_ms);

#endif
