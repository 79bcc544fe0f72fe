/* Seed 002: Paddle's shard_layer example, an MLP whose parameters live in
 * the daemons, one trainer per rank.
 *
 *   distctl launch -n 2 -- build/examples/shard_mlp
 *
 * fc1 and fc2 are Linear(8, 8) on mesh [0, 1] (dim "x"); shard_fn puts
 * fc1.weight on Shard(0), every other parameter stays Replicate. Rank 0
 * prints each parameter as `<name> shape=[..] placements=[..]`, then runs
 * forward and backward of a mean-squared-error loss on one batch and prints
 * `max_abs_diff_vs_local=<x>`: the largest difference of the output, the
 * loss and every parameter gradient from the same MLP computed here in
 * plain C. Then it trains the MLP with Adam (the parameter service, in the
 * daemons) on y = x @ A and prints the loss of each step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"

enum { B = 16, D = 8, STEPS = 25 };

static int fail(dist_client *c, const char *what) {
  fprintf(stderr, "shard_mlp: %s: %s\n", what, c ? dist_errmsg(c) : "");
  return 1;
}

/* ---------------------------------------------------------------- the model */

/* Paddle's shard_fn: `if layer_name == 'fc1': layer.weight = shard_tensor(
 * layer.weight, mesh, [Shard(0)])`. */
static int shard_fn(const char *name, dist_layer *layer, const dist_mesh *mesh,
                    void *user) {
  (void)mesh, (void)user;
  dist_placement shard0 = DIST_SHARD_DIM(0);
  if (strcmp(name, "fc1") == 0)
    return dist_layer_place_param(layer, "weight", &shard0, 1);
  return 0;
}

static int build_mlp(dist_layer **out) {
  dist_layer *mlp = NULL, *fc1 = NULL, *fc2 = NULL;
  int rc = dist_layer_sequence(&mlp);
  if (!rc) rc = dist_layer_linear(D, D, 1, 1, &fc1);
  if (!rc) rc = dist_layer_add(mlp, "fc1", fc1);
  if (!rc) fc1 = NULL, rc = dist_layer_linear(D, D, 1, 2, &fc2);
  if (!rc) rc = dist_layer_add(mlp, "fc2", fc2);
  if (!rc) fc2 = NULL, rc = dist_layer_set_name(mlp, "shard_mlp");
  dist_layer_free(fc1);
  dist_layer_free(fc2);
  if (rc) dist_layer_free(mlp), mlp = NULL;
  *out = mlp;
  return rc;
}

/* mean((y - t)^2) over every element, a custom layer (no parameters). */
static int build_loss(const dist_mesh *mesh, dist_layer **out) {
  dist_program *p = NULL;
  dist_placement rep = DIST_REPLICATED;
  *out = NULL;
  if (dist_program_new("mse", &p)) return 1;
  int y = dist_input_dtensor(p, "y", DIST_FLOAT32);
  int t = dist_input_dtensor(p, "target", DIST_FLOAT32);
  dist_input_set_no_grad(p, t);
  int d = dist_op_sub(p, y, t);
  dist_program_output(p, dist_op_mean(p, dist_op_mul(p, d, d), NULL, 0, 0));
  dist_program_out_dist_attr(p, mesh, &rep, NULL);
  if (dist_layer_program(p, 2, out)) {
    dist_program_free(p);
    return 1;
  }
  return dist_layer_set_name(*out, "shard_mlp_loss");
}

static void print_params(const dist_layer *mlp) {
  for (int i = 0; i < dist_layer_n_params(mlp); i++) {
    dist_layer_param_info in;
    char shape[128] = "[", pl[128];
    dist_layer_param_at(mlp, i, &in);
    for (int d = 0; d < in.ndim; d++)
      snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld",
               d ? ", " : "", (long long)in.shape[d]);
    strcat(shape, "]");
    dist_placements_format(in.placements, in.nplacements, pl, sizeof pl);
    printf("%s shape=%s placements=%s\n", in.path, shape, pl);
  }
}

/* ---------------------------------------------------------------- the reference */

/* Deterministic values in [-1, 1). */
static void fill(float *x, int n, unsigned seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    x[i] = (float)((seed >> 8) % 2048) / 1024.0f - 1.0f;
  }
}

typedef struct params {
  float w1[D * D], b1[D], w2[D * D], b2[D];
} params;

typedef struct local_result {
  float y[B * D], loss;
  params grad;
} local_result;

