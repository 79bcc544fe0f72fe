/* Every kernel against a reference computed here in double precision:
 * broadcasting, every compute type, empty tensors (a 0-sized dim). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "program.h"
#include "tval_build.h"

#define OP(o) DIST__V1__OP_KIND__OP_##o

static unsigned rng = 12345;
static double rnd(void) {
  rng = rng * 1103515245u + 12345u;
  return ((rng >> 8) % 20000) / 10000.0 - 1.0; /* [-1, 1) */
}

/* A value filled by gen(i); integers are rounded. */
static distd_tval *make_fn(dist_dtype dt, dist_shape s, double (*gen)(int64_t)) {
  distd_tval *t = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_tval_new(dt, &s, &t, &eb), 0, "%s", eb.msg);
  for (int64_t i = 0; i < t->numel; i++) {
    double v = gen(i);
    if (!dist_dtype_is_float(dt)) v = round(v);
    dist_elem_set(t->data, dt, (size_t)i, v);
  }
  return t;
}

static double gen_rand(int64_t i) { (void)i; return rnd() * 3; }
static double gen_pos(int64_t i) { (void)i; return 0.5 + fabs(rnd()) * 2; }
static double gen_small_int(int64_t i) { (void)i; return 1 + (rng = rng * 1103515245u + 12345u, (rng >> 8) % 3); }
static double gen_iota(int64_t i) { return (double)i; }

/* The element of x that broadcasting maps to output index i. */
static double bat(const distd_tval *x, const dist_shape *os, int64_t i) {
  int64_t off = 0, stride = 1;
  for (int d = os->ndim - 1; d >= 0; d--) {
    int64_t idx = i % os->dims[d];
    i /= os->dims[d];
    int xd = x->shape.ndim - os->ndim + d;
    if (xd < 0) continue;
    if (x->shape.dims[xd] != 1) off += idx * stride;
    stride *= x->shape.dims[xd];
  }
  return at(x, off);
}

/* An integer result stored in dt, wrapping as numpy does. */
static double wrap_int(dist_dtype dt, double v) {
  int64_t i = (int64_t)v;
  switch (dt) {
  case DIST_INT8: return (int8_t)i;
  case DIST_UINT8: return (uint8_t)i;
  case DIST_INT32: return (int32_t)i;
  default: return (double)i;
  }
}

/* The documented cast: int -> int wraps, float -> int truncates and
 * saturates, anything -> bool is != 0, to floats rounds. */
static double ref_cast(dist_dtype s, dist_dtype d, double v) {
  char buf[8];
  if (d == DIST_BOOL) return v != 0;
  if (dist_dtype_is_float(d)) {
    dist_elem_set(buf, d, 0, v);
    return dist_elem_get(buf, d, 0);
  }
  if (!dist_dtype_is_float(s)) return wrap_int(d, v);
  double lo = d == DIST_INT8 ? -128 : d == DIST_UINT8 ? 0 : d == DIST_INT32 ? -2147483648.0 : -9.3e18;
  double hi = d == DIST_INT8 ? 127 : d == DIST_UINT8 ? 255 : d == DIST_INT32 ? 2147483647.0 : 9.3e18;
  v = trunc(v);
  return v < lo ? lo : v > hi ? hi : v;
}

static double tol_for(dist_dtype dt) {
  return dt == DIST_FLOAT16 ? 1e-2 : dt == DIST_BFLOAT16 ? 2e-2 : dt == DIST_FLOAT32 ? 1e-5 : 1e-12;
}

static void expect_close(const distd_tval *t, int64_t i, double ref, double tol,
                         const char *what) {
  double v = at(t, i);
  if (isnan(ref)) {
    cr_assert(isnan(v), "%s[%lld]: %g, expected nan", what, (long long)i, v);
    return;
  }
  cr_assert(fabs(v - ref) <= tol * (1 + fabs(ref)), "%s[%lld]: %.9g, expected %.9g",
            what, (long long)i, v, ref);
}

/* ------------------------------------------------------------ binary */

static double ref_binary(distd_op op, double x, double y, int is_int) {
  switch (op) {
  case OP(ADD): return x + y;
  case OP(SUB): return x - y;
  case OP(MUL): return x * y;
  case OP(DIV): return is_int ? (y == 0 ? 0 : trunc(x / y)) : x / y;
  case OP(POW): return pow(x, y);
  case OP(MAXIMUM): return fmax(x, y);
  case OP(MINIMUM): return fmin(x, y);
  case OP(EQ): return x == y;
  case OP(NE): return x != y;
  case OP(LT): return x < y;
  case OP(LE): return x <= y;
  case OP(GT): return x > y;
  case OP(GE): return x >= y;
  case OP(LOGICAL_AND): return x != 0 && y != 0;
  case OP(LOGICAL_OR): return x != 0 || y != 0;
  default: return NAN;
  }
}

static const dist_dtype all_num[] = {DIST_FLOAT32, DIST_FLOAT64, DIST_INT64,
                                     DIST_INT32, DIST_INT8, DIST_UINT8,
                                     DIST_FLOAT16, DIST_BFLOAT16};

static void check_binary(distd_op op, dist_dtype dt, dist_shape sa, dist_shape sb) {
  int is_int = !dist_dtype_is_float(dt);
  int pos = op == OP(POW) || op == OP(DIV) || dt == DIST_UINT8;
  distd_tval *a = make_fn(dt, sa, pos ? (is_int ? gen_small_int : gen_pos) : gen_rand);
  distd_tval *b = make_fn(dt, sb, pos ? (is_int ? gen_small_int : gen_pos) : gen_rand);
  if (op == OP(EQ) || op == OP(NE)) /* make some equal */
    for (int64_t i = 0; i < b->numel && i < a->numel; i += 2)
      dist_elem_set(b->data, dt, (size_t)i, at(a, i));
  distd_tval *o = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_binary(op, a, b, &o, &eb), 0, "%s", eb.msg);
  int to_bool = distd_op_is_compare(op) || distd_op_is_logical(op);
  cr_assert_eq(o->dtype, to_bool ? DIST_BOOL : dt);
  dist_shape os;
  distd_shape_broadcast(&sa, &sb, &os, NULL);
  cr_assert(dist_shape_equal(&o->shape, &os));
  for (int64_t i = 0; i < o->numel; i++) {
    double ref = ref_binary(op, bat(a, &os, i), bat(b, &os, i), is_int);
    if (!to_bool && is_int) ref = wrap_int(dt, ref); /* numpy wraps */
    expect_close(o, i, ref, to_bool ? 0 : tol_for(dt), distd_op_name(op));
  }
  distd_tval_unref(a);
  distd_tval_unref(b);
  distd_tval_unref(o);
}

