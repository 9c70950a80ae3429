/* IP addresses as the outgoing-connection policy sees them: ranges written as CIDRs
 * ("127.0.0.0/8", "::1/128"), and the special-purpose classes an address may belong to
 * (loopback, private, link-local...), so a gateway can refuse to connect where a public
 * URL should never lead. Pure: no I/O, no DNS. An IPv4 address written inside IPv6
 * (::ffff:127.0.0.1, and the NAT64 and 6to4 forms) is judged as the IPv4 address it
 * reaches. */
#ifndef PR_IPNET_H
#define PR_IPNET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* A range: family AF_INET (the first 4 bytes of addr) or AF_INET6, and a prefix length. */
typedef struct pr_ipnet {
  int family;
  uint8_t addr[16];
  int prefix;
} pr_ipnet;

/* An address without its port: family and 4 or 16 bytes. */
typedef struct pr_ip {
  int family;
  uint8_t addr[16];
} pr_ip;

/* Parse "ADDR/LEN" (or a bare address: /32, /128). Host bits must be zero
 * ("10.0.0.1/8" is refused: it reads like a mistake). Returns 0, or -EINVAL with *why
 * (when why is not NULL) a static phrase for config messages. */
int pr_ipnet_parse(const char *s, pr_ipnet *out, const char **why);
/* The address of a sockaddr (AF_INET or AF_INET6); -EAFNOSUPPORT for others. */
int pr_ip_from_sockaddr(const struct sockaddr *sa, pr_ip *out);
/* A literal address ("10.0.0.7", "::1", without brackets); -EINVAL when s is not one. */
int pr_ip_parse(const char *s, pr_ip *out);
/* The IPv4 address an IPv6 one stands for (IPv4-mapped ::ffff:a.b.c.d, IPv4-compatible
 * ::a.b.c.d, NAT64 64:ff9b::a.b.c.d, 6to4 2002:AABB:CCDD::): 1 with *v4 set, else 0. */
int pr_ip_embedded_v4(const pr_ip *ip, pr_ip *v4);
/* 1 when ip lies in n. An IPv6 address with an embedded IPv4 one (above) also matches
 * an IPv4 range holding that address, so "127.0.0.0/8" covers ::ffff:127.0.0.1. */
int pr_ipnet_contains(const pr_ipnet *n, const pr_ip *ip);
/* The special-purpose class of ip, or NULL for a globally reachable unicast address
 * (IANA's IPv4 and IPv6 special-purpose registries): "unspecified" (0.0.0.0/8, ::),
 * "loopback" (127/8, ::1), "private" (10/8, 172.16/12, 192.168/16, fc00::/7,
 * fec0::/10), "shared" (100.64/10, carrier-grade NAT), "link-local" (169.254/16,
 * fe80::/10), "multicast" (224/4, ff00::/8), "broadcast" (255.255.255.255),
 * "nat64-local" (64:ff9b:1::/48), "protocol" (192.0.0.0/24, 2001::/23, but for their
 * globally reachable entries), "benchmarking" (198.18/15, 2001:2::/48), "documentation"
 * (192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20), "reserved"
 * (240/4, 192.88.99/24, IPv6 outside 2000::/3, and IPv4-mapped or -compatible forms of
 * public IPv4 addresses, which no public URL needs). Other embedded IPv4 addresses
 * (above) are classified as the IPv4 address. */
const char *pr_ip_class(const pr_ip *ip);
/* ip as text ("127.0.0.1", "::1"); out holds at least 46 bytes. */
void pr_ip_format(const pr_ip *ip, char *out, size_t n);

#endif
