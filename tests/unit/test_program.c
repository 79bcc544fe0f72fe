/* Programs end to end in one process: the seed-000 masked loss on both
 * ranks, MoE aux_loss and z_loss against a direct computation, gradients of
 * whole programs against finite differences, and validation errors that
 * name the op and its position. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "program.h"
#include "program_build.h"
#include "tval_build.h"

#define F32 DIST__V1__DTYPE__FLOAT32
#define F64 DIST__V1__DTYPE__FLOAT64
#define I64 DIST__V1__DTYPE__INT64
#define KIND(k) DIST__V1__PROGRAM_INPUT__KIND__##k
#define OP(o) DIST__V1__OP_KIND__OP_##o

/* The program b describes, which must compile; b is freed (the program
 * keeps its own copy). */
static distd_program *compiled(pb_build *b) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  cr_assert_eq(distd_program_new(&b->prog, &p, &eb), 0, "%s", eb.msg);
  pbb_free(b);
  return p;
}

/* Seed 000: mask = zeros_like(x); rank 0: mask[1:3] = 1, else mask[4:7] = 1;
 * loss = sum(x * mask) / sum(mask). */
static void build_masked_loss(pb_build *b) {
  pbb_init(b);
  uint32_t x = pbb_input(b, KIND(DTENSOR_LOCAL), F32);
  uint32_t rank = pbb_input(b, KIND(RANK), 0);
  uint32_t zeros = pbb_node(b, OP(ZEROS_LIKE), x, PB_END);
  uint32_t m0 = pbb_node(b, OP(SET_SLICE), zeros, PB_END);
  pbb_slice1(b, 0, 1, 3);
  b->last->scalar = 1;
  uint32_t m1 = pbb_node(b, OP(SET_SLICE), zeros, PB_END);
  pbb_slice1(b, 0, 4, 7);
  b->last->scalar = 1;
  uint32_t is0 = pbb_node(b, OP(EQ), rank, PB_END); /* rank == 0 (scalar) */
  uint32_t mask = pbb_node(b, OP(WHERE), is0, m0, m1, PB_END);
  uint32_t xm = pbb_node(b, OP(MUL), x, mask, PB_END);
  uint32_t num = pbb_node(b, OP(SUM), xm, PB_END);
  uint32_t den = pbb_node(b, OP(SUM), mask, PB_END);
  uint32_t loss = pbb_node(b, OP(DIV), num, den, PB_END);
  pbb_output(b, loss);
}

static void run_masked_loss(uint32_t rank, double expect_loss,
                            const double *expect_grad) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  distd_invocation *inv = NULL;
  build_masked_loss(&b);
  p = compiled(&b);
  double xv[10];
  for (int i = 0; i < 10; i++) xv[i] = i + rank; /* arange(0, 10) + rank */
  distd_tval *x = make_vals(DIST_FLOAT32, shp(1, 10), xv);
  distd_tval *inputs[2] = {x, NULL};
  distd_run_env env = {rank};
  cr_assert_eq(distd_program_run(p, &env, inputs, &inv, &eb), 0, "%s", eb.msg);
  distd_tval *out = distd_invocation_output(inv, 0);
  cr_assert_eq(out->dtype, DIST_FLOAT32);
  cr_assert_eq(out->shape.ndim, 0);
  cr_assert_eq(((float *)out->data)[0], (float)expect_loss, "rank %u: %g", rank,
               at(out, 0));
  cr_assert_eq(distd_invocation_backward(inv, NULL, &eb), 0, "%s", eb.msg);
  distd_tval *g = distd_invocation_input_grad(inv, 0);
  cr_assert_not_null(g);
  for (int i = 0; i < 10; i++)
    cr_assert_float_eq(at(g, i), expect_grad[i], 1e-6, "grad[%d] = %g", i,
                       at(g, i));
  cr_assert_null(distd_invocation_input_grad(inv, 1), "rank has no gradient");
  distd_invocation_release(inv);
  distd_tval_unref(x);
  distd_program_free(p);
}

Test(program, seed_masked_loss_rank0_is_1_5) {
  double g[10] = {0, 0.5, 0.5, 0, 0, 0, 0, 0, 0, 0};
  run_masked_loss(0, 1.5, g);
}

Test(program, seed_masked_loss_rank1_is_6_0) {
  double t = 1.0 / 3;
  double g[10] = {0, 0, 0, 0, t, t, t, 0, 0, 0};
  run_masked_loss(1, 6.0, g);
}

