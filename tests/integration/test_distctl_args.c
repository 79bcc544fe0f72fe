/* distctl's command lines: every option is taken once (a repeated one is
 * refused naming it, exit 2, where the last value used to win silently
 * and a flag was taken twice), a missing or bad value is a usage error
 * naming the option, per-rank failures name the rank once, and the verbs
 * that change tensors or clusters, and launch, print their result with
 * --json. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "harness_fixture.h"

TestSuite(distctl_args, .fini = stop_cluster, .timeout = 120);

/* Starts the suite's cluster of n daemons, with a cluster id of its own
 * (what: the test's word for it). */
static void start_cluster(int n, const char *what) {
  char prefix[32];
  snprintf(prefix, sizeof prefix, "distctl-%s", what);
  harness_start_unique(&cluster, n, prefix, NULL);
}

/* Runs `distctl ARGS` (no cluster needed for usage errors: --endpoint
 * points nowhere); asserts its exit status and that stderr says want. */
static void expect_exit(const char *args, int want_rc, const char *want) {
  char cmd[2048], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --endpoint 127.0.0.1:1 %s", harness_distctl(),
           args);
  int rc = harness_run(cmd, &out, &err, 30);
  cr_assert_eq(rc, want_rc, "distctl %s exited %d, not %d: %s", args, rc, want_rc,
               err ? err : "");
  cr_assert(err && strstr(err, want), "distctl %s said '%s', not '%s'", args, err ? err : "",
            want);
  free(out);
  free(err);
}

