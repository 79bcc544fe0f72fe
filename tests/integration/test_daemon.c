/* The foundation, end to end: real daemons, libdist and distctl. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <sched.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>

#include "client_internal.h"
#include "harness.h"

/* What a daemon's data plane should say it uses here: io_uring when this
 * kernel lets a process set up a ring with the socket calls, asked
 * directly. */
static const char *expected_peer_io(void) {
  struct io_uring ring;
  if (io_uring_queue_init(4, &ring, 0) != 0) return NULL;
  struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
  int ok = probe && io_uring_opcode_supported(probe, IORING_OP_SEND) &&
           io_uring_opcode_supported(probe, IORING_OP_RECV);
  io_uring_free_probe(probe);
  io_uring_queue_exit(&ring);
  return ok ? "io_uring" : NULL;
}

static void expect_peer_io(const dist_daemon_info *info, const char *want) {
  if (want)
    cr_assert_str_eq(info->peer_io, want);
  else
    cr_assert(strncmp(info->peer_io, "system calls (io_uring: ", 24) == 0, "%s",
              info->peer_io);
}

Test(daemon, health_and_info_on_a_three_rank_cluster, .timeout = 60) {
  harness h;
  dist_client *c = harness_start_with_client(&h, 3, NULL);
  for (int r = 0; r < 3; r++) {
    cr_assert_eq(dist_health(c, r), 0, "%s", dist_errmsg(c));
    dist_daemon_info info;
    cr_assert_eq(dist_info(c, r, &info), 0, "%s", dist_errmsg(c));
    cr_assert_eq(info.rank, r);
    cr_assert_eq(info.world_size, 3);
    cr_assert_str_eq(info.version, "0.2.11");
    cr_assert_eq(info.npeers, 2);
    for (int p = 0; p < 2; p++) {
      cr_assert(info.peers[p].connected);
      cr_assert_str_eq(info.peers[p].congestion, "reno", "the default peer_congestion");
    }
    cr_assert(info.uptime_seconds > 0);
    expect_peer_io(&info, expected_peer_io());
    dist_info_free(&info);
  }
  dist_close(c);
  harness_stop(&h);
}

Test(daemon, peer_io_uring_false_makes_one_system_call_each_and_says_so, .timeout = 60) {
  harness h;
  const char *const args[] = {"--peer-io-uring=false", NULL};
  dist_client *c = harness_start_with_client(&h, 2, args);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 1, &info), 0, "%s", dist_errmsg(c));
  cr_assert_str_eq(info.peer_io, "system calls (io_uring turned off)");
  dist_info_free(&info);
  /* and the data plane works that way: Shard(0) -> Replicate() is an
   * all-gather between the two daemons */
  float v[5] = {1, 2, 3, 4, 5};
  int64_t shape[1] = {5};
  dist_mesh *m = NULL;
  dist_tensor *t = NULL;
  dist_placement s0 = DIST_SHARD_DIM(0), rep = DIST_REPLICATED;
  cr_assert_eq(dist_mesh_from_string("[0,1]", NULL, &m), 0);
  cr_assert_eq(dist_shard_tensor(c, "v", v, DIST_FLOAT32, 1, shape, m, &s0, &t), 0, "%s",
               dist_errmsg(c));
  cr_assert_eq(dist_reshard(c, t, NULL, &rep), 0, "%s", dist_errmsg(c));
  void *got = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_full_tensor(c, t, &got, &nbytes), 0, "%s", dist_errmsg(c));
  cr_assert_eq(nbytes, sizeof v);
  cr_assert_eq(memcmp(got, v, sizeof v), 0);
  free(got);
  dist_tensor_free(t);
  dist_mesh_free(m);
  dist_close(c);
  harness_stop(&h);
}

