/* Recorded plans: writing a decision with its inputs, and reading it back; see planrec.h. */
#include "planrec.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#define PLANREC_VERSION 2 /* 2: the prompt cache as an agent or the gateway keeps scopes apart */
#define PLANREC_PATH_MAX 4096

struct gw_planrec {
  int fd;
  uint64_t written, lost;
};

static const char *const kind_names[GW_PLANREC_KINDS] = {"pass", "hedge", "move", "predict"};

const char *gw_planrec_kind_name(gw_planrec_kind k) {
  return k >= 0 && k < GW_PLANREC_KINDS ? kind_names[k] : "unknown";
}

int gw_planrec_open(gw_planrec **out, const char *path) {
  *out = NULL;
  if (!path || !*path) return -EINVAL;
  char full[PLANREC_PATH_MAX];
  size_t k = 0;
  for (const char *p = path; *p; p++) {
    char pid[24];
    const char *add = p[0] == '%' && p[1] == 'p' ? pid : NULL;
    if (add) {
      snprintf(pid, sizeof(pid), "%ld", (long)getpid());
      p++;
    }
    size_t m = add ? strlen(add) : 1;
    if (k + m >= sizeof(full)) return -ENAMETOOLONG;
    memcpy(full + k, add ? add : p, m);
    k += m;
  }
  full[k] = 0;
  gw_planrec *rec = calloc(1, sizeof(*rec));
  if (!rec) return -ENOMEM;
  rec->fd = open(full, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (rec->fd < 0) {
    int e = errno;
    free(rec);
    return -e;
  }
  *out = rec;
  return 0;
}

void gw_planrec_close(gw_planrec *rec) {
  if (!rec) return;
  close(rec->fd);
  free(rec);
}

uint64_t gw_planrec_written(const gw_planrec *rec) { return rec ? rec->written : 0; }
uint64_t gw_planrec_lost(const gw_planrec *rec) { return rec ? rec->lost : 0; }

/* ---- writing ---- */

/* A number that reads back bit for bit (cJSON's own printing settles for 15 digits when
 * they come within an epsilon); not finite: a string. */
static int add_num(cJSON *o, const char *key, double v) {
  char t[40];
  if (!isfinite(v)) return cJSON_AddStringToObject(o, key, isnan(v) ? "nan" : v > 0 ? "inf" : "-inf") ? 0 : -1;
  snprintf(t, sizeof(t), "%.17g", v);
  return cJSON_AddRawToObject(o, key, t) ? 0 : -1;
}

static int add_u64(cJSON *o, const char *key, uint64_t v) {
  char t[24];
  snprintf(t, sizeof(t), "%" PRIu64, v);
  return cJSON_AddRawToObject(o, key, t) ? 0 : -1;
}

static int push_u64(cJSON *a, uint64_t v) {
  char t[24];
  snprintf(t, sizeof(t), "%" PRIu64, v);
  cJSON *n = cJSON_CreateRaw(t);
  return n && cJSON_AddItemToArray(a, n) ? 0 : -1;
}

static int add_hex(cJSON *o, const char *key, uint64_t v) {
  char t[20];
  snprintf(t, sizeof(t), "%016" PRIx64, v);
  return cJSON_AddStringToObject(o, key, t) ? 0 : -1;
}

/* The line's fingerprints, each once (a linear table: a record is a debugging aid). */
typedef struct fp_table {
  uint64_t *v;
  size_t n, cap;
} fp_table;

static long fp_index(fp_table *t, uint64_t fp) {
  for (size_t i = t->n; i-- > 0;)
    if (t->v[i] == fp) return (long)i;
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    uint64_t *v = realloc(t->v, cap * sizeof(*v));
    if (!v) return -1;
    t->v = v;
    t->cap = cap;
  }
  t->v[t->n] = fp;
  return (long)t->n++;
}

static cJSON *blocks_json(fp_table *t, const uint64_t *b, size_t n) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; a && i < n; i++) {
    long k = fp_index(t, b[i]);
    if (k < 0 || push_u64(a, (uint64_t)k) < 0) {
      cJSON_Delete(a);
      return NULL;
    }
  }
  return a;
}

void gw_planrec_derive(const gw_replica *r, uint64_t now, gw_planrec_derived *d) {
  d->capacity = gw_replica_capacity(r, now);
  d->suspect = gw_replica_suspect(r);
  d->unknown = gw_replica_unknown(r);
  d->slowdown = gw_replica_slowdown(r, now);
  d->device_slowdown = gw_replica_device_slowdown(r);
  d->wait_ms = gw_replica_wait_ms(r, now);
}

