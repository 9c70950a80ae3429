/* Unit tests for agent/device.c: battery, temperature, memory and CPU clock caps read
 * from fake /sys and /proc trees made in a temporary folder, garbage in those files, the
 * choice of thermal zone, and the cache that keeps reads to one every few seconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "device.h"

/* A fresh temporary root per test, removed at the end. */
static int setup(void **state) {
  char *root = strdup("/tmp/fg-agent-devXXXXXX");
  if (!root || !mkdtemp(root)) return -1;
  *state = root;
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", (char *)*state);
  int rc = system(cmd);
  free(*state);
  return rc == 0 ? 0 : -1;
}

/* root/rel, with its folders, holding text. */
static void put(const char *root, const char *rel, const char *text) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", root, rel);
  for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
    *p = '\0';
    mkdir(path, 0700);
    *p = '/';
  }
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(text, fp);
  assert_int_equal(fclose(fp), 0);
}

static void rm(const char *root, const char *rel) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s", root, rel);
  assert_int_equal(unlink(path), 0);
}

static void assert_all_unknown(const ag_device *d) {
  assert_true(d->battery_pct < 0);
  assert_int_equal(d->charging, -1);
  assert_true(d->temperature_c <= AG_DEVICE_UNKNOWN_TEMP);
  assert_null(d->temp_source);
  assert_true(d->mem_free_mb < 0);
  assert_true(d->mem_total_mb < 0);
  assert_true(d->cpu_max_freq_ratio < 0);
}

static void cpu(const char *root, int n, const char *hw, const char *lim) {
  char rel[128];
  snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cpufreq/cpuinfo_max_freq", n);
  put(root, rel, hw);
  snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cpufreq/scaling_max_freq", n);
  put(root, rel, lim);
}

static void test_nothing_there(void **state) {
  const char *root = *state;
  ag_device d;
  ag_device_read(&d, root);
  assert_all_unknown(&d);
  char missing[256];
  snprintf(missing, sizeof(missing), "%s/missing", root);
  ag_device_read(&d, missing);
  assert_all_unknown(&d);
  /* a root too long for any path below it */
  char *longroot = malloc(8192);
  assert_non_null(longroot);
  memset(longroot, 'a', 8191);
  longroot[0] = '/';
  longroot[8191] = '\0';
  ag_device_read(&d, longroot);
  assert_all_unknown(&d);
  free(longroot);
  ag_device_read(&d, "/"); /* the real one: whatever this machine has, and no crash */
  ag_device_read(&d, NULL);
}

/* A phone as Android lays it out: several supplies, zones of several kinds, two clusters. */
static void test_phone(void **state) {
  const char *root = *state;
  put(root, "sys/class/power_supply/usb/type", "USB\n");
  put(root, "sys/class/power_supply/usb/online", "1\n");
  put(root, "sys/class/power_supply/aaa-bms/type", "Battery\n"); /* sorts first, not preferred */
  put(root, "sys/class/power_supply/aaa-bms/capacity", "7\n");
  put(root, "sys/class/power_supply/battery/type", "Battery\n");
  put(root, "sys/class/power_supply/battery/capacity", "81\n");
  put(root, "sys/class/power_supply/battery/status", "Charging\n");
  put(root, "sys/class/power_supply/battery/temp", "312\n");
  put(root, "sys/class/thermal/thermal_zone0/type", "battery\n");
  put(root, "sys/class/thermal/thermal_zone0/temp", "31000\n");
  put(root, "sys/class/thermal/thermal_zone1/type", "cpu-1-0-usr\n");
  put(root, "sys/class/thermal/thermal_zone1/temp", "55000\n");
  put(root, "sys/class/thermal/thermal_zone2/type", "cpuss-0\n");
  put(root, "sys/class/thermal/thermal_zone2/temp", "61200\n");
  put(root, "sys/class/thermal/thermal_zone3/type", "xo-therm\n"); /* hotter, but not the CPU */
  put(root, "sys/class/thermal/thermal_zone3/temp", "90000\n");
  put(root, "sys/class/thermal/thermal_zone4/type", "cpu-0-1\n");
  put(root, "sys/class/thermal/thermal_zone4/temp", "hot\n");
  put(root, "sys/class/thermal/cooling_device0/temp", "99000\n"); /* not a zone */
  for (int i = 0; i < 4; i++) cpu(root, i, "1804800\n", "1804800\n");
  for (int i = 4; i < 8; i++) cpu(root, i, "2841600\n", "1420800\n"); /* big cores at half */
  put(root, "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq", "1\n"); /* not a cpu */
  put(root, "proc/meminfo", "MemTotal:       11732340 kB\nMemFree:          207744 kB\n"
                            "MemAvailable:    3145728 kB\nBuffers:            2016 kB\n");
  ag_device d;
  ag_device_read(&d, root);
  assert_true(d.battery_pct == 81);
  assert_int_equal(d.charging, 1);
  assert_true(d.temperature_c > 61.19 && d.temperature_c < 61.21);
  assert_string_equal(d.temp_source, "cpu");
  assert_true(d.mem_free_mb == 3072);
  assert_true(d.mem_total_mb == 11457); /* 11732340 kB */
  double want = (4 * 1804800.0 + 4 * 1420800.0) / (4 * 1804800.0 + 4 * 2841600.0);
  assert_true(d.cpu_max_freq_ratio > want - 1e-9 && d.cpu_max_freq_ratio < want + 1e-9);

  /* no CPU zone: the battery's zone, then the battery's own temp, then anything */
  rm(root, "sys/class/thermal/thermal_zone1/temp");
  rm(root, "sys/class/thermal/thermal_zone2/temp");
  put(root, "sys/class/thermal/thermal_zone4/temp", "0\n"); /* an idle sensor */
  ag_device_read(&d, root);
  assert_true(d.temperature_c == 31);
  assert_string_equal(d.temp_source, "battery");
  rm(root, "sys/class/thermal/thermal_zone0/temp");
  ag_device_read(&d, root);
  assert_true(d.temperature_c > 31.19 && d.temperature_c < 31.21);
  assert_string_equal(d.temp_source, "battery");
  rm(root, "sys/class/power_supply/battery/temp");
  ag_device_read(&d, root);
  assert_true(d.temperature_c == 90);
  assert_string_equal(d.temp_source, "other");

  /* the other states; MemFree when MemAvailable is missing */
  put(root, "sys/class/power_supply/battery/status", "Full\n");
  put(root, "proc/meminfo", "MemTotal: 8000000 kB\nMemFree: 1048576 kB\n");
  ag_device_read(&d, root);
  assert_int_equal(d.charging, 1);
  assert_true(d.mem_free_mb == 1024);
  assert_true(d.mem_total_mb == 7812);
  put(root, "sys/class/power_supply/battery/status", "Not charging\n");
  ag_device_read(&d, root);
  assert_int_equal(d.charging, 0);
  put(root, "sys/class/power_supply/battery/status", "Discharging");
  ag_device_read(&d, root);
  assert_int_equal(d.charging, 0);
  put(root, "sys/class/power_supply/battery/status", "Unknown\n");
  ag_device_read(&d, root);
  assert_int_equal(d.charging, -1);

  /* without the preferred name, the first Battery by name */
  rm(root, "sys/class/power_supply/battery/type");
  ag_device_read(&d, root);
  assert_true(d.battery_pct == 7);
}

