/* The parameter service from the trainer's side: configure, push, pull.
 * Each is a fan-out of one request per daemon of the parameter's mesh. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "param.pb-c.h"
#include "wire.h"

static int fill_optimizer(dist_client *c, const dist_param_opts *o,
                          Dist__V1__OptimizerConfig *pb) {
  if (o->optimizer < DIST_OPT_SGD || o->optimizer > DIST_OPT_ADAMW)
    return dist_client_fail(c, DIST_EINVAL, "unknown optimizer %d", (int)o->optimizer);
  pb->kind = (Dist__V1__OptimizerConfig__Kind)o->optimizer;
  pb->lr = o->lr;
  pb->momentum = o->momentum;
  pb->dampening = o->dampening;
  pb->nesterov = o->nesterov != 0;
  pb->beta1 = o->beta1;
  pb->beta2 = o->beta2;
  pb->eps = o->eps;
  pb->weight_decay = o->weight_decay;
  return 0;
}

void dist_param_opts_from_pb(const Dist__V1__ParamConfigureRequest *rq, dist_param_opts *o) {
  const Dist__V1__OptimizerConfig *pb = rq->optimizer;
  *o = (dist_param_opts)DIST_PARAM_OPTS_INIT;
  o->optimizer = (dist_optimizer)pb->kind;
  o->lr = pb->lr;
  o->momentum = pb->momentum;
  o->dampening = pb->dampening;
  o->nesterov = pb->nesterov;
  o->beta1 = pb->beta1;
  o->beta2 = pb->beta2;
  o->eps = pb->eps;
  o->weight_decay = pb->weight_decay;
  o->reduce = (dist_reduce)rq->reduce;
  o->consistency = rq->consistency == DIST__V1__CONSISTENCY__ASYNC ? DIST_PARAM_ASYNC
                                                                   : DIST_PARAM_SYNC;
  o->trainers = (int)rq->trainers;
}

/* The checks every push shares, named after the public call `func`: the
 * parameter's name, and its trainer number. */
static int check_push(dist_client *c, const char *func, const char *name, int trainer) {
  if (dist_client_check_lookup(c, func, name) != 0) return c->err.code;
  return dist_client_check_trainer(c, func, trainer);
}

/* The lowest version any daemon reports (replies of kind Push). */
static uint64_t lowest_version(dist_call *calls, int n) {
  uint64_t v = UINT64_MAX;
  for (int i = 0; i < n; i++) {
    const Dist__V1__ParamPushReply *rp = (const void *)calls[i].reply;
    if (rp && rp->version < v) v = rp->version;
  }
  return v == UINT64_MAX ? 0 : v;
}


/* rq to every daemon of t's mesh; with whole state buffers, each daemon's
 * request carries its slices of them. */
static void *slice_for(const dist_tensor *t, int rank, const void *whole, size_t *bytes);

