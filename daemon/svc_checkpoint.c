/* dist.v1.Checkpoint: Save / Commit / Manifest / Load (checkpoint.h). */
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "checkpoint.pb-c.h"
#include "holds.h"
#include "methods.h"
#include "param_ckpt.h"
#include "param_pb.h"
#include "pbuf.h"
#include "safetensors.h"
#include "tensor_meta.h"

/* The tensors to save: the named ones this daemon holds, or all. */
static int pick_tensors(distd_server *s, const Dist__V1__CheckpointSaveRequest *rq,
                        distd_tensor ***out, int *n) {
  if (rq->n_tensors == 0) return distd_store_list(s->store, out, n);
  *out = calloc(rq->n_tensors + 1, sizeof **out);
  *n = 0;
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

static grpc_byte_buffer *save_reply(distd_server *s, distd_tensor **t,
                                    const distd_param_snapshot *snap, int n,
                                    char *file, char *sha, uint64_t bytes) {
  dist_wire_meta *w = calloc((size_t)n + 1, sizeof *w);
  Dist__V1__TensorMeta **metas = calloc((size_t)n + 1, sizeof *metas);
  char **params = calloc((size_t)n + 1, sizeof *params);
  Dist__V1__CheckpointSaveReply rp = DIST__V1__CHECKPOINT_SAVE_REPLY__INIT;
  for (int i = 0; i < n; i++) {
    distd_meta_describe(t[i], s->rank, &w[i]);
    metas[i] = &w[i].meta;
    if (snap[i].tensor) params[rp.n_parameters++] = t[i]->name;
  }
  rp.file = file;
  rp.sha256 = sha;
  rp.bytes = bytes;
  rp.n_tensors = (size_t)n;
  rp.tensors = metas;
  rp.parameters = params;
  grpc_byte_buffer *out = dist_pb_to_bb(&rp.base);
  free(params);
  free(metas);
  free(w);
  return out;
}

DISTD_HANDLER(checkpoint_save) {
  (void)ci;
  const Dist__V1__CheckpointSaveRequest *rq = (const void *)req;
  if (distd_ckpt_check_dir(rq->dir, eb) != 0 ||
      distd_ckpt_check_id(rq->checkpoint_id, eb) != 0)
    return eb->code;
  distd_tensor **t = NULL;
  int n = 0;
  pick_tensors(s, rq, &t, &n);
  distd_param_snapshot *snap = calloc((size_t)n + 1, sizeof *snap);
  distd_ckpt_contents cc = {0};
  char file[256], sha[80];
  uint64_t bytes = 0;
  int rc = snapshot_params(s, t, n, snap, eb);
  if (rc == 0) rc = distd_ckpt_contents_build(t, snap, n, &cc, eb);
  if (rc == 0) {
    const char *extra[] = {DISTD_CKPT_OPTIM_KEY, cc.optim_json};
    rc = distd_ckpt_write_rank(rq->dir, rq->checkpoint_id, s->rank, cc.entries, cc.n,
                               extra, cc.optim_json ? 1 : 0, file, sizeof file, sha,
                               &bytes, eb);
  }
  if (rc == 0) *reply = save_reply(s, t, snap, n, file, sha, bytes);
  distd_ckpt_contents_free(&cc);
  for (int i = 0; i < n; i++) {
    distd_param_snapshot_free(&snap[i]);
    distd_tensor_unref(t[i]);
  }
  free(snap);
  free(t);
  return rc;
}

DISTD_HANDLER(checkpoint_commit) {
  (void)ci, (void)s;
  const Dist__V1__CheckpointCommitRequest *rq = (const void *)req;
  if (distd_ckpt_check_dir(rq->dir, eb) != 0) return eb->code;
  for (size_t i = 0; i < rq->n_keep_files; i++)
    if (distd_ckpt_check_file(rq->keep_files[i], eb) != 0) return eb->code;
  if (rq->manifest[0] && distd_ckpt_write_manifest(rq->dir, rq->manifest, eb) != 0)
    return eb->code;
  Dist__V1__CheckpointCommitReply rp = DIST__V1__CHECKPOINT_COMMIT_REPLY__INIT;
  rp.removed = (uint32_t)distd_ckpt_remove_stale(rq->dir, rq->keep_files,
                                                 rq->n_keep_files);
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

/* Builds tensor i of the request with this rank's piece taken from the
 * file, checking that the piece is exactly what the layout gives it. */
static int piece_from_file(distd_server *s, const Dist__V1__TensorMeta *pb,
                           const dist_st_file *f, const char *file,
                           distd_tensor **out, dist_errbuf *eb) {
  distd_meta m;
  memset(&m, 0, sizeof m);
  if (distd_meta_parse(s, pb, &m, eb) != 0) return eb->code;
  if (dist_placements_check(&m.mesh, m.placements, m.mesh.ndim, m.global.ndim, eb) != 0)
    return eb->code;
  const dist_st_entry *e = dist_st_find(f, m.name);
  if (!e)
    return dist_fail(eb, DIST_EINVAL, "%s lacks tensor '%s' (the manifest lists it)",
                     file, m.name);
  int rc = distd_tensor_new(s->store, m.name, m.dtype, &m.global, &m.mesh,
                            m.placements, s->rank, out, eb);
  if (rc != 0) return rc;
  if (e->dtype != m.dtype || !dist_shape_equal(&e->shape, &(*out)->local)) {
    char want[96], got[96];
    dist_shape_format(&(*out)->local, want, sizeof want);
    dist_shape_format(&e->shape, got, sizeof got);
    distd_tensor_unref(*out);
    *out = NULL;
    return dist_fail(eb, DIST_EMISMATCH, "%s: '%s' is %s %s, but rank %d's piece "
                     "must be %s %s", file, m.name, dist_dtype_name(e->dtype), got,
                     s->rank, dist_dtype_name(m.dtype), want);
  }
  memcpy((*out)->data, e->data, e->nbytes);
  (*out)->version = pb->version;
  return 0;
}

/* Builds every piece and every parameter before the first is stored, so a
 * bad piece, bad optimizer state or a full store leaves the store and the
 * parameters unchanged. A tensor saved without optimizer state is not a
 * parameter afterwards: state kept from before would not go with its
 * restored values. */
static int load_all(distd_server *s, const Dist__V1__CheckpointLoadRequest *rq,
                    const dist_st_file *f, uint64_t *bytes, uint32_t *nparams,
                    dist_errbuf *eb) {
  size_t n = rq->n_tensors;
  distd_tensor **t = calloc(n + 1, sizeof *t);
  distd_param_entry **params = calloc(n + 1, sizeof *params);
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    rc = piece_from_file(s, rq->tensors[i], f, rq->file, &t[i], eb);
    if (rc == 0) *bytes += t[i]->nbytes;
  }
  if (rc == 0) rc = distd_ckpt_params_read(f, rq->file, s->store, t, (int)n, params, eb);
  for (size_t i = 0; i < n && rc == 0 && !rq->verify_only; i++) {
    distd_store_put_versioned(s->store, t[i]);
    if (params[i]) distd_param_install(s->params, params[i]), (*nparams)++;
    else distd_param_forget(s->params, t[i]->name);
    params[i] = NULL;
  }
  for (size_t i = 0; i < n; i++) {
    distd_param_entry_free(params[i]);
    distd_tensor_unref(t[i]);
  }
  free(params);
  free(t);
  return rc;
}

/* Reads DIR/FILE whole, checks its sha256 and parses its framing. */
static int open_file(const char *dir, const char *file, const char *sha256, void **bytes,
                     dist_st_file **f, dist_errbuf *eb) {
  *bytes = NULL;
  *f = NULL;
  size_t len = 0;
  if (distd_ckpt_check_dir(dir, eb) != 0 || distd_ckpt_check_file(file, eb) != 0)
    return eb->code;
  int rc = distd_ckpt_read_file(dir, file, sha256, bytes, &len, eb);
  if (rc == 0 && (rc = dist_st_parse(*bytes, len, f, eb)) != 0)
    dist_errbuf_prefix(eb, "%s/%s: ", dir, file);
  return rc;
}

/* Holds (holds.h) every name a load replaces, for as long as it runs: a
 * reshard of one of them runs before it or after it on this daemon, never
 * across it (a reshard whose daemons then start from different versions
 * is refused by all of them, svc_reshard.c). */
static int hold_names(distd_server *s, const Dist__V1__CheckpointLoadRequest *rq,
                      int64_t deadline_ms, const char ***names, dist_errbuf *eb) {
  *names = calloc(rq->n_tensors + 1, sizeof **names);
  if (!*names) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (size_t i = 0; i < rq->n_tensors; i++) (*names)[i] = rq->tensors[i]->name;
  return distd_holds_take_all(s->holds, *names, rq->n_tensors, DISTD_HOLD_RESTORE,
                              deadline_ms, eb);
}

DISTD_HANDLER(checkpoint_load) {
  const Dist__V1__CheckpointLoadRequest *rq = (const void *)req;
  void *bytes = NULL;
  dist_st_file *f = NULL;
  uint64_t loaded = 0;
  uint32_t nparams = 0;
  const char **names = NULL;
  int rc = open_file(rq->dir, rq->file, rq->sha256, &bytes, &f, eb);
  int held = rc == 0 && !rq->verify_only;
  if (held && (rc = hold_names(s, rq, ci->deadline_ms, &names, eb)) != 0) held = 0;
  if (rc == 0) rc = load_all(s, rq, f, &loaded, &nparams, eb);
  if (held) distd_holds_release_all(s->holds, names, rq->n_tensors, DISTD_HOLD_RESTORE);
  free(names);
  if (rc == 0) {
    Dist__V1__CheckpointLoadReply rp = DIST__V1__CHECKPOINT_LOAD_REPLY__INIT;
    rp.bytes = loaded;
    rp.tensors = (uint32_t)rq->n_tensors;
    rp.parameters = nparams;
    *reply = dist_pb_to_bb(&rp.base);
  }
  dist_st_free(f);
  free(bytes);
  return rc;
}

/* The parameters among the pieces read, as Read describes them (their
 * state points into the file read). */
typedef struct read_params {
  Dist__V1__ParamConfigureRequest *rq, **ptrs;
  Dist__V1__OptimizerConfig *opt;
  ProtobufCBinaryData (*state)[DISTD_OPTIM_STATE_MAX];
  size_t n;
} read_params;

static void read_params_free(read_params *r) {
  free(r->rq);
  free(r->ptrs);
  free(r->opt);
  free(r->state);
}

static int describe_params(const dist_st_file *f, const char *file,
                           const Dist__V1__CheckpointReadRequest *rq, read_params *out,
                           dist_errbuf *eb) {
  size_t n = rq->n_tensors;
  json_t *optim = NULL;
  memset(out, 0, sizeof *out);
  out->rq = calloc(n + 1, sizeof *out->rq);
  out->ptrs = calloc(n + 1, sizeof *out->ptrs);
  out->opt = calloc(n + 1, sizeof *out->opt);
  out->state = calloc(n + 1, sizeof *out->state);
  if (!out->rq || !out->ptrs || !out->opt || !out->state)
    return dist_fail(eb, DIST_ENOMEM, "out of memory reading %s", file);
  int rc = distd_ckpt_optim_parse(f, file, &optim, eb);
  for (size_t i = 0; i < n && rc == 0 && optim; i++) {
    const dist_st_entry *e = dist_st_find(f, rq->tensors[i]);
    distd_ckpt_param cp;
    int found = distd_ckpt_param_find(f, file, optim, rq->tensors[i], e->dtype, &e->shape,
                                      &cp, eb);
    if (found < 0) rc = found;
    if (found <= 0) continue; /* saved as plain values, or malformed (rc ends the loop) */
    Dist__V1__ParamConfigureRequest *p = &out->rq[out->n];
    dist__v1__param_configure_request__init(p);
    p->name = rq->tensors[i];
    distd_param_cfg_to_pb(&cp.cfg, &out->opt[out->n], p);
    p->with_state = 1;
    p->step = cp.step;
    for (int k = 0; k < cp.nstate; k++)
      out->state[out->n][k] = (ProtobufCBinaryData){cp.state[k]->nbytes,
                                                    (uint8_t *)cp.state[k]->data};
    p->n_state = (size_t)cp.nstate;
    p->state = out->state[out->n];
    out->ptrs[out->n++] = p;
  }
  json_decref(optim);
  return rc;
}

DISTD_HANDLER(checkpoint_read) {
  (void)ci, (void)s;
  const Dist__V1__CheckpointReadRequest *rq = (const void *)req;
  void *bytes = NULL;
  dist_st_file *f = NULL;
  read_params params = {0};
  int rc = open_file(rq->dir, rq->file, rq->sha256, &bytes, &f, eb);
  size_t n = rq->n_tensors;
  Dist__V1__CheckpointPiece *pieces = calloc(n + 1, sizeof *pieces);
  Dist__V1__CheckpointPiece **ptrs = calloc(n + 1, sizeof *ptrs);
  uint64_t(*shapes)[DIST_MAX_DIMS] = calloc(n + 1, sizeof *shapes);
  for (size_t i = 0; i < n && rc == 0; i++) {
    const dist_st_entry *e = dist_st_find(f, rq->tensors[i]);
    if (!e) {
      rc = dist_fail(eb, DIST_ENOTFOUND, "%s/%s has no tensor '%s'", rq->dir, rq->file,
                     rq->tensors[i]);
      break;
    }
    dist__v1__checkpoint_piece__init(&pieces[i]);
    pieces[i].name = rq->tensors[i];
    pieces[i].dtype = (Dist__V1__DType)e->dtype;
    for (int d = 0; d < e->shape.ndim; d++) shapes[i][d] = (uint64_t)e->shape.dims[d];
    pieces[i].n_shape = (size_t)e->shape.ndim;
    pieces[i].shape = shapes[i];
    pieces[i].data = (ProtobufCBinaryData){e->nbytes, (uint8_t *)e->data};
    ptrs[i] = &pieces[i];
  }
  if (rc == 0 && rq->optimizer_state) rc = describe_params(f, rq->file, rq, &params, eb);
  if (rc == 0) {
    Dist__V1__CheckpointReadReply rp = DIST__V1__CHECKPOINT_READ_REPLY__INIT;
    rp.n_pieces = n;
    rp.pieces = ptrs;
    rp.n_params = params.n;
    rp.params = params.ptrs;
    *reply = dist_pb_to_bb(&rp.base);
  }
  read_params_free(&params);
  free(shapes);
  free(ptrs);
  free(pieces);
  dist_st_free(f);
  free(bytes);
  return rc;
}
