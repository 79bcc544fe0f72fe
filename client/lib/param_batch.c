/* Several parameters as one request, applied by every daemon of their
 * meshes or by none (param.proto, ParamPushBatchRequest and
 * ParamConfigureBatchRequest): a layer's optimizer step, and its
 * configure. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "param.pb-c.h"
#include "wire.h"

/* What every batch carries besides its items: each parameter's mesh, and
 * the union of the meshes' ranks, which vote on it. */
typedef struct {
  dist_wire_meta *meshes;
  uint32_t *ranks;
  dist_mesh_desc unioned; /* the same ranks, as a 1-d mesh for dist_targets */
} batch_frame;

/* Adds m's ranks not yet in u. */
static void add_ranks(const dist_mesh_desc *m, dist_mesh_desc *u) {
  for (int i = 0; i < m->nranks; i++) {
    int seen = 0;
    for (int j = 0; j < u->nranks && !seen; j++) seen = u->ranks[j] == m->ranks[i];
    if (!seen) u->ranks[u->nranks++] = m->ranks[i];
  }
}

static int frame_build(dist_client *c, int n, const dist_tensor *const *params,
                       batch_frame *f) {
  memset(f, 0, sizeof *f);
  f->meshes = calloc((size_t)n + 1, sizeof *f->meshes);
  f->ranks = calloc(DIST_MAX_MESH_RANKS, sizeof *f->ranks);
  if (!f->meshes || !f->ranks)
    return dist_client_fail(c, DIST_ENOMEM, "out of memory for a batch of %d parameters", n);
  for (int k = 0; k < n; k++) {
    dist_mesh_to_pb(&params[k]->mesh.d, &f->meshes[k]);
    add_ranks(&params[k]->mesh.d, &f->unioned);
  }
  for (int i = 0; i < f->unioned.nranks; i++) f->ranks[i] = (uint32_t)f->unioned.ranks[i];
  return 0;
}

static void frame_free(batch_frame *f) {
  free(f->meshes);
  free(f->ranks);
}

/* request to every daemon of the union (single client), or to this
 * trainer's when it is one of them (SPMD). */
static int frame_send(dist_client *c, const batch_frame *f, const char *method,
                      const ProtobufCMessageDescriptor *reply_desc,
                      const ProtobufCMessage *request) {
  int targets[DIST_MAX_MESH_RANKS];
  int nt = dist_targets(c, &f->unioned, targets);
  if (nt <= 0) return nt;
  dist_call *calls = NULL;
  int rc = dist_call_all(c, method, reply_desc, request, targets, nt, &calls);
  dist_calls_release(calls, nt);
  return rc;
}

int dist_param_push_batch(dist_client *c, uint64_t op_id, int n,
                          const dist_tensor *const *params, const char *const *grads,
                          int trainer) {
  if (n == 0) return 0;
  batch_frame f;
  Dist__V1__ParamPushRequest *items = calloc((size_t)n + 1, sizeof *items);
  Dist__V1__ParamPushRequest **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
  int rc = frame_build(c, n, params, &f);
  if (rc == 0 && (!items || !ptrs)) rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int k = 0; rc == 0 && k < n; k++) {
    dist__v1__param_push_request__init(&items[k]);
    items[k].name = (char *)params[k]->name;
    items[k].grad_name = (char *)grads[k];
    items[k].trainer = (uint32_t)trainer;
    items[k].mesh = &f.meshes[k].mesh;
    ptrs[k] = &items[k];
  }
  Dist__V1__ParamPushBatchRequest rq = DIST__V1__PARAM_PUSH_BATCH_REQUEST__INIT;
  rq.n_pushes = (size_t)n, rq.pushes = ptrs, rq.op_id = op_id;
  rq.n_ranks = (size_t)f.unioned.nranks, rq.ranks = f.ranks;
  if (rc == 0)
    rc = frame_send(c, &f, "/dist.v1.Param/PushGradBatch",
                    &dist__v1__param_push_batch_reply__descriptor, &rq.base);
  frame_free(&f);
  free(items);
  free(ptrs);
  return rc;
}

