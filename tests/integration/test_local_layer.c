/* LocalLayer between real daemons: seed 000 through distctl launch, MoE
 * aux_loss and z_loss on 2- and 4-rank meshes against single-process
 * results computed here, gradients against analytic and finite-difference
 * references, and the errors a caller can provoke. */
#include <criterion/criterion.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"
#include "reply_hold.h"
#include "program.pb-c.h"

TestSuite(local_layer, .fini = stop_cluster);
TestSuite(local_layer_errors, .fini = stop_cluster);

/* ---------------------------------------------------------------- helpers */

/* Deterministic logits in [-2, 2). */
static void fill_logits(float *x, int n, unsigned seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    x[i] = (float)((seed >> 8) % 4096) / 1024.0f - 2.0f;
  }
}

static float *full_of(dist_client *c, const dist_tensor *t, size_t want_elems) {
  void *data = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &nbytes), 0, "full_tensor: %s",
               dist_errmsg(c));
  cr_assert_eq(nbytes, want_elems * sizeof(float));
  return data;
}

static void assert_close(double got, double want, double tol, const char *what) {
  cr_assert(fabs(got - want) <= tol * (1 + fabs(want)), "%s: got %.9g, want %.9g",
            what, got, want);
}

/* logits [T, E] as Shard(0) over a line mesh of W ranks. */
static dist_tensor *shard_logits(dist_client *c, const char *name,
                                 const float *x, int T, int E,
                                 const dist_mesh *m) {
  int64_t shape[2] = {T, E};
  dist_placement s0 = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_shard_tensor(c, name, x, DIST_FLOAT32, 2, shape, m, &s0, &t),
               0, "shard_tensor: %s", dist_errmsg(c));
  return t;
}

/* ---------------------------------------------------------------- seed 000 */

Test(local_layer, seed_000_masked_loss_prints_exactly, .timeout = 120) {
  const char *root = getenv("DIST_BUILD_ROOT");
  char cmd[2048], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "DIST_DISTD_BIN='%s' '%s' launch -n 2 -- '%s/examples/masked_loss'",
           harness_distd(), harness_distctl(), root ? root : "build");
  int rc = harness_run(cmd, &out, &err, 90);
  cr_assert_eq(rc, 0, "launch failed (%d): %s %s", rc, out ? out : "", err ? err : "");
  cr_assert_str_eq(out, "[Rank 0] local_loss=1.5\n"
                        "[Rank 1] local_loss=6.0\n"
                        "global_loss (distributed)=7.5\n");
  free(out);
  free(err);
}

/* The seed's layer, driven by a single client: forward per rank and the
 * gradient of each local loss, mask / sum(mask). */
Test(local_layer, masked_loss_gradient_is_mask_over_count, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  float pieces[2][10];
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 10; i++) pieces[r][i] = (float)(i + r);
  const void *pp[2] = {pieces[0], pieces[1]};
  int64_t shape[1] = {10};
  const int64_t *shapes[2] = {shape, shape};
  dist_placement s0 = DIST_SHARD_DIM(0), psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_tensor *x = NULL, *out = NULL, *grads[2] = {NULL, NULL};
  cr_assert_eq(dist_dtensor_from_local(c, "x", pp, DIST_FLOAT32, 1, shapes, m,
                                       &s0, &x), 0, "%s", dist_errmsg(c));
  dist_program *p = NULL;
  dist_program_new("masked", &p);
  int64_t ax[1] = {0}, a0[1] = {1}, b0[1] = {3}, a1[1] = {4}, b1[1] = {7};
  int in = dist_input_dtensor(p, "x", DIST_FLOAT32), rank = dist_input_rank(p);
  int z = dist_op_zeros_like(p, in);
  int mask = dist_op_where(p, dist_op_eq_scalar(p, rank, 0),
                           dist_op_set_slice(p, z, -1, 1, ax, a0, b0, NULL, 1),
                           dist_op_set_slice(p, z, -1, 1, ax, a1, b1, NULL, 1));
  int loss = dist_op_div(p, dist_op_sum(p, dist_op_mul(p, in, mask), NULL, 0, 0),
                         dist_op_sum(p, mask, NULL, 0, 0));
  dist_program_output(p, loss);
  dist_program_out_dist_attr(p, m, &psum, NULL);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  dist_arg args[2] = {{x, NULL}, {NULL, NULL}};
  dist_invocation *inv = NULL;
  cr_assert_eq(dist_local_layer_call(c, p, args, 2, NULL, &inv, &out), 0, "%s",
               dist_errmsg(c));
  float *g = full_of(c, out, 1);
  assert_close(g[0], 7.5, 1e-6, "global loss");
  free(g);
  const char *names[2] = {"x.grad", ""};
  dist_backward_opts bo = DIST_BACKWARD_OPTS_INIT;
  bo.grad_names = names;
  cr_assert_eq(dist_backward(c, inv, NULL, &bo, grads), 0, "%s", dist_errmsg(c));
  cr_assert_not_null(grads[0]);
  cr_assert_null(grads[1], "the rank input has no gradient");
  cr_assert_eq(dist_tensor_placements(grads[0])[0].kind, DIST_SHARD);
  float *dx = full_of(c, grads[0], 20);
  for (int i = 0; i < 20; i++) {
    int r = i / 10, j = i % 10;
    double want = r == 0 ? (j >= 1 && j < 3 ? 0.5 : 0) : (j >= 4 && j < 7 ? 1.0 / 3 : 0);
    assert_close(dx[i], want, 1e-6, "d loss / d x");
  }
  free(dx);
  dist_invocation_free(inv);
  dist_tensor_free(out);
  dist_tensor_free(grads[0]);
  dist_tensor_free(x);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* One call of a loss program on W daemons: float32 logits x [T, E]
 * (fill_logits of seed) as Shard(0) on a line mesh of W, the program made
 * for that mesh registered and called once. The test checks `out`, runs
 * the backward into `grad`, and loss_call_end frees it all and stops the
 * cluster. */
