/* shard_tensor, dtensor_from_local, dtensor_to_local, full_tensor, reshard,
 * delete: each a fan-out of one request per daemon with one op id. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "wire.h"

dist_tensor *dist_tensor_from_meta(const Dist__V1__TensorMeta *m) {
  dist_tensor *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  snprintf(t->name, sizeof t->name, "%s", m->name);
  t->dtype = (dist_dtype)m->dtype;
  dist_shape_from_pb(m->global_shape, m->n_global_shape, &t->shape, NULL);
  if (m->mesh) dist_mesh_from_pb(m->mesh, &t->mesh.d, NULL);
  dist_placements_from_pb(m->placements, m->n_placements, t->placements, NULL);
  t->version = m->version;
  return t;
}

int dist_client_check_name(dist_client *c, const char *what, const char *name) {
  if (!name) return dist_client_null_arg(c, what, "name");
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (dist_name_check(name, &eb) != 0)
    return dist_client_fail(c, eb.code, "%s: %s", what, dist_errbuf_msg(&eb));
  return 0;
}

int dist_client_check_lookup(dist_client *c, const char *func, const char *name) {
  if (!name) return dist_client_null_arg(c, func, "name");
  size_t len = strlen(name);
  if (len == 0 || len > DIST_NAME_LEN_MAX)
    return dist_client_fail(c, DIST_EINVAL, "%s: tensor name of %zu bytes (1 to %d allowed)",
                            func, len, DIST_NAME_LEN_MAX);
  return 0;
}

static int check_placements(dist_client *c, const dist_mesh *mesh,
                            const dist_placement *p, int ndim) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (dist_placements_check(&mesh->d, p, mesh->d.ndim, ndim, &eb) != 0)
    return dist_client_fail(c, eb.code, "%s", dist_errbuf_msg(&eb));
  return 0;
}

/* The put requests of one tensor; w[i] owns the metadata of request i. */
typedef struct put_batch {
  int n;
  int targets[DIST_MAX_MESH_RANKS];
  Dist__V1__TensorPutRequest *reqs;
  dist_wire_meta *w;
  dist_call *calls;
  void **pieces; /* slices this batch allocated */
} put_batch;

static void batch_free(put_batch *b) {
  if (b->calls) dist_calls_free(b->calls, b->n);
  for (int i = 0; b->pieces && i < b->n; i++) free(b->pieces[i]);
  free(b->reqs);
  free(b->w);
  free(b->calls);
  free(b->pieces);
}

/* 0, or DIST_ENOMEM (failing c, refusing op on the mesh) with nothing
 * kept. */
static int batch_init(dist_client *c, put_batch *b, int n, uint64_t op,
                      const dist_mesh_desc *mesh) {
  b->n = n;
  b->reqs = calloc((size_t)n + 1, sizeof *b->reqs);
  b->w = calloc((size_t)n + 1, sizeof *b->w);
  b->calls = calloc((size_t)n + 1, sizeof *b->calls);
  b->pieces = calloc((size_t)n + 1, sizeof *b->pieces);
  if (b->reqs && b->w && b->calls && b->pieces) return 0;
  batch_free(b);
  dist_client_fail(c, DIST_ENOMEM, "out of memory for the requests of a put to %d daemons", n);
  return dist_spmd_refused_on(c, op, mesh);
}

int dist_delete_one(dist_client *c, const char *name, int rank, int *unanswered) {
  Dist__V1__TensorDeleteRequest rq = DIST__V1__TENSOR_DELETE_REQUEST__INIT;
  rq.name = (char *)name;
  return dist_call_one_heard(c, rank, "/dist.v1.Dist/TensorDelete", &rq.base,
                             &dist__v1__tensor_delete_reply__descriptor, unanswered);
}

/* Deletes name on the given daemons, best effort (keeps c's error); what
 * could be done later goes on later (dist_later_delete_or_note). */
void dist_delete_on(dist_client *c, const char *name, const int *ranks, int n,
                    dist_later *later) {
  dist_errbuf keep = c->err;
  for (int i = 0; i < n; i++) {
    int silent = 0; /* one daemon each */
    dist_later_delete_or_note(c, later, name, ranks[i], &silent);
  }
  c->err = keep;
}

/* Removes the pieces the batch created (also where a reply was lost). */
static void undo_puts(dist_client *c, put_batch *b) {
  dist_errbuf keep = c->err;
  for (int i = 0; i < b->n; i++)
    if (b->calls[i].applied && !b->reqs[i].replace)
      dist_delete_one(c, b->reqs[i].meta->name, b->targets[i], NULL);
  c->err = keep;
}

/* The daemons of a put's mesh refuse a name they hold (those of a
 * LocalLayer call refuse one they could not wholly replace); this asks the
 * others, where the name may live on under a mesh disjoint from m: it
 * would then mean two tensors, and an open or a delete would meet only
 * one of them. A held mesh that shares a rank with m is for m's daemons
 * to judge. Pieces that each live on their own daemon's one-rank mesh
 * under one name are per-rank values (a kept exchange result, the tape's
 * per-rank gradients), so a one-rank put meeting a one-rank tensor is no
 * clash. A put asks after storing, so that of two clients putting one
 * name onto disjoint meshes at once, at least one sees the other's. A
 * daemon that does not answer is not counted; one that could not be asked,
 * or could not answer, for want of memory fails the put. */
static int meshes_share_a_rank(const dist_mesh_desc *a, const dist_mesh_desc *b) {
  for (int i = 0; i < a->nranks; i++)
    if (dist_mesh_index_of(b, a->ranks[i]) >= 0) return 1;
  return 0;
}

