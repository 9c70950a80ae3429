/* Sealed messages between gateways; see seal.h. */
#include "seal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "err.h"

#define SEAL_MAC_LEN 32
#define SEAL_HEAD_MAX (sizeof(GW_SEAL_TAG) + GW_SEAL_MAX_ID + 2 * 21 + 2 * SEAL_MAC_LEN + 8)

static int id_ok(const char *id) {
  size_t n = id ? strlen(id) : 0;
  if (n == 0 || n >= GW_SEAL_MAX_ID) return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)id[i] <= ' ' || (unsigned char)id[i] == 0x7f) return 0;
  return 1;
}

int gw_seal_init(gw_seal *s, const char *key, const char *self, double window_s) {
  memset(s, 0, sizeof(*s));
  if (!key || !*key || !id_ok(self)) return -EINVAL;
  s->key_len = strlen(key);
  s->key = malloc(s->key_len);
  if (!s->key) return -ENOMEM;
  memcpy(s->key, key, s->key_len);
  snprintf(s->self, sizeof(s->self), "%s", self);
  s->window_ms = (int64_t)(window_s * 1000);
  return 0;
}

void gw_seal_free(gw_seal *s) {
  if (s->key) OPENSSL_cleanse(s->key, s->key_len);
  free(s->key);
  memset(s, 0, sizeof(*s));
}

/* HMAC-SHA256(key, "fg1 CONTEXT FROM SEQ TS\n" payload), as lowercase hex. */
static int seal_mac(const gw_seal *s, const char *context, const char *from, uint64_t seq, int64_t ts,
                    const char *payload, size_t len, char hex[2 * SEAL_MAC_LEN + 1]) {
  int hl = snprintf(NULL, 0, GW_SEAL_TAG " %s %s %" PRIu64 " %" PRId64 "\n", context, from, seq, ts);
  if (hl < 0) return -EINVAL;
  unsigned char *msg = malloc((size_t)hl + 1 + len);
  if (!msg) return -ENOMEM;
  snprintf((char *)msg, (size_t)hl + 1, GW_SEAL_TAG " %s %s %" PRIu64 " %" PRId64 "\n", context, from, seq, ts);
  if (len) memcpy(msg + hl, payload, len);
  unsigned char mac[SEAL_MAC_LEN];
  size_t out_len = 0;
  unsigned char *ok = EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, s->key, s->key_len, msg, (size_t)hl + len, mac,
                                SEAL_MAC_LEN, &out_len);
  free(msg);
  if (!ok || out_len != SEAL_MAC_LEN) return PR_ETLS;
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < SEAL_MAC_LEN; i++) {
    hex[2 * i] = digits[mac[i] >> 4];
    hex[2 * i + 1] = digits[mac[i] & 15];
  }
  hex[2 * SEAL_MAC_LEN] = '\0';
  return 0;
}

int gw_seal_wrap(gw_seal *s, const char *context, int64_t now_ms, const char *payload, size_t len,
                 char **out, size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  uint64_t floor = now_ms > 0 ? (uint64_t)now_ms * 1000 : 0;
  s->seq = s->seq + 1 > floor ? s->seq + 1 : floor;
  char hex[2 * SEAL_MAC_LEN + 1];
  int rc = seal_mac(s, context, s->self, s->seq, now_ms, payload, len, hex);
  if (rc < 0) return rc;
  char head[SEAL_HEAD_MAX];
  int hl = snprintf(head, sizeof(head), GW_SEAL_TAG " %s %" PRIu64 " %" PRId64 " %s\n", s->self, s->seq, now_ms, hex);
  if (hl < 0 || (size_t)hl >= sizeof(head)) return -EINVAL;
  char *m = malloc((size_t)hl + len + 1);
  if (!m) return -ENOMEM;
  memcpy(m, head, (size_t)hl);
  if (len) memcpy(m + hl, payload, len);
  m[(size_t)hl + len] = '\0';
  *out = m;
  *out_len = (size_t)hl + len;
  return 0;
}

/* One space-separated field of the head: [p, end) up to the next ' ' (or '\n' for the
 * last); NULL when absent or empty. */
static const char *field(const char *p, const char *end, char stop, char *dst, size_t dstn) {
  const char *q = p;
  while (q < end && *q != stop && *q != ' ' && *q != '\n') q++;
  if (q == p || q >= end || *q != stop || (size_t)(q - p) >= dstn) return NULL;
  memcpy(dst, p, (size_t)(q - p));
  dst[q - p] = '\0';
  return q + 1;
}

