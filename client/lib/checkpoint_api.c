/* Checkpoints from the client's side: ask every daemon to write its pieces,
 * then switch the manifest; on restore, have the daemons load their files
 * all or none, then reshard as asked. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint.pb-c.h"
#include "checkpoint_internal.h"
#include "json_memory.h"
#include "process_token.h"
#include "wire.h"

#define MANIFEST_FORMAT "distd-checkpoint"
#define MANIFEST_VERSION 1

static void progress(const dist_checkpoint_opts *o, const char *phase, int rank,
                     int done, int total, uint64_t bytes) {
  if (o && o->progress) o->progress(o->progress_arg, phase, rank, done, total, bytes);
}

/* A fresh id: UTC time, then nanoseconds and the process token to tell
 * apart saves in the same second, of this process and of others (whose
 * pids may be this one's, in pid namespaces of their own). 0, or the
 * token's error. */
static int make_id(dist_client *c, char *id, size_t len) {
  char token[DIST_PROCESS_TOKEN_LEN + 1];
  if (dist_process_token(c, token) != 0) return c->err.code;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char when[32];
  strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &tm);
  snprintf(id, len, "%s-%08lx%s", when, (unsigned long)ts.tv_nsec, token);
  return 0;
}

static void placement_text(const dist_placement *p, char *buf, size_t len) {
  if (p->kind == DIST_SHARD) snprintf(buf, len, "Shard(%d)", p->dim);
  else if (p->kind == DIST_PARTIAL) snprintf(buf, len, "Partial(%s)", dist_reduce_name(p->reduce));
  else snprintf(buf, len, "Replicate()");
}

/* NULL when jansson could not allocate a step (json_memory.h): never an
 * entry with a dim or a rank left out. */
static json_t *tensor_json(const dist_tensor *t, uint64_t version, int with_state) {
  json_t *shape = json_array(), *mshape = json_array(), *ranks = json_array(),
         *names = json_array(), *pl = json_array();
  int failed = !shape || !mshape || !ranks || !names || !pl;
  for (int d = 0; d < t->shape.ndim; d++)
    failed |= json_array_append_new(shape, json_integer(t->shape.dims[d])) != 0;
  const dist_mesh_desc *m = &t->mesh.d;
  for (int d = 0; d < m->ndim; d++) {
    char buf[64];
    placement_text(&t->placements[d], buf, sizeof buf);
    failed |= json_array_append_new(mshape, json_integer(m->shape[d])) != 0 ||
              json_array_append_new(names, json_string(m->dim_names[d])) != 0 ||
              json_array_append_new(pl, json_string(buf)) != 0;
  }
  for (int i = 0; i < m->nranks; i++)
    failed |= json_array_append_new(ranks, json_integer(m->ranks[i])) != 0;
  if (failed) {
    json_t *all[] = {shape, mshape, ranks, names, pl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) json_decref(all[i]);
    return NULL;
  }
  return json_pack("{s:s, s:s, s:o, s:{s:o, s:o, s:o}, s:o, s:I, s:b}", "name",
                   t->name, "dtype", dist_dtype_name(t->dtype), "shape", shape,
                   "mesh", "shape", mshape, "ranks", ranks, "dim_names", names,
                   "placements", pl, "version", (json_int_t)version,
                   "optimizer_state", with_state);
}

static int no_memory(dist_client *c, const char *doing) {
  return dist_client_fail(c, DIST_ENOMEM, "out of memory %s", doing);
}

/* What the daemons wrote, one reply per rank; asked: the ranks 0..asked-1
 * sent a Save (each may have written its file). */
typedef struct saved {
  int n, asked;
  Dist__V1__CheckpointSaveReply **replies;
} saved;

static void saved_free(saved *s) {
  for (int i = 0; i < s->n; i++)
    if (s->replies[i]) protobuf_c_message_free_unpacked(&s->replies[i]->base, NULL);
  free(s->replies);
}

static int saved_with_state(const Dist__V1__CheckpointSaveReply *rp, const char *name) {
  for (size_t k = 0; k < rp->n_parameters; k++)
    if (strcmp(rp->parameters[k], name) == 0) return 1;
  return 0;
}

/* Each rank reports the tensors it holds, so a name comes back once per
 * rank of its mesh, the same each time. Per-rank values (one name, each
 * daemon's piece on its own one-rank mesh) come back on different meshes:
 * the one manifest entry kept the first, and a restore lost the others
 * unseen. */
static int same_tensor(dist_client *c, json_t *prev, const dist_tensor *t) {
  json_t *mine = tensor_json(t, 0, 0);
  if (!mine) return no_memory(c, "describing a tensor for the manifest");
  json_t *a = json_object_get(prev, "mesh"), *b = json_object_get(mine, "mesh");
  int rc = 0;
  if (!json_equal(a, b)) {
    char *ra = dist_json_dumps(json_object_get(a, "ranks"), JSON_COMPACT),
         *rb = dist_json_dumps(json_object_get(b, "ranks"), JSON_COMPACT);
    if (!ra || !rb) rc = no_memory(c, "describing a tensor for the manifest");
    else rc = dist_client_fail(c, DIST_ENOTSUP, "'%s' is held as per-rank values (on mesh "
                               "%s, on mesh %s, ...): a checkpoint keeps one tensor per "
                               "name; save the others by name", t->name, ra, rb);
    free(ra);
    free(rb);
  }
  json_decref(mine);
  return rc;
}

