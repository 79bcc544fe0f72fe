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
 *    the collectives they issue. So every trainer of the job calls every
 *    operation that spans daemons, in the same order, also one whose
 *    mesh or group it is not in: it takes the op id as the others do and,
 *    as a Paddle rank outside a process mesh or group, gets a no-op
 *    success with nothing sent to or stored on any daemon for it: a
 *    tensor handle describing the whole (global shape, dtype, mesh,
 *    placements) with an empty local piece, collectives' buffers left as
 *    they were. Bad arguments are refused to it as to the members. (A
 *    shard_tensor onto a one-rank mesh takes no op id on any trainer: a
 *    trainer may put values of its own alone.)
 *    A trainer that refuses an operation, or whose daemon does before
 *    its part, has the others fail at once naming its rank and why.
 *
 * libdist reads checkpoint manifests with jansson, and on its first read
 * puts a counter of failed allocations in front of the allocator jansson
 * has then (json_set_alloc_funcs), for the whole process: it passes every
 * call on. A program that sets jansson's allocator should do so before
 * its first libdist call, as jansson asks of any use; wrapping the one it
 * finds later is fine. libdist.so is never unloaded (-z nodelete). */
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
  /* Security (docs/security.md). NULL means the environment's value:
   * DIST_TLS_CA, DIST_TLS_CERT, DIST_TLS_KEY, DIST_TOKEN, DIST_TLS_CRL. */
  const char *tls_ca;   /* PEM CA path: connect with TLS, verify the daemon */
  const char *tls_cert; /* PEM client certificate path, for mutual TLS */
  const char *tls_key;  /* its private key */
  const char *token;    /* bearer token sent with every call */
  /* PEM CRLs of the CA (and of any intermediate CA): a daemon whose
   * certificate one of them revokes is refused (needs tls_ca) */
  const char *tls_crl;
} dist_opts;
#define DIST_OPTS_INIT {30000, 0, NULL, NULL, NULL, NULL, NULL}

/* The embedded default endpoint of a lone daemon. */
#define DIST_DEFAULT_ENDPOINT "127.0.0.1:7470"

/* Connects to one daemon at endpoint ("host:port"; NULL = the default). The
 * connection is made lazily; an unreachable daemon shows at the first call.
 * Errors of its calls name the daemon by address ("distd at HOST:PORT:
 * ..."), where a cluster's client says "rank R (HOST:PORT): ...". Its
 * meshes and the calls that take a piece's rank (dist_dtensor_to_local,
 * dist_param_push_local) address the daemon by its own rank
 * (dist_daemon_rank, asked at the first need; 0 when it does not answer),
 * and a mesh naming another rank is refused; the inspection calls
 * (dist_info, dist_health, dist_ops, ...) take its position, 0. Where
 * libdist names its rank (a parameter report, a checkpoint's refusal), it
 * is the daemon's own. opts may be NULL. On failure *out is NULL and the
 * return says why. */
int dist_connect(const char *endpoint, const dist_opts *opts, dist_client **out);
/* Connects to every daemon of a cluster file (rank order). path NULL means
 * $DIST_CLUSTER. */
int dist_connect_cluster(const char *path, const dist_opts *opts,
                         dist_client **out);
/* For trainers started by `distctl launch`: reads DIST_RANK,
 * DIST_WORLD_SIZE and DIST_CLUSTER, connects to the cluster and makes this
 * process SPMD rank DIST_RANK. */
int dist_init_from_env(dist_client **out);
/* Closes the connections, after undoing what failed LocalLayer calls and
 * backwards left on daemons that did not answer them
 * (dist_local_layer_call, dist_backward): one
 * deadline per such daemon that still does not answer. NULL is a no-op.
 *
 * A client is for one thread at a time: its last error, its op ids and
 * what it has to undo are its own, unsynchronized. Threads each connect a
 * client of their own, as SPMD trainers have one per process. */
void dist_close(dist_client *c);

/* Memory. From the first client on, libdist keeps freed heap memory in the
 * process for reuse (glibc's mallopt: M_MMAP_MAX 0, M_TRIM_THRESHOLD at
 * its maximum), and gives it back (malloc_trim) when the last client
 * closes. Tensors travel in messages of tens of MiB, whose blocks, gRPC's
 * receive slices among them, were otherwise fresh pages at every call,
 * and a fresh page faults at 13-14 us on these VMs: a trainer's W=2
 * all-to-all of 16 MiB per pair went from 224 to 49 ms end to end. The
 * setting is process-wide: DIST_KEEP_HEAP=0 in the environment leaves
 * malloc as it is. */

/* The last error's message and code on c ("" and 0 when none). Every call
 * taking a client refuses a NULL one with DIST_EINVAL; dist_errmsg(NULL)
 * then says which call ("dist_info: c is NULL"), for the
 * last such call of this thread. The calls that take no client (the mesh,
 * tensor, program, invocation and layer accessors and builders) keep their
 * failures there too: a NULL handle fails with the call's error value
 * (DIST_EINVAL, -1 or NULL, as each says) and "dist_mesh_ndim: m is
 * NULL". */
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
/* The rank of the daemon at `rank` (0 .. dist_world_size - 1), the calls'
 * way of addressing it: `rank` itself for a client of a cluster file; for
 * a client of one endpoint, the rank its daemon says it has, asked of it
 * (Info, within a second) at the first need and kept; any dist_info of it
 * tells it too. -1 when it did not answer (asked again next time; the
 * client's error is left as it was), or without asking within a second
 * of a call to it that went unanswered (it could not be reached, or the
 * deadline passed), or when rank is out of range. */
int dist_daemon_rank(dist_client *c, int rank);

/* ---------------------------------------------------------------- status */

typedef struct dist_peer_info {
  int rank;
  char address[256];
  int connected;
  uint64_t bytes_sent, bytes_received;
  double rtt_seconds;
  uint32_t reconnects;
  char congestion[16]; /* TCP congestion control of the connection */
} dist_peer_info;

