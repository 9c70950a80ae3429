/* Unit tests for gateway/urlpolicy.c: which addresses the gateway may connect to under a
 * loaded config (the allow list, the special-purpose classes, its own listeners even when
 * their range is allowed), and the heartbeat URL check built on both. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmocka.h>

#include "config.h"
#include "urlpolicy.h"

static gw_config *load(const char *text) {
  char path[64];
  snprintf(path, sizeof(path), "/tmp/fg-urlpolicy-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  pr_buf e;
  pr_buf_init(&e, 1 << 16);
  gw_config *c = NULL;
  if (gw_config_load(path, &c, &e) < 0) fail_msg("%s", pr_buf_cstr(&e));
  pr_buf_free(&e);
  unlink(path);
  return c;
}

/* 0 when allowed; else the reason must contain want. */
static int check(const gw_config *c, const char *addr, int port, const char *want) {
  pr_ip ip;
  if (pr_ip_parse(addr, &ip) < 0) fail_msg("not an address: %s", addr);
  char why[256] = "";
  int rc = gw_url_addr_check(c, &ip, port, why, sizeof(why));
  if (rc == 0 && want) fail_msg("%s:%d allowed, wanted \"%s\"", addr, port, want);
  if (rc != 0 && (!want || !strstr(why, want))) fail_msg("%s:%d: \"%s\", wanted \"%s\"", addr, port, why, want ? want : "allowed");
  return rc;
}

static void test_default_refuses_special_addresses(void **state) {
  (void)state;
  gw_config *c = load("{\"listen\": \"127.0.0.1:8080\"}");
  check(c, "8.8.8.8", 443, NULL);
  check(c, "2001:4860:4860::8888", 443, NULL);
  check(c, "127.0.0.1", 9200, "address 127.0.0.1 refused by upstream.allow_addresses (loopback)");
  check(c, "::1", 9200, "(loopback)");
  check(c, "::ffff:127.0.0.1", 9200, "address ::ffff:127.0.0.1 refused by upstream.allow_addresses (loopback)");
  check(c, "10.0.0.7", 9200, "(private)");
  check(c, "192.168.1.1", 80, "(private)");
  check(c, "100.64.0.1", 80, "(shared)");
  check(c, "169.254.169.254", 80, "(link-local)");
  check(c, "fe80::1", 80, "(link-local)");
  check(c, "0.0.0.0", 80, "(unspecified)");
  check(c, "224.0.0.1", 80, "(multicast)");
  /* special-purpose ranges that are not globally reachable (IANA's registries) */
  check(c, "64:ff9b:1::a00:7", 443, "address 64:ff9b:1::a00:7 refused by upstream.allow_addresses (nat64-local)");
  check(c, "192.0.0.8", 443, "(protocol)");
  check(c, "198.18.0.1", 443, "(benchmarking)");
  check(c, "192.88.99.1", 443, "(reserved)");
  check(c, "192.0.2.1", 443, "(documentation)");
  check(c, "2001:db8::1", 443, "(documentation)");
  check(c, "2001:2::1", 443, "(benchmarking)");
  check(c, "2002:a00:7::1", 443, "(private)");   /* 6to4 of 10.0.0.7 */
  check(c, "64:ff9b::a00:7", 443, "(private)");  /* well-known NAT64 of 10.0.0.7 */
  check(c, "::ffff:198.18.0.1", 443, "(benchmarking)");
  check(c, "64:ff9b::808:808", 443, NULL);       /* NAT64 of a public address */
  check(c, "192.0.0.9", 443, NULL);              /* PCP anycast: globally reachable */
  gw_config_unref(c);
}

/* The operator's override reaches the new classes as it did the old ones. */
static void test_allow_list_overrides_special_purpose_ranges(void **state) {
  (void)state;
  gw_config *c = load("{\"listen\": \"127.0.0.1:8080\",\n"
                      " \"upstream\": {\"allow_addresses\": [\"64:ff9b:1::/48\", \"198.18.0.0/15\","
                      " \"192.0.0.0/24\", \"2001:db8::/32\"]}}");
  check(c, "64:ff9b:1::a00:7", 443, NULL);
  check(c, "198.19.1.1", 443, NULL);
  check(c, "::ffff:198.18.0.1", 443, NULL);      /* the IPv4 range covers the mapped form */
  check(c, "192.0.0.170", 443, NULL);
  check(c, "2001:db8::5", 443, NULL);
  check(c, "2001:2::1", 443, "(benchmarking)");  /* only what is listed */
  check(c, "203.0.113.1", 443, "(documentation)");
  gw_config_unref(c);
}

