/* The parameter service end to end: real daemons, libdist. Every expected
 * value is computed here from torch.optim's update formulas on the whole
 * tensor, independently of the daemon's kernels and of the slicing. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "harness_fixture.h"

/* n daemons, each also given `extra` (one argument, or NULL). */
static dist_client *start_with(int n, const char *extra) {
  const char *args[] = {extra, NULL};
  return harness_start_unique_with_client(&cluster, n, "param-test", args);
}

static dist_client *start(int n) { return start_with(n, NULL); }

TestSuite(param, .fini = stop_cluster, .timeout = 120);

static dist_tensor *put(dist_client *c, const char *name, dist_dtype dt,
                        const void *data, int ndim, const int64_t *shape,
                        const char *mesh_text, const char *placements) {
  return harness_put(c, name, dt, data, ndim, shape, mesh_text, placements);
}

static double grad_value(int trainer, int step, int i) {
  return sin(0.37 * i + 1.1 * trainer + 0.5 * step) * (1 + 0.1 * (i % 5));
}

/* Reference optimizer state over the whole tensor, in long double. */
typedef struct ref {
  int n;
  long double *p, *a, *b; /* param, momentum or m, v */
} ref;

static void ref_init(ref *r, const double *p0, int n) {
  r->n = n;
  r->p = calloc((size_t)n, sizeof *r->p);
  r->a = calloc((size_t)n, sizeof *r->a);
  r->b = calloc((size_t)n, sizeof *r->b);
  for (int i = 0; i < n; i++) r->p[i] = p0[i];
}

static void ref_free(ref *r) {
  free(r->p);
  free(r->a);
  free(r->b);
}

static void ref_step(ref *r, const dist_param_opts *o, const double *g, int t) {
  for (int i = 0; i < r->n; i++) {
    long double d = g[i];
    if (o->optimizer == DIST_OPT_SGD) {
      d += o->weight_decay * r->p[i];
      if (o->momentum != 0) {
        r->a[i] = t == 1 ? d : o->momentum * r->a[i] + (1 - o->dampening) * d;
        d = o->nesterov ? d + o->momentum * r->a[i] : r->a[i];
      }
      r->p[i] -= o->lr * d;
      continue;
    }
    if (o->optimizer == DIST_OPT_ADAMW) r->p[i] *= 1 - o->lr * o->weight_decay;
    else d += o->weight_decay * r->p[i];
    r->a[i] = o->beta1 * r->a[i] + (1 - o->beta1) * d;
    r->b[i] = o->beta2 * r->b[i] + (1 - o->beta2) * d * d;
    long double mh = r->a[i] / (1 - powl(o->beta1, t));
    long double vh = r->b[i] / (1 - powl(o->beta2, t));
    r->p[i] -= o->lr * mh / (sqrtl(vh) + o->eps);
  }
}

/* Trainers from..to-1 push their step-t gradients (rounded to dt, as the
 * daemon sees them); their sum is added to acc, and *version (may be NULL)
 * gets the version the last push reported. */
static void push_trainers(dist_client *c, const char *name, dist_dtype dt, int n, int t,
                          int from, int to, double *acc, uint64_t *version) {
  size_t elem = dt == DIST_FLOAT32 ? 4 : 8;
  void *g = malloc((size_t)n * elem);
  for (int k = from; k < to; k++) {
    for (int i = 0; i < n; i++) {
      double x = grad_value(k, t, i);
      if (dt == DIST_FLOAT32) x = (float)x, ((float *)g)[i] = (float)x;
      else ((double *)g)[i] = x;
      acc[i] += x;
    }
    cr_assert_eq(dist_param_push(c, name, k, g, (size_t)n * elem, version), 0, "%s",
                 dist_errmsg(c));
  }
  free(g);
}

/* Advances r by update t from the summed gradients in acc (averaged when
 * o reduces by avg), then checks that `name`, pulled at min_version or
 * later, has r's values. */
static void step_and_compare(dist_client *c, const char *name, dist_dtype dt, ref *r,
                             const dist_param_opts *o, int t, double *acc,
                             uint64_t min_version, double tol) {
  int n = r->n;
  if (o->reduce == DIST_REDUCE_AVG)
    for (int i = 0; i < n; i++) acc[i] /= o->trainers;
  ref_step(r, o, acc, t);
  void *data = NULL;
  size_t nbytes = 0;
  uint64_t v;
  cr_assert_eq(dist_param_pull(c, name, min_version, &data, &nbytes, &v), 0, "%s",
               dist_errmsg(c));
  cr_assert_eq(nbytes, (size_t)n * (dt == DIST_FLOAT32 ? 4 : 8));
  for (int i = 0; i < n; i++) {
    double got = dt == DIST_FLOAT32 ? ((float *)data)[i] : ((double *)data)[i];
    cr_assert(fabs(got - (double)r->p[i]) <= tol * (1 + fabs((double)r->p[i])),
              "step %d elem %d: daemon %.10g, reference %.10g", t, i, got,
              (double)r->p[i]);
  }
  free(data);
}

/* Trains `name` for synchronous steps first..last with `trainers` trainers
 * pushing whole gradients, advancing the reference r alongside, and
 * compares every pulled value with it. */
static void train_steps(dist_client *c, const char *name, dist_dtype dt, ref *r,
                        const dist_param_opts *o, int first, int last, double tol) {
  double *acc = malloc(sizeof *acc * (size_t)r->n);
  uint64_t v0 = 0, v = 0;
  void *data = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_param_pull(c, name, 0, &data, &nbytes, &v0), 0, "%s", dist_errmsg(c));
  free(data);
  for (int t = first; t <= last; t++) {
    uint64_t want_v = v0 + (uint64_t)(t - first + 1);
    memset(acc, 0, sizeof *acc * (size_t)r->n);
    push_trainers(c, name, dt, r->n, t, 0, o->trainers, acc, &v);
    cr_assert_eq(v, want_v, "step %d: version %llu", t, (unsigned long long)v);
    step_and_compare(c, name, dt, r, o, t, acc, want_v, tol);
  }
  free(acc);
}

