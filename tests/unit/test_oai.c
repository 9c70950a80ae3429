/* Unit tests for proto/oai.c: the request shapes llama-server clients send, the three
 * token-cap names and their precedence, the cap rewrite, each bad input's status and
 * param, the ChatML rendering, prefix fingerprints and OpenAI's error body. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "buf.h"
#include "err.h"
#include "oai.h"

static int parse(pr_oai_req *r, pr_oai_kind kind, const char *body, pr_oai_error *err) {
  memset(err, 0, sizeof(*err));
  /* An exact-size heap copy: the parser must not rely on a NUL after the body. */
  size_t n = strlen(body);
  char *copy = malloc(n ? n : 1);
  memcpy(copy, body, n);
  int rc = pr_oai_parse(r, kind, copy, n, err);
  free(copy);
  return rc;
}

static pr_oai_req *parse_ok(pr_oai_kind kind, const char *body) {
  pr_oai_req *r = calloc(1, sizeof(*r));
  pr_oai_error err;
  int rc = parse(r, kind, body, &err);
  if (rc) fail_msg("parse failed (%d): %s [param %s]", rc, err.message, err.param);
  return r;
}

static void req_free(pr_oai_req *r) {
  pr_oai_free(r);
  free(r);
}

static int64_t chars_to_tokens(size_t chars) { return chars ? (int64_t)(chars + 3) / 4 : 1; }

static void test_chat_stream_request(void **state) {
  /* What an OpenAI SDK sends for a streamed chat with usage. */
  pr_oai_req *r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"qwen3.5-9b\",\"messages\":["
      "{\"role\":\"system\",\"content\":\"You are terse.\"},"
      "{\"role\":\"user\",\"content\":\"Hi\"}],"
      "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":16,"
      "\"temperature\":0.7}");
  assert_int_equal(r->kind, PR_OAI_CHAT);
  assert_string_equal(r->model, "qwen3.5-9b");
  assert_int_equal(r->stream, 1);
  assert_int_equal(r->include_usage, 1);
  assert_int_equal(r->max_tokens, 16);
  assert_int_equal(r->cap_field, PR_OAI_CAP_MAX_TOKENS);
  const char *want = "<|im_start|>system\nYou are terse.<|im_end|>\n"
                     "<|im_start|>user\nHi<|im_end|>\n"
                     "<|im_start|>assistant\n";
  assert_string_equal(pr_buf_cstr(&r->prompt), want);
  assert_int_equal(r->prompt_tokens, chars_to_tokens(strlen(want)));
  assert_int_equal(r->n_blocks, 0);
  req_free(r);
}

static void test_chat_defaults(void **state) {
  pr_oai_req *r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
  assert_int_equal(r->stream, 0);
  assert_int_equal(r->include_usage, 0);
  assert_int_equal(r->max_tokens, -1);
  assert_int_equal(r->cap_field, PR_OAI_CAP_NONE);
  assert_true(r->prompt_tokens >= 1);
  req_free(r);
  /* Explicit nulls mean "not set", as LangChain sends them. */
  r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":null,"
      "\"stream_options\":null,\"max_tokens\":null,\"n_predict\":null}");
  assert_int_equal(r->stream, 0);
  assert_int_equal(r->max_tokens, -1);
  assert_int_equal(r->cap_field, PR_OAI_CAP_NONE);
  req_free(r);
  /* stream false with include_usage false. */
  r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":false,"
      "\"stream_options\":{\"include_usage\":false}}");
  assert_int_equal(r->stream, 0);
  assert_int_equal(r->include_usage, 0);
  req_free(r);
  /* n = 1, valid tools (no description: the phone's template may want one, OpenAI does
   * not) and the other OpenAI features pass */
  r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":1,"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
      "\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"},"
      "\"logprobs\":true,\"top_logprobs\":2,\"seed\":7,\"stop\":[\"\\n\"]}");
  req_free(r);
  r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":null,\"tools\":null}");
  req_free(r);
}

static void test_chat_content_parts(void **state) {
  /* Vision-style content: text parts are joined with a newline, images skipped; null
   * and absent content (an assistant turn with tool_calls) render empty. */
  pr_oai_req *r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":["
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is\"},"
      "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAA\"}},"
      "{\"type\":\"text\",\"text\":\"this?\"}]},"
      "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\","
      "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"1\",\"content\":\"42\"},"
      "{\"role\":\"assistant\"}]}");
  assert_string_equal(pr_buf_cstr(&r->prompt),
                      "<|im_start|>user\nWhat is\nthis?<|im_end|>\n"
                      "<|im_start|>assistant\n<|im_end|>\n"
                      "<|im_start|>tool\n42<|im_end|>\n"
                      "<|im_start|>assistant\n<|im_end|>\n"
                      "<|im_start|>assistant\n");
  req_free(r);
}

static void test_render_chatml(void **state) {
  cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"a\\\"b\\u00e9\"}]");
  pr_buf out;
  pr_buf_init(&out, 1024);
  assert_int_equal(pr_buf_append_str(&out, "keep:"), 0);
  assert_int_equal(pr_oai_render_chatml(msgs, &out), 0);
  assert_string_equal(pr_buf_cstr(&out),
                      "keep:<|im_start|>user\na\"b\xc3\xa9<|im_end|>\n<|im_start|>assistant\n");
  cJSON_Delete(msgs);
  /* A bad message fails and leaves what was there. */
  pr_buf_reset(&out);
  assert_int_equal(pr_buf_append_str(&out, "keep"), 0);
  msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":1}]");
  assert_int_equal(pr_oai_render_chatml(msgs, &out), PR_ETYPE);
  assert_string_equal(pr_buf_cstr(&out), "keep");
  cJSON_Delete(msgs);
  /* Past the buffer's cap. */
  pr_buf_free(&out);
  pr_buf_init(&out, 20);
  msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"a long enough message\"}]");
  assert_int_equal(pr_oai_render_chatml(msgs, &out), PR_ETOOLARGE);
  assert_int_equal(out.len, 0);
  cJSON_Delete(msgs);
  pr_buf_free(&out);
}

