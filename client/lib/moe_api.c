/* MoE exchanges: global_scatter / global_gather and the count exchange.
 * The client only hands each daemon its rank's rows and counts; the rows
 * travel between the daemons. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "moe.pb-c.h"

typedef enum { SCATTER, GATHER } direction;

/* The group as global ranks (every rank the client reaches when group is
 * NULL). */
static int resolve_group(dist_client *c, const int *group, int group_size,
                         uint32_t *ranks, int *size) {
  int n = group ? group_size : c->n;
  if (n < 1 || n > DIST_MAX_MESH_RANKS)
    return dist_client_fail(c, DIST_EINVAL, "group of %d ranks", n);
  for (int i = 0; i < n; i++) {
    int r = group ? group[i] : dist_reached_rank(c, i);
    if (!dist_client_reaches(c, r))
      return dist_refuse_unreached(c, "group", r, "group names rank %d, but the cluster "
                                   "has %d daemons", r, c->n);
    ranks[i] = (uint32_t)r;
  }
  *size = n;
  return 0;
}

/* Positions in the group this client speaks for: its own (SPMD) or all;
 * none for an SPMD trainer outside the group, for which the exchange is
 * a no-op (spmd_outside.c). */
static int participants(const dist_client *c, const uint32_t *ranks, int size,
                        int *pos) {
  if (c->spmd_rank < 0) {
    for (int i = 0; i < size; i++) pos[i] = i;
    return size;
  }
  for (int i = 0; i < size; i++)
    if ((int)ranks[i] == c->spmd_rank) {
      pos[0] = i;
      return 1;
    }
  return 0;
}

static int64_t sum(const int64_t *v, size_t n) {
  int64_t t = 0;
  for (size_t i = 0; i < n; i++) t += v[i];
  return t;
}

/* What every exchange call shares. */
typedef struct exchange_args {
  direction dir;
  const void *const *x;
  const int64_t *x_rows;
  dist_dtype dt;
  int64_t d_model;
  const int64_t *const *local_count, *const *global_count;
  int experts;
  const dist_moe_opts *opts;
  /* opts->out_name is the caller's (libdist's) to drop: a failure notes it
   * here for the daemons that did not answer; NULL for a user's name */
  dist_later *later;
} exchange_args;

static void fill_request(Dist__V1__GlobalExchangeRequest *rq,
                         const exchange_args *a, int k, uint64_t op_id,
                         uint32_t *ranks, int size) {
  size_t n = (size_t)size * (size_t)a->experts;
  const dist_moe_opts *o = a->opts;
  rq->op_id = op_id;
  rq->n_group = (size_t)size;
  rq->group = ranks;
  rq->row_width = (uint64_t)a->d_model;
  rq->n_local_count = rq->n_global_count = n;
  rq->local_count = (int64_t *)a->local_count[k];
  rq->global_count = (int64_t *)a->global_count[k];
  rq->dtype = (Dist__V1__DType)a->dt;
  if (o && o->x_name) {
    rq->x_name = (char *)o->x_name;
  } else {
    int64_t rows = a->x_rows ? a->x_rows[k]
                   : sum(a->dir == SCATTER ? a->local_count[k] : a->global_count[k], n);
    rq->x.data = (uint8_t *)a->x[k];
    rq->x.len = (size_t)rows * (size_t)a->d_model * dist_dtype_size(a->dt);
  }
  if (o && o->out_name) rq->out_name = (char *)o->out_name;
  if (o) rq->gradient = o->gradient;
  rq->replace = o && o->replace;
}