Test(daemon, unknown_method_is_unimplemented_at_once, .timeout = 60) {
  harness h;
  harness_start(&h, 1, NULL);
  dist_client *c = harness_client_rank(&h, 0, 10000);
  Dist__V1__InfoRequest rq = DIST__V1__INFO_REQUEST__INIT;
  ProtobufCMessage *rp = NULL;
  double t0 = harness_now_s();
  int rc = dist_call_one(c, 0, "/dist.v1.Dist/NoSuchMethod", &rq.base,
                         &dist__v1__info_reply__descriptor, &rp);
  cr_assert_eq(rc, DIST_ENOTSUP, "got %s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "NoSuchMethod"), "%s", dist_errmsg(c));
  cr_assert(harness_now_s() - t0 < 2.0, "UNIMPLEMENTED took %.1f s", harness_now_s() - t0);
  dist_close(c);
  harness_stop(&h);
}

Test(daemon, second_daemon_on_a_taken_port_fails_clearly, .timeout = 60) {
  harness h;
  harness_start(&h, 1, NULL);
  char cmd[1024], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --listen 127.0.0.1:%d --http-listen off --peers 127.0.0.1:%d",
           harness_distd(), h.grpc_port[0], harness_free_port());
  int rc = harness_run(cmd, &out, &err, 20);
  cr_assert_neq(rc, 0);
  cr_assert(strstr(err, "cannot listen on 127.0.0.1:"), "stderr: %s", err);
  free(out);
  free(err);
  harness_stop(&h);
}

Test(daemon, killed_peer_is_shown_down_and_reconnects, .timeout = 90) {
  harness h;
  harness_start(&h, 2, NULL);
  harness_kill(&h, 1, SIGKILL);
  cr_assert(harness_wait_connected(&h, 0, 0, 15000), "rank 1 never shown down");
  dist_client *c = harness_client_rank(&h, 0, 5000);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), 0, "rank 0 stopped serving: %s", dist_errmsg(c));
  cr_assert_eq(info.npeers, 1);
  cr_assert_not(info.peers[0].connected);
  dist_info_free(&info);
  dist_close(c);
  harness_start_rank(&h, 1, NULL);
  harness_assert_all_connected(&h, "after rank 1 restarted");
  harness_stop(&h);
}

Test(daemon, sigterm_gives_a_clean_exit, .timeout = 60) {
  harness h;
  harness_start(&h, 2, NULL);
  int status = harness_kill(&h, 0, SIGTERM);
  cr_assert(WIFEXITED(status), "distd did not exit on SIGTERM");
  cr_assert_eq(WEXITSTATUS(status), 0);
  harness_stop(&h);
}

Test(daemon, bad_config_exits_2_naming_file_and_line, .timeout = 30) {
  char path[] = "/tmp/distd-badconf-XXXXXX";
  int fd = mkstemp(path);
  const char *text = "listen = 127.0.0.1:0\nrnak = 3\n";
  cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  char cmd[1024], *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --config %s", harness_distd(), path);
  int rc = harness_run(cmd, NULL, &err, 10);
  cr_assert_eq(rc, 2);
  char want[128];
  snprintf(want, sizeof want, "%s:2", path);
  cr_assert(strstr(err, want) && strstr(err, "rnak"), "stderr: %s", err);
  free(err);
  snprintf(cmd, sizeof cmd, "%s --no-such-flag", harness_distd());
  rc = harness_run(cmd, NULL, &err, 10);
  cr_assert_eq(rc, 2);
  cr_assert(strstr(err, "no-such-flag"), "stderr: %s", err);
  free(err);
  unlink(path);
}

Test(daemon, congestion_control_the_kernel_lacks_stops_it_at_start, .timeout = 30) {
  char cmd[1024], *err = NULL;
  int port = harness_free_port(), peer_port = harness_free_port();
  snprintf(cmd, sizeof cmd, "%s --listen 127.0.0.1:%d --http-listen off --peers "
           "\"127.0.0.1:%d 127.0.0.1:%d\" --peer-congestion no-such-cc",
           harness_distd(), port, port, peer_port);
  cr_assert_eq(harness_run(cmd, NULL, &err, 10), 1);
  cr_assert(strstr(err, "peer_congestion 'no-such-cc'") && strstr(err, "reno"),
            "stderr: %s", err);
  free(err);
}

