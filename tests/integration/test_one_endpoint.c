/* A client of one endpoint (dist_connect, distctl --endpoint) addresses
 * its daemon by the daemon's own rank in meshes and in the calls that take
 * a rank. It used to address it as rank 0, its position in the client, so
 * that rank 1's daemon alone refused a put onto mesh [1] ("rank 1 is not
 * in the mesh of 'w'") and a client could read there but not put; a mesh
 * naming a rank the client cannot reach is refused naming that rank and
 * the daemon it does reach. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_fixture.h"
#include "tensor.h"

TestSuite(one_endpoint, .fini = stop_cluster, .timeout = 120);

static const float value[6] = {1.5f, -2, 3, 4.25f, 5, -6};
static const int64_t value_shape[2] = {2, 3};

/* The refusal of `what` ("mesh", "group", a call) naming `rank` through a client
 * of rank `own`'s daemon alone, as it must read. */
static void refusal_text(const char *what, int rank, int own, char *buf, size_t len) {
  snprintf(buf, len, "%s names rank %d, but this client only reaches the daemon of "
           "rank %d at 127.0.0.1:%d", what, rank, own, cluster.grpc_port[own]);
}

static void unreached_text(int rank, int own, char *buf, size_t len) {
  refusal_text("mesh", rank, own, buf, len);
}

/* c's last call failed with DIST_EINVAL (rc) refusing what naming rank,
 * which rank own's daemon alone does not reach. */
static void expect_reach_refusal(dist_client *c, int rc, const char *what, int rank, int own) {
  char want[300];
  refusal_text(what, rank, own, want, sizeof want);
  cr_assert_eq(rc, DIST_EINVAL, "%s naming rank %d: %d %s", what, rank, rc, dist_errmsg(c));
  cr_expect(strstr(dist_errmsg(c), want), "want \"%s\" in: %s", want, dist_errmsg(c));
}

/* The whole value of t and rank's piece through c both equal value. */
static void expect_round_trip(dist_client *c, const dist_tensor *t, int rank) {
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &n), 0, "full_tensor: %s", dist_errmsg(c));
  cr_assert(n == sizeof value && memcmp(data, value, n) == 0, "the value changed");
  free(data);
  int64_t shape[DIST_MAX_DIMS];
  cr_assert_eq(dist_dtensor_to_local(c, t, rank, &data, &n, shape), 0,
               "rank %d's piece: %s", rank, dist_errmsg(c));
  cr_assert(n == sizeof value && memcmp(data, value, n) == 0, "rank %d's piece changed", rank);
  free(data);
}

/* Put, read, show and delete on mesh [own] through own's daemon alone. */
static void put_get_show_delete_through(int own) {
  dist_client *one = harness_client_rank(&cluster, own, 10000);
  char mesh[16];
  snprintf(mesh, sizeof mesh, "[%d]", own);
  dist_tensor *t = harness_put(one, "w", DIST_FLOAT32, value, 2, value_shape, mesh,
                               "Replicate()");
  expect_round_trip(one, t, own);
  dist_tensor_piece *pieces = NULL;
  int n = 0;
  cr_assert_eq(dist_tensor_pieces(one, t, &pieces, &n), 0, "show: %s", dist_errmsg(one));
  cr_assert(n == 1 && pieces[0].rank == own && pieces[0].nbytes == sizeof value,
            "show gives %d pieces, the first of rank %d", n, n ? pieces[0].rank : -1);
  free(pieces);
  dist_tensor_free(t);
  cr_assert_eq(harness_open_on(&cluster, own, "w", &t), 0, "not stored on rank %d", own);
  dist_tensor_free(t);
  cr_assert_eq(dist_tensor_delete(one, "w"), 0, "delete: %s", dist_errmsg(one));
  cr_assert_eq(harness_open_on(&cluster, own, "w", &t), DIST_ENOTFOUND, "not deleted");
  dist_close(one);
}

Test(one_endpoint, rank_1s_daemon_alone_puts_reads_shows_and_deletes_on_mesh_1) {
  harness_start(&cluster, 2, NULL);
  put_get_show_delete_through(1);
}

