/* Elementwise kernels: binary arithmetic and comparisons with numpy
 * broadcasting, logical ops, where, unary math and its gradients.
 *
 * Every dtype is computed in one of three types (distd_compute_dtype):
 * float for float16/bfloat16/float32, double, int64 for integers and bool.
 * The loops are specialised per type and per operand layout (both
 * contiguous, one a broadcast scalar) so the compiler vectorizes them; the
 * op switch runs once per row, never per element. */
/* The hot loops need the vectorizer's full cost model (-O3); the build's
 * -O2 only vectorizes loops with no remainder. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <math.h>
#include <string.h>

#include "bcast.h"
#include "kernels.h"

/* ------------------------------------------------------------ binary */

/* Signed integer arithmetic wraps (through unsigned) instead of being
 * undefined; integer division by zero gives 0. */
#define I_ADD(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define I_SUB(x, y) ((int64_t)((uint64_t)(x) - (uint64_t)(y)))
#define I_MUL(x, y) ((int64_t)((uint64_t)(x) * (uint64_t)(y)))
#define I_DIV(x, y)                                                           \
  ((y) == 0 ? 0 : ((y) == -1 ? I_SUB(0, (x)) : (x) / (y)))
#define F_ADD(x, y) ((x) + (y))
#define F_SUB(x, y) ((x) - (y))
#define F_MUL(x, y) ((x) * (y))
#define F_DIV(x, y) ((x) / (y))

static int64_t ipow(int64_t x, int64_t e) {
  if (e < 0) return x == 1 ? 1 : x == -1 ? (e % 2 ? -1 : 1) : 0;
  int64_t r = 1;
  while (e) {
    if (e & 1) r = I_MUL(r, x);
    x = I_MUL(x, x);
    e >>= 1;
  }
  return r;
}

/* o[i] = EXPR(x, y) with x = a[i*sa], y = b[i*sb]. */
#define LOOP2(T, OT, o, EXPR)                                                 \
  do {                                                                        \
    if (sa == 1 && sb == 1) {                                                 \
      for (int64_t i = 0; i < n; i++) {                                       \
        T x = a[i], y = b[i];                                                 \
        o[i] = (OT)(EXPR);                                                    \
      }                                                                       \
    } else if (sa == 1 && sb == 0) {                                          \
      T y = b[0];                                                             \
      for (int64_t i = 0; i < n; i++) {                                       \
        T x = a[i];                                                           \
        o[i] = (OT)(EXPR);                                                    \
      }                                                                       \
    } else if (sa == 0 && sb == 1) {                                          \
      T x = a[0];                                                             \
      for (int64_t i = 0; i < n; i++) {                                       \
        T y = b[i];                                                           \
        o[i] = (OT)(EXPR);                                                    \
      }                                                                       \
    } else {                                                                  \
      for (int64_t i = 0; i < n; i++) {                                       \
        T x = a[i * sa], y = b[i * sb];                                       \
        o[i] = (OT)(EXPR);                                                    \
      }                                                                       \
    }                                                                         \
  } while (0)

#define DEF_BINARY_ROW(NAME, T, ADD, SUB, MUL, DIV, POW, MAX, MIN)            \
  static void NAME(distd_op op, int64_t n, const T *restrict a, int64_t sa,   \
                   const T *restrict b, int64_t sb, void *restrict out) {     \
    T *restrict o = out;                                                      \
    uint8_t *restrict ob = out;                                               \
    switch (op) {                                                             \
    case DIST__V1__OP_KIND__OP_ADD: LOOP2(T, T, o, ADD(x, y)); break;         \
    case DIST__V1__OP_KIND__OP_SUB: LOOP2(T, T, o, SUB(x, y)); break;         \
    case DIST__V1__OP_KIND__OP_MUL: LOOP2(T, T, o, MUL(x, y)); break;         \
    case DIST__V1__OP_KIND__OP_DIV: LOOP2(T, T, o, DIV(x, y)); break;         \
    case DIST__V1__OP_KIND__OP_POW: LOOP2(T, T, o, POW(x, y)); break;         \
    case DIST__V1__OP_KIND__OP_MAXIMUM: LOOP2(T, T, o, MAX(x, y)); break;     \
    case DIST__V1__OP_KIND__OP_MINIMUM: LOOP2(T, T, o, MIN(x, y)); break;     \
    case DIST__V1__OP_KIND__OP_EQ: LOOP2(T, uint8_t, ob, x == y); break;      \
    case DIST__V1__OP_KIND__OP_NE: LOOP2(T, uint8_t, ob, x != y); break;      \
    case DIST__V1__OP_KIND__OP_LT: LOOP2(T, uint8_t, ob, x < y); break;       \
    case DIST__V1__OP_KIND__OP_LE: LOOP2(T, uint8_t, ob, x <= y); break;      \
    case DIST__V1__OP_KIND__OP_GT: LOOP2(T, uint8_t, ob, x > y); break;       \
    case DIST__V1__OP_KIND__OP_GE: LOOP2(T, uint8_t, ob, x >= y); break;      \
    case DIST__V1__OP_KIND__OP_LOGICAL_AND:                                   \
      LOOP2(T, uint8_t, ob, x != 0 && y != 0);                                \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_LOGICAL_OR:                                    \
      LOOP2(T, uint8_t, ob, x != 0 || y != 0);                                \
      break;                                                                  \
    default: break;                                                           \
    }                                                                         \
  }

