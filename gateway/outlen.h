/* How long an answer will be, learned per model and per size of the cap the caller set
 * (docs/routing.md "The plan"). One average over every answer plans a 300-token chat at
 * the length of the fleet's one-line verdicts; a guard's cap of 4 and a chat's of 300
 * are different kinds of work, so each (model, cap bucket) keeps its own moving average.
 * Pure: no I/O, no clocks; the caller passes the time. */
#ifndef GW_OUTLEN_H
#define GW_OUTLEN_H

#include <stdint.h>

#define GW_OUTLEN_CLASSES 64   /* (model, cap bucket) pairs remembered; the oldest goes */
#define GW_OUTLEN_MODEL 128    /* model names are compared on this many bytes - 1 */

typedef struct gw_outlen {
  struct {
    char model[GW_OUTLEN_MODEL];
    int bucket;   /* floor(log2(cap)): caps 256-511 share one */
    double avg;   /* moving average of answer lengths (tokens) */
    unsigned n;   /* answers seen */
    uint64_t at;  /* last answer (ms), for replacing the oldest */
  } e[GW_OUTLEN_CLASSES];
  double all;     /* over every answer (0: none yet), for a class not seen yet */
} gw_outlen;

/* The answer length to plan a request for model with this cap (tokens, > 0) on: its
 * class's average once it has one, else the average over all answers, else fallback
 * (scheduler.expected_output_tokens); never more than cap. */
double gw_outlen_expect(const gw_outlen *t, const char *model, int64_t cap, double fallback);

/* An answer of n tokens (a finite number >= 0; anything else is ignored) to a request for
 * model with this cap came at now. */
void gw_outlen_learn(gw_outlen *t, const char *model, int64_t cap, double n, uint64_t now);

#endif
