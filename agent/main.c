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
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <uv.h>

#include "conf.h"
#include "curlm.h"
#include "engine.h"
#include "err.h"
#include "faults.h"
#include "front.h"
#include "hb.h"
#include "log.h"
#include "noinit.h"
#include "report.h"
#include "sim.h"

#define EXIT_USAGE 2

PR_SKIP_GNUTLS_INIT

/* The process: its loop and every module on it. Lives on main's stack; the modules are
 * owned here and freed after the loop ends. */
typedef struct ag_main {
  uv_loop_t *loop;
  const char *engine_name;
  char id[80];
  const char *sysroot;      /* FLEETGATE_AGENT_SYSROOT: where /sys and /proc are read */
  uint64_t start_ns;
  ag_rates rates;           /* the real engines' measured rates (the sim keeps its own) */
  ag_sim *sim;
  ag_engine *engine;
  ag_front *front;
  ag_hb *hb;
  pr_curlm *curlm;
  uv_signal_t sigterm, sigint;
  int stopping;
  int draining;             /* the gateway asked to drain */
  int pending;              /* modules still stopping */
} ag_main;

static void usage(FILE *fp) {
  fprintf(fp,
    "usage: fleetgate-agent --engine ENGINE --listen HOST:PORT [options]\n"
    "\n"
    "Fronts the phone's LLM server for the fleetgate gateway. ENGINE is one of:\n"
    "  llama     llama.cpp's llama-server: started from the configured command (and\n"
    "            restarted when it dies), or attached to with --upstream URL\n"
    "  openai    any OpenAI-compatible server at --upstream URL\n"
    "  mnn       MNN's server at --upstream URL, normalised to OpenAI's shapes\n"
    "  sim       a simulated phone answering like llama-server (tests, demos)\n"
    "\n"
    "Common options:\n"
    "  --listen HOST:PORT      where to serve (port 0: any free port)\n"
    "  --id ID                 replica id (default sim-PORT / agent-PORT)\n"
    "  --model NAME            model name to report (sim: required)\n"
    "  --gateway URL           send signed heartbeats to this gateway (with --public-url)\n"
    "  --public-url URL        the URL the gateway reaches this agent at\n"
    "  --gateway-ca FILE       PEM certificates that verify an https gateway (default:\n"
    "                          the system's trust store)\n"
    "  --log-level LEVEL       debug, info, warn or error (default info)\n"
    "  --version, --help\n"
    "\n"
    "Engines llama, openai, mnn:\n"
    "  --config FILE           JSON settings (see docs/agent.md); also FLEETGATE_AGENT_CONFIG\n"
    "  --upstream URL          the engine's HTTP address (llama started by the agent:\n"
    "                          default http://127.0.0.1:8080)\n"
    "  --engine-command PATH   program to start (llama); also FLEETGATE_ENGINE_COMMAND\n"
    "  --engine-arg ARG        one argument for it (repeat); also FLEETGATE_ENGINE_ARGS\n"
    "  --slots N, --n-ctx N    override what the engine reports (mnn: 1 slot)\n"
    "  --measure               measure the engine's rates with a short prompt at start\n"
    "  --tune-threads LIST     llama: try these thread counts (\"2,4,6\") and keep the fastest\n"
    "  --threads-arg OPT       the engine's thread option (default --threads)\n"
    "  --insecure-private-network\n"
    "                          serve without a replica token (only on a private network)\n"
    "\n"
    "Engine sim:\n"
    "  --slots N               requests generated at once (default 1); more wait in a FIFO\n"
    "  --prefill-tps X         prompt tokens read per second, per slot (default 100)\n"
    "  --decode-tps Y          tokens generated per second, per slot (default 10)\n"
    "  --n-ctx N               context size of each slot in tokens (default 4096)\n"
    "  --time-scale K          run K times faster than real time (default 1)\n"
    "  --loading-s S           answer 503 \"Loading model\" for S seconds after start\n"
    "  --fault-plan FILE       misbehave as FILE says (docs/sim.md)\n"
    "  --flavour llama|mnn     imitate llama-server (default) or MNN's quirks\n"
    "  --threads N             accepted for llama-server compatibility, ignored\n"
    "\n"
    "Environment: FLEETGATE_REPLICA_TOKEN is the bearer token every caller must present\n"
    "(the sim then also requires it; a real engine refuses to start without it unless\n"
    "--insecure-private-network); FLEETGATE_FLEET_SECRET signs heartbeats;\n"
    "FLEETGATE_ENGINE_API_KEY is sent to the engine.\n");
}

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

