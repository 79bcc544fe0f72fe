/* Shape kernels: reshape, transpose, slice and slice assignment, concat,
 * creation (full, arange), top-k and one-hot. Moving elements does not
 * depend on their dtype, only on their size, so these work on 1, 2, 4 and
 * 8-byte elements. */
/* The hot loops need the vectorizer's full cost model (-O3); the build's
 * -O2 only vectorizes loops with no remainder. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static void row_strides(const dist_shape *s, int64_t *st) {
  int64_t stride = 1;
  for (int d = s->ndim - 1; d >= 0; d--) {
    st[d] = stride;
    stride *= s->dims[d];
  }
}

/* Walks the dims (an odometer over all but the last), calling a typed row
 * loop: `packed` is contiguous, `strided` starts at base with strides st.
 * gather copies strided -> packed, otherwise packed -> strided. */
#define STRIDED_ROW(T)                                                        \
  do {                                                                        \
    T *pk = (T *)packed + r * n;                                              \
    T *sp = (T *)strided + off;                                               \
    if (gather)                                                               \
      for (int64_t i = 0; i < n; i++) pk[i] = sp[i * s];                      \
    else                                                                      \
      for (int64_t i = 0; i < n; i++) sp[i * s] = pk[i];                      \
  } while (0)

static void strided_move(void *packed, void *strided, int64_t base, int nd,
                         const int64_t *dims, const int64_t *st, size_t esz,
                         int gather) {
  int64_t rows = 1, idx[DIST_MAX_DIMS] = {0};
  for (int d = 0; d < nd - 1; d++) rows *= dims[d];
  int64_t n = nd ? dims[nd - 1] : 1, s = nd ? st[nd - 1] : 0, off = base;
  if (n == 0) return;
  for (int64_t r = 0; r < rows; r++) {
    if (esz == 1) STRIDED_ROW(uint8_t);
    else if (esz == 2) STRIDED_ROW(uint16_t);
    else if (esz == 4) STRIDED_ROW(uint32_t);
    else STRIDED_ROW(uint64_t);
    for (int d = nd - 2; d >= 0; d--) {
      off += st[d];
      if (++idx[d] < dims[d]) break;
      off -= st[d] * dims[d];
      idx[d] = 0;
    }
  }
}

int distd_k_reshape(distd_tval *x, const dist_shape *shape, distd_tval **out,
                    dist_errbuf *eb) {
  return distd_tval_view(x, shape, out, eb);
}

int distd_k_transpose(distd_tval *x, const int *perm, distd_tval **out,
                      dist_errbuf *eb) {
  int64_t st[DIST_MAX_DIMS], pst[DIST_MAX_DIMS];
  dist_shape os = x->shape;
  row_strides(&x->shape, st);
  for (int d = 0; d < x->shape.ndim; d++) {
    os.dims[d] = x->shape.dims[perm[d]];
    pst[d] = st[perm[d]];
  }
  int rc = distd_tval_new_uninit(x->dtype, &os, out, eb);
  if (rc) return rc;
  strided_move((*out)->data, x->data, 0, os.ndim, os.dims, pst,
               dist_dtype_size(x->dtype), 1);
  return 0;
}

static int64_t slice_layout(const distd_tval *x, const distd_slice *s,
                            int64_t *sst) {
  int64_t st[DIST_MAX_DIMS], base = 0;
  row_strides(&x->shape, st);
  for (int d = 0; d < s->ndim; d++) {
    sst[d] = st[d] * s->step[d];
    if (s->count[d]) base += s->start[d] * st[d];
  }
  return base;
}

int distd_k_slice(distd_tval *x, const distd_slice *s, distd_tval **out,
                  dist_errbuf *eb) {
  dist_shape os;
  int64_t sst[DIST_MAX_DIMS];
  distd_slice_shape(s, &os);
  int rc = distd_tval_new_uninit(x->dtype, &os, out, eb);
  if (rc || (*out)->numel == 0) return rc;
  int64_t base = slice_layout(x, s, sst);
  strided_move((*out)->data, x->data, base, os.ndim, os.dims, sst,
               dist_dtype_size(x->dtype), 1);
  return 0;
}

