/* A simulated phone's fault plan: a list of windows during which it misbehaves in one
 * way (goes offline, hangs, answers 503, slows down, drops streams, lies about its
 * speed, produces output its chat parser refuses). Times are in
 * simulated seconds from the process start; the sim divides them by --time-scale.
 * Pure data: no I/O besides reading the plan file at start-up, no libuv. */
#ifndef AG_FAULTS_H
#define AG_FAULTS_H

#include <stddef.h>

#include <cjson/cJSON.h>

typedef enum {
  AG_FAULT_OFFLINE = 0, /* listener closed, every connection reset; listen again after */
  AG_FAULT_HANG,        /* requests are read but never answered */
  AG_FAULT_ERROR503,    /* requests answered 503 unavailable_error, /health too */
  AG_FAULT_SLOW,        /* prefill and decode take `factor` (default AG_FAULT_SLOW_FACTOR)
                           times longer */
  AG_FAULT_DROP,        /* streams cut after a few tokens, other answers reset */
  AG_FAULT_FAST_TIMINGS, /* answers' timings claim AG_FAULT_FAST_TIMINGS_FACTOR times the
                            speed they ran at (a lying phone) */
  AG_FAULT_UNPARSABLE,  /* answers that end in the window are a 500 "The model produced
                           output that does not match the expected ... format" after the
                           whole generation (llama-server b10587's late 500) */
  AG_FAULT_FAKE,        /* a faker: every text answer is `text` (AG_FAULT_FAKE_TEXT when not
                           given; a few random words with "random": true), at once (a
                           thousandth of the time), with timings and usage that say so */
  AG_FAULT_SUBSTITUTE,  /* another model than the one it names: deterministic answers (temperature
                           0, or a seed) differ from honest sims' for the same prompt */
  AG_FAULT__COUNT
} ag_fault_kind;

#define AG_FAULT_SLOW_FACTOR 5.0
#define AG_FAULT_FAST_TIMINGS_FACTOR 10.0
#define AG_FAULT_FAKE_TEXT "RISK_LEVEL: 1"
/* How many times faster a faker's answers are than the sim's rates. */
#define AG_FAULT_FAKE_SPEEDUP 1000.0
#define AG_FAULT_TEXT_MAX 64
/* A bit per kind, for the set of faults active at one moment. */
#define AG_FAULT_BIT(k) (1u << (unsigned)(k))

/* One window [at_s, at_s + dur_s). */
typedef struct ag_fault {
  double at_s;
  double dur_s;
  ag_fault_kind kind;
  double factor; /* slow only: how many times longer (AG_FAULT_SLOW_FACTOR when not given) */
  char text[AG_FAULT_TEXT_MAX]; /* fake only: its answer ("" with random) */
  int random;                   /* fake only: a few random words instead of text */
} ag_fault;

/* Owns `v`; ag_fault_plan_free releases it. An empty plan (n == 0) never fires. */
typedef struct ag_fault_plan {
  ag_fault *v;
  size_t n;
} ag_fault_plan;

/* Parse a JSON array of {"at_s": number >= 0, "kind": name, "dur_s": number > 0}, and for
 * kind "slow" an optional "factor" (1 to 100, default AG_FAULT_SLOW_FACTOR); for kind
 * "fake" an optional "text" (1 to 63 bytes, default AG_FAULT_FAKE_TEXT) or "random": true.
 * Returns 0, or a negative code with a message naming the entry in err (size errn). */
int ag_fault_plan_parse(ag_fault_plan *p, const char *text, size_t len, char *err, size_t errn);
/* The same from a parsed JSON value (a phones file's inline "fault_plan"); `base` is the
 * value's path for messages ("[3].fault_plan"; "" for a document of its own). */
int ag_fault_plan_from_json(ag_fault_plan *p, const cJSON *root, const char *base, char *err, size_t errn);
/* Read and parse a plan file. Messages start with the file name. */
int ag_fault_plan_load(ag_fault_plan *p, const char *path, char *err, size_t errn);
/* Deep copy of src into dst (dst's previous content is not freed). */
int ag_fault_plan_copy(ag_fault_plan *dst, const ag_fault_plan *src);
void ag_fault_plan_free(ag_fault_plan *p);

/* Set of kinds (AG_FAULT_BIT) active at simulated time t. */
unsigned ag_fault_plan_active(const ag_fault_plan *p, double t);
/* How many times longer a step started at t takes: the largest factor of the slow
 * windows active at t, 1 when none is. */
double ag_fault_plan_slow_factor(const ag_fault_plan *p, double t);
/* The fake window active at t (the first), or NULL. */
const ag_fault *ag_fault_plan_fake(const ag_fault_plan *p, double t);
/* The first window start or end strictly after t; a negative value when none is left. */
double ag_fault_plan_next_change(const ag_fault_plan *p, double t);

/* "offline", "hang", ...; "?" for an unknown value. */
const char *ag_fault_kind_name(ag_fault_kind k);

#endif
