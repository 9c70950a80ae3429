/* Server-side TLS contexts; see tls.h. */
#include "tls.h"

#include <stdio.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "err.h"

/* Mozilla's "intermediate" configuration (TLS 1.2 part; TLS 1.3 suites are OpenSSL's). */
static const char pr_tls12_ciphers[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384:DHE-RSA-CHACHA20-POLY1305";
static const char pr_tls13_suites[] =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

static void tls_err(char *err, size_t errn, const char *what, const char *file) {
  unsigned long e = ERR_get_error();
  char ebuf[256] = "";
  if (e) ERR_error_string_n(e, ebuf, sizeof(ebuf));
  snprintf(err, errn, "%s %s%s%s", what, file ? file : "", e ? ": " : "", ebuf);
  ERR_clear_error();
}

/* Only HTTP/1.1 is spoken: pick it when offered; otherwise go on without ALPN. */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg) {
  (void)ssl;
  (void)arg;
  for (unsigned int i = 0; i < inlen;) {
    unsigned int l = in[i];
    if (i + 1 + l > inlen) break;
    if (l == 8 && memcmp(in + i + 1, "http/1.1", 8) == 0) {
      *out = in + i + 1;
      *outlen = (unsigned char)l;
      return SSL_TLSEXT_ERR_OK;
    }
    i += 1 + l;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

/* ---- session ticket keys ------------------------------------------------------------- */

typedef struct ticket_key {
  unsigned char name[16]; /* sent in the clear in each ticket: which key sealed it */
  unsigned char aes[32];
  unsigned char hmac[32];
  int set;
} ticket_key;

/* [0] seals new tickets, [1] (the one before) only opens them. One loop per process. */
static ticket_key g_ticket[2];
static uint64_t g_ticket_gen;       /* keys made */
static uint64_t g_ticket_since_ms;  /* last rotation (or the timer's first call) */
static int g_ticket_timer_started;

static int ticket_key_new(ticket_key *k) {
  ticket_key n;
  if (RAND_bytes(n.name, sizeof(n.name)) != 1 || RAND_bytes(n.aes, sizeof(n.aes)) != 1 ||
      RAND_bytes(n.hmac, sizeof(n.hmac)) != 1) {
    OPENSSL_cleanse(&n, sizeof(n));
    ERR_clear_error();
    return -EIO;
  }
  n.set = 1;
  *k = n;
  OPENSSL_cleanse(&n, sizeof(n));
  g_ticket_gen++;
  return 0;
}

int pr_tls_ticket_rotate(void) {
  ticket_key next;
  int rc = ticket_key_new(&next);
  if (rc) return rc;
  OPENSSL_cleanse(&g_ticket[1], sizeof(g_ticket[1]));
  g_ticket[1] = g_ticket[0];
  g_ticket[0] = next;
  OPENSSL_cleanse(&next, sizeof(next));
  return 0;
}

int pr_tls_ticket_tick(uint64_t now_ms, uint64_t period_ms) {
  if (!g_ticket_timer_started) {
    g_ticket_timer_started = 1;
    g_ticket_since_ms = now_ms;
    return 0;
  }
  if (!period_ms || now_ms - g_ticket_since_ms < period_ms) return 0;
  g_ticket_since_ms = now_ms; /* a failure waits a period, not a tick, to try again */
  int rc = pr_tls_ticket_rotate();
  return rc ? rc : 1;
}

uint64_t pr_tls_ticket_generation(void) { return g_ticket_gen; }

/* OpenSSL asks for a key to seal a ticket (enc) or the key a ticket names (open):
 * 1 use it, 2 use it and send a fresh ticket (sealed by the previous key), 0 unknown
 * (a full handshake), -1 failure. */
static int ticket_key_cb(SSL *ssl, unsigned char *key_name, unsigned char *iv,
                         EVP_CIPHER_CTX *cctx, EVP_MAC_CTX *hctx, int enc) {
  (void)ssl;
  const ticket_key *k = NULL;
  int rc = 1;
  if (enc) {
    if (!g_ticket[0].set && ticket_key_new(&g_ticket[0])) return -1;
    k = &g_ticket[0];
    if (RAND_bytes(iv, EVP_CIPHER_get_iv_length(EVP_aes_256_cbc())) != 1) return -1;
    memcpy(key_name, k->name, sizeof(k->name));
  } else if (g_ticket[0].set && CRYPTO_memcmp(key_name, g_ticket[0].name, 16) == 0) {
    k = &g_ticket[0];
  } else if (g_ticket[1].set && CRYPTO_memcmp(key_name, g_ticket[1].name, 16) == 0) {
    k = &g_ticket[1];
    rc = 2;
  } else {
    return 0;
  }
  static char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, (void *)k->hmac, sizeof(k->hmac)),
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end(),
  };
  if (EVP_MAC_CTX_set_params(hctx, params) != 1) return -1;
  if (enc ? EVP_EncryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, k->aes, iv) != 1
          : EVP_DecryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, k->aes, iv) != 1)
    return -1;
  return rc;
}

SSL_CTX *pr_tls_server_ctx(const char *cert_file, const char *key_file, char *err, size_t errn) {
  ERR_clear_error();
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) {
    tls_err(err, errn, "cannot create a TLS context", NULL);
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  /* OpenSSL 3 refuses client-initiated renegotiation unless allowed; refuse all of it */
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_set_cipher_list(ctx, pr_tls12_ciphers) != 1 ||
      SSL_CTX_set_ciphersuites(ctx, pr_tls13_suites) != 1) {
    tls_err(err, errn, "cannot set the cipher list", NULL);
    SSL_CTX_free(ctx);
    return NULL;
  }
  SSL_CTX_set_dh_auto(ctx, 1);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
    tls_err(err, errn, "cannot load the certificate chain", cert_file);
    SSL_CTX_free(ctx);
    return NULL;
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1) {
    tls_err(err, errn, "cannot load the private key", key_file);
    SSL_CTX_free(ctx);
    return NULL;
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    tls_err(err, errn, "the private key does not match the certificate", key_file);
    SSL_CTX_free(ctx);
    return NULL;
  }
  static const unsigned char sid_ctx[] = "fleetgate";
  SSL_CTX_set_session_id_context(ctx, sid_ctx, sizeof(sid_ctx) - 1);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
  SSL_CTX_sess_set_cache_size(ctx, 20000);
  SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
  if (!g_ticket[0].set && ticket_key_new(&g_ticket[0])) {
    tls_err(err, errn, "cannot make a session ticket key", NULL);
    SSL_CTX_free(ctx);
    return NULL;
  }
  SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, ticket_key_cb);
  return ctx;
}
