/* What the Param service's handlers share (svc_param.c, svc_param_batch.c):
 * a push's stored gradient and its reply. */
#ifndef DISTD_SVC_PARAM_H
#define DISTD_SVC_PARAM_H

#include "param.pb-c.h"
#include "param_service.h"
#include "rpc.h"
#include "server.h"

/* The stored gradient rq->grad_name, converted to the parameter's
 * placements when it has others (Partial gradients are reduced here) under
 * op id op_id. Every daemon of the parameter's mesh runs this with the same
 * op id; the checks use metadata every daemon has, so they all accept or
 * all refuse. *out is a new reference. */
int distd_push_stored_gradient(distd_server *s, const distd_call_info *ci,
                               const Dist__V1__ParamPushRequest *rq, uint64_t op_id,
                               distd_tensor **out, dist_errbuf *eb);
void distd_push_reply_fill(const distd_push_result *res, Dist__V1__ParamPushReply *rp);

/* A configure (or a tune: keep_state) checked and made ready here, to be
 * applied or dropped once the daemons agreed. */
typedef struct distd_configure_prep {
  const char *name;
  distd_param_cfg cfg;
  int keep_state;
  distd_param_entry *entry; /* a configure's new entry; NULL for a tune */
} distd_configure_prep;
/* Checks rq (parsed into cfg) against this daemon's parameter, with
 * vote_mesh (NULL: none) its tensor's mesh, and prepares what applying
 * needs; nothing changes yet. */
int distd_configure_prepare(distd_server *s, const Dist__V1__ParamConfigureRequest *rq,
                            const distd_param_cfg *cfg, const dist_mesh_desc *vote_mesh,
                            distd_configure_prep *p, dist_errbuf *eb);
/* Applies p (apply) or drops it; applying a tune fails only when the
 * parameter changed since its check. */
int distd_configure_finish(distd_server *s, distd_configure_prep *p, int apply,
                           dist_errbuf *eb);

#endif