/* The ranks the client reaches outside m, in outside[] (room for c->n);
 * how many. */
static int ranks_outside(dist_client *c, const dist_mesh_desc *m, int *outside) {
  int n = 0;
  for (int p = 0; p < c->n; p++)
    if (dist_mesh_index_of(m, dist_rank_at(c, p)) < 0) outside[n++] = dist_rank_at(c, p);
  return n;
}

/* A daemon outside m that held the name on a disjoint mesh, named in
 * c->err (DIST_EEXIST); 0 when none did. */
static int refuse_held_on(dist_client *c, const char *name, const dist_call *call,
                          const dist_mesh_desc *m) {
  const Dist__V1__TensorShowReply *rp = (const void *)call->reply;
  if (!rp || !rp->meta) return 0;
  dist_mesh_desc held = {0};
  if (rp->meta->mesh) dist_mesh_from_pb(rp->meta->mesh, &held, NULL);
  if ((m->nranks == 1 && held.nranks == 1) || meshes_share_a_rank(&held, m)) return 0;
  char there[128];
  dist_mesh_format(&held, there, sizeof there);
  return dist_client_fail(c, DIST_EEXIST, "tensor '%s' already exists on rank %d (mesh %s): "
                          "delete it first", name, call->target, there);
}

int dist_held_elsewhere(dist_client *c, const char *name, const dist_mesh_desc *m) {
  Dist__V1__TensorShowRequest rq = DIST__V1__TENSOR_SHOW_REQUEST__INIT;
  rq.name = (char *)name;
  int *outside = calloc((size_t)c->n + 1, sizeof *outside), rc = 0;
  if (!outside) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  int n = ranks_outside(c, m, outside);
  dist_errbuf keep = c->err;
  dist_call *calls = NULL;
  rc = n ? dist_call_all(c, "/dist.v1.Dist/TensorShow", &dist__v1__tensor_show_reply__descriptor,
                         &rq.base, outside, n, &calls)
         : 0;
  if (n && !calls) { /* c->err says the calls could not be made */
    free(outside);
    return rc;
  }
  c->err = keep; /* "not found" is the answer hoped for */
  rc = 0;
  for (int k = 0; k < n && rc == 0; k++) {
    /* Unlike a daemon that does not answer, a check that could not be
     * made for want of memory (the client's, or the daemon's answering
     * ENOMEM) must not let the put through. */
    if (calls[k].err.code == DIST_ENOMEM)
      rc = dist_client_fail(c, DIST_ENOMEM, "cannot check whether '%s' is held outside its "
                            "mesh: %s", name, dist_errbuf_msg(&calls[k].err));
    else
      rc = refuse_held_on(c, name, &calls[k], m);
  }
  dist_calls_release(calls, n);
  free(outside);
  return rc;
}

/* The first error of a delete sent to several daemons, naming its rank;
 * "not found" is fine on a daemon that held none, not on `opened` (-1:
 * none), the one the tensor was found on. */
static int delete_result(dist_client *c, const dist_call *calls, int n, int opened) {
  for (int i = 0; i < n; i++) {
    int code = calls[i].err.code;
    if (code && (code != DIST_ENOTFOUND || calls[i].target == opened))
      return dist_call_fail(c, &calls[i]);
  }
  c->err = (dist_errbuf)DIST_ERRBUF_INIT;
  return 0;
}

/* After a replacing put onto m, deletes the name from the daemons outside
 * m: pieces of an older layout left there would make it mean two
 * tensors. */
static int drop_outside(dist_client *c, const char *name, const dist_mesh_desc *m) {
  int *outside = calloc((size_t)c->n + 1, sizeof *outside);
  if (!outside) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  int n = ranks_outside(c, m, outside);
  Dist__V1__TensorDeleteRequest rq = DIST__V1__TENSOR_DELETE_REQUEST__INIT;
  rq.name = (char *)name;
  dist_call *calls = NULL;
  int rc = n ? dist_call_all(c, "/dist.v1.Dist/TensorDelete",
                             &dist__v1__tensor_delete_reply__descriptor, &rq.base, outside, n,
                             &calls)
             : 0;
  if (calls) rc = delete_result(c, calls, n, -1);
  if (rc != 0)
    dist_errbuf_prefix(&c->err, "'%s' was stored, but its older pieces outside the new mesh "
                       "were not all deleted: ", name);
  dist_calls_release(calls, n);
  free(outside);
  return rc;
}

/* Sends the batch. A new name held outside the mesh, or a partial failure
 * (daemons before 0.2.3 store a shard_tensor piece without voting),
 * removes what was created, so a failed put leaves nothing behind. A
 * replacing put then drops the name outside the mesh. */
static int batch_send(dist_client *c, put_batch *b, const dist_mesh_desc *mesh, int replace,
                      dist_tensor **out) {
  for (int i = 0; i < b->n; i++) {
    b->calls[i].target = b->targets[i];
    b->calls[i].request = &b->reqs[i].base;
    b->reqs[i].replace = replace != 0;
  }
  const char *name = b->reqs[0].meta->name;
  int rc = dist_call_many(c, "/dist.v1.Dist/TensorPut",
                          &dist__v1__tensor_put_reply__descriptor, b->calls, b->n);
  if (rc == 0) rc = replace ? drop_outside(c, name, mesh) : dist_held_elsewhere(c, name, mesh);
  if (rc != 0) {
    undo_puts(c, b);
    return rc;
  }
  *out = dist_tensor_from_meta(((Dist__V1__TensorPutReply *)b->calls[0].reply)->meta);
  if (*out) {
    dist_later_forget_stored(c, name, mesh);
    return 0;
  }
  undo_puts(c, b);
  return dist_client_fail(c, DIST_ENOMEM, "out of memory for the handle of '%s'", name);
}

