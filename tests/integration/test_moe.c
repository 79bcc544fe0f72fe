/* global_scatter / global_gather between real daemons: seed 003, hundreds
 * of generated cases (global_scatter_ref.py) in both client modes, every
 * dtype, disagreeing counts, a peer killed mid-scatter and concurrent
 * exchanges on different groups. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"
#include "moe.pb-c.h"

TestSuite(moe, .fini = stop_cluster);

/* ---------------------------------------------------------------- cases */

#define MAXW 4

typedef struct arr {
  dist_dtype dt;
  dist_shape shape;
  void *data;
  size_t nbytes;
} arr;

typedef struct moe_case {
  char name[128];
  int W, E;
  int64_t d;
  dist_dtype dt;
  arr x[MAXW], lc[MAXW], gc[MAXW], scatter_out[MAXW], gather_in[MAXW],
      gather_out[MAXW], grad_x[MAXW];
  int has_grad;
} moe_case;

/* Writes n cases (npy layout) under a new temp dir; extra: more gen flags. */
static void gen_cases(char *dir, size_t len, int n, int seed, const char *extra) {
  snprintf(dir, len, "/tmp/distd-moe-XXXXXX");
  cr_assert(mkdtemp(dir));
  char cmd[2048], *err = NULL;
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s gen --out %s --n %d --seed %d "
           "--format npy %s", harness_reference_script(), dir, n, seed, extra ? extra : "");
  int rc = harness_run(cmd, NULL, &err, 120);
  cr_assert_eq(rc, 0, "generator failed: %s", err ? err : "");
  free(err);
}

static void rm_rf(const char *dir) {
  harness_remove_dir(dir);
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Case directory names, sorted; free each and the array. */
static char **list_cases(const char *dir, int *n) {
  DIR *d = opendir(dir);
  cr_assert(d, "cannot open %s", dir);
  char **names = NULL;
  *n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, "case_", 5) == 0) {
      names = realloc(names, sizeof *names * (size_t)(*n + 1));
      names[(*n)++] = strdup(e->d_name);
    }
  closedir(d);
  qsort(names, (size_t)*n, sizeof *names, by_name);
  return names;
}

static int load_arr(const char *dir, const char *key, int r, arr *a) {
  char path[1024];
  dist_errbuf eb = DIST_ERRBUF_INIT;
  snprintf(path, sizeof path, "%s/%s_r%d.npy", dir, key, r);
  if (access(path, R_OK) != 0) return -1;
  a->dt = DIST_DTYPE_INVALID;
  int rc = dist_npy_read(path, &a->dt, &a->shape, &a->data, &a->nbytes, &eb);
  cr_assert_eq(rc, 0, "%s: %s", path, dist_errbuf_msg(&eb));
  return 0;
}

static void load_case(const char *dir, const char *name, moe_case *c) {
  char cdir[1024], meta[1100];
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "%s", name);
  snprintf(cdir, sizeof cdir, "%s/%s", dir, name);
  snprintf(meta, sizeof meta, "%s/meta.json", cdir);
  json_error_t je;
  json_t *j = json_load_file(meta, 0, &je);
  cr_assert(j, "%s: %s", meta, je.text);
  c->W = (int)json_integer_value(json_object_get(j, "W"));
  c->E = (int)json_integer_value(json_object_get(j, "E"));
  c->d = json_integer_value(json_object_get(j, "d_model"));
  c->dt = dist_dtype_parse(json_string_value(json_object_get(j, "dtype")));
  json_decref(j);
  cr_assert(c->W >= 1 && c->W <= MAXW && c->dt != DIST_DTYPE_INVALID);
  c->has_grad = 1;
  for (int r = 0; r < c->W; r++) {
    load_arr(cdir, "x", r, &c->x[r]);
    load_arr(cdir, "local_count", r, &c->lc[r]);
    load_arr(cdir, "global_count", r, &c->gc[r]);
    load_arr(cdir, "scatter_out", r, &c->scatter_out[r]);
    load_arr(cdir, "gather_in", r, &c->gather_in[r]);
    load_arr(cdir, "gather_out", r, &c->gather_out[r]);
    if (load_arr(cdir, "grad_x", r, &c->grad_x[r]) != 0) c->has_grad = 0;
  }
}

