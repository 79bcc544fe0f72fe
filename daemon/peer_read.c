/* Reading frames from one peer socket: headers through a small stage
 * buffer, payloads straight into their destination (a posted receive, a
 * kept-aside copy, a control buffer), on the loop thread
 * (distd_conn_read_cb) or on the worker driving the sockets
 * (distd_conn_drive_read). Every function here runs with distd_peers.mu
 * held. */
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "clock.h"
#include "log.h"
#include "peer_internal.h"

#define HDR DIST_FRAME_HEADER_SIZE

/* A large frame that arrives before its receive is posted stays in the
 * socket (the sender's and our socket buffers hold it) for up to HOLD_MS:
 * the receive usually follows within a scheduling slice (a rank that left
 * a barrier first sends before the others posted), and the payload then
 * goes straight into it, not into a kept-aside copy (malloc, page faults
 * and a second memcpy). After HOLD_MS it is kept aside as before, so a
 * frame whose op is posted later, or never, holds the stream up only
 * briefly. distd_peers_unblock_readers looks again at each posted receive
 * and when hold_ev fires. */
static int hold_for_receive(conn *c, const dist_frame_header *h) {
  if (h->length < HOLD_MIN) return 0;
  int64_t now = distd_now_ms();
  if (!c->held_since_ms) c->held_since_ms = now;
  if (now - c->held_since_ms >= HOLD_MS) return 0;
  if (!c->p->hold_armed) { /* a timer that cannot be armed holds nothing */
    if (distd_timerfd_arm_ms(c->p->hold_tfd, HOLD_MS) != 0) return 0;
    c->p->hold_armed = 1;
  }
  return 1;
}

/* Chooses where a DATA payload goes; returns 1 when the frame must wait
 * (backpressure) and 0 otherwise. */
static int data_target(conn *c, const dist_frame_header *h) {
  distd_peers *p = c->p;
  c->rmode = M_DISCARD;
  if (distd_remembered_find(p, h->op_id)) return 0;
  recv_slot *s = distd_find_posted_recv(p, h->op_id, c->rank, h->tag);
  if (s && distd_xfer_signature_clash(s->x, c->rank, h->aux)) return 0;
  if (s && !s->any_buf && s->len != h->length) {
    distd_xfer_fail(s->x, DIST_EPROTO,
                    "rank %d sent %llu bytes for op %llu tag %u, but rank %d expects %zu",
                    c->rank, (unsigned long long)h->length,
                    (unsigned long long)h->op_id, h->tag, p->rank, s->len);
    return 0;
  }
  if (s) {
    if (s->any_buf) {
      s->any_tmp = malloc(h->length ? h->length : 1);
      if (!s->any_tmp) {
        char doing[96];
        snprintf(doing, sizeof doing, "receiving %llu bytes from rank %d",
                 (unsigned long long)h->length, c->rank);
        distd_xfer_out_of_memory(s->x, doing);
        return 0; /* the payload is discarded */
      }
      s->len = h->length;
    }
    c->dst = s->any_buf ? s->any_tmp : s->buf;
    s->reader = c;
    c->slot = s;
    c->rmode = M_RECV;
    return 0;
  }
  if (distd_signature_clash_live(p, h->op_id, c->rank, h->aux)) return 0;
  if (hold_for_receive(c, h)) return 1;
  if (h->length > 0 && p->unexpected_bytes + h->length > p->unexpected_limit) return 1;
  unexpected *u = calloc(1, sizeof *u);
  uint8_t *data = malloc(h->length ? h->length : 1);
  if (!u || !data) {
    free(u);
    free(data);
    /* Waiting would not help: fail the op here, so its receive fails with
     * the reason instead of a timeout, and drop the payload. */
    dist_errbuf why = DIST_ERRBUF_INIT;
    dist_fail(&why, DIST_ENOMEM, "op %llu: out of memory keeping data from rank %d",
              (unsigned long long)h->op_id, c->rank);
    distd_remember_op(p, h->op_id, DISTD_DROPPED_HERE, DIST_ENOMEM, dist_errbuf_msg(&why));
    distd_fail_op_xfers(p, h->op_id, NULL, &why); /* those already made */
    return 0;
  }
  *u = (unexpected){.op_id = h->op_id, .src = c->rank, .tag = h->tag,
                    .data = data, .len = h->length, .signature = h->aux,
                    .kept_ms = distd_now_ms()};
  dlist_push(&p->unexpected, &u->link);
  p->unexpected_bytes += h->length;
  c->unexp = u;
  c->dst = data;
  c->rmode = M_UNEXP;
  return 0;
}

