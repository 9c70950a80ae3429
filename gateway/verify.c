/* Answers verified: cross-checks, votes, canaries and quarantine. See verify.h and
 * docs/routing.md "Answers verified". */
#include "verify.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "auth.h"
#include "clock.h"
#include "err.h"
#include "events.h"
#include "hedge.h"
#include "idmap.h"
#include "json.h"
#include "log.h"
#include "privfile.h"
#include "registry.h"
#include "sse.h"

#define VERIFY_SINCE_MAX 4096    /* answers kept per phone since its last passed check */
#define VERIFY_EVIDENCE_MAX 32   /* failed checks kept per phone */
#define VERIFY_TEXT_MAX (64u << 10) /* an answer's text kept for a comparison */
#define VERIFY_CHECKS_MAX 256    /* checks in flight at once, whatever the budget */
#define VERIFY_CANARIES_MAX 1000
#define VERIFY_SSE_MAX (4u << 20) /* a streamed shadow's bytes kept */
#define VERIFY_EXCERPT 200       /* an answer's first bytes kept as evidence */
#define VERIFY_FILE "verify.json" /* the records, in data_dir */
#define VERIFY_FILE_MAX (256u << 20) /* a bigger file is not read */
#define VERIFY_SAVE_MS 10000     /* records that changed are written at most this often */
#define VERIFY_SHARED_ANSWERS 1024 /* a quarantined phone's answers put in Redis */

/* ---- the pure parts ------------------------------------------------------------------ */

/* The next word of *p (advancing it): its start and length; 0 when none is left. */
static size_t next_word(const char **p, const char **start) {
  const char *s = *p;
  for (;;) { /* a thinking model's tags are not words: builds that parse the reasoning out
              * of the text, and those that leave it there (or do only once it is closed,
              * as a shadow cut by its cap is not), give the same words */
    while (*s && isspace((unsigned char)*s)) s++;
    if (strncmp(s, "<think>", 7) == 0) s += 7;
    else if (strncmp(s, "</think>", 8) == 0) s += 8;
    else break;
  }
  const char *e = s;
  while (*e && !isspace((unsigned char)*e)) e++;
  *start = s;
  *p = e;
  return (size_t)(e - s);
}

int gw_verify_agree(const char *a, const char *b, int words) {
  const char *pa = a ? a : "", *pb = b ? b : "";
  for (int i = 0; i < words; i++) {
    const char *sa, *sb;
    size_t la = next_word(&pa, &sa), lb = next_word(&pb, &sb);
    if (la != lb || memcmp(sa, sb, la) != 0) return 0;
    if (la == 0) return 1; /* both ended */
  }
  return 1;
}

double gw_verify_rate(unsigned passed_in_row, uint64_t passed, int owes, int trust_after,
                      double newcomer_rate, double min_rate) {
  if (owes) return 1.0;
  if (trust_after < 1) trust_after = 1;
  if (passed_in_row < (unsigned)trust_after || passed == 0) return newcomer_rate;
  double r = newcomer_rate * (double)trust_after / (double)passed;
  if (r < min_rate) r = min_rate;
  return r > newcomer_rate ? newcomer_rate : r;
}

/* Pieces of text are kept as far as out's cap allows: only the first words are compared. */
static int add_str(pr_buf *out, const cJSON *s) {
  if (!cJSON_IsString(s) || !s->valuestring[0]) return 0;
  if (out->len) pr_buf_bytes(out, " ", 1);
  pr_buf_bytes(out, s->valuestring, strlen(s->valuestring));
  return 0;
}

/* The text of a message, a stream's delta, or a completion's choice. */
static int choice_text(const cJSON *c, pr_buf *out) {
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, "message");
  if (!m) m = cJSON_GetObjectItemCaseSensitive(c, "delta");
  int rc = 0;
  if (m) {
    /* a stream's pieces are joined as they came: no separator */
    int stream = cJSON_GetObjectItemCaseSensitive(c, "delta") != NULL;
    static const char *const keys[] = {"reasoning_content", "content", NULL};
    for (int i = 0; !rc && keys[i]; i++) {
      const cJSON *s = cJSON_GetObjectItemCaseSensitive(m, keys[i]);
      if (stream && cJSON_IsString(s)) pr_buf_bytes(out, s->valuestring, strlen(s->valuestring));
      else if (!stream) rc = add_str(out, s);
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
      const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
      if (!rc) rc = add_str(out, cJSON_GetObjectItemCaseSensitive(f, "name"));
      if (!rc) rc = add_str(out, cJSON_GetObjectItemCaseSensitive(f, "arguments"));
    }
  } else {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(c, "text");
    if (cJSON_IsString(s)) pr_buf_bytes(out, s->valuestring, strlen(s->valuestring));
  }
  return rc;
}

int gw_verify_answer_text(const char *body, size_t len, pr_buf *out) {
  cJSON *root = cJSON_ParseWithLength(body ? body : "", len);
  const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
  int rc = c ? choice_text(c, out) : PR_EPARSE;
  cJSON_Delete(root);
  return rc;
}

/* ---- records and checks -------------------------------------------------------------- */

typedef struct vans {
  uint64_t seq;
  char id[128];
  char key[64];
  int64_t at_ms; /* wall clock */
} vans;

typedef struct vrec {
  char id[128];
  uint64_t answers;          /* callers' answers it gave */
  uint64_t passed, lost, undecided, canaries, canaries_failed;
  unsigned in_row;           /* passed checks in a row */
  unsigned strikes;          /* lost votes and wrong canaries since it last had a record */
  int inflight;              /* checks about it undecided */
  int owes;                  /* it lost: its next answer is checked (and it is held) */
  int quarantined;
  int64_t quarantined_at, last_pass_at;
  cJSON *evidence;           /* its failed checks, newest last (at most VERIFY_EVIDENCE_MAX) */
  vans *since;               /* answers since its last passed check, oldest first */
  size_t n_since, cap_since;
  uint64_t since_dropped;    /* older ones that did not fit */
  uint64_t seq;              /* of its last answer */
  uint64_t next_canary_ms;   /* 0: not planned yet */
  int64_t released_at;       /* an operator's last release (wall clock; 0: none) */
  char verdict_by[64];       /* the gateway whose quarantine or release this is ("": this one) */
  struct vrec *next;
} vrec;

enum { CHECK_CROSS = 0, CHECK_CANARY };
enum { LEG_WAIT = 0, LEG_OK, LEG_FAILED };

typedef struct vcheck vcheck;

typedef struct vleg {
  vcheck *c;
  char replica[128];
  char rid[128];
  int state;
  pr_buf text;
  pr_buf sse;                /* a streamed shadow's bytes */
  int streamed;
  gw_sink *sink;             /* its job's, while it runs */
} vleg;

typedef struct vcanary {
  char *model;
  char *body;                /* the request, rendered */
  char *expect;              /* NULL: expect_regex */
  char *pattern;
  regex_t re;
  int has_re;
  char name[64];
} vcanary;

struct vcheck {
  gw_server *gw;
  uint64_t no;
  int kind;
  char subject[128];         /* the phone checked */
  char origin[128];          /* the caller's request whose prompt it is, or the canary's name */
  char path[32];
  char model[128];
  char *body;                /* the shadow request */
  uint64_t scope;
  uint64_t since_mark;       /* the subject's answers up to here are cleared by a pass */
  vleg leg[3];               /* 0 the subject, 1 the witness, 2 the tie-breaker */
  int nleg;
  int voting;
  int fresh;                 /* asked again after a lost vote or a wrong canary, with
                                "cache_prompt": false: decides whether the phone is charged */
  int starting;              /* its legs are being sent: decided once all are out */
  double in_tok, out_tok;    /* the caller's request's prompt and answer tokens (a witness's
                                speed is judged on them) */
  double leg_cost_s;         /* a leg's phone time, as the caller's attempt took (the budget
                                counts the legs still running at that) */
  char *expect, *pattern;   /* CHECK_CANARY: what its answer must begin with, or match */
  int ended;
  vcheck *next;
};

struct gw_verify {
  gw_server *gw;
  vrec *recs;
  pr_idmap by_id; /* the records above by phone id: a witness is chosen from every phone,
                   * and each looks up its record (a scan of them all cost O(phones^2)) */
  vcheck *checks;
  size_t n_checks;
  uint64_t next_no;
  vcanary *canaries;
  size_t n_canaries;
  /* the records kept in data_dir (see "kept across restarts" below) */
  char *path;                /* data_dir/verify.json; NULL: memory only */
  int dirty;                 /* changed since the last write */
  int saving;                /* a write is under way on the thread pool */
  int save_rc;
  char *save_text;
  uint64_t next_save_ms;
  uv_work_t work;
};

static void save_soon(gw_verify *v, int now);
static void save_now(gw_verify *v);
static void release(gw_server *gw, vrec *rec, const char *who, const char *by, int64_t at);

static double rand01(void) {
  uint32_t v = 0;
  if (RAND_bytes((unsigned char *)&v, sizeof(v)) != 1) v = (uint32_t)rand();
  return (double)v / 4294967296.0;
}

static vrec *rec_find(gw_verify *v, const char *id) { return pr_idmap_get_str(&v->by_id, id); }

