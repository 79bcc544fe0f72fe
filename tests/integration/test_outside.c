/* SPMD trainers outside an operation's mesh or group. Every trainer calls
 * every operation (as a Paddle program runs whole on every rank); one
 * outside the mesh or group gets Paddle's no-op success: its tensors are
 * handles with the global description and an empty local piece, its
 * collectives leave its buffers as they were, and it takes the op ids the
 * others take, so later operations of all of them meet. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_fixture.h"

/* Runs main on n trainers (each of size bytes, from trainers on), one
 * thread each, and waits for them all. */
static void run_trainers(int n, void *(*main)(void *), void *trainers, size_t size) {
  pthread_t th[8];
  for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, main, (char *)trainers + r * size);
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

/* Appends "what: CODE message; " to a trainer's log. */
static void note(dist_client *c, char *msg, size_t len, const char *what, int rc) {
  size_t used = strlen(msg);
  snprintf(msg + used, len - used, "%s: %s %s; ", what, dist_err_name(rc),
           rc ? dist_errmsg(c) : "");
}

/* One of three trainers of a program that calls every operation on every
 * trainer, though rank 2 is outside w's mesh [0, 1] and the group {0, 1}. */
typedef struct outside_trainer {
  dist_client *c;
  int rank;
  int put_rc, local_rc, scatter_rc, count_rc, layer_rc, pair_rc, reshard_rc, delete_rc;
  int reduce_rc, full_rc;
  size_t local_bytes, full_bytes;
  int64_t local_shape[1], rows[1], global[2];
  int ndim;
  int64_t shape[1];
  int placement_after; /* the handle's placement kind after the reshard */
  int32_t pair_value, sum;
  float full[4];
  double reduce_seconds;
  char msg[1000];
} outside_trainer;

#define NOTE(t, what, rc) note((t)->c, (t)->msg, sizeof (t)->msg, what, rc)

/* NOTE, keeping the first failing rc in *failed; returns rc. */
static int noted(dist_client *c, char *msg, size_t len, int *failed, const char *what, int rc) {
  note(c, msg, len, what, rc);
  if (rc && !*failed) *failed = rc;
  return rc;
}

#define STEP(t, what, rc) noted((t)->c, (t)->msg, sizeof (t)->msg, &(t)->failed, what, rc)

/* put, to_local, global_scatter, count_global, an expert layer's creation
 * and an all-reduce over {0, 1}. */
static void first_half(outside_trainer *t, const dist_mesh *mesh, dist_tensor **w) {
  float v[4] = {1, 2, 3, 4};
  dist_placement p = DIST_SHARD_DIM(0);
  t->put_rc = dist_shard_tensor(t->c, "w", v, DIST_FLOAT32, 1, (int64_t[]){4}, mesh, &p, w);
  NOTE(t, "put", t->put_rc);
  void *local = NULL;
  t->local_shape[0] = -1;
  t->local_rc = *w ? dist_dtensor_to_local(t->c, *w, -1, &local, &t->local_bytes, t->local_shape)
                   : -1;
  NOTE(t, "to_local", t->local_rc);
  free(local);
  static const int pair[2] = {0, 1};
  int64_t two_each[2] = {2, 2};
  const int64_t *lc[1] = {two_each}, *gc[1] = {two_each};
  int64_t *gout[1] = {t->global};
  int32_t x[4] = {1, 2, 3, 4};
  const void *xs[1] = {x};
  void *out[1] = {NULL};
  t->rows[0] = -1;
  t->scatter_rc = dist_global_scatter(t->c, xs, NULL, DIST_INT32, 1, lc, gc, 1, pair, 2, NULL,
                                      out, t->rows);
  NOTE(t, "global_scatter", t->scatter_rc);
  free(out[0]);
  t->global[0] = t->global[1] = -1; /* an outsider's are zeroed: nobody sends it a row */
  t->count_rc = dist_count_global(t->c, lc, 1, pair, 2, gout);
  NOTE(t, "count_global", t->count_rc);
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.d_model = 2, o.d_hidden = 3, o.group = pair, o.group_size = 2;
  dist_moe_layer *layer = NULL;
  t->layer_rc = dist_moe_layer_create(t->c, "moe", &o, &layer);
  NOTE(t, "moe_layer_create", t->layer_rc);
  dist_moe_layer_free(layer);
  t->pair_value = 100 + t->rank;
  t->pair_rc = dist_all_reduce(t->c, &t->pair_value, 1, DIST_INT32, DIST_REDUCE_SUM, pair, 2);
  NOTE(t, "all_reduce over {0, 1}", t->pair_rc);
}

/* reshard, a delete by name, an all-reduce of all three, full_tensor. */
static void second_half(outside_trainer *t, dist_tensor *w) {
  dist_placement r = DIST_REPLICATED;
  t->reshard_rc = w ? dist_reshard(t->c, w, NULL, &r) : -1;
  NOTE(t, "reshard", t->reshard_rc);
  if (w) {
    t->ndim = dist_tensor_ndim(w);
    t->shape[0] = dist_tensor_shape(w)[0];
    t->placement_after = dist_tensor_placements(w)[0].kind;
  }
  /* The outsider's daemon holds no w: the members' must stay. */
  if (t->rank == 2) t->delete_rc = dist_tensor_delete(t->c, "w");
  NOTE(t, "delete", t->delete_rc);
  t->sum = t->rank + 1;
  double t0 = harness_now_s();
  t->reduce_rc = dist_all_reduce(t->c, &t->sum, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0);
  t->reduce_seconds = harness_now_s() - t0;
  NOTE(t, "all_reduce", t->reduce_rc);
  void *data = NULL;
  t->full_rc = w ? dist_full_tensor(t->c, w, &data, &t->full_bytes) : -1;
  NOTE(t, "full_tensor", t->full_rc);
  if (t->full_rc == 0 && t->full_bytes == sizeof t->full) memcpy(t->full, data, t->full_bytes);
  free(data);
}

static void *outside_main(void *arg) {
  outside_trainer *t = arg;
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0,1]", NULL, &mesh);
  dist_tensor *w = NULL;
  first_half(t, mesh, &w);
  second_half(t, w);
  dist_tensor_free(w);
  dist_mesh_free(mesh);
  return NULL;
}

static void expect_member(const outside_trainer *t) {
  static const float w0[4] = {1, 2, 3, 4};
  const char *m = t->msg;
  int r = t->rank;
  cr_expect(t->put_rc == 0 && t->local_rc == 0 && t->scatter_rc == 0 && t->count_rc == 0 &&
                t->layer_rc == 0 && t->pair_rc == 0 && t->reshard_rc == 0 && t->full_rc == 0,
            "rank %d: %s", r, m);
  cr_expect_eq(t->local_bytes, 2 * sizeof(float), "rank %d's piece of w: %zu bytes", r,
               t->local_bytes);
  cr_expect_eq(t->rows[0], 4, "rank %d scattered into %lld rows", r, (long long)t->rows[0]);
  cr_expect_eq(t->pair_value, 201, "rank %d: 100 + 101 is %d", r, (int)t->pair_value);
  cr_expect_eq(memcmp(t->full, w0, sizeof w0), 0, "rank %d read another w", r);
}

/* The outsider: every call succeeds with nothing (its expert layer is
 * empty), and no daemon holds anything for it. */
static void expect_outsider(const outside_trainer *t) {
  const char *m = t->msg;
  cr_expect(t->put_rc == 0 && t->local_rc == 0 && t->scatter_rc == 0 && t->count_rc == 0 &&
                t->layer_rc == 0 && t->pair_rc == 0 && t->reshard_rc == 0 && t->full_rc == 0,
            "rank 2: %s", m);
  cr_expect(t->local_bytes == 0 && t->local_shape[0] == 0,
            "rank 2's piece: %zu bytes, shape [%lld]", t->local_bytes,
            (long long)t->local_shape[0]);
  cr_expect_eq(t->rows[0], 0, "rank 2 scattered into %lld rows", (long long)t->rows[0]);
  cr_expect(t->global[0] == 0 && t->global[1] == 0, "rank 2's counts: %lld %lld",
            (long long)t->global[0], (long long)t->global[1]);
  cr_expect_eq(t->pair_value, 102, "rank 2's value changed to %d", (int)t->pair_value);
  cr_expect_eq(t->full_bytes, 0, "rank 2's full w: %zu bytes", t->full_bytes);
  cr_expect_eq(t->delete_rc, DIST_ENOTFOUND, "rank 2: %s", m);
}

/* Before, rank 2 was told EINVAL by the put, to_local (no handle),
 * global_scatter, count_global, reshard (no handle) and full_tensor. */
Test(outside, a_trainer_outside_the_mesh_or_group_gets_empty_successes, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 3, NULL);
  outside_trainer tr[3];
  for (int r = 0; r < 3; r++) {
    tr[r] = (outside_trainer){.c = harness_spmd_client(&cluster, r, "outside"), .rank = r};
  }
  run_trainers(3, outside_main, tr, sizeof tr[0]);
  for (int r = 0; r < 3; r++) {
    cr_log_info("rank %d: %s", r, tr[r].msg);
    if (r < 2) expect_member(&tr[r]);
    else expect_outsider(&tr[r]);
    /* Every handle describes the whole w, resharded. */
    cr_expect(tr[r].ndim == 1 && tr[r].shape[0] == 4 && tr[r].placement_after == DIST_REPLICATE,
              "rank %d's handle: ndim %d, shape [%lld], placement %d", r, tr[r].ndim,
              (long long)tr[r].shape[0], tr[r].placement_after);
    cr_expect_eq(tr[r].reduce_rc, 0, "rank %d: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].sum, 6, "rank %d: 1 + 2 + 3 is %d", r, (int)tr[r].sum);
    cr_expect_lt(tr[r].reduce_seconds, 2.0, "rank %d's all-reduce took %.1f s", r,
                 tr[r].reduce_seconds);
    dist_close(tr[r].c);
  }
  dist_tensor *w = NULL;
  cr_expect_eq(harness_open_on(&cluster, 2, "w", &w), DIST_ENOTFOUND,
               "rank 2's daemon holds w");
  dist_tensor_free(w);
}

/* One of three SPMD trainers reading tensor w in full and pushing g to
 * parameter w, both on mesh [0, 1], then all-reducing with the others. */
typedef struct mesh_user {
  dist_client *c;
  const dist_tensor *w; /* a handle opened by a client of the whole cluster */
  int rank;
  int full_rc, push_rc, reduce_rc;
  size_t full_bytes;
  float full[4];
  int32_t sum;
  double reduce_seconds;
  char msg[600];
} mesh_user;

