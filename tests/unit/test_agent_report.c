/* Unit tests for the agent's pure pieces: rates (agent/report.c), the status and
 * heartbeat documents, the heartbeat signature (agent/hb.c, checked against an
 * independent HMAC), the back-off, the settings parsers (agent/conf.c) and the
 * thread-count choice (agent/engine.c). Device readings: test_agent_device.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>
#include <openssl/hmac.h>

#include <errno.h>

#include "conf.h"
#include "device.h"
#include "engine.h"
#include "err.h"
#include "hb.h"
#include "report.h"

static void test_rates(void **state) {
  (void)state;
  ag_rates r;
  ag_rates_init(&r);
  assert_string_equal(ag_rates_source(&r), "none");
  ag_rates_seed(&r, 500, 50);
  assert_string_equal(ag_rates_source(&r), "configured");
  assert_true(r.prefill_tps == 500);
  ag_rates_observe(&r, 100, 1000, 20, 2000); /* 100 tok/s, 10 tok/s: replaces the seeds */
  assert_string_equal(ag_rates_source(&r), "measured");
  assert_true(r.prefill_tps == 100 && r.decode_tps == 10);
  ag_rates_observe(&r, 200, 1000, 0, 0);     /* decode side absent: unchanged */
  assert_true(r.prefill_tps > 100 && r.prefill_tps < 200 && r.decode_tps == 10);
  ag_rates_observe(&r, 1, 1, 5, 0);          /* a 1-token prefill and 0 ms: ignored */
  assert_int_equal(r.prefill_samples, 2);
  assert_int_equal(r.decode_samples, 1);
}

static void write_file(const char *path, const char *text) {
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(text, fp);
  fclose(fp);
}

static void test_documents(void **state) {
  (void)state;
  ag_report r;
  memset(&r, 0, sizeof(r));
  r.id = "pixel-07";
  r.engine = "llama";
  r.engine_state = "ready";
  r.slots = 100; /* clamped to 64 for the heartbeat */
  r.busy = 3;
  r.n_ctx = 8192;
  ag_rates_init(&r.rates);
  ag_device_read(&r.device, "/nonexistent");
  r.uptime_s = 12.7;
  pr_buf b;
  pr_buf_init(&b, 1 << 16);
  assert_int_equal(ag_report_heartbeat_json(&r, "https://x.acu.run", NULL, &b), PR_EMISSING); /* no model */
  r.models[0] = "qwen";
  r.n_models = 1;
  assert_int_equal(ag_report_heartbeat_json(&r, "https://x.acu.run", NULL, &b), 0);
  cJSON *o = cJSON_Parse(b.data);
  static const char *const allowed[] = {"id", "url", "models", "slots", "busy", "n_ctx", "prefill_tps",
                                        "decode_tps", "state", "device", "version", "uptime_s", NULL};
  for (const cJSON *k = o->child; k; k = k->next) {
    int ok = 0;
    for (size_t i = 0; allowed[i]; i++) ok |= strcmp(k->string, allowed[i]) == 0;
    assert_true(ok);
  }
  assert_int_equal(cJSON_GetObjectItem(o, "slots")->valueint, 64);
  assert_null(cJSON_GetObjectItem(o, "prefill_tps")); /* unknown rates are left out */
  assert_string_equal(cJSON_GetObjectItem(o, "state")->valuestring, "ready");
  assert_int_equal(cJSON_GetObjectItem(o, "uptime_s")->valueint, 12);
  cJSON_Delete(o);
  r.draining = 1;
  assert_string_equal(ag_report_hb_state(&r), "draining");
  r.draining = 0;
  r.engine_state = "down";
  assert_string_equal(ag_report_hb_state(&r), "loading");
  pr_buf_reset(&b);
  assert_int_equal(ag_report_status_json(&r, &b), 0);
  o = cJSON_Parse(b.data);
  assert_string_equal(cJSON_GetObjectItem(o, "engine_state")->valuestring, "down");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "prefill_tps")));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "device"), "battery_pct")));
  cJSON_Delete(o);
  pr_buf_free(&b);
}