int distd_k_set_slice(distd_tval *x, const distd_slice *s, distd_tval *v,
                      distd_tval **out, dist_errbuf *eb) {
  distd_tval *cv = NULL, *ev = NULL, *res = NULL;
  dist_shape ss;
  int64_t sst[DIST_MAX_DIMS];
  distd_slice_shape(s, &ss);
  *out = NULL;
  int rc;
  if ((rc = distd_tval_cast(v, x->dtype, &cv, eb)) ||
      (rc = distd_k_expand(cv, &ss, &ev, eb)) ||
      (rc = distd_tval_from_data(x->dtype, &x->shape, x->data,
                                 distd_tval_nbytes(x), &res, eb)))
    goto out;
  if (ev->numel) {
    int64_t base = slice_layout(x, s, sst);
    strided_move(ev->data, res->data, base, ss.ndim, ss.dims, sst,
                 dist_dtype_size(x->dtype), 0);
  }
  *out = res;
  res = NULL;
out:
  distd_tval_unref(cv);
  distd_tval_unref(ev);
  distd_tval_unref(res);
  return rc;
}

int distd_k_concat(distd_tval *const *xs, int n, int axis, distd_tval **out,
                   dist_errbuf *eb) {
  const dist_shape *shapes[DISTD_CONCAT_MAX];
  dist_shape os;
  *out = NULL;
  if (n > DISTD_CONCAT_MAX)
    return dist_fail(eb, DIST_EINVAL, "%d inputs, at most %d", n,
                     DISTD_CONCAT_MAX);
  for (int i = 0; i < n; i++) {
    shapes[i] = &xs[i]->shape;
    if (xs[i]->dtype != xs[0]->dtype)
      return dist_fail(eb, DIST_EMISMATCH, "input %d is %s, input 0 %s", i,
                       dist_dtype_name(xs[i]->dtype),
                       dist_dtype_name(xs[0]->dtype));
  }
  int rc = distd_shape_concat(shapes, n, axis, &os, eb);
  if (rc || (rc = distd_tval_new_uninit(xs[0]->dtype, &os, out, eb))) return rc;
  size_t esz = dist_dtype_size(xs[0]->dtype);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; d++) outer *= os.dims[d];
  for (int d = axis + 1; d < os.ndim; d++) inner *= os.dims[d];
  size_t orow = (size_t)(os.dims[axis] * inner) * esz, at = 0;
  for (int i = 0; i < n; i++) {
    size_t irow = (size_t)(xs[i]->shape.dims[axis] * inner) * esz;
    for (int64_t o = 0; o < outer && irow; o++)
      memcpy((char *)(*out)->data + (size_t)o * orow + at,
             (char *)xs[i]->data + (size_t)o * irow, irow);
    at += irow;
  }
  return 0;
}

int distd_k_full(dist_dtype dt, const dist_shape *shape, double v,
                 distd_tval **out, dist_errbuf *eb) {
  int rc = distd_tval_new_uninit(dt, shape, out, eb);
  if (rc) return rc;
  size_t esz = dist_dtype_size(dt);
  char one[8];
  distd_convert(one, dt, &v, DIST_FLOAT64, 1);
  char *p = (*out)->data;
  for (int64_t i = 0; i < (*out)->numel; i++) memcpy(p + (size_t)i * esz, one, esz);
  return 0;
}

int distd_k_arange(dist_dtype dt, double start, double end, double step,
                   distd_tval **out, dist_errbuf *eb) {
  int64_t n = 0;
  distd_tval *d = NULL;
  int rc = distd_arange_count(start, end, step, &n, eb);
  dist_shape s = {1, {n}};
  if (rc || (rc = distd_tval_new_uninit(DIST_FLOAT64, &s, &d, eb))) return rc;
  for (int64_t i = 0; i < n; i++) ((double *)d->data)[i] = start + (double)i * step;
  rc = distd_tval_cast(d, dt, out, eb);
  distd_tval_unref(d);
  return rc;
}

