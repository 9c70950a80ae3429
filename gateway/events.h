/* Recent events for the people who run the fleet: a bounded ring of what happened
 * (replica state changes, reloads applied or refused, admin actions), each a small JSON
 * object with a growing id, and the server-sent-event subscribers that receive them
 * live: /admin/v1/events streams and the status page's stream, which also gets the
 * snapshots admin.c pushes. The gw_events is owned by the gw_server (gw->events); each
 * subscriber is owned by it until its client goes away (on_abort) or its stream is ended
 * (gw_events_close_all at shutdown, a retired listener, a client too slow to keep up). */
#ifndef GW_EVENTS_H
#define GW_EVENTS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "gw.h"

#define GW_EVENTS_KEEP 256          /* events remembered */
#define GW_EVENTS_MAX_SUBSCRIBERS 64

/* Subscriber kinds */
enum {
  GW_SUB_EVENTS = 1, /* /admin/v1/events: "event: <type>" for each event */
  GW_SUB_STATUS = 2, /* the status page: "event: fleet" for each event, and snapshots */
};

gw_events *gw_events_new(void);
/* Frees the ring; every subscriber must have been ended (gw_events_close_all). */
void gw_events_free(gw_events *ev);

/* Record an event and send it to the subscribers. `fields` (an object, may be NULL) is
 * taken over; "id", "ts", "time_ms", "type" and "message" are added. */
void gw_events_add(gw_server *gw, const char *type, const char *message, cJSON *fields);
/* Hooks: a replica's displayed state changed (registry.c); a reload ran (server.c):
 * rc 0 with `changes`, or the refusal's errors. */
void gw_events_replica_state(gw_server *gw, const gw_replica *r, const char *from, const char *to);
/* The event stream as a fleet subscriber: state changes become replica_state events. */
void gw_events_on_fleet(gw_server *gw, const gw_fleet_event *ev, void *ud);
void gw_events_reload(gw_server *gw, const char *why, int rc, const char *errors, const cJSON *changes);

/* The events with an id above `after`, oldest first, at most `max` (the newest ones). */
cJSON *gw_events_json(const gw_server *gw, uint64_t after, size_t max);

/* Start an SSE answer on req and keep it as a subscriber of `kind`. It gets first the
 * message `hello_name` with `hello` (a one-line JSON text) when given, then the events
 * after `after` (GW_SUB_EVENTS only). Returns 0, or a negative code with req not yet
 * answered (PR_EBUSY: too many subscribers). */
int gw_events_subscribe(gw_server *gw, pr_http_req *req, int kind, uint64_t after,
                        const char *hello_name, const char *hello);
/* Send one SSE message ("event: name", data) to every subscriber of `kind`. */
void gw_events_send(gw_server *gw, int kind, const char *name, const char *data, size_t len);
/* A comment line to every subscriber, so idle streams stay open through proxies. */
void gw_events_ping(gw_server *gw);
size_t gw_events_count(const gw_server *gw, int kind);
/* End the streams of subscribers on listener `s` (NULL: all of them). */
void gw_events_close_all(gw_server *gw, const pr_http_server *s);
/* End the streams whose request `which(req, ud)` picks (a signed-out session's). */
void gw_events_close_if(gw_server *gw, int (*which)(const pr_http_req *req, void *ud), void *ud);

#endif
