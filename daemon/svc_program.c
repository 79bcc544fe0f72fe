/* dist.v1.Program: Register / Invoke / Backward / Release, the daemon side
 * of LocalLayer (see the service comment in proto/dist/v1/program.proto).
 *
 * Invoke turns each argument into a local value (a stored tensor's local
 * piece, or bytes), runs the program with the engine (daemon/program/), and
 * makes each output a distributed tensor with its out_dist_attrs; the
 * daemons invoked store them all or none (vote.h). The invocation is kept
 * in the registry for Backward, which stores the input gradients as
 * distributed tensors on the inputs' meshes. */
#include <stdlib.h>
#include <string.h>

#include "holds.h"
#include "methods.h"
#include "op_refuse.h"
#include "pbuf.h"
#include "peer.h"
#include "program.h"
#include "program_outputs.h"
#include "program_values.h"
#include "program_registry.h"
#include "store.h"
#include "tensor_meta.h"
#include "vote.h"
#include "wire.h"

static int parse_out_attr(distd_server *s, const Dist__V1__Program *pb,
                          size_t k, distd_attr *a, dist_errbuf *eb) {
  const Dist__V1__DistAttr *d = pb->out_dist_attrs[k];
  int rc = distd_attr_parse(s, d->mesh, d->placements, d->n_placements, a, eb);
  if (rc) dist_errbuf_prefix(eb, "out_dist_attrs[%zu]: ", k);
  return rc;
}

/* Whether this rank makes output k a distributed tensor: outputs may lie
 * on different meshes (a pipeline's stages), and a rank stores only those
 * of its own; it still runs the whole program, as Paddle's LocalLayer
 * does on every rank. */
static int holds_output(distd_server *s, const distd_attr *a) {
  return dist_mesh_index_of(&a->mesh, s->rank) >= 0;
}

/* ---------------------------------------------------------------- Register */

/* Every out_dist_attr parses, and this rank is in one of their meshes at
 * least: in none, it would store nothing (libdist registers such a
 * trainer's program nowhere, program_outside.c). */
static int check_out_attrs(distd_server *s, const Dist__V1__Program *pb, dist_errbuf *eb) {
  int held = 0;
  for (size_t k = 0; k < pb->n_out_dist_attrs; k++) {
    distd_attr a;
    int rc = parse_out_attr(s, pb, k, &a, eb);
    if (rc) return rc;
    held |= holds_output(s, &a);
  }
  if (pb->n_out_dist_attrs && !held)
    return dist_fail(eb, DIST_EINVAL, "out_dist_attrs: rank %d is in none of the outputs' "
                     "meshes", s->rank);
  return 0;
}

DISTD_HANDLER(program_register) {
  (void)ci;
  const Dist__V1__ProgramRegisterRequest *rq = (const void *)req;
  if (!rq->program) return dist_fail(eb, DIST_EINVAL, "no program given");
  distd_program *p = NULL;
  int rc = distd_program_new(rq->program, &p, eb);
  if (rc) return rc;
  if ((rc = check_out_attrs(s, distd_program_message(p), eb))) {
    distd_program_free(p);
    return rc;
  }
  Dist__V1__ProgramRegisterReply rp = DIST__V1__PROGRAM_REGISTER_REPLY__INIT;
  rc = distd_registry_add(s->programs, p, rq->invocation_ttl_seconds,
                          &rp.handle, eb);
  if (rc) return rc;
  rp.rank = (uint32_t)s->rank;
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}

/* ---------------------------------------------------------------- outputs */

/* Makes every output this rank holds, storing none. Goes through each
 * such output's shape exchange even after a failure, so that the peers are
 * told; an output on a mesh without this rank is left to its members
 * (nothing staged, an empty description in the reply). */
static int make_outputs(distd_server *s, const distd_call_info *ci,
                        const Dist__V1__Program *pb,
                        const Dist__V1__ProgramInvokeRequest *rq,
                        distd_invocation *inv, int verdict, distd_staged *o,
                        dist_errbuf *eb) {
  int rc = verdict;
  for (size_t k = 0; k < pb->n_outputs; k++) {
    distd_attr a;
    dist_shape global;
    const distd_tval *v = inv ? distd_invocation_output(inv, k) : NULL;
    int prc = parse_out_attr(s, pb, k, &a, rc ? NULL : eb);
    if (prc) { /* checked at Register: cannot differ now */
      rc = rc ? rc : prc;
      continue;
    }
    if (!holds_output(s, &a)) continue;
    int grc = distd_value_global(s, ci->deadline_ms, &a, rq->op_id + 1 + k, rc, v, &global,
                                 eb);
    if (rc || grc) {
      if (!rc) dist_errbuf_prefix(eb, "output %zu: ", k);
      rc = rc ? rc : grc;
      continue;
    }
    rc = distd_value_tensor(s, rq->out_names[k], v, &global, &a, rq->replace,
                            o, k, eb);
    if (rc) dist_errbuf_prefix(eb, "output %zu ('%s'): ", k, rq->out_names[k]);
  }
  return rc;
}