/* The daemons a put under op id op goes to (dist_targets): none for an
 * SPMD trainer outside the mesh, which checks the arguments as the others
 * do and then holds an empty piece (spmd_outside.c); a mesh naming a
 * daemon the client does not know is refused to the others. */
static int put_targets(dist_client *c, uint64_t op, const dist_mesh_desc *mesh, int *targets) {
  int n = dist_targets(c, mesh, targets);
  return n < 0 ? dist_spmd_refused_on(c, op, mesh) : n;
}

static size_t local_numel(const dist_shape *s) { return (size_t)dist_shape_numel(s); }

/* The logical value of shard_tensor is the tensor given, so along a Partial
 * mesh dim coordinate 0 keeps the value and the other ranks hold the
 * reduction's identity (Paddle's Replicate -> Partial rule; avg keeps it
 * everywhere). Without this every rank would hold the whole value and a
 * Partial(sum) over k ranks would read back as k times it. */
static void as_partial_piece(const dist_mesh_desc *m, const dist_placement *p,
                             const int *coords, void *piece, size_t n,
                             dist_dtype dt) {
  for (int md = 0; md < m->ndim; md++)
    if (p[md].kind == DIST_PARTIAL && coords[md] != 0 &&
        p[md].reduce != DIST_REDUCE_AVG) {
      dist_reduce_identity(piece, n, dt, p[md].reduce);
      return;
    }
}

/* shard_tensor's own checks of its arguments; *global gets the shape. */
static int check_put_args(dist_client *c, const char *name, const void *data, int ndim,
                          const int64_t *shape, const dist_mesh *mesh,
                          const dist_placement *placements, dist_shape *global) {
  if (dist_client_check_name(c, "shard_tensor", name) != 0) return c->err.code;
  if (!shape && ndim > 0) return dist_client_null_arg(c, "dist_shard_tensor", "shape");
  if (!placements) return dist_client_null_arg(c, "dist_shard_tensor", "placements");
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (dist_shape_make(ndim, shape, global, &eb) != 0)
    return dist_client_fail(c, eb.code, "shard_tensor '%s': %s", name, dist_errbuf_msg(&eb));
  if (!data && dist_shape_numel(global) > 0)
    return dist_client_null_arg(c, "dist_shard_tensor", "data");
  return check_placements(c, mesh, placements, ndim);
}

static int shard_put(dist_client *c, const char *name, const void *data, dist_dtype dt,
                     int ndim, const int64_t *shape, const dist_mesh *mesh,
                     const dist_placement *placements, int replace, dist_tensor **out) {
  if (!out) return dist_client_null_arg(c, "dist_shard_tensor", "out");
  if (!mesh) return dist_client_null_arg(c, "dist_shard_tensor", "mesh");
  *out = NULL;
  /* The daemons vote under it. A one-rank mesh has nobody to vote with,
   * and takes none: an SPMD trainer putting a value of its own must not
   * move its op ids ahead of the other trainers'. Taken before the checks
   * of the arguments, and by every trainer, in the mesh or not: a trainer
   * that refuses the put keeps counting in step with the others, and
   * tells them. */
  uint64_t op = mesh->d.nranks > 1 ? dist_next_op_id(c) : 0;
  int targets[DIST_MAX_MESH_RANKS];
  int n = put_targets(c, op, &mesh->d, targets);
  if (n < 0) return n;
  dist_shape global;
  if (check_put_args(c, name, data, ndim, shape, mesh, placements, &global) != 0)
    return dist_spmd_refused_on(c, op, &mesh->d);
  if (n == 0) return dist_tensor_outsider(c, name, dt, &global, mesh, placements, out);
  put_batch b;
  if (batch_init(c, &b, n, op, &mesh->d) != 0) return c->err.code;
  size_t elem = dist_dtype_size(dt);
  for (int i = 0; i < n; i++) {
    int idx = dist_mesh_index_of(&mesh->d, targets[i]), coords[DIST_MAX_MESH_DIMS];
    dist_shape local;
    int64_t offset[DIST_MAX_DIMS];
    dist_mesh_coords(&mesh->d, idx, coords);
    dist_local_box(&mesh->d, placements, &global, coords, &local, offset);
    size_t bytes = (size_t)dist_shape_numel(&local) * elem;
    if (!(b.pieces[i] = malloc(bytes + 1))) {
      batch_free(&b);
      dist_client_fail(c, DIST_ENOMEM, "shard_tensor '%s': no memory for rank %d's "
                       "piece of %zu bytes", name, targets[i], bytes);
      return dist_spmd_refused_on(c, op, &mesh->d);
    }
    dist_copy_box_out(b.pieces[i], data, &global, offset, &local, elem);
    as_partial_piece(&mesh->d, placements, coords, b.pieces[i], local_numel(&local), dt);
    b.targets[i] = targets[i];
    dist__v1__tensor_put_request__init(&b.reqs[i]);
    dist_meta_to_pb(name, dt, &global, &mesh->d, placements, &b.w[i]);
    b.reqs[i].meta = &b.w[i].meta;
    b.reqs[i].op_id = op;
    b.reqs[i].data.data = b.pieces[i];
    b.reqs[i].data.len = bytes;
  }
  int rc = batch_send(c, &b, &mesh->d, replace, out);
  batch_free(&b);
  return rc;
}

