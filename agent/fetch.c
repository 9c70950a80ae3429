/* fleetgate-agent fetch: downloads one file a phone's deployment needs (llama-server, the
 * model) and checks its SHA-256 before anyone runs it. The Acurast Shell runtime unpacks a
 * bare distribution image for every execution, without curl or wget, so the entry script
 * (deploy/acurast/run.sh) uses the agent's own libcurl and OpenSSL instead.
 *
 * The file is written to OUT.part while its digest is computed, fsynced, and renamed to OUT
 * only when the digest matches; a mismatch removes it. A download that breaks resumes with
 * a Range request where the server allows it (a GGUF is gigabytes on a phone's network),
 * else starts again; tries are spaced 2, 4, 8... up to 30 s. An OUT already there with the
 * right digest is kept as is, so a deployment may ship the file in its folder. Blocking
 * code: this runs as a command before the agent's loop exists. */
#include "fetch.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <sys/stat.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "hold.h"

#define FETCH_USAGE                                                                          \
  "usage: fleetgate-agent fetch [--ca FILE] [--tries N] [--max-bytes N] URL SHA256 OUT\n"   \
  "  downloads URL to OUT when its SHA-256 is SHA256 (64 hex digits); an OUT already\n"     \
  "  there with that digest is kept. URL: http:// or https://; redirects only to https.\n"  \
  "  --ca FILE       PEM certificates to verify https with (default: the system's)\n"       \
  "  --tries N       attempts, resuming where the server allows (default 5, 1-100)\n"       \
  "  --max-bytes N   refuse a file larger than N bytes (default 64 GiB)\n"                  \
  "  exit 0: OUT is there and checked; 1: failed (said on stderr); 2: usage\n"

enum { DIGEST_HEX = 64 };

typedef struct fetch {
  FILE *out;
  EVP_MD_CTX *md;
  uint64_t have;      /* bytes in OUT.part, all of them digested */
  uint64_t total;     /* the whole file's size when known (0: not yet) */
  uint64_t max_bytes;
  int too_big;
  int write_error;
  time_t last_report;
  time_t started;
  uint64_t started_at; /* `have` when this try started */
} fetch;

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  char *end;
  errno = 0;
  if (!s || !*s || *s == '-') return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int valid_digest(const char *s) {
  if (strlen(s) != DIGEST_HEX) return 0;
  for (const char *p = s; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F'))) return 0;
  return 1;
}

static void hex(const unsigned char *d, unsigned n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (unsigned i = 0; i < n; i++) {
    out[2 * i] = digits[d[i] >> 4];
    out[2 * i + 1] = digits[d[i] & 15];
  }
  out[2 * n] = 0;
}

static void human(uint64_t n, char *buf, size_t len) {
  if (n >= (1ull << 30)) snprintf(buf, len, "%.2f GiB", (double)n / (double)(1ull << 30));
  else if (n >= (1ull << 20)) snprintf(buf, len, "%.1f MiB", (double)n / (double)(1ull << 20));
  else snprintf(buf, len, "%" PRIu64 " B", n);
}

static void report(fetch *f, const char *what, int force) {
  time_t now = time(NULL);
  if (!force && now - f->last_report < 10) return;
  f->last_report = now;
  char have[32], total[32] = "", rate[48] = "";
  human(f->have, have, sizeof(have));
  double secs = difftime(now, f->started);
  if (secs >= 1) {
    char r[32];
    human((uint64_t)((double)(f->have - f->started_at) / secs), r, sizeof(r));
    snprintf(rate, sizeof(rate), ", %s/s", r);
  }
  if (f->total) {
    human(f->total, total, sizeof(total));
    fprintf(stderr, "fetch %s: %s of %s (%.0f %%)%s\n", what, have, total,
            100.0 * (double)f->have / (double)f->total, rate);
  } else {
    fprintf(stderr, "fetch %s: %s%s\n", what, have, rate);
  }
}

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
  fetch *f = ud;
  size_t len = size * n;
  if (f->have + len > f->max_bytes) {
    f->too_big = 1;
    return 0; /* curl stops with CURLE_WRITE_ERROR */
  }
  if (fwrite(p, 1, len, f->out) != len) {
    f->write_error = errno ? errno : EIO;
    return 0;
  }
  EVP_DigestUpdate(f->md, p, len);
  f->have += len;
  return len;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
  (void)dlnow, (void)ultotal, (void)ulnow;
  fetch *f = ud;
  /* dltotal counts this transfer only: after a resume it lacks what was there before */
  if (dltotal > 0) f->total = f->started_at + (uint64_t)dltotal;
  if (f->total > f->max_bytes) {
    f->too_big = 1;
    return 1;
  }
  report(f, "progress", 0);
  return 0;
}

