/* libdist's calls that take no client, given a NULL handle (a mesh, tensor,
 * program, invocation, layer or MoE layer): each returns its error value
 * and says, in the thread's dist_errmsg(NULL), which call and which
 * argument. Before, each read through the NULL and crashed the trainer.
 * The layer builders' other refusals say why there too; before, they
 * returned a bare code. No daemon is needed: nothing is sent. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "dist/dist.h"

/* rc is want_rc and dist_errmsg(NULL) is exactly "CALL: ARG is NULL". */
static void expect_named(int rc, int want_rc, const char *call, const char *arg) {
  char want[160];
  snprintf(want, sizeof want, "%s: %s is NULL", call, arg);
  cr_assert_eq(rc, want_rc, "%s: rc %d, wanted %d", call, rc, want_rc);
  cr_assert_str_eq(dist_errmsg(NULL), want);
}

/* A pointer accessor: NULL, and the message. */
static void expect_null_named(const void *got, const char *call, const char *arg) {
  cr_assert_null(got, "%s gave a pointer for a NULL %s", call, arg);
  expect_named(DIST_EINVAL, DIST_EINVAL, call, arg);
}

/* A builder given no program: DIST_EINVAL naming itself and p. */
#define EXPECT_P(call, name) expect_named((call), DIST_EINVAL, (name), "p")

/* rc is want_rc and dist_errmsg(NULL) contains want. */
static void expect_said(int rc, int want_rc, const char *want) {
  cr_assert_eq(rc, want_rc, "rc %d (%s), wanted %d with '%s'", rc, dist_errmsg(NULL),
               want_rc, want);
  cr_assert(strstr(dist_errmsg(NULL), want), "'%s' does not say '%s'", dist_errmsg(NULL),
            want);
}

Test(api_handles, mesh_accessors_refuse_a_null_mesh) {
  char buf[32] = "unchanged";
  expect_named(dist_mesh_ndim(NULL), -1, "dist_mesh_ndim", "m");
  expect_named(dist_mesh_dim_size(NULL, 0), -1, "dist_mesh_dim_size", "m");
  expect_named(dist_mesh_size(NULL), -1, "dist_mesh_size", "m");
  expect_named(dist_mesh_rank_at(NULL, 0), -1, "dist_mesh_rank_at", "m");
  expect_null_named(dist_mesh_dim_name(NULL, 0), "dist_mesh_dim_name", "m");
  dist_mesh_to_string(NULL, buf, sizeof buf);
  cr_assert_str_eq(buf, "", "the buffer holds no mesh");
  expect_named(DIST_EINVAL, DIST_EINVAL, "dist_mesh_to_string", "m");
  /* A constructor's NULL argument is named in both messages. */
  dist_mesh *sub = NULL;
  expect_named(dist_mesh_get_submesh(NULL, "d0", 0, &sub), DIST_EINVAL,
               "dist_mesh_get_submesh", "m");
  cr_assert_str_eq(dist_last_mesh_error(), "dist_mesh_get_submesh: m is NULL");
}

Test(api_handles, tensor_accessors_refuse_a_null_tensor) {
  expect_null_named(dist_tensor_name(NULL), "dist_tensor_name", "t");
  cr_assert_eq(dist_tensor_dtype(NULL), DIST_DTYPE_INVALID);
  expect_named(DIST_EINVAL, DIST_EINVAL, "dist_tensor_dtype", "t");
  expect_named(dist_tensor_ndim(NULL), -1, "dist_tensor_ndim", "t");
  expect_null_named(dist_tensor_shape(NULL), "dist_tensor_shape", "t");
  expect_null_named(dist_tensor_mesh(NULL), "dist_tensor_mesh", "t");
  expect_null_named(dist_tensor_placements(NULL), "dist_tensor_placements", "t");
  expect_named((int)dist_tensor_version(NULL), 0, "dist_tensor_version", "t");
}

