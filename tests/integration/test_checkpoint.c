/* Checkpoints end to end: real daemons, libdist and distctl. Saved values
 * are compared byte for byte with what the test put in; corrupt, truncated
 * and interrupted checkpoints must leave both the store and the previous
 * checkpoint as they were. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "harness_fixture.h"

static dist_client *start(int n) {
  return harness_start_unique_with_client(&cluster, n, "ckpt-test", NULL);
}

TestSuite(checkpoint, .fini = stop_cluster, .timeout = 180);

/* Replaces any tensor of that name. */
static dist_tensor *put(dist_client *c, const char *name, dist_dtype dt,
                        const void *data, int ndim, const int64_t *shape,
                        const char *mesh_text, const char *placements) {
  dist_tensor_delete(c, name);
  return harness_put(c, name, dt, data, ndim, shape, mesh_text, placements);
}

static void expect_layout(dist_client *c, const char *name, const char *placements,
                          int nranks, int first_rank) {
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, name, &t), 0, "%s", dist_errmsg(c));
  char buf[128];
  const dist_mesh *m = dist_tensor_mesh(t);
  dist_placements_format(dist_tensor_placements(t), dist_mesh_ndim(m), buf, sizeof buf);
  cr_assert_str_eq(buf, placements);
  cr_assert_eq(dist_mesh_size(m), nranks);
  cr_assert_eq(dist_mesh_rank_at(m, 0), first_rank);
  dist_tensor_free(t);
}

static char ckpt_dir[400];

/* A restore from ckpt_dir refused with EINVAL, whose message holds needle
 * (NULL: any), leaves the tensor `name` at exactly want (nbytes). */
static void expect_restore_refused(dist_client *c, const dist_checkpoint_opts *o,
                                   const char *needle, const char *name, const void *want,
                                   size_t nbytes) {
  int rc = dist_checkpoint_restore(c, ckpt_dir, o, NULL);
  cr_assert_eq(rc, DIST_EINVAL, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(!needle || strstr(dist_errmsg(c), needle), "no '%s' in: %s", needle,
            dist_errmsg(c));
  harness_expect_value(c, name, want, nbytes);
}

static const char *make_dir(void) {
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", cluster.dir);
  return ckpt_dir;
}

/* Kills every daemon, starts them again with empty stores, and returns a
 * fresh client once they see each other. */
static dist_client *restart_all(dist_client *old) {
  dist_close(old);
  for (int r = 0; r < cluster.n; r++) harness_kill(&cluster, r, SIGKILL);
  for (int r = 0; r < cluster.n; r++) harness_start_rank_again(&cluster, r, NULL);
  harness_assert_all_connected(&cluster, "after every rank restarted");
  return harness_client(&cluster);
}

static float a0[5 * 3];
static int64_t b0[4] = {-1, 1LL << 40, 7, 0};
static uint16_t c0[3 * 4];

static void put_three(dist_client *c) {
  for (int i = 0; i < 15; i++) a0[i] = 0.1f * (float)i - 0.33f;
  for (int i = 0; i < 12; i++) c0[i] = (uint16_t)(0x3f80 + 17 * i);
  int64_t sa[2] = {5, 3}, sb[1] = {4}, sc[2] = {3, 4};
  dist_tensor_free(put(c, "a", DIST_FLOAT32, a0, 2, sa, "[0,1]", "Shard(0)"));
  dist_tensor_free(put(c, "b", DIST_INT64, b0, 1, sb, "[0,1]", "Replicate()"));
  dist_tensor_free(put(c, "c", DIST_BFLOAT16, c0, 2, sc, "[1,0]", "Shard(1)"));
}

static void expect_three(dist_client *c) {
  harness_expect_value(c, "a", a0, sizeof a0);
  harness_expect_value(c, "b", b0, sizeof b0);
  harness_expect_value(c, "c", c0, sizeof c0);
}

static int run_distctl(const char *args, char **out, char **err) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s --cluster %s %s", harness_distctl(),
           cluster.cluster_file, args);
  return harness_run(cmd, out, err, 60);
}

Test(checkpoint, save_kill_every_daemon_restart_restore_is_bit_identical) {
  dist_client *c = start(2);
  put_three(c);
  const char *dir = make_dir();
  char args[600], *out = NULL, *err = NULL;
  snprintf(args, sizeof args, "--json checkpoint save %s", dir);
  int rc = run_distctl(args, &out, &err);
  cr_assert_eq(rc, 0, "distctl: %s %s", out, err);
  json_t *j = json_loads(out, 0, NULL);
  cr_assert_not_null(j, "%s", out);
  cr_assert_eq(json_integer_value(json_object_get(j, "tensors")), 3, "%s", out);
  cr_assert_eq(json_integer_value(json_object_get(j, "files")), 2, "%s", out);
  json_decref(j);
  cr_assert(strstr(err, "rank 0 (1/2)") && strstr(err, "rank 1 (2/2)"),
            "progress per rank on stderr: %s", err);
  free(out);
  free(err);
  c = restart_all(c);
  dist_tensor **list = NULL;
  int n = 0;
  cr_assert_eq(dist_tensor_list(c, &list, &n), 0);
  cr_assert_eq(n, 0, "the restarted daemons start empty");
  dist_tensor_list_free(list, n);
  snprintf(args, sizeof args, "checkpoint restore %s", dir);
  rc = run_distctl(args, &out, &err);
  cr_assert_eq(rc, 0, "distctl: %s %s", out, err);
  cr_assert(strstr(err, "load    rank 0 (1/2)") && strstr(err, "load    rank 1 (2/2)"),
            "progress per rank on stderr: %s", err);
  free(out);
  free(err);
  expect_three(c);
  expect_layout(c, "a", "[Shard(0)]", 2, 0);
  expect_layout(c, "c", "[Shard(1)]", 2, 1);
  dist_close(c);
}

Test(checkpoint, restore_onto_other_placements_and_meshes) {
  dist_client *c = start(3);
  put_three(c);
  const char *dir = make_dir();
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  dist_checkpoint_info info;
  cr_assert_eq(dist_checkpoint_save(c, dir, &o, &info), 0, "%s", dist_errmsg(c));
  cr_assert_eq(info.ntensors, 3);
  cr_assert_eq(info.nfiles, 3);
  const char *only_a[] = {"a"};
  o.tensors = only_a;
  o.ntensors = 1;
  /* Same mesh, other placements. */
  dist_placement rep = DIST_REPLICATED, s1 = DIST_SHARD_DIM(1);
  o.placements = &rep;
  o.nplacements = 1;
  cr_assert_eq(dist_checkpoint_restore(c, dir, &o, &info), 0, "%s", dist_errmsg(c));
  expect_layout(c, "a", "[Replicate()]", 2, 0);
  harness_expect_value(c, "a", a0, sizeof a0);
  /* Another mesh of the same shape. */
  dist_mesh *m21 = NULL, *m3 = NULL;
  cr_assert_eq(dist_mesh_from_string("[2,1]", NULL, &m21), 0);
  o.mesh = m21;
  o.placements = &s1;
  cr_assert_eq(dist_checkpoint_restore(c, dir, &o, &info), 0, "%s", dist_errmsg(c));
  expect_layout(c, "a", "[Shard(1)]", 2, 2);
  harness_expect_value(c, "a", a0, sizeof a0);
  /* A mesh of another size. */
  cr_assert_eq(dist_mesh_from_string("[0,1,2]", NULL, &m3), 0);
  o.mesh = m3;
  o.placements = (dist_placement[]){DIST_SHARD_DIM(0)};
  cr_assert_eq(dist_checkpoint_restore(c, dir, &o, &info), 0, "%s", dist_errmsg(c));
  expect_layout(c, "a", "[Shard(0)]", 3, 0);
  harness_expect_value(c, "a", a0, sizeof a0);
  /* A mesh of another size without the saved ranks: they keep no piece. */
  dist_mesh *m2 = NULL;
  cr_assert_eq(dist_mesh_from_string("[2]", NULL, &m2), 0);
  o.mesh = m2;
  o.placements = &rep;
  cr_assert_eq(dist_checkpoint_restore(c, dir, &o, &info), 0, "%s", dist_errmsg(c));
  expect_layout(c, "a", "[Replicate()]", 1, 2);
  harness_expect_value(c, "a", a0, sizeof a0);
  for (int r = 0; r < 2; r++) {
    dist_tensor *t = NULL;
    cr_expect_eq(harness_open_on(&cluster, r, "a", &t), DIST_ENOTFOUND, "rank %d kept a piece",
                 r);
    dist_tensor_free(t);
  }
  dist_mesh_free(m2);
  dist_mesh_free(m21);
  dist_mesh_free(m3);
  dist_close(c);
}

