/* The Acurast processor's bridge, as far as the tunnel goes: the JSON-RPC 2.0 lines the
 * agent sends on the bridge socket (tunnel_start, tunnel_status, tunnel_stop) and the
 * checks on what comes back, and the tunnel's P-256 key. Pure: no I/O, no libuv. The
 * bridge is trusted less than the gateway: every answer is bounded, typed and checked,
 * and a URL is taken only when it is https, follows pr_url_base_check and names the
 * asked-for domain. See docs/agent.md#tunnels. */
#ifndef AG_TUNRPC_H
#define AG_TUNRPC_H

#include <stddef.h>

#include "buf.h"

#define AG_TUNRPC_MAX_LINE 65536 /* a longer answer is refused */
#define AG_TUNRPC_MAX_RELAYS 8
#define AG_TUNRPC_URL_MAX 1024
#define AG_TUNRPC_ID_MAX 128     /* clientId */

/* tunnel_status's numbers, as the reference gives them. */
enum {
  AG_TUN_NONE = -1, AG_TUN_STARTING = 0, AG_TUN_RUNNING = 1, AG_TUN_STOPPED = 2, AG_TUN_FAILED = 3,
};

/* tunnel_start's spec (strings borrowed). */
typedef struct ag_tunspec {
  const char *relays[AG_TUNRPC_MAX_RELAYS]; /* serverAddrs, HOST:PORT */
  size_t n_relays;
  const char *domain;     /* domainSuffix */
  const char *local_addr; /* localAddr, HOST:PORT of the agent's listener */
  const char *key_b64;    /* primaryKey.bytes: base64 PKCS#8 DER (P-256); NULL: none */
} ag_tunspec;

/* What a tunnel_start answer gave. */
typedef struct ag_tunnel_info {
  char url[AG_TUNRPC_URL_MAX + 1];
  char client_id[AG_TUNRPC_ID_MAX + 1];
} ag_tunnel_info;

/* One request line (ending in '\n') into out: method with params [spec] (tunnel_start)
 * or [] (the others). Returns 0 or a negative code. */
int ag_tunrpc_start_request(pr_buf *out, const ag_tunspec *spec, int id);
int ag_tunrpc_request(pr_buf *out, const char *method, int id);

/* The answer line to request id (the trailing newline optional). 0: *info / *status
 * filled; PR_EPARSE, PR_ETYPE, PR_EMISSING, PR_ERANGE, PR_ETOOLARGE: junk; -EPROTO: the
 * bridge answered with an error. why (always filled) says what, bounded and printable. */
int ag_tunrpc_parse_start(const char *line, size_t len, int id, const char *domain,
                          ag_tunnel_info *info, char *why, size_t why_len);
int ag_tunrpc_parse_status(const char *line, size_t len, int id, int *status, char *why,
                           size_t why_len);
/* A generic answer (tunnel_stop): 0 when it is a result for id. */
int ag_tunrpc_parse_ok(const char *line, size_t len, int id, char *why, size_t why_len);

const char *ag_tunrpc_status_name(int status);

/* A relay's HOST:PORT as --tunnel-relay takes it: 0 or -EINVAL. */
int ag_tunrpc_check_relay(const char *addr);
/* A domain suffix: DNS labels, 1-200 characters. 0 or -EINVAL. */
int ag_tunrpc_check_domain(const char *domain);

/* The tunnel key. From text (base64 of PKCS#8 DER; whitespace ignored): *out is a
 * malloc'd canonical base64 of the same key; PR_EPARSE (not base64 PKCS#8), PR_ETYPE (not
 * a P-256 key). Made afresh: a new P-256 key, same form. The caller frees *out (it is
 * secret: OPENSSL_cleanse first). */
int ag_tunkey_from_text(const char *text, char **out);
int ag_tunkey_generate(char **out);

#endif
