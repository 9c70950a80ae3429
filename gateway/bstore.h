/* The Batch API's durable state: files, batches and each batch's lines, in one SQLite
 * database (WAL) under data_dir; the files' bytes are files of their own in
 * data_dir/files/ (gw_bstore_path). No libuv: batch.c drives it from the loop, and
 * tests/unit/test_bstore.c drives it alone.
 *
 * A line's life in the database: added while its batch is validated (state 0, pending),
 * then done (1, its output line written) or failed (2, its error line written). A line
 * running when the gateway stopped is still pending, so it runs again; one whose output
 * line was written is never pending again, because the line's state and the output
 * file's committed length change in one transaction (gw_bstore_commit_lines), and bytes
 * past that length are cut off when the batch is picked up again. */
#ifndef GW_BSTORE_H
#define GW_BSTORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct gw_bstore gw_bstore;

typedef enum {
  GW_BATCH_VALIDATING = 0,
  GW_BATCH_FAILED,
  GW_BATCH_IN_PROGRESS,
  GW_BATCH_FINALIZING,
  GW_BATCH_COMPLETED,
  GW_BATCH_EXPIRED,
  GW_BATCH_CANCELLING,
  GW_BATCH_CANCELLED,
  GW_BATCH_STATUSES
} gw_batch_status;

/* OpenAI's name of a status ("in_progress"); parse: -1 when unknown. */
const char *gw_batch_status_name(gw_batch_status s);
int gw_batch_status_parse(const char *name);
/* Whether a batch in status s has ended (failed, completed, expired, cancelled). */
int gw_batch_status_final(gw_batch_status s);

#define GW_BSTORE_ID_MAX 48
#define GW_BSTORE_OWNER_MAX 128

typedef struct gw_file_rec {
  char id[GW_BSTORE_ID_MAX];         /* "file-…" */
  char owner[GW_BSTORE_OWNER_MAX];   /* the API key's name; "" on a gateway without keys */
  char filename[256];
  char purpose[16];                  /* "batch" or "batch_output" */
  int64_t bytes;
  int64_t created_at;                /* Unix seconds */
  int64_t expires_at;                /* 0: never */
  int64_t seq;                       /* order of creation (lists, pages) */
} gw_file_rec;

typedef struct gw_batch_rec {
  char id[GW_BSTORE_ID_MAX];         /* "batch_…" */
  char owner[GW_BSTORE_OWNER_MAX];
  char endpoint[32];                 /* "/v1/chat/completions" or "/v1/completions" */
  char input_file_id[GW_BSTORE_ID_MAX];
  char completion_window[8];         /* "24h" */
  gw_batch_status status;
  /* Unix seconds; 0: not (yet) */
  int64_t created_at, in_progress_at, expires_at, finalizing_at, completed_at, failed_at,
      expired_at, cancelling_at, cancelled_at;
  int64_t total, completed, failed;
  /* the output and error files, named at the start of the run; shown once the batch has
   * ended (and only when they hold a line) */
  char output_file_id[GW_BSTORE_ID_MAX], error_file_id[GW_BSTORE_ID_MAX];
  int64_t out_bytes, err_bytes;      /* their committed lengths */
  char *errors;                      /* validation problems: a JSON array, or NULL (owned) */
  char *metadata;                    /* a JSON object, or NULL (owned) */
  char model[128];                   /* the lines' model (the first line's) */
  int64_t input_tokens, cached_tokens, output_tokens;
  int64_t seq;
} gw_batch_rec;

void gw_batch_rec_clear(gw_batch_rec *b); /* frees errors and metadata */
/* Copy src into dst (its own errors and metadata). 0 or -ENOMEM. */
int gw_batch_rec_copy(gw_batch_rec *dst, const gw_batch_rec *src);

typedef struct gw_line_rec {
  int64_t line;                      /* 1-based line number in the input file */
  int64_t off, len;                  /* its bytes there (without the newline) */
  char custom_id[256];
  char gkey[80];                     /* the prefix-group key lines are ordered by */
  int tries;                         /* runs that ended in a phone's failure so far */
} gw_line_rec;

/* Open (creating) data_dir/batch.db and data_dir/files/. 0, or a negative code with
 * err saying what is wrong in an operator's words (a corrupt database, no space...). */
int gw_bstore_open(const char *data_dir, gw_bstore **out, char *err, size_t errn);
void gw_bstore_close(gw_bstore *s);
/* The path of a stored file's bytes: data_dir/files/ID. */
void gw_bstore_path(const gw_bstore *s, const char *id, char *out, size_t n);
/* The last SQLite error message ("" none). */
const char *gw_bstore_error(const gw_bstore *s);
/* The next value of the creation order (files and batches share it). */
int64_t gw_bstore_next_seq(gw_bstore *s);

int gw_bstore_begin(gw_bstore *s);
int gw_bstore_commit(gw_bstore *s);
void gw_bstore_rollback(gw_bstore *s);

