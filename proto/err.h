/* Error codes shared by both daemons: negative errno values plus fleetgate's own,
 * and a table that turns any of them into a short name and a message.
 * Functions across the project return 0 or one of these negative codes. */
#ifndef PR_ERR_H
#define PR_ERR_H

#include <errno.h>

/* fleetgate's own codes live below -4000 so they never collide with errno values. */
enum {
  PR_ETOOLARGE = -4001, /* a capped buffer or a limit would be exceeded */
  PR_EPARSE = -4002,    /* malformed input (JSON, HTTP, SSE, config) */
  PR_ETYPE = -4003,     /* a JSON field has the wrong type */
  PR_EMISSING = -4004,  /* a required field or value is absent */
  PR_ERANGE = -4005,    /* a value is out of its allowed range */
  PR_ECLOSED = -4006,   /* the peer or owner went away */
  PR_ECURL = -4007,     /* libcurl reported an error */
  PR_ETLS = -4008,      /* TLS layer error */
  PR_EUNKNOWN = -4009,  /* unknown key, model, path */
  PR_EBUSY = -4010,     /* no capacity right now */
};

/* "ETOOLARGE", "ENOMEM", ... ; never NULL. */
const char *pr_errname(int code);
/* A human-readable message; never NULL. */
const char *pr_strerror(int code);

#endif
