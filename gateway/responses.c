/* The Responses API on chat completions; see responses.h. */
#include "responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "caps.h"

static const char T_INVALID[] = "invalid_request_error";

/* ---- the request --------------------------------------------------------------------------- */

/* The text of a message item's content: a string, or its text parts joined. Returns 0, or
 * fills err for a part that is no text. */
static int content_text(const cJSON *content, const char *where, pr_buf *out, pr_oai_error *err) {
  if (cJSON_IsString(content)) return pr_buf_append_str(out, content->valuestring) ? -1 : 0;
  if (!cJSON_IsArray(content)) {
    pr_oai_error_set(err, 400, T_INVALID, where, "invalid_type",
                     "Invalid type for '%s': expected a string or an array of content parts.", where);
    return -1;
  }
  int k = 0;
  const cJSON *part;
  cJSON_ArrayForEach(part, content) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
    const char *ty = cJSON_IsString(t) ? t->valuestring : "";
    if ((strcmp(ty, "input_text") == 0 || strcmp(ty, "output_text") == 0 || strcmp(ty, "text") == 0) &&
        cJSON_IsString(x)) {
      if (pr_buf_append_str(out, x->valuestring)) return -1;
    } else {
      char p[160];
      snprintf(p, sizeof(p), "%.100s[%d].type", where, k);
      pr_oai_error_set(err, 400, T_INVALID, p, "unsupported_value",
                       "Invalid value for '%s': this gateway's /v1/responses takes text parts "
                       "(input_text, output_text) only; got '%.40s'.", p, ty);
      return -1;
    }
    k++;
  }
  return 0;
}

static int add_message(cJSON *messages, const char *role, const char *text) {
  cJSON *m = cJSON_CreateObject();
  if (!m || !cJSON_AddItemToArray(messages, m)) {
    cJSON_Delete(m);
    return -1;
  }
  return cJSON_AddStringToObject(m, "role", role) && cJSON_AddStringToObject(m, "content", text) ? 0 : -1;
}

/* "input": a string (one user message) or a list of message items. */
static int input_messages(const cJSON *input, cJSON *messages, pr_oai_error *err) {
  if (cJSON_IsString(input)) return add_message(messages, "user", input->valuestring);
  if (!cJSON_IsArray(input)) {
    pr_oai_error_set(err, 400, T_INVALID, "input", input ? "invalid_type" : "missing_required_parameter",
                     input ? "Invalid type for 'input': expected a string or an array of input items."
                           : "Missing required parameter: 'input'.");
    return -1;
  }
  int i = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, input) {
    char where[64];
    snprintf(where, sizeof(where), "input[%d]", i);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(item, "type");
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(item, "role");
    if (!cJSON_IsObject(item) || (t && !(cJSON_IsString(t) && strcmp(t->valuestring, "message") == 0))) {
      pr_oai_error_set(err, 400, T_INVALID, where, "unsupported_value",
                       "Invalid value for '%s': this gateway's /v1/responses takes messages only "
                       "(no function calls, reasoning or other items); got type '%.40s'.", where,
                       cJSON_IsString(t) ? t->valuestring : "?");
      return -1;
    }
    const char *r = cJSON_IsString(role) ? role->valuestring : "";
    if (strcmp(r, "developer") == 0) r = "system";
    if (strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 && strcmp(r, "system") != 0) {
      char p[80];
      snprintf(p, sizeof(p), "%s.role", where);
      pr_oai_error_set(err, 400, T_INVALID, p, "invalid_value",
                       "Invalid value for '%s': expected one of 'user', 'assistant', 'system' or "
                       "'developer'.", p);
      return -1;
    }
    char p[80];
    snprintf(p, sizeof(p), "%s.content", where);
    pr_buf text;
    pr_buf_init(&text, PR_CAP_ANSWER);
    int rc = content_text(cJSON_GetObjectItemCaseSensitive(item, "content"), p, &text, err);
    if (!rc) rc = add_message(messages, r, pr_buf_cstr(&text));
    pr_buf_free(&text);
    if (rc) return -1;
    i++;
  }
  if (i == 0) {
    pr_oai_error_set(err, 400, T_INVALID, "input", "empty_array",
                     "Invalid 'input': empty array. Expected an array with minimum length 1.");
    return -1;
  }
  return 0;
}

