/* TensorPut / TensorGet / TensorList / TensorShow / TensorDelete. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "hash.h"
#include "holds.h"
#include "methods.h"
#include "op_refuse.h"
#include "param_service.h"
#include "pbuf.h"
#include "reshard.h"
#include "store.h"
#include "tensor_meta.h"
#include "vote.h"

/* What each rank contributes to dtensor_from_local's shape exchange: its
 * own verdict (0 or a dist_err), its local shape, its dtype and a
 * fingerprint of its mesh and placements (SPMD trainers describe the tensor
 * each on their own, and must agree). */
enum { EXCHANGE_WORDS = 4 + DIST_MAX_DIMS, EX_DTYPE = 2 + DIST_MAX_DIMS,
       EX_LAYOUT = 3 + DIST_MAX_DIMS };

/* A digest of the mesh and placements, field by field (no padding bytes). */
static int64_t layout_fingerprint(const distd_meta *m) {
  int64_t words[3 + DIST_MAX_MESH_DIMS * 4 + DIST_MAX_MESH_RANKS];
  int n = 0;
  words[n++] = m->mesh.ndim;
  words[n++] = m->mesh.nranks;
  for (int i = 0; i < m->mesh.ndim; i++) {
    words[n++] = m->mesh.shape[i];
    words[n++] = m->placements[i].kind;
    words[n++] = m->placements[i].kind == DIST_SHARD ? m->placements[i].dim : 0;
    words[n++] = m->placements[i].kind == DIST_PARTIAL ? m->placements[i].reduce : 0;
  }
  for (int i = 0; i < m->mesh.nranks; i++) words[n++] = m->mesh.ranks[i];
  return (int64_t)(dist_fnv1a(words, sizeof *words * (size_t)n) >> 1);
}

/* What a shard_tensor put describes (dtype, global shape, mesh,
 * placements), for its vote: SPMD trainers each describe the tensor on
 * their own, and must agree. Never 0 (no digest). */
static uint64_t put_digest(const distd_meta *m) {
  int64_t words[3 + DIST_MAX_DIMS];
  int n = 0;
  words[n++] = layout_fingerprint(m);
  words[n++] = m->dtype;
  words[n++] = m->global.ndim;
  for (int d = 0; d < m->global.ndim; d++) words[n++] = m->global.dims[d];
  return dist_fnv1a(words, sizeof *words * (size_t)n) | 1;
}

/* why: this rank's reason when status says no (vote.h). */
static void pack_exchange(int64_t *w, int status, const char *why, const distd_meta *m) {
  memset(w, 0, sizeof(int64_t) * EXCHANGE_WORDS);
  w[0] = status;
  w[1] = m->local.ndim;
  for (int i = 0; i < m->local.ndim; i++) w[2 + i] = m->local.dims[i];
  if (status) distd_reason_pack(&w[1], EX_DTYPE - 1, why);
  w[EX_DTYPE] = m->dtype;
  w[EX_LAYOUT] = layout_fingerprint(m);
}

/* Every rank must give the same dtype, mesh and placements; all ranks
 * compare against the mesh's first rank, so they report the same error. */
static int check_agreement(const distd_meta *m, const int64_t *all,
                           dist_errbuf *eb) {
  for (int i = 1; i < m->mesh.nranks; i++) {
    const int64_t *w = &all[i * EXCHANGE_WORDS];
    if (w[EX_DTYPE] != all[EX_DTYPE])
      return dist_fail(eb, DIST_EMISMATCH,
                       "dtype mismatch in '%s': rank %d gives a %s piece, rank "
                       "%d a %s piece", m->name, m->mesh.ranks[0],
                       dist_dtype_name((dist_dtype)all[EX_DTYPE]), m->mesh.ranks[i],
                       dist_dtype_name((dist_dtype)w[EX_DTYPE]));
    if (w[EX_LAYOUT] != all[EX_LAYOUT])
      return dist_fail(eb, DIST_EMISMATCH,
                       "ranks %d and %d describe '%s' with different meshes or "
                       "placements", m->mesh.ranks[0], m->mesh.ranks[i], m->name);
  }
  return 0;
}

