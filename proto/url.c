/* The replica base-URL rule; see url.h. A strict grammar of its own first (so nothing
 * depends on how lenient a parser is), then libcurl's parser, whose idea of the host is
 * the one that will be connected to. */
#include "url.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

static int fail(const char **why, const char *msg) {
  if (why) *why = msg;
  return -EINVAL;
}

static int is_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

static int check_path(const char *p, const char **why) {
  /* p is "" or starts with '/'; trailing slashes are allowed (callers trim them) */
  while (*p == '/') {
    const char *seg = ++p;
    while (*p && *p != '/') {
      if (!is_alnum(*p) && !strchr("-._~", *p))
        return fail(why, "the path may hold only letters, digits, \"-._~\" and \"/\"");
      p++;
    }
    size_t n = (size_t)(p - seg);
    if ((n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
      return fail(why, "the path may not hold \".\" or \"..\" segments");
    if (n == 0 && *p == '/') return fail(why, "the path may not hold an empty segment (\"//\")");
  }
  return 0;
}

int pr_url_base_check(const char *url, int allow_http, pr_url_base *out, const char **why) {
  pr_url_base tmp;
  pr_url_base *b = out ? out : &tmp;
  memset(b, 0, sizeof(*b));
  size_t len = strlen(url);
  if (len > PR_URL_MAX) return fail(why, "the URL is longer than 1024 characters");
  for (const char *c = url; *c; c++) {
    unsigned char ch = (unsigned char)*c;
    if (ch <= 0x20 || ch >= 0x7f) return fail(why, "the URL may not hold spaces, control or non-ASCII characters");
    if (ch == '?') return fail(why, "the URL may not have a query (\"?\")");
    if (ch == '#') return fail(why, "the URL may not have a fragment (\"#\")");
    if (ch == '@') return fail(why, "the URL may not hold userinfo (\"user@\")");
    if (ch == '%') return fail(why, "the URL may not hold percent-encoding (\"%\")");
    if (ch == '\\') return fail(why, "the URL may not hold a backslash");
  }
  const char *p;
  if (strncmp(url, "https://", 8) == 0) {
    b->https = 1;
    p = url + 8;
  } else if (strncmp(url, "http://", 7) == 0) {
    if (!allow_http) return fail(why, "plain http:// is not allowed (set upstream.allow_http); use https://");
    p = url + 7;
  } else {
    return fail(why, "expected an https:// URL with a host");
  }
  /* authority: up to the first '/' */
  const char *slash = strchr(p, '/');
  const char *aend = slash ? slash : p + strlen(p);
  const char *hend = aend;
  if (*p == '[') {
    const char *close = memchr(p, ']', (size_t)(aend - p));
    if (!close || close == p + 1) return fail(why, "an IPv6 host is written in brackets: [2001:db8::1]");
    for (const char *c = p + 1; c < close; c++)
      if (!strchr("0123456789abcdefABCDEF:.", *c))
        return fail(why, "an IPv6 host may hold only hex digits, ':' and '.' (no zone)");
    hend = close + 1;
    if (hend != aend && *hend != ':') return fail(why, "expected ':' or '/' after the IPv6 host");
  } else {
    const char *colon = memchr(p, ':', (size_t)(aend - p));
    if (colon) hend = colon;
    if (hend == p) return fail(why, "the URL has no host");
    for (const char *c = p; c < hend; c++)
      if (!is_alnum(*c) && *c != '-' && *c != '.')
        return fail(why, "the host may hold only letters, digits, '-' and '.'");
    for (const char *c = p; c < hend; c++)
      if (*c == '.' && (c == p || c + 1 == hend || c[1] == '.'))
        return fail(why, "the host has an empty label");
  }
  b->port = b->https ? 443 : 80;
  if (hend < aend) {
    /* ":PORT" */
    const char *d = hend + 1;
    if (d == aend || aend - d > 5) return fail(why, "the port must be a number from 1 to 65535");
    long port = 0;
    for (const char *c = d; c < aend; c++) {
      if (*c < '0' || *c > '9') return fail(why, "the port must be a number from 1 to 65535");
      port = port * 10 + (*c - '0');
    }
    if (port < 1 || port > 65535) return fail(why, "the port must be a number from 1 to 65535");
    b->port = (int)port;
  }
  int rc = check_path(aend, why);
  if (rc < 0) return rc;

  /* what curl makes of it: its host is the one that gets connected to */
  CURLU *h = curl_url();
  if (!h) return fail(why, "out of memory");
  char *host = NULL;
  int ok = curl_url_set(h, CURLUPART_URL, url, 0) == CURLUE_OK &&
           curl_url_get(h, CURLUPART_HOST, &host, 0) == CURLUE_OK && host && *host;
  if (ok) {
    size_t hl = strlen(host);
    if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') {
      snprintf(b->host, sizeof(b->host), "%.*s", (int)(hl - 2), host + 1);
    } else {
      snprintf(b->host, sizeof(b->host), "%s", host);
    }
    b->literal = pr_ip_parse(b->host, &b->ip) == 0;
  }
  curl_free(host);
  curl_url_cleanup(h);
  if (!ok) return fail(why, "the host is not valid");
  return 0;
}
