/* Faults: a daemon killed in the middle of a collective, a reshard, a
 * global_scatter and a checkpoint save; a daemon frozen (SIGSTOP) during a
 * collective; one peer connection cut by closing the TCP proxy it runs
 * through; truncated, garbage and mismatched frames sent to the data-plane
 * port; a daemon restarted.
 *
 * After each fault the survivors must fail the operation with an error that
 * names the peer (its rank), within the peer timeout (the harness runs the
 * daemons with --peer-timeout 5s), leave no operation in flight, keep serving
 * (Info, and a new tensor put/reshard/get and a collective on the surviving
 * ranks only), and exit cleanly on SIGTERM at the end (harness_stop; under
 * AddressSanitizer that is also the daemons' leak check). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "frame.h"
#include "harness.h"
#include "harness_fixture.h"

/* --peer-timeout of the harness, and what scheduling (ASan) may add. */
#define PEER_TIMEOUT_S 5.0
#define SLACK_S 3.0

TestSuite(faults, .fini = stop_cluster, .timeout = 180);

static void start(int n) { harness_start_unique(&cluster, n, "faults", NULL); }

static void restart_rank(int r) {
  harness_start_rank_again(&cluster, r, NULL);
  char when[40];
  snprintf(when, sizeof when, "after rank %d restarted", r);
  harness_assert_all_connected(&cluster, when);
}

/* ------------------------------------------------------------ operations in a loop */

typedef enum { LOOP_ALL_REDUCE, LOOP_SCATTER, LOOP_RESHARD } loop_kind;

/* One client repeating one operation until it fails (or 60 s pass). */
typedef struct looper {
  dist_client *c;
  loop_kind kind;
  int rank, world;
  int iterations, rc;
  char msg[600];
  double failed_at;
} looper;

enum { AR_COUNT = 4 << 20 };             /* 16 MiB of float32 per trainer */
enum { SC_ROWS = 4096, SC_WIDTH = 256 }; /* 4 MiB to each destination */

/* Sum over ranks r of (r + 1) * (i % 7). */
static int all_reduce_once(looper *lp, float *buf) {
  for (size_t i = 0; i < AR_COUNT; i++) buf[i] = (float)((lp->rank + 1) * (int)(i % 7));
  int rc = dist_all_reduce(lp->c, buf, AR_COUNT, DIST_FLOAT32, DIST_REDUCE_SUM, NULL, 0);
  int factor = lp->world * (lp->world + 1) / 2;
  for (size_t i = 0; rc == 0 && i < AR_COUNT; i += 4099)
    if (buf[i] != (float)(factor * (int)(i % 7)))
      rc = dist_client_fail(lp->c, DIST_EINTERNAL, "all_reduce element %zu is %g", i,
                            (double)buf[i]);
  return rc;
}

/* Every rank sends SC_ROWS rows to each rank's one expert; a row from rank s
 * to rank d holds s * 10 + d everywhere. */
static int scatter_once(looper *lp, float *x) {
  int W = lp->world;
  int64_t counts[8];
  for (int d = 0; d < W; d++) counts[d] = SC_ROWS;
  for (int d = 0; d < W; d++)
    for (size_t i = 0; i < (size_t)SC_ROWS * SC_WIDTH; i++)
      x[(size_t)d * SC_ROWS * SC_WIDTH + i] = (float)(lp->rank * 10 + d);
  const void *xs[1] = {x};
  const int64_t *lc[1] = {counts}, *gc[1] = {counts};
  void *out[1] = {NULL};
  int64_t rows[1] = {0};
  int rc = dist_global_scatter(lp->c, xs, NULL, DIST_FLOAT32, SC_WIDTH, lc, gc, 1, NULL, 0,
                               NULL, out, rows);
  if (rc == 0 && rows[0] != (int64_t)W * SC_ROWS)
    rc = dist_client_fail(lp->c, DIST_EINTERNAL, "scatter gave %lld rows", (long long)rows[0]);
  for (int s = 0; rc == 0 && s < W; s++) {
    float want = (float)(s * 10 + lp->rank);
    const float *got = (const float *)out[0] + (size_t)s * SC_ROWS * SC_WIDTH;
    for (size_t i = 0; rc == 0 && i < (size_t)SC_ROWS * SC_WIDTH; i += 997)
      if (got[i] != want)
        rc = dist_client_fail(lp->c, DIST_EINTERNAL, "rows from rank %d hold %g", s,
                              (double)got[i]);
  }
  free(out[0]);
  return rc;
}

/* A single client reshards a 16 MiB tensor on [0..world) around
 * Shard(0) -> Shard(1) -> Replicate -> Shard(0). */
static int reshard_once(looper *lp, dist_tensor *t) {
  static const dist_placement ring[3] = {DIST_SHARD_DIM(1), DIST_REPLICATED, DIST_SHARD_DIM(0)};
  return dist_reshard(lp->c, t, NULL, &ring[lp->iterations % 3]);
}

static dist_tensor *put_big(dist_client *c, int world) {
  char text[64] = "[0";
  for (int r = 1; r < world; r++) snprintf(text + strlen(text), sizeof text - strlen(text), ",%d", r);
  strcat(text, "]");
  dist_mesh *mesh = NULL;
  cr_assert_eq(dist_mesh_from_string(text, NULL, &mesh), 0);
  int64_t shape[2] = {2048, 2048};
  float *data = malloc(sizeof(float) * 2048 * 2048);
  for (size_t i = 0; i < 2048u * 2048u; i++) data[i] = (float)(i % 1000);
  dist_placement p = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_shard_tensor(c, "big", data, DIST_FLOAT32, 2, shape, mesh, &p, &t), 0,
               "%s", dist_errmsg(c));
  free(data);
  dist_mesh_free(mesh);
  return t;
}

