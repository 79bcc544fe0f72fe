/* An SPMD trainer that refuses an operation itself (a bad name, shape or
 * placements) after taking its op id: the other trainers' daemons would
 * wait for this rank's part until their deadline. Its daemon tells them
 * (OpAbort), and they fail at once, naming this rank and its reason. */
#include <stdlib.h>

#include "client_internal.h"

/* The daemons of ranks[0..n) the client knows, each once, into known:
 * their count; 0 when this trainer's rank is not among them, since then
 * nobody waits for its part. */
static int daemons_waiting(const dist_client *c, const uint32_t *ranks, int n, uint32_t *known) {
  int m = 0, member = 0;
  for (int i = 0; i < n && m < DIST_MAX_MESH_RANKS; i++) {
    int seen = ranks[i] >= (uint32_t)c->n;
    for (int j = 0; j < m && !seen; j++) seen = known[j] == ranks[i];
    if (seen) continue;
    known[m++] = ranks[i];
    member |= ranks[i] == (uint32_t)c->spmd_rank;
  }
  return member ? m : 0;
}

int dist_spmd_refused_ids(dist_client *c, uint64_t op_id, uint32_t more_ids,
                          const uint32_t *ranks, int n) {
  if (c->spmd_rank < 0 || !op_id) return c->err.code;
  uint32_t *known = calloc(DIST_MAX_MESH_RANKS, sizeof *known);
  int m = known ? daemons_waiting(c, ranks, n, known) : 0;
  dist_errbuf refusal = c->err;
  if (m >= 2) {
    Dist__V1__OpAbortRequest rq = DIST__V1__OP_ABORT_REQUEST__INIT;
    rq.op_id = op_id;
    rq.more_ids = more_ids;
    rq.n_ranks = (size_t)m;
    rq.ranks = known;
    rq.reason = refusal.msg;
    ProtobufCMessage *rp = NULL;
    /* A daemon before 0.2.5 does not know OpAbort: the others then wait as
     * they did, and the refusal is reported here either way. */
    dist_call_one(c, c->spmd_rank, "/dist.v1.Dist/OpAbort", &rq.base,
                  &dist__v1__op_abort_reply__descriptor, &rp);
    if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  }
  free(known);
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

int dist_spmd_refused_group(dist_client *c, uint64_t op_id, const int *group, int group_size) {
  int n = group ? group_size : c->n;
  if (n < 0) n = 0;
  if (n > DIST_MAX_MESH_RANKS) n = DIST_MAX_MESH_RANKS; /* the refusal names these */
  uint32_t *ranks = calloc(DIST_MAX_MESH_RANKS, sizeof *ranks);
  for (int i = 0; ranks && i < n; i++) ranks[i] = group ? (uint32_t)group[i] : (uint32_t)i;
  int rc = ranks ? dist_spmd_refused(c, op_id, ranks, n) : c->err.code;
  free(ranks);
  return rc;
}
