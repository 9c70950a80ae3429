/* Many scripted phones in one process, for tests/bench/health_scale.py: each listens on a
 * port of its own on 127.0.0.1 (so the gateway holds a connection per phone, as it does
 * with real ones) with proto's HTTP server, answers GET /health, GET /agent/v1/status
 * (with --agent) and POST /v1/chat/completions (a stream of max_tokens chunks, one every
 * --token-ms, or the whole answer after as long), and counts what each phone is asked.
 * A control port answers GET /counts (JSON: path -> count per phone) and POST /reset.
 *
 *   fleetgate-bench-phones --phones N --ports-file FILE [--token-ms 50] [--agent]
 *
 * FILE gets {"ports":[...],"control":PORT} once every phone listens. Runs until killed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "buf.h"
#include "http.h"

enum { P_HEALTH, P_STATUS, P_CHAT, P_OTHER, P_N };
static const char *const path_names[P_N] = {"/health", "/agent/v1/status", "/v1/chat/completions", "other"};

typedef struct phone {
  pr_http_server http;
  int index;
} phone;

static phone *phones;
static size_t n_phones;
static unsigned *counts[P_N];
static double token_ms = 50;
static int agent;
static uv_loop_t *loop;

/* One answer in progress: a chunk (or the whole answer) when its timer fires. */
typedef struct answer {
  uv_timer_t timer;
  pr_http_req *req; /* NULL once the gateway let go */
  int stream, left, total;
  char model[64];
} answer;

static void answer_closed(uv_handle_t *h) { free(h->data); }

static void answer_done(answer *a) {
  if (a->req) pr_http_req_let_go(a->req);
  a->req = NULL;
  uv_timer_stop(&a->timer);
  uv_close((uv_handle_t *)&a->timer, answer_closed);
}

static void answer_gone(pr_http_req *req) {
  answer *a = req->data;
  if (a) a->req = NULL;
}

static void answer_tick(uv_timer_t *t) {
  answer *a = t->data;
  if (!a->req) {
    answer_done(a);
    return;
  }
  char buf[512];
  if (!a->stream) {
    int n = snprintf(buf, sizeof(buf),
                     "{\"id\":\"c\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"%s\","
                     "\"choices\":[{\"index\":0,\"finish_reason\":\"length\",\"message\":{\"role\":"
                     "\"assistant\",\"content\":\"x\"}}],\"usage\":{\"prompt_tokens\":8,"
                     "\"completion_tokens\":%d,\"total_tokens\":%d}}",
                     a->model, a->total, a->total + 8);
    pr_http_req *req = a->req;
    a->req = NULL;
    req->data = NULL;
    req->on_abort = NULL;
    pr_http_respond(req, 200, NULL, "application/json", buf, (size_t)n);
    answer_done(a);
    return;
  }
  int n;
  if (a->left-- > 0) {
    n = snprintf(buf, sizeof(buf),
                 "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"%s\","
                 "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x \"},\"finish_reason\":null}]}\n\n",
                 a->model);
    if (pr_http_write(a->req, buf, (size_t)n) < 0) answer_done(a);
    return;
  }
  n = snprintf(buf, sizeof(buf),
               "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"%s\","
               "\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],\"usage\":{"
               "\"prompt_tokens\":8,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n",
               a->model, a->total, a->total + 8);
  pr_http_req *req = a->req;
  a->req = NULL;
  req->data = NULL;
  req->on_abort = NULL;
  pr_http_write(req, buf, (size_t)n);
  pr_http_end(req);
  answer_done(a);
}

static void chat(pr_http_req *req) {
  cJSON *o = cJSON_ParseWithLength(req->body.data ? req->body.data : "", req->body.len);
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "max_tokens");
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stream");
  const cJSON *md = cJSON_GetObjectItemCaseSensitive(o, "model");
  answer *a = calloc(1, sizeof(*a));
  if (!a) {
    cJSON_Delete(o);
    pr_http_respond(req, 500, NULL, "application/json", "{}", 2);
    return;
  }
  a->req = req;
  a->total = a->left = cJSON_IsNumber(mt) && mt->valueint > 0 ? mt->valueint : 16;
  a->stream = cJSON_IsTrue(st);
  snprintf(a->model, sizeof(a->model), "%s", cJSON_IsString(md) ? md->valuestring : "m");
  cJSON_Delete(o);
  req->data = a;
  req->on_abort = answer_gone;
  uv_timer_init(loop, &a->timer);
  a->timer.data = a;
  uint64_t every = (uint64_t)token_ms;
  if (a->stream) {
    pr_http_start(req, 200, NULL, "text/event-stream");
    uv_timer_start(&a->timer, answer_tick, every, every ? every : 1);
  } else {
    uv_timer_start(&a->timer, answer_tick, every * (uint64_t)a->total, 0);
  }
}

