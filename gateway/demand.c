/* Demand and supply as measured; see demand.h. */
#include "demand.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idmap.h"

typedef struct cell {
  double arrivals, tok_in; /* requests that arrived, and their prompts' tokens */
  double ended, tok_out;   /* of them, those answered, and their answers' tokens */
  double served, svc, svc2; /* answers whose slot time was measured: count, sum, sum of squares (s) */
} cell;

typedef struct dmodel {
  char name[GW_DEMAND_ID_MAX];
  cell fine[GW_DEMAND_FINE][GW_DEMAND_CLASSES];
  int64_t fine_at[GW_DEMAND_FINE]; /* the bucket number held (ms / GW_DEMAND_FINE_MS); -1 none */
  cell hour[GW_DEMAND_HOURS][GW_DEMAND_CLASSES];
  int64_t hour_at[GW_DEMAND_HOURS];
} dmodel;

typedef struct stay {
  char id[GW_DEMAND_ID_MAX];
  int64_t join_ms, answer_ms, leave_ms; /* 0: not (yet) */
  int used;
  int confirmed; /* joined in this process (not only read back) */
  int no_startup; /* its start-up is not measured */
} stay;

struct gw_demand {
  dmodel *m[GW_DEMAND_MAX_MODELS];
  size_t n;
  int64_t since_ms;
  stay *stays;   /* a ring of GW_DEMAND_SESSIONS */
  size_t next;   /* where the next stay goes */
  pr_idmap open; /* id -> its stay not ended */
};

static const char *const class_names[GW_DEMAND_CLASSES] = {"interactive", "review", "batch"};

const char *gw_demand_class_name(gw_demand_class c) {
  return (unsigned)c < GW_DEMAND_CLASSES ? class_names[c] : "?";
}

gw_demand *gw_demand_new(int64_t now) {
  gw_demand *d = calloc(1, sizeof(*d));
  if (!d) return NULL;
  d->stays = calloc(GW_DEMAND_SESSIONS, sizeof(*d->stays));
  if (!d->stays) {
    free(d);
    return NULL;
  }
  d->since_ms = now;
  return d;
}

void gw_demand_free(gw_demand *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n; i++) free(d->m[i]);
  pr_idmap_clear(&d->open);
  free(d->stays);
  free(d);
}

static dmodel *find(const gw_demand *d, const char *name) {
  for (size_t i = 0; i < d->n; i++)
    if (strcmp(d->m[i]->name, name) == 0) return d->m[i];
  return NULL;
}

static dmodel *get(gw_demand *d, const char *name, int *rc) {
  dmodel *m = find(d, name);
  if (m) return m;
  if (strlen(name) >= GW_DEMAND_ID_MAX || d->n >= GW_DEMAND_MAX_MODELS) {
    *rc = -ENOSPC;
    return NULL;
  }
  m = calloc(1, sizeof(*m));
  if (!m) {
    *rc = -ENOMEM;
    return NULL;
  }
  strcpy(m->name, name);
  for (size_t i = 0; i < GW_DEMAND_FINE; i++) m->fine_at[i] = -1;
  for (size_t i = 0; i < GW_DEMAND_HOURS; i++) m->hour_at[i] = -1;
  d->m[d->n++] = m;
  return m;
}

/* The bucket for number idx in a ring of n (cleared when it held an older one); NULL
 * when it holds a newer one (idx is too old to keep). */
static cell *bucket(cell (*ring)[GW_DEMAND_CLASSES], int64_t *at, size_t n, int64_t idx) {
  size_t slot = (size_t)(idx % (int64_t)n);
  if (at[slot] == idx) return ring[slot];
  if (at[slot] > idx) return NULL;
  memset(ring[slot], 0, sizeof(ring[slot]));
  at[slot] = idx;
  return ring[slot];
}

static void add(cell *c, double a, double in, double e, double out) {
  c->arrivals += a;
  c->tok_in += in;
  c->ended += e;
  c->tok_out += out;
}

static void add_svc(cell *c, double n, double sum, double sum2) {
  c->served += n;
  c->svc += sum;
  c->svc2 += sum2;
}

/* A rate's sums (as gathered: served, service_s the sum, service_scv the sum of squares)
 * made into the mean and its squared coefficient of variation. */