static void free_case(moe_case *c) {
  for (int r = 0; r < MAXW; r++) {
    free(c->x[r].data), free(c->lc[r].data), free(c->gc[r].data);
    free(c->scatter_out[r].data), free(c->gather_in[r].data);
    free(c->gather_out[r].data), free(c->grad_x[r].data);
  }
}

static void expect_rows(const char *what, const moe_case *c, int r, void *got,
                        int64_t got_rows, const arr *want) {
  size_t row_bytes = (size_t)c->d * dist_dtype_size(c->dt);
  cr_assert_eq(got_rows, want->shape.dims[0], "%s %s rank %d: %lld rows, want %lld",
               c->name, what, r, (long long)got_rows, (long long)want->shape.dims[0]);
  cr_assert(want->nbytes == 0 || memcmp(got, want->data, (size_t)got_rows * row_bytes) == 0,
            "%s %s rank %d: rows differ", c->name, what, r);
}

static void *doubled(const void *x, dist_dtype dt, size_t n) {
  void *y = malloc(n * dist_dtype_size(dt) + 1);
  for (size_t i = 0; i < n; i++) dist_elem_set(y, dt, i, 2 * dist_elem_get(x, dt, i));
  return y;
}

static void free_all(void **v, int n) {
  for (int i = 0; i < n; i++) free(v[i]), v[i] = NULL;
}

/* One case through a single client over group (W ranks): scatter, gather,
 * round trip and the scatter's gradient. dt overrides the case's dtype
 * when the element size agrees (bfloat16 for float16 cases). */
static void run_case_single(dist_client *cl, const moe_case *c, const int *group,
                            dist_dtype dt) {
  int W = c->W;
  moe_case k = *c;
  k.dt = dt;
  const void *xs[MAXW], *gins[MAXW];
  const int64_t *lcs[MAXW], *gcs[MAXW];
  int64_t xrows[MAXW], grows[MAXW], rows[MAXW], back_rows[MAXW];
  void *out[MAXW] = {0}, *gout[MAXW] = {0}, *back[MAXW] = {0}, *dy[MAXW] = {0};
  for (int r = 0; r < W; r++) {
    xs[r] = c->x[r].data, xrows[r] = c->x[r].shape.dims[0];
    gins[r] = c->gather_in[r].data, grows[r] = c->gather_in[r].shape.dims[0];
    lcs[r] = c->lc[r].data, gcs[r] = c->gc[r].data;
  }
  int rc = dist_global_scatter(cl, xs, xrows, dt, c->d, lcs, gcs, c->E, group, W,
                               NULL, out, rows);
  cr_assert_eq(rc, 0, "%s scatter: %s", c->name, dist_errmsg(cl));
  for (int r = 0; r < W; r++) expect_rows("scatter", &k, r, out[r], rows[r], &c->scatter_out[r]);
  rc = dist_global_gather(cl, gins, grows, dt, c->d, lcs, gcs, c->E, group, W, NULL,
                          gout, back_rows);
  cr_assert_eq(rc, 0, "%s gather: %s", c->name, dist_errmsg(cl));
  for (int r = 0; r < W; r++) expect_rows("gather", &k, r, gout[r], back_rows[r], &c->gather_out[r]);
  free_all(gout, W);
  rc = dist_global_gather(cl, (const void *const *)out, rows, dt, c->d, lcs, gcs, c->E,
                          group, W, NULL, back, back_rows);
  cr_assert_eq(rc, 0, "%s round trip: %s", c->name, dist_errmsg(cl));
  for (int r = 0; r < W; r++) expect_rows("round trip", &k, r, back[r], back_rows[r], &c->x[r]);
  if (c->has_grad && dt == c->dt) {
    for (int r = 0; r < W; r++) dy[r] = doubled(out[r], dt, (size_t)(rows[r] * c->d));
    free_all(back, W);
    rc = dist_global_gather(cl, (const void *const *)dy, rows, dt, c->d, lcs, gcs, c->E,
                            group, W, NULL, back, back_rows);
    cr_assert_eq(rc, 0, "%s grad: %s", c->name, dist_errmsg(cl));
    for (int r = 0; r < W; r++) expect_rows("grad", &k, r, back[r], back_rows[r], &c->grad_x[r]);
  }
  free_all(out, W), free_all(back, W), free_all(dy, W);
}

