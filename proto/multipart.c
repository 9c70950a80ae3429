/* Streaming multipart/form-data reader: a delimiter matcher that holds back only the
 * bytes that may still turn out to be a delimiter (always a prefix of it, so it needs no
 * buffer of its own), and a bounded reader for each part's header lines. See multipart.h. */
#include "multipart.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "err.h"

enum {
  ST_PREAMBLE, /* before the first delimiter: bytes are counted and dropped */
  ST_HEADERS,  /* in a part's header line */
  ST_HEADER_LF, /* a header line's CR seen */
  ST_DATA,     /* in a part's data */
  ST_EPILOGUE, /* after the closing delimiter: bytes are dropped */
};

/* Records the sticky error; "part N: " goes in front of what went wrong in a part. */
static int vfail(pr_multipart *m, int rc, int in_part, const char *fmt, va_list ap) {
  char what[72];
  vsnprintf(what, sizeof(what), fmt, ap);
  if (in_part && m->parts > 0) snprintf(m->err, sizeof(m->err), "part %d: %s", m->parts, what);
  else snprintf(m->err, sizeof(m->err), "%s", what);
  m->rc = rc;
  return rc;
}

static int fail(pr_multipart *m, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_body(pr_multipart *m, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(pr_multipart *m, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(m, rc, 1, fmt, ap);
  va_end(ap);
  return rc;
}

static int fail_body(pr_multipart *m, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(m, rc, 0, fmt, ap);
  va_end(ap);
  return rc;
}

/* RFC 2046 bchars: DIGIT / ALPHA / "'()+_,-./:=?" / space, and no space at the end. */
static int boundary_ok(const char *s, size_t n) {
  static const char extra[] = "'()+_,-./:=? ";
  if (n < 1 || n > PR_MULTIPART_BOUNDARY_MAX || s[n - 1] == ' ') return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!alnum && (c == '\0' || !strchr(extra, c))) return 0;
  }
  return 1;
}

