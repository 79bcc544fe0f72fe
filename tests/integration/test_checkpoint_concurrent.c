/* Two saves into one directory at once: a commit must not remove the files
 * of a save still in progress there, and still removes those of saves that
 * are over (superseded, or abandoned long ago). Real daemons sharing the
 * directory, as on one machine or a shared file system, or each with a
 * directory of its own at the same path (mount namespaces); the saves are
 * interleaved deterministically from the first save's progress callback,
 * which libdist calls after each daemon answered its Save. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.pb-c.h" /* raw Save and Commit requests, in orders of our own */
#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"

TestSuite(concurrent, .fini = stop_cluster, .timeout = 180);

static const float a0[6] = {1.5f, -2, 3.25f, 4, 5, -6.5f};
static const float b0[4] = {10, 20, 30, 40};

static void put_a_and_b(dist_client *c) {
  int64_t sa = 6, sb = 4;
  dist_tensor_free(harness_put(c, "a", DIST_FLOAT32, a0, 1, &sa, "[0,1]", "Shard(0)"));
  dist_tensor_free(harness_put(c, "b", DIST_FLOAT32, b0, 1, &sb, "[0,1]", "Shard(0)"));
}

/* A cluster of two, started with extra_args, holding "a" and "b"; dir is
 * set to its checkpoint directory. Returns its client. */
static dist_client *start_with_a_and_b(const char *const *extra_args, char *dir, size_t len) {
  dist_client *c = harness_start_with_client(&cluster, 2, extra_args);
  put_a_and_b(c);
  snprintf(dir, len, "%s/ckpt", cluster.dir);
  return c;
}

/* The second save, made from the first one's progress callback once the
 * first has `after` of its daemons' files written (and none committed). */
typedef struct interleave {
  dist_client *other;
  const char *dir;
  int after;
  int rc;
  char msg[600];
  dist_checkpoint_info info;
} interleave;

static void save_b_meanwhile(void *arg, const char *phase, int rank, int done, int total,
                             uint64_t bytes) {
  (void)rank, (void)total, (void)bytes;
  interleave *in = arg;
  if (strcmp(phase, "save") != 0 || done != in->after) return;
  const char *names[] = {"b"};
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.tensors = names;
  o.ntensors = 1;
  in->rc = dist_checkpoint_save(in->other, in->dir, &o, &in->info);
  snprintf(in->msg, sizeof in->msg, "%s", dist_errmsg(in->other));
}

/* Saves "a" into dir while a save of "b" starts and commits there after
 * `after` daemons wrote a's files; returns a's checkpoint id in id. */
static void save_a_across_b(dist_client *c, const char *dir, int after, char *id, size_t len) {
  dist_client *other = harness_client(&cluster);
  interleave in;
  memset(&in, 0, sizeof in);
  in.other = other, in.dir = dir, in.after = after, in.rc = -1;
  const char *names[] = {"a"};
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.tensors = names;
  o.ntensors = 1;
  o.progress = save_b_meanwhile;
  o.progress_arg = &in;
  dist_checkpoint_info info;
  int rc = dist_checkpoint_save(c, dir, &o, &info);
  cr_assert_eq(in.rc, 0, "the save of b in between: %s", in.msg);
  cr_assert_eq(rc, 0, "the save of a around it: %s", dist_errmsg(c));
  cr_assert_str_neq(info.id, in.info.id);
  snprintf(id, len, "%s", info.id);
  dist_close(other);
}

/* name (n float32 on both daemons) replaced by zeros, so that a restore's
 * values can only come from the files. */
static void overwrite_with_zeros(dist_client *c, const char *name, int64_t n) {
  float zeros[8] = {0};
  cr_assert(n <= 8);
  dist_tensor_delete(c, name);
  dist_tensor_free(harness_put(c, name, DIST_FLOAT32, zeros, 1, &n, "[0,1]", "Shard(0)"));
}

/* a's checkpoint, committed last, must be the one in dir, whole: a
 * restore brings a's values back (a is overwritten first, so the values
 * come from the files), and b's superseded files are gone. */