static void *mesh_user_main(void *arg) {
  mesh_user *t = arg;
  void *data = NULL;
  t->full_rc = dist_full_tensor(t->c, t->w, &data, &t->full_bytes);
  NOTE(t, "full_tensor", t->full_rc);
  if (t->full_rc == 0 && t->full_bytes == sizeof t->full) memcpy(t->full, data, t->full_bytes);
  free(data);
  uint64_t version = 0;
  t->push_rc = dist_param_push_tensor(t->c, "w", 0, "g", &version);
  NOTE(t, "push", t->push_rc);
  t->sum = t->rank + 1;
  double t0 = harness_now_s();
  t->reduce_rc = dist_all_reduce(t->c, &t->sum, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0);
  t->reduce_seconds = harness_now_s() - t0;
  NOTE(t, "all_reduce", t->reduce_rc);
  return NULL;
}

/* Rank 2 is outside w's mesh: its full_tensor is empty, as Paddle's local
 * value of a rank outside the mesh is (before: EINVAL); its push, which
 * names the parameter, is told that its daemon does not hold it. Each
 * takes its op id as the others' do, so the all-reduce of all three that
 * follows meets. */
Test(outside, a_full_tensor_or_push_outside_the_mesh_stays_in_step, .timeout = 120,
     .fini = stop_cluster) {
  dist_client *c = harness_start_with_client(&cluster, 3, NULL);
  static const float w0[4] = {1, 2, 3, 4}, g0[4] = {1, 1, 1, 1};
  int64_t n4 = 4;
  dist_tensor *w = harness_put(c, "w", DIST_FLOAT32, w0, 1, &n4, "[0,1]", "Replicate()");
  dist_tensor_free(harness_put(c, "g", DIST_FLOAT32, g0, 1, &n4, "[0,1]", "Replicate()"));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  cr_assert_eq(dist_param_configure(c, "w", &o), 0, "%s", dist_errmsg(c));
  mesh_user tr[3];
  for (int r = 0; r < 3; r++) {
    tr[r] = (mesh_user){.c = harness_spmd_client(&cluster, r, "outside-mesh"), .w = w, .rank = r};
  }
  run_trainers(3, mesh_user_main, tr, sizeof tr[0]);
  for (int r = 0; r < 3; r++) {
    cr_log_info("rank %d: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].full_rc, 0, "rank %d: %s", r, tr[r].msg);
    if (r < 2) {
      cr_expect_eq(memcmp(tr[r].full, w0, sizeof w0), 0, "rank %d read another w", r);
      cr_expect_eq(tr[r].push_rc, 0, "rank %d: %s", r, tr[r].msg);
    } else {
      cr_expect_eq(tr[r].full_bytes, 0, "rank 2 read %zu bytes of w", tr[r].full_bytes);
      /* Its daemon, the only one it asks, does not hold w. */
      cr_expect_eq(tr[r].push_rc, DIST_ENOTFOUND, "rank 2: %s", tr[r].msg);
    }
    cr_expect_eq(tr[r].reduce_rc, 0, "rank %d: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].sum, 6, "rank %d: 1 + 2 + 3 is %d", r, (int)tr[r].sum);
    cr_expect_lt(tr[r].reduce_seconds, 2.0, "rank %d's all-reduce took %.1f s", r,
                 tr[r].reduce_seconds);
    dist_close(tr[r].c);
  }
  dist_tensor_free(w);
  dist_close(c);
}

/* ------------------------------------------ a pipeline of two stages */

/* One of four trainers of a two-stage pipeline: stage 0 on mesh [0, 1],
 * stage 1 on [2, 3], every trainer running every call. x (8 values) is
 * put on stage 0, sent to stage 1 (a reshard to [2, 3]), where each rank
 * makes its half of y = 2x + 1 and builds y from the halves; y goes back
 * to stage 0 and is read there. */
typedef struct stage_trainer {
  dist_client *c;
  int rank;
  int failed; /* the first failing call's rc */
  size_t x_local_bytes, y_local_bytes, y_full_bytes;
  float x_local[8], y_local[8], y_full[8];
  int64_t y_shape;
  int32_t stage_sum, sum;
  char msg[1200];
} stage_trainer;

static const float pipeline_x[8] = {1, 2, 3, 4, 5, 6, 7, 8};

static int step(stage_trainer *t, const char *what, int rc) {
  NOTE(t, what, rc);
  if (rc && !t->failed) t->failed = rc;
  return rc;
}

/* dtensor_to_local of t's own piece into buf (room for 8 floats). */
static void read_local(stage_trainer *t, const dist_tensor *x, float *buf, size_t *bytes) {
  void *data = NULL;
  int64_t shape[1];
  if (step(t, "to_local", dist_dtensor_to_local(t->c, x, -1, &data, bytes, shape)) == 0 &&
      *bytes <= 8 * sizeof(float))
    memcpy(buf, data, *bytes);
  free(data);
}

static void *stage_main(void *arg) {
  stage_trainer *t = arg;
  dist_mesh *stage0 = NULL, *stage1 = NULL;
  dist_mesh_from_string("[0,1]", NULL, &stage0);
  dist_mesh_from_string("[2,3]", NULL, &stage1);
  dist_placement shard = DIST_SHARD_DIM(0), rep = DIST_REPLICATED;
  dist_tensor *x = NULL, *y = NULL;
  step(t, "put x", dist_shard_tensor(t->c, "x", pipeline_x, DIST_FLOAT32, 1, (int64_t[]){8},
                                     stage0, &shard, &x));
  if (x) step(t, "send x to stage 1", dist_reshard(t->c, x, stage1, &rep));
  if (x) read_local(t, x, t->x_local, &t->x_local_bytes);
  /* Stage 1's half of y; the others compute from what they hold (nothing). */
  float half[4] = {0};
  int64_t half_shape[1] = {4};
  int first = t->rank == 2 ? 0 : 4;
  for (int i = 0; i < 4 && t->x_local_bytes; i++) half[i] = 2 * t->x_local[first + i] + 1;
  const void *pieces[1] = {half};
  const int64_t *shapes[1] = {half_shape};
  step(t, "y from stage 1's halves",
       dist_dtensor_from_local(t->c, "y", pieces, DIST_FLOAT32, 1, shapes, stage1, &shard, &y));
  if (y) t->y_shape = dist_tensor_shape(y)[0];
  if (y) step(t, "send y to stage 0", dist_reshard(t->c, y, stage0, &rep));
  if (y) read_local(t, y, t->y_local, &t->y_local_bytes);
  void *data = NULL;
  if (y && step(t, "full y", dist_full_tensor(t->c, y, &data, &t->y_full_bytes)) == 0 &&
      t->y_full_bytes <= sizeof t->y_full)
    memcpy(t->y_full, data, t->y_full_bytes);
  free(data);
  static const int stage1_ranks[2] = {2, 3};
  t->stage_sum = t->rank;
  step(t, "all_reduce over stage 1",
       dist_all_reduce(t->c, &t->stage_sum, 1, DIST_INT32, DIST_REDUCE_SUM, stage1_ranks, 2));
  t->sum = t->rank + 1;
  step(t, "all_reduce", dist_all_reduce(t->c, &t->sum, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0));
  dist_tensor_free(x);
  dist_tensor_free(y);
  dist_mesh_free(stage0);
  dist_mesh_free(stage1);
  return NULL;
}

/* Before, the stage-1 ranks were told EINVAL by the put of x and the
 * stage-0 ranks by the making of y, so neither stage had the other's
 * handle to reshard: the pipeline could not run as one program. */
Test(outside, a_two_stage_pipeline_runs_as_one_program_on_every_trainer, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 4, NULL);
  float y_ref[8];
  for (int i = 0; i < 8; i++) y_ref[i] = 2 * pipeline_x[i] + 1;
  stage_trainer tr[4];
  for (int r = 0; r < 4; r++) {
    tr[r] = (stage_trainer){.c = harness_spmd_client(&cluster, r, "pipeline"), .rank = r};
  }
  run_trainers(4, stage_main, tr, sizeof tr[0]);
  for (int r = 0; r < 4; r++) {
    const stage_trainer *t = &tr[r];
    int in_stage0 = r < 2;
    cr_log_info("rank %d: %s", r, t->msg);
    cr_expect_eq(t->failed, 0, "rank %d: %s", r, t->msg);
    /* x lives on stage 1 now, replicated; y on stage 0. */
    cr_expect_eq(t->x_local_bytes, in_stage0 ? 0 : sizeof pipeline_x, "rank %d's x: %zu bytes",
                 r, t->x_local_bytes);
    if (!in_stage0)
      cr_expect_eq(memcmp(t->x_local, pipeline_x, sizeof pipeline_x), 0, "rank %d's x", r);
    cr_expect_eq(t->y_shape, 8, "rank %d's y is %lld long", r, (long long)t->y_shape);
    cr_expect_eq(t->y_local_bytes, in_stage0 ? sizeof y_ref : 0, "rank %d's y: %zu bytes", r,
                 t->y_local_bytes);
    cr_expect_eq(t->y_full_bytes, in_stage0 ? sizeof y_ref : 0, "rank %d's full y: %zu bytes",
                 r, t->y_full_bytes);
    if (in_stage0) {
      cr_expect_eq(memcmp(t->y_local, y_ref, sizeof y_ref), 0, "rank %d's y", r);
      cr_expect_eq(memcmp(t->y_full, y_ref, sizeof y_ref), 0, "rank %d's full y", r);
    }
    cr_expect_eq(t->stage_sum, in_stage0 ? r : 5, "rank %d's stage sum %d", r, (int)t->stage_sum);
    cr_expect_eq(t->sum, 10, "rank %d: 1 + 2 + 3 + 4 is %d", r, (int)t->sum);
    dist_close(tr[r].c);
  }
}

/* An outsider's exchange is a no-op, but its arguments are still its
 * own to get right: before, a NULL entry passed unseen, as only the
 * members' entries were read. */
Test(outside, an_outsiders_exchange_arguments_are_checked_as_a_members, .timeout = 60,
     .fini = stop_cluster) {
  harness_start(&cluster, 2, NULL);
  dist_client *c = harness_spmd_client(&cluster, 1, "outside-args");
  const int group[1] = {0};
  const int64_t counts[1] = {0};
  const int64_t *lc[1] = {counts}, *gc[1] = {counts};
  const void *x[1] = {NULL};
  int64_t rows[1] = {0}, out_rows[1] = {-1};
  void *out[1] = {NULL};
  int rc = dist_global_scatter(c, x, rows, DIST_FLOAT32, 4, lc, gc, 1, group, 1, NULL, out,
                               out_rows);
  cr_expect_eq(rc, DIST_EINVAL, "rc %d: %s", rc, dist_errmsg(c));
  cr_expect(strstr(dist_errmsg(c), "x[0] is NULL"), "message: %s", dist_errmsg(c));
  free(out[0]);
  dist_close(c);
}

/* One of three trainers calling count_global over {0, 1} with one NULL
 * entry: rank 0's local_count[0], rank 2's (outside) global_count[0]. */
typedef struct count_trainer {
  dist_client *c;
  int rank;
  int count_rc, reduce_rc;
  int32_t sum;
  char msg[600];
} count_trainer;

static void *null_count_main(void *arg) {
  count_trainer *t = arg;
  static const int pair[2] = {0, 1};
  int64_t local[2] = {1, 1}, global[2] = {-1, -1};
  const int64_t *lc[1] = {t->rank == 0 ? NULL : local};
  int64_t *gc[1] = {t->rank == 2 ? NULL : global};
  t->count_rc = dist_count_global(t->c, lc, 1, pair, 2, gc);
  NOTE(t, "count_global", t->count_rc);
  t->sum = t->rank + 1;
  t->reduce_rc = dist_all_reduce(t->c, &t->sum, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0);
  NOTE(t, "all_reduce", t->reduce_rc);
  return NULL;
}

/* Before, a member's NULL entry was read through (the trainer crashed,
 * as a single client did) and an outsider's passed unseen; each is now
 * refused naming it, the member's aborted to the other member, and every
 * trainer stays in step. */
Test(outside, a_null_count_global_entry_is_refused_inside_and_outside_the_group,
     .timeout = 120, .fini = stop_cluster) {
  harness_start(&cluster, 3, NULL);
  count_trainer tr[3];
  for (int r = 0; r < 3; r++)
    tr[r] = (count_trainer){.c = harness_spmd_client(&cluster, r, "outside-count"), .rank = r};
  run_trainers(3, null_count_main, tr, sizeof tr[0]);
  const char *said[3] = {"local_count[0] is NULL", NULL, "global_count[0] is NULL"};
  for (int r = 0; r < 3; r++) {
    cr_log_info("rank %d: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].count_rc, r == 1 ? DIST_ECANCELED : DIST_EINVAL, "rank %d: %s", r,
                 tr[r].msg);
    cr_expect(!said[r] || strstr(tr[r].msg, said[r]), "rank %d: %s", r, tr[r].msg);
    cr_expect(tr[r].reduce_rc == 0 && tr[r].sum == 6, "rank %d: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  dist_client *c = harness_client(&cluster);
  int64_t local[3] = {0}, global[3] = {0};
  const int64_t *lcs[2] = {local, NULL};
  int64_t *gcs[2] = {global, global};
  int rc = dist_count_global(c, lcs, 1, (const int[]){0, 1}, 2, gcs);
  cr_expect_eq(rc, DIST_EINVAL, "a single client's NULL entry: %s", dist_errmsg(c));
  cr_expect(strstr(dist_errmsg(c), "local_count[1] is NULL"), "%s", dist_errmsg(c));
  dist_close(c);
}

/* ------------------------------------------ the tape's exchanges */

/* One of three trainers recording z = global_gather(global_scatter(x))
 * over the group {0, 1} on a tape and backpropagating from z; rank 2 is
 * outside the group and runs every call too. */
typedef struct tape_trainer {
  dist_client *c;
  int rank;
  int failed;
  float x[4], z_grad[4]; /* its rows of x and the gradient it gives for z */
  float z[4], x_grad[4];
  size_t z_bytes, x_grad_bytes;
  int64_t y_rows, z_rows;
  int32_t sum;
  char msg[1200];
} tape_trainer;

static int tape_step(tape_trainer *t, const char *what, int rc) { return STEP(t, what, rc); }

/* Each member sends two rows to each member's one expert, and gets two
 * from each: the gather sends them back, so z is x and x's gradient z's. */
static dist_tape_exchange tape_exchange(const void *const *xs, const int64_t *const *counts,
                                        const char *x_name, const char *out_name) {
  static const int pair[2] = {0, 1};
  return (dist_tape_exchange){x_name, xs, NULL, DIST_FLOAT32, 1, counts, counts, 1,
                              pair, 2, out_name, 0};
}

static void read_into(tape_trainer *t, const char *what, int rc, void *data, size_t bytes,
                      float *buf, size_t *got) {
  if (tape_step(t, what, rc) == 0 && bytes <= 4 * sizeof(float)) memcpy(buf, data, bytes);
  *got = rc ? (size_t)-1 : bytes;
  free(data);
}

static void tape_body(tape_trainer *t, dist_tape *tape) {
  static const int64_t two_each[2] = {2, 2};
  const int64_t *counts[1] = {two_each};
  const void *xs[1] = {t->x};
  dist_tensor *y = NULL, *z = NULL;
  dist_tape_exchange a = tape_exchange(xs, counts, "x", "y");
  tape_step(t, "scatter", dist_tape_global_scatter(tape, &a, &y, &t->y_rows));
  a = tape_exchange(NULL, counts, "y", "z");
  tape_step(t, "gather", dist_tape_global_gather(tape, &a, &z, &t->z_rows));
  void *data = NULL;
  size_t bytes = 0;
  int rc = z ? dist_dtensor_to_local(t->c, z, -1, &data, &bytes, NULL) : -1;
  read_into(t, "z to_local", rc, data, bytes, t->z, &t->z_bytes);
  dist_value g = {t->z_grad, DIST_FLOAT32, 2, {t->rank < 2 ? 4 : 0, 1}};
  dist_arg ga = {NULL, &g};
  const dist_tensor *outs[1] = {z};
  tape_step(t, "backward", z ? dist_tape_backward(tape, outs, &ga, 1) : -1);
  data = NULL;
  rc = dist_tape_grad_local(tape, "x", -1, &data, &bytes, NULL);
  read_into(t, "x's gradient", rc, data, bytes, t->x_grad, &t->x_grad_bytes);
  dist_tensor_free(y);
  dist_tensor_free(z);
}

static void *tape_main(void *arg) {
  tape_trainer *t = arg;
  for (int i = 0; i < 4; i++) {
    t->x[i] = (float)(10 * t->rank + i + 1);
    t->z_grad[i] = (float)(100 * (t->rank + 1) + i);
  }
  dist_tape *tape = NULL;
  if (tape_step(t, "tape", dist_tape_new(t->c, &tape)) == 0) tape_body(t, tape);
  dist_tape_free(tape);
  t->sum = t->rank + 1;
  tape_step(t, "all_reduce", dist_all_reduce(t->c, &t->sum, 1, DIST_INT32, DIST_REDUCE_SUM,
                                             NULL, 0));
  return NULL;
}

/* Before, rank 2 was told "not in the group" by the tape's scatter, had
 * no z to backpropagate from, and was one op id behind the others. */
Test(outside, the_tapes_exchanges_and_their_backward_are_no_ops_outside_the_group,
     .timeout = 120, .fini = stop_cluster) {
  harness_start(&cluster, 3, NULL);
  tape_trainer tr[3];
  for (int r = 0; r < 3; r++) {
    tr[r] = (tape_trainer){.c = harness_spmd_client(&cluster, r, "outside-tape"), .rank = r};
  }
  run_trainers(3, tape_main, tr, sizeof tr[0]);
  for (int r = 0; r < 3; r++) {
    const tape_trainer *t = &tr[r];
    size_t want = r < 2 ? sizeof t->x : 0;
    cr_log_info("rank %d: %s", r, t->msg);
    cr_expect_eq(t->failed, 0, "rank %d: %s", r, t->msg);
    cr_expect(t->y_rows == (r < 2 ? 4 : 0) && t->z_rows == t->y_rows,
              "rank %d: y %lld rows, z %lld", r, (long long)t->y_rows, (long long)t->z_rows);
    cr_expect(t->z_bytes == want && t->x_grad_bytes == want,
              "rank %d: z %zu bytes, x's gradient %zu", r, t->z_bytes, t->x_grad_bytes);
    if (r < 2) {
      cr_expect_eq(memcmp(t->z, t->x, sizeof t->x), 0, "rank %d: z is not x", r);
      cr_expect_eq(memcmp(t->x_grad, t->z_grad, sizeof t->x), 0,
                   "rank %d: x's gradient is not the one given for z", r);
    }
    cr_expect_eq(t->sum, 6, "rank %d: 1 + 2 + 3 is %d", r, (int)t->sum);
    dist_close(tr[r].c);
  }
  dist_tensor *h = NULL;
  cr_expect_eq(harness_open_on(&cluster, 2, "y", &h), DIST_ENOTFOUND, "rank 2's daemon holds y");
  dist_tensor_free(h);
}

/* ------------------------------------------ an expert layer */

/* One of three trainers running an expert layer over the group {0, 1}:
 * create, configure, forward, backward, step, forward again. Rank 2 runs
 * it too in the run with the outsider, and not at all in the reference
 * run; the members' results must be the same in both. */
typedef struct moe_trainer {
  dist_client *c;
  int rank, with_outsider;
  const char *layer;
  int failed;
  float y1[4], gx[4], y2[4], gate_grad[4];
  int32_t sum;
  char msg[1200];
} moe_trainer;

static int moe_step(moe_trainer *t, const char *what, int rc) {
  NOTE(t, what, rc);
  if (rc && !t->failed) t->failed = rc;
  return rc;
}

/* out (4 floats) from a pass's one row array, freed. */
static void take_rows(moe_trainer *t, void *rows, float *out) {
  if (rows && t->rank < 2) memcpy(out, rows, 4 * sizeof *out);
  free(rows);
}

static void moe_passes(moe_trainer *t, dist_moe_layer *l) {
  float x[4] = {0.5f + (float)t->rank, -1, 0.25f, 2 - (float)t->rank};
  static const float gate_w[4] = {0.3f, -0.2f, 0.1f, 0.4f}, grad_y[4] = {1, -0.5f, 0.25f, 2};
  const void *xs[1] = {x}, *gys[1] = {grad_y};
  int64_t tokens[1] = {t->rank < 2 ? 2 : 0};
  void *y[1] = {NULL}, *gx[1] = {NULL};
  dist_param_opts po = DIST_PARAM_OPTS_INIT;
  po.lr = 0.5;
  moe_step(t, "configure", dist_moe_layer_configure_optimizer(t->c, l, &po));
  moe_step(t, "forward", dist_moe_layer_forward(t->c, l, xs, tokens, gate_w, y));
  take_rows(t, y[0], t->y1);
  for (int i = 0; i < 4; i++) t->gate_grad[i] = -1; /* an outsider's is zeroed */
  moe_step(t, "backward", dist_moe_layer_backward(t->c, l, gys, gx, t->gate_grad));
  take_rows(t, gx[0], t->gx);
  moe_step(t, "step", dist_moe_layer_step(t->c, l));
  y[0] = NULL;
  moe_step(t, "forward after the step", dist_moe_layer_forward(t->c, l, xs, tokens, gate_w, y));
  take_rows(t, y[0], t->y2);
  moe_step(t, "release", dist_moe_layer_release(t->c, l));
}

static const int pair[2] = {0, 1};

/* t's layer over pair: one expert a rank, d_model 2, d_hidden 3. */
static int create_pair_layer(moe_trainer *t, dist_moe_layer **l) {
  static const float w1[6] = {0.1f, -0.3f, 0.2f, 0.5f, -0.1f, 0.3f};
  static const float w2[6] = {0.4f, 0.1f, -0.2f, 0.3f, 0.2f, -0.5f};
  dist_expert_weights w = {w1, NULL, w2, NULL};
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.d_model = 2, o.d_hidden = 3, o.group = pair, o.group_size = 2, o.weights = &w;
  return moe_step(t, "create", dist_moe_layer_create(t->c, t->layer, &o, l));
}

static void *moe_main(void *arg) {
  moe_trainer *t = arg;
  dist_moe_layer *l = NULL;
  if (create_pair_layer(t, &l) == 0) moe_passes(t, l);
  dist_moe_layer_free(l);
  t->sum = t->rank + 1;
  moe_step(t, "all_reduce", dist_all_reduce(t->c, &t->sum, 1, DIST_INT32, DIST_REDUCE_SUM,
                                            t->with_outsider ? NULL : pair,
                                            t->with_outsider ? 0 : 2));
  return NULL;
}

/* Runs the layer on ranks 0 and 1, and on 2 when with_outsider. */
static void run_moe(moe_trainer *tr, const char *layer, int with_outsider) {
  int n = with_outsider ? 3 : 2;
  for (int r = 0; r < n; r++) {
    tr[r] = (moe_trainer){.c = harness_spmd_client(&cluster, r, layer), .rank = r,
                          .with_outsider = with_outsider, .layer = layer};
  }
  run_trainers(n, moe_main, tr, sizeof tr[0]);
  for (int r = 0; r < n; r++) {
    cr_log_info("%s, rank %d: %s", layer, r, tr[r].msg);
    cr_expect_eq(tr[r].failed, 0, "%s, rank %d: %s", layer, r, tr[r].msg);
    cr_expect_eq(tr[r].sum, with_outsider ? 6 : 3, "%s, rank %d: the sum is %d", layer, r,
                 (int)tr[r].sum);
    dist_close(tr[r].c);
  }
}

/* Before, rank 2's creation was refused (EINVAL), it had no layer to run
 * passes with, and a program running the layer on every trainer stopped
 * there. */
Test(outside, an_expert_layer_is_empty_outside_its_group, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 3, NULL);
  moe_trainer ref[3], tr[3];
  run_moe(ref, "moe-ref", 0);
  run_moe(tr, "moe-all", 1);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(memcmp(tr[r].y1, ref[r].y1, sizeof tr[r].y1), 0, "rank %d's y", r);
    cr_expect_eq(memcmp(tr[r].gx, ref[r].gx, sizeof tr[r].gx), 0, "rank %d's grad x", r);
    cr_expect_eq(memcmp(tr[r].gate_grad, ref[r].gate_grad, sizeof tr[r].gate_grad), 0,
                 "rank %d's gate gradient", r);
    cr_expect_eq(memcmp(tr[r].y2, ref[r].y2, sizeof tr[r].y2), 0, "rank %d's y after the step",
                 r);
    cr_expect_neq(memcmp(tr[r].y2, tr[r].y1, sizeof tr[r].y1), 0, "rank %d: the step changed "
                  "nothing", r);
  }
  static const float zero[4] = {0};
  cr_expect_eq(memcmp(tr[2].gate_grad, zero, sizeof zero), 0, "rank 2's gate gradient");
  dist_tensor *h = NULL;
  cr_expect_eq(harness_open_on(&cluster, 2, "moe-all.expert0.w1", &h), DIST_ENOTFOUND,
               "rank 2's daemon holds an expert");
  dist_tensor_free(h);
}

/* Rank 0 refuses a forward (no y): the members skip the rest of the pass
 * as before, and every trainer, the outsider too, takes the pass's ids. */
static void *refused_forward_main(void *arg) {
  moe_trainer *t = arg;
  static const float gate_w[4] = {0.3f, -0.2f, 0.1f, 0.4f};
  float x[4] = {0.5f, -1, 0.25f, 2};
  const void *xs[1] = {x};
  int64_t tokens[1] = {t->rank < 2 ? 2 : 0};
  void *y[1] = {NULL};
  dist_moe_layer *l = NULL;
  create_pair_layer(t, &l);
  int rc = dist_moe_layer_forward(t->c, l, xs, tokens, gate_w, t->rank == 0 ? NULL : y);
  NOTE(t, "forward", rc);
  t->failed = rc; /* the members' forward fails; the outsider's is a no-op */
  free(y[0]);
  dist_moe_layer_free(l);
  t->sum = t->rank + 1;
  moe_step(t, "all_reduce", dist_all_reduce(t->c, &t->sum, 1, DIST_INT32, DIST_REDUCE_SUM,
                                            NULL, 0));
  return NULL;
}

/* Before, the members took one id of the refused pass and the outsider
 * three (it cannot learn of the refusal), so the all-reduce after it ran
 * under different ids and failed. */
Test(outside, a_refused_expert_pass_takes_its_ids_on_every_trainer, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 3, NULL);
  moe_trainer tr[3];
  for (int r = 0; r < 3; r++) {
    tr[r] = (moe_trainer){.c = harness_spmd_client(&cluster, r, "moe-refused"), .rank = r,
                          .layer = "moe-refused"};
  }
  run_trainers(3, refused_forward_main, tr, sizeof tr[0]);
  for (int r = 0; r < 3; r++) {
    cr_log_info("rank %d: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].failed, r == 0 ? DIST_EINVAL : r == 1 ? DIST_ECANCELED : 0,
                 "rank %d's forward: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].sum, 6, "rank %d: the sum is %d (%s)", r, (int)tr[r].sum, tr[r].msg);
    dist_close(tr[r].c);
  }
}

/* ------------------------------------------ a delete by handle */

typedef struct delete_trainer {
  dist_client *c;
  int rank;
  int put_rc, delete_rc, reduce_rc;
  int32_t sum;
  char msg[600];
} delete_trainer;

static void *delete_main(void *arg) {
  delete_trainer *t = arg;
  static const float v[4] = {1, 2, 3, 4};
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0,1]", NULL, &mesh);
  dist_placement p = DIST_SHARD_DIM(0);
  dist_tensor *w = NULL;
  t->put_rc = dist_shard_tensor(t->c, "w", v, DIST_FLOAT32, 1, (int64_t[]){4}, mesh, &p, &w);
  NOTE(t, "put", t->put_rc);
  t->delete_rc = w ? dist_tensor_delete_handle(t->c, w) : -1;
  NOTE(t, "delete", t->delete_rc);
  t->sum = t->rank + 1;
  t->reduce_rc = dist_all_reduce(t->c, &t->sum, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0);
  NOTE(t, "all_reduce", t->reduce_rc);
  dist_tensor_free(w);
  dist_mesh_free(mesh);
  return NULL;
}

