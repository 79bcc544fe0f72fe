/* dist.v1.Param/PushGradBatch and ConfigureBatch (param.proto): stored
 * gradients for several parameters (a layer's optimizer step), or their
 * configures, prepared together and applied after one vote of every daemon
 * asked, so that a step or configure refused for one parameter changes
 * none. Pushes one at a time left the parameters before the refused one
 * updated, and a step made again updated them twice. */
#include <stdlib.h>
#include <string.h>

#include "holds.h"
#include "methods.h"
#include "param_pb.h"
#include "pbuf.h"
#include "subop.h"
#include "svc_param.h"
#include "vote.h"
#include "wire.h"

/* More would not be a layer's step. */
#define MAX_BATCH 65536

typedef struct {
  int mine; /* the parameter has a piece here */
  distd_tensor *grad;
  distd_push_ticket tk;
  distd_push_result res;
} batch_push;

/* The batch's parameter `name` is on pb (a mesh within the batch's
 * ranks), into *mesh; *mine: whether this daemon is in it. Every daemon
 * reads the same request (one client), so all refuse alike. */
static int item_mesh(distd_server *s, const char *name, const Dist__V1__Mesh *pb,
                     const int *ranks, int nranks, dist_mesh_desc *mesh, int *mine,
                     dist_errbuf *eb) {
  if (!pb) return dist_fail(eb, DIST_EINVAL, "'%s' in a batch without its mesh", name);
  if (dist_mesh_from_pb(pb, mesh, eb) != 0) return eb->code;
  for (int i = 0; i < mesh->nranks; i++) {
    int in = 0;
    for (int j = 0; j < nranks && !in; j++) in = ranks[j] == mesh->ranks[i];
    if (!in)
      return dist_fail(eb, DIST_EINVAL, "'%s': its mesh has rank %d, which the batch does "
                       "not ask", name, mesh->ranks[i]);
  }
  *mine = dist_mesh_index_of(mesh, s->rank) >= 0;
  return 0;
}

/* The daemons a batch asks (its ranks, which must name this one). */
static int batch_ranks(distd_server *s, const uint32_t *named, size_t n, uint64_t op_id,
                       int *ranks, dist_errbuf *eb) {
  int nranks = distd_vote_ranks(s, named, n, ranks);
  if (!nranks || !op_id)
    return dist_fail(eb, DIST_EINVAL, "a batch needs an op id and ranks that name this "
                     "daemon (%d) once each, within the cluster", s->rank), 0;
  return nranks;
}

/* The vote on a batch (one daemon alone has nobody to ask); rc stays
 * this daemon's own error when it has one. */
static int vote_batch(distd_server *s, const distd_call_info *ci, const int *ranks,
                      int nranks, uint64_t op_id, const char *what, int verdict,
                      dist_errbuf *eb) {
  if (nranks > 1 && distd_vote(s, ranks, nranks, op_id, ci->deadline_ms, what, verdict, NULL,
                               eb) != 0 && verdict == 0)
    return eb->code;
  return verdict;
}

/* Push k: its gradient, then its stage. A gradient is fetched even after
 * an earlier push was refused, since its reshard is an exchange the other
 * daemons of its mesh run; only the first refusal is kept in eb. */
static int stage_push(distd_server *s, const distd_call_info *ci,
                      const Dist__V1__ParamPushBatchRequest *rq, size_t k, const int *ranks,
                      int nranks, batch_push *b, int verdict, dist_errbuf *eb) {
  dist_errbuf scratch = DIST_ERRBUF_INIT, *e = verdict ? &scratch : eb;
  const Dist__V1__ParamPushRequest *p = rq->pushes[k];
  dist_mesh_desc mesh;
  int rc = p->grad_name[0] ? item_mesh(s, p->name, p->mesh, ranks, nranks, &mesh, &b->mine, e)
                           : dist_fail(e, DIST_EINVAL, "push to '%s' in a batch without a "
                                       "stored gradient", p->name);
  if (rc != 0 || !b->mine) return verdict ? verdict : rc;
  unsigned step = DISTD_STEP_PUSH_BATCH + (unsigned)k * DISTD_STEP_RESHARD_SPAN;
  uint64_t op = distd_subop(rq->op_id, step);
  rc = distd_push_stored_gradient(s, ci, p, op, &b->grad, e);
  if (verdict) return verdict;
  if (rc != 0) return rc;
  distd_push_spec spec = {.name = p->name, .trainer = (int)p->trainer, .expect_step = p->step,
                          .nbytes = b->grad->nbytes, .mesh = &b->grad->mesh,
                          .placements = b->grad->placements};
  return distd_param_stage(s->params, s->store, &spec, &b->tk, eb);
}

/* Every staged push applied, or (rc != 0) none. A commit fails only when
 * the parameter's tensor went away since its stage; the pushes before it
 * stay applied, as on the other daemons: the error says so. */
static int settle(distd_server *s, batch_push *b, size_t n, int rc, dist_errbuf *eb) {
  for (size_t k = 0; k < n; k++) {
    if (!b[k].tk.entry) continue;
    if (rc != 0) distd_param_abort(s->params, &b[k].tk);
    else if ((rc = distd_param_commit(s->params, s->store, &b[k].tk, b[k].grad->data,
                                      &b[k].res, eb)) != 0)
      dist_errbuf_prefix(eb, "%zu of the batch's pushes were applied here before: ", k);
  }
  return rc;
}