static void finish_service(gw_demand_rate *out) {
  double n = out->served, sum = out->service_s, sum2 = out->service_scv;
  out->service_s = 0;
  out->service_scv = 0;
  if (!(n > 0) || !(sum > 0)) return;
  double mean = sum / n;
  out->service_s = mean;
  if (n < 2) return;
  double var = (sum2 - sum * mean) / (n - 1);
  out->service_scv = var > 0 ? var / (mean * mean) : 0;
}

static void gather_svc(gw_demand_rate *out, const cell *c) {
  out->served += c->served;
  out->service_s += c->svc;
  out->service_scv += c->svc2;
}

int gw_demand_record_service(gw_demand *d, const char *model, gw_demand_class c, int64_t at,
                             double service_s) {
  if ((unsigned)c >= GW_DEMAND_CLASSES || at < 0 || !isfinite(service_s) || service_s < 0)
    return -EINVAL;
  int rc = 0;
  dmodel *m = get(d, model, &rc);
  if (!m) return rc;
  cell *f = bucket(m->fine, m->fine_at, GW_DEMAND_FINE, at / GW_DEMAND_FINE_MS);
  if (f) add_svc(&f[c], 1, service_s, service_s * service_s);
  cell *h = bucket(m->hour, m->hour_at, GW_DEMAND_HOURS, at / GW_DEMAND_HOUR_MS);
  if (h) add_svc(&h[c], 1, service_s, service_s * service_s);
  return 0;
}

int gw_demand_record(gw_demand *d, const char *model, gw_demand_class c, int64_t at,
                     double arrivals, double tok_in, double tok_out) {
  return gw_demand_record_ended(d, model, c, at, arrivals, tok_in, arrivals, tok_out);
}

int gw_demand_record_ended(gw_demand *d, const char *model, gw_demand_class c, int64_t at,
                           double arrivals, double tok_in, double ended, double tok_out) {
  if ((unsigned)c >= GW_DEMAND_CLASSES || at < 0) return -EINVAL;
  int rc = 0;
  dmodel *m = get(d, model, &rc);
  if (!m) return rc;
  if (!(tok_in >= 0)) tok_in = 0;
  if (!(tok_out >= 0)) tok_out = 0;
  if (!(arrivals >= 0)) arrivals = 0;
  if (!(ended >= 0)) ended = 0;
  cell *f = bucket(m->fine, m->fine_at, GW_DEMAND_FINE, at / GW_DEMAND_FINE_MS);
  if (f) add(&f[c], arrivals, tok_in, ended, tok_out);
  cell *h = bucket(m->hour, m->hour_at, GW_DEMAND_HOURS, at / GW_DEMAND_HOUR_MS);
  if (h) add(&h[c], arrivals, tok_in, ended, tok_out);
  return 0;
}

/* out holds sums (requests, ended, tokens in mean_in and mean_out): the means and rates. */
static void finish_rate(gw_demand_rate *out) {
  if (out->span_s > 0) {
    out->arrivals_per_s = out->requests / out->span_s;
    out->tok_in_per_s = out->mean_in / out->span_s;
    out->tok_out_per_s = out->mean_out / out->span_s;
  }
  if (out->requests > 0) out->mean_in /= out->requests;
  if (out->ended > 0) {
    out->tok_out_per_s = out->mean_out / out->ended * out->arrivals_per_s;
    out->mean_out /= out->ended;
  } else {
    out->mean_out = 0;
  }
  finish_service(out);
}

int gw_demand_window(const gw_demand *d, const char *model, unsigned mask, int64_t now,
                   double window_s, gw_demand_rate *out) {
  memset(out, 0, sizeof(*out));
  if (window_s > 3600.0 - GW_DEMAND_FINE_MS / 1000.0) window_s = 3600.0 - GW_DEMAND_FINE_MS / 1000.0;
  if (window_s < 1) window_s = 1;
  int64_t first = (now - (int64_t)(window_s * 1000)) / GW_DEMAND_FINE_MS;
  int64_t last = now / GW_DEMAND_FINE_MS;
  int64_t from = first * (int64_t)GW_DEMAND_FINE_MS;
  if (from < d->since_ms) from = d->since_ms;
  out->from_ms = from;
  out->span_s = now > from ? (double)(now - from) / 1000.0 : 0;
  const dmodel *m = find(d, model);
  if (!m) return -ENOENT;
  for (size_t i = 0; i < GW_DEMAND_FINE; i++) {
    if (m->fine_at[i] < first || m->fine_at[i] > last) continue;
    for (unsigned c = 0; c < GW_DEMAND_CLASSES; c++) {
      if (!(mask & GW_DEMAND_MASK(c))) continue;
      out->requests += m->fine[i][c].arrivals;
      out->ended += m->fine[i][c].ended;
      out->mean_in += m->fine[i][c].tok_in;
      out->mean_out += m->fine[i][c].tok_out;
      gather_svc(out, &m->fine[i][c]);
    }
  }
  finish_rate(out);
  return 0;
}