Test(distctl, dead_endpoint_gives_one_line_error_and_status_1, .timeout = 30) {
  char cmd[256], *out = NULL, *err = NULL;
  int port = harness_free_port();
  snprintf(cmd, sizeof cmd, "%s --endpoint 127.0.0.1:%d --timeout 2000 status",
           harness_distctl(), port);
  double t0 = harness_now_s();
  int rc = harness_run(cmd, &out, &err, 20);
  cr_assert_eq(rc, 1);
  char want[64];
  snprintf(want, sizeof want, "127.0.0.1:%d", port);
  cr_assert(strstr(err, want), "stderr: %s", err);
  cr_assert(harness_now_s() - t0 < 10, "took %.1f s", harness_now_s() - t0);
  free(out);
  free(err);
}

Test(distctl, cluster_up_status_json_and_down, .timeout = 120) {
  char dir[] = "/tmp/distctl-up-XXXXXX", cmd[512], *out = NULL, *err = NULL;
  cr_assert(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "%s/c", dir);
  harness_cluster_down_at_exit(cmd);
  snprintf(cmd, sizeof cmd, "%s cluster up -n 3 --dir %s/c", harness_distctl(), dir);
  cr_assert_eq(harness_run(cmd, NULL, &err, 60), 0, "cluster up: %s", err);
  free(err);
  snprintf(cmd, sizeof cmd, "DIST_CLUSTER=%s/c/cluster.conf %s status --json", dir,
           harness_distctl());
  cr_assert_eq(harness_run(cmd, &out, &err, 30), 0, "status: %s", err);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  cr_assert(j, "status --json is not JSON: %s\n%s", je.text, out);
  json_t *ranks = json_object_get(j, "ranks");
  cr_assert_eq(json_array_size(ranks), 3);
  for (size_t i = 0; i < 3; i++) {
    json_t *r = json_array_get(ranks, i);
    cr_assert(json_is_true(json_object_get(r, "healthy")), "rank %zu: %s", i, out);
    cr_assert_eq(json_integer_value(json_object_get(r, "peers_connected")), 2);
  }
  json_decref(j);
  free(out);
  free(err);
  snprintf(cmd, sizeof cmd, "%s cluster down --dir %s/c", harness_distctl(), dir);
  cr_assert_eq(harness_run(cmd, NULL, &err, 30), 0, "cluster down: %s", err);
  cr_assert(strstr(err, "stopped 3 daemons"), "%s", err);
  free(err);
  snprintf(cmd, sizeof cmd, "DIST_CLUSTER=%s/c/cluster.conf %s --timeout 1000 status",
           dir, harness_distctl());
  cr_assert_eq(harness_run(cmd, NULL, NULL, 30), 1, "daemons still answer after down");
  cr_assert_eq(harness_remove_dir(dir), 0);
}

/* distctl ARGS against cluster h: its exit status; stderr in *err. */
static int distctl_on(harness *h, char **err, const char *args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s --cluster %s %s", harness_distctl(), h->cluster_file, args);
  return harness_run(cmd, NULL, err, 60);
}

/* Exit 2 naming option and value; before, strtol without an end check and
 * atoi took "abc" as 0 (ignored), "-5" as "no timeout" and "2x" as 2. */
static void expect_bad_number(harness *h, const char *args, const char *option,
                              const char *value) {
  char *err = NULL;
  int rc = distctl_on(h, &err, args);
  if (rc == 0 && strstr(args, "cluster up")) { /* stop what the bug started */
    char down[600];
    snprintf(down, sizeof down, "%s cluster down --dir %s/up", harness_distctl(), h->dir);
    harness_run(down, NULL, NULL, 30);
  }
  cr_assert_eq(rc, 2, "distctl %s: exit %d: %s", args, rc, err);
  cr_assert(strstr(err, option) && strstr(err, value), "distctl %s: %s", args, err);
  free(err);
}

