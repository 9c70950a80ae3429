/* llama-server's wire shapes, key for key and type for type as captured in
 * tests/system/fixtures/. See llsrv.h. */
#include "llsrv.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "err.h"

/* Sampling parameters as llama-server reports them in /props and /slots. Kept as text
 * so that floats stay floats ("dynatemp_range":0.0), which cJSON would print as
 * integers. Three holes: max_tokens, n_predict, stream. */
static const char ag_llsrv_params_fmt[] =
  "{\"seed\":4294967295,\"temperature\":0.800000011920929,\"dynatemp_range\":0.0,"
  "\"dynatemp_exponent\":1.0,\"top_k\":40,\"top_p\":0.949999988079071,"
  "\"min_p\":0.05000000074505806,\"top_n_sigma\":-1.0,\"xtc_probability\":0.0,"
  "\"xtc_threshold\":0.10000000149011612,\"typical_p\":1.0,\"repeat_last_n\":64,"
  "\"repeat_penalty\":1.0,\"presence_penalty\":0.0,\"frequency_penalty\":0.0,"
  "\"dry_multiplier\":0.0,\"dry_base\":1.75,\"dry_allowed_length\":2,"
  "\"dry_penalty_last_n\":64,\"mirostat\":0,\"mirostat_tau\":5.0,"
  "\"mirostat_eta\":0.10000000149011612,\"adaptive_target\":-1.0,"
  "\"adaptive_decay\":0.8999999761581421,\"max_tokens\":%" PRId64 ",\"n_predict\":%" PRId64 ","
  "\"n_keep\":0,\"n_discard\":0,\"ignore_eos\":false,\"stream\":%s,\"n_probs\":0,"
  "\"min_keep\":0,\"chat_format\":\"Content-only\",\"reasoning_format\":\"none\","
  "\"reasoning_in_content\":false,\"generation_prompt\":\"\","
  "\"samplers\":[\"penalties\",\"dry\",\"top_n_sigma\",\"top_k\",\"typ_p\",\"top_p\","
  "\"min_p\",\"xtc\",\"temperature\"],\"speculative.types\":\"none\","
  "\"timings_per_token\":false,\"post_sampling_probs\":false,\"backend_sampling\":false,"
  "\"lora\":[]}";

/* The February 2025 build's sampling parameters (/props, /slots). Holes: n_predict,
 * dry_penalty_last_n (the whole context), max_tokens, stream. */
static const char ag_llsrv_params25_fmt[] =
  "{\"n_predict\":%" PRId64 ",\"seed\":4294967295,\"temperature\":0.800000011920929,"
  "\"dynatemp_range\":0.0,\"dynatemp_exponent\":1.0,\"top_k\":40,\"top_p\":0.949999988079071,"
  "\"min_p\":0.05000000074505806,\"xtc_probability\":0.0,\"xtc_threshold\":0.10000000149011612,"
  "\"typical_p\":1.0,\"repeat_last_n\":64,\"repeat_penalty\":1.0,\"presence_penalty\":0.0,"
  "\"frequency_penalty\":0.0,\"dry_multiplier\":0.0,\"dry_base\":1.75,\"dry_allowed_length\":2,"
  "\"dry_penalty_last_n\":%" PRId64 ",\"dry_sequence_breakers\":[\"\\n\",\":\",\"\\\"\",\"*\"],"
  "\"mirostat\":0,\"mirostat_tau\":5.0,\"mirostat_eta\":0.10000000149011612,\"stop\":[],"
  "\"max_tokens\":%" PRId64 ",\"n_keep\":0,\"n_discard\":0,\"ignore_eos\":false,\"stream\":%s,"
  "\"logit_bias\":[],\"n_probs\":0,\"min_keep\":0,\"grammar\":\"\",\"grammar_trigger_words\":[],"
  "\"grammar_trigger_tokens\":[],\"preserved_tokens\":[],\"chat_format\":\"Content-only\","
  "\"samplers\":[\"penalties\",\"dry\",\"top_k\",\"typ_p\",\"top_p\",\"min_p\",\"xtc\",\"temperature\"],"
  "\"speculative.n_max\":16,\"speculative.n_min\":0,\"speculative.p_min\":0.75,"
  "\"timings_per_token\":false,\"post_sampling_probs\":false,\"lora\":[]}";

