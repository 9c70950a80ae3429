/* Unit tests for proto/tls.c's session ticket keys: a ticket sealed by the current key
 * resumes; after one rotation it still resumes (the previous key opens it, and the
 * client gets a fresh ticket); after two it no longer does (a full handshake). And the
 * timer: nothing on its first call, a rotation once the period has passed. Handshakes
 * run in memory (two BIO pairs, no sockets) against a certificate made here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "tls.h"

static char g_dir[] = "/tmp/fg-test-tls-XXXXXX";
static char g_cert[64], g_key[64];

/* A self-signed P-256 certificate for "localhost" in g_dir. */
static int make_cert(void **state) {
  (void)state;
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_cert, sizeof(g_cert), "%s/cert.pem", g_dir);
  snprintf(g_key, sizeof(g_key), "%s/key.pem", g_dir);
  EVP_PKEY *pkey = EVP_EC_gen("P-256");
  X509 *x = X509_new();
  if (!pkey || !x) return -1;
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), 0);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, pkey);
  X509_NAME *name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1, -1, 0);
  X509_set_issuer_name(x, name);
  if (!X509_sign(x, pkey, EVP_sha256())) return -1;
  FILE *f = fopen(g_cert, "w");
  if (!f || PEM_write_X509(f, x) != 1) return -1;
  fclose(f);
  f = fopen(g_key, "w");
  if (!f || PEM_write_PrivateKey(f, pkey, NULL, NULL, 0, NULL, NULL) != 1) return -1;
  fclose(f);
  X509_free(x);
  EVP_PKEY_free(pkey);
  return 0;
}

static int remove_cert(void **state) {
  (void)state;
  unlink(g_cert);
  unlink(g_key);
  rmdir(g_dir);
  return 0;
}

/* One handshake offering `offer` (may be NULL); returns the session to offer next time
 * (the caller frees it) and whether this one resumed. */
static SSL_SESSION *handshake(SSL_CTX *sctx, SSL_CTX *cctx, SSL_SESSION *offer, int *reused) {
  SSL *s = SSL_new(sctx), *c = SSL_new(cctx);
  BIO *s_in = BIO_new(BIO_s_mem()), *s_out = BIO_new(BIO_s_mem());
  BIO *c_in = BIO_new(BIO_s_mem()), *c_out = BIO_new(BIO_s_mem());
  assert_non_null(s);
  assert_non_null(c);
  SSL_set_bio(s, s_in, s_out);
  SSL_set_bio(c, c_in, c_out);
  SSL_set_accept_state(s);
  SSL_set_connect_state(c);
  if (offer) assert_int_equal(SSL_set_session(c, offer), 1);
  char buf[16384];
  int s_done = 0, c_done = 0;
  for (int i = 0; i < 50 && !(s_done && c_done); i++) {
    if (!c_done) c_done = SSL_do_handshake(c) == 1;
    int n;
    while ((n = BIO_read(c_out, buf, sizeof(buf))) > 0) BIO_write(s_in, buf, n);
    if (!s_done) s_done = SSL_do_handshake(s) == 1;
    while ((n = BIO_read(s_out, buf, sizeof(buf))) > 0) BIO_write(c_in, buf, n);
  }
  assert_true(s_done && c_done);
  *reused = SSL_session_reused(c);
  SSL_SESSION *next = SSL_get1_session(c);
  /* a clean end: OpenSSL drops the session of a connection freed without one */
  SSL_set_shutdown(c, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
  SSL_set_shutdown(s, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
  SSL_free(s);
  SSL_free(c);
  return next;
}

static void tickets_survive_one_rotation_not_two(void **state) {
  (void)state;
  char err[256] = "";
  SSL_CTX *sctx = pr_tls_server_ctx(g_cert, g_key, err, sizeof(err));
  assert_non_null(sctx);
  /* resumption here is by ticket only: the server's session cache would hide the keys */
  SSL_CTX_set_session_cache_mode(sctx, SSL_SESS_CACHE_OFF);
  SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
  assert_non_null(cctx);
  /* TLS 1.2: the ticket comes within the handshake */
  SSL_CTX_set_max_proto_version(cctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(cctx, SSL_VERIFY_NONE, NULL);
  uint64_t gen = pr_tls_ticket_generation();
  assert_true(gen >= 1);
  int reused = -1;
  SSL_SESSION *t1 = handshake(sctx, cctx, NULL, &reused);
  assert_int_equal(reused, 0);
  assert_int_equal(SSL_SESSION_has_ticket(t1), 1);
  SSL_SESSION *t = handshake(sctx, cctx, t1, &reused);
  assert_int_equal(reused, 1); /* the current key opens it */
  SSL_SESSION_free(t);
  assert_int_equal(pr_tls_ticket_rotate(), 0);
  assert_int_equal(pr_tls_ticket_generation(), gen + 1);
  SSL_SESSION *t2 = handshake(sctx, cctx, t1, &reused);
  assert_int_equal(reused, 1); /* the previous key still opens it */
  assert_int_equal(pr_tls_ticket_rotate(), 0);
  t = handshake(sctx, cctx, t1, &reused);
  assert_int_equal(reused, 0); /* two rotations on: its key is gone */
  SSL_SESSION_free(t);
  /* the ticket renewed after the first rotation was sealed by the key now previous */
  t = handshake(sctx, cctx, t2, &reused);
  assert_int_equal(reused, 1);
  SSL_SESSION_free(t);
  SSL_SESSION_free(t1);
  SSL_SESSION_free(t2);
  /* a context made later (a reload) opens the tickets of the one before */
  SSL_CTX *sctx2 = pr_tls_server_ctx(g_cert, g_key, err, sizeof(err));
  assert_non_null(sctx2);
  SSL_CTX_set_session_cache_mode(sctx2, SSL_SESS_CACHE_OFF);
  t1 = handshake(sctx, cctx, NULL, &reused);
  t = handshake(sctx2, cctx, t1, &reused);
  assert_int_equal(reused, 1);
  SSL_SESSION_free(t);
  SSL_SESSION_free(t1);
  SSL_CTX_free(sctx2);
  SSL_CTX_free(sctx);
  SSL_CTX_free(cctx);
}

static void the_timer_rotates_once_a_period(void **state) {
  (void)state;
  uint64_t gen = pr_tls_ticket_generation();
  assert_int_equal(pr_tls_ticket_tick(1000, 5000), 0); /* first call: the period starts */
  assert_int_equal(pr_tls_ticket_tick(5999, 5000), 0);
  assert_int_equal(pr_tls_ticket_generation(), gen);
  assert_int_equal(pr_tls_ticket_tick(6000, 5000), 1);
  assert_int_equal(pr_tls_ticket_generation(), gen + 1);
  assert_int_equal(pr_tls_ticket_tick(6100, 5000), 0);
  assert_int_equal(pr_tls_ticket_tick(10999, 5000), 0);
  assert_int_equal(pr_tls_ticket_tick(11000, 5000), 1);
  assert_int_equal(pr_tls_ticket_tick(99000, 0), 0); /* period 0: never */
  assert_int_equal(pr_tls_ticket_generation(), gen + 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(tickets_survive_one_rotation_not_two),
      cmocka_unit_test(the_timer_rotates_once_a_period),
  };
  return cmocka_run_group_tests(tests, make_cert, remove_cert);
}