static void *loop_until_failure(void *arg) {
  looper *lp = arg;
  void *buf = NULL;
  dist_tensor *t = NULL;
  if (lp->kind == LOOP_ALL_REDUCE) buf = malloc(sizeof(float) * AR_COUNT);
  if (lp->kind == LOOP_SCATTER) buf = malloc(sizeof(float) * 8 * SC_ROWS * SC_WIDTH);
  if (lp->kind == LOOP_RESHARD) t = put_big(lp->c, lp->world);
  double until = harness_now_s() + 60;
  while (lp->rc == 0 && harness_now_s() < until) {
    lp->rc = lp->kind == LOOP_ALL_REDUCE ? all_reduce_once(lp, buf)
             : lp->kind == LOOP_SCATTER  ? scatter_once(lp, buf)
                                         : reshard_once(lp, t);
    if (lp->rc == 0) __atomic_add_fetch(&lp->iterations, 1, __ATOMIC_SEQ_CST);
  }
  lp->failed_at = harness_now_s();
  snprintf(lp->msg, sizeof lp->msg, "%s", lp->rc ? dist_errmsg(lp->c) : "never failed");
  dist_tensor_free(t);
  free(buf);
  return NULL;
}

typedef struct loop_run {
  int n;
  looper lp[HARNESS_MAX];
  pthread_t th[HARNESS_MAX];
} loop_run;

/* SPMD: one trainer thread per rank, each with its own client. */
static void start_trainers(loop_run *run, loop_kind kind, const char *job) {
  memset(run, 0, sizeof *run);
  run->n = cluster.n;
  for (int r = 0; r < run->n; r++)
    run->lp[r] = (looper){harness_spmd_client(&cluster, r, job), kind, r, cluster.n, 0, 0,
                          "", 0};
  for (int r = 0; r < run->n; r++)
    pthread_create(&run->th[r], NULL, loop_until_failure, &run->lp[r]);
}

static void join_trainer(loop_run *run, int r) {
  pthread_join(run->th[r], NULL);
  dist_close(run->lp[r].c);
  run->lp[r].c = NULL;
}

/* Waits (bounded) until every looper has completed an operation, so that
 * the fault lands in the middle of a later one, however slow the build. */
static void wait_progress(looper *lp, int n) {
  int *counters[HARNESS_MAX];
  cr_assert_leq(n, HARNESS_MAX);
  for (int i = 0; i < n; i++) counters[i] = &lp[i].iterations;
  harness_wait_all_positive(counters, n, 60000);
  for (int i = 0; i < n; i++)
    cr_assert_gt(__atomic_load_n(&lp[i].iterations, __ATOMIC_SEQ_CST), 0,
                 "looper %d completed no operation in 60 s: %s", i, lp[i].msg);
}

/* The fault, once every looper made progress and 200 ms into the next
 * operations; returns when it happened. */
static double fault_mid_op(looper *lp, int n, int rank, int sig) {
  wait_progress(lp, n);
  harness_sleep_ms(200);
  double at = harness_now_s();
  if (sig == SIGKILL)
    harness_kill(&cluster, rank, SIGKILL);
  else if (sig == SIGSTOP) /* its threads all stopped, not only signalled */
    cr_assert(harness_freeze(&cluster, rank, 5000), "rank %d did not stop", rank);
  else
    kill(cluster.pids[rank], sig);
  return at;
}

/* 1 when msg names rank peer: "rank P", or P in a list "ranks A, B, P"
 * (a survivor whose other peer had not started the op waits on both). */
static int names_rank(const char *msg, int peer) {
  for (const char *m = msg; (m = strstr(m, "rank")) != NULL;) {
    m += 4;
    if (*m == 's') m++;
    for (;;) {
      char *end;
      while (*m == ' ') m++;
      long r = strtol(m, &end, 10);
      if (end == m) break;
      if (r == peer) return 1;
      m = end;
      if (*m != ',') break;
      m++;
    }
  }
  return 0;
}

/* A survivor's failure: it happened, names the peer, and came in time. */
static void expect_names_peer(const looper *lp, const char *who, int peer, double fault_at) {
  cr_assert_neq(lp->rc, 0, "%s never failed (%d iterations)", who, lp->iterations);
  cr_expect(lp->iterations > 0, "%s failed before the fault: %s", who, lp->msg);
  cr_expect(names_rank(lp->msg, peer), "%s: '%s' does not name rank %d", who, lp->msg, peer);
  double after = lp->failed_at - fault_at;
  cr_expect(after < PEER_TIMEOUT_S + SLACK_S, "%s failed %.1f s after the fault (timeout %g s)",
            who, after, PEER_TIMEOUT_S);
  cr_log_info("%s: failed %.2f s after the fault, after %d ops: %s", who, after,
              lp->iterations, lp->msg);
}

/* ------------------------------------------------------------ survivors */

/* Each survivor's daemon: nothing left in flight once the failure is out
 * (bounded wait: a failed operation must end, not hang), and its latest
 * `kind` operation failed naming rank `peer`. With every_one 0, a survivor
 * whose own part had finished before the fault may report success, but at
 * least one must report the failure. */
static void expect_ops_failed(const int *ranks, int n, const char *kind, int peer,
                              int every_one) {
  dist_client *c = harness_client(&cluster);
  int failed = 0;
  for (int i = 0; i < n; i++) {
    dist_ops_report rep;
    memset(&rep, 0, sizeof rep);
    for (int waited = 0;; waited += 100) {
      cr_assert_eq(dist_ops(c, ranks[i], 0, &rep), 0, "ops of rank %d: %s", ranks[i],
                   dist_errmsg(c));
      if (rep.n_in_flight == 0 || waited > 1000 * (PEER_TIMEOUT_S + SLACK_S)) break;
      dist_ops_report_free(&rep);
      harness_sleep_ms(100);
    }
    cr_expect_eq(rep.n_in_flight, 0, "rank %d still runs %d operation(s), the first a %s",
                 ranks[i], rep.n_in_flight, rep.ops[0].kind);
    const dist_op_info *last = NULL;
    for (int k = rep.n_in_flight; k < rep.n_in_flight + rep.n_recent && !last; k++)
      if (!strcmp(rep.ops[k].kind, kind)) last = &rep.ops[k];
    cr_assert(last, "rank %d reports no %s operation", ranks[i], kind);
    cr_expect(last->state == DIST_OP_FAILED || !every_one,
              "rank %d: its last %s did not fail", ranks[i], kind);
    if (last->state == DIST_OP_FAILED) {
      failed++;
      cr_expect(names_rank(last->error, peer),
                "rank %d: %s failed with '%s', which does not name rank %d", ranks[i], kind,
                last->error, peer);
    }
    cr_log_info("rank %d: last %s %s %s", ranks[i], kind,
                last->state == DIST_OP_FAILED ? "failed:" : "succeeded", last->error);
    dist_ops_report_free(&rep);
  }
  /* (A single client's reshard may have ended on every survivor before
   * the kill: then only the client's own error names the peer.) */
  cr_expect(failed > 0 || !every_one, "no survivor reports its %s failed", kind);
  dist_close(c);
}

