/* The URL policy; see urlpolicy.h. */
#include "urlpolicy.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "addr.h"
#include "gw.h"
#include "url.h"

/* An address of this host: loopback, unspecified, or on one of its interfaces. Asked only
 * when a connection's port is that of a listener bound to every address. */
static int is_local(const pr_ip *ip) {
  const char *cls = pr_ip_class(ip);
  if (cls && (strcmp(cls, "loopback") == 0 || strcmp(cls, "unspecified") == 0)) return 1;
  pr_ip v4;
  const pr_ip *want = pr_ip_embedded_v4(ip, &v4) ? &v4 : ip;
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return 1; /* cannot tell: count it as ours */
  int found = 0;
  for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
    pr_ip a;
    if (!i->ifa_addr || pr_ip_from_sockaddr(i->ifa_addr, &a) < 0) continue;
    found = a.family == want->family &&
            memcmp(a.addr, want->addr, a.family == AF_INET ? 4 : 16) == 0;
  }
  freeifaddrs(ifs);
  return found;
}

/* 1 when ip:port is the listener at addr (a "HOST:PORT" of the config). */
static int is_listener(const char *addr, const pr_ip *ip, int port) {
  struct sockaddr_storage ss;
  pr_ip l;
  if (!addr || pr_addr_parse(addr, &ss, NULL) < 0 || pr_ip_from_sockaddr((struct sockaddr *)&ss, &l) < 0)
    return 0;
  int lport = ntohs(l.family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                        : ((struct sockaddr_in6 *)&ss)->sin6_port);
  if (lport != port) return 0;
  const char *lcls = pr_ip_class(&l);
  if (lcls && strcmp(lcls, "unspecified") == 0) return is_local(ip); /* 0.0.0.0, [::] */
  pr_ip v4;
  const pr_ip *want = pr_ip_embedded_v4(ip, &v4) ? &v4 : ip;
  return l.family == want->family && memcmp(l.addr, want->addr, l.family == AF_INET ? 4 : 16) == 0;
}

int gw_url_addr_check(const gw_config *c, const pr_ip *ip, int port, char *why, size_t n) {
  char text[64];
  pr_ip_format(ip, text, sizeof(text));
  for (size_t i = 0; i < c->n_listen; i++)
    if (is_listener(c->listen[i].address, ip, port)) {
      snprintf(why, n, "address %s port %d refused: it is this gateway's own listener", text, port);
      return -EACCES;
    }
  if (is_listener(c->admin_listen, ip, port)) {
    snprintf(why, n, "address %s port %d refused: it is this gateway's admin listener", text, port);
    return -EACCES;
  }
  const char *cls = pr_ip_class(ip);
  if (!cls) return 0;
  for (size_t i = 0; i < c->n_allow_addresses; i++)
    if (pr_ipnet_contains(&c->allow_addresses[i], ip)) return 0;
  snprintf(why, n, "address %s refused by upstream.allow_addresses (%s)", text, cls);
  return -EACCES;
}

int gw_url_check(const gw_config *c, const char *url, char *why, size_t n, const char **reason) {
  pr_url_base b;
  const char *rule = NULL;
  if (reason) *reason = "url";
  if (pr_url_base_check(url, c->allow_http, &b, &rule) < 0) {
    snprintf(why, n, "%s", rule);
    return -EINVAL;
  }
  if (b.literal && gw_url_addr_check(c, &b.ip, b.port, why, n) < 0) {
    if (reason) *reason = "address";
    return -EACCES;
  }
  return 0;
}

int gw_url_gate(void *ud, const struct sockaddr *sa, char *why, size_t n) {
  const gw_server *gw = ud;
  pr_ip ip;
  if (pr_ip_from_sockaddr(sa, &ip) < 0) {
    snprintf(why, n, "only IPv4 and IPv6 connections are made");
    return -EACCES;
  }
  int port = ntohs(sa->sa_family == AF_INET ? ((const struct sockaddr_in *)sa)->sin_port
                                            : ((const struct sockaddr_in6 *)sa)->sin6_port);
  return gw_url_addr_check(gw->conf, &ip, port, why, n);
}
