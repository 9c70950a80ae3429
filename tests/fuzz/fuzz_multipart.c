/* libFuzzer target: the streaming multipart/form-data reader (pr_multipart_feed). The
 * first byte picks the boundary and a part_begin or part_end that stops the reader (one
 * in part_data is tested in tests/unit/test_multipart.c: where it stops depends on the
 * cuts), the second seeds the cuts; the rest is the body, read whole by one reader, in
 * random pieces by another and a byte at a time by a third (each piece its own
 * allocation). All three must report the same parts, data and error; each part's data,
 * followed by the delimiter, must be in the input; the bounds must hold. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "multipart.h"

/* A quoted-printable-looking one, the SDKs' two shapes, and one of dashes alone. */
static const char *const boundaries[] = {"b", "0d8a1f3e6b2c4a97", "----formdata-undici-0123", "--"};

typedef struct {
  const uint8_t *in; /* the body, to find each part's data in */
  size_t in_len;
  const char *delim; /* "\r\n--" boundary */
  uint64_t h;        /* running hash of everything delivered, however it was cut */
  int events, stop_at; /* part_begin or part_end number stop_at returns non-zero (0: never) */
  int begins, ends, in_part;
  size_t total;      /* data bytes of all parts */
  char *part;        /* this part's data so far (at most in_len bytes), and room for delim */
  size_t part_len;
} sink;

static uint64_t mix(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

static int on_begin(void *ud, const char *name, const char *filename, const char *ctype) {
  sink *s = ud;
  if (s->in_part || !name || !name[0] || strlen(name) > PR_MULTIPART_VALUE_MAX) abort();
  if (filename && strlen(filename) > PR_MULTIPART_VALUE_MAX) abort();
  if (ctype && strlen(ctype) > PR_MULTIPART_VALUE_MAX) abort();
  if (++s->begins > PR_MULTIPART_MAX_PARTS) abort();
  s->in_part = 1;
  s->part_len = 0;
  s->h = mix(s->h, "B", 1);
  s->h = mix(s->h, name, strlen(name) + 1);
  s->h = mix(s->h, filename ? filename : "\x01", filename ? strlen(filename) + 1 : 1);
  s->h = mix(s->h, ctype ? ctype : "\x01", ctype ? strlen(ctype) + 1 : 1);
  return ++s->events == s->stop_at;
}

static int on_data(void *ud, const char *data, size_t len) {
  sink *s = ud;
  if (!s->in_part || len == 0) abort();
  s->total += len;
  if (s->total > s->in_len) abort();
  memcpy(s->part + s->part_len, data, len);
  s->part_len += len;
  /* the pieces differ between readers; the bytes must not */
  s->h = mix(s->h, data, len);
  return 0;
}

/* The part's data followed by its delimiter is somewhere in the input. */
static int on_end(void *ud) {
  sink *s = ud;
  if (!s->in_part) abort();
  s->in_part = 0;
  s->ends++;
  size_t dl = strlen(s->delim);
  memcpy(s->part + s->part_len, s->delim, dl);
  if (!memmem(s->in, s->in_len, s->part, s->part_len + dl)) abort();
  s->h = mix(s->h, "E", 1);
  return ++s->events == s->stop_at;
}

static const pr_multipart_ops ops = {on_begin, on_data, on_end};

typedef struct {
  sink s;
  pr_multipart m;
  int rc;
} reader;

static void start(reader *r, const char *boundary, const char *delim, const uint8_t *in,
                  size_t len, int stop_at) {
  memset(&r->s, 0, sizeof(r->s));
  r->s.in = in;
  r->s.in_len = len;
  r->s.delim = delim;
  r->s.h = 14695981039346656037ULL;
  r->s.stop_at = stop_at;
  r->s.part = malloc(len + sizeof(((pr_multipart *)0)->delim));
  if (!r->s.part) abort();
  pr_multipart_init(&r->m, boundary, &ops, &r->s);
  r->rc = 0;
}

static void feed(reader *r, const char *p, size_t n) {
  if (r->rc) return;
  r->rc = pr_multipart_feed(&r->m, p, n);
  if (r->rc && r->rc != PR_EPARSE && r->rc != PR_ETOOLARGE && r->rc != PR_ECLOSED) abort();
}

static void end(reader *r) {
  if (!r->rc) r->rc = pr_multipart_finish(&r->m);
  if (r->rc && r->rc != PR_EPARSE && r->rc != PR_ETOOLARGE && r->rc != PR_ECLOSED) abort();
  /* errors are sticky and have words; success has none and ended every part */
  if ((r->rc != 0) != (pr_multipart_error(&r->m)[0] != '\0')) abort();
  if (r->rc && (pr_multipart_feed(&r->m, "x", 1) != r->rc || pr_multipart_finish(&r->m) != r->rc))
    abort();
  if (!r->rc && (r->s.in_part || r->s.begins != r->s.ends)) abort();
  if (r->rc == PR_ECLOSED && r->s.events != r->s.stop_at) abort();
}

static int same(const reader *a, const reader *b) {
  return a->rc == b->rc && a->s.h == b->s.h && a->s.events == b->s.events &&
         a->s.total == b->s.total && strcmp(pr_multipart_error(&a->m), pr_multipart_error(&b->m)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  const char *boundary = boundaries[data[0] & 3];
  int stop_at = (data[0] >> 2) & 7 ? ((data[0] >> 2) & 7) * 2 - 1 : 0;
  unsigned max_piece = 1u + ((unsigned)(data[0] >> 5) + 1) * 11;
  uint32_t x = data[1] * 2654435761u + 1;
  data += 2;
  size -= 2;
  char delim[4 + PR_MULTIPART_BOUNDARY_MAX + 1] = "\r\n--";
  strcat(delim, boundary);
  char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);

  reader whole, cut, bytes;
  start(&whole, boundary, delim, data, size, stop_at);
  feed(&whole, copy, size);
  end(&whole);

  start(&cut, boundary, delim, data, size, stop_at);
  for (size_t off = 0; off < size;) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    size_t n = x % max_piece; /* empty feeds too */
    if (n > size - off) n = size - off;
    char *piece = malloc(n ? n : 1);
    memcpy(piece, copy + off, n);
    feed(&cut, piece, n);
    free(piece);
    off += n;
  }
  end(&cut);

  start(&bytes, boundary, delim, data, size, stop_at);
  char *one = malloc(1);
  for (size_t off = 0; off < size && !bytes.rc; off++) {
    *one = copy[off];
    feed(&bytes, one, 1);
  }
  free(one);
  end(&bytes);

  if (!same(&whole, &cut) || !same(&whole, &bytes)) abort();
  free(whole.s.part);
  free(cut.s.part);
  free(bytes.s.part);
  free(copy);
  return 0;
}