/* Reshards "a" in place onto mesh_text with placements. */
static void reshard_onto(dist_client *c, const char *mesh_text, dist_placement p) {
  dist_tensor *t = NULL;
  dist_mesh *m = NULL;
  cr_assert_eq(dist_tensor_open(c, "a", &t), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_mesh_from_string(mesh_text, NULL, &m), 0);
  cr_assert_eq(dist_reshard(c, t, m, &p), 0, "onto %s: %s", mesh_text, dist_errmsg(c));
  dist_mesh_free(m);
  dist_tensor_free(t);
}

/* A tensor resharded onto a mesh that shares some ranks with its old one
 * is held by ranks that had it and ranks that did not. The save checks
 * that every piece is at one version (else the tensor changed during the
 * save), so the daemons must agree on it: they used to disagree, and such
 * a tensor could never be saved ("save again", every time). */
Test(checkpoint, a_tensor_resharded_onto_overlapping_meshes_is_saved_and_restored) {
  dist_client *c = start(3);
  put_three(c);
  reshard_onto(c, "[1,2]", DIST_REPLICATED);
  reshard_onto(c, "[2,0]", DIST_SHARD_DIM(1));
  const char *dir = make_dir();
  dist_checkpoint_info info;
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, &info), 0, "%s", dist_errmsg(c));
  cr_assert_eq(info.ntensors, 3);
  c = restart_all(c);
  cr_assert_eq(dist_checkpoint_restore(c, dir, NULL, &info), 0, "%s", dist_errmsg(c));
  expect_layout(c, "a", "[Shard(1)]", 2, 2);
  expect_three(c);
  dist_close(c);
}

/* Daemon r's own placement of "w" on its first mesh dim; fails the test
 * when it does not hold "w". */
static dist_placement placement_on(int r) {
  dist_tensor *t = NULL;
  int rc = harness_open_on(&cluster, r, "w", &t);
  cr_assert_eq(rc, 0, "rank %d: %s", r, dist_err_name(rc));
  dist_placement p = dist_tensor_placements(t)[0];
  dist_tensor_free(t);
  return p;
}

/* A restore while another client reshards the tensor. A daemon that put
 * the restored pieces between another's reshard steps would run the
 * reshard on pieces of two layouts: the daemons would then disagree on
 * the layout, or hold values that were never put. Each daemon orders the
 * restore after a reshard it runs (holds.h), and a reshard whose daemons
 * start from different versions is refused by all of them. */
Test(checkpoint, a_restore_racing_reshards_leaves_one_layout_and_the_saved_value) {
  dist_client *c = start(2);
  double p0[64];
  for (int i = 0; i < 64; i++) p0[i] = 0.5 * i - 3;
  int64_t n = 64;
  dist_tensor_free(put(c, "w", DIST_FLOAT64, p0, 1, &n, "[0,1]", "Replicate()"));
  const char *dir = make_dir();
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  int reshards = 0;
  for (int round = 0; round < 20; round++) {
    harness_churn ch;
    harness_churn_start(&ch, &cluster, "w");
    harness_churn_wait_started(&ch, 10000);
    harness_sleep_ms(round % 7);
    int rc = dist_checkpoint_restore(c, dir, NULL, NULL);
    int applied = harness_churn_stop(&ch);
    reshards += applied;
    cr_assert_eq(rc, 0, "round %d: %s", round, dist_errmsg(c));
    dist_placement p[2] = {placement_on(0), placement_on(1)};
    cr_assert(p[0].kind == p[1].kind && p[0].dim == p[1].dim,
              "round %d: the daemons disagree on the layout after %d reshards", round,
              applied);
    harness_expect_value(c, "w", p0, sizeof p0);
  }
  cr_assert_gt(reshards, 0);
  dist_close(c);
}

/* Puts and deletes a tensor on rank 1 alone until stopped, with a client
 * of its own: the memory a restore needs there is free one moment and
 * taken the next. */
#define FILLER_N (80 * 1024) /* float64: 640 KiB */
typedef struct filler {
  dist_client *c;
  volatile int stop;
  int puts;
  pthread_t thread;
} filler;

static void *fill_loop(void *arg) {
  filler *f = arg;
  static double zeros[FILLER_N];
  int64_t n = FILLER_N;
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[1]", NULL, &mesh);
  dist_placement p = DIST_REPLICATED;
  while (!f->stop) {
    dist_tensor *t = NULL;
    if (dist_shard_tensor(f->c, "filler", zeros, DIST_FLOAT64, 1, &n, mesh, &p, &t) == 0)
      __atomic_add_fetch(&f->puts, 1, __ATOMIC_RELAXED);
    dist_tensor_free(t);
    harness_sleep_ms(1);
    dist_tensor_delete(f->c, "filler");
  }
  dist_mesh_free(mesh);
  return NULL;
}

/* Rank r's piece of w must be want (n doubles). */
static void expect_piece(dist_client *c, int r, const double *want, int n, int round) {
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, "w", &t), 0, "%s", dist_errmsg(c));
  void *data = NULL;
  size_t nbytes = 0;
  int64_t shape[1];
  cr_assert_eq(dist_dtensor_to_local(c, t, r, &data, &nbytes, shape), 0, "%s",
               dist_errmsg(c));
  cr_assert_eq(nbytes, sizeof *want * (size_t)n);
  cr_assert_eq(memcmp(data, want, nbytes), 0, "round %d: rank %d holds another value", round,
               r);
  free(data);
  dist_tensor_free(t);
}

/* A restore that one daemon cannot finish changes no daemon. Rank 1's
 * memory (limit 1 MiB) comes and goes, so that its load sometimes fails
 * after its file was checked: it needs 512 KiB for the old and the
 * restored w at once, and the filler takes 640 KiB. Rank 0 has memory to
 * spare; after a failed restore it must still hold what it held, as rank 1
 * does. Whether a round's restore meets a full rank 1 is the race's: the
 * rounds go on past 30 until one has (at most 300), as on a loaded host
 * 30 rounds once all missed. */
Test(checkpoint, a_restore_one_daemon_cannot_finish_changes_no_daemon, .timeout = 150) {
  const char *args[] = {"--memory-limit=1MiB", NULL};
  dist_client *c = harness_start_unique_with_client(&cluster, 2, "ckpt-mem", args);
  enum { N = 32 * 1024 }; /* float64: 256 KiB */
  static double saved[N], before[N];
  for (int i = 0; i < N; i++) saved[i] = 0.25 * i;
  int64_t n = N;
  dist_tensor_free(put(c, "w", DIST_FLOAT64, saved, 1, &n, "[0,1]", "Replicate()"));
  const char *dir = make_dir();
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  int failed = 0;
  for (int round = 0; round < 300 && (round < 30 || !failed); round++) {
    for (int i = 0; i < N; i++) before[i] = -1.0 * i - round;
    dist_tensor_free(put(c, "w", DIST_FLOAT64, before, 1, &n, "[0,1]", "Replicate()"));
    filler f = {.c = harness_client(&cluster)};
    cr_assert_eq(pthread_create(&f.thread, NULL, fill_loop, &f), 0);
    int *counters[] = {&f.puts};
    harness_wait_all_positive(counters, 1, 10000);
    harness_sleep_ms(round % 3);
    int rc = dist_checkpoint_restore(c, dir, NULL, NULL);
    char err[512];
    snprintf(err, sizeof err, "%s", dist_errmsg(c));
    f.stop = 1;
    pthread_join(f.thread, NULL);
    dist_close(f.c);
    dist_tensor_delete(c, "filler");
    if (rc != 0) {
      failed++;
      cr_assert(strstr(err, "memory limit"), "round %d: %s", round, err);
    }
    for (int r = 0; r < 2; r++) expect_piece(c, r, rc == 0 ? saved : before, N, round);
  }
  cr_assert_gt(failed, 0, "no restore met a full rank 1");
  dist_close(c);
}

/* Restores one checkpoint again and again with a client of its own,
 * noting the longest call. */
typedef struct restorer {
  dist_client *c;
  const char *dir;
  int ok, refused;
  double longest_s;
  pthread_t thread;
} restorer;

static void *restore_loop(void *arg) {
  restorer *r = arg;
  for (int i = 0; i < 15; i++) {
    double t0 = harness_now_s();
    int rc = dist_checkpoint_restore(r->c, r->dir, NULL, NULL);
    double took = harness_now_s() - t0;
    if (took > r->longest_s) r->longest_s = took;
    if (rc == 0) r->ok++;
    else if (rc == DIST_EUNAVAIL) r->refused++;
  }
  return NULL;
}

/* Two restores of the same names never wait for each other: a daemon
 * refuses a restore while another holds those names, since each waits for
 * its vote while holding (daemon/holds.c). Each call ends quickly, and the
 * daemons end holding the saved values. */
