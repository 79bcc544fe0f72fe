/* An SPMD trainer that refuses an operation itself (a bad name, shape or
 * placements) after taking its op id: the other trainers' daemons would
 * wait for this rank's part until their deadline. Its daemon tells them
 * (OpAbort), and they fail at once, naming this rank and its reason. */
#include "client_internal.h"

int dist_spmd_refused_ids(dist_client *c, uint64_t op_id, uint32_t more_ids,
                          const uint32_t *ranks, int n) {
  if (c->spmd_rank < 0 || !op_id || n < 2) return c->err.code;
  dist_errbuf refusal = c->err;
  Dist__V1__OpAbortRequest rq = DIST__V1__OP_ABORT_REQUEST__INIT;
  rq.op_id = op_id;
  rq.more_ids = more_ids;
  rq.n_ranks = (size_t)n;
  rq.ranks = (uint32_t *)ranks;
  rq.reason = refusal.msg;
  ProtobufCMessage *rp = NULL;
  /* A daemon before 0.2.5 does not know OpAbort: the others then wait as
   * they did, and the refusal is reported here either way. */
  dist_call_one(c, c->spmd_rank, "/dist.v1.Dist/OpAbort", &rq.base,
                &dist__v1__op_abort_reply__descriptor, &rp);
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  c->err = refusal;
  return refusal.code;
}

int dist_spmd_refused(dist_client *c, uint64_t op_id, const uint32_t *ranks, int n) {
  return dist_spmd_refused_ids(c, op_id, 0, ranks, n);
}

int dist_spmd_refused_on(dist_client *c, uint64_t op_id, const dist_mesh_desc *m) {
  uint32_t ranks[DIST_MAX_MESH_RANKS];
  for (int i = 0; i < m->nranks; i++) ranks[i] = (uint32_t)m->ranks[i];
  return dist_spmd_refused(c, op_id, ranks, m->nranks);
}
