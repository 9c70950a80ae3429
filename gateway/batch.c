/* The Batch API's runner: validation, each batch's window of lines, their answers
 * written to the output and error files, expiry, cancel; see batch.h and docs/batch.md.
 *
 * A batch that has not ended has a run here (gw_brun). Its lines live in the store;
 * the run holds only its window: the lines in flight (a job each, in the batch class),
 * lines to try again later, and answered lines waiting to be written. Writing is a
 * group commit: the answered lines' output goes to the files at their committed
 * lengths, reaches the disk (batch.sync), and then one transaction marks the lines and
 * moves the committed lengths; a crash in between leaves bytes past the committed
 * length, cut off when the run is picked up again, and the lines still pending.
 *
 * Runs are a window: at most batch.max_running batches (validating or in progress) have
 * one; the others, however many, wait in the store with the status OpenAI shows and are
 * given a run slot in turns, the key with the fewest runs first and each key's batches in
 * creation order (gw_bowner.cursor). A batch that waits can still be cancelled (a run is
 * made for it and ends it at once) and still expires (a run beyond the window, `extra`,
 * writes its batch_expired lines). Validations run batch.validations at a time, each
 * holding at most batch.max_line_bytes plus one read of the file.
 *
 * What each key holds (files, bytes, batches, validations, lines) is counted per owner
 * (gw_bowner), from the store at start and from each change after, and checked against
 * its quotas (bquota.h). */
#include "batch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "auth.h"
#include "batchrun.h"
#include "bquota.h"
#include "caps.h"
#include "clock.h"
#include "err.h"
#include "log.h"
#include "oai.h"

#define BATCH_TICK_MS 100
#define BATCH_VALIDATE_BYTES (2u << 20)  /* read per validation step */
#define BATCH_ERRORS_SHOWN 100           /* validation problems listed in `errors` */
#define BATCH_EXPIRE_CHUNK 256           /* pending lines read per step of an expiry */
#define BATCH_FLUSH_RETRY_MS 5000        /* after the disk or the database failed */
#define BATCH_FILE_SWEEP_MS 60000        /* expired files are looked for at least this often */
#define BATCH_SWEEP_FILES 64             /* expired files removed per step */
#define BATCH_FILL_STEP 64               /* batches given a run slot per tick */
#define BATCH_EXTRA_MAX 16               /* runs beyond the window that only end a batch */
#define BATCH_EXPIRY_CHECK_MS 1000       /* waiting batches past their window looked for */
#define BATCH_PAGE 64                    /* batches read from the store at once */

typedef struct gw_bowner gw_bowner;

typedef struct gw_brun gw_brun;

/* One line in the run's window. */
typedef struct gw_bline {
  gw_brun *run;
  gw_line_rec rec;
  gw_sink *sink;           /* its job's sink while in flight; NULL otherwise */
  uint64_t not_before_ms;  /* again: not before then */
  char *out;               /* the line to write (owned); NULL: none yet */
  int to_error;            /* ...into the error file */
  int expired;             /* ...as batch_expired */
  int64_t in_tok, cached_tok, out_tok;
  char rid[128];
  char replica[128];       /* the phone that answered it ("" not known) */
  struct gw_bline *next, *prev;
} gw_bline;

/* An output line this gateway wrote, and the phone that answered it: lines of a phone
 * quarantined before the batch completes are taken out of the output and run again
 * (run_requarantine). */
typedef struct gw_bwritten {
  int64_t line, off, len;
  int64_t in_tok, cached_tok, out_tok;
  unsigned rep;            /* index into the run's reps */
} gw_bwritten;

typedef struct bline_list {
  gw_bline *head;
  size_t n;
} bline_list;

struct gw_brun {
  gw_batches *bs;
  gw_bowner *ow;           /* its owner's counts */
  gw_batch_rec rec;        /* the live record; the store's copy lags by one commit */
  int extra;               /* beyond the window: made only to end the batch (expiry) */
  int lines_counted;       /* its lines not ended are in ow->use.lines */
  int v_active;            /* holds one of the batch.validations slots */
  size_t win;              /* its lines in flight at most, worked out each tick */
  int in_fd, out_fd, err_fd;
  /* the cursor through pending lines, in run order; exhausted: nothing beyond it */
  char cur_gkey[80];
  int64_t cur_line;
  int exhausted;
  bline_list inflight, again, ready;
  uint64_t flush_after_ms;  /* 0: flush when there is something to write */
  gw_bline *launching;      /* the line whose job is being started... */
  int launch_answered;      /* ...was answered before the start returned */
  int v_too_many;           /* too_many_lines was said */
  int owner_gone;           /* paused: its key is no longer configured (said once) */
  char *write_error;        /* the last failure to write, while it lasts (owned) */
  gw_bwritten *written;     /* output lines written by this gateway's run, with their phone */
  size_t n_written, cap_written;
  char **reps;              /* the phones that answered them (owned) */
  size_t n_reps;
  /* validation */
  int64_t v_off, v_line;
  pr_buf v_buf;
  cJSON *v_errors;
  int64_t v_nerrors;
  /* progress since this gateway picked it up: throughput and the finish estimate */
  uint64_t seen_ms;
  int64_t seen_done;
  gw_brun *next;
};

/* One owner (an API key's name; "" on a gateway without keys): what it holds, and its
 * turns for run slots. Kept for the gateway's life (a key removed by a reload keeps its
 * files and batches). */
struct gw_bowner {
  char name[GW_BSTORE_OWNER_MAX];
  gw_bquota_use use;
  int runs;                /* its batches with a run (window and extra) */
  int window;              /* of them, holding a window place */
  int validations;         /* of them, holding a validation slot */
  int64_t cursor;          /* the creation order of its last batch given a run slot */
  int stuck;               /* the store showed none waiting: not asked again until a change */
  int tmp;                 /* a tick's count of its runs of one model */
  gw_bowner *next;
};

struct gw_batches {
  gw_server *gw;
  gw_bstore *st;
  uv_timer_t timer;
  int timer_open;
  gw_brun *runs;
  size_t n_window, n_extra;
  gw_bowner *owners;
  uint64_t next_sweep_ms, next_expiry_ms;
  uint64_t lines_completed, lines_failed, lines_expired;
};

/* ---- small pieces -------------------------------------------------------------------- */

int64_t gw_batch_now(void) { return pr_clock_wall_ms() / 1000; }

void gw_batch_new_id(char *out, size_t n, const char *prefix) {
  unsigned char r[12];
  if (RAND_bytes(r, sizeof(r)) != 1) {
    /* no randomness: time and a counter still make it unique in this process */
    static uint64_t k;
    uint64_t t = (uint64_t)pr_clock_wall_ms() ^ (++k << 40);
    for (size_t i = 0; i < sizeof(r); i++) r[i] = (unsigned char)(t >> ((i % 8) * 8));
  }
  char hex[25];
  for (size_t i = 0; i < sizeof(r); i++) snprintf(hex + 2 * i, 3, "%02x", r[i]);
  snprintf(out, n, "%s%s", prefix, hex);
}

gw_bstore *gw_batches_store(gw_server *gw) { return gw->batches ? gw->batches->st : NULL; }

static gw_bowner *owner_find(gw_batches *bs, const char *name) {
  for (gw_bowner *o = bs->owners; o; o = o->next)
    if (strcmp(o->name, name) == 0) return o;
  return NULL;
}

/* The owner of that name, made when first seen; NULL only without memory. */
static gw_bowner *owner_get(gw_batches *bs, const char *name) {
  gw_bowner *o = owner_find(bs, name);
  if (o) return o;
  if (!(o = calloc(1, sizeof(*o)))) return NULL;
  snprintf(o->name, sizeof(o->name), "%s", name);
  o->next = bs->owners;
  bs->owners = o;
  return o;
}

/* An owner's key while it is configured (NULL: none, or a gateway without keys). */
static const gw_key_conf *owner_key(gw_server *gw, const char *name) {
  gw_caller *k = name[0] && gw->conf->n_keys ? gw_auth_caller(gw, name) : NULL;
  return k ? k->conf : NULL;
}

static const gw_bquota *owner_quota(gw_server *gw, const char *name) {
  const gw_key_conf *k = owner_key(gw, name);
  return k ? &k->quota : &gw->conf->batch_quota;
}

/* The name a caller is told: the key's, or "anonymous" on a gateway without keys. */
static const char *owner_label(const char *name) { return name[0] ? name : "anonymous"; }

/* A batch of a key a reload removed waits: it neither runs nor takes a run slot. */
static int owner_may_run(gw_server *gw, const gw_bowner *o) {
  return !(o->name[0] && gw->conf->n_keys && !owner_key(gw, o->name));
}

gw_bquota_use *gw_batches_use(gw_server *gw, const char *owner) {
  gw_bowner *o = gw->batches ? owner_get(gw->batches, owner) : NULL;
  return o ? &o->use : NULL;
}

const gw_bquota *gw_batches_quota(gw_server *gw, const char *owner) {
  return owner_quota(gw, owner);
}

void gw_batches_sweep_by(gw_server *gw, int64_t expires_at) {
  gw_batches *bs = gw->batches;
  if (!bs || expires_at <= 0) return;
  int64_t in_ms = expires_at * 1000 - (int64_t)pr_clock_wall_ms();
  uint64_t at = uv_now(gw->loop) + (uint64_t)(in_ms > 0 ? in_ms : 0);
  if (at < bs->next_sweep_ms) bs->next_sweep_ms = at;
}

static void list_push(bline_list *L, gw_bline *l) {
  l->prev = NULL;
  l->next = L->head;
  if (L->head) L->head->prev = l;
  L->head = l;
  L->n++;
}

static void list_unlink(bline_list *L, gw_bline *l) {
  if (l->prev) l->prev->next = l->next;
  else L->head = l->next;
  if (l->next) l->next->prev = l->prev;
  l->next = l->prev = NULL;
  L->n--;
}

static void bline_free(gw_bline *l) {
  if (!l) return;
  free(l->out);
  free(l);
}

static void list_free(bline_list *L) {
  while (L->head) {
    gw_bline *l = L->head;
    list_unlink(L, l);
    bline_free(l);
  }
}

static void tick_cb(uv_timer_t *t);

/* A step at the next loop turn rather than at the tick's pace. */
static void kick(gw_batches *bs) {
  if (bs->timer_open) uv_timer_start(&bs->timer, tick_cb, 0, BATCH_TICK_MS);
}

static void batch_log(int level, const gw_brun *b, const char *msg, const char *detail) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "batch", b->rec.id);
  cJSON_AddStringToObject(f, "status", gw_batch_status_name(b->rec.status));
  if (detail) cJSON_AddStringToObject(f, "detail", detail);
  cJSON_AddNumberToObject(f, "total", (double)b->rec.total);
  cJSON_AddNumberToObject(f, "completed", (double)b->rec.completed);
  cJSON_AddNumberToObject(f, "failed", (double)b->rec.failed);
  pr_log_kv(level, msg, f);
}

static gw_brun *run_find(gw_batches *bs, const char *id) {
  for (gw_brun *b = bs->runs; b; b = b->next)
    if (strcmp(b->rec.id, id) == 0) return b;
  return NULL;
}

