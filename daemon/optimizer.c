/* The update rules of torch.optim, element by element. The arithmetic runs
 * in the parameter's own type, in PyTorch's order of operations, so float32
 * results match a local PyTorch optimizer to rounding. */
#include "optimizer.h"

#include <math.h>

#include "tensor.h"

const char *distd_optim_name(distd_optim_kind k) {
  switch (k) {
  case DISTD_OPT_SGD: return "sgd";
  case DISTD_OPT_ADAM: return "adam";
  case DISTD_OPT_ADAMW: return "adamw";
  }
  return NULL;
}

static int bad(dist_errbuf *eb, const char *what, double v, const char *rule) {
  return dist_fail(eb, DIST_EINVAL, "optimizer %s = %g: must be %s", what, v, rule);
}

int distd_optim_check(const distd_optim_cfg *c, dist_errbuf *eb) {
  if (!distd_optim_name(c->kind))
    return dist_fail(eb, DIST_EINVAL, "unknown optimizer kind %d", (int)c->kind);
  if (!(c->lr >= 0) || !isfinite(c->lr)) return bad(eb, "lr", c->lr, ">= 0");
  if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
    return bad(eb, "weight_decay", c->weight_decay, ">= 0");
  if (c->kind == DISTD_OPT_SGD) {
    if (!(c->momentum >= 0) || !isfinite(c->momentum))
      return bad(eb, "momentum", c->momentum, ">= 0");
    if (!(c->dampening >= 0 && c->dampening <= 1))
      return bad(eb, "dampening", c->dampening, "in [0, 1]");
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
      return dist_fail(eb, DIST_EINVAL, "nesterov momentum requires a momentum "
                       "> 0 and zero dampening");
    return 0;
  }
  if (!(c->beta1 >= 0 && c->beta1 < 1)) return bad(eb, "beta1", c->beta1, "in [0, 1)");
  if (!(c->beta2 >= 0 && c->beta2 < 1)) return bad(eb, "beta2", c->beta2, "in [0, 1)");
  if (!(c->eps >= 0) || !isfinite(c->eps)) return bad(eb, "eps", c->eps, ">= 0");
  return 0;
}

int distd_optim_check_dtype(dist_dtype dt, dist_errbuf *eb) {
  if (dt == DIST_FLOAT32 || dt == DIST_FLOAT64) return 0;
  return dist_fail(eb, DIST_ENOTSUP, "optimizers run on float32 or float64 "
                   "parameters, not %s", dist_dtype_name(dt));
}

int distd_optim_state_count(const distd_optim_cfg *c) {
  if (c->kind == DISTD_OPT_SGD) return c->momentum != 0 ? 1 : 0;
  return 2;
}

/* One kernel per rule and element type T; the bodies are written once. */
#define SGD_KERNEL(T, NAME)                                                  \
  static void NAME(const distd_optim_cfg *c, size_t n, T *p, const T *g,     \
                   T *buf, uint64_t step) {                                  \
    const T lr = (T)c->lr, wd = (T)c->weight_decay, mom = (T)c->momentum;    \
    const T damp = (T)(1.0 - c->dampening);                                  \
    for (size_t i = 0; i < n; i++) {                                         \
      T d = g[i];                                                            \
      if (wd != 0) d += wd * p[i];                                           \
      if (buf) {                                                             \
        buf[i] = step <= 1 ? d : mom * buf[i] + damp * d;                    \
        d = c->nesterov ? d + mom * buf[i] : buf[i];                         \
      }                                                                      \
      p[i] -= lr * d;                                                        \
    }                                                                        \
  }

#define ADAM_KERNEL(T, NAME, SQRT)                                           \
  static void NAME(const distd_optim_cfg *c, size_t n, T *p, const T *g,     \
                   T *m, T *v, uint64_t step, int decoupled) {               \
    const double bc1 = 1.0 - pow(c->beta1, (double)step);                    \
    const double bc2 = 1.0 - pow(c->beta2, (double)step);                    \
    const T step_size = (T)(c->lr / bc1), bc2_sqrt = (T)sqrt(bc2);           \
    const T b1 = (T)c->beta1, b2 = (T)c->beta2, eps = (T)c->eps;             \
    const T wd = (T)c->weight_decay, shrink = (T)(1.0 - c->lr * c->weight_decay); \
    for (size_t i = 0; i < n; i++) {                                         \
      T d = g[i];                                                            \
      if (decoupled) p[i] *= shrink;                                         \
      else if (wd != 0) d += wd * p[i];                                      \
      m[i] += (d - m[i]) * (1 - b1);                                         \
      v[i] = v[i] * b2 + (1 - b2) * d * d;                                   \
      T denom = SQRT(v[i]) / bc2_sqrt + eps;                                 \
      p[i] -= step_size * (m[i] / denom);                                    \
    }                                                                        \
  }

SGD_KERNEL(float, sgd_f32)
SGD_KERNEL(double, sgd_f64)
ADAM_KERNEL(float, adam_f32, sqrtf)
ADAM_KERNEL(double, adam_f64, sqrt)

void distd_optim_step(const distd_optim_cfg *c, dist_dtype dt, size_t n,
                      void *param, const void *grad, void *const *state,
                      uint64_t step) {
  int nstate = distd_optim_state_count(c);
  void *s0 = nstate > 0 ? state[0] : NULL, *s1 = nstate > 1 ? state[1] : NULL;
  int decoupled = c->kind == DISTD_OPT_ADAMW;
  if (dt == DIST_FLOAT32) {
    if (c->kind == DISTD_OPT_SGD) sgd_f32(c, n, param, grad, s0, step);
    else adam_f32(c, n, param, grad, s0, s1, step, decoupled);
  } else if (dt == DIST_FLOAT64) {
    if (c->kind == DISTD_OPT_SGD) sgd_f64(c, n, param, grad, s0, step);
    else adam_f64(c, n, param, grad, s0, s1, step, decoupled);
  }
}