/* Every trainer deletes w by its handle: the members' pieces go, and the
 * outsider's (none) is a no-op success, where by name it is ENOTFOUND. */
Test(outside, a_delete_by_an_outsiders_handle_is_a_no_op_success, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 3, NULL);
  delete_trainer tr[3];
  for (int r = 0; r < 3; r++) {
    tr[r] = (delete_trainer){.c = harness_spmd_client(&cluster, r, "outside-delete"), .rank = r};
  }
  run_trainers(3, delete_main, tr, sizeof tr[0]);
  for (int r = 0; r < 3; r++) {
    cr_log_info("rank %d: %s", r, tr[r].msg);
    cr_expect(tr[r].put_rc == 0 && tr[r].delete_rc == 0 && tr[r].reduce_rc == 0, "rank %d: %s",
              r, tr[r].msg);
    cr_expect_eq(tr[r].sum, 6, "rank %d: 1 + 2 + 3 is %d", r, (int)tr[r].sum);
    dist_close(tr[r].c);
    dist_tensor *h = NULL;
    cr_expect_eq(harness_open_on(&cluster, r, "w", &h), DIST_ENOTFOUND, "rank %d holds w", r);
    dist_tensor_free(h);
  }
}

/* ------------------------------------------ a LocalLayer on mesh [0, 1] */

