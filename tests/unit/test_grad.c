/* The gradient of every differentiable op against central finite
 * differences in float64. Each case is a one-node program (plus constant
 * inputs such as labels); the loss is sum(output * w) for a random w, given
 * to backward as the output gradient. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "program.h"
#include "program_build.h"
#include "tval_build.h"

#define OP(o) DIST__V1__OP_KIND__OP_##o
#define VALUE DIST__V1__PROGRAM_INPUT__KIND__VALUE

static unsigned rng = 99;
static double rnd(void) {
  rng = rng * 1103515245u + 12345u;
  return ((rng >> 8) % 20000) / 10000.0 - 1.0;
}

/* Random float64 values in [lo, lo + span). */
static distd_tval *rand_val(dist_shape s, double lo, double span) {
  distd_tval *t = NULL;
  cr_assert_eq(distd_tval_new(DIST_FLOAT64, &s, &t, NULL), 0);
  for (int64_t i = 0; i < t->numel; i++)
    ((double *)t->data)[i] = lo + (rnd() + 1) / 2 * span;
  return t;
}

static double run_loss(distd_program *p, distd_tval **in, const distd_tval *w) {
  distd_invocation *inv = NULL;
  distd_run_env env = {0};
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_program_run(p, &env, in, &inv, &eb), 0, "%s", eb.msg);
  const distd_tval *o = distd_invocation_output(inv, 0);
  double s = 0;
  for (int64_t i = 0; i < o->numel; i++)
    s += dist_elem_get(o->data, o->dtype, (size_t)i) * ((double *)w->data)[i];
  distd_invocation_release(inv);
  return s;
}

/* Builds the program in b (one output), checks d loss / d input for every
 * float64 input against finite differences. */
static void check_grad(pb_build *b, distd_tval **in, int nin, double tol) {
  distd_program *p = NULL;
  distd_invocation *inv = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_run_env env = {0};
  const char *op = distd_op_name(b->nodes[b->prog.n_nodes - 1]->op);
  cr_assert_eq(distd_program_new(&b->prog, &p, &eb), 0, "%s: %s", op, eb.msg);
  cr_assert_eq(distd_program_run(p, &env, in, &inv, &eb), 0, "%s: %s", op, eb.msg);
  distd_tval *o = distd_invocation_output(inv, 0);
  distd_tval *w = rand_val(o->shape, -1, 2);
  distd_tval *wo = NULL;
  cr_assert_eq(distd_tval_cast(w, o->dtype, &wo, NULL), 0);
  cr_assert_eq(distd_invocation_backward(inv, &wo, &eb), 0, "%s: %s", op, eb.msg);
  double *grads[8] = {0};
  for (int i = 0; i < nin; i++) {
    distd_tval *g = distd_invocation_input_grad(inv, (size_t)i);
    if (!dist_dtype_is_float(in[i]->dtype)) {
      cr_assert_null(g, "%s: input %d (%s) has no gradient", op, i,
                     dist_dtype_name(in[i]->dtype));
      continue;
    }
    if (in[i]->dtype != DIST_FLOAT64) continue; /* a constant here (mask) */
    cr_assert_not_null(g, "%s: input %d has a gradient", op, i);
    cr_assert(dist_shape_equal(&g->shape, &in[i]->shape), "%s: grad shape", op);
    grads[i] = malloc(sizeof(double) * (size_t)g->numel + 1);
    memcpy(grads[i], g->data, sizeof(double) * (size_t)g->numel);
  }
  distd_invocation_release(inv);
  for (int i = 0; i < nin; i++) {
    if (!grads[i]) continue;
    double *x = in[i]->data;
    for (int64_t j = 0; j < in[i]->numel; j++) {
      double h = 1e-6 * (1 + fabs(x[j])), x0 = x[j];
      x[j] = x0 + h;
      double lp = run_loss(p, in, w);
      x[j] = x0 - h;
      double lm = run_loss(p, in, w);
      x[j] = x0;
      double fd = (lp - lm) / (2 * h);
      cr_assert(fabs(grads[i][j] - fd) <= tol * (1 + fabs(fd)),
                "%s: d/d in%d[%lld] = %.9g, finite difference %.9g", op, i,
                (long long)j, grads[i][j], fd);
    }
    free(grads[i]);
  }
  distd_tval_unref(w);
  distd_tval_unref(wo);
  distd_program_free(p);
}

