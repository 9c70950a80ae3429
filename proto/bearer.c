/* Bearer tokens; see bearer.h. */
#include "bearer.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "err.h"

const char *pr_bearer_token(const char *authorization) {
  static const char scheme[] = "Bearer";
  const size_t sl = sizeof(scheme) - 1;
  if (!authorization || strncasecmp(authorization, scheme, sl) != 0 || authorization[sl] != ' ')
    return NULL;
  const char *t = authorization + sl;
  while (*t == ' ') t++;
  return *t ? t : NULL;
}

static int digest(const char *s, unsigned char out[32]) {
  unsigned int len = 0;
  return EVP_Digest(s, strlen(s), out, &len, EVP_sha256(), NULL) == 1 && len == 32 ? 0 : PR_ETLS;
}

int pr_bearer_check(const char *authorization, const char *want) {
  const char *got = pr_bearer_token(authorization);
  if (!got) return PR_EMISSING;
  if (!want || !*want) return -EACCES;
  unsigned char a[32], b[32];
  /* a digest that fails lets nobody in (two failed digests must not compare equal) */
  if (digest(got, a) < 0 || digest(want, b) < 0) return -EACCES;
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0 ? 0 : -EACCES;
}
