/* Admin sessions for the status page in a browser: after one login with the admin token
 * (POST /admin/v1/session), the browser holds a cookie whose value is an expiry time, a
 * random nonce and an HMAC-SHA256 over both under a key derived from the admin token, never
 * the token itself. Nothing is stored: any gateway with the same token accepts it until it
 * expires, and changing the token ends every session. No I/O here (admin.c answers). */
#ifndef GW_SESSION_H
#define GW_SESSION_H

#include <stddef.h>
#include <stdint.h>

#define GW_SESSION_COOKIE "fleetgate_session"
/* "EXPIRY_MS.NONCE(32 hex).MAC(64 hex)" */
#define GW_SESSION_MAX 128

/* out = a new session value expiring at now_ms + ttl_s. Returns 0, or a negative code
 * (no token, no randomness, out too small). */
int gw_session_make(const char *token, int64_t now_ms, double ttl_s, char *out, size_t n);
/* 1 when the Cookie header `cookie` (may be NULL) carries a session value signed under
 * token that has not expired and does not reach further than ttl_s from now; else 0. */
int gw_session_valid(const char *token, const char *cookie, int64_t now_ms, double ttl_s);

#endif
