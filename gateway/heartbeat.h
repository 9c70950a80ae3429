/* POST /fleet/v1/heartbeat: agents announce themselves and report their state
 * (docs/protocol.md). Every heartbeat is signed by the phone's own Ed25519 key
 * (x-fleetgate-key-signature over TS "." BODY, the key itself in the body's `key`); the
 * first one for an id also needs the fleet secret's HMAC (x-fleetgate-signature), which
 * enrols the key: from then on the id is pinned to it (pins.h), and only that key may
 * speak for the id. Timestamps outside fleet.max_skew_s, and any timestamp not newer
 * than the last accepted one for the same id (replays), are refused with 401. */
#ifndef GW_HEARTBEAT_H
#define GW_HEARTBEAT_H

#include "gw.h"

/* A heartbeat as signed: what the gateway received, or what another gateway relayed. */
typedef struct gw_heartbeat_msg {
  const char *ts;         /* x-fleetgate-timestamp: decimal milliseconds */
  int64_t tsv;            /* its value */
  const char *fleet_sig;  /* x-fleetgate-signature ("sha256=HEX"); NULL: none */
  const char *key_sig;    /* x-fleetgate-key-signature ("ed25519=BASE64") */
  const char *body;
  size_t len;
} gw_heartbeat_msg;

/* What applying one came to. */
typedef struct gw_heartbeat_result {
  int status;             /* 0: accepted; 202: enrolment pending; else an HTTP error */
  const char *code;       /* error code, or NULL */
  char msg[600];
  gw_replica *r;          /* accepted: the replica it refreshed or registered */
  char id[65];            /* the id it names, once read ("" before) */
  char url[256];          /* the URL it names, once read (cut) */
  int member;             /* signed with the fleet secret or the id's pinned key: a phone
                             of the fleet, whose refusal operators are shown */
  int unfit;              /* a phone of the fleet reported that it cannot hold its model
                             (msg says why): listed, nothing registered */
  char instead[65];       /* ...and placement names a catalogue model it can hold ("":
                             none): answered, not listed (gw_placement_instead) */
} gw_heartbeat_result;

void gw_heartbeat_handle(gw_server *gw, pr_http_req *req, const char *request_id);
/* What can be checked of a heartbeat before its body (heartbeats enabled, the signature
 * headers present, the timestamp well-formed and within fleet.max_skew_s): 1 when req
 * was answered with the refusal, 0 to read the body. gw_heartbeat_handle checks the
 * same again, so a caller without the head hook loses nothing. */
int gw_heartbeat_head(gw_server *gw, pr_http_req *req, const char *request_id);
/* Verify m (signatures, pins, replays, caps) and register or refresh the phone it
 * describes. remote: relayed by another gateway through Redis (no rate limit per id;
 * its age may be up to the relay's life rather than fleet.max_skew_s). */
void gw_heartbeat_apply(gw_server *gw, const gw_heartbeat_msg *m, int remote, gw_heartbeat_result *out);
/* The timestamp's own checks (before the body): NULL with *tsv set, else the refusal's
 * code (401 either way): "invalid_timestamp" when ts is not positive decimal
 * milliseconds, "stale_timestamp" when it is further than max_skew_s from now_wall_ms
 * (either way). */
const char *gw_heartbeat_check_ts(const char *ts, int64_t now_wall_ms, double max_skew_s, int64_t *tsv);
/* Whether a signed heartbeat of tsv for r (NULL: not in the registry) at now may be
 * applied: 0; 401 when tsv is not newer than the last accepted one (a replay); 429 when
 * it comes sooner than a quarter of heartbeat_interval_s (at most 1 s) after the last
 * one accepted from the phone itself (relayed ones, remote, are not paced here). */
int gw_heartbeat_pace(const gw_config *c, const gw_replica *r, int64_t tsv, uint64_t now, int remote);
/* 1 when sig ("sha256=HEX", 64 hex digits, any case) is HMAC-SHA256(secret, ts "." body),
 * compared in constant time; else 0. pr_sign_verify (sign.h) as a yes or no. */
int gw_heartbeat_verify(const char *secret, const char *ts, const char *body, size_t len,
                        const char *sig);
/* The token a heartbeat-registered phone is called with: "fgr-" + hex HMAC-SHA256 of
 * its id and key under the gateways' token secret (gw_heartbeat_token_secret). Every
 * gateway of a fleet derives the same one; nothing stores it. */
int gw_heartbeat_phone_token(const gw_server *gw, const char *id, const char *key, char out[72]);
/* Choose that secret (at start and after a reload): fleet.replica_token_env's, else the
 * gateways' Redis key, else a random one kept in fleet.pins_file, else one for this
 * process. Never the fleet secret, which every phone holds. */
void gw_heartbeat_token_secret(gw_server *gw);
/* Judge r's device readings under the current config's scheduler.device (device.h):
 * its slot limit and slowdown, and held_back; an event and a log line when it starts
 * being held back, the kind of hold changes, or it ends. */
void gw_heartbeat_device(gw_server *gw, gw_replica *r);
/* Drop pins whose phones were silent past fleet.pin_ttl_s (from the tick). */
void gw_heartbeat_expire_pins(gw_server *gw);

#endif
