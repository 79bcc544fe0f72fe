/* Expert shards and the MoE layer between real daemons: the experts' FFN
 * forward and backward (gelu and silu, with and without biases, experts
 * that get no rows) against a reference computed here; the whole layer in
 * SPMD (one trainer thread per rank) and single-client mode against the
 * same layer computed in one process; token counts per expert; an
 * optimizer step through the parameter service; and the example under
 * distctl launch. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"
#include "moe.pb-c.h"

TestSuite(moe_layer, .fini = stop_cluster);
TestSuite(experts, .fini = stop_cluster);

/* ---------------------------------------------------------------- the reference */

typedef struct model {
  int W, E, NE, K, bias, silu;
  int64_t dm, dh;
  double *gate;              /* [dm, NE] */
  double *w1, *b1, *w2, *b2; /* expert k at k*dm*dh, k*dh, k*dh*dm, k*dm */
} model;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(double a) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return ((double)(rng_state >> 11) * 0x1.0p-53 * 2 - 1) * a;
}

static double *rand_vec(size_t n, double a) {
  double *v = malloc(n * sizeof *v + 8);
  for (size_t i = 0; i < n; i++) v[i] = uniform(a);
  return v;
}

static double *zeros(size_t n) { return calloc(n + 1, sizeof(double)); }

static model model_new(int W, int E, int K, int64_t dm, int64_t dh, int bias, int silu) {
  model m = {W, E, W * E, K, bias, silu, dm, dh, NULL, NULL, NULL, NULL, NULL};
  size_t NE = (size_t)m.NE;
  m.gate = rand_vec((size_t)dm * NE, 1.0);
  m.w1 = rand_vec(NE * (size_t)(dm * dh), 1 / sqrt((double)dm));
  m.w2 = rand_vec(NE * (size_t)(dh * dm), 1 / sqrt((double)dh));
  m.b1 = bias ? rand_vec(NE * (size_t)dh, 0.2) : zeros(NE * (size_t)dh);
  m.b2 = bias ? rand_vec(NE * (size_t)dm, 0.2) : zeros(NE * (size_t)dm);
  return m;
}

/* Gradients of the same shapes. */
static model grads_new(const model *m) {
  model g = *m;
  size_t NE = (size_t)m->NE;
  g.gate = zeros((size_t)m->dm * NE);
  g.w1 = zeros(NE * (size_t)(m->dm * m->dh));
  g.w2 = zeros(NE * (size_t)(m->dh * m->dm));
  g.b1 = zeros(NE * (size_t)m->dh);
  g.b2 = zeros(NE * (size_t)m->dm);
  return g;
}

static void model_free(model *m) {
  free(m->gate), free(m->w1), free(m->b1), free(m->w2), free(m->b2);
}

static double act(const model *m, double x) {
  return m->silu ? x / (1 + exp(-x)) : 0.5 * x * (1 + erf(x / sqrt(2.0)));
}

static double act_grad(const model *m, double x) {
  if (m->silu) {
    double s = 1 / (1 + exp(-x));
    return s * (1 + x * (1 - s));
  }
  return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}

/* Expert k on one row x: h, a (d_hidden) and o (d_model). */
static void ffn_row(const model *m, int k, const double *x, double *h, double *a, double *o) {
  const double *w1 = m->w1 + k * m->dm * m->dh, *w2 = m->w2 + k * m->dh * m->dm;
  for (int64_t j = 0; j < m->dh; j++) {
    h[j] = m->b1[k * m->dh + j];
    for (int64_t d = 0; d < m->dm; d++) h[j] += x[d] * w1[d * m->dh + j];
    a[j] = act(m, h[j]);
  }
  for (int64_t d = 0; d < m->dm; d++) {
    o[d] = m->b2[k * m->dm + d];
    for (int64_t j = 0; j < m->dh; j++) o[d] += a[j] * w2[j * m->dm + d];
  }
}

/* Its backward given dO: adds to g (expert k) and to dx. */
static void ffn_row_back(const model *m, int k, const double *x, const double *h,
                         const double *a, const double *dout, model *g, double *dx) {
  const double *w1 = m->w1 + k * m->dm * m->dh, *w2 = m->w2 + k * m->dh * m->dm;
  double *g1 = g->w1 + k * m->dm * m->dh, *g2 = g->w2 + k * m->dh * m->dm;
  for (int64_t j = 0; j < m->dh; j++) {
    double da = 0;
    for (int64_t d = 0; d < m->dm; d++) {
      g2[j * m->dm + d] += a[j] * dout[d];
      da += dout[d] * w2[j * m->dm + d];
    }
    double dh = da * act_grad(m, h[j]);
    g->b1[k * m->dh + j] += dh;
    for (int64_t d = 0; d < m->dm; d++) {
      g1[d * m->dh + j] += x[d] * dh;
      dx[d] += dh * w1[d * m->dh + j];
    }
  }
  for (int64_t d = 0; d < m->dm; d++) g->b2[k * m->dm + d] += dout[d];
}

/* The gate of dist.h: top-K logits (ties: lower id), softmax over them. */
static void gate_row(const model *m, const double *x, int *sel, double *gw) {
  double *logits = zeros((size_t)m->NE);
  for (int e = 0; e < m->NE; e++)
    for (int64_t d = 0; d < m->dm; d++) logits[e] += x[d] * m->gate[d * m->NE + e];
  for (int j = 0; j < m->K; j++) {
    int best = -1;
    for (int e = 0; e < m->NE; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= sel[i] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
    }
    sel[j] = best;
  }
  double s = 0;
  for (int j = 0; j < m->K; j++) s += gw[j] = exp(logits[sel[j]] - logits[sel[0]]);
  for (int j = 0; j < m->K; j++) gw[j] /= s;
  free(logits);
}

/* The whole layer on T tokens: y; with dy also dx and g (added to);
 * routed (may be NULL, NE entries) counts the rows each expert got. */
