/* The hedge decision and its budget; see hedge.h. */
#include "hedge.h"

#include <math.h>

double gw_hedge_overdue_s(double expected_first_s, int64_t prompt_tokens, double factor, double min_s) {
  if (!(expected_first_s >= 0) || !isfinite(expected_first_s)) expected_first_s = 0;
  if (!(factor >= 1) || !isfinite(factor)) factor = 1;
  if (!(min_s >= 0) || !isfinite(min_s)) min_s = 0;
  double margin = expected_first_s * (factor - 1) + min_s;
  if (prompt_tokens <= GW_HEDGE_SHORT_TOKENS) margin /= 2; /* cheap to read twice */
  return expected_first_s + margin;
}

double gw_hedge_remaining_s(double elapsed_s, double expected_total_s) {
  double left = expected_total_s - elapsed_s, overrun = elapsed_s / 4;
  if (!isfinite(left)) left = 0;
  return left > overrun ? left : overrun;
}

gw_hedge_verdict gw_hedge_decide(const gw_hedge_in *in) {
  if (!in->suspect && !(in->elapsed_s >= gw_hedge_overdue_s(in->expected_first_s, in->prompt_tokens,
                                                            in->factor, in->min_s)))
    return GW_HEDGE_NO_NOT_OVERDUE;
  if (!(in->alt_finish_s >= 0) || !isfinite(in->alt_finish_s)) return GW_HEDGE_NO_PHONE;
  /* a phone that stopped answering its health checks is not expected to finish at all */
  if (!in->suspect && !(in->alt_finish_s < gw_hedge_remaining_s(in->elapsed_s, in->expected_total_s)))
    return GW_HEDGE_NO_GAIN;
  double cost = in->alt_service_s >= 0 && isfinite(in->alt_service_s) ? in->alt_service_s : 0;
  /* off a phone that stopped answering, a few hedges may run beyond the budget, which a
   * gateway that just started (or after a quiet spell) has hardly any of: the phone is not
   * expected to answer, so the request would otherwise wait for it to be marked down */
  if (!(cost <= in->budget_left_s) && !(in->suspect && in->running < in->min_running))
    return GW_HEDGE_NO_BUDGET;
  return GW_HEDGE_YES;
}

static int slot_of(uint64_t b) { return (int)(b % GW_HEDGE_BUCKETS); }

void gw_hedge_note(gw_hedge_ledger *l, uint64_t now_ms, double slot_s, int hedge) {
  if (!(slot_s > 0) || !isfinite(slot_s)) return;
  uint64_t b = now_ms / GW_HEDGE_BUCKET_MS;
  int i = slot_of(b);
  if (l->bucket[i] != b || (l->work_s[i] == 0 && l->hedge_s[i] == 0)) {
    l->bucket[i] = b; /* an old bucket's slot is reused */
    l->work_s[i] = l->hedge_s[i] = 0;
  }
  l->work_s[i] += slot_s;
  if (hedge) l->hedge_s[i] += slot_s;
}

double gw_hedge_budget_left(const gw_hedge_ledger *l, uint64_t now_ms, double share, double running_s,
                            double running_hedge_s) {
  if (!(share > 0) || !isfinite(share)) return 0;
  uint64_t b = now_ms / GW_HEDGE_BUCKET_MS;
  double work = running_s > 0 ? running_s : 0, hedge = running_hedge_s > 0 ? running_hedge_s : 0;
  for (int i = 0; i < GW_HEDGE_BUCKETS; i++) {
    if (l->bucket[i] > b || b - l->bucket[i] >= GW_HEDGE_BUCKETS) continue; /* out of the window */
    work += l->work_s[i];
    hedge += l->hedge_s[i];
  }
  double left = share * work - hedge;
  return left > 0 ? left : 0;
}
