/* Address ranges and special-purpose address classes; see ipnet.h. */
#include "ipnet.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char **why, const char *msg) {
  if (why) *why = msg;
  return -EINVAL;
}

int pr_ip_parse(const char *s, pr_ip *out) {
  memset(out, 0, sizeof(*out));
  if (inet_pton(AF_INET, s, out->addr) == 1) {
    out->family = AF_INET;
    return 0;
  }
  if (inet_pton(AF_INET6, s, out->addr) == 1) {
    out->family = AF_INET6;
    return 0;
  }
  return -EINVAL;
}

int pr_ip_from_sockaddr(const struct sockaddr *sa, pr_ip *out) {
  memset(out, 0, sizeof(*out));
  if (sa->sa_family == AF_INET) {
    out->family = AF_INET;
    memcpy(out->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    return 0;
  }
  if (sa->sa_family == AF_INET6) {
    out->family = AF_INET6;
    memcpy(out->addr, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    return 0;
  }
  return -EAFNOSUPPORT;
}

int pr_ipnet_parse(const char *s, pr_ipnet *out, const char **why) {
  static const char bad[] = "expected an IPv4 or IPv6 range as ADDRESS/LENGTH, e.g. "
                            "\"127.0.0.0/8\" or \"::1/128\"";
  memset(out, 0, sizeof(*out));
  char host[64];
  const char *slash = strchr(s, '/');
  size_t hl = slash ? (size_t)(slash - s) : strlen(s);
  if (hl == 0 || hl >= sizeof(host)) return fail(why, bad);
  memcpy(host, s, hl);
  host[hl] = '\0';
  pr_ip ip;
  if (pr_ip_parse(host, &ip) < 0) return fail(why, bad);
  int max = ip.family == AF_INET ? 32 : 128;
  long len = max;
  if (slash) {
    const char *d = slash + 1;
    char *end;
    if (*d < '0' || *d > '9' || strlen(d) > 3) return fail(why, bad);
    len = strtol(d, &end, 10);
    if (*end || len < 0 || len > max)
      return fail(why, ip.family == AF_INET ? "an IPv4 prefix length is 0 to 32"
                                            : "an IPv6 prefix length is 0 to 128");
  }
  for (int bit = (int)len; bit < max; bit++)
    if (ip.addr[bit / 8] & (0x80 >> (bit % 8)))
      return fail(why, "the address has bits set past the prefix length (write the "
                       "range's first address, e.g. 10.0.0.0/8)");
  out->family = ip.family;
  memcpy(out->addr, ip.addr, sizeof(out->addr));
  out->prefix = (int)len;
  return 0;
}

static int prefix_match(const uint8_t *a, const uint8_t *b, int bits) {
  int full = bits / 8, rest = bits % 8;
  if (memcmp(a, b, (size_t)full) != 0) return 0;
  if (!rest) return 1;
  uint8_t mask = (uint8_t)(0xff << (8 - rest));
  return (a[full] & mask) == (b[full] & mask);
}

int pr_ip_embedded_v4(const pr_ip *ip, pr_ip *v4) {
  if (ip->family != AF_INET6) return 0;
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static const uint8_t compat[12] = {0};
  static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t *from = NULL;
  if (memcmp(ip->addr, mapped, 12) == 0 || memcmp(ip->addr, nat64, 12) == 0) {
    from = ip->addr + 12;
  } else if (memcmp(ip->addr, compat, 12) == 0) {
    /* :: and ::1 are IPv6's own, not IPv4-compatible addresses */
    static const uint8_t z[4] = {0};
    static const uint8_t one[4] = {0, 0, 0, 1};
    if (memcmp(ip->addr + 12, z, 4) == 0 || memcmp(ip->addr + 12, one, 4) == 0) return 0;
    from = ip->addr + 12;
  } else if (ip->addr[0] == 0x20 && ip->addr[1] == 0x02) {
    from = ip->addr + 2; /* 6to4: 2002:AABB:CCDD::/48 */
  }
  if (!from) return 0;
  memset(v4, 0, sizeof(*v4));
  v4->family = AF_INET;
  memcpy(v4->addr, from, 4);
  return 1;
}

int pr_ipnet_contains(const pr_ipnet *n, const pr_ip *ip) {
  if (n->family == ip->family) return prefix_match(n->addr, ip->addr, n->prefix);
  pr_ip v4;
  if (n->family == AF_INET && pr_ip_embedded_v4(ip, &v4))
    return prefix_match(n->addr, v4.addr, n->prefix);
  return 0;
}

typedef struct ip_range {
  uint8_t addr[16];
  int prefix;
  const char *cls; /* GLOBAL: a globally reachable exception inside a later range */
} ip_range;

static const char GLOBAL[] = "";

/* IANA's special-purpose address registries (RFC 6890 and its updates), what is not
 * globally reachable. In order: the first match wins (exceptions and broadcast first). */
static const ip_range v4_ranges[] = {
    {{0}, 8, "unspecified"},
    {{127}, 8, "loopback"},
    {{10}, 8, "private"},
    {{172, 16}, 12, "private"},
    {{192, 168}, 16, "private"},
    {{100, 64}, 10, "shared"},
    {{169, 254}, 16, "link-local"},
    {{192, 0, 0, 9}, 32, GLOBAL},  /* Port Control Protocol anycast (RFC 7723) */
    {{192, 0, 0, 10}, 32, GLOBAL}, /* TURN anycast (RFC 8155) */
    {{192, 0, 0}, 24, "protocol"}, /* IETF protocol assignments (RFC 6890): DS-Lite, NAT64 discovery... */
    {{192, 0, 2}, 24, "documentation"},
    {{198, 51, 100}, 24, "documentation"},
    {{203, 0, 113}, 24, "documentation"},
    {{198, 18}, 15, "benchmarking"}, /* RFC 2544 */
    {{192, 88, 99}, 24, "reserved"}, /* the 6to4 relays' anycast, deprecated (RFC 7526) */
    {{224}, 4, "multicast"},
    {{255, 255, 255, 255}, 32, "broadcast"},
    {{240}, 4, "reserved"},
};

static const ip_range v6_ranges[] = {
    {{0}, 128, "unspecified"},
    {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 128, "loopback"},
    {{0, 0x64, 0xff, 0x9b, 0, 1}, 48, "nat64-local"}, /* local-use IPv4/IPv6 translation (RFC 8215) */
    {{0xfc}, 7, "private"},
    {{0xfe, 0xc0}, 10, "private"},   /* site-local, deprecated but still routed by some */
    {{0xfe, 0x80}, 10, "link-local"},
    {{0xff}, 8, "multicast"},
    /* inside 2001::/23, IETF protocol assignments: the anycast and AS112, AMT, ORCHIDv2
     * and drone-ID blocks are globally reachable; Teredo (2001::/32), benchmarking
     * (2001:2::/48) and deprecated ORCHID (2001:10::/28) are not */
    {{0x20, 0x01, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 128, GLOBAL}, /* PCP anycast */
    {{0x20, 0x01, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, 128, GLOBAL}, /* TURN anycast */
    {{0x20, 0x01, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3}, 128, GLOBAL}, /* DNS-SD SRP anycast */
    {{0x20, 0x01, 0, 3}, 32, GLOBAL},           /* AMT */
    {{0x20, 0x01, 0, 4, 0x01, 0x12}, 48, GLOBAL}, /* AS112-v6 */
    {{0x20, 0x01, 0, 0x20}, 28, GLOBAL},        /* ORCHIDv2 */
    {{0x20, 0x01, 0, 0x30}, 28, GLOBAL},        /* drone remote ID */
    {{0x20, 0x01, 0, 2, 0, 0}, 48, "benchmarking"},
    {{0x20, 0x01}, 23, "protocol"},
    {{0x20, 0x01, 0x0d, 0xb8}, 32, "documentation"},
    {{0x3f, 0xff}, 20, "documentation"},        /* RFC 9637 */
    /* global unicast is 2000::/3; what lies outside it and above is reserved or
     * unassigned: the rest of ::/96 and ::ffff:0:0/96, discard-only 100::/64, the dummy
     * prefix 100:0:0:1::/64, SRv6 SIDs 5f00::/16 */
    {{0x20}, 3, GLOBAL},
    {{0}, 0, "reserved"},
};

static const char *match_ranges(const ip_range *r, size_t n, const uint8_t *addr) {
  for (size_t i = 0; i < n; i++)
    if (prefix_match(r[i].addr, addr, r[i].prefix)) return r[i].cls == GLOBAL ? NULL : r[i].cls;
  return NULL;
}

const char *pr_ip_class(const pr_ip *ip) {
  pr_ip v4;
  if (ip->family == AF_INET)
    return match_ranges(v4_ranges, sizeof(v4_ranges) / sizeof(v4_ranges[0]), ip->addr);
  if (ip->family != AF_INET6) return "reserved";
  if (pr_ip_embedded_v4(ip, &v4)) {
    const char *c = pr_ip_class(&v4);
    /* an IPv4-compatible or mapped form of a public address is still no way a public
     * URL should be written: only NAT64 and 6to4 reach public IPv4 hosts */
    if (c || (ip->addr[0] == 0 && ip->addr[1] == 0)) return c ? c : "reserved";
    return NULL;
  }
  return match_ranges(v6_ranges, sizeof(v6_ranges) / sizeof(v6_ranges[0]), ip->addr);
}

void pr_ip_format(const pr_ip *ip, char *out, size_t n) {
  char buf[INET6_ADDRSTRLEN];
  if (!inet_ntop(ip->family, ip->addr, buf, sizeof(buf))) snprintf(buf, sizeof(buf), "?");
  snprintf(out, n, "%s", buf);
}
