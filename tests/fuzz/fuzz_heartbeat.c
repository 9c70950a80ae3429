/* libFuzzer target: the heartbeat signature check (gw_heartbeat_verify) and the parsing
 * its handler does first. Input: "TIMESTAMP\nSIGNATURE\nBODY". A wrong signature must
 * never verify; the right one, computed here, must, in either case of hex digits. The
 * handler itself (gw_heartbeat_handle) needs a running server and is fuzzed only through
 * this path and pr_json_parse with the handler's depth limit. */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "heartbeat.h"
#include "json.h"

static const char secret[] = "fuzz-fleet-secret";

static void sign(const char *ts, const char *body, size_t len, char out[72], int upper) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int ml = 0;
  size_t tl = strlen(ts);
  unsigned char *msg = malloc(tl + 1 + len + 1);
  memcpy(msg, ts, tl);
  msg[tl] = '.';
  if (len) memcpy(msg + tl + 1, body, len);
  if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, tl + 1 + len, mac, &ml) || ml != 32)
    abort();
  free(msg);
  strcpy(out, "sha256=");
  for (int i = 0; i < 32; i++) snprintf(out + 7 + 2 * i, 3, upper ? "%02X" : "%02x", mac[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *p = (const char *)data, *end = p + size;
  const char *nl1 = memchr(p, '\n', size);
  if (!nl1) return 0;
  const char *nl2 = memchr(nl1 + 1, '\n', (size_t)(end - nl1 - 1));
  if (!nl2) return 0;
  char *ts = strndup(p, (size_t)(nl1 - p));
  char *sig = strndup(nl1 + 1, (size_t)(nl2 - nl1 - 1));
  size_t blen = (size_t)(end - nl2 - 1);
  char *body = malloc(blen ? blen : 1);
  memcpy(body, nl2 + 1, blen);

  char good[72], upper[72];
  sign(ts, body, blen, good, 0);
  sign(ts, body, blen, upper, 1);
  int v = gw_heartbeat_verify(secret, ts, body, blen, sig);
  /* only the right MAC verifies, in any case of its hex digits */
  if (v && strcasecmp(sig, good) != 0) abort();
  if (!gw_heartbeat_verify(secret, ts, body, blen, good)) abort();
  if (!gw_heartbeat_verify(secret, ts, body, blen, upper)) abort();
  if (blen) {
    body[0] ^= 1;
    if (gw_heartbeat_verify(secret, ts, body, blen, good)) abort();
    body[0] ^= 1;
  }
  if (gw_heartbeat_verify("other-secret", ts, body, blen, good)) abort();

  pr_json_err je;
  cJSON *o = pr_json_parse(body, blen, 16, &je);
  cJSON_Delete(o);
  free(ts);
  free(sig);
  free(body);
  return 0;
}