static void expect_a_restored(dist_client *c, const char *dir, const char *id) {
  overwrite_with_zeros(c, "a", 6);
  dist_checkpoint_info info;
  cr_assert_eq(dist_checkpoint_restore(c, dir, NULL, &info), 0,
               "the checkpoint committed last is broken: %s", dist_errmsg(c));
  cr_assert_str_eq(info.id, id, "the restore names a's checkpoint");
  cr_assert_eq(info.ntensors, 1);
  harness_expect_value(c, "a", a0, sizeof a0);
  cr_assert_eq(harness_count_files(dir, id, ".safetensors"), 2, "a's two rank files");
  cr_assert_eq(harness_count_files(dir, "rank", ".safetensors"), 2,
               "b's superseded files must be removed by a's commit");
}

/* A cluster of two with "a" and "b", where a's save, with b's made and
 * committed in between after `after` daemons wrote a's files, is then
 * restored. */
static void save_across_and_restore(int after) {
  char dir[400];
  char id[80];
  dist_client *c = start_with_a_and_b(NULL, dir, sizeof dir);
  save_a_across_b(c, dir, after, id, sizeof id);
  expect_a_restored(c, dir, id);
  dist_close(c);
}

/* The reviewer's case: a's files are written on every daemon when b
 * commits into the same directory. b's commit removed them (its keep list
 * named b's only), and a's commit then wrote a manifest naming files that
 * were gone. */
Test(concurrent, a_commit_keeps_the_files_of_a_save_written_everywhere_but_not_committed) {
  save_across_and_restore(2);
}

/* b commits when only rank 0 has written a's file. Rank 1 has not heard
 * of a's save yet, and sees rank 0's files in the shared directory: it
 * must leave them to rank 0, which knows a's save is in progress. */
Test(concurrent, a_commit_keeps_a_file_another_daemon_wrote_for_a_save_in_progress) {
  save_across_and_restore(1);
}

/* Every daemon's Save of checkpoint id, raw, as libdist sends it; each
 * reply kept in replies[r] (free with free_replies) when replies is set. */
static void raw_save(dist_client *c, const char *dir, const char *id,
                     Dist__V1__CheckpointSaveReply **replies) {
  Dist__V1__CheckpointSaveRequest rq = DIST__V1__CHECKPOINT_SAVE_REQUEST__INIT;
  rq.dir = (char *)dir;
  rq.checkpoint_id = (char *)id;
  for (int r = 0; r < cluster.n; r++) {
    ProtobufCMessage *rp = NULL;
    cr_assert_eq(dist_call_one(c, r, "/dist.v1.Checkpoint/Save", &rq.base,
                               &dist__v1__checkpoint_save_reply__descriptor, &rp), 0,
                 "rank %d: %s", r, dist_errmsg(c));
    if (replies) replies[r] = (Dist__V1__CheckpointSaveReply *)rp;
    else protobuf_c_message_free_unpacked(rp, NULL);
  }
}

static void free_replies(Dist__V1__CheckpointSaveReply **replies) {
  for (int r = 0; r < cluster.n; r++) protobuf_c_message_free_unpacked(&replies[r]->base, NULL);
}

/* The n rank files of dir whose names hold infix, written at written_s
 * (harness_now_s), may be of a save that may still commit for keep_s: a
 * save's commit then keeps them, and the first commit after removes them
 * with every file but the last save's. */
static void expect_kept_then_removed(dist_client *c, const char *dir, const char *infix, int n,
                                     double written_s, double keep_s) {
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  double age_s = harness_now_s() - written_s;
  cr_assert(age_s < keep_s - 0.5, "the save took too long to tell (%.1f s)", age_s);
  cr_assert_eq(harness_count_files(dir, infix, ".safetensors"), n,
               "a commit removed files that may be of a save still to commit");
  harness_sleep_ms((int)((keep_s + 0.5 - age_s) * 1000));
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(harness_count_files(dir, infix, ""), 0, "files outlived their time");
  cr_assert_eq(harness_count_files(dir, "rank", ".safetensors"), 2, "the last save's only");
}

