/* Dtypes, 16-bit floats, box copies and reductions, each checked against an
 * independent reference computed here. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mesh.h" /* dist_reduce_name */
#include "tensor.h"

static const dist_dtype all_dtypes[] = {DIST_BOOL,    DIST_INT8,     DIST_UINT8,
                                        DIST_INT32,   DIST_INT64,    DIST_FLOAT16,
                                        DIST_BFLOAT16, DIST_FLOAT32, DIST_FLOAT64};
#define NDTYPES (sizeof all_dtypes / sizeof all_dtypes[0])

static const dist_reduce all_reduces[] = {DIST_REDUCE_SUM, DIST_REDUCE_MAX, DIST_REDUCE_MIN,
                                          DIST_REDUCE_PROD, DIST_REDUCE_AVG, DIST_REDUCE_ANY,
                                          DIST_REDUCE_ALL};
#define NREDUCES (sizeof all_reduces / sizeof all_reduces[0])

/* ---- dtype table ------------------------------------------------------- */

Test(dtype, sizes_and_names) {
  static const struct {
    dist_dtype dt;
    size_t size;
    const char *name;
    int is_float;
  } want[] = {
      {DIST_BOOL, 1, "bool", 0},         {DIST_INT8, 1, "int8", 0},
      {DIST_UINT8, 1, "uint8", 0},       {DIST_INT32, 4, "int32", 0},
      {DIST_INT64, 8, "int64", 0},       {DIST_FLOAT16, 2, "float16", 1},
      {DIST_BFLOAT16, 2, "bfloat16", 1}, {DIST_FLOAT32, 4, "float32", 1},
      {DIST_FLOAT64, 8, "float64", 1},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    cr_expect_eq(dist_dtype_size(want[i].dt), want[i].size, "%s", want[i].name);
    cr_expect_str_eq(dist_dtype_name(want[i].dt), want[i].name);
    cr_expect_eq(dist_dtype_parse(want[i].name), want[i].dt);
    cr_expect_eq(dist_dtype_is_float(want[i].dt), want[i].is_float, "%s", want[i].name);
  }
}

Test(dtype, invalid_values_are_rejected) {
  cr_expect_eq(dist_dtype_size(DIST_DTYPE_INVALID), 0);
  cr_expect_eq(dist_dtype_size((dist_dtype)42), 0);
  cr_expect_eq(dist_dtype_size((dist_dtype)-1), 0);
  cr_expect_str_eq(dist_dtype_name((dist_dtype)42), "invalid");
  cr_expect_eq(dist_dtype_parse("float128"), DIST_DTYPE_INVALID);
  cr_expect_eq(dist_dtype_parse("invalid"), DIST_DTYPE_INVALID);
  cr_expect_eq(dist_dtype_parse(""), DIST_DTYPE_INVALID);
  cr_expect_eq(dist_dtype_parse(NULL), DIST_DTYPE_INVALID);
}

Test(shape, numel_equal_format) {
  dist_shape s = {2, {2, 3}}, t = {2, {2, 3}}, u = {2, {3, 2}}, scalar = {0, {0}};
  cr_expect_eq(dist_shape_numel(&s), 6);
  cr_expect_eq(dist_shape_numel(&scalar), 1);
  cr_expect(dist_shape_equal(&s, &t));
  cr_expect_not(dist_shape_equal(&s, &u));
  cr_expect_not(dist_shape_equal(&s, &scalar));
  char buf[64];
  dist_shape_format(&s, buf, sizeof buf);
  cr_expect_str_eq(buf, "[2, 3]");
  dist_shape_format(&scalar, buf, sizeof buf);
  cr_expect_str_eq(buf, "[]");
  dist_shape_format(&s, buf, 4); /* truncated, still terminated */
  cr_expect_str_eq(buf, "[2,");
}

/* ---- 16-bit floats ----------------------------------------------------- */