/* A field the gateway cannot honour: 400 in OpenAI's shape. */
static int refuse(pr_oai_error *err, const char *param, const char *why) {
  pr_oai_error_set(err, 400, T_INVALID, param, "unsupported_parameter",
                   "Unsupported parameter: '%s': %s", param, why);
  return -1;
}

static int build_chat(gw_resp *r, const cJSON *in, cJSON *chat, pr_oai_error *err) {
  const cJSON *v;
  /* what this gateway does not keep or cannot carry */
  if ((v = cJSON_GetObjectItemCaseSensitive(in, "previous_response_id")) && !cJSON_IsNull(v))
    return refuse(err, "previous_response_id",
                  "this gateway stores no responses; send the conversation so far as input.");
  if ((v = cJSON_GetObjectItemCaseSensitive(in, "conversation")) && !cJSON_IsNull(v))
    return refuse(err, "conversation", "this gateway keeps no conversations; send the messages as input.");
  if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(in, "store")))
    return refuse(err, "store", "this gateway stores no responses (store: false).");
  if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(in, "background")))
    return refuse(err, "background", "this gateway answers in the foreground only.");
  if ((v = cJSON_GetObjectItemCaseSensitive(in, "tools")) && cJSON_GetArraySize(v) > 0)
    return refuse(err, "tools", "this gateway's /v1/responses serves text; use /v1/chat/completions for tools.");
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(in, "model");
  if (!cJSON_IsString(model) || !model->valuestring[0]) {
    pr_oai_error_set(err, 400, T_INVALID, "model", "missing_required_parameter",
                     "Missing required parameter: 'model'.");
    return -1;
  }
  if (!cJSON_AddStringToObject(chat, "model", model->valuestring)) return -1;
  cJSON *messages = cJSON_AddArrayToObject(chat, "messages");
  if (!messages) return -1;
  const cJSON *ins = cJSON_GetObjectItemCaseSensitive(in, "instructions");
  if (ins && !cJSON_IsNull(ins)) {
    if (!cJSON_IsString(ins)) {
      pr_oai_error_set(err, 400, T_INVALID, "instructions", "invalid_type",
                       "Invalid type for 'instructions': expected a string.");
      return -1;
    }
    if (add_message(messages, "system", ins->valuestring)) return -1;
  }
  if (input_messages(cJSON_GetObjectItemCaseSensitive(in, "input"), messages, err)) return -1;
  /* the same meaning under chat's names */
  if ((v = cJSON_GetObjectItemCaseSensitive(in, "max_output_tokens")) && !cJSON_IsNull(v)) {
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble) {
      pr_oai_error_set(err, 400, T_INVALID, "max_output_tokens", "invalid_type",
                       "Invalid type for 'max_output_tokens': expected an integer.");
      return -1;
    }
    if (v->valuedouble < 1) {
      pr_oai_error_set(err, 400, T_INVALID, "max_output_tokens", "integer_below_min_value",
                       "Invalid 'max_output_tokens': integer below minimum value. Expected a value "
                       ">= 1, but got %lld instead.", (long long)v->valuedouble);
      return -1;
    }
    cJSON_AddItemToObject(chat, "max_tokens", cJSON_Duplicate(v, 1));
  }
  static const char *const same[] = {"temperature", "top_p", "seed", "user", "chat_template_kwargs",
                                     "top_logprobs"};
  for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++)
    if ((v = cJSON_GetObjectItemCaseSensitive(in, same[i])) && !cJSON_IsNull(v))
      cJSON_AddItemToObject(chat, same[i], cJSON_Duplicate(v, 1));
  const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(in, "reasoning");
  if ((v = cJSON_GetObjectItemCaseSensitive(reasoning, "effort")) && cJSON_IsString(v))
    cJSON_AddStringToObject(chat, "reasoning_effort", v->valuestring);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(in, "text"), "format");
  const cJSON *ft = cJSON_GetObjectItemCaseSensitive(fmt, "type");
  if (cJSON_IsString(ft) && strcmp(ft->valuestring, "json_object") == 0) {
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    if (!rf || !cJSON_AddStringToObject(rf, "type", "json_object")) return -1;
  } else if (cJSON_IsString(ft) && strcmp(ft->valuestring, "json_schema") == 0) {
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    cJSON *js = rf ? cJSON_AddObjectToObject(rf, "json_schema") : NULL;
    if (!js || !cJSON_AddStringToObject(rf, "type", "json_schema")) return -1;
    static const char *const keys[] = {"name", "schema", "strict", "description"};
    for (size_t i = 0; i < 4; i++)
      if ((v = cJSON_GetObjectItemCaseSensitive(fmt, keys[i])))
        cJSON_AddItemToObject(js, keys[i], cJSON_Duplicate(v, 1));
  } else if (ft && !(cJSON_IsString(ft) && strcmp(ft->valuestring, "text") == 0)) {
    pr_oai_error_set(err, 400, T_INVALID, "text.format.type", "invalid_value",
                     "Invalid value for 'text.format.type': expected 'text', 'json_object' or 'json_schema'.");
    return -1;
  }
  const cJSON *stream = cJSON_GetObjectItemCaseSensitive(in, "stream");
  if (stream && !cJSON_IsNull(stream)) {
    if (!cJSON_IsBool(stream)) {
      pr_oai_error_set(err, 400, T_INVALID, "stream", "invalid_type",
                       "Invalid type for 'stream': expected a boolean.");
      return -1;
    }
    if (cJSON_IsTrue(stream)) {
      /* the usage comes last, for response.completed */
      cJSON *so = cJSON_AddObjectToObject(chat, "stream_options");
      if (!cJSON_AddTrueToObject(chat, "stream") || !so || !cJSON_AddTrueToObject(so, "include_usage")) return -1;
    }
  }
  /* what a Response repeats */
  static const char *const echo[] = {"instructions", "max_output_tokens", "temperature", "top_p",
                                     "metadata", "user", "text", "reasoning"};
  for (size_t i = 0; i < sizeof(echo) / sizeof(echo[0]); i++)
    if ((v = cJSON_GetObjectItemCaseSensitive(in, echo[i])))
      cJSON_AddItemToObject(r->echo, echo[i], cJSON_Duplicate(v, 1));
  snprintf(r->model, sizeof(r->model), "%s", model->valuestring);
  return 0;
}