Test(one_endpoint, rank_0s_daemon_alone_works_as_before) {
  harness_start(&cluster, 2, NULL);
  put_get_show_delete_through(0);
}

/* A put through own's daemon onto mesh_text, which names `rank` it cannot
 * reach, is refused naming both, and stores nothing on either daemon. */
static void expect_put_refused(dist_client *one, int own, const char *mesh_text, int rank) {
  dist_tensor *t = NULL;
  char want[200];
  unreached_text(rank, own, want, sizeof want);
  int rc = harness_try_put(one, "v", DIST_FLOAT32, value, 2, value_shape, mesh_text,
                           "Replicate()", &t);
  cr_assert_eq(rc, DIST_EINVAL, "a put onto %s: %d %s", mesh_text, rc, dist_errmsg(one));
  cr_expect(strstr(dist_errmsg(one), want), "%s: %s", mesh_text, dist_errmsg(one));
  for (int r = 0; r < 2; r++)
    cr_expect_eq(harness_open_on(&cluster, r, "v", &t), DIST_ENOTFOUND, "'v' on rank %d", r);
}

Test(one_endpoint, a_mesh_naming_a_rank_it_does_not_reach_is_refused_naming_it) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  expect_put_refused(one, 1, "[0]", 0);
  expect_put_refused(one, 1, "[0,1]", 0);
  dist_client *zero = harness_client_rank(&cluster, 0, 10000);
  expect_put_refused(zero, 0, "[1]", 1);
  /* A piece is read by its daemon's rank, not by the position 0. */
  dist_tensor *t = harness_put(one, "w", DIST_FLOAT32, value, 2, value_shape, "[1]",
                               "Replicate()");
  void *data = NULL;
  size_t n = 0;
  /* In the words of a mesh's refusal (since session 29: "...: rank 0, but"). */
  expect_reach_refusal(one, dist_dtensor_to_local(one, t, 0, &data, &n, NULL),
                       "dist_dtensor_to_local", 0, 1);
  dist_tensor_free(t);
  dist_close(zero);
  dist_close(one);
}

/* distctl --endpoint of rank r's daemon with args; exit status, output
 * and errors. */
static int distctl_at(int r, char **out, char **err, const char *args) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s --endpoint 127.0.0.1:%d %s", harness_distctl(),
           cluster.grpc_port[r], args);
  return harness_run(cmd, out, err, 60);
}

/* distctl_at that must exit 0; its output is dropped. */
static void distctl_ok(int r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void distctl_ok(int r, const char *fmt, ...) {
  char args[1024], *out = NULL, *err = NULL;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  int rc = distctl_at(r, &out, &err, args);
  cr_assert_eq(rc, 0, "%s through rank %d's endpoint: exit %d: %s", args, r, rc,
               err ? err : "");
  free(out);
  free(err);
}

/* The float32 .npy at path holds exactly value. */
static void expect_npy_value(const char *path) {
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape got;
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_npy_read(path, &dt, &got, &data, &n, NULL), 0, "%s", path);
  cr_assert(dt == DIST_FLOAT32 && n == sizeof value && memcmp(data, value, n) == 0,
            "%s does not hold the value put", path);
  free(data);
}

/* tensor put, get (whole and the local piece), show and rm through
 * rank own's daemon alone, on mesh [own]. */
static void distctl_round_trip_through(int own) {
  char in[400], outp[400];
  snprintf(in, sizeof in, "%s/in.npy", cluster.dir);
  snprintf(outp, sizeof outp, "%s/out.npy", cluster.dir);
  dist_shape s = {2, {2, 3}};
  cr_assert_eq(dist_npy_write(in, DIST_FLOAT32, &s, value, NULL), 0);
  distctl_ok(own, "tensor put w %s --mesh \"[%d]\" --placements \"Replicate()\"", in, own);
  distctl_ok(own, "tensor get w -o %s", outp);
  expect_npy_value(outp);
  distctl_ok(own, "tensor get w -o %s --rank %d --local", outp, own);
  expect_npy_value(outp);
  char *out = NULL, *err = NULL;
  cr_assert_eq(distctl_at(own, &out, &err, "tensor show w --json"), 0, "%s", err);
  json_t *j = json_loads(out, 0, NULL);
  json_t *piece = json_array_get(json_object_get(j, "pieces"), 0);
  cr_assert_eq(json_integer_value(json_object_get(piece, "rank")), own, "%s", out);
  json_decref(j);
  free(out);
  free(err);
  distctl_ok(own, "tensor rm w");
  dist_tensor *t = NULL;
  cr_assert_eq(harness_open_on(&cluster, own, "w", &t), DIST_ENOTFOUND, "not deleted");
}

