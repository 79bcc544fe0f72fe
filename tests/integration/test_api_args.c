/* libdist's public calls given bad arguments: NULL pointers, negative or
 * out-of-range counts and ranks, over-long names. Each must fail with
 * DIST_EINVAL and a message naming the call and the argument, and change
 * nothing; before, several of them crashed the trainer (a NULL gradient
 * given to dist_param_push was copied from). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "harness_fixture.h"

TestSuite(api_args, .fini = stop_cluster, .timeout = 120);

/* Two daemons holding "w", float64 [4] Shard(0), an SGD parameter of one
 * trainer. */
static dist_client *start_with_param(void) {
  dist_client *c = harness_start_unique_with_client(&cluster, 2, "api-args", NULL);
  double w[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  dist_tensor_free(harness_put(c, "w", DIST_FLOAT64, w, 1, shape, "[0,1]", "Shard(0)"));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = 1;
  cr_assert_eq(dist_param_configure(c, "w", &o), 0, "%s", dist_errmsg(c));
  return c;
}

/* rc is DIST_EINVAL and c's message contains want. */
static void expect_einval(dist_client *c, int rc, const char *want) {
  cr_assert_eq(rc, DIST_EINVAL, "rc %d (%s), wanted EINVAL with '%s'", rc, dist_errmsg(c),
               want);
  cr_assert(strstr(dist_errmsg(c), want), "'%s' does not say '%s'", dist_errmsg(c), want);
}

/* A name one byte over the limit. */
static const char *long_name(void) {
  static char name[257];
  memset(name, 'n', 256);
  name[256] = 0;
  return name;
}

Test(api_args, param_pushes_refuse_null_buffers_names_and_negative_trainers) {
  dist_client *c = start_with_param();
  double g[4] = {1, 1, 1, 1};
  uint64_t v0 = 0, v = 0;
  expect_einval(c, dist_param_push(c, "w", 0, NULL, sizeof g, &v),
                "dist_param_push: grad is NULL");
  expect_einval(c, dist_param_push(c, NULL, 0, g, sizeof g, &v),
                "dist_param_push: name is NULL");
  expect_einval(c, dist_param_push(c, long_name(), 0, g, sizeof g, &v),
                "dist_param_push: tensor name of 256 bytes (1 to 255 allowed)");
  expect_einval(c, dist_param_push(c, "w", -1, g, sizeof g, &v),
                "dist_param_push: trainer -1 is negative");
  expect_einval(c, dist_param_push_local(c, "w", 0, 1, NULL, 16, &v),
                "dist_param_push_local: piece is NULL");
  expect_einval(c, dist_param_push_local(c, "w", 0, 7, g, 16, &v),
                "dist_param_push_local: no daemon of rank 7 (cluster of 2)");
  expect_einval(c, dist_param_push_tensor(c, "w", 0, NULL, &v),
                "dist_param_push_tensor: grad_name is NULL");
  const char *names[2] = {"w", NULL}, *grads[2] = {"g", NULL};
  expect_einval(c, dist_param_push_tensors(c, -1, names, grads, 0),
                "dist_param_push_tensors: n is -1");
  expect_einval(c, dist_param_push_tensors(c, 1, NULL, grads, 0),
                "dist_param_push_tensors: names is NULL");
  expect_einval(c, dist_param_push_tensors(c, 1, names, grads, -2),
                "dist_param_push_tensors: trainer -2 is negative");
  expect_einval(c, dist_param_push_tensors(c, 2, names, grads, 0),
                "dist_param_push_tensors: grad_names[1] is NULL");
  grads[1] = "g";
  expect_einval(c, dist_param_push_tensors(c, 2, names, grads, 0),
                "dist_param_push_tensors: names[1] is NULL");
  /* Nothing was counted: the next whole push completes the update. */
  void *data = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_param_pull(c, "w", 0, &data, &nbytes, &v0), 0, "%s", dist_errmsg(c));
  free(data);
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(v, v0 + 1);
  dist_close(c);
}