int gw_demand_recent(const gw_demand *d, const char *model, unsigned mask, int64_t now,
                     double window_s, double z, gw_demand_rate *out) {
  memset(out, 0, sizeof(*out));
  if (window_s > 3600.0 - GW_DEMAND_FINE_MS / 1000.0) window_s = 3600.0 - GW_DEMAND_FINE_MS / 1000.0;
  if (window_s < 1) window_s = 1;
  const dmodel *m = find(d, model);
  if (!m) return -ENOENT;
  int64_t oldest = (now - (int64_t)(window_s * 1000)) / GW_DEMAND_FINE_MS;
  int64_t last = now / GW_DEMAND_FINE_MS;
  double count = 0, span = 0;
  int64_t from = now;
  int taken = 0;
  for (int64_t idx = last; idx >= oldest; idx--) {
    int64_t b0 = idx * (int64_t)GW_DEMAND_FINE_MS, b1 = b0 + GW_DEMAND_FINE_MS;
    if (b1 > now) b1 = now;
    if (b0 < d->since_ms) b0 = d->since_ms;
    if (b1 <= b0) {
      if (b0 >= now) continue; /* the bucket just begun: no time of it yet */
      break;                   /* before the figures began */
    }
    double n = 0;
    size_t slot = (size_t)(idx % GW_DEMAND_FINE);
    if (m->fine_at[slot] == idx)
      for (unsigned c = 0; c < GW_DEMAND_CLASSES; c++)
        if (mask & GW_DEMAND_MASK(c)) n += m->fine[slot][c].arrivals;
    double len = (double)(b1 - b0) / 1000.0;
    if (taken >= 2 && span > 0) {
      /* the newest two buckets always; an older one while it is not a step below */
      double want = count / span * len;
      if (n < want - z * sqrt(want)) break;
    }
    count += n;
    span += len;
    from = b0;
    taken++;
  }
  out->from_ms = from;
  out->span_s = span;
  out->requests = count;
  if (span > 0) out->arrivals_per_s = count / span;
  return 0;
}

int gw_demand_peak(const gw_demand *d, const char *model, unsigned mask, int64_t now,
                   gw_demand_rate *out) {
  memset(out, 0, sizeof(*out));
  const dmodel *m = find(d, model);
  if (!m) return -ENOENT;
  int64_t last = now / GW_DEMAND_HOUR_MS;
  int found = 0;
  for (size_t i = 0; i < GW_DEMAND_HOURS; i++) {
    int64_t idx = m->hour_at[i];
    if (idx < 0 || idx > last || idx <= last - GW_DEMAND_HOURS) continue;
    int64_t start = idx * (int64_t)GW_DEMAND_HOUR_MS, end = start + GW_DEMAND_HOUR_MS;
    if (start < d->since_ms) start = d->since_ms;
    if (end > now) end = now;
    double span = (double)(end - start) / 1000.0;
    if (span < 600) continue; /* too little of the hour to call it a rate */
    gw_demand_rate r = {.span_s = span, .from_ms = idx * (int64_t)GW_DEMAND_HOUR_MS};
    for (unsigned c = 0; c < GW_DEMAND_CLASSES; c++) {
      if (!(mask & GW_DEMAND_MASK(c))) continue;
      r.requests += m->hour[i][c].arrivals;
      r.ended += m->hour[i][c].ended;
      r.mean_in += m->hour[i][c].tok_in;
      r.mean_out += m->hour[i][c].tok_out;
      gather_svc(&r, &m->hour[i][c]);
    }
    finish_rate(&r);
    if (!found || r.arrivals_per_s > out->arrivals_per_s) *out = r;
    found = 1;
  }
  return found ? 0 : -ENOENT;
}