static int configure_ranks(dist_client *c, const dist_tensor *t,
                           const Dist__V1__ParamConfigureRequest *rq,
                           const void *const *whole, int nstate) {
  int targets[DIST_MAX_MESH_RANKS];
  int n = dist_targets(c, &t->mesh.d, targets);
  if (n < 0) return n;
  Dist__V1__ParamConfigureRequest *rqs = calloc((size_t)n + 1, sizeof *rqs);
  ProtobufCBinaryData(*state)[DIST_OPTIM_STATE_MAX] = calloc((size_t)n + 1, sizeof *state);
  dist_call *calls = calloc((size_t)n + 1, sizeof *calls);
  dist_wire_meta *wire = calloc(1, sizeof *wire);
  int rc = 0;
  if (!rqs || !state || !calls || !wire)
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory configuring '%s'", t->name);
  else
    dist_mesh_to_pb(&t->mesh.d, wire);
  /* Sent to the whole mesh, the daemons configure all together or none
   * (param.proto). */
  uint64_t op_id = c->spmd_rank < 0 ? dist_next_op_id(c) : 0;
  for (int i = 0; i < n && rc == 0; i++) {
    rqs[i] = *rq;
    rqs[i].op_id = op_id;
    rqs[i].mesh = op_id ? &wire->mesh : NULL;
    rqs[i].n_state = (size_t)nstate;
    rqs[i].state = state[i];
    for (int k = 0; k < nstate && k < DIST_OPTIM_STATE_MAX; k++)
      if (!(state[i][k].data = slice_for(t, targets[i], whole[k], &state[i][k].len)))
        rc = dist_client_fail(c, DIST_ENOMEM, "out of memory configuring '%s'", t->name);
    calls[i].target = targets[i];
    calls[i].request = &rqs[i].base;
  }
  if (rc == 0)
    rc = dist_call_many(c, "/dist.v1.Param/Configure",
                        &dist__v1__param_configure_reply__descriptor, calls, n);
  if (calls) dist_calls_free(calls, n);
  for (int i = 0; state && i < n; i++)
    for (int k = 0; k < DIST_OPTIM_STATE_MAX; k++) free(state[i][k].data);
  free(state);
  free(rqs);
  free(calls);
  free(wire);
  return rc;
}

int dist_param_configure_request(dist_client *c, const dist_param_opts *opts, int keep_state,
                                 Dist__V1__ParamConfigureRequest *rq,
                                 Dist__V1__OptimizerConfig *opt) {
  dist_param_opts def = DIST_PARAM_OPTS_INIT;
  const dist_param_opts *o = opts ? opts : &def;
  dist__v1__optimizer_config__init(opt);
  dist__v1__param_configure_request__init(rq);
  rq->optimizer = opt;
  /* Passed as given, so the daemons refuse what is out of range and name
   * it: an unknown mode was taken as SYNC, and trainers -3 named as 0. */
  rq->reduce = (Dist__V1__ReduceOp)o->reduce;
  rq->consistency = (Dist__V1__Consistency)o->consistency;
  rq->trainers = (uint32_t)o->trainers;
  rq->keep_state = keep_state;
  return fill_optimizer(c, o, opt);
}

/* Configure, or with keep_state tune (param.proto), from opts. */
static int configure_from_opts(dist_client *c, const char *func, const char *name,
                               const dist_param_opts *opts, int keep_state) {
  dist_tensor *t = NULL;
  if (dist_client_check_lookup(c, func, name) != 0) return c->err.code;
  int rc = dist_tensor_open(c, name, &t);
  if (rc != 0) return rc;
  Dist__V1__OptimizerConfig opt;
  Dist__V1__ParamConfigureRequest rq;
  if ((rc = dist_param_configure_request(c, opts, keep_state, &rq, &opt)) == 0) {
    rq.name = (char *)name;
    rc = configure_ranks(c, t, &rq, NULL, 0);
  }
  dist_tensor_free(t);
  return rc;
}

int dist_param_configure(dist_client *c, const char *name, const dist_param_opts *opts) {
  if (!c) return dist_no_client(__func__);
  return configure_from_opts(c, __func__, name, opts, 0);
}

int dist_param_tune(dist_client *c, const char *name, const dist_param_opts *opts) {
  if (!c) return dist_no_client(__func__);
  if (!opts) return dist_client_null_arg(c, __func__, "opts (the new options)");
  return configure_from_opts(c, __func__, name, opts, 1);
}

