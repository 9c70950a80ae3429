/* The ring of recent events and their SSE subscribers; see events.h. Writing to a
 * subscriber never blocks: a client whose queued bytes pass the connection's high-water
 * mark is cut off (its EventSource reconnects and catches up from the ring with
 * Last-Event-ID). Streams are ended outside the loop over subscribers, since ending an
 * answer can run the connection's next pipelined request, which may add an event. */
#include "caps.h"
#include "events.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "err.h"
#include "log.h"

#define GW_EVENT_MAX_TEXT 1024         /* message and reason fields are cut to this */
#define GW_EVENTS_MAX_BACKLOG (8u << 20) /* bytes queued for a stream before it is cut */

typedef struct gw_event {
  uint64_t id;
  char type[32];
  char *json; /* the whole event as compact JSON; owned */
} gw_event;

typedef struct gw_sub {
  struct gw_sub *next, *prev;
  gw_events *ev;
  pr_http_req *req;
  int kind;
  int ending; /* to be ended after the current pass */
} gw_sub;

struct gw_events {
  gw_event ring[GW_EVENTS_KEEP];
  size_t head, n; /* next slot; events held */
  uint64_t next_id;
  gw_sub *subs;
  size_t n_subs;
};

gw_events *gw_events_new(void) {
  gw_events *ev = calloc(1, sizeof(*ev));
  if (ev) ev->next_id = 1;
  return ev;
}

void gw_events_free(gw_events *ev) {
  if (!ev) return;
  for (size_t i = 0; i < GW_EVENTS_KEEP; i++) free(ev->ring[i].json);
  /* subscribers are ended before; any left would be the connection's to free */
  free(ev);
}

/* ---- subscribers -------------------------------------------------------------------------- */

static void sub_unlink(gw_sub *s) {
  gw_events *ev = s->ev;
  if (s->prev) s->prev->next = s->next;
  else ev->subs = s->next;
  if (s->next) s->next->prev = s->prev;
  ev->n_subs--;
}

/* The client went away: its request is freed by the HTTP layer after this returns. */
static void sub_on_abort(pr_http_req *req) {
  gw_sub *s = req->data;
  if (!s) return;
  sub_unlink(s);
  free(s);
}

/* End the streams marked `ending`. Each is unlinked before pr_http_end, which may run
 * more handlers; the search starts over after each. */
static void sweep(gw_events *ev) {
  for (;;) {
    gw_sub *s = ev->subs;
    while (s && !s->ending) s = s->next;
    if (!s) return;
    sub_unlink(s);
    pr_http_req *req = pr_http_req_let_go(s->req);
    free(s);
    pr_http_end(req);
  }
}

/* Queue bytes for one subscriber. A snapshot (`droppable`) is skipped while the client
 * is behind: the next one says the same, newer. A client that is far behind, or gone,
 * is marked for ending. */
static void sub_write(gw_sub *s, const char *data, size_t len, int droppable) {
  if (s->ending) return;
  size_t queued = pr_http_queued(s->req);
  if (droppable && queued > s->req->server->high_water) return;
  if (queued + len > GW_EVENTS_MAX_BACKLOG) {
    s->ending = 1;
    return;
  }
  if (pr_http_write(s->req, data, len) < 0) s->ending = 1;
}

/* "id: N\nevent: NAME\ndata: ...\n\n" into out; data has no newlines (compact JSON).
 * Returns 0, or a negative code when it does not fit (out is cut: send nothing). */
static int sse_message(pr_buf *out, uint64_t id, const char *name, const char *data, size_t len) {
  if (id) pr_buf_text(out, "id: %" PRIu64 "\n", id);
  pr_buf_text(out, "event: %s\ndata: ", name);
  pr_buf_bytes(out, data, len);
  pr_buf_bytes(out, "\n\n", 2);
  return out->cut ? PR_ETOOLARGE : 0;
}

void gw_events_send(gw_server *gw, int kind, const char *name, const char *data, size_t len) {
  gw_events *ev = gw->events;
  if (!ev || !ev->subs) return;
  pr_buf msg;
  pr_buf_init(&msg, len + 256);
  if (sse_message(&msg, 0, name, data, len) == 0) /* it is sized to fit: else out of memory */
    for (gw_sub *s = ev->subs; s; s = s->next)
      if (s->kind & kind) sub_write(s, msg.data, msg.len, 1);
  pr_buf_free(&msg);
  sweep(ev);
}

void gw_events_ping(gw_server *gw) {
  gw_events *ev = gw->events;
  if (!ev) return;
  for (gw_sub *s = ev->subs; s; s = s->next) sub_write(s, ": ping\n\n", 8, 1);
  sweep(ev);
}

size_t gw_events_count(const gw_server *gw, int kind) {
  size_t n = 0;
  if (!gw->events) return 0;
  for (const gw_sub *s = gw->events->subs; s; s = s->next)
    if (s->kind & kind) n++;
  return n;
}

