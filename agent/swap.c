/* A switch of models for an engine the agent starts; see swap.h. */
#include "swap.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"

#define SWAP_POLL_MS 100
#define SWAP_NAME_MAX 64

enum { SW_NONE = 0, SW_DRAINING, SW_FETCHING, SW_LOADING, SW_RETURNING, SW_FAILED };

struct ag_swap {
  uv_loop_t *loop;
  ag_engine *engine;
  ag_front *front;
  char *models_dir, *self_exe;
  ag_swap_fits_fn fits;
  void (*changed)(void *ud);
  void *ud;
  int gw_drain;                 /* the gateway's own drain */
  int phase;
  char to[SWAP_NAME_MAX + 1], why[320];
  char *url, *sha256;
  int64_t n_ctx;
  char **extra;                 /* the catalogue's engine arguments */
  size_t n_extra;
  char **old_args;              /* what to go back to */
  size_t n_old_args;
  char *old_model;
  unsigned exits;               /* the new engine's exits while loading */
  uint64_t load_deadline;
  uv_timer_t timer;
  uv_process_t fetch;
  uv_pipe_t fetch_err;
  int fetch_open, err_open;     /* handles initialised and not closed */
  char err_tail[400];           /* the download's last line of output */
  char line[400];               /* the line it is writing */
  size_t err_len;
  int handles;
  int stopping;
  void (*on_stopped)(void *arg);
  void *stopped_arg;
};

static const char *const phase_names[] = {NULL, "draining", "fetching", "loading", "loading", "failed"};

static void strv_free(char **v, size_t n) {
  for (size_t i = 0; v && i < n; i++) free(v[i]);
  free(v);
}

static void set_phase(ag_swap *s, int phase) {
  if (s->phase == phase) return;
  s->phase = phase;
  if (s->changed && !s->stopping) s->changed(s->ud);
}

static void drain_front(ag_swap *s, int on) { ag_front_set_draining(s->front, on || s->gw_drain); }

static int valid_name(const char *n) {
  size_t len = strlen(n);
  if (len == 0 || len > SWAP_NAME_MAX || n[0] == '.') return 0;
  for (; *n; n++)
    if (!((*n >= 'a' && *n <= 'z') || (*n >= 'A' && *n <= 'Z') || (*n >= '0' && *n <= '9') ||
          *n == '.' || *n == '_' || *n == '-'))
      return 0;
  return 1;
}

static void model_path(const ag_swap *s, char *out, size_t n) {
  snprintf(out, n, "%s/%s.gguf", s->models_dir, s->to);
}

static void finish(ag_swap *s) {
  uv_timer_stop(&s->timer);
  drain_front(s, 0);
}

/* Back to the model it had: the engine restarts with its old arguments. */
static void fail(ag_swap *s, const char *why) {
  snprintf(s->why, sizeof(s->why), "%s", why);
  if (s->phase == SW_LOADING)
    pr_warn("switch to %s failed: %s; back to %s", s->to, s->why, s->old_model ? s->old_model : "its model");
  else
    pr_warn("switch to %s failed: %s; the engine was not touched", s->to, s->why);
  const char *cur = ag_engine_model(s->engine);
  if (s->phase == SW_LOADING && !(cur && s->old_model && strcmp(cur, s->old_model) == 0)) {
    if (ag_engine_restart_with(s->engine, s->old_model, (const char *const *)s->old_args, s->n_old_args) == 0) {
      set_phase(s, SW_RETURNING);
      s->load_deadline = uv_now(s->loop) + AG_SWAP_LOAD_TIMEOUT_MS;
      return; /* reported as failed once it answers again */
    }
  }
  finish(s);
  set_phase(s, SW_FAILED);
}

/* The engine's arguments for the new model: -m/--model is the new file, the context is
 * the catalogue's (× the slots), the catalogue's arguments last. */
