/* The tape between real daemons: seed 003 differentiated through a
 * LocalLayer in both client modes, generated global_scatter cases with a
 * matmul body against a reference computed here, a global_gather on the
 * tape, gradients added where a tensor feeds several operations, and the
 * errors of a tape used twice or after release. */
#include <criterion/criterion.h>
#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"
#include "reply_hold.h"

#define MAXW 4

static const float seed_x[5][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
static const int64_t seed_counts[2][4] = {{2, 1, 1, 1}, {1, 1, 2, 1}};
/* What each rank holds after the seed's scatter of seed_x by seed_counts. */
static const float seed_y[2][10] = {{1, 2, 3, 4, 1, 2, 5, 6, 3, 4},
                                    {7, 8, 5, 6, 7, 8, 9, 10, 9, 10}};

TestSuite(tape, .fini = stop_cluster);
TestSuite(tape_errors, .fini = stop_cluster);

/* ---------------------------------------------------------------- helpers */

/* loss = sum(y * y) on each rank, Partial(sum) over mesh m. */
static dist_program *sum_sq_program(dist_client *c, const dist_mesh *m) {
  dist_program *p = NULL;
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_program_new("sum_sq", &p);
  int y = dist_input_dtensor(p, "y", DIST_FLOAT32);
  dist_program_output(p, dist_op_sum(p, dist_op_mul(p, y, y), NULL, 0, 0));
  dist_program_out_dist_attr(p, m, &psum, NULL);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  return p;
}

/* The seed's scatter on tape t: x given as client rows, labelled "x". */
static dist_tensor *seed_scatter(dist_tape *t, dist_client *c, int spmd_rank,
                                 const char *out_name) {
  const void *xs[2] = {seed_x, seed_x};
  const int64_t *lcs[2] = {seed_counts[0], seed_counts[1]};
  if (spmd_rank >= 0) lcs[0] = seed_counts[spmd_rank];
  dist_tape_exchange a = {"x", xs, NULL, DIST_FLOAT32, 2, lcs, lcs, 2, NULL, 0,
                          out_name, 0};
  dist_tensor *y = NULL;
  int rc = dist_tape_global_scatter(t, &a, &y, NULL);
  cr_assert_eq(rc, 0, "scatter: %s", dist_errmsg(c));
  return y;
}

static float *grad_rows(dist_tape *t, dist_client *c, const char *name, int rank,
                        size_t want_elems) {
  void *data = NULL;
  size_t nbytes = 0;
  int64_t shape[DIST_MAX_DIMS];
  int rc = dist_tape_grad_local(t, name, rank, &data, &nbytes, shape);
  cr_assert_eq(rc, 0, "grad of %s on rank %d: %s", name, rank, dist_errmsg(c));
  cr_assert_eq(nbytes, want_elems * sizeof(float), "grad of %s on rank %d: %zu bytes",
               name, rank, nbytes);
  return data;
}

/* Two daemons, and on a new tape: y = scatter(x), loss = sum(y * y). */
typedef struct sq_chain {
  dist_client *c;
  dist_mesh *m;
  dist_program *p;
  dist_tape *t;
  dist_tensor *y, *loss;
} sq_chain;

static void sq_chain_start(sq_chain *s) {
  s->c = harness_start_with_client(&cluster, 2, NULL);
  s->m = harness_line_mesh(2);
  s->p = sum_sq_program(s->c, s->m);
  dist_tape_new(s->c, &s->t);
  s->y = seed_scatter(s->t, s->c, -1, "y");
  dist_arg arg = {s->y, NULL};
  cr_assert_eq(dist_tape_local_layer_call(s->t, s->p, &arg, 1, NULL, &s->loss), 0, "%s",
               dist_errmsg(s->c));
}

/* Frees what sq_chain_start made (the test may have replaced t, y and
 * loss, or freed and cleared them). */
static void sq_chain_stop(sq_chain *s) {
  dist_tape_free(s->t);
  dist_tensor_free(s->y), dist_tensor_free(s->loss);
  dist_program_free(s->p);
  dist_mesh_free(s->m);
  dist_close(s->c);
  stop_cluster();
}

/* Names that start with prefix, over every daemon (per-rank values of
 * one name, listed once per rank, count once). */
static int count_named(dist_client *c, const char *prefix) {
  dist_tensor **list = NULL;
  int n = 0, k = 0;
  cr_assert_eq(dist_tensor_list(c, &list, &n), 0, "%s", dist_errmsg(c));
  for (int i = 0; i < n; i++)
    k += strncmp(dist_tensor_name(list[i]), prefix, strlen(prefix)) == 0 &&
         (i == 0 || strcmp(dist_tensor_name(list[i]), dist_tensor_name(list[i - 1])) != 0);
  dist_tensor_list_free(list, n);
  return k;
}

/* ---------------------------------------------------------------- seed 003 */

Test(tape, seed_003_scatter_then_local_layer_single_client, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  dist_program *p = sum_sq_program(c, m);
  dist_tape *t = NULL;
  cr_assert_eq(dist_tape_new(c, &t), 0);
  dist_tensor *y = seed_scatter(t, c, -1, "y"), *loss = NULL;
  dist_arg arg = {y, NULL};
  cr_assert_eq(dist_tape_local_layer_call(t, p, &arg, 1, NULL, &loss), 0, "%s",
               dist_errmsg(c));
  void *lv = NULL;
  size_t nb = 0;
  cr_assert_eq(dist_full_tensor(c, loss, &lv, &nb), 0, "%s", dist_errmsg(c));
  cr_assert_eq(*(float *)lv, 770.0f, "sum of out^2 over both ranks: %g", *(float *)lv);
  free(lv);
  const dist_tensor *seeds[1] = {loss};
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 1), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++) {
    float *g = grad_rows(t, c, "x", r, 10);
    for (int i = 0; i < 10; i++)
      cr_assert_eq(g[i], 2 * (float)(i + 1), "rank %d grad[%d] = %g", r, i, g[i]);
    free(g);
  }
  /* The gradient of x stays in the daemons, the one of y is gone. */
  dist_tensor *gx = NULL;
  cr_assert_eq(dist_tape_grad(t, "x", &gx), 0, "%s", dist_errmsg(c));
  cr_assert(strncmp(dist_tensor_name(gx), "tape", 4) == 0, "%s", dist_tensor_name(gx));
  dist_tensor_free(gx);
  cr_assert_eq(dist_tape_grad(t, "y", &gx), DIST_ENOTFOUND);
  cr_assert_null(gx);
  cr_assert_eq(count_named(c, "tape"), 1, "only the leaf gradient is kept");
  dist_tape_free(t);
  cr_assert_eq(count_named(c, "tape"), 0, "the tape deletes its gradients");
  dist_tensor_free(y), dist_tensor_free(loss);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