static int parse_u64(const char *s, uint64_t *out) {
  if (!*s) return -1;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return -1;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *out = v;
  return 0;
}

static gw_seal_peer *peer_find(gw_seal *s, const char *id, int add, int64_t now_ms) {
  for (size_t i = 0; i < s->n_peers; i++)
    if (strcmp(s->peers[i].id, id) == 0) return &s->peers[i];
  if (!add) return NULL;
  gw_seal_peer *p;
  if (s->n_peers < GW_SEAL_PEERS) {
    p = &s->peers[s->n_peers++];
  } else { /* forget the sender heard from least recently: its old messages are stale by now */
    p = &s->peers[0];
    for (size_t i = 1; i < s->n_peers; i++)
      if (s->peers[i].used_ms < p->used_ms) p = &s->peers[i];
  }
  memset(p, 0, sizeof(*p));
  snprintf(p->id, sizeof(p->id), "%s", id);
  p->used_ms = now_ms;
  return p;
}

gw_seal_verdict gw_seal_open(gw_seal *s, const char *context, int64_t now_ms, int once, int64_t max_age_ms,
                             const char *msg, size_t len, const char **payload, size_t *plen,
                             char from[GW_SEAL_MAX_ID]) {
  *payload = NULL;
  *plen = 0;
  from[0] = '\0';
  const char *end = msg + len;
  const size_t tl = sizeof(GW_SEAL_TAG) - 1;
  if (!msg || len < tl + 1 || memcmp(msg, GW_SEAL_TAG " ", tl + 1) != 0) return GW_SEAL_FORMAT;
  char id[GW_SEAL_MAX_ID], seq_s[24], ts_s[24], mac[2 * SEAL_MAC_LEN + 2];
  const char *p = msg + tl + 1;
  if (!(p = field(p, end, ' ', id, sizeof(id))) || !(p = field(p, end, ' ', seq_s, sizeof(seq_s))) ||
      !(p = field(p, end, ' ', ts_s, sizeof(ts_s))) || !(p = field(p, end, '\n', mac, sizeof(mac))))
    return GW_SEAL_FORMAT;
  uint64_t seq, ts_u;
  int neg = ts_s[0] == '-';
  if (parse_u64(seq_s, &seq) < 0 || parse_u64(ts_s + neg, &ts_u) < 0 || ts_u > INT64_MAX ||
      strlen(mac) != 2 * SEAL_MAC_LEN || !id_ok(id))
    return GW_SEAL_FORMAT;
  int64_t ts = neg ? -(int64_t)ts_u : (int64_t)ts_u;
  char want[2 * SEAL_MAC_LEN + 1];
  if (seal_mac(s, context, id, seq, ts, p, (size_t)(end - p), want) < 0) return GW_SEAL_MAC;
  /* either case of hex compares the same; in constant time */
  for (size_t i = 0; mac[i]; i++)
    if (mac[i] >= 'A' && mac[i] <= 'F') mac[i] = (char)(mac[i] - 'A' + 'a');
  if (CRYPTO_memcmp(want, mac, 2 * SEAL_MAC_LEN) != 0) return GW_SEAL_MAC;
  snprintf(from, GW_SEAL_MAX_ID, "%s", id);
  *payload = p;
  *plen = (size_t)(end - p);
  int64_t oldest = now_ms - (once ? s->window_ms : max_age_ms);
  if (ts > now_ms + s->window_ms || ts < oldest) return GW_SEAL_STALE;
  if (!once) return GW_SEAL_OK; /* a stored value of our own counts too (a restart with the same id) */
  if (strcmp(id, s->self) == 0) return GW_SEAL_SELF;
  gw_seal_peer *peer = peer_find(s, id, 1, now_ms);
  if (seq <= peer->seq) return GW_SEAL_REPLAY;
  peer->seq = seq;
  peer->used_ms = now_ms;
  return GW_SEAL_OK;
}

const char *gw_seal_verdict_name(gw_seal_verdict v) {
  static const char *const names[GW_SEAL_N] = {"ok", "self", "format", "mac", "stale", "replay"};
  return v < GW_SEAL_N ? names[v] : "?";
}