static vrec *rec_get(gw_verify *v, const char *id) {
  vrec *r = rec_find(v, id);
  if (r) return r;
  r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  snprintf(r->id, sizeof(r->id), "%s", id);
  if (pr_idmap_put_str(&v->by_id, r->id, r) < 0) {
    free(r);
    return NULL;
  }
  r->next = v->recs;
  v->recs = r;
  return r;
}

static int rec_trusted(const gw_config *c, const vrec *r) {
  return r->in_row >= (unsigned)c->verify_trust_after && !r->owes && !r->strikes;
}

/* A faker fails its first check and is held after verify.ahead answers, as it always was;
 * an honest newcomer, held while a slower witness answers, is held less often as it earns
 * its record: after ahead x (1 + passes in a row)^2 answers (on a fresh fleet every phone
 * is a newcomer, and its checks are a check of two shadow requests every few answers:
 * growing by the square, one in its first 17 answers instead of two). */
size_t gw_verify_hold_after(int ahead, unsigned passed_in_row, unsigned strikes) {
  size_t row = strikes ? 0 : passed_in_row;
  return (size_t)(ahead > 0 ? ahead : 1) * (1 + row) * (1 + row);
}

/* Its answers since its last pass, those no longer listed (VERIFY_SINCE_MAX) too. */
static size_t since_count(const vrec *r) { return r->n_since + r->since_dropped; }

static size_t hold_after(const gw_config *c, const vrec *r) {
  return gw_verify_hold_after(c->verify_ahead, r->in_row, r->strikes);
}

/* Hold a phone without a record while a check of it is undecided and it answered enough
 * since its last pass, and one that owes a check until it is decided. */
static void rec_hold(gw_server *gw, vrec *rec) {
  gw_replica *r = gw_registry_find(gw, rec->id);
  if (!r) return;
  const gw_config *c = gw->conf;
  int hold = rec->inflight > 0 &&
             (rec->owes || (!rec_trusted(c, rec) && since_count(rec) >= hold_after(c, rec)));
  if (gw_replica_held_set(r, GW_HELD_CHECK, hold)) {
    if (!hold) gw_plan_soon(gw);
  }
}

static void since_add(vrec *rec, const char *id, const char *key, int64_t at) {
  if (rec->n_since == VERIFY_SINCE_MAX) {
    memmove(rec->since, rec->since + 1, (rec->n_since - 1) * sizeof(*rec->since));
    rec->n_since--;
    rec->since_dropped++;
  }
  if (rec->n_since == rec->cap_since) {
    size_t cap = rec->cap_since ? rec->cap_since * 2 : 16;
    vans *n = realloc(rec->since, cap * sizeof(*n));
    if (!n) return;
    rec->since = n;
    rec->cap_since = cap;
  }
  vans *a = &rec->since[rec->n_since++];
  a->seq = ++rec->seq;
  snprintf(a->id, sizeof(a->id), "%s", id);
  snprintf(a->key, sizeof(a->key), "%s", key ? key : "");
  a->at_ms = at;
}

/* A pass clears the answers given before its check began. */
static void since_clear(vrec *rec, uint64_t mark) {
  size_t k = 0;
  for (size_t i = 0; i < rec->n_since; i++)
    if (rec->since[i].seq > mark) rec->since[k++] = rec->since[i];
  rec->n_since = k;
  rec->since_dropped = 0;
}

static void excerpt(cJSON *o, const char *k, const pr_buf *t) {
  char buf[VERIFY_EXCERPT + 1];
  size_t n = t->len < VERIFY_EXCERPT ? t->len : VERIFY_EXCERPT;
  while (n > 0 && n < t->len && ((unsigned char)t->data[n] & 0xC0) == 0x80) n--; /* whole UTF-8 */
  if (n) memcpy(buf, t->data, n);
  buf[n] = '\0';
  cJSON_AddStringToObject(o, k, buf);
}

static void log_check(const vcheck *c, const char *outcome, const char *who) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", "verify_check");
  cJSON_AddNumberToObject(f, "check", (double)c->no);
  cJSON_AddStringToObject(f, "kind", c->kind == CHECK_CANARY ? "canary" : "cross");
  cJSON_AddStringToObject(f, "replica", c->subject);
  cJSON_AddStringToObject(f, "request_id", c->origin);
  cJSON_AddStringToObject(f, "outcome", outcome);
  if (who) cJSON_AddStringToObject(f, "charged", who);
  for (int i = 0; i < c->nleg; i++) {
    char k[32];
    snprintf(k, sizeof(k), "shadow_%d", i);
    if (c->leg[i].rid[0]) cJSON_AddStringToObject(f, k, c->leg[i].rid);
  }
  pr_log_kv(PR_LOG_INFO, "answer check", f);
}

/* The replica of rec's id (if it is in the registry) quarantined; the event and the log
 * line say which gateway decided (by: NULL this one). */
static void quarantine_replica(gw_server *gw, vrec *rec, const char *by) {
  gw_replica *r = gw_registry_find(gw, rec->id);
  char msg[384];
  if (by)
    snprintf(msg, sizeof(msg),
             "%s quarantined by gateway %s: %u of its answers disagreed with other phones' (no work "
             "until an operator releases it)", rec->id, by, rec->strikes);
  else
    snprintf(msg, sizeof(msg),
             "%s quarantined: %u of its answers disagreed with other phones' (no work until an "
             "operator releases it; its %zu answers since its last passed check are listed)",
             rec->id, rec->strikes, rec->n_since);
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", "replica_quarantined");
  cJSON_AddStringToObject(f, "replica", rec->id);
  cJSON_AddNumberToObject(f, "strikes", rec->strikes);
  cJSON_AddNumberToObject(f, "answers_since_pass", (double)rec->n_since);
  if (by) cJSON_AddStringToObject(f, "by_gateway", by);
  pr_log_kv(PR_LOG_WARN, "replica quarantined", f);
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "replica", rec->id);
  cJSON_AddStringToObject(e, "to", "quarantined");
  gw_events_add(gw, "replica_quarantined", msg, e);
  if (r) {
    const char *old = gw_replica_display_state(r);
    gw_replica_held_set(r, GW_HELD_QUARANTINED, 1);
    gw_replica_held_set(r, GW_HELD_CHECK, 0);
    gw_registry_event(gw, r, old);
  }
  gw_plan_soon(gw);
}

static void quarantine(gw_server *gw, vrec *rec) {
  if (rec->quarantined) return;
  rec->quarantined = 1;
  rec->quarantined_at = pr_clock_wall_ms();
  rec->verdict_by[0] = '\0';
  gw->vfy.stats.quarantines++;
  quarantine_replica(gw, rec, NULL);
  save_soon(gw->vfy.state, 1);
  if (gw->verdict) gw->verdict(gw, rec->id); /* the other gateways (Redis) */
}

/* rec failed a check (a lost vote, a wrong canary): the evidence, and perhaps quarantine. */
/* Charged only on a fresh check (asked again without the phone's prompt cache): an engine
 * that reused a cached prefix may compute the same prompt with other batch sizes, and
 * greedy decoding can part on a near-tie (llama-server says so of cache_prompt); the
 * check before it only made the phone owe this one. */
static void charge(gw_server *gw, vrec *rec, const vcheck *c, int leg, const pr_buf *majority,
                   const char *why) {
  /* a check still running when its phone was quarantined (here or by another gateway)
   * adds nothing: the verdict is the one made and shared, with its evidence, and every
   * gateway shows the same until the operator releases the phone */
  if (rec->quarantined) return;
  rec->strikes++;
  rec->in_row = 0;
  rec->owes = 1;
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddNumberToObject(ev, "check", (double)c->no);
  cJSON_AddStringToObject(ev, "kind", c->kind == CHECK_CANARY ? "canary" : "vote");
  cJSON_AddStringToObject(ev, "why", why);
  cJSON_AddStringToObject(ev, "request_id", c->origin);
  cJSON *ids = cJSON_AddArrayToObject(ev, "shadow_request_ids");
  for (int i = 0; i < c->nleg; i++)
    if (c->leg[i].rid[0]) cJSON_AddItemToArray(ids, cJSON_CreateString(c->leg[i].rid));
  cJSON_AddStringToObject(ev, "its_request_id", c->leg[leg].rid[0] ? c->leg[leg].rid : c->origin);
  excerpt(ev, "its_answer", &c->leg[leg].text);
  if (majority) excerpt(ev, "majority_answer", majority);
  else if (c->expect) cJSON_AddStringToObject(ev, "expected", c->expect);
  else if (c->pattern) cJSON_AddStringToObject(ev, "expected_regex", c->pattern);
  cJSON *by = cJSON_AddArrayToObject(ev, "majority");
  for (int i = 0; i < c->nleg; i++)
    if (i != leg && c->leg[i].replica[0] && majority) cJSON_AddItemToArray(by, cJSON_CreateString(c->leg[i].replica));
  cJSON_AddNumberToObject(ev, "at_ms", (double)pr_clock_wall_ms());
  if (!rec->evidence) rec->evidence = cJSON_CreateArray();
  if (cJSON_GetArraySize(rec->evidence) >= VERIFY_EVIDENCE_MAX) cJSON_DeleteItemFromArray(rec->evidence, 0);
  cJSON_AddItemToArray(rec->evidence, ev);
  save_soon(gw->vfy.state, 0);
  if (rec->strikes >= (unsigned)gw->conf->verify_quarantine_after) quarantine(gw, rec);
}