/* -------------------------------------------------------------- topk */

/* A sort key: floats compare as double (v), integers as int64 (iv) so
 * that values past 2^53 keep their order; the other field is 0. */
typedef struct ranked {
  double v;
  int64_t iv;
  int64_t i;
} ranked;

/* By value (ties by lower index); NaN ranks above everything (as torch). */
static int rank_cmp(const ranked *a, const ranked *b, int desc) {
  int an = isnan(a->v), bn = isnan(b->v);
  if (an != bn) return an == desc ? -1 : 1;
  int sign = desc ? 1 : -1; /* a < b: a after b when descending */
  if (!an && a->v != b->v) return a->v < b->v ? sign : -sign;
  if (a->iv != b->iv) return a->iv < b->iv ? sign : -sign;
  return a->i < b->i ? -1 : a->i > b->i;
}

static int rank_desc(const void *a, const void *b) { return rank_cmp(a, b, 1); }
static int rank_asc(const void *a, const void *b) { return rank_cmp(a, b, 0); }

/* Moves axis last (perm), or back (inverse) */
static void last_perm(int ndim, int axis, int *perm, int *inv) {
  int k = 0;
  for (int d = 0; d < ndim; d++)
    if (d != axis) perm[k++] = d;
  perm[k] = axis;
  for (int d = 0; d < ndim; d++) inv[perm[d]] = d;
}

/* Ranks the rows of xt (x with axis moved last) by their keys kt and
 * copies the k chosen elements of xt into v, their positions into ix. */
static void topk_rows(const distd_tval *xt, const distd_tval *kt, int64_t n,
                      int64_t k, int smallest, ranked *buf, distd_tval *v,
                      distd_tval *ix) {
  int64_t rows = n && k ? xt->numel / n : 0;
  size_t esz = dist_dtype_size(xt->dtype);
  int fl = kt->dtype == DIST_FLOAT64;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t j = 0; j < n; j++) {
      int64_t at = r * n + j;
      buf[j] = fl ? (ranked){((const double *)kt->data)[at], 0, j}
                  : (ranked){0, ((const int64_t *)kt->data)[at], j};
    }
    qsort(buf, (size_t)n, sizeof *buf, smallest ? rank_asc : rank_desc);
    for (int64_t j = 0; j < k; j++) {
      memcpy((char *)v->data + (size_t)(r * k + j) * esz,
             (const char *)xt->data + (size_t)(r * n + buf[j].i) * esz, esz);
      ((int64_t *)ix->data)[r * k + j] = buf[j].i;
    }
  }
}

/* The values are copied from x, never through a double (int64 past 2^53
 * would round). */
int distd_k_topk(distd_tval *x, int64_t k, int axis, int smallest,
                 distd_tval **values, distd_tval **indices, dist_errbuf *eb) {
  distd_tval *xt = NULL, *kt = NULL, *v = NULL, *ix = NULL;
  ranked *buf = NULL;
  int perm[DIST_MAX_DIMS], inv[DIST_MAX_DIMS], rc = 0;
  *values = *indices = NULL;
  int nd = x->shape.ndim;
  int64_t n = x->shape.dims[axis];
  if (k < 0 || k > n)
    return dist_fail(eb, DIST_EINVAL, "k = %lld out of range [0, %lld]",
                     (long long)k, (long long)n);
  last_perm(nd, axis, perm, inv);
  dist_dtype key = dist_dtype_is_float(x->dtype) ? DIST_FLOAT64 : DIST_INT64;
  if ((rc = distd_k_transpose(x, perm, &xt, eb)) ||
      (rc = distd_tval_cast(xt, key, &kt, eb)))
    goto out;
  dist_shape ts = xt->shape;
  ts.dims[nd - 1] = k;
  if ((rc = distd_tval_new_uninit(x->dtype, &ts, &v, eb)) ||
      (rc = distd_tval_new_uninit(DIST_INT64, &ts, &ix, eb)))
    goto out;
  if (n && !(buf = malloc(sizeof *buf * (size_t)n))) {
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory");
    goto out;
  }
  topk_rows(xt, kt, n, k, smallest, buf, v, ix);
  if ((rc = distd_k_transpose(v, inv, values, eb))) goto out;
  if ((rc = distd_k_transpose(ix, inv, indices, eb))) {
    distd_tval_unref(*values);
    *values = NULL;
  }
out:
  free(buf);
  distd_tval_unref(xt);
  distd_tval_unref(kt);
  distd_tval_unref(v);
  distd_tval_unref(ix);
  return rc;
}

