/* A parameter resharded in place takes its optimizer state along: each
 * state buffer (momentum, Adam's m and v) is resharded exactly as the
 * values are, so the next update is the one it would have been. That holds
 * on the parameter's own mesh and onto another mesh of the same shape, for
 * Shard / Replicate placements; onto Partial placements the state cannot
 * follow (a sum of moments is not the moment of a sum), and the tensor
 * stops being a parameter. Onto another mesh, rank k of the source tells
 * rank k of the destination, which never held the state, what the
 * parameter is (optimizer, updates so far), ahead of the buffers.
 *
 * A parameter with pushes pending for an unfinished synchronous update on
 * any rank of its mesh is not resharded: the pushes would be lost, and the
 * trainers that made them would wait for an update that never comes. While
 * the reshard runs, the parameter's pushes are refused
 * (distd_param_pause_pushes). */
#ifndef DISTD_PARAM_RESHARD_H
#define DISTD_PARAM_RESHARD_H

#include "param_service.h"
#include "server.h"

/* A parameter's state on its way through an in-place reshard. */
typedef struct distd_param_move {
  int follows; /* the state goes to the destination */
  distd_param_cfg cfg;
  uint64_t step;
  int nstate;
  dist_placement dst_p[DIST_MAX_MESH_DIMS];
  distd_param_snapshot snap; /* on ranks of the source mesh */
} distd_param_move;

/* Before the values move, on every rank of the source and destination
 * meshes; `held` says this rank holds name as a parameter (it is then in
 * the source mesh, and so is every rank of it). Fails (DIST_EUNAVAIL, the
 * same message on every rank, the destination's included) when pushes are
 * pending on any rank of the source mesh. Exchanges use op ids derived
 * from op_id. */
int distd_param_move_begin(distd_server *s, const char *name, int held,
                           const dist_mesh_desc *src_mesh, const dist_mesh_desc *dst_mesh,
                           const dist_placement *dst_p, uint64_t op_id,
                           int64_t deadline_ms, distd_param_move *m, dist_errbuf *eb);

/* After the values were resharded into out (NULL on a rank that no longer
 * holds a piece), on the same ranks: *entry is the parameter to install
 * once out is stored, or NULL when name is not one afterwards (call
 * distd_param_forget). */
int distd_param_move_finish(distd_server *s, distd_param_move *m, const char *name,
                            const distd_tensor *out, const dist_mesh_desc *src_mesh,
                            const dist_mesh_desc *dst_mesh, uint64_t op_id,
                            int64_t deadline_ms, distd_param_entry **entry,
                            dist_errbuf *eb);
void distd_param_move_free(distd_param_move *m);
/* distd_reshard_abort for the exchanges of the state's move. */
void distd_param_move_abort(distd_server *s, uint64_t op_id, int ndim, const int *ranks, int n,
                            const char *why);

#endif
