/* Greeted inbound sockets of the plain TCP transport are watched through one
 * epoll set of our own (distd_peers.in_epfd), which the loop sees as a
 * single event.
 *
 * Why: a worker waiting in distd_xfer_wait takes these sockets and reads
 * them itself (peer_internal.h), then gives them back. Done with libevent
 * (event_del_noblock / event_add from a worker), each take and each give
 * wakes the loop thread to update its own epoll set: four wake-ups per
 * collective (barrier + op) on every rank, on two cores shared by four
 * daemons. epoll_ctl on a set of our own wakes nobody, unless a socket given
 * back has bytes waiting, and then the loop must read them anyway.
 *
 * The loop reads a socket only while it is in the set (conn.in_set), and
 * that is never while a driver holds it (conn.owned).
 *
 * A driver that stops does not give its sockets back at once: it parks
 * them for the next driver and arms a timer (park_tfd, also in the set).
 * Back-to-back operations then move sockets with no system call at all,
 * and bytes of the next operation that arrive in between stay in the
 * kernel until its driver reads them straight into place. Only when no
 * driver came for PARK_MS does the loop take them back, so a rank that is
 * not waiting still answers pings, sees a closed socket, and keeps
 * receiving. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "clock.h"
#include "log.h"
#include "peer_internal.h"

#define PARK_TIMER UINT32_MAX /* epoll data of park_tfd */

static void arm_park_timer(distd_peers *p, int64_t ms) {
  if (distd_timerfd_arm_ms(p->park_tfd, ms) == 0) p->park_armed = 1;
}

/* Without a driver, the loop takes the parked sockets back (with what they
 * hold: staged bytes raise no event). */
static void give_back_parked(distd_peers *p) {
  for (int r = 0; r < p->world; r++) {
    conn *c = p->peers[r].in;
    if (!c || !c->owned || !c->in_epoll) continue;
    c->owned = 0;
    if (c->read_blocked) continue;
    distd_conn_watch_read(c, 1);
    if (c->st_end > c->st_off) event_active(c->rev, EV_READ, 0);
  }
}

/* The park timer fired. With a driver running, nothing to do: it writes
 * what is queued, and arms the timer again when it stops. Otherwise the
 * loop writes what senders left for a driver (peer_xfer.c's
 * write_now_some), and takes the sockets back once the last driver
 * stopped PARK_MS ago, or looks again when that will be. */
static void unpark(distd_peers *p) {
  if (!distd_timerfd_expired(p->park_tfd)) return; /* armed again meanwhile */
  pthread_mutex_lock(&p->mu);
  p->park_armed = 0;
  if (!p->driver_x) {
    distd_peers_flush_queued(p, 1);
    int64_t parked_for = distd_now_ms() - p->parked_ms;
    if (parked_for < PARK_MS) arm_park_timer(p, PARK_MS - parked_for);
    if (!p->park_armed) give_back_parked(p);
  }
  pthread_mutex_unlock(&p->mu);
}

/* The timer is armed once per PARK_MS at most, not once per driver, and
 * never stopped: back-to-back operations then cost no timer system call
 * and, with a driver running when it fires, one idle wake-up of the loop
 * per PARK_MS. */
void distd_inbound_park(distd_peers *p) {
  p->parked_ms = distd_now_ms();
  distd_inbound_look_later(p);
}

void distd_inbound_look_later(distd_peers *p) {
  if (!p->park_armed) arm_park_timer(p, PARK_MS);
}

static void inbound_ready_cb(int fd, short what, void *arg) {
  (void)what;
  distd_peers *p = arg;
  struct epoll_event ev[16];
  int n = epoll_wait(fd, ev, 16, 0);
  for (int i = 0; i < n; i++) {
    if (ev[i].data.u32 == PARK_TIMER) {
      unpark(p);
      continue;
    }
    int r = (int)ev[i].data.u32;
    pthread_mutex_lock(&p->mu);
    conn *c = r >= 0 && r < p->world ? p->peers[r].in : NULL;
    int watched = c && c->in_set;
    pthread_mutex_unlock(&p->mu);
    /* Only the loop thread (this one) frees a connection, so c stays
     * valid; a driver that took it meanwhile makes the callback a no-op. */
    if (watched) distd_conn_read_cb(c->fd, EV_READ, c);
  }
}

int distd_inbound_open(distd_peers *p, dist_errbuf *eb) {
  p->in_epfd = epoll_create1(EPOLL_CLOEXEC);
  p->park_tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = PARK_TIMER};
  if (p->in_epfd < 0 || p->park_tfd < 0 ||
      epoll_ctl(p->in_epfd, EPOLL_CTL_ADD, p->park_tfd, &ev) != 0)
    return dist_fail(eb, DIST_EIO, "inbound epoll set: %s", strerror(errno));
  p->in_ev = event_new(p->base, p->in_epfd, EV_READ | EV_PERSIST, inbound_ready_cb, p);
  if (!p->in_ev || event_add(p->in_ev, NULL) != 0)
    return dist_fail(eb, DIST_ENOMEM, "out of memory for the inbound event");
  return 0;
}

void distd_inbound_close(distd_peers *p) {
  if (p->in_ev) event_free(p->in_ev);
  if (p->in_epfd >= 0) close(p->in_epfd);
  if (p->park_tfd >= 0) close(p->park_tfd);
  p->in_ev = NULL;
  p->in_epfd = p->park_tfd = -1;
}

void distd_conn_greeted_inbound(conn *c) {
  if (c->p->in_epfd < 0) return; /* TLS: the loop's event keeps it */
  event_del(c->rev); /* on the loop thread: no wake-up */
  c->in_epoll = 1;
  distd_conn_watch_read(c, 1);
}

void distd_conn_watch_read(conn *c, int on) {
  if (!c->in_epoll) {
    if (on) event_add(c->rev, NULL);
    else event_del(c->rev);
    return;
  }
  if (on == c->in_set) return;
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)c->rank};
  if (epoll_ctl(c->p->in_epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, c->fd, &ev) != 0) {
    /* Only ENOMEM/ENOSPC can get here; the loop then never reads the
     * socket, and its peer's transfers end by timeout. Say so. */
    log_warn("peer rank %d: epoll_ctl: %s", c->rank, strerror(errno));
    return;
  }
  c->in_set = on;
}
