/* fleetgate-agent: the daemon beside the LLM server on each phone. It fronts the engine
 * (llama-server started or attached, MNN, any OpenAI-compatible server, or the built-in
 * simulated phone), lets only the gateway in, reports load, speed and device state, and
 * sends signed heartbeats. This file reads the settings, wires the modules together on
 * one loop and stops them all on SIGTERM/SIGINT. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/crypto.h>
#include <uv.h>

#include "conf.h"
#include "curlm.h"
#include "device.h"
#include "engine.h"
#include "err.h"
#include "faults.h"
#include "fetch.h"
#include "front.h"
#include "hb.h"
#include "hold.h"
#include "idkey.h"
#include "log.h"
#include "noinit.h"
#include "report.h"
#include "sim.h"
#include "simphones.h"
#include "swap.h"
#include "tunnel.h"

#define EXIT_USAGE 2
/* The phone cannot hold its model (hold.h): the deployment should not start it again. */
#define EXIT_CANNOT_HOLD 3
#define EXIT_HOLD_INSTEAD 4 /* it cannot, and the gateway named a model it can (stdout) */
/* Acurast mainnet's relay and domain (canary: relay-2.canary.acurast.com:4433, canary.acu.run) */
#define AG_TUNNEL_RELAY "relay-1.mainnet.acurast.com:4433"
#define AG_TUNNEL_DOMAIN "acu.run"

PR_SKIP_GNUTLS_INIT

typedef struct ag_main ag_main;

/* One simulated phone of this process (--engine sim: one, or the --phones it hosts): its
 * sim, its heartbeats and what they and its status report. An element of ag_main's
 * array; the sim, the heartbeats and the key are owned here. */
typedef struct ag_phone {
  ag_main *m;
  ag_sim *sim;
  ag_hb *hb;
  pr_idkey *key;            /* a hosted phone's own identity key; NULL: the process's */
  ag_device_cache own_device; /* a hosted phone's own sysfs_root readings */
  char *sysfs_root;         /* owned: own_device's root */
  ag_device_cache *device;  /* &own_device, or the process's */
  char id[80];
  double cost_per_day;      /* sent in heartbeats; < 0: not given */
  int draining;             /* the gateway asked it to drain */
} ag_phone;

/* The process: its loop and every module on it. Lives on main's stack; the modules are
 * owned here and freed after the loop ends. */
struct ag_main {
  uv_loop_t *loop;
  const char *engine_name;
  char id[80];
  ag_device_cache device;   /* readings below --sysfs-root, redone every few seconds */
  uint64_t start_ns;
  double cost_per_day;      /* --cost-per-day, sent in heartbeats; < 0: not given */
  const char *labels;       /* --label pairs as a JSON object, sent in heartbeats; NULL: none */
  ag_rates rates;           /* the real engines' measured rates (the sim keeps its own) */
  ag_phone *phones;         /* --engine sim: n_phones of them (owned); else NULL */
  size_t n_phones;
  ag_engine *engine;
  ag_front *front;
  ag_swap *swap;            /* switches the started llama-server's model (swap.h); NULL: none */
  ag_hb *hb;                /* a real engine's heartbeats (a sim phone has its own) */
  pr_idkey *key;            /* the identity key the heartbeats sign with */
  pr_curlm *curlm;
  ag_tunnel *tunnel;        /* --tunnel: names the public URL; NULL: none */
  ag_hold *hold;            /* the models folder watched (hold.h); NULL: none known */
  char *model_label;        /* the model's name and file, said while the engine loads it */
  char *model_file;
  const char *unfit;        /* a one-shot report that the phone cannot hold its model */
  double unfit_storage_mb;  /* the models folder's free storage it found (< 0 unknown) */
  const char *unfit_dir;
  const char *unfit_model;
  char *instead;            /* the gateway's model to run instead, as FG_ lines (owned) */
  uv_signal_t sigterm, sigint;
  int stopping;
  int pending;              /* modules still stopping */
};


static int parse_double(const char *opt, const char *v, double *out) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (errno || end == v || *end != '\0' || !isfinite(d)) {
    fprintf(stderr, "fleetgate-agent: %s: not a number: '%s'\n", opt, v);
    return -EINVAL;
  }
  *out = d;
  return 0;
}

static int parse_int(const char *opt, const char *v, int64_t *out) {
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (errno || end == v || *end != '\0') {
    fprintf(stderr, "fleetgate-agent: %s: not an integer: '%s'\n", opt, v);
    return -EINVAL;
  }
  *out = (int64_t)n;
  return 0;
}

/* The agent's secrets, taken out of the environment first thing in main so that no
 * process it starts inherits them (ag_secrets_take); read through secret(). */
static ag_secrets secrets;

static const char *secret(const char *name) { return ag_secrets_get(&secrets, name); }

static const char *env_get(const char *name) {
  const char *v = secret(name);
  return v ? v : getenv(name);
}

static int valid_url(const char *u) {
  return u && (strncmp(u, "http://", 7) == 0 || strncmp(u, "https://", 8) == 0) && strlen(u) < 1024;
}

/* ---- reports ------------------------------------------------------------------------ */

static double uptime_s(const ag_main *m) { return (double)(uv_hrtime() - m->start_ns) / 1e9; }

static void report_sim(void *ud, ag_report *r) {
  ag_phone *ph = ud;
  ag_main *m = ph->m;
  ag_sim_stats st;
  ag_sim_get_stats(ph->sim, &st);
  r->id = ph->id;
  r->engine = "sim";
  r->engine_state = st.down ? "down" : st.loading ? "loading" : "ready";
  r->draining = ph->draining;
  r->slots = st.slots;
  r->busy = st.busy;
  r->queued = st.deferred;
  r->n_ctx = st.n_ctx;
  r->models[0] = st.model;
  r->n_models = 1;
  r->rates = st.rates;
  ag_device_get(ph->device, uv_now(m->loop), AG_DEVICE_CACHE_MS, &r->device);
  r->uptime_s = uptime_s(m);
  r->requests = st.requests;
  r->cache_isolation = st.cache_isolation;
  r->engine_build = st.build;
  r->features_known = 1;
  r->features = st.features;
  r->choices_max = st.choices_max;
  r->n_running = ag_sim_running(ph->sim, r->running, AG_REPORT_MAX_SLOTS);
  r->cost_per_day = ph->cost_per_day;
  r->labels = m->labels;
  if (m->hold) ag_hold_fill_report(m->hold, r);
  if (st.storage_free_mb >= 0) { /* its simulated folder's (--sim-storage-free-mb) */
    r->storage_free_mb = st.storage_free_mb;
    r->storage_said = 1;
  }
  if (st.loading) r->loading_model = st.model;
  r->can_switch = 1;
  ag_sim_switch_get(ph->sim, &r->switch_to, &r->switch_phase, &r->switch_why);
}

static void report_engine(void *ud, ag_report *r) {
  ag_main *m = ud;
  r->id = m->id;
  ag_engine_fill_report(m->engine, r);
  r->draining = ag_front_draining(m->front);
  int inflight = ag_front_inflight(m->front);
  r->busy = inflight < r->slots ? inflight : r->slots;
  r->queued = inflight - r->busy;
  r->rates = m->rates;
  ag_device_get(&m->device, uv_now(m->loop), AG_DEVICE_CACHE_MS, &r->device);
  r->uptime_s = uptime_s(m);
  r->requests = ag_front_requests(m->front);
  r->cost_per_day = m->cost_per_day;
  r->labels = m->labels;
  r->n_running = ag_front_running(m->front, r->running, AG_REPORT_MAX_SLOTS);
  if (m->hold) ag_hold_fill_report(m->hold, r);
  if (ag_engine_get_state(m->engine) == AG_ENGINE_LOADING) {
    r->loading_model = m->model_label;
    r->loading_file = m->model_file;
  }
  if (m->swap) {
    r->can_switch = 1;
    ag_swap_get(m->swap, &r->switch_to, &r->switch_phase, &r->switch_why);
    if (r->switch_to && ag_engine_get_state(m->engine) == AG_ENGINE_LOADING) {
      r->loading_model = ag_engine_model(m->engine);
      r->loading_file = NULL;
    }
  }
}

/* The one report of a phone that cannot hold its model (--hold-check, or a check at start):
 * no URL, no engine; the gateway lists it with the refused registrations. */
static void report_unfit(void *ud, ag_report *r) {
  ag_main *m = ud;
  r->id = m->id;
  r->engine = m->engine_name ? m->engine_name : "none";
  r->engine_state = "down";
  r->slots = 1;
  r->models[0] = m->unfit_model;
  r->n_models = 1;
  ag_device_get(&m->device, uv_now(m->loop), AG_DEVICE_CACHE_MS, &r->device);
  r->uptime_s = uptime_s(m);
  r->cost_per_day = m->cost_per_day;
  r->labels = m->labels;
  r->models_dir = m->unfit_dir;
  r->storage_free_mb = m->unfit_storage_mb;
  r->unfit = m->unfit;
}

