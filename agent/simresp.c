/* The Responses API as b10587 serves it; see simresp.h. Key orders are the server's
 * (nlohmann::ordered_json in tools/server/server-chat.cpp and server-task.cpp). */
#include "simresp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

static const cJSON *rs_get(const cJSON *o, const char *k) {
  return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

static int rs_is_string(const cJSON *o, const char *k) { return cJSON_IsString(rs_get(o, k)); }
static int rs_is_array(const cJSON *o, const char *k) { return cJSON_IsArray(rs_get(o, k)); }

static int rs_str_is(const cJSON *o, const char *k, const char *want) {
  const cJSON *v = rs_get(o, k);
  return cJSON_IsString(v) && strcmp(v->valuestring, want) == 0;
}

/* json_value<std::string> */
static const char *rs_str(const cJSON *o, const char *k, const char *def) {
  const cJSON *v = rs_get(o, k);
  return cJSON_IsString(v) ? v->valuestring : def;
}

static int rs_refuse(ag_simreq_refusal *ref, const char *msg) {
  ref->status = 400;
  ref->type = "invalid_request_error";
  int rc = pr_buf_append_str(&ref->message, msg);
  return rc < 0 ? rc : 1;
}

/* Replace (or add, at the end) key in o with v, which o takes. */
static int rs_set(cJSON *o, const char *k, cJSON *v) {
  if (!v) return -ENOMEM;
  if (cJSON_GetObjectItemCaseSensitive(o, k)) return cJSON_ReplaceItemInObjectCaseSensitive(o, k, v) ? 0 : -ENOMEM;
  return cJSON_AddItemToObject(o, k, v) ? 0 : -ENOMEM;
}

static cJSON *rs_text_part(const cJSON *text, const char *type) {
  cJSON *p = cJSON_CreateObject();
  if (p && (!cJSON_AddItemToObject(p, "text", cJSON_Duplicate(text, 1)) || !cJSON_AddStringToObject(p, "type", type))) {
    cJSON_Delete(p);
    return NULL;
  }
  return p;
}

/* An input message (user, system, developer): its parts become chat parts. */
static int rs_input_message(cJSON *item, cJSON *msgs, ag_simreq_refusal *ref) {
  cJSON *parts = cJSON_CreateArray(), *it;
  if (!parts) return -ENOMEM;
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(item, "content")) {
    const char *type = rs_str(it, "type", "");
    cJSON *p = NULL;
    if (strcmp(type, "input_text") == 0) {
      if (!rs_get(it, "text")) {
        cJSON_Delete(parts);
        return rs_refuse(ref, "'Input text' requires 'text'");
      }
      p = rs_text_part(rs_get(it, "text"), "text");
    } else if (strcmp(type, "input_image") == 0) {
      if (!rs_get(it, "image_url")) {
        cJSON_Delete(parts);
        return rs_refuse(ref, "'image_url' is required");
      }
      p = cJSON_CreateObject();
      cJSON *u = p ? cJSON_AddObjectToObject(p, "image_url") : NULL;
      if (!u || !cJSON_AddItemToObject(u, "url", cJSON_Duplicate(rs_get(it, "image_url"), 1)) ||
          !cJSON_AddStringToObject(p, "type", "image_url")) {
        cJSON_Delete(p);
        p = NULL;
      }
    } else {
      cJSON_Delete(parts);
      return rs_refuse(ref, strcmp(type, "input_file") == 0
                                ? "'input_file' is not supported by llamacpp at this moment"
                                : "'type' must be one of 'input_text', 'input_image', or 'input_file'");
    }
    if (!p) {
      cJSON_Delete(parts);
      return -ENOMEM;
    }
    cJSON_AddItemToArray(parts, p);
  }
  cJSON_DeleteItemFromObjectCaseSensitive(item, "type");
  cJSON_DeleteItemFromObjectCaseSensitive(item, "status");
  int rc = rs_set(item, "content", parts);
  cJSON *copy = rc ? NULL : cJSON_Duplicate(item, 1);
  return !copy ? -ENOMEM : cJSON_AddItemToArray(msgs, copy) ? 0 : -ENOMEM;
}

/* An output message (assistant): its text and refusals, merged into the assistant
 * message before it if there is one. */
