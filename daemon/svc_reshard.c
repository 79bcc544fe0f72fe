/* Reshard: every rank of the source and destination meshes is asked with
 * the same op id; the result replaces the tensor or becomes dst_name. A
 * parameter resharded in place takes its optimizer state along when it can,
 * onto another mesh too (param_reshard.h). */
#include <stdlib.h>
#include <string.h>

#include "holds.h"
#include "methods.h"
#include "op_refuse.h"
#include "param_reshard.h"
#include "pbuf.h"
#include "reshard.h"
#include "tensor_meta.h"
#include "vote.h"

static int parse_target(distd_server *s, const Dist__V1__ReshardRequest *rq,
                        const distd_tensor *t, dist_mesh_desc *dst_mesh,
                        dist_mesh_desc *src_mesh, dist_placement *dst_p,
                        dist_errbuf *eb) {
  /* The request's source mesh is the plan's (check_source compares). */
  if (rq->src_mesh && dist_mesh_from_pb(rq->src_mesh, src_mesh, eb) != 0)
    return eb->code;
  if (t && !rq->src_mesh) *src_mesh = t->mesh;
  if (!t && !rq->src_mesh)
    return dist_fail(eb, DIST_ENOTFOUND, "tensor '%s' not found", rq->name);
  if (rq->mesh) {
    if (dist_mesh_from_pb(rq->mesh, dst_mesh, eb) != 0) return eb->code;
    if (distd_mesh_check_world(s, dst_mesh, eb) != 0) return eb->code;
  } else {
    *dst_mesh = *src_mesh;
  }
  if (rq->n_placements != (size_t)dst_mesh->ndim)
    return dist_fail(eb, DIST_EINVAL, "placements: %zu given, the mesh has %d dims",
                     rq->n_placements, dst_mesh->ndim);
  return dist_placements_from_pb(rq->placements, rq->n_placements, dst_p, eb);
}

/* A reshard as this rank runs it. */
typedef struct job {
  const Dist__V1__ReshardRequest *rq;
  const char *dst_name;
  int in_place;
  int held;     /* this request holds the name (holds.h) */
  int is_param;
  dist_mesh_desc src_mesh, dst_mesh;
  dist_placement dst_p[DIST_MAX_MESH_DIMS];
  distd_tensor *src;
  distd_tensor *out;        /* NULL on a rank that holds no piece afterwards */
  distd_vote_versions versions; /* of the source, on every rank (vote.h) */
  distd_param_entry *param; /* the parameter to install with out */
} job;

/* The reshard must start from the layout the client asked about: a tensor
 * resharded or put since (a stale handle) would make the ranks run
 * different plans. */
static int check_source(const job *j, int rank, dist_errbuf *eb) {
  if (!j->src && dist_mesh_index_of(&j->src_mesh, rank) >= 0) /* deleted here meanwhile? */
    return dist_fail(eb, DIST_ENOTFOUND, "tensor '%s' not found on rank %d, which its mesh "
                     "names", j->rq->name, rank);
  if (!j->src || !j->rq->src_mesh || dist_mesh_equal(&j->src->mesh, &j->src_mesh)) return 0;
  char here[128], asked[128];
  dist_mesh_format(&j->src->mesh, here, sizeof here);
  dist_mesh_format(&j->src_mesh, asked, sizeof asked);
  return dist_fail(eb, DIST_EUNAVAIL, "'%s' is on mesh %s here, the request says %s "
                   "(resharded meanwhile?): open it again", j->rq->name, here, asked);
}

/* Everything applying needs, with nothing applied: j->out and j->param. */
static int prepare(distd_server *s, const distd_call_info *ci, job *j, dist_errbuf *eb) {
  const Dist__V1__ReshardRequest *rq = j->rq;
  int rc = check_source(j, s->rank, eb);
  if (rc == 0 && !j->in_place) {
    distd_tensor *exists = NULL;
    if (distd_store_get(s->store, rq->dst_name, &exists, NULL) == 0) {
      distd_tensor_unref(exists);
      rc = dist_fail(eb, DIST_EEXIST, "tensor '%s' already exists", rq->dst_name);
    }
  }
  distd_param_move move;
  memset(&move, 0, sizeof move);
  if (rc == 0 && j->in_place)
    rc = distd_param_move_begin(s, rq->name, j->is_param, &j->src_mesh, &j->dst_mesh, j->dst_p,
                                rq->op_id, ci->deadline_ms, &move, eb);
  if (rc == 0)
    rc = distd_reshard(s, j->src, &j->src_mesh, &j->dst_mesh, j->dst_p, j->dst_name,
                       rq->op_id, ci->deadline_ms, &j->out, eb);
  if (rc == 0 && j->in_place)
    rc = distd_param_move_finish(s, &move, rq->name, j->out, &j->src_mesh, &j->dst_mesh,
                                 rq->op_id, ci->deadline_ms, &j->param, eb);
  distd_param_move_free(&move);
  return rc;
}

/* Cannot fail: the tensor and the parameter entry are made. */
static void apply(distd_server *s, job *j) {
  if (j->out) { /* in place: past every rank's; into another name: a new tensor */
    j->out->version = j->in_place ? j->versions.highest + 1 : 1;
    distd_store_put_versioned(s->store, j->out);
  } else if (!j->rq->dst_name[0]) { /* moved off this rank */
    distd_store_delete(s->store, j->rq->name, NULL);
  }
  if (!j->in_place) return;
  if (j->param) distd_param_install(s->params, j->param);
  else distd_param_forget(s->params, j->rq->name);
  j->param = NULL;
}

