/* Structured JSON log lines; see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

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

static void log_emit(int level, const char *msg, cJSON *fields) {
  struct timeval tv;
  struct tm tm;
  char ts[40];
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + n, sizeof(ts) - n, ".%03ldZ", (long)(tv.tv_usec / 1000));

  cJSON *o = cJSON_CreateObject();
  if (!o) {
    cJSON_Delete(fields);
    return;
  }
  cJSON_AddStringToObject(o, "ts", ts);
  cJSON_AddStringToObject(o, "level", level_names[level < 0 ? 0 : level > 3 ? 3 : level]);
  cJSON_AddStringToObject(o, "app", log_app);
  cJSON_AddStringToObject(o, "msg", msg ? msg : "");
  if (fields) {
    cJSON *it = fields->child;
    while (it) {
      cJSON *next = it->next;
      cJSON_DetachItemViaPointer(fields, it);
      cJSON_AddItemToObject(o, it->string, it);
      it = next;
    }
    cJSON_Delete(fields);
  }
  char *line = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!line) return;
  FILE *fp = log_fp ? log_fp : stderr;
  fputs(line, fp);
  fputc('\n', fp);
  /* buffered mode: a busy gateway writes its access log in batches (pr_log_flush from
   * its tick); warnings and errors still go out at once */
  if (!log_buffered || level >= PR_LOG_WARN) fflush(fp);
  free(line);
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
