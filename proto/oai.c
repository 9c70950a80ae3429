/* OpenAI request inspection: the gateway reads a body once to learn what it needs for
 * admission and scheduling (model, stream, token cap, prompt size and prefix
 * fingerprints), rejects malformed bodies itself, and answers in OpenAI's error shape. */
#include "oai.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "err.h"
#include "json.h"

#define OAI_MAX_DEPTH 64
/* The HTTP layer caps bodies well below this; it only bounds the rendered prompt. */
#define OAI_PROMPT_MAX ((size_t)64 << 20)
/* llama-server keeps n_predict in an int32. */
#define OAI_CAP_MAX INT32_MAX
/* cJSON spends about 64 bytes on each value: without a bound, 8 MiB of "[0,0,0,..."
 * would cost 256 MiB. Real requests (long chats, tool schemas) stay far below it. */
#define OAI_MAX_VALUES 100000

static const char T_INVALID[] = "invalid_request_error";

void pr_oai_error_set(pr_oai_error *err, int status, const char *type, const char *param,
                      const char *code, const char *fmt, ...) {
  if (!err) return;
  err->status = status;
  err->type = type;
  err->code = code;
  snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->message, sizeof(err->message), fmt, ap);
  va_end(ap);
}

static const char *type_name(const cJSON *it) {
  if (cJSON_IsNull(it)) return "null";
  if (cJSON_IsBool(it)) return "a boolean";
  if (cJSON_IsNumber(it)) return "a number";
  if (cJSON_IsString(it)) return "a string";
  if (cJSON_IsArray(it)) return "an array";
  if (cJSON_IsObject(it)) return "an object";
  return "an unknown type";
}

static int bad_type(pr_oai_error *err, const char *param, const char *want, const cJSON *got) {
  pr_oai_error_set(err, 400, T_INVALID, param, "invalid_type",
                   "Invalid type for '%s': expected %s, but got %s instead.", param, want,
                   type_name(got));
  return PR_ETYPE;
}

static int missing(pr_oai_error *err, const char *param) {
  pr_oai_error_set(err, 400, T_INVALID, param, "missing_required_parameter",
                   "Missing required parameter: '%s'.", param);
  return PR_EMISSING;
}

static int too_large(pr_oai_error *err, const char *param) {
  pr_oai_error_set(err, 400, T_INVALID, param, NULL, "The prompt is too large.");
  return PR_ETOOLARGE;
}

/* Validates while rendering so that a caller gets the precise path of a bad field;
 * err may be NULL (pr_oai_render_chatml). */
static int chatml(const cJSON *messages, pr_buf *out, pr_oai_error *err) {
  char path[64], ppath[64], fpath[64];
  if (!cJSON_IsArray(messages)) return bad_type(err, "messages", "an array", messages);
  if (!messages->child) {
    pr_oai_error_set(err, 400, T_INVALID, "messages", "empty_array",
                     "Invalid 'messages': empty array. Expected an array with minimum "
                     "length 1, but got an empty array instead.");
    return PR_EMISSING;
  }
  int i = 0, rc = 0;
  /* the paths name a bad field in the error; they are only written out for one */
#define MSG_PATH() pr_json_path_index(path, sizeof(path), "messages", i)
#define FIELD_PATH(key) (MSG_PATH(), pr_json_path_key(fpath, sizeof(fpath), path, key))
  for (const cJSON *m = messages->child; m; m = m->next, i++) {
    if (!cJSON_IsObject(m)) return MSG_PATH(), bad_type(err, path, "an object", m);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!role) return FIELD_PATH("role"), missing(err, fpath);
    if (!cJSON_IsString(role)) return FIELD_PATH("role"), bad_type(err, fpath, "a string", role);
    rc = pr_buf_append_str(out, "<|im_start|>");
    if (!rc) rc = pr_buf_append_str(out, role->valuestring);
    if (!rc) rc = pr_buf_append_str(out, "\n");
    if (rc) return too_large(err, "messages");
    /* An absent content is null: assistant turns with tool_calls may omit it. */
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(content)) {
      if (pr_buf_append_str(out, content->valuestring)) return too_large(err, "messages");
    } else if (cJSON_IsArray(content)) {
      FIELD_PATH("content");
      int j = 0, texts = 0;
      for (const cJSON *part = content->child; part; part = part->next, j++) {
        pr_json_path_index(ppath, sizeof(ppath), fpath, j);
        if (!cJSON_IsObject(part)) return bad_type(err, ppath, "an object", part);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        char tpath[64];
        pr_json_path_key(tpath, sizeof(tpath), ppath, "type");
        if (!type) return missing(err, tpath);
        if (!cJSON_IsString(type)) return bad_type(err, tpath, "a string", type);
        /* Images and audio do not count towards the text prompt. */
        if (strcmp(type->valuestring, "text") != 0) continue;
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        pr_json_path_key(tpath, sizeof(tpath), ppath, "text");
        if (!text) return missing(err, tpath);
        if (!cJSON_IsString(text)) return bad_type(err, tpath, "a string", text);
        /* llama.cpp joins the text parts of one message with newlines. */
        rc = texts++ ? pr_buf_append_str(out, "\n") : 0;
        if (!rc) rc = pr_buf_append_str(out, text->valuestring);
        if (rc) return too_large(err, "messages");
      }
    } else if (content && !cJSON_IsNull(content)) {
      return FIELD_PATH("content"),
             bad_type(err, fpath, "a string, an array of content parts or null", content);
    }
    if (pr_buf_append_str(out, "<|im_end|>\n")) return too_large(err, "messages");
  }
