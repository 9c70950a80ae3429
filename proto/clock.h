/* Wall-clock time for what leaves the process: signed heartbeat timestamps, log lines,
 * times shown to admins, Redis scores other gateways compare. Durations and timers use
 * the loop's monotonic clock (uv_now), never this one: the wall clock may jump. */
#ifndef PR_CLOCK_H
#define PR_CLOCK_H

#include <stdint.h>

/* Milliseconds since the Unix epoch (CLOCK_REALTIME). */
int64_t pr_clock_wall_ms(void);

#endif
