/* Collectives on the peer data plane. Every algorithm here is direct: each
 * member talks to every other member in one round (or two, for the large
 * all-reduce), which on a handful of ranks beats rings and trees: fewer
 * rounds, and every byte crosses the wire as few times as possible.
 *
 * Tags number the steps of one op (1, 2), so a member that called the wrong
 * collective or a wrong count sees a frame of an unexpected length for the
 * same (op, tag) at once (DIST_EPROTO) instead of waiting for a deadline.
 * Every failure is sent to the whole group as ABORT so nobody waits. */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

#include "op_signature.h"
#include "ops.h"
#include "tensor.h"

enum { TAG_P2P = 0, TAG_STEP1 = 1, TAG_STEP2 = 2 };

/* Up to this many bytes sent per member (buffer x (size-1)), all-reduce
 * sends the whole buffer to everyone (one round); above, reduce-scatter +
 * all-gather (two rounds, (size-1)/size of the bytes twice). Measured on
 * loopback, float32 sum, median op time (us), direct vs two rounds:
 *   W=2: 1 KiB 23 vs 31, 64 KiB 63 vs 56, 1 MiB 1511 vs 498
 *   W=4: 1 KiB 72 vs 210, 64 KiB 387 vs 320, 1 MiB 8268 vs 2376
 * Overridable at build time for such measurements. */
#ifndef ALLREDUCE_DIRECT_MAX
#define ALLREDUCE_DIRECT_MAX (32u << 10)
#endif

int distd_coll_init(distd_coll *c, distd_peers *peers, uint64_t op_id,
                    const int *group, int size, int64_t deadline_ms,
                    dist_errbuf *eb) {
  int world = distd_peers_world_size(peers), rank = distd_peers_rank(peers);
  *c = (distd_coll){.peers = peers, .op_id = op_id, .group = group, .size = size,
                    .me = -1, .deadline_ms = deadline_ms};
  if (size < 1) return dist_fail(eb, DIST_EINVAL, "collective over a group of %d ranks", size);
  for (int i = 0; i < size; i++) {
    if (group[i] < 0 || group[i] >= world)
      return dist_fail(eb, DIST_EINVAL, "group member %d is rank %d, outside the world of %d",
                       i, group[i], world);
    for (int j = 0; j < i; j++)
      if (group[j] == group[i])
        return dist_fail(eb, DIST_EINVAL, "rank %d appears twice in the group", group[i]);
    if (group[i] == rank) c->me = i;
  }
  if (c->me < 0)
    return dist_fail(eb, DIST_EINVAL, "rank %d is not in the collective's group", rank);
  return 0;
}

static int check_dtype(dist_dtype dt, size_t *es, dist_errbuf *eb) {
  *es = dist_dtype_size(dt);
  if (*es == 0) return dist_fail(eb, DIST_EINVAL, "invalid dtype %d", (int)dt);
  return 0;
}

int distd_check_reduce(dist_reduce op, dist_errbuf *eb) {
  if ((int)op < DIST_REDUCE_SUM || op > DIST_REDUCE_ALL)
    return dist_fail(eb, DIST_EINVAL, "invalid reduce op %d", (int)op);
  return 0;
}

/* An xfer for one round of c, the items of its sends to peers allocated
 * ahead: a member that could not allocate its k-th send would have sent
 * the first k-1, and a member that got one might then hold every block it
 * needs and finish while this one fails. A vote (vote.h) is an all-gather
 * whose every member decides alone, so each member sends to all or to
 * none. NULL for want of memory. */
static distd_xfer *new_xfer(const distd_coll *c, int sends) {
  distd_xfer *x = distd_xfer_new(c->peers, c->op_id);
  if (!x) return NULL;
  if (distd_xfer_reserve_sends(x, sends) != 0) {
    distd_xfer_free(x);
    return NULL;
  }
  distd_xfer_sign(x, c->signature, distd_op_signature_name);
  return x;
}

static int no_memory(const distd_coll *c, dist_errbuf *eb) {
  return distd_abort_no_memory(c->peers, c->op_id, c->group, c->size,
                               c->kind ? c->kind : "a collective", eb);
}

