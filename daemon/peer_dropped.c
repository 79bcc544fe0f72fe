/* Records of dropped kept-aside frames: a ring of DROPPED_FRAMES in drop
 * order, chained by hash of their key for O(1) lookup. */
#include "peer_dropped.h"

static unsigned bucket_of(uint64_t op_id, int src, uint32_t tag) {
  uint64_t h = op_id ^ ((uint64_t)(uint32_t)src << 32) ^ ((uint64_t)tag * 0x9E3779B97F4A7C15ull);
  h *= 0x9E3779B97F4A7C15ull;
  return (unsigned)(h >> 32) & (DROPPED_BUCKETS - 1);
}

void distd_dropped_init(distd_dropped_frames *d) {
  d->first = d->count = 0;
  for (int b = 0; b < DROPPED_BUCKETS; b++) d->bucket[b] = -1;
}

static void unlink_record(distd_dropped_frames *d, int i) {
  distd_dropped_frame *r = &d->rec[i];
  if (!r->live) return; /* taken: already out of its bucket */
  int *at = &d->bucket[bucket_of(r->op_id, r->src, r->tag)];
  while (*at != i) at = &d->rec[*at].next;
  *at = r->next;
  r->live = 0;
}

/* Forgets the oldest record. */
static void drop_oldest(distd_dropped_frames *d) {
  unlink_record(d, d->first);
  d->first = (d->first + 1) % DROPPED_FRAMES;
  d->count--;
}

void distd_dropped_note(distd_dropped_frames *d, uint64_t op_id, int src, uint32_t tag,
                        int64_t waited_ms, int64_t now_ms) {
  if (d->count == DROPPED_FRAMES) drop_oldest(d);
  int i = (d->first + d->count++) % DROPPED_FRAMES;
  unsigned b = bucket_of(op_id, src, tag);
  d->rec[i] = (distd_dropped_frame){.op_id = op_id, .tag = tag, .src = src,
                                     .dropped_ms = now_ms, .waited_ms = waited_ms,
                                     .next = d->bucket[b], .live = 1};
  d->bucket[b] = i;
}

int distd_dropped_take(distd_dropped_frames *d, uint64_t op_id, int src, uint32_t tag,
                       distd_dropped_frame *out) {
  if (d->count == 0) return 0; /* the usual case */
  for (int i = d->bucket[bucket_of(op_id, src, tag)]; i >= 0; i = d->rec[i].next) {
    const distd_dropped_frame *r = &d->rec[i];
    if (r->op_id != op_id || r->src != src || r->tag != tag) continue;
    *out = *r;
    unlink_record(d, i); /* its ring slot goes when it is the oldest */
    return 1;
  }
  return 0;
}

void distd_dropped_expire(distd_dropped_frames *d, int64_t now_ms, int64_t keep_ms) {
  while (d->count && now_ms - d->rec[d->first].dropped_ms >= keep_ms) drop_oldest(d);
}
