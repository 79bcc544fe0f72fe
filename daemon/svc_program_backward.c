/* dist.v1.Program/Backward: the gradients of a kept invocation's inputs,
 * stored as distributed tensors on the inputs' meshes (see the service
 * comment in proto/dist/v1/program.proto). */
#include <stdlib.h>
#include <string.h>

#include "holds.h"
#include "methods.h"
#include "pbuf.h"
#include "program.h"
#include "program_outputs.h"
#include "program_registry.h"
#include "program_values.h"
#include "subop.h"
#include "vote.h"
#include "wire.h"

static int out_grads_of(distd_server *s, const distd_invocation *inv,
                        const Dist__V1__ProgramBackwardRequest *rq,
                        distd_tval **g, dist_errbuf *eb) {
  size_t n = distd_invocation_n_outputs(inv);
  if (rq->n_out_grads != n)
    return dist_fail(eb, DIST_EINVAL, "%zu output gradients for %zu outputs",
                     rq->n_out_grads, n);
  for (size_t k = 0; k < n; k++) {
    const Dist__V1__ProgramArg *a = rq->out_grads[k];
    int rc = 0;
    if (a->tensor && a->tensor[0])
      rc = distd_value_from_tensor(s, a->tensor, &g[k], NULL, eb);
    else if (a->n_shape || a->data.len)
      rc = distd_value_from_arg(a, &g[k], eb);
    if (rc) {
      dist_errbuf_prefix(eb, "gradient of output %zu: ", k);
      return rc;
    }
  }
  return 0;
}

/* The mesh and placements input i's gradient is stored with: the input's
 * grad_placements, or else the input tensor's own. */
static int grad_attr(const Dist__V1__ProgramInput *in,
                     const distd_input_origin *o, distd_attr *a,
                     dist_errbuf *eb) {
  a->mesh = o->mesh;
  memcpy(a->placements, o->placements, sizeof a->placements);
  if (!in->n_grad_placements) return 0;
  if (in->n_grad_placements != (size_t)o->mesh.ndim)
    return dist_fail(eb, DIST_EINVAL, "%zu grad placements for a mesh of %d "
                     "dims", in->n_grad_placements, o->mesh.ndim);
  if (dist_placements_from_pb(in->grad_placements, in->n_grad_placements,
                              a->placements, eb) != 0)
    return eb->code;
  return dist_placements_check(&a->mesh, a->placements, a->mesh.ndim,
                               o->global.ndim, eb);
}

/* Makes the gradient of every DTENSOR_LOCAL input that has one and a
 * name, storing none: a distributed tensor of the input's global shape,
 * whose piece on this rank is the local gradient (no communication). */
static int make_grads(distd_server *s, const distd_kept_invocation *k,
                      const Dist__V1__ProgramBackwardRequest *rq, distd_staged *o,
                      dist_errbuf *eb) {
  const Dist__V1__Program *pb =
      distd_program_message(distd_invocation_program(k->inv));
  for (size_t i = 0; i < pb->n_inputs && i < rq->n_grad_names; i++) {
    const distd_tval *g = distd_invocation_input_grad(k->inv, i);
    const Dist__V1__ProgramInput *in = pb->inputs[i];
    if (!g || !rq->grad_names[i][0]) continue;
    distd_attr a;
    int rc = k->origins[i].is_tensor
                 ? grad_attr(in, &k->origins[i], &a, eb)
                 : dist_fail(eb, DIST_EINVAL, "not a distributed tensor: "
                             "its gradient has no mesh (use return_values)");
    if (rc == 0)
      rc = distd_value_tensor(s, rq->grad_names[i], g, &k->origins[i].global, &a,
                              rq->replace, o, i, eb);
    if (rc) {
      dist_errbuf_prefix(eb, "gradient of input %zu%s%s%s: ", i,
                         in->name[0] ? " ('" : "", in->name,
                         in->name[0] ? "')" : "");
      return rc;
    }
  }
  return 0;
}

/* A backward's reply room: the gradients' descriptions and values, and
 * which inputs have one, taken before the vote (distd_reply_room). */
typedef struct backward_room {
  distd_reply_room r;
  protobuf_c_boolean *has;
} backward_room;

static int backward_room_take(backward_room *b, const Dist__V1__ProgramBackwardRequest *rq,
                              size_t n, dist_errbuf *eb) {
  b->has = calloc(n + 1, sizeof *b->has);
  if (!b->has) return dist_fail(eb, DIST_ENOMEM, "out of memory for the backward's reply");
  return distd_reply_room_take(&b->r, n, rq->return_values ? n : 0, "backward", eb);
}

static void backward_room_free(backward_room *b) {
  distd_reply_room_free(&b->r);
  free(b->has);
  b->has = NULL;
}