static void test_completion_request(void **state) {
  /* llama-server's native style: /completion-like body on /v1/completions. */
  pr_oai_req *r = parse_ok(PR_OAI_COMPLETION,
      "{\"model\":\"tiny.gguf\",\"prompt\":\"Building a website can be done in 10 steps:\","
      "\"n_predict\":128,\"cache_prompt\":true}");
  assert_int_equal(r->kind, PR_OAI_COMPLETION);
  assert_string_equal(pr_buf_cstr(&r->prompt), "Building a website can be done in 10 steps:");
  assert_int_equal(r->max_tokens, 128);
  assert_int_equal(r->cap_field, PR_OAI_CAP_N_PREDICT);
  assert_int_equal(r->prompt_tokens, 11); /* 43 chars */
  req_free(r);
  r = parse_ok(PR_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"ab\",\"cd\"]}");
  assert_string_equal(pr_buf_cstr(&r->prompt), "ab\ncd");
  assert_int_equal(r->prompt_tokens, 2);
  req_free(r);
  /* An empty prompt still counts as one token. */
  r = parse_ok(PR_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"\"}");
  assert_int_equal(r->prompt_tokens, 1);
  req_free(r);
}

static void test_token_estimate_counts_characters(void **state) {
  /* 8 Cyrillic letters are 16 bytes but 8 characters: 2 tokens, not 4. */
  pr_oai_req *r = parse_ok(PR_OAI_COMPLETION,
      "{\"model\":\"m\",\"prompt\":\"\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82\xd0\xb8\xd0\xba\"}");
  assert_int_equal(r->prompt.len, 16);
  assert_int_equal(r->prompt_tokens, 2);
  req_free(r);
  r = parse_ok(PR_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"12345\"}");
  assert_int_equal(r->prompt_tokens, 2); /* ceil(5/4) */
  req_free(r);
}

static void test_cap_precedence(void **state) {
  static const struct {
    const char *caps;
    int64_t want;
    pr_oai_cap_field field;
  } cases[] = {
    {"", -1, PR_OAI_CAP_NONE},
    {",\"max_tokens\":100", 100, PR_OAI_CAP_MAX_TOKENS},
    {",\"max_completion_tokens\":200", 200, PR_OAI_CAP_MAX_COMPLETION_TOKENS},
    {",\"n_predict\":300", 300, PR_OAI_CAP_N_PREDICT},
    {",\"max_tokens\":100,\"max_completion_tokens\":200", 200, PR_OAI_CAP_MAX_COMPLETION_TOKENS},
    {",\"max_completion_tokens\":200,\"max_tokens\":100", 200, PR_OAI_CAP_MAX_COMPLETION_TOKENS},
    {",\"max_tokens\":100,\"n_predict\":300", 300, PR_OAI_CAP_N_PREDICT},
    {",\"max_tokens\":100,\"max_completion_tokens\":200,\"n_predict\":300", 300,
     PR_OAI_CAP_N_PREDICT},
    /* n_predict -1 is llama.cpp's "unlimited", and it wins upstream too. */
    {",\"n_predict\":-1", -1, PR_OAI_CAP_NONE},
    {",\"n_predict\":-1,\"max_tokens\":100", -1, PR_OAI_CAP_NONE},
    {",\"max_tokens\":null,\"max_completion_tokens\":50", 50, PR_OAI_CAP_MAX_COMPLETION_TOKENS},
    {",\"max_tokens\":2147483647", 2147483647, PR_OAI_CAP_MAX_TOKENS},
    {",\"max_tokens\":1.0", 1, PR_OAI_CAP_MAX_TOKENS},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char body[512];
    snprintf(body, sizeof(body),
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]%s}",
             cases[i].caps);
    pr_oai_req *r = parse_ok(PR_OAI_CHAT, body);
    if (r->max_tokens != cases[i].want || r->cap_field != cases[i].field)
      fail_msg("case %zu (%s): max_tokens %lld field %d", i, cases[i].caps,
               (long long)r->max_tokens, (int)r->cap_field);
    req_free(r);
  }
}

/* Reads back what pr_oai_render sends upstream. */
static cJSON *rendered(const pr_oai_req *r) {
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  assert_int_equal(pr_oai_render(r, &out), 0);
  cJSON *j = cJSON_Parse(pr_buf_cstr(&out));
  assert_non_null(j);
  pr_buf_free(&out);
  return j;
}

static int count_key(const cJSON *obj, const char *key) {
  int n = 0;
  for (const cJSON *it = obj->child; it; it = it->next)
    if (strcmp(it->string, key) == 0) n++;
  return n;
}

static double num(const cJSON *obj, const char *key) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  assert_true(cJSON_IsNumber(it));
  return it->valuedouble;
}

static void test_set_max_tokens_adds(void **state) {
  pr_oai_req *r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true}");
  assert_int_equal(pr_oai_set_max_tokens(r, 512), 0);
  assert_int_equal(r->max_tokens, 512);
  assert_int_equal(r->cap_field, PR_OAI_CAP_MAX_TOKENS);
  cJSON *j = rendered(r);
  assert_int_equal((int)num(j, "max_tokens"), 512);
  assert_null(cJSON_GetObjectItem(j, "max_completion_tokens"));
  assert_null(cJSON_GetObjectItem(j, "n_predict"));
  /* The rest of the body goes through untouched. */
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "stream")));
  assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "m");
  cJSON_Delete(j);
  /* Setting again replaces, never duplicates. */
  assert_int_equal(pr_oai_set_max_tokens(r, 64), 0);
  j = rendered(r);
  assert_int_equal(count_key(j, "max_tokens"), 1);
  assert_int_equal((int)num(j, "max_tokens"), 64);
  cJSON_Delete(j);
  req_free(r);
}

