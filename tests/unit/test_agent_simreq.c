/* Unit tests for agent/simreq.c: requests refused with llama-server's status and exact
 * message (the three of tests/system/fixtures/ and others captured from the same
 * February 2025 build; b10587's as its binary answered them), in its order when a body
 * has several faults, and what accepted requests ask of the answer (tool call, JSON,
 * logprobs, choices, thinking, the cache). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "buf.h"
#include "simreq.h"

#define HI "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOL_OK                                                                                    \
  "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":" \
  "\"object\",\"properties\":{\"x\":{\"type\":\"string\"}},\"required\":[\"x\"]}}}"

/* The release the next reads imitate (NULL: 2025). */
static const ag_simreq_opts *release_opts;

/* Read body; returns what ag_simreq_read returned, the refusal's status and message. */
static int read_req(const char *body, int chat, ag_simreq *req, int *status, char **message) {
  cJSON *root = cJSON_Parse(body);
  assert_non_null(root);
  ag_simreq_refusal ref;
  ag_simreq_refusal_init(&ref);
  int rc = ag_simreq_read(root, body, strlen(body), chat, release_opts, req, &ref);
  *status = ref.status;
  *message = strdup(pr_buf_cstr(&ref.message));
  if (rc == 1) assert_string_equal(ref.type, ref.status == 400 ? "invalid_request_error" : "server_error");
  ag_simreq_refusal_free(&ref);
  cJSON_Delete(root);
  return rc;
}

static void refused(const char *body, int chat, int status, const char *message) {
  ag_simreq req;
  int got_status;
  char *got;
  assert_int_equal(read_req(body, chat, &req, &got_status, &got), 1);
  assert_int_equal(got_status, status);
  assert_string_equal(got, message);
  free(got);
}

static ag_simreq taken(const char *body, int chat) {
  ag_simreq req;
  int status;
  char *msg;
  int rc = read_req(body, chat, &req, &status, &msg);
  if (rc != 0) fail_msg("refused %s: %s", body, msg);
  free(msg);
  return req;
}

/* A tool call of `name` (checked while the tree, which req points into, is alive). */
static void calls(const char *body, const char *name) {
  cJSON *root = cJSON_Parse(body);
  ag_simreq req;
  ag_simreq_refusal ref;
  ag_simreq_refusal_init(&ref);
  assert_int_equal(ag_simreq_read(root, body, strlen(body), 1, NULL, &req, &ref), 0);
  assert_int_equal(req.shape, AG_SIMREQ_TOOL_CALL);
  assert_string_equal(req.tool_name, name);
  assert_true(cJSON_IsObject(req.schema));
  ag_simreq_refusal_free(&ref);
  cJSON_Delete(root);
}

static void test_captured_refusals(void **state) {
  (void)state;
  /* error-n2.http */
  refused("{" HI ",\"n\":2}", 1, 500, "Only one completion choice is allowed");
  /* error-tools.http */
  refused("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
          "\"object\",\"properties\":{\"x\":{\"type\":\"string\"}}}}}]}",
          1, 500,
          "Failed to parse tools: [json.exception.out_of_range.403] key 'description' not found; tools = "
          "[\n  {\n    \"type\": \"function\",\n    \"function\": {\n      \"name\": \"f\",\n      "
          "\"parameters\": {\n        \"type\": \"object\",\n        \"properties\": {\n          \"x\": {\n"
          "            \"type\": \"string\"\n          }\n        }\n      }\n    }\n  }\n]");
  /* error-content-type.http */
  refused("{\"messages\":[{\"role\":\"user\",\"content\":42}]}", 1, 500,
          "Failed to parse messages: Invalid 'content' type: expected string or array, got 42 (ref: "
          "https://github.com/ggml-org/llama.cpp/issues/8367); messages = [\n  {\n    \"role\": \"user\",\n"
          "    \"content\": 42\n  }\n]");
}

