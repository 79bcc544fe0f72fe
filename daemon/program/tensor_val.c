/* Reference-counted local values and dtype conversion. */
#include "tensor_val.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dist/error.h"

/* Buffers are 64-byte aligned so the compiler's vector loops start aligned.
 * Large ones are aligned to 2 MiB and asked to use huge pages: a fresh
 * 64 MiB output otherwise costs 16k page faults, more than the kernel that
 * fills it. */
#define VAL_ALIGN 64
#define HUGE_ALIGN (2u << 20)

/* A few freed large buffers are kept for reuse (exact rounded size): a
 * program run again on same-sized inputs then writes into memory that is
 * already mapped, instead of paying a page fault and the kernel's zeroing
 * pass per 2 MiB page, which costs as much as an elementwise kernel's own
 * write. Bounded by CACHE_SLOTS buffers and CACHE_MAX_BYTES in all; what it
 * holds is reported by distd_tval_cache_bytes. */
#define CACHE_SLOTS 4
#define CACHE_MAX_BYTES ((size_t)256 << 20)

static struct {
  pthread_mutex_t mu;
  void *buf[CACHE_SLOTS];
  size_t size[CACHE_SLOTS];
  size_t total;
} cache = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, 0};

static void *cache_take(size_t rounded) {
  void *p = NULL;
  pthread_mutex_lock(&cache.mu);
  for (int i = 0; i < CACHE_SLOTS && !p; i++)
    if (cache.buf[i] && cache.size[i] == rounded) {
      p = cache.buf[i];
      cache.buf[i] = NULL;
      cache.total -= rounded;
    }
  pthread_mutex_unlock(&cache.mu);
  return p;
}

/* Keeps p when there is room; returns 1 when it did. */
static int cache_put(void *p, size_t rounded) {
  int kept = 0;
  pthread_mutex_lock(&cache.mu);
  for (int i = 0; i < CACHE_SLOTS && !kept; i++)
    if (!cache.buf[i] && cache.total + rounded <= CACHE_MAX_BYTES) {
      cache.buf[i] = p;
      cache.size[i] = rounded;
      cache.total += rounded;
      kept = 1;
    }
  pthread_mutex_unlock(&cache.mu);
  return kept;
}

size_t distd_tval_cache_bytes(void) {
  pthread_mutex_lock(&cache.mu);
  size_t n = cache.total;
  pthread_mutex_unlock(&cache.mu);
  return n;
}

void distd_tval_cache_drop(void) {
  pthread_mutex_lock(&cache.mu);
  for (int i = 0; i < CACHE_SLOTS; i++) {
    free(cache.buf[i]);
    cache.buf[i] = NULL;
  }
  cache.total = 0;
  pthread_mutex_unlock(&cache.mu);
}

static size_t rounded_size(size_t nbytes, size_t *align) {
  size_t a = nbytes >= 2 * HUGE_ALIGN ? HUGE_ALIGN : VAL_ALIGN;
  size_t rounded = (nbytes + a - 1) / a * a;
  if (align) *align = a;
  return rounded ? rounded : VAL_ALIGN;
}

static void *alloc_data(size_t nbytes, int zero) {
  size_t align, rounded = rounded_size(nbytes, &align);
  void *p = align == HUGE_ALIGN ? cache_take(rounded) : NULL;
  if (!p) {
    p = aligned_alloc(align, rounded);
#ifdef MADV_HUGEPAGE
    if (p && align == HUGE_ALIGN) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  }
  if (p && zero) memset(p, 0, rounded);
  return p;
}

static void free_data(void *p, size_t nbytes) {
  size_t align, rounded = rounded_size(nbytes, &align);
  if (align == HUGE_ALIGN && cache_put(p, rounded)) return;
  free(p);
}

static int shape_ok(const dist_shape *s, dist_errbuf *eb) {
  if (s->ndim < 0 || s->ndim > DIST_MAX_DIMS)
    return dist_fail(eb, DIST_EINVAL, "tensor rank %d out of range [0, %d]",
                     s->ndim, DIST_MAX_DIMS);
  for (int d = 0; d < s->ndim; d++)
    if (s->dims[d] < 0)
      return dist_fail(eb, DIST_EINVAL, "negative dim %lld",
                       (long long)s->dims[d]);
  return 0;
}