/* The ChatML template the sim renders prompts with (proto/oai.c), as /props names it. */
static const char ag_llsrv_template[] =
  "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content"
  " + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- "
  "'<|im_start|>assistant\n' -}}\n{%- endif -%}";

/* The constant tail of /props after build_info's neighbours; appended verbatim. */
static const char ag_llsrv_props_mid[] =
  "\"model_ftype\":\"all F32\",";
static const char ag_llsrv_props_tail[] =
  "\"modalities\":{\"vision\":false,\"video\":false,\"audio\":false},"
  "\"media_marker\":\"<__media_fleetgateSimMediaMarker0000000__>\","
  "\"endpoint_slots\":true,\"endpoint_props\":false,\"endpoint_metrics\":true,"
  "\"ui\":true,\"ui_settings\":{},"
  "\"chat_template\":\"{%- for message in messages -%}\\n  {{- '<|im_start|>' + message.role"
  " + '\\n' + message.content + '<|im_end|>\\n' -}}\\n{%- endfor -%}\\n{%- if"
  " add_generation_prompt -%}\\n  {{- '<|im_start|>assistant\\n' -}}\\n{%- endif -%}\","
  "\"chat_template_caps\":{\"supports_object_arguments\":false,"
  "\"supports_parallel_tool_calls\":false,\"supports_preserve_reasoning\":false,"
  "\"supports_reasoning_effort\":false,\"supports_string_content\":true,\"supports_system_role\":true,"
  "\"supports_tool_calls\":true,\"supports_tools\":true,\"supports_typed_content\":false},"
  "\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",";

/* Serialise item into out and free it (also on failure). */
static int llsrv_emit(pr_buf *out, cJSON *item) {
  if (!item) return -ENOMEM;
  char *s = cJSON_PrintUnformatted(item);
  cJSON_Delete(item);
  if (!s) return -ENOMEM;
  int rc = pr_buf_append_str(out, s);
  free(s);
  return rc;
}

/* A JSON string literal for s (quotes included) appended to out. */
static int llsrv_append_jstr(pr_buf *out, const char *s) {
  return llsrv_emit(out, cJSON_CreateString(s ? s : ""));
}

/* Numbers that llama-server prints as floats must stay floats: cJSON would print 2.0
 * as "2". Non-finite values become null, as nlohmann::json prints them. */
static void llsrv_add_float(cJSON *obj, const char *key, double v) {
  char txt[64];
  if (!isfinite(v)) {
    cJSON_AddNullToObject(obj, key);
    return;
  }
  /* the shortest text that reads back as v, as nlohmann::json writes doubles */
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(txt, sizeof(txt), "%.*g", prec, v);
    if (strtod(txt, NULL) == v) break;
  }
  if (!strpbrk(txt, ".eEn")) strncat(txt, ".0", sizeof(txt) - strlen(txt) - 1);
  cJSON_AddRawToObject(obj, key, txt);
}

static void llsrv_add_int(cJSON *obj, const char *key, int64_t v) {
  cJSON_AddNumberToObject(obj, key, (double)v);
}

int ag_llsrv_error(pr_buf *out, int code, const char *type, const char *message) {
  cJSON *root = cJSON_CreateObject();
  cJSON *e = cJSON_AddObjectToObject(root, "error");
  if (!e) {
    cJSON_Delete(root);
    return -ENOMEM;
  }
  llsrv_add_int(e, "code", code);
  cJSON_AddStringToObject(e, "message", message);
  cJSON_AddStringToObject(e, "type", type);
  return llsrv_emit(out, root);
}

int ag_llsrv_error_context(pr_buf *out, int64_t n_prompt_tokens, int64_t n_ctx) {
  char msg[160];
  snprintf(msg, sizeof(msg),
           "request (%" PRId64 " tokens) exceeds the available context size (%" PRId64
           " tokens), try increasing it",
           n_prompt_tokens, n_ctx);
  cJSON *root = cJSON_CreateObject();
  cJSON *e = cJSON_AddObjectToObject(root, "error");
  if (!e) {
    cJSON_Delete(root);
    return -ENOMEM;
  }
  llsrv_add_int(e, "code", 400);
  cJSON_AddStringToObject(e, "message", msg);
  cJSON_AddStringToObject(e, "type", AG_LLSRV_E_CONTEXT);
  llsrv_add_int(e, "n_prompt_tokens", n_prompt_tokens);
  llsrv_add_int(e, "n_ctx", n_ctx);
  return llsrv_emit(out, root);
}