Test(api_args, param_configure_tune_and_pull_refuse_null_arguments) {
  dist_client *c = start_with_param();
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  void *data = NULL;
  size_t nbytes = 0;
  expect_einval(c, dist_param_configure(c, NULL, &o), "dist_param_configure: name is NULL");
  expect_einval(c, dist_param_tune(c, NULL, &o), "dist_param_tune: name is NULL");
  expect_einval(c, dist_param_tune(c, "w", NULL), "dist_param_tune: opts");
  expect_einval(c, dist_param_pull(c, "w", 0, NULL, &nbytes, NULL),
                "dist_param_pull: data is NULL");
  expect_einval(c, dist_param_pull(c, "w", 0, &data, NULL, NULL),
                "dist_param_pull: nbytes is NULL");
  expect_einval(c, dist_param_pull(c, NULL, 0, &data, &nbytes, NULL),
                "dist_param_pull: name is NULL");
  dist_close(c);
}

Test(api_args, tensor_puts_refuse_null_data_shape_mesh_placements_and_out) {
  dist_client *c = start_with_param();
  double x[4] = {0};
  int64_t shape[1] = {4};
  dist_mesh *m = NULL;
  dist_placement p[1];
  cr_assert_eq(dist_mesh_from_string("[0,1]", NULL, &m), 0);
  cr_assert_eq(dist_parse_placements("Shard(0)", p, 1), 1);
  dist_tensor *t = NULL;
  expect_einval(c, dist_shard_tensor(c, "x", NULL, DIST_FLOAT64, 1, shape, m, p, &t),
                "dist_shard_tensor: data is NULL");
  expect_einval(c, dist_shard_tensor(c, "x", x, DIST_FLOAT64, 1, NULL, m, p, &t),
                "dist_shard_tensor: shape is NULL");
  expect_einval(c, dist_shard_tensor(c, "x", x, DIST_FLOAT64, 1, shape, NULL, p, &t),
                "dist_shard_tensor: mesh is NULL");
  expect_einval(c, dist_shard_tensor(c, "x", x, DIST_FLOAT64, 1, shape, m, NULL, &t),
                "dist_shard_tensor: placements is NULL");
  expect_einval(c, dist_shard_tensor(c, "x", x, DIST_FLOAT64, 1, shape, m, p, NULL),
                "dist_shard_tensor: out is NULL");
  expect_einval(c, dist_shard_tensor(c, NULL, x, DIST_FLOAT64, 1, shape, m, p, &t),
                "shard_tensor: name is NULL");
  const int64_t piece_shape[1] = {2};
  const int64_t *shapes[2] = {piece_shape, piece_shape};
  const void *pieces[2] = {x, NULL};
  expect_einval(c, dist_dtensor_from_local(c, "x", pieces, DIST_FLOAT64, 1, shapes, m, p, &t),
                "dist_dtensor_from_local: pieces[1] is NULL");
  expect_einval(c, dist_dtensor_from_local(c, "x", NULL, DIST_FLOAT64, 1, shapes, m, p, &t),
                "dist_dtensor_from_local: pieces is NULL");
  expect_einval(c, dist_dtensor_from_local(c, "x", pieces, DIST_FLOAT64, 1, NULL, m, p, &t),
                "dist_dtensor_from_local: shapes is NULL");
  /* Nothing was put. */
  cr_assert_eq(dist_tensor_open(c, "x", &t), DIST_ENOTFOUND, "%s", dist_errmsg(c));
  dist_mesh_free(m);
  dist_close(c);
}

Test(api_args, tensor_reads_and_lookups_refuse_null_pointers_bad_ranks_and_long_names) {
  dist_client *c = start_with_param();
  dist_tensor *w = NULL;
  cr_assert_eq(dist_tensor_open(c, "w", &w), 0, "%s", dist_errmsg(c));
  void *data = NULL;
  size_t nbytes = 0;
  int64_t shape[1];
  expect_einval(c, dist_full_tensor(c, w, NULL, &nbytes), "dist_full_tensor: data is NULL");
  expect_einval(c, dist_full_tensor(c, NULL, &data, &nbytes), "dist_full_tensor: t is NULL");
  expect_einval(c, dist_dtensor_to_local(c, w, 0, &data, NULL, shape),
                "dist_dtensor_to_local: nbytes is NULL");
  expect_einval(c, dist_dtensor_to_local(c, w, 9, &data, &nbytes, shape),
                "dist_dtensor_to_local: no daemon of rank 9 (cluster of 2)");
  expect_einval(c, dist_reshard(c, w, NULL, NULL), "dist_reshard: placements is NULL");
  expect_einval(c, dist_reshard(c, NULL, NULL, NULL), "dist_reshard: t is NULL");
  dist_tensor *t = NULL;
  expect_einval(c, dist_tensor_open(c, NULL, &t), "dist_tensor_open: name is NULL");
  expect_einval(c, dist_tensor_open(c, "w", NULL), "dist_tensor_open: out is NULL");
  expect_einval(c, dist_tensor_open(c, long_name(), &t),
                "dist_tensor_open: tensor name of 256 bytes");
  expect_einval(c, dist_tensor_delete(c, NULL), "dist_tensor_delete: name is NULL");
  dist_tensor_piece *pieces = NULL;
  int n = 0;
  expect_einval(c, dist_tensor_pieces(c, w, NULL, &n), "dist_tensor_pieces: out is NULL");
  expect_einval(c, dist_tensor_pieces(c, w, &pieces, NULL), "dist_tensor_pieces: n is NULL");
  expect_einval(c, dist_tensor_list(c, NULL, &n), "dist_tensor_list: out is NULL");
  dist_tensor_free(w);
  dist_close(c);
}