int dist_param_configure_restored(dist_client *c, const char *name,
                                  const Dist__V1__ParamConfigureRequest *cfg,
                                  const void *const *whole, int nstate, uint64_t step) {
  if (nstate < 0 || nstate > DIST_OPTIM_STATE_MAX || !cfg->optimizer)
    return dist_client_fail(c, DIST_EPROTO, "restoring '%s': a malformed optimizer "
                            "description (%d state buffers)", name, nstate);
  dist_tensor *t = NULL;
  int rc = dist_tensor_open(c, name, &t);
  if (rc != 0) return rc;
  Dist__V1__ParamConfigureRequest rq = DIST__V1__PARAM_CONFIGURE_REQUEST__INIT;
  rq.name = (char *)name;
  rq.optimizer = cfg->optimizer;
  rq.reduce = cfg->reduce;
  rq.consistency = cfg->consistency;
  rq.trainers = cfg->trainers;
  rq.with_state = 1;
  rq.step = step;
  rc = configure_ranks(c, t, &rq, whole, nstate);
  dist_tensor_free(t);
  return rc;
}

/* This rank's slice of a whole value (a gradient, a state buffer),
 * malloc'd. */
static void *slice_for(const dist_tensor *t, int rank, const void *grad,
                       size_t *bytes) {
  int idx = dist_mesh_index_of(&t->mesh.d, rank), coords[DIST_MAX_MESH_DIMS];
  dist_shape local;
  int64_t offset[DIST_MAX_DIMS];
  dist_mesh_coords(&t->mesh.d, idx, coords);
  dist_local_box(&t->mesh.d, t->placements, &t->shape, coords, &local, offset);
  size_t elem = dist_dtype_size(t->dtype);
  *bytes = (size_t)dist_shape_numel(&local) * elem;
  void *piece = malloc(*bytes + 1);
  if (piece) dist_copy_box_out(piece, grad, &t->shape, offset, &local, elem);
  return piece;
}

/* A gradient of nbytes for t: 0 when that is t's whole size, else
 * DIST_EMISMATCH naming both. */
static int check_grad_bytes(dist_client *c, const dist_tensor *t, const char *name,
                            size_t nbytes) {
  size_t want = (size_t)dist_shape_numel(&t->shape) * dist_dtype_size(t->dtype);
  if (nbytes == want) return 0;
  char gs[96];
  dist_shape_format(&t->shape, gs, sizeof gs);
  return dist_client_fail(c, DIST_EMISMATCH, "gradient for '%s' has %zu bytes, "
                          "but the parameter is %s %s = %zu bytes", name, nbytes,
                          dist_dtype_name(t->dtype), gs, want);
}

int dist_param_push(dist_client *c, const char *name, int trainer,
                    const void *grad, size_t nbytes, uint64_t *version) {
  if (!c) return dist_no_client(__func__);
  if (check_push(c, __func__, name, trainer)) return c->err.code;
  if (!grad && nbytes) return dist_client_null_arg(c, __func__, "grad");
  dist_tensor *t = NULL;
  int rc = dist_tensor_open(c, name, &t);
  if (rc != 0) return rc;
  int targets[DIST_MAX_MESH_RANKS], n = 0;
  Dist__V1__ParamPushRequest *rqs = NULL;
  dist_call *calls = NULL;
  dist_wire_meta *wire = calloc(1, sizeof *wire);
  if (!wire) {
    dist_tensor_free(t);
    return dist_client_fail(c, DIST_ENOMEM, "out of memory pushing to '%s'", name);
  }
  dist_mesh_to_pb(&t->mesh.d, wire);
  dist_placements_to_pb(t->placements, t->mesh.d.ndim, wire);
  /* Checked here, before any daemon sees a byte: a wrong gradient changes
   * nothing anywhere. */
  if ((rc = check_grad_bytes(c, t, name, nbytes))) goto out;
  if ((n = dist_targets(c, &t->mesh.d, targets)) < 0) { rc = n; n = 0; goto out; }
  rqs = calloc((size_t)n + 1, sizeof *rqs);
  calls = calloc((size_t)n + 1, sizeof *calls);
  if (!rqs || !calls) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory pushing to '%s'", name);
    goto out;
  }
  /* Sent to the whole mesh, the push is applied by every daemon or by
   * none (param.proto). An SPMD trainer sends only its own piece. */
  uint64_t op_id = c->spmd_rank < 0 ? dist_next_op_id(c) : 0;
  for (int i = 0; i < n; i++) {
    dist__v1__param_push_request__init(&rqs[i]);
    rqs[i].name = (char *)name;
    rqs[i].trainer = (uint32_t)trainer;
    rqs[i].op_id = op_id;
    rqs[i].mesh = &wire->mesh; /* the layout the gradient is sliced for */
    rqs[i].n_placements = (size_t)t->mesh.d.ndim;
    rqs[i].placements = wire->placement_ptrs;
    rqs[i].data.data = slice_for(t, targets[i], grad, &rqs[i].data.len);
    if (!rqs[i].data.data) {
      rc = dist_client_fail(c, DIST_ENOMEM, "out of memory for rank %d's slice of '%s'",
                            targets[i], name);
      goto out;
    }
    calls[i].target = targets[i];
    calls[i].request = &rqs[i].base;
  }
  rc = dist_call_many(c, "/dist.v1.Param/PushGrad",
                      &dist__v1__param_push_reply__descriptor, calls, n);
  if (rc == 0 && version) *version = lowest_version(calls, n);