/* GET /agent/v1/status on the sim's own server (ud: its ag_phone). */
static int sim_route(pr_http_req *req, void *ud) {
  if (strcmp(req->path, "/agent/v1/status") != 0) return 0;
  if (strcmp(req->method, "GET") != 0) return 0;
  ag_report r;
  memset(&r, 0, sizeof(r));
  report_sim(ud, &r);
  pr_buf b;
  pr_buf_init(&b, (size_t)1 << 20);
  int rc = ag_report_status_json(&r, &b);
  static const char err[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
  const char *hdrs[] = {"Cache-Control: no-store", NULL};
  if (rc < 0) pr_http_respond(req, 500, NULL, "application/json", err, sizeof(err) - 1);
  else pr_http_respond(req, 200, hdrs, "application/json", b.data, b.len);
  pr_buf_free(&b);
  return 1;
}

static void on_drain(void *ud, int drain) {
  ag_main *m = ud;
  if (m->swap) ag_swap_gateway_drain(m->swap, drain);
  else if (m->front) ag_front_set_draining(m->front, drain);
}

/* The gateway's placement for a started llama-server (swap.h). */
static void on_place(void *ud, const ag_place *p) {
  ag_main *m = ud;
  if (m->swap) ag_swap_place(m->swap, p);
}

/* A switch the gateway asks of the started llama-server: can this phone hold it? */
static int swap_fits(void *ud, const ag_place *p, char *why, size_t n) {
  ag_main *m = ud;
  if (!m->hold) return 1;
  ag_device d;
  ag_device_get(&m->device, uv_now(m->loop), AG_DEVICE_CACHE_MS, &d);
  int ok = ag_hold_switch_check(m->hold, p->model, p->size_bytes > 0 ? (uint64_t)p->size_bytes : 0, p->mem_mb,
                                p->sha256, d.mem_total_mb, why, n);
  if (ok) pr_info("switch: %s", why);
  return ok;
}

static void on_swap_changed(void *ud) {
  ag_main *m = ud;
  if (m->hb) ag_hb_kick(m->hb);
}

static void on_token(void *ud, const char *token) {
  ag_main *m = ud;
  if (m->front) ag_front_set_issued_token(m->front, token);
}

/* A sim phone's heartbeats: the gateway's word is for that phone alone. */
static void phone_on_drain(void *ud, int drain) {
  ag_phone *ph = ud;
  ph->draining = drain;
  ag_sim_set_draining(ph->sim, drain);
}

/* The gateway's placement for this phone: the sim switches models (sim.h). */
static void phone_on_place(void *ud, const ag_place *p) {
  ag_phone *ph = ud;
  const char *to0, *ph0, *why0;
  ag_sim_switch_get(ph->sim, &to0, &ph0, &why0);
  if (!p) {
    ag_sim_place_set(ph->sim, NULL);
  } else {
    ag_device d; /* its memory: a switch it cannot hold is refused */
    ag_device_get(ph->device, uv_now(ph->m->loop), AG_DEVICE_CACHE_MS, &d);
    ag_sim_place sp = {p->model, p->url, p->sha256, p->size_bytes, p->mem_mb, d.mem_total_mb};
    ag_sim_place_set(ph->sim, &sp);
  }
  const char *to1, *ph1, *why1;
  ag_sim_switch_get(ph->sim, &to1, &ph1, &why1);
  if (ph1 != ph0) ag_hb_kick(ph->hb); /* tell the gateway at once */
}

static void phone_on_token(void *ud, const char *token) {
  ag_phone *ph = ud;
  ag_sim_set_issued_token(ph->sim, token);
}

static void on_engine_state(void *ud, ag_engine_state st) {
  ag_main *m = ud;
  if (m->swap) ag_swap_engine_state(m->swap, st);
  if (m->hb) ag_hb_kick(m->hb); /* tell the gateway at once */
}

/* ---- stopping ------------------------------------------------------------------------ */

static void on_curlm_closed(void *arg) {
  ag_main *m = arg;
  m->curlm = NULL;
}

static void one_stopped(void *arg) {
  ag_main *m = arg;
  if (--m->pending > 0) return;
  /* every user of the multi is gone: close it, then the signals, and the loop ends */
  if (m->curlm) pr_curlm_close(m->curlm, on_curlm_closed, m);
  uv_close((uv_handle_t *)&m->sigterm, NULL);
  uv_close((uv_handle_t *)&m->sigint, NULL);
}

static void on_sim_stopped(ag_sim *sim, void *ud) {
  (void)sim;
  one_stopped(ud);
}

static void stop_all(ag_main *m) {
  if (m->stopping) return;
  m->stopping = 1;
  m->pending = 1; /* held until every stop below was started */
  if (m->hb) {
    m->pending++;
    ag_hb_stop(m->hb, one_stopped, m);
  }
  if (m->tunnel) {
    m->pending++;
    ag_tunnel_stop(m->tunnel, one_stopped, m);
  }
  if (m->hold) {
    m->pending++;
    ag_hold_stop(m->hold, one_stopped, m);
  }
  for (size_t i = 0; i < m->n_phones; i++) {
    ag_phone *ph = &m->phones[i];
    if (ph->hb) {
      m->pending++;
      ag_hb_stop(ph->hb, one_stopped, m);
    }
    if (ph->sim) {
      m->pending++;
      ag_sim_stop(ph->sim, on_sim_stopped, m);
    }
  }
  if (m->front) {
    m->pending++;
    ag_front_stop(m->front, one_stopped, m);
  }
  if (m->swap) {
    m->pending++;
    ag_swap_stop(m->swap, one_stopped, m);
  }
  if (m->engine) {
    m->pending++;
    ag_engine_stop(m->engine, one_stopped, m);
  }
  one_stopped(m);
}

static void on_signal(uv_signal_t *h, int signum) {
  ag_main *m = h->data;
  if (m->stopping) return;
  pr_info("signal %d: stopping", signum);
  stop_all(m);
}


/* ---- the command line ----------------------------------------------------------------
 * One table lists every option: getopt_long's list is built from it and --help prints
 * it part by part, so no option is accepted without being documented. */

enum {
  OPT_ENGINE = 256, OPT_LISTEN, OPT_MODEL, OPT_SLOTS, OPT_PREFILL, OPT_DECODE, OPT_NCTX,
  OPT_SCALE, OPT_LOADING, OPT_FAULTS, OPT_ID, OPT_GATEWAY, OPT_PUBLIC_URL, OPT_LOG_LEVEL,
  OPT_VERSION, OPT_HELP, OPT_CONFIG, OPT_UPSTREAM, OPT_ENGINE_CMD, OPT_ENGINE_ARG, OPT_MEASURE,
  OPT_TUNE, OPT_THREADS_ARG, OPT_INSECURE, OPT_FLAVOUR, OPT_THREADS, OPT_GATEWAY_CA, OPT_KEY_FILE,
  OPT_PRINT_KEY, OPT_TUNNEL, OPT_TUNNEL_RELAY, OPT_TUNNEL_DOMAIN, OPT_SYSFS_ROOT, OPT_COST, OPT_LABEL,
  OPT_SIM_RELEASE, OPT_THINKING, OPT_CACHE_MODE, OPT_CTX_CHECKPOINTS, OPT_CHECKPOINT_MIN_STEP, OPT_CACHE_RAM,
  OPT_PHONES, OPT_PHONES_FILE, OPT_PORTS_FILE,
  OPT_MODELS_DIR, OPT_MODEL_FILE, OPT_MODEL_BYTES, OPT_NEED_MEM, OPT_HOLD_CHECK,
  OPT_SIM_LOAD_MB_S, OPT_SIM_FETCH_MB_S, OPT_SIM_CORRUPT, OPT_SIM_STORAGE,
};

/* The parts of --help that list options. */
enum { HELP_NONE, HELP_COMMON, HELP_ENGINE, HELP_SIM, HELP_PARTS };

typedef struct ag_opt {
  const char *name;  /* without "--"; NULL: a line of --help only */
  const char *arg;   /* the value's name in --help; NULL: the option takes none */
  int id;
  int part;          /* where --help lists it; HELP_NONE: said elsewhere in the text */
  const char *usage; /* the left column, when it is not "--name ARG" */
  const char *help;  /* the right column; '\n' starts a continuation line */
} ag_opt;

static const ag_opt options[] = {
  {"engine", "ENGINE", OPT_ENGINE, HELP_NONE, NULL, NULL}, /* in the usage line */
  {"listen", "HOST:PORT", OPT_LISTEN, HELP_COMMON, NULL, "where to serve (port 0: any free port)"},
  {"id", "ID", OPT_ID, HELP_COMMON, NULL, "replica id (default sim-PORT / agent-PORT)"},
  {"model", "NAME", OPT_MODEL, HELP_COMMON, NULL, "model name to report (sim: required)"},
  {"gateway", "URL", OPT_GATEWAY, HELP_COMMON, NULL,
   "send signed heartbeats to this gateway (with --public-url or --tunnel)"},
  {"public-url", "URL", OPT_PUBLIC_URL, HELP_COMMON, NULL, "the URL the gateway reaches this agent at"},
  {"tunnel", "acurast", OPT_TUNNEL, HELP_COMMON, NULL,
   "open an Acurast tunnel on $BRIDGE_SOCKET and heartbeat its URL\n(instead of --public-url)"},
  {"tunnel-relay", "HOST:PORT", OPT_TUNNEL_RELAY, HELP_COMMON, NULL,
   "the tunnel's relay (repeat; default " AG_TUNNEL_RELAY ")"},
  {"tunnel-domain", "SUFFIX", OPT_TUNNEL_DOMAIN, HELP_COMMON, NULL,
   "the tunnel's domain (default " AG_TUNNEL_DOMAIN ")"},
  {"gateway-ca", "FILE", OPT_GATEWAY_CA, HELP_COMMON, NULL,
   "PEM certificates that verify an https gateway (default:\nthe system's trust store)"},
  {"key-file", "FILE", OPT_KEY_FILE, HELP_COMMON, NULL,
   "this phone's identity key (Ed25519, PEM); created on first use. Without it (or\n"
   "FLEETGATE_AGENT_KEY) a new key is made at each start"},
  {"print-key", NULL, OPT_PRINT_KEY, HELP_COMMON, NULL,
   "print the public key (for a replica file's \"key\") and exit"},
  {"cost-per-day", "X", OPT_COST, HELP_COMMON, NULL,
   "what this phone costs per day (in the gateway's costs.currency), sent in heartbeats"},
  {"label", "NAME=VALUE", OPT_LABEL, HELP_COMMON, NULL,
   "a label of this phone, sent in heartbeats (placement's models[].labels,\ncapacity's class); "
   "repeat for more (16 at most)"},
  {"log-level", "LEVEL", OPT_LOG_LEVEL, HELP_COMMON, NULL, "debug, info, warn or error (default info)"},
  {"models-dir", "DIR", OPT_MODELS_DIR, HELP_COMMON, NULL,
   "where model files live: each is reported with its SHA-256, and the\nfolder's free storage "
   "(default: the folder of the model file)"},
  {"model-file", "PATH", OPT_MODEL_FILE, HELP_COMMON, NULL,
   "the model file this phone runs (default: the engine's -m)"},
  {"model-bytes", "N", OPT_MODEL_BYTES, HELP_COMMON, NULL,
   "its size: memory and storage are checked against it at start,\nbefore it is downloaded "
   "with --hold-check (docs/agent.md)"},
  {"need-mem-mb", "N", OPT_NEED_MEM, HELP_COMMON, NULL,
   "memory the model needs (default: its size + 20 % + 512 MiB)"},
  {"hold-check", NULL, OPT_HOLD_CHECK, HELP_COMMON, NULL,
   "check that this phone can hold the model and exit: 0 it can,\n3 it cannot (said to --gateway, "
   "listed with its refused\nregistrations), 4 it cannot and the gateway's placement names\na model "
   "it can (printed as FG_MODEL=... lines)"},
  {"sysfs-root", "DIR", OPT_SYSFS_ROOT, HELP_COMMON, NULL,
   "read battery, temperature, CPU clocks and memory below\nDIR/sys and DIR/proc (default /; also\nFLEETGATE_AGENT_SYSROOT)"},
  {"version", NULL, OPT_VERSION, HELP_COMMON, "--version, --help", NULL},
  {"help", NULL, OPT_HELP, HELP_NONE, NULL, NULL}, /* listed with --version */

  {"config", "FILE", OPT_CONFIG, HELP_ENGINE, NULL,
   "JSON settings (see docs/agent.md); also FLEETGATE_AGENT_CONFIG"},
  {"upstream", "URL", OPT_UPSTREAM, HELP_ENGINE, NULL,
   "the engine's HTTP address (llama started by the agent:\ndefault http://127.0.0.1:8080)"},
  {"engine-command", "PATH", OPT_ENGINE_CMD, HELP_ENGINE, NULL,
   "program to start (llama); also FLEETGATE_ENGINE_COMMAND"},
  {"engine-arg", "ARG", OPT_ENGINE_ARG, HELP_ENGINE, NULL,
   "one argument for it (repeat); also FLEETGATE_ENGINE_ARGS"},
  {NULL, NULL, 0, HELP_ENGINE, "--slots N, --n-ctx N", "override what the engine reports (mnn: 1 slot)"},
  {"measure", NULL, OPT_MEASURE, HELP_ENGINE, NULL, "measure the engine's rates with a short prompt at start"},
  {"tune-threads", "LIST", OPT_TUNE, HELP_ENGINE, NULL,
   "llama: try these thread counts (\"2,4,6\") and keep the fastest"},
  {"threads-arg", "OPT", OPT_THREADS_ARG, HELP_ENGINE, NULL, "the engine's thread option (default --threads)"},
  {"insecure-private-network", NULL, OPT_INSECURE, HELP_ENGINE, NULL,
   "serve without a replica token (only on a private network)"},

  {"slots", "N", OPT_SLOTS, HELP_SIM, NULL, "requests generated at once (default 1); more wait in a FIFO"},
  {"prefill-tps", "X", OPT_PREFILL, HELP_SIM, NULL, "prompt tokens read per second, per slot (default 100)"},
  {"decode-tps", "Y", OPT_DECODE, HELP_SIM, NULL, "tokens generated per second, per slot (default 10)"},
  {"n-ctx", "N", OPT_NCTX, HELP_SIM, NULL, "context size of each slot in tokens (default 4096)"},
  {"time-scale", "K", OPT_SCALE, HELP_SIM, NULL, "run K times faster than real time (default 1)"},
  {"loading-s", "S", OPT_LOADING, HELP_SIM, NULL, "answer 503 \"Loading model\" for S seconds after start"},
  {"fault-plan", "FILE", OPT_FAULTS, HELP_SIM, NULL, "misbehave as FILE says (docs/sim.md)"},
  {"flavour", "llama|mnn", OPT_FLAVOUR, HELP_SIM, NULL, "imitate llama-server (default) or MNN's quirks"},
  {"sim-release", "2025|2026", OPT_SIM_RELEASE, HELP_SIM, NULL,
   "answer like llama-server of Feb 2025 or Aug 2026 (b10587, default)"},
  {"thinking", NULL, OPT_THINKING, HELP_SIM, NULL,
   "a thinking model: chat text is reasoning_content unless a request\nturns it off (chat_template_kwargs enable_thinking false)"},
  {"cache-mode", "full|hybrid", OPT_CACHE_MODE, HELP_SIM, NULL,
   "prompt reuse of a transformer (default) or of a hybrid model,\nup to llama-server's context checkpoints (needs 2026)"},
  {"ctx-checkpoints", "N", OPT_CTX_CHECKPOINTS, HELP_SIM, NULL, "hybrid: checkpoints kept per slot (default 32)"},
  {"checkpoint-min-step", "N", OPT_CHECKPOINT_MIN_STEP, HELP_SIM, NULL,
   "hybrid: checkpoint eviction spacing in tokens (default 8192)"},
  {"cache-ram", "N", OPT_CACHE_RAM, HELP_SIM, NULL,
   "tokens the RAM prompt cache holds (2026; default: hybrid 131072,\nfull 0 = off)"},
  {"threads", "N", OPT_THREADS, HELP_SIM, NULL, "accepted for llama-server compatibility, ignored"},
  {"sim-load-mb-s", "N", OPT_SIM_LOAD_MB_S, HELP_SIM, NULL,
   "a switch of models loads N MiB per simulated second (default 200;\nthe model's size from the gateway, "
   "the first's from --model-bytes)"},
  {"sim-fetch-mb-s", "N", OPT_SIM_FETCH_MB_S, HELP_SIM, NULL,
   "a switch downloads a model it does not hold at N MiB/s (default 20)"},
  {"sim-corrupt-download", "MODEL", OPT_SIM_CORRUPT, HELP_SIM, NULL,
   "a download of MODEL fails its digest check (tests a failed switch)"},
  {"sim-storage-free-mb", "N", OPT_SIM_STORAGE, HELP_SIM, NULL,
   "the phone's models folder has N MiB free (said in heartbeats; a switch\nit cannot hold is refused, "
   "a download takes its size; default unknown)"},
  {"phones", "N", OPT_PHONES, HELP_SIM, NULL,
   "host N phones like the one described, each on a port of its own\n(--listen's port + 0..N-1, or free ones "
   "with port 0), ids ID-1..ID-N"},
  {"phones-file", "FILE", OPT_PHONES_FILE, HELP_SIM, NULL,
   "host one phone per entry of FILE, a JSON list of settings\n(id, listen, slots, prefill_tps, decode_tps, n_ctx, "
   "loading_s,\nfault_plan, sysfs_root, cost_per_day) over the command line's"},
  {"ports-file", "FILE", OPT_PORTS_FILE, HELP_SIM, NULL,
   "once every phone listens, write their ids and ports to FILE (JSON)"},
};

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static void usage_option(FILE *fp, const ag_opt *o) {
  char left[64];
  if (o->usage) snprintf(left, sizeof(left), "%s", o->usage);
  else snprintf(left, sizeof(left), "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
  if (!o->help) {
    fprintf(fp, "  %s\n", left);
    return;
  }
  /* the help column starts at 26; a longer left column puts it on the next line */
  if (strlen(left) > 22) fprintf(fp, "  %s\n%26s", left, "");
  else fprintf(fp, "  %-22s  ", left);
  for (const char *p = o->help; *p;) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    fprintf(fp, "%.*s\n", (int)n, p);
    if (!nl) break;
    p = nl + 1;
    fprintf(fp, "%26s", "");
  }
}

static void usage(FILE *fp) {
  static const char *const titles[HELP_PARTS] = {
    [HELP_COMMON] = "Common options:", [HELP_ENGINE] = "Engines llama, openai, mnn:",
    [HELP_SIM] = "Engine sim:",
  };
  fputs("usage: fleetgate-agent --engine ENGINE --listen HOST:PORT [options]\n"
        "       fleetgate-agent fetch [--ca FILE] [--tries N] [--max-bytes N] URL SHA256 OUT\n"
        "                 (download URL to OUT if its SHA-256 matches; see fetch --help)\n"
        "\n"
        "Fronts the phone's LLM server for the fleetgate gateway. ENGINE is one of:\n"
        "  llama     llama.cpp's llama-server: started from the configured command (and\n"
        "            restarted when it dies), or attached to with --upstream URL\n"
        "  openai    any OpenAI-compatible server at --upstream URL\n"
        "  mnn       MNN's server at --upstream URL, normalised to OpenAI's shapes\n"
        "  sim       a simulated phone answering like llama-server (tests, demos)\n", fp);
  for (int part = HELP_COMMON; part < HELP_PARTS; part++) {
    fprintf(fp, "\n%s\n", titles[part]);
    for (size_t i = 0; i < N_OPTIONS; i++)
      if (options[i].part == part) usage_option(fp, &options[i]);
  }
  fputs("\n"
        "Environment: FLEETGATE_REPLICA_TOKEN is the bearer token every caller must present\n"
        "(at least 16 characters, not a placeholder; the sim then also requires it; a real\n"
        "engine refuses to start without it unless --gateway, which names this phone's own\n"
        "token, or --insecure-private-network: exit 2; phones hosted with --phones each take\n"
        "the hex HMAC-SHA256 of their id under it); FLEETGATE_FLEET_SECRET enrols this\n"
        "phone's key with the gateway; FLEETGATE_AGENT_KEY holds the identity key itself\n"
        "(PEM or base64 PKCS#8) instead of --key-file; FLEETGATE_ENGINE_API_KEY is sent to\n"
        "the engine. --tunnel: BRIDGE_SOCKET names the bridge (set by the processor);\n"
        "FLEETGATE_TUNNEL_KEY (base64 PKCS#8 of a P-256 key) keeps the tunnel's URL across\n"
        "restarts (else a new key, and URL, at each start).\n", fp);
}

/* What the command line said; applied over the file and the environment. */
typedef struct cli {
  const char *engine, *listen, *model, *id, *gateway, *public_url, *gateway_ca, *fault_file, *config;
  const char *upstream, *command, *threads_arg, *flavour;
  const char *args[AG_ENGINE_MAX_ARGS];
  size_t n_args;
  int tune[AG_ENGINE_MAX_TUNE];
  size_t n_tune;
  int measure, insecure;
  int slots_set, nctx_set;
  const char *key_file;
  int print_key;
  const char *tunnel, *tunnel_domain;
  const char *relays[AG_TUNRPC_MAX_RELAYS];
  size_t n_relays;
  const char *sysfs_root;
  double cost_per_day;      /* < 0: not given */
  char *labels;             /* --label pairs as a JSON object (owned); NULL: none */
  int n_labels;
  int64_t phones;           /* --phones N; 0: not given */
  const char *phones_file, *ports_file;
  const char *models_dir, *model_file;
  uint64_t model_bytes;     /* 0: not given */
  double need_mem_mb;       /* 0: from the size */
  int hold_check;
} cli;

/* One option's value into o (and the sim's numbers into sc). Returns 0, or -EINVAL when
 * the value is refused (said on stderr). */
static int cli_option(cli *o, ag_sim_config *sc, int id, const char *name, const char *val) {
  int64_t n;
  switch (id) {
    case OPT_ENGINE: o->engine = val; return 0;
    case OPT_LISTEN: o->listen = val; return 0;
    case OPT_MODEL: o->model = val; return 0;
    case OPT_SLOTS:
      /* ag_sim_config_check reports the range; keep out-of-int values out of it. */
      o->slots_set = 1;
      if (parse_int(name, val, &n) < 0) return -EINVAL;
      sc->slots = n < 0 ? -1 : n > 1000000 ? 1000000 : (int)n;
      return 0;
    case OPT_PREFILL: return parse_double(name, val, &sc->prefill_tps);
    case OPT_DECODE: return parse_double(name, val, &sc->decode_tps);
    case OPT_NCTX: o->nctx_set = 1; return parse_int(name, val, &sc->n_ctx);
    case OPT_SCALE: return parse_double(name, val, &sc->time_scale);
    case OPT_LOADING: return parse_double(name, val, &sc->loading_s);
    case OPT_FAULTS: o->fault_file = val; return 0;
    case OPT_ID: o->id = val; return 0;
    case OPT_GATEWAY: o->gateway = val; return 0;
    case OPT_PUBLIC_URL: o->public_url = val; return 0;
    case OPT_GATEWAY_CA: o->gateway_ca = val; return 0;
    case OPT_KEY_FILE: o->key_file = val; return 0;
    case OPT_PRINT_KEY: o->print_key = 1; return 0;
    case OPT_TUNNEL: o->tunnel = val; return 0;
    case OPT_TUNNEL_DOMAIN: o->tunnel_domain = val; return 0;
    case OPT_TUNNEL_RELAY:
      if (o->n_relays >= AG_TUNRPC_MAX_RELAYS || ag_tunrpc_check_relay(val) < 0) {
        fprintf(stderr, "fleetgate-agent: --tunnel-relay: expected HOST:PORT (at most %d): '%s'\n",
                AG_TUNRPC_MAX_RELAYS, val);
        return -EINVAL;
      }
      o->relays[o->n_relays++] = val;
      return 0;
    case OPT_SYSFS_ROOT: {
      struct stat sb;
      if (stat(val, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "fleetgate-agent: --sysfs-root: not a directory: '%s'\n", val);
        return -EINVAL;
      }
      o->sysfs_root = val;
      return 0;
    }
    case OPT_MODELS_DIR: o->models_dir = val; return 0;
    case OPT_MODEL_FILE: o->model_file = val; return 0;
    case OPT_MODEL_BYTES:
      if (parse_int(name, val, &n) < 0) return -EINVAL;
      if (n < 1 || n > (INT64_C(1) << 50)) {
        fprintf(stderr, "fleetgate-agent: --model-bytes: expected 1 to 2^50: '%s'\n", val);
        return -EINVAL;
      }
      o->model_bytes = (uint64_t)n;
      return 0;
    case OPT_NEED_MEM:
      if (parse_double(name, val, &o->need_mem_mb) < 0) return -EINVAL;
      if (o->need_mem_mb < 1 || o->need_mem_mb > 1e8) {
        fprintf(stderr, "fleetgate-agent: --need-mem-mb: expected 1 to 1e8: '%s'\n", val);
        return -EINVAL;
      }
      return 0;
    case OPT_HOLD_CHECK: o->hold_check = 1; return 0;
    case OPT_LABEL: {
      const char *eq = strchr(val, '=');
      char lname[65];
      size_t nl = eq ? (size_t)(eq - val) : 0;
      int ok = eq && nl >= 1 && nl <= 64 && strlen(eq + 1) >= 1 && strlen(eq + 1) <= 128 && o->n_labels < 16;
      for (size_t i = 0; ok && i < nl; i++)
        ok = (val[i] >= 'a' && val[i] <= 'z') || (val[i] >= 'A' && val[i] <= 'Z') ||
             (val[i] >= '0' && val[i] <= '9') || val[i] == '.' || val[i] == '_' || val[i] == '-';
      for (const char *p = eq ? eq + 1 : ""; ok && *p; p++) ok = *p >= ' ' && *p <= '~';
      if (!ok) {
        fprintf(stderr, "fleetgate-agent: --label: expected NAME=VALUE, NAME 1-64 of [A-Za-z0-9._-], VALUE "
                        "1-128 visible ASCII characters, 16 labels at most: '%s'\n", val);
        return -EINVAL;
      }
      memcpy(lname, val, nl);
      lname[nl] = '\0';
      cJSON *l = o->labels ? cJSON_Parse(o->labels) : cJSON_CreateObject();
      if (l) cJSON_DeleteItemFromObjectCaseSensitive(l, lname);
      char *js = l && cJSON_AddStringToObject(l, lname, eq + 1) ? cJSON_PrintUnformatted(l) : NULL;
      cJSON_Delete(l);
      if (!js) return -ENOMEM;
      free(o->labels);
      o->labels = js;
      o->n_labels++;
      return 0;
    }
    case OPT_COST:
      if (parse_double(name, val, &o->cost_per_day) < 0) return -EINVAL;
      if (o->cost_per_day < 0 || o->cost_per_day > 1e9) {
        fprintf(stderr, "fleetgate-agent: --cost-per-day: expected 0 to 1e9: '%s'\n", val);
        return -EINVAL;
      }
      return 0;
    case OPT_LOG_LEVEL: {
      int level = pr_log_level_from_name(val);
      if (level < 0) {
        fprintf(stderr, "fleetgate-agent: --log-level: expected debug, info, warn or error\n");
        return -EINVAL;
      }
      pr_log_set_level(level);
      return 0;
    }
    case OPT_CONFIG: o->config = val; return 0;
    case OPT_UPSTREAM: o->upstream = val; return 0;
    case OPT_ENGINE_CMD: o->command = val; return 0;
    case OPT_ENGINE_ARG:
      if (o->n_args >= AG_ENGINE_MAX_ARGS) {
        fprintf(stderr, "fleetgate-agent: more than %d --engine-arg\n", AG_ENGINE_MAX_ARGS);
        return -EINVAL;
      }
      o->args[o->n_args++] = val;
      return 0;
    case OPT_MEASURE: o->measure = 1; return 0;
    case OPT_TUNE:
      if (ag_conf_parse_threads(val, o->tune, &o->n_tune) < 0) {
        fprintf(stderr, "fleetgate-agent: --tune-threads: expected a list like 2,4,6 (1 - 1024 each, "
                        "at most %d)\n", AG_ENGINE_MAX_TUNE);
        return -EINVAL;
      }
      return 0;
    case OPT_THREADS_ARG: o->threads_arg = val; return 0;
    case OPT_INSECURE: o->insecure = 1; return 0;
    case OPT_FLAVOUR: o->flavour = val; return 0;
    case OPT_SIM_RELEASE:
      if (strcmp(val, "2025") != 0 && strcmp(val, "2026") != 0) {
        fprintf(stderr, "fleetgate-agent: --sim-release: expected 2025 or 2026\n");
        return -EINVAL;
      }
      sc->release = val[3] == '5' ? AG_SIM_RELEASE_2025 : AG_SIM_RELEASE_2026;
      return 0;
    case OPT_THINKING: sc->thinking = 1; return 0;
    case OPT_CACHE_MODE:
      if (strcmp(val, "full") != 0 && strcmp(val, "hybrid") != 0) {
        fprintf(stderr, "fleetgate-agent: --cache-mode: expected full or hybrid\n");
        return -EINVAL;
      }
      sc->cache_mode = val[0] == 'h' ? AG_SIMCACHE_HYBRID : AG_SIMCACHE_FULL;
      return 0;
    case OPT_CTX_CHECKPOINTS:
      if (parse_int(name, val, &n) < 0) return -EINVAL;
      sc->ctx_checkpoints = n < 0 ? -1 : n > 1000000 ? 1000000 : (int)n;
      return 0;
    case OPT_CHECKPOINT_MIN_STEP: return parse_int(name, val, &sc->checkpoint_min_step);
    case OPT_CACHE_RAM: return parse_int(name, val, &sc->cache_ram);
    case OPT_SIM_LOAD_MB_S:
    case OPT_SIM_FETCH_MB_S: {
      double d;
      if (parse_double(name, val, &d) < 0) return -EINVAL;
      if (!(d > 0 && d <= 1e9)) {
        fprintf(stderr, "fleetgate-agent: %s: expected more than 0\n",
                id == OPT_SIM_LOAD_MB_S ? "--sim-load-mb-s" : "--sim-fetch-mb-s");
        return -EINVAL;
      }
      if (id == OPT_SIM_LOAD_MB_S) sc->load_mb_s = d;
      else sc->fetch_mb_s = d;
      return 0;
    }
    case OPT_SIM_CORRUPT: sc->corrupt_model = val; return 0;
    case OPT_SIM_STORAGE: {
      double d;
      if (parse_double(name, val, &d) < 0) return -EINVAL;
      if (!(d >= 0 && d <= 1e12)) {
        fprintf(stderr, "fleetgate-agent: --sim-storage-free-mb: expected 0 or more\n");
        return -EINVAL;
      }
      sc->storage_free_mb = d;
      return 0;
    }
    case OPT_THREADS: return parse_int(name, val, &n);
    case OPT_PHONES:
      if (parse_int(name, val, &o->phones) < 0) return -EINVAL;
      if (o->phones < 1 || o->phones > AG_SIMPHONES_MAX) {
        fprintf(stderr, "fleetgate-agent: --phones: expected 1 to %d\n", AG_SIMPHONES_MAX);
        return -EINVAL;
      }
      return 0;
    case OPT_PHONES_FILE: o->phones_file = val; return 0;
    case OPT_PORTS_FILE: o->ports_file = val; return 0;
    default: return -EINVAL;
  }
}

/* Read argv into o and sc. Every refused value is reported before giving up. Returns -1
 * to go on, or the exit code (0 after --version and --help). */
static int cli_parse(int argc, char **argv, cli *o, ag_sim_config *sc) {
  struct option longopts[N_OPTIONS + 1];
  size_t n = 0;
  for (size_t i = 0; i < N_OPTIONS; i++)
    if (options[i].name)
      longopts[n++] = (struct option){options[i].name, options[i].arg ? required_argument : no_argument,
                                      NULL, options[i].id};
  longopts[n] = (struct option){NULL, 0, NULL, 0};
  int c, bad = 0;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
    const char *name = optind > 0 && optind <= argc ? argv[optind - 1] : "option";
    if (c == OPT_VERSION) {
      printf("fleetgate-agent %s\n", FLEETGATE_VERSION);
      return 0;
    }
    if (c == OPT_HELP) {
      usage(stdout);
      return 0;
    }
    if (c == ':') {
      fprintf(stderr, "fleetgate-agent: %s needs a value\n", name);
      return EXIT_USAGE;
    }
    if (c < OPT_ENGINE) {
      fprintf(stderr, "fleetgate-agent: unknown option '%s' (see --help)\n", name);
      return EXIT_USAGE;
    }
    if (cli_option(o, sc, c, name, optarg) < 0) bad = 1;
  }
  if (optind < argc) {
    fprintf(stderr, "fleetgate-agent: unexpected argument '%s' (see --help)\n", argv[optind]);
    return EXIT_USAGE;
  }
  return bad ? 1 : -1;
}