int gw_resp_translate(gw_resp *r, const char *body, size_t len, const char *id_hex, int64_t now_s,
                      pr_buf *chat, pr_oai_error *err) {
  memset(r, 0, sizeof(*r));
  pr_buf_init(&r->text, PR_CAP_STREAM_TEXT);
  pr_buf_init(&r->reasoning, PR_CAP_STREAM_TEXT);
  r->rs_index = r->msg_index = -1;
  snprintf(r->id, sizeof(r->id), "resp_%.40s", id_hex);
  snprintf(r->msg_id, sizeof(r->msg_id), "msg_%.40s", id_hex);
  snprintf(r->rs_id, sizeof(r->rs_id), "rs_%.40s", id_hex);
  r->created_at = now_s;
  r->echo = cJSON_CreateObject();
  cJSON *in = cJSON_ParseWithLength(body ? body : "", len);
  cJSON *out = cJSON_CreateObject();
  int rc = -1;
  if (!cJSON_IsObject(in)) {
    pr_oai_error_set(err, 400, T_INVALID, NULL, "invalid_json",
                     "We could not parse the JSON body of your request. (HINT: This likely means "
                     "you aren't using your HTTP library correctly. The OpenAI API expects a JSON "
                     "payload, but what was sent was not valid JSON.)");
  } else if (r->echo && out && build_chat(r, in, out, err) == 0) {
    char *s = cJSON_PrintUnformatted(out);
    rc = s && !pr_buf_append_str(chat, s) ? 0 : -1;
    free(s);
    if (rc) pr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
  } else if (!err->status) {
    pr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
  }
  cJSON_Delete(in);
  cJSON_Delete(out);
  return rc;
}

