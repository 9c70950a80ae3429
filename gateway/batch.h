/* OpenAI's Batch API: files (/v1/files) and batches (/v1/batches) kept under data_dir
 * (bstore.h), and the runner that feeds each batch's lines through the scheduler in
 * the batch class, a small window at a time, in prefix-group order, writing output and
 * error lines as they complete. docs/batch.md says what callers see; docs/core.md where
 * it sits. */
#ifndef GW_BATCH_H
#define GW_BATCH_H

#include <cjson/cJSON.h>

#include "gw.h"

typedef struct gw_batches gw_batches;

/* Open the store under conf->data_dir and pick up the batches that had not ended (a
 * line that was running when the gateway stopped runs again). Returns 0 (also without
 * data_dir: the API is off), or a negative code with err saying why in an operator's
 * words. */
int gw_batches_open(gw_server *gw, char *err, size_t errn);
/* Stop the runner (shutdown): lines in flight are let go unanswered (they stay pending
 * and run again at the next start); the store closes once closed() has run. */
void gw_batches_close(gw_server *gw);
/* The head hook of /v1/files and /v1/batches (server.c's gw_head): each route's body
 * limit; an upload is read as it arrives (multipart, straight to a file). May answer. */
void gw_batches_head(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller);
/* A request of these routes answered by someone else (a 401 after a reload removed its
 * key mid-upload): its upload, if any, is let go. */
void gw_batches_let_go(pr_http_req *req);
/* Whether path is one of the Batch API's routes. */
int gw_batches_route(const char *path);
/* A request for /v1/files... or /v1/batches... (caller: the key, NULL on an open gateway). */
void gw_batches_handle(gw_server *gw, pr_http_req *req, const char *rid, gw_caller *caller);

/* The admin API: every batch (GET /admin/v1/batches) with its owner and progress, and a
 * cancel for any of them. */
cJSON *gw_batches_admin_list(gw_server *gw);
/* 0, PR_EUNKNOWN no such batch, PR_ERANGE it has ended; *out the batch after. */
int gw_batches_admin_cancel(gw_server *gw, const char *id, cJSON **out);
/* What the status page and /metrics show: running batches, lines waiting, and the
 * lines ended since start by how (completed, failed, expired). */
typedef struct gw_batch_stats {
  size_t running, lines_waiting, lines_in_flight;
  size_t queued;             /* batches not ended waiting for a run slot */
  uint64_t lines_completed, lines_failed, lines_expired;
} gw_batch_stats;
void gw_batches_stats(gw_server *gw, gw_batch_stats *out);
/* One key's Batch API use against its quotas (the admin API's keys, the page): files,
 * file_bytes, uploads_per_min, batches, validating, lines, each {"used", "limit"} (0: no
 * limit), and uploads_arriving, batches_queued, batches_running. owner "" is a gateway
 * without keys. NULL when the Batch API is off. */
cJSON *gw_batches_key_json(gw_server *gw, const char *owner);

#endif