/* ---- settings: file < environment < command line ---------------------------------------- */

/* Everything the agent starts with. Strings are borrowed from argv or owned by conf,
 * which lives until every module has copied what it keeps. */
typedef struct ag_settings {
  cli o;
  ag_conf conf;
  ag_sim_config sc;
  ag_engine_config ec;
  ag_fault_plan plan;
  const char *engine_name, *listen, *id, *model, *gateway, *public_url, *gateway_ca;
  const char *secret;       /* FLEETGATE_FLEET_SECRET; NULL: none */
  const char *token;        /* FLEETGATE_REPLICA_TOKEN; NULL: none */
  pr_idkey *key;            /* the identity key (heartbeats, --print-key) */
  int key_kept;             /* from a file or the environment: the same at every start */
  int is_sim;
  ag_engine_kind kind;
  size_t n_faults;          /* entries of the fault plan (the sim keeps its own copy) */
  ag_simphones phones;      /* the sim phones to run: one, or those --phones names */
  int hosting;              /* --phones or --phones-file: phones named and logged as hosted */
  int fail_exit;            /* exit code of a refused setting when it is not 1 */
  const char *bridge;       /* --tunnel: BRIDGE_SOCKET */
  char *tunnel_key;         /* --tunnel: base64 PKCS#8 of the P-256 key (secret) */
  const char *model_file;   /* the model file (--model-file, else the engine's -m); NULL */
  char *hold_dir;           /* the models folder (--models-dir, else the model file's); NULL */
  char err[1300];
} ag_settings;