/* A daemon keeps a save's files only while its client may still commit
 * it: (world size + 1) x max_call_duration after its Save was answered
 * (3 s here). After that they are stale, and the next commit removes them
 * as before. */
Test(concurrent, an_abandoned_saves_files_are_kept_while_it_may_commit_then_removed) {
  const char *args[] = {"--max-call-duration", "1s", NULL};
  char dir[400];
  dist_client *c = start_with_a_and_b(args, dir, sizeof dir);
  /* Saved on every daemon, as by a client that then died: answered,
   * never committed nor discarded. */
  raw_save(c, dir, "abandoned", NULL);
  expect_kept_then_removed(c, dir, "abandoned", 2, harness_now_s(), 3);
  dist_close(c);
}

/* A manifest for checkpoint id, whose daemons answered replies: the
 * manifest libdist wrote (of the same tensors) with id's files; rank 0's
 * directory is at seen_at here. */
static char *manifest_for(const char *seen_at, const char *id,
                          Dist__V1__CheckpointSaveReply *const *replies) {
  char path[512];
  snprintf(path, sizeof path, "%s/manifest.json", seen_at);
  json_t *m = json_load_file(path, 0, NULL);
  cr_assert_not_null(m, "no manifest in %s", seen_at);
  json_object_set_new(m, "checkpoint_id", json_string(id));
  for (int r = 0; r < cluster.n; r++) {
    json_t *f = json_array_get(json_object_get(m, "files"), (size_t)r);
    json_object_set_new(f, "file", json_string(replies[r]->file));
    json_object_set_new(f, "sha256", json_string(replies[r]->sha256));
    json_object_set_new(f, "bytes", json_integer((json_int_t)replies[r]->bytes));
  }
  char *text = json_dumps(m, JSON_INDENT(2));
  json_decref(m);
  return text;
}

/* Daemon r's Commit of the save that replies describe, writing manifest
 * unless it is empty (libdist sends it to rank 0 only). */
static void raw_commit(dist_client *c, int r, const char *dir, const char *manifest,
                       Dist__V1__CheckpointSaveReply *const *replies) {
  char *keep[HARNESS_MAX];
  for (int k = 0; k < cluster.n; k++) keep[k] = replies[k]->file;
  Dist__V1__CheckpointCommitRequest rq = DIST__V1__CHECKPOINT_COMMIT_REQUEST__INIT;
  rq.dir = (char *)dir;
  rq.manifest = (char *)manifest;
  rq.n_keep_files = (size_t)cluster.n;
  rq.keep_files = keep;
  ProtobufCMessage *rp = NULL;
  cr_assert_eq(dist_call_one(c, r, "/dist.v1.Checkpoint/Commit", &rq.base,
                             &dist__v1__checkpoint_commit_reply__descriptor, &rp), 0,
               "rank %d: %s", r, dist_errmsg(c));
  protobuf_c_message_free_unpacked(rp, NULL);
}

/* Called between two steps of a test, with the test's client. */
typedef void (*between_fn)(dist_client *c);

/* Saves x and y into dir (rank 0's directory at seen_at here), whose
 * commits then cross as two clients' may: x's reaches rank 0 first, then
 * y's reaches every daemon, then (after `before_last`, unless NULL) x's
 * reaches rank 1. The manifest is y's (rank 0 wrote it last), and x's
 * commit on rank 1 must not remove y's file there, though x's keep list
 * does not name it. */
static void save_x_and_y_crossing(dist_client *c, const char *dir, const char *seen_at,
                                  between_fn before_last) {
  Dist__V1__CheckpointSaveReply *x[HARNESS_MAX], *y[HARNESS_MAX];
  raw_save(c, dir, "x", x);
  raw_save(c, dir, "y", y);
  char *mx = manifest_for(seen_at, "x", x), *my = manifest_for(seen_at, "y", y);
  raw_commit(c, 0, dir, mx, x);
  raw_commit(c, 0, dir, my, y);
  raw_commit(c, 1, dir, "", y);
  if (before_last) before_last(c);
  raw_commit(c, 1, dir, "", x);
  free(mx);
  free(my);
  free_replies(x);
  free_replies(y);
}

