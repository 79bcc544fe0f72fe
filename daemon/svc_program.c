/* dist.v1.Program: Register / Invoke / Backward / Release, the daemon side
 * of LocalLayer (see the service comment in proto/dist/v1/program.proto).
 *
 * Invoke turns each argument into a local value (a stored tensor's local
 * piece, or bytes), runs the program with the engine (daemon/program/), and
 * stores each output as a distributed tensor with its out_dist_attrs. The
 * invocation is kept in the registry for Backward, which stores the input
 * gradients as distributed tensors on the inputs' meshes. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "methods.h"
#include "pbuf.h"
#include "program.h"
#include "program_registry.h"
#include "store.h"
#include "tensor_meta.h"
#include "wire.h"

/* An output's (or gradient's) mesh and placements, parsed and checked. */
typedef struct dist_attr {
  dist_mesh_desc mesh;
  dist_placement placements[DIST_MAX_MESH_DIMS];
} dist_attr;

static int parse_attr(distd_server *s, const Dist__V1__Mesh *mesh,
                      Dist__V1__Placement *const *pl, size_t npl,
                      dist_attr *a, dist_errbuf *eb) {
  if (dist_mesh_from_pb(mesh, &a->mesh, eb) != 0) return eb->code;
  if (distd_mesh_check_world(s, &a->mesh, eb) != 0) return eb->code;
  if (npl != (size_t)a->mesh.ndim)
    return dist_fail(eb, DIST_EINVAL, "%zu placements for a mesh of %d dims",
                     npl, a->mesh.ndim);
  if (dist_placements_from_pb(pl, npl, a->placements, eb) != 0) return eb->code;
  if (dist_mesh_index_of(&a->mesh, s->rank) < 0)
    return dist_fail(eb, DIST_EINVAL, "rank %d is not in the mesh", s->rank);
  return 0;
}

