/* The Batch API's routes: /v1/files (multipart uploads written to disk as they arrive,
 * lists, content, delete) and /v1/batches (create, get, list, cancel), in OpenAI's
 * shapes; see batch.h and docs/batch.md. The runner is batch.c's. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "auth.h"
#include "batch.h"
#include "batchrun.h"
#include "bquota.h"
#include "caps.h"
#include "err.h"
#include "log.h"
#include "multipart.h"
#include "shared.h"

#define UPLOAD_OVERHEAD (1u << 20)    /* multipart framing allowed beyond the file itself */
#define BATCHES_MAX_BODY (64u << 10)   /* POST /v1/batches */
#define CONTENT_CHUNK (256u << 10)     /* a file's bytes per write when its content is read */
#define FILES_LIST_MAX 10000
#define FILES_PAGE 500             /* file records read at once for a list */
#define BATCHES_LIST_MAX 100
#define METADATA_PAIRS 16

static const char *owner_of(const gw_caller *c) { return c ? c->name : ""; }
/* The name a caller is told in a quota's message. */
static const char *label_of(const char *owner) { return owner[0] ? owner : "anonymous"; }

static void quota_refused(pr_http_req *req, const char *rid, const gw_bquota_no *no) {
  gw_respond_error(req, rid, no->status, no->type, NULL, no->code, no->retry_after_s, "%s", no->msg);
}

/* An upload or a batch's creation counts against the key's requests per minute (with
 * several gateways, each counts its share). 0, or it was answered 429. */
static int take_request(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  if (!caller) return 0;
  char msg[256];
  int retry = 0;
  if (!gw_auth_take_request(gw, caller, gw_shared_gateways(gw), &retry, msg, sizeof(msg))) return 0;
  gw_respond_error(req, rid, 429, "rate_limit_error", NULL, "rate_limit_exceeded", retry, "%s", msg);
  return -1;
}

static void not_found(pr_http_req *req, const char *rid, const char *what, const char *id) {
  gw_respond_error(req, rid, 404, "invalid_request_error", "id", "not_found", 0,
                   "No such %s object: %.100s", what, id);
}

static void store_error(pr_http_req *req, const char *rid, gw_bstore *st) {
  gw_respond_error(req, rid, 500, "server_error", NULL, "storage_error", 0,
                   "the batch store failed: %s", gw_bstore_error(st));
}

/* The value of query parameter key (percent-decoded) into out; 1 found, 0 not. */
static int query_get(const char *q, const char *key, char *out, size_t n) {
  size_t kl = strlen(key);
  for (const char *p = q; p && *p;) {
    const char *amp = strchr(p, '&');
    size_t len = amp ? (size_t)(amp - p) : strlen(p);
    if (len > kl && strncmp(p, key, kl) == 0 && p[kl] == '=') {
      size_t k = 0;
      for (size_t i = kl + 1; i < len && k + 1 < n; i++) {
        char c = p[i];
        if (c == '+') {
          c = ' ';
        } else if (c == '%' && i + 2 < len && isxdigit((unsigned char)p[i + 1]) &&
                   isxdigit((unsigned char)p[i + 2])) {
          char hx[3] = {p[i + 1], p[i + 2], 0};
          c = (char)strtol(hx, NULL, 16);
          i += 2;
        }
        out[k++] = c;
      }
      out[k] = '\0';
      return 1;
    }
    p = amp ? amp + 1 : NULL;
  }
  return 0;
}

/* limit: absent gives dflt; 1..max, else -1. */
static int query_limit(const char *q, int dflt, int max) {
  char v[32];
  if (!query_get(q, "limit", v, sizeof(v))) return dflt;
  char *end;
  long n = strtol(v, &end, 10);
  return *end || end == v || n < 1 || n > max ? -1 : (int)n;
}

/* ---- file objects -------------------------------------------------------------------- */

static cJSON *file_json(const gw_file_rec *f) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", f->id);
  cJSON_AddStringToObject(o, "object", "file");
  cJSON_AddNumberToObject(o, "bytes", (double)f->bytes);
  cJSON_AddNumberToObject(o, "created_at", (double)f->created_at);
  if (f->expires_at > 0) cJSON_AddNumberToObject(o, "expires_at", (double)f->expires_at);
  else cJSON_AddNullToObject(o, "expires_at");
  cJSON_AddStringToObject(o, "filename", f->filename);
  cJSON_AddStringToObject(o, "purpose", f->purpose);
  cJSON_AddStringToObject(o, "status", "processed");
  cJSON_AddNullToObject(o, "status_details");
  return o;
}

/* ---- uploads ------------------------------------------------------------------------- */

