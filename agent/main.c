/* fleetgate-agent: the daemon beside the LLM server on each phone. Today it runs the
 * simulated phone (--engine sim); the llama/mnn/openai adapters and heartbeats come
 * later. This file only reads the command line and runs the loop. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "err.h"
#include "faults.h"
#include "log.h"
#include "sim.h"

#define EXIT_USAGE 2

/* The process: its loop, its sim, and the signals that stop it. Lives on main's stack. */
typedef struct ag_main {
  uv_loop_t *loop;
  ag_sim *sim;
  uv_signal_t sigterm, sigint;
  int stopping;
} ag_main;

static void usage(FILE *fp) {
  fprintf(fp,
    "usage: fleetgate-agent --engine sim --listen HOST:PORT --model NAME [options]\n"
    "\n"
    "A simulated phone that answers like llama.cpp's llama-server.\n"
    "\n"
    "  --engine sim            the engine to front; only the simulator exists so far\n"
    "  --listen HOST:PORT      where to serve (port 0: any free port)\n"
    "  --model NAME            the model name to serve\n"
    "  --slots N               requests generated at once (default 1); more wait in a FIFO\n"
    "  --prefill-tps X         prompt tokens read per second, per slot (default 100)\n"
    "  --decode-tps Y          tokens generated per second, per slot (default 10)\n"
    "  --n-ctx N               context size of each slot in tokens (default 4096)\n"
    "  --time-scale K          run K times faster than real time (default 1)\n"
    "  --loading-s S           answer 503 \"Loading model\" for S seconds after start\n"
    "  --fault-plan FILE       misbehave as FILE says (see below)\n"
    "  --id ID                 replica id, sent as system_fingerprint (default sim-PORT)\n"
    "  --gateway URL           gateway to send heartbeats to (with --public-url)\n"
    "  --public-url URL        the URL the gateway reaches this agent at\n"
    "  --log-level LEVEL       debug, info, warn or error (default info)\n"
    "  --version, --help\n"
    "\n"
    "Prompt tokens are counted as characters / 4. Prefill takes uncached prompt tokens /\n"
    "prefill-tps seconds, then one token comes every 1/decode-tps seconds.\n"
    "\n"
    "A fault plan is a JSON list of {\"at_s\": T, \"kind\": K, \"dur_s\": D}: from T to T+D\n"
    "seconds after start the phone is 'offline' (listener closed, connections reset),\n"
    "'hang's (requests never answered), answers 'error503', is 'slow' (5x), or 'drop's\n"
    "streams after a few tokens. All times, like --loading-s, are simulated seconds:\n"
    "they are divided by --time-scale.\n"
    "\n"
    "FLEETGATE_REPLICA_TOKEN, when set, is the bearer token every request but\n"
    "GET /health must carry.\n");
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

static void on_sim_stopped(ag_sim *sim, void *ud) {
  (void)sim;
  ag_main *m = ud;
  uv_close((uv_handle_t *)&m->sigterm, NULL);
  uv_close((uv_handle_t *)&m->sigint, NULL);
}

static void on_signal(uv_signal_t *h, int signum) {
  ag_main *m = h->data;
  if (m->stopping) return;
  m->stopping = 1;
  pr_info("signal %d: stopping", signum);
  ag_sim_stop(m->sim, on_sim_stopped, m);
}

enum {
  OPT_ENGINE = 256, OPT_LISTEN, OPT_MODEL, OPT_SLOTS, OPT_PREFILL, OPT_DECODE, OPT_NCTX,
  OPT_SCALE, OPT_LOADING, OPT_FAULTS, OPT_ID, OPT_GATEWAY, OPT_PUBLIC_URL, OPT_LOG_LEVEL,
  OPT_VERSION, OPT_HELP,
};

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
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"version", no_argument, NULL, OPT_VERSION},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
  };
  ag_sim_config cfg;
  ag_fault_plan plan = {NULL, 0};
  const char *engine = NULL, *fault_file = NULL, *gateway = NULL, *public_url = NULL;
  int64_t n;
  int c, bad = 0;

  pr_log_set_app("fleetgate-agent");
  ag_sim_config_default(&cfg);
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    const char *name = optind > 0 && optind <= argc ? argv[optind - 1] : "option";
    switch (c) {
      case OPT_ENGINE: engine = optarg; break;
      case OPT_LISTEN: cfg.listen = optarg; break;
      case OPT_MODEL: cfg.model = optarg; break;
      case OPT_SLOTS:
        /* ag_sim_config_check reports the range; keep out-of-int values out of it. */
        if (parse_int(name, optarg, &n) < 0) bad = 1;
        else cfg.slots = n < 0 ? -1 : n > 1000000 ? 1000000 : (int)n;
        break;
      case OPT_PREFILL: if (parse_double(name, optarg, &cfg.prefill_tps) < 0) bad = 1; break;
      case OPT_DECODE: if (parse_double(name, optarg, &cfg.decode_tps) < 0) bad = 1; break;
      case OPT_NCTX: if (parse_int(name, optarg, &cfg.n_ctx) < 0) bad = 1; break;
      case OPT_SCALE: if (parse_double(name, optarg, &cfg.time_scale) < 0) bad = 1; break;
      case OPT_LOADING: if (parse_double(name, optarg, &cfg.loading_s) < 0) bad = 1; break;
      case OPT_FAULTS: fault_file = optarg; break;
      case OPT_ID: cfg.id = optarg; break;
      case OPT_GATEWAY: gateway = optarg; break;
      case OPT_PUBLIC_URL: public_url = optarg; break;
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
  if (!engine) {
    fprintf(stderr, "fleetgate-agent: --engine is required (only 'sim' is available)\n");
    return EXIT_USAGE;
  }
  if (strcmp(engine, "sim") != 0) {
    fprintf(stderr, "fleetgate-agent: engine '%s' is not available yet (only 'sim')\n", engine);
    return 1;
  }
  if ((gateway == NULL) != (public_url == NULL)) {
    fprintf(stderr, "fleetgate-agent: --gateway and --public-url go together\n");
    return 1;
  }
  char err[600];
  if (ag_sim_config_check(&cfg, err, sizeof(err)) < 0) {
    fprintf(stderr, "fleetgate-agent: %s\n", err);
    return 1;
  }
  if (fault_file && ag_fault_plan_load(&plan, fault_file, err, sizeof(err)) < 0) {
    fprintf(stderr, "fleetgate-agent: invalid fault plan: %s\n", err);
    return 1;
  }
  cfg.faults = &plan;
  const char *token = getenv("FLEETGATE_REPLICA_TOKEN");
  cfg.token = token && *token ? token : NULL;

  signal(SIGPIPE, SIG_IGN);
  ag_main m;
  memset(&m, 0, sizeof(m));
  m.loop = uv_default_loop();
  int rc = ag_sim_new(&m.sim, m.loop, &cfg);
  ag_fault_plan_free(&plan); /* the sim keeps its own copy */
  if (rc < 0) {
    pr_error("cannot start the simulator: %s", pr_strerror(rc));
    return 1;
  }
  uv_signal_init(m.loop, &m.sigterm);
  uv_signal_init(m.loop, &m.sigint);
  m.sigterm.data = m.sigint.data = &m;
  uv_signal_start(&m.sigterm, on_signal, SIGTERM);
  uv_signal_start(&m.sigint, on_signal, SIGINT);

  int exit_code = 0;
  rc = ag_sim_listen(m.sim);
  if (rc < 0) {
    pr_error("cannot listen on %s: %s", cfg.listen, pr_strerror(rc));
    exit_code = 1;
    m.stopping = 1;
    ag_sim_stop(m.sim, on_sim_stopped, &m);
  } else {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "engine", "sim");
    cJSON_AddStringToObject(f, "id", ag_sim_id(m.sim));
    cJSON_AddStringToObject(f, "listen", cfg.listen);
    cJSON_AddNumberToObject(f, "port", ag_sim_port(m.sim));
    cJSON_AddStringToObject(f, "model", cfg.model);
    cJSON_AddNumberToObject(f, "slots", cfg.slots);
    cJSON_AddNumberToObject(f, "prefill_tps", cfg.prefill_tps);
    cJSON_AddNumberToObject(f, "decode_tps", cfg.decode_tps);
    cJSON_AddNumberToObject(f, "n_ctx", (double)cfg.n_ctx);
    cJSON_AddNumberToObject(f, "time_scale", cfg.time_scale);
    cJSON_AddNumberToObject(f, "faults", (double)plan.n);
    cJSON_AddBoolToObject(f, "auth", cfg.token != NULL);
    pr_log_kv(PR_LOG_INFO, "listening", f);
    if (gateway)
      pr_warn("--gateway %s given: heartbeats are not sent yet (the gateway must list this "
              "replica, %s, in its config)", gateway, public_url);
  }
  uv_run(m.loop, UV_RUN_DEFAULT);
  ag_sim_free(m.sim);
  rc = uv_loop_close(m.loop);
  if (rc != 0) {
    pr_error("handles left open at exit: %s", uv_strerror(rc));
    return 1;
  }
  pr_info("stopped");
  return exit_code;
}
