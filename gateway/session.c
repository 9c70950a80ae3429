/* Admin session values, signed and expiring; see session.h. */
#include "session.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

/* The signing key: HMAC-SHA256(token, label), so the cookie's MAC never uses the token
 * directly and a session made for one purpose cannot be replayed as another. */
static int session_key(const char *token, unsigned char key[32]) {
  static const char label[] = "fleetgate admin session v1";
  unsigned int n = 32;
  return HMAC(EVP_sha256(), token, (int)strlen(token), (const unsigned char *)label,
              sizeof(label) - 1, key, &n) ? 0 : -EINVAL;
}

static int session_mac(const char *token, const char *msg, size_t len, char hex[65]) {
  unsigned char key[32], mac[32];
  unsigned int n = sizeof(mac);
  if (session_key(token, key)) return -EINVAL;
  unsigned char *ok = HMAC(EVP_sha256(), key, sizeof(key), (const unsigned char *)msg, len, mac, &n);
  OPENSSL_cleanse(key, sizeof(key));
  if (!ok) return -EINVAL;
  for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", mac[i]);
  return 0;
}

int gw_session_make(const char *token, int64_t now_ms, double ttl_s, char *out, size_t n) {
  if (!token || !*token || ttl_s <= 0) return -EINVAL;
  unsigned char rnd[16];
  if (RAND_bytes(rnd, sizeof(rnd)) != 1) return -EIO;
  char msg[64];
  int len = snprintf(msg, sizeof(msg), "%" PRId64 ".", now_ms + (int64_t)(ttl_s * 1000));
  for (unsigned i = 0; i < sizeof(rnd); i++) len += snprintf(msg + len, sizeof(msg) - (size_t)len, "%02x", rnd[i]);
  char mac[65];
  if (session_mac(token, msg, (size_t)len, mac)) return -EINVAL;
  if ((size_t)snprintf(out, n, "%s.%s", msg, mac) >= n) return -ENOSPC;
  return 0;
}

/* The value of cookie `name` in a Cookie header ("a=1; b=2"), copied into out; 0, or -1
 * when absent or too long. */
static int cookie_value(const char *cookie, const char *name, char *out, size_t n) {
  size_t nl = strlen(name);
  const char *p = cookie;
  while (p && *p) {
    while (*p == ' ' || *p == ';') p++;
    const char *end = strchr(p, ';');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
      size_t vl = len - nl - 1;
      while (vl && p[nl + 1 + vl - 1] == ' ') vl--;
      if (vl >= n) return -1;
      memcpy(out, p + nl + 1, vl);
      out[vl] = '\0';
      return 0;
    }
    p = end;
  }
  return -1;
}

/* The parts of a session value: "EXPIRY.NONCE.MAC". 0, or -1 when malformed. */
static int split_value(const char *v, int64_t *exp, const char **nonce, const char **mac) {
  const char *dot2 = strrchr(v, '.');
  if (!dot2 || strlen(dot2 + 1) != 64) return -1;
  char *end;
  errno = 0;
  long long e = strtoll(v, &end, 10);
  if (errno || end == v || *end != '.' || end + 1 + GW_SESSION_NONCE != dot2) return -1;
  *exp = e;
  *nonce = end + 1;
  *mac = dot2 + 1;
  return 0;
}

int gw_session_valid(const char *token, const char *cookie, int64_t now_ms, double ttl_s,
                     const gw_session_ended *ended) {
  char v[GW_SESSION_MAX];
  if (!token || !*token || !cookie || ttl_s <= 0) return 0;
  if (cookie_value(cookie, GW_SESSION_COOKIE, v, sizeof(v))) return 0;
  int64_t exp;
  const char *nonce, *given;
  if (split_value(v, &exp, &nonce, &given)) return 0;
  /* expired, or further out than the sessions this gateway hands out now */
  if (exp <= now_ms || exp > now_ms + (int64_t)(ttl_s * 1000) + 60000) return 0;
  char mac[65];
  if (session_mac(token, v, (size_t)(given - 1 - v), mac)) return 0;
  if (CRYPTO_memcmp(mac, given, 64) != 0) return 0;
  char id[GW_SESSION_NONCE + 1];
  memcpy(id, nonce, GW_SESSION_NONCE);
  id[GW_SESSION_NONCE] = '\0';
  return !ended || !gw_session_is_ended(ended, id, exp);
}

int gw_session_id(const char *cookie, char nonce[GW_SESSION_NONCE + 1], int64_t *exp_ms) {
  char v[GW_SESSION_MAX];
  const char *n, *mac;
  if (!cookie || cookie_value(cookie, GW_SESSION_COOKIE, v, sizeof(v)) || split_value(v, exp_ms, &n, &mac))
    return -1;
  memcpy(nonce, n, GW_SESSION_NONCE);
  nonce[GW_SESSION_NONCE] = '\0';
  return 0;
}

int gw_session_is_ended(const gw_session_ended *e, const char *nonce, int64_t exp_ms) {
  if (exp_ms <= e->floor_ms) return 1;
  for (size_t i = 0; i < e->n; i++)
    if (e->v[i].exp_ms == exp_ms && strcmp(e->v[i].nonce, nonce) == 0) return 1;
  return 0;
}

int gw_session_end(gw_session_ended *e, const char *nonce, int64_t exp_ms, int64_t now_ms) {
  if (strlen(nonce) != GW_SESSION_NONCE || strspn(nonce, "0123456789abcdef") != GW_SESSION_NONCE)
    return -EINVAL;
  size_t k = 0;
  for (size_t i = 0; i < e->n; i++) /* the expired ones leave */
    if (e->v[i].exp_ms > now_ms) e->v[k++] = e->v[i];
  e->n = k;
  if (exp_ms <= now_ms || gw_session_is_ended(e, nonce, exp_ms)) return 0;
  if (e->n == GW_SESSION_ENDED_MAX) {
    size_t first = 0;
    for (size_t i = 1; i < e->n; i++)
      if (e->v[i].exp_ms < e->v[first].exp_ms) first = i;
    if (e->v[first].exp_ms > e->floor_ms) e->floor_ms = e->v[first].exp_ms;
    e->v[first] = e->v[--e->n];
    /* whatever else the floor now covers needs no entry */
    k = 0;
    for (size_t i = 0; i < e->n; i++)
      if (e->v[i].exp_ms > e->floor_ms) e->v[k++] = e->v[i];
    e->n = k;
    if (exp_ms <= e->floor_ms) return 1;
  }
  memcpy(e->v[e->n].nonce, nonce, GW_SESSION_NONCE + 1);
  e->v[e->n].exp_ms = exp_ms;
  e->n++;
  return 1;
}
