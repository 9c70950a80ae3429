/* PR_SKIP_GNUTLS_INIT: put once in a program's main.c. GnuTLS initialises itself when it
 * is loaded unless the program defines _gnutls_global_init_skip (gnutls.h's
 * GNUTLS_SKIP_GLOBAL_INIT). fleetgate never uses GnuTLS: Debian's libcurl speaks TLS
 * through OpenSSL and only pulls GnuTLS in through librtmp and libldap, whose protocols our
 * transfers do not allow (CURLOPT_PROTOCOLS_STR "http,https"). Skipping that
 * initialisation keeps about 1 MB of GnuTLS, p11-kit and libtasn1 memory out of every
 * process (docs/benchmarks.md, "Agent memory"). The executable must export the symbol so
 * the loader binds GnuTLS's call to it: see pr_export_args in meson.build. */
#ifndef PR_NOINIT_H
#define PR_NOINIT_H

#define PR_SKIP_GNUTLS_INIT                  \
  int _gnutls_global_init_skip(void);        \
  int _gnutls_global_init_skip(void) { return 1; }

#endif
