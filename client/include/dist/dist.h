/* libdist: the client library of distd.
 *
 * A dist_client talks to one daemon or to a whole cluster over gRPC. Every
 * call returns 0 or a negative dist_err code (dist/error.h); the client
 * keeps the detail, read with dist_errmsg(). Every call has a deadline
 * (dist_opts.timeout_ms). The library never prints.
 *
 * Two ways to drive a cluster, over the same daemon-side operations:
 *  - single client: connected to every daemon (dist_connect_cluster), one
 *    program sends each daemon its part concurrently;
 *  - SPMD: each trainer process (dist_init_from_env, as started by
 *    `distctl launch`) talks to its own daemon; the daemons match a
 *    collective by its op id, which trainers derive identically by counting
 *    the collectives they issue. */
#ifndef DIST_DIST_H
#define DIST_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "dist/error.h"
#include "dist/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dist_client dist_client;
typedef struct dist_mesh dist_mesh;
typedef struct dist_tensor dist_tensor;

typedef struct dist_opts {
  int64_t timeout_ms;   /* deadline of every call; default 30 s */
  uint64_t op_id_base;  /* first op id; 0 = derived (see dist_init_from_env) */
} dist_opts;
#define DIST_OPTS_INIT {30000, 0}

/* The embedded default endpoint of a lone daemon. */
#define DIST_DEFAULT_ENDPOINT "127.0.0.1:7470"

/* Connects to one daemon at endpoint ("host:port"; NULL = the default). The
 * connection is made lazily; an unreachable daemon shows at the first call.
 * opts may be NULL. On failure *out is NULL and the return says why. */
int dist_connect(const char *endpoint, const dist_opts *opts, dist_client **out);
/* Connects to every daemon of a cluster file (rank order). path NULL means
 * $DIST_CLUSTER. */
int dist_connect_cluster(const char *path, const dist_opts *opts,
                         dist_client **out);
/* For trainers started by `distctl launch`: reads DIST_RANK,
 * DIST_WORLD_SIZE and DIST_CLUSTER, connects to the cluster and makes this
 * process SPMD rank DIST_RANK. */
int dist_init_from_env(dist_client **out);
/* Closes the connections. NULL is a no-op. */
void dist_close(dist_client *c);

/* The last error's message and code on c ("" and 0 when none). */
const char *dist_errmsg(const dist_client *c);
int dist_errcode(const dist_client *c);
/* Message for failures before a client exists (connect). */
const char *dist_last_connect_error(void);

/* Number of daemons the client knows; this trainer's rank in SPMD mode, or
 * -1 for a single client. */
int dist_world_size(const dist_client *c);
int dist_rank(const dist_client *c);
/* The gRPC endpoint of daemon `rank`. */
const char *dist_endpoint(const dist_client *c, int rank);

/* ---------------------------------------------------------------- status */

typedef struct dist_peer_info {
  int rank;
  char address[256];
  int connected;
  uint64_t bytes_sent, bytes_received;
  double rtt_seconds;
  uint32_t reconnects;
} dist_peer_info;

typedef struct dist_daemon_info {
  char version[32];
  char cluster_id[64];
  char grpc_address[256];
  char http_address[256];
  int rank, world_size;
  double uptime_seconds;
  uint64_t tensor_bytes, tensor_bytes_limit;
  uint32_t tensor_count, ops_in_flight;
  int npeers;
  dist_peer_info *peers; /* owned by the info; freed by dist_info_free */
} dist_daemon_info;

/* Asks daemon `rank` (0 for a single-daemon client). */
int dist_info(dist_client *c, int rank, dist_daemon_info *out);
void dist_info_free(dist_daemon_info *info);
/* grpc.health.v1 Check of daemon `rank`: 0 when SERVING. */
int dist_health(dist_client *c, int rank);

/* ---------------------------------------------------------------- meshes */

/* A ProcessMesh: shape, ranks in row-major order, optional dim names. */
int dist_mesh_new(int ndim, const int *shape, const int *ranks,
                  const char *const *dim_names, dist_mesh **out);
/* "[[0,1],[2,3]]" with names "dp,mp" (NULL for d0, d1, ...). */
int dist_mesh_from_string(const char *text, const char *dim_names,
                          dist_mesh **out);