Test(half, known_bit_patterns) {
  cr_expect_eq(dist_float_to_half(1.0f), 0x3C00);
  cr_expect_eq(dist_float_to_half(-2.0f), 0xC000);
  cr_expect_eq(dist_float_to_half(0.0f), 0x0000);
  cr_expect_eq(dist_float_to_half(-0.0f), 0x8000);
  cr_expect_eq(dist_float_to_half(65504.0f), 0x7BFF);
  cr_expect_eq(dist_float_to_half(65520.0f), 0x7C00); /* tie rounds up to inf */
  cr_expect_eq(dist_float_to_half(65519.0f), 0x7BFF);
  cr_expect_eq(dist_float_to_half(INFINITY), 0x7C00);
  cr_expect_eq(dist_float_to_half(-INFINITY), 0xFC00);
  cr_expect_eq(dist_float_to_half(ldexpf(1, -24)), 0x0001); /* smallest subnormal */
  cr_expect_eq(dist_float_to_half(ldexpf(1, -25)), 0x0000); /* tie to even: 0 */
  cr_expect_eq(dist_float_to_half(ldexpf(3, -25)), 0x0002); /* 1.5 units: tie to even 2 */
  cr_expect_eq(dist_float_to_half(ldexpf(1, -14)), 0x0400); /* smallest normal */
  cr_expect_eq(dist_float_to_half(0.1f), 0x2E66);
  /* 1 + 2^-11 is halfway between 1 and 1+2^-10: ties to even (1.0). */
  cr_expect_eq(dist_float_to_half(1.0f + ldexpf(1, -11)), 0x3C00);
  cr_expect_eq(dist_float_to_half(1.0f + 3 * ldexpf(1, -11)), 0x3C02);
  cr_expect_float_eq(dist_half_to_float(0x3C00), 1.0f, 0);
  cr_expect_float_eq(dist_half_to_float(0x7BFF), 65504.0f, 0);
  cr_expect_float_eq(dist_half_to_float(0x0001), ldexpf(1, -24), 0);
  cr_expect(isinf(dist_half_to_float(0x7C00)));
  cr_expect(isnan(dist_half_to_float(0x7E00)));
  cr_expect(isnan(dist_half_to_float(dist_float_to_half(NAN))));
}

Test(half, every_half_round_trips) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = dist_half_to_float((uint16_t)h);
    if (isnan(f)) continue;
    cr_assert_eq(dist_float_to_half(f), h, "half 0x%04x -> %g", h, f);
  }
}

/* Reference: the nearest half by exhaustive search over the neighbours,
 * ties to even mantissa. */
static uint16_t nearest_half(float f) {
  uint16_t best = 0;
  double best_err = INFINITY;
  for (uint32_t h = 0; h < 0x7C00; h++) {
    double err = fabs(fabs((double)f) - dist_half_to_float((uint16_t)h));
    if (err < best_err || (err == best_err && !(h & 1))) best = (uint16_t)h, best_err = err;
  }
  return (uint16_t)(best | (f < 0 ? 0x8000 : 0));
}

Test(half, rounding_matches_exhaustive_search) {
  srand(7);
  for (int i = 0; i < 300; i++) {
    float f = ldexpf((float)rand() / RAND_MAX - 0.5f, rand() % 40 - 26);
    cr_assert_eq(dist_float_to_half(f), nearest_half(f), "%a", (double)f);
  }
}