static int llsrv_r26(const ag_llsrv_answer *a) { return a->release != AG_LLSRV_2025; }

/* usage: the 2025 build has no prompt_tokens_details. */
static void llsrv_add_usage(cJSON *obj, const ag_llsrv_timings *t, int r26) {
  cJSON *u = cJSON_AddObjectToObject(obj, "usage");
  if (!u) return;
  int64_t prompt_tokens = t->cache_n + t->prompt_n;
  llsrv_add_int(u, "completion_tokens", t->predicted_n);
  llsrv_add_int(u, "prompt_tokens", prompt_tokens);
  llsrv_add_int(u, "total_tokens", prompt_tokens + t->predicted_n);
  if (!r26) return;
  cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
  if (d) llsrv_add_int(d, "cached_tokens", t->cache_n);
}

/* timings: the 2025 build has no cache_n. */
static void llsrv_add_timings(cJSON *obj, const ag_llsrv_timings *t, int r26) {
  ag_llsrv_add_timings(obj, t, r26 ? AG_LLSRV_2026 : AG_LLSRV_2025);
}

void ag_llsrv_add_timings(cJSON *obj, const ag_llsrv_timings *t, int release) {
  int r26 = release != AG_LLSRV_2025;
  cJSON *o = cJSON_AddObjectToObject(obj, "timings");
  if (!o) return;
  if (r26) llsrv_add_int(o, "cache_n", t->cache_n);
  llsrv_add_int(o, "prompt_n", t->prompt_n);
  llsrv_add_float(o, "prompt_ms", t->prompt_ms);
  llsrv_add_float(o, "prompt_per_token_ms", t->prompt_ms / (double)t->prompt_n);
  llsrv_add_float(o, "prompt_per_second", 1e3 / t->prompt_ms * (double)t->prompt_n);
  llsrv_add_int(o, "predicted_n", t->predicted_n);
  llsrv_add_float(o, "predicted_ms", t->predicted_ms);
  llsrv_add_float(o, "predicted_per_token_ms", t->predicted_ms / (double)t->predicted_n);
  llsrv_add_float(o, "predicted_per_second", 1e3 / t->predicted_ms * (double)t->predicted_n);
}

/* created, id, model, system_fingerprint, object: the order of stream chunks. */
static void llsrv_add_chunk_ids(cJSON *root, const ag_llsrv_answer *a) {
  llsrv_add_int(root, "created", a->created);
  cJSON_AddStringToObject(root, "id", a->id);
  cJSON_AddStringToObject(root, "model", a->model);
  cJSON_AddStringToObject(root, "system_fingerprint", a->fingerprint);
  cJSON_AddStringToObject(root, "object", a->chat ? "chat.completion.chunk" : "text_completion");
}

/* "logprobs": {"content": [entries]}, or null when there are none (text completions
 * always carry the key; chat choices only with logprobs). */
static int llsrv_add_logprobs(cJSON *choice, const char *entries, int null_if_none) {
  if (!entries) return null_if_none && !cJSON_AddNullToObject(choice, "logprobs") ? -ENOMEM : 0;
  size_t n = strlen(entries);
  char *raw = malloc(n + 16);
  if (!raw) return -ENOMEM;
  snprintf(raw, n + 16, "{\"content\":[%s]}", entries);
  int ok = cJSON_AddRawToObject(choice, "logprobs", raw) != NULL;
  free(raw);
  return ok ? 0 : -ENOMEM;
}

/* delta.tool_calls of a stream chunk: the call's start, or a piece of its arguments. */
static void llsrv_add_tool_delta(cJSON *delta, const ag_llsrv_answer *a, int start, const char *args) {
  cJSON *calls = cJSON_AddArrayToObject(delta, "tool_calls");
  cJSON *tc = cJSON_CreateObject();
  if (!calls || !tc) {
    cJSON_Delete(tc);
    return;
  }
  cJSON_AddItemToArray(calls, tc);
  llsrv_add_int(tc, "index", 0);
  if (start) {
    cJSON_AddStringToObject(tc, "id", a->tool_id ? a->tool_id : "");
    cJSON_AddStringToObject(tc, "type", "function");
  }
  cJSON *fn = cJSON_AddObjectToObject(tc, "function");
  if (start) cJSON_AddStringToObject(fn, "name", a->tool_name ? a->tool_name : "");
  cJSON_AddStringToObject(fn, "arguments", args ? args : "");
}

