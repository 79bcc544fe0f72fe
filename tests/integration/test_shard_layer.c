/* shard_layer between real daemons: shard_fn, input_fn and output_fn
 * semantics; column-, row- and 2-d-parallel Linear, Embedding, LayerNorm
 * and RMSNorm against single-process results computed here (forward and
 * gradients, 2 and 4 ranks); seed 002 through distctl launch; and the bad
 * inputs a caller can provoke. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_fixture.h"
#include "reply_hold.h"

TestSuite(shard_layer, .fini = stop_cluster);

/* ---------------------------------------------------------------- helpers */

static void fill(float *x, int n, unsigned seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    x[i] = (float)((seed >> 8) % 2048) / 1024.0f - 1.0f;
  }
}

static dist_tensor *put(dist_client *c, const char *name, const float *data,
                        int ndim, const int64_t *shape, const dist_mesh *m,
                        const dist_placement *pl) {
  dist_tensor *t = NULL;
  cr_assert_eq(dist_shard_tensor(c, name, data, DIST_FLOAT32, ndim, shape, m, pl, &t),
               0, "shard_tensor %s: %s", name, dist_errmsg(c));
  return t;
}

static float *full_of(dist_client *c, const dist_tensor *t, size_t elems) {
  void *data = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &nbytes), 0, "full_tensor: %s",
               dist_errmsg(c));
  cr_assert_eq(nbytes, elems * sizeof(float));
  return data;
}

static void assert_all_close(const float *got, const double *want, size_t n,
                             double tol, const char *what) {
  for (size_t i = 0; i < n; i++)
    cr_assert(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i])),
              "%s[%zu]: got %.9g, want %.9g", what, i, got[i], want[i]);
}

static float *read_param(dist_client *c, dist_layer *l, const char *path, int grad,
                         size_t elems) {
  void *data = NULL;
  size_t n = 0;
  int rc = grad ? dist_layer_read_grad(c, l, path, &data, &n)
                : dist_layer_read_param(c, l, path, &data, &n);
  cr_assert_eq(rc, 0, "read %s: %s", path, c ? dist_errmsg(c) : "");
  cr_assert_eq(n, elems * sizeof(float), "%s: %zu bytes", path, n);
  return data;
}

/* Places "weight" / "bias" of the layer named by the user's spec. */
typedef struct placing {
  const char *layer;     /* dotted name, "" for the root */
  const char *param;
  dist_placement pl[2];
  int n;
} placing;

typedef struct shard_log {
  const placing *places;
  int nplaces;
  char names[16][64];
  dist_layer *layers[16];
  int ncalls;
  int input_calls, output_calls;
  dist_placement output_saw; /* output_fn: the output's placement then */
} shard_log;

static int logging_shard_fn(const char *name, dist_layer *sub,
                            const dist_mesh *mesh, void *user) {
  shard_log *log = user;
  (void)mesh;
  if (log->ncalls < 16) {
    snprintf(log->names[log->ncalls], sizeof log->names[0], "%s", name);
    log->layers[log->ncalls] = sub;
  }
  log->ncalls++;
  for (int i = 0; i < log->nplaces; i++)
    if (strcmp(log->places[i].layer, name) == 0) {
      int rc = dist_layer_place_param(sub, log->places[i].param, log->places[i].pl,
                                      log->places[i].n);
      if (rc) return rc;
    }
  return 0;
}

static dist_layer *linear(int64_t in, int64_t out, int bias, uint64_t seed) {
  dist_layer *l = NULL;
  cr_assert_eq(dist_layer_linear(in, out, bias, seed, &l), 0);
  return l;
}

/* ---------------------------------------------------------------- reference */

/* y[B, out] = x[B, in] @ w + b; with dy: dw, db, dx. */
static void linear_ref(const float *x, const float *w, const float *b, int B,
                       int in, int out, double *y) {
  for (int r = 0; r < B; r++)
    for (int j = 0; j < out; j++) {
      double s = b ? b[j] : 0;
      for (int k = 0; k < in; k++) s += (double)x[r * in + k] * w[k * out + j];
      y[r * out + j] = s;
    }
}

static void linear_grad_ref(const float *x, const float *w, const float *dy,
                            int B, int in, int out, double *dw, double *db,
                            double *dx) {
  for (int k = 0; k < in; k++)
    for (int j = 0; j < out; j++) {
      double s = 0;
      for (int r = 0; r < B; r++) s += (double)x[r * in + k] * dy[r * out + j];
      dw[k * out + j] = s;
    }
  for (int j = 0; j < out; j++) {
    double s = 0;
    for (int r = 0; r < B; r++) s += dy[r * out + j];
    db[j] = s;
  }
  for (int r = 0; r < B; r++)
    for (int k = 0; k < in; k++) {
      double s = 0;
      for (int j = 0; j < out; j++) s += (double)dy[r * out + j] * w[k * out + j];
      dx[r * in + k] = s;
    }
}

/* ---------------------------------------------------------------- shard_fn */