Test(bf16, known_bit_patterns) {
  cr_expect_eq(dist_float_to_bf16(1.0f), 0x3F80);
  cr_expect_eq(dist_float_to_bf16(-1.0f), 0xBF80);
  cr_expect_eq(dist_float_to_bf16(3.0f), 0x4040);
  cr_expect_eq(dist_float_to_bf16(INFINITY), 0x7F80);
  cr_expect_eq(dist_float_to_bf16(0.1f), 0x3DCD);
  /* 1 + 2^-8 is halfway between 1 and 1+2^-7: ties to even (1.0); 1 + 3*2^-8
   * ties up to 1 + 2^-6. */
  cr_expect_eq(dist_float_to_bf16(1.0f + ldexpf(1, -8)), 0x3F80);
  cr_expect_eq(dist_float_to_bf16(1.0f + 3 * ldexpf(1, -8)), 0x3F82);
  cr_expect_eq(dist_float_to_bf16(3.4028235e38f), 0x7F80); /* FLT_MAX rounds to inf */
  cr_expect(isnan(dist_bf16_to_float(dist_float_to_bf16(NAN))));
  cr_expect_float_eq(dist_bf16_to_float(0x3F80), 1.0f, 0);
  for (uint32_t b = 0; b < 0x10000; b++) {
    float f = dist_bf16_to_float((uint16_t)b);
    if (isnan(f)) continue;
    cr_assert_eq(dist_float_to_bf16(f), b, "bf16 0x%04x", b);
  }
}

Test(elem, get_set_every_dtype) {
  _Alignas(8) char buf[64];
  for (size_t t = 0; t < NDTYPES; t++) {
    dist_dtype dt = all_dtypes[t];
    dist_elem_set(buf, dt, 3, 5.0);
    cr_expect_eq(dist_elem_get(buf, dt, 3), dt == DIST_BOOL ? 1.0 : 5.0, "%s", dist_dtype_name(dt));
    dist_elem_set(buf, dt, 2, 0.0);
    cr_expect_eq(dist_elem_get(buf, dt, 2), 0.0, "%s", dist_dtype_name(dt));
  }
  dist_elem_set(buf, DIST_INT8, 0, 1000.0);
  cr_expect_eq(dist_elem_get(buf, DIST_INT8, 0), 127);
  dist_elem_set(buf, DIST_UINT8, 0, -3.0);
  cr_expect_eq(dist_elem_get(buf, DIST_UINT8, 0), 0);
  dist_elem_set(buf, DIST_INT32, 0, -2.7);
  cr_expect_eq(dist_elem_get(buf, DIST_INT32, 0), -2); /* truncation, like a cast */
  dist_elem_set(buf, DIST_INT64, 0, 1e30);
  int64_t v;
  memcpy(&v, buf, 8);
  cr_expect_eq(v, INT64_MAX);
}

/* ---- box copies -------------------------------------------------------- */

/* Reference: walk every element of the box and compute both addresses. */
static void naive_box_out(int32_t *dst, const int32_t *src, const dist_shape *full,
                          const int64_t *off, const dist_shape *box) {
  int64_t n = dist_shape_numel(box);
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, src_idx = 0, mult = 1;
    for (int d = box->ndim - 1; d >= 0; d--) {
      int64_t c = rem % box->dims[d];
      rem /= box->dims[d];
      src_idx += (c + off[d]) * mult;
      mult *= full->dims[d];
    }
    dst[i] = src[src_idx];
  }
}

/* Random boxes in random tensors of ndim 1..4, including full-width rows
 * (merged runs), empty boxes and the whole tensor. */
