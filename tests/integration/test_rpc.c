/* The control plane's account of a call: what a daemon logs and counts for
 * a call its client gave up on while the daemon was frozen (SIGSTOP), and
 * how a client's errors name the daemon they come from. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_fixture.h"

TestSuite(rpc, .fini = stop_cluster, .timeout = 120);

#define GIVEN_UP 4

/* Calls its client gave up on while their daemon was frozen reach the
 * daemon once it runs again. gRPC hands some over without their request
 * (the client's cancellation came in with it), with a deadline counted
 * from when the daemon read them; those used to fail as malformed
 * requests (EINVAL, counted INVALID_ARGUMENT, logged at debug only).
 * Others keep their request, and their deadline has passed (gRPC reads
 * the clock of before the freeze). Either way no handler runs, and the
 * daemon logs and counts each as cancelled or expired. */
Test(rpc, calls_given_up_while_their_daemon_was_frozen_are_counted_as_cancelled) {
  harness_start(&cluster, 1, NULL);
  dist_client *c = harness_client_rank(&cluster, 0, 300);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), 0, "%s", dist_errmsg(c)); /* the channel is up */
  dist_info_free(&info);
  long from = harness_log_size(&cluster, 0);
  cr_assert(harness_freeze(&cluster, 0, 5000), "rank 0 did not stop");
  for (int i = 0; i < GIVEN_UP; i++) {
    int rc = dist_info(c, 0, &info);
    cr_assert_eq(rc, DIST_ETIMEDOUT, "Info to a frozen daemon: %s", dist_errmsg(c));
  }
  harness_sleep_ms(200); /* the client's last cancellation is on its way */
  kill(cluster.pids[0], SIGCONT);
  const char *const told[] = {"rpc Info not run: ", NULL};
  cr_expect(harness_log_wait(&cluster, 0, from, told, 10000),
            "the daemon did not log the Info calls as not run");
  char *m = NULL;
  long cancelled = 0, expired = 0;
  for (double until = harness_now_s() + 10; !m || (cancelled + expired < GIVEN_UP &&
                                                   harness_now_s() < until);) {
    free(m);
    harness_sleep_ms(50); /* the last calls may still be on their way out */
    m = harness_metrics(&cluster, 0);
    cancelled = (long)harness_rpc_count(m, "Info", "CANCELLED");
    expired = (long)harness_rpc_count(m, "Info", "DEADLINE_EXCEEDED");
  }
  cr_log_info("%ld cancelled, %ld expired", cancelled, expired);
  cr_expect_eq(cancelled + expired, GIVEN_UP, "not every call given up on is counted as "
               "cancelled or expired:\n%s", m);
  cr_expect_eq(harness_rpc_count(m, "Info", "INVALID_ARGUMENT"), 0,
               "a cancelled call counted as a bad request:\n%s", m);
  const char *const no_request[] = {"rpc Info not run: ECANCELED: no request arrived", NULL};
  if (cancelled)
    cr_expect(harness_log_wait(&cluster, 0, from, no_request, 10000),
              "the daemon did not log a call as cancelled");
  free(m);
  dist_close(c);
}

/* A client of one endpoint does not know the rank of the daemon there: it
 * used to label rank 1's daemon "rank 0 (ADDR)", its own position, next to
 * a message of that daemon's that may name the real rank 0. It names the
 * daemon by its address; a client of the cluster file keeps "rank R". */
Test(rpc, a_client_of_one_daemon_names_it_by_its_address) {
  harness_start(&cluster, 2, NULL);
  char want[96], old[96];
  snprintf(want, sizeof want, "distd at 127.0.0.1:%d: ", cluster.grpc_port[1]);
  snprintf(old, sizeof old, "rank 0 (127.0.0.1:%d)", cluster.grpc_port[1]);
  dist_client *one = harness_client_rank(&cluster, 1, 5000);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(one, "absent", &t), DIST_ENOTFOUND, "%s", dist_errmsg(one));
  cr_expect(strncmp(dist_errmsg(one), want, strlen(want)) == 0 &&
                !strstr(dist_errmsg(one), old),
            "rank 1's daemon is not named by its address: %s", dist_errmsg(one));
  dist_close(one);
  dist_client *all = harness_client(&cluster);
  snprintf(want, sizeof want, "rank 0 (127.0.0.1:%d): ", cluster.grpc_port[0]);
  cr_assert_eq(dist_tensor_open(all, "absent", &t), DIST_ENOTFOUND, "%s", dist_errmsg(all));
  cr_expect(strncmp(dist_errmsg(all), want, strlen(want)) == 0,
            "a client of the cluster does not name rank 0: %s", dist_errmsg(all));
  dist_close(all);
}