static int rs_output_message(cJSON *item, cJSON *msgs, cJSON *prev, ag_simreq_refusal *ref) {
  cJSON *parts = cJSON_CreateArray(), *it;
  if (!parts) return -ENOMEM;
  const cJSON *content = rs_get(item, "content");
  if (cJSON_IsString(content)) {
    cJSON_AddItemToArray(parts, rs_text_part(content, "text"));
  } else if (cJSON_IsArray(content)) {
    cJSON_ArrayForEach(it, content) {
      const char *type = rs_str(it, "type", "");
      if (strcmp(type, "output_text") == 0 || strcmp(type, "input_text") == 0) {
        if (!rs_is_string(it, "text")) {
          cJSON_Delete(parts);
          return rs_refuse(ref, "'Output text' requires 'text'");
        }
        cJSON_AddItemToArray(parts, rs_text_part(rs_get(it, "text"), "text"));
      } else if (strcmp(type, "refusal") == 0) {
        if (!rs_is_string(it, "refusal")) {
          cJSON_Delete(parts);
          return rs_refuse(ref, "'Refusal' requires 'refusal'");
        }
        cJSON *p = cJSON_CreateObject();
        cJSON_AddItemToObject(p, "refusal", cJSON_Duplicate(rs_get(it, "refusal"), 1));
        cJSON_AddStringToObject(p, "type", "refusal");
        cJSON_AddItemToArray(parts, p);
      } else {
        cJSON_Delete(parts);
        return rs_refuse(ref, "'type' must be one of 'output_text' or 'refusal'");
      }
    }
  }
  if (prev) {
    cJSON *pc = cJSON_GetObjectItemCaseSensitive(prev, "content");
    if (!cJSON_IsArray(pc)) {
      if (rs_set(prev, "content", cJSON_CreateArray()) < 0) {
        cJSON_Delete(parts);
        return -ENOMEM;
      }
      pc = cJSON_GetObjectItemCaseSensitive(prev, "content");
    }
    while (parts->child) cJSON_AddItemToArray(pc, cJSON_DetachItemViaPointer(parts, parts->child));
    cJSON_Delete(parts);
    return 0;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(item, "status");
  cJSON_DeleteItemFromObjectCaseSensitive(item, "type");
  if (rs_set(item, "content", parts) < 0) return -ENOMEM;
  cJSON *copy = cJSON_Duplicate(item, 1);
  return copy && cJSON_AddItemToArray(msgs, copy) ? 0 : -ENOMEM;
}

/* A function call: a tool call of an assistant message (the one before, or a new one). */
static int rs_function_call(const cJSON *item, cJSON *msgs, cJSON *prev) {
  cJSON *tc = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(tc, "function");
  if (!fn) {
    cJSON_Delete(tc);
    return -ENOMEM;
  }
  cJSON_AddItemToObject(fn, "arguments", cJSON_Duplicate(rs_get(item, "arguments"), 1));
  cJSON_AddItemToObject(fn, "name", cJSON_Duplicate(rs_get(item, "name"), 1));
  cJSON_AddItemToObject(tc, "id", cJSON_Duplicate(rs_get(item, "call_id"), 1));
  cJSON_AddStringToObject(tc, "type", "function");
  if (prev) {
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(prev, "tool_calls");
    if (!cJSON_IsArray(calls)) {
      if (rs_set(prev, "tool_calls", cJSON_CreateArray()) < 0) {
        cJSON_Delete(tc);
        return -ENOMEM;
      }
      calls = cJSON_GetObjectItemCaseSensitive(prev, "tool_calls");
    }
    cJSON_AddItemToArray(calls, tc);
    return 0;
  }
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "role", "assistant");
  cJSON_AddItemToArray(cJSON_AddArrayToObject(m, "tool_calls"), tc);
  return cJSON_AddItemToArray(msgs, m) ? 0 : -ENOMEM;
}

/* A function call's output: a tool message. */
static int rs_function_output(const cJSON *item, cJSON *msgs, ag_simreq_refusal *ref) {
  cJSON *out = cJSON_Duplicate(rs_get(item, "output"), 1), *it;
  if (!out) return -ENOMEM;
  cJSON *arr = cJSON_IsArray(out) ? out : NULL;
  cJSON_ArrayForEach(it, arr) {
    if (!rs_str_is(it, "type", "input_text")) {
      cJSON_Delete(out);
      return rs_refuse(ref, "Output of tool call should be 'Input text'");
    }
    cJSON_ReplaceItemInObjectCaseSensitive(it, "type", cJSON_CreateString("text"));
  }
  cJSON *m = cJSON_CreateObject();
  cJSON_AddItemToObject(m, "content", out);
  cJSON_AddStringToObject(m, "role", "tool");
  cJSON_AddItemToObject(m, "tool_call_id", cJSON_Duplicate(rs_get(item, "call_id"), 1));
  return cJSON_AddItemToArray(msgs, m) ? 0 : -ENOMEM;
}

