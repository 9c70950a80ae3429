/* Ed25519 identity keys; see idkey.h. */
#include "idkey.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "err.h"

#define IDKEY_RAW 32
#define IDKEY_SIGRAW 64
#define IDKEY_MAX_FILE 8192

/* Owned by its creator (pr_idkey_free). */
struct pr_idkey {
  EVP_PKEY *pkey;
  char pub[PR_IDKEY_PUB_LEN + 1];
};

/* Decode base64 of exactly n bytes, canonical form only (what EVP_EncodeBlock makes). */
static int b64_exact(const char *s, size_t slen, unsigned char *out, size_t n) {
  size_t want = 4 * ((n + 2) / 3);
  if (slen != want) return PR_EPARSE;
  unsigned char tmp[128];
  if (want / 4 * 3 > sizeof(tmp)) return PR_EPARSE;
  int got = EVP_DecodeBlock(tmp, (const unsigned char *)s, (int)slen);
  if (got < 0 || (size_t)got < n) return PR_EPARSE;
  /* EVP_DecodeBlock keeps the padding's zero bytes: re-encode to be sure of the form */
  char back[180];
  EVP_EncodeBlock((unsigned char *)back, tmp, (int)n);
  if (memcmp(back, s, slen) != 0) return PR_EPARSE;
  memcpy(out, tmp, n);
  OPENSSL_cleanse(tmp, sizeof(tmp));
  return 0;
}

static int idkey_wrap(pr_idkey **out, EVP_PKEY *pkey) {
  *out = NULL;
  if (EVP_PKEY_get_id(pkey) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(pkey);
    return PR_ETYPE;
  }
  unsigned char raw[IDKEY_RAW];
  size_t rl = sizeof(raw);
  pr_idkey *k = calloc(1, sizeof(*k));
  if (!k) {
    EVP_PKEY_free(pkey);
    return -ENOMEM;
  }
  if (EVP_PKEY_get_raw_public_key(pkey, raw, &rl) != 1 || rl != IDKEY_RAW) {
    EVP_PKEY_free(pkey);
    free(k);
    return PR_ETLS;
  }
  EVP_EncodeBlock((unsigned char *)k->pub, raw, IDKEY_RAW);
  k->pkey = pkey;
  *out = k;
  return 0;
}

int pr_idkey_generate(pr_idkey **out) {
  *out = NULL;
  EVP_PKEY *pkey = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
  if (!pkey) return PR_ETLS;
  return idkey_wrap(out, pkey);
}

int pr_idkey_from_text(pr_idkey **out, const char *text, size_t len) {
  *out = NULL;
  while (len && (*text == ' ' || *text == '\n' || *text == '\r' || *text == '\t')) text++, len--;
  while (len && (text[len - 1] == ' ' || text[len - 1] == '\n' || text[len - 1] == '\r' ||
                 text[len - 1] == '\t'))
    len--;
  if (len == 0 || len > IDKEY_MAX_FILE) return PR_EPARSE;
  EVP_PKEY *pkey = NULL;
  if (len > 10 && memcmp(text, "-----BEGIN", 10) == 0) {
    BIO *b = BIO_new_mem_buf(text, (int)len);
    if (!b) return -ENOMEM;
    pkey = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
    BIO_free(b);
  } else {
    /* base64 of PKCS#8 DER, on one line */
    unsigned char der[IDKEY_MAX_FILE];
    if (len % 4) return PR_EPARSE;
    int n = EVP_DecodeBlock(der, (const unsigned char *)text, (int)len);
    if (n <= 0) return PR_EPARSE;
    if (text[len - 1] == '=') n--;
    if (len > 1 && text[len - 2] == '=') n--;
    const unsigned char *p = der;
    PKCS8_PRIV_KEY_INFO *p8 = d2i_PKCS8_PRIV_KEY_INFO(NULL, &p, n);
    if (p8) {
      pkey = EVP_PKCS82PKEY(p8);
      PKCS8_PRIV_KEY_INFO_free(p8);
    }
    OPENSSL_cleanse(der, sizeof(der));
  }
  if (!pkey) return PR_EPARSE;
  return idkey_wrap(out, pkey);
}

static int idkey_write_new(const pr_idkey *k, const char *path, char *err, size_t errn) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(err, errn, "cannot create %s: %s", path, strerror(errno));
    return -errno;
  }
  BIO *b = BIO_new(BIO_s_mem());
  int ok = b && PEM_write_bio_PrivateKey(b, k->pkey, NULL, NULL, 0, NULL, NULL) == 1;
  char *data = NULL;
  long n = ok ? BIO_get_mem_data(b, &data) : 0;
  ok = ok && n > 0 && write(fd, data, (size_t)n) == (ssize_t)n;
  ok = fsync(fd) == 0 && ok;
  ok = close(fd) == 0 && ok;
  BIO_free(b);
  if (!ok) {
    snprintf(err, errn, "cannot write %s", path);
    unlink(path);
    return PR_ETLS;
  }
  return 0;
}

