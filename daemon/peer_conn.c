/* One peer socket: reading frames (headers through a small stage buffer,
 * payloads straight into their destination), writing queued frames with
 * writev from the caller's buffers, the transport handshake (TLS) and the
 * HELLO handshake, and what happens when the socket fails. Bytes move
 * through c->tp (peer_transport.h: plain TCP or TLS). Every function here
 * runs with distd_peers.mu held. */
#include <errno.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
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
static const char *io_reason(const conn *c, int e) {
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

static peer *conn_peer(conn *c) {
  return c->rank >= 0 ? &c->p->peers[c->rank] : NULL;
}

static void update_connected(peer *pe) {
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
    free(it->owned);
    free(it);
  }
}

void distd_conn_lost(conn *c, const char *reason) {
  distd_peers *p = c->p;
  peer *pe = conn_peer(c);
  int was_greeted = c->greeted, outbound = c->outbound;
  if (pe && outbound && pe->out == c) pe->out = NULL;
  if (pe && !outbound && pe->in == c) pe->in = NULL;
  distd_conn_free(c);
  if (!pe) return;
  if (was_greeted) {
    char msg[400];
    snprintf(msg, sizeof msg, "peer rank %d (%s) lost: %s", pe->rank,
             distd_peer_addr(p, pe->rank), reason);
    log_warn("%s", msg);
    distd_peer_set_error(pe, "%s", msg);
    pe->lost = 1;
    snprintf(pe->lost_reason, sizeof pe->lost_reason, "%s", msg);
    update_connected(pe);
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

/* Ends c for reason. The read path runs on the loop thread or on the
 * worker driving the sockets; only the loop thread may free a connection,
 * so the driver marks it failed, gives it back and lets the loop thread
 * close it (distd_conn_read_cb). */
static void fail_conn(conn *c, const char *reason) {
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

static void fail_connf(conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_connf(conn *c, const char *fmt, ...) {
  char reason[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  fail_conn(c, reason);
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


static void complete_item(distd_peers *p, send_item *it) {
  dlist_remove(&it->link);
  if (it->dst >= 0 && it->dst < p->world) p->peers[it->dst].stats.bytes_sent += it->len;
  if (it->x) {
    distd_xfer_send_done(it);
    return;
  }
  free(it->owned);
  free(it);
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
    distd_conn_lost(c, io_reason(c, -r));
    return -1;
  }
  if (r == 0) distd_conn_want_write(c);
  else if (in_loop) event_del(c->wev);
  return 0;
}

int distd_conn_driver_flush(conn *c, size_t cap) {
  if (c->connecting || c->handshaking || !c->greeted || c->close_after_flush) return 0;
  int r = flush_ctl(c);
  if (r == 1) r = flush_outq(c, cap);
  if (r < 0) distd_conn_want_write(c); /* the loop thread finds the error again */
  return r == 0;
}

static void finish_connect(conn *c) {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) {
    fail_connf(c, "connect to %s: %s", distd_peer_addr(c->p, c->rank),
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
  fail_connf(c, "refused rank %d at %s: %s", c->rank, distd_peer_addr(c->p, c->rank), why);
  return -1;
}

void distd_conn_handshake(conn *c) {
  int r = c->tp->handshake(c);
  if (r < 0) {
    if (!c->outbound) /* nobody else will say why an inbound peer vanished */
      log_warn("peer connection refused: %s", c->tp_error);
    fail_connf(c, "%s", c->tp_error);
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

/* ---- the handshake ---- */

static void reject(conn *c, int rank, const char *reason) {
  distd_peers *p = c->p;
  log_warn("rejected a peer connection claiming rank %d: %s", rank, reason);
  if (rank >= 0 && rank < p->world && rank != p->rank)
    distd_peer_set_error(&p->peers[rank], "rejected hello: %s", reason);
  size_t len = strnlen(reason, CTL_MAX);
  dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_HELLO_REJECT,
                         0, (uint32_t)p->rank, 0, len, 0};
  distd_conn_queue_ctl(c, &h, reason, len);
  c->close_after_flush = 1;
  event_del(c->rev);
  distd_conn_flush(c, 1);
}

static int hello_problem(distd_peers *p, const dist_hello *h, char *why, size_t n) {
  if (strcmp(h->cluster_id, p->cluster_id) != 0)
    snprintf(why, n, "cluster id '%s' differs from this daemon's '%s'", h->cluster_id,
             p->cluster_id);
  else if ((int)h->world_size != p->world)
    snprintf(why, n, "world size %u differs from this daemon's %d", h->world_size, p->world);
  else if (h->rank >= (uint32_t)p->world)
    snprintf(why, n, "rank %u is out of range for a world of %d", h->rank, p->world);
  else if ((int)h->rank == p->rank)
    snprintf(why, n, "rank %u is this daemon's own rank", h->rank);
  else
    return 0;
  return -1;
}

/* With TLS the claimed rank must be the one the certificate names. */
static int cert_problem(const conn *c, const dist_hello *h, char *why, size_t n) {
  if (c->cert_rank == DISTD_CERT_RANK_UNCHECKED || c->cert_rank == (int)h->rank) return 0;
  if (c->cert_rank == DISTD_CERT_RANK_NONE)
    snprintf(why, n, "claims rank %u but its certificate names no rank (DNS:%s%u)",
             h->rank, DISTD_TLS_RANK_PREFIX, h->rank);
  else
    snprintf(why, n, "claims rank %u but its certificate is for rank %d", h->rank,
             c->cert_rank);
  return -1;
}

static int on_hello(conn *c) {
  distd_peers *p = c->p;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_hello h;
  char why[300];
  if (dist_hello_decode(c->ctl, &h, &eb) < 0) {
    reject(c, -1, eb.msg);
    return -1;
  }
  if (hello_problem(p, &h, why, sizeof why) < 0 || cert_problem(c, &h, why, sizeof why) < 0) {
    reject(c, (int)h.rank, why);
    return -1;
  }
  peer *pe = &p->peers[h.rank];
  if (pe->in) distd_conn_lost(pe->in, "replaced by a new connection from the same rank");
  dlist_remove(&c->link);
  c->rank = (int)h.rank;
  c->greeted = 1;
  pe->in = c;
  distd_conn_greeted_inbound(c);
  update_connected(pe);
  log_info("peer rank %d (%s) connected inbound", pe->rank, distd_peer_addr(p, pe->rank));
  dist_frame_header ack = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_HELLO_ACK,
                           0, (uint32_t)p->rank, 0, 0, 0};
  distd_conn_queue_ctl(c, &ack, NULL, 0);
  return distd_conn_flush(c, 1);
}

static int on_ack(conn *c, const dist_frame_header *h) {
  distd_peers *p = c->p;
  peer *pe = conn_peer(c);
  if ((int)h->src_rank != c->rank) {
    fail_connf(c, "dialled rank %d at %s but rank %u answered", c->rank,
               distd_peer_addr(p, c->rank), h->src_rank);
    return -1;
  }
  c->greeted = 1;
  if (pe->ever_greeted) pe->stats.reconnects++;
  pe->ever_greeted = 1;
  pe->backoff_ms = p->backoff_min;
  update_connected(pe);
  log_info("peer rank %d (%s) connected outbound", pe->rank, distd_peer_addr(p, pe->rank));
  return distd_conn_flush(c, 1);
}

static int on_control(conn *c) {
  distd_peers *p = c->p;
  c->ctl[c->ctl_len] = 0;
  switch (c->cur.kind) {
  case DIST_FRAME_HELLO:
    return on_hello(c);
  case DIST_FRAME_HELLO_REJECT: {
    int rank = c->rank;
    fail_connf(c, "rank %d (%s) rejected our hello: %s", rank, distd_peer_addr(p, rank),
               (char *)c->ctl);
    log_warn("%s", p->peers[rank].stats.last_error);
    return -1;
  }
  case DIST_FRAME_ABORT: {
    int64_t code = -(int64_t)c->cur.aux;
    if (code >= 0 || code < DIST_ETOOBIG) code = DIST_EPEER;
    distd_handle_abort(p, c->rank, c->cur.op_id, (int)code, (char *)c->ctl);
    return 0;
  }
  default:
    return 0;
  }
}

/* ---- reading ---- */

static int kind_allowed(const conn *c, unsigned kind) {
  if (!c->outbound && !c->greeted) return kind == DIST_FRAME_HELLO;
  if (!c->outbound)
    return kind == DIST_FRAME_DATA || kind == DIST_FRAME_ABORT || kind == DIST_FRAME_PING;
  if (!c->greeted) return kind == DIST_FRAME_HELLO_ACK || kind == DIST_FRAME_HELLO_REJECT;
  return kind == DIST_FRAME_PONG;
}

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
  if (!evtimer_pending(c->p->hold_ev, NULL)) {
    struct timeval tv = {0, HOLD_MS * 1000};
    evtimer_add(c->p->hold_ev, &tv);
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
        distd_xfer_fail(s->x, DIST_ENOMEM, "out of memory receiving %llu bytes from rank %d",
                        (unsigned long long)h->length, c->rank);
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
  if (hold_for_receive(c, h)) return 1;
  if (h->length > 0 && p->unexpected_bytes + h->length > p->unexpected_limit) return 1;
  unexpected *u = calloc(1, sizeof *u);
  uint8_t *data = malloc(h->length ? h->length : 1);
  if (!u || !data) {
    free(u);
    free(data);
    /* Waiting would not help: fail the op here, so its receive fails with
     * the reason instead of a timeout, and drop the payload. */
    distd_remember_op(p, h->op_id, -1, DIST_ENOMEM, "out of memory keeping data from a peer");
    return 0;
  }
  *u = (unexpected){.op_id = h->op_id, .src = c->rank, .tag = h->tag,
                    .data = data, .len = h->length};
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
      reject(c, -1, eb.msg);
      return -1;
    }
    log_warn("peer connection (rank %d): %s", c->rank, eb.msg);
    fail_conn(c, eb.msg);
    return -1;
  }
  if (!kind_allowed(c, h.kind) || (c->greeted && (int)h.src_rank != c->rank)) {
    fail_connf(c, "protocol violation: frame kind %u from rank %u", h.kind, h.src_rank);
    return -1;
  }
  int ctl = h.kind == DIST_FRAME_HELLO || h.kind == DIST_FRAME_HELLO_REJECT ||
            h.kind == DIST_FRAME_ABORT;
  if ((ctl && h.length > CTL_MAX) || (h.kind == DIST_FRAME_HELLO && h.length != DIST_HELLO_SIZE) ||
      (!ctl && h.kind != DIST_FRAME_DATA && h.length != 0)) {
    fail_connf(c, "protocol violation: frame kind %u with %llu payload bytes", h.kind,
               (unsigned long long)h.length);
    return -1;
  }
  if (h.kind == DIST_FRAME_DATA && h.length > p->max_frame) {
    log_warn("peer rank %d: DATA frame of %llu bytes is longer than max_frame_size (%zu)",
             c->rank, (unsigned long long)h.length, p->max_frame);
    fail_connf(c, "protocol violation: DATA frame of %llu bytes exceeds max_frame_size (%zu)",
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
  if (h.kind == DIST_FRAME_HELLO_ACK) return on_ack(c, &h);
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
  peer *pe = conn_peer(c);
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
    return on_control(c);
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

/* Reads more into the stage; returns bytes read, 0 when the socket is
 * empty, -1 when the connection was closed. */
static ssize_t fill_stage(conn *c) {
  unspill(c);
  if (c->st_off == c->st_end) c->st_off = c->st_end = 0;
  else if (c->st_off > 0 && c->st_end - c->st_off < HDR) {
    memmove(c->stage, c->stage + c->st_off, c->st_end - c->st_off);
    c->st_end -= c->st_off;
    c->st_off = 0;
  }
  size_t room = STAGE_SIZE - c->st_end;
  ssize_t n = c->tp->read(c, c->stage + c->st_end, room);
  if (n > 0) {
    c->st_end += (size_t)n;
    c->short_read = (size_t)n < room;
    return n;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
  fail_conn(c, n == 0 ? "connection closed by peer" : io_reason(c, errno));
  return -1;
}

static ssize_t read_direct(conn *c) {
  ssize_t n = c->tp->read(c, c->dst, c->remaining);
  if (n > 0) {
    c->short_read = (size_t)n < c->remaining;
    c->dst += n;
    c->remaining -= (size_t)n;
    return n;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
  fail_conn(c, n == 0 ? "connection closed by peer" : io_reason(c, errno));
  return -1;
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
 * follows back in the stage. A wrong guess (another frame came first) is
 * put back in stream order in a spill buffer and read from there. */

static recv_slot *read_ahead_guess(conn *c) {
  if (!c->tp->readv || c->st_off != c->st_end || c->own_stage) return NULL;
  return distd_guess_next_recv(c->p, c->rank);
}

/* The guess was wrong: the stage holds what is left of the header
 * (st_off..HDR) and what followed the receive's bytes (HDR..st_end); the
 * mid_len bytes in the receive belong between them. */
static int spill(conn *c, const uint8_t *mid, size_t mid_len) {
  size_t head = HDR - c->st_off, tail = c->st_end - HDR, len = head + mid_len + tail;
  uint8_t *b = malloc(len);
  if (!b) {
    fail_conn(c, "out of memory reading from the peer");
    return -1;
  }
  memcpy(b, c->stage + c->st_off, head);
  memcpy(b + head, mid, mid_len);
  memcpy(b + head + mid_len, c->stage + HDR, tail);
  c->own_stage = c->stage;
  c->stage = b;
  c->st_off = 0;
  c->st_end = len;
  return 0;
}

/* Returns bytes read as fill_stage does. */
static ssize_t read_ahead(conn *c, recv_slot *s) {
  struct iovec iov[3] = {{c->stage, HDR}, {s->buf, s->len}, {c->stage + HDR, STAGE_SIZE - HDR}};
  ssize_t n = c->tp->readv(c, iov, 3);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    fail_conn(c, n == 0 ? "connection closed by peer" : io_reason(c, errno));
    return -1;
  }
  c->short_read = (size_t)n < STAGE_SIZE + s->len;
  c->st_off = 0;
  if ((size_t)n <= HDR) {
    c->st_end = (size_t)n;
    return n;
  }
  size_t in_recv = (size_t)n - HDR < s->len ? (size_t)n - HDR : s->len;
  c->st_end = (size_t)n - in_recv;
  if (on_header(c) < 0) return -1;
  if (c->rstate == R_PAYLOAD && c->rmode == M_RECV && c->slot == s) {
    c->dst += in_recv; /* on_header pointed the payload at s->buf */
    c->remaining -= in_recv;
    return n;
  }
  return spill(c, s->buf, in_recv) < 0 ? -1 : n;
}

/* One step of the read state machine: 1 to go on, 0 to stop for now, -1
 * when the connection is gone. With until_short, a read that returned
 * less than it asked for counts as having emptied the socket: the next
 * step needing a read returns 0 instead of making a read() that would
 * only say EAGAIN (the driver's poll() tells when more bytes come). */
static int read_step(conn *c, size_t *budget, int until_short) {
  ssize_t n;
  int needs_read = !distd_conn_has_staged(c);
  if (needs_read && until_short && c->short_read) return 0;
  if (c->rstate == R_HEADER) {
    if (!needs_read) {
      if (on_header(c) < 0) return -1;
      return c->read_blocked ? 0 : 1;
    }
    recv_slot *guess = until_short ? read_ahead_guess(c) : NULL;
    n = guess ? read_ahead(c, guess) : fill_stage(c);
  } else if (c->remaining == 0) {
    return finish_payload(c) < 0 ? -1 : 1;
  } else if (c->st_off < c->st_end) {
    take_staged(c);
    return 1;
  } else if (c->rmode != M_DISCARD && c->remaining >= DIRECT_READ_MIN) {
    n = read_direct(c);
  } else {
    n = fill_stage(c);
  }
  if (n <= 0) return n < 0 ? -1 : 0;
  *budget = (size_t)n >= *budget ? 0 : *budget - (size_t)n;
  note_moved(c);
  return 1;
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

int distd_conn_drive_read(conn *c, size_t budget) {
  int r = 1;
  c->short_read = 0;
  /* Stopping at a frame boundary once done leaves the next operation's
   * frames in the socket, for its own driver to read straight into the
   * receives it will have posted, rather than into kept-aside copies (a
   * rank leaving a barrier early sends its data while this one is still
   * reading the barrier). */
  while (r == 1 && budget > 0 && !(c->rstate == R_HEADER && driver_done(c->p)))
    r = read_step(c, &budget, 1);
  return r;
}
