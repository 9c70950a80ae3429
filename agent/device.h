/* The phone's state as the agent can read it from inside its sandbox (PRoot on Android,
 * or any Linux): battery level and charging, a temperature, free memory and how far the
 * CPU clock is capped, from small files under /sys and /proc. A reading that is missing,
 * unreadable or garbage is unknown, never an error. No libuv; the caller says the time. */
#ifndef AG_DEVICE_H
#define AG_DEVICE_H

#include <stdint.h>

/* Unknown values: a negative battery_pct, mem_free_mb, mem_total_mb or cpu_max_freq_ratio, charging
 * -1, temperature_c at AG_DEVICE_UNKNOWN_TEMP (and temp_source NULL). */
#define AG_DEVICE_UNKNOWN_TEMP (-1000.0)

/* Plain data; temp_source points to a static string. */
typedef struct ag_device {
  double battery_pct;        /* 0 - 100 */
  int charging;              /* 1 (Charging, Full), 0 (Discharging, Not charging), -1 */
  double temperature_c;      /* see temp_source */
  const char *temp_source;   /* "cpu", "battery" (its thermal zone or power_supply temp),
                                "other" (the hottest other zone), NULL unknown */
  double mem_free_mb;        /* MemAvailable (else MemFree) of /proc/meminfo, MiB */
  double mem_total_mb;       /* MemTotal of /proc/meminfo, MiB: what the kernel manages */
  double cpu_max_freq_ratio; /* sum of scaling_max_freq / sum of cpuinfo_max_freq over the
                                CPUs: 1 uncapped, 0.5 the clock capped to half */
} ag_device;

/* All unknown. */
void ag_device_unknown(ag_device *d);

/* Read the device's state below root ("", "/" or NULL: the real /). At most
 * AG_DEVICE_MAX_ENTRIES directory entries per folder and AG_DEVICE_MAX_FILE bytes per
 * file; only regular files are opened (non-blocking), so a read never waits on a FIFO
 * or a device. Never fails. See docs/agent.md for which files and how they are chosen. */
#define AG_DEVICE_MAX_ENTRIES 256
#define AG_DEVICE_MAX_CPUS 64
#define AG_DEVICE_MAX_FILE 8192
void ag_device_read(ag_device *d, const char *root);

/* The last reading, redone when it is older than max_age_ms: status requests and
 * heartbeats share one reading every few seconds. root is borrowed. */
#define AG_DEVICE_CACHE_MS 3000
typedef struct ag_device_cache {
  const char *root;
  ag_device last;
  uint64_t read_ms;          /* caller's clock at the last reading */
  int valid;
} ag_device_cache;

void ag_device_cache_init(ag_device_cache *c, const char *root);
/* The cached reading at now_ms (any monotonic millisecond clock) into out. */
void ag_device_get(ag_device_cache *c, uint64_t now_ms, uint64_t max_age_ms, ag_device *out);

#endif