static void layer_ref(const model *m, int64_t T, const double *x, double *y,
                      const double *dy, double *dx, model *g, int64_t *routed) {
  int K = m->K, sel[16];
  double gw[16], dgw[16];
  double *h = zeros((size_t)(K * m->dh)), *a = zeros((size_t)(K * m->dh));
  double *o = zeros((size_t)(K * m->dm)), *dout = zeros((size_t)m->dm);
  for (int64_t t = 0; t < T; t++) {
    const double *xt = x + t * m->dm;
    gate_row(m, xt, sel, gw);
    for (int64_t d = 0; d < m->dm; d++) y[t * m->dm + d] = 0;
    for (int j = 0; j < K; j++) {
      if (routed) routed[sel[j]]++;
      ffn_row(m, sel[j], xt, h + j * m->dh, a + j * m->dh, o + j * m->dm);
      for (int64_t d = 0; d < m->dm; d++) y[t * m->dm + d] += gw[j] * o[j * m->dm + d];
    }
    if (!dy) continue;
    double dot = 0;
    for (int j = 0; j < K; j++) {
      dgw[j] = 0;
      for (int64_t d = 0; d < m->dm; d++) {
        dout[d] = gw[j] * dy[t * m->dm + d];
        dgw[j] += dy[t * m->dm + d] * o[j * m->dm + d];
      }
      ffn_row_back(m, sel[j], xt, h + j * m->dh, a + j * m->dh, dout, g, dx + t * m->dm);
      dot += gw[j] * dgw[j];
    }
    for (int j = 0; j < K; j++)
      for (int64_t d = 0; d < m->dm; d++) {
        double dl = gw[j] * (dgw[j] - dot);
        dx[t * m->dm + d] += dl * m->gate[d * m->NE + sel[j]];
        g->gate[d * m->NE + sel[j]] += dl * xt[d];
      }
  }
  free(h), free(a), free(o), free(dout);
}

/* ---------------------------------------------------------------- helpers */

static void *to_dtype(const double *v, size_t n, dist_dtype dt) {
  void *out = malloc(n * dist_dtype_size(dt) + 8);
  for (size_t i = 0; i < n; i++) dist_elem_set(out, dt, i, v[i]);
  return out;
}

static double max_diff(const void *got, dist_dtype dt, const double *want, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs(dist_elem_get(got, dt, i) - want[i]));
  return m;
}

/* The local piece of a tensor daemon `rank` holds (a client of that
 * cluster); nbytes checked against n elements of dt. */
static void *fetch(dist_client *c, const char *name, int rank, dist_dtype dt, size_t n) {
  dist_tensor *t = NULL;
  void *data = NULL;
  size_t nbytes = 0;
  int64_t shape[DIST_MAX_DIMS];
  cr_assert_eq(dist_tensor_open(c, name, &t), 0, "%s: %s", name, dist_errmsg(c));
  cr_assert_eq(dist_dtensor_to_local(c, t, rank, &data, &nbytes, shape), 0, "%s: %s",
               name, dist_errmsg(c));
  cr_assert_eq(nbytes, n * dist_dtype_size(dt), "%s: %zu bytes", name, nbytes);
  dist_tensor_free(t);
  return data;
}

static void expect_close(const char *what, const void *got, dist_dtype dt,
                         const double *want, size_t n, double tol) {
  double d = max_diff(got, dt, want, n);
  cr_expect_leq(d, tol, "%s: max abs diff %g > %g", what, d, tol);
}

/* ---------------------------------------------------------------- expert RPCs */

/* Puts rows on daemon 0 of a one-daemon cluster under name, via a
 * global_scatter whose layout is the identity for W = 1. */
static void put_rows(dist_client *c, const char *name, const void *rows, int E,
                     const int64_t *counts, int64_t dm, dist_dtype dt) {
  const void *xs[1] = {rows};
  const int64_t *lc[1] = {counts};
  dist_moe_opts o = {NULL, name, 1, 0};
  cr_assert_eq(dist_global_scatter(c, xs, NULL, dt, dm, lc, lc, E, NULL, 0, &o, NULL, NULL), 0,
               "%s", dist_errmsg(c));
}

static void create_direct(dist_client *c, const model *m, dist_dtype dt, const char *layer) {
  Dist__V1__ExpertLayerCreateRequest rq = DIST__V1__EXPERT_LAYER_CREATE_REQUEST__INIT;
  Dist__V1__ExpertWeights w[8], *wp[8];
  void *bufs[8][4];
  size_t esz = dist_dtype_size(dt);
  rq.layer = (char *)layer, rq.experts = (uint32_t)m->E, rq.d_model = (uint64_t)m->dm;
  rq.d_hidden = (uint64_t)m->dh, rq.bias = m->bias, rq.dtype = (Dist__V1__DType)dt;
  rq.activation = m->silu ? DIST__V1__EXPERT_ACTIVATION__EXPERT_SILU
                          : DIST__V1__EXPERT_ACTIVATION__EXPERT_GELU;
  size_t n1 = (size_t)(m->dm * m->dh);
  for (int k = 0; k < m->E; k++) {
    dist__v1__expert_weights__init(&w[k]);
    bufs[k][0] = to_dtype(m->w1 + k * n1, n1, dt);
    bufs[k][1] = to_dtype(m->b1 + k * m->dh, (size_t)m->dh, dt);
    bufs[k][2] = to_dtype(m->w2 + k * n1, n1, dt);
    bufs[k][3] = to_dtype(m->b2 + k * m->dm, (size_t)m->dm, dt);
    w[k].w1 = (ProtobufCBinaryData){n1 * esz, bufs[k][0]};
    w[k].w2 = (ProtobufCBinaryData){n1 * esz, bufs[k][2]};
    if (m->bias) {
      w[k].b1 = (ProtobufCBinaryData){(size_t)m->dh * esz, bufs[k][1]};
      w[k].b2 = (ProtobufCBinaryData){(size_t)m->dm * esz, bufs[k][3]};
    }
    wp[k] = &w[k];
  }
  rq.n_weights = (size_t)m->E, rq.weights = wp;
  ProtobufCMessage *rp = NULL;
  cr_assert_eq(dist_call_one(c, 0, "/dist.v1.Moe/ExpertLayerCreate", &rq.base,
                             &dist__v1__expert_layer_create_reply__descriptor, &rp), 0,
               "%s", dist_errmsg(c));
  cr_assert_eq(((Dist__V1__ExpertLayerCreateReply *)rp)->n_tensors, (size_t)(m->E * (m->bias ? 4 : 2)));
  protobuf_c_message_free_unpacked(rp, NULL);
  for (int k = 0; k < m->E; k++)
    for (int i = 0; i < 4; i++) free(bufs[k][i]);
}