/* ---------------------------------------------------------------- seed 003 */

static const float seed_x[5][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
static const int64_t seed_counts[2][4] = {{2, 1, 1, 1}, {1, 1, 2, 1}};
static const float seed_out[2][5][2] = {{{1, 2}, {3, 4}, {1, 2}, {5, 6}, {3, 4}},
                                        {{7, 8}, {5, 6}, {7, 8}, {9, 10}, {9, 10}}};

Test(moe, seed_003_scatter_and_gradient_in_a_single_client, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  const void *xs[2] = {seed_x, seed_x};
  const int64_t *lcs[2] = {seed_counts[0], seed_counts[1]};
  void *out[2] = {0}, *grad[2] = {0}, *dy[2] = {0};
  int64_t rows[2], grows[2];
  cr_assert_eq(dist_global_scatter(c, xs, NULL, DIST_FLOAT32, 2, lcs, lcs, 2, NULL, 0,
                                   NULL, out, rows), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(rows[r], 5);
    cr_assert(memcmp(out[r], seed_out[r], sizeof seed_out[r]) == 0, "rank %d output", r);
    dy[r] = doubled(out[r], DIST_FLOAT32, 10);
  }
  cr_assert_eq(dist_global_gather(c, (const void *const *)dy, NULL, DIST_FLOAT32, 2, lcs,
                                  lcs, 2, NULL, 0, NULL, grad, grows), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 10; i++)
      cr_assert_eq(((float *)grad[r])[i], 2 * (float)(i + 1), "rank %d grad[%d]", r, i);
  free_all(out, 2), free_all(grad, 2), free_all(dy, 2);
  dist_close(c);
  stop_cluster();
}

Test(moe, seed_003_via_daemon_held_tensors, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  const void *xs[2] = {seed_x, seed_x};
  const int64_t *lcs[2] = {seed_counts[0], seed_counts[1]};
  /* The experts' input stays in the daemons ... */
  dist_moe_opts keep = {NULL, "experts_in", 0, 0};
  int64_t rows[2];
  cr_assert_eq(dist_global_scatter(c, xs, NULL, DIST_FLOAT32, 2, lcs, lcs, 2, NULL, 0,
                                   &keep, NULL, rows), 0, "%s", dist_errmsg(c));
  cr_assert_eq(rows[0], 5);
  for (int r = 0; r < 2; r++) {
    dist_tensor *t = NULL;
    cr_assert_eq(dist_tensor_open(c, "experts_in", &t), 0, "%s", dist_errmsg(c));
    void *piece = NULL;
    size_t nbytes = 0;
    int64_t shape[DIST_MAX_DIMS];
    /* dist_tensor_open sees one daemon's mesh; read each daemon directly. */
    dist_tensor_free(t);
    dist_client *one = harness_client_rank(&cluster, r, 10000);
    cr_assert_eq(dist_tensor_open(one, "experts_in", &t), 0, "%s", dist_errmsg(one));
    /* Addressed by its daemon's rank, not the client's position 0. */
    cr_assert_eq(dist_dtensor_to_local(one, t, r, &piece, &nbytes, shape), 0, "%s",
                 dist_errmsg(one));
    cr_assert_eq(nbytes, sizeof seed_out[r]);
    cr_assert(memcmp(piece, seed_out[r], nbytes) == 0, "rank %d held rows", r);
    free(piece);
    dist_tensor_free(t);
    dist_close(one);
  }
  /* ... and their output is gathered back from a held tensor. */
  dist_moe_opts from = {"experts_in", NULL, 0, 0};
  void *back[2] = {0};
  int64_t brows[2];
  cr_assert_eq(dist_global_gather(c, NULL, NULL, DIST_FLOAT32, 2, lcs, lcs, 2, NULL, 0,
                                  &from, back, brows), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++)
    cr_assert(memcmp(back[r], seed_x, sizeof seed_x) == 0, "rank %d round trip", r);
  free_all(back, 2);
  /* The name is taken now. */
  cr_assert_eq(dist_global_scatter(c, xs, NULL, DIST_FLOAT32, 2, lcs, lcs, 2, NULL, 0,
                                   &keep, NULL, NULL), DIST_EEXIST);
  dist_close(c);
  stop_cluster();
}

/* ---------------------------------------------------------------- generated cases */

Test(moe, generated_cases_single_client_every_dtype, .timeout = 280) {
  char dir[64];
  gen_cases(dir, sizeof dir, 300, 3, NULL);
  dist_client *c = harness_start_with_client(&cluster, 4, NULL);
  int n = 0, seen[10] = {0};
  char **names = list_cases(dir, &n);
  cr_assert_eq(n, 300);
  for (int i = 0; i < n; i++) {
    moe_case k;
    load_case(dir, names[i], &k);
    int group[MAXW];
    for (int r = 0; r < k.W; r++) group[r] = (i + r) % 4; /* rotating groups */
    run_case_single(c, &k, group, k.dt);
    if (k.dt == DIST_FLOAT16) run_case_single(c, &k, group, DIST_BFLOAT16);
    seen[k.dt]++;
    free_case(&k);
    free(names[i]);
  }
  free(names);
  cr_assert(seen[DIST_FLOAT16] && seen[DIST_FLOAT32] && seen[DIST_FLOAT64] &&
            seen[DIST_INT32] && seen[DIST_INT64], "not every dtype was generated");
  dist_close(c);
  stop_cluster();
  rm_rf(dir);
}

Test(moe, generated_cases_every_world_size_and_dtype, .timeout = 280) {
  static const char *dts[] = {"float32", "float64", "int32", "int64", "float16"};
  dist_client *c = harness_start_with_client(&cluster, 4, NULL);
  for (int W = 1; W <= 4; W++)
    for (int t = 0; t < 5; t++) {
      char dir[64], extra[128];
      snprintf(extra, sizeof extra, "--W %d --dtype %s", W, dts[t]);
      gen_cases(dir, sizeof dir, 6, 100 + W * 10 + t, extra);
      int n = 0;
      char **names = list_cases(dir, &n);
      for (int i = 0; i < n; i++) {
        moe_case k;
        load_case(dir, names[i], &k);
        int group[MAXW];
        for (int r = 0; r < W; r++) group[r] = W - 1 - r; /* reversed order */
        run_case_single(c, &k, group, k.dt);
        free_case(&k);
        free(names[i]);
      }
      free(names);
      rm_rf(dir);
    }
  dist_close(c);
  stop_cluster();
}

/* SPMD: one trainer per rank, started by distctl launch on a harness
 * cluster, running the example's --case mode; outputs compared here. */
static void run_cases_spmd(int W, int ncases, int seed) {
  char dir[64], extra[32];
  snprintf(extra, sizeof extra, "--W %d", W);
  gen_cases(dir, sizeof dir, ncases, seed, extra);
  harness_start(&cluster, W, NULL);
  int n = 0;
  char **names = list_cases(dir, &n);
  const char *root = getenv("DIST_BUILD_ROOT");
  for (int i = 0; i < n; i++) {
    char cmd[4096], *out = NULL, *err = NULL, outdir[1200], logdir[1200];
    snprintf(outdir, sizeof outdir, "%s/out_%s", dir, names[i]);
    snprintf(logdir, sizeof logdir, "%s/log_%s", dir, names[i]);
    snprintf(cmd, sizeof cmd, "%s --cluster %s launch -n %d --log-dir %s -- "
             "%s/examples/global_scatter --case %s/%s --out %s", harness_distctl(),
             cluster.cluster_file, W, logdir, root, dir, names[i], outdir);
    int rc = harness_run(cmd, &out, &err, 60);
    cr_assert_eq(rc, 0, "%s: exit %d\n%s\n%s", names[i], rc, out ? out : "", err ? err : "");
    free(out), free(err);
    moe_case k;
    load_case(dir, names[i], &k);
    for (int r = 0; r < W; r++) {
      arr got = {0};
      cr_assert_eq(load_arr(outdir, "scatter_out", r, &got), 0);
      expect_rows("spmd scatter", &k, r, got.data, got.shape.dims[0], &k.scatter_out[r]);
      free(got.data);
      cr_assert_eq(load_arr(outdir, "gather_out", r, &got), 0);
      expect_rows("spmd gather", &k, r, got.data, got.shape.dims[0], &k.gather_out[r]);
      free(got.data);
      if (k.has_grad) {
        cr_assert_eq(load_arr(outdir, "grad_x", r, &got), 0, "%s: no grad_x", names[i]);
        expect_rows("spmd grad", &k, r, got.data, got.shape.dims[0], &k.grad_x[r]);
        free(got.data);
      }
    }
    free_case(&k);
    free(names[i]);
  }
  free(names);
  stop_cluster();
  rm_rf(dir);
}

Test(moe, generated_cases_spmd_two_ranks, .timeout = 280) { run_cases_spmd(2, 24, 5); }
Test(moe, generated_cases_spmd_three_ranks, .timeout = 280) { run_cases_spmd(3, 16, 6); }

/* ---------------------------------------------------------------- counts */

Test(moe, count_global_is_the_transpose_of_local_counts, .timeout = 60) {
  /* Single client: derived in the library from every rank's counts (the
   * SPMD all-to-all runs in every generated_cases_spmd case). */
  int64_t lc[3][6] = {{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}, {0, 0, 1, 0, 2, 0}};
  int64_t gc[3][6];
  const int64_t *lcs[3] = {lc[0], lc[1], lc[2]};
  int64_t *gcs[3] = {gc[0], gc[1], gc[2]};
  dist_client *c = harness_start_with_client(&cluster, 3, NULL);
  cr_assert_eq(dist_count_global(c, lcs, 2, NULL, 0, gcs), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 3; r++)
    for (int s = 0; s < 3; s++)
      for (int e = 0; e < 2; e++) cr_assert_eq(gc[r][s * 2 + e], lc[s][r * 2 + e]);
  dist_close(c);
  stop_cluster();
}

/* An SPMD trainer of [0,1] whose global_scatter and count_global name
 * `experts` experts (0: libdist refuses both), each timed, then an
 * all-reduce of both trainers, which meets only when both took the op ids
 * of the refused calls. */
typedef struct refusing {
  dist_client *c;
  int rank, experts, reduced;
  double took[2];
  char msg[2][512];
} refusing;

static void *scatter_and_count(void *arg) {
  refusing *t = arg;
  float x[4] = {1, 2, 3, 4};
  int64_t lc[2] = {1, 1}, gc[2] = {1, 1}, got[2];
  const void *xs[1] = {x};
  const int64_t *lcs[1] = {lc}, *gcs[1] = {gc};
  int64_t *gots[1] = {got}, rows[1];
  void *out[1] = {NULL};
  double t0 = harness_now_s();
  dist_global_scatter(t->c, xs, NULL, DIST_FLOAT32, 2, lcs, gcs, t->experts, NULL, 0, NULL,
                      out, rows);
  t->took[0] = harness_now_s() - t0;
  snprintf(t->msg[0], sizeof t->msg[0], "%s", dist_errmsg(t->c));
  free(out[0]);
  t0 = harness_now_s();
  dist_count_global(t->c, lcs, t->experts, NULL, 0, gots);
  t->took[1] = harness_now_s() - t0;
  snprintf(t->msg[1], sizeof t->msg[1], "%s", dist_errmsg(t->c));
  int32_t v = 1;
  t->reduced = dist_all_reduce(t->c, &v, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0) == 0 && v == 2;
  return NULL;
}

/* Trainer 0 refuses; trainer 1 has a deadline of 10 s, trainer 0 30 s, for
 * it waits in its all-reduce for trainer 1's calls to end. */
static void run_refusing_pair(harness *h, refusing *t) {
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    t[r] = (refusing){.c = harness_spmd_client(h, r, "moe-refused"), .rank = r, .experts = r};
    t[r].c->timeout_ms = r ? 10000 : 30000;
  }
  for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, scatter_and_count, &t[r]);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
}