Test(kernels, binary_ops_every_dtype_with_broadcasting) {
  dist_shape pairs[][2] = {
      {shp(2, 2, 3), shp(2, 2, 3)}, {shp(2, 2, 3), shp(1, 3)},
      {shp(3, 2, 1, 4), shp(2, 3, 1)}, {shp(0), shp(2, 2, 2)},
      {shp(2, 4, 1), shp(2, 1, 5)}, {shp(1, 37), shp(0)},
      {shp(2, 0, 3), shp(1, 3)}, {shp(2, 3, 1), shp(3, 1, 1, 1)},
  };
  for (distd_op op = OP(ADD); op <= OP(LOGICAL_OR); op++) {
    if (op > OP(MINIMUM) && op < OP(EQ)) continue;
    for (size_t d = 0; d < sizeof all_num / sizeof all_num[0]; d++)
      for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        check_binary(op, all_num[d], pairs[p][0], pairs[p][1]);
  }
}

Test(kernels, binary_dtype_mismatch_is_an_error) {
  distd_tval *a = make_fn(DIST_FLOAT32, shp(1, 2), gen_rand);
  distd_tval *b = make_fn(DIST_INT64, shp(1, 2), gen_rand);
  distd_tval *o = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_binary(OP(ADD), a, b, &o, &eb), DIST_EMISMATCH);
  cr_assert_str_eq(eb.msg, "dtypes differ: float32 vs int64");
  distd_tval_unref(b);
  b = make_fn(DIST_FLOAT32, shp(1, 3), gen_rand);
  cr_assert_eq(distd_k_binary(OP(ADD), a, b, &o, &eb), DIST_EMISMATCH);
  cr_assert_str_eq(eb.msg, "shapes [2] and [3] do not broadcast");
  distd_tval_unref(a);
  distd_tval_unref(b);
}

Test(kernels, integer_division_by_zero_gives_zero) {
  double av[3] = {7, -7, 5}, bv[3] = {2, 2, 0};
  distd_tval *a = make_vals(DIST_INT64, shp(1, 3), av), *b = make_vals(DIST_INT64, shp(1, 3), bv);
  distd_tval *o = NULL;
  cr_assert_eq(distd_k_binary(OP(DIV), a, b, &o, NULL), 0);
  cr_assert_eq(at(o, 0), 3);
  cr_assert_eq(at(o, 1), -3);
  cr_assert_eq(at(o, 2), 0);
  distd_tval_unref(a);
  distd_tval_unref(b);
  distd_tval_unref(o);
}

/* numpy.maximum / numpy.minimum: a NaN on either side gives NaN. */
Test(kernels, maximum_and_minimum_propagate_nan) {
  static const dist_dtype fl[] = {DIST_FLOAT32, DIST_FLOAT64, DIST_FLOAT16, DIST_BFLOAT16};
  double av[4] = {NAN, 1, NAN, 2}, bv[4] = {1, NAN, NAN, 3};
  double want_max[4] = {NAN, NAN, NAN, 3}, want_min[4] = {NAN, NAN, NAN, 2};
  for (size_t d = 0; d < sizeof fl / sizeof fl[0]; d++) {
    distd_tval *a = make_vals(fl[d], shp(1, 4), av), *b = make_vals(fl[d], shp(1, 4), bv);
    distd_tval *mx = NULL, *mn = NULL;
    cr_assert_eq(distd_k_binary(OP(MAXIMUM), a, b, &mx, NULL), 0);
    cr_assert_eq(distd_k_binary(OP(MINIMUM), a, b, &mn, NULL), 0);
    for (int64_t i = 0; i < 4; i++) {
      expect_close(mx, i, want_max[i], 0, "maximum");
      expect_close(mn, i, want_min[i], 0, "minimum");
    }
    distd_tval_unref(a);
    distd_tval_unref(b);
    distd_tval_unref(mx);
    distd_tval_unref(mn);
  }
}

Test(kernels, logical_not_and_where_broadcast) {
  double cv[3] = {1, 0, 1};
  distd_tval *c = make_vals(DIST_BOOL, shp(2, 3, 1), cv);
  distd_tval *a = make_fn(DIST_FLOAT32, shp(2, 1, 4), gen_rand);
  distd_tval *b = make_fn(DIST_FLOAT32, shp(0), gen_rand);
  distd_tval *o = NULL, *n = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_where(c, a, b, &o, &eb), 0, "%s", eb.msg);
  dist_shape os = shp(2, 3, 4);
  cr_assert(dist_shape_equal(&o->shape, &os));
  for (int64_t i = 0; i < 12; i++)
    cr_assert_eq(at(o, i), bat(c, &os, i) ? bat(a, &os, i) : at(b, 0));
  cr_assert_eq(distd_k_logical_not(c, &n, &eb), 0);
  for (int i = 0; i < 3; i++) cr_assert_eq(at(n, i), !cv[i]);
  distd_tval_unref(c); distd_tval_unref(a); distd_tval_unref(b);
  distd_tval_unref(o); distd_tval_unref(n);
}

/* ------------------------------------------------------------- unary */

static double ref_unary(distd_op op, double x, int approx) {
  switch (op) {
  case OP(EXP): return exp(x);
  case OP(LOG): return log(x);
  case OP(SQRT): return sqrt(x);
  case OP(ABS): return fabs(x);
  case OP(NEG): return -x;
  case OP(RELU): return x > 0 ? x : 0;
  case OP(GELU):
    if (approx) return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    return 0.5 * x * (1 + erf(x / sqrt(2)));
  case OP(SILU): return x / (1 + exp(-x));
  case OP(SIGMOID): return 1 / (1 + exp(-x));
  case OP(TANH): return tanh(x);
  default: return NAN;
  }
}