static void pass(gw_server *gw, vrec *rec, uint64_t mark) {
  rec->passed++;
  rec->in_row++;
  rec->owes = 0;
  rec->last_pass_at = pr_clock_wall_ms();
  if (rec->in_row >= (unsigned)gw->conf->verify_trust_after) rec->strikes = 0; /* a record again */
  since_clear(rec, mark);
  save_soon(gw->vfy.state, 0);
}

/* ---- shadow requests --------------------------------------------------------------- */

static void check_step(vcheck *c);

static int sse_event(void *ud, const pr_sse_event *ev) {
  vleg *l = ud;
  if (strcmp(ev->data, "[DONE]") == 0) return 0;
  cJSON *root = cJSON_ParseWithLength(ev->data, ev->data_len);
  const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
  int rc = c ? choice_text(c, &l->text) : 0;
  if (cJSON_GetObjectItemCaseSensitive(root, "error")) rc = PR_EPARSE; /* an error event */
  cJSON_Delete(root);
  return rc;
}

static vleg *leg_take(gw_sink *s) {
  vleg *l = s->ctx;
  s->ops = NULL;
  s->ctx = NULL;
  l->sink = NULL;
  return l;
}

static void leg_end(vleg *l, int ok) {
  l->state = ok ? LEG_OK : LEG_FAILED;
  check_step(l->c);
}

static int vs_stream_start(gw_sink *s, const char *const *h, const char *ct) {
  (void)h, (void)ct;
  vleg *l = s->ctx;
  l->streamed = 1;
  return 0;
}
static int vs_write(gw_sink *s, const char *d, size_t n) {
  vleg *l = s->ctx;
  pr_buf_bytes(&l->sse, d, n); /* past its cap the rest is dropped: its start is compared */
  return 0;
}
static int vs_behind(gw_sink *s) {
  (void)s;
  return 0;
}
static int vs_stream_end(gw_sink *s) {
  vleg *l = leg_take(s);
  pr_sse_parser p;
  pr_sse_init(&p, VERIFY_TEXT_MAX, sse_event, NULL, l);
  int rc = pr_sse_feed(&p, l->sse.data ? l->sse.data : "", l->sse.len);
  if (rc == 0) rc = pr_sse_feed(&p, "\n\n", 2);
  pr_sse_free(&p);
  pr_buf_free(&l->sse);
  leg_end(l, rc == 0);
  return 0;
}
static int vs_respond(gw_sink *s, int status, const char *const *hdrs, const char *ctype,
                      const char *body, size_t len) {
  (void)hdrs, (void)ctype;
  vleg *l = leg_take(s);
  int ok = status == 200 && gw_verify_answer_text(body, len, &l->text) == 0;
  leg_end(l, ok);
  return 0;
}
static void vs_abort(gw_sink *s) { leg_end(leg_take(s), 0); }
static void vs_close(gw_sink *s) { leg_end(leg_take(s), 0); }
static const gw_sink_ops shadow_sink_ops = {
  vs_stream_start, vs_write, vs_behind, vs_stream_end, vs_respond, vs_abort, vs_close,
};

/* Send the check's request to r as leg i. The leg may be answered (failed) before this
 * returns. */
static void leg_start(vcheck *c, int i, const char *replica) {
  gw_server *gw = c->gw;
  vleg *l = &c->leg[i];
  l->c = c;
  l->state = LEG_WAIT;
  pr_buf_init(&l->text, VERIFY_TEXT_MAX);
  pr_buf_init(&l->sse, VERIFY_SSE_MAX);
  snprintf(l->replica, sizeof(l->replica), "%s", replica);
  gw_request_id(gw, NULL, l->rid, sizeof(l->rid));
  if (i + 1 > c->nleg) c->nleg = i + 1;
  gw->vfy.stats.shadows++;
  gw_job_line jl = {
    .path = c->path, .body = c->body, .len = strlen(c->body), .caller = NULL,
    .deadline_ms = uv_now(gw->loop) + (uint64_t)(gw->conf->verify_timeout_s * 1000.0),
    .id = l->rid, .ops = &shadow_sink_ops, .ctx = l, .shadow = 1, .pin = replica,
    .cache_scope = c->scope,
  };
  gw_sink *s = gw_job_start_line(gw, &jl);
  if (l->state == LEG_WAIT) l->sink = s;
}

static void check_free(vcheck *c) {
  for (int i = 0; i < 3; i++) {
    pr_buf_free(&c->leg[i].text);
    pr_buf_free(&c->leg[i].sse);
  }
  free(c->body);
  free(c->expect);
  free(c->pattern);
  free(c);
}

static void check_end(vcheck *c) {
  gw_verify *v = c->gw->vfy.state;
  c->ended = 1;
  vrec *rec = rec_find(v, c->subject);
  if (rec && rec->inflight > 0) rec->inflight--;
  for (vcheck **pp = &v->checks; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      v->n_checks--;
      break;
    }
  if (rec) rec_hold(c->gw, rec);
}

/* A phone to witness a check: serves the model, takes work, not quarantined, not owing a
 * check, not among `not`. Phones with a record (trust_after passes in a row) first: the
 * one that would answer the check's request (in_tok prompt and out_tok answer tokens)
 * soonest at its learned speed, after its wait for a slot (within 5 %, at random), since a
 * slow witness keeps the check undecided, and the phone checked held, for longer; then a
 * phone without a strike whose last check passed, at random; then any, at random. NULL:
 * none. */
static gw_replica *witness(gw_server *gw, const char *model, const char *const *not, int n_not,
                           double in_tok, double out_tok) {
  gw_verify *v = gw->vfy.state;
  gw_replica *best = NULL;
  double best_score = -1, best_t = 0;
  uint64_t now = uv_now(gw->loop);
  for (size_t i = 0; i < gw->n_replicas; i++) {
    gw_replica *r = gw->replicas[i];
    int skip = r->state != GW_REPLICA_READY || gw_replica_draining(r) || !gw_replica_serves(r, model) ||
               gw_replica_capacity_checked(r, uv_now(gw->loop)) == 0;
    for (int k = 0; !skip && k < n_not; k++) skip = not[k] && strcmp(not[k], r->id) == 0;
    if (skip) continue;
    vrec *rec = rec_find(v, r->id);
    if (rec && (rec->quarantined || rec->owes)) continue;
    /* three tiers: phones with a record, then phones without a strike whose last check
     * passed, then the rest. Speed is judged among phones with a record only: a faker answers at
     * once, and ids that agree on their fakes pass checks of each other. The others at
     * random within their tier, not by the longest record: with every phone a newcomer,
     * the one ahead by chance (a budget phone, in a B2 cell) witnessed 46 of 100 shadows,
     * its long answers holding the flagships it checked */
    unsigned cap = (unsigned)gw->conf->verify_trust_after, row = rec && !rec->strikes ? rec->in_row : 0;
    double score = row >= cap ? 2.0 : row >= 1 ? 1.0 + rand01() * 0.5 : rand01() * 0.5;
    double t = (double)gw_replica_wait_ms(r, now) / 1000.0 +
               (r->prefill_tps > 0 ? in_tok / r->prefill_tps : in_tok) +
               (r->decode_tps > 0 ? out_tok / r->decode_tps : out_tok);
    t *= 0.95 + 0.1 * rand01();
    if (score > best_score || (score == best_score && t < best_t)) {
      best_score = score;
      best_t = t;
      best = r;
    }
  }
  return best;
}

/* Whether the phones x and y, agreeing against `loser`, may charge it: each passed more
 * checks in a row than it, or it lost before (a strike). */
static int credible(gw_verify *v, const char *x, const char *y, const vrec *loser) {
  if (loser->strikes) return 1;
  const vrec *a = rec_find(v, x), *b = rec_find(v, y);
  unsigned need = loser->in_row;
  return a && b && a->in_row > need && b->in_row > need;
}

/* Phones that could take part in a check of model now: a disagreement needs a third phone
 * to be decided, so with fewer than three no check is made (it could accuse nobody). */
static int enough_phones(gw_server *gw, const char *model) {
  int n = 0;
  for (size_t i = 0; i < gw->n_replicas && n < 3; i++) {
    const gw_replica *r = gw->replicas[i];
    n += r->state == GW_REPLICA_READY && !gw_replica_draining(r) && gw_replica_serves(r, model);
  }
  return n >= 3;
}

static const char *leg_text(const vcheck *c, int i) {
  return c->leg[i].text.data ? c->leg[i].text.data : "";
}

/* body with "cache_prompt": false (NULL out of memory). */
static char *body_fresh(const char *body) {
  cJSON *b = cJSON_Parse(body);
  if (!b) return NULL;
  cJSON_DeleteItemFromObjectCaseSensitive(b, "cache_prompt");
  cJSON_AddBoolToObject(b, "cache_prompt", 0);
  char *out = cJSON_PrintUnformatted(b);
  cJSON_Delete(b);
  return out;
}

static void canary_begin(gw_server *gw, vrec *rec, char *body, const char *expect, const char *pattern,
                         const char *name, const char *model, int fresh);

