/* Unit tests for proto/ipnet.c: CIDR parsing, range matching (IPv4 ranges cover the
 * IPv4-mapped forms), and the special-purpose classes the URL policy refuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmocka.h>

#include "ipnet.h"

static pr_ip ip_of(const char *s) {
  pr_ip ip;
  if (pr_ip_parse(s, &ip) < 0) fail_msg("not an address: %s", s);
  return ip;
}

static const char *cls(const char *s) {
  pr_ip ip = ip_of(s);
  return pr_ip_class(&ip);
}

static void expect_class(const char *addr, const char *want) {
  const char *got = cls(addr);
  if (want == NULL ? got != NULL : got == NULL || strcmp(got, want) != 0)
    fail_msg("%s: class %s, wanted %s", addr, got ? got : "(public)", want ? want : "(public)");
}

static void test_classes_ipv4(void **state) {
  (void)state;
  expect_class("127.0.0.1", "loopback");
  expect_class("127.255.255.254", "loopback");
  expect_class("10.0.0.7", "private");
  expect_class("10.255.255.1", "private");
  expect_class("172.16.0.1", "private");
  expect_class("172.31.255.255", "private");
  expect_class("192.168.1.1", "private");
  expect_class("100.64.0.1", "shared");
  expect_class("100.127.255.255", "shared");
  expect_class("169.254.169.254", "link-local"); /* cloud metadata */
  expect_class("0.0.0.0", "unspecified");
  expect_class("0.1.2.3", "unspecified");
  expect_class("224.0.0.1", "multicast");
  expect_class("239.255.255.250", "multicast");
  expect_class("255.255.255.255", "broadcast");
  expect_class("240.0.0.1", "reserved");
  /* neighbours of the ranges are ordinary addresses */
  expect_class("8.8.8.8", NULL);
  expect_class("172.15.255.255", NULL);
  expect_class("172.32.0.0", NULL);
  expect_class("100.63.255.255", NULL);
  expect_class("100.128.0.0", NULL);
  expect_class("11.0.0.1", NULL);
  expect_class("126.255.255.255", NULL);
  expect_class("128.0.0.1", NULL);
  expect_class("223.255.255.255", NULL);
}

static void test_classes_ipv6(void **state) {
  (void)state;
  expect_class("::1", "loopback");
  expect_class("::", "unspecified");
  expect_class("fc00::1", "private");
  expect_class("fd12:3456::1", "private");
  expect_class("fec0::1", "private");
  expect_class("fe80::1", "link-local");
  expect_class("febf::1", "link-local");
  expect_class("ff02::1", "multicast");
  expect_class("2001:4860:4860::8888", NULL);
  expect_class("2a00:1450::1", NULL);
  /* IPv4 inside IPv6: judged as the IPv4 address it reaches */
  expect_class("::ffff:127.0.0.1", "loopback");
  expect_class("::ffff:10.0.0.7", "private");
  expect_class("::ffff:169.254.169.254", "link-local");
  expect_class("::ffff:0.0.0.0", "unspecified");
  expect_class("::ffff:7f00:1", "loopback");
  expect_class("::127.0.0.1", "loopback");       /* IPv4-compatible */
  expect_class("64:ff9b::10.0.0.1", "private");  /* NAT64 */
  expect_class("64:ff9b::8.8.8.8", NULL);
  expect_class("2002:7f00:1::", "loopback");     /* 6to4 of 127.0.0.1 */
  expect_class("2002:c0a8:101::1", "private");   /* 6to4 of 192.168.1.1 */
  expect_class("2002:808:808::1", NULL);
  /* a public IPv4 address written as mapped or compatible IPv6 is still no public URL */
  expect_class("::ffff:8.8.8.8", "reserved");
  expect_class("::8.8.8.8", "reserved");
}

/* IANA's IPv4 and IPv6 special-purpose address registries, entry by entry: what is not
 * globally reachable has a class, the registry's globally reachable exceptions have none,
 * and the addresses just outside each range are ordinary. */
