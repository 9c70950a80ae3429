/* The agent's settings for the real engines, from three places in rising precedence:
 * a JSON file (--config FILE, or FLEETGATE_AGENT_CONFIG), environment variables (how
 * phone deployments pass settings: FLEETGATE_ENGINE_COMMAND, FLEETGATE_ENGINE_ARGS,
 * FLEETGATE_ENGINE_UPSTREAM, FLEETGATE_ENGINE_API_KEY), and the command line (applied
 * by main.c over what these functions load). See docs/agent.md. */
#ifndef AG_CONF_H
#define AG_CONF_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* Everything a file or the environment can set. Strings point into `store` (owned):
 * ag_conf_free releases them. Unset values are NULL / -1 / 0. */
typedef struct ag_conf {
  const char *engine, *listen, *id, *model, *gateway, *public_url, *gateway_ca;
  const char *upstream, *command, *threads_arg, *api_key;
  const char *models_dir;   /* where model files live (hold.h) */
  const char *args[AG_ENGINE_MAX_ARGS];
  size_t n_args;
  int args_set;             /* args given (possibly empty) */
  int tune[AG_ENGINE_MAX_TUNE];
  size_t n_tune;
  int measure;              /* -1 unset, 0, 1 */
  int insecure;             /* -1 unset, 0, 1 */
  int slots;                /* 0 unset */
  int64_t n_ctx;            /* 0 unset */
  double ready_timeout_s, restart_max_s, stop_timeout_s; /* < 0 unset */
  char **store;             /* owned strings */
  size_t n_store, cap_store;
} ag_conf;

void ag_conf_init(ag_conf *c);
void ag_conf_free(ag_conf *c);
/* Load a JSON object file; unknown keys and wrong types are errors naming the file and
 * the key (a syntax error names line and column). 0 or a negative code with err set. */
int ag_conf_load_file(ag_conf *c, const char *path, char *err, size_t errn);
/* Apply FLEETGATE_ENGINE_* variables from `getenv_fn` (getenv in the daemon). */
int ag_conf_load_env(ag_conf *c, const char *(*getenv_fn)(const char *), char *err, size_t errn);

/* Split a command line the way a POSIX shell splits words: blanks separate, single
 * quotes keep everything, double quotes keep all but \" and \\, a backslash escapes
 * one character. Returns the number of words (copies kept in c's store), or -EINVAL
 * (unterminated quote) / PR_ETOOLARGE (more than max words). */
int ag_conf_split(ag_conf *c, const char *s, const char **out, size_t max);
/* Whether a replica token is fit to guard a phone: at least AG_CONF_TOKEN_MIN characters
 * of visible ASCII (no spaces: a bearer token ends at the header's end and surrounding
 * blanks are dropped), not one character repeated, and not a placeholder from examples
 * ("changeme", "REPLACE_WITH_A_LONG_RANDOM_TOKEN", ...: any case). 0, or -EINVAL with
 * what is wrong in why. */
#define AG_CONF_TOKEN_MIN 16
int ag_conf_check_token(const char *token, char *why, size_t whyn);
/* "2,4,6" → {2,4,6}: 1 to AG_ENGINE_MAX_TUNE counts, each 1 – 1024. */
int ag_conf_parse_threads(const char *s, int *out, size_t *n);
/* Copy a string into c's store. NULL on ENOMEM. */
const char *ag_conf_keep(ag_conf *c, const char *s, size_t len);

/* The secrets the agent reads from its environment (FLEETGATE_FLEET_SECRET,
 * FLEETGATE_REPLICA_TOKEN, FLEETGATE_AGENT_KEY, FLEETGATE_TUNNEL_KEY,
 * FLEETGATE_ENGINE_API_KEY), taken out of it at start so that no process the agent
 * starts (the engine) inherits them. Values are owned copies; NULL: not set. */
#define AG_SECRETS_N 5
typedef struct ag_secrets {
  char *value[AG_SECRETS_N];
} ag_secrets;

/* Copy each secret variable's value out of the process environment, overwrite the value
 * where it was (so /proc/PID/environ no longer shows it either) and unset the variable.
 * Every secret is handled even after an error. 0, or -ENOMEM (a secret is then unset
 * but not kept). */
int ag_secrets_take(ag_secrets *s);
/* A taken secret by its variable's name; NULL when the name is no secret or was unset. */
const char *ag_secrets_get(const ag_secrets *s, const char *name);
/* Whether an environment entry ("NAME=value") is one of the secret variables. */
int ag_secrets_is_secret_entry(const char *entry);
/* Wipe and free the copies. */
void ag_secrets_free(ag_secrets *s);

#endif
