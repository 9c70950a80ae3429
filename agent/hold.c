/* What the phone holds and what fits it; see hold.h and docs/agent.md. */
#include "hold.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "log.h"

#define MIB 1048576.0
#define CACHE_FILE_MAX (64 * 1024)

/* ---- the rules ------------------------------------------------------------------------ */

double ag_hold_usable_mb(double mem_total_mb) {
  if (!(mem_total_mb >= 0)) return -1;
  double reserve = mem_total_mb / 4 > AG_HOLD_RESERVE_MIN_MB ? mem_total_mb / 4 : AG_HOLD_RESERVE_MIN_MB;
  return mem_total_mb > reserve ? mem_total_mb - reserve : 0;
}

double ag_hold_need_mem_mb(uint64_t bytes) {
  return ceil((double)bytes / MIB * (1.0 + AG_HOLD_KV_SHARE) + AG_HOLD_ENGINE_MB);
}

int ag_hold_fits(const char *model, uint64_t model_bytes, double need_mem_mb, double mem_total_mb,
                 double storage_free_mb, uint64_t present_bytes, char *why, size_t n) {
  if (!model) model = "the model";
  if (need_mem_mb <= 0 && model_bytes > 0) need_mem_mb = ag_hold_need_mem_mb(model_bytes);
  double usable = ag_hold_usable_mb(mem_total_mb);
  if (need_mem_mb > 0 && usable >= 0 && need_mem_mb > usable) {
    snprintf(why, n, "cannot hold %s: it needs %.0f MiB of memory and this phone can give it %.0f MiB "
             "(MemTotal %.0f MiB less %.0f MiB kept for Android)", model, need_mem_mb, usable,
             mem_total_mb, mem_total_mb - usable);
    return 0;
  }
  double missing_mb = model_bytes > present_bytes ? (double)(model_bytes - present_bytes) / MIB : 0;
  double need_disk_mb = missing_mb > 0 ? ceil(missing_mb + AG_HOLD_DISK_MARGIN_MB) : 0;
  if (need_disk_mb > 0 && storage_free_mb >= 0 && need_disk_mb > storage_free_mb) {
    snprintf(why, n, "cannot hold %s: its file needs %.0f MiB more of storage in the models folder "
             "(with %.0f MiB to spare) and %.0f MiB are free", model, ceil(missing_mb),
             AG_HOLD_DISK_MARGIN_MB, storage_free_mb);
    return 0;
  }
  char mem[128], disk[128];
  if (need_mem_mb <= 0) snprintf(mem, sizeof(mem), "no memory need given");
  else if (usable < 0) snprintf(mem, sizeof(mem), "memory unknown (not checked)");
  else snprintf(mem, sizeof(mem), "%.0f of %.0f MiB of memory", need_mem_mb, usable);
  if (model_bytes == 0) snprintf(disk, sizeof(disk), "no size given");
  else if (need_disk_mb == 0) snprintf(disk, sizeof(disk), "its file is there");
  else if (storage_free_mb < 0) snprintf(disk, sizeof(disk), "storage unknown (not checked)");
  else snprintf(disk, sizeof(disk), "%.0f of %.0f MiB of storage", need_disk_mb, storage_free_mb);
  snprintf(why, n, "%s fits: %s, %s", model, mem, disk);
  return 1;
}

int ag_hold_switch_fits(const char *model, uint64_t size_bytes, double need_mem_mb, const char *sha256,
                        double mem_total_mb, double storage_free_mb, const ag_hold_file *held,
                        size_t n_held, uint64_t part_bytes, char *why, size_t n) {
  uint64_t present = part_bytes;
  for (size_t i = 0; model && i < n_held; i++) {
    if (strcmp(held[i].name, model) != 0) continue;
    /* fetch keeps a file with the digest as it is; another is downloaded anew beside it */
    int same = sha256 && held[i].sha256[0] ? strcmp(held[i].sha256, sha256) == 0
                                           : size_bytes == 0 || held[i].bytes == size_bytes;
    if (same) present = held[i].bytes > size_bytes ? held[i].bytes : size_bytes;
  }
  return ag_hold_fits(model, size_bytes, need_mem_mb, mem_total_mb, storage_free_mb, present, why, n);
}

