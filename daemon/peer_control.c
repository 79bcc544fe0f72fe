/* The HELLO handshake and the control frames a peer connection receives
 * (HELLO, HELLO_ACK, HELLO_REJECT, ABORT, ABORT_RANGE, CLOSE), and which
 * frame kinds each side of a connection may receive. The acceptor's
 * HELLO_ACK says which kinds past CLOSE it reads (frame.h); its dialler
 * sends it no other, so a daemon built before them is never sent one.
 * Called from the read path (peer_read.c) with distd_peers.mu held. */
#include <event2/event.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "peer_internal.h"

void distd_conn_reject(conn *c, int rank, const char *reason) {
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
    distd_conn_reject(c, -1, eb.msg);
    return -1;
  }
  if (hello_problem(p, &h, why, sizeof why) < 0 || cert_problem(c, &h, why, sizeof why) < 0) {
    distd_conn_reject(c, (int)h.rank, why);
    return -1;
  }
  peer *pe = &p->peers[h.rank];
  if (pe->in) distd_conn_lost(pe->in, "replaced by a new connection from the same rank");
  dlist_remove(&c->link);
  c->rank = (int)h.rank;
  c->greeted = 1;
  pe->in = c;
  distd_conn_greeted_inbound(c);
  distd_peer_update_connected(pe);
  log_info("peer rank %d (%s) connected inbound", pe->rank, distd_peer_addr(p, pe->rank));
  dist_frame_header ack = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_HELLO_ACK,
                           0, (uint32_t)p->rank, 0, 0, DIST_ACK_READS_ABORT_RANGE};
  distd_conn_queue_ctl(c, &ack, NULL, 0);
  return distd_conn_flush(c, 1);
}

int distd_conn_on_ack(conn *c, const dist_frame_header *h) {
  distd_peers *p = c->p;
  peer *pe = distd_conn_peer(c);
  if ((int)h->src_rank != c->rank) {
    distd_conn_failf(c, "dialled rank %d at %s but rank %u answered", c->rank,
               distd_peer_addr(p, c->rank), h->src_rank);
    return -1;
  }
  c->greeted = 1;
  c->reads_abort_range = (h->aux & DIST_ACK_READS_ABORT_RANGE) != 0;
  if (pe->ever_greeted) pe->stats.reconnects++;
  pe->ever_greeted = 1;
  pe->backoff_ms = p->backoff_min;
  distd_peer_update_connected(pe);
  log_info("peer rank %d (%s) connected outbound%s", pe->rank, distd_peer_addr(p, pe->rank),
           c->reads_abort_range ? "" : " (a build before ABORT_RANGE: told of aborts per step)");
  return distd_conn_flush(c, 1);
}

/* An ABORT's or ABORT_RANGE's error code (aux), DIST_EPEER when it is
 * not one. */
static int abort_code(const dist_frame_header *h) {
  int64_t code = -(int64_t)h->aux;
  if (code >= 0 || code < DIST_ETOOBIG) code = DIST_EPEER;
  return (int)code;
}

static int on_abort_range(conn *c) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_abort_range a;
  if (dist_abort_range_decode(c->ctl, c->ctl_len, &a, &eb) < 0) {
    distd_conn_failf(c, "protocol violation: %s", eb.msg);
    return -1;
  }
  distd_handle_abort_range(c->p, c->rank, c->cur.op_id, a.count, abort_code(&c->cur), a.reason);
  return 0;
}

int distd_conn_on_control(conn *c) {
  distd_peers *p = c->p;
  c->ctl[c->ctl_len] = 0;
  switch (c->cur.kind) {
  case DIST_FRAME_HELLO:
    return on_hello(c);
  case DIST_FRAME_HELLO_REJECT: {
    int rank = c->rank;
    distd_conn_failf(c, "rank %d (%s) rejected our hello: %s", rank, distd_peer_addr(p, rank),
               (char *)c->ctl);
    log_warn("%s", p->peers[rank].stats.last_error);
    return -1;
  }
  case DIST_FRAME_ABORT:
    distd_handle_abort(p, c->rank, c->cur.op_id, abort_code(&c->cur), (char *)c->ctl);
    return 0;
  case DIST_FRAME_ABORT_RANGE:
    return on_abort_range(c);
  case DIST_FRAME_CLOSE:
    /* The peer closes the connection after this frame: failing it here
     * with the peer's words makes what needed the peer name them, where a
     * bare end of stream would say "connection closed by peer". */
    distd_conn_failf(c, "rank %d closed our connection: %s", c->rank, (char *)c->ctl);
    return -1;
  default:
    return 0;
  }
}

int distd_conn_kind_allowed(const conn *c, unsigned kind) {
  if (!c->outbound && !c->greeted) return kind == DIST_FRAME_HELLO;
  if (c->greeted && kind == DIST_FRAME_CLOSE) return 1;
  if (!c->outbound)
    return kind == DIST_FRAME_DATA || kind == DIST_FRAME_ABORT || kind == DIST_FRAME_PING ||
           kind == DIST_FRAME_ABORT_RANGE; /* announced in every HELLO_ACK */
  if (!c->greeted) return kind == DIST_FRAME_HELLO_ACK || kind == DIST_FRAME_HELLO_REJECT;
  return kind == DIST_FRAME_PONG;
}