/* A slot's context checkpoints (hybrid engines), oldest first: [at, end, tail, fp, task],
 * fp as an index into the line's fingerprints. */
static int ckpts_json(cJSON *e, const gw_pslot *s, fp_table *t) {
  cJSON *a = cJSON_AddArrayToObject(e, "ck");
  int bad = !a;
  for (int i = 0; a && i < s->n_ck && !bad; i++) {
    const gw_pckpt *k = &s->ck[i];
    long f = fp_index(t, k->fp);
    cJSON *x = cJSON_CreateArray();
    bad |= f < 0 || !x || !cJSON_AddItemToArray(a, x) || k->at < 0 || k->end < 0 || k->tail < 0;
    if (bad) break;
    bad |= push_u64(x, (uint64_t)k->at) | push_u64(x, (uint64_t)k->end) | push_u64(x, (uint64_t)k->tail) |
           push_u64(x, (uint64_t)f) | push_u64(x, k->task);
  }
  return bad ? -1 : 0;
}

/* The shares and token ratios a hybrid engine's answers taught, per model. */
static int shares_json(cJSON *pc, const gw_pcache *c) {
  cJSON *a = cJSON_AddArrayToObject(pc, "shares");
  int bad = !a;
  for (int i = 0; a && i < GW_CACHE_SHARES && !bad; i++) {
    const gw_pshare *h = &c->share[i];
    if (!h->model[0]) continue;
    cJSON *x = cJSON_CreateObject();
    bad |= !x || !cJSON_AddItemToArray(a, x);
    if (bad) break;
    bad |= !cJSON_AddStringToObject(x, "model", h->model);
    bad |= add_num(x, "share", h->share) | add_num(x, "weight", h->weight);
    bad |= add_num(x, "ratio", h->ratio) | add_num(x, "rweight", h->rweight) | add_u64(x, "at_ms", h->at_ms);
  }
  return bad ? -1 : 0;
}