Test(checkpoint, concurrent_restores_never_wait_for_each_other) {
  dist_client *c = start(2);
  put_three(c);
  make_dir();
  cr_assert_eq(dist_checkpoint_save(c, ckpt_dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  restorer r[2] = {{.c = harness_client(&cluster), .dir = ckpt_dir},
                   {.c = harness_client(&cluster), .dir = ckpt_dir}};
  for (int k = 0; k < 2; k++)
    cr_assert_eq(pthread_create(&r[k].thread, NULL, restore_loop, &r[k]), 0);
  for (int k = 0; k < 2; k++) {
    pthread_join(r[k].thread, NULL);
    dist_close(r[k].c);
  }
  for (int k = 0; k < 2; k++) {
    cr_expect_eq(r[k].ok + r[k].refused, 15, "client %d: %d restored, %d refused", k, r[k].ok,
                 r[k].refused);
    cr_expect_lt(r[k].longest_s, 5.0, "client %d waited %.1f s", k, r[k].longest_s);
  }
  cr_expect_gt(r[0].ok + r[1].ok, 0);
  expect_three(c);
  dist_close(c);
}

static char *manifest_text(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/manifest.json", ckpt_dir);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  char *buf = calloc(1, 1 << 16);
  size_t n = fread(buf, 1, (1 << 16) - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static int count_rank_files(void) {
  char cmd[600], *out = NULL;
  snprintf(cmd, sizeof cmd, "ls %s | grep -c '^rank.*safetensors$'", ckpt_dir);
  harness_run(cmd, &out, NULL, 10);
  int n = out ? atoi(out) : -1;
  free(out);
  return n;
}

Test(checkpoint, interrupted_save_leaves_the_previous_checkpoint_intact) {
  dist_client *c = start(2);
  put_three(c);
  const char *dir = make_dir();
  dist_checkpoint_info first, info;
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, &first), 0, "%s", dist_errmsg(c));
  char *before = manifest_text();
  /* New values, then rank 1 dies: the second save fails half-way, after
   * rank 0 wrote its new file. */
  float a1[15];
  for (int i = 0; i < 15; i++) a1[i] = 100.0f + (float)i;
  int64_t sa[2] = {5, 3};
  dist_tensor_free(put(c, "a", DIST_FLOAT32, a1, 2, sa, "[0,1]", "Shard(0)"));
  harness_kill(&cluster, 1, SIGKILL);
  cr_assert_neq(dist_checkpoint_save(c, dir, NULL, &info), 0);
  cr_assert(strstr(dist_errmsg(c), "rank 1"), "%s", dist_errmsg(c));
  char *after = manifest_text();
  cr_assert_str_eq(after, before, "the manifest was not switched");
  free(after);
  /* Rank 0's new file is discarded (it used to stay, an orphan, until the
   * next good save). */
  cr_assert_eq(count_rank_files(), 2, "the old pair only");
  c = restart_all(c);
  cr_assert_eq(dist_checkpoint_restore(c, dir, NULL, &info), 0, "%s", dist_errmsg(c));
  cr_assert_str_eq(info.id, first.id, "the restore names the first checkpoint");
  expect_three(c); /* the first checkpoint's values, not a1 */
  /* The next good save removes the old files. */
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, &info), 0, "%s", dist_errmsg(c));
  cr_assert_eq(count_rank_files(), 2);
  cr_assert_str_neq(info.id, first.id);
  free(before);
  dist_close(c);
}

static void rank_file(int rank, char *path, size_t len) {
  char *m = manifest_text();
  json_t *j = json_loads(m, 0, NULL);
  const char *f = json_string_value(
      json_object_get(json_array_get(json_object_get(j, "files"), (size_t)rank), "file"));
  snprintf(path, len, "%s/%s", ckpt_dir, f);
  json_decref(j);
  free(m);
}

/* Restoring must fail with `word` in the message, and leave "a" holding
 * `current` on every daemon. */
static void expect_refused(dist_client *c, const char *word, const float *current) {
  dist_checkpoint_info info;
  int rc = dist_checkpoint_restore(c, ckpt_dir, NULL, &info);
  cr_assert_neq(rc, 0);
  cr_assert(strstr(dist_errmsg(c), word), "message '%s' lacks '%s'", dist_errmsg(c), word);
  harness_expect_value(c, "a", current, 15 * sizeof(float));
}

static void copy_file(const char *from, const char *to) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
  cr_assert_eq(harness_run(cmd, NULL, NULL, 10), 0);
}

Test(checkpoint, corrupt_truncated_or_missing_files_are_refused_store_unchanged) {
  dist_client *c = start(2);
  put_three(c);
  make_dir();
  dist_checkpoint_info info;
  cr_assert_eq(dist_checkpoint_save(c, ckpt_dir, NULL, &info), 0, "%s", dist_errmsg(c));
  float a1[15];
  for (int i = 0; i < 15; i++) a1[i] = -5.0f * (float)i;
  int64_t sa[2] = {5, 3};
  dist_tensor_free(put(c, "a", DIST_FLOAT32, a1, 2, sa, "[0,1]", "Shard(0)"));
  char path[600], saved[700];
  rank_file(1, path, sizeof path);
  snprintf(saved, sizeof saved, "%s.good", path);
  copy_file(path, saved);
  /* One flipped byte in rank 1's data. */
  FILE *f = fopen(path, "r+b");
  fseek(f, -3, SEEK_END);
  int ch = fgetc(f);
  fseek(f, -3, SEEK_END);
  fputc(ch ^ 0x40, f);
  fclose(f);
  expect_refused(c, "corrupt: sha256", a1);
  /* Truncated. */
  copy_file(saved, path);
  cr_assert_eq(truncate(path, 20), 0);
  expect_refused(c, "corrupt", a1);
  /* Missing. */
  unlink(path);
  expect_refused(c, "cannot open", a1);
  /* Bad framing whose digest matches: the manifest is rewritten to agree. */
  f = fopen(path, "wb");
  fputs("\x10\0\0\0\0\0\0\0{\"a\":[1,2,3]}   ", f);
  fclose(f);
  char cmd[1400], *out = NULL;
  snprintf(cmd, sizeof cmd, "sha256sum '%s' | cut -c1-64", path);
  cr_assert_eq(harness_run(cmd, &out, NULL, 10), 0);
  out[64] = 0;
  char *m = manifest_text();
  json_t *j = json_loads(m, 0, NULL);
  json_object_set_new(json_array_get(json_object_get(j, "files"), 1), "sha256",
                      json_string(out));
  char mpath[500];
  snprintf(mpath, sizeof mpath, "%s/manifest.json", ckpt_dir);
  cr_assert_eq(json_dump_file(j, mpath, 0), 0);
  json_decref(j);
  free(out);
  expect_refused(c, "safetensors", a1);
  /* A manifest that is not one. */
  f = fopen(mpath, "w");
  fputs("{\"format\": \"something else\"}", f);
  fclose(f);
  expect_refused(c, "not a valid checkpoint manifest", a1);
  unlink(mpath);
  expect_refused(c, "no checkpoint", a1);
  /* The good file and manifest back: the restore goes through. */
  f = fopen(mpath, "w");
  fputs(m, f);
  fclose(f);
  copy_file(saved, path);
  unlink(saved);
  cr_assert_eq(dist_checkpoint_restore(c, ckpt_dir, NULL, &info), 0, "%s", dist_errmsg(c));
  expect_three(c);
  free(m);
  dist_close(c);
}

/* A tensor now on more daemons than the checkpoint put it on: a restore
 * drops its pieces on the others, but only when the restore applies. */