void gw_resp_free(gw_resp *r) {
  cJSON_Delete(r->echo);
  r->echo = NULL;
  pr_buf_free(&r->text);
  pr_buf_free(&r->reasoning);
}

/* ---- the answer --------------------------------------------------------------------------- */

static cJSON *echoed(const gw_resp *r, const char *key, cJSON *dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->echo, key);
  if (v) {
    cJSON_Delete(dflt);
    return cJSON_Duplicate(v, 1);
  }
  return dflt;
}

static cJSON *text_part(const char *text) {
  cJSON *p = cJSON_CreateObject();
  cJSON_AddStringToObject(p, "type", "output_text");
  cJSON_AddStringToObject(p, "text", text);
  cJSON_AddItemToObject(p, "annotations", cJSON_CreateArray());
  cJSON_AddItemToObject(p, "logprobs", cJSON_CreateArray());
  return p;
}

static cJSON *message_item(const gw_resp *r, const char *text, int done) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", r->msg_id);
  cJSON_AddStringToObject(m, "type", "message");
  cJSON_AddStringToObject(m, "status", done ? "completed" : "in_progress");
  cJSON_AddStringToObject(m, "role", "assistant");
  cJSON *c = cJSON_AddArrayToObject(m, "content");
  if (text) cJSON_AddItemToArray(c, text_part(text));
  return m;
}

static cJSON *reasoning_item(const gw_resp *r, const char *text, int done) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", r->rs_id);
  cJSON_AddStringToObject(m, "type", "reasoning");
  cJSON_AddItemToObject(m, "summary", cJSON_CreateArray());
  cJSON *c = cJSON_AddArrayToObject(m, "content");
  if (text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "reasoning_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddItemToArray(c, p);
  }
  cJSON_AddStringToObject(m, "status", done ? "completed" : "in_progress");
  return m;
}

/* The Response object: status "in_progress", "completed", "incomplete" or "failed". */
static cJSON *response_obj(const gw_resp *r, const char *status, cJSON *output, const cJSON *error) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "object", "response");
  cJSON_AddNumberToObject(o, "created_at", (double)r->created_at);
  cJSON_AddStringToObject(o, "status", status);
  cJSON_AddItemToObject(o, "background", cJSON_CreateFalse());
  cJSON_AddItemToObject(o, "error", error ? cJSON_Duplicate(error, 1) : cJSON_CreateNull());
  if (strcmp(status, "incomplete") == 0) {
    cJSON *d = cJSON_AddObjectToObject(o, "incomplete_details");
    cJSON_AddStringToObject(d, "reason", "max_output_tokens");
  } else {
    cJSON_AddNullToObject(o, "incomplete_details");
  }
  cJSON_AddItemToObject(o, "instructions", echoed(r, "instructions", cJSON_CreateNull()));
  cJSON_AddItemToObject(o, "max_output_tokens", echoed(r, "max_output_tokens", cJSON_CreateNull()));
  cJSON_AddItemToObject(o, "metadata", echoed(r, "metadata", cJSON_CreateObject()));
  cJSON_AddStringToObject(o, "model", r->model);
  cJSON_AddItemToObject(o, "output", output ? output : cJSON_CreateArray());
  cJSON_AddTrueToObject(o, "parallel_tool_calls");
  cJSON_AddNullToObject(o, "previous_response_id");
  cJSON *rs = cJSON_CreateObject();
  cJSON_AddNullToObject(rs, "effort");
  cJSON_AddNullToObject(rs, "summary");
  cJSON_AddItemToObject(o, "reasoning", echoed(r, "reasoning", rs));
  cJSON_AddFalseToObject(o, "store");
  cJSON_AddItemToObject(o, "temperature", echoed(r, "temperature", cJSON_CreateNumber(1)));
  cJSON *tx = cJSON_CreateObject();
  cJSON *f = cJSON_AddObjectToObject(tx, "format");
  cJSON_AddStringToObject(f, "type", "text");
  cJSON_AddItemToObject(o, "text", echoed(r, "text", tx));
  cJSON_AddStringToObject(o, "tool_choice", "auto");
  cJSON_AddItemToObject(o, "tools", cJSON_CreateArray());
  cJSON_AddItemToObject(o, "top_p", echoed(r, "top_p", cJSON_CreateNumber(1)));
  cJSON_AddStringToObject(o, "truncation", "disabled");
  if (r->have_usage) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", (double)r->in_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "input_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)r->cached_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", (double)r->out_tokens);
    d = cJSON_AddObjectToObject(u, "output_tokens_details");
    cJSON_AddNumberToObject(d, "reasoning_tokens", (double)r->reasoning_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(r->in_tokens + r->out_tokens));
  } else {
    cJSON_AddNullToObject(o, "usage");
  }
  cJSON_AddItemToObject(o, "user", echoed(r, "user", cJSON_CreateNull()));
  return o;
}