static void settings_free(ag_settings *st) {
  if (st->tunnel_key) OPENSSL_cleanse(st->tunnel_key, strlen(st->tunnel_key));
  free(st->tunnel_key);
  st->tunnel_key = NULL;
  free(st->hold_dir);
  st->hold_dir = NULL;
  pr_idkey_free(st->key);
  st->key = NULL;
  ag_fault_plan_free(&st->plan);
  ag_simphones_free(&st->phones);
  ag_conf_free(&st->conf);
}

/* --tunnel's settings: its key and bridge. Returns what is wrong, or NULL. */
static const char *settings_tunnel(ag_settings *st) {
  const cli *o = &st->o;
  if (strcmp(o->tunnel, "acurast") != 0) return "--tunnel: the only kind is acurast";
  if (st->public_url) return "--tunnel and --public-url exclude each other: the tunnel names the public URL";
  if (!st->gateway) return "--tunnel needs --gateway (the tunnel's URL is told in heartbeats)";
  if (o->tunnel_domain && ag_tunrpc_check_domain(o->tunnel_domain) < 0)
    return "--tunnel-domain: expected a DNS name such as acu.run";
  st->bridge = getenv("BRIDGE_SOCKET");
  if (!st->bridge || !*st->bridge)
    return "--tunnel acurast: BRIDGE_SOCKET is not set (the Acurast processor sets it to the bridge's "
           "socket name; run inside an Acurast Shell deployment)";
  if (strlen(st->bridge) > 100) return "BRIDGE_SOCKET: the name is longer than a Unix socket's 107 bytes";
  const char *kt = secret("FLEETGATE_TUNNEL_KEY");
  int rc = kt && *kt ? ag_tunkey_from_text(kt, &st->tunnel_key) : ag_tunkey_generate(&st->tunnel_key);
  if (rc == PR_ETYPE) return "FLEETGATE_TUNNEL_KEY: not a P-256 (secp256r1) key";
  if (rc < 0 && kt && *kt) return "FLEETGATE_TUNNEL_KEY: not base64 of a PKCS#8 DER private key";
  if (rc < 0) return "cannot make a tunnel key";
  return NULL;
}