static void test_message_refusals(void **state) {
  (void)state;
  refused("{\"messages\":[{\"content\":\"hi\"}]}", 1, 500,
          "Failed to parse messages: Missing 'role' in message: {\"content\":\"hi\"}; messages = [\n  {\n"
          "    \"content\": \"hi\"\n  }\n]");
  refused("{\"messages\":\"hi\"}", 1, 500,
          "Failed to parse messages: Expected 'messages' to be an array, got \"hi\"; messages = \"hi\"");
  refused("{\"messages\":[1]}", 1, 500,
          "Failed to parse messages: Expected 'message' to be an object, got 1; messages = [\n  1\n]");
  refused("{\"messages\":[{\"role\":1,\"content\":\"x\"}]}", 1, 500,
          "Failed to parse messages: [json.exception.type_error.302] type must be string, but is number; "
          "messages = [\n  {\n    \"role\": 1,\n    \"content\": \"x\"\n  }\n]");
  refused("{\"messages\":[{\"role\":\"user\"}]}", 1, 500,
          "Failed to parse messages: Expected 'content' (ref: https://github.com/ggml-org/llama.cpp/issues/8367); "
          "messages = [\n  {\n    \"role\": \"user\"\n  }\n]");
  refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 1, 500,
          "Failed to parse messages: Unsupported content part type: \"image_url\"; messages = [\n  {\n"
          "    \"role\": \"user\",\n    \"content\": [\n      {\n        \"type\": \"image_url\"\n      }\n"
          "    ]\n  }\n]");
  refused("{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\","
          "\"function\":{\"name\":\"f\"}}]}]}",
          1, 500,
          "Failed to parse messages: [json.exception.out_of_range.403] key 'arguments' not found; messages = "
          "[\n  {\n    \"role\": \"assistant\",\n    \"content\": null,\n    \"tool_calls\": [\n      {\n"
          "        \"type\": \"function\",\n        \"function\": {\n          \"name\": \"f\"\n        }\n"
          "      }\n    ]\n  }\n]");
  refused("{}", 1, 500, "[json.exception.out_of_range.403] key 'messages' not found");
  refused("[1,2,3]", 1, 500, "[json.exception.type_error.304] cannot use at() with array");
}

static void test_tool_refusals(void **state) {
  (void)state;
  refused("{" HI ",\"tools\":[{\"type\":\"function\"}]}", 1, 500,
          "Failed to parse tools: Missing tool function: {\"type\":\"function\"}; tools = [\n  {\n"
          "    \"type\": \"function\"\n  }\n]");
  refused("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"description\":\"d\",\"parameters\":{}}}]}", 1,
          500,
          "Failed to parse tools: [json.exception.out_of_range.403] key 'name' not found; tools = [\n  {\n"
          "    \"type\": \"function\",\n    \"function\": {\n      \"description\": \"d\",\n"
          "      \"parameters\": {}\n    }\n  }\n]");
  refused("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\"}}]}", 1, 500,
          "Failed to parse tools: [json.exception.out_of_range.403] key 'parameters' not found; tools = [\n"
          "  {\n    \"type\": \"function\",\n    \"function\": {\n      \"name\": \"f\",\n"
          "      \"description\": \"d\"\n    }\n  }\n]");
  refused("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":\"f\"}]}", 1, 500,
          "Failed to parse tools: [json.exception.type_error.304] cannot use at() with string; tools = [\n"
          "  {\n    \"type\": \"function\",\n    \"function\": \"f\"\n  }\n]");
  refused("{" HI ",\"tools\":{\"type\":\"function\"}}", 1, 500,
          "Failed to parse tools: Expected 'tools' to be an array, got {\"type\":\"function\"}; tools = {\n"
          "  \"type\": \"function\"\n}");
  refused("{" HI ",\"tools\":[" TOOL_OK "],\"tool_choice\":\"bogus\"}", 1, 500, "Invalid tool_choice: bogus");
  refused("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
          "\"parameters\":{\"type\":\"bogus\"}}}]}",
          1, 500, "JSON schema conversion failed:\nUnrecognized schema: {\"type\":\"bogus\"}");
}

static void test_other_refusals(void **state) {
  (void)state;
  refused("{" HI ",\"response_format\":{\"type\":\"xml\"}}", 1, 500,
          "response_format type must be one of \"text\" or \"json_object\", but got: xml");
  refused("{" HI ",\"top_logprobs\":2}", 1, 500, "top_logprobs requires logprobs to be set to true");
  refused("{" HI ",\"n\":0}", 1, 500, "Only one completion choice is allowed");
  refused("{" HI ",\"n\":false}", 1, 500, "Only one completion choice is allowed");
  refused("{\"max_tokens\":2}", 0, 500, "\"prompt\" is required");
  refused("{\"prompt\":\"a\",\"n\":2}", 0, 500, "Only one completion choice is allowed");
  refused("{\"prompt\":\"a\",\"best_of\":2}", 0, 500, "Unsupported param: best_of");
  refused("{\"prompt\":5}", 0, 400,
          "\"prompt\" must be a string, an list of tokens, a list of mixed strings & tokens, or a list of prompts");
}

