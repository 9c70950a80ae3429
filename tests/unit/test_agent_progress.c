/* Unit tests for agent/progress.c: llama-server's /slots readings turned into the
 * running requests of /agent/v1/status — order by task, pace between readings (a stall
 * lowers it, a finished prompt freezes it, a new task starts afresh), the pairing with
 * the front's request ids only when the counts match, and a finished request's slot
 * leaving at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "err.h"
#include "progress.h"

#define S(x) ((uint64_t)((x) * 1e9)) /* seconds to the nanoseconds readings are timed in */

/* One slot of a /slots body in llama-server's shape (see slots.http). */
static void slot_json(char *out, size_t n, int id, int busy, long task, long prompt, long processed,
                      long cache, long decoded) {
  snprintf(out, n,
           "{\"id\":%d,\"n_ctx\":4096,\"speculative\":false,\"is_processing\":%s,\"id_task\":%ld,"
           "\"n_prompt_tokens\":%ld,\"n_prompt_tokens_processed\":%ld,\"n_prompt_tokens_cache\":%ld,"
           "\"params\":{\"n_predict\":-1,\"stream\":false},\"next_token\":[{\"has_next_token\":true,"
           "\"has_new_line\":false,\"n_remain\":-1,\"n_decoded\":%ld}]}",
           id, busy ? "true" : "false", task, prompt, processed, cache, decoded);
}

static void take2(ag_progress *p, uint64_t now, const char *a, const char *b) {
  char body[4096];
  snprintf(body, sizeof(body), "[%s,%s,{\"id\":2,\"n_ctx\":4096,\"is_processing\":false}]", a, b);
  assert_int_equal(ag_progress_take(p, body, strlen(body), now), 0);
}

static int near(double v, double want) { return v > want * 0.999 && v < want * 1.001; }

static void test_order_pace_and_pairing(void **state) {
  (void)state;
  ag_progress p;
  ag_progress_clear(&p);
  ag_running run[AG_REPORT_MAX_SLOTS];
  char a[1024], b[1024];
  const char *ids[] = {"first", "second"};

  /* slot 1 runs the older task: it comes first */
  slot_json(a, sizeof(a), 0, 1, 8, 1000, 0, 0, 0);
  slot_json(b, sizeof(b), 1, 1, 5, 600, 100, 50, 0);
  take2(&p, S(10), a, b);
  size_t n = ag_progress_fill(&p, S(10), ids, 2, run, AG_REPORT_MAX_SLOTS);
  assert_int_equal(n, 2);
  assert_string_equal(run[0].request_id, "first");
  assert_string_equal(run[1].request_id, "second");
  assert_int_equal(run[0].prompt_tokens, 600);
  assert_int_equal(run[0].prompt_done, 150); /* the cached tokens count as read */
  assert_int_equal(run[1].prompt_done, 0);
  assert_true(run[0].prefill_tps < 0 && run[0].decode_tps < 0); /* one reading: no pace */

  /* a second later: 200 more tokens read in slot 1, nothing in slot 0 yet */
  slot_json(a, sizeof(a), 0, 1, 8, 1000, 0, 0, 0);
  slot_json(b, sizeof(b), 1, 1, 5, 600, 300, 50, 0);
  take2(&p, S(11), a, b);
  n = ag_progress_fill(&p, S(11), ids, 2, run, AG_REPORT_MAX_SLOTS);
  assert_true(near(run[0].prefill_tps, 200));
  assert_true(run[1].prefill_tps < 0);
  /* not as many ids as busy slots: no pairing */
  n = ag_progress_fill(&p, S(11), ids, 1, run, AG_REPORT_MAX_SLOTS);
  assert_int_equal(n, 2);
  assert_string_equal(run[0].request_id, "");
  assert_string_equal(run[1].request_id, "");
  n = ag_progress_fill(&p, S(11), NULL, 2, run, 1); /* no ids; cap respected */
  assert_int_equal(n, 1);
  assert_string_equal(run[0].request_id, "");

  /* no move for two seconds: the pace shown falls (those 200 tokens over 2 s) */
  take2(&p, S(12), a, b);
  take2(&p, S(13), a, b);
  ag_progress_fill(&p, S(13), ids, 2, run, AG_REPORT_MAX_SLOTS);
  assert_true(near(run[0].prefill_tps, 100));
  /* then the last 250 land after 3 s with a token out: that move also spans the wait
   * for the token, so it only bounds the pace from below and the earlier 200 stays */
  slot_json(b, sizeof(b), 1, 1, 5, 600, 550, 50, 1);
  take2(&p, S(14), a, b);
  ag_progress_fill(&p, S(14), ids, 2, run, AG_REPORT_MAX_SLOTS);
  assert_int_equal(run[0].prompt_done, 600);
  assert_int_equal(run[0].decoded, 1);
  assert_true(near(run[0].prefill_tps, 200));
  assert_true(run[0].decode_tps < 0); /* the first generating reading: no decode pace yet */
  /* 10 tokens in half a second */
  slot_json(b, sizeof(b), 1, 1, 5, 600, 550, 50, 11);
  take2(&p, S(14.5), a, b);
  ag_progress_fill(&p, S(14.5), ids, 2, run, AG_REPORT_MAX_SLOTS);
  assert_true(near(run[0].decode_tps, 20));
  assert_true(near(run[0].prefill_tps, 200));
  /* much later, same reading: the decode pace falls, the finished prefill's does not */
  ag_progress_fill(&p, S(19.5), ids, 2, run, AG_REPORT_MAX_SLOTS);
  assert_true(near(run[0].decode_tps, 2));
  assert_true(near(run[0].prefill_tps, 200));

  /* slot 1 takes a new task: its pace starts afresh, and it now sorts after slot 0 */
  slot_json(b, sizeof(b), 1, 1, 9, 600, 400, 0, 0);
  take2(&p, S(20), a, b);
  ag_progress_fill(&p, S(20), ids, 2, run, AG_REPORT_MAX_SLOTS);
  assert_int_equal(run[0].prompt_tokens, 1000);
  assert_int_equal(run[1].prompt_done, 400);
  assert_true(run[1].prefill_tps < 0 && run[1].decode_tps < 0);
  /* its prompt done in one faster move: that one counts (nothing faster was seen) */
  slot_json(b, sizeof(b), 1, 1, 9, 600, 600, 0, 0);
  take2(&p, S(20.5), a, b);
  ag_progress_fill(&p, S(30), ids, 2, run, AG_REPORT_MAX_SLOTS);
  assert_true(near(run[1].prefill_tps, 400));

  /* the first request ends: its slot leaves the report and the other keeps its id */
  ag_progress_forget(&p, 0);
  ag_progress_forget(&p, 5); /* out of range: nothing */
  n = ag_progress_fill(&p, S(30), ids + 1, 1, run, AG_REPORT_MAX_SLOTS);
  assert_int_equal(n, 1);
  assert_string_equal(run[0].request_id, "second");
  assert_int_equal(run[0].prompt_done, 600);

  /* llama-server still shows the ended task busy (it notices the closed connection
   * between batches) while a third request waits: the ended task is left out, so
   * "second" is not paired with it, then forgotten once it is no longer busy */
  slot_json(a, sizeof(a), 0, 1, 8, 1000, 1000, 0, 5);
  slot_json(b, sizeof(b), 1, 1, 9, 600, 600, 0, 3);
  take2(&p, S(31), a, b);
  n = ag_progress_fill(&p, S(31), ids + 1, 1, run, AG_REPORT_MAX_SLOTS);
  assert_int_equal(n, 1);
  assert_string_equal(run[0].request_id, "second");
  assert_int_equal(run[0].prompt_tokens, 600);
  slot_json(a, sizeof(a), 0, 0, 8, 1000, 1000, 0, 5);
  take2(&p, S(32), a, b);
  assert_int_equal(p.n_ended, 0);
  /* a new task on that slot is reported again */
  slot_json(a, sizeof(a), 0, 1, 11, 300, 100, 0, 0);
  take2(&p, S(33), a, b);
  assert_int_equal(ag_progress_fill(&p, S(33), NULL, 0, run, AG_REPORT_MAX_SLOTS), 2);
}