static void take_usage(gw_resp *r, const cJSON *usage) {
  if (!cJSON_IsObject(usage)) return;
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
  const cJSON *d = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details"),
                                                    "cached_tokens");
  const cJSON *rt = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens_details"), "reasoning_tokens");
  r->in_tokens = cJSON_IsNumber(p) ? (int64_t)p->valuedouble : 0;
  r->out_tokens = cJSON_IsNumber(c) ? (int64_t)c->valuedouble : 0;
  r->cached_tokens = cJSON_IsNumber(d) ? (int64_t)d->valuedouble : 0;
  r->reasoning_tokens = cJSON_IsNumber(rt) ? (int64_t)rt->valuedouble : 0;
  r->have_usage = 1;
}

static const char *final_status(const gw_resp *r) {
  return strcmp(r->finish, "length") == 0 ? "incomplete" : "completed";
}

static int print_to(cJSON *o, pr_buf *out) {
  char *s = o ? cJSON_PrintUnformatted(o) : NULL;
  int rc = s && !pr_buf_append_str(out, s) ? 0 : -1;
  free(s);
  cJSON_Delete(o);
  return rc;
}

int gw_resp_whole(gw_resp *r, const char *chat, size_t len, pr_buf *out) {
  cJSON *root = cJSON_ParseWithLength(chat, len);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return -1;
  }
  const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
  const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
  const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
  const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
  const cJSON *fin = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (cJSON_IsString(model)) snprintf(r->model, sizeof(r->model), "%s", model->valuestring);
  snprintf(r->finish, sizeof(r->finish), "%s", cJSON_IsString(fin) ? fin->valuestring : "stop");
  take_usage(r, cJSON_GetObjectItemCaseSensitive(root, "usage"));
  cJSON *output = cJSON_CreateArray();
  int has_reasoning = cJSON_IsString(reasoning) && reasoning->valuestring[0];
  if (has_reasoning) cJSON_AddItemToArray(output, reasoning_item(r, reasoning->valuestring, 1));
  if ((cJSON_IsString(content) && content->valuestring[0]) || !has_reasoning)
    cJSON_AddItemToArray(output, message_item(r, cJSON_IsString(content) ? content->valuestring : "", 1));
  int rc = print_to(response_obj(r, final_status(r), output, NULL), out);
  cJSON_Delete(root);
  return rc;
}