static void expect_floats(const void *got, size_t n, const float *want, size_t wn,
                          const char *what) {
  cr_assert_eq(n, wn * sizeof(float), "%s: %zu bytes", what, n);
  cr_assert_eq(memcmp(got, want, n), 0, "%s: values differ", what);
}

/* Info from each, then a new small tensor on exactly these ranks: put
 * Shard(0), reshard to Replicate, read back, delete. */
static void expect_tensors_served(const int *ranks, int n, const char *after) {
  static int serial;
  dist_client *c = harness_client(&cluster);
  char text[64] = "[", name[64];
  for (int i = 0; i < n; i++) {
    dist_daemon_info info;
    cr_assert_eq(dist_info(c, ranks[i], &info), 0, "after %s: Info of rank %d: %s", after,
                 ranks[i], dist_errmsg(c));
    dist_info_free(&info);
    snprintf(text + strlen(text), sizeof text - strlen(text), "%s%d", i ? "," : "", ranks[i]);
  }
  strcat(text, "]");
  snprintf(name, sizeof name, "after-%d", ++serial);
  dist_mesh *mesh = NULL;
  cr_assert_eq(dist_mesh_from_string(text, NULL, &mesh), 0);
  float small[7] = {1, -2, 3, -4, 5, -6, 7};
  int64_t shape[1] = {7};
  dist_placement s0 = DIST_SHARD_DIM(0), rep = DIST_REPLICATED;
  dist_tensor *t = NULL;
  cr_assert_eq(dist_shard_tensor(c, name, small, DIST_FLOAT32, 1, shape, mesh, &s0, &t), 0,
               "after %s: put on %s: %s", after, text, dist_errmsg(c));
  cr_assert_eq(dist_reshard(c, t, NULL, &rep), 0, "after %s: reshard on %s: %s", after, text,
               dist_errmsg(c));
  void *data = NULL;
  size_t nb = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &nb), 0, "after %s: %s", after, dist_errmsg(c));
  expect_floats(data, nb, small, 7, after);
  cr_assert_eq(dist_tensor_delete(c, name), 0, "after %s: %s", after, dist_errmsg(c));
  free(data);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  dist_close(c);
}

/* A new collective over exactly these ranks, from fresh SPMD trainers. */
static void expect_collective_served(const int *ranks, int n, const char *after) {
  static int serial;
  char job[128], when[200];
  snprintf(job, sizeof job, "%s-after-%d-%d", cluster.cluster_id, (int)getpid(), ++serial);
  snprintf(when, sizeof when, "after %s", after);
  harness_expect_all_reduce(&cluster, ranks, n, job, when);
}

static void expect_served(const int *ranks, int n, const char *after) {
  expect_tensors_served(ranks, n, after);
  expect_collective_served(ranks, n, after);
}

/* ------------------------------------------------------------ kills */

/* SPMD trainers loop over one operation; rank `victim` is killed in the
 * middle; the others must fail naming it, then serve. */
static void kill_mid_spmd(loop_kind kind, const char *op_kind, int n, int victim) {
  start(n);
  char job[128];
  snprintf(job, sizeof job, "%s-loop", cluster.cluster_id);
  loop_run run;
  start_trainers(&run, kind, job);
  double at = fault_mid_op(run.lp, run.n, victim, SIGKILL);
  int survivors[HARNESS_MAX], ns = 0;
  for (int r = 0; r < n; r++) {
    join_trainer(&run, r);
    if (r == victim) continue;
    survivors[ns++] = r;
    char who[32];
    snprintf(who, sizeof who, "trainer %d", r);
    expect_names_peer(&run.lp[r], who, victim, at);
  }
  expect_ops_failed(survivors, ns, op_kind, victim, 1);
  expect_served(survivors, ns, "the kill");
  stop_cluster();
}

Test(faults, kill_mid_all_reduce_fails_survivors_naming_the_peer) {
  kill_mid_spmd(LOOP_ALL_REDUCE, "all_reduce", 4, 2);
}

Test(faults, kill_mid_global_scatter_fails_survivors_naming_the_peer) {
  kill_mid_spmd(LOOP_SCATTER, "global_scatter", 3, 1);
}

/* A single client reshards (test_tensor covers SPMD trainers): its error
 * names the dead rank, and so does each survivor's own record of the op. */
Test(faults, kill_mid_reshard_from_one_client_names_the_peer_everywhere) {
  start(4);
  looper lp = {harness_client(&cluster), LOOP_RESHARD, -1, 4, 0, 0, "", 0};
  pthread_t th;
  pthread_create(&th, NULL, loop_until_failure, &lp);
  double at = fault_mid_op(&lp, 1, 3, SIGKILL);
  pthread_join(th, NULL);
  expect_names_peer(&lp, "the client", 3, at);
  dist_close(lp.c);
  int survivors[3] = {0, 1, 2};
  expect_ops_failed(survivors, 3, "reshard", 3, 0);
  expect_served(survivors, 3, "the kill");
  stop_cluster();
}

/* ------------------------------------------------------------ checkpoint */

