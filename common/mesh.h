/* ProcessMesh and placements: which piece of a global tensor each rank holds.
 * Uneven dims follow the ceil(N/k) rule: 10 over 4 -> 3,3,3,1; 13 over 6 ->
 * 3,3,3,3,1,0. Several mesh dims may shard the same tensor dim: they split it
 * in mesh-dim order (nested). */
#ifndef DIST_MESH_H
#define DIST_MESH_H

#include <stdint.h>

#include "dist/types.h"
#include "errbuf.h"
#include "tensor.h"

typedef struct dist_mesh_desc {
  int ndim;
  int shape[DIST_MAX_MESH_DIMS];
  int nranks; /* product of shape */
  int ranks[DIST_MAX_MESH_RANKS];
  char dim_names[DIST_MAX_MESH_DIMS][32];
} dist_mesh_desc;

/* Builds a mesh; dim_names may be NULL (names "d0", "d1", ...). Fails with a
 * message for a bad shape, a repeated rank or too many ranks. */
int dist_mesh_init(dist_mesh_desc *m, int ndim, const int *shape,
                   const int *ranks, const char *const *dim_names,
                   dist_errbuf *eb);
/* The one-rank mesh [rank]: where a result that stays on the daemon that
 * made it lives (an exchange's output, an expert's activations). */
int dist_mesh_of_rank(dist_mesh_desc *m, int rank, dist_errbuf *eb);
/* Parses "[0,1]" or "[[0,1],[2,3]]" (nested lists give the shape), and
 * "dp,mp" style names (NULL for defaults). */
int dist_mesh_parse(dist_mesh_desc *m, const char *text, const char *names,
                    dist_errbuf *eb);
/* "[[0, 1], [2, 3]]" */
void dist_mesh_format(const dist_mesh_desc *m, char *buf, size_t len);
int dist_mesh_equal(const dist_mesh_desc *a, const dist_mesh_desc *b);
int dist_mesh_same_shape(const dist_mesh_desc *a, const dist_mesh_desc *b);
/* Index of rank in m->ranks, or -1. */
int dist_mesh_index_of(const dist_mesh_desc *m, int rank);
/* Appends to ranks[0..n) those of m's ranks it lacks, in m's order, while
 * it has fewer than max; returns the new count. Called mesh after mesh, it
 * makes their union in order of first mention, the same list on every
 * daemon that makes it from the same meshes. */
int dist_ranks_union_add(int *ranks, int n, int max, const dist_mesh_desc *m);
/* Coordinates of the rank at flat index idx. */
void dist_mesh_coords(const dist_mesh_desc *m, int idx, int *coords);
/* The ranks sharing every coordinate of `rank` except along mesh dim `dim`,
 * in order: the group a collective over that mesh dim runs on. Returns the
 * group size, or -1 when rank is not in the mesh. */
int dist_mesh_group(const dist_mesh_desc *m, int rank, int dim, int *group);
/* The ranks sharing rank's coordinates on every dim not in dims_mask (bit d
 * for mesh dim d): the group of a reduction over several dims at once, in
 * row-major order of their coordinates. Returns its size, -1 if rank is
 * not in m. */
int dist_mesh_group_dims(const dist_mesh_desc *m, int rank, unsigned dims_mask,
                         int *group);
/* Sub-mesh by dim name and index (Paddle get_mesh_with_dim): the mesh with
 * dimension `name` fixed at `index`, which drops that dim. */
int dist_mesh_submesh(const dist_mesh_desc *m, const char *name, int index,
                      dist_mesh_desc *out, dist_errbuf *eb);

/* ceil(N/k) split: size and start of chunk i of n over k. */
int64_t dist_split_size(int64_t n, int k, int i);
int64_t dist_split_start(int64_t n, int k, int i);

/* Checks placements against a mesh and tensor rank: count equals mesh ndim,
 * shard dims in range. The message names what is wrong. */
int dist_placements_check(const dist_mesh_desc *m, const dist_placement *p,
                          int np, int tensor_ndim, dist_errbuf *eb);
/* The first mesh dim placed Partial, or -1 when none is. */
int dist_placements_partial_dim(const dist_placement *p, int np);
/* Parses "Shard(0),Replicate(),Partial(sum)" (also "Partial()" = sum). */
int dist_placements_parse(const char *text, dist_placement *p, int max,
                          int *np, dist_errbuf *eb);
/* "[Shard(0), Replicate()]" into buf (len > 0); p holds np entries.
 * libdist's public dist_placements_format checks its arguments first. */
void dist_placements_text(const dist_placement *p, int np, char *buf,
                          size_t len);
const char *dist_reduce_name(dist_reduce r);
int dist_reduce_parse(const char *name, dist_reduce *out);

/* The box of the global tensor that the rank at mesh coords holds: local
 * shape and offset (nested shards applied in mesh-dim order). */
void dist_local_box(const dist_mesh_desc *m, const dist_placement *p,
                    const dist_shape *global, const int *coords,
                    dist_shape *local, int64_t *offset);

/* dtensor_from_local, given every rank's local piece (pieces[i] is that of
 * m->ranks[i]): the global shape they make. A tensor dim that mesh dims
 * shard is the sum of the pieces of the ranks at coordinate 0 on every
 * other mesh dim; any other dim is the first piece's. */
void dist_global_of_pieces(const dist_mesh_desc *m, const dist_placement *p,
                           const dist_shape *pieces, dist_shape *global);
/* The mesh index of the first piece that is not the box the split rule
 * gives its rank under `global` (*want is then that box), or -1 when every
 * piece fits. */
int dist_first_misfit(const dist_mesh_desc *m, const dist_placement *p,
                      const dist_shape *global, const dist_shape *pieces,
                      dist_shape *want);

#endif