Test(program, invocation_released_before_backward_frees_everything) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  distd_invocation *inv = NULL;
  build_masked_loss(&b);
  p = compiled(&b);
  double xv[10] = {0};
  distd_tval *x = make_vals(DIST_FLOAT32, shp(1, 10), xv);
  distd_tval *inputs[2] = {x, NULL};
  distd_run_env env = {0};
  cr_assert_eq(distd_program_run(p, &env, inputs, &inv, &eb), 0, "%s", eb.msg);
  distd_program_free(p); /* the invocation keeps the program alive */
  distd_invocation_release(inv);
  distd_tval_unref(x);
}

/* ------------------------------------------------------------- MoE */

enum { T = 6, E = 4, K = 2 };

/* aux = E * sum(mean(softmax(l), 0) * mean(sum(one_hot(topk(l).idx), 1), 0))
 * z = mean(logsumexp(l, -1)^2) */
static void build_moe(pb_build *b, Dist__V1__DType dt) {
  pbb_init(b);
  uint32_t l = pbb_input(b, KIND(VALUE), dt);
  uint32_t probs = pbb_node(b, OP(SOFTMAX), l, PB_END);
  b->last->axis = -1;
  uint32_t me = pbb_node(b, OP(MEAN), probs, PB_END);
  pbb_axes(b, 1, 0LL);
  uint32_t top = pbb_node(b, OP(TOPK), probs, PB_END);
  b->last->k = K;
  b->last->axis = -1;
  uint32_t oh = pbb_node(b, OP(ONE_HOT), top + 1, PB_END);
  b->last->num_classes = E;
  b->last->dtype = dt;
  uint32_t cnt = pbb_node(b, OP(SUM), oh, PB_END);
  pbb_axes(b, 1, 1LL);
  uint32_t ce = pbb_node(b, OP(MEAN), cnt, PB_END);
  pbb_axes(b, 1, 0LL);
  uint32_t prod = pbb_node(b, OP(MUL), me, ce, PB_END);
  uint32_t s = pbb_node(b, OP(SUM), prod, PB_END);
  uint32_t aux = pbb_node(b, OP(MUL), s, PB_END);
  b->last->scalar = E;
  uint32_t lse = pbb_node(b, OP(LOGSUMEXP), l, PB_END);
  b->last->axis = -1;
  uint32_t sq = pbb_node(b, OP(POW), lse, PB_END);
  b->last->scalar = 2;
  uint32_t z = pbb_node(b, OP(MEAN), sq, PB_END);
  pbb_output(b, aux);
  pbb_output(b, z);
}

static void moe_direct(const double *l, double *aux, double *z) {
  double me[E] = {0}, ce[E] = {0};
  *z = 0;
  for (int t = 0; t < T; t++) {
    double m = -INFINITY, s = 0, p[E];
    for (int e = 0; e < E; e++) m = fmax(m, l[t * E + e]);
    for (int e = 0; e < E; e++) s += exp(l[t * E + e] - m);
    for (int e = 0; e < E; e++) p[e] = exp(l[t * E + e] - m) / s;
    for (int e = 0; e < E; e++) me[e] += p[e] / T;
    double lse = m + log(s);
    *z += lse * lse / T;
    int used[E] = {0};
    for (int k = 0; k < K; k++) { /* the k-th largest probability */
      int best = -1;
      for (int e = 0; e < E; e++)
        if (!used[e] && (best < 0 || p[e] > p[best])) best = e;
      used[best] = 1;
      ce[best] += 1.0 / T;
    }
  }
  *aux = 0;
  for (int e = 0; e < E; e++) *aux += E * me[e] * ce[e];
}

static void fill_logits(double *l, unsigned seed) {
  for (int i = 0; i < T * E; i++) {
    seed = seed * 1103515245u + 12345u;
    l[i] = ((seed >> 8) % 2000) / 500.0 - 2.0;
  }
}

static void run_moe(distd_program *p, const double *l, dist_dtype dt,
                    double *aux, double *z, distd_invocation **keep) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_tval *x = make_vals(dt, shp(2, T, E), l);
  distd_invocation *inv = NULL;
  distd_run_env env = {0};
  cr_assert_eq(distd_program_run(p, &env, &x, &inv, &eb), 0, "%s", eb.msg);
  *aux = at(distd_invocation_output(inv, 0), 0);
  *z = at(distd_invocation_output(inv, 1), 0);
  distd_tval_unref(x);
  if (keep) *keep = inv;
  else distd_invocation_release(inv);
}