Test(kernels, unary_ops_float_dtypes) {
  dist_dtype dts[] = {DIST_FLOAT32, DIST_FLOAT64, DIST_FLOAT16, DIST_BFLOAT16};
  for (distd_op op = OP(EXP); op <= OP(TANH); op++)
    for (size_t d = 0; d < 4; d++)
      for (int approx = 0; approx < 2; approx++) {
        int pos = op == OP(LOG) || op == OP(SQRT);
        distd_tval *x = make_fn(dts[d], shp(2, 3, 7), pos ? gen_pos : gen_rand);
        distd_tval *o = NULL;
        dist_errbuf eb = DIST_ERRBUF_INIT;
        cr_assert_eq(distd_k_unary(op, approx, x, &o, &eb), 0, "%s", eb.msg);
        cr_assert_eq(o->dtype, dts[d]);
        for (int64_t i = 0; i < x->numel; i++)
          expect_close(o, i, ref_unary(op, at(x, i), approx), tol_for(dts[d]) * 2,
                       distd_op_name(op));
        distd_tval_unref(x);
        distd_tval_unref(o);
      }
}

Test(kernels, unary_integer_ops_and_float_only_errors) {
  distd_tval *x = make_fn(DIST_INT32, shp(1, 9), gen_rand), *o = NULL;
  distd_op ops[3] = {OP(ABS), OP(NEG), OP(RELU)};
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(distd_k_unary(ops[k], 0, x, &o, NULL), 0);
    cr_assert_eq(o->dtype, DIST_INT32);
    for (int64_t i = 0; i < 9; i++) cr_assert_eq(at(o, i), ref_unary(ops[k], at(x, i), 0));
    distd_tval_unref(o);
  }
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_unary(OP(EXP), 0, x, &o, &eb), DIST_EINVAL);
  cr_assert_str_eq(eb.msg, "needs a float dtype, got int32");
  distd_tval *e = make_fn(DIST_FLOAT32, shp(2, 0, 3), gen_rand);
  cr_assert_eq(distd_k_unary(OP(EXP), 0, e, &o, NULL), 0);
  cr_assert_eq(o->numel, 0);
  distd_tval_unref(o);
  distd_tval_unref(e);
  distd_tval_unref(x);
}

/* -------------------------------------------------------- reductions */

/* Reference reduction of x over the axes flagged in red. */
static void ref_reduce(distd_op op, const distd_tval *x, const uint8_t *red,
                       double *out, int64_t nout, double *cnt) {
  for (int64_t o = 0; o < nout; o++) {
    out[o] = op == OP(MAX) ? -INFINITY : op == OP(MIN) ? INFINITY : 0;
    cnt[o] = 0;
  }
  for (int64_t i = 0; i < x->numel; i++) {
    int64_t rem = i, o = 0, mul = 1;
    for (int d = x->shape.ndim - 1; d >= 0; d--) {
      int64_t idx = rem % x->shape.dims[d];
      rem /= x->shape.dims[d];
      if (!red[d]) {
        o += idx * mul;
        mul *= x->shape.dims[d];
      }
    }
    double v = at(x, i);
    if (op == OP(MAX)) out[o] = fmax(out[o], v);
    else if (op == OP(MIN)) out[o] = fmin(out[o], v);
    else out[o] += v;
    cnt[o]++;
  }
  if (op == OP(MEAN))
    for (int64_t o = 0; o < nout; o++) out[o] /= cnt[o];
}

static void check_reduce(distd_op op, dist_dtype dt, dist_shape s, int naxes,
                         const int64_t *axes, int keepdim) {
  distd_tval *x = make_fn(dt, s, gen_rand), *o = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_reduce(op, x, axes, (size_t)naxes, keepdim, &o, &eb), 0, "%s", eb.msg);
  uint8_t red[DIST_MAX_DIMS];
  dist_shape os;
  distd_shape_reduce(&s, axes, (size_t)naxes, keepdim, &os, red, NULL);
  cr_assert(dist_shape_equal(&o->shape, &os));
  double ref[4096], cnt[4096];
  ref_reduce(op, x, red, ref, o->numel, cnt);
  for (int64_t i = 0; i < o->numel; i++)
    expect_close(o, i, ref[i], dist_dtype_is_float(dt) ? tol_for(dt) * 4 : 0,
                 distd_op_name(op));
  distd_tval_unref(x);
  distd_tval_unref(o);
}

Test(kernels, reductions_over_axes_with_keepdim) {
  int64_t a0[] = {0}, a1[] = {1}, a02[] = {0, 2}, a12[] = {-2, -1}, a2[] = {2};
  struct { int n; const int64_t *axes; } sets[] = {{0, NULL}, {1, a0}, {1, a1},
                                                   {2, a02}, {2, a12}, {1, a2}};
  dist_dtype dts[] = {DIST_FLOAT32, DIST_FLOAT64, DIST_INT64, DIST_INT32, DIST_FLOAT16};
  for (distd_op op = OP(SUM); op <= OP(MIN); op++)
    for (size_t d = 0; d < 5; d++)
      for (size_t k = 0; k < 6; k++)
        for (int keep = 0; keep < 2; keep++) {
          if (op == OP(MEAN) && !dist_dtype_is_float(dts[d])) continue;
          check_reduce(op, dts[d], shp(3, 3, 4, 37), sets[k].n, sets[k].axes, keep);
          check_reduce(op, dts[d], shp(3, 2, 1, 5), sets[k].n, sets[k].axes, keep);
        }
}

/* One NaN makes max and min NaN (numpy), whether it sits in a vector lane
 * (5) or the tail (37) of a contiguous row, or in a reduced column. */
static void check_max_min_nan(dist_dtype dt, int64_t nan_at) {
  double v[40];
  for (int i = 0; i < 40; i++) v[i] = i;
  v[nan_at] = NAN;
  distd_tval *row = make_vals(dt, shp(1, 40), v), *cols = make_vals(dt, shp(2, 20, 2), v);
  int64_t a0[] = {0};
  for (distd_op op = OP(MAX); op <= OP(MIN); op++) {
    distd_tval *o = NULL;
    cr_assert_eq(distd_k_reduce(op, row, NULL, 0, 0, &o, NULL), 0);
    expect_close(o, 0, NAN, 0, distd_op_name(op));
    distd_tval_unref(o);
    cr_assert_eq(distd_k_reduce(op, cols, a0, 1, 0, &o, NULL), 0);
    /* numpy: x.reshape(20, 2).max(0) = [38, nan] (min: [0, nan]) */
    expect_close(o, nan_at % 2, NAN, 0, distd_op_name(op));
    expect_close(o, 1 - nan_at % 2, op == OP(MAX) ? 38 + (1 - nan_at % 2) : 1 - nan_at % 2,
                 0, distd_op_name(op));
    distd_tval_unref(o);
  }
  distd_tval_unref(row);
  distd_tval_unref(cols);
}

