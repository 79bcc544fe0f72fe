/* Optimizer state through a reshard: see param_reshard.h. */
#include "param_reshard.h"

#include <stdio.h>
#include <string.h>

#include "coll.h"
#include "peer.h"
#include "reshard.h"
#include "subop.h"

/* Fails, with the same message on every rank of src_mesh, when name has
 * pushes pending on any of them. Every rank of src_mesh holds name as a
 * parameter, so all of them exchange their counts. */
static int check_pending(distd_server *s, const char *name, const dist_mesh_desc *src_mesh,
                         uint64_t op_id, int64_t deadline_ms, dist_errbuf *eb) {
  int64_t mine = distd_param_pending(s->params, name);
  int n = src_mesh->nranks;
  int64_t all[DIST_MAX_MESH_RANKS];
  size_t counts[DIST_MAX_MESH_RANKS];
  for (int i = 0; i < n; i++) counts[i] = 1;
  distd_coll c;
  int rc = distd_coll_init(&c, s->peers, distd_subop(op_id, DISTD_STEP_PARAM_PENDING),
                           src_mesh->ranks, n, deadline_ms, eb);
  if (rc == 0) rc = distd_allgather(&c, &mine, all, counts, DIST_INT64, eb);
  for (int i = 0; rc == 0 && i < n; i++)
    if (all[i] > 0)
      rc = dist_fail(eb, DIST_EUNAVAIL,
                     "parameter '%s' has %lld push%s pending on rank %d for its next "
                     "synchronous update; reshard it once that update is applied "
                     "(nothing was changed)",
                     name, (long long)all[i], all[i] == 1 ? "" : "es", src_mesh->ranks[i]);
  return rc;
}

/* What rank k of the source tells rank k of the destination: whether the
 * reshard goes on (else the source's error), and the parameter the state
 * belongs to. Fixed-width fields: it crosses the wire as is. */
typedef struct move_note {
  int64_t verdict, follows, step, nstate;
  int64_t kind, nesterov, reduce, async, trainers;
  double lr, momentum, dampening, beta1, beta2, eps, weight_decay;
  char reason[sizeof(((dist_errbuf *)0)->msg)];
} move_note;

static void note_pack(move_note *n, int verdict, const dist_errbuf *eb,
                      const distd_param_move *m) {
  const distd_optim_cfg *o = &m->cfg.optim;
  memset(n, 0, sizeof *n);
  n->verdict = verdict;
  if (verdict) snprintf(n->reason, sizeof n->reason, "%s", dist_errbuf_msg(eb));
  n->follows = m->follows;
  n->step = (int64_t)m->step;
  n->nstate = m->nstate;
  n->kind = o->kind, n->nesterov = o->nesterov;
  n->reduce = m->cfg.reduce, n->async = m->cfg.async, n->trainers = m->cfg.trainers;
  n->lr = o->lr, n->momentum = o->momentum, n->dampening = o->dampening;
  n->beta1 = o->beta1, n->beta2 = o->beta2, n->eps = o->eps;
  n->weight_decay = o->weight_decay;
}

static int note_unpack(const move_note *n, distd_param_move *m, dist_errbuf *eb) {
  distd_optim_cfg *o = &m->cfg.optim;
  m->follows = n->follows != 0;
  m->step = (uint64_t)n->step;
  m->nstate = (int)n->nstate;
  o->kind = (distd_optim_kind)n->kind, o->nesterov = (int)n->nesterov;
  m->cfg.reduce = (dist_reduce)n->reduce, m->cfg.async = (int)n->async;
  m->cfg.trainers = (int)n->trainers;
  o->lr = n->lr, o->momentum = n->momentum, o->dampening = n->dampening;
  o->beta1 = n->beta1, o->beta2 = n->beta2, o->eps = n->eps;
  o->weight_decay = n->weight_decay;
  if (m->follows && (distd_optim_check(o, eb) != 0 ||
                     m->nstate != distd_optim_state_count(o)))
    return dist_fail(eb, DIST_EPROTO, "reshard: bad optimizer description from the "
                     "source mesh");
  return 0;
}

/* Onto another mesh: rank k of the source sends its verdict (0 or its
 * error) and the parameter's description to rank k of the destination,
 * which fails with the same error or learns what state to expect. */
static int tell_destination(distd_server *s, const dist_mesh_desc *src_mesh,
                            const dist_mesh_desc *dst_mesh, uint64_t op_id,
                            int64_t deadline_ms, int verdict, distd_param_move *m,
                            dist_errbuf *eb) {
  int from = dist_mesh_index_of(src_mesh, s->rank), to = dist_mesh_index_of(dst_mesh, s->rank);
  move_note out, in;
  int partners[2], np = 0;
  note_pack(&out, verdict, eb, m);
  uint64_t note_op = distd_subop(op_id, DISTD_STEP_PARAM_NOTE);
  if (from >= 0) partners[np++] = dst_mesh->ranks[from];
  if (to >= 0) partners[np++] = src_mesh->ranks[to];
  distd_xfer *x = distd_xfer_new(s->peers, note_op);
  if (!x) {
    dist_errbuf scratch = DIST_ERRBUF_INIT;
    int rc = distd_abort_no_memory(s->peers, note_op, partners, np, "the reshard's note",
                                   verdict ? &scratch : eb);
    return verdict ? verdict : rc;
  }
  if (from >= 0) distd_xfer_send(x, dst_mesh->ranks[from], 0, &out, sizeof out);
  if (to >= 0) distd_xfer_recv(x, src_mesh->ranks[to], 0, &in, sizeof in);
  /* A refusal stands whatever the exchange does: its own message is kept. */
  dist_errbuf scratch = DIST_ERRBUF_INIT;
  int rc = distd_xfer_finish(x, deadline_ms, partners, np, verdict ? &scratch : eb);
  distd_xfer_free(x);
  if (verdict || rc != 0 || to < 0) return verdict ? verdict : rc;
  in.reason[sizeof in.reason - 1] = '\0';
  if (in.verdict) return dist_fail(eb, (int)in.verdict, "%s", in.reason);
  return note_unpack(&in, m, eb);
}