static void check_random_boxes(int ndim, unsigned seed) {
  srand(seed);
  for (int iter = 0; iter < 200; iter++) {
    dist_shape full = {ndim, {0}}, box = {ndim, {0}};
    int64_t off[DIST_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
      full.dims[d] = 1 + rand() % (ndim > 4 ? 3 : 6);
      int mode = rand() % 4;
      box.dims[d] = mode == 0 ? full.dims[d] : rand() % (full.dims[d] + 1);
      off[d] = rand() % (full.dims[d] - box.dims[d] + 1);
    }
    int64_t fn = dist_shape_numel(&full), bn = dist_shape_numel(&box);
    int32_t *src = malloc(sizeof(int32_t) * (size_t)fn);
    int32_t *got = calloc((size_t)bn + 1, sizeof(int32_t));
    int32_t *want = calloc((size_t)bn + 1, sizeof(int32_t));
    for (int64_t i = 0; i < fn; i++) src[i] = (int32_t)(i * 7 + 1);
    dist_copy_box_out(got, src, &full, off, &box, sizeof(int32_t));
    naive_box_out(want, src, &full, off, &box);
    cr_assert_arr_eq(got, want, sizeof(int32_t) * (size_t)bn, "out ndim %d iter %d", ndim, iter);
    /* In: write the box back into a zeroed tensor; exactly the box changes. */
    int32_t *dst = calloc((size_t)fn, sizeof(int32_t));
    int32_t *expect = calloc((size_t)fn, sizeof(int32_t));
    for (int64_t i = 0; i < bn; i++) want[i] = -(int32_t)i - 1;
    dist_copy_box_in(dst, &full, off, want, &box, sizeof(int32_t));
    for (int64_t i = 0; i < bn; i++) {
      int64_t rem = i, idx = 0, mult = 1;
      for (int d = ndim - 1; d >= 0; d--) {
        idx += (rem % box.dims[d] + off[d]) * mult;
        rem /= box.dims[d];
        mult *= full.dims[d];
      }
      expect[idx] = want[i];
    }
    cr_assert_arr_eq(dst, expect, sizeof(int32_t) * (size_t)fn, "in ndim %d iter %d", ndim, iter);
    free(src), free(got), free(want), free(dst), free(expect);
  }
}

Test(copy_box, matches_naive_loop_1d) { check_random_boxes(1, 1); }
Test(copy_box, matches_naive_loop_2d) { check_random_boxes(2, 2); }
Test(copy_box, matches_naive_loop_3d) { check_random_boxes(3, 3); }
Test(copy_box, matches_naive_loop_4d) { check_random_boxes(4, 4); }
Test(copy_box, matches_naive_loop_8d) { check_random_boxes(8, 8); }

Test(copy_box, column_of_a_matrix_with_8_byte_elements) {
  double m[3][4], col[3];
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) m[i][j] = i * 10 + j;
  dist_shape full = {2, {3, 4}}, box = {2, {3, 1}};
  int64_t off[2] = {0, 2};
  dist_copy_box_out(col, m, &full, off, &box, sizeof(double));
  cr_expect_eq(col[0], 2);
  cr_expect_eq(col[1], 12);
  cr_expect_eq(col[2], 22);
}

Test(copy_box, scalar_tensor) {
  float src = 3.5f, dst = 0;
  dist_shape s = {0, {0}};
  dist_copy_box_out(&dst, &src, &s, NULL, &s, sizeof(float));
  cr_expect_eq(dst, 3.5f);
}

/* ---- reductions -------------------------------------------------------- */

/* Inputs that stay exact in every dtype: small integers, some negative (not
 * for unsigned), some zero, so any/all and max/min are all exercised. */
static double sample(dist_dtype dt, int rank, int i) {
  if (dt == DIST_BOOL) return ((i + rank) % 3) != 0;
  /* Over four ranks the products stay within int8 / uint8 range. */
  if (dt == DIST_UINT8) return ((i * 7 + rank * 5) % 9) / 2;
  int v = ((i * 7 + rank * 5) % 9) - 4;
  if (dist_dtype_is_float(dt) && i % 4 == 1) return v * 0.5;
  return v;
}

static double ref_apply(dist_reduce op, double a, double b) {
  switch (op) {
    case DIST_REDUCE_SUM:
    case DIST_REDUCE_AVG: return a + b;
    case DIST_REDUCE_PROD: return a * b;
    case DIST_REDUCE_MAX: return a > b ? a : b;
    case DIST_REDUCE_MIN: return a < b ? a : b;
    case DIST_REDUCE_ANY: return a != 0 || b != 0;
    case DIST_REDUCE_ALL: return a != 0 && b != 0;
  }
  return NAN;
}