static int take_results(dist_client *c, const exchange_args *a, dist_call *calls,
                        int n, void **out, int64_t *out_rows) {
  for (int k = 0; k < n; k++) {
    const Dist__V1__GlobalExchangeReply *rp = (const void *)calls[k].reply;
    if (out_rows) out_rows[k] = (int64_t)rp->rows;
    if (!out) continue;
    out[k] = malloc(rp->data.len ? rp->data.len : 1);
    if (!out[k]) {
      for (int j = 0; j < k; j++) free(out[j]), out[j] = NULL;
      return dist_client_fail(c, DIST_ENOMEM, "cannot allocate the result");
    }
    if (rp->data.len) memcpy(out[k], rp->data.data, rp->data.len);
  }
  (void)a;
  return 0;
}

/* The entries of the per-rank arrays for the n ranks this client speaks
 * for: each is read (counts always, x and x_rows unless opts->x_name). */
static int check_exchange_entries(dist_client *c, const char *what, const exchange_args *a,
                                  int n) {
  int rows_from_x = !(a->opts && a->opts->x_name);
  for (int k = 0; k < n; k++) {
    const char *bad = !a->local_count[k]                  ? "local_count"
                      : !a->global_count[k]               ? "global_count"
                      : rows_from_x && !a->x[k]           ? "x"
                      : NULL;
    if (bad) return dist_client_fail(c, DIST_EINVAL, "%s: %s[%d] is NULL", what, bad, k);
    if (rows_from_x && a->x_rows && a->x_rows[k] < 0)
      return dist_client_fail(c, DIST_EINVAL, "%s: x_rows[%d] is negative (%lld)", what, k,
                              (long long)a->x_rows[k]);
  }
  return 0;
}

static int check_exchange_args(dist_client *c, const exchange_args *a, int n) {
  const char *what = a->dir == SCATTER ? "global_scatter" : "global_gather";
  if (a->experts < 1 || !a->local_count || !a->global_count ||
      (!a->x && !(a->opts && a->opts->x_name)) || a->d_model < 0 ||
      (a->d_model == 0 && !(a->opts && a->opts->x_name)))
    return dist_client_fail(c, DIST_EINVAL, "%s needs x (or opts->x_name), d_model "
                            "> 0, both counts and n_experts >= 1", what);
  return check_exchange_entries(c, what, a, n);
}

/* An outsider's result: no rows, in its one entry of out (malloc'd, to
 * free() as a member's) and out_rows; with opts->out_name nothing is
 * kept, as its daemon is not in the exchange. */
static int no_rows(dist_client *c, void **out, int64_t *out_rows) {
  if (out_rows) out_rows[0] = 0;
  return out ? dist_empty_result(c, &out[0]) : 0;
}

/* A failed exchange may have kept its result (opts->out_name) on the
 * daemons that carried it out, also on one whose reply was lost here (out
 * of memory): deleted there, unless it replaced a name of the caller's,
 * where the caller's tensor may have stood (as a replacing LocalLayer
 * call keeps its outputs: dist_local_layer_keeps_failed_outputs). A name
 * of libdist's own is noted on a->later for a daemon that did not answer,
 * which may have kept it too, and for one whose delete was not done, by
 * an SPMD trainer too: that list is its caller's (a tape's), as the
 * LocalLayer undoing calls' is: a tape's names are this process's
 * alone (dist_later_of_made_up). */
static void undo_kept(dist_client *c, const exchange_args *a, const dist_call *calls, int n) {
  const dist_moe_opts *o = a->opts;
  if (!o || !o->out_name || (o->replace && !a->later)) return;
  dist_later *notes = a->later;
  for (int k = 0; k < n; k++)
    if (calls[k].applied) dist_delete_on(c, o->out_name, &calls[k].target, 1, notes);
    else if (calls[k].unanswered && notes)
      dist_later_note(c, notes, o->out_name, calls[k].target);
}

