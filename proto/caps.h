/* The caps on buffers that hold bytes from outside the process, named in one place so
 * both daemons (and a reader) agree on them. Module-private limits that no other module
 * meets stay next to their code; these are the ones two or more modules share. */
#ifndef PR_CAPS_H
#define PR_CAPS_H

#include <stddef.h>

/* A whole answer from a phone or engine (a long completion with logprobs stays far
 * below it), and one event of a streamed answer. */
#define PR_CAP_ANSWER ((size_t)32 << 20)
#define PR_CAP_SSE_EVENT ((size_t)4 << 20)
/* An OpenAI error body, a response head, and other small JSON answers. */
#define PR_CAP_ERROR_BODY ((size_t)64 << 10)
/* A signed heartbeat body (docs/protocol.md) and the gateway's answer to it. */
#define PR_CAP_HEARTBEAT ((size_t)64 << 10)
/* The text of a stream relayed so far, kept to continue it on another phone. */
#define PR_CAP_STREAM_TEXT ((size_t)4 << 20)
/* A list of configuration errors, or of a reload's changes. */
#define PR_CAP_REPORT ((size_t)1 << 20)
/* A configuration file (the main file; a replicas_dir file has the same cap). */
#define PR_CAP_CONFIG_FILE ((size_t)16 << 20)

#endif
