/* The one rule for a replica's base URL, wherever one is accepted (config files,
 * heartbeats): the gateway appends paths to it and sends callers' prompts and the
 * replica's token there, so it must mean exactly one place and carry nothing else.
 *
 *   https://HOST[:PORT][/PATH]    (http:// only when the caller allows it)
 *
 * HOST is a DNS name (letters, digits, '-' and '.'), an IPv4 address or an IPv6 address
 * in brackets (no zone); PORT 1-65535; PATH plain segments of letters, digits and
 * "-._~" separated by single '/', none of them "." or "..". No userinfo ('@'), query
 * ('?'), fragment ('#'), percent-encoding ('%'), backslash, space, control or non-ASCII
 * byte anywhere. Pure: nothing is looked up. */
#ifndef PR_URL_H
#define PR_URL_H

#include "ipnet.h"

#define PR_URL_MAX 1024 /* longer base URLs are refused */

typedef struct pr_url_base {
  int https;
  char host[256];  /* as libcurl will use it (IPv4 numbers normalised, IPv6 without []) */
  int port;        /* the port connected to: given, or 443 / 80 */
  int literal;     /* 1: host is an IP address, in ip */
  pr_ip ip;
} pr_url_base;

/* 0 when url follows the rule (out, when not NULL, filled); else -EINVAL with *why
 * (when not NULL) a static phrase saying what is wrong. */
int pr_url_base_check(const char *url, int allow_http, pr_url_base *out, const char **why);

#endif
