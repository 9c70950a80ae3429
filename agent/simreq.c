/* llama-server's request checks as the sim plays them, for two releases (see simreq.h):
 * server.cpp, utils.hpp and common/chat.cpp of February 2025, and server-common.cpp,
 * server-schema.cpp, server-chat.cpp and common/chat.cpp of b10587 (August 2026). Each
 * message below was seen from the real servers; tests/system/test_sim.py sends the same
 * requests to both builds and to the sim and compares the answers byte for byte. */
#include "simreq.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "err.h"
#include "nljson.h"
#include "simgen.h"

/* A refusal message embeds the request's messages or tools: cap it well above any
 * request body the sim's HTTP layer takes. */
#define SR_MAX_MESSAGE ((size_t)32 << 20)
/* OpenAI's largest top_logprobs; llama-server has no limit, the sim's vocabulary does. */
#define SR_MAX_TOP_LOGPROBS 20
#define SR_REF_8367 " (ref: https://github.com/ggml-org/llama.cpp/issues/8367)"

static const char SR_SERVER[] = "server_error";
static const char SR_INVALID[] = "invalid_request_error";

void ag_simreq_refusal_init(ag_simreq_refusal *ref) {
  memset(ref, 0, sizeof(*ref));
  pr_buf_init(&ref->message, SR_MAX_MESSAGE);
}

void ag_simreq_refusal_free(ag_simreq_refusal *ref) { pr_buf_free(&ref->message); }

/* One read of a body: the tree, its number literals, and where a refusal goes. */
typedef struct sr_ctx {
  const cJSON *root;
  ag_nl_lits lits;
  ag_simreq_refusal *ref;
  int release;    /* AG_SIMREQ_2025 or AG_SIMREQ_2026 */
  int n_parallel; /* the server's slots */
  int stream_tools;
} sr_ctx;

/* nlohmann's ordered_json keeps the last of duplicate keys (cJSON finds the first). */
static const cJSON *sr_get(const cJSON *obj, const char *key) {
  const cJSON *hit = NULL;
  if (!cJSON_IsObject(obj)) return NULL;
  for (const cJSON *c = obj->child; c; c = c->next)
    if (c->string && strcmp(c->string, key) == 0) hit = c;
  return hit;
}

/* v when it is an array, else NULL: what cJSON_ArrayForEach may walk. */
static const cJSON *sr_arr(const cJSON *v) { return cJSON_IsArray(v) ? v : NULL; }

/* json_value(): a present, non-null value, else NULL (the caller's default). */
static const cJSON *sr_value(const cJSON *obj, const char *key) {
  const cJSON *v = sr_get(obj, key);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

static int sr_refuse(sr_ctx *c, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int sr_refuse(sr_ctx *c, int status, const char *type, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = pr_buf_vappendf(&c->ref->message, fmt, ap);
  va_end(ap);
  c->ref->status = status;
  c->ref->type = type;
  return rc < 0 ? rc : 1;
}

static int sr_dump(sr_ctx *c, const cJSON *v, int indent) {
  return ag_nl_dump(&c->ref->message, v, indent, &c->lits);
}

/* "<prefix><v compact><suffix>": the messages that quote one value. */
static int sr_refuse_quoting(sr_ctx *c, const char *prefix, const cJSON *v, const char *suffix) {
  int rc = sr_refuse(c, 500, SR_SERVER, "%s", prefix);
  if (rc > 0 && (rc = sr_dump(c, v, -1)) == 0) rc = pr_buf_append_str(&c->ref->message, suffix);
  return rc < 0 ? rc : 1;
}

/* nlohmann's exceptions, as e.what() spells them. */
static int sr_not_string(sr_ctx *c, const cJSON *v) {
  return sr_refuse(c, 500, SR_SERVER, "[json.exception.type_error.302] type must be string, but is %s",
                   ag_nl_type_name(v));
}

static int sr_no_key(sr_ctx *c, const char *key) {
  return sr_refuse(c, 500, SR_SERVER, "[json.exception.out_of_range.403] key '%s' not found", key);
}

/* obj.at(key).get<std::string>(): present and a string. */
static int sr_need_string(sr_ctx *c, const cJSON *obj, const char *key) {
  const cJSON *v = sr_get(obj, key);
  if (!v) return sr_no_key(c, key);
  return cJSON_IsString(v) ? 0 : sr_not_string(c, v);
}

/* A message's optional string fields. */
static int sr_optional_string(sr_ctx *c, const cJSON *obj, const char *key) {
  const cJSON *v = sr_get(obj, key);
  return !v || cJSON_IsString(v) ? 0 : sr_not_string(c, v);
}

/* ---- chat messages (common_chat_msgs_parse_oaicompat) ------------------------------- */

static int sr_content(sr_ctx *c, const cJSON *content) {
  if (cJSON_IsString(content) || cJSON_IsNull(content)) return 0;
  if (!cJSON_IsArray(content))
    return sr_refuse_quoting(c, "Invalid 'content' type: expected string or array, got ", content, SR_REF_8367);
  const cJSON *part;
  cJSON_ArrayForEach(part, content) {
    const cJSON *type = sr_get(part, "type");
    if (!type) return sr_refuse_quoting(c, "Missing content part type: ", part, "");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0)
      return sr_refuse_quoting(c, "Unsupported content part type: ", type, "");
    int rc = sr_need_string(c, part, "text");
    if (rc) return rc;
  }
  return 0;
}

/* nlohmann iterates an array's elements, an object's values, and a single value as
 * itself (null: nothing). */
static int sr_tool_call(sr_ctx *c, const cJSON *tc) {
  const cJSON *type = sr_get(tc, "type");
  if (!type) return sr_refuse_quoting(c, "Missing tool call type: ", tc, "");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0)
    return sr_refuse_quoting(c, "Unsupported tool call type: ", tc, "");
  const cJSON *fn = sr_get(tc, "function");
  if (!fn) return sr_refuse_quoting(c, "Missing tool call function: ", tc, "");
  if (!sr_get(fn, "name")) return sr_refuse_quoting(c, "Missing tool call name: ", tc, "");
  int rc = sr_need_string(c, fn, "name");
  /* 2026: arguments that are not a string are taken (as their JSON text) */
  if (!rc && c->release == AG_SIMREQ_2026 && !sr_get(fn, "arguments")) rc = sr_no_key(c, "arguments");
  else if (!rc && c->release != AG_SIMREQ_2026) rc = sr_need_string(c, fn, "arguments");
  if (!rc) rc = sr_optional_string(c, tc, "id");
  return rc;
}

