#include "reshard.h"

#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "ops.h"
#include "peer.h"
#include "redistribute.h"
#include "subop.h"

/* A tensor's description as the cross-mesh move sends it ahead of the data,
 * so a rank that held nothing learns what it receives. */
enum { META_WORDS = 3 + DIST_MAX_DIMS + 3 * DIST_MAX_MESH_DIMS };

static void pack_meta(int64_t *w, const distd_tensor *t) {
  memset(w, 0, sizeof(int64_t) * META_WORDS);
  w[0] = t->dtype;
  w[1] = t->global.ndim;
  w[2] = t->mesh.ndim;
  for (int i = 0; i < t->global.ndim; i++) w[3 + i] = t->global.dims[i];
  for (int i = 0; i < t->mesh.ndim; i++) {
    int64_t *p = &w[3 + DIST_MAX_DIMS + 3 * i];
    p[0] = t->placements[i].kind;
    p[1] = t->placements[i].dim;
    p[2] = t->placements[i].reduce;
  }
}

static int unpack_meta(const int64_t *w, dist_dtype *dt, dist_shape *global,
                       dist_placement *p, dist_errbuf *eb) {
  if (w[1] < 0 || w[1] > DIST_MAX_DIMS || w[2] < 0 || w[2] > DIST_MAX_MESH_DIMS ||
      w[0] < 0 || w[0] > DIST_FLOAT64 || dist_dtype_size((dist_dtype)w[0]) == 0)
    return dist_fail(eb, DIST_EPROTO, "reshard: bad tensor description");
  *dt = (dist_dtype)w[0];
  global->ndim = (int)w[1];
  for (int i = 0; i < global->ndim; i++) global->dims[i] = w[3 + i];
  for (int i = 0; i < w[2]; i++) {
    const int64_t *q = &w[3 + DIST_MAX_DIMS + 3 * i];
    p[i] = (dist_placement){(dist_placement_kind)q[0], (int)q[1],
                            (dist_reduce)q[2]};
  }
  return 0;
}

/* Step 1: rank k of the source mesh hands its piece to rank k of the
 * destination mesh; the placements stay. *moved is NULL on ranks outside
 * the destination mesh. */
static int move_across_meshes(distd_server *s, distd_tensor *src,
                              const dist_mesh_desc *src_mesh,
                              const dist_mesh_desc *dst_mesh, uint64_t op,
                              int64_t deadline, distd_tensor **moved,
                              dist_errbuf *eb) {
  int from = src ? dist_mesh_index_of(&src->mesh, s->rank) : -1;
  int to = dist_mesh_index_of(dst_mesh, s->rank);
  int64_t meta_out[META_WORDS], meta_in[META_WORDS];
  int rc = 0, partners[2], npartners = 0;
  void *data = NULL;
  size_t len = 0;
  if (from >= 0) partners[npartners++] = dst_mesh->ranks[from];
  if (to >= 0) partners[npartners++] = src_mesh->ranks[to];
  *moved = NULL;
  distd_xfer *x = distd_xfer_new(s->peers, op);
  if (!x) return distd_abort_no_memory(s->peers, op, partners, npartners, "the move", eb);
  if (from >= 0) {
    pack_meta(meta_out, src);
    distd_xfer_send(x, dst_mesh->ranks[from], 0, meta_out, sizeof meta_out);
    distd_xfer_send(x, dst_mesh->ranks[from], 1, src->data, src->nbytes);
  }
  if (to >= 0) {
    int sender = src_mesh->ranks[to];
    distd_xfer_recv(x, sender, 0, meta_in, sizeof meta_in);
    distd_xfer_recv_any(x, sender, 1, &data, &len, 0);
  }
  rc = distd_xfer_finish(x, deadline, partners, npartners, eb);
  distd_xfer_free(x);
  if (rc != 0 || to < 0) goto out;
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape global = {0, {0}};
  dist_placement p[DIST_MAX_MESH_DIMS];
  rc = unpack_meta(meta_in, &dt, &global, p, eb);
  if (rc == 0)
    rc = distd_tensor_new(s->store, "reshard", dt, &global, dst_mesh, p,
                          s->rank, moved, eb);
  if (rc == 0 && (*moved)->nbytes != len)
    rc = dist_fail(eb, DIST_EPROTO, "reshard: received %zu bytes, expected %zu",
                   len, (*moved)->nbytes);
  if (rc == 0) memcpy((*moved)->data, data, len);
  if (rc != 0) { /* a half-made piece must not reach the caller */
    distd_tensor_unref(*moved);
    *moved = NULL;
  }
out:
  free(data);
  return rc;
}

/* The partial mesh dims of t that a reshard to dst_p reduces with avg,
 * as a mask (bit d for dim d). */
