/* What a phone's readings do to its work; see device.h. */
#include "device.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void add_why(gw_device_verdict *out, const char *text) {
  size_t n = strlen(out->why);
  snprintf(out->why + n, sizeof(out->why) - n, "%s%s", n ? "; " : "", text);
}

void gw_device_judge(const gw_device_conf *c, double battery_pct, int charging, double temp_c,
                     double clock_ratio, int was_hot, gw_device_verdict *out) {
  memset(out, 0, sizeof(*out));
  out->cap = -1;
  out->slowdown = 1.0;
  char text[160];
  /* battery: only a phone that says it is not charging is spared */
  if (battery_pct >= 0 && charging == 0) {
    if (battery_pct < c->battery_floor_pct) {
      out->cap = 0;
      snprintf(text, sizeof(text), "battery %.0f %% and not charging: under the floor of %.0f %%, "
               "takes no new work", battery_pct, c->battery_floor_pct);
      add_why(out, text);
    } else if (battery_pct < c->battery_low_pct) {
      out->cap = 1;
      snprintf(text, sizeof(text), "battery %.0f %% and not charging: under %.0f %%, one request "
               "at a time", battery_pct, c->battery_low_pct);
      add_why(out, text);
    }
  }
  /* heat: a temperature over hot_c (cool again a little below it, so a phone at the
   * threshold does not flap), or a CPU clock capped by the phone's own throttling */
  int warm = 0, capped = 0;
  if (temp_c >= 0 && c->hot_c > 0)
    warm = temp_c > (was_hot ? c->hot_c - GW_DEVICE_COOL_C : c->hot_c);
  if (clock_ratio >= 0 && clock_ratio < c->clock_cap_ratio) capped = 1;
  if (!warm && !capped) return;
  out->hot = 1;
  double slow = warm ? c->hot_slowdown : 1.0;
  if (capped) {
    double by_clock = 1.0 / (clock_ratio > 0.05 ? clock_ratio : 0.05);
    if (by_clock > slow) slow = by_clock;
  }
  if (!(slow >= 1.0)) slow = 1.0;
  if (slow > GW_DEVICE_SLOWDOWN_MAX) slow = GW_DEVICE_SLOWDOWN_MAX;
  out->slowdown = slow;
  char heat[96] = "";
  if (warm) snprintf(heat, sizeof(heat), "%.1f °C, over %.0f °C", temp_c, c->hot_c);
  if (capped) {
    size_t n = strlen(heat);
    snprintf(heat + n, sizeof(heat) - n, "%sCPU clock capped to %.0f %% of its top", n ? ", " : "",
             clock_ratio * 100);
  }
  snprintf(text, sizeof(text), "%s: planned %.2g× slower until answers say otherwise", heat, slow);
  add_why(out, text);
}

double gw_device_slowdown_now(double slowdown, unsigned answers, int hot_answers) {
  if (!(slowdown > 1.0)) return 1.0;
  if (hot_answers <= 0) return slowdown;
  if (answers >= (unsigned)hot_answers) return 1.0;
  return pow(slowdown, 1.0 - (double)answers / hot_answers);
}