Test(checkpoint, a_restore_drops_pieces_outside_the_saved_mesh_only_when_it_applies) {
  dist_client *c = start(3);
  double saved[6] = {1, 2, 3, 4, 5, 6}, later[6] = {-1, -2, -3, -4, -5, -6};
  int64_t n = 6;
  dist_tensor_free(put(c, "w", DIST_FLOAT64, saved, 1, &n, "[0,1]", "Replicate()"));
  make_dir();
  cr_assert_eq(dist_checkpoint_save(c, ckpt_dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  dist_tensor_free(put(c, "w", DIST_FLOAT64, later, 1, &n, "[0,1,2]", "Replicate()"));
  char path[600], good[700];
  rank_file(1, path, sizeof path);
  snprintf(good, sizeof good, "%s.good", path);
  copy_file(path, good);
  cr_assert_eq(truncate(path, 20), 0);
  cr_assert_neq(dist_checkpoint_restore(c, ckpt_dir, NULL, NULL), 0);
  cr_assert(strstr(dist_errmsg(c), "rank 1"), "%s", dist_errmsg(c));
  dist_tensor *t = NULL;
  cr_assert_eq(harness_open_on(&cluster, 2, "w", &t), 0, "rank 2 lost its piece");
  cr_assert_eq(dist_mesh_size(dist_tensor_mesh(t)), 3);
  dist_tensor_free(t);
  harness_expect_value(c, "w", later, sizeof later);
  copy_file(good, path);
  unlink(good);
  cr_assert_eq(dist_checkpoint_restore(c, ckpt_dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(harness_open_on(&cluster, 2, "w", &t), DIST_ENOTFOUND,
               "rank 2 keeps a piece of the older layout");
  harness_expect_value(c, "w", saved, sizeof saved);
  expect_layout(c, "w", "[Replicate()]", 2, 0);
  dist_close(c);
}

/* A checkpoint of two daemons restored into a cluster of three: the third
 * has no file of it, and drops its piece of a tensor the checkpoint puts
 * on the first two only (it used to crash there, reading no file). */
Test(checkpoint, a_bigger_cluster_drops_pieces_where_the_checkpoint_has_no_file) {
  char dir[] = "/tmp/distd-ckpt-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  dist_client *c = start(2);
  double saved[6] = {1, 2, 3, 4, 5, 6}, later[6] = {-1, -2, -3, -4, -5, -6};
  int64_t n = 6;
  dist_tensor_free(put(c, "w", DIST_FLOAT64, saved, 1, &n, "[0,1]", "Replicate()"));
  dist_checkpoint_info info;
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, &info), 0, "%s", dist_errmsg(c));
  cr_assert_eq(info.nfiles, 2);
  dist_close(c);
  stop_cluster();
  c = start(3);
  dist_tensor_free(put(c, "w", DIST_FLOAT64, later, 1, &n, "[0,1,2]", "Replicate()"));
  dist_checkpoint_info restored;
  cr_assert_eq(dist_checkpoint_restore(c, dir, NULL, &restored), 0, "%s", dist_errmsg(c));
  cr_assert_str_eq(restored.id, info.id, "the restore names the checkpoint it restored");
  dist_tensor *t = NULL;
  cr_assert_eq(harness_open_on(&cluster, 2, "w", &t), DIST_ENOTFOUND,
               "rank 2 keeps a piece of the older layout");
  harness_expect_value(c, "w", saved, sizeof saved);
  expect_layout(c, "w", "[Replicate()]", 2, 0);
  dist_close(c);
  harness_remove_dir(dir);
}

/* Placements that do not fit one of the tensors restored are refused
 * before any daemon loads: the restore used to load every file and move
 * "a" to Shard(1), then stop at 1-d "b", leaving a store that was neither
 * as before nor as asked. */
Test(checkpoint, a_layout_that_fits_not_every_tensor_changes_nothing) {
  dist_client *c = start(2);
  put_three(c);
  make_dir();
  cr_assert_eq(dist_checkpoint_save(c, ckpt_dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  float a1[15];
  for (int i = 0; i < 15; i++) a1[i] = 7.0f * (float)i;
  int64_t sa[2] = {5, 3};
  dist_tensor_free(put(c, "a", DIST_FLOAT32, a1, 2, sa, "[0,1]", "Shard(0)"));
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  dist_placement s1 = DIST_SHARD_DIM(1);
  o.placements = &s1;
  o.nplacements = 1;
  expect_restore_refused(c, &o, "restore of 'b' onto the placements asked: Shard(1)", "a", a1,
                         sizeof a1);
  expect_layout(c, "a", "[Shard(0)]", 2, 0);
  /* A mesh naming a rank the cluster lacks, likewise. */
  dist_mesh *m7 = NULL;
  cr_assert_eq(dist_mesh_from_string("[0,7]", NULL, &m7), 0);
  dist_placement rep = DIST_REPLICATED;
  o.mesh = m7;
  o.placements = &rep;
  expect_restore_refused(c, &o, "rank 7", "a", a1, sizeof a1);
  dist_mesh_free(m7);
  dist_close(c);
}

Test(checkpoint, bad_requests_are_refused) {
  dist_client *c = start(2);
  put_three(c);
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  const char *missing[] = {"a", "nope"};
  o.tensors = missing;
  o.ntensors = 2;
  cr_assert_eq(dist_checkpoint_save(c, "relative/dir", NULL, NULL), DIST_EINVAL);
  cr_assert_eq(dist_checkpoint_save(c, make_dir(), &o, NULL), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(c), "'nope'"), "%s", dist_errmsg(c));
  struct stat sb;
  char mpath[500];
  snprintf(mpath, sizeof mpath, "%s/manifest.json", ckpt_dir);
  cr_assert_neq(stat(mpath, &sb), 0, "no manifest from a failed save");
  o.ntensors = 1;
  cr_assert_eq(dist_checkpoint_save(c, ckpt_dir, &o, NULL), 0, "%s", dist_errmsg(c));
  o.tensors = (const char *[]){"b"};
  cr_assert_eq(dist_checkpoint_restore(c, ckpt_dir, &o, NULL), DIST_ENOTFOUND);
  char *out = NULL, *err = NULL;
  cr_assert_eq(run_distctl("checkpoint restore", &out, &err), 2, "%s", err);
  free(out);
  free(err);
  dist_close(c);
}

/* distctl ARGS must exit 2 with needle in its stderr. */
static void expect_distctl_usage(const char *args, const char *needle) {
  char *out = NULL, *err = NULL;
  int rc = run_distctl(args, &out, &err);
  cr_assert_eq(rc, 2, "distctl %s: exit %d: %s", args, rc, err);
  cr_assert(err && strstr(err, needle), "distctl %s: no '%s' in: %s", args, needle, err);
  free(out);
  free(err);
}

/* Without --mesh, restore --placements was never counted against the saved
 * meshes: one placement for a 2-d mesh went out with an uninitialised
 * second, and extras were dropped. It is a usage error naming the tensor,
 * and only the tensors restored count. */
Test(checkpoint, restore_placements_are_counted_against_each_saved_mesh) {
  dist_client *c = start(2);
  put_three(c);
  float m0[12] = {0};
  int64_t sm[2] = {3, 4};
  dist_tensor_free(put(c, "m", DIST_FLOAT32, m0, 2, sm, "[[0,1]]", "Replicate(),Shard(1)"));
  char args[600];
  snprintf(args, sizeof args, "checkpoint save %s", make_dir());
  char *out = NULL, *err = NULL;
  cr_assert_eq(run_distctl(args, &out, &err), 0, "save: %s", err);
  free(out);
  free(err);
  cr_assert_eq(dist_tensor_delete(c, "m"), 0, "%s", dist_errmsg(c));
  snprintf(args, sizeof args, "checkpoint restore %s --placements \"Shard(0)\"", ckpt_dir);
  expect_distctl_usage(args, "--placements gives 1 placement, but the saved mesh of 'm' has "
                       "2 dims");
  dist_tensor *t = NULL;
  cr_assert_neq(dist_tensor_open(c, "m", &t), 0, "m was restored");
  snprintf(args, sizeof args, "checkpoint restore %s --tensors m --placements "
           "\"Shard(1),Replicate(),Shard(0)\"", ckpt_dir);
  expect_distctl_usage(args, "gives 3 placements, but the saved mesh of 'm' has 2 dims");
  snprintf(args, sizeof args, "checkpoint restore %s --tensors a --placements \"Shard(9)\"",
           ckpt_dir);
  expect_distctl_usage(args, "Shard(9) on mesh dim 0 is out of range for 'a' of 2 dims");
  /* a and b have 1-d meshes: one placement fits them. */
  snprintf(args, sizeof args, "checkpoint restore %s --tensors a,b --placements "
           "\"Replicate()\"", ckpt_dir);
  cr_assert_eq(run_distctl(args, &out, &err), 0, "restore a,b: %s", err);
  free(out);
  free(err);
  expect_layout(c, "a", "[Replicate()]", 2, 0);
  harness_expect_value(c, "a", a0, sizeof a0);
  dist_close(c);
}

/* libdist used only the first ndim placements of a restore's, one per
 * dim of the mesh: extras were dropped unseen, and distctl counted them
 * only where it could read DIR/manifest.json. Any other count is refused
 * before anything loads, naming the tensor. */
Test(checkpoint, a_restore_given_more_or_fewer_placements_than_mesh_dims_restores_nothing) {
  dist_client *c = start(2);
  put_three(c);
  cr_assert_eq(dist_checkpoint_save(c, make_dir(), NULL, NULL), 0, "%s", dist_errmsg(c));
  float a1[15];
  for (int i = 0; i < 15; i++) a1[i] = 3.0f * (float)i;
  int64_t sa[2] = {5, 3};
  dist_tensor_free(put(c, "a", DIST_FLOAT32, a1, 2, sa, "[0,1]", "Shard(0)"));
  dist_placement two[2] = {DIST_REPLICATED, DIST_SHARD_DIM(1)};
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.tensors = (const char *[]){"a"};
  o.ntensors = 1;
  o.placements = two;
  o.nplacements = 2;
  expect_restore_refused(c, &o, "restore of 'a' onto 2 placements: its saved mesh has 1 dim "
                         "(nothing was restored)", "a", a1, sizeof a1);
  expect_layout(c, "a", "[Shard(0)]", 2, 0);
  /* Too few for a 2-d mesh asked, likewise. */
  dist_mesh *m2d = NULL;
  cr_assert_eq(dist_mesh_from_string("[[0,1]]", NULL, &m2d), 0);
  o.mesh = m2d;
  o.nplacements = 1;
  expect_restore_refused(c, &o, "'a' onto 1 placement: the mesh asked has 2 dims", "a", a1,
                         sizeof a1);
  o.nplacements = 2;
  cr_assert_eq(dist_checkpoint_restore(c, ckpt_dir, &o, NULL), 0, "%s", dist_errmsg(c));
  expect_layout(c, "a", "[Replicate(), Shard(1)]", 2, 0);
  harness_expect_value(c, "a", a0, sizeof a0);
  dist_mesh_free(m2d);
  dist_close(c);
}

/* A count that disagreed with the list of names crashed a save (reading
 * names past the list, or through NULL) and made a restore take nothing
 * and report success. Both refuse it, with nothing written or loaded. */
Test(checkpoint, a_tensor_count_that_disagrees_with_the_names_is_refused) {
  dist_client *c = start(2);
  put_three(c);
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  const char *only_a[] = {"a"};
  struct {
    const char *const *tensors;
    int n;
  } bad[] = {{NULL, 1}, {only_a, -1}, {only_a, 0}};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    o.tensors = bad[k].tensors;
    o.ntensors = bad[k].n;
    int rc = dist_checkpoint_save(c, make_dir(), &o, NULL);
    cr_assert_eq(rc, DIST_EINVAL, "case %zu: %s: %s", k, dist_err_name(rc), dist_errmsg(c));
    cr_assert(strstr(dist_errmsg(c), "give the names and their count"), "%s", dist_errmsg(c));
    cr_assert_neq(access(ckpt_dir, F_OK), 0, "case %zu: the refused save wrote %s", k,
                  ckpt_dir);
  }
  cr_assert_eq(dist_checkpoint_save(c, ckpt_dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  float a1[15] = {0};
  int64_t sa[2] = {5, 3};
  dist_tensor_free(put(c, "a", DIST_FLOAT32, a1, 2, sa, "[0,1]", "Shard(0)"));
  o.tensors = only_a;
  o.ntensors = 0;
  expect_restore_refused(c, &o, NULL, "a", a1, sizeof a1);
  o.ntensors = 1;
  cr_assert_eq(dist_checkpoint_restore(c, ckpt_dir, &o, NULL), 0, "%s", dist_errmsg(c));
  harness_expect_value(c, "a", a0, sizeof a0);
  dist_close(c);
}

/* Per-rank values (one name, each daemon's piece on its own one-rank
 * mesh) were saved as one tensor on rank 0's mesh: the save succeeded and
 * a restore brought back rank 0's piece only. The save is refused, naming
 * the tensor, and leaves no manifest; the other tensors save by name. */
Test(checkpoint, per_rank_values_are_refused_not_saved_as_rank_0s_piece) {
  dist_client *c = start(2);
  put_three(c);
  float v0[2] = {1, 2}, v1[2] = {30, 40};
  int64_t shape[1] = {2};
  dist_tensor_free(harness_put(c, "pr", DIST_FLOAT32, v0, 1, shape, "[0]", "Replicate()"));
  dist_tensor_free(harness_put(c, "pr", DIST_FLOAT32, v1, 1, shape, "[1]", "Replicate()"));
  int rc = dist_checkpoint_save(c, make_dir(), NULL, NULL);
  cr_assert_eq(rc, DIST_ENOTSUP, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "'pr' is held as per-rank values (on mesh [0], on mesh "
                   "[1], ...)"), "%s", dist_errmsg(c));
  char mpath[500];
  snprintf(mpath, sizeof mpath, "%s/manifest.json", ckpt_dir);
  cr_assert_neq(access(mpath, F_OK), 0, "the refused save wrote a manifest");
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.tensors = (const char *[]){"a", "b", "c"};
  o.ntensors = 3;
  cr_assert_eq(dist_checkpoint_save(c, ckpt_dir, &o, NULL), 0, "%s", dist_errmsg(c));
  dist_close(c);
}

/* dist_checkpoint_restore of the whole checkpoint in ckpt_dir onto
 * mesh_text, Replicate(). */
static int restore_replicated_on(dist_client *c, const char *mesh_text,
                                 dist_checkpoint_info *info) {
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_from_string(mesh_text, NULL, &m), 0);
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.mesh = m;
  o.placements = (dist_placement[]){DIST_REPLICATED};
  o.nplacements = 1;
  int rc = dist_checkpoint_restore(c, ckpt_dir, &o, info);
  dist_mesh_free(m);
  return rc;
}

/* A manifest whose shape counts more elements than int64 holds ([2^32,
 * 2^32]) overflowed in the client (UBSan's report) on the way to a
 * rebuild. It is a malformed manifest, refused with the store unchanged. */
Test(checkpoint, a_manifest_shape_past_the_element_bound_is_refused) {
  dist_client *c = start(2);
  put_three(c);
  cr_assert_eq(dist_checkpoint_save(c, make_dir(), NULL, NULL), 0, "%s", dist_errmsg(c));
  char mpath[500];
  snprintf(mpath, sizeof mpath, "%s/manifest.json", ckpt_dir);
  json_t *doc = json_load_file(mpath, 0, NULL), *t;
  size_t i;
  json_array_foreach(json_object_get(doc, "tensors"), i, t)
    json_object_set_new(t, "shape", json_pack("[I, I]", (json_int_t)1 << 32,
                                              (json_int_t)1 << 32));
  cr_assert_eq(json_dump_file(doc, mpath, 0), 0);
  json_decref(doc);
  int rc = restore_replicated_on(c, "[0]", NULL);
  cr_assert_eq(rc, DIST_EINVAL, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "a tensors entry is malformed"), "%s", dist_errmsg(c));
  expect_three(c);
  expect_layout(c, "a", "[Shard(0)]", 2, 0);
  dist_close(c);
}

/* A parameter with no elements, restored with its Adam state onto another
 * mesh: its empty state buffers reach the daemon as NULL, which copied
 * them with memcpy from NULL (UBSan's report, and under the sanitizers
 * halting on it, a dead daemon). It restores, its step kept. */
Test(checkpoint, an_empty_parameter_restores_with_its_state_onto_another_mesh) {
  dist_client *c = start(2);
  float none[1] = {0};
  int64_t shape[2] = {0, 4};
  dist_tensor_free(put(c, "z", DIST_FLOAT32, none, 2, shape, "[0,1]", "Shard(0)"));
  dist_param_opts adam = DIST_PARAM_OPTS_INIT;
  adam.optimizer = DIST_OPT_ADAM;
  cr_assert_eq(dist_param_configure(c, "z", &adam), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_push(c, "z", 0, none, 0, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_checkpoint_save(c, make_dir(), NULL, NULL), 0, "%s", dist_errmsg(c));
  dist_checkpoint_info info;
  cr_assert_eq(restore_replicated_on(c, "[1]", &info), 0, "%s", dist_errmsg(c));
  cr_assert_eq(info.nparams, 1);
  dist_params_report rep;
  cr_assert_eq(dist_params(c, 1, &rep), 0, "%s", dist_errmsg(c));
  cr_assert(rep.n == 1 && strcmp(rep.params[0].name, "z") == 0 && rep.params[0].step == 1,
            "rank 1 holds %d parameters", rep.n);
  dist_params_report_free(&rep);
  dist_close(c);
}

/* A save naming a tensor that does not exist used to fail only after every
 * daemon wrote its file: a new DIR was left with rank files and no
 * manifest, an existing one with a stray set beside the checkpoint. The
 * names are checked before any daemon writes. */
Test(checkpoint, a_save_naming_a_missing_tensor_writes_nothing) {
  dist_client *c = start(2);
  put_three(c);
  char fresh[500], args[700];
  snprintf(fresh, sizeof fresh, "%s/fresh", cluster.dir);
  snprintf(args, sizeof args, "checkpoint save %s --tensors a,nope", fresh);
  char *out = NULL, *err = NULL;
  cr_assert_eq(run_distctl(args, &out, &err), 1, "%s", err);
  cr_assert(strstr(err, "tensor 'nope' not found"), "%s", err);
  free(out);
  free(err);
  cr_assert_neq(access(fresh, F_OK), 0, "the failed save created %s", fresh);
  make_dir();
  cr_assert_eq(dist_checkpoint_save(c, ckpt_dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  char *before = manifest_text();
  snprintf(args, sizeof args, "checkpoint save %s --tensors nope,b", ckpt_dir);
  cr_assert_eq(run_distctl(args, &out, &err), 1, "%s", err);
  free(out);
  free(err);
  char *after = manifest_text();
  cr_assert_str_eq(after, before);
  cr_assert_eq(count_rank_files(), 2, "the checkpoint's pair only");
  free(before);
  free(after);
  dist_close(c);
}

/* ---- parameters: their optimizer state travels with the checkpoint ---- */

static float grad_at(int step, int i) { return sinf(0.37f * (float)i + 0.5f * (float)step); }

/* One update of each parameter with step's gradients. */
static void push_step(dist_client *c, int step) {
  float gw[6 * 4], gv[5];
  for (int i = 0; i < 24; i++) gw[i] = grad_at(step, i);
  for (int i = 0; i < 5; i++) gv[i] = grad_at(step, 100 + i);
  cr_assert_eq(dist_param_push(c, "w", 0, gw, sizeof gw, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_push(c, "v", 0, gv, sizeof gv, NULL), 0, "%s", dist_errmsg(c));
}

static void pull(dist_client *c, const char *name, void *out, size_t nbytes) {
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_param_pull(c, name, 0, &data, &n, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(n, nbytes);
  memcpy(out, data, n);
  free(data);
}

static dist_param_opts adamw_opts(void) {
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.optimizer = DIST_OPT_ADAMW;
  o.lr = 0.05;
  o.weight_decay = 0.1;
  return o;
}

/* w: AdamW, Shard(0) over two daemons; v: SGD with Nesterov momentum,
 * replicated; both at their initial values. */
static void make_params(dist_client *c, const char *mesh_text) {
  float w0[6 * 4], v0[5];
  for (int i = 0; i < 24; i++) w0[i] = 0.05f * (float)i - 0.4f;
  for (int i = 0; i < 5; i++) v0[i] = 1.0f - 0.3f * (float)i;
  int64_t sw[2] = {6, 4}, sv[1] = {5};
  dist_tensor_free(put(c, "w", DIST_FLOAT32, w0, 2, sw, mesh_text, "Shard(0)"));
  dist_tensor_free(put(c, "v", DIST_FLOAT32, v0, 1, sv, mesh_text, "Replicate()"));
  dist_param_opts adamw = adamw_opts(), sgd = DIST_PARAM_OPTS_INIT;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.nesterov = 1;
  cr_assert_eq(dist_param_configure(c, "w", &adamw), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_configure(c, "v", &sgd), 0, "%s", dist_errmsg(c));
}

/* distctl --json checkpoint VERB DIR EXTRA: its JSON result; its stderr
 * in *err when err is not NULL (free()). */
static json_t *distctl_json(const char *verb, const char *dir, const char *extra,
                            char **err) {
  char args[800], *out = NULL, *e = NULL;
  snprintf(args, sizeof args, "--json checkpoint %s %s %s", verb, dir, extra);
  int rc = run_distctl(args, &out, &e);
  cr_assert_eq(rc, 0, "distctl: %s %s", out, e);
  json_t *j = json_loads(out, 0, NULL);
  cr_assert_not_null(j, "%s", out);
  free(out);
  if (err) *err = e;
  else free(e);
  return j;
}

static int64_t json_field(json_t *j, const char *key) {
  return json_integer_value(json_object_get(j, key));
}

/* Updates 4 and 5 must leave w and v exactly as want_w and want_v. */
static void expect_resumed(dist_client *c, const float *want_w, const float *want_v,
                           const char *how) {
  float got_w[24], got_v[5];
  push_step(c, 4);
  push_step(c, 5);
  pull(c, "w", got_w, sizeof got_w);
  pull(c, "v", got_v, sizeof got_v);
  cr_assert_eq(memcmp(got_w, want_w, sizeof got_w), 0, "AdamW: %s", how);
  cr_assert_eq(memcmp(got_v, want_v, sizeof got_v), 0, "SGD momentum: %s", how);
}

/* Restores dir with distctl's extra args: both parameters come back with
 * their state, "w" laid out as `placements` from first_rank, and they
 * resume as the run that never stopped. */
static void restore_resumes(dist_client *c, const char *dir, const char *args,
                            const char *placements, int first_rank, const float *want_w,
                            const float *want_v, const char *how) {
  json_t *j = distctl_json("restore", dir, args, NULL);
  cr_assert_eq(json_field(j, "parameters"), 2);
  cr_assert_eq(json_field(j, "parameters_reset"), 0);
  json_decref(j);
  expect_layout(c, "w", placements, 2, first_rank);
  expect_resumed(c, want_w, want_v, how);
}

Test(checkpoint, parameters_resume_from_a_checkpoint_as_if_never_stopped) {
  dist_client *c = start(2);
  make_params(c, "[0,1]");
  for (int k = 1; k <= 3; k++) push_step(c, k);
  const char *dir = make_dir();
  json_t *j = distctl_json("save", dir, "", NULL);
  cr_assert_eq(json_field(j, "parameters"), 2);
  json_decref(j);
  /* The run that never stopped: two more updates. */
  float want_w[24], want_v[5], got_w[24];
  push_step(c, 4);
  push_step(c, 5);
  pull(c, "w", want_w, sizeof want_w);
  pull(c, "v", want_v, sizeof want_v);

  c = restart_all(c);
  j = distctl_json("restore", dir, "", NULL);
  cr_assert_eq(json_field(j, "parameters"), 2);
  json_decref(j);
  expect_resumed(c, want_w, want_v, "resumed differently");

  /* Without the state (configured afresh after the restore), the same two
   * updates land elsewhere: the equality above is the state's doing. */
  json_decref(distctl_json("restore", dir, "", NULL));
  dist_param_opts adamw = adamw_opts();
  cr_assert_eq(dist_param_configure(c, "w", &adamw), 0, "%s", dist_errmsg(c));
  push_step(c, 4);
  push_step(c, 5);
  pull(c, "w", got_w, sizeof got_w);
  cr_assert_neq(memcmp(got_w, want_w, sizeof got_w), 0);

  /* Onto other placements of the same mesh the state follows (the daemons
   * reshard it with the values). */
  restore_resumes(c, dir, "--placements Replicate\\(\\)", "[Replicate()]", 0, want_w,
                  want_v, "lost its state in the reshard");
  /* Onto another mesh of the same shape too: rank k of the saved mesh
   * tells rank k of the new one what the parameter is, and the daemons
   * reshard the state with the values. */
  restore_resumes(c, dir, "--mesh [1,0] --placements Shard\\(0\\)", "[Shard(0)]", 1,
                  want_w, want_v, "lost its state on the way to mesh [1,0]");

  /* Onto a mesh of another shape the values and the state are put
   * together in the client from the files, and sharded onto it. */
  restore_resumes(c, dir, "--mesh [[0,1]] --placements Replicate\\(\\),Shard\\(0\\)",
                  "[Replicate(), Shard(0)]", 0, want_w, want_v,
                  "lost its state on the way to mesh [[0,1]]");

  /* Onto Partial placements the state cannot follow (a sum of moments is
   * not the moment of a sum), and distctl says so. */
  char *err = NULL;
  j = distctl_json("restore", dir, "--placements Partial\\(sum\\)", &err);
  cr_assert_eq(json_field(j, "parameters"), 0);
  cr_assert_eq(json_field(j, "parameters_reset"), 2);
  json_decref(j);
  cr_assert(strstr(err, "2 parameters restored without their optimizer state"),
            "%s", err);
  free(err);
  float g[24] = {0};
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, NULL), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(c), "not a parameter"), "%s", dist_errmsg(c));
  dist_close(c);
}

Test(checkpoint, a_tensor_saved_as_plain_values_is_no_parameter_after_restore) {
  dist_client *c = start(2);
  put_three(c);
  const char *dir = make_dir();
  json_t *j = distctl_json("save", dir, "", NULL);
  cr_assert_eq(json_field(j, "parameters"), 0);
  json_decref(j);
  /* a becomes a parameter and is updated after the save... */
  dist_param_opts sgd = DIST_PARAM_OPTS_INIT;
  sgd.momentum = 0.5;
  cr_assert_eq(dist_param_configure(c, "a", &sgd), 0, "%s", dist_errmsg(c));
  float g[15];
  for (int i = 0; i < 15; i++) g[i] = grad_at(1, i);
  cr_assert_eq(dist_param_push(c, "a", 0, g, sizeof g, NULL), 0, "%s", dist_errmsg(c));
  /* ...then the restore gives back its plain saved values, and no momentum
   * that would not go with them. */
  j = distctl_json("restore", dir, "", NULL);
  cr_assert_eq(json_field(j, "parameters"), 0);
  json_decref(j);
  expect_three(c);
  cr_assert_eq(dist_param_push(c, "a", 0, g, sizeof g, NULL), DIST_ENOTFOUND,
               "a kept optimizer state across the restore");
  cr_assert(strstr(dist_errmsg(c), "not a parameter"), "%s", dist_errmsg(c));
  dist_close(c);
}

Test(checkpoint, a_deleted_parameter_leaves_no_state_behind) {
  dist_client *c = start(2);
  make_params(c, "[0,1]");
  push_step(c, 1);
  /* Deleted and put again with the same layout: plain values, no AdamW
   * moments waiting for them. */
  float w[24];
  pull(c, "w", w, sizeof w);
  int64_t sw[2] = {6, 4};
  dist_tensor_free(put(c, "w", DIST_FLOAT32, w, 2, sw, "[0,1]", "Shard(0)"));
  float g[24] = {0};
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, NULL), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(c), "not a parameter"), "%s", dist_errmsg(c));
  dist_close(c);
}

