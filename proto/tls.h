/* TLS for the HTTP server layer: a server SSL_CTX set up the way a careful operator
 * would (TLS 1.2 and 1.3 only, Mozilla's "intermediate" cipher choice, ALPN http/1.1,
 * session resumption, no renegotiation or compression). Connections run OpenSSL over
 * memory BIOs inside http.c, so the socket stays libuv's.
 *
 * Session tickets are sealed with the process's own ticket keys (AES-256-CBC and
 * HMAC-SHA256, random, never written anywhere), shared by every context the process
 * makes, so a reload that loads renewed certificates does not end resumption. The
 * daemon rotates them on a timer (pr_tls_ticket_tick): a new key seals new tickets, the
 * previous one still opens tickets it sealed (and they are renewed), older ones are
 * gone, so a stolen key or a ticket opens at most two periods of sessions. */
#ifndef PR_TLS_H
#define PR_TLS_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

/* Load a certificate chain (PEM: leaf first) and its private key. Returns a new
 * SSL_CTX (one reference, for the caller) or NULL with a message in err. */
SSL_CTX *pr_tls_server_ctx(const char *cert_file, const char *key_file, char *err, size_t errn);

/* The ticket-key timer, called from the daemon's periodic tick with its clock (ms): the
 * first call starts the period; once period_ms has passed since the last rotation the
 * keys rotate. Returns 1 when they rotated now, 0 when not, a negative code when no new
 * key could be made (the old ones stay). */
int pr_tls_ticket_tick(uint64_t now_ms, uint64_t period_ms);
/* Rotate now: a new current key, the current one becomes the previous. 0 or negative. */
int pr_tls_ticket_rotate(void);
/* How many keys were made so far (1 after the first context; +1 per rotation). */
uint64_t pr_tls_ticket_generation(void);

#endif