void gw_events_close_all(gw_server *gw, const pr_http_server *server) {
  gw_events *ev = gw->events;
  if (!ev) return;
  for (gw_sub *s = ev->subs; s; s = s->next)
    if (!server || s->req->server == server) s->ending = 1;
  sweep(ev);
}

void gw_events_close_if(gw_server *gw, int (*which)(const pr_http_req *req, void *ud), void *ud) {
  gw_events *ev = gw->events;
  if (!ev) return;
  for (gw_sub *s = ev->subs; s; s = s->next)
    if (which(s->req, ud)) s->ending = 1;
  sweep(ev);
}

static const gw_event *ring_at(const gw_events *ev, size_t k) {
  size_t first = (ev->head + GW_EVENTS_KEEP - ev->n) % GW_EVENTS_KEEP;
  return &ev->ring[(first + k) % GW_EVENTS_KEEP];
}

int gw_events_subscribe(gw_server *gw, pr_http_req *req, int kind, uint64_t after,
                        const char *hello_name, const char *hello) {
  gw_events *ev = gw->events;
  if (!ev) return -ENOENT;
  if (ev->n_subs >= GW_EVENTS_MAX_SUBSCRIBERS) return PR_EBUSY;
  gw_sub *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  static const char *const hdrs[] = {"Cache-Control: no-store", "X-Accel-Buffering: no",
                                     "X-Content-Type-Options: nosniff", NULL};
  int rc = pr_http_start(req, 200, hdrs, "text/event-stream");
  if (rc < 0) {
    free(s);
    return rc;
  }
  s->ev = ev;
  s->req = req;
  s->kind = kind;
  req->data = s;
  req->on_abort = sub_on_abort;
  s->next = ev->subs;
  if (ev->subs) ev->subs->prev = s;
  ev->subs = s;
  ev->n_subs++;
  /* reconnect quickly; then what the client missed (or everything we keep) */
  sub_write(s, "retry: 2000\n\n", 13, 0);
  if (hello_name && hello) {
    pr_buf msg;
    pr_buf_init(&msg, strlen(hello) + 256);
    if (sse_message(&msg, 0, hello_name, hello, strlen(hello)) == 0) sub_write(s, msg.data, msg.len, 0);
    pr_buf_free(&msg);
  }
  if (kind & GW_SUB_EVENTS) {
    for (size_t k = 0; k < ev->n && !s->ending; k++) {
      const gw_event *e = ring_at(ev, k);
      if (e->id <= after) continue;
      pr_buf msg;
      pr_buf_init(&msg, PR_CAP_ERROR_BODY + GW_EVENT_MAX_TEXT);
      if (sse_message(&msg, e->id, e->type, e->json, strlen(e->json)) == 0)
        sub_write(s, msg.data, msg.len, 0);
      pr_buf_free(&msg);
    }
  }
  sweep(ev);
  return 0;
}

/* ---- the ring ----------------------------------------------------------------------------- */

static void iso_time(char *out, size_t n, uint64_t ms) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  char base[32];
  strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, n, "%s.%03uZ", base, (unsigned)(ms % 1000));
}

/* A copy of s cut to GW_EVENT_MAX_TEXT bytes (at a UTF-8 character boundary). */
static cJSON *cut_string(const char *s) {
  char buf[GW_EVENT_MAX_TEXT + 1];
  size_t n = strlen(s ? s : "");
  if (n > GW_EVENT_MAX_TEXT) {
    n = GW_EVENT_MAX_TEXT;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
  }
  memcpy(buf, s ? s : "", n);
  buf[n] = '\0';
  return cJSON_CreateString(buf);
}