int ag_llsrv_chunk(pr_buf *out, const ag_llsrv_answer *a, ag_llsrv_chunk_kind kind,
                   const char *text, const char *finish, const ag_llsrv_timings *t,
                   const char *logprobs) {
  cJSON *root = cJSON_CreateObject();
  cJSON *choices = cJSON_AddArrayToObject(root, "choices");
  if (!choices) {
    cJSON_Delete(root);
    return -ENOMEM;
  }
  int rc = 0, r26 = llsrv_r26(a);
  int tokens = kind == AG_LLSRV_CHUNK_TEXT || kind == AG_LLSRV_CHUNK_TOOL_ARGS;
  if (kind != AG_LLSRV_CHUNK_USAGE) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    if (!a->chat) {
      /* text_completion choices: text, index, logprobs, finish_reason. */
      cJSON_AddStringToObject(c, "text", kind == AG_LLSRV_CHUNK_TEXT && text ? text : "");
      llsrv_add_int(c, "index", a->index);
      rc = llsrv_add_logprobs(c, tokens ? logprobs : NULL, 1);
    }
    if (kind == AG_LLSRV_CHUNK_FINISH)
      cJSON_AddStringToObject(c, "finish_reason", finish);
    else
      cJSON_AddNullToObject(c, "finish_reason");
    if (a->chat) {
      llsrv_add_int(c, "index", a->index);
      cJSON *delta = cJSON_AddObjectToObject(c, "delta");
      if (kind == AG_LLSRV_CHUNK_ROLE) {
        cJSON_AddStringToObject(delta, "role", "assistant");
        cJSON_AddNullToObject(delta, "content");
      } else if (kind == AG_LLSRV_CHUNK_TEXT) {
        cJSON_AddStringToObject(delta, a->reasoning ? "reasoning_content" : "content", text ? text : "");
      } else if (kind == AG_LLSRV_CHUNK_TOOL_START || kind == AG_LLSRV_CHUNK_TOOL_ARGS) {
        llsrv_add_tool_delta(delta, a, kind == AG_LLSRV_CHUNK_TOOL_START, text);
      }
      if (rc == 0 && tokens) rc = llsrv_add_logprobs(c, logprobs, 0);
    }
  }
  if (a->chat) {
    llsrv_add_chunk_ids(root, a);
    /* the 2025 build puts usage on the finish chunk; 2026 on a chunk of its own */
    if (t && (kind == AG_LLSRV_CHUNK_USAGE || (kind == AG_LLSRV_CHUNK_FINISH && !r26))) llsrv_add_usage(root, t, r26);
    if (t && (kind == AG_LLSRV_CHUNK_USAGE || kind == AG_LLSRV_CHUNK_FINISH)) llsrv_add_timings(root, t, r26);
  } else {
    /* text completions: created, model, system_fingerprint, object, [usage], id, [timings] */
    llsrv_add_int(root, "created", a->created);
    cJSON_AddStringToObject(root, "model", a->model);
    cJSON_AddStringToObject(root, "system_fingerprint", a->fingerprint);
    cJSON_AddStringToObject(root, "object", "text_completion");
    if (t && kind == AG_LLSRV_CHUNK_FINISH) llsrv_add_usage(root, t, r26);
    cJSON_AddStringToObject(root, "id", a->id);
    if (t && kind == AG_LLSRV_CHUNK_FINISH) llsrv_add_timings(root, t, r26);
  }
  if (rc < 0) {
    cJSON_Delete(root);
    return rc;
  }
  return llsrv_emit(out, root);
}

/* message of a whole chat answer: its text (or reasoning, content ""), or (content null)
 * the tool call. */
