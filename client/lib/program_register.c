/* Registration of a LocalLayer program: the builder's program translated to
 * the wire's ids and sent to the daemons it runs on (RegisterProgram), and
 * its release (dist.v1.LocalLayer, program.proto). */
#include <stdlib.h>

#include "program_internal.h"

/* The program message of p, pointing into p; free with built_free. */
typedef struct built {
  Dist__V1__Program pb;
  Dist__V1__ProgramNode **nodes;
  uint32_t *outputs;
  Dist__V1__DistAttr **attrs;
} built;

static void built_free(built *b) {
  free(b->nodes);
  free(b->outputs);
  free(b->attrs);
}

/* Translates builder ids into program ids: inputs first, then every
 * node's outputs in node order. */
static int build(dist_program *p, built *b) {
  int *first = calloc((size_t)p->n_nodes + 1, sizeof *first);
  b->nodes = calloc((size_t)p->n_nodes + 1, sizeof *b->nodes);
  b->outputs = calloc((size_t)p->n_outputs + 1, sizeof *b->outputs);
  b->attrs = calloc((size_t)p->n_attrs + 1, sizeof *b->attrs);
  if (!first || !b->nodes || !b->outputs || !b->attrs) {
    free(first);
    built_free(b);
    return DIST_ENOMEM;
  }
  int next = p->n_inputs;
  for (int j = 0; j < p->n_nodes; j++) {
    first[j] = next;
    next += p->nodes[j]->pb.op == DIST__V1__OP_KIND__OP_TOPK ? 2 : 1;
  }
#define PROG_ID(id)                                                     \
  ((uint32_t)(p->values[id].input >= 0                                  \
                  ? p->values[id].input                                 \
                  : first[p->values[id].node] + p->values[id].slot))
  for (int j = 0; j < p->n_nodes; j++) {
    bnode *n = p->nodes[j];
    for (int k = 0; k < n->n_in; k++) n->ids[k] = PROG_ID(n->ins[k]);
    b->nodes[j] = &n->pb;
  }
  for (int k = 0; k < p->n_outputs; k++) b->outputs[k] = PROG_ID(p->outputs[k]);
#undef PROG_ID
  for (int k = 0; k < p->n_attrs; k++) b->attrs[k] = &p->attrs[k]->pb;
  free(first);
  dist__v1__program__init(&b->pb);
  b->pb.version = 1;
  b->pb.name = p->name;
  b->pb.n_inputs = (size_t)p->n_inputs;
  b->pb.inputs = p->inputs;
  b->pb.n_nodes = (size_t)p->n_nodes;
  b->pb.nodes = b->nodes;
  b->pb.n_outputs = (size_t)p->n_outputs;
  b->pb.outputs = b->outputs;
  b->pb.n_out_dist_attrs = (size_t)p->n_attrs;
  b->pb.out_dist_attrs = b->attrs;
  return 0;
}

/* The ranks of the outputs' meshes, each once, in order of first mention
 * (the daemons derive the same list from the program). */
int dist_prog_output_ranks(const dist_program *p, int *ranks) {
  int n = 0;
  for (int a = 0; a < p->n_attrs; a++)
    n = dist_ranks_union_add(ranks, n, DIST_MAX_MESH_RANKS, &p->attrs[a]->mesh);
  return n;
}

/* Where p runs: SPMD, this trainer's daemon; a single client, every rank
 * of the out_dist_attrs meshes (every daemon it reaches when there are
 * none, so the daemons can report the count mismatch). */
static int program_targets(dist_client *c, const dist_program *p,
                           int *targets) {
  if (c->spmd_rank >= 0) {
    targets[0] = c->spmd_rank;
    return 1;
  }
  int n = dist_prog_output_ranks(p, targets);
  for (int i = 0; i < n; i++)
    if (!dist_client_reaches(c, targets[i]))
      return dist_refuse_unreached(c, "an out_dist_attr", targets[i], "an out_dist_attr "
                                   "names rank %d, but the client knows %d daemons",
                                   targets[i], c->n);
  for (int p = 0; n == 0 && p < c->n; p++) targets[p] = dist_reached_rank(c, p);
  return n ? n : c->n;
}

