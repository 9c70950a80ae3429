/* Unit tests for the gateway's event core (job.c, upstream.c, verdict.c together): the
 * real gw_server on a private loop, phones scripted with proto's own HTTP server, and a
 * client on a loopback socket, all in one process and one loop. Each case says what the
 * phones answer and checks the decisions: retried or not, which phone is charged, what
 * the caller gets. tests/system/test_refusals.py checks the same over the real binaries. */
#include <errno.h>
#include <signal.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <uv.h>

#include "gw.h"
#include "http.h"
#include "log.h"
#include "metrics.h"

/* ---- scripted phones ----------------------------------------------------------------------- */

typedef struct phone {
  pr_http_server http;
  int port;
  int status;        /* what a completion gets */
  const char *body;
  int hang_up;       /* close without answering */
  int hold;          /* keep the request without answering (a phone gone quiet) */
  pr_http_req *held;
  struct phone *answers_too; /* when asked, this phone's held request is answered first */
  int split;         /* a held request is answered in two parts: its first bytes... */
  pr_http_req *open; /* ...then the rest, when the test says (phone_answer_rest) */
  int calls;
} phone;

static void open_gone(pr_http_req *req) {
  phone *p = req->data;
  if (p) p->open = NULL;
}

static void phone_answer_held(phone *p) {
  pr_http_req *req = p->held;
  p->held = NULL;
  req->on_abort = NULL;
  if (!p->split) {
    pr_http_respond(req, p->status, NULL, "application/json", p->body, strlen(p->body));
    return;
  }
  assert_int_equal(pr_http_start(req, p->status, NULL, "application/json"), 0);
  assert_true(pr_http_write(req, p->body, 8) >= 0);
  p->open = req;
  req->on_abort = open_gone;
}

static void phone_answer_rest(phone *p) {
  pr_http_req *req = p->open;
  p->open = NULL;
  req->on_abort = NULL;
  assert_true(pr_http_write(req, p->body + 8, strlen(p->body) - 8) >= 0);
  assert_int_equal(pr_http_end(req), 0);
}

static void held_gone(pr_http_req *req) {
  phone *p = req->data;
  if (p) p->held = NULL; /* the gateway let go of it (moved the request) */
}

static void phone_handler(pr_http_req *req, void *ud) {
  phone *p = ud;
  if (strcmp(req->path, "/health") == 0) {
    pr_http_respond(req, 200, NULL, "application/json", "{\"status\":\"ok\"}", 15);
    return;
  }
  p->calls++;
  if (p->answers_too && p->answers_too->held) phone_answer_held(p->answers_too);
  if (p->hang_up) {
    pr_http_abort(req);
    return;
  }
  if (p->hold) {
    p->held = req; /* answered (or aborted) when the test says */
    req->data = p;
    req->on_abort = held_gone;
    return;
  }
  pr_http_respond(req, p->status, NULL, "application/json", p->body, strlen(p->body));
}

static void phone_start(phone *p, uv_loop_t *loop, int status, const char *body) {
  memset(p, 0, sizeof(*p));
  p->status = status;
  p->body = body;
  pr_http_server_init(&p->http, loop, phone_handler, p);
  assert_int_equal(pr_http_server_listen(&p->http, "127.0.0.1:0"), 0);
  p->port = pr_http_server_port(&p->http);
}

static void phone_closed(pr_http_server *s) { (void)s; }

/* ---- the gateway ----------------------------------------------------------------------------- */

/* What ask() watches of the gateway at the end of every loop turn (the test's own, between
 * turns), and what it does then. */
typedef struct turn_watch {
  int most_attempts;  /* the most attempts one job held at a turn's end */
  int lost_left;      /* turns that ended with a lost attempt still on a job */
  int queue_left;     /* turns that ended with the deferred-free queue not empty */
  int race;           /* b (asked beside a) answers whole as soon as a's answer began, and
                         a's answer is finished a few turns later */
  int race_turns;
  int leave;          /* once two attempts run: the client hangs up */
  int left;           /* ...it did */
} turn_watch;

