/* Bounds on what phones claim about their answers; see bounds.h. Pure: no I/O, no
 * state, so tests/unit/test_bounds.c checks every rule directly. */
#include "bounds.h"

#include <math.h>

double gw_bound_rate(double tps) {
  if (!isfinite(tps) || tps <= 0) return 0;
  if (tps < GW_RATE_MIN) return GW_RATE_MIN;
  if (tps > GW_RATE_MAX) return GW_RATE_MAX;
  return tps;
}

int64_t gw_bound_count(double v) {
  if (!isfinite(v) || v < 0) return -1;
  if (v > 1e12) return INT64_C(1000000000000);
  return (int64_t)v;
}

static int ok_num(double v) { return isfinite(v) && v >= 0; }

double gw_own_evaluated(double own_total, double own_cap, double phone_total, double phone_eval) {
  if (!isfinite(own_cap) || own_cap < 0) own_cap = 0;
  if (!isfinite(phone_total) || !isfinite(phone_eval) || phone_total <= 0 || phone_eval <= 0 ||
      !isfinite(own_total) || own_total <= 0)
    return own_cap;
  double share = phone_eval < phone_total ? phone_eval / phone_total : 1;
  double own = own_total * share;
  return own < own_cap ? own : own_cap;
}

/* The time the claimed pace of one part predicts for the gateway's own count of its
 * tokens (own <= 0: the phone's count). */
static double own_ms(double n, double ms, double own) { return (own > 0 ? own : n) * ms / n; }

/* Stretch a part's time so that its pace predicts at least floor_ms for own tokens. */
static int floor_part(double n, double *ms, double own, double floor_ms) {
  if (n <= 0 || floor_ms <= 0) return 0;
  double have = own_ms(n, *ms, own);
  if (have >= floor_ms) return 0;
  *ms = floor_ms * n / (own > 0 ? own : n);
  return 1;
}

/* Whether a claimed time is far from what the gateway's clock saw. */
static int disagrees(double have, double wall, double factor) {
  if (wall <= 0) return 0;
  if (fabs(have - wall) <= GW_TRUST_SLACK_MS) return 0;
  return have < wall / factor || have > wall * factor;
}

/* Set a part's time so that its pace predicts exactly wall_ms for own tokens. */
static void take_wall(double n, double *ms, double own, double wall_ms) {
  *ms = wall_ms * n / (own > 0 ? own : n);
}

int gw_bound_timings(gw_timings *t, double own_prompt_n, double own_pred_n, double max_prompt_n,
                     double max_pred_n, double prefill_wall_ms, double decode_wall_ms,
                     double total_wall_ms) {
  return gw_verify_timings(t, own_prompt_n, own_pred_n, max_prompt_n, max_pred_n, prefill_wall_ms,
                           decode_wall_ms, total_wall_ms, 0, NULL);
}

int gw_verify_timings(gw_timings *t, double own_prompt_n, double own_pred_n, double max_prompt_n,
                      double max_pred_n, double prefill_wall_ms, double decode_wall_ms,
                      double total_wall_ms, double trust_factor, int *disagreed) {
  int changed = 0;
  if (disagreed) *disagreed = 0;
  if (!ok_num(t->prompt_n) || !ok_num(t->prompt_ms)) {
    changed |= t->prompt_n != 0 || t->prompt_ms != 0;
    t->prompt_n = t->prompt_ms = 0;
  }
  if (!ok_num(t->pred_n) || !ok_num(t->pred_ms)) {
    changed |= t->pred_n != 0 || t->pred_ms != 0;
    t->pred_n = t->pred_ms = 0;
  }
  if (max_prompt_n > 0 && t->prompt_n > max_prompt_n) {
    t->prompt_n = max_prompt_n;
    changed = 1;
  }
  if (max_pred_n > 0 && t->pred_n > max_pred_n) {
    t->pred_n = max_pred_n;
    changed = 1;
  }
  if (trust_factor >= 1) {
    /* trust but verify: a part far from the gateway's own clock is learned from the clock */
    int off = 0;
    if (t->prompt_n > 0 && disagrees(own_ms(t->prompt_n, t->prompt_ms, own_prompt_n), prefill_wall_ms, trust_factor)) {
      take_wall(t->prompt_n, &t->prompt_ms, own_prompt_n, prefill_wall_ms);
      off = 1;
    }
    if (t->pred_n > 0 && disagrees(own_ms(t->pred_n, t->pred_ms, own_pred_n), decode_wall_ms, trust_factor)) {
      take_wall(t->pred_n, &t->pred_ms, own_pred_n, decode_wall_ms);
      off = 1;
    }
    if (total_wall_ms > 0 && (t->prompt_n > 0 || t->pred_n > 0)) {
      double pre = t->prompt_n > 0 ? own_ms(t->prompt_n, t->prompt_ms, own_prompt_n) : 0;
      double dec = t->pred_n > 0 ? own_ms(t->pred_n, t->pred_ms, own_pred_n) : 0;
      if (disagrees(pre + dec, total_wall_ms, trust_factor)) {
        if (pre + dec <= 0) {
          int parts = (t->prompt_n > 0) + (t->pred_n > 0);
          if (t->prompt_n > 0) take_wall(t->prompt_n, &t->prompt_ms, own_prompt_n, total_wall_ms / parts);
          if (t->pred_n > 0) take_wall(t->pred_n, &t->pred_ms, own_pred_n, total_wall_ms / parts);
        } else {
          double k = total_wall_ms / (pre + dec);
          t->prompt_ms *= k;
          t->pred_ms *= k;
        }
        off = 1;
      }
    }
    if (off && disagreed) *disagreed = 1;
    changed |= off;
  }
  const double f = GW_RATE_WALL_FACTOR;
  changed |= floor_part(t->prompt_n, &t->prompt_ms, own_prompt_n, prefill_wall_ms / f);
  changed |= floor_part(t->pred_n, &t->pred_ms, own_pred_n, decode_wall_ms / f);
  if (total_wall_ms > 0 && (t->prompt_n > 0 || t->pred_n > 0)) {
    double floor_ms = total_wall_ms / f;
    double pre = t->prompt_n > 0 ? own_ms(t->prompt_n, t->prompt_ms, own_prompt_n) : 0;
    double dec = t->pred_n > 0 ? own_ms(t->pred_n, t->pred_ms, own_pred_n) : 0;
    double sum = pre + dec;
    if (sum < floor_ms) {
      if (sum <= 0) {
        /* no time claimed at all: the floor is shared by the parts that have tokens */
        int parts = (t->prompt_n > 0) + (t->pred_n > 0);
        floor_part(t->prompt_n, &t->prompt_ms, own_prompt_n, floor_ms / parts);
        floor_part(t->pred_n, &t->pred_ms, own_pred_n, floor_ms / parts);
      } else {
        /* both paces slowed alike: which part lied cannot be told */
        double k = floor_ms / sum;
        t->prompt_ms *= k;
        t->pred_ms *= k;
      }
      changed = 1;
    }
  }
  return changed;
}

