/* The Batch API's state in SQLite; see bstore.h. */
#include "bstore.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sqlite3.h>

#include "err.h"
#include "log.h"
#include "privfile.h"

#define BSTORE_STMTS 40 /* prepared statements kept, one per SQL text */

struct gw_bstore {
  sqlite3 *db;
  char dir[3900];
  struct {
    const char *sql; /* the text's address is its key: every SQL here is a static string */
    sqlite3_stmt *st;
  } cache[BSTORE_STMTS];
  int n_cache;
};

static const char *const status_names[GW_BATCH_STATUSES] = {
  "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
  "cancelled",
};

const char *gw_batch_status_name(gw_batch_status s) {
  return (unsigned)s < GW_BATCH_STATUSES ? status_names[s] : "unknown";
}

int gw_batch_status_parse(const char *name) {
  for (int i = 0; i < GW_BATCH_STATUSES; i++)
    if (strcmp(status_names[i], name) == 0) return i;
  return -1;
}

int gw_batch_status_final(gw_batch_status s) {
  return s == GW_BATCH_FAILED || s == GW_BATCH_COMPLETED || s == GW_BATCH_EXPIRED ||
         s == GW_BATCH_CANCELLED;
}

void gw_batch_rec_clear(gw_batch_rec *b) {
  free(b->errors);
  free(b->metadata);
  b->errors = b->metadata = NULL;
}

int gw_batch_rec_copy(gw_batch_rec *dst, const gw_batch_rec *src) {
  *dst = *src;
  dst->errors = src->errors ? strdup(src->errors) : NULL;
  dst->metadata = src->metadata ? strdup(src->metadata) : NULL;
  if ((src->errors && !dst->errors) || (src->metadata && !dst->metadata)) {
    gw_batch_rec_clear(dst);
    return -ENOMEM;
  }
  return 0;
}

/* The statuses of a batch that has not ended, written out so that SQLite matches the
 * queries' term with the partial indexes' (it compares the text, not bound values). */
#define OPEN_STATUSES "status IN (0, 2, 3, 6)"
_Static_assert(GW_BATCH_VALIDATING == 0 && GW_BATCH_IN_PROGRESS == 2 && GW_BATCH_FINALIZING == 3 &&
                   GW_BATCH_CANCELLING == 6,
               "OPEN_STATUSES names the statuses by number");

static const char SCHEMA[] =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY NOT NULL, v TEXT NOT NULL);"
    "INSERT OR IGNORE INTO meta VALUES ('schema', '1');"
    "INSERT OR IGNORE INTO meta VALUES ('seq', '0');"
    "CREATE TABLE IF NOT EXISTS files ("
    "  id TEXT PRIMARY KEY NOT NULL, owner TEXT NOT NULL, filename TEXT NOT NULL,"
    "  purpose TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL,"
    "  expires_at INTEGER NOT NULL, seq INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS files_seq ON files (owner, seq);"
    "CREATE TABLE IF NOT EXISTS batches ("
    "  id TEXT PRIMARY KEY NOT NULL, owner TEXT NOT NULL, endpoint TEXT NOT NULL,"
    "  input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status INTEGER NOT NULL,"
    "  created_at INTEGER, in_progress_at INTEGER, expires_at INTEGER, finalizing_at INTEGER,"
    "  completed_at INTEGER, failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER,"
    "  cancelled_at INTEGER, total INTEGER, completed INTEGER, failed INTEGER,"
    "  output_file_id TEXT, error_file_id TEXT, out_bytes INTEGER, err_bytes INTEGER,"
    "  errors TEXT, metadata TEXT, model TEXT, input_tokens INTEGER, cached_tokens INTEGER,"
    "  output_tokens INTEGER, seq INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS batches_seq ON batches (owner, seq);"
    "CREATE TABLE IF NOT EXISTS lines ("
    "  batch TEXT NOT NULL, line INTEGER NOT NULL, off INTEGER NOT NULL, len INTEGER NOT NULL,"
    "  custom_id TEXT NOT NULL, gkey TEXT NOT NULL, state INTEGER NOT NULL DEFAULT 0,"
    "  tries INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch, line));"
    "CREATE UNIQUE INDEX IF NOT EXISTS lines_custom_id ON lines (batch, custom_id);"
    "CREATE INDEX IF NOT EXISTS lines_todo ON lines (batch, state, gkey, line);"
    /* the batches that have not ended, however long the history: each key's in creation
     * order (turns for run slots, quotas), by expiry, by input file (file_in_use) */
    "CREATE INDEX IF NOT EXISTS batches_open ON batches (owner, seq) WHERE " OPEN_STATUSES ";"
    "CREATE INDEX IF NOT EXISTS batches_open_seq ON batches (seq) WHERE " OPEN_STATUSES ";"
    "CREATE INDEX IF NOT EXISTS batches_open_expiry ON batches (expires_at, seq) WHERE " OPEN_STATUSES ";"
    "CREATE INDEX IF NOT EXISTS batches_open_input ON batches (input_file_id) WHERE " OPEN_STATUSES ";"
    "CREATE INDEX IF NOT EXISTS files_expiry ON files (expires_at, seq) WHERE expires_at > 0;";

