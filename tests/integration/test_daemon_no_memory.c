/* Operations across daemons that one daemon cannot allocate for: every
 * daemon of the op refuses it, and none keeps a part of it. Rank 1 runs
 * under tests/alloc/failalloc.so, which fails the first allocation of a
 * size the test picks (FAIL_ALLOC_SIZE) once the daemon is armed
 * (SIGUSR2): the size is that of the allocation the op makes last, which
 * each daemon used to make after the others had committed. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "harness_fixture.h"
#include "wire.h" /* dist_wire_meta: the size of a reply's descriptions */

TestSuite(daemon_no_memory, .fini = stop_cluster, .timeout = 120);

/* The shim, next to the daemon in the build tree (build/daemon/distd). */
static void shim_path(char *out, size_t len) {
  const char *distd = harness_distd();
  const char *end = strstr(distd, "/daemon/distd");
  cr_assert(end, "cannot place the build tree from %s", distd);
  snprintf(out, len, "%.*s/tests/alloc/failalloc.so", (int)(end - distd), distd);
  struct stat st;
  cr_assert_eq(stat(out, &st), 0, "no allocation shim at %s", out);
}

/* Two daemons, each loading the shim unarmed, set to fail the nth
 * allocation of `bytes` once armed. Under ASan the shim comes before
 * ASan's runtime, which must be told to allow it. */
static void start_failing_size(size_t bytes, int nth) {
  char shim[600], size[32], nth_s[16], asan[600];
  const char *asan_was = getenv("ASAN_OPTIONS");
  shim_path(shim, sizeof shim);
  snprintf(size, sizeof size, "%zu", bytes);
  snprintf(nth_s, sizeof nth_s, "%d", nth);
  snprintf(asan, sizeof asan, "%s%sverify_asan_link_order=0", asan_was ? asan_was : "",
           asan_was ? ":" : "");
  char *keep_asan = asan_was ? strdup(asan_was) : NULL;
  setenv("LD_PRELOAD", shim, 1);
  setenv("FAIL_ALLOC_ARMED_BY_SIGUSR2", "1", 1);
  setenv("FAIL_ALLOC_SIZE", size, 1);
  setenv("FAIL_ALLOC_SIZE_NTH", nth_s, 1);
  setenv("ASAN_OPTIONS", asan, 1);
  harness_start(&cluster, 2, NULL);
  unsetenv("LD_PRELOAD");
  unsetenv("FAIL_ALLOC_ARMED_BY_SIGUSR2");
  unsetenv("FAIL_ALLOC_SIZE");
  unsetenv("FAIL_ALLOC_SIZE_NTH");
  if (keep_asan) setenv("ASAN_OPTIONS", keep_asan, 1);
  else unsetenv("ASAN_OPTIONS");
  free(keep_asan);
}

/* Arms rank 1's shim; returns its log's size, for shim_fired. */
static long arm_rank1(void) {
  long from = harness_log_size(&cluster, 1);
  cr_assert_eq(kill(cluster.pids[1], SIGUSR2), 0);
  return from;
}

/* The allocation failed on rank 1 (else the test tried nothing). */
static void expect_shim_fired(long from) {
  const char *needles[] = {"failalloc: allocation", "fails", NULL};
  cr_assert(harness_log_wait(&cluster, 1, from, needles, 5000),
            "rank 1's allocation of the size set never failed");
}

static void expect_held_by_none(const char *name) {
  for (int r = 0; r < 2; r++) {
    dist_tensor *t = NULL;
    cr_expect_eq(harness_open_on(&cluster, r, name, &t), DIST_ENOTFOUND,
                 "rank %d holds '%s'", r, name);
    dist_tensor_free(t);
  }
}

/* ------------------------------------------------ dtensor_from_local */

#define PIECE 1013 /* float32s: a piece of 4052 bytes, a size of its own */

typedef struct trainer {
  dist_client *c;
  int rank, rc;
  char msg[600];
} trainer;