static int expert_forward(dist_client *c, const char *layer, const int64_t *counts,
                          int E, uint64_t inv) {
  Dist__V1__ExpertForwardRequest rq = DIST__V1__EXPERT_FORWARD_REQUEST__INIT;
  rq.layer = (char *)layer, rq.x_name = "t.x", rq.out_name = "t.y", rq.replace = 1;
  rq.counts = (int64_t *)counts, rq.n_counts = (size_t)E, rq.invocation = inv;
  ProtobufCMessage *rp = NULL;
  int rc = dist_call_one(c, 0, "/dist.v1.Moe/ExpertForward", &rq.base,
                         &dist__v1__expert_forward_reply__descriptor, &rp);
  if (rp) {
    Dist__V1__ExpertForwardReply *r = (void *)rp;
    cr_assert_eq(r->n_expert_rows, (size_t)E);
    for (int e = 0; e < E; e++) cr_assert_eq(r->expert_rows[e], counts[e]);
  }
  protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}

static int expert_backward(dist_client *c, const char *layer, uint64_t inv, int accumulate) {
  Dist__V1__ExpertBackwardRequest rq = DIST__V1__EXPERT_BACKWARD_REQUEST__INIT;
  rq.layer = (char *)layer, rq.invocation = inv, rq.grad_name = "t.dy";
  rq.out_name = "t.dx", rq.replace = 1, rq.accumulate = accumulate;
  ProtobufCMessage *rp = NULL;
  int rc = dist_call_one(c, 0, "/dist.v1.Moe/ExpertBackward", &rq.base,
                         &dist__v1__expert_backward_reply__descriptor, &rp);
  protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}

/* Expert k's parameter gradient on daemon 0 against want (times scale). */
static void expect_grad(dist_client *c, const char *layer, int k, const char *which,
                        const double *want, size_t n, double scale, dist_dtype dt, double tol) {
  char name[256];
  double *w = zeros(n);
  for (size_t i = 0; i < n; i++) w[i] = want[i] * scale;
  snprintf(name, sizeof name, "%s.expert%d.%s.grad", layer, k, which);
  void *got = fetch(c, name, 0, dt, n);
  expect_close(name, got, dt, w, n, tol);
  free(got), free(w);
}

/* Forward and backward of E experts on rows laid out by counts (zeros
 * included), against ffn_row / ffn_row_back; then a second round with
 * accumulate doubles the weight gradients. */
static void run_direct(int silu, int bias, dist_dtype dt) {
  dist_client *c = harness_start_with_client(&cluster, 1, NULL);
  int E = 3;
  int64_t counts[3] = {4, 0, 5}, rows = 9, dm = 6, dh = 10;
  model m = model_new(1, E, 1, dm, dh, bias, silu), g = grads_new(&m);
  double tol = dt == DIST_FLOAT64 ? 1e-10 : 1e-4;
  create_direct(c, &m, dt, "ffn");
  double *x = rand_vec((size_t)(rows * dm), 1.0), *dy = rand_vec((size_t)(rows * dm), 1.0);
  double *y = zeros((size_t)(rows * dm)), *dx = zeros((size_t)(rows * dm));
  double *h1 = zeros((size_t)dh), *a1 = zeros((size_t)dh);
  for (int64_t r = 0, e = 0, left = counts[0]; r < rows; r++, left--) {
    while (left == 0) left = counts[++e];
    ffn_row(&m, (int)e, x + r * dm, h1, a1, y + r * dm);
    ffn_row_back(&m, (int)e, x + r * dm, h1, a1, dy + r * dm, &g, dx + r * dm);
  }
  void *xb = to_dtype(x, (size_t)(rows * dm), dt), *dyb = to_dtype(dy, (size_t)(rows * dm), dt);
  put_rows(c, "t.x", xb, E, counts, dm, dt);
  put_rows(c, "t.dy", dyb, E, counts, dm, dt);
  for (int round = 1; round <= 2; round++) {
    cr_assert_eq(expert_forward(c, "ffn", counts, E, 7), 0, "%s", dist_errmsg(c));
    void *got = fetch(c, "t.y", 0, dt, (size_t)(rows * dm));
    expect_close("y", got, dt, y, (size_t)(rows * dm), tol);
    free(got);
    cr_assert_eq(expert_backward(c, "ffn", 7, round == 2), 0, "%s", dist_errmsg(c));
    got = fetch(c, "t.dx", 0, dt, (size_t)(rows * dm));
    expect_close("dx", got, dt, dx, (size_t)(rows * dm), tol);
    free(got);
    for (int k = 0; k < E; k++) {
      expect_grad(c, "ffn", k, "w1", g.w1 + k * dm * dh, (size_t)(dm * dh), round, dt, tol);
      expect_grad(c, "ffn", k, "w2", g.w2 + k * dm * dh, (size_t)(dm * dh), round, dt, tol);
      if (bias) {
        expect_grad(c, "ffn", k, "b1", g.b1 + k * dh, (size_t)dh, round, dt, tol);
        expect_grad(c, "ffn", k, "b2", g.b2 + k * dm, (size_t)dm, round, dt, tol);
      }
    }
  }
  /* The backward consumed the invocation. */
  cr_expect_eq(expert_backward(c, "ffn", 7, 1), DIST_ENOTFOUND);
  cr_expect(strstr(dist_errmsg(c), "keeps no invocation 7"), "%s", dist_errmsg(c));
  free(x), free(dy), free(y), free(dx), free(h1), free(a1), free(xb), free(dyb);
  model_free(&m), model_free(&g);
  dist_close(c);
  stop_cluster();
}

Test(experts, gelu_with_biases_float64) { run_direct(0, 1, DIST_FLOAT64); }
Test(experts, gelu_without_biases_float32) { run_direct(0, 0, DIST_FLOAT32); }
Test(experts, silu_with_biases_float32) { run_direct(1, 1, DIST_FLOAT32); }
Test(experts, silu_without_biases_float64) { run_direct(1, 0, DIST_FLOAT64); }