static int on_header(conn *c) {
  distd_peers *p = c->p;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_frame_header h;
  if (dist_frame_decode(c->stage + c->st_off, &h, &eb) < 0) {
    if (!c->outbound && !c->greeted && h.magic == DIST_FRAME_MAGIC) {
      distd_conn_reject(c, -1, eb.msg);
      return -1;
    }
    log_warn("peer connection (rank %d): %s", c->rank, eb.msg);
    distd_conn_fail(c, eb.msg);
    return -1;
  }
  if (!distd_conn_kind_allowed(c, h.kind) || (c->greeted && (int)h.src_rank != c->rank)) {
    distd_conn_failf(c, "protocol violation: frame kind %u from rank %u", h.kind, h.src_rank);
    return -1;
  }
  int ctl = h.kind == DIST_FRAME_HELLO || h.kind == DIST_FRAME_HELLO_REJECT ||
            h.kind == DIST_FRAME_ABORT || h.kind == DIST_FRAME_CLOSE ||
            h.kind == DIST_FRAME_ABORT_RANGE;
  if ((ctl && h.length > CTL_MAX) || (h.kind == DIST_FRAME_HELLO && h.length != DIST_HELLO_SIZE) ||
      (!ctl && h.kind != DIST_FRAME_DATA && h.length != 0)) {
    distd_conn_failf(c, "protocol violation: frame kind %u with %llu payload bytes", h.kind,
               (unsigned long long)h.length);
    return -1;
  }
  if (h.kind == DIST_FRAME_DATA && h.length > p->max_frame) {
    log_warn("peer rank %d: DATA frame of %llu bytes is longer than max_frame_size (%zu)",
             c->rank, (unsigned long long)h.length, p->max_frame);
    distd_conn_failf(c, "protocol violation: DATA frame of %llu bytes exceeds max_frame_size (%zu)",
               (unsigned long long)h.length, p->max_frame);
    return -1;
  }
  if (h.kind == DIST_FRAME_DATA) {
    if (data_target(c, &h)) {
      c->read_blocked = 1;
      return 0;
    }
    c->held_since_ms = 0;
  } else if (ctl) {
    c->rmode = M_CTL;
    c->dst = c->ctl;
    c->ctl_len = h.length;
  } else {
    c->rmode = M_DISCARD;
  }
  c->st_off += HDR;
  c->cur = h;
  c->rstate = R_PAYLOAD;
  c->remaining = h.length;
  if (h.kind == DIST_FRAME_HELLO_ACK) return distd_conn_on_ack(c, &h);
  if (h.kind == DIST_FRAME_PONG) distd_peer_pong(p, c->rank, h.aux);
  if (h.kind == DIST_FRAME_PING) {
    dist_frame_header pong = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_PONG,
                              0, (uint32_t)p->rank, 0, 0, h.aux};
    distd_conn_queue_ctl(c, &pong, NULL, 0);
    return distd_conn_flush(c, !distd_on_driver(p));
  }
  return 0;
}

static int finish_payload(conn *c) {
  peer *pe = distd_conn_peer(c);
  c->rstate = R_HEADER;
  if (c->cur.kind == DIST_FRAME_DATA && pe) pe->stats.bytes_received += c->cur.length;
  switch (c->rmode) {
  case M_RECV: {
    recv_slot *s = c->slot;
    c->slot = NULL;
    s->reader = NULL;
    distd_recv_finished(s);
    return 0;
  }
  case M_UNEXP: {
    unexpected *u = c->unexp;
    c->unexp = NULL;
    u->complete = 1;
    distd_unexpected_finished(c->p, u);
    return 0;
  }
  case M_CTL:
    return distd_conn_on_control(c);
  default:
    return 0;
  }
}