/* Before, trainer 1 waited for rank 0's part until its deadline (5 s of
 * silence), and the trainers' op ids were apart from then on. */
Test(moe, an_exchange_one_spmd_trainer_refuses_fails_the_other_at_once, .timeout = 90) {
  harness_start(&cluster, 2, NULL);
  refusing t[2];
  run_refusing_pair(&cluster, t);
  for (int k = 0; k < 2; k++) {
    cr_expect(strstr(t[0].msg[k], "n_experts >= 1"), "trainer 0: %s", t[0].msg[k]);
    cr_expect_lt(t[1].took[k], 3.0, "call %d: trainer 1 waited %.1f s: %s", k, t[1].took[k],
                 t[1].msg[k]);
    cr_expect(strstr(t[1].msg[k], "rank 0 aborted op") && strstr(t[1].msg[k], "n_experts >= 1"),
              "call %d: trainer 1: %s", k, t[1].msg[k]);
  }
  for (int r = 0; r < 2; r++) {
    cr_expect(t[r].reduced, "trainer %d: the all-reduce after the refused calls failed", r);
    dist_close(t[r].c);
  }
  stop_cluster();
}

/* Raw calls to each daemon, so every rank's own answer can be checked. */
static void call_each(dist_client *c, const char *method, int W,
                      Dist__V1__GlobalExchangeRequest *rqs, dist_call *calls) {
  for (int k = 0; k < W; k++) {
    calls[k] = (dist_call){.target = k, .request = &rqs[k].base};
  }
  dist_call_many(c, method, &dist__v1__global_exchange_reply__descriptor, calls, W);
}

