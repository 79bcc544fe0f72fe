/* dist.v1.Param/PushGradBatch (param.proto): stored gradients for several
 * parameters (a layer's optimizer step), staged together and applied after
 * one vote of every daemon asked, so that a step refused for one
 * parameter changes none. Pushes one at a time left the parameters before
 * the refused one updated, and a step made again updated them twice. */
#include <stdlib.h>
#include <string.h>

#include "methods.h"
#include "pbuf.h"
#include "subop.h"
#include "svc_param.h"
#include "vote.h"
#include "wire.h"

/* More would not be a layer's step. */
#define MAX_BATCH_PUSHES 65536

typedef struct {
  int mine; /* the parameter has a piece here */
  distd_tensor *grad;
  distd_push_ticket tk;
  distd_push_result res;
} batch_push;

/* Whether push rq names a gradient and a mesh within the batch's ranks,
 * and *mine: whether this daemon is in it. Every daemon reads the same
 * request (one client), so all refuse alike. */
static int check_push(distd_server *s, const Dist__V1__ParamPushRequest *rq, const int *ranks,
                      int nranks, int *mine, dist_errbuf *eb) {
  dist_mesh_desc mesh;
  if (!rq->grad_name[0] || !rq->mesh)
    return dist_fail(eb, DIST_EINVAL, "push to '%s' in a batch without a stored gradient "
                     "and its mesh", rq->name);
  if (dist_mesh_from_pb(rq->mesh, &mesh, eb) != 0) return eb->code;
  for (int i = 0; i < mesh.nranks; i++) {
    int in = 0;
    for (int j = 0; j < nranks && !in; j++) in = ranks[j] == mesh.ranks[i];
    if (!in)
      return dist_fail(eb, DIST_EINVAL, "push to '%s': its mesh has rank %d, which the "
                       "batch does not ask", rq->name, mesh.ranks[i]);
  }
  *mine = dist_mesh_index_of(&mesh, s->rank) >= 0;
  return 0;
}

/* Push k: its gradient, then its stage. A gradient is fetched even after
 * an earlier push was refused, since its reshard is an exchange the other
 * daemons of its mesh run; only the first refusal is kept in eb. */
static int stage_push(distd_server *s, const distd_call_info *ci,
                      const Dist__V1__ParamPushBatchRequest *rq, size_t k, const int *ranks,
                      int nranks, batch_push *b, int verdict, dist_errbuf *eb) {
  dist_errbuf scratch = DIST_ERRBUF_INIT, *e = verdict ? &scratch : eb;
  const Dist__V1__ParamPushRequest *p = rq->pushes[k];
  int rc = check_push(s, p, ranks, nranks, &b->mine, e);
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
  int nranks = distd_vote_ranks(s, rq->ranks, rq->n_ranks, ranks);
  if (!nranks || !rq->op_id)
    return dist_fail(eb, DIST_EINVAL, "a batch of pushes needs an op id and ranks that name "
                     "this daemon (%d) once each, within the cluster", s->rank);
  size_t n = rq->n_pushes;
  batch_push *b = calloc(n + 1, sizeof *b);
  int verdict = 0;
  if (n > MAX_BATCH_PUSHES) verdict = dist_fail(eb, DIST_EINVAL, "%zu pushes in one batch, "
                                                "over %d", n, MAX_BATCH_PUSHES);
  else if (!b) verdict = dist_fail(eb, DIST_ENOMEM, "out of memory for %zu pushes", n);
  for (size_t k = 0; b && n <= MAX_BATCH_PUSHES && k < n; k++)
    verdict = stage_push(s, ci, rq, k, ranks, nranks, &b[k], verdict, eb);
  int rc = verdict;
  if (nranks > 1 &&
      distd_vote(s, ranks, nranks, rq->op_id, ci->deadline_ms, "step", verdict, NULL, eb) &&
      rc == 0)
    rc = eb->code;
  if (b) rc = settle(s, b, n, rc, eb);
  if (rc == 0) reply_batch(b, n, reply);
  for (size_t k = 0; b && k < n; k++) distd_tensor_unref(b[k].grad);
  free(b);
  return rc;
}
