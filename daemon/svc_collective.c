/* Collective: a raw collective over data the trainer sends, for SPMD
 * programs (dist.all_reduce, dist.all_gather ...).
 *
 * Each kind is split in two: prepare (check the request, learn counts,
 * allocate the result) and exec (the data movement alone). A normal call
 * runs both once; benchmark mode (repeat > 0) prepares once and then runs
 * exec warmup + repeat times, each after a barrier of the group, timing
 * each exec, so bench/run sees the daemon-to-daemon time of the op. */
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "coll.h"
#include "methods.h"
#include "moe_scatter.h"
#include "op_refuse.h"
#include "op_signature.h"
#include "pbuf.h"
#include "wire.h"

typedef Dist__V1__CollectiveRequest creq;

/* Everything one collective needs, filled by a kind's prepare. */
typedef struct op {
  const creq *rq;
  dist_dtype dt;
  size_t elem, n;       /* element size, elements in rq->data */
  size_t *a, *b;        /* per-member counts (send / recv, or sizes) */
  int64_t *la, *lb;     /* the same as int64, for the MoE exchange */
  int root;             /* BROADCAST: the root's index in the group */
  void *out;
  size_t out_len;
  /* Set by a prepare before its first exchange: a failure from then on
   * was told to the group by the exchange itself. */
  int exchanged;
} op;

typedef struct kind_ops {
  int (*prepare)(const distd_coll *c, op *o, dist_errbuf *eb);
  int (*exec)(const distd_coll *c, op *o, dist_errbuf *eb);
  distd_sig_kind sig; /* what its frames are signed as (signature_of) */
} kind_ops;

static size_t sum(const size_t *v, int n) {
  size_t t = 0;
  for (int i = 0; i < n; i++) t += v[i];
  return t;
}

static int alloc_out(op *o, size_t len, dist_errbuf *eb) {
  o->out_len = len;
  if (!(o->out = malloc(len + 1)))
    return dist_fail(eb, DIST_ENOMEM, "out of memory for a %zu-byte result", len);
  return 0;
}

static int take_counts(const uint64_t *given, size_t ngiven, int size, size_t *counts,
                       const char *what, dist_errbuf *eb) {
  if (ngiven != (size_t)size)
    return dist_fail(eb, DIST_EINVAL, "%s: %zu counts for a group of %d", what, ngiven, size);
  for (int i = 0; i < size; i++) counts[i] = (size_t)given[i];
  return 0;
}

/* ---- all-reduce: in place on a copy of the input ---- */

static int prep_all_reduce(const distd_coll *c, op *o, dist_errbuf *eb) {
  (void)c;
  int rc = distd_check_reduce((dist_reduce)o->rq->reduce, eb);
  return rc ? rc : alloc_out(o, o->n * o->elem, eb);
}

static int exec_all_reduce(const distd_coll *c, op *o, dist_errbuf *eb) {
  if (o->out_len) memcpy(o->out, o->rq->data.data, o->out_len);
  return distd_allreduce(c, o->out, o->n, o->dt, (dist_reduce)o->rq->reduce, eb);
}

/* ---- all-gather: pieces may differ in size, so learn them first ---- */

static int prep_all_gather(const distd_coll *c, op *o, dist_errbuf *eb) {
  uint64_t mine = o->n, *all = calloc((size_t)c->size, sizeof *all);
  if (!all) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (int i = 0; i < c->size; i++) o->a[i] = 1;
  o->exchanged = 1;
  int rc = distd_allgather(c, &mine, all, o->a, DIST_INT64, eb);
  for (int i = 0; i < c->size; i++) o->b[i] = (size_t)all[i];
  free(all);
  return rc ? rc : alloc_out(o, sum(o->b, c->size) * o->elem, eb);
}

static int exec_all_gather(const distd_coll *c, op *o, dist_errbuf *eb) {
  distd_coll c2 = *c;
  c2.op_id = c->op_id ^ 0x5a5a5a5a5a5a5a5aull; /* the size exchange used op_id */
  return distd_allgather(&c2, o->rq->data.data, o->out, o->b, o->dt, eb);
}

/* ---- reduce-scatter ---- */

static int prep_reduce_scatter(const distd_coll *c, op *o, dist_errbuf *eb) {
  const creq *rq = o->rq;
  int rc = distd_check_reduce((dist_reduce)rq->reduce, eb);
  if (rc || (rc = take_counts(rq->send_counts, rq->n_send_counts, c->size, o->a,
                              "reduce_scatter", eb)))
    return rc;
  if (sum(o->a, c->size) != o->n)
    return dist_fail(eb, DIST_EINVAL, "reduce_scatter: counts sum to %zu, data has %zu "
                     "elements", sum(o->a, c->size), o->n);
  return alloc_out(o, o->a[c->me] * o->elem, eb);
}

