/* The inspection verbs with a rank that does not answer: a frozen daemon
 * (SIGSTOP: its port accepts, nothing replies) and a short --timeout.
 * Every table shows it as one "down" row, every --json counts it in
 * "down", and the verbs stay bounded by the timeout. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_fixture.h"

#define TIMEOUT_MS 1500

/* Rank 1 of two frozen; resumed before teardown so it stops cleanly. */
static void start_with_rank1_frozen(void) {
  harness_start(&cluster, 2, NULL);
  cr_assert(harness_freeze(&cluster, 1, 10000), "rank 1 never stopped");
}

/* Ranks 1 and 2 of three frozen: asked one after the other, a sample
 * would wait the timeout twice. */
static void start_with_two_frozen(void) {
  harness_start(&cluster, 3, NULL);
  cr_assert(harness_freeze(&cluster, 1, 10000), "rank 1 never stopped");
  cr_assert(harness_freeze(&cluster, 2, 10000), "rank 2 never stopped");
}

/* stop_cluster resumes the frozen ranks first. */
TestSuite(inspect_down, .init = start_with_rank1_frozen, .fini = stop_cluster,
          .timeout = 120);

/* Runs `distctl ARGS` against the cluster with the short timeout; expects
 * exit 1 (a rank down) and rank 1 named; returns stdout, and the seconds
 * it took. */
static char *distctl_down(const char *args, double *seconds) {
  char cmd[1024], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s --timeout %d %s", harness_distctl(),
           cluster.cluster_file, TIMEOUT_MS, args);
  double t0 = harness_now_s();
  int rc = harness_run(cmd, &out, &err, 60);
  if (seconds) *seconds = harness_now_s() - t0;
  cr_assert_eq(rc, 1, "distctl %s exited %d: %s", args, rc, err ? err : "");
  cr_assert((err && strstr(err, "rank 1")) || (out && strstr(out, "rank 1")),
            "distctl %s did not name rank 1: %s", args, err ? err : "");
  free(err);
  return out ? out : strdup("");
}

/* The table's line for rank 1: "1", then (status only) its endpoint, then
 * "down" and why. NULL when there is none. */
static const char *down_row(const char *table, const char *endpoint) {
  char want[128];
  snprintf(want, sizeof want, "\n1     %s%sdown ", endpoint ? endpoint : "",
           endpoint ? " " : "");
  return strstr(table, want);
}

/* ops, experts and params left a rank that did not answer out of their
 * table (only stderr named it); status and top showed it down. */
Test(inspect_down, every_table_shows_a_down_row_for_the_rank) {
  char endpoint[64];
  snprintf(endpoint, sizeof endpoint, "127.0.0.1:%-12d", cluster.grpc_port[1]);
  const char *verbs[] = {"ops", "experts", "params", "top --iterations 1", "status"};
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    char *out = distctl_down(verbs[i], NULL);
    int is_status = strcmp(verbs[i], "status") == 0;
    cr_assert(down_row(out, is_status ? endpoint : NULL),
              "distctl %s shows no down row for rank 1:\n%s", verbs[i], out);
    cr_assert(!strstr(out, "\n0     down"), "distctl %s shows rank 0 down:\n%s", verbs[i], out);
    free(out);
  }
}

/* Their --json names the rank that did not answer and counts it in
 * "down" (top's had no such count). */
Test(inspect_down, json_counts_the_rank_down_and_says_why) {
  const char *verbs[] = {"ops --json", "experts --json", "params --json", "status --json",
                         "top --json --interval 0.2"};
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    char *out = distctl_down(verbs[i], NULL);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "distctl %s printed no JSON: %s", verbs[i], out);
    cr_assert_eq(json_integer_value(json_object_get(j, "down")), 1, "%s: %s", verbs[i], out);
    json_t *r1 = json_array_get(json_object_get(j, "ranks"), 1);
    cr_assert(json_string_value(json_object_get(r1, "error")), "%s: %s", verbs[i], out);
    json_decref(j);
    free(out);
  }
}

/* top --json takes two samples (its rates are over one --interval), and
 * asked the ranks one after the other: with ranks 1 and 2 frozen it
 * waited the timeout four times (about 6 s here) where one sample of
 * ranks asked together waits it once. */
Test(inspect_down, top_waits_one_timeout_per_sample, .init = start_with_two_frozen) {
  double t, timeout = TIMEOUT_MS / 1e3;
  free(distctl_down("top --iterations 1", &t));
  cr_assert(t < 1.8 * timeout, "one sample took %.2f s with a timeout of %.1f s", t, timeout);
  char *out = distctl_down("top --json --interval 0.2", &t);
  cr_assert(t < 3.3 * timeout, "two samples took %.2f s with a timeout of %.1f s", t, timeout);
  json_t *j = json_loads(out, 0, NULL);
  cr_assert(j && json_integer_value(json_object_get(j, "down")) == 2, "%s", out);
  json_decref(j);
  free(out);
}

/* status, peers, ops, experts and params asked their ranks one after the
 * other: with ranks 1 and 2 frozen each waited the timeout twice. Asked
 * at once, they wait it once. The bounds sit between the two, with room
 * for a slow start under ASan on a loaded machine. */
Test(inspect_down, every_verb_waits_one_timeout_for_all_ranks_down,
     .init = start_with_two_frozen) {
  const char *verbs[] = {"status", "peers", "ops", "experts", "params"};
  double t, timeout = TIMEOUT_MS / 1e3;
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    free(distctl_down(verbs[i], &t));
    cr_assert(t < 1.8 * timeout, "distctl %s took %.2f s with a timeout of %.1f s", verbs[i],
              t, timeout);
  }
}

/* distctl --endpoint of a frozen daemon: the verb's call to it fails at
 * the deadline, and the table or --json then names its rank. libdist
 * asked the daemon for that rank aside, waiting a second more that it
 * could not answer either, once per place naming the rank: status took
 * the timeout plus 1 s, ops the timeout plus 2 s. The aside now waits
 * at least a second, so the old code took the timeout plus 1 s or more;
 * the bound leaves 0.8 s for distctl's start and gRPC's set-up on a
 * loaded machine under ASan (measured: 0.03-0.2 s). */
Test(inspect_down, endpoint_of_a_frozen_daemon_waits_one_timeout_not_one_more_second) {
  const char *verbs[] = {"status", "status --json", "peers", "ops", "ops --json", "experts",
                         "params", "top --iterations 1"};
  double timeout = TIMEOUT_MS / 1e3;
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    char cmd[512], *out = NULL, *err = NULL, want[64];
    snprintf(cmd, sizeof cmd, "%s --endpoint 127.0.0.1:%d --timeout %d %s", harness_distctl(),
             cluster.grpc_port[1], TIMEOUT_MS, verbs[i]);
    double t0 = harness_now_s();
    int rc = harness_run(cmd, &out, &err, 60);
    double t = harness_now_s() - t0;
    cr_assert_eq(rc, 1, "distctl %s exited %d: %s", verbs[i], rc, err ? err : "");
    snprintf(want, sizeof want, "no answer from distd at 127.0.0.1:%d", cluster.grpc_port[1]);
    cr_assert((err && strstr(err, want)) || (out && strstr(out, want)), "distctl %s: %s%s",
              verbs[i], out ? out : "", err ? err : "");
    cr_assert(t < timeout + 0.8, "distctl --endpoint %s took %.2f s with a timeout of %.1f s",
              verbs[i], t, timeout);
    free(out);
    free(err);
  }
}