/* What the phone holds: the status lists every model file (a digest still being worked
 * out is null), the heartbeat only checked ones (name and digest), the model being loaded,
 * memory and storage; a phone that cannot hold its model reports without a url. */
static void test_held_and_unfit(void **state) {
  (void)state;
  ag_report r;
  memset(&r, 0, sizeof(r));
  r.id = "pixel-07";
  r.engine = "llama";
  r.engine_state = "loading";
  r.slots = 1;
  r.models[0] = "qwen3.5-9b";
  r.n_models = 1;
  ag_rates_init(&r.rates);
  ag_device_unknown(&r.device);
  r.device.mem_total_mb = 11264;
  pr_buf b;
  pr_buf_init(&b, 1 << 16);
  /* no models folder: nothing said of it */
  assert_int_equal(ag_report_heartbeat_json(&r, "https://x.acu.run", NULL, &b), 0);
  cJSON *o = cJSON_Parse(b.data);
  assert_null(cJSON_GetObjectItem(o, "held"));
  assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "device"), "storage_free_mb"));
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "device"), "mem_total_mb")->valueint, 11264);
  cJSON_Delete(o);

  r.models_dir = "/data/models";
  r.storage_free_mb = 40211;
  r.held_known = 1;
  r.n_held = 2;
  snprintf(r.held[0].name, sizeof(r.held[0].name), "qwen3.5-0.8b");
  snprintf(r.held[0].file, sizeof(r.held[0].file), "qwen3.5-0.8b.gguf");
  r.held[0].bytes = 600000000;
  memset(r.held[0].sha256, 'a', 64);
  snprintf(r.held[1].name, sizeof(r.held[1].name), "qwen3.5-9b");
  snprintf(r.held[1].file, sizeof(r.held[1].file), "qwen3.5-9b.gguf");
  r.held[1].bytes = 5680000000;
  r.loading_model = "qwen3.5-9b";
  r.loading_file = "qwen3.5-9b.gguf";
  pr_buf_reset(&b);
  assert_int_equal(ag_report_heartbeat_json(&r, "https://x.acu.run", NULL, &b), 0);
  o = cJSON_Parse(b.data);
  const cJSON *held = cJSON_GetObjectItem(o, "held");
  assert_int_equal(cJSON_GetArraySize(held), 1); /* the 9B's digest is not known yet */
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(held, 0), "name")->valuestring, "qwen3.5-0.8b");
  assert_int_equal(strlen(cJSON_GetObjectItem(cJSON_GetArrayItem(held, 0), "sha256")->valuestring), 64);
  assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(held, 0), "bytes")); /* kept small */
  assert_string_equal(cJSON_GetObjectItem(o, "loading")->valuestring, "qwen3.5-9b");
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "device"), "storage_free_mb")->valueint, 40211);
  cJSON_Delete(o);
  pr_buf_reset(&b);
  assert_int_equal(ag_report_status_json(&r, &b), 0);
  o = cJSON_Parse(b.data);
  held = cJSON_GetObjectItem(o, "held");
  assert_int_equal(cJSON_GetArraySize(held), 2);
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(held, 1), "sha256")));
  assert_true(cJSON_GetObjectItem(cJSON_GetArrayItem(held, 1), "bytes")->valuedouble == 5680000000.0);
  assert_string_equal(cJSON_GetObjectItem(o, "models_dir")->valuestring, "/data/models");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "loading"), "file")->valuestring, "qwen3.5-9b.gguf");
  cJSON_Delete(o);
  /* a name the gateway would not take is not said */
  r.loading_model = "a name that is much too long to be a model's name, longer than sixty-four";
  pr_buf_reset(&b);
  assert_int_equal(ag_report_heartbeat_json(&r, "https://x.acu.run", NULL, &b), 0);
  o = cJSON_Parse(b.data);
  assert_null(cJSON_GetObjectItem(o, "loading"));
  cJSON_Delete(o);

  /* a switch of models (placement): said with its phase, and why only when it failed */
  r.loading_model = NULL;
  r.can_switch = 1;
  r.switch_to = "qwen3.5-0.8b";
  r.switch_phase = "fetching";
  r.switch_why = NULL;
  pr_buf_reset(&b);
  assert_int_equal(ag_report_heartbeat_json(&r, "https://x.acu.run", NULL, &b), 0);
  o = cJSON_Parse(b.data);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "can_switch")));
  const cJSON *sw = cJSON_GetObjectItem(o, "switch");
  assert_string_equal(cJSON_GetObjectItem(sw, "to")->valuestring, "qwen3.5-0.8b");
  assert_string_equal(cJSON_GetObjectItem(sw, "phase")->valuestring, "fetching");
  assert_null(cJSON_GetObjectItem(sw, "why"));
  cJSON_Delete(o);
  r.switch_phase = "failed";
  r.switch_why = "the download failed:\tsha256 mismatch";
  pr_buf_reset(&b);
  assert_int_equal(ag_report_heartbeat_json(&r, "https://x.acu.run", NULL, &b), 0);
  o = cJSON_Parse(b.data);
  sw = cJSON_GetObjectItem(o, "switch");
  assert_string_equal(cJSON_GetObjectItem(sw, "why")->valuestring, "the download failed:?sha256 mismatch");
  cJSON_Delete(o);
  pr_buf_reset(&b);
  assert_int_equal(ag_report_status_json(&r, &b), 0);
  o = cJSON_Parse(b.data);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "switch"), "phase")->valuestring, "failed");
  cJSON_Delete(o);
  r.switch_to = r.switch_phase = r.switch_why = NULL;
  r.can_switch = 0;

  /* no url: only for an unfit report, which says why in visible ASCII */
  pr_buf_reset(&b);
  assert_int_equal(ag_report_heartbeat_json(&r, NULL, NULL, &b), -EINVAL);
  r.unfit = "cannot hold qwen3.5-9b:\tit needs 7013 MiB";
  pr_buf_reset(&b);
  assert_int_equal(ag_report_heartbeat_json(&r, NULL, "k", &b), 0);
  o = cJSON_Parse(b.data);
  assert_null(cJSON_GetObjectItem(o, "url"));
  assert_string_equal(cJSON_GetObjectItem(o, "state")->valuestring, "unfit");
  assert_string_equal(cJSON_GetObjectItem(o, "unfit")->valuestring, "cannot hold qwen3.5-9b:?it needs 7013 MiB");
  cJSON_Delete(o);
  pr_buf_free(&b);
}