static int check_out_names(const Dist__V1__Program *pb,
                           const Dist__V1__ProgramInvokeRequest *rq,
                           dist_errbuf *eb) {
  if (rq->n_out_names != pb->n_outputs)
    return dist_fail(eb, DIST_EINVAL, "%zu output names for %zu outputs",
                     rq->n_out_names, pb->n_outputs);
  for (size_t k = 0; k < rq->n_out_names; k++)
    if (!rq->out_names[k][0])
      return dist_fail(eb, DIST_EINVAL, "output %zu has no name", k);
  return 0;
}

/* ---------------------------------------------------------------- replies */

/* Made in the room taken before the vote: it cannot fail. */
static void reply_invoke(distd_server *s, const Dist__V1__ProgramInvokeRequest *rq,
                         distd_invocation *inv, distd_staged *o, distd_reply_room *room,
                         grpc_byte_buffer **reply) {
  Dist__V1__ProgramInvokeReply rp = DIST__V1__PROGRAM_INVOKE_REPLY__INIT;
  for (size_t k = 0; k < room->values.n; k++)
    distd_values_set(&room->values, k, distd_invocation_output(inv, k));
  rp.outputs = distd_describe_into(&room->d, o->tensors, o->n, s->rank);
  rp.n_outputs = o->n;
  rp.n_values = room->values.n;
  rp.values = room->values.ptrs;
  rp.invocation_id = rq->op_id;
  *reply = dist_pb_to_bb(&rp.base);
}

/* ---------------------------------------------------------------- Invoke */

/* Binds the arguments and runs the program: the local half of Invoke. */
static int run_local(distd_server *s, distd_program *p,
                     const Dist__V1__ProgramInvokeRequest *rq,
                     distd_input_origin *origins, distd_invocation **inv,
                     dist_errbuf *eb) {
  const Dist__V1__Program *pb = distd_program_message(p);
  size_t n = pb->n_inputs;
  distd_tval **vals = calloc(n + 1, sizeof *vals);
  if (!vals) return dist_fail(eb, DIST_ENOMEM, "out of memory binding %zu arguments", n);
  int rc = check_out_names(pb, rq, eb);
  if (rc == 0) rc = distd_bind_args(s, pb, rq->args, rq->n_args, vals, origins, eb);
  if (rc == 0) {
    distd_run_env env = {(uint32_t)s->rank};
    rc = distd_program_run(p, &env, vals, inv, eb);
  }
  for (size_t i = 0; i < n; i++) distd_tval_unref(vals[i]);
  free(vals);
  return rc;
}

/* The request's ranks must be the program's outputs' (libdist sends those,
 * in order of first mention): a vote among others would wait for daemons
 * that never vote. */
static int check_ranks(const Dist__V1__Program *pb, const int *ranks, int n,
                       dist_errbuf *eb) {
  int want[DIST_MAX_MESH_RANKS], m = 0;
  for (size_t k = 0; k < pb->n_out_dist_attrs; k++) {
    dist_mesh_desc mesh;
    if (dist_mesh_from_pb(pb->out_dist_attrs[k]->mesh, &mesh, NULL) == 0)
      m = dist_ranks_union_add(want, m, DIST_MAX_MESH_RANKS, &mesh);
  }
  if (m == n && memcmp(want, ranks, sizeof *ranks * (size_t)n) == 0) return 0;
  return dist_fail(eb, DIST_EINVAL, "ranks: the request names %d daemons to store the "
                   "outputs, not the %d of the outputs' meshes in their order", n, m);
}

/* How many of a refused invocation's output ids (op_id + 1 + k) are
 * aborted: at most as many as OpAbort's (svc_op_abort.c). */
static size_t refused_outputs(const Dist__V1__ProgramInvokeRequest *rq) {
  return rq->n_out_names < DIST_MAX_MESH_RANKS ? rq->n_out_names : DIST_MAX_MESH_RANKS;
}

/* Without the program this daemon makes no outputs, but the others may be
 * waiting for it in the outputs' shape exchanges and in the vote: it ends
 * the first and votes no in the second, so they fail now, naming why. */
static int refuse_unknown(distd_server *s, const distd_call_info *ci,
                          const Dist__V1__ProgramInvokeRequest *rq, int rc, dist_errbuf *eb) {
  int ranks[DIST_MAX_MESH_RANKS];
  int n = distd_vote_ranks(s, rq->ranks, rq->n_ranks, ranks);
  if (n < 2) return rc;
  for (size_t k = 0; k < refused_outputs(rq); k++)
    distd_abort_op(s->peers, rq->op_id + 1 + k, ranks, n, dist_errbuf_msg(eb));
  return distd_vote(s, ranks, n, rq->op_id, ci->deadline_ms, "invocation", rc, NULL, eb);
}

/* A place in the registry for the invocation, taken before the vote: a
 * full table refuses the invocation on every daemon, instead of failing it
 * here after the others stored its outputs. */
