/* The interpreter's kernels: functions from values to new values. Each
 * returns 0 or a dist_err code with a message in eb (without the node
 * prefix: the interpreter adds "node 3 (matmul): "). Inputs are never
 * modified; outputs are new values with one reference owned by the caller.
 * Ops are named by the dist.v1.OpKind numbers of program.proto.
 *
 * The shape functions are shared by shape inference (validate.c) and the
 * kernels, so that a validated program cannot fail a shape check at run
 * time. */
#ifndef DISTD_KERNELS_H
#define DISTD_KERNELS_H

#include "program.pb-c.h"
#include "tensor_val.h"

typedef Dist__V1__OpKind distd_op;

/* ------------------------------------------------------------ shapes */

/* numpy broadcasting of two shapes. */
int distd_shape_broadcast(const dist_shape *a, const dist_shape *b,
                          dist_shape *out, dist_errbuf *eb);
/* A (possibly negative) axis of an ndim-d tensor, checked. */
int distd_norm_axis(int64_t axis, int ndim, int *out, dist_errbuf *eb);
/* The reduced shape; reduced[d] is set to 1 for each reduced axis. No axes
 * means all of them. */
int distd_shape_reduce(const dist_shape *x, const int64_t *axes, size_t naxes,
                       int keepdim, dist_shape *out, uint8_t *reduced,
                       dist_errbuf *eb);
int distd_shape_matmul(const dist_shape *a, const dist_shape *b, int ta,
                       int tb, dist_shape *out, dist_errbuf *eb);
int distd_shape_reshape(const dist_shape *x, const int64_t *dims, size_t n,
                        dist_shape *out, dist_errbuf *eb);
/* perm may be empty (reverse); perm_out receives the checked permutation. */
int distd_shape_transpose(const dist_shape *x, const int64_t *perm, size_t n,
                          int *perm_out, dist_shape *out, dist_errbuf *eb);
int distd_shape_concat(const dist_shape *const *xs, int n, int64_t axis,
                       dist_shape *out, dist_errbuf *eb);

/* A resolved slice: element i along dim d is start[d] + i * step[d]. */
typedef struct distd_slice {
  int ndim;
  int64_t start[DIST_MAX_DIMS];
  int64_t step[DIST_MAX_DIMS];
  int64_t count[DIST_MAX_DIMS];
} distd_slice;

/* Resolves python-style starts/ends/steps on axes (empty axes: 0, 1, ...)
 * against x; out-of-range bounds are clamped as python does. */
int distd_slice_resolve(const dist_shape *x, const int64_t *axes, size_t naxes,
                        const int64_t *starts, size_t nstarts,
                        const int64_t *ends, size_t nends,
                        const int64_t *steps, size_t nsteps, distd_slice *out,
                        dist_errbuf *eb);
void distd_slice_shape(const distd_slice *s, dist_shape *out);

/* ------------------------------------------------------- elementwise */

/* max/min that propagate NaN from either side (numpy, torch, Paddle): a
 * bare x > y ? x : y returns y for max(NaN, y). The integer forms need no
 * NaN test. */
#define DISTD_FMAX(x, y) ((x) > (y) || (x) != (x) ? (x) : (y))
#define DISTD_FMIN(x, y) ((x) < (y) || (x) != (x) ? (x) : (y))
#define DISTD_IMAX(x, y) ((x) > (y) ? (x) : (y))
#define DISTD_IMIN(x, y) ((x) < (y) ? (x) : (y))

int distd_op_is_compare(distd_op op);
int distd_op_is_logical(distd_op op);
int distd_k_binary(distd_op op, distd_tval *a, distd_tval *b,
                   distd_tval **out, dist_errbuf *eb);
int distd_k_logical_not(distd_tval *x, distd_tval **out, dist_errbuf *eb);
int distd_k_unary(distd_op op, int approximate, distd_tval *x,
                  distd_tval **out, dist_errbuf *eb);
/* g * d op(x) / dx, given x, y = op(x) and g. */
int distd_k_unary_grad(distd_op op, int approximate, distd_tval *x,
                       distd_tval *y, distd_tval *g, distd_tval **out,
                       dist_errbuf *eb);
int distd_k_where(distd_tval *cond, distd_tval *a, distd_tval *b,
                  distd_tval **out, dist_errbuf *eb);
/* x broadcast to shape (materialized). */
int distd_k_expand(distd_tval *x, const dist_shape *shape, distd_tval **out,
                   dist_errbuf *eb);