static void llsrv_add_message(cJSON *c, const ag_llsrv_answer *a, const char *text, const char *tool_id) {
  cJSON *m = cJSON_AddObjectToObject(c, "message");
  cJSON_AddStringToObject(m, "role", "assistant");
  if (!a->tool_name) {
    cJSON_AddStringToObject(m, "content", a->reasoning ? "" : text);
    if (a->reasoning) cJSON_AddStringToObject(m, "reasoning_content", text);
    return;
  }
  /* llama-server's order: type, function, id */
  cJSON_AddNullToObject(m, "content");
  cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
  cJSON *tc = cJSON_CreateObject();
  if (!calls || !tc) {
    cJSON_Delete(tc);
    return;
  }
  cJSON_AddItemToArray(calls, tc);
  cJSON_AddStringToObject(tc, "type", "function");
  cJSON *fn = cJSON_AddObjectToObject(tc, "function");
  cJSON_AddStringToObject(fn, "name", a->tool_name);
  cJSON_AddStringToObject(fn, "arguments", text);
  cJSON_AddStringToObject(tc, "id", tool_id ? tool_id : "");
}

int ag_llsrv_answer_body(pr_buf *out, const ag_llsrv_answer *a, const ag_llsrv_choice *ch,
                         size_t n, const ag_llsrv_timings *t) {
  cJSON *root = cJSON_CreateObject();
  cJSON *choices = cJSON_AddArrayToObject(root, "choices");
  if (!choices) {
    cJSON_Delete(root);
    return -ENOMEM;
  }
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    cJSON *c = cJSON_CreateObject();
    /* cJSON strings are NUL-terminated: copy the text out of its buffer. */
    char *s = malloc(ch[i].len + 1);
    if (!c || !s) {
      cJSON_Delete(c);
      free(s);
      rc = -ENOMEM;
      break;
    }
    cJSON_AddItemToArray(choices, c);
    if (ch[i].len) memcpy(s, ch[i].text, ch[i].len);
    s[ch[i].len] = '\0';
    if (a->chat) {
      cJSON_AddStringToObject(c, "finish_reason", ch[i].finish);
      llsrv_add_int(c, "index", (int64_t)i);
      llsrv_add_message(c, a, s, ch[i].tool_id);
      rc = llsrv_add_logprobs(c, ch[i].logprobs, 0);
    } else {
      cJSON_AddStringToObject(c, "text", s);
      llsrv_add_int(c, "index", (int64_t)i);
      rc = llsrv_add_logprobs(c, ch[i].logprobs, 1);
      cJSON_AddStringToObject(c, "finish_reason", ch[i].finish);
    }
    free(s);
  }
  if (rc < 0) {
    cJSON_Delete(root);
    return rc;
  }
  llsrv_add_int(root, "created", a->created);
  cJSON_AddStringToObject(root, "model", a->model);
  cJSON_AddStringToObject(root, "system_fingerprint", a->fingerprint);
  cJSON_AddStringToObject(root, "object", a->chat ? "chat.completion" : "text_completion");
  llsrv_add_usage(root, t, llsrv_r26(a));
  cJSON_AddStringToObject(root, "id", a->id);
  llsrv_add_timings(root, t, llsrv_r26(a));
  return llsrv_emit(out, root);
}

static int llsrv_params(pr_buf *out, int64_t n_predict, int stream) {
  return pr_buf_appendf(out, ag_llsrv_params_fmt, n_predict, n_predict, stream ? "true" : "false");
}

/* One 2025 slot as /slots and /props show it: id, id_task, n_ctx, speculative,
 * is_processing, non_causal, params, prompt, next_token. */
static int llsrv_slot25(pr_buf *out, int id, int64_t id_task, int64_t n_ctx, int64_t ctx_total, int processing,
                        int64_t n_predict, int stream, int64_t n_decoded, int has_next) {
  int64_t n_remain = n_predict < 0 ? -1 : n_predict - n_decoded;
  return pr_buf_appendf(out, "{\"id\":%d,\"id_task\":%" PRId64 ",\"n_ctx\":%" PRId64 ",\"speculative\":false,"
                        "\"is_processing\":%s,\"non_causal\":false,\"params\":", id, id_task, n_ctx,
                        processing ? "true" : "false") < 0 ||
                 pr_buf_appendf(out, ag_llsrv_params25_fmt, n_predict, ctx_total, n_predict,
                                stream ? "true" : "false") < 0 ||
                 pr_buf_appendf(out, ",\"prompt\":\"\",\"next_token\":{\"has_next_token\":%s,\"has_new_line\":false,"
                                "\"n_remain\":%" PRId64 ",\"n_decoded\":%" PRId64 ",\"stopping_word\":\"\"}}",
                                has_next ? "true" : "false", n_remain, n_decoded) < 0
             ? -ENOMEM
             : 0;
}