/* A program of one node over nin float64/other VALUE inputs. */
static Dist__V1__ProgramNode *one_node(pb_build *b, distd_op op, int nin,
                                       distd_tval **in) {
  pbb_init(b);
  for (int i = 0; i < nin; i++) pbb_input(b, VALUE, 0);
  uint32_t v = 0;
  switch (nin) {
  case 0: v = pbb_node(b, op, PB_END); break;
  case 1: v = pbb_node(b, op, 0, PB_END); break;
  case 2: v = pbb_node(b, op, 0, 1, PB_END); break;
  default: v = pbb_node(b, op, 0, 1, 2, PB_END); break;
  }
  (void)in;
  pbb_output(b, v);
  return b->last;
}

static void done(pb_build *b, distd_tval **in, int nin) {
  pbb_free(b);
  for (int i = 0; i < nin; i++) distd_tval_unref(in[i]);
}

#define TOL 1e-6

Test(grad, binary_ops_with_broadcasting) {
  dist_shape pairs[][2] = {{shp(2, 2, 3), shp(2, 2, 3)}, {shp(2, 2, 3), shp(1, 3)},
                           {shp(2, 2, 1), shp(3, 1, 1, 3)}, {shp(0), shp(2, 2, 2)}};
  for (distd_op op = OP(ADD); op <= OP(MINIMUM); op++)
    for (int p = 0; p < 4; p++) {
      pb_build b;
      int pos = op == OP(POW) || op == OP(DIV);
      distd_tval *in[2] = {rand_val(pairs[p][0], pos ? 0.5 : -2, pos ? 2 : 4),
                           rand_val(pairs[p][1], pos ? 0.5 : -2, pos ? 2 : 4)};
      one_node(&b, op, 2, in);
      check_grad(&b, in, 2, TOL);
      done(&b, in, 2);
    }
}

Test(grad, binary_with_scalar_operand) {
  for (int first = 0; first < 2; first++)
    for (distd_op op = OP(ADD); op <= OP(MINIMUM); op++) {
      pb_build b;
      distd_tval *in[1] = {rand_val(shp(2, 3, 2), 0.5, 2)};
      Dist__V1__ProgramNode *n = one_node(&b, op, 1, in);
      n->scalar = 1.7;
      n->scalar_first = first;
      check_grad(&b, in, 1, TOL);
      done(&b, in, 1);
    }
}

Test(grad, where_routes_to_the_chosen_branch) {
  pb_build b;
  double cv[3] = {1, 0, 1};
  distd_tval *in[3] = {make_vals(DIST_BOOL, shp(2, 3, 1), cv), rand_val(shp(2, 1, 4), -1, 2),
                       rand_val(shp(2, 3, 4), -1, 2)};
  one_node(&b, OP(WHERE), 3, in);
  check_grad(&b, in, 3, TOL);
  done(&b, in, 3);
}

Test(grad, unary_ops) {
  for (distd_op op = OP(EXP); op <= OP(TANH); op++)
    for (int approx = 0; approx < 2; approx++) {
      pb_build b;
      int pos = op == OP(LOG) || op == OP(SQRT);
      distd_tval *in[1] = {rand_val(shp(2, 4, 5), pos ? 0.2 : -2, pos ? 2 : 4)};
      for (int64_t i = 0; i < in[0]->numel; i++) /* keep off the kinks */
        if (fabs(((double *)in[0]->data)[i]) < 1e-3) ((double *)in[0]->data)[i] = 0.5;
      Dist__V1__ProgramNode *n = one_node(&b, op, 1, in);
      n->approximate = approx;
      check_grad(&b, in, 1, TOL);
      done(&b, in, 1);
    }
}