static void run_free(gw_brun *b) {
  list_free(&b->inflight);
  list_free(&b->again);
  list_free(&b->ready);
  if (b->in_fd >= 0) close(b->in_fd);
  if (b->out_fd >= 0) close(b->out_fd);
  if (b->err_fd >= 0) close(b->err_fd);
  pr_buf_free(&b->v_buf);
  cJSON_Delete(b->v_errors);
  free(b->write_error);
  gw_batch_rec_clear(&b->rec);
  free(b->written);
  for (size_t k = 0; k < b->n_reps; k++) free(b->reps[k]);
  free(b->reps);
  free(b);
}

/* Out of the list (and its place in the window or beyond it given back); run_free next. */
static void run_unlink(gw_batches *bs, gw_brun *b) {
  for (gw_brun **p = &bs->runs; *p; p = &(*p)->next)
    if (*p == b) {
      *p = b->next;
      if (b->extra) {
        bs->n_extra--;
      } else {
        bs->n_window--;
        b->ow->window--;
      }
      b->ow->runs--;
      if (b->v_active) b->ow->validations--;
      b->v_active = 0;
      return;
    }
}

/* The batch's status becomes s, and its owner's counts follow: a validation over, a
 * batch ended (with its lines not answered). */
static void run_status(gw_brun *b, gw_batch_status s) {
  gw_batches *bs = b->bs;
  gw_bquota_use *u = &b->ow->use;
  gw_batch_status was = b->rec.status;
  if (was == GW_BATCH_VALIDATING && s != GW_BATCH_VALIDATING) {
    if (u->validating > 0) u->validating--;
    if (b->v_active) b->ow->validations--;
    b->v_active = 0;
  }
  if (gw_batch_status_final(s) && !gw_batch_status_final(was)) {
    if (u->batches > 0) u->batches--;
    bs->next_sweep_ms = 0; /* its input file may be past its expiry */
  }
  if (gw_batch_status_final(s) && b->lines_counted) {
    int64_t left = b->rec.total - b->rec.completed - b->rec.failed;
    u->lines -= left > 0 ? left : 0;
    if (u->lines < 0) u->lines = 0;
    b->lines_counted = 0;
  }
  b->rec.status = s;
}

/* Store the live record (its own transaction unless one is open). */
static int run_save(gw_brun *b) { return gw_bstore_batch_put(b->bs->st, &b->rec); }

static int open_file(gw_brun *b, const char *id, int flags) {
  char path[4096];
  gw_bstore_path(b->bs->st, id, path, sizeof(path));
  return open(path, flags | O_CLOEXEC, 0600);
}

/* ---- the answer of a line ------------------------------------------------------------- */

/* The number at path a.b in o, or 0. */
static int64_t num_at(const cJSON *o, const char *a, const char *b) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
  if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
  return cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < 1e15 ? (int64_t)x->valuedouble : 0;
}

/* The output line for the answer; NULL out of memory. */
static char *line_output(const gw_bline *l, int status, const char *body, size_t len,
                         cJSON **parsed) {
  cJSON *o = cJSON_CreateObject();
  char id[64];
  gw_batch_new_id(id, sizeof(id), "batch_req_");
  cJSON_AddStringToObject(o, "id", id);
  cJSON_AddStringToObject(o, "custom_id", l->rec.custom_id);
  cJSON *resp = cJSON_AddObjectToObject(o, "response");
  cJSON_AddNumberToObject(resp, "status_code", status);
  cJSON_AddStringToObject(resp, "request_id", l->rid);
  cJSON *b = cJSON_ParseWithLength(body ? body : "", len);
  if (b) cJSON_AddItemReferenceToObject(resp, "body", b);
  else cJSON_AddStringToObject(resp, "body", ""); /* not JSON: kept out rather than mangled */
  cJSON_AddNullToObject(o, "error");
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  *parsed = b;
  return s;
}

static char *line_expired_output(const gw_line_rec *l) {
  cJSON *o = cJSON_CreateObject();
  char id[64];
  gw_batch_new_id(id, sizeof(id), "batch_req_");
  cJSON_AddStringToObject(o, "id", id);
  cJSON_AddStringToObject(o, "custom_id", l->custom_id);
  cJSON_AddNullToObject(o, "response");
  cJSON *e = cJSON_AddObjectToObject(o, "error");
  cJSON_AddStringToObject(e, "code", "batch_expired");
  cJSON_AddStringToObject(e, "message",
                          "This request could not be executed before the completion window "
                          "expired.");
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

/* What to do with an answer: 0 write it (output or error file), 1 run the line again
 * later and count a try (a phone's or the fleet's failure), 2 again without counting
 * (the gateway was busy: the queue full, the key's concurrency, the model not served
 * just now), 3 leave it pending (the gateway is shutting down). */
int gw_batch_answer_kind(int status, const char *code) {
  if (code && strcmp(code, "shutting_down") == 0) return 3;
  if (status >= 200 && status < 300) return 0;
  if (status == 429) return 2;
  if (code && strcmp(code, "unanswered") == 0) return 2; /* let go unanswered: not a try */
  if (code && (strcmp(code, "queue_full") == 0 || strcmp(code, "model_not_found") == 0 ||
               strcmp(code, "deadline_exceeded") == 0 || strcmp(code, "server_busy") == 0))
    return 2;
  if (status == 408 || status == 409) return 1;
  if (status >= 400 && status < 500) return 0; /* the request's own fault: answered */
  return 1;
}

static void line_answer(gw_bline *l, int status, const char *body, size_t len) {
  gw_brun *b = l->run;
  gw_batches *bs = b->bs;
  uint64_t now = uv_now(bs->gw->loop);
  if (b->launching == l) b->launch_answered = 1;
  l->sink = NULL;
  list_unlink(&b->inflight, l);
  cJSON *parsed = NULL;
  char *out = line_output(l, status, body, len, &parsed);
  const char *code = NULL;
  if (status >= 300 && parsed) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(parsed, "error"), "code");
    if (cJSON_IsString(c)) code = c->valuestring;
  }
  int kind = out ? gw_batch_answer_kind(status, code) : 2; /* out of memory: again, later */
  if (kind == 1 && ++l->rec.tries > bs->gw->conf->batch_line_retries) kind = 0;
  if (kind == 0) {
    l->out = out;
    out = NULL;
    l->to_error = status < 200 || status >= 300;
    if (parsed) {
      l->in_tok = num_at(parsed, "usage", "prompt_tokens");
      l->out_tok = num_at(parsed, "usage", "completion_tokens");
      const cJSON *u = cJSON_GetObjectItemCaseSensitive(parsed, "usage");
      const cJSON *t = cJSON_GetObjectItemCaseSensitive(parsed, "timings");
      const cJSON *d = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
      if (d) {
        l->cached_tok = num_at(d, "cached_tokens", NULL);
      } else if (cJSON_GetObjectItemCaseSensitive(t, "cache_n")) {
        l->cached_tok = num_at(parsed, "timings", "cache_n");
      } else if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(t, "prompt_n"))) {
        /* llama-server builds that report neither: what the prompt had beyond the tokens
         * it computed came from the cache */
        int64_t computed = num_at(parsed, "timings", "prompt_n");
        l->cached_tok = l->in_tok > computed ? l->in_tok - computed : 0;
      }
    }
    list_push(&b->ready, l);
  } else if (kind == 3 || b->rec.status != GW_BATCH_IN_PROGRESS) {
    bline_free(l); /* still pending in the store */
  } else {
    int tries = l->rec.tries;
    double delay_s = kind == 1 ? fmin(60.0, pow(2.0, tries)) : 1.0;
    l->not_before_ms = now + (uint64_t)(delay_s * 1000.0);
    list_push(&b->again, l);
  }
  cJSON_Delete(parsed);
  free(out);
  kick(bs);
}

/* The sink a line's job answers into. */
static int ls_stream_start(gw_sink *s, const char *const *h, const char *c) {
  (void)s, (void)h, (void)c;
  return PR_EPARSE; /* validation refuses stream: true */
}
static int ls_write(gw_sink *s, const char *d, size_t n) {
  (void)s, (void)d, (void)n;
  return PR_EPARSE;
}
static int ls_behind(gw_sink *s) {
  (void)s;
  return 0;
}
static int ls_stream_end(gw_sink *s) {
  (void)s;
  return PR_EPARSE;
}
static gw_bline *ls_take(gw_sink *s) {
  gw_bline *l = s->ctx;
  s->ops = NULL;
  s->ctx = NULL;
  return l;
}
static int ls_respond(gw_sink *s, int status, const char *const *hdrs, const char *ctype,
                      const char *body, size_t len) {
  (void)ctype;
  gw_bline *l = ls_take(s);
  for (const char *const *h = hdrs; h && *h; h++)
    if (strncmp(*h, "x-fleetgate-replica: ", 21) == 0) snprintf(l->replica, sizeof(l->replica), "%s", *h + 21);
  line_answer(l, status, body, len);
  return 0;
}
static void ls_abort(gw_sink *s) {
  static const char msg[] = "{\"error\":{\"message\":\"the answer could not be relayed\","
                            "\"type\":\"server_error\",\"param\":null,\"code\":\"aborted\"}}";
  line_answer(ls_take(s), 502, msg, sizeof(msg) - 1);
}
static void ls_close(gw_sink *s) {
  /* let go unanswered: the line stays pending and runs again */
  static const char msg[] = "{\"error\":{\"message\":\"the request ended unanswered\","
                            "\"type\":\"server_error\",\"param\":null,\"code\":\"unanswered\"}}";
  line_answer(ls_take(s), 502, msg, sizeof(msg) - 1);
}
static const gw_sink_ops line_sink_ops = {
  ls_stream_start, ls_write, ls_behind, ls_stream_end, ls_respond, ls_abort, ls_close,
};

/* ---- starting lines ------------------------------------------------------------------ */

static void line_launch(gw_brun *b, gw_bline *l) {
  gw_batches *bs = b->bs;
  gw_server *gw = bs->gw;
  char *raw = malloc((size_t)l->rec.len + 1);
  cJSON *root = NULL;
  char *body = NULL;
  ssize_t got = raw ? pread(b->in_fd, raw, (size_t)l->rec.len, (off_t)l->rec.off) : -1;
  if (got == l->rec.len) root = cJSON_ParseWithLength(raw, (size_t)got);
  const cJSON *jb = root ? cJSON_GetObjectItemCaseSensitive(root, "body") : NULL;
  if (jb) body = cJSON_PrintUnformatted(jb);
  free(raw);
  cJSON_Delete(root);
  list_push(&b->inflight, l);
  /* the access log and the output line name the batch and the line */
  snprintf(l->rid, sizeof(l->rid), "%s-l%" PRId64, b->rec.id, l->rec.line);
  if (!body) {
    /* the input file changed under the batch, or memory ran out */
    static const char msg[] = "{\"error\":{\"message\":\"the line could not be read from the "
                              "input file again\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":\"input_unreadable\"}}";
    l->rec.tries = gw->conf->batch_line_retries;
    line_answer(l, 500, msg, sizeof(msg) - 1);
    return;
  }
  gw_caller *caller = b->rec.owner[0] ? gw_auth_caller(gw, b->rec.owner) : NULL;
  uint64_t now = uv_now(gw->loop);
  int64_t left_s = b->rec.expires_at - gw_batch_now();
  gw_job_line jl = {
    .path = b->rec.endpoint, .body = body, .len = strlen(body), .caller = caller,
    .deadline_ms = now + (uint64_t)(left_s > 0 ? left_s * 1000 : 1), .id = l->rid,
    .ops = &line_sink_ops, .ctx = l,
  };
  b->launching = l;
  b->launch_answered = 0;
  gw_sink *s = gw_job_start_line(gw, &jl);
  if (!b->launch_answered) l->sink = s; /* else l may be gone already: it was answered */
  b->launching = NULL;
  free(body);
}

