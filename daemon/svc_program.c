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

#include "methods.h"
#include "pbuf.h"
#include "peer.h"
#include "program.h"
#include "program_outputs.h"
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

/* ---------------------------------------------------------------- Register */

DISTD_HANDLER(program_register) {
  (void)ci;
  const Dist__V1__ProgramRegisterRequest *rq = (const void *)req;
  if (!rq->program) return dist_fail(eb, DIST_EINVAL, "no program given");
  distd_program *p = NULL;
  int rc = distd_program_new(rq->program, &p, eb);
  if (rc) return rc;
  const Dist__V1__Program *pb = distd_program_message(p);
  for (size_t k = 0; k < pb->n_out_dist_attrs; k++) {
    distd_attr a;
    if ((rc = parse_out_attr(s, pb, k, &a, eb))) {
      distd_program_free(p);
      return rc;
    }
  }
  Dist__V1__ProgramRegisterReply rp = DIST__V1__PROGRAM_REGISTER_REPLY__INIT;
  rc = distd_registry_add(s->programs, p, rq->invocation_ttl_seconds,
                          &rp.handle, eb);
  if (rc) return rc;
  rp.rank = (uint32_t)s->rank;
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}

/* ---------------------------------------------------------------- arguments */

static int value_from_arg(const Dist__V1__ProgramArg *a, distd_tval **out,
                          dist_errbuf *eb) {
  dist_dtype dt;
  dist_shape shape;
  if (dist_dtype_from_pb((int)a->dtype, &dt, eb) != 0) return eb->code;
  if (dist_shape_from_pb(a->shape, a->n_shape, &shape, eb) != 0) return eb->code;
  size_t want = (size_t)dist_shape_numel(&shape) * dist_dtype_size(dt);
  if (a->data.len != want) {
    char ss[96];
    dist_shape_format(&shape, ss, sizeof ss);
    return dist_fail(eb, DIST_EMISMATCH, "%zu bytes for a %s %s value (%zu "
                     "bytes)", a->data.len, dist_dtype_name(dt), ss, want);
  }
  return distd_tval_from_data(dt, &shape, a->data.data, a->data.len, out, eb);
}

/* The local piece of a stored tensor as a value; origin remembers where it
 * came from. */
static int value_from_tensor(distd_server *s, const char *name,
                             distd_tval **out, distd_input_origin *origin,
                             dist_errbuf *eb) {
  distd_tensor *t = NULL;
  if (distd_store_get(s->store, name, &t, eb) != 0) return eb->code;
  int rc = dist_mesh_index_of(&t->mesh, s->rank) < 0
               ? dist_fail(eb, DIST_EINVAL, "rank %d holds no piece of '%s'",
                           s->rank, name)
               : distd_tval_from_data(t->dtype, &t->local, t->data, t->nbytes,
                                      out, eb);
  if (rc == 0 && origin) {
    origin->is_tensor = 1;
    origin->dtype = t->dtype;
    origin->global = t->global;
    origin->mesh = t->mesh;
    memcpy(origin->placements, t->placements, sizeof t->placements);
  }
  distd_tensor_unref(t);
  return rc;
}

static int bind_arg(distd_server *s, const Dist__V1__ProgramInput *in,
                    const Dist__V1__ProgramArg *a, size_t i, distd_tval **v,
                    distd_input_origin *origin, dist_errbuf *eb) {
  int rc = 0;
  switch (in->kind) {
  case DIST__V1__PROGRAM_INPUT__KIND__DTENSOR_LOCAL:
    rc = a->tensor && a->tensor[0]
             ? value_from_tensor(s, a->tensor, v, origin, eb)
             : dist_fail(eb, DIST_EINVAL, "needs a distributed tensor");
    break;
  case DIST__V1__PROGRAM_INPUT__KIND__VALUE:
    rc = value_from_arg(a, v, eb);
    break;
  default: /* RANK / COORD: the engine fills them in */
    break;
  }
  if (rc)
    dist_errbuf_prefix(eb, "input %zu%s%s%s: ", i, in->name[0] ? " ('" : "",
                       in->name, in->name[0] ? "')" : "");
  return rc;
}

static int bind_args(distd_server *s, const Dist__V1__Program *pb,
                     Dist__V1__ProgramArg *const *args, size_t n_args,
                     distd_tval **vals, distd_input_origin *origins,
                     dist_errbuf *eb) {
  if (n_args != pb->n_inputs)
    return dist_fail(eb, DIST_EINVAL, "program '%s' takes %zu inputs, %zu "
                     "arguments given", pb->name, pb->n_inputs, n_args);
  for (size_t i = 0; i < n_args; i++) {
    int rc = bind_arg(s, pb->inputs[i], args[i], i, &vals[i], &origins[i], eb);
    if (rc) return rc;
  }
  return 0;
}