static void train_and_compare(dist_client *c, const char *name, dist_dtype dt,
                              int n, const double *p0, const dist_param_opts *o,
                              int steps, double tol) {
  ref r;
  ref_init(&r, p0, n);
  train_steps(c, name, dt, &r, o, 1, steps, tol);
  ref_free(&r);
}

static dist_param_opts adam(double lr, int trainers) {
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.optimizer = DIST_OPT_ADAM;
  o.lr = lr;
  o.weight_decay = 0.01;
  o.trainers = trainers;
  return o;
}

static void fill(double *p, int n) {
  for (int i = 0; i < n; i++) p[i] = 0.1 * i - 0.7;
}

Test(param, adam_on_row_shards_matches_reference) {
  dist_client *c = start(2);
  double p0[6 * 5];
  float p32[30];
  fill(p0, 30);
  for (int i = 0; i < 30; i++) p32[i] = (float)p0[i], p0[i] = p32[i];
  int64_t shape[2] = {6, 5};
  dist_tensor *t = put(c, "w", DIST_FLOAT32, p32, 2, shape, "[0,1]", "Shard(0)");
  dist_param_opts o = adam(0.01, 2);
  cr_assert_eq(dist_param_configure(c, "w", &o), 0, "%s", dist_errmsg(c));
  train_and_compare(c, "w", DIST_FLOAT32, 30, p0, &o, 4, 1e-5);
  dist_tensor_free(t);
  dist_close(c);
}

Test(param, adamw_on_uneven_column_shards_matches_reference) {
  dist_client *c = start(3);
  double p0[4 * 7];
  fill(p0, 28);
  int64_t shape[2] = {4, 7}; /* 7 over 3: 3, 3, 1 */
  dist_tensor *t = put(c, "w", DIST_FLOAT64, p0, 2, shape, "[0,1,2]", "Shard(1)");
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.optimizer = DIST_OPT_ADAMW;
  o.lr = 0.05;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.weight_decay = 0.1;
  o.trainers = 3;
  o.reduce = DIST_REDUCE_SUM;
  cr_assert_eq(dist_param_configure(c, "w", &o), 0, "%s", dist_errmsg(c));
  train_and_compare(c, "w", DIST_FLOAT64, 28, p0, &o, 3, 1e-12);
  dist_tensor_free(t);
  dist_close(c);
}

Test(param, sgd_momentum_on_replicated_parameter_matches_reference) {
  dist_client *c = start(2);
  double p0[10];
  fill(p0, 10);
  int64_t shape[1] = {10};
  dist_tensor *t = put(c, "b", DIST_FLOAT64, p0, 1, shape, "[0,1]", "Replicate()");
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.optimizer = DIST_OPT_SGD;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = 1;
  o.weight_decay = 0.01;
  o.trainers = 1;
  cr_assert_eq(dist_param_configure(c, "b", &o), 0, "%s", dist_errmsg(c));
  train_and_compare(c, "b", DIST_FLOAT64, 10, p0, &o, 4, 1e-12);
  dist_tensor_free(t);
  dist_close(c);
}

static void pull_now(dist_client *c, const char *name, double *out, int n,
                     uint64_t *version) {
  void *data = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_param_pull(c, name, 0, &data, &nbytes, version), 0, "%s",
               dist_errmsg(c));
  cr_assert_eq(nbytes, sizeof(double) * (size_t)n);
  memcpy(out, data, nbytes);
  free(data);
}

/* Plain SGD with lr 1 subtracts the reduced gradient, which makes the
 * effect of each push easy to read. */
static dist_client *sgd_param(int trainers, dist_consistency mode, double *p0) {
  dist_client *c = start(2);
  for (int i = 0; i < 4; i++) p0[i] = 10 * (i + 1);
  int64_t shape[1] = {4};
  dist_tensor_free(put(c, "w", DIST_FLOAT64, p0, 1, shape, "[0,1]", "Shard(0)"));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = 1;
  o.trainers = trainers;
  o.consistency = mode;
  o.reduce = DIST_REDUCE_AVG;
  cr_assert_eq(dist_param_configure(c, "w", &o), 0, "%s", dist_errmsg(c));
  return c;
}

