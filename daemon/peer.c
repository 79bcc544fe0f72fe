/* The peer data plane's lifetime: the listener, dialling with backoff, the
 * PING timer, statistics, and shutdown. Frame I/O is in peer_conn.c
 * (writing) and peer_read.c (reading), transfers in peer_xfer.c. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <event2/event.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"
#include "log.h"
#include "peer_batch.h"
#include "peer_internal.h"
#include "random.h"
#include "tls.h"

void distd_peer_set_error(peer *pe, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pe->stats.last_error, sizeof pe->stats.last_error, fmt, ap);
  va_end(ap);
}

const char *distd_peer_addr(const distd_peers *p, int rank) {
  return p->members[rank].peer_addr;
}

/* No Nagle (frames are small or already large), socket buffers large
 * enough that one writev moves megabytes, and the configured congestion
 * control. */
int distd_peer_sock_setup(const distd_peers *p, int fd) {
  int one = 1, buf = p->socket_buffer;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) return -1;
  if (p->congestion[0] && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, p->congestion,
                                     (socklen_t)strlen(p->congestion)) < 0)
    return -1;
  if (buf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  }
  return 0;
}

static int resolve(const char *addr, struct addrinfo **out, int passive,
                   dist_errbuf *eb) {
  char host[256], port_s[16];
  int port = 0;
  if (dist_split_hostport(addr, host, sizeof host, &port, eb) < 0) return DIST_EINVAL;
  snprintf(port_s, sizeof port_s, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = passive ? AI_PASSIVE : 0};
  int rc = getaddrinfo(host[0] ? host : NULL, port_s, &hints, out);
  if (rc != 0)
    return dist_fail(eb, DIST_EINVAL, "cannot resolve '%s': %s", addr,
                     gai_strerror(rc));
  return 0;
}

void distd_peer_schedule_redial(peer *pe, distd_peers *p) {
  if (p->closing) return;
  struct timeval tv = {(time_t)(pe->backoff_ms / 1000),
                       (suseconds_t)(pe->backoff_ms % 1000) * 1000};
  evtimer_add(pe->redial_ev, &tv);
  pe->backoff_ms *= 2;
  if (pe->backoff_ms > p->backoff_max) pe->backoff_ms = p->backoff_max;
}

static void queue_hello(distd_peers *p, conn *c) {
  dist_hello hello = {.rank = (uint32_t)p->rank, .world_size = (uint32_t)p->world,
                      .boot_id = p->boot_id};
  snprintf(hello.cluster_id, sizeof hello.cluster_id, "%s", p->cluster_id);
  uint8_t payload[DIST_HELLO_SIZE];
  dist_hello_encode(&hello, payload);
  dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_HELLO,
                         0, (uint32_t)p->rank, 0, DIST_HELLO_SIZE, 0};
  distd_conn_queue_ctl(c, &h, payload, sizeof payload);
}

/* Starts a non-blocking connect to pe; the write event tells when it is
 * done (distd_conn_write_cb). Failures schedule the next try. */
static void dial(peer *pe) {
  distd_peers *p = pe->p;
  const char *addr = distd_peer_addr(p, pe->rank);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  struct addrinfo *ai = NULL;
  int fd = -1;
  if (resolve(addr, &ai, 0, &eb) < 0) {
    distd_peer_set_error(pe, "%s", eb.msg);
    goto fail;
  }
  fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 || distd_peer_sock_setup(p, fd) < 0 ||
      (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS)) {
    distd_peer_set_error(pe, "connect to %s: %s", addr, distd_peer_errno_reason(errno));
    goto fail;
  }
  freeaddrinfo(ai);
  ai = NULL;
  conn *c = distd_conn_new(p, fd, 1, pe->rank);
  if (!c) {
    distd_peer_set_error(pe, "connect to %s: out of memory", addr);
    goto fail;
  }
  c->connecting = 1;
  queue_hello(p, c);
  pe->out = c;
  distd_conn_want_write(c);
  return;