Test(api_args, inspection_calls_refuse_null_reports_and_ranks_outside_the_cluster) {
  dist_client *c = start_with_param();
  dist_daemon_info info;
  expect_einval(c, dist_info(c, 0, NULL), "dist_info: out is NULL");
  expect_einval(c, dist_info(c, 2, &info), "dist_info: no daemon of rank 2 (cluster of 2)");
  expect_einval(c, dist_health(c, 2), "dist_health: no daemon of rank 2 (cluster of 2)");
  expect_einval(c, dist_health(c, -1), "dist_health: no daemon of rank -1");
  expect_einval(c, dist_ops(c, 0, 0, NULL), "dist_ops: out is NULL");
  expect_einval(c, dist_experts(c, 0, NULL), "dist_experts: out is NULL");
  expect_einval(c, dist_params(c, 0, NULL), "dist_params: out is NULL");
  dist_params_report rep;
  expect_einval(c, dist_params(c, 2, &rep), "dist_params: no daemon of rank 2 (cluster of 2)");
  dist_close(c);
}

Test(api_args, collectives_refuse_null_buffers_and_bad_group_sizes) {
  harness_start_unique(&cluster, 2, "api-args-coll", NULL);
  dist_client *c = harness_spmd_client(&cluster, 0, "api-args");
  double buf[4] = {0};
  int group[2] = {0, 1};
  expect_einval(c, dist_all_reduce(c, NULL, 4, DIST_FLOAT64, DIST_REDUCE_SUM, NULL, 0),
                "dist_all_reduce: buf is NULL");
  expect_einval(c, dist_all_reduce(c, buf, 4, DIST_FLOAT64, DIST_REDUCE_SUM, group, 0),
                "dist_all_reduce: group_size 0 (1 to");
  expect_einval(c, dist_all_reduce(c, buf, 4, DIST_FLOAT64, DIST_REDUCE_SUM, group, -3),
                "dist_all_reduce: group_size -3");
  expect_einval(c, dist_all_gather(c, buf, 2, NULL, DIST_FLOAT64, NULL, 0),
                "dist_all_gather: out is NULL");
  expect_einval(c, dist_all_gather(c, NULL, 2, buf, DIST_FLOAT64, NULL, 0),
                "dist_all_gather: in is NULL");
  expect_einval(c, dist_broadcast(c, NULL, 4, DIST_FLOAT64, 0, NULL, 0),
                "dist_broadcast: buf is NULL");
  dist_close(c);
}

/* No client: the message is the thread's dist_last_mesh_error. */
static void expect_mesh_einval(int rc, const char *want) {
  cr_assert_eq(rc, DIST_EINVAL, "rc %d (%s), wanted EINVAL with '%s'", rc,
               dist_last_mesh_error(), want);
  cr_assert(strstr(dist_last_mesh_error(), want), "'%s' does not say '%s'",
            dist_last_mesh_error(), want);
}