#undef FIELD_PATH
#undef MSG_PATH
  if (pr_buf_append_str(out, "<|im_start|>assistant\n")) return too_large(err, "messages");
  return 0;
}

int pr_oai_render_chatml(const cJSON *messages, pr_buf *out) {
  size_t old = out->len;
  int rc = chatml(messages, out, NULL);
  if (rc) {
    out->len = old;
    if (out->data) out->data[old] = '\0';
  }
  return rc;
}

/* Completion prompts: a string, or an array of strings joined with newlines (the
 * separator barely moves the estimate and keeps the first prompt's prefix intact). */
static int completion_prompt(const cJSON *prompt, pr_buf *out, pr_oai_error *err) {
  char path[64];
  if (!prompt || cJSON_IsNull(prompt)) return missing(err, "prompt");
  if (cJSON_IsString(prompt)) {
    return pr_buf_append_str(out, prompt->valuestring) ? too_large(err, "prompt") : 0;
  }
  if (!cJSON_IsArray(prompt))
    return bad_type(err, "prompt", "a string or an array of strings", prompt);
  if (!prompt->child) {
    pr_oai_error_set(err, 400, T_INVALID, "prompt", "empty_array",
                     "Invalid 'prompt': empty array. Expected a string or a non-empty "
                     "array of strings.");
    return PR_EMISSING;
  }
  int i = 0;
  for (const cJSON *p = prompt->child; p; p = p->next, i++) {
    pr_json_path_index(path, sizeof(path), "prompt", i);
    if (!cJSON_IsString(p)) return bad_type(err, path, "a string", p);
    int rc = i ? pr_buf_append_str(out, "\n") : 0;
    if (!rc) rc = pr_buf_append_str(out, p->valuestring);
    if (rc) return too_large(err, "prompt");
  }
  return 0;
}

static const struct {
  const char *name;
  pr_oai_cap_field field;
} cap_names[] = {
  /* In llama-server's order of precedence. */
  {"n_predict", PR_OAI_CAP_N_PREDICT},
  {"max_completion_tokens", PR_OAI_CAP_MAX_COMPLETION_TOKENS},
  {"max_tokens", PR_OAI_CAP_MAX_TOKENS},
};

/* n_predict = -1 is llama.cpp's explicit "no limit". It wins over the other names
 * upstream, so it also wins here: max_tokens = -1 and cap_field NONE, exactly as if no
 * cap had been given, and pr_oai_set_max_tokens rewrites it like any other name. */
static int parse_caps(pr_oai_req *r, pr_oai_error *err) {
  int found = 0;
  for (size_t i = 0; i < sizeof(cap_names) / sizeof(cap_names[0]); i++) {
    const char *name = cap_names[i].name;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r->root, name);
    /* Clients such as LangChain send null for "not set"; upstream reads it the same. */
    if (!it || cJSON_IsNull(it)) continue;
    double d = it->valuedouble;
    /* The range test comes first: it also refuses NaN and the infinity of 1e999. */
    if (!cJSON_IsNumber(it) || !(d >= -1e18 && d <= 1e18) || d != (double)(int64_t)d)
      return bad_type(err, name, "an integer", it);
    int64_t v = (int64_t)d;
    int is_np = cap_names[i].field == PR_OAI_CAP_N_PREDICT;
    if (is_np && v == -1) {
      found = 1;
      continue;
    }
    if (v < 1) {
      pr_oai_error_set(err, 400, T_INVALID, name, "integer_below_min_value",
                       "Invalid '%s': integer below minimum value. Expected a value >= 1%s, "
                       "but got %lld instead.", name, is_np ? " (or -1)" : "", (long long)v);
      return PR_ERANGE;
    }
    if (v > OAI_CAP_MAX) {
      pr_oai_error_set(err, 400, T_INVALID, name, "integer_above_max_value",
                       "Invalid '%s': integer above maximum value. Expected a value <= %d, "
                       "but got %lld instead.", name, OAI_CAP_MAX, (long long)v);
      return PR_ERANGE;
    }
    if (!found) {
      found = 1;
      r->max_tokens = v;
      r->cap_field = cap_names[i].field;
    }
  }
  return 0;
}

static int optional_bool(const cJSON *obj, const char *key, const char *param, int *out,
                         pr_oai_error *err) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!it || cJSON_IsNull(it)) return 0;
  if (!cJSON_IsBool(it)) return bad_type(err, param, "a boolean", it);
  *out = cJSON_IsTrue(it) ? 1 : 0;
  return 0;
}