out:
  if (calls) dist_calls_free(calls, n);
  for (int i = 0; rqs && i < n; i++) free(rqs[i].data.data);
  free(rqs);
  free(calls);
  free(wire);
  dist_tensor_free(t);
  return rc;
}

int dist_param_push_local(dist_client *c, const char *name, int trainer,
                          int rank, const void *piece, size_t nbytes,
                          uint64_t *version) {
  if (!c) return dist_no_client(__func__);
  if (check_push(c, __func__, name, trainer)) return c->err.code;
  if (!piece && nbytes) return dist_client_null_arg(c, __func__, "piece");
  if (rank < 0) rank = c->spmd_rank;
  if (dist_client_check_reach(c, __func__, rank) != 0) return c->err.code;
  Dist__V1__ParamPushRequest rq = DIST__V1__PARAM_PUSH_REQUEST__INIT;
  rq.name = (char *)name;
  rq.trainer = (uint32_t)trainer;
  rq.data.data = (uint8_t *)piece;
  rq.data.len = nbytes;
  dist_call *call = NULL;
  int rc = dist_call_all(c, "/dist.v1.Param/PushGrad", &dist__v1__param_push_reply__descriptor,
                         &rq.base, &rank, 1, &call);
  if (rc == 0 && version) *version = lowest_version(call, 1);
  dist_calls_release(call, 1);
  return rc;
}

int dist_param_push_tensor(dist_client *c, const char *name, int trainer,
                           const char *grad_name, uint64_t *version) {
  if (!c) return dist_no_client(__func__);
  /* The gradient may be resharded, and the daemons apply the push all
   * together or not at all (param.proto): both are exchanges of the mesh.
   * Taken first, by every trainer: one whose daemon does not hold the
   * parameter (outside its mesh) stays in step with the others. */
  uint64_t op_id = dist_next_op_id(c);
  if (check_push(c, __func__, name, trainer)) return c->err.code;
  if (!grad_name) return dist_client_null_arg(c, __func__, "grad_name");
  dist_tensor *t = NULL;
  int rc = dist_tensor_open(c, name, &t);
  if (rc != 0) return rc;
  Dist__V1__ParamPushRequest rq = DIST__V1__PARAM_PUSH_REQUEST__INIT;
  rq.name = (char *)name;
  rq.trainer = (uint32_t)trainer;
  rq.grad_name = (char *)grad_name;
  rq.op_id = op_id;
  dist_wire_meta *wire = calloc(1, sizeof *wire);
  int targets[DIST_MAX_MESH_RANKS];
  if (!wire) {
    dist_tensor_free(t);
    return dist_client_fail(c, DIST_ENOMEM, "out of memory pushing to '%s'", name);
  }
  dist_mesh_to_pb(&t->mesh.d, wire);
  rq.mesh = &wire->mesh;
  int n = dist_targets(c, &t->mesh.d, targets);
  dist_call *calls = NULL;
  rc = n < 0 ? n
             : dist_call_all(c, "/dist.v1.Param/PushGrad", &dist__v1__param_push_reply__descriptor,
                             &rq.base, targets, n, &calls);
  if (rc == 0 && version) *version = lowest_version(calls, n);
  dist_calls_release(calls, n);
  free(wire);
  dist_tensor_free(t);
  return rc;
}

