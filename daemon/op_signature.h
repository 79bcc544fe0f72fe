/* What the SPMD members of one collective must agree on beyond byte
 * counts: the collective, the dtype, the reduce op, the root; a
 * point-to-point send and its receive, on the dtype. Each trainer
 * describes the op to its own daemon, so two of them can ask for, say, a
 * float32 sum and an int32 max over buffers of one size; without a check
 * the bytes would add up to values that mean nothing. The signature rides
 * in every data frame of the op (distd_xfer_sign), so checking it costs
 * no message and no round trip. */
#ifndef DISTD_OP_SIGNATURE_H
#define DISTD_OP_SIGNATURE_H

#include <stddef.h>
#include <stdint.h>

#include "dist/types.h"

typedef enum {
  DISTD_SIG_ALL_REDUCE = 1,
  DISTD_SIG_ALL_GATHER,
  DISTD_SIG_REDUCE_SCATTER,
  DISTD_SIG_ALL_TO_ALL,
  DISTD_SIG_BROADCAST,
  DISTD_SIG_BARRIER,
  DISTD_SIG_GLOBAL_SCATTER,
  DISTD_SIG_GLOBAL_GATHER,
  DISTD_SIG_P2P, /* a send and its receive: the dtype */
  DISTD_SIG_KINDS
} distd_sig_kind;

/* dt is DIST_DTYPE_INVALID, reduce and root -1, where the kind has none;
 * root is a global rank.
 * Never 0, so a signed op is told apart from an unsigned one. */
uint64_t distd_op_signature(distd_sig_kind kind, dist_dtype dt, int reduce, int root);
/* "all_reduce(float32, sum)", "broadcast(int64, root 2)"; a
 * distd_signature_namer. */
void distd_op_signature_name(uint64_t signature, char *out, size_t n);

#endif
