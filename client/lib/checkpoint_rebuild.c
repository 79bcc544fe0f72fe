/* Restoring tensors saved on more daemons than the cluster has: their
 * pieces are read out of the rank files through the daemons there are and
 * put together in the client (see checkpoint_internal.h). Shard pieces go
 * to their boxes; Partial pieces are reduced into theirs, as a reshard to
 * Replicate would have done before saving. */
#include <stdlib.h>
#include <string.h>

#include "checkpoint.pb-c.h"
#include "checkpoint_internal.h"
#include "wire.h"

int dist_ckpt_missing_rank(const dist_client *c, const ckpt_entry *e) {
  const dist_mesh_desc *md = &e->t.mesh.d;
  int missing = -1;
  for (int k = 0; k < md->nranks; k++)
    if (md->ranks[k] >= c->n && md->ranks[k] > missing) missing = md->ranks[k];
  return missing;
}

int dist_ckpt_partial_reduce(const dist_tensor *t, dist_reduce *op) {
  int found = 0;
  for (int d = 0; d < t->mesh.d.ndim; d++) {
    const dist_placement *p = &t->placements[d];
    if (p->kind != DIST_PARTIAL) continue;
    if (found && p->reduce != *op) return -1;
    *op = p->reduce;
    found = 1;
  }
  return found;
}

/* How many pieces add up to each element: the product of the Partial
 * dims' sizes. */
static int partial_pieces(const dist_tensor *t) {
  int k = 1;
  for (int d = 0; d < t->mesh.d.ndim; d++)
    if (t->placements[d].kind == DIST_PARTIAL) k *= t->mesh.d.shape[d];
  return k;
}

/* An integer Partial(avg) is rebuilt exactly: the sum of its pieces need
 * not fit the dtype, so until the last piece is in, its whole buffer holds
 * a dist_int_avg cell per element (16 bytes), narrowed in place at the
 * end. */
static int int_avg_cells(const dist_tensor *t) {
  dist_reduce op;
  return dist_ckpt_partial_reduce(t, &op) > 0 && dist_reduce_is_int_avg(t->dtype, op);
}

/* Reduces piece (shaped box) into the box at offset of t's whole value. */
static int reduce_box_in(void *full, const dist_tensor *t, const int64_t *offset,
                         const void *piece, const dist_shape *box, dist_reduce op) {
  int cells = int_avg_cells(t);
  size_t es = cells ? sizeof(dist_int_avg) : dist_dtype_size(t->dtype);
  size_t n = (size_t)dist_shape_numel(box);
  void *acc = malloc(n * es + 1);
  if (!acc) return DIST_ENOMEM;
  dist_copy_box_out(acc, full, &t->shape, offset, box, es);
  if (cells)
    dist_int_avg_add(acc, piece, n, t->dtype, partial_pieces(t));
  else
    dist_reduce_into(acc, piece, n, t->dtype, op);
  dist_copy_box_in(full, &t->shape, offset, acc, box, es);
  free(acc);
  return 0;
}

/* Mesh index k holds a piece not held by a lower index: its coordinate on
 * every Replicate dim is 0 (the copies there are the same bytes). */
static int first_copy(const dist_tensor *t, int k) {
  int coords[DIST_MAX_MESH_DIMS];
  dist_mesh_coords(&t->mesh.d, k, coords);
  for (int d = 0; d < t->mesh.d.ndim; d++)
    if (t->placements[d].kind == DIST_REPLICATE && coords[d] != 0) return 0;
  return 1;
}

/* The box mesh index k of e holds. */
static void box_of(const ckpt_entry *e, int k, dist_shape *local, int64_t *offset) {
  int coords[DIST_MAX_MESH_DIMS];
  dist_mesh_coords(&e->t.mesh.d, k, coords);
  dist_local_box(&e->t.mesh.d, e->t.placements, &e->t.shape, coords, local, offset);
}

static int misshapen(dist_client *c, const ckpt_entry *e, int k, const char *what) {
  return dist_client_fail(c, DIST_EMISMATCH, "rank %d's %s '%s' in the checkpoint "
                          "does not have the shape its layout gives it",
                          e->t.mesh.d.ranks[k], what, e->t.name);
}

