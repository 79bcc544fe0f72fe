/* Control frames (ABORT, ABORT_RANGE) queued to a peer's outbound queue.
 * They are queued because something failed, often for want of memory, and
 * a peer that misses an ABORT waits for the op until its deadline: so
 * each peer keeps CTL_SPARES frames allocated from the start, taken when
 * a frame cannot be allocated and given back once it is written or
 * dropped. Called with distd_peers.mu held, but for distd_send_items_free,
 * which touches only the list it is given. */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "peer_internal.h"

/* A control frame and its payload, in one block. */
typedef struct ctl_frame {
  send_item it;
  uint8_t payload[];
} ctl_frame;

static send_item *new_ctl_item(size_t payload_len) {
  ctl_frame *f = calloc(1, sizeof *f + payload_len);
  return f ? &f->it : NULL;
}

int distd_ctl_spares_init(peer *pe) {
  dlist_init(&pe->ctl_spares);
  for (int i = 0; i < CTL_SPARES; i++) {
    send_item *it = new_ctl_item(CTL_MAX);
    if (!it) return -1;
    it->spare = 1;
    dlist_push(&pe->ctl_spares, &it->link);
  }
  return 0;
}

void distd_send_items_free(dlist *list) {
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, list) {
    dlist_remove(pos);
    free(dlist_entry(pos, send_item, link));
  }
}

void distd_ctl_spares_free(peer *pe) {
  distd_send_items_free(&pe->ctl_spares); /* a spare's block starts with its item */
}

void distd_send_item_free(peer *pe, send_item *it) {
  if (it->spare) { /* zeroed again when taken (take_ctl_item) */
    dlist_push(&pe->ctl_spares, &it->link);
    return;
  }
  free(it->owned);
  free(it);
}

/* A frame of len payload bytes: a new one, else a spare (NULL when the
 * spares are all queued too). */
static send_item *take_ctl_item(peer *pe, size_t len) {
  send_item *it = new_ctl_item(len);
  if (it || dlist_empty(&pe->ctl_spares)) return it;
  dlist *pos = pe->ctl_spares.next;
  dlist_remove(pos);
  it = dlist_entry(pos, send_item, link);
  memset(it, 0, sizeof *it);
  it->spare = 1;
  return it;
}

/* A dropped frame is counted, never logged here: the line would be one
 * per frame, and a JSON one allocates. The tick logs the sum. */
static void count_dropped(peer *pe) {
  pe->stats.ctl_dropped++;
  pe->ctl_dropped_unlogged++;
}

void distd_ctl_report_dropped(distd_peers *p, peer *pe) {
  if (!pe->ctl_dropped_unlogged) return;
  log_warn("peer rank %d (%s): %llu ABORT or ABORT_RANGE frame(s) to it dropped since the "
           "last such line: no memory for them and its %d spare control frames queued; "
           "it may wait for those ops until their deadline",
           pe->rank, distd_peer_addr(p, pe->rank),
           (unsigned long long)pe->ctl_dropped_unlogged, CTL_SPARES);
  pe->ctl_dropped_unlogged = 0;
}

void distd_peer_queue_ctl(distd_peers *p, int dst, const dist_frame_header *h,
                          const void *payload, size_t len) {
  peer *pe = &p->peers[dst];
  /* Callers cut reasons to CTL_MAX (a peer fails a longer frame): a longer
   * one is a caller's bug, not a want of memory, and is not counted as one. */
  if (len > CTL_MAX) return;
  send_item *it = take_ctl_item(pe, len);
  if (!it) {
    count_dropped(pe);
    return;
  }
  uint8_t *room = ((ctl_frame *)it)->payload;
  if (len) memcpy(room, payload, len);
  dist_frame_encode(h, it->hdr);
  it->payload = room;
  it->len = len;
  it->dst = dst;
  dlist_init(&it->xlink);
  distd_peer_queue_frame(p, dst, it);
  conn *c = pe->out;
  if (c && c->greeted) distd_conn_flush(c, 0);
}
