/* Shape rules shared by shape inference and the kernels; libdist links
 * them with the inference (client/lib/program_outside.c), so they stay
 * free of the kernels. */
#include <math.h>
#include <string.h>

#include "kernels.h"

static const char *fmt(const dist_shape *s, char *buf, size_t len) {
  dist_shape_format(s, buf, len);
  return buf;
}

int distd_shape_broadcast(const dist_shape *a, const dist_shape *b,
                          dist_shape *out, dist_errbuf *eb) {
  int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
  dist_shape r = {nd, {0}};
  for (int i = 0; i < nd; i++) {
    int ia = a->ndim - nd + i, ib = b->ndim - nd + i;
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char sa[128], sb[128];
      return dist_fail(eb, DIST_EMISMATCH, "shapes %s and %s do not broadcast",
                       fmt(a, sa, sizeof sa), fmt(b, sb, sizeof sb));
    }
    r.dims[i] = da == 1 ? db : da;
  }
  *out = r;
  return 0;
}

int distd_norm_axis(int64_t axis, int ndim, int *out, dist_errbuf *eb) {
  int64_t a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim)
    return dist_fail(eb, DIST_EINVAL, "axis %lld out of range for %d dims",
                     (long long)axis, ndim);
  *out = (int)a;
  return 0;
}

int distd_shape_reduce(const dist_shape *x, const int64_t *axes, size_t naxes,
                       int keepdim, dist_shape *out, uint8_t *reduced,
                       dist_errbuf *eb) {
  uint8_t red[DIST_MAX_DIMS] = {0};
  for (size_t i = 0; i < naxes; i++) {
    int a = 0;
    int rc = distd_norm_axis(axes[i], x->ndim, &a, eb);
    if (rc) return rc;
    if (red[a])
      return dist_fail(eb, DIST_EINVAL, "axis %lld given twice",
                       (long long)axes[i]);
    red[a] = 1;
  }
  if (naxes == 0) memset(red, 1, sizeof red);
  dist_shape r = {0, {0}};
  for (int d = 0; d < x->ndim; d++) {
    if (!red[d])
      r.dims[r.ndim++] = x->dims[d];
    else if (keepdim)
      r.dims[r.ndim++] = 1;
  }
  if (reduced) memcpy(reduced, red, DIST_MAX_DIMS);
  *out = r;
  return 0;
}

int distd_shape_matmul(const dist_shape *a, const dist_shape *b, int ta,
                       int tb, dist_shape *out, dist_errbuf *eb) {
  char sa[128], sb[128];
  if (a->ndim < 1 || b->ndim < 1)
    return dist_fail(eb, DIST_EINVAL, "operands must have at least 1 dim: "
                     "%s x %s", fmt(a, sa, sizeof sa), fmt(b, sb, sizeof sb));
  /* A 1-d a is a row [1, k], a 1-d b a column [k, 1]; transposes do not
   * apply to them (numpy). */
  int64_t m = 1, ka, kb, n = 1;
  if (a->ndim == 1) {
    ka = a->dims[0];
  } else {
    m = a->dims[a->ndim - (ta ? 1 : 2)];
    ka = a->dims[a->ndim - (ta ? 2 : 1)];
  }
  if (b->ndim == 1) {
    kb = b->dims[0];
  } else {
    kb = b->dims[b->ndim - (tb ? 1 : 2)];
    n = b->dims[b->ndim - (tb ? 2 : 1)];
  }
  if (ka != kb)
    return dist_fail(eb, DIST_EMISMATCH, "inner dims differ: %s x %s",
                     fmt(a, sa, sizeof sa), fmt(b, sb, sizeof sb));
  dist_shape ba = {a->ndim > 2 ? a->ndim - 2 : 0, {0}};
  dist_shape bb = {b->ndim > 2 ? b->ndim - 2 : 0, {0}};
  memcpy(ba.dims, a->dims, sizeof(int64_t) * (size_t)ba.ndim);
  memcpy(bb.dims, b->dims, sizeof(int64_t) * (size_t)bb.ndim);
  dist_shape r;
  if (distd_shape_broadcast(&ba, &bb, &r, NULL))
    return dist_fail(eb, DIST_EMISMATCH, "batch dims do not broadcast: %s x %s",
                     fmt(a, sa, sizeof sa), fmt(b, sb, sizeof sb));
  if (r.ndim + 2 > DIST_MAX_DIMS)
    return dist_fail(eb, DIST_EINVAL, "too many dims");
  if (a->ndim > 1) r.dims[r.ndim++] = m;
  if (b->ndim > 1) r.dims[r.ndim++] = n;
  *out = r;
  return 0;
}