Test(distctl_args, a_repeated_option_is_refused_naming_it_in_every_command) {
  const char *const cases[][2] = {
      {"param tune w --lr 0.1 --lr 0.2", "option --lr given twice ('0.1', then '0.2')"},
      {"param tune w --eps=1 --eps 2", "option --eps given twice"},
      {"ops --recent 1 --recent 2", "option --recent given twice"},
      {"metrics --rank 0 --rank=1", "option --rank given twice"},
      {"top --interval 1 --interval 2", "option --interval given twice"},
      {"tensor put w w.npy --mesh \"[0]\" --mesh \"[1]\" --placements \"Replicate()\"",
       "option --mesh given twice"},
      {"tensor get w -o a.npy --output b.npy", "option --output given twice"},
      {"checkpoint save /tmp/c --tensors a --tensors b", "option --tensors given twice"},
      {"cluster up -n 2 -n 3 --dir /tmp/x", "option -n given twice"},
      {"cluster down --dir a --dir b", "option --dir given twice"},
      {"launch -n 1 --log-dir a --log-dir b -- true", "option --log-dir given twice"},
      {"--timeout 5 --timeout 6 status", "distctl: option --timeout given twice"},
      {"--cluster a --cluster b status", "distctl: option --cluster given twice"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_exit(cases[i][0], 2, cases[i][1]);
}

/* A flag given twice was taken (since session 29 it is refused as an
 * option with a value is): the global --json before or after the verb,
 * and each verb's own flags. */
Test(distctl_args, a_repeated_flag_is_refused_naming_it_as_a_repeated_option_is) {
  const char *const cases[][2] = {
      {"status --json --json", "distctl: option --json given twice"},
      {"--json peers --json", "distctl: option --json given twice"},
      {"tensor get w --rank 0 --local -o w.npy --local",
       "distctl tensor get: option --local given twice"},
      {"cluster up -n 1 --pin --dir /tmp/none --pin",
       "distctl cluster up: option --pin given twice"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_exit(cases[i][0], 2, cases[i][1]);
}

Test(distctl_args, missing_and_bad_values_are_usage_errors_naming_the_option) {
  const char *const cases[][2] = {
      {"ops --recent", "option --recent needs a value"},
      {"ops --recent x", "bad --recent 'x': an integer from 0 to 256"},
      {"ops --bogus", "unknown argument '--bogus'"},
      {"metrics --rank -1", "bad --rank '-1'"},
      {"top --interval 0.01", "bad --interval '0.01'"},
      {"top --iterations", "option --iterations needs a value"},
      {"param tune w --lr nan", "--lr takes a finite number, not 'nan'"},
      {"param tune w --lr", "option --lr needs a value"},
      {"cluster up --dir /tmp/x", "-n N is required"},
      {"tensor get w", "-o OUT.npy is required"},
      {"tensor put w w.npy --mesh \"[0]\"", "--placements P is required"},
      {"launch -n 0 -- true", "bad -n '0'"},
      {"--timeout abc status", "bad --timeout 'abc'"},
      {"--cluster", "option --cluster needs a value"},
      {"status --json=1", "distctl: option --json takes no value"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_exit(cases[i][0], 2, cases[i][1]);
}

/* The usage line offers --cluster or --endpoint; given both, --endpoint
 * won silently and the verb asked one daemon (a $DIST_CLUSTER still
 * yields to --endpoint). */
Test(distctl_args, cluster_and_endpoint_together_are_refused) {
  expect_exit("--cluster /tmp/none.conf status", 2,
              "distctl: --cluster /tmp/none.conf and --endpoint 127.0.0.1:1: give one");
  char cmd[1024], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "DIST_CLUSTER=/tmp/none.conf %s --endpoint 127.0.0.1:1 status",
           harness_distctl());
  int rc = harness_run(cmd, &out, &err, 30);
  cr_assert_eq(rc, 1, "status of a daemon that is not there exited %d: %s", rc, err ? err : "");
  cr_assert(err && strstr(err, "distd at 127.0.0.1:1"), "%s", err ? err : "");
  free(out);
  free(err);
}

/* The help did not say where launch puts the trainers' logs without
 * --log-dir (./log, made in the current directory). */
Test(distctl_args, the_help_says_where_launch_logs_go) {
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s --help", harness_distctl());
  cr_assert_eq(harness_run(cmd, &out, NULL, 30), 0);
  cr_assert(out && strstr(out, "DIR/workerlog.RANK (DIR: ./log unless --log-dir)"), "%s",
            out ? out : "");
  free(out);
}

/* metrics --rank past the cluster failed (exit 1) with libdist's
 * "dist_info: no daemon of rank 1 (cluster of 1)", where tensor get's
 * --rank was a usage error naming the ranks there are: both are now that. */
Test(distctl_args, a_rank_past_the_cluster_is_a_usage_error_naming_the_ranks) {
  expect_exit("metrics --rank 1", 2, "distctl metrics: --rank 1: the cluster has one rank, 0");
  expect_exit("tensor get w -o w.npy --rank 1 --local", 2,
              "distctl tensor get: --rank 1: the cluster has one rank, 0");
}

/* The per-rank inspection verbs named a rank that did not answer twice
 * ("rank 1: rank 1 (127.0.0.1:...): ..."). */
Test(distctl_args, a_rank_that_does_not_answer_is_named_once) {
  start_cluster(2, "args");
  harness_kill(&cluster, 1, SIGKILL);
  const char *verbs[] = {"params", "ops", "experts"};
  for (size_t i = 0; i < 3; i++) {
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s --cluster %s --timeout 3000 %s", harness_distctl(),
             cluster.cluster_file, verbs[i]);
    int rc = harness_run(cmd, &out, &err, 30);
    cr_assert_eq(rc, 1, "distctl %s exited %d: %s", verbs[i], rc, err ? err : "");
    cr_assert(err && strstr(err, "distctl: rank 1"), "%s: %s", verbs[i], err ? err : "");
    cr_assert(!strstr(err, "rank 1: rank 1"), "distctl %s doubled the rank: %s", verbs[i], err);
    free(out);
    free(err);
  }
}

/* `distctl ARGS` against the suite's cluster, exit status 0: its stdout
 * (the caller frees it). ARGS quote with double quotes: harness_run wraps
 * the line in single ones. */
static char *distctl_ok(const char *args) {
  char cmd[2048], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s --timeout 10000 %s", harness_distctl(),
           cluster.cluster_file, args);
  int rc = harness_run(cmd, &out, &err, 60);
  cr_assert_eq(rc, 0, "distctl %s exited %d: %s", args, rc, err ? err : "");
  free(err);
  return out ? out : strdup("");
}

/* The stdout of `distctl --json ARGS` as JSON. */
static json_t *json_of(const char *args) {
  char with_json[2048];
  snprintf(with_json, sizeof with_json, "--json %s", args);
  char *out = distctl_ok(with_json);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  cr_assert(j, "distctl --json %s printed no JSON (%s): '%s'", args, je.text, out);
  free(out);
  return j;
}

/* The value of "src", which put_src stores. */
static const float src_values[4] = {1, 2, 3, 4};

/* Starts a cluster of 2 (start_cluster) holding "src", Shard(0) on both. */
static void put_src(const char *what) {
  start_cluster(2, what);
  dist_client *c = harness_client(&cluster);
  int64_t shape[1] = {4};
  dist_tensor_free(harness_put(c, "src", DIST_FLOAT32, src_values, 1, shape, "[0,1]",
                               "Shard(0)"));
  dist_close(c);
}

Test(distctl_args, tensor_put_get_reshard_and_rm_print_their_result_with_json) {
  put_src("json");
  char npy[512], cmd[1024];
  snprintf(npy, sizeof npy, "%s/v.npy", cluster.dir);
  snprintf(cmd, sizeof cmd, "tensor get src -o %s", npy);
  json_t *j = json_of(cmd);
  cr_assert_str_eq(json_string_value(json_object_get(j, "output")), npy);
  json_decref(j);
  snprintf(cmd, sizeof cmd, "tensor put w %s --mesh \"[0,1]\" --placements \"Shard(0)\"", npy);
  j = json_of(cmd);
  cr_assert_str_eq(json_string_value(json_object_get(j, "name")), "w");
  cr_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "placements"), 0)),
                   "Shard(0)");
  json_decref(j);
  j = json_of("tensor reshard w --placements \"Replicate()\"");
  cr_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "placements"), 0)),
                   "Replicate()");
  json_decref(j);
  j = json_of("tensor rm w");
  cr_assert(json_is_true(json_object_get(j, "deleted")));
  json_decref(j);
}

/* tensors --json lists each tensor's version, once per name and mesh: the
 * alloc sweeps compare it between daemons (a change applied on some of
 * them only keeps dtype, shape and placements), each listed alone. */
Test(distctl_args, tensors_json_lists_each_tensors_version) {
  put_src("version");
  free(distctl_ok("tensor reshard src --placements \"Replicate()\""));
  json_t *j = json_of("tensors");
  cr_assert_eq(json_array_size(j), 1, "one tensor listed");
  json_t *src = json_array_get(j, 0);
  cr_expect_str_eq(json_string_value(json_object_get(src, "name")), "src");
  cr_expect_eq(json_integer_value(json_object_get(src, "version")), 2,
               "a put then a reshard in place: version 2");
  json_decref(j);
  for (int r = 0; r < 2; r++) { /* each daemon alone, as the sweeps ask */
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s --endpoint 127.0.0.1:%d --json tensors", harness_distctl(),
             cluster.grpc_port[r]);
    cr_assert_eq(harness_run(cmd, &out, &err, 60), 0, "rank %d: %s", r, err ? err : "");
    cr_expect(strstr(out, "\"version\": 2"), "rank %d lists no version 2: %s", r, out);
    free(out), free(err);
  }
}