Test(kernels, max_and_min_reductions_propagate_nan) {
  check_max_min_nan(DIST_FLOAT32, 5);
  check_max_min_nan(DIST_FLOAT64, 37);
  check_max_min_nan(DIST_FLOAT16, 37);
}

Test(kernels, float32_sum_of_many_elements_is_accurate) {
  distd_tval *x = make_fn(DIST_FLOAT32, shp(1, 1000003), gen_rand), *o = NULL;
  cr_assert_eq(distd_k_reduce(OP(SUM), x, NULL, 0, 0, &o, NULL), 0);
  double ref = 0;
  for (int64_t i = 0; i < x->numel; i++) ref += at(x, i);
  cr_assert(fabs(at(o, 0) - ref) < 1e-6 * x->numel / 1000, "%g vs %g", at(o, 0), ref);
  distd_tval_unref(x);
  distd_tval_unref(o);
}

Test(kernels, reductions_of_empty_tensors) {
  distd_tval *x = make_fn(DIST_FLOAT32, shp(2, 0, 3), gen_rand), *o = NULL;
  int64_t a0[] = {0}, a1[] = {1};
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_reduce(OP(SUM), x, a0, 1, 0, &o, &eb), 0, "%s", eb.msg);
  cr_assert_eq(o->numel, 3);
  for (int i = 0; i < 3; i++) cr_assert_eq(at(o, i), 0);
  distd_tval_unref(o);
  cr_assert_eq(distd_k_reduce(OP(MEAN), x, NULL, 0, 0, &o, NULL), 0);
  cr_assert(isnan(at(o, 0)));
  distd_tval_unref(o);
  cr_assert_eq(distd_k_reduce(OP(MAX), x, a1, 1, 0, &o, NULL), 0); /* [0] */
  cr_assert_eq(o->numel, 0);
  distd_tval_unref(o);
  cr_assert_eq(distd_k_reduce(OP(MAX), x, a0, 1, 0, &o, &eb), DIST_EINVAL);
  cr_assert_str_eq(eb.msg, "max of an empty dimension");
  distd_tval *b = make_fn(DIST_BOOL, shp(1, 5), gen_rand);
  cr_assert_eq(distd_k_reduce(OP(SUM), b, NULL, 0, 0, &o, NULL), 0);
  cr_assert_eq(o->dtype, DIST_INT64, "sum of bool counts");
  distd_tval_unref(o);
  distd_tval_unref(b);
  distd_tval_unref(x);
}

/* Paddle's sum (SumRawInferMeta) gives int64 for bool and int32 and keeps
 * every other dtype; max and min always keep it. */
Test(kernels, sum_of_bool_and_int32_is_int64_as_in_paddle) {
  const double big[] = {2e9, 2e9, 2e9, -7};
  distd_tval *x = make_vals(DIST_INT32, shp(2, 2, 2), big), *o = NULL;
  int64_t a0[] = {0};
  cr_assert_eq(distd_k_reduce(OP(SUM), x, a0, 1, 0, &o, NULL), 0);
  cr_assert_eq(o->dtype, DIST_INT64);
  cr_assert_eq(((int64_t *)o->data)[0], 4000000000LL, "no wrap in int32");
  cr_assert_eq(((int64_t *)o->data)[1], 1999999993LL);
  distd_tval_unref(o);
  cr_assert_eq(distd_k_reduce(OP(MAX), x, NULL, 0, 0, &o, NULL), 0);
  cr_assert_eq(o->dtype, DIST_INT32);
  distd_tval_unref(o);
  distd_tval_unref(x);
  for (int d = DIST_BOOL; d <= DIST_FLOAT64; d++) {
    dist_dtype want = d == DIST_BOOL || d == DIST_INT32 ? DIST_INT64 : d;
    cr_assert_eq(distd_reduce_out_dtype(OP(SUM), d), want, "%s",
                 dist_dtype_name(d));
    cr_assert_eq(distd_reduce_out_dtype(OP(MIN), d), d);
  }
}

Test(kernels, softmax_family_along_each_axis) {
  dist_dtype dts[] = {DIST_FLOAT32, DIST_FLOAT64};
  for (int d = 0; d < 2; d++)
    for (int axis = -3; axis < 3; axis++) {
      distd_tval *x = make_fn(dts[d], shp(3, 2, 3, 5), gen_rand);
      int a = axis < 0 ? axis + 3 : axis;
      for (distd_op op = OP(LOGSUMEXP); op <= OP(LOG_SOFTMAX); op++) {
        distd_tval *o = NULL;
        cr_assert_eq(distd_k_softmax(op, x, axis, 1, &o, NULL), 0);
        for (int64_t i = 0; i < x->numel; i++) {
          int64_t idx[3] = {i / 15, i / 5 % 3, i % 5}, j[3];
          double lse = 0;
          memcpy(j, idx, sizeof j);
          for (j[a] = 0; j[a] < x->shape.dims[a]; j[a]++)
            lse += exp(at(x, j[0] * 15 + j[1] * 5 + j[2]));
          lse = log(lse);
          if (op == OP(LOGSUMEXP)) {
            idx[a] = 0;
            int64_t k = 0;
            for (int e = 0; e < 3; e++) k = k * o->shape.dims[e] + idx[e];
            expect_close(o, k, lse, tol_for(dts[d]), "logsumexp");
          } else {
            double ls = at(x, i) - lse;
            expect_close(o, i, op == OP(SOFTMAX) ? exp(ls) : ls, tol_for(dts[d]),
                         distd_op_name(op));
          }
        }
        distd_tval_unref(o);
      }
      distd_tval_unref(x);
    }
}

