/* The agent front's allow-list; see route.h. */
#include "route.h"

#include <stddef.h>
#include <string.h>

/* What the gateway sends through the agent (gateway/upstream.c: completions;
 * gateway/health.c: GET /agent/v1/status for agents, /health and /v1/models for
 * replicas of unknown kind). /props is not here: the agent reads it itself. */
static const struct {
  const char *path, *method;
  int completion, chat;
} relayed[] = {
  {"/v1/chat/completions", "POST", 1, 1},
  {"/v1/completions", "POST", 1, 0},
  {"/v1/models", "GET", 0, 0},
};

static const struct {
  const char *path;
  ag_route_kind kind;
} own[] = {
  {"/agent/v1/status", AG_ROUTE_STATUS},
  {"/health", AG_ROUTE_HEALTH},
  {"/v1/health", AG_ROUTE_HEALTH},
};

/* A path a careful server reads in exactly one way: it starts with '/', has only
 * A-Z a-z 0-9 / . _ -, no empty segment ("//"), no "." or ".." segment. Percent
 * escapes are refused outright (none of the allow-listed paths needs one, and %2e,
 * %2f or %5c could be decoded into a traversal further on), and so is a backslash. */
static int path_clean(const char *p, size_t n) {
  if (n == 0 || p[0] != '/') return 0;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '/' ||
             c == '.' || c == '_' || c == '-';
    if (!ok) return 0;
  }
  for (size_t i = 0; i < n; i++) {
    if (p[i] != '/') continue;
    size_t j = i + 1, end = j;
    while (end < n && p[end] != '/') end++;
    size_t seg = end - j;
    if (end < n && seg == 0) return 0; /* "//" */
    if (seg == 1 && p[j] == '.') return 0;
    if (seg == 2 && p[j] == '.' && p[j + 1] == '.') return 0;
  }
  return 1;
}

void ag_route_find(const char *method, const char *url, ag_route *out) {
  memset(out, 0, sizeof(*out));
  if (!url) url = "";
  const char *q = strpbrk(url, "?#");
  size_t n = q ? (size_t)(q - url) : strlen(url);
  if (!path_clean(url, n)) {
    out->kind = AG_ROUTE_BAD_PATH;
    return;
  }
  int get = method && strcmp(method, "GET") == 0;
  for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++) {
    if (strlen(own[i].path) != n || strncmp(own[i].path, url, n) != 0) continue;
    out->kind = get ? own[i].kind : AG_ROUTE_METHOD;
    out->allow = "Allow: GET";
    return;
  }
  for (size_t i = 0; i < sizeof(relayed) / sizeof(relayed[0]); i++) {
    if (strlen(relayed[i].path) != n || strncmp(relayed[i].path, url, n) != 0) continue;
    if (!method || strcmp(method, relayed[i].method) != 0) {
      out->kind = AG_ROUTE_METHOD;
      out->allow = strcmp(relayed[i].method, "GET") == 0 ? "Allow: GET" : "Allow: POST";
      return;
    }
    if (q) { /* nothing the gateway sends has one; llama-server would read it */
      out->kind = AG_ROUTE_QUERY;
      return;
    }
    out->kind = AG_ROUTE_RELAY;
    out->path = relayed[i].path;
    out->method = relayed[i].method;
    out->completion = relayed[i].completion;
    out->chat = relayed[i].chat;
    return;
  }
  out->kind = AG_ROUTE_NOT_FOUND;
}