/* The checkpoint in dir must be id's, whole: a restore brings back the
 * values of "a" and "b" put before its save. */
static void expect_restored(dist_client *c, const char *dir, const char *id) {
  dist_checkpoint_info info;
  cr_assert_eq(dist_checkpoint_restore(c, dir, NULL, &info), 0,
               "the checkpoint in place is broken: %s", dist_errmsg(c));
  cr_assert_str_eq(info.id, id);
  harness_expect_value(c, "a", a0, sizeof a0);
  harness_expect_value(c, "b", b0, sizeof b0);
}

/* The checkpoint in dir must be y's, whole, restored over zeros (so that
 * the values can only come from the files). */
static void expect_y_restored(dist_client *c, const char *dir) {
  overwrite_with_zeros(c, "a", 6);
  overwrite_with_zeros(c, "b", 4);
  expect_restored(c, dir, "y");
}

/* The daemons share the directory: rank 1 reads the manifest in place. */
Test(concurrent, a_commit_crossing_a_newer_one_keeps_the_files_of_the_manifest_in_place) {
  char dir[400];
  dist_client *c = start_with_a_and_b(NULL, dir, sizeof dir);
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  save_x_and_y_crossing(c, dir, dir, NULL);
  expect_y_restored(c, dir);
  dist_close(c);
}

/* Where each daemon has a directory of its own: the path they are given,
 * and the directory each sees there, as this process sees it. */
typedef struct own_dirs {
  char dir[400], own[2][400];
} own_dirs;

/* A cluster of two, each daemon with a directory of its own at d->dir
 * (skips the test where the machine allows none), holding "a" and "b",
 * saved there once; returns its client. */