/* A reasoning item: the reasoning_content of an assistant message. */
static int rs_reasoning(const cJSON *item, cJSON *msgs, cJSON *prev, ag_simreq_refusal *ref) {
  const cJSON *content = rs_get(item, "content");
  if (!cJSON_IsArray(content)) return rs_refuse(ref, "item['content'] is not an array");
  if (!content->child) return rs_refuse(ref, "item['content'] is empty");
  if (!rs_is_string(content->child, "text")) return rs_refuse(ref, "item['content']['text'] is not a string");
  cJSON *text = cJSON_Duplicate(rs_get(content->child, "text"), 1);
  if (prev) return rs_set(prev, "reasoning_content", text);
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "role", "assistant");
  cJSON_AddArrayToObject(m, "content");
  cJSON_AddItemToObject(m, "reasoning_content", text);
  return cJSON_AddItemToArray(msgs, m) ? 0 : -ENOMEM;
}

static int rs_item(const cJSON *orig, cJSON *msgs, ag_simreq_refusal *ref) {
  cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
  cJSON *prev = last && rs_str_is(last, "role", "assistant") ? last : NULL;
  cJSON *item = cJSON_Duplicate(orig, 1);
  int rc = 0;
  if (!item) return -ENOMEM;
  if (rs_is_string(item, "content")) {
    /* a message's text: as one input_text part */
    cJSON *parts = cJSON_CreateArray();
    cJSON_AddItemToArray(parts, rs_text_part(rs_get(item, "content"), "input_text"));
    rc = rs_set(item, "content", parts);
  }
  const char *role = rs_str(item, "role", NULL);
  if (rc) {
  } else if (rs_is_array(item, "content") && role &&
             (strcmp(role, "user") == 0 || strcmp(role, "system") == 0 || strcmp(role, "developer") == 0)) {
    rc = rs_input_message(item, msgs, ref);
  } else if (role && strcmp(role, "assistant") == 0 && rs_str_is(item, "type", "message")) {
    rc = rs_output_message(item, msgs, prev, ref);
  } else if (rs_is_string(item, "arguments") && rs_is_string(item, "call_id") && rs_is_string(item, "name") &&
             rs_str_is(item, "type", "function_call")) {
    rc = rs_function_call(item, msgs, prev);
  } else if (rs_is_string(item, "call_id") && (rs_is_string(item, "output") || rs_is_array(item, "output")) &&
             rs_str_is(item, "type", "function_call_output")) {
    rc = rs_function_output(item, msgs, ref);
  } else if (rs_is_array(item, "summary") && rs_str_is(item, "type", "reasoning")) {
    rc = rs_reasoning(item, msgs, prev, ref);
  } else {
    rc = rs_refuse(ref, "Cannot determine type of 'item'");
  }
  cJSON_Delete(item);
  return rc;
}