static void run_refill(gw_brun *b) {
  gw_server *gw = b->bs->gw;
  if (gw->shutting_down || b->write_error) return;
  gw_caller *key = b->rec.owner[0] && gw->conf->n_keys ? gw_auth_caller(gw, b->rec.owner) : NULL;
  if (b->rec.owner[0] && gw->conf->n_keys && (!key || !key->conf)) {
    /* its key was removed by a reload: its lines wait (until the key is back, a cancel
     * or the batch's expiry) rather than run without the key's limits */
    if (!b->owner_gone) batch_log(PR_LOG_WARN, b, "batch paused", "its API key is no longer configured");
    b->owner_gone = 1;
    return;
  }
  b->owner_gone = 0;
  uint64_t now = uv_now(gw->loop);
  size_t w = b->win ? b->win : 1; /* runs_share */
  /* answered lines waiting to be written still hold their place */
  while (b->inflight.n + b->ready.n < w) {
    gw_bline *l = NULL;
    for (gw_bline *a = b->again.head; a; a = a->next)
      if (a->not_before_ms <= now) {
        l = a;
        break;
      }
    if (l) {
      list_unlink(&b->again, l);
    } else {
      if (b->exhausted) break;
      gw_line_rec rec;
      int n = gw_bstore_lines_next(b->bs->st, b->rec.id, b->cur_gkey, b->cur_line, &rec, 1);
      if (n <= 0) {
        if (n == 0) b->exhausted = 1;
        break;
      }
      snprintf(b->cur_gkey, sizeof(b->cur_gkey), "%s", rec.gkey);
      b->cur_line = rec.line;
      if (!(l = calloc(1, sizeof(*l)))) break;
      l->run = b;
      l->rec = rec;
    }
    size_t again = b->again.n;
    line_launch(b, l);
    if (b->rec.status != GW_BATCH_IN_PROGRESS) break;
    /* refused at once (the queue full, a key's limit): the next lines would be too, and
     * none of them takes a place in the window; go on at the next tick */
    if (b->again.n > again) break;
  }
}

/* ---- writing ------------------------------------------------------------------------- */

