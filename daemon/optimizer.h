/* Server-side optimizers as plain kernels over one shard: the parameter's
 * local piece, its gradient and the optimizer state kept next to it. The
 * update rules are PyTorch's (torch.optim.SGD, Adam, AdamW, with
 * amsgrad=False and maximize=False), so a trainer moving from a local
 * optimizer sees the same numbers. Only float32 and float64 are supported:
 * the moments of a low-precision parameter would need a master copy, which
 * the daemon does not keep. */
#ifndef DISTD_OPTIMIZER_H
#define DISTD_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "dist/types.h"
#include "errbuf.h"

typedef enum {
  DISTD_OPT_SGD = 0,   /* with optional momentum, dampening, nesterov */
  DISTD_OPT_ADAM = 1,  /* weight decay as L2 added to the gradient */
  DISTD_OPT_ADAMW = 2  /* decoupled weight decay */
} distd_optim_kind;

typedef struct distd_optim_cfg {
  distd_optim_kind kind;
  double lr;
  double momentum;     /* SGD */
  double dampening;    /* SGD */
  int nesterov;        /* SGD: needs momentum > 0 and dampening == 0 */
  double beta1, beta2; /* Adam, AdamW */
  double eps;          /* Adam, AdamW */
  double weight_decay;
} distd_optim_cfg;

/* Checks the hyper-parameters (as torch.optim does: lr >= 0, betas in
 * [0, 1), eps >= 0, ...); the message names the bad one. */
int distd_optim_check(const distd_optim_cfg *c, dist_errbuf *eb);
/* Fails with DIST_ENOTSUP naming the dtype unless it is float32/float64. */
int distd_optim_check_dtype(dist_dtype dt, dist_errbuf *eb);
/* How many state buffers (each the size of the shard) the optimizer keeps:
 * 0 for plain SGD, 1 for SGD with momentum, 2 for Adam/AdamW (m, v); never
 * more than DISTD_OPTIM_STATE_MAX. */
#define DISTD_OPTIM_STATE_MAX 2
int distd_optim_state_count(const distd_optim_cfg *c);
/* One update of n elements in place: param and state[0..count) are updated,
 * grad is read. step is the 1-based number of this update (Adam's bias
 * correction; SGD initialises its momentum buffer on step 1). State buffers
 * start zeroed. dt must have passed distd_optim_check_dtype. */
void distd_optim_step(const distd_optim_cfg *c, dist_dtype dt, size_t n,
                      void *param, const void *grad, void *const *state,
                      uint64_t step);
/* "sgd", "adam", "adamw"; NULL for an unknown kind. */
const char *distd_optim_name(distd_optim_kind k);

#endif
