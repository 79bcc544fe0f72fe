/* Reshard on the tape, between real daemons: a LocalLayer, a reshard and
 * another LocalLayer differentiated end to end against the derivative
 * computed here; a seed given for a resharded tensor (copied, never
 * changed) coming back in the layout and on the mesh before the reshard,
 * and one given as values; the same chain in SPMD mode; and the reshards
 * the tape refuses. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_fixture.h"

TestSuite(tape_reshard, .fini = stop_cluster);

#define ROWS 4
#define COLS 3

static dist_mesh *mesh_of(int r0, int r1) {
  int shape[1] = {2}, ranks[2] = {r0, r1};
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_new(1, shape, ranks, NULL, &m), 0);
  return m;
}

/* x[i] = i + 1, stored as name with placements pl on m. */
static dist_tensor *put_counting(dist_client *c, const char *name, const dist_mesh *m,
                                 dist_placement pl) {
  float x[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; i++) x[i] = (float)(i + 1);
  int64_t shape[2] = {ROWS, COLS};
  dist_tensor *t = NULL;
  cr_assert_eq(dist_shard_tensor(c, name, x, DIST_FLOAT32, 2, shape, m, &pl, &t), 0, "%s",
               dist_errmsg(c));
  return t;
}

/* Registers a one-input program on m in *p: out = x * x, summed to one
 * element when sum is set; its output lives with placement pl. */
static int square_program(dist_client *c, const char *name, const dist_mesh *m, int sum,
                          dist_placement pl, dist_program **p) {
  dist_program_new(name, p);
  int x = dist_input_dtensor(*p, "x", DIST_FLOAT32);
  int sq = dist_op_mul(*p, x, x);
  dist_program_output(*p, sum ? dist_op_sum(*p, sq, NULL, 0, 0) : sq);
  dist_program_out_dist_attr(*p, m, &pl, NULL);
  return dist_program_register(c, *p);
}

/* The chain of the first two tests on tape t: y = x * x (Shard(0)), y
 * resharded to Replicate, loss = sum(y * y) on every rank (Replicate), and
 * backward from loss. The handles go to h (x, y, loss) and the programs to
 * p, for the caller to free. */
static int square_reshard_square(dist_client *c, const dist_mesh *m, dist_tape *t,
                                 dist_tensor **h, dist_program **p) {
  dist_placement s0 = DIST_SHARD_DIM(0), rep = DIST_REPLICATED;
  float x[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; i++) x[i] = (float)(i + 1);
  int64_t shape[2] = {ROWS, COLS};
  int rc = dist_shard_tensor(c, "x", x, DIST_FLOAT32, 2, shape, m, &s0, &h[0]);
  if (!rc) rc = square_program(c, "square", m, 0, s0, &p[0]);
  if (!rc) rc = square_program(c, "sum_sq", m, 1, rep, &p[1]);
  dist_arg ax = {h[0], NULL};
  if (!rc) rc = dist_tape_local_layer_call(t, p[0], &ax, 1, NULL, &h[1]);
  if (!rc) rc = dist_tape_reshard(t, h[1], NULL, &rep);
  dist_arg ay = {h[1], NULL};
  if (!rc) rc = dist_tape_local_layer_call(t, p[1], &ay, 1, NULL, &h[2]);
  const dist_tensor *seeds[1] = {h[2]};
  return rc ? rc : dist_tape_backward(t, seeds, NULL, 1);
}

static void free_chain(dist_tensor **h, dist_program **p) {
  for (int i = 0; i < 3; i++) dist_tensor_free(h[i]);
  for (int i = 0; i < 2; i++) dist_program_free(p[i]);
}

/* dloss/dx = 4 x^3 at flat index i */
static float want_grad(int i) {
  float v = (float)(i + 1);
  return 4 * v * v * v;
}

static int on_ranks(const dist_tensor *t, int r0, int r1) {
  const dist_mesh *m = dist_tensor_mesh(t);
  return dist_mesh_rank_at(m, 0) == r0 && dist_mesh_rank_at(m, 1) == r1;
}

static float *full_of(dist_client *c, const dist_tensor *t) {
  void *data = NULL;
  size_t nb = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &nb), 0, "%s", dist_errmsg(c));
  cr_assert_eq(nb, ROWS * COLS * sizeof(float), "'%s' has %zu bytes", dist_tensor_name(t), nb);
  return data;
}

/* dloss/dx = 4 x^3 reaches x only if y's Replicate gradient went back to
 * Shard(0) before the first layer's backward. */
