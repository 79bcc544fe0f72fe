/* Local values made distributed tensors: see program_outputs.h. */
#include "program_outputs.h"

#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "tensor_meta.h"
#include "vote.h"
#include "wire.h"

int distd_attr_parse(distd_server *s, const Dist__V1__Mesh *mesh,
                     Dist__V1__Placement *const *pl, size_t npl, distd_attr *a,
                     dist_errbuf *eb) {
  if (dist_mesh_from_pb(mesh, &a->mesh, eb) != 0) return eb->code;
  if (distd_mesh_check_world(s, &a->mesh, eb) != 0) return eb->code;
  if (npl != (size_t)a->mesh.ndim)
    return dist_fail(eb, DIST_EINVAL, "%zu placements for a mesh of %d dims",
                     npl, a->mesh.ndim);
  return dist_placements_from_pb(pl, npl, a->placements, eb) != 0 ? eb->code : 0;
}

/* Only a Shard over more than one rank makes the global extent depend on
 * the other ranks' pieces. */
static int needs_exchange(const distd_attr *a) {
  for (int md = 0; md < a->mesh.ndim; md++)
    if (a->placements[md].kind == DIST_SHARD && a->mesh.shape[md] > 1) return 1;
  return 0;
}

enum { XWORDS = 2 + DIST_MAX_DIMS };

/* The global shape the exchanged pieces make; every piece must then be
 * exactly what the split rule gives its rank. */
static int derive_global(const distd_attr *a, const int64_t *all, dist_shape *global,
                         dist_errbuf *eb) {
  int n = a->mesh.nranks, rc = 0;
  dist_shape *pieces = calloc((size_t)n, sizeof *pieces), want;
  if (!pieces) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    const int64_t *w = &all[i * XWORDS];
    pieces[i].ndim = (int)w[1];
    for (int d = 0; d < pieces[i].ndim && d < DIST_MAX_DIMS; d++) pieces[i].dims[d] = w[2 + d];
  }
  dist_global_of_pieces(&a->mesh, a->placements, pieces, global);
  int bad = dist_first_misfit(&a->mesh, a->placements, global, pieces, &want);
  if (bad >= 0) {
    char gs[96], ws[96], hs[96];
    dist_shape_format(&pieces[bad], hs, sizeof hs);
    dist_shape_format(&want, ws, sizeof ws);
    dist_shape_format(global, gs, sizeof gs);
    rc = dist_fail(eb, DIST_EMISMATCH, "local outputs do not fit the placements: rank %d "
                   "made %s, but global shape %s gives it %s", a->mesh.ranks[bad], hs, gs, ws);
  }
  free(pieces);
  return rc;
}

/* dtensor_from_local's shape exchange over the output's mesh: every rank
 * sends its verdict and local shape, so all accept or all refuse. */
static int exchange_shapes(distd_server *s, const distd_attr *a, uint64_t op_id,
                           int64_t deadline, int verdict, const char *why,
                           const dist_shape *local, dist_shape *global,
                           dist_errbuf *eb) {
  int n = a->mesh.nranks;
  int64_t mine[XWORDS] = {verdict, local ? local->ndim : 0};
  for (int d = 0; local && d < local->ndim; d++) mine[2 + d] = local->dims[d];
  if (verdict) distd_reason_pack(&mine[1], XWORDS - 1, why);
  int64_t *all = calloc((size_t)n * XWORDS, sizeof *all);
  size_t *counts = calloc((size_t)n, sizeof *counts);
  int rc = all && counts ? 0 : distd_abort_no_memory(s->peers, op_id, a->mesh.ranks, n,
                                                        "the shape exchange", eb);
  for (int i = 0; rc == 0 && i < n; i++) counts[i] = XWORDS;
  distd_coll c;
  if (rc == 0) rc = distd_coll_init(&c, s->peers, op_id, a->mesh.ranks, n, deadline, eb);
  if (rc == 0) rc = distd_allgather(&c, mine, all, counts, DIST_INT64, eb);
  for (int i = 0; rc == 0 && i < n; i++)
    if (all[i * XWORDS] != 0 && a->mesh.ranks[i] != s->rank)
      rc = distd_reason_fail(eb, (int)all[i * XWORDS], a->mesh.ranks[i],
                             "failed its part of the invocation", &all[i * XWORDS + 1],
                             XWORDS - 1);
  if (rc == 0 && verdict == 0) rc = derive_global(a, all, global, eb);
  free(all);
  free(counts);
  return rc;
}