/* Puts the piece rank index k of e holds into e's whole value. */
static int place_piece(dist_client *c, const ckpt_entry *e, int k,
                       const Dist__V1__CheckpointPiece *pc, void *full) {
  dist_shape local, got;
  int64_t offset[DIST_MAX_DIMS];
  box_of(e, k, &local, offset);
  size_t es = dist_dtype_size(e->t.dtype);
  if (dist_shape_from_pb(pc->shape, pc->n_shape, &got, NULL) != 0 ||
      (dist_dtype)pc->dtype != e->t.dtype || !dist_shape_equal(&got, &local) ||
      pc->data.len != (size_t)dist_shape_numel(&local) * es)
    return misshapen(c, e, k, "piece of");
  dist_reduce op;
  if (dist_ckpt_partial_reduce(&e->t, &op) <= 0) {
    dist_copy_box_in(full, &e->t.shape, offset, pc->data.data, &local, es);
    return 0;
  }
  if (reduce_box_in(full, &e->t, offset, pc->data.data, &local, op))
    return dist_client_fail(c, DIST_ENOMEM, "out of memory reducing '%s'", e->t.name);
  return 0;
}

void dist_ckpt_state_free(ckpt_state *s) {
  for (int k = 0; k < DIST_OPTIM_STATE_MAX; k++) free(s->whole[k]);
  memset(s, 0, sizeof *s);
}

/* Takes the configuration of e's parameter from the first file that
 * describes it (p, mesh index k's), with room for its whole state
 * buffers. */
static int state_begin(dist_client *c, const ckpt_entry *e, int k,
                       const Dist__V1__ParamConfigureRequest *p, ckpt_state *s) {
  if (s->found) return s->nstate == (int)p->n_state ? 0 : misshapen(c, e, k, "state of");
  if (!p->optimizer || p->n_state > DIST_OPTIM_STATE_MAX)
    return dist_client_fail(c, DIST_EPROTO, "the checkpoint describes parameter '%s' "
                            "without its optimizer", e->t.name);
  s->found = 1;
  s->cfg = *p;
  s->cfg.name = NULL, s->cfg.optimizer = NULL, s->cfg.n_state = 0, s->cfg.state = NULL;
  s->optimizer = *p->optimizer;
  s->nstate = (int)p->n_state;
  size_t bytes = (size_t)dist_shape_numel(&e->t.shape) * dist_dtype_size(e->t.dtype);
  for (int j = 0; j < s->nstate; j++)
    if (!(s->whole[j] = malloc(bytes + 1)))
      return dist_client_fail(c, DIST_ENOMEM, "no memory for the optimizer state of '%s'",
                              e->t.name);
  return 0;
}

/* Puts the state pieces mesh index k of e's parameter holds (p, as rank
 * k's file describes it) into its whole state buffers. A parameter is
 * never Partial: each piece is copied into its box. */
static int place_state(dist_client *c, const ckpt_entry *e, int k,
                       const Dist__V1__ParamConfigureRequest *p, ckpt_state *s) {
  int rc = state_begin(c, e, k, p, s);
  dist_shape local;
  int64_t offset[DIST_MAX_DIMS];
  box_of(e, k, &local, offset);
  size_t es = dist_dtype_size(e->t.dtype);
  for (int j = 0; rc == 0 && j < s->nstate; j++) {
    if (p->state[j].len != (size_t)dist_shape_numel(&local) * es)
      return misshapen(c, e, k, "optimizer state of");
    dist_copy_box_in(s->whole[j], &e->t.shape, offset, p->state[j].data, &local, es);
  }
  return rc;
}

/* Places the state of every parameter the reply describes. */
static int place_states(dist_client *c, const ckpt_manifest *m,
                        const Dist__V1__CheckpointReadReply *reply, const int *which,
                        const int *index, size_t n, ckpt_state *state) {
  int rc = 0;
  for (size_t p = 0; p < reply->n_params && rc == 0; p++) {
    size_t j = 0;
    while (j < n && strcmp(m->tensors[which[j]].t.name, reply->params[p]->name) != 0) j++;
    if (j == n)
      return dist_client_fail(c, DIST_EPROTO, "reading the checkpoint: state of '%s', "
                              "which was not asked for", reply->params[p]->name);
    rc = place_state(c, &m->tensors[which[j]], index[j], reply->params[p], &state[which[j]]);
  }
  return rc;
}

/* Reads from rank r's file every piece of a tensor to rebuild that r holds
 * first, through daemon r % c->n, and places them (and the state of
 * those saved as parameters); *bytes counts them. */
