/* Sealed messages between gateways through Redis (docs/scaling.md#sealed-messages): every
 * pub/sub message a gateway publishes and every value it stores for the others to act on
 * carries who sent it, a sequence number, a timestamp and an HMAC-SHA256 under the
 * gateways' shared key (redis.key_env), bound to the channel or key it was written to.
 * A message without a valid MAC, outside the time window, or (pub/sub) not newer than
 * the last one accepted from its sender is refused. Pure: no I/O, no clock of its own. */
#ifndef GW_SEAL_H
#define GW_SEAL_H

#include <stddef.h>
#include <stdint.h>

#define GW_SEAL_TAG "fg1"
#define GW_SEAL_MAX_ID 64   /* a gateway id, NUL included */
#define GW_SEAL_PEERS 256   /* senders whose last sequence number is remembered */

typedef enum gw_seal_verdict {
  GW_SEAL_OK = 0,
  GW_SEAL_SELF,      /* a valid pub/sub message of our own (echoed back): ignore quietly */
  GW_SEAL_FORMAT,    /* not an envelope at all (an unsealed or truncated message) */
  GW_SEAL_MAC,       /* the MAC does not match: another key, another context, a changed byte */
  GW_SEAL_STALE,     /* outside the time window */
  GW_SEAL_REPLAY,    /* pub/sub: not newer than the last accepted from that sender */
  GW_SEAL_N
} gw_seal_verdict;

typedef struct gw_seal_peer {
  char id[GW_SEAL_MAX_ID];
  uint64_t seq;       /* the highest sequence number accepted */
  int64_t used_ms;    /* when it was last updated (the oldest is forgotten first) */
} gw_seal_peer;

/* One gateway's sealing state. Owns a copy of the key (wiped on free). */
typedef struct gw_seal {
  unsigned char *key;
  size_t key_len;
  char self[GW_SEAL_MAX_ID];
  uint64_t seq;              /* the last sequence number sent */
  int64_t window_ms;
  gw_seal_peer peers[GW_SEAL_PEERS];
  size_t n_peers;
} gw_seal;

/* self: this gateway's id (1 - 63 bytes, no blank or control character). -EINVAL for a
 * bad id or an empty key, -ENOMEM. */
int gw_seal_init(gw_seal *s, const char *key, const char *self, double window_s);
void gw_seal_free(gw_seal *s);

/* out = "fg1 SELF SEQ TS MAC\n" payload: MAC is the hex HMAC-SHA256 of
 * "fg1 CONTEXT SELF SEQ TS\n" payload. context is the full channel or key name (a hash
 * field: "KEY FIELD"), so a sealed value is only good where it was written. Sequence
 * numbers grow strictly, from now_ms * 1000 at least (a restarted gateway goes on
 * above its old ones). *out is malloc'd, NUL-terminated. 0, -ENOMEM or PR_ETLS. */
int gw_seal_wrap(gw_seal *s, const char *context, int64_t now_ms, const char *payload, size_t len,
                 char **out, size_t *out_len);

/* Open msg written to context at (our) now_ms. once: a pub/sub message, which must be
 * newer than the last accepted from its sender and within the window either side of now;
 * otherwise a stored value, read again by design, which may be up to max_age_ms old (and
 * no more than the window ahead; our own count). On GW_SEAL_OK (and SELF), *payload and *plen point
 * into msg and from holds the sender's id; an accepted pub/sub message moves the
 * sender's sequence number on. */
gw_seal_verdict gw_seal_open(gw_seal *s, const char *context, int64_t now_ms, int once, int64_t max_age_ms,
                             const char *msg, size_t len, const char **payload, size_t *plen,
                             char from[GW_SEAL_MAX_ID]);

/* "ok", "self", "format", "mac", "stale", "replay" (the metric's reason label). */
const char *gw_seal_verdict_name(gw_seal_verdict v);

#endif