typedef struct loss_call {
  dist_client *c;
  dist_mesh *m;
  float *x;
  dist_tensor *t, *out, *grad;
  dist_program *p;
  dist_invocation *inv;
} loss_call;

/* Starts the cluster and puts the logits under name; the program comes
 * next, from lc->m (loss_call_run). */
static void loss_call_start(loss_call *lc, int W, const char *name, int T, int E,
                            unsigned seed) {
  memset(lc, 0, sizeof *lc);
  lc->c = harness_start_with_client(&cluster, W, NULL);
  lc->m = harness_line_mesh(W);
  lc->x = malloc(sizeof(float) * (size_t)(T * E));
  fill_logits(lc->x, T * E, seed);
  lc->t = shard_logits(lc->c, name, lc->x, T, E, lc->m);
}

/* Registers p (the loss_call then owns it) and calls it on the logits. */
static void loss_call_run(loss_call *lc, dist_program *p, const dist_call_opts *co) {
  lc->p = p;
  cr_assert_eq(dist_program_register(lc->c, p), 0, "%s", dist_errmsg(lc->c));
  dist_arg args[1] = {{lc->t, NULL}};
  cr_assert_eq(dist_local_layer_call(lc->c, p, args, 1, co, &lc->inv, &lc->out), 0, "%s",
               dist_errmsg(lc->c));
}

static void loss_call_end(loss_call *lc) {
  free(lc->x);
  dist_invocation_free(lc->inv);
  dist_tensor_free(lc->out), dist_tensor_free(lc->grad), dist_tensor_free(lc->t);
  dist_program_free(lc->p);
  dist_mesh_free(lc->m);
  dist_close(lc->c);
  stop_cluster();
}

/* ---------------------------------------------------------------- z_loss */

/* z_loss = mean(logsumexp(logits, -1)^2), per rank, Partial(avg). */
static dist_program *z_loss_program(const dist_mesh *m) {
  dist_program *p = NULL;
  dist_program_new("z_loss", &p);
  int x = dist_input_dtensor(p, "logits", DIST_FLOAT32);
  int lse = dist_op_logsumexp(p, x, -1, 0);
  int z = dist_op_mean(p, dist_op_mul(p, lse, lse), NULL, 0, 0);
  dist_placement avg = DIST_PARTIAL_OF(DIST_REDUCE_AVG);
  dist_program_output(p, z);
  dist_program_out_dist_attr(p, m, &avg, NULL);
  return p;
}

static double lse_row(const float *x, int E) {
  double mx = x[0], s = 0;
  for (int e = 1; e < E; e++) mx = fmax(mx, x[e]);
  for (int e = 0; e < E; e++) s += exp(x[e] - mx);
  return mx + log(s);
}

static void z_loss_case(int W) {
  enum { E = 8 };
  int T = 6 * W;
  loss_call lc;
  loss_call_start(&lc, W, "logits", T, E, 7u + (unsigned)W);
  loss_call_run(&lc, z_loss_program(lc.m), NULL);
  dist_client *c = lc.c;
  const float *x = lc.x;
  /* Single process: the mean over every token (equal chunks, so the
   * average of the per-rank means is the global mean). */
  double want = 0;
  for (int i = 0; i < T; i++) {
    double l = lse_row(&x[i * E], E);
    want += l * l / T;
  }
  float *got = full_of(c, lc.out, 1);
  assert_close(got[0], want, 1e-5, "z_loss");
  free(got);
  /* d local_z / d x[i][e] = 2 lse_i softmax_ie / T_local. */
  cr_assert_eq(dist_backward(c, lc.inv, NULL, NULL, &lc.grad), 0, "%s", dist_errmsg(c));
  float *dx = full_of(c, lc.grad, (size_t)(T * E));
  for (int i = 0; i < T; i++) {
    double l = lse_row(&x[i * E], E);
    for (int e = 0; e < E; e++)
      assert_close(dx[i * E + e], 2 * l * exp(x[i * E + e] - l) / (T / W), 1e-5,
                   "d z_loss / d logits");
  }
  free(dx);
  loss_call_end(&lc);
}

Test(local_layer, z_loss_on_2_ranks_matches_single_process, .timeout = 120) {
  z_loss_case(2);
}

Test(local_layer, z_loss_on_4_ranks_matches_single_process, .timeout = 120) {
  z_loss_case(4);
}

/* ---------------------------------------------------------------- aux_loss */

/* aux_loss = E * sum(me * ce): me the mean gate probability per expert, ce
 * the fraction of tokens whose top-1 expert it is, from this rank's tokens. */
