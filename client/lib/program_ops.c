/* The op builders of a LocalLayer program (dist_op_*): each checks its
 * arguments and adds one node with its attributes (dist.h, "LocalLayer"). */
#include <stdlib.h>
#include <string.h>

#include "program_internal.h"

/* A count the caller gives (operands, dims, axes, values): a negative one
 * was taken as 0, so reshape(x, shape, -1) made a scalar, and concat's
 * overran the heap. */
static int64_t *dup_i64(const int64_t *v, int n) {
  int64_t *d = malloc(sizeof(int64_t) * ((size_t)n + 1));
  if (d && n > 0) memcpy(d, v, sizeof(int64_t) * (size_t)n);
  return d;
}

/* The generic builders take an op kind of their own family only. The
 * daemons cannot refuse another: with one operand, add is add(x, 0) and a
 * reduce of kind add would run as that, returning x. */
static int is_binary_kind(dist_op_kind op) {
  return (op >= DIST_OP_ADD && op <= DIST_OP_MINIMUM) ||
         (op >= DIST_OP_EQ && op <= DIST_OP_LOGICAL_OR);
}

static int is_unary_kind(dist_op_kind op) {
  return op == DIST_OP_LOGICAL_NOT || (op >= DIST_OP_EXP && op <= DIST_OP_TANH);
}

static int is_reduce_kind(dist_op_kind op) {
  return op >= DIST_OP_SUM && op <= DIST_OP_MIN;
}

static const char binary_family[] =
    "a binary elementwise op (DIST_OP_ADD ... DIST_OP_LOGICAL_OR)";

static int check_kind(dist_program *p, const char *builder, dist_op_kind op,
                      int (*fits)(dist_op_kind), const char *family) {
  if (p->err || fits(op)) return p->err;
  return dist_prog_fail(p, DIST_EINVAL, "%s: op kind %d is not %s", builder, (int)op,
                        family);
}

int dist_op_binary(dist_program *p, dist_op_kind op, int a, int b) {
  if (!p) return dist_null_handle(__func__, "p");
  int ins[2] = {a, b};
  if (check_kind(p, "dist_op_binary", op, is_binary_kind, binary_family))
    return p->err;
  return dist_prog_add_node(p, op, ins, 2, NULL);
}

int dist_op_binary_scalar(dist_program *p, dist_op_kind op, int a,
                          double scalar, int scalar_first) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  if (check_kind(p, "dist_op_binary_scalar", op, is_binary_kind, binary_family))
    return p->err;
  int id = dist_prog_add_node(p, op, &a, 1, &n);
  if (id >= 0) {
    n->pb.scalar = scalar;
    n->pb.scalar_first = scalar_first != 0;
  }
  return id;
}

#define BINARY(fn, OP)                                                  \
  int dist_op_##fn(dist_program *p, int a, int b) {                     \
    if (!p) return dist_null_handle(__func__, "p");                     \
    return dist_op_binary(p, DIST_OP_##OP, a, b);                       \
  }
BINARY(add, ADD)
BINARY(sub, SUB)
BINARY(mul, MUL)
BINARY(div, DIV)
BINARY(pow, POW)
BINARY(maximum, MAXIMUM)
BINARY(minimum, MINIMUM)
BINARY(eq, EQ)
BINARY(ne, NE)
BINARY(lt, LT)
BINARY(le, LE)
BINARY(gt, GT)
BINARY(ge, GE)
BINARY(logical_and, LOGICAL_AND)
BINARY(logical_or, LOGICAL_OR)
#undef BINARY

#define WITH_SCALAR(fn, OP)                                             \
  int dist_op_##fn##_scalar(dist_program *p, int a, double s) {         \
    if (!p) return dist_null_handle(__func__, "p");                     \
    return dist_op_binary_scalar(p, DIST_OP_##OP, a, s, 0);             \
  }
WITH_SCALAR(add, ADD)
WITH_SCALAR(sub, SUB)
WITH_SCALAR(mul, MUL)
WITH_SCALAR(div, DIV)
WITH_SCALAR(pow, POW)
WITH_SCALAR(eq, EQ)
#undef WITH_SCALAR

int dist_op_scalar_sub(dist_program *p, double s, int a) {
  if (!p) return dist_null_handle(__func__, "p");
  return dist_op_binary_scalar(p, DIST_OP_SUB, a, s, 1);
}

