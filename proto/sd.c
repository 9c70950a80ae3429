/* sd_notify's datagram and LoadCredential='s folder, by hand: the protocol is one
 * sendmsg to a unix socket (systemd's sd_notify(3), "NOTIFY_SOCKET"), the credentials
 * are plain files (systemd.exec(5), "Credentials"). */
#include "sd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

int pr_sd_notify(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return 0;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  size_t len = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path)) return -EAFNOSUPPORT;
  memcpy(sa.sun_path, path, len);
  if (path[0] == '@') sa.sun_path[0] = '\0'; /* abstract namespace */
  socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len +
                                (path[0] == '/' ? 1 : 0));
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL | MSG_DONTWAIT,
                     (struct sockaddr *)&sa, salen);
  int rc = n < 0 ? -errno : 1;
  close(fd);
  return rc;
}

int pr_sd_notify_reloading(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  char msg[96];
  snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu",
           (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000);
  return pr_sd_notify(msg);
}

static int env_name_ok(const char *s) {
  if (!*s || (*s >= '0' && *s <= '9')) return 0;
  for (; *s; s++)
    if (!((*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
  return 1;
}

#define SD_CRED_MAX (64 * 1024)

/* The file's contents, NUL-terminated, one trailing newline dropped; NULL when it
 * cannot be read, is too large or holds a NUL byte. */
static char *read_cred(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return NULL;
  struct stat st;
  char *buf = NULL;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= SD_CRED_MAX &&
      (buf = malloc((size_t)st.st_size + 1))) {
    size_t got = 0;
    while (got < (size_t)st.st_size) {
      ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
      if (r <= 0) break;
      got += (size_t)r;
    }
    buf[got] = '\0';
    if (got != (size_t)st.st_size || memchr(buf, '\0', got)) {
      free(buf);
      buf = NULL;
    } else {
      if (got > 0 && buf[got - 1] == '\n') buf[--got] = '\0';
      if (got > 0 && buf[got - 1] == '\r') buf[--got] = '\0';
    }
  }
  close(fd);
  return buf;
}

int pr_sd_import_credentials(size_t *n_set, char *names, size_t names_n) {
  *n_set = 0;
  if (names && names_n) names[0] = '\0';
  const char *dir = getenv("CREDENTIALS_DIRECTORY");
  if (!dir || !*dir) return 0;
  DIR *d = opendir(dir);
  if (!d) return -errno;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *name = e->d_name;
    if (strncmp(name, "env_", 4) == 0) name += 4;
    if (!env_name_ok(name) || getenv(name)) continue;
    char *val = read_cred(dirfd(d), e->d_name);
    if (!val) continue;
    if (setenv(name, val, 0) == 0) {
      (*n_set)++;
      if (names && names_n) {
        size_t l = strlen(names);
        snprintf(names + l, names_n - l, "%s%s", l ? "," : "", name);
      }
    }
    explicit_bzero(val, strlen(val)); /* the environment holds its own copy now */
    free(val);
  }
  closedir(d);
  return 0;
}
