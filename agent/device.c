/* Device readings from /sys and /proc below a root folder, and a cache so that they are
 * read at most every few seconds. See device.h; the choices are in docs/agent.md. */
#include "device.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* Plausible temperatures (°C); a sensor outside them is broken or unplugged. */
#define TEMP_MIN (-40.0)
#define TEMP_MAX 150.0
/* Plausible CPU clocks (kHz) and memory (kB): beyond them a file holds garbage. */
#define FREQ_MAX_KHZ 100000000LL
#define MEM_MAX_KB (1LL << 40)

void ag_device_unknown(ag_device *d) {
  d->battery_pct = -1;
  d->charging = -1;
  d->temperature_c = AG_DEVICE_UNKNOWN_TEMP;
  d->temp_source = NULL;
  d->mem_free_mb = -1;
  d->mem_total_mb = -1;
  d->cpu_max_freq_ratio = -1;
}

/* ---- files ------------------------------------------------------------------------- */

/* A small regular file into buf (NUL-terminated, surrounding blanks removed). 0, or a
 * negative code: missing, not a regular file, unreadable, empty. Opened non-blocking and
 * checked with fstat before reading, so a FIFO or a device node put there never blocks. */
static int read_small(const char *path, char *buf, size_t n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return -errno;
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return -EINVAL;
  }
  size_t got = 0;
  while (got + 1 < n) {
    ssize_t k = read(fd, buf + got, n - 1 - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  buf[got] = '\0';
  while (got > 0 && isspace((unsigned char)buf[got - 1])) buf[--got] = '\0';
  size_t lead = 0;
  while (lead < got && isspace((unsigned char)buf[lead])) lead++;
  if (lead) memmove(buf, buf + lead, got - lead + 1);
  return got > lead ? 0 : -ENODATA;
}

/* The whole text is one decimal integer that fits an int64. */
static int parse_int(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end != '\0') return -EINVAL;
  *out = (int64_t)v;
  return 0;
}

static int read_int(const char *path, int64_t *out) {
  char buf[64];
  if (read_small(path, buf, sizeof(buf)) < 0) return -ENOENT;
  return parse_int(buf, out);
}

/* dir/name/leaf into out; -ENAMETOOLONG when it does not fit. */
static int join3(char *out, size_t n, const char *dir, const char *name, const char *leaf) {
  int k = snprintf(out, n, "%s/%s/%s", dir, name, leaf);
  return k < 0 || (size_t)k >= n ? -ENAMETOOLONG : 0;
}

/* ---- battery ----------------------------------------------------------------------- */

/* The battery: the power_supply named "battery" when its type is Battery, else the first
 * of type Battery by name (readdir's order is not stable). Its capacity, status and temp
 * (tenths of a degree). *bat_temp is left alone when unknown. */
static void read_battery(ag_device *d, const char *root, double *bat_temp) {
  char dir[PATH_MAX], path[PATH_MAX], buf[64], best[NAME_MAX + 1] = "";
  if (snprintf(dir, sizeof(dir), "%s/sys/class/power_supply", root) >= (int)sizeof(dir)) return;
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *e;
  for (int i = 0; i < AG_DEVICE_MAX_ENTRIES && (e = readdir(dp)); i++) {
    if (e->d_name[0] == '.' || strlen(e->d_name) > NAME_MAX) continue;
    if (join3(path, sizeof(path), dir, e->d_name, "type") < 0) continue;
    if (read_small(path, buf, sizeof(buf)) < 0 || strcasecmp(buf, "Battery") != 0) continue;
    if (strcmp(best, "battery") == 0) continue;
    if (!best[0] || strcmp(e->d_name, "battery") == 0 || strcmp(e->d_name, best) < 0)
      snprintf(best, sizeof(best), "%s", e->d_name);
  }
  closedir(dp);
  if (!best[0]) return;
  int64_t v;
  if (join3(path, sizeof(path), dir, best, "capacity") == 0 && read_int(path, &v) == 0 && v >= 0 && v <= 100)
    d->battery_pct = (double)v;
  if (join3(path, sizeof(path), dir, best, "status") == 0 && read_small(path, buf, sizeof(buf)) == 0) {
    if (strcasecmp(buf, "Charging") == 0 || strcasecmp(buf, "Full") == 0) d->charging = 1;
    else if (strcasecmp(buf, "Discharging") == 0 || strcasecmp(buf, "Not charging") == 0) d->charging = 0;
  }
  if (join3(path, sizeof(path), dir, best, "temp") == 0 && read_int(path, &v) == 0 && v != 0 &&
      v > TEMP_MIN * 10 && v < TEMP_MAX * 10)
    *bat_temp = (double)v / 10.0;
}

