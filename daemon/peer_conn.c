/* One peer socket: its lifetime, writing queued frames with writev from
 * the callers' buffers, the transport handshake (TLS), and what happens
 * when the socket fails. Reading frames is peer_read.c, the HELLO
 * handshake and control frames peer_control.c. Bytes move through c->tp
 * (peer_transport.h: plain TCP or TLS). Every function here runs with
 * distd_peers.mu held. */
#include <errno.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "peer_internal.h"

#define HDR DIST_FRAME_HEADER_SIZE

conn *distd_conn_new(distd_peers *p, int fd, int outbound, int rank) {
  conn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->p = p;
  c->fd = fd;
  c->outbound = outbound;
  c->rank = rank;
  c->opened_ms = distd_now_ms();
  c->tp = p->tp;
  c->tls_gen = p->tls_gen;
  c->handshaking = c->tp->handshake != NULL;
  dlist_init(&c->link);
  c->stage = malloc(STAGE_SIZE);
  c->rev = event_new(p->base, fd, EV_READ | EV_PERSIST, distd_conn_read_cb, c);
  c->wev = event_new(p->base, fd, EV_WRITE | EV_PERSIST, distd_conn_write_cb, c);
  if (!c->stage || !c->rev || !c->wev || c->tp->attach(c, p->tls_ctx) < 0) {
    if (c->rev) event_free(c->rev);
    if (c->wev) event_free(c->wev);
    free(c->stage);
    free(c);
    return NULL;
  }
  return c;
}

/* Why the transport failed: its own words, or errno's. */
const char *distd_conn_io_reason(const conn *c, int e) {
  return c->tp_error[0] ? c->tp_error : distd_peer_errno_reason(e);
}

/* Lets go of whatever the reader was filling, then releases the socket. */
void distd_conn_free(conn *c) {
  if (!c) return;
  if (c->rstate == R_PAYLOAD && c->rmode == M_RECV && c->slot) {
    c->slot->reader = NULL;
    free(c->slot->any_tmp);
    c->slot->any_tmp = NULL;
  }
  if (c->rstate == R_PAYLOAD && c->rmode == M_UNEXP && c->unexp)
    distd_unexpected_free(c->p, c->unexp);
  if (c->in_epoll) distd_conn_watch_read(c, 0);
  event_free(c->rev);
  event_free(c->wev);
  c->tp->detach(c);
  close(c->fd);
  dlist_remove(&c->link);
  free(c->stage);
  free(c->own_stage);
  free(c->wbuf);
  free(c);
}

peer *distd_conn_peer(conn *c) {
  return c->rank >= 0 ? &c->p->peers[c->rank] : NULL;
}

void distd_peer_update_connected(peer *pe) {
  pe->stats.out_up = pe->out && pe->out->greeted;
  pe->stats.in_up = pe->in && pe->in->greeted;
  pe->stats.connected = pe->stats.out_up && pe->stats.in_up;
  if (pe->stats.connected) pe->lost = 0;
}

/* An outbound connection's queue restarts at a frame boundary on the next
 * connection: frames of failed transfers and control frames are dropped. */
static void purge_outq(peer *pe) {
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &pe->outq) {
    send_item *it = dlist_entry(pos, send_item, link);
    /* A transfer posted while the peer was down can still go. */
    if (it->x && it->done == 0 && !it->x->err.code) continue;
    dlist_remove(&it->link);
    dlist_remove(&it->xlink);
    distd_send_item_free(pe, it);
  }
}

/* Ends c: "peer rank R (ADDR)" then how ("lost", ": closed") and why,
 * logged and given to what needed the peer once c had been greeted. */