static int sr_message(sr_ctx *c, const cJSON *m) {
  if (!cJSON_IsObject(m)) return sr_refuse_quoting(c, "Expected 'message' to be an object, got ", m, "");
  if (!sr_get(m, "role")) return sr_refuse_quoting(c, "Missing 'role' in message: ", m, "");
  int rc = sr_need_string(c, m, "role");
  if (rc) return rc;
  const cJSON *content = sr_get(m, "content");
  if (!content) return sr_refuse(c, 500, SR_SERVER, "Expected 'content'" SR_REF_8367);
  if ((rc = sr_content(c, content)) || (rc = sr_optional_string(c, m, "reasoning_content")) ||
      (rc = sr_optional_string(c, m, "name")) || (rc = sr_optional_string(c, m, "tool_call_id")))
    return rc;
  const cJSON *calls = sr_get(m, "tool_calls"), *tc;
  if (!calls || cJSON_IsNull(calls)) return 0;
  if (!cJSON_IsArray(calls) && !cJSON_IsObject(calls)) return sr_tool_call(c, calls);
  cJSON_ArrayForEach(tc, calls) {
    if ((rc = sr_tool_call(c, tc))) return rc;
  }
  return 0;
}

/* What was wrong, then "; messages = " and all of them, indented. */
static int sr_messages(sr_ctx *c, const cJSON *messages) {
  int rc = 0;
  ag_simreq_refusal *ref = c->ref;
  if (!cJSON_IsArray(messages)) {
    rc = sr_refuse_quoting(c, "Expected 'messages' to be an array, got ", messages, "");
  } else {
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
      if ((rc = sr_message(c, m))) break;
    }
  }
  if (rc <= 0) return rc;
  /* the message so far becomes the middle of the final one */
  pr_buf what = ref->message;
  pr_buf_init(&ref->message, SR_MAX_MESSAGE);
  rc = pr_buf_appendf(&ref->message, "Failed to parse messages: %s; messages = ", pr_buf_cstr(&what));
  pr_buf_free(&what);
  if (rc == 0) rc = sr_dump(c, messages, 2);
  return rc < 0 ? rc : 1;
}

/* ---- tools (common_chat_tools_parse_oaicompat) -------------------------------------- */

/* common_chat_tools_parse_oaicompat: a name is needed; the 2025 build also needs a
 * description and parameters, b10587 neither (a description of the wrong type still
 * fails there). */
static int sr_tool(sr_ctx *c, const cJSON *tool, int r26) {
  const cJSON *type = sr_get(tool, "type");
  if (!type) return sr_refuse_quoting(c, "Missing tool type: ", tool, "");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0)
    return sr_refuse_quoting(c, "Unsupported tool type: ", tool, "");
  const cJSON *fn = sr_get(tool, "function");
  if (!fn) return sr_refuse_quoting(c, "Missing tool function: ", tool, "");
  if (!cJSON_IsObject(fn))
    return sr_refuse(c, 500, SR_SERVER, "[json.exception.type_error.304] cannot use at() with %s",
                     ag_nl_type_name(fn));
  int rc = sr_need_string(c, fn, "name");
  if (r26) return rc ? rc : sr_optional_string(c, fn, "description");
  if (!rc) rc = sr_need_string(c, fn, "description");
  if (!rc && !sr_get(fn, "parameters")) rc = sr_no_key(c, "parameters");
  return rc;
}