static int reserve_invocation(distd_server *s, const Dist__V1__ProgramInvokeRequest *rq,
                              dist_errbuf *eb) {
  distd_kept_invocation *k = calloc(1, sizeof *k);
  if (!k) return dist_fail(eb, DIST_ENOMEM, "out of memory keeping an invocation");
  k->id = rq->op_id;
  k->handle = rq->handle;
  return distd_registry_keep(s->programs, k, eb);
}

/* Makes the outputs, reserves the invocation's place and takes the
 * reply's memory; stores them and fills it if every daemon invoked could.
 * Nothing allocated after the vote can fail it on one daemon only (a
 * reply made after it deleted the outputs there and released the
 * invocation, while the others kept both). The output names are held
 * meanwhile (holds.h), so that no put, reshard or restore of one of them
 * lands between this daemon's checks and its store; a name held by one
 * of those is this daemon's no. */
static int invoke(distd_server *s, const distd_call_info *ci, distd_program *p,
                  const Dist__V1__ProgramInvokeRequest *rq, const int *ranks, int n,
                  distd_staged *o, grpc_byte_buffer **reply, dist_errbuf *eb) {
  const Dist__V1__Program *pb = distd_program_message(p);
  const char *const *names = (const char *const *)rq->out_names;
  distd_invocation *inv = NULL;
  distd_input_origin *origins = calloc(pb->n_inputs + 1, sizeof *origins);
  uint64_t batch = 0;
  int held = distd_holds_take_all(s->holds, names, rq->n_out_names, DISTD_HOLD_OUTPUT,
                                  ci->deadline_ms, &batch, eb);
  int verdict = held ? held
                : origins ? run_local(s, p, rq, origins, &inv, eb)
                          : dist_fail(eb, DIST_ENOMEM, "out of memory");
  verdict = make_outputs(s, ci, pb, rq, inv, verdict, o, eb);
  distd_reply_room room = {0};
  if (verdict == 0)
    verdict = distd_reply_room_take(&room, o->n, rq->return_values ? o->n : 0, "invocation", eb);
  int reserved = verdict == 0 && !rq->no_grad;
  if (reserved && (verdict = reserve_invocation(s, rq, eb)) != 0) reserved = 0;
  /* A program without outputs has no out_dist_attrs, so no ranks vote. */
  int rc = distd_vote_staged(s, ranks, n, rq->op_id, ci->deadline_ms, "invocation", verdict, o,
                             0, eb);
  if (rc == 0) {
    distd_staged_store(s->store, o);
    reply_invoke(s, rq, inv, o, &room, reply); /* packed: independent of inv */
  }
  distd_reply_room_free(&room);
  if (rc == 0 && reserved) {
    distd_registry_fill(s->programs, rq->op_id, inv, origins);
    inv = NULL;
    origins = NULL;
  } else if (reserved) {
    distd_registry_release(s->programs, rq->op_id, NULL);
  }
  if (!held) distd_holds_release_batch(s->holds, batch);
  distd_invocation_release(inv);
  free(origins);
  return rc;
}

DISTD_HANDLER(program_invoke) {
  const Dist__V1__ProgramInvokeRequest *rq = (const void *)req;
  distd_program *p = NULL;
  int rc = distd_registry_get(s->programs, rq->handle, &p, eb);
  if (rc) return refuse_unknown(s, ci, rq, rc, eb);
  const Dist__V1__Program *pb = distd_program_message(p);
  int ranks[DIST_MAX_MESH_RANKS], n = distd_vote_ranks(s, rq->ranks, rq->n_ranks, ranks);
  distd_staged o;
  rc = distd_staged_init(&o, pb->n_outputs, eb);
  if (rc == 0 && rq->n_ranks) rc = check_ranks(pb, ranks, n, eb);
  if (rc == 0) rc = invoke(s, ci, p, rq, ranks, n, &o, reply, eb);
  else if (n >= 2) /* the others would wait for this rank's outputs and vote */
    distd_refuse_op(s, rq->op_id, (uint32_t)refused_outputs(rq), ranks, n, "its daemon",
                    dist_errbuf_msg(eb));
  distd_staged_free(&o);
  distd_program_free(p);
  return rc;
}

/* ---------------------------------------------------------------- Release */

DISTD_HANDLER(program_release) {
  (void)ci;
  const Dist__V1__ProgramReleaseRequest *rq = (const void *)req;
  distd_program_registry *r = s->programs;
  int rc = 0;
  if (!rq->handle && !rq->invocation_id)
    return dist_fail(eb, DIST_EINVAL, "release names neither an invocation "
                     "nor a program handle");
  if (rq->invocation_id) rc = distd_registry_release(r, rq->invocation_id, eb);
  if (rc == 0 && rq->handle) rc = distd_registry_remove(r, rq->handle, eb);
  if (rc) return rc;
  Dist__V1__ProgramReleaseReply rp = DIST__V1__PROGRAM_RELEASE_REPLY__INIT;
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}