static void conn_end(conn *c, const char *how, const char *why) {
  distd_peers *p = c->p;
  peer *pe = distd_conn_peer(c);
  int was_greeted = c->greeted, outbound = c->outbound;
  /* why may be c's own (its transport's error): c is freed below. */
  char reason[sizeof c->tp_error];
  snprintf(reason, sizeof reason, "%s", why);
  if (pe && outbound && pe->out == c) pe->out = NULL;
  if (pe && !outbound && pe->in == c) pe->in = NULL;
  distd_conn_free(c);
  if (!pe) return;
  if (was_greeted) {
    char msg[400];
    snprintf(msg, sizeof msg, "peer rank %d (%s)%s: %s", pe->rank,
             distd_peer_addr(p, pe->rank), how, reason);
    log_warn("%s", msg);
    distd_peer_set_error(pe, "%s", msg);
    pe->lost = 1;
    snprintf(pe->lost_reason, sizeof pe->lost_reason, "%s", msg);
    distd_peer_update_connected(pe);
    distd_fail_xfers_of_peer(p, pe->rank, msg);
  } else if (outbound) {
    distd_peer_set_error(pe, "%s", reason);
    log_debug("peer rank %d: %s", pe->rank, reason);
  }
  if (outbound) {
    purge_outq(pe);
    distd_peer_schedule_redial(pe, p);
  }
}

void distd_conn_lost(conn *c, const char *why) { conn_end(c, " lost", why); }

void distd_conn_close(conn *c, const char *why) { conn_end(c, ": closed", why); }

/* Ends c for reason. The read path runs on the loop thread or on the
 * worker driving the sockets; only the loop thread may free a connection,
 * so the driver marks it failed, gives it back and lets the loop thread
 * close it (distd_conn_read_cb). */
void distd_conn_fail(conn *c, const char *reason) {
  if (!distd_on_driver(c->p)) {
    distd_conn_lost(c, reason);
    return;
  }
  c->failed = 1;
  c->owned = 0;
  /* cut to fit: the precision tells the compiler so (-Wformat-truncation at -O3) */
  snprintf(c->lost_reason, sizeof c->lost_reason, "%.*s", (int)sizeof c->lost_reason - 1, reason);
  event_active(c->rev, EV_READ, 0);
}

