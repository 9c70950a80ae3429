/* Hedging: when a request's first byte is overdue on its phone (or its phone failed a
 * health check) and a free phone would finish it sooner, a second attempt starts there
 * and the first answer wins
 * (docs/routing.md "Hedging"). The decision and the budget that caps the extra phone
 * work are pure: no I/O, no clocks; the caller passes the time. */
#ifndef GW_HEDGE_H
#define GW_HEDGE_H

#include <stdint.h>

/* Prompts of at most this many tokens are short: cheap to read twice, hedged earlier. */
#define GW_HEDGE_SHORT_TOKENS 512
/* The budget's sliding window: GW_HEDGE_BUCKETS buckets of GW_HEDGE_BUCKET_MS each. */
#define GW_HEDGE_BUCKETS 30
#define GW_HEDGE_BUCKET_MS 10000

typedef struct gw_hedge_in {
  double elapsed_s;         /* since the running attempt was sent */
  double expected_first_s;  /* its predicted wait for the first byte (a stream: prefill; a
                               whole answer: all of it) */
  double expected_total_s;  /* its predicted service, all of it */
  int64_t prompt_tokens;    /* uncached prompt tokens (short ones hedge earlier) */
  double factor;            /* overdue past expected_first_s x factor + min_s... */
  double min_s;
  double alt_finish_s;      /* the best free other phone's predicted finish from now (< 0: none) */
  double alt_service_s;     /* ...and the slot time it would take there */
  double budget_left_s;     /* hedge slot-seconds the budget still allows (gw_hedge_budget_left) */
  int suspect;              /* its phone failed its last health check (not yet marked down):
                               overdue at once, and any free phone finishes sooner */
  int running;              /* hedges running now */
  int min_running;          /* a suspect phone's request is hedged while fewer than this many
                               run, whatever the budget says (scheduler.hedge_min_running) */
} gw_hedge_in;

typedef enum {
  GW_HEDGE_NO_NOT_OVERDUE = 0, /* the first byte is not yet overdue */
  GW_HEDGE_NO_PHONE,           /* no other phone is free */
  GW_HEDGE_NO_GAIN,            /* the free phone would not finish sooner than this one now */
  GW_HEDGE_NO_BUDGET,          /* the budget is spent (and, off a suspect phone, hedge_min_running run) */
  GW_HEDGE_YES,
} gw_hedge_verdict;

/* When (seconds after sending) the first byte is overdue: expected x factor + min_s; for a
 * short prompt (<= GW_HEDGE_SHORT_TOKENS) the margin past the expectation is halved. */
double gw_hedge_overdue_s(double expected_first_s, int64_t prompt_tokens, double factor, double min_s);
/* How long the overdue attempt is now expected to need still: what its prediction has left,
 * but at least a quarter of the time it has run (as the planner stretches an overrun). */
double gw_hedge_remaining_s(double elapsed_s, double expected_total_s);
gw_hedge_verdict gw_hedge_decide(const gw_hedge_in *in);

/* The phone work of the last GW_HEDGE_BUCKETS x GW_HEDGE_BUCKET_MS: every attempt's slot
 * time, and the hedges' share of it. */
typedef struct gw_hedge_ledger {
  double work_s[GW_HEDGE_BUCKETS], hedge_s[GW_HEDGE_BUCKETS];
  uint64_t bucket[GW_HEDGE_BUCKETS]; /* which bucket (time / GW_HEDGE_BUCKET_MS) each slot holds */
} gw_hedge_ledger;

/* An attempt let go of its slot after slot_s seconds; hedge: it was a second attempt. */
void gw_hedge_note(gw_hedge_ledger *l, uint64_t now_ms, double slot_s, int hedge);
/* Hedge slot-seconds still allowed: share x all work in the window (with the running
 * attempts' time so far, running_s, of which running_hedge_s hedges) less the hedges'. */
double gw_hedge_budget_left(const gw_hedge_ledger *l, uint64_t now_ms, double share, double running_s,
                            double running_hedge_s);

#endif
