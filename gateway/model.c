/* The models and their phones; see model.h. */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gw.h"

/* Where name is, or would go, in the sorted list. */
static size_t place(const gw_models *ms, const char *name, int *found) {
  size_t lo = 0, hi = ms->n;
  *found = 0;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(ms->m[mid]->name, name);
    if (c == 0) {
      *found = 1;
      return mid;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

gw_model *gw_models_find(const gw_models *ms, const char *name) {
  int found;
  size_t i = place(ms, name, &found);
  return found ? ms->m[i] : NULL;
}

gw_model *gw_models_get(gw_models *ms, const char *name, uint64_t now) {
  int found;
  size_t i = place(ms, name, &found);
  if (found) {
    ms->m[i]->used_ms = now;
    return ms->m[i];
  }
  if (ms->n == ms->cap) {
    size_t cap = ms->cap ? ms->cap * 2 : 8;
    gw_model **a = realloc(ms->m, cap * sizeof(*a));
    if (!a) return NULL;
    ms->m = a;
    ms->cap = cap;
  }
  gw_model *m = calloc(1, sizeof(*m));
  if (!m || !(m->name = strdup(name))) {
    free(m);
    return NULL;
  }
  m->used_ms = now;
  m->place_exclude = -1;
  memmove(&ms->m[i + 1], &ms->m[i], (ms->n - i) * sizeof(*ms->m));
  ms->m[i] = m;
  ms->n++;
  return m;
}

int gw_models_configure(gw_models *ms, char *const *names, size_t n, uint64_t now) {
  for (size_t i = 0; i < ms->n; i++) ms->m[i]->configured = 0;
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    gw_model *m = gw_models_get(ms, names[i], now);
    if (m) m->configured = 1;
    else rc = -ENOMEM;
  }
  return rc;
}

static long phone_at(const gw_model *m, const gw_replica *r) {
  for (size_t i = 0; i < m->n_phones; i++)
    if (m->phones[i] == r) return (long)i;
  return -1;
}

static void phone_drop(gw_model *m, const gw_replica *r) {
  long i = phone_at(m, r);
  if (i < 0) return;
  memmove(&m->phones[i], &m->phones[i + 1], (m->n_phones - (size_t)i - 1) * sizeof(*m->phones));
  m->n_phones--;
  m->gen++;
}

static int phone_add(gw_model *m, gw_replica *r) {
  if (phone_at(m, r) >= 0) return 0;
  if (m->n_phones == m->cap_phones) {
    size_t cap = m->cap_phones ? m->cap_phones * 2 : 4;
    gw_replica **a = realloc(m->phones, cap * sizeof(*a));
    if (!a) return -ENOMEM;
    m->phones = a;
    m->cap_phones = cap;
  }
  /* registry order: a newcomer goes last, a phone whose models changed to its place */
  size_t k = m->n_phones;
  while (k > 0 && m->phones[k - 1]->ident.reg_seq > r->ident.reg_seq) k--;
  memmove(&m->phones[k + 1], &m->phones[k], (m->n_phones - k) * sizeof(*m->phones));
  m->phones[k] = r;
  m->n_phones++;
  m->gen++;
  return 0;
}

int gw_models_replica_sync(gw_models *ms, gw_replica *r, uint64_t now) {
  for (size_t i = 0; i < ms->n; i++)
    if (!gw_replica_serves(r, ms->m[i]->name)) phone_drop(ms->m[i], r);
  int rc = 0;
  for (size_t k = 0; k < r->n_models; k++) {
    gw_model *m = gw_models_get(ms, r->models[k], now);
    if (!m || phone_add(m, r) < 0) rc = -ENOMEM;
  }
  return rc;
}

void gw_models_replica_gone(gw_models *ms, gw_replica *r) {
  for (size_t i = 0; i < ms->n; i++) phone_drop(ms->m[i], r);
}

void gw_models_replica_changed(gw_models *ms, const gw_replica *r) {
  for (size_t k = 0; k < r->n_models; k++) {
    gw_model *m = gw_models_find(ms, r->models[k]);
    if (m) m->gen++;
  }
}

int gw_model_known(const gw_model *m) { return m && (m->configured || m->n_phones > 0); }

void gw_model_ref(gw_model *m) {
  if (!m) return;
  m->refs++;
  m->arrivals++;
}

void gw_model_unref(gw_model *m) {
  if (m && m->refs) m->refs--;
}

static int idle(const gw_model *m) { return !m->refs && !gw_model_known(m) && !m->queued; }

static void model_free(gw_model *m) {
  free(m->name);
  free(m->phones);
  free(m);
}

void gw_models_trim(gw_models *ms) {
  size_t n_idle = 0;
  for (size_t i = 0; i < ms->n; i++) n_idle += idle(ms->m[i]);
  while (n_idle > GW_MODELS_IDLE) {
    size_t old = ms->n;
    for (size_t i = 0; i < ms->n; i++)
      if (idle(ms->m[i]) && (old == ms->n || ms->m[i]->used_ms < ms->m[old]->used_ms)) old = i;
    model_free(ms->m[old]);
    memmove(&ms->m[old], &ms->m[old + 1], (ms->n - old - 1) * sizeof(*ms->m));
    ms->n--;
    n_idle--;
  }
}

void gw_models_free(gw_models *ms) {
  for (size_t i = 0; i < ms->n; i++) model_free(ms->m[i]);
  free(ms->m);
  memset(ms, 0, sizeof(*ms));
}

double gw_model_expect_out(const gw_models *ms, const gw_model *m, int64_t cap, double fallback) {
  return gw_outlen_expect(m ? &m->lengths : NULL, ms->all_lengths, cap, fallback);
}

void gw_model_learn_out(gw_models *ms, gw_model *m, int64_t cap, double n, uint64_t now) {
  if (m) m->used_ms = now;
  gw_outlen_learn(m ? &m->lengths : NULL, &ms->all_lengths, cap, n);
}

void gw_models_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  switch (ev->kind) {
    case GW_FLEET_ADDED:
    case GW_FLEET_MODELS:
      (void)gw_models_replica_sync(&gw->models, ev->r, ev->now_ms);
      gw_models_trim(&gw->models);
      break;
    case GW_FLEET_REMOVED:
      gw_models_replica_gone(&gw->models, ev->r);
      gw_models_trim(&gw->models);
      break;
    case GW_FLEET_STATE:
    case GW_FLEET_DRAIN:
      gw_models_replica_changed(&gw->models, ev->r);
      break;
    case GW_FLEET_RATES:
    case GW_FLEET_PROGRESS:
    case GW_FLEET_SENT:
      break;
  }
}

