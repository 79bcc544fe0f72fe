/* The driver: a thread waiting in distd_xfer_wait on plain TCP takes the
 * inbound sockets and moves every connection's bytes itself, one batch of
 * reads and writes per pass (peer_internal.h says how and why). Apart from
 * the transfers' lifecycle (peer_xfer.c) because it is the data plane's
 * hot loop, with its own state (driver_x, drive_again, the pass's batch)
 * and rules for sleeping; everything it calls per pass stays here. Every
 * function here runs with distd_peers.mu held, except where it releases
 * it around poll() and sched_yield(). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "peer_batch.h"
#include "peer_internal.h"

#define DRIVE_POLL_MAX_MS 200   /* a lost wake-up costs at most this */
#define SPIN_POLL_EVERY 8       /* see read_instead_of_poll */

/* ---- the waiting thread drives the sockets (peer_internal.h) ---- */

int distd_on_driver(const distd_peers *p) {
  return p->driver_x && pthread_equal(p->driver_tid, pthread_self());
}

void distd_driver_wake(distd_peers *p) {
  if (!p->driver_x) return;
  if (distd_on_driver(p)) {
    p->drive_again = 1;
    return;
  }
  uint64_t one = 1;
  if (write(p->wake_fd, &one, sizeof one) < 0) p->drive_again = 1; /* full: awake anyway */
}

void distd_peers_flush_queued(distd_peers *p, int in_loop) {
  for (int r = 0; r < p->world; r++) {
    conn *c = p->peers[r].out;
    if (c && c->greeted && !dlist_empty(&p->peers[r].outq)) distd_conn_flush(c, in_loop);
  }
}

int distd_drivers_run(const distd_peers *p) { return p->in_epfd >= 0 && p->wake_fd >= 0; }

int distd_can_drive(const distd_peers *p) {
  return distd_drivers_run(p) && !p->driver_x && !p->closing;
}

/* Takes the greeted inbound sockets the loop thread still watches. */
static void claim_inbound(distd_peers *p) {
  for (int r = 0; r < p->world; r++) {
    conn *c = p->peers[r].in;
    if (!c || c->owned || !c->in_epoll || c->failed) continue;
    c->owned = 1;
    c->drive_ready = 1;
    distd_conn_watch_read(c, 0); /* a callback already on its way sees owned */
  }
}

/* Parks the inbound sockets for the next waiter (the loop takes them back
 * if none comes soon: peer_inbound.c), leaves unwritten frames to the loop
 * unless the driver's next wait will write them (distd_xfer_then),
 * and tells a waiter already sleeping that it may take over. */
static void stop_driving(distd_peers *p) {
  int keep = p->driver_x->then != NULL;
  distd_inbound_park(p);
  for (int r = 0; !keep && r < p->world; r++) {
    conn *c = p->peers[r].out;
    if (c && c->greeted && !dlist_empty(&p->peers[r].outq)) distd_conn_want_write(c);
  }
  p->driver_x = NULL;
  p->drive_again = 0;
  for (dlist *pos = p->xfers.next; pos != &p->xfers; pos = pos->next) {
    distd_xfer *x = dlist_entry(pos, distd_xfer, link);
    if (x->waiting && !x->err.code && x->pending > 0) {
      pthread_cond_signal(&x->cond);
      break;
    }
  }
}

/* Adds to the pass's batch the read of an owned inbound connection that
 * may have bytes (all of them with read_all), after taking what it has
 * staged. */
static void plan_read(distd_peers *p, int r, int read_all) {
  conn *c = p->peers[r].in; /* the driver never frees one: stays valid */
  if (!c || !c->owned || c->read_blocked || !(c->drive_ready || read_all)) return;
  int k = distd_conn_drive_plan(c, &p->read_plans[r]);
  if (k == STEP_READ) {
    const distd_read_plan *rp = &p->read_plans[r];
    int i = distd_batch_add(p->batch, DISTD_BATCH_READ, c->fd, rp->iov, rp->niov);
    if (i >= 0) p->call_ranks[i] = r;
    c->drive_ready = 1; /* read next pass if the batch had no room */
    return;
  }
  c->drive_ready = k == 1;
  if (c->drive_ready) p->drive_again = 1;
}

