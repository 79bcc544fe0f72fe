/* A tensor description as a client sends it, checked against the cluster. */
#ifndef DISTD_TENSOR_META_H
#define DISTD_TENSOR_META_H

#include "server.h"
#include "store.h"
#include "wire.h"

typedef struct distd_meta {
  char name[DISTD_NAME_MAX];
  dist_dtype dtype;
  dist_shape global;
  dist_shape local; /* only when the client derives the global shape */
  dist_mesh_desc mesh;
  dist_placement placements[DIST_MAX_MESH_DIMS];
} distd_meta;

/* Parses and checks name, dtype, mesh (every rank in the cluster) and
 * placements count; shard dims are checked by the caller once the tensor's
 * rank is known. */
int distd_meta_parse(distd_server *s, const Dist__V1__TensorMeta *pb,
                     distd_meta *m, dist_errbuf *eb);
/* Every rank of m is a daemon of this cluster. */
int distd_mesh_check_world(distd_server *s, const dist_mesh_desc *m,
                           dist_errbuf *eb);
/* Describes a stored tensor (with this rank's piece) into w->meta. */
void distd_meta_describe(const distd_tensor *t, int rank, dist_wire_meta *w);

/* Room for a reply's descriptions of n tensors, taken before the step
 * that commits what they describe (the daemons' vote, a checkpoint's
 * file): describing them after allocates nothing, so a daemon cannot fail
 * there once the others applied the op, or once its file is written. */
typedef struct distd_descriptions {
  size_t n;
  Dist__V1__TensorMeta **metas;
  dist_wire_meta *w;
} distd_descriptions;

/* 0, or -1 without memory (the room then empty: free to free). */
int distd_descriptions_take(distd_descriptions *d, size_t n);
/* Describes t[0..n) (no more than the room's n; a NULL entry gets an
 * empty description) with this rank's pieces; returns the room's metas. */
Dist__V1__TensorMeta **distd_describe_into(distd_descriptions *d, distd_tensor *const *t,
                                           size_t n, int rank);
/* A room never taken ({0}) or taken: both may be freed. */
void distd_descriptions_free(distd_descriptions *d);

#endif
