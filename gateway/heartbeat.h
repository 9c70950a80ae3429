/* POST /fleet/v1/heartbeat: agents announce themselves and report their state. The
 * body is signed: x-fleetgate-signature: sha256=HEX(HMAC-SHA256(secret, TS "." BODY))
 * with x-fleetgate-timestamp: TS (milliseconds since the epoch). Timestamps outside
 * fleet.max_skew_s, and any timestamp not newer than the last accepted one for the same
 * id (replays), are refused with 401. See docs/protocol.md. */
#ifndef GW_HEARTBEAT_H
#define GW_HEARTBEAT_H

#include "gw.h"

void gw_heartbeat_handle(gw_server *gw, pr_http_req *req, const char *request_id);
/* Register or refresh the phone a verified heartbeat describes (ts: its signed
 * timestamp; remote: relayed by another gateway through Redis). Returns 0 with *out set,
 * or an HTTP status with code and msg. */
int gw_heartbeat_apply(gw_server *gw, const char *body, size_t len, int64_t ts, int remote,
                       gw_replica **out, const char **code, char *msg, size_t msgn);
/* 1 when sig ("sha256=HEX", 64 hex digits, any case) is HMAC-SHA256(secret, ts "." body),
 * compared in constant time; else 0. pr_sign_verify (sign.h) as a yes or no. */
int gw_heartbeat_verify(const char *secret, const char *ts, const char *body, size_t len,
                        const char *sig);

#endif