Test(distctl, bad_numbers_are_refused_naming_the_option_and_value, .timeout = 120) {
  harness h;
  harness_start(&h, 1, NULL);
  char args[600];
  expect_bad_number(&h, "--timeout abc status", "--timeout", "'abc'");
  expect_bad_number(&h, "--timeout=-5 status", "--timeout", "'-5'");
  expect_bad_number(&h, "status --timeout 10ms", "--timeout", "'10ms'");
  snprintf(args, sizeof args, "launch -n 2x --log-dir %s/log -- true", h.dir);
  expect_bad_number(&h, args, "-n", "'2x'");
  snprintf(args, sizeof args, "cluster up -n 2x --dir %s/up", h.dir);
  expect_bad_number(&h, args, "-n", "'2x'");
  snprintf(args, sizeof args, "%s/up", h.dir);
  cr_assert_neq(access(args, F_OK), 0, "cluster up made %s before refusing -n", args);
  expect_bad_number(&h, "tensor get t -o x.npy --rank 1z --local", "--rank", "'1z'");
  /* A good value still works. */
  char *err = NULL;
  cr_assert_eq(distctl_on(&h, &err, "--timeout 5000 status"), 0, "%s", err);
  free(err);
  harness_stop(&h);
}

/* The first line of a file (empty when missing); buf holds 256 bytes. */
static void first_line(const char *path, char *buf) {
  FILE *f = fopen(path, "r");
  buf[0] = 0;
  if (f && !fgets(buf, 256, f)) buf[0] = 0;
  if (f) fclose(f);
}

/* distctl cluster VERB --dir dir ARGS: its exit status; stderr in *err. */
static int cluster_cmd(const char *verb, const char *dir, const char *args, char **err) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s cluster %s --dir %s %s", harness_distctl(), verb, dir, args);
  return harness_run(cmd, NULL, err, 60);
}

/* A second cluster up into a directory whose cluster runs overwrote its
 * cluster.conf and pid files, orphaning the first daemons; a stale pid
 * file must not block a new one. */
Test(distctl, cluster_up_refuses_a_directory_whose_cluster_still_runs, .timeout = 120) {
  char dir[] = "/tmp/distctl-twice-XXXXXX", c[64], pid_path[128], conf_path[128];
  cr_assert(mkdtemp(dir));
  snprintf(c, sizeof c, "%s/c", dir);
  snprintf(pid_path, sizeof pid_path, "%s/distd.0.pid", c);
  snprintf(conf_path, sizeof conf_path, "%s/cluster.conf", c);
  char *err = NULL, pid_before[256], conf_before[256], pid_after[256], conf_after[256];
  harness_cluster_down_at_exit(c);
  cr_assert_eq(cluster_cmd("up", c, "-n 1", &err), 0, "cluster up: %s", err);
  free(err);
  first_line(pid_path, pid_before);
  first_line(conf_path, conf_before);
  pid_t first = (pid_t)atoi(pid_before);
  int rc = cluster_cmd("up", c, "-n 1", &err);
  first_line(pid_path, pid_after);
  first_line(conf_path, conf_after);
  if (rc == 0) { /* the bug orphaned the first daemon (ours): stop both */
    kill(first, SIGKILL);
    cluster_cmd("down", c, "", NULL);
  }
  cr_assert_neq(rc, 0, "a second cluster up over a running one succeeded");
  cr_assert(strstr(err, "already running") && strstr(err, "cluster down --dir"), "%s", err);
  char want[64];
  snprintf(want, sizeof want, "pids %d)", (int)first);
  cr_assert(strstr(err, want), "%s", err);
  free(err);
  cr_assert_str_eq(pid_after, pid_before, "the pid file was rewritten");
  cr_assert_str_eq(conf_after, conf_before, "cluster.conf was rewritten");
  cr_assert_eq(cluster_cmd("down", c, "", &err), 0, "cluster down: %s", err);
  cr_assert(strstr(err, "stopped 1 daemon"), "%s", err);
  free(err);
  cr_assert_neq(kill(first, 0), 0, "the first daemon still runs after down");
  /* A pid file naming a process that is no distd (this test) is stale. */
  FILE *f = fopen(pid_path, "w");
  cr_assert(f);
  fprintf(f, "%d\n", (int)getpid());
  fclose(f);
  cr_assert_eq(cluster_cmd("up", c, "-n 1", &err), 0, "up over a stale pid file: %s", err);
  free(err);
  cr_assert_eq(cluster_cmd("down", c, "", &err), 0, "cluster down: %s", err);
  free(err);
  cr_assert_eq(harness_remove_dir(dir), 0);
}

