/* Optimizer state through a reshard: see param_reshard.h. */
#include "param_reshard.h"

#include <string.h>

#include "reshard.h"

/* Op ids of state buffer k's reshard: clear of the values' own steps. */
#define STATE_STEP(k) (100u + 20u * (unsigned)(k))

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
