/* The phones one `fleetgate-agent --engine sim` hosts (docs/sim.md "Many phones in one
 * process"): --phones N copies of the phone the command line describes, or
 * --phones-file FILE, a JSON list whose entries each change some of its settings (id,
 * listen address, slots, rates, context, loading time, fault plan, device tree, cost).
 * Each phone becomes a whole ag_sim of its own on the agent's one loop, on a port of its
 * own, so that it behaves exactly as a phone alone in its process would. Pure: reads
 * the file at start-up, no libuv. */
#ifndef AG_SIMPHONES_H
#define AG_SIMPHONES_H

#include <stddef.h>

#include "faults.h"
#include "sim.h"

/* Phones one process hosts at most (each takes a listening socket of its own). */
#define AG_SIMPHONES_MAX 20000
/* A phones file is generated: room for AG_SIMPHONES_MAX entries with fault plans. */
#define AG_SIMPHONES_FILE_MAX ((size_t)32 << 20)
/* The id the phones are named after when --id is not given ("sim-1", "sim-2", ...). */
#define AG_SIMPHONES_ID_PREFIX "sim"

/* One phone. sc is its whole sim configuration: its strings point into this entry (id,
 * listen, token) or the base configuration's (model), sc.faults at plan. */
typedef struct ag_simphone {
  ag_sim_config sc;
  ag_fault_plan plan;       /* owned */
  char *id, *listen, *token; /* owned; token NULL: the base has none */
  char *sysfs_root;         /* owned; NULL: the command line's (shared by the phones) */
  double cost_per_day;      /* < 0: not given */
} ag_simphone;

typedef struct ag_simphones {
  ag_simphone *v;           /* owned */
  size_t n;
} ag_simphones;

/* What the phones are made from. */
typedef struct ag_simphones_spec {
  const ag_sim_config *base; /* the command line's phone (its faults, token and id too) */
  size_t count;             /* --phones N; 0: not given */
  const char *file;         /* --phones-file; NULL: not given */
  double cost_per_day;      /* the command line's, < 0: none */
} ag_simphones_spec;

/* Build the list: `count` copies of the base, or one phone per entry of the file (a JSON
 * array of objects with any of "id", "listen", "slots", "prefill_tps", "decode_tps",
 * "n_ctx", "loading_s", "fault_plan" (a list of windows or a plan file's name),
 * "sysfs_root", "cost_per_day"; what an entry leaves out is the base's). Ids default to
 * "<base id or sim>-<n>" (n from 1) and must be distinct; listen addresses default to
 * the base's with port 0 (each phone picks a free one), or the base's port + n - 1; with
 * a token each phone's is ag_simphones_token's. Every phone is checked as one sim is
 * (ag_sim_config_check). Returns 0, or a negative code with what is wrong in err
 * (naming the file and the entry). */
int ag_simphones_build(ag_simphones *out, const ag_simphones_spec *spec, char *err, size_t errn);
void ag_simphones_free(ag_simphones *p);

/* A hosted phone's own replica token: the hex HMAC-SHA256 of its id under the base
 * token (FLEETGATE_REPLICA_TOKEN), so that no phone's token opens another. out holds
 * 65 bytes. Returns 0, or PR_ETLS when the MAC cannot be computed. */
#define AG_SIMPHONES_TOKEN_LEN 64
int ag_simphones_token(const char *base, const char *id, char out[AG_SIMPHONES_TOKEN_LEN + 1]);

#endif