int dist_shard_tensor(dist_client *c, const char *name, const void *data,
                      dist_dtype dt, int ndim, const int64_t *shape,
                      const dist_mesh *mesh, const dist_placement *placements,
                      dist_tensor **out) {
  if (!c) return dist_no_client(__func__);
  return shard_put(c, name, data, dt, ndim, shape, mesh, placements, 0, out);
}

int dist_shard_tensor_replacing(dist_client *c, const char *name, const void *data,
                                dist_dtype dt, int ndim, const int64_t *shape,
                                const dist_mesh *mesh, const dist_placement *placements,
                                dist_tensor **out) {
  return shard_put(c, name, data, dt, ndim, shape, mesh, placements, 1, out);
}

/* dtensor_from_local's own checks of its arguments; locals[i] gets the
 * shape of the piece for targets[i]. */
static int check_local_args(dist_client *c, const char *name, const void *const *pieces,
                            int ndim, const int64_t *const *shapes, const dist_mesh *mesh,
                            const dist_placement *placements, const int *targets, int n,
                            dist_shape *locals) {
  static const char func[] = "dist_dtensor_from_local";
  if (dist_client_check_name(c, "dtensor_from_local", name) != 0) return c->err.code;
  if (ndim < 0 || ndim > DIST_MAX_DIMS)
    return dist_client_fail(c, DIST_EINVAL, "%d dims (0 to %d allowed)", ndim, DIST_MAX_DIMS);
  if (!pieces) return dist_client_null_arg(c, func, "pieces");
  if (!shapes) return dist_client_null_arg(c, func, "shapes");
  if (!placements) return dist_client_null_arg(c, func, "placements");
  if (check_placements(c, mesh, placements, ndim) != 0) return c->err.code;
  for (int i = 0; i < n; i++) {
    int k = c->spmd_rank >= 0 ? 0 : i; /* SPMD: our one piece */
    dist_errbuf eb = DIST_ERRBUF_INIT;
    if (!shapes[k] && ndim > 0)
      return dist_client_fail(c, DIST_EINVAL, "%s: shapes[%d] is NULL", func, k);
    if (dist_shape_make(ndim, shapes[k], &locals[i], &eb) != 0)
      return dist_client_fail(c, eb.code, "dtensor_from_local '%s': rank %d's piece: %s",
                              name, targets[i], dist_errbuf_msg(&eb));
    if (!pieces[k] && dist_shape_numel(&locals[i]) > 0)
      return dist_client_fail(c, DIST_EINVAL, "%s: pieces[%d] is NULL", func, k);
  }
  return 0;
}

/* dtensor_from_local of an SPMD trainer outside the mesh: its arguments
 * checked as the members check theirs (it told nobody; nobody waits for
 * it), then a handle of the global shape Paddle derives from its piece's. */
static int outsider_from_local(dist_client *c, const char *name, const void *const *pieces,
                               dist_dtype dt, int ndim, const int64_t *const *shapes,
                               const dist_mesh *mesh, const dist_placement *placements,
                               dist_tensor **out) {
  dist_shape local, global;
  if (check_local_args(c, name, pieces, ndim, shapes, mesh, placements, &c->spmd_rank, 1,
                       &local) != 0)
    return c->err.code;
  dist_global_from_local(&mesh->d, placements, &local, &global);
  return dist_tensor_outsider(c, name, dt, &global, mesh, placements, out);
}

int dist_dtensor_from_local(dist_client *c, const char *name,
                            const void *const *pieces, dist_dtype dt, int ndim,
                            const int64_t *const *shapes, const dist_mesh *mesh,
                            const dist_placement *placements, dist_tensor **out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out) || DIST_NEED(c, mesh)) return c->err.code;
  *out = NULL;
  uint64_t op = dist_next_op_id(c); /* before the checks, as in shard_put */
  int targets[DIST_MAX_MESH_RANKS];
  int n = put_targets(c, op, &mesh->d, targets);
  if (n < 0) return n;
  dist_shape locals[DIST_MAX_MESH_RANKS];
  if (n == 0) /* outside the mesh: its own piece's shape gives the global one */
    return outsider_from_local(c, name, pieces, dt, ndim, shapes, mesh, placements, out);
  if (check_local_args(c, name, pieces, ndim, shapes, mesh, placements, targets, n, locals) != 0)
    return dist_spmd_refused_on(c, op, &mesh->d);
  put_batch b;
  if (batch_init(c, &b, n, op, &mesh->d) != 0) return c->err.code;
  dist_shape global = {ndim, {0}};
  for (int i = 0; i < n; i++) {
    int k = c->spmd_rank >= 0 ? 0 : i;
    const dist_shape local = locals[i];
    b.targets[i] = targets[i];
    dist__v1__tensor_put_request__init(&b.reqs[i]);
    dist_meta_to_pb(name, dt, &global, &mesh->d, placements, &b.w[i]);
    for (int d = 0; d < ndim; d++) b.w[i].local_shape[d] = (uint64_t)local.dims[d];
    b.w[i].meta.n_local_shape = (size_t)ndim;
    b.w[i].meta.local_shape = b.w[i].local_shape;
    b.reqs[i].meta = &b.w[i].meta;
    b.reqs[i].derive_global_shape = 1;
    b.reqs[i].op_id = op;
    b.reqs[i].data.data = (uint8_t *)pieces[k];
    b.reqs[i].data.len = (size_t)dist_shape_numel(&local) * dist_dtype_size(dt);
  }
  int rc = batch_send(c, &b, &mesh->d, 0, out);
  batch_free(&b);
  return rc;
}