/* ---- restoring onto fewer daemons than saved ---- */

/* name from one piece per rank of mesh_text, in mesh order (f32). */
static void put_pieces(dist_client *c, const char *name, dist_dtype dt,
                       const void *const *pieces, int ndim, const int64_t *piece_shape,
                       const char *mesh_text, const char *placements_text) {
  dist_mesh *m = NULL;
  dist_placement pl[DIST_MAX_MESH_DIMS];
  cr_assert_eq(dist_mesh_from_string(mesh_text, NULL, &m), 0);
  cr_assert_gt(dist_parse_placements(placements_text, pl, DIST_MAX_MESH_DIMS), 0);
  const int64_t *shapes[4] = {piece_shape, piece_shape, piece_shape, piece_shape};
  dist_tensor *t = NULL;
  cr_assert_eq(dist_dtensor_from_local(c, name, pieces, dt, ndim, shapes, m, pl, &t),
               0, "%s", dist_errmsg(c));
  dist_tensor_free(t);
  dist_mesh_free(m);
}

/* Closes c, replaces the cluster by one of 2 daemons and restores the
 * checkpoint in dir onto mesh [1,0] with Shard(0); returns the new client. */
static dist_client *restore_onto_two(dist_client *c, const char *dir,
                                     dist_checkpoint_info *info) {
  dist_close(c);
  stop_cluster();
  c = start(2);
  dist_mesh *m2 = NULL;
  cr_assert_eq(dist_mesh_from_string("[1,0]", NULL, &m2), 0);
  dist_placement s0 = DIST_SHARD_DIM(0);
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.mesh = m2;
  o.placements = &s0;
  o.nplacements = 1;
  cr_assert_eq(dist_checkpoint_restore(c, dir, &o, info), 0, "%s", dist_errmsg(c));
  dist_mesh_free(m2);
  return c;
}

