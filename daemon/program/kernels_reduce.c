/* Reductions (sum, mean, max, min over axes), the softmax family along an
 * axis, and cross-entropy.
 *
 * A reduction is brought to the form (outer, R, inner): the reduced axes are
 * one contiguous block of R elements (after a transpose when they are not).
 * inner == 1 reduces contiguous rows with independent lane accumulators
 * (the compiler vectorizes those without reassociating a single sum);
 * inner > 1 accumulates whole rows, vectorized along inner. float32 sums
 * accumulate in float per block of 4096 and in double across blocks. */
/* The hot loops need the vectorizer's full cost model (-O3); the build's
 * -O2 only vectorizes loops with no remainder. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define LANES 16
#define BLOCK 4096

static int is_sum(distd_op op) {
  return op == DIST__V1__OP_KIND__OP_SUM || op == DIST__V1__OP_KIND__OP_MEAN;
}

/* One contiguous row: sum (ACC carries across blocks) or max/min. */
#define DEF_ROW_REDUCE(NAME, T, LANE, ACC, MAX, MIN)                          \
  static T NAME(distd_op op, const T *x, int64_t n) {                         \
    if (is_sum(op)) {                                                         \
      ACC total = 0;                                                          \
      for (int64_t i = 0; i < n; i += BLOCK) {                                \
        int64_t blk = n - i < BLOCK ? n - i : BLOCK, j = 0;                   \
        LANE acc[LANES] = {0};                                                \
        const T *p = x + i;                                                   \
        for (; j + LANES <= blk; j += LANES)                                  \
          for (int l = 0; l < LANES; l++) acc[l] += (LANE)p[j + l];           \
        for (; j < blk; j++) acc[0] += (LANE)p[j];                            \
        ACC bs = 0;                                                           \
        for (int l = 0; l < LANES; l++) bs += (ACC)acc[l];                    \
        total += bs;                                                          \
      }                                                                       \
      if (op == DIST__V1__OP_KIND__OP_MEAN) total /= (ACC)n;                  \
      return (T)total;                                                        \
    }                                                                         \
    int mx = op == DIST__V1__OP_KIND__OP_MAX;                                 \
    T acc[LANES];                                                             \
    for (int l = 0; l < LANES; l++) acc[l] = x[0];                            \
    int64_t j = 0;                                                            \
    if (mx)                                                                   \
      for (; j + LANES <= n; j += LANES)                                      \
        for (int l = 0; l < LANES; l++)                                       \
          acc[l] = MAX(x[j + l], acc[l]);                                     \
    else                                                                      \
      for (; j + LANES <= n; j += LANES)                                      \
        for (int l = 0; l < LANES; l++)                                       \
          acc[l] = MIN(x[j + l], acc[l]);                                     \
    T r = acc[0];                                                             \
    for (int l = 1; l < LANES; l++)                                           \
      r = mx ? MAX(acc[l], r) : MIN(acc[l], r);                               \
    for (; j < n; j++) r = mx ? MAX(x[j], r) : MIN(x[j], r);                  \
    return r;                                                                 \
  }

/* R rows of `inner` elements into one row; tmp has inner ACC slots. */
#define DEF_INNER_REDUCE(NAME, T, ACC, MAX, MIN)                              \
  static void NAME(distd_op op, const T *x, int64_t R, int64_t inner,        \
                   ACC *tmp, T *out) {                                        \
    if (is_sum(op)) {                                                         \
      for (int64_t i = 0; i < inner; i++) tmp[i] = 0;                         \
      for (int64_t r = 0; r < R; r++) {                                       \
        const T *p = x + r * inner;                                           \
        for (int64_t i = 0; i < inner; i++) tmp[i] += (ACC)p[i];              \
      }                                                                       \
      for (int64_t i = 0; i < inner; i++)                                     \
        out[i] = (T)(op == DIST__V1__OP_KIND__OP_MEAN ? tmp[i] / (ACC)R       \
                                                      : tmp[i]);              \
      return;                                                                 \
    }                                                                         \
    memcpy(out, x, sizeof(T) * (size_t)inner);                                \
    for (int64_t r = 1; r < R; r++) {                                         \
      const T *p = x + r * inner;                                             \
      if (op == DIST__V1__OP_KIND__OP_MAX)                                    \
        for (int64_t i = 0; i < inner; i++) out[i] = MAX(p[i], out[i]);       \
      else                                                                    \
        for (int64_t i = 0; i < inner; i++) out[i] = MIN(p[i], out[i]);       \
    }                                                                         \
  }