fail:
  if (ai) freeaddrinfo(ai);
  if (fd >= 0) close(fd);
  distd_peer_schedule_redial(pe, p);
}

static void redial_cb(int fd, short what, void *arg) {
  (void)fd, (void)what;
  peer *pe = arg;
  pthread_mutex_lock(&pe->p->mu);
  if (!pe->out && !pe->p->closing) dial(pe);
  pthread_mutex_unlock(&pe->p->mu);
}

static void accept_cb(int lfd, short what, void *arg) {
  (void)what;
  distd_peers *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        log_warn("peer listener: accept: %s", strerror(errno));
      break;
    }
    if (distd_peer_sock_setup(p, fd) < 0) {
      log_warn("peer listener: setting up a new connection: %s", strerror(errno));
      close(fd);
      continue;
    }
    conn *c = distd_conn_new(p, fd, 0, -1);
    if (!c) {
      log_warn("peer listener: out of memory for a new connection");
      close(fd);
      continue;
    }
    dlist_push(&p->pending_in, &c->link);
    event_add(c->rev, NULL);
  }
  pthread_mutex_unlock(&p->mu);
}

/* Closes connections whose TLS handshake and HELLO did not finish within
 * the silence timeout: a stranger that connects and says nothing must not
 * hold a socket forever, and a peer that accepts but never answers is
 * redialled instead of waited on. */
static void expire_handshakes(distd_peers *p) {
  int64_t limit = p->silence_ms > 0 ? p->silence_ms : HANDSHAKE_MS, now = distd_now_ms();
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->pending_in) {
    conn *c = dlist_entry(pos, conn, link);
    if (now - c->opened_ms < limit) continue;
    log_warn("closed an inbound peer connection that sent no HELLO within %lld ms",
             (long long)limit);
    distd_conn_lost(c, "no HELLO in time");
  }
  for (int r = 0; r < p->world; r++) {
    conn *c = p->peers[r].out;
    if (!c || c->greeted || now - c->opened_ms < limit) continue;
    char why[160];
    snprintf(why, sizeof why, "no answer to HELLO within %lld ms", (long long)limit);
    log_warn("peer rank %d (%s): %s; dialling again", r, distd_peer_addr(p, r), why);
    distd_conn_lost(c, why);
  }
}

/* Frames held for their receive (peer_read.c) look again: those held
 * HOLD_MS are kept aside now, the others wait on (and rearm the timer). */
static void hold_cb(int fd, short what, void *arg) {
  (void)what;
  distd_peers *p = arg;
  distd_timerfd_expired(fd); /* clears the expiry */
  pthread_mutex_lock(&p->mu);
  p->hold_armed = 0;
  distd_peers_unblock_readers(p);
  pthread_mutex_unlock(&p->mu);
}

static int open_hold_timer(distd_peers *p, dist_errbuf *eb) {
  p->hold_tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (p->hold_tfd < 0) return dist_fail(eb, DIST_EIO, "hold timer: %s", strerror(errno));
  p->hold_ev = event_new(p->base, p->hold_tfd, EV_READ | EV_PERSIST, hold_cb, p);
  if (!p->hold_ev || event_add(p->hold_ev, NULL) != 0)
    return dist_fail(eb, DIST_ENOMEM, "out of memory for the hold timer");
  return 0;
}

/* Measures RTT on idle outbound connections (the answer comes back on the
 * same socket), bounds handshakes, drops kept-aside frames whose receive
 * did not come in time, and logs the control frames dropped since the
 * last tick. */
static void ping_cb(int fd, short what, void *arg) {
  (void)fd, (void)what;
  distd_peers *p = arg;
  pthread_mutex_lock(&p->mu);
  expire_handshakes(p);
  distd_unexpected_expire(p, distd_now_ms());
  for (int r = 0; r < p->world; r++) {
    peer *pe = &p->peers[r];
    distd_ctl_report_dropped(p, pe);
    if (!pe->out || !pe->out->greeted || !dlist_empty(&pe->outq)) continue;
    send_item *it = calloc(1, sizeof *it);
    if (!it) continue;
    dlist_init(&it->xlink);
    dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_PING,
                           0, (uint32_t)p->rank, 0, 0, distd_now_ns()};
    dist_frame_encode(&h, it->hdr);
    it->dst = r;
    distd_peer_queue_frame(p, r, it);
    distd_conn_flush(pe->out, 1);
  }
  pthread_mutex_unlock(&p->mu);
}