static char *manifest_text(const char *dir) {
  char path[600];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  FILE *f = fopen(path, "r");
  if (!f) return strdup("");
  char *s = calloc(1, 1 << 20);
  size_t n = fread(s, 1, (1 << 20) - 1, f);
  s[n] = 0;
  fclose(f);
  return s;
}

typedef struct saver {
  dist_client *c;
  const char *dir;
  int rc;
  char msg[600];
  double failed_at;
} saver;

static void *save_checkpoint(void *arg) {
  saver *s = arg;
  dist_checkpoint_info info;
  s->rc = dist_checkpoint_save(s->c, s->dir, NULL, &info);
  s->failed_at = harness_now_s();
  snprintf(s->msg, sizeof s->msg, "%s", dist_errmsg(s->c));
  return NULL;
}

static void put_floats(dist_client *c, const char *name, const float *v, int64_t n,
                       const char *mesh_text) {
  dist_mesh *mesh = NULL;
  cr_assert_eq(dist_mesh_from_string(mesh_text, NULL, &mesh), 0);
  dist_placement p = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  dist_tensor_delete(c, name);
  cr_assert_eq(dist_shard_tensor(c, name, v, DIST_FLOAT32, 1, &n, mesh, &p, &t), 0, "%s: %s",
               name, dist_errmsg(c));
  dist_tensor_free(t);
  dist_mesh_free(mesh);
}

static void expect_tensor(dist_client *c, const char *name, const float *want, size_t n) {
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, name, &t), 0, "%s: %s", name, dist_errmsg(c));
  void *data = NULL;
  size_t nb = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &nb), 0, "%s: %s", name, dist_errmsg(c));
  expect_floats(data, nb, want, n, name);
  free(data);
  dist_tensor_free(t);
}

/* Rank 1 is killed while it writes its file of the second save (its
 * rank1.*.safetensors.tmp exists): the save fails naming it, the manifest
 * still describes the first checkpoint, which restores exactly once rank 1
 * is back, and the next good save removes every leftover. */
Test(faults, kill_mid_checkpoint_save_keeps_the_previous_checkpoint) {
  start(3);
  dist_client *c = harness_client(&cluster);
  char dir[400];
  snprintf(dir, sizeof dir, "%s/ckpt", cluster.dir);
  float first[6] = {1, 2, 3, 4, 5, 6}, second[6] = {-1, -2, -3, -4, -5, -6};
  put_floats(c, "w", first, 6, "[0,1,2]");
  dist_checkpoint_info info;
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, &info), 0, "%s", dist_errmsg(c));
  char *before = manifest_text(dir);
  cr_assert(strlen(before) > 0, "the first save wrote no manifest");

  /* 3 x 64 MiB, so that writing and syncing each file takes a while. */
  put_floats(c, "w", second, 6, "[0,1,2]");
  int64_t n = 48 << 20;
  float *big = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) big[i] = (float)(i % 4093);
  put_floats(c, "big", big, n, "[0,1,2]");
  free(big);

  saver s = {c, dir, 0, "", 0};
  pthread_t th;
  pthread_create(&th, NULL, save_checkpoint, &s);
  double at = 0;
  for (double until = harness_now_s() + 30; harness_now_s() < until && !at;) {
    if (harness_count_files(dir, "rank1.", ".safetensors.tmp") > 0) {
      at = harness_now_s();
      harness_kill(&cluster, 1, SIGKILL);
    }
    usleep(500);
  }
  pthread_join(th, NULL);
  cr_assert(at > 0, "rank 1's temporary file never appeared (save: %s)",
            s.rc ? s.msg : "succeeded");
  looper as_looper = {NULL, LOOP_ALL_REDUCE, -1, 3, 1, s.rc, "", s.failed_at};
  snprintf(as_looper.msg, sizeof as_looper.msg, "%s", s.msg);
  expect_names_peer(&as_looper, "the save", 1, at);

  char *after = manifest_text(dir);
  cr_assert_str_eq(after, before, "the failed save changed manifest.json");
  free(after);
  cr_assert_eq(harness_count_files(dir, "", ".tmp") <= 1, 1,
               "survivors left temporary files behind");
  int survivors[2] = {0, 2};
  expect_served(survivors, 2, "the kill mid-save");

  /* Rank 1 back (empty store): the first checkpoint restores exactly. */
  dist_close(c);
  restart_rank(1);
  c = harness_client(&cluster);
  dist_checkpoint_opts only_w = DIST_CHECKPOINT_OPTS_INIT;
  const char *names[1] = {"w"};
  only_w.tensors = names, only_w.ntensors = 1;
  cr_assert_eq(dist_checkpoint_restore(c, dir, &only_w, &info), 0, "%s", dist_errmsg(c));
  expect_tensor(c, "w", first, 6);
  /* The next save succeeds and leaves exactly one file per rank. */
  dist_tensor_delete(c, "big");
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, &info), 0, "%s", dist_errmsg(c));
  cr_assert_eq(harness_count_files(dir, "rank", ".safetensors"), 3, "leftover checkpoint files");
  cr_assert_eq(harness_count_files(dir, "", ".tmp"), 0, "leftover temporary files");
  free(before);
  dist_close(c);
  stop_cluster();
}

/* ------------------------------------------------------------ a frozen peer */

/* SIGSTOP keeps a daemon's sockets open while nothing moves: the others
 * must give up on it within the peer timeout, naming it. Resumed, it
 * serves again and the cluster works as a whole. */