Test(param, sync_update_waits_for_every_trainer) {
  double p0[4], now[4];
  dist_client *c = sgd_param(3, DIST_PARAM_SYNC, p0);
  uint64_t v0, v;
  pull_now(c, "w", now, 4, &v0);
  double g[3][4] = {{3, 3, 3, 3}, {6, 0, 6, 0}, {0, 3, 0, 3}};
  cr_assert_eq(dist_param_push(c, "w", 0, g[0], sizeof g[0], &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(v, v0);
  /* The same trainer again before the update: refused, nothing counted. */
  cr_assert_eq(dist_param_push(c, "w", 0, g[0], sizeof g[0], &v), DIST_EEXIST);
  cr_assert(strstr(dist_errmsg(c), "trainer 0 already pushed"), "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_push(c, "w", 1, g[1], sizeof g[1], &v), 0, "%s", dist_errmsg(c));
  pull_now(c, "w", now, 4, &v);
  cr_assert_eq(v, v0, "no update before the third trainer");
  for (int i = 0; i < 4; i++) cr_assert_eq(now[i], p0[i]);
  cr_assert_eq(dist_param_push(c, "w", 3, g[2], sizeof g[2], &v), DIST_EINVAL,
               "trainer 3 is out of range");
  cr_assert_eq(dist_param_push(c, "w", 2, g[2], sizeof g[2], &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(v, v0 + 1);
  pull_now(c, "w", now, 4, &v);
  for (int i = 0; i < 4; i++)
    cr_assert_float_eq(now[i], p0[i] - (g[0][i] + g[1][i] + g[2][i]) / 3, 1e-12,
                       "elem %d: %g", i, now[i]);
  dist_close(c);
}

Test(param, async_applies_each_push_at_once) {
  double p0[4], now[4];
  dist_client *c = sgd_param(2, DIST_PARAM_ASYNC, p0);
  uint64_t v0, v;
  pull_now(c, "w", now, 4, &v0);
  double g[4] = {1, 2, 3, 4};
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(v, v0 + 1);
  pull_now(c, "w", now, 4, &v);
  for (int i = 0; i < 4; i++) cr_assert_float_eq(now[i], p0[i] - g[i], 1e-12);
  /* The same trainer may push again: each push is its own update. */
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_push(c, "w", 1, g, sizeof g, &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(v, v0 + 3);
  pull_now(c, "w", now, 4, &v);
  for (int i = 0; i < 4; i++) cr_assert_float_eq(now[i], p0[i] - 3 * g[i], 1e-12);
  dist_close(c);
}

Test(param, pull_waits_for_a_version) {
  double p0[4], now[4];
  dist_client *c = sgd_param(1, DIST_PARAM_SYNC, p0);
  uint64_t v0, v;
  pull_now(c, "w", now, 4, &v0);
  dist_opts quick = DIST_OPTS_INIT;
  quick.timeout_ms = 300;
  dist_client *slow = NULL;
  cr_assert_eq(dist_connect_cluster(cluster.cluster_file, &quick, &slow), 0);
  void *data = NULL;
  size_t nbytes;
  /* Nobody pushes: the wait ends at the deadline with a clear error. */
  int rc = dist_param_pull(slow, "w", v0 + 1, &data, &nbytes, &v);
  cr_assert_eq(rc, DIST_ETIMEDOUT, "rc %d: %s", rc, dist_errmsg(slow));
  dist_close(slow);
  double g[4] = {1, 1, 1, 1};
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_pull(c, "w", v0 + 1, &data, &nbytes, &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(v, v0 + 1);
  free(data);
  dist_close(c);
}

Test(param, gradient_with_wrong_shape_is_refused_and_changes_nothing) {
  double p0[4], now[4];
  dist_client *c = sgd_param(2, DIST_PARAM_SYNC, p0);
  uint64_t v0, v;
  pull_now(c, "w", now, 4, &v0);
  double g[5] = {1, 1, 1, 1, 1};
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof(double) * 5, &v), DIST_EMISMATCH);
  cr_assert(strstr(dist_errmsg(c), "40 bytes"), "%s", dist_errmsg(c));
  /* A piece of the wrong size sent straight to one daemon. */
  cr_assert_eq(dist_param_push_local(c, "w", 0, 1, g, sizeof(double) * 3, &v),
               DIST_EMISMATCH);
  cr_assert(strstr(dist_errmsg(c), "rank 1's shard is [2] float64"), "%s", dist_errmsg(c));
  /* A stored gradient of another shape. */
  int64_t shape[1] = {5};
  dist_tensor_free(put(c, "g5", DIST_FLOAT64, g, 1, shape, "[0,1]", "Shard(0)"));
  cr_assert_eq(dist_param_push_tensor(c, "w", 0, "g5", &v), DIST_EMISMATCH);
  cr_assert(strstr(dist_errmsg(c), "does not match parameter 'w'"), "%s", dist_errmsg(c));
  /* Nothing was counted: both trainers still complete exactly one update. */
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof(double) * 4, &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(v, v0);
  cr_assert_eq(dist_param_push(c, "w", 1, g, sizeof(double) * 4, &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(v, v0 + 1);
  pull_now(c, "w", now, 4, &v);
  for (int i = 0; i < 4; i++) cr_assert_float_eq(now[i], p0[i] - 1, 1e-12);
  dist_close(c);
}

/* A stored gradient on another mesh was refused as "tensor not found"
 * (where the parameter's daemon holds none of it) or with dtypes and
 * shapes that agree ("float64 [4] on its mesh" both sides). The errors
 * name the meshes; nothing is counted. */
Test(param, a_stored_gradient_on_another_mesh_is_refused_naming_the_meshes) {
  double p0[4], now[4], g[4] = {1, 1, 1, 1};
  int64_t shape[1] = {4};
  uint64_t v0, v;
  dist_client *c = sgd_param(1, DIST_PARAM_SYNC, p0);
  pull_now(c, "w", now, 4, &v0);
  dist_tensor_free(put(c, "g_swapped", DIST_FLOAT64, g, 1, shape, "[1,0]", "Shard(0)"));
  cr_assert_eq(dist_param_push_tensor(c, "w", 0, "g_swapped", &v), DIST_EMISMATCH);
  cr_assert(strstr(dist_errmsg(c), "(float64 [4] on mesh [1, 0]) does not match parameter "
                   "'w' (float64 [4] on mesh [0, 1])"), "%s", dist_errmsg(c));
  dist_tensor_free(put(c, "g_one", DIST_FLOAT64, g, 1, shape, "[1]", "Replicate()"));
  cr_assert_eq(dist_param_push_tensor(c, "w", 0, "g_one", &v), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(c), "gradient for 'w' (it must be stored on the parameter's "
                   "mesh): tensor 'g_one' not found"), "%s", dist_errmsg(c));
  pull_now(c, "w", now, 4, &v);
  cr_assert_eq(v, v0, "an update was applied");
  cr_assert_eq(memcmp(now, p0, sizeof now), 0);
  dist_close(c);
}

/* A piece pushed to a daemon outside the parameter's mesh was refused as
 * "'w' is not a parameter (configure it with an optimizer first)", of a
 * parameter configured on its mesh. The error says that daemon holds no
 * piece of it; nothing is counted. */
Test(param, a_push_to_a_daemon_outside_the_mesh_says_it_holds_no_piece) {
  dist_client *c = start(3);
  double p0[2] = {1, 2}, g[1] = {1}, now[2];
  int64_t shape[1] = {2};
  dist_tensor_free(put(c, "w", DIST_FLOAT64, p0, 1, shape, "[0,1]", "Shard(0)"));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  cr_assert_eq(dist_param_configure(c, "w", &o), 0, "%s", dist_errmsg(c));
  uint64_t v0, v;
  pull_now(c, "w", now, 2, &v0);
  cr_assert_eq(dist_param_push_local(c, "w", 0, 2, g, sizeof g, &v), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(c), "this daemon holds no piece of 'w': push to the daemons "
                   "of its mesh"), "%s", dist_errmsg(c));
  double p1[2] = {3, 4};
  dist_tensor_free(put(c, "plain", DIST_FLOAT64, p1, 1, shape, "[2]", "Replicate()"));
  cr_assert_eq(dist_param_push_local(c, "plain", 0, 2, g, sizeof g, &v), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(c), "'plain' is not a parameter"), "%s", dist_errmsg(c));
  pull_now(c, "w", now, 2, &v);
  cr_assert_eq(v, v0, "an update was applied");
  dist_close(c);
}

/* A data-parallel gradient as the daemons hold it: Partial(sum) over the
 * mesh, each rank's piece its own contribution; it is reduced before the
 * update is applied to the replicated parameter. */
Test(param, partial_gradient_tensor_is_reduced_over_ranks) {
  dist_client *c = start(2);
  double p0[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  dist_tensor_free(put(c, "w", DIST_FLOAT64, p0, 1, shape, "[0,1]", "Replicate()"));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = 0.5;
  cr_assert_eq(dist_param_configure(c, "w", &o), 0, "%s", dist_errmsg(c));
  double g0[3] = {1, 0, 2}, g1[3] = {3, 4, 0};
  const void *pieces[2] = {g0, g1};
  const int64_t *shapes[2] = {shape, shape};
  dist_mesh *mesh = NULL;
  dist_placement p = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_tensor *g = NULL;
  cr_assert_eq(dist_mesh_from_string("[0,1]", NULL, &mesh), 0);
  cr_assert_eq(dist_dtensor_from_local(c, "grad", pieces, DIST_FLOAT64, 1, shapes,
                                       mesh, &p, &g), 0, "%s", dist_errmsg(c));
  uint64_t v;
  cr_assert_eq(dist_param_push_tensor(c, "w", 0, "grad", &v), 0, "%s", dist_errmsg(c));
  double now[3];
  pull_now(c, "w", now, 3, &v);
  for (int i = 0; i < 3; i++)
    cr_assert_float_eq(now[i], p0[i] - 0.5 * (g0[i] + g1[i]), 1e-12, "elem %d", i);
  dist_tensor_free(g);
  dist_mesh_free(mesh);
  dist_close(c);
}

Test(param, integer_parameters_and_bad_options_are_refused) {
  dist_client *c = start(1);
  int32_t x[2] = {1, 2};
  int64_t shape[1] = {2};
  dist_tensor_free(put(c, "i", DIST_INT32, x, 1, shape, "[0]", "Replicate()"));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  cr_assert_eq(dist_param_configure(c, "i", &o), DIST_ENOTSUP);
  cr_assert(strstr(dist_errmsg(c), "float32 or float64"), "%s", dist_errmsg(c));
  double d[2] = {1, 2};
  dist_tensor_free(put(c, "d", DIST_FLOAT64, d, 1, shape, "[0]", "Replicate()"));
  o.optimizer = DIST_OPT_ADAM;
  o.beta1 = 1.5;
  cr_assert_eq(dist_param_configure(c, "d", &o), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "beta1"), "%s", dist_errmsg(c));
  uint64_t v;
  cr_assert_eq(dist_param_push(c, "d", 0, d, sizeof d, &v), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(c), "not a parameter"), "%s", dist_errmsg(c));
  dist_close(c);
}

/* libdist sent any consistency but ASYNC as SYNC, and trainers below 1 as
 * 0: an unknown mode configured a synchronous parameter, and trainers -3
 * was refused as "trainers = 0". Both go to the daemons as given, which
 * refuse them by their value, configuring nothing; an unknown reduction
 * too, which was named "invalid". */
Test(param, an_unknown_mode_or_negative_trainers_is_refused_by_its_value) {
  dist_client *c = start(2);
  double d[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  dist_tensor_free(put(c, "d", DIST_FLOAT64, d, 1, shape, "[0,1]", "Shard(0)"));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.consistency = (dist_consistency)7;
  cr_assert_eq(dist_param_configure(c, "d", &o), DIST_EINVAL, "%s", dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "unknown consistency mode 7"), "%s", dist_errmsg(c));
  o.consistency = DIST_PARAM_SYNC;
  o.trainers = -3;
  cr_assert_eq(dist_param_configure(c, "d", &o), DIST_EINVAL, "%s", dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "trainers = -3: must be 1 to 65536"), "%s",
            dist_errmsg(c));
  o.trainers = 1;
  o.reduce = (dist_reduce)99;
  cr_assert_eq(dist_param_configure(c, "d", &o), DIST_EINVAL, "%s", dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "by sum or avg, not by unknown reduction 99"), "%s",
            dist_errmsg(c));
  for (int r = 0; r < 2; r++) {
    dist_params_report rep;
    cr_assert_eq(dist_params(c, r, &rep), 0, "%s", dist_errmsg(c));
    cr_assert_eq(rep.n, 0, "rank %d holds a parameter configured from bad options", r);
    dist_params_report_free(&rep);
  }
  dist_close(c);
}

/* Parameter "w", rows x cols float64 Shard(0) over mesh_text, configured
 * with o; r is its reference, from the same initial values. */
static dist_tensor *adam_w(dist_client *c, int rows, int cols, const char *mesh_text,
                           const dist_param_opts *o, ref *r) {
  int n = rows * cols;
  double *p0 = malloc(sizeof *p0 * (size_t)n);
  fill(p0, n);
  int64_t shape[2] = {rows, cols};
  dist_tensor *t = put(c, "w", DIST_FLOAT64, p0, 2, shape, mesh_text, "Shard(0)");
  cr_assert_eq(dist_param_configure(c, "w", o), 0, "%s", dist_errmsg(c));
  ref_init(r, p0, n);
  free(p0);
  return t;
}

/* A cluster of n daemons where "w" (rows x cols, Shard(0) over [0,1]) took
 * `steps` Adam updates with two trainers, and trainer 0 pushed for the
 * next one (added into acc): trainer 1's push is pending. */
static dist_tensor *adam_pending(int n, int rows, int cols, int steps, dist_param_opts *o,
                                 ref *r, double *acc, dist_client **c) {
  *c = start(n);
  dist_tensor *t = adam_w(*c, rows, cols, "[0,1]", o, r);
  train_steps(*c, "w", DIST_FLOAT64, r, o, 1, steps, 1e-12);
  push_trainers(*c, "w", DIST_FLOAT64, rows * cols, steps + 1, 0, 1, acc, NULL);
  return t;
}

/* The reshard of "w" (made by adam_pending) to mesh / p is refused with
 * the pending push named. */
static void expect_refused_while_pending(dist_client *c, dist_tensor *t, const dist_mesh *mesh,
                                         const dist_placement *p) {
  cr_assert_eq(dist_reshard(c, t, mesh, p), DIST_EUNAVAIL, "%s", dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "parameter 'w' has 1 push pending on rank 0"), "%s",
            dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "nothing was changed"), "%s", dist_errmsg(c));
}