/* The file and the environment under the command line, the engine, and the checks that
 * hold for every engine. Returns -1 to go on, or the exit code (said on stderr). */
static int settings_merge(ag_settings *st) {
  const cli *o = &st->o;
  ag_conf *conf = &st->conf;
  const char *config = o->config ? o->config : getenv("FLEETGATE_AGENT_CONFIG");
  if (config && *config && ag_conf_load_file(conf, config, st->err, sizeof(st->err)) < 0) {
    fprintf(stderr, "fleetgate-agent: %s\n", st->err);
    return 1;
  }
  st->engine_name = o->engine ? o->engine : conf->engine;
  st->is_sim = st->engine_name && strcmp(st->engine_name, "sim") == 0;
  if (!st->is_sim && ag_conf_load_env(conf, env_get, st->err, sizeof(st->err)) < 0) {
    fprintf(stderr, "fleetgate-agent: %s\n", st->err);
    return 1;
  }
#define PICK(field) (o->field ? o->field : conf->field)
  st->listen = PICK(listen);
  st->id = PICK(id);
  st->model = PICK(model);
  st->gateway = PICK(gateway);
  st->public_url = PICK(public_url);
  st->gateway_ca = PICK(gateway_ca);
  if (!st->engine_name && !o->hold_check) {
    fprintf(stderr, "fleetgate-agent: --engine is required (llama, openai, mnn or sim)\n");
    return EXIT_USAGE;
  }
  st->kind = AG_ENGINE_LLAMA;
  if (!st->engine_name) {
    /* --hold-check runs no engine */
  } else if (strcmp(st->engine_name, "openai") == 0) st->kind = AG_ENGINE_OPENAI;
  else if (strcmp(st->engine_name, "mnn") == 0) st->kind = AG_ENGINE_MNN;
  else if (!st->is_sim && strcmp(st->engine_name, "llama") != 0) {
    fprintf(stderr, "fleetgate-agent: unknown engine '%s' (llama, openai, mnn or sim)\n", st->engine_name);
    return 1;
  }
  const char *id = st->id, *fail = o->tunnel ? settings_tunnel(st) : NULL;
  if (fail) {
    /* said below */
  } else if (!o->tunnel && (o->n_relays || o->tunnel_domain)) {
    fail = "--tunnel-relay and --tunnel-domain need --tunnel";
  } else if (o->hold_check && (o->tunnel || st->public_url)) {
    fail = "--hold-check opens no tunnel and serves nothing: leave out --tunnel and --public-url";
  } else if (o->hold_check && st->gateway && (!st->id || !st->model)) {
    fail = "--hold-check with --gateway needs --id and --model (the report names them)";
  } else if (!o->tunnel && !o->hold_check && (st->gateway == NULL) != (st->public_url == NULL)) {
    fail = "--gateway and --public-url go together";
  } else if (st->gateway && (!valid_url(st->gateway) || (st->public_url && !valid_url(st->public_url))))
    fail = "--gateway and --public-url must be http:// or https:// URLs";
  else if (st->gateway_ca && !st->gateway) fail = "--gateway-ca needs --gateway";
  else if (st->gateway_ca && access(st->gateway_ca, R_OK) != 0) fail = "--gateway-ca: cannot read the file";
  else if (id && (strlen(id) == 0 || strlen(id) > 64 || strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != strlen(id)))
    fail = "--id must be 1-64 characters of A-Z a-z 0-9 . _ -";
  st->secret = secret("FLEETGATE_FLEET_SECRET");
  if (st->secret && !*st->secret) st->secret = NULL;
  const char *key_text = secret("FLEETGATE_AGENT_KEY");
  st->key_kept = o->key_file || (key_text && *key_text);
  if (!fail && st->gateway && st->secret && strlen(st->secret) < 16)
    fail = "FLEETGATE_FLEET_SECRET must be at least 16 characters";
  else if (!fail && st->gateway && !st->secret && !st->key_kept)
    fail = "--gateway needs FLEETGATE_FLEET_SECRET (at least 16 characters) to enrol this phone, "
           "or a kept key (--key-file or FLEETGATE_AGENT_KEY) that the gateway's replica file pins";
  if (fail) {
    fprintf(stderr, "fleetgate-agent: %s\n", fail);
    return 1;
  }
  if (st->gateway || o->print_key) {
    int rc;
    if (key_text && *key_text) {
      if ((rc = pr_idkey_from_text(&st->key, key_text, strlen(key_text))) < 0) {
        fprintf(stderr, "fleetgate-agent: FLEETGATE_AGENT_KEY: %s\n",
                rc == PR_ETYPE ? "not an Ed25519 key" : "not a PEM or base64 PKCS#8 private key");
        return 1;
      }
    } else if (o->key_file) {
      if (pr_idkey_load_file(&st->key, o->key_file, 1, st->err, sizeof(st->err)) < 0) {
        fprintf(stderr, "fleetgate-agent: --key-file: %s\n", st->err);
        return 1;
      }
    } else if (o->print_key) {
      fprintf(stderr, "fleetgate-agent: --print-key needs --key-file or FLEETGATE_AGENT_KEY\n");
      return EXIT_USAGE;
    } else if ((rc = pr_idkey_generate(&st->key)) < 0) {
      fprintf(stderr, "fleetgate-agent: cannot make an identity key: %s\n", pr_strerror(rc));
      return 1;
    }
    if (o->print_key) {
      printf("%s\n", pr_idkey_public(st->key));
      return 0;
    }
  }
  /* a token that is set must be fit to guard a phone, for every engine (the sim too);
   * a real engine without one is refused in settings_engine */
  st->token = secret("FLEETGATE_REPLICA_TOKEN");
  char why[160];
  if (st->token && ag_conf_check_token(st->token, why, sizeof(why)) < 0) {
    fprintf(stderr, "fleetgate-agent: %s: refusing to start (use a long random one, e.g. from "
                    "'openssl rand -hex 32')\n", why);
    return EXIT_USAGE;
  }
  return -1;
}

/* Whether a --public-url names each hosted phone apart: "{port}" or "{id}" in it. */
static int url_has_placeholder(const char *u) { return strstr(u, "{port}") || strstr(u, "{id}"); }

/* The phones to run: the one the command line describes, or those --phones or
 * --phones-file name (simphones.h). Returns what is wrong, or NULL. */
static const char *settings_phones(ag_settings *st) {
  const cli *o = &st->o;
  st->hosting = o->phones > 0 || o->phones_file;
  if (o->phones && o->phones_file) return "--phones and --phones-file exclude each other";
  if (st->hosting && o->tunnel) return "--tunnel opens one phone's tunnel: not with --phones or --phones-file";
  if (st->hosting && st->gateway && st->key_kept)
    return "--key-file and FLEETGATE_AGENT_KEY are one phone's identity: hosted phones each make their own "
           "key (enrolled with FLEETGATE_FLEET_SECRET)";
  if (!st->hosting) { /* one phone, as described */
    st->phones.v = calloc(1, sizeof(*st->phones.v));
    if (!st->phones.v) return "out of memory";
    st->phones.n = 1;
    st->phones.v[0].sc = st->sc;
    st->phones.v[0].cost_per_day = o->cost_per_day;
    return NULL;
  }
  ag_simphones_spec spec = {&st->sc, (size_t)o->phones, o->phones_file, o->cost_per_day};
  if (ag_simphones_build(&st->phones, &spec, st->err, sizeof(st->err)) < 0) return st->err;
  if (st->gateway && st->phones.n > 1 && !url_has_placeholder(st->public_url))
    return "--public-url must name each hosted phone apart: put {port} (or {id}) in it, e.g. "
           "http://127.0.0.1:{port}";
  for (size_t i = 0; i < st->phones.n; i++) st->phones.v[i].sc.log_phone = 1;
  return NULL;
}

/* The simulated phone's settings; returns what is wrong, or NULL. */
static const char *settings_sim(ag_settings *st) {
  ag_sim_config *sc = &st->sc;
  char err[1200];
  sc->listen = st->listen;
  sc->model = st->model;
  sc->id = st->id;
  sc->model_mb = (double)st->o.model_bytes / 1048576.0;
  if (st->o.flavour && strcmp(st->o.flavour, "mnn") == 0) sc->flavour = AG_SIM_MNN;
  else if (st->o.flavour && strcmp(st->o.flavour, "llama") != 0) return "--flavour: expected llama or mnn";
  if (ag_sim_config_check(sc, st->err, sizeof(st->err)) < 0) return st->err;
  if (st->o.fault_file && ag_fault_plan_load(&st->plan, st->o.fault_file, err, sizeof(err)) < 0) {
    snprintf(st->err, sizeof(st->err), "invalid fault plan: %s", err);
    return st->err;
  }
  sc->faults = &st->plan;
  st->n_faults = st->plan.n;
  sc->token = st->token;
  sc->require_token = st->gateway != NULL; /* then the gateway names the token */
  return settings_phones(st);
}

