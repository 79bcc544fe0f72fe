/* Info and health. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "health.pb-c.h"

static int copy_info(dist_client *c, const Dist__V1__InfoReply *rp, dist_daemon_info *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->version, sizeof out->version, "%s", rp->version);
  snprintf(out->cluster_id, sizeof out->cluster_id, "%s", rp->cluster_id);
  snprintf(out->grpc_address, sizeof out->grpc_address, "%s", rp->grpc_address);
  snprintf(out->http_address, sizeof out->http_address, "%s", rp->http_address);
  snprintf(out->peer_io, sizeof out->peer_io, "%s", rp->peer_io);
  out->rank = (int)rp->rank;
  out->world_size = (int)rp->world_size;
  out->uptime_seconds = rp->uptime_seconds;
  out->tensor_bytes = rp->tensor_bytes;
  out->tensor_bytes_limit = rp->tensor_bytes_limit;
  out->tensor_count = rp->tensor_count;
  out->ops_in_flight = rp->ops_in_flight;
  out->peers = calloc(rp->n_peers + 1, sizeof *out->peers);
  if (!out->peers)
    return dist_client_fail(c, DIST_ENOMEM, "out of memory for the %zu peers of rank %d",
                            rp->n_peers, out->rank);
  out->npeers = (int)rp->n_peers;
  for (size_t i = 0; i < rp->n_peers; i++) {
    const Dist__V1__PeerInfo *p = rp->peers[i];
    dist_peer_info *q = &out->peers[i];
    q->rank = (int)p->rank;
    snprintf(q->address, sizeof q->address, "%s", p->address);
    q->connected = p->connected;
    q->bytes_sent = p->bytes_sent;
    q->bytes_received = p->bytes_received;
    q->rtt_seconds = p->rtt_seconds;
    q->reconnects = p->reconnects;
    snprintf(q->congestion, sizeof q->congestion, "%s", p->congestion);
  }
  return 0;
}

int dist_info(dist_client *c, int rank, dist_daemon_info *out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out)) return c->err.code;
  memset(out, 0, sizeof *out);
  if (dist_client_check_rank(c, __func__, rank) != 0) return c->err.code;
  Dist__V1__InfoRequest rq = DIST__V1__INFO_REQUEST__INIT;
  ProtobufCMessage *rp = NULL;
  int rc = dist_call_one(c, rank, "/dist.v1.Dist/Info", &rq.base,
                         &dist__v1__info_reply__descriptor, &rp);
  if (rc == 0) rc = copy_info(c, (const Dist__V1__InfoReply *)rp, out);
  if (rc == 0) dist_client_learn_rank(c, out->rank);
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}

void dist_info_free(dist_daemon_info *info) {
  if (!info) return;
  free(info->peers);
  info->peers = NULL;
}

int dist_health(dist_client *c, int rank) {
  if (!c) return dist_no_client(__func__);
  if (dist_client_check_rank(c, __func__, rank) != 0) return c->err.code;
  Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  ProtobufCMessage *rp = NULL;
  char named[300];
  int rc = dist_call_one(c, rank, "/grpc.health.v1.Health/Check", &rq.base,
                         &grpc__health__v1__health_check_response__descriptor, &rp);
  if (rc == 0 && ((Grpc__Health__V1__HealthCheckResponse *)rp)->status !=
                     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING)
    rc = dist_client_fail(c, DIST_EUNAVAIL, "%s is not serving",
                          dist_daemon_label(c, rank, named, sizeof named));
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}