static int sr_tools(sr_ctx *c, const cJSON *tools, int r26) {
  int rc = 0;
  if (r26 && (!tools || cJSON_IsNull(tools))) return 0;
  if (!cJSON_IsArray(tools)) {
    rc = sr_refuse_quoting(c, "Expected 'tools' to be an array, got ", tools, "");
  } else {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
      if ((rc = sr_tool(c, t, r26))) break;
    }
  }
  if (rc <= 0) return rc;
  pr_buf what = c->ref->message;
  pr_buf_init(&c->ref->message, SR_MAX_MESSAGE);
  rc = pr_buf_appendf(&c->ref->message, "Failed to parse tools: %s; tools = ", pr_buf_cstr(&what));
  pr_buf_free(&what);
  if (rc == 0) rc = sr_dump(c, tools, 2);
  return rc < 0 ? rc : 1;
}

/* ---- the rest of oaicompat_completion_params_parse ---------------------------------- */

/* json_value(body, "n", 1) != 1: numbers convert as C++ does (2.5 is 2, and 2^32 + 1 is
 * 1 in an int), booleans are 0 or 1, anything else is the default. */
static int sr_more_than_one_choice(const cJSON *root) {
  const cJSON *n = sr_value(root, "n");
  if (cJSON_IsBool(n)) return !cJSON_IsTrue(n);
  if (!cJSON_IsNumber(n)) return 0;
  double d = n->valuedouble;
  if (d != floor(d)) d = trunc(d);
  if (!(fabs(d) < 9.2e18)) return 1;
  return (int32_t)(uint32_t)(uint64_t)(int64_t)d != 1;
}

/* The schema check llama-server's grammar builder makes. */
static int sr_schema(sr_ctx *c, const cJSON *schema, pr_buf *errors) {
  int n = ag_simgen_check_schema(schema, &c->lits, errors);
  return n < 0 ? n : 0;
}

static int sr_grammar(sr_ctx *c, const cJSON *tools, int tool_calls_on, const cJSON *json_schema) {
  pr_buf errors;
  pr_buf_init(&errors, SR_MAX_MESSAGE);
  int rc = 0;
  const cJSON *t;
  if (tool_calls_on) {
    cJSON_ArrayForEach(t, tools) {
      const cJSON *params = sr_get(sr_get(t, "function"), "parameters");
      /* b10587 takes parameters that are not an object (a string, say) as they are */
      if (c->release == AG_SIMREQ_2026 && !cJSON_IsObject(params)) continue;
      if ((rc = sr_schema(c, params, &errors)) < 0) break;
    }
  } else if (json_schema) {
    rc = sr_schema(c, json_schema, &errors);
  }
  if (rc == 0 && errors.len) {
    int r26 = c->release == AG_SIMREQ_2026;
    rc = sr_refuse(c, r26 ? 400 : 500, r26 ? SR_INVALID : SR_SERVER, "JSON schema conversion failed:\n%s",
                   pr_buf_cstr(&errors));
  }
  pr_buf_free(&errors);
  return rc;
}

/* The function tool_choice names ({"type":"function","function":{"name":...}}): newer
 * builds honour it; one that names no tool is taken as "auto", as llama-server takes any
 * tool_choice that is not a string. */
static const cJSON *sr_named_tool(const cJSON *tools, const cJSON *choice) {
  const cJSON *name = sr_get(sr_get(choice, "function"), "name"), *t;
  if (!cJSON_IsString(name)) return NULL;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *tn = sr_get(sr_get(t, "function"), "name");
    if (cJSON_IsString(tn) && strcmp(tn->valuestring, name->valuestring) == 0) return t;
  }
  return NULL;
}