static int load(ag_swap *s) {
  char path[4200];
  model_path(s, path, sizeof(path));
  size_t n_old;
  const char *const *old = ag_engine_args(s->engine, &n_old);
  const char *args[AG_ENGINE_MAX_ARGS];
  size_t n = 0;
  int have_m = 0;
  long parallel = 1;
  char ctx[32];
  for (size_t i = 0; i < n_old && n + 2 < AG_ENGINE_MAX_ARGS; i++) {
    const char *a = old[i];
    int takes = i + 1 < n_old;
    if (takes && (!strcmp(a, "-np") || !strcmp(a, "--parallel"))) parallel = strtol(old[i + 1], NULL, 10);
    if (takes && (!strcmp(a, "-m") || !strcmp(a, "--model"))) {
      args[n++] = a;
      args[n++] = path;
      have_m = 1;
      i++;
    } else if (takes && (!strcmp(a, "-a") || !strcmp(a, "--alias"))) {
      args[n++] = a; /* the engine names the model it serves as the gateway does */
      args[n++] = s->to;
      i++;
    } else if (takes && s->n_ctx > 0 && (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))) {
      i++; /* the catalogue's, below */
    } else {
      args[n++] = a;
    }
  }
  if (!have_m && n + 2 < AG_ENGINE_MAX_ARGS) {
    args[n++] = "-m";
    args[n++] = path;
  }
  if (s->n_ctx > 0 && n + 2 < AG_ENGINE_MAX_ARGS) {
    snprintf(ctx, sizeof(ctx), "%lld", (long long)s->n_ctx * (parallel > 0 ? parallel : 1));
    args[n++] = "--ctx-size";
    args[n++] = ctx;
  }
  for (size_t i = 0; i < s->n_extra && n < AG_ENGINE_MAX_ARGS; i++) args[n++] = s->extra[i];
  s->exits = 0;
  s->load_deadline = uv_now(s->loop) + AG_SWAP_LOAD_TIMEOUT_MS;
  int rc = ag_engine_restart_with(s->engine, s->to, args, n);
  if (rc < 0) return rc;
  pr_info("switch: the engine restarts with %s (%s)", s->to, path);
  set_phase(s, SW_LOADING);
  return 0;
}

static void fetch_err_closed(uv_handle_t *h) {
  ag_swap *s = h->data;
  s->err_open = 0;
  s->handles--;
  if (s->stopping && s->handles == 0 && s->on_stopped) s->on_stopped(s->stopped_arg);
}

static void fetch_closed(uv_handle_t *h) {
  ag_swap *s = h->data;
  s->fetch_open = 0;
  s->handles--;
  if (s->stopping && s->handles == 0 && s->on_stopped) s->on_stopped(s->stopped_arg);
}

static void err_alloc(uv_handle_t *h, size_t want, uv_buf_t *buf) {
  (void)h;
  static char b[1024];
  (void)want;
  *buf = uv_buf_init(b, sizeof(b));
}

/* Keep the download's last line of output: why it failed. */
static void err_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  ag_swap *s = st->data;
  if (n < 0) {
    if (s->err_open) uv_close((uv_handle_t *)&s->fetch_err, fetch_err_closed);
    return;
  }
  for (ssize_t i = 0; i < n; i++) {
    char c = buf->base[i];
    if (c == '\n' || c == '\r') {
      if (s->err_len) {
        s->line[s->err_len] = 0;
        memcpy(s->err_tail, s->line, s->err_len + 1);
      }
      s->err_len = 0;
    } else if (s->err_len + 1 < sizeof(s->line)) {
      s->line[s->err_len++] = c >= ' ' && c <= '~' ? c : '?';
    }
  }
}

static void fetch_exit(uv_process_t *p, int64_t status, int sig) {
  ag_swap *s = p->data;
  uv_close((uv_handle_t *)p, fetch_closed);
  if (s->stopping || s->phase != SW_FETCHING) return;
  if (status == 0 && sig == 0) {
    if (load(s) < 0) fail(s, "cannot restart the engine");
    return;
  }
  char why[440]; /* cut to 320 in s->why */
  snprintf(why, sizeof(why), "the download failed: %s", s->err_tail[0] ? s->err_tail : "fetch exited");
  fail(s, why);
}