/* Output that cannot be written (stdout on a full disk) fails the run,
 * naming why, whether JSON, a table, help or the version: it exited 0
 * with the output lost. `top` without --iterations, which refreshes until
 * interrupted, stops at its first refresh that cannot be written (it went
 * on forever). */
Test(distctl_args, output_that_cannot_be_written_fails_naming_why) {
  const char *full = "distctl: cannot write the output: No space left on device";
  expect_exit("--version > /dev/full", 1, full);
  expect_exit("tensors --help > /dev/full", 1, full);
  start_cluster(1, "full");
  const char *verbs[] = {"--json status", "status", "--json tensors", "top --interval 0.1"};
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s --cluster %s %s > /dev/full", harness_distctl(),
             cluster.cluster_file, verbs[i]);
    cr_expect_eq(harness_run(cmd, &out, &err, 60), 1, "distctl %s", verbs[i]);
    cr_expect(err && strstr(err, full), "distctl %s said '%s'", verbs[i], err ? err : "");
    free(out), free(err);
  }
}

/* A .npy that cannot be read or written is named once (the message said
 * "cannot read F: F: No such file or directory"), and a get whose write
 * fails midway (here past the file size limit, with SIGXFSZ ignored so
 * that write() says EFBIG) leaves no partial file, which a later put would
 * refuse as truncated. */
Test(distctl_args, a_npy_file_that_fails_is_named_once_and_not_left_partial) {
  expect_exit("tensor put a /nonexistent-dir/a.npy --mesh \"[0]\" --placements \"Replicate()\"",
              1, "distctl: cannot read /nonexistent-dir/a.npy: No such file or directory\n");
  start_cluster(1, "npy");
  dist_client *c = harness_client(&cluster);
  static float v[4096];
  int64_t shape[1] = {4096};
  dist_tensor_free(harness_put(c, "big", DIST_FLOAT32, v, 1, shape, "[0]", "Replicate()"));
  dist_close(c);
  char out_path[512], cmd[2048], *out = NULL, *err = NULL;
  snprintf(out_path, sizeof out_path, "%s/big.npy", cluster.dir);
  snprintf(cmd, sizeof cmd, "trap \"\" XFSZ; ulimit -f 4; exec %s --cluster %s tensor get big -o %s",
           harness_distctl(), cluster.cluster_file, out_path);
  int rc = harness_run(cmd, &out, &err, 30);
  cr_assert_eq(rc, 1, "tensor get past the file size limit exited %d: %s", rc, err ? err : "");
  char want[600];
  snprintf(want, sizeof want, "distctl: cannot write %s: write failed: File too large\n", out_path);
  cr_assert(err && strcmp(err, want) == 0, "said '%s', not '%s'", err ? err : "", want);
  struct stat st;
  cr_assert_neq(stat(out_path, &st), 0, "a partial %s (%lld bytes) was left", out_path,
                (long long)st.st_size);
  free(out);
  free(err);
}

/* The cluster the next tests start, in json_dir's subdirectory
 * json_subdir: stopped and removed even when an assertion ends the test
 * between up and down. */
static char json_dir[] = "/tmp/distctl-json-XXXXXX";
static const char *json_subdir = "c";

static void stop_json_cluster(void) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s cluster down --dir '%s/%s'", harness_distctl(), json_dir,
           json_subdir);
  harness_run(cmd, NULL, NULL, 60); /* already down after a passing test */
  harness_remove_dir(json_dir);
}

/* A cluster up whose directory's name is not UTF-8 cannot be said in
 * JSON: distctl says so and exits 1, as when its output cannot be
 * written. Before, it said so and exited 0, the caller left with no
 * document. */
Test(distctl_args, a_json_document_jansson_cannot_write_exits_1, .fini = stop_json_cluster) {
  char cmd[1024], *out = NULL, *err = NULL;
  json_subdir = "c\xff";
  cr_assert(mkdtemp(json_dir));
  snprintf(cmd, sizeof cmd, "%s --json cluster up -n 1 --dir '%s/%s'", harness_distctl(),
           json_dir, json_subdir);
  int rc = harness_run(cmd, &out, &err, 60);
  cr_expect_eq(rc, 1, "cluster up exited %d: %s", rc, err ? err : "");
  cr_expect(err && strstr(err, "cannot write the JSON output") &&
                !strstr(err, "cannot write the output:"),
            "said '%s'", err ? err : "");
  cr_expect(!out || !out[0], "printed '%s'", out ? out : "");
  free(out);
  free(err);
}