Test(kernels, cross_entropy_with_ignore_index_and_mask) {
  distd_tval *l = make_fn(DIST_FLOAT64, shp(2, 5, 4), gen_rand);
  double lab[5] = {0, 3, -100, 2, 1}, mk[5] = {1, 0.5, 1, 0, 2};
  distd_tval *y = make_vals(DIST_INT64, shp(1, 5), lab);
  distd_tval *m = make_vals(DIST_FLOAT32, shp(1, 5), mk);
  double loss[5], w_ign = 0, s_ign = 0, w_m = 0, s_m = 0;
  for (int r = 0; r < 5; r++) {
    double lse = 0;
    for (int c = 0; c < 4; c++) lse += exp(at(l, r * 4 + c));
    lse = log(lse);
    loss[r] = lab[r] < 0 ? 0 : lse - at(l, r * 4 + (int)lab[r]);
    if (lab[r] >= 0) { w_ign += 1; s_ign += loss[r]; }
  }
  distd_ce_opts o = {1, -100, DIST__V1__REDUCTION__REDUCTION_MEAN};
  distd_tval *out = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_cross_entropy(l, y, NULL, &o, &out, &eb), 0, "%s", eb.msg);
  expect_close(out, 0, s_ign / w_ign, 1e-12, "ce mean");
  distd_tval_unref(out);
  o.reduction = DIST__V1__REDUCTION__REDUCTION_NONE;
  cr_assert_eq(distd_k_cross_entropy(l, y, NULL, &o, &out, NULL), 0);
  cr_assert_eq(out->numel, 5);
  for (int r = 0; r < 5; r++) expect_close(out, r, loss[r], 1e-12, "ce none");
  distd_tval_unref(out);
  /* With a mask (and ignore_index) as weights. */
  for (int r = 0; r < 5; r++)
    if (lab[r] >= 0) { w_m += mk[r]; s_m += mk[r] * loss[r]; }
  o.reduction = DIST__V1__REDUCTION__REDUCTION_MEAN;
  cr_assert_eq(distd_k_cross_entropy(l, y, m, &o, &out, NULL), 0);
  expect_close(out, 0, s_m / w_m, 1e-12, "ce masked mean");
  distd_tval_unref(out);
  o.reduction = DIST__V1__REDUCTION__REDUCTION_SUM;
  cr_assert_eq(distd_k_cross_entropy(l, y, m, &o, &out, NULL), 0);
  expect_close(out, 0, s_m, 1e-12, "ce masked sum");
  distd_tval_unref(out);
  /* A label out of range is named. */
  o.use_ignore_index = 0;
  cr_assert_eq(distd_k_cross_entropy(l, y, NULL, &o, &out, &eb), DIST_EINVAL);
  cr_assert_str_eq(eb.msg, "label -100 of row 2 out of range [0, 4)");
  distd_tval_unref(l); distd_tval_unref(y); distd_tval_unref(m);
}

/* ------------------------------------------------------------ matmul */

static void check_matmul(dist_dtype dt, dist_shape sa, dist_shape sb, int ta, int tb) {
  distd_tval *a = make_fn(dt, sa, gen_rand), *b = make_fn(dt, sb, gen_rand), *o = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_matmul(a, b, ta, tb, &o, &eb), 0, "%s", eb.msg);
  /* Reference: promote 1-d, broadcast batches by index arithmetic. */
  dist_shape a2 = sa, b2 = sb;
  if (sa.ndim == 1) { a2 = shp(2, 1, (int)sa.dims[0]); ta = 0; }
  if (sb.ndim == 1) { b2 = shp(2, (int)sb.dims[0], 1); tb = 0; }
  int64_t m = a2.dims[a2.ndim - (ta ? 1 : 2)], k = a2.dims[a2.ndim - (ta ? 2 : 1)];
  int64_t n = b2.dims[b2.ndim - (tb ? 2 : 1)];
  dist_shape ba = a2, bb = b2, bo;
  ba.ndim -= 2; bb.ndim -= 2;
  distd_shape_broadcast(&ba, &bb, &bo, NULL);
  int64_t nb = dist_shape_numel(&bo);
  cr_assert_eq(o->numel, nb * m * n);
  for (int64_t bi = 0; bi < nb; bi++) {
    /* batch offsets of a and b */
    int64_t oa = 0, ob = 0, rem = bi, sta = a2.dims[a2.ndim - 1] * a2.dims[a2.ndim - 2],
            stb = b2.dims[b2.ndim - 1] * b2.dims[b2.ndim - 2];
    for (int d = bo.ndim - 1; d >= 0; d--) {
      int64_t idx = rem % bo.dims[d];
      rem /= bo.dims[d];
      int da = ba.ndim - bo.ndim + d, db = bb.ndim - bo.ndim + d;
      if (da >= 0) { if (ba.dims[da] != 1) oa += idx * sta; sta *= ba.dims[da]; }
      if (db >= 0) { if (bb.dims[db] != 1) ob += idx * stb; stb *= bb.dims[db]; }
    }
    int64_t lda = a2.dims[a2.ndim - 1], ldb = b2.dims[b2.ndim - 1];
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t l = 0; l < k; l++)
          s += at(a, oa + (ta ? l * lda + i : i * lda + l)) *
               at(b, ob + (tb ? j * ldb + l : l * ldb + j));
        expect_close(o, bi * m * n + i * n + j, s,
                     dist_dtype_is_float(dt) ? tol_for(dt) * 10 : 0, "matmul");
      }
  }
  distd_tval_unref(a);
  distd_tval_unref(b);
  distd_tval_unref(o);
}