typedef struct core {
  uv_loop_t loop;
  gw_server gw;
  gw_config *conf;  /* the caller's reference (the server takes its own) */
  gw_replica *mark_down; /* ask(): mark it down once it holds the request */
  turn_watch *watch; /* ask(): look at every turn's end; NULL not */
  phone a, b;
  char path[64];
} core;

static const char OK[] =
    "{\"id\":\"c1\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
    "\"finish_reason\":\"stop\",\"message\":{\"role\":\"assistant\",\"content\":\"fine\"}}],"
    "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}";
/* b's answer, told apart from a's */
static const char OK_B[] =
    "{\"id\":\"c2\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
    "\"finish_reason\":\"stop\",\"message\":{\"role\":\"assistant\",\"content\":\"other\"}}],"
    "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}";
static const char REFUSAL[] =
    "{\"error\":{\"code\":500,\"message\":\"Only one completion choice is allowed\",\"type\":\"server_error\"}}";

/* scheduler.hedge_budget for the next core_new: hedging off, unless a test is about it */
static double core_hedge_budget = 0;

/* A gateway in front of phones a (fast: tried first) and b, health checks off (replicas
 * start ready), one retry budget of 3. */
static void core_start(core *c) {
  char conf[2048];
  snprintf(conf, sizeof(conf),
           "{\"listen\":[{\"address\":\"127.0.0.1:0\"}],\"log_level\":\"error\","
           "\"health\":{\"interval_s\":0,\"fall\":2},\"scheduler\":{\"retries\":3,\"hedge_budget\":%g},"
           /* the core's own decisions: no checks' shadow requests beside them */
           "\"verify\":{\"enabled\":false},"
           "\"upstream\":{\"connect_timeout_s\":2,\"timeout_min_s\":2,\"allow_http\":true,"
           "\"allow_addresses\":[\"127.0.0.0/8\"]},"
           "\"replicas\":[{\"id\":\"a\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"],\"slots\":1,"
           "\"prefill_tps\":100000,\"decode_tps\":10000},"
           "{\"id\":\"b\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"],\"slots\":1,"
           "\"prefill_tps\":1000,\"decode_tps\":100}]}",
           core_hedge_budget, c->a.port, c->b.port);
  snprintf(c->path, sizeof(c->path), "/tmp/fleetgate-test-core-XXXXXX");
  int fd = mkstemp(c->path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, conf, strlen(conf)), (ssize_t)strlen(conf));
  close(fd);
  pr_buf errors;
  pr_buf_init(&errors, 1 << 16);
  gw_config *cf = NULL;
  int rc = gw_config_load(c->path, &cf, &errors);
  if (rc) fail_msg("config: %s", pr_buf_cstr(&errors));
  pr_buf_free(&errors);
  c->conf = cf;
  assert_int_equal(gw_server_init(&c->gw, &c->loop, cf), 0);
}

/* A turn of the loop ended: what its jobs hold. Returns 1 when the client should leave. */
static int watch_turn(core *c) {
  turn_watch *w = c->watch;
  for (gw_job *j = c->gw.jobs; j; j = j->anext) {
    int n = 0;
    GW_JOB_EACH_ATTEMPT(j, a) {
      n++;
      if (a->role == GW_ATT_LOST) w->lost_left++;
    }
    if (n > w->most_attempts) w->most_attempts = n;
  }
  if (c->gw.defer_head) w->queue_left++;
  if (w->race && c->a.open && c->b.held) phone_answer_held(&c->b);
  else if (w->race && c->a.open && ++w->race_turns > 5) phone_answer_rest(&c->a);
  return w->leave && !w->left && c->a.held && c->b.held;
}

/* One request from a loopback client; the loop runs until the answer is complete (the
 * gateway answers with Content-Length) or 10 s pass. Returns the status; body in out. */