typedef struct trainer {
  const char *cluster;
  int rank;
  char err[512];
  float grad[10];
} trainer;

/* One SPMD trainer: the seed through its own daemon. */
static void *seed_trainer(void *self) {
  trainer *tr = self;
  dist_opts o = DIST_OPTS_INIT;
  o.op_id_base = 0x7a9e0000;
  dist_client *c = NULL;
  if (dist_connect_cluster(tr->cluster, &o, &c) != 0) {
    snprintf(tr->err, sizeof tr->err, "connect: %s", dist_last_connect_error());
    return NULL;
  }
  c->spmd_rank = tr->rank; /* as dist_init_from_env would make it */
  dist_mesh *m = NULL;
  int shape[1] = {2}, ranks[2] = {0, 1};
  dist_mesh_new(1, shape, ranks, NULL, &m);
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_program *p = NULL;
  dist_program_new("sum_sq", &p);
  int yv = dist_input_dtensor(p, "y", DIST_FLOAT32);
  dist_program_output(p, dist_op_sum(p, dist_op_mul(p, yv, yv), NULL, 0, 0));
  dist_program_out_dist_attr(p, m, &psum, NULL);
  dist_tape *t = NULL;
  dist_tensor *y = NULL, *loss = NULL;
  const void *xs[1] = {seed_x};
  const int64_t *lcs[1] = {seed_counts[tr->rank]};
  dist_tape_exchange a = {"x", xs, NULL, DIST_FLOAT32, 2, lcs, lcs, 2, NULL, 0, "y", 0};
  void *g = NULL;
  size_t nb = 0;
  int64_t gs[DIST_MAX_DIMS];
  int rc = dist_program_register(c, p);
  if (rc == 0) rc = dist_tape_new(c, &t);
  if (rc == 0) rc = dist_tape_global_scatter(t, &a, &y, NULL);
  dist_arg arg = {y, NULL};
  if (rc == 0) rc = dist_tape_local_layer_call(t, p, &arg, 1, NULL, &loss);
  const dist_tensor *seeds[1] = {loss};
  if (rc == 0) rc = dist_tape_backward(t, seeds, NULL, 1);
  if (rc == 0) rc = dist_tape_grad_local(t, "x", -1, &g, &nb, gs);
  if (rc == 0 && nb == sizeof tr->grad) memcpy(tr->grad, g, nb);
  else if (rc == 0) snprintf(tr->err, sizeof tr->err, "grad of %zu bytes", nb);
  if (rc) snprintf(tr->err, sizeof tr->err, "%s", dist_errmsg(c));
  free(g);
  dist_tape_free(t);
  dist_tensor_free(y), dist_tensor_free(loss);
  dist_program_unregister(c, p);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
  return NULL;
}

