/* The queue of requests waiting for a replica: two classes (interactive before batch),
 * each a list in weighted-fair-queueing tag order; within one caller's flow, its jobs
 * hold its tags in `ready` order (shortest predicted work first, with aging: job.c sets
 * ready = arrival + aging_factor x predicted service). Pure list work on gw_job links (no
 * I/O, no clock, no states: job.c moves a job's state around these calls). */
#ifndef GW_QUEUE_H
#define GW_QUEUE_H

#include <stddef.h>

#include "gw.h"

/* Give j its fair-queueing tag (start-time fair queueing): the later of its class's
 * current tag and the end of its caller's previous job; the caller advances by
 * 1/weight. Without a caller (no api_keys) every job is one flow: arrival order. */
void gw_queue_tag(gw_queue *q, gw_job *j);
/* Link j in tag order, or at the very front of its class (a retried job). A new job
 * (tagged last in its flow) passes the flow's waiting jobs whose `ready` is later than
 * its own (at most 256 of them), taking the earliest of their tags while each moves one
 * tag on, so the flow keeps the same tags, and share, as in arrival order. Jobs at the
 * front are neither passed nor moved. Returns 0, or -EEXIST when j is linked already (a
 * second insertion would make the list a loop). */
int gw_queue_insert(gw_queue *q, gw_job *j, int front);
/* Unlink j; returns 0, or -ENOENT when it was not linked (a second removal is harmless). */
int gw_queue_unlink(gw_queue *q, gw_job *j);
/* Whether j is linked: read from the links themselves, never from the job's state. */
int gw_queue_has(const gw_queue *q, const gw_job *j);
/* Jobs waiting for `model`, both classes. */
size_t gw_queue_count(const gw_queue *q, const char *model);

#endif
