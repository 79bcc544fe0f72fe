/* distctl status / distctl peers: one Info call per daemon, all at once
 * (distctl_ask_each), each bounded by the client deadline. A daemon that
 * does not answer is shown as down and makes the exit status 1. */
#include <stdlib.h>
#include <string.h>

#include "distctl.h"

typedef struct daemon_state {
  int ok;
  char error[512];
  dist_daemon_info info;
} daemon_state;

static int ask_info(dist_client *one, void *slot, void *arg) {
  (void)arg;
  return dist_info(one, 0, &((daemon_state *)slot)->info);
}

/* Every daemon's state, or NULL when out of memory (said on stderr). */
static daemon_state *ask_all(const distctl_global *g, dist_client *c, int *down) {
  int n = dist_world_size(c);
  void *slots;
  distctl_answer *a = distctl_ask_each(g, c, ask_info, NULL, sizeof(daemon_state), &slots, down);
  if (!a) return NULL;
  daemon_state *st = slots;
  for (int r = 0; r < n; r++) {
    st[r].ok = a[r].ok;
    snprintf(st[r].error, sizeof st[r].error, "%s", a[r].error);
  }
  free(a);
  return st;
}

static void free_all(daemon_state *st, int n) {
  for (int r = 0; r < n; r++) dist_info_free(&st[r].info);
  free(st);
}

static json_t *peer_json(const dist_peer_info *p) {
  return json_pack("{s:i,s:s,s:b,s:f,s:I,s:I,s:i,s:s}", "rank", p->rank, "address",
                   p->address, "connected", p->connected, "rtt_seconds",
                   p->rtt_seconds, "bytes_sent", (json_int_t)p->bytes_sent,
                   "bytes_received", (json_int_t)p->bytes_received, "reconnects",
                   (int)p->reconnects, "congestion", p->congestion);
}

static json_t *daemon_json(dist_client *c, int r, const daemon_state *s) {
  if (!s->ok)
    return json_pack("{s:o,s:s,s:b,s:s}", "rank", distctl_rank_json(c, r), "endpoint",
                     dist_endpoint(c, r), "healthy", 0, "error", s->error);
  const dist_daemon_info *i = &s->info;
  json_t *peers = json_array();
  int up = 0;
  for (int p = 0; p < i->npeers; p++) {
    json_array_append_new(peers, peer_json(&i->peers[p]));
    up += i->peers[p].connected;
  }
  return json_pack("{s:i,s:s,s:b,s:s,s:s,s:i,s:f,s:I,s:I,s:i,s:i,s:i,s:s,s:s,s:o}",
                   "rank", i->rank, "endpoint", dist_endpoint(c, r), "healthy",
                   up == i->npeers, "version", i->version, "cluster_id",
                   i->cluster_id, "world_size", i->world_size, "uptime_seconds",
                   i->uptime_seconds, "tensor_bytes", (json_int_t)i->tensor_bytes,
                   "tensor_bytes_limit", (json_int_t)i->tensor_bytes_limit,
                   "tensors", (int)i->tensor_count, "ops_in_flight",
                   (int)i->ops_in_flight, "peers_connected", up, "http_address",
                   i->http_address, "peer_io", i->peer_io, "peers", peers);
}

static void print_table(dist_client *c, const daemon_state *st, int n) {
  printf("%-5s %-22s %-8s %-10s %8s %12s %-7s %-4s %-15s %s\n", "RANK", "ENDPOINT",
         "STATE", "VERSION", "UPTIME", "MEMORY", "TENSORS", "OPS", "PEERS", "PEER I/O");
  for (int r = 0; r < n; r++) {
    if (!st[r].ok) {
      distctl_print_down_row(dist_daemon_rank(c, r), dist_endpoint(c, r), st[r].error);
      continue;
    }
    const dist_daemon_info *i = &st[r].info;
    int up = 0;
    for (int p = 0; p < i->npeers; p++) up += i->peers[p].connected;
    char mem[32];
    dist_format_bytes(i->tensor_bytes, mem, sizeof mem);
    char peers[32];
    snprintf(peers, sizeof peers, "%d/%d connected", up, i->npeers);
    printf("%-5d %-22s %-8s %-10s %7.0fs %12s %-7u %-4u %-15s %s\n", i->rank,
           dist_endpoint(c, r), up == i->npeers ? "healthy" : "degraded",
           i->version, i->uptime_seconds, mem, i->tensor_count, i->ops_in_flight, peers,
           i->peer_io);
  }
}

