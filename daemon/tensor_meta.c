/* Checking a tensor description that arrives from a client, and describing a
 * stored tensor back to one. */
#include "tensor_meta.h"

#include <stdlib.h>
#include <string.h>

int distd_meta_parse(distd_server *s, const Dist__V1__TensorMeta *pb,
                     distd_meta *m, dist_errbuf *eb) {
  if (!pb) return dist_fail(eb, DIST_EINVAL, "tensor description missing");
  if (dist_name_check(pb->name, eb) != 0) return eb->code;
  strcpy(m->name, pb->name); /* fits: DIST_NAME_LEN_MAX < DISTD_NAME_MAX */
  if (dist_dtype_from_pb((int)pb->dtype, &m->dtype, eb) != 0) return eb->code;
  if (dist_mesh_from_pb(pb->mesh, &m->mesh, eb) != 0) return eb->code;
  if (distd_mesh_check_world(s, &m->mesh, eb) != 0) return eb->code;
  if (pb->n_placements != (size_t)m->mesh.ndim)
    return dist_fail(eb, DIST_EINVAL,
                     "placements: %zu given, the mesh has %d dims",
                     pb->n_placements, m->mesh.ndim);
  if (dist_placements_from_pb(pb->placements, pb->n_placements, m->placements,
                              eb) != 0)
    return eb->code;
  if (dist_shape_from_pb(pb->global_shape, pb->n_global_shape, &m->global,
                         eb) != 0)
    return eb->code;
  if (dist_shape_from_pb(pb->local_shape, pb->n_local_shape, &m->local, eb) != 0)
    return eb->code;
  return 0;
}

int distd_mesh_check_world(distd_server *s, const dist_mesh_desc *m,
                           dist_errbuf *eb) {
  for (int i = 0; i < m->nranks; i++)
    if (m->ranks[i] < 0 || m->ranks[i] >= s->world_size)
      return dist_fail(eb, DIST_EINVAL,
                       "mesh names rank %d, but the cluster has %d daemon%s "
                       "(ranks 0 to %d)",
                       m->ranks[i], s->world_size, s->world_size == 1 ? "" : "s",
                       s->world_size - 1);
  return 0;
}

void distd_meta_describe(const distd_tensor *t, int rank, dist_wire_meta *w) {
  dist_meta_to_pb(t->name, t->dtype, &t->global, &t->mesh, t->placements, w);
  for (int i = 0; i < t->local.ndim; i++) {
    w->local_shape[i] = (uint64_t)t->local.dims[i];
    w->local_offset[i] = (uint64_t)t->offset[i];
  }
  w->meta.n_local_shape = (size_t)t->local.ndim;
  w->meta.local_shape = w->local_shape;
  w->meta.n_local_offset = (size_t)t->local.ndim;
  w->meta.local_offset = w->local_offset;
  w->meta.local_bytes = t->nbytes;
  w->meta.version = t->version;
  w->meta.rank = (uint32_t)rank;
}

int distd_descriptions_take(distd_descriptions *d, size_t n) {
  d->n = n;
  d->metas = calloc(n + 1, sizeof *d->metas);
  d->w = calloc(n + 1, sizeof *d->w);
  if (d->metas && d->w) return 0;
  distd_descriptions_free(d);
  return -1;
}

Dist__V1__TensorMeta **distd_describe_into(distd_descriptions *d, distd_tensor *const *t,
                                           size_t n, int rank) {
  for (size_t k = 0; k < n && k < d->n; k++) {
    dist__v1__tensor_meta__init(&d->w[k].meta);
    if (t[k]) distd_meta_describe(t[k], rank, &d->w[k]);
    d->metas[k] = &d->w[k].meta;
  }
  return d->metas;
}

void distd_descriptions_free(distd_descriptions *d) {
  free(d->metas);
  free(d->w);
  *d = (distd_descriptions){0};
}