/* "n": a whole number of choices; how many a phone serves at once is the gateway's to judge
 * (engine features): llama-server before December 2025 refuses more than one with a 500,
 * b10587 serves up to its slots, MNN ignores it. */
static int check_n(const cJSON *root, pr_oai_error *err, const char *name) {
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, name);
  if (!n || cJSON_IsNull(n)) return 0;
  double d = n->valuedouble;
  if (!cJSON_IsNumber(n) || !(d >= -1e18 && d <= 1e18) || d != (double)(int64_t)d)
    return bad_type(err, name, "an integer", n);
  if (d < 1) {
    pr_oai_error_set(err, 400, T_INVALID, name, "integer_below_min_value",
                     "Invalid '%s': integer below minimum value. Expected a value >= 1, but "
                     "got %lld instead.", name, (long long)d);
    return PR_ERANGE;
  }
  if (d > PR_OAI_MAX_CHOICES) {
    pr_oai_error_set(err, 400, T_INVALID, name, "integer_above_max_value",
                     "Invalid '%s': integer above maximum value. Expected a value <= %d, but "
                     "got %lld instead.", name, PR_OAI_MAX_CHOICES, (long long)d);
    return PR_ERANGE;
  }
  return 0;
}

/* The choices a body asks (1 when it asks none, or asks them wrongly). */
static int parse_choices(const cJSON *root) {
  const char *names[] = {"n", "n_cmpl"};
  for (size_t i = 0; i < 2; i++) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, names[i]);
    if (cJSON_IsNumber(n) && n->valuedouble >= 1 && n->valuedouble <= PR_OAI_MAX_CHOICES &&
        n->valuedouble == (double)(int)n->valuedouble)
      return (int)n->valuedouble;
  }
  return 1;
}

/* "tools": the shape OpenAI itself insists on (a list of {"type":"function","function":
 * {"name",...}}). What a phone's chat template further wants (llama-server's asks for a
 * description) is the phone's to say: its refusal reaches the caller as such. */
static int check_tools(const cJSON *root, pr_oai_error *err) {
  const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
  if (!tools || cJSON_IsNull(tools)) return 0;
  if (!cJSON_IsArray(tools)) return bad_type(err, "tools", "an array", tools);
  char path[64], fpath[64], npath[64];
  int i = 0;
  for (const cJSON *t = tools->child; t; t = t->next, i++) {
    pr_json_path_index(path, sizeof(path), "tools", i);
    if (!cJSON_IsObject(t)) return bad_type(err, path, "an object", t);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    pr_json_path_key(fpath, sizeof(fpath), path, "type");
    if (!type) return missing(err, fpath);
    if (!cJSON_IsString(type)) return bad_type(err, fpath, "a string", type);
    if (strcmp(type->valuestring, "function") != 0) {
      pr_oai_error_set(err, 400, T_INVALID, fpath, "invalid_value",
                       "Invalid value: '%.64s'. Supported values are: 'function'.",
                       type->valuestring);
      return -EINVAL;
    }
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    pr_json_path_key(fpath, sizeof(fpath), path, "function");
    if (!fn) return missing(err, fpath);
    if (!cJSON_IsObject(fn)) return bad_type(err, fpath, "an object", fn);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    pr_json_path_key(npath, sizeof(npath), fpath, "name");
    if (!name) return missing(err, npath);
    if (!cJSON_IsString(name)) return bad_type(err, npath, "a string", name);
    if (!name->valuestring[0]) {
      pr_oai_error_set(err, 400, T_INVALID, npath, "empty_string",
                       "Invalid '%s': empty string. Expected a string with minimum length 1.",
                       npath);
      return -EINVAL;
    }
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
    pr_json_path_key(npath, sizeof(npath), fpath, "description");
    if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
      return bad_type(err, npath, "a string", desc);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    pr_json_path_key(npath, sizeof(npath), fpath, "parameters");
    if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
      return bad_type(err, npath, "an object", params);
  }
  return 0;
}

int pr_oai_check_fleet(const pr_oai_req *r, pr_oai_error *err) {
  /* and the keys the gateway sets for a phone (the cache's), which cJSON would read as the
   * first and llama-server as the last */
  static const char *const keys[] = {"n", "n_cmpl", "tools", "cache_prompt", "id_slot", "slot_id"};
  for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
    int n = 0;
    for (const cJSON *it = r->root->child; it; it = it->next)
      if (it->string && strcmp(it->string, keys[k]) == 0) n++;
    if (n > 1) {
      pr_oai_error_set(err, 400, T_INVALID, keys[k], "duplicate_key",
                       "Invalid request: the key '%s' appears more than once.", keys[k]);
      return PR_EPARSE;
    }
  }
  int rc = check_n(r->root, err, "n");
  if (!rc) rc = check_n(r->root, err, "n_cmpl"); /* llama-server's own name for it */
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(r->root, "n"), *nc = cJSON_GetObjectItemCaseSensitive(r->root, "n_cmpl");
  if (!rc && cJSON_IsNumber(n) && cJSON_IsNumber(nc) && n->valuedouble != nc->valuedouble) {
    /* one name for the gateway, the other for the engine: one count */
    pr_oai_error_set(err, 400, T_INVALID, "n_cmpl", "conflicting_value",
                     "Invalid request: 'n' and 'n_cmpl' ask different numbers of choices.");
    rc = PR_ERANGE;
  }
  return rc ? rc : check_tools(r->root, err);
}

