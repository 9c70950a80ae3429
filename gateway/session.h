/* Admin sessions for the status page in a browser: after one login with the admin token
 * (POST /admin/v1/session), the browser holds a cookie whose value is an expiry time, a
 * random nonce and an HMAC-SHA256 over both under a key derived from the admin token, never
 * the token itself. Any gateway with the same token accepts it until it expires, unless
 * it was ended there (a sign-out): each gateway keeps the sessions ended on it, a bounded
 * set, until they expire. Changing the token ends every session. No I/O here (admin.c
 * answers and keeps the set in data_dir). */
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
/* Sessions ended before their expiry (signed out), kept until they expire. Bounded: when
 * it is full, the session expiring first leaves it and `floor_ms` rises to its expiry,
 * so that every session expiring no later ends too (the oldest sessions, never one that
 * was ended coming back). */
#define GW_SESSION_ENDED_MAX 1024
#define GW_SESSION_NONCE 32 /* hex characters */
typedef struct gw_session_ended {
  struct {
    char nonce[GW_SESSION_NONCE + 1];
    int64_t exp_ms;
  } v[GW_SESSION_ENDED_MAX];
  size_t n;
  int64_t floor_ms;
} gw_session_ended;

/* 1 when the Cookie header `cookie` (may be NULL) carries a session value signed under
 * token that has not expired, does not reach further than ttl_s from now, and is not in
 * `ended` (may be NULL); else 0. */
int gw_session_valid(const char *token, const char *cookie, int64_t now_ms, double ttl_s,
                     const gw_session_ended *ended);
/* The nonce and expiry of the session value in `cookie`, unchecked (check it with
 * gw_session_valid first). 0, or -1 when there is none. */
int gw_session_id(const char *cookie, char nonce[GW_SESSION_NONCE + 1], int64_t *exp_ms);
/* End the session (nonce, exp_ms) on this gateway: 1 when it was added, 0 when it was
 * there already or has expired, -EINVAL for a malformed nonce. Expired entries leave. */
int gw_session_end(gw_session_ended *e, const char *nonce, int64_t exp_ms, int64_t now_ms);
/* 1 when the session (nonce, exp_ms) was ended here. */
int gw_session_is_ended(const gw_session_ended *e, const char *nonce, int64_t exp_ms);

#endif
