/* Incremental server-sent-events parser (WHATWG event-stream rules) for reading
 * upstream streams whose bytes arrive cut anywhere, and a writer for the one event
 * shape the daemons send. See sse.h. */
#include "sse.h"

#include <string.h>

#include "err.h"

void pr_sse_init(pr_sse_parser *p, size_t max_event, pr_sse_event_cb on_event,
                 pr_sse_comment_cb on_comment, void *ud) {
  p->on_event = on_event;
  p->on_comment = on_comment;
  p->ud = ud;
  pr_buf_init(&p->line, max_event);
  pr_buf_init(&p->data, max_event);
  pr_buf_init(&p->event, max_event);
  pr_buf_init(&p->id, max_event);
  p->has_data = 0;
  p->last_was_cr = 0;
}

void pr_sse_reset(pr_sse_parser *p) {
  pr_buf_reset(&p->line);
  pr_buf_reset(&p->data);
  pr_buf_reset(&p->event);
  pr_buf_reset(&p->id);
  p->has_data = 0;
  p->last_was_cr = 0;
}

void pr_sse_free(pr_sse_parser *p) {
  pr_buf_free(&p->line);
  pr_buf_free(&p->data);
  pr_buf_free(&p->event);
  pr_buf_free(&p->id);
  p->has_data = 0;
  p->last_was_cr = 0;
}

static int dispatch(pr_sse_parser *p) {
  int rc = 0;
  /* WHATWG: an event without data is dropped, but its event name still resets. */
  if (p->has_data && p->on_event) {
    pr_sse_event ev = {
      .event = pr_buf_cstr(&p->event),
      .data = pr_buf_cstr(&p->data),
      .data_len = p->data.len,
      .id = pr_buf_cstr(&p->id),
    };
    rc = p->on_event(p->ud, &ev);
  }
  pr_buf_reset(&p->data);
  pr_buf_reset(&p->event);
  p->has_data = 0;
  /* The id is the stream's "last event ID": it carries over to later events. */
  return rc;
}

static int set_field(pr_buf *b, const char *v, size_t n) {
  pr_buf_reset(b);
  return pr_buf_append(b, v, n);
}

/* One complete line without its terminator; `s` need not be NUL-terminated. */
static int process_line(pr_sse_parser *p, const char *s, size_t n) {
  if (n == 0) return dispatch(p);
  if (s[0] == ':') return p->on_comment ? p->on_comment(p->ud, s + 1, n - 1) : 0;
  const char *colon = memchr(s, ':', n);
  size_t flen = colon ? (size_t)(colon - s) : n;
  const char *v = colon ? colon + 1 : s + n;
  size_t vlen = colon ? n - flen - 1 : 0;
  if (vlen && v[0] == ' ') {
    v++;
    vlen--;
  }
  if (flen == 4 && memcmp(s, "data", 4) == 0) {
    size_t old = p->data.len;
    int rc = 0;
    if (p->has_data) rc = pr_buf_append(&p->data, "\n", 1);
    if (!rc) rc = pr_buf_append(&p->data, v, vlen);
    if (rc) {
      /* Keep the half-appended separator out of what the caller may still read. */
      p->data.len = old;
      if (p->data.data) p->data.data[old] = '\0';
      return rc;
    }
    p->has_data = 1;
  } else if (flen == 5 && memcmp(s, "event", 5) == 0) {
    return set_field(&p->event, v, vlen);
  } else if (flen == 2 && memcmp(s, "id", 2) == 0) {
    /* WHATWG ignores ids containing NUL. */
    if (!memchr(v, '\0', vlen)) return set_field(&p->id, v, vlen);
  }
  /* "retry" and unknown fields are ignored, as the spec says. */
  return 0;
}

/* After a non-zero return the rest of `data` is not parsed and the parser may hold a
 * partial line: the caller drops the stream or calls pr_sse_reset. */
int pr_sse_feed(pr_sse_parser *p, const char *data, size_t n) {
  size_t i = 0;
  if (n && p->last_was_cr) {
    /* A CRLF split across two feeds is one line ending, not two. */
    if (data[0] == '\n') i = 1;
    p->last_was_cr = 0;
  }
  while (i < n) {
    const char *s = data + i;
    size_t left = n - i, k = 0;
    while (k < left && s[k] != '\n' && s[k] != '\r') k++;
    if (k == left) {
      /* No line end in what is left: keep the piece for the next feed. */
      return pr_buf_append(&p->line, s, k);
    }
    int rc;
    if (p->line.len == 0) {
      /* Common case: the whole line is in this feed, so skip the copy. */
      if (k > p->line.max) return PR_ETOOLARGE;
      rc = process_line(p, s, k);
    } else {
      rc = pr_buf_append(&p->line, s, k);
      if (rc) return rc;
      rc = process_line(p, p->line.data, p->line.len);
      pr_buf_reset(&p->line);
    }
    i += k + 1;
    if (s[k] == '\r') {
      if (i < n) {
        if (data[i] == '\n') i++;
      } else {
        p->last_was_cr = 1;
      }
    }
    if (rc) return rc;
  }
  return 0;
}

int pr_sse_write_data(pr_buf *out, const char *payload, size_t len) {
  size_t old = out->len;
  size_t i = 0;
  int rc = 0;
  if (!payload) payload = "";
  /* A payload with line breaks becomes several data lines, which readers join back
   * with "\n"; a raw break would otherwise end the event early. */
  do {
    size_t k = i;
    while (k < len && payload[k] != '\n' && payload[k] != '\r') k++;
    rc = pr_buf_append(out, "data: ", 6);
    if (!rc) rc = pr_buf_append(out, payload + i, k - i);
    if (!rc) rc = pr_buf_append(out, "\n", 1);
    if (rc) break;
    if (k < len && payload[k] == '\r' && k + 1 < len && payload[k + 1] == '\n') k++;
    i = k + 1;
  } while (i <= len);
  if (!rc) rc = pr_buf_append(out, "\n", 1);
  if (rc) {
    out->len = old;
    if (out->data) out->data[old] = '\0';
  }
  return rc;
}