/* distctl --endpoint names the daemon it cannot reach by its address
 * alone, not as "rank 0". */
Test(rpc, distctl_with_one_endpoint_does_not_call_its_daemon_rank_0) {
  int port = harness_free_port(); /* nobody listens there */
  char cmd[400], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --endpoint 127.0.0.1:%d --timeout 2000 params",
           harness_distctl(), port);
  int rc = harness_run(cmd, &out, &err, 30);
  cr_assert_eq(rc, 1, "distctl params exited %d: %s", rc, err ? err : "");
  char want[96];
  snprintf(want, sizeof want, "distctl: cannot reach distd at 127.0.0.1:%d", port);
  cr_expect(err && strstr(err, want) && !strstr(err, "rank 0"), "%s", err ? err : "");
  free(out);
  free(err);
}

/* A client of one endpoint learns its daemon's rank from the daemon's
 * Info reply where libdist names that rank: it used to give its own
 * position, 0, for rank 1's daemon (a parameter report's rank), and a
 * save through it wrote a manifest listing rank 1's file as rank 0's. */
Test(rpc, a_client_of_one_daemon_names_it_by_its_own_rank) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 5000);
  dist_params_report rep;
  cr_assert_eq(dist_params(one, 0, &rep), 0, "%s", dist_errmsg(one));
  cr_expect_eq(rep.rank, 1, "rank 1's daemon reported as rank %d", rep.rank);
  dist_params_report_free(&rep);
  char dir[300];
  snprintf(dir, sizeof dir, "%s/ckpt", cluster.dir);
  int rc = dist_checkpoint_save(one, dir, NULL, NULL);
  cr_expect_eq(rc, DIST_ENOTSUP, "a save through rank 1's daemon alone: %d (%s)", rc,
               dist_errmsg(one));
  cr_expect(strstr(dist_errmsg(one), "which is rank 1"), "%s", dist_errmsg(one));
  cr_expect_eq(harness_count_files(dir, "", ".safetensors"), 0, "the refused save wrote");
  dist_close(one);
}

/* Asking the rank of a daemon that cannot be reached fails alone: connect
 * does not wait for the daemon, as before, and the client's error stays
 * the last call's. */
Test(rpc, the_rank_of_a_daemon_that_cannot_be_reached_is_unknown) {
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", harness_free_port()); /* nobody listens */
  dist_opts o = DIST_OPTS_INIT;
  o.timeout_ms = 2000;
  dist_client *c = NULL;
  cr_assert_eq(dist_connect(ep, &o, &c), 0, "%s", dist_last_connect_error());
  cr_expect_eq(dist_daemon_rank(c, 0), -1);
  cr_expect_str_eq(dist_errmsg(c), "", "asking the rank left an error: %s", dist_errmsg(c));
  dist_params_report rep;
  cr_assert_eq(dist_params(c, 0, &rep), DIST_EUNAVAIL, "%s", dist_errmsg(c));
  cr_expect(strstr(dist_errmsg(c), "cannot reach distd at "), "%s", dist_errmsg(c));
  dist_close(c);
}

/* distctl --endpoint shows its daemon's rank in status, peers and experts;
 * their tables gave rank 1's daemon as 0 (status --json had its rank). */
Test(rpc, distctl_with_one_endpoint_shows_its_daemon_rank) {
  harness_start(&cluster, 2, NULL);
  char cmd[400], *out = NULL, *err = NULL, want[96];
  const char *const runs[] = {"status --json", "status", "peers --json", "peers", "experts"};
  const char *const wants[] = {"\"rank\": 1,", "1     127.0.0.1:%d ", "\"from\": 1",
                               "\n1     0     connected", "\n1     -       (no expert"};
  for (int i = 0; i < 5; i++) {
    snprintf(cmd, sizeof cmd, "%s --endpoint 127.0.0.1:%d %s", harness_distctl(),
             cluster.grpc_port[1], runs[i]);
    int rc = harness_run(cmd, &out, &err, 30);
    cr_assert_eq(rc, 0, "distctl %s exited %d: %s", runs[i], rc, err ? err : "");
    snprintf(want, sizeof want, wants[i], cluster.grpc_port[1]);
    cr_expect(out && strstr(out, want), "distctl %s does not show rank 1:\n%s", runs[i],
              out ? out : "");
    free(out);
    free(err);
  }
}