static int ask(core *c, const char *json, char *out, size_t n) {
  int port = pr_http_server_port(c->gw.proc.http[0]);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
  char req[4096];
  int len = snprintf(req, sizeof(req),
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", strlen(json), json);
  assert_int_equal(send(s, req, (size_t)len, 0), len);
  char buf[16384];
  size_t got = 0;
  for (int turns = 0; turns < 100000; turns++) {
    uv_run(&c->loop, UV_RUN_NOWAIT);
    if (c->mark_down && (c->a.held || c->b.held)) {
      gw_replica_set_state(c->mark_down, GW_REPLICA_DOWN, uv_now(&c->loop), "test: health checks failed");
      c->mark_down = NULL;
    }
    if (c->watch && watch_turn(c)) {
      c->watch->left = 1;
      break; /* the client hangs up */
    }
    struct pollfd pfd = {.fd = s, .events = POLLIN};
    if (poll(&pfd, 1, 1) == 1) {
      ssize_t r = recv(s, buf + got, sizeof(buf) - 1 - got, 0);
      if (r <= 0) break; /* Connection: close: the whole answer is in */
      got += (size_t)r;
    }
  }
  close(s);
  if (c->watch && c->watch->left) {
    /* the client hung up: the gateway lets go of the request (bounded) */
    for (int turns = 0; turns < 10000 && (c->gw.jobs_alive || c->a.held || c->b.held); turns++) {
      uv_run(&c->loop, UV_RUN_NOWAIT);
      watch_turn(c);
      usleep(1000);
    }
  }
  buf[got] = '\0';
  int status = 0;
  sscanf(buf, "HTTP/1.1 %d", &status);
  const char *body = strstr(buf, "\r\n\r\n");
  snprintf(out, n, "%s", body ? body + 4 : "");
  return status;
}

/* fleetgate_hedges_total{outcome=...} as the metrics say it */
static long hedges(core *c, const char *outcome) {
  pr_buf m;
  pr_buf_init(&m, 1 << 22);
  assert_int_equal(gw_metrics_render(&c->gw, &m), 0);
  char want[96];
  snprintf(want, sizeof(want), "fleetgate_hedges_total{outcome=\"%s\"} ", outcome);
  const char *at = strstr(pr_buf_cstr(&m), want);
  long v = at ? strtol(at + strlen(want), NULL, 10) : -1;
  pr_buf_free(&m);
  return v;
}

static gw_replica *replica(core *c, const char *id) {
  for (size_t i = 0; i < c->gw.n_replicas; i++)
    if (strcmp(c->gw.replicas[i]->id, id) == 0) return c->gw.replicas[i];
  fail_msg("no replica %s", id);
  return NULL;
}

static void core_stop(core *c) {
  gw_server_shutdown(&c->gw);
  pr_http_server_close(&c->a.http, phone_closed);
  pr_http_server_close(&c->b.http, phone_closed);
  for (int i = 0; i < 1000 && uv_run(&c->loop, UV_RUN_NOWAIT); i++) {
  }
  uv_run(&c->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&c->loop), 0);
  gw_server_free(&c->gw);
  gw_config_unref(c->conf);
  unlink(c->path);
}

static core *core_new(int sa, const char *ba, int sb, const char *bb) {
  static core c;
  memset(&c, 0, sizeof(c));
  assert_int_equal(uv_loop_init(&c.loop), 0);
  phone_start(&c.a, &c.loop, sa, ba);
  phone_start(&c.b, &c.loop, sb, bb);
  core_start(&c);
  return &c;
}

static const char REQ[] = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4}";

/* ---- decisions ------------------------------------------------------------------------------ */

static void test_a_refusal_is_checked_once_and_charges_no_phone(void **state) {
  (void)state;
  core *c = core_new(500, REFUSAL, 200, OK);
  char body[8192];
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 200); /* b answered the second opinion */
  assert_non_null(strstr(body, "\"fine\""));
  assert_int_equal(c->a.calls, 1);
  assert_int_equal(c->b.calls, 1);
  gw_replica *a = replica(c, "a");
  assert_int_equal(a->consecutive_failures, 0);
  assert_int_equal(a->state, GW_REPLICA_READY);
  assert_int_equal(c->gw.n_retries, 0); /* a second opinion is not a retry */
  core_stop(c);
}