int ag_llsrv_props(pr_buf *out, int release, const char *model, int64_t n_ctx, int total_slots,
                   const char *build_info) {
  int rc = 0;
  if (release == AG_LLSRV_2025) {
    /* default_generation_settings is a whole idle slot; no alias, caps or modalities */
    if ((rc = pr_buf_append_str(out, "{\"default_generation_settings\":")) < 0 ||
        (rc = llsrv_slot25(out, 0, -1, n_ctx, n_ctx * total_slots, 0, -1, 1, 0, 1)) < 0 ||
        (rc = pr_buf_appendf(out, ",\"total_slots\":%d,\"model_path\":", total_slots)) < 0 ||
        (rc = llsrv_append_jstr(out, model)) < 0 ||
        (rc = pr_buf_append_str(out, ",\"chat_template\":")) < 0 ||
        (rc = llsrv_append_jstr(out, ag_llsrv_template)) < 0 ||
        (rc = pr_buf_append_str(out, ",\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"build_info\":")) < 0 ||
        (rc = llsrv_append_jstr(out, build_info)) < 0)
      return rc;
    return pr_buf_append_str(out, "}");
  }
  if ((rc = pr_buf_append_str(out, "{\"default_generation_settings\":{\"params\":")) < 0 ||
      (rc = llsrv_params(out, -1, 0)) < 0 ||
      (rc = pr_buf_appendf(out, ",\"n_ctx\":%" PRId64 "},\"total_slots\":%d,\"model_alias\":",
                           n_ctx, total_slots)) < 0 ||
      (rc = llsrv_append_jstr(out, model)) < 0 ||
      (rc = pr_buf_append_str(out, ",")) < 0 ||
      (rc = pr_buf_append_str(out, ag_llsrv_props_mid)) < 0 ||
      (rc = pr_buf_append_str(out, "\"model_path\":")) < 0 ||
      (rc = llsrv_append_jstr(out, model)) < 0 ||
      (rc = pr_buf_append_str(out, ",")) < 0 ||
      (rc = pr_buf_append_str(out, ag_llsrv_props_tail)) < 0 ||
      (rc = pr_buf_append_str(out, "\"build_info\":")) < 0 ||
      (rc = llsrv_append_jstr(out, build_info)) < 0 ||
      (rc = pr_buf_append_str(out, ",\"is_sleeping\":false,\"cors_proxy_enabled\":false}")) < 0)
    return rc;
  return 0;
}