/* The ranks holding the source must hold one version of it, or they would
 * have resharded pieces of two states: a restore (or another change that
 * does not wait for the reshard) reached some of them before it and others
 * after. Every rank sees the same versions, so all refuse together. */
static int check_versions(const job *j, dist_errbuf *eb) {
  if (j->versions.lowest == j->versions.highest) return 0;
  return dist_fail(eb, DIST_EUNAVAIL, "'%s' changed on some daemons while it was resharded "
                   "(version %llu on one, %llu on another): reshard it again (nothing was "
                   "changed)", j->rq->name, (unsigned long long)j->versions.lowest,
                   (unsigned long long)j->versions.highest);
}

/* Every rank of the reshard applies it or none does (vote.h). A rank that
 * could not prepare its part first tells the others, which may be waiting
 * for it in an exchange. */
static int decide(distd_server *s, const distd_call_info *ci, job *j, int verdict,
                  dist_errbuf *eb) {
  int ranks[2 * DIST_MAX_MESH_RANKS]; /* both meshes: no allocation, so always told */
  int n = distd_reshard_ranks(&j->src_mesh, &j->dst_mesh, ranks), ndim = j->src_mesh.ndim;
  uint64_t op = j->rq->op_id;
  if (verdict && n > 1) {
    distd_reshard_abort(s, op, ndim, ranks, n, dist_errbuf_msg(eb));
    if (j->in_place) distd_param_move_abort(s, op, ndim, ranks, n, dist_errbuf_msg(eb));
  }
  j->versions.mine = j->versions.highest = j->versions.lowest = j->src ? j->src->version : 0;
  int rc = n > 1 ? distd_vote(s, ranks, n, op, ci->deadline_ms, "reshard", verdict, &j->versions,
                              eb)
                 : verdict;
  return rc ? rc : check_versions(j, eb);
}

static void reply_with(distd_server *s, const distd_tensor *out, grpc_byte_buffer **reply) {
  dist_wire_meta wm = {0}, *w = &wm; /* on the stack: a reply cannot fail */
  Dist__V1__ReshardReply rp = DIST__V1__RESHARD_REPLY__INIT;
  if (out) {
    distd_meta_describe(out, s->rank, w);
    rp.meta = &w->meta;
  }
  *reply = dist_pb_to_bb(&rp.base);
}

/* A reshard whose request this daemon cannot parse: a single client sends
 * every daemon the same, and they all fail alike, but an SPMD trainer
 * sends its own, and the other daemons of the meshes it names would wait
 * for this rank's part until their deadline. */
static void reshard_refused(distd_server *s, const job *j, const dist_errbuf *eb) {
  int ranks[2 * DIST_MAX_MESH_RANKS], n = 0;
  dist_mesh_desc m;
  if (j->src) n = dist_ranks_union_add(ranks, n, 2 * DIST_MAX_MESH_RANKS, &j->src->mesh);
  if (dist_mesh_from_pb(j->rq->src_mesh, &m, NULL) == 0)
    n = dist_ranks_union_add(ranks, n, 2 * DIST_MAX_MESH_RANKS, &m);
  if (dist_mesh_from_pb(j->rq->mesh, &m, NULL) == 0)
    n = dist_ranks_union_add(ranks, n, 2 * DIST_MAX_MESH_RANKS, &m);
  int member = 0; /* the others wait for none outside both meshes */
  for (int i = 0; i < n; i++) member |= ranks[i] == s->rank;
  if (j->rq->op_id && member && n > 1)
    distd_refuse_op(s, j->rq->op_id, 0, ranks, n, "its daemon", dist_errbuf_msg(eb));
}

DISTD_HANDLER(reshard) {
  const Dist__V1__ReshardRequest *rq = (const void *)req;
  job j = {.rq = rq, .dst_name = rq->dst_name[0] ? rq->dst_name : rq->name};
  j.in_place = strcmp(j.dst_name, rq->name) == 0;
  /* Held before its values are read: a push applied after that would be
   * lost under the resharded values. */
  distd_hold_kind kind = j.in_place ? DISTD_HOLD_RESHARD : DISTD_HOLD_READ;
  int rc = distd_holds_take(s->holds, rq->name, kind, ci->deadline_ms, eb);
  j.held = rc == 0;
  if (rc == 0 && j.in_place &&
      (rc = distd_param_pause_pushes(s->params, rq->name, ci->deadline_ms, &j.is_param,
                                     eb)) != 0) {
    distd_holds_release(s->holds, rq->name, kind);
    j.held = 0;
  }
  if (rc == 0) distd_store_get(s->store, rq->name, &j.src, NULL);
  /* A single client's request fails alike on every rank, so no vote is
   * owed; the others are told (an SPMD trainer's may differ). */
  dist_errbuf parse_eb = DIST_ERRBUF_INIT;
  int prc = parse_target(s, rq, j.src, &j.dst_mesh, &j.src_mesh, j.dst_p, &parse_eb);
  if (prc != 0 && rc == 0) *eb = parse_eb;
  if (prc != 0) reshard_refused(s, &j, &parse_eb);
  if (prc == 0) {
    if (rc == 0) rc = prepare(s, ci, &j, eb);
    rc = decide(s, ci, &j, rc, eb);
  }
  rc = rc ? rc : prc;
  if (rc == 0) apply(s, &j);
  distd_param_entry_free(j.param);
  if (j.held && j.in_place) distd_param_resume_pushes(s->params, rq->name);
  if (j.held) distd_holds_release(s->holds, rq->name, kind);
  if (rc == 0) reply_with(s, j.out, reply);
  distd_tensor_unref(j.out);
  distd_tensor_unref(j.src);
  return rc;
}
