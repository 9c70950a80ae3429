/* What phones' engines may hold, kept in data_dir; see cachescope.h. The log has one line
 * per widening, "ID VALUE\n" (VALUE: the scope's 16 hex digits, or "*" for several); the
 * last line about an id wins. Lines are appended with one write() each (O_APPEND), before
 * the request that widened it is sent; at start the log is read into a sorted table and
 * written back compacted (a temporary file, then rename()). */
#include "cachescope.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "replica.h"

#define MIXED UINT64_MAX /* the value of "several scopes" */
#define ID_MAX 128

typedef struct entry {
  char id[ID_MAX];
  uint64_t value; /* a scope, or MIXED */
  size_t line;    /* its place in the log, while it is read */
} entry;

typedef struct gw_cachescopes {
  char *path;    /* data_dir/cache-scopes.log; NULL: memory only */
  int fd;        /* open for appending; -1 none */
  entry *known;  /* from the log at start, sorted by id */
  size_t n;
  int warned;    /* a failed append was logged */
} gw_cachescopes;

static int by_id(const void *a, const void *b) {
  return strcmp(((const entry *)a)->id, ((const entry *)b)->id);
}

static int by_id_then_line(const void *a, const void *b) {
  int c = by_id(a, b);
  if (c) return c;
  size_t la = ((const entry *)a)->line, lb = ((const entry *)b)->line;
  return la < lb ? -1 : la > lb;
}

/* What r's engine may hold, as logged (0: nothing known to be there). */
static uint64_t value_of(const gw_replica *r) {
  if (r->pc.mixed) return MIXED;
  return r->pc.scope;
}

static int line_of(const char *id, uint64_t v, char *out, size_t n) {
  return v == MIXED ? snprintf(out, n, "%s *\n", id) : snprintf(out, n, "%s %016" PRIx64 "\n", id, v);
}

/* Read the log into s->known: the last value of each id. */
static int load(gw_cachescopes *s) {
  FILE *f = fopen(s->path, "r");
  if (!f) return errno == ENOENT ? 0 : -errno;
  char line[ID_MAX + 40];
  size_t bad = 0, cap = 0;
  while (fgets(line, sizeof(line), f)) {
    char *nl = strchr(line, '\n');
    char *sp = strrchr(line, ' ');
    if (!nl || !sp || sp == line || (size_t)(sp - line) >= ID_MAX) {
      bad++;
      if (!nl) { /* the rest of an over-long line */
        int c;
        while ((c = fgetc(f)) != EOF && c != '\n') {}
      }
      continue;
    }
    *nl = '\0';
    *sp = '\0';
    uint64_t v;
    char *end = NULL;
    if (strcmp(sp + 1, "*") == 0) {
      v = MIXED;
    } else {
      errno = 0;
      v = strtoull(sp + 1, &end, 16);
      if (errno || !end || *end || strlen(sp + 1) != 16 || v == 0 || v == MIXED) {
        bad++;
        continue;
      }
    }
    if (s->n == cap) {
      cap = cap ? cap * 2 : 256;
      entry *k = realloc(s->known, cap * sizeof(*k));
      if (!k) {
        fclose(f);
        return -ENOMEM;
      }
      s->known = k;
    }
    size_t idlen = (size_t)(sp - line); /* < ID_MAX, checked above */
    memcpy(s->known[s->n].id, line, idlen);
    s->known[s->n].id[idlen] = '\0';
    s->known[s->n].value = v;
    s->known[s->n].line = s->n;
    s->n++;
  }
  fclose(f);
  if (bad) pr_warn("%s: %zu damaged line(s) skipped", s->path, bad);
  /* the last line of an id wins: sorted by id, then by its place in the log */
  if (s->n) qsort(s->known, s->n, sizeof(*s->known), by_id_then_line); /* none: no table at all */
  size_t out = 0;
  for (size_t i = 0; i < s->n; i++) {
    if (out > 0 && strcmp(s->known[out - 1].id, s->known[i].id) == 0) s->known[out - 1] = s->known[i];
    else s->known[out++] = s->known[i];
  }
  s->n = out;
  if (s->n > GW_CACHESCOPE_MAX) s->n = GW_CACHESCOPE_MAX; /* the rest is unknown: reused by nobody */
  return 0;
}