/* Every rank's local shape from the exchange, in mesh order, into pieces. */
static void unpack_pieces(const int64_t *all, int n, dist_shape *pieces) {
  for (int i = 0; i < n; i++) {
    const int64_t *w = &all[i * EXCHANGE_WORDS];
    pieces[i].ndim = (int)w[1];
    for (int d = 0; d < pieces[i].ndim && d < DIST_MAX_DIMS; d++) pieces[i].dims[d] = w[2 + d];
  }
}

/* The global shape the pieces make; every piece must then be exactly what
 * the split rule gives its rank. pieces: room for the mesh's, allocated
 * before the exchange (which decides: nothing may fail for want of memory
 * after it, or this daemon would refuse what the others store). */
static int derive_global(distd_meta *m, const int64_t *all, dist_shape *pieces,
                         dist_errbuf *eb) {
  dist_shape want;
  unpack_pieces(all, m->mesh.nranks, pieces);
  dist_global_of_pieces(&m->mesh, m->placements, pieces, &m->global);
  int bad = dist_first_misfit(&m->mesh, m->placements, &m->global, pieces, &want), rc = 0;
  if (bad >= 0) {
    char gs[96], ws[96], hs[96], ps[160];
    dist_shape_format(&pieces[bad], hs, sizeof hs);
    dist_shape_format(&want, ws, sizeof ws);
    dist_shape_format(&m->global, gs, sizeof gs);
    dist_placements_text(m->placements, m->mesh.ndim, ps, sizeof ps);
    rc = dist_fail(eb, DIST_EMISMATCH, "local pieces do not fit the placements %s: rank %d "
                   "holds %s, but global shape %s gives it %s",
                   ps, m->mesh.ranks[bad], hs, gs, ws);
  }
  return rc;
}

/* dtensor_from_local: the mesh's daemons exchange their local shapes and
 * verdicts, so they all accept or all refuse the same tensor. */
static int exchange_local_shapes(distd_server *s, uint64_t op_id,
                                 int64_t deadline, distd_meta *m, int verdict,
                                 const char *why, dist_errbuf *eb) {
  int n = m->mesh.nranks;
  int64_t mine[EXCHANGE_WORDS];
  int64_t *all = calloc((size_t)n * EXCHANGE_WORDS, sizeof *all);
  size_t *counts = calloc((size_t)n, sizeof *counts);
  dist_shape *pieces = calloc((size_t)n, sizeof *pieces);
  int rc = all && counts && pieces ? 0 : distd_abort_no_memory(s->peers, op_id, m->mesh.ranks, n,
                                                              "the shape exchange", eb);
  for (int i = 0; rc == 0 && i < n; i++) counts[i] = EXCHANGE_WORDS;
  pack_exchange(mine, verdict, why, m);
  distd_coll c;
  if (rc == 0) rc = distd_coll_init(&c, s->peers, op_id, m->mesh.ranks, n, deadline, eb);
  if (rc == 0) rc = distd_allgather(&c, mine, all, counts, DIST_INT64, eb);
  if (rc != 0) goto out;
  for (int i = 0; i < n; i++)
    if (all[i * EXCHANGE_WORDS] != 0 && m->mesh.ranks[i] != s->rank) {
      char did[300];
      snprintf(did, sizeof did, "refused its piece of '%s'", m->name);
      rc = distd_reason_fail(eb, (int)all[i * EXCHANGE_WORDS], m->mesh.ranks[i], did,
                             &all[i * EXCHANGE_WORDS + 1], EX_DTYPE - 1);
      goto out;
    }
  if (verdict != 0) {
    rc = verdict;
    goto out;
  }
  rc = check_agreement(m, all, eb);
  if (rc != 0) goto out;
  rc = derive_global(m, all, pieces, eb);
out:
  free(pieces);
  free(all);
  free(counts);
  return rc;
}

