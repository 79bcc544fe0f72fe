/* The layout step of reshard: from one shard/replicate layout to another on
 * the same mesh, in one exchange.
 *
 * The distinct old boxes partition the global tensor (replicas hold equal
 * boxes). A receiver r takes the part of its new box that lies in old box b
 * from one holder of b: itself if it holds b, else the holder at position
 * (r mod holders) among those that share r's coordinates on the pinned mesh
 * dims (dims that stay Partial: their ranks hold different values). Every
 * rank computes the same plan from metadata, so senders and receivers agree
 * without talking. */
#include "redistribute.h"

#include <stdlib.h>
#include <string.h>

#include "peer.h"

typedef struct box {
  dist_shape shape;
  int64_t off[DIST_MAX_DIMS];
} box;

typedef struct plan {
  const dist_mesh_desc *mesh;
  int n;
  box *old_box, *new_box;
  int *box_id;     /* per rank: index of the first rank holding the same box */
  int pinned[DIST_MAX_MESH_DIMS];
} plan;

static int box_equal(const box *a, const box *b) {
  if (!dist_shape_equal(&a->shape, &b->shape)) return 0;
  return memcmp(a->off, b->off, sizeof(int64_t) * (size_t)a->shape.ndim) == 0;
}

static int box_empty(const box *a) {
  return dist_shape_numel(&a->shape) == 0;
}

/* The intersection of a and b; returns 0 when it is empty. */
static int intersect(const box *a, const box *b, box *out) {
  out->shape.ndim = a->shape.ndim;
  for (int d = 0; d < a->shape.ndim; d++) {
    int64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
    int64_t ahi = a->off[d] + a->shape.dims[d], bhi = b->off[d] + b->shape.dims[d];
    int64_t hi = ahi < bhi ? ahi : bhi;
    if (hi <= lo) return 0;
    out->off[d] = lo;
    out->shape.dims[d] = hi - lo;
  }
  return !box_empty(a) && !box_empty(b);
}

static void boxes_of(const dist_mesh_desc *m, const dist_placement *p,
                     const dist_shape *global, box *boxes) {
  for (int i = 0; i < m->nranks; i++) {
    int coords[DIST_MAX_MESH_DIMS];
    dist_mesh_coords(m, i, coords);
    dist_local_box(m, p, global, coords, &boxes[i].shape, boxes[i].off);
  }
}

/* Placements for the box computation: Partial holds whole values. */
static void as_layout(const dist_placement *in, int n, dist_placement *out) {
  for (int i = 0; i < n; i++)
    out[i] = in[i].kind == DIST_PARTIAL ? DIST_REPLICATED : in[i];
}

/* 0, or -1 without memory for the plan (plan_free frees what it took). */
static int plan_init(plan *pl, const distd_tensor *t, const dist_placement *dst) {
  const dist_mesh_desc *m = &t->mesh;
  dist_placement from[DIST_MAX_MESH_DIMS], to[DIST_MAX_MESH_DIMS];
  pl->mesh = m;
  pl->n = m->nranks;
  pl->old_box = calloc((size_t)pl->n, sizeof *pl->old_box);
  pl->new_box = calloc((size_t)pl->n, sizeof *pl->new_box);
  pl->box_id = calloc((size_t)pl->n, sizeof *pl->box_id);
  if (!pl->old_box || !pl->new_box || !pl->box_id) return -1;
  as_layout(t->placements, m->ndim, from);
  as_layout(dst, m->ndim, to);
  boxes_of(m, from, &t->global, pl->old_box);
  boxes_of(m, to, &t->global, pl->new_box);
  for (int i = 0; i < pl->n; i++) {
    pl->box_id[i] = i;
    for (int j = 0; j < i; j++)
      if (box_equal(&pl->old_box[i], &pl->old_box[j])) {
        pl->box_id[i] = pl->box_id[j];
        break;
      }
  }
  for (int d = 0; d < m->ndim; d++)
    pl->pinned[d] = t->placements[d].kind == DIST_PARTIAL;
  return 0;
}

static void plan_free(plan *pl) {
  free(pl->old_box);
  free(pl->new_box);
  free(pl->box_id);
}

static int same_pinned(const plan *pl, int a, int b) {
  int ca[DIST_MAX_MESH_DIMS], cb[DIST_MAX_MESH_DIMS];
  dist_mesh_coords(pl->mesh, a, ca);
  dist_mesh_coords(pl->mesh, b, cb);
  for (int d = 0; d < pl->mesh->ndim; d++)
    if (pl->pinned[d] && ca[d] != cb[d]) return 0;
  return 1;
}

/* The rank index that sends box b's part to receiver r. */
static int sender_of(const plan *pl, int r, int b) {
  if (pl->box_id[r] == b && same_pinned(pl, r, r)) return r;
  int holders[DIST_MAX_MESH_RANKS], k = 0;
  for (int i = 0; i < pl->n; i++)
    if (pl->box_id[i] == b && same_pinned(pl, i, r)) holders[k++] = i;
  return holders[r % k];
}

static int layout_unchanged(const plan *pl) {
  for (int i = 0; i < pl->n; i++)
    if (!box_equal(&pl->old_box[i], &pl->new_box[i])) return 0;
  return 1;
}

typedef struct pending {
  void *buf;
  box part;
} pending;