static int parse_out_attr(distd_server *s, const Dist__V1__Program *pb,
                          size_t k, dist_attr *a, dist_errbuf *eb) {
  const Dist__V1__DistAttr *d = pb->out_dist_attrs[k];
  int rc = parse_attr(s, d->mesh, d->placements, d->n_placements, a, eb);
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
    dist_attr a;
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

/* Only a Shard over more than one rank makes the global extent depend on
 * the other ranks' pieces. */
static int needs_exchange(const dist_attr *a) {
  for (int md = 0; md < a->mesh.ndim; md++)
    if (a->placements[md].kind == DIST_SHARD && a->mesh.shape[md] > 1) return 1;
  return 0;
}

enum { XWORDS = 2 + DIST_MAX_DIMS };

static void unpack_shape(const int64_t *w, dist_shape *s) {
  s->ndim = (int)w[1];
  for (int d = 0; d < s->ndim && d < DIST_MAX_DIMS; d++) s->dims[d] = w[2 + d];
}

/* The global extent of a sharded dim is the sum of the pieces of the ranks
 * at coordinate 0 on every mesh dim that does not shard it. */
static void derive_global(const dist_attr *a, const int64_t *all,
                          dist_shape *global) {
  unpack_shape(all, global);
  for (int d = 0; d < global->ndim; d++) {
    int64_t sum = 0;
    int sharded = 0;
    for (int i = 0; i < a->mesh.nranks; i++) {
      int coords[DIST_MAX_MESH_DIMS], on_axis = 1;
      dist_mesh_coords(&a->mesh, i, coords);
      for (int md = 0; md < a->mesh.ndim; md++) {
        int shards_d = a->placements[md].kind == DIST_SHARD &&
                       a->placements[md].dim == d;
        sharded |= shards_d;
        if (!shards_d && coords[md] != 0) on_axis = 0;
      }
      dist_shape piece;
      unpack_shape(&all[i * XWORDS], &piece);
      if (on_axis && d < piece.ndim) sum += piece.dims[d];
    }
    if (sharded) global->dims[d] = sum;
  }
}

static int check_fit(const dist_attr *a, const int64_t *all,
                     const dist_shape *global, dist_errbuf *eb) {
  for (int i = 0; i < a->mesh.nranks; i++) {
    int coords[DIST_MAX_MESH_DIMS];
    int64_t off[DIST_MAX_DIMS];
    dist_shape want, got;
    dist_mesh_coords(&a->mesh, i, coords);
    dist_local_box(&a->mesh, a->placements, global, coords, &want, off);
    unpack_shape(&all[i * XWORDS], &got);
    if (!dist_shape_equal(&want, &got)) {
      char gs[96], ws[96], hs[96];
      dist_shape_format(&got, hs, sizeof hs);
      dist_shape_format(&want, ws, sizeof ws);
      dist_shape_format(global, gs, sizeof gs);
      return dist_fail(eb, DIST_EMISMATCH, "local outputs do not fit the "
                       "placements: rank %d made %s, but global shape %s "
                       "gives it %s", a->mesh.ranks[i], hs, gs, ws);
    }
  }
  return 0;
}

/* dtensor_from_local's shape exchange over the output's mesh: every rank
 * sends its verdict and local shape, so all accept or all refuse. */
static int exchange_shapes(distd_server *s, const dist_attr *a, uint64_t op_id,
                           int64_t deadline, int verdict,
                           const dist_shape *local, dist_shape *global,
                           dist_errbuf *eb) {
  int n = a->mesh.nranks;
  int64_t mine[XWORDS] = {verdict, local ? local->ndim : 0};
  for (int d = 0; local && d < local->ndim; d++) mine[2 + d] = local->dims[d];
  int64_t *all = calloc((size_t)n * XWORDS, sizeof *all);
  size_t *counts = calloc((size_t)n, sizeof *counts);
  for (int i = 0; i < n; i++) counts[i] = XWORDS;
  distd_coll c;
  int rc = distd_coll_init(&c, s->peers, op_id, a->mesh.ranks, n, deadline, eb);
  if (rc == 0) rc = distd_allgather(&c, mine, all, counts, DIST_INT64, eb);
  for (int i = 0; rc == 0 && i < n; i++)
    if (all[i * XWORDS] != 0 && a->mesh.ranks[i] != s->rank)
      rc = dist_fail(eb, (int)all[i * XWORDS], "rank %d failed its part of "
                     "the invocation (%s)", a->mesh.ranks[i],
                     dist_err_name((int)all[i * XWORDS]));
  if (rc == 0 && verdict == 0) {
    derive_global(a, all, global);
    rc = check_fit(a, all, global, eb);
  }
  free(all);
  free(counts);
  return rc;
}

/* Stores one local value as a distributed tensor whose global shape is
 * `global`; the piece this rank gets must be exactly v. */
static int store_value(distd_server *s, const char *name, const distd_tval *v,
                       const dist_shape *global, const dist_attr *a,
                       int replace, distd_tensor **out, dist_errbuf *eb) {
  distd_tensor *t = NULL;
  int rc = distd_tensor_new(s->store, name, v->dtype, global, &a->mesh,
                            a->placements, s->rank, &t, eb);
  if (rc) return rc;
  if (!dist_shape_equal(&t->local, &v->shape)) {
    char ls[96], gs[96], ps[160];
    dist_shape_format(&v->shape, ls, sizeof ls);
    dist_shape_format(global, gs, sizeof gs);
    dist_placements_format(a->placements, a->mesh.ndim, ps, sizeof ps);
    rc = dist_fail(eb, DIST_EMISMATCH, "local value %s does not fit %s of "
                   "global shape %s on rank %d", ls, ps, gs, s->rank);
  }
  if (rc == 0) {
    memcpy(t->data, v->data, t->nbytes);
    rc = distd_store_put(s->store, t, replace, eb);
  }
  if (rc == 0) *out = t;
  else distd_tensor_unref(t);
  return rc;
}

/* The global shape of output k: the local shape unless it is sharded, in
 * which case the mesh's daemons exchange shapes (also when this rank
 * failed, so the others learn it instead of waiting). */
static int output_global(distd_server *s, const distd_call_info *ci,
                         const dist_attr *a, uint64_t op_id, int verdict,
                         const distd_tval *v, dist_shape *global,
                         dist_errbuf *eb) {
  if (!needs_exchange(a)) {
    if (verdict) return verdict;
    *global = v->shape;
    for (int md = 0; md < a->mesh.ndim; md++)
      if (a->placements[md].kind == DIST_SHARD &&
          a->placements[md].dim >= v->shape.ndim)
        return dist_fail(eb, DIST_EINVAL, "Shard(%d) of a %d-d output",
                         a->placements[md].dim, v->shape.ndim);
    return 0;
  }
  dist_errbuf peer_eb = DIST_ERRBUF_INIT;
  if (verdict == 0 &&
      dist_placements_check(&a->mesh, a->placements, a->mesh.ndim,
                            v->shape.ndim, eb) != 0)
    verdict = eb->code;
  int rc = exchange_shapes(s, a, op_id, ci->deadline_ms, verdict,
                           v ? &v->shape : NULL, global,
                           verdict ? &peer_eb : eb);
  return verdict ? verdict : rc;
}

typedef struct out_set {
  size_t n;
  distd_tensor **tensors;
  dist_wire_meta *w;
  Dist__V1__TensorMeta **metas;
} out_set;

static void out_set_free(distd_server *s, out_set *o, int failed) {
  for (size_t k = 0; k < o->n; k++) {
    if (failed && o->tensors[k])
      distd_store_delete(s->store, o->tensors[k]->name, NULL);
    distd_tensor_unref(o->tensors[k]);
  }
  free(o->tensors);
  free(o->w);
  free(o->metas);
}

/* Stores every output; on failure removes the ones already stored. Goes
 * through every output's exchange even after a failure so peers are told. */
static int store_outputs(distd_server *s, const distd_call_info *ci,
                         const Dist__V1__Program *pb,
                         const Dist__V1__ProgramInvokeRequest *rq,
                         distd_invocation *inv, int verdict, out_set *o,
                         dist_errbuf *eb) {
  int rc = verdict;
  for (size_t k = 0; k < pb->n_outputs; k++) {
    dist_attr a;
    dist_shape global;
    const distd_tval *v = inv ? distd_invocation_output(inv, k) : NULL;
    int prc = parse_out_attr(s, pb, k, &a, rc ? NULL : eb);
    if (prc) { /* checked at Register: cannot differ now */
      rc = rc ? rc : prc;
      continue;
    }
    int grc = output_global(s, ci, &a, rq->op_id + 1 + k, rc, v, &global, eb);
    if (rc || grc) {
      if (!rc) dist_errbuf_prefix(eb, "output %zu: ", k);
      rc = rc ? rc : grc;
      continue;
    }
    rc = store_value(s, rq->out_names[k], v, &global, &a, rq->replace,
                     &o->tensors[k], eb);
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

static int keep_invocation(distd_server *s, const Dist__V1__ProgramInvokeRequest *rq,
                           distd_invocation *inv, distd_input_origin *origins,
                           dist_errbuf *eb) {
  distd_kept_invocation *k = calloc(1, sizeof *k);
  if (!k) {
    distd_invocation_release(inv);
    free(origins);
    return dist_fail(eb, DIST_ENOMEM, "out of memory keeping an invocation");
  }
  k->id = rq->op_id;
  k->handle = rq->handle;
  k->inv = inv;
  k->origins = origins;
  return distd_registry_keep(s->programs, k, eb);
}

DISTD_HANDLER(program_invoke) {
  const Dist__V1__ProgramInvokeRequest *rq = (const void *)req;
  distd_program *p = NULL;
  distd_invocation *inv = NULL;
  distd_input_origin *origins = NULL;
  out_set o = {0};
  int rc = distd_registry_get(s->programs, rq->handle, &p, eb);
  if (rc) return rc; /* no program: no outputs, so no exchange either */
  const Dist__V1__Program *pb = distd_program_message(p);
  o.n = pb->n_outputs;
  o.tensors = calloc(o.n + 1, sizeof *o.tensors);
  o.w = calloc(o.n + 1, sizeof *o.w);
  o.metas = calloc(o.n + 1, sizeof *o.metas);
  origins = calloc(pb->n_inputs + 1, sizeof *origins);
  int verdict = run_local(s, p, rq, origins, &inv, eb);
  rc = store_outputs(s, ci, pb, rq, inv, verdict, &o, eb);
  if (rc) goto out;
  reply_invoke(s, rq, inv, &o, reply); /* packed: independent of inv */
  if (!rq->no_grad) {
    rc = keep_invocation(s, rq, inv, origins, eb); /* takes inv either way */
    inv = NULL;
    origins = NULL;
    if (rc) {
      grpc_byte_buffer_destroy(*reply);
      *reply = NULL;
    }
  }
out:
  out_set_free(s, &o, rc != 0);
  distd_invocation_release(inv);
  free(origins);
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
                     const distd_input_origin *o, dist_attr *a,
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
    dist_attr a;
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