static cJSON *replica_json(const gw_replica *r, uint64_t now, fp_table *t) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  int bad = !cJSON_AddStringToObject(o, "id", r->id);
  cJSON *m = cJSON_AddArrayToObject(o, "models");
  for (size_t i = 0; m && i < r->n_models; i++) cJSON_AddItemToArray(m, cJSON_CreateString(r->models[i]));
  bad |= !m;
  bad |= add_num(o, "slots", r->slots) | add_num(o, "n_ctx", (double)r->n_ctx) | add_num(o, "state", r->state);
  bad |= add_num(o, "drain", (gw_replica_has(r, GW_HELD_REMOVED) ? 1 : 0) |
                                 (gw_replica_has(r, GW_HELD_DRAIN_CONF) ? 2 : 0) |
                                 (gw_replica_has(r, GW_HELD_DRAIN_ADMIN) ? 4 : 0) |
                                 (gw_replica_has(r, GW_HELD_DRAIN_AGENT | GW_HELD_PLACING) ? 8 : 0));
  bad |= add_num(o, "share_div", r->shared.share_div) | add_num(o, "probation", gw_replica_has(r, GW_HELD_PROBATION));
  bad |= add_num(o, "trust_cap", r->sched.trust_cap) | add_num(o, "trust_capped", r->sched.trust_capped);
  bad |= add_num(o, "dev_cap", r->dev.cap) | add_num(o, "remote_busy", r->shared.remote_busy);
  bad |= add_u64(o, "remote_busy_until", r->shared.remote_busy_until);
  bad |= add_num(o, "prefill_tps", r->prefill_tps) | add_num(o, "decode_tps", r->decode_tps);
  bad |= add_num(o, "prefill_samples", r->prefill_samples) | add_num(o, "decode_samples", r->decode_samples);
  bad |= add_num(o, "rates_default", r->rates_default) | add_num(o, "rates_claimed", r->rates_claimed);
  bad |= add_num(o, "dev_hot", r->dev.hot) | add_num(o, "dev_slow", r->dev.slow);
  bad |= add_num(o, "dev_pre0", r->dev.pre0) | add_num(o, "dev_dec0", r->dev.dec0);
  bad |= add_num(o, "dev_hot_answers", r->dev.hot_answers);
  bad |= add_num(o, "probe_fail", r->health.probe_fail) | add_u64(o, "probe_late_ms", r->health.probe_late_ms);
  bad |= add_num(o, "inter_busy", r->sched.inter_busy) | add_num(o, "inter_peak", r->sched.inter_peak);
  bad |= add_u64(o, "inter_peak_ms", r->sched.inter_peak_ms);
  /* a check of it undecided with enough answered (answers verified): it takes no new work;
     only when so (records before it have none) */
  if (gw_replica_has(r, GW_HELD_CHECK)) bad |= add_num(o, "verify_hold", 1);
  /* what its engine serves, only when a request may need it (records before it have none) */
  if (r->feat_known)
    bad |= add_num(o, "features", r->features) | add_num(o, "choices_max", r->choices_max);
  /* leases in their places: ties between equal ends keep this order in a plan */
  cJSON *ls = cJSON_AddArrayToObject(o, "leases");
  bad |= !ls;
  for (int i = 0; ls && i < GW_MAX_SLOTS; i++) {
    const gw_lease *l = &r->leases[i];
    if (!l->id) continue;
    cJSON *e = cJSON_CreateArray();
    bad |= !e || !cJSON_AddItemToArray(ls, e);
    if (!e) break;
    bad |= push_u64(e, (uint64_t)i) | push_u64(e, l->id) | push_u64(e, l->start_ms) |
           push_u64(e, l->pred_end_ms) | push_u64(e, (uint64_t)l->batch);
  }
  cJSON *pc = cJSON_AddObjectToObject(o, "pc");
  bad |= !pc;
  if (pc) {
    bad |= add_num(pc, "agent", r->pc.agent) | add_hex(pc, "scope", r->pc.scope) | add_num(pc, "mixed", r->pc.mixed);
    cJSON *ss = cJSON_AddArrayToObject(pc, "slots");
    bad |= !ss;
    for (int i = 0; ss && i < r->pc.n; i++) {
      const gw_pslot *s = &r->pc.slot[i];
      cJSON *e = cJSON_CreateObject();
      bad |= !e || !cJSON_AddItemToArray(ss, e);
      if (!e) break;
      bad |= add_hex(e, "scope", s->scope) | add_u64(e, "used", s->used);
      cJSON *b = blocks_json(t, s->blocks, s->n_blocks);
      bad |= !b || !cJSON_AddItemToObject(e, "blocks", b);
      if (r->pc.hybrid) bad |= ckpts_json(e, s, t);
    }
    /* a hybrid engine's: what its predictions read besides the slots (records before
       issue 37 have none: a transformer's cache) */
    if (r->pc.hybrid) bad |= add_num(pc, "hybrid", 1) | shares_json(pc, &r->pc);
  }
  gw_planrec_derived d;
  gw_planrec_derive(r, now, &d);
  cJSON *x = cJSON_AddObjectToObject(o, "derived");
  bad |= !x;
  if (x) {
    bad |= add_num(x, "capacity", d.capacity) | add_num(x, "suspect", d.suspect) | add_num(x, "unknown", d.unknown);
    bad |= add_num(x, "slowdown", d.slowdown) | add_num(x, "device_slowdown", d.device_slowdown);
    bad |= add_num(x, "wait_ms", d.wait_ms == UINT64_MAX ? -1 : (double)d.wait_ms); /* -1: no slot ever */
  }
  if (bad) {
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

static cJSON *req_json(const gw_sched_req *q, gw_replica *const *rs, size_t nr, fp_table *t) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  long avoid = -1;
  for (size_t j = 0; q->avoid && j < nr && avoid < 0; j++)
    if (rs[j] == q->avoid) avoid = (long)j;
  int bad = !cJSON_AddStringToObject(o, "model", q->model ? q->model : "");
  bad |= add_num(o, "prompt_tokens", (double)q->prompt_tokens) | add_num(o, "max_tokens", (double)q->max_tokens);
  bad |= add_num(o, "expected_out", q->expected_out) | add_hex(o, "cache_scope", q->cache_scope);
  bad |= add_num(o, "avoid", (double)avoid) | add_num(o, "batch", q->batch);
  bad |= add_num(o, "batch_reserve", q->batch_reserve) | add_num(o, "batch_borrow_s", q->batch_borrow_s);
  bad |= add_num(o, "take_free", q->take_free) | add_num(o, "explore", q->explore);
  bad |= add_num(o, "short_s", q->short_s) | add_num(o, "short_reserve", q->short_reserve);
  bad |= add_num(o, "wait_weight_max", q->wait_weight_max);
  if (q->start_by_s > 0) /* (records before continuing streams' limits have none: absent) */
    bad |= add_num(o, "start_by_s", q->start_by_s);
  if (q->needs || q->choices > 1) /* (none before engine features: absent) */
    bad |= add_num(o, "needs", q->needs) | add_num(o, "choices", q->choices);
  bad |= add_num(o, "fill_idle", q->fill_idle) | add_num(o, "load_erlangs", q->load_erlangs);
  /* what a hybrid engine's checkpoints serve of it, when it has any (records before issue
     37 have none: -1 and no fingerprints) */
  if (q->user_at >= 0 || q->user_fp || q->full_fp)
    bad |= add_num(o, "user_at", (double)q->user_at) | add_hex(o, "user_fp", q->user_fp) |
           add_hex(o, "full_fp", q->full_fp);
  bad |= add_num(o, "short_rate", q->short_rate) | add_num(o, "short_wait_p", q->short_wait_p);
  cJSON *b = blocks_json(t, q->blocks, q->n_blocks);
  bad |= !b || !cJSON_AddItemToObject(o, "blocks", b);
  if (bad) {
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

static cJSON *choice_json(const gw_sched_choice *c) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  int bad = add_num(o, "replica", c->replica) | add_num(o, "now", c->now) | add_num(o, "finish_s", c->finish_s);
  bad |= add_num(o, "service_s", c->service_s) | add_num(o, "prefill_s", c->prefill_s);
  bad |= add_num(o, "cached_tokens", (double)c->cached_tokens) | add_num(o, "alt_finish_s", c->alt_finish_s);
  bad |= add_num(o, "alt_replica", c->alt_replica);
  if (bad) {
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

/* The part every record shares: kind, time, replicas, requests; fp is added last. */
static cJSON *record_begin(gw_planrec_kind kind, gw_replica *const *rs, size_t nr, const gw_sched_req *q,
                           size_t n, uint64_t now, fp_table *t) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  int bad = add_num(o, "v", PLANREC_VERSION) | !cJSON_AddStringToObject(o, "kind", gw_planrec_kind_name(kind));
  bad |= add_u64(o, "now", now);
  cJSON *ra = cJSON_AddArrayToObject(o, "replicas");
  bad |= !ra;
  for (size_t j = 0; ra && j < nr && !bad; j++) {
    cJSON *e = replica_json(rs[j], now, t);
    bad |= !e || !cJSON_AddItemToArray(ra, e);
  }
  cJSON *qa = cJSON_AddArrayToObject(o, "reqs");
  bad |= !qa;
  for (size_t i = 0; qa && i < n && !bad; i++) {
    cJSON *e = req_json(&q[i], rs, nr, t);
    bad |= !e || !cJSON_AddItemToArray(qa, e);
  }
  if (bad) {
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

static void record_end(gw_planrec *rec, cJSON *o, fp_table *t) {
  cJSON *fa = o ? cJSON_AddArrayToObject(o, "fp") : NULL;
  int bad = !fa;
  for (size_t i = 0; fa && i < t->n && !bad; i++) {
    char h[20];
    snprintf(h, sizeof(h), "%016" PRIx64, t->v[i]);
    cJSON *s = cJSON_CreateString(h);
    bad |= !s || !cJSON_AddItemToArray(fa, s);
  }
  free(t->v);
  char *text = !bad ? cJSON_PrintUnformatted(o) : NULL;
  cJSON_Delete(o);
  if (!text) {
    rec->lost++;
    return;
  }
  size_t len = strlen(text);
  text[len] = '\n'; /* the NUL's place: one write per line, so lines of several gateways do not mix */
  ssize_t w = write(rec->fd, text, len + 1);
  cJSON_free(text);
  if (w == (ssize_t)(len + 1)) rec->written++;
  else rec->lost++;
}

void gw_planrec_plan(gw_planrec *rec, gw_planrec_kind kind, gw_replica *const *rs, size_t nr,
                     const gw_sched_req *q, size_t n, uint64_t now, const gw_sched_choice *out) {
  if (!rec) return;
  fp_table t = {0};
  cJSON *o = record_begin(kind, rs, nr, q, n, now, &t);
  cJSON *oa = o ? cJSON_AddArrayToObject(o, "out") : NULL;
  for (size_t i = 0; oa && i < n; i++) {
    cJSON *e = choice_json(&out[i]);
    if (!e || !cJSON_AddItemToArray(oa, e)) {
      cJSON_Delete(e);
      cJSON_Delete(o);
      o = NULL;
      break;
    }
  }
  if (o && !oa) {
    cJSON_Delete(o);
    o = NULL;
  }
  record_end(rec, o, &t);
}

void gw_planrec_predict(gw_planrec *rec, gw_replica *const *rs, size_t nr, const gw_sched_req *q,
                        uint64_t now, double svc, double fin, int guess) {
  if (!rec) return;
  fp_table t = {0};
  cJSON *o = record_begin(GW_PLANREC_PREDICT, rs, nr, q, 1, now, &t);
  cJSON *p = o ? cJSON_AddObjectToObject(o, "predict") : NULL;
  if (!p || add_num(p, "svc", svc) | add_num(p, "fin", fin) | add_num(p, "guess", guess)) {
    cJSON_Delete(o);
    o = NULL;
  }
  record_end(rec, o, &t);
}

/* ---- reading ---- */

static double num(const cJSON *o, const char *key, int *bad) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (cJSON_IsNumber(v)) return v->valuedouble;
  if (cJSON_IsString(v)) {
    if (strcmp(v->valuestring, "inf") == 0) return INFINITY;
    if (strcmp(v->valuestring, "-inf") == 0) return -INFINITY;
    if (strcmp(v->valuestring, "nan") == 0) return NAN;
  }
  *bad = 1;
  return 0;
}

static uint64_t u64_of(const cJSON *v, int *bad) {
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 9007199254740992.0) {
    *bad = 1;
    return 0;
  }
  return (uint64_t)v->valuedouble;
}

static uint64_t u64(const cJSON *o, const char *key, int *bad) {
  return u64_of(cJSON_GetObjectItemCaseSensitive(o, key), bad);
}

static uint64_t hex(const cJSON *o, const char *key, int *bad) {
  const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
  char *end = NULL;
  if (!cJSON_IsString(v)) {
    *bad = 1;
    return 0;
  }
  uint64_t x = strtoull(v->valuestring, &end, 16);
  if (!end || *end) *bad = 1;
  return x;
}

static char *keep(gw_planrec_case *c, const char *s) {
  char **a = realloc(c->strings, (c->n_strings + 1) * sizeof(*a));
  if (!a) return NULL;
  c->strings = a;
  if (!(a[c->n_strings] = strdup(s))) return NULL;
  return a[c->n_strings++];
}

/* Fingerprint indexes into out (at most max); returns how many, or -1. */
static long blocks_read(const gw_planrec_case *c, const cJSON *arr, uint64_t *out, size_t max) {
  if (!cJSON_IsArray(arr)) return -1;
  size_t k = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, arr) {
    int bad = 0;
    uint64_t i = u64_of(e, &bad);
    if (bad || i >= c->n_fp || k >= max) return -1;
    out[k++] = c->fp[i];
  }
  return (long)k;
}

static void ckpts_read(const gw_planrec_case *c, const cJSON *a, gw_pslot *s, int *bad) {
  const cJSON *x;
  s->n_ck = 0;
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > GW_CACHE_CKPTS) {
    *bad = 1;
    return;
  }
  cJSON_ArrayForEach(x, a) {
    uint64_t f;
    if (cJSON_GetArraySize(x) != 5 || (f = u64_of(cJSON_GetArrayItem(x, 3), bad)) >= c->n_fp) {
      *bad = 1;
      return;
    }
    gw_pckpt *k = &s->ck[s->n_ck++];
    k->at = (int64_t)u64_of(cJSON_GetArrayItem(x, 0), bad);
    k->end = (int64_t)u64_of(cJSON_GetArrayItem(x, 1), bad);
    k->tail = (int64_t)u64_of(cJSON_GetArrayItem(x, 2), bad);
    k->fp = c->fp[f];
    k->task = u64_of(cJSON_GetArrayItem(x, 4), bad);
  }
}