/* The client's own "cache_prompt": false is noted at parse and stays, whatever the gateway
 * sets in the body for a phone (pr_oai_set_cache puts its own there). */
static void test_cache_off(void **state) {
  (void)state;
  pr_oai_req *off = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_prompt\":false}");
  pr_oai_req *on = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_prompt\":true}");
  pr_oai_req *none = parse_ok(PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
  assert_int_equal(off->cache_off, 1);
  assert_int_equal(on->cache_off, 0);
  assert_int_equal(none->cache_off, 0);
  /* the gateway's own choice for a phone does not change what the client said */
  assert_int_equal(pr_oai_set_cache(on, 0, -1), 0);
  assert_int_equal(on->cache_off, 0);
  assert_int_equal(pr_oai_set_cache(off, 1, -1), 0);
  assert_int_equal(off->cache_off, 1);
  assert_int_equal(pr_oai_set_cache(none, 0, -1), 0);
  assert_int_equal(none->cache_off, 0);
  req_free(off);
  req_free(on);
  req_free(none);
}

static void test_set_max_tokens_rewrites_every_name(void **state) {
  /* Whatever name upstream honours, it must read the gateway's cap. */
  pr_oai_req *r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
      "\"max_completion_tokens\":4000}");
  assert_int_equal(pr_oai_set_max_tokens(r, 256), 0);
  assert_int_equal(r->cap_field, PR_OAI_CAP_MAX_COMPLETION_TOKENS);
  cJSON *j = rendered(r);
  assert_int_equal((int)num(j, "max_tokens"), 256);
  assert_int_equal((int)num(j, "max_completion_tokens"), 256);
  assert_null(cJSON_GetObjectItem(j, "n_predict"));
  cJSON_Delete(j);
  req_free(r);

  r = parse_ok(PR_OAI_COMPLETION,
      "{\"model\":\"m\",\"prompt\":\"x\",\"n_predict\":-1,\"max_tokens\":9000}");
  assert_int_equal(r->max_tokens, -1);
  assert_int_equal(pr_oai_set_max_tokens(r, 300), 0);
  assert_int_equal(r->max_tokens, 300);
  assert_int_equal(r->cap_field, PR_OAI_CAP_N_PREDICT);
  j = rendered(r);
  assert_int_equal((int)num(j, "n_predict"), 300);
  assert_int_equal((int)num(j, "max_tokens"), 300);
  assert_int_equal(count_key(j, "max_tokens"), 1);
  assert_null(cJSON_GetObjectItem(j, "max_completion_tokens"));
  cJSON_Delete(j);
  /* Nonsense caps are refused and change nothing. */
  assert_int_equal(pr_oai_set_max_tokens(r, 0), -EINVAL);
  assert_int_equal(pr_oai_set_max_tokens(r, -1), -EINVAL);
  assert_int_equal(r->max_tokens, 300);
  req_free(r);
}

typedef struct bad_case {
  pr_oai_kind kind;
  const char *body;
  int rc;
  const char *param; /* "" for null */
  const char *code;  /* NULL for null */
} bad_case;

static void test_bad_requests(void **state) {
  static const bad_case cases[] = {
    {PR_OAI_CHAT, "{\"model\":\"m\",", PR_EPARSE, "", "invalid_json"},
    {PR_OAI_CHAT, "", PR_EPARSE, "", "invalid_json"},
    {PR_OAI_CHAT, "{\"model\":\"m\"} x", PR_EPARSE, "", "invalid_json"},
    {PR_OAI_CHAT, "[1,2]", PR_ETYPE, "", "invalid_json"},
    {PR_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", PR_EMISSING, "model", NULL},
    {PR_OAI_CHAT, "{\"model\":\"\",\"messages\":[]}", PR_EMISSING, "model", NULL},
    {PR_OAI_CHAT, "{\"model\":null,\"messages\":[]}", PR_EMISSING, "model", NULL},
    {PR_OAI_CHAT, "{\"model\":7,\"messages\":[]}", PR_ETYPE, "model", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\"}", PR_EMISSING, "messages", "missing_required_parameter"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[]}", PR_EMISSING, "messages", "empty_array"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":\"hi\"}", PR_ETYPE, "messages", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[\"hi\"]}", PR_ETYPE, "messages[0]", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"content\":\"b\"}]}",
     PR_EMISSING, "messages[1].role", "missing_required_parameter"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":false,\"content\":\"b\"}]}",
     PR_ETYPE, "messages[0].role", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
     PR_ETYPE, "messages[0].content", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}",
     PR_ETYPE, "messages[0].content[0]", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}",
     PR_EMISSING, "messages[0].content[0].type", "missing_required_parameter"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
     PR_EMISSING, "messages[0].content[0].text", "missing_required_parameter"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}",
     PR_ETYPE, "messages[0].content[0].text", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"true\"}",
     PR_ETYPE, "stream", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}",
     PR_ETYPE, "stream", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":true}",
     PR_ETYPE, "stream_options", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
     "\"stream_options\":{\"include_usage\":\"yes\"}}",
     PR_ETYPE, "stream_options.include_usage", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}",
     PR_ERANGE, "max_tokens", "integer_below_min_value"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}",
     PR_ERANGE, "max_tokens", "integer_below_min_value"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}",
     PR_ETYPE, "max_tokens", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"10\"}",
     PR_ETYPE, "max_tokens", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1e999}",
     PR_ETYPE, "max_tokens", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
     "\"max_completion_tokens\":2147483648}",
     PR_ERANGE, "max_completion_tokens", "integer_above_max_value"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n_predict\":0}",
     PR_ERANGE, "n_predict", "integer_below_min_value"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n_predict\":-2}",
     PR_ERANGE, "n_predict", "integer_below_min_value"},
    /* A valid higher-precedence cap does not excuse a broken lower one. */
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
     "\"n_predict\":10,\"max_tokens\":false}", PR_ETYPE, "max_tokens", "invalid_type"},
    /* Two caps under one name: we and upstream would read different ones. */
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
     "\"max_tokens\":10,\"max_tokens\":100000}", PR_EPARSE, "max_tokens", "duplicate_key"},
    {PR_OAI_COMPLETION, "{\"model\":\"m\"}", PR_EMISSING, "prompt", "missing_required_parameter"},
    {PR_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[]}", PR_EMISSING, "prompt", "empty_array"},
    {PR_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":{}}", PR_ETYPE, "prompt", "invalid_type"},
    {PR_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"a\",3]}", PR_ETYPE, "prompt[1]", "invalid_type"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    pr_oai_req r;
    pr_oai_error err;
    int rc = parse(&r, cases[i].kind, cases[i].body, &err);
    if (rc != cases[i].rc || err.status != 400 ||
        strcmp(err.param, cases[i].param) != 0 ||
        (cases[i].code == NULL) != (err.code == NULL) ||
        (cases[i].code && strcmp(cases[i].code, err.code) != 0))
      fail_msg("case %zu %s: rc %d status %d param '%s' code %s msg %s", i, cases[i].body, rc,
               err.status, err.param, err.code ? err.code : "null", err.message);
    assert_string_equal(err.type, "invalid_request_error");
    assert_true(strlen(err.message) > 0);
    /* Nothing is left to free, and freeing again is harmless. */
    assert_null(r.root);
    pr_oai_free(&r);
  }
}