Test(tape, seed_003_scatter_then_local_layer_spmd, .timeout = 120) {
  harness_start(&cluster, 2, NULL);
  trainer tr[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    memset(&tr[r], 0, sizeof tr[r]);
    tr[r].cluster = cluster.cluster_file;
    tr[r].rank = r;
    pthread_create(&th[r], NULL, seed_trainer, &tr[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(tr[r].err[0], 0, "rank %d: %s", r, tr[r].err);
    for (int i = 0; i < 10; i++)
      cr_assert_eq(tr[r].grad[i], 2 * (float)(i + 1), "rank %d grad[%d] = %g", r, i,
                   tr[r].grad[i]);
  }
  stop_cluster();
}

/* ---------------------------------------------------------------- generated cases */

typedef struct arr {
  dist_dtype dt;
  dist_shape shape;
  void *data;
  size_t nbytes;
} arr;

typedef struct gen_case {
  int W, E;
  int64_t d;
  arr x[MAXW], lc[MAXW], gc[MAXW], y[MAXW], gin[MAXW], gout[MAXW];
} gen_case;

static void load_arr(const char *dir, const char *key, int r, arr *a) {
  char path[1024];
  dist_errbuf eb = DIST_ERRBUF_INIT;
  snprintf(path, sizeof path, "%s/%s_r%d.npy", dir, key, r);
  a->dt = DIST_DTYPE_INVALID;
  int rc = dist_npy_read(path, &a->dt, &a->shape, &a->data, &a->nbytes, &eb);
  cr_assert_eq(rc, 0, "%s: %s", path, dist_errbuf_msg(&eb));
}

/* One float32 case of W ranks from global_scatter_ref.py gen, in tmp. */
static void gen_case_load(gen_case *k, int W, int seed, const char *extra,
                          char *tmp, size_t len) {
  char cmd[2048], cdir[600], *err = NULL;
  snprintf(tmp, len, "/tmp/distd-tape-XXXXXX");
  cr_assert(mkdtemp(tmp));
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s gen --out %s --n 1 --seed %d "
           "--format npy --W %d --dtype float32 %s", harness_reference_script(), tmp, seed,
           W, extra);
  int rc = harness_run(cmd, NULL, &err, 120);
  cr_assert_eq(rc, 0, "generator failed: %s", err ? err : "");
  free(err);
  glob_t gl;
  snprintf(cdir, sizeof cdir, "%s/case_0000*", tmp);
  cr_assert_eq(glob(cdir, 0, NULL, &gl), 0, "no case under %s", tmp);
  snprintf(cdir, sizeof cdir, "%s", gl.gl_pathv[0]);
  globfree(&gl);
  char meta[700];
  snprintf(meta, sizeof meta, "%s/meta.json", cdir);
  json_error_t je;
  json_t *j = json_load_file(meta, 0, &je);
  cr_assert(j, "%s: %s", meta, je.text);
  memset(k, 0, sizeof *k);
  k->W = (int)json_integer_value(json_object_get(j, "W"));
  k->E = (int)json_integer_value(json_object_get(j, "E"));
  k->d = json_integer_value(json_object_get(j, "d_model"));
  json_decref(j);
  cr_assert_eq(k->W, W);
  for (int r = 0; r < W; r++) {
    load_arr(cdir, "x", r, &k->x[r]);
    load_arr(cdir, "local_count", r, &k->lc[r]);
    load_arr(cdir, "global_count", r, &k->gc[r]);
    load_arr(cdir, "scatter_out", r, &k->y[r]);
    load_arr(cdir, "gather_in", r, &k->gin[r]);
    load_arr(cdir, "gather_out", r, &k->gout[r]);
  }
}

static void gen_case_free(gen_case *k, const char *tmp) {
  for (int r = 0; r < MAXW; r++) {
    free(k->x[r].data), free(k->lc[r].data), free(k->gc[r].data);
    free(k->y[r].data), free(k->gin[r].data), free(k->gout[r].data);
  }
  harness_remove_dir(tmp);
}

static int64_t rows_of(const arr *a) { return a->shape.ndim ? a->shape.dims[0] : 0; }

/* Where row `row` of chunk i of source s lands: the row of rank i/E's
 * scatter result (expert-major: for each expert, for each source). */
static int64_t landing_row(const gen_case *k, int s, int i, int64_t row) {
  int r = i / k->E, e = i % k->E;
  const int64_t *gc = k->gc[r].data;
  int64_t off = 0;
  for (int e2 = 0; e2 < e; e2++)
    for (int s2 = 0; s2 < k->W; s2++) off += gc[s2 * k->E + e2];
  for (int s2 = 0; s2 < s; s2++) off += gc[s2 * k->E + e];
  return off + row;
}

/* grad_x[s] = global_gather(gy): row by row, from where each row went. */
static void reference_gather(const gen_case *k, double *const *gy, int s,
                             double *gx) {
  const int64_t *lc = k->lc[s].data;
  int64_t at = 0;
  for (int i = 0; i < k->W * k->E; i++)
    for (int64_t q = 0; q < lc[i]; q++, at++) {
      int64_t dst = landing_row(k, s, i, q);
      memcpy(gx + at * k->d, gy[i / k->E] + dst * k->d, sizeof(double) * (size_t)k->d);
    }
}

enum { HID = 3 };

/* loss = sum((y @ w)^2): dL/dy = 2 (y w) w^T, dL/dw = sum_r y_r^T 2 (y_r w).
 * gw_abs gets the sum of the magnitudes of each dL/dw term: the daemons add
 * those terms in float32, in an order that depends on the CPU's OpenBLAS
 * kernel, so their rounding grows with it, not with the result. */
static void reference_matmul_grads(const gen_case *k, const float *w, double **gy,
                                   double *gw, double *gw_abs) {
  memset(gw, 0, sizeof(double) * (size_t)(k->d * HID));
  memset(gw_abs, 0, sizeof(double) * (size_t)(k->d * HID));
  for (int r = 0; r < k->W; r++) {
    const float *y = k->y[r].data;
    int64_t n = rows_of(&k->y[r]);
    gy[r] = calloc((size_t)(n * k->d) + 1, sizeof(double));
    for (int64_t i = 0; i < n; i++) {
      double z[HID] = {0};
      for (int h = 0; h < HID; h++)
        for (int64_t a = 0; a < k->d; a++) z[h] += (double)y[i * k->d + a] * w[a * HID + h];
      for (int64_t a = 0; a < k->d; a++)
        for (int h = 0; h < HID; h++) {
          double term = (double)y[i * k->d + a] * 2 * z[h];
          gy[r][i * k->d + a] += 2 * z[h] * w[a * HID + h];
          gw[a * HID + h] += term;
          gw_abs[a * HID + h] += fabs(term);
        }
    }
  }
}

/* Relative to the result, plus float32 rounding of a sum whose terms add up
 * to abs_sum in magnitude (0 for short sums). */
static void assert_close(double got, double want, double abs_sum, const char *what, int r,
                         int64_t i) {
  double tol = 1e-4 * (1 + fabs(want)) + 1e-6 * abs_sum;
  cr_assert(fabs(got - want) <= tol, "%s rank %d [%lld]: got %.9g, want %.9g (tolerance "
            "%.3g, terms summing to %g in magnitude)", what, r, (long long)i, got, want, tol,
            abs_sum);
}

/* x -> global_scatter -> LocalLayer sum((y @ w)^2), w replicated with a
 * Partial(sum) gradient: grad x and grad w against the reference. */
static void run_generated(int W, int seed, const char *extra) {
  char tmp[64];
  gen_case k;
  gen_case_load(&k, W, seed, extra, tmp, sizeof tmp);
  dist_client *c = harness_start_with_client(&cluster, W, NULL);
  dist_mesh *m = harness_line_mesh(W);
  float *w = malloc(sizeof(float) * (size_t)(k.d * HID));
  for (int64_t i = 0; i < k.d * HID; i++) w[i] = (float)((i * 7) % 11) / 8.0f - 0.6f;
  int64_t wshape[2] = {k.d, HID};
  dist_placement rep = DIST_REPLICATED, psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_tensor *wt = NULL, *y = NULL, *loss = NULL;
  cr_assert_eq(dist_shard_tensor(c, "w", w, DIST_FLOAT32, 2, wshape, m, &rep, &wt), 0,
               "%s", dist_errmsg(c));
  dist_program *p = NULL;
  dist_program_new("matmul_sq", &p);
  int yv = dist_input_dtensor(p, "y", DIST_FLOAT32), wv = dist_input_dtensor(p, "w", DIST_FLOAT32);
  dist_input_set_grad_placements(p, wv, &psum, 1);
  int z = dist_op_matmul(p, yv, wv, 0, 0);
  dist_program_output(p, dist_op_sum(p, dist_op_mul(p, z, z), NULL, 0, 0));
  dist_program_out_dist_attr(p, m, &psum, NULL);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));

  const void *xs[MAXW];
  const int64_t *lcs[MAXW], *gcs[MAXW];
  int64_t xrows[MAXW], rows[MAXW];
  for (int r = 0; r < W; r++) {
    xs[r] = k.x[r].data, xrows[r] = rows_of(&k.x[r]);
    lcs[r] = k.lc[r].data, gcs[r] = k.gc[r].data;
  }
  dist_tape *t = NULL;
  dist_tape_new(c, &t);
  dist_tape_exchange a = {"x", xs, xrows, DIST_FLOAT32, k.d, lcs, gcs, k.E, NULL, 0, "y", 0};
  cr_assert_eq(dist_tape_global_scatter(t, &a, &y, rows), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < W; r++) cr_assert_eq(rows[r], rows_of(&k.y[r]), "rank %d rows", r);
  dist_arg args[2] = {{y, NULL}, {wt, NULL}};
  cr_assert_eq(dist_tape_local_layer_call(t, p, args, 2, NULL, &loss), 0, "%s",
               dist_errmsg(c));
  const dist_tensor *seeds[1] = {loss};
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 1), 0, "%s", dist_errmsg(c));

  double *gy[MAXW] = {0}, *gw = calloc((size_t)(k.d * HID), sizeof(double));
  double *gw_abs = calloc((size_t)(k.d * HID), sizeof(double));
  reference_matmul_grads(&k, w, gy, gw, gw_abs);
  for (int s = 0; s < W; s++) {
    int64_t n = rows_of(&k.x[s]) * k.d;
    double *want = calloc((size_t)n + 1, sizeof(double));
    reference_gather(&k, gy, s, want);
    float *got = grad_rows(t, c, "x", s, (size_t)n);
    for (int64_t i = 0; i < n; i++) assert_close(got[i], want[i], 0, "grad x", s, i);
    free(got), free(want);
  }
  dist_tensor *gwt = NULL;
  cr_assert_eq(dist_tape_grad(t, "w", &gwt), 0, "%s", dist_errmsg(c));
  void *full = NULL;
  size_t nb = 0;
  cr_assert_eq(dist_full_tensor(c, gwt, &full, &nb), 0, "%s", dist_errmsg(c));
  cr_assert_eq(nb, sizeof(float) * (size_t)(k.d * HID));
  for (int64_t i = 0; i < k.d * HID; i++)
    assert_close(((float *)full)[i], gw[i], gw_abs[i], "grad w", -1, i);
  free(full);
  dist_tensor_free(gwt);
  for (int r = 0; r < W; r++) free(gy[r]);
  free(gw), free(gw_abs), free(w);
  dist_tape_free(t);
  dist_tensor_free(y), dist_tensor_free(loss), dist_tensor_free(wt);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
  gen_case_free(&k, tmp);
}

