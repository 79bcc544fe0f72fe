/* Tensors as both sides see them: dtypes, shapes, row-major contiguous
 * buffers, elementwise reductions and the .npy exchange format. */
#ifndef DIST_TENSOR_H
#define DIST_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "dist/types.h"
#include "errbuf.h"

typedef struct dist_shape {
  int ndim;
  int64_t dims[DIST_MAX_DIMS];
} dist_shape;

/* Bytes per element; 0 for DIST_DTYPE_INVALID or an out-of-range value. */
size_t dist_dtype_size(dist_dtype dt);
/* "float32", "int64", "bool", "bfloat16" ...; "invalid" otherwise. */
const char *dist_dtype_name(dist_dtype dt);
/* The dtype named as dist_dtype_name prints it, or DIST_DTYPE_INVALID. */
dist_dtype dist_dtype_parse(const char *name);
int dist_dtype_is_float(dist_dtype dt);

/* The longest tensor name, in bytes, without its NUL. */
#define DIST_NAME_LEN_MAX 255
/* Whether name may name a tensor: 1 to DIST_NAME_LEN_MAX bytes of UTF-8
 * (gRPC strings and JSON carry nothing else) other than "__metadata__",
 * the key safetensors keeps for itself (a checkpoint could not hold it).
 * The error names what is wrong. */
int dist_name_check(const char *name, dist_errbuf *eb);

/* The most elements a shape may describe. Each dim is bounded by it, and so
 * is the product of the non-empty dims: element and byte counts (numel
 * times at most 8) and strides then fit in an int64_t. */
#define DIST_MAX_ELEMENTS (1ll << 48)
/* ndim dims as a shape: 0 to DIST_MAX_DIMS dims, each non-negative, at
 * most DIST_MAX_ELEMENTS elements in all. Errors name the dim. */
int dist_shape_make(int ndim, const int64_t *dims, dist_shape *out, dist_errbuf *eb);
/* Number of elements (1 for ndim 0). */
int64_t dist_shape_numel(const dist_shape *s);
int dist_shape_equal(const dist_shape *a, const dist_shape *b);
/* Writes "[2, 3]" into buf. */
void dist_shape_format(const dist_shape *s, char *buf, size_t len);

/* half/bfloat16 <-> float conversions (round to nearest even). */
float dist_half_to_float(uint16_t h);
uint16_t dist_float_to_half(float f);
float dist_bf16_to_float(uint16_t b);
uint16_t dist_float_to_bf16(float f);

/* Element i of buf as a double, and the reverse (with rounding/saturation as
 * a C cast gives for ints; bool is 0/1). For tests and slow paths only. */
double dist_elem_get(const void *buf, dist_dtype dt, size_t i);
void dist_elem_set(void *buf, dist_dtype dt, size_t i, double v);

/* acc[i] = acc[i] (op) in[i] for n elements. AVG accumulates like SUM (the
 * caller divides once with dist_reduce_finish). ANY/ALL treat non-zero as
 * true and store 0/1. Every dtype is supported. An integer AVG sums in the
 * dtype here, which wraps: use dist_reduce_parts or dist_int_avg. */
void dist_reduce_into(void *acc, const void *in, size_t n, dist_dtype dt,
                      dist_reduce op);
/* For AVG divides acc by k; no-op for the other reductions. */
void dist_reduce_finish(void *acc, size_t n, dist_dtype dt, dist_reduce op,
                        int k);
/* acc (n elements, holding the first of k parts) gets the k - 1 others,
 * which follow each other in rest, folded in that order, and is finished
 * for k. Floats and the other reductions are dist_reduce_into and
 * dist_reduce_finish; an integer AVG is exact (dist_int_avg). */
void dist_reduce_parts(void *acc, const void *rest, int k, size_t n,
                       dist_dtype dt, dist_reduce op);

/* Partial(avg) of an integer dtype, exactly: the sum of the k parts need
 * not fit the dtype (nor int64). A cell per element, zeroed before the
 * first part, keeps the quotient and remainder by k of what was added.
 * The average is the sum / k truncated toward zero, as C integer division
 * and a LocalLayer's integer div (program.proto) do: int32 avg(2e9, 2e9,
 * 2e9) is 2e9, avg(-7, 0) is -3. */
typedef struct dist_int_avg {
  int64_t quot, rem;
} dist_int_avg;
/* AVG of an int8, uint8, int32 or int64 dtype. */
int dist_reduce_is_int_avg(dist_dtype dt, dist_reduce op);
/* Adds n elements of a part (any alignment) to n cells, for k parts. */
void dist_int_avg_add(dist_int_avg *acc, const void *in, size_t n,
                      dist_dtype dt, int k);
/* The n averages into out, in dt; out may be acc itself (narrowing in
 * place). */
void dist_int_avg_store(void *out, const dist_int_avg *acc, size_t n,
                        dist_dtype dt);
/* Fills n elements with the identity of op (0 for sum, 1 for prod, the
 * lowest value for max, ...). */
void dist_reduce_identity(void *buf, size_t n, dist_dtype dt, dist_reduce op);

/* Copies the box [offset, offset+box) of a row-major tensor of shape src_shape
 * into dst, which is contiguous of shape box; and the reverse. */
void dist_copy_box_out(void *dst, const void *src, const dist_shape *src_shape,
                       const int64_t *offset, const dist_shape *box,
                       size_t elem);
void dist_copy_box_in(void *dst, const dist_shape *dst_shape,
                      const int64_t *offset, const void *src,
                      const dist_shape *box, size_t elem);

/* .npy (format 1.0/2.0, C order, little-endian; descrs '|b1' '|i1' '|u1'
 * '<i4' '<i8' '<f2' '<f4' '<f8'). numpy has no bfloat16: dist_npy_write
 * stores it as '<u2', and the readers return '<u2' data as DIST_BFLOAT16 only
 * when *dt is DIST_BFLOAT16 on entry (otherwise '<u2' is unsupported). *dt is
 * therefore read on entry (set it to DIST_DTYPE_INVALID when not asking for
 * bfloat16) and set to the file's dtype on success.
 * Errors: DIST_EINVAL for bad magic, a malformed header or truncated
 * header/data; DIST_ENOTSUP for other versions, fortran_order True,
 * big-endian or unknown descrs and more than DIST_MAX_DIMS dims;
 * DIST_EMISMATCH when there are more data bytes than the shape needs.
 * dist_npy_parse points *data into bytes (no copy); dist_npy_read returns a
 * malloc'd *data (free()) and also fails with DIST_ENOTFOUND / DIST_EIO.
 * Their messages start with the path. A dist_npy_write that fails while
 * writing removes the regular file it made. */
int dist_npy_read(const char *path, dist_dtype *dt, dist_shape *shape,
                  void **data, size_t *nbytes, dist_errbuf *eb);
int dist_npy_parse(const void *bytes, size_t len, dist_dtype *dt,
                   dist_shape *shape, const void **data, size_t *nbytes,
                   dist_errbuf *eb);
int dist_npy_write(const char *path, dist_dtype dt, const dist_shape *shape,
                   const void *data, dist_errbuf *eb);

#endif