static void shares_read(const cJSON *a, gw_pcache *pc, int *bad) {
  const cJSON *x;
  int i = 0;
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > GW_CACHE_SHARES) {
    *bad = 1;
    return;
  }
  cJSON_ArrayForEach(x, a) {
    gw_pshare *h = &pc->share[i++];
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(x, "model");
    if (!cJSON_IsString(m) || !m->valuestring[0] || strlen(m->valuestring) >= sizeof(h->model)) {
      *bad = 1;
      return;
    }
    snprintf(h->model, sizeof(h->model), "%s", m->valuestring);
    h->share = num(x, "share", bad);
    h->weight = num(x, "weight", bad);
    h->ratio = num(x, "ratio", bad);
    h->rweight = num(x, "rweight", bad);
    h->at_ms = u64(x, "at_ms", bad);
  }
}

static gw_replica *replica_read(gw_planrec_case *c, const cJSON *o, gw_planrec_derived *d, int *bad) {
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
  const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "models");
  if (!cJSON_IsString(id) || !cJSON_IsArray(ms)) {
    *bad = 1;
    return NULL;
  }
  size_t nm = (size_t)cJSON_GetArraySize(ms);
  char **models = calloc(nm + 1, sizeof(*models));
  if (!models) {
    *bad = 1;
    return NULL;
  }
  size_t k = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, ms) {
    if (!cJSON_IsString(m)) *bad = 1;
    else models[k++] = m->valuestring;
  }
  gw_replica *r = *bad ? NULL
                       : gw_replica_new(id->valuestring, "http://127.0.0.1:1", NULL, models, k,
                                        (int)num(o, "slots", bad), (int64_t)num(o, "n_ctx", bad), 1, 1, 0);
  free(models);
  if (!r) {
    *bad = 1;
    return NULL;
  }
  r->state = (gw_replica_state)num(o, "state", bad);
  int drain = (int)num(o, "drain", bad);
  gw_replica_held_set(r, GW_HELD_REMOVED, drain & 1);
  gw_replica_held_set(r, GW_HELD_DRAIN_CONF, (drain & 2) != 0);
  gw_replica_held_set(r, GW_HELD_DRAIN_ADMIN, (drain & 4) != 0);
  gw_replica_held_set(r, GW_HELD_DRAIN_AGENT, (drain & 8) != 0);
  r->shared.share_div = (int)num(o, "share_div", bad);
  gw_replica_held_set(r, GW_HELD_PROBATION, (int)num(o, "probation", bad));
  r->sched.trust_cap = (int)num(o, "trust_cap", bad);
  r->sched.trust_capped = (int)num(o, "trust_capped", bad);
  r->dev.cap = (int)num(o, "dev_cap", bad);
  r->shared.remote_busy = (int)num(o, "remote_busy", bad);
  r->shared.remote_busy_until = u64(o, "remote_busy_until", bad);
  r->prefill_tps = num(o, "prefill_tps", bad);
  r->decode_tps = num(o, "decode_tps", bad);
  r->prefill_samples = (unsigned)num(o, "prefill_samples", bad);
  r->decode_samples = (unsigned)num(o, "decode_samples", bad);
  r->rates_default = (int)num(o, "rates_default", bad);
  r->rates_claimed = (int)num(o, "rates_claimed", bad);
  r->dev.hot = (int)num(o, "dev_hot", bad);
  r->dev.slow = num(o, "dev_slow", bad);
  r->dev.pre0 = (unsigned)num(o, "dev_pre0", bad);
  r->dev.dec0 = (unsigned)num(o, "dev_dec0", bad);
  r->dev.hot_answers = (int)num(o, "dev_hot_answers", bad);
  r->health.probe_fail = (int)num(o, "probe_fail", bad);
  r->health.probe_late_ms = u64(o, "probe_late_ms", bad);
  r->sched.inter_busy = (int)num(o, "inter_busy", bad);
  r->sched.inter_peak = num(o, "inter_peak", bad);
  r->sched.inter_peak_ms = u64(o, "inter_peak_ms", bad);
  if (cJSON_GetObjectItemCaseSensitive(o, "verify_hold"))
    gw_replica_held_set(r, GW_HELD_CHECK, (int)num(o, "verify_hold", bad) != 0);
  if (cJSON_GetObjectItemCaseSensitive(o, "features")) {
    r->features = (unsigned)num(o, "features", bad);
    r->choices_max = (int)num(o, "choices_max", bad);
    r->feat_known = 1;
  }
  const cJSON *ls = cJSON_GetObjectItemCaseSensitive(o, "leases"), *e;
  if (!cJSON_IsArray(ls)) *bad = 1;
  cJSON_ArrayForEach(e, ls) {
    if (cJSON_GetArraySize(e) != 5) {
      *bad = 1;
      break;
    }
    uint64_t i = u64_of(cJSON_GetArrayItem(e, 0), bad);
    if (i >= GW_MAX_SLOTS) {
      *bad = 1;
      break;
    }
    gw_lease *l = &r->leases[i];
    l->id = u64_of(cJSON_GetArrayItem(e, 1), bad);
    l->start_ms = u64_of(cJSON_GetArrayItem(e, 2), bad);
    l->pred_end_ms = u64_of(cJSON_GetArrayItem(e, 3), bad);
    l->batch = (int)u64_of(cJSON_GetArrayItem(e, 4), bad);
    r->inflight++;
  }
  const cJSON *pc = cJSON_GetObjectItemCaseSensitive(o, "pc");
  const cJSON *ss = pc ? cJSON_GetObjectItemCaseSensitive(pc, "slots") : NULL;
  if (cJSON_IsArray(ss)) gw_pcache_shape(&r->pc, cJSON_GetArraySize(ss));
  if (!cJSON_IsArray(ss) || r->pc.n != cJSON_GetArraySize(ss)) {
    *bad = 1;
  } else {
    r->pc.agent = (int)num(pc, "agent", bad);
    r->pc.scope = hex(pc, "scope", bad);
    r->pc.mixed = (int)num(pc, "mixed", bad);
    int i = 0;
    cJSON_ArrayForEach(e, ss) {
      gw_pslot *s = &r->pc.slot[i++];
      s->scope = hex(e, "scope", bad);
      s->used = u64(e, "used", bad);
      long nb = blocks_read(c, cJSON_GetObjectItemCaseSensitive(e, "blocks"), s->blocks, GW_CACHE_BLOCKS);
      if (nb < 0) *bad = 1;
      else s->n_blocks = (size_t)nb;
      const cJSON *ck = cJSON_GetObjectItemCaseSensitive(e, "ck");
      if (ck) ckpts_read(c, ck, s, bad);
    }
    if (cJSON_GetObjectItemCaseSensitive(pc, "hybrid")) {
      r->pc.hybrid = (int)num(pc, "hybrid", bad);
      shares_read(cJSON_GetObjectItemCaseSensitive(pc, "shares"), &r->pc, bad);
    }
  }
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "derived");
  d->capacity = (int)num(x, "capacity", bad);
  d->suspect = (int)num(x, "suspect", bad);
  d->unknown = (int)num(x, "unknown", bad);
  d->slowdown = num(x, "slowdown", bad);
  d->device_slowdown = num(x, "device_slowdown", bad);
  double w = num(x, "wait_ms", bad);
  d->wait_ms = w < 0 || w >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)w;
  return r;
}