/* A reshard between two trainers' pushes of one synchronous update would
 * lose the pushes made: it is refused on every daemon, with nothing
 * changed, and the update then completes and continues as the reference. */
Test(param, reshard_with_pushes_pending_is_refused_and_changes_nothing) {
  dist_param_opts o = adam(0.05, 2);
  ref r;
  double acc[16] = {0};
  dist_client *c = NULL;
  dist_tensor *t = adam_pending(2, 8, 2, 1, &o, &r, acc, &c);
  dist_placement s1 = DIST_SHARD_DIM(1);
  expect_refused_while_pending(c, t, NULL, &s1);
  dist_tensor *seen = NULL; /* what the daemons hold, not the handle's copy */
  cr_assert_eq(dist_tensor_open(c, "w", &seen), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tensor_placements(seen)[0].kind, DIST_SHARD);
  cr_assert_eq(dist_tensor_placements(seen)[0].dim, 0);
  dist_tensor_free(seen);
  push_trainers(c, "w", DIST_FLOAT64, 16, 2, 1, 2, acc, NULL);
  step_and_compare(c, "w", DIST_FLOAT64, &r, &o, 2, acc, 0, 1e-12);
  /* With the update applied, the same reshard goes through and the state
   * follows. */
  cr_assert_eq(dist_reshard(c, t, NULL, &s1), 0, "%s", dist_errmsg(c));
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 3, 4, 1e-12);
  ref_free(&r);
  dist_tensor_free(t);
  dist_close(c);
}