static void fill_raw(Dist__V1__GlobalExchangeRequest *rq, uint64_t op_id, int64_t *lc,
                     int64_t *gc, size_t n, void *x, size_t xbytes, uint64_t width) {
  dist__v1__global_exchange_request__init(rq);
  rq->op_id = op_id;
  rq->dtype = DIST__V1__DTYPE__FLOAT32;
  rq->row_width = width;
  rq->local_count = lc, rq->n_local_count = n;
  rq->global_count = gc, rq->n_global_count = n;
  rq->x.data = x, rq->x.len = xbytes;
}

static void disagreeing_counts(const char *method, int gather) {
  dist_client *c = harness_start_with_client(&cluster, 3, NULL);
  /* E = 1: rank s sends lc[s][r] rows to rank r. Rank 0's global_count says
   * 2 rows from rank 1; rank 1 sends 3. */
  int64_t lc[3][3] = {{1, 1, 1}, {3, 1, 1}, {1, 1, 1}};
  int64_t gc[3][3] = {{1, 2, 1}, {1, 1, 1}, {1, 1, 1}};
  float x[8 * 4] = {0};
  Dist__V1__GlobalExchangeRequest rqs[3];
  dist_call calls[3];
  uint64_t op = 0x77000 + (uint64_t)gather;
  for (int k = 0; k < 3; k++) {
    int64_t rows = 0;
    for (int i = 0; i < 3; i++) rows += gather ? gc[k][i] : lc[k][i];
    fill_raw(&rqs[k], op, lc[k], gc[k], 3, x, (size_t)rows * 4 * sizeof(float), 4);
  }
  double t0 = harness_now_s();
  call_each(c, method, 3, rqs, calls);
  cr_assert(harness_now_s() - t0 < 10, "took %.1f s", harness_now_s() - t0);
  const char *want = gather
      ? "global_count mismatch: rank 0 sends 2 rows of its expert 0 back to rank 1, "
        "rank 1 expects 3"
      : "global_count mismatch: rank 1 sends 3 rows for expert 0 of rank 0, rank 0 expects 2";
  for (int k = 0; k < 3; k++) {
    cr_assert_neq(calls[k].err.code, 0, "rank %d succeeded", k);
    cr_assert(strstr(calls[k].err.msg, want), "rank %d: %s", k, calls[k].err.msg);
    cr_log_info("rank %d: %s", k, calls[k].err.msg);
  }
  dist_calls_free(calls, 3);
  dist_close(c);
  stop_cluster();
}