/* max/min propagate NaN as numpy does (DISTD_FMAX). */
DEF_ROW_REDUCE(row_f32, float, float, double, DISTD_FMAX, DISTD_FMIN)
DEF_ROW_REDUCE(row_f64, double, double, double, DISTD_FMAX, DISTD_FMIN)
DEF_ROW_REDUCE(row_i64, int64_t, uint64_t, uint64_t, DISTD_IMAX, DISTD_IMIN)
DEF_INNER_REDUCE(inner_f32, float, double, DISTD_FMAX, DISTD_FMIN)
DEF_INNER_REDUCE(inner_f64, double, double, DISTD_FMAX, DISTD_FMIN)
DEF_INNER_REDUCE(inner_i64, int64_t, uint64_t, DISTD_IMAX, DISTD_IMIN)

#define RUN_REDUCE(T, ROW, INNER, ACC)                                        \
  do {                                                                        \
    const T *px = x;                                                          \
    T *po = out;                                                              \
    for (int64_t o = 0; o < outer; o++) {                                     \
      if (inner == 1)                                                         \
        po[o] = ROW(op, px + o * R, R);                                       \
      else                                                                    \
        INNER(op, px + o * R * inner, R, inner, (ACC *)tmp, po + o * inner);  \
    }                                                                         \
  } while (0)

static int reduce_block(distd_op op, dist_dtype ct, const void *x,
                        int64_t outer, int64_t R, int64_t inner, void *out,
                        dist_errbuf *eb) {
  void *tmp = NULL;
  if (inner > 1 && !(tmp = malloc(sizeof(double) * (size_t)inner)))
    return dist_fail(eb, DIST_ENOMEM, "out of memory");
  if (ct == DIST_FLOAT32)
    RUN_REDUCE(float, row_f32, inner_f32, double);
  else if (ct == DIST_FLOAT64)
    RUN_REDUCE(double, row_f64, inner_f64, double);
  else
    RUN_REDUCE(int64_t, row_i64, inner_i64, uint64_t);
  free(tmp);
  return 0;
}

/* Brings the reduced axes together: either they already form one block of
 * the non-1 dims (then *perm_needed = 0 and outer/R/inner describe x), or
 * perm moves them last. */
static void plan_reduce(const dist_shape *s, const uint8_t *red, int *perm,
                        int *perm_needed, int64_t *outer, int64_t *R,
                        int64_t *inner) {
  int first = -1, last = -1;
  for (int d = 0; d < s->ndim; d++)
    if (red[d] && s->dims[d] != 1) {
      if (first < 0) first = d;
      last = d;
    }
  *perm_needed = 0;
  for (int d = first + 1; first >= 0 && d < last; d++)
    if (!red[d] && s->dims[d] != 1) *perm_needed = 1;
  *outer = *R = *inner = 1;
  if (!*perm_needed) {
    for (int d = 0; d < s->ndim; d++) {
      if (first >= 0 && d >= first && d <= last) *R *= s->dims[d];
      else if (first >= 0 && d > last) *inner *= s->dims[d];
      else *outer *= s->dims[d];
    }
    return;
  }
  int k = 0;
  for (int d = 0; d < s->ndim; d++)
    if (!red[d]) {
      perm[k++] = d;
      *outer *= s->dims[d];
    }
  for (int d = 0; d < s->ndim; d++)
    if (red[d]) {
      perm[k++] = d;
      *R *= s->dims[d];
    }
}

int distd_k_reduce(distd_op op, distd_tval *x, const int64_t *axes,
                   size_t naxes, int keepdim, distd_tval **out,
                   dist_errbuf *eb) {
  distd_tval *cx = NULL, *px = NULL, *res = NULL;
  uint8_t red[DIST_MAX_DIMS];
  dist_shape os;
  *out = NULL;
  int rc = distd_shape_reduce(&x->shape, axes, naxes, keepdim, &os, red, eb);
  if (rc) return rc;
  dist_dtype ct = distd_compute_dtype(x->dtype);
  dist_dtype odt = distd_reduce_out_dtype(op, x->dtype);
  int perm[DIST_MAX_DIMS], perm_needed;
  int64_t outer, R, inner;
  plan_reduce(&x->shape, red, perm, &perm_needed, &outer, &R, &inner);
  if (op == DIST__V1__OP_KIND__OP_MEAN && ct == DIST_INT64) {
    rc = dist_fail(eb, DIST_EINVAL, "mean needs a float dtype, got %s",
                   dist_dtype_name(x->dtype));
    goto out;
  }
  if (!is_sum(op) && R == 0 && outer * inner > 0) {
    rc = dist_fail(eb, DIST_EINVAL, "%s of an empty dimension",
                   op == DIST__V1__OP_KIND__OP_MAX ? "max" : "min");
    goto out;
  }
  if ((rc = distd_tval_cast(x, ct, &cx, eb))) goto out;
  if (perm_needed) {
    if ((rc = distd_k_transpose(cx, perm, &px, eb))) goto out;
  } else {
    px = distd_tval_ref(cx);
  }
  if ((rc = distd_tval_new_uninit(ct, &os, &res, eb))) goto out;
  if ((rc = reduce_block(op, ct, px->data, outer, R, inner, res->data, eb)))
    goto out;
  rc = distd_tval_cast(res, odt, out, eb);
out:
  distd_tval_unref(cx);
  distd_tval_unref(px);
  distd_tval_unref(res);
  return rc;
}