Test(tape, generated_case_matmul_body_two_ranks, .timeout = 180) {
  run_generated(2, 11, "--E 2 --d-model 4");
}
Test(tape, generated_case_matmul_body_three_ranks, .timeout = 180) {
  run_generated(3, 12, "--E 2 --d-model 5");
}
Test(tape, generated_case_matmul_body_random_shape, .timeout = 180) {
  run_generated(3, 13, "");
}

/* global_gather on the tape: L = sum(gather(g)^2) so dL/dg =
 * global_scatter(2 gather(g)) = 2 g. */
Test(tape, global_gather_backward_is_a_scatter, .timeout = 180) {
  char tmp[64];
  gen_case k;
  gen_case_load(&k, 3, 21, "--E 2 --d-model 3", tmp, sizeof tmp);
  dist_client *c = harness_start_with_client(&cluster, 3, NULL);
  dist_mesh *m = harness_line_mesh(3);
  dist_program *p = sum_sq_program(c, m);
  const void *gs[MAXW];
  const int64_t *lcs[MAXW], *gcs[MAXW];
  int64_t grows[MAXW], rows[MAXW];
  for (int r = 0; r < 3; r++) {
    gs[r] = k.gin[r].data, grows[r] = rows_of(&k.gin[r]);
    lcs[r] = k.lc[r].data, gcs[r] = k.gc[r].data;
  }
  dist_tape *t = NULL;
  dist_tensor *out = NULL, *loss = NULL;
  dist_tape_new(c, &t);
  dist_tape_exchange a = {"g", gs, grows, DIST_FLOAT32, k.d, lcs, gcs, k.E, NULL, 0,
                          "gathered", 0};
  cr_assert_eq(dist_tape_global_gather(t, &a, &out, rows), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 3; r++) cr_assert_eq(rows[r], rows_of(&k.gout[r]));
  dist_arg arg = {out, NULL};
  cr_assert_eq(dist_tape_local_layer_call(t, p, &arg, 1, NULL, &loss), 0, "%s",
               dist_errmsg(c));
  const dist_tensor *seeds[1] = {loss};
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 1), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 3; r++) {
    int64_t n = grows[r] * k.d;
    float *got = grad_rows(t, c, "g", r, (size_t)n);
    for (int64_t i = 0; i < n; i++)
      assert_close(got[i], 2.0 * ((float *)k.gin[r].data)[i], 0, "grad g", r, i);
    free(got);
  }
  dist_tape_free(t);
  dist_tensor_free(out), dist_tensor_free(loss);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
  gen_case_free(&k, tmp);
}

