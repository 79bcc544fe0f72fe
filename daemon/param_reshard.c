/* Optimizer state through a reshard: see param_reshard.h. */
#include "param_reshard.h"

#include <string.h>

#include "coll.h"
#include "reshard.h"

/* Op ids of state buffer k's reshard, and of the pending-push count
 * exchange: clear of the values' own steps. */
#define STATE_STEP(k) (100u + 20u * (unsigned)(k))
#define PENDING_STEP 90u

static int state_follows(const distd_tensor *out, const dist_mesh_desc *src_mesh,
                         const dist_mesh_desc *dst_mesh) {
  return out && dist_mesh_equal(src_mesh, dst_mesh) &&
         dist_placements_partial_dim(out->placements, out->mesh.ndim) < 0;
}

/* Reshards one state buffer, laid out as the parameter was, to out's
 * placements. */
static int reshard_buffer(distd_server *s, const distd_tensor *old, const void *state,
                          const distd_tensor *out, uint64_t op_id, int64_t deadline_ms,
                          distd_tensor **moved, dist_errbuf *eb) {
  distd_tensor *t = NULL;
  int rc = distd_tensor_new(s->store, old->name, old->dtype, &old->global, &old->mesh,
                            old->placements, s->rank, &t, eb);
  if (rc != 0) return rc;
  memcpy(t->data, state, t->nbytes);
  rc = distd_reshard(s, t, &old->mesh, &out->mesh, out->placements, old->name, op_id,
                     deadline_ms, moved, eb);
  distd_tensor_unref(t);
  return rc;
}

int distd_param_reshard(distd_server *s, const char *name, const distd_tensor *out,
                        const dist_mesh_desc *src_mesh, const dist_mesh_desc *dst_mesh,
                        uint64_t op_id, int64_t deadline_ms, distd_param_entry **entry,
                        dist_errbuf *eb) {
  *entry = NULL;
  if (!state_follows(out, src_mesh, dst_mesh)) return 0;
  distd_param_snapshot snap;
  int rc = distd_param_snapshot_take(s->params, s->store, name, &snap, eb);
  if (rc != 0 || !snap.tensor) return rc;
  distd_tensor *moved[DISTD_OPTIM_STATE_MAX] = {NULL};
  for (int k = 0; k < snap.nstate && rc == 0; k++)
    rc = reshard_buffer(s, snap.tensor, snap.state[k], out,
                        distd_subop(op_id, STATE_STEP(k)), deadline_ms, &moved[k], eb);
  if (rc == 0) {
    const void *state[DISTD_OPTIM_STATE_MAX] = {NULL};
    for (int k = 0; k < snap.nstate; k++) state[k] = moved[k] ? moved[k]->data : NULL;
    rc = distd_param_prepare(s->store, out, &snap.cfg, snap.step, state, entry, eb);
  }
  for (int k = 0; k < DISTD_OPTIM_STATE_MAX; k++) distd_tensor_unref(moved[k]);
  distd_param_snapshot_free(&snap);
  if (rc != 0) dist_errbuf_prefix(eb, "the optimizer state of '%s': ", name);
  return rc;
}

int distd_param_reshard_check(distd_server *s, const char *name,
                              const dist_mesh_desc *src_mesh, uint64_t op_id,
                              int64_t deadline_ms, dist_errbuf *eb) {
  int64_t mine = distd_param_pending(s->params, name);
  if (mine < 0 || dist_mesh_index_of(src_mesh, s->rank) < 0) return 0;
  int n = src_mesh->nranks;
  int64_t all[DIST_MAX_MESH_RANKS];
  size_t counts[DIST_MAX_MESH_RANKS];
  for (int i = 0; i < n; i++) counts[i] = 1;
  distd_coll c;
  int rc = distd_coll_init(&c, s->peers, distd_subop(op_id, PENDING_STEP), src_mesh->ranks, n,
                           deadline_ms, eb);
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