static int sr_chat(sr_ctx *c, ag_simreq *req) {
  const cJSON *root = c->root;
  const cJSON *tools0 = sr_value(root, "tools");
  /* the schema the grammar builder checks; the one the answer follows */
  const cJSON *json_schema = sr_value(root, "json_schema"), *gen_schema = NULL;
  int want_json = 0, rc;
  if (!c->stream_tools && cJSON_IsArray(tools0) && tools0->child && cJSON_IsTrue(sr_value(root, "stream")))
    return sr_refuse(c, 500, SR_SERVER, "Cannot use tools with stream");
  const cJSON *grammar = sr_value(root, "grammar");
  if (json_schema && cJSON_IsString(grammar) && grammar->valuestring[0])
    return sr_refuse(c, 500, SR_SERVER, "Cannot use both json_schema and grammar");
  if (sr_get(root, "response_format")) {
    const cJSON *rf = sr_value(root, "response_format");
    const cJSON *type = sr_value(rf, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (strcmp(t, "json_object") == 0) {
      want_json = 1;
      json_schema = gen_schema = sr_value(rf, "schema");
    } else if (strcmp(t, "json_schema") == 0) {
      /* this build reads json_schema.schema into a shadowing variable: it is never
       * checked (nor followed; the sim follows it) */
      want_json = 1;
      gen_schema = sr_value(sr_value(rf, "json_schema"), "schema");
    } else if (t[0] && strcmp(t, "text") != 0) {
      return sr_refuse(c, 500, SR_SERVER,
                       "response_format type must be one of \"text\" or \"json_object\", but got: %s", t);
    }
  }
  if (!cJSON_IsObject(root))
    return sr_refuse(c, 500, SR_SERVER, "[json.exception.type_error.304] cannot use at() with %s",
                     ag_nl_type_name(root));
  const cJSON *messages = sr_get(root, "messages");
  if (!messages) return sr_no_key(c, "messages");
  if ((rc = sr_messages(c, messages))) return rc;
  const cJSON *tools = sr_value(root, "tools");
  if (tools && (rc = sr_tools(c, tools, 0))) return rc;
  const cJSON *choice = sr_value(root, "tool_choice");
  const char *mode = cJSON_IsString(choice) ? choice->valuestring : "auto";
  if (strcmp(mode, "auto") != 0 && strcmp(mode, "none") != 0 && strcmp(mode, "required") != 0)
    return sr_refuse(c, 500, SR_SERVER, "Invalid tool_choice: %s", mode);
  int has_tools = tools && tools->child;
  if (has_tools && strcmp(mode, "none") != 0 && sr_get(root, "grammar"))
    return sr_refuse(c, 500, SR_SERVER, "Cannot use custom grammar constraints with tools.");
  if ((rc = sr_grammar(c, tools, has_tools && strcmp(mode, "none") != 0, json_schema))) return rc;
  if (sr_more_than_one_choice(root)) return sr_refuse(c, 500, SR_SERVER, "Only one completion choice is allowed");
  if (cJSON_IsTrue(sr_get(root, "logprobs"))) {
    const cJSON *top = sr_value(root, "top_logprobs");
    double n = cJSON_IsNumber(top) ? top->valuedouble : cJSON_IsBool(top) ? cJSON_IsTrue(top) : 20;
    req->top_logprobs = n < 1 ? 1 : n > SR_MAX_TOP_LOGPROBS ? SR_MAX_TOP_LOGPROBS : (int)n;
  } else if (sr_value(root, "top_logprobs")) {
    return sr_refuse(c, 500, SR_SERVER, "top_logprobs requires logprobs to be set to true");
  }

  const cJSON *call = NULL;
  if (has_tools && strcmp(mode, "required") == 0) call = tools->child;
  else if (has_tools && cJSON_IsObject(choice)) call = sr_named_tool(tools, choice);
  if (call) {
    const cJSON *fn = sr_get(call, "function");
    req->shape = AG_SIMREQ_TOOL_CALL;
    req->tool_name = sr_get(fn, "name")->valuestring;
    req->schema = sr_get(fn, "parameters");
  } else if (want_json) {
    req->shape = AG_SIMREQ_JSON;
    req->schema = gen_schema && !(cJSON_IsObject(gen_schema) && !gen_schema->child) ? gen_schema : NULL;
  }
  return 0;
}

static int sr_completion(sr_ctx *c, ag_simreq *req) {
  static const char *const unsupported[] = {"best_of", "echo", "suffix"};
  const cJSON *root = c->root;
  if (!sr_get(root, "prompt")) return sr_refuse(c, 500, SR_SERVER, "\"prompt\" is required");
  if (sr_more_than_one_choice(root)) return sr_refuse(c, 500, SR_SERVER, "Only one completion choice is allowed");
  for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++)
    if (sr_get(root, unsupported[i])) return sr_refuse(c, 500, SR_SERVER, "Unsupported param: %s", unsupported[i]);
  const cJSON *prompt = sr_get(root, "prompt");
  if (!cJSON_IsString(prompt) && !cJSON_IsArray(prompt))
    return sr_refuse(c, 400, SR_INVALID,
                     "\"prompt\" must be a string, an list of tokens, a list of mixed strings & tokens, "
                     "or a list of prompts");
  /* n_probs, or the legacy logprobs (a count; true is 1) */
  const cJSON *np = sr_value(root, "n_probs"), *lp = sr_value(root, "logprobs");
  double n = cJSON_IsNumber(np) ? np->valuedouble
             : cJSON_IsNumber(lp) ? lp->valuedouble
             : cJSON_IsTrue(lp) ? 1 : 0;
  req->top_logprobs = n < 1 ? 0 : n > SR_MAX_TOP_LOGPROBS ? SR_MAX_TOP_LOGPROBS : (int)n;
  return 0;
}

/* ---- what both releases read besides the faults -------------------------------------- */

/* json_value<std::string>: the string, else def. */
static const char *sr_str(const cJSON *obj, const char *key, const char *def) {
  const cJSON *v = sr_value(obj, key);
  return cJSON_IsString(v) ? v->valuestring : def;
}

/* json_value<int>: a number (truncated) or a boolean, else def. */
static int sr_int(const cJSON *obj, const char *key, int def) {
  const cJSON *v = sr_value(obj, key);
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
  if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) < 2147483648.0)) return def;
  return (int)v->valuedouble;
}