/* This rank's own checks before anything is allocated. */
static int local_verdict(distd_server *s, const Dist__V1__TensorPutRequest *rq,
                         const distd_meta *m, const dist_shape *shape, dist_errbuf *eb) {
  distd_tensor *old = NULL;
  if (!rq->replace && distd_store_get(s->store, m->name, &old, NULL) == 0) {
    distd_tensor_unref(old);
    return dist_fail(eb, DIST_EEXIST, "tensor '%s' already exists", m->name);
  }
  if (dist_placements_check(&m->mesh, m->placements, m->mesh.ndim, shape->ndim, eb) != 0)
    return eb->code;
  size_t bytes = (size_t)dist_shape_numel(&m->local) * dist_dtype_size(m->dtype);
  if (rq->derive_global_shape && rq->data.len != bytes)
    return dist_fail(eb, DIST_EMISMATCH,
                     "local piece has %zu bytes, but local shape of %lld "
                     "%s elements needs %zu",
                     rq->data.len, (long long)dist_shape_numel(&m->local),
                     dist_dtype_name(m->dtype), bytes);
  return 0;
}

static int reply_meta(distd_server *s, const distd_tensor *t,
                      grpc_byte_buffer **reply) {
  dist_wire_meta wm = {0}, *w = &wm; /* on the stack: a reply cannot fail */
  distd_meta_describe(t, s->rank, w);
  Dist__V1__TensorPutReply rp = DIST__V1__TENSOR_PUT_REPLY__INIT;
  rp.meta = &w->meta;
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}

/* shard_tensor: this rank's piece of the global shape given, made before
 * the vote so that a yes means it is in memory. */
static int piece_of_global(distd_server *s, const distd_meta *m, const ProtobufCBinaryData *data,
                           distd_tensor **out, dist_errbuf *eb) {
  distd_tensor *t = NULL;
  int rc = distd_tensor_new(s->store, m->name, m->dtype, &m->global, &m->mesh,
                            m->placements, s->rank, &t, eb);
  if (rc != 0) return rc;
  if (data->len != t->nbytes) {
    char ls[96], gs[96];
    size_t want = t->nbytes; /* read before the unref frees t */
    dist_shape_format(&t->local, ls, sizeof ls);
    dist_shape_format(&m->global, gs, sizeof gs);
    distd_tensor_unref(t);
    return dist_fail(eb, DIST_EMISMATCH,
                     "rank %d's piece of '%s' (global %s) is %s %s = %zu "
                     "bytes, but %zu bytes were sent",
                     s->rank, m->name, gs, ls, dist_dtype_name(m->dtype),
                     want, data->len);
  }
  if (data->len) memcpy(t->data, data->data, data->len); /* empty: NULL */
  *out = t;
  return 0;
}

/* dtensor_from_local: the shape exchange is the vote; the piece is
 * reserved and allocated before it, so that a request arriving meanwhile
 * cannot take its memory from one daemon after all agreed, and a daemon
 * that cannot allocate it says no there: its others stored theirs when it
 * failed after. Only the layout, which needs every rank's shape, is set
 * once they agreed. */
static int piece_from_local(distd_server *s, const distd_call_info *ci,
                            const Dist__V1__TensorPutRequest *rq, distd_meta *m, int verdict,
                            distd_tensor **out, dist_errbuf *eb) {
  size_t bytes = rq->data.len;
  if (verdict == 0 && distd_store_reserve(s->store, bytes, eb) != 0) verdict = eb->code;
  if (verdict == 0 && distd_tensor_new_unplaced(s->store, bytes, m->name, m->dtype, out, eb) != 0)
    verdict = eb->code;
  if (verdict == 0 && bytes) memcpy((*out)->data, rq->data.data, bytes);
  dist_errbuf peer_eb = DIST_ERRBUF_INIT;
  int rc = exchange_local_shapes(s, rq->op_id, ci->deadline_ms, m, verdict,
                                 verdict ? dist_errbuf_msg(eb) : NULL, verdict ? &peer_eb : eb);
  if (verdict != 0) return verdict;
  if (rc == 0) rc = distd_tensor_place(*out, &m->global, &m->mesh, m->placements, s->rank, eb);
  if (rc != 0) {
    distd_tensor_unref(*out);
    *out = NULL;
  }
  return rc;
}