/* Posts my sends (extracting each part into its own buffer) and receives;
 * -1 when a buffer could not be allocated (then not all are posted). */
static int post(const plan *pl, int me, const distd_tensor *t,
                 distd_tensor *dst, distd_xfer *x, pending *sends,
                 int *nsend, pending *recvs, int *nrecv) {
  size_t elem = dist_dtype_size(t->dtype);
  const box *mine = &pl->old_box[me];
  for (int r = 0; r < pl->n; r++)
    for (int b = 0; b < pl->n; b++) {
      box part, rel;
      if (pl->box_id[b] != b || !intersect(&pl->new_box[r], &pl->old_box[b], &part))
        continue;
      int from = sender_of(pl, r, b);
      if (from == me) {
        rel = part;
        for (int d = 0; d < part.shape.ndim; d++) rel.off[d] -= mine->off[d];
        if (r == me) { /* local copy, straight into the new piece */
          box into = part;
          for (int d = 0; d < part.shape.ndim; d++)
            into.off[d] -= pl->new_box[me].off[d];
          void *tmp = malloc((size_t)dist_shape_numel(&part.shape) * elem + 1);
          if (!tmp) return -1;
          dist_copy_box_out(tmp, t->data, &mine->shape, rel.off, &part.shape, elem);
          dist_copy_box_in(dst->data, &dst->local, into.off, tmp, &part.shape, elem);
          free(tmp);
          continue;
        }
        size_t bytes = (size_t)dist_shape_numel(&part.shape) * elem;
        pending *sp = &sends[(*nsend)++];
        sp->buf = malloc(bytes ? bytes : 1);
        sp->part = part;
        if (!sp->buf) return -1;
        dist_copy_box_out(sp->buf, t->data, &mine->shape, rel.off, &part.shape, elem);
        distd_xfer_send(x, pl->mesh->ranks[r], (uint32_t)b, sp->buf, bytes);
      } else if (r == me) {
        size_t bytes = (size_t)dist_shape_numel(&part.shape) * elem;
        pending *rp = &recvs[(*nrecv)++];
        rp->buf = malloc(bytes ? bytes : 1);
        rp->part = part;
        if (!rp->buf) return -1;
        distd_xfer_recv(x, pl->mesh->ranks[from], (uint32_t)b, rp->buf, bytes);
      }
    }
  return 0;
}

static int no_memory(distd_server *s, const distd_tensor *t, uint64_t op_id, dist_errbuf *eb) {
  return distd_abort_no_memory(s->peers, op_id, t->mesh.ranks, t->mesh.nranks,
                               "a reshard's exchange", eb);
}

int distd_redistribute(distd_server *s, distd_tensor *t,
                       const dist_placement *dst_p, uint64_t op_id,
                       int64_t deadline_ms, distd_tensor **out,
                       dist_errbuf *eb) {
  plan pl;
  if (plan_init(&pl, t, dst_p) != 0) {
    plan_free(&pl);
    return no_memory(s, t, op_id, eb);
  }
  int me = dist_mesh_index_of(&t->mesh, s->rank);
  dist_placement layout[DIST_MAX_MESH_DIMS];
  /* The result keeps t's partial dims: step 4 of reshard turns the rest. */
  for (int d = 0; d < t->mesh.ndim; d++)
    layout[d] = t->placements[d].kind == DIST_PARTIAL ? t->placements[d]
                : dst_p[d].kind == DIST_PARTIAL       ? DIST_REPLICATED
                                                      : dst_p[d];
  int rc = 0;
  if (layout_unchanged(&pl)) {
    memcpy(t->placements, layout, sizeof *layout * (size_t)t->mesh.ndim);
    distd_tensor_ref(t);
    *out = t;
    goto done;
  }
  rc = distd_tensor_new(s->store, t->name, t->dtype, &t->global, &t->mesh,
                        layout, s->rank, out, eb);
  if (rc != 0) {
    distd_abort_op(s->peers, op_id, pl.mesh->ranks, pl.n, dist_errbuf_msg(eb));
    goto done;
  }
  pending *sends = calloc((size_t)pl.n * (size_t)pl.n + 1, sizeof *sends);
  pending *recvs = calloc((size_t)pl.n + 1, sizeof *recvs);
  int nsend = 0, nrecv = 0;
  distd_xfer *x = distd_xfer_new(s->peers, op_id);
  if (!sends || !recvs || !x || post(&pl, me, t, *out, x, sends, &nsend, recvs, &nrecv) != 0)
    rc = no_memory(s, t, op_id, eb);
  else
    rc = distd_xfer_finish(x, deadline_ms, pl.mesh->ranks, pl.n, eb);
  distd_xfer_free(x);
  size_t elem = dist_dtype_size(t->dtype);
  for (int i = 0; i < nrecv; i++) {
    box into = recvs[i].part;
    for (int d = 0; d < into.shape.ndim; d++) into.off[d] -= pl.new_box[me].off[d];
    if (rc == 0)
      dist_copy_box_in((*out)->data, &(*out)->local, into.off, recvs[i].buf,
                       &into.shape, elem);
    free(recvs[i].buf);
  }
  for (int i = 0; sends && i < nsend; i++) free(sends[i].buf);
  free(sends);
  free(recvs);
  if (rc != 0) {
    distd_tensor_unref(*out);
    *out = NULL;
  }
done:
  plan_free(&pl);
  return rc;
}
