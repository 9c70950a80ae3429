/* Replays recorded plans (gateway/planrec.h): every record in tests/unit/plans/ (or the
 * files named on the command line; `.jsonl`, or `.jsonl.xz` read through `xz -dc`) is read back, its replicas rebuilt, and the planner
 * asked again; its choices must be the recorded ones, field for field and bit for bit, both as
 * the gateway plans (a model of few phones walked whole) and with the search everywhere.
 * The records come from the system tests and B2 cells run with FLEETGATE_RECORD_PLANS
 * (tests/unit/plans/README.md), so a change to the planner that decides anything
 * differently on them fails here. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "feat.h"
#include "planrec.h"
#include "scheduler.h"

static char **files;
static size_t n_files;
static gw_sched *sched; /* the planner's memory, kept from record to record as the gateway keeps it */

static int same(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

/* Why a rebuilt replica reads differently from the recorded one (NULL: it does not). */
static const char *derived_differs(const gw_planrec_derived *a, const gw_planrec_derived *b) {
  if (a->capacity != b->capacity) return "capacity";
  if (a->suspect != b->suspect) return "suspect";
  if (a->unknown != b->unknown) return "unknown";
  if (!same(a->slowdown, b->slowdown)) return "slowdown";
  if (!same(a->device_slowdown, b->device_slowdown)) return "device_slowdown";
  if (a->wait_ms != b->wait_ms) return "wait_ms";
  return NULL;
}

static const char *choice_differs(const gw_sched_choice *a, const gw_sched_choice *b) {
  if (a->replica != b->replica) return "replica";
  if (a->now != b->now) return "now";
  if (!same(a->finish_s, b->finish_s)) return "finish_s";
  if (!same(a->service_s, b->service_s)) return "service_s";
  if (!same(a->prefill_s, b->prefill_s)) return "prefill_s";
  if (a->cached_tokens != b->cached_tokens) return "cached_tokens";
  if (!same(a->alt_finish_s, b->alt_finish_s)) return "alt_finish_s";
  if (a->alt_replica != b->alt_replica) return "alt_replica";
  return NULL;
}

/* Admission's prediction as main made it before "fix: admission predicts each phone as the
 * plan does": a hot phone at its learned rates (without scheduler.device's slowdown), and a
 * phone that takes no work now without its overrun. A recorded prediction that differs from
 * today's is accepted only when this reproduces it bit for bit and the record has such a
 * phone fitting the request (the fix is all that changed). */
static void best_before_fix(const gw_planrec_case *c, double *svc_best, double *fin_best, int *guess) {
  const gw_sched_req *q = &c->reqs[0];
  double svc_any = -1;
  *svc_best = *fin_best = -1;
  *guess = 0;
  for (size_t i = 0; i < c->nr; i++) {
    const gw_replica *r = c->replicas[i];
    if (!gw_predict_fits(r, q)) continue;
    int usable = gw_replica_capacity(r, c->now) > 0;
    double svc = gw_predict_service_s(r, q, usable ? gw_replica_slowdown(r, c->now) : 1.0, NULL, NULL);
    if (svc_any < 0 || svc < svc_any) svc_any = svc;
    if (!usable) continue;
    if (!r->prefill_samples || !r->decode_samples) *guess = 1;
    double fin = (double)gw_replica_wait_ms(r, c->now) / 1000.0 + svc;
    if (*svc_best < 0 || svc < *svc_best) *svc_best = svc;
    if (*fin_best < 0 || fin < *fin_best) *fin_best = fin;
  }
  if (*svc_best < 0) *svc_best = svc_any;
}

static int fix_applies(const gw_planrec_case *c) {
  for (size_t i = 0; i < c->nr; i++) {
    const gw_replica *r = c->replicas[i];
    if (!gw_predict_fits(r, &c->reqs[0])) continue;
    if (gw_replica_device_slowdown(r) != 1) return 1;
    if (gw_replica_capacity(r, c->now) <= 0 && gw_replica_slowdown(r, c->now) != 1) return 1;
  }
  return 0;
}

static size_t n_fixed; /* recorded predictions that differ by the fix alone */

/* Replays one record; returns NULL or what differs (written into why). */
static const char *replay(const gw_planrec_case *c, char *why, size_t n) {
  for (size_t j = 0; j < c->nr; j++) {
    gw_planrec_derived d;
    gw_planrec_derive(c->replicas[j], c->now, &d);
    const char *f = derived_differs(&d, &c->derived[j]);
    if (f) {
      snprintf(why, n, "replica %zu (%s) rebuilt with another %s", j, c->replicas[j]->id, f);
      return why;
    }
  }
  if (c->kind == GW_PLANREC_PREDICT) {
    double svc, fin;
    int guess;
    gw_sched_best(c->replicas, c->nr, &c->reqs[0], c->now, &svc, &fin, &guess);
    if (!same(svc, c->svc) || !same(fin, c->fin) || guess != c->guess) {
      double osvc, ofin;
      int oguess;
      best_before_fix(c, &osvc, &ofin, &oguess);
      if (fix_applies(c) && same(osvc, c->svc) && same(ofin, c->fin) && oguess == c->guess) {
        n_fixed++;
        return NULL;
      }
      snprintf(why, n, "predict: svc %.17g fin %.17g guess %d, recorded %.17g %.17g %d", svc, fin,
               guess, c->svc, c->fin, c->guess);
      return why;
    }
    return NULL;
  }
  gw_sched_choice *out = calloc(c->n ? c->n : 1, sizeof(*out));
  assert_non_null(out);
  const char *res = NULL;
  /* as the gateway plans (small models walked), and with the search everywhere */
  for (int way = 0; way < 2 && !res; way++) {
    gw_sched_walk_max(sched, way ? 0 : 24);
    gw_sched_plan_with(sched, c->replicas, c->nr, c->reqs, c->n, c->now, out);
    for (size_t i = 0; i < c->n && !res; i++) {
      const char *f = choice_differs(&out[i], &c->out[i]);
      if (f) {
        snprintf(why, n, "%s, request %zu of %zu: %s differs (replica %d now %d finish %.17g; recorded "
                 "%d %d %.17g)", way ? "searched" : "walked", i, c->n, f, out[i].replica, out[i].now,
                 out[i].finish_s, c->out[i].replica, c->out[i].now, c->out[i].finish_s);
        res = why;
      }
    }
  }
  free(out);
  return res;
}

/* A file's bytes; a .xz file through `xz -dc` (the records are kept compressed: consecutive
 * records share most of their replicas and fingerprints). */
static char *read_all(const char *path, size_t *len) {
  *len = 0;
  size_t pl = strlen(path);
  int xz = pl > 3 && strcmp(path + pl - 3, ".xz") == 0;
  char cmd[4200];
  if (xz) {
    if (strchr(path, '\'')) return NULL;
    snprintf(cmd, sizeof(cmd), "xz -dc -- '%s'", path);
  }
  FILE *f = xz ? popen(cmd, "r") : fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 20, n = 0;
  char *b = malloc(cap);
  size_t got;
  while (b && (got = fread(b + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      char *nb = realloc(b, cap *= 2);
      if (!nb) free(b);
      b = nb;
    }
  }
  int rc = xz ? pclose(f) : fclose(f);
  if (rc != 0) {
    free(b);
    return NULL;
  }
  *len = n;
  return b;
}

static void test_replay(void **state) {
  (void)state;
  size_t total = 0, by_kind[GW_PLANREC_KINDS] = {0}, requests = 0, bad = 0;
  assert_true(n_files > 0);
  for (size_t fi = 0; fi < n_files; fi++) {
    size_t len = 0;
    char *text = read_all(files[fi], &len);
    if (!text) fail_msg("cannot read %s", files[fi]);
    size_t line = 0;
    for (size_t at = 0; at < len;) {
      char *nl = memchr(text + at, '\n', len - at);
      size_t end = nl ? (size_t)(nl - text) : len;
      line++;
      if (end > at) {
        gw_planrec_case c;
        char why[512];
        if (gw_planrec_parse(text + at, end - at, &c, why, sizeof(why)) < 0) {
          print_error("%s:%zu: %s\n", files[fi], line, why);
          bad++;
        } else {
          const char *d = replay(&c, why, sizeof(why));
          if (d) {
            print_error("%s:%zu (%s, %zu replicas, %zu requests): %s\n", files[fi], line,
                        gw_planrec_kind_name(c.kind), c.nr, c.n, d);
            bad++;
          }
          total++;
          by_kind[c.kind]++;
          requests += c.n;
          gw_planrec_case_free(&c);
        }
      }
      at = end + 1;
    }
    free(text);
  }
  print_message("replayed %zu records (%zu passes, %zu hedges, %zu moves, %zu predictions; %zu "
                "requests) from %zu files: %zu differ; %zu predictions differ only as the fix of "
                "admission's prediction (a hot phone's slowdown) says\n",
                total, by_kind[GW_PLANREC_PASS], by_kind[GW_PLANREC_HEDGE], by_kind[GW_PLANREC_MOVE],
                by_kind[GW_PLANREC_PREDICT], requests, n_files, bad, n_fixed);
  assert_true(total > 0);
  assert_int_equal(bad, 0);
}

/* A record of replicas in every state the planner reads (leases, a hot phone, an agent's
 * prompt cache, a trust cap, a drain, a suspect phone) reads back whole and replays. */
static void test_roundtrip(void **state) {
  (void)state;
  char *models[] = {"m", "other"};
  gw_replica *rs[3];
  rs[0] = gw_replica_new("a", "http://127.0.0.1:1", NULL, models, 2, 4, 8192, 1234.5678901234567, 33.3, 0);
  rs[1] = gw_replica_new("b", "http://127.0.0.1:1", NULL, models, 1, 2, 0, 0, 0, 0);
  rs[2] = gw_replica_new("c", "http://127.0.0.1:1", NULL, models + 1, 1, 1, 0, 10, 1, 0);
  for (int i = 0; i < 3; i++) assert_non_null(rs[i]);
  uint64_t now = 5000000;
  gw_replica_acquire(rs[0], now - 4000, 1000, NULL); /* overrunning: a slowdown */
  gw_replica_acquire_class(rs[0], now - 100, 30000, NULL, 1);
  rs[0]->dev.hot = 1;
  rs[0]->dev.slow = 1.5;
  rs[0]->prefill_samples = 9;
  rs[0]->decode_samples = 9;
  rs[1]->sched.trust_capped = 1;
  rs[1]->sched.trust_cap = 1;
  rs[1]->health.probe_fail = 1;
  gw_replica_held_set(rs[1], GW_HELD_CHECK, 1); /* a check of it undecided: no new work */
  gw_replica_held_set(rs[2], GW_HELD_DRAIN_ADMIN, 1);
  rs[0]->features = PR_FEAT_CHOICES; /* its engine writes up to 4 choices at once */
  rs[0]->choices_max = 4;
  rs[0]->feat_known = 1;
  uint64_t blocks[3] = {0xfedcba9876543210ull, 0x0123456789abcdefull, 42};
  rs[0]->pc.agent = 1; /* its agent keeps scopes apart */
  gw_pcache_sent(&rs[0]->pc, 7, 1, blocks, 3);
  gw_sched_req q[2] = {{.model = "m", .prompt_tokens = 200, .max_tokens = 64, .expected_out = 12.25,
                        .blocks = blocks, .n_blocks = 3, .cache_scope = 7, .short_s = 2,
                        .short_reserve = 3, .wait_weight_max = 2, .explore = 0.5,
                        .needs = PR_FEAT_CHOICES, .choices = 2},
                       {.model = "m", .prompt_tokens = 9000, .max_tokens = 10, .expected_out = 10,
                        .batch = 1, .batch_reserve = 1, .batch_borrow_s = 5, .avoid = rs[1]}};
  gw_sched_choice out[2];
  gw_sched_plan(rs, 3, q, 2, now, out);
  char path[] = "/tmp/fleetgate-planrec-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  gw_planrec *rec;
  assert_int_equal(gw_planrec_open(&rec, path), 0);
  gw_planrec_plan(rec, GW_PLANREC_PASS, rs, 3, q, 2, now, out);
  double svc, fin;
  int guess;
  gw_sched_best(rs, 3, &q[0], now, &svc, &fin, &guess);
  gw_planrec_predict(rec, rs, 3, &q[0], now, svc, fin, guess);
  assert_int_equal(gw_planrec_written(rec), 2);
  gw_planrec_close(rec);
  size_t len;
  char *text = read_all(path, &len);
  assert_non_null(text);
  if (!getenv("KEEP")) unlink(path);
  char *nl = memchr(text, '\n', len);
  assert_non_null(nl);
  gw_planrec_case c;
  char why[512];
  if (gw_planrec_parse(text, (size_t)(nl - text), &c, why, sizeof(why)) < 0) fail_msg("%s", why);
  assert_int_equal(c.kind, GW_PLANREC_PASS);
  assert_int_equal(c.nr, 3);
  assert_int_equal(c.n, 2);
  assert_ptr_equal(c.reqs[1].avoid, c.replicas[1]);
  assert_true(gw_replica_has(c.replicas[1], GW_HELD_CHECK));
  assert_false(gw_replica_has(c.replicas[0], GW_HELD_CHECK));
  assert_int_equal(c.reqs[0].choices, 2);
  assert_int_equal(c.reqs[0].needs, PR_FEAT_CHOICES);
  assert_int_equal(c.reqs[1].choices, 0);
  assert_int_equal(c.replicas[0]->choices_max, 4);
  assert_int_equal(c.replicas[0]->feat_known, 1);
  assert_int_equal(c.replicas[1]->feat_known, 0);
  assert_true(c.replicas[0]->prefill_tps == rs[0]->prefill_tps);
  assert_int_equal(c.replicas[0]->pc.agent, 1);
  assert_int_equal(c.replicas[0]->pc.slot[0].n_blocks, 3);
  assert_true(c.replicas[0]->pc.slot[0].blocks[0] == blocks[0]);
  assert_true(c.derived[0].slowdown > 1 && c.derived[0].device_slowdown == 1.5);
  assert_null(replay(&c, why, sizeof(why)));
  /* a planner that chose otherwise is caught */
  c.out[0].finish_s = nextafter(c.out[0].finish_s, 1e9);
  assert_non_null(replay(&c, why, sizeof(why)));
  gw_planrec_case_free(&c);
  assert_int_equal(gw_planrec_parse(nl + 1, len - (size_t)(nl - text) - 2, &c, why, sizeof(why)), 0);
  assert_int_equal(c.kind, GW_PLANREC_PREDICT);
  assert_null(replay(&c, why, sizeof(why)));
  gw_planrec_case_free(&c);
  /* not a record */
  assert_true(gw_planrec_parse("{\"v\":1}", 7, &c, why, sizeof(why)) < 0);
  free(text);
  for (int i = 0; i < 3; i++) gw_replica_free(rs[i]);
}

/* Replicas whose engines keep context checkpoints (a hybrid model): what the planner reads
 * of them — the checkpoints of each slot, the share of predicted hits their answers
 * confirmed and the engine's tokens per estimated token, the request's last user turn and
 * fingerprints — reads back whole, and the plan replays. Read without it (a transformer's
 * cache, as records before issue 37 were) the same plan differs: the record must carry it. */
static void test_roundtrip_hybrid(void **state) {
  (void)state;
  char *models[] = {"m"};
  gw_replica *rs[2];
  rs[0] = gw_replica_new("h", "http://127.0.0.1:1", NULL, models, 1, 2, 0, 400, 20, 0);
  rs[1] = gw_replica_new("t", "http://127.0.0.1:1", NULL, models, 1, 2, 0, 200, 20, 0);
  for (int i = 0; i < 2; i++) assert_non_null(rs[i]);
  rs[0]->prefill_samples = rs[0]->decode_samples = 9;
  rs[1]->prefill_samples = rs[1]->decode_samples = 9;
  uint64_t now = 7000000;
  /* a shared 1,536-token system part (24 blocks), then a user turn of its own */
  uint64_t b1[40], b2[40];
  for (int i = 0; i < 40; i++) {
    b1[i] = i < 24 ? 0x5100u + (uint64_t)i : 0xa100u + (uint64_t)i;
    b2[i] = i < 24 ? 0x5100u + (uint64_t)i : 0xb100u + (uint64_t)i;
  }
  gw_pquery sent = {.blocks = b1, .n_blocks = 40, .prompt_tokens = 2600, .user_at = 1540,
                    .user_fp = 0x77, .full_fp = 0x1234, .model = "m"};
  for (int j = 0; j < 2; j++) {
    rs[j]->pc.hybrid = 1;
    gw_pcache_sent_q(&rs[j]->pc, 0, 1, &sent);
  }
  assert_true(rs[0]->pc.slot[0].n_ck > 0);
  gw_pcache_learn(&rs[0]->pc, "m", 0.6, now - 1000);
  gw_pcache_learn_tokens(&rs[0]->pc, "m", 2700, 2600, now - 1000);
  gw_sched_req q[1] = {{.model = "m", .prompt_tokens = 2620, .max_tokens = 16, .expected_out = 8,
                        .blocks = b2, .n_blocks = 40, .user_at = 1540, .user_fp = 0x77,
                        .full_fp = 0x9999, .short_s = 2, .wait_weight_max = 2}};
  gw_sched_choice out[1];
  gw_sched_plan(rs, 2, q, 1, now, out);
  /* the faster phone, at the share its answers confirmed of the user turn's checkpoint */
  assert_int_equal(out[0].replica, 0);
  assert_true(out[0].cached_tokens > 0 && out[0].cached_tokens < 1536);
  char path[] = "/tmp/fleetgate-planrec-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  gw_planrec *rec;
  assert_int_equal(gw_planrec_open(&rec, path), 0);
  gw_planrec_plan(rec, GW_PLANREC_PASS, rs, 2, q, 1, now, out);
  assert_int_equal(gw_planrec_written(rec), 1);
  gw_planrec_close(rec);
  size_t len;
  char *text = read_all(path, &len);
  assert_non_null(text);
  if (!getenv("KEEP")) unlink(path);
  gw_planrec_case c;
  char why[512];
  if (gw_planrec_parse(text, len - 1, &c, why, sizeof(why)) < 0) fail_msg("%s", why);
  for (int j = 0; j < 2; j++) {
    const gw_pcache *a = &rs[j]->pc, *b = &c.replicas[j]->pc;
    assert_int_equal(b->hybrid, 1);
    assert_int_equal(b->slot[0].n_ck, a->slot[0].n_ck);
    assert_memory_equal(b->slot[0].ck, a->slot[0].ck, (size_t)a->slot[0].n_ck * sizeof(*a->slot[0].ck));
    assert_true(gw_pcache_share(b, "m") == gw_pcache_share(a, "m"));
    assert_true(gw_pcache_token_ratio(b, "m") == gw_pcache_token_ratio(a, "m"));
  }
  assert_true(gw_pcache_share(&c.replicas[0]->pc, "m") < 1);
  assert_int_equal(c.reqs[0].user_at, 1540);
  assert_true(c.reqs[0].user_fp == 0x77 && c.reqs[0].full_fp == 0x9999);
  assert_null(replay(&c, why, sizeof(why)));
  /* read as a transformer's cache, the plan is not the one recorded */
  for (int j = 0; j < 2; j++) c.replicas[j]->pc.hybrid = 0;
  assert_non_null(replay(&c, why, sizeof(why)));
  gw_planrec_case_free(&c);
  free(text);
  for (int i = 0; i < 2; i++) gw_replica_free(rs[i]);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void add_file(const char *path) {
  files = realloc(files, (n_files + 1) * sizeof(*files));
  assert_non_null(files);
  files[n_files++] = strdup(path);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) add_file(argv[i]);
  const char *dir = getenv("FLEETGATE_PLANS_DIR"); /* another folder of records */
  if (!dir) dir = PLANS_DIR;
  if (argc < 2 && dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      size_t l = strlen(e->d_name);
      if (!(l > 6 && strcmp(e->d_name + l - 6, ".jsonl") == 0) && !(l > 9 && strcmp(e->d_name + l - 9, ".jsonl.xz") == 0))
        continue;
      char p[4096];
      snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
      add_file(p);
    }
    if (d) closedir(d);
    qsort(files, n_files, sizeof(*files), by_name);
  }
  sched = gw_sched_new();
  if (!sched) return 1;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_roundtrip), cmocka_unit_test(test_roundtrip_hybrid),
                                      cmocka_unit_test(test_replay)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  gw_sched_free(sched);
  for (size_t i = 0; i < n_files; i++) free(files[i]);
  free(files);
  return rc;
}