Test(experts, bad_requests_fail_with_a_message) {
  dist_client *c = harness_start_with_client(&cluster, 1, NULL);
  model m = model_new(1, 2, 1, 4, 4, 1, 0);
  create_direct(c, &m, DIST_FLOAT32, "bad");
  int64_t counts[2] = {2, 1}, wrong[2] = {2, 2};
  double *x = rand_vec(12, 1.0);
  void *xb = to_dtype(x, 12, DIST_FLOAT32);
  put_rows(c, "t.x", xb, 2, counts, 4, DIST_FLOAT32);
  cr_expect_eq(expert_forward(c, "nope", counts, 2, 1), DIST_ENOTFOUND);
  cr_expect(strstr(dist_errmsg(c), "no expert layer 'nope'"), "%s", dist_errmsg(c));
  Dist__V1__ExpertForwardRequest rq = DIST__V1__EXPERT_FORWARD_REQUEST__INIT;
  rq.layer = "bad", rq.x_name = "t.x", rq.out_name = "t.y", rq.counts = wrong, rq.n_counts = 2;
  ProtobufCMessage *rp = NULL;
  cr_expect_eq(dist_call_one(c, 0, "/dist.v1.Moe/ExpertForward", &rq.base,
                             &dist__v1__expert_forward_reply__descriptor, &rp), DIST_EMISMATCH);
  cr_expect(strstr(dist_errmsg(c), "not 4 rows"), "%s", dist_errmsg(c));
  rq.counts = counts, rq.n_counts = 2, rq.x_name = "t.x";
  rq.n_counts = 1; /* neither E nor W*E entries */
  cr_expect_eq(dist_call_one(c, 0, "/dist.v1.Moe/ExpertForward", &rq.base,
                             &dist__v1__expert_forward_reply__descriptor, &rp), DIST_EINVAL);
  /* A backward whose gradient rows are missing fails and keeps the
   * invocation for another try. */
  cr_assert_eq(expert_forward(c, "bad", counts, 2, 3), 0, "%s", dist_errmsg(c));
  cr_expect_eq(expert_backward(c, "bad", 3, 0), DIST_ENOTFOUND);
  cr_expect(strstr(dist_errmsg(c), "t.dy"), "%s", dist_errmsg(c));
  put_rows(c, "t.dy", xb, 2, counts, 4, DIST_FLOAT32);
  cr_expect_eq(expert_backward(c, "bad", 3, 0), 0, "%s", dist_errmsg(c));
  /* Creating it again without replace. */
  Dist__V1__ExpertLayerCreateRequest cq = DIST__V1__EXPERT_LAYER_CREATE_REQUEST__INIT;
  cq.layer = "bad", cq.experts = 2, cq.d_model = 4, cq.d_hidden = 4;
  cq.dtype = DIST__V1__DTYPE__FLOAT32;
  cr_expect_eq(dist_call_one(c, 0, "/dist.v1.Moe/ExpertLayerCreate", &cq.base,
                             &dist__v1__expert_layer_create_reply__descriptor, &rp), DIST_EEXIST);
  cq.layer = "int", cq.dtype = DIST__V1__DTYPE__INT32;
  cr_expect_eq(dist_call_one(c, 0, "/dist.v1.Moe/ExpertLayerCreate", &cq.base,
                             &dist__v1__expert_layer_create_reply__descriptor, &rp), DIST_ENOTSUP);
  free(x), free(xb);
  model_free(&m);
  dist_close(c);
  stop_cluster();
}

/* Weights drawn from a seed: inside +-1/sqrt(fan_in), different per expert,
 * the same again for the same seed. */
Test(experts, seeded_weights_are_bounded_and_reproducible) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.experts_per_rank = 2, o.d_model = 16, o.d_hidden = 4, o.seed = 42, o.replace = 1;
  dist_moe_layer *l = NULL;
  cr_assert_eq(dist_moe_layer_create(c, "seeded", &o, &l), 0, "%s", dist_errmsg(c));
  float *w[4];
  char name[256];
  for (int k = 0; k < 4; k++) {
    dist_moe_layer_param_name(l, k, "w1", name, sizeof name);
    w[k] = fetch(c, name, k / 2, DIST_FLOAT32, 64);
    for (int i = 0; i < 64; i++) cr_assert_leq(fabsf(w[k][i]), 0.25f);
  }
  cr_expect_neq(memcmp(w[0], w[1], 256), 0);
  cr_expect_neq(memcmp(w[1], w[2], 256), 0);
  cr_expect_eq(dist_moe_layer_param_name(l, 0, "b1", name, sizeof name), -1, "no biases");
  dist_moe_layer_free(l);
  cr_assert_eq(dist_moe_layer_create(c, "seeded", &o, &l), 0, "%s", dist_errmsg(c));
  dist_moe_layer_param_name(l, 3, "w1", name, sizeof name);
  float *again = fetch(c, name, 1, DIST_FLOAT32, 64);
  cr_expect_eq(memcmp(again, w[3], 256), 0);
  free(again);
  for (int k = 0; k < 4; k++) free(w[k]);
  dist_moe_layer_free(l);
  dist_close(c);
  stop_cluster();
}

/* Daemon r's own answer to whether it holds name. */
static int held_by(harness *h, int r, const char *name) {
  dist_tensor *t = NULL;
  int held = harness_open_on(h, r, name, &t) == 0;
  dist_tensor_free(t);
  return held;
}

/* A layer one daemon cannot create (one of its expert's names is taken
 * there) is created by neither: rank 0 used to keep its experts, so the
 * next create without replace failed on rank 0 too. */
Test(experts, a_layer_one_daemon_cannot_create_exists_nowhere) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  float taken[4] = {0};
  int64_t n4 = 4;
  dist_tensor_free(harness_put(c, "moe.expert2.w1", DIST_FLOAT32, taken, 1, &n4, "[1]",
                               "Replicate()"));
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.experts_per_rank = 2, o.d_model = 4, o.d_hidden = 3, o.seed = 7;
  dist_moe_layer *l = NULL;
  int rc = dist_moe_layer_create(c, "moe", &o, &l);
  cr_assert_eq(rc, DIST_EEXIST, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "'moe.expert2.w1' already exists"), "%s", dist_errmsg(c));
  cr_assert_null(l);
  cr_assert(!held_by(&cluster, 0, "moe.expert0.w1"), "rank 0 created its experts");
  cr_assert(!held_by(&cluster, 0, "moe.expert1.w2.grad"), "rank 0 created its experts");
  cr_assert_eq(dist_tensor_delete(c, "moe.expert2.w1"), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_moe_layer_create(c, "moe", &o, &l), 0, "%s", dist_errmsg(c));
  cr_assert(held_by(&cluster, 0, "moe.expert0.w1") && held_by(&cluster, 1, "moe.expert3.w2"));
  dist_moe_layer_free(l);
  dist_close(c);
  stop_cluster();
}

