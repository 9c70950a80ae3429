/* The planner before it was made to scale: the reference plan_bench.c compares with. */
#ifndef FG_SCHED_REF_H
#define FG_SCHED_REF_H

#include "scheduler.h"

void ref_sched_plan(gw_replica *const *replicas, size_t nr, const gw_sched_req *reqs, size_t n,
                    uint64_t now_ms, gw_sched_choice *out);

#endif