/* Back to the usual stage once a spill buffer is read down to less than
 * a header (all that read_step needs more bytes for). */
static void unspill(conn *c) {
  if (!c->own_stage) return;
  size_t left = c->st_end - c->st_off;
  memcpy(c->own_stage, c->stage + c->st_off, left);
  free(c->stage);
  c->stage = c->own_stage;
  c->own_stage = NULL;
  c->st_off = 0;
  c->st_end = left;
}

/* A read that returned n <= 0 (err: its errno): 0 when the socket is only
 * empty for now, -1 when the connection is gone (and failed here). */
static int read_failed(conn *c, ssize_t n, int err) {
  if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) return 0;
  distd_conn_fail(c, n == 0 ? "connection closed by peer" : distd_conn_io_reason(c, err));
  return -1;
}

static void plan_one(distd_read_plan *rp, int kind, void *buf, size_t len) {
  rp->kind = kind;
  rp->iov[0] = (struct iovec){buf, len};
  rp->niov = 1;
  rp->asked = len;
}

/* A read of more into the stage. */
static void plan_stage(conn *c, distd_read_plan *rp) {
  unspill(c);
  if (c->st_off == c->st_end) c->st_off = c->st_end = 0;
  else if (c->st_off > 0 && c->st_end - c->st_off < HDR) {
    memmove(c->stage, c->stage + c->st_off, c->st_end - c->st_off);
    c->st_end -= c->st_off;
    c->st_off = 0;
  }
  plan_one(rp, READ_STAGE, c->stage + c->st_end, STAGE_SIZE - c->st_end);
}

/* A read of the rest of the payload straight into its destination. */
static void plan_direct(conn *c, distd_read_plan *rp) {
  plan_one(rp, READ_DIRECT, c->dst, c->remaining);
}

static void take_staged(conn *c) {
  size_t take = c->st_end - c->st_off;
  if (take > c->remaining) take = c->remaining;
  if (c->rmode != M_DISCARD) {
    memcpy(c->dst, c->stage + c->st_off, take);
    c->dst += take;
  }
  c->st_off += take;
  c->remaining -= take;
}

/* A payload arriving for a posted receive keeps its xfer's wait alive. */
static void note_moved(conn *c) {
  if (c->rstate != R_PAYLOAD) return;
  if (c->rmode == M_RECV && c->slot) distd_xfer_moved(c->slot->x);
  else if (c->rmode == M_UNEXP && c->unexp && c->unexp->claim) distd_xfer_moved(c->unexp->claim->x);
}

int distd_conn_has_staged(const conn *c) {
  if (c->rstate == R_HEADER) return c->st_end - c->st_off >= HDR;
  return c->remaining == 0 || c->st_off < c->st_end;
}

/* ---- reading ahead into a posted receive ----
 * A read that starts a frame fills the stage: a large payload then costs a
 * second read() for the rest, and a copy out of the stage for its start.
 * When the driver waits for a large receive from this peer, the next
 * frame is most likely its (distd_guess_next_recv), so one readv() puts
 * the header in the stage, the payload straight into the receive and what
 * follows back in the stage. The guess may look past one short frame of
 * known length (the lead: global_scatter's counts before its rows), which
 * goes to the stage with the header after it. A wrong guess (another
 * frame came first) is put back in stream order in a spill buffer and
 * read from there. */

static int read_step(conn *c, size_t *budget, int until_short);

static recv_slot *read_ahead_guess(conn *c, size_t *lead) {
  *lead = 0;
  if (!c->tp->readv || c->st_off != c->st_end || c->own_stage) return NULL;
  return distd_guess_next_recv(c->p, c->rank, lead);
}

/* The guess was wrong: the stage holds what is left of its bytes up to
 * `at` (st_off..at) and what followed the receive's bytes (at..st_end);
 * the mid_len bytes in the receive belong between them. */