static int exec_reduce_scatter(const distd_coll *c, op *o, dist_errbuf *eb) {
  return distd_reduce_scatter(c, o->rq->data.data, o->out, o->a, o->dt,
                              (dist_reduce)o->rq->reduce, eb);
}

/* ---- all-to-all, and the same through the MoE exchange ---- */

static int prep_all_to_all(const distd_coll *c, op *o, dist_errbuf *eb) {
  const creq *rq = o->rq;
  int rc;
  if ((rc = take_counts(rq->send_counts, rq->n_send_counts, c->size, o->a,
                        "all_to_all send", eb)) ||
      (rc = take_counts(rq->recv_counts, rq->n_recv_counts, c->size, o->b,
                        "all_to_all recv", eb)))
    return rc;
  if (sum(o->a, c->size) != o->n)
    return dist_fail(eb, DIST_EINVAL, "all_to_all: send counts sum to %zu, data has %zu "
                     "elements", sum(o->a, c->size), o->n);
  return alloc_out(o, sum(o->b, c->size) * o->elem, eb);
}

static int exec_all_to_all(const distd_coll *c, op *o, dist_errbuf *eb) {
  return distd_alltoallv(c, o->rq->data.data, o->a, o->out, o->b, o->dt, eb);
}

/* One expert per rank and rows of one element: global_scatter is then
 * exactly all_to_all, over the MoE wire protocol (counts header first). */
static int prep_global_scatter(const distd_coll *c, op *o, dist_errbuf *eb) {
  int rc = prep_all_to_all(c, o, eb);
  if (rc) return rc;
  o->la = malloc(sizeof *o->la * (size_t)c->size);
  o->lb = malloc(sizeof *o->lb * (size_t)c->size);
  if (!o->la || !o->lb) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (int i = 0; i < c->size; i++) o->la[i] = (int64_t)o->a[i], o->lb[i] = (int64_t)o->b[i];
  return 0;
}

static int exec_global_scatter(const distd_coll *c, op *o, dist_errbuf *eb) {
  distd_moe_args a = {.peers = c->peers, .op_id = c->op_id, .dir = DISTD_MOE_SCATTER,
                      .group = c->group, .size = c->size, .me = c->me, .experts = 1,
                      .local_count = o->la, .global_count = o->lb, .row_bytes = o->elem,
                      .deadline_ms = c->deadline_ms, .signature = c->signature};
  return distd_moe_exchange(&a, o->rq->data.data, o->out, eb);
}

/* ---- broadcast and barrier ---- */

static int prep_broadcast(const distd_coll *c, op *o, dist_errbuf *eb) {
  o->root = -1;
  for (int i = 0; i < c->size; i++)
    if (c->group[i] == (int)o->rq->root) o->root = i;
  if (o->root < 0)
    return dist_fail(eb, DIST_EINVAL, "broadcast root %u is not in the group", o->rq->root);
  /* Two members that each take themselves for the root only send, so
   * neither would see the other's signature; in a barrier, signed with
   * the root, every member hears from every other. */
  o->exchanged = 1;
  int rc = distd_barrier(c, eb);
  return rc ? rc : alloc_out(o, o->n * o->elem, eb);
}

static int exec_broadcast(const distd_coll *c, op *o, dist_errbuf *eb) {
  if (o->out_len) memcpy(o->out, o->rq->data.data, o->out_len);
  return distd_broadcast(c, o->out, o->n, o->dt, o->root, eb);
}

static int prep_nothing(const distd_coll *c, op *o, dist_errbuf *eb) {
  (void)c, (void)o, (void)eb;
  return 0;
}

static int exec_barrier(const distd_coll *c, op *o, dist_errbuf *eb) {
  (void)o;
  return distd_barrier(c, eb);
}

