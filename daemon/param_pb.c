/* Parameter configurations and their messages: see param_pb.h. */
#include "param_pb.h"

#include <string.h>

int distd_param_cfg_from_pb(const Dist__V1__ParamConfigureRequest *rq, distd_param_cfg *c,
                            dist_errbuf *eb) {
  const Dist__V1__OptimizerConfig *o = rq->optimizer;
  if (!o) return dist_fail(eb, DIST_EINVAL, "configure '%s': no optimizer given", rq->name);
  memset(c, 0, sizeof *c);
  c->optim.kind = (distd_optim_kind)o->kind;
  c->optim.lr = o->lr;
  c->optim.momentum = o->momentum;
  c->optim.dampening = o->dampening;
  c->optim.nesterov = o->nesterov;
  c->optim.beta1 = o->beta1;
  c->optim.beta2 = o->beta2;
  c->optim.eps = o->eps;
  c->optim.weight_decay = o->weight_decay;
  c->reduce = (dist_reduce)rq->reduce;
  c->async = rq->consistency == DIST__V1__CONSISTENCY__ASYNC;
  c->trainers = (int)rq->trainers;
  if (rq->consistency != DIST__V1__CONSISTENCY__SYNC && !c->async)
    return dist_fail(eb, DIST_EINVAL, "unknown consistency mode %d", rq->consistency);
  return 0;
}

void distd_param_cfg_to_pb(const distd_param_cfg *c, Dist__V1__OptimizerConfig *opt,
                           Dist__V1__ParamConfigureRequest *rq) {
  dist__v1__optimizer_config__init(opt);
  opt->kind = (Dist__V1__OptimizerConfig__Kind)c->optim.kind;
  opt->lr = c->optim.lr;
  opt->momentum = c->optim.momentum;
  opt->dampening = c->optim.dampening;
  opt->nesterov = c->optim.nesterov != 0;
  opt->beta1 = c->optim.beta1;
  opt->beta2 = c->optim.beta2;
  opt->eps = c->optim.eps;
  opt->weight_decay = c->optim.weight_decay;
  rq->optimizer = opt;
  rq->reduce = (Dist__V1__ReduceOp)c->reduce;
  rq->consistency = c->async ? DIST__V1__CONSISTENCY__ASYNC : DIST__V1__CONSISTENCY__SYNC;
  rq->trainers = (uint32_t)c->trainers;
}