static int write_all(int fd, const char *p, size_t n, int64_t off) {
  while (n) {
    ssize_t w = pwrite(fd, p, n, (off_t)off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += w;
    n -= (size_t)w;
    off += w;
  }
  return 0;
}

static void run_write_failed(gw_brun *b, const char *what, int rc) {
  char msg[512];
  snprintf(msg, sizeof(msg), "%s: %s; the answered lines wait in memory and writing is tried "
           "again every %d s", what, rc < 0 && rc > -4000 ? strerror(-rc) : pr_strerror(rc),
           BATCH_FLUSH_RETRY_MS / 1000);
  if (!b->write_error || strcmp(b->write_error, msg) != 0) batch_log(PR_LOG_ERROR, b, "batch write failed", msg);
  free(b->write_error);
  b->write_error = strdup(msg);
  b->flush_after_ms = uv_now(b->bs->gw->loop) + BATCH_FLUSH_RETRY_MS;
}

/* The index of a phone among the run's reps (added when new); (unsigned)-1 out of memory. */
static unsigned run_rep(gw_brun *b, const char *id) {
  for (size_t i = 0; i < b->n_reps; i++)
    if (strcmp(b->reps[i], id) == 0) return (unsigned)i;
  char **n = realloc(b->reps, (b->n_reps + 1) * sizeof(*n));
  if (!n) return (unsigned)-1;
  b->reps = n;
  if (!(b->reps[b->n_reps] = strdup(id))) return (unsigned)-1;
  return (unsigned)b->n_reps++;
}

/* Before a batch completes: output lines answered by a phone quarantined since (verify.h)
 * are taken out of the output file and run again on other phones. Returns 1 when some
 * were (the batch goes on), 0 none, < 0 the file or the store failed (the batch goes on;
 * tried again at the next tick). */
static int run_requarantine(gw_brun *b) {
  gw_server *gw = b->bs->gw;
  if (!gw->quarantined || !b->n_written || b->out_fd < 0) return 0;
  unsigned char *bad = calloc(b->n_reps ? b->n_reps : 1, 1);
  if (!bad) return -ENOMEM;
  int any = 0;
  for (size_t i = 0; i < b->n_reps; i++) any |= bad[i] = gw->quarantined(gw, b->reps[i]) ? 1 : 0;
  size_t n_bad = 0;
  for (size_t i = 0; any && i < b->n_written; i++)
    n_bad += b->written[i].rep < b->n_reps && bad[b->written[i].rep];
  if (!n_bad) {
    free(bad);
    return 0;
  }
  /* the output file without those lines */
  int64_t size = b->rec.out_bytes;
  char *old = malloc((size_t)size + 1);
  int rc = old ? 0 : -ENOMEM;
  if (!rc && pread(b->out_fd, old, (size_t)size, 0) != (ssize_t)size) rc = -EIO;
  char *kept = rc ? NULL : malloc((size_t)size + 1);
  gw_bwritten *nw = rc ? NULL : malloc(b->n_written * sizeof(*nw));
  if (!rc && (!kept || !nw)) rc = -ENOMEM;
  /* everything but the bad lines' bytes is kept in order (lines written before this
   * gateway picked the batch up too: they are not known here) */
  int64_t pos = 0, cur = 0, removed = 0, in = 0, cached = 0, out = 0;
  size_t k = 0;
  gw_batch_rec next;
  memset(&next, 0, sizeof(next));
  for (size_t i = 0; !rc && i < b->n_written; i++) {
    gw_bwritten w = b->written[i];
    if (w.off < cur || w.off + w.len > size) {
      rc = -EIO; /* not what was written: leave the file alone */
      break;
    }
    if (!(w.rep < b->n_reps && bad[w.rep])) {
      w.off -= cur - pos; /* the bytes removed before it */
      nw[k++] = w;
      continue;
    }
    memcpy(kept + pos, old + cur, (size_t)(w.off - cur));
    pos += w.off - cur;
    cur = w.off + w.len;
    removed++;
    in += w.in_tok;
    cached += w.cached_tok;
    out += w.out_tok;
  }
  if (!rc) {
    memcpy(kept + pos, old + cur, (size_t)(size - cur));
    pos += size - cur;
  }
  if (!rc) rc = write_all(b->out_fd, kept, (size_t)pos, 0);
  if (!rc && ftruncate(b->out_fd, (off_t)pos) != 0) rc = -errno;
  if (!rc && gw->conf->batch_sync && fdatasync(b->out_fd) != 0) rc = -errno;
  if (!rc) rc = gw_batch_rec_copy(&next, &b->rec);
  if (!rc) rc = gw_bstore_begin(b->bs->st);
  for (size_t i = 0; !rc && i < b->n_written; i++) {
    const gw_bwritten *w = &b->written[i];
    if (w->rep < b->n_reps && bad[w->rep]) rc = gw_bstore_line_set(b->bs->st, b->rec.id, w->line, 0, 0);
  }
  if (!rc) {
    next.completed -= removed;
    next.input_tokens -= in;
    next.cached_tokens -= cached;
    next.output_tokens -= out;
    next.out_bytes = pos;
    rc = gw_bstore_batch_put(b->bs->st, &next);
  }
  if (!rc) rc = gw_bstore_commit(b->bs->st);
  free(old);
  free(kept);
  free(bad);
  if (rc) {
    free(nw);
    gw_bstore_rollback(b->bs->st);
    gw_batch_rec_clear(&next);
    run_write_failed(b, "running again the lines of a quarantined phone", rc);
    return rc;
  }
  free(b->written);
  b->written = nw;
  b->cap_written = b->n_written;
  b->n_written = k;
  gw_batch_rec_clear(&b->rec);
  b->rec = next;
  if (b->lines_counted) b->ow->use.lines += removed;
  b->bs->lines_completed -= (uint64_t)removed;
  b->seen_done -= removed;
  b->exhausted = 0;
  b->cur_gkey[0] = '\0';
  b->cur_line = 0;
  char msg[160];
  snprintf(msg, sizeof(msg), "%" PRId64 " output lines answered by a quarantined phone run again", removed);
  batch_log(PR_LOG_WARN, b, "batch lines run again", msg);
  return 1;
}

/* Write the answered lines and commit them. */
static void run_flush(gw_brun *b) {
  gw_batches *bs = b->bs;
  if (!b->ready.n) return;
  uint64_t now = uv_now(bs->gw->loop);
  if (b->flush_after_ms && now < b->flush_after_ms) return;
  b->flush_after_ms = 0;
  pr_buf ob, eb;
  pr_buf_init(&ob, SIZE_MAX / 2);
  pr_buf_init(&eb, SIZE_MAX / 2);
  int rc = 0;
  int64_t done = 0, failed = 0, expired = 0, in = 0, cached = 0, out = 0;
  size_t n_out = 0;
  for (gw_bline *l = b->ready.head; l && !rc; l = l->next) {
    pr_buf *dst = l->to_error ? &eb : &ob;
    n_out += !l->to_error;
    rc = pr_buf_append_str(dst, l->out);
    if (!rc) rc = pr_buf_append(dst, "\n", 1);
  }
  /* room to note the output lines' phones (out of memory: the flush waits) */
  if (!rc && b->n_written + n_out > b->cap_written) {
    size_t cap = (b->n_written + n_out) * 2;
    gw_bwritten *w = realloc(b->written, cap * sizeof(*w));
    if (!w) rc = -ENOMEM;
    else b->written = w, b->cap_written = cap;
  }
  if (!rc && ob.len) rc = write_all(b->out_fd, ob.data, ob.len, b->rec.out_bytes);
  if (!rc && eb.len) rc = write_all(b->err_fd, eb.data, eb.len, b->rec.err_bytes);
  if (!rc && bs->gw->conf->batch_sync) {
    if (ob.len && fdatasync(b->out_fd) != 0) rc = -errno;
    if (!rc && eb.len && fdatasync(b->err_fd) != 0) rc = -errno;
  }
  if (rc) {
    run_write_failed(b, "writing the output files under data_dir", rc);
    pr_buf_free(&ob);
    pr_buf_free(&eb);
    return;
  }
  gw_batch_rec next;
  if (gw_batch_rec_copy(&next, &b->rec) != 0) {
    pr_buf_free(&ob);
    pr_buf_free(&eb);
    return;
  }
  rc = gw_bstore_begin(bs->st);
  for (gw_bline *l = b->ready.head; l && !rc; l = l->next) {
    rc = gw_bstore_line_set(bs->st, b->rec.id, l->rec.line, l->to_error ? 2 : 1, l->rec.tries);
    if (l->to_error) failed++;
    else done++;
    expired += l->expired;
    in += l->in_tok;
    cached += l->cached_tok;
    out += l->out_tok;
  }
  next.completed += done;
  next.failed += failed;
  next.input_tokens += in;
  next.cached_tokens += cached;
  next.output_tokens += out;
  next.out_bytes += (int64_t)ob.len;
  next.err_bytes += (int64_t)eb.len;
  if (!rc) rc = gw_bstore_batch_put(bs->st, &next);
  if (!rc) rc = gw_bstore_commit(bs->st);
  pr_buf_free(&ob);
  pr_buf_free(&eb);
  if (rc) {
    gw_bstore_rollback(bs->st);
    gw_batch_rec_clear(&next);
    /* the bytes past the committed lengths are written over at the next try */
    run_write_failed(b, "committing to batch.db", rc);
    return;
  }
  int64_t off = b->rec.out_bytes;
  for (gw_bline *l = b->ready.head; l; l = l->next) {
    if (l->to_error) continue;
    int64_t len = (int64_t)strlen(l->out) + 1;
    gw_bwritten *w = &b->written[b->n_written++];
    *w = (gw_bwritten){.line = l->rec.line, .off = off, .len = len, .in_tok = l->in_tok,
                       .cached_tok = l->cached_tok, .out_tok = l->out_tok, .rep = run_rep(b, l->replica)};
    off += len;
  }
  gw_batch_rec_clear(&b->rec);
  b->rec = next;
  if (b->lines_counted) {
    b->ow->use.lines -= done + failed;
    if (b->ow->use.lines < 0) b->ow->use.lines = 0;
  }
  bs->lines_completed += (uint64_t)done;
  bs->lines_failed += (uint64_t)(failed - expired); /* expired lines are counted apart */
  bs->lines_expired += (uint64_t)expired;
  b->seen_done += done + failed;
  list_free(&b->ready);
  if (b->write_error) {
    batch_log(PR_LOG_INFO, b, "batch writes again", NULL);
    free(b->write_error);
    b->write_error = NULL;
  }
}

/* ---- the end of a batch -------------------------------------------------------------- */

static int output_file_row(gw_brun *b, const char *id, int64_t bytes, const char *kind) {
  gw_file_rec f;
  memset(&f, 0, sizeof(f));
  snprintf(f.id, sizeof(f.id), "%s", id);
  snprintf(f.owner, sizeof(f.owner), "%s", b->rec.owner);
  snprintf(f.filename, sizeof(f.filename), "%s_%s.jsonl", b->rec.id, kind);
  snprintf(f.purpose, sizeof(f.purpose), "batch_output");
  f.bytes = bytes;
  f.created_at = gw_batch_now();
  double ttl = b->bs->gw->conf->batch_output_expires_s;
  f.expires_at = ttl > 0 ? f.created_at + (int64_t)ttl : 0;
  int64_t seq = gw_bstore_next_seq(b->bs->st);
  if (seq < 0) return (int)seq;
  f.seq = seq;
  return gw_bstore_file_put(b->bs->st, &f);
}

/* Every line written: the output files become files of the owner's, the batch ends. */
static void run_finish(gw_brun *b, gw_batch_status final) {
  gw_batches *bs = b->bs;
  int64_t now = gw_batch_now();
  gw_batch_rec next;
  if (gw_batch_rec_copy(&next, &b->rec) != 0) return;
  if (!next.finalizing_at) next.finalizing_at = now;
  next.status = final;
  if (final == GW_BATCH_COMPLETED) next.completed_at = now;
  else if (final == GW_BATCH_EXPIRED) next.expired_at = now;
  else if (final == GW_BATCH_CANCELLED) next.cancelled_at = now;
  int rc = 0;
  if (bs->gw->conf->batch_sync) {
    if (b->out_fd >= 0 && fsync(b->out_fd) != 0) rc = -errno;
    if (!rc && b->err_fd >= 0 && fsync(b->err_fd) != 0) rc = -errno;
  }
  if (!rc) rc = gw_bstore_begin(bs->st);
  if (!rc && next.out_bytes > 0) rc = output_file_row(b, next.output_file_id, next.out_bytes, "output");
  if (!rc && next.err_bytes > 0) rc = output_file_row(b, next.error_file_id, next.err_bytes, "error");
  if (!rc) rc = gw_bstore_lines_clear(bs->st, next.id);
  if (!rc) rc = gw_bstore_batch_put(bs->st, &next);
  if (!rc) rc = gw_bstore_commit(bs->st);
  if (rc) {
    gw_bstore_rollback(bs->st);
    gw_batch_rec_clear(&next);
    run_write_failed(b, "finishing the batch", rc);
    return;
  }
  /* files without a line are no files */
  char path[4096];
  if (next.out_bytes == 0 && next.output_file_id[0]) {
    gw_bstore_path(bs->st, next.output_file_id, path, sizeof(path));
    unlink(path);
  }
  if (next.err_bytes == 0 && next.error_file_id[0]) {
    gw_bstore_path(bs->st, next.error_file_id, path, sizeof(path));
    unlink(path);
  }
  /* the owner's counts: a batch ended, and its output files are its files now */
  gw_batch_status final_s = next.status;
  next.status = b->rec.status;
  gw_batch_rec_clear(&b->rec);
  b->rec = next;
  run_status(b, final_s);
  gw_bquota_use *u = &b->ow->use;
  if (next.out_bytes > 0) {
    u->files++;
    u->file_bytes += next.out_bytes;
  }
  if (next.err_bytes > 0) {
    u->files++;
    u->file_bytes += next.err_bytes;
  }
  if (bs->gw->conf->batch_output_expires_s > 0)
    gw_batches_sweep_by(bs->gw, now + (int64_t)bs->gw->conf->batch_output_expires_s);
  batch_log(PR_LOG_INFO, b, "batch ended", NULL);
  run_unlink(bs, b);
  run_free(b);
}

/* Let go of the lines in flight (their jobs end as if their client left). */
static void run_drop_inflight(gw_brun *b) {
  while (b->inflight.head) {
    gw_bline *l = b->inflight.head;
    list_unlink(&b->inflight, l);
    gw_sink *s = l->sink;
    l->sink = NULL;
    if (s && s->ctx == l) gw_sink_gone(s);
    bline_free(l);
  }
}

/* The window ended: the pending lines are answered batch_expired, a chunk per call;
 * 1 when all are. */
static int run_expire_step(gw_brun *b) {
  gw_batches *bs = b->bs;
  gw_line_rec recs[BATCH_EXPIRE_CHUNK];
  int n = gw_bstore_lines_next(bs->st, b->rec.id, "", 0, recs, BATCH_EXPIRE_CHUNK);
  if (n < 0) {
    run_write_failed(b, "reading batch.db", n);
    return 0;
  }
  if (n == 0) return 1;
  for (int i = 0; i < n; i++) {
    gw_bline *l = calloc(1, sizeof(*l));
    if (!l) break;
    l->run = b;
    l->rec = recs[i];
    l->out = line_expired_output(&recs[i]);
    l->to_error = l->expired = 1;
    if (!l->out) {
      free(l);
      break;
    }
    list_push(&b->ready, l);
  }
  run_flush(b);
  return 0;
}

/* ---- the tick -------------------------------------------------------------------------- */

static void run_validate_step(gw_brun *b);

/* Its completion window ended: what was answered is written, the lines not run are
 * answered batch_expired (run_step, FINALIZING), then it ends expired. A batch still
 * validating has no line to answer: it ends with none. */
static void run_expire_begin(gw_brun *b, int64_t now_s) {
  if (b->rec.status == GW_BATCH_VALIDATING) {
    b->rec.total = 0;
    (void)gw_bstore_lines_clear(b->bs->st, b->rec.id);
    pr_buf_free(&b->v_buf);
  }
  run_status(b, GW_BATCH_FINALIZING);
  b->rec.finalizing_at = now_s;
  batch_log(PR_LOG_WARN, b, "batch expired", "its completion window ended");
  run_drop_inflight(b);
  list_free(&b->again);
}

static void run_step(gw_brun *b, int64_t now_s) {
  switch (b->rec.status) {
    case GW_BATCH_VALIDATING:
      if (now_s >= b->rec.expires_at) run_expire_begin(b, now_s);
      else if (b->v_active) run_validate_step(b);
      break;
    case GW_BATCH_IN_PROGRESS:
      if (now_s >= b->rec.expires_at) {
        run_expire_begin(b, now_s);
        break;
      }
      run_flush(b);
      run_refill(b);
      if (b->exhausted && !b->inflight.n && !b->again.n && !b->ready.n) {
        /* the cursor passed the end; lines retried behind it are pending again */
        int64_t left = gw_bstore_lines_pending(b->bs->st, b->rec.id);
        if (left == 0 && run_requarantine(b) != 0) break; /* lines to run again, or try later */
        if (left == 0) {
          run_finish(b, GW_BATCH_COMPLETED);
          return;
        }
        if (left > 0) {
          b->exhausted = 0;
          b->cur_gkey[0] = '\0';
          b->cur_line = 0;
        }
      }
      break;
    case GW_BATCH_FINALIZING: /* expiring: what was answered goes first */
      run_flush(b);
      /* a failure to read or finish is tried again once its pause is over, as a write is */
      if (!b->ready.n && (!b->write_error || uv_now(b->bs->gw->loop) >= b->flush_after_ms) &&
          run_expire_step(b))
        run_finish(b, GW_BATCH_EXPIRED);
      break;
    case GW_BATCH_CANCELLING:
      run_drop_inflight(b);
      list_free(&b->again);
      run_flush(b);
      if (!b->ready.n) run_finish(b, GW_BATCH_CANCELLED);
      break;
    default:
      break;
  }
}

/* Expired files go, a bounded step at a time (a step per tick while there are more); the
 * next look is when the next file expires, and at least every minute. A file a batch that
 * has not ended reads stays until that batch ends. */
static void files_sweep(gw_batches *bs, uint64_t now_ms, int64_t now_s) {
  gw_file_rec f[BATCH_SWEEP_FILES];
  int n = gw_bstore_files_expired(bs->st, now_s, f, BATCH_SWEEP_FILES);
  /* the rows go in one transaction, then their bytes */
  int rc = n > 0 ? gw_bstore_begin(bs->st) : 0;
  for (int i = 0; i < n && !rc; i++) rc = gw_bstore_file_delete(bs->st, f[i].id);
  if (n > 0 && !rc) rc = gw_bstore_commit(bs->st);
  if (rc) {
    gw_bstore_rollback(bs->st);
    n = -1; /* the store failed: look again later */
  }
  for (int i = 0; i < n; i++) {
    char path[4096];
    gw_bstore_path(bs->st, f[i].id, path, sizeof(path));
    unlink(path);
    gw_bowner *o = owner_get(bs, f[i].owner);
    if (o) {
      o->use.files -= o->use.files > 0;
      o->use.file_bytes -= f[i].bytes;
      if (o->use.file_bytes < 0) o->use.file_bytes = 0;
    }
  }
  if (n == BATCH_SWEEP_FILES) {
    bs->next_sweep_ms = now_ms + 1; /* more: the next step at the next tick */
    return;
  }
  bs->next_sweep_ms = now_ms + BATCH_FILE_SWEEP_MS;
  int64_t at = 0;
  if (n >= 0 && gw_bstore_files_next_expiry(bs->st, &at) == 0 && at > 0)
    gw_batches_sweep_by(bs->gw, at);
}

/* ---- turns: run slots, validation slots, each run's lines ------------------------------- */

enum { ADMIT_RUN, ADMIT_END };
static gw_brun *run_admit(gw_batches *bs, const char *id, int purpose);

/* The owner's oldest batch waiting for a run slot gets one: 1, or 0 when none waits (or
 * the store failed). */
static int admit_next(gw_batches *bs, gw_bowner *o) {
  gw_batch_ref refs[8];
  for (int page = 0; page < 16; page++) {
    int n = gw_bstore_batch_open(bs->st, o->name, o->cursor, refs, 8);
    if (n <= 0) return 0;
    for (int i = 0; i < n; i++) {
      o->cursor = refs[i].seq;
      if (run_find(bs, refs[i].id)) continue; /* being ended beyond the window */
      (void)run_admit(bs, refs[i].id, ADMIT_RUN);
      return 1;
    }
  }
  return 0;
}

/* Free run slots go to waiting batches, the owner with the fewest runs first, so one key's
 * thousand batches do not hold back another key's one. */
static void runs_fill(gw_batches *bs) {
  gw_server *gw = bs->gw;
  if (gw->shutting_down) return;
  for (int step = 0; step < BATCH_FILL_STEP && bs->n_window < gw->conf->batch_max_running; step++) {
    gw_bowner *pick = NULL;
    for (gw_bowner *o = bs->owners; o; o = o->next)
      if (!o->stuck && o->use.batches > o->runs && owner_may_run(gw, o) &&
          (!pick || o->window < pick->window))
        pick = o;
    if (!pick) return;
    if (!admit_next(bs, pick)) pick->stuck = 1;
  }
}

/* A full window is shared: while a key with batches waiting holds fewer run slots than its
 * fair share (batch.max_running over the keys with batches not ended), the key holding the
 * most gives back its newest run, one a tick: a batch waiting to be validated loses
 * nothing, a running one lets go of its lines in flight (they stay pending, as at a
 * graceful stop) once what was answered is written. It waits again, first in its key's
 * turn (the cursor goes back before it). */
static void runs_rebalance(gw_batches *bs) {
  gw_server *gw = bs->gw;
  size_t cap = gw->conf->batch_max_running;
  if (gw->shutting_down || bs->n_window < cap) return;
  int keys = 0;
  for (gw_bowner *o = bs->owners; o; o = o->next) keys += o->use.batches > 0 && owner_may_run(gw, o);
  int share = keys > 1 ? (int)(cap / (size_t)keys) : (int)cap;
  if (share < 1) share = 1;
  gw_bowner *starved = NULL, *rich = NULL;
  for (gw_bowner *o = bs->owners; o; o = o->next) {
    if (!o->stuck && o->use.batches > o->runs && o->window < share && owner_may_run(gw, o)) starved = o;
    if (o->window > share && (!rich || o->window > rich->window)) rich = o;
  }
  if (!starved || !rich) return;
  gw_brun *victim = NULL;
  for (gw_brun *b = bs->runs; b; b = b->next)
    if (b->ow == rich && !b->extra && (!victim || b->rec.seq > victim->rec.seq)) victim = b;
  if (!victim || victim->v_active ||
      (victim->rec.status != GW_BATCH_VALIDATING && victim->rec.status != GW_BATCH_IN_PROGRESS))
    return;
  if (victim->rec.status == GW_BATCH_IN_PROGRESS) {
    run_flush(victim);
    if (victim->ready.n) return; /* it could not write: it keeps its slot until it can */
    run_drop_inflight(victim);
  }
  batch_log(PR_LOG_INFO, victim, "batch waits for a run slot", "another key's batches had none");
  if (rich->cursor >= victim->rec.seq) rich->cursor = victim->rec.seq - 1;
  rich->stuck = 0;
  run_unlink(bs, victim);
  run_free(victim);
}

/* Validation slots (batch.validations): a validation once begun keeps its slot; free ones
 * go first to owners validating nothing yet, then in the order runs were given. */
static void validations_choose(gw_batches *bs) {
  int cap = bs->gw->conf->batch_validations, n = 0;
  for (gw_brun *b = bs->runs; b; b = b->next) n += b->v_active;
  for (int pass = 0; pass < 2 && n < cap; pass++)
    for (gw_brun *b = bs->runs; b && n < cap; b = b->next) {
      if (b->rec.status != GW_BATCH_VALIDATING || b->v_active) continue;
      if (pass == 0 && b->ow->validations > 0) continue;
      b->v_active = 1;
      b->ow->validations++;
      n++;
    }
}

/* Lines of each running batch in flight at once: batch.window, or the usable slots of the
 * phones that serve its model and a quarter more (so a slot that frees finds a line
 * waiting), shared between the keys running batches of that model by their weights, a
 * key's share within its concurrency and split between its batches. Worked out once a tick
 * for every run. */
static void runs_share(gw_batches *bs) {
  gw_server *gw = bs->gw;
  const gw_config *c = gw->conf;
  uint64_t now = uv_now(gw->loop);
  for (gw_brun *b = bs->runs; b; b = b->next) b->win = 0;
  for (gw_brun *m = bs->runs; m; m = m->next) {
    if (m->rec.status != GW_BATCH_IN_PROGRESS || m->win) continue;
    if (c->batch_window) {
      m->win = c->batch_window;
      continue;
    }
    /* m's model: its slots, the owners running it and their weights */
    const char *model = m->rec.model;
    size_t slots = 0;
    for (size_t i = 0; i < gw->n_replicas; i++) {
      int cap = gw_replica_capacity(gw->replicas[i], now);
      if (cap > 0 && gw_replica_serves(gw->replicas[i], model)) slots += (size_t)cap;
    }
    double w = (double)(slots + slots / 4 + 1), all = 0;
    for (gw_bowner *o = bs->owners; o; o = o->next) o->tmp = 0;
    for (gw_brun *b = bs->runs; b; b = b->next)
      if (b->rec.status == GW_BATCH_IN_PROGRESS && strcmp(b->rec.model, model) == 0 && !b->ow->tmp++) {
        const gw_key_conf *k = owner_key(gw, b->ow->name);
        all += k ? k->weight : 1;
      }
    for (gw_brun *b = bs->runs; b; b = b->next) {
      if (b->rec.status != GW_BATCH_IN_PROGRESS || strcmp(b->rec.model, model) != 0) continue;
      const gw_key_conf *k = owner_key(gw, b->ow->name);
      double share = all > 0 ? w * (k ? k->weight : 1) / all : w;
      if (k && k->concurrency > 0 && share > k->concurrency) share = k->concurrency;
      size_t mine = (size_t)ceil(share / (double)b->ow->tmp);
      b->win = mine ? mine : 1;
    }
  }
}

/* Waiting batches whose window ended expire: each gets a run beyond the window to write
 * its batch_expired lines (a few at a time), or ends at once when it has none. */
static void expire_waiting(gw_batches *bs, int64_t now_s) {
  gw_batch_ref refs[16];
  int64_t ce = 0, cs = 0;
  for (int page = 0; page < 4 && bs->n_extra < BATCH_EXTRA_MAX; page++) {
    int n = gw_bstore_batch_open_expired(bs->st, now_s, ce, cs, refs, 16);
    if (n <= 0) return;
    for (int i = 0; i < n && bs->n_extra < BATCH_EXTRA_MAX; i++) {
      ce = refs[i].expires_at;
      cs = refs[i].seq;
      if (run_find(bs, refs[i].id)) continue; /* its run expires it */
      gw_brun *b = run_admit(bs, refs[i].id, ADMIT_END);
      if (b && !gw_batch_status_final(b->rec.status) && b->rec.status != GW_BATCH_FINALIZING)
        run_expire_begin(b, now_s);
    }
    if (n < 16) return;
  }
}

static void tick_cb(uv_timer_t *t) {
  gw_batches *bs = t->data;
  uint64_t now = uv_now(bs->gw->loop);
  int64_t now_s = gw_batch_now();
  int busy = 0;
  runs_rebalance(bs);
  runs_fill(bs);
  validations_choose(bs);
  runs_share(bs);
  for (gw_brun *b = bs->runs, *next; b; b = next) {
    next = b->next;
    run_step(b, now_s);
  }
  for (gw_brun *b = bs->runs; b; b = b->next)
    if (((b->rec.status == GW_BATCH_VALIDATING && b->v_active) ||
         b->rec.status == GW_BATCH_FINALIZING || b->rec.status == GW_BATCH_CANCELLING) &&
        !(b->write_error && now < b->flush_after_ms)) /* one pausing after a failure waits */
      busy = 1;
  if (now >= bs->next_expiry_ms) {
    bs->next_expiry_ms = now + BATCH_EXPIRY_CHECK_MS;
    for (gw_bowner *o = bs->owners; o; o = o->next) o->stuck = 0; /* look again, now and then */
    expire_waiting(bs, now_s);
  }
  if (now >= bs->next_sweep_ms) files_sweep(bs, now, now_s);
  if (bs->next_sweep_ms <= now + 1) busy = 1;
  /* a validation or an expiry goes on at the next turn; else the tick's pace. Not 0:
   * before libuv 1.48 a timer restarted at 0 from its own callback runs again at once,
   * in the same turn, and the loop serves nothing else until the batch is not busy */
  uv_timer_start(&bs->timer, tick_cb, busy ? 1 : BATCH_TICK_MS, BATCH_TICK_MS);
}

/* ---- validation ---------------------------------------------------------------------- */

static void v_error(gw_brun *b, int64_t line, const char *code, const char *param,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void v_error(gw_brun *b, int64_t line, const char *code, const char *param,
                    const char *fmt, ...) {
  b->v_nerrors++;
  if (b->v_nerrors > BATCH_ERRORS_SHOWN) return;
  if (!b->v_errors) b->v_errors = cJSON_CreateArray();
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "code", code);
  cJSON_AddStringToObject(e, "message", msg);
  if (param) cJSON_AddStringToObject(e, "param", param);
  else cJSON_AddNullToObject(e, "param");
  if (line > 0) cJSON_AddNumberToObject(e, "line", (double)line);
  else cJSON_AddNullToObject(e, "line");
  cJSON_AddItemToArray(b->v_errors, e);
}

/* The key lines are run in: fingerprints of the prompt's first 1, 4, 16 and 64 blocks
 * (or of all it has), so lines that share a long prefix sort next to each other, and
 * those sharing only the first block still sit in one group. */
static void group_key(const pr_oai_req *q, char *out, size_t n) {
  static const size_t depth[] = {1, 4, 16, 64};
  size_t k = 0;
  out[0] = '\0';
  for (size_t i = 0; i < sizeof(depth) / sizeof(depth[0]) && q->n_blocks; i++) {
    size_t d = depth[i] < q->n_blocks ? depth[i] : q->n_blocks;
    k += (size_t)snprintf(out + k, n - k, "%016" PRIx64, q->blocks[d - 1]);
    if (k >= n) break;
  }
}

/* The longest input line taken: batch.max_line_bytes, and never more than a request body. */
static size_t line_cap(const gw_config *c) {
  return c->batch_max_line_bytes < c->max_body_bytes ? c->batch_max_line_bytes : c->max_body_bytes;
}

static void v_too_long(gw_brun *b, int64_t ln) {
  const gw_config *c = b->bs->gw->conf;
  v_error(b, ln, "line_too_long", NULL, "line %" PRId64 " is longer than %zu bytes (%s)", ln,
          line_cap(c), c->batch_max_line_bytes <= c->max_body_bytes ? "batch.max_line_bytes"
                                                                  : "limits.max_body_bytes");
}

static void v_line(gw_brun *b, const char *text, size_t len, int64_t off) {
  gw_server *gw = b->bs->gw;
  int64_t ln = ++b->v_line;
  if (len > line_cap(gw->conf)) {
    v_too_long(b, ln);
    return;
  }
  size_t i = 0;
  while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r')) i++;
  if (i == len) return; /* a blank line: nothing to run */
  if (b->rec.total >= (int64_t)gw->conf->batch_max_lines) {
    if (!b->v_too_many)
      v_error(b, ln, "too_many_lines", NULL, "a batch holds at most %zu lines (batch.max_lines)",
              gw->conf->batch_max_lines);
    b->v_too_many = 1;
    return;
  }
  /* the key's lines waiting, with this batch's, stay within its quota */
  gw_bquota_no no;
  if (!b->v_too_many &&
      gw_bquota_lines_check(owner_quota(gw, b->rec.owner), &b->ow->use, owner_label(b->rec.owner),
                            b->rec.total + 1, &no)) {
    v_error(b, ln, no.code, NULL, "line %" PRId64 ": %s", ln, no.msg);
    b->v_too_many = 1;
    return;
  }
  if (b->v_too_many) return;
  cJSON *o = cJSON_ParseWithLength(text, len);
  if (!cJSON_IsObject(o)) {
    v_error(b, ln, "invalid_json_line", NULL, "line %" PRId64 " is not a JSON object", ln);
    cJSON_Delete(o);
    return;
  }
  const cJSON *cid = cJSON_GetObjectItemCaseSensitive(o, "custom_id");
  const cJSON *method = cJSON_GetObjectItemCaseSensitive(o, "method");
  const cJSON *url = cJSON_GetObjectItemCaseSensitive(o, "url");
  const cJSON *body = cJSON_GetObjectItemCaseSensitive(o, "body");
  gw_line_rec rec;
  memset(&rec, 0, sizeof(rec));
  if (!cJSON_IsString(cid) || !cid->valuestring[0]) {
    v_error(b, ln, "missing_custom_id", "custom_id", "line %" PRId64 " has no custom_id string", ln);
  } else if (strlen(cid->valuestring) >= sizeof(rec.custom_id)) {
    v_error(b, ln, "invalid_custom_id", "custom_id", "line %" PRId64 ": custom_id is longer than %zu bytes",
            ln, sizeof(rec.custom_id) - 1);
  } else if (!cJSON_IsString(method) || strcmp(method->valuestring, "POST") != 0) {
    v_error(b, ln, "invalid_method", "method", "line %" PRId64 ": method must be \"POST\"", ln);
  } else if (!cJSON_IsString(url) || strcmp(url->valuestring, b->rec.endpoint) != 0) {
    v_error(b, ln, "invalid_url", "url",
            "line %" PRId64 ": url must be the batch's endpoint, %s", ln, b->rec.endpoint);
  } else if (!cJSON_IsObject(body)) {
    v_error(b, ln, "invalid_body", "body", "line %" PRId64 ": body must be an object", ln);
  } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "stream"))) {
    v_error(b, ln, "stream_not_supported", "body.stream",
            "line %" PRId64 ": a batch line cannot stream (body.stream is true)", ln);
  } else {
    char *bt = cJSON_PrintUnformatted(body);
    pr_oai_req q;
    pr_oai_error oe;
    memset(&q, 0, sizeof(q));
    memset(&oe, 0, sizeof(oe));
    pr_oai_kind kind = strcmp(b->rec.endpoint, "/v1/completions") == 0 ? PR_OAI_COMPLETION : PR_OAI_CHAT;
    if (!bt) {
      v_error(b, ln, "invalid_body", "body", "out of memory");
    } else if (pr_oai_parse(&q, kind, bt, strlen(bt), &oe) < 0 || pr_oai_check_fleet(&q, &oe) < 0) {
      v_error(b, ln, "invalid_body", oe.param[0] ? oe.param : "body", "line %" PRId64 ": %s", ln, oe.message);
    } else {
      /* a key limited to some models is told the same of a model it may not use whether
       * or not the fleet serves it, as the interactive path tells it */
      gw_caller *key = b->rec.owner[0] && gw->conf->n_keys ? gw_auth_caller(gw, b->rec.owner) : NULL;
      int allowed = gw_auth_model_allowed(key, q.model);
      /* served: some phone lists it, or the config names it (its lines wait for a phone,
       * as requests do: placement may bring one) */
      int served = allowed && gw_model_known(gw_models_find(&gw->models, q.model));
      if (!b->rec.model[0] && served) snprintf(b->rec.model, sizeof(b->rec.model), "%s", q.model);
      if (!allowed) {
        v_error(b, ln, "model_not_allowed", "body.model",
                "line %" PRId64 ": the key `%s` may not use the model `%s`", ln, b->rec.owner, q.model);
      } else if (!served) {
        v_error(b, ln, "model_not_found", "body.model",
                "line %" PRId64 ": the model `%s` is not served by this fleet", ln, q.model);
      } else if (strcmp(q.model, b->rec.model) != 0) {
        v_error(b, ln, "mismatched_model", "body.model",
                "line %" PRId64 ": every line of a batch must use one model (`%s`, not `%s`)", ln,
                b->rec.model, q.model);
      } else {
        snprintf(rec.custom_id, sizeof(rec.custom_id), "%s", cid->valuestring);
        group_key(&q, rec.gkey, sizeof(rec.gkey));
        rec.line = ln;
        rec.off = off;
        rec.len = (int64_t)len;
        int rc = gw_bstore_line_add(b->bs->st, b->rec.id, &rec);
        if (rc == PR_ERANGE)
          v_error(b, ln, "duplicate_custom_id", "custom_id",
                  "line %" PRId64 ": the custom_id `%s` is used by an earlier line", ln, rec.custom_id);
        else if (rc)
          v_error(b, ln, "internal_error", NULL, "batch.db: %s", gw_bstore_error(b->bs->st));
        else
          b->rec.total++;
      }
    }
    pr_oai_free(&q);
    free(bt);
  }
  cJSON_Delete(o);
}

