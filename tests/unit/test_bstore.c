/* gateway/bstore.c: the Batch API's SQLite store alone: what open creates and how a
 * corrupt database is refused, files (owner filtering, pages in both orders), batches
 * (lists; those not ended, everyone's and one owner's, from a cursor, and those past their
 * window), lines (a duplicate custom_id, run order with its cursor, their ends), what each
 * owner holds (the quotas' counts at start), expired files but not those a running batch
 * reads, and the creation order across a reopen. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "bstore.h"
#include "err.h"

typedef struct fixture {
  char dir[64];
  gw_bstore *s;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof(*f));
  if (!f) return -1;
  snprintf(f->dir, sizeof(f->dir), "/tmp/fg-bstore-XXXXXX");
  if (!mkdtemp(f->dir)) return -1;
  char err[512] = "";
  if (gw_bstore_open(f->dir, &f->s, err, sizeof(err)) != 0) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  gw_bstore_close(f->s);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
  int rc = system(cmd);
  free(f);
  return rc == 0 ? 0 : -1;
}

static void put_file(gw_bstore *s, const char *id, const char *owner, const char *purpose,
                     int64_t expires_at) {
  gw_file_rec r;
  memset(&r, 0, sizeof(r));
  snprintf(r.id, sizeof(r.id), "%s", id);
  snprintf(r.owner, sizeof(r.owner), "%s", owner);
  snprintf(r.filename, sizeof(r.filename), "%s.jsonl", id);
  snprintf(r.purpose, sizeof(r.purpose), "%s", purpose);
  r.bytes = 100;
  r.created_at = 1000;
  r.expires_at = expires_at;
  r.seq = gw_bstore_next_seq(s);
  assert_true(r.seq > 0);
  assert_int_equal(gw_bstore_file_put(s, &r), 0);
}

static void make_batch(gw_batch_rec *b, const char *id, const char *owner, gw_batch_status st,
                       int64_t seq) {
  memset(b, 0, sizeof(*b));
  snprintf(b->id, sizeof(b->id), "%s", id);
  snprintf(b->owner, sizeof(b->owner), "%s", owner);
  snprintf(b->endpoint, sizeof(b->endpoint), "/v1/chat/completions");
  snprintf(b->input_file_id, sizeof(b->input_file_id), "file-in");
  snprintf(b->completion_window, sizeof(b->completion_window), "24h");
  b->status = st;
  b->created_at = 1000;
  b->seq = seq;
}

static void add_line(gw_bstore *s, const char *batch, int64_t line, const char *cid,
                     const char *gkey, int expect) {
  gw_line_rec l;
  memset(&l, 0, sizeof(l));
  l.line = line;
  l.off = line * 10;
  l.len = 9;
  snprintf(l.custom_id, sizeof(l.custom_id), "%s", cid);
  snprintf(l.gkey, sizeof(l.gkey), "%s", gkey);
  assert_int_equal(gw_bstore_line_add(s, batch, &l), expect);
}

/* ---- open ------------------------------------------------------------------------------ */

