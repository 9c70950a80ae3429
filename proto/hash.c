/* SipHash-2-4 through OpenSSL's EVP_MAC; see hash.h. */
#include "hash.h"

#include <errno.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

/* The process's key and a context set up with it once; each hash re-initialises the
 * context from the key it keeps (EVP_MAC_init with no key), which costs no allocation. */
static struct {
  int ready;              /* 1: ctx usable; -1: no SipHash (the SHA-256 stand-in) */
  unsigned char key[16];
  EVP_MAC_CTX *ctx;
} g_hash;

static EVP_MAC_CTX *siphash_ctx(const unsigned char key[16]) {
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL);
  EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
  EVP_MAC_free(mac); /* the context holds its own reference */
  size_t size = 8;   /* SipHash-2-4's 64-bit output (OpenSSL's default is 128) */
  OSSL_PARAM params[] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size), OSSL_PARAM_END};
  if (ctx && EVP_MAC_init(ctx, key, 16, params) != 1) {
    EVP_MAC_CTX_free(ctx);
    ctx = NULL;
  }
  return ctx;
}

static int siphash_run(EVP_MAC_CTX *ctx, const unsigned char *key, const void *p, size_t n,
                       uint64_t *out) {
  unsigned char md[8];
  size_t len = 0;
  if (EVP_MAC_init(ctx, key, key ? 16 : 0, NULL) != 1 ||
      EVP_MAC_update(ctx, n ? p : (const void *)"", n) != 1 ||
      EVP_MAC_final(ctx, md, &len, sizeof(md)) != 1 || len != 8)
    return -EIO;
  /* the reference output is little-endian */
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | md[i];
  *out = v;
  return 0;
}

int pr_siphash24(const unsigned char key[16], const void *p, size_t n, uint64_t *out) {
  EVP_MAC_CTX *ctx = siphash_ctx(key);
  if (!ctx) return -EIO;
  int rc = siphash_run(ctx, key, p, n, out);
  EVP_MAC_CTX_free(ctx);
  return rc;
}

static void hash_init(void) {
  if (RAND_bytes(g_hash.key, sizeof(g_hash.key)) != 1) {
    /* no randomness: a key from the address space and the clock is still no one's guess
     * in advance, and the table works either way */
    uint64_t a = (uint64_t)(uintptr_t)&g_hash, b = (uint64_t)(uintptr_t)&hash_init;
    memcpy(g_hash.key, &a, 8);
    memcpy(g_hash.key + 8, &b, 8);
  }
  g_hash.ctx = siphash_ctx(g_hash.key);
  g_hash.ready = g_hash.ctx ? 1 : -1;
}

uint64_t pr_hash64(const void *p, size_t n) {
  if (!g_hash.ready) hash_init();
  uint64_t v;
  if (g_hash.ready > 0 && siphash_run(g_hash.ctx, NULL, p, n, &v) == 0) return v;
  /* the stand-in: SHA-256 over the key and the bytes */
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX *m = EVP_MD_CTX_new();
  v = 0;
  if (m && EVP_DigestInit_ex(m, EVP_sha256(), NULL) == 1 &&
      EVP_DigestUpdate(m, g_hash.key, sizeof(g_hash.key)) == 1 && EVP_DigestUpdate(m, p, n) == 1 &&
      EVP_DigestFinal_ex(m, md, &len) == 1 && len >= 8)
    memcpy(&v, md, 8);
  EVP_MD_CTX_free(m);
  return v;
}