int dist_prog_release_one(dist_client *c, int rank, uint64_t handle, uint64_t invocation,
                          int *unanswered) {
  Dist__V1__ProgramReleaseRequest rq = DIST__V1__PROGRAM_RELEASE_REQUEST__INIT;
  rq.handle = handle;
  rq.invocation_id = invocation;
  return dist_call_one_heard(c, rank, LL_METHOD("Release"), &rq.base,
                             &dist__v1__program_release_reply__descriptor, unanswered);
}

/* Sends Release(handle) to the given daemons, best effort. */
void dist_prog_release_on(dist_client *c, const int *targets, int n, const uint64_t *handles) {
  dist_errbuf keep = c->err;
  for (int i = 0; i < n; i++) dist_prog_release_one(c, targets[i], handles[i], 0, NULL);
  c->err = keep;
}

/* Whether this SPMD trainer holds no piece of some output: it then keeps
 * the program checked, to describe those outputs (program_outside.c). */
static int any_output_elsewhere(const dist_client *c, const dist_program *p) {
  for (int k = 0; k < p->n_attrs; k++)
    if (dist_prog_output_elsewhere(c, p, k)) return 1;
  return 0;
}

int dist_program_register(dist_client *c, dist_program *p) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, p)) return c->err.code;
  if (p->err)
    return dist_client_fail(c, p->err, "program '%s': %s", p->name, p->errmsg);
  if (p->nranks) dist_program_unregister(c, p);
  built b;
  if (build(p, &b)) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  if (dist_prog_outside(c, p)) {
    int rc = dist_prog_register_outside(c, p, &b.pb);
    built_free(&b);
    return rc;
  }
  int targets[DIST_MAX_MESH_RANKS];
  int n = program_targets(c, p, targets), rc = n < 0 ? n : 0;
  if (rc == 0 && any_output_elsewhere(c, p)) rc = dist_prog_keep_checked(c, p, &b.pb);
  dist_call *calls = NULL;
  Dist__V1__ProgramRegisterRequest rq = DIST__V1__PROGRAM_REGISTER_REQUEST__INIT;
  rq.program = &b.pb;
  rq.invocation_ttl_seconds = p->invocation_ttl;
  if (rc == 0)
    rc = dist_call_all(c, LL_METHOD("RegisterProgram"),
                       &dist__v1__program_register_reply__descriptor, &rq.base, targets, n, &calls);
  for (int i = 0; calls && i < n; i++) {
    const Dist__V1__ProgramRegisterReply *r = (const void *)calls[i].reply;
    if (r && rc != 0) dist_prog_release_on(c, &targets[i], 1, &r->handle);
    if (r && rc == 0) {
      p->ranks[i] = targets[i];
      p->handles[i] = r->handle;
    }
  }
  if (rc == 0) p->nranks = n;
  dist_calls_release(calls, n);
  built_free(&b);
  return rc;
}

int dist_program_set_invocation_ttl(dist_program *p, double seconds) {
  if (!p) return dist_null_handle(__func__, "p");
  if (seconds < 0) return dist_prog_fail(p, DIST_EINVAL, "invocation ttl %g s", seconds);
  p->invocation_ttl = seconds;
  return 0;
}

int dist_program_unregister(dist_client *c, dist_program *p) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, p)) return c->err.code;
  if (!p->nranks) return 0;
  int nowhere = p->outside;
  dist_prog_unregister_outside(p); /* the checked copy, if any */
  if (nowhere) {
    p->nranks = 0;
    return 0;
  }
  dist_errbuf first = DIST_ERRBUF_INIT;
  for (int i = 0; i < p->nranks; i++) {
    Dist__V1__ProgramReleaseRequest rq = DIST__V1__PROGRAM_RELEASE_REQUEST__INIT;
    rq.handle = p->handles[i];
    ProtobufCMessage *rp = NULL;
    dist_note_first_failure(c, dist_call_one(c, p->ranks[i], LL_METHOD("Release"), &rq.base,
                                             &dist__v1__program_release_reply__descriptor, &rp),
                            &first);
    if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  }
  p->nranks = 0;
  if (first.code) c->err = first;
  return first.code;
}