static dist_client *start_own_dirs_with_a_save(own_dirs *d) {
  if (!harness_start_own_dirs(&cluster, 2, NULL))
    cr_skip_test("this machine allows no mount namespace for a directory of each daemon's own");
  dist_client *c = harness_client(&cluster);
  put_a_and_b(c);
  snprintf(d->dir, sizeof d->dir, "%s/ckpt", cluster.dir);
  for (int r = 0; r < 2; r++) harness_own_dir(&cluster, r, d->own[r], sizeof d->own[r]);
  cr_assert_eq(dist_checkpoint_save(c, d->dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  return c;
}

/* Each daemon has a directory of its own at the path it is given, as on
 * hosts that do not share it: rank 1 cannot read rank 0's manifest, and
 * only its record of the saves it saw committed keeps y's file from x's
 * commit there. The files the crossing left beside y's (x's) go with the
 * next save's commit. */
Test(concurrent, a_commit_crossing_a_newer_one_keeps_its_files_where_each_daemon_has_its_own_dir) {
  own_dirs d;
  dist_client *c = start_own_dirs_with_a_save(&d);
  cr_assert_eq(harness_count_files(d.own[1], "rank1.", ".safetensors"), 1);
  cr_assert_eq(harness_count_files(d.own[1], "manifest", ""), 0,
               "rank 1 sees rank 0's directory");
  save_x_and_y_crossing(c, d.dir, d.own[0], NULL);
  cr_assert_eq(harness_count_files(d.own[1], "rank1.y.", ".safetensors"), 1,
               "x's commit on rank 1 removed y's file, which the manifest names");
  expect_y_restored(c, d.dir);
  cr_assert_eq(dist_checkpoint_save(c, d.dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(harness_count_files(d.own[0], "rank", ".safetensors"), 1, "the last save's only");
  cr_assert_eq(harness_count_files(d.own[1], "rank", ".safetensors"), 1, "the last save's only");
  dist_close(c);
}

/* Rank 1's daemon killed and started again (as by a crash and its
 * supervisor), with extra_args; returns once both daemons see each other
 * again. It holds no tensors then. */
static void restart_rank_1(const char *const *extra_args) {
  harness_kill(&cluster, 1, SIGKILL);
  harness_start_rank(&cluster, 1, extra_args);
  harness_assert_all_connected(&cluster, "after rank 1 restarted");
}

/* "a" and "b" deleted from both daemons: a restore's values can only come
 * from the files, and the daemons hold the same tensors once rank 1,
 * restarted, holds none. */
static void delete_a_and_b(dist_client *c) {
  cr_assert_eq(dist_tensor_delete(c, "a"), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tensor_delete(c, "b"), 0, "%s", dist_errmsg(c));
}

static void delete_a_and_b_and_restart_rank_1(dist_client *c) {
  delete_a_and_b(c);
  restart_rank_1(NULL);
}

/* "c" put on both daemons: something for the saves after a restart. */
static void put_c(dist_client *c) {
  int64_t n = 4;
  dist_tensor_free(harness_put(c, "c", DIST_FLOAT32, b0, 1, &n, "[0,1]", "Shard(0)"));
}

/* x's Save is answered by both daemons, then rank 1 restarts, then y is
 * saved and committed through both, then x commits. The restarted daemon
 * no longer remembers x's save; y's commit there removed x's file, and
 * x's commit then wrote a manifest naming a file that was gone. */
Test(concurrent, a_save_in_progress_across_a_restart_of_one_daemon_still_commits_whole) {
  char dir[400];
  dist_client *c = start_with_a_and_b(NULL, dir, sizeof dir);
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, NULL), 0, "%s", dist_errmsg(c));
  Dist__V1__CheckpointSaveReply *x[HARNESS_MAX];
  raw_save(c, dir, "x", x);
  char *mx = manifest_for(dir, "x", x); /* of a and b, like the save before */
  delete_a_and_b_and_restart_rank_1(c);
  put_c(c);
  cr_assert_eq(dist_checkpoint_save(c, dir, NULL, NULL), 0, "y: %s", dist_errmsg(c));
  cr_assert_eq(harness_count_files(dir, "rank1.x.", ".safetensors"), 1,
               "y's commit removed the file of x's save, in progress across the restart");
  raw_commit(c, 0, dir, mx, x);
  raw_commit(c, 1, dir, "", x);
  expect_restored(c, dir, "x");
  cr_assert_eq(harness_count_files(dir, "rank", ".safetensors"), 2,
               "x's only: the save before x, in place at the restart, and y are superseded");
  free(mx);
  free_replies(x);
  dist_close(c);
}

/* The crossing of a_commit_crossing_a_newer_one_keeps_its_files_where_each_daemon_has_its_own_dir,
 * with rank 1 restarted between y's commit there and x's: the restarted
 * daemon no longer remembers that it saw y committed, and must still keep
 * y's file, which the manifest it cannot read names. */
Test(concurrent, a_commit_crossing_a_newer_one_after_a_restart_keeps_its_files_in_a_dir_of_its_own) {
  own_dirs d;
  dist_client *c = start_own_dirs_with_a_save(&d);
  save_x_and_y_crossing(c, d.dir, d.own[0], delete_a_and_b_and_restart_rank_1);
  cr_assert_eq(harness_count_files(d.own[1], "rank1.y.", ".safetensors"), 1,
               "x's commit on the restarted rank 1 removed y's file, which the manifest names");
  expect_restored(c, d.dir, "y");
  dist_close(c);
}

/* What a restarted daemon keeps from before its restart (every rank file
 * of its own that no manifest names: it cannot tell which may be of a
 * save in progress) goes with the first commit once the file is older than
 * twice the commit window, (world size + 1) x max_call_duration (6 s
 * here). */
Test(concurrent, a_restarted_daemons_files_from_before_go_with_the_first_commit_past_the_window) {
  const char *args[] = {"--max-call-duration", "1s", NULL};
  char dir[400];
  dist_client *c = start_with_a_and_b(args, dir, sizeof dir);
  raw_save(c, dir, "before", NULL); /* its client then died, as its daemon did */
  double written = harness_now_s();
  delete_a_and_b(c);
  restart_rank_1(args);
  put_c(c);
  expect_kept_then_removed(c, dir, "rank1.before.", 1, written, 6);
  dist_close(c);
}
