/* Transfers: posting sends and receives for one op id, matching arriving
 * frames to receives, data kept aside for receives not yet posted, aborts,
 * and waiting with a deadline. */
#include <errno.h>
#include <event2/event.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "peer_batch.h"
#include "peer_internal.h"
#include "subop.h"

#define HDR DIST_FRAME_HEADER_SIZE
#define DRIVE_POLL_MAX_MS 200   /* a lost wake-up costs at most this */
#define SPIN_POLL_EVERY 8       /* see read_instead_of_poll */

/* Data kept aside for an op that failed is of no use to anyone. */
static void drop_unexpected_of(distd_peers *p, uint64_t op_id) {
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->unexpected) {
    unexpected *u = dlist_entry(pos, unexpected, link);
    if (u->op_id == op_id && u->complete) distd_unexpected_free(p, u);
  }
}

/* ---- completion and failure ---- */

/* Wakes x's waiter, on its condvar or in the driver's poll(). */
static void wake(distd_xfer *x) {
  pthread_cond_signal(&x->cond);
  if (x->p && x->p->driver_x == x) distd_driver_wake(x->p);
}

void distd_xfer_moved(distd_xfer *x) { x->moved_ms = distd_now_ms(); }

static void one_done(distd_xfer *x) {
  if (--x->pending == 0)
    wake(x);
  else
    distd_xfer_moved(x); /* only an unfinished xfer's silence is counted */
}

void distd_xfer_fail(distd_xfer *x, int code, const char *fmt, ...) {
  if (x->err.code) return; /* the first failure is the one reported */
  va_list ap;
  va_start(ap, fmt);
  x->err.code = code;
  vsnprintf(x->err.msg, sizeof x->err.msg, fmt, ap);
  va_end(ap);
  if (x->p) {
    distd_remember_op(x->p, x->op_id, -1, code, x->err.msg);
    drop_unexpected_of(x->p, x->op_id);
  }
  wake(x);
}

static void name_signature(const distd_xfer *x, uint64_t signature, char *out, size_t n) {
  if (x->name_signature) x->name_signature(signature, out, n);
  else snprintf(out, n, "signature %#llx", (unsigned long long)signature);
}

int distd_xfer_signature_clash(distd_xfer *x, int src, uint64_t signature) {
  if (!signature || !x->signature || signature == x->signature) return 0;
  char theirs[96], ours[96];
  name_signature(x, signature, theirs, sizeof theirs);
  name_signature(x, x->signature, ours, sizeof ours);
  distd_xfer_fail(x, DIST_EMISMATCH, "rank %d runs op %llu as %s, but rank %d as %s", src,
                  (unsigned long long)x->op_id, theirs, x->p->rank, ours);
  return 1;
}

int distd_signature_clash_live(distd_peers *p, uint64_t op_id, int src, uint64_t signature) {
  int clash = 0;
  if (!signature) return 0;
  for (dlist *pos = p->xfers.next; pos != &p->xfers; pos = pos->next) {
    distd_xfer *x = dlist_entry(pos, distd_xfer, link);
    if (x->op_id == op_id && !x->err.code) clash |= distd_xfer_signature_clash(x, src, signature);
  }
  return clash;
}

void distd_xfer_send_done(send_item *it) {
  distd_xfer *x = it->x;
  dlist_remove(&it->xlink);
  free(it);
  one_done(x);
}

void distd_recv_finished(recv_slot *s) {
  s->done = 1;
  if (s->any_buf) {
    *s->any_buf = s->any_tmp;
    *s->any_len = s->len;
    s->any_tmp = NULL;
  }
  one_done(s->x);
}

static void deliver_unexpected(recv_slot *s, unexpected *u) {
  if (s->any_buf) {
    *s->any_buf = u->data; /* hand the buffer over: no copy */
    *s->any_len = u->len;
    u->data = NULL;
  } else if (u->len) {
    memcpy(s->buf, u->data, u->len);
  }
  s->done = 1;
}

void distd_unexpected_free(distd_peers *p, unexpected *u) {
  if (u->claim) u->claim->claimed = NULL;
  dlist_remove(&u->link);
  p->unexpected_bytes -= u->len;
  free(u->data);
  free(u);
  distd_peers_unblock_readers(p);
}