static void phone_handler(pr_http_req *req, void *ud) {
  phone *p = ud;
  int k = P_OTHER;
  for (int i = 0; i < P_OTHER; i++)
    if (strcmp(req->path, path_names[i]) == 0) k = i;
  counts[k][p->index]++;
  if (k == P_HEALTH) {
    pr_http_respond(req, 200, NULL, "application/json", "{\"status\":\"ok\"}", 15);
  } else if (k == P_STATUS && agent) {
    char buf[256];
    int n = snprintf(buf, sizeof(buf),
                     "{\"id\":\"p%d\",\"engine\":\"openai\",\"engine_state\":\"ready\",\"slots\":1,"
                     "\"busy\":0,\"queued\":0,\"n_ctx\":4096,\"models\":[\"m%d\"],\"running\":[]}",
                     p->index, p->index);
    pr_http_respond(req, 200, NULL, "application/json", buf, (size_t)n);
  } else if (k == P_CHAT && strcmp(req->method, "POST") == 0) {
    chat(req);
  } else {
    static const char nf[] = "{\"error\":{\"message\":\"not found\",\"type\":\"invalid_request_error\","
                             "\"param\":null,\"code\":null}}";
    pr_http_respond(req, 404, NULL, "application/json", nf, sizeof(nf) - 1);
  }
}

static void control_handler(pr_http_req *req, void *ud) {
  (void)ud;
  if (strcmp(req->method, "POST") == 0) {
    for (int k = 0; k < P_N; k++) memset(counts[k], 0, n_phones * sizeof(unsigned));
    pr_http_respond(req, 200, NULL, "application/json", "{}", 2);
    return;
  }
  cJSON *o = cJSON_CreateObject();
  for (int k = 0; k < P_N; k++) {
    cJSON *arr = cJSON_AddArrayToObject(o, path_names[k]);
    for (size_t i = 0; i < n_phones; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(counts[k][i]));
  }
  char *s = cJSON_PrintUnformatted(o);
  pr_http_respond(req, 200, NULL, "application/json", s, strlen(s));
  cJSON_free(s);
  cJSON_Delete(o);
}

int main(int argc, char **argv) {
  const char *ports_file = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--phones") == 0 && i + 1 < argc) n_phones = strtoul(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--ports-file") == 0 && i + 1 < argc) ports_file = argv[++i];
    else if (strcmp(argv[i], "--token-ms") == 0 && i + 1 < argc) token_ms = atof(argv[++i]);
    else if (strcmp(argv[i], "--agent") == 0) agent = 1;
    else {
      fprintf(stderr, "usage: %s --phones N --ports-file FILE [--token-ms MS] [--agent]\n", argv[0]);
      return 2;
    }
  }
  if (!n_phones || !ports_file) {
    fprintf(stderr, "--phones and --ports-file are needed\n");
    return 2;
  }
  loop = uv_default_loop();
  phones = calloc(n_phones, sizeof(*phones));
  for (int k = 0; k < P_N; k++) counts[k] = calloc(n_phones, sizeof(unsigned));
  cJSON *out = cJSON_CreateObject();
  cJSON *ports = cJSON_AddArrayToObject(out, "ports");
  for (size_t i = 0; i < n_phones; i++) {
    phone *p = &phones[i];
    p->index = (int)i;
    pr_http_server_init(&p->http, loop, phone_handler, p);
    if (pr_http_server_listen(&p->http, "127.0.0.1:0") != 0) {
      fprintf(stderr, "cannot listen for phone %zu\n", i);
      return 1;
    }
    cJSON_AddItemToArray(ports, cJSON_CreateNumber(pr_http_server_port(&p->http)));
  }
  pr_http_server control;
  pr_http_server_init(&control, loop, control_handler, NULL);
  if (pr_http_server_listen(&control, "127.0.0.1:0") != 0) return 1;
  cJSON_AddNumberToObject(out, "control", pr_http_server_port(&control));
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp", ports_file);
  FILE *f = fopen(tmp, "w");
  char *s = cJSON_PrintUnformatted(out);
  if (!f || fputs(s, f) < 0 || fclose(f) != 0 || rename(tmp, ports_file) != 0) {
    fprintf(stderr, "cannot write %s\n", ports_file);
    return 1;
  }
  cJSON_free(s);
  cJSON_Delete(out);
  return uv_run(loop, UV_RUN_DEFAULT);
}
