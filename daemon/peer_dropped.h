/* The keys of kept-aside frames dropped unreceived after
 * peer_unexpected_max_age (distd_unexpected_expire), remembered so that
 * a receive posted later fails at once, naming the sender, rather than
 * after peer_timeout. Bounded in count (the oldest record is forgotten
 * first) and in time (distd_dropped_expire), so a receiver that never
 * comes costs a fixed amount of memory. Lookup is O(1): a receive posting
 * looks here whenever it finds no kept-aside frame, which for small
 * collectives is most of them. Not locked: the caller holds
 * distd_peers.mu. */
#ifndef DISTD_PEER_DROPPED_H
#define DISTD_PEER_DROPPED_H

#include <stdint.h>

#define DROPPED_FRAMES 512   /* records kept at most */
#define DROPPED_BUCKETS 1024 /* a power of two, twice the records */

typedef struct distd_dropped_frame {
  uint64_t op_id;
  uint32_t tag;
  int src;
  int64_t dropped_ms; /* when it was dropped */
  int64_t waited_ms;  /* how long it was kept aside before */
  int next;           /* next record in its bucket; -1 ends it */
  int live;           /* 0 once taken by a receive */
} distd_dropped_frame;

typedef struct distd_dropped_frames {
  distd_dropped_frame rec[DROPPED_FRAMES]; /* a ring in drop order */
  int bucket[DROPPED_BUCKETS];             /* first record of each; -1: none */
  int first, count;                        /* the oldest record, and how many */
} distd_dropped_frames;

void distd_dropped_init(distd_dropped_frames *d);
/* Remembers a frame dropped at now_ms after waited_ms kept aside; when
 * full, forgets the oldest record. */
void distd_dropped_note(distd_dropped_frames *d, uint64_t op_id, int src, uint32_t tag,
                        int64_t waited_ms, int64_t now_ms);
/* Finds the record of (op_id, src, tag) and forgets it (an op id used
 * again later is not failed twice); 1 and *out when found. */
int distd_dropped_take(distd_dropped_frames *d, uint64_t op_id, int src, uint32_t tag,
                       distd_dropped_frame *out);
/* Forgets the records dropped keep_ms or more before now_ms. */
void distd_dropped_expire(distd_dropped_frames *d, int64_t now_ms, int64_t keep_ms);

#endif
