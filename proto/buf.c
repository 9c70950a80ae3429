/* Capped growable byte buffers; see buf.h. */
#include "buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

void pr_buf_init(pr_buf *b, size_t max) {
  b->data = NULL;
  b->len = b->cap = 0;
  b->max = max;
  b->cut = 0;
}

void pr_buf_free(pr_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

void pr_buf_reset(pr_buf *b) {
  b->len = 0;
  b->cut = 0;
  if (b->data) b->data[0] = '\0';
}

static int buf_reserve(pr_buf *b, size_t extra) {
  if (extra > b->max || b->len > b->max - extra) {
    b->cut = 1;
    return PR_ETOOLARGE;
  }
  size_t need = b->len + extra + 1;
  if (need <= b->cap) return 0;
  size_t ncap = b->cap ? b->cap : 64;
  while (ncap < need) ncap *= 2;
  if (ncap > b->max + 1) ncap = b->max + 1;
  char *p = realloc(b->data, ncap);
  if (!p) {
    b->cut = 1;
    return -ENOMEM;
  }
  b->data = p;
  b->cap = ncap;
  return 0;
}

int pr_buf_append(pr_buf *b, const void *p, size_t n) {
  int rc = buf_reserve(b, n);
  if (rc) return rc;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

int pr_buf_append_str(pr_buf *b, const char *s) { return pr_buf_append(b, s, strlen(s)); }

int pr_buf_reserve(pr_buf *b, size_t extra) {
  int cut = b->cut;
  int rc = buf_reserve(b, extra);
  b->cut = cut; /* only a hint: no append was refused */
  return rc;
}

int pr_buf_vappendf(pr_buf *b, const char *fmt, va_list ap) {
  /* Format straight into the spare room; only what does not fit is formatted twice. */
  size_t room = b->cap > b->len ? b->cap - b->len : 0;
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(room ? b->data + b->len : NULL, room, fmt, ap2);
  va_end(ap2);
  if (n < 0) {
    if (room) b->data[b->len] = '\0';
    b->cut = 1;
    return -EINVAL;
  }
  if ((size_t)n < room && (size_t)n <= b->max - b->len) {
    b->len += (size_t)n;
    return 0;
  }
  if (room) b->data[b->len] = '\0'; /* a refused append leaves the buffer as it was */
  int rc = buf_reserve(b, (size_t)n);
  if (rc) return rc;
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
  return 0;
}

int pr_buf_appendf(pr_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = pr_buf_vappendf(b, fmt, ap);
  va_end(ap);
  return rc;
}

void pr_buf_text(pr_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (pr_buf_vappendf(b, fmt, ap)) b->cut = 1;
  va_end(ap);
}

void pr_buf_bytes(pr_buf *b, const void *p, size_t n) {
  if (pr_buf_append(b, p, n)) b->cut = 1;
}

void pr_buf_consume(pr_buf *b, size_t n) {
  if (n >= b->len) {
    pr_buf_reset(b);
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  b->data[b->len] = '\0';
}

char *pr_buf_steal(pr_buf *b, size_t *len) {
  char *p = b->data;
  if (len) *len = b->len;
  if (!p) p = calloc(1, 1);
  b->data = NULL;
  b->len = b->cap = 0;
  return p;
}

const char *pr_buf_cstr(const pr_buf *b) { return b->data ? b->data : ""; }

char *pr_u64_digits(char *end, uint64_t v) {
  char *p = end;
  do *--p = (char)('0' + v % 10);
  while (v /= 10);
  return p;
}