static void canary_decide(vcheck *c, vrec *rec) {
  gw_server *gw = c->gw;
  const char *t = leg_text(c, 0);
  int ok;
  if (c->expect) {
    /* the answer begins with the expected words (a cap may cut it after them) */
    int words = 0;
    const char *p = c->expect, *s;
    while (next_word(&p, &s)) words++;
    ok = gw_verify_agree(t, c->expect, words > 0 ? words : 1);
  } else {
    regex_t re;
    if (!c->pattern || regcomp(&re, c->pattern, REG_EXTENDED | REG_NOSUB) != 0) {
      gw->vfy.stats.undecided++; /* checked when loaded: only out of memory */
      return;
    }
    ok = regexec(&re, t, 0, NULL, 0) == 0;
    regfree(&re);
  }
  rec->canaries++;
  gw->vfy.stats.canaries++;
  if (ok) {
    pass(gw, rec, c->since_mark);
    log_check(c, "canary_passed", NULL);
  } else if (!c->fresh) {
    /* asked again at once without its prompt cache: that answer decides */
    rec->owes = 1;
    log_check(c, "canary_wrong_asking_again", NULL);
  } else {
    rec->canaries_failed++;
    gw->vfy.stats.canaries_failed++;
    charge(gw, rec, c, 0, NULL, "a wrong answer to a canary, asked twice");
    log_check(c, "canary_failed", rec->id);
  }
}

/* A check's legs answered: compare, vote, charge or pass. */
static void check_step(vcheck *c) {
  if (c->ended || c->starting) return;
  for (int i = 0; i < c->nleg; i++)
    if (c->leg[i].state == LEG_WAIT) return;
  gw_server *gw = c->gw;
  gw_verify *v = gw->vfy.state;
  vrec *rec = rec_find(v, c->subject);
  int recheck = 0, recanary = 0;
  int failed = 0;
  for (int i = 0; i < c->nleg; i++) failed |= c->leg[i].state == LEG_FAILED;
  if (!rec || failed) {
    /* a shadow was not answered (a phone's failure, the deadline, a refusal): nobody is
     * accused on it */
    gw->vfy.stats.undecided++;
    if (rec) rec->undecided++;
    log_check(c, "undecided", NULL);
    goto done;
  }
  if (c->kind == CHECK_CANARY) {
    canary_decide(c, rec);
    recanary = !c->fresh && rec->owes && !rec->quarantined;
    goto done;
  }
  int words = gw->conf->verify_compare_words;
  if (!c->voting) {
    gw->vfy.stats.checks++;
    if (gw_verify_agree(leg_text(c, 0), leg_text(c, 1), words)) {
      gw->vfy.stats.agreed++;
      pass(gw, rec, c->since_mark);
      log_check(c, "agreed", NULL);
      goto done;
    }
    gw->vfy.stats.disagreed++;
    /* a third phone decides; the subject takes no work meanwhile */
    const char *not[2] = {c->leg[0].replica, c->leg[1].replica};
    gw_replica *t = witness(gw, c->model, not, 2, c->in_tok, c->out_tok);
    if (!t) {
      gw->vfy.stats.undecided++;
      rec->undecided++;
      log_check(c, "disagreed_no_third_phone", NULL);
      goto done;
    }
    c->voting = 1;
    gw->vfy.stats.votes++;
    rec->owes = 1;
    rec_hold(gw, rec);
    /* its leg may fail before leg_start returns (e.g. the witness cannot take it): the
     * check is decided after, never inside, the call that still holds it */
    c->starting = 1;
    leg_start(c, 2, t->id);
    c->starting = 0;
    check_step(c); /* decides now if the tie-breaker already answered, else when it does */
    return;
  }
  int a2 = gw_verify_agree(leg_text(c, 0), leg_text(c, 2), words);
  int b2 = gw_verify_agree(leg_text(c, 1), leg_text(c, 2), words);
  /* a majority accuses only when both of its phones have a better record than the phone
   * it accuses (or that one lost before): newcomers that answer alike (one
   * owner's ids) cannot outvote a phone that passed more checks */
  if (b2 && !a2 && !credible(v, c->leg[1].replica, c->leg[2].replica, rec)) {
    gw->vfy.stats.undecided++;
    rec->undecided++;
    log_check(c, "no_credible_majority", NULL);
    goto done;
  }
  if (a2 && !b2) {
    vrec *w = rec_find(v, c->leg[1].replica);
    if (w && !credible(v, c->leg[0].replica, c->leg[2].replica, w)) {
      gw->vfy.stats.undecided++;
      rec->undecided++;
      log_check(c, "no_credible_majority", NULL);
      goto done;
    }
  }
  if (b2 && !a2 && c->fresh) {
    gw->vfy.stats.votes_lost++;
    rec->lost++;
    charge(gw, rec, c, 0, &c->leg[1].text,
           "lost a vote twice, the second time without its prompt cache: two other phones agreed on another answer");
    log_check(c, "vote_lost", rec->id);
    recheck = 1;
  } else if (b2 && !a2) {
    /* asked again at once, without the phone's prompt cache: that vote decides */
    rec->owes = 1;
    log_check(c, "vote_lost_asking_again", NULL);
    recheck = 1;
  } else if (a2 && !b2) {
    /* the witness was the odd one: it owes a check of its own (nobody is charged on a
     * phone's side of another's check), and the subject passed */
    vrec *w = rec_get(v, c->leg[1].replica);
    if (w) {
      w->owes = 1;
      rec_hold(gw, w);
    }
    pass(gw, rec, c->since_mark);
    log_check(c, "witness_disagreed", NULL);
  } else {
    /* no majority (or all three agree after all): nobody is accused */
    gw->vfy.stats.undecided++;
    rec->undecided++;
    if (a2 && b2) pass(gw, rec, c->since_mark);
    log_check(c, a2 && b2 ? "agreed_on_vote" : "no_majority", NULL);
    if (!(a2 && b2)) rec->owes = 0;
  }
done:
  check_end(c);
  /* a phone that lost (and is not quarantined) is checked again at once */
  if (recheck && rec && rec->owes && !rec->quarantined && !gw->shutting_down) {
    vcheck *again = NULL;
    if (v->n_checks < VERIFY_CHECKS_MAX && (again = calloc(1, sizeof(*again)))) {
      again->gw = gw;
      again->no = ++v->next_no;
      again->kind = CHECK_CROSS;
      snprintf(again->subject, sizeof(again->subject), "%s", c->subject);
      snprintf(again->origin, sizeof(again->origin), "%s", c->origin);
      snprintf(again->path, sizeof(again->path), "%s", c->path);
      snprintf(again->model, sizeof(again->model), "%s", c->model);
      again->scope = c->scope;
      again->since_mark = rec->seq;
      again->leg_cost_s = c->leg_cost_s;
      again->in_tok = c->in_tok;
      again->out_tok = c->out_tok;
      again->fresh = 1;
      again->body = body_fresh(c->body);
      const char *not[1] = {c->subject};
      gw_replica *w = witness(gw, again->model, not, 1, c->in_tok, c->out_tok);
      if (!w || !again->body) {
        free(again->body);
        free(again);
        again = NULL;
      } else {
        again->next = v->checks;
        v->checks = again;
        v->n_checks++;
        rec->inflight++;
        rec_hold(gw, rec);
        again->starting = 1;
        leg_start(again, 0, again->subject);
        leg_start(again, 1, w->id);
        again->starting = 0;
        check_step(again);
      }
    }
  }
  if (recanary && !gw->shutting_down && v->n_checks < VERIFY_CHECKS_MAX) {
    char *b = body_fresh(c->body);
    if (b) canary_begin(gw, rec, b, c->expect, c->pattern, c->origin, c->model, 1);
  }
  check_free(c);
}

/* ---- which answers are checked ------------------------------------------------------- */

/* The shadow request for j: its body as sent, under deterministic decoding (temperature 0:
 * greedy; the caller's seed, if any, is kept), with the caller's own cache_prompt. With
 * cap > 0 (both sides of the check are shadows, verify.shadow_max_tokens) it decodes at most
 * cap tokens: every name of the token cap the body holds is lowered to it, so whichever
 * the engine honours stops both shadows at the same token -- only the first
 * verify.compare_words words are compared, and a chat's or a thinking model's hundreds of
 * tokens after them were decoded twice for nothing. */
static char *shadow_body(const gw_job *j, int64_t cap) {
  cJSON *b = cJSON_Duplicate(j->oai.root, 1);
  if (!b) return NULL;
  if (cap > 0 && cap < j->oai.max_tokens) { /* (job_fit gave every request a cap) */
    pr_oai_req shadow = {.root = b};
    pr_oai_set_max_tokens(&shadow, cap);
  }
  cJSON_DeleteItemFromObjectCaseSensitive(b, "temperature");
  cJSON_AddNumberToObject(b, "temperature", 0);
  cJSON_DeleteItemFromObjectCaseSensitive(b, "cache_prompt");
  if (j->oai.cache_orig) cJSON_AddItemToObject(b, "cache_prompt", cJSON_Duplicate(j->oai.cache_orig, 1));
  char *s = cJSON_PrintUnformatted(b);
  cJSON_Delete(b);
  return s;
}

static int deterministic(const gw_job *j) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j->oai.root, "temperature");
  return cJSON_IsNumber(t) && t->valuedouble == 0;
}

/* The token cap of j's shadows (0: the caller's own): a sampled request's shadow pair
 * decodes at most verify.shadow_max_tokens each, never fewer than twice the words compared.
 * Not a deterministic request's (a stream's pair: a cap the caller did not send would tell
 * its shadows from its own request, which has the same temperature), nor tools' or a
 * response format's, which builds may parse differently once cut. */
