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

#endif