/* One of four trainers (or of the two members, in the reference run)
 * calling LocalLayers on mesh [0, 1]: y = 2x (Shard(0)), then
 * loss = sum(x * y) (Partial(sum)), x being 3 values a member, Shard(0).
 * With tape, the calls are recorded and backpropagated from loss: x's
 * gradient is y + 2x = 4x, two gradients of x added on [0, 1]. */
typedef struct layer_trainer {
  dist_client *c;
  int rank, n, tape;
  const char *x_name; /* one per run: the reference's stays stored */
  int failed;
  float x[3];
  size_t y_bytes, loss_bytes, grad_bytes;
  float y[3], loss, grad[3];
  int64_t y_global, loss_ndim;
  int32_t sum;
  double reduce_seconds;
  char msg[1500];
} layer_trainer;

static int layer_step(layer_trainer *t, const char *what, int rc) { return STEP(t, what, rc); }

/* The program `name`: f(x, y) = sum(x * y) on mesh, Partial(sum). */
static dist_program *dot_program(const char *name, const dist_mesh *mesh) {
  dist_program *p = NULL;
  dist_program_new(name, &p);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  int y = dist_input_dtensor(p, "y", DIST_FLOAT32);
  dist_placement partial = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_program_output(p, dist_op_sum(p, dist_op_mul(p, x, y), NULL, 0, 0));
  dist_program_out_dist_attr(p, mesh, &partial, NULL);
  return p;
}

/* f(x) = 2x, or f(x, y) = sum(x * y), on mesh [0, 1]. */
static dist_program *pair_program(const dist_mesh *mesh, int loss) {
  if (loss) return dot_program("pair.loss", mesh);
  dist_program *p = NULL;
  dist_program_new("pair.double", &p);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  dist_placement shard = DIST_SHARD_DIM(0);
  dist_program_output(p, dist_op_mul_scalar(p, x, 2));
  dist_program_out_dist_attr(p, mesh, &shard, NULL);
  return p;
}

/* Copies t's own piece of h into buf (room for 3 floats). */
static void read_piece(layer_trainer *t, const char *what, const dist_tensor *h, float *buf,
                       size_t *bytes) {
  void *data = NULL;
  if (layer_step(t, what, dist_dtensor_to_local(t->c, h, -1, &data, bytes, NULL)) == 0 &&
      *bytes <= 3 * sizeof(float))
    memcpy(buf, data, *bytes);
  free(data);
}