typedef struct upload {
  gw_server *gw;
  char owner[GW_BSTORE_OWNER_MAX];  /* whose quota it counts in (gw_batches_use) */
  int counted;                       /* counted as arriving there... */
  int64_t held;                      /* ...with these bytes */
  pr_multipart mp;
  int fd;
  char tmp[4096];
  int64_t bytes;
  int in_file, files;
  char field[PR_MULTIPART_VALUE_MAX + 1];
  char val[256];
  size_t val_len;
  int val_long;
  char purpose[256], filename[256], anchor[256], seconds[256];
  int have_purpose, have_anchor, have_seconds;
  /* why the upload stopped, to answer with (status 0: it did not) */
  int fail_status;
  const char *fail_code, *fail_param;
  char fail_msg[400];
} upload;

static void upload_free(upload *u) {
  if (!u) return;
  gw_bquota_use *use = u->counted ? gw_batches_use(u->gw, u->owner) : NULL;
  if (use) gw_bquota_upload_end(use, u->held, 0); /* not stored: nothing of it is kept */
  if (u->fd >= 0) close(u->fd);
  if (u->tmp[0]) unlink(u->tmp);
  free(u);
}

static int upload_fail(upload *u, int status, const char *code, const char *param, const char *msg) {
  if (!u->fail_status) {
    u->fail_status = status;
    u->fail_code = code;
    u->fail_param = param;
    snprintf(u->fail_msg, sizeof(u->fail_msg), "%s", msg);
  }
  return 1;
}

static int up_begin(void *ud, const char *name, const char *filename, const char *ctype) {
  upload *u = ud;
  (void)ctype;
  if (strcmp(name, "file") == 0) {
    if (++u->files > 1) return upload_fail(u, 400, "invalid_request", "file", "only one file may be uploaded at a time");
    if (!filename || !filename[0])
      return upload_fail(u, 400, "invalid_request", "file", "the file part needs a filename");
    snprintf(u->filename, sizeof(u->filename), "%s", filename);
    u->in_file = 1;
    return 0;
  }
  u->in_file = 0;
  snprintf(u->field, sizeof(u->field), "%s", name);
  u->val_len = 0;
  u->val_long = 0;
  return 0;
}

static int up_data(void *ud, const char *data, size_t len) {
  upload *u = ud;
  if (!u->in_file) {
    if (u->val_len + len >= sizeof(u->val)) u->val_long = 1;
    else {
      memcpy(u->val + u->val_len, data, len);
      u->val_len += len;
    }
    return 0;
  }
  const gw_config *c = u->gw->conf;
  if ((uint64_t)u->bytes + len > c->batch_max_file_bytes) {
    char m[200];
    snprintf(m, sizeof(m), "the file is larger than this gateway takes (%zu bytes, batch.max_file_bytes)",
             c->batch_max_file_bytes);
    return upload_fail(u, 413, "file_too_large", "file", m);
  }
  /* the key's stored bytes with its uploads arriving stay within its quota */
  gw_bquota_use *use = u->counted ? gw_batches_use(u->gw, u->owner) : NULL;
  gw_bquota_no no;
  if (use && gw_bquota_upload_grow(gw_batches_quota(u->gw, u->owner), use, label_of(u->owner),
                                   (int64_t)len, &no))
    return upload_fail(u, no.status, no.code, NULL, no.msg);
  if (use) u->held += (int64_t)len;
  while (len) {
    ssize_t w = write(u->fd, data, len);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      char m[200];
      snprintf(m, sizeof(m), "the gateway could not store the file: %s", strerror(errno));
      pr_error("upload failed: data_dir: %s", strerror(errno));
      return upload_fail(u, 507, "storage_error", NULL, m);
    }
    data += w;
    len -= (size_t)w;
    u->bytes += w;
  }
  return 0;
}

static int up_end(void *ud) {
  upload *u = ud;
  if (u->in_file) {
    u->in_file = 0;
    return 0;
  }
  if (u->val_long) return upload_fail(u, 400, "invalid_request", u->field, "a form field is too long");
  u->val[u->val_len] = '\0';
  if (strcmp(u->field, "purpose") == 0) {
    snprintf(u->purpose, sizeof(u->purpose), "%s", u->val);
    u->have_purpose = 1;
  } else if (strcmp(u->field, "expires_after[anchor]") == 0) {
    snprintf(u->anchor, sizeof(u->anchor), "%s", u->val);
    u->have_anchor = 1;
  } else if (strcmp(u->field, "expires_after[seconds]") == 0) {
    snprintf(u->seconds, sizeof(u->seconds), "%s", u->val);
    u->have_seconds = 1;
  }
  return 0;
}

static const pr_multipart_ops upload_ops = {up_begin, up_data, up_end};

