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
#include "vote.h"

/* The refusal does not say which operation it was, so every exchange an
 * operation's daemons may wait on first is aborted: for op_id and each of
 * the more_ids ids after it (a LocalLayer call's outputs, a tape
 * backward's plan), the id itself (a collective, a shape exchange), its
 * vote, the vote of a LocalLayer backward of that invocation, and a
 * reshard's steps (distd_refused_steps). A daemon since 0.2.9 remembers
 * consecutive ids as one range that covers their steps too
 * (peer_remember.c), and one that reads ABORT_RANGE frames is told the
 * whole range in one (distd_abort_range). Ids nobody runs are remembered a
 * while, then dropped. */
void distd_refuse_op(distd_server *s, uint64_t op_id, uint32_t more_ids, const int *ranks, int n,
                     const char *who, const char *why) {
  char reason[700];
  snprintf(reason, sizeof reason, "%s refused it: %s", who, why ? why : "");
  distd_abort_range(s->peers, op_id, (uint64_t)more_ids + 1, ranks, n, reason);
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
  if (!rq->op_id || n == 0 || rq->more_ids > DIST_ABORT_MORE_IDS_MAX)
    return dist_fail(eb, DIST_EINVAL, "OpAbort needs an op id, at most %d more, and its "
                     "ranks, rank %d among them, each once", DIST_ABORT_MORE_IDS_MAX, s->rank);
  distd_refuse_op(s, rq->op_id, rq->more_ids, ranks, n, "its trainer", rq->reason);
  Dist__V1__OpAbortReply rp = DIST__V1__OP_ABORT_REPLY__INIT;
  rp.aborted_ids = 1 + rq->more_ids; /* each with its steps, unlike before 0.2.9 */
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}