void distd_peer_pong(distd_peers *p, int rank, uint64_t sent_ns) {
  uint64_t now = distd_now_ns();
  if (sent_ns <= now) p->peers[rank].stats.rtt_seconds = (double)(now - sent_ns) / 1e9;
}

static int start_listener(distd_peers *p, dist_errbuf *eb) {
  const char *addr = distd_peer_addr(p, p->rank);
  struct addrinfo *ai = NULL;
  int rc = resolve(addr, &ai, 1, eb);
  if (rc < 0) goto out;
  p->listen_fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (p->listen_fd < 0 ||
      setsockopt(p->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      bind(p->listen_fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
      listen(p->listen_fd, 128) < 0) {
    rc = dist_fail(eb, DIST_EUNAVAIL, "cannot listen for peers on %s: %s",
                   addr, strerror(errno));
    goto out;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(p->listen_fd, (struct sockaddr *)&ss, &sl);
  p->listen_port = ntohs(ss.ss_family == AF_INET6
                             ? ((struct sockaddr_in6 *)&ss)->sin6_port
                             : ((struct sockaddr_in *)&ss)->sin_port);
  distd_tls_warn_plain("the data plane", addr, p->tp == &distd_peer_transport_tls);
  p->listen_ev = event_new(p->base, p->listen_fd, EV_READ | EV_PERSIST, accept_cb, p);
  event_add(p->listen_ev, NULL);
out:
  if (ai) freeaddrinfo(ai);
  return rc;
}

/* One line of /proc/sys/net/ipv4/, e.g. the congestion controls it has. */
static void read_ipv4_sysctl(const char *name, char *buf, size_t len) {
  char path[128];
  snprintf(path, sizeof path, "/proc/sys/net/ipv4/%s", name);
  FILE *f = fopen(path, "r");
  snprintf(buf, len, "unknown");
  if (f && fgets(buf, (int)len, f)) buf[strcspn(buf, "\n")] = 0;
  if (f) fclose(f);
}

/* Tried once on a scratch socket, so that a name the kernel refuses stops
 * the daemon at start rather than failing every connection. */
static int check_congestion(const char *cc, dist_errbuf *eb) {
  if (!cc || !cc[0]) return 0;
  char known[256];
  if (strlen(cc) >= sizeof ((distd_peers *)0)->congestion)
    return dist_fail(eb, DIST_EINVAL, "peer_congestion '%s' is longer than a TCP "
                     "congestion control name can be", cc);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return dist_fail(eb, DIST_EUNAVAIL, "socket: %s", strerror(errno));
  int rc = setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc));
  int err = errno;
  close(fd);
  if (rc == 0) return 0;
  if (err == ENOENT) {
    read_ipv4_sysctl("tcp_available_congestion_control", known, sizeof known);
    return dist_fail(eb, DIST_EINVAL, "peer_congestion '%s': this kernel has no such "
                     "TCP congestion control (it has: %s)", cc, known);
  }
  read_ipv4_sysctl("tcp_allowed_congestion_control", known, sizeof known);
  return dist_fail(eb, DIST_EINVAL, "peer_congestion '%s': %s (without CAP_NET_ADMIN "
                   "the kernel allows: %s; empty keeps the system default)", cc,
                   strerror(err), known);
}

static int check_opts(const distd_peers_opts *o, dist_errbuf *eb) {
  if (o->world_size < 1 || !o->members)
    return dist_fail(eb, DIST_EINVAL, "peer world of %d ranks", o->world_size);
  if (o->rank < 0 || o->rank >= o->world_size)
    return dist_fail(eb, DIST_EINVAL, "rank %d is out of range for a world of %d",
                     o->rank, o->world_size);
  if (o->cluster_id && strlen(o->cluster_id) >= 64)
    return dist_fail(eb, DIST_EINVAL, "cluster id '%s' is longer than 63 bytes",
                     o->cluster_id);
  return check_congestion(o->congestion, eb);
}

static void init_peer(distd_peers *p, int r) {
  peer *pe = &p->peers[r];
  pe->p = p;
  pe->rank = r;
  dlist_init(&pe->outq);
  dlist_init(&pe->ctl_spares);
  pe->backoff_ms = p->backoff_min;
  pe->redial_ev = evtimer_new(p->base, redial_cb, pe);
}

/* The driver's batch of system calls (peer_batch.h): a read and a write
 * per peer at most in one pass. */
static int open_batch(distd_peers *p, int use_uring, dist_errbuf *eb) {
  size_t calls = 2 * (size_t)p->world;
  const char *why = "";
  p->batch = distd_batch_new((int)calls, IOV_BATCH, use_uring, &why);
  p->call_ranks = calloc(calls, sizeof *p->call_ranks);
  p->call_results = calloc(calls, sizeof *p->call_results);
  p->read_plans = calloc((size_t)p->world, sizeof *p->read_plans);
  if (!p->batch || !p->call_ranks || !p->call_results || !p->read_plans)
    return dist_fail(eb, DIST_ENOMEM, "out of memory");
  if (distd_batch_cheap(p->batch)) {
    snprintf(p->io_mode, sizeof p->io_mode, "io_uring");
    log_info("peer data plane: a waiting thread batches its system calls with io_uring");
  } else {
    snprintf(p->io_mode, sizeof p->io_mode, "system calls (io_uring %s%s)",
             use_uring ? ": " : "", why);
    log_info("peer data plane: no io_uring (%s): one system call per read and write", why);
  }
  return 0;
}

const char *distd_peers_io(const distd_peers *p) { return p->io_mode; }

/* Everything that cannot fail: the settings opts gives (with their
 * defaults), no descriptor open yet, empty lists. */
static void init_state(distd_peers *p, struct event_base *base, const distd_peers_opts *opts) {
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->idle, NULL);
  p->base = base;
  p->rank = opts->rank;
  p->world = opts->world_size;
  p->listen_fd = -1;
  p->wake_fd = -1;
  p->in_epfd = p->park_tfd = p->hold_tfd = -1;
  snprintf(p->cluster_id, sizeof p->cluster_id, "%s", opts->cluster_id ? opts->cluster_id : "");
  if (dist_random_bytes(&p->boot_id, sizeof p->boot_id) != 0)
    p->boot_id = distd_now_ns() ^ (uint64_t)getpid();
  p->backoff_min = opts->backoff_min_ms > 0 ? opts->backoff_min_ms : 50;
  p->backoff_max = opts->backoff_max_ms >= p->backoff_min ? opts->backoff_max_ms : 2000;
  if (p->backoff_max < p->backoff_min) p->backoff_max = p->backoff_min;
  p->unexpected_limit = opts->unexpected_limit ? opts->unexpected_limit : DEFAULT_UNEXPECTED_LIMIT;
  p->unexpected_max_age_ms = opts->unexpected_max_age_ms > 0 ? opts->unexpected_max_age_ms : 0;
  p->max_frame = opts->max_frame_size ? opts->max_frame_size : DEFAULT_MAX_FRAME;
  p->silence_ms = opts->silence_timeout_ms;
  p->spin_us = opts->spin_us;
  snprintf(p->congestion, sizeof p->congestion, "%s", opts->congestion ? opts->congestion : "");
  p->socket_buffer = opts->socket_buffer > INT_MAX ? INT_MAX : (int)opts->socket_buffer;
  p->tp = &distd_peer_transport_tcp;
  dlist_init(&p->pending_in);
  dlist_init(&p->xfers);
  dlist_init(&p->unexpected);
  distd_dropped_init(&p->dropped);
}