void distd_unexpected_finished(distd_peers *p, unexpected *u) {
  recv_slot *s = u->claim;
  if (!s) {
    /* Its op failed while it arrived (drop_unexpected_of passed it by):
     * kept, it would count against unexpected_limit until the daemon
     * stops. */
    if (distd_remembered_find(p, u->op_id)) distd_unexpected_free(p, u);
    return;
  }
  u->claim = NULL;
  s->claimed = NULL;
  deliver_unexpected(s, u);
  one_done(s->x);
  distd_unexpected_free(p, u);
}

/* Frames named one by one in the log per sweep; the rest are summed up
 * in one line, so that a dead receiver of many small frames does not
 * flood the log. */
#define EXPIRED_NAMED_PER_SWEEP 8

/* Counted against the peer that sent it, logged (named) at most once:
 * it is freed here. */
static void drop_expired(distd_peers *p, unexpected *u, int64_t now_ms, int named) {
  peer *pe = &p->peers[u->src];
  pe->stats.unexpected_expired++;
  pe->stats.unexpected_expired_bytes += u->len;
  if (named)
    log_warn("dropped %zu bytes rank %d sent for op %llu (tag %u): kept aside %lld ms "
             "without a receive (peer_unexpected_max_age)", u->len, u->src,
             (unsigned long long)u->op_id, u->tag, (long long)(now_ms - u->kept_ms));
  distd_dropped_note(&p->dropped, u->op_id, u->src, u->tag, now_ms - u->kept_ms, now_ms);
  distd_unexpected_free(p, u);
}

/* A frame whose receive is never posted (a broadcast root sent to a
 * receiver whose trainer died before calling) would otherwise hold its
 * bytes against unexpected_limit until the daemon stops, and past the
 * limit its connection stops being read. Only whole frames go: one still
 * arriving has a reader pointing into it. The list is in arrival order,
 * so the first young frame ends the sweep. */
void distd_unexpected_expire(distd_peers *p, int64_t now_ms) {
  if (p->unexpected_max_age_ms <= 0) return;
  /* Another max age: a receive that late belongs to a job long failed. */
  distd_dropped_expire(&p->dropped, now_ms, p->unexpected_max_age_ms);
  size_t dropped = 0, unnamed_bytes = 0;
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->unexpected) {
    unexpected *u = dlist_entry(pos, unexpected, link);
    if (now_ms - u->kept_ms < p->unexpected_max_age_ms) break;
    if (!u->complete || u->claim) continue;
    int named = dropped++ < EXPIRED_NAMED_PER_SWEEP;
    if (!named) unnamed_bytes += u->len;
    drop_expired(p, u, now_ms, named);
  }
  if (dropped > EXPIRED_NAMED_PER_SWEEP)
    log_warn("dropped %zu more frames (%zu bytes) kept aside without a receive "
             "(peer_unexpected_max_age)", dropped - EXPIRED_NAMED_PER_SWEEP, unnamed_bytes);
}

recv_slot *distd_find_posted_recv(distd_peers *p, uint64_t op_id, int src,
                                  uint32_t tag) {
  dlist *xp, *sp;
  for (xp = p->xfers.next; xp != &p->xfers; xp = xp->next) {
    distd_xfer *x = dlist_entry(xp, distd_xfer, link);
    if (x->op_id != op_id || x->err.code) continue;
    for (sp = x->recvs.next; sp != &x->recvs; sp = sp->next) {
      recv_slot *s = dlist_entry(sp, recv_slot, link);
      if (!s->done && !s->reader && !s->claimed && s->src == src && s->tag == tag)
        return s;
    }
  }
  return NULL;
}

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

static int needs_rank(distd_xfer *x, int rank) {
  dlist *pos;
  for (pos = x->sends.next; pos != &x->sends; pos = pos->next)
    if (dlist_entry(pos, send_item, xlink)->dst == rank) return 1;
  for (pos = x->recvs.next; pos != &x->recvs; pos = pos->next) {
    recv_slot *s = dlist_entry(pos, recv_slot, link);
    if (!s->done && s->src == rank) return 1;
  }
  return 0;
}

void distd_fail_xfers_of_peer(distd_peers *p, int rank, const char *msg) {
  for (dlist *pos = p->xfers.next; pos != &p->xfers; pos = pos->next) {
    distd_xfer *x = dlist_entry(pos, distd_xfer, link);
    if (!x->err.code && needs_rank(x, rank)) distd_xfer_fail(x, DIST_EPEER, "%s", msg);
  }
}