Test(kernels, matmul_shapes_batches_transposes_and_dtypes) {
  dist_dtype dts[] = {DIST_FLOAT32, DIST_FLOAT64, DIST_INT64, DIST_FLOAT16};
  for (int d = 0; d < 4; d++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        check_matmul(dts[d], ta ? shp(2, 4, 3) : shp(2, 3, 4), tb ? shp(2, 5, 4) : shp(2, 4, 5), ta, tb);
        check_matmul(dts[d], ta ? shp(3, 2, 4, 3) : shp(3, 2, 3, 4), tb ? shp(2, 5, 4) : shp(2, 4, 5), ta, tb);
        check_matmul(dts[d], ta ? shp(3, 2, 4, 3) : shp(3, 2, 3, 4), tb ? shp(3, 2, 5, 4) : shp(3, 2, 4, 5), ta, tb);
        check_matmul(dts[d], ta ? shp(4, 2, 1, 4, 3) : shp(4, 2, 1, 3, 4), tb ? shp(3, 3, 5, 4) : shp(3, 3, 4, 5), ta, tb);
        check_matmul(dts[d], shp(1, 4), tb ? shp(3, 2, 5, 4) : shp(3, 2, 4, 5), 0, tb);
        check_matmul(dts[d], ta ? shp(3, 2, 4, 3) : shp(3, 2, 3, 4), shp(1, 4), ta, 0);
      }
  check_matmul(DIST_FLOAT32, shp(1, 7), shp(1, 7), 0, 0);
  check_matmul(DIST_FLOAT32, shp(2, 3, 0), shp(2, 0, 5), 0, 0); /* k = 0: zeros */
  check_matmul(DIST_FLOAT32, shp(2, 0, 4), shp(2, 4, 5), 0, 0);
  check_matmul(DIST_FLOAT64, shp(3, 0, 3, 4), shp(2, 4, 2), 0, 0);
}

Test(kernels, matmul_shape_error) {
  distd_tval *a = make_fn(DIST_FLOAT32, shp(2, 2, 3), gen_rand);
  distd_tval *b = make_fn(DIST_FLOAT32, shp(2, 4, 5), gen_rand), *o = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_matmul(a, b, 0, 0, &o, &eb), DIST_EMISMATCH);
  cr_assert_str_eq(eb.msg, "inner dims differ: [2, 3] x [4, 5]");
  distd_tval_unref(a);
  distd_tval_unref(b);
}

/* ------------------------------------------------------------- shape */

Test(kernels, reshape_with_minus_one_is_a_view) {
  distd_tval *x = make_fn(DIST_FLOAT32, shp(3, 2, 3, 4), gen_iota), *o = NULL;
  dist_shape s;
  int64_t dims[2] = {-1, 6};
  cr_assert_eq(distd_shape_reshape(&x->shape, dims, 2, &s, NULL), 0);
  cr_assert_eq(s.dims[0], 4);
  cr_assert_eq(distd_k_reshape(x, &s, &o, NULL), 0);
  cr_assert_eq(o->data, x->data);
  distd_tval_unref(x); /* the view keeps the buffer */
  cr_assert_eq(at(o, 23), 23);
  distd_tval_unref(o);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_shape x5 = shp(1, 5);
  int64_t bad[2] = {-1, 2};
  cr_assert_eq(distd_shape_reshape(&x5, bad, 2, &s, &eb), DIST_EMISMATCH);
  cr_assert_str_eq(eb.msg, "cannot reshape [5] (5 elements) with a -1 dim");
  dist_shape e = shp(2, 0, 3);
  int64_t ed[2] = {3, 0};
  cr_assert_eq(distd_shape_reshape(&e, ed, 2, &s, NULL), 0, "[0, 3] -> [3, 0]");
  ed[0] = 0;
  ed[1] = -1;
  cr_assert_eq(distd_shape_reshape(&e, ed, 2, &s, &eb), DIST_EMISMATCH,
               "-1 is ambiguous for an empty tensor");
}

Test(kernels, transpose_every_permutation_of_3d) {
  int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  dist_dtype dts[] = {DIST_FLOAT32, DIST_INT8, DIST_FLOAT16, DIST_FLOAT64};
  for (int d = 0; d < 4; d++)
    for (int p = 0; p < 6; p++) {
      distd_tval *x = make_fn(dts[d], shp(3, 2, 3, 4), gen_iota), *o = NULL;
      cr_assert_eq(distd_k_transpose(x, perms[p], &o, NULL), 0);
      for (int64_t i = 0; i < 24; i++) {
        int64_t oi[3] = {i / (o->shape.dims[1] * o->shape.dims[2]),
                         i / o->shape.dims[2] % o->shape.dims[1], i % o->shape.dims[2]};
        int64_t xi[3];
        for (int k = 0; k < 3; k++) xi[perms[p][k]] = oi[k];
        cr_assert_eq(at(o, i), xi[0] * 12 + xi[1] * 4 + xi[2]);
      }
      distd_tval_unref(x);
      distd_tval_unref(o);
    }
}

Test(kernels, slice_with_steps_negative_indices_and_empty) {
  distd_tval *x = make_fn(DIST_INT64, shp(2, 4, 6), gen_iota), *o = NULL;
  distd_slice s;
  int64_t axes[2] = {0, 1}, st[2] = {1, -1}, en[2] = {4, -100}, stp[2] = {2, -2};
  cr_assert_eq(distd_slice_resolve(&x->shape, axes, 2, st, 2, en, 2, stp, 2, &s, NULL), 0);
  cr_assert_eq(distd_k_slice(x, &s, &o, NULL), 0);
  /* rows 1, 3; cols 5, 3, 1 */
  double expect[6] = {11, 9, 7, 23, 21, 19};
  cr_assert_eq(o->numel, 6);
  for (int i = 0; i < 6; i++) cr_assert_eq(at(o, i), expect[i]);
  distd_tval_unref(o);
  int64_t a1[1] = {1}, s1[1] = {5}, e1[1] = {2};
  cr_assert_eq(distd_slice_resolve(&x->shape, a1, 1, s1, 1, e1, 1, NULL, 0, &s, NULL), 0);
  cr_assert_eq(distd_k_slice(x, &s, &o, NULL), 0);
  cr_assert_eq(o->numel, 0);
  cr_assert_eq(o->shape.dims[1], 0);
  distd_tval_unref(o);
  distd_tval_unref(x);
}

/* Steps far longer than the dim pick one element, as python does; the
 * count and the strides must not overflow on the way. numpy:
 * arange(24).reshape(4, 6)[1:4:2**63-1, 3:-2**63:-2**63] == [[9]]. */