/* One SPMD trainer creating layer "moe" (2 experts per rank, seeded),
 * timed. */
typedef struct creator {
  dist_client *c;
  int top_k;      /* 0: the default */
  int64_t tokens; /* spmd_forward's; -1: libdist refuses the forward */
  /* spmd_forward's: a parameter it deletes on its own daemon before the
   * forward (whose experts that daemon then refuses to run), and how the
   * delete went. */
  const char *lose;
  int lose_rc;
  int rc;
  char msg[512];
  double took;
} creator;

static void *spmd_create(void *arg) {
  creator *cr = arg;
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.experts_per_rank = 2, o.d_model = 4, o.d_hidden = 3, o.seed = 7;
  if (cr->top_k) o.top_k = cr->top_k;
  dist_moe_layer *l = NULL;
  double t0 = harness_now_s();
  cr->rc = dist_moe_layer_create(cr->c, "moe", &o, &l);
  cr->took = harness_now_s() - t0;
  snprintf(cr->msg, sizeof cr->msg, "%s", dist_errmsg(cr->c));
  dist_moe_layer_free(l);
  return NULL;
}

/* A put of a parameter's name that reaches a daemon while the layer's
 * creation waits there for the others' verdicts is refused: the creation
 * holds the names it stores. Before, the put went through after the
 * creation checked the name was free, and the creation then replaced it. */
Test(experts, a_put_of_a_parameter_name_while_the_layer_votes_is_refused) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  creator cr[2] = {{.c = harness_spmd_client(&cluster, 0, "experts-job")},
                   {.c = harness_spmd_client(&cluster, 1, "experts-job")}};
  pthread_t first;
  cr_assert_eq(pthread_create(&first, NULL, spmd_create, &cr[0]), 0);
  /* Trainer 0's create runs on rank 0 and waits there for rank 1's verdict
   * (bounded: a fixed 500 ms was a race on a loaded host). */
  cr_assert(harness_wait_running(c, 0, "vote", 0, 10000), "rank 0 never voted");
  static const double seven[1] = {7};
  int64_t n1 = 1;
  dist_tensor *t = NULL;
  int rc = harness_try_put(c, "moe.expert0.w1.grad", DIST_FLOAT64, seven, 1, &n1, "[0]",
                           "Replicate()", &t);
  cr_assert_eq(rc, DIST_EUNAVAIL, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "'moe.expert0.w1.grad' is being created as an expert "
                   "layer's parameter on rank 0"), "%s", dist_errmsg(c));
  cr_assert(!strstr(dist_errmsg(c), "cannot reach"), "%s", dist_errmsg(c));
  spmd_create(&cr[1]);
  pthread_join(first, NULL);
  for (int r = 0; r < 2; r++) cr_assert_eq(cr[r].rc, 0, "trainer %d: %s", r, cr[r].msg);
  cr_assert_eq(harness_open_on(&cluster, 0, "moe.expert0.w1.grad", &t), 0);
  cr_expect_eq(dist_tensor_dtype(t), DIST_FLOAT32, "the layer's gradient, not the put");
  cr_expect_eq(dist_tensor_ndim(t), 2);
  dist_tensor_free(t);
  for (int r = 0; r < 2; r++) dist_close(cr[r].c);
  dist_close(c);
  stop_cluster();
}

/* Trainer 0 asks for top_k 9 of 4 experts, which libdist refused before
 * it took the creation's op id: trainer 1 waited for rank 0's verdict until
 * the deadline, and the two trainers' op ids stayed apart. */
Test(experts, a_layer_one_spmd_trainer_refuses_fails_the_other_at_once) {
  harness_start(&cluster, 2, NULL);
  creator cr[2] = {{.c = harness_spmd_client(&cluster, 0, "refuse-layer"), .top_k = 9},
                   {.c = harness_spmd_client(&cluster, 1, "refuse-layer")}};
  cr[1].c->timeout_ms = 10000;
  pthread_t th[2];
  for (int round = 0; round < 2; round++) { /* then both good */
    for (int r = 0; r < 2; r++) cr_assert_eq(pthread_create(&th[r], NULL, spmd_create, &cr[r]), 0);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    if (round == 1) break;
    cr_expect(cr[0].rc == DIST_EINVAL && strstr(cr[0].msg, "top_k 9"), "trainer 0: %s", cr[0].msg);
    cr_expect_lt(cr[1].took, 3.0, "trainer 1 waited %.1f s: %s", cr[1].took, cr[1].msg);
    cr_expect(strstr(cr[1].msg, "rank 0 aborted op") && strstr(cr[1].msg, "top_k 9"),
              "trainer 1: %s", cr[1].msg);
    for (int r = 0; r < 2; r++) cr_expect(!held_by(&cluster, r, "moe.expert0.w1"), "rank %d", r);
    cr[0].top_k = 0;
  }
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(cr[r].rc, 0, "then: trainer %d: %s", r, cr[r].msg);
    dist_close(cr[r].c);
  }
  stop_cluster();
}

/* One SPMD trainer: layer "moe" as spmd_create makes it, then a forward
 * of cr->tokens tokens (its message and time in cr), then an all-reduce
 * of both trainers (cr->rc: its result). */
static void *spmd_forward(void *arg) {
  creator *cr = arg;
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.experts_per_rank = 2, o.d_model = 4, o.d_hidden = 3, o.seed = 7;
  dist_moe_layer *l = NULL;
  float x[8] = {0}, gate[16] = {0};
  const void *xs[1] = {x};
  void *ys[1] = {NULL};
  int rc = dist_moe_layer_create(cr->c, "moe", &o, &l);
  if (rc == 0 && cr->lose) cr->lose_rc = dist_tensor_delete(cr->c, cr->lose);
  double t0 = harness_now_s();
  if (rc == 0) dist_moe_layer_forward(cr->c, l, xs, &cr->tokens, gate, ys);
  cr->took = harness_now_s() - t0;
  snprintf(cr->msg, sizeof cr->msg, "%s", dist_errmsg(cr->c));
  int32_t v = 1;
  cr->rc = dist_all_reduce(cr->c, &v, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0) || v != 2;
  free(ys[0]);
  dist_moe_layer_free(l);
  return NULL;
}