/* Files that hold garbage, are too big, are not regular files, or say absurd things. */
static void test_garbage(void **state) {
  const char *root = *state;
  ag_device d;
  static const char *const bad_numbers[] = {"abc\n", "81%\n", "8 1\n", "\n", "", "0x51\n", "81.5\n",
                                            "99999999999999999999999999\n", "-99999999999999999999\n"};
  static const char *const bad_meminfo[] = {"MemAvailable: lots kB\n", "MemAvailable: -5 kB\n",
                                            "MemAvailable: 12 MB\n", "MemAvailable:\n", "XMemAvailable: 5 kB\n"};
  put(root, "sys/class/power_supply/battery/type", "Battery\n");
  for (size_t i = 0; i < sizeof(bad_numbers) / sizeof(bad_numbers[0]); i++) {
    put(root, "sys/class/power_supply/battery/capacity", bad_numbers[i]);
    put(root, "sys/class/power_supply/battery/temp", bad_numbers[i]);
    put(root, "sys/class/thermal/thermal_zone0/temp", bad_numbers[i]);
    cpu(root, 0, bad_numbers[i], "1000\n");
    cpu(root, 1, "1000\n", bad_numbers[i]);
    put(root, "proc/meminfo", bad_meminfo[i % (sizeof(bad_meminfo) / sizeof(bad_meminfo[0]))]);
    ag_device_read(&d, root);
    assert_true(d.battery_pct < 0);
    assert_true(d.temperature_c <= AG_DEVICE_UNKNOWN_TEMP);
    assert_true(d.cpu_max_freq_ratio < 0);
    assert_true(d.mem_free_mb < 0);
    assert_true(d.mem_total_mb < 0);
  }
  /* a MemTotal that is not a figure leaves only it unknown */
  put(root, "proc/meminfo", "MemTotal: 12 GB\nMemAvailable: 2048 kB\n");
  ag_device_read(&d, root);
  assert_true(d.mem_total_mb < 0 && d.mem_free_mb == 2);
  rm(root, "sys/devices/system/cpu/cpu1/cpufreq/scaling_max_freq");
  /* numbers, but not a battery level */
  static const char *const bad_levels[] = {"150\n", "-5\n", "101\n"};
  for (size_t i = 0; i < sizeof(bad_levels) / sizeof(bad_levels[0]); i++) {
    put(root, "sys/class/power_supply/battery/capacity", bad_levels[i]);
    ag_device_read(&d, root);
    assert_true(d.battery_pct < 0);
  }
  /* blanks around a number are fine; absurd temperatures and clocks are not readings */
  put(root, "sys/class/power_supply/battery/capacity", "  42 \n");
  put(root, "sys/class/power_supply/battery/temp", "9000\n");           /* 900 °C */
  put(root, "sys/class/thermal/thermal_zone0/temp", "-274000\n");       /* below absolute zero */
  put(root, "sys/class/thermal/thermal_zone1/temp", "500\n");           /* 0.5 °C or 500 °C: neither */
  put(root, "sys/class/thermal/thermal_zone2/temp", "1000000000\n");
  cpu(root, 0, "200000000000\n", "1000\n");                            /* 200 THz */
  put(root, "proc/meminfo", "MemAvailable: 99999999999999999 kB\n");
  ag_device_read(&d, root);
  assert_true(d.battery_pct == 42);
  assert_true(d.temperature_c <= AG_DEVICE_UNKNOWN_TEMP);
  assert_true(d.cpu_max_freq_ratio < 0);
  assert_true(d.mem_free_mb < 0);
  /* a few drivers write whole degrees */
  put(root, "sys/class/thermal/thermal_zone1/temp", "45\n");
  ag_device_read(&d, root);
  assert_true(d.temperature_c == 45);
  /* a cap above the hardware's top is no cap; a CPU without cpufreq counts for nothing */
  cpu(root, 0, "2000000\n", "3000000\n");
  cpu(root, 1, "2000000\n", "500000\n");
  put(root, "sys/devices/system/cpu/cpu2/online", "1\n");
  ag_device_read(&d, root);
  assert_true(d.cpu_max_freq_ratio == 2500000.0 / 4000000.0);
  cpu(root, 1, "2000000\n", "0\n"); /* a zero cap: garbage, that CPU is skipped */
  ag_device_read(&d, root);
  assert_true(d.cpu_max_freq_ratio == 1);

  /* a huge file: only its start is read, and it is no number */
  char *big = malloc(1 << 20);
  assert_non_null(big);
  memset(big, '7', (1 << 20) - 1);
  big[(1 << 20) - 1] = '\0';
  put(root, "sys/class/power_supply/battery/capacity", big);
  put(root, "proc/meminfo", big);
  ag_device_read(&d, root);
  assert_true(d.battery_pct < 0 && d.mem_free_mb < 0);
  free(big);

  /* a FIFO or a folder where a file should be: unknown at once, no read waits */
  char path[1024];
  snprintf(path, sizeof(path), "%s/sys/class/power_supply/battery/capacity", root);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(mkfifo(path, 0600), 0);
  snprintf(path, sizeof(path), "%s/sys/class/power_supply/battery/status", root);
  assert_int_equal(mkdir(path, 0700), 0);
  snprintf(path, sizeof(path), "%s/proc/meminfo", root);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(mkfifo(path, 0600), 0);
  ag_device_read(&d, root);
  assert_true(d.battery_pct < 0 && d.charging == -1 && d.mem_free_mb < 0);
}