/* One event: "event: TYPE\ndata: {"type":TYPE,"sequence_number":N,...}\n\n"; o is taken. */
static int event(gw_resp *r, const char *type, cJSON *o, pr_buf *out) {
  if (!o) return -1;
  cJSON_AddStringToObject(o, "type", type);
  cJSON_AddNumberToObject(o, "sequence_number", (double)r->seq++);
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  int rc = !s || pr_buf_appendf(out, "event: %s\ndata: %s\n\n", type, s) ? -1 : 0;
  free(s);
  return rc;
}

static int with_response(gw_resp *r, const char *type, const char *status, cJSON *output,
                         const cJSON *error, pr_buf *out) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddItemToObject(o, "response", response_obj(r, status, output, error));
  return event(r, type, o, out);
}

static int start(gw_resp *r, pr_buf *out) {
  if (r->started) return 0;
  r->started = 1;
  return with_response(r, "response.created", "in_progress", NULL, NULL, out) ||
         with_response(r, "response.in_progress", "in_progress", NULL, NULL, out);
}

static cJSON *item_event(int index, const char *item_id) {
  cJSON *o = cJSON_CreateObject();
  if (item_id) cJSON_AddStringToObject(o, "item_id", item_id);
  cJSON_AddNumberToObject(o, "output_index", index);
  return o;
}

static int close_reasoning(gw_resp *r, pr_buf *out) {
  if (!r->rs_open) return 0;
  r->rs_open = 0;
  cJSON *d = item_event(r->rs_index, r->rs_id);
  cJSON_AddNumberToObject(d, "content_index", 0);
  cJSON_AddStringToObject(d, "text", pr_buf_cstr(&r->reasoning));
  cJSON *o = item_event(r->rs_index, NULL);
  cJSON_AddItemToObject(o, "item", reasoning_item(r, pr_buf_cstr(&r->reasoning), 1));
  return event(r, "response.reasoning_text.done", d, out) || event(r, "response.output_item.done", o, out);
}

static int close_message(gw_resp *r, pr_buf *out) {
  if (!r->msg_open) return 0;
  r->msg_open = 0;
  const char *text = pr_buf_cstr(&r->text);
  cJSON *d = item_event(r->msg_index, r->msg_id);
  cJSON_AddNumberToObject(d, "content_index", 0);
  cJSON_AddStringToObject(d, "text", text);
  cJSON_AddItemToObject(d, "logprobs", cJSON_CreateArray());
  cJSON *p = item_event(r->msg_index, r->msg_id);
  cJSON_AddNumberToObject(p, "content_index", 0);
  cJSON_AddItemToObject(p, "part", text_part(text));
  cJSON *o = item_event(r->msg_index, NULL);
  cJSON_AddItemToObject(o, "item", message_item(r, text, 1));
  return event(r, "response.output_text.done", d, out) || event(r, "response.content_part.done", p, out) ||
         event(r, "response.output_item.done", o, out);
}

static int open_message(gw_resp *r, pr_buf *out) {
  if (r->msg_open || r->msg_index >= 0) return 0;
  if (close_reasoning(r, out)) return -1;
  r->msg_open = 1;
  r->msg_index = r->n_items++;
  cJSON *o = item_event(r->msg_index, NULL);
  cJSON_AddItemToObject(o, "item", message_item(r, NULL, 0));
  cJSON *p = item_event(r->msg_index, r->msg_id);
  cJSON_AddNumberToObject(p, "content_index", 0);
  cJSON_AddItemToObject(p, "part", text_part(""));
  return event(r, "response.output_item.added", o, out) || event(r, "response.content_part.added", p, out);
}

/* The output so far, as a finished response lists it. */
static cJSON *output_now(const gw_resp *r) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < r->n_items; i++) {
    if (i == r->rs_index) cJSON_AddItemToArray(a, reasoning_item(r, pr_buf_cstr(&r->reasoning), 1));
    if (i == r->msg_index) cJSON_AddItemToArray(a, message_item(r, pr_buf_cstr(&r->text), 1));
  }
  return a;
}