/* Places each daemon's piece into the whole value. */
static int assemble(dist_client *c, const dist_tensor *t, dist_call *calls,
                    int n, void *out, uint64_t *version) {
  size_t elem = dist_dtype_size(t->dtype);
  uint64_t low = UINT64_MAX;
  for (int i = 0; i < n; i++) {
    const Dist__V1__ParamPullReply *rp = (const void *)calls[i].reply;
    dist_shape box = {0, {0}};
    int64_t off[DIST_MAX_DIMS] = {0};
    if (!rp->meta || rp->meta->n_local_shape != (size_t)t->shape.ndim ||
        rp->meta->n_local_offset != (size_t)t->shape.ndim)
      return dist_client_fail(c, DIST_EPROTO, "rank %d described its piece of "
                              "'%s' without its box", calls[i].target, t->name);
    box.ndim = t->shape.ndim;
    for (int d = 0; d < box.ndim; d++) {
      box.dims[d] = (int64_t)rp->meta->local_shape[d];
      off[d] = (int64_t)rp->meta->local_offset[d];
    }
    if (rp->data.len != (size_t)dist_shape_numel(&box) * elem)
      return dist_client_fail(c, DIST_EPROTO, "rank %d sent %zu bytes of '%s'",
                              calls[i].target, rp->data.len, t->name);
    dist_copy_box_in(out, &t->shape, off, rp->data.data, &box, elem);
    if (rp->meta->version < low) low = rp->meta->version;
  }
  if (version) *version = low;
  return 0;
}

int dist_param_pull(dist_client *c, const char *name, uint64_t min_version,
                    void **data, size_t *nbytes, uint64_t *version) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, data) || DIST_NEED(c, nbytes)) return c->err.code;
  *data = NULL;
  if (dist_client_check_lookup(c, __func__, name) != 0) return c->err.code;
  dist_tensor *t = NULL;
  int rc = dist_tensor_open(c, name, &t);
  if (rc != 0) return rc;
  if (dist_check_mesh_reach(c, &t->mesh.d) != 0) {
    dist_errbuf_prefix(&c->err, "dist_param_pull '%s': ", name);
    dist_tensor_free(t);
    return c->err.code;
  }
  if (dist_placements_partial_dim(t->placements, t->mesh.d.ndim) >= 0) {
    rc = dist_client_fail(c, DIST_ENOTSUP, "'%s' is Partial: pull it with "
                          "dist_full_tensor", name);
    dist_tensor_free(t);
    return rc;
  }
  Dist__V1__ParamPullRequest rq = DIST__V1__PARAM_PULL_REQUEST__INIT;
  rq.name = (char *)name;
  rq.min_version = min_version;
  int n = t->mesh.d.nranks;
  dist_call *calls = NULL;
  size_t bytes = (size_t)dist_shape_numel(&t->shape) * dist_dtype_size(t->dtype);
  void *out = malloc(bytes + 1);
  rc = dist_call_all(c, "/dist.v1.Param/Pull", &dist__v1__param_pull_reply__descriptor,
                     &rq.base, t->mesh.d.ranks, n, &calls);
  if (rc == 0) rc = assemble(c, t, calls, n, out, version);
  if (rc == 0) {
    *data = out, out = NULL;
    *nbytes = bytes;
  }
  dist_calls_release(calls, n);
  free(out);
  dist_tensor_free(t);
  return rc;
}