int ag_hold_model_name(const char *file, char out[AG_HOLD_NAME_MAX + 1]) {
  size_t len = strlen(file);
  if (len <= 5 || strcasecmp(file + len - 5, ".gguf") != 0) return -EINVAL;
  len -= 5;
  if (len > AG_HOLD_NAME_MAX || file[0] == '.') return -EINVAL;
  for (size_t i = 0; i < len; i++) {
    char c = file[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return -EINVAL;
  }
  memcpy(out, file, len);
  out[len] = '\0';
  return 0;
}

/* ---- the cache file --------------------------------------------------------------------- */

typedef struct cache_entry {
  char hex[65];
  uint64_t bytes;
  int64_t mtime_ns;
  char file[NAME_MAX + 1];
} cache_entry;

static int valid_hex(const char *s) {
  if (strlen(s) != 64) return 0;
  for (const char *p = s; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
  return 1;
}

static int join(char *out, size_t n, const char *dir, const char *name) {
  int k = snprintf(out, n, "%s/%s", dir, name);
  return k < 0 || (size_t)k >= n ? -ENAMETOOLONG : 0;
}

/* dir's cache file into e (at most max entries): lines "HEX BYTES MTIME_NS FILE"; lines
 * that are not are skipped (a damaged file costs digests, never wrong ones). */
static size_t cache_load(const char *dir, cache_entry *e, size_t max) {
  char path[PATH_MAX];
  if (join(path, sizeof(path), dir, AG_HOLD_CACHE_FILE) < 0) return 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return 0;
  struct stat st;
  char *buf = NULL;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < CACHE_FILE_MAX && (buf = malloc(CACHE_FILE_MAX))) {
    ssize_t got = 0, k;
    while (got < CACHE_FILE_MAX - 1 && (k = read(fd, buf + got, (size_t)(CACHE_FILE_MAX - 1 - got))) != 0) {
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) break;
      got += k;
    }
    buf[got > 0 ? got : 0] = '\0';
  }
  close(fd);
  if (!buf) return 0;
  size_t n = 0;
  char *save = NULL;
  for (char *line = strtok_r(buf, "\n", &save); line && n < max; line = strtok_r(NULL, "\n", &save)) {
    if (line[0] == '#') continue;
    cache_entry *c = &e[n];
    char hex[80], file[NAME_MAX + 1];
    unsigned long long bytes;
    long long mt;
    int used = 0;
    if (sscanf(line, "%79s %llu %lld %n", hex, &bytes, &mt, &used) != 3 || !used) continue;
    snprintf(file, sizeof(file), "%s", line + used);
    if (!valid_hex(hex) || !file[0] || strchr(file, '/')) continue;
    snprintf(c->hex, sizeof(c->hex), "%s", hex);
    c->bytes = bytes;
    c->mtime_ns = mt;
    snprintf(c->file, sizeof(c->file), "%s", file);
    n++;
  }
  free(buf);
  return n;
}

static const cache_entry *cache_find(const cache_entry *e, size_t n, const char *file, uint64_t bytes,
                                     int64_t mtime_ns) {
  for (size_t i = n; i-- > 0;) /* the last entry for a name is the newest */
    if (strcmp(e[i].file, file) == 0 && e[i].bytes == bytes && e[i].mtime_ns == mtime_ns) return &e[i];
  return NULL;
}

int ag_hold_cache_lookup(const char *dir, const char *file, uint64_t bytes, int64_t mtime_ns, char out[65]) {
  cache_entry *e = calloc(AG_HOLD_CACHE_MAX, sizeof(*e));
  if (!e) return -ENOMEM;
  size_t n = cache_load(dir, e, AG_HOLD_CACHE_MAX);
  const cache_entry *c = cache_find(e, n, file, bytes, mtime_ns);
  int rc = -ENOENT;
  if (c) {
    memcpy(out, c->hex, 65);
    rc = 0;
  }
  free(e);
  return rc;
}