/* The gateway's own checks after parsing (pr_oai_check_fleet): what every phone would
 * refuse. The sim parses without them and answers as llama-server does. */
static void test_fleet_checks(void **state) {
  (void)state;
  static const bad_case cases[] = {
    /* n: a whole number of choices, at most 64 (which phones serve how many is the gateway's) */
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":65}", PR_ERANGE, "n", "integer_above_max_value"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n_cmpl\":100}", PR_ERANGE, "n_cmpl", "integer_above_max_value"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2,\"n_cmpl\":3}", PR_ERANGE, "n_cmpl", "conflicting_value"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}", PR_ERANGE, "n", "integer_below_min_value"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":\"2\"}", PR_ETYPE, "n", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":1.5}", PR_ETYPE, "n", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":1,\"n\":2}", PR_EPARSE, "n", "duplicate_key"},
    /* tools: OpenAI's own shape (a description is the phone's business) */
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", PR_ETYPE, "tools", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[1]}", PR_ETYPE, "tools[0]", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"function\":{\"name\":\"f\"}}]}", PR_EMISSING, "tools[0].type", "missing_required_parameter"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]}", -EINVAL, "tools[0].type", "invalid_value"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", PR_EMISSING, "tools[0].function", "missing_required_parameter"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{}}]}", PR_EMISSING, "tools[0].function.name", "missing_required_parameter"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]}", -EINVAL, "tools[0].function.name", "empty_string"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}", PR_ETYPE, "tools[0].function.parameters", "invalid_type"},
    {PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":3}}]}", PR_ETYPE, "tools[0].function.description", "invalid_type"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    pr_oai_req *r = parse_ok(cases[i].kind, cases[i].body);
    pr_oai_error err;
    memset(&err, 0, sizeof(err));
    int rc = pr_oai_check_fleet(r, &err);
    if (rc != cases[i].rc || err.status != 400 || strcmp(err.param, cases[i].param) != 0 ||
        !err.code || strcmp(cases[i].code, err.code) != 0)
      fail_msg("case %zu %s: rc %d status %d param '%s' code %s msg %s", i, cases[i].body, rc,
               err.status, err.param, err.code ? err.code : "null", err.message);
    assert_string_equal(err.type, "invalid_request_error");
    req_free(r);
  }
  pr_oai_req *r = parse_ok(PR_OAI_CHAT,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":1,"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}");
  pr_oai_error err;
  assert_int_equal(pr_oai_check_fleet(r, &err), 0);
  assert_int_equal(r->choices, 1);
  req_free(r);
  /* more than one choice passes (the gateway asks its phones), under either name */
  r = parse_ok(PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":3}");
  assert_int_equal(pr_oai_check_fleet(r, &err), 0);
  assert_int_equal(r->choices, 3);
  req_free(r);
  r = parse_ok(PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n_cmpl\":2,\"n\":2}");
  assert_int_equal(pr_oai_check_fleet(r, &err), 0);
  assert_int_equal(r->choices, 2);
  req_free(r);
}

