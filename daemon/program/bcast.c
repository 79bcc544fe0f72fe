/* Broadcast iteration (see bcast.h). */
#include "bcast.h"

#include <string.h>

void distd_bcast_init(distd_bcast *b, const dist_shape *out,
                      const dist_shape *const *in, int nin) {
  int nd = out->ndim;
  int64_t st[3][DIST_MAX_DIMS];
  for (int k = 0; k < nin; k++) {
    int64_t stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
      int ik = in[k]->ndim - nd + d;
      int64_t dim = ik >= 0 ? in[k]->dims[ik] : 1;
      st[k][d] = dim == 1 ? 0 : stride;
      stride *= dim;
    }
  }
  memset(b, 0, sizeof *b);
  b->nin = nin;
  for (int d = 0; d < nd; d++) {
    if (out->dims[d] == 1) continue;
    int last = b->nd - 1, merge = last >= 0;
    for (int k = 0; merge && k < nin; k++)
      merge = b->st[k][last] == st[k][d] * out->dims[d];
    if (merge) {
      b->dims[last] *= out->dims[d];
      for (int k = 0; k < nin; k++) b->st[k][last] = st[k][d];
      continue;
    }
    b->dims[b->nd] = out->dims[d];
    for (int k = 0; k < nin; k++) b->st[k][b->nd] = st[k][d];
    b->nd++;
  }
  if (b->nd == 0) { /* a scalar, or all dims 1 */
    b->nd = 1;
    b->dims[0] = 1;
  }
  b->inner = b->dims[b->nd - 1];
  b->nrows = 1;
  for (int d = 0; d < b->nd - 1; d++) b->nrows *= b->dims[d];
  if (dist_shape_numel(out) == 0) b->nrows = 0;
}

void distd_bcast_next(distd_bcast *b) {
  for (int d = b->nd - 2; d >= 0; d--) {
    b->idx[d]++;
    for (int k = 0; k < b->nin; k++) b->off[k] += b->st[k][d];
    if (b->idx[d] < b->dims[d]) return;
    for (int k = 0; k < b->nin; k++) b->off[k] -= b->st[k][d] * b->dims[d];
    b->idx[d] = 0;
  }
}