static dist_program *aux_loss_program(const dist_mesh *m, int E) {
  dist_program *p = NULL;
  dist_program_new("aux_loss", &p);
  int64_t ax0[1] = {0}, flat[1] = {-1};
  int x = dist_input_dtensor(p, "gate_logits", DIST_FLOAT32);
  int probs = dist_op_softmax(p, x, -1);
  int me = dist_op_mean(p, probs, ax0, 1, 0);
  int vals = -1, idx = -1;
  dist_op_topk(p, probs, 1, -1, 0, &vals, &idx);
  int oh = dist_op_one_hot(p, dist_op_reshape(p, idx, flat, 1), E, DIST_FLOAT32);
  int ce = dist_op_mean(p, oh, ax0, 1, 0);
  int aux = dist_op_mul_scalar(p, dist_op_sum(p, dist_op_mul(p, me, ce), NULL, 0, 0), E);
  dist_placement avg = DIST_PARTIAL_OF(DIST_REDUCE_AVG);
  dist_program_output(p, aux);
  dist_program_out_dist_attr(p, m, &avg, NULL);
  return p;
}

/* The reference, in double, for rows x[0..T) of one rank. */
static double aux_ref(const double *x, int T, int E) {
  double me[16] = {0}, ce[16] = {0}, s = 0;
  for (int i = 0; i < T; i++) {
    const double *r = &x[i * E];
    double mx = r[0], z = 0;
    int best = 0;
    for (int e = 1; e < E; e++)
      if (r[e] > r[best]) best = e;
    mx = r[best];
    for (int e = 0; e < E; e++) z += exp(r[e] - mx);
    for (int e = 0; e < E; e++) me[e] += exp(r[e] - mx) / z / T;
    ce[best] += 1.0 / T;
  }
  for (int e = 0; e < E; e++) s += me[e] * ce[e];
  return E * s;
}

static void aux_loss_case(int W) {
  enum { E = 4 };
  int T = 5 * W, n = T * E, Tl = T / W;
  loss_call lc;
  loss_call_start(&lc, W, "gate", T, E, 99u + (unsigned)W);
  dist_call_opts co = DIST_CALL_OPTS_INIT;
  co.keep_local_values = 1;
  loss_call_run(&lc, aux_loss_program(lc.m, E), &co);
  dist_client *c = lc.c;
  double *xd = malloc(sizeof(double) * (size_t)n);
  for (int i = 0; i < n; i++) xd[i] = lc.x[i];
  double want = 0;
  for (int r = 0; r < W; r++) {
    double local = aux_ref(&xd[r * Tl * E], Tl, E);
    dist_value v;
    cr_assert_eq(dist_invocation_local_output(lc.inv, 0, r, &v), 0);
    assert_close(*(const float *)v.data, local, 1e-5, "local aux_loss");
    want += local / W;
  }
  float *got = full_of(c, lc.out, 1);
  assert_close(got[0], want, 1e-5, "aux_loss");
  free(got);
  /* Gradient of each rank's local aux_loss against central differences of
   * the reference (the top-1 choice is piecewise constant). */
  cr_assert_eq(dist_backward(c, lc.inv, NULL, NULL, &lc.grad), 0, "%s", dist_errmsg(c));
  float *dx = full_of(c, lc.grad, (size_t)n);
  const double h_ = 1e-4;
  for (int i = 0; i < n; i++) {
    int r = i / (Tl * E);
    double *rx = &xd[r * Tl * E], keep = xd[i];
    xd[i] = keep + h_;
    double up = aux_ref(rx, Tl, E);
    xd[i] = keep - h_;
    double down = aux_ref(rx, Tl, E);
    xd[i] = keep;
    assert_close(dx[i], (up - down) / (2 * h_), 2e-3, "d aux_loss / d logits");
  }
  free(dx);
  free(xd);
  loss_call_end(&lc);
}

Test(local_layer, aux_loss_on_2_ranks_matches_single_process, .timeout = 120) {
  aux_loss_case(2);
}

Test(local_layer, aux_loss_on_4_ranks_matches_single_process, .timeout = 120) {
  aux_loss_case(4);
}

/* ---------------------------------------------------------------- outputs */

/* A local row sum whose output is Shard(0): the daemons exchange local
 * shapes to derive the (uneven) global shape, and refuse pieces that break
 * the split rule. */
static dist_program *sharded_program(const dist_mesh *m, int flatten) {
  dist_program *p = NULL;
  dist_program_new(flatten ? "flatten" : "row_sum", &p);
  int64_t flat[1] = {-1}, ax1[1] = {1};
  int in = dist_input_dtensor(p, "rows", DIST_FLOAT32);
  int y = flatten ? dist_op_reshape(p, in, flat, 1) : dist_op_sum(p, in, ax1, 1, 0);
  dist_placement s0 = DIST_SHARD_DIM(0);
  dist_program_output(p, dist_op_mul_scalar(p, y, 2));
  dist_program_out_dist_attr(p, m, &s0, NULL);
  return p;
}

