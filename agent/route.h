/* The agent front's routing: which method and request target go where. The front relays
 * an exact allow-list of OpenAI calls (the ones the gateway makes) and answers its own
 * endpoints; every other target is refused here, before any engine connection, so
 * llama-server's other endpoints (/slots, /props, /metrics, slot save/restore,
 * /tokenize, LoRA adapters...) are never reachable through the phone's tunnel. No
 * normalisation is done: a target is taken exactly as sent or refused. Pure: no I/O. */
#ifndef AG_ROUTE_H
#define AG_ROUTE_H

typedef enum ag_route_kind {
  AG_ROUTE_STATUS,     /* GET /agent/v1/status: the agent's own report */
  AG_ROUTE_HEALTH,     /* GET /health, GET /v1/health: the engine's readiness */
  AG_ROUTE_RELAY,      /* forwarded to the engine: route->path and route->method */
  AG_ROUTE_BAD_PATH,   /* 400: dot segments, "//", '%', '\\', bytes outside A-Z a-z 0-9 / . _ - */
  AG_ROUTE_QUERY,      /* 400: a query string on a relayed path */
  AG_ROUTE_NOT_FOUND,  /* 404: not a path the agent serves */
  AG_ROUTE_METHOD,     /* 405: a known path, another method; route->allow names it */
} ag_route_kind;

typedef struct ag_route {
  ag_route_kind kind;
  const char *path;    /* RELAY: the allow-listed path (a constant, not the caller's bytes) */
  const char *method;  /* RELAY: its method */
  const char *allow;   /* METHOD: "Allow: ..." header line */
  int completion;      /* RELAY: a completion (counts as busy, refused while draining) */
  int chat;            /* RELAY: /v1/chat/completions */
} ag_route;

/* Route one request: method as parsed, url the raw request target (path and query). */
void ag_route_find(const char *method, const char *url, ag_route *out);

#endif