/* Every rank of a tensor's mesh must have written its piece, at the same
 * version, else the checkpoint would not hold the tensor. It holds the
 * optimizer state of a parameter when every rank wrote its share. */
static int add_tensor(dist_client *c, json_t *tensors, const saved *sv,
                      const Dist__V1__TensorMeta *m, dist_checkpoint_info *info) {
  json_t *prev = json_object_get(tensors, m->name);
  dist_tensor t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "%s", m->name);
  t.dtype = (dist_dtype)m->dtype;
  dist_shape_from_pb(m->global_shape, m->n_global_shape, &t.shape, NULL);
  if (!m->mesh || dist_mesh_from_pb(m->mesh, &t.mesh.d, NULL) != 0)
    return dist_client_fail(c, DIST_EPROTO, "'%s' came back without its mesh", m->name);
  dist_placements_from_pb(m->placements, m->n_placements, t.placements, NULL);
  if (prev) return same_tensor(c, prev, &t);
  int with_state = 1;
  for (int i = 0; i < t.mesh.d.nranks; i++) {
    int r = t.mesh.d.ranks[i], found = 0;
    if (r < sv->n) with_state &= saved_with_state(sv->replies[r], m->name);
    for (size_t k = 0; r < sv->n && k < sv->replies[r]->n_tensors && !found; k++) {
      const Dist__V1__TensorMeta *o = sv->replies[r]->tensors[k];
      if (strcmp(o->name, m->name) != 0) continue;
      found = 1;
      if (o->version != m->version)
        return dist_client_fail(c, DIST_EUNAVAIL, "'%s' changed during the save "
                                "(version %llu on one rank, %llu on rank %d): "
                                "save again", m->name, (unsigned long long)m->version,
                                (unsigned long long)o->version, r);
    }
    if (r >= sv->n) /* a client of fewer daemons than the tensor's mesh names */
      return dist_client_fail(c, DIST_ENOTSUP, "'%s' has a piece on rank %d, which this "
                              "client does not reach: save through the cluster file",
                              m->name, r);
    if (!found)
      return dist_client_fail(c, DIST_ENOTFOUND, "rank %d holds no piece of '%s'",
                              r, m->name);
  }
  if (json_object_set_new(tensors, m->name, tensor_json(&t, m->version, with_state)) != 0)
    return no_memory(c, "describing a tensor for the manifest");
  info->nparams += with_state;
  return 0;
}

static int not_found(dist_client *c, const char *name) {
  return dist_client_fail(c, DIST_ENOTFOUND, "tensor '%s' not found", name);
}

/* The daemons' files, by rank. */
static int add_files(dist_client *c, json_t *files, const saved *sv,
                     dist_checkpoint_info *info) {
  for (int r = 0; r < sv->n; r++) {
    const Dist__V1__CheckpointSaveReply *rp = sv->replies[r];
    if (json_array_append_new(files, json_pack("{s:i, s:s, s:s, s:I}", "rank", r,
                                               "file", rp->file, "sha256", rp->sha256,
                                               "bytes", (json_int_t)rp->bytes)) != 0)
      return no_memory(c, "listing the checkpoint's files");
    info->bytes += rp->bytes;
  }
  return 0;
}

/* Every tensor a daemon wrote, once, checked against the others' pieces. */
static int add_tensors(dist_client *c, json_t *tensors, const saved *sv,
                       const dist_checkpoint_opts *o, dist_checkpoint_info *info) {
  int rc = 0;
  for (int r = 0; r < sv->n && rc == 0; r++)
    for (size_t k = 0; k < sv->replies[r]->n_tensors && rc == 0; k++)
      rc = add_tensor(c, tensors, sv, sv->replies[r]->tensors[k], info);
  for (int i = 0; o && i < o->ntensors && rc == 0; i++)
    if (!json_object_get(tensors, o->tensors[i])) rc = not_found(c, o->tensors[i]);
  return rc;
}

static int build_manifest(dist_client *c, const char *id, const saved *sv,
                          const dist_checkpoint_opts *o, char **text,
                          dist_checkpoint_info *info) {
  json_t *tensors = json_object(), *files = json_array(), *list = json_array();
  int rc = tensors && files && list ? 0 : no_memory(c, "building the manifest");
  if (rc == 0) rc = add_files(c, files, sv, info);
  if (rc == 0) rc = add_tensors(c, tensors, sv, o, info);
  const char *k;
  json_t *v;
  json_object_foreach(tensors, k, v) {
    if (rc == 0 && json_array_append(list, v) != 0) rc = no_memory(c, "building the manifest");
  }
  info->ntensors = (int)json_array_size(list);
  info->nfiles = sv->n;
  /* takes files and list, even when it fails */
  json_t *doc = json_pack("{s:s, s:i, s:s, s:i, s:o, s:o}", "format", MANIFEST_FORMAT,
                          "format_version", MANIFEST_VERSION, "checkpoint_id", id,
                          "world_size", sv->n, "files", files, "tensors", list);
  if (rc == 0 && !(doc && (*text = dist_json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS))))
    rc = no_memory(c, "writing the manifest");
  json_decref(doc);
  json_decref(tensors);
  return rc;
}

