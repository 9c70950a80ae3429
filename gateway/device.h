/* Device-aware routing: what a phone's own readings (battery, charging, temperature, CPU
 * clock cap, from its heartbeats) do to the work it is given. A phone low on battery and
 * not charging takes one request at a time, one below the floor takes none (a soft drain
 * that lifts by itself), a hot or clock-capped phone is planned slower until answers
 * measured while hot say how slow it is. Pure: no I/O, no clock; unknown readings have no
 * effect. */
#ifndef GW_DEVICE_H
#define GW_DEVICE_H

#include <stddef.h>

/* scheduler.device in the config */
typedef struct gw_device_conf {
  double battery_low_pct;   /* under this, not charging: one slot (0: never) */
  double battery_floor_pct; /* under this, not charging: no new work (0: never) */
  double hot_c;             /* over this: hot (cool again GW_DEVICE_COOL_C below it) */
  double clock_cap_ratio;   /* a CPU clock capped under this share of its top: hot */
  double hot_slowdown;      /* a phone hot by temperature is planned this much slower */
  int hot_answers;          /* answers measured while hot over which the slowdown fades */
} gw_device_conf;

#define GW_DEVICE_COOL_C 2.0 /* hysteresis: a hot phone is cool again this far below hot_c */
#define GW_DEVICE_SLOWDOWN_MAX 20.0

/* What the readings mean for routing. */
typedef struct gw_device_verdict {
  int cap;          /* most requests at once: -1 no limit, 0 no new work, 1 one */
  int hot;          /* over hot_c, or the clock capped under clock_cap_ratio */
  double slowdown;  /* >= 1: how much slower to plan it while hot, in full */
  char why[192];    /* why it is held back, for people; "" when it is not */
} gw_device_verdict;

/* Judge the readings (each < 0: unknown; charging -1 unknown, 0 no, 1 yes). was_hot is
 * the last verdict's `hot` (the temperature's hysteresis). */
void gw_device_judge(const gw_device_conf *c, double battery_pct, int charging, double temp_c,
                     double clock_ratio, int was_hot, gw_device_verdict *out);

/* The slowdown to plan with after `answers` answers measured while hot: the full one at
 * first, fading to 1 over hot_answers answers, by which time the learned rates carry it
 * (so the two do not count the heat twice). */
double gw_device_slowdown_now(double slowdown, unsigned answers, int hot_answers);

#endif
