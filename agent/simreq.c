/* llama-server's request checks (server.cpp, utils.hpp, common/chat.cpp of February
 * 2025) as the sim plays them; see simreq.h. Each message below was captured from the
 * real server; tests/system/fixtures/ keeps three of them. */
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
} sr_ctx;

/* nlohmann's ordered_json keeps the last of duplicate keys (cJSON finds the first). */
static const cJSON *sr_get(const cJSON *obj, const char *key) {
  const cJSON *hit = NULL;
  if (!cJSON_IsObject(obj)) return NULL;
  for (const cJSON *c = obj->child; c; c = c->next)
    if (c->string && strcmp(c->string, key) == 0) hit = c;
  return hit;
}

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
  if (!rc) rc = sr_need_string(c, fn, "arguments");
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

static int sr_tool(sr_ctx *c, const cJSON *tool) {
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
  if (!rc) rc = sr_need_string(c, fn, "description");
  if (!rc && !sr_get(fn, "parameters")) rc = sr_no_key(c, "parameters");
  return rc;
}

static int sr_tools(sr_ctx *c, const cJSON *tools) {
  int rc = 0;
  if (!cJSON_IsArray(tools)) {
    rc = sr_refuse_quoting(c, "Expected 'tools' to be an array, got ", tools, "");
  } else {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
      if ((rc = sr_tool(c, t))) break;
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
      if ((rc = sr_schema(c, sr_get(sr_get(t, "function"), "parameters"), &errors)) < 0) break;
    }
  } else if (json_schema) {
    rc = sr_schema(c, json_schema, &errors);
  }
  if (rc == 0 && errors.len)
    rc = sr_refuse(c, 500, SR_SERVER, "JSON schema conversion failed:\n%s", pr_buf_cstr(&errors));
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
  const cJSON *json_schema = NULL;
  int want_json = 0, rc;
  if (sr_get(root, "response_format")) {
    const cJSON *rf = sr_value(root, "response_format");
    const cJSON *type = sr_value(rf, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (strcmp(t, "json_object") == 0) {
      want_json = 1;
      json_schema = sr_value(rf, "schema");
    } else if (strcmp(t, "json_schema") == 0) {
      want_json = 1;
      json_schema = sr_value(sr_value(rf, "json_schema"), "schema");
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
  if (tools && (rc = sr_tools(c, tools))) return rc;
  const cJSON *choice = sr_value(root, "tool_choice");
  const char *mode = cJSON_IsString(choice) ? choice->valuestring : "auto";
  if (strcmp(mode, "auto") != 0 && strcmp(mode, "none") != 0 && strcmp(mode, "required") != 0)
    return sr_refuse(c, 500, SR_SERVER, "Invalid tool_choice: %s", mode);
  int has_tools = tools && tools->child;
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
    req->schema = json_schema && !(cJSON_IsObject(json_schema) && !json_schema->child) ? json_schema : NULL;
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

int ag_simreq_read(const cJSON *root, const char *text, size_t len, int chat, ag_simreq *req,
                   ag_simreq_refusal *ref) {
  sr_ctx c = {.root = root, .ref = ref};
  memset(req, 0, sizeof(*req));
  pr_buf_reset(&ref->message);
  int rc = ag_nl_lits_scan(&c.lits, root, text, len);
  if (rc == 0) rc = chat ? sr_chat(&c, req) : sr_completion(&c, req);
  ag_nl_lits_free(&c.lits);
  if (rc < 0) pr_buf_reset(&ref->message);
  return rc;
}
