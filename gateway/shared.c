/* Shared state in Redis; see shared.h and docs/scaling.md.
 *
 * Keys (PREFIX is redis.prefix, "fleetgate:" by default):
 *   PREFIX lease:ID      sorted set: lease member -> expiry (ms, Redis clock)
 *   PREFIX cache:ID      the cache scope (hex) whose prompts alone the phone's engine may
 *                        hold, "*" several or unknown (docs/security.md "Tenants' prompts";
 *                        phones whose agent keeps scopes apart have none)
 *   PREFIX rl:KEY:rpm    hash {tokens, ts}: a key's requests-per-minute bucket
 *   PREFIX rl:KEY:tpm    hash {tokens, ts}: its tokens-per-minute bucket
 *   PREFIX hb:ID         sealed "TS\nFLEETSIG\nKEYSIG\nBODY": the last accepted heartbeat
 *                        of a phone, as it signed it (verified again by each gateway)
 *   PREFIX phones        set of phone ids with a heartbeat stored
 *   PREFIX rates         hash ID -> sealed "PREFILL DECODE" (learned tokens/s)
 *   PREFIX gateways      sorted set: gateway id -> last seen (ms)
 *   PREFIX quarantine    hash ID -> sealed JSON: the newest verdict on a phone's answers,
 *                        a quarantine (with its evidence) or an operator's release
 *                        (verify.h; through gw->verdict_json and gw->apply_verdict);
 *                        the newest wins everywhere
 *   PREFIX events        pub/sub channel, each message sealed: "hb ID",
 *                        "state ID STATE GATEWAY REASON", "drain ID on|off GATEWAY",
 *                        "verdict ID GATEWAY" (read the hash's field)
 *
 * Sealed (seal.h): "fg1 GATEWAY SEQ TS MAC\n" before the payload, the MAC bound to the
 * channel or key (a hash's: "KEY FIELD"). What fails to open is dropped, counted by
 * reason (fleetgate_redis_messages_refused_total) and logged at most once a second.
 * Leases, buckets and the gateways' set are not sealed: Lua on Redis decides them, and
 * whoever can write to Redis can deny service anyway (docs/scaling.md#redis-access).
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
#include <openssl/crypto.h>

#include "auth.h"
#include "buf.h"
#include "clock.h"
#include "drains.h"
#include "heartbeat.h"
#include "idkey.h"
#include "json.h"
#include "log.h"
#include "registry.h"
#include "seal.h"
#include "sign.h"

#define SH_TICK_MS 100
#define SH_GATEWAY_EVERY_MS 2000
#define SH_GATEWAY_ALIVE_MS 10000
#define SH_BACKOFF_MIN_MS 250
#define SH_BACKOFF_MAX_MS 5000
#define SH_REMOTE_BUSY_MS 250 /* how long a "full elsewhere" answer is trusted */
#define SH_RATES_MAX_AGE_MS ((int64_t)86400 * 1000) /* stored speeds older than a day are not taken */
#define SH_REFUSED_LOG_MS 1000 /* at most one line a second about refused messages */
/* a quarantine holds until an operator's release, however long ago it was decided */
#define SH_VERDICT_MAX_AGE_MS ((int64_t)10 * 366 * 86400 * 1000)
/* what a phone's engine may hold is remembered this long after the last request (30 days) */
#define SH_CACHE_SCOPE_TTL_MS "2592000000"

enum { CMD_OTHER, CMD_LEASE, CMD_ADMIT, CMD_PING, CMD_GATEWAYS, CMD_HB_GET, CMD_MEMBERS,
       CMD_RATES, CMD_RENEW, CMD_AUTH, CMD_VERDICT_GET, CMD_VERDICTS };

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
  char *host, *username, *password, *prefix;
  int port, db;
  double timeout_s, lease_ttl_s;
  uint64_t n_timeouts, n_disconnects;
  int auth_failed;         /* AUTH was refused on this connection: the tick drops it */
  int auth_told;           /* that was logged; quiet until a connection succeeds */
  gw_seal seal;            /* our id, key, sequence numbers and every sender's last one */
  uint64_t refused[GW_SEAL_N]; /* messages and values refused, by reason */
  uint64_t refused_quiet;  /* refusals not logged since the last line */
  uint64_t refused_logged_ms;
};

/* KEYS = the phone's leases, its cache scope; ARGV = slots, ttl, member, the request's
 * scope ("": not decided here). A granted lease also says whether the request may reuse
 * the phone's prompt cache: only when every gateway sent that phone its scope's prompts
 * alone. No key is no knowledge (a new phone, Redis restarted or flushed, an old gateway
 * sent there): "*", several, reused by nobody. */
