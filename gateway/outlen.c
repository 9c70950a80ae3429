/* Answer lengths per model and cap bucket; see outlen.h. */
#include "outlen.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int bucket(int64_t cap) {
  int b = 0;
  while (cap > 1 && b < 62) {
    cap >>= 1;
    b++;
  }
  return b;
}

static int find(const gw_outlen *t, const char *model, int b) {
  for (int i = 0; i < GW_OUTLEN_CLASSES; i++)
    if (t->e[i].n && t->e[i].bucket == b && strncmp(t->e[i].model, model, GW_OUTLEN_MODEL - 1) == 0)
      return i;
  return -1;
}

double gw_outlen_expect(const gw_outlen *t, const char *model, int64_t cap, double fallback) {
  double c = cap > 0 ? (double)cap : 1;
  int i = model ? find(t, model, bucket(cap)) : -1;
  double e = i >= 0 ? t->e[i].avg : t->all > 0 ? t->all : fallback;
  if (!(e > 0) || !isfinite(e)) e = 1;
  return e < c ? e : c;
}

void gw_outlen_learn(gw_outlen *t, const char *model, int64_t cap, double n, uint64_t now) {
  if (!isfinite(n) || n < 0) return;
  if (cap > 0 && n > (double)cap) n = (double)cap;
  t->all = t->all > 0 ? t->all * 0.9 + n * 0.1 : n;
  if (!model || cap <= 0) return;
  int b = bucket(cap), i = find(t, model, b);
  if (i < 0) { /* a free entry, else the oldest */
    i = 0;
    for (int k = 0; k < GW_OUTLEN_CLASSES; k++) {
      if (!t->e[k].n) {
        i = k;
        break;
      }
      if (t->e[k].at < t->e[i].at) i = k;
    }
    snprintf(t->e[i].model, sizeof(t->e[i].model), "%s", model);
    t->e[i].bucket = b;
    t->e[i].n = 0;
  }
  /* the first answers count more: a class's length is known after a few */
  double a = t->e[i].n < 3 ? 0.5 : 0.1;
  t->e[i].avg = t->e[i].n ? t->e[i].avg + a * (n - t->e[i].avg) : n;
  t->e[i].n++;
  t->e[i].at = now ? now : 1;
}