static int save_ranks(dist_client *c, const char *dir, const char *id,
                      const dist_checkpoint_opts *o, saved *sv) {
  Dist__V1__CheckpointSaveRequest rq = DIST__V1__CHECKPOINT_SAVE_REQUEST__INIT;
  rq.dir = (char *)dir;
  rq.checkpoint_id = (char *)id;
  rq.n_tensors = o ? (size_t)o->ntensors : 0;
  rq.tensors = o ? (char **)o->tensors : NULL;
  sv->replies = calloc((size_t)c->n + 1, sizeof *sv->replies);
  if (!sv->replies)
    return dist_client_fail(c, DIST_ENOMEM, "out of memory saving through %d daemons", c->n);
  sv->n = c->n;
  /* One daemon after the other, so progress is exact. */
  for (int r = 0; r < c->n; r++) {
    ProtobufCMessage *rp = NULL;
    sv->asked = r + 1;
    int rc = dist_call_one(c, r, "/dist.v1.Checkpoint/Save", &rq.base,
                           &dist__v1__checkpoint_save_reply__descriptor, &rp);
    if (rc != 0) {
      dist_errbuf why = c->err;
      char who[300];
      return dist_client_fail(c, rc, "%s could not save its pieces (the previous "
                              "checkpoint is untouched): %s",
                              dist_rank_label(c, r, who, sizeof who), dist_errbuf_msg(&why));
    }
    sv->replies[r] = (Dist__V1__CheckpointSaveReply *)rp;
    progress(o, "save", dist_daemon_rank(c, r), r + 1, c->n, sv->replies[r]->bytes);
  }
  return 0;
}

/* Writes the manifest through rank 0, then every daemon drops the files the
 * new manifest does not name. */
static int commit(dist_client *c, const char *dir, const char *manifest,
                  const saved *sv) {
  char **keep = calloc((size_t)sv->n + 1, sizeof *keep);
  if (!keep)
    return dist_client_fail(c, DIST_ENOMEM, "out of memory committing %d daemons' files", sv->n);
  for (int r = 0; r < sv->n; r++) keep[r] = sv->replies[r]->file;
  Dist__V1__CheckpointCommitRequest rq = DIST__V1__CHECKPOINT_COMMIT_REQUEST__INIT;
  rq.dir = (char *)dir;
  rq.manifest = (char *)manifest;
  rq.n_keep_files = (size_t)sv->n;
  rq.keep_files = keep;
  int rc = 0;
  for (int r = 0; r < c->n && rc == 0; r++) {
    ProtobufCMessage *rp = NULL;
    rc = dist_call_one(c, r, "/dist.v1.Checkpoint/Commit", &rq.base,
                       &dist__v1__checkpoint_commit_reply__descriptor, &rp);
    if (rp) protobuf_c_message_free_unpacked(rp, NULL);
    rq.manifest = ""; /* the others only clean up */
    if (r > 0) rc = 0; /* the checkpoint is committed; leftovers are harmless */
  }
  free(keep);
  return rc;
}

/* A checkpoint lists each daemon's file, and the meshes of its tensors,
 * by rank, and its save and restore go through the client's daemons by
 * position (save_ranks, commit, load_ranks, dist_ckpt_missing_rank):
 * through the daemon of another rank than 0 alone, a save would list that
 * daemon's file as rank 0's (and its commit remove the other ranks'
 * files), and a restore would have it load rank 0's file, and could not
 * drop an older layout's pieces on the daemons it does not reach. A
 * client of one endpoint addresses its daemon by its rank since session
 * 28, but reaches no other daemon, so both stay refused there. The
 * daemon's rank is asked of it, and a daemon that does not say within the
 * call's deadline fails the save or restore: going on unchecked is what
 * could destroy a checkpoint (a daemon slow to answer dist_daemon_rank's
 * quick question, which is why an unknown rank is asked with dist_info
 * instead). */
static int check_reach(dist_client *c, const char *what) {
  int rank = dist_known_daemon_rank(c, 0);
  if (rank < 0) {
    dist_daemon_info info;
    if (dist_info(c, 0, &info) != 0) return c->err.code;
    rank = info.rank;
    dist_info_free(&info);
  }
  if (rank == 0) return 0;
  return dist_client_fail(c, DIST_ENOTSUP, "checkpoint %s through distd at %s, which is "
                          "rank %d: a checkpoint lists its files by rank and goes through "
                          "every daemon, and a client of one endpoint reaches only its "
                          "own; %s through the cluster file", what, c->endpoints[0], rank,
                          what);
}

/* Every daemon reads and writes the directory at the same path, so it must
 * be absolute (distctl makes it so). */
static int check_dir(dist_client *c, const char *dir) {
  if (dir && dir[0] == '/') return 0;
  return dist_client_fail(c, DIST_EINVAL, "checkpoint directory '%s' must be "
                          "an absolute path", dir ? dir : "(null)");
}

/* opts->tensors names opts->ntensors tensors, or is NULL for every one
 * with a count of 0. Anything else is the caller's mistake: a save read
 * the names past the list (or through NULL) and crashed, a restore took no
 * tensor and reported success. */
static int check_list(dist_client *c, const dist_checkpoint_opts *o) {
  int n = o ? o->ntensors : 0;
  if (o && (o->tensors ? n < 1 : n != 0))
    return dist_client_fail(c, DIST_EINVAL, "checkpoint options: ntensors = %d with "
                            "tensors %s: give the names and their count, or NULL and 0 "
                            "for every tensor", n, o->tensors ? "set" : "NULL");
  for (int i = 0; i < n; i++)
    if (!o->tensors[i])
      return dist_client_fail(c, DIST_EINVAL, "checkpoint options: tensor name %d of %d "
                              "is NULL", i, n);
  return 0;
}

