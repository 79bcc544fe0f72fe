/* distd's configuration: the struct and the one table that fills it. */
#ifndef DISTD_CONFIG_H
#define DISTD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
/* By path: a plain "config.h" here would find this very file again. */
#include "../common/config.h"

#define DISTD_DEFAULT_PORT 7470 /* gRPC; the data plane takes +1, HTTP +2 */
#define DISTD_DEFAULT_LISTEN "127.0.0.1:7470"
/* peer_unexpected_max_age 0: this many peer_timeouts. A receive may be
 * posted long after its frame came (the sender does not wait for it), but
 * a trainer that lags its peers by ten silence timeouts is gone. */
#define DISTD_UNEXPECTED_AGE_PER_TIMEOUT 10

typedef struct distd_config {
  char *listen;        /* gRPC address, default 127.0.0.1:7470 */
  char *peer_listen;   /* data-plane address; "" = from the cluster entry */
  char *http_listen;   /* metrics/health address; "" = grpc port + 2, "off" */
  char *cluster_file;  /* daemons in rank order */
  char *peers;         /* or: comma-separated list, in rank order */
  int64_t rank;
  char *cluster_id;
  uint64_t memory_limit;   /* tensor bytes; 0 = unlimited */
  uint64_t max_message_size;
  int64_t peer_timeout_ms;
  int64_t peer_unexpected_max_age_ms; /* 0 = UNEXPECTED_AGE_PER_TIMEOUT x peer_timeout */
  int64_t connect_backoff_min_ms;
  int64_t connect_backoff_max_ms;
  int64_t peer_spin_us;
  int peer_io_uring; /* batch the driver's system calls (peer_batch.h) */
  uint64_t peer_socket_buffer; /* SO_SNDBUF/SO_RCVBUF of peer sockets; 0 = autotuning */
  char *peer_congestion; /* TCP_CONGESTION of peer sockets; "" = system default */
  int64_t rpc_threads;
  char *cpu_affinity;          /* CPU list the process is pinned to; "" = none */
  int log_level;   /* index into {"error","warn","info","debug"} */
  int log_format;  /* index into {"plain","json"} */
  /* Security (docs/security.md). Paths are "" when unset. */
  char *tls_cert;        /* PEM certificate of this daemon (gRPC and peers) */
  char *tls_key;         /* its private key */
  char *tls_ca;          /* CA that signs peers' and clients' certificates */
  char *tls_crl;         /* PEM CRLs of tls_ca's issuers; "" = none */
  int tls_client_auth;   /* DISTD_CLIENT_AUTH_*: gRPC client certificates */
  int peer_tls;          /* DISTD_PEER_TLS_*: TLS on the data plane */
  char *auth_tokens_file; /* "TOKEN ROLE" lines; "" = no token checks */
  /* Limits. */
  uint64_t max_tensor_bytes;     /* tensor bytes in one request; 0 = none */
  int64_t max_inflight_per_client; /* concurrent calls per client; 0 = none */
  int64_t max_call_duration_ms;  /* server-side bound on every call */
  uint64_t max_frame_size;       /* largest peer DATA frame accepted */
} distd_config;

enum { DISTD_CLIENT_AUTH_NONE, DISTD_CLIENT_AUTH_OPTIONAL,
       DISTD_CLIENT_AUTH_REQUIRE };
enum { DISTD_PEER_TLS_AUTO, DISTD_PEER_TLS_ON, DISTD_PEER_TLS_OFF };

/* Whether the data plane runs TLS: peer_tls=on, or auto with tls_cert set. */
int distd_config_peer_tls(const distd_config *cfg);

extern const dist_cfg_table distd_config_table;

/* Reads the membership from cfg->cluster_file or cfg->peers (comma
 * separated, same syntax as a cluster file line). With neither set the world
 * is one rank at cfg->listen. Checks cfg->rank < world size. *members is
 * malloc'd. */
int distd_members_load(const distd_config *cfg, dist_member **members,
                       int *world_size, dist_errbuf *eb);

#endif