Test(grad, reductions_over_axes) {
  int64_t axsets[][2] = {{0, 0}, {1, 0}, {0, 2}, {-1, 0}};
  int naxes[] = {0, 1, 2, 1};
  for (distd_op op = OP(SUM); op <= OP(MIN); op++)
    for (int k = 0; k < 4; k++)
      for (int keep = 0; keep < 2; keep++) {
        pb_build b;
        distd_tval *in[1] = {rand_val(shp(3, 2, 3, 4), -2, 4)};
        Dist__V1__ProgramNode *n = one_node(&b, op, 1, in);
        n->keepdim = keep;
        if (naxes[k]) {
          n->n_axes = (size_t)naxes[k];
          n->axes = axsets[k];
        }
        check_grad(&b, in, 1, TOL);
        n->axes = NULL;
        done(&b, in, 1);
      }
}

/* Registers b, runs it on in and backpropagates gout (NULL: from the
 * scalar output). The caller releases the invocation and frees *p. */
static distd_invocation *run_backward(pb_build *b, distd_tval **in,
                                      distd_tval *gout, distd_program **p) {
  distd_invocation *inv = NULL;
  distd_run_env env = {0};
  cr_assert_eq(distd_program_new(&b->prog, p, NULL), 0);
  cr_assert_eq(distd_program_run(*p, &env, in, &inv, NULL), 0);
  cr_assert_eq(distd_invocation_backward(inv, gout ? &gout : NULL, NULL), 0);
  return inv;
}

Test(grad, max_ties_share_the_gradient) {
  pb_build b;
  double v[4] = {1, 3, 3, 2};
  distd_tval *in[1] = {make_vals(DIST_FLOAT64, shp(1, 4), v)};
  one_node(&b, OP(MAX), 1, in);
  distd_program *p = NULL;
  distd_invocation *inv = run_backward(&b, in, NULL, &p);
  double *g = distd_invocation_input_grad(inv, 0)->data;
  cr_assert(g[0] == 0 && g[1] == 0.5 && g[2] == 0.5 && g[3] == 0);
  distd_invocation_release(inv);
  distd_program_free(p);
  done(&b, in, 1);
}

Test(grad, softmax_family) {
  for (distd_op op = OP(LOGSUMEXP); op <= OP(LOG_SOFTMAX); op++)
    for (int axis = -1; axis < 3; axis++)
      for (int keep = 0; keep < 2; keep++) {
        pb_build b;
        distd_tval *in[1] = {rand_val(shp(3, 2, 3, 4), -2, 4)};
        Dist__V1__ProgramNode *n = one_node(&b, op, 1, in);
        n->axis = axis;
        n->keepdim = keep;
        check_grad(&b, in, 1, TOL);
        done(&b, in, 1);
      }
}

Test(grad, cross_entropy_reductions_ignore_index_and_mask) {
  double lab[5] = {0, 3, -100, 2, 1}, mk[5] = {1, 0.5, 1, 0, 2};
  for (int red = 0; red < 3; red++)
    for (int masked = 0; masked < 2; masked++) {
      pb_build b;
      distd_tval *in[3] = {rand_val(shp(2, 5, 4), -2, 4),
                           make_vals(DIST_INT64, shp(2, 5, 1), lab),
                           make_vals(DIST_FLOAT32, shp(1, 5), mk)};
      Dist__V1__ProgramNode *n = one_node(&b, OP(CROSS_ENTROPY), 2 + masked, in);
      n->use_ignore_index = 1;
      n->ignore_index = -100;
      n->reduction = (Dist__V1__Reduction)red;
      check_grad(&b, in, 2 + masked, TOL);
      done(&b, in, 3);
    }
}

