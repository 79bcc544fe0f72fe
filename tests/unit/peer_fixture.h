/* Several distd_peers instances in one process, each with its own
 * event_base running in its own thread, on 127.0.0.1 ports picked by the
 * kernel. Shared by test_peer.c and test_coll.c. */
#ifndef TEST_PEER_FIXTURE_H
#define TEST_PEER_FIXTURE_H

#include <arpa/inet.h>
#include <errno.h>
#include <criterion/criterion.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "peer.h"

#define FIX_MAX 8

typedef struct fix_rank {
  struct event_base *base;
  pthread_t loop;
  distd_peers *peers;
  int up;
} fix_rank;

typedef struct peer_fixture {
  int n;
  dist_member members[FIX_MAX];
  fix_rank r[FIX_MAX];
  char cluster_id[FIX_MAX][64];
  size_t unexpected_limit;
  int64_t unexpected_max_age_ms; /* 0: kept-aside frames never expire */
  const char *congestion; /* NULL: the system default */
  size_t socket_buffer;   /* 0: the kernel's autotuning */
} peer_fixture;

/* A port the kernel considers free right now. */
static inline int fix_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  cr_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  getsockname(fd, (struct sockaddr *)&a, &len);
  close(fd);
  return ntohs(a.sin_port);
}

static inline void fix_pick_ports(peer_fixture *f) {
  for (int i = 0; i < f->n; i++)
    snprintf(f->members[i].peer_addr, sizeof f->members[i].peer_addr, "127.0.0.1:%d",
             fix_free_port());
}

static inline void *fix_loop(void *arg) {
  event_base_loop(arg, EVLOOP_NO_EXIT_ON_EMPTY);
  return NULL;
}

/* Starts rank i. 0, or -1 when its peer port was taken since fix_prepare
 * found it free (another test's outbound connection may be given that
 * port by the kernel before the rank listens on it). */
static inline int fix_try_start_rank(peer_fixture *f, int i) {
  fix_rank *r = &f->r[i];
  r->base = event_base_new();
  cr_assert(r->base);
  distd_peers_opts o = {.rank = i, .world_size = f->n, .members = f->members,
                        .cluster_id = f->cluster_id[i], .backoff_min_ms = 20,
                        .backoff_max_ms = 200, .unexpected_limit = f->unexpected_limit,
                        .unexpected_max_age_ms = f->unexpected_max_age_ms,
                        .congestion = f->congestion, .socket_buffer = f->socket_buffer,
                        .no_io_uring = getenv("DIST_TEST_NO_IO_URING") != NULL};
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_peers_start(&r->peers, r->base, &o, &eb);
  if (rc != 0 && strstr(eb.msg, strerror(EADDRINUSE))) {
    event_base_free(r->base);
    memset(r, 0, sizeof *r);
    return -1;
  }
  cr_assert_eq(rc, 0, "rank %d: %s", i, eb.msg);
  cr_assert_eq(pthread_create(&r->loop, NULL, fix_loop, r->base), 0);
  r->up = 1;
  return 0;
}

static inline void fix_start_rank(peer_fixture *f, int i) {
  cr_assert_eq(fix_try_start_rank(f, i), 0, "rank %d: its peer port %s was taken", i,
               f->members[i].peer_addr);
}

static inline void fix_stop_rank(peer_fixture *f, int i) {
  fix_rank *r = &f->r[i];
  if (!r->up) return;
  /* loopexit, not loopbreak: a loop that has not started yet (a rank
   * stopped right after its start) clears a break when it starts, and
   * its thread was never joined; an exit is an event it still runs. */
  event_base_loopexit(r->base, NULL);
  pthread_join(r->loop, NULL);
  distd_peers_free(r->peers);
  event_base_free(r->base);
  memset(r, 0, sizeof *r);
}

/* n ranks, all in cluster "test" unless the caller changes cluster_id[]
 * between fix_prepare and fix_start_all. */
static inline void fix_prepare(peer_fixture *f, int n) {
  memset(f, 0, sizeof *f);
  evthread_use_pthreads();
  dist_log_setup("test", getenv("TEST_LOG") ? DIST_LOG_DEBUG : DIST_LOG_ERROR, DIST_LOG_PLAIN);
  f->n = n;
  fix_pick_ports(f);
  for (int i = 0; i < n; i++) snprintf(f->cluster_id[i], sizeof f->cluster_id[i], "test");
}

/* Every rank, on ports picked again (all of them: the ranks started know
 * the others' addresses) when one was taken meanwhile: a test of
 * test_peer failed under ASan on "Address already in use". */
static inline void fix_start_all(peer_fixture *f) {
  for (int attempt = 0; attempt < 5; attempt++) {
    int up = 0;
    while (up < f->n && fix_try_start_rank(f, up) == 0) up++;
    if (up == f->n) return;
    for (int i = 0; i < up; i++) fix_stop_rank(f, i);
    fix_pick_ports(f);
  }
  cr_assert_fail("the peer ports of %d ranks were taken 5 times over", f->n);
}

/* Waits (bounded) until every running rank sees every other as connected. */
static inline int fix_wait_connected(peer_fixture *f, int64_t timeout_ms) {
  int64_t end = distd_now_ms() + timeout_ms;
  while (distd_now_ms() < end) {
    int ok = 1;
    for (int i = 0; i < f->n; i++)
      if (f->r[i].up && distd_peers_connected_count(f->r[i].peers) != f->n - 1) ok = 0;
    if (ok) return 1;
    usleep(5000);
  }
  return 0;
}

static inline void fix_setup(peer_fixture *f, int n) {
  fix_prepare(f, n);
  fix_start_all(f);
  cr_assert(fix_wait_connected(f, 10000), "%d ranks did not connect within 10 s", n);
}

static inline void fix_teardown(peer_fixture *f) {
  for (int i = 0; i < f->n; i++) fix_stop_rank(f, i);
}

#endif