/* A real engine's settings (llama, openai, mnn); returns what is wrong, or NULL. */
static const char *settings_engine(ag_settings *st) {
  const cli *o = &st->o;
  const ag_conf *conf = &st->conf;
  ag_engine_config *ec = &st->ec;
  ec->kind = st->kind;
  ec->upstream = PICK(upstream);
  ec->command = PICK(command);
  if (o->n_args) {
    ec->args = o->args;
    ec->n_args = o->n_args;
  } else {
    ec->args = conf->args;
    ec->n_args = conf->n_args;
  }
  ec->threads_arg = o->threads_arg ? o->threads_arg : conf->threads_arg ? conf->threads_arg : "--threads";
  ec->tune_threads = o->n_tune ? o->tune : conf->tune;
  ec->n_tune = o->n_tune ? o->n_tune : conf->n_tune;
  ec->api_key = conf->api_key;
  ec->model = st->model;
  ec->slots = o->slots_set ? st->sc.slots : conf->slots;
  ec->n_ctx = o->nctx_set ? st->sc.n_ctx : conf->n_ctx;
  ec->measure = o->measure || conf->measure == 1;
  if (conf->ready_timeout_s >= 0) ec->ready_timeout_s = conf->ready_timeout_s;
  if (conf->restart_max_s >= 0) ec->restart_max_s = conf->restart_max_s;
  if (conf->stop_timeout_s >= 0) ec->stop_timeout_s = conf->stop_timeout_s;
  int insecure = o->insecure || conf->insecure == 1;
  if (st->kind == AG_ENGINE_LLAMA && ec->command && !ec->upstream) ec->upstream = "http://127.0.0.1:8080";
  const char *fail = NULL;
  if (o->phones || o->phones_file || o->ports_file) fail = "--phones, --phones-file and --ports-file are for --engine sim";
  else if (!st->listen) fail = "--listen HOST:PORT is required";
  else if (!ec->upstream) fail = st->kind == AG_ENGINE_LLAMA ? "--engine llama needs an engine command (--engine-command, "
                                                               "FLEETGATE_ENGINE_COMMAND or the config's \"command\") or --upstream URL"
                                                             : "this engine needs --upstream URL";
  else if (!valid_url(ec->upstream)) fail = "--upstream must be an http:// or https:// URL";
  else if (ec->command && st->kind != AG_ENGINE_LLAMA) fail = "an engine command is only for --engine llama";
  else if (ec->slots < 0 || ec->slots > 1024) fail = "--slots must be between 1 and 1024";
  else if (ec->n_ctx < 0 || ec->n_ctx > INT32_MAX) fail = "--n-ctx must be between 1 and 2^31-1";
  else if (ec->n_tune && !ec->command) fail = "--tune-threads needs an engine the agent starts (a command)";
  else if (!st->token && !insecure && !st->gateway) {
    fail = "FLEETGATE_REPLICA_TOKEN is not set: refusing to serve the engine to anyone who connects "
           "(set it, use --gateway (which names this phone's token), or pass "
           "--insecure-private-network on a private network)";
    st->fail_exit = EXIT_USAGE;
  }
  if (st->kind == AG_ENGINE_MNN && ec->slots > 1) ec->slots = 1; /* MNN serialises requests */
  return fail;
}
#undef PICK

/* ---- what the phone can hold ------------------------------------------------------------- */

/* The model file (--model-file, else the value of the engine's -m or --model) and the
 * models folder (--models-dir or the config's models_dir, else the model file's folder).
 * Returns what is wrong, or NULL. */
static const char *settings_hold(ag_settings *st) {
  const cli *o = &st->o;
  st->model_file = o->model_file;
  for (size_t i = 0; !st->model_file && !st->is_sim && i + 1 < st->ec.n_args; i++)
    if (strcmp(st->ec.args[i], "-m") == 0 || strcmp(st->ec.args[i], "--model") == 0) st->model_file = st->ec.args[i + 1];
  for (size_t i = 0; !st->model_file && !st->is_sim && i < st->ec.n_args; i++)
    if (strncmp(st->ec.args[i], "--model=", 8) == 0) st->model_file = st->ec.args[i] + 8;
  if (st->model_file && !*st->model_file) st->model_file = NULL;
  const char *dir = o->models_dir ? o->models_dir : st->conf.models_dir;
  if (dir) {
    st->hold_dir = strdup(dir);
  } else if (st->model_file) {
    const char *slash = strrchr(st->model_file, '/');
    st->hold_dir = !slash ? strdup(".") : slash == st->model_file ? strdup("/")
                                                                 : strndup(st->model_file, (size_t)(slash - st->model_file));
  }
  if ((dir || st->model_file) && !st->hold_dir) return "out of memory";
  if (o->hold_check && !st->hold_dir)
    return "--hold-check needs --model-file or --models-dir (the folder the model goes to)";
  if (o->hold_check && !o->model_bytes && o->need_mem_mb <= 0)
    return "--hold-check needs --model-bytes or --need-mem-mb (what the model needs)";
  return NULL;
}

static uint64_t file_size(const char *path) {
  struct stat sb;
  return path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (uint64_t)sb.st_size : 0;
}

/* Whether this phone can hold its model (ag_hold_fits; blocking reads of a few small files,
 * before the loop runs). 1 it can, or nothing asks (no --model-bytes, --need-mem-mb); 0 it
 * cannot; why says what was found. *storage_mb: the folder's free storage (< 0 unknown). */
static int hold_fits(const ag_settings *st, char *why, size_t n, double *storage_mb) {
  const cli *o = &st->o;
  *storage_mb = -1;
  if (!o->model_bytes && o->need_mem_mb <= 0) return 1;
  /* what of the model is there already: the file, or the part a broken download left */
  uint64_t present = 0;
  if (st->model_file) {
    char part[4200];
    present = file_size(st->model_file);
    if (snprintf(part, sizeof(part), "%s.part", st->model_file) < (int)sizeof(part)) present += file_size(part);
  }
  uint64_t bytes = o->model_bytes ? o->model_bytes : file_size(st->model_file);
  struct statvfs vfs;
  if (st->hold_dir && statvfs(st->hold_dir, &vfs) == 0)
    *storage_mb = floor((double)vfs.f_bavail * (double)vfs.f_frsize / 1048576.0);
  ag_device d;
  ag_device_read(&d, st->o.sysfs_root ? st->o.sysfs_root : getenv("FLEETGATE_AGENT_SYSROOT"));
  const char *model = st->model ? st->model : st->model_file ? st->model_file : "the model";
  return ag_hold_fits(model, bytes, o->need_mem_mb, d.mem_total_mb, *storage_mb, present, why, n);
}

/* A value the gateway sent that run.sh may take as it is: 1 - max visible ASCII
 * characters, none of them a quote, backslash, backquote or dollar. */
static int plain_value(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n == 0 || n > max) return 0;
  for (; *s; s++)
    if (*s <= ' ' || *s > '~' || strchr("'\"\\`$", *s)) return 0;
  return 1;
}

/* The answer's `instead` (docs/protocol.md): the catalogue model this phone can hold,
 * as lines FG_MODEL=..., which run.sh reads (docs/phones.md). NULL: none, or not
 * understood (said in the log). */
static char *instead_lines(const char *answer) {
  cJSON *o = cJSON_Parse(answer);
  const cJSON *in = cJSON_GetObjectItemCaseSensitive(o, "instead");
  char *out = NULL;
  if (cJSON_IsObject(in)) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(in, "model");
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(in, "url");
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(in, "sha256");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(in, "size_bytes");
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(in, "mem_mb");
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(in, "n_ctx");
    char file[AG_HOLD_NAME_MAX + 8], nm[AG_HOLD_NAME_MAX + 1];
    int good = cJSON_IsString(name) && snprintf(file, sizeof(file), "%s.gguf", name->valuestring) < (int)sizeof(file) &&
               ag_hold_model_name(file, nm) == 0 && cJSON_IsString(url) && plain_value(url->valuestring, 1000) &&
               (strncmp(url->valuestring, "https://", 8) == 0 || strncmp(url->valuestring, "http://", 7) == 0) &&
               cJSON_IsString(sha) && strlen(sha->valuestring) == 64 &&
               strspn(sha->valuestring, "0123456789abcdefABCDEF") == 64 &&
               cJSON_IsNumber(size) && size->valuedouble >= 1 && size->valuedouble < 1e15;
    if (good) {
      char mem_line[64] = "", ctx_line[64] = "";
      if (cJSON_IsNumber(mem) && mem->valuedouble >= 1 && mem->valuedouble < 1e8)
        snprintf(mem_line, sizeof(mem_line), "FG_NEED_MEM_MB=%.0f\n", ceil(mem->valuedouble));
      if (cJSON_IsNumber(ctx) && ctx->valuedouble >= 1 && ctx->valuedouble < 1e9)
        snprintf(ctx_line, sizeof(ctx_line), "FG_CTX=%.0f\n", ctx->valuedouble);
      size_t n = strlen(url->valuestring) + 400;
      if ((out = malloc(n)))
        snprintf(out, n, "FG_MODEL=%s\nFG_MODEL_URL=%s\nFG_MODEL_SHA256=%s\nFG_MODEL_BYTES=%.0f\n%s%s", nm,
                 url->valuestring, sha->valuestring, size->valuedouble, mem_line, ctx_line);
    } else {
      pr_warn("the gateway's `instead` is not understood (a model's name, url, sha256, size_bytes): not taken");
    }
  }
  cJSON_Delete(o);
  return out;
}

static void on_unfit_reported(void *ud, int ok, const char *what) {
  ag_main *m = ud;
  if (ok && (m->instead = instead_lines(what))) {
    const char *name = m->instead + strlen("FG_MODEL=");
    pr_warn("the gateway's placement gives this phone %.*s instead of %s, which it cannot hold",
            (int)strcspn(name, "\n"), name, m->unfit_model);
  } else if (ok) {
    pr_info("the gateway took the report that this phone cannot hold %s: %.500s", m->unfit_model, what);
  } else {
    pr_error("could not tell the gateway that this phone cannot hold %s: %s", m->unfit_model, what);
  }
  stop_all(m);
}

/* Tell the gateway, once, that this phone cannot hold its model (a signed heartbeat with
 * state "unfit", no URL: docs/protocol.md), trying 3 times; then return. When its answer
 * names a catalogue model the phone can hold instead, that model's FG_ lines are printed
 * on stdout and 1 is returned; else 0. */
