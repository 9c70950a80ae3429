/* The cost ledger's buckets; see ledger.h. A bucket holds one minute (or hour) of loop
 * time, [k * length, (k + 1) * length); the ring keeps the newest ones and clears a slot
 * when time moves into a new minute (hour). Spans are cut at bucket edges, so a request
 * that ran across a minute's end is charged to both minutes by the time it ran in each. */
#include "ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tally {
  double cost, busy, down;
  uint64_t requests, tokens;
} tally;

typedef struct row {
  char name[GW_LEDGER_NAME_MAX];
  tally min[GW_LEDGER_MINUTES];
  tally hour[GW_LEDGER_HOURS];
} row;

typedef struct table {
  row **rows;
  size_t n, max;
} table;

struct gw_ledger {
  uint64_t start_ms;
  uint64_t cur_min, cur_hour; /* the newest bucket of each ring */
  row fleet;
  tally all;                  /* the fleet since the ledger started */
  table tables[2];            /* GW_LEDGER_MODEL, GW_LEDGER_KEY */
};

gw_ledger *gw_ledger_new(uint64_t now_ms) {
  gw_ledger *l = calloc(1, sizeof(*l));
  if (!l) return NULL;
  l->start_ms = now_ms;
  l->cur_min = now_ms / GW_LEDGER_MIN_MS;
  l->cur_hour = now_ms / GW_LEDGER_HOUR_MS;
  l->tables[GW_LEDGER_MODEL].max = GW_LEDGER_MAX_MODELS;
  l->tables[GW_LEDGER_KEY].max = GW_LEDGER_MAX_KEYS;
  return l;
}

void gw_ledger_free(gw_ledger *l) {
  if (!l) return;
  for (int k = 0; k < 2; k++) {
    for (size_t i = 0; i < l->tables[k].n; i++) free(l->tables[k].rows[i]);
    free(l->tables[k].rows);
  }
  free(l);
}

/* ---- the rings ----------------------------------------------------------------------------- */

static void clear_slot(gw_ledger *l, int hourly, size_t slot) {
  if (hourly) memset(&l->fleet.hour[slot], 0, sizeof(tally));
  else memset(&l->fleet.min[slot], 0, sizeof(tally));
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < l->tables[k].n; i++) {
      row *r = l->tables[k].rows[i];
      if (hourly) memset(&r->hour[slot], 0, sizeof(tally));
      else memset(&r->min[slot], 0, sizeof(tally));
    }
}

/* Move both rings forward to time t, clearing the buckets time left behind. */
static void advance(gw_ledger *l, uint64_t t) {
  uint64_t m = t / GW_LEDGER_MIN_MS, h = t / GW_LEDGER_HOUR_MS;
  if (m > l->cur_min) {
    uint64_t from = m - l->cur_min > GW_LEDGER_MINUTES ? m - GW_LEDGER_MINUTES : l->cur_min;
    for (uint64_t k = from + 1; k <= m; k++) clear_slot(l, 0, k % GW_LEDGER_MINUTES);
    l->cur_min = m;
  }
  if (h > l->cur_hour) {
    uint64_t from = h - l->cur_hour > GW_LEDGER_HOURS ? h - GW_LEDGER_HOURS : l->cur_hour;
    for (uint64_t k = from + 1; k <= h; k++) clear_slot(l, 1, k % GW_LEDGER_HOURS);
    l->cur_hour = h;
  }
}

/* The bucket holding time t in a ring, or NULL when t is outside what the ring holds. */
static tally *bucket(gw_ledger *l, row *r, int hourly, uint64_t t) {
  if (hourly) {
    uint64_t h = t / GW_LEDGER_HOUR_MS;
    if (h > l->cur_hour || h + GW_LEDGER_HOURS <= l->cur_hour) return NULL;
    return &r->hour[h % GW_LEDGER_HOURS];
  }
  uint64_t m = t / GW_LEDGER_MIN_MS;
  if (m > l->cur_min || m + GW_LEDGER_MINUTES <= l->cur_min) return NULL;
  return &r->min[m % GW_LEDGER_MINUTES];
}

enum { F_COST, F_BUSY, F_DOWN };

/* Add per_day/86400000 per millisecond of [t0, t1) to field f of row r, bucket by bucket. */
static void spread(gw_ledger *l, row *r, int f, uint64_t t0, uint64_t t1, double per_day) {
  if (!r || t1 <= t0 || !(per_day > 0)) return;
  const double per_ms = per_day / 86400000.0;
  for (int hourly = 0; hourly < 2; hourly++) {
    const uint64_t len = hourly ? GW_LEDGER_HOUR_MS : GW_LEDGER_MIN_MS;
    const uint64_t n = hourly ? GW_LEDGER_HOURS : GW_LEDGER_MINUTES;
    const uint64_t cur = hourly ? l->cur_hour : l->cur_min;
    const uint64_t oldest = cur >= n - 1 ? (cur - (n - 1)) * len : 0; /* what the ring holds */
    for (uint64_t t = t0 > oldest ? t0 : oldest; t < t1;) {
      uint64_t end = (t / len + 1) * len;
      if (end > t1) end = t1;
      tally *b = bucket(l, r, hourly, t);
      if (b) {
        double v = per_ms * (double)(end - t);
        if (f == F_COST) b->cost += v;
        else if (f == F_BUSY) b->busy += v;
        else b->down += v;
      }
      t = end;
    }
  }
  if (r == &l->fleet) {
    double v = per_ms * (double)(t1 - t0);
    if (f == F_COST) l->all.cost += v;
    else if (f == F_BUSY) l->all.busy += v;
    else l->all.down += v;
  }
}

