/* Collective: a raw collective over data the trainer sends, for SPMD
 * programs (dist.all_reduce, dist.all_gather ...). */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "methods.h"
#include "pbuf.h"
#include "wire.h"

typedef Dist__V1__CollectiveRequest creq;

static int element_count(const creq *rq, size_t elem, size_t *n,
                         dist_errbuf *eb) {
  if (rq->data.len % elem)
    return dist_fail(eb, DIST_EINVAL, "%zu data bytes is not a whole number of "
                     "%zu-byte elements", rq->data.len, elem);
  *n = rq->data.len / elem;
  return 0;
}

static int counts_for(const creq *rq, const uint64_t *given, size_t ngiven,
                      int size, size_t *counts, const char *what,
                      dist_errbuf *eb) {
  if (ngiven != (size_t)size)
    return dist_fail(eb, DIST_EINVAL, "%s: %zu counts for a group of %d",
                     what, ngiven, size);
  (void)rq;
  for (int i = 0; i < size; i++) counts[i] = (size_t)given[i];
  return 0;
}

static size_t sum(const size_t *v, int n) {
  size_t t = 0;
  for (int i = 0; i < n; i++) t += v[i];
  return t;
}

/* Runs the collective; *out/out_len is the result (malloc'd). */
static int run(const distd_coll *c, const creq *rq, dist_dtype dt,
               void **out, size_t *out_len, dist_errbuf *eb) {
  size_t elem = dist_dtype_size(dt), n = 0;
  if (element_count(rq, elem, &n, eb) != 0) return eb->code;
  size_t *a = calloc((size_t)c->size, sizeof *a), *b = calloc((size_t)c->size, sizeof *b);
  int rc = 0;
  switch (rq->kind) {
    case DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_REDUCE:
      *out = malloc(n * elem + 1), *out_len = n * elem;
      memcpy(*out, rq->data.data, n * elem);
      rc = distd_allreduce(c, *out, n, dt, (dist_reduce)rq->reduce, eb);
      break;
    case DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_GATHER:
      /* Pieces may differ in size: learn every member's count first. */
      for (int i = 0; i < c->size; i++) a[i] = 1;
      { uint64_t mine = n; uint64_t *all = calloc((size_t)c->size, 8);
        rc = distd_allgather(c, &mine, all, a, DIST_INT64, eb);
        for (int i = 0; i < c->size; i++) b[i] = (size_t)all[i];
        free(all); }
      if (rc) break;
      *out_len = sum(b, c->size) * elem, *out = malloc(*out_len + 1);
      { distd_coll c2 = *c; c2.op_id = c->op_id ^ 0x5a5a5a5a5a5a5a5aull;
        rc = distd_allgather(&c2, rq->data.data, *out, b, dt, eb); }
      break;
    case DIST__V1__COLLECTIVE_REQUEST__KIND__REDUCE_SCATTER:
      if ((rc = counts_for(rq, rq->send_counts, rq->n_send_counts, c->size, a, "reduce_scatter", eb))) break;
      if (sum(a, c->size) != n) { rc = dist_fail(eb, DIST_EINVAL, "reduce_scatter: counts sum to %zu, data has %zu elements", sum(a, c->size), n); break; }
      *out_len = a[c->me] * elem, *out = malloc(*out_len + 1);
      rc = distd_reduce_scatter(c, rq->data.data, *out, a, dt, (dist_reduce)rq->reduce, eb);
      break;
    case DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_TO_ALL:
      if ((rc = counts_for(rq, rq->send_counts, rq->n_send_counts, c->size, a, "all_to_all send", eb)) ||
          (rc = counts_for(rq, rq->recv_counts, rq->n_recv_counts, c->size, b, "all_to_all recv", eb))) break;
      if (sum(a, c->size) != n) { rc = dist_fail(eb, DIST_EINVAL, "all_to_all: send counts sum to %zu, data has %zu elements", sum(a, c->size), n); break; }
      *out_len = sum(b, c->size) * elem, *out = malloc(*out_len + 1);
      rc = distd_alltoallv(c, rq->data.data, a, *out, b, dt, eb);
      break;
    case DIST__V1__COLLECTIVE_REQUEST__KIND__BROADCAST: {
      int root = -1;
      for (int i = 0; i < c->size; i++) if (c->group[i] == (int)rq->root) root = i;
      if (root < 0) { rc = dist_fail(eb, DIST_EINVAL, "broadcast root %u is not in the group", rq->root); break; }
      *out_len = n * elem, *out = malloc(*out_len + 1);
      memcpy(*out, rq->data.data, *out_len);
      rc = distd_broadcast(c, *out, n, dt, root, eb);
      break; }
    case DIST__V1__COLLECTIVE_REQUEST__KIND__BARRIER:
      rc = distd_barrier(c, eb);
      break;
    default:
      rc = dist_fail(eb, DIST_EINVAL, "unknown collective kind %d", (int)rq->kind);
  }
  free(a);
  free(b);
  return rc;
}

static int point_to_point(distd_server *s, const distd_call_info *ci,
                          const creq *rq, dist_dtype dt, void **out,
                          size_t *out_len, dist_errbuf *eb) {
  if (rq->root >= (uint32_t)s->world_size || (int)rq->root == s->rank)
    return dist_fail(eb, DIST_EINVAL, "%s: peer rank %u is not another daemon "
                     "of this cluster", rq->kind == DIST__V1__COLLECTIVE_REQUEST__KIND__SEND
                     ? "send" : "recv", rq->root);
  if (rq->kind == DIST__V1__COLLECTIVE_REQUEST__KIND__SEND)
    return distd_send_to(s->peers, rq->op_id, (int)rq->root, rq->data.data,
                         rq->data.len, ci->deadline_ms, eb);
  *out_len = rq->count * dist_dtype_size(dt);
  *out = malloc(*out_len + 1);
  return distd_recv_from(s->peers, rq->op_id, (int)rq->root, *out, *out_len,
                         ci->deadline_ms, eb);
}

DISTD_HANDLER(collective) {
  const creq *rq = (const void *)req;
  dist_dtype dt = DIST_FLOAT32;
  if (rq->kind != DIST__V1__COLLECTIVE_REQUEST__KIND__BARRIER &&
      dist_dtype_from_pb((int)rq->dtype, &dt, eb) != 0)
    return eb->code;
  void *out = NULL;
  size_t out_len = 0;
  int rc;
  if (rq->kind == DIST__V1__COLLECTIVE_REQUEST__KIND__SEND ||
      rq->kind == DIST__V1__COLLECTIVE_REQUEST__KIND__RECV) {
    rc = point_to_point(s, ci, rq, dt, &out, &out_len, eb);
  } else {
    int world[DIST_MAX_MESH_RANKS], n = (int)rq->n_group;
    const int *group = world;
    if (n > DIST_MAX_MESH_RANKS) return dist_fail(eb, DIST_EINVAL, "group too large");
    for (int i = 0; i < (n ? n : s->world_size); i++)
      world[i] = n ? (int)rq->group[i] : i;
    if (!n) n = s->world_size;
    distd_coll c;
    rc = distd_coll_init(&c, s->peers, rq->op_id, group, n, ci->deadline_ms, eb);
    if (rc == 0) rc = run(&c, rq, dt, &out, &out_len, eb);
  }
  if (rc == 0) {
    Dist__V1__CollectiveReply rp = DIST__V1__COLLECTIVE_REPLY__INIT;
    rp.data.data = out;
    rp.data.len = out_len;
    *reply = dist_pb_to_bb(&rp.base);
  }
  free(out);
  return rc;
}