/* An array of integers: a prompt of token ids. */
static int sr_is_token_ids(const cJSON *v) {
  const cJSON *t;
  if (!cJSON_IsArray(v) || !v->child) return 0;
  cJSON_ArrayForEach(t, v) {
    if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble)) return 0;
  }
  return 1;
}

/* The cache, the slot and thinking, as both releases read them when the body is taken. */
static void sr_extras(sr_ctx *c, int chat, ag_simreq *req) {
  const cJSON *root = c->root;
  const cJSON *cp = sr_value(root, "cache_prompt");
  req->cache_prompt = cJSON_IsBool(cp) ? cJSON_IsTrue(cp) : 1;
  req->id_slot = sr_int(root, "id_slot", -1);
  req->thinking = -1;
  if (chat) {
    const cJSON *et = sr_get(sr_value(root, "chat_template_kwargs"), "enable_thinking");
    if (cJSON_IsBool(et)) req->thinking = cJSON_IsTrue(et);
    if (sr_get(root, "reasoning_effort") && strcmp(sr_str(root, "reasoning_effort", ""), "none") == 0)
      req->thinking = 0;
    /* an assistant message last is continued (b10587 prefills it, or continue_final_message
     * says so): after content, in content (Qwen3.5's template closes the think block
     * before it); continue_final_message may also name the part to go on in */
    const cJSON *msgs = sr_get(root, "messages");
    const cJSON *last = cJSON_IsArray(msgs) ? cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1) : NULL;
    const cJSON *cfm = sr_get(root, "continue_final_message");
    if (last && strcmp(sr_str(last, "role", ""), "assistant") == 0) {
      if (cJSON_IsString(cfm) && strcmp(cfm->valuestring, "content") == 0) req->thinking = 0;
      else if (!(cJSON_IsString(cfm) && strcmp(cfm->valuestring, "reasoning_content") == 0) &&
               sr_str(last, "content", "")[0])
        req->thinking = 0;
    }
  } else {
    const cJSON *prompt = sr_get(root, "prompt");
    if (sr_is_token_ids(prompt)) req->token_ids = prompt;
    const cJSON *d = sr_value(root, "message_delimiters");
    if (cJSON_IsArray(d)) req->delimiters = d;
  }
}

/* ---- the August 2026 build (b10587) --------------------------------------------------- */

#define SR26_HINT " input is not supported - hint: if this is unexpected, you may need to provide the mmproj"

/* oaicompat_chat_params_parse's own look at the messages, before they are parsed: its
 * faults are 400 (500 for media the model cannot take). */
static int sr26_messages_shape(sr_ctx *c, const cJSON *messages) {
  const cJSON *m, *p;
  if (!messages) return sr_refuse(c, 400, SR_INVALID, "'messages' is required");
  if (!cJSON_IsArray(messages)) return sr_refuse(c, 400, SR_INVALID, "Expected 'messages' to be an array");
  cJSON_ArrayForEach(m, messages) {
    const char *role = sr_str(m, "role", "");
    int assistant = strcmp(role, "assistant") == 0;
    const cJSON *content = sr_get(m, "content");
    if (!assistant && !content)
      return sr_refuse(c, 400, SR_INVALID, "All non-assistant messages must contain 'content'");
    if (assistant && !content && !sr_get(m, "tool_calls"))
      return sr_refuse(c, 400, SR_INVALID, "Assistant message must contain either 'content' or 'tool_calls'!");
    if (!content || cJSON_IsString(content) || cJSON_IsNull(content)) continue;
    if (!cJSON_IsArray(content))
      return sr_refuse(c, 400, SR_INVALID, "Expected 'content' to be a string or an array");
    cJSON_ArrayForEach(p, content) {
      const char *type = sr_str(p, "type", "");
      if (strcmp(type, "image_url") == 0) return sr_refuse(c, 500, SR_SERVER, "image" SR26_HINT);
      if (strcmp(type, "input_audio") == 0) return sr_refuse(c, 500, SR_SERVER, "audio" SR26_HINT);
      if (strcmp(type, "input_video") == 0) return sr_refuse(c, 500, SR_SERVER, "video" SR26_HINT);
      if (strcmp(type, "text") != 0) return sr_refuse(c, 400, SR_INVALID, "unsupported content[].type");
    }
  }
  return 0;
}

/* common_chat_msgs_parse_oaicompat: 500 "Failed to parse messages: <what>" (no longer
 * followed by the messages). Only text parts get this far. */