Test(distctl_args, cluster_up_and_down_print_their_result_with_json,
     .fini = stop_json_cluster) {
  char cmd[1024], *out = NULL, *err = NULL;
  const char *dir = json_dir;
  cr_assert(mkdtemp(json_dir));
  snprintf(cmd, sizeof cmd, "%s --json cluster up -n 1 --dir %s/c", harness_distctl(), dir);
  int rc = harness_run(cmd, &out, &err, 60);
  cr_assert_eq(rc, 0, "cluster up exited %d: %s", rc, err ? err : "");
  json_t *j = json_loads(out ? out : "", 0, NULL);
  cr_assert(j, "cluster up --json printed '%s'", out ? out : "");
  cr_assert_eq(json_integer_value(json_object_get(j, "world_size")), 1);
  cr_assert(strstr(json_string_value(json_object_get(j, "cluster_file")), "/c/cluster.conf"));
  json_decref(j);
  free(out);
  free(err);
  snprintf(cmd, sizeof cmd, "%s --json cluster down --dir %s/c", harness_distctl(), dir);
  rc = harness_run(cmd, &out, &err, 60);
  cr_assert_eq(rc, 0, "cluster down exited %d: %s", rc, err ? err : "");
  j = json_loads(out ? out : "", 0, NULL);
  cr_assert(j && json_is_true(json_object_get(j, "down")), "cluster down --json printed '%s'",
            out ? out : "");
  json_decref(j);
  free(out);
  free(err);
}

static char launch_dir[] = "/tmp/distctl-launch-json-XXXXXX";

static void remove_launch_dir(void) { harness_remove_dir(launch_dir); }

/* `distctl --json launch -n 2` of a shell line (double quotes inside) in
 * launch_dir's local cluster: its exit status; *j is the whole of its
 * stdout parsed as JSON, *err its stderr. */
static int launch_json(const char *line, json_t **j, char **err) {
  char cmd[2048], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s --json launch -n 2 --log-dir %s/log -- sh -c \"%s\"",
           harness_distctl(), launch_dir, line);
  int rc = harness_run(cmd, &out, err, 90);
  json_error_t je;
  *j = json_loads(out ? out : "", 0, &je);
  cr_assert(*j, "launch --json printed more or other than JSON (%s): '%s'", je.text,
            out ? out : "");
  free(out);
  return rc;
}

/* Writes launch_dir/none.conf: a cluster file of n daemons no trainer here
 * connects to (launch checks only that it lists one daemon per rank). */
static void write_unused_cluster(int n) {
  char path[256];
  snprintf(path, sizeof path, "%s/none.conf", launch_dir);
  FILE *f = fopen(path, "w");
  cr_assert(f, "cannot write %s", path);
  for (int r = 0; r < n; r++) fprintf(f, "127.0.0.1:%d\n", 1 + 3 * r);
  cr_assert_eq(fclose(f), 0);
}

/* A world size other than the cluster's was started anyway: every trainer
 * then failed in dist_init_from_env ("DIST_WORLD_SIZE=2 do not fit a
 * cluster of 4 daemons"), after launch had made its log directory. Now
 * launch refuses it before, naming both; so is a cluster file that cannot
 * be read. */
Test(distctl_args, launch_refuses_a_world_size_other_than_the_clusters,
     .fini = remove_launch_dir) {
  cr_assert(mkdtemp(launch_dir));
  write_unused_cluster(4);
  char cmd[2048], *out = NULL, *err = NULL, log[256];
  snprintf(log, sizeof log, "%s/log", launch_dir);
  snprintf(cmd, sizeof cmd, "%s --json --cluster %s/none.conf launch -n 2 --log-dir %s -- true",
           harness_distctl(), launch_dir, log);
  int rc = harness_run(cmd, &out, &err, 30);
  cr_assert_eq(rc, 2, "launch exited %d: %s", rc, err ? err : "");
  cr_assert(err && strstr(err, "-n 2, but the cluster file ") &&
                strstr(err, "/none.conf lists 4 daemons"), "%s", err ? err : "");
  cr_assert(!out || !out[0], "a refused launch printed '%s'", out);
  struct stat st;
  cr_assert_neq(stat(log, &st), 0, "the refused launch made its log directory");
  free(out);
  free(err);
  snprintf(cmd, sizeof cmd, "%s --cluster %s/missing.conf launch -n 2 --log-dir %s -- true",
           harness_distctl(), launch_dir, log);
  rc = harness_run(cmd, &out, &err, 30);
  cr_assert_eq(rc, 1, "launch exited %d: %s", rc, err ? err : "");
  cr_assert(err && strstr(err, "/missing.conf: No such file or directory"), "%s", err ? err : "");
  free(out);
  free(err);
}