int gw_demand_hour(const gw_demand *d, const char *model, unsigned mask, int64_t hour_ms,
                   int64_t now, gw_demand_rate *out) {
  memset(out, 0, sizeof(*out));
  const dmodel *m = find(d, model);
  int64_t idx = hour_ms / GW_DEMAND_HOUR_MS;
  if (!m || idx < 0 || m->hour_at[idx % GW_DEMAND_HOURS] != idx) return -ENOENT;
  size_t i = (size_t)(idx % GW_DEMAND_HOURS);
  int64_t start = idx * (int64_t)GW_DEMAND_HOUR_MS, end = start + GW_DEMAND_HOUR_MS;
  out->from_ms = start;
  if (start < d->since_ms) start = d->since_ms;
  if (end > now) end = now;
  out->span_s = end > start ? (double)(end - start) / 1000.0 : 0;
  for (unsigned c = 0; c < GW_DEMAND_CLASSES; c++) {
    if (!(mask & GW_DEMAND_MASK(c))) continue;
    out->requests += m->hour[i][c].arrivals;
    out->ended += m->hour[i][c].ended;
    out->mean_in += m->hour[i][c].tok_in;
    out->mean_out += m->hour[i][c].tok_out;
    gather_svc(out, &m->hour[i][c]);
  }
  finish_rate(out);
  return 0;
}

size_t gw_demand_models(const gw_demand *d) { return d->n; }
const char *gw_demand_model(const gw_demand *d, size_t i) { return i < d->n ? d->m[i]->name : NULL; }
int64_t gw_demand_since(const gw_demand *d) { return d->since_ms; }

/* ---- phones ---------------------------------------------------------------------------- */

static stay *stay_new(gw_demand *d, const char *id) {
  size_t n = strlen(id);
  if (n >= sizeof(d->stays[0].id)) return NULL; /* no phone id is this long (ids are capped) */
  stay *s = &d->stays[d->next];
  d->next = (d->next + 1) % GW_DEMAND_SESSIONS;
  if (s->used && !s->leave_ms) (void)pr_idmap_del_str(&d->open, s->id); /* the oldest goes */
  memset(s, 0, sizeof(*s));
  memcpy(s->id, id, n + 1);
  s->used = 1;
  if (pr_idmap_put_str(&d->open, s->id, s) < 0) {
    s->used = 0;
    return NULL;
  }
  return s;
}

void gw_demand_phone_join(gw_demand *d, const char *id, int64_t now, int measure_startup) {
  stay *s = pr_idmap_get_str(&d->open, id);
  if (s) {
    s->confirmed = 1;
    return;
  }
  s = stay_new(d, id);
  if (!s) return;
  s->join_ms = now;
  s->confirmed = 1;
  s->no_startup = !measure_startup;
}

void gw_demand_phone_answered(gw_demand *d, const char *id, int64_t now) {
  stay *s = pr_idmap_get_str(&d->open, id);
  if (s && !s->answer_ms && !s->no_startup) s->answer_ms = now > s->join_ms ? now : s->join_ms;
}

void gw_demand_phone_leave(gw_demand *d, const char *id, int64_t now) {
  stay *s = pr_idmap_get_str(&d->open, id);
  if (!s) return;
  s->leave_ms = now > s->join_ms ? now : s->join_ms;
  (void)pr_idmap_del_str(&d->open, id);
}