/* ---- thermal zones ----------------------------------------------------------------- */

/* A thermal zone's temp in °C: millidegrees as the kernel documents, but a few drivers
 * write whole degrees (|v| < 200). 0 is what idle or absent sensors say: no reading. */
static int zone_celsius(int64_t v, double *c) {
  if (v == 0) return -EINVAL;
  if (v > -200 && v < 200) *c = (double)v;
  else if (v <= -1000 || v >= 1000) *c = (double)v / 1000.0;
  else return -EINVAL;
  return *c > TEMP_MIN && *c < TEMP_MAX ? 0 : -EINVAL;
}

enum { ZONE_CPU, ZONE_BATTERY, ZONE_OTHER, ZONE_KINDS };

static int zone_kind(const char *type) {
  char low[64];
  size_t i = 0;
  for (; type[i] && i + 1 < sizeof(low); i++) low[i] = (char)tolower((unsigned char)type[i]);
  low[i] = '\0';
  if (strstr(low, "cpu")) return ZONE_CPU;
  if (strstr(low, "batt")) return ZONE_BATTERY;
  return ZONE_OTHER;
}

/* The hottest plausible zone of each kind (cpu: its type names a cpu, e.g. cpu-1-0-usr,
 * cpuss-0, mtktscpu; battery: names a battery). */
static void read_thermal(const char *root, double hottest[ZONE_KINDS]) {
  char dir[PATH_MAX], path[PATH_MAX], type[64];
  if (snprintf(dir, sizeof(dir), "%s/sys/class/thermal", root) >= (int)sizeof(dir)) return;
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *e;
  for (int i = 0; i < AG_DEVICE_MAX_ENTRIES && (e = readdir(dp)); i++) {
    if (strncmp(e->d_name, "thermal_zone", 12) != 0) continue;
    int64_t v;
    double c;
    if (join3(path, sizeof(path), dir, e->d_name, "temp") < 0 || read_int(path, &v) < 0 ||
        zone_celsius(v, &c) < 0)
      continue;
    int kind = ZONE_OTHER;
    if (join3(path, sizeof(path), dir, e->d_name, "type") == 0 && read_small(path, type, sizeof(type)) == 0)
      kind = zone_kind(type);
    if (hottest[kind] <= AG_DEVICE_UNKNOWN_TEMP || c > hottest[kind]) hottest[kind] = c;
  }
  closedir(dp);
}

/* ---- memory and CPU clocks --------------------------------------------------------- */

/* The kB figure of key ("MemTotal:") in meminfo text: 0 and *kb, -ENOENT when the key is
 * not there, -EINVAL when its value is not "  831488 kB" (a number, then the unit or the
 * end of the line) within MEM_MAX_KB. */
static int meminfo_kb(const char *buf, const char *key, long long *kb) {
  size_t kl = strlen(key);
  for (const char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (strncmp(p, key, kl) != 0) continue;
    char *end;
    errno = 0;
    long long v = strtoll(p + kl, &end, 10);
    if (errno || end == p + kl || v < 0 || v > MEM_MAX_KB) return -EINVAL;
    while (*end == ' ' || *end == '\t') end++;
    if (*end && *end != '\n' && strncmp(end, "kB", 2) != 0) return -EINVAL;
    *kb = v;
    return 0;
  }
  return -ENOENT;
}