static void plan_write(distd_peers *p, int r) {
  conn *c = p->peers[r].out;
  struct iovec iov[IOV_BATCH];
  int n = c ? distd_conn_plan_write(c, iov) : 0;
  int i = n ? distd_batch_add(p->batch, DISTD_BATCH_WRITE, c->fd, iov, n) : -1;
  if (i >= 0) p->call_ranks[i] = -1 - r;
}

/* Takes what each call of the pass moved. */
static void take_results(distd_peers *p, int n) {
  for (int i = 0; i < n; i++) {
    int r = p->call_ranks[i];
    ssize_t res = p->call_results[i];
    if (r < 0) {
      distd_conn_write_done(p->peers[-1 - r].out, res);
      continue;
    }
    conn *c = p->peers[r].in;
    c->drive_ready = distd_conn_drive_done(c, &p->read_plans[r], res) == 1;
    if (c->drive_ready) p->drive_again = 1;
  }
}

/* One pass over every connection: the reads of those that may have bytes
 * (drive_ready, or all with read_all) and every queued write, in one batch
 * (peer_batch.h); fills fds (and pollranks) with what to wait for and
 * returns how many. Without io_uring each read is a system call of its
 * own, so only what poll() named is read while spinning. */
static int drive_pass(distd_peers *p, struct pollfd *fds, int read_all) {
  int n = 0;
  p->drive_again = 0;
  /* Writes first: the peers wait for them, and a read that finds bytes
   * does its own work (the copy, TCP's acknowledgement) before the next
   * call of the batch runs. */
  for (int r = 0; r < p->world; r++)
    if (r != p->rank) plan_write(p, r);
  for (int r = 0; r < p->world; r++)
    if (r != p->rank) plan_read(p, r, read_all);
  take_results(p, distd_batch_run(p->batch, p->call_results));
  for (int r = 0; r < p->world; r++) {
    if (r == p->rank) continue;
    conn *c = p->peers[r].in;
    if (c && c->owned && !c->read_blocked) {
      p->pollranks[n] = r;
      fds[n++] = (struct pollfd){c->fd, POLLIN, 0};
    }
    c = p->peers[r].out;
    if (c && distd_conn_driver_has_queued(c)) {
      p->pollranks[n] = -1;
      fds[n++] = (struct pollfd){c->fd, POLLOUT, 0};
    }
  }
  return n;
}

/* What poll() found readable (or broken) is read on the next pass. By
 * rank, not pointer: the loop thread may have closed a connection while
 * mu was released. */
static void note_readable(distd_peers *p, const struct pollfd *fds, int n) {
  for (int i = 0; i < n; i++) {
    conn *c = p->pollranks[i] >= 0 ? p->peers[p->pollranks[i]].in : NULL;
    if (c && c->fd == fds[i].fd && (fds[i].revents & (POLLIN | POLLERR | POLLHUP)))
      c->drive_ready = 1;
  }
}

/* A new driver reads at once the parked sockets that hold staged bytes,
 * which poll() cannot see. Without io_uring, for the others the first
 * poll() says which to read (a driver that read every socket at its start
 * paid a read() per empty socket: two per op at W=4 for global_scatter,
 * whose headers and rows are two transfers); with it, a spinning first
 * pass reads them all for one system call. Readiness a previous driver
 * saw and left unread stays marked. */
static void mark_owned_ready(distd_peers *p) {
  for (int r = 0; r < p->world; r++) {
    conn *c = p->peers[r].in;
    if (c && c->owned && distd_conn_has_staged(c)) c->drive_ready = 1;
  }
}