/* Digest of a whole file into out (hex), or -1. */
static int file_digest(const char *path, char *out) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return -1;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  unsigned char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), fp)) > 0) EVP_DigestUpdate(md, buf, n);
  int bad = ferror(fp);
  fclose(fp);
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned dn = 0;
  EVP_DigestFinal_ex(md, d, &dn);
  EVP_MD_CTX_free(md);
  if (bad) return -1;
  hex(d, dn, out);
  return 0;
}

/* A model file (NAME.gguf) just checked: its digest goes into its folder's cache
 * (hold.h), by size and modification time, so the agent need not read it again. */
static void record_digest(const char *out, const char *hex) {
  const char *slash = strrchr(out, '/');
  const char *base = slash ? slash + 1 : out;
  char name[AG_HOLD_NAME_MAX + 1], dir[4096];
  struct stat sb;
  if (ag_hold_model_name(base, name) < 0 || stat(out, &sb) != 0) return;
  if (!slash) snprintf(dir, sizeof(dir), ".");
  else if (slash == out) snprintf(dir, sizeof(dir), "/");
  else snprintf(dir, sizeof(dir), "%.*s", (int)(slash - out), out);
  int64_t mt = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
  int rc = ag_hold_cache_store(dir, base, (uint64_t)sb.st_size, mt, hex);
  if (rc < 0) fprintf(stderr, "fetch: cannot record the digest in %s/%s: %s\n", dir, AG_HOLD_CACHE_FILE, strerror(-rc));
}

/* Start OUT.part afresh. */
static int restart(fetch *f, const char *part) {
  if (f->out) fclose(f->out);
  f->out = fopen(part, "wb");
  if (!f->out) return -1;
  EVP_DigestInit_ex(f->md, EVP_sha256(), NULL);
  f->have = 0;
  f->total = 0;
  return 0;
}