/* Runs spmd_forward on both trainers, whose pass trainer 0 refuses
 * (`why` says why): trainer 1 must fail at once, told of rank 0's
 * refusal, and the all-reduce of both after the pass must meet. */
static void expect_forward_refused_by_trainer_0(creator cr[2], const char *why) {
  cr[0].c->timeout_ms = 30000; /* its all-reduce waits for trainer 1's forward */
  cr[1].c->timeout_ms = 10000;
  pthread_t th[2];
  for (int r = 0; r < 2; r++) cr_assert_eq(pthread_create(&th[r], NULL, spmd_forward, &cr[r]), 0);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  cr_expect(strstr(cr[0].msg, why), "trainer 0: %s", cr[0].msg);
  cr_expect_lt(cr[1].took, 3.0, "trainer 1 waited %.1f s: %s", cr[1].took, cr[1].msg);
  cr_expect(strstr(cr[1].msg, "rank 0 aborted op") && strstr(cr[1].msg, why),
            "trainer 1: %s", cr[1].msg);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(cr[r].rc, 0, "trainer %d: the all-reduce after the forward failed", r);
    dist_close(cr[r].c);
  }
}

/* Trainer 0's forward has -1 tokens, which libdist refused before the
 * forward's count exchange: trainer 1 waited for it until the deadline,
 * and the two trainers' op ids stayed apart. */
Test(experts, a_forward_one_spmd_trainer_refuses_fails_the_other_at_once) {
  harness_start(&cluster, 2, NULL);
  creator cr[2] = {{.c = harness_spmd_client(&cluster, 0, "refuse-forward"), .tokens = -1},
                   {.c = harness_spmd_client(&cluster, 1, "refuse-forward"), .tokens = 2}};
  expect_forward_refused_by_trainer_0(cr, "rank 0 has -1 tokens");
  stop_cluster();
}

/* Rank 0's daemon refuses to run its experts (trainer 0 deleted one of
 * their weights there after creating the layer), after the forward's
 * scatter: trainer 0 refuses the gather that follows to the others, under
 * the op id it would have taken. Before, trainer 1's gather waited for
 * rank 0's rows until the peer timeout, and trainer 0's all-reduce then
 * ran under the gather's op id. */
Test(experts, a_pass_whose_experts_one_daemon_refused_fails_the_gather_at_once) {
  harness_start(&cluster, 2, NULL);
  creator cr[2] = {{.c = harness_spmd_client(&cluster, 0, "refuse-experts"), .tokens = 2,
                    .lose = "moe.expert0.w1"},
                   {.c = harness_spmd_client(&cluster, 1, "refuse-experts"), .tokens = 2}};
  expect_forward_refused_by_trainer_0(cr, "moe.expert0.w1");
  cr_expect_eq(cr[0].lose_rc, 0, "deleting moe.expert0.w1 on rank 0 failed");
  stop_cluster();
}

/* ---------------------------------------------------------------- the layer */

#define MAXR 4

typedef struct layer_case {
  model m;
  dist_dtype dt;
  int64_t T[MAXR];
  double *x[MAXR], *dy[MAXR];
  /* the reference */
  double *y[MAXR], *dx[MAXR];
  model g;
  int64_t routed[MAXR * 8];
} layer_case;

static void case_init(layer_case *k, int W, int E, int K, int bias, int silu, dist_dtype dt) {
  memset(k, 0, sizeof *k);
  k->m = model_new(W, E, K, 6, 12, bias, silu);
  k->g = grads_new(&k->m);
  k->dt = dt;
  for (int r = 0; r < W; r++) {
    k->T[r] = (int64_t[]){5, 3, 0, 4}[r]; /* uneven; rank 2 has no tokens */
    size_t n = (size_t)(k->T[r] * k->m.dm);
    k->x[r] = rand_vec(n, 1.0), k->dy[r] = rand_vec(n, 1.0);
    k->y[r] = zeros(n), k->dx[r] = zeros(n);
    layer_ref(&k->m, k->T[r], k->x[r], k->y[r], k->dy[r], k->dx[r], &k->g, k->routed);
  }
}

static void case_free(layer_case *k) {
  for (int r = 0; r < k->m.W; r++) free(k->x[r]), free(k->dy[r]), free(k->y[r]), free(k->dx[r]);
  model_free(&k->m), model_free(&k->g);
}

/* Every rank's part of the model as create weights (all W*E, global ids). */
static dist_expert_weights *weights_of(const model *m, dist_dtype dt, void ***bufs) {
  dist_expert_weights *w = calloc((size_t)m->NE, sizeof *w);
  *bufs = calloc((size_t)m->NE * 4, sizeof **bufs);
  size_t n1 = (size_t)(m->dm * m->dh);
  for (int k = 0; k < m->NE; k++) {
    void **b = *bufs + k * 4;
    b[0] = to_dtype(m->w1 + k * n1, n1, dt), b[1] = to_dtype(m->b1 + k * m->dh, (size_t)m->dh, dt);
    b[2] = to_dtype(m->w2 + k * n1, n1, dt), b[3] = to_dtype(m->b2 + k * m->dm, (size_t)m->dm, dt);
    w[k] = (dist_expert_weights){b[0], b[1], b[2], b[3]};
  }
  return w;
}

static void free_bufs(void **bufs, int n) {
  for (int i = 0; i < n; i++) free(bufs[i]);
  free(bufs);
}

/* One trainer (SPMD: its rank r; single client: r < 0 drives all). */
typedef struct trainer {
  layer_case *k;
  const char *cluster;
  int rank;
  double diff;
  char err[512];
} trainer;

static int layer_opts(const layer_case *k, dist_moe_layer_opts *o, const dist_expert_weights *w,
                      int rank) {
  *o = (dist_moe_layer_opts)DIST_MOE_LAYER_OPTS_INIT;
  o->experts_per_rank = k->m.E, o->d_model = k->m.dm, o->d_hidden = k->m.dh;
  o->top_k = k->m.K, o->bias = k->m.bias, o->dtype = k->dt, o->replace = 1;
  o->activation = k->m.silu ? DIST_EXPERT_SILU : DIST_EXPERT_GELU;
  o->weights = rank < 0 ? w : w + rank * k->m.E;
  return 0;
}

