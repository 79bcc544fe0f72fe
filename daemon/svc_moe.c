/* dist.v1.Moe: GlobalScatter / GlobalGather. The handler checks the
 * request, finds the input rows (request bytes or a held tensor), makes room
 * for the result (a reply buffer or a new daemon-local tensor) and runs the
 * exchange with the group's daemons (moe_scatter.c). */
#include <stdlib.h>
#include <string.h>

#include "methods.h"
#include "moe.pb-c.h"
#include "moe_scatter.h"
#include "op_refuse.h"
#include "op_signature.h"
#include "pbuf.h"
#include "store.h"
#include "tensor_meta.h"

typedef Dist__V1__GlobalExchangeRequest xreq;

/* The input rows of this rank. */
typedef struct input {
  const void *data;
  size_t nbytes;
  dist_dtype dtype;
  uint64_t width;     /* elements per row */
  distd_tensor *held; /* referenced while the exchange reads it */
} input;

static int parse_group(distd_server *s, const xreq *rq, int *group, int *size,
                       int *me, dist_errbuf *eb) {
  int n = rq->n_group ? (int)rq->n_group : s->world_size;
  if (rq->n_group > (size_t)s->world_size)
    return dist_fail(eb, DIST_EINVAL, "group of %zu ranks in a world of %d",
                     rq->n_group, s->world_size);
  *me = -1;
  for (int i = 0; i < n; i++) {
    group[i] = rq->n_group ? (int)rq->group[i] : i;
    if (rq->n_group && rq->group[i] >= (uint32_t)s->world_size)
      return dist_fail(eb, DIST_EINVAL, "group names rank %u, outside the world "
                       "of %d", rq->group[i], s->world_size);
    for (int k = 0; k < i; k++)
      if (group[k] == group[i])
        return dist_fail(eb, DIST_EINVAL, "group names rank %d twice", group[i]);
    if (group[i] == s->rank) *me = i;
  }
  if (*me < 0)
    return dist_fail(eb, DIST_EINVAL, "rank %d is not in the group", s->rank);
  *size = n;
  return 0;
}

static uint64_t row_width_of(const distd_tensor *t) {
  uint64_t w = 1;
  for (int d = 1; d < t->local.ndim; d++) w *= (uint64_t)t->local.dims[d];
  return w;
}

static int get_input(distd_server *s, const xreq *rq, input *in,
                     dist_errbuf *eb) {
  memset(in, 0, sizeof *in);
  if (!rq->x_name || !rq->x_name[0]) {
    if (dist_dtype_from_pb((int)rq->dtype, &in->dtype, eb) != 0) return eb->code;
    in->data = rq->x.data, in->nbytes = rq->x.len, in->width = rq->row_width;
  } else {
    int rc = distd_store_get(s->store, rq->x_name, &in->held, eb);
    if (rc != 0) return rc;
    in->data = in->held->data, in->nbytes = in->held->nbytes;
    in->dtype = in->held->dtype;
    in->width = rq->row_width ? rq->row_width : row_width_of(in->held);
    if (rq->dtype && (int)rq->dtype != (int)in->dtype)
      return dist_fail(eb, DIST_EMISMATCH, "tensor '%s' is %s, the request says %s",
                       rq->x_name, dist_dtype_name(in->dtype),
                       dist_dtype_name((dist_dtype)rq->dtype));
  }
  size_t row_bytes = (size_t)in->width * dist_dtype_size(in->dtype);
  if (in->width == 0 || row_bytes / dist_dtype_size(in->dtype) != in->width)
    return dist_fail(eb, DIST_EINVAL, "row_width (d_model) must be positive");
  if (in->nbytes % row_bytes)
    return dist_fail(eb, DIST_EINVAL, "x has %zu bytes, not whole rows of %llu %s "
                     "elements", in->nbytes, (unsigned long long)in->width,
                     dist_dtype_name(in->dtype));
  return 0;
}

/* A result kept in the daemon is local to it: a one-rank mesh, replicated. */
static int new_output_tensor(distd_server *s, const xreq *rq, const input *in,
                             uint64_t rows, distd_tensor **out,
                             dist_errbuf *eb) {
  dist_mesh_desc mesh;
  int rc = dist_mesh_of_rank(&mesh, s->rank, eb);
  if (rc != 0) return rc;
  dist_shape global = {2, {(int64_t)rows, (int64_t)in->width}};
  dist_placement p = DIST_REPLICATED;
  return distd_tensor_new(s->store, rq->out_name, in->dtype, &global, &mesh,
                          &p, s->rank, out, eb);
}