static void run_fail_damaged(gw_brun *b, const char *why);

/* Validation failed, or it is over: the batch fails or starts. */
static void run_validated(gw_brun *b) {
  gw_batches *bs = b->bs;
  int64_t now = gw_batch_now();
  if (!b->v_nerrors && b->rec.total == 0)
    v_error(b, 0, "empty_file", "input_file_id", "the input file holds no request");
  if (b->v_nerrors) {
    if (b->v_nerrors > BATCH_ERRORS_SHOWN) {
      char more[128];
      snprintf(more, sizeof(more), "%" PRId64 " problems in all; the first %d are listed",
               b->v_nerrors, BATCH_ERRORS_SHOWN);
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "code", "too_many_errors");
      cJSON_AddStringToObject(e, "message", more);
      cJSON_AddNullToObject(e, "param");
      cJSON_AddNullToObject(e, "line");
      cJSON_AddItemToArray(b->v_errors, e);
    }
    free(b->rec.errors);
    b->rec.errors = cJSON_PrintUnformatted(b->v_errors);
    b->rec.total = 0;
    run_status(b, GW_BATCH_FAILED);
    b->rec.failed_at = now;
    int rc = gw_bstore_begin(bs->st);
    if (!rc) rc = gw_bstore_lines_clear(bs->st, b->rec.id);
    if (!rc) rc = run_save(b);
    if (!rc) rc = gw_bstore_commit(bs->st);
    if (rc) gw_bstore_rollback(bs->st);
    batch_log(PR_LOG_INFO, b, "batch failed validation", NULL);
    run_unlink(bs, b);
    run_free(b);
    return;
  }
  run_status(b, GW_BATCH_IN_PROGRESS);
  b->rec.in_progress_at = now;
  gw_batch_new_id(b->rec.output_file_id, sizeof(b->rec.output_file_id), "file-");
  gw_batch_new_id(b->rec.error_file_id, sizeof(b->rec.error_file_id), "file-");
  b->out_fd = open_file(b, b->rec.output_file_id, O_RDWR | O_CREAT | O_TRUNC);
  b->err_fd = open_file(b, b->rec.error_file_id, O_WRONLY | O_CREAT | O_TRUNC);
  if (b->out_fd < 0 || b->err_fd < 0) {
    char why[300];
    snprintf(why, sizeof(why), "data_dir: its output files cannot be created: %s", strerror(errno));
    run_fail_damaged(b, why);
    return;
  }
  if (run_save(b) != 0) run_write_failed(b, "saving to batch.db", -EIO);
  pr_buf_free(&b->v_buf);
  b->lines_counted = 1; /* its lines wait now: the key's count holds them */
  b->ow->use.lines += b->rec.total;
  b->seen_ms = uv_now(bs->gw->loop);
  batch_log(PR_LOG_INFO, b, "batch started", NULL);
}

