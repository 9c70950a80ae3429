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