/* A put this daemon refuses before its vote (or its shape exchange): the
 * other daemons of the mesh the request names, if it names one this rank
 * is in, would wait for this rank's verdict until their deadline. */
static int put_refused(distd_server *s, const Dist__V1__TensorPutRequest *rq, dist_errbuf *eb) {
  dist_mesh_desc mesh;
  if (rq->op_id && rq->meta && dist_mesh_from_pb(rq->meta->mesh, &mesh, NULL) == 0 &&
      dist_mesh_index_of(&mesh, s->rank) >= 0)
    distd_refuse_op(s, rq->op_id, 0, mesh.ranks, mesh.nranks, "its daemon", dist_errbuf_msg(eb));
  return eb->code;
}

/* The put, under its hold on the name: every daemon of the mesh makes its
 * piece, and they store them only when all could (a client before 0.2.3
 * sends shard_tensor's puts without an op id, and gets no vote); a
 * shard_tensor put is stored at one version on every daemon. The hold
 * keeps other puts, LocalLayer outputs, reshards, restores and deletes of
 * the name out. */
static int put_held(distd_server *s, const distd_call_info *ci,
                    const Dist__V1__TensorPutRequest *rq, distd_meta *m,
                    grpc_byte_buffer **reply, dist_errbuf *eb) {
  distd_staged st;
  if (distd_staged_init(&st, 1, eb) != 0) return put_refused(s, rq, eb);
  const dist_shape *shape = rq->derive_global_shape ? &m->local : &m->global;
  int verdict = local_verdict(s, rq, m, shape, eb), rc;
  if (verdict == 0 && rq->replace) distd_staged_note_version(s->store, &st, m->name, NULL);
  if (rq->derive_global_shape) {
    rc = piece_from_local(s, ci, rq, m, verdict, &st.tensors[0], eb);
  } else {
    if (verdict == 0) verdict = piece_of_global(s, m, &rq->data, &st.tensors[0], eb);
    rc = rq->op_id ? distd_vote_staged(s, m->mesh.ranks, m->mesh.nranks, rq->op_id,
                                       ci->deadline_ms, "put", verdict, &st, put_digest(m), eb)
                   : verdict;
  }
  if (rc == 0) {
    distd_staged_store(s->store, &st);
    reply_meta(s, st.tensors[0], reply);
  }
  distd_staged_free(&st);
  return rc;
}

DISTD_HANDLER(tensor_put) {
  const Dist__V1__TensorPutRequest *rq = (const void *)req;
  distd_meta m;
  memset(&m, 0, sizeof m);
  if (distd_meta_parse(s, rq->meta, &m, eb) != 0) return put_refused(s, rq, eb);
  /* Not refused for the others: they do not wait for a rank outside. */
  if (dist_mesh_index_of(&m.mesh, s->rank) < 0)
    return dist_fail(eb, DIST_EINVAL, "rank %d is not in the mesh of '%s'",
                     s->rank, m.name);
  if (distd_holds_take(s->holds, m.name, DISTD_HOLD_PUT, ci->deadline_ms, eb) != 0)
    return put_refused(s, rq, eb);
  int rc = put_held(s, ci, rq, &m, reply, eb);
  distd_holds_release(s->holds, m.name, DISTD_HOLD_PUT);
  return rc;
}