/* ------------------------------------------------------------ softmax */

/* x has (outer, n, inner) layout; one (o, i) line at a time. */
#define DEF_SOFTMAX(NAME, T, EXP, LOG)                                        \
  static void NAME(distd_op op, const T *x, int64_t outer, int64_t n,         \
                   int64_t inner, T *out) {                                   \
    for (int64_t o = 0; o < outer; o++)                                       \
      for (int64_t i = 0; i < inner; i++) {                                   \
        const T *p = x + o * n * inner + i;                                   \
        T m = -INFINITY;                                                      \
        for (int64_t j = 0; j < n; j++)                                       \
          if (p[j * inner] > m) m = p[j * inner];                             \
        if (isinf(m)) m = 0; /* all -inf (or +inf): avoid inf - inf */        \
        T s = 0;                                                              \
        for (int64_t j = 0; j < n; j++) s += EXP(p[j * inner] - m);           \
        T lse = m + LOG(s);                                                   \
        if (op == DIST__V1__OP_KIND__OP_LOGSUMEXP) {                          \
          out[o * inner + i] = lse;                                           \
          continue;                                                           \
        }                                                                     \
        T *q = out + o * n * inner + i;                                       \
        for (int64_t j = 0; j < n; j++)                                       \
          q[j * inner] = op == DIST__V1__OP_KIND__OP_SOFTMAX                  \
                             ? EXP(p[j * inner] - m) / s                      \
                             : p[j * inner] - lse;                            \
      }                                                                       \
  }

DEF_SOFTMAX(softmax_f32, float, expf, logf)
DEF_SOFTMAX(softmax_f64, double, exp, log)

int distd_k_softmax(distd_op op, distd_tval *x, int64_t axis, int keepdim,
                    distd_tval **out, dist_errbuf *eb) {
  distd_tval *cx = NULL, *res = NULL;
  int a, rc;
  *out = NULL;
  dist_dtype ct = distd_compute_dtype(x->dtype);
  if ((rc = distd_norm_axis(axis, x->shape.ndim, &a, eb))) return rc;
  if (ct == DIST_INT64)
    return dist_fail(eb, DIST_EINVAL, "needs a float dtype, got %s",
                     dist_dtype_name(x->dtype));
  dist_shape os = x->shape;
  if (op == DIST__V1__OP_KIND__OP_LOGSUMEXP) {
    int64_t ax = a;
    if ((rc = distd_shape_reduce(&x->shape, &ax, 1, keepdim, &os, NULL, eb)))
      return rc;
  }
  int64_t outer = 1, inner = 1, n = x->shape.dims[a];
  for (int d = 0; d < a; d++) outer *= x->shape.dims[d];
  for (int d = a + 1; d < x->shape.ndim; d++) inner *= x->shape.dims[d];
  if ((rc = distd_tval_cast(x, ct, &cx, eb)) ||
      (rc = distd_tval_new_uninit(ct, &os, &res, eb)))
    goto out;
  if (ct == DIST_FLOAT32)
    softmax_f32(op, cx->data, outer, n, inner, res->data);
  else
    softmax_f64(op, cx->data, outer, n, inner, res->data);
  rc = distd_tval_cast(res, x->dtype, out, eb);
out:
  distd_tval_unref(cx);
  distd_tval_unref(res);
  return rc;
}

/* ------------------------------------------------------- cross-entropy */

/* Everything cross-entropy needs per row, in double: the log-softmax of
 * the logits, the label and the weight. */
typedef struct ce_rows {
  int64_t rows, classes;
  double *logp;  /* rows * classes */
  int64_t *label;
  double *w;
  double wsum;
} ce_rows;

static void ce_rows_free(ce_rows *c) {
  free(c->logp);
  free(c->label);
  free(c->w);
}