/* cJSON answers the first of duplicate keys, llama-server's parser the last; a body
 * with two "max_tokens" would let a client pass one cap to us and another upstream. */
static int check_duplicates(const cJSON *root, pr_oai_error *err) {
  static const char *const keys[] = {"model", "messages", "prompt", "stream",
                                     "stream_options", "max_tokens",
                                     "max_completion_tokens", "n_predict", NULL};
  for (const char *const *k = keys; *k; k++) {
    int n = 0;
    for (const cJSON *it = root->child; it; it = it->next)
      if (it->string && strcmp(it->string, *k) == 0) n++;
    if (n > 1) {
      pr_oai_error_set(err, 400, T_INVALID, *k, "duplicate_key",
                       "Invalid request: the key '%s' appears more than once.", *k);
      return PR_EPARSE;
    }
  }
  return 0;
}

/* Tokenizers work on text, so the estimate counts characters (UTF-8 code points). */
static int64_t estimate_tokens(const pr_buf *prompt) {
  int64_t chars = 0;
  size_t i = 0;
  /* eight bytes at a time: count every byte, less the continuation bytes (10xxxxxx:
   * bit 7 set and bit 6, shifted up onto bit 7, clear) */
  for (; i + 8 <= prompt->len; i += 8) {
    uint64_t v;
    memcpy(&v, prompt->data + i, 8);
    chars += 8 - __builtin_popcountll(v & ~(v << 1) & 0x8080808080808080ull);
  }
  for (; i < prompt->len; i++)
    if (((unsigned char)prompt->data[i] & 0xC0) != 0x80) chars++;
  int64_t t = (chars + 3) / 4;
  return t < 1 ? 1 : t;
}

/* SHA-256 of text[0 .. len) as 64 bits (0 is kept for "none"). */
static int digest64(const char *text, size_t len, uint64_t *out) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (EVP_Digest(text, len, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen < 8) return -ENOMEM;
  uint64_t v = 0;
  for (int k = 0; k < 8; k++) v = (v << 8) | md[k];
  *out = v ? v : 1;
  return 0;
}

/* Where a hybrid engine keeps a checkpoint that the next request of a conversation or a
 * shared system prompt can use (gateway/pcache.h): the start of the last user turn, and
 * the whole prompt (its checkpoint 4 tokens before the end serves the same prompt again). */
static int fingerprint_turns(pr_oai_req *r) {
  r->user_at = -1;
  r->user_fp = r->full_fp = 0;
  if (!r->prompt.len) return 0;
  if (digest64(r->prompt.data, r->prompt.len, &r->full_fp)) return -ENOMEM;
  if (r->kind != PR_OAI_CHAT) return 0;
  static const char tag[] = "<|im_start|>user";
  const char *last = NULL;
  for (const char *at = r->prompt.data; (at = strstr(at, tag)); at += sizeof(tag) - 1) last = at;
  if (!last || last == r->prompt.data) return 0;
  size_t off = (size_t)(last - r->prompt.data);
  int64_t chars = 0;
  for (size_t i = 0; i < off; i++)
    if (((unsigned char)r->prompt.data[i] & 0xC0) != 0x80) chars++;
  r->user_at = chars / 4;
  return digest64(r->prompt.data, off, &r->user_fp);
}

/* Blocks are cut by bytes, not characters: they only have to be cut the same way for
 * every request, and a block may end inside a UTF-8 sequence without harm. */
static int fingerprint(pr_oai_req *r) {
  size_t nb = r->prompt.len / PR_OAI_BLOCK_CHARS;
  if (nb > PR_OAI_MAX_BLOCKS) nb = PR_OAI_MAX_BLOCKS;
  r->n_blocks = 0;
  if (!nb) return 0;
  int rc = -ENOMEM;
  free(r->blocks);
  r->blocks = malloc(nb * sizeof(*r->blocks));
  /* the contexts are kept from one request to the next (one loop, one at a time) */
  static EVP_MD_CTX *ctx, *tmp;
  if (!ctx) ctx = EVP_MD_CTX_new();
  if (!tmp) tmp = EVP_MD_CTX_new();
  if (!r->blocks || !ctx || !tmp || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) goto out;
  for (size_t i = 0; i < nb; i++) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_DigestUpdate(ctx, r->prompt.data + i * PR_OAI_BLOCK_CHARS, PR_OAI_BLOCK_CHARS) != 1 ||
        EVP_MD_CTX_copy_ex(tmp, ctx) != 1 || EVP_DigestFinal_ex(tmp, md, &mdlen) != 1 ||
        mdlen < 8)
      goto out;
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v = (v << 8) | md[k];
    r->blocks[i] = v;
  }
  r->n_blocks = nb;
  rc = 0;