void distd_conn_failf(conn *c, const char *fmt, ...) {
  char reason[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  distd_conn_fail(c, reason);
}

const char *distd_peer_errno_reason(int e) {
  switch (e) {
  case ECONNRESET: return "connection reset";
  case EPIPE: return "broken pipe";
  case ETIMEDOUT: return "connection timed out";
  case ECONNREFUSED: return "connection refused";
  default: return strerror(e);
  }
}

void distd_conn_want_write(conn *c) { event_add(c->wev, NULL); }

void distd_conn_queue_ctl(conn *c, const dist_frame_header *h,
                          const void *payload, size_t len) {
  size_t need = c->wlen + HDR + len;
  if (need > c->wcap) {
    size_t cap = need < 256 ? 256 : need * 2;
    uint8_t *nb = realloc(c->wbuf, cap);
    if (!nb) return; /* control frames are tiny; dropping a PONG is harmless */
    c->wbuf = nb;
    c->wcap = cap;
  }
  dist_frame_encode(h, c->wbuf + c->wlen);
  if (len) memcpy(c->wbuf + c->wlen + HDR, payload, len);
  c->wlen += HDR + len;
}


/* The kind of a queued frame, read back from its encoded header. */
static unsigned item_kind(const send_item *it) {
  unsigned kind = (unsigned)it->hdr[6] | (unsigned)it->hdr[7] << 8;
  return kind <= DIST_FRAME_KIND_LAST ? kind : 0;
}

static void complete_item(distd_peers *p, send_item *it) {
  dlist_remove(&it->link);
  if (it->dst >= 0 && it->dst < p->world) {
    p->peers[it->dst].stats.bytes_sent += it->len;
    p->peers[it->dst].stats.frames_sent[item_kind(it)]++;
  }
  if (it->x) {
    distd_xfer_send_done(it);
    return;
  }
  distd_send_item_free(&p->peers[it->dst], it);
}

/* Adds base[0, len) to a writev batch, as much as cap leaves room for. */
static void add_iov(struct iovec *iov, int *n, size_t *total, size_t cap, const void *base,
                    size_t len) {
  if (len > cap - *total) len = cap - *total;
  if (len == 0) return;
  iov[(*n)++] = (struct iovec){(void *)base, len};
  *total += len;
}

/* Builds one writev batch of at most cap bytes from the head of the queue;
 * returns its size. */
static size_t gather(dlist *q, struct iovec *iov, int *n, size_t cap) {
  size_t total = 0;
  *n = 0;
  for (dlist *pos = q->next; pos != q && *n < IOV_BATCH - 1 && total < cap; pos = pos->next) {
    send_item *it = dlist_entry(pos, send_item, link);
    if (it->done < HDR) add_iov(iov, n, &total, cap, it->hdr + it->done, HDR - it->done);
    size_t off = it->done > HDR ? it->done - HDR : 0;
    if (it->len > off) add_iov(iov, n, &total, cap, it->payload + off, it->len - off);
  }
  return total;
}

static void account(distd_peers *p, dlist *q, size_t w) {
  while (!dlist_empty(q)) {
    send_item *it = dlist_entry(q->next, send_item, link);
    size_t left = HDR + it->len - it->done;
    if (w < left) {
      it->done += w;
      if (w && it->x) distd_xfer_moved(it->x);
      return;
    }
    w -= left;
    it->done += left;
    complete_item(p, it);
  }
}

/* Writes at most cap bytes of the queue. Returns 1 when everything went
 * out, 0 when the socket is full or cap was reached, or -errno. */
static int flush_outq(conn *c, size_t cap) {
  dlist *q = &c->p->peers[c->rank].outq;
  struct iovec iov[IOV_BATCH];
  for (;;) {
    int n;
    size_t total = gather(q, iov, &n, cap);
    if (n == 0) return dlist_empty(q);
    ssize_t w = c->tp->writev(c, iov, n);
    if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
    account(c->p, q, (size_t)w);
    cap -= (size_t)w;
    if ((size_t)w < total) return 0;
  }
}

static int flush_ctl(conn *c) {
  while (c->woff < c->wlen) {
    struct iovec iov = {c->wbuf + c->woff, c->wlen - c->woff};
    ssize_t w = c->tp->writev(c, &iov, 1);
    if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
    c->woff += (size_t)w;
  }
  c->woff = c->wlen = 0;
  return 1;
}

int distd_conn_flush(conn *c, int in_loop) {
  if (c->connecting || c->handshaking) return 0;
  int r = flush_ctl(c);
  if (r == 1 && c->close_after_flush) {
    if (!in_loop) {
      distd_conn_want_write(c);
      return 0;
    }
    distd_conn_free(c); /* a rejected, never greeted inbound connection */
    return -1;
  }
  if (r == 1 && c->outbound && c->greeted) r = flush_outq(c, SIZE_MAX);
  if (r < 0) {
    if (!in_loop) {
      distd_conn_want_write(c); /* the loop thread finds the error again */
      return 0;
    }
    distd_conn_lost(c, distd_conn_io_reason(c, -r));
    return -1;
  }
  if (r == 0) distd_conn_want_write(c);
  else if (in_loop) event_del(c->wev);
  return 0;
}

/* Whether c's next byte out starts a frame: a frame written in between
 * would be read as the rest of the one cut short. */
static int between_frames(conn *c) {
  if (!c->outbound) return 1; /* flush_ctl finishes its control frames first */
  dlist *q = &c->p->peers[c->rank].outq;
  return c->woff == 0 &&
         (dlist_empty(q) || dlist_entry(q->next, send_item, link)->done == 0);
}

void distd_conn_say_goodbye(conn *c, const char *why) {
  if (!c->greeted || c->connecting || c->handshaking || !between_frames(c)) return;
  size_t len = strnlen(why, CTL_MAX);
  dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_CLOSE,
                         0, (uint32_t)c->p->rank, 0, len, 0};
  distd_conn_queue_ctl(c, &h, why, len);
  flush_ctl(c); /* once, without waiting: the caller closes c next */
}

static int driver_may_write(const conn *c) {
  return !c->connecting && !c->handshaking && c->greeted && !c->close_after_flush;
}

int distd_conn_driver_flush(conn *c, size_t cap) {
  if (!driver_may_write(c)) return 0;
  int r = flush_ctl(c);
  if (r == 1) r = flush_outq(c, cap);
  if (r < 0) distd_conn_want_write(c); /* the loop thread finds the error again */
  return r == 0;
}

/* Control bytes (PONG) are rare and few: they go out at once, and the
 * queue only after them. */