/* Before, launch printed rank 0's output on stdout and never JSON. */
Test(distctl_args, launch_prints_each_ranks_exit_status_as_json, .fini = remove_launch_dir) {
  cr_assert(mkdtemp(launch_dir));
  json_t *j = NULL;
  char *err = NULL;
  /* Rank 1 fails once rank 0 has printed its line (a file says so, waited
   * for 20 s at most: stopped before its echo, rank 0 printed nothing under
   * ASan); rank 0 would sleep for a minute if not stopped. */
  char line[1024];
  snprintf(line, sizeof line,
           "echo rank \\$DIST_RANK of \\$DIST_WORLD_SIZE; if [ \\$DIST_RANK = 1 ]; then "
           "i=0; while [ ! -e %s/rank0 ] && [ \\$i -lt 400 ]; do sleep 0.05; "
           "i=\\$((i + 1)); done; exit 3; fi; touch %s/rank0; sleep 60",
           launch_dir, launch_dir);
  int rc = launch_json(line, &j, &err);
  cr_assert_eq(rc, 3, "launch exited %d: %s", rc, err ? err : "");
  cr_assert(err && strstr(err, "rank 0 of 2"), "rank 0's output is not on stderr: %s", err);
  cr_assert_eq(json_integer_value(json_object_get(j, "status")), 3);
  cr_assert(json_is_false(json_object_get(j, "ok")));
  cr_assert_eq(json_integer_value(json_object_get(j, "failed_rank")), 1);
  json_t *ranks = json_object_get(j, "ranks");
  cr_assert_eq(json_array_size(ranks), 2);
  json_t *r0 = json_array_get(ranks, 0), *r1 = json_array_get(ranks, 1);
  cr_assert_eq(json_integer_value(json_object_get(r1, "exit_status")), 3);
  cr_assert_null(json_object_get(r1, "signal"), "rank 1 exited on its own");
  cr_assert(json_is_false(json_object_get(r1, "stopped")));
  cr_assert_eq(json_integer_value(json_object_get(r0, "signal")), SIGTERM);
  cr_assert_eq(json_integer_value(json_object_get(r0, "exit_status")), 128 + SIGTERM);
  cr_assert(json_is_true(json_object_get(r0, "stopped")));
  cr_assert(strstr(json_string_value(json_object_get(r0, "log")), "/log/workerlog.0"));
  json_decref(j);
  free(err);
  rc = launch_json("echo hello from \\$DIST_RANK", &j, &err);
  cr_assert_eq(rc, 0, "launch exited %d: %s", rc, err ? err : "");
  cr_assert(err && strstr(err, "hello from 0"), "rank 0's output is not on stderr: %s", err);
  cr_assert_eq(json_integer_value(json_object_get(j, "status")), 0);
  cr_assert(json_is_true(json_object_get(j, "ok")));
  cr_assert(json_is_null(json_object_get(j, "failed_rank")));
  for (int r = 0; r < 2; r++) {
    json_t *o = json_array_get(json_object_get(j, "ranks"), (size_t)r);
    cr_assert_eq(json_integer_value(json_object_get(o, "rank")), r);
    cr_assert_eq(json_integer_value(json_object_get(o, "exit_status")), 0);
  }
  json_decref(j);
  free(err);
}

/* A rank whose fork fails: before, its pid (-1) was counted as running
 * and never reaped, so launch waited forever once the other ranks ended.
 * fork fails for real here: launch runs as a user of its own whose
 * RLIMIT_NPROC of 2 lets it start rank 0 only (root ignores the limit, and
 * the limit counts every process of the user, hence a uid no one else
 * uses). Rank 0 would sleep for a minute if not stopped. */
Test(distctl_args, a_rank_that_cannot_be_forked_stops_the_others, .fini = remove_launch_dir) {
  if (geteuid() != 0) cr_skip_test("needs root, to run launch as a user whose limit holds");
  cr_assert(mkdtemp(launch_dir));
  int uid = 60000 + (int)(getpid() % 5000);
  cr_assert_eq(chown(launch_dir, (uid_t)uid, (gid_t)uid), 0);
  write_unused_cluster(3);
  char cmd[2048], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd,
           "setpriv --reuid=%d --regid=%d --clear-groups prlimit --nproc=2 %s --json "
           "--cluster %s/none.conf launch -n 3 --log-dir %s/log -- sleep 60",
           uid, uid, harness_distctl(), launch_dir, launch_dir);
  double t0 = harness_now_s();
  int rc = harness_run(cmd, &out, &err, 60);
  cr_assert_eq(rc, 1, "launch exited %d: %s", rc, err ? err : "");
  cr_assert(harness_now_s() - t0 < 30, "rank 0 was not stopped (%.0f s)", harness_now_s() - t0);
  cr_assert(err && strstr(err, "cannot start rank 1: fork: "), "%s", err ? err : "");
  json_error_t je;
  json_t *j = json_loads(out ? out : "", 0, &je);
  cr_assert(j, "launch --json printed more or other than JSON (%s): '%s'", je.text, out);
  cr_assert_eq(json_integer_value(json_object_get(j, "status")), 1);
  cr_assert_eq(json_integer_value(json_object_get(j, "failed_rank")), 1);
  json_t *ranks = json_object_get(j, "ranks");
  cr_assert_eq(json_array_size(ranks), 3);
  json_t *r0 = json_array_get(ranks, 0), *r1 = json_array_get(ranks, 1),
         *r2 = json_array_get(ranks, 2);
  cr_assert(json_is_true(json_object_get(r0, "started")));
  cr_assert(json_is_true(json_object_get(r0, "stopped")));
  cr_assert_eq(json_integer_value(json_object_get(r0, "signal")), SIGTERM);
  cr_assert(json_is_false(json_object_get(r1, "started")));
  const char *why = json_string_value(json_object_get(r1, "error"));
  cr_assert(why && strncmp(why, "fork: ", 6) == 0, "rank 1 does not say why: %s",
            why ? why : "(none)");
  cr_assert_null(json_object_get(r1, "exit_status"), "rank 1 never ran");
  cr_assert(json_is_false(json_object_get(r2, "started")));
  cr_assert_null(json_object_get(r2, "error"), "rank 2 was never tried");
  json_decref(j);
  free(out);
  free(err);
}

/* A rank whose log cannot be opened (here a directory stands in its way)
 * fails as a rank that cannot be run does (127), stopping the others.
 * Before, the failed open was not checked: the rank ran on with launch's
 * own stdout (its output broke launch --json's one object) and was not
 * counted as failed, so rank 0 was not stopped either. */