static int take_data(dist_client *c, const char *name, const Dist__V1__TensorGetReply *rp,
                     void **data, size_t *nbytes, int64_t *shape) {
  if (!(*data = malloc(rp->data.len + 1)))
    return dist_client_fail(c, DIST_ENOMEM, "out of memory for %zu bytes of '%s'",
                            rp->data.len, name);
  if (rp->data.len) memcpy(*data, rp->data.data, rp->data.len); /* empty pieces: NULL */
  *nbytes = rp->data.len;
  for (size_t d = 0; shape && d < rp->n_shape; d++) shape[d] = (int64_t)rp->shape[d];
  return 0;
}

/* TensorGet to the given daemons with one op id; the first reply's data
 * (and shape, when asked) is the result. */
static int get_from(dist_client *c, const dist_tensor *t, int full, const int *targets, int n,
                    void **data, size_t *nbytes, int64_t *shape) {
  Dist__V1__TensorGetRequest rq = DIST__V1__TENSOR_GET_REQUEST__INIT;
  rq.name = (char *)t->name;
  rq.full = full;
  rq.op_id = full ? dist_next_op_id(c) : 0;
  dist_call *calls = NULL;
  int rc = dist_call_all(c, "/dist.v1.Dist/TensorGet", &dist__v1__tensor_get_reply__descriptor,
                         &rq.base, targets, n, &calls);
  if (rc == 0) rc = take_data(c, t->name, (Dist__V1__TensorGetReply *)calls[0].reply, data, nbytes, shape);
  dist_calls_release(calls, n);
  return rc;
}

int dist_dtensor_to_local(dist_client *c, const dist_tensor *t, int rank,
                          void **data, size_t *nbytes, int64_t *shape) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, t) || DIST_NEED(c, data) || DIST_NEED(c, nbytes)) return c->err.code;
  *data = NULL;
  if (rank < 0) rank = c->spmd_rank;
  if (dist_client_check_reach(c, __func__, rank) != 0) return c->err.code;
  if (rank == c->spmd_rank && t->no_piece)
    return dist_empty_local(c, t, data, nbytes, shape);
  return get_from(c, t, 0, &rank, 1, data, nbytes, shape);
}

int dist_full_tensor(dist_client *c, const dist_tensor *t, void **data,
                     size_t *nbytes) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, t) || DIST_NEED(c, data) || DIST_NEED(c, nbytes)) return c->err.code;
  *data = NULL;
  int targets[DIST_MAX_MESH_RANKS];
  int n = dist_targets(c, &t->mesh.d, targets);
  /* SPMD, outside the mesh: Paddle's full_tensor reshards to Replicate
   * on the mesh, a no-op there, and gives the local value, empty; the op
   * id is taken as the others take it. */
  if (n == 0) {
    dist_next_op_id(c);
    return dist_empty_local(c, t, data, nbytes, NULL);
  }
  if (n < 0) return n;
  return get_from(c, t, 1, targets, n, data, nbytes, NULL);
}

/* Reshard goes to every rank of both meshes. */
static int union_targets(dist_client *c, const dist_mesh_desc *a,
                         const dist_mesh_desc *b, int *targets) {
  if (c->spmd_rank >= 0) {
    targets[0] = c->spmd_rank;
    return 1;
  }
  int n = 0;
  for (int i = 0; i < a->nranks; i++) targets[n++] = a->ranks[i];
  for (int i = 0; i < b->nranks; i++)
    if (dist_mesh_index_of(a, b->ranks[i]) < 0) targets[n++] = b->ranks[i];
  return n;
}

/* dist_spmd_refused of a reshard: to the daemons of both meshes (those
 * the client reaches: a destination may name others, which is the
 * refusal). */
static int refuse_reshard(dist_client *c, uint64_t op, const dist_mesh_desc *src,
                          const dist_mesh_desc *dst) {
  uint32_t *ranks = calloc(2 * DIST_MAX_MESH_RANKS, sizeof *ranks);
  int n = 0;
  for (int i = 0; ranks && i < src->nranks; i++) ranks[n++] = (uint32_t)src->ranks[i];
  for (int i = 0; ranks && i < dst->nranks; i++)
    if (dist_client_reaches(c, dst->ranks[i]) && dist_mesh_index_of(src, dst->ranks[i]) < 0)
      ranks[n++] = (uint32_t)dst->ranks[i];
  int rc = ranks ? dist_spmd_refused(c, op, ranks, n) : c->err.code;
  free(ranks);
  return rc;
}

/* The handle after a reshard to dst with placements p. */
static void take_layout(const dist_client *c, dist_tensor *t, const dist_mesh_desc *dst,
                        const dist_placement *p) {
  t->mesh.d = *dst;
  t->no_piece = dist_spmd_outside(c, dst);
  memcpy(t->placements, p, sizeof *p * (size_t)dst->ndim);
}

/* The tensor as the reshard's daemons describe it, from the first that
 * did (all of a mesh agree: the vote decides the version, and the global
 * shape came from the source's daemons): its version, and its global
 * shape, which a handle made outside the source mesh had guessed from an
 * empty piece (dist_global_from_local). Kept as it was when none did (a
 * daemon older than the reply's meta, or an SPMD trainer leaving the
 * mesh, whose daemon keeps no piece). */