Test(local_layer, sharded_output_derives_uneven_global_shape, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  float x[7 * 2];
  for (int i = 0; i < 14; i++) x[i] = (float)i;
  dist_tensor *t = shard_logits(c, "rows", x, 7, 2, m), *out = NULL;
  dist_program *p = sharded_program(m, 0);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  dist_arg args[1] = {{t, NULL}};
  dist_invocation *inv = NULL;
  dist_call_opts co = DIST_CALL_OPTS_INIT;
  co.no_grad = 1;
  cr_assert_eq(dist_local_layer_call(c, p, args, 1, &co, &inv, &out), 0, "%s",
               dist_errmsg(c));
  cr_assert_eq(dist_tensor_ndim(out), 1);
  cr_assert_eq(dist_tensor_shape(out)[0], 7, "4 + 3 local rows");
  float *g = full_of(c, out, 7);
  for (int i = 0; i < 7; i++) cr_assert_float_eq(g[i], 2.0f * (4 * i + 1), 1e-5);
  free(g);
  dist_invocation_free(inv);
  dist_tensor_free(out);
  dist_program_free(p);
  /* Flattened, the pieces are 8 and 6 elements: not a ceil split of 14. */
  p = sharded_program(m, 1);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_local_layer_call(c, p, args, 1, &co, &inv, &out), DIST_EMISMATCH);
  cr_assert(strstr(dist_errmsg(c), "rank 0 made [8], but global shape [14] "
                   "gives it [7]"), "%s", dist_errmsg(c));
  cr_assert_null(out);
  dist_tensor **all = NULL;
  int n = 0;
  cr_assert_eq(dist_tensor_list(c, &all, &n), 0, "%s", dist_errmsg(c));
  for (int i = 0; i < n; i++)
    cr_assert(strncmp(dist_tensor_name(all[i]), "flatten.", 8) != 0,
              "a refused output was left behind: %s", dist_tensor_name(all[i]));
  dist_tensor_list_free(all, n);
  dist_tensor_free(t);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* VALUE inputs differ per rank; gradients of given output gradients. */
Test(local_layer, value_inputs_and_given_output_gradients, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  dist_program *p = NULL;
  dist_program_new("scale", &p);
  int w = dist_input_value(p, "w", DIST_FLOAT32);
  dist_placement s0 = DIST_SHARD_DIM(0);
  dist_program_output(p, dist_op_mul(p, w, w));
  dist_program_out_dist_attr(p, m, &s0, NULL);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_program_nranks(p), 2);
  float w0[3] = {1, 2, 3}, w1[3] = {4, 5, 6}, g0[3] = {1, 1, 1}, g1[3] = {2, 2, 2};
  dist_value vals[2] = {{w0, DIST_FLOAT32, 1, {3}}, {w1, DIST_FLOAT32, 1, {3}}};
  dist_value gvals[2] = {{g0, DIST_FLOAT32, 1, {3}}, {g1, DIST_FLOAT32, 1, {3}}};
  dist_arg args[1] = {{NULL, vals}}, og[1] = {{NULL, gvals}};
  dist_invocation *inv = NULL;
  dist_tensor *out = NULL, *grad = NULL;
  cr_assert_eq(dist_local_layer_call(c, p, args, 1, NULL, &inv, &out), 0, "%s",
               dist_errmsg(c));
  float *y = full_of(c, out, 6);
  for (int i = 0; i < 6; i++) cr_assert_float_eq(y[i], (float)((i + 1) * (i + 1)), 1e-6);
  free(y);
  dist_backward_opts bo = DIST_BACKWARD_OPTS_INIT;
  bo.keep_local_values = 1;
  cr_assert_eq(dist_backward(c, inv, og, &bo, &grad), 0, "%s", dist_errmsg(c));
  cr_assert_null(grad, "a VALUE input's gradient is not stored");
  for (int r = 0; r < 2; r++) {
    dist_value gv;
    cr_assert_eq(dist_invocation_local_grad(inv, 0, r, &gv), 0);
    const float *wv = r ? w1 : w0, *gg = r ? g1 : g0;
    for (int i = 0; i < 3; i++)
      cr_assert_float_eq(((const float *)gv.data)[i], 2 * wv[i] * gg[i], 1e-6);
  }
  dist_invocation_free(inv);
  dist_tensor_free(out);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* ---------------------------------------------------------------- errors */

typedef struct err_fixture {
  dist_client *c;
  dist_mesh *m;
  dist_tensor *x; /* float32 [4, 3], Shard(0) on [0, 1] */
  dist_tensor *xi; /* int64 [4], Shard(0) */
} err_fixture;

static void err_setup(err_fixture *f) {
  f->c = harness_start_with_client(&cluster, 2, NULL);
  f->m = harness_line_mesh(2);
  float x[12] = {0};
  int64_t xi[4] = {1, 2, 3, 4}, s1[1] = {4};
  f->x = shard_logits(f->c, "x", x, 4, 3, f->m);
  dist_placement s0 = DIST_SHARD_DIM(0);
  cr_assert_eq(dist_shard_tensor(f->c, "xi", xi, DIST_INT64, 1, s1, f->m, &s0,
                                 &f->xi), 0);
}

static void err_teardown(err_fixture *f) {
  dist_tensor_free(f->x);
  dist_tensor_free(f->xi);
  dist_mesh_free(f->m);
  dist_close(f->c);
  stop_cluster();
}

/* Builds y = op(x) with one Partial(sum) output and calls it on arg. */
static int call_one(err_fixture *f, dist_program *p, int out_value,
                    const dist_tensor *arg, dist_invocation **inv) {
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_program_output(p, out_value);
  dist_program_out_dist_attr(p, f->m, &psum, NULL);
  int rc = dist_program_register(f->c, p);
  if (rc) return rc;
  dist_arg args[1] = {{arg, NULL}};
  dist_tensor *out = NULL;
  rc = dist_local_layer_call(f->c, p, args, 1, NULL, inv, &out);
  dist_tensor_free(out);
  return rc;
}

/* p (new, its TTL set if wanted) made sum(x) and called on f->x; the
 * invocation, which backward can use until released. */
static dist_invocation *call_sum_of_x(err_fixture *f, dist_program *p) {
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  dist_invocation *inv = NULL;
  cr_assert_eq(call_one(f, p, dist_op_sum(p, x, NULL, 0, 0), f->x, &inv), 0,
               "%s", dist_errmsg(f->c));
  return inv;
}