static void test_open_creates_db_and_files_dir(void **state) {
  fixture *f = *state;
  char p[256];
  struct stat st;
  snprintf(p, sizeof(p), "%s/batch.db", f->dir);
  assert_int_equal(stat(p, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  snprintf(p, sizeof(p), "%s/files", f->dir);
  assert_int_equal(stat(p, &st), 0);
  assert_true(S_ISDIR(st.st_mode));
  gw_bstore_path(f->s, "file-abc", p, sizeof(p));
  char want[256];
  snprintf(want, sizeof(want), "%s/files/file-abc", f->dir);
  assert_string_equal(p, want);
  /* a second open of the same folder finds what the first made */
  gw_bstore *s2 = NULL;
  char err[512] = "";
  assert_int_equal(gw_bstore_open(f->dir, &s2, err, sizeof(err)), 0);
  gw_bstore_close(s2);
}

static void test_corrupt_db_is_a_clear_error(void **state) {
  (void)state;
  char dir[64];
  snprintf(dir, sizeof(dir), "/tmp/fg-bstore-XXXXXX");
  assert_non_null(mkdtemp(dir));
  char p[256];
  snprintf(p, sizeof(p), "%s/batch.db", dir);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  char junk[8192];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (char)(i * 131 + 7);
  assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
  close(fd);
  gw_bstore *s = (gw_bstore *)&s; /* set to NULL by the failed open */
  char err[512] = "";
  assert_int_equal(gw_bstore_open(dir, &s, err, sizeof(err)), -EIO);
  assert_null(s);
  assert_non_null(strstr(err, p));
  assert_non_null(strstr(err, "not a database"));
  /* a folder that is not there */
  char missing[128];
  snprintf(missing, sizeof(missing), "%s/nope", dir);
  err[0] = '\0';
  assert_true(gw_bstore_open(missing, &s, err, sizeof(err)) < 0);
  assert_null(s);
  assert_non_null(strstr(err, missing));
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* ---- files ----------------------------------------------------------------------------- */

static void test_file_put_get_and_owner(void **state) {
  fixture *f = *state;
  put_file(f->s, "file-a", "alice", "batch", 0);
  gw_file_rec r;
  assert_int_equal(gw_bstore_file_get(f->s, "file-a", NULL, &r), 0);
  assert_string_equal(r.id, "file-a");
  assert_string_equal(r.owner, "alice");
  assert_string_equal(r.filename, "file-a.jsonl");
  assert_string_equal(r.purpose, "batch");
  assert_int_equal(r.bytes, 100);
  assert_int_equal(r.created_at, 1000);
  assert_int_equal(gw_bstore_file_get(f->s, "file-a", "alice", &r), 0);
  /* another owner's file is no file of yours; "" (no keys) is an owner like any */
  assert_int_equal(gw_bstore_file_get(f->s, "file-a", "bob", &r), PR_EUNKNOWN);
  assert_int_equal(gw_bstore_file_get(f->s, "file-a", "", &r), PR_EUNKNOWN);
  assert_int_equal(gw_bstore_file_get(f->s, "file-none", NULL, &r), PR_EUNKNOWN);
  /* put replaces */
  r.bytes = 7;
  assert_int_equal(gw_bstore_file_put(f->s, &r), 0);
  assert_int_equal(gw_bstore_file_get(f->s, "file-a", NULL, &r), 0);
  assert_int_equal(r.bytes, 7);
  assert_int_equal(gw_bstore_file_delete(f->s, "file-a"), 0);
  assert_int_equal(gw_bstore_file_get(f->s, "file-a", NULL, &r), PR_EUNKNOWN);
}

static void test_file_list_pages(void **state) {
  fixture *f = *state;
  /* a1 b1 a2 a3 (batch_output) a4, in creation order */
  put_file(f->s, "file-a1", "alice", "batch", 0);
  put_file(f->s, "file-b1", "bob", "batch", 0);
  put_file(f->s, "file-a2", "alice", "batch", 0);
  put_file(f->s, "file-a3", "alice", "batch_output", 0);
  put_file(f->s, "file-a4", "alice", "batch", 0);
  gw_file_rec v[8];
  /* newest first, alice's only, two a page: limit + 1 rows say there are more */
  int n = gw_bstore_file_list(f->s, "alice", NULL, NULL, 0, 2, v);
  assert_int_equal(n, 3);
  assert_string_equal(v[0].id, "file-a4");
  assert_string_equal(v[1].id, "file-a3");
  assert_string_equal(v[2].id, "file-a2");
  n = gw_bstore_file_list(f->s, "alice", NULL, "file-a3", 0, 2, v);
  assert_int_equal(n, 2); /* the last page: no extra row */
  assert_string_equal(v[0].id, "file-a2");
  assert_string_equal(v[1].id, "file-a1");
  /* oldest first */
  n = gw_bstore_file_list(f->s, "alice", NULL, NULL, 1, 10, v);
  assert_int_equal(n, 4);
  assert_string_equal(v[0].id, "file-a1");
  assert_string_equal(v[3].id, "file-a4");
  n = gw_bstore_file_list(f->s, "alice", NULL, "file-a2", 1, 1, v);
  assert_int_equal(n, 2);
  assert_string_equal(v[0].id, "file-a3");
  assert_string_equal(v[1].id, "file-a4");
  /* purpose */
  n = gw_bstore_file_list(f->s, "alice", "batch", NULL, 1, 10, v);
  assert_int_equal(n, 3);
  for (int i = 0; i < n; i++) assert_string_equal(v[i].purpose, "batch");
  /* everybody's */
  n = gw_bstore_file_list(f->s, NULL, NULL, NULL, 1, 10, v);
  assert_int_equal(n, 5);
  assert_string_equal(v[1].id, "file-b1");
  n = gw_bstore_file_list(f->s, "bob", NULL, NULL, 0, 10, v);
  assert_int_equal(n, 1);
  assert_string_equal(v[0].id, "file-b1");
  /* `after` must be a file the owner can see */
  assert_int_equal(gw_bstore_file_list(f->s, "alice", NULL, "file-b1", 0, 10, v), PR_EUNKNOWN);
  assert_int_equal(gw_bstore_file_list(f->s, "alice", NULL, "file-zz", 0, 10, v), PR_EUNKNOWN);
  /* after the newest going down, after the oldest going up: nothing */
  assert_int_equal(gw_bstore_file_list(f->s, "alice", NULL, "file-a1", 0, 10, v), 0);
  assert_int_equal(gw_bstore_file_list(f->s, "alice", NULL, "file-a4", 1, 10, v), 0);
}

static void test_files_expired_and_in_use(void **state) {
  fixture *f = *state;
  put_file(f->s, "file-new", "", "batch", 5000);
  put_file(f->s, "file-old", "", "batch", 500);
  put_file(f->s, "file-keep", "", "batch", 0);
  gw_file_rec v[4];
  int64_t at = -1;
  assert_int_equal(gw_bstore_files_next_expiry(f->s, &at), 0);
  assert_int_equal(at, 500);
  assert_int_equal(gw_bstore_files_expired(f->s, 1000, v, 4), 1);
  assert_string_equal(v[0].id, "file-old");
  /* soonest first, whatever the order they were made in */
  assert_int_equal(gw_bstore_files_expired(f->s, 5000, v, 4), 2);
  assert_string_equal(v[0].id, "file-old");
  assert_string_equal(v[1].id, "file-new");
  assert_int_equal(gw_bstore_files_expired(f->s, 5000, v, 1), 1);
  /* the input of a batch that has not ended is not expired (nor is it next) until then,
   * and does not hide the files behind it */
  gw_batch_rec b;
  make_batch(&b, "batch_1", "", GW_BATCH_IN_PROGRESS, gw_bstore_next_seq(f->s));
  snprintf(b.input_file_id, sizeof(b.input_file_id), "file-old");
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  assert_int_equal(gw_bstore_file_in_use(f->s, "file-old"), 1);
  assert_int_equal(gw_bstore_file_in_use(f->s, "file-new"), 0);
  assert_int_equal(gw_bstore_files_expired(f->s, 5000, v, 1), 1);
  assert_string_equal(v[0].id, "file-new");
  assert_int_equal(gw_bstore_files_next_expiry(f->s, &at), 0);
  assert_int_equal(at, 5000);
  static const gw_batch_status open[] = {GW_BATCH_VALIDATING, GW_BATCH_FINALIZING, GW_BATCH_CANCELLING};
  for (size_t i = 0; i < 3; i++) {
    b.status = open[i];
    assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
    assert_int_equal(gw_bstore_file_in_use(f->s, "file-old"), 1);
    assert_int_equal(gw_bstore_files_expired(f->s, 1000, v, 4), 0);
  }
  b.status = GW_BATCH_COMPLETED;
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  assert_int_equal(gw_bstore_file_in_use(f->s, "file-old"), 0);
  assert_int_equal(gw_bstore_files_expired(f->s, 1000, v, 4), 1);
  assert_int_equal(gw_bstore_files_next_expiry(f->s, &at), 0);
  assert_int_equal(at, 500);
  assert_int_equal(gw_bstore_file_delete(f->s, "file-old"), 0);
  assert_int_equal(gw_bstore_file_delete(f->s, "file-new"), 0);
  assert_int_equal(gw_bstore_files_next_expiry(f->s, &at), 0);
  assert_int_equal(at, 0); /* file-keep never expires */
}

/* ---- batches --------------------------------------------------------------------------- */

static void test_batch_put_get(void **state) {
  fixture *f = *state;
  gw_batch_rec b;
  make_batch(&b, "batch_x", "alice", GW_BATCH_IN_PROGRESS, 42);
  b.expires_at = 2000;
  b.total = 10;
  b.completed = 3;
  b.failed = 1;
  b.out_bytes = 1234;
  b.err_bytes = 56;
  b.input_tokens = 700;
  b.cached_tokens = 300;
  b.output_tokens = 90;
  snprintf(b.output_file_id, sizeof(b.output_file_id), "file-out");
  snprintf(b.model, sizeof(b.model), "sim-model");
  b.metadata = strdup("{\"k\":\"v\"}");
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  gw_batch_rec g;
  assert_int_equal(gw_bstore_batch_get(f->s, "batch_x", "alice", &g), 0);
  assert_string_equal(g.id, "batch_x");
  assert_int_equal(g.status, GW_BATCH_IN_PROGRESS);
  assert_int_equal(g.expires_at, 2000);
  assert_int_equal(g.total, 10);
  assert_int_equal(g.completed, 3);
  assert_int_equal(g.failed, 1);
  assert_int_equal(g.out_bytes, 1234);
  assert_int_equal(g.err_bytes, 56);
  assert_int_equal(g.input_tokens, 700);
  assert_int_equal(g.cached_tokens, 300);
  assert_int_equal(g.output_tokens, 90);
  assert_int_equal(g.seq, 42);
  assert_string_equal(g.output_file_id, "file-out");
  assert_string_equal(g.error_file_id, "");
  assert_string_equal(g.model, "sim-model");
  assert_string_equal(g.metadata, "{\"k\":\"v\"}");
  assert_null(g.errors);
  gw_batch_rec_clear(&g);
  assert_int_equal(gw_bstore_batch_get(f->s, "batch_x", "bob", &g), PR_EUNKNOWN);
  assert_int_equal(gw_bstore_batch_get(f->s, "batch_none", NULL, &g), PR_EUNKNOWN);
  /* put replaces every column */
  b.status = GW_BATCH_COMPLETED;
  free(b.metadata);
  b.metadata = NULL;
  b.errors = strdup("[]");
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  assert_int_equal(gw_bstore_batch_get(f->s, "batch_x", NULL, &g), 0);
  assert_int_equal(g.status, GW_BATCH_COMPLETED);
  assert_null(g.metadata);
  assert_string_equal(g.errors, "[]");
  gw_batch_rec_clear(&g);
  gw_batch_rec_clear(&b);
}

static void test_batch_list_and_unfinished(void **state) {
  fixture *f = *state;
  static const gw_batch_status sts[] = {
      GW_BATCH_VALIDATING, GW_BATCH_FAILED,  GW_BATCH_IN_PROGRESS, GW_BATCH_FINALIZING,
      GW_BATCH_COMPLETED,  GW_BATCH_EXPIRED, GW_BATCH_CANCELLING,  GW_BATCH_CANCELLED,
  };
  for (int i = 0; i < 8; i++) {
    gw_batch_rec b;
    char id[32];
    snprintf(id, sizeof(id), "batch_%d", i);
    make_batch(&b, id, i == 5 ? "bob" : "alice", sts[i], gw_bstore_next_seq(f->s));
    assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  }
  gw_batch_rec v[9];
  int n = gw_bstore_batch_list(f->s, "alice", NULL, 3, v);
  assert_int_equal(n, 4);
  assert_string_equal(v[0].id, "batch_7");
  assert_string_equal(v[1].id, "batch_6");
  assert_string_equal(v[2].id, "batch_4"); /* batch_5 is bob's */
  assert_string_equal(v[3].id, "batch_3");
  for (int i = 0; i < n; i++) gw_batch_rec_clear(&v[i]);
  n = gw_bstore_batch_list(f->s, "alice", "batch_3", 3, v);
  assert_int_equal(n, 3);
  assert_string_equal(v[0].id, "batch_2");
  assert_string_equal(v[2].id, "batch_0");
  for (int i = 0; i < n; i++) gw_batch_rec_clear(&v[i]);
  n = gw_bstore_batch_list(f->s, NULL, NULL, 8, v);
  assert_int_equal(n, 8);
  for (int i = 0; i < n; i++) gw_batch_rec_clear(&v[i]);
  assert_int_equal(gw_bstore_batch_list(f->s, "alice", "batch_5", 3, v), PR_EUNKNOWN);
  /* not ended, oldest first: everyone's, from a cursor, one owner's */
  gw_batch_ref r[8];
  n = gw_bstore_batch_open(f->s, NULL, 0, r, 8);
  assert_int_equal(n, 4);
  assert_string_equal(r[0].id, "batch_0");
  assert_int_equal(r[0].status, GW_BATCH_VALIDATING);
  assert_string_equal(r[0].owner, "alice");
  assert_string_equal(r[1].id, "batch_2");
  assert_string_equal(r[2].id, "batch_3");
  assert_int_equal(r[2].status, GW_BATCH_FINALIZING);
  assert_string_equal(r[3].id, "batch_6");
  assert_int_equal(r[3].status, GW_BATCH_CANCELLING);
  assert_true(r[0].seq < r[1].seq && r[1].seq < r[2].seq && r[2].seq < r[3].seq);
  assert_int_equal(gw_bstore_batch_open(f->s, NULL, 0, r, 2), 2);
  assert_string_equal(r[1].id, "batch_2");
  n = gw_bstore_batch_open(f->s, NULL, r[1].seq, r, 8);
  assert_int_equal(n, 2);
  assert_string_equal(r[0].id, "batch_3");
  assert_int_equal(gw_bstore_batch_open(f->s, "bob", 0, r, 8), 0); /* bob's has ended */
  gw_batch_rec b;
  make_batch(&b, "batch_bob", "bob", GW_BATCH_IN_PROGRESS, gw_bstore_next_seq(f->s));
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  n = gw_bstore_batch_open(f->s, "bob", 0, r, 8);
  assert_int_equal(n, 1);
  assert_string_equal(r[0].id, "batch_bob");
  assert_int_equal(gw_bstore_batch_open(f->s, "bob", r[0].seq, r, 8), 0);
  assert_int_equal(gw_bstore_batch_open(f->s, "alice", 0, r, 8), 4);
  /* ending one takes it out */
  b.status = GW_BATCH_CANCELLED;
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  assert_int_equal(gw_bstore_batch_open(f->s, "bob", 0, r, 8), 0);
}

/* Batches past their window, soonest first, paged by (expires_at, seq). */
static void test_batches_open_expired(void **state) {
  fixture *f = *state;
  static const struct {
    const char *id;
    gw_batch_status st;
    int64_t exp;
  } in[] = {
    {"b_late", GW_BATCH_IN_PROGRESS, 3000}, {"b_early", GW_BATCH_VALIDATING, 1000},
    {"b_tie1", GW_BATCH_IN_PROGRESS, 2000}, {"b_tie2", GW_BATCH_FINALIZING, 2000},
    {"b_done", GW_BATCH_COMPLETED, 500},    {"b_future", GW_BATCH_IN_PROGRESS, 9000},
  };
  for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
    gw_batch_rec b;
    make_batch(&b, in[i].id, "alice", in[i].st, gw_bstore_next_seq(f->s));
    b.expires_at = in[i].exp;
    assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  }
  gw_batch_ref r[8];
  int n = gw_bstore_batch_open_expired(f->s, 5000, 0, 0, r, 8);
  assert_int_equal(n, 4);
  assert_string_equal(r[0].id, "b_early");
  assert_string_equal(r[1].id, "b_tie1");
  assert_string_equal(r[2].id, "b_tie2");
  assert_string_equal(r[3].id, "b_late");
  assert_int_equal(r[3].expires_at, 3000);
  /* two at a time, from the cursor: the tie is split by seq */
  assert_int_equal(gw_bstore_batch_open_expired(f->s, 5000, 0, 0, r, 2), 2);
  n = gw_bstore_batch_open_expired(f->s, 5000, r[1].expires_at, r[1].seq, r, 2);
  assert_int_equal(n, 2);
  assert_string_equal(r[0].id, "b_tie2");
  assert_string_equal(r[1].id, "b_late");
  assert_int_equal(gw_bstore_batch_open_expired(f->s, 5000, r[1].expires_at, r[1].seq, r, 2), 0);
  assert_int_equal(gw_bstore_batch_open_expired(f->s, 1999, 0, 0, r, 8), 1);
}

typedef struct usage_seen {
  int n;
  gw_bstore_usage u[4];
  char names[4][32];
} usage_seen;

static void usage_cb(void *ud, const gw_bstore_usage *u) {
  usage_seen *s = ud;
  if (s->n >= 4) return;
  s->u[s->n] = *u;
  snprintf(s->names[s->n], sizeof(s->names[0]), "%s", u->owner);
  s->u[s->n].owner = s->names[s->n];
  s->n++;
}

static void test_usage_each(void **state) {
  fixture *f = *state;
  put_file(f->s, "file-a1", "alice", "batch", 0);
  put_file(f->s, "file-a2", "alice", "batch_output", 0);
  put_file(f->s, "file-c1", "carol", "batch", 0); /* carol: files only */
  gw_batch_rec b;
  /* alice: one validating (its lines do not count yet), one running with 10 - 3 - 1 left,
   * one cancelling with 5 left, one completed (not counted) */
  make_batch(&b, "batch_av", "alice", GW_BATCH_VALIDATING, gw_bstore_next_seq(f->s));
  b.total = 40;
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  make_batch(&b, "batch_ar", "alice", GW_BATCH_IN_PROGRESS, gw_bstore_next_seq(f->s));
  b.total = 10, b.completed = 3, b.failed = 1;
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  make_batch(&b, "batch_ac", "alice", GW_BATCH_CANCELLING, gw_bstore_next_seq(f->s));
  b.total = 5;
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  make_batch(&b, "batch_ad", "alice", GW_BATCH_COMPLETED, gw_bstore_next_seq(f->s));
  b.total = 100;
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  /* bob: batches only */
  make_batch(&b, "batch_b", "bob", GW_BATCH_VALIDATING, gw_bstore_next_seq(f->s));
  assert_int_equal(gw_bstore_batch_put(f->s, &b), 0);
  usage_seen seen = {0};
  assert_int_equal(gw_bstore_usage_each(f->s, usage_cb, &seen), 0);
  assert_int_equal(seen.n, 3);
  assert_string_equal(seen.u[0].owner, "alice");
  assert_int_equal(seen.u[0].files, 2);
  assert_int_equal(seen.u[0].file_bytes, 200);
  assert_int_equal(seen.u[0].batches, 3);
  assert_int_equal(seen.u[0].validating, 1);
  assert_int_equal(seen.u[0].lines, 6 + 5);
  assert_string_equal(seen.u[1].owner, "bob");
  assert_int_equal(seen.u[1].files, 0);
  assert_int_equal(seen.u[1].batches, 1);
  assert_int_equal(seen.u[1].validating, 1);
  assert_int_equal(seen.u[1].lines, 0);
  assert_string_equal(seen.u[2].owner, "carol");
  assert_int_equal(seen.u[2].files, 1);
  assert_int_equal(seen.u[2].batches, 0);
}

/* ---- lines ----------------------------------------------------------------------------- */

static void test_lines(void **state) {
  fixture *f = *state;
  const char *B = "batch_l";
  assert_int_equal(gw_bstore_begin(f->s), 0);
  add_line(f->s, B, 1, "c1", "bb", 0);
  add_line(f->s, B, 2, "c2", "aa", 0);
  add_line(f->s, B, 3, "c3", "bb", 0);
  add_line(f->s, B, 4, "c4", "aa", 0);
  add_line(f->s, B, 5, "c5", "", 0);
  /* a custom_id used by an earlier line of the batch; the transaction goes on */
  add_line(f->s, B, 6, "c2", "aa", PR_ERANGE);
  add_line(f->s, B, 6, "c6", "cc", 0);
  assert_int_equal(gw_bstore_commit(f->s), 0);
  /* another batch may use the same custom_id */
  add_line(f->s, "batch_other", 1, "c1", "aa", 0);
  assert_int_equal(gw_bstore_lines_pending(f->s, B), 6);
  /* run order: (gkey, line); "" with 0 is the start and a line of gkey "" follows it */
  gw_line_rec v[8];
  int n = gw_bstore_lines_next(f->s, B, "", 0, v, 8);
  assert_int_equal(n, 6);
  static const int64_t order[] = {5, 2, 4, 1, 3, 6};
  for (int i = 0; i < 6; i++) assert_int_equal(v[i].line, order[i]);
  assert_string_equal(v[1].custom_id, "c2");
  assert_string_equal(v[1].gkey, "aa");
  assert_int_equal(v[1].off, 20);
  assert_int_equal(v[1].len, 9);
  /* the cursor, one at a time, as the runner reads */
  char gk[80] = "";
  int64_t ln = 0;
  for (int i = 0; i < 6; i++) {
    assert_int_equal(gw_bstore_lines_next(f->s, B, gk, ln, v, 1), 1);
    assert_int_equal(v[0].line, order[i]);
    snprintf(gk, sizeof(gk), "%s", v[0].gkey);
    ln = v[0].line;
  }
  assert_int_equal(gw_bstore_lines_next(f->s, B, gk, ln, v, 1), 0);
  /* a cursor in the middle of a group */
  n = gw_bstore_lines_next(f->s, B, "aa", 2, v, 8);
  assert_int_equal(n, 4);
  assert_int_equal(v[0].line, 4);
  assert_int_equal(v[1].line, 1);
  /* ended lines are no longer pending; a counted try keeps a line pending */
  assert_int_equal(gw_bstore_line_set(f->s, B, 2, 1, 0), 0);
  assert_int_equal(gw_bstore_line_set(f->s, B, 1, 2, 3), 0);
  assert_int_equal(gw_bstore_line_set(f->s, B, 4, 0, 2), 0);
  assert_int_equal(gw_bstore_lines_pending(f->s, B), 4);
  n = gw_bstore_lines_next(f->s, B, "", 0, v, 8);
  assert_int_equal(n, 4);
  assert_int_equal(v[0].line, 5);
  assert_int_equal(v[1].line, 4);
  assert_int_equal(v[1].tries, 2);
  assert_int_equal(v[2].line, 3);
  assert_int_equal(v[3].line, 6);
  /* a rollback undoes a line's end */
  assert_int_equal(gw_bstore_begin(f->s), 0);
  assert_int_equal(gw_bstore_line_set(f->s, B, 5, 1, 0), 0);
  gw_bstore_rollback(f->s);
  assert_int_equal(gw_bstore_lines_pending(f->s, B), 4);
  assert_int_equal(gw_bstore_lines_clear(f->s, B), 0);
  assert_int_equal(gw_bstore_lines_pending(f->s, B), 0);
  assert_int_equal(gw_bstore_lines_next(f->s, B, "", 0, v, 8), 0);
  assert_int_equal(gw_bstore_lines_pending(f->s, "batch_other"), 1);
}

static void test_next_seq_monotonic_across_reopen(void **state) {
  fixture *f = *state;
  int64_t last = 0;
  for (int i = 0; i < 5; i++) {
    int64_t v = gw_bstore_next_seq(f->s);
    assert_true(v > last);
    last = v;
  }
  gw_bstore_close(f->s);
  f->s = NULL;
  char err[512] = "";
  assert_int_equal(gw_bstore_open(f->dir, &f->s, err, sizeof(err)), 0);
  int64_t v = gw_bstore_next_seq(f->s);
  assert_true(v > last);
  /* inside a transaction (the runner's finish) it goes on counting */
  assert_int_equal(gw_bstore_begin(f->s), 0);
  int64_t w = gw_bstore_next_seq(f->s);
  assert_true(w > v);
  assert_int_equal(gw_bstore_commit(f->s), 0);
  assert_true(gw_bstore_next_seq(f->s) > w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_open_creates_db_and_files_dir, setup, teardown),
      cmocka_unit_test(test_corrupt_db_is_a_clear_error),
      cmocka_unit_test_setup_teardown(test_file_put_get_and_owner, setup, teardown),
      cmocka_unit_test_setup_teardown(test_file_list_pages, setup, teardown),
      cmocka_unit_test_setup_teardown(test_files_expired_and_in_use, setup, teardown),
      cmocka_unit_test_setup_teardown(test_batch_put_get, setup, teardown),
      cmocka_unit_test_setup_teardown(test_batch_list_and_unfinished, setup, teardown),
      cmocka_unit_test_setup_teardown(test_batches_open_expired, setup, teardown),
      cmocka_unit_test_setup_teardown(test_usage_each, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lines, setup, teardown),
      cmocka_unit_test_setup_teardown(test_next_seq_monotonic_across_reopen, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
