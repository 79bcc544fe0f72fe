/* A parameter's configuration to and from its dist.v1 message
 * (ParamConfigureRequest), for the Param service and for checkpoints read
 * through the client. */
#ifndef DISTD_PARAM_PB_H
#define DISTD_PARAM_PB_H

#include "param.pb-c.h"
#include "param_service.h"

/* Fails for an unknown consistency mode or a missing optimizer; the values
 * themselves are checked where the parameter is made. */
int distd_param_cfg_from_pb(const Dist__V1__ParamConfigureRequest *rq, distd_param_cfg *c,
                            dist_errbuf *eb);
/* Fills rq's configuration fields; opt becomes rq->optimizer. */
void distd_param_cfg_to_pb(const distd_param_cfg *c, Dist__V1__OptimizerConfig *opt,
                           Dist__V1__ParamConfigureRequest *rq);

#endif