int ag_fetch_main(int argc, char **argv) {
  const char *ca = NULL, *pos[3];
  int npos = 0;
  uint64_t tries = 5, max_bytes = 64ull << 30;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(FETCH_USAGE, stdout);
      return 0;
    }
    if (!strcmp(a, "--ca") || !strcmp(a, "--tries") || !strcmp(a, "--max-bytes")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "fleetgate-agent fetch: %s needs a value\n%s", a, FETCH_USAGE);
        return 2;
      }
      const char *v = argv[++i];
      if (!strcmp(a, "--ca")) ca = v;
      else if (parse_u64(v, 1, !strcmp(a, "--tries") ? 100 : UINT64_MAX, !strcmp(a, "--tries") ? &tries : &max_bytes) < 0) {
        fprintf(stderr, "fleetgate-agent fetch: %s: not a number in range: '%s'\n", a, v);
        return 2;
      }
      continue;
    }
    if (a[0] == '-' && a[1]) {
      fprintf(stderr, "fleetgate-agent fetch: unknown option %s\n%s", a, FETCH_USAGE);
      return 2;
    }
    if (npos == 3) {
      fprintf(stderr, "fleetgate-agent fetch: too many arguments\n%s", FETCH_USAGE);
      return 2;
    }
    pos[npos++] = a;
  }
  if (npos != 3) {
    fputs(FETCH_USAGE, stderr);
    return 2;
  }
  const char *url = pos[0], *want = pos[1], *out = pos[2];
  if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) {
    fprintf(stderr, "fleetgate-agent fetch: the URL must be http:// or https://: '%s'\n", url);
    return 2;
  }
  if (!valid_digest(want)) {
    fprintf(stderr, "fleetgate-agent fetch: SHA256 must be 64 hex digits, not '%s'\n", want);
    return 2;
  }
  size_t olen = strlen(out);
  if (!olen || olen > 4000) {
    fprintf(stderr, "fleetgate-agent fetch: bad output path\n");
    return 2;
  }

  char got[2 * EVP_MAX_MD_SIZE + 1];
  if (access(out, F_OK) == 0 && file_digest(out, got) == 0 && !strcasecmp(got, want)) {
    fprintf(stderr, "fetch: %s is already there and checked (sha256 %s)\n", out, got);
    record_digest(out, got);
    return 0;
  }

  char *part = malloc(olen + 6);
  snprintf(part, olen + 6, "%s.part", out);
  fetch f;
  memset(&f, 0, sizeof(f));
  f.md = EVP_MD_CTX_new();
  f.max_bytes = max_bytes;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL *c = curl_easy_init();
  int rc = 1, complete = 0;
  if (!f.md || !c || restart(&f, part) < 0) {
    fprintf(stderr, "fleetgate-agent fetch: cannot write %s: %s\n", part, strerror(errno));
    goto done;
  }
  fprintf(stderr, "fetch: %s -> %s\n", url, out);
  for (uint64_t attempt = 1; attempt <= tries && !complete; attempt++) {
    if (attempt > 1) {
      unsigned wait = attempt - 1 >= 5 ? 30 : 1u << (attempt - 1);
      fprintf(stderr, "fetch: try %" PRIu64 " of %" PRIu64 " in %u s%s\n", attempt, tries, wait,
              f.have ? " (resuming)" : "");
      sleep(wait);
    }
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L); /* under 1 KiB/s for a minute: try again */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "fleetgate-agent/" FLEETGATE_VERSION);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &f);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &f);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    if (ca) curl_easy_setopt(c, CURLOPT_CAINFO, ca);
    if (f.have) curl_easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)f.have);
    f.started = f.last_report = time(NULL);
    f.started_at = f.have;
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    CURLcode cr = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (f.too_big) {
      fprintf(stderr, "fleetgate-agent fetch: %s is larger than %" PRIu64 " bytes (--max-bytes)\n", url,
              max_bytes);
      goto done;
    }
    if (f.write_error) {
      fprintf(stderr, "fleetgate-agent fetch: cannot write %s: %s\n", part, strerror(f.write_error));
      goto done;
    }
    if (cr == CURLE_OK) {
      complete = 1;
      break;
    }
    fprintf(stderr, "fetch: try %" PRIu64 " failed: %s\n", attempt, err[0] ? err : curl_easy_strerror(cr));
    /* A 4xx other than a timeout or rate limit will not change by asking again. */
    if (cr == CURLE_HTTP_RETURNED_ERROR && status >= 400 && status < 500 && status != 408 && status != 429 &&
        status != 416) {
      fprintf(stderr, "fleetgate-agent fetch: %s answered %ld\n", url, status);
      goto done;
    }
    /* The server would not resume (416, or no range support): start again. */
    if (cr == CURLE_RANGE_ERROR || status == 416 || cr == CURLE_BAD_DOWNLOAD_RESUME) {
      if (restart(&f, part) < 0) {
        fprintf(stderr, "fleetgate-agent fetch: cannot write %s: %s\n", part, strerror(errno));
        goto done;
      }
    }
    fflush(f.out);
  }
  if (!complete) {
    fprintf(stderr, "fleetgate-agent fetch: %s: gave up after %" PRIu64 " tries\n", url, tries);
    goto done;
  }
  report(&f, "done", 1);
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned dn = 0;
  EVP_DigestFinal_ex(f.md, d, &dn);
  hex(d, dn, got);
  if (fflush(f.out) != 0 || fsync(fileno(f.out)) != 0) {
    fprintf(stderr, "fleetgate-agent fetch: cannot write %s: %s\n", part, strerror(errno));
    goto done;
  }
  fclose(f.out);
  f.out = NULL;
  if (strcasecmp(got, want)) {
    fprintf(stderr, "fleetgate-agent fetch: sha256 mismatch for %s: expected %s, got %s (removed)\n", url, want,
            got);
    unlink(part);
    goto done;
  }
  if (rename(part, out) < 0) {
    fprintf(stderr, "fleetgate-agent fetch: cannot rename %s to %s: %s\n", part, out, strerror(errno));
    goto done;
  }
  fprintf(stderr, "fetch: %s checked (sha256 %s)\n", out, got);
  record_digest(out, got);
  rc = 0;
done:
  if (f.out) fclose(f.out);
  if (rc) unlink(part); /* a part that cannot be trusted is not left behind */
  curl_easy_cleanup(c);
  EVP_MD_CTX_free(f.md);
  curl_global_cleanup();
  free(part);
  return rc;
}
