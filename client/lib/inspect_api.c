/* Inspection: the Ops, Experts and Param/List RPCs of one daemon. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "param.pb-c.h"

/* One inspection call to daemon `rank`; *reply to free with
 * protobuf_c_message_free_unpacked. */
static int ask_rank(dist_client *c, const char *func, int rank, const char *method,
                    const ProtobufCMessage *rq, const ProtobufCMessageDescriptor *reply_desc,
                    ProtobufCMessage **reply) {
  *reply = NULL;
  if (dist_client_check_rank(c, func, rank) != 0) return c->err.code;
  return dist_call_one(c, rank, method, rq, reply_desc, reply);
}

static void copy_op(const Dist__V1__OpInfo *m, dist_op_info *o) {
  memset(o, 0, sizeof *o);
  o->serial = m->serial;
  o->op_id = m->op_id;
  snprintf(o->kind, sizeof o->kind, "%s", m->kind);
  o->group_size = (int)m->group_size;
  for (size_t i = 0; i < m->n_group && i < DIST_OP_GROUP_MAX; i++)
    o->group[o->ngroup++] = (int)m->group[i];
  o->bytes = m->bytes;
  o->age_seconds = m->age_seconds;
  o->duration_seconds = m->duration_seconds;
  o->state = (dist_op_state)m->state;
  snprintf(o->error, sizeof o->error, "%s", m->error);
  for (size_t i = 0; i < m->n_waiting_on && i < DIST_OP_GROUP_MAX; i++)
    o->waiting_on[o->nwaiting++] = (int)m->waiting_on[i];
}

static int copy_ops(dist_client *c, const Dist__V1__OpsReply *rp, dist_ops_report *out) {
  size_t n = rp->n_in_flight + rp->n_recent;
  out->rank = (int)rp->rank;
  if (!(out->ops = calloc(n + 1, sizeof *out->ops)))
    return dist_client_fail(c, DIST_ENOMEM, "out of memory for %zu operations", n);
  for (size_t i = 0; i < rp->n_in_flight; i++) copy_op(rp->in_flight[i], &out->ops[i]);
  for (size_t i = 0; i < rp->n_recent; i++)
    copy_op(rp->recent[i], &out->ops[rp->n_in_flight + i]);
  out->n_in_flight = (int)rp->n_in_flight;
  out->n_recent = (int)rp->n_recent;
  return 0;
}

int dist_ops(dist_client *c, int rank, int recent, dist_ops_report *out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out)) return c->err.code;
  memset(out, 0, sizeof *out);
  Dist__V1__OpsRequest rq = DIST__V1__OPS_REQUEST__INIT;
  rq.recent = recent > 0 ? (uint32_t)recent : 0;
  ProtobufCMessage *rp = NULL;
  int rc = ask_rank(c, __func__, rank, "/dist.v1.Dist/Ops", &rq.base, &dist__v1__ops_reply__descriptor,
                    &rp);
  if (rc == 0) rc = copy_ops(c, (const Dist__V1__OpsReply *)rp, out);
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}

void dist_ops_report_free(dist_ops_report *r) {
  if (!r) return;
  free(r->ops);
  r->ops = NULL;
}

static int copy_experts(dist_client *c, const Dist__V1__ExpertsReply *rp,
                        dist_experts_report *out) {
  out->rank = (int)rp->rank;
  out->window_steps = (int)rp->window_steps;
  if (!(out->experts = calloc(rp->n_experts + 1, sizeof *out->experts)))
    return dist_client_fail(c, DIST_ENOMEM, "out of memory for %zu experts", rp->n_experts);
  for (size_t i = 0; i < rp->n_experts; i++) {
    const Dist__V1__ExpertInfo *m = rp->experts[i];
    out->experts[i] = (dist_expert_info){(int)m->expert_id, m->steps, m->tokens_total,
                                         m->tokens_recent, m->tokens_last};
  }
  out->n = (int)rp->n_experts;
  return 0;
}

int dist_experts(dist_client *c, int rank, dist_experts_report *out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out)) return c->err.code;
  memset(out, 0, sizeof *out);
  Dist__V1__ExpertsRequest rq = DIST__V1__EXPERTS_REQUEST__INIT;
  ProtobufCMessage *rp = NULL;
  int rc = ask_rank(c, __func__, rank, "/dist.v1.Dist/Experts", &rq.base,
                    &dist__v1__experts_reply__descriptor, &rp);
  if (rc == 0) rc = copy_experts(c, (const Dist__V1__ExpertsReply *)rp, out);
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}

void dist_experts_report_free(dist_experts_report *r) {
  if (!r) return;
  free(r->experts);
  r->experts = NULL;
}

/* ---------------------------------------------------------------- parameters */

static int copy_params(dist_client *c, int rank, const Dist__V1__ParamListReply *rp,
                       dist_params_report *out) {
  int daemon = dist_daemon_rank(c, rank); /* not the position, for one endpoint */
  out->rank = daemon >= 0 ? daemon : rank;
  char who[300];
  for (size_t i = 0; i < rp->n_params; i++)
    if (!rp->params[i]->config || !rp->params[i]->config->optimizer)
      return dist_client_fail(c, DIST_EPROTO, "%s described a parameter without its "
                              "configuration", dist_rank_label(c, rank, who, sizeof who));
  if (!(out->params = calloc(rp->n_params + 1, sizeof *out->params)))
    return dist_client_fail(c, DIST_ENOMEM, "out of memory for %zu parameters", rp->n_params);
  for (size_t i = 0; i < rp->n_params; i++) {
    const Dist__V1__ParamState *m = rp->params[i];
    dist_param_info *p = &out->params[out->n++];
    snprintf(p->name, sizeof p->name, "%s", m->config->name);
    dist_param_opts_from_pb(m->config, &p->opts);
    p->step = m->config->step;
    p->pending = (int)m->pending;
    p->state_bytes = m->state_bytes;
    p->version = m->version;
    snprintf(p->held_for, sizeof p->held_for, "%s", m->held_for);
  }
  return 0;
}

int dist_params(dist_client *c, int rank, dist_params_report *out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out)) return c->err.code;
  memset(out, 0, sizeof *out);
  Dist__V1__ParamListRequest rq = DIST__V1__PARAM_LIST_REQUEST__INIT;
  ProtobufCMessage *rp = NULL;
  int rc = ask_rank(c, __func__, rank, "/dist.v1.Param/List", &rq.base,
                    &dist__v1__param_list_reply__descriptor, &rp);
  if (rc == 0) rc = copy_params(c, rank, (const Dist__V1__ParamListReply *)rp, out);
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}

void dist_params_report_free(dist_params_report *r) {
  if (!r) return;
  free(r->params);
  r->params = NULL;
  r->n = 0;
}