/* A trainer whose cluster file lists the daemons in another order than
 * theirs would address rank 1's daemon as its own rank 0's: it is told at
 * dist_init_from_env, naming both ranks. */
Test(rpc, a_trainer_whose_cluster_file_swaps_the_daemons_is_refused) {
  harness_start(&cluster, 2, NULL);
  char path[320];
  snprintf(path, sizeof path, "%s/swapped.conf", cluster.dir);
  FILE *f = fopen(path, "w");
  cr_assert(f, "cannot write %s", path);
  for (int r = 1; r >= 0; r--)
    fprintf(f, "127.0.0.1:%d 127.0.0.1:%d\n", cluster.grpc_port[r], cluster.peer_port[r]);
  fclose(f);
  setenv("DIST_RANK", "0", 1);
  setenv("DIST_WORLD_SIZE", "2", 1);
  setenv("DIST_CLUSTER", path, 1);
  dist_client *c = NULL;
  cr_assert_eq(dist_init_from_env(&c), DIST_EINVAL, "a swapped cluster file was taken");
  cr_expect_null(c);
  const char *why = dist_last_connect_error();
  cr_expect(strstr(why, "DIST_RANK=0") && strstr(why, "says it is rank 1 of 2"), "%s", why);
  setenv("DIST_CLUSTER", cluster.cluster_file, 1);
  cr_assert_eq(dist_init_from_env(&c), 0, "%s", dist_last_connect_error());
  dist_close(c);
}

/* A trainer started before its daemon: dist_init_from_env's question of
 * the daemon's rank goes unanswered, and must not make the first call
 * fail once the daemon is up. Asked on the trainer's own channel, it left
 * that channel in gRPC's reconnect backoff (about a second), in which the
 * call failed at once. */
Test(rpc, a_trainer_started_before_its_daemon_reaches_it_once_up) {
  harness_start(&cluster, 1, NULL);
  harness_kill(&cluster, 0, SIGKILL);
  setenv("DIST_RANK", "0", 1);
  setenv("DIST_WORLD_SIZE", "1", 1);
  setenv("DIST_CLUSTER", cluster.cluster_file, 1);
  dist_client *c = NULL;
  cr_assert_eq(dist_init_from_env(&c), 0, "%s", dist_last_connect_error());
  harness_start_rank(&cluster, 0, NULL);
  cr_assert(harness_wait_connected(&cluster, 0, 0, 20000), "rank 0 did not come back");
  dist_params_report rep;
  cr_assert_eq(dist_params(c, 0, &rep), 0, "the first call: %s", dist_errmsg(c));
  dist_params_report_free(&rep);
  dist_close(c);
}

static void *resume_after_1500_ms(void *pid) {
  harness_sleep_ms(1500);
  kill(*(pid_t *)pid, SIGCONT);
  return NULL;
}

/* A save through rank 1's daemon alone is refused also when the daemon
 * is slow to say its rank: it went ahead when the quick question (1 s)
 * went unanswered, wrote a manifest listing rank 1's file as rank 0's,
 * and its commit removed the checkpoint's other files. */
Test(rpc, a_save_through_a_slow_daemon_of_rank_1_is_refused_too) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  char dir[300];
  snprintf(dir, sizeof dir, "%s/ckpt", cluster.dir);
  cr_assert(harness_freeze(&cluster, 1, 5000), "rank 1 did not stop");
  pthread_t resumer;
  pthread_create(&resumer, NULL, resume_after_1500_ms, &cluster.pids[1]);
  int rc = dist_checkpoint_save(one, dir, NULL, NULL);
  pthread_join(resumer, NULL);
  cr_expect_eq(rc, DIST_ENOTSUP, "a save through slow rank 1: %d (%s)", rc, dist_errmsg(one));
  cr_expect(strstr(dist_errmsg(one), "which is rank 1"), "%s", dist_errmsg(one));
  cr_expect_eq(harness_count_files(dir, "", ".safetensors"), 0, "the refused save wrote");
  dist_close(one);
}

/* Right after a call to its daemon went unanswered, a client of one
 * endpoint does not ask the daemon its rank: the question waited a second
 * more for nothing. Later it asks again, and a daemon that came back
 * answers it. */