/* y and loss, by plain calls or on the tape (with its backward). */
static void run_layers(layer_trainer *t, dist_tensor *x, dist_program *twice,
                       dist_program *loss_of, dist_tape *tape) {
  dist_tensor *y = NULL, *loss = NULL;
  dist_invocation *inv[2] = {NULL, NULL};
  dist_arg a1[1] = {{x, NULL}};
  layer_step(t, "y = 2x", tape ? dist_tape_local_layer_call(tape, twice, a1, 1, NULL, &y)
                               : dist_local_layer_call(t->c, twice, a1, 1, NULL, &inv[0], &y));
  dist_arg a2[2] = {{x, NULL}, {y, NULL}};
  if (y)
    layer_step(t, "loss", tape ? dist_tape_local_layer_call(tape, loss_of, a2, 2, NULL, &loss)
                               : dist_local_layer_call(t->c, loss_of, a2, 2, NULL, &inv[1],
                                                       &loss));
  if (y) t->y_global = dist_tensor_shape(y)[0];
  if (y) read_piece(t, "y to_local", y, t->y, &t->y_bytes);
  if (loss) t->loss_ndim = dist_tensor_ndim(loss);
  void *data = NULL;
  if (loss && layer_step(t, "full loss", dist_full_tensor(t->c, loss, &data, &t->loss_bytes)) == 0 &&
      t->loss_bytes == sizeof t->loss)
    memcpy(&t->loss, data, sizeof t->loss);
  free(data);
  const dist_tensor *outs[1] = {loss};
  if (tape && loss) layer_step(t, "backward", dist_tape_backward(tape, outs, NULL, 1));
  if (tape && loss) {
    data = NULL;
    int rc = dist_tape_grad_local(tape, t->x_name, -1, &data, &t->grad_bytes, NULL);
    if (layer_step(t, "x's gradient", rc) == 0 && t->grad_bytes <= sizeof t->grad)
      memcpy(t->grad, data, t->grad_bytes);
    free(data);
  }
  for (int i = 0; i < 2; i++) dist_invocation_release(t->c, inv[i]), dist_invocation_free(inv[i]);
  dist_tensor_free(y);
  dist_tensor_free(loss);
}

/* An all-reduce of rank + 1 over every trainer, timed into *seconds: it
 * meets at once only if the trainers' op ids are still in step. */
static int all_reduce_in_step(dist_client *c, int rank, int32_t *sum, double *seconds) {
  *sum = rank + 1;
  double t0 = harness_now_s();
  int rc = dist_all_reduce(c, sum, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0);
  *seconds = harness_now_s() - t0;
  return rc;
}

/* dtensor_from_local of this trainer's n floats x, Shard(0) over mesh. */
static int float_pieces(dist_client *c, const char *name, const float *x, int64_t n,
                        const dist_mesh *mesh, dist_tensor **out) {
  dist_placement shard = DIST_SHARD_DIM(0);
  const void *pieces[1] = {x};
  const int64_t *shapes[1] = {&n};
  return dist_dtensor_from_local(c, name, pieces, DIST_FLOAT32, 1, shapes, mesh, &shard, out);
}

static void *layer_main(void *arg) {
  layer_trainer *t = arg;
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0,1]", NULL, &mesh);
  for (int i = 0; i < 3; i++) t->x[i] = (float)(3 * t->rank + i + 1);
  dist_tensor *x = NULL;
  dist_program *twice = pair_program(mesh, 0), *loss_of = pair_program(mesh, 1);
  dist_tape *tape = NULL;
  if (layer_step(t, "x", float_pieces(t->c, t->x_name, t->x, 3, mesh, &x)) == 0 &&
      layer_step(t, "register 2x", dist_program_register(t->c, twice)) == 0 &&
      layer_step(t, "register loss", dist_program_register(t->c, loss_of)) == 0 &&
      (!t->tape || layer_step(t, "tape", dist_tape_new(t->c, &tape)) == 0))
    run_layers(t, x, twice, loss_of, tape);
  dist_tape_free(tape);
  dist_program_unregister(t->c, twice);
  dist_program_unregister(t->c, loss_of);
  dist_program_free(twice);
  dist_program_free(loss_of);
  dist_tensor_free(x);
  dist_mesh_free(mesh);
  layer_step(t, "all_reduce", all_reduce_in_step(t->c, t->rank, &t->sum, &t->reduce_seconds));
  return NULL;
}

/* Runs the layers on the first n of four trainers. */
static void run_layer_trainers(layer_trainer *tr, int n, int tape, const char *job) {
  for (int r = 0; r < n; r++)
    tr[r] = (layer_trainer){.c = harness_spmd_client(&cluster, r, job), .rank = r, .n = n,
                            .tape = tape, .x_name = job};
  run_trainers(n, layer_main, tr, sizeof tr[0]);
  for (int r = 0; r < n; r++) {
    cr_log_info("%s, rank %d: %s", job, r, tr[r].msg);
    dist_close(tr[r].c);
  }
}

/* What members and outsiders must have, against a reference computed
 * here: y = 2x, loss = sum over both members of x * 2x, x's gradient 4x. */
static void expect_layers(const layer_trainer *tr, int tape) {
  float loss_ref = 0;
  for (int i = 1; i <= 6; i++) loss_ref += 2.0f * (float)(i * i);
  for (int r = 0; r < 4; r++) {
    const layer_trainer *t = &tr[r];
    int member = r < 2;
    cr_expect_eq(t->failed, 0, "rank %d: %s", r, t->msg);
    cr_expect(t->y_global == 6 && t->loss_ndim == 0, "rank %d: y [%lld], loss of %lld dims",
              r, (long long)t->y_global, (long long)t->loss_ndim);
    cr_expect_eq(t->y_bytes, member ? 3 * sizeof(float) : 0, "rank %d's y: %zu bytes", r,
                 t->y_bytes);
    cr_expect_eq(t->loss_bytes, member ? sizeof(float) : 0, "rank %d's loss: %zu bytes", r,
                 t->loss_bytes);
    cr_expect_eq(t->grad_bytes, tape && member ? 3 * sizeof(float) : 0,
                 "rank %d's gradient of x: %zu bytes", r, t->grad_bytes);
    for (int i = 0; member && i < 3; i++) {
      cr_expect_eq(t->y[i], 2 * t->x[i], "rank %d: y[%d] = %g", r, i, t->y[i]);
      if (tape) cr_expect_eq(t->grad[i], 4 * t->x[i], "rank %d: grad[%d] = %g", r, i, t->grad[i]);
    }
    if (member) cr_expect_eq(t->loss, loss_ref, "rank %d: loss %g, not %g", r, t->loss, loss_ref);
    cr_expect_eq(t->sum, 10, "rank %d: 1 + 2 + 3 + 4 is %d", r, (int)t->sum);
    cr_expect_lt(t->reduce_seconds, 2.0, "rank %d's all-reduce took %.1f s", r,
                 t->reduce_seconds);
  }
}

/* Nothing of the layers on the outsiders' daemons. */
static void expect_nothing_outside(void) {
  dist_client *c = harness_client(&cluster);
  for (int r = 2; r < 4; r++) {
    dist_daemon_info info;
    cr_assert_eq(dist_info(c, r, &info), 0, "%s", dist_errmsg(c));
    cr_expect_eq(info.tensor_count, 0, "rank %d's daemon holds %u tensors", r,
                 (unsigned)info.tensor_count);
    dist_info_free(&info);
  }
  dist_close(c);
}

/* Before, the outsiders' registration was refused by their daemons
 * (rank 2 is not in the mesh), and a call by them reached their daemon,
 * which refused it and aborted it for the members. */
Test(outside, a_local_layer_call_outside_its_mesh_is_a_no_op_success, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 4, NULL);
  layer_trainer tr[4];
  run_layer_trainers(tr, 4, 0, "outside-layer");
  expect_layers(tr, 0);
  expect_nothing_outside();
}

/* The same on a tape, with backward: the outsiders' LocalLayer entries,
 * their backward and the add of x's two gradients are no-ops that take
 * the plan's ids; the members' gradients are those of a run without the
 * outsiders. */
Test(outside, a_tapes_local_layers_and_gradient_adds_are_no_ops_outside_the_mesh,
     .timeout = 120, .fini = stop_cluster) {
  harness_start(&cluster, 4, NULL);
  layer_trainer ref[4] = {0}, tr[4];
  run_layer_trainers(ref, 2, 1, "outside-tape-ref");
  run_layer_trainers(tr, 4, 1, "outside-tape-layer");
  expect_layers(tr, 1);
  for (int r = 0; r < 2; r++)
    cr_expect_eq(memcmp(tr[r].grad, ref[r].grad, sizeof tr[r].grad), 0,
                 "rank %d's gradient differs from the run without outsiders", r);
  expect_nothing_outside();
}

/* An outsider's call is a no-op, but its arguments are still checked. */
Test(outside, an_outsiders_local_layer_arguments_are_checked_as_a_members, .timeout = 60,
     .fini = stop_cluster) {
  harness_start(&cluster, 2, NULL);
  dist_client *c = harness_spmd_client(&cluster, 1, "outside-layer-args");
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0]", NULL, &mesh);
  dist_program *p = pair_program(mesh, 0);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  dist_invocation *inv = NULL;
  dist_tensor *out[1] = {NULL};
  int rc = dist_local_layer_call(c, p, NULL, 1, NULL, &inv, out);
  cr_expect_eq(rc, DIST_EINVAL, "NULL args: rc %d: %s", rc, dist_errmsg(c));
  cr_expect(strstr(dist_errmsg(c), "args"), "message: %s", dist_errmsg(c));
  dist_arg none[1] = {{NULL, NULL}};
  rc = dist_local_layer_call(c, p, none, 1, NULL, &inv, out);
  cr_expect_eq(rc, DIST_EINVAL, "an empty argument: rc %d: %s", rc, dist_errmsg(c));
  cr_expect(inv == NULL && out[0] == NULL, "a refused call gave results");
  dist_program *unpaired = NULL; /* an output without its out_dist_attr */
  dist_program_new("unpaired", &unpaired);
  dist_program_output(unpaired, dist_input_dtensor(unpaired, "x", DIST_FLOAT32));
  rc = dist_program_register(c, unpaired);
  cr_expect_eq(rc, DIST_EMISMATCH, "no out_dist_attrs: rc %d: %s", rc, dist_errmsg(c));
  dist_program_free(unpaired);
  dist_program_free(p);
  dist_mesh_free(mesh);
  dist_close(c);
}

/* ------------------------- a LocalLayer whose outputs lie on two meshes */

/* One of four trainers calling a pipeline's LocalLayer: x is 2 values a
 * rank on mesh [0,1,2,3] (Shard(0)); out0 = 2x goes onto [0,1], out1 =
 * x + 10 onto [2,3] (both Shard(0)). Each trainer is in one output's mesh
 * and not the other's. Backward from (out0, out1) gives x's gradient:
 * 2 * out0 = 4x on [0,1], out1 = x + 10 on [2,3]. */
typedef struct split_trainer {
  dist_client *c;
  int rank;
  int failed;
  float x[2];
  int64_t global[2]; /* each output's global shape */
  int first_rank[2]; /* of each output handle's mesh */
  size_t piece_bytes[2], full_bytes[2], grad_bytes;
  float piece[2][2], full[2][4], grad[2];
  int32_t sum;
  double reduce_seconds;
  char msg[1500];
} split_trainer;