void gw_events_add(gw_server *gw, const char *type, const char *message, cJSON *fields) {
  gw_events *ev = gw->events;
  if (!ev) {
    cJSON_Delete(fields);
    return;
  }
  uint64_t ms = (uint64_t)pr_clock_wall_ms();
  char ts[40];
  iso_time(ts, sizeof(ts), ms);
  cJSON *o = cJSON_CreateObject();
  if (!o) {
    cJSON_Delete(fields);
    return;
  }
  uint64_t id = ev->next_id++;
  cJSON_AddNumberToObject(o, "id", (double)id);
  cJSON_AddStringToObject(o, "ts", ts);
  cJSON_AddNumberToObject(o, "time_ms", (double)ms);
  cJSON_AddStringToObject(o, "type", type);
  cJSON_AddItemToObject(o, "message", cut_string(message));
  if (fields) {
    cJSON *it = fields->child;
    while (it) {
      cJSON *next = it->next;
      cJSON_DetachItemViaPointer(fields, it);
      if (cJSON_IsString(it) && strlen(it->valuestring) > GW_EVENT_MAX_TEXT) {
        cJSON *c = cut_string(it->valuestring);
        cJSON_AddItemToObject(o, it->string, c);
        cJSON_Delete(it);
      } else {
        const char *k = it->string;
        it->string = NULL;
        cJSON_AddItemToObject(o, k, it);
        free((char *)k);
      }
      it = next;
    }
    cJSON_Delete(fields);
  }
  char *json = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!json) return;
  gw_event *e = &ev->ring[ev->head];
  free(e->json);
  e->id = id;
  snprintf(e->type, sizeof(e->type), "%s", type);
  e->json = json;
  ev->head = (ev->head + 1) % GW_EVENTS_KEEP;
  if (ev->n < GW_EVENTS_KEEP) ev->n++;
  if (!ev->subs) return;
  size_t len = strlen(json);
  pr_buf a, b;
  pr_buf_init(&a, len + 256);
  pr_buf_init(&b, len + 256);
  int ok_a = sse_message(&a, id, e->type, json, len) == 0;
  int ok_b = sse_message(&b, id, "fleet", json, len) == 0;
  for (gw_sub *s = ev->subs; s; s = s->next) {
    if (s->kind & GW_SUB_EVENTS) {
      if (ok_a) sub_write(s, a.data, a.len, 0);
    } else if (ok_b) {
      sub_write(s, b.data, b.len, 0);
    }
  }
  pr_buf_free(&a);
  pr_buf_free(&b);
  sweep(ev);
}

cJSON *gw_events_json(const gw_server *gw, uint64_t after, size_t max) {
  cJSON *arr = cJSON_CreateArray();
  const gw_events *ev = gw->events;
  if (!arr || !ev) return arr;
  size_t start = ev->n > max ? ev->n - max : 0;
  for (size_t k = start; k < ev->n; k++) {
    const gw_event *e = ring_at(ev, k);
    if (e->id <= after) continue;
    cJSON *o = cJSON_Parse(e->json);
    if (o) cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

/* ---- hooks -------------------------------------------------------------------------------- */

void gw_events_replica_state(gw_server *gw, const gw_replica *r, const char *from, const char *to) {
  if (!gw->events) return;
  char msg[GW_EVENT_MAX_TEXT];
  const char *why = gw_replica_reason(r);
  if (why[0])
    snprintf(msg, sizeof(msg), "%s is %s (was %s): %s", r->id, to, from ? from : "new", why);
  else
    snprintf(msg, sizeof(msg), "%s is %s (was %s)", r->id, to, from ? from : "new");
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "replica", r->id);
  cJSON_AddStringToObject(f, "from", from ? from : "none");
  cJSON_AddStringToObject(f, "to", to);
  cJSON_AddStringToObject(f, "reason", why);
  gw_events_add(gw, "replica_state", msg, f);
}

void gw_events_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  if (ev->kind == GW_FLEET_STATE) gw_events_replica_state(gw, ev->r, ev->from, ev->to);
}

static void list_ids(pr_buf *out, const cJSON *changes, const char *key, const char *label) {
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(changes, key);
  int n = cJSON_GetArraySize(arr);
  if (n <= 0) return;
  pr_buf_text(out, "%s%s ", out->len ? "; " : "", label); /* a summary: a cut only shortens it */
  int i = 0;
  for (const cJSON *it = arr->child; it; it = it->next, i++) {
    if (i == 8) {
      pr_buf_text(out, " and %d more", n - 8);
      break;
    }
    if (cJSON_IsString(it)) pr_buf_text(out, "%s%s", i ? ", " : "", it->valuestring);
  }
}

void gw_events_reload(gw_server *gw, const char *why, int rc, const char *errors, const cJSON *changes) {
  if (!gw->events) return;
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "trigger", why ? why : "");
  if (rc == 0) {
    pr_buf what;
    pr_buf_init(&what, 900);
    list_ids(&what, changes, "added", "added");
    list_ids(&what, changes, "removed", "removed");
    list_ids(&what, changes, "changed", "changed");
    char msg[GW_EVENT_MAX_TEXT];
    snprintf(msg, sizeof(msg), "configuration reloaded (%s): %s", why ? why : "?",
             what.len ? pr_buf_cstr(&what) : "no replica changed");
    pr_buf_free(&what);
    if (changes) cJSON_AddItemToObject(f, "changes", cJSON_Duplicate(changes, 1));
    gw_events_add(gw, "config_reloaded", msg, f);
  } else {
    char msg[GW_EVENT_MAX_TEXT];
    const char *e = errors && *errors ? errors : pr_strerror(rc);
    /* the first problem in the message; all of them in "errors" */
    int first = (int)strcspn(e, "\n");
    snprintf(msg, sizeof(msg), "reload refused (%s), the running configuration is unchanged: %.*s",
             why ? why : "?", first, e);
    cJSON_AddStringToObject(f, "errors", e);
    gw_events_add(gw, "reload_refused", msg, f);
  }
}
