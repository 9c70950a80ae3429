/* What one API key holds of the Batch API, against its quotas (gw_bquota, config.h):
 * stored files and their bytes, uploads arriving, uploads per minute, batches not ended,
 * those being validated, lines not answered. batch.c keeps a gw_bquota_use per key, from
 * the store at start and from each change after; these pure rules say whether the next
 * upload, batch or line fits, and what the caller is told when it does not (OpenAI's
 * error shape: 403 for what only deleting files frees, 429 with Retry-After for what
 * frees by itself). No libuv: time comes in as milliseconds
 * (tests/unit/test_bquota.c). */
#ifndef GW_BQUOTA_H
#define GW_BQUOTA_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct gw_bquota_use {
  int64_t files, file_bytes;      /* stored: uploads and batch output files */
  int64_t uploads, upload_bytes;  /* uploads arriving now, and their bytes so far */
  int64_t batches;                /* batches not ended */
  int64_t validating;             /* of them, validating (or waiting to be) */
  int64_t lines;                  /* lines of its running batches not answered yet */
  double up_tokens;               /* the uploads-per-minute bucket... */
  uint64_t up_ms;                 /* ...last refilled then */
  int up_started;                 /* ...filled once (a new key starts full) */
} gw_bquota_use;

/* Why something does not fit: the answer's status (403 or 429), OpenAI's error type and
 * code, Retry-After (429), and a message that names the key, the quota and the numbers. */
typedef struct gw_bquota_no {
  int status;
  int retry_after_s;
  const char *type;
  const char *code;
  char msg[320];
} gw_bquota_no;

/* A new upload of `declared` bytes (-1: unknown) by key `name`: the files, their bytes with
 * the uploads arriving, and the uploads-per-minute bucket. 0 (nothing counted yet: call
 * gw_bquota_upload_begin once every other check passed), or the status with *no filled. */
int gw_bquota_upload_check(const gw_bquota *q, gw_bquota_use *u, const char *name,
                           int64_t declared, uint64_t now_ms, gw_bquota_no *no);
/* The upload begins: one upload from the bucket, counted as arriving. */
void gw_bquota_upload_begin(const gw_bquota *q, gw_bquota_use *u, uint64_t now_ms);
/* n more bytes of an arriving upload: 0, or 403 (the key's bytes would pass the quota;
 * nothing counted). */
int gw_bquota_upload_grow(const gw_bquota *q, gw_bquota_use *u, const char *name, int64_t n,
                          gw_bquota_no *no);
/* The upload ended with `bytes` arrived: stored (a file now) or not. */
void gw_bquota_upload_end(gw_bquota_use *u, int64_t bytes, int stored);
/* A new batch: batches not ended, being validated, lines waiting. 0 or 429. */
int gw_bquota_batch_check(const gw_bquota *q, const gw_bquota_use *u, const char *name,
                          gw_bquota_no *no);
/* A batch being validated has `lines` lines so far: 0, or why it fails (the key's lines
 * waiting would pass its quota): no->code is line_quota_exceeded. */
int gw_bquota_lines_check(const gw_bquota *q, const gw_bquota_use *u, const char *name,
                          int64_t lines, gw_bquota_no *no);

#endif
