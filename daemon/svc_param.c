/* dist.v1.Param: Configure / PushGrad / Pull / List (param_service.h). */
#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

#include "holds.h"
#include "methods.h"
#include "metrics.h"
#include "param.pb-c.h"
#include "param_pb.h"
#include "param_service.h"
#include "pbuf.h"
#include "reshard.h"
#include "svc_param.h"
#include "tensor_meta.h"
#include "vote.h"

static void reply_meta(distd_server *s, const distd_tensor *t,
                       grpc_byte_buffer **reply) {
  dist_wire_meta wm = {0}, *w = &wm; /* on the stack: a reply cannot fail */
  distd_meta_describe(t, s->rank, w);
  Dist__V1__ParamConfigureReply rp = DIST__V1__PARAM_CONFIGURE_REPLY__INIT;
  rp.meta = &w->meta;
  *reply = dist_pb_to_bb(&rp.base);
}

/* The mesh a request names for its vote (sent by a single client to the
 * whole mesh), parsed into *mesh: 0 when it names none, 1 when it does and
 * this daemon is in it, -1 (eb says why) otherwise. */
static int vote_mesh(distd_server *s, const Dist__V1__Mesh *pb, const char *name,
                     dist_mesh_desc *mesh, dist_errbuf *eb) {
  if (!pb) return 0;
  if (dist_mesh_from_pb(pb, mesh, eb) != 0) return -1;
  if (dist_mesh_index_of(mesh, s->rank) >= 0) return 1;
  dist_fail(eb, DIST_EINVAL, "a request for '%s' names a mesh without rank %d", name, s->rank);
  return -1;
}

/* The mesh a request is voted over must be the parameter's tensor's here,
 * or some daemon of the tensor's mesh would wait for a verdict never
 * sent. */
static int check_vote_mesh(distd_server *s, const char *name, const dist_mesh_desc *mesh,
                           dist_errbuf *eb) {
  distd_tensor *t = NULL;
  if (distd_store_get(s->store, name, &t, eb) != 0) return eb->code;
  int same = dist_mesh_equal(&t->mesh, mesh);
  distd_tensor_unref(t);
  return same ? 0 : dist_fail(eb, DIST_EUNAVAIL, "'%s' is on another mesh here than the "
                              "request names (resharded meanwhile?): try again", name);
}

int distd_configure_prepare(distd_server *s, const Dist__V1__ParamConfigureRequest *rq,
                            const distd_param_cfg *cfg, const dist_mesh_desc *vote_mesh,
                            distd_configure_prep *p, dist_errbuf *eb) {
  *p = (distd_configure_prep){.name = rq->name, .cfg = *cfg, .keep_state = rq->keep_state};
  distd_param_restore restore = {.step = rq->step, .nstate = (int)rq->n_state};
  for (size_t k = 0; k < rq->n_state && k < DISTD_OPTIM_STATE_MAX; k++) {
    restore.state[k] = rq->state[k].data;
    restore.nbytes[k] = rq->state[k].len;
  }
  if (vote_mesh && check_vote_mesh(s, rq->name, vote_mesh, eb) != 0) return eb->code;
  if (rq->keep_state) /* checked here, applied once all agree */
    return distd_param_tune(s->params, rq->name, cfg, 0, eb);
  return distd_param_configure(s->store, rq->name, cfg, rq->with_state ? &restore : NULL,
                               &p->entry, eb);
}

int distd_configure_finish(distd_server *s, distd_configure_prep *p, int apply,
                           dist_errbuf *eb) {
  int rc = 0;
  if (apply && p->keep_state) rc = distd_param_tune(s->params, p->name, &p->cfg, 1, eb);
  if (apply && rc == 0 && p->entry) distd_param_install(s->params, p->entry);
  else distd_param_entry_free(p->entry);
  p->entry = NULL;
  return rc;
}

/* A configure (or tune, keep_state). `refused` is this daemon's verdict
 * before any check (0, or why it cannot take the request now): a refusal
 * still takes part in the vote, so that the other daemons refuse too
 * instead of waiting for this one. */
static int configure_here(distd_server *s, const distd_call_info *ci,
                          const Dist__V1__ParamConfigureRequest *rq,
                          const distd_param_cfg *cfg, int refused, dist_errbuf *eb) {
  dist_mesh_desc mesh;
  int sent = vote_mesh(s, rq->mesh, rq->name, &mesh, eb);
  if (sent < 0) return eb->code;
  /* Sent to the whole mesh under one op id: applied by all or by none. */
  int vote = sent && rq->op_id && mesh.nranks > 1;
  distd_configure_prep prep = {0};
  int rc = refused ? refused
                   : distd_configure_prepare(s, rq, cfg, vote ? &mesh : NULL, &prep, eb);
  if (vote &&
      distd_vote(s, mesh.ranks, mesh.nranks, rq->op_id, ci->deadline_ms, "configure", rc, NULL,
                 eb) &&
      rc == 0)
    rc = eb->code;
  int done = distd_configure_finish(s, &prep, rc == 0, eb);
  return rc ? rc : done;
}