static void test_two_refusals_settle_it(void **state) {
  (void)state;
  core *c = core_new(500, REFUSAL, 500, REFUSAL);
  char body[8192];
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 400);
  assert_non_null(strstr(body, "\"code\":\"request_refused\""));
  assert_non_null(strstr(body, "Only one completion choice is allowed"));
  assert_int_equal(c->a.calls + c->b.calls, 2);
  assert_int_equal(replica(c, "a")->consecutive_failures, 0);
  assert_int_equal(replica(c, "b")->consecutive_failures, 0);
  core_stop(c);
}

static void test_a_phone_that_hangs_up_is_charged_and_the_request_retried(void **state) {
  (void)state;
  core *c = core_new(200, OK, 200, OK);
  c->a.hang_up = 1;
  char body[8192];
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 200);
  assert_int_equal(c->a.calls, 1);
  assert_int_equal(c->b.calls, 1);
  assert_int_equal(replica(c, "a")->consecutive_failures, 1); /* fall is 2: still ready */
  assert_int_equal(replica(c, "a")->state, GW_REPLICA_READY);
  assert_int_equal(c->gw.n_retries, 1);
  /* a second failure in a row takes it down, and the request still gets its answer */
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 200);
  assert_int_equal(replica(c, "a")->state, GW_REPLICA_DOWN);
  core_stop(c);
}

static void test_a_502_is_the_phones_and_a_400_is_final(void **state) {
  (void)state;
  core *c = core_new(502, REFUSAL, 400,
                     "{\"error\":{\"code\":400,\"message\":\"too long\",\"type\":\"exceed_context_size_error\"}}");
  char body[8192];
  /* a's 502 is a failure (retried on b), b's 400 is the request's: final, uncharged */
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 400);
  assert_non_null(strstr(body, "\"code\":\"context_length_exceeded\""));
  assert_int_equal(replica(c, "a")->consecutive_failures, 1);
  assert_int_equal(replica(c, "b")->consecutive_failures, 0);
  assert_int_equal(c->gw.n_retries, 1);
  core_stop(c);
}

/* ---- outcomes as events ---------------------------------------------------------------- */

typedef struct ended_log {
  int n;
  gw_job_ended ev[4];
  char request_id[4][128];
  char replica_id[4][128]; /* the phone that served it last */
  char model[4][32]; /* (the event's strings live only during the call) */
  int keyed[4];      /* it named a key */
} ended_log;

static void on_ended(gw_server *gw, const gw_job_ended *ev, void *ud) {
  ended_log *l = ud;
  (void)gw;
  if (l->n >= 4) return;
  l->ev[l->n] = *ev;
  snprintf(l->request_id[l->n], sizeof(l->request_id[0]), "%s", ev->j->id);
  snprintf(l->replica_id[l->n], sizeof(l->replica_id[0]), "%s", ev->j->replica_id);
  snprintf(l->model[l->n], sizeof(l->model[0]), "%s", ev->model);
  l->keyed[l->n] = ev->caller != NULL;
  l->ev[l->n].model = l->ev[l->n].caller = NULL;
  l->n++;
}

/* Each ended request publishes its outcome once, worked out before any subscriber reads it,
 * to every subscriber in the order they subscribed, with the user data each gave: an answer
 * (served, its tokens from the phone's usage), the request's own fault (a 400, neither
 * served nor failed), a phone's failure on both phones (failed). */
