/* Transfers: posting sends and receives for one op id, matching arriving
 * frames to receives, aborts, and waiting with a deadline. Data kept aside
 * for receives not yet posted is in peer_unexpected.c, the driver that
 * moves the bytes while a thread waits in peer_drive.c, the read-ahead's
 * guess in peer_read_ahead.c. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "peer_batch.h"
#include "peer_internal.h"
#include "subop.h"

#define HDR DIST_FRAME_HEADER_SIZE

/* ---- completion and failure ---- */

/* Wakes x's waiter, on its condvar or in the driver's poll(). */
static void wake(distd_xfer *x) {
  pthread_cond_signal(&x->cond);
  if (x->p && x->p->driver_x == x) distd_driver_wake(x->p);
}

void distd_xfer_moved(distd_xfer *x) { x->moved_ms = distd_now_ms(); }

void distd_xfer_one_done(distd_xfer *x) {
  if (--x->pending == 0)
    wake(x);
  else
    distd_xfer_moved(x); /* only an unfinished xfer's silence is counted */
}

/* The op's frames are dropped here from now on (remembered), so its live
 * transfers other than except (a MoE exchange's counts, waited on before
 * the rows) could only wait for theirs until their deadline. They fail
 * with err. (A failure the data brings, a length mismatch, leaves them
 * be: a peer's counts may still say why in better words.) Called with
 * p->mu held. */
void distd_fail_op_xfers(distd_peers *p, uint64_t op_id, const distd_xfer *except,
                         const dist_errbuf *err) {
  for (dlist *pos = p->xfers.next; pos != &p->xfers; pos = pos->next) {
    distd_xfer *y = dlist_entry(pos, distd_xfer, link);
    if (y == except || y->op_id != op_id || y->err.code) continue;
    y->err = *err;
    wake(y);
  }
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
    distd_drop_unexpected_of(x->p, x->op_id);
  }
  wake(x);
}

/* Fails x for want of memory for what it was doing; its wait then fails,
 * and tells the op's group (distd_xfer_finish), which would otherwise
 * wait for this rank's part until their deadline. */
void distd_xfer_out_of_memory(distd_xfer *x, const char *doing) {
  distd_xfer_fail(x, DIST_ENOMEM, "op %llu: out of memory %s", (unsigned long long)x->op_id,
                  doing);
  if (x->p) distd_fail_op_xfers(x->p, x->op_id, x, &x->err);
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
  distd_xfer_one_done(x);
}

