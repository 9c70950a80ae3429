/* Secret-holding files kept private (0600); see privfile.h. */
#include "privfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int pr_privfile_keep(const char *path, int create, unsigned *was) {
  /* O_CREAT with 0600 makes a new file no more open than that, whatever the umask; an
   * existing one keeps its mode until the fchmod below */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (create ? O_CREAT : 0), 0600);
  if (fd < 0) return !create && errno == ENOENT ? 0 : -errno;
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
  } else if (S_ISREG(st.st_mode) && (st.st_mode & 077)) {
    if (was) *was = (unsigned)(st.st_mode & 07777);
    rc = fchmod(fd, 0600) == 0 ? 1 : -errno;
  }
  close(fd);
  return rc;
}

int pr_privfile_keep_sqlite(const char *path, char *note, size_t note_n) {
  static const char *const suffix[] = {"", "-journal", "-wal", "-shm"};
  char p[4200];
  int n = 0;
  size_t used = 0;
  if (note && note_n) note[0] = '\0';
  for (size_t i = 0; i < sizeof(suffix) / sizeof(suffix[0]); i++) {
    if ((size_t)snprintf(p, sizeof(p), "%s%s", path, suffix[i]) >= sizeof(p)) return -ENAMETOOLONG;
    unsigned was = 0;
    int rc = pr_privfile_keep(p, i == 0, &was);
    if (rc < 0) {
      if (note && note_n) snprintf(note, note_n, "%s", p);
      return rc;
    }
    if (rc == 1) {
      n++;
      if (note && used < note_n) {
        int w = snprintf(note + used, note_n - used, "%s%s (was %04o)", used ? ", " : "", p, was);
        if (w > 0) used += (size_t)w;
      }
    }
  }
  return n;
}

int pr_privfile_write(const char *path, const char *text, int sync) {
  char tmp[4200];
  if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp)) return -ENAMETOOLONG;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -errno;
  size_t len = strlen(text), off = 0;
  /* O_CREAT does not change an existing file's mode */
  int rc = fchmod(fd, 0600) != 0 ? -errno : 0;
  while (!rc && off < len) {
    ssize_t n = write(fd, text + off, len - off);
    if (n < 0 && errno != EINTR) rc = -errno;
    else if (n > 0) off += (size_t)n;
  }
  if (!rc && sync && fsync(fd) != 0) rc = -errno;
  if (close(fd) != 0 && !rc) rc = -errno;
  if (!rc && rename(tmp, path) != 0) rc = -errno;
  if (rc) {
    unlink(tmp);
    return rc;
  }
  if (sync) { /* the rename itself reaches the disk with its folder */
    char dir[4200];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
      *slash = 0;
      int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
      }
    }
  }
  return 0;
}
