#include "daemon.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <grpc/grpc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_saves.h"
#include "experts.h"
#include "holds.h"
#include "http.h"
#include "log.h"
#include "memory.h"
#include "methods.h"
#include "metrics.h"
#include "notify.h"
#include "param_service.h"
#include "peer.h"
#include "program_registry.h"
#include "rpc.h"
#include "store.h"
#include "tls.h"

#define SHUTDOWN_GRACE_MS 5000

static struct event *watchdog_ev, *memory_ev;

static void *loop_main(void *arg) {
  distd_server *s = arg;
  pthread_setname_np(pthread_self(), "distd-loop"); /* for top -H, perf */
  event_base_loop(s->base, EVLOOP_NO_EXIT_ON_EMPTY);
  return NULL;
}

/* "host:port" of the configured address with another port. */
static int derive_address(const char *addr, int port_delta, char *out,
                          size_t len, dist_errbuf *eb) {
  char host[256];
  int port = 0;
  if (dist_split_hostport(addr, host, sizeof host, &port, eb) != 0) return -1;
  snprintf(out, len, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host,
           port ? port + port_delta : 0);
  return 0;
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  distd_server *s = arg;
  char state[160];
  snprintf(state, sizeof state,
           "WATCHDOG=1\nSTATUS=rank %d of %d, %d/%d peers connected", s->rank,
           s->world_size, distd_peers_connected_count(s->peers),
           s->world_size - 1);
  distd_notify(state);
}

static void start_watchdog(distd_server *s) {
  int64_t ms = distd_notify_watchdog_ms();
  if (ms <= 0) return;
  struct timeval tv = {(time_t)(ms / 2000), (suseconds_t)((ms / 2) % 1000) * 1000};
  watchdog_ev = event_new(s->base, -1, EV_PERSIST, on_watchdog, s);
  event_add(watchdog_ev, &tv);
}

/* Gives freed memory back once the daemon is idle (memory.h). */
static void on_memory_tick(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  distd_server *s = arg;
  int busy = __atomic_load_n(&s->ops_in_flight, __ATOMIC_SEQ_CST) > 0;
  uint64_t done = __atomic_load_n(&s->calls_done, __ATOMIC_RELAXED);
  if (distd_memory_tick(distd_now_ms(), done, busy)) log_debug("idle: freed memory given back");
}

static void start_memory_tick(distd_server *s) {
  struct timeval tv = {1, 0};
  memory_ev = event_new(s->base, -1, EV_PERSIST, on_memory_tick, s);
  event_add(memory_ev, &tv);
}

static int64_t unexpected_max_age_ms(const distd_config *cfg) {
  if (cfg->peer_unexpected_max_age_ms > 0) return cfg->peer_unexpected_max_age_ms;
  return DISTD_UNEXPECTED_AGE_PER_TIMEOUT * cfg->peer_timeout_ms;
}

static int start_peers(distd_server *s, const distd_tls_files *tls, dist_errbuf *eb) {
  distd_peers_opts po = {
      .rank = s->rank,
      .world_size = s->world_size,
      .members = s->members,
      .cluster_id = s->cfg.cluster_id,
      .backoff_min_ms = s->cfg.connect_backoff_min_ms,
      .backoff_max_ms = s->cfg.connect_backoff_max_ms,
      .unexpected_limit = 256u << 20,
      .unexpected_max_age_ms = unexpected_max_age_ms(&s->cfg),
      .max_frame_size = s->cfg.max_frame_size,
      .silence_timeout_ms = s->cfg.peer_timeout_ms,
      .spin_us = s->cfg.peer_spin_us,
      .no_io_uring = !s->cfg.peer_io_uring,
      .congestion = s->cfg.peer_congestion,
      .socket_buffer = (size_t)s->cfg.peer_socket_buffer,
  };
  if (distd_config_peer_tls(&s->cfg)) po.tls = tls;
  if (s->cfg.peer_listen[0])
    snprintf(s->members[s->rank].peer_addr,
             sizeof s->members[s->rank].peer_addr, "%s", s->cfg.peer_listen);
  int rc = distd_peers_start(&s->peers, s->base, &po, eb);
  if (rc != 0) dist_errbuf_prefix(eb, "data plane: ");
  return rc;
}