static void *put_local_piece(void *arg) {
  trainer *tr = arg;
  static float piece[PIECE];
  const void *pieces[1] = {piece};
  const int64_t shape[1] = {PIECE}, *shapes[1] = {shape};
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_from_string("[0,1]", NULL, &m), 0);
  dist_placement shard = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  tr->rc = dist_dtensor_from_local(tr->c, "local", pieces, DIST_FLOAT32, 1, shapes, m, &shard,
                                   &t);
  snprintf(tr->msg, sizeof tr->msg, "%s", dist_errmsg(tr->c));
  dist_tensor_free(t);
  dist_mesh_free(m);
  return NULL;
}

/* fn(a) and fn(b) at once, as two SPMD trainers run. */
static void run_pair(void *a, void *b, void *(*fn)(void *)) {
  pthread_t th[2];
  pthread_create(&th[0], NULL, fn, a);
  pthread_create(&th[1], NULL, fn, b);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
}

/* Both trainers' calls ended with rc. */
static void expect_both(const trainer *t0, const trainer *t1, int rc) {
  cr_expect_eq(t0->rc, rc, "trainer 0: %s", t0->msg);
  cr_expect_eq(t1->rc, rc, "trainer 1: %s", t1->msg);
}

/* Two SPMD trainers of job put their pieces of "local" while rank 1 fails
 * the nth allocation of size bytes, which it must reach. */
static void put_pieces_failing(trainer tr[2], const char *job, size_t size, int nth) {
  start_failing_size(size, nth);
  for (int r = 0; r < 2; r++)
    tr[r] = (trainer){.c = harness_spmd_client(&cluster, r, job), .rank = r};
  long from = arm_rank1();
  run_pair(&tr[0], &tr[1], put_local_piece);
  expect_shim_fired(from);
}

/* Nothing was stored, and the shim fails once: the same put now succeeds
 * on both. Closes the trainers' clients. */
static void expect_none_then_a_put(trainer tr[2]) {
  expect_held_by_none("local");
  run_pair(&tr[0], &tr[1], put_local_piece);
  expect_both(&tr[0], &tr[1], 0);
  for (int r = 0; r < 2; r++) dist_close(tr[r].c);
}

/* Rank 1 allocated its piece after the shape exchange: rank 0 stored its
 * own and its trainer went on, while rank 1's failed. The request's bytes
 * are the first allocation of the piece's size, the piece the second. */
Test(daemon_no_memory, a_local_piece_one_daemon_cannot_allocate_is_stored_by_none) {
  trainer tr[2];
  put_pieces_failing(tr, "local-job", PIECE * sizeof(float), 2);
  expect_both(&tr[0], &tr[1], DIST_ENOMEM);
  cr_expect(strstr(tr[0].msg, "rank 1 refused its piece of 'local'"), "%s", tr[0].msg);
  expect_none_then_a_put(tr);
}

/* The list of every rank's piece a daemon checks the exchanged shapes
 * with (2 dist_shapes: 144 bytes, the first of that size once armed) is
 * taken before the exchange, which decides: taken after it, rank 1 failing
 * it refused the put while rank 0 stored its piece (a reviewer's find). */
Test(daemon_no_memory, a_pieces_list_one_daemon_cannot_allocate_is_stored_by_none) {
  trainer tr[2];
  put_pieces_failing(tr, "pieces-job", 2 * sizeof(dist_shape), 1);
  /* rank 0 learns of it as the exchange's abort, whose code is its own */
  cr_expect_eq(tr[1].rc, DIST_ENOMEM, "trainer 1: %s", tr[1].msg);
  cr_expect_neq(tr[0].rc, 0, "trainer 0 stored its piece");
  cr_expect(strstr(tr[0].msg, "out of memory for the shape exchange"), "%s", tr[0].msg);
  expect_none_then_a_put(tr);
}

/* Two daemons holding one tensor, "x" (4 float64s, Replicate on
 * [0, 1]), rank 1 set to fail the nth allocation of two dist_wire_meta:
 * the array of a reply describing one tensor (one spare). Returns a
 * client of both. */
static dist_client *start_with_one_tensor(int nth) {
  start_failing_size(2 * sizeof(dist_wire_meta), nth);
  dist_client *c = harness_client(&cluster);
  static const double x0[4] = {1.5, -2, 0.25, 8};
  int64_t n4 = 4;
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  return c;
}