/* call_one is refused with code, and the message names what and detail. */
static void expect_call_refused(err_fixture *f, dist_program *p, int out_value,
                                const dist_tensor *arg, int code,
                                const char *what, const char *detail) {
  dist_invocation *inv = NULL;
  cr_assert_eq(call_one(f, p, out_value, arg, &inv), code, "%s", dist_errmsg(f->c));
  cr_assert(strstr(dist_errmsg(f->c), what), "%s", dist_errmsg(f->c));
  cr_assert(strstr(dist_errmsg(f->c), detail), "%s", dist_errmsg(f->c));
  cr_assert_null(inv);
}

Test(local_layer_errors, output_count_mismatch_names_both_counts, .timeout = 120) {
  err_fixture f;
  err_setup(&f);
  dist_program *p = NULL;
  dist_program_new("two_attrs", &p);
  int x = dist_input_dtensor(&*p, "x", DIST_FLOAT32);
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_program_output(p, dist_op_sum(p, x, NULL, 0, 0));
  dist_program_out_dist_attr(p, f.m, &psum, NULL);
  dist_program_out_dist_attr(p, f.m, &psum, NULL);
  cr_assert_eq(dist_program_register(f.c, p), DIST_EMISMATCH);
  cr_assert(strstr(dist_errmsg(f.c), "1 outputs but 2 out_dist_attrs"), "%s",
            dist_errmsg(f.c));
  dist_program_free(p);
  err_teardown(&f);
}

Test(local_layer_errors, wrong_dtype_names_the_op_and_its_position, .timeout = 120) {
  err_fixture f;
  err_setup(&f);
  dist_program *p = NULL;
  dist_program_new("mixed", &p);
  int xi = dist_input_dtensor(p, "xi", DIST_DTYPE_INVALID);
  int half = dist_op_full_like(p, dist_op_cast(p, xi, DIST_FLOAT32), 0.5);
  int bad = dist_op_add(p, xi, half); /* int64 + float32 */
  expect_call_refused(&f, p, dist_op_sum(p, bad, NULL, 0, 0), f.xi, DIST_EMISMATCH,
                      "node 2 (add)", "int64 vs float32");
  dist_program_free(p);
  dist_invocation *inv = NULL;
  /* A declared input dtype is checked too. */
  dist_program_new("typed", &p);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  cr_assert_neq(call_one(&f, p, dist_op_sum(p, x, NULL, 0, 0), f.xi, &inv), 0);
  cr_assert(strstr(dist_errmsg(f.c), "input 0"), "%s", dist_errmsg(f.c));
  cr_assert(strstr(dist_errmsg(f.c), "int64"), "%s", dist_errmsg(f.c));
  dist_program_free(p);
  err_teardown(&f);
}

Test(local_layer_errors, wrong_shape_names_the_op_and_its_position, .timeout = 120) {
  err_fixture f;
  err_setup(&f);
  dist_program *p = NULL;
  dist_program_new("mm", &p);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  int y = dist_op_matmul(p, x, x, 0, 0); /* [2, 3] x [2, 3] locally */
  dist_op_set_label(p, y, "scores");
  dist_invocation *inv = NULL;
  cr_assert_neq(call_one(&f, p, dist_op_sum(p, y, NULL, 0, 0), f.x, &inv), 0);
  cr_assert(strstr(dist_errmsg(f.c), "node 0 (matmul 'scores')"), "%s",
            dist_errmsg(f.c));
  cr_assert(strstr(dist_errmsg(f.c), "[2, 3]"), "%s", dist_errmsg(f.c));
  cr_assert_null(inv);
  dist_program_free(p);
  err_teardown(&f);
}

/* A body that fails on one rank only (its piece cannot take the shape):
 * the others said only "rank 1 failed its part of the invocation
 * (EMISMATCH)", and the caller, reading rank 0's answer, learned no more.
 * The reason now travels with the verdict. */
Test(local_layer_errors, a_body_failing_on_one_rank_says_why_on_every_rank, .timeout = 120) {
  err_fixture f;
  err_setup(&f);
  float odd[9] = {0};
  dist_tensor *x3 = shard_logits(f.c, "odd", odd, 3, 3, f.m); /* pieces [2,3], [1,3] */
  dist_program *p = NULL;
  dist_program_new("reshaper", &p);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  int64_t two_by_three[2] = {2, 3};
  dist_program_output(p, dist_op_reshape(p, x, two_by_three, 2));
  dist_placement s0 = DIST_SHARD_DIM(0);
  dist_program_out_dist_attr(p, f.m, &s0, NULL);
  cr_assert_eq(dist_program_register(f.c, p), 0, "%s", dist_errmsg(f.c));
  dist_arg args[1] = {{x3, NULL}};
  dist_invocation *inv = NULL;
  dist_tensor *out = NULL;
  int rc = dist_local_layer_call(f.c, p, args, 1, NULL, &inv, &out);
  cr_assert_neq(rc, 0);
  cr_assert(strstr(dist_errmsg(f.c), "reshape"), "%s", dist_errmsg(f.c));
  cr_assert_null(inv);
  dist_program_free(p);
  dist_tensor_free(x3);
  err_teardown(&f);
}

