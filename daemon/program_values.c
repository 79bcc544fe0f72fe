/* Local values in and out of a LocalLayer request: see program_values.h. */
#include "program_values.h"

#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "wire.h"

int distd_value_from_arg(const Dist__V1__ProgramArg *a, distd_tval **out, dist_errbuf *eb) {
  dist_dtype dt;
  dist_shape shape;
  if (dist_dtype_from_pb((int)a->dtype, &dt, eb) != 0) return eb->code;
  if (dist_shape_from_pb(a->shape, a->n_shape, &shape, eb) != 0) return eb->code;
  size_t want = (size_t)dist_shape_numel(&shape) * dist_dtype_size(dt);
  if (a->data.len != want) {
    char ss[96];
    dist_shape_format(&shape, ss, sizeof ss);
    return dist_fail(eb, DIST_EMISMATCH, "%zu bytes for a %s %s value (%zu "
                     "bytes)", a->data.len, dist_dtype_name(dt), ss, want);
  }
  return distd_tval_from_data(dt, &shape, a->data.data, a->data.len, out, eb);
}

int distd_value_from_tensor(distd_server *s, const char *name, distd_tval **out,
                            distd_input_origin *origin, dist_errbuf *eb) {
  distd_tensor *t = NULL;
  if (distd_store_get(s->store, name, &t, eb) != 0) return eb->code;
  int rc = dist_mesh_index_of(&t->mesh, s->rank) < 0
               ? dist_fail(eb, DIST_EINVAL, "rank %d holds no piece of '%s'",
                           s->rank, name)
               : distd_tval_from_data(t->dtype, &t->local, t->data, t->nbytes,
                                      out, eb);
  if (rc == 0 && origin) {
    origin->is_tensor = 1;
    origin->dtype = t->dtype;
    origin->global = t->global;
    origin->mesh = t->mesh;
    memcpy(origin->placements, t->placements, sizeof t->placements);
  }
  distd_tensor_unref(t);
  return rc;
}

static int bind_arg(distd_server *s, const Dist__V1__ProgramInput *in,
                    const Dist__V1__ProgramArg *a, size_t i, distd_tval **v,
                    distd_input_origin *origin, dist_errbuf *eb) {
  int rc = 0;
  switch (in->kind) {
  case DIST__V1__PROGRAM_INPUT__KIND__DTENSOR_LOCAL:
    rc = a->tensor && a->tensor[0]
             ? distd_value_from_tensor(s, a->tensor, v, origin, eb)
             : dist_fail(eb, DIST_EINVAL, "needs a distributed tensor");
    break;
  case DIST__V1__PROGRAM_INPUT__KIND__VALUE:
    rc = distd_value_from_arg(a, v, eb);
    break;
  default: /* RANK / COORD: the engine fills them in */
    break;
  }
  if (rc)
    dist_errbuf_prefix(eb, "input %zu%s%s%s: ", i, in->name[0] ? " ('" : "",
                       in->name, in->name[0] ? "')" : "");
  return rc;
}

int distd_bind_args(distd_server *s, const Dist__V1__Program *pb,
                    Dist__V1__ProgramArg *const *args, size_t n_args, distd_tval **vals,
                    distd_input_origin *origins, dist_errbuf *eb) {
  if (n_args != pb->n_inputs)
    return dist_fail(eb, DIST_EINVAL, "program '%s' takes %zu inputs, %zu "
                     "arguments given", pb->name, pb->n_inputs, n_args);
  for (size_t i = 0; i < n_args; i++) {
    int rc = bind_arg(s, pb->inputs[i], args[i], i, &vals[i], &origins[i], eb);
    if (rc) return rc;
  }
  return 0;
}

int distd_values_init(distd_value_set *vs, size_t n) {
  vs->n = n;
  vs->v = calloc(n + 1, sizeof *vs->v);
  vs->ptrs = calloc(n + 1, sizeof *vs->ptrs);
  vs->shapes = calloc(n + 1, sizeof *vs->shapes);
  if (vs->v && vs->ptrs && vs->shapes) return 0;
  distd_values_free(vs);
  vs->v = NULL, vs->ptrs = NULL, vs->shapes = NULL, vs->n = 0;
  return -1;
}

void distd_values_set(distd_value_set *vs, size_t i, const distd_tval *t) {
  if (!vs->v) return; /* distd_values_init failed */
  Dist__V1__ProgramValue *v = &vs->v[i];
  dist__v1__program_value__init(v);
  vs->ptrs[i] = v;
  if (!t) return;
  v->dtype = (Dist__V1__DType)t->dtype;
  for (int d = 0; d < t->shape.ndim; d++) vs->shapes[i][d] = (uint64_t)t->shape.dims[d];
  v->n_shape = (size_t)t->shape.ndim;
  v->shape = vs->shapes[i];
  v->data.data = t->data;
  v->data.len = distd_tval_nbytes(t);
}

void distd_values_free(distd_value_set *vs) {
  free(vs->v);
  free(vs->ptrs);
  free(vs->shapes);
}
