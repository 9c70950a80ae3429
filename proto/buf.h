/* Capped growable byte buffers (curl's dynbuf idea): every buffer that holds client or
 * upstream bytes has a maximum, and an append that would pass it fails with
 * PR_ETOOLARGE and leaves the buffer as it was (and `cut` set). The appends' results
 * must be used (warn_unused_result); pr_buf_text and pr_buf_bytes are for callers that
 * check `cut` once at the end instead. The buffer owns `data`; pr_buf_free
 * releases it. `data` is always NUL-terminated after a successful append, so text
 * buffers can be used as C strings (the NUL is not counted in len). */
#ifndef PR_BUF_H
#define PR_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pr_buf {
  char *data;
  size_t len; /* bytes held */
  size_t cap; /* bytes allocated */
  size_t max; /* largest len allowed */
  int cut;    /* an append was refused since the last init/reset (sticky) */
} pr_buf;

void pr_buf_init(pr_buf *b, size_t max);
void pr_buf_free(pr_buf *b);
/* Forget the content, keep the allocation. */
void pr_buf_reset(pr_buf *b);
int pr_buf_append(pr_buf *b, const void *p, size_t n) __attribute__((warn_unused_result));
/* Make room for `extra` more bytes now (one allocation instead of several doublings). A
 * hint: when it fails nothing changes, and the append that needs the room fails instead. */
int pr_buf_reserve(pr_buf *b, size_t extra);
int pr_buf_append_str(pr_buf *b, const char *s) __attribute__((warn_unused_result));
int pr_buf_appendf(pr_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), warn_unused_result));
int pr_buf_vappendf(pr_buf *b, const char *fmt, va_list ap) __attribute__((warn_unused_result));
/* For text whose loss can be told later (an error list, a metrics page, a log line):
 * append, and when it does not fit, append nothing and leave b->cut set, for the caller
 * to check once at the end instead of after every piece. */
void pr_buf_text(pr_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pr_buf_bytes(pr_buf *b, const void *p, size_t n);
/* Drop the first n bytes. */
void pr_buf_consume(pr_buf *b, size_t n);
/* Hand the data to the caller (who frees it) and leave the buffer empty. */
char *pr_buf_steal(pr_buf *b, size_t *len);
/* The decimal digits of v written backwards from end (exclusive, not NUL-terminated by
 * this call); returns where they start. Room for 20 digits is enough. */
char *pr_u64_digits(char *end, uint64_t v);
/* A NUL-terminated view; "" for an empty buffer. */
const char *pr_buf_cstr(const pr_buf *b);

#endif
