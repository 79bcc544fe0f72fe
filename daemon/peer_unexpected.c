/* Frames that arrived before their receive was posted ("unexpected"),
 * kept aside until it is: handed to the receive when it comes, dropped
 * with their op's failure, or dropped after peer_unexpected_max_age. A
 * file of its own because the list has a life apart from any transfer:
 * the read path fills it, the loop's timer sweeps it, posting a receive
 * or failing an op takes from it. Every function here runs with
 * distd_peers.mu held. */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "peer_internal.h"

/* Data kept aside for an op that failed is of no use to anyone. */
void distd_drop_unexpected_of(distd_peers *p, uint64_t op_id) {
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->unexpected) {
    unexpected *u = dlist_entry(pos, unexpected, link);
    if (u->op_id == op_id && u->complete) distd_unexpected_free(p, u);
  }
}

void distd_deliver_unexpected(recv_slot *s, unexpected *u) {
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
    /* Its op failed while it arrived (distd_drop_unexpected_of passed it by):
     * kept, it would count against unexpected_limit until the daemon
     * stops. */
    if (distd_remembered_find(p, u->op_id)) distd_unexpected_free(p, u);
    return;
  }
  u->claim = NULL;
  s->claimed = NULL;
  distd_deliver_unexpected(s, u);
  distd_xfer_one_done(s->x);
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

unexpected *distd_find_unexpected(distd_peers *p, uint64_t op_id, int src, uint32_t tag) {
  for (dlist *pos = p->unexpected.next; pos != &p->unexpected; pos = pos->next) {
    unexpected *u = dlist_entry(pos, unexpected, link);
    if (u->op_id == op_id && u->src == src && u->tag == tag && !u->claim) return u;
  }
  return NULL;
}