static int64_t shadow_cap(const gw_config *c, const gw_job *j) {
  if (deterministic(j) || cJSON_GetObjectItemCaseSensitive(j->oai.root, "tools") ||
      cJSON_GetObjectItemCaseSensitive(j->oai.root, "response_format"))
    return 0;
  int64_t cap = c->verify_shadow_max_tokens, least = 2 * (int64_t)c->verify_compare_words;
  return cap > 0 && cap < least ? least : cap;
}

/* Whether the budget allows a check costing cost_s of phone time now. */
static int budget_allows(gw_server *gw, vrec *rec, double cost_s) {
  const gw_config *c = gw->conf;
  uint64_t now = uv_now(gw->loop);
  /* the legs still running count at their estimate (their time is noted as they end):
   * without them, checks started together would all see the same budget left */
  double running = 0;
  for (vcheck *k = gw->vfy.state->checks; k; k = k->next)
    for (int i = 0; i < k->nleg; i++)
      if (k->leg[i].state == LEG_WAIT) running += k->leg_cost_s;
  double left = gw_hedge_budget_left(&gw->vfy.ledger, now, c->verify_budget, running, running);
  if (cost_s <= left) return 1;
  /* phones without a record are checked beyond it, a few at once */
  size_t untrusted = 0;
  for (vcheck *k = gw->vfy.state->checks; k; k = k->next) {
    vrec *r = rec_find(gw->vfy.state, k->subject);
    if (r && !rec_trusted(c, r)) untrusted++;
  }
  return !rec_trusted(c, rec) && untrusted < (size_t)c->verify_min_running;
}

static void answered(gw_server *gw, gw_job *j, const char *replica_id, const char *body, size_t len) {
  gw_verify *v = gw->vfy.state;
  const gw_config *c = gw->conf;
  if (!v) return;
  vrec *rec = rec_get(v, replica_id);
  if (!rec) return;
  rec->answers++;
  since_add(rec, j->id, j->caller && j->caller->name ? j->caller->name : NULL, pr_clock_wall_ms());
  v->dirty = 1; /* written with the next change of record, or within VERIFY_SAVE_MS */
  if (!c->verify_enabled || rec->quarantined || gw->shutting_down) {
    rec_hold(gw, rec);
    return;
  }
  double rate = gw_verify_rate(rec->in_row, rec->passed, rec->owes, c->verify_trust_after,
                               c->verify_newcomer_rate, c->verify_min_rate);
  /* a phone without a record that has given its hold_after answers since its last passed
   * check, none of them being checked, is checked now, whatever the draw and the budget:
   * else, while other phones' checks fill verify.min_running, it answers on unchecked
   * (a faker answering at once takes most of the work meanwhile) */
  int due = !rec_trusted(c, rec) && rec->inflight == 0 && since_count(rec) >= hold_after(c, rec);
  /* a phone with a check of it undecided is not checked twice at once, unless it owes one */
  int go = (rec->inflight == 0 || (rec->owes && rec->inflight < 2)) && (due || rand01() < rate) &&
           v->n_checks < VERIFY_CHECKS_MAX && enough_phones(gw, j->oai.model);
  /* a whole answer is told of with its attempt running; a stream once it ended, its
   * attempt's figures gone with it (a second's work, its tokens unknown) */
  const gw_attempt *a = body ? gw_job_running(j) : NULL;
  double cost_s = a ? (double)(uv_now(gw->loop) - a->start_ms) / 1000.0 : 1.0;
  double in_tok = a && a->prompt_tokens > 0 ? (double)a->prompt_tokens : 0;
  double out_tok = a && a->completion_tokens > 0 ? (double)a->completion_tokens : 0;
  int reuse = deterministic(j) && body && !j->oai.stream;
  /* capped shadows cost the answer's prefill as planned and that share of its decoding,
   * each choice of several capped alike (looked at only for an answer to check) */
  int64_t cap = go ? shadow_cap(c, j) : 0;
  int n_choices = j->oai.choices > 1 ? j->oai.choices : 1;
  if (a && cap > 0 && out_tok > (double)(cap * n_choices)) {
    double pre = a->pred_prefill_s > 0 && a->pred_prefill_s < cost_s ? a->pred_prefill_s : 0;
    cost_s = pre + (cost_s - pre) * (double)(cap * n_choices) / out_tok;
    out_tok = (double)(cap * n_choices);
  }
  gw_replica *w = NULL;
  if (go) {
    const char *not[1] = {replica_id};
    w = witness(gw, j->oai.model, not, 1, in_tok, out_tok);
    go = w && (due || budget_allows(gw, rec, cost_s * (reuse ? 1 : 2)));
  }
  vcheck *k = go ? calloc(1, sizeof(*k)) : NULL;
  if (k) k->body = shadow_body(j, cap);
  if (!k || !k->body) {
    free(k);
    rec_hold(gw, rec);
    return;
  }
  k->gw = gw;
  k->no = ++v->next_no;
  k->kind = CHECK_CROSS;
  snprintf(k->subject, sizeof(k->subject), "%s", replica_id);
  snprintf(k->origin, sizeof(k->origin), "%s", j->id);
  snprintf(k->path, sizeof(k->path), "%s", j->path);
  snprintf(k->model, sizeof(k->model), "%s", j->oai.model);
  k->scope = j->cache_scope;
  k->since_mark = rec->seq;
  k->leg_cost_s = cost_s;
  k->in_tok = in_tok;
  k->out_tok = out_tok;
  k->next = v->checks;
  v->checks = k;
  v->n_checks++;
  rec->inflight++;
  rec_hold(gw, rec);
  k->starting = 1;
  if (reuse) {
    /* the caller's own answer was deterministic: it is the subject's side */
    vleg *l = &k->leg[0];
    l->c = k;
    pr_buf_init(&l->text, VERIFY_TEXT_MAX);
    snprintf(l->replica, sizeof(l->replica), "%s", replica_id);
    l->state = gw_verify_answer_text(body, len, &l->text) == 0 ? LEG_OK : LEG_FAILED;
    k->nleg = 1;
  } else {
    leg_start(k, 0, replica_id);
  }
  leg_start(k, 1, w->id);
  k->starting = 0;
  check_step(k);
}

/* ---- canaries ------------------------------------------------------------------------ */

static void canaries_free(vcanary *cs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(cs[i].model);
    free(cs[i].body);
    free(cs[i].expect);
    free(cs[i].pattern);
    if (cs[i].has_re) regfree(&cs[i].re);
  }
  free(cs);
}

/* The canaries file: [{"model", "prompt" (a user message) or "messages", "expect" or
 * "expect_regex", "max_tokens" (default 32)}]. */
static int canaries_load(const char *path, vcanary **out, size_t *n_out, char *err, size_t errn) {
  *out = NULL;
  *n_out = 0;
  if (!path) return 0;
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    snprintf(err, errn, "%s: %s", path, strerror(errno));
    return -errno;
  }
  pr_buf text;
  pr_buf_init(&text, 4u << 20);
  char chunk[4096];
  size_t got;
  int rc = 0;
  while (!rc && (got = fread(chunk, 1, sizeof(chunk), fp)) > 0) rc = pr_buf_append(&text, chunk, got);
  fclose(fp);
  pr_json_err je;
  memset(&je, 0, sizeof(je));
  cJSON *root = rc ? NULL : pr_json_parse(text.data ? text.data : "", text.len, 0, &je);
  pr_buf_free(&text);
  if (!root) {
    snprintf(err, errn, "%s: %s", path, rc ? pr_strerror(rc) : je.msg);
    return rc ? rc : PR_EPARSE;
  }
  int n = cJSON_IsArray(root) ? cJSON_GetArraySize(root) : -1;
  if (n < 0 || n > VERIFY_CANARIES_MAX) {
    cJSON_Delete(root);
    snprintf(err, errn, "%s: expected a JSON list of at most %d canaries", path, VERIFY_CANARIES_MAX);
    return PR_ETYPE;
  }
  vcanary *cs = calloc((size_t)(n ? n : 1), sizeof(*cs));
  if (!cs) {
    cJSON_Delete(root);
    return -ENOMEM;
  }
  int i = 0;
  rc = 0;
  for (const cJSON *it = root->child; it && !rc; it = it->next, i++) {
    vcanary *k = &cs[i];
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(it, "model");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(it, "prompt");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(it, "messages");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(it, "expect");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(it, "expect_regex");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(it, "max_tokens");
    snprintf(k->name, sizeof(k->name), "canary %d", i + 1);
    const char *bad = !cJSON_IsObject(it) ? "expected an object"
                      : !cJSON_IsString(m) || !m->valuestring[0] ? "\"model\": expected a model's name"
                      : !(cJSON_IsString(p) && p->valuestring[0]) == !cJSON_IsArray(msgs)
                          ? "expected \"prompt\" (a string) or \"messages\" (a list), one of them"
                      : !!cJSON_IsString(e) == !!cJSON_IsString(re)
                          ? "expected \"expect\" (the answer's first words) or \"expect_regex\", one of them"
                      : mt && !(cJSON_IsNumber(mt) && mt->valuedouble >= 1 && mt->valuedouble <= 4096)
                          ? "\"max_tokens\": expected 1 to 4096"
                          : NULL;
    if (!bad && cJSON_IsString(re)) {
      if (regcomp(&k->re, re->valuestring, REG_EXTENDED | REG_NOSUB) != 0) bad = "\"expect_regex\": not a POSIX extended regular expression";
      else k->has_re = 1;
    }
    if (bad) {
      snprintf(err, errn, "%s: [%d]: %s", path, i, bad);
      rc = PR_ETYPE;
      break;
    }
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", m->valuestring);
    if (msgs) {
      cJSON_AddItemToObject(b, "messages", cJSON_Duplicate(msgs, 1));
    } else {
      cJSON *arr = cJSON_AddArrayToObject(b, "messages");
      cJSON *u = cJSON_CreateObject();
      cJSON_AddStringToObject(u, "role", "user");
      cJSON_AddStringToObject(u, "content", p->valuestring);
      cJSON_AddItemToArray(arr, u);
    }
    cJSON_AddNumberToObject(b, "max_tokens", mt ? floor(mt->valuedouble) : 32);
    cJSON_AddNumberToObject(b, "temperature", 0);
    k->body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    k->model = strdup(m->valuestring);
    if (cJSON_IsString(e)) k->expect = strdup(e->valuestring);
    else k->pattern = strdup(re->valuestring);
    if (!k->body || !k->model || (!k->expect && !k->pattern)) rc = -ENOMEM;
  }
  cJSON_Delete(root);
  if (rc) {
    canaries_free(cs, (size_t)n);
    return rc;
  }
  *out = cs;
  *n_out = (size_t)n;
  return 0;
}

