/* The record of checkpoint saves in progress on a daemon (ckpt_saves.h):
 * a mark holds until settled or until it lapses, and a full record
 * refuses a new save rather than forgetting one in progress (a commit
 * would then remove its files); a committed save is kept while a save
 * begun before its commit is in progress (its commit may cross it); a
 * file from before the record began is taken for a save while it may be. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_saves.h"
#include "clock.h"

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

/* Sleeps until distd_now_ms() reaches at_ms. */
static void sleep_until_ms(int64_t at_ms) {
  for (int64_t now = distd_now_ms(); now < at_ms; now = distd_now_ms())
    usleep((useconds_t)(at_ms - now) * 1000);
}

/* The second mark comes late in the first's window and the check just past
 * it, so that a stall of the test (a loaded host) must last most of a
 * window to make the check come too late (with fixed 600 ms sleeps, 400 ms
 * did). */
Test(ckpt_saves, a_mark_lapses_keep_ms_after_it_was_last_made) {
  enum { KEEP_MS = 1000 };
  distd_ckpt_saves *s = distd_ckpt_saves_new(KEEP_MS);
  mark_ok(s, "x");
  int64_t first = distd_now_ms(); /* the first mark is no later */
  sleep_until_ms(first + KEEP_MS - 100);
  /* Answered: the window starts again. (Made after the first lapsed, in
   * a stall, it is a new mark and the check below proves less, but holds.) */
  mark_ok(s, "x");
  sleep_until_ms(first + KEEP_MS + 50);
  cr_assert(distd_ckpt_saves_in_progress(s, "x"), "lapsed from the first mark");
  sleep_until_ms(distd_now_ms() + KEEP_MS);
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

/* Fails unless a commit would keep id's files (want 1) or not (want 0). */
static void expect_keeps(distd_ckpt_saves *s, const char *id, int want) {
  cr_assert_eq(distd_ckpt_saves_keeps(s, id), want, "%s's files %s", id,
               want ? "forgotten" : "kept");
}

/* The crossing on one daemon: x and y save, y commits, then x's commit
 * (which may have reached rank 0 before y's) comes. Until it is recorded,
 * y's files stay; once no save that began before y's commit is in
 * progress, they go as stale (at once when none was). */
Test(ckpt_saves, a_committed_save_is_kept_while_a_save_begun_before_its_commit_is_in_progress) {
  distd_ckpt_saves *s = distd_ckpt_saves_new(60000);
  distd_ckpt_saves_committed(s, "alone"); /* no save in progress could cross it */
  expect_keeps(s, "alone", 0);
  mark_ok(s, "x");
  mark_ok(s, "y");
  distd_ckpt_saves_committed(s, "y");
  cr_assert_not(distd_ckpt_saves_in_progress(s, "y"));
  expect_keeps(s, "y", 1); /* x's commit may cross y's */
  expect_keeps(s, "x", 1);
  mark_ok(s, "z"); /* began after y's commit: does not keep it */
  distd_ckpt_saves_committed(s, "x");
  expect_keeps(s, "y", 0); /* no save begun before y's commit is left */
  expect_keeps(s, "z", 1);
  expect_keeps(s, "x", 1); /* z began before x's commit: it may cross it */
  distd_ckpt_saves_free(s);
}

/* keep_ms is long, so that only a stall of most of it makes the first
 * check come after the abandoned save lapsed (500 ms was a race on a
 * loaded host), and the second check is timed from after the mark. */
Test(ckpt_saves, a_committed_save_goes_when_the_save_begun_before_it_lapses_or_settles) {
  enum { KEEP_MS = 2000 };
  distd_ckpt_saves *s = distd_ckpt_saves_new(KEEP_MS);
  mark_ok(s, "abandoned");
  int64_t marked = distd_now_ms(); /* the mark is no later */
  distd_ckpt_saves_committed(s, "y");
  expect_keeps(s, "y", 1);
  sleep_until_ms(marked + KEEP_MS + 50);
  expect_keeps(s, "y", 0); /* the abandoned save lapsed */
  mark_ok(s, "discarded");
  distd_ckpt_saves_committed(s, "w");
  distd_ckpt_saves_settle(s, "discarded");
  expect_keeps(s, "w", 0);
  distd_ckpt_saves_free(s);
}

/* Committed saves take no room from saves in progress; past
 * DISTD_CKPT_SAVES_MAX of them the one committed longest ago goes. */
Test(ckpt_saves, a_full_record_of_commits_forgets_the_oldest_and_refuses_no_save) {
  distd_ckpt_saves *s = distd_ckpt_saves_new(60000);
  char id[32];
  mark_ok(s, "long-running");
  for (int i = 0; i <= DISTD_CKPT_SAVES_MAX; i++) {
    snprintf(id, sizeof id, "done-%d", i);
    distd_ckpt_saves_committed(s, id);
  }
  expect_keeps(s, "done-0", 0);
  expect_keeps(s, "done-1", 1);
  snprintf(id, sizeof id, "done-%d", DISTD_CKPT_SAVES_MAX);
  expect_keeps(s, id, 1);
  for (int i = 1; i < DISTD_CKPT_SAVES_MAX; i++) {
    snprintf(id, sizeof id, "save-%d", i);
    mark_ok(s, id);
  }
  cr_assert(distd_ckpt_saves_in_progress(s, "long-running"));
  distd_ckpt_saves_free(s);
}

/* Now on the wall clock, that of file times, in ms. */
static int64_t wall_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A record begun by a restarted daemon knows nothing of the saves before:
 * a file written before it began may be of one in progress or crossed for
 * 2 x keep_ms, unless a manifest in place named it (committed). */
Test(ckpt_saves, a_file_from_before_the_record_began_may_be_of_a_save_for_twice_keep_ms) {
  int64_t before = wall_ms() - 1;
  distd_ckpt_saves *s = distd_ckpt_saves_new(1000);
  cr_assert(distd_ckpt_saves_began_lately(s));
  cr_assert(distd_ckpt_saves_may_be_from_before_restart(s, "rank0.x.safetensors", before));
  cr_assert(distd_ckpt_saves_may_be_from_before_restart(s, "rank0.x.safetensors",
                                                         before - 1900));
  cr_assert_not(distd_ckpt_saves_may_be_from_before_restart(s, "rank0.x.safetensors",
                                                             before - 2100), "too old");
  cr_assert_not(distd_ckpt_saves_may_be_from_before_restart(s, "rank0.x.safetensors",
                                                             wall_ms() + 1),
                "written since: the record judges it");
  distd_ckpt_saves_saw_in_manifest(s, "rank0.x.safetensors", before);
  distd_ckpt_saves_saw_in_manifest(s, "rank0.new.safetensors", wall_ms() + 1);
  cr_assert_not(distd_ckpt_saves_may_be_from_before_restart(s, "rank0.x.safetensors", before),
                "named by a manifest: committed");
  cr_assert(distd_ckpt_saves_may_be_from_before_restart(s, "rank0.y.safetensors", before));
  distd_ckpt_saves_free(s);
}

/* keep_ms is long, so that only a stall of most of it makes a check that
 * the record began lately come too late (a window of 200 ms was a race on
 * a loaded host); each check is timed from after the record began. */
Test(ckpt_saves, a_record_began_lately_for_twice_keep_ms) {
  enum { KEEP_MS = 2000 };
  distd_ckpt_saves *s = distd_ckpt_saves_new(KEEP_MS);
  int64_t began = distd_now_ms(); /* the record began no later */
  cr_assert(distd_ckpt_saves_began_lately(s));
  sleep_until_ms(began + KEEP_MS + 100);
  cr_assert(distd_ckpt_saves_began_lately(s), "for keep_ms only");
  sleep_until_ms(began + 2 * KEEP_MS + 50);
  cr_assert_not(distd_ckpt_saves_began_lately(s));
  distd_ckpt_saves_free(s);
}