static int split_step(split_trainer *t, const char *what, int rc) { return STEP(t, what, rc); }

/* out0 = 2x on stage0, out1 = x + 10 on stage1 (both Shard(0)); x a
 * tensor's local piece, or with x_is_value a per-rank value. */
static dist_program *split_program_of(const dist_mesh *stage0, const dist_mesh *stage1,
                                      int x_is_value) {
  dist_program *p = NULL;
  dist_program_new("split", &p);
  int x = x_is_value ? dist_input_value(p, "x", DIST_FLOAT32)
                     : dist_input_dtensor(p, "x", DIST_FLOAT32);
  dist_placement shard = DIST_SHARD_DIM(0);
  dist_program_output(p, dist_op_mul_scalar(p, x, 2));
  dist_program_output(p, dist_op_add_scalar(p, x, 10));
  dist_program_out_dist_attr(p, stage0, &shard, NULL);
  dist_program_out_dist_attr(p, stage1, &shard, NULL);
  return p;
}

/* out0 = 2x on [0,1], out1 = x + 10 on [2,3]. */
static dist_program *split_program(const dist_mesh *stage0, const dist_mesh *stage1) {
  return split_program_of(stage0, stage1, 0);
}

/* t's piece and the whole of output k, into t (0 bytes where none). */
static void read_output(split_trainer *t, int k, const dist_tensor *out) {
  void *data = NULL;
  t->global[k] = dist_tensor_shape(out)[0];
  t->first_rank[k] = dist_mesh_rank_at(dist_tensor_mesh(out), 0);
  if (split_step(t, "to_local", dist_dtensor_to_local(t->c, out, -1, &data, &t->piece_bytes[k],
                                                      NULL)) == 0 &&
      t->piece_bytes[k] <= sizeof t->piece[k])
    memcpy(t->piece[k], data, t->piece_bytes[k]);
  free(data);
  data = NULL;
  if (split_step(t, "full", dist_full_tensor(t->c, out, &data, &t->full_bytes[k])) == 0 &&
      t->full_bytes[k] <= sizeof t->full[k])
    memcpy(t->full[k], data, t->full_bytes[k]);
  free(data);
}

/* Backward from the outputs themselves; x's gradient piece into t. */
static void split_backward(split_trainer *t, dist_invocation *inv, dist_tensor **outs) {
  dist_arg og[2] = {{outs[0], NULL}, {outs[1], NULL}};
  dist_tensor *grads[1] = {NULL};
  void *data = NULL;
  if (split_step(t, "backward", dist_backward(t->c, inv, og, NULL, grads)) == 0 && grads[0] &&
      split_step(t, "x's gradient", dist_dtensor_to_local(t->c, grads[0], -1, &data,
                                                          &t->grad_bytes, NULL)) == 0 &&
      t->grad_bytes <= sizeof t->grad)
    memcpy(t->grad, data, t->grad_bytes);
  free(data);
  dist_tensor_free(grads[0]);
}

static void split_call(split_trainer *t, dist_program *p, dist_tensor *x) {
  dist_tensor *outs[2] = {NULL, NULL};
  dist_invocation *inv = NULL;
  dist_arg args[1] = {{x, NULL}};
  if (split_step(t, "call", dist_local_layer_call(t->c, p, args, 1, NULL, &inv, outs)) == 0) {
    for (int k = 0; k < 2; k++) read_output(t, k, outs[k]);
    split_backward(t, inv, outs);
  }
  dist_invocation_free(inv);
  for (int k = 0; k < 2; k++) dist_tensor_free(outs[k]);
}

static void *split_main(void *arg) {
  split_trainer *t = arg;
  dist_mesh *all = NULL, *stage0 = NULL, *stage1 = NULL;
  dist_mesh_from_string("[0,1,2,3]", NULL, &all);
  dist_mesh_from_string("[0,1]", NULL, &stage0);
  dist_mesh_from_string("[2,3]", NULL, &stage1);
  for (int i = 0; i < 2; i++) t->x[i] = (float)(2 * t->rank + i + 1);
  dist_tensor *x = NULL;
  dist_program *p = split_program(stage0, stage1);
  if (split_step(t, "x", float_pieces(t->c, "split.x", t->x, 2, all, &x)) == 0 &&
      split_step(t, "register", dist_program_register(t->c, p)) == 0)
    split_call(t, p, x);
  dist_program_unregister(t->c, p);
  dist_program_free(p);
  dist_tensor_free(x);
  dist_mesh_free(all);
  dist_mesh_free(stage0);
  dist_mesh_free(stage1);
  split_step(t, "all_reduce", all_reduce_in_step(t->c, t->rank, &t->sum, &t->reduce_seconds));
  return NULL;
}

/* Each output of trainer r against the reference: a piece where r is in
 * its mesh, an outsider's handle (the members' global shape, no piece)
 * where it is not. */
static void expect_split_outputs(const split_trainer *t, int r) {
  for (int k = 0; k < 2; k++) {
    int member = (r < 2) == (k == 0);
    float full_ref[4];
    for (int i = 0; i < 4; i++) {
      float x = (float)(k == 0 ? i + 1 : i + 5); /* stage k's ranks' x */
      full_ref[i] = k == 0 ? 2 * x : x + 10;
    }
    cr_expect_eq(t->global[k], 4, "rank %d's out%d is [%lld]", r, k, (long long)t->global[k]);
    cr_expect_eq(t->first_rank[k], 2 * k, "rank %d's out%d: mesh from rank %d", r, k,
                 t->first_rank[k]);
    cr_expect_eq(t->piece_bytes[k], member ? sizeof t->piece[k] : 0, "rank %d's out%d: %zu "
                 "bytes", r, k, t->piece_bytes[k]);
    cr_expect_eq(t->full_bytes[k], member ? sizeof full_ref : 0, "rank %d's whole out%d: %zu "
                 "bytes", r, k, t->full_bytes[k]);
    for (int i = 0; member && i < 2; i++)
      cr_expect_eq(t->piece[k][i], k == 0 ? 2 * t->x[i] : t->x[i] + 10, "rank %d: out%d[%d] "
                   "= %g", r, k, i, t->piece[k][i]);
    if (member)
      cr_expect_eq(memcmp(t->full[k], full_ref, sizeof full_ref), 0, "rank %d's whole out%d",
                   r, k);
  }
}

/* Before, every trainer's daemon refused the registration
 * ("out_dist_attrs[1]: rank 0 is not in the mesh"): a rank in one of the
 * outputs' meshes but not the other's could not call the layer. */
Test(outside, a_local_layer_with_outputs_on_two_meshes_runs_on_every_trainer, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 4, NULL);
  split_trainer tr[4];
  for (int r = 0; r < 4; r++)
    tr[r] = (split_trainer){.c = harness_spmd_client(&cluster, r, "split-layer"), .rank = r};
  run_trainers(4, split_main, tr, sizeof tr[0]);
  for (int r = 0; r < 4; r++) {
    const split_trainer *t = &tr[r];
    cr_log_info("rank %d: %s", r, t->msg);
    cr_expect_eq(t->failed, 0, "rank %d: %s", r, t->msg);
    expect_split_outputs(t, r);
    cr_expect_eq(t->grad_bytes, sizeof t->grad, "rank %d's gradient: %zu bytes", r,
                 t->grad_bytes);
    for (int i = 0; i < 2; i++)
      cr_expect_eq(t->grad[i], r < 2 ? 4 * t->x[i] : t->x[i] + 10, "rank %d: grad[%d] = %g",
                   r, i, t->grad[i]);
    cr_expect_eq(t->sum, 10, "rank %d: 1 + 2 + 3 + 4 is %d", r, (int)t->sum);
    cr_expect_lt(t->reduce_seconds, 2.0, "rank %d's all-reduce took %.1f s", r,
                 t->reduce_seconds);
    dist_close(t->c);
  }
}

/* -------------------------------- an input no output depends on: gradients */

/* One of four trainers calling y = 2x on [0,1] with a second input u that
 * y does not depend on, then backward from y: which inputs get a gradient
 * handle, and the members' pieces of u's. */
typedef struct unused_trainer {
  dist_client *c;
  int rank;
  int failed;
  int has_grad[2];
  size_t u_grad_bytes;
  float x[3], u_grad[3];
  char msg[1000];
} unused_trainer;

static int unused_step(unused_trainer *t, const char *what, int rc) {
  return STEP(t, what, rc);
}

/* y = 2x of inputs (x, u), on mesh. */
static dist_program *unused_input_program(const dist_mesh *mesh) {
  dist_program *p = NULL;
  dist_program_new("unused", &p);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  dist_input_dtensor(p, "u", DIST_FLOAT32);
  dist_placement shard = DIST_SHARD_DIM(0);
  dist_program_output(p, dist_op_mul_scalar(p, x, 2));
  dist_program_out_dist_attr(p, mesh, &shard, NULL);
  return p;
}

static void unused_backward(unused_trainer *t, dist_program *p, dist_tensor *x, dist_tensor *u) {
  dist_arg args[2] = {{x, NULL}, {u, NULL}};
  dist_tensor *y = NULL, *grads[2] = {NULL, NULL};
  dist_invocation *inv = NULL;
  void *data = NULL;
  if (unused_step(t, "call", dist_local_layer_call(t->c, p, args, 2, NULL, &inv, &y)) == 0) {
    dist_arg og[1] = {{y, NULL}};
    unused_step(t, "backward", dist_backward(t->c, inv, og, NULL, grads));
  }
  for (int j = 0; j < 2; j++) t->has_grad[j] = grads[j] != NULL;
  if (grads[1] && unused_step(t, "u's gradient", dist_dtensor_to_local(
                                  t->c, grads[1], -1, &data, &t->u_grad_bytes, NULL)) == 0 &&
      t->u_grad_bytes <= sizeof t->u_grad)
    memcpy(t->u_grad, data, t->u_grad_bytes);
  free(data);
  for (int j = 0; j < 2; j++) dist_tensor_free(grads[j]);
  dist_tensor_free(y);
  dist_invocation_free(inv);
}

static void *unused_main(void *arg) {
  unused_trainer *t = arg;
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0,1]", NULL, &mesh);
  for (int i = 0; i < 3; i++) t->x[i] = (float)(3 * t->rank + i + 1);
  dist_tensor *x = NULL, *u = NULL;
  dist_program *p = unused_input_program(mesh);
  if (unused_step(t, "x", float_pieces(t->c, "unused.x", t->x, 3, mesh, &x)) == 0 &&
      unused_step(t, "u", float_pieces(t->c, "unused.u", t->x, 3, mesh, &u)) == 0 &&
      unused_step(t, "register", dist_program_register(t->c, p)) == 0)
    unused_backward(t, p, x, u);
  dist_program_unregister(t->c, p);
  dist_program_free(p);
  dist_tensor_free(x);
  dist_tensor_free(u);
  dist_mesh_free(mesh);
  return NULL;
}