/* The tables of one entry per rank, and the driver's wake-up eventfd. */
static int alloc_tables(distd_peers *p, const distd_peers_opts *opts, dist_errbuf *eb) {
  p->peers = calloc((size_t)p->world, sizeof *p->peers);
  /* Before anything can fail: distd_peers_free walks every peer's queue. */
  for (int r = 0; p->peers && r < p->world; r++) init_peer(p, r);
  for (int r = 0; p->peers && r < p->world; r++)
    if (r != p->rank && distd_ctl_spares_init(&p->peers[r]) < 0)
      return dist_fail(eb, DIST_ENOMEM, "out of memory for the peers' control frames");
  p->members = malloc(sizeof *p->members * (size_t)p->world);
  p->pollfds = calloc(2 * (size_t)p->world + 1, sizeof *p->pollfds);
  p->pollranks = calloc(2 * (size_t)p->world + 1, sizeof *p->pollranks);
  /* Without it a waiter cannot drive the sockets; the loop thread still does. */
  p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (!p->members || !p->peers || !p->pollfds || !p->pollranks)
    return dist_fail(eb, DIST_ENOMEM, "out of memory");
  memcpy(p->members, opts->members, sizeof *p->members * (size_t)p->world);
  return 0;
}

/* TLS when opts names a certificate; plain TCP otherwise, with the epoll
 * set its drivers take the inbound sockets from and their batch. */