static void req_read(gw_planrec_case *c, const cJSON *o, size_t i, int *bad) {
  gw_sched_req *q = &c->reqs[i];
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "model");
  q->model = cJSON_IsString(m) ? keep(c, m->valuestring) : NULL;
  if (!q->model) *bad = 1;
  q->prompt_tokens = (int64_t)num(o, "prompt_tokens", bad);
  q->max_tokens = (int64_t)num(o, "max_tokens", bad);
  q->expected_out = num(o, "expected_out", bad);
  q->cache_scope = hex(o, "cache_scope", bad);
  long avoid = (long)num(o, "avoid", bad);
  q->avoid = avoid >= 0 && (size_t)avoid < c->nr ? c->replicas[avoid] : NULL;
  q->batch = (int)num(o, "batch", bad);
  q->batch_reserve = num(o, "batch_reserve", bad);
  q->batch_borrow_s = num(o, "batch_borrow_s", bad);
  q->take_free = (int)num(o, "take_free", bad);
  q->explore = num(o, "explore", bad);
  q->short_s = num(o, "short_s", bad);
  q->short_reserve = (int)num(o, "short_reserve", bad);
  q->wait_weight_max = num(o, "wait_weight_max", bad);
  if (cJSON_GetObjectItemCaseSensitive(o, "needs")) {
    q->needs = (unsigned)num(o, "needs", bad);
    q->choices = (int)num(o, "choices", bad);
  }
  /* records from before the queue was planned as a whole have neither: each request alone */
  int none = 0;
  q->fill_idle = (int)num(o, "fill_idle", &none);
  q->load_erlangs = num(o, "load_erlangs", &none);
  q->user_at = -1;
  if (cJSON_GetObjectItemCaseSensitive(o, "user_at")) {
    q->user_at = (int64_t)num(o, "user_at", bad);
    q->user_fp = hex(o, "user_fp", bad);
    q->full_fp = hex(o, "full_fp", bad);
  }
  /* nor, before kept slots were left to longer work when short work is unlikely to come
   * before a quick slot frees, these: kept slots stay kept */
  q->short_rate = num(o, "short_rate", &none);
  /* nor, before a request's time to start was planned on, this: no limit */
  q->start_by_s = num(o, "start_by_s", &none);
  q->short_wait_p = num(o, "short_wait_p", &none);
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "blocks");
  size_t nb = cJSON_IsArray(b) ? (size_t)cJSON_GetArraySize(b) : 0;
  c->blocks[i] = calloc(nb ? nb : 1, sizeof(uint64_t));
  long got = c->blocks[i] ? blocks_read(c, b, c->blocks[i], nb) : -1;
  if (got < 0) *bad = 1;
  q->blocks = c->blocks[i];
  q->n_blocks = got > 0 ? (size_t)got : 0;
}

