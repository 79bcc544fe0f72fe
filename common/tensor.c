/* Dtypes, shapes, 16-bit float conversions, element access and box copies.
 * Reductions live in reduce.c and the .npy format in npy.c. */
#include "fileio.h"
#include "tensor.h"
#include "utf8.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
  const char *name;
  size_t size;
  int is_float;
} dtype_table[] = {
    [DIST_DTYPE_INVALID] = {"invalid", 0, 0},
    [DIST_BOOL] = {"bool", 1, 0},
    [DIST_INT8] = {"int8", 1, 0},
    [DIST_UINT8] = {"uint8", 1, 0},
    [DIST_INT32] = {"int32", 4, 0},
    [DIST_INT64] = {"int64", 8, 0},
    [DIST_FLOAT16] = {"float16", 2, 1},
    [DIST_BFLOAT16] = {"bfloat16", 2, 1},
    [DIST_FLOAT32] = {"float32", 4, 1},
    [DIST_FLOAT64] = {"float64", 8, 1},
};

#define DTYPE_COUNT ((int)(sizeof dtype_table / sizeof dtype_table[0]))

static int dtype_valid(dist_dtype dt) {
  return (int)dt > 0 && (int)dt < DTYPE_COUNT;
}

size_t dist_dtype_size(dist_dtype dt) {
  return dtype_valid(dt) ? dtype_table[dt].size : 0;
}

const char *dist_dtype_name(dist_dtype dt) {
  return dtype_valid(dt) ? dtype_table[dt].name : "invalid";
}

dist_dtype dist_dtype_parse(const char *name) {
  if (!name) return DIST_DTYPE_INVALID;
  for (int i = 1; i < DTYPE_COUNT; i++)
    if (strcmp(name, dtype_table[i].name) == 0) return (dist_dtype)i;
  return DIST_DTYPE_INVALID;
}

int dist_dtype_is_float(dist_dtype dt) {
  return dtype_valid(dt) && dtype_table[dt].is_float;
}

int dist_name_check(const char *name, dist_errbuf *eb) {
  size_t len = name ? strlen(name) : 0;
  if (len == 0) return dist_fail(eb, DIST_EINVAL, "a tensor name cannot be empty");
  if (len > DIST_NAME_LEN_MAX)
    return dist_fail(eb, DIST_EINVAL, "tensor name '%.32s...' has %zu bytes, at most %d "
                     "allowed", name, len, DIST_NAME_LEN_MAX);
  if (strcmp(name, "__metadata__") == 0)
    return dist_fail(eb, DIST_EINVAL, "'__metadata__' is reserved (checkpoint files use it)");
  if (!dist_utf8_valid(name, len))
    return dist_fail(eb, DIST_EINVAL, "tensor name is not valid UTF-8");
  return 0;
}

int dist_shape_make(int ndim, const int64_t *dims, dist_shape *out, dist_errbuf *eb) {
  if (ndim < 0 || ndim > DIST_MAX_DIMS)
    return dist_fail(eb, DIST_EINVAL, "%d dims (0 to %d allowed)", ndim, DIST_MAX_DIMS);
  int64_t elements = 1;
  out->ndim = ndim;
  for (int d = 0; d < ndim; d++) {
    if (dims[d] < 0)
      return dist_fail(eb, DIST_EINVAL, "dim %d is negative (%lld)", d, (long long)dims[d]);
    if (dims[d] > DIST_MAX_ELEMENTS)
      return dist_fail(eb, DIST_EINVAL, "dim %d of size %lld is too large", d,
                       (long long)dims[d]);
    /* Checking each dim alone let [2^32, 2^32] through, whose element
     * count wraps to 0. */
    if (dims[d] > DIST_MAX_ELEMENTS / elements) /* elements >= 1 */
      return dist_fail(eb, DIST_EINVAL, "shape has more than 2^48 elements (dims 0 to %d)",
                       d);
    if (dims[d] > 0) elements *= dims[d];
    out->dims[d] = dims[d];
  }
  return 0;
}

int64_t dist_shape_numel(const dist_shape *s) {
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++) n *= s->dims[d];
  return n;
}

int dist_shape_equal(const dist_shape *a, const dist_shape *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->dims[d] != b->dims[d]) return 0;
  return 1;
}

void dist_shape_format(const dist_shape *s, char *buf, size_t len) {
  if (len == 0) return;
  size_t pos = dist_appendf(buf, len, 0, "[");
  for (int d = 0; d < s->ndim; d++)
    pos = dist_appendf(buf, len, pos, "%s%lld", d ? ", " : "", (long long)s->dims[d]);
  dist_appendf(buf, len, pos, "]");
}

/* ---- 16-bit floats ---------------------------------------------------- */

static uint32_t float_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}

static float bits_float(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

float dist_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    /* Zero or subnormal: mant * 2^-24 is exact in a float. */
    float f = ldexpf((float)mant, -24);
    return sign ? -f : f;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Rounds mant >> shift to nearest, ties to even. */
static uint32_t shift_round_even(uint32_t mant, int shift) {
  uint32_t r = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1);
  uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (r & 1))) r++;
  return r;
}