static void test_first_fault_wins(void **state) {
  (void)state;
  /* response_format, then messages, then tools, then tool_choice, then n (llama-server's order) */
  refused("{\"messages\":[{\"role\":\"user\",\"content\":42}],\"response_format\":{\"type\":\"xml\"}}", 1, 500,
          "response_format type must be one of \"text\" or \"json_object\", but got: xml");
  refused("{" HI ",\"n\":2,\"tools\":[{\"type\":\"function\"}],\"tool_choice\":\"bogus\"}", 1, 500,
          "Failed to parse tools: Missing tool function: {\"type\":\"function\"}; tools = [\n  {\n"
          "    \"type\": \"function\"\n  }\n]");
  refused("{" HI ",\"n\":2,\"top_logprobs\":2}", 1, 500, "Only one completion choice is allowed");
}

static void test_taken(void **state) {
  (void)state;
  ag_simreq r = taken("{" HI ",\"n\":1}", 1);
  assert_int_equal(r.shape, AG_SIMREQ_TEXT);
  assert_int_equal(r.top_logprobs, 0);
  /* json_value() falls back on the default for a value of the wrong type */
  taken("{" HI ",\"n\":\"2\"}", 1);
  taken("{" HI ",\"n\":true}", 1);
  taken("{" HI ",\"n\":4294967297}", 1);
  taken("{" HI ",\"n\":null,\"tool_choice\":5,\"tools\":[],\"messages\":[]}", 1);
  /* tools, and whether the answer calls one */
  assert_int_equal(taken("{" HI ",\"tools\":[" TOOL_OK "]}", 1).shape, AG_SIMREQ_TEXT);
  assert_int_equal(taken("{" HI ",\"tools\":[" TOOL_OK "],\"tool_choice\":\"none\"}", 1).shape, AG_SIMREQ_TEXT);
  calls("{" HI ",\"tools\":[" TOOL_OK "],\"tool_choice\":\"required\"}", "f");
  calls("{" HI ",\"tools\":[" TOOL_OK ",{\"type\":\"function\",\"function\":{\"name\":\"g\",\"description\":\"\","
        "\"parameters\":{}}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}",
        "g");
  r = taken("{" HI ",\"tools\":[" TOOL_OK "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", 1);
  assert_int_equal(r.shape, AG_SIMREQ_TEXT);
  assert_int_equal(taken("{" HI ",\"tool_choice\":\"required\"}", 1).shape, AG_SIMREQ_TEXT);
  /* response_format */
  r = taken("{" HI ",\"response_format\":{\"type\":\"json_object\"}}", 1);
  assert_int_equal(r.shape, AG_SIMREQ_JSON);
  assert_null(r.schema);
  r = taken("{" HI ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":"
            "{\"type\":\"object\"}}}}",
            1);
  assert_int_equal(r.shape, AG_SIMREQ_JSON);
  assert_non_null(r.schema); /* the pointer only: the tree is gone */
  assert_int_equal(taken("{" HI ",\"response_format\":{\"type\":\"text\"}}", 1).shape, AG_SIMREQ_TEXT);
  assert_int_equal(taken("{" HI ",\"response_format\":\"json\"}", 1).shape, AG_SIMREQ_TEXT);
  /* logprobs */
  assert_int_equal(taken("{" HI ",\"logprobs\":true}", 1).top_logprobs, 20);
  assert_int_equal(taken("{" HI ",\"logprobs\":true,\"top_logprobs\":2}", 1).top_logprobs, 2);
  assert_int_equal(taken("{" HI ",\"logprobs\":true,\"top_logprobs\":0}", 1).top_logprobs, 1);
  assert_int_equal(taken("{" HI ",\"logprobs\":\"yes\"}", 1).top_logprobs, 0);
  assert_int_equal(taken("{\"prompt\":\"a\",\"logprobs\":3}", 0).top_logprobs, 3);
  assert_int_equal(taken("{\"prompt\":[\"a\",1]}", 0).top_logprobs, 0);
}