static void test_error_messages(void **state) {
  pr_oai_req r;
  pr_oai_error err;
  assert_int_equal(parse(&r, PR_OAI_CHAT, "{\"messages\":[]}", &err), PR_EMISSING);
  assert_string_equal(err.message, "you must provide a model parameter");
  /* A syntax error says where. */
  assert_int_equal(parse(&r, PR_OAI_CHAT, "{\n\"model\": \"m\",\n\"messages\": [,]}", &err),
                   PR_EPARSE);
  assert_non_null(strstr(err.message, "line 3"));
  assert_string_equal(err.param, "");
  assert_int_equal(parse(&r, PR_OAI_CHAT, "{\"model\":\"m\",\"stream\":\"yes\","
                         "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &err), PR_ETYPE);
  assert_string_equal(err.message,
                      "Invalid type for 'stream': expected a boolean, but got a string instead.");
  /* Deeply nested bodies are refused before cJSON recurses into them. */
  char deep[300];
  int n = snprintf(deep, sizeof(deep), "{\"model\":\"m\",\"x\":");
  for (int i = 0; i < 100; i++) deep[n++] = '[';
  for (int i = 0; i < 100; i++) deep[n++] = ']';
  deep[n++] = '}';
  deep[n] = '\0';
  assert_int_equal(parse(&r, PR_OAI_CHAT, deep, &err), PR_EPARSE);
  assert_string_equal(err.code, "invalid_json");
}

static void test_render_roundtrip(void **state) {
  const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                     "\"temperature\":0.5,\"stop\":[\"\\n\"],\"cache_prompt\":true}";
  pr_oai_req *r = parse_ok(PR_OAI_CHAT, body);
  pr_buf out;
  pr_buf_init(&out, 4096);
  assert_int_equal(pr_oai_render(r, &out), 0);
  assert_string_equal(pr_buf_cstr(&out), body);
  pr_buf_free(&out);
  req_free(r);
}

/* Independent check of one fingerprint: the first 8 bytes, big-endian, of the
 * one-shot SHA-256 of the prefix. */
static uint64_t sha_prefix(const char *s, size_t n) {
  unsigned char md[32];
  unsigned int len = 0;
  assert_int_equal(EVP_Digest(s, n, md, &len, EVP_sha256(), NULL), 1);
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | md[i];
  return v;
}

static char *completion_body(const char *prompt) {
  pr_buf b;
  pr_buf_init(&b, 1 << 22);
  assert_int_equal(pr_buf_appendf(&b, "{\"model\":\"m\",\"prompt\":\"%s\"}", prompt), 0);
  return pr_buf_steal(&b, NULL);
}

static char *filler(size_t n, char c) {
  char *s = malloc(n + 1);
  for (size_t i = 0; i < n; i++) s[i] = (char)(c + (i % 23));
  s[n] = '\0';
  return s;
}

static void test_fingerprints(void **state) {
  const size_t B = PR_OAI_BLOCK_CHARS;
  char *p1 = filler(5 * B + 10, 'a');
  char *p2 = strdup(p1);
  p2[3 * B + 7] = '#'; /* a change inside block 3 */
  char *b1 = completion_body(p1), *b2 = completion_body(p2);
  pr_oai_req *r1 = parse_ok(PR_OAI_COMPLETION, b1);
  pr_oai_req *r2 = parse_ok(PR_OAI_COMPLETION, b2);
  assert_int_equal(r1->n_blocks, 5);
  assert_int_equal(r2->n_blocks, 5);
  for (size_t i = 0; i < 5; i++) assert_true(r1->blocks[i] == sha_prefix(p1, (i + 1) * B));
  /* Equal prefixes share blocks; the change in block 3 limits the match to 3. */
  assert_int_equal(pr_oai_common_blocks(r1->blocks, r1->n_blocks, r2->blocks, r2->n_blocks), 3);
  assert_int_equal(pr_oai_common_blocks(r1->blocks, r1->n_blocks, r1->blocks, r1->n_blocks), 5);
  assert_int_equal(pr_oai_common_blocks(r1->blocks, 2, r2->blocks, r2->n_blocks), 2);
  assert_int_equal(pr_oai_common_blocks(r1->blocks, 0, r2->blocks, r2->n_blocks), 0);
  /* A longer prompt with the same start shares all of the shorter one's blocks. */
  char *p3 = filler(7 * B, 'a');
  char *b3 = completion_body(p3);
  pr_oai_req *r3 = parse_ok(PR_OAI_COMPLETION, b3);
  assert_int_equal(r3->n_blocks, 7);
  assert_int_equal(pr_oai_common_blocks(r1->blocks, r1->n_blocks, r3->blocks, r3->n_blocks), 5);
  /* A change in block 0 shares nothing. */
  p2[0] = '!';
  free(b2);
  b2 = completion_body(p2);
  req_free(r2);
  r2 = parse_ok(PR_OAI_COMPLETION, b2);
  assert_int_equal(pr_oai_common_blocks(r1->blocks, r1->n_blocks, r2->blocks, r2->n_blocks), 0);
  req_free(r1);
  req_free(r2);
  req_free(r3);
  free(p1);
  free(p2);
  free(p3);
  free(b1);
  free(b2);
  free(b3);
}

static void test_fingerprint_limits(void **state) {
  const size_t B = PR_OAI_BLOCK_CHARS;
  /* Less than one block: nothing to fingerprint; exactly one: one block. */
  char *p = filler(B - 1, 'a');
  char *b = completion_body(p);
  pr_oai_req *r = parse_ok(PR_OAI_COMPLETION, b);
  assert_int_equal(r->n_blocks, 0);
  req_free(r);
  free(b);
  free(p);
  p = filler(B, 'a');
  b = completion_body(p);
  r = parse_ok(PR_OAI_COMPLETION, b);
  assert_int_equal(r->n_blocks, 1);
  req_free(r);
  free(b);
  free(p);
  /* Long prompts fingerprint only their first PR_OAI_MAX_BLOCKS blocks. */
  size_t n = (PR_OAI_MAX_BLOCKS + 10) * B;
  p = filler(n, 'a');
  b = completion_body(p);
  r = parse_ok(PR_OAI_COMPLETION, b);
  assert_int_equal(r->n_blocks, PR_OAI_MAX_BLOCKS);
  assert_true(r->blocks[PR_OAI_MAX_BLOCKS - 1] == sha_prefix(p, PR_OAI_MAX_BLOCKS * B));
  assert_int_equal(r->prompt_tokens, (int64_t)(n + 3) / 4);
  req_free(r);
  free(b);
  free(p);
}

static void test_chat_fingerprints_share_system_prompt(void **state) {
  /* Two chats with the same long system prompt share its blocks. */
  char *sys = filler(4 * PR_OAI_BLOCK_CHARS, 'A');
  char body[4096];
  snprintf(body, sizeof(body), "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
           "{\"role\":\"user\",\"content\":\"first question\"}]}", sys);
  pr_oai_req *a = parse_ok(PR_OAI_CHAT, body);
  snprintf(body, sizeof(body), "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
           "{\"role\":\"user\",\"content\":\"another one\"}]}", sys);
  pr_oai_req *b = parse_ok(PR_OAI_CHAT, body);
  /* "<|im_start|>system\n" + 4 blocks of system text: the first 4 blocks match. */
  assert_int_equal(a->n_blocks, 4);
  assert_int_equal(pr_oai_common_blocks(a->blocks, a->n_blocks, b->blocks, b->n_blocks), 4);
  req_free(a);
  req_free(b);
  free(sys);
}

static void test_error_body(void **state) {
  pr_buf out;
  pr_buf_init(&out, 4096);
  assert_int_equal(pr_oai_error_body(&out, "queue full", "rate_limit_error", NULL, NULL), 0);
  assert_string_equal(pr_buf_cstr(&out),
                      "{\"error\":{\"message\":\"queue full\",\"type\":\"rate_limit_error\","
                      "\"param\":null,\"code\":null}}");
  pr_buf_reset(&out);
  /* "" is null too; quotes and newlines are escaped. */
  assert_int_equal(pr_oai_error_body(&out, "bad \"x\"\nline", "invalid_request_error", "",
                                     "queue_timeout"), 0);
  assert_string_equal(pr_buf_cstr(&out),
                      "{\"error\":{\"message\":\"bad \\\"x\\\"\\nline\",\"type\":"
                      "\"invalid_request_error\",\"param\":null,\"code\":\"queue_timeout\"}}");
  pr_buf_reset(&out);
  assert_int_equal(pr_oai_error_body(&out, NULL, NULL, "model", "c"), 0);
  cJSON *j = cJSON_Parse(pr_buf_cstr(&out));
  const cJSON *e = cJSON_GetObjectItem(j, "error");
  assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring, "");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(e, "type")));
  assert_string_equal(cJSON_GetObjectItem(e, "param")->valuestring, "model");
  assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, "c");
  cJSON_Delete(j);
  pr_buf_free(&out);
  /* Past the cap: an error and nothing written. */
  pr_buf_init(&out, 10);
  assert_int_equal(pr_oai_error_body(&out, "m", "t", NULL, NULL), PR_ETOOLARGE);
  assert_int_equal(out.len, 0);
  pr_buf_free(&out);
}