static int sr26_messages_parse(sr_ctx *c, const cJSON *messages) {
  const cJSON *m;
  int rc = 0;
  cJSON_ArrayForEach(m, messages) {
    if (!sr_get(m, "role")) {
      rc = sr_refuse_quoting(c, "Missing 'role' in message: ", m, "");
      break;
    }
    if ((rc = sr_need_string(c, m, "role"))) break;
    const cJSON *content = sr_get(m, "content"), *part;
    cJSON_ArrayForEach(part, sr_arr(content)) {
      if ((rc = sr_need_string(c, part, "text"))) break;
    }
    if (rc) break;
    const cJSON *calls = sr_get(m, "tool_calls"), *tc;
    if (calls && !cJSON_IsNull(calls)) {
      if (!cJSON_IsArray(calls) && !cJSON_IsObject(calls)) rc = sr_tool_call(c, calls);
      else cJSON_ArrayForEach(tc, calls) {
          if ((rc = sr_tool_call(c, tc))) break;
        }
      if (rc) break;
    }
    if ((rc = sr_optional_string(c, m, "reasoning_content")) || (rc = sr_optional_string(c, m, "name")) ||
        (rc = sr_optional_string(c, m, "tool_call_id")))
      break;
  }
  if (rc <= 0) return rc;
  pr_buf what = c->ref->message;
  pr_buf_init(&c->ref->message, SR_MAX_MESSAGE);
  rc = pr_buf_appendf(&c->ref->message, "Failed to parse messages: %s", pr_buf_cstr(&what));
  pr_buf_free(&what);
  return rc < 0 ? rc : 1;
}

/* An assistant message last is a prefill to continue; two are refused. An explicit
 * continue_final_message needs add_generation_prompt false. */
static int sr26_continuation(sr_ctx *c, const cJSON *messages) {
  const cJSON *root = c->root, *cfm = sr_get(root, "continue_final_message");
  const cJSON *agp = sr_value(root, "add_generation_prompt");
  int add_gen = cJSON_IsBool(agp) ? cJSON_IsTrue(agp) : 1;
  int cont = cfm && (cJSON_IsTrue(cfm) || (cJSON_IsString(cfm) && (strcmp(cfm->valuestring, "content") == 0 ||
                                                                   strcmp(cfm->valuestring, "reasoning_content") == 0)));
  int n = cJSON_GetArraySize(messages);
  if (!cont && n > 0 && strcmp(sr_str(cJSON_GetArrayItem(messages, n - 1), "role", ""), "assistant") == 0) {
    if (n >= 2 && strcmp(sr_str(cJSON_GetArrayItem(messages, n - 2), "role", ""), "assistant") == 0)
      return sr_refuse(c, 400, SR_INVALID, "Cannot have 2 or more assistant messages at the end of the list.");
    return 0;
  }
  if (cont && add_gen)
    return sr_refuse(c, 400, SR_INVALID, "Cannot set both add_generation_prompt and continue_final_message to true.");
  return 0;
}

/* server_schema's typed fields, in its order, as far as the sim reads them: a value of
 * the wrong type, or a number outside its hard limits, is "Field '<name>': ...". */
typedef enum { SR26_BOOL, SR26_NUM } sr26_kind;

static int sr26_field(sr_ctx *c, const cJSON *obj, const char *const *names, sr26_kind kind, double lo,
                      double hi, int *out) {
  for (const char *const *n = names; *n; n++) {
    const cJSON *v = sr_value(obj, *n);
    if (!v) continue;
    if (kind == SR26_BOOL) {
      if (!cJSON_IsBool(v))
        return sr_refuse(c, 400, SR_INVALID, "Field '%s': [json.exception.type_error.302] type must be boolean, "
                         "but is %s", *n, ag_nl_type_name(v));
      if (out) *out = cJSON_IsTrue(v);
      return 0;
    }
    if (!cJSON_IsNumber(v) && !cJSON_IsBool(v))
      return sr_refuse(c, 400, SR_INVALID, "Field '%s': [json.exception.type_error.302] type must be number, "
                       "but is %s", *n, ag_nl_type_name(v));
    double d = cJSON_IsBool(v) ? cJSON_IsTrue(v) : trunc(v->valuedouble);
    if (d < lo || d > hi)
      return sr_refuse(c, 400, SR_INVALID, "Field '%s': Value must be between %.0f <= value <= %.0f, but got %.0f",
                       *n, lo, hi, d);
    if (out) *out = (int)d;
    return 0;
  }
  return 0;
}