/* Forward and backward of the participants ranks[0..n) through the layer;
 * the largest difference from the reference in t->diff (gate gradient
 * summed over the ranks by the caller in SPMD). */
static int drive(dist_client *c, trainer *t, const int *ranks, int n, void *dgate) {
  layer_case *k = t->k;
  dist_moe_layer_opts o;
  void **bufs = NULL;
  dist_expert_weights *w = weights_of(&k->m, k->dt, &bufs);
  dist_moe_layer *l = NULL;
  const void *xs[MAXR], *dys[MAXR];
  void *ys[MAXR] = {0}, *dxs[MAXR] = {0}, *xb[MAXR], *dyb[MAXR];
  int64_t T[MAXR];
  for (int i = 0; i < n; i++) {
    int r = ranks[i];
    size_t sz = (size_t)(k->T[r] * k->m.dm);
    xs[i] = xb[i] = to_dtype(k->x[r], sz, k->dt), dys[i] = dyb[i] = to_dtype(k->dy[r], sz, k->dt);
    T[i] = k->T[r];
  }
  void *gate = to_dtype(k->m.gate, (size_t)(k->m.dm * k->m.NE), k->dt);
  layer_opts(k, &o, w, n == 1 ? t->rank : -1);
  int rc = dist_moe_layer_create(c, "layer", &o, &l);
  if (rc == 0) rc = dist_moe_layer_forward(c, l, xs, T, gate, ys);
  if (rc == 0) rc = dist_moe_layer_backward(c, l, dys, dxs, dgate);
  for (int i = 0; rc == 0 && i < n; i++) {
    int r = ranks[i];
    size_t sz = (size_t)(k->T[r] * k->m.dm);
    t->diff = fmax(t->diff, max_diff(ys[i], k->dt, k->y[r], sz));
    t->diff = fmax(t->diff, max_diff(dxs[i], k->dt, k->dx[r], sz));
  }
  if (rc != 0) snprintf(t->err, sizeof t->err, "%s", dist_errmsg(c));
  for (int i = 0; i < n; i++) free(xb[i]), free(dyb[i]), free(ys[i]), free(dxs[i]);
  free(gate), free(w);
  free_bufs(bufs, k->m.NE * 4);
  dist_moe_layer_free(l);
  return rc;
}

static void *spmd_trainer(void *arg) {
  trainer *t = arg;
  dist_opts o = DIST_OPTS_INIT;
  o.op_id_base = 0x5eed0000;
  dist_client *c = NULL;
  if (dist_connect_cluster(t->cluster, &o, &c) != 0) {
    snprintf(t->err, sizeof t->err, "connect: %s", dist_last_connect_error());
    return NULL;
  }
  c->spmd_rank = t->rank; /* as dist_init_from_env would make it */
  size_t ng = (size_t)(t->k->m.dm * t->k->m.NE);
  void *dgate = calloc(ng, dist_dtype_size(t->k->dt));
  int rc = drive(c, t, &t->rank, 1, dgate);
  if (rc == 0) rc = dist_all_reduce(c, dgate, ng, t->k->dt, DIST_REDUCE_SUM, NULL, 0);
  if (rc == 0) t->diff = fmax(t->diff, max_diff(dgate, t->k->dt, t->k->g.gate, ng));
  else if (!t->err[0]) snprintf(t->err, sizeof t->err, "%s", dist_errmsg(c));
  free(dgate);
  dist_close(c);
  return NULL;
}

/* The experts' weight gradients in the daemons against the reference. */
static double weight_grad_diff(dist_client *c, const layer_case *k) {
  const model *m = &k->m;
  double d = 0;
  char name[256];
  size_t n1 = (size_t)(m->dm * m->dh);
  for (int e = 0; e < m->NE; e++) {
    const double *want[4] = {k->g.w1 + e * n1, k->g.b1 + e * m->dh, k->g.w2 + e * n1,
                             k->g.b2 + e * m->dm};
    size_t n[4] = {n1, (size_t)m->dh, n1, (size_t)m->dm};
    for (int p = 0; p < 4; p++) {
      if (!m->bias && (p == 1 || p == 3)) continue;
      snprintf(name, sizeof name, "layer.expert%d.%s.grad", e, (const char *[]){"w1", "b1", "w2", "b2"}[p]);
      void *got = fetch(c, name, e / m->E, k->dt, n[p]);
      d = fmax(d, max_diff(got, k->dt, want[p], n[p]));
      free(got);
    }
  }
  return d;
}

static void run_layer_spmd(int W, int E, int K, int bias, int silu, dist_dtype dt) {
  harness_start(&cluster, W, NULL);
  layer_case k;
  case_init(&k, W, E, K, bias, silu, dt);
  trainer t[MAXR];
  pthread_t th[MAXR];
  for (int r = 0; r < W; r++) {
    t[r] = (trainer){&k, cluster.cluster_file, r, 0, ""};
    pthread_create(&th[r], NULL, spmd_trainer, &t[r]);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < W; r++) {
    cr_assert_eq(t[r].err[0], 0, "rank %d: %s", r, t[r].err);
    cr_expect_leq(t[r].diff, 1e-4, "rank %d: max_abs_diff_vs_local %g", r, t[r].diff);
  }
  dist_client *c = harness_client(&cluster);
  double d = weight_grad_diff(c, &k);
  cr_expect_leq(d, 1e-4, "expert weight gradients: max abs diff %g", d);
  dist_close(c);
  case_free(&k);
  stop_cluster();
}

Test(moe_layer, spmd_two_ranks_matches_one_process, .timeout = 120) {
  run_layer_spmd(2, 4, 2, 1, 0, DIST_FLOAT32);
}
Test(moe_layer, spmd_two_ranks_silu_no_bias_float64, .timeout = 120) {
  run_layer_spmd(2, 2, 3, 0, 1, DIST_FLOAT64);
}
Test(moe_layer, spmd_four_ranks_matches_one_process, .timeout = 120) {
  run_layer_spmd(4, 2, 2, 1, 0, DIST_FLOAT32);
}

