/* Conversions between dist.v1 messages and the in-memory mesh, placement and
 * shape types. Incoming messages are checked: the message names what is
 * wrong. Outgoing messages point into a caller-owned dist_wire_meta, which
 * must outlive the packing of the message. */
#ifndef DIST_WIRE_H
#define DIST_WIRE_H

#include "dist.pb-c.h"
#include "errbuf.h"
#include "mesh.h"
#include "tensor.h"

int dist_mesh_from_pb(const Dist__V1__Mesh *pb, dist_mesh_desc *m,
                      dist_errbuf *eb);
int dist_placements_from_pb(Dist__V1__Placement *const *pb, size_t n,
                            dist_placement *p, dist_errbuf *eb);
int dist_shape_from_pb(const uint64_t *dims, size_t n, dist_shape *s,
                       dist_errbuf *eb);
int dist_dtype_from_pb(int pb, dist_dtype *dt, dist_errbuf *eb);

/* Storage behind an outgoing Mesh / Placement list / TensorMeta. */
typedef struct dist_wire_meta {
  Dist__V1__TensorMeta meta;
  Dist__V1__Mesh mesh;
  uint32_t mesh_shape[DIST_MAX_MESH_DIMS];
  uint32_t mesh_ranks[DIST_MAX_MESH_RANKS];
  char *dim_names[DIST_MAX_MESH_DIMS];
  char dim_name_buf[DIST_MAX_MESH_DIMS][32];
  Dist__V1__Placement placements[DIST_MAX_MESH_DIMS];
  Dist__V1__Placement *placement_ptrs[DIST_MAX_MESH_DIMS];
  uint64_t global_shape[DIST_MAX_DIMS];
  uint64_t local_shape[DIST_MAX_DIMS];
  uint64_t local_offset[DIST_MAX_DIMS];
  char name[256];
} dist_wire_meta;

void dist_mesh_to_pb(const dist_mesh_desc *m, dist_wire_meta *w);
void dist_placements_to_pb(const dist_placement *p, int n, dist_wire_meta *w);
/* Fills w->meta with name, dtype, global shape, mesh and placements (and
 * leaves local fields empty). */
void dist_meta_to_pb(const char *name, dist_dtype dt, const dist_shape *global,
                     const dist_mesh_desc *m, const dist_placement *p,
                     dist_wire_meta *w);

#endif
