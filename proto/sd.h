/* What a daemon under systemd says and reads, without libsystemd: the sd_notify
 * datagram to $NOTIFY_SOCKET (READY=1, RELOADING=1, STOPPING=1, STATUS=...) and the
 * secrets in $CREDENTIALS_DIRECTORY (LoadCredential=) turned into environment variables. */
#ifndef PR_SD_H
#define PR_SD_H

#include <stddef.h>

/* Send state (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET: a path or an
 * abstract name ('@'). Never blocks (a full socket drops the message). Returns 1 when
 * sent, 0 when there is no $NOTIFY_SOCKET (not run by systemd), a negative errno code
 * otherwise. */
int pr_sd_notify(const char *state);

/* "RELOADING=1" with MONOTONIC_USEC= (what systemd 253's Type=notify-reload wants, and
 * harmless before it); same returns as pr_sd_notify. */
int pr_sd_notify_reloading(void);

/* For each regular file in $CREDENTIALS_DIRECTORY named NAME or env_NAME, where NAME is
 * an environment variable's name (A-Z, 0-9, _; not starting with a digit) that is not
 * set already, set NAME to the file's contents (one trailing newline dropped; at most
 * 64 KiB; no NUL bytes). So `LoadCredential=env:/etc/fleetgate/credentials` serves every
 * `*_env` key of the configuration. *n_set counts the variables set; names (if not NULL,
 * of size names_n) gets them, comma-separated, for a log line. Returns 0 (also without
 * $CREDENTIALS_DIRECTORY) or a negative errno code when the folder cannot be read; a
 * file that cannot be read or does not qualify is skipped. */
int pr_sd_import_credentials(size_t *n_set, char *names, size_t names_n);

#endif