static int count_tensors(dist_client *c) {
  dist_tensor **list = NULL;
  int n = 0;
  cr_assert_eq(dist_tensor_list(c, &list, &n), 0, "%s", dist_errmsg(c));
  dist_tensor_list_free(list, n);
  return n;
}

Test(checkpoint, restore_onto_fewer_daemons_than_saved, .timeout = 240) {
  dist_client *c = start(4);
  /* x: uneven shards (2, 2, 2, 1 rows); y: a 2-d mesh with a replicated
   * dim; p: Partial(sum) pieces, q: Shard(0) and Partial(max) pieces, both
   * reduced in the rebuild as a reshard would. */
  float x0[7 * 3], p0[3] = {1, 2, 3};
  int64_t y0[4 * 6];
  for (int i = 0; i < 21; i++) x0[i] = 0.25f * (float)i - 2;
  for (int i = 0; i < 24; i++) y0[i] = (int64_t)i * 1000003 - 7;
  int64_t sx[2] = {7, 3}, sy[2] = {4, 6}, sp[1] = {3};
  dist_tensor_free(put(c, "x", DIST_FLOAT32, x0, 2, sx, "[0,1,2,3]", "Shard(0)"));
  dist_tensor_free(put(c, "y", DIST_INT64, y0, 2, sy, "[[0,1],[2,3]]",
                       "Shard(1),Replicate()"));
  static const float p2[3] = {1, 2, 3}, p3[3] = {10, 20, 30}, p_sum[3] = {11, 22, 33};
  const void *p_pieces[2] = {p2, p3};
  put_pieces(c, "p", DIST_FLOAT32, p_pieces, 1, sp, "[2,3]", "Partial(sum)");
  static const float q0[3] = {1, 9, -4}, q1[3] = {5, 2, -7}, q2[3] = {0, 0, 8},
                     q3[3] = {-1, 6, 3}, q_max[6] = {5, 9, -4, 0, 6, 8};
  const void *q_pieces[4] = {q0, q1, q2, q3};
  int64_t sq[2] = {1, 3};
  put_pieces(c, "q", DIST_FLOAT32, q_pieces, 2, sq, "[[0,1],[2,3]]", "Shard(0),Partial(max)");
  /* r: a sum of maxima or a maximum of sums? Not defined: refused. */
  put_pieces(c, "r", DIST_FLOAT32, q_pieces, 1, sp, "[[0,1],[2,3]]", "Partial(sum),Partial(max)");
  dist_tensor_free(put(c, "z", DIST_FLOAT32, p0, 1, sp, "[3,1]", "Shard(0)"));
  char tmp[] = "/tmp/ckpt-fewer-XXXXXX";
  cr_assert(mkdtemp(tmp));
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s", tmp);
  cr_assert_eq(dist_checkpoint_save(c, tmp, NULL, NULL), 0, "%s", dist_errmsg(c));
  dist_close(c);
  stop_cluster();
  c = start(2);

  /* Without a mesh of this cluster to put it on, x cannot come back. */
  const char *only_x[] = {"x"}, *p_and_q[] = {"p", "q"}, *x_and_y[] = {"x", "y"};
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.tensors = only_x;
  o.ntensors = 1;
  cr_assert_eq(dist_checkpoint_restore(c, tmp, &o, NULL), DIST_ENOTSUP);
  cr_assert(strstr(dist_errmsg(c), "'x' was saved on rank 3, but the cluster has 2 "
                                   "daemons"), "%s", dist_errmsg(c));
  /* The rank named is one the cluster lacks, not the mesh's last. */
  const char *only_z[] = {"z"};
  o.tensors = only_z;
  cr_assert_eq(dist_checkpoint_restore(c, tmp, &o, NULL), DIST_ENOTSUP);
  cr_assert(strstr(dist_errmsg(c), "'z' was saved on rank 3, but"), "%s", dist_errmsg(c));
  dist_mesh *m2 = NULL;
  cr_assert_eq(dist_mesh_from_string("[1,0]", NULL, &m2), 0);
  dist_placement s0 = DIST_SHARD_DIM(0);
  o.mesh = m2;
  o.placements = &s0;
  o.nplacements = 1;
  const char *only_r[] = {"r"};
  o.tensors = only_r;
  cr_assert_eq(dist_checkpoint_restore(c, tmp, &o, NULL), DIST_ENOTSUP);
  cr_assert(strstr(dist_errmsg(c), "'r' was saved Partial on mesh dims with different "
                                   "reductions"), "%s", dist_errmsg(c));
  cr_assert_eq(count_tensors(c), 0, "a refused restore stored something");
  o.tensors = p_and_q;
  o.ntensors = 2;
  cr_assert_eq(dist_checkpoint_restore(c, tmp, &o, NULL), 0, "%s", dist_errmsg(c));
  harness_expect_value(c, "p", p_sum, sizeof p_sum);
  harness_expect_value(c, "q", q_max, sizeof q_max);
  expect_layout(c, "q", "[Shard(0)]", 2, 1);
  dist_tensor_delete(c, "p");
  dist_tensor_delete(c, "q");

  /* A corrupt file of a rank that is gone is found before anything is
   * restored. */
  char path[600], saved[700];
  rank_file(3, path, sizeof path);
  snprintf(saved, sizeof saved, "%s.good", path);
  copy_file(path, saved);
  FILE *f = fopen(path, "r+b");
  cr_assert(f);
  fseek(f, -3, SEEK_END);
  fputc('!', f);
  fclose(f);
  o.tensors = x_and_y;
  o.ntensors = 2;
  cr_assert_neq(dist_checkpoint_restore(c, tmp, &o, NULL), 0);
  cr_assert(strstr(dist_errmsg(c), "sha256"), "%s", dist_errmsg(c));
  cr_assert_eq(count_tensors(c), 0, "a refused restore stored something");
  copy_file(saved, path);

  dist_checkpoint_info info;
  cr_assert_eq(dist_checkpoint_restore(c, tmp, &o, &info), 0, "%s", dist_errmsg(c));
  cr_assert_eq(info.ntensors, 2);
  harness_expect_value(c, "x", x0, sizeof x0);
  harness_expect_value(c, "y", y0, sizeof y0);
  expect_layout(c, "x", "[Shard(0)]", 2, 1);
  expect_layout(c, "y", "[Shard(0)]", 2, 1);

  /* distctl shows the rebuild as it goes. */
  char args[800], *out = NULL, *err = NULL;
  snprintf(args, sizeof args, "checkpoint restore %s --tensors y --mesh [0,1] "
           "--placements Replicate\\(\\)", tmp);
  cr_assert_eq(run_distctl(args, &out, &err), 0, "distctl: %s %s", out, err);
  cr_assert(strstr(err, "rebuild"), "%s", err);
  /* y's distinct pieces (Replicate on mesh dim 1) are ranks 0's and 2's. */
  cr_assert(strstr(err, "read    rank 2 (3/4)") && !strstr(err, "read    rank 3"), "%s",
            err);
  free(out);
  free(err);
  expect_layout(c, "y", "[Replicate()]", 2, 0);
  harness_expect_value(c, "y", y0, sizeof y0);
  dist_mesh_free(m2);
  dist_close(c);
  cr_assert_eq(harness_remove_dir(tmp), 0);
}