/* Waits for x; on failure tells the rest of the group. */
static int finish(const distd_coll *c, distd_xfer *x, dist_errbuf *eb) {
  return distd_xfer_finish(x, c->deadline_ms, c->group, c->size, eb);
}

/* The sends of a round that sends to every other member: what new_xfer
 * reserves and what the send loops count to. A round that sends to this
 * member too (all-to-all, all-gather) posts the receive of its own block
 * first, which that send fills at once, taking no item (send_to_self in
 * peer_xfer.c): it reserves the same. A wait counts a round that took
 * more or fewer (reserve_mismatches, in /metrics), which test_coll and
 * test_reserved_sends check. */
static int others(const distd_coll *c) { return c->size - 1; }

/* Member (me + k) mod size: each member starts with a different peer. */
static int rotated(const distd_coll *c, int k) { return (c->me + k) % c->size; }

static void offsets(const size_t *counts, int n, size_t es, size_t *off) {
  size_t o = 0;
  for (int i = 0; i < n; i++) {
    off[i] = o;
    o += counts[i] * es;
  }
}

/* Splits count elements into size nearly equal chunks. */
static void split(size_t count, int size, size_t *cnt) {
  for (int i = 0; i < size; i++)
    cnt[i] = count / (size_t)size + ((size_t)i < count % (size_t)size);
}

static int alltoallv_run(const distd_coll *c, const void *send, const size_t *send_counts,
                    void *recv, const size_t *recv_counts, dist_dtype dt,
                    dist_errbuf *eb) {
  size_t es, *soff = NULL, *roff = NULL;
  distd_xfer *x = NULL;
  int rc = check_dtype(dt, &es, eb);
  if (rc) return rc;
  soff = malloc(sizeof *soff * (size_t)c->size);
  roff = malloc(sizeof *roff * (size_t)c->size);
  if (!soff || !roff || !(x = new_xfer(c, others(c)))) {
    rc = no_memory(c, eb);
    goto out;
  }
  offsets(send_counts, c->size, es, soff);
  offsets(recv_counts, c->size, es, roff);
  for (int k = 0; k < c->size; k++) {
    int j = rotated(c, c->size - k);
    distd_xfer_recv(x, c->group[j], TAG_STEP1, (char *)recv + roff[j], recv_counts[j] * es);
  }
  for (int k = 0; k < c->size; k++) {
    int j = rotated(c, k + 1);
    distd_xfer_send(x, c->group[j], TAG_STEP1, (const char *)send + soff[j],
                    send_counts[j] * es);
  }
  rc = finish(c, x, eb);
out:
  distd_xfer_free(x);
  free(soff);
  free(roff);
  return rc;
}

static int allgather_run(const distd_coll *c, const void *in, void *out, const size_t *counts,
                    dist_dtype dt, dist_errbuf *eb) {
  size_t es, *off = NULL;
  distd_xfer *x = NULL;
  int rc = check_dtype(dt, &es, eb);
  if (rc) return rc;
  if (!(off = malloc(sizeof *off * (size_t)c->size)) || !(x = new_xfer(c, others(c)))) {
    rc = no_memory(c, eb);
    goto out;
  }
  offsets(counts, c->size, es, off);
  for (int k = 0; k < c->size; k++) {
    int j = rotated(c, c->size - k);
    distd_xfer_recv(x, c->group[j], TAG_STEP1, (char *)out + off[j], counts[j] * es);
  }
  for (int k = 1; k <= c->size; k++)
    distd_xfer_send(x, c->group[rotated(c, k)], TAG_STEP1, in, counts[c->me] * es);
  rc = finish(c, x, eb);
out:
  distd_xfer_free(x);
  free(off);
  return rc;
}

/* Receives every other member's block me into tmp (one slot per member,
 * skipping me) and sends each member its block of in, under tag. */
static void post_scatter_reduce(const distd_coll *c, distd_xfer *x, const char *in,
                                const size_t *off, const size_t *cnt, size_t es, char *tmp,
                                uint32_t tag) {
  size_t mine = cnt[c->me] * es;
  for (int k = 1; k < c->size; k++) {
    int j = rotated(c, c->size - k);
    int slot = j < c->me ? j : j - 1;
    distd_xfer_recv(x, c->group[j], tag, tmp + (size_t)slot * mine, mine);
  }
  for (int k = 1; k <= others(c); k++) {
    int j = rotated(c, k);
    distd_xfer_send(x, c->group[j], tag, in + off[j], cnt[j] * es);
  }
}

