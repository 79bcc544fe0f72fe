/* Seed 003: Paddle's global_scatter example, on distd, one trainer per rank.
 *
 *   distctl launch -n 2 -- build/examples/global_scatter
 *
 * prints on each rank the scatter's output and the gradient of
 * sum(out * out) with respect to x, which is global_gather(2 * out): the
 * loss is a LocalLayer and a dist_tape differentiates through it and the
 * scatter.
 *
 *   distctl launch -n W -- build/examples/global_scatter --case DIR --out OUT
 *
 * runs a test case written by global_scatter_ref.py gen --format npy and
 * writes OUT/scatter_out_r<r>.npy, OUT/gather_out_r<r>.npy and, for float
 * dtypes, OUT/grad_x_r<r>.npy. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dist/dist.h"
#include "tensor.h"

static int fail(dist_client *c, const char *what) {
  fprintf(stderr, "global_scatter: %s: %s\n", what, c ? dist_errmsg(c) : "");
  return 1;
}

static void print_rows(const char *label, int rank, const void *data,
                       dist_dtype dt, int64_t rows, int64_t width) {
  printf("%s for rank %d: [", label, rank);
  for (int64_t i = 0; i < rows; i++) {
    printf("%s[", i ? ", " : "");
    for (int64_t j = 0; j < width; j++)
      printf("%s%g", j ? ", " : "", dist_elem_get(data, dt, (size_t)(i * width + j)));
    printf("]");
  }
  printf("]\n");
}

/* y = 2 * x, element by element in dtype dt. */
static void *doubled(const void *x, dist_dtype dt, size_t n) {
  void *y = malloc(n * dist_dtype_size(dt) + 1);
  for (size_t i = 0; y && i < n; i++)
    dist_elem_set(y, dt, i, 2 * dist_elem_get(x, dt, i));
  return y;
}

/* The seed's loss, sum(out * out) on each rank, as a LocalLayer whose
 * output is Partial(sum) over ranks 0 and 1. */
static int register_sum_sq(dist_client *c, dist_program **out) {
  int shape[1] = {2}, ranks[2] = {0, 1};
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_mesh *m = NULL;
  dist_program *p = NULL;
  int rc = dist_mesh_new(1, shape, ranks, NULL, &m);
  if (rc == 0) rc = dist_program_new("seed003.sum_sq", &p);
  if (rc == 0) {
    int y = dist_input_dtensor(p, "out", DIST_FLOAT32);
    dist_program_output(p, dist_op_sum(p, dist_op_mul(p, y, y), NULL, 0, 0));
    dist_program_out_dist_attr(p, m, &psum, NULL);
    rc = dist_program_register(c, p);
  }
  dist_mesh_free(m);
  if (rc) dist_program_free(p), p = NULL;
  *out = p;
  return rc;
}

/* The example of the Paddle documentation: W = 2, E = 2, d_model = 2. The
 * scatter's output stays in the daemons; the loss runs there as a
 * LocalLayer, and the tape differentiates through both, so the gradient of
 * x is global_gather(2 * out) computed daemon to daemon. */