static void run_validate_step(gw_brun *b) {
  gw_batches *bs = b->bs;
  /* what is held between steps is a line begun and not ended: at most line_cap bytes (and a
   * CR), so the buffer never holds more than that and one read */
  size_t cap = line_cap(bs->gw->conf) + 2;
  size_t want = BATCH_VALIDATE_BYTES;
  if (b->v_buf.len >= cap) { /* a reload lowered the limit below the line begun */
    v_too_long(b, b->v_line + 1);
    run_validated(b);
    return;
  }
  b->v_buf.max = cap + want; /* ...or raised it */
  if (pr_buf_reserve(&b->v_buf, want) != 0) {
    v_error(b, 0, "internal_error", NULL, "out of memory");
    run_validated(b);
    return;
  }
  ssize_t got = pread(b->in_fd, b->v_buf.data + b->v_buf.len, want,
                      (off_t)(b->v_off + (int64_t)b->v_buf.len));
  if (got < 0) {
    v_error(b, 0, "input_unreadable", "input_file_id", "the input file cannot be read: %s", strerror(errno));
    run_validated(b);
    return;
  }
  b->v_buf.len += (size_t)got;
  int eof = got == 0;
  if (gw_bstore_begin(bs->st) != 0) return; /* tried again at the next turn */
  size_t start = 0;
  for (;;) {
    char *nl = memchr(b->v_buf.data + start, '\n', b->v_buf.len - start);
    if (!nl) break;
    size_t len = (size_t)(nl - (b->v_buf.data + start));
    v_line(b, b->v_buf.data + start, len, b->v_off + (int64_t)start);
    start += len + 1;
  }
  if (eof && start < b->v_buf.len) {
    v_line(b, b->v_buf.data + start, b->v_buf.len - start, b->v_off + (int64_t)start);
    start = b->v_buf.len;
  }
  if (gw_bstore_commit(bs->st) != 0) {
    gw_bstore_rollback(bs->st);
    v_error(b, 0, "internal_error", NULL, "batch.db: %s", gw_bstore_error(bs->st));
    run_validated(b);
    return;
  }
  b->v_off += (int64_t)start;
  memmove(b->v_buf.data, b->v_buf.data + start, b->v_buf.len - start);
  b->v_buf.len -= start;
  if (b->v_buf.len >= cap) {
    v_too_long(b, b->v_line + 1); /* at once: the rest of the line is not read */
    eof = 1;
  }
  if (eof) run_validated(b);
}

/* ---- runs from the store ------------------------------------------------------------- */