/* The row of name in a table, made on first sight; "_other" once the table is full;
 * NULL without memory. */
static row *row_of(gw_ledger *l, gw_ledger_kind kind, const char *name, int create) {
  table *tb = &l->tables[kind];
  if (!name || !*name) name = kind == GW_LEDGER_KEY ? "anonymous" : "_unknown";
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < tb->n; i++)
      if (strncmp(tb->rows[i]->name, name, GW_LEDGER_NAME_MAX - 1) == 0) return tb->rows[i];
    if (!create) return NULL;
    if (tb->n + 1 < tb->max) break;
    name = "_other"; /* the last entry is kept for it */
    if (pass) break;
  }
  row **nr = realloc(tb->rows, (tb->n + 1) * sizeof(*nr));
  if (!nr) return NULL;
  tb->rows = nr;
  row *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  snprintf(r->name, sizeof(r->name), "%s", name);
  tb->rows[tb->n++] = r;
  return r;
}

/* ---- feeding ------------------------------------------------------------------------------ */

void gw_ledger_fleet(gw_ledger *l, uint64_t t0, uint64_t t1, double per_day, double down_per_day) {
  advance(l, t1);
  spread(l, &l->fleet, F_COST, t0, t1, per_day);
  spread(l, &l->fleet, F_DOWN, t0, t1, down_per_day);
}

void gw_ledger_use(gw_ledger *l, uint64_t t0, uint64_t t1, double slot_per_day, const char *model,
                   const char *key) {
  if (t1 <= t0 || !(slot_per_day > 0)) return;
  advance(l, t1);
  spread(l, &l->fleet, F_BUSY, t0, t1, slot_per_day);
  spread(l, row_of(l, GW_LEDGER_MODEL, model, 1), F_BUSY, t0, t1, slot_per_day);
  spread(l, row_of(l, GW_LEDGER_KEY, key, 1), F_BUSY, t0, t1, slot_per_day);
}

static void count(gw_ledger *l, row *r, uint64_t t, uint64_t tokens) {
  for (int hourly = 0; r && hourly < 2; hourly++) {
    tally *b = bucket(l, r, hourly, t);
    if (!b) continue;
    b->requests++;
    b->tokens += tokens;
  }
}

void gw_ledger_served(gw_ledger *l, uint64_t t, const char *model, const char *key, uint64_t tokens) {
  advance(l, t);
  l->all.requests++;
  l->all.tokens += tokens;
  count(l, &l->fleet, t, tokens);
  count(l, row_of(l, GW_LEDGER_MODEL, model, 1), t, tokens);
  count(l, row_of(l, GW_LEDGER_KEY, key, 1), t, tokens);
}

/* ---- reading ------------------------------------------------------------------------------ */

void gw_ledger_sum_of(gw_ledger *l, uint64_t now, gw_ledger_window w, gw_ledger_kind kind,
                      const char *name, gw_ledger_sum *out) {
  memset(out, 0, sizeof(*out));
  advance(l, now);
  const int hourly = w == GW_LEDGER_DAY;
  const uint64_t len = hourly ? GW_LEDGER_HOUR_MS : GW_LEDGER_MIN_MS;
  const uint64_t n = hourly ? GW_LEDGER_HOURS : GW_LEDGER_MINUTES;
  const uint64_t cur = hourly ? l->cur_hour : l->cur_min;
  uint64_t from = cur >= n - 1 ? (cur - (n - 1)) * len : 0;
  if (from < l->start_ms) from = l->start_ms;
  out->span_s = now > from ? (double)(now - from) / 1000.0 : 0;
  const row *r = name ? row_of(l, kind, name, 0) : &l->fleet;
  if (!r) return;
  for (uint64_t k = 0; k < n && k <= cur; k++) {
    const tally *b = hourly ? &r->hour[(cur - k) % n] : &r->min[(cur - k) % n];
    out->cost += b->cost;
    out->busy += b->busy;
    out->down += b->down;
    out->requests += b->requests;
    out->tokens += b->tokens;
  }
}

void gw_ledger_totals(const gw_ledger *l, uint64_t now, gw_ledger_sum *out) {
  out->cost = l->all.cost;
  out->busy = l->all.busy;
  out->down = l->all.down;
  out->requests = l->all.requests;
  out->tokens = l->all.tokens;
  out->span_s = now > l->start_ms ? (double)(now - l->start_ms) / 1000.0 : 0;
}

size_t gw_ledger_count(const gw_ledger *l, gw_ledger_kind kind) { return l->tables[kind].n; }

const char *gw_ledger_name(const gw_ledger *l, gw_ledger_kind kind, size_t i) {
  return i < l->tables[kind].n ? l->tables[kind].rows[i]->name : NULL;
}