static void upload_answer_failure(pr_http_req *req, upload *u) {
  char rid[128];
  gw_request_id(u->gw, req, rid, sizeof(rid));
  req->on_abort = NULL;
  req->on_body_data = NULL;
  req->data = NULL;
  gw_respond_error(req, rid, u->fail_status,
                   u->fail_status >= 500 ? "server_error" : "invalid_request_error", u->fail_param,
                   u->fail_code, 0, "%s", u->fail_msg);
  upload_free(u);
}

static int upload_body(pr_http_req *req, const char *at, size_t n) {
  upload *u = req->data;
  int rc = pr_multipart_feed(&u->mp, at, n);
  if (rc && !u->fail_status) {
    char m[300];
    snprintf(m, sizeof(m), "malformed multipart/form-data body: %s", pr_multipart_error(&u->mp));
    upload_fail(u, 400, "invalid_multipart", NULL, m);
  }
  if (u->fail_status) upload_answer_failure(req, u); /* now: the rest is not read */
  return 0;
}

static void upload_gone(pr_http_req *req) {
  upload *u = req->data;
  req->data = NULL;
  upload_free(u);
}

static void upload_begin(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  const gw_config *c = gw->conf;
  char boundary[PR_MULTIPART_BOUNDARY_MAX + 1];
  const char *ct = pr_http_header_get(req, "content-type");
  if (!ct || pr_multipart_boundary(ct, boundary, sizeof(boundary)) != 0) {
    gw_respond_error(req, rid, 400, "invalid_request_error", NULL, "invalid_content_type", 0,
                     "POST /v1/files takes multipart/form-data with a boundary (the fields "
                     "`purpose` and `file`)");
    return;
  }
  const char *cl = pr_http_header_get(req, "content-length");
  if (cl && strtoull(cl, NULL, 10) > c->batch_max_file_bytes + UPLOAD_OVERHEAD) {
    gw_respond_error(req, rid, 413, "invalid_request_error", "file", "file_too_large", 0,
                     "the file is larger than this gateway takes (%zu bytes, batch.max_file_bytes)",
                     c->batch_max_file_bytes);
    return;
  }
  /* the key's quotas (files, bytes from the Content-Length, uploads per minute), then its
   * requests per minute: refused before a byte of the body is read */
  const char *owner = owner_of(caller);
  gw_bquota_use *use = gw_batches_use(gw, owner);
  const gw_bquota *q = gw_batches_quota(gw, owner);
  uint64_t now = uv_now(gw->loop);
  gw_bquota_no no;
  if (!use) {
    gw_respond_error(req, rid, 500, "server_error", NULL, NULL, 0, "out of memory");
    return;
  }
  if (gw_bquota_upload_check(q, use, label_of(owner), cl ? (int64_t)strtoull(cl, NULL, 10) : -1, now, &no)) {
    quota_refused(req, rid, &no);
    return;
  }
  if (take_request(gw, req, rid, caller)) return;
  upload *u = calloc(1, sizeof(*u));
  if (!u) {
    gw_respond_error(req, rid, 500, "server_error", NULL, NULL, 0, "out of memory");
    return;
  }
  u->gw = gw;
  snprintf(u->owner, sizeof(u->owner), "%s", owner);
  gw_bquota_upload_begin(q, use, now);
  u->counted = 1;
  char id[GW_BSTORE_ID_MAX];
  gw_batch_new_id(id, sizeof(id), ".upload-");
  gw_bstore_path(gw_batches_store(gw), id, u->tmp, sizeof(u->tmp));
  u->fd = open(u->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (u->fd < 0) {
    int e = errno;
    u->tmp[0] = '\0';
    upload_free(u);
    pr_error("upload failed: data_dir: %s", strerror(e));
    gw_respond_error(req, rid, 507, "server_error", NULL, "storage_error", 0,
                     "the gateway could not store the file: %s", strerror(e));
    return;
  }
  pr_multipart_init(&u->mp, boundary, &upload_ops, u);
  req->data = u;
  req->on_body_data = upload_body;
  req->on_abort = upload_gone;
  req->max_body = c->batch_max_file_bytes + UPLOAD_OVERHEAD;
}

static void upload_finish(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  upload *u = req->data;
  req->on_abort = NULL;
  req->on_body_data = NULL;
  req->data = NULL;
  if (!u) {
    gw_respond_error(req, rid, 400, "invalid_request_error", NULL, "invalid_multipart", 0,
                     "POST /v1/files takes multipart/form-data with the fields `purpose` and `file`");
    return;
  }
  if (!u->fail_status && pr_multipart_finish(&u->mp) != 0) {
    char m[300];
    snprintf(m, sizeof(m), "malformed multipart/form-data body: %s", pr_multipart_error(&u->mp));
    upload_fail(u, 400, "invalid_multipart", NULL, m);
  }
  int64_t expires = 0, now = gw_batch_now();
  if (!u->fail_status) {
    if (!u->have_purpose)
      upload_fail(u, 400, "missing_required_parameter", "purpose", "the field `purpose` is required");
    else if (strcmp(u->purpose, "batch") != 0)
      upload_fail(u, 400, "invalid_value", "purpose",
                  "this gateway stores files for the Batch API only: `purpose` must be \"batch\"");
    else if (!u->files)
      upload_fail(u, 400, "missing_required_parameter", "file", "the field `file` is required");
  }
  /* OpenAI's default for purpose "batch": batch.file_expires_s, unless expires_after says */
  if (!u->have_anchor && !u->have_seconds && gw->conf->batch_file_expires_s > 0)
    expires = now + (int64_t)gw->conf->batch_file_expires_s;
  if (!u->fail_status && (u->have_anchor || u->have_seconds)) {
    char *end = NULL;
    long long secs = u->have_seconds ? strtoll(u->seconds, &end, 10) : 0;
    if (!u->have_anchor || strcmp(u->anchor, "created_at") != 0)
      upload_fail(u, 400, "invalid_value", "expires_after[anchor]", "expires_after[anchor] must be \"created_at\"");
    else if (!u->have_seconds || !end || *end || secs < 3600 || secs > 2592000)
      upload_fail(u, 400, "invalid_value", "expires_after[seconds]",
                  "expires_after[seconds] must be a whole number from 3600 to 2592000");
    else
      expires = now + secs;
  }
  if (u->fail_status) {
    upload_answer_failure(req, u);
    return;
  }
  gw_bstore *st = gw_batches_store(gw);
  gw_file_rec f;
  memset(&f, 0, sizeof(f));
  gw_batch_new_id(f.id, sizeof(f.id), "file-");
  (void)caller; /* the key the upload began with (its quota counted it) */
  snprintf(f.owner, sizeof(f.owner), "%s", u->owner);
  snprintf(f.filename, sizeof(f.filename), "%s", u->filename);
  snprintf(f.purpose, sizeof(f.purpose), "batch");
  f.bytes = u->bytes;
  f.created_at = now;
  f.expires_at = expires;
  char path[4096];
  gw_bstore_path(st, f.id, path, sizeof(path));
  int rc = 0;
  if (gw->conf->batch_sync && fsync(u->fd) != 0) rc = -errno;
  if (!rc && rename(u->tmp, path) != 0) rc = -errno;
  if (rc) {
    upload_fail(u, 507, "storage_error", NULL, "the gateway could not store the file");
    snprintf(u->fail_msg, sizeof(u->fail_msg), "the gateway could not store the file: %s", strerror(-rc));
    upload_answer_failure(req, u);
    return;
  }
  u->tmp[0] = '\0'; /* it has its name now */
  int64_t seq = gw_bstore_next_seq(st);
  f.seq = seq;
  if (seq < 0 || gw_bstore_file_put(st, &f) != 0) {
    unlink(path);
    upload_free(u);
    store_error(req, rid, st);
    return;
  }
  /* a file of the key's now */
  gw_bquota_use *use = u->counted ? gw_batches_use(gw, u->owner) : NULL;
  if (use) gw_bquota_upload_end(use, u->held, 1);
  u->counted = 0;
  upload_free(u);
  gw_batches_sweep_by(gw, f.expires_at);
  gw_respond_json(req, rid, 200, file_json(&f));
}

/* ---- file content ------------------------------------------------------------------- */

typedef struct fstream {
  pr_http_req *req;
  int fd;
  int64_t off, end;
} fstream;

static void fstream_free(fstream *s) {
  if (s->fd >= 0) close(s->fd);
  free(s);
}

static void fstream_pump(fstream *s);

static void fstream_drained(pr_http_req *req) { fstream_pump(req->data); }

static void fstream_gone(pr_http_req *req) {
  fstream *s = req->data;
  req->data = NULL;
  fstream_free(s);
}

static void fstream_pump(fstream *s) {
  static char buf[CONTENT_CHUNK]; /* one loop: copied into the connection at once */
  for (;;) {
    if (s->off >= s->end) {
      pr_http_req *req = pr_http_req_let_go(s->req);
      fstream_free(s);
      pr_http_end(req);
      return;
    }
    size_t want = (size_t)(s->end - s->off < (int64_t)sizeof(buf) ? s->end - s->off : (int64_t)sizeof(buf));
    ssize_t got = pread(s->fd, buf, want, (off_t)s->off);
    if (got <= 0) {
      /* the file went short under us: the client sees a cut answer, not a whole one */
      pr_http_req *req = pr_http_req_let_go(s->req);
      fstream_free(s);
      pr_http_abort(req);
      return;
    }
    s->off += got;
    int rc = pr_http_write(s->req, buf, (size_t)got);
    if (rc < 0) return; /* gone: on_abort frees s */
    if (rc == 1) return; /* behind: on_drain goes on */
  }
}

static void file_content(gw_server *gw, pr_http_req *req, const char *rid, const gw_file_rec *f) {
  char path[4096];
  gw_bstore_path(gw_batches_store(gw), f->id, path, sizeof(path));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  fstream *s = fd >= 0 ? calloc(1, sizeof(*s)) : NULL;
  if (!s) {
    if (fd >= 0) close(fd);
    gw_respond_error(req, rid, 500, "server_error", NULL, "storage_error", 0,
                     "the file's bytes cannot be read: %s", fd < 0 ? strerror(errno) : "out of memory");
    return;
  }
  s->req = req;
  s->fd = fd;
  s->end = f->bytes;
  char h[160], cd[400];
  snprintf(h, sizeof(h), "x-request-id: %s", rid);
  snprintf(cd, sizeof(cd), "Content-Disposition: attachment; filename=\"%s\"", f->id);
  const char *hdrs[] = {h, cd, NULL};
  if (pr_http_start(req, 200, hdrs, "application/octet-stream") != 0 ||
      strcmp(req->method, "HEAD") == 0) {
    fstream_free(s);
    pr_http_end(req);
    return;
  }
  req->data = s;
  req->on_abort = fstream_gone;
  req->on_drain = fstream_drained;
  fstream_pump(s);
}

/* ---- /v1/files ----------------------------------------------------------------------- */

static void files_list(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  gw_bstore *st = gw_batches_store(gw);
  int limit = query_limit(req->query, FILES_LIST_MAX, FILES_LIST_MAX);
  char purpose[32], after[GW_BSTORE_ID_MAX + 8], order[8];
  int has_purpose = query_get(req->query, "purpose", purpose, sizeof(purpose));
  int has_after = query_get(req->query, "after", after, sizeof(after));
  int asc = 0;
  if (query_get(req->query, "order", order, sizeof(order))) {
    if (strcmp(order, "asc") == 0) asc = 1;
    else if (strcmp(order, "desc") != 0) limit = -2;
  }
  if (limit < 0) {
    gw_respond_error(req, rid, 400, "invalid_request_error", limit == -2 ? "order" : "limit",
                     "invalid_value", 0, limit == -2 ? "order must be \"asc\" or \"desc\""
                                                     : "limit must be a whole number from 1 to %d",
                     FILES_LIST_MAX);
    return;
  }
  /* read in pages of FILES_PAGE rows, so a list of 10,000 holds no more than a page of
   * records at once */
  gw_file_rec *v = calloc(FILES_PAGE + 1, sizeof(*v));
  if (!v) {
    gw_respond_error(req, rid, 500, "server_error", NULL, NULL, 0, "out of memory");
    return;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON *data = cJSON_AddArrayToObject(o, "data");
  char first[GW_BSTORE_ID_MAX] = "", last[GW_BSTORE_ID_MAX] = "";
  int left = limit, more = 0;
  const char *cursor = has_after ? after : NULL;
  while (left > 0) {
    int want = left < FILES_PAGE ? left : FILES_PAGE;
    int n = gw_bstore_file_list(st, owner_of(caller), has_purpose ? purpose : NULL, cursor, asc,
                                want, v);
    if (n < 0) {
      free(v);
      cJSON_Delete(o);
      if (n == PR_EUNKNOWN)
        gw_respond_error(req, rid, 400, "invalid_request_error", "after", "invalid_value", 0,
                         "after: no such file: %.100s", after);
      else
        store_error(req, rid, st);
      return;
    }
    int shown = n > want ? want : n;
    for (int i = 0; i < shown; i++) cJSON_AddItemToArray(data, file_json(&v[i]));
    if (shown && !first[0]) snprintf(first, sizeof(first), "%s", v[0].id);
    if (shown) snprintf(last, sizeof(last), "%s", v[shown - 1].id);
    more = n > want;
    left -= shown;
    if (!more) break;
    cursor = last;
  }
  free(v);
  if (first[0]) {
    cJSON_AddStringToObject(o, "first_id", first);
    cJSON_AddStringToObject(o, "last_id", last);
  } else {
    cJSON_AddNullToObject(o, "first_id");
    cJSON_AddNullToObject(o, "last_id");
  }
  cJSON_AddBoolToObject(o, "has_more", more);
  gw_respond_json(req, rid, 200, o);
}

static void files_route(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  const char *path = req->path;
  int is_get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
  int is_post = strcmp(req->method, "POST") == 0;
  int is_delete = strcmp(req->method, "DELETE") == 0;
  gw_bstore *st = gw_batches_store(gw);
  if (strcmp(path, "/v1/files") == 0) {
    if (is_post) upload_finish(gw, req, rid, caller);
    else if (is_get) files_list(gw, req, rid, caller);
    else gw_respond_error(req, rid, 405, "invalid_request_error", NULL, "method_not_allowed", 0,
                          "/v1/files takes GET or POST");
    return;
  }
  char id[GW_BSTORE_ID_MAX + 1];
  const char *rest = path + strlen("/v1/files/");
  const char *slash = strchr(rest, '/');
  size_t idl = slash ? (size_t)(slash - rest) : strlen(rest);
  int content = slash && strcmp(slash, "/content") == 0;
  if (idl == 0 || idl >= sizeof(id) || (slash && !content)) {
    gw_respond_error(req, rid, 404, "invalid_request_error", NULL, "unknown_url", 0,
                     "Unknown request URL: %s %.200s", req->method, path);
    return;
  }
  memcpy(id, rest, idl);
  id[idl] = '\0';
  if (!(is_get || (is_delete && !content))) {
    gw_respond_error(req, rid, 405, "invalid_request_error", NULL, "method_not_allowed", 0,
                     "%.200s takes %s", path, content ? "GET" : "GET or DELETE");
    return;
  }
  gw_file_rec f;
  int rc = gw_bstore_file_get(st, id, owner_of(caller), &f);
  if (rc == PR_EUNKNOWN) {
    not_found(req, rid, "File", id);
    return;
  }
  if (rc) {
    store_error(req, rid, st);
    return;
  }
  if (content) {
    file_content(gw, req, rid, &f);
  } else if (is_get) {
    gw_respond_json(req, rid, 200, file_json(&f));
  } else {
    if (gw_bstore_file_in_use(st, id) == 1) {
      gw_respond_error(req, rid, 409, "invalid_request_error", "id", "file_in_use", 0,
                       "the file %s is the input of a batch that has not ended", id);
      return;
    }
    char p[4096];
    gw_bstore_path(st, id, p, sizeof(p));
    if (gw_bstore_file_delete(st, id) != 0) {
      store_error(req, rid, st);
      return;
    }
    unlink(p);
    gw_bquota_use *use = gw_batches_use(gw, f.owner);
    if (use) {
      use->files -= use->files > 0;
      use->file_bytes -= f.bytes;
      if (use->file_bytes < 0) use->file_bytes = 0;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "file");
    cJSON_AddBoolToObject(o, "deleted", 1);
    gw_respond_json(req, rid, 200, o);
  }
}

/* ---- /v1/batches --------------------------------------------------------------------- */

static int bad(pr_http_req *req, const char *rid, const char *param, const char *code, const char *msg) {
  gw_respond_error(req, rid, 400, "invalid_request_error", param, code, 0, "%s", msg);
  return -1;
}

static void batch_create(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  gw_bstore *st = gw_batches_store(gw);
  cJSON *o = cJSON_ParseWithLength(req->body.data ? req->body.data : "", req->body.len);
  if (!cJSON_IsObject(o)) {
    cJSON_Delete(o);
    bad(req, rid, NULL, "invalid_json", "the body must be a JSON object");
    return;
  }
  const cJSON *in = cJSON_GetObjectItemCaseSensitive(o, "input_file_id");
  const cJSON *ep = cJSON_GetObjectItemCaseSensitive(o, "endpoint");
  const cJSON *win = cJSON_GetObjectItemCaseSensitive(o, "completion_window");
  const cJSON *md = cJSON_GetObjectItemCaseSensitive(o, "metadata");
  int rc = 0;
  if (!cJSON_IsString(in) || !in->valuestring[0])
    rc = bad(req, rid, "input_file_id", "missing_required_parameter", "input_file_id (a string) is required");
  else if (!cJSON_IsString(ep))
    rc = bad(req, rid, "endpoint", "missing_required_parameter", "endpoint (a string) is required");
  else if (strcmp(ep->valuestring, "/v1/chat/completions") != 0 && strcmp(ep->valuestring, "/v1/completions") != 0)
    rc = bad(req, rid, "endpoint", "invalid_value",
             "endpoint must be \"/v1/chat/completions\" or \"/v1/completions\" (the fleet serves no other)");
  else if (!cJSON_IsString(win))
    rc = bad(req, rid, "completion_window", "missing_required_parameter", "completion_window (a string) is required");
  else if (strcmp(win->valuestring, "24h") != 0)
    rc = bad(req, rid, "completion_window", "invalid_value", "completion_window must be \"24h\"");
  else if (md && !cJSON_IsNull(md)) {
    int n = 0;
    if (!cJSON_IsObject(md)) rc = bad(req, rid, "metadata", "invalid_value", "metadata must be an object");
    for (const cJSON *kv = cJSON_IsObject(md) ? md->child : NULL; kv && !rc; kv = kv->next) {
      if (++n > METADATA_PAIRS)
        rc = bad(req, rid, "metadata", "invalid_value", "metadata holds at most 16 pairs");
      else if (strlen(kv->string) > 64)
        rc = bad(req, rid, "metadata", "invalid_value", "a metadata key is at most 64 characters");
      else if (!cJSON_IsString(kv) || strlen(kv->valuestring) > 512)
        rc = bad(req, rid, "metadata", "invalid_value", "a metadata value is a string of at most 512 characters");
    }
  }
  if (rc) {
    cJSON_Delete(o);
    return;
  }
  gw_file_rec f;
  int r = strlen(in->valuestring) < GW_BSTORE_ID_MAX
              ? gw_bstore_file_get(st, in->valuestring, owner_of(caller), &f)
              : PR_EUNKNOWN;
  if (r == PR_EUNKNOWN) {
    gw_respond_error(req, rid, 404, "invalid_request_error", "input_file_id", "not_found", 0,
                     "No such File object: %.100s", in->valuestring);
    cJSON_Delete(o);
    return;
  }
  if (r) {
    cJSON_Delete(o);
    store_error(req, rid, st);
    return;
  }
  if (strcmp(f.purpose, "batch") != 0) {
    cJSON_Delete(o);
    bad(req, rid, "input_file_id", "invalid_value", "the input file's purpose must be \"batch\"");
    return;
  }
  /* the key's batches (not ended, validating, lines waiting), then its requests per minute */
  const char *owner = owner_of(caller);
  gw_bquota_use *use = gw_batches_use(gw, owner);
  gw_bquota_no no;
  if (use && gw_bquota_batch_check(gw_batches_quota(gw, owner), use, label_of(owner), &no)) {
    cJSON_Delete(o);
    quota_refused(req, rid, &no);
    return;
  }
  if (take_request(gw, req, rid, caller)) {
    cJSON_Delete(o);
    return;
  }
  gw_batch_rec b;
  memset(&b, 0, sizeof(b));
  gw_batch_new_id(b.id, sizeof(b.id), "batch_");
  snprintf(b.owner, sizeof(b.owner), "%s", owner_of(caller));
  snprintf(b.endpoint, sizeof(b.endpoint), "%s", ep->valuestring);
  snprintf(b.input_file_id, sizeof(b.input_file_id), "%s", f.id);
  snprintf(b.completion_window, sizeof(b.completion_window), "24h");
  b.status = GW_BATCH_VALIDATING;
  b.created_at = gw_batch_now();
  b.expires_at = b.created_at + (int64_t)gw->conf->batch_window_s;
  if (md && cJSON_IsObject(md)) b.metadata = cJSON_PrintUnformatted(md);
  cJSON_Delete(o);
  int64_t seq = gw_bstore_next_seq(st);
  b.seq = seq;
  if (seq < 0 || gw_batches_create(gw, &b) != 0) {
    gw_batch_rec_clear(&b);
    store_error(req, rid, st);
    return;
  }
  cJSON *out = gw_batch_json(gw, &b, 0);
  gw_batch_rec_clear(&b);
  gw_respond_json(req, rid, 200, out);
}

static void batches_list(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  gw_bstore *st = gw_batches_store(gw);
  int limit = query_limit(req->query, 20, BATCHES_LIST_MAX);
  if (limit < 0) {
    gw_respond_error(req, rid, 400, "invalid_request_error", "limit", "invalid_value", 0,
                     "limit must be a whole number from 1 to %d", BATCHES_LIST_MAX);
    return;
  }
  char after[GW_BSTORE_ID_MAX + 8];
  int has_after = query_get(req->query, "after", after, sizeof(after));
  gw_batch_rec *v = calloc((size_t)limit + 1, sizeof(*v));
  int n = v ? gw_bstore_batch_list(st, owner_of(caller), has_after ? after : NULL, limit, v) : -ENOMEM;
  if (n == PR_EUNKNOWN) {
    free(v);
    gw_respond_error(req, rid, 400, "invalid_request_error", "after", "invalid_value", 0,
                     "after: no such batch: %.100s", after);
    return;
  }
  if (n < 0) {
    free(v);
    store_error(req, rid, st);
    return;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON *data = cJSON_AddArrayToObject(o, "data");
  int shown = n > limit ? limit : n;
  for (int i = 0; i < shown; i++) {
    gw_batch_rec live;
    if (gw_batches_get(gw, v[i].id, NULL, &live) == 0) {
      cJSON_AddItemToArray(data, gw_batch_json(gw, &live, 0));
      gw_batch_rec_clear(&live);
    } else {
      cJSON_AddItemToArray(data, gw_batch_json(gw, &v[i], 0));
    }
  }
  if (shown) {
    cJSON_AddStringToObject(o, "first_id", v[0].id);
    cJSON_AddStringToObject(o, "last_id", v[shown - 1].id);
  } else {
    cJSON_AddNullToObject(o, "first_id");
    cJSON_AddNullToObject(o, "last_id");
  }
  cJSON_AddBoolToObject(o, "has_more", n > limit);
  for (int i = 0; i < n; i++) gw_batch_rec_clear(&v[i]);
  free(v);
  gw_respond_json(req, rid, 200, o);
}

static void batches_route(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  const char *path = req->path;
  int is_get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
  int is_post = strcmp(req->method, "POST") == 0;
  if (strcmp(path, "/v1/batches") == 0) {
    if (is_post) batch_create(gw, req, rid, caller);
    else if (is_get) batches_list(gw, req, rid, caller);
    else gw_respond_error(req, rid, 405, "invalid_request_error", NULL, "method_not_allowed", 0,
                          "/v1/batches takes GET or POST");
    return;
  }
  char id[GW_BSTORE_ID_MAX + 1];
  const char *rest = path + strlen("/v1/batches/");
  const char *slash = strchr(rest, '/');
  size_t idl = slash ? (size_t)(slash - rest) : strlen(rest);
  int cancel = slash && strcmp(slash, "/cancel") == 0;
  if (idl == 0 || idl >= sizeof(id) || (slash && !cancel)) {
    gw_respond_error(req, rid, 404, "invalid_request_error", NULL, "unknown_url", 0,
                     "Unknown request URL: %s %.200s", req->method, path);
    return;
  }
  memcpy(id, rest, idl);
  id[idl] = '\0';
  if (cancel ? !is_post : !is_get) {
    gw_respond_error(req, rid, 405, "invalid_request_error", NULL, "method_not_allowed", 0,
                     "%.200s takes %s", path, cancel ? "POST" : "GET");
    return;
  }
  gw_batch_rec b;
  memset(&b, 0, sizeof(b));
  int rc = cancel ? gw_batches_cancel(gw, id, owner_of(caller), &b)
                  : gw_batches_get(gw, id, owner_of(caller), &b);
  if (rc == PR_EUNKNOWN) {
    not_found(req, rid, "Batch", id);
    return;
  }
  if (rc == PR_ERANGE) {
    gw_respond_error(req, rid, 409, "invalid_request_error", NULL, "batch_not_cancellable", 0,
                     "the batch %s is %s: it cannot be cancelled", id, gw_batch_status_name(b.status));
    gw_batch_rec_clear(&b);
    return;
  }
  if (rc) {
    store_error(req, rid, gw_batches_store(gw));
    return;
  }
  cJSON *o = gw_batch_json(gw, &b, 0);
  gw_batch_rec_clear(&b);
  gw_respond_json(req, rid, 200, o);
}

/* ---- the entry points ------------------------------------------------------------------ */

void gw_batches_let_go(pr_http_req *req) {
  if (req->on_abort != upload_gone) return;
  upload *u = req->data;
  req->data = NULL;
  req->on_abort = NULL;
  req->on_body_data = NULL;
  upload_free(u);
}

int gw_batches_route(const char *path) {
  return strcmp(path, "/v1/files") == 0 || strncmp(path, "/v1/files/", 10) == 0 ||
         strcmp(path, "/v1/batches") == 0 || strncmp(path, "/v1/batches/", 12) == 0;
}

static void disabled(pr_http_req *req, const char *rid) {
  gw_respond_error(req, rid, 404, "invalid_request_error", NULL, "batches_disabled", 0,
                   "the Batch API is off on this gateway: its configuration has no `data_dir`");
}

void gw_batches_head(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  if (!gw->batches) {
    disabled(req, rid);
    return;
  }
  int is_post = strcmp(req->method, "POST") == 0;
  if (is_post && strcmp(req->path, "/v1/files") == 0) {
    upload_begin(gw, req, rid, caller);
    return;
  }
  /* a batch's creation, and its cancel, take a small JSON body; nothing else takes one */
  if (is_post && strncmp(req->path, "/v1/batches", 11) == 0) req->max_body = BATCHES_MAX_BODY;
  else req->max_body = 0;
}

void gw_batches_handle(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller) {
  if (!gw->batches) {
    /* the runner closed (shutdown) while an upload was read: its file is let go */
    if (req->on_abort == upload_gone) {
      req->on_abort = NULL;
      req->on_body_data = NULL;
      upload_gone(req);
    }
    if (gw->shutting_down)
      gw_respond_error(req, rid, 503, "server_error", NULL, "shutting_down", 5,
                       "the gateway is shutting down");
    else
      disabled(req, rid);
    return;
  }
  if (strncmp(req->path, "/v1/files", 9) == 0) files_route(gw, req, rid, caller);
  else batches_route(gw, req, rid, caller);
}