/* acc (n elements, already holding this member's part) gets every slot. */
static void reduce_slots(const distd_coll *c, void *acc, const char *tmp, size_t n,
                         dist_dtype dt, dist_reduce op) {
  dist_reduce_parts(acc, tmp, c->size, n, dt, op); /* exact integer avg */
}

static int reduce_scatter_run(const distd_coll *c, const void *in, void *out, const size_t *counts,
                         dist_dtype dt, dist_reduce op, dist_errbuf *eb) {
  size_t es, *off = NULL;
  char *tmp = NULL;
  distd_xfer *x = NULL;
  int rc = check_dtype(dt, &es, eb);
  if (rc || (rc = distd_check_reduce(op, eb))) return rc;
  size_t mine = counts[c->me] * es;
  if (!(off = malloc(sizeof *off * (size_t)c->size)) ||
      !(tmp = malloc(mine * (size_t)(c->size - 1) + 1)) || !(x = new_xfer(c, others(c)))) {
    rc = no_memory(c, eb);
    goto out;
  }
  offsets(counts, c->size, es, off);
  post_scatter_reduce(c, x, in, off, counts, es, tmp, TAG_STEP1);
  if ((rc = finish(c, x, eb))) goto out;
  if (mine) memcpy(out, (const char *)in + off[c->me], mine);
  reduce_slots(c, out, tmp, counts[c->me], dt, op);
out:
  distd_xfer_free(x);
  free(tmp);
  free(off);
  return rc;
}

/* One round: everybody sends the whole buffer to everybody, and every
 * member folds the copies in group order, so all get the same bits. */
static int allreduce_direct(const distd_coll *c, void *buf, size_t count, dist_dtype dt,
                            dist_reduce op, dist_errbuf *eb) {
  size_t bytes = count * dist_dtype_size(dt);
  char *tmp = malloc(bytes * (size_t)c->size + 1);
  distd_xfer *x = tmp ? new_xfer(c, others(c)) : NULL;
  int rc = 0;
  if (!x) {
    rc = no_memory(c, eb);
    goto out;
  }
  if (bytes) memcpy(tmp + (size_t)c->me * bytes, buf, bytes);
  for (int k = 1; k < c->size; k++) {
    int j = rotated(c, c->size - k);
    distd_xfer_recv(x, c->group[j], TAG_STEP1, tmp + (size_t)j * bytes, bytes);
  }
  for (int k = 1; k <= others(c); k++)
    distd_xfer_send(x, c->group[rotated(c, k)], TAG_STEP1, buf, bytes);
  if ((rc = finish(c, x, eb))) goto out;
  if (bytes) memcpy(buf, tmp, bytes);
  dist_reduce_parts(buf, tmp + bytes, c->size, count, dt, op);
out:
  distd_xfer_free(x);
  free(tmp);
  return rc;
}

/* Reduce-scatter then all-gather, both direct. The all-gather's receives
 * are posted before the first round so that the peers' second-round data
 * lands in place: a peer sends its reduced chunk j only after it received
 * all of our chunk j, so the region is no longer being sent from. */
static int allreduce_rs_ag(const distd_coll *c, void *buf, size_t count, dist_dtype dt,
                           dist_reduce op, dist_errbuf *eb) {
  size_t es = dist_dtype_size(dt);
  size_t *cnt = malloc(sizeof *cnt * (size_t)c->size);
  size_t *off = malloc(sizeof *off * (size_t)c->size);
  char *tmp = NULL, *b = buf;
  distd_xfer *x1 = NULL, *x2 = NULL;
  int rc = 0;
  if (cnt) split(count, c->size, cnt);
  if (!cnt || !off || !(tmp = malloc(cnt[c->me] * es * (size_t)(c->size - 1) + 1)) ||
      !(x1 = new_xfer(c, others(c))) || !(x2 = new_xfer(c, others(c)))) {
    rc = no_memory(c, eb);
    goto out;
  }
  offsets(cnt, c->size, es, off);
  for (int k = 1; k < c->size; k++) {
    int j = rotated(c, c->size - k);
    distd_xfer_recv(x2, c->group[j], TAG_STEP2, b + off[j], cnt[j] * es);
  }
  post_scatter_reduce(c, x1, b, off, cnt, es, tmp, TAG_STEP1);
  if ((rc = finish(c, x1, eb))) goto out;
  reduce_slots(c, b + off[c->me], tmp, cnt[c->me], dt, op);
  for (int k = 1; k <= others(c); k++)
    distd_xfer_send(x2, c->group[rotated(c, k)], TAG_STEP2, b + off[c->me], cnt[c->me] * es);
  rc = finish(c, x2, eb);
out:
  distd_xfer_free(x1);
  distd_xfer_free(x2);
  free(tmp);
  free(cnt);
  free(off);
  return rc;
}