Test(program, moe_aux_loss_and_z_loss_match_direct_computation) {
  pb_build b;
  distd_program *p = NULL;
  build_moe(&b, F32);
  p = compiled(&b);
  for (unsigned seed = 1; seed <= 5; seed++) {
    double l[T * E], aux, z, raux, rz;
    fill_logits(l, seed);
    for (int i = 0; i < T * E; i++) l[i] = (float)l[i];
    run_moe(p, l, DIST_FLOAT32, &aux, &z, NULL);
    moe_direct(l, &raux, &rz);
    cr_assert_float_eq(aux, raux, 1e-5 * fabs(raux) + 1e-6, "aux %g vs %g", aux, raux);
    cr_assert_float_eq(z, rz, 1e-5 * fabs(rz) + 1e-6, "z %g vs %g", z, rz);
  }
  distd_program_free(p);
}

Test(program, moe_gradients_match_finite_differences) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  build_moe(&b, F64);
  p = compiled(&b);
  double l[T * E], aux, z;
  fill_logits(l, 7);
  distd_invocation *inv = NULL;
  run_moe(p, l, DIST_FLOAT64, &aux, &z, &inv);
  /* d(aux + 0.5 z)/dl: both outputs get a gradient. */
  distd_tval *g1 = make_vals(DIST_FLOAT64, shp(0), (double[]){1.0});
  distd_tval *g2 = make_vals(DIST_FLOAT64, shp(0), (double[]){0.5});
  distd_tval *og[2] = {g1, g2};
  cr_assert_eq(distd_invocation_backward(inv, og, &eb), 0, "%s", eb.msg);
  distd_tval *g = distd_invocation_input_grad(inv, 0);
  cr_assert_not_null(g);
  for (int i = 0; i < T * E; i++) {
    double h = 1e-6, lp[T * E], lm[T * E], ap, zp, am, zm;
    memcpy(lp, l, sizeof l);
    memcpy(lm, l, sizeof l);
    lp[i] += h;
    lm[i] -= h;
    run_moe(p, lp, DIST_FLOAT64, &ap, &zp, NULL);
    run_moe(p, lm, DIST_FLOAT64, &am, &zm, NULL);
    double fd = ((ap + 0.5 * zp) - (am + 0.5 * zm)) / (2 * h);
    cr_assert_float_eq(at(g, i), fd, 1e-6, "dl[%d]: %g vs %g", i, at(g, i), fd);
  }
  distd_invocation_release(inv);
  distd_tval_unref(g1);
  distd_tval_unref(g2);
  distd_program_free(p);
}

/* A program returning its COORD input along dim of the mesh shape/ranks
 * (borrowed until pbb_free). */
static void coord_program(pb_build *b, size_t ndim, uint32_t *shape,
                          size_t nranks, uint32_t *ranks, uint32_t dim) {
  pbb_init(b);
  uint32_t c = pbb_input(b, KIND(COORD), 0);
  Dist__V1__Mesh *m = pbb_alloc(b, sizeof *m);
  dist__v1__mesh__init(m);
  m->n_shape = ndim;
  m->shape = shape;
  m->n_ranks = nranks;
  m->ranks = ranks;
  b->inputs[0]->mesh = m;
  b->inputs[0]->mesh_dim = dim;
  pbb_output(b, c);
}

Test(program, coord_input_is_the_mesh_coordinate) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  uint32_t shape[2] = {2, 3}, ranks[6] = {5, 4, 3, 2, 1, 0};
  coord_program(&b, 2, shape, 6, ranks, 1);
  p = compiled(&b);
  for (uint32_t r = 0; r < 6; r++) {
    distd_invocation *inv = NULL;
    distd_run_env env = {r};
    distd_tval *none[1] = {NULL};
    cr_assert_eq(distd_program_run(p, &env, none, &inv, &eb), 0, "%s", eb.msg);
    int64_t expect = (5 - r) % 3;
    cr_assert_eq(at(distd_invocation_output(inv, 0), 0), (double)expect);
    distd_invocation_release(inv);
  }
  distd_invocation *inv = NULL;
  distd_run_env env = {9};
  distd_tval *none[1] = {NULL};
  cr_assert_neq(distd_program_run(p, &env, none, &inv, &eb), 0);
  cr_assert(strstr(eb.msg, "rank 9 is not in the mesh"), "%s", eb.msg);
  distd_program_free(p);
}

/* ------------------------------------------------------- validation */

Test(program_errors, output_count_differs_from_out_dist_attrs) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  build_masked_loss(&b);
  pbb_attr(&b, DIST__V1__PLACEMENT__KIND__REPLICATE); /* 1 output, 2 attrs */
  cr_assert_eq(distd_program_new(&b.prog, &p, &eb), DIST_EMISMATCH);
  cr_assert_null(p);
  cr_assert_str_eq(eb.msg, "program has 1 outputs but 2 out_dist_attrs entries");
  pbb_free(&b);
}