/* A run for rec, last in the list: in the window, or beyond it (extra). */
static gw_brun *run_new(gw_batches *bs, const gw_batch_rec *rec, gw_bowner *ow, int extra) {
  gw_brun *b = calloc(1, sizeof(*b));
  if (!b) return NULL;
  if (gw_batch_rec_copy(&b->rec, rec) != 0) {
    free(b);
    return NULL;
  }
  b->bs = bs;
  b->ow = ow;
  b->extra = extra;
  ow->runs++;
  if (extra) {
    bs->n_extra++;
  } else {
    bs->n_window++;
    ow->window++;
  }
  b->in_fd = b->out_fd = b->err_fd = -1;
  pr_buf_init(&b->v_buf, line_cap(bs->gw->conf) + BATCH_VALIDATE_BYTES + 2);
  b->in_fd = open_file(b, rec->input_file_id, O_RDONLY);
  b->seen_ms = uv_now(bs->gw->loop);
  b->next = NULL;
  gw_brun **p = &bs->runs;
  while (*p) p = &(*p)->next;
  *p = b;
  return b;
}

/* A batch whose files are not what batch.db says (deleted, truncated or replaced behind
 * the gateway's back) cannot go on: it fails, with the reason in its errors, and its
 * files are not presented as results. The others start as usual. */
static void run_fail_damaged(gw_brun *b, const char *why) {
  gw_batches *bs = b->bs;
  batch_log(PR_LOG_ERROR, b, "batch cannot go on", why);
  cJSON *errs = cJSON_CreateArray();
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "code", "batch_files_damaged");
  cJSON_AddStringToObject(e, "message", why);
  cJSON_AddNullToObject(e, "param");
  cJSON_AddNullToObject(e, "line");
  cJSON_AddItemToArray(errs, e);
  free(b->rec.errors);
  b->rec.errors = cJSON_PrintUnformatted(errs);
  cJSON_Delete(errs);
  run_status(b, GW_BATCH_FAILED);
  b->rec.failed_at = gw_batch_now();
  b->rec.out_bytes = b->rec.err_bytes = 0; /* nothing of them is shown */
  int rc = gw_bstore_begin(bs->st);
  if (!rc) rc = gw_bstore_lines_clear(bs->st, b->rec.id);
  if (!rc) rc = run_save(b);
  if (!rc) rc = gw_bstore_commit(bs->st);
  if (rc) gw_bstore_rollback(bs->st);
  run_unlink(bs, b);
  run_free(b);
}

/* A run for the batch `id` from the store. ADMIT_RUN gives it a place in the window: a
 * validation starts over, a running batch goes on where its files were committed.
 * ADMIT_END makes one beyond the window only to end the batch (a cancel, an expiry), which
 * needs neither its input file nor a place. Returns the run, or NULL when there is none:
 * the batch has ended, failed as damaged (its files are not what batch.db says), or the
 * store could not be read. */
static gw_brun *run_admit(gw_batches *bs, const char *id, int purpose) {
  gw_batch_rec rec;
  int rc = gw_bstore_batch_get(bs->st, id, NULL, &rec);
  if (rc) {
    if (rc != PR_EUNKNOWN) pr_error("batch.db: the batch %s cannot be read: %s", id, gw_bstore_error(bs->st));
    return NULL;
  }
  gw_bowner *ow = gw_batch_status_final(rec.status) ? NULL : owner_get(bs, rec.owner);
  gw_brun *b = ow ? run_new(bs, &rec, ow, purpose != ADMIT_RUN) : NULL;
  gw_batch_rec_clear(&rec);
  if (!b) return NULL;
  if (b->rec.status == GW_BATCH_VALIDATING) {
    b->rec.total = 0;
    (void)gw_bstore_lines_clear(bs->st, id);
    if (purpose == ADMIT_RUN && b->in_fd < 0) {
      v_error(b, 0, "input_unreadable", "input_file_id", "the input file is gone");
      run_validated(b);
      return NULL;
    }
    return b;
  }
  b->lines_counted = 1; /* counted when it was validated, or from the store at start */
  /* cancelled while validating: it has no files */
  if (b->rec.status == GW_BATCH_CANCELLING && !b->rec.output_file_id[0]) return b;
  char why[600];
  b->out_fd = open_file(b, b->rec.output_file_id, O_RDWR | O_CREAT);
  b->err_fd = open_file(b, b->rec.error_file_id, O_WRONLY | O_CREAT);
  if (b->out_fd < 0 || b->err_fd < 0) {
    snprintf(why, sizeof(why), "data_dir: its output files cannot be opened: %s", strerror(errno));
    run_fail_damaged(b, why);
    return NULL;
  }
  /* what was written and not committed is cut off: those lines run again */
  struct stat so, se;
  if (fstat(b->out_fd, &so) != 0 || fstat(b->err_fd, &se) != 0 ||
      so.st_size < b->rec.out_bytes || se.st_size < b->rec.err_bytes) {
    snprintf(why, sizeof(why), "data_dir: its output files are shorter than batch.db says "
             "(%lld < %" PRId64 " or %lld < %" PRId64 "): they were truncated or replaced",
             (long long)so.st_size, b->rec.out_bytes, (long long)se.st_size, b->rec.err_bytes);
    run_fail_damaged(b, why);
    return NULL;
  }
  if (ftruncate(b->out_fd, (off_t)b->rec.out_bytes) != 0 ||
      ftruncate(b->err_fd, (off_t)b->rec.err_bytes) != 0) {
    snprintf(why, sizeof(why), "data_dir: its output files cannot be cut to their committed "
             "length: %s", strerror(errno));
    run_fail_damaged(b, why);
    return NULL;
  }
  if (purpose == ADMIT_RUN && b->rec.status == GW_BATCH_IN_PROGRESS && b->in_fd < 0) {
    snprintf(why, sizeof(why), "data_dir: its input file %s is gone", b->rec.input_file_id);
    run_fail_damaged(b, why);
    return NULL;
  }
  if (purpose == ADMIT_RUN) batch_log(PR_LOG_INFO, b, "batch picked up", NULL);
  return b;
}

static void usage_add(void *ud, const gw_bstore_usage *u) {
  gw_bowner *o = owner_get(ud, u->owner);
  if (!o) return;
  o->use.files = u->files;
  o->use.file_bytes = u->file_bytes;
  o->use.batches = u->batches;
  o->use.validating = u->validating;
  o->use.lines = u->lines;
}

/* Uploads a crash broke off left their partial files: nothing refers to them. */
static void sweep_uploads(const char *data_dir) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/files", data_dir);
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, ".upload-", 8) != 0) continue;
    char p[4400];
    snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
    if (unlink(p) == 0) pr_info("removed a broken-off upload: %s", p);
  }
  closedir(d);
}

int gw_batches_open(gw_server *gw, char *err, size_t errn) {
  err[0] = '\0';
  if (!gw->conf->data_dir) return 0;
  gw_batches *bs = calloc(1, sizeof(*bs));
  if (!bs) return -ENOMEM;
  bs->gw = gw;
  int rc = gw_bstore_open(gw->conf->data_dir, &bs->st, err, errn);
  if (rc) {
    free(bs);
    return rc;
  }
  gw->batches = bs;
  sweep_uploads(gw->conf->data_dir);
  /* what each key holds, for its quotas */
  rc = gw_bstore_usage_each(bs->st, usage_add, bs);
  /* batches whose cancel had begun end now; every other batch that has not ended waits
   * for its turn in the window, however many there are */
  int64_t now_s = gw_batch_now(), after = 0;
  gw_batch_ref refs[BATCH_PAGE];
  for (int n = BATCH_PAGE; !rc && n == BATCH_PAGE;) {
    if ((n = gw_bstore_batch_open(bs->st, NULL, after, refs, BATCH_PAGE)) < 0) rc = n;
    for (int i = 0; i < n; i++) {
      after = refs[i].seq;
      if (refs[i].status != GW_BATCH_CANCELLING) continue;
      gw_brun *b = run_admit(bs, refs[i].id, ADMIT_END);
      if (b) run_step(b, now_s);
    }
  }
  if (rc) {
    snprintf(err, errn, "%s/batch.db: %s", gw->conf->data_dir, gw_bstore_error(bs->st));
    return rc;
  }
  for (size_t k = 0; k <= gw->conf->batch_max_running / BATCH_FILL_STEP; k++) runs_fill(bs);
  uv_timer_init(gw->loop, &bs->timer);
  bs->timer.data = bs;
  bs->timer_open = 1;
  uv_timer_start(&bs->timer, tick_cb, 0, BATCH_TICK_MS);
  return 0;
}

static void batches_free(gw_batches *bs) {
  while (bs->runs) {
    gw_brun *b = bs->runs;
    bs->runs = b->next;
    run_free(b);
  }
  while (bs->owners) {
    gw_bowner *o = bs->owners;
    bs->owners = o->next;
    free(o);
  }
  gw_bstore_close(bs->st);
  free(bs);
}

static void timer_closed(uv_handle_t *h) { batches_free(h->data); }

void gw_batches_close(gw_server *gw) {
  gw_batches *bs = gw->batches;
  if (!bs) return;
  gw->batches = NULL;
  for (gw_brun *b = bs->runs; b; b = b->next) {
    run_flush(b); /* what was answered is kept */
    run_drop_inflight(b);
  }
  if (bs->timer_open) {
    bs->timer_open = 0;
    uv_timer_stop(&bs->timer);
    uv_close((uv_handle_t *)&bs->timer, timer_closed);
  } else {
    batches_free(bs); /* the open failed before the timer was made */
  }
}

/* ---- for the API ----------------------------------------------------------------------- */

int gw_batches_create(gw_server *gw, const gw_batch_rec *rec) {
  gw_batches *bs = gw->batches;
  if (!bs) return PR_EUNKNOWN;
  gw_bowner *o = owner_get(bs, rec->owner);
  if (!o) return -ENOMEM;
  int rc = gw_bstore_batch_put(bs->st, rec);
  if (rc) return rc;
  /* it waits for its turn in the window (runs_fill, at the next loop turn) */
  o->use.batches++;
  o->use.validating++;
  o->stuck = 0;
  kick(bs);
  return 0;
}

int gw_batches_get(gw_server *gw, const char *id, const char *owner, gw_batch_rec *out) {
  gw_batches *bs = gw->batches;
  if (!bs) return PR_EUNKNOWN;
  gw_brun *b = run_find(bs, id);
  if (b) {
    if (owner && strcmp(owner, b->rec.owner) != 0) return PR_EUNKNOWN;
    return gw_batch_rec_copy(out, &b->rec);
  }
  return gw_bstore_batch_get(bs->st, id, owner, out);
}