static int report_unfit_once(ag_settings *st, const char *why, double storage_mb) {
  /* the id and model it speaks for: as given, else from the listener's port and the file */
  char id[80] = "", model[AG_HOLD_NAME_MAX + 1] = "";
  const char *colon = st->listen ? strrchr(st->listen, ':') : NULL;
  if (st->id) snprintf(id, sizeof(id), "%s", st->id);
  else if (colon && atoi(colon + 1) > 0) snprintf(id, sizeof(id), "agent-%d", atoi(colon + 1));
  const char *slash = st->model_file ? strrchr(st->model_file, '/') : NULL;
  if (!st->model && st->model_file) ag_hold_model_name(slash ? slash + 1 : st->model_file, model);
  if (!id[0]) {
    pr_warn("not telling the gateway: this agent has no id yet (give --id)");
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  ag_main m;
  memset(&m, 0, sizeof(m));
  m.loop = uv_default_loop();
  m.engine_name = st->engine_name;
  m.start_ns = uv_hrtime();
  m.cost_per_day = st->o.cost_per_day;
  m.labels = st->o.labels;
  m.unfit = why;
  m.unfit_model = st->model ? st->model : model[0] ? model : "unknown";
  m.unfit_dir = st->hold_dir;
  m.unfit_storage_mb = storage_mb;
  snprintf(m.id, sizeof(m.id), "%s", id);
  ag_device_cache_init(&m.device, st->o.sysfs_root ? st->o.sysfs_root : getenv("FLEETGATE_AGENT_SYSROOT"));
  uv_signal_init(m.loop, &m.sigterm);
  uv_signal_init(m.loop, &m.sigint);
  m.sigterm.data = m.sigint.data = &m;
  uv_signal_start(&m.sigterm, on_signal, SIGTERM);
  uv_signal_start(&m.sigint, on_signal, SIGINT);
  ag_hb_config hc = {st->gateway, NULL, st->secret, st->gateway_ca, st->key, NULL, 3, on_unfit_reported};
  int rc = pr_curlm_new(&m.curlm, m.loop);
  if (rc == 0) rc = ag_hb_new(&m.hb, m.loop, m.curlm, &hc, report_unfit, NULL, &m);
  if (rc < 0) {
    pr_error("cannot report to the gateway: %s", pr_strerror(rc));
    stop_all(&m);
  } else {
    ag_hb_start(m.hb);
  }
  uv_run(m.loop, UV_RUN_DEFAULT);
  ag_hb_free(m.hb);
  if (uv_loop_close(m.loop) != 0) pr_error("handles left open at exit");
  curl_global_cleanup();
  int instead = m.instead != NULL;
  if (instead) {
    fputs(m.instead, stdout);
    fflush(stdout);
  }
  free(m.instead);
  return instead;
}

/* ---- starting ------------------------------------------------------------------------- */

/* Create the modules on m's loop: the sim, or the engine and its front (and the curl
 * multi they and the heartbeats share). Returns 0 or a negative code. */
static int modules_new(ag_main *m, ag_settings *st) {
  int rc = 0;
  if (st->hold_dir && (rc = ag_hold_new(&m->hold, m->loop, st->hold_dir)) < 0) return rc;
  if (st->gateway || !st->is_sim) rc = pr_curlm_new(&m->curlm, m->loop);
  if (rc == 0 && st->is_sim) {
    m->phones = calloc(st->phones.n, sizeof(*m->phones));
    if (!m->phones) return -ENOMEM;
    m->n_phones = st->phones.n;
    for (size_t i = 0; i < m->n_phones && rc == 0; i++) {
      ag_phone *ph = &m->phones[i];
      const ag_simphone *sp = &st->phones.v[i];
      ph->m = m;
      ph->cost_per_day = sp->cost_per_day;
      ph->device = &m->device;
      if (sp->sysfs_root) { /* its own tree; the others share the process's readings */
        if (!(ph->sysfs_root = strdup(sp->sysfs_root))) return -ENOMEM;
        ag_device_cache_init(&ph->own_device, ph->sysfs_root);
        ph->device = &ph->own_device;
      }
      ag_sim_config sc = sp->sc;
      sc.route = sim_route;
      sc.route_ud = ph;
      rc = ag_sim_new(&ph->sim, m->loop, &sc);
    }
  } else if (rc == 0) {
    rc = ag_engine_new(&m->engine, m->loop, m->curlm, &st->ec, &m->rates, on_engine_state, m);
    ag_front_config fc = {st->listen, st->token, st->gateway != NULL && !(st->o.insecure || st->conf.insecure == 1)};
    if (rc == 0) rc = ag_front_new(&m->front, m->loop, m->curlm, m->engine, &m->rates, &fc, report_engine, m);
    /* a llama-server it starts, with a models folder: it can switch models (swap.h) */
    char exe[4096];
    size_t exe_n = sizeof(exe);
    if (rc == 0 && st->kind == AG_ENGINE_LLAMA && st->ec.command && st->hold_dir && st->gateway &&
        uv_exepath(exe, &exe_n) == 0)
      rc = ag_swap_new(&m->swap, m->loop, m->engine, m->front, st->hold_dir, exe, swap_fits, on_swap_changed, m);
  }
  return rc;
}

/* The tunnel's URL is new or changed: heartbeats say it from now on, starting at once. */
static void on_tunnel_url(void *ud, const char *url) {
  ag_main *m = ud;
  ag_hb *hb = m->n_phones ? m->phones[0].hb : m->hb; /* a tunnel serves one phone */
  if (hb && ag_hb_set_public_url(hb, url) < 0) pr_error("tunnel: out of memory");
}

/* --tunnel: ask the bridge for a tunnel to the listener on port (its host, or loopback
 * when it listens on every address). */
static int tunnel_open(ag_main *m, const ag_settings *st, int port) {
  const cli *o = &st->o;
  ag_tunnel_config tc = {.socket_name = st->bridge, .url_fn = on_tunnel_url, .ud = m};
  tc.spec.domain = o->tunnel_domain ? o->tunnel_domain : AG_TUNNEL_DOMAIN;
  tc.spec.key_b64 = st->tunnel_key;
  for (size_t i = 0; i < o->n_relays; i++) tc.spec.relays[i] = o->relays[i];
  tc.spec.n_relays = o->n_relays;
  if (!o->n_relays) {
    tc.spec.relays[0] = AG_TUNNEL_RELAY;
    tc.spec.n_relays = 1;
  }
  const char *colon = strrchr(st->listen, ':');
  size_t hl = colon ? (size_t)(colon - st->listen) : 0;
  char local[300];
  if (hl == 0 || (hl == 7 && memcmp(st->listen, "0.0.0.0", 7) == 0) ||
      (hl == 4 && memcmp(st->listen, "[::]", 4) == 0) || hl > 256)
    snprintf(local, sizeof(local), "127.0.0.1:%d", port);
  else
    snprintf(local, sizeof(local), "%.*s:%d", (int)hl, st->listen, port);
  int rc = ag_tunnel_new(&m->tunnel, m->loop, &tc);
  return rc < 0 ? rc : ag_tunnel_start(m->tunnel, local);
}

/* A hosted phone's public URL: --public-url with "{port}" and "{id}" put in. NULL on
 * ENOMEM. */
static char *phone_public_url(const char *tmpl, int port, const char *id) {
  pr_buf b;
  pr_buf_init(&b, 4096);
  char ps[16];
  snprintf(ps, sizeof(ps), "%d", port);
  int rc = 0;
  for (const char *p = tmpl; *p && rc == 0;) {
    if (!strncmp(p, "{port}", 6)) {
      rc = pr_buf_append(&b, ps, strlen(ps));
      p += 6;
    } else if (!strncmp(p, "{id}", 4)) {
      rc = pr_buf_append(&b, id, strlen(id));
      p += 4;
    } else {
      rc = pr_buf_append(&b, p++, 1);
    }
  }
  if (rc == 0) rc = pr_buf_append(&b, "", 1);
  if (rc < 0) {
    pr_buf_free(&b);
    return NULL;
  }
  return b.data; /* NUL-ended above; the caller frees it */
}

/* --ports-file: every phone's id, port and address, written whole (a temporary file
 * renamed) once all of them listen. Returns 0 or a negative code. */
static int write_ports_file(const ag_main *m, const ag_settings *st, const char *path) {
  cJSON *arr = cJSON_CreateArray();
  if (!arr) return -ENOMEM;
  for (size_t i = 0; i < m->n_phones; i++) {
    const ag_phone *ph = &m->phones[i];
    const char *listen = st->phones.v[i].sc.listen;
    const char *colon = strrchr(listen, ':');
    int port = ag_sim_port(ph->sim);
    char addr[300];
    snprintf(addr, sizeof(addr), "%.*s:%d", (int)(colon ? colon - listen : 0), listen, port);
    cJSON *e = cJSON_CreateObject();
    if (!e) break;
    cJSON_AddItemToArray(arr, e);
    cJSON_AddStringToObject(e, "id", ph->id);
    cJSON_AddNumberToObject(e, "port", port);
    cJSON_AddStringToObject(e, "listen", addr);
  }
  char *text = cJSON_PrintUnformatted(arr);
  cJSON_Delete(arr);
  if (!text) return -ENOMEM;
  char tmp[4200];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *fp = fopen(tmp, "w");
  int rc = fp ? 0 : -errno;
  if (fp) {
    if (fputs(text, fp) < 0 || fputc('\n', fp) < 0) rc = -EIO;
    if (fclose(fp) != 0 && rc == 0) rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0) rc = -errno;
    if (rc < 0) unlink(tmp);
  }
  free(text);
  return rc;
}

/* Several phones take a listening socket each (and their connections): raise the
 * descriptor limit to the hard one, as the gateway does. */
static void raise_nofile(void) {
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
}

/* Every sim phone listens, is named, and heartbeats when told to. Returns 0 or the
 * exit code (said in the log). */
static int phones_start(ag_main *m, const ag_settings *st) {
  if (st->hosting) raise_nofile();
  for (size_t i = 0; i < m->n_phones; i++) {
    ag_phone *ph = &m->phones[i];
    const char *listen = st->phones.v[i].sc.listen;
    int rc = ag_sim_listen(ph->sim);
    if (rc < 0) {
      pr_error("cannot listen on %s: %s", listen, pr_strerror(rc));
      return 1;
    }
    snprintf(ph->id, sizeof(ph->id), "%s", ag_sim_id(ph->sim));
    if (!st->gateway) continue;
    const pr_idkey *key = st->key;
    char *url = NULL;
    if (st->hosting) { /* each phone its own identity and URL */
      if ((rc = pr_idkey_generate(&ph->key)) < 0 ||
          !(url = phone_public_url(st->public_url, ag_sim_port(ph->sim), ph->id))) {
        pr_error("cannot make phone %s's key: %s", ph->id, pr_strerror(rc < 0 ? rc : -ENOMEM));
        return 1;
      }
      key = ph->key;
    }
    ag_hb_config hc = {st->gateway, url ? url : st->public_url, st->secret, st->gateway_ca, key, phone_on_token, 0, NULL};
    rc = ag_hb_new(&ph->hb, m->loop, m->curlm, &hc, report_sim, phone_on_drain, ph);
    free(url);
    if (rc == 0) ag_hb_on_place(ph->hb, phone_on_place);
    if (rc < 0) {
      pr_error("cannot start heartbeats: %s", pr_strerror(rc));
      return 1;
    }
  }
  int rc;
  if (st->o.ports_file && (rc = write_ports_file(m, st, st->o.ports_file)) < 0) {
    pr_error("cannot write --ports-file %s: %s", st->o.ports_file, pr_strerror(rc));
    return 1;
  }
  return 0;
}