/* The tensors named must exist before any daemon writes: a save refused
 * for a name wrote nothing. (One deleted meanwhile still fails in
 * build_manifest, and discard takes the files back.) */
static int check_names(dist_client *c, const dist_checkpoint_opts *o) {
  if (!o || o->ntensors == 0) return 0;
  dist_tensor **list = NULL;
  int n = 0, rc = dist_tensor_list(c, &list, &n);
  for (int i = 0; rc == 0 && i < o->ntensors; i++) {
    int found = 0;
    for (int k = 0; k < n && !found; k++) found = strcmp(list[k]->name, o->tensors[i]) == 0;
    if (!found) rc = not_found(c, o->tensors[i]);
  }
  dist_tensor_list_free(list, n);
  return rc;
}

/* A save that failed before its commit removes the files it wrote, on the
 * ranks it asked, keeping the failure's message. A daemon removes only
 * this save's id, never the files of the checkpoint in place; one that
 * cannot be reached (or predates Discard) keeps its file until the next
 * save's commit. */
static void discard(dist_client *c, const char *dir, const char *id, int asked) {
  if (asked == 0) return;
  dist_errbuf why = c->err;
  Dist__V1__CheckpointDiscardRequest rq = DIST__V1__CHECKPOINT_DISCARD_REQUEST__INIT;
  rq.dir = (char *)dir;
  rq.checkpoint_id = (char *)id;
  dist_call *calls = NULL;
  dist_call_all(c, "/dist.v1.Checkpoint/Discard", &dist__v1__checkpoint_discard_reply__descriptor,
                &rq.base, NULL, asked, &calls);
  dist_calls_release(calls, asked);
  c->err = why;
}

int dist_checkpoint_save(dist_client *c, const char *dir,
                         const dist_checkpoint_opts *opts,
                         dist_checkpoint_info *info) {
  if (!c) return dist_no_client(__func__);
  dist_checkpoint_info local;
  if (!info) info = &local;
  memset(info, 0, sizeof *info);
  if (check_dir(c, dir) != 0 || check_list(c, opts) != 0 || check_reach(c, "save") != 0 ||
      check_names(c, opts) != 0)
    return c->err.code;
  if (make_id(c, info->id, sizeof info->id) != 0) return c->err.code;
  saved sv = {0, 0, NULL};
  char *manifest = NULL;
  int rc = save_ranks(c, dir, info->id, opts, &sv);
  if (rc == 0) rc = build_manifest(c, info->id, &sv, opts, &manifest, info);
  /* A commit that failed may have switched the manifest: its files stay. */
  if (rc != 0) discard(c, dir, info->id, sv.asked);
  else rc = commit(c, dir, manifest, &sv);
  free(manifest);
  saved_free(&sv);
  return rc;
}

/* ------------------------------------------------------------- restore */

static void manifest_free(ckpt_manifest *m) {
  free(m->file);
  free(m->sha);
  free(m->tensors);
}

static int bad_manifest(dist_client *c, const char *dir, const char *what) {
  return dist_client_fail(c, DIST_EINVAL, "%s/manifest.json is not a valid "
                          "checkpoint manifest: %s", dir, what);
}

static int parse_mesh(json_t *j, dist_mesh_desc *m) {
  json_t *shape = json_object_get(j, "shape"), *ranks = json_object_get(j, "ranks");
  int sh[DIST_MAX_MESH_DIMS], rk[DIST_MAX_MESH_RANKS];
  size_t nd = json_array_size(shape), nr = json_array_size(ranks);
  if (nd < 1 || nd > DIST_MAX_MESH_DIMS || nr < 1 || nr > DIST_MAX_MESH_RANKS) return -1;
  for (size_t i = 0; i < nd; i++) sh[i] = (int)json_integer_value(json_array_get(shape, i));
  for (size_t i = 0; i < nr; i++) rk[i] = (int)json_integer_value(json_array_get(ranks, i));
  const char *names[DIST_MAX_MESH_DIMS];
  json_t *jn = json_object_get(j, "dim_names");
  for (size_t i = 0; i < nd; i++) names[i] = json_string_value(json_array_get(jn, i));
  for (size_t i = 0; i < nd; i++)
    if (!names[i]) return dist_mesh_init(m, (int)nd, sh, rk, NULL, NULL) == 0 ? 0 : -1;
  return dist_mesh_init(m, (int)nd, sh, rk, names, NULL) == 0 ? 0 : -1;
}

