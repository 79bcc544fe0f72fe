/* A mixture-of-experts layer on distd, one trainer per rank:
 *
 *   distctl launch -n 2 -- build/examples/moe_layer
 *
 * 4 experts per rank (8 in all over 2 ranks), top-2 gating, d_model 8,
 * d_hidden 16, gelu, with biases, float32. Every rank builds the same
 * random model and data from one seed; rank r feeds its own tokens through
 * its own daemon. The layer's forward and backward are compared with the
 * same layer computed here in one process (plain C, double precision: gate,
 * route, each expert's FFN, combine, and backward), over every rank's
 * output, input gradient, gate gradient and expert weight gradients:
 *
 *   max_abs_diff_vs_local=<x>      (must be <= 1e-4)
 *
 * Then a few optimizer steps: the experts by the daemons' parameter service
 * (SGD), the gate here (its gradient all-reduced over the trainers), with
 * the loss 0.5 * mean over tokens of |y - target|^2 printed per step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"

#define E 4    /* experts per rank */
#define K 2    /* top-k */
#define DM 8   /* d_model */
#define DH 16  /* d_hidden */
#define MAXW 16
#define STEPS 6
#define LR 0.5

/* ---------------------------------------------------------------- the model */

typedef struct expert {
  double w1[DM * DH], b1[DH], w2[DH * DM], b2[DM];
} expert;

typedef struct model {
  int W, NE;
  double *gate;   /* [DM, NE] */
  expert *ex;     /* NE */
} model;