/* The members' daemons give u, which y does not depend on, a gradient of
 * zeros (daemon/program/backward.c: the rule is the input's kind, dtype
 * and no_grad, distd_input_wants_grad); the outsiders, by the same rule,
 * a handle of it: both have the same gradients. */
Test(outside, an_input_no_output_depends_on_has_a_gradient_inside_and_outside_the_mesh,
     .timeout = 120, .fini = stop_cluster) {
  harness_start(&cluster, 4, NULL);
  unused_trainer tr[4];
  for (int r = 0; r < 4; r++)
    tr[r] = (unused_trainer){.c = harness_spmd_client(&cluster, r, "unused-input"), .rank = r};
  run_trainers(4, unused_main, tr, sizeof tr[0]);
  static const float zeros[3] = {0, 0, 0};
  for (int r = 0; r < 4; r++) {
    const unused_trainer *t = &tr[r];
    cr_log_info("rank %d: %s", r, t->msg);
    cr_expect_eq(t->failed, 0, "rank %d: %s", r, t->msg);
    cr_expect(t->has_grad[0] && t->has_grad[1], "rank %d: gradients of x %d, of u %d", r,
              t->has_grad[0], t->has_grad[1]);
    cr_expect_eq(t->u_grad_bytes, r < 2 ? sizeof zeros : 0, "rank %d's u gradient: %zu bytes",
                 r, t->u_grad_bytes);
    if (r < 2) cr_expect_eq(memcmp(t->u_grad, zeros, sizeof zeros), 0, "rank %d's u gradient", r);
    dist_close(t->c);
  }
}

/* ------------------- the same LocalLayer, called by one client of all four */

/* A single (non-SPMD) client reaches every daemon: its call makes out0 on
 * [0,1] and out1 on [2,3] at once, each handle described by a daemon that
 * holds it; a daemon outside an output's mesh stores nothing under its
 * name, and backward sends each output's gradient only to its members. */
Test(outside, one_client_calls_a_local_layer_with_outputs_on_two_meshes, .timeout = 120,
     .fini = stop_cluster) {
  dist_client *c = harness_start_with_client(&cluster, 4, NULL);
  dist_mesh *stage0 = NULL, *stage1 = NULL;
  dist_mesh_from_string("[0,1]", NULL, &stage0);
  dist_mesh_from_string("[2,3]", NULL, &stage1);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t eight[1] = {8};
  dist_tensor *xt = harness_put(c, "one.x", DIST_FLOAT32, x, 1, eight, "[0,1,2,3]", "Shard(0)");
  dist_program *p = split_program(stage0, stage1);
  cr_assert_eq(dist_program_register(c, p), 0, "register: %s", dist_errmsg(c));
  dist_tensor *outs[2] = {NULL, NULL};
  dist_invocation *inv = NULL;
  dist_arg args[1] = {{xt, NULL}};
  const char *names[2] = {"one.out0", "one.out1"};
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.out_names = names;
  cr_assert_eq(dist_local_layer_call(c, p, args, 1, &o, &inv, outs), 0, "call: %s",
               dist_errmsg(c));
  for (int k = 0; k < 2; k++) {
    cr_expect_eq(dist_tensor_shape(outs[k])[0], 4, "out%d is [%lld]", k,
                 (long long)dist_tensor_shape(outs[k])[0]);
    cr_expect_eq(dist_mesh_rank_at(dist_tensor_mesh(outs[k]), 0), 2 * k, "out%d's mesh", k);
  }
  float want0[4] = {2, 4, 6, 8}, want1[4] = {15, 16, 17, 18};
  harness_expect_value(c, "one.out0", want0, sizeof want0);
  harness_expect_value(c, "one.out1", want1, sizeof want1);
  for (int r = 0; r < 4; r++) { /* each output on its own mesh only */
    for (int k = 0; k < 2; k++) {
      dist_tensor *t = NULL;
      int rc = harness_open_on(&cluster, r, names[k], &t);
      cr_expect_eq(rc == 0, (r < 2) == (k == 0), "rank %d %s %s", r,
                   rc == 0 ? "holds" : "does not hold", names[k]);
      dist_tensor_free(t);
    }
  }
  dist_arg og[2] = {{outs[0], NULL}, {outs[1], NULL}};
  dist_tensor *grads[1] = {NULL};
  cr_assert_eq(dist_backward(c, inv, og, NULL, grads), 0, "backward: %s", dist_errmsg(c));
  cr_assert(grads[0], "no gradient of x");
  void *data = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_full_tensor(c, grads[0], &data, &nbytes), 0, "%s", dist_errmsg(c));
  float want_grad[8] = {4, 8, 12, 16, 15, 16, 17, 18}; /* 4x on [0,1], x + 10 on [2,3] */
  cr_assert_eq(nbytes, sizeof want_grad);
  for (int i = 0; i < 8; i++)
    cr_expect_eq(((float *)data)[i], want_grad[i], "grad[%d] = %g", i, ((float *)data)[i]);
  free(data);
  dist_tensor_free(grads[0]);
  dist_invocation_free(inv);
  for (int k = 0; k < 2; k++) dist_tensor_free(outs[k]);
  dist_program_unregister(c, p);
  dist_program_free(p);
  dist_tensor_free(xt);
  dist_mesh_free(stage0);
  dist_mesh_free(stage1);
  dist_close(c);
}

/* --------------------- a tape through a LocalLayer with outputs on two meshes */

/* The split program, a loss on each stage, loss_k = sum(out_k * out_k)
 * on out_k's mesh, and total = sum(x * x) on x's mesh [0,1,2,3]. */
typedef struct split_programs {
  dist_mesh *all, *stage[2];
  dist_program *split, *loss[2], *total;
} split_programs;

static void split_programs_new(split_programs *s) {
  dist_mesh_from_string("[0,1,2,3]", NULL, &s->all);
  dist_mesh_from_string("[0,1]", NULL, &s->stage[0]);
  dist_mesh_from_string("[2,3]", NULL, &s->stage[1]);
  s->split = split_program(s->stage[0], s->stage[1]);
  s->loss[0] = dot_program("split.loss0", s->stage[0]);
  s->loss[1] = dot_program("split.loss1", s->stage[1]);
  s->total = dot_program("split.total", s->all);
}

/* Registers the four programs; 0, or the first failure (*what names it). */
static int split_programs_register(dist_client *c, split_programs *s, const char **what) {
  dist_program *p[4] = {s->split, s->loss[0], s->loss[1], s->total};
  for (int i = 0; i < 4; i++) {
    int rc = dist_program_register(c, p[i]);
    if (rc) {
      *what = "register";
      return rc;
    }
  }
  return 0;
}

static void split_programs_free(dist_client *c, split_programs *s) {
  dist_program *p[4] = {s->split, s->loss[0], s->loss[1], s->total};
  for (int i = 0; i < 4; i++) dist_program_unregister(c, p[i]), dist_program_free(p[i]);
  dist_mesh_free(s->all);
  for (int k = 0; k < 2; k++) dist_mesh_free(s->stage[k]);
}

/* On the tape: (out0, out1) = split(x), loss_k = sum(out_k * out_k),
 * total = sum(x * x), then backward from the three losses with the loss's
 * 1 (x's gradients from split and total added on [0,1,2,3]). losses
 * (room for 3) get their handles (the caller frees them); 0, or the first failure (*what
 * names it). */
static int split_tape(dist_tape *tape, const split_programs *s, dist_tensor *x,
                      dist_tensor **losses, const char **what) {
  dist_tensor *outs[2] = {NULL, NULL};
  dist_arg a[1] = {{x, NULL}}, xx[2] = {{x, NULL}, {x, NULL}};
  *what = "split";
  int rc = dist_tape_local_layer_call(tape, s->split, a, 1, NULL, outs);
  for (int k = 0; rc == 0 && k < 2; k++) {
    dist_arg sq[2] = {{outs[k], NULL}, {outs[k], NULL}};
    *what = k ? "loss1" : "loss0";
    rc = dist_tape_local_layer_call(tape, s->loss[k], sq, 2, NULL, &losses[k]);
  }
  if (rc == 0) {
    *what = "total";
    rc = dist_tape_local_layer_call(tape, s->total, xx, 2, NULL, &losses[2]);
  }
  const dist_tensor *from[3] = {losses[0], losses[1], losses[2]};
  if (rc == 0) {
    *what = "backward";
    rc = dist_tape_backward(tape, from, NULL, 3);
  }
  for (int k = 0; k < 2; k++) dist_tensor_free(outs[k]);
  return rc;
}

/* The reference, in double: loss_k and total of x[0..8) (out0 = 2x of
 * the first four, out1 = x + 10 of the last four), and x's gradient,
 * 2 out_k d(out_k)/dx + 2x: 10x on [0,1], 4x + 20 on [2,3]. */
static void split_tape_reference(const float *x, double *loss, double *grad) {
  loss[0] = loss[1] = loss[2] = 0;
  for (int i = 0; i < 8; i++) {
    int k = i >= 4;
    double out = k ? x[i] + 10.0 : 2.0 * x[i], dout_dx = k ? 1 : 2;
    loss[k] += out * out;
    loss[2] += (double)x[i] * x[i];
    grad[i] = 2 * out * dout_dx + 2.0 * x[i];
  }
}

/* One of four trainers running split_tape: x is 2 values a rank, Shard(0)
 * on [0,1,2,3]; each trainer is in one stage loss's mesh and not the
 * other's, and in total's. */
typedef struct tape_split_trainer {
  dist_client *c;
  int rank;
  int failed;
  float x[2];
  size_t loss_bytes[3], grad_bytes;
  float loss[3], grad[2];
  int32_t sum;
  double reduce_seconds;
  char msg[1500];
} tape_split_trainer;

/* Each loss's whole value and x's gradient piece, into t. */
static void read_tape_split(tape_split_trainer *t, dist_tape *tape, dist_tensor **losses) {
  for (int k = 0; k < 3; k++) {
    void *data = NULL;
    if (STEP(t, "full loss", dist_full_tensor(t->c, losses[k], &data, &t->loss_bytes[k])) == 0 &&
        t->loss_bytes[k] == sizeof t->loss[k])
      memcpy(&t->loss[k], data, sizeof t->loss[k]);
    free(data);
  }
  void *data = NULL;
  if (STEP(t, "x's gradient", dist_tape_grad_local(tape, "tsplit.x", -1, &data, &t->grad_bytes,
                                                   NULL)) == 0 &&
      t->grad_bytes <= sizeof t->grad)
    memcpy(t->grad, data, t->grad_bytes);
  free(data);
}

