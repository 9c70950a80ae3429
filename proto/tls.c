/* Server-side TLS contexts; see tls.h. */
#include "tls.h"

#include <stdio.h>
#include <string.h>

#include <openssl/err.h>

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
  return ctx;
}