static int exchange(dist_client *c, const exchange_args *a, const int *group,
                    int group_size, void **out, int64_t *out_rows) {
  uint32_t *ranks = calloc(DIST_MAX_MESH_RANKS, sizeof *ranks);
  int *pos = calloc(DIST_MAX_MESH_RANKS, sizeof *pos);
  Dist__V1__GlobalExchangeRequest *rqs = NULL;
  dist_call *calls = NULL;
  int size = 0, n = 0, rc;
  /* Taken before the arguments are checked, and by every trainer, in the
   * group or not: an SPMD trainer that refuses the exchange stays in step
   * with the others, and tells them. */
  uint64_t op_id = dist_next_op_id(c);
  if (!ranks || !pos) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    goto out;
  }
  if ((rc = resolve_group(c, group, group_size, ranks, &size)) != 0) {
    dist_spmd_refused_group(c, op_id, group, group_size);
    goto out;
  }
  n = participants(c, ranks, size, pos);
  /* An outsider's own entries are checked as a member checks its own. */
  if ((rc = check_exchange_args(c, a, n == 0 && c->spmd_rank >= 0 ? 1 : n)) != 0) {
    dist_spmd_refused(c, op_id, ranks, size);
    goto out;
  }
  if (n <= 0) {
    rc = no_rows(c, out, out_rows);
    goto out;
  }
  rqs = calloc((size_t)n, sizeof *rqs);
  calls = calloc((size_t)n, sizeof *calls);
  if (!rqs || !calls) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory for the requests to %d daemons", n);
    dist_spmd_refused(c, op_id, ranks, size);
    goto out;
  }
  for (int k = 0; k < n; k++) {
    dist__v1__global_exchange_request__init(&rqs[k]);
    fill_request(&rqs[k], a, k, op_id, ranks, size);
    calls[k].target = (int)ranks[pos[k]];
    calls[k].request = &rqs[k].base;
  }
  rc = dist_call_many(c, a->dir == SCATTER ? "/dist.v1.Moe/GlobalScatter"
                                           : "/dist.v1.Moe/GlobalGather",
                      &dist__v1__global_exchange_reply__descriptor, calls, n);
  if (rc == 0) rc = take_results(c, a, calls, n, out, out_rows);
  if (rc) undo_kept(c, a, calls, n);
  dist_calls_free(calls, n);
out:
  free(calls);
  free(rqs);
  free(pos);
  free(ranks);
  return rc;
}

int dist_global_scatter(dist_client *c, const void *const *x,
                        const int64_t *x_rows, dist_dtype dt, int64_t d_model,
                        const int64_t *const *local_count,
                        const int64_t *const *global_count, int n_experts,
                        const int *group, int group_size,
                        const dist_moe_opts *opts, void **out,
                        int64_t *out_rows) {
  if (!c) return dist_no_client(__func__);
  exchange_args a = {SCATTER, x, x_rows, dt, d_model, local_count,
                     global_count, n_experts, opts, NULL};
  return exchange(c, &a, group, group_size, out, out_rows);
}

int dist_global_gather(dist_client *c, const void *const *x,
                       const int64_t *x_rows, dist_dtype dt, int64_t d_model,
                       const int64_t *const *local_count,
                       const int64_t *const *global_count, int n_experts,
                       const int *group, int group_size,
                       const dist_moe_opts *opts, void **out,
                       int64_t *out_rows) {
  if (!c) return dist_no_client(__func__);
  exchange_args a = {GATHER, x, x_rows, dt, d_model, local_count,
                     global_count, n_experts, opts, NULL};
  return exchange(c, &a, group, group_size, out, out_rows);
}

int dist_global_exchange_undoing(dist_client *c, int scatter, const void *const *x,
                                 const int64_t *x_rows, dist_dtype dt, int64_t d_model,
                                 const int64_t *const *local_count,
                                 const int64_t *const *global_count, int n_experts,
                                 const int *group, int group_size, const dist_moe_opts *opts,
                                 dist_later *later) {
  exchange_args a = {scatter ? SCATTER : GATHER, x, x_rows, dt, d_model, local_count,
                     global_count, n_experts, opts, later};
  return exchange(c, &a, group, group_size, NULL, NULL);
}