static int64_t mtime_of(const struct stat *st) {
  return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

int ag_hold_cache_store(const char *dir, const char *file, uint64_t bytes, int64_t mtime_ns, const char *hex) {
  if (!valid_hex(hex) || !file[0] || strchr(file, '/') || strchr(file, '\n') || strlen(file) > NAME_MAX)
    return -EINVAL;
  cache_entry *e = calloc(AG_HOLD_CACHE_MAX + 1, sizeof(*e));
  if (!e) return -ENOMEM;
  size_t n = cache_load(dir, e, AG_HOLD_CACHE_MAX), k = 0;
  char path[PATH_MAX], tmp[PATH_MAX];
  /* keep the entries whose files are still there as recorded, but not this file's */
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    if (strcmp(e[i].file, file) == 0) continue;
    if (join(path, sizeof(path), dir, e[i].file) < 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size != e[i].bytes || mtime_of(&st) != e[i].mtime_ns)
      continue;
    if (k != i) e[k] = e[i];
    k++;
  }
  if (k == AG_HOLD_CACHE_MAX) { /* full: the oldest goes */
    memmove(e, e + 1, (k - 1) * sizeof(*e));
    k--;
  }
  snprintf(e[k].hex, sizeof(e[k].hex), "%s", hex);
  e[k].bytes = bytes;
  e[k].mtime_ns = mtime_ns;
  snprintf(e[k].file, sizeof(e[k].file), "%s", file);
  k++;
  int rc = join(path, sizeof(path), dir, AG_HOLD_CACHE_FILE);
  if (rc == 0) rc = join(tmp, sizeof(tmp), dir, AG_HOLD_CACHE_FILE ".XXXXXX");
  int fd = rc == 0 ? mkstemp(tmp) : -1;
  if (rc == 0 && fd < 0) rc = -errno;
  if (fd >= 0) {
    FILE *fp = fdopen(fd, "w");
    if (!fp) {
      rc = -errno;
      close(fd);
    } else {
      fchmod(fd, 0644);
      fputs("# fleetgate-agent: SHA-256 of the model files here, by size and modification time "
            "(docs/agent.md)\n", fp);
      for (size_t i = 0; i < k; i++)
        fprintf(fp, "%s %" PRIu64 " %" PRId64 " %s\n", e[i].hex, e[i].bytes, e[i].mtime_ns, e[i].file);
      if (fflush(fp) != 0 || fsync(fd) != 0) rc = -errno;
      if (fclose(fp) != 0 && rc == 0) rc = -errno;
      if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
      if (rc != 0) unlink(tmp);
    }
  }
  free(e);
  return rc;
}

/* ---- the folder --------------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
  return strcmp(((const ag_hold_file *)a)->file, ((const ag_hold_file *)b)->file);
}

int ag_hold_scan_dir(const char *dir, ag_hold_file *out, size_t max, size_t *n, double *free_mb) {
  *n = 0;
  *free_mb = -1;
  struct statvfs vfs;
  if (statvfs(dir, &vfs) == 0) *free_mb = floor((double)vfs.f_bavail * (double)vfs.f_frsize / MIB);
  DIR *dp = opendir(dir);
  if (!dp) return -errno;
  /* every candidate first, then the first max by name: which ones are listed does not
   * depend on readdir's order */
  size_t cap = 64, got = 0;
  ag_hold_file *all = malloc(cap * sizeof(*all));
  struct dirent *de;
  char path[PATH_MAX];
  for (int i = 0; all && i < AG_HOLD_SCAN_ENTRIES && (de = readdir(dp)); i++) {
    ag_hold_file f;
    memset(&f, 0, sizeof(f));
    if (ag_hold_model_name(de->d_name, f.name) < 0) continue;
    struct stat st;
    if (join(path, sizeof(path), dir, de->d_name) < 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    memcpy(f.file, de->d_name, strlen(f.name) + 6); /* NAME.gguf: checked to fit */
    f.bytes = (uint64_t)st.st_size;
    f.mtime_ns = mtime_of(&st);
    if (got == cap) {
      ag_hold_file *more = realloc(all, 2 * cap * sizeof(*all));
      if (!more) break;
      all = more;
      cap *= 2;
    }
    all[got++] = f;
  }
  closedir(dp);
  if (!all) return -ENOMEM;
  qsort(all, got, sizeof(*all), by_name);
  if (got > max) got = max;
  cache_entry *e = calloc(AG_HOLD_CACHE_MAX, sizeof(*e));
  size_t ne = e ? cache_load(dir, e, AG_HOLD_CACHE_MAX) : 0;
  for (size_t i = 0; i < got; i++) {
    out[i] = all[i];
    const cache_entry *c = cache_find(e, ne, all[i].file, all[i].bytes, all[i].mtime_ns);
    if (c) memcpy(out[i].sha256, c->hex, 65);
  }
  *n = got;
  free(e);
  free(all);
  return 0;
}