static void test_allow_list_and_own_listeners(void **state) {
  (void)state;
  gw_config *c = load("{\"listen\": [\"127.0.0.1:8080\", \"0.0.0.0:7000\"],\n"
                      " \"admin\": {\"token\": \"0123456789abcdef\", \"listen\": \"127.0.0.1:9090\"},\n"
                      " \"upstream\": {\"allow_addresses\": [\"127.0.0.0/8\", \"10.1.0.0/16\"]}}");
  check(c, "127.0.0.1", 9200, NULL);
  check(c, "127.3.4.5", 80, NULL);
  check(c, "::ffff:127.0.0.1", 9200, NULL); /* the IPv4 range covers the mapped form */
  check(c, "10.1.2.3", 80, NULL);
  check(c, "10.2.0.1", 80, "(private)");
  check(c, "::1", 80, "(loopback)");        /* only what is listed */
  /* the gateway's own listeners, whatever the allow list says */
  check(c, "127.0.0.1", 9090, "address 127.0.0.1 port 9090 refused: it is this gateway's admin listener");
  check(c, "::ffff:127.0.0.1", 9090, "admin listener");
  check(c, "127.0.0.1", 8080, "port 8080 refused: it is this gateway's own listener");
  check(c, "127.0.0.1", 7000, "own listener"); /* 0.0.0.0: every address of the host */
  check(c, "127.0.0.2", 8080, NULL);           /* another loopback address, allowed */
  check(c, "8.8.8.8", 9090, NULL);             /* another host's port 9090 */
  gw_config_unref(c);
}

static void test_heartbeat_url_check(void **state) {
  (void)state;
  gw_config *c = load("{\"listen\": \"127.0.0.1:8080\",\n"
                      " \"admin\": {\"token\": \"0123456789abcdef\", \"listen\": \"127.0.0.1:9090\"}}");
  char why[256];
  const char *reason = NULL;
  assert_int_equal(gw_url_check(c, "https://phone.example:8443/p", why, sizeof(why), &reason), 0);
  assert_int_equal(gw_url_check(c, "https://8.8.8.8", why, sizeof(why), &reason), 0);
  assert_int_equal(gw_url_check(c, "https://localhost:9", why, sizeof(why), &reason), 0); /* a name */
  assert_int_equal(gw_url_check(c, "http://phone.example", why, sizeof(why), &reason), -EINVAL);
  assert_string_equal(reason, "url");
  assert_non_null(strstr(why, "upstream.allow_http"));
  assert_int_equal(gw_url_check(c, "https://10.0.0.7:9200/idx/_search?q=", why, sizeof(why), &reason), -EINVAL);
  assert_non_null(strstr(why, "query"));
  assert_int_equal(gw_url_check(c, "https://10.0.0.7:9200/idx", why, sizeof(why), &reason), -EACCES);
  assert_string_equal(reason, "address");
  assert_non_null(strstr(why, "address 10.0.0.7 refused by upstream.allow_addresses (private)"));
  assert_int_equal(gw_url_check(c, "https://2130706433:9", why, sizeof(why), &reason), -EACCES);
  assert_non_null(strstr(why, "127.0.0.1"));
  assert_int_equal(gw_url_check(c, "https://[::ffff:169.254.169.254]/", why, sizeof(why), &reason), -EACCES);
  assert_non_null(strstr(why, "(link-local)"));
  gw_config_unref(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_refuses_special_addresses),
      cmocka_unit_test(test_allow_list_and_own_listeners),
      cmocka_unit_test(test_allow_list_overrides_special_purpose_ranges),
      cmocka_unit_test(test_heartbeat_url_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
