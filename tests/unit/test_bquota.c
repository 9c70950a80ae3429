/* gateway/bquota.c: a key's Batch API quotas alone, with time passed in: files and bytes
 * (uploads arriving counted), the uploads-per-minute bucket and its Retry-After, batches
 * not ended, validations, lines waiting; 0 is no limit; what a refusal says. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "bquota.h"

static gw_bquota quota(void) {
  gw_bquota q = {.files = 3, .file_bytes = 1000, .uploads_per_min = 2, .batches = 2,
                 .validating = 1, .lines = 100};
  return q;
}

static void test_files_count_with_uploads_arriving(void **state) {
  (void)state;
  gw_bquota q = quota();
  q.uploads_per_min = 0;
  gw_bquota_use u = {0};
  gw_bquota_no no;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(gw_bquota_upload_check(&q, &u, "alice", 10, 0, &no), 0);
    gw_bquota_upload_begin(&q, &u, 0);
  }
  /* three arriving: a fourth is one file too many */
  assert_int_equal(u.uploads, 3);
  assert_int_equal(gw_bquota_upload_check(&q, &u, "alice", 10, 0, &no), 403);
  assert_string_equal(no.code, "file_quota_exceeded");
  assert_string_equal(no.type, "permission_error");
  assert_non_null(strstr(no.msg, "alice"));
  assert_non_null(strstr(no.msg, "files: 3"));
  /* one fails (not stored), one is stored: still three held */
  gw_bquota_upload_end(&u, 0, 0);
  gw_bquota_upload_end(&u, 10, 1);
  assert_int_equal(u.files, 1);
  assert_int_equal(u.uploads, 1);
  assert_int_equal(gw_bquota_upload_check(&q, &u, "alice", 10, 0, &no), 0);
  gw_bquota_upload_begin(&q, &u, 0);
  assert_int_equal(gw_bquota_upload_check(&q, &u, "alice", 10, 0, &no), 403);
}

static void test_bytes_declared_and_growing(void **state) {
  (void)state;
  gw_bquota q = quota();
  q.files = 0;
  gw_bquota_use u = {.file_bytes = 600};
  gw_bquota_no no;
  /* declared: 600 + 401 > 1000 refused before a byte; 400 fits exactly */
  assert_int_equal(gw_bquota_upload_check(&q, &u, "bob", 401, 0, &no), 403);
  assert_string_equal(no.code, "file_quota_exceeded");
  assert_non_null(strstr(no.msg, "file_bytes: 1000"));
  assert_int_equal(gw_bquota_upload_check(&q, &u, "bob", 400, 0, &no), 0);
  /* unknown length: taken, stopped as it passes */
  assert_int_equal(gw_bquota_upload_check(&q, &u, "bob", -1, 0, &no), 0);
  gw_bquota_upload_begin(&q, &u, 0);
  assert_int_equal(gw_bquota_upload_grow(&q, &u, "bob", 300, &no), 0);
  assert_int_equal(gw_bquota_upload_grow(&q, &u, "bob", 100, &no), 0);
  assert_int_equal(u.upload_bytes, 400);
  assert_int_equal(gw_bquota_upload_grow(&q, &u, "bob", 1, &no), 403);
  assert_int_equal(u.upload_bytes, 400); /* the refused bytes are not counted */
  /* while 400 arrive, another upload sees 1000 held */
  assert_int_equal(gw_bquota_upload_check(&q, &u, "bob", 1, 0, &no), 403);
  gw_bquota_upload_end(&u, 400, 0); /* stopped: nothing kept */
  assert_int_equal(u.upload_bytes, 0);
  assert_int_equal(u.file_bytes, 600);
  assert_int_equal(u.uploads, 0);
}

