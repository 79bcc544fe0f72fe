/* Shape and dtype inference of one node: the same rules the kernels apply,
 * checked before anything runs. Messages leave out the node prefix (the
 * caller adds it). */
#include <math.h>
#include <string.h>

#include "program_int.h"

static int fail_dtypes(dist_errbuf *eb, dist_dtype a, dist_dtype b) {
  return dist_fail(eb, DIST_EMISMATCH, "dtypes differ: %s vs %s",
                   dist_dtype_name(a), dist_dtype_name(b));
}

static int need_float(dist_errbuf *eb, dist_dtype dt, const char *what) {
  if (dist_dtype_is_float(dt)) return 0;
  return dist_fail(eb, DIST_EINVAL, "%s needs a float dtype, got %s", what,
                   dist_dtype_name(dt));
}

static int is_int(dist_dtype dt) {
  return dt == DIST_INT8 || dt == DIST_UINT8 || dt == DIST_INT32 ||
         dt == DIST_INT64;
}

static int infer_elementwise(const Dist__V1__ProgramNode *n,
                             const distd_vmeta *in, int n_in, distd_vmeta *out,
                             dist_errbuf *eb) {
  distd_op op = n->op;
  if (op == DIST__V1__OP_KIND__OP_LOGICAL_NOT) {
    *out = (distd_vmeta){DIST_BOOL, in[0].shape};
    return 0;
  }
  if (op == DIST__V1__OP_KIND__OP_WHERE) {
    dist_shape s1;
    if (in[0].dtype != DIST_BOOL)
      return dist_fail(eb, DIST_EINVAL, "condition must be bool, got %s",
                       dist_dtype_name(in[0].dtype));
    if (in[1].dtype != in[2].dtype)
      return fail_dtypes(eb, in[1].dtype, in[2].dtype);
    out->dtype = in[1].dtype;
    int rc = distd_shape_broadcast(&in[0].shape, &in[1].shape, &s1, eb);
    return rc ? rc : distd_shape_broadcast(&s1, &in[2].shape, &out->shape, eb);
  }
  if (n_in == 1) { /* unary math */
    int int_ok = op == DIST__V1__OP_KIND__OP_ABS ||
                 op == DIST__V1__OP_KIND__OP_NEG ||
                 op == DIST__V1__OP_KIND__OP_RELU;
    if (!(int_ok && is_int(in[0].dtype)) &&
        need_float(eb, in[0].dtype, distd_op_name(op)))
      return DIST_EINVAL;
    *out = in[0];
    return 0;
  }
  int logical = distd_op_is_logical(op);
  if (!logical && in[0].dtype != in[1].dtype)
    return fail_dtypes(eb, in[0].dtype, in[1].dtype);
  out->dtype = logical || distd_op_is_compare(op) ? DIST_BOOL : in[0].dtype;
  return distd_shape_broadcast(&in[0].shape, &in[1].shape, &out->shape, eb);
}

static int infer_reduce(const Dist__V1__ProgramNode *n, const distd_vmeta *in,
                        distd_vmeta *out, dist_errbuf *eb) {
  distd_op op = n->op;
  if (op == DIST__V1__OP_KIND__OP_SUM || op == DIST__V1__OP_KIND__OP_MEAN ||
      op == DIST__V1__OP_KIND__OP_MAX || op == DIST__V1__OP_KIND__OP_MIN) {
    if (op == DIST__V1__OP_KIND__OP_MEAN && need_float(eb, in->dtype, "mean"))
      return DIST_EINVAL;
    out->dtype = distd_reduce_out_dtype(op, in->dtype);
    return distd_shape_reduce(&in->shape, n->axes, n->n_axes, n->keepdim,
                              &out->shape, NULL, eb);
  }
  int a;
  if (need_float(eb, in->dtype, distd_op_name(op))) return DIST_EINVAL;
  int rc = distd_norm_axis(n->axis, in->shape.ndim, &a, eb);
  if (rc) return rc;
  *out = *in;
  if (op != DIST__V1__OP_KIND__OP_LOGSUMEXP) return 0;
  int64_t ax = a;
  return distd_shape_reduce(&in->shape, &ax, 1, n->keepdim, &out->shape, NULL,
                            eb);
}

