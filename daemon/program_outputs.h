/* Local values made distributed tensors, as dtensor_from_local makes
 * them: the outputs of a LocalLayer invocation, and the input gradients
 * its backward stores (see the service comment in
 * proto/dist/v1/program.proto). */
#ifndef DISTD_PROGRAM_OUTPUTS_H
#define DISTD_PROGRAM_OUTPUTS_H

#include <stdint.h>

#include "dist.pb-c.h"
#include "program.h"
#include "server.h"
#include "store.h"
#include "tensor_meta.h"

/* A value's mesh and placements, parsed and checked. */
typedef struct distd_attr {
  dist_mesh_desc mesh;
  dist_placement placements[DIST_MAX_MESH_DIMS];
} distd_attr;

/* Parses a mesh of the world that this rank is part of, and placements
 * for it. */
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

/* A new tensor `name` of global shape `global` laid out as a, whose piece
 * on this rank is exactly v; not stored. Without replace a tensor stored
 * as `name` is refused. *version rises to the version `name` has here. */
int distd_value_tensor(distd_server *s, const char *name, const distd_tval *v,
                       const dist_shape *global, const distd_attr *a, int replace,
                       distd_tensor **out, uint64_t *version, dist_errbuf *eb);


/* Tensors made from local values (an invocation's outputs, a backward's
 * input gradients), stored together once every daemon invoked could make
 * its own (the daemons vote, vote.h). */
typedef struct distd_made {
  size_t n;
  distd_tensor **tensors;       /* NULL where nothing is stored */
  dist_wire_meta *w;            /* the reply's descriptions */
  Dist__V1__TensorMeta **metas;
  uint64_t version;             /* the highest the names have (vote.h) */
} distd_made;

int distd_made_init(distd_made *m, size_t n, dist_errbuf *eb);
/* Cannot fail: stores every tensor made, each at the version after the
 * highest any daemon had, so that the pieces of each agree. */
void distd_made_store(distd_server *s, distd_made *m);
void distd_made_free(distd_made *m);

/* The daemons a request names to vote on storing what it makes (its
 * `ranks`), when this daemon is one of them, each is a rank of the world
 * and none is named twice; else 0: no vote (a client before 0.2.1 sends
 * none). */
int distd_vote_ranks(const distd_server *s, const uint32_t *named, size_t n, int *ranks);

#endif