static int sr26_fields(sr_ctx *c, ag_simreq *req) {
  static const char *const verbose[] = {"verbose", NULL}, *const tpt[] = {"timings_per_token", NULL},
                           *const stream[] = {"stream", NULL}, *const usage[] = {"include_usage", NULL},
                           *const cache[] = {"cache_prompt", NULL}, *const rt[] = {"return_tokens", NULL},
                           *const rp[] = {"return_progress", NULL}, *const ping[] = {"sse_ping_interval", NULL},
                           *const cap[] = {"n_predict", "max_completion_tokens", "max_tokens", NULL},
                           *const indent[] = {"n_indent", NULL}, *const keep[] = {"n_keep", NULL},
                           *const discard[] = {"n_discard", NULL}, *const n[] = {"n_cmpl", "n", NULL};
  const cJSON *root = c->root, *so = sr_get(root, "stream_options");
  int rc;
  if ((rc = sr26_field(c, root, verbose, SR26_BOOL, 0, 0, NULL)) ||
      (rc = sr26_field(c, root, tpt, SR26_BOOL, 0, 0, NULL)) ||
      (rc = sr26_field(c, root, stream, SR26_BOOL, 0, 0, NULL)) ||
      (rc = cJSON_IsObject(so) ? sr26_field(c, so, usage, SR26_BOOL, 0, 0, NULL) : 0) ||
      (rc = sr26_field(c, root, cache, SR26_BOOL, 0, 0, &req->cache_prompt)) ||
      (rc = sr26_field(c, root, rt, SR26_BOOL, 0, 0, NULL)) || (rc = sr26_field(c, root, rp, SR26_BOOL, 0, 0, NULL)) ||
      (rc = sr26_field(c, root, ping, SR26_NUM, -1, INT32_MAX, NULL)) ||
      (rc = sr26_field(c, root, cap, SR26_NUM, -1, INT32_MAX, NULL)) ||
      (rc = sr26_field(c, root, indent, SR26_NUM, 0, INT32_MAX, NULL)) ||
      (rc = sr26_field(c, root, keep, SR26_NUM, -1, INT32_MAX, NULL)) ||
      (rc = sr26_field(c, root, discard, SR26_NUM, 0, INT32_MAX, NULL)) ||
      (rc = sr26_field(c, root, n, SR26_NUM, 1, c->n_parallel, &req->n)))
    return rc;
  return 0;
}

/* /v1/chat/completions on b10587: oaicompat_chat_params_parse, then the task's fields. */
static int sr26_chat(sr_ctx *c, ag_simreq *req) {
  const cJSON *root = c->root, *json_schema = NULL;
  int want_json = 0, rc;
  const cJSON *tools = sr_value(root, "tools");
  int has_tools = cJSON_IsArray(tools) && tools->child;
  const cJSON *st = sr_value(root, "stream");
  int stream = cJSON_IsTrue(st);
  const char *mode = sr_str(root, "tool_choice", "auto");
  if (sr_value(root, "json_schema") && sr_str(root, "grammar", "")[0])
    return sr_refuse(c, 500, SR_SERVER, "Cannot use both json_schema and grammar");
  if (sr_get(root, "response_format")) {
    const cJSON *rf = sr_value(root, "response_format");
    const char *t = sr_str(rf, "type", "");
    if (strcmp(t, "json_object") == 0) {
      want_json = 1;
      json_schema = sr_value(rf, "schema");
    } else if (strcmp(t, "json_schema") == 0) {
      want_json = 1;
      json_schema = sr_value(sr_value(rf, "json_schema"), "schema");
    } else if (t[0] && strcmp(t, "text") != 0) {
      return sr_refuse(c, 400, SR_INVALID,
                       "response_format type must be one of \"text\" or \"json_object\", but got: %s", t);
    }
  }
  const cJSON *messages = sr_get(root, "messages");
  if ((rc = sr26_messages_shape(c, messages)) || (rc = sr26_messages_parse(c, messages)) ||
      (rc = sr_tools(c, tools, 1)))
    return rc;
  if (strcmp(mode, "auto") != 0 && strcmp(mode, "none") != 0 && strcmp(mode, "required") != 0)
    return sr_refuse(c, 400, SR_INVALID, "Invalid tool_choice: %s", mode);
  if ((rc = sr26_continuation(c, messages))) return rc;
  if (sr_get(root, "reasoning_format")) {
    const cJSON *rf = sr_get(root, "reasoning_format");
    if (!cJSON_IsString(rf))
      return sr_refuse(c, 500, SR_SERVER, "[json.exception.type_error.302] type must be string, but is %s",
                       ag_nl_type_name(rf));
    static const char *const known[] = {"none", "auto", "deepseek", "deepseek-legacy"};
    int ok = 0;
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) ok |= strcmp(rf->valuestring, known[i]) == 0;
    if (!ok) return sr_refuse(c, 500, SR_SERVER, "Unknown reasoning format: %s", rf->valuestring);
  }
  int calls_on = has_tools && strcmp(mode, "none") != 0;
  if (calls_on && sr_get(root, "grammar"))
    return sr_refuse(c, 400, SR_INVALID, "Cannot use custom grammar constraints with tools.");
  const cJSON *et = sr_get(sr_value(root, "chat_template_kwargs"), "enable_thinking");
  if (cJSON_IsString(et))
    return sr_refuse(c, 400, SR_INVALID, "invalid type for \"enable_thinking\" (expected boolean, got string)");
  if ((rc = sr_grammar(c, tools, calls_on, json_schema))) return rc;
  const cJSON *lp = sr_value(root, "logprobs");
  if (cJSON_IsTrue(lp)) {
    if (has_tools && stream) return sr_refuse(c, 400, SR_INVALID, "logprobs is not supported with tools + stream");
    const cJSON *top = sr_value(root, "top_logprobs");
    double n = cJSON_IsNumber(top) ? top->valuedouble : cJSON_IsBool(top) ? cJSON_IsTrue(top) : 20;
    req->top_logprobs = n < 1 ? 1 : n > SR_MAX_TOP_LOGPROBS ? SR_MAX_TOP_LOGPROBS : (int)n;
  } else if (sr_value(root, "top_logprobs")) {
    return sr_refuse(c, 400, SR_INVALID, "top_logprobs requires logprobs to be set to true");
  }
  sr_extras(c, 1, req);
  if ((rc = sr26_fields(c, req))) return rc;

  const cJSON *call = NULL, *choice = sr_value(root, "tool_choice");
  if (has_tools && strcmp(mode, "required") == 0) call = tools->child;
  else if (has_tools && cJSON_IsObject(choice)) call = sr_named_tool(tools, choice);
  if (call) {
    const cJSON *fn = sr_get(call, "function");
    req->shape = AG_SIMREQ_TOOL_CALL;
    req->tool_name = sr_get(fn, "name")->valuestring;
    req->schema = cJSON_IsObject(sr_get(fn, "parameters")) ? sr_get(fn, "parameters") : NULL;
  } else if (want_json) {
    req->shape = AG_SIMREQ_JSON;
    req->schema = json_schema && !(cJSON_IsObject(json_schema) && !json_schema->child) ? json_schema : NULL;
  }
  return 0;
}