Test(shard_layer, shard_fn_sees_every_sublayer_in_order_and_unplaced_params_replicate,
     .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  dist_layer *root = NULL, *block = NULL;
  cr_assert_eq(dist_layer_sequence(&root), 0);
  cr_assert_eq(dist_layer_sequence(&block), 0);
  cr_assert_eq(dist_layer_add(block, "fc1", linear(4, 6, 1, 1)), 0);
  cr_assert_eq(dist_layer_add(block, "fc2", linear(6, 4, 1, 2)), 0);
  cr_assert_eq(dist_layer_add(root, "block", block), 0);
  cr_assert_eq(dist_layer_add(root, "head", linear(4, 2, 0, 3)), 0);
  cr_assert_eq(dist_layer_set_name(root, "net"), 0);
  placing places[1] = {{"block.fc1", "weight", {DIST_SHARD_DIM(1)}, 1}};
  shard_log log = {.places = places, .nplaces = 1};
  cr_assert_eq(dist_shard_layer(c, root, m, logging_shard_fn, NULL, NULL, &log), 0,
               "%s", dist_errmsg(c));

  const char *want[5] = {"", "block", "block.fc1", "block.fc2", "head"};
  cr_assert_eq(log.ncalls, 5);
  for (int i = 0; i < 5; i++) {
    cr_assert_str_eq(log.names[i], want[i]);
    cr_assert_eq(log.layers[i], dist_layer_find(root, want[i]), "layer %s", want[i]);
  }
  const char *paths[5] = {"block.fc1.weight", "block.fc1.bias", "block.fc2.weight",
                          "block.fc2.bias", "head.weight"};
  cr_assert_eq(dist_layer_n_params(root), 5);
  for (int i = 0; i < 5; i++) {
    dist_layer_param_info in;
    cr_assert_eq(dist_layer_param_at(root, i, &in), 0);
    cr_assert_str_eq(in.path, paths[i]);
    char stored[300];
    snprintf(stored, sizeof stored, "net.%s", paths[i]);
    cr_assert_str_eq(in.name, stored);
    cr_assert_eq(in.nplacements, 1);
    dist_placement_kind kind = i == 0 ? DIST_SHARD : DIST_REPLICATE;
    cr_assert_eq(in.placements[0].kind, kind, "%s", paths[i]);
    /* really in the daemons, with that layout */
    dist_tensor *t = NULL;
    cr_assert_eq(dist_tensor_open(c, stored, &t), 0, "%s", dist_errmsg(c));
    dist_tensor_piece *pieces = NULL;
    int np = 0;
    cr_assert_eq(dist_tensor_pieces(c, t, &pieces, &np), 0);
    cr_assert_eq(np, 2);
    int64_t last = in.shape[in.ndim - 1];
    cr_assert_eq(pieces[1].shape[in.ndim - 1], i == 0 ? last / 2 : last, "%s", paths[i]);
    free(pieces);
    dist_tensor_free(t);
  }
  /* values are the client's initial values */
  float init[24];
  dist_layer *fresh = linear(4, 6, 1, 1);
  void *d = NULL;
  size_t nb = 0;
  cr_assert_eq(dist_layer_read_param(NULL, fresh, "weight", &d, &nb), 0);
  memcpy(init, d, sizeof init);
  free(d);
  dist_layer_free(fresh);
  float *stored = read_param(c, root, "block.fc1.weight", 0, 24);
  cr_assert_eq(memcmp(stored, init, sizeof init), 0);
  free(stored);
  cr_assert_eq(dist_layer_destroy(c, root), 0, "%s", dist_errmsg(c));
  dist_tensor **list = NULL;
  int nlist = 0;
  cr_assert_eq(dist_tensor_list(c, &list, &nlist), 0);
  cr_assert_eq(nlist, 0, "destroy leaves nothing");
  dist_tensor_list_free(list, nlist);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* ---------------------------------------------------------------- hooks */

/* Pre-hook: every input to Replicate (Paddle's "convert the input"). */
static int replicate_inputs(dist_client *c, dist_tensor **ts, int n,
                            const dist_mesh *mesh, void *user) {
  shard_log *log = user;
  dist_placement rep[1] = {DIST_REPLICATED};
  log->input_calls++;
  for (int i = 0; i < n; i++) {
    int rc = dist_reshard(c, ts[i], NULL, rep);
    if (rc) return rc;
  }
  (void)mesh;
  return 0;
}

/* Post-hook: remembers what forward gave, then back to Replicate ("dense"). */
static int replicate_outputs(dist_client *c, dist_tensor **ts, int n,
                             const dist_mesh *mesh, void *user) {
  shard_log *log = user;
  log->output_calls++;
  log->output_saw = dist_tensor_placements(ts[0])[0];
  return replicate_inputs(c, ts, n, mesh, &(shard_log){0});
}

Test(shard_layer, input_fn_and_output_fn_run_around_forward, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  enum { B = 4, IN = 6, OUT = 4 };
  float x[B * IN], w[IN * OUT], b[OUT], dyf[B * OUT];
  fill(x, B * IN, 3);
  fill(dyf, B * OUT, 5);
  int64_t xs[2] = {B, IN}, ys[2] = {B, OUT};
  dist_placement s0 = DIST_SHARD_DIM(0), rep = DIST_REPLICATED;

  /* Without hooks a batch-sharded input meets a column-parallel weight:
   * refused, naming the layouts. */
  dist_layer *plain = linear(IN, OUT, 1, 9);
  placing col[1] = {{"", "weight", {DIST_SHARD_DIM(1)}, 1}};
  shard_log log0 = {.places = col, .nplaces = 1};
  cr_assert_eq(dist_layer_set_name(plain, "plain"), 0);
  cr_assert_eq(dist_shard_layer(c, plain, m, logging_shard_fn, NULL, NULL, &log0), 0);
  dist_tensor *xt = put(c, "x", x, 2, xs, m, &s0), *y = NULL;
  cr_assert_lt(dist_layer_forward(c, plain, &xt, 1, &y, 1), 0);
  cr_assert(strstr(dist_errmsg(c), "Shard(0)") != NULL, "%s", dist_errmsg(c));

  dist_layer *l = linear(IN, OUT, 1, 9);
  shard_log log = {.places = col, .nplaces = 1};
  cr_assert_eq(dist_shard_layer(c, l, m, logging_shard_fn, replicate_inputs,
                                replicate_outputs, &log), 0, "%s", dist_errmsg(c));
  cr_assert_eq(log.input_calls + log.output_calls, 0, "hooks run at forward");
  cr_assert_eq(dist_layer_forward(c, l, &xt, 1, &y, 1), 1, "%s", dist_errmsg(c));
  cr_assert_eq(log.input_calls, 1);
  cr_assert_eq(log.output_calls, 1);
  cr_assert_eq(dist_tensor_placements(xt)[0].kind, DIST_REPLICATE,
               "input_fn resharded the input in place before forward");
  cr_assert_eq(log.output_saw.kind, DIST_SHARD, "output_fn ran after forward");
  cr_assert_eq(log.output_saw.dim, 1);
  cr_assert_eq(dist_tensor_placements(y)[0].kind, DIST_REPLICATE);

  float *wv = read_param(c, l, "weight", 0, IN * OUT), *bv = read_param(c, l, "bias", 0, OUT);
  memcpy(w, wv, sizeof w);
  memcpy(b, bv, sizeof b);
  free(wv);
  free(bv);
  double ref[B * OUT], dw[IN * OUT], db[OUT], dx[B * IN];
  linear_ref(x, w, b, B, IN, OUT, ref);
  float *got = full_of(c, y, B * OUT);
  assert_all_close(got, ref, B * OUT, 1e-5, "y");
  free(got);
  /* backward through the hooks: the Replicate gradient goes back to the
   * forward's Shard(1) layout */
  dist_tensor *dy = put(c, "dy", dyf, 2, ys, m, &rep), *gx = NULL;
  cr_assert_eq(dist_layer_backward(c, l, &dy, &gx), 0, "%s", dist_errmsg(c));
  cr_assert_not_null(gx);
  linear_grad_ref(x, w, dyf, B, IN, OUT, dw, db, dx);
  got = read_param(c, l, "weight", 1, IN * OUT);
  assert_all_close(got, dw, IN * OUT, 1e-5, "dW");
  free(got);
  got = full_of(c, gx, B * IN);
  assert_all_close(got, dx, B * IN, 1e-5, "dx");
  free(got);
  dist_tensor_free(gx);
  dist_tensor_free(dy);
  dist_tensor_free(y);
  dist_tensor_free(xt);
  cr_assert_eq(dist_layer_destroy(c, l), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_layer_destroy(c, plain), 0, "%s", dist_errmsg(c));
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* ---------------------------------------------------------------- parallel Linear */

/* Linear(IN, OUT) with the given weight placements on mesh m; input x
 * [B, IN] with x_pl; checks y, dW, db and dx against linear_ref. */
static void check_linear(dist_client *c, const dist_mesh *m, int IN, int OUT,
                         const dist_placement *w_pl, const dist_placement *x_pl,
                         int npl, const char *name) {
  enum { B = 5 };
  float *x = calloc((size_t)(B * IN), sizeof *x), *dyf = calloc((size_t)(B * OUT), sizeof *dyf);
  double *ref = calloc((size_t)(B * OUT), sizeof *ref), *dw = calloc((size_t)(IN * OUT), sizeof *dw);
  double *db = calloc((size_t)OUT, sizeof *db), *dx = calloc((size_t)(B * IN), sizeof *dx);
  fill(x, B * IN, 17);
  fill(dyf, B * OUT, 19);
  dist_layer *l = linear(IN, OUT, 1, 23);
  cr_assert_eq(dist_layer_set_name(l, name), 0);
  float *w = read_param(NULL, l, "weight", 0, (size_t)(IN * OUT));
  float *b = read_param(NULL, l, "bias", 0, (size_t)OUT);
  placing place = {"", "weight", {w_pl[0], npl > 1 ? w_pl[1] : w_pl[0]}, npl};
  shard_log log = {.places = &place, .nplaces = 1};
  cr_assert_eq(dist_shard_layer(c, l, m, logging_shard_fn, NULL, NULL, &log), 0,
               "%s", dist_errmsg(c));
  int64_t xs[2] = {B, IN}, ys[2] = {B, OUT};
  dist_placement rep[2] = {DIST_REPLICATED, DIST_REPLICATED};
  char xn[64], dyn[64];
  snprintf(xn, sizeof xn, "%s.x", name);
  snprintf(dyn, sizeof dyn, "%s.dy", name);
  dist_tensor *xt = put(c, xn, x, 2, xs, m, x_pl), *y = NULL, *gx = NULL;
  cr_assert_eq(dist_layer_forward(c, l, &xt, 1, &y, 1), 1, "%s: %s", name, dist_errmsg(c));
  linear_ref(x, w, b, B, IN, OUT, ref);
  float *got = full_of(c, y, (size_t)(B * OUT));
  assert_all_close(got, ref, (size_t)(B * OUT), 1e-5, "y");
  free(got);
  for (int d = 0; d < npl; d++)
    cr_assert_neq(dist_tensor_placements(y)[d].kind, DIST_PARTIAL,
                  "Partial outputs are resolved");
  dist_tensor *dy = put(c, dyn, dyf, 2, ys, m, rep);
  cr_assert_eq(dist_layer_backward(c, l, &dy, &gx), 0, "%s: %s", name, dist_errmsg(c));
  linear_grad_ref(x, w, dyf, B, IN, OUT, dw, db, dx);
  got = read_param(c, l, "weight", 1, (size_t)(IN * OUT));
  assert_all_close(got, dw, (size_t)(IN * OUT), 1e-5, "dW");
  free(got);
  got = read_param(c, l, "bias", 1, (size_t)OUT);
  assert_all_close(got, db, (size_t)OUT, 1e-5, "db");
  free(got);
  got = full_of(c, gx, (size_t)(B * IN));
  assert_all_close(got, dx, (size_t)(B * IN), 1e-5, "dx");
  free(got);
  /* gradients keep the parameters' placements */
  const dist_tensor *gw = dist_layer_grad_tensor(l, "weight");
  const dist_tensor *gb = dist_layer_grad_tensor(l, "bias");
  for (int d = 0; d < npl; d++) {
    cr_assert_eq(dist_tensor_placements(gw)[d].kind, w_pl[d].kind);
    cr_assert_eq(dist_tensor_placements(gb)[d].kind, DIST_REPLICATE);
  }
  dist_tensor_free(gx);
  dist_tensor_free(dy);
  dist_tensor_free(y);
  dist_tensor_free(xt);
  dist_tensor_delete(c, xn);
  dist_tensor_delete(c, dyn);
  cr_assert_eq(dist_layer_destroy(c, l), 0, "%s", dist_errmsg(c));
  free(w), free(b), free(x), free(dyf), free(ref), free(dw), free(db), free(dx);
}

static void parallel_linear_on(int n) {
  dist_client *c = harness_start_with_client(&cluster, n, NULL);
  dist_mesh *m = harness_line_mesh(n);
  dist_placement s0 = DIST_SHARD_DIM(0), s1 = DIST_SHARD_DIM(1), rep = DIST_REPLICATED;
  check_linear(c, m, 8, 12, &s1, &rep, 1, "col");         /* column parallel */
  check_linear(c, m, 12, 8, &s0, &rep, 1, "row");         /* row, input sliced */
  check_linear(c, m, 12, 8, &s0, &s1, 1, "row_sharded");  /* row, input Shard(last) */
  check_linear(c, m, 10, 7, &s1, &rep, 1, "col_uneven");  /* 7 over n */
  check_linear(c, m, 10, 7, &s0, &rep, 1, "row_uneven");  /* 10 over n */
  check_linear(c, m, 6, 5, &rep, &s0, 1, "data");         /* batch split */
  dist_tensor **list = NULL;
  int nlist = 0;
  cr_assert_eq(dist_tensor_list(c, &list, &nlist), 0);
  cr_assert_eq(nlist, 0, "every step tensor was removed (%d left, first %s)",
               nlist, nlist ? dist_tensor_name(list[0]) : "");
  dist_tensor_list_free(list, nlist);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

Test(shard_layer, column_and_row_parallel_linear_match_one_process_on_2_ranks,
     .timeout = 180) {
  parallel_linear_on(2);
}

Test(shard_layer, column_and_row_parallel_linear_match_one_process_on_4_ranks,
     .timeout = 180) {
  parallel_linear_on(4);
}

Test(shard_layer, linear_on_a_2d_mesh_shards_rows_and_columns, .timeout = 180) {
  dist_client *c = harness_start_with_client(&cluster, 4, NULL);
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_from_string("[[0,1],[2,3]]", "dp,mp", &m), 0);
  dist_placement w_pl[2] = {DIST_SHARD_DIM(0), DIST_SHARD_DIM(1)};
  dist_placement x_pl[2] = {DIST_REPLICATED, DIST_REPLICATED};
  check_linear(c, m, 8, 6, w_pl, x_pl, 2, "grid");
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* ---------------------------------------------------------------- other layers */

/* ids -> Embedding(10, 4), vocabulary-parallel -> LayerNorm -> RMSNorm, in
 * a sequence, against the same computed here; gradients of the norms'
 * weights and of the embedding table. */
Test(shard_layer, embedding_and_norms_in_a_sequence_match_one_process,
     .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  enum { T = 6, V = 10, E = 4 };
  dist_layer *seq = NULL, *emb = NULL, *ln = NULL, *rms = NULL;
  cr_assert_eq(dist_layer_sequence(&seq), 0);
  cr_assert_eq(dist_layer_embedding(V, E, 5, &emb), 0);
  cr_assert_eq(dist_layer_layer_norm(E, 1e-5, &ln), 0);
  cr_assert_eq(dist_layer_rms_norm(E, 1e-6, &rms), 0);
  cr_assert_eq(dist_layer_add(seq, "emb", emb), 0);
  cr_assert_eq(dist_layer_add(seq, "ln", ln), 0);
  cr_assert_eq(dist_layer_add(seq, "rms", rms), 0);
  float lnw[E] = {1.5f, -0.5f, 2.0f, 0.25f}, lnb[E] = {0.1f, 0.2f, -0.3f, 0.0f};
  float rw[E] = {0.5f, 1.0f, -1.0f, 2.0f};
  cr_assert_eq(dist_layer_set_param(seq, "ln.weight", lnw, sizeof lnw), 0);
  cr_assert_eq(dist_layer_set_param(seq, "ln.bias", lnb, sizeof lnb), 0);
  cr_assert_eq(dist_layer_set_param(seq, "rms.weight", rw, sizeof rw), 0);
  float *table = read_param(NULL, seq, "emb.weight", 0, V * E);
  placing vocab = {"emb", "weight", {DIST_SHARD_DIM(0)}, 1};
  shard_log log = {.places = &vocab, .nplaces = 1};
  cr_assert_eq(dist_layer_set_name(seq, "tok"), 0);
  cr_assert_eq(dist_shard_layer(c, seq, m, logging_shard_fn, NULL, NULL, &log), 0,
               "%s", dist_errmsg(c));
  int64_t ids[T] = {0, 9, 4, 5, 4, 7}, is[1] = {T}, ys[2] = {T, E};
  dist_placement rep = DIST_REPLICATED;
  dist_tensor *idt = NULL, *y = NULL;
  cr_assert_eq(dist_shard_tensor(c, "ids", ids, DIST_INT64, 1, is, m, &rep, &idt), 0);
  cr_assert_eq(dist_layer_forward(c, seq, &idt, 1, &y, 1), 1, "%s", dist_errmsg(c));
  /* the reference, with dL/dy = g */
  float g[T * E];
  fill(g, T * E, 29);
  double want[T * E], dlnw[E] = {0}, dlnb[E] = {0}, drw[E] = {0}, dtab[V * E] = {0};
  for (int t = 0; t < T; t++) {
    const float *e = &table[ids[t] * E];
    double mu = 0, var = 0, h[E], ms = 0, z[E], dz[E], dh[E], dxh[E];
    for (int j = 0; j < E; j++) mu += e[j] / (double)E;
    for (int j = 0; j < E; j++) var += (e[j] - mu) * (e[j] - mu) / E;
    double sd = sqrt(var + 1e-5);
    for (int j = 0; j < E; j++) h[j] = (e[j] - mu) / sd * lnw[j] + lnb[j];
    for (int j = 0; j < E; j++) ms += h[j] * h[j] / E;
    double r = sqrt(ms + 1e-6);
    for (int j = 0; j < E; j++) z[j] = h[j] / r, want[t * E + j] = z[j] * rw[j];
    /* rms backward: dz = g*rw; dh = dz/r - h * sum(dz*h) / (E r^3) */
    double s = 0;
    for (int j = 0; j < E; j++) {
      drw[j] += g[t * E + j] * z[j];
      dz[j] = g[t * E + j] * rw[j];
      s += dz[j] * h[j];
    }
    for (int j = 0; j < E; j++) dh[j] = dz[j] / r - h[j] * s / (E * r * r * r);
    /* layer norm backward */
    double sx = 0, sxx = 0;
    for (int j = 0; j < E; j++) {
      double xh = (e[j] - mu) / sd;
      dlnw[j] += dh[j] * xh;
      dlnb[j] += dh[j];
      dxh[j] = dh[j] * lnw[j];
      sx += dxh[j];
      sxx += dxh[j] * xh;
    }
    for (int j = 0; j < E; j++) {
      double xh = (e[j] - mu) / sd;
      dtab[ids[t] * E + j] += (dxh[j] - sx / E - xh * sxx / E) / sd;
    }
  }
  float *got = full_of(c, y, T * E);
  assert_all_close(got, want, T * E, 1e-4, "y");
  free(got);
  dist_tensor *dy = put(c, "dy", g, 2, ys, m, &rep);
  cr_assert_eq(dist_layer_backward(c, seq, &dy, NULL), 0, "%s", dist_errmsg(c));
  got = read_param(c, seq, "rms.weight", 1, E);
  assert_all_close(got, drw, E, 1e-4, "d rms.weight");
  free(got);
  got = read_param(c, seq, "ln.weight", 1, E);
  assert_all_close(got, dlnw, E, 1e-4, "d ln.weight");
  free(got);
  got = read_param(c, seq, "ln.bias", 1, E);
  assert_all_close(got, dlnb, E, 1e-4, "d ln.bias");
  free(got);
  got = read_param(c, seq, "emb.weight", 1, V * E);
  assert_all_close(got, dtab, V * E, 1e-4, "d emb.weight");
  free(got);
  cr_assert_eq(dist_tensor_placements(dist_layer_grad_tensor(seq, "emb.weight"))[0].kind,
               DIST_SHARD);
  free(table);
  dist_tensor_free(dy);
  dist_tensor_free(y);
  dist_tensor_free(idt);
  cr_assert_eq(dist_layer_destroy(c, seq), 0, "%s", dist_errmsg(c));
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* A custom layer y = sum(x_1 * ... * x_n * scale) from a program, with
 * the parameter scale [3] (initially sc) and output Partial(sum), named
 * name and sharded on m. */
static dist_layer *scaled_product_layer(dist_client *c, const dist_mesh *m, int n_inputs,
                                        const float *sc, const char *name) {
  dist_program *p = NULL;
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  cr_assert_eq(dist_program_new(name, &p), 0);
  int prod = dist_input_dtensor(p, "x1", DIST_FLOAT32);
  for (int i = 1; i < n_inputs; i++) {
    char in[16];
    snprintf(in, sizeof in, "x%d", i + 1);
    prod = dist_op_mul(p, prod, dist_input_dtensor(p, in, DIST_FLOAT32));
  }
  int scale = dist_input_dtensor(p, "scale", DIST_FLOAT32);
  dist_input_set_grad_placements(p, scale, &psum, 1);
  dist_program_output(p, dist_op_sum(p, dist_op_mul(p, prod, scale), NULL, 0, 0));
  cr_assert_eq(dist_program_out_dist_attr(p, m, &psum, NULL), 0);
  dist_layer *l = NULL;
  cr_assert_eq(dist_layer_program(p, n_inputs, &l), 0);
  int64_t ss[1] = {3};
  cr_assert_eq(dist_layer_add_param(l, "scale", 1, ss, sc), 0);
  cr_assert_eq(dist_layer_set_name(l, name), 0);
  cr_assert_eq(dist_shard_layer(c, l, m, NULL, NULL, NULL, NULL), 0, "%s",
               dist_errmsg(c));
  return l;
}

/* A custom layer from a program with a parameter: y = x * scale, and a
 * scalar loss sum(y) backpropagated without an output gradient. */
Test(shard_layer, custom_program_layer_trains_its_parameter, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  dist_placement s0 = DIST_SHARD_DIM(0);
  int64_t xs[2] = {4, 3};
  float sc[3] = {1, 2, 3}, xv[12];
  fill(xv, 12, 31);
  dist_layer *l = scaled_product_layer(c, m, 1, sc, "custom");
  dist_tensor *xt = put(c, "x", xv, 2, xs, m, &s0), *y = NULL;
  cr_assert_eq(dist_layer_forward(c, l, &xt, 1, &y, 1), 1, "%s", dist_errmsg(c));
  float *got = full_of(c, y, 1);
  double want = 0, dscale[3] = {0};
  for (int i = 0; i < 12; i++) want += xv[i] * sc[i % 3], dscale[i % 3] += xv[i];
  cr_assert(fabs(got[0] - want) < 1e-5, "sum %g, want %g", got[0], want);
  free(got);
  cr_assert_eq(dist_layer_backward(c, l, NULL, NULL), 0, "%s", dist_errmsg(c));
  got = read_param(c, l, "scale", 1, 3);
  assert_all_close(got, dscale, 3, 1e-5, "d scale (Partial reduced)");
  free(got);
  cr_assert_eq(dist_tensor_placements(dist_layer_grad_tensor(l, "scale"))[0].kind,
               DIST_REPLICATE);
  /* one SGD step in the daemons: scale -= lr * grad */
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = 0.5;
  o.momentum = 0;
  cr_assert_eq(dist_layer_configure_optimizer(c, l, &o), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_layer_step(c, l, 0), 0, "%s", dist_errmsg(c));
  got = read_param(c, l, "scale", 0, 3);
  double after[3];
  for (int j = 0; j < 3; j++) after[j] = sc[j] - 0.5 * dscale[j];
  assert_all_close(got, after, 3, 1e-5, "scale after SGD");
  free(got);
  cr_assert_eq(dist_layer_backward(c, l, NULL, NULL), DIST_EINVAL,
               "backward runs once per forward");
  dist_tensor_free(y);
  dist_tensor_free(xt);
  cr_assert_eq(dist_layer_destroy(c, l), 0, "%s", dist_errmsg(c));
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* One activation feeding two inputs: a layer y = sum(x1 * x2 * scale)
 * called with x as both x1 and x2. x's gradient is the sum of its two uses,
 * 2 * x * scale, and scale's is sum over rows of x^2. */
Test(shard_layer, an_input_used_twice_gets_the_sum_of_its_gradients, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  dist_placement s0 = DIST_SHARD_DIM(0);
  int64_t xs[2] = {4, 3};
  float sc[3] = {1, -2, 0.5f}, xv[12];
  fill(xv, 12, 57);
  dist_layer *l = scaled_product_layer(c, m, 2, sc, "twice");
  dist_tensor *xt = put(c, "x", xv, 2, xs, m, &s0), *y = NULL;
  dist_tensor *const ins[2] = {xt, xt};
  cr_assert_eq(dist_layer_forward(c, l, ins, 2, &y, 1), 1, "%s", dist_errmsg(c));
  double want = 0, dx[12], dscale[3] = {0};
  for (int i = 0; i < 12; i++) {
    want += (double)xv[i] * xv[i] * sc[i % 3];
    dx[i] = 2.0 * xv[i] * sc[i % 3];
    dscale[i % 3] += (double)xv[i] * xv[i];
  }
  float *got = full_of(c, y, 1);
  cr_assert(fabs(got[0] - want) < 1e-5, "sum %g, want %g", got[0], want);
  free(got);
  dist_tensor *in_grads[2] = {NULL, NULL};
  cr_assert_eq(dist_layer_backward(c, l, NULL, in_grads), 0, "%s", dist_errmsg(c));
  for (int k = 0; k < 2; k++) {
    cr_assert_not_null(in_grads[k], "no gradient for input %d", k);
    got = full_of(c, in_grads[k], 12);
    assert_all_close(got, dx, 12, 1e-5, "d x (both uses)");
    free(got);
    dist_tensor_free(in_grads[k]);
  }
  got = read_param(c, l, "scale", 1, 3);
  assert_all_close(got, dscale, 3, 1e-5, "d scale");
  free(got);
  dist_tensor_free(y);
  dist_tensor_free(xt);
  cr_assert_eq(dist_layer_destroy(c, l), 0, "%s", dist_errmsg(c));
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* ---------------------------------------------------------------- seed 002 */

Test(shard_layer, seed_002_shard_mlp_example, .timeout = 120) {
  const char *root = getenv("DIST_BUILD_ROOT");
  char cmd[2048], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "DIST_DISTD_BIN='%s' '%s' launch -n 2 -- '%s/examples/shard_mlp'",
           harness_distd(), harness_distctl(), root ? root : "build");
  int rc = harness_run(cmd, &out, &err, 90);
  cr_assert_eq(rc, 0, "launch failed (%d): %s %s", rc, out ? out : "", err ? err : "");
  cr_assert_not_null(out);
  const char *lines[4] = {"fc1.weight shape=[8, 8] placements=[Shard(0)]\n",
                          "fc1.bias shape=[8] placements=[Replicate()]\n",
                          "fc2.weight shape=[8, 8] placements=[Replicate()]\n",
                          "fc2.bias shape=[8] placements=[Replicate()]\n"};
  const char *at = out;
  for (int i = 0; i < 4; i++) {
    cr_assert(strncmp(at, lines[i], strlen(lines[i])) == 0, "line %d of:\n%s", i, out);
    at += strlen(lines[i]);
  }
  double diff = -1;
  cr_assert_eq(sscanf(at, "max_abs_diff_vs_local=%lf", &diff), 1, "%s", out);
  cr_assert(diff >= 0 && diff <= 1e-5, "diff %g", diff);
  double losses[64];
  int n = 0, s = 0;
  for (const char *q = strstr(at, "step "); q && n < 64; q = strstr(q + 1, "step ")) {
    cr_assert_eq(sscanf(q, "step %d loss=%lf", &s, &losses[n]), 2);
    cr_assert_eq(s, n + 1);
    n++;
  }
  cr_assert_geq(n, 10, "%s", out);
  for (int i = 1; i < n; i++)
    cr_assert_lt(losses[i], losses[i - 1], "loss went up at step %d:\n%s", i + 1, out);
  cr_assert_lt(losses[n - 1], 0.5 * losses[0]);
  free(out);
  free(err);
}

/* ---------------------------------------------------------------- bad input */

static int store_is_empty(dist_client *c) {
  dist_tensor **list = NULL;
  int n = 0;
  cr_assert_eq(dist_tensor_list(c, &list, &n), 0);
  dist_tensor_list_free(list, n);
  return n == 0;
}

static dist_layer *two_layer_mlp(void) {
  dist_layer *mlp = NULL;
  cr_assert_eq(dist_layer_sequence(&mlp), 0);
  cr_assert_eq(dist_layer_add(mlp, "fc1", linear(8, 8, 1, 1)), 0);
  cr_assert_eq(dist_layer_add(mlp, "fc2", linear(8, 8, 1, 2)), 0);
  cr_assert_eq(dist_layer_set_name(mlp, "bad"), 0);
  return mlp;
}

Test(shard_layer, a_shard_fn_placing_a_missing_dim_fails_and_stores_nothing,
     .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  dist_layer *mlp = two_layer_mlp();
  /* fc1 fine, then fc2.bias (1 dim) on Shard(1): nothing of fc1 stays */
  placing places[2] = {{"fc1", "weight", {DIST_SHARD_DIM(0)}, 1},
                       {"fc2", "bias", {DIST_SHARD_DIM(1)}, 1}};
  shard_log log = {.places = places, .nplaces = 2};
  int rc = dist_shard_layer(c, mlp, m, logging_shard_fn, NULL, NULL, &log);
  cr_assert_eq(rc, DIST_EINVAL);
  const char *msg = dist_errmsg(c);
  cr_assert(strstr(msg, "fc2.bias") && strstr(msg, "Shard(1)") && strstr(msg, "no dim 1"),
            "%s", msg);
  cr_assert(store_is_empty(c), "nothing created");
  dist_layer_param_info in;
  cr_assert_eq(dist_layer_param_at(mlp, 0, &in), 0);
  cr_assert_str_eq(in.name, "");
  /* an unknown parameter name is named too */
  placing typo = {"fc1", "wieght", {DIST_SHARD_DIM(0)}, 1};
  shard_log log2 = {.places = &typo, .nplaces = 1};
  cr_assert_neq(dist_shard_layer(c, mlp, m, logging_shard_fn, NULL, NULL, &log2), 0);
  cr_assert(strstr(dist_errmsg(c), "wieght") != NULL, "%s", dist_errmsg(c));
  cr_assert(store_is_empty(c));
  /* and the layer can still be sharded properly afterwards */
  shard_log ok = {.places = places, .nplaces = 1};
  cr_assert_eq(dist_shard_layer(c, mlp, m, logging_shard_fn, NULL, NULL, &ok), 0,
               "%s", dist_errmsg(c));
  cr_assert_eq(dist_layer_destroy(c, mlp), 0);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* Element counts were multiplied unchecked: [2^33, 2^31] and
 * [2^22, 2^22, 2^20] wrapped to 0 elements and were accepted over a
 * 4-byte buffer (signed overflow, UBSan's report). They are refused, the
 * tree unchanged. */
Test(shard_layer, shapes_whose_element_count_overflows_are_refused) {
  const int64_t big = (int64_t)1 << 33, wide = (int64_t)1 << 31;
  dist_layer *l = NULL;
  cr_assert_eq(dist_layer_linear(big, wide, 0, 1, &l), DIST_EINVAL);
  cr_assert_null(l);
  cr_assert_eq(dist_layer_embedding(big, wide, 1, &l), DIST_EINVAL);
  cr_assert_null(l);
  cr_assert_eq(dist_layer_layer_norm((int64_t)1 << 50, 1e-5, &l), DIST_EINVAL, "not ENOMEM");
  cr_assert_null(l);
  cr_assert_eq(dist_layer_sequence(&l), 0);
  int64_t huge[3] = {1 << 22, 1 << 22, 1 << 20}, fine[1] = {4};
  cr_assert_eq(dist_layer_add_param(l, "p", 3, huge, NULL), DIST_EINVAL);
  cr_assert_eq(dist_layer_add_buffer(l, "b", 3, huge, NULL), DIST_EINVAL);
  cr_assert_eq(dist_layer_n_params(l), 0);
  cr_assert_eq(dist_layer_add_param(l, "p", 1, fine, NULL), 0);
  cr_assert_eq(dist_layer_n_params(l), 1);
  dist_layer_free(l);
}

/* A Linear 4 -> 4 named `name`, sharded by c on m, run forward once on a
 * replicated x ("<name>.x"): its step holds y's and x's tensors. */
typedef struct stepped {
  dist_layer *l;
  dist_tensor *x, *y;
} stepped;

/* A Linear(4, 4) `name` on m, sharded with output_fn (NULL: none; user
 * its data), after a forward of x "<name>.x" [2, 4] (fill's seed 5),
 * Replicate. */
static stepped linear_after_a_forward_then(dist_client *c, const dist_mesh *m, const char *name,
                                           dist_layer_io_fn output_fn, void *user) {
  stepped st = {NULL, NULL, NULL};
  cr_assert_eq(dist_layer_linear(4, 4, 1, 7, &st.l), 0);
  cr_assert_eq(dist_layer_set_name(st.l, name), 0);
  cr_assert_eq(dist_shard_layer(c, st.l, m, NULL, NULL, output_fn, user), 0, "%s",
               dist_errmsg(c));
  float xv[8];
  fill(xv, 8, 5);
  int64_t shape[2] = {2, 4};
  dist_placement rep = DIST_REPLICATED;
  char xname[64];
  snprintf(xname, sizeof xname, "%s.x", name);
  st.x = put(c, xname, xv, 2, shape, m, &rep);
  cr_assert_eq(dist_layer_forward(c, st.l, &st.x, 1, &st.y, 1), 1, "%s", dist_errmsg(c));
  return st;
}

static stepped linear_after_a_forward(dist_client *c, const dist_mesh *m, const char *name) {
  return linear_after_a_forward_then(c, m, name, NULL, NULL);
}

static void stepped_free(stepped *st) {
  dist_tensor_free(st->x), dist_tensor_free(st->y);
  dist_layer_free(st->l);
}

/* A release that cannot delete its step's tensors (here a daemon is
 * down) says so: it answered success, leaving them in the daemons with
 * nothing in the client naming them. */
Test(shard_layer, a_release_that_cannot_delete_its_step_says_so, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  stepped st = linear_after_a_forward(c, m, "rel");
  harness_kill(&cluster, 1, SIGKILL);
  int rc = dist_layer_release(c, st.l);
  cr_assert_eq(rc, DIST_EUNAVAIL, "release of a step it could not delete: %d (%s)", rc,
               dist_errmsg(c));
  cr_assert_eq(dist_layer_release(c, st.l), 0, "the step is dropped all the same");
  stepped_free(&st);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* A release that succeeds leaves no error: a step tensor the caller
 * deleted already (here the output) is not found, which is no failure, and
 * dist_errmsg said so after the release returned 0; a release with
 * nothing to release left the last call's error (here an open of a name
 * no daemon holds). */
Test(shard_layer, a_release_that_succeeds_leaves_no_error, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  stepped st = linear_after_a_forward(c, m, "gone");
  cr_assert_eq(dist_tensor_delete_handle(c, st.y), 0, "%s", dist_errmsg(c));
  for (int nothing_left = 0; nothing_left < 2; nothing_left++) {
    dist_tensor *t = NULL;
    if (nothing_left)
      cr_assert_eq(dist_tensor_open(c, "gone.none", &t), DIST_ENOTFOUND, "%s", dist_errmsg(c));
    cr_assert_eq(dist_layer_release(c, st.l), 0, "%s", dist_errmsg(c));
    cr_assert_eq(dist_errcode(c), 0, "release left code %d", dist_errcode(c));
    cr_assert_str_eq(dist_errmsg(c), "", "release left an error: %s", dist_errmsg(c));
  }
  stepped_free(&st);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* A Linear "frz" on 2 daemons after a forward, then with rank 1 frozen
 * (a 2 s deadline) its backward, or a forward again after a release (the
 * first registered the layer's program and the release dropped its step,
 * so the second sends only its call): it fails within `most` deadlines. */
static void linear_with_rank_1_frozen(int forward, double most) {
  enum { DEADLINE_MS = 2000 };
  harness_start(&cluster, 2, NULL);
  dist_client *c = harness_client_deadline(&cluster, DEADLINE_MS);
  dist_mesh *m = harness_line_mesh(2);
  stepped st = linear_after_a_forward(c, m, "frz");
  dist_tensor *y = NULL;
  if (forward) cr_assert_eq(dist_layer_release(c, st.l), 0, "%s", dist_errmsg(c));
  double t0 = harness_freeze_timed(&cluster, 1);
  int rc = forward ? dist_layer_forward(c, st.l, &st.x, 1, &y, 1)
                   : dist_layer_backward(c, st.l, &st.y, NULL);
  harness_resume_within(&cluster, 1, t0, rc, most, DEADLINE_MS);
  stepped_free(&st);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* A backward that fails because a daemon does not answer must not then
 * ask that daemon to delete each gradient it never stored: every such
 * delete waits a whole deadline (it took 4 deadlines, 8 s here; 2 minutes
 * at the default 30 s). It asks only the daemons that applied it. */
Test(shard_layer, a_backward_a_frozen_daemon_fails_waits_one_deadline, .timeout = 120) {
  linear_with_rank_1_frozen(0, 2.5);
}

/* A forward that fails because a daemon does not answer deletes the
 * outputs it stored only on the daemons that applied its call: asking the
 * frozen one too cost a deadline per output name (2 deadlines here). */
Test(shard_layer, a_forward_a_frozen_daemon_fails_waits_one_deadline, .timeout = 120) {
  linear_with_rank_1_frozen(1, 1.5);
}

/* What ends a failed step's leftovers in lost_reply_forward and
 * lost_reply_backward. */
typedef enum { BY_RELEASE, BY_FORWARD, BY_DESTROY } ended_by;

/* Ends st's failed step as `how` says: a release, a forward (st.x again)
 * or a destroy. */
static void end_step(dist_client *c, stepped *st, ended_by how) {
  if (how == BY_RELEASE) {
    cr_assert_eq(dist_layer_release(c, st->l), 0, "%s", dist_errmsg(c));
  } else if (how == BY_FORWARD) {
    dist_tensor *y = NULL;
    cr_assert_eq(dist_layer_forward(c, st->l, &st->x, 1, &y, 1), 1, "%s", dist_errmsg(c));
    dist_tensor_free(y);
  } else {
    cr_assert_eq(dist_layer_destroy(c, st->l), 0, "%s", dist_errmsg(c));
    st->l = NULL;
  }
}

/* A Linear on 2 daemons after one forward, rank 1 reached through a
 * relay that can hold its replies. */
typedef struct relayed_step {
  dist_client *c;
  reply_hold *relay;
  dist_mesh *m;
  stepped st;
} relayed_step;

/* The layer on m (taken), or on both ranks when m is NULL. */
static void relayed_step_start_on(relayed_step *s, const char *name, dist_mesh *m) {
  s->relay = reply_hold_cluster(&cluster, 2, 1, REPLY_HOLD_DEADLINE_MS, &s->c);
  s->m = m ? m : harness_line_mesh(2);
  s->st = linear_after_a_forward(s->c, s->m, name);
}

static void relayed_step_start(relayed_step *s, const char *name) {
  relayed_step_start_on(s, name, NULL);
}

static void relayed_step_stop(relayed_step *s) {
  stepped_free(&s->st);
  dist_mesh_free(s->m);
  reply_hold_cluster_stop(&cluster, s->relay, s->c);
}

/* Releases s's step while rank 1 cannot be reached (the relay refuses its
 * connections; rank 1 stays up with its store): the release fails
 * unreached, and rank 1 still holds the step's output, named after
 * prefix. */
static void release_unreached(relayed_step *s, const char *prefix) {
  reply_hold_refuse(s->relay);
  int rc = dist_layer_release(s->c, s->st.l);
  reply_hold_release(s->relay);
  cr_assert_eq(rc, DIST_EUNAVAIL, "release with rank 1 unreached: %s", dist_err_name(rc));
  cr_assert_eq(reply_hold_count_on(&cluster, 1, prefix, ""), 1, "rank 1 was not reached");
}

/* A Linear `name` on both ranks after a forward, its step released while
 * rank 1 cannot be reached (its output "<name>.s1...." and invocation
 * noted on the client's list for rank 1), then destroyed once rank 1 is
 * back: s->st.l is NULL. */
static void destroyed_after_an_unreached_release(relayed_step *s, const char *name) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "%s.s1.", name);
  relayed_step_start(s, name);
  release_unreached(s, prefix);
  cr_assert_eq(dist_layer_destroy(s->c, s->st.l), 0, "%s", dist_errmsg(s->c));
  s->st.l = NULL;
}

/* A Linear "unr" after a forward, its step released while rank 1 cannot
 * be reached (the relay refuses its connections, as a daemon that is down
 * would; rank 1 stays up, keeping its store): the release says it could
 * not delete the step's output (as a_release_that_cannot_delete_its_step
 * shows), and notes it, and the invocation, on the client's list for
 * rank 1, so the next step's release, rank 1 reachable again, undoes
 * both there. Before, the output stayed on rank 1 for good, and the
 * invocation until its time-to-live (10 minutes). */
Test(shard_layer, a_step_rank_1_could_not_be_reached_for_at_its_release_goes_at_the_next,
     .timeout = 120) {
  relayed_step s;
  relayed_step_start(&s, "unr");
  harness *h = &cluster;
  cr_assert_eq(reply_hold_count_on(h, 1, "unr.s1.", ""), 1, "rank 1 holds no step output");
  release_unreached(&s, "unr.s1.");
  cr_assert_eq(reply_hold_count_on(h, 0, "unr.s1.", ""), 0, "rank 0 answered: deleted");
  cr_assert_eq(reply_hold_invocations_on(h, 1), 1, "rank 1 was not reached");
  end_step(s.c, &s.st, BY_FORWARD);
  cr_assert_eq(dist_layer_release(s.c, s.st.l), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(reply_hold_count_on(h, 1, "unr.s1.", ""), 0, "rank 1 kept the step's output");
  cr_assert_eq(reply_hold_invocations_on(h, 1), 0, "rank 1 kept the step's invocation");
  relayed_step_stop(&s);
}

/* A Linear "again" whose step rank 1 could not be reached for at its
 * release (noted, with its output "again.s1....out0", on the
 * client's list, which outlives the layer), destroyed once rank 1 is back,
 * and a new Linear of the same name run forward: its first step makes the
 * same names, and rank 1 its output, which the caller holds. The client's
 * next undo point (an invocation release, of none) must leave it: making
 * a step's tensor forgets its name's note. Before, the old note deleted
 * the new output on rank 1. */
Test(shard_layer, a_new_layers_step_outlives_an_old_layers_note_of_its_name,
     .timeout = 120) {
  relayed_step s;
  destroyed_after_an_unreached_release(&s, "again");
  harness *h = &cluster;
  cr_assert_eq(dist_layer_linear(4, 4, 1, 7, &s.st.l), 0);
  cr_assert_eq(dist_layer_set_name(s.st.l, "again"), 0);
  cr_assert_eq(dist_shard_layer(s.c, s.st.l, s.m, NULL, NULL, NULL, NULL), 0, "%s",
               dist_errmsg(s.c));
  dist_tensor *y = NULL;
  cr_assert_eq(dist_layer_forward(s.c, s.st.l, &s.st.x, 1, &y, 1), 1, "%s", dist_errmsg(s.c));
  cr_assert_eq(strncmp(dist_tensor_name(y), "again.s1.", 9), 0,
               "the new step's names are not the old's: %s", dist_tensor_name(y));
  cr_assert_eq(dist_invocation_release(s.c, NULL), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(reply_hold_count_on(h, 1, "again.s1.", ""), 1,
               "the old layer's note deleted the new step's output on rank 1");
  void *piece[2] = {NULL, NULL};
  for (int r = 0; r < 2; r++) {
    size_t nbytes = 0;
    int64_t shape[DIST_MAX_DIMS];
    cr_assert_eq(dist_dtensor_to_local(s.c, y, r, &piece[r], &nbytes, shape), 0,
                 "rank %d: %s", r, dist_errmsg(s.c));
    cr_assert_eq(nbytes, 8 * sizeof(float), "rank %d's piece: %zu bytes", r, nbytes);
  }
  cr_assert_arr_eq(piece[1], piece[0], 8 * sizeof(float),
                   "rank 1's piece of the replicated output is not rank 0's");
  free(piece[0]), free(piece[1]);
  dist_tensor_free(y);
  relayed_step_stop(&s);
}

/* A Linear "far" on both ranks whose step rank 1 could not be reached
 * for at its release (its output "far.s1.root.e0.out0" noted on the
 * client's list for rank 1), destroyed once rank 1 is back, and a new
 * Linear "far" on rank 0 alone, run forward while rank 1 cannot be
 * reached (its check of the name outside its mesh goes unanswered, which
 * lets it through): its first step makes the same name, on rank 0 only.
 * The note is of rank 1, outside the new output's mesh, where the old
 * layer's output still lies, so the client's next undo point, rank 1
 * back, deletes it there and leaves the new output on rank 0. Before,
 * making the name forgot its notes on every rank, and rank 1 kept the
 * old output for good. */
Test(shard_layer, an_old_layers_note_outside_a_new_steps_mesh_is_still_undone,
     .timeout = 120) {
  relayed_step s;
  destroyed_after_an_unreached_release(&s, "far");
  harness *h = &cluster;
  cr_assert_eq(dist_tensor_delete_handle(s.c, s.st.x), 0, "%s", dist_errmsg(s.c));
  int zero[1] = {0}, one[1] = {1};
  dist_mesh *m0 = NULL;
  cr_assert_eq(dist_mesh_new(1, one, zero, NULL, &m0), 0);
  reply_hold_refuse(s.relay);
  stepped st = linear_after_a_forward(s.c, m0, "far");
  reply_hold_release(s.relay);
  cr_assert_eq(reply_hold_count_on(h, 1, "far.s1.", ""), 1, "rank 1 lost the old output");
  cr_assert_eq(dist_invocation_release(s.c, NULL), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(reply_hold_count_on(h, 1, "far.s1.", ""), 0,
               "rank 1 kept the old layer's output after the next undo point");
  void *piece = NULL;
  size_t nbytes = 0;
  int64_t shape[DIST_MAX_DIMS];
  cr_assert_eq(dist_dtensor_to_local(s.c, st.y, 0, &piece, &nbytes, shape), 0,
               "the new output on rank 0: %s", dist_errmsg(s.c));
  cr_assert_eq(nbytes, 8 * sizeof(float), "the new output's piece: %zu bytes", nbytes);
  free(piece);
  stepped_free(&st);
  dist_mesh_free(m0);
  relayed_step_stop(&s);
}

/* output_fn: every output onto the mesh given as user, Replicate, as a
 * stage hands its output to the ranks of the next. */
static int replicate_onto(dist_client *c, dist_tensor **ts, int n, const dist_mesh *mesh,
                          void *user) {
  (void)mesh;
  dist_placement rep = DIST_REPLICATED;
  for (int i = 0; i < n; i++) {
    int rc = dist_reshard(c, ts[i], user, &rep);
    if (rc) return rc;
  }
  return 0;
}

/* y = x @ w + b of linear_after_a_forward's Linear and x, computed here
 * from a fresh Linear of its seed. */
static void linear_after_a_forward_ref(double y[8]) {
  float xv[8];
  fill(xv, 8, 5);
  dist_layer *fresh = linear(4, 4, 1, 7);
  float *w = read_param(NULL, fresh, "weight", 0, 16), *b = read_param(NULL, fresh, "bias", 0, 4);
  linear_ref(xv, w, b, 2, 4, 4, y);
  free(w), free(b);
  dist_layer_free(fresh);
}

/* What moves a new step's output from rank 0 to rank 1 (a reshard goes
 * onto a mesh of its mesh's shape only: [0] to [0, 1] is refused). */
typedef enum { BY_CALLER_RESHARD, BY_OUTPUT_FN, BY_RESHARD_LOSING_ITS_REPLY } moved_by;

/* Releases s's step while the relay holds rank 1's reply to the delete
 * of its output, named after prefix (rank 1's third call of the release,
 * after its invocation's release and the output's look-up): rank 1
 * deletes it, yet the client, not knowing, notes it on its list for
 * rank 1. */
static void release_losing_rank_1s_delete(relayed_step *s, const char *prefix) {
  reply_hold_from_call(s->relay, 3);
  int rc = dist_layer_release(s->c, s->st.l);
  cr_assert(reply_hold_holding(s->relay), "the release sent rank 1 fewer than 3 calls");
  reply_hold_release(s->relay);
  cr_assert_eq(rc, DIST_ETIMEDOUT, "release with rank 1's delete unanswered: %s",
               dist_err_name(rc));
  cr_assert_eq(reply_hold_count_on(&cluster, 1, prefix, ""), 0,
               "rank 1 did not delete the output");
}

/* After the client's next undo point, rank 1 still holds y, a
 * replicated output of linear_after_a_forward named after prefix, with
 * its values. */
static void rank_1_keeps_the_output_past_an_undo_point(dist_client *c, const dist_tensor *y,
                                                       const char *prefix) {
  cr_assert_eq(dist_invocation_release(c, NULL), 0, "%s", dist_errmsg(c));
  cr_assert_eq(reply_hold_count_on(&cluster, 1, prefix, ""), 1,
               "the old note deleted the live output on rank 1");
  void *piece = NULL;
  size_t nbytes = 0;
  int64_t shape[DIST_MAX_DIMS];
  cr_assert_eq(dist_dtensor_to_local(c, y, 1, &piece, &nbytes, shape), 0,
               "the output on rank 1: %s", dist_errmsg(c));
  cr_assert_eq(nbytes, 8 * sizeof(float), "rank 1's piece: %zu bytes", nbytes);
  double want[8];
  linear_after_a_forward_ref(want);
  assert_all_close(piece, want, 8, 1e-5, "rank 1's piece of y");
  free(piece);
}

/* Reshards *y onto m1 while rank 1's reply is held past the deadline:
 * the vote moved it (rank 0 said so), the call failed, and *y is the
 * tensor opened again, as a caller would. */
static void reshard_losing_rank_1s_reply(relayed_step *s, dist_tensor **y, const dist_mesh *m1) {
  dist_placement rep = DIST_REPLICATED;
  char name[256];
  snprintf(name, sizeof name, "%s", dist_tensor_name(*y));
  reply_hold_from_call(s->relay, 1);
  int rc = dist_reshard(s->c, *y, m1, &rep);
  cr_assert(reply_hold_holding(s->relay), "the reshard sent rank 1 no call");
  reply_hold_release(s->relay);
  cr_assert_neq(rc, 0, "the reshard succeeded with rank 1's reply held");
  dist_tensor_free(*y);
  *y = NULL;
  cr_assert_eq(dist_tensor_open(s->c, name, y), 0, "%s", dist_errmsg(s->c));
}

/* A Linear "mv" on both ranks whose step's release lost rank 1's reply
 * to the delete of its output "mv.s1.mv.e0.out0"
 * (release_losing_rank_1s_delete). Destroyed, and a new Linear "mv" on
 * rank 0 alone run forward: its first step makes that name on rank 0,
 * forgetting its notes there only, and the name is then resharded onto
 * rank 1 (`how`). The client's next undo point must leave rank 1's
 * piece, which is the live output: a reshard stores the name on its
 * mesh's ranks and forgets its notes there. Before, the old note deleted
 * it. */
static void a_lost_delete_meets_a_resharded_output(moved_by how) {
  relayed_step s;
  relayed_step_start(&s, "mv");
  release_losing_rank_1s_delete(&s, "mv.s1.");
  cr_assert_eq(dist_layer_destroy(s.c, s.st.l), 0, "%s", dist_errmsg(s.c));
  s.st.l = NULL;
  cr_assert_eq(dist_tensor_delete_handle(s.c, s.st.x), 0, "%s", dist_errmsg(s.c));
  int zero[1] = {0}, one[1] = {1};
  dist_mesh *m0 = NULL, *m1 = NULL;
  cr_assert_eq(dist_mesh_new(1, one, zero, NULL, &m0), 0);
  cr_assert_eq(dist_mesh_new(1, one, one, NULL, &m1), 0);
  stepped st = linear_after_a_forward_then(s.c, m0, "mv",
                                           how == BY_OUTPUT_FN ? replicate_onto : NULL, m1);
  cr_assert_str_eq(dist_tensor_name(st.y), "mv.s1.mv.e0.out0", "not the old output's name");
  dist_placement rep = DIST_REPLICATED;
  if (how == BY_CALLER_RESHARD)
    cr_assert_eq(dist_reshard(s.c, st.y, m1, &rep), 0, "%s", dist_errmsg(s.c));
  if (how == BY_RESHARD_LOSING_ITS_REPLY) reshard_losing_rank_1s_reply(&s, &st.y, m1);
  cr_assert_eq(dist_mesh_rank_at(dist_tensor_mesh(st.y), 0), 1, "the output is not on rank 1");
  rank_1_keeps_the_output_past_an_undo_point(s.c, st.y, "mv.s1.");
  stepped_free(&st);
  dist_mesh_free(m0), dist_mesh_free(m1);
  relayed_step_stop(&s);
}

Test(shard_layer, a_lost_deletes_note_spares_an_output_the_caller_reshards, .timeout = 120) {
  a_lost_delete_meets_a_resharded_output(BY_CALLER_RESHARD);
}

Test(shard_layer, a_lost_deletes_note_spares_an_output_output_fn_reshards, .timeout = 120) {
  a_lost_delete_meets_a_resharded_output(BY_OUTPUT_FN);
}

/* The same, the caller's reshard losing rank 1's reply: the reshard is
 * voted, so rank 0's success says rank 1 stored it too, and its notes
 * there go though the call failed. */
Test(shard_layer, a_lost_deletes_note_spares_an_output_whose_reshard_lost_a_reply,
     .timeout = 120) {
  a_lost_delete_meets_a_resharded_output(BY_RESHARD_LOSING_ITS_REPLY);
}

/* How a checkpoint restore stores a name again. */
typedef enum { RESTORED_AS_SAVED, RESTORED_ONTO_RANK_1 } restored_how;

/* A Linear "ck" on both ranks after a forward, its output
 * "ck.s1.ck.e0.out0" saved in a checkpoint, then the step's release lost
 * rank 1's reply to the output's delete (release_losing_rank_1s_delete).
 * The checkpoint restored brings the output back onto rank 1: as saved
 * (the daemons load it), or onto rank 1 alone (a mesh of another shape:
 * put together in the client and put there). The client's next undo
 * point must leave it: a restore stores the name and forgets its notes
 * on the ranks it stores it on. Before, the note deleted it. */
static void a_lost_delete_meets_a_restored_output(restored_how how) {
  relayed_step s;
  relayed_step_start(&s, "ck");
  char dir[400];
  snprintf(dir, sizeof dir, "%s/ckpt", cluster.dir);
  const char *names[1] = {dist_tensor_name(s.st.y)};
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.tensors = names;
  o.ntensors = 1;
  cr_assert_eq(dist_checkpoint_save(s.c, dir, &o, NULL), 0, "%s", dist_errmsg(s.c));
  release_losing_rank_1s_delete(&s, "ck.s1.");
  int one[1] = {1};
  dist_mesh *m1 = NULL;
  cr_assert_eq(dist_mesh_new(1, one, one, NULL, &m1), 0);
  dist_placement rep = DIST_REPLICATED;
  if (how == RESTORED_ONTO_RANK_1) o.mesh = m1, o.placements = &rep, o.nplacements = 1;
  cr_assert_eq(dist_checkpoint_restore(s.c, dir, &o, NULL), 0, "%s", dist_errmsg(s.c));
  dist_tensor *y = NULL;
  cr_assert_eq(dist_tensor_open(s.c, names[0], &y), 0, "%s", dist_errmsg(s.c));
  rank_1_keeps_the_output_past_an_undo_point(s.c, y, "ck.s1.");
  dist_tensor_free(y);
  dist_mesh_free(m1);
  relayed_step_stop(&s);
}

Test(shard_layer, a_lost_deletes_note_spares_an_output_restored_as_saved, .timeout = 120) {
  a_lost_delete_meets_a_restored_output(RESTORED_AS_SAVED);
}

Test(shard_layer, a_lost_deletes_note_spares_an_output_restored_onto_its_rank, .timeout = 120) {
  a_lost_delete_meets_a_restored_output(RESTORED_ONTO_RANK_1);
}

/* A Linear "only1" on rank 1 alone after a forward, its step released
 * while rank 1 cannot be reached: the delete of its output finds it on no
 * daemon that answered (rank 0 never held it), yet rank 1, which did not
 * answer, may hold it, and is noted for it, so the client's next undo
 * point, rank 1 back, deletes it there. Before, the failed look-up noted
 * nothing, and the output stayed on rank 1 for good. */
Test(shard_layer, a_step_whose_only_daemon_could_not_be_reached_at_its_release_goes_at_the_next,
     .timeout = 120) {
  int one[1] = {1}, shape[1] = {1};
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_new(1, shape, one, NULL, &m), 0);
  relayed_step s;
  relayed_step_start_on(&s, "only1", m);
  harness *h = &cluster;
  cr_assert_eq(reply_hold_count_on(h, 1, "only1.s1.", ""), 1, "rank 1 holds no step output");
  release_unreached(&s, "only1.s1.");
  cr_assert_eq(dist_invocation_release(s.c, NULL), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(reply_hold_count_on(h, 1, "only1.s1.", ""), 0,
               "rank 1 kept the step's output after the next undo point");
  relayed_step_stop(&s);
}

/* Releases s's step, then runs a second forward whose reply from rank 1
 * is lost after rank 1 stored its output (named after prefix, the
 * step-2 names) and kept its invocation: both are noted on the layer's
 * own list for rank 1. */
static void forward_lost_at_rank_1(relayed_step *s, const char *prefix) {
  harness *h = &cluster;
  cr_assert_eq(dist_layer_release(s->c, s->st.l), 0, "%s", dist_errmsg(s->c));
  cr_assert_eq(reply_hold_invocations_on(h, 1), 0, "the release left an invocation");
  reply_hold_from_call(s->relay, 1);
  dist_tensor *y = NULL;
  int rc = dist_layer_forward(s->c, s->st.l, &s->st.x, 1, &y, 1);
  cr_assert(reply_hold_holding(s->relay), "the forward sent rank 1 no call");
  reply_hold_release(s->relay);
  cr_assert(rc < 0, "the forward whose reply from rank 1 was lost succeeded");
  cr_assert_eq(reply_hold_count_on(h, 1, prefix, ""), 1, "rank 1 stored the output");
  cr_assert_eq(reply_hold_count_on(h, 0, prefix, ""), 0, "rank 0 answered: deleted");
  cr_assert_eq(reply_hold_invocations_on(h, 1), 1, "rank 1 kept no invocation");
  cr_assert_eq(reply_hold_invocations_on(h, 0), 0, "rank 0 answered: released");
}

/* A Linear "lost", released after its first forward, then a second
 * forward whose reply from rank 1 the relay holds past the deadline,
 * after rank 1 stored the output "lost.s2.root.e0.out0" and kept the
 * invocation for backward. The forward does not ask rank 1 to delete or
 * release them (it did not answer: that would cost a deadline each), but
 * the next release, forward or destroy does; before, the output stayed
 * there for good, and the invocation until its time-to-live (10 minutes)
 * ran out. A forward after keeps its own invocation, one per daemon. */
static void lost_reply_forward(ended_by how) {
  relayed_step s;
  relayed_step_start(&s, "lost");
  harness *h = &cluster;
  forward_lost_at_rank_1(&s, "lost.s2.");
  end_step(s.c, &s.st, how);
  cr_assert_eq(reply_hold_count_on(h, 1, "lost.s2.", ""), 0, "rank 1 kept the output");
  int left = how == BY_FORWARD;
  cr_assert_eq(reply_hold_invocations_on(h, 1), left, "rank 1 kept the failed invocation");
  relayed_step_stop(&s);
}

Test(shard_layer, a_forward_whose_reply_was_lost_leaves_nothing_after_a_release,
     .timeout = 120) {
  lost_reply_forward(BY_RELEASE);
}

Test(shard_layer, a_forward_whose_reply_was_lost_leaves_nothing_after_a_forward,
     .timeout = 120) {
  lost_reply_forward(BY_FORWARD);
}

/* Of the invocation this shows nothing: a destroy unregisters the
 * program, which drops its kept invocations on every daemon anyway. */
Test(shard_layer, a_forward_whose_reply_was_lost_leaves_nothing_after_a_destroy,
     .timeout = 120) {
  lost_reply_forward(BY_DESTROY);
}

/* A Linear "gone" whose second forward's reply from rank 1 was lost
 * (its output and invocation there noted on the layer's own list), then
 * destroyed while rank 1 cannot be reached (the relay refuses its
 * connections; rank 1 stays up with its store): the destroy's undo of
 * that list fails unreached, and what it could not undo goes to the
 * client's list, which outlives the layer, so the client's next undo
 * point (an invocation release, of none), rank 1 reachable again, deletes
 * the output there and releases the invocation. Before, the destroy
 * dropped the layer's list: the output stayed on rank 1 for good, the
 * invocation until its time-to-live. */
Test(shard_layer, a_destroy_rank_1_could_not_be_reached_for_leaves_its_list_to_the_client,
     .timeout = 120) {
  relayed_step s;
  relayed_step_start(&s, "gone");
  harness *h = &cluster;
  forward_lost_at_rank_1(&s, "gone.s2.");
  reply_hold_refuse(s.relay);
  int rc = dist_layer_destroy(s.c, s.st.l);
  reply_hold_release(s.relay);
  s.st.l = NULL;
  cr_assert_eq(rc, DIST_EUNAVAIL, "destroy with rank 1 unreached: %s", dist_err_name(rc));
  cr_assert_eq(reply_hold_count_on(h, 1, "gone.s2.", ""), 1, "rank 1 was not reached");
  cr_assert_eq(dist_invocation_release(s.c, NULL), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(reply_hold_count_on(h, 1, "gone.s2.", ""), 0,
               "rank 1 kept the failed forward's output after the next undo point");
  cr_assert_eq(reply_hold_invocations_on(h, 1), 0,
               "rank 1 kept the failed forward's invocation after the next undo point");
  relayed_step_stop(&s);
}

/* The gradients of a Linear `name` on rank r: its parameters'
 * ("<name>.<param>.grad") and its first step's input's
 * ("<name>.s1.e0.grad0"). */
static int grads_on(harness *h, int r, const char *name) {
  char of[64], step[64];
  snprintf(of, sizeof of, "%s.", name);
  snprintf(step, sizeof step, "%s.s1.", name);
  return reply_hold_count_on(h, r, of, ".grad") + reply_hold_count_on(h, r, step, "grad0");
}

/* s's backward, with rank 1's reply to it held by the relay past the
 * deadline, or with requests its request: it fails. */
static void backward_held(relayed_step *s, int requests) {
  if (requests) reply_hold_requests_from_call(s->relay, 1);
  else reply_hold_from_call(s->relay, 1);
  int rc = dist_layer_backward(s->c, s->st.l, &s->st.y, NULL);
  cr_assert(reply_hold_holding(s->relay), "the backward sent rank 1 no call");
  reply_hold_release(s->relay);
  cr_assert(rc < 0, "the backward held at rank 1 succeeded");
}

/* The backward of a Linear "bk" after one forward: rank 1 stores the
 * gradients of its parameters and input (names of the step's own, as
 * none existed before), but its reply is held past the deadline. Rank 0
 * deletes them at once; rank 1 at the next release, forward or destroy.
 * Before, they stayed on rank 1 for good. */
static void lost_reply_backward(ended_by how) {
  relayed_step s;
  relayed_step_start(&s, "bk");
  backward_held(&s, 0);
  cr_assert_eq(grads_on(&cluster, 1, "bk"), 3, "rank 1 stored the gradients of w, b and x");
  cr_assert_eq(grads_on(&cluster, 0, "bk"), 0, "rank 0 answered: deleted");
  end_step(s.c, &s.st, how);
  cr_assert_eq(grads_on(&cluster, 1, "bk"), 0, "rank 1 kept the gradients");
  relayed_step_stop(&s);
}

Test(shard_layer, a_backward_whose_reply_was_lost_leaves_nothing_after_a_release,
     .timeout = 120) {
  lost_reply_backward(BY_RELEASE);
}

Test(shard_layer, a_backward_whose_reply_was_lost_leaves_nothing_after_a_forward,
     .timeout = 120) {
  lost_reply_backward(BY_FORWARD);
}

Test(shard_layer, a_backward_whose_reply_was_lost_leaves_nothing_after_a_destroy,
     .timeout = 120) {
  lost_reply_backward(BY_DESTROY);
}

/* The backward of a Linear "rq" after one forward, whose request never
 * reaches rank 1 (the relay drops the client's bytes, then the
 * connection): rank 1 keeps the forward's invocation, as no backward used
 * it up. The failed backward notes it, and the release releases it;
 * before, it stayed until its time-to-live (10 minutes). */
Test(shard_layer, a_backward_rank_1_never_received_leaves_no_invocation_after_a_release,
     .timeout = 120) {
  relayed_step s;
  relayed_step_start(&s, "rq");
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 1, "the forward kept no invocation");
  backward_held(&s, 1);
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 1, "rank 1 used its invocation up");
  cr_assert_eq(grads_on(&cluster, 1, "rq"), 0, "rank 1 stored a gradient");
  /* Not asserted: rank 0's undo may meet its backward still waiting for
   * rank 1's vote. */
  dist_layer_release(s.c, s.st.l);
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 0, "rank 1 kept the invocation");
  relayed_step_stop(&s);
}

/* A parameter's gradient is named "<param>.grad" at every step. Step 1's
 * backward, whose reply from rank 1 is lost, notes those names on rank 1
 * for deleting; the release's deletes and the next forward's go
 * unanswered too (held), so the notes outlive them. Step 2's backward
 * then stores the parameters' new gradients under those names, and the
 * release after must not delete them: filing a gradient forgets its
 * name's note (dist_later_forget). */
Test(shard_layer, a_later_steps_parameter_gradient_outlives_a_failed_steps_note,
     .timeout = 120) {
  relayed_step s;
  relayed_step_start(&s, "fg");
  backward_held(&s, 0);
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "fg.", ".grad"), 2, "rank 1 stored w's and b's");
  reply_hold_from_call(s.relay, 1);
  cr_assert_neq(dist_layer_release(s.c, s.st.l), 0, "the release's undo was answered");
  reply_hold_release(s.relay);
  /* The forward's first call to rank 1 is the undo of the first note (of
   * the invocation and the gradients of x, w and b), held: once it goes
   * unanswered the undo leaves rank 1's other notes untried, and the
   * forward's own calls go through. */
  reply_hold_calls(s.relay, 1, 2);
  dist_tensor *y = NULL;
  int rc = dist_layer_forward(s.c, s.st.l, &s.st.x, 1, &y, 1);
  reply_hold_release(s.relay);
  cr_assert_eq(rc, 1, "%s", dist_errmsg(s.c));
  cr_assert_eq(dist_layer_backward(s.c, s.st.l, &y, NULL), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(dist_layer_release(s.c, s.st.l), 0, "%s", dist_errmsg(s.c));
  for (int r = 0; r < 2; r++)
    cr_assert_eq(reply_hold_count_on(&cluster, r, "fg.", ".grad"), 2,
                 "rank %d lost step 2's gradients of w and b", r);
  dist_tensor_free(y);
  relayed_step_stop(&s);
}

/* A Linear "pg" whose backward's reply from rank 1 was lost after rank 1
 * stored its parameters' gradients ("pg.weight.grad", "pg.bias.grad",
 * noted on the layer's own list for rank 1), destroyed while rank 1
 * cannot be reached: the notes go to the client's list. Once rank 1 is
 * back and the old parameters are deleted there, a new Linear "pg" runs a
 * step with a backward, filing its parameters' gradients under those
 * names on both ranks; the client's next undo point must leave them:
 * filing a gradient forgets its name's notes on the client's list too.
 * With the destroy handing its list over but the filing forgetting the
 * layer's own list only, the old notes deleted the new gradients on
 * rank 1. */
Test(shard_layer, a_new_layers_parameter_gradient_outlives_a_destroyed_layers_note,
     .timeout = 120) {
  relayed_step s;
  relayed_step_start(&s, "pg");
  harness *h = &cluster;
  backward_held(&s, 0);
  cr_assert_eq(reply_hold_count_on(h, 1, "pg.", ".grad"), 2, "rank 1 stored w's and b's");
  reply_hold_refuse(s.relay);
  int rc = dist_layer_destroy(s.c, s.st.l);
  reply_hold_release(s.relay);
  s.st.l = NULL;
  cr_assert_eq(rc, DIST_EUNAVAIL, "destroy with rank 1 unreached: %s", dist_err_name(rc));
  /* the old layer's parameters, left on rank 1 alone, and its input */
  dist_client *on_1 = harness_spmd_client(h, 1, "pg");
  const char *stale[2] = {"pg.weight", "pg.bias"};
  for (int i = 0; i < 2; i++)
    cr_assert_eq(dist_tensor_delete(on_1, stale[i]), 0, "%s: %s", stale[i], dist_errmsg(on_1));
  dist_close(on_1);
  cr_assert_eq(dist_tensor_delete_handle(s.c, s.st.x), 0, "%s", dist_errmsg(s.c));
  stepped st = linear_after_a_forward(s.c, s.m, "pg");
  cr_assert_eq(dist_layer_backward(s.c, st.l, &st.y, NULL), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(dist_invocation_release(s.c, NULL), 0, "%s", dist_errmsg(s.c));
  for (int r = 0; r < 2; r++)
    cr_assert_eq(reply_hold_count_on(h, r, "pg.", ".grad"), 2,
                 "rank %d lost the new layer's gradients of w and b", r);
  stepped_free(&st);
  relayed_step_stop(&s);
}

/* A layer y = a + b called with x twice: its backward sums x's two
 * gradients as "<grad>.sum", a name of the step's. Rank 1's reply to
 * that sum is held past the deadline after it stored it (its third call
 * of the backward, after the backward and the sum's program): rank 0
 * deletes it at once, rank 1 at the release. Before, the sum kept it on
 * both. */
Test(shard_layer, a_gradient_sum_whose_reply_was_lost_leaves_nothing_after_a_release,
     .timeout = 120) {
  dist_client *c = NULL;
  reply_hold *relay = reply_hold_cluster(&cluster, 2, 1, REPLY_HOLD_DEADLINE_MS, &c);
  dist_mesh *m = harness_line_mesh(2);
  dist_placement rep = DIST_REPLICATED;
  dist_program *p = NULL;
  cr_assert_eq(dist_program_new("addab", &p), 0);
  int a = dist_input_dtensor(p, "a", DIST_FLOAT32), b = dist_input_dtensor(p, "b", DIST_FLOAT32);
  dist_program_output(p, dist_op_add(p, a, b));
  cr_assert_eq(dist_program_out_dist_attr(p, m, &rep, NULL), 0);
  dist_layer *l = NULL;
  cr_assert_eq(dist_layer_program(p, 2, &l), 0);
  cr_assert_eq(dist_layer_set_name(l, "twice"), 0);
  cr_assert_eq(dist_shard_layer(c, l, m, NULL, NULL, NULL, NULL), 0, "%s", dist_errmsg(c));
  float xv[8];
  fill(xv, 8, 3);
  int64_t shape[2] = {2, 4};
  dist_tensor *x = put(c, "twice.x", xv, 2, shape, m, &rep);
  dist_tensor *dy = put(c, "twice.dy", xv, 2, shape, m, &rep), *y = NULL;
  dist_tensor *two[2] = {x, x};
  cr_assert_eq(dist_layer_forward(c, l, two, 2, &y, 1), 1, "%s", dist_errmsg(c));
  reply_hold_from_call(relay, 3);
  int rc = dist_layer_backward(c, l, &dy, NULL);
  cr_assert(reply_hold_holding(relay), "the backward sent rank 1 fewer than 3 calls");
  reply_hold_release(relay);
  cr_assert(rc < 0, "the backward whose sum's reply from rank 1 was lost succeeded");
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "twice.", ".sum"), 1, "rank 1 stored the sum");
  cr_assert_eq(reply_hold_count_on(&cluster, 0, "twice.", ".sum"), 0, "rank 0 answered: deleted");
  cr_assert_eq(dist_layer_release(c, l), 0, "%s", dist_errmsg(c));
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "twice.", ".sum"), 0, "rank 1 kept the sum");
  dist_tensor_free(x), dist_tensor_free(dy), dist_tensor_free(y);
  dist_layer_free(l);
  dist_mesh_free(m);
  reply_hold_cluster_stop(&cluster, relay, c);
}

Test(shard_layer, a_mesh_outside_the_cluster_fails_and_stores_nothing,
     .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_from_string("[0,1,2]", "x", &m), 0);
  dist_layer *mlp = two_layer_mlp();
  int rc = dist_shard_layer(c, mlp, m, NULL, NULL, NULL, NULL);
  cr_assert_eq(rc, DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "rank 2") && strstr(dist_errmsg(c), "2 daemons"),
            "%s", dist_errmsg(c));
  cr_assert(store_is_empty(c));
  dist_layer_free(mlp);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

Test(shard_layer, a_gradient_of_the_wrong_shape_is_refused_and_changes_nothing,
     .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  dist_mesh *m = harness_line_mesh(2);
  dist_layer *mlp = two_layer_mlp();
  placing places[1] = {{"fc1", "weight", {DIST_SHARD_DIM(0)}, 1}};
  shard_log log = {.places = places, .nplaces = 1};
  cr_assert_eq(dist_shard_layer(c, mlp, m, logging_shard_fn, NULL, NULL, &log), 0);
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.optimizer = DIST_OPT_ADAM;
  o.lr = 0.1;
  cr_assert_eq(dist_layer_configure_optimizer(c, mlp, &o), 0, "%s", dist_errmsg(c));
  float *before = read_param(c, mlp, "fc1.weight", 0, 64);
  float wrong[7 * 8];
  memset(wrong, 0, sizeof wrong);
  int rc = dist_layer_push_grad(c, mlp, "fc1.weight", 0, wrong, sizeof wrong);
  cr_assert_eq(rc, DIST_EMISMATCH);
  cr_assert(strstr(dist_errmsg(c), "fc1.weight") && strstr(dist_errmsg(c), "[8, 8]"),
            "%s", dist_errmsg(c));
  float *after = read_param(c, mlp, "fc1.weight", 0, 64);
  cr_assert_eq(memcmp(before, after, 64 * sizeof(float)), 0);
  /* a right one goes through and moves the weight */
  float right[64];
  fill(right, 64, 41);
  cr_assert_eq(dist_layer_push_grad(c, mlp, "fc1.weight", 0, right, sizeof right), 0,
               "%s", dist_errmsg(c));
  free(after);
  after = read_param(c, mlp, "fc1.weight", 0, 64);
  cr_assert_neq(memcmp(before, after, 64 * sizeof(float)), 0);
  free(before);
  free(after);
  cr_assert_eq(dist_layer_destroy(c, mlp), 0);
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* A backward without output gradients of a layer whose one output is not
 * a scalar was refused as "needs a single one-element output; the
 * program has 1 outputs", which reads as satisfied. The error gives the
 * output's shape; the step is left for a backward with gradients. */
Test(shard_layer, a_backward_without_gradients_of_a_non_scalar_output_names_its_shape,
     .timeout = 120) {
  float x[8];
  int64_t xs[2] = {2, 4};
  dist_placement rep = DIST_REPLICATED;
  dist_layer *l = linear(4, 3, 1, 5);
  dist_mesh *m = harness_line_mesh(2);
  fill(x, 8, 3);
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  cr_assert_eq(dist_shard_layer(c, l, m, NULL, NULL, NULL, NULL), 0, "%s", dist_errmsg(c));
  dist_tensor *in = put(c, "x", x, 2, xs, m, &rep), *out = NULL;
  cr_assert_eq(dist_layer_forward(c, l, &in, 1, &out, 1), 1, "%s", dist_errmsg(c));
  cr_assert_eq(dist_layer_backward(c, l, NULL, NULL), DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "one-element output; the program has 1 outputs, of "
                   "shape [2, 3]"), "%s", dist_errmsg(c));
  dist_tensor_free(out);
  dist_tensor_free(in);
  cr_assert_eq(dist_layer_destroy(c, l), 0, "%s", dist_errmsg(c));
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* A layer's configure is one batch: with room in the daemons for the
 * weight's Adam state and not the bias's, configure_optimizer left the
 * weight configured (one parameter at a time) and said only that
 * 'linear.bias' did not fit. Now neither is configured, and a configure
 * that fits configures both. */
Test(shard_layer, a_configure_refused_for_one_parameter_configures_none, .timeout = 120) {
  /* 48 + 12 bytes of values; the weight's state takes 3 * 48, the bias's
   * 3 * 12 more than the 20 left. */
  const char *limit[] = {"--memory-limit=224", NULL};
  dist_layer *l = linear(4, 3, 1, 5);
  dist_mesh *m = harness_line_mesh(2);
  dist_client *c = harness_start_with_client(&cluster, 2, limit);
  cr_assert_eq(dist_shard_layer(c, l, m, NULL, NULL, NULL, NULL), 0, "%s", dist_errmsg(c));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.optimizer = DIST_OPT_ADAM;
  cr_assert_eq(dist_layer_configure_optimizer(c, l, &o), DIST_ENOMEM, "%s", dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "layer 'linear': configure refused") &&
            strstr(dist_errmsg(c), "'linear.bias'"), "%s", dist_errmsg(c));
  dist_params_report rep;
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(dist_params(c, r, &rep), 0, "%s", dist_errmsg(c));
    cr_assert_eq(rep.n, 0, "rank %d configured %d parameters of a refused configure", r, rep.n);
    dist_params_report_free(&rep);
  }
  o.optimizer = DIST_OPT_SGD; /* no state: it fits */
  cr_assert_eq(dist_layer_configure_optimizer(c, l, &o), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_params(c, 1, &rep), 0, "%s", dist_errmsg(c));
  cr_assert_eq(rep.n, 2);
  dist_params_report_free(&rep);
  cr_assert_eq(dist_layer_destroy(c, l), 0, "%s", dist_errmsg(c));
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}

/* A layer's step is one batch: every parameter's push is applied, or none.
 * Here the bias is configured for one trainer and the weight for two, so
 * a step as trainer 1 is refused for the bias; pushed one at a time, the
 * weight was updated before that refusal (asynchronous: at once), and the
 * step made again as trainer 0 updated it twice. */
Test(shard_layer, a_step_refused_for_one_parameter_changes_none, .timeout = 120) {
  float x[8], dy[6];
  int64_t xs[2] = {2, 4}, ys[2] = {2, 3};
  dist_placement rep = DIST_REPLICATED;
  dist_layer *l = linear(4, 3, 1, 5);
  dist_mesh *m = harness_line_mesh(2);
  fill(x, 8, 3);
  fill(dy, 6, 7);
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  cr_assert_eq(dist_shard_layer(c, l, m, NULL, NULL, NULL, NULL), 0, "%s", dist_errmsg(c));
  dist_tensor *in = put(c, "x", x, 2, xs, m, &rep), *out = NULL;
  dist_tensor *gy = put(c, "dy", dy, 2, ys, m, &rep);
  cr_assert_eq(dist_layer_forward(c, l, &in, 1, &out, 1), 1, "%s", dist_errmsg(c));
  cr_assert_eq(dist_layer_backward(c, l, &gy, NULL), 0, "%s", dist_errmsg(c));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = 0.5;
  o.consistency = DIST_PARAM_ASYNC;
  o.trainers = 2;
  cr_assert_eq(dist_param_configure(c, "linear.weight", &o), 0, "%s", dist_errmsg(c));
  o.trainers = 1;
  cr_assert_eq(dist_param_configure(c, "linear.bias", &o), 0, "%s", dist_errmsg(c));
  float *w0 = read_param(c, l, "weight", 0, 12), *b0 = read_param(c, l, "bias", 0, 3);
  float *dw = read_param(c, l, "weight", 1, 12), *db = read_param(c, l, "bias", 1, 3);

  cr_assert_neq(dist_layer_step(c, l, 1), 0, "a step as trainer 1 of the bias's 1 went through");
  cr_assert(strstr(dist_errmsg(c), "linear.bias") && strstr(dist_errmsg(c), "step refused"),
            "%s", dist_errmsg(c));
  float *w1 = read_param(c, l, "weight", 0, 12), *b1 = read_param(c, l, "bias", 0, 3);
  cr_assert_eq(memcmp(w0, w1, sizeof(float) * 12), 0, "the weight moved in a refused step");
  cr_assert_eq(memcmp(b0, b1, sizeof(float) * 3), 0, "the bias moved in a refused step");

  cr_assert_eq(dist_layer_step(c, l, 0), 0, "%s", dist_errmsg(c));
  double want_w[12], want_b[3];
  for (int i = 0; i < 12; i++) want_w[i] = w0[i] - 0.5 * dw[i];
  for (int i = 0; i < 3; i++) want_b[i] = b0[i] - 0.5 * db[i];
  free(w1), free(b1);
  w1 = read_param(c, l, "weight", 0, 12), b1 = read_param(c, l, "bias", 0, 3);
  assert_all_close(w1, want_w, 12, 1e-6, "weight after one step");
  assert_all_close(b1, want_b, 3, 1e-6, "bias after one step");
  free(w0), free(b0), free(dw), free(db), free(w1), free(b1);
  dist_tensor_free(out);
  dist_tensor_free(gy);
  dist_tensor_free(in);
  cr_assert_eq(dist_layer_destroy(c, l), 0, "%s", dist_errmsg(c));
  dist_mesh_free(m);
  dist_close(c);
  stop_cluster();
}
