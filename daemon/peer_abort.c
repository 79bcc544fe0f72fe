/* Telling peers that a range of op ids failed here before this rank took
 * part in them (a trainer's refused tape backward plan, a LocalLayer
 * call's outputs: op_refuse.h). A peer whose HELLO_ACK said it reads
 * ABORT_RANGE frames gets one frame for the whole range. Any other peer
 * gets an ABORT frame per refusal step per id, as every peer did before:
 * a daemon built before ABORT_RANGE would fail the connection on the
 * unknown kind, and one not connected now may come back as such a build.
 * A plan of 1000 ids was about 13000 frames to each peer. */
#include "peer_internal.h"
#include "subop.h"

_Static_assert(DIST_ABORT_RANGE_MAX <= CTL_MAX, "a peer reads every ABORT_RANGE we send");

/* Queues the range's frame to the ranks whose connection reads it; writes
 * the other ranks (this one and those outside the world left out) to
 * others[] and returns their count. */
static int tell_readers(distd_peers *p, uint64_t first, uint64_t count, const int *ranks, int n,
                        const char *reason, int *others) {
  uint8_t payload[DIST_ABORT_RANGE_MAX];
  size_t len = dist_abort_range_encode(&(dist_abort_range){count, reason}, payload);
  dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_ABORT_RANGE,
                         first, (uint32_t)p->rank, 0, len, (uint64_t)(-(int64_t)DIST_ECANCELED)};
  int n_others = 0;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < n; i++) {
    int r = ranks[i];
    if (r < 0 || r >= p->world || r == p->rank) continue;
    /* A frame queued now leaves on this connection or not at all: a lost
     * connection's control frames are dropped (purge_outq). */
    const conn *c = p->peers[r].out;
    if (c && c->greeted && c->reads_abort_range)
      distd_peer_queue_ctl(p, r, &h, payload, len);
    else
      others[n_others++] = r;
  }
  pthread_mutex_unlock(&p->mu);
  return n_others;
}

/* Each step of each id, newest id first: a daemon before 0.2.9 keeps the
 * last few hundred exchanges, which are then the first ids, the ones the
 * others reach first. */
static void tell_each_step(distd_peers *p, uint64_t first, uint64_t count, const int *ranks,
                           int n, const char *reason) {
  unsigned steps[DISTD_REFUSED_STEPS_MAX];
  int nsteps = distd_refused_steps(steps);
  /* By offset, newest first: ids wrap past 2^64 as a range reader's
   * (distd_refused_range_covers) do. */
  for (uint64_t k = count; k-- > 0;)
    for (int i = 0; i < nsteps; i++)
      distd_abort_op(p, distd_subop(first + k, steps[i]), ranks, n, reason);
}

void distd_abort_range(distd_peers *p, uint64_t first, uint64_t count, const int *ranks, int n,
                       const char *reason) {
  /* The ranks by chunks, their list on the stack: an abort is often for
   * want of memory, and a list that could not be allocated made every
   * rank a peer before ABORT_RANGE, about 13 frames per id (a reviewer's
   * find), more than its spare frames (peer_ctl.c) can carry. */
  enum { CHUNK = 256 };
  int others[CHUNK];
  for (int at = 0; at < n && count > 0; at += CHUNK) {
    int m = n - at < CHUNK ? n - at : CHUNK;
    int n_others = tell_readers(p, first, count, ranks + at, m, reason, others);
    if (n_others > 0) tell_each_step(p, first, count, others, n_others, reason);
  }
}