int64_t gw_usage_prompt_max(int64_t est_prompt, size_t body_bytes, int tools) {
  if (est_prompt < 1) est_prompt = 1;
  int64_t m = est_prompt * GW_USAGE_PROMPT_FACTOR;
  if (body_bytes > (size_t)m) m = (int64_t)body_bytes;
  return m + GW_USAGE_PROMPT_SLACK + (tools ? GW_USAGE_TOOLS_SLACK : 0);
}

int64_t gw_usage_completion_max(int64_t text_bytes, int64_t chunks, int64_t cap) {
  int64_t m = (text_bytes > 0 ? text_bytes : 0) + (chunks > 0 ? chunks : 0) + GW_USAGE_COMPLETION_SLACK;
  return cap > 0 && m > cap ? cap : m;
}

int gw_usage_clamp(int64_t *prompt, int64_t *completion, int64_t *cached, int64_t prompt_max,
                   int64_t max_completion) {
  int clamped = 0;
  int64_t pmax = prompt_max > 0 ? prompt_max : 1;
  if (*prompt > pmax) {
    *prompt = pmax;
    clamped = 1;
  }
  if (max_completion > 0 && *completion > max_completion) {
    *completion = max_completion;
    clamped = 1;
  }
  int64_t cmax = *prompt > 0 ? *prompt : pmax;
  if (*cached > cmax) {
    *cached = cmax;
    clamped = 1;
  }
  return clamped;
}

size_t gw_answer_cap(int64_t max_tokens, size_t bytes_per_token, int logprobs, size_t hard_max) {
  if (max_tokens < 0) max_tokens = 0;
  double per = (double)bytes_per_token * (logprobs ? GW_ANSWER_LOGPROBS_FACTOR : 1);
  double cap = (double)GW_ANSWER_SLACK + (double)max_tokens * per;
  return cap >= (double)hard_max ? hard_max : (size_t)cap;
}

size_t gw_text_cap(int64_t max_tokens, size_t hard_max) {
  if (max_tokens < 0) max_tokens = 0;
  double cap = (double)GW_TEXT_SLACK + (double)max_tokens * GW_TEXT_BYTES_PER_TOKEN;
  return cap >= (double)hard_max ? hard_max : (size_t)cap;
}

int gw_trust_cap(uint64_t n_ok, int trust_after, int others_slots) {
  if (trust_after <= 0 || n_ok >= (uint64_t)trust_after || others_slots <= 0) return 0;
  int earned = 1 + (int)n_ok;
  return earned > others_slots ? earned : others_slots;
}

int64_t gw_trust_group_cap(int trusted_slots, int64_t earned) {
  if (trusted_slots <= 0) return -1;
  return earned > trusted_slots ? earned : trusted_slots;
}

double gw_bound_seed(double tps, double fleet_max) {
  return fleet_max > 0 && tps > fleet_max ? fleet_max : tps;
}
