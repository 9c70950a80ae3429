/* Per-request progress on llama-server, read from its GET /slots: each busy slot's
 * prompt and generation counters, the pace between two readings, and which of the
 * front's in-flight requests each slot serves. Pure: the caller fetches /slots, says
 * when it read it, and builds the report; no I/O and no clock here. */
#ifndef AG_PROGRESS_H
#define AG_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "report.h"

/* Busy slots followed; more than that are left out (and no request id is paired). */
#define AG_PROGRESS_MAX_SLOTS AG_REPORT_MAX_SLOTS

/* The pace of one counter: the last reading at which it moved and how far that move
 * went in how long. Plain data. */
typedef struct ag_progress_pace {
  int seen;            /* base is set */
  int64_t base;        /* the counter at the last reading where it moved (or the first) */
  uint64_t base_ns;    /* that reading's time */
  int64_t delta;       /* the last move (> 0); 0: none seen yet */
  uint64_t delta_ns;   /* how long that move took */
} ag_progress_pace;

/* One busy slot as the last reading showed it; unknown numbers are < 0. Plain data. */
typedef struct ag_progress_slot {
  int64_t id;              /* the slot's id */
  int64_t id_task;         /* llama-server numbers tasks in arrival order */
  int64_t prompt_tokens;
  int64_t prompt_done;     /* n_prompt_tokens_cache + n_prompt_tokens_processed */
  int64_t decoded;         /* next_token[0].n_decoded */
  ag_progress_pace prefill, decode;
  int prefill_over;        /* a reading found the prompt read: its pace is final */
} ag_progress_slot;

/* Busy slots of the last reading, ordered by id_task. Plain data, no ownership. */
typedef struct ag_progress {
  ag_progress_slot slots[AG_PROGRESS_MAX_SLOTS];
  size_t n;
  int truncated;           /* more slots were busy than are kept */
  /* tasks whose request ended here while llama-server may still show them busy (it
   * notices a closed connection only between batches): left out of later readings until
   * they are no longer busy, so they are never paired with another request's id */
  int64_t ended[AG_PROGRESS_MAX_SLOTS];
  size_t n_ended;
} ag_progress;

/* Forget every slot (nothing runs, or the engine stopped answering). */
void ag_progress_clear(ag_progress *p);
/* Take a /slots body read at now_ns. A slot whose id_task is the same as in the last
 * reading keeps its pace; another starts afresh. Returns 0, or PR_EPARSE when the body
 * is not a JSON array (p is then cleared). */
int ag_progress_take(ag_progress *p, const char *json, size_t len, uint64_t now_ns);
/* The request on the i-th busy slot (by id_task) ended: leave it out now, and out of
 * later readings while llama-server still shows its task busy, so the others keep their
 * pairing. */
void ag_progress_forget(ag_progress *p, size_t i);
/* The busy slots as report entries (at most cap), ordered by id_task. ids are the
 * front's in-flight completions' request ids in arrival order: when there are exactly as
 * many as busy slots they are paired in order, else every entry's request_id is "".
 * ids may be NULL (no pairing). Returns the number of entries written. */
size_t ag_progress_fill(const ag_progress *p, uint64_t now_ns, const char *const *ids, size_t n_ids,
                        ag_running *out, size_t cap);

#endif
