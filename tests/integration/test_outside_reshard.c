/* A tensor made by dtensor_from_local on [0, 1] of three daemons, split
 * unevenly (3 and 2 rows), with SPMD trainer 2 outside its mesh (threads,
 * each with its own client, every trainer running every call): trainer 2
 * gives an empty piece, from which Paddle's rule cannot tell the global
 * shape, and its handle guesses. A reshard onto a mesh with trainer 2
 * ([1, 2] or [2, 0]) gives it rows: then every trainer's handle must
 * describe the true whole, 5x2, and trainer 2's piece must hold its rows
 * of it. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_fixture.h"

TestSuite(outside_reshard, .fini = stop_cluster);

#define ROWS 5
#define COLS 2
#define NUMEL (ROWS * COLS)

/* w[i][j] = 10 i + j + 1 */
static float w_at(int i, int j) { return (float)(10 * i + j + 1); }

/* The rows rank k of a 2-rank mesh holds of ROWS under Shard(0), by
 * ceil(5 / 2) = 3: rows 0-2, then rows 3-4. */
static int first_row(int k) { return k ? 3 : 0; }
static int row_count(int k) { return k ? 2 : 3; }

typedef struct trainer {
  dist_client *c;
  int rank;
  const int *target; /* the mesh w is resharded onto */
  dist_placement target_placement;
  int rc, in_step;
  char layout[64]; /* w's handle after the reshard: "5x2" */
  float local[NUMEL];
  int64_t local_shape[2];
  size_t local_bytes;
  char msg[600];
} trainer;

static int step(trainer *tr, const char *what, int rc) {
  if (rc && !tr->rc) {
    tr->rc = rc;
    snprintf(tr->msg, sizeof tr->msg, "%s: %s", what, dist_errmsg(tr->c));
  }
  return rc;
}

/* This trainer's piece of w on [0, 1] under Shard(0): an outsider's is
 * empty, as Paddle's local tensor outside the mesh. */
static int made_from_local(trainer *tr, const dist_mesh *m01, dist_tensor **w) {
  float piece[NUMEL];
  int k = tr->rank < 2 ? tr->rank : -1;
  int64_t shape[2] = {k < 0 ? 0 : row_count(k), COLS};
  for (int i = 0; k >= 0 && i < row_count(k); i++)
    for (int j = 0; j < COLS; j++) piece[i * COLS + j] = w_at(first_row(k) + i, j);
  const void *pieces[1] = {piece};
  const int64_t *shapes[1] = {shape};
  dist_placement s0 = DIST_SHARD_DIM(0);
  return step(tr, "dtensor_from_local",
              dist_dtensor_from_local(tr->c, "w", pieces, DIST_FLOAT32, 2, shapes, m01, &s0, w));
}

static void read_piece(trainer *tr, const dist_tensor *w) {
  void *data = NULL;
  int rc = step(tr, "to_local",
                dist_dtensor_to_local(tr->c, w, -1, &data, &tr->local_bytes, tr->local_shape));
  if (rc == 0 && tr->local_bytes <= sizeof tr->local) memcpy(tr->local, data, tr->local_bytes);
  free(data);
}

static void *run_trainer(void *arg) {
  trainer *tr = arg;
  dist_mesh *m01 = NULL, *mt = NULL;
  dist_tensor *w = NULL;
  int r01[2] = {0, 1}, two[1] = {2};
  if (step(tr, "mesh", dist_mesh_new(1, two, r01, NULL, &m01)) == 0 &&
      step(tr, "mesh", dist_mesh_new(1, two, tr->target, NULL, &mt)) == 0 &&
      made_from_local(tr, m01, &w) == 0 &&
      step(tr, "reshard", dist_reshard(tr->c, w, mt, &tr->target_placement)) == 0) {
    const int64_t *sh = dist_tensor_shape(w);
    snprintf(tr->layout, sizeof tr->layout, "%lldx%lld", (long long)sh[0], (long long)sh[1]);
    read_piece(tr, w);
  }
  tr->in_step = harness_in_step(tr->c, tr->rank, 3);
  dist_tensor_free(w);
  dist_mesh_free(m01), dist_mesh_free(mt);
  return NULL;
}

/* Trainer r's rows of w after the reshard: none outside the target mesh,
 * all of them under Replicate, else its Shard(0) share. */
static void expected_rows(const trainer *tr, int *first, int *count) {
  int k = tr->target[0] == tr->rank ? 0 : tr->target[1] == tr->rank ? 1 : -1;
  *first = 0, *count = 0;
  if (k < 0) return;
  if (tr->target_placement.kind == DIST_REPLICATE) *count = ROWS;
  else *first = first_row(k), *count = row_count(k);
}

static void expect_trainer(const trainer *tr) {
  int r = tr->rank, first, count;
  cr_expect_eq(tr->rc, 0, "rank %d: %s", r, tr->msg);
  cr_expect_str_eq(tr->layout, "5x2", "rank %d's handle of w says %s", r, tr->layout);
  expected_rows(tr, &first, &count);
  cr_expect_eq(tr->local_bytes, (size_t)count * COLS * sizeof(float),
               "rank %d's piece: %zu bytes, want %d rows", r, tr->local_bytes, count);
  cr_expect(tr->local_shape[0] == count && tr->local_shape[1] == (count ? COLS : 0),
            "rank %d's piece is %lldx%lld, want %dx%d", r, (long long)tr->local_shape[0],
            (long long)tr->local_shape[1], count, count ? COLS : 0);
  for (int i = 0; tr->local_bytes == (size_t)count * COLS * sizeof(float) && i < count; i++)
    for (int j = 0; j < COLS; j++)
      cr_expect_eq(tr->local[i * COLS + j], w_at(first + i, j), "rank %d: w[%d][%d] = %g", r,
                   first + i, j, tr->local[i * COLS + j]);
  cr_expect(tr->in_step, "rank %d: the all-reduce after the reshard failed", r);
}

static void reshard_into(const char *job, const int *target, dist_placement placement) {
  harness_start(&cluster, 3, NULL);
  trainer tr[3];
  pthread_t th[3];
  for (int r = 0; r < 3; r++)
    tr[r] = (trainer){.c = harness_spmd_client(&cluster, r, job), .rank = r, .target = target,
                      .target_placement = placement};
  for (int r = 0; r < 3; r++) pthread_create(&th[r], NULL, run_trainer, &tr[r]);
  for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 3; r++) {
    cr_log_info("rank %d: %s", r, tr[r].msg);
    expect_trainer(&tr[r]);
    dist_close(tr[r].c);
  }
}

/* Before, trainer 2's handle said 0x2 (its empty piece times 2) while it
 * held rows 3-4. */
Test(outside_reshard, onto_ranks_1_and_2_the_outsider_learns_the_shape, .timeout = 120) {
  static const int one_two[2] = {1, 2};
  reshard_into("outside-reshard-12", one_two, DIST_SHARD_DIM(0));
}

/* Trainer 2 first in the new mesh, holding every row; trainer 1 leaves
 * the mesh with the shape it knew. */
Test(outside_reshard, onto_ranks_2_and_0_replicated, .timeout = 120) {
  static const int two_zero[2] = {2, 0};
  reshard_into("outside-reshard-20", two_zero, DIST_REPLICATED);
}
