/* distd's configuration table, and the cluster membership it names. */
#include "config.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static const char *const log_levels[] = {"error", "warn", "info", "debug",
                                         NULL};
static const char *const log_formats[] = {"plain", "json", NULL};
static const char *const client_auth_modes[] = {"none", "optional", "require",
                                                NULL};
static const char *const peer_tls_modes[] = {"auto", "on", "off", NULL};

#define MS_PER_HOUR (3600 * 1000)
/* gRPC keeps message sizes in an int. */
#define GRPC_MAX_MESSAGE 2147483647

#define OPT(field, type, def, min, max, choices, help)                       \
  {#field, type, offsetof(distd_config, field), def, min, max, choices, help}
#define OPT_AS(name, field, type, def, min, max, help)                       \
  {name, type, offsetof(distd_config, field), def, min, max, NULL, help}

static const dist_cfg_option options[] = {
    OPT(listen, DIST_CFG_STRING, DISTD_DEFAULT_LISTEN, 0, 0, NULL,
        "Address (HOST:PORT) of the gRPC service for clients and distctl."),
    OPT(peer_listen, DIST_CFG_STRING, "", 0, 0, NULL,
        "Address of the data plane, where the other daemons connect; empty "
        "means the one this rank's cluster entry names."),
    OPT(http_listen, DIST_CFG_STRING, "", 0, 0, NULL,
        "Address of the HTTP port for /metrics, /healthz and /readyz; empty "
        "means the gRPC port + 2 on the gRPC host, \"off\" disables it."),
    OPT(cluster_file, DIST_CFG_STRING, "", 0, 0, NULL,
        "Cluster file: the daemons in rank order, one HOST:PORT "
        "[PEER_HOST:PEER_PORT] per line."),
    OPT(peers, DIST_CFG_STRING, "", 0, 0, NULL,
        "Instead of a cluster file: the daemons in rank order, comma "
        "separated, each written like a cluster file line."),
    OPT(rank, DIST_CFG_INT, "0", 0, 65535, NULL,
        "This daemon's rank, its index in the cluster file or peer list."),
    OPT(cluster_id, DIST_CFG_STRING, "distd", 0, 0, NULL,
        "Name of the cluster; daemons refuse peers that give another one."),
    OPT(memory_limit, DIST_CFG_SIZE, "0", 0, 0, NULL,
        "Most tensor memory this daemon holds; 0 means no limit."),
    OPT(max_message_size, DIST_CFG_SIZE, "1G", 1024, GRPC_MAX_MESSAGE, NULL,
        "Largest gRPC or peer message accepted or sent."),
    OPT_AS("peer_timeout", peer_timeout_ms, DIST_CFG_DURATION, "30s", 10,
           MS_PER_HOUR,
           "Longest a wait on peers may go without a byte moving for it; the "
           "call then fails naming the ranks it waited on."),
    OPT_AS("peer_unexpected_max_age", peer_unexpected_max_age_ms, DIST_CFG_DURATION, "0",
           0, 24 * MS_PER_HOUR,
           "Longest a frame that arrived before its receive is kept aside; "
           "then it is dropped, logged and counted (a trainer that died "
           "before calling never posts its receive); a receive posted "
           "later fails at once. 0 means 10 times peer_timeout."),
    OPT_AS("connect_backoff_min", connect_backoff_min_ms, DIST_CFG_DURATION,
           "100ms", 1, MS_PER_HOUR,
           "First wait before reconnecting to a peer that is down."),
    OPT_AS("connect_backoff_max", connect_backoff_max_ms, DIST_CFG_DURATION,
           "5s", 1, MS_PER_HOUR,
           "Longest wait between reconnection attempts (the wait doubles "
           "from connect_backoff_min up to this)."),
    OPT(peer_spin_us, DIST_CFG_INT, "5000", 0, 1000000, NULL,
        "Microseconds a worker waiting on peers polls its sockets (yielding "
        "the CPU between polls) before it sleeps; spends CPU to save the "
        "wake-up latency of small transfers. 0 sleeps at once."),
    OPT(peer_io_uring, DIST_CFG_BOOL, "true", 0, 0, NULL,
        "Make a waiting worker's data-plane reads and writes of one pass in "
        "one io_uring system call instead of one call each; where io_uring "
        "is not available (kernel, seccomp) distd logs why and makes them "
        "one by one."),
    OPT(peer_congestion, DIST_CFG_STRING, "reno", 0, 0, NULL,
        "TCP congestion control of the data-plane connections; empty keeps "
        "the system default. They live as long as the daemons, and BBR's "
        "pacing, learnt in one phase of large transfers, slows the next."),
    OPT(peer_socket_buffer, DIST_CFG_SIZE, "0", 0, 1 << 30, NULL,
        "SO_SNDBUF and SO_RCVBUF asked for each data-plane socket (the kernel "
        "caps them at net.core.wmem_max / rmem_max, doubled); 0 leaves the "
        "kernel's autotuning on, which keeps less data in flight and so more "
        "of it in cache when the receiver copies it out."),
    OPT(rpc_threads, DIST_CFG_INT, "8", 1, 256, NULL,
        "Number of threads serving gRPC calls."),
    OPT(cpu_affinity, DIST_CFG_STRING, "", 0, 0, NULL,
        "CPUs this daemon's threads run on, as a list such as 0, 0-3 or "
        "0,2-3; empty leaves them where the system puts them. Daemons "
        "sharing a few cores are faster each on its own (distctl cluster up "
        "--pin does this)."),
    OPT(log_level, DIST_CFG_ENUM, "info", 0, 0, log_levels,
        "Least severe log messages written."),
    OPT(log_format, DIST_CFG_ENUM, "plain", 0, 0, log_formats,
        "Log lines on stderr: plain text or one JSON object per line."),
    OPT(tls_cert, DIST_CFG_STRING, "", 0, 0, NULL,
        "PEM certificate of this daemon, served on the gRPC port and to its "
        "peers; empty means plain TCP (docs/security.md)."),
    OPT(tls_key, DIST_CFG_STRING, "", 0, 0, NULL,
        "PEM private key of tls_cert."),
    OPT(tls_ca, DIST_CFG_STRING, "", 0, 0, NULL,
        "PEM CA certificate(s) that sign the other daemons' and the clients' "
        "certificates."),
    OPT(tls_crl, DIST_CFG_STRING, "", 0, 0, NULL,
        "PEM certificate revocation lists, one per issuer of the peers' and "
        "clients' certificates (each issuer's certificate in tls_ca): a "
        "revoked certificate is refused, as is one whose issuer has no "
        "current CRL here. Empty: no revocation checks."),
    OPT(tls_client_auth, DIST_CFG_ENUM, "none", 0, 0, client_auth_modes,
        "Client certificates on the gRPC port: none, optional (verified when "
        "sent) or require (mutual TLS)."),
    OPT(peer_tls, DIST_CFG_ENUM, "auto", 0, 0, peer_tls_modes,
        "Mutual TLS between daemons: auto (on when tls_cert is set), on or "
        "off. A peer's certificate must name its rank as DNS:distd-rank-N."),
    OPT(auth_tokens_file, DIST_CFG_STRING, "", 0, 0, NULL,
        "Bearer tokens, one \"TOKEN ROLE\" per line (role read-only or "
        "read-write); empty means every client may call everything."),
    OPT(max_tensor_bytes, DIST_CFG_SIZE, "0", 0, 0, NULL,
        "Most tensor bytes one request may carry; 0 means only "
        "max_message_size limits them."),
    OPT(max_inflight_per_client, DIST_CFG_INT, "0", 0, 1000000, NULL,
        "Most calls one client (token, or host without tokens) may have in "
        "progress at once; 0 means no limit."),
    OPT_AS("max_call_duration", max_call_duration_ms, DIST_CFG_DURATION,
           "10m", 100, 24 * MS_PER_HOUR,
           "Longest any call may run, whatever deadline its client gave."),
    OPT(max_frame_size, DIST_CFG_SIZE, "1G", 1024, (int64_t)1 << 40, NULL,
        "Largest data-plane frame accepted from a peer; a longer one closes "
        "the connection."),
};

int distd_config_peer_tls(const distd_config *cfg) {
  if (cfg->peer_tls == DISTD_PEER_TLS_AUTO) return cfg->tls_cert[0] != 0;
  return cfg->peer_tls == DISTD_PEER_TLS_ON;
}

const dist_cfg_table distd_config_table = {
    "distd", "DISTD_", options, sizeof options / sizeof options[0]};

/* "a:1, b:2" -> "a:1\nb:2\n", so each peer is parsed like a cluster file
 * line and entry N is reported as "peers:N". */
static int peers_to_lines(const char *peers, char **text, dist_errbuf *eb) {
  size_t len = strlen(peers);
  char *out = malloc(len + 2);
  if (!out) return dist_fail(eb, DIST_ENOMEM, "peers: out of memory");
  const char *p = peers;
  size_t used = 0;
  for (int entry = 1;; entry++) {
    size_t n = strcspn(p, ",");
    const char *start = p, *end = p + n;
    while (start < end && (*start == ' ' || *start == '\t')) start++;
    while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
    if (start == end) {
      free(out);
      return dist_fail(eb, DIST_ECONFIG, "peers: entry %d is empty in '%s'",
                       entry, peers);
    }
    memcpy(out + used, start, (size_t)(end - start));
    used += (size_t)(end - start);
    out[used++] = '\n';
    if (!p[n]) break;
    p += n + 1;
  }
  out[used] = 0;
  *text = out;
  return 0;
}

static int read_members(const distd_config *cfg, dist_member **members,
                        int *count, dist_errbuf *eb) {
  int rc;
  char *text = NULL;
  if (cfg->cluster_file[0] && cfg->peers[0])
    return dist_fail(eb, DIST_ECONFIG,
                     "cluster_file and peers are both set; give only one");
  if (cfg->cluster_file[0])
    return dist_cluster_load(cfg->cluster_file, members, count, eb);
  if (cfg->peers[0]) {
    rc = peers_to_lines(cfg->peers, &text, eb);
    if (rc == 0) rc = dist_cluster_parse(text, "peers", members, count, eb);
    free(text);
    return rc;
  }
  /* A world of one: this daemon, its data plane derived from its gRPC
   * address by the same rule as a cluster file line. */
  return dist_cluster_parse(cfg->listen, "listen", members, count, eb);
}

int distd_members_load(const distd_config *cfg, dist_member **members,
                       int *world_size, dist_errbuf *eb) {
  dist_member *m = NULL;
  int n = 0;
  *members = NULL;
  *world_size = 0;
  int rc = read_members(cfg, &m, &n, eb);
  if (rc < 0) {
    /* Whatever went wrong, it is the configuration that is bad. */
    if (eb) eb->code = DIST_ECONFIG;
    rc = DIST_ECONFIG;
    goto out;
  }
  if (cfg->rank >= n) {
    rc = dist_fail(eb, DIST_ECONFIG,
                   "rank %lld is out of range: the cluster has %d daemon%s",
                   (long long)cfg->rank, n, n == 1 ? "" : "s");
    goto out;
  }
  *members = m;
  *world_size = n;
  m = NULL;
out:
  free(m);
  return rc;
}
