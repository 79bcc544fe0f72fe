/* The leak check that ends every test under AddressSanitizer
 * (tests/criterion_leak_check.c) reports a leak, and a check failed in a
 * test's .fini fails the test (the harness's check that each daemon
 * exited 0, which a leak of the daemon's makes 23, is one): this binary
 * runs itself again, only a test that does so on purpose, and expects that
 * test to fail. Built only under ASan (tests/meson.build). */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEAK_ON_PURPOSE_ENV "DIST_TEST_LEAK_ON_PURPOSE"

/* What libdist allocates for a test counts as the test's: a client it opened
 * (no daemon needed until a call) and never closed. */
static dist_client *client_never_closed(void) {
  dist_client *c = NULL;
  cr_assert_eq(dist_connect("127.0.0.1:1", NULL, &c), 0, "%s", dist_last_connect_error());
  return c;
}

Test(leak_check, leaks_on_purpose) {
  if (!getenv(LEAK_ON_PURPOSE_ENV)) cr_skip_test("runs only when leak_check::reported runs it");
  cr_assert_not_null(client_never_closed());
  char *lost = malloc(41);
  cr_assert_not_null(lost);
  lost[0] = 1;
  lost = NULL; /* the only pointer to the block, gone */
}

/* As harness_stop's check of a daemon's exit status, from .fini: before the
 * finis ran in the main phase, a failed check there was printed and the
 * test passed. */
static void fini_whose_check_fails(void) {
  if (getenv(LEAK_ON_PURPOSE_ENV)) cr_expect(0, "a check in .fini failed on purpose");
}

Test(leak_check, fini_fails_on_purpose, .fini = fini_whose_check_fails) {
  if (!getenv(LEAK_ON_PURPOSE_ENV)) cr_skip_test("runs only when leak_check::reported runs it");
}

/* Runs this binary again with only test (leak_check/NAME), returning its
 * exit status and its stderr in *err. */
static int run_on_purpose(const char *test, char **err) {
  char self[1024];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  cr_assert_gt(n, 0, "cannot read /proc/self/exe");
  self[n] = '\0';
  /* BXFI_MAP marks a Criterion worker: without unsetting it the child would
   * take itself for one. */
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "env -u BXFI_MAP %s=1 %s --filter=leak_check/%s",
           LEAK_ON_PURPOSE_ENV, self, test);
  char *out = NULL;
  int status = harness_run(cmd, &out, err, 60);
  free(out);
  return status;
}

Test(leak_check, reported) {
  char *err = NULL;
  int status = run_on_purpose("leaks_on_purpose", &err);
  cr_expect_neq(status, 0, "a run whose test leaked exited 0");
  cr_expect(err && strstr(err, "ERROR: LeakSanitizer: detected memory leaks"),
            "no LeakSanitizer report: %s", err ? err : "(none)");
  cr_expect(err && strstr(err, "leak_check_leaks_on_purpose_impl"),
            "the report does not name the leaking test: %s", err ? err : "(none)");
  cr_expect(err && strstr(err, "in dist_connect "),
            "the report does not name the client libdist opened: %s", err ? err : "(none)");
  cr_expect(err && strstr(err, "[FAIL] leak_check::leaks_on_purpose"),
            "the leaking test did not fail: %s", err ? err : "(none)");
  free(err);
}

Test(leak_check, a_failed_check_in_fini_fails_the_test) {
  char *err = NULL;
  int status = run_on_purpose("fini_fails_on_purpose", &err);
  cr_expect_neq(status, 0, "a run whose test's .fini failed a check exited 0");
  cr_expect(err && strstr(err, "[FAIL] leak_check::fini_fails_on_purpose"),
            "the test whose .fini failed a check passed: %s", err ? err : "(none)");
  free(err);
}