Test(api_handles, program_inputs_outputs_and_accessors_refuse_a_null_program) {
  const int64_t shape[1] = {2};
  const dist_placement pl[1] = {DIST_REPLICATED};
  expect_named(dist_program_new("p", NULL), DIST_EINVAL, "dist_program_new", "out");
  EXPECT_P(dist_input_dtensor(NULL, "x", DIST_FLOAT32), "dist_input_dtensor");
  EXPECT_P(dist_input_value(NULL, "v", DIST_FLOAT32), "dist_input_value");
  EXPECT_P(dist_input_rank(NULL), "dist_input_rank");
  EXPECT_P(dist_input_coord(NULL, NULL, 0), "dist_input_coord");
  EXPECT_P(dist_input_set_shape(NULL, 0, 1, shape), "dist_input_set_shape");
  EXPECT_P(dist_input_set_no_grad(NULL, 0), "dist_input_set_no_grad");
  EXPECT_P(dist_input_set_grad_placements(NULL, 0, pl, 1), "dist_input_set_grad_placements");
  EXPECT_P(dist_op_set_label(NULL, 0, "l"), "dist_op_set_label");
  EXPECT_P(dist_program_output(NULL, 0), "dist_program_output");
  EXPECT_P(dist_program_out_dist_attr(NULL, NULL, pl, NULL), "dist_program_out_dist_attr");
  EXPECT_P(dist_program_set_invocation_ttl(NULL, 1), "dist_program_set_invocation_ttl");
  expect_named(dist_program_nranks(NULL), -1, "dist_program_nranks", "p");
  expect_named(dist_program_rank_at(NULL, 0), -1, "dist_program_rank_at", "p");
  expect_named(dist_program_n_inputs(NULL), -1, "dist_program_n_inputs", "p");
  expect_named(dist_program_n_outputs(NULL), -1, "dist_program_n_outputs", "p");
  cr_assert_str_eq(dist_program_errmsg(NULL), "", "no program, no builder error");
}

Test(api_handles, elementwise_builders_refuse_a_null_program) {
  EXPECT_P(dist_op_binary(NULL, DIST_OP_ADD, 0, 0), "dist_op_binary");
  EXPECT_P(dist_op_binary_scalar(NULL, DIST_OP_ADD, 0, 1, 0), "dist_op_binary_scalar");
  EXPECT_P(dist_op_add(NULL, 0, 0), "dist_op_add");
  EXPECT_P(dist_op_sub(NULL, 0, 0), "dist_op_sub");
  EXPECT_P(dist_op_mul(NULL, 0, 0), "dist_op_mul");
  EXPECT_P(dist_op_div(NULL, 0, 0), "dist_op_div");
  EXPECT_P(dist_op_pow(NULL, 0, 0), "dist_op_pow");
  EXPECT_P(dist_op_maximum(NULL, 0, 0), "dist_op_maximum");
  EXPECT_P(dist_op_minimum(NULL, 0, 0), "dist_op_minimum");
  EXPECT_P(dist_op_eq(NULL, 0, 0), "dist_op_eq");
  EXPECT_P(dist_op_ne(NULL, 0, 0), "dist_op_ne");
  EXPECT_P(dist_op_lt(NULL, 0, 0), "dist_op_lt");
  EXPECT_P(dist_op_le(NULL, 0, 0), "dist_op_le");
  EXPECT_P(dist_op_gt(NULL, 0, 0), "dist_op_gt");
  EXPECT_P(dist_op_ge(NULL, 0, 0), "dist_op_ge");
  EXPECT_P(dist_op_logical_and(NULL, 0, 0), "dist_op_logical_and");
  EXPECT_P(dist_op_logical_or(NULL, 0, 0), "dist_op_logical_or");
  EXPECT_P(dist_op_add_scalar(NULL, 0, 1), "dist_op_add_scalar");
  EXPECT_P(dist_op_sub_scalar(NULL, 0, 1), "dist_op_sub_scalar");
  EXPECT_P(dist_op_mul_scalar(NULL, 0, 1), "dist_op_mul_scalar");
  EXPECT_P(dist_op_div_scalar(NULL, 0, 1), "dist_op_div_scalar");
  EXPECT_P(dist_op_pow_scalar(NULL, 0, 1), "dist_op_pow_scalar");
  EXPECT_P(dist_op_eq_scalar(NULL, 0, 1), "dist_op_eq_scalar");
  EXPECT_P(dist_op_scalar_sub(NULL, 1, 0), "dist_op_scalar_sub");
  EXPECT_P(dist_op_scalar_div(NULL, 1, 0), "dist_op_scalar_div");
  EXPECT_P(dist_op_logical_not(NULL, 0), "dist_op_logical_not");
  EXPECT_P(dist_op_where(NULL, 0, 0, 0), "dist_op_where");
  EXPECT_P(dist_op_unary(NULL, DIST_OP_EXP, 0), "dist_op_unary");
  EXPECT_P(dist_op_exp(NULL, 0), "dist_op_exp");
  EXPECT_P(dist_op_log(NULL, 0), "dist_op_log");
  EXPECT_P(dist_op_sqrt(NULL, 0), "dist_op_sqrt");
  EXPECT_P(dist_op_abs(NULL, 0), "dist_op_abs");
  EXPECT_P(dist_op_neg(NULL, 0), "dist_op_neg");
  EXPECT_P(dist_op_relu(NULL, 0), "dist_op_relu");
  EXPECT_P(dist_op_gelu(NULL, 0, 0), "dist_op_gelu");
  EXPECT_P(dist_op_silu(NULL, 0), "dist_op_silu");
  EXPECT_P(dist_op_sigmoid(NULL, 0), "dist_op_sigmoid");
  EXPECT_P(dist_op_tanh(NULL, 0), "dist_op_tanh");
}

