/* Health, Info and the state-derived parts of /metrics and /readyz. */
#include <event2/buffer.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.pb-c.h"
#include "health.pb-c.h"
#include "http.h"
#include "methods.h"
#include "metrics.h"
#include "ops.h"
#include "pbuf.h"
#include "peer.h"
#include "program_registry.h"
#include "store.h"

/* SERVING for the whole server ("") and for dist.v1.Dist; NOT_FOUND for any
 * other service name, as grpc.health.v1 specifies. */
DISTD_HANDLER(health_check) {
  (void)s, (void)ci;
  const Grpc__Health__V1__HealthCheckRequest *rq = (const void *)req;
  if (rq->service[0] && strcmp(rq->service, "dist.v1.Dist") != 0)
    return dist_fail(eb, DIST_ENOTFOUND, "unknown service '%s'", rq->service);
  Grpc__Health__V1__HealthCheckResponse rp =
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  rp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  *reply = dist_pb_to_bb(&rp.base);
  return 0;
}

/* st holds the strings pi points to, so it lives until the reply is packed. */
static void fill_peer(distd_server *s, int r, distd_peer_stats *st, Dist__V1__PeerInfo *pi) {
  distd_peers_get_stats(s->peers, r, st);
  pi->rank = (uint32_t)r;
  pi->address = s->members[r].peer_addr;
  pi->connected = st->connected;
  pi->bytes_sent = st->bytes_sent;
  pi->bytes_received = st->bytes_received;
  pi->rtt_seconds = st->rtt_seconds;
  pi->reconnects = st->reconnects;
  pi->congestion = st->congestion;
}

DISTD_HANDLER(info) {
  (void)ci, (void)req;
  Dist__V1__InfoReply rp = DIST__V1__INFO_REPLY__INIT;
  rp.version = (char *)DIST_VERSION;
  rp.rank = (uint32_t)s->rank;
  rp.world_size = (uint32_t)s->world_size;
  rp.uptime_seconds = distd_now_s() - s->start_time;
  rp.cluster_id = s->cfg.cluster_id;
  rp.grpc_address = s->grpc_address;
  rp.http_address = s->http ? (char *)distd_http_address(s->http) : (char *)"";
  rp.peer_io = (char *)distd_peers_io(s->peers);
  int count = 0;
  distd_store_usage(s->store, &rp.tensor_bytes, &rp.tensor_bytes_limit, &count);
  rp.tensor_count = (uint32_t)count;
  rp.ops_in_flight = (uint32_t)distd_ops_in_flight(distd_peers_ops(s->peers));
  Dist__V1__PeerInfo *peers = calloc((size_t)s->world_size, sizeof *peers);
  Dist__V1__PeerInfo **ptrs = calloc((size_t)s->world_size, sizeof *ptrs);
  distd_peer_stats *stats = calloc((size_t)s->world_size, sizeof *stats);
  if (!peers || !ptrs || !stats) {
    free(peers), free(ptrs), free(stats);
    return dist_fail(eb, DIST_ENOMEM, "out of memory");
  }
  for (int r = 0; r < s->world_size; r++) {
    if (r == s->rank) continue;
    dist__v1__peer_info__init(&peers[rp.n_peers]);
    fill_peer(s, r, &stats[rp.n_peers], &peers[rp.n_peers]);
    ptrs[rp.n_peers] = &peers[rp.n_peers];
    rp.n_peers++;
  }
  rp.peers = ptrs;
  *reply = dist_pb_to_bb(&rp.base);
  free(ptrs);
  free(peers);
  free(stats);
  return 0;
}

/* Per-peer counters, read from distd_peer_stats. */
static const struct peer_counter {
  const char *name, *help;
  size_t offset; /* of a uint64_t in distd_peer_stats */
} peer_counters[] = {
    {"distd_peer_bytes_sent_total", "Bytes sent to the peer on the data plane",
     offsetof(distd_peer_stats, bytes_sent)},
    {"distd_peer_bytes_received_total", "Bytes received from the peer on the data plane",
     offsetof(distd_peer_stats, bytes_received)},
    {"distd_peer_unexpected_expired_total",
     "Frames from the peer kept aside longer than peer_unexpected_max_age without "
     "their receive, and dropped",
     offsetof(distd_peer_stats, unexpected_expired)},
    {"distd_peer_unexpected_expired_bytes_total",
     "Bytes of the frames from the peer dropped after peer_unexpected_max_age",
     offsetof(distd_peer_stats, unexpected_expired_bytes)},
    {"distd_peer_tls_revoked_closures_total",
     "Open connections with the peer closed because a reloaded tls_crl revoked its "
     "certificate",
     offsetof(distd_peer_stats, revoked_closures)},
    {"distd_peer_tls_untrusted_closures_total",
     "Open connections with the peer closed because a reloaded tls_ca or tls_crl no "
     "longer verifies its certificate chain, for another reason than a revocation",
     offsetof(distd_peer_stats, untrusted_closures)},
    {"distd_peer_ctl_dropped_total",
     "ABORT and ABORT_RANGE frames to the peer dropped: no memory for them and all its "
     "spare control frames queued (the peer may wait for those ops until their deadline)",
     offsetof(distd_peer_stats, ctl_dropped)},
};

static uint64_t peer_counter_value(const distd_peer_stats *st, const struct peer_counter *pc) {
  return *(const uint64_t *)((const char *)st + pc->offset);
}

/* The kinds that go through a peer's send queue (distd_peer_stats). */
static const unsigned queued_kinds[] = {DIST_FRAME_DATA, DIST_FRAME_ABORT, DIST_FRAME_PING,
                                        DIST_FRAME_ABORT_RANGE};

