/* dist.v1.Checkpoint, writing side: Save / Commit / Discard / Manifest
 * (checkpoint.h).
 * Load and Read are in svc_checkpoint_load.c. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "checkpoint.pb-c.h"
#include "ckpt_saves.h"
#include "clock.h"
#include "log.h"
#include "methods.h"
#include "param_ckpt.h"
#include "pbuf.h"
#include "safetensors.h"
#include "tensor_meta.h"

/* The tensors to save: the named ones this daemon holds, or all. */
static int pick_tensors(distd_server *s, const Dist__V1__CheckpointSaveRequest *rq,
                        distd_tensor ***out, int *n) {
  if (rq->n_tensors == 0) return distd_store_list(s->store, out, n);
  *out = calloc(rq->n_tensors + 1, sizeof **out);
  *n = 0;
  if (!*out) return DIST_ENOMEM;
  for (size_t i = 0; i < rq->n_tensors; i++)
    if (distd_store_get(s->store, rq->tensors[i], &(*out)[*n], NULL) == 0) (*n)++;
  return 0;
}

/* Pairs each tensor with its optimizer state when it is a parameter: the
 * parameter's values are taken again together with the state, so that no
 * update falls between the two. */
static int snapshot_params(distd_server *s, distd_tensor **t, int n,
                           distd_param_snapshot *snap, dist_errbuf *eb) {
  for (int i = 0; i < n; i++) {
    int rc = distd_param_snapshot_take(s->params, s->store, t[i]->name, &snap[i], eb);
    if (rc != 0) return rc;
    if (!snap[i].tensor) continue;
    distd_tensor_unref(t[i]);
    distd_tensor_ref(snap[i].tensor);
    t[i] = snap[i].tensor;
  }
  return 0;
}

/* The reply's memory, taken before the file is written: a daemon that
 * cannot take it writes nothing. (Made after the write, a reply that
 * failed left the file to the client's Discard, which a client itself
 * out of memory, or gone, never sends.) */
typedef struct save_room {
  distd_descriptions d;
  char **params;
} save_room;

static int save_room_take(save_room *r, int n, dist_errbuf *eb) {
  r->params = calloc((size_t)n + 1, sizeof *r->params);
  if (r->params && distd_descriptions_take(&r->d, (size_t)n) == 0) return 0;
  free(r->params);
  r->params = NULL;
  return dist_fail(eb, DIST_ENOMEM, "out of memory for the save's reply: nothing written");
}

static void save_room_free(save_room *r) {
  distd_descriptions_free(&r->d);
  free(r->params);
  r->params = NULL;
}

/* Made in the room taken before the write: it cannot fail. */
static grpc_byte_buffer *save_reply(distd_server *s, distd_tensor **t,
                                    const distd_param_snapshot *snap, int n, save_room *room,
                                    char *file, char *sha, uint64_t bytes) {
  Dist__V1__CheckpointSaveReply rp = DIST__V1__CHECKPOINT_SAVE_REPLY__INIT;
  rp.tensors = distd_describe_into(&room->d, t, (size_t)n, s->rank);
  for (int i = 0; i < n; i++)
    if (snap[i].tensor) room->params[rp.n_parameters++] = t[i]->name;
  rp.file = file;
  rp.sha256 = sha;
  rp.bytes = bytes;
  rp.n_tensors = (size_t)n;
  rp.parameters = room->params;
  return dist_pb_to_bb(&rp.base);
}

static int check_dir_and_id(const char *dir, const char *id, dist_errbuf *eb) {
  if (distd_ckpt_check_dir(dir, eb) != 0) return eb->code;
  return distd_ckpt_check_id(id, eb);
}

/* A file finished past the call's deadline belongs to a save that failed:
 * this call fails, so no reply carries the file's name and sha256, and a
 * manifest names only files whose Save replied. Nobody else would remove
 * it until the next save's commit: the client's Discard could not reach a
 * daemon frozen or stalled mid-write, or came before the file existed.
 * The daemon's deadline falls a little before its client's (rpc.c), so
 * the client has not been answered yet either way. */
