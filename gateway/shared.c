/* Shared state in Redis; see shared.h and docs/scaling.md.
 *
 * Keys (PREFIX is redis.prefix, "fleetgate:" by default):
 *   PREFIX lease:ID      sorted set: lease member -> expiry (ms, Redis clock)
 *   PREFIX rl:KEY:rpm    hash {tokens, ts}: a key's requests-per-minute bucket
 *   PREFIX rl:KEY:tpm    hash {tokens, ts}: its tokens-per-minute bucket
 *   PREFIX hb:ID         string "TS\nBODY": the last accepted heartbeat of a phone
 *   PREFIX phones        set of phone ids with a heartbeat stored
 *   PREFIX rates         hash ID -> "PREFILL DECODE" (learned tokens/s)
 *   PREFIX gateways      sorted set: gateway id -> last seen (ms)
 *   PREFIX events        pub/sub channel: "hb ID", "state ID STATE GATEWAY REASON",
 *                        "drain ID on|off GATEWAY"
 *
 * Ownership: gw_shared belongs to the gateway (gw->shared). Each command in flight has a
 * sh_cmd, owned by the pending list until its reply (or the disconnect that stands for
 * one) arrives; a cmd's `owner` (an attempt or a job) is cleared when the owner goes
 * away first, and the reply then only undoes what it must (a granted lease is returned). */
#include "shared.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "auth.h"
#include "clock.h"
#include "heartbeat.h"
#include "log.h"
#include "registry.h"

#define SH_TICK_MS 100
#define SH_GATEWAY_EVERY_MS 2000
#define SH_GATEWAY_ALIVE_MS 10000
#define SH_BACKOFF_MIN_MS 250
#define SH_BACKOFF_MAX_MS 5000
#define SH_REMOTE_BUSY_MS 250 /* how long a "full elsewhere" answer is trusted */

enum { CMD_OTHER, CMD_LEASE, CMD_ADMIT, CMD_PING, CMD_GATEWAYS, CMD_HB_GET, CMD_MEMBERS,
       CMD_RATES, CMD_RENEW };

typedef struct sh_cmd {
  struct gw_shared *sh;
  int kind;
  uint64_t deadline_ms;
  void *owner;          /* gw_attempt (LEASE) or gw_job (ADMIT); NULL once gone */
  gw_shared_lease_cb lease_done; /* LEASE: tells owner the answer */
  gw_shared_admit_cb admit_done; /* ADMIT: likewise */
  char replica[128];    /* LEASE, RENEW, HB_GET: the phone */
  char member[128];     /* LEASE: the lease's member name */
  struct sh_cmd *next, *prev;
} sh_cmd;

struct gw_shared {
  gw_server *gw;
  redisAsyncContext *ac;   /* commands; NULL while disconnected */
  redisAsyncContext *sub;  /* pub/sub */
  int ready;               /* ac answered its first PING (AUTH and SELECT went through) */
  int sub_ready;
  int drop_sub;            /* the command side was lost: close the pub/sub side too */
  int stopping;
  uv_timer_t timer;
  uint64_t backoff_ms, next_connect_ms, next_gateway_ms;
  sh_cmd *head, *tail;     /* commands in flight, oldest first */
  unsigned n_gateways;     /* gateways seen alive, this one included */
  uint64_t lease_seq;
  char gw_id[64];
  char *host, *password, *prefix;
  int port, db;
  double timeout_s, lease_ttl_s;
  uint64_t n_timeouts, n_disconnects;
};

