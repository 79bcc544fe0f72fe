/* Remembered ops: aborted by a peer, or failed here, so that a transfer
 * posted later for one fails at once and its frames are dropped.
 *
 * Single ids go to a ring of REMEMBERED_OPS. A peer's aborts of
 * consecutive ids with one reason (a refused tape backward's plan, a
 * LocalLayer call's outputs) grow one range instead, which also covers
 * each id's refusal steps (subop.h): a plan of a thousand ids costs one
 * entry, where its ~13 ids apiece overran the ring past ~19. A peer's
 * ABORT_RANGE frame is such a range at once. A range that meets a live one
 * of the same abort (continues, overlaps, holds or is held by it) joins
 * it, so a range told again, or in overlapping pieces, takes no slot. */
#include <stdio.h>
#include <string.h>

#include "peer_internal.h"
#include "subop.h"

static int live(const remembered_op *r, int64_t now) {
  return r->at_ms && now - r->at_ms < REMEMBER_MS;
}

static remembered_op *find_in_ring(distd_peers *p, uint64_t op_id, int64_t now) {
  for (int i = 0; i < p->remembered_used; i++) {
    remembered_op *r = &p->remembered[i];
    if (r->op_id == op_id && live(r, now)) return r;
  }
  return NULL;
}

static remembered_range *find_range(distd_peers *p, uint64_t op_id, int64_t now) {
  if (p->ranges_used == 0) return NULL;
  unsigned steps[DISTD_REFUSED_STEPS_MAX]; /* the same for every range */
  int n = distd_refused_steps(steps);
  for (int i = 0; i < p->ranges_used; i++) {
    remembered_range *rg = &p->ranges[i];
    if (live(&rg->op, now) &&
        distd_refused_range_covers(rg->op.op_id, rg->count, op_id, steps, n)) return rg;
  }
  return NULL;
}

const remembered_op *distd_remembered_find(distd_peers *p, uint64_t op_id) {
  /* the usual case, asked for every frame */
  if (p->remembered_used == 0 && p->ranges_used == 0) return NULL;
  int64_t now = distd_now_ms();
  const remembered_op *r = find_in_ring(p, op_id, now);
  if (r && r->aborted_by >= 0) return r;
  /* A peer's range over an id that failed here before wins, as a peer's
   * ABORT of the id overwrites that failure (distd_remember_op): the id
   * used again fails at once instead of waiting on a rank that refused
   * it. */
  const remembered_range *rg = find_range(p, op_id, now);
  return rg ? &rg->op : r;
}

static int same_abort(const remembered_op *r, int aborted_by, int code, const char *reason) {
  return r->aborted_by == aborted_by && r->code == code &&
         strncmp(r->reason, reason, sizeof r->reason - 1) == 0;
}

/* Makes rg the union of itself and first .. first + count - 1 when that
 * is one run of ids (the two overlap, one holds the other, or one
 * continues the other), ids counted modulo 2^64 as
 * distd_refused_range_covers counts them; 1 if it did. The union covers
 * exactly the ids and steps the two covered: a range covers each of its
 * ids' steps. */
static int take_union(remembered_range *rg, uint64_t first, uint64_t count) {
  uint64_t starts_at = first - rg->op.op_id; /* the run's offset in rg */
  if (starts_at <= rg->count) {
    uint64_t end = starts_at + count;
    if (end < starts_at) return 0; /* longer than every id there is */
    if (end > rg->count) rg->count = end;
    return 1;
  }
  uint64_t rg_at = rg->op.op_id - first; /* rg's offset in the run */
  if (rg_at > count) return 0; /* apart */
  uint64_t end = rg_at + rg->count;
  if (end < rg_at) return 0;
  rg->op.op_id = first;
  rg->count = end > count ? end : count;
  return 1;
}

/* Grows a live range from the same rank, for the same reason, that
 * first .. first + count - 1 meets (overlaps, holds, is held by, or
 * continues at either end) to their union, then takes into it the
 * other such ranges it now meets; 1 if one grew. */