Test(tape_reshard, between_two_layers_the_gradient_goes_back_to_the_layout_before,
     .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = mesh_of(0, 1);
  dist_tape *t = NULL;
  dist_tape_new(c, &t);
  dist_tensor *hs[3] = {NULL, NULL, NULL};
  dist_program *ps[2] = {NULL, NULL};
  cr_assert_eq(square_reshard_square(c, m, t, hs, ps), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tensor_placements(hs[1])[0].kind, DIST_REPLICATE, "y's handle");
  dist_tensor *gx = NULL;
  cr_assert_eq(dist_tape_grad(t, "x", &gx), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tensor_placements(gx)[0].kind, DIST_SHARD);
  float *g = full_of(c, gx);
  for (int i = 0; i < ROWS * COLS; i++)
    cr_assert_eq(g[i], want_grad(i), "grad x[%d] = %g, want %g", i, g[i], want_grad(i));
  free(g);
  dist_tensor_free(gx);
  dist_tape_free(t);
  free_chain(hs, ps);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

typedef struct trainer {
  dist_client *c; /* SPMD: this trainer's daemon */
  char err[512];
  float grad[ROWS * COLS / 2]; /* this rank's rows of dloss/dx */
} trainer;

static void *spmd_trainer(void *self) {
  trainer *tr = self;
  dist_client *c = tr->c;
  int shape[1] = {2}, ranks[2] = {0, 1};
  dist_mesh *m = NULL;
  dist_tape *t = NULL;
  dist_tensor *hs[3] = {NULL, NULL, NULL};
  dist_program *ps[2] = {NULL, NULL};
  void *g = NULL;
  size_t nb = 0;
  int64_t gshape[DIST_MAX_DIMS];
  int rc = dist_mesh_new(1, shape, ranks, NULL, &m);
  if (!rc) rc = dist_tape_new(c, &t);
  if (!rc) rc = square_reshard_square(c, m, t, hs, ps);
  if (!rc) rc = dist_tape_grad_local(t, "x", -1, &g, &nb, gshape);
  if (!rc && nb == sizeof tr->grad) memcpy(tr->grad, g, nb);
  else if (!rc) snprintf(tr->err, sizeof tr->err, "a gradient piece of %zu bytes", nb);
  if (rc) snprintf(tr->err, sizeof tr->err, "%s", dist_errmsg(c));
  free(g);
  dist_tape_free(t);
  free_chain(hs, ps);
  dist_mesh_free(m);
  return NULL;
}

Test(tape_reshard, the_same_chain_in_spmd_mode, .timeout = 120) {
  harness_start(&cluster, 2, NULL);
  trainer tr[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++)
    tr[r] = (trainer){.c = harness_spmd_client(&cluster, r, "tape-reshard")};
  for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, spmd_trainer, &tr[r]);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 2; r++) dist_close(tr[r].c);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(tr[r].err[0], 0, "rank %d: %s", r, tr[r].err);
    for (int i = 0; i < ROWS * COLS / 2; i++) {
      int at = r * ROWS * COLS / 2 + i;
      cr_assert_eq(tr[r].grad[i], want_grad(at), "rank %d grad x[%d] = %g, want %g", r, at,
                   tr[r].grad[i], want_grad(at));
    }
  }
  stop_cluster();
}

/* x Shard(0) on [0, 1] resharded to Shard(1) on [1, 0]; backward seeded at
 * x with a stored Replicate tensor: x's gradient has the seed's values,
 * Shard(0) on [0, 1], and the seed keeps its own layout. */
Test(tape_reshard, a_seed_comes_back_on_the_mesh_before_and_is_not_changed,
     .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m01 = mesh_of(0, 1), *m10 = mesh_of(1, 0);
  dist_placement s0 = DIST_SHARD_DIM(0), s1 = DIST_SHARD_DIM(1), rep = DIST_REPLICATED;
  dist_tensor *x = put_counting(c, "x", m01, s0);
  dist_tensor *seed = put_counting(c, "seed", m10, rep);
  dist_tape *t = NULL;
  dist_tape_new(c, &t);
  cr_assert_eq(dist_tape_reshard(t, x, m10, &s1), 0, "%s", dist_errmsg(c));
  dist_arg g = {seed, NULL};
  const dist_tensor *outs[1] = {x};
  cr_assert_eq(dist_tape_backward(t, outs, &g, 1), 0, "%s", dist_errmsg(c));
  dist_tensor *gx = NULL;
  cr_assert_eq(dist_tape_grad(t, "x", &gx), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tensor_placements(gx)[0].kind, DIST_SHARD);
  cr_assert_eq(dist_tensor_placements(gx)[0].dim, 0);
  cr_assert(on_ranks(gx, 0, 1), "the gradient is not on [0, 1]");
  cr_assert_neq(strcmp(dist_tensor_name(gx), "seed"), 0, "the seed itself was resharded");
  float *got = full_of(c, gx), *kept = full_of(c, seed);
  for (int i = 0; i < ROWS * COLS; i++) {
    cr_assert_eq(got[i], (float)(i + 1), "grad x[%d] = %g", i, got[i]);
    cr_assert_eq(kept[i], (float)(i + 1), "seed[%d] = %g", i, kept[i]);
  }
  free(got), free(kept);
  dist_tensor *reopened = NULL;
  cr_assert_eq(dist_tensor_open(c, "seed", &reopened), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tensor_placements(reopened)[0].kind, DIST_REPLICATE);
  cr_assert(on_ranks(reopened, 1, 0), "the seed moved");
  dist_tensor_free(reopened), dist_tensor_free(gx);
  dist_tape_free(t);
  dist_tensor_free(seed), dist_tensor_free(x);
  dist_mesh_free(m01), dist_mesh_free(m10);
  dist_close(c);
  stop_cluster();
}