/* A pid file can outlive its daemon, and its pid be reused by another
 * cluster's distd: cluster down stopped that daemon, and cluster up
 * refused the directory as still running. A daemon counts as the
 * directory's only when its --cluster-file is the directory's, however
 * spelled (here with "/./" in it), its cluster.conf there or not. */
Test(distctl, a_pid_file_naming_another_clusters_distd_is_stale, .timeout = 120) {
  char dir[] = "/tmp/distctl-other-XXXXXX", a[64], b[64], spelled[80], line[256];
  cr_assert(mkdtemp(dir));
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(b, sizeof b, "%s/b", dir);
  harness_cluster_down_at_exit(a);
  char *err = NULL;
  cr_assert_eq(cluster_cmd("up", a, "-n 1", &err), 0, "cluster up: %s", err);
  free(err);
  char path[128];
  snprintf(path, sizeof path, "%s/distd.0.pid", a);
  first_line(path, line);
  pid_t other = (pid_t)atoi(line);
  cr_assert_gt(other, 0);
  /* b: a cluster whose daemon 0 died, and its pid now other's */
  cr_assert_eq(mkdir(b, 0755), 0);
  snprintf(path, sizeof path, "%s/distd.0.pid", b);
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fprintf(f, "%d\n", (int)other);
  fclose(f);
  int rc = cluster_cmd("down", b, "", &err);
  cr_assert_eq(rc, 0, "cluster down: %s", err);
  cr_assert(strstr(err, "stopped 0 daemons"), "%s", err);
  free(err);
  cr_assert_eq(kill(other, 0), 0, "cluster down of b stopped a's daemon %d", (int)other);
  /* a's cluster.conf gone: its daemon still names a file in a */
  char conf[128];
  snprintf(conf, sizeof conf, "%s/cluster.conf", a);
  cr_assert_eq(unlink(conf), 0);
  snprintf(spelled, sizeof spelled, "%s/./a", dir);
  cr_assert_eq(cluster_cmd("down", spelled, "", &err), 0, "cluster down: %s", err);
  cr_assert(strstr(err, "stopped 1 daemon"), "%s", err);
  free(err);
  cr_assert_eq(harness_remove_dir(dir), 0);
}

/* cluster down of a directory with no cluster said "stopped 0 daemons"
 * and exit 0, hiding a mistyped --dir. */
Test(distctl, cluster_down_without_a_cluster_fails_naming_the_directory, .timeout = 60) {
  char dir[] = "/tmp/distctl-nodown-XXXXXX", missing[64], *err = NULL;
  cr_assert(mkdtemp(dir));
  snprintf(missing, sizeof missing, "%s/nonexistent", dir);
  cr_assert_eq(cluster_cmd("down", missing, "", &err), 1, "%s", err);
  cr_assert(strstr(err, missing) && strstr(err, "no such directory"), "%s", err);
  free(err);
  cr_assert_eq(cluster_cmd("down", dir, "", &err), 1, "%s", err);
  cr_assert(strstr(err, "no cluster in") && strstr(err, "pid file"), "%s", err);
  free(err);
  cr_assert_eq(rmdir(dir), 0);
}

/* The CPUs a thread may run on, as /proc shows them ("0", "0-1"); out
 * holds 64 bytes. */