static int extend_range(distd_peers *p, uint64_t first, uint64_t count, int from, int code,
                        const char *reason, int64_t now) {
  remembered_range *grown = NULL;
  for (int i = 0; i < p->ranges_used && !grown; i++) {
    remembered_range *rg = &p->ranges[i];
    if (live(&rg->op, now) && same_abort(&rg->op, from, code, reason) &&
        take_union(rg, first, count))
      grown = rg;
  }
  if (!grown) return 0;
  grown->op.at_ms = now;
  for (int i = 0; i < p->ranges_used; i++) {
    remembered_range *rg = &p->ranges[i];
    if (rg != grown && live(&rg->op, now) && same_abort(&rg->op, from, code, reason) &&
        take_union(grown, rg->op.op_id, rg->count))
      rg->op.at_ms = 0; /* in grown now */
  }
  return 1;
}

/* A slot for a new range: one never written, else the one told longest
 * ago. One emptied (at_ms 0: taken into another) or expired comes first,
 * so a live range is dropped only when every slot holds one. */
static remembered_range *new_range(distd_peers *p) {
  if (p->ranges_used < REMEMBERED_RANGES) return &p->ranges[p->ranges_used++];
  remembered_range *oldest = &p->ranges[0];
  for (int i = 1; i < REMEMBERED_RANGES; i++)
    if (p->ranges[i].op.at_ms < oldest->op.at_ms) oldest = &p->ranges[i];
  return oldest;
}

/* The same for a single id of the ring (emptied: taken into a range, or
 * forgotten). */
static remembered_op *new_single(distd_peers *p) {
  if (p->remembered_used < REMEMBERED_OPS) return &p->remembered[p->remembered_used++];
  remembered_op *oldest = &p->remembered[0];
  for (int i = 1; i < REMEMBERED_OPS; i++)
    if (p->remembered[i].at_ms < oldest->at_ms) oldest = &p->remembered[i];
  return oldest;
}

static void set_op(remembered_op *r, uint64_t op_id, int64_t now, int aborted_by, int code,
                   const char *reason) {
  *r = (remembered_op){.op_id = op_id, .at_ms = now, .aborted_by = aborted_by, .code = code};
  snprintf(r->reason, sizeof r->reason, "%s", reason);
}

/* Turns op_id and a neighbour id the ring holds from the same abort into
 * a range of two; 1 if there was one. */
static int start_range(distd_peers *p, uint64_t op_id, int from, int code, const char *reason,
                       int64_t now) {
  remembered_op *nb = find_in_ring(p, op_id - 1, now);
  if (!nb || !same_abort(nb, from, code, reason)) nb = find_in_ring(p, op_id + 1, now);
  if (!nb || !same_abort(nb, from, code, reason)) return 0;
  uint64_t lo = nb->op_id == op_id - 1 ? nb->op_id : op_id; /* modulo 2^64: MAX, then 0 */
  nb->at_ms = 0; /* in a range from here on */
  /* the pair may meet a range that op_id alone did not (ring 50, range
   * 40..49, then 51): one run of ids, one slot */
  if (extend_range(p, lo, 2, from, code, reason, now)) return 1;
  remembered_range *rg = new_range(p);
  set_op(&rg->op, lo, now, from, code, reason);
  rg->count = 2;
  return 1;
}

void distd_remember_op(distd_peers *p, uint64_t op_id, int aborted_by, int code,
                       const char *reason) {
  int64_t now = distd_now_ms();
  if (find_range(p, op_id, now)) return; /* a peer's abort: kept */
  remembered_op *r = find_in_ring(p, op_id, now);
  if (r && r->aborted_by >= 0 && aborted_by < 0) return; /* keep the peer's reason */
  if (!r && aborted_by >= 0 && (extend_range(p, op_id, 1, aborted_by, code, reason, now) ||
                                start_range(p, op_id, aborted_by, code, reason, now)))
    return;
  if (!r) r = new_single(p);
  set_op(r, op_id, now, aborted_by, code, reason);
}

void distd_remember_range(distd_peers *p, uint64_t first, uint64_t count, int aborted_by,
                          int code, const char *reason) {
  int64_t now = distd_now_ms();
  if (extend_range(p, first, count, aborted_by, code, reason, now)) return;
  remembered_range *rg = new_range(p);
  set_op(&rg->op, first, now, aborted_by, code, reason);
  rg->count = count;
}

void distd_forget_op(distd_peers *p, uint64_t op_id) {
  remembered_op *r = find_in_ring(p, op_id, distd_now_ms());
  if (r) r->at_ms = 0; /* a range holds peers' aborts alone, never forgotten */
}