Test(faults, frozen_peer_fails_the_collective_within_the_timeout_then_rejoins) {
  start(3);
  char job[128];
  snprintf(job, sizeof job, "%s-loop", cluster.cluster_id);
  loop_run run;
  start_trainers(&run, LOOP_ALL_REDUCE, job);
  double at = fault_mid_op(run.lp, run.n, 2, SIGSTOP);
  for (int r = 0; r < 2; r++) {
    join_trainer(&run, r);
    char who[32];
    snprintf(who, sizeof who, "trainer %d", r);
    expect_names_peer(&run.lp[r], who, 2, at);
  }
  int survivors[2] = {0, 1};
  expect_ops_failed(survivors, 2, "all_reduce", 2, 1);
  expect_tensors_served(survivors, 2, "rank 2 froze");
  kill(cluster.pids[2], SIGCONT);
  join_trainer(&run, 2); /* its daemon answers again: bounded by the client deadline */
  harness_assert_all_connected(&cluster, "after rank 2 resumed");
  int all[3] = {0, 1, 2};
  expect_served(all, 3, "rank 2 resumed");
  stop_cluster();
}

/* ------------------------------------------------------------ a cut connection */

/* Where the dialler's frame stream stands, so a cut can land inside a
 * DATA frame: a cut between frames loses nothing, and nothing need fail. */
typedef struct frame_track {
  uint8_t hdr[DIST_FRAME_HEADER_SIZE];
  size_t have;      /* header bytes seen of the current frame */
  uint64_t payload; /* payload bytes still to come */
} frame_track;

/* How many of buf's n bytes to forward before cutting inside a DATA frame:
 * everything up to the end of the first DATA header with a payload, or n
 * when buf holds none. Tracks the stream either way. */
static size_t frame_track_cut_point(frame_track *t, const uint8_t *buf, size_t n) {
  for (size_t off = 0; off < n;) {
    if (t->payload > 0) {
      size_t take = n - off < t->payload ? n - off : (size_t)t->payload;
      t->payload -= take;
      off += take;
      continue;
    }
    t->hdr[t->have++] = buf[off++];
    if (t->have < DIST_FRAME_HEADER_SIZE) continue;
    t->have = 0;
    dist_frame_header h;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    if (dist_frame_decode(t->hdr, &h, &eb) != 0) return off; /* not a stream we know */
    t->payload = h.length;
    if (h.kind == DIST_FRAME_DATA && h.length > 0) return off;
  }
  return n;
}

/* A TCP relay between one daemon and one peer port. Once cut is set, it
 * forwards the dialler's bytes up to the next DATA frame's header, then
 * closes the connections it carries (a real cut mid-frame: both daemons
 * see their socket end, and the frame is lost); it keeps accepting, so the
 * dialler can reconnect through it. */
typedef struct proxy {
  int listen_fd, port, target_port;
  int fds[16][2]; /* accepted side, target side; -1 = free */
  frame_track track[16]; /* the accepted side's stream */
  pthread_mutex_t mu;
  int cut, stop;
  int throttle_ms; /* the dialler's bytes: one PROXY_SLOW_CHUNK per this */
  int frozen;      /* the dialler's bytes are not read at all */
  uint64_t relayed;
  double cut_at; /* when the cut happened (now_s), 0 before */
  pthread_t th;
} proxy;

enum { PROXY_SLOW_CHUNK = 16 << 10 };

/* Reads and sets the proxy's flags across its thread. */
static int proxy_get(proxy *p, const int *flag) {
  pthread_mutex_lock(&p->mu);
  int v = *flag;
  pthread_mutex_unlock(&p->mu);
  return v;
}

static void proxy_put(proxy *p, int *flag, int v) {
  pthread_mutex_lock(&p->mu);
  *flag = v;
  pthread_mutex_unlock(&p->mu);
}

static void proxy_close_all(proxy *p) {
  for (int i = 0; i < 16; i++)
    for (int k = 0; k < 2; k++)
      if (p->fds[i][k] >= 0) close(p->fds[i][k]), p->fds[i][k] = -1;
}

static void proxy_cut_now(proxy *p) {
  proxy_close_all(p);
  pthread_mutex_lock(&p->mu);
  p->cut = 0;
  p->cut_at = harness_now_s();
  pthread_mutex_unlock(&p->mu);
}