int pr_idkey_load_file(pr_idkey **out, const char *path, int create, char *err, size_t errn) {
  *out = NULL;
  FILE *f = fopen(path, "re");
  if (!f && errno == ENOENT && create) {
    pr_idkey *k = NULL;
    int rc = pr_idkey_generate(&k);
    if (rc < 0) {
      snprintf(err, errn, "cannot generate a key: %s", pr_strerror(rc));
      return rc;
    }
    rc = idkey_write_new(k, path, err, errn);
    if (rc < 0) {
      pr_idkey_free(k);
      return rc;
    }
    *out = k;
    return 0;
  }
  if (!f) {
    int e = errno;
    snprintf(err, errn, "cannot open %s: %s", path, strerror(e));
    return -e;
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077)) {
    fclose(f);
    snprintf(err, errn, "%s may be read by others (mode %03o): chmod 600 it", path,
             (unsigned)(st.st_mode & 0777));
    return -EPERM;
  }
  char buf[IDKEY_MAX_FILE + 1];
  size_t n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  if (n > IDKEY_MAX_FILE) {
    snprintf(err, errn, "%s is too large for a key", path);
    return PR_ETOOLARGE;
  }
  int rc = pr_idkey_from_text(out, buf, n);
  OPENSSL_cleanse(buf, sizeof(buf));
  if (rc < 0)
    snprintf(err, errn, "%s: %s", path,
             rc == PR_ETYPE ? "not an Ed25519 key" : "not a PEM or base64 PKCS#8 private key");
  return rc;
}

void pr_idkey_free(pr_idkey *k) {
  if (!k) return;
  EVP_PKEY_free(k->pkey);
  free(k);
}

const char *pr_idkey_public(const pr_idkey *k) { return k->pub; }

/* ts "." body, the bytes both signatures cover. */
static unsigned char *signed_bytes(const char *ts, const char *body, size_t len, size_t *n) {
  size_t tl = strlen(ts);
  unsigned char *msg = malloc(tl + 1 + len + 1);
  if (!msg) return NULL;
  memcpy(msg, ts, tl);
  msg[tl] = '.';
  if (len) memcpy(msg + tl + 1, body, len);
  *n = tl + 1 + len;
  return msg;
}

int pr_idkey_sign(const pr_idkey *k, const char *ts, const char *body, size_t len,
                  char out[PR_IDKEY_SIG_LEN + 1]) {
  size_t n;
  unsigned char *msg = signed_bytes(ts, body, len, &n);
  if (!msg) return -ENOMEM;
  unsigned char sig[IDKEY_SIGRAW];
  size_t sl = sizeof(sig);
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int ok = ctx && EVP_DigestSignInit(ctx, NULL, NULL, NULL, k->pkey) == 1 &&
           EVP_DigestSign(ctx, sig, &sl, msg, n) == 1 && sl == IDKEY_SIGRAW;
  EVP_MD_CTX_free(ctx);
  free(msg);
  if (!ok) return PR_ETLS;
  memcpy(out, PR_IDKEY_SIG_PREFIX, sizeof(PR_IDKEY_SIG_PREFIX) - 1);
  EVP_EncodeBlock((unsigned char *)out + sizeof(PR_IDKEY_SIG_PREFIX) - 1, sig, IDKEY_SIGRAW);
  out[PR_IDKEY_SIG_LEN] = '\0';
  return 0;
}

static EVP_PKEY *public_of(const char *pub) {
  unsigned char raw[IDKEY_RAW];
  if (!pub || b64_exact(pub, strlen(pub), raw, IDKEY_RAW) < 0) return NULL;
  return EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, raw, IDKEY_RAW);
}

int pr_idkey_valid_public(const char *pub) {
  EVP_PKEY *p = public_of(pub);
  EVP_PKEY_free(p);
  return p != NULL;
}

int pr_idkey_verify(const char *pub, const char *ts, const char *body, size_t len, const char *sig) {
  const size_t pl = sizeof(PR_IDKEY_SIG_PREFIX) - 1;
  unsigned char raw[IDKEY_SIGRAW];
  if (!sig || strncmp(sig, PR_IDKEY_SIG_PREFIX, pl) != 0 ||
      b64_exact(sig + pl, strlen(sig + pl), raw, IDKEY_SIGRAW) < 0)
    return PR_EPARSE;
  EVP_PKEY *pkey = public_of(pub);
  if (!pkey) return PR_EPARSE;
  size_t n;
  unsigned char *msg = signed_bytes(ts, body, len, &n);
  if (!msg) {
    EVP_PKEY_free(pkey);
    return -ENOMEM;
  }
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int rc = PR_ETLS;
  if (ctx && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, pkey) == 1)
    rc = EVP_DigestVerify(ctx, raw, IDKEY_SIGRAW, msg, n) == 1 ? 0 : -EACCES;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(pkey);
  free(msg);
  return rc;
}