Test(grad, matmul_batched_broadcast_transposed_and_vectors) {
  struct { dist_shape a, b; int ta, tb; } cs[] = {
      {shp(2, 3, 4), shp(2, 4, 5), 0, 0},    {shp(2, 4, 3), shp(2, 4, 5), 1, 0},
      {shp(2, 3, 4), shp(2, 5, 4), 0, 1},    {shp(2, 4, 3), shp(2, 5, 4), 1, 1},
      {shp(3, 2, 3, 4), shp(2, 4, 5), 0, 0}, {shp(2, 3, 4), shp(3, 2, 4, 5), 0, 0},
      {shp(4, 2, 1, 3, 4), shp(3, 3, 4, 2), 0, 0}, {shp(1, 4), shp(2, 4, 5), 0, 0},
      {shp(3, 2, 3, 4), shp(1, 3), 1, 0},    {shp(1, 4), shp(1, 4), 0, 0},
  };
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    pb_build b;
    distd_tval *in[2] = {rand_val(cs[c].a, -1, 2), rand_val(cs[c].b, -1, 2)};
    Dist__V1__ProgramNode *n = one_node(&b, OP(MATMUL), 2, in);
    n->trans_a = cs[c].ta;
    n->trans_b = cs[c].tb;
    check_grad(&b, in, 2, TOL);
    done(&b, in, 2);
  }
}

Test(grad, reshape_transpose_slice_concat_cast) {
  pb_build b;
  distd_tval *in[3];
  Dist__V1__ProgramNode *n;

  in[0] = rand_val(shp(3, 2, 3, 4), -1, 2);
  one_node(&b, OP(RESHAPE), 1, in);
  pbb_shape(&b, 2, -1LL, 6LL);
  check_grad(&b, in, 1, TOL);
  done(&b, in, 1);

  in[0] = rand_val(shp(3, 2, 3, 4), -1, 2);
  one_node(&b, OP(TRANSPOSE), 1, in);
  pbb_perm(&b, 3, 1LL, 2LL, 0LL);
  check_grad(&b, in, 1, TOL);
  done(&b, in, 1);

  in[0] = rand_val(shp(2, 5, 6), -1, 2);
  one_node(&b, OP(SLICE), 1, in);
  pbb_axes(&b, 2, 0LL, 1LL);
  pbb_starts(&b, 2, 1LL, -1LL);
  pbb_ends(&b, 2, 5LL, -100LL);
  pbb_steps(&b, 2, 2LL, -2LL);
  check_grad(&b, in, 1, TOL);
  done(&b, in, 1);

  in[0] = rand_val(shp(2, 2, 3), -1, 2);
  in[1] = rand_val(shp(2, 2, 0), -1, 2);
  in[2] = rand_val(shp(2, 2, 2), -1, 2);
  n = one_node(&b, OP(CONCAT), 3, in);
  n->axis = -1;
  check_grad(&b, in, 3, TOL);
  done(&b, in, 3);

  in[0] = rand_val(shp(2, 2, 3), -1, 2);
  n = one_node(&b, OP(CAST), 1, in);
  n->dtype = DIST__V1__DTYPE__FLOAT64;
  check_grad(&b, in, 1, TOL);
  done(&b, in, 1);
}

Test(grad, set_slice_value_and_scalar) {
  pb_build b;
  distd_tval *in[2] = {rand_val(shp(2, 4, 5), -1, 2), rand_val(shp(1, 5), -1, 2)};
  one_node(&b, OP(SET_SLICE), 2, in);
  pbb_slice1(&b, 0, 1, 3);
  check_grad(&b, in, 2, TOL);
  done(&b, in, 2);

  distd_tval *x[1] = {rand_val(shp(1, 10), -1, 2)};
  Dist__V1__ProgramNode *n = one_node(&b, OP(SET_SLICE), 1, x);
  pbb_slice1(&b, 0, 4, 7);
  n->scalar = 1;
  check_grad(&b, x, 1, TOL);
  done(&b, x, 1);
}