static void write_frames_sent(const distd_server *s, const distd_peer_stats *stats,
                              struct evbuffer *out) {
  distd_metrics_gauge_header(out, "distd_peer_frames_sent_total", "counter",
                             "Frames written to the peer, by kind (data, abort, ping, "
                             "abort_range; not the handshake's, pong or close)");
  for (int r = 0; r < s->world_size; r++)
    for (size_t k = 0; k < sizeof queued_kinds / sizeof queued_kinds[0] && r != s->rank; k++)
      evbuffer_add_printf(out, "distd_peer_frames_sent_total{peer=\"%d\",kind=\"%s\"} %llu\n",
                          r, dist_frame_kind_name(queued_kinds[k]),
                          (unsigned long long)stats[r].frames_sent[queued_kinds[k]]);
}

static void write_peer_gauges(distd_server *s, struct evbuffer *out) {
  distd_peer_stats *stats = calloc((size_t)s->world_size, sizeof *stats);
  if (!stats) return;
  for (int r = 0; r < s->world_size; r++)
    if (r != s->rank) distd_peers_get_stats(s->peers, r, &stats[r]);
  distd_metrics_gauge_header(out, "distd_peer_connected", "gauge",
                             "1 when both directions to the peer are up");
  for (int r = 0; r < s->world_size; r++)
    if (r != s->rank)
      evbuffer_add_printf(out, "distd_peer_connected{peer=\"%d\"} %d\n", r, stats[r].connected);
  for (size_t k = 0; k < sizeof peer_counters / sizeof peer_counters[0]; k++) {
    const struct peer_counter *pc = &peer_counters[k];
    distd_metrics_gauge_header(out, pc->name, "counter", pc->help);
    for (int r = 0; r < s->world_size; r++)
      if (r != s->rank)
        evbuffer_add_printf(out, "%s{peer=\"%d\"} %llu\n", pc->name, r,
                            (unsigned long long)peer_counter_value(&stats[r], pc));
  }
  write_frames_sent(s, stats, out);
  free(stats);
}

/* Daemon-wide, not per peer: a transfer's sends may go to several. Always
 * listed, so that an alert can watch it stay 0. */
static void write_reserve_mismatches(distd_server *s, struct evbuffer *out) {
  distd_metrics_gauge_header(out, "distd_peer_reserve_mismatches_total", "counter",
                             "Data-plane transfers whose sends took more or fewer send items "
                             "than were reserved for them (a bug: a send past its reservation "
                             "allocates, and can fail midway)");
  evbuffer_add_printf(out, "distd_peer_reserve_mismatches_total %llu\n",
                      (unsigned long long)distd_peers_reserve_mismatches(s->peers));
}

/* A date gauge (seconds since the epoch), when there is one. */
static void write_date(struct evbuffer *out, const char *name, const char *help,
                       const int64_t *value) {
  int64_t t = __atomic_load_n(value, __ATOMIC_RELAXED);
  if (!t) return;
  distd_metrics_gauge_header(out, name, "gauge", help);
  evbuffer_add_printf(out, "%s %lld\n", name, (long long)t);
}

void distd_write_metrics(void *server, struct evbuffer *out) {
  distd_server *s = server;
  distd_metrics_write(s->metrics, out);
  uint64_t used = 0, limit = 0;
  int count = 0;
  distd_store_usage(s->store, &used, &limit, &count);
  distd_metrics_gauge_header(out, "distd_tensor_bytes", "gauge",
                             "Bytes of tensor memory held");
  evbuffer_add_printf(out, "distd_tensor_bytes %llu\n", (unsigned long long)used);
  distd_metrics_gauge_header(out, "distd_tensors", "gauge", "Tensors held");
  evbuffer_add_printf(out, "distd_tensors %d\n", count);
  /* A client that never releases what it invoked shows here as growth. */
  distd_metrics_gauge_header(out, "distd_invocations_kept", "gauge",
                             "LocalLayer invocations kept for a backward");
  evbuffer_add_printf(out, "distd_invocations_kept %d\n", distd_registry_live(s->programs));
  distd_metrics_gauge_header(out, "distd_peers_connected", "gauge",
                             "Peers with both directions connected");
  evbuffer_add_printf(out, "distd_peers_connected %d\n",
                      distd_peers_connected_count(s->peers));
  distd_metrics_gauge_header(out, "distd_uptime_seconds", "gauge",
                             "Seconds since the daemon started");
  evbuffer_add_printf(out, "distd_uptime_seconds %.3f\n",
                      distd_now_s() - s->start_time);
  write_date(out, "distd_tls_certificate_expiry_timestamp_seconds",
             "When tls_cert expires (notAfter), in seconds since the epoch",
             &s->tls_cert_not_after);
  write_date(out, "distd_tls_crl_next_update_timestamp_seconds",
             "The earliest next update of tls_crl's CRLs: past it, certificates of "
             "that issuer are refused", &s->tls_crl_next_update);
  write_peer_gauges(s, out);
  write_reserve_mismatches(s, out);
  distd_ops_write_metrics(s, out);
  distd_param_write_metrics(s, out);
}

int distd_readiness(void *server, char *why, size_t len) {
  distd_server *s = server;
  size_t used = 0;
  why[0] = 0;
  for (int r = 0; r < s->world_size; r++) {
    distd_peer_stats st;
    if (r == s->rank) continue;
    distd_peers_get_stats(s->peers, r, &st);
    if (!st.connected && used < len)
      used += (size_t)snprintf(why + used, len - used, "%speer %d not connected",
                               used ? ", " : "", r);
  }
  return why[0] == 0;
}
