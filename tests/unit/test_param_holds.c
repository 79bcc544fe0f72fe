/* The holds that order requests on one name in a daemon (param_service.h):
 * which request is refused, which waits, and that a released hold lets the
 * next one in. Each expectation is the rule stated in the header. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "param_service.h"

static distd_params *p;

static void setup(void) { p = distd_params_new(3); }
static void teardown(void) { distd_params_free(p); }

TestSuite(holds, .init = setup, .fini = teardown, .timeout = 30);

static int hold_in_place(const char *name, int64_t wait_ms, dist_errbuf *eb) {
  int is_param = -1;
  int rc = distd_param_hold(p, name, distd_now_ms() + wait_ms, &is_param, eb);
  if (rc == 0) cr_expect_eq(is_param, 0, "'%s' is a plain tensor here", name);
  return rc;
}

static void expect_busy(int rc, const dist_errbuf *eb, const char *needle) {
  cr_assert_eq(rc, DIST_EUNAVAIL, "%s", eb->msg);
  cr_expect(strstr(eb->msg, needle), "'%s' does not say '%s'", eb->msg, needle);
  cr_expect(strstr(eb->msg, "rank 3"), "'%s' does not name the daemon", eb->msg);
  cr_expect(strstr(eb->msg, "nothing was changed"), "%s", eb->msg);
}

Test(holds, an_in_place_reshard_excludes_other_reshards_and_configures) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(hold_in_place("w", 1000, &eb), 0, "%s", eb.msg);
  expect_busy(hold_in_place("w", 1000, &eb), &eb, "being resharded by another request");
  expect_busy(distd_param_hold_read(p, "w", &eb), &eb, "being resharded by another request");
  expect_busy(distd_param_claim(p, "w", &eb), &eb, "being resharded");
  cr_expect_eq(distd_param_hold_read(p, "other", &eb), 0, "another name is free");
  distd_param_release(p, "other", DISTD_HOLD_READ);
  distd_param_release(p, "w", DISTD_HOLD_RESHARD);
  cr_expect_eq(distd_param_claim(p, "w", &eb), 0, "%s", eb.msg);
  distd_param_release(p, "w", DISTD_HOLD_CONFIGURE);
}

Test(holds, readers_share_a_name_and_keep_in_place_reshards_out) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_param_hold_read(p, "w", &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_param_hold_read(p, "w", &eb), 0, "%s", eb.msg);
  cr_expect_eq(distd_param_claim(p, "w", &eb), 0, "a configure does not change what a copy "
               "reads: %s", eb.msg);
  distd_param_release(p, "w", DISTD_HOLD_CONFIGURE);
  distd_param_release(p, "w", DISTD_HOLD_READ);
  expect_busy(hold_in_place("w", 1000, &eb), &eb, "being resharded by another request");
  distd_param_release(p, "w", DISTD_HOLD_READ);
  cr_expect_eq(hold_in_place("w", 1000, &eb), 0, "%s", eb.msg);
  distd_param_release(p, "w", DISTD_HOLD_RESHARD);
}

Test(holds, a_configure_refuses_a_second_configure) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_param_claim(p, "w", &eb), 0, "%s", eb.msg);
  expect_busy(distd_param_claim(p, "w", &eb), &eb, "being configured");
  distd_param_release(p, "w", DISTD_HOLD_CONFIGURE);
}

/* Releases "w"'s configure hold after 200 ms. */
static void *release_later(void *arg) {
  (void)arg;
  usleep(200 * 1000);
  distd_param_release(p, "w", DISTD_HOLD_CONFIGURE);
  return NULL;
}

Test(holds, an_in_place_reshard_waits_for_a_configure_then_holds) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_param_claim(p, "w", &eb), 0, "%s", eb.msg);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, release_later, NULL), 0);
  int64_t t0 = distd_now_ms();
  cr_expect_eq(hold_in_place("w", 5000, &eb), 0, "%s", eb.msg);
  int64_t waited = distd_now_ms() - t0;
  pthread_join(th, NULL);
  cr_expect_geq(waited, 150, "held after %lld ms, before the configure ended",
                (long long)waited);
  cr_expect_lt(waited, 4000, "held only at the deadline (%lld ms)", (long long)waited);
  distd_param_release(p, "w", DISTD_HOLD_RESHARD);
}

Test(holds, an_in_place_reshard_gives_up_at_its_deadline) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_param_claim(p, "w", &eb), 0, "%s", eb.msg);
  cr_expect_eq(hold_in_place("w", 100, &eb), DIST_EUNAVAIL);
  cr_expect(strstr(eb.msg, "still being configured at the deadline"), "%s", eb.msg);
  distd_param_release(p, "w", DISTD_HOLD_CONFIGURE);
  cr_expect_eq(hold_in_place("w", 100, &eb), 0, "nothing was left held: %s", eb.msg);
  distd_param_release(p, "w", DISTD_HOLD_RESHARD);
}
