/* How long a started stream may be silent before the gateway takes it to another phone:
 * a pure function of the phone's learned pace, the stream's own pace so far and the other
 * work the phone has on (docs/routing.md "A phone that falls silent"). */
#ifndef GW_SILENCE_H
#define GW_SILENCE_H

/* llama-server's default n_batch: while another request's prompt is read, the phone's
 * streams get one token per batch of up to this many prompt tokens. */
#define GW_SILENCE_BATCH_TOKENS 2048

typedef struct gw_silence_in {
  double factor;        /* k: times the expected gap between tokens (<= 0: watchdog off) */
  double floor_s;       /* never less than this */
  double idle_max_s;    /* never more than this (upstream.stream_idle_timeout_s) */
  double decode_tps;    /* the phone's learned decode rate per slot (<= 0: unknown) */
  double slowdown;      /* the planner's slowdown of the phone (>= 1; else taken as 1) */
  double seen_gap_s;    /* this stream's own mean gap between tokens so far (<= 0: none) */
  double cover_s;       /* prompt reading of the phone's other requests that may hold this
                           stream's tokens back (see gw_silence_cover_s) */
} gw_silence_in;

/* The longest silence allowed (seconds): max(k × expected gap, floor) + cover, where the
 * expected gap is the larger of 1 / decode_tps × slowdown and the stream's own gap;
 * never more than idle_max_s; idle_max_s when the watchdog is off or nothing is known. */
double gw_silence_limit_s(const gw_silence_in *in);

/* The cover for one other request reading its prompt on the same phone: one batch of its
 * uncached tokens (at most GW_SILENCE_BATCH_TOKENS) at the phone's prefill rate, slowed. */
double gw_silence_cover_s(double uncached_tokens, double prefill_tps, double slowdown);

#endif