static void choice_read(const cJSON *o, gw_sched_choice *ch, int *bad) {
  ch->replica = (int)num(o, "replica", bad);
  ch->now = (int)num(o, "now", bad);
  ch->finish_s = num(o, "finish_s", bad);
  ch->service_s = num(o, "service_s", bad);
  ch->prefill_s = num(o, "prefill_s", bad);
  ch->cached_tokens = (int64_t)num(o, "cached_tokens", bad);
  ch->alt_finish_s = num(o, "alt_finish_s", bad);
  ch->alt_replica = (int)num(o, "alt_replica", bad);
}

int gw_planrec_parse(const char *line, size_t len, gw_planrec_case *c, char *err, size_t n) {
  memset(c, 0, sizeof(*c));
  cJSON *o = cJSON_ParseWithLength(line, len);
  int bad = 0;
  const char *why = "not a JSON object";
  if (!cJSON_IsObject(o)) goto fail;
  why = "an unknown version or kind";
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "kind");
  if (num(o, "v", &bad) != PLANREC_VERSION || !cJSON_IsString(k)) goto fail;
  c->kind = GW_PLANREC_KINDS;
  for (int i = 0; i < GW_PLANREC_KINDS; i++)
    if (strcmp(k->valuestring, kind_names[i]) == 0) c->kind = (gw_planrec_kind)i;
  if (c->kind == GW_PLANREC_KINDS) goto fail;
  c->now = u64(o, "now", &bad);
  why = "a bad fingerprint table";
  const cJSON *fa = cJSON_GetObjectItemCaseSensitive(o, "fp"), *e;
  if (!cJSON_IsArray(fa)) goto fail;
  c->n_fp = (size_t)cJSON_GetArraySize(fa);
  c->fp = calloc(c->n_fp ? c->n_fp : 1, sizeof(*c->fp));
  if (!c->fp) goto fail;
  size_t i = 0;
  cJSON_ArrayForEach(e, fa) {
    char *end = NULL;
    if (!cJSON_IsString(e)) goto fail;
    c->fp[i++] = strtoull(e->valuestring, &end, 16);
    if (!end || *end) goto fail;
  }
  why = "bad replicas";
  const cJSON *ra = cJSON_GetObjectItemCaseSensitive(o, "replicas");
  if (!cJSON_IsArray(ra)) goto fail;
  size_t nr = (size_t)cJSON_GetArraySize(ra);
  c->replicas = calloc(nr ? nr : 1, sizeof(*c->replicas));
  c->derived = calloc(nr ? nr : 1, sizeof(*c->derived));
  if (!c->replicas || !c->derived) goto fail;
  cJSON_ArrayForEach(e, ra) {
    gw_replica *r = replica_read(c, e, &c->derived[c->nr], &bad);
    if (!r) goto fail;
    c->replicas[c->nr++] = r;
    if (bad) goto fail;
  }
  why = "bad requests";
  const cJSON *qa = cJSON_GetObjectItemCaseSensitive(o, "reqs");
  if (!cJSON_IsArray(qa)) goto fail;
  size_t nq = (size_t)cJSON_GetArraySize(qa);
  c->reqs = calloc(nq ? nq : 1, sizeof(*c->reqs));
  c->blocks = calloc(nq ? nq : 1, sizeof(*c->blocks));
  c->out = calloc(nq ? nq : 1, sizeof(*c->out));
  if (!c->reqs || !c->blocks || !c->out) goto fail;
  c->n = nq;
  i = 0;
  cJSON_ArrayForEach(e, qa) req_read(c, e, i++, &bad);
  if (bad) goto fail;
  why = "bad outputs";
  if (c->kind == GW_PLANREC_PREDICT) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "predict");
    if (!p || c->n != 1) goto fail;
    c->svc = num(p, "svc", &bad);
    c->fin = num(p, "fin", &bad);
    c->guess = (int)num(p, "guess", &bad);
  } else {
    const cJSON *oa = cJSON_GetObjectItemCaseSensitive(o, "out");
    if (!cJSON_IsArray(oa) || (size_t)cJSON_GetArraySize(oa) != c->n) goto fail;
    i = 0;
    cJSON_ArrayForEach(e, oa) choice_read(e, &c->out[i++], &bad);
  }
  if (bad) goto fail;
  cJSON_Delete(o);
  return 0;
fail:
  if (err && n) snprintf(err, n, "%s", why);
  cJSON_Delete(o);
  gw_planrec_case_free(c);
  return -EINVAL;
}

void gw_planrec_case_free(gw_planrec_case *c) {
  for (size_t j = 0; j < c->nr; j++) gw_replica_free(c->replicas[j]);
  free(c->replicas);
  free(c->derived);
  for (size_t i = 0; c->blocks && i < c->n; i++) free(c->blocks[i]);
  free(c->blocks);
  free(c->reqs);
  free(c->out);
  for (size_t i = 0; i < c->n_strings; i++) free(c->strings[i]);
  free(c->strings);
  free(c->fp);
  memset(c, 0, sizeof(*c));
}