/* ---------------------------------------------------------------- accumulation */

/* x feeds two scatters (y1, y2); y1 feeds two LocalLayers:
 *   L1 = sum(y1^2), L2 = sum(y1) + 3 sum(y2)
 * so dL/dy1 = 2 y1 + 1, dL/dy2 = 3 and dL/dx = 2 x + 4. */
Test(tape, gradients_add_where_a_tensor_feeds_several_ops, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  dist_program *p1 = sum_sq_program(c, m), *p2 = NULL;
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_program_new("sum_plus_3sum", &p2);
  int a1 = dist_input_dtensor(p2, "y1", DIST_FLOAT32), a2 = dist_input_dtensor(p2, "y2", DIST_FLOAT32);
  dist_program_output(p2, dist_op_add(p2, dist_op_sum(p2, a1, NULL, 0, 0),
                                      dist_op_mul_scalar(p2, dist_op_sum(p2, a2, NULL, 0, 0), 3)));
  dist_program_out_dist_attr(p2, m, &psum, NULL);
  cr_assert_eq(dist_program_register(c, p2), 0, "%s", dist_errmsg(c));
  dist_tape *t = NULL;
  dist_tape_new(c, &t);
  dist_tensor *y1 = seed_scatter(t, c, -1, "y1"), *y2 = seed_scatter(t, c, -1, "y2");
  dist_tensor *l1 = NULL, *l2 = NULL;
  dist_arg arg1 = {y1, NULL}, args2[2] = {{y1, NULL}, {y2, NULL}};
  cr_assert_eq(dist_tape_local_layer_call(t, p1, &arg1, 1, NULL, &l1), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tape_local_layer_call(t, p2, args2, 2, NULL, &l2), 0, "%s", dist_errmsg(c));
  const dist_tensor *seeds[2] = {l1, l2};
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 2), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++) {
    float *g = grad_rows(t, c, "x", r, 10);
    for (int i = 0; i < 10; i++)
      cr_assert_eq(g[i], 2 * (float)(i + 1) + 4, "rank %d grad[%d] = %g", r, i, g[i]);
    free(g);
  }
  cr_assert_eq(count_named(c, "tape"), 1, "the sums' inputs are deleted");
  dist_tape_free(t);
  dist_tensor_free(y1), dist_tensor_free(y2), dist_tensor_free(l1), dist_tensor_free(l2);
  dist_program_free(p1), dist_program_free(p2);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* A distributed weight used by two calls: its Partial(sum) gradients are
 * added in the daemons on its mesh. L_k = sum(y @ w) with w = [1, 2]^T:
 * dL/dw = 2 * column sums of y over both ranks = [100, 120], and every row
 * of dL/dx is 2 w^T = [2, 4]. */
Test(tape, distributed_weight_gradients_add_on_its_mesh, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  dist_placement rep = DIST_REPLICATED, psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  float w[2] = {1, 2};
  int64_t wshape[2] = {2, 1};
  dist_tensor *wt = NULL, *l[2] = {NULL, NULL};
  cr_assert_eq(dist_shard_tensor(c, "w", w, DIST_FLOAT32, 2, wshape, m, &rep, &wt), 0,
               "%s", dist_errmsg(c));
  dist_program *p = NULL;
  dist_program_new("sum_matmul", &p);
  int yv = dist_input_dtensor(p, "y", DIST_FLOAT32), wv = dist_input_dtensor(p, "w", DIST_FLOAT32);
  dist_input_set_grad_placements(p, wv, &psum, 1);
  dist_program_output(p, dist_op_sum(p, dist_op_matmul(p, yv, wv, 0, 0), NULL, 0, 0));
  dist_program_out_dist_attr(p, m, &psum, NULL);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  dist_tape *t = NULL;
  dist_tape_new(c, &t);
  dist_tensor *y = seed_scatter(t, c, -1, "y");
  dist_arg args[2] = {{y, NULL}, {wt, NULL}};
  for (int k = 0; k < 2; k++)
    cr_assert_eq(dist_tape_local_layer_call(t, p, args, 2, NULL, &l[k]), 0, "%s",
                 dist_errmsg(c));
  const dist_tensor *seeds[2] = {l[0], l[1]};
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 2), 0, "%s", dist_errmsg(c));
  dist_tensor *gw = NULL;
  cr_assert_eq(dist_tape_grad(t, "w", &gw), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tensor_placements(gw)[0].kind, DIST_PARTIAL);
  void *full = NULL;
  size_t nb = 0;
  cr_assert_eq(dist_full_tensor(c, gw, &full, &nb), 0, "%s", dist_errmsg(c));
  cr_assert_eq(nb, 2 * sizeof(float));
  cr_assert_eq(((float *)full)[0], 100.0f, "%g", ((float *)full)[0]);
  cr_assert_eq(((float *)full)[1], 120.0f, "%g", ((float *)full)[1]);
  free(full);
  for (int r = 0; r < 2; r++) {
    float *g = grad_rows(t, c, "x", r, 10);
    for (int i = 0; i < 10; i++)
      cr_assert_eq(g[i], i % 2 ? 4.0f : 2.0f, "rank %d grad x[%d] = %g", r, i, g[i]);
    free(g);
  }
  dist_tensor_free(gw);
  dist_tape_free(t);
  dist_tensor_free(y), dist_tensor_free(l[0]), dist_tensor_free(l[1]), dist_tensor_free(wt);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* A tape whose y = the seed's scatter, and the backward's arguments that
 * give each rank's rows of y as y's gradient. */
typedef struct seeded_scatter {
  dist_tape *t;
  dist_tensor *y;
  dist_value v[2];
  dist_arg g;
  const dist_tensor *seeds[1];
} seeded_scatter;