Test(moe, disagreeing_scatter_counts_fail_every_rank_naming_both, .timeout = 90) {
  disagreeing_counts("/dist.v1.Moe/GlobalScatter", 0);
}

Test(moe, disagreeing_gather_counts_fail_every_rank_naming_both, .timeout = 90) {
  disagreeing_counts("/dist.v1.Moe/GlobalGather", 1);
}

Test(moe, malformed_counts_are_rejected_without_a_hang, .timeout = 90) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  int64_t lc[4] = {1, 1, 1, 1}, bad_len[3] = {1, 1, 1};
  float x[8] = {0};
  Dist__V1__GlobalExchangeRequest rqs[2];
  dist_call calls[2];
  /* Rank 1's counts have 3 entries for W = 2. */
  fill_raw(&rqs[0], 0x88001, lc, lc, 4, x, 4 * 2 * sizeof(float), 2);
  fill_raw(&rqs[1], 0x88001, bad_len, bad_len, 3, x, 3 * 2 * sizeof(float), 2);
  double t0 = harness_now_s();
  call_each(c, "/dist.v1.Moe/GlobalScatter", 2, rqs, calls);
  cr_assert(harness_now_s() - t0 < 10, "took %.1f s", harness_now_s() - t0);
  cr_assert(strstr(calls[1].err.msg, "counts have 3 entries"), "%s", calls[1].err.msg);
  cr_assert(strstr(calls[0].err.msg, "rank 1") && strstr(calls[0].err.msg, "counts have 3"),
            "rank 0: %s", calls[0].err.msg);
  dist_calls_free(calls, 2);
  /* Rows of x that disagree with sum(local_count). */
  fill_raw(&rqs[0], 0x88002, lc, lc, 4, x, 3 * 2 * sizeof(float), 2);
  int rc = dist_call_one(c, 0, "/dist.v1.Moe/GlobalScatter", &rqs[0].base,
                         &dist__v1__global_exchange_reply__descriptor, &calls[0].reply);
  cr_assert_eq(rc, DIST_EINVAL);
  cr_assert(strstr(dist_errmsg(c), "x has 3 rows but sum(local_count) = 4"), "%s",
            dist_errmsg(c));
  dist_close(c);
  stop_cluster();
}