/* tools: function tools as chat tools ("strict" true unless given); others dropped. */
static int rs_tools(const cJSON *tools, cJSON *chat, ag_simreq_refusal *ref) {
  const cJSON *t;
  if (!cJSON_IsArray(tools)) return rs_refuse(ref, "'tools' must be an array of objects");
  cJSON *out = cJSON_CreateArray();
  if (!out) return -ENOMEM;
  cJSON_ArrayForEach(t, tools) {
    if (strcmp(rs_str(t, "type", ""), "function") != 0) continue;
    cJSON *fn = cJSON_Duplicate(t, 1), *ct = cJSON_CreateObject();
    if (!fn || !ct) {
      cJSON_Delete(fn);
      cJSON_Delete(ct);
      cJSON_Delete(out);
      return -ENOMEM;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(fn, "type");
    if (!cJSON_GetObjectItemCaseSensitive(fn, "strict")) cJSON_AddTrueToObject(fn, "strict");
    cJSON_AddStringToObject(ct, "type", "function");
    cJSON_AddItemToObject(ct, "function", fn);
    cJSON_AddItemToArray(out, ct);
  }
  cJSON_DeleteItemFromObjectCaseSensitive(chat, "tools");
  if (out->child) return cJSON_AddItemToObject(chat, "tools", out) ? 0 : -ENOMEM;
  cJSON_Delete(out);
  return 0;
}

int ag_simresp_to_chat(const cJSON *body, cJSON **chat, ag_simreq_refusal *ref) {
  *chat = NULL;
  const cJSON *input = rs_get(body, "input"), *it;
  if (!input) return rs_refuse(ref, "'input' is required");
  if (rs_str(body, "previous_response_id", "")[0])
    return rs_refuse(ref, "llama.cpp does not support 'previous_response_id'.");
  cJSON *c = cJSON_Duplicate(body, 1), *msgs = cJSON_CreateArray();
  int rc = c && msgs ? 0 : -ENOMEM;
  if (rc == 0) cJSON_DeleteItemFromObjectCaseSensitive(c, "input");
  if (rc == 0 && rs_get(body, "instructions")) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "system");
    cJSON_AddStringToObject(m, "content", rs_str(body, "instructions", ""));
    cJSON_AddItemToArray(msgs, m);
    cJSON_DeleteItemFromObjectCaseSensitive(c, "instructions");
  }
  if (rc == 0 && cJSON_IsString(input)) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddItemToObject(m, "content", cJSON_Duplicate(input, 1));
    cJSON_AddItemToArray(msgs, m);
  } else if (rc == 0 && cJSON_IsArray(input)) {
    cJSON_ArrayForEach(it, input) {
      if ((rc = rs_item(it, msgs, ref))) break;
    }
  } else if (rc == 0) {
    rc = rs_refuse(ref, "'input' must be a string or array of objects");
  }
  if (rc == 0) {
    cJSON_AddItemToObject(c, "messages", msgs);
    msgs = NULL;
  }
  if (rc == 0 && rs_get(body, "tools")) rc = rs_tools(rs_get(body, "tools"), c, ref);
  if (rc == 0 && rs_get(body, "max_output_tokens")) {
    cJSON_DeleteItemFromObjectCaseSensitive(c, "max_output_tokens");
    rc = rs_set(c, "max_tokens", cJSON_Duplicate(rs_get(body, "max_output_tokens"), 1));
  }
  if (rc == 0 && rs_get(body, "reasoning")) {
    const cJSON *effort = rs_get(rs_get(body, "reasoning"), "effort");
    if (effort) rc = rs_set(c, "reasoning_effort", cJSON_Duplicate(effort, 1));
    cJSON_DeleteItemFromObjectCaseSensitive(c, "reasoning");
  }
  cJSON_Delete(msgs);
  if (rc != 0) {
    cJSON_Delete(c);
    return rc;
  }
  *chat = c;
  return 0;
}

/* ---- answers ------------------------------------------------------------------------ */

static int rs_emit(pr_buf *out, cJSON *item) {
  if (!item) return -ENOMEM;
  char *s = cJSON_PrintUnformatted(item);
  cJSON_Delete(item);
  if (!s) return -ENOMEM;
  int rc = pr_buf_append_str(out, s);
  free(s);
  return rc;
}

static int rs_event(pr_buf *out, const char *name, cJSON *data) {
  if (!data) return -ENOMEM;
  int rc = pr_buf_appendf(out, "event: %s\ndata: ", name);
  if (rc == 0) rc = rs_emit(out, data);
  else cJSON_Delete(data);
  return rc ? rc : pr_buf_append_str(out, "\n\n");
}

static cJSON *rs_data(const char *type) {
  cJSON *d = cJSON_CreateObject();
  if (d) cJSON_AddStringToObject(d, "type", type);
  return d;
}

static void rs_add_usage(cJSON *o, const ag_llsrv_timings *t) {
  cJSON *u = cJSON_AddObjectToObject(o, "usage");
  int64_t in = t->cache_n + t->prompt_n;
  cJSON_AddNumberToObject(u, "input_tokens", (double)in);
  cJSON_AddNumberToObject(u, "output_tokens", (double)t->predicted_n);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(in + t->predicted_n));
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", (double)t->cache_n);
}

static cJSON *rs_reasoning_item(const ag_simresp *r, const char *status, int with_text) {
  cJSON *it = cJSON_CreateObject();
  cJSON_AddStringToObject(it, "id", r->rs_id);
  cJSON_AddArrayToObject(it, "summary");
  cJSON_AddStringToObject(it, "type", "reasoning");
  cJSON *c = cJSON_AddArrayToObject(it, "content");
  if (with_text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "text", r->reasoning);
    cJSON_AddStringToObject(p, "type", "reasoning_text");
    cJSON_AddItemToArray(c, p);
  }
  cJSON_AddStringToObject(it, "encrypted_content", "");
  if (status) cJSON_AddStringToObject(it, "status", status);
  return it;
}