Test(api_args, mesh_constructors_and_placement_parsing_refuse_null_pointers) {
  int shape[1] = {2}, ranks[2] = {0, 1};
  dist_mesh *m = NULL;
  dist_placement p[2];
  expect_mesh_einval(dist_mesh_new(1, NULL, ranks, NULL, &m), "dist_mesh_new: shape is NULL");
  expect_mesh_einval(dist_mesh_new(1, shape, NULL, NULL, &m), "dist_mesh_new: ranks is NULL");
  expect_mesh_einval(dist_mesh_new(1, shape, ranks, NULL, NULL), "dist_mesh_new: out is NULL");
  expect_mesh_einval(dist_mesh_from_string(NULL, NULL, &m),
                     "dist_mesh_from_string: text is NULL");
  cr_assert_eq(dist_mesh_from_string("[0,1]", "dp", &m), 0, "%s", dist_last_mesh_error());
  dist_mesh *sub = NULL;
  expect_mesh_einval(dist_mesh_get_submesh(m, NULL, 0, &sub),
                     "dist_mesh_get_submesh: dim_name is NULL");
  expect_mesh_einval(dist_parse_placements(NULL, p, 2), "dist_parse_placements: text is NULL");
  expect_mesh_einval(dist_parse_placements("Shard(0)", NULL, 2),
                     "dist_parse_placements: out is NULL");
  expect_mesh_einval(dist_parse_placements("Shard(0),Replicate()", p, 1),
                     "more than 1 given");
  dist_mesh_free(m);
}

Test(api_args, tape_gradients_and_layer_values_refuse_null_pointers) {
  dist_client *c = start_with_param();
  dist_tape *t = NULL;
  cr_assert_eq(dist_tape_new(c, &t), 0, "%s", dist_errmsg(c));
  size_t nbytes = 0;
  expect_einval(c, dist_tape_grad(t, "w", NULL), "dist_tape_grad: out is NULL");
  expect_einval(c, dist_tape_grad_local(t, "w", 0, NULL, &nbytes, NULL),
                "dist_tape_grad_local: data is NULL");
  dist_tape_free(t);
  /* Layers before dist_shard_layer have no client to name it in: the
   * thread's dist_errmsg(NULL) does. */
  dist_layer *l = NULL;
  cr_assert_eq(dist_layer_linear(2, 2, 0, 1, &l), 0);
  cr_assert_eq(dist_layer_set_param(l, "weight", NULL, 4 * sizeof(float)), DIST_EINVAL);
  cr_assert_str_eq(dist_errmsg(NULL), "dist_layer_set_param: data is NULL");
  dist_layer_free(l);
  dist_close(c);
}

/* Builder errors are sticky: each case gets a fresh program. */
static void expect_builder_einval(dist_program *p, int rc, const char *want) {
  cr_assert_eq(rc, DIST_EINVAL, "rc %d (%s), wanted EINVAL with '%s'", rc,
               dist_program_errmsg(p), want);
  cr_assert(strstr(dist_program_errmsg(p), want), "'%s' does not say '%s'",
            dist_program_errmsg(p), want);
  dist_program_free(p);
}

static dist_program *program_with_input(int *x) {
  dist_program *p = NULL;
  cr_assert_eq(dist_program_new("args", &p), 0);
  *x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  cr_assert_geq(*x, 0, "%s", dist_program_errmsg(p));
  return p;
}

Test(api_args, program_builders_refuse_null_lists_with_entries) {
  int x;
  const int64_t two[2] = {0, 1};
  dist_program *p = program_with_input(&x);
  expect_builder_einval(p, dist_op_reshape(p, x, NULL, 2), "dist_op_reshape: shape is NULL");
  p = program_with_input(&x);
  expect_builder_einval(p, dist_op_transpose(p, x, NULL, 2), "dist_op_transpose: perm is NULL");
  p = program_with_input(&x);
  expect_builder_einval(p, dist_op_sum(p, x, NULL, 1, 0), "dist_op_reduce: axes is NULL");
  p = program_with_input(&x);
  expect_builder_einval(p, dist_op_slice(p, x, two, NULL, two, NULL, 2),
                        "dist_op_slice: starts is NULL");
  p = program_with_input(&x);
  expect_builder_einval(p, dist_op_concat(p, NULL, 2, 0), "dist_op_concat: xs is NULL");
  p = program_with_input(&x);
  expect_builder_einval(p, dist_op_constant(p, DIST_FLOAT32, two, 1, NULL, 2),
                        "dist_op_constant: values is NULL");
  p = program_with_input(&x);
  expect_builder_einval(p, dist_op_full(p, DIST_FLOAT32, NULL, 2, 0),
                        "dist_op_full: shape is NULL");
  p = program_with_input(&x);
  expect_builder_einval(p, dist_input_set_shape(p, x, 2, NULL),
                        "dist_input_set_shape: shape is NULL");
  p = program_with_input(&x);
  expect_builder_einval(p, dist_input_set_grad_placements(p, x, NULL, 1),
                        "dist_input_set_grad_placements: placements is NULL");
}

