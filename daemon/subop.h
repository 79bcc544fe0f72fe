/* Op ids of the steps of multi-step operations.
 *
 * A client gives each operation one op id; the daemons run its steps as
 * separate exchanges on the data plane, and tell them apart by deriving an
 * op id per step. Every rank derives the same ids from the same plan, so no
 * step is announced. The steps of the operations that nest (a parameter's
 * reshard runs reshards of its values and state) share one table, so that
 * no two exchanges of one operation can meet under the same id. A
 * Collective RPC derives its own (svc_collective.c): it nests nothing. */
#ifndef DISTD_SUBOP_H
#define DISTD_SUBOP_H

#include <stdint.h>

#include "dist/types.h"

enum distd_step {
  /* A reshard (reshard.c): the cross-mesh move, then one all-reduce per
   * mesh dim that stops being Partial, then the layout exchange. */
  DISTD_STEP_RESHARD_MOVE = 1,
  DISTD_STEP_RESHARD_REDUCE = 2, /* + the mesh dim */
  DISTD_STEP_RESHARD_LAYOUT = 12,
  /* Steps a reshard makes from the op id it is given: one further reshard
   * run under base + k * DISTD_STEP_RESHARD_SPAN never meets this one. */
  DISTD_STEP_RESHARD_SPAN = 20,

  /* A LocalLayer backward's verdicts (svc_program_backward.c), under this
   * step of the invocation id, clear of the invocation's own vote. */
  DISTD_STEP_BACKWARD = 40,

  /* The verdicts on a request applied by all or by none (vote.h): a
   * parameter's push or configure sent to every daemon of its mesh, after
   * the gradient's own reshard; a reshard, after its state's. */
  DISTD_STEP_VOTE = 80,
  /* A parameter's reshard (param_reshard.c): the pending-push counts, the
   * note to the destination mesh, then one reshard per state buffer. */
  DISTD_STEP_PARAM_PENDING = 90,
  DISTD_STEP_PARAM_NOTE = 95,
  DISTD_STEP_PARAM_STATE = 100, /* + k * DISTD_STEP_RESHARD_SPAN */
  /* A batch of pushes (svc_param_batch.c): push k's gradient reshard,
   * then one vote for all of them at DISTD_STEP_VOTE. */
  DISTD_STEP_PUSH_BATCH = 200, /* + k * DISTD_STEP_RESHARD_SPAN */
};

_Static_assert(DISTD_STEP_RESHARD_REDUCE + DIST_MAX_MESH_DIMS <= DISTD_STEP_RESHARD_LAYOUT,
               "a reduce step per mesh dim fits before the layout step");
_Static_assert(DISTD_STEP_RESHARD_LAYOUT < DISTD_STEP_RESHARD_SPAN,
               "a reshard's steps fit in its span");
_Static_assert(DISTD_STEP_RESHARD_SPAN <= DISTD_STEP_VOTE,
               "a parameter's steps are clear of its values' reshard");

/* The op id of step `step` of operation op_id. Steps compose: step b of
 * step a is step a + b, which is what the spans above rely on. */
static inline uint64_t distd_subop(uint64_t op_id, unsigned step) {
  return op_id + (uint64_t)step * 0x9E3779B97F4A7C15ull;
}

/* The op id whose step `step` sub_id is (the inverse of distd_subop). */
static inline uint64_t distd_subop_parent(uint64_t sub_id, unsigned step) {
  return sub_id - (uint64_t)step * 0x9E3779B97F4A7C15ull;
}

/* The steps of a reshard under an op id from a mesh of ndim dims, into
 * steps (room for DISTD_RESHARD_STEPS_MAX): the cross-mesh move, one
 * all-reduce per mesh dim, the layout exchange. Returns how many. */
#define DISTD_RESHARD_STEPS_MAX (2 + DIST_MAX_MESH_DIMS)
static inline int distd_reshard_steps(int ndim, unsigned *steps) {
  int n = 0;
  steps[n++] = DISTD_STEP_RESHARD_MOVE;
  for (int d = 0; d < ndim; d++) steps[n++] = DISTD_STEP_RESHARD_REDUCE + (unsigned)d;
  steps[n++] = DISTD_STEP_RESHARD_LAYOUT;
  return n;
}

/* The steps of an op id a refused operation may have its daemons wait on
 * first (svc_op_abort.c), the id itself (step 0) included: its vote, the
 * vote of a LocalLayer backward under it, a reshard's steps, and those an
 * in-place reshard runs before them (param_reshard.c: the pending-push
 * counts, the note to the destination mesh; without them a refused
 * reshard onto another mesh left the destination waiting for its note). A
 * daemon told of a range of refused ids recognises these
 * (peer_remember.c). Returns how many, at most DISTD_REFUSED_STEPS_MAX. */
#define DISTD_REFUSED_STEPS_MAX (5 + DISTD_RESHARD_STEPS_MAX)
static inline int distd_refused_steps(unsigned *steps) {
  steps[0] = 0;
  steps[1] = DISTD_STEP_VOTE;
  steps[2] = DISTD_STEP_BACKWARD + DISTD_STEP_VOTE;
  steps[3] = DISTD_STEP_PARAM_PENDING;
  steps[4] = DISTD_STEP_PARAM_NOTE;
  return 5 + distd_reshard_steps(DIST_MAX_MESH_DIMS, steps + 5);
}

/* 1 when op_id is one of first .. first + count - 1 or a refusal step of
 * one (steps[0..n) from distd_refused_steps, worked out once by a caller
 * that asks about many ranges). */
static inline int distd_refused_range_covers(uint64_t first, uint64_t count, uint64_t op_id,
                                             const unsigned *steps, int n) {
  for (int i = 0; i < n; i++)
    if (distd_subop_parent(op_id, steps[i]) - first < count) return 1;
  return 0;
}

#endif