int ag_llsrv_models(pr_buf *out, int release, const char *model, int64_t n_ctx, int64_t created) {
  cJSON *root = cJSON_CreateObject();
  if (release == AG_LLSRV_2025) {
    /* the 2025 build: "data" only, and no n_ctx in meta */
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *d = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), d);
    cJSON_AddStringToObject(d, "id", model);
    cJSON_AddStringToObject(d, "object", "model");
    llsrv_add_int(d, "created", created);
    cJSON_AddStringToObject(d, "owned_by", "llamacpp");
    cJSON *meta = cJSON_AddObjectToObject(d, "meta");
    llsrv_add_int(meta, "vocab_type", 1);
    llsrv_add_int(meta, "n_vocab", 32000);
    llsrv_add_int(meta, "n_ctx_train", n_ctx > 4096 ? n_ctx : 4096);
    llsrv_add_int(meta, "n_embd", 64);
    llsrv_add_int(meta, "n_params", 4178240);
    llsrv_add_int(meta, "size", 16712960);
    return llsrv_emit(out, root);
  }
  cJSON *models = cJSON_AddArrayToObject(root, "models");
  cJSON *m = cJSON_CreateObject();
  if (!models || !m) {
    cJSON_Delete(m);
    cJSON_Delete(root);
    return -ENOMEM;
  }
  cJSON_AddItemToArray(models, m);
  cJSON_AddStringToObject(m, "name", model);
  cJSON_AddStringToObject(m, "model", model);
  cJSON_AddStringToObject(m, "modified_at", "");
  cJSON_AddStringToObject(m, "size", "");
  cJSON_AddStringToObject(m, "digest", "");
  cJSON_AddStringToObject(m, "type", "model");
  cJSON_AddStringToObject(m, "description", "");
  cJSON *tags = cJSON_AddArrayToObject(m, "tags");
  cJSON_AddItemToArray(tags, cJSON_CreateString(""));
  cJSON *caps = cJSON_AddArrayToObject(m, "capabilities");
  cJSON_AddItemToArray(caps, cJSON_CreateString("completion"));
  cJSON_AddStringToObject(m, "parameters", "");
  cJSON *det = cJSON_AddObjectToObject(m, "details");
  cJSON_AddStringToObject(det, "parent_model", "");
  cJSON_AddStringToObject(det, "format", "gguf");
  cJSON_AddStringToObject(det, "family", "");
  cJSON *fams = cJSON_AddArrayToObject(det, "families");
  cJSON_AddItemToArray(fams, cJSON_CreateString(""));
  cJSON_AddStringToObject(det, "parameter_size", "");
  cJSON_AddStringToObject(det, "quantization_level", "");

  cJSON_AddStringToObject(root, "object", "list");
  cJSON *data = cJSON_AddArrayToObject(root, "data");
  cJSON *d = cJSON_CreateObject();
  cJSON_AddItemToArray(data, d);
  cJSON_AddStringToObject(d, "id", model);
  cJSON *aliases = cJSON_AddArrayToObject(d, "aliases");
  cJSON_AddItemToArray(aliases, cJSON_CreateString(model));
  cJSON_AddArrayToObject(d, "tags");
  cJSON_AddStringToObject(d, "object", "model");
  llsrv_add_int(d, "created", created);
  cJSON_AddStringToObject(d, "owned_by", "llamacpp");
  cJSON *meta = cJSON_AddObjectToObject(d, "meta");
  cJSON_AddTrueToObject(meta, "vocab_type"); /* b10587 writes it as a boolean */
  llsrv_add_int(meta, "n_vocab", 32000);
  llsrv_add_int(meta, "n_ctx", n_ctx);
  llsrv_add_int(meta, "n_ctx_train", n_ctx > 4096 ? n_ctx : 4096);
  llsrv_add_int(meta, "n_embd", 64);
  llsrv_add_int(meta, "n_params", 4178240);
  llsrv_add_int(meta, "size", 16712960);
  cJSON_AddStringToObject(meta, "ftype", "all F32");
  return llsrv_emit(out, root);
}

int ag_llsrv_slots(pr_buf *out, int release, const ag_llsrv_slot *slots, size_t n) {
  int rc = pr_buf_append_str(out, "[");
  for (size_t i = 0; rc == 0 && release == AG_LLSRV_2025 && i < n; i++) {
    const ag_llsrv_slot *s = &slots[i];
    if (i) rc = pr_buf_append_str(out, ",");
    if (rc == 0)
      rc = llsrv_slot25(out, s->id, s->has_task ? s->id_task : -1, s->n_ctx, s->n_ctx * (int64_t)n,
                        s->is_processing, s->has_task ? s->n_predict : -1, s->has_task ? s->stream : 1,
                        s->n_decoded, !s->has_task || s->is_processing);
  }
  for (size_t i = 0; rc == 0 && release != AG_LLSRV_2025 && i < n; i++) {
    const ag_llsrv_slot *s = &slots[i];
    rc = pr_buf_appendf(out, "%s{\"id\":%d,\"n_ctx\":%" PRId64 ",\"speculative\":false,"
                        "\"is_processing\":%s", i ? "," : "", s->id, s->n_ctx,
                        s->is_processing ? "true" : "false");
    if (rc == 0 && s->has_task) {
      int64_t n_remain = s->n_predict < 0 ? -1 : s->n_predict - s->n_decoded;
      if ((rc = pr_buf_appendf(out, ",\"id_task\":%" PRId64 ",\"n_prompt_tokens\":%" PRId64
                               ",\"n_prompt_tokens_processed\":%" PRId64
                               ",\"n_prompt_tokens_cache\":%" PRId64 ",\"params\":",
                               s->id_task, s->n_prompt_tokens, s->n_prompt_tokens_processed,
                               s->n_prompt_tokens_cache)) < 0 ||
          (rc = llsrv_params(out, s->n_predict, s->stream)) < 0)
        break;
      rc = pr_buf_appendf(out, ",\"next_token\":[{\"has_next_token\":%s,\"has_new_line\":false,"
                          "\"n_remain\":%" PRId64 ",\"n_decoded\":%" PRId64 "}]",
                          s->is_processing ? "true" : "false", n_remain, s->n_decoded);
    }
    if (rc == 0) rc = pr_buf_append_str(out, "}");
  }
  if (rc == 0) rc = pr_buf_append_str(out, "]");
  return rc;
}