DEF_BINARY_ROW(row_f32, float, F_ADD, F_SUB, F_MUL, F_DIV, powf, DISTD_FMAX, DISTD_FMIN)
DEF_BINARY_ROW(row_f64, double, F_ADD, F_SUB, F_MUL, F_DIV, pow, DISTD_FMAX, DISTD_FMIN)
DEF_BINARY_ROW(row_i64, int64_t, I_ADD, I_SUB, I_MUL, I_DIV, ipow, DISTD_IMAX, DISTD_IMIN)

static void binary_rows(distd_op op, dist_dtype ct, distd_tval *a,
                        distd_tval *b, void *out, size_t out_esz,
                        const dist_shape *oshape) {
  const dist_shape *ins[2] = {&a->shape, &b->shape};
  distd_bcast it;
  distd_bcast_init(&it, oshape, ins, 2);
  int64_t n = it.inner, sa = it.st[0][it.nd - 1], sb = it.st[1][it.nd - 1];
  for (int64_t r = 0; r < it.nrows; r++, distd_bcast_next(&it)) {
    char *o = (char *)out + (size_t)(r * n) * out_esz;
    if (ct == DIST_FLOAT32)
      row_f32(op, n, (float *)a->data + it.off[0], sa,
              (float *)b->data + it.off[1], sb, o);
    else if (ct == DIST_FLOAT64)
      row_f64(op, n, (double *)a->data + it.off[0], sa,
              (double *)b->data + it.off[1], sb, o);
    else
      row_i64(op, n, (int64_t *)a->data + it.off[0], sa,
              (int64_t *)b->data + it.off[1], sb, o);
  }
}

int distd_k_binary(distd_op op, distd_tval *a, distd_tval *b,
                   distd_tval **out, dist_errbuf *eb) {
  distd_tval *ca = NULL, *cb = NULL, *res = NULL;
  dist_shape os;
  *out = NULL;
  int logical = distd_op_is_logical(op);
  int rc = distd_shape_broadcast(&a->shape, &b->shape, &os, eb);
  if (rc) goto out;
  if (!logical && a->dtype != b->dtype) {
    rc = dist_fail(eb, DIST_EMISMATCH, "dtypes differ: %s vs %s",
                   dist_dtype_name(a->dtype), dist_dtype_name(b->dtype));
    goto out;
  }
  /* Logical ops compare both operands with 0 in a shared type. */
  dist_dtype ct = logical ? DIST_FLOAT64 : distd_compute_dtype(a->dtype);
  if ((rc = distd_tval_cast(a, ct, &ca, eb)) ||
      (rc = distd_tval_cast(b, ct, &cb, eb)))
    goto out;
  int to_bool = logical || distd_op_is_compare(op);
  if ((rc = distd_tval_new_uninit(to_bool ? DIST_BOOL : ct, &os, &res, eb))) goto out;
  binary_rows(op, ct, ca, cb, res->data, dist_dtype_size(res->dtype), &os);
  if (!to_bool && ct != a->dtype) {
    distd_tval *back = NULL;
    if ((rc = distd_tval_cast(res, a->dtype, &back, eb))) goto out;
    distd_tval_unref(res);
    res = back;
  }
  *out = res;
  res = NULL;
out:
  distd_tval_unref(ca);
  distd_tval_unref(cb);
  distd_tval_unref(res);
  return rc;
}

int distd_k_logical_not(distd_tval *x, distd_tval **out, dist_errbuf *eb) {
  distd_tval *b = NULL;
  int rc = distd_tval_cast(x, DIST_BOOL, &b, eb);
  if (!rc) rc = distd_tval_new_uninit(DIST_BOOL, &x->shape, out, eb);
  if (!rc) {
    const uint8_t *s = b->data;
    uint8_t *o = (*out)->data;
    for (int64_t i = 0; i < x->numel; i++) o[i] = !s[i];
  }
  distd_tval_unref(b);
  return rc;
}

