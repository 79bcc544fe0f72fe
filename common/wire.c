#include "wire.h"

#include <stdio.h>
#include <string.h>

int dist_mesh_from_pb(const Dist__V1__Mesh *pb, dist_mesh_desc *m,
                      dist_errbuf *eb) {
  if (!pb) return dist_fail(eb, DIST_EINVAL, "mesh missing");
  if (pb->n_shape == 0 || pb->n_shape > DIST_MAX_MESH_DIMS)
    return dist_fail(eb, DIST_EINVAL, "mesh: %zu dims (1 to %d allowed)",
                     pb->n_shape, DIST_MAX_MESH_DIMS);
  if (pb->n_ranks > DIST_MAX_MESH_RANKS)
    return dist_fail(eb, DIST_EINVAL, "mesh: %zu ranks (at most %d)",
                     pb->n_ranks, DIST_MAX_MESH_RANKS);
  if (pb->n_dim_names && pb->n_dim_names != pb->n_shape)
    return dist_fail(eb, DIST_EINVAL, "mesh: %zu dim names for %zu dims",
                     pb->n_dim_names, pb->n_shape);
  int shape[DIST_MAX_MESH_DIMS], ranks[DIST_MAX_MESH_RANKS];
  size_t expect = 1;
  for (size_t i = 0; i < pb->n_shape; i++) {
    if (pb->shape[i] == 0 || pb->shape[i] > DIST_MAX_MESH_RANKS)
      return dist_fail(eb, DIST_EINVAL, "mesh: dim %zu has size %u", i,
                       pb->shape[i]);
    shape[i] = (int)pb->shape[i];
    expect *= pb->shape[i];
  }
  if (expect != pb->n_ranks)
    return dist_fail(eb, DIST_EINVAL, "mesh: shape holds %zu ranks, %zu given",
                     expect, pb->n_ranks);
  for (size_t i = 0; i < pb->n_ranks; i++) {
    if (pb->ranks[i] >= DIST_MAX_MESH_RANKS * 64u)
      return dist_fail(eb, DIST_EINVAL, "mesh: rank %u out of range",
                       pb->ranks[i]);
    ranks[i] = (int)pb->ranks[i];
  }
  return dist_mesh_init(m, (int)pb->n_shape, shape, ranks,
                        pb->n_dim_names ? (const char *const *)pb->dim_names
                                        : NULL,
                        eb);
}

int dist_placements_from_pb(Dist__V1__Placement *const *pb, size_t n,
                            dist_placement *p, dist_errbuf *eb) {
  if (n > DIST_MAX_MESH_DIMS)
    return dist_fail(eb, DIST_EINVAL, "%zu placements (at most %d)", n,
                     DIST_MAX_MESH_DIMS);
  for (size_t i = 0; i < n; i++) {
    const Dist__V1__Placement *q = pb[i];
    if (q->kind > DIST__V1__PLACEMENT__KIND__PARTIAL)
      return dist_fail(eb, DIST_EINVAL, "placement %zu: unknown kind %d", i,
                       (int)q->kind);
    if (q->reduce > DIST__V1__REDUCE_OP__REDUCE_ALL)
      return dist_fail(eb, DIST_EINVAL, "placement %zu: unknown reduce %d", i,
                       (int)q->reduce);
    p[i].kind = (dist_placement_kind)q->kind;
    p[i].dim = (int)q->dim;
    p[i].reduce = (dist_reduce)q->reduce;
  }
  return 0;
}

int dist_shape_from_pb(const uint64_t *dims, size_t n, dist_shape *s,
                       dist_errbuf *eb) {
  if (n > DIST_MAX_DIMS)
    return dist_fail(eb, DIST_EINVAL, "%zu dims (at most %d)", n, DIST_MAX_DIMS);
  int64_t signed_dims[DIST_MAX_DIMS];
  for (size_t i = 0; i < n; i++) {
    if (dims[i] > (uint64_t)DIST_MAX_ELEMENTS) /* before it turns negative */
      return dist_fail(eb, DIST_EINVAL, "dim %zu of size %llu is too large", i,
                       (unsigned long long)dims[i]);
    signed_dims[i] = (int64_t)dims[i];
  }
  return dist_shape_make((int)n, signed_dims, s, eb);
}

int dist_dtype_from_pb(int pb, dist_dtype *dt, dist_errbuf *eb) {
  if (pb <= DIST_DTYPE_INVALID || pb > DIST_FLOAT64)
    return dist_fail(eb, DIST_EINVAL, "unknown dtype %d", pb);
  *dt = (dist_dtype)pb;
  return 0;
}

void dist_mesh_to_pb(const dist_mesh_desc *m, dist_wire_meta *w) {
  dist__v1__mesh__init(&w->mesh);
  for (int i = 0; i < m->ndim; i++) {
    w->mesh_shape[i] = (uint32_t)m->shape[i];
    snprintf(w->dim_name_buf[i], sizeof w->dim_name_buf[i], "%s",
             m->dim_names[i]);
    w->dim_names[i] = w->dim_name_buf[i];
  }
  for (int i = 0; i < m->nranks; i++) w->mesh_ranks[i] = (uint32_t)m->ranks[i];
  w->mesh.n_shape = (size_t)m->ndim;
  w->mesh.shape = w->mesh_shape;
  w->mesh.n_ranks = (size_t)m->nranks;
  w->mesh.ranks = w->mesh_ranks;
  w->mesh.n_dim_names = (size_t)m->ndim;
  w->mesh.dim_names = w->dim_names;
}

void dist_placements_to_pb(const dist_placement *p, int n, dist_wire_meta *w) {
  for (int i = 0; i < n; i++) {
    dist__v1__placement__init(&w->placements[i]);
    w->placements[i].kind = (Dist__V1__Placement__Kind)p[i].kind;
    w->placements[i].dim = (uint32_t)p[i].dim;
    w->placements[i].reduce = (Dist__V1__ReduceOp)p[i].reduce;
    w->placement_ptrs[i] = &w->placements[i];
  }
}

void dist_meta_to_pb(const char *name, dist_dtype dt, const dist_shape *global,
                     const dist_mesh_desc *m, const dist_placement *p,
                     dist_wire_meta *w) {
  dist__v1__tensor_meta__init(&w->meta);
  snprintf(w->name, sizeof w->name, "%s", name);
  w->meta.name = w->name;
  w->meta.dtype = (Dist__V1__DType)dt;
  for (int i = 0; i < global->ndim; i++)
    w->global_shape[i] = (uint64_t)global->dims[i];
  w->meta.n_global_shape = (size_t)global->ndim;
  w->meta.global_shape = w->global_shape;
  dist_mesh_to_pb(m, w);
  w->meta.mesh = &w->mesh;
  dist_placements_to_pb(p, m->ndim, w);
  w->meta.n_placements = (size_t)m->ndim;
  w->meta.placements = w->placement_ptrs;
}
