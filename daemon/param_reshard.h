/* A parameter resharded in place takes its optimizer state along: each
 * state buffer (momentum, Adam's m and v) is resharded exactly as the
 * values are, so the next update is the one it would have been. That holds
 * on the parameter's own mesh and for Shard / Replicate placements; onto
 * another mesh (whose new ranks never held the state) or Partial
 * placements the state cannot follow, and the tensor stops being a
 * parameter. On its own mesh, a parameter with pushes pending for an
 * unfinished synchronous update on any of its daemons is not resharded:
 * the pushes would be lost, and the trainers that made them would wait
 * for an update that never comes. While the reshard runs, the parameter's
 * pushes are refused (distd_param_hold). */
#ifndef DISTD_PARAM_RESHARD_H
#define DISTD_PARAM_RESHARD_H

#include "param_service.h"
#include "server.h"

/* On every rank of the reshard, after the values were resharded into out
 * (NULL on a rank that no longer holds a piece): *entry is the parameter to
 * install once out is stored, or NULL when name is not one afterwards
 * (call distd_param_forget). Every rank of the mesh holds the same
 * parameters, so all run the same exchanges (op ids derived from op_id). */
int distd_param_reshard(distd_server *s, const char *name, const distd_tensor *out,
                        const dist_mesh_desc *src_mesh, const dist_mesh_desc *dst_mesh,
                        uint64_t op_id, int64_t deadline_ms, distd_param_entry **entry,
                        dist_errbuf *eb);

/* Before an in-place reshard on the same mesh, on every rank, with name
 * held (distd_param_hold) when it is a parameter: fails
 * (DIST_EUNAVAIL, the same message on every rank of src_mesh) when name is
 * a parameter with pushes pending on any rank of its mesh. The ranks of
 * the mesh hold the same parameters, so all of them exchange their counts
 * (an op id derived from op_id), or none does. */
int distd_param_reshard_check(distd_server *s, const char *name,
                              const dist_mesh_desc *src_mesh, uint64_t op_id,
                              int64_t deadline_ms, dist_errbuf *eb);

#endif
