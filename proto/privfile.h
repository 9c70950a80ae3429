/* Files that hold secrets (the gateways' token secret in the pins file, callers' prompts
 * in batch.db): created, and kept, readable and writable by their owner only, whatever
 * the umask, and tightened when found open to others. Nothing here logs: callers say
 * what was tightened. */
#ifndef PR_PRIVFILE_H
#define PR_PRIVFILE_H

#include <stddef.h>

/* Make path mode 0600 when group or others may read or write it, creating it (0600,
 * empty) when it is missing and create is set. Returns 1 when its mode was changed
 * (*was, if not NULL: the permission bits it had), 0 when it already was private, was
 * just created, or is missing and create is 0; a negative errno code otherwise. Only
 * regular files are touched (another kind: 0). */
int pr_privfile_keep(const char *path, int create, unsigned *was);

/* The same for an SQLite database file (created when missing) and the journal, WAL and
 * shared-memory files beside it (PATH-journal, PATH-wal, PATH-shm; never created:
 * SQLite gives them the database's mode). Returns how many were changed, with what was
 * changed in note ("PATH (was 0644), PATH-wal (was 0644)") when note is not NULL, or a
 * negative errno code with the file it concerns in note. */
int pr_privfile_keep_sqlite(const char *path, char *note, size_t note_n);

/* Replace path with text as a whole: written to PATH.tmp (0600 whatever the umask, a stale
 * one tightened first), then renamed over path, so a reader sees the old file or the new,
 * never half of one. With sync, the data and the rename reach the disk first (fsync of the
 * file and its folder: call it off the loop). Returns 0 or a negative errno code (PATH.tmp
 * removed). */
int pr_privfile_write(const char *path, const char *text, int sync);

#endif