Test(api_handles, shaping_and_reducing_builders_refuse_a_null_program) {
  const int64_t one[1] = {0};
  const double v[1] = {1};
  const int xs[1] = {0};
  int values = 0, indices = 0;
  EXPECT_P(dist_op_reduce(NULL, DIST_OP_SUM, 0, one, 1, 0), "dist_op_reduce");
  EXPECT_P(dist_op_sum(NULL, 0, one, 1, 0), "dist_op_sum");
  EXPECT_P(dist_op_mean(NULL, 0, one, 1, 0), "dist_op_mean");
  EXPECT_P(dist_op_max(NULL, 0, one, 1, 0), "dist_op_max");
  EXPECT_P(dist_op_min(NULL, 0, one, 1, 0), "dist_op_min");
  EXPECT_P(dist_op_logsumexp(NULL, 0, 0, 0), "dist_op_logsumexp");
  EXPECT_P(dist_op_softmax(NULL, 0, 0), "dist_op_softmax");
  EXPECT_P(dist_op_log_softmax(NULL, 0, 0), "dist_op_log_softmax");
  EXPECT_P(dist_op_cross_entropy(NULL, 0, 0, -1, DIST_CE_MEAN, 0, 0), "dist_op_cross_entropy");
  EXPECT_P(dist_op_matmul(NULL, 0, 0, 0, 0), "dist_op_matmul");
  EXPECT_P(dist_op_reshape(NULL, 0, one, 1), "dist_op_reshape");
  EXPECT_P(dist_op_transpose(NULL, 0, one, 1), "dist_op_transpose");
  EXPECT_P(dist_op_slice(NULL, 0, one, one, one, NULL, 1), "dist_op_slice");
  EXPECT_P(dist_op_set_slice(NULL, 0, -1, 0, one, one, one, NULL, 1), "dist_op_set_slice");
  EXPECT_P(dist_op_concat(NULL, xs, 1, 0), "dist_op_concat");
  EXPECT_P(dist_op_cast(NULL, 0, DIST_FLOAT32), "dist_op_cast");
  EXPECT_P(dist_op_full(NULL, DIST_FLOAT32, one, 1, 0), "dist_op_full");
  EXPECT_P(dist_op_zeros_like(NULL, 0), "dist_op_zeros_like");
  EXPECT_P(dist_op_ones_like(NULL, 0), "dist_op_ones_like");
  EXPECT_P(dist_op_full_like(NULL, 0, 1), "dist_op_full_like");
  EXPECT_P(dist_op_arange(NULL, 0, 1, 1, DIST_FLOAT32), "dist_op_arange");
  EXPECT_P(dist_op_constant(NULL, DIST_FLOAT32, one, 1, v, 1), "dist_op_constant");
  EXPECT_P(dist_op_topk(NULL, 0, 1, 0, 0, &values, &indices), "dist_op_topk");
  EXPECT_P(dist_op_one_hot(NULL, 0, 2, DIST_FLOAT32), "dist_op_one_hot");
}

