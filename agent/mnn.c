/* MNN's answers normalised to OpenAI's shapes; see mnn.h. */
#include "mnn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "err.h"
#include "json.h"
#include "oai.h"
#include "sse.h"

#define AG_MNN_MAX_TEXT ((size_t)16 << 20)
/* An error event's OpenAI-shaped body: an event (4 MiB at most) and a little more. */
#define AG_MNN_MAX_ERR ((size_t)5 << 20)

void ag_mnn_init(ag_mnn *m, int chat, int client_stream, int include_usage, int64_t cap,
                 int64_t prompt_tokens) {
  memset(m, 0, sizeof(*m));
  m->chat = chat;
  m->client_stream = client_stream;
  m->include_usage = include_usage;
  m->cap = cap;
  m->prompt_tokens = prompt_tokens > 0 ? prompt_tokens : 1;
  m->real_prompt = m->real_completion = -1;
  m->created = (int64_t)time(NULL);
  snprintf(m->finish, sizeof(m->finish), "stop");
  snprintf(m->id, sizeof(m->id), "chatcmpl-mnn");
  pr_buf_init(&m->text, AG_MNN_MAX_TEXT);
  pr_buf_init(&m->err, AG_MNN_MAX_ERR);
}

void ag_mnn_free(ag_mnn *m) {
  pr_buf_free(&m->text);
  pr_buf_free(&m->err);
}

const char *ag_mnn_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

/* ---- building our own chunks --------------------------------------------------------- */

static int emit_event(cJSON *root, pr_buf *out) {
  char *s = root ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (!s) return -ENOMEM;
  int rc = pr_sse_write_data(out, s, strlen(s));
  free(s);
  return rc;
}

static cJSON *chunk_base(const ag_mnn *m) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddStringToObject(o, "id", m->id);
  cJSON_AddStringToObject(o, "object", m->chat ? "chat.completion.chunk" : "text_completion");
  cJSON_AddNumberToObject(o, "created", (double)m->created);
  cJSON_AddStringToObject(o, "model", m->model);
  if (m->fingerprint[0]) cJSON_AddStringToObject(o, "system_fingerprint", m->fingerprint);
  return o;
}

static cJSON *usage_json(const ag_mnn *m) {
  int64_t p = m->real_prompt > 0 ? m->real_prompt : m->prompt_tokens;
  int64_t c = m->real_completion > 0 ? m->real_completion : m->n_tokens;
  if (m->cap > 0 && c > m->cap) c = m->n_tokens; /* MNN counted what the agent cut */
  cJSON *u = cJSON_CreateObject();
  if (!u) return NULL;
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)p);
  cJSON_AddNumberToObject(u, "completion_tokens", (double)c);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(p + c));
  return u;
}

static int emit_finish(const ag_mnn *m, pr_buf *out) {
  cJSON *o = chunk_base(m);
  if (!o) return -ENOMEM;
  cJSON *choices = cJSON_AddArrayToObject(o, "choices");
  cJSON *c = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, c);
  cJSON_AddNumberToObject(c, "index", 0);
  if (m->chat) cJSON_AddObjectToObject(c, "delta");
  else cJSON_AddStringToObject(c, "text", "");
  cJSON_AddStringToObject(c, "finish_reason", m->finish);
  return emit_event(o, out);
}

static int emit_usage(const ag_mnn *m, pr_buf *out) {
  cJSON *o = chunk_base(m);
  if (!o) return -ENOMEM;
  cJSON_AddArrayToObject(o, "choices");
  cJSON_AddItemToObject(o, "usage", usage_json(m));
  return emit_event(o, out);
}

/* The end of a good answer: [finish chunk,] [usage chunk,] [DONE]. */
static int close_stream(ag_mnn *m, int need_finish, pr_buf *out) {
  m->complete = 1;
  if (!m->client_stream) return 0;
  int rc = 0;
  if (need_finish) rc = emit_finish(m, out);
  if (rc == 0 && m->include_usage) rc = emit_usage(m, out);
  if (rc == 0) rc = pr_buf_append_str(out, "data: [DONE]\n\n");
  return rc;
}

/* ---- errors ------------------------------------------------------------------------ */