/* 0, 1 when j is not a tensor's entry, -1 when jansson could not allocate. */
static int parse_tensor(json_t *j, ckpt_entry *e) {
  const char *name, *dtype;
  json_t *shape, *mesh, *pl;
  json_int_t version;
  int unpacked = dist_json_unpack(j, "{s:s, s:s, s:o, s:o, s:o, s:I}", "name", &name, "dtype",
                                  &dtype, "shape", &shape, "mesh", &mesh, "placements", &pl,
                                  "version", &version);
  if (unpacked != 0) return unpacked;
  if (strlen(name) >= sizeof e->t.name) return 1;
  snprintf(e->t.name, sizeof e->t.name, "%s", name);
  e->version = (uint64_t)version;
  /* Absent in checkpoints from before optimizer state was kept. */
  e->with_state = json_is_true(json_object_get(j, "optimizer_state"));
  if ((e->t.dtype = dist_dtype_parse(dtype)) == DIST_DTYPE_INVALID) return 1;
  int64_t dims[DIST_MAX_DIMS];
  int ndim = (int)json_array_size(shape);
  if (!json_is_array(shape) || ndim > DIST_MAX_DIMS) return 1;
  for (int d = 0; d < ndim; d++) dims[d] = json_integer_value(json_array_get(shape, (size_t)d));
  /* Bounded as every tensor's: [2^32, 2^32] counted its elements past
   * int64 (signed overflow) when rebuilt in the client. */
  if (dist_shape_make(ndim, dims, &e->t.shape, NULL) != 0) return 1;
  if (parse_mesh(mesh, &e->t.mesh.d) != 0) return 1;
  char text[512] = "";
  for (size_t i = 0; i < json_array_size(pl); i++) {
    const char *p = json_string_value(json_array_get(pl, i));
    if (!p || strlen(text) + strlen(p) + 2 >= sizeof text) return 1;
    if (i) strcat(text, ",");
    strcat(text, p);
  }
  int np = 0;
  if (dist_placements_parse(text, e->t.placements, DIST_MAX_MESH_DIMS, &np, NULL) != 0 ||
      np != e->t.mesh.d.ndim)
    return 1;
  return dist_placements_check(&e->t.mesh.d, e->t.placements, np, e->t.shape.ndim,
                               NULL) == 0 ? 0 : 1;
}

static int parse_manifest(dist_client *c, const char *dir, const char *text,
                          ckpt_manifest *m) {
  json_error_t jerr;
  int lost_memory;
  json_t *doc = dist_json_loadb(text, strlen(text), 0, &jerr, &lost_memory), *files, *tensors;
  const char *format, *id = "";
  int rc = 0;
  if (lost_memory) {
    rc = no_memory(c, "reading the manifest");
    goto out;
  }
  int unpacked = doc ? dist_json_unpack(doc, "{s:s, s:o, s:o, s?s}", "format", &format,
                                        "files", &files, "tensors", &tensors,
                                        "checkpoint_id", &id) : 1;
  if (unpacked < 0) {
    rc = no_memory(c, "reading the manifest");
    goto out;
  }
  if (unpacked > 0 || strcmp(format, MANIFEST_FORMAT) != 0 || !json_is_array(files) ||
      !json_is_array(tensors)) {
    rc = bad_manifest(c, dir, doc ? "missing format, files or tensors" : jerr.text);
    goto out;
  }
  snprintf(m->id, sizeof m->id, "%s", id);
  m->nfiles = (int)json_array_size(files);
  m->ntensors = (int)json_array_size(tensors);
  m->file = calloc((size_t)m->nfiles + 1, sizeof *m->file);
  m->sha = calloc((size_t)m->nfiles + 1, sizeof *m->sha);
  m->tensors = calloc((size_t)m->ntensors + 1, sizeof *m->tensors);
  if (!m->file || !m->sha || !m->tensors) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory reading the manifest of %s (%d files, "
                          "%d tensors)", dir, m->nfiles, m->ntensors);
    goto out;
  }
  for (int i = 0; i < m->nfiles && rc == 0; i++) {
    int rank;
    const char *file, *sha;
    unpacked = dist_json_unpack(json_array_get(files, (size_t)i), "{s:i, s:s, s:s}", "rank",
                                &rank, "file", &file, "sha256", &sha);
    if (unpacked < 0)
      rc = no_memory(c, "reading the manifest");
    else if (unpacked > 0 || rank != i || strlen(file) >= sizeof m->file[i] ||
             strlen(sha) >= sizeof m->sha[i])
      rc = bad_manifest(c, dir, "a files entry is malformed or out of rank order");
    else
      snprintf(m->file[i], sizeof m->file[i], "%s", file),
      snprintf(m->sha[i], sizeof m->sha[i], "%s", sha);
  }
  for (int i = 0; i < m->ntensors && rc == 0; i++) {
    int parsed = parse_tensor(json_array_get(tensors, (size_t)i), &m->tensors[i]);
    if (parsed < 0) rc = no_memory(c, "reading the manifest");
    else if (parsed > 0) rc = bad_manifest(c, dir, "a tensors entry is malformed");
  }
out:
  json_decref(doc);
  return rc;
}

static int read_manifest(dist_client *c, const char *dir, ckpt_manifest *m) {
  Dist__V1__CheckpointManifestRequest rq = DIST__V1__CHECKPOINT_MANIFEST_REQUEST__INIT;
  rq.dir = (char *)dir;
  ProtobufCMessage *rp = NULL;
  int rc = dist_call_one(c, 0, "/dist.v1.Checkpoint/Manifest", &rq.base,
                         &dist__v1__checkpoint_manifest_reply__descriptor, &rp);
  if (rc == 0) rc = parse_manifest(c, dir, ((Dist__V1__CheckpointManifestReply *)rp)->manifest, m);
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}

/* A tensor saved on ranks the cluster lacks comes back onto the mesh the
 * restore names, put together from its pieces (Partial ones reduced, when
 * every Partial dim has the same reduction). */