static const char *env_get(const char *name) { return getenv(name); }

static int valid_url(const char *u) {
  return u && (strncmp(u, "http://", 7) == 0 || strncmp(u, "https://", 8) == 0) && strlen(u) < 1024;
}

/* ---- reports ------------------------------------------------------------------------ */

static double uptime_s(const ag_main *m) { return (double)(uv_hrtime() - m->start_ns) / 1e9; }

static void report_sim(void *ud, ag_report *r) {
  ag_main *m = ud;
  ag_sim_stats st;
  ag_sim_get_stats(m->sim, &st);
  r->id = m->id;
  r->engine = "sim";
  r->engine_state = st.down ? "down" : st.loading ? "loading" : "ready";
  r->draining = m->draining;
  r->slots = st.slots;
  r->busy = st.busy;
  r->queued = st.deferred;
  r->n_ctx = st.n_ctx;
  r->models[0] = st.model;
  r->n_models = 1;
  r->rates = st.rates;
  ag_device_read(&r->device, m->sysroot);
  r->uptime_s = uptime_s(m);
  r->requests = st.requests;
  r->n_running = ag_sim_running(m->sim, r->running, AG_REPORT_MAX_SLOTS);
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
  ag_device_read(&r->device, m->sysroot);
  r->uptime_s = uptime_s(m);
  r->requests = ag_front_requests(m->front);
  r->n_running = ag_front_running(m->front, r->running, AG_REPORT_MAX_SLOTS);
}

/* GET /agent/v1/status on the sim's own server. */
static int sim_route(pr_http_req *req, void *ud) {
  ag_main *m = ud;
  if (strcmp(req->path, "/agent/v1/status") != 0) return 0;
  if (strcmp(req->method, "GET") != 0) return 0;
  ag_report r;
  memset(&r, 0, sizeof(r));
  report_sim(m, &r);
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
  m->draining = drain;
  if (m->sim) ag_sim_set_draining(m->sim, drain);
  if (m->front) ag_front_set_draining(m->front, drain);
}