int distd_shape_reshape(const dist_shape *x, const int64_t *dims, size_t n,
                        dist_shape *out, dist_errbuf *eb) {
  char sx[128];
  if (n > DIST_MAX_DIMS)
    return dist_fail(eb, DIST_EINVAL, "%zu dims, at most %d", n, DIST_MAX_DIMS);
  dist_shape r = {(int)n, {0}};
  int infer = -1;
  for (size_t i = 0; i < n; i++) {
    if (dims[i] == -1) {
      if (infer >= 0) return dist_fail(eb, DIST_EINVAL, "more than one -1");
      infer = (int)i;
      continue;
    }
    if (dims[i] < 0)
      return dist_fail(eb, DIST_EINVAL, "dim %lld is negative",
                       (long long)dims[i]);
    r.dims[i] = dims[i];
  }
  dist_shape lit; /* the literal dims (-1 as 1), bounded before multiplying */
  memcpy(lit.dims, r.dims, sizeof lit.dims);
  if (infer >= 0) lit.dims[infer] = 1;
  int rc = dist_shape_make(r.ndim, lit.dims, &lit, eb);
  if (rc) return rc;
  int64_t known = dist_shape_numel(&lit), numel = dist_shape_numel(x);
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return dist_fail(eb, DIST_EMISMATCH, "cannot reshape %s (%lld elements)"
                       " with a -1 dim", fmt(x, sx, sizeof sx),
                       (long long)numel);
    r.dims[infer] = numel / known;
  }
  if (dist_shape_numel(&r) != numel) {
    char sr[128];
    return dist_fail(eb, DIST_EMISMATCH, "cannot reshape %s to %s",
                     fmt(x, sx, sizeof sx), fmt(&r, sr, sizeof sr));
  }
  *out = r;
  return 0;
}

int distd_shape_transpose(const dist_shape *x, const int64_t *perm, size_t n,
                          int *perm_out, dist_shape *out, dist_errbuf *eb) {
  if (n != 0 && n != (size_t)x->ndim)
    return dist_fail(eb, DIST_EINVAL, "perm has %zu entries for %d dims", n,
                     x->ndim);
  uint8_t seen[DIST_MAX_DIMS] = {0};
  dist_shape r = {x->ndim, {0}};
  for (int d = 0; d < x->ndim; d++) {
    int p = x->ndim - 1 - d;
    if (n) {
      int rc = distd_norm_axis(perm[d], x->ndim, &p, eb);
      if (rc) return rc;
    }
    if (seen[p])
      return dist_fail(eb, DIST_EINVAL, "perm repeats axis %d", p);
    seen[p] = 1;
    perm_out[d] = p;
    r.dims[d] = x->dims[p];
  }
  *out = r;
  return 0;
}

int distd_shape_concat(const dist_shape *const *xs, int n, int64_t axis,
                       dist_shape *out, dist_errbuf *eb) {
  if (n < 1) return dist_fail(eb, DIST_EINVAL, "nothing to concatenate");
  const dist_shape *f = xs[0];
  int a = 0;
  int rc = distd_norm_axis(axis, f->ndim, &a, eb);
  if (rc) return rc;
  dist_shape r = *f;
  for (int i = 1; i < n; i++) {
    int same = xs[i]->ndim == f->ndim;
    for (int d = 0; same && d < f->ndim; d++)
      if (d != a && xs[i]->dims[d] != f->dims[d]) same = 0;
    if (!same) {
      char s0[128], si[128];
      return dist_fail(eb, DIST_EMISMATCH, "input %d has shape %s, input 0 %s"
                       " (they may differ only in axis %d)", i,
                       fmt(xs[i], si, sizeof si), fmt(f, s0, sizeof s0), a);
    }
    r.dims[a] += xs[i]->dims[a];
  }
  *out = r;
  return 0;
}

/* Python's slice.indices(): clamps start/end to the dim for the step's
 * direction and counts the elements. A step longer than the dim picks at
 * most one element, as a step of the dim itself does: *step is clamped to
 * that so that neither the count below nor the kernels' strides (stride *
 * step) overflow for steps like INT64_MAX. */
static void resolve_one(int64_t dim, int64_t start, int64_t end,
                        int64_t *stepp, int64_t *s0, int64_t *cnt) {
  int64_t lim = dim > 0 ? dim : 1;
  if (*stepp > lim) *stepp = lim;
  if (*stepp < -lim) *stepp = -lim;
  int64_t step = *stepp;
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = start < 0 ? 0 : start > dim ? dim : start;
    end = end < 0 ? 0 : end > dim ? dim : end;
    *cnt = end > start ? (end - start + step - 1) / step : 0;
  } else {
    start = start < 0 ? -1 : start >= dim ? dim - 1 : start;
    end = end < -1 ? -1 : end >= dim ? dim - 1 : end;
    *cnt = start > end ? (start - end - step - 1) / -step : 0;
  }
  *s0 = start;
}