/* ------------------------------------------------- LocalLayer calls */

typedef struct caller {
  trainer tr;
  dist_program *p;
  dist_invocation *inv; /* the last call's, kept for backward */
} caller;

static void *register_doubler(void *arg) {
  caller *cl = arg;
  cl->p = harness_doubler(0); /* one output: its reply describes one tensor */
  cl->tr.rc = dist_program_register(cl->tr.c, cl->p);
  snprintf(cl->tr.msg, sizeof cl->tr.msg, "%s", dist_errmsg(cl->tr.c));
  return NULL;
}

/* Calls the doubler on "x" into "y", keeping the invocation for backward
 * (releasing the one kept before). */
static void *call_doubler(void *arg) {
  caller *cl = arg;
  dist_tensor *x = NULL, *y = NULL;
  const char *names[1] = {"y"};
  if (cl->inv) dist_invocation_release(cl->tr.c, cl->inv);
  dist_invocation_free(cl->inv);
  cl->inv = NULL;
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.out_names = names;
  cl->tr.rc = dist_tensor_open(cl->tr.c, "x", &x);
  dist_arg args[1] = {{x, NULL}};
  if (cl->tr.rc == 0)
    cl->tr.rc = dist_local_layer_call(cl->tr.c, cl->p, args, 1, &o, &cl->inv, &y);
  snprintf(cl->tr.msg, sizeof cl->tr.msg, "%s", dist_errmsg(cl->tr.c));
  dist_tensor_free(y);
  dist_tensor_free(x);
  return NULL;
}

/* Backward of the kept invocation, from gradients of ones, into
 * "y.grad0". */
static void *backward_doubler(void *arg) {
  caller *cl = arg;
  static const double ones[4] = {1, 1, 1, 1};
  const dist_value og = {ones, DIST_FLOAT64, 1, {4}};
  const dist_arg out_grads[1] = {{NULL, &og}};
  dist_tensor *grad = NULL;
  cl->tr.rc = dist_backward(cl->tr.c, cl->inv, out_grads, NULL, &grad);
  snprintf(cl->tr.msg, sizeof cl->tr.msg, "%s", dist_errmsg(cl->tr.c));
  dist_tensor_free(grad);
  return NULL;
}

/* start_with_one_tensor(nth), and two SPMD trainers of job, each with
 * the doubler registered; then arms rank 1 (*from for expect_shim_fired).
 * Returns a client of both daemons. */
static dist_client *start_armed_callers(caller *cl, const char *job, int nth, long *from) {
  dist_client *c = start_with_one_tensor(nth);
  for (int r = 0; r < 2; r++)
    cl[r] = (caller){{.c = harness_spmd_client(&cluster, r, job), .rank = r}, NULL, NULL};
  run_pair(&cl[0], &cl[1], register_doubler);
  for (int r = 0; r < 2; r++) cr_assert_eq(cl[r].tr.rc, 0, "trainer %d: %s", r, cl[r].tr.msg);
  *from = arm_rank1();
  return c;
}

static void close_callers(caller *cl) {
  for (int r = 0; r < 2; r++) {
    dist_invocation_free(cl[r].inv);
    dist_program_free(cl[r].p);
    dist_close(cl[r].tr.c);
  }
}

/* Rank 1 made its reply after the vote: rank 0 stored "y", kept the
 * invocation and its trainer went on, while rank 1 failed, deleting its
 * "y" and releasing its invocation. */
Test(daemon_no_memory, a_call_one_daemon_cannot_reply_to_is_applied_by_none) {
  caller cl[2];
  long from;
  dist_client *c = start_armed_callers(cl, "call-job", 1, &from);
  run_pair(&cl[0], &cl[1], call_doubler);
  expect_shim_fired(from);
  expect_both(&cl[0].tr, &cl[1].tr, DIST_ENOMEM);
  cr_expect(strstr(cl[0].tr.msg, "rank 1 refused this invocation"), "%s", cl[0].tr.msg);
  expect_held_by_none("y");
  /* The shim fails once: the same call now succeeds on both. */
  run_pair(&cl[0], &cl[1], call_doubler);
  expect_both(&cl[0].tr, &cl[1].tr, 0);
  close_callers(cl);
  dist_close(c);
}