/* ---------------------------------------------------------------- failures, concurrency */

typedef struct killer {
  harness *h;
  int rank, delay_ms;
} killer;

static void *kill_later(void *arg) {
  killer *k = arg;
  usleep((useconds_t)k->delay_ms * 1000);
  harness_kill(k->h, k->rank, SIGKILL);
  return NULL;
}

Test(moe, peer_killed_mid_scatter_fails_naming_it, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 3, NULL);
  /* Ranks 0 and 1 start a scatter with rank 2, whose part never comes:
   * they wait on it until it is killed. */
  enum { ROWS = 1 << 14, WIDTH = 64 };
  int64_t lc[3] = {ROWS, ROWS, ROWS};
  float *x = calloc((size_t)3 * ROWS * WIDTH, sizeof(float));
  Dist__V1__GlobalExchangeRequest rqs[2];
  dist_call calls[2];
  for (int k = 0; k < 2; k++)
    fill_raw(&rqs[k], 0x99001, lc, lc, 3, x, (size_t)3 * ROWS * WIDTH * sizeof(float), WIDTH);
  killer k = {&cluster, 2, 500};
  pthread_t t;
  pthread_create(&t, NULL, kill_later, &k);
  double t0 = harness_now_s();
  call_each(c, "/dist.v1.Moe/GlobalScatter", 2, rqs, calls);
  double took = harness_now_s() - t0;
  pthread_join(t, NULL);
  cr_assert(took < 15, "took %.1f s", took);
  for (int r = 0; r < 2; r++) {
    cr_assert_neq(calls[r].err.code, 0, "rank %d succeeded", r);
    cr_assert(strstr(calls[r].err.msg, "rank 2"), "rank %d: %s", r, calls[r].err.msg);
    cr_log_info("rank %d after %.2f s: %s", r, took, calls[r].err.msg);
  }
  dist_calls_free(calls, 2);
  free(x);
  dist_close(c);
  stop_cluster();
}

typedef struct group_job {
  harness *h;
  int group[3], size, iterations, failed;
  char msg[600];
} group_job;

