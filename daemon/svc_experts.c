/* dist.v1.Moe expert RPCs: ExpertLayerCreate, ExpertForward,
 * ExpertBackward, ExpertRelease. Each handler turns its request into an
 * experts.h call and describes the stored result. */
#include <stdlib.h>
#include <string.h>

#include "experts.h"
#include "holds.h"
#include "methods.h"
#include "moe.pb-c.h"
#include "pbuf.h"
#include "tensor_meta.h"
#include "vote.h"

static int parse_cfg(const Dist__V1__ExpertLayerCreateRequest *rq,
                     distd_expert_layer_cfg *c, dist_errbuf *eb) {
  memset(c, 0, sizeof *c);
  if (!rq->layer || strlen(rq->layer) >= sizeof c->name)
    return dist_fail(eb, DIST_EINVAL, "an expert layer name has 1 to %zu characters",
                     sizeof c->name - 1);
  strcpy(c->name, rq->layer);
  if (rq->experts > 65536 || rq->first_expert > (1u << 30) ||
      rq->d_model > (1ull << 31) || rq->d_hidden > (1ull << 31))
    return dist_fail(eb, DIST_EINVAL, "expert layer '%s': sizes out of range", rq->layer);
  c->experts = (int)rq->experts;
  c->first_expert = (int)rq->first_expert;
  c->d_model = (int64_t)rq->d_model;
  c->d_hidden = (int64_t)rq->d_hidden;
  c->act = (distd_expert_act)rq->activation;
  c->bias = rq->bias;
  return dist_dtype_from_pb((int)rq->dtype, &c->dtype, eb);
}

/* The given weights, one entry per expert; NULL *out when none are given. */
static int parse_init(const Dist__V1__ExpertLayerCreateRequest *rq,
                      distd_expert_init **out, dist_errbuf *eb) {
  *out = NULL;
  if (rq->n_weights == 0) return 0;
  if (rq->n_weights != rq->experts)
    return dist_fail(eb, DIST_EINVAL, "expert layer '%s': weights for %zu experts, "
                     "the layer has %u here", rq->layer, rq->n_weights, rq->experts);
  distd_expert_init *in = calloc(rq->n_weights, sizeof *in);
  if (!in) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (size_t e = 0; e < rq->n_weights; e++) {
    const Dist__V1__ExpertWeights *w = rq->weights[e];
    in[e] = (distd_expert_init){w->w1.data, w->b1.data, w->w2.data, w->b2.data,
                                w->w1.len, w->b1.len, w->w2.len, w->b2.len};
  }
  *out = in;
  return 0;
}

/* Every daemon of the layer makes its experts, then they vote, and each
 * installs them only if all could. The names it stores are held meanwhile
 * (holds.h), so that no put, reshard or restore of one of them lands
 * between this daemon's check that they are free and its store; a name
 * held by one of those is this daemon's no. */
DISTD_HANDLER(expert_layer_create) {
  const Dist__V1__ExpertLayerCreateRequest *rq = (const void *)req;
  distd_expert_layer_cfg cfg;
  distd_expert_init *init = NULL;
  distd_expert_draft d;
  memset(&d, 0, sizeof d);
  int ranks[DIST_MAX_MESH_RANKS], n = distd_vote_ranks(s, rq->ranks, rq->n_ranks, ranks);
  int rc = parse_cfg(rq, &cfg, eb);
  if (rc == 0) rc = parse_init(rq, &init, eb);
  if (rc == 0) rc = distd_experts_name(&cfg, &d, eb);
  uint64_t batch = 0;
  int held = rc ? rc : distd_holds_take_all(s->holds, (const char *const *)d.names,
                                             (size_t)d.nnames, DISTD_HOLD_EXPERTS,
                                             ci->deadline_ms, &batch, eb);
  if (rc == 0) rc = held;
  if (rc == 0) rc = distd_experts_draft(s->experts, s, rq->seed, init, rq->replace, &d, eb);
  if (n > 1) rc = distd_vote(s, ranks, n, rq->op_id, ci->deadline_ms, "expert layer", rc, NULL, eb);
  if (rc == 0) {
    distd_experts_install(s->experts, s, &d);
    Dist__V1__ExpertLayerCreateReply rp = DIST__V1__EXPERT_LAYER_CREATE_REPLY__INIT;
    rp.n_tensors = (size_t)d.nparams;
    rp.tensors = d.names;
    *reply = dist_pb_to_bb(&rp.base);
  }
  if (held == 0) distd_holds_release_batch(s->holds, batch);
  distd_expert_draft_free(&d);
  free(init);
  return rc;
}

static int describe(distd_server *s, const distd_tensor *t, dist_wire_meta **w,
                    dist_errbuf *eb) {
  if (!(*w = calloc(1, sizeof **w))) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  distd_meta_describe(t, s->rank, *w);
  return 0;
}

DISTD_HANDLER(expert_forward) {
  (void)ci;
  const Dist__V1__ExpertForwardRequest *rq = (const void *)req;
  distd_tensor *t = NULL;
  dist_wire_meta *w = NULL;
  int64_t *rows = calloc(rq->n_counts + 1, sizeof *rows);
  distd_expert_fwd f = {rq->layer, rq->x_name, rq->counts, rq->n_counts,
                        rq->out_name, rq->replace, rq->invocation};
  int nrows = 0;
  int rc = rows ? distd_experts_forward(s->experts, s, &f, &t, rows, &nrows, eb)
                : dist_fail(eb, DIST_ENOMEM, "out of memory");
  if (rc == 0) rc = describe(s, t, &w, eb);
  if (rc == 0) {
    Dist__V1__ExpertForwardReply rp = DIST__V1__EXPERT_FORWARD_REPLY__INIT;
    rp.meta = &w->meta;
    rp.expert_rows = rows;
    rp.n_expert_rows = (size_t)nrows;
    *reply = dist_pb_to_bb(&rp.base);
  }
  free(w);
  free(rows);
  distd_tensor_unref(t);
  return rc;
}

DISTD_HANDLER(expert_backward) {
  (void)ci;
  const Dist__V1__ExpertBackwardRequest *rq = (const void *)req;
  distd_tensor *t = NULL;
  dist_wire_meta *w = NULL;
  distd_expert_bwd b = {rq->layer, rq->invocation, rq->grad_name, rq->out_name,
                        rq->replace, rq->accumulate};
  int rc = distd_experts_backward(s->experts, s, &b, &t, eb);
  if (rc == 0) rc = describe(s, t, &w, eb);
  if (rc == 0) {
    Dist__V1__ExpertBackwardReply rp = DIST__V1__EXPERT_BACKWARD_REPLY__INIT;
    rp.meta = &w->meta;
    *reply = dist_pb_to_bb(&rp.base);
  }
  free(w);
  distd_tensor_unref(t);
  return rc;
}

DISTD_HANDLER(expert_release) {
  (void)ci;
  const Dist__V1__ExpertReleaseRequest *rq = (const void *)req;
  int n = 0;
  int rc = distd_experts_release(s->experts, rq->layer, rq->invocation, &n, eb);
  if (rc == 0) {
    Dist__V1__ExpertReleaseReply rp = DIST__V1__EXPERT_RELEASE_REPLY__INIT;
    rp.released = (uint32_t)n;
    *reply = dist_pb_to_bb(&rp.base);
  }
  return rc;
}
