/* Pins: which phone key owns which replica id (docs/security.md, "Phones' identities").
 * A phone enrols once (fleet secret + proof of its own key); from then on only that key
 * may speak for its id, so a leaked fleet secret no longer lets anyone take over an
 * enrolled phone. A pin is `pinned` or, under `fleet.enrol: "approve"`, `pending` until
 * an operator approves it. Pins outlive the replica they name (it may be swept while
 * its phone is away) and expire `fleet.pin_ttl_s` after the phone was last heard.
 *
 * With `fleet.pins_file` they are kept in a SQLite database, written when a pin is made,
 * approved, released or its URL changes (rare, small, synchronous writes; heartbeats
 * only read the table in memory, and last-seen times are written at most hourly). No
 * libuv here: the unit tests drive it directly. Owned by the gateway (gw_server.pins). */
#ifndef GW_PINS_H
#define GW_PINS_H

#include <stddef.h>
#include <stdint.h>

#include "idkey.h"

typedef enum { GW_PIN_PINNED = 0, GW_PIN_PENDING = 1 } gw_pin_state;

typedef struct gw_pin {
  char id[65];
  char key[PR_IDKEY_PUB_LEN + 1];
  char *url;               /* the URL it last signed */
  gw_pin_state state;
  int64_t enrolled_ms;     /* wall clock */
  int64_t seen_ms;         /* wall clock of its last accepted heartbeat */
  int64_t saved_seen_ms;   /* seen_ms as last written to the file */
  size_t at;               /* its place in gw_pins_at's order (pins.c's own) */
} gw_pin;

typedef struct gw_pins gw_pins;

/* path NULL: in memory only. Loads what the file holds (pins past ttl_ms are dropped).
 * err gets a sentence on failure. */
int gw_pins_open(gw_pins **out, const char *path, char *err, size_t errn);
void gw_pins_close(gw_pins *p);
const char *gw_pins_path(const gw_pins *p);

/* id's pin (NULL: none), found by its hash: heartbeats ask for every phone. A pin stays
 * where it is until it is removed. */
gw_pin *gw_pins_find(gw_pins *p, const char *id);
size_t gw_pins_count(const gw_pins *p, gw_pin_state state);
/* The i-th pin (0 <= i < gw_pins_total), for listings. */
size_t gw_pins_total(const gw_pins *p);
gw_pin *gw_pins_at(gw_pins *p, size_t i);

/* Make (or replace) id's pin. -ENOMEM; PR_ETOOLARGE past max pins; a failed write is
 * -EIO (the pin is then not made). */
int gw_pins_put(gw_pins *p, const char *id, const char *key, const char *url, gw_pin_state state,
                int64_t now_ms, size_t max);
/* A pending pin becomes pinned. -ENOENT when there is none. */
int gw_pins_approve(gw_pins *p, const char *id);
/* Forget id's pin (an operator released it, or it expired). -ENOENT when there is none. */
int gw_pins_remove(gw_pins *p, const char *id);
/* A heartbeat was accepted: note the time and (a change signed by the key) the URL. */
int gw_pins_seen(gw_pins *p, gw_pin *pin, const char *url, int64_t now_ms);
/* A random secret kept in the file (made on first use): hex, NUL-ended, in out[65].
 * -ENOENT for pins kept in memory only. */
int gw_pins_secret(gw_pins *p, char out[65]);
/* Drop pins not heard for ttl_ms (pending ones: pending_ttl_ms); returns how many went. keep(id) != 0 keeps a pin
 * whatever its age (a replica still in the registry). */
size_t gw_pins_expire(gw_pins *p, int64_t now_ms, int64_t ttl_ms, int64_t pending_ttl_ms,
                      int (*keep)(void *ud, const char *id), void *ud);

#endif