/* x's op failed on rank from, which told its group (distd_xfer_abort). */
static void fail_aborted(distd_xfer *x, int from, int code, const char *reason) {
  if (x->err.code) return;
  distd_xfer_fail(x, code, "rank %d aborted op %llu: %s", from,
                  (unsigned long long)x->op_id, reason);
  x->aborted_by = from;
}

void distd_handle_abort(distd_peers *p, int from, uint64_t op_id, int code,
                        const char *reason) {
  distd_remember_op(p, op_id, from, code, reason);
  for (dlist *pos = p->xfers.next; pos != &p->xfers; pos = pos->next) {
    distd_xfer *x = dlist_entry(pos, distd_xfer, link);
    if (x->op_id == op_id) fail_aborted(x, from, code, reason);
  }
  drop_unexpected_of(p, op_id);
}

void distd_handle_abort_range(distd_peers *p, int from, uint64_t first, uint64_t count,
                              int code, const char *reason) {
  distd_remember_range(p, first, count, from, code, reason);
  unsigned steps[DISTD_REFUSED_STEPS_MAX];
  int n = distd_refused_steps(steps);
  for (dlist *pos = p->xfers.next; pos != &p->xfers; pos = pos->next) {
    distd_xfer *x = dlist_entry(pos, distd_xfer, link);
    if (distd_refused_range_covers(first, count, x->op_id, steps, n))
      fail_aborted(x, from, code, reason);
  }
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->unexpected) {
    unexpected *u = dlist_entry(pos, unexpected, link);
    if (u->complete && distd_refused_range_covers(first, count, u->op_id, steps, n))
      distd_unexpected_free(p, u);
  }
}

/* Takes every reference to the caller's buffers out of the data plane. A
 * frame already partly on the wire is finished from a copy, since the
 * stream cannot skip bytes; a receive being filled is read into nothing. */
static void detach(distd_xfer *x, int keep_partial) {
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &x->sends) {
    send_item *it = dlist_entry(pos, send_item, xlink);
    dlist_remove(&it->xlink);
    it->x = NULL;
    if (keep_partial && it->done > 0 && (it->owned = malloc(it->len ? it->len : 1))) {
      memcpy(it->owned, it->payload, it->len);
      it->payload = it->owned;
      continue;
    }
    dlist_remove(&it->link);
    free(it);
  }
  dlist_each_safe(pos, tmp, &x->self_sends) {
    dlist_remove(pos);
    free(dlist_entry(pos, send_item, link));
  }
  dlist_each_safe(pos, tmp, &x->recvs) {
    recv_slot *s = dlist_entry(pos, recv_slot, link);
    if (s->reader) {
      s->reader->rmode = M_DISCARD;
      s->reader->slot = NULL;
    }
    if (s->claimed) s->claimed->claim = NULL;
    free(s->any_tmp);
    dlist_remove(&s->link);
    free(s);
  }
  x->pending = 0;
}

void distd_xfer_orphan_all(distd_peers *p) {
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->xfers) {
    distd_xfer *x = dlist_entry(pos, distd_xfer, link);
    distd_xfer_fail(x, DIST_ECANCELED, "the peer data plane of rank %d shut down", p->rank);
    detach(x, 0);
    dlist_remove(&x->link);
    x->p = NULL;
    pthread_cond_broadcast(&x->cond);
  }
}

/* ---- the API ---- */

distd_xfer *distd_xfer_new(distd_peers *p, uint64_t op_id) {
  distd_xfer *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  distd_cond_init_monotonic(&x->cond);
  x->p = p;
  x->op_id = op_id;
  x->aborted_by = -1;
  dlist_init(&x->recvs);
  dlist_init(&x->sends);
  dlist_init(&x->self_sends);
  pthread_mutex_lock(&p->mu);
  const remembered_op *r = distd_remembered_find(p, op_id);
  if (r && r->aborted_by >= 0)
    fail_aborted(x, r->aborted_by, r->code, r->reason);
  else if (r)
    distd_forget_op(p, op_id); /* an op id that failed here before, used again */
  if (p->closing) distd_xfer_fail(x, DIST_ECANCELED, "the peer data plane is shutting down");
  dlist_push(&p->xfers, &x->link);
  pthread_mutex_unlock(&p->mu);
  return x;
}