static int tval_alloc(dist_dtype dt, const dist_shape *shape, int zero,
                      distd_tval **out, dist_errbuf *eb) {
  *out = NULL;
  size_t esz = dist_dtype_size(dt);
  if (esz == 0) return dist_fail(eb, DIST_EINVAL, "invalid dtype %d", (int)dt);
  int rc = shape_ok(shape, eb);
  if (rc) return rc;
  int64_t numel = dist_shape_numel(shape);
  if (numel > (int64_t)(SIZE_MAX / 2 / esz))
    return dist_fail(eb, DIST_ETOOBIG, "tensor of %lld elements too large",
                     (long long)numel);
  distd_tval *t = calloc(1, sizeof *t);
  if (t) t->data = alloc_data((size_t)numel * esz, zero);
  if (!t || !t->data) {
    free(t);
    return dist_fail(eb, DIST_ENOMEM, "cannot allocate %lld elements of %s",
                     (long long)numel, dist_dtype_name(dt));
  }
  t->refs = 1;
  t->dtype = dt;
  t->shape = *shape;
  t->numel = numel;
  *out = t;
  return 0;
}

int distd_tval_new(dist_dtype dt, const dist_shape *shape, distd_tval **out,
                   dist_errbuf *eb) {
  return tval_alloc(dt, shape, 1, out, eb);
}

int distd_tval_new_uninit(dist_dtype dt, const dist_shape *shape,
                          distd_tval **out, dist_errbuf *eb) {
  return tval_alloc(dt, shape, 0, out, eb);
}

int distd_tval_from_data(dist_dtype dt, const dist_shape *shape,
                         const void *data, size_t nbytes, distd_tval **out,
                         dist_errbuf *eb) {
  int rc = distd_tval_new_uninit(dt, shape, out, eb);
  if (rc) return rc;
  if (nbytes != distd_tval_nbytes(*out)) {
    size_t want = distd_tval_nbytes(*out);
    distd_tval_unref(*out);
    *out = NULL;
    return dist_fail(eb, DIST_EMISMATCH, "%zu bytes of data for %zu expected",
                     nbytes, want);
  }
  if (nbytes) memcpy((*out)->data, data, nbytes);
  return 0;
}

int distd_tval_scalar(dist_dtype dt, double v, distd_tval **out,
                      dist_errbuf *eb) {
  dist_shape s = {0, {0}};
  int rc = distd_tval_new(dt, &s, out, eb);
  if (rc) return rc;
  distd_convert((*out)->data, dt, &v, DIST_FLOAT64, 1);
  return 0;
}

int distd_tval_view(distd_tval *x, const dist_shape *shape, distd_tval **out,
                    dist_errbuf *eb) {
  *out = NULL;
  int rc = shape_ok(shape, eb);
  if (rc) return rc;
  if (dist_shape_numel(shape) != x->numel)
    return dist_fail(eb, DIST_EMISMATCH, "cannot view %lld elements as %lld",
                     (long long)x->numel, (long long)dist_shape_numel(shape));
  distd_tval *t = calloc(1, sizeof *t);
  if (!t) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  t->refs = 1;
  t->dtype = x->dtype;
  t->shape = *shape;
  t->numel = x->numel;
  t->data = x->data;
  t->base = distd_tval_ref(x->base ? x->base : x);
  *out = t;
  return 0;
}

int distd_tval_cast(distd_tval *x, dist_dtype dt, distd_tval **out,
                    dist_errbuf *eb) {
  if (x->dtype == dt) {
    *out = distd_tval_ref(x);
    return 0;
  }
  int rc = distd_tval_new_uninit(dt, &x->shape, out, eb);
  if (rc) return rc;
  distd_convert((*out)->data, dt, x->data, x->dtype, x->numel);
  return 0;
}

distd_tval *distd_tval_ref(distd_tval *t) {
  if (t) __atomic_add_fetch(&t->refs, 1, __ATOMIC_RELAXED);
  return t;
}

void distd_tval_unref(distd_tval *t) {
  if (!t || __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  if (t->base)
    distd_tval_unref(t->base);
  else
    free_data(t->data, distd_tval_nbytes(t));
  free(t);
}

size_t distd_tval_nbytes(const distd_tval *t) {
  return (size_t)t->numel * dist_dtype_size(t->dtype);
}

dist_dtype distd_compute_dtype(dist_dtype dt) {
  switch (dt) {
  case DIST_FLOAT16:
  case DIST_BFLOAT16:
  case DIST_FLOAT32: return DIST_FLOAT32;
  case DIST_FLOAT64: return DIST_FLOAT64;
  default: return DIST_INT64;
  }
}

/* ----------------------------------------------------------- conversion */

/* Float to integer with truncation, NaN -> 0 and saturation, so that no
 * input can hit C's undefined out-of-range conversion. */
#define SAT(T, lo, hi)                                                        \
  static inline T sat_##T(double v) {                                         \
    if (v != v) return 0;                                                     \
    if (v <= (double)(lo)) return (lo);                                       \
    if (v >= (double)(hi)) return (hi);                                       \
    return (T)v;                                                              \
  }
