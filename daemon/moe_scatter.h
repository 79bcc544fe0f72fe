/* MoE global_scatter / global_gather between the daemons of a group, on the
 * peer data plane (seed 003, semantics.md "global_scatter / global_gather").
 *
 * Counts have W*E entries, index i = rank*E + expert (rank = position in the
 * group). A scatter's input is rank-major (chunk i = local_count[i] rows for
 * expert i%E of rank i/E, in order); its output is expert-major (for each
 * local expert e, for each source rank r, global_count[r*E+e] rows). A
 * gather is the exact inverse.
 *
 * Wire protocol, per op id: every rank first sends every other member a
 * small header with all of its counts, then its rows as one frame per
 * (destination, expert) chunk cut from its send block, tagged by expert, so
 * each receive lands straight in its place in the output. Receives are
 * posted before the headers are checked; once every header is in, each rank
 * checks the whole count matrix of the group, so a disagreement is seen (and
 * reported with the same message naming both ranks) by every member. The
 * self part is a memcpy. */
#ifndef DISTD_MOE_SCATTER_H
#define DISTD_MOE_SCATTER_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"
#include "peer.h"

typedef enum { DISTD_MOE_SCATTER = 1, DISTD_MOE_GATHER = 2 } distd_moe_dir;

typedef struct distd_moe_args {
  distd_peers *peers;
  uint64_t op_id;
  distd_moe_dir dir;
  const int *group;             /* global ranks, in group order */
  int size;                     /* W */
  int me;                       /* this rank's position in group */
  int experts;                  /* E */
  const int64_t *local_count;   /* W*E */
  const int64_t *global_count;  /* W*E */
  size_t row_bytes;             /* d_model * dtype size */
  int64_t deadline_ms;          /* CLOCK_MONOTONIC ms */
  int gradient;                 /* backward traffic: not counted as tokens */
  uint64_t signature;           /* distd_xfer_sign of both exchanges
                                   (op_signature.h); 0: none */
} distd_moe_args;

/* Checks a request before any transfer: counts of length W*E (E >= 1), none
 * negative, and the input's rows match (sum(local_count) for a scatter,
 * sum(global_count) for a gather). Sets *experts and *out_rows (rows of the
 * result). n_count_* are the array lengths as given. */
int distd_moe_check_counts(distd_moe_dir dir, int size, const int64_t *local,
                           size_t n_local, const int64_t *global,
                           size_t n_global, uint64_t in_rows, int *experts,
                           uint64_t *out_rows, dist_errbuf *eb);

/* Runs the exchange: in has the input rows, out room for the result's rows
 * (see distd_moe_check_counts). Every member calls it with the same op id.
 * On failure every member that can be told is told (ABORT). */
int distd_moe_exchange(const distd_moe_args *a, const void *in, void *out,
                       dist_errbuf *eb);

#endif