/* A new program whose first input is a VALUE of dtype dt and shape [n]. */
static uint32_t init_with_1d_input(pb_build *b, Dist__V1__DType dt, long long n) {
  pbb_init(b);
  uint32_t x = pbb_input(b, KIND(VALUE), dt);
  pbb_input_shape(b, x, 1, n);
  return x;
}

/* Registering b fails with rc and exactly msg; frees b. */
static void expect_refused(pb_build *b, int rc, const char *msg) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  cr_assert_eq(distd_program_new(&b->prog, &p, &eb), rc, "%s", eb.msg);
  cr_assert_null(p);
  cr_assert_str_eq(eb.msg, msg);
  pbb_free(b);
}

Test(program_errors, wrong_dtype_names_op_and_position) {
  pb_build b;
  uint32_t x = init_with_1d_input(&b, F32, 4);
  uint32_t r = pbb_input(&b, KIND(RANK), 0);
  uint32_t e = pbb_node(&b, OP(EXP), x, PB_END);
  uint32_t s = pbb_node(&b, OP(ADD), e, r, PB_END); /* float32 + int64 */
  pbb_output(&b, s);
  expect_refused(&b, DIST_EMISMATCH, "node 1 (add): dtypes differ: float32 vs int64");
}

Test(program_errors, wrong_shape_names_op_and_position) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  pbb_init(&b);
  uint32_t x = pbb_input(&b, KIND(VALUE), F32);
  uint32_t w = pbb_input(&b, KIND(VALUE), F32);
  uint32_t t = pbb_node(&b, OP(TANH), x, PB_END);
  uint32_t y = pbb_node(&b, OP(MATMUL), t, w, PB_END);
  b.last->name = "router";
  pbb_output(&b, y);
  p = compiled(&b);
  /* Shapes are known only at invocation: checked before anything runs. */
  double zeros[20] = {0};
  distd_tval *in[2] = {make_vals(DIST_FLOAT32, shp(2, 2, 3), zeros),
                       make_vals(DIST_FLOAT32, shp(2, 4, 5), zeros)};
  distd_invocation *inv = NULL;
  distd_run_env env = {0};
  cr_assert_eq(distd_program_run(p, &env, in, &inv, &eb), DIST_EMISMATCH);
  cr_assert_null(inv);
  cr_assert_str_eq(eb.msg,
                   "node 1 (matmul 'router'): inner dims differ: [2, 3] x [4, 5]");
  distd_tval_unref(in[0]);
  distd_tval_unref(in[1]);
  distd_program_free(p);
}

Test(program_errors, input_against_declared_dtype) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  build_masked_loss(&b);
  p = compiled(&b);
  double v[10] = {0};
  distd_tval *x = make_vals(DIST_INT64, shp(1, 10), v);
  distd_tval *in[2] = {x, NULL};
  distd_invocation *inv = NULL;
  distd_run_env env = {0};
  cr_assert_eq(distd_program_run(p, &env, in, &inv, &eb), DIST_EMISMATCH);
  cr_assert_str_eq(eb.msg, "input 0: dtype int64, the program expects float32");
  distd_tval_unref(x);
  distd_program_free(p);
}

Test(program_errors, value_used_before_defined) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  pbb_init(&b);
  uint32_t x = pbb_input(&b, KIND(VALUE), F32);
  pbb_node(&b, OP(ADD), x, 5, PB_END);
  pbb_output(&b, x);
  cr_assert_eq(distd_program_new(&b.prog, &p, &eb), DIST_EINVAL);
  cr_assert_str_eq(eb.msg, "node 0 (add): input 1 is value 5, not defined "
                   "before this node (1 values so far)");
  pbb_free(&b);
}

Test(program_errors, arange_of_step_0_is_refused_at_registration) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  pbb_init(&b);
  pbb_node(&b, OP(ARANGE), PB_END);
  b.last->end = 10; /* start (scalar) 0, step 0: as numpy, no end */
  pbb_output(&b, 0);
  cr_assert_eq(distd_program_new(&b.prog, &p, &eb), DIST_EINVAL);
  cr_assert_null(p);
  cr_assert_str_eq(eb.msg, "node 0 (arange): step is 0: arange(0, 10, 0) never "
                   "reaches its end");
  b.last->step = -2.5; /* any other step is fine: [0, 10) by -2.5 is empty */
  cr_assert_eq(distd_program_new(&b.prog, &p, &eb), 0, "%s", eb.msg);
  distd_program_free(p);
  pbb_free(&b);
}