/* Bounded like every tensor's shape (dist_shape_make): an element count
 * that wraps would allocate a few elements for a huge shape. */
static int shape_from_attr(const Dist__V1__ProgramNode *n, dist_shape *s,
                           dist_errbuf *eb) {
  return dist_shape_make((int)n->n_shape, n->shape, s, eb);
}

static int integral(double v) { return v == floor(v); }

static int infer_create(const Dist__V1__ProgramNode *n, const distd_vmeta *in,
                        distd_vmeta *out, dist_errbuf *eb) {
  switch (n->op) {
  case DIST__V1__OP_KIND__OP_FULL:
    out->dtype = distd_node_dtype(n, DIST_FLOAT32);
    return shape_from_attr(n, &out->shape, eb);
  case DIST__V1__OP_KIND__OP_CONSTANT: {
    out->dtype = distd_node_dtype(n, DIST_FLOAT32);
    int rc = shape_from_attr(n, &out->shape, eb);
    int64_t numel = dist_shape_numel(&out->shape);
    if (!rc && n->n_values != 1 && (int64_t)n->n_values != numel)
      rc = dist_fail(eb, DIST_EINVAL, "%zu values for %lld elements",
                     n->n_values, (long long)numel);
    return rc;
  }
  case DIST__V1__OP_KIND__OP_ARANGE: {
    int64_t cnt;
    int ints = integral(n->scalar) && integral(n->end) && integral(n->step);
    out->dtype = distd_node_dtype(n, ints ? DIST_INT64 : DIST_FLOAT32);
    int rc = distd_arange_count(n->scalar, n->end, n->step, &cnt, eb);
    out->shape = (dist_shape){1, {cnt}};
    return rc;
  }
  default: /* zeros_like, ones_like, full_like */
    out->dtype = distd_node_dtype(n, in->dtype);
    out->shape = in->shape;
    return 0;
  }
}

static int infer_slice(const Dist__V1__ProgramNode *n, const distd_vmeta *in,
                       int n_in, distd_vmeta *out, dist_errbuf *eb) {
  distd_slice s;
  dist_shape ss, bs;
  int rc = distd_slice_resolve(&in[0].shape, n->axes, n->n_axes, n->starts,
                               n->n_starts, n->ends, n->n_ends, n->steps,
                               n->n_steps, &s, eb);
  if (rc) return rc;
  distd_slice_shape(&s, &ss);
  if (n->op == DIST__V1__OP_KIND__OP_SLICE) {
    *out = (distd_vmeta){in[0].dtype, ss};
    return 0;
  }
  (void)n_in;
  if (in[1].dtype != in[0].dtype) return fail_dtypes(eb, in[0].dtype, in[1].dtype);
  if (distd_shape_broadcast(&in[1].shape, &ss, &bs, NULL) ||
      !dist_shape_equal(&bs, &ss)) {
    char sv[128], sl[128];
    dist_shape_format(&in[1].shape, sv, sizeof sv);
    dist_shape_format(&ss, sl, sizeof sl);
    return dist_fail(eb, DIST_EMISMATCH, "value %s does not broadcast to the "
                     "slice %s", sv, sl);
  }
  *out = in[0];
  return 0;
}