int dist_param_configure_batch(dist_client *c, uint64_t op_id, int n,
                               const dist_tensor *const *params,
                               const Dist__V1__ParamConfigureRequest *how) {
  if (n == 0) return 0;
  batch_frame f;
  Dist__V1__ParamConfigureRequest *items = calloc((size_t)n + 1, sizeof *items);
  Dist__V1__ParamConfigureRequest **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
  int rc = frame_build(c, n, params, &f);
  if (rc == 0 && (!items || !ptrs)) rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int k = 0; rc == 0 && k < n; k++) {
    items[k] = *how;
    items[k].name = (char *)params[k]->name;
    items[k].mesh = &f.meshes[k].mesh;
    ptrs[k] = &items[k];
  }
  Dist__V1__ParamConfigureBatchRequest rq = DIST__V1__PARAM_CONFIGURE_BATCH_REQUEST__INIT;
  rq.n_configures = (size_t)n, rq.configures = ptrs, rq.op_id = op_id;
  rq.n_ranks = (size_t)f.unioned.nranks, rq.ranks = f.ranks;
  if (rc == 0)
    rc = frame_send(c, &f, "/dist.v1.Param/ConfigureBatch",
                    &dist__v1__param_configure_batch_reply__descriptor, &rq.base);
  frame_free(&f);
  free(items);
  free(ptrs);
  return rc;
}

/* The stored parameters names[0..n) (func's argument), opened: *out
 * (free with close_params). */
static int open_params(dist_client *c, const char *func, int n, const char *const *names,
                       dist_tensor ***out) {
  dist_tensor **params = *out = calloc((size_t)n + 1, sizeof *params);
  if (!params) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int k = 0; k < n; k++) {
    if (!names[k]) return dist_client_fail(c, DIST_EINVAL, "%s: names[%d] is NULL", func, k);
    if (dist_client_check_lookup(c, func, names[k]) != 0) return c->err.code;
    int rc = dist_tensor_open(c, names[k], &params[k]);
    if (rc != 0) return rc;
  }
  return 0;
}

static void close_params(dist_tensor **params, int n) {
  for (int k = 0; params && k < n; k++) dist_tensor_free(params[k]);
  free(params);
}

int dist_param_push_tensors(dist_client *c, int n, const char *const *names,
                            const char *const *grad_names, int trainer) {
  if (!c) return dist_no_client(__func__);
  uint64_t op_id = dist_next_op_id(c); /* by every trainer, as a single push's */
  if (n < 0) return dist_client_fail(c, DIST_EINVAL, "%s: n is %d", __func__, n);
  if (n > 0 && (DIST_NEED(c, names) || DIST_NEED(c, grad_names))) return c->err.code;
  if (dist_client_check_trainer(c, __func__, trainer)) return c->err.code;
  for (int k = 0; k < n; k++)
    if (!grad_names[k])
      return dist_client_fail(c, DIST_EINVAL, "%s: grad_names[%d] is NULL", __func__, k);
  dist_tensor **params = NULL;
  int rc = open_params(c, __func__, n, names, &params);
  if (rc == 0)
    rc = dist_param_push_batch(c, op_id, n, (const dist_tensor *const *)params, grad_names,
                               trainer);
  close_params(params, n);
  return rc;
}

int dist_param_configure_named(dist_client *c, const char *func, int n,
                               const char *const *names, const dist_param_opts *opts) {
  uint64_t op_id = dist_next_op_id(c); /* by every SPMD trainer, first */
  Dist__V1__OptimizerConfig opt;
  Dist__V1__ParamConfigureRequest how;
  dist_tensor **params = NULL;
  int rc = dist_param_configure_request(c, opts, 0, &how, &opt);
  if (rc == 0) rc = open_params(c, func, n, names, &params);
  if (rc == 0)
    rc = dist_param_configure_batch(c, op_id, n, (const dist_tensor *const *)params, &how);
  close_params(params, n);
  return rc;
}
