/* Elementwise reductions for every dtype and reduce type. Each C type gets a
 * typed loop from one macro (so the compiler can vectorise it); float16 and
 * bfloat16 are widened to float in chunks and reuse the float32 loop; bool is
 * logical (sum/max/any are OR, prod/min/all are AND). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tensor.h"

/* Signed overflow is undefined in C. Integer reductions wrap as two's
 * complement hardware (and NCCL) does, so do the arithmetic unsigned. */
#define WRAP_ADD(T, UT) (T)((UT)a + (UT)b)
#define WRAP_MUL(T, UT) (T)((UT)a * (UT)b)
#define PLAIN_ADD(T, UT) (a + b)
#define PLAIN_MUL(T, UT) (a * b)
/* Floats propagate NaN through max/min, as numpy and torch do. */
#define FLOAT_MAX ((a > b || a != a) ? a : b)
#define FLOAT_MIN ((a < b || a != a) ? a : b)
#define INT_MAX_OF (a > b ? a : b)
#define INT_MIN_OF (a < b ? a : b)

#define APPLY(T, EXPR)               \
  for (size_t i = 0; i < n; i++) {  \
    T a = acc[i], b = in[i];        \
    acc[i] = (T)(EXPR);             \
  }                                 \
  break

#define DEFINE_REDUCE(NAME, T, UT, ADD, MUL, MAXE, MINE)                    \
  static void reduce_##NAME(T *acc, const T *in, size_t n, dist_reduce op) { \
    switch (op) {                                                           \
      case DIST_REDUCE_SUM:                                                 \
      case DIST_REDUCE_AVG: APPLY(T, ADD(T, UT));                              \
      case DIST_REDUCE_PROD: APPLY(T, MUL(T, UT));                             \
      case DIST_REDUCE_MAX: APPLY(T, MAXE);                                    \
      case DIST_REDUCE_MIN: APPLY(T, MINE);                                    \
      case DIST_REDUCE_ANY: APPLY(T, a != 0 || b != 0);                        \
      case DIST_REDUCE_ALL: APPLY(T, a != 0 && b != 0);                        \
    }                                                                       \
  }

DEFINE_REDUCE(i8, int8_t, uint8_t, WRAP_ADD, WRAP_MUL, INT_MAX_OF, INT_MIN_OF)
DEFINE_REDUCE(u8, uint8_t, uint8_t, WRAP_ADD, WRAP_MUL, INT_MAX_OF, INT_MIN_OF)
DEFINE_REDUCE(i32, int32_t, uint32_t, WRAP_ADD, WRAP_MUL, INT_MAX_OF, INT_MIN_OF)
DEFINE_REDUCE(i64, int64_t, uint64_t, WRAP_ADD, WRAP_MUL, INT_MAX_OF, INT_MIN_OF)
DEFINE_REDUCE(f32, float, float, PLAIN_ADD, PLAIN_MUL, FLOAT_MAX, FLOAT_MIN)
DEFINE_REDUCE(f64, double, double, PLAIN_ADD, PLAIN_MUL, FLOAT_MAX, FLOAT_MIN)

static void reduce_bool(uint8_t *acc, const uint8_t *in, size_t n,
                        dist_reduce op) {
  int use_or = op == DIST_REDUCE_SUM || op == DIST_REDUCE_AVG ||
               op == DIST_REDUCE_MAX || op == DIST_REDUCE_ANY;
  if (use_or)
    for (size_t i = 0; i < n; i++) acc[i] = acc[i] != 0 || in[i] != 0;
  else
    for (size_t i = 0; i < n; i++) acc[i] = acc[i] != 0 && in[i] != 0;
}

#define CHUNK 256

/* float16/bfloat16: widen CHUNK elements at a time, reduce as float32, and
 * round back once per element. */
static void reduce_16(uint16_t *acc, const uint16_t *in, size_t n,
                      dist_reduce op, dist_dtype dt) {
  int bf = dt == DIST_BFLOAT16;
  float a[CHUNK], b[CHUNK];
  for (size_t done = 0; done < n; done += CHUNK) {
    size_t m = n - done < CHUNK ? n - done : CHUNK;
    for (size_t i = 0; i < m; i++) {
      a[i] = bf ? dist_bf16_to_float(acc[done + i]) : dist_half_to_float(acc[done + i]);
      b[i] = bf ? dist_bf16_to_float(in[done + i]) : dist_half_to_float(in[done + i]);
    }
    reduce_f32(a, b, m, op);
    for (size_t i = 0; i < m; i++)
      acc[done + i] = bf ? dist_float_to_bf16(a[i]) : dist_float_to_half(a[i]);
  }
}