static int allreduce_run(const distd_coll *c, void *buf, size_t count, dist_dtype dt,
                    dist_reduce op, dist_errbuf *eb) {
  size_t es;
  int rc = check_dtype(dt, &es, eb);
  if (rc || (rc = distd_check_reduce(op, eb))) return rc;
  if (c->size == 1) {
    dist_reduce_finish(buf, count, dt, op, 1);
    return 0;
  }
  if (count * es * (size_t)(c->size - 1) <= ALLREDUCE_DIRECT_MAX || count < (size_t)c->size)
    return allreduce_direct(c, buf, count, dt, op, eb);
  return allreduce_rs_ag(c, buf, count, dt, op, eb);
}

static int broadcast_run(const distd_coll *c, void *buf, size_t count, dist_dtype dt, int root,
                    dist_errbuf *eb) {
  size_t es;
  int rc = check_dtype(dt, &es, eb);
  if (rc) return rc;
  if (root < 0 || root >= c->size)
    return dist_fail(eb, DIST_EINVAL, "broadcast root %d is not a member of a group of %d",
                     root, c->size);
  distd_xfer *x = new_xfer(c, c->me == root ? others(c) : 0);
  if (!x) return no_memory(c, eb);
  if (c->me == root) {
    for (int k = 1; k <= others(c); k++)
      distd_xfer_send(x, c->group[rotated(c, k)], TAG_STEP1, buf, count * es);
  } else {
    distd_xfer_recv(x, c->group[root], TAG_STEP1, buf, count * es);
  }
  rc = finish(c, x, eb);
  distd_xfer_free(x);
  return rc;
}

static int barrier_run(const distd_coll *c, dist_errbuf *eb) {
  distd_xfer *x = new_xfer(c, others(c));
  if (!x) return no_memory(c, eb);
  static const char nothing[1];
  for (int k = 1; k <= others(c); k++) {
    distd_xfer_recv(x, c->group[rotated(c, k)], TAG_STEP1, (void *)nothing, 0);
    distd_xfer_send(x, c->group[rotated(c, k)], TAG_STEP1, nothing, 0);
  }
  int rc = finish(c, x, eb);
  distd_xfer_free(x);
  return rc;
}

/* Signed with the dtype, so that a receive of another dtype than was sent
 * (same byte count) fails with both named instead of reinterpreting the
 * bytes; a sender whose frame left before the receive saw it has
 * succeeded by then, and only learns of it through the ABORT if it still
 * waits. */
static int point_to_point(distd_peers *p, uint64_t op_id, int peer, const void *sbuf,
                          void *rbuf, size_t bytes, dist_dtype dt, int64_t deadline_ms,
                          dist_errbuf *eb) {
  distd_xfer *x = distd_xfer_new(p, op_id);
  if (!x) return distd_abort_no_memory(p, op_id, &peer, 1, "a transfer", eb);
  distd_xfer_sign(x, distd_op_signature(DISTD_SIG_P2P, dt, -1, -1), distd_op_signature_name);
  if (sbuf) distd_xfer_send(x, peer, TAG_P2P, sbuf, bytes);
  else distd_xfer_recv(x, peer, TAG_P2P, rbuf, bytes);
  int rc = distd_xfer_finish(x, deadline_ms, &peer, 1, eb);
  distd_xfer_free(x);
  return rc;
}

