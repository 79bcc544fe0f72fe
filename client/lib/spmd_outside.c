/* An SPMD trainer outside an operation's mesh or group: as in Paddle's
 * auto-parallel, where every rank runs the whole program, the operation
 * is a no-op that succeeds for it. Its tensors are handles that describe
 * the whole (name, dtype, global shape, mesh, placements) with an empty
 * local piece, made here without asking any daemon: nobody waits for this
 * rank's part, and it holds nothing. The caller has taken the operation's
 * op ids already, so that the trainers' counts stay in step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

int dist_spmd_outside(const dist_client *c, const dist_mesh_desc *m) {
  return c->spmd_rank >= 0 && dist_mesh_index_of(m, c->spmd_rank) < 0;
}

int dist_spmd_outside_group(dist_client *c, const char *func, const int *group,
                            int group_size) {
  if (c->spmd_rank < 0 || !group) return 0;
  for (int i = 0; i < group_size; i++)
    if (group[i] == c->spmd_rank) return 0; /* a member's daemon judges the group */
  /* The members' daemons refuse a group naming a rank outside the
   * cluster: so does an outsider. */
  for (int i = 0; i < group_size; i++)
    if (!dist_client_reaches(c, group[i]))
      return dist_refuse_unreached(c, "group", group[i], "%s: group names rank %d, but the "
                                   "cluster has %d daemon%s", func, group[i], c->n,
                                   c->n == 1 ? "" : "s");
  return 1;
}

int dist_tensor_outsider(dist_client *c, const char *name, dist_dtype dt,
                         const dist_shape *global, const dist_mesh *mesh,
                         const dist_placement *placements, dist_tensor **out) {
  dist_tensor *t = calloc(1, sizeof *t);
  if (!t) return dist_client_fail(c, DIST_ENOMEM, "out of memory for the handle of '%s'", name);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dtype = dt;
  t->shape = *global;
  t->no_piece = 1;
  t->mesh = *mesh;
  memcpy(t->placements, placements, sizeof *placements * (size_t)mesh->d.ndim);
  *out = t;
  c->err = (dist_errbuf)DIST_ERRBUF_INIT;
  return 0;
}

/* Paddle's dtensor_from_local derives the global shape from the local
 * one: each tensor dim sharded by a mesh dim is that many times longer.
 * An outsider has no daemon to vote the real shape with, so it takes
 * this rule (exact for even splits). */
void dist_global_from_local(const dist_mesh_desc *m, const dist_placement *p,
                            const dist_shape *local, dist_shape *global) {
  *global = *local;
  for (int md = 0; md < m->ndim; md++)
    if (p[md].kind == DIST_SHARD) global->dims[p[md].dim] *= m->shape[md];
}

int dist_empty_result(dist_client *c, void **out) {
  *out = malloc(1); /* as a daemon's empty piece: something to free() */
  if (!*out) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  c->err = (dist_errbuf)DIST_ERRBUF_INIT;
  return 0;
}

int dist_empty_local(dist_client *c, const dist_tensor *t, void **data, size_t *nbytes,
                     int64_t *shape) {
  if (dist_empty_result(c, data) != 0) return c->err.code;
  *nbytes = 0;
  for (int d = 0; shape && d < t->shape.ndim; d++) shape[d] = 0;
  return 0;
}