/* b10587: its 400s, its 500s, its typed fields and what it serves. */
static void test_2026(void **state) {
  (void)state;
  static const ag_simreq_opts b10587 = {.release = AG_SIMREQ_2026, .n_parallel = 2};
  release_opts = &b10587;
  refused("{\"messages\":[{\"role\":\"user\",\"content\":42}]}", 1, 400,
          "Expected 'content' to be a string or an array");
  refused("{\"model\":\"m\"}", 1, 400, "'messages' is required");
  refused("[1]", 1, 400, "'messages' is required");
  refused("{\"messages\":[1]}", 1, 400, "All non-assistant messages must contain 'content'");
  refused("{\"messages\":[{\"role\":\"assistant\"}]}", 1, 400,
          "Assistant message must contain either 'content' or 'tool_calls'!");
  refused("{\"messages\":[{\"content\":\"hi\"}]}", 1, 500, "Failed to parse messages: Missing 'role' in message: "
          "{\"content\":\"hi\"}");
  refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 1, 500,
          "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj");
  refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}", 1, 400,
          "unsupported content[].type");
  /* a tool needs a name only; a broken schema is the request's 400 */
  taken("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":\"x\"}}]}", 1);
  refused("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"description\":\"d\"}}]}", 1, 500,
          "Failed to parse tools: [json.exception.out_of_range.403] key 'name' not found; tools = [\n  {\n"
          "    \"type\": \"function\",\n    \"function\": {\n      \"description\": \"d\"\n    }\n  }\n]");
  refused("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
          "\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/missing\"}}}}}]}",
          1, 400,
          "JSON schema conversion failed:\nError resolving ref #/$defs/missing: $defs not in {\"type\":\"object\","
          "\"properties\":{\"x\":{\"$ref\":\"#/$defs/missing\"}}}");
  refused("{" HI ",\"tool_choice\":\"bogus\"}", 1, 400, "Invalid tool_choice: bogus");
  refused("{" HI ",\"chat_template_kwargs\":{\"enable_thinking\":\"false\"}}", 1, 400,
          "invalid type for \"enable_thinking\" (expected boolean, got string)");
  /* typed fields, in the schema's order */
  refused("{" HI ",\"stream\":\"yes\",\"n\":9}", 1, 400,
          "Field 'stream': [json.exception.type_error.302] type must be boolean, but is string");
  refused("{" HI ",\"max_tokens\":-5}", 1, 400,
          "Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got -5");
  refused("{" HI ",\"n\":3}", 1, 400, "Field 'n': Value must be between 1 <= value <= 2, but got 3");
  refused("{\"max_tokens\":2}", 0, 400, "[json.exception.out_of_range.403] key 'prompt' not found");
  refused("{\"prompt\":[]}", 0, 400, "\"prompt\" must not be empty");
  /* served: n up to the slots, thinking switches, the cache's fields, token prompts */
  assert_int_equal(taken("{" HI ",\"n\":2}", 1).n, 2);
  assert_int_equal(taken("{" HI ",\"n\":2.5}", 1).n, 2);
  ag_simreq r = taken("{" HI "}", 1);
  assert_int_equal(r.thinking, -1);
  assert_int_equal(r.cache_prompt, 1);
  assert_int_equal(r.id_slot, -1);
  assert_int_equal(taken("{" HI ",\"chat_template_kwargs\":{\"enable_thinking\":false}}", 1).thinking, 0);
  assert_int_equal(taken("{" HI ",\"reasoning_effort\":\"none\"}", 1).thinking, 0);
  r = taken("{" HI ",\"cache_prompt\":false,\"id_slot\":1}", 1);
  assert_int_equal(r.cache_prompt, 0);
  assert_int_equal(r.id_slot, 1);
  assert_int_equal(taken("{" HI ",\"id_slot\":\"x\"}", 1).id_slot, -1);
  assert_int_equal(taken("{\"prompt\":\"hi\",\"echo\":true,\"best_of\":2}", 0).n, 1);
  cJSON *root = cJSON_Parse("{\"prompt\":[1,2,3],\"message_delimiters\":[{\"role\":\"user\",\"delimiter\":[2]}]}");
  ag_simreq_refusal ref;
  ag_simreq_refusal_init(&ref);
  assert_int_equal(ag_simreq_read(root, NULL, 0, 0, &b10587, &r, &ref), 0);
  assert_int_equal(cJSON_GetArraySize(r.token_ids), 3);
  assert_int_equal(cJSON_GetArraySize(r.delimiters), 1);
  ag_simreq_refusal_free(&ref);
  cJSON_Delete(root);
  release_opts = NULL;
  /* the 2025 build refuses n > 1 and tools with stream */
  refused("{" HI ",\"n\":2}", 1, 500, "Only one completion choice is allowed");
  refused("{" HI ",\"tools\":[" TOOL_OK "],\"stream\":true}", 1, 500, "Cannot use tools with stream");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_2026),
    cmocka_unit_test(test_captured_refusals),
    cmocka_unit_test(test_message_refusals),
    cmocka_unit_test(test_tool_refusals),
    cmocka_unit_test(test_other_refusals),
    cmocka_unit_test(test_first_fault_wins),
    cmocka_unit_test(test_taken),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
