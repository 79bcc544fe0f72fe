/* OpAbort: an SPMD trainer refused an operation itself, after taking its
 * op id, so this daemon will never run its part. The operation's other
 * daemons would wait for that part until their deadline; told here, each
 * fails at once naming this rank and the trainer's reason. */
#include <stdio.h>

#include "dist.pb-c.h"
#include "methods.h"
#include "pbuf.h"
#include "peer.h"
#include "reshard.h"
#include "subop.h"
#include "vote.h"

/* A LocalLayer call takes one op id per output; as when the program is
 * unknown (svc_program.c), the first this many are aborted at the most. */
#define DISTD_ABORT_MORE_IDS_MAX DIST_MAX_MESH_RANKS

/* The request does not say which operation it was, so every exchange an
 * operation's daemons may wait on first is aborted: the op id itself (a
 * collective, a shape exchange), its vote, the vote of a LocalLayer
 * backward of the invocation op_id, and a reshard's steps. Ids nobody
 * runs are remembered a while, then dropped. */
static void abort_every_first_step(distd_server *s, uint64_t op_id, const int *ranks, int n,
                                   const char *why) {
  distd_abort_op(s->peers, op_id, ranks, n, why);
  distd_abort_op(s->peers, distd_subop(op_id, DISTD_STEP_VOTE), ranks, n, why);
  uint64_t backward = distd_subop(op_id, DISTD_STEP_BACKWARD);
  distd_abort_op(s->peers, distd_subop(backward, DISTD_STEP_VOTE), ranks, n, why);
  distd_reshard_abort(s, op_id, DIST_MAX_MESH_DIMS, ranks, n, why);
}

DISTD_HANDLER(op_abort) {
  (void)ci;
  const Dist__V1__OpAbortRequest *rq = (const void *)req;
  int ranks[DIST_MAX_MESH_RANKS];
  int n = distd_vote_ranks(s, rq->ranks, rq->n_ranks, ranks);
  if (!rq->op_id || n == 0 || rq->more_ids > DISTD_ABORT_MORE_IDS_MAX)
    return dist_fail(eb, DIST_EINVAL, "OpAbort needs an op id, at most %d more, and its "
                     "ranks, rank %d among them, each once", DISTD_ABORT_MORE_IDS_MAX, s->rank);
  char why[600];
  snprintf(why, sizeof why, "its trainer refused it: %s", rq->reason ? rq->reason : "");
  abort_every_first_step(s, rq->op_id, ranks, n, why);
  for (uint32_t k = 1; k <= rq->more_ids; k++) distd_abort_op(s->peers, rq->op_id + k, ranks, n, why);
  Dist__V1__OpAbortReply rp = DIST__V1__OP_ABORT_REPLY__INIT;
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}