void distd_recv_finished(recv_slot *s) {
  s->done = 1;
  if (s->any_buf) {
    *s->any_buf = s->any_tmp;
    *s->any_len = s->len;
    s->any_tmp = NULL;
  }
  distd_xfer_one_done(s->x);
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
  distd_drop_unexpected_of(p, op_id);
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

/* A zeroed send item: one distd_xfer_reserve_sends made, else a new one
 * (NULL when there is no memory for it). */
static send_item *new_send_item(distd_xfer *x) {
  x->sends_taken++;
  if (dlist_empty(&x->spare_sends)) return calloc(1, sizeof(send_item));
  dlist *pos = x->spare_sends.next;
  dlist_remove(pos);
  send_item *it = dlist_entry(pos, send_item, link);
  memset(it, 0, sizeof *it);
  return it;
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
  distd_send_items_free(&x->self_sends);
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
  x->sends_reserved = -1;
  dlist_init(&x->recvs);
  dlist_init(&x->sends);
  dlist_init(&x->self_sends);
  dlist_init(&x->spare_sends);
  pthread_mutex_lock(&p->mu);
  const remembered_op *r = distd_remembered_find(p, op_id);
  if (r && r->aborted_by >= 0)
    fail_aborted(x, r->aborted_by, r->code, r->reason);
  else if (r && r->aborted_by == DISTD_DROPPED_HERE)
    distd_xfer_fail(x, r->code, "op %llu: %s", (unsigned long long)op_id, r->reason);
  else if (r)
    distd_forget_op(p, op_id); /* an op id that failed here before, used again */
  if (p->closing) distd_xfer_fail(x, DIST_ECANCELED, "the peer data plane is shutting down");
  dlist_push(&p->xfers, &x->link);
  pthread_mutex_unlock(&p->mu);
  return x;
}

/* Only x's poster touches x->spare_sends (here, in its sends, in
 * distd_xfer_free): no lock. */
int distd_xfer_reserve_sends(distd_xfer *x, int n) {
  for (int i = 0; i < n; i++) {
    send_item *it = calloc(1, sizeof *it);
    if (!it) {
      distd_send_items_free(&x->spare_sends);
      return -1;
    }
    dlist_push(&x->spare_sends, &it->link);
  }
  x->sends_reserved = n;
  return 0;
}

/* A reservation that did not match the sends: a send past it allocated
 * (and could have failed midway), or memory was held for nothing. Only a
 * sound xfer counts: a failed one stops posting. */
static void check_reservation(distd_xfer *x) {
  if (x->sends_reserved < 0 || x->err.code || x->sends_taken == x->sends_reserved) return;
  x->p->reserve_mismatches++;
  log_warn("op %llu: its sends took %d items where %d were reserved",
           (unsigned long long)x->op_id, x->sends_taken, x->sends_reserved);
}

uint64_t distd_peers_reserve_mismatches(distd_peers *p) {
  pthread_mutex_lock(&p->mu);
  uint64_t n = p->reserve_mismatches;
  pthread_mutex_unlock(&p->mu);
  return n;
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
      if (!s->any_tmp) {
        distd_xfer_out_of_memory(x, "keeping what it sends itself");
        return;
      }
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
  send_item *it = new_send_item(x);
  if (!it) {
    distd_xfer_out_of_memory(x, "queueing a send to itself");
    return;
  }
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
  send_item *it = new_send_item(x);
  if (!it) {
    distd_xfer_out_of_memory(x, "queueing a send");
    goto out;
  }
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


static void recv_from_self(distd_xfer *x, recv_slot *s) {
  dlist *pos;
  for (pos = x->self_sends.next; pos != &x->self_sends; pos = pos->next) {
    send_item *it = dlist_entry(pos, send_item, link);
    if (it->tag != s->tag) continue;
    dlist_remove(&it->link);
    if (s->any_buf) {
      *s->any_buf = malloc(it->len ? it->len : 1);
      if (!*s->any_buf) distd_xfer_out_of_memory(x, "receiving from itself");
      else if (it->len) memcpy(*s->any_buf, it->payload, it->len);
      *s->any_len = *s->any_buf ? it->len : 0;
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
  unexpected *u = distd_find_unexpected(p, x->op_id, s->src, s->tag);
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
    distd_deliver_unexpected(s, u);
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
  if (!s) {
    distd_xfer_out_of_memory(x, "posting a receive");
    goto out;
  }
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

int distd_xfer_wait(distd_xfer *x, int64_t deadline_ms, dist_errbuf *eb) {
  distd_peers *p = x->p;
  if (!p) return dist_fail(eb, x->err.code, "%s", x->err.msg);
  pthread_mutex_lock(&p->mu);
  p->waiters++;
  x->waiting = 1;
  int64_t now = distd_now_ms();
  x->moved_ms = now; /* the silence is counted from here */
  check_reservation(x);
  if (!x->err.code) check_self_matched(x);
  if (!distd_can_drive(p)) distd_peers_flush_queued(p, 0);
  while (!x->err.code && x->pending > 0) {
    int64_t limit = distd_xfer_wait_limit(x, deadline_ms);
    if (now >= limit) {
      fail_timeout(x);
      break;
    }
    if (distd_can_drive(p))
      distd_drive(x, deadline_ms);
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

/* Queues an ABORT of op_id (code) to each of ranks[] but this one; the
 * caller holds p->mu. It needs no xfer: an op that failed for want of
 * memory before it had one must still be able to say so. */
static void queue_abort(distd_peers *p, uint64_t op_id, int code, const int *ranks, int n,
                        const char *reason) {
  size_t len = strnlen(reason, CTL_MAX);
  dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_ABORT,
                         op_id, (uint32_t)p->rank, 0, len, (uint64_t)(-(int64_t)code)};
  for (int i = 0; i < n; i++) {
    int r = ranks[i];
    if (r >= 0 && r < p->world && r != p->rank) distd_peer_queue_ctl(p, r, &h, reason, len);
  }
}

void distd_xfer_abort(distd_xfer *x, const int *ranks, int n, const char *reason) {
  distd_peers *p = x->p;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  if (x->aborted_by < 0) /* else its sender told the group already */
    queue_abort(p, x->op_id, x->err.code ? x->err.code : DIST_ECANCELED, ranks, n, reason);
  pthread_mutex_unlock(&p->mu);
}

void distd_abort_op(distd_peers *p, uint64_t op_id, const int *ranks, int n,
                    const char *reason) {
  pthread_mutex_lock(&p->mu);
  const remembered_op *r = distd_remembered_find(p, op_id);
  if (!r || r->aborted_by < 0) /* else its sender told the group already */
    queue_abort(p, op_id, DIST_ECANCELED, ranks, n, reason);
  pthread_mutex_unlock(&p->mu);
}

int distd_abort_no_memory(distd_peers *p, uint64_t op_id, const int *ranks, int n,
                          const char *what, dist_errbuf *eb) {
  dist_fail(eb, DIST_ENOMEM, "op %llu: out of memory for %s", (unsigned long long)op_id, what);
  distd_abort_op(p, op_id, ranks, n, dist_errbuf_msg(eb));
  return DIST_ENOMEM;
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
  distd_send_items_free(&x->spare_sends);
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