Test(one_endpoint, distctl_through_rank_1s_endpoint_puts_and_gets_on_mesh_1) {
  harness_start(&cluster, 2, NULL);
  distctl_round_trip_through(1);
  char in[400], *out = NULL, *err = NULL, want[200];
  snprintf(in, sizeof in, "%s/in.npy", cluster.dir);
  char args[600];
  snprintf(args, sizeof args, "tensor put v %s --mesh \"[0,1]\" --placements \"Replicate()\"", in);
  int rc = distctl_at(1, &out, &err, args);
  unreached_text(0, 1, want, sizeof want);
  cr_assert_eq(rc, 1, "put onto [0,1]: exit %d: %s", rc, err);
  cr_expect(err && strstr(err, want), "%s", err ? err : "");
  free(out);
  free(err);
}

Test(one_endpoint, distctl_through_rank_0s_endpoint_works_as_before) {
  harness_start(&cluster, 2, NULL);
  distctl_round_trip_through(0);
}

/* ------------------------------------------------- programs, groups, layers */

static dist_mesh *mesh_of(const char *text) {
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_from_string(text, NULL, &m), 0, "%s", text);
  return m;
}

/* A LocalLayer giving sum(x * x), Replicate on the mesh of mesh_text. */
static dist_program *sum_of_squares(const char *mesh_text) {
  dist_program *p = NULL;
  cr_assert_eq(dist_program_new("sum_of_squares", &p), 0);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  dist_program_output(p, dist_op_sum(p, dist_op_mul(p, x, x), NULL, 0, 0));
  dist_mesh *m = mesh_of(mesh_text);
  dist_placement rep = DIST_REPLICATED;
  dist_program_out_dist_attr(p, m, &rep, NULL);
  dist_mesh_free(m);
  return p;
}

/* It was refused: "an out_dist_attr names rank 1, but the client knows 1
 * daemons". */
Test(one_endpoint, rank_1s_daemon_alone_registers_and_calls_a_local_layer_on_mesh_1) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  dist_tensor *x = harness_put(one, "x", DIST_FLOAT32, value, 2, value_shape, "[1]",
                               "Replicate()");
  dist_program *p = sum_of_squares("[1]");
  cr_assert_eq(dist_program_register(one, p), 0, "register: %s", dist_errmsg(one));
  cr_assert(dist_program_nranks(p) == 1 && dist_program_rank_at(p, 0) == 1,
            "registered on %d ranks, the first %d", dist_program_nranks(p),
            dist_program_rank_at(p, 0));
  dist_arg args[1] = {{x, NULL}};
  dist_invocation *inv = NULL;
  dist_tensor *out = NULL;
  cr_assert_eq(dist_local_layer_call(one, p, args, 1, NULL, &inv, &out), 0, "call: %s",
               dist_errmsg(one));
  float want = 0;
  for (int i = 0; i < 6; i++) want += value[i] * value[i]; /* exact in float */
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_full_tensor(one, out, &data, &n), 0, "%s", dist_errmsg(one));
  cr_assert(n == sizeof want && *(float *)data == want, "sum of squares %g, want %g",
            n == sizeof want ? *(float *)data : -1.0, want);
  free(data);
  dist_invocation_free(inv);
  dist_tensor_free(out);
  dist_tensor_free(x);
  dist_program_free(p);
  dist_close(one);
}

