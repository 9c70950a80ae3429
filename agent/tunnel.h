/* The agent's public URL through an Acurast tunnel (docs/agent.md#tunnels): on the
 * processor's bridge socket (the abstract Unix socket $BRIDGE_SOCKET names; one JSON-RPC
 * call per connection, tunnel.c speaks it with tunrpc.h's lines) it opens the tunnel to
 * the agent's listener with tunnel_start, polls tunnel_status every few seconds, and
 * reopens a tunnel that stopped or failed (or whose status cannot be read three times in
 * a row) with a back-off of 1, 2, 4 ... 30 s, each ±25 % at random. Every URL it is given,
 * and every change of it, goes to url_fn at once. All bridge I/O is non-blocking on the
 * loop; each call has a deadline. */
#ifndef AG_TUNNEL_H
#define AG_TUNNEL_H

#include <stdint.h>

#include <uv.h>

#include "tunrpc.h"

typedef struct ag_tunnel ag_tunnel;

/* The tunnel's URL is new or changed (url is valid during the call only). */
typedef void (*ag_tunnel_url_fn)(void *ud, const char *url);

/* Strings are copied by ag_tunnel_new. */
typedef struct ag_tunnel_config {
  const char *socket_name; /* BRIDGE_SOCKET, without the leading NUL */
  ag_tunspec spec;         /* local_addr may be NULL here: given to ag_tunnel_start */
  double poll_s;           /* tunnel_status every poll_s (0: 3 s) */
  ag_tunnel_url_fn url_fn;
  void *ud;
} ag_tunnel_config;

/* The back-off before try number fails + 1 (ms), before jitter: 1 s doubling to 30 s. */
uint64_t ag_tunnel_backoff_ms(unsigned fails);

int ag_tunnel_new(ag_tunnel **out, uv_loop_t *loop, const ag_tunnel_config *cfg);
/* Open the tunnel to local_addr (HOST:PORT); returns 0 or -ENOMEM. */
int ag_tunnel_start(ag_tunnel *t, const char *local_addr);
/* Cancel the call in flight, close the handles; on_stopped runs once they are closed.
 * The tunnel itself is left to the processor (it ends with the deployment). */
void ag_tunnel_stop(ag_tunnel *t, void (*on_stopped)(void *arg), void *arg);
void ag_tunnel_free(ag_tunnel *t);

#endif