static void take_reshard_meta(dist_tensor *t, const dist_call *calls, int n) {
  for (int i = 0; i < n; i++) {
    const Dist__V1__ReshardReply *r = (const Dist__V1__ReshardReply *)calls[i].reply;
    if (!r || !r->meta || !r->meta->version) continue;
    t->version = r->meta->version;
    dist_shape global;
    /* Only a shape of the handle's rank: its placements were checked
     * against that (a Shard(d) past another count of dims would be taken). */
    if (dist_shape_from_pb(r->meta->global_shape, r->meta->n_global_shape, &global, NULL) == 0 &&
        global.ndim == t->shape.ndim)
      t->shape = global;
    return;
  }
}

int dist_reshard_refused(dist_client *c, const dist_tensor *t, const dist_mesh *mesh) {
  if (c->spmd_rank < 0) return c->err.code;
  return refuse_reshard(c, dist_next_op_id(c), &t->mesh.d, mesh ? &mesh->d : &t->mesh.d);
}

int dist_reshard(dist_client *c, dist_tensor *t, const dist_mesh *mesh,
                 const dist_placement *placements) {
  if (!c) return dist_no_client(__func__);
  /* Every SPMD trainer takes a reshard's op id (below), so one given no
   * tensor takes it too, and tells every daemon: its mesh is not known. */
  if (DIST_NEED(c, t)) return dist_spmd_refused_group(c, dist_next_op_id(c), NULL, 0);
  const dist_mesh_desc *dst = mesh ? &mesh->d : &t->mesh.d;
  /* Taken before the checks, as in shard_put (every SPMD trainer takes
   * part in a reshard: one outside both meshes asks its daemon too). */
  uint64_t op = dist_next_op_id(c);
  if (!placements) {
    dist_client_null_arg(c, __func__, "placements");
    return refuse_reshard(c, op, &t->mesh.d, dst);
  }
  if (check_placements(c, mesh ? mesh : &t->mesh, placements, t->shape.ndim) != 0)
    return refuse_reshard(c, op, &t->mesh.d, dst);
  int *targets = calloc(2 * DIST_MAX_MESH_RANKS, sizeof *targets);
  dist_wire_meta *w = calloc(2, sizeof *w);
  if (!targets || !w) {
    free(targets), free(w);
    dist_client_fail(c, DIST_ENOMEM, "out of memory for the reshard of '%s'", t->name);
    return refuse_reshard(c, op, &t->mesh.d, dst);
  }
  /* Every rank of the destination must be a daemon the client knows. */
  if (dist_targets(c, dst, targets) < 0) {
    free(targets), free(w);
    return refuse_reshard(c, op, &t->mesh.d, dst);
  }
  if (dist_spmd_outside(c, &t->mesh.d) && dist_spmd_outside(c, dst)) {
    /* Nothing here to move, and nobody waits for this rank (Paddle's
     * reshard outside both meshes sets the placements only). */
    free(targets), free(w);
    take_layout(c, t, dst, placements);
    return 0;
  }
  int n = union_targets(c, &t->mesh.d, dst, targets);
  Dist__V1__ReshardRequest rq = DIST__V1__RESHARD_REQUEST__INIT;
  rq.name = t->name;
  rq.op_id = op;
  dist_mesh_to_pb(dst, &w[0]);
  dist_placements_to_pb(placements, dst->ndim, &w[0]);
  rq.mesh = &w[0].mesh;
  rq.n_placements = (size_t)dst->ndim;
  rq.placements = w[0].placement_ptrs;
  dist_mesh_to_pb(&t->mesh.d, &w[1]);
  rq.src_mesh = &w[1].mesh;
  dist_call *calls = NULL;
  int rc = dist_call_all(c, "/dist.v1.Dist/Reshard", &dist__v1__reshard_reply__descriptor,
                         &rq.base, targets, n, &calls);
  if (rc == 0) {
    take_layout(c, t, dst, placements);
    take_reshard_meta(t, calls, n);
  }
  /* The vote moved the tensor on every daemon where one said so, though
   * another's reply was lost (the caller opens it again): notes of its
   * name on the new ranks are of older tensors either way. */
  if (dist_calls_any_applied(calls, n)) dist_later_forget_stored(c, t->name, dst);
  dist_calls_release(calls, n);
  free(w);
  free(targets);
  return rc;
}

/* Whether a daemon described the tensor asked for. */
static int found_meta(const dist_call *calls, int n) {
  for (int i = 0; i < n; i++)
    if (calls[i].reply && ((const Dist__V1__TensorShowReply *)calls[i].reply)->meta) return 1;
  return 0;
}

/* Notes name on later (NULL: not noted) for each daemon of calls[0..n)
 * that did not do what it was asked but may when asked again
 * (dist_later_worth_retrying). */
static void note_retryable(dist_client *c, dist_later *later, const char *name,
                           const dist_call *calls, int n) {
  for (int i = 0; later && calls && i < n; i++)
    if (dist_later_worth_retrying(&calls[i])) dist_later_note(c, later, name, calls[i].target);
}

/* dist_tensor_open; when no daemon that answered holds name, name is
 * noted on later (NULL: not noted) for a delete on each daemon that did
 * not answer, as it may hold it. */
