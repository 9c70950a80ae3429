/* The bridge's JSON-RPC lines for the tunnel and the tunnel's key; see tunrpc.h. */
#include "tunrpc.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include "err.h"
#include "url.h"

#define TUNKEY_MAX_DER 512 /* a P-256 PKCS#8 key is about 138 bytes */

/* ---- requests ------------------------------------------------------------------------- */

static int emit(pr_buf *out, cJSON *req) {
  char *s = req ? cJSON_PrintUnformatted(req) : NULL;
  cJSON_Delete(req);
  if (!s) return -ENOMEM;
  int rc = pr_buf_append_str(out, s);
  if (rc == 0) rc = pr_buf_append(out, "\n", 1);
  OPENSSL_cleanse(s, strlen(s)); /* it may hold the key */
  free(s);
  return rc;
}

static cJSON *envelope(const char *method, int id, cJSON **params) {
  cJSON *req = cJSON_CreateObject();
  if (!req) return NULL;
  cJSON_AddStringToObject(req, "jsonrpc", "2.0");
  cJSON_AddStringToObject(req, "method", method);
  *params = cJSON_AddArrayToObject(req, "params");
  cJSON_AddNumberToObject(req, "id", id);
  if (!*params || !cJSON_GetObjectItemCaseSensitive(req, "id")) {
    cJSON_Delete(req);
    return NULL;
  }
  return req;
}

int ag_tunrpc_request(pr_buf *out, const char *method, int id) {
  cJSON *params;
  return emit(out, envelope(method, id, &params));
}

int ag_tunrpc_start_request(pr_buf *out, const ag_tunspec *spec, int id) {
  cJSON *params;
  cJSON *req = envelope("tunnel_start", id, &params);
  if (!req) return -ENOMEM;
  cJSON *s = cJSON_CreateObject();
  cJSON *addrs = s ? cJSON_AddArrayToObject(s, "serverAddrs") : NULL;
  int ok = s && addrs && cJSON_AddItemToArray(params, s);
  if (!ok) cJSON_Delete(s);
  for (size_t i = 0; ok && i < spec->n_relays; i++)
    ok = cJSON_AddItemToArray(addrs, cJSON_CreateString(spec->relays[i]));
  ok = ok && cJSON_AddStringToObject(s, "domainSuffix", spec->domain) &&
       cJSON_AddStringToObject(s, "localAddr", spec->local_addr);
  if (ok && spec->key_b64) {
    cJSON *k = cJSON_AddObjectToObject(s, "primaryKey");
    ok = k && cJSON_AddStringToObject(k, "algorithm", "Secp256r1") &&
         cJSON_AddStringToObject(k, "bytes", spec->key_b64);
  }
  ok = ok && cJSON_AddFalseToObject(s, "acmeStaging");
  if (!ok) {
    cJSON_Delete(req);
    return -ENOMEM;
  }
  return emit(out, req);
}

/* ---- answers -------------------------------------------------------------------------- */

/* why = a bounded, printable copy of fmt's text. */
static int junk(int rc, char *why, size_t n, const char *fmt, const char *arg) {
  char tmp[256];
  snprintf(tmp, sizeof(tmp), fmt, arg ? arg : "");
  size_t j = 0;
  for (size_t i = 0; tmp[i] && j + 1 < n; i++) why[j++] = isprint((unsigned char)tmp[i]) ? tmp[i] : '?';
  if (n) why[j] = '\0';
  return rc;
}

/* The answer's envelope: *result set to the result of request id. */
static int answer(const char *line, size_t len, int id, cJSON **root, const cJSON **result, char *why,
                  size_t wn) {
  *root = NULL;
  *result = NULL;
  while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
  if (len > AG_TUNRPC_MAX_LINE) return junk(PR_ETOOLARGE, why, wn, "answer longer than 64 KiB%s", NULL);
  if (len == 0) return junk(PR_EPARSE, why, wn, "empty answer%s", NULL);
  if (memchr(line, '\n', len)) return junk(PR_EPARSE, why, wn, "more than one line%s", NULL);
  cJSON *o = cJSON_ParseWithLength(line, len);
  if (!cJSON_IsObject(o)) {
    cJSON_Delete(o);
    return junk(PR_EPARSE, why, wn, "not a JSON object%s", NULL);
  }
  *root = o;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "jsonrpc");
  if (!cJSON_IsString(v) || strcmp(v->valuestring, "2.0") != 0)
    return junk(PR_EPARSE, why, wn, "not JSON-RPC 2.0%s", NULL);
  v = cJSON_GetObjectItemCaseSensitive(o, "id");
  if (!cJSON_IsNumber(v) || v->valuedouble != (double)id)
    return junk(PR_EPARSE, why, wn, "an answer to another request%s", NULL);
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "result");
  if (e && r) return junk(PR_EPARSE, why, wn, "both result and error%s", NULL);
  if (e) {
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : NULL;
    char msg[160];
    snprintf(msg, sizeof(msg), "%.150s", cJSON_IsString(m) ? m->valuestring : "(no message)");
    return junk(-EPROTO, why, wn, "the bridge answered an error: %s", msg);
  }
  if (!cJSON_IsObject(r)) return junk(r ? PR_ETYPE : PR_EMISSING, why, wn, "no result object%s", NULL);
  *result = r;
  return 0;
}

