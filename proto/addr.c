/* Parsing listen addresses (see addr.h). One parser for the listeners and for the
 * config check, so an address the config accepts is one the listener takes. */
#include "addr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

static int fail(const char **why, const char *msg) {
  if (why) *why = msg;
  return -EINVAL;
}

int pr_addr_parse(const char *addr, struct sockaddr_storage *ss, const char **why) {
  static const char bad_port[] = "the port must be a number from 0 to 65535";
  static const char bad_host[] = "the host must be an IPv4 address, an IPv6 address in "
                                 "brackets, localhost or * (names are not looked up)";
  char host[256];
  memset(ss, 0, sizeof(*ss));
  const char *colon = strrchr(addr, ':');
  const char *port_s = colon ? colon + 1 : addr;
  char *end;
  long port = strtol(port_s, &end, 10);
  if (*port_s == '\0' || *end != '\0' || port < 0 || port > 65535) return fail(why, bad_port);
  size_t hl = colon ? (size_t)(colon - addr) : 0;
  if (hl >= sizeof(host)) return fail(why, bad_host);
  memcpy(host, addr, hl);
  host[hl] = '\0';
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
    host[hl - 1] = '\0';
    if (uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss)) return fail(why, bad_host);
    return 0;
  }
  if (hl == 0 || strcmp(host, "*") == 0) snprintf(host, sizeof(host), "0.0.0.0");
  if (strcmp(host, "localhost") == 0) snprintf(host, sizeof(host), "127.0.0.1");
  if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss)) return fail(why, bad_host);
  return 0;
}