Test(one_endpoint, a_program_on_a_mesh_naming_rank_0_is_refused_through_rank_1s_daemon) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  dist_program *p = sum_of_squares("[0,1]");
  expect_reach_refusal(one, dist_program_register(one, p), "an out_dist_attr", 0, 1);
  dist_program_free(p);
  dist_close(one);
}

/* They were refused: "all_reduce needs an SPMD client (dist_init_from_env)". */
Test(one_endpoint, rank_1s_daemon_alone_runs_collectives_over_group_1) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  const int group[1] = {1};
  float buf[6], gathered[6];
  memcpy(buf, value, sizeof buf);
  cr_assert_eq(dist_all_reduce(one, buf, 6, DIST_FLOAT32, DIST_REDUCE_SUM, group, 1), 0,
               "all_reduce: %s", dist_errmsg(one));
  cr_assert(memcmp(buf, value, sizeof buf) == 0, "an all-reduce of one member changed it");
  cr_assert_eq(dist_all_gather(one, value, 6, gathered, DIST_FLOAT32, group, 1), 0,
               "all_gather: %s", dist_errmsg(one));
  cr_assert(memcmp(gathered, value, sizeof gathered) == 0, "an all-gather of one member");
  cr_assert_eq(dist_broadcast(one, buf, 6, DIST_FLOAT32, 1, group, 1), 0, "broadcast: %s",
               dist_errmsg(one));
  /* No group: every rank it reaches, not every rank of the cluster (whose
   * rank 0 nobody speaks for: the daemon would wait for it). */
  cr_assert_eq(dist_all_reduce(one, buf, 6, DIST_FLOAT32, DIST_REDUCE_MAX, NULL, 0), 0,
               "all_reduce over no group: %s", dist_errmsg(one));
  cr_assert(memcmp(buf, value, sizeof buf) == 0, "an all-reduce of one member changed it");
  cr_assert_eq(dist_barrier(one), 0, "barrier: %s", dist_errmsg(one));
  dist_close(one);
}

Test(one_endpoint, a_collective_over_a_group_naming_rank_0_is_refused_through_rank_1s_daemon) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  const int zero[1] = {0}, both[2] = {0, 1};
  float buf[6];
  memcpy(buf, value, sizeof buf);
  expect_reach_refusal(one, dist_all_reduce(one, buf, 6, DIST_FLOAT32, DIST_REDUCE_SUM, zero, 1),
                       "group", 0, 1);
  expect_reach_refusal(one, dist_all_reduce(one, buf, 6, DIST_FLOAT32, DIST_REDUCE_SUM, both, 2),
                       "group", 0, 1);
  dist_close(one);
}

/* Three rows of two, counted for two experts in all: over a group of one
 * rank, 2 rows for its expert 0 and 1 for its expert 1. */
static const float rows_x[3][2] = {{1, 2}, {3, 4}, {5, 6}};
static const int64_t rows_count[2] = {2, 1};

/* Through rank 1's daemon, a global_scatter of rows_x over a group of size
 * 1 or 2 (2 / size experts per rank, the same rows and counts for each
 * member); its return code. */
static int scatter_through_1(dist_client *one, const int *group, int size, void **out,
                             int64_t *rows) {
  const void *xs[2] = {rows_x, rows_x};
  const int64_t *counts[2] = {rows_count, rows_count};
  return dist_global_scatter(one, xs, NULL, DIST_FLOAT32, 2, counts, counts, 2 / size, group,
                             size, NULL, out, rows);
}

/* A global_scatter of rows_x over group (NULL: every rank it reaches)
 * through rank 1's daemon alone gives back rows_x: one source rank, so
 * expert-major is the order the rows came in. */
static void expect_scatter_of_one(dist_client *one, const int *group) {
  void *out[1] = {NULL};
  int64_t rows[1] = {0};
  cr_assert_eq(scatter_through_1(one, group, 1, out, rows), 0, "global_scatter over %s: %s",
               group ? "[1]" : "no group", dist_errmsg(one));
  cr_assert(rows[0] == 3 && memcmp(out[0], rows_x, sizeof rows_x) == 0,
            "%lld rows, not the 3 given", (long long)rows[0]);
  free(out[0]);
}