static uint64_t canary_gap_ms(const gw_config *c) {
  return (uint64_t)(c->verify_canary_interval_s * 1000.0 * (0.5 + rand01()));
}

/* A canary check of rec's phone (body is taken). */
static void canary_begin(gw_server *gw, vrec *rec, char *body, const char *expect, const char *pattern,
                         const char *name, const char *model, int fresh) {
  gw_verify *v = gw->vfy.state;
  vcheck *c = calloc(1, sizeof(*c));
  if (c) {
    c->body = body;
    body = NULL;
    c->expect = expect ? strdup(expect) : NULL;
    c->pattern = pattern ? strdup(pattern) : NULL;
  }
  if (!c || (!c->expect && !c->pattern)) {
    free(body);
    if (c) free(c->body), free(c->expect), free(c->pattern);
    free(c);
    return;
  }
  c->gw = gw;
  c->no = ++v->next_no;
  c->kind = CHECK_CANARY;
  c->fresh = fresh;
  snprintf(c->model, sizeof(c->model), "%s", model);
  snprintf(c->subject, sizeof(c->subject), "%s", rec->id);
  snprintf(c->origin, sizeof(c->origin), "%s", name);
  snprintf(c->path, sizeof(c->path), "/v1/chat/completions");
  /* under one of the keys' cache scopes, as callers' requests come (none: the open one) */
  const gw_config *cf = gw->conf;
  c->scope = GW_CACHE_SCOPE_OPEN;
  if (cf->n_keys) {
    const gw_key_conf *kc = &cf->keys[(size_t)(rand01() * (double)cf->n_keys) % cf->n_keys];
    c->scope = kc->scope_id;
  }
  c->since_mark = rec->seq;
  c->next = v->checks;
  v->checks = c;
  v->n_checks++;
  rec->inflight++;
  rec_hold(gw, rec);
  c->starting = 1;
  leg_start(c, 0, rec->id);
  c->starting = 0;
  check_step(c);
}

static void canary_start(gw_server *gw, vrec *rec, const vcanary *k) {
  char *b = strdup(k->body);
  if (b) canary_begin(gw, rec, b, k->expect, k->pattern, k->name, k->model, 0);
}

void gw_verify_tick(gw_server *gw, uint64_t now) {
  gw_verify *v = gw->vfy.state;
  const gw_config *c = gw->conf;
  if (v && v->dirty && now >= v->next_save_ms) save_now(v);
  if (!v || !c->verify_enabled || !v->n_canaries || gw->shutting_down) return;
  for (size_t i = 0; i < gw->n_replicas; i++) {
    gw_replica *r = gw->replicas[i];
    if (r->state != GW_REPLICA_READY || gw_replica_draining(r)) continue;
    vrec *rec = rec_get(v, r->id);
    if (!rec || rec->quarantined) continue;
    if (!rec->next_canary_ms) rec->next_canary_ms = now + canary_gap_ms(c);
    if (now < rec->next_canary_ms || rec->inflight || v->n_checks >= VERIFY_CHECKS_MAX) continue;
    rec->next_canary_ms = now + canary_gap_ms(c);
    /* one of the canaries for a model it serves, at random */
    size_t fit = 0, pick = (size_t)-1;
    for (size_t k = 0; k < v->n_canaries; k++)
      if (gw_replica_serves(r, v->canaries[k].model) && rand01() * (double)++fit < 1.0) pick = k;
    if (pick != (size_t)-1) canary_start(gw, rec, &v->canaries[pick]);
  }
}


/* ---- kept across restarts, and shared ------------------------------------------------ */

/* A record as written to data_dir/verify.json. The answers since its last passed check
 * are written only for a quarantined phone (a listing an operator reads); for the others
 * only their number, which a listing after a restart shows as not listed. */
static cJSON *rec_file_json(const vrec *r) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddNumberToObject(o, "answers", (double)r->answers);
  cJSON_AddNumberToObject(o, "passed", (double)r->passed);
  cJSON_AddNumberToObject(o, "lost", (double)r->lost);
  cJSON_AddNumberToObject(o, "undecided", (double)r->undecided);
  cJSON_AddNumberToObject(o, "canaries", (double)r->canaries);
  cJSON_AddNumberToObject(o, "canaries_failed", (double)r->canaries_failed);
  cJSON_AddNumberToObject(o, "in_row", r->in_row);
  cJSON_AddNumberToObject(o, "strikes", r->strikes);
  cJSON_AddBoolToObject(o, "owes", r->owes);
  cJSON_AddBoolToObject(o, "quarantined", r->quarantined);
  cJSON_AddNumberToObject(o, "quarantined_at", (double)r->quarantined_at);
  cJSON_AddNumberToObject(o, "released_at", (double)r->released_at);
  cJSON_AddNumberToObject(o, "last_pass_at", (double)r->last_pass_at);
  cJSON_AddStringToObject(o, "verdict_by", r->verdict_by);
  if (r->evidence) cJSON_AddItemToObject(o, "evidence", cJSON_Duplicate(r->evidence, 1));
  size_t listed = r->quarantined ? r->n_since : 0;
  cJSON_AddNumberToObject(o, "not_listed", (double)(r->since_dropped + r->n_since - listed));
  cJSON *arr = cJSON_AddArrayToObject(o, "since");
  for (size_t i = 0; i < listed; i++) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "request_id", r->since[i].id);
    cJSON_AddStringToObject(a, "key", r->since[i].key);
    cJSON_AddNumberToObject(a, "at_ms", (double)r->since[i].at_ms);
    cJSON_AddItemToArray(arr, a);
  }
  return o;
}

static double num_of(const cJSON *o, const char *k) {
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(n) && n->valuedouble >= 0 && n->valuedouble < 9e15 ? n->valuedouble : 0;
}

/* The answers listed in o["since" or "answers"] replace rec's. */
static void since_from_json(vrec *rec, const cJSON *arr, double not_listed) {
  rec->n_since = 0;
  rec->since_dropped = (uint64_t)not_listed;
  const cJSON *a;
  cJSON_ArrayForEach(a, arr) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "request_id");
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(a, "key");
    if (!cJSON_IsString(id)) continue;
    since_add(rec, id->valuestring, cJSON_IsString(key) ? key->valuestring : NULL, (int64_t)num_of(a, "at_ms"));
  }
}

static void evidence_from_json(vrec *rec, const cJSON *ev) {
  if (!cJSON_IsArray(ev)) return;
  cJSON_Delete(rec->evidence);
  rec->evidence = cJSON_Duplicate(ev, 1);
  while (rec->evidence && cJSON_GetArraySize(rec->evidence) > VERIFY_EVIDENCE_MAX)
    cJSON_DeleteItemFromArray(rec->evidence, 0);
}

static void rec_from_file(gw_verify *v, const cJSON *o) {
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
  if (!cJSON_IsString(id) || !id->valuestring[0] || strlen(id->valuestring) >= sizeof(((vrec *)0)->id)) return;
  vrec *r = rec_get(v, id->valuestring);
  if (!r) return;
  r->answers = (uint64_t)num_of(o, "answers");
  r->passed = (uint64_t)num_of(o, "passed");
  r->lost = (uint64_t)num_of(o, "lost");
  r->undecided = (uint64_t)num_of(o, "undecided");
  r->canaries = (uint64_t)num_of(o, "canaries");
  r->canaries_failed = (uint64_t)num_of(o, "canaries_failed");
  r->in_row = (unsigned)fmin(num_of(o, "in_row"), 4e9);
  r->strikes = (unsigned)fmin(num_of(o, "strikes"), 4e9);
  r->owes = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "owes"));
  r->quarantined = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "quarantined"));
  r->quarantined_at = (int64_t)num_of(o, "quarantined_at");
  r->released_at = (int64_t)num_of(o, "released_at");
  r->last_pass_at = (int64_t)num_of(o, "last_pass_at");
  const cJSON *by = cJSON_GetObjectItemCaseSensitive(o, "verdict_by");
  snprintf(r->verdict_by, sizeof(r->verdict_by), "%s", cJSON_IsString(by) ? by->valuestring : "");
  evidence_from_json(r, cJSON_GetObjectItemCaseSensitive(o, "evidence"));
  since_from_json(r, cJSON_GetObjectItemCaseSensitive(o, "since"), num_of(o, "not_listed"));
  r->seq = r->n_since ? r->since[r->n_since - 1].seq : 0;
}

