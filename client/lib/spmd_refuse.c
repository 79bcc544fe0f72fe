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

/* OpAbort of op_id and the more_ids ids after it, on the daemons of
 * ranks[0..n), asked of this trainer's daemon; c->err is kept. How many
 * ids were aborted with their steps: 1 + more_ids, or 0 from a daemon
 * before 0.2.9 (op_id's steps and the bare ids) or when the call failed;
 * 1 + more_ids too when nobody waits, as nothing is left to abort. */
static uint32_t op_abort(dist_client *c, uint64_t op_id, uint32_t more_ids,
                         const uint32_t *ranks, int n) {
  if (c->spmd_rank < 0 || !op_id) return 1 + more_ids;
  uint32_t *known = calloc(DIST_MAX_MESH_RANKS, sizeof *known);
  int m = known ? daemons_waiting(c, ranks, n, known) : 0;
  dist_errbuf refusal = c->err;
  uint32_t aborted = known ? 1 + more_ids : 0;
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
    aborted = rp ? ((Dist__V1__OpAbortReply *)rp)->aborted_ids : 0;
    if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  }
  free(known);
  c->err = refusal;
  return aborted;
}

int dist_spmd_refused_ids(dist_client *c, uint64_t op_id, uint32_t more_ids,
                          const uint32_t *ranks, int n) {
  op_abort(c, op_id, more_ids, ranks, n);
  return c->err.code;
}

/* The ids first..last, newest first: one OpAbort per DIST_ABORT_MORE_IDS_MAX
 * + 1 of them. The newest goes alone first, to learn whether the daemon
 * aborts more_ids with their steps (since 0.2.9); an older one is asked
 * once per id, as before, which its ring of the last few hundred aborted
 * exchanges keeps for the first ids only. */
static void abort_range(dist_client *c, uint64_t first, uint64_t last, const uint32_t *ranks,
                        int n) {
  if (op_abort(c, last, 0, ranks, n) == 0) {
    for (uint64_t id = last; id-- > first;) op_abort(c, id, 0, ranks, n);
    return;
  }
  for (uint64_t hi = last; hi > first;) { /* first..hi-1 are left */
    uint64_t lo = hi - first > DIST_ABORT_MORE_IDS_MAX + 1 ? hi - DIST_ABORT_MORE_IDS_MAX - 1
                                                           : first;
    op_abort(c, lo, (uint32_t)(hi - 1 - lo), ranks, n);
    hi = lo;
  }
}

int dist_spmd_refused(dist_client *c, uint64_t op_id, const uint32_t *ranks, int n) {
  return dist_spmd_refused_ids(c, op_id, 0, ranks, n);
}

int dist_spmd_refused_on(dist_client *c, uint64_t op_id, const dist_mesh_desc *m) {
  uint32_t ranks[DIST_MAX_MESH_RANKS];
  for (int i = 0; i < m->nranks; i++) ranks[i] = (uint32_t)m->ranks[i];
  return dist_spmd_refused(c, op_id, ranks, m->nranks);
}

/* The ranks of group[0..group_size) (every rank when group is NULL; the
 * first DIST_MAX_MESH_RANKS of a longer one), into a new array: NULL when
 * out of memory. */
static uint32_t *group_ranks(const dist_client *c, const int *group, int group_size, int *n) {
  *n = group ? group_size : c->n;
  if (*n < 0) *n = 0;
  if (*n > DIST_MAX_MESH_RANKS) *n = DIST_MAX_MESH_RANKS; /* the refusal names these */
  uint32_t *ranks = calloc(DIST_MAX_MESH_RANKS, sizeof *ranks);
  for (int i = 0; ranks && i < *n; i++) ranks[i] = group ? (uint32_t)group[i] : (uint32_t)i;
  return ranks;
}

int dist_spmd_refused_group(dist_client *c, uint64_t op_id, const int *group, int group_size) {
  int n;
  uint32_t *ranks = group_ranks(c, group, group_size, &n);
  int rc = ranks ? dist_spmd_refused(c, op_id, ranks, n) : c->err.code;
  free(ranks);
  return rc;
}

int dist_spmd_refused_range(dist_client *c, uint64_t first, uint64_t last) {
  if (c->spmd_rank < 0 || first > last) return c->err.code;
  int n;
  uint32_t *ranks = group_ranks(c, NULL, 0, &n);
  if (ranks) abort_range(c, first, last, ranks, n);
  free(ranks);
  return c->err.code;
}
