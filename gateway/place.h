/* Placement's decision (docs/placement.md): which model each phone should run, from the
 * demand per model, each phone's speed per model (measured, else predicted from its speed
 * on another model and the fleet's ratio between the two), and what a switch costs. Pure:
 * no libuv, no gw_server; the caller passes the time and everything it read
 * (placement.c), and tests/unit/test_place.c drives it with injected time.
 *
 * The rule: a model's load is its demand over the horizon against what the phones meant
 * for it can do in that time. While a model is busier than GW_PLACE_BUSY (or has demand
 * and no phone), placement moves the phone that lowers the busier of the two models'
 * loads most, provided the move cuts it by `hysteresis` (any cut, from a model nobody
 * asks for), the phone stayed `min_stay_s`, it may run the model (memory, labels, no
 * recent failure), a model with demand keeps a phone that is not switching (its last one
 * may go when a phone of the busy model that does less there takes its place: a swap,
 * two moves in one pass), no more than
 * half of a model's phones leave at once, and at most `max_switching` phones switch at
 * once. A phone pinned by an operator goes to its pin at once. A switching phone counts
 * for its new model only for the part of the horizon after its download and load. */
#ifndef GW_PLACE_H
#define GW_PLACE_H

#include <stddef.h>
#include <stdint.h>

#define GW_PLACE_BUSY 0.5    /* a model busier than this (its load) asks for phones */
#define GW_PLACE_PROMPT 500  /* prompt tokens assumed before a model's are seen */
#define GW_PLACE_OUT 200     /* answer tokens likewise */

typedef struct gw_place_params {
  double horizon_s, min_stay_s, hysteresis;
  size_t max_switching;      /* phones switching at once, at most (>= 1) */
  double load_mb_s, fetch_mb_s;
} gw_place_params;

typedef struct gw_place_model {
  const char *name;
  double demand;             /* requests over the horizon: queued + arrivals expected */
  double prompt_tokens, out_tokens; /* its average request (<= 0: the defaults above) */
  double size_mb;            /* its file (0: unknown; a switch then costs nothing known) */
  int exclude;               /* no phone is moved to it */
  int keep;                  /* asked for lately: keeps at least one phone */
  /* out: what the decision worked out (admin API, metrics) */
  double capacity;           /* requests a second the phones meant for it can do */
  double load;               /* demand / (capacity x horizon); > 1e9: demand and no phone */
} gw_place_model;

typedef struct gw_place_phone {
  const char *id;
  int cur;                   /* the model it serves now (index), -1: none of them */
  int want;                  /* in: the model meant for it (cur when none); out: moved */
  int switching;             /* a switch to want is under way */
  int pinned;                /* an operator's pin (index), -1: none */
  int movable;               /* placement may move it (registered by heartbeat, ready,
                                not drained by an operator) */
  uint64_t since_ms;         /* when it came to cur (switched, or joined) */
  int slots;
  const double *prefill, *decode; /* per model: measured rates (tokens/s, <= 0: none) */
  const unsigned char *allowed;   /* per model: it may run it (memory, labels, backoff) */
  const unsigned char *holds;     /* per model: its disk holds the file (no download) */
} gw_place_phone;

typedef struct gw_place_move {
  size_t phone;
  int from, to;
  double switch_s;           /* its download and load, predicted */
  char reason[200];
} gw_place_move;

/* A phone's predicted rates for model m (its own when measured, else from its rates on
 * another model times the fleet's ratio between the two models' medians, else by the
 * files' sizes, else the fleet's median on m, else 50 and 5). */
void gw_place_rates(const gw_place_model *ms, size_t nm, const gw_place_phone *ps, size_t np,
                    size_t p, int m, double *prefill, double *decode);
/* Requests a second phone p can do on model m. */
double gw_place_capacity(const gw_place_model *ms, size_t nm, const gw_place_phone *ps,
                         size_t np, size_t p, int m);
/* Decide: sets ps[i].want of each phone moved, fills ms[].capacity and load, writes at
 * most cap moves into out. Returns how many. */
size_t gw_place_decide(const gw_place_params *pp, gw_place_model *ms, size_t nm,
                       gw_place_phone *ps, size_t np, uint64_t now_ms, gw_place_move *out,
                       size_t cap);

#endif