void distd_xfer_sign(distd_xfer *x, uint64_t signature, distd_signature_namer name) {
  x->signature = signature;
  x->name_signature = name;
}

static int check_rank(distd_xfer *x, int rank, const char *what) {
  if (rank >= 0 && rank < x->p->world) return 0;
  distd_xfer_fail(x, DIST_EINVAL, "%s rank %d, outside the world of %d", what, rank,
                  x->p->world);
  return -1;
}

/* Fails x when rank r was lost and is not back (peer.lost). */
static int check_not_lost(distd_xfer *x, int r) {
  const peer *pe = &x->p->peers[r];
  if (r == x->p->rank || !pe->lost) return 0;
  distd_xfer_fail(x, DIST_EPEER, "%s", pe->lost_reason);
  return -1;
}

static int self_len_ok(distd_xfer *x, size_t sent, size_t expected, uint32_t tag) {
  if (sent == expected) return 1;
  distd_xfer_fail(x, DIST_EPROTO,
                  "rank %d sent %zu bytes to itself for op %llu tag %u, but expects %zu",
                  x->p->rank, sent, (unsigned long long)x->op_id, tag, expected);
  return 0;
}

static void send_to_self(distd_xfer *x, uint32_t tag, const void *buf, size_t len) {
  dlist *pos;
  for (pos = x->recvs.next; pos != &x->recvs; pos = pos->next) {
    recv_slot *s = dlist_entry(pos, recv_slot, link);
    if (s->done || s->src != x->p->rank || s->tag != tag) continue;
    if (s->any_buf) {
      s->any_tmp = malloc(len ? len : 1);
      if (len) memcpy(s->any_tmp, buf, len);
      s->len = len;
    } else if (!self_len_ok(x, len, s->len, tag)) {
      return;
    } else if (len) {
      memcpy(s->buf, buf, len);
    }
    distd_recv_finished(s);
    return;
  }
  send_item *it = calloc(1, sizeof *it);
  *it = (send_item){.payload = buf, .len = len, .x = x, .dst = x->p->rank, .tag = tag};
  dlist_init(&it->xlink);
  dlist_push(&x->self_sends, &it->link);
  x->pending++;
}

/* Writes from this thread: no loop wake-up. Frames queued before (sent
 * with distd_xfer_send_deferred) leave in the same writev. Where drivers
 * run (plain TCP), only the first SEND_NOW_MAX bytes leave here and a
 * driver writes the rest between its reads; the loop does if no driver
 * came within PARK_MS. */
static void write_now_some(distd_peers *p, conn *c, size_t len) {
  if (!distd_drivers_run(p)) {
    distd_conn_flush(c, 0);
    return;
  }
  /* A small frame waits for the poster's own wait, whose first pass
   * writes it in one system call with every other write and read of that
   * pass (peer_batch.h). Should no wait come, the loop writes it. */
  if (len < SEND_DEFER_MAX && !p->driver_x && distd_batch_cheap(p->batch)) {
    distd_inbound_look_later(p);
    return;
  }
  if (!distd_conn_driver_flush(c, SEND_NOW_MAX)) return;
  if (p->driver_x) distd_driver_wake(p);
  else distd_inbound_look_later(p);
}

static void queue_send(distd_xfer *x, int dst, uint32_t tag, const void *buf, size_t len,
                       int write_now) {
  distd_peers *p = x->p;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  if (x->err.code || check_rank(x, dst, "send to") < 0 || check_not_lost(x, dst) < 0)
    goto out;
  if (dst == p->rank) {
    send_to_self(x, tag, buf, len);
    goto out;
  }
  send_item *it = calloc(1, sizeof *it);
  dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_DATA,
                         x->op_id, (uint32_t)p->rank, tag, len, x->signature};
  dist_frame_encode(&h, it->hdr);
  it->payload = buf;
  it->len = len;
  it->x = x;
  it->dst = dst;
  it->tag = tag;
  dlist_push(&x->sends, &it->xlink);
  distd_peer_queue_frame(p, dst, it);
  x->pending++;
  conn *c = p->peers[dst].out;
  if (write_now && c && c->greeted) write_now_some(p, c, len);
out:
  pthread_mutex_unlock(&p->mu);
}

void distd_xfer_send(distd_xfer *x, int dst, uint32_t tag, const void *buf, size_t len) {
  queue_send(x, dst, tag, buf, len, 1);
}