out:
  return rc;
}

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0], lo = 0x80, hi = 0xBF;
  size_t len;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if (c == 0xED) len = 3, hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) len = 3;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c == 0xF4) len = 4, hi = 0x8F;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else return 0;
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; i++)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return len;
}

/* What cJSON lets through but a phone's parser refuses (so the request must not reach
 * it): bytes that are not UTF-8 (RFC 8259 8.1), raw control characters in strings, and
 * more than OAI_MAX_VALUES values. One pass before cJSON sees the text. */
static int check_text(const char *body, size_t len, pr_oai_error *err) {
  const unsigned char *s = (const unsigned char *)body;
  size_t values = 1;
  int in_str = 0, line, col;
  for (size_t i = 0; i < len; i++) {
    /* most of a request is plain ASCII inside strings: pass it quickly */
    if (in_str) {
      while (i + 8 <= len && pr_json_plain8(s + i)) i += 8;
      while (i < len && s[i] >= 0x20 && s[i] < 0x80 && s[i] != '"' && s[i] != '\\') i++;
    }
    if (i >= len) break;
    unsigned char c = s[i];
    const char *why = NULL;
    if (c >= 0x80) {
      size_t k = utf8_seq(s + i, len - i);
      if (k) {
        i += k - 1;
        continue;
      }
      why = "the body is not valid UTF-8";
    } else if (in_str) {
      if (c < 0x20) why = "a control character must be escaped in a string";
      else if (c == '\\' && i + 1 < len && s[i + 1] < 0x80) i++;
      else if (c == '"') in_str = 0;
    } else if (c == '"') {
      in_str = 1;
    } else if ((c == ',' || c == '[' || c == '{') && ++values > OAI_MAX_VALUES) {
      pr_oai_error_set(err, 400, T_INVALID, NULL, "invalid_json",
                       "The JSON body holds more than %d values.", OAI_MAX_VALUES);
      return PR_ETOOLARGE;
    }
    if (why) {
      pr_json_position(body, len, i, &line, &col);
      pr_oai_error_set(err, 400, T_INVALID, NULL, "invalid_json",
                       "We could not parse the JSON body of your request: %s at line %d, "
                       "column %d.", why, line, col);
      return PR_EPARSE;
    }
  }
  return 0;
}

static int parse_body(pr_oai_req *r, pr_oai_kind kind, const char *body, size_t len,
                      pr_oai_error *err) {
  pr_json_err jerr;
  int rc = check_text(body, len, err);
  if (rc) return rc;
  r->root = pr_json_parse(body, len, OAI_MAX_DEPTH, &jerr);
  if (!r->root) {
    pr_oai_error_set(err, 400, T_INVALID, NULL, "invalid_json",
                     "We could not parse the JSON body of your request: %s at line %d, "
                     "column %d.", jerr.msg, jerr.line, jerr.col);
    return PR_EPARSE;
  }
  if (!cJSON_IsObject(r->root)) {
    pr_oai_error_set(err, 400, T_INVALID, NULL, "invalid_json",
                     "The request body must be a JSON object, but got %s.",
                     type_name(r->root));
    return PR_ETYPE;
  }
  rc = check_duplicates(r->root, err);
  if (rc) return rc;

  const cJSON *model = cJSON_GetObjectItemCaseSensitive(r->root, "model");
  if (!model || cJSON_IsNull(model) || (cJSON_IsString(model) && !model->valuestring[0])) {
    pr_oai_error_set(err, 400, T_INVALID, "model", NULL,
                     "you must provide a model parameter");
    return PR_EMISSING;
  }
  if (!cJSON_IsString(model)) return bad_type(err, "model", "a string", model);
  r->model = model->valuestring;

  if (kind == PR_OAI_CHAT) {
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(r->root, "messages");
    if (!messages || cJSON_IsNull(messages)) return missing(err, "messages");
    rc = chatml(messages, &r->prompt, err);
  } else {
    rc = completion_prompt(cJSON_GetObjectItemCaseSensitive(r->root, "prompt"), &r->prompt,
                           err);
  }
  if (rc) return rc;

  if ((rc = optional_bool(r->root, "stream", "stream", &r->stream, err))) return rc;
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(r->root, "stream_options");
  if (so && !cJSON_IsNull(so)) {
    if (!cJSON_IsObject(so)) return bad_type(err, "stream_options", "an object", so);
    rc = optional_bool(so, "include_usage", "stream_options.include_usage", &r->include_usage,
                       err);
    if (rc) return rc;
  }
  if ((rc = parse_caps(r, err))) return rc;
  r->choices = parse_choices(r->root);
  r->cache_off = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(r->root, "cache_prompt"));

  r->prompt_tokens = estimate_tokens(&r->prompt);
  if ((rc = fingerprint(r)) || (rc = fingerprint_turns(r))) {
    pr_oai_error_set(err, 500, "server_error", NULL, NULL, "Out of memory.");
    return rc;
  }
  return 0;
}