Test(local_layer_errors, invoke_with_unknown_handle_is_not_found, .timeout = 120) {
  err_fixture f;
  err_setup(&f);
  Dist__V1__ProgramInvokeRequest rq = DIST__V1__PROGRAM_INVOKE_REQUEST__INIT;
  rq.handle = 987654;
  rq.op_id = 1;
  ProtobufCMessage *rp = NULL;
  int rc = dist_call_one(f.c, 0, "/dist.v1.LocalLayer/Invoke", &rq.base,
                         &dist__v1__program_invoke_reply__descriptor, &rp);
  cr_assert_eq(rc, DIST_ENOTFOUND, "%s", dist_errmsg(f.c));
  cr_assert(strstr(dist_errmsg(f.c), "unknown program handle 987654"), "%s",
            dist_errmsg(f.c));
  cr_assert_null(rp);
  /* And through the library: a program released is not callable. */
  dist_program *p = NULL;
  dist_program_new("gone", &p);
  dist_invocation *inv = call_sum_of_x(&f, p);
  dist_invocation_free(inv);
  cr_assert_eq(dist_program_unregister(f.c, p), 0, "%s", dist_errmsg(f.c));
  dist_arg args[1] = {{f.x, NULL}};
  dist_tensor *out = NULL;
  cr_assert_eq(dist_local_layer_call(f.c, p, args, 1, NULL, &inv, &out), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(f.c), "not registered"), "%s", dist_errmsg(f.c));
  dist_program_free(p);
  err_teardown(&f);
}

Test(local_layer_errors, backward_after_release_is_a_clear_error, .timeout = 120) {
  err_fixture f;
  err_setup(&f);
  dist_program *p = NULL;
  dist_program_new("released", &p);
  dist_invocation *inv = call_sum_of_x(&f, p);
  cr_assert_eq(dist_invocation_release(f.c, inv), 0, "%s", dist_errmsg(f.c));
  dist_tensor *g = NULL;
  cr_assert_eq(dist_backward(f.c, inv, NULL, NULL, &g), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(f.c), "is not kept on this daemon"), "%s",
            dist_errmsg(f.c));
  cr_assert(strstr(dist_errmsg(f.c), "released"), "%s", dist_errmsg(f.c));
  cr_assert_null(g);
  /* Backward runs once: a second one finds nothing kept. */
  dist_invocation_free(inv);
  inv = NULL;
  dist_arg args[1] = {{f.x, NULL}};
  dist_tensor *out = NULL;
  cr_assert_eq(dist_local_layer_call(f.c, p, args, 1, NULL, &inv, &out), 0);
  cr_assert_eq(dist_backward(f.c, inv, NULL, NULL, &g), 0, "%s", dist_errmsg(f.c));
  dist_tensor_free(g);
  g = NULL;
  cr_assert_eq(dist_backward(f.c, inv, NULL, NULL, &g), DIST_ENOTFOUND);
  dist_invocation_free(inv);
  dist_tensor_free(out);
  dist_program_free(p);
  err_teardown(&f);
}

/* A release sent to each daemon of the call that fails on one says which:
 * a later daemon's success must not clear the first failure's message. */
Test(local_layer_errors, a_release_failing_on_one_daemon_names_it, .timeout = 120) {
  err_fixture f;
  err_setup(&f);
  dist_program *p = NULL;
  dist_program_new("released_on_one", &p);
  dist_invocation *inv = call_sum_of_x(&f, p);
  cr_assert_neq(harness_kill(&cluster, 0, SIGKILL), -1);
  cr_assert_neq(dist_invocation_release(f.c, inv), 0, "a release without rank 0 succeeded");
  cr_assert(strstr(dist_errmsg(f.c), "rank 0"), "message: '%s'", dist_errmsg(f.c));
  dist_invocation_free(inv);
  dist_program_free(p);
  err_teardown(&f);
}

Test(local_layer_errors, builder_errors_are_sticky_and_reported_at_register,
     .timeout = 60) {
  dist_program *p = NULL;
  cr_assert_eq(dist_program_new("sticky", &p), 0);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  cr_assert_lt(dist_op_add(p, x, 42), 0);
  cr_assert_lt(dist_op_exp(p, x), 0, "later calls fail too");
  cr_assert(strstr(dist_program_errmsg(p), "value 42"), "%s", dist_program_errmsg(p));
  dist_client *c = NULL;
  cr_assert_eq(dist_connect("127.0.0.1:1", NULL, &c), 0);
  cr_assert_eq(dist_program_register(c, p), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "program 'sticky'"), "%s", dist_errmsg(c));
  dist_close(c);
  dist_program_free(p);
  dist_program_free(NULL);
  dist_invocation_free(NULL);
}

/* numpy and Paddle refuse arange(0, 10, 0); the daemons took step 0 as 1
 * and returned 0..9. */