static void set_err(char *err, size_t n, const char *fmt, const char *a, const char *b) {
  if (err && n) snprintf(err, n, fmt, a, b);
}

int gw_bstore_open(const char *data_dir, gw_bstore **out, char *err, size_t errn) {
  *out = NULL;
  gw_bstore *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  if (strlen(data_dir) >= sizeof(s->dir)) {
    free(s);
    set_err(err, errn, "%s%s: the path is too long", data_dir, "");
    return PR_ETOOLARGE;
  }
  snprintf(s->dir, sizeof(s->dir), "%s", data_dir);
  char path[4096];
  snprintf(path, sizeof(path), "%s/files", data_dir);
  if (mkdir(path, 0700) != 0 && errno != EEXIST) {
    int e = errno;
    set_err(err, errn, "%s: %s", path, strerror(e));
    free(s);
    return -e;
  }
  snprintf(path, sizeof(path), "%s/batch.db", data_dir);
  /* callers' prompts and answers: 0600 whatever the umask, like the files beside it */
  char note[512];
  int kept = pr_privfile_keep_sqlite(path, note, sizeof(note));
  if (kept > 0) pr_warn("batch store: %s could be read by others: now 0600", note);
  else if (kept < 0 && kept != -ENOENT) /* a missing folder: SQLite's open says so */
    pr_warn("batch store: cannot make %s private (0600): %s", note, pr_strerror(kept));
  int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(s->db, 2000);
    char *msg = NULL;
    rc = sqlite3_exec(s->db, SCHEMA, NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
      /* a file that is no database says "file is not a database" here */
      set_err(err, errn, "%s: %s (move it away to start afresh, or restore it from a backup)",
              path, msg ? msg : sqlite3_errstr(rc));
      sqlite3_free(msg);
    }
  } else {
    set_err(err, errn, "%s: %s", path, s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
  }
  if (rc != SQLITE_OK) {
    sqlite3_close(s->db);
    free(s);
    return -EIO;
  }
  *out = s;
  return 0;
}

void gw_bstore_close(gw_bstore *s) {
  if (!s) return;
  for (int i = 0; i < s->n_cache; i++) sqlite3_finalize(s->cache[i].st);
  sqlite3_close(s->db);
  free(s);
}

void gw_bstore_path(const gw_bstore *s, const char *id, char *out, size_t n) {
  snprintf(out, n, "%s/files/%s", s->dir, id);
}

const char *gw_bstore_error(const gw_bstore *s) { return s && s->db ? sqlite3_errmsg(s->db) : ""; }

/* The prepared statement for sql (a static string), reset and unbound. */
static sqlite3_stmt *stmt(gw_bstore *s, const char *sql) {
  for (int i = 0; i < s->n_cache; i++)
    if (s->cache[i].sql == sql) {
      sqlite3_reset(s->cache[i].st);
      sqlite3_clear_bindings(s->cache[i].st);
      return s->cache[i].st;
    }
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return NULL;
  if (s->n_cache < BSTORE_STMTS) {
    s->cache[s->n_cache].sql = sql;
    s->cache[s->n_cache].st = st;
    s->n_cache++;
  }
  return st;
}

