/* Iteration over a broadcast of up to three operands to an output shape.
 * Dims are collapsed first (size-1 dims dropped, contiguous runs merged), so
 * the innermost row is as long as possible and the per-row cost (a switch,
 * an odometer step) is paid rarely; the rows themselves are plain loops. */
#ifndef DISTD_BCAST_H
#define DISTD_BCAST_H

#include <stdint.h>

#include "tensor.h"

typedef struct distd_bcast {
  int nd, nin;
  int64_t dims[DIST_MAX_DIMS];
  int64_t st[3][DIST_MAX_DIMS]; /* element strides; 0 along broadcast dims */
  int64_t inner;                /* row length: dims[nd - 1] */
  int64_t nrows;
  /* iteration state */
  int64_t idx[DIST_MAX_DIMS];
  int64_t off[3];
} distd_bcast;

/* Each in[k] must broadcast to out (checked by the caller). */
void distd_bcast_init(distd_bcast *b, const dist_shape *out,
                      const dist_shape *const *in, int nin);
/* Advances off[] to the next row. */
void distd_bcast_next(distd_bcast *b);

#endif