static unsigned avg_dims_reduced(const distd_tensor *t, const dist_placement *dst_p) {
  unsigned mask = 0;
  for (int d = 0; d < t->mesh.ndim; d++) {
    const dist_placement *p = &t->placements[d];
    if (p->kind == DIST_PARTIAL && p->reduce == DIST_REDUCE_AVG &&
        !(dst_p[d].kind == DIST_PARTIAL && dst_p[d].reduce == DIST_REDUCE_AVG))
      mask |= 1u << d;
  }
  return mask;
}

/* Step 2: a partial mesh dim whose target is not the same partial is
 * reduced along its group, in place in a private copy. The avg dims go in
 * one all-reduce over all of them: an average of averages truncates an
 * integer twice (avg(avg(1,0), avg(2,1)) is 0 where the four average to
 * 1), and a checkpoint's rebuild averages them at once. */
static int reduce_partials(distd_server *s, distd_tensor *t,
                           const dist_placement *dst_p, uint64_t op,
                           int64_t deadline, dist_errbuf *eb) {
  unsigned avg_mask = avg_dims_reduced(t, dst_p);
  for (int d = 0; d < t->mesh.ndim; d++) {
    dist_placement *p = &t->placements[d];
    if (p->kind != DIST_PARTIAL) continue;
    if (dst_p[d].kind == DIST_PARTIAL && dst_p[d].reduce == p->reduce) continue;
    unsigned dims = p->reduce == DIST_REDUCE_AVG ? avg_mask : 1u << d;
    int group[DIST_MAX_MESH_RANKS];
    int n = dist_mesh_group_dims(&t->mesh, s->rank, dims, group);
    distd_coll c;
    uint64_t step = distd_subop(op, DISTD_STEP_RESHARD_REDUCE + (unsigned)d);
    int rc = distd_coll_init(&c, s->peers, step, group, n, deadline, eb);
    if (rc == 0)
      rc = distd_allreduce(&c, t->data, t->nbytes / dist_dtype_size(t->dtype),
                           t->dtype, p->reduce, eb);
    if (rc != 0) return rc;
    for (int k = 0; k < t->mesh.ndim; k++)
      if (dims & (1u << k)) t->placements[k] = DIST_REPLICATED;
  }
  return 0;
}

/* Step 4: Replicate -> Partial keeps the value at coordinate 0 of the mesh
 * dim and puts the reduction's identity elsewhere (avg keeps it everywhere,
 * so the average is the value). */
static void make_partials(distd_server *s, distd_tensor *t,
                          const dist_placement *dst_p) {
  int idx = dist_mesh_index_of(&t->mesh, s->rank);
  int coords[DIST_MAX_MESH_DIMS];
  dist_mesh_coords(&t->mesh, idx, coords);
  for (int d = 0; d < t->mesh.ndim; d++) {
    if (dst_p[d].kind != DIST_PARTIAL || t->placements[d].kind == DIST_PARTIAL)
      continue;
    if (coords[d] != 0 && dst_p[d].reduce != DIST_REDUCE_AVG)
      dist_reduce_identity(t->data, t->nbytes / dist_dtype_size(t->dtype),
                           t->dtype, dst_p[d].reduce);
  }
}

/* A private, writable copy of t under another name. */
static int copy_tensor(distd_server *s, const distd_tensor *t, const char *name,
                       distd_tensor **out, dist_errbuf *eb) {
  int rc = distd_tensor_new(s->store, name, t->dtype, &t->global, &t->mesh,
                            t->placements, s->rank, out, eb);
  if (rc == 0) memcpy((*out)->data, t->data, t->nbytes);
  return rc;
}

static int check_mesh_shapes(const dist_mesh_desc *src_mesh,
                             const dist_mesh_desc *dst_mesh, dist_errbuf *eb) {
  if (dist_mesh_same_shape(src_mesh, dst_mesh)) return 0;
  char a[256], b[256];
  dist_mesh_format(src_mesh, a, sizeof a);
  dist_mesh_format(dst_mesh, b, sizeof b);
  return dist_fail(eb, DIST_EINVAL,
                   "reshard from mesh %s to mesh %s: meshes must have the "
                   "same shape", a, b);
}

static int check_target(const distd_tensor *src, const dist_mesh_desc *dst_mesh,
                        const dist_placement *dst_p, dist_errbuf *eb) {
  int rc = check_mesh_shapes(&src->mesh, dst_mesh, eb);
  if (rc != 0) return rc;
  return dist_placements_check(dst_mesh, dst_p, dst_mesh->ndim,
                               src->global.ndim, eb);
}