static int run_seed(dist_client *c) {
  int rank = dist_rank(c), E = 2, rc = 1;
  if (dist_world_size(c) != 2) {
    fprintf(stderr, "global_scatter: the seed example needs 2 ranks (distctl launch -n 2)\n");
    return 1;
  }
  float x[5][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
  int64_t counts[2][4] = {{2, 1, 1, 1}, {1, 1, 2, 1}};
  const int64_t *lc[1] = {counts[rank]}, *gc[1] = {counts[rank]};
  const void *xs[1] = {x};
  dist_tape_exchange scatter = {"x", xs, NULL, DIST_FLOAT32, 2, lc, gc, E, NULL, 0,
                                "seed003.out", 1};
  dist_program *sum_sq = NULL;
  dist_tape *tape = NULL;
  dist_tensor *out = NULL, *loss = NULL;
  void *rows = NULL, *grad = NULL;
  size_t nbytes = 0;
  int64_t shape[DIST_MAX_DIMS];
  if (register_sum_sq(c, &sum_sq) != 0 || dist_tape_new(c, &tape) != 0) {
    fail(c, "setup");
    goto out;
  }
  if (dist_tape_global_scatter(tape, &scatter, &out, NULL) != 0 ||
      dist_dtensor_to_local(c, out, -1, &rows, &nbytes, shape) != 0) {
    fail(c, "global_scatter");
    goto out;
  }
  print_rows("out", rank, rows, DIST_FLOAT32, shape[0], 2);
  dist_arg arg = {out, NULL};
  if (dist_tape_local_layer_call(tape, sum_sq, &arg, 1, NULL, &loss) != 0) {
    fail(c, "loss");
    goto out;
  }
  const dist_tensor *seeds[1] = {loss};
  if (dist_tape_backward(tape, seeds, NULL, 1) != 0 ||
      dist_tape_grad_local(tape, "x", -1, &grad, &nbytes, shape) != 0) {
    fail(c, "backward");
    goto out;
  }
  print_rows("grad", rank, grad, DIST_FLOAT32, shape[0], 2);
  rc = 0;
out:
  if (loss) dist_tensor_delete(c, dist_tensor_name(loss));
  if (out) dist_tensor_delete(c, dist_tensor_name(out));
  dist_tape_free(tape);
  if (sum_sq) dist_program_unregister(c, sum_sq);
  dist_program_free(sum_sq);
  dist_tensor_free(out);
  dist_tensor_free(loss);
  free(rows);
  free(grad);
  return rc;
}

/* ---- --case DIR --out OUT ---- */

typedef struct npy {
  dist_dtype dt;
  dist_shape shape;
  void *data;
  size_t nbytes;
} npy;

static int read_npy(const char *dir, const char *name, int rank, npy *a) {
  char path[4096];
  dist_errbuf eb = DIST_ERRBUF_INIT;
  snprintf(path, sizeof path, "%s/%s_r%d.npy", dir, name, rank);
  a->dt = DIST_DTYPE_INVALID;
  if (dist_npy_read(path, &a->dt, &a->shape, &a->data, &a->nbytes, &eb) != 0) {
    fprintf(stderr, "global_scatter: %s\n", dist_errbuf_msg(&eb));
    return -1;
  }
  return 0;
}

static int write_npy(const char *dir, const char *name, int rank, dist_dtype dt,
                     const void *data, int64_t rows, int64_t width) {
  char path[4096];
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_shape s = {2, {rows, width}};
  snprintf(path, sizeof path, "%s/%s_r%d.npy", dir, name, rank);
  if (dist_npy_write(path, dt, &s, data, &eb) != 0) {
    fprintf(stderr, "global_scatter: %s\n", dist_errbuf_msg(&eb));
    return -1;
  }
  return 0;
}

typedef struct case_meta {
  int W, E;
  int64_t d_model;
  dist_dtype dt;
} case_meta;

static int read_meta(const char *dir, case_meta *m) {
  char path[4096];
  json_error_t err;
  snprintf(path, sizeof path, "%s/meta.json", dir);
  json_t *j = json_load_file(path, 0, &err);
  if (!j) {
    fprintf(stderr, "global_scatter: %s: %s\n", path, err.text);
    return -1;
  }
  m->W = (int)json_integer_value(json_object_get(j, "W"));
  m->E = (int)json_integer_value(json_object_get(j, "E"));
  m->d_model = json_integer_value(json_object_get(j, "d_model"));
  const char *dt = json_string_value(json_object_get(j, "dtype"));
  m->dt = dt ? dist_dtype_parse(dt) : DIST_DTYPE_INVALID;
  json_decref(j);
  if (m->W < 1 || m->E < 1 || m->d_model < 1 || m->dt == DIST_DTYPE_INVALID) {
    fprintf(stderr, "global_scatter: %s lacks W, E, d_model or a known dtype\n", path);
    return -1;
  }
  return 0;
}

static int run_case(dist_client *c, const char *dir, const char *outdir) {
  int rank = dist_rank(c), rc = 1;
  case_meta m;
  npy x = {0}, lc = {0}, gc = {0}, gin = {0};
  void *out[1] = {NULL}, *gout[1] = {NULL}, *grad[1] = {NULL}, *dout = NULL;
  int64_t rows[1] = {0}, grows[1] = {0}, drows[1] = {0};
  if (read_meta(dir, &m) != 0) return 1;
  if (m.W != dist_world_size(c)) {
    fprintf(stderr, "global_scatter: the case has W=%d, run it with -n %d\n", m.W, m.W);
    return 1;
  }
  if (read_npy(dir, "x", rank, &x) || read_npy(dir, "local_count", rank, &lc) ||
      read_npy(dir, "global_count", rank, &gc) || read_npy(dir, "gather_in", rank, &gin))
    goto out;
  if (mkdir(outdir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "global_scatter: cannot create %s: %s\n", outdir, strerror(errno));
    goto out;
  }
  const int64_t *lcs[1] = {lc.data}, *gcs[1] = {gc.data};
  /* Paddle's count exchange must give the case's global_count. */
  int64_t *derived = calloc((size_t)m.W * (size_t)m.E + 1, sizeof *derived);
  int64_t *dgc[1] = {derived};
  int same = dist_count_global(c, lcs, m.E, NULL, 0, dgc) == 0 &&
             gc.nbytes == (size_t)m.W * (size_t)m.E * sizeof *derived &&
             memcmp(derived, gc.data, gc.nbytes) == 0;
  free(derived);
  if (!same) {
    fprintf(stderr, "global_scatter: count exchange disagrees with global_count_r%d.npy%s%s\n",
            rank, dist_errcode(c) ? ": " : "", dist_errmsg(c));
    goto out;
  }
  const void *xs[1] = {x.data}, *gins[1] = {gin.data};
  int64_t xr[1] = {x.shape.dims[0]}, gr[1] = {gin.shape.dims[0]};
  if (dist_global_scatter(c, xs, xr, m.dt, m.d_model, lcs, gcs, m.E, NULL, 0, NULL,
                          out, rows) != 0) {
    fail(c, "global_scatter");
    goto out;
  }
  if (dist_global_gather(c, gins, gr, m.dt, m.d_model, lcs, gcs, m.E, NULL, 0, NULL,
                         gout, grows) != 0) {
    fail(c, "global_gather");
    goto out;
  }
  if (write_npy(outdir, "scatter_out", rank, m.dt, out[0], rows[0], m.d_model) ||
      write_npy(outdir, "gather_out", rank, m.dt, gout[0], grows[0], m.d_model))
    goto out;
  if (dist_dtype_is_float(m.dt)) {
    dout = doubled(out[0], m.dt, (size_t)(rows[0] * m.d_model));
    const void *dys[1] = {dout};
    if (dist_global_gather(c, dys, rows, m.dt, m.d_model, lcs, gcs, m.E, NULL, 0,
                           NULL, grad, drows) != 0) {
      fail(c, "global_gather (backward)");
      goto out;
    }
    if (write_npy(outdir, "grad_x", rank, m.dt, grad[0], drows[0], m.d_model)) goto out;
  }
  rc = 0;
out:
  free(x.data), free(lc.data), free(gc.data), free(gin.data);
  free(out[0]), free(gout[0]), free(grad[0]), free(dout);
  return rc;
}

int main(int argc, char **argv) {
  const char *case_dir = NULL, *out_dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) case_dir = argv[++i];
    else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) out_dir = argv[++i];
    else {
      fprintf(stderr, "usage: global_scatter [--case DIR --out OUT]\n");
      return 2;
    }
  }
  if (!case_dir != !out_dir) {
    fprintf(stderr, "global_scatter: --case and --out go together\n");
    return 2;
  }
  dist_client *c = NULL;
  if (dist_init_from_env(&c) != 0) {
    fprintf(stderr, "global_scatter: %s\n", dist_last_connect_error());
    return 1;
  }
  int rc = case_dir ? run_case(c, case_dir, out_dir) : run_seed(c);
  dist_close(c);
  return rc;
}
