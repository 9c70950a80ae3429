/* The waiting requests; see queue.h. */
#include "queue.h"

#include <errno.h>
#include <string.h>

#include "auth.h"

void gw_queue_tag(gw_queue *q, gw_job *j) {
  int p = j->prio;
  double *last = j->caller ? &j->caller->last_tag[p] : &q->anon_tag[p];
  double w = j->caller && j->caller->conf ? j->caller->conf->weight : 1.0;
  j->tag = q->vtime[p] > *last ? q->vtime[p] : *last;
  *last = j->tag + 1.0 / w;
  j->seq = ++q->next_seq;
}

int gw_queue_has(const gw_queue *q, const gw_job *j) {
  return j->qprev != NULL || q->head[j->prio] == j;
}

/* Link j in tag order. New jobs mostly belong near the tail, so the walk starts there. */
static void link_in(gw_queue *q, gw_job *j, int front) {
  int p = j->prio;
  j->qprev = j->qnext = NULL;
  j->qfront = front;
  gw_job *after = NULL; /* insert after this one; NULL: at the head */
  if (!front) {
    after = q->tail[p];
    while (after && after->tag > j->tag) after = after->qprev;
  }
  if (!after) {
    j->qnext = q->head[p];
    if (q->head[p]) q->head[p]->qprev = j;
    q->head[p] = j;
    if (!q->tail[p]) q->tail[p] = j;
  } else {
    j->qprev = after;
    j->qnext = after->qnext;
    if (after->qnext) after->qnext->qprev = j;
    else q->tail[p] = j;
    after->qnext = j;
  }
  q->len++;
}

/* The same flow: one caller's jobs (or the anonymous flow's) in one class. */
static int same_flow(const gw_job *a, const gw_job *b) {
  return a->prio == b->prio && a->caller == b->caller;
}

#define SJF_MAX_SHIFT 256 /* jobs of one flow a new job passes at most (bounds the work) */

/* Shortest work first within a flow, fair shares between flows: the flow's waiting jobs
 * (retries at the front aside) hold the flow's tags in `ready` order. A new job holds the
 * flow's newest tag; each of the flow's jobs that is ready later than it moves one tag
 * on, and j takes the earliest tag they freed. The set of tags a flow holds, and so its
 * share against other flows, is the same as in arrival order. */
int gw_queue_insert(gw_queue *q, gw_job *j, int front) {
  if (gw_queue_has(q, j)) return -EEXIST;
  gw_job *later[SJF_MAX_SHIFT];
  int n = 0;
  if (!front) {
    for (gw_job *k = q->tail[j->prio]; k && n < SJF_MAX_SHIFT; k = k->qprev) {
      if (k->qfront || !same_flow(k, j)) continue;
      if (k->ready <= j->ready || k->tag > j->tag) break; /* the flow is in ready order */
      later[n++] = k; /* newest tag first */
    }
  }
  if (n > 0) {
    /* the tags run j > later[0] > ... > later[n-1]; in ready order j comes first */
    double t = later[n - 1]->tag;
    uint64_t sq = later[n - 1]->seq;
    for (int i = n - 1; i >= 0; i--) {
      (void)gw_queue_unlink(q, later[i]);
      later[i]->tag = i > 0 ? later[i - 1]->tag : j->tag;
      later[i]->seq = i > 0 ? later[i - 1]->seq : j->seq;
    }
    j->tag = t;
    j->seq = sq;
  }
  for (int i = n - 1; i >= 0; i--) link_in(q, later[i], 0);
  link_in(q, j, front);
  return 0;
}

int gw_queue_unlink(gw_queue *q, gw_job *j) {
  if (!gw_queue_has(q, j)) return -ENOENT;
  int p = j->prio;
  if (j->qprev) j->qprev->qnext = j->qnext;
  else q->head[p] = j->qnext;
  if (j->qnext) j->qnext->qprev = j->qprev;
  else q->tail[p] = j->qprev;
  j->qprev = j->qnext = NULL;
  q->len--;
  return 0;
}

size_t gw_queue_count(const gw_queue *q, const char *model) {
  size_t n = 0;
  for (int p = 0; p < GW_PRIO_COUNT; p++)
    for (const gw_job *j = q->head[p]; j; j = j->qnext)
      if (strcmp(j->oai.model, model) == 0) n++;
  return n;
}