static int open_noting(dist_client *c, const char *name, dist_tensor **out,
                       dist_later *later) {
  Dist__V1__TensorShowRequest rq = DIST__V1__TENSOR_SHOW_REQUEST__INIT;
  rq.name = (char *)name;
  int n = c->spmd_rank >= 0 ? 1 : c->n;
  dist_call *calls = NULL;
  int rc = dist_call_all(c, "/dist.v1.Dist/TensorShow", &dist__v1__tensor_show_reply__descriptor,
                         &rq.base, c->spmd_rank >= 0 ? &c->spmd_rank : NULL, n, &calls);
  if (!calls) return rc;
  for (int i = 0; i < n && !*out; i++)
    if (calls[i].reply && ((Dist__V1__TensorShowReply *)calls[i].reply)->meta)
      *out = dist_tensor_from_meta(((Dist__V1__TensorShowReply *)calls[i].reply)->meta);
  if (*out) {
    rc = 0;
    c->err = (dist_errbuf)DIST_ERRBUF_INIT;
  } else if (found_meta(calls, n)) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory for the handle of '%s'", name);
  } else if (rc == 0) {
    rc = dist_client_fail(c, DIST_EPROTO, "TensorShow of '%s' answered without a "
                          "description", name);
  } else {
    /* "Not found" only when every daemon said so: one that could not be
     * reached may hold the tensor, and is the error worth reporting. */
    for (int i = 0; i < n; i++)
      if (calls[i].err.code && calls[i].err.code != DIST_ENOTFOUND) {
        rc = dist_call_fail(c, &calls[i]);
        break;
      }
    note_retryable(c, later, name, calls, n);
  }
  dist_calls_release(calls, n);
  return rc;
}

/* A single client asks every daemon, since a tensor need not live on rank 0
 * (a mesh of [2, 3], or one resharded there); the first that holds it
 * answers. SPMD trainers ask their own daemon. */
int dist_tensor_open(dist_client *c, const char *name, dist_tensor **out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out)) return c->err.code;
  *out = NULL;
  if (dist_client_check_lookup(c, __func__, name) != 0) return c->err.code;
  return open_noting(c, name, out, NULL);
}

/* Deletes t from the daemons of its mesh (in SPMD mode, from this
 * trainer's). A single client deleting per-rank values (the name on
 * one-rank meshes) deletes them from every daemon, so the name is gone.
 * A daemon's delete that was not done but may be later is noted on later
 * (NULL: not noted). */
static int delete_on_mesh(dist_client *c, const dist_tensor *t, dist_later *later) {
  const char *name = t->name;
  int rc, per_rank = c->spmd_rank < 0 && t->mesh.d.nranks == 1, targets[DIST_MAX_MESH_RANKS];
  int n = per_rank ? c->n : dist_targets(c, &t->mesh.d, targets);
  Dist__V1__TensorDeleteRequest rq = DIST__V1__TENSOR_DELETE_REQUEST__INIT;
  rq.name = (char *)name;
  dist_call *calls = NULL;
  rc = n < 0 ? n
             : dist_call_all(c, "/dist.v1.Dist/TensorDelete",
                             &dist__v1__tensor_delete_reply__descriptor, &rq.base,
                             per_rank ? NULL : targets, n, &calls);
  if (per_rank && calls) rc = delete_result(c, calls, n, t->mesh.d.ranks[0]);
  note_retryable(c, later, name, calls, n);
  dist_calls_release(calls, n);
  return rc;
}

int dist_tensor_delete_noting(dist_client *c, const char *name, dist_later *later) {
  if (dist_client_check_lookup(c, "dist_tensor_delete", name) != 0) return c->err.code;
  dist_tensor *t = NULL;
  int rc = open_noting(c, name, &t, later);
  if (rc == 0) rc = delete_on_mesh(c, t, later);
  dist_tensor_free(t);
  return rc;
}

int dist_tensor_delete(dist_client *c, const char *name) {
  if (!c) return dist_no_client(__func__);
  return dist_tensor_delete_noting(c, name, NULL);
}

/* A handle without a piece is an SPMD trainer's outside the tensor's
 * mesh: its daemon holds none of it, so, as in Paddle, where a rank
 * outside the mesh holds nothing and does nothing, there is nothing to
 * delete. By name it could not be told from a typo (dist_tensor_delete). */
int dist_tensor_delete_handle(dist_client *c, const dist_tensor *t) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, t)) return c->err.code;
  if (t->no_piece) {
    c->err = (dist_errbuf)DIST_ERRBUF_INIT;
    return 0;
  }
  return delete_on_mesh(c, t, NULL);
}

void dist_tensor_free(dist_tensor *t) { free(t); }
/* The accessors given no tensor return NULL (-1 for ndim, DIST_DTYPE_INVALID
 * for the dtype) and say why in dist_errmsg(NULL). */
const char *dist_tensor_name(const dist_tensor *t) {
  if (!t) return dist_null_handle(__func__, "t"), NULL;
  return t->name;
}
dist_dtype dist_tensor_dtype(const dist_tensor *t) {
  if (!t) return dist_null_handle(__func__, "t"), DIST_DTYPE_INVALID;
  return t->dtype;
}
int dist_tensor_ndim(const dist_tensor *t) {
  if (!t) return dist_null_handle(__func__, "t"), -1;
  return t->shape.ndim;
}
const int64_t *dist_tensor_shape(const dist_tensor *t) {
  if (!t) return dist_null_handle(__func__, "t"), NULL;
  return t->shape.dims;
}
const dist_mesh *dist_tensor_mesh(const dist_tensor *t) {
  if (!t) return dist_null_handle(__func__, "t"), NULL;
  return &t->mesh;
}
const dist_placement *dist_tensor_placements(const dist_tensor *t) {
  if (!t) return dist_null_handle(__func__, "t"), NULL;
  return t->placements;
}

uint64_t dist_tensor_version(const dist_tensor *t) {
  if (!t) return dist_null_handle(__func__, "t"), 0;
  return t->version;
}

/* TensorShow to every rank of t's mesh, even in SPMD mode: describing a
 * tensor is not a collective. */