/* A statement outside the cache (cache full) is finalized after use. */
static void done(gw_bstore *s, sqlite3_stmt *st) {
  for (int i = 0; i < s->n_cache; i++)
    if (s->cache[i].st == st) {
      sqlite3_reset(st);
      return;
    }
  sqlite3_finalize(st);
}

static int exec_simple(gw_bstore *s, const char *sql) {
  return sqlite3_exec(s->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -EIO;
}

int gw_bstore_begin(gw_bstore *s) { return exec_simple(s, "BEGIN IMMEDIATE"); }
int gw_bstore_commit(gw_bstore *s) { return exec_simple(s, "COMMIT"); }
void gw_bstore_rollback(gw_bstore *s) { (void)exec_simple(s, "ROLLBACK"); }

static void bind_text(sqlite3_stmt *st, int i, const char *v) {
  if (v) sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT);
  else sqlite3_bind_null(st, i);
}

static void col_text(sqlite3_stmt *st, int i, char *out, size_t n) {
  const unsigned char *t = sqlite3_column_text(st, i);
  snprintf(out, n, "%s", t ? (const char *)t : "");
}

static char *col_dup(sqlite3_stmt *st, int i) {
  const unsigned char *t = sqlite3_column_text(st, i);
  return t ? strdup((const char *)t) : NULL;
}

int64_t gw_bstore_next_seq(gw_bstore *s) {
  static const char up[] = "UPDATE meta SET v = CAST(v AS INTEGER) + 1 WHERE k = 'seq' RETURNING v";
  sqlite3_stmt *st = stmt(s, up);
  if (!st) return -EIO;
  int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -EIO;
  done(s, st);
  return v;
}

/* ---- files ------------------------------------------------------------------------- */

#define FILE_COLS "id, owner, filename, purpose, bytes, created_at, expires_at, seq"

static void file_row(sqlite3_stmt *st, gw_file_rec *f) {
  memset(f, 0, sizeof(*f));
  col_text(st, 0, f->id, sizeof(f->id));
  col_text(st, 1, f->owner, sizeof(f->owner));
  col_text(st, 2, f->filename, sizeof(f->filename));
  col_text(st, 3, f->purpose, sizeof(f->purpose));
  f->bytes = sqlite3_column_int64(st, 4);
  f->created_at = sqlite3_column_int64(st, 5);
  f->expires_at = sqlite3_column_int64(st, 6);
  f->seq = sqlite3_column_int64(st, 7);
}

int gw_bstore_file_put(gw_bstore *s, const gw_file_rec *f) {
  static const char sql[] = "INSERT OR REPLACE INTO files (" FILE_COLS ") VALUES (?,?,?,?,?,?,?,?)";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, f->id);
  bind_text(st, 2, f->owner);
  bind_text(st, 3, f->filename);
  bind_text(st, 4, f->purpose);
  sqlite3_bind_int64(st, 5, f->bytes);
  sqlite3_bind_int64(st, 6, f->created_at);
  sqlite3_bind_int64(st, 7, f->expires_at);
  sqlite3_bind_int64(st, 8, f->seq);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -EIO;
  done(s, st);
  return rc;
}

int gw_bstore_file_get(gw_bstore *s, const char *id, const char *owner, gw_file_rec *out) {
  static const char sql[] = "SELECT " FILE_COLS " FROM files WHERE id = ? AND (?2 IS NULL OR owner = ?2)";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, id);
  bind_text(st, 2, owner);
  int r = sqlite3_step(st);
  int rc = r == SQLITE_ROW ? 0 : r == SQLITE_DONE ? PR_EUNKNOWN : -EIO;
  if (!rc) file_row(st, out);
  done(s, st);
  return rc;
}

int gw_bstore_file_delete(gw_bstore *s, const char *id) {
  static const char sql[] = "DELETE FROM files WHERE id = ?";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, id);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -EIO;
  done(s, st);
  return rc;
}