/* One client drives every rank; also checks the tokens recorded per expert
 * after the forward's global_scatter. */
Test(moe_layer, single_client_matches_one_process_and_counts_tokens, .timeout = 120) {
  int W = 3;
  harness_start(&cluster, W, NULL);
  layer_case k;
  case_init(&k, W, 2, 2, 1, 0, DIST_FLOAT64);
  dist_client *c = harness_client(&cluster);
  int ranks[MAXR] = {0, 1, 2};
  trainer t = {&k, cluster.cluster_file, -1, 0, ""};
  size_t ng = (size_t)(k.m.dm * k.m.NE);
  double *dgate = zeros(ng);
  cr_assert_eq(drive(c, &t, ranks, W, dgate), 0, "%s", t.err);
  cr_expect_leq(t.diff, 1e-9, "outputs and input gradients: %g", t.diff);
  expect_close("gate gradient", dgate, DIST_FLOAT64, k.g.gate, ng, 1e-9);
  cr_expect_leq(weight_grad_diff(c, &k), 1e-9);
  /* The forward's scatter delivered routed[e] rows to expert e; the
   * backward's scatter moves gradients, which are not routed tokens. */
  for (int r = 0; r < W; r++) {
    dist_experts_report rep;
    cr_assert_eq(dist_experts(c, r, &rep), 0, "%s", dist_errmsg(c));
    cr_assert_eq(rep.n, k.m.E);
    for (int i = 0; i < rep.n; i++) {
      int e = rep.experts[i].expert_id;
      cr_expect_eq(e, r * k.m.E + i);
      cr_expect_eq(rep.experts[i].tokens_last, (uint64_t)k.routed[e], "expert %d", e);
      cr_expect_eq(rep.experts[i].tokens_total, (uint64_t)k.routed[e], "expert %d", e);
    }
    dist_experts_report_free(&rep);
  }
  free(dgate);
  dist_close(c);
  case_free(&k);
  stop_cluster();
}

/* A step pushes each expert's gradient to the parameter service: plain SGD
 * gives w - lr * grad. */
Test(moe_layer, optimizer_step_updates_the_experts_in_place, .timeout = 120) {
  harness_start(&cluster, 2, NULL);
  layer_case k;
  case_init(&k, 2, 2, 2, 1, 1, DIST_FLOAT64);
  dist_client *c = harness_client(&cluster);
  int ranks[2] = {0, 1};
  trainer t = {&k, cluster.cluster_file, -1, 0, ""};
  cr_assert_eq(drive(c, &t, ranks, 2, NULL), 0, "%s", t.err);
  dist_moe_layer_opts o;
  void **bufs = NULL;
  dist_expert_weights *w = weights_of(&k.m, k.dt, &bufs);
  layer_opts(&k, &o, w, -1);
  o.replace = 0;
  dist_moe_layer *l = NULL;
  /* The layer exists: a handle without replace is refused. */
  cr_expect_neq(dist_moe_layer_create(c, "layer", &o, &l), 0);
  o.replace = 1;
  cr_assert_eq(dist_moe_layer_create(c, "layer", &o, &l), 0, "%s", dist_errmsg(c));
  /* Recreated: gradients zero, so compute them again through the layer. */
  const void *xs[2], *dys[2];
  void *xb[2], *dyb[2], *ys[2] = {0};
  int64_t T[2] = {k.T[0], k.T[1]};
  for (int r = 0; r < 2; r++) {
    size_t sz = (size_t)(k.T[r] * k.m.dm);
    xs[r] = xb[r] = to_dtype(k.x[r], sz, k.dt), dys[r] = dyb[r] = to_dtype(k.dy[r], sz, k.dt);
  }
  cr_assert_eq(dist_moe_layer_forward(c, l, xs, T, k.m.gate, ys), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_moe_layer_backward(c, l, dys, NULL, NULL), 0, "%s", dist_errmsg(c));
  cr_expect_neq(dist_moe_layer_backward(c, l, dys, NULL, NULL), 0, "one backward per forward");
  dist_param_opts po = DIST_PARAM_OPTS_INIT;
  po.lr = 0.25;
  cr_assert_eq(dist_moe_layer_configure_optimizer(c, l, &po), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_moe_layer_step(c, l), 0, "%s", dist_errmsg(c));
  size_t n1 = (size_t)(k.m.dm * k.m.dh);
  for (int e = 0; e < k.m.NE; e++) {
    char name[256];
    double *want = zeros(n1);
    for (size_t i = 0; i < n1; i++) want[i] = k.m.w2[e * n1 + i] - 0.25 * k.g.w2[e * n1 + i];
    dist_moe_layer_param_name(l, e, "w2", name, sizeof name);
    void *got = fetch(c, name, e / k.m.E, k.dt, n1);
    expect_close(name, got, k.dt, want, n1, 1e-9);
    free(got), free(want);
  }
  for (int r = 0; r < 2; r++) free(xb[r]), free(dyb[r]), free(ys[r]);
  free(w);
  free_bufs(bufs, k.m.NE * 4);
  dist_moe_layer_free(l);
  dist_close(c);
  case_free(&k);
  stop_cluster();
}

/* ---------------------------------------------------------------- the example */

Test(moe_layer, example_matches_one_process_under_distctl_launch, .timeout = 120) {
  harness_start(&cluster, 2, NULL);
  char dir[] = "/tmp/distd-moe-layer-XXXXXX", cmd[2048], *out = NULL, *err = NULL;
  cr_assert(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "cd %s && %s --cluster %s launch -n 2 --log-dir %s/log -- "
           "%s/examples/moe_layer", dir, harness_distctl(), cluster.cluster_file, dir,
           getenv("DIST_BUILD_ROOT"));
  int rc = harness_run(cmd, &out, &err, 90);
  cr_assert_eq(rc, 0, "exit %d\n%s\n%s", rc, out, err);
  const char *p = strstr(out, "max_abs_diff_vs_local=");
  cr_assert(p, "%s", out);
  double d = atof(p + strlen("max_abs_diff_vs_local="));
  cr_expect_leq(d, 1e-4, "%s", out);
  cr_expect(strstr(out, "loss went down"), "%s", out);
  free(out), free(err);
  harness_remove_dir(dir);
  stop_cluster();
}