/* Made in the room taken before the vote: it cannot fail. */
static void reply_backward(distd_server *s, const distd_kept_invocation *k,
                           distd_staged *o, backward_room *room, grpc_byte_buffer **reply) {
  Dist__V1__ProgramBackwardReply rp = DIST__V1__PROGRAM_BACKWARD_REPLY__INIT;
  for (size_t i = 0; i < o->n; i++) {
    const distd_tval *g = distd_invocation_input_grad(k->inv, i);
    room->has[i] = g != NULL;
    if (i < room->r.values.n) distd_values_set(&room->r.values, i, g);
  }
  rp.grads = distd_describe_into(&room->r.d, o->tensors, o->n, s->rank);
  rp.n_grads = rp.n_has_grad = o->n;
  rp.has_grad = room->has;
  rp.n_values = room->r.values.n;
  rp.values = room->r.values.ptrs;
  *reply = dist_pb_to_bb(&rp.base);
}

/* Whether the request stores any gradient: only then do the daemons vote
 * (a backward that only returns values changes nothing they hold). */
static int stores_grads(const Dist__V1__ProgramBackwardRequest *rq) {
  for (size_t i = 0; i < rq->n_grad_names; i++)
    if (rq->grad_names[i][0]) return 1;
  return 0;
}

/* Runs backward on the invocation and makes the gradients it stores. */
static int backward(distd_server *s, const distd_kept_invocation *k,
                    const Dist__V1__ProgramBackwardRequest *rq, distd_staged *o,
                    dist_errbuf *eb) {
  size_t n_out = distd_invocation_n_outputs(k->inv);
  distd_tval **grads = calloc(n_out + 1, sizeof *grads);
  int rc = grads ? 0 : dist_fail(eb, DIST_ENOMEM, "out of memory");
  if (rc == 0 && rq->n_out_grads) rc = out_grads_of(s, k->inv, rq, grads, eb);
  if (rc == 0 &&
      (rc = distd_invocation_backward(k->inv, rq->n_out_grads ? grads : NULL, eb)) != 0)
    dist_errbuf_prefix(eb, "backward of invocation %llu: ",
                       (unsigned long long)rq->invocation_id);
  if (rc == 0) rc = distd_staged_init(o, distd_program_n_inputs(distd_invocation_program(k->inv)),
                                     eb);
  if (rc == 0) rc = make_grads(s, k, rq, o, eb);
  for (size_t j = 0; grads && j < n_out; j++) distd_tval_unref(grads[j]);
  free(grads);
  return rc;
}

/* The names the gradients are stored under (the non-empty grad_names),
 * in *n; NULL when out of memory. */
static const char **stored_names(const Dist__V1__ProgramBackwardRequest *rq, size_t *n) {
  const char **names = calloc(rq->n_grad_names + 1, sizeof *names);
  *n = 0;
  for (size_t i = 0; names && i < rq->n_grad_names; i++)
    if (rq->grad_names[i][0]) names[(*n)++] = rq->grad_names[i];
  return names;
}

/* The gradients are stored by every daemon of the request's ranks or by
 * none, as an invocation's outputs are, their names held meanwhile as the
 * outputs' are; the vote runs under a step of the invocation id of its
 * own. The kept invocation is taken first, so that every daemon has used
 * it up whatever the verdict (backward runs once). */
DISTD_HANDLER(program_backward) {
  const Dist__V1__ProgramBackwardRequest *rq = (const void *)req;
  int ranks[DIST_MAX_MESH_RANKS], n = distd_vote_ranks(s, rq->ranks, rq->n_ranks, ranks);
  uint64_t op = distd_subop(rq->invocation_id, DISTD_STEP_BACKWARD);
  distd_kept_invocation *k = NULL;
  distd_staged o = {0};
  size_t nheld = 0;
  const char **names = stored_names(rq, &nheld);
  int rc = distd_registry_take(s->programs, rq->invocation_id, &k, eb), held = -1;
  uint64_t batch = 0;
  if (rc == 0)
    rc = held = names ? distd_holds_take_all(s->holds, names, nheld, DISTD_HOLD_OUTPUT,
                                             ci->deadline_ms, &batch, eb)
                      : dist_fail(eb, DIST_ENOMEM, "out of memory");
  if (rc == 0) rc = backward(s, k, rq, &o, eb);
  backward_room room = {0};
  if (rc == 0) rc = backward_room_take(&room, rq, o.n, eb);
  if (stores_grads(rq))
    rc = distd_vote_staged(s, ranks, n, op, ci->deadline_ms, "backward", rc, &o, 0, eb);
  if (rc == 0) {
    distd_staged_store(s->store, &o);
    reply_backward(s, k, &o, &room, reply);
  }
  backward_room_free(&room);
  if (held == 0) distd_holds_release_batch(s->holds, batch);
  free(names);
  distd_staged_free(&o);
  distd_kept_invocation_free(k); /* backward runs once: nothing is kept */
  return rc;
}