int gw_bstore_file_list(gw_bstore *s, const char *owner, const char *purpose, const char *after,
                        int asc, int limit, gw_file_rec *out) {
  int64_t after_seq = -1;
  if (after) {
    gw_file_rec a;
    int rc = gw_bstore_file_get(s, after, owner, &a);
    if (rc) return rc;
    after_seq = a.seq;
  }
  static const char sql_asc[] =
      "SELECT " FILE_COLS " FROM files WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR "
      "purpose = ?2) AND (?3 < 0 OR seq > ?3) ORDER BY seq ASC LIMIT ?4";
  static const char sql_desc[] =
      "SELECT " FILE_COLS " FROM files WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR "
      "purpose = ?2) AND (?3 < 0 OR seq < ?3) ORDER BY seq DESC LIMIT ?4";
  sqlite3_stmt *st = stmt(s, asc ? sql_asc : sql_desc);
  if (!st) return -EIO;
  bind_text(st, 1, owner);
  bind_text(st, 2, purpose);
  sqlite3_bind_int64(st, 3, after_seq);
  sqlite3_bind_int64(st, 4, (int64_t)limit + 1);
  int n = 0, r;
  while ((r = sqlite3_step(st)) == SQLITE_ROW && n <= limit) file_row(st, &out[n++]);
  done(s, st);
  return r == SQLITE_ROW || r == SQLITE_DONE ? n : -EIO;
}

/* a file a batch that has not ended reads is kept until that batch ends */
#define FILE_NOT_IN_USE                                                                     \
  "NOT EXISTS (SELECT 1 FROM batches b WHERE b.input_file_id = files.id AND b." OPEN_STATUSES ")"

int gw_bstore_files_expired(gw_bstore *s, int64_t now, gw_file_rec *out, int n) {
  static const char sql[] =
      "SELECT " FILE_COLS " FROM files WHERE expires_at > 0 AND expires_at <= ? AND "
      FILE_NOT_IN_USE " ORDER BY expires_at, seq LIMIT ?";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  sqlite3_bind_int64(st, 1, now);
  sqlite3_bind_int64(st, 2, n);
  int k = 0, r = SQLITE_DONE;
  while (k < n && (r = sqlite3_step(st)) == SQLITE_ROW) file_row(st, &out[k++]);
  done(s, st);
  return r == SQLITE_ROW || r == SQLITE_DONE ? k : -EIO;
}

int gw_bstore_files_next_expiry(gw_bstore *s, int64_t *at) {
  static const char sql[] = "SELECT expires_at FROM files WHERE expires_at > 0 AND "
                            FILE_NOT_IN_USE " ORDER BY expires_at, seq LIMIT 1";
  *at = 0;
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  int r = sqlite3_step(st);
  if (r == SQLITE_ROW) *at = sqlite3_column_int64(st, 0);
  done(s, st);
  return r == SQLITE_ROW || r == SQLITE_DONE ? 0 : -EIO;
}

int gw_bstore_file_in_use(gw_bstore *s, const char *id) {
  static const char sql[] =
      "SELECT 1 FROM batches WHERE input_file_id = ? AND " OPEN_STATUSES " LIMIT 1";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, id);
  int r = sqlite3_step(st);
  done(s, st);
  return r == SQLITE_ROW ? 1 : r == SQLITE_DONE ? 0 : -EIO;
}

/* ---- batches ----------------------------------------------------------------------- */

#define BATCH_COLS                                                                          \
  "id, owner, endpoint, input_file_id, completion_window, status, created_at, "             \
  "in_progress_at, expires_at, finalizing_at, completed_at, failed_at, expired_at, "        \
  "cancelling_at, cancelled_at, total, completed, failed, output_file_id, error_file_id, "  \
  "out_bytes, err_bytes, errors, metadata, model, input_tokens, cached_tokens, "            \
  "output_tokens, seq"

