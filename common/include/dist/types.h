/* Value types shared by libdist's public API and the daemon: dtypes, reduce
 * types and placements. The numbering matches proto/dist/v1/dist.proto and is
 * never changed. */
#ifndef DIST_TYPES_H
#define DIST_TYPES_H

#ifdef __cplusplus
extern "C" {
#endif

#define DIST_MAX_DIMS 8       /* tensor rank limit */
#define DIST_MAX_MESH_DIMS 8  /* mesh rank limit */
#define DIST_MAX_MESH_RANKS 1024
/* Ids after the first one OpAbort takes at the most (a LocalLayer call's
 * outputs, a tape backward's plan, in chunks past it): each costs ~13
 * ABORT frames per daemon told (its steps). A daemon before 0.2.9 allowed
 * DIST_MAX_MESH_RANKS, the same. */
#define DIST_ABORT_MORE_IDS_MAX 1024

typedef enum {
  DIST_DTYPE_INVALID = 0,
  DIST_BOOL = 1,
  DIST_INT8 = 2,
  DIST_UINT8 = 3,
  DIST_INT32 = 4,
  DIST_INT64 = 5,
  DIST_FLOAT16 = 6,
  DIST_BFLOAT16 = 7,
  DIST_FLOAT32 = 8,
  DIST_FLOAT64 = 9
} dist_dtype;

/* How Partial values combine. Integers wrap in sum and prod, as NCCL's do;
 * avg of an integer dtype is exact: the sum of the k values, taken without
 * wrapping, divided by k and truncated toward zero as C divides (int32
 * avg(2e9, 2e9, 2e9) is 2e9, avg(-7, 0) is -3). A reshard averages a
 * tensor Partial(avg) on several mesh dims one mesh dim at a time,
 * truncating each time; a checkpoint rebuilt in the client averages all
 * its pieces at once, which can differ by one. */
typedef enum {
  DIST_REDUCE_SUM = 0,
  DIST_REDUCE_MAX = 1,
  DIST_REDUCE_MIN = 2,
  DIST_REDUCE_PROD = 3,
  DIST_REDUCE_AVG = 4,
  DIST_REDUCE_ANY = 5,
  DIST_REDUCE_ALL = 6
} dist_reduce;

typedef enum {
  DIST_REPLICATE = 0,
  DIST_SHARD = 1,
  DIST_PARTIAL = 2
} dist_placement_kind;

/* One placement per mesh dim, as Paddle's Shard(d) / Replicate() /
 * Partial(reduce). */
typedef struct dist_placement {
  dist_placement_kind kind;
  int dim;            /* DIST_SHARD: the tensor dim split over the mesh dim */
  dist_reduce reduce; /* DIST_PARTIAL: how the partial values combine */
} dist_placement;

#define DIST_SHARD_DIM(d) ((dist_placement){DIST_SHARD, (d), DIST_REDUCE_SUM})
#define DIST_REPLICATED ((dist_placement){DIST_REPLICATE, 0, DIST_REDUCE_SUM})
#define DIST_PARTIAL_OF(r) ((dist_placement){DIST_PARTIAL, 0, (r)})

#ifdef __cplusplus
}
#endif
#endif