static void start_fetch(ag_swap *s) {
  char path[4200];
  model_path(s, path, sizeof(path));
  char *argv[] = {s->self_exe, "fetch", "--tries", "3", s->url, s->sha256, path, NULL};
  uv_pipe_init(s->loop, &s->fetch_err, 0);
  s->fetch_err.data = s;
  s->err_open = 1;
  s->handles++;
  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_IGNORE;
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&s->fetch_err;
  uv_process_options_t o;
  memset(&o, 0, sizeof(o));
  o.file = s->self_exe;
  o.args = argv;
  o.exit_cb = fetch_exit;
  o.stdio = stdio;
  o.stdio_count = 3;
  s->fetch.data = s;
  s->err_len = 0;
  s->err_tail[0] = 0;
  int rc = uv_spawn(s->loop, &s->fetch, &o);
  s->fetch_open = 1;
  s->handles++;
  if (rc < 0) {
    uv_close((uv_handle_t *)&s->fetch, fetch_closed);
    uv_close((uv_handle_t *)&s->fetch_err, fetch_err_closed);
    char why[200];
    snprintf(why, sizeof(why), "cannot start the download: %s", uv_strerror(rc));
    fail(s, why);
    return;
  }
  uv_read_start((uv_stream_t *)&s->fetch_err, err_alloc, err_read);
  pr_info("switch: downloading %s to %s", s->url, path);
  set_phase(s, SW_FETCHING);
}

static void tick(uv_timer_t *t) {
  ag_swap *s = t->data;
  if (s->phase == SW_DRAINING) {
    if (ag_front_inflight(s->front) > 0) return; /* running requests finish */
    char path[4200];
    model_path(s, path, sizeof(path));
    struct stat st;
    if (s->url && s->sha256) {
      start_fetch(s); /* a file already there with the digest is kept as is */
    } else if (stat(path, &st) == 0) {
      if (load(s) < 0) fail(s, "cannot restart the engine");
    } else {
      char why[300];
      snprintf(why, sizeof(why), "it does not hold %s and the gateway gave no url to download it from", s->to);
      fail(s, why);
    }
  } else if ((s->phase == SW_LOADING || s->phase == SW_RETURNING) && uv_now(s->loop) > s->load_deadline) {
    if (s->phase == SW_LOADING) {
      fail(s, "the engine did not answer with the model within 10 minutes");
    } else {
      finish(s);
      set_phase(s, SW_FAILED);
    }
  }
}

void ag_swap_engine_state(ag_swap *s, ag_engine_state st) {
  if (s->phase == SW_LOADING) {
    if (st == AG_ENGINE_READY) {
      pr_info("switch: the engine serves %s", s->to);
      finish(s);
      set_phase(s, SW_NONE);
    } else if (st == AG_ENGINE_DOWN && ++s->exits >= 2) {
      char why[300];
      snprintf(why, sizeof(why), "the engine exited twice loading %s", s->to);
      fail(s, why);
    }
  } else if (s->phase == SW_RETURNING && st == AG_ENGINE_READY) {
    finish(s);
    set_phase(s, SW_FAILED);
  }
}

static void cancel_fetch(ag_swap *s) {
  if (s->fetch_open && s->phase == SW_FETCHING) uv_process_kill(&s->fetch, SIGTERM);
}