Test(api_args, moe_exchanges_refuse_null_entries_and_negative_row_counts) {
  dist_client *c = start_with_param();
  float x0[2] = {1, 2}, x1[2] = {3, 4};
  int64_t lc[2] = {1, 0}, gc[2] = {1, 0}, rows[2] = {-1, 1};
  const void *xs[2] = {x0, NULL}, *both[2] = {x0, x1};
  const int64_t *counts[2] = {lc, gc}, *holed[2] = {lc, NULL};
  void *out[2] = {NULL, NULL};
  expect_einval(c, dist_global_scatter(c, both, NULL, DIST_FLOAT32, 1, holed, counts, 1, NULL, 0,
                                       NULL, out, NULL),
                "global_scatter: local_count[1] is NULL");
  expect_einval(c, dist_global_gather(c, both, NULL, DIST_FLOAT32, 1, counts, holed, 1, NULL, 0,
                                      NULL, out, NULL),
                "global_gather: global_count[1] is NULL");
  expect_einval(c, dist_global_scatter(c, xs, NULL, DIST_FLOAT32, 1, counts, counts, 1, NULL, 0,
                                       NULL, out, NULL),
                "global_scatter: x[1] is NULL");
  expect_einval(c, dist_global_scatter(c, both, rows, DIST_FLOAT32, 1, counts, counts, 1, NULL,
                                       0, NULL, out, NULL),
                "global_scatter: x_rows[0] is negative (-1)");
  dist_close(c);
}

/* rc is DIST_EINVAL and the thread's no-client message names call. */
static void expect_no_client(int rc, const char *call) {
  char want[128];
  snprintf(want, sizeof want, "%s: c is NULL", call);
  cr_assert_eq(rc, DIST_EINVAL, "%s: rc %d, wanted EINVAL", call, rc);
  cr_assert_str_eq(dist_errmsg(NULL), want);
}

/* Every call taking a client, given none: no daemon is needed, as the
 * client is checked before anything else is read. */
Test(api_args, every_call_taking_a_client_refuses_a_null_one_naming_itself) {
  double buf[2] = {0};
  void *data = NULL;
  size_t nbytes = 0;
  dist_tensor *t = NULL;
  dist_daemon_info info;
  dist_ops_report ops;
  dist_experts_report experts;
  dist_params_report params;
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  expect_no_client(dist_all_reduce(NULL, buf, 2, DIST_FLOAT64, DIST_REDUCE_SUM, NULL, 0),
                   "dist_all_reduce");
  expect_no_client(dist_all_gather(NULL, buf, 1, buf, DIST_FLOAT64, NULL, 0), "dist_all_gather");
  expect_no_client(dist_broadcast(NULL, buf, 2, DIST_FLOAT64, 0, NULL, 0), "dist_broadcast");
  expect_no_client(dist_barrier(NULL), "dist_barrier");
  expect_no_client(dist_info(NULL, 0, &info), "dist_info");
  expect_no_client(dist_health(NULL, 0), "dist_health");
  expect_no_client(dist_ops(NULL, 0, 0, &ops), "dist_ops");
  expect_no_client(dist_experts(NULL, 0, &experts), "dist_experts");
  expect_no_client(dist_params(NULL, 0, &params), "dist_params");
  expect_no_client(dist_tensor_open(NULL, "w", &t), "dist_tensor_open");
  expect_no_client(dist_tensor_delete(NULL, "w"), "dist_tensor_delete");
  expect_no_client(dist_full_tensor(NULL, t, &data, &nbytes), "dist_full_tensor");
  expect_no_client(dist_reshard(NULL, t, NULL, NULL), "dist_reshard");
  expect_no_client(dist_shard_tensor(NULL, "w", buf, DIST_FLOAT64, 0, NULL, NULL, NULL, &t),
                   "dist_shard_tensor");
  expect_no_client(dist_param_configure(NULL, "w", &o), "dist_param_configure");
  expect_no_client(dist_param_tune(NULL, "w", &o), "dist_param_tune");
  expect_no_client(dist_param_push(NULL, "w", 0, buf, sizeof buf, NULL), "dist_param_push");
  expect_no_client(dist_param_push_local(NULL, "w", 0, 0, buf, sizeof buf, NULL),
                   "dist_param_push_local");
  expect_no_client(dist_param_push_tensor(NULL, "w", 0, "g", NULL), "dist_param_push_tensor");
  expect_no_client(dist_param_push_tensors(NULL, 0, NULL, NULL, 0), "dist_param_push_tensors");
  expect_no_client(dist_param_pull(NULL, "w", 0, &data, &nbytes, NULL), "dist_param_pull");
  expect_no_client(dist_checkpoint_save(NULL, "/tmp/x", NULL, NULL), "dist_checkpoint_save");
  expect_no_client(dist_checkpoint_restore(NULL, "/tmp/x", NULL, NULL),
                   "dist_checkpoint_restore");
  dist_tape *tape = NULL;
  expect_no_client(dist_tape_new(NULL, &tape), "dist_tape_new");
  /* The accessors answer for no client rather than crash. */
  cr_assert_eq(dist_errcode(NULL), DIST_EINVAL);
  cr_assert_eq(dist_world_size(NULL), 0);
  cr_assert_eq(dist_rank(NULL), -1);
  cr_assert_null(dist_endpoint(NULL, 0));
  cr_assert_eq(dist_daemon_rank(NULL, 0), -1);
  cr_assert_str_eq(dist_errmsg(NULL), "dist_daemon_rank: c is NULL");
}