static void cpus_of_thread(pid_t pid, const char *tid, char *out) {
  char path[512], line[256];
  snprintf(path, sizeof path, "/proc/%d/task/%s/status", (int)pid, tid);
  FILE *f = fopen(path, "r");
  out[0] = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "Cpus_allowed_list: %63s", out) == 1) break;
  if (f) fclose(f);
}

Test(distctl, cluster_up_pin_keeps_every_thread_of_daemon_r_on_cpu_r, .timeout = 120) {
  cpu_set_t allowed;
  cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpus[CPU_SETSIZE], ncpu = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &allowed)) cpus[ncpu++] = c;
  char dir[] = "/tmp/distctl-pin-XXXXXX", cmd[512], *err = NULL;
  cr_assert(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "%s/c", dir);
  harness_cluster_down_at_exit(cmd);
  snprintf(cmd, sizeof cmd, "%s cluster up -n 3 --pin --dir %s/c", harness_distctl(), dir);
  cr_assert_eq(harness_run(cmd, NULL, &err, 60), 0, "cluster up: %s", err);
  free(err);
  for (int r = 0; r < 3; r++) {
    char path[600], want[16], got[64];
    snprintf(path, sizeof path, "%s/c/distd.%d.pid", dir, r);
    FILE *f = fopen(path, "r");
    int pid = 0;
    cr_assert(f && fscanf(f, "%d", &pid) == 1, "%s", path);
    fclose(f);
    snprintf(want, sizeof want, "%d", cpus[r % ncpu]);
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    cr_assert(d, "%s", path);
    int threads = 0;
    for (struct dirent *e; (e = readdir(d));) {
      if (e->d_name[0] == '.') continue;
      cpus_of_thread(pid, e->d_name, got);
      cr_assert_str_eq(got, want, "rank %d thread %s", r, e->d_name);
      threads++;
    }
    closedir(d);
    cr_assert_gt(threads, 3, "rank %d: every thread, not only the main one", r);
  }
  snprintf(cmd, sizeof cmd, "%s cluster down --dir %s/c", harness_distctl(), dir);
  cr_assert_eq(harness_run(cmd, NULL, NULL, 30), 0);
  cr_assert_eq(harness_remove_dir(dir), 0);
}

Test(distctl, a_cpu_affinity_the_daemon_may_not_use_is_refused_by_name) {
  char cmd[512], *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --cpu-affinity=%d", harness_distd(), CPU_SETSIZE - 1);
  cr_assert_eq(harness_run(cmd, NULL, &err, 20), 2);
  char want[64];
  snprintf(want, sizeof want, "CPU %d is not one this process may use", CPU_SETSIZE - 1);
  cr_assert(strstr(err, want), "%s", err);
  free(err);
  snprintf(cmd, sizeof cmd, "%s --cpu-affinity=0,,1", harness_distd());
  cr_assert_eq(harness_run(cmd, NULL, &err, 20), 2);
  cr_assert(strstr(err, "'0,,1' is not a CPU list"), "%s", err);
  free(err);
}

Test(distctl, launch_stops_everything_when_a_rank_fails, .timeout = 120) {
  char dir[] = "/tmp/distctl-launch-XXXXXX", cmd[512], *out = NULL, *err = NULL;
  cr_assert(mkdtemp(dir));
  /* Rank 1 fails at once; rank 0 would sleep for a minute if not stopped. */
  snprintf(cmd, sizeof cmd,
           "%s launch -n 2 --log-dir %s/log -- sh -c "
           "\"echo rank \\$DIST_RANK of \\$DIST_WORLD_SIZE; "
           "if [ \\$DIST_RANK = 1 ]; then exit 3; fi; sleep 60\"",
           harness_distctl(), dir);
  double t0 = harness_now_s();
  int rc = harness_run(cmd, &out, &err, 90);
  cr_assert_neq(rc, 0, "launch succeeded although rank 1 failed");
  cr_assert(harness_now_s() - t0 < 45, "the other rank was not stopped (%.0f s)", harness_now_s() - t0);
  cr_assert(strstr(out, "rank 0 of 2"), "rank 0's output is not on the console: %s", out);
  cr_assert(strstr(err, "rank 1 failed with status 3"), "%s", err);
  char path[600];
  snprintf(path, sizeof path, "%s/log/workerlog.1", dir);
  FILE *f = fopen(path, "r");
  cr_assert(f, "no %s", path);
  char line[128] = {0};
  cr_assert(fgets(line, sizeof line, f));
  cr_assert_str_eq(line, "rank 1 of 2\n");
  fclose(f);
  free(out);
  free(err);
  cr_assert_eq(harness_remove_dir(dir), 0);
}