Test(local_layer_errors, arange_of_step_0_is_refused_at_register, .timeout = 120) {
  err_fixture f;
  err_setup(&f);
  dist_program *p = NULL;
  dist_program_new("arange0", &p);
  dist_input_dtensor(p, "x", DIST_FLOAT32);
  expect_call_refused(&f, p, dist_op_arange(p, 0, 10, 0, DIST_FLOAT32), f.x,
                      DIST_EINVAL, "node 0 (arange)", "step is 0");
  dist_program_free(p);
  /* A step that is not 0 still runs: [0, 3, 6, 9] on each of the 2 ranks,
   * read back as their Partial(sum). */
  dist_program_new("arange3", &p);
  dist_input_dtensor(p, "x", DIST_FLOAT32);
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_program_output(p, dist_op_arange(p, 0, 10, 3, DIST_FLOAT32));
  dist_program_out_dist_attr(p, f.m, &psum, NULL);
  cr_assert_eq(dist_program_register(f.c, p), 0, "%s", dist_errmsg(f.c));
  dist_arg args[1] = {{f.x, NULL}};
  dist_tensor *out = NULL;
  dist_invocation *inv = NULL;
  cr_assert_eq(dist_local_layer_call(f.c, p, args, 1, NULL, &inv, &out), 0, "%s",
               dist_errmsg(f.c));
  float *got = full_of(f.c, out, 4);
  for (int i = 0; i < 4; i++) cr_expect_eq(got[i], 2.0f * (float)(3 * i), "elem %d", i);
  free(got);
  dist_tensor_free(out);
  dist_invocation_free(inv);
  dist_program_free(p);
  err_teardown(&f);
}

/* The generic builders used to take any op kind: dist_op_reduce of kind add
 * ran as add(x, 0) and returned x unchanged. */
Test(local_layer_errors, generic_builders_refuse_an_op_of_another_family,
     .timeout = 60) {
  struct {
    const char *builder;
    dist_op_kind kind;
  } cases[] = {
      {"dist_op_reduce", DIST_OP_ADD},    {"dist_op_reduce", DIST_OP_EXP},
      {"dist_op_unary", DIST_OP_ADD},     {"dist_op_unary", DIST_OP_SUM},
      {"dist_op_binary", DIST_OP_EXP},    {"dist_op_binary", DIST_OP_WHERE},
      {"dist_op_binary_scalar", DIST_OP_EXP}, {"dist_op_binary_scalar", DIST_OP_MAX},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dist_program *p = NULL;
    cr_assert_eq(dist_program_new("family", &p), 0);
    int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
    const char *b = cases[i].builder;
    dist_op_kind k = cases[i].kind;
    int id = !strcmp(b, "dist_op_reduce")  ? dist_op_reduce(p, k, x, NULL, 0, 0)
             : !strcmp(b, "dist_op_unary") ? dist_op_unary(p, k, x)
             : !strcmp(b, "dist_op_binary") ? dist_op_binary(p, k, x, x)
                                            : dist_op_binary_scalar(p, k, x, 2.0, 0);
    cr_expect_eq(id, DIST_EINVAL, "%s of kind %d", b, (int)k);
    char want[64];
    snprintf(want, sizeof want, "%s: op kind %d is not", b, (int)k);
    cr_expect(strstr(dist_program_errmsg(p), want), "%s", dist_program_errmsg(p));
    dist_program_free(p);
  }
  /* Each family's own kinds still build. */
  dist_program *p = NULL;
  cr_assert_eq(dist_program_new("family", &p), 0);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  cr_expect_geq(dist_op_reduce(p, DIST_OP_MEAN, x, NULL, 0, 0), 0);
  cr_expect_geq(dist_op_unary(p, DIST_OP_TANH, x), 0);
  cr_expect_geq(dist_op_unary(p, DIST_OP_LOGICAL_NOT, x), 0);
  cr_expect_geq(dist_op_binary(p, DIST_OP_LOGICAL_OR, x, x), 0);
  cr_expect_geq(dist_op_binary_scalar(p, DIST_OP_MINIMUM, x, 1.0, 1), 0);
  cr_expect_str_empty(dist_program_errmsg(p));
  dist_program_free(p);
}

/* A negative count was taken as 0 (reshape to a scalar, transpose
 * reversing every dim, a slice of nothing), and concat's overran the heap. */
Test(local_layer_errors, builders_refuse_negative_counts, .timeout = 60) {
  static const char *const builders[] = {
      "dist_op_concat", "dist_op_reshape", "dist_op_transpose", "dist_op_slice",
      "dist_op_set_slice", "dist_op_full", "dist_op_constant", "dist_op_reduce"};
  int64_t dims[1] = {1};
  double one = 1;
  for (int i = 0; i < (int)(sizeof builders / sizeof builders[0]); i++) {
    dist_program *p = NULL;
    cr_assert_eq(dist_program_new("counts", &p), 0);
    int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
    int id = i == 0   ? dist_op_concat(p, &x, -1, 0)
             : i == 1 ? dist_op_reshape(p, x, dims, -1)
             : i == 2 ? dist_op_transpose(p, x, dims, -1)
             : i == 3 ? dist_op_slice(p, x, dims, dims, dims, NULL, -1)
             : i == 4 ? dist_op_set_slice(p, x, -1, 0, dims, dims, dims, NULL, -1)
             : i == 5 ? dist_op_full(p, DIST_FLOAT32, dims, -1, 0)
             : i == 6 ? dist_op_constant(p, DIST_FLOAT32, dims, -1, &one, 1)
                      : dist_op_reduce(p, DIST_OP_SUM, x, dims, -1, 0);
    cr_expect_eq(id, DIST_EINVAL, "%s", builders[i]);
    cr_expect(strstr(dist_program_errmsg(p), builders[i]) &&
              strstr(dist_program_errmsg(p), "-1"), "%s: '%s'", builders[i],
              dist_program_errmsg(p));
    dist_program_free(p);
  }
}