/* Handles that lead to the client: a NULL tape has no client to keep the
 * message in (dist_errmsg(NULL) says it); a NULL layer, program or
 * invocation is named on the client. */
Test(api_args, null_tapes_layers_programs_and_invocations_are_named) {
  dist_client *c = start_with_param();
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tape_grad(NULL, "w", &t), DIST_EINVAL);
  cr_assert_str_eq(dist_errmsg(NULL), "dist_tape_grad: t is NULL");
  cr_assert_eq(dist_tape_backward(NULL, NULL, NULL, 0), DIST_EINVAL);
  cr_assert_str_eq(dist_errmsg(NULL), "dist_tape_backward: t is NULL");
  expect_einval(c, dist_tape_new(c, NULL), "dist_tape_new: out is NULL");
  expect_einval(c, dist_layer_forward(c, NULL, NULL, 0, NULL, 0), "dist_layer_forward: l is NULL");
  expect_einval(c, dist_layer_step(c, NULL, 0), "dist_layer_step: l is NULL");
  expect_einval(c, dist_moe_layer_step(c, NULL), "dist_moe_layer_step: l is NULL");
  expect_einval(c, dist_moe_layer_create(c, "m", NULL, NULL), "dist_moe_layer_create: out is NULL");
  expect_einval(c, dist_program_register(c, NULL), "dist_program_register: p is NULL");
  expect_einval(c, dist_local_layer_call(c, NULL, NULL, 0, NULL, NULL, NULL),
                "dist_local_layer_call: p is NULL");
  expect_einval(c, dist_backward(c, NULL, NULL, NULL, NULL), "dist_backward: inv is NULL");
  cr_assert_eq(dist_layer_destroy(c, NULL), 0, "NULL stays a no-op");
  dist_close(c);
}

/* A MoE layer of one expert per daemon, d_model 2, float32. */
static dist_moe_layer *small_moe_layer(dist_client *c) {
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.experts_per_rank = 1, o.d_model = 2, o.d_hidden = 2, o.seed = 3, o.top_k = 1;
  dist_moe_layer *l = NULL;
  cr_assert_eq(dist_moe_layer_create(c, "args_moe", &o, &l), 0, "%s", dist_errmsg(c));
  return l;
}

/* The per-rank arrays are read entry by entry before anything is sent:
 * before, a NULL x[k] was reported as "rank k has 1 tokens" and a NULL
 * grad_y[k] as "out of memory or no grad_y". A refused pass leaves the
 * layer usable. */
