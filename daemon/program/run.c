/* Running a program: binds the inputs, checks every shape first, then runs
 * the nodes in order and keeps all values for backward. */
#include <stdlib.h>
#include <string.h>

#include "program_int.h"

static int forward_create(const Dist__V1__ProgramNode *n, distd_tval *const *in,
                          int n_in, distd_tval **out, dist_errbuf *eb) {
  distd_vmeta m, im = {DIST_DTYPE_INVALID, {0, {0}}};
  if (n_in) im = (distd_vmeta){in[0]->dtype, in[0]->shape};
  int rc = distd_infer_node(n, &im, n_in, &m, eb);
  if (rc) return rc;
  switch (n->op) {
  case DIST__V1__OP_KIND__OP_ARANGE:
    return distd_k_arange(m.dtype, n->scalar, n->end, n->step, out, eb);
  case DIST__V1__OP_KIND__OP_CONSTANT: {
    distd_tval *d = NULL;
    dist_shape one = {0, {0}};
    const dist_shape *s = n->n_values == 1 ? &one : &m.shape;
    rc = distd_tval_from_data(DIST_FLOAT64, s, n->values,
                              n->n_values * sizeof(double), &d, eb);
    distd_tval *c = NULL;
    if (!rc) rc = distd_tval_cast(d, m.dtype, &c, eb);
    if (!rc) rc = distd_k_expand(c, &m.shape, out, eb);
    distd_tval_unref(d);
    distd_tval_unref(c);
    return rc;
  }
  case DIST__V1__OP_KIND__OP_ZEROS_LIKE:
    return distd_k_full(m.dtype, &m.shape, 0, out, eb);
  case DIST__V1__OP_KIND__OP_ONES_LIKE:
    return distd_k_full(m.dtype, &m.shape, 1, out, eb);
  default: /* full, full_like */
    return distd_k_full(m.dtype, &m.shape, n->scalar, out, eb);
  }
}

static int forward_shape(const Dist__V1__ProgramNode *n, distd_tval *const *in,
                         int n_in, distd_tval **out, dist_errbuf *eb) {
  dist_shape s;
  distd_slice sl;
  int perm[DIST_MAX_DIMS], a, rc = 0;
  switch (n->op) {
  case DIST__V1__OP_KIND__OP_RESHAPE:
    if ((rc = distd_shape_reshape(&in[0]->shape, n->shape, n->n_shape, &s, eb)))
      return rc;
    return distd_k_reshape(in[0], &s, out, eb);
  case DIST__V1__OP_KIND__OP_TRANSPOSE:
    if ((rc = distd_shape_transpose(&in[0]->shape, n->perm, n->n_perm, perm, &s,
                                    eb)))
      return rc;
    return distd_k_transpose(in[0], perm, out, eb);
  case DIST__V1__OP_KIND__OP_SLICE:
  case DIST__V1__OP_KIND__OP_SET_SLICE:
    if ((rc = distd_slice_resolve(&in[0]->shape, n->axes, n->n_axes, n->starts,
                                  n->n_starts, n->ends, n->n_ends, n->steps,
                                  n->n_steps, &sl, eb)))
      return rc;
    if (n->op == DIST__V1__OP_KIND__OP_SLICE)
      return distd_k_slice(in[0], &sl, out, eb);
    return distd_k_set_slice(in[0], &sl, in[1], out, eb);
  case DIST__V1__OP_KIND__OP_CONCAT:
    if ((rc = distd_norm_axis(n->axis, in[0]->shape.ndim, &a, eb))) return rc;
    return distd_k_concat(in, n_in, a, out, eb);
  case DIST__V1__OP_KIND__OP_CAST:
    return distd_tval_cast(in[0], (dist_dtype)n->dtype, out, eb);
  case DIST__V1__OP_KIND__OP_TOPK:
    if ((rc = distd_norm_axis(n->axis, in[0]->shape.ndim, &a, eb))) return rc;
    return distd_k_topk(in[0], n->k, a, n->smallest, &out[0], &out[1], eb);
  case DIST__V1__OP_KIND__OP_ONE_HOT:
    return distd_k_one_hot(in[0], n->num_classes,
                           distd_node_dtype(n, DIST_FLOAT32), out, eb);
  default:
    return forward_create(n, in, n_in, out, eb);
  }
}