/* acc and in are aligned for dt here. */
static void reduce_aligned(void *acc, const void *in, size_t n, dist_dtype dt,
                           dist_reduce op) {
  switch (dt) {
    case DIST_BOOL: reduce_bool(acc, in, n, op); break;
    case DIST_INT8: reduce_i8(acc, in, n, op); break;
    case DIST_UINT8: reduce_u8(acc, in, n, op); break;
    case DIST_INT32: reduce_i32(acc, in, n, op); break;
    case DIST_INT64: reduce_i64(acc, in, n, op); break;
    case DIST_FLOAT16:
    case DIST_BFLOAT16: reduce_16(acc, in, n, op, dt); break;
    case DIST_FLOAT32: reduce_f32(acc, in, n, op); break;
    case DIST_FLOAT64: reduce_f64(acc, in, n, op); break;
    default: break;
  }
}

/* Buffers that arrive at odd offsets (inside a received frame, say) are
 * staged through aligned scratch, since typed access to them is undefined. */
static void reduce_unaligned(char *acc, const char *in, size_t n,
                             dist_dtype dt, dist_reduce op) {
  _Alignas(8) char a[4096];
  _Alignas(8) char b[4096];
  size_t sz = dist_dtype_size(dt), per = sizeof a / sz;
  for (size_t done = 0; done < n; done += per) {
    size_t m = n - done < per ? n - done : per;
    memcpy(a, acc + done * sz, m * sz);
    memcpy(b, in + done * sz, m * sz);
    reduce_aligned(a, b, m, dt, op);
    memcpy(acc + done * sz, a, m * sz);
  }
}

void dist_reduce_into(void *acc, const void *in, size_t n, dist_dtype dt,
                      dist_reduce op) {
  size_t sz = dist_dtype_size(dt);
  if (sz == 0 || n == 0) return;
  if (((uintptr_t)acc | (uintptr_t)in) % sz)
    reduce_unaligned(acc, in, n, dt, op);
  else
    reduce_aligned(acc, in, n, dt, op);
}

#define DIVIDE_ALL(T, DIV)                                 \
  do {                                                     \
    for (size_t i = 0; i < n; i++) {                       \
      T v;                                                 \
      memcpy(&v, p + i * sizeof v, sizeof v);              \
      v = (T)(v / (DIV));                                  \
      memcpy(p + i * sizeof v, &v, sizeof v);              \
    }                                                      \
  } while (0)

void dist_reduce_finish(void *acc, size_t n, dist_dtype dt, dist_reduce op,
                        int k) {
  if (op != DIST_REDUCE_AVG || k <= 1) return;
  char *p = acc;
  switch (dt) {
    case DIST_INT8: DIVIDE_ALL(int8_t, k); break;
    case DIST_UINT8: DIVIDE_ALL(uint8_t, k); break;
    case DIST_INT32: DIVIDE_ALL(int32_t, k); break;
    case DIST_INT64: DIVIDE_ALL(int64_t, (int64_t)k); break;
    case DIST_FLOAT32: DIVIDE_ALL(float, (float)k); break;
    case DIST_FLOAT64: DIVIDE_ALL(double, (double)k); break;
    case DIST_FLOAT16:
    case DIST_BFLOAT16:
      for (size_t i = 0; i < n; i++)
        dist_elem_set(acc, dt, i, (float)dist_elem_get(acc, dt, i) / (float)k);
      break;
    default: break; /* bool: OR divided by k is still the OR */
  }
}

/* ---- exact integer average ---------------------------------------------
 * The sum of k integers need not fit their type (3 x 2e9 in int32), and
 * int64 has no wider type to add in. So each element keeps the floor
 * quotient and the remainder by k of what was added: sum = k * quot + rem,
 * 0 <= rem < k. rem never leaves [0, k); quot may wrap while parts are
 * added, but ends at floor(sum / k), which lies between the parts' least
 * and greatest, so the wrapping arithmetic ends exact. */

static void avg_cell_add(dist_int_avg *c, int64_t x, int64_t k) {
  int64_t q = x / k, r = x % k;
  if (r < 0) { /* C truncates: step to the floor */
    q--;
    r += k;
  }
  c->rem += r;
  if (c->rem >= k) { /* k > 1 here: q < INT64_MAX */
    c->rem -= k;
    q++;
  }
  c->quot = (int64_t)((uint64_t)c->quot + (uint64_t)q);
}

/* sum / k truncated toward zero, as C integer division. */
static int64_t avg_cell_value(const dist_int_avg *c) {
  return c->quot + (c->quot < 0 && c->rem != 0);
}