static int read_rank(dist_client *c, const char *dir, const ckpt_manifest *m,
                     const char *how, int r, void **full, ckpt_state *state,
                     uint64_t *bytes) {
  const char **names = calloc((size_t)m->ntensors + 1, sizeof *names);
  int *which = calloc((size_t)m->ntensors + 1, sizeof *which);  /* manifest index */
  int *index = calloc((size_t)m->ntensors + 1, sizeof *index);  /* r's mesh index */
  Dist__V1__CheckpointReadRequest rq = DIST__V1__CHECKPOINT_READ_REQUEST__INIT;
  for (int i = 0; i < m->ntensors; i++) {
    int k = how[i] == CKPT_REBUILD ? dist_mesh_index_of(&m->tensors[i].t.mesh.d, r) : -1;
    if (k < 0 || !first_copy(&m->tensors[i].t, k)) continue;
    which[rq.n_tensors] = i;
    index[rq.n_tensors] = k;
    names[rq.n_tensors++] = m->tensors[i].t.name;
    rq.optimizer_state |= m->tensors[i].with_state;
  }
  int rc = 0;
  if (rq.n_tensors) {
    rq.dir = (char *)dir;
    rq.file = m->file[r];
    rq.sha256 = m->sha[r];
    rq.tensors = (char **)names;
    ProtobufCMessage *rp = NULL;
    rc = dist_call_one(c, r % c->n, "/dist.v1.Checkpoint/Read", &rq.base,
                       &dist__v1__checkpoint_read_reply__descriptor, &rp);
    const Dist__V1__CheckpointReadReply *reply = (const void *)rp;
    if (rc == 0 && reply->n_pieces != rq.n_tensors)
      rc = dist_client_fail(c, DIST_EPROTO, "reading %s: %zu pieces for %zu tensors",
                            m->file[r], reply->n_pieces, rq.n_tensors);
    for (size_t j = 0; rc == 0 && j < rq.n_tensors; j++) {
      rc = place_piece(c, &m->tensors[which[j]], index[j], reply->pieces[j],
                       full[which[j]]);
      *bytes += reply->pieces[j]->data.len;
    }
    if (rc == 0) rc = place_states(c, m, reply, which, index, rq.n_tensors, state);
    if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  }
  free(index);
  free(which);
  free(names);
  return rc;
}

int dist_ckpt_read_whole(dist_client *c, const char *dir, const ckpt_manifest *m,
                         const char *how, const dist_checkpoint_opts *o,
                         void **full, size_t *nbytes, ckpt_state *state) {
  int rc = 0;
  for (int i = 0; i < m->ntensors && rc == 0; i++) {
    if (how[i] != CKPT_REBUILD) continue;
    const dist_tensor *t = &m->tensors[i].t;
    size_t numel = (size_t)dist_shape_numel(&t->shape);
    nbytes[i] = numel * dist_dtype_size(t->dtype);
    full[i] = int_avg_cells(t) ? calloc(numel + 1, sizeof(dist_int_avg)) /* none added */
                               : malloc(nbytes[i] + 1);
    if (!full[i])
      rc = dist_client_fail(c, DIST_ENOMEM, "no memory for the %zu bytes of '%s'",
                            nbytes[i], t->name);
    dist_reduce op;
    if (rc == 0 && !int_avg_cells(t) && dist_ckpt_partial_reduce(t, &op) > 0)
      dist_reduce_identity(full[i], numel, t->dtype, op); /* pieces reduce into it */
  }
  for (int r = 0; r < m->nfiles && rc == 0; r++) {
    uint64_t bytes = 0;
    rc = read_rank(c, dir, m, how, r, full, state, &bytes);
    /* A long restore shows each file it had to read through the client. */
    if (rc == 0 && bytes && o && o->progress)
      o->progress(o->progress_arg, "read", r, r + 1, m->nfiles, bytes);
  }
  for (int i = 0; i < m->ntensors && rc == 0; i++) {
    const dist_tensor *t = &m->tensors[i].t;
    size_t numel = (size_t)dist_shape_numel(&t->shape);
    dist_reduce op;
    if (how[i] != CKPT_REBUILD || dist_ckpt_partial_reduce(t, &op) <= 0) continue;
    if (int_avg_cells(t))
      dist_int_avg_store(full[i], full[i], numel, t->dtype);
    else /* avg divides */
      dist_reduce_finish(full[i], numel, t->dtype, op, partial_pieces(t));
  }
  return rc;
}
