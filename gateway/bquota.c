/* A key's Batch API quotas: the rules; see bquota.h. */
#include "bquota.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define BATCH_RETRY_S 30      /* a batch quota frees as batches end: try again then */
#define VALIDATING_RETRY_S 5  /* validations take seconds */

static int refuse(gw_bquota_no *no, int status, int retry, const char *code, const char *fmt,
                  const char *name, int64_t limit) {
  no->status = status;
  no->retry_after_s = retry;
  no->type = status == 429 ? "rate_limit_error" : "permission_error";
  no->code = code;
  snprintf(no->msg, sizeof(no->msg), fmt, name, limit);
  return status;
}

/* The bucket holds max(per_min, 1) and refills per_min a minute; a new one is full. */
static void refill(const gw_bquota *q, gw_bquota_use *u, uint64_t now_ms) {
  double cap = q->uploads_per_min > 1 ? q->uploads_per_min : 1;
  if (!u->up_started) {
    u->up_started = 1;
    u->up_tokens = cap;
    u->up_ms = now_ms;
    return;
  }
  if (now_ms > u->up_ms) u->up_tokens += (double)(now_ms - u->up_ms) * q->uploads_per_min / 60000.0;
  u->up_ms = now_ms;
  if (u->up_tokens > cap) u->up_tokens = cap;
}

int gw_bquota_upload_check(const gw_bquota *q, gw_bquota_use *u, const char *name,
                           int64_t declared, uint64_t now_ms, gw_bquota_no *no) {
  if (q->files > 0 && u->files + u->uploads >= q->files)
    return refuse(no, 403, 0, "file_quota_exceeded",
                  "the key `%s` stores as many files as it may (batch quota files: %" PRId64
                  "); delete some (GET /v1/files lists them) or wait for them to expire",
                  name, q->files);
  int64_t held = u->file_bytes + u->upload_bytes;
  if (q->file_bytes > 0 && (held >= q->file_bytes || (declared > 0 && held + declared > q->file_bytes)))
    return refuse(no, 403, 0, "file_quota_exceeded",
                  "the key `%s` would store more bytes than it may (batch quota file_bytes: %" PRId64
                  "); delete files (GET /v1/files lists them) or wait for them to expire",
                  name, q->file_bytes);
  if (q->uploads_per_min > 0) {
    refill(q, u, now_ms);
    if (u->up_tokens < 1) {
      int retry = (int)ceil((1 - u->up_tokens) * 60.0 / q->uploads_per_min);
      no->status = 429;
      no->retry_after_s = retry < 1 ? 1 : retry;
      no->type = "rate_limit_error";
      no->code = "rate_limit_exceeded";
      snprintf(no->msg, sizeof(no->msg),
               "rate limit reached for uploads per minute on key `%s`: limit %g", name,
               q->uploads_per_min);
      return 429;
    }
  }
  return 0;
}

void gw_bquota_upload_begin(const gw_bquota *q, gw_bquota_use *u, uint64_t now_ms) {
  if (q->uploads_per_min > 0) {
    refill(q, u, now_ms);
    u->up_tokens -= 1;
  }
  u->uploads++;
}

int gw_bquota_upload_grow(const gw_bquota *q, gw_bquota_use *u, const char *name, int64_t n,
                          gw_bquota_no *no) {
  if (q->file_bytes > 0 && u->file_bytes + u->upload_bytes + n > q->file_bytes)
    return refuse(no, 403, 0, "file_quota_exceeded",
                  "the key `%s` would store more bytes than it may (batch quota file_bytes: %" PRId64
                  "); the upload was stopped and nothing of it is kept",
                  name, q->file_bytes);
  u->upload_bytes += n;
  return 0;
}

void gw_bquota_upload_end(gw_bquota_use *u, int64_t bytes, int stored) {
  if (u->uploads > 0) u->uploads--;
  u->upload_bytes -= bytes;
  if (u->upload_bytes < 0) u->upload_bytes = 0;
  if (stored) {
    u->files++;
    u->file_bytes += bytes;
  }
}

int gw_bquota_batch_check(const gw_bquota *q, const gw_bquota_use *u, const char *name,
                          gw_bquota_no *no) {
  if (q->batches > 0 && u->batches >= q->batches)
    return refuse(no, 429, BATCH_RETRY_S, "batch_quota_exceeded",
                  "the key `%s` has as many batches not ended as it may (batch quota batches: "
                  "%" PRId64 "); try again when one has ended",
                  name, q->batches);
  if (q->validating > 0 && u->validating >= q->validating)
    return refuse(no, 429, VALIDATING_RETRY_S, "batch_quota_exceeded",
                  "the key `%s` has as many batches being validated as it may (batch quota "
                  "validating: %" PRId64 "); try again when one has been validated",
                  name, q->validating);
  if (q->lines > 0 && u->lines >= q->lines)
    return refuse(no, 429, BATCH_RETRY_S, "line_quota_exceeded",
                  "the key `%s` has as many batch lines waiting as it may (batch quota lines: "
                  "%" PRId64 "); try again when some have been answered",
                  name, q->lines);
  return 0;
}

int gw_bquota_lines_check(const gw_bquota *q, const gw_bquota_use *u, const char *name,
                          int64_t lines, gw_bquota_no *no) {
  if (q->lines > 0 && u->lines + lines > q->lines)
    return refuse(no, 429, BATCH_RETRY_S, "line_quota_exceeded",
                  "with this batch the key `%s` would have more batch lines waiting than it may "
                  "(batch quota lines: %" PRId64 ")",
                  name, q->lines);
  return 0;
}
