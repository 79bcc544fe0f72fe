/* A push or a configure that every daemon of the parameter's mesh received
 * under one op id is applied by all of them or by none (param.proto).
 * Each daemon prepares it (distd_param_stage, distd_param_configure), the
 * daemons exchange their verdicts over the data plane, and each applies
 * it only when every verdict is yes. A daemon that said no keeps its own
 * error; the others fail with the same code and a message naming the rank
 * that refused and its reason, so the trainer learns why whichever reply
 * it reads.
 *
 * Without a coordinator that outlives failures, one window stays open, as
 * in any two-phase commit: a daemon lost after every verdict was exchanged
 * may not have applied what the others did (its state is gone with it). */
#ifndef DISTD_PARAM_VOTE_H
#define DISTD_PARAM_VOTE_H

#include <stdint.h>

#include "dist.pb-c.h"
#include "mesh.h"
#include "server.h"

/* Run by every daemon of mesh with the same op_id. verdict is 0 when this
 * daemon prepared `what` ("push", "configure"), else its error code (its
 * message in eb). Returns 0 when every daemon said yes; otherwise an
 * error, described in eb. */
int distd_param_vote(distd_server *s, const dist_mesh_desc *mesh, uint64_t op_id,
                     int64_t deadline_ms, const char *what, int verdict, dist_errbuf *eb);

/* The mesh a request names for its vote, parsed into *mesh: 0 when it
 * names none, 1 when it does and this daemon is in it, -1 (eb says why)
 * otherwise. name is the parameter's, for messages. */
int distd_param_vote_mesh(distd_server *s, const Dist__V1__Mesh *pb, const char *name,
                          dist_mesh_desc *mesh, dist_errbuf *eb);

#endif