static void test_error_from_parse(void **state) {
  /* What the gateway does with a bad body: parse, then answer with err's fields. */
  pr_oai_req r;
  pr_oai_error err;
  assert_int_equal(parse(&r, PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{}]}", &err), PR_EMISSING);
  pr_buf out;
  pr_buf_init(&out, 4096);
  assert_int_equal(pr_oai_error_body(&out, err.message, err.type, err.param, err.code), 0);
  cJSON *j = cJSON_Parse(pr_buf_cstr(&out));
  const cJSON *e = cJSON_GetObjectItem(j, "error");
  assert_int_equal(cJSON_GetArraySize(e), 4);
  assert_string_equal(cJSON_GetObjectItem(e, "param")->valuestring, "messages[0].role");
  assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
  cJSON_Delete(j);
  pr_buf_free(&out);
}

static void test_error_set(void **state) {
  pr_oai_error err;
  char longp[200];
  memset(longp, 'p', sizeof(longp) - 1);
  longp[sizeof(longp) - 1] = '\0';
  pr_oai_error_set(&err, 429, "rate_limit_error", longp, "rate_limited", "wait %d s", 3);
  assert_int_equal(err.status, 429);
  assert_string_equal(err.message, "wait 3 s");
  assert_int_equal(strlen(err.param), sizeof(err.param) - 1);
  assert_string_equal(err.code, "rate_limited");
  pr_oai_error_set(&err, 503, "unavailable_error", NULL, NULL, "no replica");
  assert_string_equal(err.param, "");
  assert_null(err.code);
  pr_oai_error_set(NULL, 400, "x", NULL, NULL, "ignored");
}

static cJSON *render_cont_mode(const char *body, const char *sofar, const char *reasoning, pr_oai_cont_mode mode,
                               int64_t left) {
  pr_oai_req *r = parse_ok(strstr(body, "\"prompt\"") ? PR_OAI_COMPLETION : PR_OAI_CHAT, body);
  pr_buf out;
  pr_buf_init(&out, 1 << 20);
  assert_int_equal(pr_oai_render_continuation(r, sofar, reasoning, mode, left, &out), 0);
  cJSON *root = cJSON_ParseWithLength(out.data, out.len);
  assert_non_null(root);
  pr_buf_free(&out);
  req_free(r);
  return root;
}

static cJSON *render_cont(const char *body, const char *sofar, int64_t left) {
  return render_cont_mode(body, sofar, "ignored: a prefill cannot carry reasoning", PR_OAI_CONT_PREFILL, left);
}