DISTD_HANDLER(tensor_get) {
  const Dist__V1__TensorGetRequest *rq = (const void *)req;
  distd_tensor *t = NULL, *full = NULL;
  if (distd_store_get(s->store, rq->name, &t, eb) != 0) return eb->code;
  const distd_tensor *value = t;
  if (rq->full) {
    dist_placement rep[DIST_MAX_MESH_DIMS];
    for (int i = 0; i < t->mesh.ndim; i++) rep[i] = DIST_REPLICATED;
    int rc = distd_reshard(s, t, &t->mesh, &t->mesh, rep, t->name, rq->op_id,
                           ci->deadline_ms, &full, eb);
    if (rc != 0) { /* the others may wait for this rank's part: tell them */
      distd_reshard_abort(s, rq->op_id, t->mesh.ndim, t->mesh.ranks, t->mesh.nranks,
                          dist_errbuf_msg(eb));
      distd_tensor_unref(t);
      return rc;
    }
    value = full;
  }
  dist_wire_meta wm = {0}, *w = &wm; /* on the stack: a reply cannot fail */
  distd_meta_describe(t, s->rank, w);
  Dist__V1__TensorGetReply rp = DIST__V1__TENSOR_GET_REPLY__INIT;
  rp.meta = &w->meta;
  rp.data.data = value->data;
  rp.data.len = value->nbytes;
  uint64_t shape[DIST_MAX_DIMS];
  for (int i = 0; i < value->local.ndim; i++) shape[i] = (uint64_t)value->local.dims[i];
  rp.n_shape = (size_t)value->local.ndim;
  rp.shape = shape;
  *reply = dist_pb_to_bb(&rp.base);
  distd_tensor_unref(full);
  distd_tensor_unref(t);
  return 0;
}

DISTD_HANDLER(tensor_list) {
  (void)ci, (void)req;
  distd_tensor **all = NULL;
  int n = 0;
  if (distd_store_list(s->store, &all, &n) != 0)
    return dist_fail(eb, DIST_ENOMEM, "out of memory listing the tensors");
  dist_wire_meta *w = calloc((size_t)n + 1, sizeof *w);
  Dist__V1__TensorMeta **metas = calloc((size_t)n + 1, sizeof *metas);
  for (int i = 0; w && metas && i < n; i++) {
    distd_meta_describe(all[i], s->rank, &w[i]);
    metas[i] = &w[i].meta;
  }
  Dist__V1__TensorListReply rp = DIST__V1__TENSOR_LIST_REPLY__INIT;
  rp.n_tensors = (size_t)n;
  rp.tensors = metas;
  if (w && metas) *reply = dist_pb_to_bb(&rp.base);
  for (int i = 0; i < n; i++) distd_tensor_unref(all[i]);
  free(all);
  int rc = w && metas ? 0 : dist_fail(eb, DIST_ENOMEM, "out of memory describing %d tensors", n);
  free(metas);
  free(w);
  return rc;
}

DISTD_HANDLER(tensor_show) {
  (void)ci;
  const Dist__V1__TensorShowRequest *rq = (const void *)req;
  distd_tensor *t = NULL;
  if (distd_store_get(s->store, rq->name, &t, eb) != 0) return eb->code;
  reply_meta(s, t, reply); /* TensorShowReply has TensorPutReply's layout */
  distd_tensor_unref(t);
  return 0;
}

DISTD_HANDLER(tensor_delete) {
  const Dist__V1__TensorDeleteRequest *rq = (const void *)req;
  /* Not while a reshard reads or replaces it: the reshard would put it
   * back here, after a daemon where it came later deleted the result. */
  if (distd_holds_take(s->holds, rq->name, DISTD_HOLD_DELETE, ci->deadline_ms, eb) != 0)
    return eb->code;
  int rc = distd_store_delete(s->store, rq->name, eb);
  /* Its optimizer state goes with it: a new tensor of that name starts as
   * plain values, not as the old parameter's continuation. */
  if (rc == 0) distd_param_forget(s->params, rq->name);
  distd_holds_release(s->holds, rq->name, DISTD_HOLD_DELETE);
  if (rc != 0) return rc;
  Dist__V1__TensorDeleteReply rp = DIST__V1__TENSOR_DELETE_REPLY__INIT;
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}