int gw_batches_cancel(gw_server *gw, const char *id, const char *owner, gw_batch_rec *out) {
  gw_batches *bs = gw->batches;
  if (!bs) return PR_EUNKNOWN;
  gw_brun *b = run_find(bs, id);
  if (b && owner && strcmp(owner, b->rec.owner) != 0) return PR_EUNKNOWN;
  if (!b) {
    /* one waiting for its turn: a run beyond the window is made to end it, now */
    int rc = gw_bstore_batch_get(bs->st, id, owner, out);
    if (rc) return rc;
    if (out->status != GW_BATCH_VALIDATING && out->status != GW_BATCH_IN_PROGRESS) return PR_ERANGE;
    gw_batch_rec_clear(out);
    if (!(b = run_admit(bs, id, ADMIT_END))) {
      /* it could not go on (its files were damaged): it failed instead */
      rc = gw_bstore_batch_get(bs->st, id, owner, out);
      return rc ? rc : PR_ERANGE;
    }
  }
  if (b->rec.status == GW_BATCH_VALIDATING || b->rec.status == GW_BATCH_IN_PROGRESS) {
    if (b->rec.status == GW_BATCH_VALIDATING) b->rec.total = 0;
    run_status(b, GW_BATCH_CANCELLING);
    b->rec.cancelling_at = gw_batch_now();
    if (!b->rec.output_file_id[0]) {
      /* cancelled while validating: nothing ran */
      (void)gw_bstore_lines_clear(bs->st, b->rec.id);
    }
    (void)run_save(b);
    batch_log(PR_LOG_INFO, b, "batch cancelling", NULL);
    run_drop_inflight(b); /* the phones' slots go to other work now */
    kick(bs);
  }
  int rc = gw_batch_rec_copy(out, &b->rec) == 0 ? (b->rec.status == GW_BATCH_CANCELLING ? 0 : PR_ERANGE)
                                                : -ENOMEM;
  if (b->extra && b->rec.status == GW_BATCH_CANCELLING) {
    /* nothing of it runs: it ends now (its run goes with it) */
    run_step(b, gw_batch_now());
    gw_batch_rec now;
    if (rc == 0 && gw_bstore_batch_get(bs->st, id, NULL, &now) == 0) {
      gw_batch_rec_clear(out);
      *out = now;
    }
  }
  return rc;
}

static void add_time(cJSON *o, const char *k, int64_t v) {
  if (v > 0) cJSON_AddNumberToObject(o, k, (double)v);
  else cJSON_AddNullToObject(o, k);
}

cJSON *gw_batch_json(gw_server *gw, const gw_batch_rec *b, int with_owner) {
  cJSON *o = cJSON_CreateObject();
  int ended = gw_batch_status_final(b->status);
  cJSON_AddStringToObject(o, "id", b->id);
  cJSON_AddStringToObject(o, "object", "batch");
  cJSON_AddStringToObject(o, "endpoint", b->endpoint);
  cJSON *errs = b->errors ? cJSON_Parse(b->errors) : NULL;
  gw_brun *run = gw->batches ? run_find(gw->batches, b->id) : NULL;
  if (errs || (run && run->write_error)) {
    cJSON *e = cJSON_AddObjectToObject(o, "errors");
    cJSON_AddStringToObject(e, "object", "list");
    if (!errs) errs = cJSON_CreateArray();
    if (run && run->write_error) {
      cJSON *w = cJSON_CreateObject();
      cJSON_AddStringToObject(w, "code", "output_write_failed");
      cJSON_AddStringToObject(w, "message", run->write_error);
      cJSON_AddNullToObject(w, "param");
      cJSON_AddNullToObject(w, "line");
      cJSON_AddItemToArray(errs, w);
    }
    cJSON_AddItemToObject(e, "data", errs);
  } else {
    cJSON_AddNullToObject(o, "errors");
  }
  cJSON_AddStringToObject(o, "input_file_id", b->input_file_id);
  cJSON_AddStringToObject(o, "completion_window", b->completion_window);
  cJSON_AddStringToObject(o, "status", gw_batch_status_name(b->status));
  if (ended && b->out_bytes > 0) cJSON_AddStringToObject(o, "output_file_id", b->output_file_id);
  else cJSON_AddNullToObject(o, "output_file_id");
  if (ended && b->err_bytes > 0) cJSON_AddStringToObject(o, "error_file_id", b->error_file_id);
  else cJSON_AddNullToObject(o, "error_file_id");
  add_time(o, "created_at", b->created_at);
  add_time(o, "in_progress_at", b->in_progress_at);
  add_time(o, "expires_at", b->expires_at);
  add_time(o, "finalizing_at", b->finalizing_at);
  add_time(o, "completed_at", b->completed_at);
  add_time(o, "failed_at", b->failed_at);
  add_time(o, "expired_at", b->expired_at);
  add_time(o, "cancelling_at", b->cancelling_at);
  add_time(o, "cancelled_at", b->cancelled_at);
  cJSON *rc = cJSON_AddObjectToObject(o, "request_counts");
  cJSON_AddNumberToObject(rc, "total", (double)b->total);
  cJSON_AddNumberToObject(rc, "completed", (double)b->completed);
  cJSON_AddNumberToObject(rc, "failed", (double)b->failed);
  cJSON *md = b->metadata ? cJSON_Parse(b->metadata) : NULL;
  if (md) cJSON_AddItemToObject(o, "metadata", md);
  else cJSON_AddNullToObject(o, "metadata");
  if (b->model[0]) cJSON_AddStringToObject(o, "model", b->model);
  cJSON *u = cJSON_AddObjectToObject(o, "usage");
  cJSON_AddNumberToObject(u, "input_tokens", (double)b->input_tokens);
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens",
                          (double)b->cached_tokens);
  cJSON_AddNumberToObject(u, "output_tokens", (double)b->output_tokens);
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", 0);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(b->input_tokens + b->output_tokens));
  if (with_owner) {
    cJSON_AddStringToObject(o, "owner", b->owner);
    /* not ended and waiting its turn: for a run slot (in the window), or to be validated */
    if (!ended && !run) cJSON_AddStringToObject(o, "queued", "run_slot");
    else if (run && b->status == GW_BATCH_VALIDATING && !run->v_active)
      cJSON_AddStringToObject(o, "queued", "validation_slot");
    else cJSON_AddNullToObject(o, "queued");
    /* a running batch's pace, and (once it has run lines) its cache hits */
    cJSON *p = run || b->input_tokens > 0 ? cJSON_AddObjectToObject(o, "progress") : NULL;
    int64_t left = run ? b->total - b->completed - b->failed : 0;
    if (p) cJSON_AddNumberToObject(p, "lines_left", (double)(left > 0 ? left : 0));
    if (run) {
      double el = (double)(uv_now(gw->loop) - run->seen_ms) / 1000.0;
      double rate = el > 1 && run->seen_done > 0 ? (double)run->seen_done / el : 0;
      cJSON_AddNumberToObject(p, "in_flight", (double)run->inflight.n);
      cJSON_AddNumberToObject(p, "waiting_to_retry", (double)run->again.n);
      cJSON_AddNumberToObject(p, "lines_per_s", round(rate * 1000) / 1000);
      if (rate > 0) cJSON_AddNumberToObject(p, "eta_s", round((double)left / rate));
      else cJSON_AddNullToObject(p, "eta_s");
    }
    if (p && b->input_tokens > 0)
      cJSON_AddNumberToObject(p, "cache_hit_rate",
                              round((double)b->cached_tokens / (double)b->input_tokens * 1000) / 1000);
    else if (p)
      cJSON_AddNullToObject(p, "cache_hit_rate");
  }
  return o;
}

cJSON *gw_batches_admin_list(gw_server *gw) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON *data = cJSON_AddArrayToObject(o, "data");
  gw_batches *bs = gw->batches;
  if (!bs) return o;
  enum { SHOWN = 100 };
  gw_batch_rec *recs = calloc(SHOWN + 1, sizeof(*recs));
  int n = recs ? gw_bstore_batch_list(bs->st, NULL, NULL, SHOWN, recs) : 0;
  for (int i = 0; i < n; i++) {
    if (i < SHOWN) {
      gw_brun *run = run_find(bs, recs[i].id);
      cJSON_AddItemToArray(data, gw_batch_json(gw, run ? &run->rec : &recs[i], 1));
    }
    gw_batch_rec_clear(&recs[i]);
  }
  cJSON_AddBoolToObject(o, "has_more", n > SHOWN);
  free(recs);
  return o;
}

int gw_batches_admin_cancel(gw_server *gw, const char *id, cJSON **out) {
  gw_batch_rec rec;
  memset(&rec, 0, sizeof(rec));
  int rc = gw_batches_cancel(gw, id, NULL, &rec);
  *out = rc == 0 || rc == PR_ERANGE ? gw_batch_json(gw, &rec, 1) : NULL;
  gw_batch_rec_clear(&rec);
  return rc;
}

void gw_batches_stats(gw_server *gw, gw_batch_stats *out) {
  memset(out, 0, sizeof(*out));
  gw_batches *bs = gw->batches;
  if (!bs) return;
  out->lines_completed = bs->lines_completed;
  out->lines_failed = bs->lines_failed;
  out->lines_expired = bs->lines_expired;
  /* lines not answered of every batch that has not ended, less those on their way */
  int64_t waiting = 0, queued = 0;
  for (gw_bowner *o = bs->owners; o; o = o->next) {
    waiting += o->use.lines;
    queued += o->use.batches - o->runs;
  }
  for (gw_brun *b = bs->runs; b; b = b->next) {
    if (b->lines_counted) waiting -= (int64_t)(b->inflight.n + b->ready.n);
    if (b->rec.status != GW_BATCH_IN_PROGRESS) continue;
    out->running++;
    out->lines_in_flight += b->inflight.n;
  }
  out->lines_waiting = waiting > 0 ? (size_t)waiting : 0;
  out->queued = queued > 0 ? (size_t)queued : 0;
}

/* One key's Batch API use against its quotas: {"files": {"used", "limit"}, ...}; limit 0
 * is none. NULL when the Batch API is off. */
cJSON *gw_batches_key_json(gw_server *gw, const char *owner) {
  gw_batches *bs = gw->batches;
  if (!bs) return NULL;
  gw_bowner *o = owner_find(bs, owner);
  gw_bowner zero;
  if (!o) {
    memset(&zero, 0, sizeof(zero));
    o = &zero;
  }
  const gw_bquota *q = owner_quota(gw, owner);
  cJSON *j = cJSON_CreateObject();
  /* the uploads-per-minute bucket's used part: uploads begun in about the last minute */
  double used_up = 0;
  if (q->uploads_per_min > 0 && o->use.up_started) {
    double cap = q->uploads_per_min > 1 ? q->uploads_per_min : 1;
    double el = (double)(uv_now(gw->loop) - o->use.up_ms) * q->uploads_per_min / 60000.0;
    double tokens = o->use.up_tokens + el > cap ? cap : o->use.up_tokens + el;
    used_up = round((cap - tokens) * 10) / 10;
  }
  struct {
    const char *k;
    double used, limit;
  } rows[] = {
    {"files", (double)(o->use.files + o->use.uploads), (double)q->files},
    {"file_bytes", (double)(o->use.file_bytes + o->use.upload_bytes), (double)q->file_bytes},
    {"uploads_per_min", used_up, q->uploads_per_min},
    {"batches", (double)o->use.batches, (double)q->batches},
    {"validating", (double)o->use.validating, (double)q->validating},
    {"lines", (double)o->use.lines, (double)q->lines},
  };
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
    cJSON *r = cJSON_AddObjectToObject(j, rows[i].k);
    cJSON_AddNumberToObject(r, "used", rows[i].used);
    cJSON_AddNumberToObject(r, "limit", rows[i].limit);
  }
  cJSON_AddNumberToObject(j, "uploads_arriving", (double)o->use.uploads);
  int64_t queued = o->use.batches - o->runs;
  cJSON_AddNumberToObject(j, "batches_queued", (double)(queued > 0 ? queued : 0));
  cJSON_AddNumberToObject(j, "batches_running", (double)o->window);
  return j;
}
