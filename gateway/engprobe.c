/* Feature probes of bare llama-servers; see engprobe.h. */
#include "engprobe.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "curlreq.h"
#include "feat.h"
#include "log.h"

#define GW_ENGPROBE_MAX_BODY (16u << 10)
/* The 2025 build answers the continuation probe with a token: a phone busy with long
 * prompts may take a while; without a verdict the probes run again later. */
#define GW_ENGPROBE_TIMEOUT_MS 60000L

/* One replica's probes in flight, one request at a time. Owned by the gateway's list
 * (gw->engprobes) until curl is done with it. */
typedef struct gw_engprobe engprobe;
struct gw_engprobe {
  engprobe *next;
  gw_server *gw;
  gw_replica *r;           /* NULL once the replica left: freed when curl is done */
  pr_feat_probe i;
  unsigned features;
  int choices;
  pr_curlreq xfer;
  pr_buf body;
};

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud) {
  engprobe *p = ud;
  return pr_buf_append(&p->body, data, size * nmemb) ? 0 : size * nmemb;
}

static void probe_free(engprobe *p) {
  for (engprobe **q = &p->gw->engprobes; *q; q = &(*q)->next)
    if (*q == p) {
      *q = p->next;
      break;
    }
  pr_curlreq_close(&p->xfer, p->gw->curlm);
  pr_buf_free(&p->body);
  free(p);
}

static int probe_send(engprobe *p);

static void probe_done(CURL *easy, CURLcode rc, void *ud) {
  (void)easy;
  engprobe *p = ud;
  gw_replica *r = p->r;
  long st = pr_curlreq_status(&p->xfer);
  int choices = 1;
  int v = rc == CURLE_OK ? pr_feat_probe_read(p->i, st, p->body.data, p->body.len, &choices) : -1;
  pr_curlreq_close(&p->xfer, p->gw->curlm);
  if (!r || p->gw->shutting_down || v < 0) {
    /* left, stopping, or no verdict: asked again when /props is read next */
    if (r && v < 0) pr_info("replica %s: its engine's features are not known yet (%s answered %s)", r->id,
                            pr_feat_probe_path(p->i), rc == CURLE_OK ? "no verdict" : curl_easy_strerror(rc));
    probe_free(p);
    return;
  }
  if (v) p->features |= pr_feat_probe_bit(p->i);
  if (p->i == PR_FEAT_PROBE_CHOICES) p->choices = v ? choices : 1;
  if (++p->i < PR_FEAT_PROBES_BARE) {
    pr_buf_reset(&p->body);
    if (probe_send(p) == 0) return;
    probe_free(p);
    return;
  }
  gw_replica_set_features(r, p->features, p->choices);
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "replica", r->id);
  cJSON_AddStringToObject(f, "build", r->build);
  cJSON_AddNumberToObject(f, "choices", r->choices_max);
  cJSON_AddBoolToObject(f, "continue_final_message", (r->features & PR_FEAT_CONTINUE) != 0);
  cJSON_AddBoolToObject(f, "responses", (r->features & PR_FEAT_RESPONSES) != 0);
  pr_log_kv(PR_LOG_INFO, "replica's engine features", f);
  gw_server *gw = p->gw;
  probe_free(p);
  gw_plan_soon(gw); /* what waited for such a phone may go */
}

static int probe_send(engprobe *p) {
  const gw_config *c = p->gw->conf;
  static const char *const hdrs[] = {"Content-Type: application/json", "Expect:", NULL};
  const char *body = pr_feat_probe_body(p->i);
  const pr_curlreq_opts o = {
      .base = p->r->url,
      .path = pr_feat_probe_path(p->i),
      .method = "POST",
      .body = body,
      .body_len = strlen(body),
      .headers = hdrs,
      .bearer = p->r->token,
      .write_fn = on_write,
      .write_ud = p,
      .timeout_ms = GW_ENGPROBE_TIMEOUT_MS,
      .connect_timeout_ms = (long)(c->health_timeout_s * 1000),
      .http11 = 1,
      .insecure = !c->tls_verify,
      .ca_file = c->ca_file,
      .user_agent = "fleetgate/" FLEETGATE_VERSION " features",
  };
  if (pr_curlreq_open(&p->xfer, p->gw->curlm, &o) < 0) return -ENOMEM;
  if (pr_curlm_add(p->gw->curlm, p->xfer.easy, probe_done, p) < 0) {
    pr_curlreq_close(&p->xfer, p->gw->curlm);
    return -ENOMEM;
  }
  return 0;
}

int gw_engprobe_start(gw_server *gw, gw_replica *r) {
  for (engprobe *p = gw->engprobes; p; p = p->next)
    if (p->r == r) return 0;
  engprobe *p = calloc(1, sizeof(*p));
  if (!p) return -ENOMEM;
  p->gw = gw;
  p->r = r;
  p->choices = 1;
  pr_buf_init(&p->body, GW_ENGPROBE_MAX_BODY);
  p->next = gw->engprobes;
  gw->engprobes = p;
  int rc = probe_send(p);
  if (rc < 0) probe_free(p);
  return rc;
}

void gw_engprobe_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  if (ev->kind != GW_FLEET_REMOVED) return;
  for (engprobe *p = gw->engprobes; p; p = p->next)
    if (p->r == ev->r) p->r = NULL; /* its answer is dropped; the replica is freed now */
}

void gw_engprobe_stop(gw_server *gw) {
  while (gw->engprobes) probe_free(gw->engprobes);
}
