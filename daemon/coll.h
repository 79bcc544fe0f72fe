/* Collectives over a group of ranks, on the peer data plane. A group is an
 * ordered list of global ranks (a mesh dim's ranks); every member calls the
 * same collective with the same op id. Buffers are contiguous; counts are in
 * elements. On failure every member that can be told is told (ABORT), and
 * the message names the peer. */
#ifndef DISTD_COLL_H
#define DISTD_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "dist/types.h"
#include "errbuf.h"
#include "peer.h"

typedef struct distd_coll {
  distd_peers *peers;
  uint64_t op_id;
  const int *group; /* global ranks, in group order */
  int size;         /* group size */
  int me;           /* this rank's index in group */
  int64_t deadline_ms;
  /* What `distctl ops` and the collective metrics call it, when it is a
   * step of something else (a "vote"); NULL: the collective's own name. */
  const char *kind;
  /* What the members must agree on beyond byte counts, carried by every
   * frame of the collective (distd_xfer_sign, op_signature.h); 0: nothing
   * more. */
  uint64_t signature;
} distd_coll;

/* Fills c for this daemon; fails when this rank is not in group or a rank is
 * out of the world. */
int distd_coll_init(distd_coll *c, distd_peers *peers, uint64_t op_id,
                    const int *group, int size, int64_t deadline_ms,
                    dist_errbuf *eb);

/* DIST_EINVAL unless op is a reduce op; else 0. A request is checked
 * before its exchange, so that its refusal can be told to the group. */
int distd_check_reduce(dist_reduce op, dist_errbuf *eb);

/* In place: buf (count elements) becomes the reduction over the group.
 * AVG divides by the group size. */
int distd_allreduce(const distd_coll *c, void *buf, size_t count,
                    dist_dtype dt, dist_reduce op, dist_errbuf *eb);
/* out = concatenation of every member's in; counts[i] = elements from member
 * i (uneven allowed, 0 allowed). */
int distd_allgather(const distd_coll *c, const void *in, void *out,
                    const size_t *counts, dist_dtype dt, dist_errbuf *eb);
/* in is the concatenation of size blocks (counts[i] elements each); member i
 * ends with the reduction of every member's block i in out. */
int distd_reduce_scatter(const distd_coll *c, const void *in, void *out,
                         const size_t *counts, dist_dtype dt, dist_reduce op,
                         dist_errbuf *eb);
/* send: blocks of send_counts[i] elements for member i, in order; recv:
 * blocks of recv_counts[i] elements from member i, in order. */
int distd_alltoallv(const distd_coll *c, const void *send,
                    const size_t *send_counts, void *recv,
                    const size_t *recv_counts, dist_dtype dt,
                    dist_errbuf *eb);
/* buf of count elements is copied from member root to every member. */
int distd_broadcast(const distd_coll *c, void *buf, size_t count,
                    dist_dtype dt, int root, dist_errbuf *eb);
int distd_barrier(const distd_coll *c, dist_errbuf *eb);
/* Point to point between two global ranks (no group needed). The frame
 * is signed with dt (op_signature.h): a receive whose dt differs from
 * the send's fails with DIST_EMISMATCH naming both ranks and dtypes. The
 * send may have succeeded by then (its bytes were written). */
int distd_send_to(distd_peers *p, uint64_t op_id, int dst, const void *buf,
                  size_t bytes, dist_dtype dt, int64_t deadline_ms, dist_errbuf *eb);
int distd_recv_from(distd_peers *p, uint64_t op_id, int src, void *buf,
                    size_t bytes, dist_dtype dt, int64_t deadline_ms, dist_errbuf *eb);

#endif