/* Listen, name the replica, start heartbeats and the engine. Returns 0 or the exit
 * code (said in the log); *port is the bound port (a sim's first phone's). */
static int modules_start(ag_main *m, const ag_settings *st, int *port) {
  int rc;
  if (m->n_phones) {
    if ((rc = phones_start(m, st)) != 0) return rc;
    *port = ag_sim_port(m->phones[0].sim);
    snprintf(m->id, sizeof(m->id), "%s", m->phones[0].id);
  } else {
    if ((rc = ag_front_listen(m->front)) < 0) {
      pr_error("cannot listen on %s: %s", st->listen, pr_strerror(rc));
      return 1;
    }
    *port = ag_front_port(m->front);
    if (st->id) snprintf(m->id, sizeof(m->id), "%s", st->id);
    else snprintf(m->id, sizeof(m->id), "agent-%d", *port);
    if (st->gateway) {
      ag_hb_config hc = {st->gateway, st->public_url, st->secret, st->gateway_ca, st->key, on_token, 0, NULL};
      rc = ag_hb_new(&m->hb, m->loop, m->curlm, &hc, report_engine, on_drain, m);
      if (rc == 0 && m->swap) ag_hb_on_place(m->hb, on_place);
      if (rc < 0) {
        pr_error("cannot start heartbeats: %s", pr_strerror(rc));
        return 1;
      }
    }
  }
  if (st->o.tunnel && (rc = tunnel_open(m, st, *port)) < 0) {
    pr_error("cannot open the tunnel: %s", pr_strerror(rc));
    return 1;
  }
  if (m->hold) ag_hold_start(m->hold);
  if (m->engine && (rc = ag_engine_start(m->engine)) < 0) {
    pr_error("cannot start the engine: %s", pr_strerror(rc));
    return 1;
  }
  return 0;
}

/* The "listening" line that says what this agent runs with: one per sim phone. */
static void log_listening_one(const ag_main *m, const ag_settings *st, const ag_phone *ph,
                              const ag_sim_config *sc, int port) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "engine", st->engine_name);
  cJSON_AddStringToObject(f, "id", ph ? ph->id : m->id);
  cJSON_AddStringToObject(f, "listen", ph ? sc->listen : st->listen);
  cJSON_AddNumberToObject(f, "port", port);
  if (ph) {
    cJSON_AddStringToObject(f, "model", sc->model);
    cJSON_AddStringToObject(f, "flavour", sc->flavour == AG_SIM_MNN ? "mnn" : "llama");
    cJSON_AddNumberToObject(f, "slots", sc->flavour == AG_SIM_MNN ? 1 : sc->slots);
    cJSON_AddNumberToObject(f, "prefill_tps", sc->prefill_tps);
    cJSON_AddNumberToObject(f, "decode_tps", sc->decode_tps);
    cJSON_AddNumberToObject(f, "n_ctx", (double)sc->n_ctx);
    cJSON_AddNumberToObject(f, "time_scale", sc->time_scale);
    cJSON_AddNumberToObject(f, "faults", (double)(st->hosting ? sc->faults->n : st->n_faults));
    cJSON_AddNumberToObject(f, "release", sc->release);
    cJSON_AddBoolToObject(f, "thinking", sc->thinking);
    cJSON_AddStringToObject(f, "cache_mode", sc->cache_mode == AG_SIMCACHE_HYBRID ? "hybrid" : "full");
    if (st->hosting) cJSON_AddNumberToObject(f, "phones", (double)m->n_phones);
  } else {
    cJSON_AddStringToObject(f, "upstream", st->ec.upstream);
    if (st->ec.command) cJSON_AddStringToObject(f, "command", st->ec.command);
  }
  if (st->gateway) {
    cJSON_AddStringToObject(f, "gateway", st->gateway);
    cJSON_AddStringToObject(f, "key", pr_idkey_public(ph && ph->key ? ph->key : st->key));
    cJSON_AddBoolToObject(f, "key_kept", st->key_kept);
    if (st->o.tunnel) {
      cJSON_AddStringToObject(f, "tunnel", st->o.tunnel);
      const char *kt = secret("FLEETGATE_TUNNEL_KEY");
      cJSON_AddBoolToObject(f, "tunnel_key_kept", kt && *kt);
    }
  }
  cJSON_AddBoolToObject(f, "auth", st->token != NULL || st->gateway != NULL);
  pr_log_kv(PR_LOG_INFO, "listening", f);
}

static void log_listening(const ag_main *m, const ag_settings *st, int port) {
  if (!pr_log_enabled(PR_LOG_INFO) && m->n_phones > 1) return; /* thousands of lines unread */
  for (size_t i = 0; i < m->n_phones; i++)
    log_listening_one(m, st, &m->phones[i], &st->phones.v[i].sc, ag_sim_port(m->phones[i].sim));
  if (!m->n_phones) log_listening_one(m, st, NULL, NULL, port);
  if (!st->token && !st->gateway && !m->n_phones) pr_warn("no replica token: anyone who can connect may use the engine");
  if (st->gateway && !st->key_kept)
    pr_info(st->hosting ? "a new identity key was made for each phone for this run"
                        : "a new identity key was made for this run (--key-file keeps one across restarts)");
}

static int agent_main(int argc, char **argv) {
  static ag_settings st; /* large; one per process */
  memset(&st, 0, sizeof(st));
  pr_log_set_app("fleetgate-agent");
  if (argc > 1 && !strcmp(argv[1], "fetch")) return ag_fetch_main(argc - 1, argv + 1);
  ag_sim_config_default(&st.sc);
  ag_engine_config_default(&st.ec);
  st.o.cost_per_day = -1;
  int rc = cli_parse(argc, argv, &st.o, &st.sc);
  if (rc >= 0) return rc;
  ag_conf_init(&st.conf);
  rc = settings_merge(&st);
  const char *fail = rc >= 0 || st.o.hold_check ? NULL : st.is_sim ? settings_sim(&st) : settings_engine(&st);
  if (rc < 0 && !fail) fail = settings_hold(&st);
  if (fail) fprintf(stderr, "fleetgate-agent: %s\n", fail);
  if (rc >= 0 || fail) {
    settings_free(&st);
    return rc >= 0 ? rc : st.fail_exit ? st.fail_exit : 1;
  }
  /* can this phone hold its model? asked before anything is downloaded (--hold-check) or
   * started: one that cannot says so to the gateway once and exits 3 (docs/agent.md) */
  char why[512];
  double storage_mb;
  if (!hold_fits(&st, why, sizeof(why), &storage_mb)) {
    pr_error("%s", why);
    int instead = st.gateway ? report_unfit_once(&st, why, storage_mb) : 0;
    settings_free(&st);
    return instead ? EXIT_HOLD_INSTEAD : EXIT_CANNOT_HOLD;
  }
  if (st.o.model_bytes || st.o.need_mem_mb > 0) pr_info("%s", why);
  if (st.o.hold_check) {
    settings_free(&st);
    return 0;
  }

  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  ag_main m;
  memset(&m, 0, sizeof(m));
  m.loop = uv_default_loop();
  m.engine_name = st.engine_name;
  m.start_ns = uv_hrtime();
  m.cost_per_day = st.o.cost_per_day;
  m.labels = st.o.labels;
  ag_device_cache_init(&m.device, st.o.sysfs_root ? st.o.sysfs_root : getenv("FLEETGATE_AGENT_SYSROOT"));
  /* what the engine loads, said while it loads it */
  if (st.model_file) {
    const char *slash = strrchr(st.model_file, '/');
    m.model_file = strdup(slash ? slash + 1 : st.model_file);
  }
  char from_file[AG_HOLD_NAME_MAX + 1];
  if (st.model) m.model_label = strdup(st.model);
  else if (m.model_file && ag_hold_model_name(m.model_file, from_file) == 0) m.model_label = strdup(from_file);
  ag_rates_init(&m.rates);
  int exit_code = 0;
  rc = modules_new(&m, &st);
  ag_fault_plan_free(&st.plan); /* the sim keeps its own copy */
  if (rc < 0) {
    pr_error("cannot start: %s", pr_strerror(rc));
    exit_code = 1;
  }
  uv_signal_init(m.loop, &m.sigterm);
  uv_signal_init(m.loop, &m.sigint);
  m.sigterm.data = m.sigint.data = &m;
  uv_signal_start(&m.sigterm, on_signal, SIGTERM);
  uv_signal_start(&m.sigint, on_signal, SIGINT);
  int port = -1;
  if (!exit_code) exit_code = modules_start(&m, &st, &port);
  if (!exit_code) {
    log_listening(&m, &st, port);
    if (m.hb) ag_hb_start(m.hb);
    for (size_t i = 0; i < m.n_phones; i++)
      if (m.phones[i].hb) ag_hb_start(m.phones[i].hb);
  }
  m.key = st.key; /* the heartbeats borrow it */
  st.key = NULL;
  settings_free(&st); /* every module copied what it keeps */
  if (exit_code) stop_all(&m);
  uv_run(m.loop, UV_RUN_DEFAULT);
  ag_hb_free(m.hb);
  ag_tunnel_free(m.tunnel);
  ag_hold_free(m.hold);
  free(m.model_label);
  free(m.model_file);
  pr_idkey_free(m.key);
  ag_swap_free(m.swap);
  ag_front_free(m.front);
  ag_engine_free(m.engine);
  for (size_t i = 0; i < m.n_phones; i++) {
    ag_hb_free(m.phones[i].hb);
    ag_sim_free(m.phones[i].sim);
    pr_idkey_free(m.phones[i].key);
    free(m.phones[i].sysfs_root);
  }
  free(m.phones);
  rc = uv_loop_close(m.loop);
  curl_global_cleanup();
  if (rc != 0) {
    pr_error("handles left open at exit: %s", uv_strerror(rc));
    return 1;
  }
  pr_info("stopped");
  return exit_code;
}

int main(int argc, char **argv) {
  /* before anything else, so that nothing started later (the engine, a tool the engine
   * runs) inherits the secrets or reads them in /proc/PID/environ */
  if (ag_secrets_take(&secrets) < 0) {
    fprintf(stderr, "fleetgate-agent: out of memory reading the environment\n");
    ag_secrets_free(&secrets);
    return 1;
  }
  int rc = agent_main(argc, argv);
  ag_secrets_free(&secrets);
  return rc;
}