static void batch_row(sqlite3_stmt *st, gw_batch_rec *b) {
  memset(b, 0, sizeof(*b));
  col_text(st, 0, b->id, sizeof(b->id));
  col_text(st, 1, b->owner, sizeof(b->owner));
  col_text(st, 2, b->endpoint, sizeof(b->endpoint));
  col_text(st, 3, b->input_file_id, sizeof(b->input_file_id));
  col_text(st, 4, b->completion_window, sizeof(b->completion_window));
  b->status = (gw_batch_status)sqlite3_column_int(st, 5);
  int64_t *t[] = {&b->created_at, &b->in_progress_at, &b->expires_at, &b->finalizing_at,
                  &b->completed_at, &b->failed_at, &b->expired_at, &b->cancelling_at,
                  &b->cancelled_at, &b->total, &b->completed, &b->failed};
  for (int i = 0; i < 12; i++) *t[i] = sqlite3_column_int64(st, 6 + i);
  col_text(st, 18, b->output_file_id, sizeof(b->output_file_id));
  col_text(st, 19, b->error_file_id, sizeof(b->error_file_id));
  b->out_bytes = sqlite3_column_int64(st, 20);
  b->err_bytes = sqlite3_column_int64(st, 21);
  b->errors = col_dup(st, 22);
  b->metadata = col_dup(st, 23);
  col_text(st, 24, b->model, sizeof(b->model));
  b->input_tokens = sqlite3_column_int64(st, 25);
  b->cached_tokens = sqlite3_column_int64(st, 26);
  b->output_tokens = sqlite3_column_int64(st, 27);
  b->seq = sqlite3_column_int64(st, 28);
}

int gw_bstore_batch_put(gw_bstore *s, const gw_batch_rec *b) {
  static const char sql[] = "INSERT OR REPLACE INTO batches (" BATCH_COLS ") VALUES "
                            "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, b->id);
  bind_text(st, 2, b->owner);
  bind_text(st, 3, b->endpoint);
  bind_text(st, 4, b->input_file_id);
  bind_text(st, 5, b->completion_window);
  sqlite3_bind_int(st, 6, (int)b->status);
  const int64_t t[] = {b->created_at, b->in_progress_at, b->expires_at, b->finalizing_at,
                       b->completed_at, b->failed_at, b->expired_at, b->cancelling_at,
                       b->cancelled_at, b->total, b->completed, b->failed};
  for (int i = 0; i < 12; i++) sqlite3_bind_int64(st, 7 + i, t[i]);
  bind_text(st, 19, b->output_file_id);
  bind_text(st, 20, b->error_file_id);
  sqlite3_bind_int64(st, 21, b->out_bytes);
  sqlite3_bind_int64(st, 22, b->err_bytes);
  bind_text(st, 23, b->errors);
  bind_text(st, 24, b->metadata);
  bind_text(st, 25, b->model);
  sqlite3_bind_int64(st, 26, b->input_tokens);
  sqlite3_bind_int64(st, 27, b->cached_tokens);
  sqlite3_bind_int64(st, 28, b->output_tokens);
  sqlite3_bind_int64(st, 29, b->seq);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -EIO;
  done(s, st);
  return rc;
}

int gw_bstore_batch_get(gw_bstore *s, const char *id, const char *owner, gw_batch_rec *out) {
  static const char sql[] =
      "SELECT " BATCH_COLS " FROM batches WHERE id = ? AND (?2 IS NULL OR owner = ?2)";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, id);
  bind_text(st, 2, owner);
  int r = sqlite3_step(st);
  int rc = r == SQLITE_ROW ? 0 : r == SQLITE_DONE ? PR_EUNKNOWN : -EIO;
  if (!rc) batch_row(st, out);
  done(s, st);
  return rc;
}

int gw_bstore_batch_list(gw_bstore *s, const char *owner, const char *after, int limit,
                         gw_batch_rec *out) {
  int64_t after_seq = -1;
  if (after) {
    gw_batch_rec a;
    int rc = gw_bstore_batch_get(s, after, owner, &a);
    if (rc) return rc;
    after_seq = a.seq;
    gw_batch_rec_clear(&a);
  }
  static const char sql[] =
      "SELECT " BATCH_COLS " FROM batches WHERE (?1 IS NULL OR owner = ?1) AND (?2 < 0 OR "
      "seq < ?2) ORDER BY seq DESC LIMIT ?3";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, owner);
  sqlite3_bind_int64(st, 2, after_seq);
  sqlite3_bind_int64(st, 3, (int64_t)limit + 1);
  int n = 0, r;
  while ((r = sqlite3_step(st)) == SQLITE_ROW && n <= limit) batch_row(st, &out[n++]);
  done(s, st);
  return r == SQLITE_ROW || r == SQLITE_DONE ? n : -EIO;
}

