/* Stored gradients for several parameters as one step (param.proto,
 * ParamPushBatchRequest): every daemon of the parameters' meshes applies
 * every push, or none applies any. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "param.pb-c.h"
#include "wire.h"

/* Adds m's ranks not yet in ranks[0..*n). */
static void add_ranks(const dist_mesh_desc *m, int *ranks, int *n) {
  for (int i = 0; i < m->nranks; i++) {
    int seen = 0;
    for (int j = 0; j < *n && !seen; j++) seen = ranks[j] == m->ranks[i];
    if (!seen) ranks[(*n)++] = m->ranks[i];
  }
}

/* The request: one push per parameter, each with its mesh. */
typedef struct {
  Dist__V1__ParamPushBatchRequest rq;
  Dist__V1__ParamPushRequest *pushes, **ptrs;
  dist_wire_meta *meshes;
  uint32_t *ranks;
} batch;

static void batch_free(batch *b) {
  free(b->pushes);
  free(b->ptrs);
  free(b->meshes);
  free(b->ranks);
}

static int batch_build(dist_client *c, uint64_t op_id, int n, const dist_tensor *const *params,
                       const char *const *grads, int trainer, dist_mesh_desc *unioned,
                       batch *b) {
  memset(b, 0, sizeof *b);
  b->pushes = calloc((size_t)n + 1, sizeof *b->pushes);
  b->ptrs = calloc((size_t)n + 1, sizeof *b->ptrs);
  b->meshes = calloc((size_t)n + 1, sizeof *b->meshes);
  b->ranks = calloc(DIST_MAX_MESH_RANKS, sizeof *b->ranks);
  if (!b->pushes || !b->ptrs || !b->meshes || !b->ranks)
    return dist_client_fail(c, DIST_ENOMEM, "out of memory for a step of %d parameters", n);
  memset(unioned, 0, sizeof *unioned);
  int nranks = 0;
  for (int k = 0; k < n; k++) {
    Dist__V1__ParamPushRequest *p = &b->pushes[k];
    dist__v1__param_push_request__init(p);
    p->name = (char *)params[k]->name;
    p->grad_name = (char *)grads[k];
    p->trainer = (uint32_t)trainer;
    dist_mesh_to_pb(&params[k]->mesh.d, &b->meshes[k]);
    p->mesh = &b->meshes[k].mesh;
    b->ptrs[k] = p;
    add_ranks(&params[k]->mesh.d, unioned->ranks, &nranks);
  }
  unioned->nranks = nranks;
  for (int i = 0; i < nranks; i++) b->ranks[i] = (uint32_t)unioned->ranks[i];
  dist__v1__param_push_batch_request__init(&b->rq);
  b->rq.n_pushes = (size_t)n;
  b->rq.pushes = b->ptrs;
  b->rq.op_id = op_id;
  b->rq.n_ranks = (size_t)nranks;
  b->rq.ranks = b->ranks;
  return 0;
}

int dist_param_push_batch(dist_client *c, uint64_t op_id, int n,
                          const dist_tensor *const *params, const char *const *grads,
                          int trainer) {
  if (n == 0) return 0;
  batch b;
  dist_mesh_desc unioned;
  int targets[DIST_MAX_MESH_RANKS];
  int rc = batch_build(c, op_id, n, params, grads, trainer, &unioned, &b);
  /* every daemon of the union (single client), or this trainer's (SPMD) */
  int nt = rc == 0 ? dist_targets(c, &unioned, targets) : 0;
  if (nt < 0) rc = nt;
  dist_call *calls = NULL;
  if (rc == 0 && nt > 0)
    rc = dist_call_all(c, "/dist.v1.Param/PushGradBatch",
                       &dist__v1__param_push_batch_reply__descriptor, &b.rq.base, targets, nt,
                       &calls);
  dist_calls_release(calls, nt);
  batch_free(&b);
  return rc;
}

int dist_param_push_tensors(dist_client *c, int n, const char *const *names,
                            const char *const *grad_names, int trainer) {
  if (!c) return dist_no_client(__func__);
  uint64_t op_id = dist_next_op_id(c); /* by every trainer, as a single push's */
  if (n < 0) return dist_client_fail(c, DIST_EINVAL, "%s: n is %d", __func__, n);
  if (n > 0 && (DIST_NEED(c, names) || DIST_NEED(c, grad_names))) return c->err.code;
  if (trainer < 0)
    return dist_client_fail(c, DIST_EINVAL, "%s: trainer %d is negative", __func__, trainer);
  dist_tensor **params = calloc((size_t)n + 1, sizeof *params);
  int rc = params ? 0 : dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int k = 0; rc == 0 && k < n; k++) {
    if (!names[k] || !grad_names[k])
      rc = dist_client_fail(c, DIST_EINVAL, "%s: %s[%d] is NULL", __func__,
                            names[k] ? "grad_names" : "names", k);
    else if (dist_client_check_lookup(c, __func__, names[k]) == 0)
      rc = dist_tensor_open(c, names[k], &params[k]);
    else
      rc = c->err.code;
  }
  if (rc == 0)
    rc = dist_param_push_batch(c, op_id, n, (const dist_tensor *const *)params, grad_names,
                               trainer);
  for (int k = 0; params && k < n; k++) dist_tensor_free(params[k]);
  free(params);
  return rc;
}