static void test_signature(void **state) {
  (void)state;
  const char *secret = "fleet-secret-0123456789", *ts = "1795976416000", *body = "{\"id\":\"p\"}";
  char sig[AG_HB_SIG_LEN + 1];
  assert_int_equal(ag_hb_sign(secret, ts, body, strlen(body), sig), 0);
  /* the same with the legacy HMAC API over "ts.body" */
  char msg[128];
  snprintf(msg, sizeof(msg), "%s.%s", ts, body);
  unsigned char mac[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret, (int)strlen(secret), (const unsigned char *)msg, strlen(msg), mac, &len);
  char want[AG_HB_SIG_LEN + 1] = "sha256=";
  for (unsigned i = 0; i < 32; i++) snprintf(want + 7 + 2 * i, 3, "%02x", mac[i]);
  assert_string_equal(sig, want);
}

static void test_backoff(void **state) {
  (void)state;
  assert_int_equal(ag_hb_backoff_ms(0), 0);
  assert_int_equal(ag_hb_backoff_ms(1), 1000);
  assert_int_equal(ag_hb_backoff_ms(2), 2000);
  assert_int_equal(ag_hb_backoff_ms(5), 16000);
  assert_int_equal(ag_hb_backoff_ms(6), 30000);
  assert_int_equal(ag_hb_backoff_ms(1000), 30000);
}

