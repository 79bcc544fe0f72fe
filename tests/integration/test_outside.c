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

static harness cluster;

static void stop_cluster(void) { harness_stop(&cluster); }

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

/* The outsider: every call succeeds with nothing (an expert layer's
 * creation excepted: a layer is for the ranks of its group), and no
 * daemon holds anything for it. */
static void expect_outsider(const outside_trainer *t) {
  const char *m = t->msg;
  cr_expect(t->put_rc == 0 && t->local_rc == 0 && t->scatter_rc == 0 && t->count_rc == 0 &&
                t->pair_rc == 0 && t->reshard_rc == 0 && t->full_rc == 0,
            "rank 2: %s", m);
  cr_expect(t->local_bytes == 0 && t->local_shape[0] == 0,
            "rank 2's piece: %zu bytes, shape [%lld]", t->local_bytes,
            (long long)t->local_shape[0]);
  cr_expect_eq(t->rows[0], 0, "rank 2 scattered into %lld rows", (long long)t->rows[0]);
  cr_expect(t->global[0] == 0 && t->global[1] == 0, "rank 2's counts: %lld %lld",
            (long long)t->global[0], (long long)t->global[1]);
  cr_expect_eq(t->layer_rc, DIST_EINVAL, "rank 2: %s", m);
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
  pthread_t th[3];
  for (int r = 0; r < 3; r++) {
    tr[r] = (outside_trainer){.c = harness_spmd_client(&cluster, r, "outside"), .rank = r};
    pthread_create(&th[r], NULL, outside_main, &tr[r]);
  }
  for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
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
  harness_start(&cluster, 3, NULL);
  dist_client *c = harness_client(&cluster);
  static const float w0[4] = {1, 2, 3, 4}, g0[4] = {1, 1, 1, 1};
  int64_t n4 = 4;
  dist_tensor *w = harness_put(c, "w", DIST_FLOAT32, w0, 1, &n4, "[0,1]", "Replicate()");
  dist_tensor_free(harness_put(c, "g", DIST_FLOAT32, g0, 1, &n4, "[0,1]", "Replicate()"));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  cr_assert_eq(dist_param_configure(c, "w", &o), 0, "%s", dist_errmsg(c));
  mesh_user tr[3];
  pthread_t th[3];
  for (int r = 0; r < 3; r++) {
    tr[r] = (mesh_user){.c = harness_spmd_client(&cluster, r, "outside-mesh"), .w = w, .rank = r};
    pthread_create(&th[r], NULL, mesh_user_main, &tr[r]);
  }
  for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
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
  pthread_t th[4];
  for (int r = 0; r < 4; r++) {
    tr[r] = (stage_trainer){.c = harness_spmd_client(&cluster, r, "pipeline"), .rank = r};
    pthread_create(&th[r], NULL, stage_main, &tr[r]);
  }
  for (int r = 0; r < 4; r++) pthread_join(th[r], NULL);
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