int distd_forward_node(const Dist__V1__ProgramNode *n, distd_tval *const *in,
                       int n_in, distd_tval **out, dist_errbuf *eb) {
  distd_op op = n->op;
  if (op <= DIST__V1__OP_KIND__OP_LOGICAL_OR && op != 0 && n_in == 2)
    return distd_k_binary(op, in[0], in[1], out, eb);
  switch (op) {
  case DIST__V1__OP_KIND__OP_LOGICAL_NOT:
    return distd_k_logical_not(in[0], out, eb);
  case DIST__V1__OP_KIND__OP_WHERE:
    return distd_k_where(in[0], in[1], in[2], out, eb);
  case DIST__V1__OP_KIND__OP_SUM:
  case DIST__V1__OP_KIND__OP_MEAN:
  case DIST__V1__OP_KIND__OP_MAX:
  case DIST__V1__OP_KIND__OP_MIN:
    return distd_k_reduce(op, in[0], n->axes, n->n_axes, n->keepdim, out, eb);
  case DIST__V1__OP_KIND__OP_LOGSUMEXP:
  case DIST__V1__OP_KIND__OP_SOFTMAX:
  case DIST__V1__OP_KIND__OP_LOG_SOFTMAX:
    return distd_k_softmax(op, in[0], n->axis, n->keepdim, out, eb);
  case DIST__V1__OP_KIND__OP_CROSS_ENTROPY: {
    distd_ce_opts o = {n->use_ignore_index, n->ignore_index, n->reduction};
    return distd_k_cross_entropy(in[0], in[1], n_in > 2 ? in[2] : NULL, &o,
                                 out, eb);
  }
  case DIST__V1__OP_KIND__OP_MATMUL:
    return distd_k_matmul(in[0], in[1], n->trans_a, n->trans_b, out, eb);
  default:
    if (op >= DIST__V1__OP_KIND__OP_EXP && op <= DIST__V1__OP_KIND__OP_TANH)
      return distd_k_unary(op, n->approximate, in[0], out, eb);
    return forward_shape(n, in, n_in, out, eb);
  }
}

/* --------------------------------------------------------------- run */

static int coord_of(const Dist__V1__ProgramInput *in, size_t i, uint32_t rank,
                    int64_t *coord, dist_errbuf *eb) {
  const Dist__V1__Mesh *m = in->mesh;
  for (size_t r = 0; r < m->n_ranks; r++) {
    if (m->ranks[r] != rank) continue;
    size_t idx = r;
    for (size_t d = m->n_shape; d-- > 0;) {
      if (d == in->mesh_dim) {
        *coord = (int64_t)(idx % m->shape[d]);
        return 0;
      }
      idx /= m->shape[d];
    }
  }
  return dist_fail(eb, DIST_EINVAL, "input %zu: rank %u is not in the mesh",
                   i, rank);
}

static int bind_inputs(distd_invocation *inv, distd_tval *const *inputs,
                       dist_errbuf *eb) {
  const Dist__V1__Program *pb = inv->prog->pb;
  for (size_t i = 0; i < pb->n_inputs; i++) {
    const Dist__V1__ProgramInput *in = pb->inputs[i];
    int64_t v = inv->env.rank;
    int rc;
    switch (in->kind) {
    case DIST__V1__PROGRAM_INPUT__KIND__RANK:
      rc = distd_tval_scalar(DIST_INT64, (double)v, &inv->values[i], eb);
      break;
    case DIST__V1__PROGRAM_INPUT__KIND__COORD:
      rc = coord_of(in, i, inv->env.rank, &v, eb);
      if (!rc) rc = distd_tval_scalar(DIST_INT64, (double)v, &inv->values[i], eb);
      break;
    default:
      rc = inputs[i] ? 0 : dist_fail(eb, DIST_EINVAL, "input %zu not given", i);
      inv->values[i] = distd_tval_ref(inputs[i]);
      break;
    }
    if (rc) return rc;
  }
  return 0;
}