Test(kernels, slice_with_steps_near_int64_limits) {
  distd_tval *x = make_fn(DIST_INT64, shp(2, 4, 6), gen_iota), *o = NULL;
  distd_slice s;
  int64_t axes[2] = {0, 1}, st[2] = {1, 3}, en[2] = {4, INT64_MIN};
  int64_t stp[2] = {INT64_MAX, INT64_MIN};
  cr_assert_eq(distd_slice_resolve(&x->shape, axes, 2, st, 2, en, 2, stp, 2, &s, NULL), 0);
  cr_assert_eq(distd_k_slice(x, &s, &o, NULL), 0);
  cr_assert_eq(o->shape.dims[0], 1);
  cr_assert_eq(o->shape.dims[1], 1);
  cr_assert_eq(at(o, 0), 9);
  distd_tval_unref(o);
  distd_tval_unref(x);
}

Test(kernels, set_slice_scalar_and_broadcast_tensor) {
  distd_tval *x = make_fn(DIST_FLOAT32, shp(1, 10), gen_iota), *o = NULL;
  distd_tval *one = NULL;
  distd_tval_scalar(DIST_FLOAT64, 1, &one, NULL);
  distd_slice s;
  int64_t ax[1] = {0}, st[1] = {1}, en[1] = {3};
  distd_slice_resolve(&x->shape, ax, 1, st, 1, en, 1, NULL, 0, &s, NULL);
  cr_assert_eq(distd_k_set_slice(x, &s, one, &o, NULL), 0);
  for (int i = 0; i < 10; i++) cr_assert_eq(at(o, i), i >= 1 && i < 3 ? 1 : i);
  cr_assert_eq(at(x, 1), 1, "the input is unchanged");
  cr_assert_eq(at(x, 2), 2);
  distd_tval_unref(o);
  distd_tval *m = make_fn(DIST_FLOAT32, shp(2, 3, 4), gen_iota);
  double rv[4] = {-1, -2, -3, -4};
  distd_tval *row = make_vals(DIST_FLOAT32, shp(1, 4), rv);
  int64_t a2[1] = {0}, s2[1] = {1}, e2[1] = {3};
  distd_slice_resolve(&m->shape, a2, 1, s2, 1, e2, 1, NULL, 0, &s, NULL);
  cr_assert_eq(distd_k_set_slice(m, &s, row, &o, NULL), 0);
  for (int64_t i = 0; i < 12; i++)
    cr_assert_eq(at(o, i), i >= 4 ? rv[i % 4] : i);
  distd_tval_unref(o); distd_tval_unref(m); distd_tval_unref(row);
  distd_tval_unref(x); distd_tval_unref(one);
}

Test(kernels, concat_along_each_axis_with_empty_input) {
  distd_tval *a = make_fn(DIST_FLOAT32, shp(2, 2, 3), gen_iota);
  distd_tval *b = make_fn(DIST_FLOAT32, shp(2, 1, 3), gen_rand);
  distd_tval *e = make_fn(DIST_FLOAT32, shp(2, 0, 3), gen_rand), *o = NULL;
  distd_tval *xs[3] = {a, e, b};
  cr_assert_eq(distd_k_concat(xs, 3, 0, &o, NULL), 0);
  cr_assert_eq(o->shape.dims[0], 3);
  for (int i = 0; i < 6; i++) cr_assert_eq(at(o, i), i);
  for (int i = 0; i < 3; i++) cr_assert_eq(at(o, 6 + i), at(b, i));
  distd_tval_unref(o);
  distd_tval *c = make_fn(DIST_FLOAT32, shp(2, 2, 2), gen_rand);
  distd_tval *ys[2] = {a, c};
  cr_assert_eq(distd_k_concat(ys, 2, 1, &o, NULL), 0);
  for (int r = 0; r < 2; r++)
    for (int j = 0; j < 5; j++)
      cr_assert_eq(at(o, r * 5 + j), j < 3 ? at(a, r * 3 + j) : at(c, r * 2 + j - 3));
  distd_tval_unref(o);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_concat(ys, 2, 0, &o, &eb), DIST_EMISMATCH);
  cr_assert_str_eq(eb.msg, "input 1 has shape [2, 2], input 0 [2, 3] (they may differ only in axis 0)");
  distd_tval_unref(a); distd_tval_unref(b); distd_tval_unref(e); distd_tval_unref(c);
}

Test(kernels, cast_between_every_dtype_pair) {
  double v[6] = {0, 1, -3, 2.75, 100, -0.5};
  for (int s = DIST_BOOL; s <= DIST_FLOAT64; s++)
    for (int d = DIST_BOOL; d <= DIST_FLOAT64; d++) {
      distd_tval *x = make_vals((dist_dtype)s, shp(1, 6), v), *o = NULL;
      cr_assert_eq(distd_tval_cast(x, (dist_dtype)d, &o, NULL), 0);
      cr_assert_eq(o->dtype, (dist_dtype)d);
      for (int i = 0; i < 6; i++) {
        cr_assert_eq(at(o, i), ref_cast((dist_dtype)s, (dist_dtype)d, at(x, i)),
                     "%s -> %s of %g", dist_dtype_name((dist_dtype)s),
                     dist_dtype_name((dist_dtype)d), at(x, i));
      }
      distd_tval_unref(x);
      distd_tval_unref(o);
    }
}

/* A cast to float16/bfloat16 rounds once, from the exact value: through
 * float first, these land on a half-way case and round to even (down).
 * float16: numpy float64(1 + 2^-11 + 2^-40).astype(float16) is 0x3c01.
 * bfloat16 (8 significant bits): 1 + 2^-8 + 2^-40 is above the half-way
 * point 1 + 2^-8, so 0x3f81; int64 2^24 + 2^16 + 1 likewise 0x4b81. */
static void expect_bits(dist_dtype s, double v, dist_dtype d, uint16_t want) {
  distd_tval *x = make_vals(s, shp(1, 1), &v), *o = NULL;
  cr_assert_eq(distd_tval_cast(x, d, &o, NULL), 0);
  uint16_t got = ((uint16_t *)o->data)[0];
  cr_assert_eq(got, want, "%s %.17g -> %s: 0x%04x, expected 0x%04x",
               dist_dtype_name(s), v, dist_dtype_name(d), got, want);
  distd_tval_unref(x);
  distd_tval_unref(o);
}