static void hex_of(const unsigned char *d, unsigned n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (unsigned i = 0; i < n; i++) {
    out[2 * i] = digits[d[i] >> 4];
    out[2 * i + 1] = digits[d[i] & 15];
  }
  out[2 * n] = '\0';
}

int ag_hold_digest_file(const char *path, const atomic_int *stop, char out[65], uint64_t *bytes,
                        int64_t *mtime_ns) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return -errno;
  struct stat before, after;
  if (fstat(fd, &before) != 0 || !S_ISREG(before.st_mode)) {
    close(fd);
    return -EINVAL;
  }
  unsigned char *buf = malloc(AG_HOLD_CHUNK);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  int rc = !buf || !md ? -ENOMEM : EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 ? 0 : -EIO;
  while (rc == 0) {
    if (stop && atomic_load(stop)) {
      rc = -ECANCELED;
      break;
    }
    ssize_t k = read(fd, buf, AG_HOLD_CHUNK);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) rc = -errno;
    else if (k == 0) break;
    else if (EVP_DigestUpdate(md, buf, (size_t)k) != 1) rc = -EIO;
  }
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned dn = 0;
  if (rc == 0 && EVP_DigestFinal_ex(md, d, &dn) != 1) rc = -EIO;
  /* a file written meanwhile (a download, a copy) has no digest yet */
  if (rc == 0 && (fstat(fd, &after) != 0 || after.st_size != before.st_size || mtime_of(&after) != mtime_of(&before)))
    rc = -EAGAIN;
  if (rc == 0) {
    hex_of(d, dn, out);
    *bytes = (uint64_t)before.st_size;
    *mtime_ns = mtime_of(&before);
  }
  EVP_MD_CTX_free(md);
  free(buf);
  close(fd);
  return rc;
}

/* ---- on the loop ------------------------------------------------------------------------ */

enum { JOB_SCAN = 1, JOB_DIGEST };

/* What one trip to the thread pool takes and brings back. Written by the loop before the
 * work is queued and read by it after: the worker touches nothing else. */
typedef struct hold_job {
  int kind;
  int rc;
  ag_hold_file files[AG_REPORT_MAX_HELD]; /* scan */
  size_t n;
  double free_mb;
  ag_hold_file target;                    /* digest: the file (sha256 filled in) */
  int stored;                             /* the cache file took it (0) or not */
} hold_job;

struct ag_hold {
  uv_loop_t *loop;
  char *dir;
  uv_timer_t timer;
  uv_work_t work;
  hold_job job;
  int busy;                  /* work is on the thread pool */
  int rescan;                /* a scan was asked while busy */
  atomic_int stop;           /* read by a digest between chunks */
  int stopping, timer_open;
  void (*on_stopped)(void *arg);
  void *stopped_arg;
  /* the last scan, with the digests found since */
  ag_hold_file files[AG_REPORT_MAX_HELD];
  size_t n;
  double free_mb;
  int known;
  int scan_warned;
  /* files whose digest could not be read, left until they change */
  ag_hold_file failed[AG_REPORT_MAX_HELD];
  size_t n_failed;
};