static const char LUA_LEASE[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "local n = redis.call('ZCARD', KEYS[1])\n"
    "if n < tonumber(ARGV[1]) then\n"
    "  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])\n"
    "  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)\n"
    "  if ARGV[4] == '' then return {1, n + 1, 1} end\n"
    "  local reuse = 1\n"
    "  local h = redis.call('GET', KEYS[2])\n"
    "  if h ~= ARGV[4] then\n"
    "    reuse = 0\n"
    "    if h ~= '*' then redis.call('SET', KEYS[2], '*') end\n"
    "  end\n"
    "  redis.call('PEXPIRE', KEYS[2], " SH_CACHE_SCOPE_TTL_MS ")\n"
    "  return {1, n + 1, reuse}\n"
    "end\n"
    "return {0, n, 0}\n";

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
  for (size_t i = 0; i < gw->n_replicas; i++) gw->replicas[i]->shared.share_div = div;
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

/* ---- sealing ------------------------------------------------------------------------------ */

/* PUBLISH payload on the events channel, sealed. */
static void sh_publish(gw_shared *sh, const char *payload) {
  char chan[256];
  key(sh, chan, sizeof(chan), "events", NULL);
  char *msg = NULL;
  size_t len = 0;
  if (gw_seal_wrap(&sh->seal, chan, pr_clock_wall_ms(), payload, strlen(payload), &msg, &len) < 0) return;
  const char *argv[] = {"PUBLISH", chan, msg};
  size_t lens[] = {7, strlen(chan), len};
  sh_send(sh, CMD_OTHER, NULL, 3, argv, lens);
  free(msg);
}

/* A message or value that did not open: counted, and told at most once a second. */
static void sh_refused(gw_shared *sh, gw_seal_verdict v, const char *where, const char *from) {
  if (v >= GW_SEAL_N) return;
  sh->refused[v]++;
  uint64_t now = uv_now(sh->gw->loop);
  if (sh->refused_logged_ms && now < sh->refused_logged_ms + SH_REFUSED_LOG_MS) {
    sh->refused_quiet++;
    return;
  }
  pr_warn("redis: refused %s%s%s: %s (%" PRIu64 " more refused since the last such line)", where,
          from && *from ? " from gateway " : "", from && *from ? from : "",
          v == GW_SEAL_FORMAT ? "not sealed"
          : v == GW_SEAL_MAC  ? "wrong MAC (another key, or forged)"
          : v == GW_SEAL_STALE ? "outside the time window"
                               : "a replay",
          sh->refused_quiet);
  sh->refused_logged_ms = now;
  sh->refused_quiet = 0;
}

/* Open what was read from where (a channel, a key, "KEY FIELD"). 1 with *payload set
 * when it may be acted on; 0 otherwise (counted when refused, quiet for our own). */
static int sh_unseal(gw_shared *sh, const char *where, int once, int64_t max_age_ms, const char *msg, size_t len,
                     const char **payload, size_t *plen, char from[GW_SEAL_MAX_ID]) {
  gw_seal_verdict v = gw_seal_open(&sh->seal, where, pr_clock_wall_ms(), once, max_age_ms, msg, len, payload, plen, from);
  if (v == GW_SEAL_OK) return 1;
  if (v != GW_SEAL_SELF) sh_refused(sh, v, where, v == GW_SEAL_FORMAT || v == GW_SEAL_MAC ? NULL : from);
  return 0;
}

void gw_shared_metrics(const gw_server *gw, pr_buf *out) {
  const gw_shared *sh = gw->shared;
  pr_buf_text(out, "# HELP fleetgate_redis_messages_refused_total Messages and values from Redis refused: "
                   "not sealed, a wrong MAC, stale or replayed.\n"
                   "# TYPE fleetgate_redis_messages_refused_total counter\n");
  static const gw_seal_verdict shown[] = {GW_SEAL_FORMAT, GW_SEAL_MAC, GW_SEAL_STALE, GW_SEAL_REPLAY};
  for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++)
    pr_buf_text(out, "fleetgate_redis_messages_refused_total{reason=\"%s\"} %" PRIu64 "\n",
                gw_seal_verdict_name(shown[i]), sh ? sh->refused[shown[i]] : 0);
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
  char k[256], kc[256], slots[16], ttl[24], scope[24];
  key(sh, k, sizeof(k), "lease:", a->replica->id);
  key(sh, kc, sizeof(kc), "cache:", a->replica->id);
  snprintf(slots, sizeof(slots), "%d", a->replica->slots);
  snprintf(ttl, sizeof(ttl), "%" PRIu64, (uint64_t)(sh->lease_ttl_s * 1000));
  /* a phone whose agent keeps scopes apart decides itself; one scope in all: nobody to
   * keep apart */
  if (a->replica->pc.agent || a->job->conf->n_cache_scopes <= 1) scope[0] = '\0';
  else snprintf(scope, sizeof(scope), "%016" PRIx64, a->job->cache_scope);
  snprintf(a->rlease, sizeof(a->rlease), "%s:%" PRIu64, sh->gw_id, ++sh->lease_seq);
  const char *argv[] = {"EVAL", LUA_LEASE, "2", k, kc, slots, ttl, a->rlease, scope};
  sh_cmd *c = sh_sendv(sh, CMD_LEASE, a, 9, argv);
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
  int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 3;
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
    rep->shared.remote_busy = others > 0 ? others : 0;
    rep->shared.remote_busy_until = uv_now(sh->gw->loop) + SH_REMOTE_BUSY_MS;
    a->rlease_held = granted;
    a->rlease_renew_ms = uv_now(sh->gw->loop) + (uint64_t)(sh->lease_ttl_s * 1000 / 3);
    /* what every gateway sent there: this scope's prompts alone, or several scopes' (then
     * no reuse); this gateway's view follows, for its plans */
    if (granted && reply_int(r, 2) == 1) {
      gw_pcache_hold(&rep->pc, a->job->cache_scope);
    } else if (granted) {
      a->reuse = 0;
      gw_pcache_mix(&rep->pc);
    }
  } else {
    a->rlease[0] = '\0'; /* Redis failed us: carry on from the local view */
  }
  c->lease_done(a, ok ? granted : -1);
}