/* Registers a one-node program on a declared [8] int64 input; the node's
 * shape is too large: refused at registration, not allocated wrapped. */
static void expect_too_large(Dist__V1__OpKind op, const char *want) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  uint32_t x = init_with_1d_input(&b, I64, 8);
  uint32_t y = pbb_node(&b, op, x, PB_END);
  if (op == OP(ONE_HOT)) b.last->num_classes = 1LL << 62; /* 8 * 2^62 wraps to 0 */
  if (op == OP(FULL)) b.last->n_inputs = 0;
  if (op != OP(ONE_HOT)) pbb_shape(&b, 2, (1LL << 62) + 2, 4LL); /* wraps to 8 */
  pbb_output(&b, y);
  cr_assert_eq(distd_program_new(&b.prog, &p, &eb), DIST_EINVAL, "%s", eb.msg);
  cr_assert_null(p);
  cr_assert(strstr(eb.msg, want), "%s", eb.msg);
  pbb_free(&b);
}

Test(program_errors, shapes_whose_element_count_wraps_are_refused) {
  expect_too_large(OP(FULL), "node 0 (full): dim 0 of size 4611686018427387906 is too large");
  expect_too_large(OP(RESHAPE), "node 0 (reshape): dim 0 of size");
  expect_too_large(OP(ONE_HOT), "node 0 (one_hot): dim 1 of size 4611686018427387904 is too large");
}

/* An enum value the message may carry but no kernel knows: the loss would
 * otherwise be uninitialized memory. */
Test(program_errors, cross_entropy_of_unknown_reduction_is_refused) {
  pb_build b;
  uint32_t logits = init_with_1d_input(&b, F32, 3);
  uint32_t labels = pbb_input(&b, KIND(VALUE), I64);
  pbb_output(&b, pbb_node(&b, OP(CROSS_ENTROPY), logits, labels, PB_END));
  b.last->reduction = 3;
  expect_refused(&b, DIST_EINVAL, "node 0 (cross_entropy): unknown reduction 3");
}

/* A COORD input's mesh is checked as every mesh is: a dim of size 0 would
 * divide by zero when the coordinate is computed, and a shape that does
 * not hold the ranks gives coordinates of no mesh. */
Test(program_errors, coord_input_of_a_malformed_mesh_is_refused) {
  pb_build b;
  uint32_t zero[1] = {0}, two[1] = {2}, ranks[4] = {0, 1, 2, 3};
  coord_program(&b, 1, zero, 1, ranks, 0);
  expect_refused(&b, DIST_EINVAL, "input 0: mesh: dim 0 has size 0");
  coord_program(&b, 1, two, 4, ranks, 0);
  expect_refused(&b, DIST_EINVAL, "input 0: mesh: shape holds 2 ranks, 4 given");
}

/* sum(x > 0) is an int64 count: backward from it is refused as it is
 * with an explicit output gradient, rather than giving x zero gradients. */
Test(program_errors, backward_from_an_integer_scalar_is_refused) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  uint32_t x = init_with_1d_input(&b, F32, 3);
  uint32_t pos = pbb_node(&b, OP(GT), x, PB_END);
  pbb_output(&b, pbb_node(&b, OP(SUM), pos, PB_END));
  p = compiled(&b);
  double v[3] = {1, -2, 3};
  distd_tval *in[1] = {make_vals(DIST_FLOAT32, shp(1, 3), v)};
  distd_invocation *inv = NULL;
  distd_run_env env = {0};
  cr_assert_eq(distd_program_run(p, &env, in, &inv, &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_invocation_backward(inv, NULL, &eb), DIST_EINVAL);
  cr_assert_str_eq(eb.msg, "output 0 is int64: it has no gradient");
  distd_invocation_release(inv);
  distd_tval_unref(in[0]);
  distd_program_free(p);
}

Test(program_errors, backward_without_gradients_needs_a_scalar_output) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_program *p = NULL;
  build_moe(&b, F32);
  p = compiled(&b);
  double l[T * E] = {0}, aux, z;
  distd_invocation *inv = NULL;
  run_moe(p, l, DIST_FLOAT32, &aux, &z, &inv);
  cr_assert_eq(distd_invocation_backward(inv, NULL, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "has 2 outputs"), "%s", eb.msg);
  cr_assert_eq(distd_invocation_backward(inv, NULL, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "already ran"), "%s", eb.msg);
  distd_invocation_release(inv);
  distd_program_free(p);
}