#define DEFINE_INT_AVG(NAME, T)                                               \
  static void int_avg_add_##NAME(dist_int_avg *acc, const char *in, size_t n, \
                                 int64_t k) {                                 \
    for (size_t i = 0; i < n; i++) {                                          \
      T v;                                                                    \
      memcpy(&v, in + i * sizeof v, sizeof v);                                \
      avg_cell_add(&acc[i], v, k);                                            \
    }                                                                         \
  }                                                                           \
  /* Cell i is read before element i is written: out may be acc itself. */    \
  static void int_avg_store_##NAME(char *out, const dist_int_avg *acc,        \
                                   size_t n) {                                \
    for (size_t i = 0; i < n; i++) {                                          \
      T v = (T)avg_cell_value(&acc[i]);                                       \
      memcpy(out + i * sizeof v, &v, sizeof v);                               \
    }                                                                         \
  }

DEFINE_INT_AVG(i8, int8_t)
DEFINE_INT_AVG(u8, uint8_t)
DEFINE_INT_AVG(i32, int32_t)
DEFINE_INT_AVG(i64, int64_t)

int dist_reduce_is_int_avg(dist_dtype dt, dist_reduce op) {
  return op == DIST_REDUCE_AVG && (dt == DIST_INT8 || dt == DIST_UINT8 ||
                                   dt == DIST_INT32 || dt == DIST_INT64);
}

void dist_int_avg_add(dist_int_avg *acc, const void *in, size_t n,
                      dist_dtype dt, int k) {
  switch (dt) {
    case DIST_INT8: int_avg_add_i8(acc, in, n, k); break;
    case DIST_UINT8: int_avg_add_u8(acc, in, n, k); break;
    case DIST_INT32: int_avg_add_i32(acc, in, n, k); break;
    case DIST_INT64: int_avg_add_i64(acc, in, n, k); break;
    default: break;
  }
}

void dist_int_avg_store(void *out, const dist_int_avg *acc, size_t n,
                        dist_dtype dt) {
  switch (dt) {
    case DIST_INT8: int_avg_store_i8(out, acc, n); break;
    case DIST_UINT8: int_avg_store_u8(out, acc, n); break;
    case DIST_INT32: int_avg_store_i32(out, acc, n); break;
    case DIST_INT64: int_avg_store_i64(out, acc, n); break;
    default: break;
  }
}

/* CHUNK elements at a time through cells on the stack. */
static void int_avg_parts(char *acc, const char *rest, int k, size_t n,
                          dist_dtype dt) {
  size_t es = dist_dtype_size(dt), bytes = n * es;
  dist_int_avg cells[CHUNK];
  for (size_t done = 0; done < n; done += CHUNK) {
    size_t m = n - done < CHUNK ? n - done : CHUNK;
    memset(cells, 0, m * sizeof cells[0]);
    dist_int_avg_add(cells, acc + done * es, m, dt, k);
    for (int s = 0; s < k - 1; s++)
      dist_int_avg_add(cells, rest + (size_t)s * bytes + done * es, m, dt, k);
    dist_int_avg_store(acc + done * es, cells, m, dt);
  }
}

void dist_reduce_parts(void *acc, const void *rest, int k, size_t n,
                       dist_dtype dt, dist_reduce op) {
  if (k > 1 && dist_reduce_is_int_avg(dt, op)) {
    int_avg_parts(acc, rest, k, n, dt);
    return;
  }
  size_t bytes = n * dist_dtype_size(dt);
  for (int s = 0; s < k - 1; s++)
    dist_reduce_into(acc, (const char *)rest + (size_t)s * bytes, n, dt, op);
  dist_reduce_finish(acc, n, dt, op, k);
}

/* The identity of op as a double, stored through dist_elem_set (which
 * saturates -inf/+inf to an integer type's limits). */
static double identity_value(dist_dtype dt, dist_reduce op) {
  int unsigned_like = dt == DIST_BOOL || dt == DIST_UINT8;
  switch (op) {
    case DIST_REDUCE_PROD:
    case DIST_REDUCE_ALL: return 1;
    case DIST_REDUCE_MAX: return unsigned_like ? 0 : -INFINITY;
    case DIST_REDUCE_MIN: return dt == DIST_BOOL ? 1 : INFINITY;
    default: return 0;
  }
}

void dist_reduce_identity(void *buf, size_t n, dist_dtype dt, dist_reduce op) {
  size_t sz = dist_dtype_size(dt);
  if (sz == 0 || n == 0) return;
  char one[8];
  dist_elem_set(one, dt, 0, identity_value(dt, op));
  char *p = buf;
  for (size_t i = 0; i < n; i++) memcpy(p + i * sz, one, sz);
}