/* ------------------------------------------------------------- unary */

#define SQRT_2 1.41421356237309504880
#define INV_SQRT_2PI 0.39894228040143267794
#define GELU_C 0.79788456080286535588 /* sqrt(2/pi) */

#define DEF_UNARY_ROW(NAME, T, EXP, LOG, SQRT, ABS, TANH, ERF)                \
  static void NAME(distd_op op, int approx, int64_t n, const T *restrict x,  \
                   T *restrict o) {                                           \
    switch (op) {                                                             \
    case DIST__V1__OP_KIND__OP_EXP:                                           \
      for (int64_t i = 0; i < n; i++) o[i] = EXP(x[i]);                       \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_LOG:                                           \
      for (int64_t i = 0; i < n; i++) o[i] = LOG(x[i]);                       \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_SQRT:                                          \
      for (int64_t i = 0; i < n; i++) o[i] = SQRT(x[i]);                      \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_ABS:                                           \
      for (int64_t i = 0; i < n; i++) o[i] = ABS(x[i]);                       \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_NEG:                                           \
      for (int64_t i = 0; i < n; i++) o[i] = -x[i];                           \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_RELU:                                          \
      for (int64_t i = 0; i < n; i++) o[i] = x[i] > 0 ? x[i] : (T)0;          \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_GELU:                                          \
      if (approx)                                                             \
        for (int64_t i = 0; i < n; i++) {                                     \
          T v = x[i];                                                         \
          o[i] = (T)0.5 * v *                                                 \
                 ((T)1 + TANH((T)GELU_C * (v + (T)0.044715 * v * v * v)));    \
        }                                                                     \
      else                                                                    \
        for (int64_t i = 0; i < n; i++)                                       \
          o[i] = (T)0.5 * x[i] * ((T)1 + ERF(x[i] / (T)SQRT_2));              \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_SILU:                                          \
      for (int64_t i = 0; i < n; i++) o[i] = x[i] / ((T)1 + EXP(-x[i]));      \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_SIGMOID:                                       \
      for (int64_t i = 0; i < n; i++) o[i] = (T)1 / ((T)1 + EXP(-x[i]));      \
      break;                                                                  \
    case DIST__V1__OP_KIND__OP_TANH:                                          \
      for (int64_t i = 0; i < n; i++) o[i] = TANH(x[i]);                      \
      break;                                                                  \
    default: break;                                                           \
    }                                                                         \
  }

DEF_UNARY_ROW(unary_f32, float, expf, logf, sqrtf, fabsf, tanhf, erff)
DEF_UNARY_ROW(unary_f64, double, exp, log, sqrt, fabs, tanh, erf)

static void unary_i64(distd_op op, int64_t n, const int64_t *x, int64_t *o) {
  for (int64_t i = 0; i < n; i++) {
    int64_t v = x[i];
    if (op == DIST__V1__OP_KIND__OP_NEG)
      o[i] = I_SUB(0, v);
    else if (op == DIST__V1__OP_KIND__OP_ABS)
      o[i] = v < 0 ? I_SUB(0, v) : v;
    else
      o[i] = v > 0 ? v : 0;
  }
}

static int unary_takes_int(distd_op op) {
  return op == DIST__V1__OP_KIND__OP_ABS || op == DIST__V1__OP_KIND__OP_NEG ||
         op == DIST__V1__OP_KIND__OP_RELU;
}

int distd_k_unary(distd_op op, int approximate, distd_tval *x,
                  distd_tval **out, dist_errbuf *eb) {
  distd_tval *cx = NULL, *res = NULL;
  *out = NULL;
  dist_dtype ct = distd_compute_dtype(x->dtype);
  int rc = 0;
  if (ct == DIST_INT64 && (!unary_takes_int(op) || x->dtype == DIST_BOOL)) {
    rc = dist_fail(eb, DIST_EINVAL, "needs a float dtype, got %s",
                   dist_dtype_name(x->dtype));
    goto out;
  }
  if ((rc = distd_tval_cast(x, ct, &cx, eb)) ||
      (rc = distd_tval_new_uninit(ct, &x->shape, &res, eb)))
    goto out;
  if (ct == DIST_FLOAT32)
    unary_f32(op, approximate, x->numel, cx->data, res->data);
  else if (ct == DIST_FLOAT64)
    unary_f64(op, approximate, x->numel, cx->data, res->data);
  else
    unary_i64(op, x->numel, cx->data, res->data);
  rc = distd_tval_cast(res, x->dtype, out, eb);
out:
  distd_tval_unref(cx);
  distd_tval_unref(res);
  return rc;
}