/* The sum of g over the dims that broadcasting added to reach g's shape
 * from shape: the gradient rule of broadcasting. */
int distd_k_sum_to(distd_tval *g, const dist_shape *shape, distd_tval **out,
                   dist_errbuf *eb);

/* ------------------------------------------------------- reductions */

/* The dtype of a reduction's result: Paddle's sum (SumRawInferMeta) gives
 * int64 for bool and int32, so counts do not wrap; every other reduction and
 * dtype keeps the input's. Both the registration's inference and the kernel
 * use it. */
dist_dtype distd_reduce_out_dtype(distd_op op, dist_dtype in);
/* OP_SUM OP_MEAN OP_MAX OP_MIN. */
int distd_k_reduce(distd_op op, distd_tval *x, const int64_t *axes,
                   size_t naxes, int keepdim, distd_tval **out,
                   dist_errbuf *eb);
/* OP_LOGSUMEXP (keepdim honoured), OP_SOFTMAX, OP_LOG_SOFTMAX. */
int distd_k_softmax(distd_op op, distd_tval *x, int64_t axis, int keepdim,
                    distd_tval **out, dist_errbuf *eb);

typedef struct distd_ce_opts {
  int use_ignore_index;
  int64_t ignore_index;
  Dist__V1__Reduction reduction;
} distd_ce_opts;

/* Checks logits/labels/mask and gives the output shape. */
int distd_shape_cross_entropy(const distd_vmeta *logits,
                              const distd_vmeta *labels,
                              const distd_vmeta *mask, const distd_ce_opts *o,
                              dist_shape *out, dist_errbuf *eb);
int distd_k_cross_entropy(distd_tval *logits, distd_tval *labels,
                          distd_tval *mask, const distd_ce_opts *o,
                          distd_tval **out, dist_errbuf *eb);
/* The gradient with respect to logits, given the output gradient g. */
int distd_k_cross_entropy_grad(distd_tval *logits, distd_tval *labels,
                               distd_tval *mask, const distd_ce_opts *o,
                               distd_tval *g, distd_tval **out,
                               dist_errbuf *eb);

/* ------------------------------------------------------------ matmul */

int distd_k_matmul(distd_tval *a, distd_tval *b, int ta, int tb,
                   distd_tval **out, dist_errbuf *eb);

/* ------------------------------------------------------------ shape */

/* A view with the new shape (same element count). */
int distd_k_reshape(distd_tval *x, const dist_shape *shape, distd_tval **out,
                    dist_errbuf *eb);
int distd_k_transpose(distd_tval *x, const int *perm, distd_tval **out,
                      dist_errbuf *eb);
int distd_k_slice(distd_tval *x, const distd_slice *s, distd_tval **out,
                  dist_errbuf *eb);
/* A copy of x with x[s] = v, v broadcast to the slice's shape and converted
 * to x's dtype. */
int distd_k_set_slice(distd_tval *x, const distd_slice *s, distd_tval *v,
                      distd_tval **out, dist_errbuf *eb);
/* Most inputs of one concat. */
#define DISTD_CONCAT_MAX 64
int distd_k_concat(distd_tval *const *xs, int n, int axis, distd_tval **out,
                   dist_errbuf *eb);
int distd_k_full(dist_dtype dt, const dist_shape *shape, double v,
                 distd_tval **out, dist_errbuf *eb);
/* Number of elements of arange(start, end, step); an error for step 0. */
int distd_arange_count(double start, double end, double step, int64_t *n,
                       dist_errbuf *eb);
int distd_k_arange(dist_dtype dt, double start, double end, double step,
                   distd_tval **out, dist_errbuf *eb);
/* The k largest (or smallest) along axis, sorted, ties by lower index;
 * indices are int64. */
int distd_k_topk(distd_tval *x, int64_t k, int axis, int smallest,
                 distd_tval **values, distd_tval **indices, dist_errbuf *eb);
/* Scatters g (shape of the topk values) back to positions idx in a zero
 * tensor of x_shape. */
int distd_k_topk_grad(const dist_shape *x_shape, distd_tval *idx,
                      distd_tval *g, int axis, distd_tval **out,
                      dist_errbuf *eb);
int distd_k_one_hot(distd_tval *x, int64_t num_classes, dist_dtype dt,
                    distd_tval **out, dist_errbuf *eb);

#endif