/* It was refused: "group names rank 1, but the cluster has 1 daemons". */
Test(one_endpoint, rank_1s_daemon_alone_scatters_over_group_1) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  const int group[1] = {1};
  expect_scatter_of_one(one, group);
  dist_close(one);
}

/* No group is the rank the client reaches, its daemon's, even when it is
 * the client's first call (the rank not asked yet). */
Test(one_endpoint, rank_1s_daemon_alone_scatters_over_no_group_as_its_first_call) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  expect_scatter_of_one(one, NULL);
  dist_close(one);
}

Test(one_endpoint, an_exchange_over_a_group_naming_rank_0_is_refused_through_rank_1s_daemon) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  const int both[2] = {0, 1};
  void *out[2] = {NULL, NULL};
  int64_t rows[2] = {0, 0};
  expect_reach_refusal(one, scatter_through_1(one, both, 2, out, rows), "group", 0, 1);
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.d_model = 2, o.d_hidden = 2, o.top_k = 1, o.group = both, o.group_size = 2;
  dist_moe_layer *l = NULL;
  expect_reach_refusal(one, dist_moe_layer_create(one, "moe", &o, &l), "group", 0, 1);
  dist_close(one);
}

/* It was refused: "group names rank 1, but the cluster has 1 daemons". */
Test(one_endpoint, rank_1s_daemon_alone_creates_an_moe_layer_over_group_1) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  const int group[1] = {1};
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.d_model = 2, o.d_hidden = 2, o.top_k = 1, o.seed = 7, o.group = group, o.group_size = 1;
  dist_moe_layer *l = NULL;
  cr_assert_eq(dist_moe_layer_create(one, "moe", &o, &l), 0, "%s", dist_errmsg(one));
  char name[256];
  cr_assert_eq(dist_moe_layer_param_name(l, 0, "w1", name, sizeof name), 0);
  dist_tensor *t = NULL;
  cr_assert_eq(harness_open_on(&cluster, 1, name, &t), 0, "expert 0's w1 is not on rank 1");
  dist_tensor_free(t);
  dist_moe_layer_free(l);
  dist_close(one);
}

/* ------------------------------------------ an expert layer's pass over [1] */

/* Two experts on rank 1 (d_model 2, d_hidden 3, both chosen per token,
 * float64, given weights), and three tokens through them. */
#define MOE_TOKENS 3
static const double moe_x[MOE_TOKENS * 2] = {0.5, -1, 2, 0.25, -1.5, 1};
static const double moe_dy[MOE_TOKENS * 2] = {1, -0.5, 0.25, 2, -1, 0.75};
static const double moe_gate[2 * 2] = {0.3, -0.2, -0.4, 0.6};
static const double moe_w1[2][6] = {{0.1, -0.2, 0.3, 0.4, -0.5, 0.6},
                                    {-0.3, 0.2, 0.1, -0.6, 0.5, 0.4}};
static const double moe_b1[2][3] = {{0.05, -0.1, 0.15}, {0.2, 0, -0.05}};
static const double moe_w2[2][6] = {{0.7, -0.1, 0.2, 0.3, -0.4, 0.5},
                                    {0.25, 0.35, -0.45, 0.55, 0.15, -0.65}};
static const double moe_b2[2][2] = {{0.01, -0.02}, {0.03, 0.04}};

/* What a forward and backward give and leave in rank 1's daemon. */
typedef struct moe_pass {
  double y[MOE_TOKENS * 2], dx[MOE_TOKENS * 2], dgate[4];
  double w1_grad[2][6]; /* each expert's, as rank 1's daemon holds it */
} moe_pass;

/* Copies the whole of tensor name, held by rank 1's daemon, through c. */
static void full_on_rank_1(dist_client *c, const char *name, void *buf, size_t bytes) {
  dist_tensor *t = NULL;
  cr_assert_eq(harness_open_on(&cluster, 1, name, &t), 0, "%s is not on rank 1", name);
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &n), 0, "%s: %s", name, dist_errmsg(c));
  cr_assert_eq(n, bytes, "%s: %zu bytes", name, n);
  memcpy(buf, data, n);
  free(data);
  dist_tensor_free(t);
}