static void test_conf_split_and_threads(void **state) {
  (void)state;
  ag_conf c;
  ag_conf_init(&c);
  const char *w[8];
  int n = ag_conf_split(&c, "  -m '/models/my model.gguf' --alias \"q \\\"9b\\\"\" a\\ b  ", w, 8);
  assert_int_equal(n, 5);
  assert_string_equal(w[0], "-m");
  assert_string_equal(w[1], "/models/my model.gguf");
  assert_string_equal(w[2], "--alias");
  assert_string_equal(w[3], "q \"9b\"");
  assert_string_equal(w[4], "a b");
  assert_int_equal(ag_conf_split(&c, "'open", w, 8), -EINVAL);
  assert_int_equal(ag_conf_split(&c, "a b c", w, 2), PR_ETOOLARGE);
  assert_int_equal(ag_conf_split(&c, "", w, 8), 0);
  int t[AG_ENGINE_MAX_TUNE];
  size_t nt;
  assert_int_equal(ag_conf_parse_threads("2,4,6", t, &nt), 0);
  assert_int_equal(nt, 3);
  assert_int_equal(t[2], 6);
  assert_int_equal(ag_conf_parse_threads("2,,4", t, &nt), -EINVAL);
  assert_int_equal(ag_conf_parse_threads("0", t, &nt), -EINVAL);
  assert_int_equal(ag_conf_parse_threads("4x", t, &nt), -EINVAL);
  ag_conf_free(&c);
}

static void test_conf_file(void **state) {
  (void)state;
  char path[] = "/tmp/fg-agent-confXXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  write_file(path, "{\"engine\":\"llama\",\"command\":\"/bin/llama-server\",\"args\":[\"-m\",\"x.gguf\"],"
                   "\"tune_threads\":[2,4],\"measure\":true,\"slots\":2}");
  ag_conf c;
  char err[512];
  ag_conf_init(&c);
  assert_int_equal(ag_conf_load_file(&c, path, err, sizeof(err)), 0);
  assert_string_equal(c.command, "/bin/llama-server");
  assert_int_equal(c.n_args, 2);
  assert_string_equal(c.args[1], "x.gguf");
  assert_int_equal(c.n_tune, 2);
  assert_int_equal(c.measure, 1);
  assert_int_equal(c.slots, 2);
  ag_conf_free(&c);
  write_file(path, "{\"engine\":\"llama\",\"comand\":\"x\"}");
  ag_conf_init(&c);
  assert_true(ag_conf_load_file(&c, path, err, sizeof(err)) < 0);
  assert_non_null(strstr(err, "comand"));
  ag_conf_free(&c);
  write_file(path, "{\"args\":[1]}");
  ag_conf_init(&c);
  assert_true(ag_conf_load_file(&c, path, err, sizeof(err)) < 0);
  assert_non_null(strstr(err, "args[0]"));
  ag_conf_free(&c);
  write_file(path, "{\n  \"engine\": }");
  ag_conf_init(&c);
  assert_true(ag_conf_load_file(&c, path, err, sizeof(err)) < 0);
  assert_non_null(strstr(err, ":2:"));
  ag_conf_free(&c);
  unlink(path);
}

static void test_pick_fastest(void **state) {
  (void)state;
  double pre[] = {100, 200, 400, -1}, dec[] = {10, 12, 8, 50};
  /* 1000/p + 100/d: 20, 13.3, 15, (unknown) */
  assert_int_equal(ag_engine_pick_fastest(pre, dec, 4), 1);
  assert_int_equal(ag_engine_pick_fastest(pre + 3, dec + 3, 1), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_rates),
    cmocka_unit_test(test_documents),
    cmocka_unit_test(test_held_and_unfit),
    cmocka_unit_test(test_signature),
    cmocka_unit_test(test_backoff),
    cmocka_unit_test(test_conf_split_and_threads),
    cmocka_unit_test(test_conf_file),
    cmocka_unit_test(test_pick_fastest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