int distd_param_move_begin(distd_server *s, const char *name, int held,
                           const dist_mesh_desc *src_mesh, const dist_mesh_desc *dst_mesh,
                           const dist_placement *dst_p, uint64_t op_id,
                           int64_t deadline_ms, distd_param_move *m, dist_errbuf *eb) {
  memset(m, 0, sizeof *m);
  memcpy(m->dst_p, dst_p, sizeof *dst_p * (size_t)dst_mesh->ndim);
  /* An entry of that name on a rank outside the source is not this
   * tensor's: left to be dropped or replaced. */
  held = held && dist_mesh_index_of(src_mesh, s->rank) >= 0;
  int rc = held ? check_pending(s, name, src_mesh, op_id, deadline_ms, eb) : 0;
  if (rc == 0 && held && dist_placements_partial_dim(dst_p, dst_mesh->ndim) < 0)
    rc = distd_param_snapshot_take(s->params, s->store, name, &m->snap, eb);
  if (rc == 0 && m->snap.tensor) {
    m->follows = 1;
    m->cfg = m->snap.cfg;
    m->step = m->snap.step;
    m->nstate = m->snap.nstate;
  }
  if (dist_mesh_equal(src_mesh, dst_mesh)) return rc;
  return tell_destination(s, src_mesh, dst_mesh, op_id, deadline_ms, rc, m, eb);
}

/* The op id state buffer k's own reshard runs under. */
static uint64_t state_op(uint64_t op_id, int k) {
  return distd_subop(op_id, DISTD_STEP_PARAM_STATE + DISTD_STEP_RESHARD_SPAN * (unsigned)k);
}

/* Reshards state buffer k, laid out as the parameter was (m->snap.tensor;
 * NULL on a rank only in the destination mesh), to the destination. */
static int reshard_buffer(distd_server *s, const distd_param_move *m, int k,
                          const char *name, const dist_mesh_desc *src_mesh,
                          const dist_mesh_desc *dst_mesh, uint64_t op_id,
                          int64_t deadline_ms, distd_tensor **moved, dist_errbuf *eb) {
  const distd_tensor *old = m->snap.tensor;
  distd_tensor *t = NULL;
  if (old) {
    int rc = distd_tensor_new(s->store, old->name, old->dtype, &old->global, &old->mesh,
                              old->placements, s->rank, &t, eb);
    if (rc != 0) return rc;
    memcpy(t->data, m->snap.state[k], t->nbytes);
  }
  int rc = distd_reshard(s, t, src_mesh, dst_mesh, m->dst_p, name, state_op(op_id, k),
                         deadline_ms, moved, eb);
  distd_tensor_unref(t);
  return rc;
}

int distd_param_move_finish(distd_server *s, distd_param_move *m, const char *name,
                            const distd_tensor *out, const dist_mesh_desc *src_mesh,
                            const dist_mesh_desc *dst_mesh, uint64_t op_id,
                            int64_t deadline_ms, distd_param_entry **entry,
                            dist_errbuf *eb) {
  *entry = NULL;
  if (!m->follows) return 0;
  distd_tensor *moved[DISTD_OPTIM_STATE_MAX] = {NULL};
  int rc = 0;
  for (int k = 0; k < m->nstate && rc == 0; k++)
    rc = reshard_buffer(s, m, k, name, src_mesh, dst_mesh, op_id, deadline_ms, &moved[k], eb);
  if (rc == 0 && out) {
    const void *state[DISTD_OPTIM_STATE_MAX] = {NULL};
    for (int k = 0; k < m->nstate; k++) state[k] = moved[k] ? moved[k]->data : NULL;
    rc = distd_param_prepare(s->store, out, &m->cfg, m->step, state, entry, eb);
  }
  for (int k = 0; k < DISTD_OPTIM_STATE_MAX; k++) distd_tensor_unref(moved[k]);
  if (rc != 0) dist_errbuf_prefix(eb, "the optimizer state of '%s': ", name);
  return rc;
}

void distd_param_move_free(distd_param_move *m) { distd_param_snapshot_free(&m->snap); }

void distd_param_move_abort(distd_server *s, uint64_t op_id, int ndim, const int *ranks, int n,
                            const char *why) {
  distd_abort_op(s->peers, distd_subop(op_id, DISTD_STEP_PARAM_PENDING), ranks, n, why);
  distd_abort_op(s->peers, distd_subop(op_id, DISTD_STEP_PARAM_NOTE), ranks, n, why);
  for (int k = 0; k < DISTD_OPTIM_STATE_MAX; k++)
    distd_reshard_abort(s, state_op(op_id, k), ndim, ranks, n, why);
}