Test(api_args, moe_layer_passes_name_a_null_entry) {
  dist_client *c = start_with_param();
  dist_moe_layer *l = small_moe_layer(c);
  float x0[2] = {1, 2}, x1[2] = {3, -1}, gate[4] = {1, 0, 0, 1}, dy[2] = {1, 1};
  int64_t tokens[2] = {1, 1};
  const void *holed[2] = {x0, NULL}, *both[2] = {x0, x1};
  const void *dys_holed[2] = {NULL, dy};
  void *y[2] = {NULL, NULL};
  expect_einval(c, dist_moe_layer_forward(c, l, holed, tokens, gate, y),
                "dist_moe_layer_forward: x[1] is NULL");
  cr_assert_eq(dist_moe_layer_forward(c, l, both, tokens, gate, y), 0, "%s", dist_errmsg(c));
  free(y[0]), free(y[1]);
  expect_einval(c, dist_moe_layer_backward(c, l, dys_holed, NULL, NULL),
                "dist_moe_layer_backward: grad_y[0] is NULL");
  cr_assert_eq(dist_moe_layer_release(c, l), 0, "%s", dist_errmsg(c));
  dist_moe_layer_free(l);
  dist_close(c);
}

/* y = 2 x, registered, output Shard(0) on both daemons; x a float64
 * distributed tensor ("w": [4] Shard(0)) or, with values, a per-rank value. */
static dist_program *doubling_program(dist_client *c, int values, dist_mesh **m) {
  dist_program *p = NULL;
  dist_placement s0 = DIST_SHARD_DIM(0);
  cr_assert_eq(dist_mesh_from_string("[0,1]", NULL, m), 0);
  cr_assert_eq(dist_program_new("doubling", &p), 0);
  int x = values ? dist_input_value(p, "x", DIST_FLOAT64)
                 : dist_input_dtensor(p, "x", DIST_FLOAT64);
  dist_program_output(p, dist_op_mul_scalar(p, x, 2));
  dist_program_out_dist_attr(p, *m, &s0, NULL);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  return p;
}

/* A LocalLayer call's and a backward's argument arrays are read entry by
 * entry before anything is sent; before, a value without data was read
 * from NULL while its request was packed, and a NULL args or inv crashed
 * the call. */
Test(api_args, local_layer_call_and_backward_name_a_null_entry) {
  dist_client *c = start_with_param();
  dist_mesh *m = NULL;
  dist_program *p = doubling_program(c, 0, &m);
  dist_tensor *w = NULL, *out = NULL, *grads[1] = {NULL};
  cr_assert_eq(dist_tensor_open(c, "w", &w), 0, "%s", dist_errmsg(c));
  double g[2] = {1, 1};
  dist_value holed[2] = {{g, DIST_FLOAT64, 1, {2}}, {NULL, DIST_FLOAT64, 1, {2}}};
  dist_arg args[1] = {{w, NULL}}, grad_args[1] = {{NULL, holed}};
  dist_invocation *inv = NULL;
  expect_einval(c, dist_local_layer_call(c, p, NULL, 1, NULL, &inv, &out),
                "dist_local_layer_call: args is NULL with 1 entries");
  expect_einval(c, dist_local_layer_call(c, p, args, 1, NULL, NULL, &out),
                "dist_local_layer_call: inv is NULL");
  cr_assert_eq(dist_local_layer_call(c, p, args, 1, NULL, &inv, &out), 0, "%s", dist_errmsg(c));
  expect_einval(c, dist_backward(c, inv, grad_args, NULL, grads),
                "dist_backward: out_grads[0].values[1].data is NULL");
  holed[1].ndim = 9;
  expect_einval(c, dist_backward(c, inv, grad_args, NULL, grads),
                "dist_backward: out_grads[0].values[1] has 9 dims");
  /* Refused before it was sent: the daemons still hold the invocation. */
  holed[1] = holed[0];
  cr_assert_eq(dist_backward(c, inv, grad_args, NULL, grads), 0, "%s", dist_errmsg(c));
  dist_tensor_free(grads[0]);
  dist_invocation_free(inv);
  dist_tensor_free(out);
  dist_tensor_free(w);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
}

/* A value argument's entries are read the same way on the call. */
Test(api_args, local_layer_call_names_a_value_without_data) {
  dist_client *c = start_with_param();
  dist_mesh *m = NULL;
  dist_program *p = doubling_program(c, 1, &m);
  double d[2] = {1, 2};
  dist_value vals[2] = {{NULL, DIST_FLOAT64, 1, {2}}, {d, DIST_FLOAT64, 1, {2}}};
  dist_arg args[1] = {{NULL, vals}};
  dist_invocation *inv = NULL;
  dist_tensor *out = NULL;
  expect_einval(c, dist_local_layer_call(c, p, args, 1, NULL, &inv, &out),
                "dist_local_layer_call: args[0].values[0].data is NULL");
  cr_assert_null(inv);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
}