int dist_tensor_pieces(dist_client *c, const dist_tensor *t,
                       dist_tensor_piece **out, int *n) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, t) || DIST_NEED(c, out) || DIST_NEED(c, n)) return c->err.code;
  *out = NULL;
  *n = 0;
  const dist_mesh_desc *m = &t->mesh.d;
  if (dist_check_mesh_reach(c, m) != 0) return c->err.code;
  Dist__V1__TensorShowRequest rq = DIST__V1__TENSOR_SHOW_REQUEST__INIT;
  rq.name = (char *)t->name;
  dist_call *calls = NULL;
  int rc = dist_call_all(c, "/dist.v1.Dist/TensorShow", &dist__v1__tensor_show_reply__descriptor,
                         &rq.base, m->ranks, m->nranks, &calls);
  if (rc != 0) goto out;
  dist_tensor_piece *p = calloc((size_t)m->nranks + 1, sizeof *p);
  for (int i = 0; i < m->nranks; i++) {
    const Dist__V1__TensorMeta *pm = ((Dist__V1__TensorShowReply *)calls[i].reply)->meta;
    p[i].rank = m->ranks[i];
    p[i].ndim = pm ? (int)pm->n_local_shape : 0;
    if (p[i].ndim > DIST_MAX_DIMS) p[i].ndim = DIST_MAX_DIMS;
    for (int d = 0; d < p[i].ndim; d++) {
      p[i].shape[d] = (int64_t)pm->local_shape[d];
      p[i].offset[d] = d < (int)pm->n_local_offset ? (int64_t)pm->local_offset[d] : 0;
    }
    p[i].nbytes = pm ? pm->local_bytes : 0;
    p[i].version = pm ? pm->version : 0;
  }
  *out = p;
  *n = m->nranks;
out:
  dist_calls_release(calls, m->nranks);
  return rc;
}

/* By name, then by mesh ranks: the pieces of one tensor sort together,
 * and per-rank values of one name follow each other in rank order. */
static int by_name_then_mesh(const void *a, const void *b) {
  const dist_mesh_desc *x = &(*(dist_tensor *const *)a)->mesh.d;
  const dist_mesh_desc *y = &(*(dist_tensor *const *)b)->mesh.d;
  int c = strcmp((*(dist_tensor *const *)a)->name, (*(dist_tensor *const *)b)->name);
  for (int i = 0; c == 0 && i < x->nranks && i < y->nranks; i++)
    c = (x->ranks[i] > y->ranks[i]) - (x->ranks[i] < y->ranks[i]);
  return c != 0 ? c : (x->nranks > y->nranks) - (x->nranks < y->nranks);
}

/* Every daemon's tensors, one handle per piece described; *total pieces.
 * NULL when one could not be allocated (nothing kept). */
static dist_tensor **every_piece(dist_call *calls, int n, int *total) {
  size_t count = 0;
  for (int i = 0; i < n; i++) count += ((Dist__V1__TensorListReply *)calls[i].reply)->n_tensors;
  dist_tensor **all = calloc(count + 1, sizeof *all);
  *total = 0;
  for (int i = 0; all && i < n; i++) {
    const Dist__V1__TensorListReply *rp = (const void *)calls[i].reply;
    for (size_t k = 0; all && k < rp->n_tensors; k++)
      if (!(all[(*total)++] = dist_tensor_from_meta(rp->tensors[k]))) {
        dist_tensor_list_free(all, *total);
        all = NULL;
      }
  }
  return all;
}

/* Each daemon describes the pieces it holds; the pieces of one tensor (one
 * name, one mesh) make one entry. Per-rank values, one name on several
 * one-rank meshes, make one entry per rank. */
int dist_tensor_list(dist_client *c, dist_tensor ***out, int *n) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out) || DIST_NEED(c, n)) return c->err.code;
  *out = NULL;
  *n = 0;
  Dist__V1__TensorListRequest rq = DIST__V1__TENSOR_LIST_REQUEST__INIT;
  dist_call *calls = NULL;
  int rc = dist_call_all(c, "/dist.v1.Dist/TensorList", &dist__v1__tensor_list_reply__descriptor,
                         &rq.base, NULL, c->n, &calls);
  if (rc != 0) goto out;
  int total = 0, count = 0;
  dist_tensor **list = every_piece(calls, c->n, &total);
  if (!list) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory listing tensors");
    goto out;
  }
  qsort(list, (size_t)total, sizeof *list, by_name_then_mesh);
  for (int i = 0; i < total; i++) {
    dist_tensor *kept = count ? list[count - 1] : NULL;
    if (kept && strcmp(kept->name, list[i]->name) == 0 &&
        dist_mesh_equal(&kept->mesh.d, &list[i]->mesh.d)) {
      if (kept->version != list[i]->version) kept->version = 0; /* applied on some only */
      dist_tensor_free(list[i]);
    } else {
      list[count++] = list[i];
    }
  }
  *out = list;
  *n = count;
out:
  dist_calls_release(calls, c->n);
  return rc;
}

void dist_tensor_list_free(dist_tensor **list, int n) {
  for (int i = 0; list && i < n; i++) dist_tensor_free(list[i]);
  free(list);
}

int dist_same_layout(const dist_tensor *a, const dist_tensor *b) {
  if (!dist_mesh_equal(&a->mesh.d, &b->mesh.d)) return 0;
  for (int m = 0; m < a->mesh.d.ndim; m++) {
    const dist_placement *p = &a->placements[m], *q = &b->placements[m];
    if (p->kind != q->kind || (p->kind == DIST_SHARD && p->dim != q->dim) ||
        (p->kind == DIST_PARTIAL && p->reduce != q->reduce))
      return 0;
  }
  return 1;
}