Test(kernels, cast_to_16_bit_floats_rounds_once) {
  expect_bits(DIST_FLOAT64, 1 + ldexp(1, -11) + ldexp(1, -40), DIST_FLOAT16, 0x3c01);
  expect_bits(DIST_FLOAT64, -1 - ldexp(1, -11) - ldexp(1, -40), DIST_FLOAT16, 0xbc01);
  expect_bits(DIST_FLOAT64, 1 + ldexp(1, -8) + ldexp(1, -40), DIST_BFLOAT16, 0x3f81);
  expect_bits(DIST_INT64, 16842753, DIST_BFLOAT16, 0x4b81);
  expect_bits(DIST_FLOAT64, 1 + ldexp(1, -11), DIST_FLOAT16, 0x3c00); /* a tie: even */
  expect_bits(DIST_FLOAT64, 1e300, DIST_FLOAT16, 0x7c00);
  expect_bits(DIST_FLOAT64, -1e300, DIST_BFLOAT16, 0xff80);
  expect_bits(DIST_FLOAT64, 1e-300, DIST_FLOAT16, 0x0000);
}

Test(kernels, full_arange_and_expand) {
  distd_tval *o = NULL;
  dist_shape s = shp(2, 2, 3);
  cr_assert_eq(distd_k_full(DIST_INT32, &s, 7.9, &o, NULL), 0);
  for (int i = 0; i < 6; i++) cr_assert_eq(at(o, i), 7);
  distd_tval_unref(o);
  cr_assert_eq(distd_k_arange(DIST_FLOAT32, 0, 10, 1, &o, NULL), 0);
  cr_assert_eq(o->numel, 10);
  for (int i = 0; i < 10; i++) cr_assert_eq(at(o, i), i);
  distd_tval_unref(o);
  cr_assert_eq(distd_k_arange(DIST_FLOAT64, 1, 0, -0.25, &o, NULL), 0);
  cr_assert_eq(o->numel, 4);
  cr_assert_eq(at(o, 3), 0.25);
  distd_tval_unref(o);
  cr_assert_eq(distd_k_arange(DIST_INT64, 5, 5, 1, &o, NULL), 0);
  cr_assert_eq(o->numel, 0);
  distd_tval_unref(o);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_arange(DIST_INT64, 0, 5, 0, &o, &eb), DIST_EINVAL);
  double rv[3] = {1, 2, 3};
  distd_tval *r = make_vals(DIST_FLOAT32, shp(2, 3, 1), rv);
  dist_shape big = shp(3, 2, 3, 4);
  cr_assert_eq(distd_k_expand(r, &big, &o, NULL), 0);
  for (int64_t i = 0; i < 24; i++) cr_assert_eq(at(o, i), rv[i / 4 % 3]);
  distd_tval_unref(o);
  distd_tval_unref(r);
}

Test(kernels, topk_largest_smallest_along_axes_with_ties) {
  double v[8] = {3, 1, 4, 1, 5, 9, 2, 6};
  distd_tval *x = make_vals(DIST_FLOAT32, shp(2, 2, 4), v), *val = NULL, *idx = NULL;
  cr_assert_eq(distd_k_topk(x, 2, 1, 0, &val, &idx, NULL), 0);
  double ev[4] = {4, 3, 9, 6}, ei[4] = {2, 0, 1, 3};
  cr_assert_eq(idx->dtype, DIST_INT64);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(at(val, i), ev[i]);
    cr_assert_eq(at(idx, i), ei[i]);
  }
  distd_tval_unref(val); distd_tval_unref(idx);
  cr_assert_eq(distd_k_topk(x, 2, 1, 1, &val, &idx, NULL), 0); /* smallest, tie 1,1 */
  double sv[4] = {1, 1, 2, 5}, si[4] = {1, 3, 2, 0};
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(at(val, i), sv[i]);
    cr_assert_eq(at(idx, i), si[i]);
  }
  distd_tval_unref(val); distd_tval_unref(idx);
  cr_assert_eq(distd_k_topk(x, 1, 0, 0, &val, &idx, NULL), 0); /* along axis 0 */
  cr_assert_eq(val->shape.dims[0], 1);
  double av[4] = {5, 9, 4, 6}, ai[4] = {1, 1, 0, 1};
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(at(val, i), av[i]);
    cr_assert_eq(at(idx, i), ai[i]);
  }
  distd_tval_unref(val); distd_tval_unref(idx);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_topk(x, 5, 1, 0, &val, &idx, &eb), DIST_EINVAL);
  cr_assert_str_eq(eb.msg, "k = 5 out of range [0, 4]");
  distd_tval_unref(x);
}

/* int64 values past 2^53 are not doubles: ranked and returned exactly.
 * numpy: x = [2^53+1, 2^53+2, 5, 2^53]; largest 3 by a stable argsort of
 * -x: values [2^53+2, 2^53+1, 2^53], indices [1, 0, 3]. */
Test(kernels, topk_of_int64_beyond_double_precision) {
  double zeros[4] = {0};
  distd_tval *x = make_vals(DIST_INT64, shp(1, 4), zeros), *val = NULL, *idx = NULL;
  int64_t big = (int64_t)1 << 53, xv[4] = {big + 1, big + 2, 5, big};
  memcpy(x->data, xv, sizeof xv);
  cr_assert_eq(distd_k_topk(x, 3, 0, 0, &val, &idx, NULL), 0);
  int64_t ev[3] = {big + 2, big + 1, big}, ei[3] = {1, 0, 3};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(((int64_t *)val->data)[i], ev[i], "value %d: %lld", i,
                 (long long)((int64_t *)val->data)[i]);
    cr_assert_eq(((int64_t *)idx->data)[i], ei[i], "index %d", i);
  }
  distd_tval_unref(val);
  distd_tval_unref(idx);
  distd_tval_unref(x);
}

Test(kernels, one_hot_and_out_of_range_index) {
  double v[4] = {0, 3, 1, 3};
  distd_tval *x = make_vals(DIST_INT32, shp(2, 2, 2), v), *o = NULL;
  cr_assert_eq(distd_k_one_hot(x, 4, DIST_FLOAT32, &o, NULL), 0);
  cr_assert_eq(o->shape.ndim, 3);
  for (int64_t i = 0; i < 16; i++) cr_assert_eq(at(o, i), (i % 4) == v[i / 4]);
  distd_tval_unref(o);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_k_one_hot(x, 3, DIST_FLOAT32, &o, &eb), DIST_EINVAL);
  cr_assert_str_eq(eb.msg, "index 3 out of range [0, 3)");
  distd_tval_unref(x);
}