/* o[i] = g[i] * d/dx op at x[i] (y[i] = op(x[i]) where handy). */
#define DEF_UNARY_GRAD(NAME, T, EXP, TANH, ERF)                               \
  static void NAME(distd_op op, int approx, int64_t n, const T *x,            \
                   const T *y, const T *g, T *o) {                            \
    for (int64_t i = 0; i < n; i++) {                                         \
      T v = x[i], d;                                                          \
      switch (op) {                                                           \
      case DIST__V1__OP_KIND__OP_EXP: d = y[i]; break;                        \
      case DIST__V1__OP_KIND__OP_LOG: d = (T)1 / v; break;                    \
      case DIST__V1__OP_KIND__OP_SQRT: d = (T)0.5 / y[i]; break;              \
      case DIST__V1__OP_KIND__OP_ABS:                                         \
        d = v > 0 ? (T)1 : v < 0 ? (T)-1 : (T)0;                              \
        break;                                                                \
      case DIST__V1__OP_KIND__OP_NEG: d = -1; break;                          \
      case DIST__V1__OP_KIND__OP_RELU: d = v > 0 ? (T)1 : (T)0; break;        \
      case DIST__V1__OP_KIND__OP_GELU:                                        \
        if (approx) {                                                         \
          T t = TANH((T)GELU_C * (v + (T)0.044715 * v * v * v));              \
          d = (T)0.5 * ((T)1 + t) + (T)0.5 * v * ((T)1 - t * t) *             \
                                        (T)GELU_C *                           \
                                        ((T)1 + (T)(3 * 0.044715) * v * v);   \
        } else {                                                              \
          d = (T)0.5 * ((T)1 + ERF(v / (T)SQRT_2)) +                          \
              v * (T)INV_SQRT_2PI * EXP((T)-0.5 * v * v);                     \
        }                                                                     \
        break;                                                                \
      case DIST__V1__OP_KIND__OP_SILU: {                                      \
        T s = (T)1 / ((T)1 + EXP(-v));                                        \
        d = s * ((T)1 + v * ((T)1 - s));                                      \
        break;                                                                \
      }                                                                       \
      case DIST__V1__OP_KIND__OP_SIGMOID: d = y[i] * ((T)1 - y[i]); break;    \
      case DIST__V1__OP_KIND__OP_TANH: d = (T)1 - y[i] * y[i]; break;         \
      default: d = 0; break;                                                  \
      }                                                                       \
      o[i] = g[i] * d;                                                        \
    }                                                                         \
  }

DEF_UNARY_GRAD(unary_grad_f32, float, expf, tanhf, erff)
DEF_UNARY_GRAD(unary_grad_f64, double, exp, tanh, erf)

int distd_k_unary_grad(distd_op op, int approximate, distd_tval *x,
                       distd_tval *y, distd_tval *g, distd_tval **out,
                       dist_errbuf *eb) {
  distd_tval *cx = NULL, *cy = NULL, *cg = NULL, *res = NULL;
  *out = NULL;
  dist_dtype ct = distd_compute_dtype(x->dtype);
  int rc = 0;
  if (ct == DIST_INT64) {
    rc = dist_fail(eb, DIST_EINVAL, "no gradient for %s",
                   dist_dtype_name(x->dtype));
    goto out;
  }
  if ((rc = distd_tval_cast(x, ct, &cx, eb)) ||
      (rc = distd_tval_cast(y, ct, &cy, eb)) ||
      (rc = distd_tval_cast(g, ct, &cg, eb)) ||
      (rc = distd_tval_new_uninit(ct, &x->shape, &res, eb)))
    goto out;
  if (ct == DIST_FLOAT32)
    unary_grad_f32(op, approximate, x->numel, cx->data, cy->data, cg->data,
                   res->data);
  else
    unary_grad_f64(op, approximate, x->numel, cx->data, cy->data, cg->data,
                   res->data);
  rc = distd_tval_cast(res, x->dtype, out, eb);
out:
  distd_tval_unref(cx);
  distd_tval_unref(cy);
  distd_tval_unref(cg);
  distd_tval_unref(res);
  return rc;
}

/* ------------------------------------------------- where, expand, sum_to */

/* Selection and broadcasting only move elements, so they work on element
 * sizes rather than dtypes. */
#define SELECT_ROW(T)                                                         \
  do {                                                                        \
    const T *pa = (const T *)a->data + it.off[1];                             \
    const T *pb = (const T *)b->data + it.off[2];                             \
    T *o = (T *)res->data + r * n;                                            \
    for (int64_t i = 0; i < n; i++)                                           \
      o[i] = c[i * sc] ? pa[i * sa] : pb[i * sb];                             \
  } while (0)