int ag_mnn_error_body(int status, const char *body, size_t len, pr_buf *out) {
  /* The message is passed on whole: an engine's refusal may quote the request (llama.cpp
   * based servers dump the messages or tools that they could not read). */
  char fallback[512];
  const char *msg = fallback, *code = NULL;
  snprintf(fallback, sizeof(fallback), "the engine answered HTTP %d", status);
  cJSON *root = len ? cJSON_ParseWithLength(body, len) : NULL;
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
  const char *type = ag_mnn_error_type(status);
  if (cJSON_IsString(e) && e->valuestring[0]) {
    msg = e->valuestring;
  } else if (cJSON_IsObject(e)) {
    const cJSON *mm = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "code");
    if (cJSON_IsString(mm) && mm->valuestring[0]) msg = mm->valuestring;
    if (cJSON_IsString(c)) code = c->valuestring;
  } else if (!root && len) {
    /* plain text: keep its first line, printable bytes only */
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < sizeof(fallback) && body[i] != '\n'; i++)
      fallback[n++] = (unsigned char)body[i] >= 0x20 ? body[i] : ' ';
    if (n) fallback[n] = '\0';
  }
  if (status == 503 && strstr(msg, "oading")) code = "model_loading";
  int rc = pr_oai_error_body(out, msg, type, NULL, code);
  cJSON_Delete(root);
  return rc;
}

/* ---- MNN's chunks ------------------------------------------------------------------ */

static void copy_str(char *dst, size_t n, const cJSON *v) {
  if (cJSON_IsString(v)) snprintf(dst, n, "%s", v->valuestring);
}

/* Usage is real when it counts both sides; MNN's placeholder is zeros. */
static void take_usage(ag_mnn *m, const cJSON *root) {
  const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
  if (!cJSON_IsObject(u)) return;
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
  if (cJSON_IsNumber(p) && cJSON_IsNumber(c) && p->valuedouble >= 1 && c->valuedouble >= 1) {
    m->real_prompt = (int64_t)p->valuedouble;
    m->real_completion = (int64_t)c->valuedouble;
  }
}

static int error_event(ag_mnn *m, int status, const char *data, size_t len, pr_buf *out) {
  m->complete = 1;
  m->error_status = status;
  pr_buf_reset(&m->err);
  int rc = ag_mnn_error_body(status, data, len, &m->err);
  if (rc == 0 && m->client_stream) rc = pr_sse_write_data(out, m->err.data, m->err.len);
  return rc < 0 ? rc : 1;
}

int ag_mnn_event(ag_mnn *m, const char *data, size_t len, pr_buf *out) {
  if (m->complete) return 1;
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
    int rc = close_stream(m, !m->saw_finish, out);
    return rc < 0 ? rc : 1;
  }
  cJSON *root = cJSON_ParseWithLength(data, len);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return 0; /* not a chunk: nothing a client could use */
  }
  if (cJSON_GetObjectItemCaseSensitive(root, "error")) {
    cJSON_Delete(root);
    return error_event(m, 500, data, len, out);
  }
  if (!m->model[0]) {
    copy_str(m->id, sizeof(m->id), cJSON_GetObjectItemCaseSensitive(root, "id"));
    copy_str(m->model, sizeof(m->model), cJSON_GetObjectItemCaseSensitive(root, "model"));
    copy_str(m->fingerprint, sizeof(m->fingerprint),
             cJSON_GetObjectItemCaseSensitive(root, "system_fingerprint"));
    const cJSON *cr = cJSON_GetObjectItemCaseSensitive(root, "created");
    if (cJSON_IsNumber(cr)) m->created = (int64_t)cr->valuedouble;
    if (!m->model[0]) snprintf(m->model, sizeof(m->model), "mnn");
  }
  take_usage(m, root);
  cJSON_DeleteItemFromObjectCaseSensitive(root, "usage"); /* ours comes at the end */
  cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
  cJSON *c = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
  const char *content = NULL;
  int finished = 0;
  if (cJSON_IsObject(c)) {
    cJSON *fr = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
    if (cJSON_IsString(fr) && fr->valuestring[0]) {
      finished = 1;
      snprintf(m->finish, sizeof(m->finish), "%s", fr->valuestring);
    } else {
      cJSON_ReplaceItemInObjectCaseSensitive(c, "finish_reason", cJSON_CreateNull());
    }
    const cJSON *v = m->chat ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "delta"), "content")
                             : cJSON_GetObjectItemCaseSensitive(c, "text");
    if (cJSON_IsString(v) && v->valuestring[0]) content = v->valuestring;
  }
  int rc = 0;
  if (content) m->n_tokens++;
  int at_cap = m->cap > 0 && m->n_tokens >= m->cap && !finished;
  if (m->client_stream) {
    if (content || finished || cJSON_IsObject(c)) {
      char *s = cJSON_PrintUnformatted(root);
      rc = s ? pr_sse_write_data(out, s, strlen(s)) : -ENOMEM;
      free(s);
    }
  } else if (content) {
    rc = pr_buf_append_str(&m->text, content);
  }
  cJSON_Delete(root);
  if (rc < 0) return rc;
  if (finished) m->saw_finish = 1;
  if (at_cap) {
    snprintf(m->finish, sizeof(m->finish), "length");
    m->saw_finish = 1;
    rc = close_stream(m, 1, out);
    return rc < 0 ? rc : 1;
  }
  return 0;
}