static void test_each_ended_request_publishes_its_outcome_once(void **state) {
  (void)state;
  core *c = core_new(200, OK, 200, OK);
  ended_log log;
  memset(&log, 0, sizeof(log));
  assert_int_equal(gw_jobs_subscribe(&c->gw, on_ended, &log), 0);
  char body[8192];
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 200);
  assert_int_equal(log.n, 1);
  assert_int_equal(log.ev[0].status, 200);
  assert_true(log.ev[0].served);
  assert_false(log.ev[0].failed);
  assert_string_equal(log.model[0], "m");
  assert_false(log.keyed[0]); /* no keys */
  assert_int_equal(log.ev[0].tokens_out, 1);
  assert_true(log.ev[0].duration_s >= log.ev[0].queue_wait_s);
  assert_true(log.ev[0].ttfb_s >= 0);
  /* the bad request: the gateway's own refusal, before any phone */
  assert_int_equal(ask(c, "{\"model\":\"m\",\"messages\":[],\"max_tokens\":4}", body, sizeof(body)), 400);
  assert_int_equal(log.n, 2);
  assert_int_equal(log.ev[1].status, 400);
  assert_false(log.ev[1].served);
  assert_false(log.ev[1].failed);
  assert_string_not_equal(log.request_id[0], log.request_id[1]);
  /* both phones fail: a 502 from each, retried, then the caller's error counts as failed */
  c->a.status = c->b.status = 502;
  int st = ask(c, REQ, body, sizeof(body));
  assert_true(st >= 500);
  assert_int_equal(log.n, 3);
  assert_int_equal(log.ev[2].status, st);
  assert_true(log.ev[2].failed);
  assert_false(log.ev[2].served);
  core_stop(c);
}

static void test_a_request_moves_off_a_phone_marked_down(void **state) {
  (void)state;
  core *c = core_new(200, OK, 200, OK);
  c->a.hold = 1; /* a takes the request and goes quiet */
  char body[8192];
  /* while the request waits on a, a is found down (its health checks failed): the tick
   * moves the request to b at once instead of waiting out the watchdog */
  gw_replica *a = replica(c, "a");
  c->mark_down = a;
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 200);
  assert_non_null(strstr(body, "\"fine\""));
  assert_int_equal(c->a.calls, 1);
  assert_int_equal(c->b.calls, 1);
  assert_null(c->a.held); /* the gateway hung up on a, freeing its slot */
  assert_int_equal(c->gw.n_retries, 1);
  core_stop(c);
}

static void test_a_hedge_answers_for_a_phone_gone_quiet_and_frees_its_slot(void **state) {
  (void)state;
  core_hedge_budget = 1;
  core *c = core_new(200, OK, 200, OK);
  core_hedge_budget = 0;
  c->a.hold = 1; /* a takes the request and goes quiet; nothing marks it down */
  char body[8192];
  /* the first byte is overdue on a (about 1 s for a short prompt) and b would finish it
   * sooner than a is now expected to: b is asked too, answers first, and wins, long
   * before a's watchdog (2 s) */
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 200);
  assert_non_null(strstr(body, "\"fine\""));
  assert_int_equal(c->a.calls, 1);
  assert_int_equal(c->b.calls, 1);
  assert_null(c->a.held); /* the losing attempt was cancelled: a's slot is free */
  assert_int_equal(replica(c, "a")->inflight, 0);
  assert_int_equal(replica(c, "a")->consecutive_failures, 0); /* it lost a race, it did not fail */
  assert_int_equal(c->gw.n_retries, 0);
  core_stop(c);
}

/* A hedge's race run to its end: a's first byte is overdue, b is asked too, and both
 * answer at once: a's first bytes as b is asked, b's whole answer right after, so both
 * reach the gateway in the same turn and the loser's bytes arrive after it lost; a's answer
 * ends a few turns later. The first answer wins and is
 * the one the caller gets; the other attempt loses: it reports nothing (no second answer,
 * no failure charged, no retry, one outcome published) and is freed at the end of the turn
 * it lost in (no turn ends with a lost attempt held or the deferred-free queue not empty),
 * its slot free again. */