/* Two daemons where "w", p0[0..4) as Shard(0) over [0,1], is an
 * asynchronous SGD parameter at learning rate lr. */
static dist_tensor *async_sgd_w(const double *p0, double lr, dist_client **c) {
  *c = start(2);
  int64_t shape[1] = {4};
  dist_tensor *t = put(*c, "w", DIST_FLOAT64, p0, 1, shape, "[0,1]", "Shard(0)");
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = lr;
  o.consistency = DIST_PARAM_ASYNC;
  cr_assert_eq(dist_param_configure(*c, "w", &o), 0, "%s", dist_errmsg(*c));
  return t;
}

/* A client racing the main thread's reshards, on its own connection: it
 * makes attempt k = 1, 2, ... until *stop, counting each outcome. */
typedef struct racer {
  dist_client *c;
  volatile int *stop;
  int (*attempt)(struct racer *r, int k); /* 0 when applied */
  const char *refusal; /* in the message of the expected refusal */
  const double *g;     /* the gradient pushed */
  double last_lr;      /* the learning rate of the last change applied */
  int applied, refused, other; /* other: any other outcome (a failure) */
  char other_msg[256];
} racer;

static void *race_loop(void *arg) {
  racer *r = arg;
  for (int k = 1; !*r->stop && !r->other; k++) {
    int rc = r->attempt(r, k);
    if (rc == 0) {
      __atomic_add_fetch(&r->applied, 1, __ATOMIC_RELAXED);
    } else if (rc == DIST_EUNAVAIL && strstr(dist_errmsg(r->c), r->refusal)) {
      __atomic_add_fetch(&r->refused, 1, __ATOMIC_RELAXED);
    } else {
      snprintf(r->other_msg, sizeof r->other_msg, "%s", dist_errmsg(r->c));
      r->other = rc;
    }
  }
  return NULL;
}

static int push_attempt(racer *r, int k) {
  (void)k;
  return dist_param_push(r->c, "w", 0, r->g, 4 * sizeof *r->g, NULL);
}

/* Pushes while the parameter is resharded back and forth on two daemons:
 * the reshard reaches them at different moments, yet each push is either
 * applied by both, and then kept through every later reshard, or refused
 * by both as "being resharded" with nothing changed. With SGD at lr 1 the
 * value is then p0 minus the applied pushes, exactly, on every element
 * (a push applied by one daemon only would show on its half, or as
 * replicas that disagree). */