static int drop_if_late(distd_server *s, const distd_call_info *ci,
                        const Dist__V1__CheckpointSaveRequest *rq, dist_errbuf *eb) {
  long long late_ms = (long long)(distd_now_ms() - ci->deadline_ms);
  if (late_ms < 0) return 0;
  distd_ckpt_discard(rq->dir, rq->checkpoint_id, s->rank);
  log_warn("checkpoint %s: removed rank %d's file in %s, written %lld ms past the "
           "save's deadline (its client has given up on it)", rq->checkpoint_id, s->rank,
           rq->dir, late_ms);
  return dist_fail(eb, DIST_ETIMEDOUT, "rank %d wrote its file of checkpoint %s %lld ms "
                   "past the call's deadline, and removed it", s->rank, rq->checkpoint_id,
                   late_ms);
}

/* The manifest in place in dir names committed files, of no save in
 * progress: this rank's from before a restart are noted, so that the next
 * commit removes them as before the restart, rather than once they are
 * too old to be of a save in progress (ckpt_saves.h). Read only while such
 * files may still be kept. */
static void note_committed_from_before(distd_server *s, const char *dir) {
  if (!distd_ckpt_saves_began_lately(s->ckpt_saves)) return;
  char **files = NULL, path[4096], id[80];
  size_t n = 0;
  distd_ckpt_manifest_files(dir, &files, &n);
  for (size_t i = 0; i < n; i++) {
    int rank;
    if (!distd_ckpt_parse_file(files[i], &rank, id, sizeof id) || rank != s->rank) continue;
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    distd_ckpt_saves_saw_in_manifest(s->ckpt_saves, files[i],
                                     distd_ckpt_mtime_ms(AT_FDCWD, path));
  }
  distd_ckpt_files_free(files, n);
}

/* Marked in progress before its temp file exists, and again once it is
 * answered, from when its client may take a while to commit; settled at
 * once when it fails, its file gone (ckpt_saves.h). */
DISTD_HANDLER(checkpoint_save) {
  const Dist__V1__CheckpointSaveRequest *rq = (const void *)req;
  if (check_dir_and_id(rq->dir, rq->checkpoint_id, eb) != 0 ||
      distd_ckpt_saves_mark(s->ckpt_saves, rq->checkpoint_id, s->rank, eb) != 0)
    return eb->code;
  note_committed_from_before(s, rq->dir);
  distd_tensor **t = NULL;
  int n = 0;
  int rc = pick_tensors(s, rq, &t, &n);
  distd_param_snapshot *snap = rc == 0 ? calloc((size_t)n + 1, sizeof *snap) : NULL;
  distd_ckpt_contents cc = {0};
  char file[256], sha[80];
  uint64_t bytes = 0;
  if (!snap) rc = dist_fail(eb, DIST_ENOMEM, "out of memory listing the tensors to save");
  if (rc == 0) rc = snapshot_params(s, t, n, snap, eb);
  if (rc == 0) rc = distd_ckpt_contents_build(t, snap, n, &cc, eb);
  save_room room = {0};
  if (rc == 0) rc = save_room_take(&room, n, eb);
  if (rc == 0) {
    const char *extra[] = {DISTD_CKPT_OPTIM_KEY, cc.optim_json};
    rc = distd_ckpt_write_rank(rq->dir, rq->checkpoint_id, s->rank, cc.entries, cc.n,
                               extra, cc.optim_json ? 1 : 0, file, sizeof file, sha,
                               &bytes, eb);
  }
  if (rc == 0) rc = drop_if_late(s, ci, rq, eb);
  if (rc == 0) rc = distd_ckpt_saves_mark(s->ckpt_saves, rq->checkpoint_id, s->rank, eb);
  if (rc == 0) *reply = save_reply(s, t, snap, n, &room, file, sha, bytes);
  else distd_ckpt_saves_settle(s->ckpt_saves, rq->checkpoint_id);
  save_room_free(&room);
  distd_ckpt_contents_free(&cc);
  for (int i = 0; i < n; i++) {
    if (snap) distd_param_snapshot_free(&snap[i]);
    distd_tensor_unref(t[i]);
  }
  free(snap);
  free(t);
  return rc;
}