static void sh_renew_leases(gw_shared *sh, uint64_t now) {
  char ttl[24];
  snprintf(ttl, sizeof(ttl), "%" PRIu64, (uint64_t)(sh->lease_ttl_s * 1000));
  for (gw_job *j = sh->gw->jobs; j; j = j->anext) GW_JOB_EACH_ATTEMPT(j, a) {
    /* a hedge holds a lease too; a lost attempt gives its lease back this turn */
    if (a->role == GW_ATT_LOST || !a->rlease_held || now < a->rlease_renew_ms) continue;
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
  /* phones sent requests while Redis was away hold prompts no other gateway knows of */
  gw_server *gw = sh->gw;
  for (size_t i = 0; i < gw->n_replicas; i++) {
    gw_replica *r = gw->replicas[i];
    if (!r->pc.unshared) continue;
    char k[256];
    key(sh, k, sizeof(k), "cache:", r->id);
    const char *argv[] = {"SET", k, "*", "PX", SH_CACHE_SCOPE_TTL_MS};
    if (sh_sendv(sh, CMD_OTHER, NULL, 5, argv)) r->pc.unshared = 0;
  }
  for (gw_job *j = sh->gw->jobs; j; j = j->anext) GW_JOB_EACH_ATTEMPT(j, a) {
    if (a->role == GW_ATT_LOST || a->rlease_held || a->rlease_cmd || !a->lease) continue;
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

void gw_shared_on_job_ended(gw_server *gw, const gw_job_ended *ev, void *ud) {
  (void)ud;
  gw_caller *c = ev->j->caller;
  if (!ev->admitted || !c) return;
  uint64_t tokens = ev->tokens_in + ev->tokens_out;
  gw_auth_release(gw, c, tokens, gw_shared_usable(gw) ? 0 : gw_shared_gateways(gw));
  gw_shared_debit(gw, c, tokens);
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

char *gw_shared_hb_encode(const gw_heartbeat_msg *m, size_t *len) {
  const char *fsig = m->fleet_sig ? m->fleet_sig : "-";
  size_t vlen = (size_t)snprintf(NULL, 0, "%s\n%s\n%s\n", m->ts, fsig, m->key_sig) + m->len;
  char *val = malloc(vlen + 1);
  if (!val) return NULL;
  int off = snprintf(val, vlen + 1, "%s\n%s\n%s\n", m->ts, fsig, m->key_sig);
  memcpy(val + off, m->body ? m->body : "", m->len);
  val[vlen] = '\0';
  *len = vlen;
  return val;
}

int gw_shared_hb_decode(const char *val, size_t vlen, gw_shared_hb *hb, gw_heartbeat_msg *m) {
  const char *p = val, *e = val + vlen;
  char *fields[3] = {hb->ts, hb->fsig, hb->ksig};
  size_t caps[3] = {sizeof(hb->ts), sizeof(hb->fsig), sizeof(hb->ksig)};
  for (int i = 0; i < 3; i++) {
    const char *nl = memchr(p, '\n', (size_t)(e - p));
    if (!nl || (size_t)(nl - p) >= caps[i]) return -1;
    memcpy(fields[i], p, (size_t)(nl - p));
    fields[i][nl - p] = '\0';
    p = nl + 1;
  }
  char *end;
  long long tsv = strtoll(hb->ts, &end, 10);
  if (end == hb->ts || *end || tsv <= 0) return -1;
  *m = (gw_heartbeat_msg){.ts = hb->ts, .tsv = (int64_t)tsv, .fleet_sig = strcmp(hb->fsig, "-") ? hb->fsig : NULL,
                          .key_sig = hb->ksig, .body = p, .len = (size_t)(e - p)};
  return 0;
}

int gw_shared_hb_fresh(const gw_config *c, int64_t known_ts, int64_t tsv, int64_t now_wall_ms) {
  /* already seen (our own, or an older copy): nothing to do */
  if (known_ts >= tsv) return 0;
  /* no older than the relay keeps it */
  int64_t age = now_wall_ms - tsv;
  if (age > (int64_t)(c->heartbeat_timeout_s * 10 * 1000) || (double)-age > c->heartbeat_max_skew_s * 1000)
    return 0;
  return 1;
}

void gw_shared_publish_heartbeat(gw_server *gw, const char *id, const gw_heartbeat_msg *m) {
  gw_shared *sh = gw->shared;
  if (!gw_shared_usable(gw)) return;
  char k[256], set[256], msg[200], px[32];
  key(sh, k, sizeof(k), "hb:", id);
  key(sh, set, sizeof(set), "phones", NULL);
  snprintf(msg, sizeof(msg), "hb %s", id);
  snprintf(px, sizeof(px), "%" PRIu64, (uint64_t)(gw->conf->heartbeat_timeout_s * 10 * 1000));
  /* the heartbeat as the phone signed it, so every gateway verifies it again; the seal
   * says which gateway stored it */
  size_t vlen;
  char *val = gw_shared_hb_encode(m, &vlen);
  if (!val) return;
  char *sealed = NULL;
  size_t slen = 0;
  int rc = gw_seal_wrap(&sh->seal, k, pr_clock_wall_ms(), val, vlen, &sealed, &slen);
  free(val);
  if (rc < 0) return;
  const char *a1[] = {"SET", k, sealed, "PX", px};
  size_t l1[] = {3, strlen(k), slen, 2, strlen(px)};
  sh_send(sh, CMD_OTHER, NULL, 5, a1, l1);
  free(sealed);
  const char *a2[] = {"SADD", set, id};
  sh_sendv(sh, CMD_OTHER, NULL, 3, a2);
  sh_publish(sh, msg);
}

void gw_shared_publish_state(gw_server *gw, const gw_replica *r) {
  gw_shared *sh = gw->shared;
  if (!gw_shared_usable(gw) || r->state != GW_REPLICA_DOWN) return;
  /* a remote verdict must not bounce back: only this gateway's own findings go out */
  if (r->state_remote) return;
  char msg[512];
  snprintf(msg, sizeof(msg), "state %s down %s %s", r->id, sh->gw_id, r->state_reason);
  sh_publish(sh, msg);
}

void gw_shared_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud) {
  (void)ud;
  switch (ev->kind) {
    case GW_FLEET_STATE: gw_shared_publish_state(gw, ev->r); break;
    case GW_FLEET_DRAIN: gw_shared_publish_drain(gw, ev->r); break;
    case GW_FLEET_RATES: gw_shared_publish_rates(gw, ev->r); break;
    case GW_FLEET_PROGRESS: /* this gateway's own requests: nothing to share */
    case GW_FLEET_ADDED:    /* each gateway reads its own config; heartbeats go out */
    case GW_FLEET_REMOVED:  /* (gw_shared_publish_heartbeat) as they are accepted */
    case GW_FLEET_MODELS:   /* likewise */
    case GW_FLEET_SENT:     /* leases are Redis's own business (gw_shared_lease) */
      break;
  }
}

void gw_shared_publish_drain(gw_server *gw, const gw_replica *r) {
  gw_shared *sh = gw->shared;
  if (!gw_shared_usable(gw)) return;
  char msg[256];
  snprintf(msg, sizeof(msg), "drain %s %s %s", r->id, gw_replica_has(r, GW_HELD_DRAIN_ADMIN) ? "on" : "off", sh->gw_id);
  sh_publish(sh, msg);
}

/* msg: an opened payload (NUL-terminated) whose envelope says it came from sender. */
int gw_shared_read_drain(const char *msg, const char *self, const char *sender, gw_shared_msg *out) {
  char on[8];
  if (sscanf(msg, "drain %127s %7s %63s", out->id, on, out->from) != 3 || strcmp(out->from, self) == 0) return 0;
  if (strcmp(out->from, sender) != 0 || (strcmp(on, "on") != 0 && strcmp(on, "off") != 0)) return -1;
  out->on = strcmp(on, "on") == 0;
  return 1;
}

static void remote_drain(gw_shared *sh, const char *msg, const char *sender) {
  gw_shared_msg sm;
  int rc = gw_shared_read_drain(msg, sh->gw_id, sender, &sm);
  if (rc < 0) sh_refused(sh, GW_SEAL_FORMAT, "a drain message", sender);
  if (rc <= 0) return;
  const char *from = sm.from;
  gw_replica *r = gw_registry_find(sh->gw, sm.id);
  if (!r) return;
  const char *old = gw_replica_display_state(r);
  if (gw_replica_held_set(r, GW_HELD_DRAIN_ADMIN, sm.on))
    gw_drains_set(sh->gw, r->id, sm.on != 0); /* this gateway's restarts too */
  gw_replica_set_reason(r, "%s by gateway %s", gw_replica_has(r, GW_HELD_DRAIN_ADMIN) ? "drained" : "enabled",
                        from);
  gw_registry_event(sh->gw, r, old);
  gw_plan_soon(sh->gw);
}

void gw_shared_publish_rates(gw_server *gw, gw_replica *r) {
  gw_shared *sh = gw->shared;
  uint64_t now = uv_now(gw->loop);
  if (!gw_shared_usable(gw) || now < r->shared.rates_shared_ms + 5000) return;
  r->shared.rates_shared_ms = now;
  char k[256], v[64], where[400];
  key(sh, k, sizeof(k), "rates", NULL);
  snprintf(v, sizeof(v), "%.3f %.3f", r->prefill_tps, r->decode_tps);
  snprintf(where, sizeof(where), "%s %s", k, r->id);
  char *sealed = NULL;
  size_t slen = 0;
  if (gw_seal_wrap(&sh->seal, where, pr_clock_wall_ms(), v, strlen(v), &sealed, &slen) < 0) return;
  const char *argv[] = {"HSET", k, r->id, sealed};
  size_t lens[] = {4, strlen(k), strlen(r->id), slen};
  sh_send(sh, CMD_OTHER, NULL, 4, argv, lens);
  free(sealed);
}

/* ---- verdicts on phones' answers (verify.h) -------------------------------------------------- */

void gw_shared_publish_verdict(gw_server *gw, const char *id) {
  gw_shared *sh = gw->shared;
  if (!gw_shared_usable(gw)) return; /* shared when Redis is back (verdicts_reply) */
  cJSON *o = gw->verdict_json ? gw->verdict_json(gw, id) : NULL;
  char *val = o ? cJSON_PrintUnformatted(o) : NULL;
  cJSON_Delete(o);
  if (!val) return;
  char k[256], where[400];
  key(sh, k, sizeof(k), "quarantine", NULL);
  snprintf(where, sizeof(where), "%s %s", k, id);
  char *sealed = NULL;
  size_t slen = 0;
  int rc = gw_seal_wrap(&sh->seal, where, pr_clock_wall_ms(), val, strlen(val), &sealed, &slen);
  free(val);
  if (rc < 0) return;
  const char *argv[] = {"HSET", k, id, sealed};
  size_t lens[] = {4, strlen(k), strlen(id), slen};
  sh_send(sh, CMD_OTHER, NULL, 4, argv, lens);
  free(sealed);
  char msg[256];
  snprintf(msg, sizeof(msg), "verdict %s %s", id, sh->gw_id);
  sh_publish(sh, msg);
}

/* A verdict read from the hash: applied when newer than ours; ours goes back when it is
 * the newer one. 1 when it opened. */
static int verdict_value(gw_shared *sh, const char *id, const char *str, size_t len) {
  char k[256], where[400], from[GW_SEAL_MAX_ID];
  key(sh, k, sizeof(k), "quarantine", NULL);
  snprintf(where, sizeof(where), "%s %s", k, id);
  const char *val;
  size_t vlen;
  if (!sh_unseal(sh, where, 0, SH_VERDICT_MAX_AGE_MS, str, len, &val, &vlen, from)) return 0;
  pr_json_err err;
  cJSON *o = pr_json_parse(val, vlen, 16, &err);
  if (!o) {
    sh_refused(sh, GW_SEAL_FORMAT, "a verdict", from);
    return 0;
  }
  if (sh->gw->apply_verdict && sh->gw->apply_verdict(sh->gw, id, o, from) == 1)
    gw_shared_publish_verdict(sh->gw, id);
  cJSON_Delete(o);
  return 1;
}

static void remote_verdict(gw_shared *sh, const char *msg, const char *sender) {
  char id[128], from[64];
  if (sscanf(msg, "verdict %127s %63s", id, from) != 2 || strcmp(from, sh->gw_id) == 0) return;
  if (strcmp(from, sender) != 0) {
    sh_refused(sh, GW_SEAL_FORMAT, "a verdict message", sender);
    return;
  }
  char k[256];
  key(sh, k, sizeof(k), "quarantine", NULL);
  const char *argv[] = {"HGET", k, id};
  sh_cmd *c = sh_sendv(sh, CMD_VERDICT_GET, NULL, 3, argv);
  if (c) snprintf(c->replica, sizeof(c->replica), "%s", id);
}

typedef struct verdict_seen {
  const redisReply *r;
  gw_shared *sh;
} verdict_seen;

/* A verdict of ours that Redis lacks (decided while it was away, or Redis lost it). */
static void verdict_push_missing(gw_server *gw, const char *id, void *ud) {
  verdict_seen *vs = ud;
  for (size_t i = 0; vs->r && i + 1 < vs->r->elements; i += 2)
    if (vs->r->element[i]->type == REDIS_REPLY_STRING && strcmp(vs->r->element[i]->str, id) == 0) return;
  gw_shared_publish_verdict(gw, id);
}

static void verdicts_reply(gw_shared *sh, const redisReply *r) {
  if (!r || r->type != REDIS_REPLY_ARRAY) return;
  for (size_t i = 0; i + 1 < r->elements; i += 2) {
    const redisReply *f = r->element[i], *v = r->element[i + 1];
    if (f->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING) verdict_value(sh, f->str, v->str, v->len);
  }
  verdict_seen vs = {r, sh};
  if (sh->gw->each_verdict) sh->gw->each_verdict(sh->gw, verdict_push_missing, &vs);
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
  char k[256], from[GW_SEAL_MAX_ID];
  key(sh, k, sizeof(k), "hb:", c->replica);
  const char *val;
  size_t vlen;
  int64_t max_age = (int64_t)(gw->conf->heartbeat_timeout_s * 10 * 1000);
  if (!sh_unseal(sh, k, 0, max_age, r->str, r->len, &val, &vlen, from)) return;
  /* "TS\nFLEETSIG\nKEYSIG\nBODY" (FLEETSIG "-": none), as the phone signed it */
  gw_shared_hb hb;
  gw_heartbeat_msg m;
  if (gw_shared_hb_decode(val, vlen, &hb, &m) < 0) return;
  gw_replica *known = gw_registry_find(gw, c->replica);
  if (!gw_shared_hb_fresh(gw->conf, known ? known->report.last_heartbeat_ts : 0, m.tsv, pr_clock_wall_ms())) return;
  gw_heartbeat_result res;
  if (!gw->apply_heartbeat) return;
  gw->apply_heartbeat(gw, &m, 1, &res);
  if (res.status == 0) res.r->shared.share_div = gw_shared_usable(gw) ? 1 : (int)sh->n_gateways;
  else if (res.status != 202) pr_warn("redis: relayed heartbeat of %s refused: %s", c->replica, res.msg);
}

static void members_reply(gw_shared *sh, const redisReply *r) {
  if (!r || r->type != REDIS_REPLY_ARRAY) return;
  for (size_t i = 0; i < r->elements; i++)
    if (r->element[i]->type == REDIS_REPLY_STRING) hb_get(sh, r->element[i]->str);
}

int gw_shared_read_rates(const char *val, size_t vlen, double *pre, double *dec) {
  char num[64];
  if (vlen >= sizeof(num)) return -1;
  memcpy(num, val, vlen);
  num[vlen] = '\0';
  return sscanf(num, "%lf %lf", pre, dec) == 2 ? 0 : -1;
}

static void rates_reply(gw_shared *sh, const redisReply *r) {
  if (!r || r->type != REDIS_REPLY_ARRAY) return;
  char k[256];
  key(sh, k, sizeof(k), "rates", NULL);
  for (size_t i = 0; i + 1 < r->elements; i += 2) {
    const redisReply *f = r->element[i], *v = r->element[i + 1];
    if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) continue;
    gw_replica *rep = gw_registry_find(sh->gw, f->str);
    if (!rep || rep->prefill_samples || rep->decode_samples) continue;
    char where[400], from[GW_SEAL_MAX_ID];
    snprintf(where, sizeof(where), "%s %s", k, f->str);
    const char *val;
    size_t vlen;
    if (!sh_unseal(sh, where, 0, SH_RATES_MAX_AGE_MS, v->str, v->len, &val, &vlen, from)) continue;
    double pre = 0, dec = 0;
    /* another gateway's numbers, or anyone's who holds the key: "inf" and "nan" scan as
     * numbers, so they are bounded like a phone's own (gw_replica_seed_rates) */
    if (gw_shared_read_rates(val, vlen, &pre, &dec) == 0) gw_replica_seed_rates(rep, pre, dec);
  }
}

int gw_shared_read_state(const char *msg, const char *self, const char *sender, gw_shared_msg *out) {
  char st[16];
  int off = 0;
  out->reason = "";
  if (sscanf(msg, "state %127s %15s %63s %n", out->id, st, out->from, &off) < 3) return 0;
  if (strcmp(out->from, self) == 0 || strcmp(st, "down") != 0) return 0;
  if (strcmp(out->from, sender) != 0) return -1;
  if (off) out->reason = msg + off;
  return 1;
}

int gw_shared_take_down(const gw_config *c, gw_replica *r, const gw_shared_msg *m, uint64_t now) {
  if (!r || r->state != GW_REPLICA_READY) return 0;
  char reason[128];
  snprintf(reason, sizeof(reason), "gateway %s: %s", m->from, m->reason);
  gw_replica_take_down(r, now, now + (uint64_t)(c->cooldown_s * 1000), reason, 1);
  return 1;
}

static void remote_state(gw_shared *sh, const char *msg, const char *sender) {
  /* "state ID down GATEWAY REASON" */
  gw_shared_msg sm;
  int rc = gw_shared_read_state(msg, sh->gw_id, sender, &sm);
  if (rc < 0) sh_refused(sh, GW_SEAL_FORMAT, "a state message", sender);
  if (rc <= 0) return;
  gw_replica *r = gw_registry_find(sh->gw, sm.id);
  const char *old = r ? gw_replica_display_state(r) : NULL;
  if (gw_shared_take_down(sh->gw->conf, r, &sm, uv_now(sh->gw->loop))) gw_registry_event(sh->gw, r, old);
}

/* ---- replies, connections, timeouts ------------------------------------------------------------ */

static void on_reply(redisAsyncContext *ac, void *reply, void *priv) {
  (void)ac;
  sh_cmd *c = priv;
  gw_shared *sh = c->sh;
  cmd_unlink(sh, c);
  redisReply *r = reply;
  if (c->kind == CMD_AUTH && r && r->type == REDIS_REPLY_ERROR) {
    /* wrong user or password: as if Redis were unreachable (the tick drops the
     * connection and tries again with back-off); said once until it works */
    if (!sh->auth_told)
      pr_error("redis: AUTH%s%s refused by %s:%d: %s; serving from this gateway's own view",
               sh->username ? " as user " : "", sh->username ? sh->username : "", sh->host, sh->port, r->str);
    sh->auth_told = 1;
    sh->auth_failed = 1;
  } else if (r && r->type == REDIS_REPLY_ERROR && !sh->auth_failed) {
    pr_warn("redis: %s", r->str);
  }
  switch (c->kind) {
    case CMD_LEASE: lease_reply(sh, c, r && r->type != REDIS_REPLY_ERROR ? r : NULL); break;
    case CMD_ADMIT: admit_reply(sh, c, r && r->type != REDIS_REPLY_ERROR ? r : NULL); break;
    case CMD_PING:
      if (r && r->type == REDIS_REPLY_STATUS && !sh->ready && !sh->stopping) {
        sh->ready = 1;
        sh->auth_told = 0;
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
    case CMD_VERDICT_GET:
      if (r && r->type == REDIS_REPLY_STRING) verdict_value(sh, c->replica, r->str, r->len);
      break;
    case CMD_VERDICTS: verdicts_reply(sh, r); break;
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
  char chan[256], from[GW_SEAL_MAX_ID], msg[600];
  key(sh, chan, sizeof(chan), "events", NULL);
  const char *payload;
  size_t plen;
  if (!sh_unseal(sh, chan, 1, 0, r->element[2]->str, r->element[2]->len, &payload, &plen, from)) return;
  if (plen >= sizeof(msg) || memchr(payload, '\0', plen)) {
    sh_refused(sh, GW_SEAL_FORMAT, "a message", from);
    return;
  }
  memcpy(msg, payload, plen);
  msg[plen] = '\0';
  if (strncmp(msg, "hb ", 3) == 0 && gw_shared_usable(sh->gw)) hb_get(sh, msg + 3);
  else if (strncmp(msg, "state ", 6) == 0) remote_state(sh, msg, from);
  else if (strncmp(msg, "drain ", 6) == 0) remote_drain(sh, msg, from);
  else if (strncmp(msg, "verdict ", 8) == 0 && gw_shared_usable(sh->gw)) remote_verdict(sh, msg, from);
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
  /* AUTH goes first; hiredis sends in order, so nothing runs before it is decided */
  if (sh->password) {
    const char *a[] = {"AUTH", sh->username ? sh->username : sh->password, sh->password};
    sh_sendv(sh, CMD_AUTH, NULL, sh->username ? 3 : 2, a);
  }
  if (sh->db) {
    const char *a[] = {"SELECT", db};
    sh_sendv(sh, CMD_OTHER, NULL, 2, a);
  }
  const char *ping[] = {"PING"};
  sh_sendv(sh, CMD_PING, NULL, 1, ping);
  sh->sub = sh_open(sh);
  if (sh->sub) {
    if (sh->password) {
      const char *a[] = {"AUTH", sh->username ? sh->username : sh->password, sh->password};
      size_t l[] = {4, strlen(a[1]), strlen(sh->password)};
      redisAsyncCommandArgv(sh->sub, NULL, NULL, sh->username ? 3 : 2, a, l);
    }
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
  key(sh, k, sizeof(k), "quarantine", NULL);
  const char *a3[] = {"HGETALL", k};
  sh_sendv(sh, CMD_VERDICTS, NULL, 2, a3);
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
  if (sh->auth_failed) {
    sh->auth_failed = 0;
    if (sh->ac) {
      sh_drop(sh, "AUTH refused");
      return;
    }
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
  sh->username = c->redis_username ? strdup(c->redis_username) : NULL;
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
  /* the config requires the key with a redis section and checks the id */
  int rc = gw_seal_init(&sh->seal, c->redis_key ? c->redis_key : "", sh->gw_id, c->redis_window_s);
  if (rc < 0) {
    pr_error("redis: cannot seal messages: %s", c->redis_key ? "bad gateway id" : "no redis.key_env key");
    free(sh->host);
    free(sh->password);
    free(sh->username);
    free(sh->prefix);
    free(sh);
    return rc;
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
  if (sh->password) OPENSSL_cleanse(sh->password, strlen(sh->password));
  free(sh->password);
  free(sh->username);
  free(sh->prefix);
  gw_seal_free(&sh->seal);
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
             strcmp(sh->prefix, c->redis_prefix ? c->redis_prefix : "fleetgate:") == 0 &&
             !strcmp(sh->username ? sh->username : "", c->redis_username ? c->redis_username : "") &&
             !strcmp(sh->password ? sh->password : "", c->redis_password ? c->redis_password : "") &&
             c->redis_key && sh->seal.key_len == strlen(c->redis_key) &&
             CRYPTO_memcmp(sh->seal.key, c->redis_key, sh->seal.key_len) == 0;
  if (same) {
    sh->timeout_s = c->redis_timeout_s;
    sh->lease_ttl_s = c->lease_ttl_s;
    sh->seal.window_ms = (int64_t)(c->redis_window_s * 1000);
    return;
  }
  if (sh) gw_shared_stop(gw);
  if (c->redis_host) gw_shared_start(gw);
  else for (size_t i = 0; i < gw->n_replicas; i++) gw->replicas[i]->shared.share_div = 1;
}
