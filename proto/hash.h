/* Hashing for in-memory lookup tables: SipHash-2-4 (OpenSSL's, through EVP_MAC) under a
 * key drawn at random once per process, so that ids a stranger chooses (a phone's id in a
 * heartbeat, an API key) cannot be made to collide: a table's lookups stay O(1) whatever
 * is put in it. Not for anything that leaves the process (the key changes at each start).
 * One process-wide context: call from one thread (the loop's). */
#ifndef PR_HASH_H
#define PR_HASH_H

#include <stddef.h>
#include <stdint.h>

/* SipHash-2-4 of the n bytes at p under the process's key. Never fails: should OpenSSL
 * lack SipHash, SHA-256 over the key and the bytes stands in (slower, as unpredictable). */
uint64_t pr_hash64(const void *p, size_t n);

/* The same under a given 16-byte key (tests check it against the reference vectors).
 * Returns 0, or -EIO when OpenSSL has no SipHash. */
int pr_siphash24(const unsigned char key[16], const void *p, size_t n, uint64_t *out);

#endif