int dist_op_scalar_div(dist_program *p, double s, int a) {
  if (!p) return dist_null_handle(__func__, "p");
  return dist_op_binary_scalar(p, DIST_OP_DIV, a, s, 1);
}

int dist_op_logical_not(dist_program *p, int a) {
  if (!p) return dist_null_handle(__func__, "p");
  return dist_prog_add_node(p, DIST_OP_LOGICAL_NOT, &a, 1, NULL);
}

int dist_op_where(dist_program *p, int cond, int a, int b) {
  if (!p) return dist_null_handle(__func__, "p");
  int ins[3] = {cond, a, b};
  return dist_prog_add_node(p, DIST_OP_WHERE, ins, 3, NULL);
}

int dist_op_unary(dist_program *p, dist_op_kind op, int x) {
  if (!p) return dist_null_handle(__func__, "p");
  if (check_kind(p, "dist_op_unary", op, is_unary_kind,
                 "a unary op (DIST_OP_EXP ... DIST_OP_TANH, DIST_OP_LOGICAL_NOT)"))
    return p->err;
  return dist_prog_add_node(p, op, &x, 1, NULL);
}

#define UNARY(fn, OP)                                                   \
  int dist_op_##fn(dist_program *p, int x) {                            \
    if (!p) return dist_null_handle(__func__, "p");                     \
    return dist_op_unary(p, DIST_OP_##OP, x);                           \
  }
UNARY(exp, EXP)
UNARY(log, LOG)
UNARY(sqrt, SQRT)
UNARY(abs, ABS)
UNARY(neg, NEG)
UNARY(relu, RELU)
UNARY(silu, SILU)
UNARY(sigmoid, SIGMOID)
UNARY(tanh, TANH)
#undef UNARY

int dist_op_gelu(dist_program *p, int x, int approximate) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  int id = dist_prog_add_node(p, DIST_OP_GELU, &x, 1, &n);
  if (id >= 0) n->pb.approximate = approximate != 0;
  return id;
}

int dist_op_reduce(dist_program *p, dist_op_kind op, int x,
                   const int64_t *axes, int naxes, int keepdim) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  if (check_kind(p, "dist_op_reduce", op, is_reduce_kind,
                 "a reduction (DIST_OP_SUM, DIST_OP_MEAN, DIST_OP_MAX or DIST_OP_MIN)"))
    return p->err;
  if (dist_prog_check_list(p, "dist_op_reduce", "axes", "axes", axes, naxes, 0)) return p->err;
  int id = dist_prog_add_node(p, op, &x, 1, &n);
  if (id < 0) return id;
  n->pb.axes = dup_i64(axes, naxes);
  n->pb.n_axes = naxes > 0 ? (size_t)naxes : 0;
  n->pb.keepdim = keepdim != 0;
  return id;
}

#define REDUCE(fn, OP)                                                  \
  int dist_op_##fn(dist_program *p, int x, const int64_t *axes,         \
                   int naxes, int keepdim) {                            \
    if (!p) return dist_null_handle(__func__, "p");                     \
    return dist_op_reduce(p, DIST_OP_##OP, x, axes, naxes, keepdim);    \
  }
REDUCE(sum, SUM)
REDUCE(mean, MEAN)
REDUCE(max, MAX)
REDUCE(min, MIN)
#undef REDUCE

static int axis_op(dist_program *p, int op, int x, int64_t axis, int keepdim) {
  bnode *n = NULL;
  int id = dist_prog_add_node(p, op, &x, 1, &n);
  if (id >= 0) {
    n->pb.axis = axis;
    n->pb.keepdim = keepdim != 0;
  }
  return id;
}

int dist_op_logsumexp(dist_program *p, int x, int64_t axis, int keepdim) {
  if (!p) return dist_null_handle(__func__, "p");
  return axis_op(p, DIST__V1__OP_KIND__OP_LOGSUMEXP, x, axis, keepdim);
}

int dist_op_softmax(dist_program *p, int x, int64_t axis) {
  if (!p) return dist_null_handle(__func__, "p");
  return axis_op(p, DIST__V1__OP_KIND__OP_SOFTMAX, x, axis, 0);
}

int dist_op_log_softmax(dist_program *p, int x, int64_t axis) {
  if (!p) return dist_null_handle(__func__, "p");
  return axis_op(p, DIST__V1__OP_KIND__OP_LOG_SOFTMAX, x, axis, 0);
}

int dist_op_cross_entropy(dist_program *p, int logits, int labels, int mask,
                          dist_ce_reduction reduction, int use_ignore_index,
                          int64_t ignore_index) {
  if (!p) return dist_null_handle(__func__, "p");
  int ins[3] = {logits, labels, mask};
  bnode *n = NULL;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_CROSS_ENTROPY, ins,
                              mask >= 0 ? 3 : 2, &n);
  if (id < 0) return id;
  n->pb.reduction = (Dist__V1__Reduction)reduction;
  n->pb.use_ignore_index = use_ignore_index != 0;
  n->pb.ignore_index = ignore_index;
  return id;
}