/* RFC 9110 tchar. */
static int is_tchar(char c) {
  unsigned char u = (unsigned char)c;
  if ((u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z')) return 1;
  return u && strchr("!#$%&'*+-.^_`|~", u) != NULL;
}

static const char *skip_ows(const char *p) {
  while (*p == ' ' || *p == '\t') p++;
  return p;
}

/* A parameter value at *pp: a quoted string (backslash escapes undone) or a bare run up
 * to ';' or a blank. Copied into dst (cap bytes plus NUL), or skipped when dst is NULL.
 * 0, PR_EPARSE (unterminated, empty bare value, a quote inside one), PR_ETOOLARGE (only
 * for a value kept). */
static int param_value(const char **pp, char *dst, size_t cap, size_t *out_len) {
  const char *p = *pp;
  size_t n = 0;
  int rc = 0;
  if (*p == '"') {
    for (p++; *p != '"'; p++) {
      if (*p == '\\') p++;
      if (!*p) return PR_EPARSE;
      if (!dst) continue;
      if (n < cap) dst[n++] = *p;
      else rc = PR_ETOOLARGE;
    }
    p++;
  } else {
    for (; *p && *p != ';' && *p != ' ' && *p != '\t'; p++) {
      if (*p == '"') return PR_EPARSE;
      if (!dst) continue;
      if (n < cap) dst[n++] = *p;
      else rc = PR_ETOOLARGE;
    }
    if (p == *pp) return PR_EPARSE;
  }
  if (dst) dst[n] = '\0';
  *out_len = n;
  *pp = p;
  return rc;
}

/* "; name=value" pairs after a media type or disposition type. For each, fn gets the
 * name and returns where its value goes (NULL: parse and drop it) or sets *rc to refuse
 * it. 0, PR_EPARSE, PR_ETOOLARGE (then *which names the parameter). */
typedef char *(*param_dest_fn)(void *ctx, const char *name, size_t len, int *rc);

static int params(const char *p, param_dest_fn fn, void *ctx, size_t cap, const char **which) {
  *which = NULL;
  for (;;) {
    p = skip_ows(p);
    if (!*p) return 0;
    if (*p != ';') return PR_EPARSE;
    p = skip_ows(p + 1);
    if (!*p) return 0; /* a trailing ';' */
    const char *name = p;
    while (is_tchar(*p)) p++;
    size_t nlen = (size_t)(p - name);
    if (!nlen) return PR_EPARSE;
    p = skip_ows(p);
    if (*p != '=') return PR_EPARSE;
    p = skip_ows(p + 1);
    int rc = 0;
    char *dst = fn(ctx, name, nlen, &rc);
    if (rc) return rc;
    size_t vlen;
    rc = param_value(&p, dst, cap, &vlen);
    if (rc == PR_ETOOLARGE) *which = name;
    if (rc) return rc;
  }
}

typedef struct {
  char *boundary;
  int found;
} ct_ctx;

static char *ct_dest(void *ctx, const char *name, size_t len, int *rc) {
  ct_ctx *c = ctx;
  if (len != 8 || strncasecmp(name, "boundary", 8) != 0) return NULL;
  if (c->found++) *rc = PR_EPARSE;
  return c->boundary;
}

int pr_multipart_boundary(const char *content_type, char *out, size_t n) {
  static const char type[] = "multipart/form-data";
  char b[PR_MULTIPART_BOUNDARY_MAX + 1];
  ct_ctx c = {b, 0};
  const char *which;
  if (!content_type) return PR_EPARSE;
  const char *p = skip_ows(content_type);
  if (strncasecmp(p, type, sizeof(type) - 1) != 0) return PR_EPARSE;
  /* A longer boundary is as wrong as a malformed one: both are PR_EPARSE. */
  if (params(p + sizeof(type) - 1, ct_dest, &c, PR_MULTIPART_BOUNDARY_MAX, &which)) return PR_EPARSE;
  if (!c.found) return PR_EPARSE;
  size_t len = strlen(b);
  if (!boundary_ok(b, len)) return PR_EPARSE;
  if (n < len + 1) return PR_ETOOLARGE;
  memcpy(out, b, len + 1);
  return 0;
}

void pr_multipart_init(pr_multipart *m, const char *boundary, const pr_multipart_ops *ops,
                       void *ud) {
  memset(m, 0, offsetof(pr_multipart, line));
  m->line[0] = m->name[0] = m->filename[0] = m->ctype[0] = m->err[0] = '\0';
  m->ops = ops;
  m->ud = ud;
  m->state = ST_PREAMBLE;
  size_t blen = boundary ? strlen(boundary) : 0;
  if (!boundary_ok(boundary ? boundary : "", blen)) {
    fail(m, PR_EPARSE, "invalid boundary");
    return;
  }
  memcpy(m->delim, "\r\n--", 4);
  memcpy(m->delim + 4, boundary, blen + 1);
  m->dlen = 4 + blen;
  /* A body usually starts with "--boundary", without the CRLF that precedes every later
   * delimiter: pretend that CRLF was matched already (preamble bytes are dropped, so the
   * invented ones are never delivered). */
  m->k = m->held = 2;
}

static int emit(pr_multipart *m, const char *p, size_t n) {
  if (!n || m->state == ST_PREAMBLE) return 0;
  if (m->ops && m->ops->part_data && m->ops->part_data(m->ud, p, n))
    return fail(m, PR_ECLOSED, "stopped by the receiver");
  return 0;
}

/* The first n held bytes turned out to be data: deliver them (they are the start of the
 * delimiter, so they come from delim, and ext after it), before anything of the current
 * feed. */
static int emit_held(pr_multipart *m, size_t n) {
  int rc;
  m->held -= n;
  if (n > m->dlen) {
    if ((rc = emit(m, m->delim, m->dlen))) return rc;
    return emit(m, &m->ext, n - m->dlen);
  }
  return emit(m, m->delim, n);
}

/* Scans data[*pos..len) for a delimiter, delivering (ST_DATA) or counting (ST_PREAMBLE)
 * the bytes that are not part of one. Returns 0 at the end of data (a possible partial
 * delimiter held back), 1 when a delimiter was confirmed (*pos just past it, m->ext says
 * '\r' for another part, '-' for the end), or a negative code. Only '\r' starts the
 * delimiter and no later byte of it is '\r', so after a mismatch no suffix of the matched
 * bytes can start a delimiter: they are all data, and the scan goes on at the byte that
 * did not match. */
static int scan(pr_multipart *m, const char *data, size_t len, size_t *pos) {
  size_t i = *pos, run = i; /* data[run..) is not delivered yet */
  const size_t dl = m->dlen;
  int rc;
  while (i < len) {
    char c = data[i];
    if (m->k == 0) {
      const char *cr = memchr(data + i, '\r', len - i);
      if (!cr) {
        i = len;
        break;
      }
      i = (size_t)(cr - data) + 1;
      m->k = 1;
    } else if (m->k < dl) {
      if (c == m->delim[m->k]) {
        m->k++;
        i++;
      } else {
        if ((rc = emit_held(m, m->held))) return rc;
        m->k = 0;
      }
    } else if (m->k == dl) {
      if (c == '\r' || c == '-') {
        m->ext = c;
        m->k++;
        i++;
      } else if (c == '\n' && m->state == ST_PREAMBLE) {
        return fail(m, PR_EPARSE, "boundary line ends in a bare LF (CRLF required)");
      } else {
        if ((rc = emit_held(m, m->held))) return rc;
        m->k = 0;
      }
    } else if ((m->ext == '\r' && c == '\n') || (m->ext == '-' && c == '-')) {
      /* confirmed; the matched bytes of this feed are data[i - (k - held) .. i] */
      i++;
      size_t end = i - (m->k + 1 - m->held);
      if ((rc = emit(m, data + run, end - run))) return rc;
      m->k = m->held = 0;
      *pos = i;
      return 1;
    } else {
      /* "--boundary" then CR and no LF, or "-" and no second "-": all data (that CR
       * cannot begin a delimiter either, its next byte is no LF) */
      if ((rc = emit_held(m, m->held))) return rc;
      m->k = 0;
    }
  }
  /* What is matched so far stays back; the rest of this feed is delivered. */
  if ((rc = emit(m, data + run, len - (m->k - m->held) - run))) return rc;
  m->held = m->k;
  *pos = len;
  return 0;
}

static int begin_part(pr_multipart *m) {
  if (m->parts == PR_MULTIPART_MAX_PARTS)
    return fail_body(m, PR_ETOOLARGE, "more than %d parts", PR_MULTIPART_MAX_PARTS);
  m->parts++;
  m->state = ST_HEADERS;
  m->count = m->line_len = 0;
  m->has_disposition = m->has_ctype = m->has_name = m->has_filename = 0;
  m->name[0] = m->filename[0] = m->ctype[0] = '\0';
  return 0;
}

static char *cd_dest(void *ctx, const char *name, size_t len, int *rc) {
  pr_multipart *m = ctx;
  int *seen;
  char *dst;
  if (len == 4 && strncasecmp(name, "name", 4) == 0) {
    seen = &m->has_name;
    dst = m->name;
  } else if (len == 8 && strncasecmp(name, "filename", 8) == 0) {
    seen = &m->has_filename;
    dst = m->filename;
  } else {
    return NULL; /* filename* and the rest */
  }
  if ((*seen)++) *rc = fail(m, PR_EPARSE, "two %.*s parameters", (int)len, name);
  return dst;
}

static int disposition(pr_multipart *m, const char *v) {
  static const char type[] = "form-data";
  const char *which;
  if (m->has_disposition++) return fail(m, PR_EPARSE, "two Content-Disposition headers");
  const char *p = v;
  while (is_tchar(*p)) p++;
  if ((size_t)(p - v) != sizeof(type) - 1 || strncasecmp(v, type, sizeof(type) - 1) != 0)
    return fail(m, PR_EPARSE, "Content-Disposition is not form-data");
  int rc = params(p, cd_dest, m, PR_MULTIPART_VALUE_MAX, &which);
  if (rc == PR_ETOOLARGE)
    return fail(m, rc, "%s longer than %d bytes",
                strncasecmp(which, "name", 4) == 0 ? "name" : "filename", PR_MULTIPART_VALUE_MAX);
  if (rc && !m->rc) return fail(m, PR_EPARSE, "malformed Content-Disposition");
  return rc;
}

/* One complete header line, NUL-terminated in m->line; no control characters but tab. */
static int header_line(pr_multipart *m) {
  char *s = m->line;
  if (s[0] == ' ' || s[0] == '\t') return fail(m, PR_EPARSE, "folded header line");
  char *colon = strchr(s, ':');
  if (!colon || colon == s) return fail(m, PR_EPARSE, "malformed header line");
  for (char *p = s; p < colon; p++)
    if (!is_tchar(*p)) return fail(m, PR_EPARSE, "malformed header line");
  size_t nlen = (size_t)(colon - s);
  char *v = (char *)skip_ows(colon + 1);
  char *e = s + m->line_len;
  while (e > v && (e[-1] == ' ' || e[-1] == '\t')) e--;
  *e = '\0';
  if (nlen == 19 && strncasecmp(s, "Content-Disposition", nlen) == 0) return disposition(m, v);
  if (nlen == 12 && strncasecmp(s, "Content-Type", nlen) == 0) {
    if (m->has_ctype++) return fail(m, PR_EPARSE, "two Content-Type headers");
    size_t n = (size_t)(e - v);
    if (n > PR_MULTIPART_VALUE_MAX)
      return fail(m, PR_ETOOLARGE, "Content-Type longer than %d bytes", PR_MULTIPART_VALUE_MAX);
    memcpy(m->ctype, v, n + 1);
  }
  return 0;
}

static int headers_done(pr_multipart *m) {
  if (!m->has_disposition) return fail(m, PR_EPARSE, "no Content-Disposition header");
  if (!m->has_name) return fail(m, PR_EPARSE, "no name in Content-Disposition");
  if (!m->name[0]) return fail(m, PR_EPARSE, "empty name in Content-Disposition");
  m->state = ST_DATA;
  m->k = m->held = 0;
  if (m->ops && m->ops->part_begin &&
      m->ops->part_begin(m->ud, m->name, m->has_filename ? m->filename : NULL,
                         m->has_ctype ? m->ctype : NULL))
    return fail(m, PR_ECLOSED, "stopped by the receiver");
  return 0;
}

int pr_multipart_feed(pr_multipart *m, const char *data, size_t len) {
  size_t i = 0;
  int rc;
  if (m->rc) return m->rc;
  while (i < len) {
    switch (m->state) {
    case ST_PREAMBLE:
    case ST_DATA:
      if (m->state == ST_PREAMBLE) {
        /* The first delimiter line must end within the preamble's bound: checked at a
         * fixed offset of the body, so a body cut anywhere fails at the same byte. */
        size_t room = PR_MULTIPART_PREAMBLE_MAX + m->dlen + 2 - m->count, from = i;
        rc = scan(m, data, len - i > room ? i + room : len, &i);
        m->count += i - from;
        if (rc == 0 && m->count == PR_MULTIPART_PREAMBLE_MAX + m->dlen + 2)
          return fail_body(m, PR_ETOOLARGE, "more than %d bytes before the first boundary line",
                           PR_MULTIPART_PREAMBLE_MAX);
      } else {
        rc = scan(m, data, len, &i);
      }
      if (rc < 0) return rc;
      if (rc == 0) continue;
      if (m->state == ST_DATA && m->ops && m->ops->part_end && m->ops->part_end(m->ud))
        return fail(m, PR_ECLOSED, "stopped by the receiver");
      if (m->ext == '-') m->state = ST_EPILOGUE;
      else if ((rc = begin_part(m))) return rc;
      break;
    case ST_HEADERS:
    case ST_HEADER_LF: {
      char c = data[i++];
      if (++m->count > PR_MULTIPART_HEADERS_MAX)
        return fail(m, PR_ETOOLARGE, "headers longer than %d bytes", PR_MULTIPART_HEADERS_MAX);
      if (m->state == ST_HEADER_LF) {
        if (c != '\n') return fail(m, PR_EPARSE, "CR without LF in the headers");
        m->state = ST_HEADERS;
        if (m->line_len == 0) {
          if ((rc = headers_done(m))) return rc;
          break;
        }
        m->line[m->line_len] = '\0';
        if ((rc = header_line(m))) return rc;
        m->line_len = 0;
      } else if (c == '\r') {
        m->state = ST_HEADER_LF;
      } else if (c == '\n') {
        return fail(m, PR_EPARSE, "header line ends in a bare LF (CRLF required)");
      } else if (((unsigned char)c < 0x20 && c != '\t') || c == 0x7f) {
        return fail(m, PR_EPARSE, "control character in a header");
      } else if (m->line_len == PR_MULTIPART_LINE_MAX) {
        return fail(m, PR_ETOOLARGE, "header line longer than %d bytes", PR_MULTIPART_LINE_MAX);
      } else {
        m->line[m->line_len++] = c;
      }
      break;
    }
    default: /* ST_EPILOGUE */
      return 0;
    }
  }
  return 0;
}

int pr_multipart_finish(pr_multipart *m) {
  if (m->rc) return m->rc;
  switch (m->state) {
  case ST_EPILOGUE:
    return 0;
  case ST_PREAMBLE:
    return fail(m, PR_EPARSE, "no boundary line in the body");
  case ST_DATA:
    return fail(m, PR_EPARSE, "the body ends before the closing boundary");
  default:
    return fail(m, PR_EPARSE, "the body ends in the part's headers");
  }
}

const char *pr_multipart_error(const pr_multipart *m) {
  return m->err;
}
