/* dist.v1.Checkpoint, reading side: Load stores this daemon's pieces from
 * its file, Read hands pieces of any rank's file to the client. */
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
#include "vote.h"

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

/* A load as this daemon runs it: the file, and every piece and parameter
 * built from it before any is stored. */
typedef struct load_job {
  const Dist__V1__CheckpointLoadRequest *rq;
  void *bytes; /* the file, whole */
  dist_st_file *f;
  distd_tensor **t;            /* rq->tensors' pieces */
  distd_param_entry **params;  /* their optimizer state, when saved with it */
  const char **names;          /* rq->tensors' names, then rq->drop */
  size_t nnames;
  int held;                    /* names are held (holds.h), as batch */
  uint64_t batch;
  uint64_t bytes_loaded;
  uint32_t nparams;
} load_job;

/* A name both loaded and dropped would be stored, then deleted. */
static int check_drop(const Dist__V1__CheckpointLoadRequest *rq, dist_errbuf *eb) {
  for (size_t i = 0; i < rq->n_drop; i++)
    for (size_t k = 0; k < rq->n_tensors; k++)
      if (strcmp(rq->drop[i], rq->tensors[k]->name) == 0)
        return dist_fail(eb, DIST_EINVAL, "'%s' is named both to load and to drop",
                         rq->drop[i]);
  return 0;
}

/* Holds every name a load replaces or drops, for as long as it runs: a
 * reshard of one of them runs before it or after it on this daemon, never
 * across it (a reshard whose daemons then start from different versions
 * is refused by all of them, svc_reshard.c). */
static int hold_names(distd_server *s, load_job *j, int64_t deadline_ms, dist_errbuf *eb) {
  const Dist__V1__CheckpointLoadRequest *rq = j->rq;
  j->names = calloc(rq->n_tensors + rq->n_drop + 1, sizeof *j->names);
  if (!j->names) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (size_t i = 0; i < rq->n_tensors; i++) j->names[j->nnames++] = rq->tensors[i]->name;
  for (size_t i = 0; i < rq->n_drop; i++) j->names[j->nnames++] = rq->drop[i];
  int rc = distd_holds_take_all(s->holds, j->names, j->nnames, DISTD_HOLD_RESTORE,
                                deadline_ms, &j->batch, eb);
  j->held = rc == 0;
  return rc;
}

/* Every piece and parameter, with nothing stored: a bad piece, bad
 * optimizer state or a full store leaves the store and the parameters
 * unchanged. */
static int build_pieces(distd_server *s, load_job *j, dist_errbuf *eb) {
  const Dist__V1__CheckpointLoadRequest *rq = j->rq;
  size_t n = rq->n_tensors;
  j->t = calloc(n + 1, sizeof *j->t);
  j->params = calloc(n + 1, sizeof *j->params);
  if (!j->t || !j->params) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  if (n == 0) return 0; /* only drops: there may be no file */
  for (size_t i = 0; i < n; i++) {
    int rc = piece_from_file(s, rq->tensors[i], j->f, rq->file, &j->t[i], eb);
    if (rc != 0) return rc;
    j->bytes_loaded += j->t[i]->nbytes;
  }
  return distd_ckpt_params_read(j->f, rq->file, s->store, j->t, (int)n, j->params, eb);
}

static int prepare(distd_server *s, const distd_call_info *ci, load_job *j, dist_errbuf *eb) {
  const Dist__V1__CheckpointLoadRequest *rq = j->rq;
  int rc = check_drop(rq, eb);
  if (rc == 0 && (rq->file[0] || rq->n_tensors))
    rc = open_file(rq->dir, rq->file, rq->sha256, &j->bytes, &j->f, eb);
  if (rc == 0 && !rq->verify_only) rc = hold_names(s, j, ci->deadline_ms, eb);
  if (rc == 0) rc = build_pieces(s, j, eb);
  return rc;
}

/* Cannot fail. A tensor saved without optimizer state is not a parameter
 * afterwards: state kept from before would not go with its restored
 * values. */
static void apply(distd_server *s, load_job *j) {
  const Dist__V1__CheckpointLoadRequest *rq = j->rq;
  for (size_t i = 0; i < rq->n_tensors; i++) {
    distd_store_put_versioned(s->store, j->t[i]);
    if (j->params[i]) distd_param_install(s->params, j->params[i]), j->nparams++;
    else distd_param_forget(s->params, j->t[i]->name);
    j->params[i] = NULL;
  }
  for (size_t i = 0; i < rq->n_drop; i++) {
    distd_store_delete(s->store, rq->drop[i], NULL);
    distd_param_forget(s->params, rq->drop[i]);
  }
}

static void load_job_free(distd_server *s, load_job *j) {
  if (j->held) distd_holds_release_batch(s->holds, j->batch);
  for (size_t i = 0; j->t && j->params && i < j->rq->n_tensors; i++) { /* else none built */
    distd_param_entry_free(j->params[i]);
    distd_tensor_unref(j->t[i]);
  }
  free(j->params);
  free(j->t);
  free(j->names);
  dist_st_free(j->f);
  free(j->bytes);
}

DISTD_HANDLER(checkpoint_load) {
  const Dist__V1__CheckpointLoadRequest *rq = (const void *)req;
  int ranks[DIST_MAX_MESH_RANKS], n = distd_vote_ranks(s, rq->ranks, rq->n_ranks, ranks);
  load_job j = {.rq = rq};
  int rc = prepare(s, ci, &j, eb);
  if (n > 1) rc = distd_vote(s, ranks, n, rq->op_id, ci->deadline_ms, "restore", rc, NULL, eb);
  if (rc == 0 && !rq->verify_only) apply(s, &j);
  if (rc == 0) {
    Dist__V1__CheckpointLoadReply rp = DIST__V1__CHECKPOINT_LOAD_REPLY__INIT;
    rp.bytes = j.bytes_loaded;
    rp.tensors = (uint32_t)rq->n_tensors;
    rp.parameters = j.nparams;
    *reply = dist_pb_to_bb(&rp.base);
  }
  load_job_free(s, &j);
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
  if (rc == 0 && (!pieces || !ptrs || !shapes))
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory reading %zu tensors of %s", n, rq->file);
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