/* The layer `name` over group [1] through c: create, forward, backward. */
static void moe_pass_through(dist_client *c, const char *name, moe_pass *out) {
  static const int group[1] = {1};
  dist_expert_weights w[2];
  for (int e = 0; e < 2; e++) w[e] = (dist_expert_weights){moe_w1[e], moe_b1[e], moe_w2[e],
                                                           moe_b2[e]};
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.experts_per_rank = 2, o.d_model = 2, o.d_hidden = 3, o.top_k = 2, o.bias = 1;
  o.dtype = DIST_FLOAT64, o.group = group, o.group_size = 1, o.weights = w;
  dist_moe_layer *l = NULL;
  cr_assert_eq(dist_moe_layer_create(c, name, &o, &l), 0, "create: %s", dist_errmsg(c));
  const void *xs[1] = {moe_x}, *dys[1] = {moe_dy};
  const int64_t tokens[1] = {MOE_TOKENS};
  void *y[1] = {NULL}, *dx[1] = {NULL};
  cr_assert_eq(dist_moe_layer_forward(c, l, xs, tokens, moe_gate, y), 0, "forward: %s",
               dist_errmsg(c));
  cr_assert_eq(dist_moe_layer_backward(c, l, dys, dx, out->dgate), 0, "backward: %s",
               dist_errmsg(c));
  memcpy(out->y, y[0], sizeof out->y);
  memcpy(out->dx, dx[0], sizeof out->dx);
  free(y[0]), free(dx[0]);
  for (int e = 0; e < 2; e++) {
    char param[256], grad[300];
    cr_assert_eq(dist_moe_layer_param_name(l, e, "w1", param, sizeof param), 0);
    snprintf(grad, sizeof grad, "%s.grad", param);
    full_on_rank_1(c, grad, out->w1_grad[e], sizeof out->w1_grad[e]);
  }
  dist_moe_layer_free(l);
}

static void expect_same(const char *what, const double *got, const double *want, int n) {
  for (int i = 0; i < n; i++)
    cr_expect_float_eq(got[i], want[i], 1e-12, "%s[%d] = %.17g, not %.17g", what, i, got[i],
                       want[i]);
}

/* The pass through rank 1's daemon alone gives what a client of the
 * cluster file gets over [1]; none of it is zero, so the experts ran. */
Test(one_endpoint, rank_1s_daemon_alone_runs_an_moe_layers_forward_and_backward_over_group_1) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000), *all = harness_client(&cluster);
  moe_pass got, want;
  moe_pass_through(one, "moe.one", &got);
  moe_pass_through(all, "moe.all", &want);
  expect_same("y", got.y, want.y, MOE_TOKENS * 2);
  expect_same("x's gradient", got.dx, want.dx, MOE_TOKENS * 2);
  expect_same("the gate's gradient", got.dgate, want.dgate, 4);
  for (int e = 0; e < 2; e++) expect_same("w1's gradient", got.w1_grad[e], want.w1_grad[e], 6);
  double y_size = 0;
  for (int i = 0; i < MOE_TOKENS * 2; i++) y_size += fabs(got.y[i]);
  cr_expect_gt(y_size, 0.1, "y is all but zero");
  dist_close(all);
  dist_close(one);
}

/* ------------------------------------------ a tape's exchanges over no group */

/* On a tape through c over group (NULL: every rank c reaches), names
 * prefixed by `pre`: y = global_scatter(rows_x), z = global_gather(y),
 * backward from z with gradient dz; x's gradient, rank 1's piece, into dx. */