static void *tape_split_main(void *arg) {
  tape_split_trainer *t = arg;
  split_programs s;
  split_programs_new(&s);
  for (int i = 0; i < 2; i++) t->x[i] = (float)(2 * t->rank + i + 1);
  dist_tensor *x = NULL, *losses[3] = {NULL, NULL, NULL};
  dist_tape *tape = NULL;
  const char *what = "x";
  int rc = float_pieces(t->c, "tsplit.x", t->x, 2, s.all, &x);
  if (rc == 0) rc = split_programs_register(t->c, &s, &what);
  if (rc == 0) {
    what = "tape";
    rc = dist_tape_new(t->c, &tape);
  }
  if (rc == 0) rc = split_tape(tape, &s, x, losses, &what);
  if (STEP(t, what, rc) == 0) read_tape_split(t, tape, losses);
  for (int k = 0; k < 3; k++) dist_tensor_free(losses[k]);
  dist_tape_free(tape);
  split_programs_free(t->c, &s);
  dist_tensor_free(x);
  STEP(t, "all_reduce", all_reduce_in_step(t->c, t->rank, &t->sum, &t->reduce_seconds));
  return NULL;
}

/* Every trainer records the split call and the three losses and
 * backpropagates from them: out_k's gradient reaches the split call's
 * backward from the members of its mesh, and each trainer gets its piece
 * of x's gradient, the split's and total's added; a later all-reduce
 * meets at once, so every trainer took the same ids. */
Test(outside, a_tape_through_a_local_layer_with_outputs_on_two_meshes, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 4, NULL);
  tape_split_trainer tr[4];
  for (int r = 0; r < 4; r++)
    tr[r] = (tape_split_trainer){.c = harness_spmd_client(&cluster, r, "tape-split"), .rank = r};
  run_trainers(4, tape_split_main, tr, sizeof tr[0]);
  float all_x[8];
  double loss_ref[3], grad_ref[8];
  for (int r = 0; r < 4; r++) memcpy(all_x + 2 * r, tr[r].x, sizeof tr[r].x);
  split_tape_reference(all_x, loss_ref, grad_ref);
  for (int r = 0; r < 4; r++) {
    const tape_split_trainer *t = &tr[r];
    cr_log_info("rank %d: %s", r, t->msg);
    cr_expect_eq(t->failed, 0, "rank %d: %s", r, t->msg);
    for (int k = 0; k < 3; k++) {
      int member = k == 2 || (r < 2) == (k == 0);
      cr_expect_eq(t->loss_bytes[k], member ? sizeof(float) : 0, "rank %d's loss%d: %zu bytes",
                   r, k, t->loss_bytes[k]);
      if (member)
        cr_expect_eq(t->loss[k], (float)loss_ref[k], "rank %d: loss%d %g, not %g", r, k,
                     t->loss[k], loss_ref[k]);
    }
    cr_expect_eq(t->grad_bytes, sizeof t->grad, "rank %d's gradient: %zu bytes", r,
                 t->grad_bytes);
    for (int i = 0; i < 2; i++)
      cr_expect_eq(t->grad[i], (float)grad_ref[2 * r + i], "rank %d: grad[%d] = %g, not %g", r,
                   i, t->grad[i], grad_ref[2 * r + i]);
    cr_expect_eq(t->sum, 10, "rank %d: 1 + 2 + 3 + 4 is %d", r, (int)t->sum);
    cr_expect_lt(t->reduce_seconds, 2.0, "rank %d's all-reduce took %.1f s", r,
                 t->reduce_seconds);
    dist_close(t->c);
  }
}

/* The same tape recorded by one client of all four daemons. */
Test(outside, one_clients_tape_through_a_local_layer_with_outputs_on_two_meshes,
     .timeout = 120, .fini = stop_cluster) {
  dist_client *c = harness_start_with_client(&cluster, 4, NULL);
  split_programs s;
  split_programs_new(&s);
  const float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t eight[1] = {8};
  dist_tensor *xt = harness_put(c, "tsplit.x", DIST_FLOAT32, x, 1, eight, "[0,1,2,3]",
                                "Shard(0)");
  const char *what = "";
  cr_assert_eq(split_programs_register(c, &s, &what), 0, "%s: %s", what, dist_errmsg(c));
  dist_tape *tape = NULL;
  dist_tensor *losses[3] = {NULL, NULL, NULL};
  cr_assert_eq(dist_tape_new(c, &tape), 0, "%s", dist_errmsg(c));
  cr_assert_eq(split_tape(tape, &s, xt, losses, &what), 0, "%s: %s", what, dist_errmsg(c));
  double loss_ref[3], grad_ref[8];
  split_tape_reference(x, loss_ref, grad_ref);
  for (int k = 0; k < 3; k++) {
    float want = (float)loss_ref[k];
    harness_expect_value(c, dist_tensor_name(losses[k]), &want, sizeof want);
  }
  dist_tensor *g = NULL;
  cr_assert_eq(dist_tape_grad(tape, "tsplit.x", &g), 0, "%s", dist_errmsg(c));
  void *data = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_full_tensor(c, g, &data, &nbytes), 0, "%s", dist_errmsg(c));
  cr_assert_eq(nbytes, sizeof x, "x's gradient: %zu bytes", nbytes);
  for (int i = 0; i < 8; i++)
    cr_expect_eq(((float *)data)[i], (float)grad_ref[i], "grad[%d] = %g, not %g", i,
                 ((float *)data)[i], grad_ref[i]);
  free(data);
  dist_tensor_free(g);
  for (int k = 0; k < 3; k++) dist_tensor_free(losses[k]);
  dist_tape_free(tape);
  split_programs_free(c, &s);
  dist_tensor_free(xt);
  dist_close(c);
}

/* ------------------------- a failure on one of the outputs' meshes */

typedef struct failing_trainer {
  dist_client *c;
  int rank;
  int uneven; /* x a value, of one element on rank 2 and two elsewhere */
  int call_rc;
  int failed;
  char msg[1500];
} failing_trainer;

static void *failing_main(void *arg) {
  failing_trainer *t = arg;
  dist_mesh *all = NULL, *stage0 = NULL, *stage1 = NULL;
  dist_mesh_from_string("[0,1,2,3]", NULL, &all);
  dist_mesh_from_string("[0,1]", NULL, &stage0);
  dist_mesh_from_string("[2,3]", NULL, &stage1);
  float x[2] = {(float)t->rank, 1};
  dist_tensor *xt = NULL, *outs[2] = {NULL, NULL};
  dist_invocation *inv = NULL;
  dist_program *p = split_program_of(stage0, stage1, t->uneven);
  const char *names[2] = {"fail.out0", "fail.out1"};
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.out_names = names;
  dist_value v = {x, DIST_FLOAT32, 1, {t->rank == 2 ? 1 : 2}};
  if ((t->uneven || STEP(t, "x", float_pieces(t->c, "fail.x", x, 2, all, &xt)) == 0) &&
      STEP(t, "register", dist_program_register(t->c, p)) == 0) {
    dist_arg args[1] = {{xt, t->uneven ? &v : NULL}};
    t->call_rc = dist_local_layer_call(t->c, p, args, 1, &o, &inv, outs);
    snprintf(t->msg, sizeof t->msg, "%s", t->call_rc ? dist_errmsg(t->c) : "");
  }
  dist_invocation_free(inv);
  for (int k = 0; k < 2; k++) dist_tensor_free(outs[k]);
  dist_program_unregister(t->c, p);
  dist_program_free(p);
  dist_tensor_free(xt);
  dist_mesh_free(all);
  dist_mesh_free(stage0);
  dist_mesh_free(stage1);
  return NULL;
}

/* out1's name is taken on rank 3 alone (a tensor of its own there): rank
 * 3's daemon refuses to store it, which no other trainer can foresee.
 * Every trainer's call fails naming rank 3, out0 is stored on neither
 * rank of [0,1], and rank 3's own tensor is left as it was. */
Test(outside, a_failure_on_one_output_mesh_fails_the_call_on_every_trainer, .timeout = 120,
     .fini = stop_cluster) {
  dist_client *c = harness_start_with_client(&cluster, 4, NULL);
  float mine[1] = {42};
  int64_t one[1] = {1};
  dist_tensor_free(harness_put(c, "fail.out1", DIST_FLOAT32, mine, 1, one, "[3]",
                               "Replicate()"));
  failing_trainer tr[4];
  for (int r = 0; r < 4; r++)
    tr[r] = (failing_trainer){.c = harness_spmd_client(&cluster, r, "fail-layer"), .rank = r};
  run_trainers(4, failing_main, tr, sizeof tr[0]);
  for (int r = 0; r < 4; r++) {
    cr_log_info("rank %d: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].failed, 0, "rank %d: %s", r, tr[r].msg);
    cr_expect_neq(tr[r].call_rc, 0, "rank %d's call succeeded", r);
    cr_expect(strstr(tr[r].msg, "rank 3"), "rank %d's error does not name rank 3: %s", r,
              tr[r].msg);
    dist_close(tr[r].c);
  }
  for (int r = 0; r < 2; r++) {
    dist_tensor *t = NULL;
    cr_expect_neq(harness_open_on(&cluster, r, "fail.out0", &t), 0, "rank %d stored out0", r);
    dist_tensor_free(t);
  }
  harness_expect_value(c, "fail.out1", mine, sizeof mine);
  dist_close(c);
}

/* x a per-rank value of one element on rank 2 and two on rank 3: out1 =
 * x + 10, Shard(0) on [2,3], has pieces [1] and [2], which the split rule
 * refuses in its members' shape exchange (the outsiders, who cannot see
 * those values, foresee nothing). Every trainer's call fails naming rank 2
 * or 3, and out0 is stored on neither rank of [0,1]. */
Test(outside, a_shape_mismatch_on_one_output_mesh_fails_the_call_on_every_trainer,
     .timeout = 120, .fini = stop_cluster) {
  harness_start(&cluster, 4, NULL);
  failing_trainer tr[4];
  for (int r = 0; r < 4; r++)
    tr[r] = (failing_trainer){.c = harness_spmd_client(&cluster, r, "uneven-layer"), .rank = r,
                              .uneven = 1};
  double t0 = harness_now_s();
  run_trainers(4, failing_main, tr, sizeof tr[0]);
  double took = harness_now_s() - t0;
  for (int r = 0; r < 4; r++) {
    cr_log_info("rank %d: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].failed, 0, "rank %d: %s", r, tr[r].msg);
    cr_expect_neq(tr[r].call_rc, 0, "rank %d's call succeeded", r);
    cr_expect(strstr(tr[r].msg, "rank 2") || strstr(tr[r].msg, "rank 3"),
              "rank %d's error names neither rank 2 nor 3: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  cr_expect_lt(took, 10.0, "the failed call took %.1f s", took);
  for (int r = 0; r < 2; r++) {
    dist_tensor *t = NULL;
    cr_expect_neq(harness_open_on(&cluster, r, "fail.out0", &t), 0, "rank %d stored out0", r);
    dist_tensor_free(t);
  }
}