typedef struct dist_daemon_info {
  char version[32];
  char cluster_id[64];
  char grpc_address[256];
  char http_address[256];
  /* How the daemon's waiting workers move data-plane bytes: "io_uring",
   * "system calls (why)" or "tls (the loop thread)". */
  char peer_io[128];
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

/* ---------------------------------------------------------------- inspection */

#define DIST_OP_GROUP_MAX 64

typedef enum {
  DIST_OP_RUNNING = 0,
  DIST_OP_DONE = 1,
  DIST_OP_FAILED = 2,
} dist_op_state;

/* One collective, reshard or MoE exchange as one daemon sees it. */
typedef struct dist_op_info {
  uint64_t serial;      /* the daemon's number for it */
  uint64_t op_id;       /* shared by every member of the group */
  char kind[32];        /* "all_reduce", "reshard", "global_scatter" ... */
  int group_size, ngroup;
  int group[DIST_OP_GROUP_MAX]; /* the first ngroup members */
  uint64_t bytes;       /* this rank's input bytes */
  double age_seconds;   /* since it started on that daemon */
  double duration_seconds; /* finished ones */
  dist_op_state state;
  char error[200];      /* failed ones: why */
  int nwaiting;         /* running ones: ranks still waited on */
  int waiting_on[DIST_OP_GROUP_MAX];
} dist_op_info;

typedef struct dist_ops_report {
  int rank;
  int n_in_flight, n_recent;
  dist_op_info *ops; /* in flight (oldest first), then recent (newest first) */
} dist_ops_report;

/* The operations daemon `rank` runs and up to `recent` finished ones (0:
 * all it keeps, at most 256). Free with dist_ops_report_free. */
int dist_ops(dist_client *c, int rank, int recent, dist_ops_report *out);
void dist_ops_report_free(dist_ops_report *r); /* NULL is a no-op */

typedef struct dist_expert_info {
  int expert_id;        /* rank position in the group * experts per rank + local index */
  uint64_t steps;       /* global_scatter steps that routed to it */
  uint64_t tokens_total, tokens_recent, tokens_last;
} dist_expert_info;

typedef struct dist_experts_report {
  int rank;
  int window_steps;     /* steps tokens_recent covers */
  int n;
  dist_expert_info *experts; /* by ascending id */
} dist_experts_report;

/* The experts daemon `rank` hosts and the tokens routed to each. Free with
 * dist_experts_report_free. */
int dist_experts(dist_client *c, int rank, dist_experts_report *out);
void dist_experts_report_free(dist_experts_report *r); /* NULL is a no-op */

/* ---------------------------------------------------------------- meshes */

/* A ProcessMesh: shape (1 to DIST_MAX_MESH_DIMS dims), ranks in row-major
 * order, optional dim names. */
int dist_mesh_new(int ndim, const int *shape, const int *ranks,
                  const char *const *dim_names, dist_mesh **out);
/* "[[0,1],[2,3]]" with names "dp,mp" (NULL for d0, d1, ...). */
int dist_mesh_from_string(const char *text, const char *dim_names,
                          dist_mesh **out);
/* Why the last mesh constructor (dist_mesh_new, dist_mesh_from_string,
 * dist_mesh_get_submesh) or dist_parse_placements that failed on this
 * thread failed. A NULL pointer argument fails with DIST_EINVAL naming it. */
const char *dist_last_mesh_error(void);
void dist_mesh_free(dist_mesh *m);
/* The accessors return -1 (dist_mesh_dim_name NULL, dist_mesh_to_string
 * "") for a NULL mesh, naming it in dist_errmsg(NULL). */
int dist_mesh_ndim(const dist_mesh *m);
int dist_mesh_dim_size(const dist_mesh *m, int dim);
int dist_mesh_size(const dist_mesh *m);
int dist_mesh_rank_at(const dist_mesh *m, int index);
/* The name of mesh dim `dim` ("d0" when none was given); NULL out of range. */
const char *dist_mesh_dim_name(const dist_mesh *m, int dim);
/* Paddle get_mesh_with_dim(name, index): the sub-mesh at `index` of dim. */
int dist_mesh_get_submesh(const dist_mesh *m, const char *dim_name, int index,
                          dist_mesh **out);
/* Writes "[[0, 1], [2, 3]]". */
void dist_mesh_to_string(const dist_mesh *m, char *buf, size_t len);

/* "Shard(0),Replicate(),Partial(sum)" -> placements; returns the count or a
 * negative error. */
int dist_parse_placements(const char *text, dist_placement *out, int max);
/* Writes "[Shard(0), Replicate()]" (n entries of p). A NULL p with n > 0
 * writes "" and names p in dist_errmsg(NULL); a NULL buf or len 0 writes
 * nothing. */
void dist_placements_format(const dist_placement *p, int n, char *buf,
                            size_t len);

/* ---------------------------------------------------------------- tensors */

/* shard_tensor: the client holds the whole tensor (row-major, shape[ndim]);
 * each daemon of the mesh receives only its piece. Names are the
 * cluster's: a name any daemon holds, in the mesh or outside it, is
 * refused (DIST_EEXIST naming the rank), with nothing put; except that
 * one-rank tensors of one name on different daemons are per-rank values
 * (as an exchange result kept in the daemons). Two clients putting one
 * name onto disjoint meshes at once may both be refused, never both
 * succeed. dtensor_from_local likewise. An SPMD trainer outside the
 * mesh gets a handle with an empty piece, its daemon storing nothing. */
int dist_shard_tensor(dist_client *c, const char *name, const void *data,
                      dist_dtype dt, int ndim, const int64_t *shape,
                      const dist_mesh *mesh, const dist_placement *placements,
                      dist_tensor **out);

/* dtensor_from_local. SPMD: this trainer's piece goes to its own daemon.
 * Single client: pieces[i] / shapes[i] are the pieces of the mesh's ranks in
 * mesh order (ndim dims each). The daemons derive and check the global
 * shape. An SPMD trainer outside the mesh gives a piece too (checked, not
 * sent): its handle's global shape is derived from that piece's shape as
 * Paddle does (each sharded dim times its mesh dim's size; exact for even
 * splits) until a reshard onto a mesh with it gives it the daemons'. */
int dist_dtensor_from_local(dist_client *c, const char *name,
                            const void *const *pieces, dist_dtype dt, int ndim,
                            const int64_t *const *shapes,
                            const dist_mesh *mesh,
                            const dist_placement *placements,
                            dist_tensor **out);

/* dtensor_to_local: the piece of `rank` (SPMD: -1 = this trainer's rank).
 * *data is malloc'd (free()); shape gets ndim entries. SPMD, this
 * trainer's piece of a handle made outside the tensor's mesh (by
 * shard_tensor, dtensor_from_local or a reshard): 0 bytes, every shape
 * entry 0, no daemon asked. */
int dist_dtensor_to_local(dist_client *c, const dist_tensor *t, int rank,
                          void **data, size_t *nbytes, int64_t *shape);
/* full_tensor: the logical value (partials reduced, shards gathered).
 * SPMD, outside t's mesh: 0 bytes, as Paddle's reshard to Replicate then
 * local value gives a rank outside the mesh (the op id is taken). */
int dist_full_tensor(dist_client *c, const dist_tensor *t, void **data,
                     size_t *nbytes);
/* Converts t in place to new placements, and to another mesh of the same
 * shape when mesh is not NULL. A parameter (dist_param_configure) takes its
 * optimizer state along, onto another mesh too, unless the new placements
 * are Partial (it is then no longer a parameter); while pushes for its next
 * synchronous update are pending on any daemon the reshard fails with
 * DIST_EUNAVAIL and changes nothing. An SPMD trainer outside both meshes
 * only updates the handle (its piece stays empty); one in either mesh
 * takes part, so a stage's tensor moves to the next stage's mesh, and one
 * in the new mesh takes the global shape its daemon describes (a handle
 * made outside the mesh by dtensor_from_local had guessed it). */
int dist_reshard(dist_client *c, dist_tensor *t, const dist_mesh *mesh,
                 const dist_placement *placements);
/* A handle to an existing tensor, by name (asks the daemons). */
int dist_tensor_open(dist_client *c, const char *name, dist_tensor **out);
/* Deletes the tensor in the daemons of its mesh (SPMD: in this trainer's;
 * a trainer outside the mesh, whose daemon holds none of it, is told
 * DIST_ENOTFOUND and removes nothing anywhere: by name it cannot tell
 * such a tensor from a typo; dist_tensor_delete_handle can).
 * A single client deleting a name held as per-rank values deletes every
 * rank's. */
int dist_tensor_delete(dist_client *c, const char *name);
/* Deletes the tensor t is a handle of, in the daemons of t's mesh (SPMD:
 * in this trainer's), as dist_tensor_delete does by name. A handle an SPMD
 * trainer outside the mesh was given (by dist_shard_tensor, a reshard,
 * ...: its piece is empty) is a no-op success there, as in Paddle, where
 * such a rank holds nothing: a program can delete on every trainer. t
 * stays the caller's to free. */
int dist_tensor_delete_handle(dist_client *c, const dist_tensor *t);
void dist_tensor_free(dist_tensor *t);

/* One rank's piece of a tensor, as that daemon describes it. */
typedef struct dist_tensor_piece {
  int rank;
  int ndim;
  int64_t shape[DIST_MAX_DIMS];  /* the piece's extent per tensor dim */
  int64_t offset[DIST_MAX_DIMS]; /* where it starts in the global tensor */
  uint64_t nbytes;
  uint64_t version;
} dist_tensor_piece;
/* Asks every daemon of t's mesh (in both modes) for its piece. On success
 * *out is a malloc'd array (free()) of *n entries in mesh order. */
int dist_tensor_pieces(dist_client *c, const dist_tensor *t,
                       dist_tensor_piece **out, int *n);
/* Every tensor any daemon of the client holds, once per name and mesh,
 * sorted by name: a name held as per-rank values (each on its own
 * daemon's one-rank mesh) is listed once per rank, in rank order. *out is
 * a malloc'd array of handles: free with dist_tensor_list_free. */
int dist_tensor_list(dist_client *c, dist_tensor ***out, int *n);
void dist_tensor_list_free(dist_tensor **list, int n);

/* For a NULL tensor: NULL, -1 for ndim, DIST_DTYPE_INVALID for the dtype;
 * dist_errmsg(NULL) names the call. */
const char *dist_tensor_name(const dist_tensor *t);
dist_dtype dist_tensor_dtype(const dist_tensor *t);
int dist_tensor_ndim(const dist_tensor *t);
const int64_t *dist_tensor_shape(const dist_tensor *t);
const dist_mesh *dist_tensor_mesh(const dist_tensor *t);
const dist_placement *dist_tensor_placements(const dist_tensor *t);
/* The tensor's version (each change stores it one past the last) as the
 * daemons reported it when t was made or last resharded through it
 * (dist_reshard); the handle does not follow changes made through other
 * handles or clients (dist_tensor_pieces asks each daemon now). A handle from
 * dist_tensor_list: the version its daemons listed, 0 when they listed
 * different ones (a change applied on some of them only). 0 for NULL and
 * for a handle no daemon described. */
uint64_t dist_tensor_version(const dist_tensor *t);

/* ---------------------------------------------------------------- SPMD collectives */

/* In place over the ranks of group (NULL = every rank), for SPMD trainers;
 * a trainer outside the group returns 0 with its buffers as they were:
 * each trainer passes its own buffer. A client of one endpoint
 * (dist_connect) runs them as the trainer of its daemon's rank, over
 * groups of that rank only (NULL = that rank); a group naming another is
 * refused with DIST_EINVAL naming it. */
int dist_all_reduce(dist_client *c, void *buf, size_t count, dist_dtype dt,
                    dist_reduce op, const int *group, int group_size);
/* Gathers count elements from every member into out (group_size * count). */
int dist_all_gather(dist_client *c, const void *in, size_t count, void *out,
                    dist_dtype dt, const int *group, int group_size);
int dist_broadcast(dist_client *c, void *buf, size_t count, dist_dtype dt,
                   int root, const int *group, int group_size);
int dist_barrier(dist_client *c);

/* ---------------------------------------------------------------- MoE exchanges */

/* Paddle's global_scatter / global_gather (seed 003; semantics.md). W ranks
 * form the group (group NULL = every rank, W = the world size), each with
 * n_experts (E) experts; counts have W*E entries, index i = rank*E + expert
 * with rank the position in the group. Rows have d_model elements of dt.
 *  - global_scatter: x holds sum(local_count) rows; chunk i goes to expert
 *    i%E of rank i/E. The result holds sum(global_count) rows, expert-major
 *    (for each local expert, for each source rank).
 *  - global_gather: the exact inverse (x laid out like a scatter's result).
 * The gradient of one is the other applied to the output gradient.
 * Rows travel daemon to daemon; a global_count that disagrees with what the
 * senders send fails the op on every rank with a message naming both ranks.
 *
 * Arrays are per participating rank: SPMD, one entry (this trainer's rank,
 * or outside the group); single client, W entries in group order. A
 * trainer outside the group gets 0 with out[0] empty (malloc'd, to free())
 * and out_rows[0] 0, count_global a global_count[0] of zeros, its daemon
 * not asked.
 * x_rows[k] is the row count of x[k] (x_rows NULL: the rows the counts
 * need). out[k] is malloc'd (free()) with out_rows[k] rows. */
typedef struct dist_moe_opts {
  const char *x_name;   /* take x from this tensor each daemon holds (its local
                           piece; x may be NULL, d_model 0 = from its shape) */
  const char *out_name; /* keep each rank's result in its daemon under this
                           name ([rows, d_model], local to that daemon);
                           out / out_rows may then be NULL */
  int replace;          /* out_name may overwrite an existing tensor */
  int gradient;         /* the rows are gradients (a backward pass): the
                           daemons do not count them as routed tokens */
} dist_moe_opts;

int dist_global_scatter(dist_client *c, const void *const *x,
                        const int64_t *x_rows, dist_dtype dt, int64_t d_model,
                        const int64_t *const *local_count,
                        const int64_t *const *global_count, int n_experts,
                        const int *group, int group_size,
                        const dist_moe_opts *opts, void **out,
                        int64_t *out_rows);
int dist_global_gather(dist_client *c, const void *const *x,
                       const int64_t *x_rows, dist_dtype dt, int64_t d_model,
                       const int64_t *const *local_count,
                       const int64_t *const *global_count, int n_experts,
                       const int *group, int group_size,
                       const dist_moe_opts *opts, void **out,
                       int64_t *out_rows);
/* Paddle's count_by_gate / number_count exchange: global_count[r][s*E+e] =
 * local_count[s][r*E+e]. SPMD: an all-to-all between the trainers' daemons
 * (one entry per array); single client: computed from the W given arrays.
 * global_count[k] has room for W*E entries. */
int dist_count_global(dist_client *c, const int64_t *const *local_count,
                      int n_experts, const int *group, int group_size,
                      int64_t *const *global_count);

/* ---------------------------------------------------------------- MoE layer */

/* A mixture-of-experts layer (semantics.md "Expert shards") over the W
 * ranks of a group, E experts per rank: the daemon at group position p holds
 * experts p*E .. p*E+E-1 (NE = W*E in all), each an FFN
 * y = act(x @ w1 + b1) @ w2 + b2 with w1 [d_model, d_hidden],
 * w2 [d_hidden, d_model], optional biases. Its parameters are stored tensors
 * of that daemon, "<name>.expert<k>.w1" (".b1", ".w2", ".b2"), each with a
 * gradient "<param>.grad", trained by the parameter service.
 *
 * The gate runs in the client. For token t with logits l = x_t @ gate_w
 * (gate_w [d_model, NE], row-major): sel = the top_k largest logits (ties:
 * the lower expert id first), weight_j = exp(l[sel_j]) / sum_i exp(l[sel_i])
 * (a softmax over the selected logits, which is softmax(l) restricted to
 * sel and renormalized), and
 *     y_t = sum_j weight_j * FFN_{sel_j}(x_t).
 * (With top_k 1 the weight is always 1 and the gate gets no gradient.)
 * Forward: gate, counts (dist_count_global), global_scatter of the routed
 * rows (kept in the daemons), each daemon's experts on their rows (OpenBLAS
 * GEMM), global_gather, then the weighted combine. Backward reverses it.
 *
 * Arrays are per participating rank, as for dist_global_scatter: SPMD, one
 * entry (this trainer's tokens, on its own daemon); single client, W entries
 * in group order. Data are row-major in the layer's dtype. */
typedef struct dist_moe_layer dist_moe_layer;

typedef enum { DIST_EXPERT_GELU = 0, DIST_EXPERT_SILU = 1 } dist_expert_act;

/* One expert's values: w1 [d_model, d_hidden], b1 [d_hidden],
 * w2 [d_hidden, d_model], b2 [d_model]; biases read only with bias. */
typedef struct dist_expert_weights {
  const void *w1, *b1, *w2, *b2;
} dist_expert_weights;

typedef struct dist_moe_layer_opts {
  int experts_per_rank;       /* E >= 1 */
  int64_t d_model, d_hidden;
  dist_expert_act activation; /* GELU is the exact erf form */
  int bias;
  int top_k;                  /* 1 .. W*E */
  dist_dtype dtype;           /* DIST_FLOAT32 or DIST_FLOAT64 */
  const int *group;           /* global ranks; NULL = every rank */
  int group_size;
  /* Initial values: NULL draws them in the daemons from seed (uniform in
   * +-1/sqrt(fan_in)); else one entry per expert this client creates (SPMD:
   * its rank's E experts; single client: all W*E, by global id). */
  const dist_expert_weights *weights;
  uint64_t seed;
  int replace;                /* the layer's tensors may exist already */
} dist_moe_layer_opts;
#define DIST_MOE_LAYER_OPTS_INIT \
  {1, 0, 0, DIST_EXPERT_GELU, 0, 2, DIST_FLOAT32, NULL, 0, NULL, 0, 0}

/* Creates the experts in the daemons (SPMD: this trainer's daemon only, so
 * every trainer calls it) and the client handle. name has at most 150
 * characters. An SPMD trainer outside the group gets an empty layer (it
 * takes the op id; its daemon holds no expert): its forward and backward
 * take the op ids a member's successful pass takes (3 and 2) and give an
 * empty y[0] / grad_x[0] (malloc'd) and a zero grad_gate, and its
 * configure_optimizer and step take theirs (1 each) and change nothing,
 * as Paddle's layer does nothing on a rank outside its group. Every SPMD
 * trainer's pass takes those 3 and 2 ids whatever happens in it: a member
 * that refuses it, or fails a step, takes the rest of them too, since the
 * outsider cannot learn of it. */
int dist_moe_layer_create(dist_client *c, const char *name,
                          const dist_moe_layer_opts *opts,
                          dist_moe_layer **out);
/* Forward: x[k] holds tokens[k] rows of d_model; gate_w is [d_model, NE]
 * (the same on every rank: replicate it). y[k] gets a malloc'd
 * [tokens[k], d_model] (free()). The layer keeps what backward needs until
 * the next forward (one step in flight per layer). x and, in backward,
 * grad_y are read entry by entry before anything is sent: a NULL entry of
 * a rank with tokens is refused naming it ("x[1] is NULL"), to the other
 * SPMD trainers too. */
int dist_moe_layer_forward(dist_client *c, dist_moe_layer *l,
                           const void *const *x, const int64_t *tokens,
                           const void *gate_w, void **y);
/* Backward of the last forward: grad_y[k] is dL/dy[k]. grad_x[k] gets a
 * malloc'd dL/dx[k] (grad_x may be NULL); grad_gate (may be NULL;
 * [d_model, NE]) gets dL/dgate_w from the tokens of this client: SPMD, this
 * rank's contribution (all-reduce it across trainers); single client, the
 * sum over every rank. The experts' weight gradients land in the daemons'
 * "<param>.grad" tensors: set by the first backward after create, a step or
 * dist_moe_layer_zero_grad, added to by the next ones. */
int dist_moe_layer_backward(dist_client *c, dist_moe_layer *l,
                            const void *const *grad_y, void **grad_x,
                            void *grad_gate);
/* The next backward overwrites the expert gradients instead of adding.
 * NULL does nothing but name itself in dist_errmsg(NULL). */
void dist_moe_layer_zero_grad(dist_moe_layer *l);
/* Makes every expert parameter this client drives a parameter-service
 * parameter with opts (trainers forced to 1: each expert has one trainer,
 * the one of its rank). */
struct dist_param_opts; /* the parameter service section, below */
int dist_moe_layer_configure_optimizer(dist_client *c, dist_moe_layer *l,
                                       const struct dist_param_opts *opts);
/* One optimizer step: pushes each expert's "<param>.grad" to its parameter
 * as one step (dist_param_push_tensors: all applied or none), then
 * zero_grad. SPMD trainers all call it; each pushes its own rank's
 * experts, so the step is all-or-none on each daemon. */
int dist_moe_layer_step(dist_client *c, dist_moe_layer *l);
/* Drops what the daemons keep for the pending backward. */
int dist_moe_layer_release(dist_client *c, dist_moe_layer *l);
/* The name of parameter which ("w1", "b1", "w2", "b2") of global expert
 * id; -1 when it does not exist or len is too small, and for a NULL l
 * (named in dist_errmsg(NULL)). */
int dist_moe_layer_param_name(const dist_moe_layer *l, int expert,
                              const char *which, char *buf, size_t len);
/* Frees the handle (the daemons keep the experts). NULL is a no-op. */
void dist_moe_layer_free(dist_moe_layer *l);

/* ---------------------------------------------------------------- LocalLayer */

/* A LocalLayer's forward is a program of tensor operations that every daemon
 * runs on its local pieces (semantics.md, "LocalLayer"; program.proto).
 * Build it with a dist_program: declare inputs, add ops (each returns the id
 * of the value it computes), declare outputs and one out_dist_attr per
 * output; register it; call it many times.
 *
 * Builder calls return a value id (>= 0) or a negative dist_err. Errors are
 * sticky: a failed call records its message in the program
 * (dist_program_errmsg), every later call that uses a negative id fails
 * too, and dist_program_register reports the first error. So a forward can
 * be written straight through and checked once. */
typedef struct dist_program dist_program;
typedef struct dist_invocation dist_invocation;

/* Op kinds, numbered as dist.v1.OpKind. */
typedef enum {
  DIST_OP_ADD = 1, DIST_OP_SUB = 2, DIST_OP_MUL = 3, DIST_OP_DIV = 4,
  DIST_OP_POW = 5, DIST_OP_MAXIMUM = 6, DIST_OP_MINIMUM = 7,
  DIST_OP_EQ = 10, DIST_OP_NE = 11, DIST_OP_LT = 12, DIST_OP_LE = 13,
  DIST_OP_GT = 14, DIST_OP_GE = 15, DIST_OP_LOGICAL_AND = 16,
  DIST_OP_LOGICAL_OR = 17, DIST_OP_LOGICAL_NOT = 18, DIST_OP_WHERE = 19,
  DIST_OP_EXP = 20, DIST_OP_LOG = 21, DIST_OP_SQRT = 22, DIST_OP_ABS = 23,
  DIST_OP_NEG = 24, DIST_OP_RELU = 25, DIST_OP_GELU = 26, DIST_OP_SILU = 27,
  DIST_OP_SIGMOID = 28, DIST_OP_TANH = 29,
  DIST_OP_SUM = 40, DIST_OP_MEAN = 41, DIST_OP_MAX = 42, DIST_OP_MIN = 43
} dist_op_kind;

/* Cross-entropy reductions, numbered as dist.v1.Reduction. */
typedef enum {
  DIST_CE_MEAN = 0,
  DIST_CE_SUM = 1,
  DIST_CE_NONE = 2
} dist_ce_reduction;

/* An empty program named name (NULL: "program"; shown in errors). A
 * builder given a NULL program returns DIST_EINVAL, and
 * dist_errmsg(NULL) names it ("dist_op_add: p is NULL"). */
int dist_program_new(const char *name, dist_program **out);
/* Frees the builder and the client's record of its registration (the
 * daemons keep the program until dist_program_unregister). NULL is a no-op. */
void dist_program_free(dist_program *p);
/* The first builder error ("" when none, and for a NULL p). */
const char *dist_program_errmsg(const dist_program *p);

/* Inputs, in call order. dtype DIST_DTYPE_INVALID accepts any dtype. */
/* The local piece of a distributed tensor argument. */
int dist_input_dtensor(dist_program *p, const char *name, dist_dtype dt);
/* A plain per-rank value given at each call. */
int dist_input_value(dist_program *p, const char *name, dist_dtype dt);
/* The rank id (int64 scalar): `if rank == 0` is dist_op_where on
 * dist_op_eq_scalar(p, rank, 0). */
int dist_input_rank(dist_program *p);
/* This rank's coordinate along mesh dim `dim` of mesh (int64 scalar). */
int dist_input_coord(dist_program *p, const dist_mesh *mesh, int dim);
/* Optional checks and gradient settings of input `id`: the expected shape
 * (-1 = any extent), no gradient, and the placements of its gradient as a
 * distributed tensor (default: the input tensor's placements). */
int dist_input_set_shape(dist_program *p, int id, int ndim,
                         const int64_t *shape);
int dist_input_set_no_grad(dist_program *p, int id);
int dist_input_set_grad_placements(dist_program *p, int id,
                                   const dist_placement *placements, int n);
/* Labels the node computing value id (shown in errors). */
int dist_op_set_label(dist_program *p, int id, const char *label);

/* Elementwise, numpy broadcasting; both operands the same dtype. op is
 * one of DIST_OP_ADD ... DIST_OP_LOGICAL_OR. */
int dist_op_binary(dist_program *p, dist_op_kind op, int a, int b);
/* op(a, scalar), or op(scalar, a) with scalar_first. */
int dist_op_binary_scalar(dist_program *p, dist_op_kind op, int a,
                          double scalar, int scalar_first);
int dist_op_add(dist_program *p, int a, int b);
int dist_op_sub(dist_program *p, int a, int b);
int dist_op_mul(dist_program *p, int a, int b);
int dist_op_div(dist_program *p, int a, int b);
int dist_op_pow(dist_program *p, int a, int b);
int dist_op_maximum(dist_program *p, int a, int b);
int dist_op_minimum(dist_program *p, int a, int b);
int dist_op_eq(dist_program *p, int a, int b);
int dist_op_ne(dist_program *p, int a, int b);
int dist_op_lt(dist_program *p, int a, int b);
int dist_op_le(dist_program *p, int a, int b);
int dist_op_gt(dist_program *p, int a, int b);
int dist_op_ge(dist_program *p, int a, int b);
int dist_op_logical_and(dist_program *p, int a, int b);
int dist_op_logical_or(dist_program *p, int a, int b);
int dist_op_add_scalar(dist_program *p, int a, double s);  /* a + s */
int dist_op_sub_scalar(dist_program *p, int a, double s);  /* a - s */
int dist_op_mul_scalar(dist_program *p, int a, double s);  /* a * s */
int dist_op_div_scalar(dist_program *p, int a, double s);  /* a / s */
int dist_op_pow_scalar(dist_program *p, int a, double s);  /* a ^ s */
int dist_op_eq_scalar(dist_program *p, int a, double s);   /* a == s */
int dist_op_scalar_sub(dist_program *p, double s, int a);  /* s - a */
int dist_op_scalar_div(dist_program *p, double s, int a);  /* s / a */
int dist_op_logical_not(dist_program *p, int a);
int dist_op_where(dist_program *p, int cond, int a, int b);

/* One operand, float dtypes (abs, neg, relu also integers). op is one of
 * DIST_OP_EXP ... DIST_OP_TANH or DIST_OP_LOGICAL_NOT. */
int dist_op_unary(dist_program *p, dist_op_kind op, int x);
int dist_op_exp(dist_program *p, int x);
int dist_op_log(dist_program *p, int x);
int dist_op_sqrt(dist_program *p, int x);
int dist_op_abs(dist_program *p, int x);
int dist_op_neg(dist_program *p, int x);
int dist_op_relu(dist_program *p, int x);
int dist_op_gelu(dist_program *p, int x, int approximate);
int dist_op_silu(dist_program *p, int x);
int dist_op_sigmoid(dist_program *p, int x);
int dist_op_tanh(dist_program *p, int x);

/* Reductions over axes (naxes 0: all), with keepdim. op is DIST_OP_SUM,
 * DIST_OP_MEAN, DIST_OP_MAX or DIST_OP_MIN. */
int dist_op_reduce(dist_program *p, dist_op_kind op, int x,
                   const int64_t *axes, int naxes, int keepdim);
int dist_op_sum(dist_program *p, int x, const int64_t *axes, int naxes,
                int keepdim);
int dist_op_mean(dist_program *p, int x, const int64_t *axes, int naxes,
                 int keepdim);
int dist_op_max(dist_program *p, int x, const int64_t *axes, int naxes,
                int keepdim);
int dist_op_min(dist_program *p, int x, const int64_t *axes, int naxes,
                int keepdim);
int dist_op_logsumexp(dist_program *p, int x, int64_t axis, int keepdim);
int dist_op_softmax(dist_program *p, int x, int64_t axis);
int dist_op_log_softmax(dist_program *p, int x, int64_t axis);
/* logits [..., C], labels int [...] (or [..., 1]); mask < 0: none;
 * use_ignore_index with ignore_index drops rows of that label. */
int dist_op_cross_entropy(dist_program *p, int logits, int labels, int mask,
                          dist_ce_reduction reduction, int use_ignore_index,
                          int64_t ignore_index);
/* numpy matmul; trans_a / trans_b transpose the last two dims first. */
int dist_op_matmul(dist_program *p, int a, int b, int trans_a, int trans_b);

/* Shape and creation. */
int dist_op_reshape(dist_program *p, int x, const int64_t *shape, int ndim);
int dist_op_transpose(dist_program *p, int x, const int64_t *perm, int n);
/* x[starts:ends:steps] along axes (python rules; steps NULL: 1). */
int dist_op_slice(dist_program *p, int x, const int64_t *axes,
                  const int64_t *starts, const int64_t *ends,
                  const int64_t *steps, int n);
/* A copy of x with x[slice] = v (v < 0: = scalar): `mask[1:3] = 1`. */
int dist_op_set_slice(dist_program *p, int x, int v, double scalar,
                      const int64_t *axes, const int64_t *starts,
                      const int64_t *ends, const int64_t *steps, int n);
int dist_op_concat(dist_program *p, const int *xs, int n, int64_t axis);
int dist_op_cast(dist_program *p, int x, dist_dtype dt);
int dist_op_full(dist_program *p, dist_dtype dt, const int64_t *shape,
                 int ndim, double value);
int dist_op_zeros_like(dist_program *p, int x);
int dist_op_ones_like(dist_program *p, int x);
int dist_op_full_like(dist_program *p, int x, double value);
int dist_op_arange(dist_program *p, double start, double end, double step,
                   dist_dtype dt);
/* values has nvalues entries (1 broadcasts to the shape). */
int dist_op_constant(dist_program *p, dist_dtype dt, const int64_t *shape,
                     int ndim, const double *values, int nvalues);
/* Values and int64 indices of the k largest (smallest) along axis. */
int dist_op_topk(dist_program *p, int x, int64_t k, int64_t axis,
                 int smallest, int *values, int *indices);
int dist_op_one_hot(dist_program *p, int x, int64_t num_classes,
                    dist_dtype dt);

/* Outputs and LocalLayer's out_dist_attrs, in order: one attr per output
 * (a different count is an error at registration, as in Paddle).
 * grad_placements NULL: the gradient of the output has its placements. */
int dist_program_output(dist_program *p, int value);
int dist_program_out_dist_attr(dist_program *p, const dist_mesh *mesh,
                               const dist_placement *placements,
                               const dist_placement *grad_placements);

/* How long the daemons keep an invocation of p for backward when neither
 * dist_backward nor dist_invocation_release comes (seconds; 0, the
 * default: the daemons' default of 600 s). Takes effect at registration. */
int dist_program_set_invocation_ttl(dist_program *p, double seconds);
/* Registers p on the daemons of its meshes (single client: every rank of
 * the out_dist_attrs meshes; SPMD: this trainer's daemon). The daemons check
 * the program and keep it until dist_program_unregister; p remembers each
 * daemon's handle. Registering again replaces the registration. */
int dist_program_register(dist_client *c, dist_program *p);
/* Releases the program on its daemons, with every invocation of it not yet
 * backpropagated. */
int dist_program_unregister(dist_client *c, dist_program *p);
/* The ranks a registered program runs on (single client: VALUE arguments
 * are given per rank in this order); -1 out of range. These and the two
 * counts below return -1 for a NULL program. */
int dist_program_nranks(const dist_program *p);
int dist_program_rank_at(const dist_program *p, int i);
/* The inputs and outputs declared so far. */
int dist_program_n_inputs(const dist_program *p);
int dist_program_n_outputs(const dist_program *p);

/* A plain value: row-major data of dtype and shape (borrowed). */
typedef struct dist_value {
  const void *data;
  dist_dtype dtype;
  int ndim;
  int64_t shape[DIST_MAX_DIMS];
} dist_value;

/* One argument: a distributed tensor, or per-rank values (SPMD: one value;
 * single client: one per program rank, dist_program_rank_at order). RANK /
 * COORD inputs take {NULL, NULL}. */
typedef struct dist_arg {
  const dist_tensor *tensor;
  const dist_value *values;
} dist_arg;

typedef struct dist_call_opts {
  const char *const *out_names; /* one per output; NULL: "<program>.<id>.out<k>" */
  int replace;                  /* outputs may overwrite existing tensors,
                                   each held within the output's mesh (on
                                   other ranks its pieces would stay:
                                   DIST_EEXIST names such a rank). A
                                   replacing call with out_names that fails
                                   after the daemons stored its outputs
                                   (a lost reply, out of memory here) keeps
                                   them: the names may then hold the outputs,
                                   not what they held before
                                   (dist_tensor_open shows which) */
  int keep_local_values;        /* keep every rank's local outputs in the
                                   invocation (dist_invocation_local_output) */
  int no_grad;                  /* no backward will follow: the daemons keep
                                   nothing */
} dist_call_opts;
#define DIST_CALL_OPTS_INIT {NULL, 0, 0, 0}

/* Calls a registered LocalLayer: args has one entry per input (nargs of
 * them). On success *inv is a new invocation (free with
 * dist_invocation_free) and outs[k] a new handle of output k, stored in the
 * daemons as a distributed tensor with out_dist_attrs[k]. opts may be NULL.
 * Every daemon runs with the same invocation id, so SPMD trainers must call
 * in the same order. args is read entry by entry before anything is sent:
 * a value with elements but no data, or more than DIST_MAX_DIMS dims, is
 * refused naming it ("args[1].values[0].data is NULL"). A call that failed
 * on a daemon that did not answer it (its reply lost, perhaps after it
 * stored) may have left there the invocation kept for backward, and
 * outputs: the client's next dist_local_layer_call that passes its checks
 * and is sent, dist_invocation_release or dist_close asks that daemon to
 * release the invocation and delete the outputs under names libdist made
 * up (not an SPMD trainer's: those are every trainer's, and the others
 * got theirs), costing one deadline while it still does not answer (what
 * it cannot be asked stays for the next time; a request that reaches it
 * before the failed call's own finds nothing there, and the call's then
 * stay); outputs under out_names stay (the names are the caller's, who
 * may have used them again). The same goes for a daemon that answered
 * the call but let its undo (a release, a delete of a name libdist made
 * up) wait out the deadline: its other undos are then noted unsent. */
int dist_local_layer_call(dist_client *c, dist_program *p, const dist_arg *args,
                          int nargs, const dist_call_opts *opts,
                          dist_invocation **inv, dist_tensor **outs);
/* -1 for a NULL invocation. */
int dist_invocation_n_outputs(const dist_invocation *inv);
int dist_invocation_n_inputs(const dist_invocation *inv);
/* With keep_local_values: output k's local value on `rank` (SPMD: -1 =
 * this trainer's); pointers into the invocation, valid until it is freed. */
int dist_invocation_local_output(const dist_invocation *inv, int k, int rank,
                                 dist_value *out);

typedef struct dist_backward_opts {
  const char *const *grad_names; /* one per input; NULL: "<out0>.grad<i>" */
  int replace;                   /* as dist_call_opts.replace; a replacing
                                    backward that fails after the daemons
                                    stored its gradients keeps them where
                                    the names may have held the caller's
                                    tensors: with grad_names, or with
                                    "<out0>.grad<i>" of an out0 named in
                                    dist_call_opts.out_names. Of a made-up
                                    out0 they are new, and deleted */
  int keep_local_values;         /* keep local input gradients:
                                    dist_invocation_local_grad */
} dist_backward_opts;
#define DIST_BACKWARD_OPTS_INIT {NULL, 0, 0}

/* Gradients of the program's inputs. out_grads NULL: from the scalar
 * output (gradient 1 on every rank); otherwise one dist_arg per output (a
 * tensor whose local pieces are the local output gradients, values, or
 * {NULL, NULL} for none). grads (may be NULL) gets one entry per input: a
 * new handle of the gradient stored in the daemons (on the input's mesh
 * with its grad placements) or NULL for inputs without one (RANK, COORD,
 * VALUE, no_grad, integer dtypes). Backward runs once per invocation; the
 * daemons then free what they kept. opts may be NULL. out_grads' values are
 * checked as dist_local_layer_call's args are. A backward that failed on a
 * daemon that did not answer it is undone there as a failed
 * dist_local_layer_call is, by the same undo points: the invocation
 * released (kept by a daemon the request never reached) and gradients
 * under names libdist made up deleted (a lost reply, perhaps after it
 * stored; not an SPMD trainer's, as for the call); gradients under
 * grad_names, or named after an out0 the caller named, stay. A delete of
 * such a gradient on a daemon that answered, which waits out the
 * deadline, is retried at those undo points too. */
int dist_backward(dist_client *c, dist_invocation *inv,
                  const dist_arg *out_grads, const dist_backward_opts *opts,
                  dist_tensor **grads);
/* With keep_local_values: the local gradient of input i on `rank`;
 * DIST_ENOTFOUND when it has none. */
int dist_invocation_local_grad(const dist_invocation *inv, int i, int rank,
                               dist_value *out);
/* Frees what the daemons keep for backward (nothing to do after
 * dist_backward). The handle stays valid (a later dist_backward fails with
 * the daemons' message) until dist_invocation_free. Whatever inv, it also
 * undoes what failed calls and backwards left (dist_local_layer_call,
 * dist_backward). A daemon that lets the release wait out its deadline
 * (DIST_ETIMEDOUT), or that cannot be reached (DIST_EUNAVAIL: down, its
 * connection refused), is asked again at the client's next undo point
 * (the request may never have reached it), not in this call; so is one
 * that answers it did nothing for now (its own DIST_EUNAVAIL). */
int dist_invocation_release(dist_client *c, dist_invocation *inv);
/* Frees the handle only. NULL is a no-op. */
void dist_invocation_free(dist_invocation *inv);

/* ---------------------------------------------------------------- tape */

/* A tape records the differentiable operations of one client in order
 * (global_scatter, global_gather, LocalLayer calls, reshards) and
 * backpropagates through them once, newest first: the gradient of a
 * global_scatter's x is global_gather of its result's gradient with the
 * same counts (and vice versa); a LocalLayer call's is its dist_backward; a
 * reshard's is the gradient resharded back to the layout before, as in
 * Paddle. Gradients of a tensor
 * that feeds several operations are added. Everything on a tape is named:
 * an operation's inputs and outputs are tensors the daemons hold (LocalLayer
 * arguments by their handle's name), and gradients are looked up by the
 * name of the tensor they belong to.
 *
 * Gradients stay in the daemons, as tensors the tape names
 * ("tape<token>.<n>.g<k>", the token random per process, so that trainers
 * sharing daemons never make the same names, also with the same pid in pid
 * namespaces of their own) and owns: those of intermediate tensors are
 * deleted as soon as backward has used them; those of the leaves (tensors no
 * operation on the tape produced, e.g. the x of the first scatter or a
 * LocalLayer's weights) stay until dist_tape_free. An exchange's gradient
 * is per rank like its result: each daemon of the group holds its own rows
 * under the name, on a one-rank mesh. SPMD trainers each record the same
 * operations in the same order, as for the operations themselves. A call
 * a trainer's tape refuses itself (a NULL argument or entry, a missing
 * name, a released or backpropagated tape) takes its operation's op ids
 * as the operation would and has it aborted on the other trainers, which
 * fail at once naming its rank and why; a NULL t, a NULL program or a
 * NULL tensor to reshard take none, as the untaped calls. */
typedef struct dist_tape dist_tape;

/* An empty tape on client c (used by every later call on it). Fails
 * (DIST_EIO) when the kernel gives no random bits for the process's
 * token (neither getrandom nor /dev/urandom), naming why. */
int dist_tape_new(dist_client *c, dist_tape **out);
/* Releases what the daemons keep for invocations not backpropagated, deletes
 * the gradient tensors the tape made (also those a failed backward may have
 * left on a daemon that did not answer it, which it did not ask then) and
 * frees it. A delete a daemon does not answer (or cannot be reached for)
 * is retried at the client's next undo point (dist_invocation_release),
 * by a single client; an SPMD trainer's stays. The client must still be
 * open. NULL is a no-op. */
void dist_tape_free(dist_tape *t);

/* A global_scatter / global_gather on a tape: the arguments of
 * dist_global_scatter (per participating rank, as there), with names. */
typedef struct dist_tape_exchange {
  const char *x_name;   /* required. x NULL: the tensor each daemon holds
                           (dist_moe_opts.x_name); else only the name its
                           gradient is found by (nothing is stored) */
  const void *const *x; /* client rows, or NULL */
  const int64_t *x_rows;  /* NULL: the rows the counts need */
  dist_dtype dtype;
  int64_t d_model;        /* >= 1 */
  const int64_t *const *local_count, *const *global_count;
  int n_experts;
  const int *group;       /* NULL: every rank */
  int group_size;
  const char *out_name;   /* required: the result stays in each daemon of
                             the group under this name ([rows, d_model] on
                             its own one-rank mesh) */
  int replace;            /* out_name may overwrite an existing tensor */
} dist_tape_exchange;

/* Runs the exchange and records it. *out (out may be NULL) is a new handle
 * of the result (its name: pass it as a LocalLayer argument; free with
 * dist_tensor_free); out_rows (may be NULL) gets each participating rank's
 * row count. */
int dist_tape_global_scatter(dist_tape *t, const dist_tape_exchange *a,
                             dist_tensor **out, int64_t *out_rows);
int dist_tape_global_gather(dist_tape *t, const dist_tape_exchange *a,
                            dist_tensor **out, int64_t *out_rows);
/* dist_local_layer_call, recorded: the tape keeps the invocation (opts'
 * no_grad is ignored) and outs (required) get the output handles, owned by
 * the caller. */
int dist_tape_local_layer_call(dist_tape *t, dist_program *p,
                               const dist_arg *args, int nargs,
                               const dist_call_opts *opts, dist_tensor **outs);

/* dist_reshard, recorded: x (its handle updated in place) goes to
 * placements, and to mesh when not NULL. Backward reshards x's gradient
 * (the caller's seed is copied first, never changed; one given as values
 * is stored first, its pieces in the mesh order of x's layout after the
 * reshard) to x's mesh and placements before the call. A tensor an
 * exchange on the tape read or wrote lives per rank and is refused
 * (DIST_EINVAL). */
int dist_tape_reshard(dist_tape *t, dist_tensor *x, const dist_mesh *mesh,
                      const dist_placement *placements);

/* Backpropagates from n tensors the tape produced. grads NULL: each is a
 * float LocalLayer output of one element (a loss) with gradient 1 on every
 * rank. Otherwise grads[i] is outputs[i]'s gradient: a stored tensor whose
 * local pieces are the gradient pieces (the caller keeps it), or per-rank
 * values (borrowed for the call; an exchange result's in its participating
 * ranks' group order, a LocalLayer output's in dist_program_rank_at order;
 * SPMD: one, empty for a trainer outside the output's mesh), or {NULL,
 * NULL} for none. A seed given as values or as the
 * loss's 1 for a tensor that also gets a gradient from an operation on the
 * tape is stored in the daemons (in the output's layout) and added to it.
 * Backward runs once; a tape that was released or backpropagated refuses it
 * (DIST_EINVAL). outputs and grads are read entry by entry before anything
 * is sent: a NULL output, or a value with elements but no data or more than
 * DIST_MAX_DIMS dims, is refused naming it ("grads[0].values[1].data is
 * NULL") and leaves the tape as it was. (SPMD: a value is refused by the
 * step that reads it, which aborts that step on the other trainers; a
 * refusal before the first step aborts the others' first step, whichever
 * it is, so their backward fails at once, spending their tapes. A failed
 * SPMD backward takes at least three op ids, so that the trainers stay
 * in step whichever step failed.)
 * Invocations no gradient reaches are released. On a later failure every
 * gradient is dropped. */
int dist_tape_backward(dist_tape *t, const dist_tensor *const *outputs,
                       const dist_arg *grads, int n);
/* The gradient of tensor `name` after backward: a new handle (free with
 * dist_tensor_free) naming the tensor the tape holds, valid until
 * dist_tape_free; its mesh is one daemon's for per-rank gradients.
 * DIST_ENOTFOUND when no gradient reached name. */
int dist_tape_grad(dist_tape *t, const char *name, dist_tensor **out);
/* Rank `rank`'s piece of that gradient (SPMD: -1 = this trainer's), as
 * dist_dtensor_to_local: *data malloc'd (free()), shape ndim entries. */
int dist_tape_grad_local(dist_tape *t, const char *name, int rank, void **data,
                         size_t *nbytes, int64_t *shape);
/* Releases the kept invocations without backward; a later
 * dist_tape_backward fails. */
int dist_tape_release(dist_tape *t);

/* ---------------------------------------------------------------- parameter service */

/* A stored float32/float64 tensor becomes a parameter trained in the
 * daemons (semantics.md, "Parameter service"): trainers push gradients, each
 * daemon applies the optimizer to its own shard (state kept next to it),
 * trainers pull the new values. Every update bumps the tensor's version.
 * Update rules are torch.optim's SGD (momentum, dampening, nesterov), Adam
 * (weight decay as L2) and AdamW (decoupled), bias-corrected.
 *  - DIST_PARAM_SYNC: an update happens once each trainer 0..trainers-1 has
 *    pushed once; the pushes are summed or averaged (reduce). A trainer
 *    pushing twice before the update gets DIST_EEXIST.
 *  - DIST_PARAM_ASYNC: each push is applied at once, as given. */
typedef enum { DIST_OPT_SGD = 0, DIST_OPT_ADAM = 1, DIST_OPT_ADAMW = 2 } dist_optimizer;
typedef enum { DIST_PARAM_SYNC = 0, DIST_PARAM_ASYNC = 1 } dist_consistency;

typedef struct dist_param_opts {
  dist_optimizer optimizer;
  double lr;
  double momentum, dampening; /* SGD */
  int nesterov;               /* SGD */
  double beta1, beta2, eps;   /* Adam, AdamW */
  double weight_decay;
  dist_reduce reduce;         /* DIST_REDUCE_SUM or DIST_REDUCE_AVG over trainers */
  dist_consistency consistency;
  int trainers;               /* pushes per update (sync); the AVG divisor */
} dist_param_opts;
#define DIST_PARAM_OPTS_INIT \
  {DIST_OPT_SGD, 1e-3, 0, 0, 0, 0.9, 0.999, 1e-8, 0, DIST_REDUCE_AVG, DIST_PARAM_SYNC, 1}

/* Makes the stored tensor `name` a parameter on every daemon of its mesh
 * (again: resets its optimizer state and pending pushes), on all of them
 * or, when one refuses (its state does not fit its memory limit, ...), on
 * none: the error names that rank. */
int dist_param_configure(dist_client *c, const char *name,
                         const dist_param_opts *opts);
/* Changes the hyper-parameters of parameter `name` (lr, momentum,
 * dampening, nesterov, betas, eps, weight decay), as a learning-rate
 * schedule does, on every daemon of its mesh or on none, keeping its
 * optimizer state, updates applied and pending pushes. opts' optimizer,
 * reduce, consistency and trainers must be those configured, and SGD's
 * momentum cannot go to or from zero (DIST_EINVAL names what differs);
 * dist_params reads the options in force. */
int dist_param_tune(dist_client *c, const char *name, const dist_param_opts *opts);
/* Trainer `trainer` pushes the whole gradient (row-major, the parameter's
 * global shape and dtype, nbytes checked); each daemon receives its shard's
 * slice, and the daemons apply the push all together or not at all: when
 * one refuses it (or is lost), none applies it, and the error names that
 * rank and its reason. SPMD: only this trainer's daemon receives its
 * slice. *version (may be NULL) is the lowest version the daemons report
 * afterwards. While the parameter is being resharded, or when it was
 * resharded since the push was sliced, the push is refused (DIST_EUNAVAIL,
 * nothing changed): push again. */
int dist_param_push(dist_client *c, const char *name, int trainer,
                    const void *grad, size_t nbytes, uint64_t *version);
/* Pushes this daemon's piece only: the bytes of `rank`'s shard (SPMD: -1 =
 * this trainer's rank). */
int dist_param_push_local(dist_client *c, const char *name, int trainer,
                          int rank, const void *piece, size_t nbytes,
                          uint64_t *version);
/* Pushes the stored tensor grad_name (the parameter's global shape, dtype
 * and mesh; any placements: Partial ones are reduced over the ranks and
 * other layouts converted in the daemons). SPMD trainers each call it.
 * Applied by every daemon of the mesh or by none, as dist_param_push. A
 * trainer outside the mesh takes the op id and is told DIST_ENOTFOUND:
 * the parameter is found by name on its own daemon, which holds none. */
int dist_param_push_tensor(dist_client *c, const char *name, int trainer,
                           const char *grad_name, uint64_t *version);
/* dist_param_push_tensor for n parameters as one step: grad_names[k] to
 * names[k]. Every daemon of their meshes applies every push, or none
 * applies any (one refused, as by a trainer index out of range, a daemon's
 * memory limit or a reshard meanwhile): a step refused for one parameter
 * changes none, and can be made again. SPMD trainers each call it with
 * the same lists. */
int dist_param_push_tensors(dist_client *c, int n, const char *const *names,
                            const char *const *grad_names, int trainer);
/* The parameter's whole value once every daemon of its mesh holds version
 * >= min_version (0: now), waiting within the client's deadline. *data is
 * malloc'd (free()); *version (may be NULL) the lowest version seen. */
int dist_param_pull(dist_client *c, const char *name, uint64_t min_version,
                    void **data, size_t *nbytes, uint64_t *version);

/* One parameter as one daemon holds it (distctl params). */
typedef struct dist_param_info {
  char name[256];
  dist_param_opts opts;  /* as configured */
  uint64_t step;         /* updates applied */
  int pending;           /* synchronous: pushes waiting for the next update */
  uint64_t state_bytes;  /* optimizer state and the pending sum, on this daemon */
  uint64_t version;      /* the tensor's version on this daemon */
  char held_for[32];     /* "": pushes are taken; else why they are refused */
} dist_param_info;

typedef struct dist_params_report {
  int rank; /* the daemon's own (dist_daemon_rank; `rank` if it did not say) */
  int n;
  dist_param_info *params; /* by name */
} dist_params_report;

/* The parameters daemon `rank` holds. Free with dist_params_report_free. */
int dist_params(dist_client *c, int rank, dist_params_report *out);
void dist_params_report_free(dist_params_report *r); /* NULL is a no-op */

/* ---------------------------------------------------------------- checkpoints */

/* A checkpoint is a directory, seen by every daemon at the same absolute
 * path: DIR/rank<r>.<id>.safetensors per daemon plus DIR/manifest.json
 * (names, dtypes, global shapes, meshes, placements, versions, each file's
 * sha256). A save writes new files and switches the manifest last, so an
 * interrupted save leaves the previous checkpoint whole. */
typedef void (*dist_checkpoint_progress_fn)(void *arg, const char *phase,
                                            int rank, int done, int total,
                                            uint64_t bytes);
typedef struct dist_checkpoint_opts {
  /* ntensors names (at least one); NULL and 0 = every tensor (the whole
   * store). Other counts are refused (DIST_EINVAL). */
  const char *const *tensors;
  int ntensors;
  /* restore: move every restored tensor to this mesh / these placements
   * (NULL = as saved). nplacements counts placements: one per dim of mesh,
   * or without mesh of each restored tensor's saved mesh; any other count
   * is refused, naming the tensor, before anything loads. */
  const dist_mesh *mesh;
  const dist_placement *placements;
  int nplacements;
  /* called after each daemon's part ("save", "load"), and with phase
   * "rebuild" or "reshard" per tensor (rank -1) */
  dist_checkpoint_progress_fn progress;
  void *progress_arg;
} dist_checkpoint_opts;
#define DIST_CHECKPOINT_OPTS_INIT {NULL, 0, NULL, NULL, 0, NULL, NULL}

typedef struct dist_checkpoint_info {
  char id[80]; /* the checkpoint saved, or restored */
  int ntensors, nfiles;
  uint64_t bytes;
  /* Parameters saved or restored with their optimizer state (configuration,
   * updates applied, momentum or Adam's moments): a restored parameter's
   * next update is the one it would have made, on new Shard / Replicate
   * placements and other meshes too, fewer daemons included. Restored
   * onto Partial placements, a parameter's state does not follow:
   * params_reset counts those, which must be configured again. */
  int nparams, params_reset;
} dist_checkpoint_info;

/* dir must be absolute. info may be NULL. The names in opts->tensors are
 * checked before any daemon writes. A name held as per-rank values (each
 * daemon's own one-rank tensor) is refused (DIST_ENOTSUP): a checkpoint
 * keeps one tensor per name. A save that fails after the writes, before the
 * manifest is switched, removes the files it wrote (daemons that cannot be
 * reached keep theirs until a save's commit (world size + 1) x their
 * max_call_duration later). Saves into one directory may run at once:
 * the one committed last is the checkpoint there, and neither removes the
 * other's files while it is in progress (daemons before 0.2.7 did). */
int dist_checkpoint_save(dist_client *c, const char *dir,
                         const dist_checkpoint_opts *opts,
                         dist_checkpoint_info *info);
/* Restores onto the saved layout, on every daemon or none: each checks
 * its file and loads it only when all can, so a corrupt, truncated or
 * missing file, or a daemon out of memory, fails with every store
 * unchanged (daemons before 0.2.2 load one by one). Then,
 * with opts->mesh / placements, reshards each tensor (same-shape meshes in
 * the daemons). A tensor going onto a mesh of another shape, or saved on
 * ranks the cluster no longer has (a smaller cluster; opts->mesh needed),
 * is read piece by piece from the rank files through the daemons there
 * are, with a parameter's optimizer state, put together in the client and
 * sharded onto that mesh (Partial pieces are reduced as a reshard to
 * Replicate would; a tensor Partial on two mesh dims with different
 * reductions is refused over missing ranks, and otherwise moved through
 * the client from the restored daemons). Existing tensors of those names
 * are replaced; a tensor saved without optimizer state is no longer a
 * parameter afterwards. Placements or a mesh that do not fit every tensor
 * restored are refused before anything loads. The moves after the load
 * are one reshard or put per tensor: one that fails there (a daemon out
 * of memory) leaves those before it moved, and the error says so. */
int dist_checkpoint_restore(dist_client *c, const char *dir,
                            const dist_checkpoint_opts *opts,
                            dist_checkpoint_info *info);

/* ---------------------------------------------------------------- layers */

/* A layer (semantics.md, "shard_layer") is a named tree: sublayers by name,
 * parameters and buffers by name, and a forward. Until dist_shard_layer its
 * parameters are float32 values in the client; dist_shard_layer then stores
 * every one in the daemons as a distributed tensor named
 * "<root name>.<dotted path>" ("mlp.fc1.weight") and forward and backward run
 * there, on each rank's pieces, as LocalLayer programs.
 *
 * Built in (float32, Paddle's layouts):
 *  - Linear(in, out, bias): weight [in, out], bias [out], y = x @ W + b.
 *    Weight Shard(1) is column-parallel (output Shard(last dim)); weight
 *    Shard(0) is row-parallel: a replicated input is sliced locally to the
 *    rank's rows (no traffic), the local products form a Partial(sum)
 *    output and the bias is added once (mesh coordinate 0); the layer then
 *    reshards that output to Replicate. An input Shard(last dim) on the same
 *    mesh dim as a Shard(0) weight is used as it is; an input sharded on
 *    another dim (data parallel) gives an output sharded the same way.
 *  - Embedding(num, dim): weight [num, dim]; input int64 ids, output
 *    [..., dim] (computed as one_hot(ids) @ W: Shard(0) of the weight is
 *    vocabulary-parallel, Shard(1) splits the output's last dim).
 *  - LayerNorm(dim, eps): weight (ones) and bias (zeros) [dim] over the last
 *    dim, biased variance. RMSNorm(dim, eps): weight (ones),
 *    y = x / sqrt(mean(x^2) + eps) * w. Their parameters stay Replicate.
 *  - Sequence: runs its children in the order they were added, each one's
 *    outputs the next one's inputs.
 * A custom layer's forward is a dist_program (dist_layer_program).
 *
 * Deterministic initialization: Linear and Embedding weights draw from a
 * splitmix64 stream seeded with the constructor's seed: value i is
 * bound * (2 * u - 1) with u = (splitmix64 output >> 11) * 2^-53, the
 * weight first (row-major), then the bias; bound = 1/sqrt(in) for Linear,
 * 1 for Embedding. dist_layer_fill_uniform gives the same numbers.
 * A size below 1, or a shape of more than 2^48 elements (as for any
 * tensor), is refused with DIST_EINVAL.
 * The calls building or reading a layer without a client (constructors,
 * set_name, add, add_param, set_param, n_params, param_at, ...) say why
 * they failed in the thread's dist_errmsg(NULL); given a NULL layer they
 * return DIST_EINVAL (-1 for dist_layer_n_params, NULL for dist_layer_find
 * and the tensor accessors) naming it there. */
typedef struct dist_layer dist_layer;

int dist_layer_linear(int64_t in, int64_t out, int bias, uint64_t seed,
                      dist_layer **l);
int dist_layer_embedding(int64_t num, int64_t dim, uint64_t seed,
                         dist_layer **l);
int dist_layer_layer_norm(int64_t dim, double eps, dist_layer **l);
int dist_layer_rms_norm(int64_t dim, double eps, dist_layer **l);
int dist_layer_sequence(dist_layer **l);
/* A layer whose forward is program p (the layer takes p, and frees it):
 * p's first n_inputs inputs are the layer's inputs (DTENSOR_LOCAL), the
 * rest its parameters and buffers, in the order they are added. p's
 * out_dist_attrs say where its outputs live; set grad placements on its
 * inputs as a LocalLayer's. Registered by dist_shard_layer. */
int dist_layer_program(dist_program *p, int n_inputs, dist_layer **l);
/* Frees the client's side of the tree (not the daemons' tensors: see
 * dist_layer_destroy). NULL is a no-op. */
void dist_layer_free(dist_layer *l);

/* The name of a root ("layer" by default) prefixes its stored tensors;
 * at most 100 characters of [A-Za-z0-9_.-]. */
int dist_layer_set_name(dist_layer *l, const char *name);
/* Adds child under name (no dots); the parent takes it. Not after
 * dist_shard_layer. */
int dist_layer_add(dist_layer *parent, const char *name, dist_layer *child);
/* A parameter (trained) or buffer (not) of a custom layer, float32,
 * row-major; data NULL means zeros. */
int dist_layer_add_param(dist_layer *l, const char *name, int ndim,
                         const int64_t *shape, const float *data);
int dist_layer_add_buffer(dist_layer *l, const char *name, int ndim,
                          const int64_t *shape, const float *data);
/* Replaces a parameter's (or buffer's) initial value, by dotted path from
 * l ("fc1.weight"); nbytes must match. Not after dist_shard_layer. */
int dist_layer_set_param(dist_layer *l, const char *path, const void *data,
                         size_t nbytes);
/* The child at a dotted path ("block.fc1"; "" is l), or NULL. */
dist_layer *dist_layer_find(dist_layer *l, const char *path);
/* splitmix64 uniform in [-bound, bound), as the constructors draw. */
void dist_layer_fill_uniform(uint64_t seed, float *out, size_t n, double bound);

/* One parameter or buffer, in Paddle's named_parameters order: a layer's
 * own (in the order added), then each child's, depth first. */
typedef struct dist_layer_param_info {
  char path[256];   /* "fc1.weight", relative to the layer asked */
  char name[256];   /* the stored tensor ("" before dist_shard_layer) */
  int is_buffer;
  dist_dtype dtype; /* DIST_FLOAT32 */
  int ndim;
  int64_t shape[DIST_MAX_DIMS];
  int nplacements;  /* 0 before dist_shard_layer */
  dist_placement placements[DIST_MAX_MESH_DIMS];
} dist_layer_param_info;
int dist_layer_n_params(const dist_layer *l);
int dist_layer_param_at(const dist_layer *l, int i, dist_layer_param_info *out);

/* shard_fn(name, sublayer, mesh, user) is called for every layer of the
 * tree in order, depth first, with its dotted path ("" for the root, "fc1",
 * "block.fc1"); it may place the sublayer's own parameters and buffers
 * with dist_layer_place_param. A non-zero return stops dist_shard_layer. */
typedef int (*dist_layer_shard_fn)(const char *name, dist_layer *sublayer,
                                   const dist_mesh *mesh, void *user);
/* Pre- and post-hooks around the root's forward (Paddle's input_fn and
 * output_fn). tensors[0..n-1] are the forward's inputs (outputs); the hook
 * may reshard them in place (dist_reshard) or replace an entry with a new
 * handle, which the layer then frees (never the daemon tensor it names).
 * Backward treats a hook's result as the same value in another layout. */
typedef int (*dist_layer_io_fn)(dist_client *c, dist_tensor **tensors, int n,
                                const dist_mesh *mesh, void *user);
/* Placements (one per mesh dim, Replicate or Shard) of parameter or buffer
 * `param` of l itself; meant for shard_fn. Checked by dist_shard_layer. A
 * param l does not have (DIST_ENOTFOUND) or a count n outside 1 to
 * DIST_MAX_MESH_DIMS (DIST_EINVAL) is refused saying why in
 * dist_errmsg(NULL); dist_shard_layer reports the first such refusal of a
 * shard_fn, whatever shard_fn returns. */
int dist_layer_place_param(dist_layer *l, const char *param,
                           const dist_placement *placements, int n);

/* Paddle's shard_layer: runs shard_fn (may be NULL: all Replicate), checks
 * every placement, then stores every parameter and buffer in the daemons of
 * mesh (dist_shard_tensor; SPMD trainers each call it with the same initial
 * values) and registers the forward programs. input_fn and output_fn (may be
 * NULL) become the root's hooks; user is passed to all three. A bad
 * placement or a mesh naming a rank outside the cluster fails with nothing
 * stored. l must be a root (not a child of another layer). */
int dist_shard_layer(dist_client *c, dist_layer *l, const dist_mesh *mesh,
                     dist_layer_shard_fn shard_fn, dist_layer_io_fn input_fn,
                     dist_layer_io_fn output_fn, void *user);

/* Forward of a sharded root on distributed inputs (borrowed; when input_fn
 * reshards one in place, the caller's handle is updated to match). Up to
 * max_out output handles go to out (free
 * each with dist_tensor_free); returns the number of outputs or a negative
 * dist_err. The daemon tensors of this step (outputs, activations, their
 * gradients) live until the next forward or dist_layer_release. */
int dist_layer_forward(dist_client *c, dist_layer *l,
                       dist_tensor *const *inputs, int n_inputs,
                       dist_tensor **out, int max_out);
/* Backward of the last forward. out_grads: one tensor per output (resharded
 * in place to the output's layout when it differs), or NULL when the single
 * output is a scalar (gradient 1). Each parameter's gradient is stored as
 * "<param name>.grad" with the parameter's placements (Partial gradients
 * reduced by dist_reshard), replacing the previous one. in_grads (may be
 * NULL) gets one new handle per forward input, or NULL where there is none. */
int dist_layer_backward(dist_client *c, dist_layer *l,
                        dist_tensor *const *out_grads, dist_tensor **in_grads);
/* Drops this step's tensors and what the daemons keep for backward, and
 * the tensors of a failed step that a daemon which did not answer it (no
 * reply within the deadline) may hold: the failed call did not ask it,
 * which would have cost a deadline a name. A tensor it could not delete is
 * said (the first failure's code), the step dropped all the same; such a
 * failed step's tensor is asked again at the next release, and a step
 * tensor whose delete a daemon did not answer (or could not be reached
 * for) at the client's next undo point (dist_invocation_release, which
 * the next step's release calls), by a single client. A release that
 * succeeds, with something to release or not, leaves dist_errmsg empty. */
int dist_layer_release(dist_client *c, dist_layer *l);

/* The value of a parameter (or its gradient), by dotted path: the client's
 * initial value before dist_shard_layer (c may be NULL), else the full
 * tensor from the daemons. *data is malloc'd (free()). */
int dist_layer_read_param(dist_client *c, const dist_layer *l,
                          const char *path, void **data, size_t *nbytes);
int dist_layer_read_grad(dist_client *c, const dist_layer *l, const char *path,
                         void **data, size_t *nbytes);
/* The stored parameter (gradient) of a sharded layer; NULL when none. */
const dist_tensor *dist_layer_param_tensor(const dist_layer *l, const char *path);
const dist_tensor *dist_layer_grad_tensor(const dist_layer *l, const char *path);

/* The parameter service for every parameter of a sharded root (buffers are
 * not trained): configure every one with opts, or push every stored
 * gradient as one step (dist_param_push_tensors as `trainer`), each
 * applied to every parameter or to none (one refused, as by a daemon's
 * memory limit, changes none); or push a whole gradient of one parameter
 * from the client (the size must match its shape). SPMD trainers each
 * call the first two. */
int dist_layer_configure_optimizer(dist_client *c, dist_layer *l,
                                   const dist_param_opts *opts);
int dist_layer_step(dist_client *c, dist_layer *l, int trainer);
int dist_layer_push_grad(dist_client *c, dist_layer *l, const char *path,
                         int trainer, const void *grad, size_t nbytes);
/* Releases the step, unregisters the programs, deletes the stored
 * parameters, buffers and gradients, and frees l. NULL is a no-op. What a
 * failed step left on a daemon that could not be reached is undone at
 * the client's next undo point (a single client's). */
int dist_layer_destroy(dist_client *c, dist_layer *l);

/* ---------------------------------------------------------------- helpers */

size_t dist_dtype_size(dist_dtype dt);
const char *dist_dtype_name(dist_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