int distd_k_where(distd_tval *cond, distd_tval *a, distd_tval *b,
                  distd_tval **out, dist_errbuf *eb) {
  distd_tval *cb = NULL, *res = NULL;
  dist_shape s1, os;
  *out = NULL;
  int rc;
  if (a->dtype != b->dtype) {
    rc = dist_fail(eb, DIST_EMISMATCH, "dtypes differ: %s vs %s",
                   dist_dtype_name(a->dtype), dist_dtype_name(b->dtype));
    goto out;
  }
  if ((rc = distd_shape_broadcast(&cond->shape, &a->shape, &s1, eb)) ||
      (rc = distd_shape_broadcast(&s1, &b->shape, &os, eb)) ||
      (rc = distd_tval_cast(cond, DIST_BOOL, &cb, eb)) ||
      (rc = distd_tval_new_uninit(a->dtype, &os, &res, eb)))
    goto out;
  const dist_shape *ins[3] = {&cond->shape, &a->shape, &b->shape};
  distd_bcast it;
  distd_bcast_init(&it, &os, ins, 3);
  int64_t n = it.inner, sc = it.st[0][it.nd - 1], sa = it.st[1][it.nd - 1],
          sb = it.st[2][it.nd - 1];
  size_t esz = dist_dtype_size(a->dtype);
  for (int64_t r = 0; r < it.nrows; r++, distd_bcast_next(&it)) {
    const uint8_t *c = (const uint8_t *)cb->data + it.off[0];
    if (esz == 1) SELECT_ROW(uint8_t);
    else if (esz == 2) SELECT_ROW(uint16_t);
    else if (esz == 4) SELECT_ROW(uint32_t);
    else SELECT_ROW(uint64_t);
  }
  *out = res;
  res = NULL;
out:
  distd_tval_unref(cb);
  distd_tval_unref(res);
  return rc;
}

#define EXPAND_ROW(T)                                                         \
  do {                                                                        \
    const T *px = (const T *)x->data + it.off[0];                             \
    T *o = (T *)res->data + r * n;                                            \
    for (int64_t i = 0; i < n; i++) o[i] = px[i * sx];                        \
  } while (0)

int distd_k_expand(distd_tval *x, const dist_shape *shape, distd_tval **out,
                   dist_errbuf *eb) {
  dist_shape os;
  int rc = distd_shape_broadcast(&x->shape, shape, &os, eb);
  if (rc) return rc;
  if (!dist_shape_equal(&os, shape)) {
    char sx[128], st[128];
    dist_shape_format(&x->shape, sx, sizeof sx);
    dist_shape_format(shape, st, sizeof st);
    return dist_fail(eb, DIST_EMISMATCH, "cannot expand %s to %s", sx, st);
  }
  distd_tval *res = NULL;
  if ((rc = distd_tval_new_uninit(x->dtype, shape, &res, eb))) return rc;
  const dist_shape *ins[1] = {&x->shape};
  distd_bcast it;
  distd_bcast_init(&it, shape, ins, 1);
  int64_t n = it.inner, sx = it.st[0][it.nd - 1];
  size_t esz = dist_dtype_size(x->dtype);
  for (int64_t r = 0; r < it.nrows; r++, distd_bcast_next(&it)) {
    if (esz == 1) EXPAND_ROW(uint8_t);
    else if (esz == 2) EXPAND_ROW(uint16_t);
    else if (esz == 4) EXPAND_ROW(uint32_t);
    else EXPAND_ROW(uint64_t);
  }
  *out = res;
  return 0;
}

int distd_k_sum_to(distd_tval *g, const dist_shape *shape, distd_tval **out,
                   dist_errbuf *eb) {
  if (dist_shape_equal(&g->shape, shape)) {
    *out = distd_tval_ref(g);
    return 0;
  }
  int64_t axes[DIST_MAX_DIMS];
  size_t naxes = 0;
  int lead = g->shape.ndim - shape->ndim;
  for (int d = 0; d < g->shape.ndim; d++)
    if (d < lead || (shape->dims[d - lead] == 1 && g->shape.dims[d] != 1))
      axes[naxes++] = d;
  distd_tval *red = NULL;
  int rc = 0;
  if (naxes == 0)
    red = distd_tval_ref(g);
  else
    rc = distd_k_reduce(DIST__V1__OP_KIND__OP_SUM, g, axes, naxes, 1, &red, eb);
  if (!rc) rc = distd_tval_view(red, shape, out, eb);
  distd_tval_unref(red);
  return rc;
}