static void seeded_scatter_start(dist_client *c, seeded_scatter *s) {
  cr_assert_eq(dist_tape_new(c, &s->t), 0, "%s", dist_errmsg(c));
  s->y = seed_scatter(s->t, c, -1, "y");
  for (int r = 0; r < 2; r++) s->v[r] = (dist_value){seed_y[r], DIST_FLOAT32, 2, {5, 2}};
  s->g = (dist_arg){NULL, s->v};
  s->seeds[0] = s->y;
}

static int seeded_scatter_backward(seeded_scatter *s) {
  return dist_tape_backward(s->t, s->seeds, &s->g, 1);
}

/* Frees the tape (deleting its gradients) and y's handle. */
static void seeded_scatter_stop(seeded_scatter *s) {
  dist_tape_free(s->t);
  dist_tensor_free(s->y);
}

/* A given output gradient as bytes, into the scatter's result: grad x =
 * gather(dy) = the rows of dy back where they came from. */
Test(tape, exchange_result_seeded_with_values, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  seeded_scatter s;
  seeded_scatter_start(c, &s);
  cr_assert_eq(seeded_scatter_backward(&s), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++) {
    float *got = grad_rows(s.t, c, "x", r, 10);
    cr_assert(memcmp(got, seed_x, sizeof seed_x) == 0, "rank %d: the round trip", r);
    free(got);
  }
  seeded_scatter_stop(&s);
  dist_close(c);
  stop_cluster();
}

/* An exchange's backward that fails because a daemon does not answer
 * deletes the gradient it kept only on the daemons that applied it:
 * asking the frozen one too cost a second deadline. */
Test(tape, an_exchange_backward_a_frozen_daemon_fails_waits_one_deadline, .timeout = 120) {
  enum { DEADLINE_MS = 2000 };
  harness_start(&cluster, 2, NULL);
  dist_client *c = harness_client_deadline(&cluster, DEADLINE_MS);
  seeded_scatter s;
  seeded_scatter_start(c, &s);
  double t0 = harness_freeze_timed(&cluster, 1);
  int rc = seeded_scatter_backward(&s);
  harness_resume_within(&cluster, 1, t0, rc, 1.5, DEADLINE_MS);
  seeded_scatter_stop(&s);
  dist_close(c);
  stop_cluster();
}

/* Two daemons, rank 1 behind a relay (reply_hold_cluster, its client in
 * *c), and a seeded_scatter on them. */
static reply_hold *relayed_seeded_scatter(dist_client **c, seeded_scatter *s) {
  reply_hold *relay = reply_hold_cluster(&cluster, 2, 1, REPLY_HOLD_DEADLINE_MS, c);
  seeded_scatter_start(*c, s);
  return relay;
}

/* relayed_seeded_scatter (returning the relay), and its backward with
 * rank 1's reply held past the deadline, after rank 1 kept the gradient (a
 * name of the tape's): it fails, and rank 1 holds one name more than
 * *before. */
static reply_hold *exchange_backward_reply_lost(dist_client **c, seeded_scatter *s,
                                                int *before) {
  reply_hold *relay = relayed_seeded_scatter(c, s);
  *before = reply_hold_count_on(&cluster, 1, "", "");
  reply_hold_from_call(relay, 1);
  int rc = seeded_scatter_backward(s);
  cr_assert(reply_hold_holding(relay), "the backward sent rank 1 no call");
  reply_hold_release(relay);
  cr_assert(rc < 0, "the backward whose reply from rank 1 was lost succeeded");
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "", ""), *before + 1, "rank 1 kept the gradient");
  return relay;
}

/* An exchange's backward whose reply from rank 1 a relay holds past the
 * deadline, after rank 1 kept the gradient (a name of the tape's): it does
 * not ask rank 1 to delete it then (it did not answer: a second
 * deadline), but dist_tape_free does. Before, it stayed on rank 1. */
Test(tape, an_exchange_backward_whose_reply_was_lost_leaves_nothing_after_the_free,
     .timeout = 120) {
  dist_client *c = NULL;
  seeded_scatter s;
  int before = 0;
  reply_hold *relay = exchange_backward_reply_lost(&c, &s, &before);
  seeded_scatter_stop(&s);
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "", ""), before, "rank 1 kept the gradient");
  reply_hold_cluster_stop(&cluster, relay, c);
}

/* An exchange's backward whose reply from rank 1 a relay holds past the
 * deadline, after rank 1 kept the gradient (noted on the tape's own list),
 * then dist_tape_free while rank 1 cannot be reached (the relay refuses
 * its connections; rank 1 stays up with its store): the free's delete of
 * that gradient fails unanswered, and what the tape's list still holds
 * goes to the client's (dist_later_hand_over), so the client's next undo
 * point (an invocation release, of none), rank 1 back, deletes it. Before,
 * the free dropped its list, and the gradient stayed on rank 1. */
Test(tape, an_exchange_gradient_the_free_could_not_delete_goes_at_the_next_undo_point,
     .timeout = 120) {
  dist_client *c = NULL;
  seeded_scatter s;
  int before = 0;
  reply_hold *relay = exchange_backward_reply_lost(&c, &s, &before);
  reply_hold_refuse(relay);
  seeded_scatter_stop(&s);
  reply_hold_release(relay);
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "", ""), before + 1,
               "rank 1, not reached, lost the gradient");
  cr_assert_eq(dist_invocation_release(c, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "", ""), before,
               "rank 1 kept the gradient after the next undo point");
  reply_hold_cluster_stop(&cluster, relay, c);
}

/* A LocalLayer call's backward on the tape (loss = sum(y * y), seeded
 * with ones) whose reply from rank 1 a relay holds past the deadline,
 * after rank 1 stored y's gradient (a name of the tape's): it does not
 * ask rank 1 to delete it then (a second deadline), but dist_tape_free
 * does. Before, it stayed on rank 1. */