void gw_demand_phone_settle(gw_demand *d, int64_t ended) {
  for (size_t i = 0; i < GW_DEMAND_SESSIONS; i++) {
    stay *s = &d->stays[i];
    if (s->used && !s->leave_ms && !s->confirmed) gw_demand_phone_leave(d, s->id, ended);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

void gw_demand_churn(const gw_demand *d, int64_t now, gw_churn *out) {
  memset(out, 0, sizeof(*out));
  out->mean_stay_h = -1;
  out->startup_s = -1;
  int64_t week = now - (int64_t)GW_DEMAND_HOURS * GW_DEMAND_HOUR_MS;
  double *starts = malloc(GW_DEMAND_SESSIONS * sizeof(double));
  for (size_t i = 0; i < GW_DEMAND_SESSIONS; i++) {
    const stay *s = &d->stays[i];
    if (!s->used) continue;
    int64_t end = s->leave_ms ? s->leave_ms : now;
    if (end < week) continue;
    int64_t begin = s->join_ms > week ? s->join_ms : week;
    if (end > begin) out->phone_hours += (double)(end - begin) / 3.6e6;
    if (s->leave_ms) out->departures++;
    else out->phones_now++;
    if (s->answer_ms && s->answer_ms >= week && starts)
      starts[out->startup_samples++] = (double)(s->answer_ms - s->join_ms) / 1000.0;
  }
  if (out->phone_hours > 0) out->gone_per_h = (double)out->departures / out->phone_hours;
  if (out->departures) out->mean_stay_h = out->phone_hours / (double)out->departures;
  if (out->startup_samples && starts) {
    qsort(starts, out->startup_samples, sizeof(double), cmp_double);
    size_t n = out->startup_samples;
    out->startup_s = n % 2 ? starts[n / 2] : (starts[n / 2 - 1] + starts[n / 2]) / 2;
  }
  free(starts);
}

/* ---- kept across restarts ---------------------------------------------------------------- */

static cJSON *cells_json(const cell (*ring)[GW_DEMAND_CLASSES], const int64_t *at, size_t n,
                         int64_t oldest) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; a && i < n; i++) {
    if (at[i] < oldest) continue;
    for (unsigned c = 0; c < GW_DEMAND_CLASSES; c++) {
      const cell *x = &ring[i][c];
      if (x->arrivals == 0 && x->tok_in == 0 && x->ended == 0 && x->tok_out == 0 && x->served == 0)
        continue;
      /* the answers' slot times only where there are some (version 2) */
      const double v[9] = {(double)at[i], c, x->arrivals, x->tok_in, x->ended, x->tok_out,
                           x->served, x->svc, x->svc2};
      cJSON_AddItemToArray(a, cJSON_CreateDoubleArray(v, x->served > 0 ? 9 : 6));
    }
  }
  return a;
}

cJSON *gw_demand_to_json(const gw_demand *d, int64_t now) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddNumberToObject(o, "version", 2);
  cJSON_AddNumberToObject(o, "since_ms", (double)d->since_ms);
  cJSON_AddNumberToObject(o, "saved_ms", (double)now);
  cJSON *ms = cJSON_AddArrayToObject(o, "models");
  for (size_t i = 0; i < d->n; i++) {
    const dmodel *m = d->m[i];
    cJSON *mo = cJSON_CreateObject();
    cJSON_AddStringToObject(mo, "name", m->name);
    cJSON_AddItemToObject(mo, "fine", cells_json(m->fine, m->fine_at, GW_DEMAND_FINE,
                                                 (now - 3600000) / GW_DEMAND_FINE_MS));
    cJSON_AddItemToObject(mo, "hour", cells_json(m->hour, m->hour_at, GW_DEMAND_HOURS,
                                                 now / GW_DEMAND_HOUR_MS - GW_DEMAND_HOURS + 1));
    cJSON_AddItemToArray(ms, mo);
  }
  cJSON *ss = cJSON_AddArrayToObject(o, "stays");
  int64_t week = now - (int64_t)GW_DEMAND_HOURS * GW_DEMAND_HOUR_MS;
  /* oldest first, so that reading them back keeps the ring's order */
  for (size_t k = 0; k < GW_DEMAND_SESSIONS; k++) {
    const stay *s = &d->stays[(d->next + k) % GW_DEMAND_SESSIONS];
    if (!s->used || (s->leave_ms && s->leave_ms < week)) continue;
    cJSON *so = cJSON_CreateArray();
    cJSON_AddItemToArray(so, cJSON_CreateString(s->id));
    cJSON_AddItemToArray(so, cJSON_CreateNumber((double)s->join_ms));
    cJSON_AddItemToArray(so, cJSON_CreateNumber((double)s->answer_ms));
    cJSON_AddItemToArray(so, cJSON_CreateNumber((double)s->leave_ms));
    cJSON_AddItemToArray(ss, so);
  }
  return o;
}

