/* distd: one daemon of a distd cluster. Startup order matters: signals are
 * blocked before gRPC starts its threads so that only the main thread takes
 * them (sigwait); the data plane binds before the gRPC port so a cluster
 * whose peer ports are taken fails fast. */
#include <event2/event.h>
#include <event2/thread.h>
#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "affinity.h"
#include "daemon.h"
#include "log.h"
#include "memory.h"

extern char **environ;

static int load_config(distd_server *s, int argc, char **argv) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_cfg_action action = DIST_CFG_RUN;
  if (dist_cfg_load(&distd_config_table, &s->cfg, argc, argv, environ, &action,
                    stdout, &eb) != 0) {
    fprintf(stderr, "distd: %s\n", dist_errbuf_msg(&eb));
    return 2;
  }
  if (action == DIST_CFG_EXIT_OK) return 0;
  if (distd_pin_process(s->cfg.cpu_affinity, &eb) != 0) {
    fprintf(stderr, "distd: %s\n", dist_errbuf_msg(&eb));
    return 2;
  }
  if (distd_members_load(&s->cfg, &s->members, &s->world_size, &eb) != 0) {
    fprintf(stderr, "distd: %s\n", dist_errbuf_msg(&eb));
    return 2;
  }
  s->rank = (int)s->cfg.rank;
  /* In a cluster this daemon serves at its own entry unless told otherwise. */
  if ((s->cfg.cluster_file[0] || s->cfg.peers[0]) &&
      strcmp(s->cfg.listen, DISTD_DEFAULT_LISTEN) == 0) {
    char *own = strdup(s->members[s->rank].grpc_addr);
    if (!own) {
      fprintf(stderr, "distd: out of memory for the address to listen on\n");
      return 2;
    }
    free(s->cfg.listen);
    s->cfg.listen = own;
  }
  return -1;
}

/* gRPC core's own log lines go through ours at debug level, so stderr
 * stays one format; what matters to users (a port in use) we report
 * ourselves in plain words. */
static void grpc_log(gpr_log_func_args *args) {
  log_debug("grpc: %s:%d: %s", args->file, args->line, args->message);
}

static void setup_logging(const distd_config *cfg) {
  gpr_set_log_function(grpc_log);
  static const dist_log_level levels[] = {DIST_LOG_ERROR, DIST_LOG_WARN,
                                          DIST_LOG_INFO, DIST_LOG_DEBUG};
  dist_log_setup("distd", levels[cfg->log_level],
                 cfg->log_format ? DIST_LOG_JSON : DIST_LOG_PLAIN);
}

static pthread_t main_thread;

/* Threads started before main (OpenBLAS starts its pool in a library
 * constructor) do not block SIGTERM, and the kernel hands them a SIGTERM
 * that arrives while the main thread is not in sigwait (a second one,
 * during shutdown): without a handler that kills the daemon mid-shutdown.
 * Pass it on to the main thread, which blocks it, so sigwait or nobody
 * takes it. pthread_kill is a bare tgkill in glibc. */
static void pass_to_main(int sig) { pthread_kill(main_thread, sig); }

static void block_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, set, NULL);
  signal(SIGPIPE, SIG_IGN);
  main_thread = pthread_self();
  struct sigaction sa = {.sa_handler = pass_to_main, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

/* Serves until SIGTERM or SIGINT; each SIGHUP reloads (distd_reload). */
static void serve_until_stopped(distd_server *srv, sigset_t *signals) {
  for (;;) {
    int sig = 0;
    sigwait(signals, &sig);
    if (sig != SIGHUP) {
      log_info("received %s: shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      return;
    }
    dist_errbuf eb = DIST_ERRBUF_INIT;
    distd_reload(srv, &eb); /* logs what it could not reload */
  }
}

int main(int argc, char **argv) {
  distd_memory_policy_init();
  distd_server srv;
  memset(&srv, 0, sizeof srv);
  int rc = load_config(&srv, argc, argv);
  if (rc >= 0) {
    dist_cfg_free(&distd_config_table, &srv.cfg);
    return rc;
  }
  setup_logging(&srv.cfg);
  sigset_t signals;
  block_signals(&signals);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  rc = 0;
  if (distd_start(&srv, &eb) != 0) {
    log_error("%s", dist_errbuf_msg(&eb));
    rc = 1;
  } else {
    serve_until_stopped(&srv, &signals);
  }
  distd_stop(&srv);
  return rc;
}