void dist_mesh_free(dist_mesh *m);
int dist_mesh_ndim(const dist_mesh *m);
int dist_mesh_dim_size(const dist_mesh *m, int dim);
int dist_mesh_size(const dist_mesh *m);
int dist_mesh_rank_at(const dist_mesh *m, int index);
/* Paddle get_mesh_with_dim(name, index): the sub-mesh at `index` of dim. */
int dist_mesh_get_submesh(const dist_mesh *m, const char *dim_name, int index,
                          dist_mesh **out);
/* Writes "[[0, 1], [2, 3]]". */
void dist_mesh_to_string(const dist_mesh *m, char *buf, size_t len);

/* "Shard(0),Replicate(),Partial(sum)" -> placements; returns the count or a
 * negative error. */
int dist_parse_placements(const char *text, dist_placement *out, int max);
void dist_placements_format(const dist_placement *p, int n, char *buf,
                            size_t len);

/* ---------------------------------------------------------------- tensors */

/* shard_tensor: the client holds the whole tensor (row-major, shape[ndim]);
 * each daemon of the mesh receives only its piece. */
int dist_shard_tensor(dist_client *c, const char *name, const void *data,
                      dist_dtype dt, int ndim, const int64_t *shape,
                      const dist_mesh *mesh, const dist_placement *placements,
                      dist_tensor **out);

/* dtensor_from_local. SPMD: this trainer's piece goes to its own daemon.
 * Single client: pieces[i] / shapes[i] are the pieces of the mesh's ranks in
 * mesh order (ndim dims each). The daemons derive and check the global
 * shape. */
int dist_dtensor_from_local(dist_client *c, const char *name,
                            const void *const *pieces, dist_dtype dt, int ndim,
                            const int64_t *const *shapes,
                            const dist_mesh *mesh,
                            const dist_placement *placements,
                            dist_tensor **out);

/* dtensor_to_local: the piece of `rank` (SPMD: -1 = this trainer's rank).
 * *data is malloc'd (free()); shape gets ndim entries. */
int dist_dtensor_to_local(dist_client *c, const dist_tensor *t, int rank,
                          void **data, size_t *nbytes, int64_t *shape);
/* full_tensor: the logical value (partials reduced, shards gathered). */
int dist_full_tensor(dist_client *c, const dist_tensor *t, void **data,
                     size_t *nbytes);
/* Converts t in place to new placements, and to another mesh of the same
 * shape when mesh is not NULL. */
int dist_reshard(dist_client *c, dist_tensor *t, const dist_mesh *mesh,
                 const dist_placement *placements);
/* A handle to an existing tensor, by name (asks the daemons). */
int dist_tensor_open(dist_client *c, const char *name, dist_tensor **out);
/* Deletes the tensor in the daemons; the handle stays valid to free. */
int dist_tensor_delete(dist_client *c, const char *name);
void dist_tensor_free(dist_tensor *t);

const char *dist_tensor_name(const dist_tensor *t);
dist_dtype dist_tensor_dtype(const dist_tensor *t);
int dist_tensor_ndim(const dist_tensor *t);
const int64_t *dist_tensor_shape(const dist_tensor *t);
const dist_mesh *dist_tensor_mesh(const dist_tensor *t);
const dist_placement *dist_tensor_placements(const dist_tensor *t);

/* ---------------------------------------------------------------- SPMD collectives */

/* In place over the ranks of group (NULL = every rank), for SPMD trainers:
 * each trainer passes its own buffer. */
int dist_all_reduce(dist_client *c, void *buf, size_t count, dist_dtype dt,
                    dist_reduce op, const int *group, int group_size);
/* Gathers count elements from every member into out (group_size * count). */
int dist_all_gather(dist_client *c, const void *in, size_t count, void *out,
                    dist_dtype dt, const int *group, int group_size);
int dist_broadcast(dist_client *c, void *buf, size_t count, dist_dtype dt,
                   int root, const int *group, int group_size);
int dist_barrier(dist_client *c);

/* ---------------------------------------------------------------- helpers */

size_t dist_dtype_size(dist_dtype dt);
const char *dist_dtype_name(dist_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
