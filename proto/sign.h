/* Heartbeat signatures (docs/protocol.md): x-fleetgate-signature is "sha256=" and the
 * hex HMAC-SHA256, under the fleet secret, of the timestamp header, ".", and the body.
 * The agent signs and the gateway verifies with this one module. */
#ifndef PR_SIGN_H
#define PR_SIGN_H

#include <stddef.h>

#define PR_SIGN_PREFIX "sha256="
#define PR_SIGN_LEN 71 /* "sha256=" + 64 hex digits */

/* out = "sha256=" + lowercase hex HMAC-SHA256(secret, ts "." body[0..len)), NUL-ended.
 * body may be NULL when len is 0. Returns 0, -ENOMEM, or PR_ETLS when OpenSSL fails. */
int pr_sign_heartbeat(const char *secret, const char *ts, const char *body, size_t len,
                      char out[PR_SIGN_LEN + 1]);

/* 0 when sig is the signature pr_sign_heartbeat makes, its 64 hex digits in either case
 * (the prefix exactly "sha256="), compared in constant time; PR_EPARSE when sig is not
 * of that form, -EACCES when it is but does not match, -ENOMEM or PR_ETLS when the MAC
 * cannot be computed. */
int pr_sign_verify(const char *secret, const char *ts, const char *body, size_t len, const char *sig);

#endif
