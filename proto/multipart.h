/* A streaming multipart/form-data reader (RFC 7578 over RFC 2046) for uploads such as
 * POST /v1/files: bytes may be fed cut anywhere, part data is handed on in pieces as it
 * arrives (never a whole part in memory), and the reader is one fixed-size struct that
 * allocates nothing.
 *
 * Rules it keeps (what a sender must do, what is refused):
 * - Line endings are CRLF. A bare LF ending a part's header line, or the first boundary
 *   line, is PR_EPARSE; "\n--boundary" inside data is data. The SDKs, curl and browsers
 *   all send CRLF.
 * - A delimiter is CRLF "--" boundary followed by CRLF (another part) or "--" (the end);
 *   the first one may start the body without its CRLF. The same string followed by
 *   anything else is part data. Transport padding (RFC 2046 blanks after the boundary) is
 *   not taken: no form sender writes it.
 * - A preamble before the first boundary is skipped (at most PR_MULTIPART_PREAMBLE_MAX
 *   bytes); the epilogue after the closing boundary is ignored, however long.
 * - Each part needs Content-Disposition: form-data with a non-empty name="..."; its
 *   filename="..." and Content-Type are passed on when present. Parameter values are
 *   tokens or quoted strings; a quoted string's backslash escapes are undone (httpx writes
 *   a backslash as "\\"), percent escapes (WHATWG's %22 for a quote) are left as sent.
 *   filename*= (RFC 5987) is ignored: RFC 7578 says senders must not use it. Other
 *   parameters and other headers (Content-Transfer-Encoding included) are ignored; two
 *   Content-Disposition or Content-Type headers, or two name or filename parameters, are
 *   PR_EPARSE. Control characters (but tab) and folded lines in headers are PR_EPARSE.
 * - A part is reported as part_begin, part_data zero or more times (never with len 0),
 *   part_end. When the body breaks off or is refused, the last part gets no part_end:
 *   the caller discards what it wrote. */
#ifndef PR_MULTIPART_H
#define PR_MULTIPART_H

#include <stddef.h>

#define PR_MULTIPART_BOUNDARY_MAX 70   /* RFC 2046 */
#define PR_MULTIPART_MAX_PARTS 16
#define PR_MULTIPART_LINE_MAX 1024     /* one header line, without its CRLF */
#define PR_MULTIPART_HEADERS_MAX 8192  /* a part's header lines with their CRLFs */
#define PR_MULTIPART_VALUE_MAX 255     /* name, filename, Content-Type, in bytes */
#define PR_MULTIPART_PREAMBLE_MAX 1024 /* bytes before the first boundary line */

typedef struct pr_multipart_ops {
  /* A part's headers are complete. name: from Content-Disposition: form-data; name="..."
   * (required; a part without it is an error), filename: its filename="..." or NULL,
   * ctype: the part's Content-Type or NULL. The strings live until the next callback.
   * Return 0 to go on, anything else stops the reader (pr_multipart_feed then returns
   * PR_ECLOSED). A NULL callback counts as returning 0. */
  int (*part_begin)(void *ud, const char *name, const char *filename, const char *ctype);
  int (*part_data)(void *ud, const char *data, size_t len); /* same return rule */
  int (*part_end)(void *ud);                                 /* same return rule */
} pr_multipart_ops;

/* Embed it or put it on the stack; it holds no pointers to free. Fields are private. */
typedef struct pr_multipart {
  const pr_multipart_ops *ops;
  void *ud;
  int rc;        /* 0, or the error every later call returns */
  int state;
  int parts;     /* parts begun */
  size_t dlen;   /* strlen(delim) */
  size_t k;      /* bytes of the delimiter (then of its CRLF or "--") matched so far */
  size_t held;   /* of those, how many came in earlier feeds and are not delivered yet */
  char ext;      /* at k == dlen + 1: the byte after the boundary, '\r' or '-' */
  size_t count;  /* bytes read in the preamble state, or of the header block */
  size_t line_len;
  int has_disposition, has_ctype, has_name, has_filename;
  char delim[4 + PR_MULTIPART_BOUNDARY_MAX + 1]; /* "\r\n--" boundary */
  char line[PR_MULTIPART_LINE_MAX + 1];
  char name[PR_MULTIPART_VALUE_MAX + 1];
  char filename[PR_MULTIPART_VALUE_MAX + 1];
  char ctype[PR_MULTIPART_VALUE_MAX + 1];
  char err[96];
} pr_multipart;

/* The boundary of a Content-Type header value "multipart/form-data; boundary=..." (quoted
 * or not, case-insensitive type and parameter name, RFC 2046 chars, 1..70 long) into out
 * as a C string. 0, or PR_EPARSE (PR_ETOOLARGE when n < its length + 1; 71 always fits). */
int pr_multipart_boundary(const char *content_type, char *out, size_t n);
/* An invalid boundary makes every later call return PR_EPARSE. ops and ud are kept. */
void pr_multipart_init(pr_multipart *m, const char *boundary, const pr_multipart_ops *ops,
                       void *ud);
/* Feed bytes as they arrive (any split, including 1 byte at a time). 0, or a negative code
 * (PR_EPARSE malformed, PR_ETOOLARGE a bound passed, PR_ECLOSED a callback stopped it);
 * after an error every later call returns the same code. */
int pr_multipart_feed(pr_multipart *m, const char *data, size_t len);
/* The body ended: 0 when the closing boundary was seen (bytes after it, the epilogue, are
 * ignored), else PR_EPARSE (truncated). */
int pr_multipart_finish(pr_multipart *m);
/* What went wrong, in words fit for an API error message ("part 2: header line longer
 * than 1024 bytes"); "" when nothing did. */
const char *pr_multipart_error(const pr_multipart *m);

#endif