static int ref_rows(gw_bstore *s, sqlite3_stmt *st, gw_batch_ref *out, int n) {
  int k = 0, r = SQLITE_DONE;
  while (k < n && (r = sqlite3_step(st)) == SQLITE_ROW) {
    gw_batch_ref *x = &out[k++];
    memset(x, 0, sizeof(*x));
    col_text(st, 0, x->id, sizeof(x->id));
    col_text(st, 1, x->owner, sizeof(x->owner));
    x->status = (gw_batch_status)sqlite3_column_int(st, 2);
    x->seq = sqlite3_column_int64(st, 3);
    x->expires_at = sqlite3_column_int64(st, 4);
  }
  done(s, st);
  return r == SQLITE_ROW || r == SQLITE_DONE ? k : -EIO;
}

int gw_bstore_batch_open(gw_bstore *s, const char *owner, int64_t after_seq, gw_batch_ref *out,
                         int n) {
  static const char mine[] = "SELECT id, owner, status, seq, expires_at FROM batches WHERE owner = ? "
                             "AND " OPEN_STATUSES " AND seq > ? ORDER BY seq LIMIT ?";
  static const char all[] = "SELECT id, owner, status, seq, expires_at FROM batches WHERE "
                            OPEN_STATUSES " AND seq > ? ORDER BY seq LIMIT ?";
  sqlite3_stmt *st = stmt(s, owner ? mine : all);
  if (!st) return -EIO;
  int i = 1;
  if (owner) bind_text(st, i++, owner);
  sqlite3_bind_int64(st, i++, after_seq);
  sqlite3_bind_int(st, i, n);
  return ref_rows(s, st, out, n);
}

int gw_bstore_batch_open_expired(gw_bstore *s, int64_t now, int64_t after_exp, int64_t after_seq,
                                 gw_batch_ref *out, int n) {
  static const char sql[] =
      "SELECT id, owner, status, seq, expires_at FROM batches WHERE " OPEN_STATUSES
      " AND expires_at <= ? AND (expires_at, seq) > (?, ?) ORDER BY expires_at, seq LIMIT ?";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  sqlite3_bind_int64(st, 1, now);
  sqlite3_bind_int64(st, 2, after_exp);
  sqlite3_bind_int64(st, 3, after_seq);
  sqlite3_bind_int(st, 4, n);
  return ref_rows(s, st, out, n);
}

int gw_bstore_usage_each(gw_bstore *s, void (*fn)(void *ud, const gw_bstore_usage *u), void *ud) {
  static const char sql[] =
      "SELECT owner, sum(f), sum(fb), sum(b), sum(v), sum(l) FROM ("
      " SELECT owner, count(*) AS f, sum(bytes) AS fb, 0 AS b, 0 AS v, 0 AS l FROM files GROUP BY owner"
      " UNION ALL"
      " SELECT owner, 0, 0, count(*), sum(status = 0),"
      "  sum(CASE WHEN status = 0 THEN 0 ELSE max(total - completed - failed, 0) END)"
      " FROM batches WHERE " OPEN_STATUSES " GROUP BY owner"
      ") GROUP BY owner ORDER BY owner";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  int r;
  while ((r = sqlite3_step(st)) == SQLITE_ROW) {
    gw_bstore_usage u = {
      .owner = (const char *)sqlite3_column_text(st, 0),
      .files = sqlite3_column_int64(st, 1),
      .file_bytes = sqlite3_column_int64(st, 2),
      .batches = sqlite3_column_int64(st, 3),
      .validating = sqlite3_column_int64(st, 4),
      .lines = sqlite3_column_int64(st, 5),
    };
    if (!u.owner) u.owner = "";
    fn(ud, &u);
  }
  done(s, st);
  return r == SQLITE_DONE ? 0 : -EIO;
}