Test(tape, a_local_layer_backward_whose_reply_was_lost_leaves_nothing_after_the_free,
     .timeout = 120) {
  dist_client *c = NULL;
  reply_hold *relay = reply_hold_cluster(&cluster, 2, 1, REPLY_HOLD_DEADLINE_MS, &c);
  dist_mesh *m = harness_line_mesh(2);
  dist_program *p = sum_sq_program(c, m);
  dist_tape *t = NULL;
  cr_assert_eq(dist_tape_new(c, &t), 0, "%s", dist_errmsg(c));
  dist_tensor *y = seed_scatter(t, c, -1, "y"), *loss = NULL;
  dist_arg arg = {y, NULL};
  cr_assert_eq(dist_tape_local_layer_call(t, p, &arg, 1, NULL, &loss), 0, "%s", dist_errmsg(c));
  int before = reply_hold_count_on(&cluster, 1, "", "");
  reply_hold_from_call(relay, 1);
  const dist_tensor *seeds[1] = {loss};
  int rc = dist_tape_backward(t, seeds, NULL, 1);
  cr_assert(reply_hold_holding(relay), "the backward sent rank 1 no call");
  reply_hold_release(relay);
  cr_assert(rc < 0, "the backward whose reply from rank 1 was lost succeeded");
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "", ""), before + 1, "rank 1 kept no gradient");
  dist_tape_free(t);
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "", ""), before, "rank 1 kept the gradient");
  dist_tensor_free(y), dist_tensor_free(loss);
  dist_program_free(p);
  dist_mesh_free(m);
  reply_hold_cluster_stop(&cluster, relay, c);
}

/* A seeded_scatter on c (rank 1 behind relay), its backward, then
 * dist_tape_free while the relay refuses rank 1's connections (as a
 * daemon that is down would; rank 1 stays up, keeping its store): rank 0
 * answered and deleted the tape's gradients, rank 1 keeps them. Returns
 * how many it keeps. */
static int gradients_a_free_left_on_rank_1(dist_client *c, reply_hold *relay) {
  seeded_scatter s;
  seeded_scatter_start(c, &s);
  cr_assert_eq(seeded_scatter_backward(&s), 0, "%s", dist_errmsg(c));
  int made = reply_hold_count_on(&cluster, 1, "tape", "");
  cr_assert_geq(made, 1, "rank 1 holds no gradient the tape made");
  reply_hold_refuse(relay);
  seeded_scatter_stop(&s);
  reply_hold_release(relay);
  cr_assert_eq(reply_hold_count_on(&cluster, 0, "tape", ""), 0, "rank 0 answered: deleted");
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "tape", ""), made,
               "rank 1, not reached, lost gradients of the tape");
  return made;
}

/* dist_tape_free while rank 1 cannot be reached (the relay refuses its
 * connections, as a daemon that is down would; rank 1 stays up, keeping
 * its store): the delete there of the gradients the tape made (per rank,
 * names of the tape's) fails unanswered, and goes on the client's list,
 * which outlives the tape, so the client's next undo point (an invocation
 * release, of none), rank 1 reachable again, deletes them. Before, the
 * free dropped a delete that failed, and they stayed on rank 1 for good. */
Test(tape, a_gradient_rank_1_could_not_be_reached_for_at_the_free_goes_at_the_next_undo_point,
     .timeout = 120) {
  dist_client *c = NULL;
  reply_hold *relay = reply_hold_cluster(&cluster, 2, 1, REPLY_HOLD_DEADLINE_MS, &c);
  gradients_a_free_left_on_rank_1(c, relay);
  cr_assert_eq(dist_invocation_release(c, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "tape", ""), 0,
               "rank 1 kept the tape's gradients after the next undo point");
  reply_hold_cluster_stop(&cluster, relay, c);
}

/* Tokens for undo_refused_for_good: the trainer's, which rank 1 stops
 * knowing, and the one the test's own probes use, which every daemon
 * keeps knowing. */
#define TRAINER_TOKEN "undo-trainer-token-0123456789"
#define PROBE_TOKEN "undo-probe-token-9876543210"

/* Writes path (mode 0600, as distd wants a tokens file) with text. */
static void write_tokens_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
  cr_assert_eq(chmod(path, 0600), 0, "chmod %s", path);
}

/* Calls rank 1 refused for a token it does not know, by its /metrics. */
static double rank_1_unknown_token_refusals(void) {
  char *m = harness_metrics(&cluster, 1);
  double n = harness_metric_sample(m, "distd_auth_rejected_total{reason=\"unknown_token\"}");
  free(m);
  return n < 0 ? 0 : n; /* no line until the first refusal */
}

/* Rank 1 reads its tokens file again (SIGHUP), which now holds only
 * PROBE_TOKEN; waits (bounded) until it logged the reload. */
static void rank_1_forgets_the_trainer_token(const char *tokens) {
  write_tokens_file(tokens, PROBE_TOKEN " read-write\n");
  long from = harness_log_size(&cluster, 1);
  cr_assert_eq(kill(cluster.pids[1], SIGHUP), 0);
  const char *const reloaded[] = {"reloaded 1 bearer tokens from", NULL};
  cr_assert(harness_log_wait(&cluster, 1, from, reloaded, 10000), "rank 1 logged no reload");
}

/* dist_tape_free while rank 1 cannot be reached (the relay refuses its
 * connections) notes the delete of the tape's gradient there on the
 * client's list; then rank 1 stops knowing the client's token (tokens
 * file rewritten, SIGHUP), so the next undo point's delete is refused for
 * good (DIST_EAUTH): the item leaves the list, and a later undo point
 * sends rank 1 nothing (its count of calls refused for an unknown token
 * stays). Before, an item refused for good stayed, and every undo point
 * until dist_close asked rank 1 again. */