/* The job id part after the time that `distctl launch` (pid 1 of its own
 * pid namespace, as in a container) gave its trainer; "" on failure. */
static void job_id_tail_of_a_launch_as_pid_1(const char *dir, const char *tag, char *out,
                                             size_t len) {
  char cmd[1024], *console = NULL;
  snprintf(cmd, sizeof cmd,
           "unshare -p -f --kill-child %s launch -n 1 --log-dir %s/%s -- sh -c "
           "\"echo \\$DIST_JOB_ID\"",
           harness_distctl(), dir, tag);
  out[0] = 0;
  cr_assert_eq(harness_run(cmd, &console, NULL, 60), 0, "launch %s failed: %s", tag,
               console ? console : "");
  const char *dash = strchr(console, '-');
  if (dash) snprintf(out, len, "%.*s", (int)strcspn(dash + 1, "\n"), dash + 1);
  free(console);
}

/* Trainers' op ids derive from DIST_JOB_ID. Two launches by a distctl that
 * is pid 1 each (containers) in the same second made the same job id
 * ("<time>-1"), so their trainers, sharing daemons, shared op ids. */
Test(distctl, launches_as_pid_1_give_different_job_ids, .timeout = 120) {
  char *err = NULL;
  if (harness_run("unshare -p -f --kill-child true", NULL, &err, 30) != 0)
    cr_skip_test("this machine refuses a pid namespace (unshare -p -f --kill-child: %s)",
                 err ? err : "");
  free(err);
  char dir[] = "/tmp/distctl-jobid-XXXXXX", a[64], b[64];
  cr_assert(mkdtemp(dir));
  job_id_tail_of_a_launch_as_pid_1(dir, "a", a, sizeof a);
  job_id_tail_of_a_launch_as_pid_1(dir, "b", b, sizeof b);
  cr_assert(a[0] && b[0], "no job id printed ('%s', '%s')", a, b);
  cr_assert_str_neq(a, b, "two launches as pid 1 made the same job id tail '%s'", a);
  cr_assert_eq(harness_remove_dir(dir), 0);
}

Test(daemon, metrics_endpoint_is_valid_prometheus_text, .timeout = 60) {
  harness h;
  dist_client *c = harness_start_with_client(&h, 2, NULL);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), 0);
  dist_info_free(&info);
  dist_close(c);
  char cmd[1024], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd,
           "curl -sf http://127.0.0.1:%d/metrics > %s/m.txt && "
           "promtool check metrics < %s/m.txt && cat %s/m.txt",
           h.http_port[0], h.dir, h.dir, h.dir);
  int rc = harness_run(cmd, &out, &err, 30);
  cr_assert_eq(rc, 0, "promtool: %s", err);
  cr_assert(strstr(out, "distd_rpc_requests_total{method=\"Info\",code=\"OK\"}"), "%s", out);
  cr_assert(strstr(out, "distd_peers_connected 1"), "%s", out);
  free(out);
  free(err);
  /* Both peers are connected, so the daemon is ready (curl -f: 2xx). */
  snprintf(cmd, sizeof cmd, "curl -sf http://127.0.0.1:%d/readyz", h.http_port[0]);
  cr_assert_eq(harness_run(cmd, &out, NULL, 10), 0, "readyz not 200: %s", out);
  free(out);
  harness_stop(&h);
}