Test(rpc, the_rank_of_a_daemon_that_just_did_not_answer_is_not_asked) {
  harness_start(&cluster, 2, NULL);
  /* Over the question's second: it waited the whole second before. */
  dist_client *one = harness_client_whose_call_went_unanswered(&cluster, 1, 1500);
  double t0 = harness_now_s();
  cr_expect_eq(dist_daemon_rank(one, 0), -1);
  double t = harness_now_s() - t0;
  cr_expect(t < 0.5, "asking the rank took %.2f s after a call that went unanswered", t);
  cr_expect(strstr(dist_errmsg(one), "no answer from distd at"), "%s", dist_errmsg(one));
  kill(cluster.pids[1], SIGCONT);
  harness_sleep_ms(1200); /* past the second in which it is not asked */
  cr_expect_eq(dist_daemon_rank(one, 0), 1, "the daemon back is not asked again");
  dist_close(one);
}

/* Rank 0's daemon killed under a client of the cluster, whose next call
 * fails unanswered (the channel then sits in gRPC's TRANSIENT_FAILURE). */
static dist_client *client_of_a_killed_daemon(void) {
  harness_start(&cluster, 1, NULL);
  dist_client *c = harness_client(&cluster);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), 0, "%s", dist_errmsg(c)); /* the channel is up */
  dist_info_free(&info);
  harness_kill(&cluster, 0, SIGKILL);
  return c;
}

/* c calls rank 0's daemon, down, every 50 ms for `seconds`, as a trainer
 * retrying would: each call must fail at once, unanswered, naming it. */
static void expect_fast_failures_for(dist_client *c, double seconds) {
  char want[64];
  snprintf(want, sizeof want, "cannot reach distd at 127.0.0.1:%d", cluster.grpc_port[0]);
  for (double until = harness_now_s() + seconds; harness_now_s() < until; harness_sleep_ms(50)) {
    dist_daemon_info info;
    double t0 = harness_now_s();
    int rc = dist_info(c, 0, &info);
    double t = harness_now_s() - t0;
    cr_assert_eq(rc, DIST_EUNAVAIL, "Info to a daemon down: %s", dist_errmsg(c));
    cr_assert(strstr(dist_errmsg(c), want), "%s", dist_errmsg(c));
    cr_assert(t < 0.5, "a call to a daemon down failed after %.2f s", t);
  }
}

/* Waits (bounded, 20 s) until rank r's /readyz answers 200, asked by
 * curl: the calls of a client in this process (harness_wait_connected's)
 * would poll gRPC's sockets, the test client's connect among them, and
 * reach the daemon for it. */
static void wait_ready_from_outside(int r) {
  char cmd[120];
  snprintf(cmd, sizeof cmd, "curl -sf --max-time 1 http://127.0.0.1:%d/readyz",
           cluster.http_port[r]);
  for (double until = harness_now_s() + 20; harness_now_s() < until; harness_sleep_ms(50))
    if (harness_run(cmd, NULL, NULL, 5) == 0) return;
  cr_assert_fail("rank %d was not ready within 20 s", r);
}

/* A client that outlives its daemon's restart (down for 3 s, its calls
 * failing meanwhile) reaches it as soon as it is back. A call on a
 * channel in TRANSIENT_FAILURE failed at once without polling it, and
 * gRPC saw its connect to the daemon back only at its backup poll, every
 * 5 s: 5 to 10 s of "cannot reach distd" after the daemon was serving (a
 * trainer through a systemd or pod restart). */
Test(rpc, a_client_reaches_its_daemon_restarted_within_two_seconds) {
  dist_client *c = client_of_a_killed_daemon();
  expect_fast_failures_for(c, 3);
  harness_start_rank(&cluster, 0, NULL);
  wait_ready_from_outside(0);
  double t0 = harness_now_s(), t = 0;
  dist_daemon_info info;
  int rc = -1;
  while (rc != 0 && (t = harness_now_s() - t0) < 15) {
    rc = dist_info(c, 0, &info);
    if (rc != 0) harness_sleep_ms(50);
  }
  cr_assert_eq(rc, 0, "the daemon back was not reached in 15 s: %s", dist_errmsg(c));
  dist_info_free(&info);
  cr_expect(t < 2.5, "the daemon back was reached %.2f s after it served", t);
  dist_close(c);
}

/* Calls to a daemon that stays down still fail at once, also after the
 * first (before each, libdist connects the failed channel again). */
Test(rpc, calls_to_a_daemon_that_stays_down_fail_at_once) {
  dist_client *c = client_of_a_killed_daemon();
  expect_fast_failures_for(c, 1);
  dist_close(c);
}