Test(distctl_args, a_rank_whose_log_cannot_be_written_fails, .fini = remove_launch_dir) {
  cr_assert(mkdtemp(launch_dir));
  char path[256], cmd[2048], *out = NULL, *err = NULL;
  snprintf(path, sizeof path, "%s/log", launch_dir);
  cr_assert_eq(mkdir(path, 0755), 0);
  snprintf(path, sizeof path, "%s/log/workerlog.1", launch_dir);
  cr_assert_eq(mkdir(path, 0755), 0);
  write_unused_cluster(2);
  snprintf(cmd, sizeof cmd,
           "%s --json --cluster %s/none.conf launch -n 2 --log-dir %s/log -- sh -c "
           "\"echo hello from \\$DIST_RANK; sleep 60\"",
           harness_distctl(), launch_dir, launch_dir);
  double t0 = harness_now_s();
  int rc = harness_run(cmd, &out, &err, 60);
  cr_assert_eq(rc, 127, "launch exited %d: %s", rc, err ? err : "");
  cr_assert(harness_now_s() - t0 < 30, "rank 0 was not stopped (%.0f s)", harness_now_s() - t0);
  cr_assert(err && strstr(err, "rank 1: cannot write ") && strstr(err, "Is a directory"), "%s",
            err ? err : "");
  json_error_t je;
  json_t *j = json_loads(out ? out : "", 0, &je);
  cr_assert(j, "launch --json printed more or other than JSON (%s): '%s'", je.text, out);
  cr_assert_eq(json_integer_value(json_object_get(j, "failed_rank")), 1);
  json_t *r1 = json_array_get(json_object_get(j, "ranks"), 1);
  cr_assert_eq(json_integer_value(json_object_get(r1, "exit_status")), 127);
  json_decref(j);
  free(out);
  free(err);
}

/* launch with --endpoint started a local cluster of its own and left
 * --endpoint unused: one daemon cannot be every trainer's own. It is a
 * usage error now, before anything is started or made. */
Test(distctl_args, launch_refuses_endpoint, .fini = remove_launch_dir) {
  cr_assert(mkdtemp(launch_dir));
  char log[256], args[512];
  snprintf(log, sizeof log, "%s/log", launch_dir);
  snprintf(args, sizeof args, "launch -n 1 --log-dir %s -- true", log);
  expect_exit(args, 2, "distctl launch: --endpoint 127.0.0.1:1 names one daemon");
  struct stat st;
  cr_assert_neq(stat(log, &st), 0, "the refused launch made its log directory");
}

/* Every verb refuses an option it does not take, naming it and itself
 * (exit 2): the tensor and checkpoint verbs said "unknown option", param
 * tune "unexpected argument", the others "unknown argument"; all read one
 * table now, and say the last. */
Test(distctl_args, every_verb_refuses_an_unknown_option_naming_it) {
  const char *const verbs[][2] = {
      {"status", ""}, {"peers", ""}, {"top", ""}, {"ops", ""}, {"experts", ""},
      {"params", ""}, {"param tune", "w --lr 1"}, {"metrics", ""}, {"tensors", ""},
      {"tensor put", "w w.npy --mesh \"[0]\" --placements \"Replicate()\""},
      {"tensor get", "w -o w.npy"}, {"tensor show", "w"},
      {"tensor reshard", "w --placements \"Replicate()\""}, {"tensor rm", "w"},
      {"cluster up", "-n 1 --dir /tmp/none"}, {"cluster down", "--dir /tmp/none"},
      {"launch", "-n 1 -- true"}, {"checkpoint save", "/tmp/none"},
      {"checkpoint restore", "/tmp/none"},
  };
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    char args[512], want[128];
    snprintf(args, sizeof args, "%s --bogus=1 %s", verbs[i][0], verbs[i][1]);
    snprintf(want, sizeof want, "distctl %s: unknown argument '--bogus=1'\n", verbs[i][0]);
    expect_exit(args, 2, want);
  }
}

/* What every verb took before it read its options table, it still takes
 * (but a flag given twice, refused since session 29), and what it refused
 * it still refuses: "-o" and "--output", "=" forms, NAME among the
 * options, "--" only where the verb takes it. (These usage errors come
 * before any daemon is asked.) */
Test(distctl_args, the_spellings_taken_before_are_taken_still) {
  expect_exit("tensor get w --local --rank=1 --output w.npy", 2,
              "distctl tensor get: --rank 1: the cluster has one rank, 0");
  expect_exit("tensor get --rank 1 w -o=w.npy --local", 2,
              "distctl tensor get: --rank 1: the cluster has one rank, 0");
  expect_exit("cluster up -n 1 --pin --dir", 2, "option --dir needs a value");
  expect_exit("cluster up -n 1 --dir /tmp/x --pin=yes", 2, "--pin");
  expect_exit("tensor show w -- x", 2, "'--'");
  expect_exit("tensor show w x", 2, "distctl tensor show: unexpected argument 'x'");
  expect_exit("param tune --lr 1", 2, "distctl param tune: NAME is required");
  expect_exit("launch --log-dir=/tmp/none -n=1", 2,
              "distctl launch: -- PROGRAM [ARGS...] is required");
  expect_exit("tensor rm", 2, "distctl tensor rm: NAME is required");
  expect_exit("checkpoint save --tensors a", 2, "distctl checkpoint save: DIR is required");
  expect_exit("checkpoint restore d --dim-names a --placements \"Replicate()\"", 2,
              "--dim-names needs --mesh");
}