static void test_idle_bad_and_too_many(void **state) {
  (void)state;
  ag_progress p;
  ag_progress_clear(&p);
  ag_running run[AG_REPORT_MAX_SLOTS];
  char a[1024], b[1024];
  slot_json(a, sizeof(a), 0, 0, 3, 10, 10, 0, 5); /* finished: not running */
  slot_json(b, sizeof(b), 1, 1, 4, 10, 2, 0, 0);
  take2(&p, S(1), a, b);
  assert_int_equal(ag_progress_fill(&p, S(1), NULL, 0, run, AG_REPORT_MAX_SLOTS), 1);

  /* not an array: nothing is reported any more */
  static const char *bad[] = {"", "{\"error\":{}}", "[{\"id\":0", "404 page not found"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(ag_progress_take(&p, bad[i], strlen(bad[i]), S(2)), PR_EPARSE);
    assert_int_equal(ag_progress_fill(&p, S(2), NULL, 0, run, AG_REPORT_MAX_SLOTS), 0);
  }
  /* odd fields are unknown, not errors */
  static const char odd[] = "[7,{\"is_processing\":true,\"id\":\"x\",\"n_prompt_tokens\":-5,"
                            "\"n_prompt_tokens_processed\":1e300,\"next_token\":{}}]";
  assert_int_equal(ag_progress_take(&p, odd, strlen(odd), S(3)), 0);
  assert_int_equal(ag_progress_fill(&p, S(3), NULL, 0, run, AG_REPORT_MAX_SLOTS), 1);
  assert_true(run[0].prompt_tokens < 0 && run[0].prompt_done < 0 && run[0].decoded < 0);
  assert_true(run[0].prefill_tps < 0 && run[0].decode_tps < 0);

  /* more busy slots than are kept: those kept are shown, without request ids */
  static char body[AG_PROGRESS_MAX_SLOTS * 2 * 400];
  size_t len = 0;
  const char *ids[AG_PROGRESS_MAX_SLOTS + 1];
  for (int i = 0; i <= AG_PROGRESS_MAX_SLOTS; i++) {
    slot_json(a, sizeof(a), i, 1, 100 - i, 10, 1, 0, 0);
    len += (size_t)snprintf(body + len, sizeof(body) - len, "%s%s", i ? "," : "[", a);
    ids[i] = "id";
  }
  snprintf(body + len, sizeof(body) - len, "]");
  assert_int_equal(ag_progress_take(&p, body, strlen(body), S(4)), 0);
  size_t n = ag_progress_fill(&p, S(4), ids, AG_PROGRESS_MAX_SLOTS, run, AG_REPORT_MAX_SLOTS);
  assert_int_equal(n, AG_PROGRESS_MAX_SLOTS);
  assert_string_equal(run[0].request_id, "");
  assert_true(run[0].prompt_done == 1 && run[n - 1].prompt_done == 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_order_pace_and_pairing),
    cmocka_unit_test(test_idle_bad_and_too_many),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
