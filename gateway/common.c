/* Small pieces every part of the gateway uses and that call nothing of it: failure
 * names, the request id, errno classes, descriptor budgets, and the "plan soon" request
 * (whose pass job.c registers). Keeping them here keeps the modules above from calling
 * each other in a cycle (docs/core.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gw.h"
#include "json.h"
#include "log.h"
#include "privfile.h"

const char *gw_fail_name(gw_fail_kind k) {
  switch (k) {
    case GW_FAIL_NONE: return "none";
    case GW_FAIL_CONNECT: return "connect";
    case GW_FAIL_TIMEOUT: return "timeout";
    case GW_FAIL_STATUS: return "status";
    case GW_FAIL_LOADING: return "loading";
    case GW_FAIL_PROTOCOL: return "protocol";
    case GW_FAIL_CUT: return "cut";
    case GW_FAIL_LOCAL: return "local";
    case GW_FAIL_DOWN: return "down";
    case GW_FAIL_SLOW: return "slow";
    case GW_FAIL_COUNT: break;
  }
  return "unknown";
}

void gw_request_id(gw_server *gw, const pr_http_req *req, char *out, size_t n) {
  const char *given = req ? pr_http_header_get(req, "x-request-id") : NULL;
  if (given && *given && strlen(given) < n) {
    int ok = 1;
    for (const char *p = given; *p; p++)
      if (*p < 0x21 || *p > 0x7e || *p == '"' || *p == '\\') ok = 0;
    if (ok) {
      snprintf(out, n, "%s", given);
      return;
    }
  }
  snprintf(out, n, "req-%s%08llx", gw->id_prefix, (unsigned long long)++gw->next_id);
}

int gw_local_errno(int e) {
  return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM || e == EADDRNOTAVAIL;
}

size_t gw_idle_conn_cap(uint64_t nofile, size_t phones) {
  uint64_t n = nofile / 64;
  n = n < 4 ? 4 : n > 1024 ? 1024 : n;
  uint64_t fleet = (uint64_t)phones + phones / 8, most = nofile / 3;
  if (fleet > most) fleet = most;
  return (size_t)(fleet > n ? fleet : n);
}

size_t gw_idle_conn_per_host(uint64_t nofile, size_t phones) {
  size_t cap = gw_idle_conn_cap(nofile, phones), each = phones ? cap / phones : cap;
  return each ? each : 1;
}

size_t gw_conn_budget(uint64_t nofile, size_t phones) {
  uint64_t reserve = 32 + gw_idle_conn_cap(nofile, phones);
  return nofile > reserve + 2 ? (size_t)((nofile - reserve) / 2) : 1;
}

/* The pass itself is job.c's (gw_jobs_init registers it as the idle callback). */
void gw_plan_soon(gw_server *gw) {
  if (gw->plan_pending || uv_is_closing((uv_handle_t *)&gw->plan_idle)) return;
  gw->plan_pending = 1;
  uv_idle_start(&gw->plan_idle, gw->plan_cb);
}

void gw_defer_forget(gw_server *gw, gw_defer *d) {
  if (!d->queued) return;
  if (d->prev) d->prev->next = d->next;
  else gw->defer_head = d->next;
  if (d->next) d->next->prev = d->prev;
  else gw->defer_tail = d->prev;
  d->next = d->prev = NULL;
  d->queued = 0;
}

int gw_fleet_subscribe(gw_server *gw, unsigned mask, gw_fleet_fn fn, void *ud) {
  if (gw->subs.n_fleet >= GW_FLEET_SUBSCRIBERS) return -ENOSPC;
  gw->subs.fleet[gw->subs.n_fleet].fn = fn;
  gw->subs.fleet[gw->subs.n_fleet].ud = ud;
  gw->subs.fleet[gw->subs.n_fleet].mask = mask;
  gw->subs.n_fleet++;
  return 0;
}

void gw_fleet_publish(gw_server *gw, const gw_fleet_event *ev) {
  unsigned bit = GW_FLEET_MASK(ev->kind);
  for (int i = 0; i < gw->subs.n_fleet; i++)
    if (gw->subs.fleet[i].mask & bit) gw->subs.fleet[i].fn(gw, ev, gw->subs.fleet[i].ud);
}

int gw_jobs_subscribe(gw_server *gw, gw_job_ended_fn fn, void *ud) {
  if (gw->subs.n_jobs >= GW_JOB_SUBSCRIBERS) return -ENOSPC;
  gw->subs.jobs[gw->subs.n_jobs].fn = fn;
  gw->subs.jobs[gw->subs.n_jobs].ud = ud;
  gw->subs.n_jobs++;
  return 0;
}

void gw_jobs_publish(gw_server *gw, const gw_job_ended *ev) {
  for (int i = 0; i < gw->subs.n_jobs; i++) gw->subs.jobs[i].fn(gw, ev, gw->subs.jobs[i].ud);
}

int gw_datafile_load(const char *path, size_t cap, int depth, cJSON **out, pr_json_err *err) {
  *out = NULL;
  pr_json_err own;
  if (!err) err = &own;
  memset(err, 0, sizeof(*err));
  unsigned was = 0;
  if (pr_privfile_keep(path, 0, &was) == 1)
    pr_warn("%s could be read by others (mode %04o): now 0600", path, was);
  FILE *f = fopen(path, "re");
  if (!f) return 0; /* none kept yet */
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size >= cap) {
    fclose(f);
    return -EBADMSG; /* not a size the file can have */
  }
  size_t want = (size_t)st.st_size;
  char *buf = malloc(want ? want : 1);
  if (!buf) {
    fclose(f);
    return -ENOMEM;
  }
  size_t n = fread(buf, 1, want, f);
  fclose(f);
  *out = pr_json_parse(buf, n, depth, err);
  free(buf);
  return *out ? 0 : -EBADMSG;
}