/* ---------------------------------------------------------------- outputs */

/* Stores one local value as a distributed tensor whose global shape is
 * `global` (a gradient: each daemon stores its own). */
static int store_value(distd_server *s, const char *name, const distd_tval *v,
                       const dist_shape *global, const distd_attr *a,
                       int replace, distd_tensor **out, dist_errbuf *eb) {
  uint64_t version = 0;
  distd_tensor *t = NULL;
  int rc = distd_value_tensor(s, name, v, global, a, replace, &t, &version, eb);
  if (rc == 0) rc = distd_store_put(s->store, t, replace, eb);
  if (rc == 0) *out = t;
  else distd_tensor_unref(t);
  return rc;
}

typedef struct out_set {
  size_t n;
  distd_tensor **tensors;
  dist_wire_meta *w;
  Dist__V1__TensorMeta **metas;
  uint64_t version; /* the highest the outputs' names have (vote.h) */
} out_set;

/* stored: o's tensors were stored, and are removed again (a failed
 * backward). */
static void out_set_free(distd_server *s, out_set *o, int stored_and_failed) {
  for (size_t k = 0; k < o->n; k++) {
    if (stored_and_failed && o->tensors[k])
      distd_store_delete(s->store, o->tensors[k]->name, NULL);
    distd_tensor_unref(o->tensors[k]);
  }
  free(o->tensors);
  free(o->w);
  free(o->metas);
}

/* Makes every output, storing none. Goes through every output's shape
 * exchange even after a failure, so that the peers are told. */
static int make_outputs(distd_server *s, const distd_call_info *ci,
                        const Dist__V1__Program *pb,
                        const Dist__V1__ProgramInvokeRequest *rq,
                        distd_invocation *inv, int verdict, out_set *o,
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
    int grc = distd_value_global(s, ci->deadline_ms, &a, rq->op_id + 1 + k, rc, v, &global,
                                 eb);
    if (rc || grc) {
      if (!rc) dist_errbuf_prefix(eb, "output %zu: ", k);
      rc = rc ? rc : grc;
      continue;
    }
    rc = distd_value_tensor(s, rq->out_names[k], v, &global, &a, rq->replace,
                            &o->tensors[k], &o->version, eb);
    if (rc) dist_errbuf_prefix(eb, "output %zu ('%s'): ", k, rq->out_names[k]);
  }
  return rc;
}

/* Cannot fail: every output is made, and each gets the version after the
 * highest any daemon had, so that its pieces agree. */