Test(api_handles, invocation_accessors_refuse_a_null_invocation) {
  dist_value v;
  expect_named(dist_invocation_n_outputs(NULL), -1, "dist_invocation_n_outputs", "inv");
  expect_named(dist_invocation_n_inputs(NULL), -1, "dist_invocation_n_inputs", "inv");
  expect_named(dist_invocation_local_output(NULL, 0, -1, &v), DIST_EINVAL,
               "dist_invocation_local_output", "inv");
  expect_named(dist_invocation_local_grad(NULL, 0, -1, &v), DIST_EINVAL,
               "dist_invocation_local_grad", "inv");
}

Test(api_handles, layer_builders_and_accessors_refuse_a_null_layer) {
  const int64_t shape[1] = {2};
  const dist_placement pl[1] = {DIST_REPLICATED};
  dist_layer_param_info info;
  void *data = NULL;
  size_t nbytes = 0;
  expect_named(dist_layer_linear(2, 2, 1, 1, NULL), DIST_EINVAL, "dist_layer_linear", "l");
  expect_named(dist_layer_embedding(2, 2, 1, NULL), DIST_EINVAL, "dist_layer_embedding", "l");
  expect_named(dist_layer_layer_norm(2, 1e-5, NULL), DIST_EINVAL, "dist_layer_layer_norm", "l");
  expect_named(dist_layer_rms_norm(2, 1e-5, NULL), DIST_EINVAL, "dist_layer_rms_norm", "l");
  expect_named(dist_layer_sequence(NULL), DIST_EINVAL, "dist_layer_sequence", "l");
  expect_named(dist_layer_program(NULL, 1, NULL), DIST_EINVAL, "dist_layer_program", "l");
  expect_named(dist_layer_set_name(NULL, "n"), DIST_EINVAL, "dist_layer_set_name", "l");
  expect_named(dist_layer_add(NULL, "c", NULL), DIST_EINVAL, "dist_layer_add", "parent");
  expect_named(dist_layer_add_param(NULL, "w", 1, shape, NULL), DIST_EINVAL,
               "dist_layer_add_param", "l");
  expect_named(dist_layer_add_buffer(NULL, "b", 1, shape, NULL), DIST_EINVAL,
               "dist_layer_add_buffer", "l");
  expect_named(dist_layer_set_param(NULL, "w", NULL, 0), DIST_EINVAL, "dist_layer_set_param",
               "l");
  expect_null_named(dist_layer_find(NULL, ""), "dist_layer_find", "l");
  expect_named(dist_layer_n_params(NULL), -1, "dist_layer_n_params", "l");
  expect_named(dist_layer_param_at(NULL, 0, &info), DIST_EINVAL, "dist_layer_param_at", "l");
  expect_named(dist_layer_place_param(NULL, "w", pl, 1), DIST_EINVAL, "dist_layer_place_param",
               "l");
  expect_named(dist_layer_read_param(NULL, NULL, "w", &data, &nbytes), DIST_EINVAL,
               "dist_layer_read_param", "l");
  expect_null_named(dist_layer_param_tensor(NULL, "w"), "dist_layer_param_tensor", "l");
  expect_null_named(dist_layer_grad_tensor(NULL, "w"), "dist_layer_grad_tensor", "l");
  dist_layer_fill_uniform(1, NULL, 4, 1.0);
  expect_named(DIST_EINVAL, DIST_EINVAL, "dist_layer_fill_uniform", "out");
  char name[64];
  expect_named(dist_moe_layer_param_name(NULL, 0, "w1", name, sizeof name), -1,
               "dist_moe_layer_param_name", "l");
  dist_moe_layer_zero_grad(NULL);
  expect_named(DIST_EINVAL, DIST_EINVAL, "dist_moe_layer_zero_grad", "l");
}