static int spill(conn *c, size_t at, const uint8_t *mid, size_t mid_len) {
  size_t head = at - c->st_off, tail = c->st_end - at, len = head + mid_len + tail;
  uint8_t *b = malloc(len);
  if (!b) {
    distd_conn_fail(c, "out of memory reading from the peer");
    return -1;
  }
  memcpy(b, c->stage + c->st_off, head);
  memcpy(b + head, mid, mid_len);
  memcpy(b + head + mid_len, c->stage + at, tail);
  c->own_stage = c->stage;
  c->stage = b;
  c->st_off = 0;
  c->st_end = len;
  return 0;
}

/* Takes the lead frame out of the stage, as reading would, when its
 * header says it is the lead (a DATA frame of the predicted length);
 * returns 1 when done, 0 when it was not the lead or had to wait, -1 when
 * the connection failed. It is whole in the stage, so no step reads. */
static int take_lead(conn *c, size_t lead) {
  dist_frame_header h;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (dist_frame_decode(c->stage, &h, &eb) < 0 || h.kind != DIST_FRAME_DATA ||
      h.length != lead - HDR)
    return 0;
  size_t budget = SIZE_MAX;
  while (c->st_off < lead || c->rstate != R_HEADER) {
    int r = read_step(c, &budget, 1);
    if (r <= 0) return r;
  }
  return 1;
}

/* A read of the header (after the lead) into the stage, the guessed
 * payload into s and what follows back into the stage. */
static void plan_ahead(conn *c, recv_slot *s, size_t lead, distd_read_plan *rp) {
  size_t at = lead + HDR; /* where the guessed payload starts in the stream */
  rp->kind = READ_AHEAD;
  rp->iov[0] = (struct iovec){c->stage, at};
  rp->iov[1] = (struct iovec){s->buf, s->len};
  rp->iov[2] = (struct iovec){c->stage + at, STAGE_SIZE - at};
  rp->niov = 3;
  rp->asked = STAGE_SIZE + s->len;
  rp->guess = s;
  rp->lead = lead;
}

/* The read-ahead returned n > 0 bytes: 0, or -1 when the connection failed. */
static int ahead_done(conn *c, const distd_read_plan *rp, size_t n) {
  recv_slot *s = rp->guess;
  size_t at = rp->lead + HDR;
  c->st_off = 0;
  if (n <= at) {
    c->st_end = n;
    return 0;
  }
  size_t in_recv = n - at < s->len ? n - at : s->len;
  c->st_end = n - in_recv;
  int took = rp->lead ? take_lead(c, rp->lead) : 1;
  if (took < 0 || (took == 1 && on_header(c) < 0)) return -1;
  if (took == 1 && c->rstate == R_PAYLOAD && c->rmode == M_RECV && c->slot == s) {
    c->dst += in_recv; /* on_header pointed the payload at s->buf */
    c->remaining -= in_recv;
    return 0;
  }
  return spill(c, at, s->buf, in_recv);
}

/* One step of the read state machine that needs no read: 1 to go on, 0
 * to stop for now, -1 when the connection is gone, or STEP_READ with *rp
 * the read the next step needs. With until_short, a read that returned
 * less than it asked for counts as having emptied the socket: the next
 * step needing a read returns 0 instead of asking for a read() that would
 * only say EAGAIN (the driver's poll() tells when more bytes come). */
static int step_or_plan(conn *c, int until_short, distd_read_plan *rp) {
  int needs_read = !distd_conn_has_staged(c);
  if (needs_read && until_short && c->short_read) return 0;
  if (c->rstate == R_HEADER) {
    if (!needs_read) {
      if (on_header(c) < 0) return -1;
      return c->read_blocked ? 0 : 1;
    }
    size_t lead = 0;
    recv_slot *guess = until_short ? read_ahead_guess(c, &lead) : NULL;
    if (guess) plan_ahead(c, guess, lead, rp);
    else plan_stage(c, rp);
    return STEP_READ;
  }
  if (c->remaining == 0) return finish_payload(c) < 0 ? -1 : 1;
  if (c->st_off < c->st_end) {
    take_staged(c);
    return 1;
  }
  if (c->rmode != M_DISCARD && c->remaining >= DIRECT_READ_MIN) plan_direct(c, rp);
  else plan_stage(c, rp);
  return STEP_READ;
}