uint16_t dist_float_to_half(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx > 0x7f800000) /* NaN: keep it quiet and keep the top payload */
    return (uint16_t)(sign | 0x7e00 | ((absx >> 13) & 0x3ff));
  if (absx >= 0x477ff000) /* >= 65520 rounds to infinity */
    return (uint16_t)(sign | 0x7c00);
  if (absx < 0x33000000) /* <= 2^-25 rounds to zero (the tie goes even) */
    return (uint16_t)sign;
  if (absx < 0x38800000) {
    /* Subnormal half: count units of 2^-24. The float is mant * 2^(e-150),
     * i.e. mant * 2^(e-126) units, so shift right by 126 - e (14..24). A
     * carry into 0x400 is the smallest normal, encoded correctly. */
    uint32_t mant = (absx & 0x7fffff) | 0x800000;
    int e = (int)(absx >> 23);
    return (uint16_t)(sign | shift_round_even(mant, 126 - e));
  }
  /* Normal: rebias the exponent (127 -> 15) and round 13 mantissa bits; a
   * carry out of the mantissa correctly bumps the exponent. */
  return (uint16_t)(sign | shift_round_even(absx - 0x38000000u, 13));
}

float dist_bf16_to_float(uint16_t b) { return bits_float((uint32_t)b << 16); }

uint16_t dist_float_to_bf16(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even;
   * overflow past the largest finite value lands on infinity. */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* ---- element access --------------------------------------------------- */

/* A C cast from double to an integer is undefined out of range and for NaN:
 * truncate toward zero as the cast would, but saturate and map NaN to 0. */
static double clamp_trunc(double v, double lo, double hi) {
  if (isnan(v)) return 0;
  v = trunc(v);
  if (v < lo) return lo;
  if (v > hi) return hi;
  return v;
}

static int64_t to_int64(double v) {
  if (isnan(v)) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v < -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

double dist_elem_get(const void *buf, dist_dtype dt, size_t i) {
  const char *p = (const char *)buf + i * dist_dtype_size(dt);
  switch (dt) {
    case DIST_BOOL: return *(const uint8_t *)p != 0;
    case DIST_INT8: return *(const int8_t *)p;
    case DIST_UINT8: return *(const uint8_t *)p;
    case DIST_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case DIST_INT64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case DIST_FLOAT16: { uint16_t v; memcpy(&v, p, 2); return dist_half_to_float(v); }
    case DIST_BFLOAT16: { uint16_t v; memcpy(&v, p, 2); return dist_bf16_to_float(v); }
    case DIST_FLOAT32: { float v; memcpy(&v, p, 4); return v; }
    case DIST_FLOAT64: { double v; memcpy(&v, p, 8); return v; }
    default: return 0;
  }
}

void dist_elem_set(void *buf, dist_dtype dt, size_t i, double v) {
  char *p = (char *)buf + i * dist_dtype_size(dt);
  switch (dt) {
    case DIST_BOOL: *(uint8_t *)p = v != 0; break;
    case DIST_INT8: *(int8_t *)p = (int8_t)clamp_trunc(v, INT8_MIN, INT8_MAX); break;
    case DIST_UINT8: *(uint8_t *)p = (uint8_t)clamp_trunc(v, 0, UINT8_MAX); break;
    case DIST_INT32: {
      int32_t x = (int32_t)clamp_trunc(v, INT32_MIN, INT32_MAX);
      memcpy(p, &x, 4);
      break;
    }
    case DIST_INT64: { int64_t x = to_int64(v); memcpy(p, &x, 8); break; }
    case DIST_FLOAT16: { uint16_t x = dist_float_to_half((float)v); memcpy(p, &x, 2); break; }
    case DIST_BFLOAT16: { uint16_t x = dist_float_to_bf16((float)v); memcpy(p, &x, 2); break; }
    case DIST_FLOAT32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case DIST_FLOAT64: memcpy(p, &v, 8); break;
    default: break;
  }
}

/* ---- box copies ------------------------------------------------------- */

/* Copies between the box at `offset` inside a row-major tensor `full` and a
 * contiguous `packed` buffer. The innermost dims that the box covers whole,
 * plus the first one it does not, form one contiguous run per memcpy; the
 * remaining outer dims are walked with an odometer. */
static void copy_box(char *full, const dist_shape *fs, const int64_t *offset,
                     char *packed, const dist_shape *box, size_t elem,
                     int to_packed) {
  int nd = box->ndim;
  if (dist_shape_numel(box) <= 0) return;
  if (nd == 0) {
    if (to_packed) memcpy(packed, full, elem);
    else memcpy(full, packed, elem);
    return;
  }
  int64_t stride[DIST_MAX_DIMS];
  stride[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; d--) stride[d] = stride[d + 1] * fs->dims[d + 1];
  int inner = nd - 1;
  size_t run = (size_t)box->dims[nd - 1];
  while (inner > 0 && box->dims[inner] == fs->dims[inner]) {
    inner--;
    run *= (size_t)box->dims[inner];
  }
  size_t run_bytes = run * elem;
  int64_t base = 0;
  for (int d = 0; d < nd; d++) base += offset[d] * stride[d];
  int64_t idx[DIST_MAX_DIMS] = {0};
  for (;;) {
    int64_t pos = base;
    for (int d = 0; d < inner; d++) pos += idx[d] * stride[d];
    char *f = full + (size_t)pos * elem;
    if (to_packed) memcpy(packed, f, run_bytes);
    else memcpy(f, packed, run_bytes);
    packed += run_bytes;
    int d = inner - 1;
    while (d >= 0 && ++idx[d] == box->dims[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

void dist_copy_box_out(void *dst, const void *src, const dist_shape *src_shape,
                       const int64_t *offset, const dist_shape *box,
                       size_t elem) {
  /* copy_box only reads through `full` when to_packed is set. */
  copy_box((char *)(uintptr_t)src, src_shape, offset, dst, box, elem, 1);
}

void dist_copy_box_in(void *dst, const dist_shape *dst_shape,
                      const int64_t *offset, const void *src,
                      const dist_shape *box, size_t elem) {
  copy_box(dst, dst_shape, offset, (char *)(uintptr_t)src, box, elem, 0);
}