static int check_shapes(distd_invocation *inv, dist_errbuf *eb) {
  const distd_program *p = inv->prog;
  size_t n = p->pb->n_inputs;
  distd_vmeta *m = calloc(n + 1, sizeof *m);
  if (!m) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    m[i] = (distd_vmeta){inv->values[i]->dtype, inv->values[i]->shape};
  int rc = distd_program_infer(p, m, NULL, eb);
  free(m);
  return rc;
}

static int run_nodes(distd_invocation *inv, dist_errbuf *eb) {
  const Dist__V1__Program *pb = inv->prog->pb;
  for (size_t i = 0; i < pb->n_nodes; i++) {
    const Dist__V1__ProgramNode *n = pb->nodes[i];
    distd_tval *in[DISTD_MAX_NODE_INPUTS + 1];
    int n_in, rc = distd_node_inputs(n, inv->values, in, &n_in, eb);
    if (!rc) {
      rc = distd_forward_node(n, in, n_in,
                              inv->values + inv->prog->node_first_value[i], eb);
      for (int k = 0; k < n_in; k++) distd_tval_unref(in[k]);
    }
    if (rc) return distd_node_fail(eb, rc, i, n);
  }
  return 0;
}

int distd_program_run(distd_program *p, const distd_run_env *env,
                      distd_tval *const *inputs, distd_invocation **out,
                      dist_errbuf *eb) {
  distd_invocation *inv = calloc(1, sizeof *inv);
  const Dist__V1__Program *pb = p->pb;
  int rc = 0;
  *out = NULL;
  if (!inv || !(inv->values = calloc(p->n_values + 1, sizeof(distd_tval *))) ||
      !(inv->outputs = calloc(pb->n_outputs + 1, sizeof(distd_tval *)))) {
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory");
    goto out;
  }
  inv->prog = distd_program_ref(p);
  inv->env = *env;
  if ((rc = bind_inputs(inv, inputs, eb)) || (rc = check_shapes(inv, eb)) ||
      (rc = run_nodes(inv, eb)))
    goto out;
  for (size_t i = 0; i < pb->n_outputs; i++)
    inv->outputs[i] = distd_tval_ref(inv->values[pb->outputs[i]]);
  *out = inv;
  inv = NULL;
out:
  distd_invocation_release(inv);
  return rc;
}

size_t distd_invocation_n_outputs(const distd_invocation *inv) {
  return inv->prog->pb->n_outputs;
}

distd_program *distd_invocation_program(const distd_invocation *inv) {
  return inv->prog;
}

distd_tval *distd_invocation_output(const distd_invocation *inv, size_t i) {
  return i < inv->prog->pb->n_outputs ? inv->outputs[i] : NULL;
}

distd_tval *distd_invocation_input_grad(const distd_invocation *inv,
                                        size_t i) {
  if (!inv->input_grads || i >= inv->prog->pb->n_inputs) return NULL;
  return inv->input_grads[i];
}

static void drop_values(distd_invocation *inv) {
  if (!inv->values) return;
  for (size_t i = 0; i < inv->prog->n_values; i++)
    distd_tval_unref(inv->values[i]);
  free(inv->values);
  inv->values = NULL;
}

void distd_invocation_release(distd_invocation *inv) {
  if (!inv) return;
  if (inv->prog) {
    drop_values(inv);
    for (size_t i = 0; inv->outputs && i < inv->prog->pb->n_outputs; i++)
      distd_tval_unref(inv->outputs[i]);
    for (size_t i = 0; inv->input_grads && i < inv->prog->pb->n_inputs; i++)
      distd_tval_unref(inv->input_grads[i]);
  }
  free(inv->values);
  free(inv->outputs);
  free(inv->input_grads);
  distd_program_free(inv->prog);
  free(inv);
}

void distd_invocation_drop_values(distd_invocation *inv) { drop_values(inv); }
