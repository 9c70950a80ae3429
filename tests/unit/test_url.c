/* Unit tests for proto/url.c: the replica base-URL rule. What the issue's attacker sent
 * (a query the gateway's path lands in, userinfo, fragments, dot segments, encoded
 * traversal) is refused; plain https URLs, ports, path prefixes and IP literals pass,
 * with the host libcurl will connect to. */
#include <setjmp.h>
#include <stdarg.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "url.h"

static void refused(const char *url, int allow_http, const char *want) {
  const char *why = NULL;
  int rc = pr_url_base_check(url, allow_http, NULL, &why);
  if (rc != -EINVAL) fail_msg("accepted \"%s\"", url);
  if (!why || (want && !strstr(why, want))) fail_msg("\"%s\": why \"%s\", wanted \"%s\"", url, why ? why : "", want);
}

static pr_url_base accepted(const char *url, int allow_http) {
  pr_url_base b;
  const char *why = NULL;
  if (pr_url_base_check(url, allow_http, &b, &why) != 0) fail_msg("refused \"%s\": %s", url, why);
  return b;
}

static void test_attacks_refused(void **state) {
  (void)state;
  refused("http://10.0.0.7:9200/idx/_search?q=", 1, "query");
  refused("https://10.0.0.7:9200/idx/_search?q=", 1, "query");
  refused("https://h/?", 1, "query");
  refused("https://h/#frag", 1, "fragment");
  refused("https://h#", 1, "fragment");
  refused("https://a:b@h", 1, "userinfo");
  refused("https://a@h/", 1, "userinfo");
  refused("https://h@evil.example", 1, "userinfo");
  refused("https://h/../admin", 1, "\"..\" segments");
  refused("https://h/a/./b", 1, "\".\" or \"..\"");
  refused("https://h/..", 1, "\"..\"");
  refused("https://h/%2e%2e/admin", 1, "percent");
  refused("https://h/%2E%2E", 1, "percent");
  refused("https://h%2eexample", 1, "percent");
  refused("https://h/a\\..\\b", 1, "backslash");
  refused("https://h/a b", 1, "spaces");
  refused("https://h/\x01", 1, "control");
  refused("https://h/\xc3\xa9", 1, "non-ASCII");
  refused("https://h//admin", 1, "empty segment");
  refused("https://h/a;b", 1, "path may hold only");
  refused("https://h/a:b", 1, "path may hold only");
  refused("https://[fe80::1%25eth0]/", 1, "percent");
  refused("https://[::1", 1, "brackets");
  refused("https://[]/", 1, "brackets");
  refused("https://[::1]x/", 1, "after the IPv6 host");
  refused("https://[::1%lo]/", 1, NULL);
  refused("https://[g::1]/", 1, "hex digits");
}

static void test_shape_refused(void **state) {
  (void)state;
  refused("http://h", 0, "upstream.allow_http");
  refused("ftp://h", 1, "https://");
  refused("file:///etc/passwd", 1, "https://");
  refused("HTTPS://h", 1, "https://");
  refused("//h/x", 1, "https://");
  refused("https://", 1, "no host");
  refused("https:///x", 1, "no host");
  refused("https://:443/", 1, "no host");
  refused("https://h:/", 1, "port");
  refused("https://h:0/", 1, "port");
  refused("https://h:65536/", 1, "port");
  refused("https://h:123456/", 1, "port");
  refused("https://h:8x/", 1, "port");
  refused("https://h:-1/", 1, "port");
  refused("https://h_x/", 1, "host may hold only");
  refused("https://.h/", 1, "empty label");
  refused("https://h./", 1, "empty label");
  refused("https://a..b/", 1, "empty label");
  char longer[PR_URL_MAX + 40] = "https://h/";
  memset(longer + 10, 'a', PR_URL_MAX);
  longer[10 + PR_URL_MAX] = '\0';
  refused(longer, 1, "longer");
}

static void test_accepted(void **state) {
  (void)state;
  pr_url_base b = accepted("https://abc.acu.run", 0);
  assert_int_equal(b.https, 1);
  assert_string_equal(b.host, "abc.acu.run");
  assert_int_equal(b.port, 443);
  assert_int_equal(b.literal, 0);
  b = accepted("https://abc.acu.run/", 0);
  b = accepted("https://phone-7.example.org:8443/llama/v1~x_y.z/", 0);
  assert_int_equal(b.port, 8443);
  b = accepted("http://127.0.0.1:9200", 1);
  assert_int_equal(b.https, 0);
  assert_int_equal(b.port, 9200);
  assert_int_equal(b.literal, 1);
  assert_int_equal(b.ip.family, AF_INET);
  assert_string_equal(b.host, "127.0.0.1");
  b = accepted("http://h", 1);
  assert_int_equal(b.port, 80);
  b = accepted("https://[::1]:8443/x", 0);
  assert_int_equal(b.literal, 1);
  assert_int_equal(b.ip.family, AF_INET6);
  assert_string_equal(b.host, "::1");
  b = accepted("https://[::ffff:127.0.0.1]/", 0);
  assert_int_equal(b.literal, 1);
  assert_string_equal(pr_ip_class(&b.ip), "loopback");
  /* numbers libcurl reads as IPv4 addresses are seen as the address it will use */
  b = accepted("https://2130706433/", 0);
  assert_int_equal(b.literal, 1);
  assert_string_equal(b.host, "127.0.0.1");
  b = accepted("https://0x7f.1/", 0);
  assert_int_equal(b.literal, 1);
  assert_string_equal(b.host, "127.0.0.1");
  b = accepted("https://localhost:1/", 0);
  assert_int_equal(b.literal, 0); /* a name: the connection's check catches what it resolves to */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attacks_refused),
      cmocka_unit_test(test_shape_refused),
      cmocka_unit_test(test_accepted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