/* What backward needs expires with the program's invocation TTL. */
Test(local_layer_errors, kept_invocations_expire_after_the_ttl, .timeout = 120) {
  err_fixture f;
  err_setup(&f);
  dist_program *p = NULL;
  dist_program_new("expiring", &p);
  cr_assert_eq(dist_program_set_invocation_ttl(p, 1.0), 0);
  dist_invocation *inv = call_sum_of_x(&f, p);
  struct timespec ts = {1, 600000000};
  nanosleep(&ts, NULL);
  dist_tensor *g = NULL;
  cr_assert_eq(dist_backward(f.c, inv, NULL, NULL, &g), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(f.c), "expired"), "%s", dist_errmsg(f.c));
  dist_invocation_free(inv);
  dist_program_free(p);
  err_teardown(&f);
}

/* Two daemons, rank 1 behind a relay whose every reply from the first
 * call on is held (rank 1 silent); x on both, a doubler registered. */
typedef struct {
  dist_client *c;
  reply_hold *relay;
  dist_tensor *x;
  dist_program *p;
} silent_rank_1;

static void silent_rank_1_start(silent_rank_1 *s, int deadline_ms) {
  s->relay = reply_hold_cluster(&cluster, 2, 1, deadline_ms, &s->c);
  static const double x0[4] = {1.5, -2, 0.25, 8};
  int64_t n4 = 4;
  s->x = harness_put(s->c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()");
  s->p = harness_doubler(1);
  cr_assert_eq(dist_program_register(s->c, s->p), 0, "%s", dist_errmsg(s->c));
  reply_hold_from_call(s->relay, 1);
}

/* After the test closed s->c. */
static void silent_rank_1_stop(silent_rank_1 *s) {
  reply_hold_release(s->relay);
  dist_tensor_free(s->x);
  dist_program_free(s->p);
  reply_hold_cluster_stop(&cluster, s->relay, NULL);
}

/* Two calls whose replies from rank 1 a relay holds, rank 1 still silent
 * when the client closes: the client's list holds each call's invocation
 * and output on rank 1 (four items), and the close asks rank 1 once,
 * waits out one deadline, and leaves the rest untried. Before, each item
 * waited out a deadline of its own: 4 at the close, 2 at the second
 * call's own undo. */
Test(local_layer, a_silent_daemon_costs_the_close_one_deadline_not_one_per_item,
     .timeout = 120) {
  enum { DEADLINE_MS = 2000 };
  silent_rank_1 s;
  silent_rank_1_start(&s, DEADLINE_MS);
  dist_arg arg = {s.x, NULL};
  for (int i = 0; i < 2; i++) {
    dist_invocation *inv = NULL;
    dist_tensor *y = NULL;
    cr_assert_lt(dist_local_layer_call(s.c, s.p, &arg, 1, NULL, &inv, &y), 0,
                 "call %d succeeded with rank 1's replies held", i);
  }
  cr_assert_eq(s.c->later.n, 4, "the list holds %d items, not each call's invocation and output",
               s.c->later.n);
  double t0 = harness_now_s();
  dist_close(s.c);
  double took = harness_now_s() - t0;
  cr_expect_lt(took, 2.5 * DEADLINE_MS / 1000.0,
               "the close took %.1f s against a deadline of %.1f s", took, DEADLINE_MS / 1000.0);
  silent_rank_1_stop(&s);
}

/* A call refused for its arguments is answered at once, the client's list
 * of what to undo on a silent daemon left for a call that goes ahead:
 * refused by the count of its arguments, or by an argument the request's
 * making checks (a tensor input given values only). Before, the refused
 * call ran the undo pass first and waited out rank 1's deadline for an
 * answer it did not need (the second kind, until a reviewer's find). */
Test(local_layer, a_call_with_bad_arguments_skips_the_undo_of_a_silent_daemon,
     .timeout = 120) {
  enum { DEADLINE_MS = 2000 };
  silent_rank_1 s;
  silent_rank_1_start(&s, DEADLINE_MS);
  dist_arg args[2] = {{s.x, NULL}, {s.x, NULL}};
  dist_invocation *inv = NULL;
  dist_tensor *y = NULL;
  cr_assert_lt(dist_local_layer_call(s.c, s.p, args, 1, NULL, &inv, &y), 0);
  cr_assert_eq(s.c->later.n, 2, "the list holds %d items, not the invocation and output",
               s.c->later.n);
  static const double two[2] = {1, 2};
  dist_value per_rank[2] = {{two, DIST_FLOAT64, 0, {0}}, {two + 1, DIST_FLOAT64, 0, {0}}};
  dist_arg values_only = {NULL, per_rank};
  struct {
    const dist_arg *args;
    int nargs;
    const char *says;
  } refused[] = {{args, 2, "takes 1 inputs, 2 arguments given"},
                 {&values_only, 1, "input 0 needs a dist_tensor"}};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    double t0 = harness_now_s();
    cr_expect_eq(dist_local_layer_call(s.c, s.p, refused[i].args, refused[i].nargs, NULL, &inv,
                                       &y),
                 DIST_EINVAL, "%s", refused[i].says);
    double took = harness_now_s() - t0;
    cr_expect(strstr(dist_errmsg(s.c), refused[i].says), "'%s', not '%s'", dist_errmsg(s.c),
              refused[i].says);
    cr_expect_lt(took, 0.25 * DEADLINE_MS / 1000.0,
                 "the call refused with '%s' took %.1f s against a deadline of %.1f s",
                 refused[i].says, took, DEADLINE_MS / 1000.0);
    cr_expect_eq(s.c->later.n, 2, "the refused call changed the list to %d items",
                 s.c->later.n);
  }
  dist_close(s.c);
  silent_rank_1_stop(&s);
}