/* Every dtype x op over K ranks of N elements, vs a double reference that
 * stores each partial result into the dtype as the accumulator would. */
Test(reduce, every_dtype_and_op_matches_double_reference) {
  enum { N = 37, K = 4 };
  for (size_t t = 0; t < NDTYPES; t++) {
    dist_dtype dt = all_dtypes[t];
    size_t sz = dist_dtype_size(dt);
    for (size_t r = 0; r < NREDUCES; r++) {
      dist_reduce op = all_reduces[r];
      _Alignas(8) char acc[N * 8], in[N * 8], ref[N * 8];
      dist_reduce_identity(acc, N, dt, op);
      for (int i = 0; i < N; i++) dist_elem_set(ref, dt, (size_t)i, sample(dt, 0, i));
      memcpy(acc, ref, N * sz);
      for (int k = 1; k < K; k++) {
        for (int i = 0; i < N; i++) {
          dist_elem_set(in, dt, (size_t)i, sample(dt, k, i));
          double v = ref_apply(op, dist_elem_get(ref, dt, (size_t)i), sample(dt, k, i));
          dist_elem_set(ref, dt, (size_t)i, v);
        }
        dist_reduce_into(acc, in, N, dt, op);
      }
      dist_reduce_finish(acc, N, dt, op, K);
      for (int i = 0; i < N; i++) {
        double want = dist_elem_get(ref, dt, (size_t)i);
        if (op == DIST_REDUCE_AVG) {
          dist_elem_set(ref, dt, (size_t)i, want / K);
          want = dist_elem_get(ref, dt, (size_t)i);
        }
        double got = dist_elem_get(acc, dt, (size_t)i);
        cr_assert_eq(got, want, "%s %s elem %d: got %g want %g", dist_dtype_name(dt),
                     dist_reduce_name(op), i, got, want);
      }
    }
  }
}

Test(reduce, identity_values) {
  _Alignas(8) char buf[8];
  dist_reduce_identity(buf, 1, DIST_FLOAT32, DIST_REDUCE_MAX);
  cr_expect(isinf(dist_elem_get(buf, DIST_FLOAT32, 0)) && dist_elem_get(buf, DIST_FLOAT32, 0) < 0);
  dist_reduce_identity(buf, 1, DIST_FLOAT16, DIST_REDUCE_MIN);
  cr_expect_eq(*(uint16_t *)buf, 0x7C00);
  dist_reduce_identity(buf, 1, DIST_BFLOAT16, DIST_REDUCE_MAX);
  cr_expect_eq(*(uint16_t *)buf, 0xFF80);
  dist_reduce_identity(buf, 1, DIST_INT32, DIST_REDUCE_MAX);
  cr_expect_eq(*(int32_t *)buf, INT32_MIN);
  dist_reduce_identity(buf, 1, DIST_INT64, DIST_REDUCE_MIN);
  cr_expect_eq(*(int64_t *)buf, INT64_MAX);
  dist_reduce_identity(buf, 1, DIST_UINT8, DIST_REDUCE_MIN);
  cr_expect_eq(*(uint8_t *)buf, 255);
  dist_reduce_identity(buf, 1, DIST_UINT8, DIST_REDUCE_MAX);
  cr_expect_eq(*(uint8_t *)buf, 0);
  dist_reduce_identity(buf, 1, DIST_INT8, DIST_REDUCE_MAX);
  cr_expect_eq(*(int8_t *)buf, -128);
  dist_reduce_identity(buf, 1, DIST_BOOL, DIST_REDUCE_MIN);
  cr_expect_eq(buf[0], 1);
  dist_reduce_identity(buf, 1, DIST_FLOAT64, DIST_REDUCE_PROD);
  cr_expect_eq(*(double *)buf, 1.0);
  dist_reduce_identity(buf, 1, DIST_FLOAT64, DIST_REDUCE_SUM);
  cr_expect_eq(*(double *)buf, 0.0);
}

