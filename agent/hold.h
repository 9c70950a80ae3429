/* What this phone can hold: the models on its disk (name, size, SHA-256), the free storage
 * of the folder they live in, and whether a model fits the phone's memory and storage
 * (docs/agent.md, "What the phone holds").
 *
 * A digest is worked out once per file: on libuv's thread pool (uv_queue_work), a chunk at
 * a time, never on the loop, and kept by the file's size and modification time, in memory
 * and in DIR/.fleetgate-sha256, which `fleetgate-agent fetch` also writes once it has
 * checked a download, so neither a restart nor a fresh download reads a multi-GB file
 * again. The rules (ag_hold_usable_mb, ag_hold_need_mem_mb, ag_hold_fits) and the folder's
 * files (scan, digest, cache) are plain functions the unit tests call directly. */
#ifndef AG_HOLD_H
#define AG_HOLD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "report.h"

#define AG_HOLD_CACHE_FILE ".fleetgate-sha256"
#define AG_HOLD_CACHE_MAX 64          /* entries the cache file keeps */
#define AG_HOLD_SCAN_MS 30000         /* the folder is looked at again this often */
#define AG_HOLD_CHUNK (1u << 20)      /* bytes read per step of a digest */

/* ---- the rules ------------------------------------------------------------------------ */

/* What Android keeps of a phone's memory for itself: a quarter, and at least this. */
#define AG_HOLD_RESERVE_MIN_MB 2048.0
/* Room a model needs beyond its file: 20 % of it for the KV cache and compute buffers,
 * and this for llama-server's own and the agent. */
#define AG_HOLD_KV_SHARE 0.20
#define AG_HOLD_ENGINE_MB 512.0
/* Storage kept free beside a download (the engine's and the agent's files, logs). */
#define AG_HOLD_DISK_MARGIN_MB 256.0

/* The memory a phone can give a model: MemTotal less max(AG_HOLD_RESERVE_MIN_MB, a
 * quarter). < 0 when mem_total_mb is unknown (< 0). */
double ag_hold_usable_mb(double mem_total_mb);
/* The memory a model file of `bytes` needs: the file, AG_HOLD_KV_SHARE of it and
 * AG_HOLD_ENGINE_MB, in MiB rounded up. */
double ag_hold_need_mem_mb(uint64_t bytes);

/* Whether `model` fits this phone. need_mem_mb (<= 0: worked out from model_bytes) against
 * ag_hold_usable_mb(mem_total_mb); and, when model_bytes > 0, the storage: storage_free_mb
 * must hold what is not there yet (model_bytes less present_bytes, what of the file is on
 * the disk already) and AG_HOLD_DISK_MARGIN_MB. A figure that is unknown (< 0) is not
 * checked. Returns 1 when it fits, 0 when it does not; why (n bytes) says what was found
 * either way, for the log and the gateway. */
int ag_hold_fits(const char *model, uint64_t model_bytes, double need_mem_mb, double mem_total_mb,
                 double storage_free_mb, uint64_t present_bytes, char *why, size_t n);

/* A model file's name as reported: the file name without ".gguf", 1 - AG_HOLD_NAME_MAX of
 * A-Z a-z 0-9 . _ -. Returns 0 and the name in out, or -EINVAL (another file). */
int ag_hold_model_name(const char *file, char out[AG_HOLD_NAME_MAX + 1]);

/* ---- the folder (blocking: the thread pool, `fetch`, tests) ---------------------------- */

/* One model file found in the folder. */
typedef struct ag_hold_file {
  char file[AG_HOLD_NAME_MAX + 6];  /* its name in the folder */
  char name[AG_HOLD_NAME_MAX + 1];  /* the model's (ag_hold_model_name) */
  uint64_t bytes;
  int64_t mtime_ns;
  char sha256[65];                  /* lowercase hex; "" unknown yet */
} ag_hold_file;

/* Whether a switch to catalogue model `model` fits, asked before the phone drains or
 * downloads anything (the gateway's `place`: size_bytes, its mem_mb as need_mem_mb, its
 * sha256, may be NULL): ag_hold_fits, with what of the file is there already: the whole
 * file when held[] lists NAME.gguf with that digest (or, its digest not worked out yet,
 * with that size), else part_bytes (what a broken download left in NAME.gguf.part). 1 it
 * fits, 0 it does not; why as ag_hold_fits. */
int ag_hold_switch_fits(const char *model, uint64_t size_bytes, double need_mem_mb, const char *sha256,
                        double mem_total_mb, double storage_free_mb, const ag_hold_file *held,
                        size_t n_held, uint64_t part_bytes, char *why, size_t n);

/* The model files of dir (regular files named NAME.gguf, at most max, by name; the first
 * AG_HOLD_SCAN_ENTRIES entries of the folder are looked at), each with the digest its
 * cache file records for its size and time (else ""), and the folder's free storage
 * (MiB available to this user; -1 when unknown). 0, or a negative code when dir cannot
 * be read (*n is then 0). */
#define AG_HOLD_SCAN_ENTRIES 1024
int ag_hold_scan_dir(const char *dir, ag_hold_file *out, size_t max, size_t *n, double *free_mb);

/* SHA-256 of the file at path, read AG_HOLD_CHUNK at a time (OpenSSL's EVP API); *stop
 * (may be NULL) is read between chunks and ends it with -ECANCELED. The file's size and
 * modification time when it was opened go to *bytes and *mtime_ns; a file that changes
 * meanwhile gives -EAGAIN. 0 and the digest in hex, or a negative code. */
int ag_hold_digest_file(const char *path, const atomic_int *stop, char out[65], uint64_t *bytes,
                        int64_t *mtime_ns);

/* The digest dir's cache file records for file at that size and time: 0 and out, or
 * -ENOENT. */
int ag_hold_cache_lookup(const char *dir, const char *file, uint64_t bytes, int64_t mtime_ns, char out[65]);
/* Record file's digest at that size and time in dir's cache file (written beside it and
 * renamed over it), dropping the entries of files that are gone or changed. 0 or a
 * negative code. */
int ag_hold_cache_store(const char *dir, const char *file, uint64_t bytes, int64_t mtime_ns, const char *hex);

/* ---- on the loop ------------------------------------------------------------------------ */

/* The folder watched from the loop: a scan at start and every AG_HOLD_SCAN_MS, then the
 * digest of each file that lacks one, one file at a time, on the thread pool. Owned by its
 * creator: ag_hold_stop, then ag_hold_free once on_stopped ran. */
typedef struct ag_hold ag_hold;

/* dir is copied; loop is borrowed. */
int ag_hold_new(ag_hold **out, uv_loop_t *loop, const char *dir);
void ag_hold_start(ag_hold *h);
/* Look again now (e.g. a download finished). */
void ag_hold_rescan(ag_hold *h);
/* Stop the timer, end a digest at its next chunk and wait for the thread pool to hand
 * back what it holds; on_stopped runs after. */
void ag_hold_stop(ag_hold *h, void (*on_stopped)(void *arg), void *arg);
void ag_hold_free(ag_hold *h);
/* ag_hold_switch_fits for a switch to model on this folder: its files as last scanned, its
 * free storage and NAME.gguf.part as they are now (a statvfs and a stat, once a switch). */
int ag_hold_switch_check(const ag_hold *h, const char *model, uint64_t size_bytes, double need_mem_mb,
                         const char *sha256, double mem_total_mb, char *why, size_t n);
/* models_dir, storage_free_mb and held[] of r from the last scan (strings borrowed until
 * the next one). */
void ag_hold_fill_report(const ag_hold *h, ag_report *r);

#endif