int dist_op_matmul(dist_program *p, int a, int b, int trans_a, int trans_b) {
  if (!p) return dist_null_handle(__func__, "p");
  int ins[2] = {a, b};
  bnode *n = NULL;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_MATMUL, ins, 2, &n);
  if (id >= 0) {
    n->pb.trans_a = trans_a != 0;
    n->pb.trans_b = trans_b != 0;
  }
  return id;
}

int dist_op_reshape(dist_program *p, int x, const int64_t *shape, int ndim) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  if (dist_prog_check_list(p, "dist_op_reshape", "dims", "shape", shape, ndim, 0))
    return p->err;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_RESHAPE, &x, 1, &n);
  if (id < 0) return id;
  n->pb.shape = dup_i64(shape, ndim);
  n->pb.n_shape = (size_t)ndim;
  return id;
}

int dist_op_transpose(dist_program *p, int x, const int64_t *perm, int nperm) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  if (dist_prog_check_list(p, "dist_op_transpose", "perm entries", "perm", perm, nperm, 0))
    return p->err;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_TRANSPOSE, &x, 1, &n);
  if (id < 0) return id;
  n->pb.perm = dup_i64(perm, nperm);
  n->pb.n_perm = (size_t)nperm;
  return id;
}

static void set_slice_attrs(bnode *n, const int64_t *axes,
                            const int64_t *starts, const int64_t *ends,
                            const int64_t *steps, int k) {
  size_t m = (size_t)k; /* checked by the callers */
  n->pb.axes = dup_i64(axes, k);
  n->pb.starts = dup_i64(starts, k);
  n->pb.ends = dup_i64(ends, k);
  n->pb.n_axes = n->pb.n_starts = n->pb.n_ends = m;
  if (steps) {
    n->pb.steps = dup_i64(steps, k);
    n->pb.n_steps = m;
  }
}

/* The lists of a slice, k entries each (steps may be NULL: 1). */
static int check_slice(dist_program *p, const char *op, const int64_t *axes,
                       const int64_t *starts, const int64_t *ends, int k) {
  if (dist_prog_check_list(p, op, "axes", "axes", axes, k, 0) ||
      dist_prog_check_list(p, op, "starts", "starts", starts, k, 0))
    return p->err;
  return dist_prog_check_list(p, op, "ends", "ends", ends, k, 0);
}

int dist_op_slice(dist_program *p, int x, const int64_t *axes,
                  const int64_t *starts, const int64_t *ends,
                  const int64_t *steps, int k) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  if (check_slice(p, "dist_op_slice", axes, starts, ends, k)) return p->err;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_SLICE, &x, 1, &n);
  if (id >= 0) set_slice_attrs(n, axes, starts, ends, steps, k);
  return id;
}

int dist_op_set_slice(dist_program *p, int x, int v, double scalar,
                      const int64_t *axes, const int64_t *starts,
                      const int64_t *ends, const int64_t *steps, int k) {
  if (!p) return dist_null_handle(__func__, "p");
  int ins[2] = {x, v};
  bnode *n = NULL;
  if (check_slice(p, "dist_op_set_slice", axes, starts, ends, k)) return p->err;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_SET_SLICE, ins, v >= 0 ? 2 : 1, &n);
  if (id < 0) return id;
  n->pb.scalar = scalar;
  set_slice_attrs(n, axes, starts, ends, steps, k);
  return id;
}