static int start_http(distd_server *s, dist_errbuf *eb) {
  char addr[300];
  const char *http = s->cfg.http_listen;
  if (strcmp(http, "off") == 0) return 0;
  if (!http[0]) {
    if (derive_address(s->cfg.listen, 2, addr, sizeof addr, eb) != 0) return -1;
    http = addr;
  }
  distd_http_hooks hooks = {s, distd_write_metrics, distd_readiness};
  return distd_http_start(&s->http, s->base, http, &hooks, eb);
}

/* How long a checkpoint save's files are kept for its commit after this
 * daemon answered its Save (ckpt_saves.h). A client saves on one daemon
 * after the other, each call bounded by max_call_duration here, then
 * commits: rank 0's commit can come world_size - 1 Save calls and the
 * commit itself after its answer. Kept too long, an abandoned save's files
 * wait longer for a commit to remove them; too short, a commit removes the
 * files of a save that then commits a manifest naming them. */
static int64_t save_commit_window_ms(const distd_server *s) {
  return (int64_t)(s->world_size + 1) * s->cfg.max_call_duration_ms;
}

/* The state RPC handlers keep between calls (see server.h). */
static int create_registries(distd_server *s, dist_errbuf *eb) {
  s->programs = distd_registry_new(0);
  s->experts = distd_experts_new();
  s->params = distd_params_new(s->rank);
  s->holds = distd_holds_new(s->rank);
  s->ckpt_saves = distd_ckpt_saves_new(save_commit_window_ms(s));
  if (!s->programs || !s->experts || !s->params || !s->holds || !s->ckpt_saves)
    return dist_fail(eb, DIST_ENOMEM, "out of memory creating the program, "
                     "expert and parameter registries");
  return 0;
}

/* Before the store: they return tensors and reservations to it. */
static void free_registries(distd_server *s) {
  distd_registry_free(s->programs);
  distd_experts_free(s->experts);
  distd_params_free(s->params);
  distd_holds_free(s->holds);
  distd_ckpt_saves_free(s->ckpt_saves);
  s->programs = NULL;
  s->experts = NULL;
  s->params = NULL;
  s->holds = NULL;
  s->ckpt_saves = NULL;
}

/* Certificates and CRLs stop working at a date of their own: past a CRL's
 * next update every certificate of its issuer is refused. The dates go to
 * /metrics for alerts, and the log warns a day (a CRL) or a week (the
 * certificate) ahead. */
static void note_tls_dates(distd_server *s, const distd_tls_files *f) {
  int64_t crl = dist_crl_next_update(f->crls), now = (int64_t)time(NULL);
  __atomic_store_n(&s->tls_cert_not_after, f->cert_not_after, __ATOMIC_RELAXED);
  __atomic_store_n(&s->tls_crl_next_update, crl, __ATOMIC_RELAXED);
  if (crl && crl - now < 86400)
    log_warn("tls_crl %s: its next update is in %.1f h; past it every certificate of "
             "its issuer is refused: write a new CRL and reload", f->crl_path,
             (double)(crl - now) / 3600);
  if (f->cert_not_after && f->cert_not_after - now < 7 * 86400)
    log_warn("tls_cert %s expires in %.1f days: rotate it and reload", f->cert_path,
             (double)(f->cert_not_after - now) / 86400);
}

int distd_start(distd_server *s, dist_errbuf *eb) {
  s->start_time = distd_now_s();
  evthread_use_pthreads();
  s->base = event_base_new();
  s->metrics = distd_metrics_new(DIST_VERSION);
  s->store = distd_store_new(s->cfg.memory_limit);
  if (!s->base || !s->metrics || !s->store)
    return dist_fail(eb, DIST_ENOMEM, "out of memory for the event loop, metrics or store");
  if (create_registries(s, eb) != 0) return -1;
  /* The certificate files are read once, for the data plane and gRPC. */
  distd_tls_files tls;
  if (distd_tls_check_config(&s->cfg, eb) != 0 ||
      distd_tls_files_read(&s->cfg, &tls, eb) != 0)
    return -1;
  int rc = start_peers(s, &tls, eb);
  if (rc == 0) rc = distd_ops_attach(s, eb);
  if (rc == 0) rc = start_http(s, eb);
  /* Before the first RPC can be served: Info packs it, and a write during
   * the packing changes the message's size under protobuf-c. */
  snprintf(s->grpc_address, sizeof s->grpc_address, "%s", s->cfg.listen);
  if (rc == 0) {
    grpc_init();
    s->grpc_initialized = 1;
    rc = distd_rpc_start(s, distd_methods, distd_method_count, &tls, eb);
  }
  if (rc == 0) note_tls_dates(s, &tls);
  distd_tls_files_free(&tls);
  if (rc != 0) return -1;
  pthread_create(&s->loop_thread, NULL, loop_main, s);
  start_watchdog(s);
  start_memory_tick(s);
  log_info("rank %d of %d serving gRPC on %s (port %d), data plane on %s%s%s",
           s->rank, s->world_size, s->cfg.listen, distd_rpc_port(s->rpc),
           s->members[s->rank].peer_addr, s->http ? ", HTTP on " : "",
           s->http ? distd_http_address(s->http) : "");
  distd_notify("READY=1\nSTATUS=serving");
  return 0;
}

