/* TLS for the HTTP server layer: a server SSL_CTX set up the way a careful operator
 * would (TLS 1.2 and 1.3 only, Mozilla's "intermediate" cipher choice, ALPN http/1.1,
 * session resumption, no renegotiation or compression). Connections run OpenSSL over
 * memory BIOs inside http.c, so the socket stays libuv's. */
#ifndef PR_TLS_H
#define PR_TLS_H

#include <stddef.h>

#include <openssl/ssl.h>

/* Load a certificate chain (PEM: leaf first) and its private key. Returns a new
 * SSL_CTX (one reference, for the caller) or NULL with a message in err. */
SSL_CTX *pr_tls_server_ctx(const char *cert_file, const char *key_file, char *err, size_t errn);

#endif
