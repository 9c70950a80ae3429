/* Heartbeat signatures; see sign.h. */
#include "sign.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "err.h"

#define SIGN_MAC_LEN 32

/* HMAC-SHA256(secret, ts "." body) with OpenSSL 3's one-shot MAC: the message is put
 * together first, since EVP_Q_mac takes it in one piece (at most a 64 KiB heartbeat). */
static int sign_mac(const char *secret, const char *ts, const char *body, size_t len,
                    unsigned char mac[SIGN_MAC_LEN]) {
  size_t tl = strlen(ts);
  unsigned char *msg = malloc(tl + 1 + len + 1);
  if (!msg) return -ENOMEM;
  memcpy(msg, ts, tl);
  msg[tl] = '.';
  if (len) memcpy(msg + tl + 1, body, len);
  size_t out_len = 0;
  unsigned char *ok = EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, secret, strlen(secret), msg,
                                tl + 1 + len, mac, SIGN_MAC_LEN, &out_len);
  OPENSSL_cleanse(msg, tl + 1 + len);
  free(msg);
  return ok && out_len == SIGN_MAC_LEN ? 0 : PR_ETLS;
}

int pr_sign_heartbeat(const char *secret, const char *ts, const char *body, size_t len,
                      char out[PR_SIGN_LEN + 1]) {
  unsigned char mac[SIGN_MAC_LEN];
  int rc = sign_mac(secret, ts, body, len, mac);
  if (rc < 0) return rc;
  static const char hex[] = "0123456789abcdef";
  memcpy(out, PR_SIGN_PREFIX, sizeof(PR_SIGN_PREFIX) - 1);
  char *p = out + sizeof(PR_SIGN_PREFIX) - 1;
  for (size_t i = 0; i < SIGN_MAC_LEN; i++) {
    p[2 * i] = hex[mac[i] >> 4];
    p[2 * i + 1] = hex[mac[i] & 15];
  }
  out[PR_SIGN_LEN] = '\0';
  return 0;
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int pr_sign_verify(const char *secret, const char *ts, const char *body, size_t len, const char *sig) {
  const size_t pl = sizeof(PR_SIGN_PREFIX) - 1;
  if (!sig || strncmp(sig, PR_SIGN_PREFIX, pl) != 0 || strlen(sig) != PR_SIGN_LEN) return PR_EPARSE;
  /* the caller's digits decoded to bytes: either case of hex compares the same */
  unsigned char given[SIGN_MAC_LEN];
  for (size_t i = 0; i < SIGN_MAC_LEN; i++) {
    int hi = hex_value(sig[pl + 2 * i]), lo = hex_value(sig[pl + 2 * i + 1]);
    if (hi < 0 || lo < 0) return PR_EPARSE;
    given[i] = (unsigned char)(hi << 4 | lo);
  }
  unsigned char mac[SIGN_MAC_LEN];
  int rc = sign_mac(secret, ts, body, len, mac);
  if (rc < 0) return rc;
  return CRYPTO_memcmp(mac, given, SIGN_MAC_LEN) == 0 ? 0 : -EACCES;
}