static void store_outputs(distd_server *s, out_set *o) {
  for (size_t k = 0; k < o->n; k++) {
    o->tensors[k]->version = o->version + 1;
    distd_store_put_versioned(s->store, o->tensors[k]);
  }
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

typedef struct value_set {
  size_t n;
  Dist__V1__ProgramValue *v;
  Dist__V1__ProgramValue **ptrs;
  uint64_t (*shapes)[DIST_MAX_DIMS];
} value_set;

static void values_init(value_set *vs, size_t n) {
  vs->n = n;
  vs->v = calloc(n + 1, sizeof *vs->v);
  vs->ptrs = calloc(n + 1, sizeof *vs->ptrs);
  vs->shapes = calloc(n + 1, sizeof *vs->shapes);
}

/* Entry i describes t (borrowed until the reply is packed); NULL: empty. */
static void values_set(value_set *vs, size_t i, const distd_tval *t) {
  Dist__V1__ProgramValue *v = &vs->v[i];
  dist__v1__program_value__init(v);
  vs->ptrs[i] = v;
  if (!t) return;
  v->dtype = (Dist__V1__DType)t->dtype;
  for (int d = 0; d < t->shape.ndim; d++) vs->shapes[i][d] = (uint64_t)t->shape.dims[d];
  v->n_shape = (size_t)t->shape.ndim;
  v->shape = vs->shapes[i];
  v->data.data = t->data;
  v->data.len = distd_tval_nbytes(t);
}

static void values_free(value_set *vs) {
  free(vs->v);
  free(vs->ptrs);
  free(vs->shapes);
}

static void reply_invoke(distd_server *s, const Dist__V1__ProgramInvokeRequest *rq,
                         distd_invocation *inv, out_set *o,
                         grpc_byte_buffer **reply) {
  Dist__V1__ProgramInvokeReply rp = DIST__V1__PROGRAM_INVOKE_REPLY__INIT;
  value_set vs;
  values_init(&vs, rq->return_values ? o->n : 0);
  for (size_t k = 0; k < o->n; k++) {
    distd_meta_describe(o->tensors[k], s->rank, &o->w[k]);
    o->metas[k] = &o->w[k].meta;
    if (rq->return_values) values_set(&vs, k, distd_invocation_output(inv, k));
  }
  rp.n_outputs = o->n;
  rp.outputs = o->metas;
  rp.n_values = vs.n;
  rp.values = vs.ptrs;
  rp.invocation_id = rq->op_id;
  *reply = dist_pb_to_bb(&rp.base);
  values_free(&vs);
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
  int rc = check_out_names(pb, rq, eb);
  if (rc == 0) rc = bind_args(s, pb, rq->args, rq->n_args, vals, origins, eb);
  if (rc == 0) {
    distd_run_env env = {(uint32_t)s->rank};
    rc = distd_program_run(p, &env, vals, inv, eb);
  }
  for (size_t i = 0; i < n; i++) distd_tval_unref(vals[i]);
  free(vals);
  return rc;
}

/* The daemons the request says were invoked, when this daemon is one of
 * them and each is a rank of the world, none twice; else 0: no vote (a
 * client before 0.2.1 sends none). */
static int request_ranks(const distd_server *s, const Dist__V1__ProgramInvokeRequest *rq,
                         int *ranks) {
  int me = 0;
  if (rq->n_ranks > DIST_MAX_MESH_RANKS) return 0;
  for (size_t i = 0; i < rq->n_ranks; i++) {
    if (rq->ranks[i] >= (uint32_t)s->world_size) return 0;
    for (size_t j = 0; j < i; j++)
      if (rq->ranks[j] == rq->ranks[i]) return 0;
    ranks[i] = (int)rq->ranks[i];
    me |= ranks[i] == s->rank;
  }
  return me ? (int)rq->n_ranks : 0;
}

/* The request's ranks must be the program's outputs' (libdist sends those,
 * in order of first mention): a vote among others would wait for daemons
 * that never vote. */
static int check_ranks(const Dist__V1__Program *pb, const int *ranks, int n,
                       dist_errbuf *eb) {
  int want[DIST_MAX_MESH_RANKS], m = 0;
  for (size_t k = 0; k < pb->n_out_dist_attrs; k++) {
    dist_mesh_desc mesh;
    if (dist_mesh_from_pb(pb->out_dist_attrs[k]->mesh, &mesh, NULL) != 0) continue;
    for (int i = 0; i < mesh.nranks; i++) {
      int seen = 0;
      for (int j = 0; j < m; j++) seen |= want[j] == mesh.ranks[i];
      if (!seen && m < DIST_MAX_MESH_RANKS) want[m++] = mesh.ranks[i];
    }
  }
  if (m == n && memcmp(want, ranks, sizeof *ranks * (size_t)n) == 0) return 0;
  return dist_fail(eb, DIST_EINVAL, "ranks: the request names %d daemons to store the "
                   "outputs, not the %d of the outputs' meshes in their order", n, m);
}

/* Without the program this daemon makes no outputs, but the others may be
 * waiting for it in the outputs' shape exchanges and in the vote: it ends
 * the first and votes no in the second, so they fail now, naming why. */
static int refuse_unknown(distd_server *s, const distd_call_info *ci,
                          const Dist__V1__ProgramInvokeRequest *rq, int rc, dist_errbuf *eb) {
  int ranks[DIST_MAX_MESH_RANKS];
  int n = request_ranks(s, rq, ranks);
  if (n < 2) return rc;
  for (size_t k = 0; k < rq->n_out_names && k < DIST_MAX_MESH_RANKS; k++)
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

/* Makes the outputs and reserves the invocation's place; stores them and
 * fills it if every daemon invoked could. */
static int invoke(distd_server *s, const distd_call_info *ci, distd_program *p,
                  const Dist__V1__ProgramInvokeRequest *rq, const int *ranks, int n,
                  out_set *o, grpc_byte_buffer **reply, dist_errbuf *eb) {
  const Dist__V1__Program *pb = distd_program_message(p);
  distd_invocation *inv = NULL;
  distd_input_origin *origins = calloc(pb->n_inputs + 1, sizeof *origins);
  int verdict = origins ? run_local(s, p, rq, origins, &inv, eb)
                        : dist_fail(eb, DIST_ENOMEM, "out of memory");
  verdict = make_outputs(s, ci, pb, rq, inv, verdict, o, eb);
  int reserved = verdict == 0 && !rq->no_grad;
  if (reserved && (verdict = reserve_invocation(s, rq, eb)) != 0) reserved = 0;
  int rc = n > 1 && o->n ? distd_vote(s, ranks, n, rq->op_id, ci->deadline_ms, "invocation",
                                      verdict, &o->version, eb)
                         : verdict;
  if (rc == 0) {
    store_outputs(s, o);
    reply_invoke(s, rq, inv, o, reply); /* packed: independent of inv */
  }
  if (rc == 0 && reserved) {
    distd_registry_fill(s->programs, rq->op_id, inv, origins);
    inv = NULL;
    origins = NULL;
  } else if (reserved) {
    distd_registry_release(s->programs, rq->op_id, NULL);
  }
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
  int ranks[DIST_MAX_MESH_RANKS], n = request_ranks(s, rq, ranks);
  out_set o = {.n = pb->n_outputs};
  o.tensors = calloc(o.n + 1, sizeof *o.tensors);
  o.w = calloc(o.n + 1, sizeof *o.w);
  o.metas = calloc(o.n + 1, sizeof *o.metas);
  if (!o.tensors || !o.w || !o.metas) rc = dist_fail(eb, DIST_ENOMEM, "out of memory");
  if (rc == 0 && rq->n_ranks) rc = check_ranks(pb, ranks, n, eb);
  if (rc == 0) rc = invoke(s, ci, p, rq, ranks, n, &o, reply, eb);
  out_set_free(s, &o, 0);
  distd_program_free(p);
  return rc;
}

/* ---------------------------------------------------------------- Backward */

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
      rc = value_from_tensor(s, a->tensor, &g[k], NULL, eb);
    else if (a->n_shape || a->data.len)
      rc = value_from_arg(a, &g[k], eb);
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

/* Stores the gradient of every DTENSOR_LOCAL input that has one and a name:
 * a distributed tensor of the input's global shape, whose piece on this
 * rank is the local gradient (no communication). */
static int store_grads(distd_server *s, const distd_kept_invocation *k,
                       const Dist__V1__ProgramBackwardRequest *rq, out_set *o,
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
      rc = store_value(s, rq->grad_names[i], g, &k->origins[i].global, &a,
                       rq->replace, &o->tensors[i], eb);
    if (rc) {
      dist_errbuf_prefix(eb, "gradient of input %zu%s%s%s: ", i,
                         in->name[0] ? " ('" : "", in->name,
                         in->name[0] ? "')" : "");
      return rc;
    }
  }
  return 0;
}

static void reply_backward(distd_server *s, const distd_kept_invocation *k,
                           const Dist__V1__ProgramBackwardRequest *rq,
                           out_set *o, grpc_byte_buffer **reply) {
  Dist__V1__ProgramBackwardReply rp = DIST__V1__PROGRAM_BACKWARD_REPLY__INIT;
  value_set vs;
  protobuf_c_boolean *has = calloc(o->n + 1, sizeof *has);
  values_init(&vs, rq->return_values ? o->n : 0);
  for (size_t i = 0; i < o->n; i++) {
    const distd_tval *g = distd_invocation_input_grad(k->inv, i);
    dist__v1__tensor_meta__init(&o->w[i].meta);
    if (o->tensors[i]) distd_meta_describe(o->tensors[i], s->rank, &o->w[i]);
    o->metas[i] = &o->w[i].meta;
    has[i] = g != NULL;
    if (rq->return_values) values_set(&vs, i, g);
  }
  rp.n_grads = rp.n_has_grad = o->n;
  rp.grads = o->metas;
  rp.has_grad = has;
  rp.n_values = vs.n;
  rp.values = vs.ptrs;
  *reply = dist_pb_to_bb(&rp.base);
  values_free(&vs);
  free(has);
}

DISTD_HANDLER(program_backward) {
  (void)ci;
  const Dist__V1__ProgramBackwardRequest *rq = (const void *)req;
  distd_kept_invocation *k = NULL;
  distd_tval **grads = NULL;
  out_set o = {0};
  size_t n_out = 0;
  int rc = distd_registry_take(s->programs, rq->invocation_id, &k, eb);
  if (rc) return rc;
  n_out = distd_invocation_n_outputs(k->inv);
  grads = calloc(n_out + 1, sizeof *grads);
  o.n = distd_program_n_inputs(distd_invocation_program(k->inv));
  o.tensors = calloc(o.n + 1, sizeof *o.tensors);
  o.w = calloc(o.n + 1, sizeof *o.w);
  o.metas = calloc(o.n + 1, sizeof *o.metas);
  if (rq->n_out_grads && (rc = out_grads_of(s, k->inv, rq, grads, eb)))
    goto out;
  rc = distd_invocation_backward(k->inv, rq->n_out_grads ? grads : NULL, eb);
  if (rc) {
    dist_errbuf_prefix(eb, "backward of invocation %llu: ",
                       (unsigned long long)rq->invocation_id);
    goto out;
  }
  if ((rc = store_grads(s, k, rq, &o, eb))) goto out;
  reply_backward(s, k, rq, &o, reply);
out:
  out_set_free(s, &o, rc != 0);
  for (size_t j = 0; j < n_out; j++) distd_tval_unref(grads[j]);
  free(grads);
  distd_kept_invocation_free(k); /* backward runs once: nothing is kept */
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
