/* proto/sd.c: the sd_notify datagram reaches a socket bound at a path or an abstract
 * name and never blocks; credentials become environment variables by the rules in
 * sd.h (env_ prefix, names, set variables win, sizes, NUL bytes, symlinks). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "sd.h"

static int bind_dgram(struct sockaddr_un *sa, socklen_t len) {
  int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)sa, len), 0);
  return fd;
}

static void recv_is(int fd, const char *want) {
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
  assert_true(n > 0);
  buf[n] = '\0';
  assert_string_equal(buf, want);
}

static void test_notify_path_and_abstract(void **state) {
  (void)state;
  unsetenv("NOTIFY_SOCKET");
  assert_int_equal(pr_sd_notify("READY=1"), 0); /* not under systemd */

  char dir[] = "/tmp/fg-sd-XXXXXX";
  assert_non_null(mkdtemp(dir));
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/notify", dir);
  int fd = bind_dgram(&sa, sizeof(sa));
  setenv("NOTIFY_SOCKET", sa.sun_path, 1);
  assert_int_equal(pr_sd_notify("READY=1\nSTATUS=serving"), 1);
  recv_is(fd, "READY=1\nSTATUS=serving");
  assert_int_equal(pr_sd_notify_reloading(), 1);
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
  assert_true(n > 0);
  buf[n] = '\0';
  assert_true(strncmp(buf, "RELOADING=1\nMONOTONIC_USEC=", 27) == 0);
  assert_true(strtoull(buf + 27, NULL, 10) > 0);
  close(fd);
  unlink(sa.sun_path);
  /* nobody listening any more: an error, not a crash or a wait */
  assert_true(pr_sd_notify("STOPPING=1") < 0);
  rmdir(dir);

  struct sockaddr_un ab = {.sun_family = AF_UNIX};
  char name[64];
  snprintf(name, sizeof(name), "fg-sd-test-%d", (int)getpid());
  memcpy(ab.sun_path + 1, name, strlen(name));
  fd = bind_dgram(&ab, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name)));
  char env[80];
  snprintf(env, sizeof(env), "@%s", name);
  setenv("NOTIFY_SOCKET", env, 1);
  assert_int_equal(pr_sd_notify("STOPPING=1"), 1);
  recv_is(fd, "STOPPING=1");
  close(fd);

  setenv("NOTIFY_SOCKET", "vsock:2:1234", 1); /* not supported: said, not guessed */
  assert_int_equal(pr_sd_notify("READY=1"), -EAFNOSUPPORT);
  unsetenv("NOTIFY_SOCKET");
}

static void put(const char *dir, const char *name, const void *data, size_t n) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

static void test_credentials_become_variables(void **state) {
  (void)state;
  size_t n = 99;
  char names[256];
  unsetenv("CREDENTIALS_DIRECTORY");
  assert_int_equal(pr_sd_import_credentials(&n, names, sizeof(names)), 0);
  assert_int_equal(n, 0);

  char dir[] = "/tmp/fg-cred-XXXXXX";
  assert_non_null(mkdtemp(dir));
  put(dir, "env_FG_T_ADMIN", "s3cret\n", 7);
  put(dir, "FG_T_PLAIN", "plain", 5);
  put(dir, "FG_T_SET", "from-file", 9);
  put(dir, "lower_case", "x", 1);
  put(dir, "9STARTS_WITH_DIGIT", "x", 1);
  put(dir, "FG_T_NUL", "a\0b", 3);
  char *big = calloc(1, 64 * 1024 + 1);
  memset(big, 'a', 64 * 1024 + 1);
  put(dir, "FG_T_BIG", big, 64 * 1024 + 1);
  free(big);
  char target[512], link[512];
  snprintf(target, sizeof(target), "%s/FG_T_PLAIN", dir);
  snprintf(link, sizeof(link), "%s/FG_T_LINK", dir);
  assert_int_equal(symlink(target, link), 0);
  setenv("FG_T_SET", "from-env", 1);
  unsetenv("FG_T_ADMIN");
  unsetenv("FG_T_PLAIN");
  setenv("CREDENTIALS_DIRECTORY", dir, 1);

  assert_int_equal(pr_sd_import_credentials(&n, names, sizeof(names)), 0);
  assert_int_equal(n, 2);
  assert_string_equal(getenv("FG_T_ADMIN"), "s3cret");
  assert_string_equal(getenv("FG_T_PLAIN"), "plain");
  assert_string_equal(getenv("FG_T_SET"), "from-env");
  assert_null(getenv("lower_case"));
  assert_null(getenv("FG_T_NUL"));
  assert_null(getenv("FG_T_BIG"));
  assert_null(getenv("FG_T_LINK"));
  assert_true(strcmp(names, "FG_T_ADMIN,FG_T_PLAIN") == 0 ||
              strcmp(names, "FG_T_PLAIN,FG_T_ADMIN") == 0);

  setenv("CREDENTIALS_DIRECTORY", "/nonexistent/fleetgate-creds", 1);
  assert_true(pr_sd_import_credentials(&n, NULL, 0) < 0);
  unsetenv("CREDENTIALS_DIRECTORY");
  char cmd[600];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_notify_path_and_abstract),
      cmocka_unit_test(test_credentials_become_variables),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