int pr_oai_wants_logprobs(const pr_oai_req *r) {
  static const char *const keys[] = {"logprobs", "top_logprobs", "n_probs"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    const cJSON *v = r->root ? cJSON_GetObjectItemCaseSensitive(r->root, keys[i]) : NULL;
    if (cJSON_IsTrue(v) || (cJSON_IsNumber(v) && v->valuedouble > 0)) return 1;
  }
  return 0;
}

int pr_oai_parse_answer(const char *text, size_t len, cJSON **out, pr_oai_error *err) {
  *out = NULL;
  int rc = check_text(text, len, err);
  if (rc) return rc;
  pr_json_err jerr;
  *out = pr_json_parse(text, len, OAI_MAX_DEPTH, &jerr);
  if (!*out) {
    pr_oai_error_set(err, 502, "server_error", NULL, "invalid_json", "%s at line %d, column %d",
                     jerr.msg, jerr.line, jerr.col);
    return PR_EPARSE;
  }
  return 0;
}

int pr_oai_parse(pr_oai_req *r, pr_oai_kind kind, const char *body, size_t len,
                 pr_oai_error *err) {
  memset(r, 0, sizeof(*r));
  r->kind = kind;
  r->max_tokens = -1;
  r->cap_field = PR_OAI_CAP_NONE;
  r->body_len = len;
  pr_buf_init(&r->prompt, OAI_PROMPT_MAX);
  int rc = parse_body(r, kind, body, len, err);
  /* A failed parse leaves nothing behind; pr_oai_free stays safe to call. */
  if (rc) pr_oai_free(r);
  return rc;
}

void pr_oai_free(pr_oai_req *r) {
  cJSON_Delete(r->root);
  r->root = NULL;
  cJSON_Delete(r->cache_orig);
  r->cache_orig = NULL;
  r->cache_seen = 0;
  r->model = NULL;
  pr_buf_free(&r->prompt);
  free(r->blocks);
  r->blocks = NULL;
  r->n_blocks = 0;
}

void pr_oai_drop_prompt(pr_oai_req *r) { pr_buf_free(&r->prompt); }

/* Replaces every occurrence of `name` (there is at most one after pr_oai_parse, but
 * the tree may have been edited since) with `v`; adds it when absent and `add`.
 * Returns 1 when the name is now present, 0 when not, or a negative code. */
static int set_number(cJSON *root, const char *name, int64_t v, int add) {
  int present = 0;
  for (cJSON *it = root->child, *next; it; it = next) {
    next = it->next;
    if (!it->string || strcmp(it->string, name) != 0) continue;
    if (present) cJSON_Delete(cJSON_DetachItemViaPointer(root, it));
    present = 1;
  }
  if (present) {
    cJSON *num = cJSON_CreateNumber((double)v);
    if (!num) return -ENOMEM;
    if (!cJSON_ReplaceItemInObjectCaseSensitive(root, name, num)) {
      cJSON_Delete(num);
      return -ENOMEM;
    }
  } else if (add) {
    if (!cJSON_AddNumberToObject(root, name, (double)v)) return -ENOMEM;
    present = 1;
  }
  return present;
}

int pr_oai_set_max_tokens(pr_oai_req *r, int64_t cap) {
  if (!r->root || !cJSON_IsObject(r->root) || cap < 1 || cap > OAI_CAP_MAX) return -EINVAL;
  /* Every name the client used gets the same value, so whichever one upstream
   * honours, it reads `cap`. cap_field becomes the strongest name now present. */
  pr_oai_cap_field field = PR_OAI_CAP_MAX_TOKENS;
  for (size_t i = sizeof(cap_names) / sizeof(cap_names[0]); i-- > 0;) {
    int add = cap_names[i].field == PR_OAI_CAP_MAX_TOKENS;
    int rc = set_number(r->root, cap_names[i].name, cap, add);
    if (rc < 0) return rc;
    if (rc > 0) field = cap_names[i].field;
  }
  r->max_tokens = cap;
  r->cap_field = field;
  return 0;
}

int pr_oai_render(const pr_oai_req *r, pr_buf *out) {
  if (!r->root) return -EINVAL;
  /* rendered, the body is about as long as it came: print it in place */
  pr_buf_reserve(out, r->body_len + r->body_len / 8 + 256);
  return pr_json_append(out, r->root);
}

