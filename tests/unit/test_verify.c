/* Unit tests for gateway/verify.c's pure parts: when two answers agree, how often a phone
 * is checked for its record, and the text of an answer that is compared. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "verify.h"

static void test_agreement_is_the_leading_words(void **state) {
  (void)state;
  assert_int_equal(gw_verify_agree("RISK_LEVEL: 3 card velocity", "RISK_LEVEL: 3 card velocity", 32), 1);
  /* whitespace does not count: runs, newlines, the ends */
  assert_int_equal(gw_verify_agree("  RISK_LEVEL:  3\ncard ", "RISK_LEVEL: 3 card", 32), 1);
  /* the first words decide: what follows them may differ (a near-tie late in the answer) */
  assert_int_equal(gw_verify_agree("a b c d e", "a b c x y", 3), 1);
  assert_int_equal(gw_verify_agree("a b c d e", "a b c x y", 4), 0);
  /* a faker's short answer against the model's words */
  assert_int_equal(gw_verify_agree("RISK_LEVEL: 1", "quiet river stone", 32), 0);
  /* one answer ending early is a difference, not a prefix */
  assert_int_equal(gw_verify_agree("a b", "a b c", 32), 0);
  assert_int_equal(gw_verify_agree("a b", "a b c", 2), 1);
  assert_int_equal(gw_verify_agree("", "", 32), 1);
  assert_int_equal(gw_verify_agree(NULL, "x", 32), 0);
  assert_int_equal(gw_verify_agree("ab", "a b", 32), 0);
  /* a thinking model's tags are not words: a build that left the reasoning in the content
   * (or a shadow cut before </think>) agrees with one that parsed it out */
  assert_int_equal(gw_verify_agree("<think>\nCard velocity high.\n</think>\n\nRISK_LEVEL: 5",
                                   "Card velocity high. RISK_LEVEL: 5", 32), 1);
  assert_int_equal(gw_verify_agree("<think>Card velocity", "Card velocity", 32), 1);
  assert_int_equal(gw_verify_agree("<think>\nCard velocity", "Card speed", 32), 0);
  /* only the tags: what is around them still counts */
  assert_int_equal(gw_verify_agree("x<think> y", "x y", 32), 0);
  assert_int_equal(gw_verify_agree("<think></think>", "", 32), 1);
}

static void test_the_rate_follows_the_record(void **state) {
  (void)state;
  /* a newcomer: half its answers; one that owes a check: every answer */
  assert_float_equal(gw_verify_rate(0, 0, 0, 5, 0.5, 0.01), 0.5, 1e-12);
  assert_float_equal(gw_verify_rate(4, 4, 0, 5, 0.5, 0.01), 0.5, 1e-12);
  assert_float_equal(gw_verify_rate(100, 100, 1, 5, 0.5, 0.01), 1.0, 1e-12);
  /* a record: newcomer_rate x trust_after / passed, never under min_rate */
  assert_float_equal(gw_verify_rate(5, 5, 0, 5, 0.5, 0.01), 0.5, 1e-12);
  assert_float_equal(gw_verify_rate(50, 50, 0, 5, 0.5, 0.01), 0.05, 1e-12);
  assert_float_equal(gw_verify_rate(5000, 5000, 0, 5, 0.5, 0.01), 0.01, 1e-12);
  /* passes that are not in a row (a lost vote between) do not make a record */
  assert_float_equal(gw_verify_rate(2, 500, 0, 5, 0.5, 0.01), 0.5, 1e-12);
}

static void test_a_newcomer_is_held_later_as_it_earns_its_record(void **state) {
  (void)state;
  /* without a pass (a faker fails its first check): held after verify.ahead answers */
  assert_int_equal(gw_verify_hold_after(4, 0, 0), 4);
  /* each pass in a row lets it give more before an undecided check holds it: ahead x
   * (1 + passes)^2, so a fresh fleet's honest newcomers are held and checked once in their
   * first 17 answers, not twice */
  assert_int_equal(gw_verify_hold_after(4, 1, 0), 16);
  assert_int_equal(gw_verify_hold_after(4, 4, 0), 100);
  /* one that lost a vote is back to verify.ahead, whatever it passed since */
  assert_int_equal(gw_verify_hold_after(4, 3, 1), 4);
  assert_int_equal(gw_verify_hold_after(1, 0, 0), 1);
}

static void test_the_text_of_an_answer(void **state) {
  (void)state;
  pr_buf t;
  pr_buf_init(&t, 1 << 16);
  const char *chat = "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"RISK_LEVEL: 2\","
                     "\"reasoning_content\":\"new device\"}}]}";
  assert_int_equal(gw_verify_answer_text(chat, strlen(chat), &t), 0);
  assert_string_equal(t.data, "new device RISK_LEVEL: 2");
  pr_buf_reset(&t);
  const char *tool = "{\"choices\":[{\"message\":{\"content\":null,\"tool_calls\":[{\"function\":"
                     "{\"name\":\"flag\",\"arguments\":\"{\\\"level\\\":3}\"}}]}}]}";
  assert_int_equal(gw_verify_answer_text(tool, strlen(tool), &t), 0);
  assert_string_equal(t.data, "flag {\"level\":3}");
  pr_buf_reset(&t);
  const char *comp = "{\"choices\":[{\"text\":\" low risk\"}]}";
  assert_int_equal(gw_verify_answer_text(comp, strlen(comp), &t), 0);
  assert_string_equal(t.data, " low risk");
  pr_buf_reset(&t);
  assert_true(gw_verify_answer_text("{\"error\":{}}", 12, &t) < 0);
  assert_true(gw_verify_answer_text("not json", 8, &t) < 0);
  pr_buf_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_agreement_is_the_leading_words),
    cmocka_unit_test(test_the_rate_follows_the_record),
      cmocka_unit_test(test_a_newcomer_is_held_later_as_it_earns_its_record),
    cmocka_unit_test(test_the_text_of_an_answer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