/* host ends in "." + domain (case-insensitive) with a non-empty label before it */
static int host_in_domain(const char *host, const char *domain) {
  size_t hl = strlen(host), dl = strlen(domain);
  return hl > dl + 1 && host[hl - dl - 1] == '.' && strcasecmp(host + hl - dl, domain) == 0;
}

int ag_tunrpc_parse_start(const char *line, size_t len, int id, const char *domain,
                          ag_tunnel_info *info, char *why, size_t wn) {
  cJSON *root;
  const cJSON *res;
  memset(info, 0, sizeof(*info));
  int rc = answer(line, len, id, &root, &res, why, wn);
  if (rc == 0) {
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(res, "url");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(res, "clientId");
    pr_url_base ub;
    const char *uwhy = NULL;
    if (!cJSON_IsString(u)) rc = junk(u ? PR_ETYPE : PR_EMISSING, why, wn, "no url string%s", NULL);
    else if (!cJSON_IsString(c)) rc = junk(c ? PR_ETYPE : PR_EMISSING, why, wn, "no clientId string%s", NULL);
    else if (strlen(u->valuestring) > AG_TUNRPC_URL_MAX) rc = junk(PR_ERANGE, why, wn, "url too long%s", NULL);
    else if (strncmp(u->valuestring, "https://", 8) != 0)
      rc = junk(PR_ERANGE, why, wn, "url is not https: '%.80s'", u->valuestring);
    else if (pr_url_base_check(u->valuestring, 0, &ub, &uwhy) < 0)
      rc = junk(PR_ERANGE, why, wn, "url refused: %s", uwhy);
    else if (ub.literal || !host_in_domain(ub.host, domain))
      rc = junk(PR_ERANGE, why, wn, "url is not under the tunnel's domain: '%.80s'", u->valuestring);
    else if (!c->valuestring[0] || strlen(c->valuestring) > AG_TUNRPC_ID_MAX ||
             strspn(c->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") !=
                 strlen(c->valuestring))
      rc = junk(PR_ERANGE, why, wn, "clientId is not a plain name%s", NULL);
    else {
      snprintf(info->url, sizeof(info->url), "%s", u->valuestring);
      snprintf(info->client_id, sizeof(info->client_id), "%s", c->valuestring);
      junk(0, why, wn, "ok%s", NULL);
    }
  }
  cJSON_Delete(root);
  return rc;
}

int ag_tunrpc_parse_status(const char *line, size_t len, int id, int *status, char *why, size_t wn) {
  cJSON *root;
  const cJSON *res;
  int rc = answer(line, len, id, &root, &res, why, wn);
  if (rc == 0) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(res, "status");
    if (!cJSON_IsNumber(s)) rc = junk(s ? PR_ETYPE : PR_EMISSING, why, wn, "no status number%s", NULL);
    else if (s->valuedouble != (double)(int)s->valuedouble || s->valuedouble < -1 || s->valuedouble > 3)
      rc = junk(PR_ERANGE, why, wn, "status out of range%s", NULL);
    else {
      *status = (int)s->valuedouble;
      junk(0, why, wn, "ok%s", NULL);
    }
  }
  cJSON_Delete(root);
  return rc;
}

int ag_tunrpc_parse_ok(const char *line, size_t len, int id, char *why, size_t wn) {
  cJSON *root;
  const cJSON *res;
  int rc = answer(line, len, id, &root, &res, why, wn);
  if (rc == 0) junk(0, why, wn, "ok%s", NULL);
  cJSON_Delete(root);
  return rc;
}