/* Repeated seed-like scatters and round trips on one group, own client. */
static void *run_group(void *arg) {
  group_job *j = arg;
  dist_client *c = harness_client(j->h);
  int W = j->size, E = 2;
  int64_t lc[3][6], gc[3][6];
  float *xs[3];
  for (int s = 0; s < W; s++) {
    int64_t rows = 0;
    for (int i = 0; i < W * E; i++) rows += lc[s][i] = (s + i + j->group[0]) % 4;
    xs[s] = malloc((size_t)(rows ? rows : 1) * 3 * sizeof(float));
    for (int64_t i = 0; i < rows * 3; i++) xs[s][i] = (float)(s * 1000 + i);
  }
  const int64_t *lcs[3] = {lc[0], lc[1], lc[2]};
  int64_t *gcw[3] = {gc[0], gc[1], gc[2]};
  const int64_t *gcs[3] = {gc[0], gc[1], gc[2]};
  if (dist_count_global(c, lcs, E, j->group, W, gcw) != 0) goto fail;
  for (int it = 0; it < j->iterations; it++) {
    void *out[3] = {0}, *back[3] = {0};
    int64_t rows[3], brows[3];
    if (dist_global_scatter(c, (const void *const *)xs, NULL, DIST_FLOAT32, 3, lcs, gcs,
                            E, j->group, W, NULL, out, rows) != 0 ||
        dist_global_gather(c, (const void *const *)out, rows, DIST_FLOAT32, 3, lcs, gcs,
                           E, j->group, W, NULL, back, brows) != 0) {
      free_all(out, W), free_all(back, W);
      goto fail;
    }
    for (int s = 0; s < W; s++)
      for (int64_t i = 0; i < brows[s] * 3; i++)
        if (((float *)back[s])[i] != xs[s][i]) {
          snprintf(j->msg, sizeof j->msg, "round trip differs on member %d", s);
          j->failed = 1;
        }
    free_all(out, W), free_all(back, W);
  }
  goto out;
fail:
  j->failed = 1;
  snprintf(j->msg, sizeof j->msg, "%s", dist_errmsg(c));
out:
  for (int s = 0; s < W; s++) free(xs[s]);
  dist_close(c);
  return NULL;
}

Test(moe, concurrent_scatters_on_different_groups, .timeout = 120) {
  harness_start(&cluster, 4, NULL);
  group_job jobs[3] = {
      {&cluster, {0, 1, 0}, 2, 30, 0, ""},
      {&cluster, {3, 2, 0}, 2, 30, 0, ""},
      {&cluster, {2, 0, 3}, 3, 30, 0, ""}, /* overlaps both */
  };
  pthread_t t[3];
  for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, run_group, &jobs[i]);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 3; i++) cr_assert_not(jobs[i].failed, "group %d: %s", i, jobs[i].msg);
  stop_cluster();
}

/* ---------------------------------------------------------------- the example */

Test(moe, example_prints_the_seed_values_under_distctl_launch, .timeout = 120) {
  char dir[] = "/tmp/distd-moe-ex-XXXXXX", cmd[2048], *out = NULL, *err = NULL;
  cr_assert(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "cd %s && %s launch -n 2 --log-dir %s/log -- %s/examples/global_scatter",
           dir, harness_distctl(), dir, getenv("DIST_BUILD_ROOT"));
  int rc = harness_run(cmd, &out, &err, 90);
  cr_assert_eq(rc, 0, "exit %d\n%s\n%s", rc, out, err);
  cr_assert(strstr(out, "out for rank 0: [[1, 2], [3, 4], [1, 2], [5, 6], [3, 4]]\n"), "%s", out);
  cr_assert(strstr(out, "grad for rank 0: [[2, 4], [6, 8], [10, 12], [14, 16], [18, 20]]\n"),
            "%s", out);
  free(out), free(err);
  char log1[600];
  snprintf(log1, sizeof log1, "cat %s/log/workerlog.1", dir);
  harness_run(log1, &out, NULL, 10);
  cr_assert(strstr(out, "out for rank 1: [[7, 8], [5, 6], [7, 8], [9, 10], [9, 10]]\n"), "%s", out);
  cr_assert(strstr(out, "grad for rank 1: [[2, 4], [6, 8], [10, 12], [14, 16], [18, 20]]\n"),
            "%s", out);
  free(out);
  rm_rf(dir);
}