/* out[B, D] = in[B, D] @ w[D, D] + b */
static void linear(const float *in, const float *w, const float *b, float *out) {
  for (int r = 0; r < B; r++)
    for (int j = 0; j < D; j++) {
      double s = b[j];
      for (int k = 0; k < D; k++) s += (double)in[r * D + k] * w[k * D + j];
      out[r * D + j] = (float)s;
    }
}

/* dW = in^T @ dy, db = sum of dy's rows, din = dy @ w^T. */
static void linear_back(const float *in, const float *w, const float *dy,
                        float *dw, float *db, float *din) {
  for (int k = 0; k < D; k++)
    for (int j = 0; j < D; j++) {
      double s = 0;
      for (int r = 0; r < B; r++) s += (double)in[r * D + k] * dy[r * D + j];
      dw[k * D + j] = (float)s;
    }
  for (int j = 0; j < D; j++) {
    double s = 0;
    for (int r = 0; r < B; r++) s += dy[r * D + j];
    db[j] = (float)s;
  }
  for (int r = 0; din && r < B; r++)
    for (int k = 0; k < D; k++) {
      double s = 0;
      for (int j = 0; j < D; j++) s += (double)dy[r * D + j] * w[k * D + j];
      din[r * D + k] = (float)s;
    }
}

static void mlp_local(const params *p, const float *x, const float *t,
                      local_result *out) {
  float h[B * D], dy[B * D], dh[B * D];
  double loss = 0;
  linear(x, p->w1, p->b1, h);
  linear(h, p->w2, p->b2, out->y);
  for (int i = 0; i < B * D; i++) {
    double d = (double)out->y[i] - t[i];
    loss += d * d;
    dy[i] = (float)(2.0 * d / (B * D));
  }
  out->loss = (float)(loss / (B * D));
  linear_back(h, p->w2, dy, out->grad.w2, out->grad.b2, dh);
  linear_back(x, p->w1, dh, out->grad.w1, out->grad.b1, NULL);
}

static const char *const param_paths[4] = {"fc1.weight", "fc1.bias",
                                           "fc2.weight", "fc2.bias"};

static float *param_slot(params *p, int i) {
  float *slots[4] = {p->w1, p->b1, p->w2, p->b2};
  return slots[i];
}

static int read_initial(const dist_layer *mlp, params *p) {
  for (int i = 0; i < 4; i++) {
    void *data = NULL;
    size_t n = 0;
    if (dist_layer_read_param(NULL, mlp, param_paths[i], &data, &n)) return 1;
    memcpy(param_slot(p, i), data, n);
    free(data);
  }
  return 0;
}

static double max_diff(const float *a, const float *b, size_t n, double m) {
  for (size_t i = 0; i < n; i++)
    if (fabs((double)a[i] - b[i]) > m) m = fabs((double)a[i] - b[i]);
  return m;
}

/* ---------------------------------------------------------------- one step */

typedef struct model {
  dist_layer *mlp, *loss;
  dist_tensor *x, *t;
} model;

/* Forward and backward; *y (may be NULL) gets the output's handle. */
static int step(dist_client *c, model *m, float *loss, dist_tensor **y_out) {
  dist_tensor *y = NULL, *l = NULL, *in_grads[2] = {NULL, NULL};
  void *data = NULL;
  size_t n = 0;
  int rc = 1;
  if (dist_layer_forward(c, m->mlp, &m->x, 1, &y, 1) != 1) goto out;
  dist_tensor *loss_in[2] = {y, m->t};
  if (dist_layer_forward(c, m->loss, loss_in, 2, &l, 1) != 1) goto out;
  if (dist_full_tensor(c, l, &data, &n) != 0 || n != sizeof(float)) goto out;
  *loss = *(float *)data;
  if (dist_layer_backward(c, m->loss, NULL, in_grads) != 0 || !in_grads[0])
    goto out;
  if (dist_layer_backward(c, m->mlp, &in_grads[0], NULL) != 0) goto out;
  rc = 0;
out:
  free(data);
  dist_tensor_free(l);
  dist_tensor_free(in_grads[0]);
  dist_tensor_free(in_grads[1]);
  if (y_out && rc == 0) *y_out = y;
  else dist_tensor_free(y);
  return rc;
}