Test(param, pushes_during_reshards_are_applied_or_refused_never_lost) {
  double p0[4] = {10, 20, 30, 40}, g[4] = {1, 2, 3, 4}, now[4];
  dist_client *c = NULL;
  dist_tensor *t = async_sgd_w(p0, 1, &c);
  volatile int stop = 0;
  racer pu = {.c = harness_client(&cluster), .stop = &stop, .attempt = push_attempt,
              .refusal = "resharded", .g = g};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, race_loop, &pu), 0);
  dist_placement rep = DIST_REPLICATED, s0 = DIST_SHARD_DIM(0);
  /* 60 reshards at least, and on until some pushes got through (a push
   * sliced before a reshard is refused, so most are), for 30 s at most. */
  double until = harness_now_s() + 30;
  for (int i = 0; i < 60 || (__atomic_load_n(&pu.applied, __ATOMIC_RELAXED) < 3 &&
                             harness_now_s() < until);
       i++) {
    cr_assert_eq(dist_reshard(c, t, NULL, i % 2 ? &s0 : &rep), 0, "%s", dist_errmsg(c));
    harness_sleep_ms(1);
  }
  stop = 1;
  pthread_join(th, NULL);
  cr_assert_eq(pu.other, 0, "a push failed otherwise: %s", pu.other_msg);
  cr_assert_gt(pu.applied, 0);
  uint64_t v;
  cr_assert_eq(dist_reshard(c, t, NULL, &rep), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++) { /* each replica, read on its own */
    void *piece = NULL;
    size_t nbytes = 0;
    int64_t lshape[1];
    cr_assert_eq(dist_dtensor_to_local(c, t, r, &piece, &nbytes, lshape), 0, "%s",
                 dist_errmsg(c));
    cr_assert_eq(nbytes, sizeof now);
    memcpy(now, piece, sizeof now);
    free(piece);
    for (int i = 0; i < 4; i++)
      cr_assert_float_eq(now[i], p0[i] - pu.applied * g[i], 1e-9,
                         "rank %d elem %d: %g after %d applied pushes (%d refused)", r,
                         i, now[i], pu.applied, pu.refused);
  }
  pull_now(c, "w", now, 4, &v);
  dist_close(pu.c);
  dist_tensor_free(t);
  dist_close(c);
}

/* The optimizer state is resharded with its parameter (Shard(0) -> Shard(1)
 * -> Replicate on the same mesh): the updates after each reshard are the
 * ones the reference makes without any. */
Test(param, adam_state_follows_its_parameter_through_reshards) {
  dist_client *c = start(3);
  dist_param_opts o = adam(0.05, 2);
  ref r;
  dist_tensor *t = adam_w(c, 10, 3, "[0,1,2]", &o, &r);
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 1, 2, 1e-12);
  dist_placement s1 = DIST_SHARD_DIM(1), rep = DIST_REPLICATED;
  cr_assert_eq(dist_reshard(c, t, NULL, &s1), 0, "%s", dist_errmsg(c));
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 3, 4, 1e-12);
  cr_assert_eq(dist_reshard(c, t, NULL, &rep), 0, "%s", dist_errmsg(c));
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 5, 6, 1e-12);
  /* Onto Partial the state cannot follow: w is plain values afterwards. */
  dist_placement partial = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  cr_assert_eq(dist_reshard(c, t, NULL, &partial), 0, "%s", dist_errmsg(c));
  double g[30] = {0};
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, NULL), DIST_ENOTFOUND);
  ref_free(&r);
  dist_tensor_free(t);
  dist_close(c);
}

/* Trainer 0's piece already reached rank 1 alone (push_local): a whole push
 * of trainer 0 is then refused by rank 1, and rank 0, which could apply
 * it, does not either. The error names rank 1 and its reason whichever
 * reply is read. Then trainer 1's whole push completes the update on rank
 * 1 only (trainer 0's piece is there), and rank 0's half is untouched. */
Test(param, a_push_one_daemon_refuses_is_applied_by_none) {
  double p0[4], now[4];
  dist_client *c = sgd_param(2, DIST_PARAM_SYNC, p0);
  double g0[4] = {4, 4, 8, 8}, g1[4] = {2, 2, 2, 2};
  uint64_t v0, v;
  pull_now(c, "w", now, 4, &v0);
  cr_assert_eq(dist_param_push_local(c, "w", 0, 1, g0 + 2, 2 * sizeof(double), &v), 0,
               "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_push(c, "w", 0, g0, sizeof g0, &v), DIST_EEXIST);
  cr_assert(strstr(dist_errmsg(c), "rank 1 refused this push") ||
                strstr(dist_errmsg(c), "rank 1 ("), "%s", dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "trainer 0 already pushed"), "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_push(c, "w", 1, g1, sizeof g1, &v), 0, "%s", dist_errmsg(c));
  pull_now(c, "w", now, 4, &v);
  /* rank 0 (elements 0-1) counted only trainer 1; rank 1 updated by the avg */
  for (int i = 0; i < 2; i++) cr_assert_eq(now[i], p0[i], "elem %d: %g", i, now[i]);
  for (int i = 2; i < 4; i++)
    cr_assert_float_eq(now[i], p0[i] - (g0[i] + g1[i]) / 2, 1e-12, "elem %d: %g", i, now[i]);
  /* Rank 0 waits for trainer 0 still: its piece completes the update there. */
  cr_assert_eq(dist_param_push_local(c, "w", 0, 0, g0, 2 * sizeof(double), &v), 0, "%s",
               dist_errmsg(c));
  pull_now(c, "w", now, 4, &v);
  for (int i = 0; i < 2; i++)
    cr_assert_float_eq(now[i], p0[i] - (g0[i] + g1[i]) / 2, 1e-12, "elem %d: %g", i, now[i]);
  dist_close(c);
}

/* With rank 1 gone, a whole push is applied nowhere: rank 0 stages it,
 * learns that rank 1 gave no verdict, and undoes it, well within the
 * call's deadline. */
Test(param, a_push_with_a_daemon_lost_is_applied_by_none) {
  double p0[4];
  dist_client *c = sgd_param(1, DIST_PARAM_ASYNC, p0);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, "w", &t), 0, "%s", dist_errmsg(c));
  cr_assert_neq(harness_kill(&cluster, 1, SIGKILL), -1);
  cr_assert_eq(harness_wait_connected(&cluster, 0, 0, 10000), 1,
               "rank 0 did not see rank 1 go");
  double g[4] = {1, 1, 1, 1};
  double t0 = harness_now_s();
  cr_assert_neq(dist_param_push(c, "w", 0, g, sizeof g, NULL), 0);
  cr_assert(strstr(dist_errmsg(c), "rank 1"), "%s", dist_errmsg(c));
  cr_assert_lt(harness_now_s() - t0, 20.0, "the push took %.1f s", harness_now_s() - t0);
  void *piece = NULL;
  size_t nbytes = 0;
  int64_t lshape[1];
  cr_assert_eq(dist_dtensor_to_local(c, t, 0, &piece, &nbytes, lshape), 0, "%s",
               dist_errmsg(c));
  cr_assert_eq(nbytes, 2 * sizeof(double));
  for (int i = 0; i < 2; i++)
    cr_assert_eq(((double *)piece)[i], p0[i], "elem %d: %g", i, ((double *)piece)[i]);
  free(piece);
  dist_tensor_free(t);
  dist_close(c);
}

