/* The state of one running daemon, passed to every module (no globals). */
#ifndef DISTD_SERVER_H
#define DISTD_SERVER_H

#include <pthread.h>
#include <stdint.h>

#include "clock.h"
#include "cluster.h"
#include "config.h"

struct event_base;
struct event;
typedef struct distd_peers distd_peers;
typedef struct distd_http distd_http;
typedef struct distd_metrics distd_metrics;
typedef struct distd_store distd_store;
typedef struct distd_rpc distd_rpc;
typedef struct distd_program_registry distd_program_registry;
typedef struct distd_experts distd_experts;
typedef struct distd_params distd_params;
typedef struct distd_holds distd_holds;
typedef struct distd_ckpt_saves distd_ckpt_saves;

typedef struct distd_server {
  distd_config cfg;
  dist_member *members; /* world_size entries, rank order */
  int world_size;
  int rank;
  double start_time;    /* CLOCK_MONOTONIC seconds at start */
  char grpc_address[256];

  struct event_base *base; /* the loop: peers, HTTP, timers */
  pthread_t loop_thread;
  distd_peers *peers;
  distd_http *http;
  distd_metrics *metrics;
  distd_store *store;
  distd_rpc *rpc;
  /* What RPC handlers keep between calls: registered LocalLayer programs
   * and their invocations, expert layers, parameters' optimizer state.
   * Made before the gRPC server starts; freed after its workers are gone
   * and before the store, whose memory they hold references and
   * reservations on. */
  distd_program_registry *programs;
  distd_experts *experts;
  distd_params *params;
  distd_holds *holds; /* requests on one name, ordered (holds.h) */
  distd_ckpt_saves *ckpt_saves; /* checkpoint saves in progress (ckpt_saves.h) */
  /* The TLS files in use, in seconds since the epoch (0: none), for
   * /metrics: written at start and by a reload (atomic). */
  int64_t tls_cert_not_after, tls_crl_next_update;
  int ops_in_flight; /* RPCs being handled (atomic) */
  uint64_t calls_done; /* RPCs handled so far (atomic; memory.h) */
  int grpc_initialized;
} distd_server;

#endif