/* Which options go together is in each verb's table, and the parser
 * refuses a command line that breaks it in one wording for every verb
 * (each verb checked its own, in words of its own: "give FILE.npy or
 * --local, not both", "--rank R reads a rank's piece: add --local",
 * "nothing to change"). Each refusal is exit 2, with the verb's synopsis,
 * before any daemon is asked. */
Test(distctl_args, options_that_go_together_are_refused_apart_in_one_wording) {
  const char *const cases[][2] = {
      {"tensor put w --mesh \"[0]\" --placements \"Replicate()\"",
       "distctl tensor put: give FILE.npy or --local\n"},
      {"tensor put w w.npy --local a.npy --mesh \"[0]\" --placements \"Replicate()\"",
       "distctl tensor put: FILE.npy and --local exclude each other\n"},
      {"tensor put w \"\" --mesh \"[0]\" --placements \"Replicate()\"",
       "distctl tensor put: give FILE.npy or --local\n"},
      {"tensor get w -o w.npy --rank 0", "distctl tensor get: --rank needs --local\n"},
      {"tensor get w -o w.npy --local", "distctl tensor get: --local needs --rank\n"},
      {"tensor reshard w --dim-names a --placements \"Replicate()\"",
       "distctl tensor reshard: --dim-names needs --mesh\n"},
      {"checkpoint restore d --mesh \"[0]\"",
       "distctl checkpoint restore: --mesh needs --placements\n"},
      {"checkpoint restore d --dim-names a",
       "distctl checkpoint restore: --dim-names needs --mesh\n"},
      {"checkpoint restore d --mesh \"[0]\" --dim-names a",
       "distctl checkpoint restore: --mesh needs --placements\n"},
      {"param tune w", "distctl param tune: give one or more of --lr, --momentum, "
                       "--dampening, --beta1, --beta2, --eps, --weight-decay\n"},
      {"tensor show \"\"", "distctl tensor show: NAME is required\n"},
      {"launch -n 1 --", "distctl launch: -- PROGRAM [ARGS...] is required\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    expect_exit(cases[i][0], 2, cases[i][1]);
    char verb[32];
    int verb_len = (int)(strchr(cases[i][1], ':') - cases[i][1]) - 8; /* after "distctl " */
    snprintf(verb, sizeof verb, "usage: distctl %.*s ", verb_len, cases[i][1] + 8);
    expect_exit(cases[i][0], 2, verb);
  }
}

/* The string at key of j's array `array`, entry i ("" when none). */
static const char *string_at(json_t *j, const char *array, size_t i) {
  const char *s = json_string_value(json_array_get(json_object_get(j, array), i));
  return s ? s : "";
}

/* The tensor verbs against a real cluster, each with every option it
 * takes, in the spellings scripts use: each does what it did. */
Test(distctl_args, the_tensor_verbs_take_each_of_their_options_against_a_cluster) {
  put_src("opts");
  const float *v = src_values;
  size_t nbytes = sizeof src_values;
  dist_client *c = harness_client(&cluster);
  char whole[512], r0[512], r1[512], cmd[2048];
  snprintf(whole, sizeof whole, "%s/whole.npy", cluster.dir);
  snprintf(r0, sizeof r0, "%s/r0.npy", cluster.dir);
  snprintf(r1, sizeof r1, "%s/r1.npy", cluster.dir);
  snprintf(cmd, sizeof cmd, "tensor get src -o %s", whole);
  free(distctl_ok(cmd));
  snprintf(cmd, sizeof cmd, "tensor get --local src --rank=0 --output=%s", r0);
  free(distctl_ok(cmd));
  snprintf(cmd, sizeof cmd, "tensor get src --rank 1 --local --output %s", r1);
  free(distctl_ok(cmd));
  /* put from one file, with --dim-names and --dtype; from pieces, --local. */
  snprintf(cmd, sizeof cmd, "tensor put w %s --mesh \"[[0,1]]\" --dim-names=dp,mp "
           "--placements \"Replicate(),Shard(0)\" --dtype float32", whole);
  json_t *j = json_of(cmd);
  cr_assert_str_eq(string_at(json_object_get(j, "mesh"), "dim_names", 1), "mp");
  cr_assert_str_eq(string_at(j, "placements", 1), "Shard(0)");
  json_decref(j);
  harness_expect_value(c, "w", v, nbytes);
  snprintf(cmd, sizeof cmd, "tensor put --local %s,%s p --mesh=\"[0,1]\" "
           "--placements=\"Shard(0)\"", r0,
           r1);
  free(distctl_ok(cmd));
  harness_expect_value(c, "p", v, nbytes);
  /* reshard onto another mesh of the same shape, its dims named. */
  j = json_of("tensor reshard w --mesh \"[[1,0]]\" --dim-names a,b "
              "--placements \"Shard(0),Replicate()\"");
  cr_assert_str_eq(string_at(json_object_get(j, "mesh"), "dim_names", 0), "a");
  cr_assert_str_eq(string_at(j, "placements", 0), "Shard(0)");
  cr_assert_eq(json_integer_value(json_array_get(
                   json_object_get(json_object_get(j, "mesh"), "ranks"), 0)), 1);
  json_decref(j);
  harness_expect_value(c, "w", v, nbytes);
  /* checkpoint save of some tensors; restore of one onto another mesh. */
  char ckpt[512];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", cluster.dir);
  snprintf(cmd, sizeof cmd, "checkpoint save %s --tensors=p,src", ckpt);
  free(distctl_ok(cmd));
  free(distctl_ok("tensor rm p"));
  snprintf(cmd, sizeof cmd, "checkpoint restore --tensors p %s --mesh \"[1]\" "
           "--dim-names solo --placements \"Replicate()\"", ckpt);
  j = json_of(cmd);
  cr_assert_eq(json_integer_value(json_object_get(j, "tensors")), 1);
  json_decref(j);
  j = json_of("tensor show p");
  cr_assert_str_eq(string_at(json_object_get(j, "mesh"), "dim_names", 0), "solo");
  cr_assert_str_eq(string_at(j, "placements", 0), "Replicate()");
  json_decref(j);
  harness_expect_value(c, "p", v, nbytes);
  dist_close(c);
}

/* param tune with each hyper-parameter, in either spelling. */
Test(distctl_args, param_tune_takes_each_hyper_parameter_against_a_cluster) {
  start_cluster(1, "tune");
  dist_client *c = harness_client(&cluster);
  float zero[4] = {0};
  int64_t shape[1] = {4};
  dist_tensor_free(harness_put(c, "a", DIST_FLOAT32, zero, 1, shape, "[0]", "Replicate()"));
  dist_tensor_free(harness_put(c, "s", DIST_FLOAT32, zero, 1, shape, "[0]", "Replicate()"));
  dist_param_opts adam = DIST_PARAM_OPTS_INIT, sgd = DIST_PARAM_OPTS_INIT;
  adam.optimizer = DIST_OPT_ADAMW;
  sgd.momentum = 0.9;
  cr_assert_eq(dist_param_configure(c, "a", &adam), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_configure(c, "s", &sgd), 0, "%s", dist_errmsg(c));
  dist_close(c);
  static const struct {
    const char *args, *key;
    double after;
  } tunes[] = {
      {"a --lr 0.25", "lr", 0.25},           {"a --beta1=0.8", "beta1", 0.8},
      {"a --beta2 0.99", "beta2", 0.99},     {"a --eps 1e-6", "eps", 1e-6},
      {"a --weight-decay=0.5", "weight-decay", 0.5}, {"s --momentum 0.5", "momentum", 0.5},
      {"s --dampening 0.125", "dampening", 0.125},
  };
  for (size_t i = 0; i < sizeof tunes / sizeof tunes[0]; i++) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "param tune %s", tunes[i].args);
    json_t *j = json_of(cmd);
    json_t *changed = json_object_get(json_object_get(j, "changed"), tunes[i].key);
    cr_assert(changed, "param tune %s changed no %s", tunes[i].args, tunes[i].key);
    cr_assert_float_eq(json_real_value(json_object_get(changed, "after")), tunes[i].after, 1e-12);
    json_decref(j);
  }
}

