/* Structured logging: one JSON object per line with a timestamp, a level, a message and
 * any fields the caller adds. proto's own modules never log; the daemons decide what
 * to log and where (stderr unless told otherwise). No secrets go into log fields. */
#ifndef PR_LOG_H
#define PR_LOG_H

#include <stdio.h>

#include <cjson/cJSON.h>

enum { PR_LOG_DEBUG = 0, PR_LOG_INFO = 1, PR_LOG_WARN = 2, PR_LOG_ERROR = 3 };

void pr_log_set_level(int level);
int pr_log_get_level(void);
/* Parse "debug", "info", "warn", "error"; -1 when unknown. */
int pr_log_level_from_name(const char *name);
/* Where log lines go; the stream is not owned. */
void pr_log_set_stream(FILE *fp);
/* Name of the process, added to each line as "app". */
void pr_log_set_app(const char *app);
int pr_log_enabled(int level);
/* Buffer info and debug lines (up to 64 KiB) until pr_log_flush; warnings and errors are
 * written at once. Call before the first line is logged. */
void pr_log_set_buffered(int on);
void pr_log_flush(void);
/* {"ts","level","app","msg"} with msg formatted printf-style. */
void pr_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like pr_log, plus the members of `fields` (a JSON object, or NULL), which this
 * call takes over and frees. */
void pr_log_kv(int level, const char *msg, cJSON *fields);

#define pr_debug(...) do { if (pr_log_enabled(PR_LOG_DEBUG)) pr_log(PR_LOG_DEBUG, __VA_ARGS__); } while (0)
#define pr_info(...) pr_log(PR_LOG_INFO, __VA_ARGS__)
#define pr_warn(...) pr_log(PR_LOG_WARN, __VA_ARGS__)
#define pr_error(...) pr_log(PR_LOG_ERROR, __VA_ARGS__)

#endif