/* Integer Partial(avg) pieces rebuilt in the client average exactly, as
 * the daemons' reshard does: the sum of the pieces used to wrap in the
 * dtype (four int32 near 2e9), and was divided then. Expectations are
 * computed here in int64, truncated toward zero as C divides. */
Test(checkpoint, integer_partial_avg_rebuilt_onto_fewer_daemons_is_exact, .timeout = 240) {
  dist_client *c = start(4);
  int32_t a[4][2];
  int32_t a_avg[2];
  for (int i = 0; i < 2; i++) {
    int64_t sum = 0;
    for (int r = 0; r < 4; r++) sum += a[r][i] = (i ? -1 : 1) * (2000000000 - (r == 3));
    a_avg[i] = (int32_t)(sum / 4);
  }
  int64_t sa[1] = {2}, sb[2] = {1, 3};
  put_pieces(c, "a", DIST_INT32, (const void *[]){a[0], a[1], a[2], a[3]}, 1, sa,
             "[0,1,2,3]", "Partial(avg)");
  /* Rows by mesh dim 0, each the average of a pair of ranks. */
  static const uint8_t b[4][3] = {{250, 3, 1}, {251, 0, 2}, {100, 200, 255}, {102, 255, 254}};
  uint8_t b_avg[6];
  for (int i = 0; i < 6; i++) b_avg[i] = (uint8_t)((b[i / 3 * 2][i % 3] + b[i / 3 * 2 + 1][i % 3]) / 2);
  put_pieces(c, "b", DIST_UINT8, (const void *[]){b[0], b[1], b[2], b[3]}, 2, sb,
             "[[0,1],[2,3]]", "Shard(0),Partial(avg)");
  char tmp[] = "/tmp/ckpt-avg-XXXXXX";
  cr_assert(mkdtemp(tmp));
  cr_assert_eq(dist_checkpoint_save(c, tmp, NULL, NULL), 0, "%s", dist_errmsg(c));
  c = restore_onto_two(c, tmp, NULL);
  harness_expect_value(c, "a", a_avg, sizeof a_avg);
  harness_expect_value(c, "b", b_avg, sizeof b_avg);
  dist_close(c);
  cr_assert_eq(harness_remove_dir(tmp), 0);
}