DISTD_HANDLER(param_configure) {
  const Dist__V1__ParamConfigureRequest *rq = (const void *)req;
  distd_param_cfg cfg;
  if (distd_param_cfg_from_pb(rq, &cfg, eb) != 0) return eb->code;
  /* Held while it runs: no reshard of the name starts meanwhile here. */
  int refused = distd_holds_take(s->holds, rq->name, DISTD_HOLD_CONFIGURE, ci->deadline_ms, eb);
  int rc = configure_here(s, ci, rq, &cfg, refused, eb);
  if (!refused) distd_holds_release(s->holds, rq->name, DISTD_HOLD_CONFIGURE);
  if (rc != 0) return rc;
  distd_tensor *t = NULL;
  if (distd_store_get(s->store, rq->name, &t, eb) != 0) return eb->code;
  reply_meta(s, t, reply);
  distd_tensor_unref(t);
  return 0;
}

/* Names what differs: a mesh of the same size was "on its mesh" alike. */
static int gradient_mismatch(const distd_tensor *g, const distd_tensor *p, dist_errbuf *eb) {
  char gs[96], ps[96], gm[256], pm[256];
  dist_shape_format(&g->global, gs, sizeof gs);
  dist_shape_format(&p->global, ps, sizeof ps);
  dist_mesh_format(&g->mesh, gm, sizeof gm);
  dist_mesh_format(&p->mesh, pm, sizeof pm);
  return dist_fail(eb, DIST_EMISMATCH, "gradient '%s' (%s %s on mesh %s) does not match "
                   "parameter '%s' (%s %s on mesh %s)", g->name, dist_dtype_name(g->dtype),
                   gs, gm, p->name, dist_dtype_name(p->dtype), ps, pm);
}

int distd_push_stored_gradient(distd_server *s, const distd_call_info *ci,
                               const Dist__V1__ParamPushRequest *rq, uint64_t op_id,
                               distd_tensor **out, dist_errbuf *eb) {
  distd_tensor *g = NULL, *p = NULL;
  int rc;
  if ((rc = distd_store_get(s->store, rq->name, &p, eb)) != 0) goto out;
  /* A gradient stored on other ranks only was "tensor not found". */
  if ((rc = distd_store_get(s->store, rq->grad_name, &g, eb)) != 0) {
    dist_errbuf_prefix(eb, "gradient for '%s' (it must be stored on the parameter's "
                       "mesh): ", p->name);
    goto out;
  }
  if (g->dtype != p->dtype || !dist_shape_equal(&g->global, &p->global) ||
      !dist_mesh_equal(&g->mesh, &p->mesh)) {
    rc = gradient_mismatch(g, p, eb);
    goto out;
  }
  if (memcmp(g->placements, p->placements,
             sizeof(dist_placement) * (size_t)p->nplacements) == 0) {
    *out = g, g = NULL;
    goto out;
  }
  rc = distd_reshard(s, g, &g->mesh, &p->mesh, p->placements, rq->grad_name,
                     op_id, ci->deadline_ms, out, eb);
out:
  distd_tensor_unref(g);
  distd_tensor_unref(p);
  return rc;
}

/* The layout the trainer made the push for, into *mesh and placements (0
 * when it sent none; placements only with data). Every daemon of the mesh
 * got the same, so all of them fail alike here. */
static int sent_layout(distd_server *s, const Dist__V1__ParamPushRequest *rq,
                       dist_mesh_desc *mesh, dist_placement *placements,
                       dist_errbuf *eb) {
  int sent = vote_mesh(s, rq->mesh, rq->name, mesh, eb);
  if (sent <= 0) return sent;
  if (rq->n_placements && rq->n_placements != (size_t)mesh->ndim) {
    dist_fail(eb, DIST_EINVAL, "push to '%s': %zu placements for a %d-d mesh",
              rq->name, rq->n_placements, mesh->ndim);
    return -1;
  }
  if (rq->n_placements &&
      dist_placements_from_pb(rq->placements, rq->n_placements, placements, eb) != 0)
    return -1;
  return 1;
}

void distd_push_reply_fill(const distd_push_result *res, Dist__V1__ParamPushReply *rp) {
  rp->version = res->version;
  rp->step = res->step;
  rp->pending = (uint32_t)res->pending;
  rp->applied = res->applied;
}

static void reply_push(const distd_push_result *res, grpc_byte_buffer **reply) {
  Dist__V1__ParamPushReply rp = DIST__V1__PARAM_PUSH_REPLY__INIT;
  distd_push_reply_fill(res, &rp);
  *reply = dist_pb_to_bb(&rp.base);
}