static void tape_round_trip(dist_client *c, const char *pre, const int *group,
                            const float (*dz)[2], float (*dx)[2]) {
  char x_name[32], y_name[32], z_name[32];
  snprintf(x_name, sizeof x_name, "%s.x", pre);
  snprintf(y_name, sizeof y_name, "%s.y", pre);
  snprintf(z_name, sizeof z_name, "%s.z", pre);
  const void *xs[1] = {rows_x};
  const int64_t *counts[1] = {rows_count};
  dist_tape_exchange a = {x_name, xs, NULL, DIST_FLOAT32, 2, counts, counts, 2,
                          group, group ? 1 : 0, y_name, 0};
  dist_tape *tape = NULL;
  dist_tensor *y = NULL, *z = NULL;
  cr_assert_eq(dist_tape_new(c, &tape), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tape_global_scatter(tape, &a, &y, NULL), 0, "scatter: %s", dist_errmsg(c));
  a.x_name = y_name, a.x = NULL, a.out_name = z_name;
  cr_assert_eq(dist_tape_global_gather(tape, &a, &z, NULL), 0, "gather: %s", dist_errmsg(c));
  dist_value g = {dz, DIST_FLOAT32, 2, {3, 2}};
  dist_arg ga = {NULL, &g};
  const dist_tensor *outs[1] = {z};
  cr_assert_eq(dist_tape_backward(tape, outs, &ga, 1), 0, "backward: %s", dist_errmsg(c));
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_tape_grad_local(tape, x_name, 1, &data, &n, NULL), 0, "x's gradient: %s",
               dist_errmsg(c));
  cr_assert_eq(n, sizeof rows_x, "x's gradient: %zu bytes", n);
  memcpy(dx, data, n);
  free(data);
  dist_tensor_free(y);
  dist_tensor_free(z);
  dist_tape_free(tape);
}

/* Over one rank, the scatter and the gather keep the rows in order (one
 * source rank, expert-major), and so do their backward: x's gradient is
 * the one given for z, as a client of the cluster file gets over [1]. */
Test(one_endpoint, rank_1s_daemon_alone_runs_a_tapes_exchanges_over_no_group) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000), *all = harness_client(&cluster);
  static const float dz[3][2] = {{0.5f, -1}, {2, 3}, {-4, 8}};
  float got[3][2], want[3][2];
  const int group[1] = {1};
  tape_round_trip(one, "one", NULL, dz, got);
  tape_round_trip(all, "all", group, dz, want);
  cr_expect_eq(memcmp(got, dz, sizeof dz), 0, "x's gradient is not the one given for z");
  cr_expect_eq(memcmp(got, want, sizeof got), 0, "x's gradient differs from the cluster's");
  dist_close(all);
  dist_close(one);
}

/* x [2, 3] @ w [3, 2] + b, in double. */
static void linear_of_value(const float *w, const float *b, double *y) {
  for (int r = 0; r < 2; r++)
    for (int j = 0; j < 2; j++) {
      y[r * 2 + j] = b[j];
      for (int k = 0; k < 3; k++) y[r * 2 + j] += (double)value[r * 3 + k] * w[k * 2 + j];
    }
}

/* It was refused: "mesh [1] names rank 1, but the cluster has 1 daemon
 * (ranks 0..0)". */
Test(one_endpoint, rank_1s_daemon_alone_shards_and_runs_a_layer_on_mesh_1) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  dist_layer *l = NULL;
  cr_assert_eq(dist_layer_linear(3, 2, 1, 5, &l), 0);
  cr_assert_eq(dist_layer_set_name(l, "fc"), 0);
  void *w = NULL, *b = NULL;
  size_t nw = 0, nb = 0;
  cr_assert_eq(dist_layer_read_param(NULL, l, "weight", &w, &nw), 0);
  cr_assert_eq(dist_layer_read_param(NULL, l, "bias", &b, &nb), 0);
  double want[4];
  linear_of_value(w, b, want);
  dist_mesh *m = mesh_of("[1]");
  cr_assert_eq(dist_shard_layer(one, l, m, NULL, NULL, NULL, NULL), 0, "shard_layer: %s",
               dist_errmsg(one));
  dist_tensor *x = harness_put(one, "x", DIST_FLOAT32, value, 2, value_shape, "[1]",
                               "Replicate()"), *y = NULL;
  cr_assert_eq(dist_layer_forward(one, l, &x, 1, &y, 1), 1, "forward: %s", dist_errmsg(one));
  void *got = NULL;
  size_t n = 0;
  cr_assert_eq(dist_full_tensor(one, y, &got, &n), 0, "%s", dist_errmsg(one));
  cr_assert_eq(n, sizeof(float) * 4);
  for (int i = 0; i < 4; i++)
    cr_assert_float_eq(((float *)got)[i], want[i], 1e-5, "y[%d]", i);
  free(got), free(w), free(b);
  dist_tensor_free(y);
  dist_tensor_free(x);
  cr_assert_eq(dist_layer_destroy(one, l), 0, "%s", dist_errmsg(one));
  dist_mesh_free(m);
  dist_close(one);
}