static const kind_ops *kind_of(int kind) {
  static const kind_ops kinds[] = {
      [DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_REDUCE] = {prep_all_reduce, exec_all_reduce,
                                                          DISTD_SIG_ALL_REDUCE},
      [DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_GATHER] = {prep_all_gather, exec_all_gather,
                                                          DISTD_SIG_ALL_GATHER},
      [DIST__V1__COLLECTIVE_REQUEST__KIND__REDUCE_SCATTER] = {prep_reduce_scatter,
                                                              exec_reduce_scatter,
                                                              DISTD_SIG_REDUCE_SCATTER},
      [DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_TO_ALL] = {prep_all_to_all, exec_all_to_all,
                                                          DISTD_SIG_ALL_TO_ALL},
      [DIST__V1__COLLECTIVE_REQUEST__KIND__BROADCAST] = {prep_broadcast, exec_broadcast,
                                                         DISTD_SIG_BROADCAST},
      [DIST__V1__COLLECTIVE_REQUEST__KIND__BARRIER] = {prep_nothing, exec_barrier,
                                                       DISTD_SIG_BARRIER},
      [DIST__V1__COLLECTIVE_REQUEST__KIND__GLOBAL_SCATTER] = {prep_global_scatter,
                                                              exec_global_scatter,
                                                              DISTD_SIG_GLOBAL_SCATTER},
  };
  if (kind < 0 || kind >= (int)(sizeof kinds / sizeof kinds[0]) || !kinds[kind].exec)
    return NULL;
  return &kinds[kind];
}

/* ---- benchmark mode ---- */

/* Distinct, well spread op ids for step k of a benchmark run (splitmix64),
 * identical on every member since they share op_id. */