static int check_rebuild(dist_client *c, const ckpt_entry *e, int missing,
                         const dist_checkpoint_opts *o) {
  if (!o || !o->mesh)
    return dist_client_fail(c, DIST_ENOTSUP, "'%s' was saved on rank %d, but the "
                            "cluster has %d daemons: restore it onto a mesh of this "
                            "cluster (--mesh and --placements)", e->t.name, missing,
                            c->n);
  dist_reduce op;
  if (dist_ckpt_partial_reduce(&e->t, &op) < 0)
    return dist_client_fail(c, DIST_ENOTSUP, "'%s' was saved Partial on mesh dims with "
                            "different reductions, over ranks the cluster lacks: reshard "
                            "it to Shard or Replicate before saving",
                            e->t.name);
  return 0;
}

/* Whether e goes onto a mesh of another shape, and can be put together in
 * the client on the way (its pieces are Shard, Replicate or Partial of one
 * reduction): it then comes from the files (CKPT_REBUILD) with its
 * optimizer state, instead of being loaded and moved through the client. */
static int onto_other_shape(const ckpt_entry *e, const dist_checkpoint_opts *o) {
  dist_reduce op;
  return o && o->mesh && !dist_mesh_same_shape(&o->mesh->d, &e->t.mesh.d) &&
         dist_ckpt_partial_reduce(&e->t, &op) >= 0;
}

/* Marks the tensors to restore and how (CKPT_LOAD or CKPT_REBUILD); fails for a name
 * the checkpoint lacks, a rank without a file, or a tensor that cannot be
 * rebuilt. */
static int select_tensors(dist_client *c, const ckpt_manifest *m,
                          const dist_checkpoint_opts *o, char *chosen) {
  for (int i = 0; i < m->ntensors; i++) chosen[i] = !o || !o->tensors ? CKPT_LOAD : CKPT_SKIP;
  for (int k = 0; o && o->tensors && k < o->ntensors; k++) {
    int found = 0;
    for (int i = 0; i < m->ntensors; i++)
      if (!strcmp(m->tensors[i].t.name, o->tensors[k])) chosen[i] = CKPT_LOAD, found = 1;
    if (!found)
      return dist_client_fail(c, DIST_ENOTFOUND, "the checkpoint has no tensor '%s'",
                              o->tensors[k]);
  }
  for (int i = 0; i < m->ntensors; i++) {
    const dist_mesh_desc *md = &m->tensors[i].t.mesh.d;
    for (int k = 0; chosen[i] && k < md->nranks; k++)
      if (md->ranks[k] >= m->nfiles)
        return dist_client_fail(c, DIST_EINVAL, "the manifest puts '%s' on rank %d "
                                "but lists %d files", m->tensors[i].t.name,
                                md->ranks[k], m->nfiles);
    int missing = chosen[i] ? dist_ckpt_missing_rank(c, &m->tensors[i]) : -1;
    if (missing >= 0 && check_rebuild(c, &m->tensors[i], missing, o) != 0)
      return c->err.code;
    if (missing >= 0 || (chosen[i] && onto_other_shape(&m->tensors[i], o)))
      chosen[i] = CKPT_REBUILD;
  }
  return 0;
}

/* The layout asked for must fit every tensor restored, checked before any
 * daemon loads: a restore that stopped at a tensor it does not fit would
 * leave those before it moved and the rest as saved. */
static int check_target(dist_client *c, const ckpt_manifest *m, const char *chosen,
                        const dist_checkpoint_opts *o) {
  if (!o || !o->placements) return 0;
  int targets[DIST_MAX_MESH_RANKS];
  if (o->mesh && dist_targets(c, &o->mesh->d, targets) < 0) {
    dist_errbuf why = c->err;
    return dist_client_fail(c, why.code, "restore onto the mesh asked: %s (nothing was "
                            "restored)", dist_errbuf_msg(&why));
  }
  for (int i = 0; i < m->ntensors; i++) {
    const dist_tensor *t = &m->tensors[i].t;
    const dist_mesh_desc *md = o->mesh ? &o->mesh->d : &t->mesh.d;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    /* Only md->ndim placements are used: extras would be dropped unseen. */
    if (chosen[i] && o->nplacements != md->ndim)
      return dist_client_fail(c, DIST_EINVAL, "restore of '%s' onto %d placement%s: %s "
                              "has %d dim%s (nothing was restored)", t->name,
                              o->nplacements, o->nplacements == 1 ? "" : "s",
                              o->mesh ? "the mesh asked" : "its saved mesh", md->ndim,
                              md->ndim == 1 ? "" : "s");
    if (chosen[i] && dist_placements_check(md, o->placements, md->ndim, t->shape.ndim, &eb))
      return dist_client_fail(c, eb.code, "restore of '%s' onto the placements asked: %s "
                              "(nothing was restored)", t->name, dist_errbuf_msg(&eb));
  }
  return 0;
}

/* Rank r's Load: the pieces of the chosen tensors its file holds, and the
 * chosen tensors it has no piece of, to drop (pieces of an older layout
 * there would otherwise outlive the restore). */
typedef struct rank_load {
  Dist__V1__CheckpointLoadRequest rq;
  dist_wire_meta *w;
  Dist__V1__TensorMeta **metas;
  char **drop;
} rank_load;