/* 1 while pid runs; a zombie (killed, not yet reaped by init) is gone. */
static int process_alive(pid_t pid) {
  char path[64], state = 0;
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int ok = fscanf(f, "%*d (%*[^)]) %c", &state) == 1;
  fclose(f);
  return ok && state != 'Z' && state != 'X';
}

/* A test that fails an assertion never reaches harness_stop: its daemons
 * must still die with it, not run on after the suite. */
Test(daemon, daemons_die_with_a_test_process_that_never_stopped_them, .timeout = 60) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t test_process = fork();
  cr_assert(test_process >= 0);
  if (test_process == 0) {
    harness h;
    harness_start(&h, 1, NULL);
    ssize_t n = write(fds[1], &h, sizeof h);
    _exit(n == (ssize_t)sizeof h ? 0 : 1);
  }
  close(fds[1]);
  harness h;
  struct pollfd pfd = {fds[0], POLLIN, 0};
  ssize_t n = poll(&pfd, 1, 30000) == 1 ? read(fds[0], &h, sizeof h) : -1;
  close(fds[0]);
  if (n != (ssize_t)sizeof h) kill(test_process, SIGKILL);
  int status;
  cr_assert_eq(waitpid(test_process, &status, 0), test_process);
  cr_assert_eq(n, (ssize_t)sizeof h, "the child test process did not start its daemon");
  cr_assert(h.pids[0] > 0);
  int alive = 1;
  for (int waited = 0; alive && waited < 10000; waited += 20) {
    alive = process_alive(h.pids[0]);
    if (alive) harness_sleep_ms(20);
  }
  if (alive) kill(h.pids[0], SIGKILL); /* we started it, and it must not stay */
  cr_expect_eq(harness_remove_dir(h.dir), 0);
  cr_assert(!alive, "distd %d still runs 10 s after its test process exited", (int)h.pids[0]);
}

/* The daemons `distctl cluster up` starts run in a session of their own:
 * a test killed before its `cluster down` (Criterion's or meson's
 * timeout) left them running after the suite. harness_cluster_down_at_exit
 * stops them once the test process is gone, however it went. */
Test(daemon, cluster_up_daemons_stop_when_their_test_process_is_killed, .timeout = 90) {
  char dir[] = "/tmp/distctl-orphan-XXXXXX", c[64], pid_path[128], line[256];
  cr_assert(mkdtemp(dir));
  snprintf(c, sizeof c, "%s/c", dir);
  snprintf(pid_path, sizeof pid_path, "%s/distd.0.pid", c);
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t test_process = fork();
  cr_assert(test_process >= 0);
  if (test_process == 0) {
    setpgid(0, 0); /* so that a kill of its group also stops a cluster up under way */
    close(fds[0]);
    harness_cluster_down_at_exit(c);
    char up = cluster_cmd("up", c, "-n 1", NULL) == 0 ? 'y' : 'n';
    if (write(fds[1], &up, 1) != 1) _exit(1);
    pause(); /* killed here, as a timeout kills a test */
    _exit(1);
  }
  close(fds[1]);
  char up = 0;
  struct pollfd pfd = {fds[0], POLLIN, 0};
  ssize_t n = poll(&pfd, 1, 60000) == 1 ? read(fds[0], &up, 1) : -1;
  close(fds[0]);
  kill(-test_process, SIGKILL);
  kill(test_process, SIGKILL); /* had it not made its group yet */
  cr_assert_eq(waitpid(test_process, NULL, 0), test_process);
  first_line(pid_path, line);
  pid_t daemon = (pid_t)atoi(line);
  cr_assert(n == 1 && up == 'y' && daemon > 0, "the child test process did not start its cluster");
  int alive = 1;
  for (int waited = 0; alive && waited < 10000; waited += 20) {
    alive = process_alive(daemon);
    if (alive) harness_sleep_ms(20);
  }
  if (alive) kill(daemon, SIGKILL); /* our child started it, and it must not stay */
  cr_expect_eq(harness_remove_dir(dir), 0);
  cr_assert(!alive, "distd %d still runs 10 s after its test process was killed", (int)daemon);
}
