/* Recorded plans: every planning decision written down with the whole of what it read, so
 * that a change to the planner can be shown to decide exactly as before (the replay in
 * tests/unit/test_planreplay.c runs the planner again on each record and compares).
 *
 * Off unless FLEETGATE_RECORD_PLANS names a file (server.c; "%p" in it is replaced by the
 * process id). Each decision is one JSON line appended to it: the planner's inputs (the
 * replicas as the planner reads them, the requests, the time) and its outputs. Kinds:
 * "pass" (a planning pass), "hedge" (a plan for an overdue request's second attempt),
 * "move" (a plan for requests leaving a phone that turned slow) and "predict" (admission's
 * prediction: the shortest service and the earliest finish, gw_sched_best). Doubles are
 * written with 17 significant digits, so a record reads back bit for bit; fingerprints and
 * cache scopes as hex strings, fingerprints once per line in "fp" and named by index.
 * A debugging and testing aid: the file is written with plain write(2) on the loop.
 * No libuv here. */
#ifndef GW_PLANREC_H
#define GW_PLANREC_H

#include <stddef.h>
#include <stdint.h>

#include "replica.h"
#include "scheduler.h"

typedef struct gw_planrec gw_planrec;

typedef enum {
  GW_PLANREC_PASS = 0,
  GW_PLANREC_HEDGE,
  GW_PLANREC_MOVE,
  GW_PLANREC_PREDICT,
  GW_PLANREC_KINDS
} gw_planrec_kind;

const char *gw_planrec_kind_name(gw_planrec_kind k);

/* Open path for appending ("%p": the process id). Returns 0 with *out set, or a negative
 * errno-style code. */
int gw_planrec_open(gw_planrec **out, const char *path);
void gw_planrec_close(gw_planrec *rec);
/* Records written, and those lost (out of memory, a failed write). */
uint64_t gw_planrec_written(const gw_planrec *rec);
uint64_t gw_planrec_lost(const gw_planrec *rec);

/* A plan: gw_sched_plan(rs, nr, q, n, now) answered out. */
void gw_planrec_plan(gw_planrec *rec, gw_planrec_kind kind, gw_replica *const *rs, size_t nr,
                     const gw_sched_req *q, size_t n, uint64_t now, const gw_sched_choice *out);
/* Admission's prediction: gw_sched_best(rs, nr, q, now) answered svc, fin and guess. */
void gw_planrec_predict(gw_planrec *rec, gw_replica *const *rs, size_t nr, const gw_sched_req *q,
                        uint64_t now, double svc, double fin, int guess);

/* What the recorder read of a replica through the replica's own functions, kept beside
 * its fields so a replay can check it rebuilt the replica whole. */
typedef struct gw_planrec_derived {
  int capacity, suspect, unknown;
  double slowdown, device_slowdown;
  uint64_t wait_ms;
} gw_planrec_derived;

/* One record read back: the replicas rebuilt (owned), the requests (their strings and
 * fingerprints owned), and what the planner answered then. */
typedef struct gw_planrec_case {
  gw_planrec_kind kind;
  uint64_t now;
  gw_replica **replicas;
  gw_planrec_derived *derived;
  size_t nr;
  gw_sched_req *reqs;
  size_t n;
  gw_sched_choice *out;         /* plans: n choices */
  double svc, fin;              /* predict */
  int guess;
  /* storage */
  char **strings;
  size_t n_strings;
  uint64_t *fp;
  size_t n_fp;
  uint64_t **blocks;            /* each request's fingerprints */
} gw_planrec_case;

/* Read one line (len bytes) into c. Returns 0, or a negative code with a message in err
 * (size n) when the line is not a record. */
int gw_planrec_parse(const char *line, size_t len, gw_planrec_case *c, char *err, size_t n);
void gw_planrec_case_free(gw_planrec_case *c);
/* What the recorder reads of r at now (the derived values above). */
void gw_planrec_derive(const gw_replica *r, uint64_t now, gw_planrec_derived *d);

#endif