static cJSON *rs_text_content(const char *text) {
  cJSON *p = cJSON_CreateObject();
  cJSON_AddStringToObject(p, "type", "output_text");
  cJSON_AddArrayToObject(p, "annotations");
  cJSON_AddArrayToObject(p, "logprobs");
  cJSON_AddStringToObject(p, "text", text);
  return p;
}

static cJSON *rs_call_item(const ag_simresp *r, const char *status, const char *args) {
  char id[96];
  cJSON *it = cJSON_CreateObject();
  snprintf(id, sizeof(id), "fc_%s", r->call_id);
  cJSON_AddStringToObject(it, "id", id);
  if (!status) cJSON_AddStringToObject(it, "arguments", "");
  snprintf(id, sizeof(id), "call_%s", r->call_id);
  if (!status) {
    cJSON_AddStringToObject(it, "call_id", id);
    cJSON_AddStringToObject(it, "name", r->tool_name);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "status", "in_progress");
    return it;
  }
  cJSON_AddStringToObject(it, "type", "function_call");
  cJSON_AddStringToObject(it, "status", status);
  cJSON_AddStringToObject(it, "arguments", args);
  cJSON_AddStringToObject(it, "call_id", id);
  cJSON_AddStringToObject(it, "name", r->tool_name);
  return it;
}

int ag_simresp_whole(pr_buf *out, const ag_simresp *r, const ag_llsrv_timings *t) {
  cJSON *o = cJSON_CreateObject(), *output;
  cJSON_AddNumberToObject(o, "completed_at", (double)r->created);
  cJSON_AddNumberToObject(o, "created_at", (double)r->created);
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "model", r->model);
  cJSON_AddStringToObject(o, "object", "response");
  output = cJSON_AddArrayToObject(o, "output");
  if (!output) {
    cJSON_Delete(o);
    return -ENOMEM;
  }
  if (r->reasoning[0]) cJSON_AddItemToArray(output, rs_reasoning_item(r, "completed", 1));
  if (r->content[0]) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(m, "content"), rs_text_content(r->content));
    cJSON_AddStringToObject(m, "id", r->msg_id);
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "status", "completed");
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddItemToArray(output, m);
  }
  if (r->tool_name) cJSON_AddItemToArray(output, rs_call_item(r, "completed", r->arguments));
  cJSON_AddStringToObject(o, "status", "completed");
  rs_add_usage(o, t);
  return rs_emit(out, o);
}

static cJSON *rs_response_head(const ag_simresp *r) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", r->id);
  cJSON_AddStringToObject(o, "object", "response");
  cJSON_AddStringToObject(o, "status", "in_progress");
  return o;
}

int ag_simresp_ev_start(pr_buf *out, const ag_simresp *r) {
  static const char *const names[] = {"response.created", "response.in_progress"};
  for (int i = 0; i < 2; i++) {
    cJSON *d = rs_data(names[i]);
    if (d) cJSON_AddItemToObject(d, "response", rs_response_head(r));
    int rc = rs_event(out, names[i], d);
    if (rc) return rc;
  }
  return 0;
}