/* Write the table back as the whole log, then open it for appending. */
static int compact(gw_cachescopes *s) {
  char tmp[4200];
  snprintf(tmp, sizeof(tmp), "%s.tmp", s->path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -errno;
  int rc = 0;
  char line[ID_MAX + 40];
  for (size_t i = 0; i < s->n && !rc; i++) {
    int len = line_of(s->known[i].id, s->known[i].value, line, sizeof(line));
    if (write(fd, line, (size_t)len) != len) rc = -EIO;
  }
  if (!rc && fsync(fd) != 0) rc = -errno;
  if (close(fd) != 0 && !rc) rc = -EIO;
  if (!rc && rename(tmp, s->path) != 0) rc = -errno;
  if (rc) {
    unlink(tmp);
    return rc;
  }
  s->fd = open(s->path, O_WRONLY | O_APPEND | O_CLOEXEC);
  return s->fd < 0 ? -errno : 0;
}

int gw_cachescope_open(gw_server *gw) {
  gw_cachescopes *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  s->fd = -1;
  gw->cachescopes = s;
  const char *dir = gw->conf->data_dir;
  if (!dir) return 0;
  size_t len = strlen(dir) + sizeof(GW_CACHESCOPE_FILE) + 2;
  if (len > 4000 || !(s->path = malloc(len))) return -ENOMEM;
  snprintf(s->path, len, "%s/%s", dir, GW_CACHESCOPE_FILE);
  int rc = load(s);
  if (rc == -ENOMEM) return rc;
  if (rc < 0) pr_warn("%s cannot be read (%s): every phone's prompt cache is taken as unknown",
                      s->path, strerror(-rc));
  rc = compact(s);
  if (rc < 0) pr_warn("%s cannot be written (%s): what phones' engines hold is kept only until "
                      "a restart", s->path, strerror(-rc));
  return 0;
}

/* Ids written into the log: printable, no space (the separator), short enough. An id that
 * is not stays unknown after a restart: reused by nobody until its engine loads again. */
static int loggable(const char *id) {
  size_t n = strlen(id);
  if (n == 0 || n >= ID_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)id[i] <= ' ' || (unsigned char)id[i] == 0x7f) return 0;
  return 1;
}

int gw_cachescope_note(gw_server *gw, gw_replica *r) {
  gw_cachescopes *s = gw->cachescopes;
  uint64_t v = value_of(r);
  if (!s || r->pc.agent || v == 0 || v == r->pc.logged) return 0;
  if (s->fd < 0 || !loggable(r->id)) {
    r->pc.logged = v; /* nothing is kept: a restart takes it as unknown */
    return 0;
  }
  char line[ID_MAX + 40];
  int len = line_of(r->id, v, line, sizeof(line));
  if (len <= 0 || (size_t)len >= sizeof(line) || write(s->fd, line, (size_t)len) != len ||
      fdatasync(s->fd) != 0) {
    if (!s->warned)
      pr_warn("%s: cannot append (%s): phones are sent uncached where the log would have said "
              "whose prompts they hold", s->path, strerror(errno));
    s->warned = 1;
    return -EIO;
  }
  r->pc.logged = v;
  return 0;
}

void gw_cachescope_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  gw_cachescopes *s = gw->cachescopes;
  gw_replica *r = ev->r;
  if (!s || !r || ev->kind != GW_FLEET_ADDED) return;
  entry key;
  snprintf(key.id, sizeof(key.id), "%s", r->id);
  const entry *e = s->n ? bsearch(&key, s->known, s->n, sizeof(*s->known), by_id) : NULL;
  if (e && e->value == MIXED)
    gw_pcache_restore(&r->pc, 0, 1);
  else if (e)
    gw_pcache_restore(&r->pc, e->value, 0);
  else if (gw->conf->n_cache_scopes > 1)
    gw_pcache_restore(&r->pc, 0, 2); /* unknown: it may hold any earlier caller's prompts */
  r->pc.logged = e ? e->value : 0;
}

void gw_cachescope_free(gw_server *gw) {
  gw_cachescopes *s = gw->cachescopes;
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  free(s->known);
  free(s->path);
  free(s);
  gw->cachescopes = NULL;
}