/* The saves whose files keep names are committed here. */
static void record_committed(distd_ckpt_saves *saves, char *const *keep, size_t nkeep) {
  for (size_t i = 0; i < nkeep; i++) {
    int rank;
    char id[80];
    if (distd_ckpt_parse_file(keep[i], &rank, id, sizeof id))
      distd_ckpt_saves_committed(saves, id);
  }
}

/* The manifest is switched first; then this daemon's files that neither
 * this commit nor the manifest in place names are stale
 * (distd_ckpt_remove_stale), unless their save is in progress (they stay
 * for its own commit) or was committed here while this commit may be one
 * crossing it (ckpt_saves.h). The manifest is read back because another
 * client's commit may have replaced this one's on rank 0 already; a
 * daemon that does not see rank 0's directory reads none, and relies on
 * its record of committed saves. This commit's saves are recorded
 * committed after the scan: until then they are in progress, and keep the
 * saves committed before them that they may cross. */
static int commit_locked(distd_server *s, const Dist__V1__CheckpointCommitRequest *rq,
                         grpc_byte_buffer **reply, dist_errbuf *eb) {
  if (rq->manifest[0] && distd_ckpt_write_manifest(rq->dir, rq->manifest, eb) != 0)
    return eb->code;
  char **in_place = NULL;
  size_t nin_place = 0;
  if (distd_ckpt_manifest_files(rq->dir, &in_place, &nin_place) < 0)
    return dist_fail(eb, DIST_ENOMEM, "out of memory reading the manifest in place: no stale "
                     "file removed");
  distd_ckpt_stale_rule rule = {s->rank, s->world_size, rq->keep_files, rq->n_keep_files,
                                in_place, nin_place, distd_ckpt_saves_in_progress,
                                distd_ckpt_saves_keeps,
                                distd_ckpt_saves_may_be_from_before_restart, s->ckpt_saves};
  Dist__V1__CheckpointCommitReply rp = DIST__V1__CHECKPOINT_COMMIT_REPLY__INIT;
  rp.removed = (uint32_t)distd_ckpt_remove_stale(rq->dir, &rule);
  distd_ckpt_files_free(in_place, nin_place);
  record_committed(s->ckpt_saves, rq->keep_files, rq->n_keep_files);
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}

DISTD_HANDLER(checkpoint_commit) {
  (void)ci;
  const Dist__V1__CheckpointCommitRequest *rq = (const void *)req;
  if (distd_ckpt_check_dir(rq->dir, eb) != 0) return eb->code;
  for (size_t i = 0; i < rq->n_keep_files; i++)
    if (distd_ckpt_check_file(rq->keep_files[i], eb) != 0) return eb->code;
  distd_ckpt_saves_commit_begin(s->ckpt_saves);
  int rc = commit_locked(s, rq, reply, eb);
  distd_ckpt_saves_commit_end(s->ckpt_saves);
  return rc;
}

DISTD_HANDLER(checkpoint_discard) {
  (void)ci;
  const Dist__V1__CheckpointDiscardRequest *rq = (const void *)req;
  if (check_dir_and_id(rq->dir, rq->checkpoint_id, eb) != 0) return eb->code;
  Dist__V1__CheckpointDiscardReply rp = DIST__V1__CHECKPOINT_DISCARD_REPLY__INIT;
  rp.removed = (uint32_t)distd_ckpt_discard(rq->dir, rq->checkpoint_id, s->rank);
  distd_ckpt_saves_settle(s->ckpt_saves, rq->checkpoint_id);
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}

DISTD_HANDLER(checkpoint_manifest) {
  (void)ci, (void)s;
  const Dist__V1__CheckpointManifestRequest *rq = (const void *)req;
  char *text = NULL;
  if (distd_ckpt_check_dir(rq->dir, eb) != 0 ||
      distd_ckpt_read_manifest(rq->dir, &text, eb) != 0)
    return eb->code;
  Dist__V1__CheckpointManifestReply rp = DIST__V1__CHECKPOINT_MANIFEST_REPLY__INIT;
  rp.manifest = text;
  *reply = dist_pb_to_bb(&rp.base);
  free(text);
  return 0;
}