static void reply_batch(const batch_push *b, size_t n, grpc_byte_buffer **reply) {
  Dist__V1__ParamPushReply *rps = calloc(n + 1, sizeof *rps);
  Dist__V1__ParamPushReply **ptrs = calloc(n + 1, sizeof *ptrs);
  Dist__V1__ParamPushBatchReply rp = DIST__V1__PARAM_PUSH_BATCH_REPLY__INIT;
  for (size_t k = 0; rps && ptrs && k < n; k++) {
    dist__v1__param_push_reply__init(&rps[k]);
    if (b[k].mine) distd_push_reply_fill(&b[k].res, &rps[k]);
    ptrs[k] = &rps[k];
  }
  rp.n_replies = rps && ptrs ? n : 0; /* out of memory: the client finds none */
  rp.replies = ptrs;
  *reply = dist_pb_to_bb(&rp.base);
  free(ptrs);
  free(rps);
}

DISTD_HANDLER(param_push_batch) {
  const Dist__V1__ParamPushBatchRequest *rq = (const void *)req;
  int ranks[DIST_MAX_MESH_RANKS];
  int nranks = batch_ranks(s, rq->ranks, rq->n_ranks, rq->op_id, ranks, eb);
  if (!nranks) return eb->code;
  size_t n = rq->n_pushes;
  batch_push *b = calloc(n + 1, sizeof *b);
  int verdict = 0;
  if (n > MAX_BATCH)
    verdict = dist_fail(eb, DIST_EINVAL, "%zu pushes in one batch, over %d", n, MAX_BATCH);
  else if (!b) verdict = dist_fail(eb, DIST_ENOMEM, "out of memory for %zu pushes", n);
  for (size_t k = 0; b && n <= MAX_BATCH && k < n; k++)
    verdict = stage_push(s, ci, rq, k, ranks, nranks, &b[k], verdict, eb);
  int rc = vote_batch(s, ci, ranks, nranks, rq->op_id, "step", verdict, eb);
  if (b) rc = settle(s, b, n, rc, eb);
  if (rc == 0) reply_batch(b, n, reply);
  for (size_t k = 0; b && k < n; k++) distd_tensor_unref(b[k].grad);
  free(b);
  return rc;
}

/* ---- ConfigureBatch ---- */

typedef struct {
  int mine;
  dist_mesh_desc mesh;
  distd_configure_prep prep;
} batch_configure;

/* Configure k checked and prepared here (nothing applied yet); only the
 * first refusal is kept in eb. */
static int prepare_configure(distd_server *s, const Dist__V1__ParamConfigureBatchRequest *rq,
                             size_t k, const int *ranks, int nranks, batch_configure *b,
                             int verdict, dist_errbuf *eb) {
  if (verdict) return verdict;
  const Dist__V1__ParamConfigureRequest *c = rq->configures[k];
  distd_param_cfg cfg;
  int rc = item_mesh(s, c->name, c->mesh, ranks, nranks, &b->mesh, &b->mine, eb);
  if (rc != 0 || !b->mine) return rc;
  if (c->with_state)
    return dist_fail(eb, DIST_EINVAL, "'%s': a batch restores no state", c->name);
  if (distd_param_cfg_from_pb(c, &cfg, eb) != 0) return eb->code;
  return distd_configure_prepare(s, c, &cfg, &b->mesh, &b->prep, eb);
}

/* Holds every name of the batch (at once, so that two batches never wait
 * for each other), as one configure holds its name. 0 with *batch 0:
 * nothing to hold. */
static int hold_names(distd_server *s, const distd_call_info *ci,
                      const Dist__V1__ParamConfigureBatchRequest *rq, uint64_t *batch,
                      dist_errbuf *eb) {
  const char **names = calloc(rq->n_configures + 1, sizeof *names);
  if (!names) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  size_t n = 0;
  for (size_t k = 0; k < rq->n_configures; k++) names[n++] = rq->configures[k]->name;
  *batch = 0;
  int rc = n ? distd_holds_take_all(s->holds, names, n, DISTD_HOLD_CONFIGURE, ci->deadline_ms,
                                    batch, eb)
             : 0;
  free(names);
  return rc;
}

DISTD_HANDLER(param_configure_batch) {
  const Dist__V1__ParamConfigureBatchRequest *rq = (const void *)req;
  int ranks[DIST_MAX_MESH_RANKS];
  int nranks = batch_ranks(s, rq->ranks, rq->n_ranks, rq->op_id, ranks, eb);
  if (!nranks) return eb->code;
  size_t n = rq->n_configures;
  batch_configure *b = calloc(n + 1, sizeof *b);
  uint64_t held = 0;
  int verdict = 0;
  if (n > MAX_BATCH)
    verdict = dist_fail(eb, DIST_EINVAL, "%zu configures in one batch, over %d", n, MAX_BATCH);
  else if (!b) verdict = dist_fail(eb, DIST_ENOMEM, "out of memory for %zu configures", n);
  else verdict = hold_names(s, ci, rq, &held, eb);
  for (size_t k = 0; b && n <= MAX_BATCH && k < n; k++)
    verdict = prepare_configure(s, rq, k, ranks, nranks, &b[k], verdict, eb);
  int rc = vote_batch(s, ci, ranks, nranks, rq->op_id, "configure", verdict, eb);
  for (size_t k = 0; b && k < n; k++) {
    int done = distd_configure_finish(s, &b[k].prep, rc == 0, eb);
    if (rc == 0) rc = done;
  }
  if (held) distd_holds_release_batch(s->holds, held);
  free(b);
  if (rc == 0) {
    Dist__V1__ParamConfigureBatchReply rp = DIST__V1__PARAM_CONFIGURE_BATCH_REPLY__INIT;
    *reply = dist_pb_to_bb(&rp.base);
  }
  return rc;
}
