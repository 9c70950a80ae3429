/* libFuzzer target: the OpenAI request inspector (pr_oai_parse) on chat and completion
 * bodies. The first byte picks the endpoint; the rest is the body, not NUL-terminated.
 * A body that parses must render, take a new token cap and parse again the same way,
 * and what goes upstream must be valid UTF-8 (a phone's parser fails on anything else). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oai.h"

/* RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF. Written apart from
 * proto/oai.c's own check, so the two are not wrong the same way. */
static int utf8_valid(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!k || i + k > n) return 0;
    uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
    for (size_t j = 1; j < k; j++) {
      if ((s[i + j] & 0xc0) != 0x80) return 0;
      cp = cp << 6 | (s[i + j] & 0x3f);
    }
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    i += k;
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  pr_oai_kind kind = (data[0] & 1) ? PR_OAI_COMPLETION : PR_OAI_CHAT;
  /* a heap copy of exactly the body's length, so ASan sees any read past it */
  size_t n = size - 1;
  char *body = malloc(n ? n : 1);
  if (!body) return 0;
  memcpy(body, data + 1, n);
  pr_oai_req r;
  pr_oai_error err;
  memset(&err, 0, sizeof(err));
  int rc = pr_oai_parse(&r, kind, body, n, &err);
  if (rc < 0) {
    /* every refusal says why, in OpenAI's shape */
    if (err.status < 400 || err.status > 599 || !err.type || !err.message[0]) abort();
    pr_buf eb;
    pr_buf_init(&eb, 1 << 16);
    if (pr_oai_error_body(&eb, err.message, err.type, err.param, err.code) < 0) abort();
    pr_buf_free(&eb);
    pr_oai_free(&r);
    free(body);
    return 0;
  }
  if (!r.model || r.prompt_tokens < 1 || r.n_blocks > PR_OAI_MAX_BLOCKS) abort();
  pr_buf out;
  pr_buf_init(&out, (size_t)64 << 20);
  if (pr_oai_set_max_tokens(&r, 7) < 0 || r.max_tokens != 7) abort();
  if (pr_oai_render(&r, &out) < 0) abort();
  if (!utf8_valid((const unsigned char *)out.data, out.len)) abort();
  /* what goes upstream must be a request the inspector itself accepts, for the same
   * model and with the cap we set */
  pr_oai_req r2;
  pr_oai_error err2;
  if (pr_oai_parse(&r2, kind, out.data, out.len, &err2) < 0) abort();
  if (strcmp(r2.model, r.model) != 0 || r2.max_tokens != 7) abort();
  pr_oai_free(&r2);
  pr_buf_free(&out);
  pr_oai_free(&r);
  free(body);
  return 0;
}