/* A tape backward's outputs and gradients are read entry by entry before
 * anything is sent, and a refusal leaves the tape as it was. Before, a NULL
 * output was "backward from '(null)'", a value without data was first read
 * by whichever step used it (after the steps before it had run in the
 * daemons), and either refusal spent the tape. */
Test(api_args, tape_backward_names_a_null_output_or_value_and_keeps_the_tape) {
  dist_client *c = start_with_param();
  dist_mesh *m = NULL;
  dist_program *p = doubling_program(c, 0, &m);
  dist_tape *t = NULL;
  dist_tensor *w = NULL, *y = NULL;
  cr_assert_eq(dist_tensor_open(c, "w", &w), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tape_new(c, &t), 0, "%s", dist_errmsg(c));
  dist_arg args[1] = {{w, NULL}};
  cr_assert_eq(dist_tape_local_layer_call(t, p, args, 1, NULL, &y), 0, "%s", dist_errmsg(c));
  double g0[2] = {1, 2}, g1[2] = {3, 4};
  dist_value dy[2] = {{g0, DIST_FLOAT64, 1, {2}}, {NULL, DIST_FLOAT64, 1, {2}}};
  dist_arg grads[1] = {{NULL, dy}};
  const dist_tensor *none[1] = {NULL}, *outs[1] = {y};
  expect_einval(c, dist_tape_backward(t, none, grads, 1), "dist_tape_backward: outputs[0] is NULL");
  expect_einval(c, dist_tape_backward(t, outs, grads, 1),
                "dist_tape_backward: grads[0].values[1].data is NULL");
  dy[1] = (dist_value){g1, DIST_FLOAT64, 9, {2}};
  expect_einval(c, dist_tape_backward(t, outs, grads, 1),
                "dist_tape_backward: grads[0].values[1] has 9 dims");
  /* The tape still runs its one backward: y = 2 w, so each rank's piece
   * of w's gradient is twice its dy. */
  dy[1].ndim = 1;
  cr_assert_eq(dist_tape_backward(t, outs, grads, 1), 0, "%s", dist_errmsg(c));
  const double want[2][2] = {{2, 4}, {6, 8}};
  for (int r = 0; r < 2; r++) {
    void *data = NULL;
    size_t nbytes = 0;
    int64_t shape[DIST_MAX_DIMS];
    cr_assert_eq(dist_tape_grad_local(t, "w", r, &data, &nbytes, shape), 0, "%s",
                 dist_errmsg(c));
    cr_assert_eq(nbytes, sizeof want[r]);
    cr_assert_arr_eq(data, want[r], sizeof want[r], "rank %d's piece of w's gradient", r);
    free(data);
  }
  dist_tape_free(t);
  dist_tensor_free(y);
  dist_tensor_free(w);
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
}

/* A tape's exchange copied its counts' entries before dist_global_scatter
 * could check them: a NULL entry, or a NULL a, crashed the trainer. */
Test(api_args, tape_exchanges_name_a_null_argument_or_count_entry) {
  dist_client *c = start_with_param();
  dist_tape *t = NULL;
  cr_assert_eq(dist_tape_new(c, &t), 0, "%s", dist_errmsg(c));
  const int64_t counts[2] = {1, 0};
  const int64_t *lcs[2] = {counts, NULL}, *gcs[2] = {counts, counts};
  dist_tape_exchange a = {.x_name = "tx", .dtype = DIST_FLOAT32, .d_model = 2,
                          .local_count = lcs, .global_count = gcs, .n_experts = 1,
                          .out_name = "ty"};
  expect_einval(c, dist_tape_global_scatter(t, NULL, NULL, NULL),
                "dist_tape_global_scatter: a is NULL");
  expect_einval(c, dist_tape_global_scatter(t, &a, NULL, NULL),
                "dist_tape_global_scatter: local_count[1] is NULL");
  lcs[1] = counts;
  gcs[0] = NULL;
  expect_einval(c, dist_tape_global_gather(t, &a, NULL, NULL),
                "dist_tape_global_gather: global_count[0] is NULL");
  dist_tape_free(t);
  dist_close(c);
}
