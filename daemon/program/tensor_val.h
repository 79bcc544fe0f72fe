/* A local tensor value of the program interpreter: dtype, shape and a
 * row-major buffer, shared by reference count. A value is immutable once a
 * kernel has produced it, so sharing it (a reshape is a view of the same
 * buffer) is safe. Reference counts are atomic; the values themselves are
 * not locked, so one invocation runs on one thread at a time. */
#ifndef DISTD_TENSOR_VAL_H
#define DISTD_TENSOR_VAL_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"
#include "tensor.h"

typedef struct distd_tval {
  int refs;
  dist_dtype dtype;
  dist_shape shape;
  int64_t numel;
  void *data;              /* numel * dist_dtype_size(dtype) bytes, never NULL */
  struct distd_tval *base; /* a view: the value that owns data (referenced) */
} distd_tval;

/* A dtype and shape, as shape inference sees a value. */
typedef struct distd_vmeta {
  dist_dtype dtype;
  dist_shape shape;
} distd_vmeta;

/* A new zero-filled value with one reference. */
int distd_tval_new(dist_dtype dt, const dist_shape *shape, distd_tval **out,
                   dist_errbuf *eb);
/* The same with unspecified contents, for kernels that write every element. */
int distd_tval_new_uninit(dist_dtype dt, const dist_shape *shape,
                          distd_tval **out, dist_errbuf *eb);
/* A new value holding a copy of data, which must be exactly the value's size. */
int distd_tval_from_data(dist_dtype dt, const dist_shape *shape,
                         const void *data, size_t nbytes, distd_tval **out,
                         dist_errbuf *eb);
/* A 0-d value holding v converted to dt. */
int distd_tval_scalar(dist_dtype dt, double v, distd_tval **out,
                      dist_errbuf *eb);
/* A view of x's buffer with another shape of the same element count. */
int distd_tval_view(distd_tval *x, const dist_shape *shape, distd_tval **out,
                    dist_errbuf *eb);
/* x converted to dt: x itself (one more reference) when it already is. */
int distd_tval_cast(distd_tval *x, dist_dtype dt, distd_tval **out,
                    dist_errbuf *eb);

distd_tval *distd_tval_ref(distd_tval *t);
/* Drops a reference; frees at zero. NULL is a no-op. */
void distd_tval_unref(distd_tval *t);
size_t distd_tval_nbytes(const distd_tval *t);

/* Freed buffers of 4 MiB and more are kept for reuse (at most 4 of them,
 * 256 MiB in all): the bytes held now, and a way to give them back. */
size_t distd_tval_cache_bytes(void);
void distd_tval_cache_drop(void);

/* Converts n elements between any two dtypes (float -> int truncates and
 * saturates, anything -> bool is != 0). */
void distd_convert(void *dst, dist_dtype ddt, const void *src, dist_dtype sdt,
                   int64_t n);

/* The dtype kernels compute in: float32 for float16/bfloat16/float32,
 * float64, and int64 for every integer type and bool. */
dist_dtype distd_compute_dtype(dist_dtype dt);

#endif
