/* OpAbort: an SPMD trainer refused an operation itself, after taking its
 * op id, so this daemon will never run its part. The operation's other
 * daemons would wait for that part until their deadline; told here, each
 * fails at once naming this rank and the trainer's reason. */
#include <stdio.h>

#include "dist.pb-c.h"
#include "methods.h"
#include "op_refuse.h"
#include "pbuf.h"
#include "peer.h"
#include "reshard.h"
#include "subop.h"
#include "vote.h"

/* A LocalLayer call takes one op id per output; as when the program is
 * unknown (svc_program.c), the first this many are aborted at the most. */
#define DISTD_ABORT_MORE_IDS_MAX DIST_MAX_MESH_RANKS

/* The refusal does not say which operation it was, so every exchange an
 * operation's daemons may wait on first is aborted: the op id itself (a
 * collective, a shape exchange), its vote, the vote of a LocalLayer
 * backward of the invocation op_id, a reshard's steps, and the more_ids
 * ids after op_id (a LocalLayer call's outputs). Ids nobody
 * runs are remembered a while, then dropped. */
void distd_refuse_op(distd_server *s, uint64_t op_id, uint32_t more_ids, const int *ranks, int n,
                     const char *who, const char *why) {
  char reason[700];
  snprintf(reason, sizeof reason, "%s refused it: %s", who, why ? why : "");
  distd_abort_op(s->peers, op_id, ranks, n, reason);
  distd_abort_op(s->peers, distd_subop(op_id, DISTD_STEP_VOTE), ranks, n, reason);
  uint64_t backward = distd_subop(op_id, DISTD_STEP_BACKWARD);
  distd_abort_op(s->peers, distd_subop(backward, DISTD_STEP_VOTE), ranks, n, reason);
  distd_reshard_abort(s, op_id, DIST_MAX_MESH_DIMS, ranks, n, reason);
  for (uint32_t k = 1; k <= more_ids; k++) distd_abort_op(s->peers, op_id + k, ranks, n, reason);
}

/* The ranks to tell of a refused request over group[0..n_group) (the
 * world when n_group is 0; the first DIST_MAX_MESH_RANKS of a longer
 * one): their count, or 0 when this rank is not among them, since then
 * nobody waits for its part. */
static int refusal_ranks(const distd_server *s, const uint32_t *group, size_t n_group,
                         int *ranks) {
  size_t n = n_group ? n_group : (size_t)s->world_size;
  if (n > DIST_MAX_MESH_RANKS) n = DIST_MAX_MESH_RANKS; /* the refusal names these */
  int member = 0;
  for (size_t i = 0; i < n; i++) {
    ranks[i] = n_group ? (int)group[i] : (int)i; /* one outside the world is skipped */
    member |= ranks[i] == s->rank;
  }
  return member ? (int)n : 0;
}

int distd_refuse_group(distd_server *s, uint64_t op_id, const uint32_t *group, size_t n_group,
                       const dist_errbuf *eb) {
  int ranks[DIST_MAX_MESH_RANKS];
  int n = refusal_ranks(s, group, n_group, ranks);
  if (n > 0) distd_refuse_op(s, op_id, 0, ranks, n, "its daemon", dist_errbuf_msg(eb));
  return eb->code;
}

DISTD_HANDLER(op_abort) {
  (void)ci;
  const Dist__V1__OpAbortRequest *rq = (const void *)req;
  int ranks[DIST_MAX_MESH_RANKS];
  int n = distd_vote_ranks(s, rq->ranks, rq->n_ranks, ranks);
  if (!rq->op_id || n == 0 || rq->more_ids > DISTD_ABORT_MORE_IDS_MAX)
    return dist_fail(eb, DIST_EINVAL, "OpAbort needs an op id, at most %d more, and its "
                     "ranks, rank %d among them, each once", DISTD_ABORT_MORE_IDS_MAX, s->rank);
  distd_refuse_op(s, rq->op_id, rq->more_ids, ranks, n, "its trainer", rq->reason);
  Dist__V1__OpAbortReply rp = DIST__V1__OP_ABORT_REPLY__INIT;
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}