/* Reducing the identity into x leaves x unchanged, for every dtype and op. */
Test(reduce, identity_is_neutral) {
  for (size_t t = 0; t < NDTYPES; t++)
    for (size_t r = 0; r < NREDUCES; r++) {
      dist_dtype dt = all_dtypes[t];
      dist_reduce op = all_reduces[r];
      if (op == DIST_REDUCE_ANY || op == DIST_REDUCE_ALL) continue; /* those store 0/1 */
      _Alignas(8) char x[16 * 8], acc[16 * 8];
      for (int i = 0; i < 16; i++) dist_elem_set(x, dt, (size_t)i, sample(dt, 1, i));
      dist_reduce_identity(acc, 16, dt, op);
      dist_reduce_into(acc, x, 16, dt, op);
      cr_assert_arr_eq(acc, x, 16 * dist_dtype_size(dt), "%s op %d", dist_dtype_name(dt), (int)op);
    }
}

Test(reduce, integer_sum_wraps_without_undefined_behaviour) {
  int32_t a[2] = {INT32_MAX, INT32_MIN}, b[2] = {1, -1};
  dist_reduce_into(a, b, 2, DIST_INT32, DIST_REDUCE_SUM);
  cr_expect_eq(a[0], INT32_MIN);
  cr_expect_eq(a[1], INT32_MAX);
  int64_t c = INT64_MAX, d = 2;
  dist_reduce_into(&c, &d, 1, DIST_INT64, DIST_REDUCE_PROD);
  cr_expect_eq(c, -2);
}

/* ---- exact integer average ---------------------------------------------- */

static const dist_dtype int_dtypes[] = {DIST_INT8, DIST_UINT8, DIST_INT32, DIST_INT64};

static int64_t int_at(const char *buf, dist_dtype dt, size_t i) {
  switch (dt) {
    case DIST_INT8: { int8_t v; memcpy(&v, buf + i, 1); return v; }
    case DIST_UINT8: { uint8_t v; memcpy(&v, buf + i, 1); return v; }
    case DIST_INT32: { int32_t v; memcpy(&v, buf + 4 * i, 4); return v; }
    default: { int64_t v; memcpy(&v, buf + 8 * i, 8); return v; }
  }
}

static void int_put(char *buf, dist_dtype dt, size_t i, int64_t v) {
  int8_t i8 = (int8_t)v;
  uint8_t u8 = (uint8_t)v;
  int32_t i32 = (int32_t)v;
  switch (dt) {
    case DIST_INT8: memcpy(buf + i, &i8, 1); break;
    case DIST_UINT8: memcpy(buf + i, &u8, 1); break;
    case DIST_INT32: memcpy(buf + 4 * i, &i32, 4); break;
    default: memcpy(buf + 8 * i, &v, 8); break;
  }
}

/* Values over the dtype's whole range, its least and greatest often. */
static int64_t int_sample(dist_dtype dt, uint64_t *seed) {
  *seed = *seed * 6364136223846793005u + 1442695040888963407u;
  uint64_t r = *seed ^ (*seed >> 29);
  int64_t lo = dt == DIST_INT8 ? INT8_MIN : dt == DIST_UINT8 ? 0
               : dt == DIST_INT32 ? INT32_MIN : INT64_MIN;
  int64_t hi = dt == DIST_INT8 ? INT8_MAX : dt == DIST_UINT8 ? UINT8_MAX
               : dt == DIST_INT32 ? INT32_MAX : INT64_MAX;
  if (r % 5 == 0) return (r / 5) % 2 ? hi : lo;
  if (dt == DIST_INT64) return (int64_t)r;
  return lo + (int64_t)(r % (uint64_t)(hi - lo + 1));
}

/* The average as the test computes it: a 128-bit sum, divided as C does
 * (truncating toward zero). */