/* The gRPC port's and the data plane's certificates, both or neither,
 * from one reading of the files. */
static int reload_certs(distd_server *s, dist_errbuf *eb) {
  const distd_config *cfg = &s->cfg;
  void *peer_ctx = NULL;
  distd_tls_files tls;
  int rc = distd_tls_files_read(cfg, &tls, eb);
  if (rc == 0) rc = distd_peers_tls_load(s->peers, &tls, &peer_ctx, eb);
  if (rc == 0) rc = distd_rpc_reload_certs(s->rpc, &tls, eb);
  if (rc == 0) note_tls_dates(s, &tls);
  if (rc != 0) {
    distd_tls_files_free(&tls);
    distd_peers_tls_drop(peer_ctx);
    dist_errbuf_prefix(eb, "the certificates in use stay: ");
    return rc;
  }
  log_info("reloaded TLS certificate %s and key %s%s%s: new connections use them, "
           "open ones keep theirs%s", cfg->tls_cert, cfg->tls_key,
           cfg->tls_ca[0] ? " and CA " : "", cfg->tls_ca,
           peer_ctx ? "; open peer connections are checked against tls_ca and tls_crl" : "");
  /* The log first: the loop may close distrusted peers' connections at once. */
  distd_peers_tls_use(s->peers, peer_ctx);
  distd_tls_files_free(&tls);
  return 0;
}

static int reload_tokens(distd_server *s, dist_errbuf *eb) {
  return distd_rpc_reload_tokens(s->rpc, eb);
}

/* One part of a reload: a failure is logged, and the first one kept in
 * *rc and eb. */
static void reload_part(distd_server *s, int (*part)(distd_server *, dist_errbuf *),
                        int *rc, dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  if (part(s, &why) == 0) return;
  log_warn("reload: %s", dist_errbuf_msg(&why));
  if (!*rc) *rc = why.code, *eb = why;
}

/* Tokens and certificates are reloaded independently: a bad tokens file
 * does not hold back a certificate rotation, nor the other way round. */
int distd_reload(distd_server *s, dist_errbuf *eb) {
  distd_notify("RELOADING=1");
  int rc = 0, tokens = s->cfg.auth_tokens_file[0] != 0, certs = s->cfg.tls_cert[0] != 0;
  if (tokens) reload_part(s, reload_tokens, &rc, eb);
  if (certs) reload_part(s, reload_certs, &rc, eb);
  if (!tokens && !certs) {
    rc = dist_fail(eb, DIST_EINVAL, "nothing to reload: neither auth_tokens_file nor "
                   "tls_cert is set");
    log_warn("reload: %s", dist_errbuf_msg(eb));
  }
  distd_notify("READY=1");
  return rc;
}

void distd_stop(distd_server *s) {
  distd_notify("STOPPING=1");
  if (s->rpc) distd_rpc_shutdown(s->rpc, SHUTDOWN_GRACE_MS);
  if (s->peers) distd_peers_cancel_all(s->peers);
  distd_rpc_free(s->rpc);
  if (s->loop_thread) {
    event_base_loopbreak(s->base);
    pthread_join(s->loop_thread, NULL);
  }
  if (watchdog_ev) event_free(watchdog_ev);
  if (memory_ev) event_free(memory_ev);
  distd_http_free(s->http);
  struct distd_ops *ops = distd_peers_ops(s->peers);
  distd_peers_free(s->peers);
  distd_ops_detach(s, ops); /* after the peers: their workers are gone */
  if (s->grpc_initialized) grpc_shutdown();
  free_registries(s); /* the RPC workers that use them are gone */
  distd_store_free(s->store);
  distd_metrics_free(s->metrics);
  if (s->base) event_base_free(s->base);
  free(s->members);
  dist_cfg_free(&distd_config_table, &s->cfg);
  log_info("stopped");
}
