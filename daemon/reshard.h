/* Converting a distributed tensor to other placements and/or another mesh
 * of the same shape (semantics.md, "Conversions between placements").
 *
 * Every rank of the source and destination meshes runs the same plan, made
 * from the metadata alone, so no coordinator is needed:
 *   1. cross-mesh: rank k of mesh A sends its piece to rank k of mesh B;
 *   2. partial mesh dims that stop being partial are all-reduced along their
 *      group (avg divides by the group size);
 *   3. the shard/replicate layout changes by one exchange in which every
 *      rank receives the part of its new box it lacks from one holder of it
 *      (itself first, so Replicate -> Shard moves no bytes; Shard ->
 *      Replicate is an all-gather; Shard(i) -> Shard(j) an all-to-all; uneven
 *      and nested shards need no padding);
 *   4. mesh dims that become Partial keep the value at coordinate 0 and the
 *      reduction's identity elsewhere (Paddle's rule; avg keeps it everywhere).
 */
#ifndef DISTD_RESHARD_H
#define DISTD_RESHARD_H

#include <stdint.h>

#include "server.h"
#include "store.h"

/* Computes the resharded tensor (named dst_name, not stored) into *out.
 * src_mesh is the source tensor's mesh; src may be NULL on a rank that is
 * only in dst_mesh. *out stays NULL on a rank only in the source mesh. */
int distd_reshard(distd_server *s, distd_tensor *src,
                  const dist_mesh_desc *src_mesh,
                  const dist_mesh_desc *dst_mesh, const dist_placement *dst_p,
                  const char *dst_name, uint64_t op_id, int64_t deadline_ms,
                  distd_tensor **out, dist_errbuf *eb);

/* The ranks a reshard runs on, the same list on every one of them: the
 * destination mesh's, then the source mesh's not in it. ranks has room for
 * both meshes' ranks; returns how many. */
int distd_reshard_ranks(const dist_mesh_desc *src_mesh, const dist_mesh_desc *dst_mesh,
                        int *ranks);

/* Tells ranks[0..n) that this rank's part of the reshard under op_id (of
 * a tensor on a mesh of ndim dims) will not come, so that none of them
 * waits for it in any of the reshard's exchanges (why is the reason they
 * report). */
void distd_reshard_abort(distd_server *s, uint64_t op_id, int ndim, const int *ranks, int n,
                         const char *why);

#endif