static int connect_port(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void proxy_accept(proxy *p) {
  int a = accept(p->listen_fd, NULL, NULL);
  if (a < 0) return;
  int b = connect_port(p->target_port);
  for (int i = 0; b >= 0 && i < 16; i++)
    if (p->fds[i][0] < 0) {
      p->fds[i][0] = a, p->fds[i][1] = b;
      p->track[i] = (frame_track){0};
      return;
    }
  close(a);
  if (b >= 0) close(b);
}

/* Moves what is readable on fds[i][k] to the other side; closes the pair
 * when either side ends, and everything at the cut point of an armed cut. */
static void proxy_relay(proxy *p, int i, int k) {
  uint8_t buf[1 << 16];
  int throttle = k == 0 ? proxy_get(p, &p->throttle_ms) : 0;
  ssize_t n = read(p->fds[i][k], buf, throttle ? PROXY_SLOW_CHUNK : sizeof buf), len = n;
  int cut = 0;
  if (n > 0 && k == 0) {
    len = (ssize_t)frame_track_cut_point(&p->track[i], buf, (size_t)n);
    cut = len < n && proxy_get(p, &p->cut);
    if (!cut) len = n;
  }
  for (ssize_t off = 0; n > 0 && off < len;) {
    /* A side that closed must end the pair, not the test (SIGPIPE). */
    ssize_t w = send(p->fds[i][!k], buf + off, (size_t)(len - off), MSG_NOSIGNAL);
    if (w <= 0) {
      n = -1;
      break;
    }
    off += w;
  }
  if (n <= 0) {
    close(p->fds[i][0]), close(p->fds[i][1]);
    p->fds[i][0] = p->fds[i][1] = -1;
    return;
  }
  __atomic_add_fetch(&p->relayed, (uint64_t)len, __ATOMIC_RELAXED);
  if (cut) proxy_cut_now(p);
  if (throttle) harness_sleep_ms(throttle);
}

static void *proxy_run(void *arg) {
  proxy *p = arg;
  for (;;) {
    if (proxy_get(p, &p->stop)) {
      proxy_close_all(p);
      return NULL;
    }
    int frozen = proxy_get(p, &p->frozen);
    struct pollfd pf[33];
    int map[33][2], n = 0;
    pf[n++] = (struct pollfd){p->listen_fd, POLLIN, 0};
    for (int i = 0; i < 16; i++)
      for (int k = frozen ? 1 : 0; k < 2; k++)
        if (p->fds[i][k] >= 0) {
          map[n][0] = i, map[n][1] = k;
          pf[n++] = (struct pollfd){p->fds[i][k], POLLIN, 0};
        }
    if (poll(pf, (nfds_t)n, 50) <= 0) continue;
    if (pf[0].revents) proxy_accept(p);
    for (int j = 1; j < n; j++)
      if (pf[j].revents && p->fds[map[j][0]][map[j][1]] >= 0) proxy_relay(p, map[j][0], map[j][1]);
  }
}

static void proxy_start(proxy *p, int target_port) {
  memset(p, 0, sizeof *p);
  memset(p->fds, -1, sizeof p->fds);
  pthread_mutex_init(&p->mu, NULL);
  p->target_port = target_port;
  p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(p->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  cr_assert_eq(bind(p->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(p->listen_fd, 8), 0);
  getsockname(p->listen_fd, (struct sockaddr *)&a, &len);
  p->port = ntohs(a.sin_port);
  pthread_create(&p->th, NULL, proxy_run, p);
}

static void proxy_stop(proxy *p) {
  proxy_put(p, &p->stop, 1);
  pthread_join(p->th, NULL);
  close(p->listen_fd);
  pthread_mutex_destroy(&p->mu);
}

static proxy cut_proxy;
static void stop_cluster_and_proxy(void) {
  stop_cluster();
  if (cut_proxy.listen_fd > 0) proxy_stop(&cut_proxy);
  cut_proxy.listen_fd = 0;
}

/* n daemons; rank 0 reaches rank 1's peer port only through cut_proxy
 * (its own cluster file says so; the others dial directly). peer_timeout:
 * the daemons' --peer-timeout, or NULL for the harness's. */
static void start_with_proxied_link(int n, const char *peer_timeout) {
  const char *args[] = {"--peer-timeout", peer_timeout, NULL};
  harness_start_unique(&cluster, n, "faults", peer_timeout ? args : NULL);
  proxy_start(&cut_proxy, cluster.peer_port[1]);
  char file[400];
  snprintf(file, sizeof file, "%s/cluster.rank0.conf", cluster.dir);
  FILE *f = fopen(file, "w");
  cr_assert(f);
  for (int r = 0; r < n; r++)
    fprintf(f, "127.0.0.1:%d 127.0.0.1:%d\n", cluster.grpc_port[r],
            r == 1 ? cut_proxy.port : cluster.peer_port[r]);
  fclose(f);
  harness_kill(&cluster, 0, SIGTERM);
  const char *args0[] = {"--cluster-file", file, "--peer-timeout", peer_timeout, NULL};
  if (!peer_timeout) args0[2] = NULL;
  harness_start_rank_again(&cluster, 0, args0);
  harness_assert_all_connected(&cluster, "through the proxy");
  cr_assert_gt(__atomic_load_n(&cut_proxy.relayed, __ATOMIC_RELAXED), 0,
               "rank 0 does not reach rank 1 through the proxy");
}

/* Closing the proxy's connections mid-collective cuts rank 0 -> rank 1 and
 * nothing else: rank 0 must name rank 1 and rank 1 must name rank 0; rank
 * 0 then redials through the proxy and the whole cluster works again. */
Test(faults, cut_connection_fails_both_ends_naming_each_other_then_reconnects,
     .fini = stop_cluster_and_proxy) {
  start_with_proxied_link(3, NULL);

  char job[128];
  snprintf(job, sizeof job, "%s-loop", cluster.cluster_id);
  loop_run run;
  start_trainers(&run, LOOP_ALL_REDUCE, job);
  wait_progress(run.lp, run.n);
  uint64_t relayed_before = __atomic_load_n(&cut_proxy.relayed, __ATOMIC_RELAXED);
  proxy_put(&cut_proxy, &cut_proxy.cut, 1); /* lands inside the next DATA frame */
  for (int r = 0; r < 3; r++) join_trainer(&run, r);
  pthread_mutex_lock(&cut_proxy.mu);
  double at = cut_proxy.cut_at;
  pthread_mutex_unlock(&cut_proxy.mu);
  cr_assert_gt(at, 0, "the proxy never cut: no DATA frame went through it");
  cr_assert_gt(relayed_before, (uint64_t)AR_COUNT, "the collective did not go through the proxy");
  expect_names_peer(&run.lp[0], "trainer 0", 1, at);
  expect_names_peer(&run.lp[1], "trainer 1", 0, at);
  cr_expect_neq(run.lp[2].rc, 0, "trainer 2 never failed");
  cr_expect(run.lp[2].failed_at - at < PEER_TIMEOUT_S + SLACK_S, "trainer 2 failed %.1f s late",
            run.lp[2].failed_at - at);
  int r0[1] = {0}, r1[1] = {1};
  expect_ops_failed(r0, 1, "all_reduce", 1, 1);
  expect_ops_failed(r1, 1, "all_reduce", 0, 1);
  harness_assert_all_connected(&cluster, "after the cut");
  int all[3] = {0, 1, 2};
  expect_served(all, 3, "the cut");
  stop_cluster_and_proxy();
}

/* ------------------------------------------------------------ a slow link */

typedef struct timed_scatter {
  looper lp;
  double seconds;
} timed_scatter;

static void *scatter_timed(void *arg) {
  timed_scatter *t = arg;
  float *x = malloc(sizeof(float) * 8 * SC_ROWS * SC_WIDTH);
  double t0 = harness_now_s();
  t->lp.rc = scatter_once(&t->lp, x);
  t->seconds = harness_now_s() - t0;
  snprintf(t->lp.msg, sizeof t->lp.msg, "%s", t->lp.rc ? dist_errmsg(t->lp.c) : "ok");
  free(x);
  return NULL;
}

/* One global_scatter (SC_ROWS rows each way) from two SPMD trainers. Both
 * clients are made before either thread runs: harness_spmd_client sets
 * the environment, which a running client may be reading. */
static void scatter_on_two(timed_scatter *t, const char *job) {
  pthread_t th[2];
  for (int r = 0; r < 2; r++)
    t[r] = (timed_scatter){{harness_spmd_client(&cluster, r, job), LOOP_SCATTER, r, 2, 0, 0, "",
                            0},
                           0};
  for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, scatter_timed, &t[r]);
  for (int r = 0; r < 2; r++) {
    pthread_join(th[r], NULL);
    dist_close(t[r].lp.c);
  }
}

/* peer_timeout bounds silence, not duration: over a link throttled to
 * about 1.6 MB/s, a 4 MiB scatter takes more than twice the 1 s timeout
 * and succeeds, because bytes keep moving. Once the link stalls (the
 * relay stops reading), the rank waiting for them fails about 1 s later
 * naming the silent peer. */
Test(faults, peer_timeout_bounds_silence_not_a_slow_transfer, .fini = stop_cluster_and_proxy) {
  start_with_proxied_link(2, "1s");
  proxy_put(&cut_proxy, &cut_proxy.throttle_ms, 10);
  char job[128];
  snprintf(job, sizeof job, "%s-slow", cluster.cluster_id);
  timed_scatter t[2];
  scatter_on_two(t, job);
  for (int r = 0; r < 2; r++)
    cr_assert_eq(t[r].lp.rc, 0, "rank %d over the slow link: %s", r, t[r].lp.msg);
  cr_expect_gt(t[1].seconds, 2.0, "rank 1 took only %.2f s: the link was not slow",
               t[1].seconds);

  proxy_put(&cut_proxy, &cut_proxy.frozen, 1);
  snprintf(job, sizeof job, "%s-stalled", cluster.cluster_id);
  scatter_on_two(t, job);
  cr_assert_neq(t[1].lp.rc, 0, "rank 1 never failed over a stalled link");
  cr_expect(strstr(t[1].lp.msg, "rank 0"), "rank 1: '%s' does not name rank 0", t[1].lp.msg);
  cr_expect(t[1].seconds > 0.9 && t[1].seconds < 1.0 + SLACK_S,
            "rank 1 failed after %.2f s over a stalled link (timeout 1 s): %s", t[1].seconds,
            t[1].lp.msg);
  cr_log_info("stalled link: rank 1 failed after %.2f s: %s", t[1].seconds, t[1].lp.msg);
  proxy_put(&cut_proxy, &cut_proxy.frozen, 0);
  stop_cluster_and_proxy();
}

/* ------------------------------------------------------------ raw frames */

static void send_all(int fd, const void *buf, size_t n) {
  cr_assert_eq(send(fd, buf, n, MSG_NOSIGNAL), (ssize_t)n, "send: %s", strerror(errno));
}

static void send_header(int fd, uint16_t version, uint16_t kind, uint32_t src,
                        uint64_t op_id, uint64_t length) {
  dist_frame_header h = {DIST_FRAME_MAGIC, version, kind, op_id, src, 0, length, 0};
  uint8_t out[DIST_FRAME_HEADER_SIZE];
  dist_frame_encode(&h, out);
  send_all(fd, out, sizeof out);
}

static void send_hello(int fd, uint16_t version, uint32_t rank, const char *id) {
  dist_hello hello = {rank, (uint32_t)cluster.n, {0}, 0x5eed0000u + rank};
  snprintf(hello.cluster_id, sizeof hello.cluster_id, "%s", id);
  uint8_t payload[DIST_HELLO_SIZE];
  dist_hello_encode(&hello, payload);
  send_header(fd, version, DIST_FRAME_HELLO, rank, 0, DIST_HELLO_SIZE);
  send_all(fd, payload, sizeof payload);
}

/* Reads one frame header (bounded by the socket's 5 s receive timeout);
 * the payload, if any, goes to text (NUL-terminated). -1 at EOF. */
static int read_frame(int fd, dist_frame_header *h, char *text, size_t len) {
  uint8_t buf[DIST_FRAME_HEADER_SIZE];
  if (recv(fd, buf, sizeof buf, MSG_WAITALL) != (ssize_t)sizeof buf) return -1;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_frame_decode(buf, h, &eb), 0, "the daemon sent a bad header: %s", eb.msg);
  size_t n = h->length < len - 1 ? (size_t)h->length : len - 1;
  ssize_t got = n ? recv(fd, text, n, MSG_WAITALL) : 0;
  text[got > 0 ? got : 0] = 0;
  return 0;
}

/* The daemon must close the connection (EOF or reset) within 5 s. */
static void expect_closed(int fd, const char *after) {
  char buf[256];
  ssize_t n;
  double until = harness_now_s() + 5;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0 && harness_now_s() < until) continue;
  cr_expect(n == 0 || (n < 0 && errno == ECONNRESET), "after %s the daemon kept the connection",
            after);
  close(fd);
}