static void test_a_hedge_race_relays_the_winner_and_frees_the_loser_at_the_turns_end(void **state) {
  (void)state;
  core_hedge_budget = 1;
  core *c = core_new(200, OK, 200, OK_B);
  core_hedge_budget = 0;
  c->a.hold = c->b.hold = 1;
  c->a.split = 1;
  c->b.answers_too = &c->a;
  turn_watch w = {.race = 1};
  c->watch = &w;
  ended_log log;
  memset(&log, 0, sizeof(log));
  assert_int_equal(gw_jobs_subscribe(&c->gw, on_ended, &log), 0);
  char body[8192];
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 200);
  assert_int_equal(c->a.calls, 1);
  assert_int_equal(c->b.calls, 1);
  assert_int_equal(w.most_attempts, 2); /* a hedge ran beside the running attempt */
  assert_int_equal(w.lost_left, 0);
  assert_int_equal(w.queue_left, 0);
  assert_int_equal(log.n, 1);
  assert_int_equal(log.ev[0].status, 200);
  assert_true(log.ev[0].served);
  /* the winner's answer, and only it, reached the caller */
  int b_won = strcmp(log.replica_id[0], "b") == 0;
  if (!b_won) assert_string_equal(log.replica_id[0], "a");
  assert_non_null(strstr(body, b_won ? "\"other\"" : "\"fine\""));
  assert_null(strstr(body, b_won ? "\"fine\"" : "\"other\""));
  assert_int_equal(hedges(c, "started"), 1);
  assert_int_equal(hedges(c, "won"), b_won);
  assert_int_equal(hedges(c, "wasted"), !b_won);
  for (const char *id = "a"; id; id = id[0] == 'a' ? "b" : NULL) {
    assert_int_equal(replica(c, id)->inflight, 0);
    assert_int_equal(replica(c, id)->consecutive_failures, 0); /* losing is no failure */
  }
  assert_int_equal(c->gw.n_retries, 0);
  assert_null(c->gw.jobs);
  core_stop(c);
}

/* The client leaves while two attempts run (a's first byte overdue, a hedge on b, both
 * phones holding): the request ends once, as the client's leaving (499), both transfers
 * are cancelled (each phone sees its request let go of) and both slots freed, no phone is
 * charged, nothing is retried, and all of it is freed (build-asan: no leak). */
static void test_the_client_leaving_while_two_attempts_run_frees_both(void **state) {
  (void)state;
  core_hedge_budget = 1;
  core *c = core_new(200, OK, 200, OK_B);
  core_hedge_budget = 0;
  c->a.hold = c->b.hold = 1;
  turn_watch w = {.leave = 1};
  c->watch = &w;
  ended_log log;
  memset(&log, 0, sizeof(log));
  assert_int_equal(gw_jobs_subscribe(&c->gw, on_ended, &log), 0);
  char body[8192];
  assert_int_equal(ask(c, REQ, body, sizeof(body)), 0); /* hung up before any answer */
  assert_true(w.left);
  assert_int_equal(w.most_attempts, 2);
  assert_int_equal(log.n, 1);
  assert_int_equal(log.ev[0].status, 499);
  assert_false(log.ev[0].served);
  assert_false(log.ev[0].failed);
  assert_null(c->a.held); /* the gateway hung up on both phones */
  assert_null(c->b.held);
  assert_int_equal(c->a.calls, 1);
  assert_int_equal(c->b.calls, 1);
  for (const char *id = "a"; id; id = id[0] == 'a' ? "b" : NULL) {
    assert_int_equal(replica(c, id)->inflight, 0);
    assert_int_equal(replica(c, id)->consecutive_failures, 0);
  }
  assert_int_equal(hedges(c, "wasted"), 1);
  assert_int_equal(c->gw.n_retries, 0);
  assert_int_equal(c->gw.jobs_alive, 0);
  assert_int_equal(w.lost_left, 0);
  core_stop(c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  pr_log_set_level(PR_LOG_ERROR);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_a_refusal_is_checked_once_and_charges_no_phone),
    cmocka_unit_test(test_two_refusals_settle_it),
    cmocka_unit_test(test_a_phone_that_hangs_up_is_charged_and_the_request_retried),
    cmocka_unit_test(test_a_502_is_the_phones_and_a_400_is_final),
    cmocka_unit_test(test_each_ended_request_publishes_its_outcome_once),
    cmocka_unit_test(test_a_request_moves_off_a_phone_marked_down),
    cmocka_unit_test(test_a_hedge_answers_for_a_phone_gone_quiet_and_frees_its_slot),
    cmocka_unit_test(test_a_hedge_race_relays_the_winner_and_frees_the_loser_at_the_turns_end),
    cmocka_unit_test(test_the_client_leaving_while_two_attempts_run_frees_both),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