/* ---- work that came: short work's kept slots, the queue as a whole ---- */

static double decay(const gw_load *l, uint64_t now, double tau_s) {
  if (!(tau_s > 0) || now <= l->upd_ms) return 1;
  return exp(-(double)(now - l->upd_ms) / 1000.0 / tau_s);
}

void gw_load_note(gw_load *l, double service_s, double tau_s, uint64_t now) {
  if (!(service_s >= 0)) return;
  double d = decay(l, now, tau_s);
  l->work_s = l->work_s * d + service_s;
  l->n = l->n * d + 1;
  if (!l->first_ms) l->first_ms = now ? now : 1;
  if (now > l->upd_ms) l->upd_ms = now;
}

int gw_load_read(const gw_load *l, uint64_t now, double tau_s, double min_s, double *erlangs,
                 double *mean_s) {
  *erlangs = *mean_s = 0;
  if (!(tau_s > 0) || !l->first_ms || !(l->n > 0)) return -1;
  /* the decayed sum of a steady rate is rate x tau x (1 - exp(-t / tau)) after t; read over
   * at least min_s, so that the first requests alone are not taken for a steady load */
  double t = now > l->first_ms ? (double)(now - l->first_ms) / 1000.0 : 0;
  if (t < min_s) t = min_s;
  double window = tau_s * (1 - exp(-t / tau_s));
  if (!(window > 0)) return -1;
  *erlangs = l->work_s * decay(l, now, tau_s) / window;
  *mean_s = l->work_s / l->n;
  return 0;
}

double gw_model_short_rate(const gw_model *m, uint64_t now, double tau_s) {
  double a, svc;
  if (gw_load_read(&m->short_load, now, tau_s, 0, &a, &svc) < 0 || !(svc > 0) || !(a > 0)) return 0;
  return a / svc;
}

void gw_model_short_note(gw_model *m, double service_s, double tau_s, uint64_t now) {
  gw_load_note(&m->short_load, service_s, tau_s, now);
}

int gw_short_slots_for(double a, double svc_s, double wait_s, double p, int max) {
  if (max <= 1) return max < 0 ? 0 : max;
  if (!(p > 0) || !(svc_s > 0) || !(a >= 0)) return max;
  double b = 1; /* Erlang B with k servers, k = 1, 2, ... */
  for (int k = 1; k < max; k++) {
    b = a * b / (k + a * b);
    if (a >= k) continue; /* overloaded with k: every request waits */
    double c = k * b / (k - a * (1 - b));
    if (c * exp(-(k - a) * (wait_s > 0 ? wait_s : 0) / svc_s) <= p) return k;
  }
  return max;
}

int gw_model_short_slots(const gw_model *m, uint64_t now, double tau_s, double wait_s, double p, int max) {
  if (max <= 0) return 0;
  double a, svc;
  if (!(p > 0) || gw_load_read(&m->short_load, now, tau_s, 0, &a, &svc) < 0) return max;
  return gw_short_slots_for(a, svc, wait_s, p, max);
}