void distd_xfer_send_deferred(distd_xfer *x, int dst, uint32_t tag, const void *buf,
                              size_t len) {
  queue_send(x, dst, tag, buf, len, 0);
}

static unexpected *find_unexpected(distd_peers *p, uint64_t op_id, int src, uint32_t tag) {
  for (dlist *pos = p->unexpected.next; pos != &p->unexpected; pos = pos->next) {
    unexpected *u = dlist_entry(pos, unexpected, link);
    if (u->op_id == op_id && u->src == src && u->tag == tag && !u->claim) return u;
  }
  return NULL;
}

static void recv_from_self(distd_xfer *x, recv_slot *s) {
  dlist *pos;
  for (pos = x->self_sends.next; pos != &x->self_sends; pos = pos->next) {
    send_item *it = dlist_entry(pos, send_item, link);
    if (it->tag != s->tag) continue;
    dlist_remove(&it->link);
    if (s->any_buf) {
      *s->any_buf = malloc(it->len ? it->len : 1);
      if (it->len) memcpy(*s->any_buf, it->payload, it->len);
      *s->any_len = it->len;
    } else if (self_len_ok(x, it->len, s->len, s->tag) && it->len) {
      memcpy(s->buf, it->payload, it->len);
    }
    free(it);
    free(s);
    x->pending--;
    return;
  }
  dlist_push(&x->recvs, &s->link);
  x->pending++;
}

/* A receive whose frame came, waited past peer_unexpected_max_age and was
 * dropped (distd_unexpected_expire) would otherwise wait peer_timeout for
 * a frame that will not come again. ETIMEDOUT, as that wait would have
 * ended: the frame timed out, only sooner. */
static int fail_if_dropped(distd_xfer *x, const recv_slot *s) {
  distd_dropped_frame d;
  if (x->p->dropped.count == 0) return 0; /* the usual case, without a call */
  if (!distd_dropped_take(&x->p->dropped, x->op_id, s->src, s->tag, &d)) return 0;
  distd_xfer_fail(x, DIST_ETIMEDOUT,
                  "the frame rank %d sent for op %llu (tag %u) was dropped after waiting "
                  "%.1f s for this receive (peer_unexpected_max_age)",
                  s->src, (unsigned long long)x->op_id, s->tag, (double)d.waited_ms / 1000.0);
  return 1;
}

/* Matches against data kept aside first (oldest first), else waits. */
static void post_recv(distd_xfer *x, recv_slot *s) {
  distd_peers *p = x->p;
  unexpected *u = find_unexpected(p, x->op_id, s->src, s->tag);
  if (!u && fail_if_dropped(x, s)) {
    free(s);
    return;
  }
  if (u && distd_xfer_signature_clash(x, s->src, u->signature)) {
    free(s); /* the failure dropped u, or drops it once whole (unexpected_finished) */
    return;
  }
  if (u && !s->any_buf && u->len != s->len) {
    distd_xfer_fail(x, DIST_EPROTO,
                    "rank %d sent %zu bytes for op %llu tag %u, but rank %d expects %zu",
                    s->src, u->len, (unsigned long long)x->op_id, s->tag, p->rank, s->len);
    free(s);
    return;
  }
  if (u && u->complete) {
    deliver_unexpected(s, u);
    distd_unexpected_free(p, u);
    free(s);
    return;
  }
  if (check_not_lost(x, s->src) < 0) { /* what it sent before is all there is */
    free(s);
    return;
  }
  if (u) {
    u->claim = s;
    s->claimed = u;
  }
  dlist_push(&x->recvs, &s->link);
  x->pending++;
  distd_peers_unblock_readers(p);
}

static void recv_common(distd_xfer *x, int src, uint32_t tag, void *buf, size_t len,
                        void **any_buf, size_t *any_len, size_t any_likely) {
  distd_peers *p = x->p;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  if (x->err.code || check_rank(x, src, "receive from") < 0) goto out;
  recv_slot *s = calloc(1, sizeof *s);
  *s = (recv_slot){.x = x, .src = src, .tag = tag, .buf = buf, .len = len,
                   .any_buf = any_buf, .any_len = any_len, .any_likely = any_likely};
  dlist_init(&s->link);
  if (src == p->rank) recv_from_self(x, s);
  else post_recv(x, s);
out:
  pthread_mutex_unlock(&p->mu);
}

