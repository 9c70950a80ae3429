/* Structured JSON log lines; see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

static int log_level = PR_LOG_INFO;
static FILE *log_fp;
static const char *log_app = "fleetgate";
static int log_buffered;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void pr_log_set_level(int level) { log_level = level; }
int pr_log_get_level(void) { return log_level; }
void pr_log_set_stream(FILE *fp) { log_fp = fp; }
void pr_log_set_app(const char *app) { log_app = app; }

void pr_log_set_buffered(int on) {
  FILE *fp = log_fp ? log_fp : stderr;
  if (on && !log_buffered) setvbuf(fp, NULL, _IOFBF, 64 * 1024);
  log_buffered = on;
}

void pr_log_flush(void) { fflush(log_fp ? log_fp : stderr); }
int pr_log_enabled(int level) { return level >= log_level; }

int pr_log_level_from_name(const char *name) {
  for (int i = 0; i < 4; i++)
    if (name && strcmp(name, level_names[i]) == 0) return i;
  return -1;
}

/* A string item whose key is a constant: cJSON copies nothing but the value. */
static cJSON *log_item(const char *key, const char *val) {
  cJSON *it = cJSON_CreateString(val);
  if (it) {
    it->string = (char *)key;
    it->type |= cJSON_StringIsConst;
  }
  return it;
}

static void log_emit(int level, const char *msg, cJSON *fields) {
  /* the date and time change once a second; only the milliseconds each line */
  static char day[32];
  static size_t day_n;
  static time_t day_sec = -1;
  char ts[40];
  int64_t now = pr_clock_wall_ms();
  time_t sec = (time_t)(now / 1000);
  if (sec != day_sec) {
    struct tm tm;
    gmtime_r(&sec, &tm);
    day_n = strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
    day_sec = sec;
  }
  memcpy(ts, day, day_n);
  snprintf(ts + day_n, sizeof(ts) - day_n, ".%03dZ", (int)(now % 1000));

  cJSON *o = fields ? fields : cJSON_CreateObject();
  cJSON *head[4] = {log_item("ts", ts),
                    log_item("level", level_names[level < 0 ? 0 : level > 3 ? 3 : level]),
                    log_item("app", log_app), log_item("msg", msg ? msg : "")};
  if (!o || !head[0] || !head[1] || !head[2] || !head[3]) {
    for (int i = 0; i < 4; i++) cJSON_Delete(head[i]);
    cJSON_Delete(o);
    return;
  }
  /* the leading keys go in front of the caller's fields, linked in place (cJSON's
   * lists: next runs to NULL, the first item's prev is the last) */
  for (int i = 0; i < 3; i++) {
    head[i]->next = head[i + 1];
    head[i + 1]->prev = head[i];
  }
  cJSON *first = o->child;
  if (first) {
    head[0]->prev = first->prev;
    head[3]->next = first;
    first->prev = head[3];
  } else {
    head[0]->prev = head[3];
  }
  o->child = head[0];
  /* most lines fit the static buffer: no allocation, no copy */
  static char fixed[8192];
  char *line = fixed;
  if (!cJSON_PrintPreallocated(o, fixed, (int)sizeof(fixed), 0)) line = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!line) return;
  FILE *fp = log_fp ? log_fp : stderr;
  fputs(line, fp);
  fputc('\n', fp);
  /* buffered mode: a busy gateway writes its access log in batches (pr_log_flush from
   * its tick); warnings and errors still go out at once */
  if (!log_buffered || level >= PR_LOG_WARN) fflush(fp);
  if (line != fixed) free(line);
}

void pr_log(int level, const char *fmt, ...) {
  if (!pr_log_enabled(level)) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  log_emit(level, msg, NULL);
}

void pr_log_kv(int level, const char *msg, cJSON *fields) {
  if (!pr_log_enabled(level)) {
    cJSON_Delete(fields);
    return;
  }
  log_emit(level, msg, fields);
}
