/* How long an answer will be, learned per model and per size of the cap the caller set
 * (docs/routing.md "The plan"). One average over every answer plans a 300-token chat at
 * the length of the fleet's one-line verdicts; a guard's cap of 4 and a chat's of 300
 * are different kinds of work, so each cap bucket of a model keeps its own moving average
 * (a model's table lives in its gw_model, model.h), and one average over every answer of
 * every model plans a bucket not seen yet. Pure: no I/O, no clocks. */
#ifndef GW_OUTLEN_H
#define GW_OUTLEN_H

#include <stdint.h>

#define GW_OUTLEN_BUCKETS 63   /* floor(log2(cap)) of a cap of 1 .. 2^63 */

/* One model's answer lengths by cap bucket: caps 256-511 share one. */
typedef struct gw_outlen {
  struct {
    double avg;   /* moving average of answer lengths (tokens) */
    unsigned n;   /* answers seen */
  } e[GW_OUTLEN_BUCKETS];
} gw_outlen;

/* The answer length to plan a request with this cap (tokens, > 0) on: its model's bucket
 * (t; NULL: nothing learned for the model) once it has an answer, else `all` (the average
 * over every answer; 0: none yet), else fallback (scheduler.expected_output_tokens); never
 * more than cap. */
double gw_outlen_expect(const gw_outlen *t, double all, int64_t cap, double fallback);

/* An answer of n tokens (a finite number >= 0; anything else is ignored) to a request with
 * this cap: learned in *all, and in its model's bucket when t is given and cap > 0. */
void gw_outlen_learn(gw_outlen *t, double *all, int64_t cap, double n);

#endif
