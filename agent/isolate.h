/* Callers kept apart on this phone's prompt cache (docs/security.md "Tenants' prompts").
 * The gateway names each request's cache scope (x-fleetgate-cache-scope: the API key's, or
 * its team's); a request may reuse only what its own scope left in the engine, so that
 * neither an answer's cached_tokens nor its time says whether another key sent a prompt.
 * The agent is its engine's only client: it knows what every slot was given, whether the
 * engine read it (a 200), and when it started the engine afresh -- which no gateway can
 * know for sure.
 *
 * Two modes. SLOTS, for an engine that takes the slot a request names ("id_slot") and
 * keeps no cache beyond its slots (llama-server started with --cache-ram 0, or a build
 * without one; the sim without its RAM cache): each request goes to a slot the agent
 * picks, and reuses it only when the slot holds its own scope's prompt as far as the agent
 * knows (a slot whose request failed, was refused or cut off before the engine answered
 * holds "unknown"). ENGINE, for any other engine: the engine as a whole counts, and a
 * request reuses only while every prompt sent since the engine started was its scope's. A
 * request that may not reuse goes with "cache_prompt": false. Pure: no I/O, no clock. */
#ifndef AG_ISOLATE_H
#define AG_ISOLATE_H

#include <stddef.h>
#include <stdint.h>

#define AG_ISO_BLOCKS 128            /* leading prompt blocks remembered per slot */
#define AG_ISO_NO_SCOPE UINT64_MAX   /* a request that named no scope (an older gateway) */

typedef enum { AG_ISO_SLOTS = 0, AG_ISO_ENGINE } ag_iso_mode;

typedef struct ag_iso_slot {
  uint64_t scope;      /* whose prompt it holds; 0: none (empty, or unknown) */
  int unknown;         /* it may hold anyone's: reused by nobody until rewritten */
  int busy;            /* requests named to it and not ended */
  uint64_t blocks[AG_ISO_BLOCKS];
  size_t n_blocks;
  uint64_t used;
} ag_iso_slot;

typedef struct ag_iso {
  ag_iso_mode mode;
  ag_iso_slot *slot;   /* owned; n long (SLOTS) */
  int n;
  uint64_t scope;      /* ENGINE: the scope of every prompt since the engine started... */
  int mixed;           /* ...or several; unknown (attached to an engine it did not start) */
  uint64_t tick;
} ag_iso;

/* Where a request goes and whether it may reuse. */
typedef struct ag_iso_pick {
  int slot;            /* the slot to name; -1: the engine chooses */
  int reuse;           /* 0: "cache_prompt": false */
} ag_iso_pick;

/* Set up for an engine the agent just started (empty) or one it found running (known 0:
 * anything may be in it). n: the engine's slots (SLOTS). Returns 0 or -ENOMEM. */
int ag_iso_init(ag_iso *s, ag_iso_mode mode, int n, int known);
void ag_iso_free(ag_iso *s);
/* The scope a request names: x-fleetgate-cache-scope's 16 hex digits, else AG_ISO_NO_SCOPE. */
uint64_t ag_iso_scope_of(const char *header);
/* A request of scope with these prompt fingerprints arrives: where it goes, and whether it
 * may reuse (its own scope's slot with the longest shared prefix, else an empty one, else
 * the least recently used other slot, rewritten; all slots busy: the least busy, uncached).
 * The slot counts it busy until ag_iso_end. */
ag_iso_pick ag_iso_start(ag_iso *s, uint64_t scope, const uint64_t *blocks, size_t n);
/* It ended: read says the engine answered 200 (it read the prompt into the slot);
 * otherwise the slot holds "unknown". */
void ag_iso_end(ag_iso *s, ag_iso_pick p, uint64_t scope, const uint64_t *blocks, size_t n,
                int read);
/* "slots" or "engine": what the agent's status says. */
const char *ag_iso_mode_name(ag_iso_mode m);

#endif