/* The same for backward: rank 0 stored the gradient and its trainer went
 * on, while rank 1 failed, deleting its own. The call's reply is the
 * first allocation of the size, the backward's the second. */
Test(daemon_no_memory, a_backward_one_daemon_cannot_reply_to_is_applied_by_none) {
  caller cl[2];
  long from;
  dist_client *c = start_armed_callers(cl, "backward-job", 2, &from);
  run_pair(&cl[0], &cl[1], call_doubler);
  for (int r = 0; r < 2; r++) cr_assert_eq(cl[r].tr.rc, 0, "trainer %d: %s", r, cl[r].tr.msg);
  run_pair(&cl[0], &cl[1], backward_doubler);
  expect_shim_fired(from);
  expect_both(&cl[0].tr, &cl[1].tr, DIST_ENOMEM);
  expect_held_by_none("y.grad0");
  /* The shim fails once: a call (into "y" again) and backward now
   * succeed on both. */
  cr_assert_eq(dist_tensor_delete(c, "y"), 0, "%s", dist_errmsg(c));
  run_pair(&cl[0], &cl[1], call_doubler);
  for (int r = 0; r < 2; r++) cr_assert_eq(cl[r].tr.rc, 0, "trainer %d: %s", r, cl[r].tr.msg);
  run_pair(&cl[0], &cl[1], backward_doubler);
  expect_both(&cl[0].tr, &cl[1].tr, 0);
  close_callers(cl);
  dist_close(c);
}

/* ------------------------------------------------- checkpoint saves */

/* Watches dir for files made in it (inotify: a file made and removed
 * meanwhile is seen too). */
static int watch_dir(const char *dir) {
  int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  cr_assert_geq(fd, 0);
  cr_assert_geq(inotify_add_watch(fd, dir, IN_CREATE | IN_MOVED_TO), 0, "watching %s", dir);
  return fd;
}

/* How many files the watch saw made whose names start with prefix. */
static int files_made(int fd, const char *prefix) {
  char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
  int made = 0;
  ssize_t len;
  while ((len = read(fd, buf, sizeof buf)) > 0)
    for (char *at = buf; at < buf + len;) {
      const struct inotify_event *ev = (const void *)at;
      if (ev->len && strncmp(ev->name, prefix, strlen(prefix)) == 0) made++;
      at += sizeof *ev + ev->len;
    }
  return made;
}

/* Rank 1 wrote its file, then could not make the reply: it failed the
 * save with its file on disk, left for the client's Discard. It now takes
 * the reply's memory first, and writes nothing. */
Test(daemon_no_memory, a_save_one_daemon_cannot_reply_to_writes_nothing_there) {
  dist_client *c = start_with_one_tensor(1);
  char dir[400];
  snprintf(dir, sizeof dir, "%s/ckpt", cluster.dir);
  cr_assert_eq(mkdir(dir, 0755), 0);
  int watch = watch_dir(dir);
  long from = arm_rank1();
  dist_checkpoint_info info;
  int rc = dist_checkpoint_save(c, dir, NULL, &info);
  expect_shim_fired(from);
  cr_expect_eq(rc, DIST_ENOMEM, "%s", dist_errmsg(c));
  cr_expect(strstr(dist_errmsg(c), "nothing written"), "%s", dist_errmsg(c));
  cr_expect_eq(files_made(watch, "rank1."), 0, "rank 1 wrote a file");
  cr_expect_eq(harness_count_files(dir, "", ".safetensors") + harness_count_files(dir, "", ".tmp"),
               0, "files left in %s", dir);
  close(watch);
  /* The shim fails once: the save now succeeds, a file from each. */
  cr_expect_eq(dist_checkpoint_save(c, dir, NULL, &info), 0, "%s", dist_errmsg(c));
  cr_expect_eq(harness_count_files(dir, "", ".safetensors"), 2);
  dist_close(c);
}