void ag_swap_place(ag_swap *s, const ag_place *p) {
  if (s->stopping) return;
  if (!p) {
    if (s->phase == SW_FAILED) {
      s->phase = SW_NONE; /* the gateway heard it */
    } else if (s->phase == SW_DRAINING || s->phase == SW_FETCHING) {
      cancel_fetch(s); /* the gateway gave it up */
      s->phase = SW_NONE;
      finish(s);
      if (s->changed) s->changed(s->ud);
    }
    return;
  }
  if (s->phase == SW_LOADING || s->phase == SW_RETURNING || s->phase == SW_FETCHING) return;
  const char *cur = ag_engine_model(s->engine);
  if (s->phase != SW_NONE && strcmp(s->to, p->model) == 0) return;
  if (s->phase == SW_NONE && cur && strcmp(cur, p->model) == 0) return;
  snprintf(s->to, sizeof(s->to), "%s", p->model);
  s->why[0] = 0;
  if (!valid_name(p->model)) {
    s->phase = SW_DRAINING; /* for fail's report */
    fail(s, "the model's name cannot name a file (A-Z a-z 0-9 . _ -)");
    return;
  }
  /* one it cannot hold is refused before anything is drained or downloaded */
  char unfit[320];
  if (s->fits && !s->fits(s->ud, p, unfit, sizeof(unfit))) {
    s->phase = SW_DRAINING; /* for fail's report */
    fail(s, unfit); /* told to the gateway at once (changed) */
    return;
  }
  free(s->url);
  free(s->sha256);
  s->url = p->url ? strdup(p->url) : NULL;
  s->sha256 = p->sha256 ? strdup(p->sha256) : NULL;
  s->n_ctx = p->n_ctx;
  strv_free(s->extra, s->n_extra);
  s->extra = calloc(p->n_engine_args + 1, sizeof(char *));
  s->n_extra = 0;
  for (size_t i = 0; s->extra && i < p->n_engine_args; i++)
    if ((s->extra[s->n_extra] = strdup(p->engine_args[i]))) s->n_extra++;
  /* what to go back to */
  size_t n;
  const char *const *args = ag_engine_args(s->engine, &n);
  strv_free(s->old_args, s->n_old_args);
  s->old_args = calloc(n + 1, sizeof(char *));
  s->n_old_args = 0;
  for (size_t i = 0; s->old_args && i < n; i++)
    if ((s->old_args[s->n_old_args] = strdup(args[i]))) s->n_old_args++;
  free(s->old_model);
  s->old_model = cur ? strdup(cur) : NULL;
  pr_info("switch: from %s to %s: draining", cur ? cur : "?", s->to);
  drain_front(s, 1);
  set_phase(s, SW_DRAINING);
  uv_timer_start(&s->timer, tick, SWAP_POLL_MS, SWAP_POLL_MS);
}

void ag_swap_gateway_drain(ag_swap *s, int drain) {
  s->gw_drain = drain;
  drain_front(s, s->phase == SW_DRAINING || s->phase == SW_FETCHING || s->phase == SW_LOADING ||
                     s->phase == SW_RETURNING);
}

void ag_swap_get(const ag_swap *s, const char **to, const char **phase, const char **why) {
  *to = s->phase ? s->to : NULL;
  *phase = phase_names[s->phase];
  *why = s->phase == SW_FAILED ? s->why : NULL;
}

int ag_swap_new(ag_swap **out, uv_loop_t *loop, ag_engine *engine, ag_front *front,
                const char *models_dir, const char *self_exe, ag_swap_fits_fn fits,
                void (*changed)(void *ud), void *ud) {
  ag_swap *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  s->loop = loop;
  s->engine = engine;
  s->front = front;
  s->models_dir = strdup(models_dir);
  s->self_exe = strdup(self_exe);
  s->fits = fits;
  s->changed = changed;
  s->ud = ud;
  if (!s->models_dir || !s->self_exe) {
    ag_swap_free(s);
    return -ENOMEM;
  }
  uv_timer_init(loop, &s->timer);
  s->timer.data = s;
  s->handles = 1;
  *out = s;
  return 0;
}

static void timer_closed(uv_handle_t *h) {
  ag_swap *s = h->data;
  s->handles--;
  if (s->handles == 0 && s->on_stopped) s->on_stopped(s->stopped_arg);
}

void ag_swap_stop(ag_swap *s, void (*on_stopped)(void *arg), void *arg) {
  if (s->stopping) return;
  s->stopping = 1;
  s->on_stopped = on_stopped;
  s->stopped_arg = arg;
  if (s->fetch_open) uv_process_kill(&s->fetch, SIGTERM);
  uv_close((uv_handle_t *)&s->timer, timer_closed);
}

void ag_swap_free(ag_swap *s) {
  if (!s) return;
  free(s->models_dir);
  free(s->self_exe);
  free(s->url);
  free(s->sha256);
  free(s->old_model);
  strv_free(s->extra, s->n_extra);
  strv_free(s->old_args, s->n_old_args);
  free(s);
}