SAT(int8_t, INT8_MIN, INT8_MAX)
SAT(uint8_t, 0, UINT8_MAX)
SAT(int32_t, INT32_MIN, INT32_MAX)
SAT(int64_t, INT64_MIN, INT64_MAX)

/* d as a float for a further rounding to float16/bfloat16: truncated, with
 * the last bit set when inexact ("round to odd"), so that the second
 * rounding gives d rounded once. A plain (float)d rounds twice:
 * 1 + 2^-11 + 2^-40 became the half-way case 1 + 2^-11, then 1 in
 * float16 instead of 1 + 2^-10. */
static inline float float_odd(double d) {
  float f = (float)d;
  if ((double)f == d || d != d) return f;
  if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f);
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u |= 1;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Every conversion goes through one of two carriers: int64 between integer
 * types (exact), double otherwise. The loops are per (src, dst) pair so
 * they stay free of per-element switches. */
/* NARROW(v): v as the float a 16-bit float is rounded from: (float) when
 * that is exact (16-bit and 32-bit float sources), float_odd otherwise. */
#define STORE_ALL(LOADEXPR, ISINT, NARROW)                                    \
  switch (ddt) {                                                              \
  case DIST_BOOL:                                                             \
    for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (LOADEXPR) != 0;    \
    break;                                                                    \
  case DIST_INT8:                                                             \
    for (int64_t i = 0; i < n; i++)                                           \
      ((int8_t *)dst)[i] = ISINT ? (int8_t)(LOADEXPR) : sat_int8_t(LOADEXPR); \
    break;                                                                    \
  case DIST_UINT8:                                                            \
    for (int64_t i = 0; i < n; i++)                                           \
      ((uint8_t *)dst)[i] =                                                   \
          ISINT ? (uint8_t)(LOADEXPR) : sat_uint8_t(LOADEXPR);                \
    break;                                                                    \
  case DIST_INT32:                                                            \
    for (int64_t i = 0; i < n; i++)                                           \
      ((int32_t *)dst)[i] =                                                   \
          ISINT ? (int32_t)(LOADEXPR) : sat_int32_t(LOADEXPR);                \
    break;                                                                    \
  case DIST_INT64:                                                            \
    for (int64_t i = 0; i < n; i++)                                           \
      ((int64_t *)dst)[i] =                                                   \
          ISINT ? (int64_t)(LOADEXPR) : sat_int64_t(LOADEXPR);                \
    break;                                                                    \
  case DIST_FLOAT16:                                                          \
    for (int64_t i = 0; i < n; i++)                                           \
      ((uint16_t *)dst)[i] = dist_float_to_half(NARROW(LOADEXPR));            \
    break;                                                                    \
  case DIST_BFLOAT16:                                                         \
    for (int64_t i = 0; i < n; i++)                                           \
      ((uint16_t *)dst)[i] = dist_float_to_bf16(NARROW(LOADEXPR));            \
    break;                                                                    \
  case DIST_FLOAT32:                                                          \
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = (float)(LOADEXPR);    \
    break;                                                                    \
  case DIST_FLOAT64:                                                          \
    for (int64_t i = 0; i < n; i++) ((double *)dst)[i] = (double)(LOADEXPR);  \
    break;                                                                    \
  default: break;                                                             \
  }

void distd_convert(void *dst, dist_dtype ddt, const void *src, dist_dtype sdt,
                   int64_t n) {
  if (ddt == sdt) {
    memcpy(dst, src, (size_t)n * dist_dtype_size(sdt));
    return;
  }
  switch (sdt) {
  case DIST_BOOL:
  case DIST_UINT8: STORE_ALL(((const uint8_t *)src)[i], 1, (float)); break;
  case DIST_INT8: STORE_ALL(((const int8_t *)src)[i], 1, (float)); break;
  case DIST_INT32: STORE_ALL(((const int32_t *)src)[i], 1, float_odd); break;
  case DIST_INT64: STORE_ALL(((const int64_t *)src)[i], 1, float_odd); break;
  case DIST_FLOAT16:
    STORE_ALL((double)dist_half_to_float(((const uint16_t *)src)[i]), 0,
              (float));
    break;
  case DIST_BFLOAT16:
    STORE_ALL((double)dist_bf16_to_float(((const uint16_t *)src)[i]), 0,
              (float));
    break;
  case DIST_FLOAT32: STORE_ALL(((const float *)src)[i], 0, (float)); break;
  case DIST_FLOAT64: STORE_ALL(((const double *)src)[i], 0, float_odd); break;
  default: break;
  }
}