static void on_engine_state(void *ud, ag_engine_state st) {
  ag_main *m = ud;
  (void)st;
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
  if (m->sim) {
    m->pending++;
    ag_sim_stop(m->sim, on_sim_stopped, m);
  }
  if (m->front) {
    m->pending++;
    ag_front_stop(m->front, one_stopped, m);
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

enum {
  OPT_ENGINE = 256, OPT_LISTEN, OPT_MODEL, OPT_SLOTS, OPT_PREFILL, OPT_DECODE, OPT_NCTX,
  OPT_SCALE, OPT_LOADING, OPT_FAULTS, OPT_ID, OPT_GATEWAY, OPT_PUBLIC_URL, OPT_LOG_LEVEL,
  OPT_VERSION, OPT_HELP, OPT_CONFIG, OPT_UPSTREAM, OPT_ENGINE_CMD, OPT_ENGINE_ARG, OPT_MEASURE,
  OPT_TUNE, OPT_THREADS_ARG, OPT_INSECURE, OPT_FLAVOUR, OPT_THREADS, OPT_GATEWAY_CA,
};

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
} cli;

int main(int argc, char **argv) {
  static const struct option opts[] = {
    {"engine", required_argument, NULL, OPT_ENGINE},
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"model", required_argument, NULL, OPT_MODEL},
    {"slots", required_argument, NULL, OPT_SLOTS},
    {"prefill-tps", required_argument, NULL, OPT_PREFILL},
    {"decode-tps", required_argument, NULL, OPT_DECODE},
    {"n-ctx", required_argument, NULL, OPT_NCTX},
    {"time-scale", required_argument, NULL, OPT_SCALE},
    {"loading-s", required_argument, NULL, OPT_LOADING},
    {"fault-plan", required_argument, NULL, OPT_FAULTS},
    {"id", required_argument, NULL, OPT_ID},
    {"gateway", required_argument, NULL, OPT_GATEWAY},
    {"public-url", required_argument, NULL, OPT_PUBLIC_URL},
    {"gateway-ca", required_argument, NULL, OPT_GATEWAY_CA},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"version", no_argument, NULL, OPT_VERSION},
    {"help", no_argument, NULL, OPT_HELP},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"upstream", required_argument, NULL, OPT_UPSTREAM},
    {"engine-command", required_argument, NULL, OPT_ENGINE_CMD},
    {"engine-arg", required_argument, NULL, OPT_ENGINE_ARG},
    {"measure", no_argument, NULL, OPT_MEASURE},
    {"tune-threads", required_argument, NULL, OPT_TUNE},
    {"threads-arg", required_argument, NULL, OPT_THREADS_ARG},
    {"insecure-private-network", no_argument, NULL, OPT_INSECURE},
    {"flavour", required_argument, NULL, OPT_FLAVOUR},
    {"threads", required_argument, NULL, OPT_THREADS},
    {NULL, 0, NULL, 0},
  };
  ag_sim_config sc;
  ag_fault_plan plan = {NULL, 0};
  cli o;
  int64_t n;
  int c, bad = 0;

  memset(&o, 0, sizeof(o));
  pr_log_set_app("fleetgate-agent");
  ag_sim_config_default(&sc);
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    const char *name = optind > 0 && optind <= argc ? argv[optind - 1] : "option";
    switch (c) {
      case OPT_ENGINE: o.engine = optarg; break;
      case OPT_LISTEN: o.listen = optarg; break;
      case OPT_MODEL: o.model = optarg; break;
      case OPT_SLOTS:
        /* ag_sim_config_check reports the range; keep out-of-int values out of it. */
        if (parse_int(name, optarg, &n) < 0) bad = 1;
        else sc.slots = n < 0 ? -1 : n > 1000000 ? 1000000 : (int)n;
        o.slots_set = 1;
        break;
      case OPT_PREFILL: if (parse_double(name, optarg, &sc.prefill_tps) < 0) bad = 1; break;
      case OPT_DECODE: if (parse_double(name, optarg, &sc.decode_tps) < 0) bad = 1; break;
      case OPT_NCTX: if (parse_int(name, optarg, &sc.n_ctx) < 0) bad = 1; o.nctx_set = 1; break;
      case OPT_SCALE: if (parse_double(name, optarg, &sc.time_scale) < 0) bad = 1; break;
      case OPT_LOADING: if (parse_double(name, optarg, &sc.loading_s) < 0) bad = 1; break;
      case OPT_FAULTS: o.fault_file = optarg; break;
      case OPT_ID: o.id = optarg; break;
      case OPT_GATEWAY: o.gateway = optarg; break;
      case OPT_PUBLIC_URL: o.public_url = optarg; break;
      case OPT_GATEWAY_CA: o.gateway_ca = optarg; break;
      case OPT_LOG_LEVEL: {
        int level = pr_log_level_from_name(optarg);
        if (level < 0) {
          fprintf(stderr, "fleetgate-agent: --log-level: expected debug, info, warn or error\n");
          bad = 1;
        } else {
          pr_log_set_level(level);
        }
        break;
      }
      case OPT_VERSION: printf("fleetgate-agent %s\n", FLEETGATE_VERSION); return 0;
      case OPT_HELP: usage(stdout); return 0;
      case OPT_CONFIG: o.config = optarg; break;
      case OPT_UPSTREAM: o.upstream = optarg; break;
      case OPT_ENGINE_CMD: o.command = optarg; break;
      case OPT_ENGINE_ARG:
        if (o.n_args >= AG_ENGINE_MAX_ARGS) {
          fprintf(stderr, "fleetgate-agent: more than %d --engine-arg\n", AG_ENGINE_MAX_ARGS);
          bad = 1;
        } else {
          o.args[o.n_args++] = optarg;
        }
        break;
      case OPT_MEASURE: o.measure = 1; break;
      case OPT_TUNE:
        if (ag_conf_parse_threads(optarg, o.tune, &o.n_tune) < 0) {
          fprintf(stderr, "fleetgate-agent: --tune-threads: expected a list like 2,4,6 (1 - 1024 each, "
                          "at most %d)\n", AG_ENGINE_MAX_TUNE);
          bad = 1;
        }
        break;
      case OPT_THREADS_ARG: o.threads_arg = optarg; break;
      case OPT_INSECURE: o.insecure = 1; break;
      case OPT_FLAVOUR: o.flavour = optarg; break;
      case OPT_THREADS: if (parse_int(name, optarg, &n) < 0) bad = 1; break;
      case ':':
        fprintf(stderr, "fleetgate-agent: %s needs a value\n", name);
        return EXIT_USAGE;
      default:
        fprintf(stderr, "fleetgate-agent: unknown option '%s' (see --help)\n", name);
        return EXIT_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "fleetgate-agent: unexpected argument '%s' (see --help)\n", argv[optind]);
    return EXIT_USAGE;
  }
  if (bad) return 1;

  /* file < environment < command line */
  char err[1200];
  ag_conf conf;
  ag_conf_init(&conf);
  const char *config = o.config ? o.config : getenv("FLEETGATE_AGENT_CONFIG");
  if (config && *config && ag_conf_load_file(&conf, config, err, sizeof(err)) < 0) {
    fprintf(stderr, "fleetgate-agent: %s\n", err);
    ag_conf_free(&conf);
    return 1;
  }
  const char *engine_name = o.engine ? o.engine : conf.engine;
  int is_sim = engine_name && strcmp(engine_name, "sim") == 0;
  if (!is_sim && ag_conf_load_env(&conf, env_get, err, sizeof(err)) < 0) {
    fprintf(stderr, "fleetgate-agent: %s\n", err);
    ag_conf_free(&conf);
    return 1;
  }