/* A prompt element tokenize_input_prompts takes: a string, token ids, strings and ids
 * mixed, or an object with "prompt_string". */
static int sr26_subprompt_ok(const cJSON *p) {
  const cJSON *t;
  if (cJSON_IsString(p)) return 1;
  if (cJSON_IsArray(p)) {
    cJSON_ArrayForEach(t, p) {
      if (!cJSON_IsString(t) && !cJSON_IsNumber(t)) return 0;
    }
    return 1;
  }
  return sr_get(p, "prompt_string") != NULL;
}

/* /v1/completions on b10587: the body goes straight to the task (no "Unsupported
 * param"; echo is ignored); every fault is a 400. */
static int sr26_completion(sr_ctx *c, ag_simreq *req) {
  const cJSON *root = c->root, *prompt = sr_get(root, "prompt"), *t;
  static const char bad[] = "\"prompt\" elements must be a string, a list of tokens, a JSON object containing a "
                            "prompt string, or a list of mixed strings & tokens.";
  if (!cJSON_IsObject(root))
    return sr_refuse(c, 400, SR_INVALID, "[json.exception.type_error.304] cannot use at() with %s",
                     ag_nl_type_name(root));
  if (!prompt) return sr_refuse(c, 400, SR_INVALID, "[json.exception.out_of_range.403] key 'prompt' not found");
  int has_numbers = 0;
  cJSON_ArrayForEach(t, sr_arr(prompt)) has_numbers |= cJSON_IsNumber(t);
  if (cJSON_IsArray(prompt) && !has_numbers) {
    if (!prompt->child) return sr_refuse(c, 400, SR_INVALID, "\"prompt\" must not be empty");
    cJSON_ArrayForEach(t, prompt) {
      if (!sr26_subprompt_ok(t)) return sr_refuse(c, 400, SR_INVALID, "%s", bad);
    }
  } else if (!sr26_subprompt_ok(prompt)) {
    return sr_refuse(c, 400, SR_INVALID, "%s", bad);
  }
  sr_extras(c, 0, req);
  int rc = sr26_fields(c, req);
  if (rc) return rc;
  const cJSON *np = sr_value(root, "n_probs"), *lp = sr_value(root, "logprobs");
  double n = cJSON_IsNumber(np) ? np->valuedouble
             : cJSON_IsNumber(lp) ? lp->valuedouble
             : cJSON_IsTrue(lp) ? 1 : 0;
  req->top_logprobs = n < 1 ? 0 : n > SR_MAX_TOP_LOGPROBS ? SR_MAX_TOP_LOGPROBS : (int)n;
  return 0;
}

int ag_simreq_read(const cJSON *root, const char *text, size_t len, int chat,
                   const ag_simreq_opts *opts, ag_simreq *req, ag_simreq_refusal *ref) {
  sr_ctx c = {.root = root, .ref = ref, .release = opts ? opts->release : AG_SIMREQ_2025,
              .n_parallel = opts && opts->n_parallel > 0 ? opts->n_parallel : 1,
              .stream_tools = opts && opts->stream_tools};
  memset(req, 0, sizeof(*req));
  req->n = 1;
  req->cache_prompt = 1;
  req->id_slot = -1;
  req->thinking = -1;
  pr_buf_reset(&ref->message);
  int rc = ag_nl_lits_scan(&c.lits, root, text, len);
  if (rc == 0 && c.release == AG_SIMREQ_2026) rc = chat ? sr26_chat(&c, req) : sr26_completion(&c, req);
  else if (rc == 0) rc = chat ? sr_chat(&c, req) : sr_completion(&c, req);
  if (rc == 0 && c.release != AG_SIMREQ_2026) sr_extras(&c, chat, req);
  ag_nl_lits_free(&c.lits);
  if (rc < 0) pr_buf_reset(&ref->message);
  return rc;
}
