/* An incremental parser for server-sent events (the WHATWG event-stream format), as
 * OpenAI-style streams use it: input may be cut at any byte; lines end in LF, CRLF or
 * CR; "data:" lines of one event are joined with "\n"; ":" lines are comments
 * (llama-server's keep-alives). Each field line and each event is capped. */
#ifndef PR_SSE_H
#define PR_SSE_H

#include <stddef.h>

#include "buf.h"

typedef struct pr_sse_event {
  const char *event; /* "" when the event had no "event:" field */
  const char *data;  /* joined data lines, NUL-terminated */
  size_t data_len;
  const char *id;    /* "" when absent */
} pr_sse_event;

/* Return 0 to continue, non-zero to stop: pr_sse_feed then returns that value. */
typedef int (*pr_sse_event_cb)(void *ud, const pr_sse_event *ev);
/* Called for each comment line (text after ':'), may be NULL. */
typedef int (*pr_sse_comment_cb)(void *ud, const char *text, size_t len);

typedef struct pr_sse_parser {
  pr_sse_event_cb on_event;
  pr_sse_comment_cb on_comment;
  void *ud;
  pr_buf line;   /* the current, unfinished line */
  pr_buf data;   /* data of the current event */
  pr_buf event;  /* event name of the current event */
  pr_buf id;
  int has_data;
  int last_was_cr; /* a CR ended the last line: skip a following LF */
} pr_sse_parser;

/* max_event caps one line and one event's data (PR_ETOOLARGE past it). */
void pr_sse_init(pr_sse_parser *p, size_t max_event, pr_sse_event_cb on_event,
                 pr_sse_comment_cb on_comment, void *ud);
/* Feed n bytes; events are delivered as they complete. Returns 0, a callback's
 * non-zero value, or PR_ETOOLARGE. */
int pr_sse_feed(pr_sse_parser *p, const char *data, size_t n);
/* Forget a partial event (e.g. when a stream restarts). */
void pr_sse_reset(pr_sse_parser *p);
void pr_sse_free(pr_sse_parser *p);

/* Write one "data: <payload>\n\n" event into out. */
int pr_sse_write_data(pr_buf *out, const char *payload, size_t len);

#endif