static void work_run(uv_work_t *w) {
  ag_hold *h = w->data;
  hold_job *j = &h->job;
  if (j->kind == JOB_SCAN) {
    j->rc = ag_hold_scan_dir(h->dir, j->files, AG_REPORT_MAX_HELD, &j->n, &j->free_mb);
    return;
  }
  char path[PATH_MAX];
  uint64_t bytes = 0;
  int64_t mt = 0;
  j->rc = join(path, sizeof(path), h->dir, j->target.file);
  if (j->rc == 0) j->rc = ag_hold_digest_file(path, &h->stop, j->target.sha256, &bytes, &mt);
  if (j->rc == 0 && (bytes != j->target.bytes || mt != j->target.mtime_ns)) j->rc = -EAGAIN;
  if (j->rc == 0) j->stored = ag_hold_cache_store(h->dir, j->target.file, bytes, mt, j->target.sha256);
}

static int same_file(const ag_hold_file *a, const ag_hold_file *b) {
  return strcmp(a->file, b->file) == 0 && a->bytes == b->bytes && a->mtime_ns == b->mtime_ns;
}

static void hold_finish_stop(ag_hold *h) {
  if (!h->stopping || h->busy || h->timer_open) return;
  if (h->on_stopped) {
    void (*cb)(void *) = h->on_stopped;
    h->on_stopped = NULL;
    cb(h->stopped_arg);
  }
}

static void hold_queue(ag_hold *h, int kind);

/* The next file without a digest (and not failed as it is), or none. */
static void hold_next_digest(ag_hold *h) {
  for (size_t i = 0; i < h->n; i++) {
    if (h->files[i].sha256[0]) continue;
    int failed = 0;
    for (size_t k = 0; k < h->n_failed && !failed; k++) failed = same_file(&h->failed[k], &h->files[i]);
    if (failed) continue;
    h->job.target = h->files[i];
    hold_queue(h, JOB_DIGEST);
    return;
  }
}

static void scan_done(ag_hold *h) {
  hold_job *j = &h->job;
  if (j->rc < 0) {
    if (!h->scan_warned++) pr_warn("models folder %s: %s", h->dir, strerror(-j->rc));
    h->n = 0;
    h->free_mb = j->free_mb;
    h->known = 1;
    return;
  }
  h->scan_warned = 0;
  /* digests found earlier for the same files (size and time) carry over */
  for (size_t i = 0; i < j->n; i++)
    for (size_t k = 0; k < h->n && !j->files[i].sha256[0]; k++)
      if (same_file(&j->files[i], &h->files[k]) && h->files[k].sha256[0]) memcpy(j->files[i].sha256, h->files[k].sha256, 65);
  /* failures of files that changed or went are forgotten */
  size_t kept = 0;
  for (size_t k = 0; k < h->n_failed; k++) {
    int still = 0;
    for (size_t i = 0; i < j->n && !still; i++) still = same_file(&h->failed[k], &j->files[i]);
    if (still) h->failed[kept++] = h->failed[k];
  }
  h->n_failed = kept;
  memcpy(h->files, j->files, j->n * sizeof(j->files[0]));
  h->n = j->n;
  h->free_mb = j->free_mb;
  h->known = 1;
}

static void digest_done(ag_hold *h) {
  hold_job *j = &h->job;
  if (j->rc == -ECANCELED) return;
  for (size_t i = 0; i < h->n; i++) {
    if (!same_file(&h->files[i], &j->target)) continue;
    if (j->rc == 0) {
      memcpy(h->files[i].sha256, j->target.sha256, 65);
      cJSON *f = cJSON_CreateObject();
      cJSON_AddStringToObject(f, "file", j->target.file);
      cJSON_AddNumberToObject(f, "bytes", (double)j->target.bytes);
      cJSON_AddStringToObject(f, "sha256", j->target.sha256);
      pr_log_kv(PR_LOG_INFO, "model file digest", f);
      if (j->stored < 0) pr_warn("models folder %s: cannot record the digest: %s", h->dir, strerror(-j->stored));
    } else if (j->rc != -EAGAIN && h->n_failed < AG_REPORT_MAX_HELD) {
      /* unreadable as it is: not tried again until it changes */
      h->failed[h->n_failed++] = j->target;
      pr_warn("models folder %s: cannot read %s: %s", h->dir, j->target.file, strerror(-j->rc));
    }
    return;
  }
}