/* ---- the entry points: each call is one operation in the daemon's
 * registry (ops.h), so `distctl ops` shows it while it runs and the
 * distd_collective* metrics count it when it ends. Bytes are this rank's
 * input. ---- */

static uint64_t track(distd_peers *p, const char *kind, uint64_t op_id, const int *group,
                      int size, uint64_t bytes) {
  return distd_ops_begin(distd_peers_ops(p), kind, op_id, group, size, bytes);
}

/* Ends the operation with rc and the message in why, which goes on to eb. */
static int untrack(distd_peers *p, uint64_t serial, int rc, const dist_errbuf *why,
                   dist_errbuf *eb) {
  distd_ops_end(distd_peers_ops(p), serial, rc, why->msg);
  if (rc && eb) *eb = *why;
  return rc;
}

static uint64_t track_coll(const distd_coll *c, const char *kind, uint64_t bytes) {
  return track(c->peers, c->kind ? c->kind : kind, c->op_id, c->group, c->size, bytes);
}

static size_t total(const size_t *counts, int n) {
  size_t t = 0;
  for (int i = 0; i < n; i++) t += counts[i];
  return t;
}

int distd_alltoallv(const distd_coll *c, const void *send, const size_t *send_counts,
                    void *recv, const size_t *recv_counts, dist_dtype dt,
                    dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  uint64_t serial = track_coll(c, "all_to_all",
                               total(send_counts, c->size) * dist_dtype_size(dt));
  int rc = alltoallv_run(c, send, send_counts, recv, recv_counts, dt, &why);
  return untrack(c->peers, serial, rc, &why, eb);
}

int distd_allgather(const distd_coll *c, const void *in, void *out, const size_t *counts,
                    dist_dtype dt, dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  uint64_t serial = track_coll(c, "all_gather", counts[c->me] * dist_dtype_size(dt));
  int rc = allgather_run(c, in, out, counts, dt, &why);
  return untrack(c->peers, serial, rc, &why, eb);
}

int distd_reduce_scatter(const distd_coll *c, const void *in, void *out, const size_t *counts,
                         dist_dtype dt, dist_reduce op, dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  uint64_t serial = track_coll(c, "reduce_scatter",
                               total(counts, c->size) * dist_dtype_size(dt));
  int rc = reduce_scatter_run(c, in, out, counts, dt, op, &why);
  return untrack(c->peers, serial, rc, &why, eb);
}

int distd_allreduce(const distd_coll *c, void *buf, size_t count, dist_dtype dt,
                    dist_reduce op, dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  uint64_t serial = track_coll(c, "all_reduce", count * dist_dtype_size(dt));
  int rc = allreduce_run(c, buf, count, dt, op, &why);
  return untrack(c->peers, serial, rc, &why, eb);
}

int distd_broadcast(const distd_coll *c, void *buf, size_t count, dist_dtype dt, int root,
                    dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  uint64_t serial = track_coll(c, "broadcast", count * dist_dtype_size(dt));
  int rc = broadcast_run(c, buf, count, dt, root, &why);
  return untrack(c->peers, serial, rc, &why, eb);
}

int distd_barrier(const distd_coll *c, dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  uint64_t serial = track_coll(c, "barrier", 0);
  int rc = barrier_run(c, &why);
  return untrack(c->peers, serial, rc, &why, eb);
}

int distd_send_to(distd_peers *p, uint64_t op_id, int dst, const void *buf, size_t bytes,
                  dist_dtype dt, int64_t deadline_ms, dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  uint64_t serial = track(p, "send", op_id, &dst, 1, bytes);
  int rc = point_to_point(p, op_id, dst, buf ? buf : "", NULL, bytes, dt, deadline_ms, &why);
  return untrack(p, serial, rc, &why, eb);
}

int distd_recv_from(distd_peers *p, uint64_t op_id, int src, void *buf, size_t bytes,
                    dist_dtype dt, int64_t deadline_ms, dist_errbuf *eb) {
  dist_errbuf why = DIST_ERRBUF_INIT;
  uint64_t serial = track(p, "recv", op_id, &src, 1, bytes);
  int rc = point_to_point(p, op_id, src, NULL, buf, bytes, dt, deadline_ms, &why);
  return untrack(p, serial, rc, &why, eb);
}