Test(grad, topk_values) {
  for (int axis = -1; axis < 1; axis++)
    for (int smallest = 0; smallest < 2; smallest++) {
      pb_build b;
      distd_tval *in[1] = {rand_val(shp(2, 4, 6), -2, 4)};
      Dist__V1__ProgramNode *n = one_node(&b, OP(TOPK), 1, in);
      n->k = 2;
      n->axis = axis;
      n->smallest = smallest;
      check_grad(&b, in, 1, TOL);
      done(&b, in, 1);
    }
}

/* op over all of an [n] input of dtype dt filled with 0.5, backward from
 * the scalar: each input gradient must be `want` (relative tol), in dt. */
static void expect_uniform_grad(distd_op op, dist_dtype dt, int64_t n,
                                double want, double tol) {
  pb_build b;
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = 0.5;
  distd_tval *in[1] = {make_vals(dt, shp(1, (int)n), v)};
  free(v);
  one_node(&b, op, 1, in);
  distd_program *p = NULL;
  distd_invocation *inv = run_backward(&b, in, NULL, &p);
  distd_tval *g = distd_invocation_input_grad(inv, 0);
  cr_assert_eq(g->dtype, dt);
  for (int64_t i = 0; i < n; i++) {
    double gi = dist_elem_get(g->data, dt, (size_t)i);
    cr_assert(fabs(gi - want) <= tol * want, "grad[%lld] = %g, expected %g",
              (long long)i, gi, want);
  }
  distd_invocation_release(inv);
  distd_program_free(p);
  done(&b, in, 1);
}

/* a^b is 1 for every a when b = 0, so d/da is 0 there, also at a = 0
 * where b * a^(b-1) is 0 * inf (torch gives 0 as well). d/db = y log a,
 * taken as 0 at a = 0. By hand for a = [0, 0, 3], b = [0, 2, 0]. */
Test(grad, pow_with_exponent_0_has_gradient_0) {
  pb_build b;
  double av[3] = {0, 0, 3}, bv[3] = {0, 2, 0};
  distd_tval *in[2] = {make_vals(DIST_FLOAT64, shp(1, 3), av),
                       make_vals(DIST_FLOAT64, shp(1, 3), bv)};
  one_node(&b, OP(POW), 2, in);
  distd_tval *ones = NULL;
  dist_shape s3 = shp(1, 3);
  cr_assert_eq(distd_k_full(DIST_FLOAT64, &s3, 1, &ones, NULL), 0);
  distd_program *p = NULL;
  distd_invocation *inv = run_backward(&b, in, ones, &p);
  const double *ga = distd_invocation_input_grad(inv, 0)->data;
  const double *gb = distd_invocation_input_grad(inv, 1)->data;
  double want_a[3] = {0, 0, 0}, want_b[3] = {0, 0, log(3.0)};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(ga[i], want_a[i], "d/da[%d] = %g", i, ga[i]);
    cr_assert_float_eq(gb[i], want_b[i], 1e-15, "d/db[%d] = %g", i, gb[i]);
  }
  distd_tval_unref(ones);
  distd_invocation_release(inv);
  distd_program_free(p);
  done(&b, in, 2);
}

Test(grad, float32_input_gets_float32_gradient) {
  expect_uniform_grad(OP(SUM), DIST_FLOAT32, 3, 1.0, 0);
}

/* float16 tops out at 65504: the gradient of a mean over 70000 elements
 * is 1/70000 (float16 1.4305e-05), not g / inf = 0. */
Test(grad, float16_mean_of_more_elements_than_float16_counts) {
  expect_uniform_grad(OP(MEAN), DIST_FLOAT16, 70000, 1.0 / 70000, 2e-3);
}