Test(tape, an_undo_refused_for_good_leaves_the_list, .timeout = 120) {
  char dir[] = "/tmp/distd-undo-tokens-XXXXXX", tokens[64];
  cr_assert(mkdtemp(dir), "mkdtemp");
  snprintf(tokens, sizeof tokens, "%s/tokens", dir);
  write_tokens_file(tokens, TRAINER_TOKEN " read-write\n" PROBE_TOKEN " read-write\n");
  const char *const args[] = {"--auth-tokens-file", tokens, NULL};
  cr_assert_eq(setenv("DIST_TOKEN", TRAINER_TOKEN, 1), 0); /* the relayed client's */
  dist_client *c = NULL;
  reply_hold *relay = reply_hold_cluster_with(&cluster, 2, 1, REPLY_HOLD_DEADLINE_MS, args, &c);
  cr_assert_eq(setenv("DIST_TOKEN", PROBE_TOKEN, 1), 0); /* the probes' from here on */
  int made = gradients_a_free_left_on_rank_1(c, relay);
  rank_1_forgets_the_trainer_token(tokens);
  double refused = rank_1_unknown_token_refusals();
  cr_assert_eq(dist_invocation_release(c, NULL), 0, "%s", dist_errmsg(c));
  double refused_first = rank_1_unknown_token_refusals();
  cr_assert_gt(refused_first, refused, "the undo point asked rank 1 nothing");
  cr_assert_eq(dist_invocation_release(c, NULL), 0, "%s", dist_errmsg(c));
  cr_expect_eq(rank_1_unknown_token_refusals(), refused_first,
               "a later undo point asked rank 1 again (%g calls refused, %g after the first)",
               rank_1_unknown_token_refusals(), refused_first);
  cr_expect_eq(reply_hold_count_on(&cluster, 1, "tape", ""), made,
               "rank 1 deleted with a token it does not know");
  reply_hold_cluster_stop(&cluster, relay, c);
  unlink(tokens);
  rmdir(dir);
}

/* A seed given as values for a tensor that also feeds an op on the tape:
 * the seed is stored per rank and added to the op's gradient. y =
 * scatter(x) seeded with y itself, and l = sum(y * y) with 1 per rank:
 * grad y = y + 2 y, so grad x = gather(3 y) = 3 x. */
Test(tape, a_value_seed_adds_to_a_gradient_from_an_op, .timeout = 120) {
  sq_chain s;
  sq_chain_start(&s);
  static const float one = 1;
  dist_value vy[2], vl[2];
  for (int r = 0; r < 2; r++) {
    vy[r] = (dist_value){seed_y[r], DIST_FLOAT32, 2, {5, 2}};
    vl[r] = (dist_value){&one, DIST_FLOAT32, 0, {0}};
  }
  dist_arg g[2] = {{NULL, vy}, {NULL, vl}};
  const dist_tensor *seeds[2] = {s.y, s.loss};
  cr_assert_eq(dist_tape_backward(s.t, seeds, g, 2), 0, "%s", dist_errmsg(s.c));
  for (int r = 0; r < 2; r++) {
    float *got = grad_rows(s.t, s.c, "x", r, 10);
    for (int i = 0; i < 10; i++)
      cr_assert_eq(got[i], 3 * ((const float *)seed_x)[i], "rank %d grad x[%d] = %g", r, i,
                   got[i]);
    free(got);
  }
  sq_chain_stop(&s);
}

/* ---------------------------------------------------------------- errors */

Test(tape_errors, backward_twice_and_after_release_fail_clearly, .timeout = 120) {
  sq_chain s;
  sq_chain_start(&s);
  dist_client *c = s.c;
  dist_program *p = s.p;
  dist_tape *t = s.t;
  dist_tensor *y = s.y, *loss = s.loss;
  s.t = NULL, s.y = NULL, s.loss = NULL; /* this test frees them as it goes */
  dist_arg arg = {y, NULL};
  const dist_tensor *seeds[1] = {loss};
  cr_assert_eq(dist_tape_grad(t, "x", &(dist_tensor *){NULL}), DIST_ENOTFOUND);
  cr_assert(strstr(dist_errmsg(c), "backward has not run"), "%s", dist_errmsg(c));
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 1), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 1), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "already backpropagated"), "%s", dist_errmsg(c));
  /* The first backward's gradient is intact. */
  float *g = grad_rows(t, c, "x", 1, 10);
  cr_assert_eq(g[9], 20.0f);
  free(g);
  cr_assert_eq(dist_tape_global_scatter(t, &(dist_tape_exchange){0}, NULL, NULL), DIST_EINVAL);
  dist_tape_free(t);
  dist_tensor_free(loss);

  /* A released tape: the daemons dropped the invocation, backward refuses. */
  dist_tape_new(c, &t);
  dist_tensor_free(y);
  y = seed_scatter(t, c, -1, "y2");
  arg.tensor = y;
  cr_assert_eq(dist_tape_local_layer_call(t, p, &arg, 1, NULL, &loss), 0, "%s", dist_errmsg(c));
  seeds[0] = loss;
  cr_assert_eq(dist_tape_release(t), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 1), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "released"), "%s", dist_errmsg(c));
  dist_tape_free(t);

  /* Seeds must be tensors the tape produced; the loss's 1 is for scalars. */
  dist_tape_new(c, &t);
  dist_tensor *y3 = seed_scatter(t, c, -1, "y3");
  seeds[0] = loss; /* produced by another tape */
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 1), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "no operation on the tape produced"), "%s", dist_errmsg(c));
  dist_tape_free(t);
  dist_tape_new(c, &t);
  dist_tensor_free(y3);
  y3 = seed_scatter(t, c, -1, "y4");
  seeds[0] = y3;
  cr_assert_eq(dist_tape_backward(t, seeds, NULL, 1), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "gradient must be given"), "%s", dist_errmsg(c));
  dist_tape_free(t);
  cr_assert_eq(count_named(c, "tape"), 0, "nothing left behind");

  dist_tensor_free(y), dist_tensor_free(y3), dist_tensor_free(loss);
  sq_chain_stop(&s);
}