/* Layer calls that take no client say why they refused, not only a code. */
Test(api_handles, layer_builders_say_why_they_refuse) {
  dist_layer *l = NULL, *seq = NULL, *child = NULL;
  const int64_t shape[1] = {2};
  float four[4] = {0};
  void *data = NULL;
  size_t nbytes = 0;
  dist_layer_param_info info;
  expect_said(dist_layer_linear(0, 2, 0, 1, &l), DIST_EINVAL, "dist_layer_linear: sizes 0 and 2");
  cr_assert_null(l);
  expect_said(dist_layer_layer_norm(2, -1, &l), DIST_EINVAL, "dist_layer_layer_norm: eps -1");
  cr_assert_eq(dist_layer_linear(2, 2, 0, 1, &l), 0);
  expect_said(dist_layer_set_param(l, "nope", four, sizeof four), DIST_ENOTFOUND,
              "dist_layer_set_param: no parameter 'nope'");
  expect_said(dist_layer_set_param(l, "weight", four, 4), DIST_EMISMATCH,
              "dist_layer_set_param: 'weight' takes 16 bytes, 4 given");
  expect_named(dist_layer_set_param(l, "weight", NULL, sizeof four), DIST_EINVAL,
               "dist_layer_set_param", "data");
  expect_said(dist_layer_set_name(l, "bad name"), DIST_EINVAL,
              "dist_layer_set_name: name 'bad name'");
  expect_said(dist_layer_add_param(l, "weight", 1, shape, NULL), DIST_EINVAL,
              "dist_layer_add_param: the layer has a child or parameter 'weight'");
  expect_said(dist_layer_add_buffer(l, "b.x", 1, shape, NULL), DIST_EINVAL,
              "dist_layer_add_buffer: buffer name 'b.x'");
  expect_said(dist_layer_param_at(l, 5, &info), DIST_ENOTFOUND,
              "dist_layer_param_at: no parameter 5 (the layer has 1)");
  expect_said(dist_layer_read_param(NULL, l, "nope", &data, &nbytes), DIST_ENOTFOUND,
              "dist_layer_read_param: layer has no parameter 'nope'");
  cr_assert_eq(dist_layer_sequence(&seq), 0);
  cr_assert_eq(dist_layer_linear(2, 2, 0, 2, &child), 0);
  cr_assert_eq(dist_layer_add(seq, "fc", l), 0);
  expect_said(dist_layer_add(seq, "fc", child), DIST_EINVAL,
              "dist_layer_add: 'fc': parent has a child or parameter of that name");
  expect_said(dist_layer_add(seq, "other", l), DIST_EINVAL,
              "dist_layer_add: 'other': child already has a parent");
  dist_layer_free(child);
  dist_layer_free(seq);
}

/* dist_placements_format read p[0] of a NULL p given n > 0, and wrote
 * through a NULL buf: both crashed the caller. */
Test(api_handles, placements_format_refuses_a_null_array_with_entries) {
  const dist_placement pl[2] = {DIST_SHARD_DIM(1), DIST_REPLICATED};
  char buf[32] = "unchanged";
  dist_placements_format(NULL, 2, buf, sizeof buf);
  cr_assert_str_eq(buf, "", "the buffer holds no placements");
  expect_named(DIST_EINVAL, DIST_EINVAL, "dist_placements_format", "p");
  dist_placements_format(NULL, 0, buf, sizeof buf);
  cr_assert_str_eq(buf, "[]", "no entries: nothing to read, the empty list");
  dist_placements_format(pl, 2, NULL, 16); /* nowhere to write */
  dist_placements_format(pl, 2, buf, sizeof buf);
  cr_assert_str_eq(buf, "[Shard(1), Replicate()]");
}

/* dist_layer_place_param kept its refusals of a parameter it does not
 * have, or a placement count out of range, for dist_shard_layer alone:
 * called on its own it returned a bare code. Each now says why in
 * dist_errmsg(NULL), a later one too (dist_shard_layer still reports the
 * first, test_shard_layer `a_shard_fn_placing_a_missing_dim*`). */
Test(api_handles, place_param_says_why_it_refuses) {
  dist_layer *l = NULL;
  const dist_placement pl[1] = {DIST_REPLICATED};
  cr_assert_eq(dist_layer_linear(2, 2, 1, 1, &l), 0);
  expect_said(dist_layer_place_param(l, "nope", pl, 1), DIST_ENOTFOUND,
              "dist_layer_place_param: shard_fn placed 'nope', which this Linear layer does "
              "not have");
  expect_said(dist_layer_place_param(l, "weight", pl, 0), DIST_EINVAL,
              "dist_layer_place_param: shard_fn placed 'weight' with 0 placements");
  expect_said(dist_layer_place_param(l, "bias", pl, -1), DIST_EINVAL,
              "dist_layer_place_param: shard_fn placed 'bias' with -1 placements");
  cr_assert_eq(dist_layer_place_param(l, "bias", pl, 1), 0);
  dist_layer_free(l);
}
