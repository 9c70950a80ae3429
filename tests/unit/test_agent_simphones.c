/* Unit tests for agent/simphones.c: the phones one sim process hosts, from --phones N
 * (ids, listen addresses, tokens, the command line's fault plan for each) and from a
 * phones file (each entry's settings over the command line's, inline and file fault
 * plans, its own device tree), and the errors that name the file, the entry and the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "simphones.h"

#define BASE_TOKEN "fleet-token-0123456789abcdef"

static void base_config(ag_sim_config *c, ag_fault_plan *plan) {
  ag_sim_config_default(c);
  c->listen = "127.0.0.1:0";
  c->model = "qwen3.5-0.8b";
  c->slots = 2;
  c->prefill_tps = 140;
  c->decode_tps = 12;
  c->time_scale = 4;
  c->faults = plan;
}

/* A temporary file holding text; its name in path (size 64). */
static void temp_file(char *path, const char *text) {
  snprintf(path, 64, "/tmp/test-simphones-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  size_t n = strlen(text);
  assert_int_equal(write(fd, text, n), (ssize_t)n);
  close(fd);
}

static void test_copies_of_the_command_line(void **state) {
  (void)state;
  ag_fault_plan plan = {0};
  char err[512] = "";
  const char *hang = "[{\"at_s\": 1, \"kind\": \"hang\", \"dur_s\": 2}]";
  assert_int_equal(ag_fault_plan_parse(&plan, hang, strlen(hang), err, sizeof(err)), 0);
  ag_sim_config c;
  base_config(&c, &plan);
  ag_simphones p;
  ag_simphones_spec spec = {&c, 3, NULL, 0.4};
  assert_int_equal(ag_simphones_build(&p, &spec, err, sizeof(err)), 0);
  assert_int_equal(p.n, 3);
  for (size_t i = 0; i < 3; i++) {
    char id[16];
    snprintf(id, sizeof(id), "sim-%zu", i + 1);
    assert_string_equal(p.v[i].id, id);
    assert_string_equal(p.v[i].sc.id, id);
    assert_string_equal(p.v[i].sc.listen, "127.0.0.1:0"); /* each picks a free port */
    assert_int_equal(p.v[i].sc.slots, 2);
    assert_true(p.v[i].sc.prefill_tps == 140 && p.v[i].sc.decode_tps == 12 && p.v[i].sc.time_scale == 4);
    assert_string_equal(p.v[i].sc.model, "qwen3.5-0.8b");
    assert_ptr_equal(p.v[i].sc.faults, &p.v[i].plan); /* a copy each */
    assert_int_equal(p.v[i].plan.n, 1);
    assert_ptr_not_equal(p.v[i].plan.v, plan.v);
    assert_null(p.v[i].sc.token);
    assert_true(p.v[i].cost_per_day == 0.4);
  }
  ag_simphones_free(&p);
  assert_null(p.v);
  /* a port: consecutive ones; --id names them */
  c.listen = "127.0.0.1:17100";
  c.id = "budget";
  spec.count = 2;
  assert_int_equal(ag_simphones_build(&p, &spec, err, sizeof(err)), 0);
  assert_string_equal(p.v[0].sc.listen, "127.0.0.1:17100");
  assert_string_equal(p.v[1].sc.listen, "127.0.0.1:17101");
  assert_string_equal(p.v[1].id, "budget-2");
  ag_simphones_free(&p);
  c.listen = "127.0.0.1:65535";
  assert_true(ag_simphones_build(&p, &spec, err, sizeof(err)) < 0);
  assert_non_null(strstr(err, "passes 65535"));
  ag_fault_plan_free(&plan);
}

static void test_each_phone_its_own_token(void **state) {
  (void)state;
  ag_sim_config c;
  base_config(&c, NULL);
  c.id = "flag";
  c.token = BASE_TOKEN;
  ag_simphones p;
  char err[512] = "";
  ag_simphones_spec spec = {&c, 2, NULL, -1};
  assert_int_equal(ag_simphones_build(&p, &spec, err, sizeof(err)), 0);
  /* hex HMAC-SHA256 of the id under the base token (Python: hmac.new(base, id, sha256)) */
  assert_string_equal(p.v[0].sc.token, "865e9de683de5efe586b545d2fbdc89d515ee2361102bd891c8354cab03eab20");
  assert_int_equal(strlen(p.v[1].sc.token), AG_SIMPHONES_TOKEN_LEN);
  assert_string_not_equal(p.v[0].sc.token, p.v[1].sc.token);
  assert_string_not_equal(p.v[1].sc.token, BASE_TOKEN);
  char again[AG_SIMPHONES_TOKEN_LEN + 1];
  assert_int_equal(ag_simphones_token(BASE_TOKEN, "flag-2", again), 0);
  assert_string_equal(again, p.v[1].sc.token);
  ag_simphones_free(&p);
}

static void test_file_entries_over_the_command_line(void **state) {
  (void)state;
  char plan_path[64], path[64], text[1024], err[512] = "";
  temp_file(plan_path, "[{\"at_s\": 0, \"kind\": \"offline\", \"dur_s\": 5}]");
  snprintf(text, sizeof(text),
           "[{\"id\": \"flag-01\", \"slots\": 4, \"prefill_tps\": 466.7, \"decode_tps\": 40},\n"
           " {\"id\": \"mid-01\", \"listen\": \"127.0.0.1:0\", \"n_ctx\": 8192, \"loading_s\": 3,\n"
           "  \"fault_plan\": [{\"at_s\": 0, \"kind\": \"slow\", \"dur_s\": 100, \"factor\": 2}]},\n"
           " {\"fault_plan\": \"%s\", \"sysfs_root\": \"/tmp\", \"cost_per_day\": 0.9},\n"
           " {\"fault_plan\": []}]", plan_path);
  temp_file(path, text);
  ag_fault_plan plan = {0};
  const char *drop = "[{\"at_s\": 9, \"kind\": \"drop\", \"dur_s\": 1}]";
  assert_int_equal(ag_fault_plan_parse(&plan, drop, strlen(drop), err, sizeof(err)), 0);
  ag_sim_config c;
  base_config(&c, &plan);
  ag_simphones p;
  ag_simphones_spec spec = {&c, 0, path, -1};
  assert_int_equal(ag_simphones_build(&p, &spec, err, sizeof(err)), 0);
  assert_int_equal(p.n, 4);
  assert_string_equal(p.v[0].id, "flag-01");
  assert_int_equal(p.v[0].sc.slots, 4);
  assert_true(p.v[0].sc.prefill_tps == 466.7 && p.v[0].sc.decode_tps == 40);
  assert_int_equal(p.v[0].plan.n, 1); /* the command line's */
  assert_int_equal(p.v[0].plan.v[0].kind, AG_FAULT_DROP);
  assert_int_equal(p.v[1].sc.slots, 2);
  assert_int_equal(p.v[1].sc.n_ctx, 8192);
  assert_true(p.v[1].sc.loading_s == 3);
  assert_int_equal(p.v[1].plan.n, 1);
  assert_int_equal(p.v[1].plan.v[0].kind, AG_FAULT_SLOW);
  assert_true(p.v[1].plan.v[0].factor == 2);
  assert_string_equal(p.v[2].id, "sim-3"); /* unnamed: the n-th of the prefix */
  assert_int_equal(p.v[2].plan.v[0].kind, AG_FAULT_OFFLINE);
  assert_string_equal(p.v[2].sysfs_root, "/tmp");
  assert_true(p.v[2].cost_per_day == 0.9);
  assert_null(p.v[0].sysfs_root);
  assert_int_equal(p.v[3].plan.n, 0); /* an empty plan: this phone never misbehaves */
  ag_simphones_free(&p);
  ag_fault_plan_free(&plan);
  unlink(path);
  unlink(plan_path);
}

/* Build from a file holding text; returns the code, the message in err. */
static int build_text(const char *text, char *err, size_t errn, char *path_out) {
  char path[64];
  temp_file(path, text);
  if (path_out) snprintf(path_out, 64, "%s", path);
  ag_sim_config c;
  base_config(&c, NULL);
  ag_simphones p;
  ag_simphones_spec spec = {&c, 0, path, -1};
  int rc = ag_simphones_build(&p, &spec, err, errn);
  if (rc == 0) ag_simphones_free(&p);
  else assert_null(p.v);
  unlink(path);
  return rc;
}

static void test_errors_name_the_file_and_the_entry(void **state) {
  (void)state;
  char err[512], path[64];
  assert_true(build_text("[{\"id\": \"a\"}, {\"slot\": 2}]", err, sizeof(err), path) < 0);
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, "[1].slot")); /* an unknown key */
  assert_true(build_text("[{\"id\": \"a\"}, {\"slots\": 0}]", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "[1].slots"));
  assert_true(build_text("[{\"id\": \"a\"}, {\"prefill_tps\": 0}]", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "[1].prefill_tps"));
  assert_true(build_text("[{\"id\": \"a\"}, {\"id\": \"b\"}, {\"id\": \"a\"}]", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "phone 3 has the id 'a' of phone 1"));
  /* a generated id clashing with a given one */
  assert_true(build_text("[{\"id\": \"sim-2\"}, {}]", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "'sim-2'"));
  assert_true(build_text("[{\"id\": \"no spaces\"}]", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "[0]: id 'no spaces'"));
  assert_true(build_text("[{\"fault_plan\": [{\"at_s\": 0, \"kind\": \"nap\", \"dur_s\": 1}]}]", err,
                         sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "[0].fault_plan[0].kind: unknown kind \"nap\""));
  assert_true(build_text("[{\"fault_plan\": \"/nonexistent/plan.json\"}]", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "[0].fault_plan: /nonexistent/plan.json"));
  assert_true(build_text("[{\"sysfs_root\": \"/nonexistent\"}]", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "not a directory"));
  assert_true(build_text("[]", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "between 1 and"));
  assert_true(build_text("{\"id\": \"a\"}", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "expected a JSON array"));
  assert_true(build_text("[{\"id\": \"a\"},\n {\"id\": }]", err, sizeof(err), path) < 0);
  assert_non_null(strstr(err, ":2:")); /* line 2 */
  assert_true(build_text("[1]", err, sizeof(err), NULL) < 0);
  assert_non_null(strstr(err, "[0]: expected an object"));
}

static void test_counts(void **state) {
  (void)state;
  ag_sim_config c;
  base_config(&c, NULL);
  ag_simphones p;
  char err[512] = "";
  ag_simphones_spec spec = {&c, 0, NULL, -1};
  assert_true(ag_simphones_build(&p, &spec, err, sizeof(err)) < 0);
  spec.count = AG_SIMPHONES_MAX + 1;
  assert_true(ag_simphones_build(&p, &spec, err, sizeof(err)) < 0);
  spec.count = 1000;
  assert_int_equal(ag_simphones_build(&p, &spec, err, sizeof(err)), 0);
  assert_string_equal(p.v[999].id, "sim-1000");
  ag_simphones_free(&p);
  c.listen = "nowhere";
  spec.count = 2;
  assert_true(ag_simphones_build(&p, &spec, err, sizeof(err)) < 0);
  assert_non_null(strstr(err, "HOST:PORT"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_copies_of_the_command_line),
    cmocka_unit_test(test_each_phone_its_own_token),
    cmocka_unit_test(test_file_entries_over_the_command_line),
    cmocka_unit_test(test_errors_name_the_file_and_the_entry),
    cmocka_unit_test(test_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