static char *file_text(gw_verify *v) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "version", 1);
  cJSON *arr = cJSON_AddArrayToObject(o, "phones");
  for (vrec *r = v->recs; r; r = r->next) cJSON_AddItemToArray(arr, rec_file_json(r));
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

static void save_work(uv_work_t *w) {
  gw_verify *v = w->data;
  v->save_rc = pr_privfile_write(v->path, v->save_text, 1);
}

static void save_done(uv_work_t *w, int status) {
  gw_verify *v = w->data;
  v->saving = 0;
  if (status == 0 && v->save_rc)
    pr_warn("verify: cannot write %s (%s): quarantines and records since then are lost at a restart",
            v->path, strerror(-v->save_rc));
  free(v->save_text);
  v->save_text = NULL;
}

/* Write the records now (on the thread pool) when they changed and no write is under way;
 * a change meanwhile is written by the tick. */
static void save_now(gw_verify *v) {
  if (!v->path || !v->dirty || v->saving) return;
  v->save_text = file_text(v);
  if (!v->save_text) return;
  v->dirty = 0;
  v->work.data = v;
  v->next_save_ms = uv_now(v->gw->loop) + VERIFY_SAVE_MS;
  if (uv_queue_work(v->gw->loop, &v->work, save_work, save_done) == 0) {
    v->saving = 1;
  } else {
    free(v->save_text);
    v->save_text = NULL;
    v->dirty = 1;
  }
}

/* now: a quarantine or a release, written at once; otherwise within VERIFY_SAVE_MS. */
static void save_soon(gw_verify *v, int now) {
  if (!v) return;
  v->dirty = 1;
  if (now) {
    v->next_save_ms = 0;
    save_now(v);
  }
}

static void load(gw_verify *v) {
  cJSON *o;
  pr_json_err je;
  int rc = gw_datafile_load(v->path, (size_t)VERIFY_FILE_MAX + 1, 16, &o, &je);
  if (!rc && !o) return; /* none kept yet */
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "phones");
  if (!cJSON_IsArray(arr)) {
    /* kept aside, not overwritten: an operator may want its quarantines back */
    char aside[4200];
    snprintf(aside, sizeof(aside), "%s.damaged", v->path);
    int moved = rename(v->path, aside) == 0;
    pr_error("%s is damaged (%s): phones' records and quarantines start again%s%s", v->path,
             je.msg[0] ? je.msg : rc ? pr_strerror(rc) : "no \"phones\" list",
             moved ? "; the file is kept as " : "", moved ? aside : "");
    cJSON_Delete(o);
    return;
  }
  size_t n = 0, q = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, arr) {
    rec_from_file(v, it);
    n++;
  }
  for (vrec *r = v->recs; r; r = r->next) q += r->quarantined;
  cJSON_Delete(o);
  pr_info("verify: %zu phones' records kept from before the restart, %zu of them quarantined (%s)", n, q,
          v->path);
}

cJSON *gw_verify_verdict_json(gw_server *gw, const char *id) {
  vrec *r = gw->vfy.state ? rec_find(gw->vfy.state, id) : NULL;
  if (!r || (!r->quarantined && !r->released_at)) return NULL;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "state", r->quarantined ? "quarantined" : "released");
  cJSON_AddNumberToObject(o, "at_ms", (double)(r->quarantined ? r->quarantined_at : r->released_at));
  if (r->quarantined) {
    cJSON_AddNumberToObject(o, "strikes", r->strikes);
    cJSON_AddNumberToObject(o, "last_pass_ms", (double)r->last_pass_at);
    cJSON_AddItemToObject(o, "evidence", r->evidence ? cJSON_Duplicate(r->evidence, 1) : cJSON_CreateArray());
    /* the newest answers, as many as a value in Redis reasonably holds */
    size_t from = r->n_since > VERIFY_SHARED_ANSWERS ? r->n_since - VERIFY_SHARED_ANSWERS : 0;
    cJSON_AddNumberToObject(o, "not_listed", (double)(r->since_dropped + from));
    cJSON *arr = cJSON_AddArrayToObject(o, "answers");
    for (size_t i = from; i < r->n_since; i++) {
      cJSON *a = cJSON_CreateObject();
      cJSON_AddStringToObject(a, "request_id", r->since[i].id);
      cJSON_AddStringToObject(a, "key", r->since[i].key);
      cJSON_AddNumberToObject(a, "at_ms", (double)r->since[i].at_ms);
      cJSON_AddItemToArray(arr, a);
    }
  }
  return o;
}

int gw_verify_apply_verdict(gw_server *gw, const char *id, const cJSON *o, const char *from) {
  gw_verify *v = gw->vfy.state;
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "state");
  if (!v || !cJSON_IsString(st) || !id[0] || strlen(id) >= sizeof(((vrec *)0)->id)) return 0;
  int64_t at = (int64_t)num_of(o, "at_ms");
  int quar = strcmp(st->valuestring, "quarantined") == 0;
  if (!quar && strcmp(st->valuestring, "released") != 0) return 0;
  vrec *rec = quar ? rec_get(v, id) : rec_find(v, id);
  if (!rec) return 0;
  /* the newest decision wins, whichever gateway made it */
  int64_t mine = rec->quarantined ? rec->quarantined_at : rec->released_at;
  if (mine > at) return 1;
  if (mine == at) return 0; /* the same decision (ours, or told already) */
  if (quar) {
    rec->quarantined = 1;
    rec->quarantined_at = at;
    rec->strikes = (unsigned)fmin(num_of(o, "strikes"), 4e9);
    if (num_of(o, "last_pass_ms") > 0) rec->last_pass_at = (int64_t)num_of(o, "last_pass_ms");
    rec->owes = 1;
    rec->in_row = 0;
    snprintf(rec->verdict_by, sizeof(rec->verdict_by), "%s", from);
    evidence_from_json(rec, cJSON_GetObjectItemCaseSensitive(o, "evidence"));
    since_from_json(rec, cJSON_GetObjectItemCaseSensitive(o, "answers"), num_of(o, "not_listed"));
    quarantine_replica(gw, rec, from);
    save_soon(v, 1);
  } else if (rec->quarantined) {
    release(gw, rec, NULL, from, at);
  } else {
    rec->released_at = at;
    save_soon(v, 0);
  }
  return 0;
}

void gw_verify_each_verdict(gw_server *gw, void (*fn)(gw_server *gw, const char *id, void *ud), void *ud) {
  for (vrec *r = gw->vfy.state ? gw->vfy.state->recs : NULL; r; r = r->next)
    if (r->quarantined || r->released_at) fn(gw, r->id, ud);
}

/* ---- the module ---------------------------------------------------------------------- */

static int quarantined_hook(gw_server *gw, const char *id) { return gw_verify_is_quarantined(gw, id); }

int gw_verify_init(gw_server *gw, char *err, size_t errn) {
  gw_verify *v = calloc(1, sizeof(*v));
  if (!v) return -ENOMEM;
  v->gw = gw;
  int rc = canaries_load(gw->conf->verify_canaries_file, &v->canaries, &v->n_canaries, err, errn);
  if (rc) {
    free(v);
    return rc;
  }
  gw->vfy.state = v;
  gw->answered = answered;
  gw->quarantined = quarantined_hook;
  gw->verdict_json = gw_verify_verdict_json;
  gw->apply_verdict = gw_verify_apply_verdict;
  gw->each_verdict = gw_verify_each_verdict;
  const char *dir = gw->conf->data_dir;
  if (dir) {
    size_t n = strlen(dir) + sizeof(VERIFY_FILE) + 2;
    if (n > 4000 || !(v->path = malloc(n))) {
      gw_verify_free(gw);
      return -ENOMEM;
    }
    snprintf(v->path, n, "%s/%s", dir, VERIFY_FILE);
    load(v);
  }
  return 0;
}

int gw_verify_reload(gw_server *gw, char *err, size_t errn) {
  gw_verify *v = gw->vfy.state;
  if (!v) return 0;
  vcanary *cs;
  size_t n;
  int rc = canaries_load(gw->conf->verify_canaries_file, &cs, &n, err, errn);
  if (rc) return rc;
  canaries_free(v->canaries, v->n_canaries);
  v->canaries = cs;
  v->n_canaries = n;
  return 0;
}

