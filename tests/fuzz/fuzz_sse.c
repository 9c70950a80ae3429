/* libFuzzer target: the incremental SSE parser (pr_sse_feed). The first two bytes seed
 * the cuts; the rest is the stream, fed whole to one parser and in random pieces to
 * another. Both must deliver the same events (and the same error, if any). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sse.h"

typedef struct {
  uint64_t h;     /* running hash of everything delivered */
  size_t events;
  int stop_at;    /* callback returns non-zero at this event (0: never) */
} sink;

static uint64_t mix(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return (h ^ n) * 1099511628211ULL;
}

static int on_event(void *ud, const pr_sse_event *ev) {
  sink *s = ud;
  if (!ev->event || !ev->data || !ev->id || ev->data[ev->data_len] != '\0') abort();
  s->h = mix(s->h, ev->event, strlen(ev->event));
  s->h = mix(s->h, ev->data, ev->data_len);
  s->h = mix(s->h, ev->id, strlen(ev->id));
  s->events++;
  return s->stop_at && (int)s->events == s->stop_at ? 7 : 0;
}

static int on_comment(void *ud, const char *text, size_t len) {
  sink *s = ud;
  s->h = mix(s->h, "#", 1);
  s->h = mix(s->h, text, len);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  unsigned seed = data[0] | (unsigned)data[1] << 8;
  size_t max_event = 16 + (seed & 0x3ff);  /* small caps reach the too-large paths */
  int stop_at = (seed >> 10) & 7;
  data += 2;
  size -= 2;
  char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);

  sink a = {14695981039346656037ULL, 0, stop_at}, b = a;
  pr_sse_parser pa, pb;
  pr_sse_init(&pa, max_event, on_event, on_comment, &a);
  pr_sse_init(&pb, max_event, on_event, on_comment, &b);
  int ra = pr_sse_feed(&pa, copy, size);
  int rb = 0;
  uint32_t x = seed * 2654435761u + 1;
  for (size_t off = 0; off < size && rb == 0;) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    size_t n = 1 + x % 17;
    if (n > size - off) n = size - off;
    /* each piece in its own allocation: reads past a piece are caught */
    char *piece = malloc(n);
    memcpy(piece, copy + off, n);
    rb = pr_sse_feed(&pb, piece, n);
    free(piece);
    off += n;
  }
  if (ra != rb || (ra == 0 && (a.h != b.h || a.events != b.events))) abort();
  pr_sse_reset(&pa);
  (void)pr_sse_feed(&pa, "data: x\n\n", 9);
  pr_sse_free(&pa);
  pr_sse_free(&pb);
  free(copy);
  return 0;
}
