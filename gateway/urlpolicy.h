/* The URL policy (docs/security.md, "URL policy"): where the gateway may send callers'
 * prompts and replica tokens. A replica URL follows pr_url_base_check's rule (https://
 * unless upstream.allow_http); every connection the gateway makes to a replica is to an
 * ordinary public address, or to one inside upstream.allow_addresses, and never to one
 * of the gateway's own listeners. The address check runs where the connection is made
 * (the gate of the gateway's curl multi), so a name that resolves to loopback, or one
 * that changes its answer after it was registered, is caught too. */
#ifndef GW_URLPOLICY_H
#define GW_URLPOLICY_H

#include <stddef.h>
#include <sys/socket.h>

#include "config.h"
#include "ipnet.h"

/* Whether the gateway may connect to ip:port under c. Returns 0, or -EACCES with why
 * ("address 127.0.0.1 refused by upstream.allow_addresses (loopback)"). */
int gw_url_addr_check(const gw_config *c, const pr_ip *ip, int port, char *why, size_t n);
/* A replica URL offered at run time (a heartbeat): the URL rule under c->allow_http, and
 * when its host is an IP address, that address as above. Returns 0, or -EINVAL (the
 * rule) or -EACCES (the address) with why; *reason (when not NULL) is "url" or
 * "address", for metrics. */
int gw_url_check(const gw_config *c, const char *url, char *why, size_t n, const char **reason);
/* The gate of the gateway's curl multi (curlm.h): ud is the gw_server, and its current
 * configuration decides (a reload applies to the next connection). */
int gw_url_gate(void *ud, const struct sockaddr *sa, char *why, size_t n);

#endif