int gw_bstore_backlog_each(gw_bstore *s, void (*fn)(void *ud, const gw_bstore_backlog *b), void *ud) {
  static const char sql[] =
      "SELECT b.id, b.model, b.created_at, b.expires_at, count(*), sum(l.len), b.completed,"
      " b.input_tokens, b.output_tokens FROM batches b JOIN lines l ON l.batch = b.id AND"
      " l.state = 0 WHERE b.status = 2 GROUP BY b.id ORDER BY b.seq";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  int r;
  while ((r = sqlite3_step(st)) == SQLITE_ROW) {
    gw_bstore_backlog b = {
      .id = (const char *)sqlite3_column_text(st, 0),
      .model = (const char *)sqlite3_column_text(st, 1),
      .created_at = sqlite3_column_int64(st, 2),
      .expires_at = sqlite3_column_int64(st, 3),
      .pending = sqlite3_column_int64(st, 4),
      .pending_bytes = sqlite3_column_int64(st, 5),
      .completed = sqlite3_column_int64(st, 6),
      .input_tokens = sqlite3_column_int64(st, 7),
      .output_tokens = sqlite3_column_int64(st, 8),
    };
    if (!b.id) continue;
    if (!b.model) b.model = "";
    fn(ud, &b);
  }
  done(s, st);
  return r == SQLITE_DONE ? 0 : -EIO;
}

/* ---- lines ------------------------------------------------------------------------- */

int gw_bstore_line_add(gw_bstore *s, const char *batch, const gw_line_rec *l) {
  static const char sql[] =
      "INSERT INTO lines (batch, line, off, len, custom_id, gkey) VALUES (?,?,?,?,?,?)";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, batch);
  sqlite3_bind_int64(st, 2, l->line);
  sqlite3_bind_int64(st, 3, l->off);
  sqlite3_bind_int64(st, 4, l->len);
  bind_text(st, 5, l->custom_id);
  bind_text(st, 6, l->gkey);
  int r = sqlite3_step(st);
  int ext = sqlite3_extended_errcode(s->db);
  done(s, st);
  if (r == SQLITE_DONE) return 0;
  return ext == SQLITE_CONSTRAINT_UNIQUE || ext == SQLITE_CONSTRAINT_PRIMARYKEY ? PR_ERANGE : -EIO;
}

int gw_bstore_lines_clear(gw_bstore *s, const char *batch) {
  static const char sql[] = "DELETE FROM lines WHERE batch = ?";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, batch);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -EIO;
  done(s, st);
  return rc;
}

int gw_bstore_lines_next(gw_bstore *s, const char *batch, const char *gkey, int64_t line,
                         gw_line_rec *out, int n) {
  static const char sql[] =
      "SELECT line, off, len, custom_id, gkey, tries FROM lines WHERE batch = ? AND state = 0 "
      "AND (gkey, line) > (?, ?) ORDER BY gkey, line LIMIT ?";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, batch);
  bind_text(st, 2, gkey);
  sqlite3_bind_int64(st, 3, line);
  sqlite3_bind_int(st, 4, n);
  int k = 0, r = SQLITE_DONE;
  while (k < n && (r = sqlite3_step(st)) == SQLITE_ROW) {
    gw_line_rec *l = &out[k++];
    memset(l, 0, sizeof(*l));
    l->line = sqlite3_column_int64(st, 0);
    l->off = sqlite3_column_int64(st, 1);
    l->len = sqlite3_column_int64(st, 2);
    col_text(st, 3, l->custom_id, sizeof(l->custom_id));
    col_text(st, 4, l->gkey, sizeof(l->gkey));
    l->tries = sqlite3_column_int(st, 5);
  }
  done(s, st);
  return r == SQLITE_ROW || r == SQLITE_DONE ? k : -EIO;
}

int gw_bstore_line_set(gw_bstore *s, const char *batch, int64_t line, int state, int tries) {
  static const char sql[] = "UPDATE lines SET state = ?, tries = ? WHERE batch = ? AND line = ?";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  sqlite3_bind_int(st, 1, state);
  sqlite3_bind_int(st, 2, tries);
  bind_text(st, 3, batch);
  sqlite3_bind_int64(st, 4, line);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -EIO;
  done(s, st);
  return rc;
}

int64_t gw_bstore_lines_pending(gw_bstore *s, const char *batch) {
  static const char sql[] = "SELECT count(*) FROM lines WHERE batch = ? AND state = 0";
  sqlite3_stmt *st = stmt(s, sql);
  if (!st) return -EIO;
  bind_text(st, 1, batch);
  int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -EIO;
  done(s, st);
  return v;
}