/* Files. get: owner NULL matches any; 0, PR_EUNKNOWN, or a negative code. */
int gw_bstore_file_put(gw_bstore *s, const gw_file_rec *f);
int gw_bstore_file_get(gw_bstore *s, const char *id, const char *owner, gw_file_rec *out);
int gw_bstore_file_delete(gw_bstore *s, const char *id);
/* Files of owner (NULL: all) with purpose (NULL: any), after the file `after` (NULL:
 * from the start) in order asc (1) or desc (0); up to limit + 1 rows so the caller sees
 * whether there are more. Returns the count put in out (sized limit + 1), or a negative
 * code (PR_EUNKNOWN: `after` is no such file). */
int gw_bstore_file_list(gw_bstore *s, const char *owner, const char *purpose, const char *after,
                        int asc, int limit, gw_file_rec *out);
/* Files whose expires_at has passed and that no batch that has not ended reads, soonest
 * first (at most n, into out). */
int gw_bstore_files_expired(gw_bstore *s, int64_t now, gw_file_rec *out, int n);
/* When the next of those files expires (Unix seconds; 0: none will). 0 or a negative code. */
int gw_bstore_files_next_expiry(gw_bstore *s, int64_t *at);
/* Whether a batch that has not ended reads the file (1), or not (0). */
int gw_bstore_file_in_use(gw_bstore *s, const char *id);

/* Batches: put inserts or replaces every column. get: owner NULL matches any. */
int gw_bstore_batch_put(gw_bstore *s, const gw_batch_rec *b);
int gw_bstore_batch_get(gw_bstore *s, const char *id, const char *owner, gw_batch_rec *out);
/* Newest first, after `after` (NULL: from the newest); up to limit + 1 rows into out
 * (each to be cleared by the caller). Count, or a negative code. */
int gw_bstore_batch_list(gw_bstore *s, const char *owner, const char *after, int limit,
                         gw_batch_rec *out);
/* A batch that has not ended, as the runner's turns see it. */
typedef struct gw_batch_ref {
  char id[GW_BSTORE_ID_MAX];
  char owner[GW_BSTORE_OWNER_MAX];
  gw_batch_status status;
  int64_t seq, expires_at;
} gw_batch_ref;

/* Batches that have not ended, oldest first, after the creation order after_seq (0: from
 * the first): of owner (NULL: everyone's). Count put into out (n at most), or a negative
 * code. An index holds only those batches, so this costs what they are, not the history. */
int gw_bstore_batch_open(gw_bstore *s, const char *owner, int64_t after_seq, gw_batch_ref *out,
                         int n);
/* Batches that have not ended whose expires_at <= now, soonest first, after the cursor
 * (expires_at, seq) (0, 0: from the first). Count, or a negative code. */
int gw_bstore_batch_open_expired(gw_bstore *s, int64_t now, int64_t after_exp, int64_t after_seq,
                                 gw_batch_ref *out, int n);

/* What each owner holds, for the quotas (bquota.h): its files and their bytes, its
 * batches not ended, of them those validating, and their lines not ended (validated
 * batches: total - completed - failed). fn is called once per owner that holds anything
 * (an owner with only files, or only batches, gets zeros for the rest). 0 or a negative
 * code. */
typedef struct gw_bstore_usage {
  const char *owner;
  int64_t files, file_bytes, batches, validating, lines;
} gw_bstore_usage;
int gw_bstore_usage_each(gw_bstore *s, void (*fn)(void *ud, const gw_bstore_usage *u), void *ud);

/* The work a batch that has not ended still holds, for the capacity advice: its lines not
 * answered yet and their bytes, with what its answered lines measured. */
typedef struct gw_bstore_backlog {
  const char *id, *model;
  int64_t created_at, expires_at;  /* Unix seconds */
  int64_t pending, pending_bytes;  /* lines not answered, and their bytes in the input */
  int64_t completed, input_tokens, output_tokens; /* the answered lines' usage */
} gw_bstore_backlog;
/* fn for each batch in progress with lines not answered. 0 or -EIO. */
int gw_bstore_backlog_each(gw_bstore *s, void (*fn)(void *ud, const gw_bstore_backlog *b), void *ud);

/* Lines. add: PR_ERANGE when the batch already has that custom_id. */
int gw_bstore_line_add(gw_bstore *s, const char *batch, const gw_line_rec *l);
int gw_bstore_lines_clear(gw_bstore *s, const char *batch);
/* Pending lines in run order (gkey, then line) after the cursor (gkey, line); an empty
 * gkey with line 0 is the start. Count put in out (n at most), or a negative code. */
int gw_bstore_lines_next(gw_bstore *s, const char *batch, const char *gkey, int64_t line,
                         gw_line_rec *out, int n);
/* A line's end: state 1 done, 2 failed; or its tries counted (state 0). */
int gw_bstore_line_set(gw_bstore *s, const char *batch, int64_t line, int state, int tries);
/* Pending lines counted. */
int64_t gw_bstore_lines_pending(gw_bstore *s, const char *batch);

#endif