__extension__ typedef __int128 wide_int;
static int64_t wide_avg(const int64_t *parts, int k) {
  wide_int sum = 0;
  for (int j = 0; j < k; j++) sum += parts[j];
  return (int64_t)(sum / k);
}

/* k parts of n elements of dt, the first in acc, the others after one
 * another in rest (one byte off alignment, as in a received frame), and
 * the expected averages in want. */
static void int_parts(dist_dtype dt, int k, size_t n, char *acc, char *rest,
                      int64_t *want, uint64_t seed) {
  int64_t parts[16];
  for (size_t i = 0; i < n; i++) {
    for (int j = 0; j < k; j++) {
      parts[j] = int_sample(dt, &seed);
      int_put(j ? rest + (size_t)(j - 1) * n * dist_dtype_size(dt) : acc, dt, i, parts[j]);
    }
    want[i] = wide_avg(parts, k);
  }
}

Test(reduce, integer_avg_of_parts_is_exact_and_truncates_toward_zero) {
  enum { N = 600 }; /* more than one chunk of cells */
  static const int ks[] = {2, 3, 5, 16};
  for (size_t t = 0; t < sizeof int_dtypes / sizeof int_dtypes[0]; t++)
    for (size_t q = 0; q < sizeof ks / sizeof ks[0]; q++) {
      dist_dtype dt = int_dtypes[t];
      int k = ks[q];
      size_t es = dist_dtype_size(dt);
      char *acc = malloc(N * es + 1), *rest = malloc((size_t)(k - 1) * N * es + 2);
      int64_t *want = malloc(N * sizeof *want);
      int_parts(dt, k, N, acc, rest + 1, want, 1234u + 77u * t + q);
      dist_reduce_parts(acc, rest + 1, k, N, dt, DIST_REDUCE_AVG);
      for (size_t i = 0; i < N; i++)
        cr_assert_eq(int_at(acc, dt, i), want[i], "%s k=%d elem %zu: got %lld want %lld",
                     dist_dtype_name(dt), k, i, (long long)int_at(acc, dt, i),
                     (long long)want[i]);
      free(acc);
      free(rest);
      free(want);
    }
}

Test(reduce, integer_avg_of_the_audit_cases) {
  int32_t i32[3] = {2000000000, 2000000000, 2000000000};
  dist_reduce_parts(i32, i32 + 1, 3, 1, DIST_INT32, DIST_REDUCE_AVG);
  cr_expect_eq(i32[0], 2000000000);
  uint8_t u8[3] = {200, 100, 4};
  dist_reduce_parts(u8, u8 + 1, 3, 1, DIST_UINT8, DIST_REDUCE_AVG);
  cr_expect_eq(u8[0], 101);
  int8_t i8[3] = {-100, -100, -27}; /* -227 / 3 = -75.67 */
  dist_reduce_parts(i8, i8 + 1, 3, 1, DIST_INT8, DIST_REDUCE_AVG);
  cr_expect_eq(i8[0], -75);
  int64_t i64[2] = {-7, 0}, big[2] = {INT64_MAX, INT64_MAX - 1};
  dist_reduce_parts(i64, i64 + 1, 2, 1, DIST_INT64, DIST_REDUCE_AVG);
  cr_expect_eq(i64[0], -3);
  dist_reduce_parts(big, big + 1, 2, 1, DIST_INT64, DIST_REDUCE_AVG);
  cr_expect_eq(big[0], INT64_MAX - 1);
}

/* Parts that arrive one at a time (a checkpoint's pieces) go into cells,
 * narrowed in place at the end. */