static void test_uploads_per_minute(void **state) {
  (void)state;
  gw_bquota q = quota();
  q.files = q.file_bytes = 0;
  gw_bquota_use u = {0};
  gw_bquota_no no;
  uint64_t t = 1000000;
  /* a new key's bucket is full: 2 at once, the third waits 30 s (2 a minute) */
  for (int i = 0; i < 2; i++) {
    assert_int_equal(gw_bquota_upload_check(&q, &u, "carol", 1, t, &no), 0);
    gw_bquota_upload_begin(&q, &u, t);
    gw_bquota_upload_end(&u, 1, 1);
  }
  assert_int_equal(gw_bquota_upload_check(&q, &u, "carol", 1, t, &no), 429);
  assert_string_equal(no.code, "rate_limit_exceeded");
  assert_string_equal(no.type, "rate_limit_error");
  assert_int_equal(no.retry_after_s, 30);
  assert_non_null(strstr(no.msg, "uploads per minute"));
  /* 15 s later: half an upload back, 15 s to wait */
  assert_int_equal(gw_bquota_upload_check(&q, &u, "carol", 1, t + 15000, &no), 429);
  assert_int_equal(no.retry_after_s, 15);
  assert_int_equal(gw_bquota_upload_check(&q, &u, "carol", 1, t + 30000, &no), 0);
  /* an hour idle refills to 2, not more */
  assert_int_equal(gw_bquota_upload_check(&q, &u, "carol", 1, t + 3600000, &no), 0);
  assert_true(u.up_tokens <= 2.0);
  /* a limit under one a minute still lets one through, then waits a whole period */
  gw_bquota slow = q;
  slow.uploads_per_min = 0.5;
  gw_bquota_use v = {0};
  assert_int_equal(gw_bquota_upload_check(&slow, &v, "dave", 1, t, &no), 0);
  gw_bquota_upload_begin(&slow, &v, t);
  assert_int_equal(gw_bquota_upload_check(&slow, &v, "dave", 1, t, &no), 429);
  assert_int_equal(no.retry_after_s, 120);
}

static void test_batches_validating_lines(void **state) {
  (void)state;
  gw_bquota q = quota();
  gw_bquota_no no;
  gw_bquota_use u = {0};
  assert_int_equal(gw_bquota_batch_check(&q, &u, "erin", &no), 0);
  u.batches = 1;
  u.validating = 1;
  assert_int_equal(gw_bquota_batch_check(&q, &u, "erin", &no), 429);
  assert_string_equal(no.code, "batch_quota_exceeded");
  assert_non_null(strstr(no.msg, "validating: 1"));
  assert_true(no.retry_after_s >= 1);
  u.validating = 0;
  u.batches = 2;
  assert_int_equal(gw_bquota_batch_check(&q, &u, "erin", &no), 429);
  assert_non_null(strstr(no.msg, "batches: 2"));
  u.batches = 1;
  u.lines = 100;
  assert_int_equal(gw_bquota_batch_check(&q, &u, "erin", &no), 429);
  assert_string_equal(no.code, "line_quota_exceeded");
  /* a batch being validated: its lines with the key's waiting ones */
  u.lines = 60;
  assert_int_equal(gw_bquota_lines_check(&q, &u, "erin", 40, &no), 0);
  assert_int_equal(gw_bquota_lines_check(&q, &u, "erin", 41, &no), 429);
  assert_string_equal(no.code, "line_quota_exceeded");
  assert_non_null(strstr(no.msg, "lines: 100"));
}

static void test_zero_is_no_limit(void **state) {
  (void)state;
  gw_bquota q = {0};
  gw_bquota_use u = {.files = 1000000, .file_bytes = INT64_C(1) << 50, .batches = 1000000,
                     .validating = 1000000, .lines = INT64_C(1) << 40};
  gw_bquota_no no;
  for (int i = 0; i < 1000; i++) {
    assert_int_equal(gw_bquota_upload_check(&q, &u, "free", 1 << 30, (uint64_t)i, &no), 0);
    gw_bquota_upload_begin(&q, &u, (uint64_t)i);
  }
  assert_int_equal(gw_bquota_upload_grow(&q, &u, "free", INT64_C(1) << 40, &no), 0);
  assert_int_equal(gw_bquota_batch_check(&q, &u, "free", &no), 0);
  assert_int_equal(gw_bquota_lines_check(&q, &u, "free", 1000000, &no), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_files_count_with_uploads_arriving),
      cmocka_unit_test(test_bytes_declared_and_growing),
      cmocka_unit_test(test_uploads_per_minute),
      cmocka_unit_test(test_batches_validating_lines),
      cmocka_unit_test(test_zero_is_no_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
