/* A switch of models for an engine the agent starts (llama-server), when the gateway's
 * placement asks (docs/protocol.md "Placement", docs/placement.md): drain the front (new
 * completions get 503 draining, running ones finish), download the model into the models
 * folder with `fleetgate-agent fetch` (digest checked, resumed; a file already there with
 * the digest is kept) run as a child process, restart the engine with it (its -m, the
 * catalogue's context and engine arguments), and wait until it answers. A download or a
 * load that fails (the engine exits twice, or is not ready in time) restarts the engine on
 * the model it had, and the failure and its reason are reported until the gateway stops
 * asking. No blocking call: the download is another process, the rest timers. */
#ifndef AG_SWAP_H
#define AG_SWAP_H

#include <uv.h>

#include "engine.h"
#include "front.h"
#include "hb.h"

typedef struct ag_swap ag_swap;

/* Whether this phone can hold the model a switch asks for (its memory and the models
 * folder's free storage: ag_hold_switch_fits); 0 with why when it cannot. */
typedef int (*ag_swap_fits_fn)(void *ud, const ag_place *p, char *why, size_t n);
/* engine and front are borrowed and must outlive it; models_dir and self_exe (the agent's
 * own program, which runs `fetch`) are copied. changed(ud) is called when the phase
 * changes (the owner sends a heartbeat at once). fits (may be NULL: not checked) is asked
 * before a switch drains anything: a switch it cannot hold is refused at once (failed,
 * with why), the engine kept on its model and serving. */
int ag_swap_new(ag_swap **out, uv_loop_t *loop, ag_engine *engine, ag_front *front,
                const char *models_dir, const char *self_exe, ag_swap_fits_fn fits,
                void (*changed)(void *ud), void *ud);
/* The gateway's word (every accepted heartbeat): the model it asks for, or NULL. */
void ag_swap_place(ag_swap *s, const ag_place *p);
/* The gateway's own drain (its answers' `drain`): kept apart from the switch's. */
void ag_swap_gateway_drain(ag_swap *s, int drain);
/* The engine's state changed (the owner's ag_engine_state_fn calls this). */
void ag_swap_engine_state(ag_swap *s, ag_engine_state st);
/* The switch under way or the last failed one (to NULL: none). */
void ag_swap_get(const ag_swap *s, const char **to, const char **phase, const char **why);
/* Load time allowed to an engine restarted with another model, at most (ms). */
#define AG_SWAP_LOAD_TIMEOUT_MS (10 * 60 * 1000)
/* Kill a download under way, close the handles; on_stopped once closed. */
void ag_swap_stop(ag_swap *s, void (*on_stopped)(void *arg), void *arg);
void ag_swap_free(ag_swap *s);

#endif