int distd_k_topk_grad(const dist_shape *x_shape, distd_tval *idx,
                      distd_tval *g, int axis, distd_tval **out,
                      dist_errbuf *eb) {
  distd_tval *g64 = NULL, *gt = NULL, *it = NULL, *acc = NULL, *back = NULL;
  int perm[DIST_MAX_DIMS], inv[DIST_MAX_DIMS], nd = x_shape->ndim, rc;
  *out = NULL;
  last_perm(nd, axis, perm, inv);
  dist_shape as;
  for (int d = 0; d < nd; d++) as.dims[d] = x_shape->dims[perm[d]];
  as.ndim = nd;
  if ((rc = distd_tval_cast(g, DIST_FLOAT64, &g64, eb)) ||
      (rc = distd_k_transpose(g64, perm, &gt, eb)) ||
      (rc = distd_k_transpose(idx, perm, &it, eb)) ||
      (rc = distd_tval_new(DIST_FLOAT64, &as, &acc, eb)))
    goto out;
  int64_t n = as.dims[nd - 1], k = gt->shape.dims[nd - 1];
  int64_t rows = k ? gt->numel / k : 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < k; j++) {
      int64_t at = ((int64_t *)it->data)[r * k + j];
      ((double *)acc->data)[r * n + at] += ((double *)gt->data)[r * k + j];
    }
  if ((rc = distd_k_transpose(acc, inv, &back, eb))) goto out;
  rc = distd_tval_cast(back, g->dtype, out, eb);
out:
  distd_tval_unref(g64);
  distd_tval_unref(gt);
  distd_tval_unref(it);
  distd_tval_unref(acc);
  distd_tval_unref(back);
  return rc;
}

/* ----------------------------------------------------------- one_hot */

int distd_k_one_hot(distd_tval *x, int64_t num_classes, dist_dtype dt,
                    distd_tval **out, dist_errbuf *eb) {
  distd_tval *xi = NULL, *res = NULL;
  dist_shape os = x->shape;
  *out = NULL;
  if (os.ndim >= DIST_MAX_DIMS)
    return dist_fail(eb, DIST_EINVAL, "too many dims");
  os.dims[os.ndim++] = num_classes;
  int rc;
  if ((rc = distd_tval_cast(x, DIST_INT64, &xi, eb)) ||
      (rc = distd_tval_new(dt, &os, &res, eb)))
    goto out;
  size_t esz = dist_dtype_size(dt);
  char one[8];
  double v1 = 1.0;
  distd_convert(one, dt, &v1, DIST_FLOAT64, 1);
  for (int64_t i = 0; i < x->numel; i++) {
    int64_t c = ((int64_t *)xi->data)[i];
    if (c < 0 || c >= num_classes) {
      rc = dist_fail(eb, DIST_EINVAL, "index %lld out of range [0, %lld)",
                     (long long)c, (long long)num_classes);
      goto out;
    }
    memcpy((char *)res->data + (size_t)(i * num_classes + c) * esz, one, esz);
  }
  *out = res;
  res = NULL;
out:
  distd_tval_unref(xi);
  distd_tval_unref(res);
  return rc;
}