static int open_transport(distd_peers *p, const distd_peers_opts *opts, dist_errbuf *eb) {
  int rc;
  if (opts->tls && opts->tls->cert) {
    rc = distd_peer_tls_ctx_new(opts->tls, &p->tls_ctx, eb);
    if (rc < 0) return rc;
    p->tp = &distd_peer_transport_tls;
    snprintf(p->io_mode, sizeof p->io_mode, "tls (the loop thread)");
    if ((rc = distd_trust_check_open(p, eb)) < 0) return rc;
  }
  if (p->tp == &distd_peer_transport_tcp &&
      ((rc = distd_inbound_open(p, eb)) < 0 || (rc = open_batch(p, !opts->no_io_uring, eb)) < 0))
    return rc;
  return 0;
}

/* The PING timer, and a connection dialled to every other rank. */
static void start_dialling(distd_peers *p, struct event_base *base) {
  p->ping_ev = event_new(base, -1, EV_PERSIST, ping_cb, p);
  struct timeval tv = {PING_MS / 1000, (PING_MS % 1000) * 1000};
  event_add(p->ping_ev, &tv);
  pthread_mutex_lock(&p->mu);
  for (int r = 0; r < p->world; r++)
    if (r != p->rank) dial(&p->peers[r]);
  pthread_mutex_unlock(&p->mu);
}

int distd_peers_start(distd_peers **out, struct event_base *base,
                      const distd_peers_opts *opts, dist_errbuf *eb) {
  *out = NULL;
  int rc = check_opts(opts, eb);
  if (rc < 0) return rc;
  distd_peers *p = calloc(1, sizeof *p);
  if (!p) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  init_state(p, base, opts);
  if ((rc = alloc_tables(p, opts, eb)) < 0 || (rc = open_transport(p, opts, eb)) < 0 ||
      (rc = start_listener(p, eb)) < 0 || (rc = open_hold_timer(p, eb)) < 0) {
    distd_peers_free(p);
    return rc;
  }
  start_dialling(p, base);
  *out = p;
  return 0;
}

static void free_outq(peer *pe) {
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &pe->outq) {
    send_item *it = dlist_entry(pos, send_item, link);
    dlist_remove(&it->xlink);
    distd_send_item_free(pe, it);
  }
  dlist_init(&pe->outq);
  distd_ctl_spares_free(pe);
}

/* Closes every connection, fails every transfer still alive, and waits for
 * the threads inside distd_xfer_wait to leave before the mutex goes away. */