static void test_special_purpose_registries_ipv4(void **state) {
  (void)state;
  expect_class("192.0.0.0", "protocol");        /* 192.0.0.0/24 IETF protocol assignments */
  expect_class("192.0.0.8", "protocol");        /* IPv4 dummy address */
  expect_class("192.0.0.170", "protocol");      /* NAT64/DNS64 discovery */
  expect_class("192.0.0.255", "protocol");
  expect_class("192.0.0.9", NULL);              /* PCP anycast: globally reachable */
  expect_class("192.0.0.10", NULL);             /* TURN anycast: globally reachable */
  expect_class("192.0.1.0", NULL);
  expect_class("191.255.255.255", NULL);
  expect_class("192.0.2.1", "documentation");   /* TEST-NET-1 */
  expect_class("198.51.100.7", "documentation"); /* TEST-NET-2 */
  expect_class("203.0.113.255", "documentation"); /* TEST-NET-3 */
  expect_class("192.0.3.0", NULL);
  expect_class("198.51.101.0", NULL);
  expect_class("203.0.114.0", NULL);
  expect_class("198.18.0.1", "benchmarking");   /* 198.18.0.0/15 */
  expect_class("198.19.255.255", "benchmarking");
  expect_class("198.17.255.255", NULL);
  expect_class("198.20.0.0", NULL);
  expect_class("192.88.99.1", "reserved");      /* deprecated 6to4 relay anycast */
  expect_class("192.88.98.255", NULL);
  expect_class("192.88.100.0", NULL);
  expect_class("100.64.0.0", "shared");
  expect_class("192.31.196.1", NULL);           /* AS112-v4: globally reachable */
  expect_class("192.52.193.1", NULL);           /* AMT */
  expect_class("192.175.48.1", NULL);           /* AS112 direct delegation */
}

static void test_special_purpose_registries_ipv6(void **state) {
  (void)state;
  expect_class("64:ff9b:1::", "nat64-local");   /* RFC 8215 local-use translation */
  expect_class("64:ff9b:1::8.8.8.8", "nat64-local");
  expect_class("64:ff9b:1:ffff:ffff:ffff:ffff:ffff", "nat64-local");
  expect_class("64:ff9b:2::", "reserved");      /* outside 2000::/3, unassigned */
  expect_class("64:ff9b::192.0.0.170", "protocol"); /* well-known NAT64: the IPv4 it reaches */
  expect_class("64:ff9b::198.18.0.1", "benchmarking");
  expect_class("64:ff9b::100.64.0.1", "shared");
  expect_class("64:ff9b::192.0.2.1", "documentation");
  expect_class("2002:c612:1::", "benchmarking"); /* 6to4 of 198.18.0.1 */
  expect_class("2002:6440:1::", "shared");       /* 6to4 of 100.64.0.1 */
  expect_class("2002:a00:7::1", "private");      /* 6to4 of 10.0.0.7 */
  expect_class("::ffff:198.18.0.1", "benchmarking");
  expect_class("100::1", "reserved");           /* discard-only */
  expect_class("100:0:0:1::1", "reserved");     /* dummy prefix */
  expect_class("2001::1", "protocol");          /* Teredo */
  expect_class("2001:0:4136:e378:8000:63bf:3fff:fdd2", "protocol");
  expect_class("2001:2::1", "benchmarking");    /* 2001:2::/48 */
  expect_class("2001:2:0:ffff::1", "benchmarking");
  expect_class("2001:2:1::1", "protocol");      /* past the /48, still in 2001::/23 */
  expect_class("2001:10::1", "protocol");       /* deprecated ORCHID */
  expect_class("2001:1::1", NULL);              /* PCP anycast */
  expect_class("2001:1::2", NULL);              /* TURN anycast */
  expect_class("2001:1::3", NULL);              /* DNS-SD SRP anycast */
  expect_class("2001:1::4", "protocol");
  expect_class("2001:3::1", NULL);              /* AMT */
  expect_class("2001:4:112::1", NULL);          /* AS112-v6 */
  expect_class("2001:4:113::1", "protocol");
  expect_class("2001:20::1", NULL);             /* ORCHIDv2 */
  expect_class("2001:30::1", NULL);             /* drone remote ID */
  expect_class("2001:1ff:ffff::1", "protocol");
  expect_class("2001:200::1", NULL);            /* just past 2001::/23 */
  expect_class("2001:db8::1", "documentation");
  expect_class("2001:db8:ffff::1", "documentation");
  expect_class("2001:db9::1", NULL);
  expect_class("3fff::1", "documentation");     /* RFC 9637 */
  expect_class("3fff:fff::1", "documentation");
  expect_class("3fff:1000::1", NULL);
  expect_class("2620:4f:8000::1", NULL);        /* AS112 direct delegation */
  expect_class("5f00::1", "reserved");          /* SRv6 SIDs */
  expect_class("4000::1", "reserved");          /* outside global unicast 2000::/3 */
  expect_class("1fff:ffff::1", "reserved");
  expect_class("2000::1", NULL);
  expect_class("3ffe::1", NULL);
}