int distd_conn_plan_write(conn *c, struct iovec *iov) {
  if (!driver_may_write(c)) return 0;
  int r = flush_ctl(c);
  if (r < 0) distd_conn_want_write(c);
  if (r != 1) return 0;
  int n;
  gather(&c->p->peers[c->rank].outq, iov, &n, SIZE_MAX);
  return n;
}

void distd_conn_write_done(conn *c, ssize_t w) {
  if (w >= 0) account(c->p, &c->p->peers[c->rank].outq, (size_t)w);
  else if (w != -EAGAIN && w != -EWOULDBLOCK)
    distd_conn_want_write(c); /* the loop thread finds the error again */
}

int distd_conn_driver_has_queued(const conn *c) {
  return driver_may_write(c) &&
         (c->woff < c->wlen || !dlist_empty(&c->p->peers[c->rank].outq));
}

static void finish_connect(conn *c) {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) {
    distd_conn_failf(c, "connect to %s: %s", distd_peer_addr(c->p, c->rank),
               distd_peer_errno_reason(err));
    return;
  }
  c->connecting = 0;
  if (c->handshaking) {
    distd_conn_handshake(c);
    return;
  }
  event_add(c->rev, NULL);
  distd_conn_flush(c, 1);
}

/* An outbound TLS connection must reach the rank it dialled: the CA signs
 * every daemon, so the name in the certificate is what tells them apart. */
static int check_dialled_rank(conn *c) {
  if (c->cert_rank == DISTD_CERT_RANK_UNCHECKED || c->cert_rank == c->rank) return 0;
  char why[200];
  if (c->cert_rank == DISTD_CERT_RANK_NONE)
    snprintf(why, sizeof why, "its certificate names no rank (DNS:%sN)", DISTD_TLS_RANK_PREFIX);
  else
    snprintf(why, sizeof why, "its certificate is for rank %d", c->cert_rank);
  log_warn("peer rank %d (%s): refused: %s", c->rank, distd_peer_addr(c->p, c->rank), why);
  distd_conn_failf(c, "refused rank %d at %s: %s", c->rank, distd_peer_addr(c->p, c->rank), why);
  return -1;
}

void distd_conn_handshake(conn *c) {
  int r = c->tp->handshake(c);
  if (r < 0) {
    if (!c->outbound) /* nobody else will say why an inbound peer vanished */
      log_warn("peer connection refused: %s", c->tp_error);
    distd_conn_failf(c, "%s", c->tp_error);
    return;
  }
  if (r == 0) {
    event_add(c->rev, NULL);
    if (c->hs_want == EV_WRITE) distd_conn_want_write(c);
    else event_del(c->wev);
    return;
  }
  c->handshaking = 0;
  event_del(c->wev);
  if (c->outbound && check_dialled_rank(c) < 0) return;
  event_add(c->rev, NULL);
  distd_conn_flush(c, 1);
}

void distd_conn_write_cb(int fd, short what, void *arg) {
  (void)fd, (void)what;
  conn *c = arg;
  distd_peers *p = c->p;
  pthread_mutex_lock(&p->mu);
  if (c->connecting) {
    finish_connect(c);
  } else if (c->handshaking) {
    distd_conn_handshake(c);
  } else {
    int wants_read = c->read_wants_write;
    c->read_wants_write = 0;
    if (distd_conn_flush(c, 1) == 0 && wants_read) event_active(c->rev, EV_READ, 0);
  }
  pthread_mutex_unlock(&p->mu);
}

void distd_peer_queue_frame(distd_peers *p, int dst, send_item *it) {
  dlist_push(&p->peers[dst].outq, &it->link);
}

void distd_peers_unblock_readers(distd_peers *p) {
  if (p->closing) return;
  for (int r = 0; r < p->world; r++) {
    conn *c = p->peers[r].in;
    if (!c || !c->read_blocked) continue;
    c->read_blocked = 0;
    if (c->owned) { /* the driver reads it: the header is already staged */
      c->drive_ready = 1;
      distd_driver_wake(p);
      continue;
    }
    distd_conn_watch_read(c, 1);
    event_active(c->rev, EV_READ, 0); /* the waiting header is already staged */
  }
}