/* One metric with its HELP and TYPE lines. */
static int llsrv_metric(pr_buf *out, const char *name, const char *help, const char *type,
                        double v) {
  return pr_buf_appendf(out, "# HELP llamacpp:%s %s\n# TYPE llamacpp:%s %s\nllamacpp:%s %.10g\n",
                        name, help, name, type, name, v);
}

int ag_llsrv_metrics_text(pr_buf *out, const ag_llsrv_metrics *m) {
  double prompt_tps = m->prompt_seconds_total > 0
                          ? (double)m->prompt_tokens_total / m->prompt_seconds_total : 0.0;
  double predicted_tps = m->tokens_predicted_seconds_total > 0
                             ? (double)m->tokens_predicted_total / m->tokens_predicted_seconds_total
                             : 0.0;
  double busy_per_decode = m->n_decode_total
                               ? (double)m->n_busy_slots_total / (double)m->n_decode_total : 0.0;
  typedef struct {
    const char *name, *help, *type;
    double v;
  } row;
  const row prompt = {"prompt_tokens_total", "Number of prompt tokens processed.", "counter",
                      (double)m->prompt_tokens_total};
  const row cached = {"prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", "counter",
                      (double)m->prompt_tokens_cached_total};
  const row prompt_s = {"prompt_seconds_total", "Prompt process time", "counter", m->prompt_seconds_total};
  const row predicted = {"tokens_predicted_total", "Number of generation tokens processed.", "counter",
                         (double)m->tokens_predicted_total};
  const row predicted_s = {"tokens_predicted_seconds_total", "Predict process time", "counter",
                           m->tokens_predicted_seconds_total};
  const row decode = {"n_decode_total", "Total number of llama_decode() calls", "counter", (double)m->n_decode_total};
  const row tok_max = {"n_tokens_max", "Largest observed n_tokens.", "counter", (double)m->n_tokens_max};
  const row drafts = {"spec_decode_num_draft_tokens_total", "Total draft tokens generated", "counter", 0};
  const row accepted = {"spec_decode_num_accepted_tokens_total",
                        "Total draft tokens accepted by the target model", "counter", 0};
  const row steps = {"spec_decode_num_drafts_total", "Total speculative decoding verification steps", "counter", 0};
  const row prompt_tps_row = {"prompt_tokens_seconds", "Average prompt throughput in tokens/s.", "gauge", prompt_tps};
  const row predicted_tps_row = {"predicted_tokens_seconds", "Average generation throughput in tokens/s.", "gauge",
                                 predicted_tps};
  const row processing = {"requests_processing", "Number of requests processing.", "gauge",
                          (double)m->requests_processing};
  const row deferred = {"requests_deferred", "Number of requests deferred.", "gauge", (double)m->requests_deferred};
  const row busy = {"n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
                    m->release == AG_LLSRV_2025 ? "counter" : "gauge", busy_per_decode};
  const row kv_ratio = {"kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", "gauge", 0};
  const row kv_tokens = {"kv_cache_tokens", "KV-cache tokens.", "gauge", (double)m->kv_cache_tokens};
  const row r26[] = {prompt, cached, prompt_s, predicted, predicted_s, decode, tok_max, drafts, accepted, steps,
                     prompt_tps_row, predicted_tps_row, processing, deferred, busy};
  const row r25[] = {prompt, prompt_s, predicted, predicted_s, decode, busy, prompt_tps_row, predicted_tps_row,
                     kv_ratio, kv_tokens, processing, deferred};
  const row *rows = m->release == AG_LLSRV_2025 ? r25 : r26;
  size_t n = m->release == AG_LLSRV_2025 ? sizeof(r25) / sizeof(r25[0]) : sizeof(r26) / sizeof(r26[0]);
  for (size_t i = 0; i < n; i++) {
    int rc = llsrv_metric(out, rows[i].name, rows[i].help, rows[i].type, rows[i].v);
    if (rc < 0) return rc;
  }
  return 0;
}
