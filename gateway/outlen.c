/* Answer lengths per model and cap bucket; see outlen.h. */
#include "outlen.h"

#include <math.h>

static int bucket(int64_t cap) {
  int b = 0;
  while (cap > 1 && b < GW_OUTLEN_BUCKETS - 1) {
    cap >>= 1;
    b++;
  }
  return b;
}

double gw_outlen_expect(const gw_outlen *t, double all, int64_t cap, double fallback) {
  double c = cap > 0 ? (double)cap : 1;
  int b = bucket(cap);
  double e = t && t->e[b].n ? t->e[b].avg : all > 0 ? all : fallback;
  if (!(e > 0) || !isfinite(e)) e = 1;
  return e < c ? e : c;
}

void gw_outlen_learn(gw_outlen *t, double *all, int64_t cap, double n) {
  if (!isfinite(n) || n < 0) return;
  if (cap > 0 && n > (double)cap) n = (double)cap;
  *all = *all > 0 ? *all * 0.9 + n * 0.1 : n;
  if (!t || cap <= 0) return;
  int b = bucket(cap);
  /* the first answers count more: a bucket's length is known after a few */
  double a = t->e[b].n < 3 ? 0.5 : 0.1;
  t->e[b].avg = t->e[b].n ? t->e[b].avg + a * (n - t->e[b].avg) : n;
  t->e[b].n++;
}