/* SPMD: member j's block j*E..j*E+E-1 of local_count goes to member j; what
 * arrives from member s is exactly global_count[s*E .. s*E+E-1]. */
static int count_all_to_all(dist_client *c, uint64_t op_id, const int64_t *local, int experts,
                            uint32_t *ranks, int size, int64_t *global) {
  uint64_t *counts = calloc((size_t)size, sizeof *counts);
  if (!counts) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int j = 0; j < size; j++) counts[j] = (uint64_t)experts;
  size_t bytes = (size_t)size * (size_t)experts * sizeof(int64_t);
  Dist__V1__CollectiveRequest rq = DIST__V1__COLLECTIVE_REQUEST__INIT;
  rq.kind = DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_TO_ALL;
  rq.op_id = op_id;
  rq.n_group = (size_t)size;
  rq.group = ranks;
  rq.dtype = DIST__V1__DTYPE__INT64;
  rq.data.data = (uint8_t *)local;
  rq.data.len = bytes;
  rq.n_send_counts = rq.n_recv_counts = (size_t)size;
  rq.send_counts = rq.recv_counts = counts;
  ProtobufCMessage *rp = NULL;
  int rc = dist_call_one(c, c->spmd_rank, "/dist.v1.Dist/Collective", &rq.base,
                         &dist__v1__collective_reply__descriptor, &rp);
  if (rc == 0) {
    const Dist__V1__CollectiveReply *r = (const void *)rp;
    if (r->data.len != bytes)
      rc = dist_client_fail(c, DIST_EPROTO, "count exchange returned %zu bytes, "
                            "expected %zu", r->data.len, bytes);
    else
      memcpy(global, r->data.data, bytes);
  }
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  free(counts);
  return rc;
}

int dist_count_global(dist_client *c, const int64_t *const *local_count,
                      int n_experts, const int *group, int group_size,
                      int64_t *const *global_count) {
  if (!c) return dist_no_client(__func__);
  /* SPMD: taken before the checks, by every trainer, as in exchange */
  uint64_t op_id = c->spmd_rank >= 0 ? dist_next_op_id(c) : 0;
  uint32_t *ranks = calloc(DIST_MAX_MESH_RANKS, sizeof *ranks);
  int pos[1], size = 0, rc, E = n_experts, n = 0;
  if (!ranks) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  if ((rc = resolve_group(c, group, group_size, ranks, &size)) != 0) {
    dist_spmd_refused_group(c, op_id, group, group_size);
    goto out;
  }
  if (op_id) n = participants(c, ranks, size, pos);
  if (E < 1 || !local_count || !global_count) {
    rc = dist_client_fail(c, DIST_EINVAL, "count_global needs n_experts >= 1 "
                          "and both count arrays");
    dist_spmd_refused(c, op_id, ranks, size);
    goto out;
  }
  /* The entries this client gives (SPMD: its one, outsider or not) are
   * read below: a NULL one was read through (a crash), or an outsider's
   * passed unseen. */
  for (int k = 0; k < (op_id ? 1 : size); k++)
    if (!local_count[k] || !global_count[k]) {
      rc = dist_client_fail(c, DIST_EINVAL, "count_global: %s[%d] is NULL",
                            local_count[k] ? "global_count" : "local_count", k);
      dist_spmd_refused(c, op_id, ranks, size);
      goto out;
    }
  if (op_id && n == 0) { /* outside the group: nobody sends it a row */
    memset(global_count[0], 0, sizeof(int64_t) * (size_t)size * (size_t)E);
    rc = 0;
    goto out;
  }
  if (op_id) {
    rc = count_all_to_all(c, op_id, local_count[0], E, ranks, size, global_count[0]);
    goto out;
  }
  for (int r = 0; r < size; r++)
    for (int s = 0; s < size; s++)
      for (int e = 0; e < E; e++)
        global_count[r][s * E + e] = local_count[s][r * E + e];
  rc = 0;
out:
  free(ranks);
  return rc;
}