static void work_done(uv_work_t *w, int status) {
  ag_hold *h = w->data;
  h->busy = 0;
  if (status == 0 && !h->stopping) {
    if (h->job.kind == JOB_SCAN) scan_done(h);
    else digest_done(h);
  }
  if (h->stopping) {
    hold_finish_stop(h);
    return;
  }
  if (h->rescan) {
    h->rescan = 0;
    hold_queue(h, JOB_SCAN);
    return;
  }
  hold_next_digest(h);
}

static void hold_queue(ag_hold *h, int kind) {
  if (h->busy || h->stopping) {
    if (kind == JOB_SCAN) h->rescan = 1;
    return;
  }
  h->job.kind = kind;
  h->job.rc = 0;
  h->job.n = 0;
  h->job.stored = 0;
  h->work.data = h;
  if (uv_queue_work(h->loop, &h->work, work_run, work_done) == 0) h->busy = 1;
}

static void on_timer(uv_timer_t *t) { hold_queue(t->data, JOB_SCAN); }

int ag_hold_new(ag_hold **out, uv_loop_t *loop, const char *dir) {
  *out = NULL;
  ag_hold *h = calloc(1, sizeof(*h));
  if (!h) return -ENOMEM;
  if (!(h->dir = strdup(dir))) {
    free(h);
    return -ENOMEM;
  }
  h->loop = loop;
  h->free_mb = -1;
  atomic_init(&h->stop, 0);
  uv_timer_init(loop, &h->timer);
  h->timer.data = h;
  h->timer_open = 1;
  *out = h;
  return 0;
}

void ag_hold_start(ag_hold *h) {
  if (!h->stopping) uv_timer_start(&h->timer, on_timer, 0, AG_HOLD_SCAN_MS);
}

void ag_hold_rescan(ag_hold *h) { hold_queue(h, JOB_SCAN); }

static void timer_closed(uv_handle_t *handle) {
  ag_hold *h = handle->data;
  h->timer_open = 0;
  hold_finish_stop(h);
}

void ag_hold_stop(ag_hold *h, void (*on_stopped)(void *arg), void *arg) {
  if (h->stopping) return;
  h->stopping = 1;
  h->on_stopped = on_stopped;
  h->stopped_arg = arg;
  atomic_store(&h->stop, 1);
  if (h->busy) uv_cancel((uv_req_t *)&h->work); /* queued: called back with UV_ECANCELED */
  uv_close((uv_handle_t *)&h->timer, timer_closed);
}

void ag_hold_free(ag_hold *h) {
  if (!h) return;
  free(h->dir);
  free(h);
}

int ag_hold_switch_check(const ag_hold *h, const char *model, uint64_t size_bytes, double need_mem_mb,
                         const char *sha256, double mem_total_mb, char *why, size_t n) {
  double free_mb = -1;
  struct statvfs vfs;
  if (statvfs(h->dir, &vfs) == 0) free_mb = floor((double)vfs.f_bavail * (double)vfs.f_frsize / MIB);
  char path[PATH_MAX], file[AG_HOLD_NAME_MAX + 12];
  struct stat st;
  uint64_t part = 0;
  snprintf(file, sizeof(file), "%.*s.gguf.part", AG_HOLD_NAME_MAX, model);
  if (join(path, sizeof(path), h->dir, file) == 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode))
    part = (uint64_t)st.st_size;
  return ag_hold_switch_fits(model, size_bytes, need_mem_mb, sha256, mem_total_mb, free_mb, h->files, h->n,
                             part, why, n);
}

void ag_hold_fill_report(const ag_hold *h, ag_report *r) {
  r->models_dir = h->dir;
  r->storage_free_mb = h->free_mb;
  r->held_known = h->known;
  r->n_held = 0;
  for (size_t i = 0; i < h->n && r->n_held < AG_REPORT_MAX_HELD; i++) {
    ag_held *o = &r->held[r->n_held++];
    snprintf(o->name, sizeof(o->name), "%s", h->files[i].name);
    snprintf(o->file, sizeof(o->file), "%s", h->files[i].file);
    o->bytes = h->files[i].bytes;
    memcpy(o->sha256, h->files[i].sha256, sizeof(o->sha256));
  }
}