static int infer_shape_op(const Dist__V1__ProgramNode *n, const distd_vmeta *in,
                          int n_in, distd_vmeta *out, dist_errbuf *eb) {
  int perm[DIST_MAX_DIMS];
  switch (n->op) {
  case DIST__V1__OP_KIND__OP_RESHAPE:
    out->dtype = in->dtype;
    return distd_shape_reshape(&in->shape, n->shape, n->n_shape, &out->shape,
                               eb);
  case DIST__V1__OP_KIND__OP_TRANSPOSE:
    out->dtype = in->dtype;
    return distd_shape_transpose(&in->shape, n->perm, n->n_perm, perm,
                                 &out->shape, eb);
  case DIST__V1__OP_KIND__OP_CONCAT: {
    const dist_shape *shapes[DISTD_MAX_NODE_INPUTS];
    for (int i = 0; i < n_in; i++) {
      if (in[i].dtype != in[0].dtype)
        return fail_dtypes(eb, in[0].dtype, in[i].dtype);
      shapes[i] = &in[i].shape;
    }
    out->dtype = in->dtype;
    return distd_shape_concat(shapes, n_in, n->axis, &out->shape, eb);
  }
  case DIST__V1__OP_KIND__OP_CAST:
    *out = (distd_vmeta){(dist_dtype)n->dtype, in->shape};
    return 0;
  case DIST__V1__OP_KIND__OP_TOPK: {
    int a;
    int rc = distd_norm_axis(n->axis, in->shape.ndim, &a, eb);
    if (rc) return rc;
    if (n->k < 0 || n->k > in->shape.dims[a])
      return dist_fail(eb, DIST_EINVAL, "k = %lld out of range [0, %lld]",
                       (long long)n->k, (long long)in->shape.dims[a]);
    if (in->dtype == DIST_BOOL)
      return dist_fail(eb, DIST_EINVAL, "topk of bool values");
    out[0] = *in;
    out[0].shape.dims[a] = n->k;
    out[1] = (distd_vmeta){DIST_INT64, out[0].shape};
    return 0;
  }
  case DIST__V1__OP_KIND__OP_ONE_HOT:
    if (!is_int(in->dtype))
      return dist_fail(eb, DIST_EINVAL, "needs an integer input, got %s",
                       dist_dtype_name(in->dtype));
    if (n->num_classes <= 0 || in->shape.ndim >= DIST_MAX_DIMS)
      return dist_fail(eb, DIST_EINVAL, "num_classes is %lld",
                       (long long)n->num_classes);
    out->dtype = distd_node_dtype(n, DIST_FLOAT32);
    out->shape = in->shape;
    out->shape.dims[out->shape.ndim++] = n->num_classes;
    return 0;
  default:
    return infer_slice(n, in, n_in, out, eb);
  }
}

int distd_infer_node(const Dist__V1__ProgramNode *n, const distd_vmeta *in,
                     int n_in, distd_vmeta *out, dist_errbuf *eb) {
  distd_op op = n->op;
  if (op <= DIST__V1__OP_KIND__OP_TANH)
    return infer_elementwise(n, in, n_in, out, eb);
  if (op <= DIST__V1__OP_KIND__OP_LOG_SOFTMAX)
    return infer_reduce(n, in, out, eb);
  if (op == DIST__V1__OP_KIND__OP_CROSS_ENTROPY) {
    distd_ce_opts o = {n->use_ignore_index, n->ignore_index, n->reduction};
    out->dtype = in[0].dtype;
    return distd_shape_cross_entropy(&in[0], &in[1], n_in > 2 ? &in[2] : NULL,
                                     &o, &out->shape, eb);
  }
  if (op == DIST__V1__OP_KIND__OP_MATMUL) {
    if (in[0].dtype != in[1].dtype)
      return fail_dtypes(eb, in[0].dtype, in[1].dtype);
    if (in[0].dtype == DIST_BOOL)
      return dist_fail(eb, DIST_EINVAL, "bool operands need a cast first");
    out->dtype = in[0].dtype;
    return distd_shape_matmul(&in[0].shape, &in[1].shape, n->trans_a,
                              n->trans_b, &out->shape, eb);
  }
  if (op == DIST__V1__OP_KIND__OP_FULL || op == DIST__V1__OP_KIND__OP_CONSTANT ||
      op == DIST__V1__OP_KIND__OP_ARANGE ||
      (op >= DIST__V1__OP_KIND__OP_ZEROS_LIKE &&
       op <= DIST__V1__OP_KIND__OP_FULL_LIKE))
    return infer_create(n, in, out, eb);
  return infer_shape_op(n, in, n_in, out, eb);
}

/* Here rather than in backward.c: libdist links the inference, not the
 * kernels, and gives an outsider's gradient handles by this rule. */
int distd_input_wants_grad(const Dist__V1__ProgramInput *in, dist_dtype dt) {
  return in->kind <= DIST__V1__PROGRAM_INPUT__KIND__VALUE && !in->no_grad &&
         dist_dtype_is_float(dt);
}