/* Resharded onto another mesh of the same shape (ranks [0,1] -> [1,2] ->
 * [2,0]), the parameter keeps its optimizer state: rank 2, which never
 * held it, learns it from the source, and every later update is the one
 * the reference makes without any reshard. With a push pending, the move
 * is refused on every rank, the new one included, with nothing changed. */
Test(param, adam_state_follows_its_parameter_onto_another_mesh) {
  dist_param_opts o = adam(0.05, 2);
  ref r;
  double acc[30] = {0};
  dist_client *c = NULL;
  dist_tensor *t = adam_pending(3, 10, 3, 2, &o, &r, acc, &c);
  dist_mesh *m12 = NULL, *m20 = NULL;
  cr_assert_eq(dist_mesh_from_string("[1,2]", NULL, &m12), 0);
  cr_assert_eq(dist_mesh_from_string("[2,0]", NULL, &m20), 0);
  dist_placement s1 = DIST_SHARD_DIM(1), rep = DIST_REPLICATED;
  expect_refused_while_pending(c, t, m12, &s1);
  dist_tensor *seen = NULL;
  cr_assert_eq(dist_tensor_open(c, "w", &seen), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_mesh_rank_at(dist_tensor_mesh(seen), 0), 0);
  dist_tensor_free(seen);
  push_trainers(c, "w", DIST_FLOAT64, 30, 3, 1, 2, acc, NULL);
  step_and_compare(c, "w", DIST_FLOAT64, &r, &o, 3, acc, 0, 1e-12);

  cr_assert_eq(dist_reshard(c, t, m12, &s1), 0, "%s", dist_errmsg(c));
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 4, 5, 1e-12);
  /* Rank 0 left the mesh: it holds neither piece nor state. */
  double piece[15] = {0};
  cr_assert_eq(dist_param_push_local(c, "w", 0, 0, piece, sizeof piece, NULL),
               DIST_ENOTFOUND);
  cr_assert_eq(dist_reshard(c, t, m20, &rep), 0, "%s", dist_errmsg(c));
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 6, 7, 1e-12);
  dist_mesh_free(m12);
  dist_mesh_free(m20);
  ref_free(&r);
  dist_tensor_free(t);
  dist_close(c);
}

/* Reconfiguring "w" (3 float64, Shard(0): 2 elements on rank 0, 1 on rank
 * 1) from SGD to Adam needs room for Adam's moments. Under a 60-byte
 * memory limit rank 0 has none (its piece, SGD's sum and Adam's state:
 * 16 + 16 + 48 bytes) and refuses; rank 1 has room (8 + 8 + 24), but does
 * not reconfigure either: its SGD state stays, and the next push updates
 * both halves by SGD (lr 1: minus the gradient). */
Test(param, a_configure_one_daemon_refuses_is_applied_by_none) {
  dist_client *c = start_with(2, "--memory-limit=60");
  double p0[3] = {10, 20, 30}, g[3] = {1, 2, 3}, now[3];
  int64_t shape[1] = {3};
  dist_tensor_free(put(c, "w", DIST_FLOAT64, p0, 1, shape, "[0,1]", "Shard(0)"));
  dist_param_opts sgd = DIST_PARAM_OPTS_INIT, adam = DIST_PARAM_OPTS_INIT;
  sgd.lr = 1;
  adam.optimizer = DIST_OPT_ADAM;
  cr_assert_eq(dist_param_configure(c, "w", &sgd), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_configure(c, "w", &adam), DIST_ENOMEM);
  cr_assert(strstr(dist_errmsg(c), "optimizer state of 'w'"), "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, NULL), 0, "%s", dist_errmsg(c));
  uint64_t v;
  pull_now(c, "w", now, 3, &v);
  for (int i = 0; i < 3; i++)
    cr_assert_float_eq(now[i], p0[i] - g[i], 1e-12, "elem %d: %g", i, now[i]);
  dist_close(c);
}

/* A learning-rate schedule: Adam at lr 0.05 for two updates, then tuned to
 * lr 0.01 and weight decay 0.1, keeps its moments and step count, so the
 * next updates are the reference's with the new values. What shapes the
 * state cannot be tuned, and a refused tune changes nothing. */
Test(param, tune_changes_hyper_parameters_and_keeps_the_state) {
  dist_client *c = start(2);
  dist_param_opts o = adam(0.05, 2);
  ref r;
  dist_tensor *t = adam_w(c, 6, 2, "[0,1]", &o, &r);
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 1, 2, 1e-12);
  dist_param_opts sgd = o;
  sgd.optimizer = DIST_OPT_SGD;
  cr_assert_eq(dist_param_tune(c, "w", &sgd), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "the optimizer cannot change"), "%s", dist_errmsg(c));
  dist_param_opts more = o;
  more.trainers = 3;
  cr_assert_eq(dist_param_tune(c, "w", &more), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "the number of trainers"), "%s", dist_errmsg(c));
  dist_param_opts bad = o;
  bad.beta1 = 1.5;
  cr_assert_eq(dist_param_tune(c, "w", &bad), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "beta1"), "%s", dist_errmsg(c));
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 3, 3, 1e-12);
  o.lr = 0.01;
  o.weight_decay = 0.1;
  cr_assert_eq(dist_param_tune(c, "w", &o), 0, "%s", dist_errmsg(c));
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 4, 5, 1e-12);
  dist_params_report rep;
  cr_assert_eq(dist_params(c, 1, &rep), 0, "%s", dist_errmsg(c));
  cr_assert_eq(rep.n, 1);
  cr_assert_float_eq(rep.params[0].opts.lr, 0.01, 1e-15);
  cr_assert_eq(rep.params[0].step, 5);
  dist_params_report_free(&rep);
  ref_free(&r);
  dist_tensor_free(t);
  dist_close(c);
}