static void read_memory(ag_device *d, const char *root) {
  char path[PATH_MAX], buf[AG_DEVICE_MAX_FILE];
  if (snprintf(path, sizeof(path), "%s/proc/meminfo", root) >= (int)sizeof(path)) return;
  if (read_small(path, buf, sizeof(buf)) < 0) return;
  long long kb;
  int rc = meminfo_kb(buf, "MemAvailable:", &kb);
  if (rc == -ENOENT) rc = meminfo_kb(buf, "MemFree:", &kb); /* kernels before 3.14 */
  if (rc == 0) d->mem_free_mb = floor((double)kb / 1024.0);
  if (meminfo_kb(buf, "MemTotal:", &kb) == 0 && kb > 0) d->mem_total_mb = floor((double)kb / 1024.0);
}

/* "cpu" and digits only: cpu0, cpu7 (not cpufreq, cpuidle). */
static int is_cpu_dir(const char *name) {
  if (strncmp(name, "cpu", 3) != 0 || !name[3]) return 0;
  for (const char *p = name + 3; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  return 1;
}

static void read_cpufreq(ag_device *d, const char *root) {
  char dir[PATH_MAX], path[PATH_MAX];
  if (snprintf(dir, sizeof(dir), "%s/sys/devices/system/cpu", root) >= (int)sizeof(dir)) return;
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *e;
  double cap = 0, top = 0;
  int cpus = 0;
  for (int i = 0; i < AG_DEVICE_MAX_ENTRIES && cpus < AG_DEVICE_MAX_CPUS && (e = readdir(dp)); i++) {
    if (!is_cpu_dir(e->d_name)) continue;
    int64_t hw, lim;
    if (join3(path, sizeof(path), dir, e->d_name, "cpufreq/cpuinfo_max_freq") < 0 || read_int(path, &hw) < 0 ||
        hw <= 0 || hw > FREQ_MAX_KHZ)
      continue;
    if (join3(path, sizeof(path), dir, e->d_name, "cpufreq/scaling_max_freq") < 0 || read_int(path, &lim) < 0 ||
        lim <= 0 || lim > FREQ_MAX_KHZ)
      continue;
    cpus++;
    top += (double)hw;
    cap += (double)(lim < hw ? lim : hw); /* a cap above the hardware's top is no cap */
  }
  closedir(dp);
  if (top > 0) d->cpu_max_freq_ratio = cap / top;
}

/* ---- all of it --------------------------------------------------------------------- */

void ag_device_read(ag_device *d, const char *root) {
  ag_device_unknown(d);
  if (!root || strcmp(root, "/") == 0) root = "";
  if (strlen(root) > PATH_MAX / 2) return; /* no room for the paths below it */
  double bat_temp = AG_DEVICE_UNKNOWN_TEMP;
  double hottest[ZONE_KINDS] = {AG_DEVICE_UNKNOWN_TEMP, AG_DEVICE_UNKNOWN_TEMP, AG_DEVICE_UNKNOWN_TEMP};
  read_battery(d, root, &bat_temp);
  read_thermal(root, hottest);
  /* the CPU is what heats and throttles; else the battery's own sensor; else anything */
  if (hottest[ZONE_CPU] > AG_DEVICE_UNKNOWN_TEMP) {
    d->temperature_c = hottest[ZONE_CPU];
    d->temp_source = "cpu";
  } else if (hottest[ZONE_BATTERY] > AG_DEVICE_UNKNOWN_TEMP || bat_temp > AG_DEVICE_UNKNOWN_TEMP) {
    d->temperature_c = hottest[ZONE_BATTERY] > AG_DEVICE_UNKNOWN_TEMP ? hottest[ZONE_BATTERY] : bat_temp;
    d->temp_source = "battery";
  } else if (hottest[ZONE_OTHER] > AG_DEVICE_UNKNOWN_TEMP) {
    d->temperature_c = hottest[ZONE_OTHER];
    d->temp_source = "other";
  }
  read_memory(d, root);
  read_cpufreq(d, root);
}

void ag_device_cache_init(ag_device_cache *c, const char *root) {
  memset(c, 0, sizeof(*c));
  c->root = root;
  ag_device_unknown(&c->last);
}

void ag_device_get(ag_device_cache *c, uint64_t now_ms, uint64_t max_age_ms, ag_device *out) {
  if (!c->valid || now_ms < c->read_ms || now_ms - c->read_ms >= max_age_ms) {
    ag_device_read(&c->last, c->root);
    c->read_ms = now_ms;
    c->valid = 1;
  }
  *out = c->last;
}
