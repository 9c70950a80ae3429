/* Progress and pace of the requests on llama-server's slots; see progress.h. */
#include "progress.h"

#include <string.h>

#include <cjson/cJSON.h>

#include "err.h"
#include "json.h"

void ag_progress_clear(ag_progress *p) { memset(p, 0, sizeof(*p)); }

static int task_ended(const ag_progress *p, int64_t id_task) {
  for (size_t i = 0; id_task >= 0 && i < p->n_ended; i++)
    if (p->ended[i] == id_task) return 1;
  return 0;
}

/* A whole number from o[key], or -1 when absent or out of range. */
static int64_t num_or_unknown(const cJSON *o, const char *key) {
  return (int64_t)pr_json_num_or(o, key, 0, 1e15, -1);
}

/* A reading of a counter. Readings that show no move keep the base: llama-server reads
 * a prompt a batch at a time and answers /slots only between batches, so a move is
 * measured over the whole time it took. */
static void pace_update(ag_progress_pace *pc, int64_t value, uint64_t now_ns) {
  if (value < 0) return;
  if (pc->seen && value > pc->base && now_ns > pc->base_ns) {
    pc->delta = value - pc->base;
    pc->delta_ns = now_ns - pc->base_ns;
  } else if (pc->seen && value >= pc->base) {
    return;
  } else if (pc->seen) {
    pc->delta = 0; /* went back (the prompt is read again): start over */
  }
  pc->seen = 1;
  pc->base = value;
  pc->base_ns = now_ns;
}

/* Tokens per second of the last move. Unless the counter is done, a wait longer than
 * that move since it counts too: a phone that stopped advancing shows a falling pace,
 * not the last good one. */
static double pace_tps(const ag_progress_pace *pc, uint64_t now_ns, int done) {
  if (pc->delta <= 0 || pc->delta_ns == 0) return -1;
  uint64_t dt = pc->delta_ns;
  if (!done && now_ns > pc->base_ns && now_ns - pc->base_ns > dt) dt = now_ns - pc->base_ns;
  return (double)pc->delta * 1e9 / (double)dt;
}

/* One busy slot of the reading into *s; prev is what the last reading had for the same
 * task, or NULL. */
static void slot_take(ag_progress_slot *s, const cJSON *o, const ag_progress_slot *prev, uint64_t now_ns) {
  s->prompt_tokens = num_or_unknown(o, "n_prompt_tokens");
  int64_t processed = num_or_unknown(o, "n_prompt_tokens_processed");
  int64_t cache = num_or_unknown(o, "n_prompt_tokens_cache");
  s->prompt_done = processed < 0 ? -1 : processed + (cache > 0 ? cache : 0);
  if (s->prompt_tokens >= 0 && s->prompt_done > s->prompt_tokens) s->prompt_done = s->prompt_tokens;
  const cJSON *next = cJSON_GetObjectItemCaseSensitive(o, "next_token");
  /* b10587: a list (one entry per choice); the build of February 2025: one object */
  const cJSON *first = cJSON_IsArray(next) ? cJSON_GetArrayItem(next, 0) : cJSON_IsObject(next) ? next : NULL;
  s->decoded = cJSON_IsObject(first) ? num_or_unknown(first, "n_decoded") : -1;
  if (prev) {
    s->prefill = prev->prefill;
    s->decode = prev->decode;
    s->prefill_over = prev->prefill_over;
  }
  if (!s->prefill_over) {
    /* the prefill's pace ends with the reading that finds the prompt read */
    s->prefill_over = s->decoded > 0 || (s->prompt_tokens >= 0 && s->prompt_done >= s->prompt_tokens);
    ag_progress_pace before = s->prefill;
    pace_update(&s->prefill, s->prompt_done, now_ns);
    /* that last move also spans the wait for (or the writing of) the first tokens: it
     * only says the pace was at least that much, so a faster earlier one stays */
    if (s->prefill_over && before.delta > 0 &&
        (double)before.delta * (double)s->prefill.delta_ns > (double)s->prefill.delta * (double)before.delta_ns)
      s->prefill = before;
  }
  /* the decode's begins with the first reading that finds it generating: the move up
   * to that one was partly prefill */
  if (s->decoded > 0) pace_update(&s->decode, s->decoded, now_ns);
}

static const ag_progress_slot *find_prev(const ag_progress *p, int64_t id, int64_t id_task) {
  if (id < 0 || id_task < 0) return NULL;
  for (size_t i = 0; i < p->n; i++)
    if (p->slots[i].id == id && p->slots[i].id_task == id_task) return &p->slots[i];
  return NULL;
}

/* Tasks in the order they arrived; a slot without an id_task goes last. */
static int task_before(int64_t a, int64_t b) {
  if (a < 0) return 0;
  return b < 0 || a < b;
}

int ag_progress_take(ag_progress *p, const char *json, size_t len, uint64_t now_ns) {
  cJSON *root = cJSON_ParseWithLength(json ? json : "", len);
  if (!cJSON_IsArray(root)) {
    cJSON_Delete(root);
    ag_progress_clear(p);
    return PR_EPARSE;
  }
  ag_progress next; /* built aside: the last reading is looked up while it is built */
  memset(&next, 0, sizeof(next));
  const cJSON *o;
  cJSON_ArrayForEach(o, root) {
    if (!cJSON_IsObject(o) || !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "is_processing"))) continue;
    int64_t task = num_or_unknown(o, "id_task");
    if (task_ended(p, task)) {
      /* still busy with a request that ended here: keep remembering it, report nothing */
      if (!task_ended(&next, task) && next.n_ended < AG_PROGRESS_MAX_SLOTS) next.ended[next.n_ended++] = task;
      continue;
    }
    if (next.n == AG_PROGRESS_MAX_SLOTS) {
      next.truncated = 1;
      break;
    }
    ag_progress_slot s;
    memset(&s, 0, sizeof(s));
    s.id = num_or_unknown(o, "id");
    s.id_task = num_or_unknown(o, "id_task");
    slot_take(&s, o, find_prev(p, s.id, s.id_task), now_ns);
    size_t at = next.n;
    while (at > 0 && task_before(s.id_task, next.slots[at - 1].id_task)) {
      next.slots[at] = next.slots[at - 1];
      at--;
    }
    next.slots[at] = s;
    next.n++;
  }
  cJSON_Delete(root);
  *p = next;
  return 0;
}

void ag_progress_forget(ag_progress *p, size_t i) {
  if (i >= p->n) return;
  if (p->slots[i].id_task >= 0 && p->n_ended < AG_PROGRESS_MAX_SLOTS) p->ended[p->n_ended++] = p->slots[i].id_task;
  memmove(&p->slots[i], &p->slots[i + 1], (p->n - i - 1) * sizeof(p->slots[0]));
  p->n--;
}

size_t ag_progress_fill(const ag_progress *p, uint64_t now_ns, const char *const *ids, size_t n_ids,
                        ag_running *out, size_t cap) {
  int pair = ids && !p->truncated && n_ids == p->n;
  size_t n = 0;
  for (size_t i = 0; i < p->n && n < cap; i++) {
    const ag_progress_slot *s = &p->slots[i];
    ag_running *run = &out[n++];
    ag_report_copy_id(run->request_id, pair ? ids[i] : NULL);
    run->prompt_tokens = s->prompt_tokens;
    run->prompt_done = s->prompt_done;
    run->decoded = s->decoded;
    run->prefill_tps = pace_tps(&s->prefill, now_ns, s->prefill_over);
    run->decode_tps = pace_tps(&s->decode, now_ns, 0);
  }
  return n;
}