Test(reduce, integer_avg_cells_take_parts_one_at_a_time) {
  enum { N = 300, K = 7 };
  for (size_t t = 0; t < sizeof int_dtypes / sizeof int_dtypes[0]; t++) {
    dist_dtype dt = int_dtypes[t];
    size_t es = dist_dtype_size(dt);
    char *first = malloc(N * es + 1), *rest = malloc((K - 1) * N * es + 1);
    int64_t want[N];
    int_parts(dt, K, N, first, rest, want, 99u + t);
    dist_int_avg *cells = calloc(N, sizeof *cells);
    dist_int_avg_add(cells, first, N, dt, K);
    for (int j = 0; j < K - 1; j++) dist_int_avg_add(cells, rest + (size_t)j * N * es, N, dt, K);
    dist_int_avg_store(cells, cells, N, dt);
    for (size_t i = 0; i < N; i++)
      cr_assert_eq(int_at((const char *)cells, dt, i), want[i], "%s elem %zu",
                   dist_dtype_name(dt), i);
    free(cells);
    free(first);
    free(rest);
  }
}

/* Every other dtype and op reduces the parts as dist_reduce_into and
 * dist_reduce_finish do, bit for bit. */
Test(reduce, parts_match_reduce_into_for_the_rest) {
  enum { N = 37, K = 4 };
  for (size_t t = 0; t < NDTYPES; t++)
    for (size_t r = 0; r < NREDUCES; r++) {
      dist_dtype dt = all_dtypes[t];
      dist_reduce op = all_reduces[r];
      if (dist_reduce_is_int_avg(dt, op)) continue;
      size_t es = dist_dtype_size(dt);
      _Alignas(8) char parts[K * N * 8], want[N * 8];
      for (int j = 0; j < K; j++)
        for (int i = 0; i < N; i++) dist_elem_set(parts + (size_t)j * N * es, dt, (size_t)i, sample(dt, j, i));
      memcpy(want, parts, N * es);
      for (int j = 1; j < K; j++) dist_reduce_into(want, parts + (size_t)j * N * es, N, dt, op);
      dist_reduce_finish(want, N, dt, op, K);
      dist_reduce_parts(parts, parts + N * es, K, N, dt, op);
      cr_assert_arr_eq(parts, want, N * es, "%s %s", dist_dtype_name(dt), dist_reduce_name(op));
    }
}

Test(reduce, float_max_propagates_nan) {
  float a[2] = {1.0f, NAN}, b[2] = {NAN, 2.0f};
  dist_reduce_into(a, b, 2, DIST_FLOAT32, DIST_REDUCE_MAX);
  cr_expect(isnan(a[0]) && isnan(a[1]));
}

Test(reduce, unaligned_buffers_and_long_runs) {
  enum { N = 1500 };
  char *acc = malloc(N * 8 + 1), *in = malloc(N * 8 + 3);
  for (int i = 0; i < N; i++) {
    double x = i, y = 2 * i;
    memcpy(acc + 1 + i * 8, &x, 8);
    memcpy(in + 3 + i * 8, &y, 8);
  }
  dist_reduce_into(acc + 1, in + 3, N, DIST_FLOAT64, DIST_REDUCE_SUM);
  for (int i = 0; i < N; i++) {
    double v;
    memcpy(&v, acc + 1 + i * 8, 8);
    cr_assert_eq(v, 3.0 * i, "elem %d", i);
  }
  free(acc);
  free(in);
}

Test(reduce, avg_of_halves_and_ints) {
  uint16_t h[2] = {dist_float_to_half(3.0f), dist_float_to_half(-1.0f)};
  dist_reduce_finish(h, 2, DIST_FLOAT16, DIST_REDUCE_AVG, 2);
  cr_expect_eq(dist_half_to_float(h[0]), 1.5f);
  cr_expect_eq(dist_half_to_float(h[1]), -0.5f);
  int32_t v[2] = {7, -7};
  dist_reduce_finish(v, 2, DIST_INT32, DIST_REDUCE_AVG, 2);
  cr_expect_eq(v[0], 3);
  cr_expect_eq(v[1], -3);
  dist_reduce_finish(v, 2, DIST_INT32, DIST_REDUCE_SUM, 2); /* no-op */
  cr_expect_eq(v[0], 3);
}