int dist_op_concat(dist_program *p, const int *xs, int count, int64_t axis) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  if (dist_prog_check_list(p, "dist_op_concat", "operands", "xs", xs, count, 1)) return p->err;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_CONCAT, xs, count, &n);
  if (id >= 0) n->pb.axis = axis;
  return id;
}

int dist_op_cast(dist_program *p, int x, dist_dtype dt) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_CAST, &x, 1, &n);
  if (id >= 0) n->pb.dtype = (Dist__V1__DType)dt;
  return id;
}

static int creation(dist_program *p, int op, const int *x, dist_dtype dt,
                    const int64_t *shape, int ndim, double value) {
  bnode *n = NULL;
  const char *builder = op == DIST__V1__OP_KIND__OP_CONSTANT ? "dist_op_constant"
                                                            : "dist_op_full";
  if (dist_prog_check_list(p, builder, "dims", "shape", shape, ndim, 0)) return p->err;
  int id = dist_prog_add_node(p, op, x, x ? 1 : 0, &n);
  if (id < 0) return id;
  n->pb.dtype = (Dist__V1__DType)dt;
  n->pb.scalar = value;
  if (shape || ndim > 0) {
    n->pb.shape = dup_i64(shape, ndim);
    n->pb.n_shape = (size_t)ndim;
  }
  return id;
}

int dist_op_full(dist_program *p, dist_dtype dt, const int64_t *shape,
                 int ndim, double value) {
  if (!p) return dist_null_handle(__func__, "p");
  return creation(p, DIST__V1__OP_KIND__OP_FULL, NULL, dt, shape, ndim, value);
}

int dist_op_zeros_like(dist_program *p, int x) {
  if (!p) return dist_null_handle(__func__, "p");
  return creation(p, DIST__V1__OP_KIND__OP_ZEROS_LIKE, &x, 0, NULL, 0, 0);
}

int dist_op_ones_like(dist_program *p, int x) {
  if (!p) return dist_null_handle(__func__, "p");
  return creation(p, DIST__V1__OP_KIND__OP_ONES_LIKE, &x, 0, NULL, 0, 0);
}

int dist_op_full_like(dist_program *p, int x, double value) {
  if (!p) return dist_null_handle(__func__, "p");
  return creation(p, DIST__V1__OP_KIND__OP_FULL_LIKE, &x, 0, NULL, 0, value);
}

int dist_op_arange(dist_program *p, double start, double end, double step,
                   dist_dtype dt) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_ARANGE, NULL, 0, &n);
  if (id < 0) return id;
  n->pb.scalar = start;
  n->pb.end = end;
  n->pb.step = step;
  n->pb.dtype = (Dist__V1__DType)dt;
  return id;
}

int dist_op_constant(dist_program *p, dist_dtype dt, const int64_t *shape,
                     int ndim, const double *values, int nvalues) {
  if (!p) return dist_null_handle(__func__, "p");
  if (dist_prog_check_list(p, "dist_op_constant", "values", "values", values, nvalues, 0))
    return p->err;
  int id = creation(p, DIST__V1__OP_KIND__OP_CONSTANT, NULL, dt, shape, ndim, 0);
  if (id < 0) return id;
  bnode *n = p->nodes[p->values[id].node];
  n->pb.values = malloc(sizeof(double) * ((size_t)(nvalues > 0 ? nvalues : 0) + 1));
  if (nvalues > 0) memcpy(n->pb.values, values, sizeof(double) * (size_t)nvalues);
  n->pb.n_values = nvalues > 0 ? (size_t)nvalues : 0;
  return id;
}

int dist_op_topk(dist_program *p, int x, int64_t k, int64_t axis,
                 int smallest, int *values, int *indices) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_TOPK, &x, 1, &n);
  if (id < 0) return id;
  n->pb.k = k;
  n->pb.axis = axis;
  n->pb.smallest = smallest != 0;
  if (values) *values = id;
  if (indices) *indices = id + 1;
  return id;
}

int dist_op_one_hot(dist_program *p, int x, int64_t num_classes,
                    dist_dtype dt) {
  if (!p) return dist_null_handle(__func__, "p");
  bnode *n = NULL;
  int id = dist_prog_add_node(p, DIST__V1__OP_KIND__OP_ONE_HOT, &x, 1, &n);
  if (id < 0) return id;
  n->pb.num_classes = num_classes;
  n->pb.dtype = (Dist__V1__DType)dt;
  return id;
}
