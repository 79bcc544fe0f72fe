/* Tensor values for the program engine's tests (test_kernels, test_grad,
 * test_program): a shape from its dims, a value from doubles, and an
 * element read back as a double. */
#ifndef TEST_TVAL_BUILD_H
#define TEST_TVAL_BUILD_H

#include <criterion/criterion.h>
#include <stdarg.h>

#include "tensor.h"
#include "tensor_val.h"

/* The shape of ndim dims, given as ints. */
static inline dist_shape shp(int ndim, ...) {
  dist_shape s = {ndim, {0}};
  va_list ap;
  va_start(ap, ndim);
  for (int d = 0; d < ndim; d++) s.dims[d] = va_arg(ap, int);
  va_end(ap);
  return s;
}

/* A value of dtype dt and shape s holding v[0..numel), each converted to
 * dt; fails the test when it cannot be made. */
static inline distd_tval *make_vals(dist_dtype dt, dist_shape s, const double *v) {
  distd_tval *t = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_tval_new(dt, &s, &t, &eb), 0, "%s", eb.msg);
  for (int64_t i = 0; i < t->numel; i++) dist_elem_set(t->data, dt, (size_t)i, v[i]);
  return t;
}

/* Element i of t, as a double. */
static inline double at(const distd_tval *t, int64_t i) {
  return dist_elem_get(t->data, t->dtype, (size_t)i);
}

#endif