static int finish(gw_resp *r, pr_buf *out) {
  if (start(r, out)) return -1;
  if (r->msg_index < 0 && r->rs_index < 0 && open_message(r, out)) return -1; /* an empty answer */
  if (close_reasoning(r, out) || close_message(r, out)) return -1;
  const char *status = final_status(r);
  return with_response(r, strcmp(status, "incomplete") == 0 ? "response.incomplete" : "response.completed",
                       status, output_now(r), NULL, out);
}

int gw_resp_chunk(gw_resp *r, const char *data, size_t len, pr_buf *out) {
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) return finish(r, out);
  cJSON *root = cJSON_ParseWithLength(data, len);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return 0; /* nothing a Responses client would read */
  }
  int rc = start(r, out);
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (cJSON_IsString(model)) snprintf(r->model, sizeof(r->model), "%s", model->valuestring);
  take_usage(r, cJSON_GetObjectItemCaseSensitive(root, "usage"));
  const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
  const cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
  const cJSON *fin = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
  if (cJSON_IsString(fin)) snprintf(r->finish, sizeof(r->finish), "%s", fin->valuestring);
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(delta, "reasoning_content");
  const cJSON *tx = cJSON_GetObjectItemCaseSensitive(delta, "content");
  if (!rc && cJSON_IsString(rs) && rs->valuestring[0] && r->msg_index < 0) {
    if (!r->rs_open && r->rs_index < 0) {
      r->rs_open = 1;
      r->rs_index = r->n_items++;
      cJSON *o = item_event(r->rs_index, NULL);
      cJSON_AddItemToObject(o, "item", reasoning_item(r, NULL, 0));
      rc = event(r, "response.output_item.added", o, out);
    }
    if (!rc && pr_buf_append_str(&r->reasoning, rs->valuestring)) rc = -1;
    cJSON *d = item_event(r->rs_index, r->rs_id);
    cJSON_AddNumberToObject(d, "content_index", 0);
    cJSON_AddStringToObject(d, "delta", rs->valuestring);
    if (!rc) rc = event(r, "response.reasoning_text.delta", d, out);
    else cJSON_Delete(d);
  }
  if (!rc && cJSON_IsString(tx) && tx->valuestring[0]) {
    rc = open_message(r, out);
    if (!rc && pr_buf_append_str(&r->text, tx->valuestring)) rc = -1;
    cJSON *d = item_event(r->msg_index, r->msg_id);
    cJSON_AddNumberToObject(d, "content_index", 0);
    cJSON_AddStringToObject(d, "delta", tx->valuestring);
    cJSON_AddItemToObject(d, "logprobs", cJSON_CreateArray());
    if (!rc) rc = event(r, "response.output_text.delta", d, out);
    else cJSON_Delete(d);
  }
  cJSON_Delete(root);
  return rc;
}

int gw_resp_fail(gw_resp *r, const char *error_body, size_t len, pr_buf *out) {
  cJSON *root = cJSON_ParseWithLength(error_body, len);
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "code");
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "param");
  const char *msg = cJSON_IsString(m) ? m->valuestring : "the answer failed";
  const char *code = cJSON_IsString(c) ? c->valuestring : "server_error";
  int rc = start(r, out);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "code", code);
  cJSON_AddStringToObject(o, "message", msg);
  if (cJSON_IsString(p)) cJSON_AddStringToObject(o, "param", p->valuestring);
  else cJSON_AddNullToObject(o, "param");
  if (!rc) rc = event(r, "error", o, out);
  else cJSON_Delete(o);
  cJSON *err = cJSON_CreateObject();
  cJSON_AddStringToObject(err, "code", code);
  cJSON_AddStringToObject(err, "message", msg);
  if (!rc) rc = with_response(r, "response.failed", "failed", output_now(r), err, out);
  cJSON_Delete(err);
  cJSON_Delete(root);
  return rc;
}