/* Two daemons, x = put_counting Shard(0) on mesh [0,1], and a new tape. */
typedef struct x_on_tape {
  dist_client *c;
  dist_mesh *m;
  dist_tensor *x;
  dist_tape *t;
} x_on_tape;

static void x_on_tape_start(x_on_tape *s) {
  s->c = harness_start_with_client(&cluster, 2, NULL);
  s->m = mesh_of(0, 1);
  s->x = put_counting(s->c, "x", s->m, (dist_placement)DIST_SHARD_DIM(0));
  dist_tape_new(s->c, &s->t);
}

static void x_on_tape_stop(x_on_tape *s) {
  dist_tape_free(s->t);
  dist_tensor_free(s->x);
  dist_mesh_free(s->m);
  dist_close(s->c);
  stop_cluster();
}

/* What the tape refuses: a tensor an exchange wrote (it lives per rank),
 * and a reshard the daemons refuse (nothing recorded, nothing changed). */
Test(tape_reshard, refused_reshards_record_nothing, .timeout = 120) {
  x_on_tape s;
  x_on_tape_start(&s);
  dist_client *c = s.c;
  dist_tape *t = s.t;
  dist_tensor *x = s.x;
  dist_placement s5 = DIST_SHARD_DIM(5), rep = DIST_REPLICATED;
  static const float rows[2][2] = {{1, 2}, {3, 4}};
  static const int64_t counts[2][2] = {{1, 0}, {0, 1}};
  const void *xs[2] = {rows[0], rows[1]};
  const int64_t *lcs[2] = {counts[0], counts[1]};
  dist_tape_exchange a = {"tokens", xs, NULL, DIST_FLOAT32, 2, lcs, lcs, 1, NULL, 0,
                          "routed", 0};
  dist_tensor *routed = NULL;
  cr_assert_eq(dist_tape_global_scatter(t, &a, &routed, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tape_reshard(t, routed, NULL, &rep), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "'routed' lives per rank"), "%s", dist_errmsg(c));
  cr_assert_eq(dist_tape_reshard(t, x, NULL, &s5), DIST_EINVAL);
  cr_assert_eq(dist_tensor_placements(x)[0].kind, DIST_SHARD, "x's handle changed");
  dist_tensor_free(routed);
  x_on_tape_stop(&s);
}

/* A resharded tensor seeded with values (its pieces after the reshard, in
 * mesh order) gets them back in its layout before: x Shard(0) -> Replicate,
 * each replica seeded with g[i] = 10 i, and x's gradient is g sharded by
 * rows again. */
Test(tape_reshard, a_resharded_tensor_seeded_with_values, .timeout = 120) {
  x_on_tape s;
  x_on_tape_start(&s);
  dist_placement rep = DIST_REPLICATED;
  cr_assert_eq(dist_tape_reshard(s.t, s.x, NULL, &rep), 0, "%s", dist_errmsg(s.c));
  float g[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; i++) g[i] = 10.0f * (float)i;
  dist_value v[2] = {{g, DIST_FLOAT32, 2, {ROWS, COLS}}, {g, DIST_FLOAT32, 2, {ROWS, COLS}}};
  dist_arg seed = {NULL, v};
  const dist_tensor *outs[1] = {s.x};
  cr_assert_eq(dist_tape_backward(s.t, outs, &seed, 1), 0, "%s", dist_errmsg(s.c));
  dist_tensor *gx = NULL;
  cr_assert_eq(dist_tape_grad(s.t, "x", &gx), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(dist_tensor_placements(gx)[0].kind, DIST_SHARD);
  cr_assert(on_ranks(gx, 0, 1), "the gradient is not on x's mesh");
  void *full = NULL;
  size_t nb = 0;
  cr_assert_eq(dist_full_tensor(s.c, gx, &full, &nb), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(nb, sizeof g);
  for (int i = 0; i < ROWS * COLS; i++)
    cr_assert_eq(((float *)full)[i], g[i], "grad x[%d] = %g", i, ((float *)full)[i]);
  free(full);
  dist_tensor_free(gx);
  x_on_tape_stop(&s);
}