/* The read *rp planned returned n (bytes, or -errno): 1 when it moved
 * bytes, 0 when the socket was empty, -1 when the connection is gone. */
static int read_done(conn *c, const distd_read_plan *rp, ssize_t n) {
  if (n <= 0) return read_failed(c, n, (int)-n);
  c->short_read = (size_t)n < rp->asked;
  if (rp->kind == READ_STAGE) {
    c->st_end += (size_t)n;
  } else if (rp->kind == READ_DIRECT) {
    c->dst += n;
    c->remaining -= (size_t)n;
  } else if (ahead_done(c, rp, (size_t)n) < 0) {
    return -1;
  }
  note_moved(c);
  return 1;
}

static ssize_t make_read(conn *c, const distd_read_plan *rp) {
  ssize_t n = rp->niov == 1 ? c->tp->read(c, rp->iov[0].iov_base, rp->iov[0].iov_len)
                            : c->tp->readv(c, rp->iov, rp->niov);
  return n < 0 ? -errno : n;
}

/* One step, reading when it must (the loop thread's way). */
static int read_step(conn *c, size_t *budget, int until_short) {
  distd_read_plan rp;
  int r = step_or_plan(c, until_short, &rp);
  if (r != STEP_READ) return r;
  ssize_t n = make_read(c, &rp);
  r = read_done(c, &rp, n);
  if (r == 1) *budget = (size_t)n >= *budget ? 0 : *budget - (size_t)n;
  return r;
}

void distd_conn_read_cb(int fd, short what, void *arg) {
  (void)fd, (void)what;
  conn *c = arg;
  distd_peers *p = c->p;
  pthread_mutex_lock(&p->mu);
  if (c->failed) { /* the driver found it broken (fail_conn) */
    char reason[sizeof c->lost_reason];
    snprintf(reason, sizeof reason, "%s", c->lost_reason);
    distd_conn_lost(c, reason);
    pthread_mutex_unlock(&p->mu);
    return;
  }
  if (c->owned) { /* a callback that was on its way when the driver took it */
    pthread_mutex_unlock(&p->mu);
    return;
  }
  if (c->handshaking) {
    distd_conn_handshake(c);
    pthread_mutex_unlock(&p->mu);
    return;
  }
  size_t budget = READ_BUDGET;
  int r = 1;
  while (r == 1 && budget > 0) r = read_step(c, &budget, 0);
  if (r == 0 && c->read_blocked) distd_conn_watch_read(c, 0);
  /* Out of budget, or bytes the transport holds (TLS records already read
   * from the socket): neither raises an event, so come back explicitly. */
  if (r == 1 || (r == 0 && !c->read_blocked && c->tp->pending(c) > 0))
    event_active(c->rev, EV_READ, 0);
  pthread_mutex_unlock(&p->mu);
}

/* The driver's own transfer is complete: it reads no further frame. */
static int driver_done(const distd_peers *p) {
  return p->driver_x && (p->driver_x->pending == 0 || p->driver_x->err.code);
}

/* The driver's steps up to its next read: STEP_READ with *rp, 1 when its
 * own transfer is complete, 0 or -1 as read_step. Stopping at a frame
 * boundary once done leaves the next operation's frames in the socket,
 * for its own driver to read straight into the receives it will have
 * posted, rather than into kept-aside copies (a rank leaving a barrier
 * early sends its data while this one is still reading the barrier). */
static int drive_steps(conn *c, distd_read_plan *rp) {
  int r = 1;
  while (r == 1 && !(c->rstate == R_HEADER && driver_done(c->p)))
    r = step_or_plan(c, 1, rp);
  return r;
}

int distd_conn_drive_plan(conn *c, distd_read_plan *rp) {
  c->short_read = 0; /* a new pass: the last one's empty socket may have more */
  return drive_steps(c, rp);
}

int distd_conn_drive_done(conn *c, const distd_read_plan *rp, ssize_t n) {
  int r = read_done(c, rp, n);
  if (r != 1) return r;
  distd_read_plan next;
  r = drive_steps(c, &next);
  return r == STEP_READ ? 1 : r; /* a read that was not short: more may be there */
}