static uint64_t rng = 88172645463325252ull;
static double uniform(double a) { /* xorshift64 in [-a, a) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return ((double)(rng >> 11) * 0x1.0p-53 * 2 - 1) * a;
}

static void model_init(model *m, int W) {
  m->W = W, m->NE = W * E;
  m->gate = malloc(sizeof(double) * DM * (size_t)m->NE);
  m->ex = malloc(sizeof(expert) * (size_t)m->NE);
  for (int i = 0; i < DM * m->NE; i++) m->gate[i] = uniform(1.0);
  for (int k = 0; k < m->NE; k++) {
    expert *x = &m->ex[k];
    for (int i = 0; i < DM * DH; i++) x->w1[i] = uniform(1 / sqrt(DM)), x->w2[i] = uniform(1 / sqrt(DH));
    for (int i = 0; i < DH; i++) x->b1[i] = uniform(0.1);
    for (int i = 0; i < DM; i++) x->b2[i] = uniform(0.1);
  }
}

static double gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double gelu_grad(double x) {
  return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}

/* ---------------------------------------------------------------- the reference */

/* The gate as dist.h documents it: top-K logits (ties: lower id), softmax
 * over the selected ones. */
static void ref_gate(const model *m, const double *x, int *sel, double *gw) {
  double logits[MAXW * E];
  for (int e = 0; e < m->NE; e++) {
    double s = 0;
    for (int d = 0; d < DM; d++) s += x[d] * m->gate[d * m->NE + e];
    logits[e] = s;
  }
  for (int j = 0; j < K; j++) {
    int best = -1;
    for (int e = 0; e < m->NE; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= sel[i] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
    }
    sel[j] = best;
  }
  double sum = 0;
  for (int j = 0; j < K; j++) sum += gw[j] = exp(logits[sel[j]] - logits[sel[0]]);
  for (int j = 0; j < K; j++) gw[j] /= sum;
}

/* One expert on one row: h (pre-activation), a, o. */
static void ref_ffn(const expert *x, const double *in, double *h, double *a, double *o) {
  for (int j = 0; j < DH; j++) {
    h[j] = x->b1[j];
    for (int d = 0; d < DM; d++) h[j] += in[d] * x->w1[d * DH + j];
    a[j] = gelu(h[j]);
  }
  for (int d = 0; d < DM; d++) {
    o[d] = x->b2[d];
    for (int j = 0; j < DH; j++) o[d] += a[j] * x->w2[j * DM + d];
  }
}

/* Backward of one expert on one row, given dO: adds to g and to dx. */
static void ref_ffn_back(const expert *x, const double *in, const double *h,
                         const double *a, const double *dout, expert *g, double *dx) {
  for (int j = 0; j < DH; j++) {
    double da = 0;
    for (int d = 0; d < DM; d++) {
      g->w2[j * DM + d] += a[j] * dout[d];
      da += dout[d] * x->w2[j * DM + d];
    }
    double dh = da * gelu_grad(h[j]);
    g->b1[j] += dh;
    for (int d = 0; d < DM; d++) {
      g->w1[d * DH + j] += in[d] * dh;
      dx[d] += dh * x->w1[d * DH + j];
    }
  }
  for (int d = 0; d < DM; d++) g->b2[d] += dout[d];
}

/* The layer on T tokens x: y, and with dy the gradients (added to dx, g,
 * dgate). */
static void ref_layer(const model *m, int T, const double *x, double *y,
                      const double *dy, double *dx, expert *g, double *dgate) {
  for (int t = 0; t < T; t++) {
    const double *xt = x + t * DM;
    int sel[K];
    double gw[K], h[K][DH], a[K][DH], o[K][DM], dgw[K], dot = 0;
    ref_gate(m, xt, sel, gw);
    for (int d = 0; d < DM; d++) y[t * DM + d] = 0;
    for (int j = 0; j < K; j++) {
      ref_ffn(&m->ex[sel[j]], xt, h[j], a[j], o[j]);
      for (int d = 0; d < DM; d++) y[t * DM + d] += gw[j] * o[j][d];
    }
    if (!dy) continue;
    for (int j = 0; j < K; j++) {
      double dout[DM];
      dgw[j] = 0;
      for (int d = 0; d < DM; d++) dout[d] = gw[j] * dy[t * DM + d], dgw[j] += dy[t * DM + d] * o[j][d];
      ref_ffn_back(&m->ex[sel[j]], xt, h[j], a[j], dout, &g[sel[j]], dx + t * DM);
      dot += gw[j] * dgw[j];
    }
    for (int j = 0; j < K; j++) {
      double dl = gw[j] * (dgw[j] - dot);
      for (int d = 0; d < DM; d++) {
        dx[t * DM + d] += dl * m->gate[d * m->NE + sel[j]];
        dgate[d * m->NE + sel[j]] += dl * xt[d];
      }
    }
  }
}

/* ---------------------------------------------------------------- helpers */

static float *to_float(const double *v, size_t n) {
  float *f = malloc(n * sizeof *f + 1);
  for (size_t i = 0; i < n; i++) f[i] = (float)v[i];
  return f;
}

static double max_diff(const float *a, const double *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
  return m;
}

static int fail(dist_client *c, const char *what) {
  fprintf(stderr, "moe_layer: %s: %s\n", what, c ? dist_errmsg(c) : "");
  return 1;
}

/* The stored gradient of one expert parameter, compared with want. */
static int grad_diff(dist_client *c, dist_moe_layer *l, int k, const char *which,
                     const double *want, size_t n, double *diff) {
  char name[256], gname[300];
  dist_tensor *t = NULL;
  void *data = NULL;
  size_t nbytes = 0;
  int64_t shape[DIST_MAX_DIMS];
  dist_moe_layer_param_name(l, k, which, name, sizeof name);
  snprintf(gname, sizeof gname, "%s.grad", name);
  int rc = dist_tensor_open(c, gname, &t);
  if (rc == 0) rc = dist_dtensor_to_local(c, t, -1, &data, &nbytes, shape);
  if (rc == 0 && nbytes != n * sizeof(float)) rc = DIST_EMISMATCH;
  if (rc == 0) *diff = fmax(*diff, max_diff(data, want, n));
  free(data);
  dist_tensor_free(t);
  return rc;
}

/* Tokens, inputs and targets of every rank (the same on every trainer). */
typedef struct data {
  int T[MAXW], total;
  double *x[MAXW], *target[MAXW];
} data;

static void data_init(data *d, int W) {
  d->total = 0;
  for (int r = 0; r < W; r++) {
    d->T[r] = 6 + 3 * r;
    d->total += d->T[r];
    d->x[r] = malloc(sizeof(double) * DM * (size_t)d->T[r]);
    d->target[r] = malloc(sizeof(double) * DM * (size_t)d->T[r]);
    for (int i = 0; i < DM * d->T[r]; i++) d->x[r][i] = uniform(1.0), d->target[r][i] = uniform(0.5);
  }
}

/* ---------------------------------------------------------------- the run */

typedef struct run {
  dist_client *c;
  dist_moe_layer *l;
  model m;
  data d;
  int rank;
} run;

/* One forward + backward on the daemons: loss (summed over the ranks),
 * this rank's y and dx, and the all-reduced gate gradient. */
static int step_dist(run *R, float **y, float **dx, float *dgate, double *loss) {
  int r = R->rank, T = R->d.T[r];
  float *x = to_float(R->d.x[r], (size_t)(T * DM)), *gate = to_float(R->m.gate, (size_t)(DM * R->m.NE));
  float *dy = malloc(sizeof(float) * DM * (size_t)T + 1);
  const void *xs[1] = {x};
  int64_t tok[1] = {T};
  void *ys[1] = {NULL}, *dxs[1] = {NULL};
  int rc = dist_moe_layer_forward(R->c, R->l, xs, tok, gate, ys);
  double part = 0;
  for (int i = 0; rc == 0 && i < T * DM; i++) {
    double e = ((float *)ys[0])[i] - R->d.target[r][i];
    part += 0.5 * e * e / R->d.total;
    dy[i] = (float)(e / R->d.total);
  }
  const void *dys[1] = {dy};
  if (rc == 0) rc = dist_moe_layer_backward(R->c, R->l, dys, dxs, dgate);
  if (rc == 0) rc = dist_all_reduce(R->c, dgate, (size_t)(DM * R->m.NE), DIST_FLOAT32, DIST_REDUCE_SUM, NULL, 0);
  if (rc == 0) rc = dist_all_reduce(R->c, &part, 1, DIST_FLOAT64, DIST_REDUCE_SUM, NULL, 0);
  *loss = part;
  *y = ys[0], *dx = dxs[0];
  free(x), free(gate), free(dy);
  return rc;
}

/* The same step computed here for every rank; returns the largest
 * difference from what the daemons gave. */
static int compare(run *R, const float *y, const float *dx, const float *dgate, double *diff) {
  int W = R->m.W, NE = R->m.NE, r = R->rank, rc = 0;
  expert *g = calloc((size_t)NE, sizeof *g);
  double *dg = calloc((size_t)(DM * NE), sizeof *dg);
  *diff = 0;
  for (int s = 0; s < W; s++) {
    int T = R->d.T[s];
    double *ry = calloc((size_t)(T * DM), sizeof *ry), *rdy = calloc((size_t)(T * DM), sizeof *rdy);
    double *rdx = calloc((size_t)(T * DM), sizeof *rdx);
    ref_layer(&R->m, T, R->d.x[s], ry, NULL, NULL, NULL, NULL);
    for (int i = 0; i < T * DM; i++) rdy[i] = (ry[i] - R->d.target[s][i]) / R->d.total;
    ref_layer(&R->m, T, R->d.x[s], ry, rdy, rdx, g, dg);
    if (s == r) *diff = fmax(max_diff(y, ry, (size_t)(T * DM)), max_diff(dx, rdx, (size_t)(T * DM)));
    free(ry), free(rdy), free(rdx);
  }
  *diff = fmax(*diff, max_diff(dgate, dg, (size_t)(DM * NE)));
  for (int k = r * E; rc == 0 && k < (r + 1) * E; k++) {
    rc = grad_diff(R->c, R->l, k, "w1", g[k].w1, DM * DH, diff);
    if (rc == 0) rc = grad_diff(R->c, R->l, k, "b1", g[k].b1, DH, diff);
    if (rc == 0) rc = grad_diff(R->c, R->l, k, "w2", g[k].w2, DH * DM, diff);
    if (rc == 0) rc = grad_diff(R->c, R->l, k, "b2", g[k].b2, DM, diff);
  }
  if (rc == 0) rc = dist_all_reduce(R->c, diff, 1, DIST_FLOAT64, DIST_REDUCE_MAX, NULL, 0);
  free(g), free(dg);
  return rc;
}

static int create_layer(run *R) {
  float *store = malloc(sizeof(float) * E * (2 * DM * DH + DH + DM) + 1);
  dist_expert_weights w[E];
  for (int e = 0; e < E; e++) {
    const expert *x = &R->m.ex[R->rank * E + e];
    float *p = store + e * (2 * DM * DH + DH + DM);
    for (int i = 0; i < DM * DH; i++) p[i] = (float)x->w1[i], p[DM * DH + DH + i] = (float)x->w2[i];
    for (int i = 0; i < DH; i++) p[DM * DH + i] = (float)x->b1[i];
    for (int i = 0; i < DM; i++) p[2 * DM * DH + DH + i] = (float)x->b2[i];
    w[e] = (dist_expert_weights){p, p + DM * DH, p + DM * DH + DH, p + 2 * DM * DH + DH};
  }
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.experts_per_rank = E, o.d_model = DM, o.d_hidden = DH, o.top_k = K;
  o.activation = DIST_EXPERT_GELU, o.bias = 1, o.dtype = DIST_FLOAT32;
  o.weights = w, o.replace = 1;
  int rc = dist_moe_layer_create(R->c, "moe_example", &o, &R->l);
  free(store);
  return rc;
}

/* Plain SGD on the gate, which lives here (replicated over the trainers:
 * each applies the same all-reduced gradient). */
static void update_gate(run *R, const float *dgate) {
  for (int i = 0; i < DM * R->m.NE; i++) R->m.gate[i] -= LR * dgate[i];
}

static int train(run *R) {
  dist_param_opts po = DIST_PARAM_OPTS_INIT;
  po.optimizer = DIST_OPT_SGD, po.lr = LR;
  int rc = dist_moe_layer_configure_optimizer(R->c, R->l, &po);
  if (rc != 0) return fail(R->c, "configure the optimizer");
  double first = 0, loss = 0;
  float *dgate = malloc(sizeof(float) * DM * (size_t)R->m.NE);
  for (int s = 0; s < STEPS && rc == 0; s++) {
    float *y = NULL, *dx = NULL;
    rc = step_dist(R, &y, &dx, dgate, &loss);
    if (rc == 0) rc = dist_moe_layer_step(R->c, R->l);
    if (rc == 0) update_gate(R, dgate);
    if (rc == 0) printf("step %d loss=%.6f\n", s, loss);
    if (s == 0) first = loss;
    free(y), free(dx);
  }
  free(dgate);
  if (rc != 0) return fail(R->c, "training step");
  printf("loss %s: %.6f -> %.6f\n", loss < first ? "went down" : "did NOT go down", first, loss);
  return loss < first ? 0 : 1;
}

int main(void) {
  run R = {0};
  if (dist_init_from_env(&R.c) != 0) {
    fprintf(stderr, "moe_layer: %s\n", dist_last_connect_error());
    return 1;
  }
  R.rank = dist_rank(R.c);
  int W = dist_world_size(R.c), rc = 1;
  if (W > MAXW) {
    fprintf(stderr, "moe_layer: at most %d ranks\n", MAXW);
    goto out;
  }
  model_init(&R.m, W);
  data_init(&R.d, W);
  if (create_layer(&R) != 0) {
    rc = fail(R.c, "create the layer");
    goto out;
  }
  float *y = NULL, *dx = NULL, *dgate = malloc(sizeof(float) * DM * (size_t)R.m.NE);
  double loss = 0, diff = 0;
  rc = step_dist(&R, &y, &dx, dgate, &loss);
  if (rc == 0) rc = compare(&R, y, dx, dgate, &diff);
  free(y), free(dx), free(dgate);
  if (rc != 0) {
    rc = fail(R.c, "forward/backward");
    goto out;
  }
  printf("rank %d: %d tokens, %d experts over %d ranks, top-%d, loss=%.6f\n",
         R.rank, R.d.T[R.rank], R.m.NE, W, K, loss);
  printf("max_abs_diff_vs_local=%g\n", diff);
  dist_moe_layer_zero_grad(R.l);
  rc = diff <= 1e-4 ? train(&R) : 1;
out:
  for (int r = 0; r < W && r < MAXW; r++) free(R.d.x[r]), free(R.d.target[r]);
  free(R.m.gate), free(R.m.ex);
  dist_moe_layer_free(R.l);
  dist_close(R.c);
  return rc;
}
