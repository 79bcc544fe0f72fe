/* Reshard: every rank of the source and destination meshes is asked with
 * the same op id; the result replaces the tensor or becomes dst_name. A
 * parameter resharded in place takes its optimizer state along when it can,
 * onto another mesh too (param_reshard.h). */
#include <stdlib.h>
#include <string.h>

#include "methods.h"
#include "param_reshard.h"
#include "pbuf.h"
#include "reshard.h"
#include "tensor_meta.h"

static int parse_target(distd_server *s, const Dist__V1__ReshardRequest *rq,
                        const distd_tensor *t, dist_mesh_desc *dst_mesh,
                        dist_mesh_desc *src_mesh, dist_placement *dst_p,
                        dist_errbuf *eb) {
  if (rq->src_mesh && dist_mesh_from_pb(rq->src_mesh, src_mesh, eb) != 0)
    return eb->code;
  if (t) *src_mesh = t->mesh;
  if (!t && !rq->src_mesh)
    return dist_fail(eb, DIST_ENOTFOUND, "tensor '%s' not found", rq->name);
  if (rq->mesh) {
    if (dist_mesh_from_pb(rq->mesh, dst_mesh, eb) != 0) return eb->code;
    if (distd_mesh_check_world(s, dst_mesh, eb) != 0) return eb->code;
  } else {
    *dst_mesh = *src_mesh;
  }
  if (rq->n_placements != (size_t)dst_mesh->ndim)
    return dist_fail(eb, DIST_EINVAL, "placements: %zu given, the mesh has %d dims",
                     rq->n_placements, dst_mesh->ndim);
  return dist_placements_from_pb(rq->placements, rq->n_placements, dst_p, eb);
}

DISTD_HANDLER(reshard) {
  const Dist__V1__ReshardRequest *rq = (const void *)req;
  distd_tensor *src = NULL, *out = NULL;
  dist_mesh_desc dst_mesh, src_mesh;
  dist_placement dst_p[DIST_MAX_MESH_DIMS];
  const char *dst_name = rq->dst_name[0] ? rq->dst_name : rq->name;
  int in_place = strcmp(dst_name, rq->name) == 0;
  /* Held before its values are read: a push applied after that would be
   * lost under the resharded values. */
  int is_param = 0;
  if (in_place && distd_param_hold(s->params, rq->name, ci->deadline_ms, &is_param, eb) != 0)
    return eb->code;
  distd_store_get(s->store, rq->name, &src, NULL);
  int rc = parse_target(s, rq, src, &dst_mesh, &src_mesh, dst_p, eb);
  if (rc == 0 && !in_place) {
    distd_tensor *exists = NULL;
    if (distd_store_get(s->store, rq->dst_name, &exists, NULL) == 0) {
      distd_tensor_unref(exists);
      rc = dist_fail(eb, DIST_EEXIST, "tensor '%s' already exists", rq->dst_name);
    }
  }
  distd_param_entry *param = NULL;
  distd_param_move move;
  memset(&move, 0, sizeof move);
  if (rc == 0 && in_place)
    rc = distd_param_move_begin(s, rq->name, is_param, &src_mesh, &dst_mesh, dst_p, rq->op_id,
                                ci->deadline_ms, &move, eb);
  if (rc == 0)
    rc = distd_reshard(s, src, &src_mesh, &dst_mesh, dst_p, dst_name, rq->op_id,
                       ci->deadline_ms, &out, eb);
  if (rc == 0 && in_place)
    rc = distd_param_move_finish(s, &move, rq->name, out, &src_mesh, &dst_mesh, rq->op_id,
                                 ci->deadline_ms, &param, eb);
  distd_param_move_free(&move);
  if (rc == 0 && out) rc = distd_store_put(s->store, out, 1, eb);
  if (rc == 0 && !out && !rq->dst_name[0]) /* moved off this rank */
    distd_store_delete(s->store, rq->name, NULL);
  if (rc == 0 && in_place) {
    if (param) distd_param_install(s->params, param);
    else distd_param_forget(s->params, rq->name);
    param = NULL;
  }
  distd_param_entry_free(param);
  if (in_place) distd_param_release(s->params, rq->name, DISTD_HOLD_RESHARD);
  if (rc == 0) {
    dist_wire_meta *w = calloc(1, sizeof *w);
    Dist__V1__ReshardReply rp = DIST__V1__RESHARD_REPLY__INIT;
    if (out) {
      distd_meta_describe(out, s->rank, w);
      rp.meta = &w->meta;
    }
    *reply = dist_pb_to_bb(&rp.base);
    free(w);
  }
  distd_tensor_unref(out);
  distd_tensor_unref(src);
  return rc;
}