int ag_simresp_ev_token(pr_buf *out, const ag_simresp *r, char kind, int first_of_kind, const char *text) {
  int rc = 0;
  cJSON *d;
  char id[96];
  if (kind == 'r') {
    if (first_of_kind) {
      d = rs_data("response.output_item.added");
      if (d) cJSON_AddItemToObject(d, "item", rs_reasoning_item(r, "in_progress", 0));
      if ((rc = rs_event(out, "response.output_item.added", d))) return rc;
    }
    d = rs_data("response.reasoning_text.delta");
    if (d) {
      cJSON_AddStringToObject(d, "delta", text);
      cJSON_AddStringToObject(d, "item_id", r->rs_id);
    }
    return rs_event(out, "response.reasoning_text.delta", d);
  }
  if (kind == 'c') {
    if (first_of_kind) {
      d = rs_data("response.output_item.added");
      cJSON *it = cJSON_CreateObject();
      cJSON_AddArrayToObject(it, "content");
      cJSON_AddStringToObject(it, "id", r->msg_id);
      cJSON_AddStringToObject(it, "role", "assistant");
      cJSON_AddStringToObject(it, "status", "in_progress");
      cJSON_AddStringToObject(it, "type", "message");
      if (d) cJSON_AddItemToObject(d, "item", it);
      else cJSON_Delete(it);
      if ((rc = rs_event(out, "response.output_item.added", d))) return rc;
      d = rs_data("response.content_part.added");
      if (d) {
        cJSON_AddStringToObject(d, "item_id", r->msg_id);
        cJSON *p = cJSON_AddObjectToObject(d, "part");
        cJSON_AddStringToObject(p, "type", "output_text");
        cJSON_AddStringToObject(p, "text", "");
      }
      if ((rc = rs_event(out, "response.content_part.added", d))) return rc;
    }
    d = rs_data("response.output_text.delta");
    if (d) {
      cJSON_AddStringToObject(d, "item_id", r->msg_id);
      cJSON_AddStringToObject(d, "delta", text);
    }
    return rs_event(out, "response.output_text.delta", d);
  }
  if (kind == 'f') {
    d = rs_data("response.output_item.added");
    if (d) cJSON_AddItemToObject(d, "item", rs_call_item(r, NULL, NULL));
    return rs_event(out, "response.output_item.added", d);
  }
  d = rs_data("response.function_call_arguments.delta");
  snprintf(id, sizeof(id), "fc_%s", r->call_id);
  if (d) {
    cJSON_AddStringToObject(d, "delta", text);
    cJSON_AddStringToObject(d, "item_id", id);
  }
  return rs_event(out, "response.function_call_arguments.delta", d);
}

int ag_simresp_ev_done(pr_buf *out, const ag_simresp *r, const ag_llsrv_timings *t) {
  cJSON *output = cJSON_CreateArray(), *d;
  int rc = output ? 0 : -ENOMEM;
  if (rc == 0 && r->reasoning[0]) {
    cJSON *it = rs_reasoning_item(r, NULL, 1);
    cJSON_AddItemToArray(output, cJSON_Duplicate(it, 1));
    d = rs_data("response.output_item.done");
    if (d) cJSON_AddItemToObject(d, "item", it);
    else cJSON_Delete(it);
    rc = rs_event(out, "response.output_item.done", d);
  }
  if (rc == 0 && r->content[0]) {
    d = rs_data("response.output_text.done");
    if (d) {
      cJSON_AddStringToObject(d, "item_id", r->msg_id);
      cJSON_AddStringToObject(d, "text", r->content);
    }
    rc = rs_event(out, "response.output_text.done", d);
    d = rs_data("response.content_part.done");
    if (d) {
      cJSON_AddStringToObject(d, "item_id", r->msg_id);
      cJSON_AddItemToObject(d, "part", rs_text_content(r->content));
    }
    if (rc == 0) rc = rs_event(out, "response.content_part.done", d);
    else cJSON_Delete(d);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "status", "completed");
    cJSON_AddStringToObject(it, "id", r->msg_id);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(it, "content"), rs_text_content(r->content));
    cJSON_AddStringToObject(it, "role", "assistant");
    cJSON_AddItemToArray(output, cJSON_Duplicate(it, 1));
    d = rs_data("response.output_item.done");
    if (d) cJSON_AddItemToObject(d, "item", it);
    else cJSON_Delete(it);
    if (rc == 0) rc = rs_event(out, "response.output_item.done", d);
    else cJSON_Delete(d);
  }
  if (rc == 0 && r->tool_name) {
    cJSON *it = rs_call_item(r, "completed", r->arguments);
    cJSON_AddItemToArray(output, cJSON_Duplicate(it, 1));
    d = rs_data("response.output_item.done");
    if (d) cJSON_AddItemToObject(d, "item", it);
    else cJSON_Delete(it);
    rc = rs_event(out, "response.output_item.done", d);
  }
  if (rc) {
    cJSON_Delete(output);
    return rc;
  }
  d = rs_data("response.completed");
  cJSON *resp = cJSON_AddObjectToObject(d, "response");
  if (!resp) {
    cJSON_Delete(d);
    cJSON_Delete(output);
    return -ENOMEM;
  }
  cJSON_AddStringToObject(resp, "id", r->id);
  cJSON_AddStringToObject(resp, "object", "response");
  cJSON_AddNumberToObject(resp, "created_at", (double)r->created);
  cJSON_AddStringToObject(resp, "status", "completed");
  cJSON_AddStringToObject(resp, "model", r->model);
  cJSON_AddItemToObject(resp, "output", output);
  rs_add_usage(resp, t);
  ag_llsrv_add_timings(d, t, AG_LLSRV_2026);
  return rs_event(out, "response.completed", d);
}
