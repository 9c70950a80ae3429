/* Unit tests for gateway/job.c's state table: every move the diagram in gw.h draws is
 * legal, every other is refused, and DONE is the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gw.h"

static void test_the_drawn_moves_are_legal_and_no_other(void **state) {
  (void)state;
  static const int drawn[][2] = {
    {GW_JOB_ADMITTING, GW_JOB_QUEUED}, {GW_JOB_ADMITTING, GW_JOB_DONE},
    {GW_JOB_QUEUED, GW_JOB_RUNNING},    {GW_JOB_QUEUED, GW_JOB_DONE},
    {GW_JOB_RUNNING, GW_JOB_QUEUED},    {GW_JOB_RUNNING, GW_JOB_STREAMING},
    {GW_JOB_RUNNING, GW_JOB_DONE},      {GW_JOB_STREAMING, GW_JOB_RESUMING},
    {GW_JOB_STREAMING, GW_JOB_DONE},    {GW_JOB_RESUMING, GW_JOB_STREAMING},
    {GW_JOB_RESUMING, GW_JOB_DONE},
  };
  int n_legal = 0;
  for (int from = 0; from < GW_JOB_STATES; from++) {
    for (int to = 0; to < GW_JOB_STATES; to++) {
      int want = 0;
      for (size_t k = 0; k < sizeof(drawn) / sizeof(drawn[0]); k++)
        if (drawn[k][0] == from && drawn[k][1] == to) want = 1;
      if (gw_job_move_ok((gw_job_state)from, (gw_job_state)to) != want)
        fail_msg("%s -> %s: %d", gw_job_state_name((gw_job_state)from),
                 gw_job_state_name((gw_job_state)to), !want);
      n_legal += want;
    }
  }
  assert_int_equal(n_legal, 11);
  /* nothing leaves DONE; a stream never goes back to "nothing sent" */
  for (int to = 0; to < GW_JOB_STATES; to++) assert_false(gw_job_move_ok(GW_JOB_DONE, (gw_job_state)to));
  assert_false(gw_job_move_ok(GW_JOB_STREAMING, GW_JOB_QUEUED));
  assert_false(gw_job_move_ok(GW_JOB_RESUMING, GW_JOB_RUNNING));
  assert_false(gw_job_move_ok(GW_JOB_STATES, GW_JOB_DONE));
}

static void test_state_names(void **state) {
  (void)state;
  assert_string_equal(gw_job_state_name(GW_JOB_ADMITTING), "admitting");
  assert_string_equal(gw_job_state_name(GW_JOB_RESUMING), "resuming");
  assert_string_equal(gw_job_state_name(GW_JOB_DONE), "done");
  assert_string_equal(gw_job_state_name(GW_JOB_STATES), "unknown");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_the_drawn_moves_are_legal_and_no_other),
    cmocka_unit_test(test_state_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
