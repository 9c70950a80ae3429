/* Placement's decision; see place.h. */
#include "place.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLACE_INF 1e12

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The fleet's median measured rate on model m (which 0 prefill, 1 decode); 0: none. */
static double median_rate(const gw_place_phone *ps, size_t np, int m, int which) {
  double small[64], *v = np <= 64 ? small : malloc(np * sizeof(double));
  if (!v) return 0;
  size_t n = 0;
  for (size_t i = 0; i < np; i++) {
    double x = which ? ps[i].decode[m] : ps[i].prefill[m];
    if (x > 0) v[n++] = x;
  }
  double med = 0;
  if (n) {
    qsort(v, n, sizeof(double), cmp_double);
    med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  if (v != small) free(v);
  return med;
}

/* The median over phones measured on both models of their rate on m over their rate on
 * a (which 0 prefill, 1 decode); 0: no phone ran both. */
static double pair_ratio(const gw_place_phone *ps, size_t np, int m, int a, int which) {
  double small[64], *v = np <= 64 ? small : malloc(np * sizeof(double));
  if (!v) return 0;
  size_t n = 0;
  for (size_t i = 0; i < np; i++) {
    double x = which ? ps[i].decode[m] : ps[i].prefill[m];
    double y = which ? ps[i].decode[a] : ps[i].prefill[a];
    if (x > 0 && y > 0) v[n++] = x / y;
  }
  double med = 0;
  if (n) {
    qsort(v, n, sizeof(double), cmp_double);
    med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  if (v != small) free(v);
  return med;
}

void gw_place_rates(const gw_place_model *ms, size_t nm, const gw_place_phone *ps, size_t np,
                    size_t p, int m, double *prefill, double *decode) {
  const gw_place_phone *ph = &ps[p];
  double out[2] = {ph->prefill[m], ph->decode[m]};
  for (int w = 0; w < 2; w++) {
    if (out[w] > 0) continue;
    double med_m = median_rate(ps, np, m, w);
    /* its own rate on another model, scaled by the fleet's ratio (or the files' sizes) */
    double best = 0;
    for (size_t a = 0; a < nm && best <= 0; a++) {
      double own = w ? ph->decode[a] : ph->prefill[a];
      if ((int)a == m || own <= 0) continue;
      double ratio = pair_ratio(ps, np, m, (int)a, w);
      double med_a = median_rate(ps, np, (int)a, w);
      if (ratio > 0) best = own * ratio;
      else if (med_m > 0 && med_a > 0) best = own * med_m / med_a;
      else if (ms[m].size_mb > 0 && ms[a].size_mb > 0) best = own * ms[a].size_mb / ms[m].size_mb;
    }
    if (best <= 0) best = med_m;
    if (best <= 0) best = w ? 5 : 50;
    out[w] = best;
  }
  *prefill = out[0];
  *decode = out[1];
}

double gw_place_capacity(const gw_place_model *ms, size_t nm, const gw_place_phone *ps,
                         size_t np, size_t p, int m) {
  double pre, dec;
  gw_place_rates(ms, nm, ps, np, p, m, &pre, &dec);
  double in = ms[m].prompt_tokens > 0 ? ms[m].prompt_tokens : GW_PLACE_PROMPT;
  double outn = ms[m].out_tokens > 0 ? ms[m].out_tokens : GW_PLACE_OUT;
  double svc = in / pre + outn / dec;
  int slots = ps[p].slots > 0 ? ps[p].slots : 1;
  return svc > 0 ? slots / svc : 0;
}

static double switch_s(const gw_place_params *pp, const gw_place_model *m, const gw_place_phone *ph,
                       int to) {
  if (m->size_mb <= 0) return 0;
  double s = m->size_mb / pp->load_mb_s;
  if (!ph->holds || !ph->holds[to]) s += m->size_mb / pp->fetch_mb_s;
  return s;
}

static double load_of(double demand, double capacity, double horizon) {
  if (demand <= 0) return 0;
  if (capacity <= 0) return PLACE_INF;
  return demand / (capacity * horizon);
}

/* A swap: the last steady phone p of model lo (it has demand) may leave for the busy model
 * hi when a phone q serving hi takes its place: q steady on hi, movable, not pinned, past
 * its minimum stay, allowed on lo, its switch paying off, hi keeping a steady phone and
 * losing at most half of its phones. The partner is the one that does least on hi (the
 * busy model loses least); np: none. *qs: its switch's seconds. */
static size_t swap_partner(const gw_place_params *pp, const gw_place_model *ms, size_t nm,
                           const gw_place_phone *ps, size_t np, const double *cpm, const size_t *steady,
                           const size_t *members, const size_t *leaving, int hi, int lo, size_t p,
                           uint64_t now_ms, double *qs) {
  double H = pp->horizon_s > 0 ? pp->horizon_s : 1;
  if (steady[hi] <= 1) return np;
  size_t half = (members[hi] + leaving[hi] + 1) / 2;
  if (leaving[hi] + 1 > (half < 1 ? 1 : half)) return np;
  size_t best = np;
  for (size_t q = 0; q < np; q++) {
    const gw_place_phone *qh = &ps[q];
    if (q == p || qh->want != hi || qh->switching || !qh->movable || qh->pinned >= 0 || !qh->allowed[lo])
      continue;
    if (now_ms < qh->since_ms + (uint64_t)(pp->min_stay_s * 1000)) continue;
    double s = switch_s(pp, &ms[lo], qh, lo);
    if (s >= H || !(cpm[q * nm + (size_t)lo] > 0)) continue;
    /* it must do less on hi than p would */
    if (!(cpm[q * nm + (size_t)hi] < cpm[p * nm + (size_t)hi])) continue;
    if (best == np || cpm[q * nm + (size_t)hi] < cpm[best * nm + (size_t)hi]) {
      best = q;
      *qs = s;
    }
  }
  return best;
}

size_t gw_place_decide(const gw_place_params *pp, gw_place_model *ms, size_t nm,
                       gw_place_phone *ps, size_t np, uint64_t now_ms, gw_place_move *out,
                       size_t cap) {
  if (nm == 0 || np == 0) return 0;
  double H = pp->horizon_s > 0 ? pp->horizon_s : 1;
  double *cpm = calloc(np * nm, sizeof(double)); /* capacity of phone p on model m */
  size_t *leaving = calloc(nm, sizeof(size_t));  /* phones switching away from it now */
  size_t *members = calloc(nm, sizeof(size_t));  /* phones meant for it (want) */
  size_t *steady = calloc(nm, sizeof(size_t));   /* ...not switching */
  size_t n_out = 0;
  if (!cpm || !leaving || !members || !steady) goto done;
  for (size_t p = 0; p < np; p++)
    for (size_t m = 0; m < nm; m++) cpm[p * nm + m] = gw_place_capacity(ms, nm, ps, np, p, (int)m);
  size_t switching = 0;
  for (size_t m = 0; m < nm; m++) ms[m].capacity = 0;
  for (size_t p = 0; p < np; p++) {
    gw_place_phone *ph = &ps[p];
    if (ph->want < 0) ph->want = ph->cur;
    if (ph->want < 0) continue;
    double f = 1;
    if (ph->switching) {
      switching++;
      if (ph->cur >= 0 && ph->cur != ph->want) leaving[ph->cur]++;
      double s = switch_s(pp, &ms[ph->want], ph, ph->want);
      f = s >= H ? 0 : (H - s) / H;
    } else {
      steady[ph->want]++;
    }
    members[ph->want]++;
    ms[ph->want].capacity += f * cpm[p * nm + (size_t)ph->want];
  }
  for (size_t m = 0; m < nm; m++) ms[m].load = load_of(ms[m].demand, ms[m].capacity, H);
  size_t budget = pp->max_switching > switching ? pp->max_switching - switching : 0;

  /* an operator's pin first: at once, whatever it costs */
  for (size_t p = 0; p < np && n_out < cap; p++) {
    gw_place_phone *ph = &ps[p];
    if (!ph->movable || ph->pinned < 0 || ph->want == ph->pinned || ph->switching) continue;
    int from = ph->want, to = ph->pinned;
    gw_place_move *mv = &out[n_out++];
    mv->phone = p;
    mv->from = from;
    mv->to = to;
    mv->switch_s = switch_s(pp, &ms[to], ph, to);
    snprintf(mv->reason, sizeof(mv->reason), "pinned to %s by an operator", ms[to].name);
    if (from >= 0) {
      members[from]--;
      steady[from]--;
      ms[from].capacity -= cpm[p * nm + (size_t)from];
      ms[from].load = load_of(ms[from].demand, ms[from].capacity, H);
    }
    members[to]++;
    ms[to].capacity += cpm[p * nm + (size_t)to] * (mv->switch_s >= H ? 0 : (H - mv->switch_s) / H);
    ms[to].load = load_of(ms[to].demand, ms[to].capacity, H);
    ph->want = to;
    ph->switching = 1;
    if (budget) budget--;
  }

  while (budget > 0 && n_out < cap) {
    /* the best move over every busy model and every phone that may go there */
    double best_after = PLACE_INF * 10, best_cap = 0;
    size_t best_p = np, best_q = np;
    int best_to = -1;
    double best_s = 0, best_qs = 0;
    for (size_t hi = 0; hi < nm; hi++) {
      if (ms[hi].exclude || ms[hi].demand <= 0) continue;
      for (size_t p = 0; p < np; p++) {
        gw_place_phone *ph = &ps[p];
        int lo = ph->want;
        if (!ph->movable || ph->switching || ph->pinned >= 0 || lo == (int)hi || lo < 0) continue;
        if (!ph->allowed[hi]) continue;
        if (now_ms < ph->since_ms + (uint64_t)(pp->min_stay_s * 1000)) continue;
        int lo_idle = ms[lo].demand <= 0 && !ms[lo].keep;
        /* busy enough to ask for a phone, unless the phone does nothing where it is */
        if (ms[hi].load < GW_PLACE_BUSY && !lo_idle) continue;
        /* a model with demand keeps a steady phone (its last one may leave only for a phone
         * of the busy model that does less there: a swap); half of a model's phones leave
         * at most */
        size_t q = np;
        double qs = 0;
        if (!lo_idle && steady[lo] <= 1) {
          if (budget < 2 || n_out + 2 > cap) continue;
          q = swap_partner(pp, ms, nm, ps, np, cpm, steady, members, leaving, (int)hi, lo, p, now_ms, &qs);
          if (q == np) continue;
        }
        size_t half = (members[lo] + leaving[lo] + 1) / 2;
        if (half < 1) half = 1;
        if (leaving[lo] + 1 > half && members[lo] > 0) continue;
        double s = switch_s(pp, &ms[hi], ph, (int)hi);
        if (s >= H) continue; /* it would not pay off within the horizon */
        double c_hi = ms[hi].capacity + cpm[p * nm + hi] * (H - s) / H;
        double c_lo = ms[lo].capacity - cpm[p * nm + (size_t)lo];
        if (q < np) {
          c_hi -= cpm[q * nm + hi];
          c_lo += cpm[q * nm + (size_t)lo] * (H - qs) / H;
        }
        double after_hi = load_of(ms[hi].demand, c_hi, H);
        double after_lo = load_of(ms[lo].demand, c_lo, H);
        double before = fmax(ms[hi].load, ms[lo].load);
        double after = fmax(after_hi, after_lo);
        /* better at the busier end, and the model giving the phone stays clearly less
         * busy than the one taking it was: the move back can never look good */
        if (!(after < before) || !(after_lo * (1 + pp->hysteresis) < ms[hi].load)) continue;
        double pc = cpm[p * nm + hi];
        if (after < best_after - 1e-12 || (fabs(after - best_after) <= 1e-12 && pc > best_cap)) {
          best_after = after;
          best_cap = pc;
          best_p = p;
          best_q = q;
          best_to = (int)hi;
          best_s = s;
          best_qs = qs;
        }
      }
    }
    if (best_p == np) break;
    gw_place_phone *ph = &ps[best_p];
    int lo = ph->want, hi = best_to;
    gw_place_move *mv = &out[n_out++];
    mv->phone = best_p;
    mv->from = lo;
    mv->to = hi;
    mv->switch_s = best_s;
    if (ms[hi].load >= PLACE_INF)
      snprintf(mv->reason, sizeof(mv->reason), "%s has %.0f requests of demand and no phone",
               ms[hi].name, ms[hi].demand);
    else
      snprintf(mv->reason, sizeof(mv->reason),
               "%s is at %.0f %% of its phones' capacity (%s at %.0f %%); the move leaves %.0f %%",
               ms[hi].name, ms[hi].load * 100, ms[lo].name, ms[lo].load * 100, best_after * 100);
    members[lo]--;
    steady[lo]--;
    leaving[lo]++;
    members[hi]++;
    ms[lo].capacity -= cpm[best_p * nm + (size_t)lo];
    ms[hi].capacity += cpm[best_p * nm + (size_t)hi] * (H - best_s) / H;
    ms[lo].load = load_of(ms[lo].demand, ms[lo].capacity, H);
    ms[hi].load = load_of(ms[hi].demand, ms[hi].capacity, H);
    ph->want = hi;
    ph->switching = 1;
    budget--;
    if (best_q < np) {
      /* the swap's other half: a phone of the busy model keeps the other one a phone */
      gw_place_phone *qh = &ps[best_q];
      gw_place_move *mq = &out[n_out++];
      mq->phone = best_q;
      mq->from = hi;
      mq->to = lo;
      mq->switch_s = best_qs;
      snprintf(mq->reason, sizeof(mq->reason),
               "%s keeps a phone while %s goes to %s, where it does more (this one does less there)",
               ms[lo].name, ph->id ? ph->id : "another phone", ms[hi].name);
      snprintf(mv->reason + strlen(mv->reason), sizeof(mv->reason) - strlen(mv->reason),
               "; %s takes its place on %s", qh->id ? qh->id : "another phone", ms[lo].name);
      members[hi]--;
      steady[hi]--;
      leaving[hi]++;
      members[lo]++;
      ms[hi].capacity -= cpm[best_q * nm + (size_t)hi];
      ms[lo].capacity += cpm[best_q * nm + (size_t)lo] * (H - best_qs) / H;
      ms[lo].load = load_of(ms[lo].demand, ms[lo].capacity, H);
      ms[hi].load = load_of(ms[hi].demand, ms[hi].capacity, H);
      qh->want = lo;
      qh->switching = 1;
      budget--;
    }
  }
done:
  free(cpm);
  free(leaving);
  free(members);
  free(steady);
  return n_out;
}
