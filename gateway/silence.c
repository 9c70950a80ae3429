/* The silence watchdog's limit for a started stream; see silence.h. */
#include "silence.h"

#include <math.h>

static double finite_or(double v, double dflt) { return isfinite(v) ? v : dflt; }

double gw_silence_cover_s(double uncached_tokens, double prefill_tps, double slowdown) {
  if (!(uncached_tokens > 0) || !(prefill_tps > 0) || !isfinite(prefill_tps)) return 0;
  if (uncached_tokens > GW_SILENCE_BATCH_TOKENS) uncached_tokens = GW_SILENCE_BATCH_TOKENS;
  if (!(slowdown >= 1) || !isfinite(slowdown)) slowdown = 1;
  return uncached_tokens / prefill_tps * slowdown;
}

double gw_silence_limit_s(const gw_silence_in *in) {
  double max = finite_or(in->idle_max_s, 0);
  if (!(in->factor > 0) || !isfinite(in->factor)) return max;
  double gap = 0;
  if (in->decode_tps > 0 && isfinite(in->decode_tps)) {
    double slow = in->slowdown >= 1 && isfinite(in->slowdown) ? in->slowdown : 1;
    gap = slow / in->decode_tps;
  }
  double seen = finite_or(in->seen_gap_s, 0);
  if (seen > gap) gap = seen;
  double limit = in->factor * gap;
  double floor_s = finite_or(in->floor_s, 0);
  if (limit < floor_s) limit = floor_s;
  double cover = isnan(in->cover_s) ? 0 : in->cover_s; /* infinite: as long as allowed */
  if (cover > 0) limit += cover;
  if (!isfinite(limit) || limit > max) limit = max;
  return limit;
}
