/* A LocalLayer call's or backward's argument array (and a tape backward's
 * gradients), read entry by entry before anything is sent: a value without
 * data would be read from NULL while its request is packed, and a value of
 * too many dims past its shape. */
#include "client_internal.h"

/* 0 when value v (args[j].values[r]) can be sent, else DIST_EINVAL on c
 * naming it. */
static int check_value(dist_client *c, const char *func, const char *arr, int j, int r,
                       const dist_value *v) {
  if (v->ndim < 0 || v->ndim > DIST_MAX_DIMS)
    return dist_client_fail(c, DIST_EINVAL, "%s: %s[%d].values[%d] has %d dims (0 to %d)",
                            func, arr, j, r, v->ndim, DIST_MAX_DIMS);
  int empty = 0;
  for (int d = 0; d < v->ndim; d++) {
    if (v->shape[d] < 0)
      return dist_client_fail(c, DIST_EINVAL, "%s: %s[%d].values[%d] has extent %lld in dim %d",
                              func, arr, j, r, (long long)v->shape[d], d);
    empty |= v->shape[d] == 0;
  }
  if (!v->data && !empty)
    return dist_client_fail(c, DIST_EINVAL, "%s: %s[%d].values[%d].data is NULL", func,
                            arr, j, r);
  return 0;
}

int dist_check_arg_values(dist_client *c, const char *func, const char *arr, int j,
                          const dist_value *values, int nvalues) {
  for (int r = 0; values && r < nvalues; r++) {
    int rc = check_value(c, func, arr, j, r, &values[r]);
    if (rc) return rc;
  }
  return 0;
}

int dist_check_call_args(dist_client *c, const char *func, const char *arr,
                         const dist_arg *args, int n, int nvalues) {
  if (!args && n > 0)
    return dist_client_fail(c, DIST_EINVAL, "%s: %s is NULL with %d entries", func, arr, n);
  for (int j = 0; j < n; j++) {
    int rc = dist_check_arg_values(c, func, arr, j, args[j].values, nvalues);
    if (rc) return rc;
  }
  return 0;
}
