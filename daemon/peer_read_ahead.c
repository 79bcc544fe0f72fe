/* The driver's guess of the receive its next frame from a peer is for,
 * so that peer_read.c reads the payload ahead, straight into it, with the
 * header. Apart from the transfers' lifecycle (peer_xfer.c) because only
 * the driver's read path asks, and the guess must never pick memory a
 * send still reads from. Runs with distd_peers.mu held. */
#include "peer_internal.h"

static int overlaps(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
  return a < b + blen && b < a + alen;
}

/* Whether a send item queued on q reads from [buf, buf + len). */
static int queue_reads(const dlist *q, const uint8_t *buf, size_t len) {
  for (const dlist *pos = q->next; pos != q; pos = pos->next) {
    const send_item *it = dlist_entry(pos, send_item, link);
    if (it->payload && overlaps(it->payload, it->len, buf, len)) return 1;
  }
  return 0;
}

/* Whether a send not yet fully written (to a peer, or to self) reads from
 * [buf, buf + len). */
static int sent_from(distd_peers *p, const uint8_t *buf, size_t len) {
  for (int r = 0; r < p->world; r++)
    if (queue_reads(&p->peers[r].outq, buf, len)) return 1;
  for (dlist *xp = p->xfers.next; xp != &p->xfers; xp = xp->next)
    if (queue_reads(&dlist_entry(xp, distd_xfer, link)->self_sends, buf, len)) return 1;
  return 0;
}

/* x's first unfinished receive from src after `after` (NULL: from the
 * start). */
static recv_slot *next_open_recv(distd_xfer *x, int src, recv_slot *after) {
  dlist *pos = after ? after->link.next : x->recvs.next;
  for (; pos != &x->recvs; pos = pos->next) {
    recv_slot *s = dlist_entry(pos, recv_slot, link);
    if (!s->done && s->src == src) return s;
  }
  return NULL;
}

/* An any-receive expecting a short frame, which the read-ahead may look
 * past: its header and payload are the lead. */
static size_t short_lead(const recv_slot *s) {
  if (!s->any_buf || !s->any_likely || s->reader || s->claimed) return 0;
  size_t lead = DIST_FRAME_HEADER_SIZE + s->any_likely;
  return lead <= LEAD_MAX ? lead : 0;
}

/* Senders send an op's frames to one peer in the order they were posted,
 * so the driver's first unfinished receive from src is the likely next
 * frame; when that is a short frame of known length (global_scatter's
 * counts), the receive after it, in the same xfer or the one its thread
 * waits on next (distd_xfer_then). Only a large one is worth the guess (a
 * small payload arrives with its header in the stage anyway), and only
 * memory no send reads from: a wrong guess writes another frame's bytes
 * there before its own come. */
recv_slot *distd_guess_next_recv(distd_peers *p, int src, size_t *lead) {
  distd_xfer *x = p->driver_x;
  *lead = 0;
  if (!x || x->err.code) return NULL;
  recv_slot *s = next_open_recv(x, src, NULL);
  if (s && (*lead = short_lead(s)) != 0) {
    recv_slot *first = s;
    s = next_open_recv(x, src, first);
    if (!s && x->then && !x->then->err.code) s = next_open_recv(x->then, src, NULL);
  }
  if (!s || !s->buf || s->any_buf || s->reader || s->claimed || s->len < DIRECT_READ_MIN)
    return NULL;
  return sent_from(p, s->buf, s->len) ? NULL : s;
}