static int num_at(const cJSON *a, int i, double *v) {
  const cJSON *x = cJSON_GetArrayItem(a, i);
  if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0) return -1;
  *v = x->valuedouble;
  return 0;
}

/* Check the whole history before anything is taken from it. */
static int valid(const cJSON *o) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "version");
  const cJSON *since = cJSON_GetObjectItemCaseSensitive(o, "since_ms");
  const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "models");
  const cJSON *ss = cJSON_GetObjectItemCaseSensitive(o, "stays");
  if (!cJSON_IsNumber(v) || (v->valuedouble != 1 && v->valuedouble != 2) || !cJSON_IsNumber(since) || !cJSON_IsArray(ms) ||
      !cJSON_IsArray(ss) || cJSON_GetArraySize(ms) > GW_DEMAND_MAX_MODELS)
    return 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, ms) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) >= GW_DEMAND_ID_MAX)
      return 0;
    for (int k = 0; k < 2; k++) {
      const cJSON *cells = cJSON_GetObjectItemCaseSensitive(m, k ? "hour" : "fine"), *c;
      if (!cJSON_IsArray(cells)) return 0;
      cJSON_ArrayForEach(c, cells) {
        double x;
        int len = cJSON_GetArraySize(c);
        if (len != 6 && !(len == 9 && v->valuedouble >= 2)) return 0;
        for (int i = 0; i < len; i++)
          if (num_at(c, i, &x) < 0) return 0;
        if (num_at(c, 1, &x) == 0 && x >= GW_DEMAND_CLASSES) return 0;
      }
    }
  }
  const cJSON *s;
  cJSON_ArrayForEach(s, ss) {
    const cJSON *id = cJSON_GetArrayItem(s, 0);
    double x;
    if (cJSON_GetArraySize(s) != 4 || !cJSON_IsString(id) || !id->valuestring[0] ||
        strlen(id->valuestring) >= GW_DEMAND_ID_MAX)
      return 0;
    for (int i = 1; i < 4; i++)
      if (num_at(s, i, &x) < 0) return 0;
  }
  return 1;
}

int gw_demand_from_json(gw_demand *d, const cJSON *o, int64_t now) {
  if (!cJSON_IsObject(o) || !valid(o)) return -EINVAL;
  double since = cJSON_GetObjectItemCaseSensitive(o, "since_ms")->valuedouble;
  if (since > 0 && since < (double)d->since_ms) d->since_ms = (int64_t)since;
  const cJSON *m;
  cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(o, "models")) {
    int rc = 0;
    dmodel *dm = get(d, cJSON_GetObjectItemCaseSensitive(m, "name")->valuestring, &rc);
    if (!dm) return rc;
    for (int k = 0; k < 2; k++) {
      const cJSON *c;
      cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(m, k ? "hour" : "fine")) {
        double v[9] = {0};
        for (int i = 0; i < 9; i++) (void)num_at(c, i, &v[i]); /* 6: version 1, no slot times */
        int64_t idx = (int64_t)v[0];
        cell *b = k ? bucket(dm->hour, dm->hour_at, GW_DEMAND_HOURS, idx)
                    : bucket(dm->fine, dm->fine_at, GW_DEMAND_FINE, idx);
        if (b) {
          add(&b[(int)v[1]], v[2], v[3], v[4], v[5]);
          add_svc(&b[(int)v[1]], v[6], v[7], v[8]);
        }
      }
    }
  }
  const cJSON *s;
  cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(o, "stays")) {
    double j = 0, a = 0, l = 0;
    (void)num_at(s, 1, &j);
    (void)num_at(s, 2, &a);
    (void)num_at(s, 3, &l);
    const char *id = cJSON_GetArrayItem(s, 0)->valuestring;
    if (!l && pr_idmap_get_str(&d->open, id)) continue; /* joined again already */
    if (strlen(id) >= sizeof(d->stays[0].id)) continue; /* not one this gateway wrote */
    stay *st = stay_new(d, id);
    if (!st) return -ENOMEM;
    st->join_ms = (int64_t)j;
    st->answer_ms = (int64_t)a;
    st->leave_ms = (int64_t)l;
    st->no_startup = 1; /* a start-up across a restart is not measured */
    if (st->leave_ms) (void)pr_idmap_del_str(&d->open, st->id);
  }
  (void)now;
  return 0;
}