static int rank_load_build(rank_load *l, const char *dir, const ckpt_manifest *m,
                           const char *chosen, int r) {
  dist__v1__checkpoint_load_request__init(&l->rq);
  l->w = calloc((size_t)m->ntensors + 1, sizeof *l->w);
  l->metas = calloc((size_t)m->ntensors + 1, sizeof *l->metas);
  l->drop = calloc((size_t)m->ntensors + 1, sizeof *l->drop);
  if (!l->w || !l->metas || !l->drop) return DIST_ENOMEM;
  l->rq.dir = (char *)dir;
  l->rq.file = r < m->nfiles ? m->file[r] : "";
  l->rq.sha256 = r < m->nfiles ? m->sha[r] : "";
  l->rq.tensors = l->metas;
  l->rq.drop = l->drop;
  for (int i = 0; i < m->ntensors; i++) {
    const dist_tensor *t = &m->tensors[i].t;
    if (chosen[i] != CKPT_LOAD) continue;
    if (dist_mesh_index_of(&t->mesh.d, r) < 0) {
      l->drop[l->rq.n_drop++] = (char *)t->name;
      continue;
    }
    dist_wire_meta *w = &l->w[l->rq.n_tensors];
    dist_meta_to_pb(t->name, t->dtype, &t->shape, &t->mesh.d, t->placements, w);
    w->meta.version = m->tensors[i].version;
    l->metas[l->rq.n_tensors++] = &w->meta;
  }
  return 0;
}

static void rank_load_free(rank_load *l) {
  free(l->w);
  free(l->metas);
  free(l->drop);
}

/* One Load to every daemon with pieces to load or drop, all under one op
 * id: the daemons vote, and each applies its part only when every one of
 * them can (daemon/vote.h), so a load that fails anywhere, even after the
 * files were checked, changes no daemon. */
static int load_ranks(dist_client *c, const char *dir, const ckpt_manifest *m,
                      const char *chosen, const dist_checkpoint_opts *o, uint64_t *total) {
  rank_load *l = calloc((size_t)c->n + 1, sizeof *l);
  dist_call *calls = calloc((size_t)c->n + 1, sizeof *calls);
  uint32_t *ranks = calloc((size_t)c->n + 1, sizeof *ranks);
  int n = 0, rc = l && calls && ranks ? 0 : dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int r = 0; r < c->n && rc == 0; r++) {
    if (rank_load_build(&l[r], dir, m, chosen, r) != 0)
      rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    else if (l[r].rq.n_tensors + l[r].rq.n_drop > 0)
      calls[n].target = r, calls[n].request = &l[r].rq.base, ranks[n++] = (uint32_t)r;
  }
  uint64_t op_id = dist_next_op_id(c);
  for (int k = 0; k < n && rc == 0; k++) {
    l[calls[k].target].rq.op_id = op_id;
    l[calls[k].target].rq.n_ranks = (size_t)n;
    l[calls[k].target].rq.ranks = ranks;
  }
  if (rc == 0 && n > 0)
    rc = dist_call_many(c, "/dist.v1.Checkpoint/Load",
                        &dist__v1__checkpoint_load_reply__descriptor, calls, n);
  /* A load is voted: one daemon's success means every daemon loaded. */
  int loaded = n > 0 && dist_calls_any_applied(calls, n);
  for (int i = 0; i < m->ntensors && loaded; i++)
    if (chosen[i] == CKPT_LOAD)
      dist_later_forget_stored(c, m->tensors[i].t.name, &m->tensors[i].t.mesh.d);
  for (int k = 0; k < n && rc == 0; k++) {
    uint64_t b = ((Dist__V1__CheckpointLoadReply *)calls[k].reply)->bytes;
    *total += b;
    progress(o, "load", dist_daemon_rank(c, calls[k].target), k + 1, n, b);
  }
  if (calls) dist_calls_free(calls, n);
  for (int r = 0; l && r < c->n; r++) rank_load_free(&l[r]);
  free(ranks);
  free(calls);
  free(l);
  return rc;
}

/* Moves a restored tensor to the requested layout: in the daemons when the
 * meshes have the same shape, else through the client (full value, then
 * a replacing shard_tensor onto the new mesh, which leaves the loaded
 * tensor as it was when it fails). */
static int relayout(dist_client *c, const dist_tensor *saved_t,
                    const dist_checkpoint_opts *o) {
  const dist_mesh *mesh = o->mesh ? o->mesh : &saved_t->mesh;
  dist_tensor *t = NULL, *moved = NULL;
  void *full = NULL;
  size_t nbytes = 0;
  int rc = dist_tensor_open(c, saved_t->name, &t);
  if (rc != 0) return rc;
  if (dist_mesh_same_shape(&mesh->d, &saved_t->mesh.d)) {
    rc = dist_reshard(c, t, mesh, o->placements);
  } else {
    rc = dist_full_tensor(c, t, &full, &nbytes);
    if (rc == 0)
      rc = dist_shard_tensor_replacing(c, saved_t->name, full, t->dtype, t->shape.ndim,
                                       t->shape.dims, mesh, o->placements, &moved);
  }
  free(full);
  dist_tensor_free(moved);
  dist_tensor_free(t);
  return rc;
}

/* Whether a parameter's optimizer state is lost on the way to the
 * restore's layout: onto Shard / Replicate placements it follows, resharded
 * in the daemons (daemon/param_reshard.h) or put together with the values
 * in this client (CKPT_REBUILD); onto Partial ones it cannot. */
