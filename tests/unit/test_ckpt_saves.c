/* The record of checkpoint saves in progress on a daemon (ckpt_saves.h):
 * a mark holds until settled or until it lapses, and a full record
 * refuses a new save rather than forgetting one in progress (a commit
 * would then remove its files). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_saves.h"

static void mark_ok(distd_ckpt_saves *s, const char *id) {
  dist_errbuf eb = {0};
  cr_assert_eq(distd_ckpt_saves_mark(s, id, 0, &eb), 0, "%s: %s", id, eb.msg);
}

Test(ckpt_saves, a_mark_holds_until_its_save_is_settled) {
  distd_ckpt_saves *s = distd_ckpt_saves_new(60000);
  cr_assert_not(distd_ckpt_saves_in_progress(s, "x"));
  mark_ok(s, "x");
  mark_ok(s, "y");
  cr_assert(distd_ckpt_saves_in_progress(s, "x"));
  distd_ckpt_saves_settle(s, "x");
  distd_ckpt_saves_settle(s, "never-marked");
  cr_assert_not(distd_ckpt_saves_in_progress(s, "x"));
  cr_assert(distd_ckpt_saves_in_progress(s, "y"), "settling x settled y");
  distd_ckpt_saves_free(s);
}

Test(ckpt_saves, a_mark_lapses_keep_ms_after_it_was_last_made) {
  distd_ckpt_saves *s = distd_ckpt_saves_new(1000);
  mark_ok(s, "x");
  usleep(600 * 1000);
  mark_ok(s, "x"); /* answered: the window starts again */
  usleep(600 * 1000);
  cr_assert(distd_ckpt_saves_in_progress(s, "x"), "lapsed from the first mark");
  usleep(600 * 1000);
  cr_assert_not(distd_ckpt_saves_in_progress(s, "x"), "never lapsed");
  distd_ckpt_saves_free(s);
}

Test(ckpt_saves, a_full_record_refuses_a_save_and_forgets_none) {
  distd_ckpt_saves *s = distd_ckpt_saves_new(60000);
  char id[32];
  for (int i = 0; i < DISTD_CKPT_SAVES_MAX; i++) {
    snprintf(id, sizeof id, "save-%d", i);
    mark_ok(s, id);
  }
  dist_errbuf eb = {0};
  cr_assert_eq(distd_ckpt_saves_mark(s, "one-more", 3, &eb), DIST_EUNAVAIL);
  cr_assert(strstr(eb.msg, "rank 3 has 1024 checkpoint saves in progress"), "%s", eb.msg);
  for (int i = 0; i < DISTD_CKPT_SAVES_MAX; i++) {
    snprintf(id, sizeof id, "save-%d", i);
    cr_assert(distd_ckpt_saves_in_progress(s, id), "%s forgotten", id);
  }
  mark_ok(s, "save-7"); /* marking one again needs no room */
  distd_ckpt_saves_settle(s, "save-7");
  mark_ok(s, "one-more");
  distd_ckpt_saves_free(s);
}