void distd_xfer_recv(distd_xfer *x, int src, uint32_t tag, void *buf, size_t len) {
  recv_common(x, src, tag, buf, len, NULL, NULL, 0);
}

void distd_xfer_recv_any(distd_xfer *x, int src, uint32_t tag, void **buf, size_t *len,
                         size_t likely_len) {
  *buf = NULL;
  *len = 0;
  recv_common(x, src, tag, NULL, 0, buf, len, likely_len);
}

/* "timed out waiting for ranks 1, 3 (rank 1 at 127.0.0.1:7471 is down)". */
static void fail_timeout(distd_xfer *x) {
  distd_peers *p = x->p;
  char list[200] = "", down[240] = "";
  size_t ln = 0, dn = 0;
  int count = 0;
  for (int r = 0; r < p->world; r++) {
    if (!needs_rank(x, r)) continue;
    count++;
    ln += (size_t)snprintf(list + ln, ln < sizeof list ? sizeof list - ln : 0, "%s%d",
                           count > 1 ? ", " : "", r);
    if (ln >= sizeof list) ln = sizeof list - 1;
    if (r != p->rank && !p->peers[r].stats.connected && dn < sizeof down)
      dn += (size_t)snprintf(down + dn, sizeof down - dn, "%srank %d at %s is not connected",
                             dn ? "; " : " (", r, distd_peer_addr(p, r));
  }
  if (dn) snprintf(down + (dn < sizeof down - 2 ? dn : sizeof down - 2), 2, ")");
  distd_xfer_fail(x, DIST_ETIMEDOUT, "timed out waiting for rank%s %s%s",
                  count > 1 ? "s" : "", list, down);
}

static int check_self_matched(distd_xfer *x) {
  if (!dlist_empty(&x->self_sends)) {
    send_item *it = dlist_entry(x->self_sends.next, send_item, link);
    distd_xfer_fail(x, DIST_EINVAL, "op %llu: send to self (rank %d) under tag %u has no "
                    "matching receive", (unsigned long long)x->op_id, x->p->rank, it->tag);
    return -1;
  }
  for (dlist *pos = x->recvs.next; pos != &x->recvs; pos = pos->next) {
    recv_slot *s = dlist_entry(pos, recv_slot, link);
    if (!s->done && s->src == x->p->rank) {
      distd_xfer_fail(x, DIST_EINVAL, "op %llu: receive from self (rank %d) under tag %u "
                      "has no matching send", (unsigned long long)x->op_id, s->src, s->tag);
      return -1;
    }
  }
  return 0;
}

static void free_done_recvs(distd_xfer *x) {
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &x->recvs) {
    dlist_remove(pos);
    free(dlist_entry(pos, recv_slot, link));
  }
}

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

