/* One prediction; see predict.h. */
#include "predict.h"

#include <stdint.h>

int gw_predict_fits(const gw_replica *r, const gw_sched_req *q) {
  if (!gw_replica_serves(r, q->model)) return 0;
  if ((q->needs || q->choices > 1) && !gw_replica_serves_features(r, q->needs, q->choices)) return 0;
  if (r->n_ctx > 0 && q->prompt_tokens + q->max_tokens > r->n_ctx) return 0;
  return 1;
}

double gw_predict_slowdown(const gw_replica *r, uint64_t now) {
  return gw_replica_slowdown(r, now) * gw_replica_device_slowdown(r);
}

double gw_predict_service_s(const gw_replica *r, const gw_sched_req *q, double slowdown,
                            double *prefill_s, int64_t *cached) {
  gw_pquery pq = {.blocks = q->blocks, .n_blocks = q->n_blocks, .prompt_tokens = q->prompt_tokens,
                  .user_at = q->user_at, .user_fp = q->user_fp, .full_fp = q->full_fp,
                  .model = q->model};
  int64_t c = gw_pcache_cached_tokens_pq(&r->pc, q->cache_scope, &pq, q->model);
  return gw_predict_service_cached_s(r, q, slowdown, c, prefill_s, cached);
}

double gw_predict_service_cached_s(const gw_replica *r, const gw_sched_req *q, double slowdown,
                                   int64_t c, double *prefill_s, int64_t *cached) {
  return gw_predict_service_rates_s(r->prefill_tps, r->decode_tps, q, slowdown, c, prefill_s, cached);
}

double gw_predict_service_rates_s(double prefill_tps, double decode_tps, const gw_sched_req *q,
                                  double slowdown, int64_t c, double *prefill_s, int64_t *cached) {
  if (c >= q->prompt_tokens) c = q->prompt_tokens - 1;
  if (c < 0) c = 0;
  double pre = (double)(q->prompt_tokens - c) / prefill_tps * slowdown;
  double out = q->expected_out;
  if (out > (double)q->max_tokens) out = (double)q->max_tokens;
  double dec = out / decode_tps * slowdown;
  if (prefill_s) *prefill_s = pre;
  if (cached) *cached = c;
  return pre + dec;
}

gw_prediction gw_predict(const gw_replica *r, const gw_sched_req *q, uint64_t now) {
  gw_prediction p = {0};
  p.fits = gw_predict_fits(r, q);
  p.capacity = gw_replica_capacity(r, now);
  p.slowdown = gw_predict_slowdown(r, now);
  p.service_s = gw_predict_service_s(r, q, p.slowdown, &p.prefill_s, &p.cached);
  uint64_t w = gw_replica_wait_ms(r, now);
  p.wait_s = w == UINT64_MAX ? -1 : (double)w / 1000.0;
  p.finish_s = p.wait_s < 0 ? -1 : p.wait_s + p.service_s;
  return p;
}

double gw_predict_remaining_s(const gw_progress *p, int64_t max_tokens, double expected_out,
                              double planned_prefill_tps, double planned_decode_tps) {
  double pre = (double)(p->prompt_tokens - p->prompt_done) / p->prefill_tps;
  if (pre < 0) pre = 0;
  double dec = p->decode_tps;
  if (!(dec > 0)) dec = planned_decode_tps * (p->prefill_tps / planned_prefill_tps); /* as slowed */
  double left = (double)max_tokens - (double)p->decoded;
  double out = expected_out - (double)p->decoded;
  if (out > left) out = left;
  if (out < 1) out = 1;
  return pre + (dec > 0 ? out / dec : 0);
}