void distd_peers_free(distd_peers *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->closing = 1;
  distd_xfer_orphan_all(p);
  for (int r = 0; p->peers && r < p->world; r++) {
    peer *pe = &p->peers[r];
    distd_conn_free(pe->out);
    distd_conn_free(pe->in);
    pe->out = pe->in = NULL;
    distd_ctl_report_dropped(p, pe); /* the drops since the last tick */
    free_outq(pe);
    if (pe->redial_ev) event_free(pe->redial_ev);
  }
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->pending_in)
    distd_conn_free(dlist_entry(pos, conn, link));
  dlist_each_safe(pos, tmp, &p->unexpected)
    distd_unexpected_free(p, dlist_entry(pos, unexpected, link));
  while (p->waiters > 0) pthread_cond_wait(&p->idle, &p->mu);
  pthread_mutex_unlock(&p->mu);
  if (p->listen_ev) event_free(p->listen_ev);
  if (p->ping_ev) event_free(p->ping_ev);
  if (p->hold_ev) event_free(p->hold_ev);
  distd_trust_check_close(p);
  if (p->hold_tfd >= 0) close(p->hold_tfd);
  distd_inbound_close(p);
  if (p->listen_fd >= 0) close(p->listen_fd);
  if (p->wake_fd >= 0) close(p->wake_fd);
  free(p->pollfds);
  free(p->pollranks);
  distd_batch_free(p->batch);
  free(p->call_ranks);
  free(p->call_results);
  free(p->read_plans);
  pthread_cond_destroy(&p->idle);
  pthread_mutex_destroy(&p->mu);
  distd_peer_tls_ctx_free(p->tls_ctx);
  free(p->members);
  free(p->peers);
  free(p);
}

int distd_peers_tls_load(const distd_peers *p, const distd_tls_files *f, void **ctx,
                         dist_errbuf *eb) {
  *ctx = NULL;
  if (p->tp != &distd_peer_transport_tls) return 0;
  return distd_peer_tls_ctx_new(f, ctx, eb);
}

/* Connections hold their own reference to the context they were made
 * with (SSL_new), so the old one can go at once. */
void distd_peers_tls_use(distd_peers *p, void *ctx) {
  if (!ctx) return;
  pthread_mutex_lock(&p->mu);
  void *old = p->tls_ctx;
  p->tls_ctx = ctx;
  p->tls_gen++;
  distd_trust_check_post(p);
  pthread_mutex_unlock(&p->mu);
  distd_peer_tls_ctx_free(old);
}

void distd_peers_tls_drop(void *ctx) { distd_peer_tls_ctx_free(ctx); }

void distd_peers_get_stats(distd_peers *p, int rank, distd_peer_stats *out) {
  memset(out, 0, sizeof *out);
  if (rank < 0 || rank >= p->world) return;
  pthread_mutex_lock(&p->mu);
  *out = p->peers[rank].stats;
  /* What the kernel uses, which is what an operator wants to see. */
  socklen_t len = sizeof out->congestion - 1, ilen = sizeof(int);
  const conn *o = p->peers[rank].out, *i = p->peers[rank].in;
  if (o) getsockopt(o->fd, IPPROTO_TCP, TCP_CONGESTION, out->congestion, &len);
  if (o) getsockopt(o->fd, SOL_SOCKET, SO_SNDBUF, &out->send_buffer, &ilen);
  ilen = sizeof(int);
  if (i) getsockopt(i->fd, SOL_SOCKET, SO_RCVBUF, &out->receive_buffer, &ilen);
  pthread_mutex_unlock(&p->mu);
}

int distd_peers_rank(const distd_peers *p) { return p->rank; }

int distd_peers_world_size(const distd_peers *p) { return p->world; }

int distd_peers_listen_port(const distd_peers *p) { return p->listen_port; }

int distd_peers_connected_count(distd_peers *p) {
  int n = 0;
  pthread_mutex_lock(&p->mu);
  for (int r = 0; r < p->world; r++) n += p->peers[r].stats.connected != 0;
  pthread_mutex_unlock(&p->mu);
  return n;
}
