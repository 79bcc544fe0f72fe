/* Raw collectives for SPMD trainers: each trainer asks its own daemon,
 * which runs the collective with its peers. A client of one endpoint runs
 * them too, as the trainer of its daemon's rank, over groups of the ranks
 * it reaches: that daemon's alone. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* The rank of the daemon the client asks: an SPMD trainer's own, or the
 * one daemon of a client of one endpoint; -1 (c->err says why) for a
 * client of a cluster file, which speaks for no rank. */
static int own_daemon(dist_client *c, const char *what) {
  if (c->spmd_rank >= 0) return c->spmd_rank;
  if (c->one_endpoint) return dist_reached_rank(c, 0);
  return dist_client_fail(c, DIST_EINVAL, "%s needs an SPMD client "
                          "(dist_init_from_env)", what);
}

/* A group given must have 1 to DIST_MAX_MESH_RANKS members (NULL: every
 * rank, group_size ignored). A client of one endpoint speaks for every
 * member, so it must reach each; an SPMD trainer's daemon judges the
 * group. */
static int check_group(dist_client *c, const char *func, const int *group, int group_size) {
  if (group && (group_size < 1 || group_size > DIST_MAX_MESH_RANKS))
    return dist_client_fail(c, DIST_EINVAL, "%s: group_size %d (1 to %d allowed)", func,
                            group_size, DIST_MAX_MESH_RANKS);
  for (int i = 0; c->spmd_rank < 0 && group && i < group_size; i++)
    if (!dist_client_reaches(c, group[i]))
      return dist_refuse_unreached(c, "group", group[i], "%s: group names rank %d, but the "
                                   "cluster has %d daemon%s", func, group[i], c->n,
                                   c->n == 1 ? "" : "s");
  return 0;
}

/* The group rq names, into g: the one given; for a client of one
 * endpoint given NULL, every rank it reaches (its daemon's), as an MoE
 * exchange takes it, since its daemon's "every rank" would wait for the
 * other ranks' trainers; for an SPMD trainer given NULL, none, which its
 * daemon reads as every rank of the cluster. How many. */
static int group_sent(dist_client *c, const int *group, int group_size, uint32_t *g) {
  if (!group && c->spmd_rank < 0) {
    g[0] = (uint32_t)own_daemon(c, "collective");
    return 1;
  }
  for (int i = 0; group && i < group_size; i++) g[i] = (uint32_t)group[i];
  return group ? group_size : 0;
}

/* A buffer of count elements the call reads or writes: NULL only when
 * empty. */
static int check_buffer(dist_client *c, const char *func, const char *arg, const void *buf,
                        size_t count) {
  return buf || count == 0 ? 0 : dist_client_null_arg(c, func, arg);
}

/* Runs rq over group. Its op id was taken before the caller's argument
 * checks, by every trainer (a member of the group or not), so that the
 * trainers' op ids stay in step; refused (the checks failed, c->err says
 * why), the refusal is told to the group, whose trainers fail at once. A
 * trainer outside the group returns at once with its buffers as they
 * were, as Paddle's collectives do for a rank that is not a member. */
static int collective(dist_client *c, const char *func, Dist__V1__CollectiveRequest *rq,
                      int refused, const int *group, int group_size, void *out,
                      size_t out_len) {
  if (refused) return dist_spmd_refused_group(c, rq->op_id, group, group_size);
  int outside = dist_spmd_outside_group(c, func, group, group_size);
  if (outside != 0) return outside < 0 ? outside : 0;
  uint32_t g[DIST_MAX_MESH_RANKS]; /* check_group bounds group_size */
  rq->n_group = (size_t)group_sent(c, group, group_size, g);
  rq->group = g;
  ProtobufCMessage *rp = NULL;
  int rc = dist_call_one(c, own_daemon(c, func), "/dist.v1.Dist/Collective", &rq->base,
                         &dist__v1__collective_reply__descriptor, &rp);
  if (rc == 0 && out) {
    const Dist__V1__CollectiveReply *r = (const void *)rp;
    if (r->data.len != out_len)
      rc = dist_client_fail(c, DIST_EPROTO, "collective returned %zu bytes, "
                            "expected %zu", r->data.len, out_len);
    else if (out_len) /* an empty reply's data is NULL */
      memcpy(out, r->data.data, out_len);
  }
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}

int dist_all_reduce(dist_client *c, void *buf, size_t count, dist_dtype dt,
                    dist_reduce op, const int *group, int group_size) {
  if (!c) return dist_no_client(__func__);
  if (own_daemon(c, "all_reduce") < 0) return c->err.code;
  Dist__V1__CollectiveRequest rq = DIST__V1__COLLECTIVE_REQUEST__INIT;
  rq.op_id = dist_next_op_id(c);
  int refused = check_buffer(c, __func__, "buf", buf, count) ||
                check_group(c, __func__, group, group_size);
  rq.kind = DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_REDUCE;
  rq.dtype = (Dist__V1__DType)dt;
  rq.reduce = (Dist__V1__ReduceOp)op;
  rq.data.data = buf;
  rq.data.len = count * dist_dtype_size(dt);
  return collective(c, __func__, &rq, refused, group, group_size, buf, rq.data.len);
}

int dist_all_gather(dist_client *c, const void *in, size_t count, void *out,
                    dist_dtype dt, const int *group, int group_size) {
  if (!c) return dist_no_client(__func__);
  if (own_daemon(c, "all_gather") < 0) return c->err.code;
  Dist__V1__CollectiveRequest rq = DIST__V1__COLLECTIVE_REQUEST__INIT;
  rq.op_id = dist_next_op_id(c);
  int refused = check_buffer(c, __func__, "in", in, count) ||
                check_buffer(c, __func__, "out", out, count) ||
                check_group(c, __func__, group, group_size);
  rq.kind = DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_GATHER;
  rq.dtype = (Dist__V1__DType)dt;
  rq.data.data = (uint8_t *)in;
  rq.data.len = count * dist_dtype_size(dt);
  int members = refused ? 0 : group ? group_size : c->n;
  return collective(c, __func__, &rq, refused, group, group_size, out, rq.data.len * (size_t)members);
}

int dist_broadcast(dist_client *c, void *buf, size_t count, dist_dtype dt,
                   int root, const int *group, int group_size) {
  if (!c) return dist_no_client(__func__);
  if (own_daemon(c, "broadcast") < 0) return c->err.code;
  Dist__V1__CollectiveRequest rq = DIST__V1__COLLECTIVE_REQUEST__INIT;
  rq.op_id = dist_next_op_id(c);
  int refused = check_buffer(c, __func__, "buf", buf, count) ||
                check_group(c, __func__, group, group_size);
  rq.kind = DIST__V1__COLLECTIVE_REQUEST__KIND__BROADCAST;
  rq.dtype = (Dist__V1__DType)dt;
  rq.root = (uint32_t)root;
  rq.data.data = buf;
  rq.data.len = count * dist_dtype_size(dt);
  return collective(c, __func__, &rq, refused, group, group_size, buf, rq.data.len);
}

int dist_barrier(dist_client *c) {
  if (!c) return dist_no_client(__func__);
  if (own_daemon(c, "barrier") < 0) return c->err.code;
  Dist__V1__CollectiveRequest rq = DIST__V1__COLLECTIVE_REQUEST__INIT;
  rq.kind = DIST__V1__COLLECTIVE_REQUEST__KIND__BARRIER;
  rq.op_id = dist_next_op_id(c);
  return collective(c, __func__, &rq, 0, NULL, 0, NULL, 0);
}