static void test_parse_cidr(void **state) {
  (void)state;
  pr_ipnet n;
  const char *why = NULL;
  assert_int_equal(pr_ipnet_parse("127.0.0.0/8", &n, &why), 0);
  assert_int_equal(n.family, AF_INET);
  assert_int_equal(n.prefix, 8);
  assert_int_equal(pr_ipnet_parse("::1/128", &n, &why), 0);
  assert_int_equal(n.family, AF_INET6);
  assert_int_equal(n.prefix, 128);
  assert_int_equal(pr_ipnet_parse("10.1.2.3", &n, &why), 0); /* a bare address: /32 */
  assert_int_equal(n.prefix, 32);
  assert_int_equal(pr_ipnet_parse("fe80::/10", &n, &why), 0);
  assert_int_equal(pr_ipnet_parse("0.0.0.0/0", &n, &why), 0);
  assert_int_equal(pr_ipnet_parse("::/0", &n, &why), 0);
  static const char *const bad[] = {"", "/8", "10.0.0.0/", "10.0.0.0/33", "::/129", "10.0.0.1/8",
                                    "fe80::1/10", "localhost", "10.0.0.0/8x", "10.0.0.0/-1",
                                    "10.0.0.0/+8", "10.0.0.0/ 8", "[::1]/128", "10.0.0.0/0008",
                                    "10.0.0.0/8/8", "::1%lo/128"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    why = NULL;
    if (pr_ipnet_parse(bad[i], &n, &why) != -EINVAL) fail_msg("accepted \"%s\"", bad[i]);
    assert_non_null(why);
  }
}

static int in(const char *net, const char *addr) {
  pr_ipnet n;
  assert_int_equal(pr_ipnet_parse(net, &n, NULL), 0);
  pr_ip ip = ip_of(addr);
  return pr_ipnet_contains(&n, &ip);
}

static void test_contains(void **state) {
  (void)state;
  assert_true(in("127.0.0.0/8", "127.0.0.1"));
  assert_true(in("127.0.0.0/8", "127.9.9.9"));
  assert_false(in("127.0.0.0/8", "128.0.0.1"));
  assert_true(in("127.0.0.0/8", "::ffff:127.0.0.1")); /* the mapped form too */
  assert_false(in("127.0.0.0/8", "::1"));
  assert_true(in("::1/128", "::1"));
  assert_false(in("::1/128", "127.0.0.1"));
  assert_true(in("172.16.0.0/12", "172.31.0.1"));
  assert_false(in("172.16.0.0/12", "172.32.0.1"));
  assert_true(in("10.255.255.1/32", "10.255.255.1"));
  assert_false(in("10.255.255.1/32", "10.255.255.2"));
  assert_true(in("fc00::/7", "fdff::1"));
  assert_false(in("fc00::/7", "fe00::1"));
  assert_true(in("0.0.0.0/0", "8.8.8.8"));
  assert_false(in("0.0.0.0/0", "2001:db8::1")); /* an IPv4 range holds no plain IPv6 */
  assert_true(in("::/0", "2001:db8::1"));
}

static void test_sockaddr_and_format(void **state) {
  (void)state;
  struct sockaddr_in6 s6;
  memset(&s6, 0, sizeof(s6));
  s6.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "::ffff:127.0.0.1", &s6.sin6_addr);
  pr_ip ip;
  assert_int_equal(pr_ip_from_sockaddr((struct sockaddr *)&s6, &ip), 0);
  assert_string_equal(pr_ip_class(&ip), "loopback");
  char text[64];
  pr_ip_format(&ip, text, sizeof(text));
  assert_string_equal(text, "::ffff:127.0.0.1");
  struct sockaddr_in s4;
  memset(&s4, 0, sizeof(s4));
  s4.sin_family = AF_INET;
  inet_pton(AF_INET, "10.0.0.7", &s4.sin_addr);
  assert_int_equal(pr_ip_from_sockaddr((struct sockaddr *)&s4, &ip), 0);
  pr_ip_format(&ip, text, sizeof(text));
  assert_string_equal(text, "10.0.0.7");
  struct sockaddr other = {.sa_family = AF_UNIX};
  assert_int_equal(pr_ip_from_sockaddr(&other, &ip), -EAFNOSUPPORT);
  assert_int_equal(pr_ip_parse("localhost", &ip), -EINVAL);
  assert_int_equal(pr_ip_parse("[::1]", &ip), -EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_classes_ipv4), cmocka_unit_test(test_classes_ipv6),
      cmocka_unit_test(test_special_purpose_registries_ipv4),
      cmocka_unit_test(test_special_purpose_registries_ipv6),
      cmocka_unit_test(test_parse_cidr),   cmocka_unit_test(test_contains),
      cmocka_unit_test(test_sockaddr_and_format),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