/* The distributed forward and backward against mlp_local. */
static int compare(dist_client *c, model *m, const params *p0, const float *x,
                   const float *t, double *diff) {
  local_result ref;
  dist_tensor *y = NULL;
  float loss = 0;
  void *data = NULL;
  size_t n = 0;
  mlp_local(p0, x, t, &ref);
  if (step(c, m, &loss, &y)) return 1;
  int rc = dist_full_tensor(c, y, &data, &n);
  dist_tensor_free(y);
  if (rc || n != sizeof ref.y) return free(data), 1;
  *diff = max_diff(data, ref.y, B * D, fabs((double)loss - ref.loss));
  free(data);
  for (int i = 0; i < 4; i++) {
    if (dist_layer_read_grad(c, m->mlp, param_paths[i], &data, &n)) return 1;
    *diff = max_diff(data, param_slot(&ref.grad, i), n / sizeof(float), *diff);
    free(data);
  }
  return 0;
}

static int train(dist_client *c, model *m, int rank) {
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.optimizer = DIST_OPT_ADAM;
  o.lr = 0.02;
  o.trainers = 1; /* each daemon hears from its own trainer */
  if (dist_layer_configure_optimizer(c, m->mlp, &o)) return fail(c, "optimizer");
  for (int s = 1; s <= STEPS; s++) {
    float loss = 0;
    if (step(c, m, &loss, NULL)) return fail(c, "training step");
    if (dist_layer_step(c, m->mlp, 0)) return fail(c, "optimizer step");
    if (rank == 0) printf("step %d loss=%.6f\n", s, loss);
  }
  return 0;
}

static int put_batch(dist_client *c, const dist_mesh *mesh, const float *x,
                     const float *t, model *m) {
  int64_t shape[2] = {B, D};
  dist_placement rep = DIST_REPLICATED;
  if (dist_shard_tensor(c, "shard_mlp.x", x, DIST_FLOAT32, 2, shape, mesh, &rep,
                        &m->x))
    return 1;
  return dist_shard_tensor(c, "shard_mlp.target", t, DIST_FLOAT32, 2, shape,
                           mesh, &rep, &m->t);
}

static int run(dist_client *c) {
  int rank = dist_rank(c), rc = 1;
  model m = {NULL, NULL, NULL, NULL};
  dist_mesh *mesh = NULL;
  params p0;
  float x[B * D], a[D * D], t[B * D], unused[D];
  double diff = 0;
  memset(unused, 0, sizeof unused);
  fill(x, B * D, 7);
  fill(a, D * D, 11);
  linear(x, a, unused, t); /* the regression target y = x @ A */
  if (dist_mesh_from_string("[0,1]", "x", &mesh)) return fail(c, "mesh");
  if (build_mlp(&m.mlp) || read_initial(m.mlp, &p0) ||
      build_loss(mesh, &m.loss)) {
    fail(NULL, "building the layers");
    goto out;
  }
  if (dist_shard_layer(c, m.mlp, mesh, shard_fn, NULL, NULL, NULL) ||
      dist_shard_layer(c, m.loss, mesh, NULL, NULL, NULL, NULL)) {
    fail(c, "shard_layer");
    goto out;
  }
  if (rank == 0) print_params(m.mlp);
  if (put_batch(c, mesh, x, t, &m) || compare(c, &m, &p0, x, t, &diff)) {
    fail(c, "forward/backward");
    goto out;
  }
  if (rank == 0) printf("max_abs_diff_vs_local=%.3g\n", diff);
  fflush(stdout);
  if (train(c, &m, rank)) goto out;
  rc = diff <= 1e-5 ? 0 : 1;
out:
  fflush(stdout);
  if (m.x) dist_tensor_delete(c, "shard_mlp.x");
  if (m.t) dist_tensor_delete(c, "shard_mlp.target");
  dist_tensor_free(m.x);
  dist_tensor_free(m.t);
  dist_layer_destroy(c, m.loss);
  dist_layer_destroy(c, m.mlp);
  dist_mesh_free(mesh);
  return rc;
}

int main(void) {
  dist_client *c = NULL;
  if (dist_init_from_env(&c) != 0) {
    fprintf(stderr, "shard_mlp: %s\n", dist_last_connect_error());
    return 1;
  }
  int rc = 1;
  if (dist_world_size(c) != 2 || dist_rank(c) < 0)
    fprintf(stderr, "shard_mlp: the seed needs 2 ranks (distctl launch -n 2)\n");
  else
    rc = run(c);
  dist_close(c);
  return rc;
}
