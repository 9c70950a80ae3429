/* A phone's own identity key (docs/protocol.md, "Enrolment and per-phone keys"): an
 * Ed25519 key pair the agent holds and the gateway pins to the phone's id. The agent
 * signs every heartbeat with it ("timestamp.body", the same bytes the fleet secret's
 * HMAC covers); the gateway verifies against the public key it pinned. Public keys
 * travel as base64 of the 32 raw bytes (44 characters), signatures as "ed25519=" and
 * base64 of the 64 raw bytes. OpenSSL does the cryptography and the base64. */
#ifndef PR_IDKEY_H
#define PR_IDKEY_H

#include <stddef.h>

#define PR_IDKEY_PUB_LEN 44                 /* base64 of 32 bytes */
#define PR_IDKEY_SIG_PREFIX "ed25519="
#define PR_IDKEY_SIG_LEN (8 + 88)           /* prefix + base64 of 64 bytes */

typedef struct pr_idkey pr_idkey;

/* A fresh key pair from the system's random source. */
int pr_idkey_generate(pr_idkey **out);
/* Read a private key: PEM ("-----BEGIN PRIVATE KEY-----", as `openssl genpkey
 * -algorithm ed25519` writes it) or base64 of its PKCS#8 DER. Returns PR_EPARSE for
 * anything else, PR_ETYPE for a key that is not Ed25519. */
int pr_idkey_from_text(pr_idkey **out, const char *text, size_t len);
/* Load path; when it does not exist and create is set, generate a key and write it
 * there (PEM, mode 0600, created exclusively). err gets a sentence on failure. */
int pr_idkey_load_file(pr_idkey **out, const char *path, int create, char *err, size_t errn);
void pr_idkey_free(pr_idkey *k);

/* The public key, base64 (PR_IDKEY_PUB_LEN characters and a NUL). */
const char *pr_idkey_public(const pr_idkey *k);
/* out = "ed25519=" + base64 Ed25519(ts "." body). */
int pr_idkey_sign(const pr_idkey *k, const char *ts, const char *body, size_t len,
                  char out[PR_IDKEY_SIG_LEN + 1]);

/* 1 when pub is a well-formed public key (base64 of 32 bytes that OpenSSL takes). */
int pr_idkey_valid_public(const char *pub);
/* 0 when sig is pub's signature of ts "." body; PR_EPARSE when pub or sig is malformed,
 * -EACCES when it does not verify, -ENOMEM / PR_ETLS when it cannot be checked. */
int pr_idkey_verify(const char *pub, const char *ts, const char *body, size_t len, const char *sig);

#endif