static int can_drive(const distd_peers *p) {
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
static int64_t wait_limit(const distd_xfer *x, int64_t deadline_ms) {
  int64_t silence = x->p->silence_ms;
  if (silence > 0 && x->moved_ms + silence < deadline_ms) return x->moved_ms + silence;
  return deadline_ms;
}

/* Drives until x is done or failed, its wait limit passed, or the data
 * plane closes. Called and returns with mu held; mu is released in poll().
 * For its first spin_us it polls without sleeping, yielding the CPU
 * between polls (other daemons on the same cores may be the ones it waits
 * for). */
static void drive(distd_xfer *x, int64_t deadline_ms) {
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
    int64_t left = wait_limit(x, deadline_ms) - (int64_t)(now_ns / 1000000);
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

int distd_xfer_wait(distd_xfer *x, int64_t deadline_ms, dist_errbuf *eb) {
  distd_peers *p = x->p;
  if (!p) return dist_fail(eb, x->err.code, "%s", x->err.msg);
  pthread_mutex_lock(&p->mu);
  p->waiters++;
  x->waiting = 1;
  int64_t now = distd_now_ms();
  x->moved_ms = now; /* the silence is counted from here */
  if (!x->err.code) check_self_matched(x);
  if (!can_drive(p)) distd_peers_flush_queued(p, 0);
  while (!x->err.code && x->pending > 0) {
    int64_t limit = wait_limit(x, deadline_ms);
    if (now >= limit) {
      fail_timeout(x);
      break;
    }
    if (can_drive(p))
      drive(x, deadline_ms);
    else
      distd_cond_wait_until_ms(&x->cond, &p->mu, limit);
    now = distd_now_ms();
  }
  x->waiting = 0;
  int rc = x->err.code;
  if (rc) {
    if (x->p) detach(x, 1);
    dist_fail(eb, rc, "%s", x->err.msg);
  } else {
    free_done_recvs(x);
  }
  if (--p->waiters == 0 && p->closing) pthread_cond_broadcast(&p->idle);
  pthread_mutex_unlock(&p->mu);
  return rc;
}

void distd_xfer_then(distd_xfer *x, distd_xfer *next) { x->then = next; }

void distd_xfer_abort(distd_xfer *x, const int *ranks, int n, const char *reason) {
  distd_peers *p = x->p;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  if (x->aborted_by >= 0) { /* its sender told the group already */
    pthread_mutex_unlock(&p->mu);
    return;
  }
  int code = x->err.code ? x->err.code : DIST_ECANCELED;
  size_t len = strnlen(reason, CTL_MAX);
  dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_ABORT,
                         x->op_id, (uint32_t)p->rank, 0, len, (uint64_t)(-(int64_t)code)};
  for (int i = 0; i < n; i++) {
    int r = ranks[i];
    if (r >= 0 && r < p->world && r != p->rank) distd_peer_queue_ctl(p, r, &h, reason, len);
  }
  pthread_mutex_unlock(&p->mu);
}

void distd_abort_op(distd_peers *p, uint64_t op_id, const int *ranks, int n,
                    const char *reason) {
  distd_xfer *x = distd_xfer_new(p, op_id);
  if (!x) return;
  distd_xfer_abort(x, ranks, n, reason);
  distd_xfer_free(x);
}

int distd_xfer_finish(distd_xfer *x, int64_t deadline_ms, const int *group,
                      int n, dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  int rc = distd_xfer_wait(x, deadline_ms, &why);
  if (rc) {
    distd_xfer_abort(x, group, n, why.msg);
    if (eb) *eb = why;
  }
  return rc;
}

void distd_xfer_free(distd_xfer *x) {
  if (!x) return;
  distd_peers *p = x->p;
  if (p) {
    pthread_mutex_lock(&p->mu);
    if (x->pending > 0 && !x->err.code)
      distd_remember_op(p, x->op_id, -1, DIST_ECANCELED, "abandoned");
    detach(x, 1);
    dlist_remove(&x->link);
    if (!p->driver_x) distd_peers_flush_queued(p, 0); /* deferred frames of other ops */
    else distd_driver_wake(p);
    pthread_mutex_unlock(&p->mu);
  }
  pthread_cond_destroy(&x->cond);
  free(x);
}

void distd_peers_cancel_all(distd_peers *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->closing = 1; /* later xfers fail at once (distd_xfer_new) */
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->xfers) {
    distd_xfer *x = dlist_entry(pos, distd_xfer, link);
    distd_xfer_fail(x, DIST_ECANCELED, "rank %d is shutting down", p->rank);
  }
  pthread_mutex_unlock(&p->mu);
}

/* ---- inspection: which ranks an operation still waits on ---- */

void distd_peers_set_ops(distd_peers *p, struct distd_ops *ops) { p->ops = ops; }

struct distd_ops *distd_peers_ops(const distd_peers *p) { return p ? p->ops : NULL; }

static int watched(uint64_t op_id, const uint64_t *op_ids, int n_ids) {
  for (int i = 0; i < n_ids; i++)
    if (op_ids[i] == op_id) return 1;
  return 0;
}

int distd_peers_waiting_on(distd_peers *p, const uint64_t *op_ids, int n_ids, int *ranks,
                           int max) {
  int n = 0;
  if (!p) return 0;
  pthread_mutex_lock(&p->mu);
  for (int r = 0; r < p->world; r++) {
    if (r == p->rank) continue;
    int needed = 0;
    for (dlist *pos = p->xfers.next; pos != &p->xfers && !needed; pos = pos->next) {
      distd_xfer *x = dlist_entry(pos, distd_xfer, link);
      needed = !x->err.code && watched(x->op_id, op_ids, n_ids) && needs_rank(x, r);
    }
    if (!needed) continue;
    if (n < max) ranks[n] = r;
    n++;
  }
  pthread_mutex_unlock(&p->mu);
  return n;
}