static int reshard_run(distd_server *s, distd_tensor *src,
                       const dist_mesh_desc *src_mesh,
                       const dist_mesh_desc *dst_mesh, const dist_placement *dst_p,
                       const char *dst_name, uint64_t op_id, int64_t deadline_ms,
                       distd_tensor **out, dist_errbuf *eb) {
  distd_tensor *cur = NULL, *next = NULL;
  *out = NULL;
  if (!src_mesh || (!src && dist_mesh_equal(src_mesh, dst_mesh)))
    return dist_fail(eb, DIST_ENOTFOUND, "tensor '%s' not found", dst_name);
  /* A rank only in the destination mesh cannot see the tensor yet, but it
   * can refuse a mesh of another shape at once, as the source ranks do,
   * instead of waiting for data that will never come. */
  int rc = src ? check_target(src, dst_mesh, dst_p, eb)
               : check_mesh_shapes(src_mesh, dst_mesh, eb);
  if (rc != 0) return rc;
  if (!dist_mesh_equal(src_mesh, dst_mesh)) {
    rc = move_across_meshes(s, src, src_mesh, dst_mesh,
                            distd_subop(op_id, DISTD_STEP_RESHARD_MOVE), deadline_ms, &cur, eb);
    if (rc != 0 || !cur) return rc; /* not in the destination mesh: done */
    rc = check_target(cur, dst_mesh, dst_p, eb);
    if (rc != 0) goto fail;
  } else {
    rc = copy_tensor(s, src, dst_name, &cur, eb);
    if (rc != 0) return rc;
  }
  snprintf(cur->name, sizeof cur->name, "%s", dst_name);
  rc = reduce_partials(s, cur, dst_p, op_id, deadline_ms, eb);
  if (rc == 0)
    rc = distd_redistribute(s, cur, dst_p, distd_subop(op_id, DISTD_STEP_RESHARD_LAYOUT),
                            deadline_ms, &next, eb);
  if (rc != 0) goto fail;
  distd_tensor_unref(cur);
  make_partials(s, next, dst_p);
  memcpy(next->placements, dst_p, sizeof *dst_p * (size_t)dst_mesh->ndim);
  *out = next;
  return 0;
fail:
  distd_tensor_unref(cur);
  return rc;
}

int distd_reshard_ranks(const dist_mesh_desc *src_mesh, const dist_mesh_desc *dst_mesh,
                        int *ranks) {
  int max = dst_mesh->nranks + src_mesh->nranks;
  return dist_ranks_union_add(ranks, dist_ranks_union_add(ranks, 0, max, dst_mesh), max,
                              src_mesh);
}

/* The op ids of the exchanges of a reshard run under op_id, from a mesh of
 * ndim dims (distd_reshard_steps). Returns how many, at most
 * DISTD_RESHARD_STEPS_MAX. */
static int reshard_steps(uint64_t op_id, int ndim, uint64_t *ids) {
  unsigned steps[DISTD_RESHARD_STEPS_MAX];
  int n = distd_reshard_steps(ndim, steps);
  for (int i = 0; i < n; i++) ids[i] = distd_subop(op_id, steps[i]);
  return n;
}

/* Registers the reshard in the daemon's operations registry (ops.h) for
 * `distctl ops`, watching the op ids of each of its steps. */
static uint64_t track_reshard(distd_ops *ops, const dist_mesh_desc *src_mesh,
                              const dist_mesh_desc *dst_mesh, uint64_t op_id,
                              uint64_t bytes) {
  int group[2 * DIST_MAX_MESH_RANKS];
  int n = distd_reshard_ranks(src_mesh, dst_mesh, group);
  uint64_t serial = distd_ops_begin(ops, "reshard", op_id, group, n, bytes);
  uint64_t steps[DISTD_RESHARD_STEPS_MAX];
  int nsteps = reshard_steps(op_id, src_mesh->ndim, steps);
  for (int i = 0; i < nsteps; i++) distd_ops_watch(ops, serial, steps[i]);
  return serial;
}

void distd_reshard_abort(distd_server *s, uint64_t op_id, int ndim, const int *ranks, int n,
                         const char *why) {
  uint64_t steps[DISTD_RESHARD_STEPS_MAX];
  int nsteps = reshard_steps(op_id, ndim, steps);
  for (int i = 0; i < nsteps; i++) distd_abort_op(s->peers, steps[i], ranks, n, why);
}

int distd_reshard(distd_server *s, distd_tensor *src,
                  const dist_mesh_desc *src_mesh,
                  const dist_mesh_desc *dst_mesh, const dist_placement *dst_p,
                  const char *dst_name, uint64_t op_id, int64_t deadline_ms,
                  distd_tensor **out, dist_errbuf *eb) {
  distd_ops *ops = distd_peers_ops(s->peers);
  dist_errbuf why = DIST_ERRBUF_INIT;
  uint64_t serial = track_reshard(ops, src_mesh, dst_mesh, op_id, src ? src->nbytes : 0);
  int rc = reshard_run(s, src, src_mesh, dst_mesh, dst_p, dst_name, op_id, deadline_ms,
                       out, &why);
  distd_ops_end(ops, serial, rc, why.msg);
  if (rc && eb) *eb = why;
  return rc;
}