#define PICK(field) (o.field ? o.field : conf.field)
  const char *listen = PICK(listen), *id = PICK(id), *model = PICK(model);
  const char *gateway = PICK(gateway), *public_url = PICK(public_url), *gateway_ca = PICK(gateway_ca);
  if (!engine_name) {
    fprintf(stderr, "fleetgate-agent: --engine is required (llama, openai, mnn or sim)\n");
    ag_conf_free(&conf);
    return EXIT_USAGE;
  }
  ag_engine_kind kind = AG_ENGINE_LLAMA;
  if (strcmp(engine_name, "openai") == 0) kind = AG_ENGINE_OPENAI;
  else if (strcmp(engine_name, "mnn") == 0) kind = AG_ENGINE_MNN;
  else if (!is_sim && strcmp(engine_name, "llama") != 0) {
    fprintf(stderr, "fleetgate-agent: unknown engine '%s' (llama, openai, mnn or sim)\n", engine_name);
    ag_conf_free(&conf);
    return 1;
  }
  const char *fail = NULL;
  if ((gateway == NULL) != (public_url == NULL)) fail = "--gateway and --public-url go together";
  else if (gateway && (!valid_url(gateway) || !valid_url(public_url)))
    fail = "--gateway and --public-url must be http:// or https:// URLs";
  else if (gateway_ca && !gateway) fail = "--gateway-ca needs --gateway";
  else if (gateway_ca && access(gateway_ca, R_OK) != 0) fail = "--gateway-ca: cannot read the file";
  else if (id && (strlen(id) == 0 || strlen(id) > 64 || strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != strlen(id)))
    fail = "--id must be 1-64 characters of A-Z a-z 0-9 . _ -";
  const char *secret = getenv("FLEETGATE_FLEET_SECRET");
  if (!fail && gateway && (!secret || strlen(secret) < 16))
    fail = "--gateway needs FLEETGATE_FLEET_SECRET (at least 16 characters) to sign heartbeats";
  if (fail) {
    fprintf(stderr, "fleetgate-agent: %s\n", fail);
    ag_conf_free(&conf);
    return 1;
  }
  const char *token = getenv("FLEETGATE_REPLICA_TOKEN");
  if (token && !*token) token = NULL;

  /* ---- per-engine settings ---- */
  ag_engine_config ec;
  ag_engine_config_default(&ec);
  if (is_sim) {
    sc.listen = listen;
    sc.model = model;
    sc.id = id;
    if (o.flavour && strcmp(o.flavour, "mnn") == 0) sc.flavour = AG_SIM_MNN;
    else if (o.flavour && strcmp(o.flavour, "llama") != 0) fail = "--flavour: expected llama or mnn";
    if (!fail && ag_sim_config_check(&sc, err, sizeof(err)) < 0) fail = err;
    if (!fail && o.fault_file && ag_fault_plan_load(&plan, o.fault_file, err, sizeof(err)) < 0) {
      fprintf(stderr, "fleetgate-agent: invalid fault plan: %s\n", err);
      ag_conf_free(&conf);
      return 1;
    }
    sc.faults = &plan;
    sc.token = token;
  } else {
    ec.kind = kind;
    ec.upstream = PICK(upstream);
    ec.command = PICK(command);
    if (o.n_args) {
      ec.args = o.args;
      ec.n_args = o.n_args;
    } else {
      ec.args = conf.args;
      ec.n_args = conf.n_args;
    }
    ec.threads_arg = o.threads_arg ? o.threads_arg : conf.threads_arg ? conf.threads_arg : "--threads";
    ec.tune_threads = o.n_tune ? o.tune : conf.tune;
    ec.n_tune = o.n_tune ? o.n_tune : conf.n_tune;
    ec.api_key = conf.api_key;
    ec.model = model;
    ec.slots = o.slots_set ? sc.slots : conf.slots;
    ec.n_ctx = o.nctx_set ? sc.n_ctx : conf.n_ctx;
    ec.measure = o.measure || conf.measure == 1;
    if (conf.ready_timeout_s >= 0) ec.ready_timeout_s = conf.ready_timeout_s;
    if (conf.restart_max_s >= 0) ec.restart_max_s = conf.restart_max_s;
    if (conf.stop_timeout_s >= 0) ec.stop_timeout_s = conf.stop_timeout_s;
    int insecure = o.insecure || conf.insecure == 1;
    if (kind == AG_ENGINE_LLAMA && ec.command && !ec.upstream) ec.upstream = "http://127.0.0.1:8080";
    if (!listen) fail = "--listen HOST:PORT is required";
    else if (!ec.upstream) fail = kind == AG_ENGINE_LLAMA ? "--engine llama needs an engine command (--engine-command, "
                                                            "FLEETGATE_ENGINE_COMMAND or the config's \"command\") or --upstream URL"
                                                          : "this engine needs --upstream URL";
    else if (!valid_url(ec.upstream)) fail = "--upstream must be an http:// or https:// URL";
    else if (ec.command && kind != AG_ENGINE_LLAMA) fail = "an engine command is only for --engine llama";
    else if (ec.slots < 0 || ec.slots > 1024) fail = "--slots must be between 1 and 1024";
    else if (ec.n_ctx < 0 || ec.n_ctx > INT32_MAX) fail = "--n-ctx must be between 1 and 2^31-1";
    else if (ec.n_tune && !ec.command) fail = "--tune-threads needs an engine the agent starts (a command)";
    else if (!token && !insecure)
      fail = "FLEETGATE_REPLICA_TOKEN is not set: refusing to serve the engine to anyone who connects "
             "(set it, or pass --insecure-private-network on a private network)";
    if (kind == AG_ENGINE_MNN && ec.slots > 1) ec.slots = 1; /* MNN serialises requests */
  }
  if (fail) {
    fprintf(stderr, "fleetgate-agent: %s\n", fail);
    ag_fault_plan_free(&plan);
    ag_conf_free(&conf);
    return 1;
  }

  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  ag_main m;
  memset(&m, 0, sizeof(m));
  m.loop = uv_default_loop();
  m.engine_name = engine_name;
  m.start_ns = uv_hrtime();
  m.sysroot = getenv("FLEETGATE_AGENT_SYSROOT");
  ag_rates_init(&m.rates);
  int rc = 0, exit_code = 0;
  if (gateway || !is_sim) rc = pr_curlm_new(&m.curlm, m.loop);
  if (rc == 0 && is_sim) {
    sc.route = sim_route;
    sc.route_ud = &m;
    rc = ag_sim_new(&m.sim, m.loop, &sc);
  } else if (rc == 0) {
    rc = ag_engine_new(&m.engine, m.loop, m.curlm, &ec, &m.rates, on_engine_state, &m);
    ag_front_config fc = {listen, token};
    if (rc == 0) rc = ag_front_new(&m.front, m.loop, m.curlm, m.engine, &m.rates, &fc, report_engine, &m);
  }
  ag_fault_plan_free(&plan); /* the sim keeps its own copy */
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
  if (!exit_code) {
    rc = m.sim ? ag_sim_listen(m.sim) : ag_front_listen(m.front);
    if (rc < 0) {
      pr_error("cannot listen on %s: %s", listen, pr_strerror(rc));
      exit_code = 1;
    } else {
      port = m.sim ? ag_sim_port(m.sim) : ag_front_port(m.front);
    }
  }
  if (!exit_code) {
    if (m.sim) snprintf(m.id, sizeof(m.id), "%s", ag_sim_id(m.sim));
    else if (id) snprintf(m.id, sizeof(m.id), "%s", id);
    else snprintf(m.id, sizeof(m.id), "agent-%d", port);
    if (gateway) {
      ag_hb_config hc = {gateway, public_url, secret, gateway_ca};
      rc = ag_hb_new(&m.hb, m.loop, m.curlm, &hc, m.sim ? report_sim : report_engine, on_drain, &m);
      if (rc < 0) {
        pr_error("cannot start heartbeats: %s", pr_strerror(rc));
        exit_code = 1;
      }
    }
  }
  if (!exit_code && m.engine && (rc = ag_engine_start(m.engine)) < 0) {
    pr_error("cannot start the engine: %s", pr_strerror(rc));
    exit_code = 1;
  }
  if (!exit_code) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "engine", engine_name);
    cJSON_AddStringToObject(f, "id", m.id);
    cJSON_AddStringToObject(f, "listen", listen);
    cJSON_AddNumberToObject(f, "port", port);
    if (m.sim) {
      cJSON_AddStringToObject(f, "model", sc.model);
      cJSON_AddStringToObject(f, "flavour", sc.flavour == AG_SIM_MNN ? "mnn" : "llama");
      cJSON_AddNumberToObject(f, "slots", sc.flavour == AG_SIM_MNN ? 1 : sc.slots);
      cJSON_AddNumberToObject(f, "prefill_tps", sc.prefill_tps);
      cJSON_AddNumberToObject(f, "decode_tps", sc.decode_tps);
      cJSON_AddNumberToObject(f, "n_ctx", (double)sc.n_ctx);
      cJSON_AddNumberToObject(f, "time_scale", sc.time_scale);
      cJSON_AddNumberToObject(f, "faults", (double)plan.n);
    } else {
      cJSON_AddStringToObject(f, "upstream", ec.upstream);
      if (ec.command) cJSON_AddStringToObject(f, "command", ec.command);
    }
    if (gateway) cJSON_AddStringToObject(f, "gateway", gateway);
    cJSON_AddBoolToObject(f, "auth", token != NULL);
    pr_log_kv(PR_LOG_INFO, "listening", f);
    if (!token && !m.sim) pr_warn("no replica token: anyone who can connect may use the engine");
    if (m.hb) ag_hb_start(m.hb);
  }
  ag_conf_free(&conf); /* every module copied what it keeps */
  if (exit_code) stop_all(&m);
  uv_run(m.loop, UV_RUN_DEFAULT);
  ag_hb_free(m.hb);
  ag_front_free(m.front);
  ag_engine_free(m.engine);
  ag_sim_free(m.sim);
  rc = uv_loop_close(m.loop);
  curl_global_cleanup();
  if (rc != 0) {
    pr_error("handles left open at exit: %s", uv_strerror(rc));
    return 1;
  }
  pr_info("stopped");
  return exit_code;
}
