/* The cost ledger: what the fleet cost over the last hour and day, what share of it the
 * requests used (by model and by API key), and what they served, in fixed time buckets
 * (60 of a minute, 24 of an hour), so that its memory is bounded whatever the traffic.
 * Pure arithmetic on times given by the caller (the loop's milliseconds; tests use a
 * fake clock): cost.c feeds it from the registry and the attempts. docs/operations.md
 * ("Costs") explains the arithmetic. Owned by its creator (gw_ledger_free). */
#ifndef GW_LEDGER_H
#define GW_LEDGER_H

#include <stddef.h>
#include <stdint.h>

#define GW_LEDGER_MIN_MS 60000u
#define GW_LEDGER_HOUR_MS 3600000u
#define GW_LEDGER_MINUTES 60 /* the last hour: this minute and the 59 before it */
#define GW_LEDGER_HOURS 24   /* the last day: this hour and the 23 before it */
#define GW_LEDGER_MAX_MODELS 64   /* more model names go to "_other" */
#define GW_LEDGER_MAX_KEYS 1024   /* more API key names go to "_other" */
#define GW_LEDGER_NAME_MAX 128

typedef enum { GW_LEDGER_HOUR = 0, GW_LEDGER_DAY } gw_ledger_window;
typedef enum { GW_LEDGER_MODEL = 0, GW_LEDGER_KEY } gw_ledger_kind;

/* Sums over a window. For the fleet: cost = what every replica cost, busy = the part the
 * requests used, down = the part of replicas that could not serve (down or loading). For
 * a model or a key: busy = the cost its requests used; cost and down are 0. */
typedef struct gw_ledger_sum {
  double cost, busy, down;
  uint64_t requests, tokens; /* requests served (answered 2xx/3xx) and their tokens */
  double span_s;             /* how long the window covers: since the oldest bucket it
                                holds began, or since the ledger started if later */
} gw_ledger_sum;

typedef struct gw_ledger gw_ledger;

gw_ledger *gw_ledger_new(uint64_t now_ms);
void gw_ledger_free(gw_ledger *l);

/* The fleet cost [t0, t1): replicas costing per_day in all, down_per_day of it for
 * replicas that could not serve, spread over the minutes and hours it spans. */
void gw_ledger_fleet(gw_ledger *l, uint64_t t0, uint64_t t1, double per_day, double down_per_day);
/* A slot held [t0, t1) for a request of model and key (NULL: "anonymous"), on a replica
 * whose slot costs slot_per_day (its cost per day over its slots). */
void gw_ledger_use(gw_ledger *l, uint64_t t0, uint64_t t1, double slot_per_day, const char *model,
                   const char *key);
/* A request served at t, with its tokens (prompt + generated). */
void gw_ledger_served(gw_ledger *l, uint64_t t, const char *model, const char *key, uint64_t tokens);

/* The window up to now: the fleet's sums (name NULL) or one model's or key's. A name the
 * ledger has not seen gives zeros. */
void gw_ledger_sum_of(gw_ledger *l, uint64_t now, gw_ledger_window w, gw_ledger_kind kind,
                      const char *name, gw_ledger_sum *out);
/* The fleet's sums since the ledger started (span_s: since then). */
void gw_ledger_totals(const gw_ledger *l, uint64_t now, gw_ledger_sum *out);
/* The names seen (models or keys), in the order first seen; i < gw_ledger_count. */
size_t gw_ledger_count(const gw_ledger *l, gw_ledger_kind kind);
const char *gw_ledger_name(const gw_ledger *l, gw_ledger_kind kind, size_t i);

#endif