/* A tensor the output replaces must lie within the output's mesh: on a
 * rank outside it, no daemon would replace its piece, which would outlive
 * the replacement as a second layout of the name. */
static int check_replaced(const char *name, const dist_mesh_desc *held,
                          const dist_mesh_desc *out, dist_errbuf *eb) {
  for (int i = 0; i < held->nranks; i++) {
    if (dist_mesh_index_of(out, held->ranks[i]) >= 0) continue;
    char was[128], will[128];
    dist_mesh_format(held, was, sizeof was);
    dist_mesh_format(out, will, sizeof will);
    return dist_fail(eb, DIST_EEXIST, "'%s' is held on mesh %s, and the output replacing it "
                     "goes onto %s, without rank %d, whose piece would stay: delete '%s' "
                     "first, or name the output otherwise", name, was, will, held->ranks[i],
                     name);
  }
  return 0;
}

int distd_value_tensor(distd_server *s, const char *name, const distd_tval *v,
                       const dist_shape *global, const distd_attr *a, int replace,
                       distd_staged *b, size_t k, dist_errbuf *eb) {
  dist_mesh_desc held;
  if (distd_staged_note_version(s->store, b, name, &held)) {
    if (!replace) return dist_fail(eb, DIST_EEXIST, "tensor '%s' already exists", name);
    if (check_replaced(name, &held, &a->mesh, eb) != 0) return eb->code;
  }
  distd_tensor *t = NULL;
  int rc = distd_tensor_new(s->store, name, v->dtype, global, &a->mesh,
                            a->placements, s->rank, &t, eb);
  if (rc) return rc;
  if (!dist_shape_equal(&t->local, &v->shape)) {
    char ls[96], gs[96], ps[160];
    dist_shape_format(&v->shape, ls, sizeof ls);
    dist_shape_format(global, gs, sizeof gs);
    dist_placements_text(a->placements, a->mesh.ndim, ps, sizeof ps);
    distd_tensor_unref(t);
    return dist_fail(eb, DIST_EMISMATCH, "local value %s does not fit %s of "
                     "global shape %s on rank %d", ls, ps, gs, s->rank);
  }
  memcpy(t->data, v->data, t->nbytes);
  b->tensors[k] = t;
  return 0;
}

int distd_value_global(distd_server *s, int64_t deadline_ms, const distd_attr *a,
                       uint64_t op_id, int verdict, const distd_tval *v, dist_shape *global,
                       dist_errbuf *eb) {
  if (!needs_exchange(a)) {
    if (verdict) return verdict;
    *global = v->shape;
    for (int md = 0; md < a->mesh.ndim; md++)
      if (a->placements[md].kind == DIST_SHARD &&
          a->placements[md].dim >= v->shape.ndim)
        return dist_fail(eb, DIST_EINVAL, "Shard(%d) of a %d-d output",
                         a->placements[md].dim, v->shape.ndim);
    return 0;
  }
  dist_errbuf peer_eb = DIST_ERRBUF_INIT;
  if (verdict == 0 &&
      dist_placements_check(&a->mesh, a->placements, a->mesh.ndim,
                            v->shape.ndim, eb) != 0)
    verdict = eb->code;
  int rc = exchange_shapes(s, a, op_id, deadline_ms, verdict,
                           verdict ? dist_errbuf_msg(eb) : NULL, v ? &v->shape : NULL, global,
                           verdict ? &peer_eb : eb);
  return verdict ? verdict : rc;
}

int distd_reply_room_take(distd_reply_room *r, size_t n, size_t n_values, const char *what,
                          dist_errbuf *eb) {
  int described = distd_descriptions_take(&r->d, n);
  int values = distd_values_init(&r->values, n_values);
  if (described == 0 && values == 0) return 0;
  distd_reply_room_free(r);
  return dist_fail(eb, DIST_ENOMEM, "out of memory for the %s's reply", what);
}

void distd_reply_room_free(distd_reply_room *r) {
  distd_descriptions_free(&r->d);
  distd_values_free(&r->values);
  r->values = (distd_value_set){0};
}