static void expect_logged(int r, long from, const char *const *needles, const char *what) {
  cr_expect(harness_log_wait(&cluster, r, from, needles, 5000),
            "rank %d logged no line with '%s'%s%s after %s (log %s/distd.%d.log)", r, needles[0],
            needles[1] ? " and '" : "", needles[1] ? needles[1] : "", what, cluster.dir, r);
}

/* A fake rank 2 (the real one is down) greets rank 0 correctly, announces
 * a 1 MiB DATA frame, sends 1000 bytes of it and hangs up. Rank 0 logs the
 * lost peer, keeps serving, and the real rank 2 rejoins. */
Test(faults, truncated_frame_from_a_fake_peer_then_the_real_one_rejoins) {
  start(3);
  harness_kill(&cluster, 2, SIGKILL);
  cr_assert(harness_wait_connected(&cluster, 0, 1, 10000), "rank 0 still sees rank 2");
  long from = harness_log_size(&cluster, 0);
  int fd = connect_port(cluster.peer_port[0]);
  cr_assert(fd >= 0, "cannot connect to rank 0's peer port");
  send_hello(fd, DIST_FRAME_VERSION, 2, cluster.cluster_id);
  dist_frame_header h;
  char text[512];
  cr_assert_eq(read_frame(fd, &h, text, sizeof text), 0, "no answer to a valid hello");
  cr_assert_eq(h.kind, DIST_FRAME_HELLO_ACK, "answer kind %u: %s", h.kind, text);
  send_header(fd, DIST_FRAME_VERSION, DIST_FRAME_DATA, 2, 0x7a11ull << 32, 1 << 20);
  char part[1000];
  memset(part, 0x5a, sizeof part);
  send_all(fd, part, sizeof part);
  close(fd);
  const char *lost[] = {"peer rank 2", "lost", NULL};
  expect_logged(0, from, lost, "a truncated DATA frame");

  int survivors[2] = {0, 1};
  expect_served(survivors, 2, "the truncated frame");
  restart_rank(2);
  int all[3] = {0, 1, 2};
  expect_served(all, 3, "the real rank 2 came back");
  stop_cluster();
}