/* daemon 0's command line, as /proc shows it (NULs as spaces), in buf. */
static void daemon_command_line(const char *dir, char *buf, size_t len) {
  char path[700], pid[32] = "";
  snprintf(path, sizeof path, "%s/distd.0.pid", dir);
  FILE *f = fopen(path, "r");
  cr_assert(f && fgets(pid, sizeof pid, f), "no %s", path);
  fclose(f);
  snprintf(path, sizeof path, "/proc/%d/cmdline", atoi(pid));
  f = fopen(path, "r");
  cr_assert(f, "no %s", path);
  size_t n = fread(buf, 1, len - 1, f);
  fclose(f);
  for (size_t i = 0; i < n; i++) buf[i] = buf[i] ? buf[i] : ' ';
  buf[n] = 0;
}

/* cluster up with every option and daemon flags after "--", cluster down
 * with its one, and launch with each of its and a program after "--". */
Test(distctl_args, cluster_and_launch_take_each_of_their_options, .fini = stop_json_cluster) {
  const char *up_dir = json_dir;
  cr_assert(mkdtemp(json_dir));
  char cmd[2048], dir[600], line[4096], *out = NULL, *err = NULL;
  snprintf(dir, sizeof dir, "%s/c", up_dir);
  snprintf(cmd, sizeof cmd, "%s cluster up --pin -n=1 --dir %s -- --log-level=debug",
           harness_distctl(), dir);
  int rc = harness_run(cmd, &out, &err, 60);
  cr_assert_eq(rc, 0, "cluster up exited %d: %s", rc, err ? err : "");
  free(out);
  free(err);
  daemon_command_line(dir, line, sizeof line);
  cr_assert(strstr(line, "--cpu-affinity") && strstr(line, "--log-level=debug"),
            "--pin or the daemon flags did not reach distd: %s", line);
  snprintf(cmd, sizeof cmd, "%s cluster down --dir=%s", harness_distctl(), dir);
  rc = harness_run(cmd, NULL, &err, 60);
  cr_assert_eq(rc, 0, "cluster down exited %d: %s", rc, err ? err : "");
  free(err);
  snprintf(cmd, sizeof cmd, "%s launch --log-dir=%s/log -n 1 -- sh -c "
           "\"echo world \\$DIST_WORLD_SIZE -n\"", harness_distctl(), up_dir);
  rc = harness_run(cmd, &out, &err, 90);
  cr_assert_eq(rc, 0, "launch exited %d: %s", rc, err ? err : "");
  cr_assert(out && strstr(out, "world 1 -n"), "launch ran something else: %s", out ? out : "");
  free(out);
  free(err);
  snprintf(dir, sizeof dir, "%s/log", up_dir);
  cr_assert_eq(harness_count_files(dir, "", "workerlog.0"), 1, "no workerlog.0 in %s", dir);
}
