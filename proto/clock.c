/* Wall-clock time; see clock.h. */
#include "clock.h"

#include <time.h>

int64_t pr_clock_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