const char *ag_tunrpc_status_name(int status) {
  switch (status) {
    case AG_TUN_NONE: return "none";
    case AG_TUN_STARTING: return "starting";
    case AG_TUN_RUNNING: return "running";
    case AG_TUN_STOPPED: return "stopped";
    case AG_TUN_FAILED: return "failed";
    default: return "unknown";
  }
}

/* ---- settings ------------------------------------------------------------------------- */

static int dns_name(const char *s, size_t n) {
  if (n == 0 || n > 253) return 0;
  size_t label = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '.') {
      if (label == 0 || s[i - 1] == '-') return 0;
      label = 0;
    } else if (isalnum((unsigned char)c) || (c == '-' && label > 0)) {
      if (++label > 63) return 0;
    } else {
      return 0;
    }
  }
  return label > 0 && s[n - 1] != '-';
}

int ag_tunrpc_check_relay(const char *addr) {
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr) return -EINVAL;
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  if (errno || end == colon + 1 || *end || port < 1 || port > 65535) return -EINVAL;
  return dns_name(addr, (size_t)(colon - addr)) ? 0 : -EINVAL;
}

int ag_tunrpc_check_domain(const char *domain) {
  size_t n = strlen(domain);
  return n <= 200 && dns_name(domain, n) ? 0 : -EINVAL;
}

/* ---- the key -------------------------------------------------------------------------- */

static int key_encode(EVP_PKEY *pkey, char **out) {
  *out = NULL;
  PKCS8_PRIV_KEY_INFO *p8 = EVP_PKEY2PKCS8(pkey);
  unsigned char *der = NULL;
  int n = p8 ? i2d_PKCS8_PRIV_KEY_INFO(p8, &der) : -1;
  PKCS8_PRIV_KEY_INFO_free(p8);
  if (n <= 0) return PR_ETLS;
  char *b64 = malloc(((size_t)n + 2) / 3 * 4 + 1);
  if (b64) EVP_EncodeBlock((unsigned char *)b64, der, n);
  OPENSSL_clear_free(der, (size_t)n);
  if (!b64) return -ENOMEM;
  *out = b64;
  return 0;
}

static int is_p256(EVP_PKEY *pkey) {
  char name[64];
  size_t got = 0;
  return EVP_PKEY_is_a(pkey, "EC") &&
         EVP_PKEY_get_utf8_string_param(pkey, "group", name, sizeof(name), &got) == 1 &&
         (strcmp(name, "prime256v1") == 0 || strcmp(name, "P-256") == 0);
}

int ag_tunkey_from_text(const char *text, char **out) {
  *out = NULL;
  char b64[TUNKEY_MAX_DER * 2];
  size_t n = 0;
  for (const char *p = text; *p; p++) {
    if (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') continue;
    if (n + 1 >= sizeof(b64)) return PR_EPARSE;
    b64[n++] = *p;
  }
  if (n == 0 || n % 4) return PR_EPARSE;
  b64[n] = '\0';
  int pad = (b64[n - 1] == '=') + (n > 1 && b64[n - 2] == '=');
  if (strspn(b64, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") != n) return PR_EPARSE;
  unsigned char der[TUNKEY_MAX_DER * 2];
  int dn = EVP_DecodeBlock(der, (const unsigned char *)b64, (int)n);
  OPENSSL_cleanse(b64, sizeof(b64));
  dn -= pad;
  if (dn <= 0) return PR_EPARSE;
  const unsigned char *p = der;
  PKCS8_PRIV_KEY_INFO *p8 = d2i_PKCS8_PRIV_KEY_INFO(NULL, &p, dn);
  EVP_PKEY *pkey = p8 ? EVP_PKCS82PKEY(p8) : NULL;
  int whole = p == der + dn;
  PKCS8_PRIV_KEY_INFO_free(p8);
  OPENSSL_cleanse(der, sizeof(der));
  if (!pkey || !whole) {
    EVP_PKEY_free(pkey);
    return PR_EPARSE;
  }
  int rc = is_p256(pkey) ? key_encode(pkey, out) : PR_ETYPE;
  EVP_PKEY_free(pkey);
  return rc;
}

int ag_tunkey_generate(char **out) {
  *out = NULL;
  EVP_PKEY *pkey = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
  if (!pkey) return PR_ETLS;
  int rc = key_encode(pkey, out);
  EVP_PKEY_free(pkey);
  return rc;
}