int pr_oai_set_cache(pr_oai_req *r, int reuse, int id_slot) {
  cJSON *root = r->root;
  if (!cJSON_IsObject(root)) return -EINVAL;
  if (!r->cache_seen) {
    /* the client's own cache_prompt, kept to put back for a phone that may reuse */
    const cJSON *cp = cJSON_GetObjectItemCaseSensitive(root, "cache_prompt");
    r->cache_seen = 1;
    if (cp && !(r->cache_orig = cJSON_Duplicate(cp, 1))) return -ENOMEM;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(root, "cache_prompt");
  cJSON_DeleteItemFromObjectCaseSensitive(root, "id_slot");
  cJSON_DeleteItemFromObjectCaseSensitive(root, "slot_id"); /* older llama.cpp's name */
  if (!reuse) {
    if (!cJSON_AddFalseToObject(root, "cache_prompt")) return -ENOMEM;
  } else if (r->cache_orig) {
    cJSON *c = cJSON_Duplicate(r->cache_orig, 1);
    if (!c || !cJSON_AddItemToObject(root, "cache_prompt", c)) {
      cJSON_Delete(c);
      return -ENOMEM;
    }
  }
  if (id_slot >= 0 && !cJSON_AddNumberToObject(root, "id_slot", id_slot)) return -ENOMEM;
  return 0;
}

size_t pr_oai_common_blocks(const uint64_t *a, size_t na, const uint64_t *b, size_t nb) {
  size_t n = na < nb ? na : nb, i = 0;
  /* eight at a time while they agree (memcmp compares them wide: a planning pass compares
   * a prompt's blocks with thousands of phones' caches), then one by one */
  while (i + 8 <= n && memcmp(a + i, b + i, 8 * sizeof(*a)) == 0) i += 8;
  while (i < n && a[i] == b[i]) i++;
  return i;
}

static cJSON *str_or_null(const char *s) {
  return s && *s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

int pr_oai_error_body(pr_buf *out, const char *message, const char *type, const char *param,
                      const char *code) {
  int rc = -ENOMEM;
  cJSON *root = cJSON_CreateObject();
  cJSON *e = cJSON_AddObjectToObject(root, "error");
  if (!e) goto out;
  /* OpenAI's SDKs read all four keys; each is always present, null when unknown. */
  if (!cJSON_AddItemToObject(e, "message", cJSON_CreateString(message ? message : "")) ||
      !cJSON_AddItemToObject(e, "type", str_or_null(type)) ||
      !cJSON_AddItemToObject(e, "param", str_or_null(param)) ||
      !cJSON_AddItemToObject(e, "code", str_or_null(code)))
    goto out;
  char *s = cJSON_PrintUnformatted(root);
  if (!s) goto out;
  rc = pr_buf_append_str(out, s);
  cJSON_free(s);
out:
  cJSON_Delete(root);
  return rc;
}

int pr_oai_render_continuation(const pr_oai_req *r, const char *sofar, const char *reasoning,
                               pr_oai_cont_mode mode, int64_t left, pr_buf *out) {
  cJSON *root = cJSON_Duplicate(r->root, 1);
  if (!root) return -ENOMEM;
  if (left < 1) left = 1;
  for (size_t i = 0; i < sizeof(cap_names) / sizeof(cap_names[0]); i++)
    if (cJSON_GetObjectItemCaseSensitive(root, cap_names[i].name))
      cJSON_ReplaceItemInObjectCaseSensitive(root, cap_names[i].name, cJSON_CreateNumber((double)left));
  if (!cJSON_GetObjectItemCaseSensitive(root, "max_tokens"))
    cJSON_AddNumberToObject(root, "max_tokens", (double)left);
  cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
  cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
  int rc = 0;
  if (cJSON_IsArray(msgs)) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", "assistant") ||
        !cJSON_AddStringToObject(m, "content", sofar) ||
        (mode == PR_OAI_CONT_FINAL && reasoning && reasoning[0] &&
         !cJSON_AddStringToObject(m, "reasoning_content", reasoning)) ||
        !cJSON_AddItemToArray(msgs, m)) {
      cJSON_Delete(m);
      rc = -ENOMEM;
    }
    if (!rc && mode == PR_OAI_CONT_FINAL) {
      /* the client's own values (it may have sent either) give way */
      cJSON_DeleteItemFromObjectCaseSensitive(root, "continue_final_message");
      cJSON_DeleteItemFromObjectCaseSensitive(root, "add_generation_prompt");
      if (!cJSON_AddTrueToObject(root, "continue_final_message") ||
          !cJSON_AddFalseToObject(root, "add_generation_prompt"))
        rc = -ENOMEM;
    }
  } else if (cJSON_IsString(prompt)) {
    pr_buf p;
    pr_buf_init(&p, OAI_PROMPT_MAX);
    rc = pr_buf_append_str(&p, prompt->valuestring) || pr_buf_append_str(&p, sofar) ? PR_ETOOLARGE : 0;
    if (!rc) cJSON_ReplaceItemInObjectCaseSensitive(root, "prompt", cJSON_CreateString(pr_buf_cstr(&p)));
    pr_buf_free(&p);
  }
  if (!rc) rc = pr_json_append(out, root);
  cJSON_Delete(root);
  return rc;
}