DISTD_HANDLER(param_push) {
  const Dist__V1__ParamPushRequest *rq = (const void *)req;
  distd_push_spec spec = {.name = rq->name, .trainer = (int)rq->trainer,
                          .expect_step = rq->step, .nbytes = rq->data.len};
  dist_mesh_desc mesh;
  dist_placement placements[DIST_MAX_MESH_DIMS];
  int sent = sent_layout(s, rq, &mesh, placements, eb);
  if (sent < 0) return eb->code;
  if (sent) {
    spec.mesh = &mesh;
    spec.placements = rq->n_placements ? placements : NULL;
  }
  /* Sent to the whole mesh under one op id: applied by all or by none. */
  int vote = sent && rq->op_id && mesh.nranks > 1, rc = 0;
  const void *grad = rq->data.data;
  distd_tensor *g = NULL;
  if (rq->grad_name[0] &&
      (rc = distd_push_stored_gradient(s, ci, rq, rq->op_id, &g, eb)) == 0) {
    grad = g->data;
    spec.nbytes = g->nbytes;
    spec.mesh = &g->mesh; /* converted for the parameter's layout of then */
    spec.placements = g->placements;
  }
  distd_push_ticket tk;
  if (rc == 0) rc = distd_param_stage(s->params, s->store, &spec, &tk, eb);
  if (vote &&
      distd_vote(s, mesh.ranks, mesh.nranks, rq->op_id, ci->deadline_ms, "push", rc, NULL,
                 eb) != 0 &&
      rc == 0) {
    distd_param_abort(s->params, &tk);
    rc = eb->code;
  }
  distd_push_result res;
  if (rc == 0) rc = distd_param_commit(s->params, s->store, &tk, grad, &res, eb);
  distd_tensor_unref(g);
  if (rc == 0) reply_push(&res, reply);
  return rc;
}

DISTD_HANDLER(param_pull) {
  const Dist__V1__ParamPullRequest *rq = (const void *)req;
  distd_tensor *t = NULL;
  uint64_t step = 0;
  if (distd_param_pull(s->params, s->store, rq->name, rq->min_version,
                       ci->deadline_ms, &t, &step, eb) != 0)
    return eb->code;
  dist_wire_meta wm = {0}, *w = &wm; /* on the stack: a reply cannot fail */
  distd_meta_describe(t, s->rank, w);
  Dist__V1__ParamPullReply rp = DIST__V1__PARAM_PULL_REPLY__INIT;
  rp.meta = &w->meta;
  rp.data.data = t->data;
  rp.data.len = t->nbytes;
  rp.step = step;
  *reply = dist_pb_to_bb(&rp.base);
  distd_tensor_unref(t);
  return 0;
}

DISTD_HANDLER(param_list) {
  (void)ci, (void)req;
  distd_param_info *list = NULL;
  int n = 0;
  if (distd_param_list(s->params, s->store, &list, &n, eb) != 0) return eb->code;
  Dist__V1__ParamState *states = calloc((size_t)n + 1, sizeof *states);
  Dist__V1__ParamState **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
  Dist__V1__ParamConfigureRequest *cfgs = calloc((size_t)n + 1, sizeof *cfgs);
  Dist__V1__OptimizerConfig *opts = calloc((size_t)n + 1, sizeof *opts);
  int rc = 0;
  if (!states || !ptrs || !cfgs || !opts)
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory listing parameters");
  for (int i = 0; i < n && rc == 0; i++) {
    dist__v1__param_configure_request__init(&cfgs[i]);
    cfgs[i].name = list[i].name;
    distd_param_cfg_to_pb(&list[i].cfg, &opts[i], &cfgs[i]);
    cfgs[i].step = list[i].step;
    dist__v1__param_state__init(&states[i]);
    states[i].config = &cfgs[i];
    states[i].pending = (uint32_t)list[i].pending;
    states[i].state_bytes = list[i].state_bytes;
    states[i].version = list[i].version;
    states[i].held_for = (char *)(list[i].held_for ? list[i].held_for : "");
    ptrs[i] = &states[i];
  }
  if (rc == 0) {
    Dist__V1__ParamListReply rp = DIST__V1__PARAM_LIST_REPLY__INIT;
    rp.n_params = (size_t)n;
    rp.params = ptrs;
    *reply = dist_pb_to_bb(&rp.base);
  }
  free(opts), free(cfgs), free(ptrs), free(states), free(list);
  return rc;
}

/* ---- /metrics: parameters ---- */

void distd_param_write_metrics(distd_server *s, struct evbuffer *out) {
  distd_param_info *list = NULL;
  int n = 0;
  if (distd_param_list(s->params, s->store, &list, &n, NULL) != 0) return;
  size_t state = 0;
  for (int i = 0; i < n; i++) state += list[i].state_bytes;
  distd_metrics_gauge_header(out, "distd_param_state_bytes", "gauge",
                             "Bytes reserved for optimizer state and pending sums");
  evbuffer_add_printf(out, "distd_param_state_bytes %zu\n", state);
  if (n > 0) {
    distd_metrics_gauge_header(out, "distd_param_updates_total", "counter",
                               "Optimizer updates applied to each parameter's shard here "
                               "(back to 0 when it is configured again)");
    for (int i = 0; i < n; i++)
      distd_metrics_sample(out, "distd_param_updates_total", "param", list[i].name,
                           (double)list[i].step);
    distd_metrics_gauge_header(out, "distd_param_pushes_pending", "gauge",
                               "Pushes waiting for each parameter's next synchronous update");
    for (int i = 0; i < n; i++)
      distd_metrics_sample(out, "distd_param_pushes_pending", "param", list[i].name,
                           list[i].pending);
  }
  free(list);
}