/* A rebuilt tensor that does not fit on its new mesh leaves the tensor of
 * that name as it was before the restore. The rebuild used to delete it
 * everywhere first, and the name was then gone. */
Test(checkpoint, a_rebuild_that_does_not_fit_leaves_the_tensor_as_it_was, .timeout = 240) {
  dist_client *c = start(4);
  enum { N = 8192 }; /* float64: 64 KiB, 16 KiB per piece */
  static double saved[N], filler[9216];
  for (int i = 0; i < N; i++) saved[i] = 0.5 * i - 3;
  int64_t n = N, nf = 9216, n4 = 4;
  dist_tensor_free(put(c, "big", DIST_FLOAT64, saved, 1, &n, "[0,1,2,3]", "Shard(0)"));
  char dir[] = "/tmp/ckpt-fit-XXXXXX"; /* outlives the cluster */
  cr_assert(mkdtemp(dir));
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  dist_close(c);
  stop_cluster();

  /* 96 KiB per daemon: the filler's 72 KiB leave no room for a 32 KiB
   * half of "big", with or without the 32 bytes it holds now. */
  const char *args[] = {"--memory-limit=96KiB", NULL};
  c = harness_start_unique_with_client(&cluster, 2, "ckpt-fit", args);
  static const double before[4] = {1, 2, 3, 4};
  dist_tensor_free(put(c, "big", DIST_FLOAT64, before, 1, &n4, "[0,1]", "Replicate()"));
  dist_tensor_free(put(c, "filler", DIST_FLOAT64, filler, 1, &nf, "[0,1]", "Replicate()"));
  dist_mesh *m2 = NULL;
  cr_assert_eq(dist_mesh_from_string("[0,1]", NULL, &m2), 0);
  dist_placement s0 = DIST_SHARD_DIM(0);
  const char *only_big[] = {"big"};
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.tensors = only_big, o.ntensors = 1, o.mesh = m2, o.placements = &s0;
  o.nplacements = 1;
  int rc = dist_checkpoint_restore(c, dir, &o, NULL);
  cr_assert_eq(rc, DIST_ENOMEM, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "'big' could not be rebuilt") &&
            strstr(dist_errmsg(c), "memory limit"), "%s", dist_errmsg(c));
  /* The whole account of what the store holds, not its first 127 bytes. */
  cr_assert(strstr(dist_errmsg(c), "as before the restore; restore again: "), "%s",
            dist_errmsg(c));
  harness_expect_value(c, "big", before, sizeof before);
  expect_layout(c, "big", "[Replicate()]", 2, 0);

  /* With room, the same restore replaces it. */
  cr_assert_eq(dist_tensor_delete(c, "filler"), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_checkpoint_restore(c, dir, &o, NULL), 0, "%s", dist_errmsg(c));
  expect_layout(c, "big", "[Shard(0)]", 2, 0);
  /* Piece by piece: gathering the whole value would not fit. */
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, "big", &t), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++) {
    void *data = NULL;
    size_t nbytes = 0;
    cr_assert_eq(dist_dtensor_to_local(c, t, r, &data, &nbytes, NULL), 0, "%s",
                 dist_errmsg(c));
    cr_assert_eq(nbytes, sizeof saved / 2);
    cr_assert_eq(memcmp(data, saved + r * N / 2, nbytes), 0, "rank %d's half differs", r);
    free(data);
  }
  dist_tensor_free(t);
  dist_mesh_free(m2);
  dist_close(c);
  cr_assert_eq(harness_remove_dir(dir), 0);
}

/* Parameters saved on four daemons and restored onto two keep their
 * optimizer state: the client puts each state buffer together from the
 * rank files, as it does the values, and every daemon of the new mesh
 * gets its slice. The next updates are those of the run that never
 * stopped. */
Test(checkpoint, parameters_restored_onto_fewer_daemons_keep_their_state, .timeout = 240) {
  dist_client *c = start(4);
  make_params(c, "[0,1,2,3]");
  for (int k = 1; k <= 3; k++) push_step(c, k);
  char tmp[] = "/tmp/ckpt-params-XXXXXX";
  cr_assert(mkdtemp(tmp));
  cr_assert_eq(dist_checkpoint_save(c, tmp, NULL, NULL), 0, "%s", dist_errmsg(c));
  float want_w[24], want_v[5];
  push_step(c, 4);
  push_step(c, 5);
  pull(c, "w", want_w, sizeof want_w);
  pull(c, "v", want_v, sizeof want_v);
  dist_checkpoint_info info;
  c = restore_onto_two(c, tmp, &info);
  cr_assert_eq(info.nparams, 2);
  cr_assert_eq(info.params_reset, 0);
  expect_layout(c, "w", "[Shard(0)]", 2, 1);
  expect_resumed(c, want_w, want_v, "lost its state on the way to two daemons");
  dist_close(c);
  cr_assert_eq(harness_remove_dir(tmp), 0);
}