int pr_oai_continue_chunk(cJSON *chunk, const char *stream_id, int64_t tokens_before) {
  const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
  const cJSON *c0 = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
  cJSON *delta = c0 ? cJSON_GetObjectItemCaseSensitive(c0, "delta") : NULL;
  if (delta && cJSON_GetObjectItemCaseSensitive(delta, "role")) {
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(delta, "content");
    int text = (cJSON_IsString(content) && content->valuestring[0]) || pr_oai_chunk_reasoning(chunk);
    if (!text && !pr_oai_chunk_has_tool_calls(chunk)) return 1;
    cJSON_DeleteItemFromObjectCaseSensitive(delta, "role");
  }
  if (stream_id && stream_id[0])
    cJSON_ReplaceItemInObjectCaseSensitive(chunk, "id", cJSON_CreateString(stream_id));
  cJSON *u = cJSON_GetObjectItemCaseSensitive(chunk, "usage");
  if (cJSON_IsObject(u)) {
    cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    cJSON *tt = cJSON_GetObjectItemCaseSensitive(u, "total_tokens");
    if (cJSON_IsNumber(ct)) cJSON_SetNumberValue(ct, ct->valuedouble + (double)tokens_before);
    if (cJSON_IsNumber(tt)) cJSON_SetNumberValue(tt, tt->valuedouble + (double)tokens_before);
  }
  return 0;
}

int pr_oai_chunk_has_tool_calls(const cJSON *chunk) {
  const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
  const cJSON *c0 = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
  const cJSON *delta = c0 ? cJSON_GetObjectItemCaseSensitive(c0, "delta") : NULL;
  const cJSON *tc = delta ? cJSON_GetObjectItemCaseSensitive(delta, "tool_calls") : NULL;
  return cJSON_IsArray(tc) && tc->child != NULL;
}

static size_t string_bytes(const cJSON *o, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
  return cJSON_IsString(v) ? strlen(v->valuestring) : 0;
}

static size_t text_bytes(const cJSON *answer, size_t *choices);

size_t pr_oai_answer_text_bytes(const cJSON *answer, const char *raw, size_t raw_len, size_t *choices) {
  static const char nul[] = "\\u0000";
  if (!raw || !memmem(raw, raw_len, nul, sizeof(nul) - 1)) return text_bytes(answer, choices);
  /* measured on a copy whose NUL escapes stand for U+0001 (one byte as well): cJSON's
   * strings end at a NUL; every backslash outside an escape's second character starts
   * one (backslashes are valid JSON only inside strings) */
  char *copy = malloc(raw_len);
  if (!copy) return text_bytes(answer, choices);
  memcpy(copy, raw, raw_len);
  for (size_t i = 0; i + 1 < raw_len; i++) {
    if (copy[i] != '\\') continue;
    if (copy[i + 1] == 'u' && i + 5 < raw_len && memcmp(copy + i + 2, "0000", 4) == 0) copy[i + 5] = '1';
    i++;
  }
  cJSON *again = cJSON_ParseWithLength(copy, raw_len);
  free(copy);
  size_t n = text_bytes(again ? again : answer, choices);
  cJSON_Delete(again);
  return n;
}

static size_t text_bytes(const cJSON *answer, size_t *choices) {
  static const char *const fields[] = {"content", "reasoning_content", "reasoning", "refusal"};
  const cJSON *cs = cJSON_GetObjectItemCaseSensitive(answer, "choices");
  size_t bytes = 0, n = 0;
  const cJSON *c;
  if (cJSON_IsArray(cs)) {
    cJSON_ArrayForEach(c, cs) {
      if (!cJSON_IsObject(c)) continue;
      n++;
      bytes += string_bytes(c, "text");
      const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, "message");
      if (!cJSON_IsObject(m)) m = cJSON_GetObjectItemCaseSensitive(c, "delta");
      if (!cJSON_IsObject(m)) continue;
      for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) bytes += string_bytes(m, fields[i]);
      const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), *tc;
      if (!cJSON_IsArray(tcs)) continue;
      cJSON_ArrayForEach(tc, tcs) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
        if (cJSON_IsObject(f)) bytes += string_bytes(f, "name") + string_bytes(f, "arguments");
      }
    }
  }
  if (choices) *choices = n;
  return bytes;
}

const char *pr_oai_chunk_text(const cJSON *chunk) {
  const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
  const cJSON *c0 = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
  if (!c0) return NULL;
  const cJSON *delta = cJSON_GetObjectItemCaseSensitive(c0, "delta");
  const cJSON *text = delta ? cJSON_GetObjectItemCaseSensitive(delta, "content")
                            : cJSON_GetObjectItemCaseSensitive(c0, "text");
  return cJSON_IsString(text) && text->valuestring[0] ? text->valuestring : NULL;
}

const char *pr_oai_chunk_reasoning(const cJSON *chunk) {
  const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
  const cJSON *c0 = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
  const cJSON *delta = c0 ? cJSON_GetObjectItemCaseSensitive(c0, "delta") : NULL;
  if (!delta) return NULL;
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(delta, "reasoning_content");
  if (!cJSON_IsString(text)) text = cJSON_GetObjectItemCaseSensitive(delta, "reasoning");
  return cJSON_IsString(text) && text->valuestring[0] ? text->valuestring : NULL;
}