static uint64_t derived_op_id(uint64_t op_id, uint64_t k) {
  uint64_t z = op_id + 0x9e3779b97f4a7c15ull * (k + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A member that refuses the op aborts it under the op id itself
 * (op_refuse.h), but the steps below run under derived ids, which that
 * abort does not reach. So the run's first exchange is under the op id, as
 * a single run's is: a barrier, unless prepare exchanged under it already.
 * Checked once per run, not per step or per frame; untimed. */
static int barrier_under_op_id(const distd_coll *c, const op *o, dist_errbuf *eb) {
  return o->exchanged ? 0 : distd_barrier(c, eb);
}

/* warmup + repeat execs, each after a barrier; times[] gets the timed ones. */
static int repeat_exec(const distd_coll *c, const kind_ops *k, op *o, double *times,
                       dist_errbuf *eb) {
  uint32_t total = o->rq->warmup + o->rq->repeat;
  int rc = barrier_under_op_id(c, o, eb);
  if (rc) return rc;
  for (uint32_t i = 0; i < total; i++) {
    distd_coll step = *c;
    step.op_id = derived_op_id(c->op_id, 2 * (uint64_t)i);
    if ((rc = distd_barrier(&step, eb))) return rc;
    step.op_id = derived_op_id(c->op_id, 2 * (uint64_t)i + 1);
    double t0 = distd_now_s();
    if ((rc = k->exec(&step, o, eb))) return rc;
    if (i >= o->rq->warmup) times[i - o->rq->warmup] = distd_now_s() - t0;
  }
  return 0;
}

/* Checks the request and prepares the collective (counts, the result's
 * memory). */
static int prepare(const distd_coll *c, op *o, dist_errbuf *eb) {
  const kind_ops *k = kind_of((int)o->rq->kind);
  if (!k) return dist_fail(eb, DIST_EINVAL, "unknown collective kind %d", (int)o->rq->kind);
  if (o->rq->data.len % o->elem)
    return dist_fail(eb, DIST_EINVAL, "%zu data bytes is not a whole number of %zu-byte "
                     "elements", o->rq->data.len, o->elem);
  o->n = o->rq->data.len / o->elem;
  o->a = calloc((size_t)c->size, sizeof *o->a);
  o->b = calloc((size_t)c->size, sizeof *o->b);
  if (!o->a || !o->b) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  return k->prepare(c, o, eb);
}

/* Runs the prepared collective (once, or as a benchmark); fills o->out
 * and times. */
static int run(const distd_coll *c, op *o, double *times, dist_errbuf *eb) {
  const kind_ops *k = kind_of((int)o->rq->kind);
  return o->rq->repeat ? repeat_exec(c, k, o, times, eb) : k->exec(c, o, eb);
}

static void op_free(op *o) {
  free(o->a);
  free(o->b);
  free(o->la);
  free(o->lb);
  free(o->out);
}

/* ---- refusals ---- */

static int is_point_to_point(const creq *rq) {
  return rq->kind == DIST__V1__COLLECTIVE_REQUEST__KIND__SEND ||
         rq->kind == DIST__V1__COLLECTIVE_REQUEST__KIND__RECV;
}

/* A collective this daemon refuses before its part (a request it cannot
 * parse, counts that do not add up, a root outside the group): the others
 * would wait for that part until their deadline; told, they fail at once
 * naming this rank and eb's reason. Returns eb's code. */
static int collective_refused(distd_server *s, const creq *rq, dist_errbuf *eb) {
  if (!is_point_to_point(rq)) return distd_refuse_group(s, rq->op_id, rq->group, rq->n_group, eb);
  int peer = (int)rq->root; /* one outside the world is skipped */
  distd_refuse_op(s, rq->op_id, 0, &peer, 1, "its daemon", dist_errbuf_msg(eb));
  return eb->code;
}

/* ---- point to point, and the handler ---- */

static int point_to_point(distd_server *s, const distd_call_info *ci, op *o,
                          dist_errbuf *eb) {
  const creq *rq = o->rq;
  if (rq->root >= (uint32_t)s->world_size || (int)rq->root == s->rank) {
    dist_fail(eb, DIST_EINVAL, "%s: peer rank %u is not another daemon of this cluster",
              rq->kind == DIST__V1__COLLECTIVE_REQUEST__KIND__SEND ? "send" : "recv", rq->root);
    return collective_refused(s, rq, eb);
  }
  if (rq->kind == DIST__V1__COLLECTIVE_REQUEST__KIND__SEND)
    return distd_send_to(s->peers, rq->op_id, (int)rq->root, rq->data.data,
                         rq->data.len, o->dt, ci->deadline_ms, eb);
  if (alloc_out(o, rq->count * o->elem, eb) != 0) return collective_refused(s, rq, eb);
  return distd_recv_from(s->peers, rq->op_id, (int)rq->root, o->out, o->out_len, o->dt,
                         ci->deadline_ms, eb);
}

/* The request's signature (op_signature.h): trainers that disagree on the
 * collective, its dtype, reduce op or root fail at their first frame. */
static uint64_t signature_of(const op *o) {
  const kind_ops *k = kind_of((int)o->rq->kind);
  if (!k) return 0; /* prepare() refuses the request */
  distd_sig_kind sig = k->sig;
  int reduces = sig == DISTD_SIG_ALL_REDUCE || sig == DISTD_SIG_REDUCE_SCATTER;
  return distd_op_signature(sig, sig == DISTD_SIG_BARRIER ? DIST_DTYPE_INVALID : o->dt,
                            reduces ? (int)o->rq->reduce : -1,
                            sig == DISTD_SIG_BROADCAST ? (int)o->rq->root : -1);
}

static int group_run(distd_server *s, const distd_call_info *ci, op *o, double *times,
                     dist_errbuf *eb) {
  const creq *rq = o->rq;
  int group[DIST_MAX_MESH_RANKS], n = rq->n_group ? (int)rq->n_group : s->world_size;
  if (rq->n_group > DIST_MAX_MESH_RANKS) {
    dist_fail(eb, DIST_EINVAL, "group of %zu ranks (at most %d)", rq->n_group,
              DIST_MAX_MESH_RANKS);
    return collective_refused(s, rq, eb);
  }
  for (int i = 0; i < n; i++) group[i] = rq->n_group ? (int)rq->group[i] : i;
  distd_coll c;
  int rc = distd_coll_init(&c, s->peers, rq->op_id, group, n, ci->deadline_ms, eb);
  c.signature = signature_of(o);
  if (rc == 0) rc = prepare(&c, o, eb);
  if (rc) return o->exchanged ? rc : collective_refused(s, rq, eb);
  return run(&c, o, times, eb);
}

DISTD_HANDLER(collective) {
  const creq *rq = (const void *)req;
  op o = {.rq = rq, .dt = DIST_FLOAT32};
  double *times = NULL;
  int rc = 0;
  if (rq->kind != DIST__V1__COLLECTIVE_REQUEST__KIND__BARRIER &&
      dist_dtype_from_pb((int)rq->dtype, &o.dt, eb) != 0)
    return collective_refused(s, rq, eb);
  o.elem = dist_dtype_size(o.dt);
  if (rq->repeat && !(times = calloc(rq->repeat, sizeof *times))) {
    dist_fail(eb, DIST_ENOMEM, "out of memory for %u timings", rq->repeat);
    return collective_refused(s, rq, eb);
  }
  if (is_point_to_point(rq)) {
    if (rq->repeat) {
      dist_fail(eb, DIST_EINVAL, "send/recv have no benchmark mode");
      rc = collective_refused(s, rq, eb); /* its peer would wait for it */
    } else {
      rc = point_to_point(s, ci, &o, eb);
    }
  } else {
    rc = group_run(s, ci, &o, times, eb);
  }
  if (rc == 0) {
    Dist__V1__CollectiveReply rp = DIST__V1__COLLECTIVE_REPLY__INIT;
    rp.data.data = o.out;
    rp.data.len = o.out_len;
    rp.op_seconds = times;
    rp.n_op_seconds = rq->repeat;
    *reply = dist_pb_to_bb(&rp.base);
  }
  free(times);
  op_free(&o);
  return rc;
}