/* Many entries: the folder scan stops at AG_DEVICE_MAX_ENTRIES and AG_DEVICE_MAX_CPUS. */
static void test_bounded(void **state) {
  const char *root = *state;
  for (int i = 0; i < AG_DEVICE_MAX_CPUS + 20; i++) cpu(root, i, "1000000\n", "500000\n");
  ag_device d;
  ag_device_read(&d, root);
  assert_true(d.cpu_max_freq_ratio == 0.5);
  char rel[128];
  for (int i = 0; i < AG_DEVICE_MAX_ENTRIES + 50; i++) {
    snprintf(rel, sizeof(rel), "sys/class/thermal/thermal_zone%d/temp", i);
    put(root, rel, "40000\n");
  }
  ag_device_read(&d, root);
  assert_true(d.temperature_c == 40);
}

/* Readings are kept for max_age_ms, then read again. */
static void test_cache(void **state) {
  const char *root = *state;
  put(root, "sys/class/power_supply/battery/type", "Battery\n");
  put(root, "sys/class/power_supply/battery/capacity", "50\n");
  ag_device_cache c;
  ag_device_cache_init(&c, root);
  ag_device d;
  ag_device_get(&c, 10000, AG_DEVICE_CACHE_MS, &d);
  assert_true(d.battery_pct == 50);
  put(root, "sys/class/power_supply/battery/capacity", "49\n");
  ag_device_get(&c, 10000 + AG_DEVICE_CACHE_MS - 1, AG_DEVICE_CACHE_MS, &d);
  assert_true(d.battery_pct == 50); /* still the cached reading */
  ag_device_get(&c, 10000 + AG_DEVICE_CACHE_MS, AG_DEVICE_CACHE_MS, &d);
  assert_true(d.battery_pct == 49);
  put(root, "sys/class/power_supply/battery/capacity", "48\n");
  ag_device_get(&c, 500, AG_DEVICE_CACHE_MS, &d); /* a clock that went back: read again */
  assert_true(d.battery_pct == 48);
  rm(root, "sys/class/power_supply/battery/capacity");
  ag_device_get(&c, 500, 0, &d); /* max age 0: every time */
  assert_true(d.battery_pct < 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_nothing_there, setup, teardown),
    cmocka_unit_test_setup_teardown(test_phone, setup, teardown),
    cmocka_unit_test_setup_teardown(test_garbage, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bounded, setup, teardown),
    cmocka_unit_test_setup_teardown(test_cache, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
