/* Telling a phone's failure from a request's fault by the answer; see verdict.h. */
#include "verdict.h"

#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "oai.h"

/* The "error" member of a readable error body, or NULL: a JSON object whose "error" is
 * an object with a non-empty string "message" (llama-server, OpenAI-compatible servers)
 * or a non-empty string (MNN's own shape). The caller frees *root. */
static const cJSON *error_member(const char *body, size_t len, cJSON **root) {
  *root = NULL;
  if (!body || !len || len > GW_VERDICT_MAX_BODY) return NULL;
  *root = cJSON_ParseWithLength(body, len);
  const cJSON *e = cJSON_IsObject(*root) ? cJSON_GetObjectItemCaseSensitive(*root, "error") : NULL;
  if (cJSON_IsString(e) && e->valuestring[0]) return e;
  if (!cJSON_IsObject(e)) return NULL;
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
  return cJSON_IsString(m) && m->valuestring[0] ? e : NULL;
}

/* b10587's message when the model's output cannot be parsed into its template's format
 * ("...does not match the expected peg-native format", tests/system/fixtures/unparsable-*) */
#define UNPARSABLE_MSG "The model produced output that does not match the expected"

static int is_unparsable(const cJSON *e) {
  const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
  return cJSON_IsString(m) && strncmp(m->valuestring, UNPARSABLE_MSG, sizeof(UNPARSABLE_MSG) - 1) == 0;
}

static int is_loading(const cJSON *e) {
  const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
  return cJSON_IsString(m) && strstr(m->valuestring, "Loading model") != NULL;
}

gw_verdict gw_verdict_of(long status, const char *body, size_t len, double elapsed_s,
                         double window_s) {
  cJSON *root;
  const cJSON *e = error_member(body, len, &root);
  gw_verdict v = GW_VERDICT_PHONE;
  if (status == 508) {
    /* loop_detected: the phone's URL leads back to a gateway (server.c gw_handle) */
    v = GW_VERDICT_PHONE;
  } else if (status == 503) {
    /* overloaded or starting: either way about the phone, never the request */
    v = e && is_loading(e) ? GW_VERDICT_LOADING : GW_VERDICT_PHONE;
  } else if (status == 502 || status == 504 || status == 401 || status == 403 ||
             status == 407 || status == 404 || status == 405 || status == 408 ||
             status == 429) {
    /* a tunnel or proxy failing, a wrong replica token or URL (the gateway only sends
     * paths every engine serves), the phone's own overload: it would answer anyone so */
    v = GW_VERDICT_PHONE;
  } else if (status >= 400 && status < 500) {
    v = e ? GW_VERDICT_REFUSED : GW_VERDICT_PHONE;
  } else if (status == 500 && e && is_unparsable(e)) {
    /* what the model wrote could not be read back, however long it took to write */
    v = GW_VERDICT_UNPARSABLE;
  } else if (status >= 500 && status < 600) {
    /* a refusal comes while the request is read, before any work: a 500 after minutes
     * of prefill is the phone breaking down */
    v = e && elapsed_s <= window_s ? GW_VERDICT_AMBIGUOUS : GW_VERDICT_PHONE;
  }
  cJSON_Delete(root);
  return v;
}

long gw_verdict_event_status(const char *data, size_t len) {
  cJSON *root = cJSON_ParseWithLength(data, len);
  const cJSON *e = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "error") : NULL;
  const cJSON *c = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "code") : NULL;
  long st = 500;
  if (cJSON_IsNumber(c) && c->valuedouble >= 400 && c->valuedouble < 600)
    st = (long)c->valuedouble;
  cJSON_Delete(root);
  return st;
}

/* n bytes or fewer of s, not cutting a UTF-8 sequence. */
static size_t utf8_cut(const char *s, size_t n) {
  size_t len = strlen(s);
  if (len <= n) return len;
  while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
  return n;
}

/* A whole number member of o, or -1. */
static int64_t whole(const cJSON *o, const char *key) {
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(n) && n->valuedouble >= 0 && n->valuedouble < 1e15 ? (int64_t)n->valuedouble : -1;
}

static int is_context(const cJSON *e) {
  const cJSON *t = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "type") : NULL;
  return cJSON_IsString(t) && strcmp(t->valuestring, "exceed_context_size_error") == 0;
}

int gw_verdict_context(const char *body, size_t len, int64_t *n_prompt_tokens, int64_t *n_ctx) {
  cJSON *root;
  const cJSON *e = error_member(body, len, &root);
  int yes = is_context(e);
  *n_prompt_tokens = yes ? whole(e, "n_prompt_tokens") : -1;
  *n_ctx = yes ? whole(e, "n_ctx") : -1;
  cJSON_Delete(root);
  return yes;
}

int gw_verdict_error_body(const char *body, size_t len, pr_buf *out, const char **code_out) {
  cJSON *root;
  const cJSON *e = error_member(body, len, &root);
  const char *msg = "the replica refused the request";
  const char *param = NULL;
  const char *code = "request_refused";
  char own[256] = "";
  if (cJSON_IsString(e)) {
    msg = e->valuestring;
  } else if (e) {
    msg = cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "code");
    if (cJSON_IsString(c) && strcmp(c->valuestring, "context_length_exceeded") == 0)
      code = "context_length_exceeded";
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "param");
    if (cJSON_IsString(p) && p->valuestring[0] && strlen(p->valuestring) < 128) param = p->valuestring;
    if (is_context(e)) {
      code = "context_length_exceeded";
      int64_t np = whole(e, "n_prompt_tokens"), nc = whole(e, "n_ctx");
      if (np >= 0 && nc >= 0) {
        /* OpenAI's words, with the engine's numbers */
        snprintf(own, sizeof(own),
                 "This model's maximum context length is %lld tokens. However, your messages "
                 "resulted in %lld tokens. Please reduce the length of the messages.",
                 (long long)nc, (long long)np);
        msg = own;
        param = "messages";
      }
    } else if (is_unparsable(e)) {
      code = "model_output_unparsable";
    }
  }
  char cut[GW_VERDICT_MAX_MESSAGE + 1];
  size_t n = utf8_cut(msg, GW_VERDICT_MAX_MESSAGE);
  memcpy(cut, msg, n);
  cut[n] = '\0';
  int rc = pr_oai_error_body(out, cut, "invalid_request_error", param, code);
  if (code_out) *code_out = code;
  cJSON_Delete(root);
  return rc;
}
