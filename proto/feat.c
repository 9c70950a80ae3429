/* Probing an engine's features; see feat.h. The answers read here are llama-server's, as
 * captured in tests/system/fixtures/feature-*.http for both releases. */
#include "feat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* "n" far above any phone's slots: b10587 refuses it at once with its range (400 "Field
 * 'n': Value must be between 1 <= value <= SLOTS, but got 1000"), the 2025 build with 500
 * "Only one completion choice is allowed". */
static const char body_choices[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":1000,\"max_tokens\":1}";
/* add_generation_prompt left at its default (true): an engine that knows
 * continue_final_message refuses the pair at once ("Cannot set both add_generation_prompt
 * and continue_final_message to true."); one that does not answers one token. */
static const char body_continue[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"}],"
    "\"continue_final_message\":true,\"max_tokens\":1}";
/* no input: b10587 answers 400 "'input' is required"; an engine without the route 404 */
static const char body_responses[] = "{}";
/* A plain prompt of about 100 tokens on slot 0, one token generated (the sampled token is
 * never fed back: the slot holds the prompt alone). Sent twice: a transformer reuses all but
 * the last token the second time (prompt_n 1); b10587 with a hybrid model restores the
 * checkpoint it made 4 tokens before the prompt's end (prompt_n 4, the README's B2). */
static const char body_ckpt[] =
    "{\"prompt\":\"fleetgate cache probe: the quick brown fox jumps over the lazy dog, then "
    "counts one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty, and the lazy dog sleeps on in the warm "
    "afternoon sun while the fox runs home across the long green field to its den.\","
    "\"n_predict\":1,\"temperature\":0,\"id_slot\":0,\"cache_prompt\":true}";

const char *pr_feat_probe_path(pr_feat_probe p) {
  if (p == PR_FEAT_PROBE_CKPT_WARM || p == PR_FEAT_PROBE_CKPT) return "/completion";
  return p == PR_FEAT_PROBE_RESPONSES ? "/v1/responses" : "/v1/chat/completions";
}

unsigned pr_feat_probe_bit(pr_feat_probe p) {
  switch (p) {
    case PR_FEAT_PROBE_CHOICES: return PR_FEAT_CHOICES;
    case PR_FEAT_PROBE_CONTINUE: return PR_FEAT_CONTINUE;
    case PR_FEAT_PROBE_RESPONSES: return PR_FEAT_RESPONSES;
    case PR_FEAT_PROBE_CKPT: return PR_FEAT_CHECKPOINTS;
    default: return 0;
  }
}

const char *pr_feat_probe_body(pr_feat_probe p) {
  switch (p) {
    case PR_FEAT_PROBE_CHOICES: return body_choices;
    case PR_FEAT_PROBE_CONTINUE: return body_continue;
    case PR_FEAT_PROBE_CKPT_WARM:
    case PR_FEAT_PROBE_CKPT: return body_ckpt;
    default: return body_responses;
  }
}

/* The error message of an OpenAI- or llama-server-shaped error body, or NULL. */
static const char *error_message(const cJSON *root) {
  const cJSON *e = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "error") : NULL;
  if (cJSON_IsString(e)) return e->valuestring;
  const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : NULL;
  return cJSON_IsString(m) ? m->valuestring : NULL;
}

int pr_feat_probe_read(pr_feat_probe p, long status, const char *body, size_t len, int *choices) {
  if (choices) *choices = 1;
  if (status <= 0 || status == 503 || status == 502 || status == 504 || status == 401 || status == 403 ||
      status == 429)
    return -1; /* not the engine's word on the feature */
  cJSON *root = body && len ? cJSON_ParseWithLength(body, len) : NULL;
  const char *msg = error_message(root);
  int v = -1;
  switch (p) {
    case PR_FEAT_PROBE_CHOICES:
      if (status == 400 && msg && strstr(msg, "'n'")) {
        /* the range it serves: "... between 1 <= value <= K, but got 1000" */
        const char *at = strstr(msg, "<= value <=");
        long k = at ? strtol(at + 11, NULL, 10) : 0;
        if (choices) *choices = k >= 1 && k <= 4096 ? (int)k : 1;
        v = k > 1;
      } else if (status == 200) {
        const cJSON *cs = cJSON_GetObjectItemCaseSensitive(root, "choices");
        int n = cJSON_IsArray(cs) ? cJSON_GetArraySize(cs) : 0;
        if (choices && n > 1) *choices = n;
        v = n > 1;
      } else if (status >= 400 && status < 600) {
        v = 0; /* "Only one completion choice is allowed", or n not understood */
      }
      break;
    case PR_FEAT_PROBE_CONTINUE:
      if (status == 400 && msg && strstr(msg, "continue_final_message")) v = 1;
      else if (status == 200 || (status >= 400 && status < 500)) v = 0;
      break;
    case PR_FEAT_PROBE_CKPT_WARM:
      v = 0; /* any answer: the prompt was read (or the engine cannot; the next one says) */
      break;
    case PR_FEAT_PROBE_CKPT:
      if (status == 200) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "timings");
        const cJSON *pn = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "prompt_n") : NULL;
        const cJSON *cn = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "cache_n") : NULL;
        v = cJSON_IsNumber(pn) && cJSON_IsNumber(cn) && pn->valuedouble == 4 && cn->valuedouble > 0;
      } else if (status >= 400 && status < 600) {
        v = 0; /* no /completion, or no slot 0: no checkpoints to plan on */
      }
      break;
    default:
      if (status == 404 || status == 405 || status == 501) v = 0;
      else if (status == 400 || status == 422 || status == 200) v = msg || status == 200;
      break;
  }
  cJSON_Delete(root);
  return v;
}

const char *pr_feat_name(unsigned bit) {
  switch (bit) {
    case PR_FEAT_CHOICES: return "choices";
    case PR_FEAT_CONTINUE: return "continue_final_message";
    case PR_FEAT_RESPONSES: return "responses";
    case PR_FEAT_CHECKPOINTS: return "cache_checkpoints";
    default: return "?";
  }
}
