/* The admin listener (config "admin"): the status page at /, /metrics in Prometheus
 * text, /healthz, and the JSON admin API under /admin/v1/ (replicas, drain and enable,
 * reload, queue, events), all but the health endpoints behind the admin token. A
 * one-second timer takes the metrics samples and pushes snapshots to the status page's
 * stream. The gw_admin is owned by the gw_server (gw->admin), as are gw->metrics and
 * gw->events, which gw_admin_init creates; gw_admin_free releases all three after the
 * loop has closed the handles (gw_admin_close). */
#ifndef GW_ADMIN_H
#define GW_ADMIN_H

#include "gw.h"

/* Create gw->admin, gw->metrics and gw->events and start the timer. */
int gw_admin_init(gw_server *gw);
/* Open (or keep, when its address is unchanged) the listener conf asks for, without
 * switching to it yet: gw_admin_commit switches (the old listener closes once its
 * requests are answered), gw_admin_abort undoes. Returns 0 or a negative code. */
int gw_admin_prepare(gw_server *gw, const gw_config *conf);
void gw_admin_commit(gw_server *gw);
void gw_admin_abort(gw_server *gw);
/* A reload ran (server.c): rc 0 with `changes`, or the refusal's errors. Counted in the
 * metrics and recorded as an event. */
void gw_admin_reloaded(gw_server *gw, const char *why, int rc, const char *errors, const cJSON *changes);
/* Shutdown, first step: stop accepting, end the event streams, close idle connections. */
void gw_admin_shutdown(gw_server *gw);
/* Shutdown, last step: close the listeners and the timer. */
void gw_admin_close(gw_server *gw);
void gw_admin_free(gw_server *gw);

/* The status page (statuspage.c): answer GET / with the page compiled into the binary. */
void gw_statuspage_serve(pr_http_req *req);

#endif