/* A change of "w"'s learning rate, by tune and configure in turn, each to
 * a learning rate of its own. */
static int retune_attempt(racer *r, int k) {
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = 1 + k * 1e-3;
  o.consistency = DIST_PARAM_ASYNC;
  int rc = k % 2 ? dist_param_tune(r->c, "w", &o) : dist_param_configure(r->c, "w", &o);
  if (rc == 0) r->last_lr = o.lr;
  return rc;
}

/* Tunes and configures while the parameter is resharded back and forth on
 * two daemons: each change is applied on both or refused on both as
 * "being resharded", never applied to the old layout and then overwritten
 * by the reshard on one daemon. Afterwards both daemons hold the last
 * change applied, and a push is applied with it on both. */
Test(param, configures_during_reshards_are_applied_or_refused_never_lost) {
  double p0[4] = {10, 20, 30, 40}, g[4] = {1, 2, 3, 4}, now[4];
  dist_client *c = NULL;
  dist_tensor *t = async_sgd_w(p0, 0.5, &c);
  volatile int stop = 0;
  racer rt = {.c = harness_client(&cluster), .stop = &stop, .attempt = retune_attempt,
              .refusal = "being resharded", .last_lr = 0.5};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, race_loop, &rt), 0);
  dist_placement rep = DIST_REPLICATED, s0 = DIST_SHARD_DIM(0);
  double until = harness_now_s() + 30;
  for (int i = 0; i < 100 || ((__atomic_load_n(&rt.applied, __ATOMIC_RELAXED) < 3 ||
                               __atomic_load_n(&rt.refused, __ATOMIC_RELAXED) < 3) &&
                              harness_now_s() < until);
       i++) {
    cr_assert_eq(dist_reshard(c, t, NULL, i % 2 ? &s0 : &rep), 0, "%s", dist_errmsg(c));
    cr_assert_eq(rt.other, 0, "a change failed otherwise: %s", rt.other_msg);
  }
  stop = 1;
  pthread_join(th, NULL);
  cr_assert_eq(rt.other, 0, "a change failed otherwise: %s", rt.other_msg);
  cr_assert_gt(rt.applied, 0);
  cr_assert_eq(dist_reshard(c, t, NULL, &rep), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++) {
    dist_params_report report;
    cr_assert_eq(dist_params(c, r, &report), 0, "%s", dist_errmsg(c));
    cr_assert_eq(report.n, 1);
    cr_assert_float_eq(report.params[0].opts.lr, rt.last_lr, 1e-12,
                       "rank %d has lr %.4f, the last change applied %.4f (%d applied, "
                       "%d refused)", r, report.params[0].opts.lr, rt.last_lr,
                       rt.applied, rt.refused);
    dist_params_report_free(&report);
  }
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, NULL), 0, "%s", dist_errmsg(c));
  uint64_t v;
  pull_now(c, "w", now, 4, &v);
  for (int i = 0; i < 4; i++)
    cr_assert_float_eq(now[i], p0[i] - rt.last_lr * g[i], 1e-9, "elem %d: %g", i, now[i]);
  dist_close(rt.c);
  dist_tensor_free(t);
  dist_close(c);
}

/* A parameter's reshard that one daemon cannot afford (another tensor
 * fills its memory) is applied by neither: both keep the parameter as it
 * was, with its optimizer state, and the next updates are the reference's.
 * Once there is room the same reshard goes through. */
Test(param, a_reshard_one_daemon_cannot_afford_keeps_the_parameter_everywhere) {
  dist_client *c = start_with(2, "--memory-limit=1000");
  dist_param_opts o = adam(0.05, 2);
  ref r;
  double fill[70] = {0};
  int64_t fs[1] = {70};
  dist_tensor_free(put(c, "fill", DIST_FLOAT64, fill, 1, fs, "[1]", "Replicate()"));
  dist_tensor *t = adam_w(c, 8, 2, "[0,1]", &o, &r);
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 1, 2, 1e-12);
  dist_placement s1 = DIST_SHARD_DIM(1);
  cr_assert_eq(dist_reshard(c, t, NULL, &s1), DIST_ENOMEM, "%s", dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "rank 1"), "%s", dist_errmsg(c));
  for (int rank = 0; rank < 2; rank++) {
    dist_tensor *seen = NULL;
    cr_assert_eq(harness_open_on(&cluster, rank, "w", &seen), 0, "rank %d lost 'w'", rank);
    cr_assert_eq(dist_tensor_placements(seen)[0].dim, 0, "rank %d resharded 'w'", rank);
    dist_tensor_free(seen);
  }
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 3, 4, 1e-12);
  cr_assert_eq(dist_tensor_delete(c, "fill"), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_reshard(c, t, NULL, &s1), 0, "%s", dist_errmsg(c));
  train_steps(c, "w", DIST_FLOAT64, &r, &o, 5, 6, 1e-12);
  ref_free(&r);
  dist_tensor_free(t);
  dist_close(c);
}