int distd_slice_resolve(const dist_shape *x, const int64_t *axes, size_t naxes,
                        const int64_t *starts, size_t nstarts,
                        const int64_t *ends, size_t nends,
                        const int64_t *steps, size_t nsteps, distd_slice *out,
                        dist_errbuf *eb) {
  size_t n = naxes ? naxes : nstarts;
  if (nstarts != n || nends != n || (nsteps && nsteps != n))
    return dist_fail(eb, DIST_EINVAL, "slice has %zu axes, %zu starts, %zu "
                     "ends, %zu steps", naxes, nstarts, nends, nsteps);
  if (n > (size_t)x->ndim)
    return dist_fail(eb, DIST_EINVAL, "slice of %zu axes on %d dims", n,
                     x->ndim);
  distd_slice s = {x->ndim, {0}, {0}, {0}};
  for (int d = 0; d < x->ndim; d++) {
    s.step[d] = 1;
    s.count[d] = x->dims[d];
  }
  uint8_t seen[DIST_MAX_DIMS] = {0};
  for (size_t i = 0; i < n; i++) {
    int a = (int)i;
    if (naxes) {
      int rc = distd_norm_axis(axes[i], x->ndim, &a, eb);
      if (rc) return rc;
    }
    if (seen[a]) return dist_fail(eb, DIST_EINVAL, "axis %d sliced twice", a);
    seen[a] = 1;
    int64_t step = nsteps ? steps[i] : 1;
    if (step == 0) return dist_fail(eb, DIST_EINVAL, "slice step is 0");
    s.step[a] = step;
    resolve_one(x->dims[a], starts[i], ends[i], &s.step[a], &s.start[a],
                &s.count[a]);
  }
  *out = s;
  return 0;
}

void distd_slice_shape(const distd_slice *s, dist_shape *out) {
  out->ndim = s->ndim;
  for (int d = 0; d < s->ndim; d++) out->dims[d] = s->count[d];
}

int distd_op_is_compare(distd_op op) {
  return op >= DIST__V1__OP_KIND__OP_EQ && op <= DIST__V1__OP_KIND__OP_GE;
}

int distd_op_is_logical(distd_op op) {
  return op == DIST__V1__OP_KIND__OP_LOGICAL_AND ||
         op == DIST__V1__OP_KIND__OP_LOGICAL_OR;
}

dist_dtype distd_reduce_out_dtype(distd_op op, dist_dtype in) {
  if (op == DIST__V1__OP_KIND__OP_SUM && (in == DIST_BOOL || in == DIST_INT32))
    return DIST_INT64;
  return in;
}

static int is_int_dtype(dist_dtype dt) {
  return dt == DIST_INT8 || dt == DIST_UINT8 || dt == DIST_INT32 ||
         dt == DIST_INT64;
}

/* labels may be logits' shape without the class dim, or with it as 1. */
static int rows_shape_ok(const dist_shape *l, const dist_shape *lab) {
  dist_shape rows = *l;
  rows.ndim--;
  if (dist_shape_equal(&rows, lab)) return 1;
  rows.dims[rows.ndim++] = 1;
  return dist_shape_equal(&rows, lab);
}

int distd_shape_cross_entropy(const distd_vmeta *logits,
                              const distd_vmeta *labels,
                              const distd_vmeta *mask, const distd_ce_opts *o,
                              dist_shape *out, dist_errbuf *eb) {
  char sl[128], sb[128];
  if (!dist_dtype_is_float(logits->dtype))
    return dist_fail(eb, DIST_EINVAL, "logits need a float dtype, got %s",
                     dist_dtype_name(logits->dtype));
  if (logits->shape.ndim < 1)
    return dist_fail(eb, DIST_EINVAL, "logits need a class dim");
  if (!is_int_dtype(labels->dtype))
    return dist_fail(eb, DIST_EINVAL, "labels need an integer dtype, got %s",
                     dist_dtype_name(labels->dtype));
  dist_shape_format(&logits->shape, sl, sizeof sl);
  dist_shape_format(&labels->shape, sb, sizeof sb);
  if (!rows_shape_ok(&logits->shape, &labels->shape))
    return dist_fail(eb, DIST_EMISMATCH, "labels %s do not match logits %s",
                     sb, sl);
  if (mask && (mask->dtype == DIST_DTYPE_INVALID ||
               !rows_shape_ok(&logits->shape, &mask->shape))) {
    char sm[128];
    dist_shape_format(&mask->shape, sm, sizeof sm);
    return dist_fail(eb, DIST_EMISMATCH, "mask %s does not match logits %s",
                     sm, sl);
  }
  dist_shape r = {0, {0}};
  if (o->reduction == DIST__V1__REDUCTION__REDUCTION_NONE) {
    r = logits->shape;
    r.ndim--;
  }
  *out = r;
  return 0;
}

int distd_arange_count(double start, double end, double step, int64_t *n,
                       dist_errbuf *eb) {
  if (step == 0) /* numpy and Paddle refuse it too: there is no end */
    return dist_fail(eb, DIST_EINVAL, "step is 0: arange(%g, %g, 0) never "
                     "reaches its end", start, end);
  if (!isfinite(step) || !isfinite(start) || !isfinite(end))
    return dist_fail(eb, DIST_EINVAL, "arange(%g, %g, %g) is not finite",
                     start, end, step);
  double c = ceil((end - start) / step);
  if (c > 1e12)
    return dist_fail(eb, DIST_ETOOBIG, "arange of %.0f elements", c);
  *n = c > 0 ? (int64_t)c : 0;
  return 0;
}