void gw_verify_free(gw_server *gw) {
  gw_verify *v = gw->vfy.state;
  if (!v) return;
  /* the loop has ended (no write under way): what changed since the last write, now */
  if (v->path && v->dirty && !v->saving) {
    char *t = file_text(v);
    int rc = t ? pr_privfile_write(v->path, t, 1) : -ENOMEM;
    if (rc) pr_warn("verify: cannot write %s (%s): the latest records are lost", v->path, pr_strerror(rc));
    free(t);
  }
  free(v->path);
  while (v->checks) {
    vcheck *c = v->checks;
    v->checks = c->next;
    check_free(c);
  }
  pr_idmap_clear(&v->by_id);
  while (v->recs) {
    vrec *r = v->recs;
    v->recs = r->next;
    cJSON_Delete(r->evidence);
    free(r->since);
    free(r);
  }
  canaries_free(v->canaries, v->n_canaries);
  free(v);
  gw->vfy.state = NULL;
  gw->answered = NULL;
  gw->quarantined = NULL;
  gw->verdict_json = NULL;
  gw->apply_verdict = NULL;
  gw->each_verdict = NULL;
}

void gw_verify_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  if (ev->kind != GW_FLEET_ADDED || !gw->vfy.state) return;
  vrec *rec = rec_find(gw->vfy.state, ev->r->id);
  if (rec && rec->quarantined && !gw_replica_has(ev->r, GW_HELD_QUARANTINED)) {
    const char *old = gw_replica_display_state(ev->r);
    gw_replica_held_set(ev->r, GW_HELD_QUARANTINED, 1);
    gw_registry_event(gw, ev->r, old);
  }
}

int gw_verify_is_quarantined(gw_server *gw, const char *id) {
  vrec *rec = gw->vfy.state ? rec_find(gw->vfy.state, id) : NULL;
  return rec && rec->quarantined;
}

int gw_verify_passes_owed(gw_server *gw, const char *id) {
  const gw_config *c = gw->conf;
  if (!gw->vfy.state || !c->verify_enabled) return -1;
  vrec *rec = rec_find(gw->vfy.state, id);
  int t = c->verify_trust_after > 0 ? c->verify_trust_after : 1;
  if (!rec) return t;
  if (rec->quarantined || rec_trusted(c, rec)) return 0;
  return rec->in_row >= (unsigned)t ? 1 : t - (int)rec->in_row;
}

static cJSON *rec_json(const gw_server *gw, const vrec *r, int evidence) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "state", r->quarantined ? "quarantined"
                                      : r->owes ? "owes_a_check"
                                      : rec_trusted(gw->conf, r) ? "trusted" : "newcomer");
  cJSON_AddNumberToObject(o, "answers", (double)r->answers);
  cJSON_AddNumberToObject(o, "checks_passed", (double)r->passed);
  cJSON_AddNumberToObject(o, "passed_in_row", r->in_row);
  cJSON_AddNumberToObject(o, "votes_lost", (double)r->lost);
  cJSON_AddNumberToObject(o, "undecided", (double)r->undecided);
  cJSON_AddNumberToObject(o, "canaries", (double)r->canaries);
  cJSON_AddNumberToObject(o, "canaries_failed", (double)r->canaries_failed);
  cJSON_AddNumberToObject(o, "strikes", r->strikes);
  cJSON_AddNumberToObject(o, "checks_running", r->inflight);
  cJSON_AddNumberToObject(o, "answers_since_pass", (double)(r->n_since + r->since_dropped));
  cJSON_AddNumberToObject(o, "check_rate",
                          gw_verify_rate(r->in_row, r->passed, r->owes, gw->conf->verify_trust_after,
                                         gw->conf->verify_newcomer_rate, gw->conf->verify_min_rate));
  if (r->last_pass_at) cJSON_AddNumberToObject(o, "last_pass_ms", (double)r->last_pass_at);
  else cJSON_AddNullToObject(o, "last_pass_ms");
  if (r->quarantined) cJSON_AddNumberToObject(o, "quarantined_ms", (double)r->quarantined_at);
  if (r->quarantined) {
    if (r->verdict_by[0]) cJSON_AddStringToObject(o, "quarantined_by_gateway", r->verdict_by);
    else cJSON_AddNullToObject(o, "quarantined_by_gateway");
  }
  if (evidence || r->quarantined)
    cJSON_AddItemToObject(o, "evidence", r->evidence ? cJSON_Duplicate(r->evidence, 1) : cJSON_CreateArray());
  return o;
}

cJSON *gw_verify_json(gw_server *gw) {
  cJSON *o = cJSON_CreateObject();
  cJSON *phones = cJSON_AddArrayToObject(o, "phones");
  cJSON *q = cJSON_AddArrayToObject(o, "quarantined");
  for (vrec *r = gw->vfy.state ? gw->vfy.state->recs : NULL; r; r = r->next) {
    cJSON_AddItemToArray(phones, rec_json(gw, r, 0));
    if (r->quarantined) cJSON_AddItemToArray(q, rec_json(gw, r, 1));
  }
  cJSON *s = cJSON_AddObjectToObject(o, "stats");
  cJSON_AddBoolToObject(s, "enabled", gw->conf->verify_enabled);
  cJSON_AddNumberToObject(s, "checks", (double)gw->vfy.stats.checks);
  cJSON_AddNumberToObject(s, "agreed", (double)gw->vfy.stats.agreed);
  cJSON_AddNumberToObject(s, "disagreed", (double)gw->vfy.stats.disagreed);
  cJSON_AddNumberToObject(s, "votes", (double)gw->vfy.stats.votes);
  cJSON_AddNumberToObject(s, "votes_lost", (double)gw->vfy.stats.votes_lost);
  cJSON_AddNumberToObject(s, "undecided", (double)gw->vfy.stats.undecided);
  cJSON_AddNumberToObject(s, "canaries", (double)gw->vfy.stats.canaries);
  cJSON_AddNumberToObject(s, "canaries_failed", (double)gw->vfy.stats.canaries_failed);
  cJSON_AddNumberToObject(s, "quarantines", (double)gw->vfy.stats.quarantines);
  cJSON_AddNumberToObject(s, "shadow_requests", (double)gw->vfy.stats.shadows);
  cJSON_AddNumberToObject(s, "slot_seconds", round(gw->vfy.stats.slot_s * 1000) / 1000);
  cJSON_AddNumberToObject(s, "checks_running", gw->vfy.state ? (double)gw->vfy.state->n_checks : 0);
  return o;
}

cJSON *gw_verify_phone_json(gw_server *gw, const char *id) {
  vrec *r = gw->vfy.state ? rec_find(gw->vfy.state, id) : NULL;
  return r ? rec_json(gw, r, 1) : NULL;
}

cJSON *gw_verify_answers_json(gw_server *gw, const char *id) {
  vrec *r = gw->vfy.state ? rec_find(gw->vfy.state, id) : NULL;
  if (!r || !r->quarantined) return NULL;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  if (r->last_pass_at) cJSON_AddNumberToObject(o, "since_ms", (double)r->last_pass_at);
  else cJSON_AddNullToObject(o, "since_ms");
  cJSON_AddNumberToObject(o, "not_listed", (double)r->since_dropped);
  cJSON *arr = cJSON_AddArrayToObject(o, "answers");
  for (size_t i = 0; i < r->n_since; i++) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "request_id", r->since[i].id);
    if (r->since[i].key[0]) cJSON_AddStringToObject(a, "key", r->since[i].key);
    else cJSON_AddNullToObject(a, "key");
    cJSON_AddNumberToObject(a, "at_ms", (double)r->since[i].at_ms);
    cJSON_AddItemToArray(arr, a);
  }
  return o;
}

/* rec leaves quarantine: by an operator here (by NULL) or at gateway `by`, at wall time at. */
static void release(gw_server *gw, vrec *rec, const char *who, const char *by, int64_t at) {
  const char *id = rec->id;
  rec->quarantined = 0;
  rec->released_at = at;
  snprintf(rec->verdict_by, sizeof(rec->verdict_by), "%s", by ? by : "");
  rec->strikes = 0;
  rec->in_row = 0;
  rec->owes = 0;
  rec->n_since = 0;
  rec->since_dropped = 0;
  gw->vfy.stats.released++;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "event", "replica_released");
  cJSON_AddStringToObject(f, "replica", id);
  cJSON_AddStringToObject(f, "by", who ? who : "");
  if (by) cJSON_AddStringToObject(f, "by_gateway", by);
  pr_log_kv(PR_LOG_INFO, "replica released from quarantine", f);
  char msg[256];
  snprintf(msg, sizeof(msg), "%s released from quarantine by an operator%s%s: takes work again, "
           "checked as a newcomer", id, by ? " at gateway " : "", by ? by : "");
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "replica", id);
  gw_events_add(gw, "replica_released", msg, e);
  gw_replica *r = gw_registry_find(gw, id);
  if (r) {
    const char *old = gw_replica_display_state(r);
    gw_replica_held_set(r, GW_HELD_QUARANTINED, 0);
    gw_registry_event(gw, r, old);
  }
  gw_plan_soon(gw);
  save_soon(gw->vfy.state, 1);
}

int gw_verify_release(gw_server *gw, const char *id, const char *who) {
  vrec *rec = gw->vfy.state ? rec_find(gw->vfy.state, id) : NULL;
  if (!rec || !rec->quarantined) return PR_EUNKNOWN;
  int64_t at = pr_clock_wall_ms();
  release(gw, rec, who, NULL, at > rec->quarantined_at ? at : rec->quarantined_at + 1);
  if (gw->verdict) gw->verdict(gw, id); /* the other gateways (Redis) */
  return 0;
}