static const char LUA_LEASE[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "local n = redis.call('ZCARD', KEYS[1])\n"
    "if n < tonumber(ARGV[1]) then\n"
    "  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])\n"
    "  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)\n"
    "  return {1, n + 1}\n"
    "end\n"
    "return {0, n}\n";

/* Renew a lease we hold; re-adds it if it expired meanwhile (the request still runs). */
static const char LUA_RENEW[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local had = redis.call('ZSCORE', KEYS[1], ARGV[2])\n"
    "redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])\n"
    "redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2)\n"
    "if had then return 1 end\n"
    "return 0\n";

/* A key's buckets: KEYS = rpm bucket, tpm bucket; ARGV = rpm, tpm (0: none), mode
 * ("admit": take one request if both allow; "debit": take ARGV[3]... tokens).
 * Returns {allowed, which ("rpm"/"tpm"/""), rpm tokens, tpm tokens}. */
static const char LUA_BUCKETS[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local function load(k, cap)\n"
    "  local v = redis.call('HMGET', k, 'tokens', 'ts')\n"
    "  local tok = tonumber(v[1]) or cap\n"
    "  local ts = tonumber(v[2]) or now\n"
    "  tok = math.min(cap, tok + (now - ts) * cap / 60000)\n"
    "  return tok\n"
    "end\n"
    "local function save(k, tok)\n"
    "  redis.call('HSET', k, 'tokens', tostring(tok), 'ts', tostring(now))\n"
    "  redis.call('PEXPIRE', k, 180000)\n"
    "end\n"
    "local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])\n"
    "local r, k = 0, 0\n"
    "if rpm > 0 then r = load(KEYS[1], rpm) end\n"
    "if tpm > 0 then k = load(KEYS[2], tpm) end\n"
    "if ARGV[3] == 'admit' then\n"
    "  if rpm > 0 and r < 1 then return {0, 'rpm', tostring(r), tostring(k)} end\n"
    "  if tpm > 0 and k <= 0 then return {0, 'tpm', tostring(r), tostring(k)} end\n"
    "  if rpm > 0 then r = r - 1; save(KEYS[1], r) end\n"
    "else\n"
    "  if tpm > 0 then k = k - tonumber(ARGV[4]); save(KEYS[2], k) end\n"
    "end\n"
    "return {1, '', tostring(r), tostring(k)}\n";

static void sh_connect(gw_shared *sh);
static void sh_resync(gw_shared *sh);

int gw_shared_usable(const gw_server *gw) {
  return gw->shared && gw->shared->ac && gw->shared->ready && !gw->shared->stopping;
}

int gw_shared_degraded(const gw_server *gw) { return gw->shared && !gw_shared_usable(gw); }

unsigned gw_shared_gateways(const gw_server *gw) {
  return gw->shared && gw->shared->n_gateways ? gw->shared->n_gateways : 1;
}

/* Without Redis each gateway takes a conservative share of every phone's slots. */
static void sh_set_share(gw_shared *sh) {
  gw_server *gw = sh->gw;
  int div = gw_shared_usable(gw) ? 1 : (int)(sh->n_gateways ? sh->n_gateways : 1);
  for (size_t i = 0; i < gw->n_replicas; i++) gw->replicas[i]->share_div = div;
}

/* ---- commands ---------------------------------------------------------------------------- */

static void cmd_unlink(gw_shared *sh, sh_cmd *c) {
  if (c->prev) c->prev->next = c->next;
  else sh->head = c->next;
  if (c->next) c->next->prev = c->prev;
  else sh->tail = c->prev;
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv);

/* Send argv with a deadline; returns the cmd (owned by the pending list) or NULL. */
static sh_cmd *sh_send(gw_shared *sh, int kind, void *owner, int argc, const char **argv,
                       const size_t *lens) {
  if (!sh->ac) return NULL;
  sh_cmd *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->sh = sh;
  c->kind = kind;
  c->owner = owner;
  c->deadline_ms = uv_now(sh->gw->loop) + (uint64_t)(sh->timeout_s * 1000);
  if (redisAsyncCommandArgv(sh->ac, on_reply, c, argc, argv, lens) != REDIS_OK) {
    free(c);
    return NULL;
  }
  c->prev = sh->tail;
  if (sh->tail) sh->tail->next = c;
  else sh->head = c;
  sh->tail = c;
  return c;
}

static sh_cmd *sh_sendv(gw_shared *sh, int kind, void *owner, int argc, const char **argv) {
  size_t lens[16];
  for (int i = 0; i < argc && i < 16; i++) lens[i] = strlen(argv[i]);
  return sh_send(sh, kind, owner, argc, argv, lens);
}

static void key(const gw_shared *sh, char *out, size_t n, const char *a, const char *b) {
  snprintf(out, n, "%s%s%s", sh->prefix, a, b ? b : "");
}

static long long reply_int(const redisReply *r, size_t i) {
  if (!r || r->type != REDIS_REPLY_ARRAY || i >= r->elements) return 0;
  const redisReply *e = r->element[i];
  if (e->type == REDIS_REPLY_INTEGER) return e->integer;
  if (e->type == REDIS_REPLY_STRING) return atoll(e->str);
  return 0;
}

static double reply_num(const redisReply *r, size_t i) {
  if (!r || r->type != REDIS_REPLY_ARRAY || i >= r->elements) return 0;
  const redisReply *e = r->element[i];
  if (e->type == REDIS_REPLY_STRING) return atof(e->str);
  if (e->type == REDIS_REPLY_INTEGER) return (double)e->integer;
  return 0;
}

/* ---- leases -------------------------------------------------------------------------------- */

int gw_shared_lease(gw_server *gw, gw_attempt *a, gw_shared_lease_cb done) {
  gw_shared *sh = gw->shared;
  if (!gw_shared_usable(gw)) return -EAGAIN;
  char k[256], slots[16], ttl[24];
  key(sh, k, sizeof(k), "lease:", a->replica->id);
  snprintf(slots, sizeof(slots), "%d", a->replica->slots);
  snprintf(ttl, sizeof(ttl), "%" PRIu64, (uint64_t)(sh->lease_ttl_s * 1000));
  snprintf(a->rlease, sizeof(a->rlease), "%s:%" PRIu64, sh->gw_id, ++sh->lease_seq);
  const char *argv[] = {"EVAL", LUA_LEASE, "1", k, slots, ttl, a->rlease};
  sh_cmd *c = sh_sendv(sh, CMD_LEASE, a, 7, argv);
  if (!c) {
    a->rlease[0] = '\0';
    return -EAGAIN;
  }
  snprintf(c->replica, sizeof(c->replica), "%s", a->replica->id);
  snprintf(c->member, sizeof(c->member), "%s", a->rlease);
  c->lease_done = done;
  a->rlease_cmd = c;
  return 0;
}

static void sh_release(gw_shared *sh, const char *replica, const char *member) {
  char k[256];
  key(sh, k, sizeof(k), "lease:", replica);
  const char *argv[] = {"ZREM", k, member};
  sh_sendv(sh, CMD_OTHER, NULL, 3, argv);
}

void gw_shared_lease_end(gw_server *gw, gw_attempt *a) {
  gw_shared *sh = gw->shared;
  if (a->rlease_cmd) {
    ((sh_cmd *)a->rlease_cmd)->owner = NULL; /* the reply gives a granted lease back */
    a->rlease_cmd = NULL;
    a->rlease[0] = '\0';
    return;
  }
  if (a->rlease_held && sh && sh->ac) sh_release(sh, a->replica->id, a->rlease);
  a->rlease_held = 0;
  a->rlease[0] = '\0';
}

static void lease_reply(gw_shared *sh, sh_cmd *c, const redisReply *r) {
  gw_attempt *a = c->owner;
  int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2;
  int granted = ok && reply_int(r, 0) == 1;
  int count = (int)reply_int(r, 1);
  if (!a) {
    if (granted && sh->ac) sh_release(sh, c->replica, c->member);
    return;
  }
  a->rlease_cmd = NULL;
  if (ok) {
    gw_replica *rep = a->replica;
    /* what the others hold now (our own lease is counted locally) */
    int mine = granted ? rep->inflight : rep->inflight - 1; /* ours in Redis, roughly */
    int others = count - mine;
    rep->remote_busy = others > 0 ? others : 0;
    rep->remote_busy_until = uv_now(sh->gw->loop) + SH_REMOTE_BUSY_MS;
    a->rlease_held = granted;
    a->rlease_renew_ms = uv_now(sh->gw->loop) + (uint64_t)(sh->lease_ttl_s * 1000 / 3);
  } else {
    a->rlease[0] = '\0'; /* Redis failed us: carry on from the local view */
  }
  c->lease_done(a, ok ? granted : -1);
}

static void sh_renew_leases(gw_shared *sh, uint64_t now) {
  char ttl[24];
  snprintf(ttl, sizeof(ttl), "%" PRIu64, (uint64_t)(sh->lease_ttl_s * 1000));
  for (gw_job *j = sh->gw->jobs; j; j = j->anext) {
    gw_attempt *a = j->att;
    if (!a || !a->rlease_held || now < a->rlease_renew_ms) continue;
    char k[256];
    key(sh, k, sizeof(k), "lease:", a->replica->id);
    const char *argv[] = {"EVAL", LUA_RENEW, "1", k, ttl, a->rlease};
    sh_cmd *c = sh_sendv(sh, CMD_RENEW, NULL, 6, argv);
    if (c) snprintf(c->replica, sizeof(c->replica), "%s", a->replica->id);
    a->rlease_renew_ms = now + (uint64_t)(sh->lease_ttl_s * 1000 / 3);
  }
}

/* After Redis comes back: requests that started while it was away get their leases, so
 * the other gateways see them. */
static void sh_readd_leases(gw_shared *sh) {
  uint64_t now = uv_now(sh->gw->loop);
  char ttl[24];
  snprintf(ttl, sizeof(ttl), "%" PRIu64, (uint64_t)(sh->lease_ttl_s * 1000));
  for (gw_job *j = sh->gw->jobs; j; j = j->anext) {
    gw_attempt *a = j->att;
    if (!a || a->rlease_held || a->rlease_cmd || !a->lease) continue;
    snprintf(a->rlease, sizeof(a->rlease), "%s:%" PRIu64, sh->gw_id, ++sh->lease_seq);
    char k[256];
    key(sh, k, sizeof(k), "lease:", a->replica->id);
    const char *argv[] = {"EVAL", LUA_RENEW, "1", k, ttl, a->rlease};
    if (sh_sendv(sh, CMD_RENEW, NULL, 6, argv)) {
      a->rlease_held = 1;
      a->rlease_renew_ms = now + (uint64_t)(sh->lease_ttl_s * 1000 / 3);
    }
  }
}

/* ---- admission and token budgets ------------------------------------------------------------ */

int gw_shared_admit(gw_server *gw, gw_job *j, gw_shared_admit_cb done) {
  gw_shared *sh = gw->shared;
  const gw_key_conf *k = j->caller ? j->caller->conf : NULL;
  if (!k || (k->rpm <= 0 && k->tpm <= 0) || !gw_shared_usable(gw)) return -EAGAIN;
  char k1[256], k2[256], rpm[32], tpm[32];
  snprintf(k1, sizeof(k1), "%srl:%s:rpm", sh->prefix, k->name);
  snprintf(k2, sizeof(k2), "%srl:%s:tpm", sh->prefix, k->name);
  snprintf(rpm, sizeof(rpm), "%.6g", k->rpm);
  snprintf(tpm, sizeof(tpm), "%.6g", k->tpm);
  const char *argv[] = {"EVAL", LUA_BUCKETS, "2", k1, k2, rpm, tpm, "admit", "0"};
  sh_cmd *c = sh_sendv(sh, CMD_ADMIT, j, 9, argv);
  if (!c) return -EAGAIN;
  c->admit_done = done;
  j->admit_cmd = c;
  return 0;
}

void gw_shared_admit_forget(gw_job *j) {
  if (j->admit_cmd) ((sh_cmd *)j->admit_cmd)->owner = NULL;
  j->admit_cmd = NULL;
}

static void admit_reply(gw_shared *sh, sh_cmd *c, const redisReply *r) {
  (void)sh;
  gw_job *j = c->owner;
  if (!j) return;
  j->admit_cmd = NULL;
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 4) {
    c->admit_done(j, -1, NULL, 0, 0); /* decide locally */
    return;
  }
  const redisReply *which = r->element[1];
  c->admit_done(j, (int)reply_int(r, 0), which->type == REDIS_REPLY_STRING ? which->str : "",
                 reply_num(r, 2), reply_num(r, 3));
}

void gw_shared_debit(gw_server *gw, gw_caller *c, uint64_t tokens) {
  gw_shared *sh = gw->shared;
  const gw_key_conf *k = c->conf;
  if (!k || k->tpm <= 0 || !gw_shared_usable(gw)) return;
  char k1[256], k2[256], tpm[32], n[32];
  snprintf(k1, sizeof(k1), "%srl:%s:rpm", sh->prefix, k->name);
  snprintf(k2, sizeof(k2), "%srl:%s:tpm", sh->prefix, k->name);
  snprintf(tpm, sizeof(tpm), "%.6g", k->tpm);
  snprintf(n, sizeof(n), "%" PRIu64, tokens);
  const char *argv[] = {"EVAL", LUA_BUCKETS, "2", k1, k2, "0", tpm, "debit", n};
  sh_sendv(sh, CMD_OTHER, NULL, 9, argv);
}

/* ---- registry -------------------------------------------------------------------------------- */

void gw_shared_publish_heartbeat(gw_server *gw, const char *id, int64_t ts, const char *body,
                                 size_t len) {
  gw_shared *sh = gw->shared;
  if (!gw_shared_usable(gw)) return;
  char k[256], set[256], chan[256], msg[200], px[32];
  key(sh, k, sizeof(k), "hb:", id);
  key(sh, set, sizeof(set), "phones", NULL);
  key(sh, chan, sizeof(chan), "events", NULL);
  snprintf(msg, sizeof(msg), "hb %s", id);
  snprintf(px, sizeof(px), "%" PRIu64, (uint64_t)(gw->conf->heartbeat_timeout_s * 10 * 1000));
  size_t vlen = (size_t)snprintf(NULL, 0, "%" PRId64 "\n", ts) + len;
  char *val = malloc(vlen + 1);
  if (!val) return;
  int off = snprintf(val, vlen + 1, "%" PRId64 "\n", ts);
  memcpy(val + off, body ? body : "", len);
  const char *a1[] = {"SET", k, val, "PX", px};
  size_t l1[] = {3, strlen(k), vlen, 2, strlen(px)};
  sh_send(sh, CMD_OTHER, NULL, 5, a1, l1);
  free(val);
  const char *a2[] = {"SADD", set, id};
  sh_sendv(sh, CMD_OTHER, NULL, 3, a2);
  const char *a3[] = {"PUBLISH", chan, msg};
  sh_sendv(sh, CMD_OTHER, NULL, 3, a3);
}

void gw_shared_publish_state(gw_server *gw, const gw_replica *r) {
  gw_shared *sh = gw->shared;
  if (!gw_shared_usable(gw) || r->state != GW_REPLICA_DOWN) return;
  /* a remote verdict must not bounce back: only this gateway's own findings go out */
  if (r->state_remote) return;
  char chan[256], msg[512];
  key(sh, chan, sizeof(chan), "events", NULL);
  snprintf(msg, sizeof(msg), "state %s down %s %s", r->id, sh->gw_id, r->state_reason);
  const char *argv[] = {"PUBLISH", chan, msg};
  sh_sendv(sh, CMD_OTHER, NULL, 3, argv);
}

void gw_shared_on_fleet(gw_server *gw, const gw_fleet_event *ev) {
  switch (ev->kind) {
    case GW_FLEET_STATE: gw_shared_publish_state(gw, ev->r); break;
    case GW_FLEET_DRAIN: gw_shared_publish_drain(gw, ev->r); break;
    case GW_FLEET_RATES: gw_shared_publish_rates(gw, ev->r); break;
    case GW_FLEET_PROGRESS: /* this gateway's own requests: nothing to share */
    case GW_FLEET_ADDED:    /* each gateway reads its own config; heartbeats go out */
    case GW_FLEET_REMOVED:  /* (gw_shared_publish_heartbeat) as they are accepted */
      break;
  }
}

void gw_shared_publish_drain(gw_server *gw, const gw_replica *r) {
  gw_shared *sh = gw->shared;
  if (!gw_shared_usable(gw)) return;
  char chan[256], msg[256];
  key(sh, chan, sizeof(chan), "events", NULL);
  snprintf(msg, sizeof(msg), "drain %s %s %s", r->id, r->drain_admin ? "on" : "off", sh->gw_id);
  const char *argv[] = {"PUBLISH", chan, msg};
  sh_sendv(sh, CMD_OTHER, NULL, 3, argv);
}

static void remote_drain(gw_shared *sh, const char *msg) {
  char id[128], on[8], from[64];
  if (sscanf(msg, "drain %127s %7s %63s", id, on, from) != 3 || strcmp(from, sh->gw_id) == 0) return;
  gw_replica *r = gw_registry_find(sh->gw, id);
  if (!r) return;
  const char *old = gw_replica_display_state(r);
  r->drain_admin = strcmp(on, "on") == 0;
  snprintf(r->state_reason, sizeof(r->state_reason), "%s by gateway %s",
           r->drain_admin ? "drained" : "enabled", from);
  gw_registry_event(sh->gw, r, old);
  gw_plan_soon(sh->gw);
}

void gw_shared_publish_rates(gw_server *gw, gw_replica *r) {
  gw_shared *sh = gw->shared;
  uint64_t now = uv_now(gw->loop);
  if (!gw_shared_usable(gw) || now < r->rates_shared_ms + 5000) return;
  r->rates_shared_ms = now;
  char k[256], v[64];
  key(sh, k, sizeof(k), "rates", NULL);
  snprintf(v, sizeof(v), "%.3f %.3f", r->prefill_tps, r->decode_tps);
  const char *argv[] = {"HSET", k, r->id, v};
  sh_sendv(sh, CMD_OTHER, NULL, 4, argv);
}

static void hb_get(gw_shared *sh, const char *id) {
  char k[256];
  key(sh, k, sizeof(k), "hb:", id);
  const char *argv[] = {"GET", k};
  sh_cmd *c = sh_sendv(sh, CMD_HB_GET, NULL, 2, argv);
  if (c) snprintf(c->replica, sizeof(c->replica), "%s", id);
}

static void hb_reply(gw_shared *sh, sh_cmd *c, const redisReply *r) {
  gw_server *gw = sh->gw;
  if (!r || r->type != REDIS_REPLY_STRING) {
    if (r && r->type == REDIS_REPLY_NIL && sh->ac) {
      char set[256];
      key(sh, set, sizeof(set), "phones", NULL);
      const char *argv[] = {"SREM", set, c->replica};
      sh_sendv(sh, CMD_OTHER, NULL, 3, argv);
    }
    return;
  }
  const char *nl = memchr(r->str, '\n', r->len);
  if (!nl) return;
  int64_t ts = strtoll(r->str, NULL, 10);
  const char *body = nl + 1;
  size_t len = r->len - (size_t)(body - r->str);
  /* already seen (our own, or an older copy): nothing to do */
  gw_replica *known = gw_registry_find(gw, c->replica);
  if (known && known->last_heartbeat_ts >= ts) return;
  gw_replica *out = NULL;
  const char *code = NULL;
  char msg[300];
  if (gw->apply_heartbeat && gw->apply_heartbeat(gw, body, len, ts, 1, &out, &code, msg, sizeof(msg)) == 0)
    out->share_div = gw_shared_usable(gw) ? 1 : (int)sh->n_gateways;
}

static void members_reply(gw_shared *sh, const redisReply *r) {
  if (!r || r->type != REDIS_REPLY_ARRAY) return;
  for (size_t i = 0; i < r->elements; i++)
    if (r->element[i]->type == REDIS_REPLY_STRING) hb_get(sh, r->element[i]->str);
}

static void rates_reply(gw_shared *sh, const redisReply *r) {
  if (!r || r->type != REDIS_REPLY_ARRAY) return;
  for (size_t i = 0; i + 1 < r->elements; i += 2) {
    gw_replica *rep = gw_registry_find(sh->gw, r->element[i]->str);
    if (!rep || rep->prefill_samples || rep->decode_samples) continue;
    double pre = 0, dec = 0;
    /* another gateway's numbers, or anyone's who can write to Redis: "inf" and "nan"
     * scan as numbers, so they are bounded like a phone's own */
    if (sscanf(r->element[i + 1]->str, "%lf %lf", &pre, &dec) == 2)
      gw_replica_seed_rates(rep, pre, dec);
  }
}

static void remote_state(gw_shared *sh, const char *msg) {
  /* "state ID down GATEWAY REASON" */
  char id[128], st[16], from[64];
  int off = 0;
  if (sscanf(msg, "state %127s %15s %63s %n", id, st, from, &off) < 3) return;
  if (strcmp(from, sh->gw_id) == 0 || strcmp(st, "down") != 0) return;
  gw_replica *r = gw_registry_find(sh->gw, id);
  if (!r || r->state != GW_REPLICA_READY) return;
  const char *old = gw_replica_display_state(r);
  char reason[128];
  snprintf(reason, sizeof(reason), "gateway %s: %s", from, off ? msg + off : "");
  uint64_t now = uv_now(sh->gw->loop);
  r->down_until_ms = now + (uint64_t)(sh->gw->conf->cooldown_s * 1000);
  gw_replica_set_state(r, GW_REPLICA_DOWN, now, reason);
  r->state_remote = 1;
  gw_registry_event(sh->gw, r, old);
}

/* ---- replies, connections, timeouts ------------------------------------------------------------ */

static void on_reply(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  sh_cmd *c = priv;
  gw_shared *sh = c->sh;
  cmd_unlink(sh, c);
  redisReply *r = reply;
  if (r && r->type == REDIS_REPLY_ERROR)
    pr_warn("redis: %s", r->str);
  switch (c->kind) {
    case CMD_LEASE: lease_reply(sh, c, r && r->type != REDIS_REPLY_ERROR ? r : NULL); break;
    case CMD_ADMIT: admit_reply(sh, c, r && r->type != REDIS_REPLY_ERROR ? r : NULL); break;
    case CMD_PING:
      if (r && r->type == REDIS_REPLY_STATUS && !sh->ready && !sh->stopping) {
        sh->ready = 1;
        sh->backoff_ms = SH_BACKOFF_MIN_MS;
        pr_info("redis: connected to %s:%d as gateway %s", sh->host, sh->port, sh->gw_id);
        sh_resync(sh);
      }
      break;
    case CMD_GATEWAYS:
      if (r && r->type == REDIS_REPLY_INTEGER && r->integer > 0) sh->n_gateways = (unsigned)r->integer;
      break;
    case CMD_HB_GET: hb_reply(sh, c, r); break;
    case CMD_MEMBERS: members_reply(sh, r); break;
    case CMD_RATES: rates_reply(sh, r); break;
    default: break;
  }
  free(c);
  if (!sh->stopping) sh_set_share(sh);
}

static void on_message(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  gw_shared *sh = priv;
  redisReply *r = reply;
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 3 || sh->stopping) return;
  if (r->element[0]->type != REDIS_REPLY_STRING) return;
  if (strcmp(r->element[0]->str, "subscribe") == 0) {
    sh->sub_ready = 1;
    return;
  }
  if (strcmp(r->element[0]->str, "message") != 0 || r->element[2]->type != REDIS_REPLY_STRING) return;
  const char *msg = r->element[2]->str;
  if (strncmp(msg, "hb ", 3) == 0 && gw_shared_usable(sh->gw)) hb_get(sh, msg + 3);
  else if (strncmp(msg, "state ", 6) == 0) remote_state(sh, msg);
  else if (strncmp(msg, "drain ", 6) == 0) remote_drain(sh, msg);
}

static void sh_lost(gw_shared *sh, const char *why) {
  if (sh->ready && !sh->stopping) {
    pr_warn("redis: %s; serving from this gateway's own view (a 1/%u share of each phone's "
            "slots) until it is back",
            why, sh->n_gateways ? sh->n_gateways : 1);
  }
  sh->ready = 0;
  sh->n_disconnects++;
  uint64_t now = uv_now(sh->gw->loop);
  sh->next_connect_ms = now + sh->backoff_ms;
  sh->backoff_ms = sh->backoff_ms * 2 > SH_BACKOFF_MAX_MS ? SH_BACKOFF_MAX_MS : sh->backoff_ms * 2;
  if (!sh->stopping) sh_set_share(sh);
}

/* hiredis frees a context itself after a failed connect or a disconnect; the pub/sub
 * side goes with the command side (it is resubscribed on the next connection), from the
 * tick, not from inside hiredis's callback. */
static void on_connect(const redisAsyncContext *ac, int status) {
  gw_shared *sh = ac->data;
  if (status == REDIS_OK) return;
  if (ac == sh->ac) {
    sh->ac = NULL;
    sh->drop_sub = 1;
    sh_lost(sh, "cannot connect");
  } else if (ac == sh->sub) {
    sh->sub = NULL;
    sh->sub_ready = 0;
  }
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  (void)status;
  gw_shared *sh = ac->data;
  if (ac == sh->ac) {
    sh->ac = NULL;
    sh->drop_sub = 1;
    sh_lost(sh, "connection lost");
  } else if (ac == sh->sub) {
    sh->sub = NULL;
    sh->sub_ready = 0;
  }
}

/* Give up on the connections now (a command past its deadline: Redis hangs, or the
 * connect never completes). Pending commands are answered "no reply" on the way. */
static void sh_drop(gw_shared *sh, const char *why) {
  redisAsyncContext *ac = sh->ac, *sub = sh->sub;
  sh->ac = NULL;
  sh->sub = NULL;
  sh->sub_ready = 0;
  sh->drop_sub = 0;
  if (sub) redisAsyncFree(sub);
  if (ac) redisAsyncFree(ac);
  sh_lost(sh, why);
}

static redisAsyncContext *sh_open(gw_shared *sh) {
  redisAsyncContext *ac = redisAsyncConnect(sh->host, sh->port);
  if (!ac) return NULL;
  if (ac->err) {
    redisAsyncFree(ac);
    return NULL;
  }
  ac->data = sh;
  if (redisLibuvAttach(ac, sh->gw->loop) != REDIS_OK) {
    redisAsyncFree(ac);
    return NULL;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  return ac;
}

static void sh_connect(gw_shared *sh) {
  sh->ac = sh_open(sh);
  if (!sh->ac) {
    sh_lost(sh, "cannot connect");
    return;
  }
  char db[16];
  snprintf(db, sizeof(db), "%d", sh->db);
  if (sh->password) {
    const char *a[] = {"AUTH", sh->password};
    sh_sendv(sh, CMD_OTHER, NULL, 2, a);
  }
  if (sh->db) {
    const char *a[] = {"SELECT", db};
    sh_sendv(sh, CMD_OTHER, NULL, 2, a);
  }
  const char *ping[] = {"PING"};
  sh_sendv(sh, CMD_PING, NULL, 1, ping);
  sh->sub = sh_open(sh);
  if (sh->sub) {
    if (sh->password) redisAsyncCommand(sh->sub, NULL, NULL, "AUTH %s", sh->password);
    char chan[256];
    key(sh, chan, sizeof(chan), "events", NULL);
    redisAsyncCommand(sh->sub, on_message, sh, "SUBSCRIBE %s", chan);
  }
}

static void sh_gateways(gw_shared *sh) {
  char k[256], now_s[32], old_s[32];
  key(sh, k, sizeof(k), "gateways", NULL);
  int64_t now = pr_clock_wall_ms();
  snprintf(now_s, sizeof(now_s), "%" PRId64, now);
  snprintf(old_s, sizeof(old_s), "%" PRId64, now - SH_GATEWAY_ALIVE_MS);
  const char *a1[] = {"ZADD", k, now_s, sh->gw_id};
  sh_sendv(sh, CMD_OTHER, NULL, 4, a1);
  const char *a2[] = {"ZREMRANGEBYSCORE", k, "-inf", old_s};
  sh_sendv(sh, CMD_OTHER, NULL, 4, a2);
  const char *a3[] = {"ZCARD", k};
  sh_sendv(sh, CMD_GATEWAYS, NULL, 2, a3);
}

/* Connected (again): announce ourselves, learn the phones and speeds the others know,
 * and put back the leases of requests that started without Redis. */
static void sh_resync(gw_shared *sh) {
  char k[256];
  sh_gateways(sh);
  key(sh, k, sizeof(k), "phones", NULL);
  const char *a1[] = {"SMEMBERS", k};
  sh_sendv(sh, CMD_MEMBERS, NULL, 2, a1);
  key(sh, k, sizeof(k), "rates", NULL);
  const char *a2[] = {"HGETALL", k};
  sh_sendv(sh, CMD_RATES, NULL, 2, a2);
  sh_readd_leases(sh);
}

static void sh_tick(uv_timer_t *t) {
  gw_shared *sh = t->data;
  if (sh->stopping) return;
  uint64_t now = uv_now(sh->gw->loop);
  /* a command past its deadline: Redis is too slow to count on; drop the connection,
   * which answers every pending command with "no reply" (handled as Redis down) */
  if (sh->head && now > sh->head->deadline_ms && sh->ac) {
    sh->n_timeouts++;
    char why[64];
    snprintf(why, sizeof(why), "no answer within %.2f s", sh->timeout_s);
    sh_drop(sh, why);
    return;
  }
  if (sh->drop_sub && sh->sub) {
    redisAsyncContext *sub = sh->sub;
    sh->sub = NULL;
    sh->sub_ready = 0;
    redisAsyncFree(sub);
  }
  sh->drop_sub = 0;
  if (!sh->ac && now >= sh->next_connect_ms) {
    sh_connect(sh);
    return;
  }
  if (!gw_shared_usable(sh->gw)) return;
  if (now >= sh->next_gateway_ms) {
    sh->next_gateway_ms = now + SH_GATEWAY_EVERY_MS;
    sh_gateways(sh);
  }
  sh_renew_leases(sh, now);
}

int gw_shared_start(gw_server *gw) {
  const gw_config *c = gw->conf;
  if (!c->redis_host) return 0;
  gw_shared *sh = calloc(1, sizeof(*sh));
  if (!sh) return -ENOMEM;
  sh->gw = gw;
  sh->host = strdup(c->redis_host);
  sh->password = c->redis_password ? strdup(c->redis_password) : NULL;
  sh->prefix = strdup(c->redis_prefix ? c->redis_prefix : "fleetgate:");
  sh->port = c->redis_port;
  sh->db = c->redis_db;
  sh->timeout_s = c->redis_timeout_s;
  sh->lease_ttl_s = c->lease_ttl_s;
  sh->backoff_ms = SH_BACKOFF_MIN_MS;
  sh->n_gateways = 1;
  if (c->gateway_id) {
    snprintf(sh->gw_id, sizeof(sh->gw_id), "%s", c->gateway_id);
  } else {
    char host[64] = "gateway";
    gethostname(host, sizeof(host) - 1);
    snprintf(sh->gw_id, sizeof(sh->gw_id), "%s:%d", host, (int)getpid());
  }
  uv_timer_init(gw->loop, &sh->timer);
  sh->timer.data = sh;
  uv_timer_start(&sh->timer, sh_tick, SH_TICK_MS, SH_TICK_MS);
  gw->shared = sh;
  sh_connect(sh);
  return 0;
}

static void sh_timer_closed(uv_handle_t *h) {
  gw_shared *sh = h->data;
  free(sh->host);
  free(sh->password);
  free(sh->prefix);
  free(sh);
}

void gw_shared_stop(gw_server *gw) {
  gw_shared *sh = gw->shared;
  if (!sh) return;
  sh->stopping = 1;
  gw->shared = NULL;
  /* pending replies arrive (as "no reply") during the frees below and find their owners
   * already gone or told */
  if (sh->sub) redisAsyncFree(sh->sub);
  sh->sub = NULL;
  if (sh->ac) redisAsyncFree(sh->ac);
  sh->ac = NULL;
  while (sh->head) {
    sh_cmd *c = sh->head;
    cmd_unlink(sh, c);
    free(c);
  }
  uv_timer_stop(&sh->timer);
  uv_close((uv_handle_t *)&sh->timer, sh_timer_closed);
}

void gw_shared_apply(gw_server *gw) {
  const gw_config *c = gw->conf;
  gw_shared *sh = gw->shared;
  int same = sh && c->redis_host && strcmp(sh->host, c->redis_host) == 0 &&
             sh->port == c->redis_port && sh->db == c->redis_db &&
             strcmp(sh->prefix, c->redis_prefix ? c->redis_prefix : "fleetgate:") == 0;
  if (same) {
    sh->timeout_s = c->redis_timeout_s;
    sh->lease_ttl_s = c->lease_ttl_s;
    return;
  }
  if (sh) gw_shared_stop(gw);
  if (c->redis_host) gw_shared_start(gw);
  else for (size_t i = 0; i < gw->n_replicas; i++) gw->replicas[i]->share_div = 1;
}
