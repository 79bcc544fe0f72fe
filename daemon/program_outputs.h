/* Local values made distributed tensors, as dtensor_from_local makes
 * them: the outputs of a LocalLayer invocation, and the input gradients
 * its backward stores (see the service comment in
 * proto/dist/v1/program.proto). */
#ifndef DISTD_PROGRAM_OUTPUTS_H
#define DISTD_PROGRAM_OUTPUTS_H

#include <stdint.h>

#include "dist.pb-c.h"
#include "program.h"
#include "program_values.h"
#include "server.h"
#include "store.h"
#include "tensor_meta.h"

/* A value's mesh and placements, parsed and checked. */
typedef struct distd_attr {
  dist_mesh_desc mesh;
  dist_placement placements[DIST_MAX_MESH_DIMS];
} distd_attr;

/* Parses a mesh of the world and placements for it. This rank need not
 * be in the mesh: a LocalLayer's outputs may lie on different meshes
 * (svc_program.c). */
int distd_attr_parse(distd_server *s, const Dist__V1__Mesh *mesh,
                     Dist__V1__Placement *const *pl, size_t npl, distd_attr *a,
                     dist_errbuf *eb);

/* The global shape of a value laid out as a: its local shape, unless a
 * shards it over more than one rank; then the daemons of a's mesh exchange
 * their local shapes and verdicts under op_id and check the pieces against
 * the split rule. verdict is this rank's so far (v may then be NULL): it
 * still takes part, so that the others learn it instead of waiting. */
int distd_value_global(distd_server *s, int64_t deadline_ms, const distd_attr *a,
                       uint64_t op_id, int verdict, const distd_tval *v, dist_shape *global,
                       dist_errbuf *eb);

/* Makes b->tensors[k], a new tensor `name` of global shape `global` laid
 * out as a, whose piece on this rank is exactly v; not stored. b->version
 * rises to the version of a tensor stored as `name`, which is refused
 * without replace. */
int distd_value_tensor(distd_server *s, const char *name, const distd_tval *v,
                       const dist_shape *global, const distd_attr *a, int replace,
                       distd_staged *b, size_t k, dist_errbuf *eb);

/* The memory of a reply describing n staged tensors and carrying
 * n_values values, taken before the daemons vote (distd_descriptions):
 * once they all said yes the reply is made without allocating
 * (dist_pb_to_bb aborts rather than fail). */
typedef struct distd_reply_room {
  distd_descriptions d;
  distd_value_set values;
} distd_reply_room;

/* 0, or DIST_ENOMEM saying what the reply is of (`what`), the room empty. */
int distd_reply_room_take(distd_reply_room *r, size_t n, size_t n_values, const char *what,
                          dist_errbuf *eb);
/* A room never taken ({0}) or taken: both may be freed. */
void distd_reply_room_free(distd_reply_room *r);

#endif
