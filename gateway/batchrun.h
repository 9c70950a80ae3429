/* Between batch.c (the runner) and batchapi.c (the HTTP routes): not for other modules. */
#ifndef GW_BATCHRUN_H
#define GW_BATCHRUN_H

#include <cjson/cJSON.h>

#include "batch.h"
#include "bstore.h"

/* The store; NULL when the API is off (no data_dir). */
gw_bstore *gw_batches_store(gw_server *gw);
/* What the owner (a key's name, "" without keys) holds, to count an upload or a delete
 * in (bquota.h); NULL when the API is off or without memory. */
struct gw_bquota_use *gw_batches_use(gw_server *gw, const char *owner);
/* The owner's quotas: its key's, else batch.quota. */
const gw_bquota *gw_batches_quota(gw_server *gw, const char *owner);
/* A file expires at that time (Unix seconds): the sweep looks by then. */
void gw_batches_sweep_by(gw_server *gw, int64_t expires_at);
/* Start a batch checked by the API: rec (status validating, its input file, endpoint,
 * window, metadata, owner) is stored and validated from the next loop turn. 0, or a
 * negative code. */
int gw_batches_create(gw_server *gw, const gw_batch_rec *rec);
/* The batch as it stands (the runner's live copy when it runs); owner NULL: any. 0,
 * PR_EUNKNOWN, or a negative code; out to be cleared with gw_batch_rec_clear. */
int gw_batches_get(gw_server *gw, const char *id, const char *owner, gw_batch_rec *out);
/* Cancel it: 0 (out: the batch, now cancelling), PR_EUNKNOWN, or PR_ERANGE it has ended
 * (out: the batch as it is). */
int gw_batches_cancel(gw_server *gw, const char *id, const char *owner, gw_batch_rec *out);
/* OpenAI's batch object; with_owner adds "owner" and, for a running batch, "progress"
 * (the admin API and the page). */
cJSON *gw_batch_json(gw_server *gw, const gw_batch_rec *b, int with_owner);
/* A new id: prefix + 24 hex digits of randomness. */
void gw_batch_new_id(char *out, size_t n, const char *prefix);
/* Now, in Unix seconds. */
int64_t gw_batch_now(void);
/* What a batch line does with its answer (status, and the error's code or NULL): 0 write
 * it (output or error file: a 2xx, or the request's own fault); 1 run it again later and
 * count a try (a phone's or the fleet's failure, 408, 409); 2 again without counting (429,
 * the gateway busy: queue_full, model_not_found, deadline_exceeded, server_busy, let go
 * unanswered); 3 leave it pending (the gateway is shutting down). */
int gw_batch_answer_kind(int status, const char *code);

#endif