static int loses_state(const dist_tensor *saved_t, const dist_checkpoint_opts *o) {
  const dist_mesh_desc *m = o && o->mesh ? &o->mesh->d : &saved_t->mesh.d;
  return o && o->placements && dist_placements_partial_dim(o->placements, m->ndim) >= 0;
}

/* Stores the whole value of a CKPT_REBUILD tensor onto the restore's mesh, in
 * place of any tensor of that name, which stays as it was if that fails. */
static int store_rebuilt(dist_client *c, const dist_tensor *saved_t, const void *full,
                         const ckpt_state *state, const dist_checkpoint_opts *o) {
  dist_tensor *t = NULL;
  int rc = dist_shard_tensor_replacing(c, saved_t->name, full, saved_t->dtype,
                                       saved_t->shape.ndim, saved_t->shape.dims, o->mesh,
                                       o->placements, &t);
  dist_tensor_free(t);
  if (rc == 0 && state->found && !loses_state(saved_t, o)) {
    Dist__V1__ParamConfigureRequest cfg = state->cfg;
    cfg.optimizer = (Dist__V1__OptimizerConfig *)&state->optimizer;
    rc = dist_param_configure_restored(c, saved_t->name, &cfg,
                                       (const void *const *)state->whole, state->nstate,
                                       state->cfg.step);
  }
  return rc;
}

/* Counts tensor i into info, and moves it where the restore asks. */
static int finish_one(dist_client *c, const ckpt_manifest *m, int i, char how,
                      const void *full, const ckpt_state *state,
                      const dist_checkpoint_opts *o, dist_checkpoint_info *info) {
  const ckpt_entry *e = &m->tensors[i];
  info->ntensors++;
  if (loses_state(&e->t, o) || (how == CKPT_REBUILD && !state->found))
    info->params_reset += e->with_state;
  else
    info->nparams += e->with_state;
  if (how == CKPT_REBUILD) {
    progress(o, "rebuild", -1, info->ntensors, m->ntensors, 0);
    return store_rebuilt(c, &e->t, full, state, o);
  }
  if (!o || !o->placements) return 0;
  progress(o, "reshard", -1, info->ntensors, m->ntensors, 0);
  return relayout(c, &e->t, o);
}

int dist_checkpoint_restore(dist_client *c, const char *dir,
                            const dist_checkpoint_opts *opts,
                            dist_checkpoint_info *info) {
  if (!c) return dist_no_client(__func__);
  dist_checkpoint_info local;
  if (!info) info = &local;
  memset(info, 0, sizeof *info);
  if (check_dir(c, dir) != 0 || check_list(c, opts) != 0 || check_reach(c, "restore") != 0)
    return c->err.code;
  if (opts && opts->mesh && !opts->placements)
    return dist_client_fail(c, DIST_EINVAL, "restore onto a mesh needs placements");
  ckpt_manifest m;
  memset(&m, 0, sizeof m);
  char *chosen = NULL;
  void **full = NULL;
  size_t *full_bytes = NULL;
  ckpt_state *state = NULL;
  int rc = read_manifest(c, dir, &m);
  if (rc == 0) {
    chosen = calloc((size_t)m.ntensors + 1, 1);
    full = calloc((size_t)m.ntensors + 1, sizeof *full);
    full_bytes = calloc((size_t)m.ntensors + 1, sizeof *full_bytes);
    state = calloc((size_t)m.ntensors + 1, sizeof *state);
    if (!chosen || !full || !full_bytes || !state)
      rc = dist_client_fail(c, DIST_ENOMEM, "out of memory restoring %d tensors", m.ntensors);
    else
      rc = select_tensors(c, &m, opts, chosen);
  }
  /* Every file is checked before any store changes: the pieces of tensors
   * to rebuild are read whole first, then the daemons check their own
   * files and load them, all or none. */
  if (rc == 0) rc = check_target(c, &m, chosen, opts);
  if (rc == 0) rc = dist_ckpt_read_whole(c, dir, &m, chosen, opts, full, full_bytes, state);
  if (rc == 0) rc = load_ranks(c, dir, &m, chosen, opts, &info->bytes);
  for (int i = 0; rc == 0 && i < m.ntensors; i++) {
    if (chosen[i]) rc = finish_one(c, &m, i, chosen[i], full[i], &state[i], opts, info);
    if (chosen[i] == CKPT_REBUILD) info->bytes += full_bytes[i];
    if (rc != 0) /* past the loads: say what the store now holds */
      dist_errbuf_prefix(&c->err, "the daemons loaded the checkpoint's files, then '%s' "
                         "could not be %s: the tensors before it are as asked, the rest "
                         "as loaded (saved layout) or, those to rebuild from the files, "
                         "as before the restore; restore again: ", m.tensors[i].t.name,
                         chosen[i] == CKPT_REBUILD ? "rebuilt" : "moved to the layout asked");
  }
  info->nfiles = m.nfiles;
  snprintf(info->id, sizeof info->id, "%s", m.id);
  for (int i = 0; full && i < m.ntensors; i++) free(full[i]);
  for (int i = 0; state && i < m.ntensors; i++) dist_ckpt_state_free(&state[i]);
  free(state);
  free(full);
  free(full_bytes);
  free(chosen);
  manifest_free(&m);
  return rc;
}