static void test_continuation_of_a_thinking_answer(void **state) {
  (void)state;
  /* an engine that serves continue_final_message gets the reasoning so far and the content
   * so far in the last assistant message, and is told to go on inside it; the client's own
   * values of the two switches give way, its chat_template_kwargs stay */
  cJSON *root = render_cont_mode(
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":50,"
      "\"add_generation_prompt\":true,\"chat_template_kwargs\":{\"enable_thinking\":true}}",
      "", "  governors\nSIM 132 \n", PR_OAI_CONT_FINAL, 44);
  const cJSON *last = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "messages"), 1);
  assert_string_equal(cJSON_GetObjectItem(last, "role")->valuestring, "assistant");
  assert_string_equal(cJSON_GetObjectItem(last, "content")->valuestring, "");
  assert_string_equal(cJSON_GetObjectItem(last, "reasoning_content")->valuestring, "  governors\nSIM 132 \n");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(root, "continue_final_message")));
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(root, "add_generation_prompt")));
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "chat_template_kwargs"), "enable_thinking")));
  assert_int_equal((int)cJSON_GetObjectItem(root, "max_tokens")->valuedouble, 44);
  /* one of each key, whatever the client sent */
  int n = 0;
  for (const cJSON *it = root->child; it; it = it->next) n += strcmp(it->string, "add_generation_prompt") == 0;
  assert_int_equal(n, 1);
  cJSON_Delete(root);
  /* content after the reasoning: both go back */
  root = render_cont_mode("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "Hel",
                          "thought", PR_OAI_CONT_FINAL, 3);
  last = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "messages"), 1);
  assert_string_equal(cJSON_GetObjectItem(last, "content")->valuestring, "Hel");
  assert_string_equal(cJSON_GetObjectItem(last, "reasoning_content")->valuestring, "thought");
  cJSON_Delete(root);
  /* no reasoning: none sent; a prefill (older engines) has neither it nor the switches */
  root = render_cont_mode("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "Hel", "",
                          PR_OAI_CONT_FINAL, 3);
  assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "messages"), 1), "reasoning_content"));
  cJSON_Delete(root);
  root = render_cont("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "Hel", 3);
  assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "messages"), 1), "reasoning_content"));
  assert_null(cJSON_GetObjectItem(root, "continue_final_message"));
  assert_null(cJSON_GetObjectItem(root, "add_generation_prompt"));
  cJSON_Delete(root);
}

static void test_continuation(void **state) {
  (void)state;
  /* chat: the text so far becomes the assistant's message; every cap the client used is
   * what is left; tools and the rest stay */
  cJSON *root = render_cont(
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":50,"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"seed\":3,\"stop\":[\"x\"],"
      "\"response_format\":{\"type\":\"json_object\"}}",
      "Hello wor", 41);
  const cJSON *msgs = cJSON_GetObjectItem(root, "messages");
  assert_int_equal(cJSON_GetArraySize(msgs), 2);
  const cJSON *last = cJSON_GetArrayItem(msgs, 1);
  assert_string_equal(cJSON_GetObjectItem(last, "role")->valuestring, "assistant");
  assert_string_equal(cJSON_GetObjectItem(last, "content")->valuestring, "Hello wor");
  assert_int_equal((int)cJSON_GetObjectItem(root, "max_completion_tokens")->valuedouble, 41);
  assert_int_equal((int)cJSON_GetObjectItem(root, "max_tokens")->valuedouble, 41);
  assert_non_null(cJSON_GetObjectItem(root, "tools"));
  assert_int_equal((int)cJSON_GetObjectItem(root, "seed")->valuedouble, 3);
  assert_non_null(cJSON_GetObjectItem(root, "stop"));
  assert_non_null(cJSON_GetObjectItem(root, "response_format"));
  cJSON_Delete(root);
  /* completions: appended to the prompt; a cap of nothing left is still 1 */
  root = render_cont("{\"model\":\"m\",\"prompt\":\"Once\",\"n_predict\":8}", " upon", 0);
  assert_string_equal(cJSON_GetObjectItem(root, "prompt")->valuestring, "Once upon");
  assert_int_equal((int)cJSON_GetObjectItem(root, "n_predict")->valuedouble, 1);
  assert_int_equal((int)cJSON_GetObjectItem(root, "max_tokens")->valuedouble, 1);
  cJSON_Delete(root);
}

static int rewrite(const char *chunk, const char *id, int64_t before, char **out) {
  cJSON *c = cJSON_Parse(chunk);
  assert_non_null(c);
  int drop = pr_oai_continue_chunk(c, id, before);
  *out = cJSON_PrintUnformatted(c);
  cJSON_Delete(c);
  return drop;
}

static void test_continue_chunk(void **state) {
  (void)state;
  char *out;
  /* the new phone's bare role chunk is dropped */
  assert_int_equal(rewrite("{\"id\":\"b\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}",
                           "a", 5, &out), 1);
  free(out);
  /* a role chunk with text or with tool calls keeps them, without the role */
  assert_int_equal(rewrite("{\"id\":\"b\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"x\"}}]}",
                           "a", 5, &out), 0);
  assert_string_equal(out, "{\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}");
  free(out);
  assert_int_equal(rewrite("{\"id\":\"b\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":"
                           "[{\"index\":0,\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}}]}",
                           "a", 0, &out), 0);
  assert_non_null(strstr(out, "\"tool_calls\""));
  assert_null(strstr(out, "\"role\""));
  free(out);
  /* ...and with reasoning */
  assert_int_equal(rewrite("{\"id\":\"b\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                           "\"reasoning_content\":\"r\"}}]}", "a", 5, &out), 0);
  assert_string_equal(out, "{\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"r\"}}]}");
  free(out);
  /* usage counts what earlier phones sent */
  assert_int_equal(rewrite("{\"id\":\"b\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,"
                           "\"total_tokens\":12}}", "a", 5, &out), 0);
  assert_string_equal(out, "{\"id\":\"a\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":8,"
                           "\"total_tokens\":17}}");
  free(out);
  /* no first id known: the chunk keeps its own */
  assert_int_equal(rewrite("{\"id\":\"b\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"y\"}}]}", "", 0, &out), 0);
  assert_non_null(strstr(out, "\"id\":\"b\""));
  free(out);
}