static int ce_prepare(distd_tval *logits, distd_tval *labels,
                      distd_tval *mask, const distd_ce_opts *o, ce_rows *c,
                      dist_errbuf *eb) {
  distd_tval *l64 = NULL, *ls = NULL, *lab = NULL, *m64 = NULL;
  memset(c, 0, sizeof *c);
  c->classes = logits->shape.dims[logits->shape.ndim - 1];
  c->rows = c->classes ? logits->numel / c->classes : labels->numel;
  int rc;
  if ((rc = distd_tval_cast(logits, DIST_FLOAT64, &l64, eb)) ||
      (rc = distd_k_softmax(DIST__V1__OP_KIND__OP_LOG_SOFTMAX, l64, -1, 0,
                            &ls, eb)) ||
      (rc = distd_tval_cast(labels, DIST_INT64, &lab, eb)) ||
      (mask && (rc = distd_tval_cast(mask, DIST_FLOAT64, &m64, eb))))
    goto out;
  size_t rows = (size_t)c->rows;
  c->logp = malloc(sizeof(double) * (size_t)ls->numel + 1);
  c->label = malloc(sizeof(int64_t) * rows + 1);
  c->w = malloc(sizeof(double) * rows + 1);
  if (!c->logp || !c->label || !c->w) {
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory");
    goto out;
  }
  memcpy(c->logp, ls->data, sizeof(double) * (size_t)ls->numel);
  for (int64_t r = 0; r < c->rows; r++) {
    int64_t y = ((int64_t *)lab->data)[r];
    double w = m64 ? ((double *)m64->data)[r] : 1.0;
    if (o->use_ignore_index && y == o->ignore_index) w = 0;
    if (w != 0 && (y < 0 || y >= c->classes)) {
      rc = dist_fail(eb, DIST_EINVAL, "label %lld of row %lld out of range "
                     "[0, %lld)", (long long)y, (long long)r,
                     (long long)c->classes);
      goto out;
    }
    c->label[r] = y;
    c->w[r] = w;
    c->wsum += w;
  }
out:
  if (rc) ce_rows_free(c);
  distd_tval_unref(l64);
  distd_tval_unref(ls);
  distd_tval_unref(lab);
  distd_tval_unref(m64);
  return rc;
}

int distd_k_cross_entropy(distd_tval *logits, distd_tval *labels,
                          distd_tval *mask, const distd_ce_opts *o,
                          distd_tval **out, dist_errbuf *eb) {
  distd_vmeta ml = {logits->dtype, logits->shape};
  distd_vmeta mb = {labels->dtype, labels->shape};
  distd_vmeta mm = {mask ? mask->dtype : DIST_DTYPE_INVALID,
                   mask ? mask->shape : labels->shape};
  dist_shape os;
  distd_tval *res = NULL;
  ce_rows c;
  *out = NULL;
  int rc = distd_shape_cross_entropy(&ml, &mb, mask ? &mm : NULL, o, &os, eb);
  if (rc) return rc;
  if ((rc = ce_prepare(logits, labels, mask, o, &c, eb))) return rc;
  if ((rc = distd_tval_new_uninit(DIST_FLOAT64, &os, &res, eb))) goto out;
  double *r = res->data, total = 0;
  for (int64_t i = 0; i < c.rows; i++) {
    double li = c.w[i] == 0 ? 0 : -c.w[i] * c.logp[i * c.classes + c.label[i]];
    if (o->reduction == DIST__V1__REDUCTION__REDUCTION_NONE) r[i] = li;
    total += li;
  }
  if (o->reduction == DIST__V1__REDUCTION__REDUCTION_SUM) r[0] = total;
  if (o->reduction == DIST__V1__REDUCTION__REDUCTION_MEAN)
    r[0] = total / c.wsum; /* no counted row: 0/0 = nan, as torch */
  rc = distd_tval_cast(res, logits->dtype, out, eb);
out:
  ce_rows_free(&c);
  distd_tval_unref(res);
  return rc;
}

int distd_k_cross_entropy_grad(distd_tval *logits, distd_tval *labels,
                               distd_tval *mask, const distd_ce_opts *o,
                               distd_tval *g, distd_tval **out,
                               dist_errbuf *eb) {
  distd_tval *g64 = NULL, *res = NULL;
  ce_rows c;
  *out = NULL;
  int rc = ce_prepare(logits, labels, mask, o, &c, eb);
  if (rc) return rc;
  if ((rc = distd_tval_cast(g, DIST_FLOAT64, &g64, eb)) ||
      (rc = distd_tval_new(DIST_FLOAT64, &logits->shape, &res, eb)))
    goto out;
  const double *gd = g64->data;
  double *r = res->data;
  for (int64_t i = 0; i < c.rows; i++) {
    double scale = c.w[i];
    if (o->reduction == DIST__V1__REDUCTION__REDUCTION_NONE) scale *= gd[i];
    else if (o->reduction == DIST__V1__REDUCTION__REDUCTION_SUM) scale *= gd[0];
    else scale *= gd[0] / c.wsum;
    if (scale == 0) continue;
    for (int64_t j = 0; j < c.classes; j++)
      r[i * c.classes + j] = scale * exp(c.logp[i * c.classes + j]);
    r[i * c.classes + c.label[i]] -= scale;
  }
  rc = distd_tval_cast(res, logits->dtype, out, eb);
out:
  ce_rows_free(&c);
  distd_tval_unref(g64);
  distd_tval_unref(res);
  return rc;
}