Test(one_endpoint, a_layer_on_a_mesh_naming_rank_0_is_refused_through_rank_1s_daemon) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 10000);
  dist_layer *l = NULL;
  cr_assert_eq(dist_layer_linear(3, 2, 1, 5, &l), 0);
  dist_mesh *m = mesh_of("[0]");
  char ms[64], what[80];
  dist_mesh_to_string(m, ms, sizeof ms);
  snprintf(what, sizeof what, "mesh %s", ms);
  expect_reach_refusal(one, dist_shard_layer(one, l, m, NULL, NULL, NULL, NULL), what, 0, 1);
  dist_layer_free(l);
  dist_mesh_free(m);
  dist_close(one);
}

/* Regression (session 28, c9f803d): right after a call to its daemon went
 * unanswered, dist_daemon_rank does not ask the daemon its rank for a
 * second, and reach.c took that -1 as "rank 0": through rank 1's daemon,
 * frozen for one call and back, a put onto mesh [1] within that second was
 * refused ("mesh names rank 1, but this client only reaches distd at ...,
 * which did not say its rank (taken as 0)") though the daemon answers. A
 * mesh's reach needs the rank, not a label: it is asked. */
Test(one_endpoint, a_daemon_back_right_after_an_unanswered_call_is_reached_by_its_rank) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_whose_call_went_unanswered(&cluster, 1, 1500);
  kill(cluster.pids[1], SIGCONT);
  dist_tensor *t = NULL;
  int rc = harness_try_put(one, "w", DIST_FLOAT32, value, 2, value_shape, "[1]",
                           "Replicate()", &t);
  cr_assert_eq(rc, 0, "a put onto [1] right after the daemon came back: %s", dist_errmsg(one));
  expect_round_trip(one, t, 1);
  dist_tensor_free(t);
  dist_close(one);
}

/* A program on mesh [1] through a frozen daemon whose rank was never
 * said: refused after one question of its rank (a second), not two.
 * program_targets asked once in dist_client_reaches and again in
 * dist_client_check_reach, and when the second question was answered
 * where the first was not it returned 0 targets: registered on none. */
Test(one_endpoint, a_program_through_a_frozen_daemon_asks_its_rank_once) {
  harness_start(&cluster, 2, NULL);
  dist_client *one = harness_client_rank(&cluster, 1, 1500);
  int shape[1] = {1}, ranks[1] = {1};
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_new(1, shape, ranks, NULL, &m), 0);
  dist_placement rep = DIST_REPLICATED;
  dist_program *p = NULL;
  cr_assert_eq(dist_program_new("twice", &p), 0);
  int in = dist_input_dtensor(p, "x", DIST_FLOAT32);
  dist_program_output(p, dist_op_mul_scalar(p, in, 2));
  dist_program_out_dist_attr(p, m, &rep, NULL);
  cr_assert(harness_freeze(&cluster, 1, 5000), "rank 1 did not stop");
  double t0 = harness_now_s();
  int rc = dist_program_register(one, p);
  double t = harness_now_s() - t0;
  kill(cluster.pids[1], SIGCONT);
  cr_expect_eq(rc, DIST_EINVAL, "%d: %s", rc, dist_errmsg(one));
  cr_expect(strstr(dist_errmsg(one), "an out_dist_attr names rank 1, but this client only reaches"),
            "%s", dist_errmsg(one));
  cr_expect(t < 1.6, "refusing took %.2f s: the rank was asked more than once", t);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(one);
}
