/* Ops and Experts: what this daemon's operations registry (ops.h) holds,
 * with the ranks each running operation still waits on read from the peer
 * data plane; and the registry's lifetime and its link to the metrics. */
#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

#include "dist.pb-c.h"
#include "methods.h"
#include "metrics.h"
#include "ops.h"
#include "pbuf.h"
#include "peer.h"

/* ---- lifetime ---- */

static void count_finished(void *metrics, const char *kind, int ok, uint64_t bytes,
                           double seconds) {
  distd_metrics_collective(metrics, kind, ok, bytes, seconds);
}

int distd_ops_attach(distd_server *s, dist_errbuf *eb) {
  distd_ops *ops = distd_ops_new(count_finished, s->metrics);
  if (!ops) return dist_fail(eb, DIST_ENOMEM, "out of memory for the operations registry");
  distd_peers_set_ops(s->peers, ops);
  return 0;
}

void distd_ops_detach(distd_server *s, distd_ops *ops) {
  (void)s;
  distd_ops_free(ops);
}

/* ---- Ops ---- */

typedef struct op_msgs {
  Dist__V1__OpInfo *msgs;
  Dist__V1__OpInfo **ptrs;
  uint32_t *ranks; /* group and waiting_on of every message */
} op_msgs;

static void fill_op(distd_server *s, const distd_op_info *o, double now, Dist__V1__OpInfo *m,
                    uint32_t *ranks) {
  dist__v1__op_info__init(m);
  m->serial = o->serial;
  m->op_id = o->op_id;
  m->kind = (char *)o->kind;
  int ng = o->group_size < DISTD_OPS_GROUP_MAX ? o->group_size : DISTD_OPS_GROUP_MAX;
  for (int i = 0; i < ng; i++) ranks[i] = (uint32_t)o->group[i];
  m->group = ranks;
  m->n_group = (size_t)ng;
  m->group_size = (uint32_t)o->group_size;
  m->bytes = o->bytes;
  m->age_seconds = now - o->start;
  m->duration_seconds = o->seconds;
  m->state = (Dist__V1__OpInfo__State)o->state;
  m->error = (char *)o->error;
  if (o->state != DISTD_OP_RUNNING) return;
  int waiting[DISTD_OPS_GROUP_MAX];
  int nw = distd_peers_waiting_on(s->peers, o->watch, o->nwatch, waiting, DISTD_OPS_GROUP_MAX);
  if (nw > DISTD_OPS_GROUP_MAX) nw = DISTD_OPS_GROUP_MAX;
  m->waiting_on = ranks + DISTD_OPS_GROUP_MAX;
  for (int i = 0; i < nw; i++) m->waiting_on[i] = (uint32_t)waiting[i];
  m->n_waiting_on = (size_t)nw;
}

static int build_ops(distd_server *s, const distd_op_info *ops, int n, op_msgs *out,
                     dist_errbuf *eb) {
  out->msgs = calloc((size_t)n + 1, sizeof *out->msgs);
  out->ptrs = calloc((size_t)n + 1, sizeof *out->ptrs);
  out->ranks = calloc((size_t)n * 2 * DISTD_OPS_GROUP_MAX + 1, sizeof *out->ranks);
  if (!out->msgs || !out->ptrs || !out->ranks)
    return dist_fail(eb, DIST_ENOMEM, "out of memory listing %d operations", n);
  double now = distd_now_s();
  for (int i = 0; i < n; i++) {
    fill_op(s, &ops[i], now, &out->msgs[i], out->ranks + (size_t)i * 2 * DISTD_OPS_GROUP_MAX);
    out->ptrs[i] = &out->msgs[i];
  }
  return 0;
}

DISTD_HANDLER(ops) {
  (void)ci;
  const Dist__V1__OpsRequest *rq = (const void *)req;
  distd_op_info *ops = NULL;
  op_msgs m = {0};
  int running = 0, recent = 0;
  int rc = distd_ops_snapshot(distd_peers_ops(s->peers), &ops, &running, &recent);
  if (rc) {
    dist_fail(eb, rc, "out of memory copying the operations registry");
    goto out;
  }
  if (rq->recent && (uint32_t)recent > rq->recent) recent = (int)rq->recent;
  if ((rc = build_ops(s, ops, running + recent, &m, eb)) != 0) goto out;
  Dist__V1__OpsReply rp = DIST__V1__OPS_REPLY__INIT;
  rp.rank = (uint32_t)s->rank;
  rp.in_flight = m.ptrs;
  rp.n_in_flight = (size_t)running;
  rp.recent = m.ptrs + running;
  rp.n_recent = (size_t)recent;
  *reply = dist_pb_to_bb(&rp.base);
out:
  free(m.msgs);
  free(m.ptrs);
  free(m.ranks);
  free(ops);
  return rc;
}

/* ---- Experts ---- */

DISTD_HANDLER(experts) {
  (void)ci, (void)req;
  distd_expert_count *c = NULL;
  Dist__V1__ExpertInfo *msgs = NULL, **ptrs = NULL;
  int n = 0;
  int rc = distd_expert_stats_snapshot(distd_ops_experts(distd_peers_ops(s->peers)), &c, &n);
  if (rc == 0 && (!(msgs = calloc((size_t)n + 1, sizeof *msgs)) ||
                  !(ptrs = calloc((size_t)n + 1, sizeof *ptrs))))
    rc = DIST_ENOMEM;
  if (rc) {
    dist_fail(eb, rc, "out of memory listing experts");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    dist__v1__expert_info__init(&msgs[i]);
    msgs[i].expert_id = (uint32_t)c[i].expert_id;
    msgs[i].steps = c[i].steps;
    msgs[i].tokens_total = c[i].tokens_total;
    msgs[i].tokens_recent = c[i].tokens_recent;
    msgs[i].tokens_last = c[i].tokens_last;
    ptrs[i] = &msgs[i];
  }
  Dist__V1__ExpertsReply rp = DIST__V1__EXPERTS_REPLY__INIT;
  rp.rank = (uint32_t)s->rank;
  rp.experts = ptrs;
  rp.n_experts = (size_t)n;
  rp.window_steps = DISTD_EXPERT_WINDOW;
  *reply = dist_pb_to_bb(&rp.base);
out:
  free(msgs);
  free(ptrs);
  free(c);
  return rc;
}

/* ---- /metrics: operations in flight and expert tokens ---- */

void distd_ops_write_metrics(distd_server *s, struct evbuffer *out) {
  distd_ops *ops = distd_peers_ops(s->peers);
  distd_metrics_gauge_header(out, "distd_ops_in_flight", "gauge",
                             "Collectives, reshards and MoE exchanges running");
  evbuffer_add_printf(out, "distd_ops_in_flight %d\n", distd_ops_in_flight(ops));
  distd_expert_count *c = NULL;
  int n = 0;
  if (distd_expert_stats_snapshot(distd_ops_experts(ops), &c, &n) != 0 || n == 0) return;
  distd_metrics_gauge_header(out, "distd_expert_tokens_total", "counter",
                             "Tokens global_scatter routed to each expert of this daemon");
  for (int i = 0; i < n; i++)
    evbuffer_add_printf(out, "distd_expert_tokens_total{expert=\"%d\"} %llu\n", c[i].expert_id,
                        (unsigned long long)c[i].tokens_total);
  free(c);
}