/* Garbage, a wrong cluster id and a wrong protocol version are each refused
 * with a log line saying what is wrong; the real peers stay connected. */
Test(faults, garbage_and_mismatched_hellos_are_refused_and_change_nothing) {
  start(3);
  long from = harness_log_size(&cluster, 0);
  int fd = connect_port(cluster.peer_port[0]);
  uint8_t junk[DIST_FRAME_HEADER_SIZE + 24];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
  send_all(fd, junk, sizeof junk);
  expect_closed(fd, "garbage");
  const char *magic[] = {"bad magic", NULL};
  expect_logged(0, from, magic, "garbage");

  from = harness_log_size(&cluster, 0);
  fd = connect_port(cluster.peer_port[0]);
  send_hello(fd, DIST_FRAME_VERSION, 1, "some-other-cluster");
  dist_frame_header h;
  char text[512];
  cr_assert_eq(read_frame(fd, &h, text, sizeof text), 0, "no answer to a foreign hello");
  cr_expect_eq(h.kind, DIST_FRAME_HELLO_REJECT, "a foreign hello got kind %u", h.kind);
  cr_expect(strstr(text, "cluster id"), "the rejection '%s' does not say why", text);
  expect_closed(fd, "a foreign hello");
  const char *foreign[] = {"rejected", "cluster id 'some-other-cluster'", NULL};
  expect_logged(0, from, foreign, "a foreign hello");

  from = harness_log_size(&cluster, 0);
  fd = connect_port(cluster.peer_port[0]);
  send_hello(fd, 7, 1, cluster.cluster_id);
  expect_closed(fd, "a hello of protocol version 7");
  const char *version[] = {"protocol version 7", NULL};
  expect_logged(0, from, version, "a hello of protocol version 7");

  cr_assert(harness_wait_connected(&cluster, 0, 2, 5000),
            "rank 0 lost a real peer to the refused connections");
  int all[3] = {0, 1, 2};
  expect_served(all, 3, "refused connections");
  stop_cluster();
}

/* ------------------------------------------------------------ restart */

/* Killed (SIGKILL) or stopped (SIGTERM, exits 0) and started again with the
 * same arguments, a daemon rejoins, its peers count the reconnect, and new
 * operations involving it work. */
/* A connection that never says HELLO is closed after the peer timeout, and
 * the daemon says so; the real peers are not disturbed. */
Test(faults, silent_inbound_connection_is_closed_after_the_peer_timeout) {
  start(2);
  long from = harness_log_size(&cluster, 0);
  int fd = connect_port(cluster.peer_port[0]);
  cr_assert_geq(fd, 0, "cannot connect to rank 0's peer port");
  double t0 = harness_now_s();
  char buf[64];
  ssize_t n = -1;
  while (harness_now_s() - t0 < PEER_TIMEOUT_S + SLACK_S) { /* recv waits 5 s at most */
    n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) break;
  }
  double after = harness_now_s() - t0;
  close(fd);
  cr_expect(n == 0 || (n < 0 && errno == ECONNRESET), "a silent connection was kept %.1f s",
            after);
  cr_expect(after >= PEER_TIMEOUT_S - 1, "closed after %.1f s, before the %g s timeout", after,
            PEER_TIMEOUT_S);
  const char *said[] = {"sent no HELLO within 5000 ms", NULL};
  expect_logged(0, from, said, "a silent connection");
  cr_assert(harness_wait_connected(&cluster, 0, 1, 5000), "rank 0 lost its real peer");
  int all[2] = {0, 1};
  expect_served(all, 2, "a silent connection");
  stop_cluster();
}

Test(faults, restarted_daemon_rejoins_and_serves) {
  start(3);
  int all[3] = {0, 1, 2};
  const int sigs[2] = {SIGKILL, SIGTERM};
  for (int i = 0; i < 2; i++) {
    int status = harness_kill(&cluster, 1, sigs[i]);
    if (sigs[i] == SIGTERM)
      cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "rank 1 did not exit cleanly on SIGTERM (status 0x%x)", status);
    int survivors[2] = {0, 2};
    expect_tensors_served(survivors, 2, "rank 1 went down");
    restart_rank(1);
    dist_client *c = harness_client(&cluster);
    dist_daemon_info info;
    cr_assert_eq(dist_info(c, 0, &info), 0, "%s", dist_errmsg(c));
    uint32_t reconnects = 0;
    for (int k = 0; k < info.npeers; k++)
      if (info.peers[k].rank == 1) reconnects = info.peers[k].reconnects;
    cr_expect_geq(reconnects, (uint32_t)(i + 1), "rank 0 counts %u reconnects of rank 1",
                  reconnects);
    dist_info_free(&info);
    dist_close(c);
    expect_served(all, 3, sigs[i] == SIGKILL ? "a restart after SIGKILL"
                                             : "a restart after SIGTERM");
  }
  stop_cluster();
}