static int report_down(dist_client *c, const daemon_state *st, int n) {
  for (int r = 0; r < n; r++)
    if (!st[r].ok) distctl_fail("%s", st[r].error);
  (void)c;
  return 1;
}

static int run_status(const distctl_global *g, int argc, char **argv) {
  if (distctl_take_options(&distctl_cmd_status, argc, argv, NULL) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int n = dist_world_size(c), down = 0;
  daemon_state *st = ask_all(g, c, &down);
  if (!st) return dist_close(c), 1;
  if (g->json) {
    json_t *ranks = json_array();
    for (int r = 0; r < n; r++) json_array_append_new(ranks, daemon_json(c, r, &st[r]));
    distctl_print_json(json_pack("{s:i,s:i,s:o}", "world_size", n, "down", down,
                                 "ranks", ranks));
  } else {
    print_table(c, st, n);
  }
  int rc = down ? report_down(c, st, n) : 0;
  free_all(st, n);
  dist_close(c);
  return rc;
}

static int run_peers(const distctl_global *g, int argc, char **argv) {
  if (distctl_take_options(&distctl_cmd_peers, argc, argv, NULL) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int n = dist_world_size(c), down = 0;
  daemon_state *st = ask_all(g, c, &down);
  if (!st) return dist_close(c), 1;
  json_t *pairs = json_array();
  if (!g->json)
    printf("%-5s %-5s %-10s %10s %12s %12s %-10s %s\n", "FROM", "TO", "STATE", "RTT",
           "SENT", "RECEIVED", "RECONNECTS", "CONGESTION");
  for (int r = 0; r < n; r++) {
    for (int p = 0; st[r].ok && p < st[r].info.npeers; p++) {
      const dist_peer_info *q = &st[r].info.peers[p];
      json_t *j = peer_json(q);
      json_object_set_new(j, "from", json_integer(st[r].info.rank));
      json_array_append_new(pairs, j);
      if (g->json) continue;
      char sent[32], recv[32];
      dist_format_bytes(q->bytes_sent, sent, sizeof sent);
      dist_format_bytes(q->bytes_received, recv, sizeof recv);
      printf("%-5d %-5d %-10s %8.0fus %12s %12s %-10u %s\n", st[r].info.rank, q->rank,
             q->connected ? "connected" : "down", q->rtt_seconds * 1e6, sent, recv,
             q->reconnects, q->congestion[0] ? q->congestion : "-");
    }
    char rank[16];
    if (!st[r].ok && !g->json)
      printf("%-5s %-5s %-10s %s\n", distctl_rank_text(c, r, rank, sizeof rank), "*",
             "unreachable", st[r].error);
  }
  if (g->json)
    distctl_print_json(json_pack("{s:i,s:o}", "world_size", n, "pairs", pairs));
  else
    json_decref(pairs);
  int rc = down ? report_down(c, st, n) : 0;
  free_all(st, n);
  dist_close(c);
  return rc;
}

const distctl_command distctl_cmd_status = {
    .name = "status",
    .help = "version, uptime, memory, tensors and peers of every daemon",
    .run = run_status,
    .options = distctl_no_options};
const distctl_command distctl_cmd_peers = {
    .name = "peers",
    .help = "the peer connection matrix with round-trip times, bytes and congestion control",
    .run = run_peers,
    .options = distctl_no_options};