int ag_mnn_eof(ag_mnn *m, int clean, pr_buf *out) {
  if (m->complete) return 0;
  if (clean) return close_stream(m, !m->saw_finish, out);
  static const char msg[] = "{\"error\":\"the engine closed the stream before the answer was complete\"}";
  int rc = error_event(m, 502, msg, sizeof(msg) - 1, out);
  return rc < 0 ? rc : 0;
}

int ag_mnn_whole(ag_mnn *m, pr_buf *out) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return -ENOMEM;
  cJSON_AddStringToObject(o, "id", m->id);
  cJSON_AddStringToObject(o, "object", m->chat ? "chat.completion" : "text_completion");
  cJSON_AddNumberToObject(o, "created", (double)m->created);
  cJSON_AddStringToObject(o, "model", m->model[0] ? m->model : "mnn");
  if (m->fingerprint[0]) cJSON_AddStringToObject(o, "system_fingerprint", m->fingerprint);
  cJSON *choices = cJSON_AddArrayToObject(o, "choices");
  cJSON *c = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, c);
  cJSON_AddNumberToObject(c, "index", 0);
  const char *text = pr_buf_cstr(&m->text);
  if (m->chat) {
    cJSON *msg = cJSON_AddObjectToObject(c, "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    cJSON_AddStringToObject(msg, "content", text);
  } else {
    cJSON_AddStringToObject(c, "text", text);
    cJSON_AddNullToObject(c, "logprobs");
  }
  cJSON_AddStringToObject(c, "finish_reason", m->finish);
  cJSON_AddItemToObject(o, "usage", usage_json(m));
  int rc = pr_json_append(out, o);
  cJSON_Delete(o);
  return rc;
}

int ag_mnn_fix_whole(ag_mnn *m, const char *body, size_t len, pr_buf *out) {
  cJSON *root = cJSON_ParseWithLength(body, len);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return pr_buf_append(out, body, len);
  }
  take_usage(m, root);
  cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
  cJSON *c;
  cJSON_ArrayForEach(c, choices) {
    cJSON *fr = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
    if (!cJSON_IsString(fr) || !fr->valuestring[0])
      cJSON_ReplaceItemInObjectCaseSensitive(c, "finish_reason", cJSON_CreateString("stop"));
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(c, "message");
    const cJSON *v = msg ? cJSON_GetObjectItemCaseSensitive(msg, "content")
                         : cJSON_GetObjectItemCaseSensitive(c, "text");
    /* Without a stream the tokens cannot be counted: estimate them as characters / 4. */
    if (cJSON_IsString(v) && m->real_completion < 0) m->n_tokens += ((int64_t)strlen(v->valuestring) + 3) / 4;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(root, "usage");
  cJSON_AddItemToObject(root, "usage", usage_json(m));
  int rc = pr_json_append(out, root);
  cJSON_Delete(root);
  return rc;
}