/* Without io_uring: while the driver spins on one socket and has nothing
 * to write, reading that socket is the readiness check: one system call where poll() and
 * then read() were two, so a frame is read as soon as it is there (the
 * raw-TCP anchor also reads before it polls). Every SPIN_POLL_EVERY-th
 * pass still polls, for the wake-up eventfd. At W=2, 1 KiB all-to-all,
 * 9.9 -> 9.0 system calls per barrier + op over both daemons, and in the
 * machine's slow minutes, where one rank waits for the other's frames in
 * every op, 14.6 -> 13.0 us. */
static int read_instead_of_poll(distd_peers *p, int n) {
  if (n != 1 || p->pollranks[0] < 0 || p->drive_again) return 0;
  if (++p->spin_passes % SPIN_POLL_EVERY == 0) return 0;
  p->peers[p->pollranks[0]].in->drive_ready = 1; /* drive_pass held mu since: valid */
  return 1;
}

/* Other daemons on the same cores may be the ones the driver waits for. */
static void yield_cpu(distd_peers *p) {
  pthread_mutex_unlock(&p->mu);
  sched_yield();
  pthread_mutex_lock(&p->mu);
}

/* When x's wait must give up: its deadline, or silence_ms after bytes last
 * moved for it, whichever comes first. */
int64_t distd_xfer_wait_limit(const distd_xfer *x, int64_t deadline_ms) {
  int64_t silence = x->p->silence_ms;
  if (silence > 0 && x->moved_ms + silence < deadline_ms) return x->moved_ms + silence;
  return deadline_ms;
}

/* Drives until x is done or failed, its wait limit passed, or the data
 * plane closes. Called and returns with mu held; mu is released in poll().
 * For its first spin_us it polls without sleeping, yielding the CPU
 * between polls (other daemons on the same cores may be the ones it waits
 * for). */
void distd_drive(distd_xfer *x, int64_t deadline_ms) {
  distd_peers *p = x->p;
  struct pollfd *fds = p->pollfds;
  p->driver_x = x;
  p->driver_tid = pthread_self();
  mark_owned_ready(p);
  uint64_t spin_end = p->spin_us > 0 ? distd_now_ns() + (uint64_t)p->spin_us * 1000 : 0;
  /* With io_uring a pass costs one system call however many sockets it
   * reads, so it reads them all instead of asking poll() which: while
   * spinning, and when the last pass left more to read or write at once.
   * poll() then only puts the driver to sleep. */
  int cheap = distd_batch_cheap(p->batch), look_all = spin_end > 0;
  while (!x->err.code && x->pending > 0 && !p->closing) {
    claim_inbound(p);
    int n = drive_pass(p, fds, cheap && look_all);
    if (x->err.code || x->pending == 0) break;
    uint64_t now_ns = distd_now_ns(); /* one clock read per pass */
    int64_t left = distd_xfer_wait_limit(x, deadline_ms) - (int64_t)(now_ns / 1000000);
    if (left <= 0) break;
    int spin = now_ns < spin_end;
    look_all = spin || p->drive_again;
    if (cheap && look_all) {
      if (!p->drive_again) yield_cpu(p);
      continue;
    }
    if (spin && read_instead_of_poll(p, n)) {
      yield_cpu(p);
      continue;
    }
    fds[n++] = (struct pollfd){p->wake_fd, POLLIN, 0};
    int timeout = p->drive_again ? 0 : left < DRIVE_POLL_MAX_MS ? (int)left : DRIVE_POLL_MAX_MS;
    int spinning = timeout > 0 && now_ns < spin_end;
    if (spinning) timeout = 0;
    pthread_mutex_unlock(&p->mu);
    int ready = poll(fds, (nfds_t)n, timeout);
    if (ready > 0 && fds[n - 1].revents) {
      uint64_t count;
      if (read(p->wake_fd, &count, sizeof count) < 0 && errno != EAGAIN) count = 0;
    }
    if (ready == 0 && spinning) sched_yield();
    pthread_mutex_lock(&p->mu);
    if (ready > 0) note_readable(p, fds, n - 1);
  }
  stop_driving(p);
}