/* A phone's answer is parsed under a client body's caps: depth, values, UTF-8. */
static void test_parse_answer_caps(void **state) {
  (void)state;
  cJSON *root = NULL;
  pr_oai_error err;
  const char *ok = "{\"choices\":[{\"message\":{\"content\":\"hi\"}}],\"timings\":{\"prompt_n\":1e999}}";
  assert_int_equal(pr_oai_parse_answer(ok, strlen(ok), &root, &err), 0);
  assert_non_null(root);
  cJSON_Delete(root);
  /* nesting past 64 */
  char deep[300];
  size_t n = 0;
  for (int i = 0; i < 100; i++) deep[n++] = '[';
  for (int i = 0; i < 100; i++) deep[n++] = ']';
  assert_true(pr_oai_parse_answer(deep, n, &root, &err) < 0);
  assert_null(root);
  assert_non_null(strstr(err.message, "nesting"));
  /* more than 100,000 values */
  size_t big = 2 * 100001 + 2;
  char *many = malloc(big + 1);
  assert_non_null(many);
  n = 0;
  many[n++] = '[';
  for (int i = 0; i < 100001; i++) {
    many[n++] = '0';
    many[n++] = ',';
  }
  many[n - 1] = ']';
  assert_int_equal(pr_oai_parse_answer(many, n, &root, &err), PR_ETOOLARGE);
  assert_null(root);
  free(many);
  /* not UTF-8, fed one byte short as well */
  const char bad[] = "{\"a\":\"\xff\"}";
  assert_true(pr_oai_parse_answer(bad, sizeof(bad) - 1, &root, &err) < 0);
  assert_true(pr_oai_parse_answer(ok, strlen(ok) - 1, &root, &err) < 0);
  assert_null(root);
}

static size_t text_bytes_of(const char *raw, size_t *choices) {
  cJSON *root = NULL;
  pr_oai_error err;
  assert_int_equal(pr_oai_parse_answer(raw, strlen(raw), &root, &err), 0);
  size_t n = pr_oai_answer_text_bytes(root, raw, strlen(raw), choices);
  cJSON_Delete(root);
  return n;
}

/* The text an answer gives the caller, in bytes: what its completion tokens are bounded by. */
static void test_answer_text_bytes(void **state) {
  (void)state;
  size_t choices = 99;
  /* a whole chat answer: content, reasoning, tool calls' names and arguments, two choices */
  assert_int_equal(text_bytes_of("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"h\u00e9llo\","
                                 "\"reasoning_content\":\"hmm\"}},{\"message\":{\"content\":null,\"tool_calls\":"
                                 "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"a\\\":1}\"}}]}}],"
                                 "\"usage\":{\"completion_tokens\":999}}", &choices),
                   6 + 3 + 3 + 7);
  assert_int_equal(choices, 2);
  /* a text completion, a stream's chunk, a chunk without choices (usage only) */
  assert_int_equal(text_bytes_of("{\"choices\":[{\"text\":\"abc\",\"index\":0}]}", &choices), 3);
  assert_int_equal(choices, 1);
  assert_int_equal(text_bytes_of("{\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}", &choices), 2);
  assert_int_equal(text_bytes_of("{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}", &choices), 0);
  assert_int_equal(choices, 1);
  assert_int_equal(text_bytes_of("{\"choices\":[],\"usage\":{\"completion_tokens\":5}}", &choices), 0);
  assert_int_equal(choices, 0);
  assert_int_equal(text_bytes_of("{\"usage\":{}}", NULL), 0);
  /* \u0000 ends cJSON's string early: it and what follows count, an escaped backslash
   * before "u0000" is no NUL */
  assert_int_equal(text_bytes_of("{\"choices\":[{\"message\":{\"content\":\"ab\\u0000cdef\\u0000\"}}]}", NULL), 8);
  assert_int_equal(text_bytes_of("{\"choices\":[{\"message\":{\"content\":\"a\\\\u0000\\u0000b\"}}]}", NULL), 9);
}

static void test_wants_logprobs(void **state) {
  (void)state;
  pr_oai_req *r = parse_ok(PR_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
  assert_int_equal(pr_oai_wants_logprobs(r), 0);
  pr_oai_free(r);
  free(r);
  r = parse_ok(PR_OAI_CHAT, "{\"model\":\"m\",\"logprobs\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
  assert_int_equal(pr_oai_wants_logprobs(r), 1);
  pr_oai_free(r);
  free(r);
  r = parse_ok(PR_OAI_COMPLETION, "{\"model\":\"m\",\"n_probs\":3,\"prompt\":\"x\"}");
  assert_int_equal(pr_oai_wants_logprobs(r), 1);
  pr_oai_free(r);
  free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_chat_stream_request),
    cmocka_unit_test(test_chat_defaults),
    cmocka_unit_test(test_chat_content_parts),
    cmocka_unit_test(test_render_chatml),
    cmocka_unit_test(test_completion_request),
    cmocka_unit_test(test_token_estimate_counts_characters),
    cmocka_unit_test(test_cap_precedence),
    cmocka_unit_test(test_set_max_tokens_adds),
    cmocka_unit_test(test_cache_off),
    cmocka_unit_test(test_set_max_tokens_rewrites_every_name),
    cmocka_unit_test(test_bad_requests),
    cmocka_unit_test(test_error_messages),
    cmocka_unit_test(test_render_roundtrip),
    cmocka_unit_test(test_fingerprints),
    cmocka_unit_test(test_fingerprint_limits),
    cmocka_unit_test(test_chat_fingerprints_share_system_prompt),
    cmocka_unit_test(test_error_body),
    cmocka_unit_test(test_error_from_parse),
    cmocka_unit_test(test_error_set),
    cmocka_unit_test(test_continuation),
    cmocka_unit_test(test_continuation_of_a_thinking_answer),
    cmocka_unit_test(test_answer_text_bytes),
    cmocka_unit_test(test_fleet_checks),
    cmocka_unit_test(test_continue_chunk),
    cmocka_unit_test(test_parse_answer_caps),
    cmocka_unit_test(test_wants_logprobs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
