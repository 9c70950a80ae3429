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

/* New jobs mostly belong near the tail, so the walk starts there. */
int gw_queue_insert(gw_queue *q, gw_job *j, int front) {
  if (gw_queue_has(q, j)) return -EEXIST;
  int p = j->prio;
  j->qprev = j->qnext = NULL;
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