static void send_reply(distd_server *s, const distd_tensor *t, const void *data,
                       uint64_t rows, const input *in, grpc_byte_buffer **reply) {
  Dist__V1__GlobalExchangeReply rp = DIST__V1__GLOBAL_EXCHANGE_REPLY__INIT;
  dist_wire_meta w; /* on the stack: the reply of a stored result cannot fail */
  rp.rows = rows;
  rp.row_width = in->width;
  if (t) {
    distd_meta_describe(t, s->rank, &w);
    rp.meta = &w.meta;
  } else {
    rp.data.data = (uint8_t *)data;
    rp.data.len = (size_t)rows * in->width * dist_dtype_size(in->dtype);
  }
  *reply = dist_pb_to_bb(&rp.base);
}

static int exchange(distd_server *s, const distd_call_info *ci, const xreq *rq,
                    distd_moe_dir dir, grpc_byte_buffer **reply,
                    dist_errbuf *eb) {
  int group[DIST_MAX_MESH_RANKS], size = 0, me = -1, experts = 0, rc;
  input in = {0};
  distd_tensor *t = NULL;
  void *out = NULL;
  uint64_t out_rows = 0;
  if (parse_group(s, rq, group, &size, &me, eb) != 0)
    return distd_refuse_group(s, rq->op_id, rq->group, rq->n_group, eb);
  size_t row_bytes = 0, out_bytes = 0;
  if ((rc = get_input(s, rq, &in, eb)) != 0) goto fail;
  row_bytes = (size_t)in.width * dist_dtype_size(in.dtype);
  rc = distd_moe_check_counts(dir, size, rq->local_count, rq->n_local_count,
                              rq->global_count, rq->n_global_count,
                              in.nbytes / row_bytes, &experts, &out_rows, eb);
  if (rc != 0) goto fail;
  if (__builtin_mul_overflow((size_t)out_rows, row_bytes, &out_bytes)) {
    rc = dist_fail(eb, DIST_ETOOBIG, "result of %llu rows is too large",
                   (unsigned long long)out_rows);
    goto fail;
  }
  if (rq->out_name && rq->out_name[0] && !rq->replace &&
      distd_store_get(s->store, rq->out_name, &t, NULL) == 0) {
    distd_tensor_unref(t);
    t = NULL;
    rc = dist_fail(eb, DIST_EEXIST, "tensor '%s' already exists", rq->out_name);
    goto fail;
  }
  if (rq->out_name && rq->out_name[0]) {
    if ((rc = new_output_tensor(s, rq, &in, out_rows, &t, eb)) != 0) goto fail;
    out = t->data;
  } else if (!(out = malloc(out_bytes ? out_bytes : 1))) {
    rc = dist_fail(eb, DIST_ENOMEM, "cannot allocate %zu bytes for the result", out_bytes);
    goto fail;
  }
  distd_moe_args a = {s->peers, rq->op_id, dir, group, size, me, experts,
                      rq->local_count, rq->global_count, row_bytes,
                      ci->deadline_ms, rq->gradient,
                      distd_op_signature(dir == DISTD_MOE_SCATTER ? DISTD_SIG_GLOBAL_SCATTER
                                         : DISTD_SIG_GLOBAL_GATHER, in.dtype, -1, -1)};
  if ((rc = distd_moe_exchange(&a, in.data, out, eb)) != 0) goto out;
  if (t && (rc = distd_store_put(s->store, t, rq->replace, eb)) != 0) goto out;
  send_reply(s, t, out, out_rows, &in, reply);
  goto out;
fail:
  distd_refuse_op(s, rq->op_id, 0, group, size, "its daemon", dist_errbuf_msg(eb));
out:
  if (!t) free(out);
  distd_tensor_unref(t);
  distd_tensor_unref(in.held);
  return rc;
}

DISTD_HANDLER(global_scatter) {
  return exchange(s, ci, (const xreq *)req, DISTD_MOE_SCATTER, reply, eb);
}

DISTD_HANDLER(global_gather) {
  return exchange(s, ci, (const xreq *)req, DISTD_MOE_GATHER, reply, eb);
}
