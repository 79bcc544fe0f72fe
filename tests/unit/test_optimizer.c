/* The daemon's optimizer kernels against the update formulas of
 * torch.optim's documentation (SGD with momentum, Adam, AdamW with bias
 * correction), recomputed here in long double, over several steps. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "optimizer.h"

enum { N = 7, STEPS = 6 };

/* Deterministic, varied gradients: sign changes, different magnitudes. */
static double grad_at(int step, int i) {
  return sin(1.3 * i + 0.7 * step) * (1.0 + 0.5 * i) - 0.1 * step;
}

static double param0(int i) { return 0.25 * i - 0.8; }

typedef struct reference {
  long double p[N], buf[N], m[N], v[N];
} reference;

/* torch.optim.SGD: d = g + wd p; b_1 = d, b_t = mu b_{t-1} + (1 - tau) d;
 * d = nesterov ? d + mu b_t : b_t; p -= lr d. */
static void ref_sgd(reference *r, const distd_optim_cfg *c, int t,
                    const double *grad) {
  for (int i = 0; i < N; i++) {
    long double d = grad[i] + c->weight_decay * r->p[i];
    if (c->momentum != 0) {
      r->buf[i] = t == 1 ? d : c->momentum * r->buf[i] + (1 - c->dampening) * d;
      d = c->nesterov ? d + c->momentum * r->buf[i] : r->buf[i];
    }
    r->p[i] -= c->lr * d;
  }
}

/* torch.optim.Adam / AdamW: m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
 * p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps); Adam adds wd p to
 * g, AdamW first scales p by (1 - lr wd). */
static void ref_adam(reference *r, const distd_optim_cfg *c, int t,
                     const double *grad) {
  for (int i = 0; i < N; i++) {
    long double g = grad[i];
    if (c->kind == DISTD_OPT_ADAMW) r->p[i] *= 1 - c->lr * c->weight_decay;
    else g += c->weight_decay * r->p[i];
    r->m[i] = c->beta1 * r->m[i] + (1 - c->beta1) * g;
    r->v[i] = c->beta2 * r->v[i] + (1 - c->beta2) * g * g;
    long double mhat = r->m[i] / (1 - powl(c->beta1, t));
    long double vhat = r->v[i] / (1 - powl(c->beta2, t));
    r->p[i] -= c->lr * mhat / (sqrtl(vhat) + c->eps);
  }
}

/* Runs STEPS updates through the kernel in dtype dt and the reference side
 * by side, comparing the parameter after every step. */
static void run_against_reference(const distd_optim_cfg *c, dist_dtype dt,
                                  double tol) {
  cr_assert_eq(distd_optim_check(c, NULL), 0);
  double p64[N], g64[N], s64[2][N];
  float p32[N], g32[N], s32[2][N];
  memset(s64, 0, sizeof s64);
  memset(s32, 0, sizeof s32);
  reference r;
  memset(&r, 0, sizeof r);
  for (int i = 0; i < N; i++) r.p[i] = p64[i] = p32[i] = (float)param0(i);
  void *st64[2] = {s64[0], s64[1]}, *st32[2] = {s32[0], s32[1]};
  for (int t = 1; t <= STEPS; t++) {
    for (int i = 0; i < N; i++) {
      g32[i] = (float)grad_at(t, i);
      g64[i] = dt == DIST_FLOAT32 ? g32[i] : grad_at(t, i);
    }
    if (c->kind == DISTD_OPT_SGD) ref_sgd(&r, c, t, g64);
    else ref_adam(&r, c, t, g64);
    if (dt == DIST_FLOAT64) distd_optim_step(c, dt, N, p64, g64, st64, (uint64_t)t);
    else distd_optim_step(c, dt, N, p32, g32, st32, (uint64_t)t);
    for (int i = 0; i < N; i++) {
      double got = dt == DIST_FLOAT64 ? p64[i] : p32[i];
      cr_assert(fabs(got - (double)r.p[i]) <= tol * (1 + fabs((double)r.p[i])),
                "%s step %d elem %d: kernel %.12g, reference %.12g",
                distd_optim_name(c->kind), t, i, got, (double)r.p[i]);
    }
  }
}

/* The reference uses float32-rounded gradients and parameters, so the
 * float32 runs differ only by float32 arithmetic. */
static distd_optim_cfg sgd(double lr, double mom, double damp, int nesterov,
                           double wd) {
  distd_optim_cfg c = {DISTD_OPT_SGD, lr, mom, damp, nesterov, 0, 0, 0, wd};
  return c;
}

static distd_optim_cfg adam(distd_optim_kind k, double lr, double b1, double b2,
                            double eps, double wd) {
  distd_optim_cfg c = {k, lr, 0, 0, 0, b1, b2, eps, wd};
  return c;
}

Test(optimizer, plain_sgd_float64) {
  distd_optim_cfg c = sgd(0.1, 0, 0, 0, 0);
  run_against_reference(&c, DIST_FLOAT64, 1e-12);
  cr_assert_eq(distd_optim_state_count(&c), 0);
}

Test(optimizer, sgd_momentum_weight_decay_float64) {
  distd_optim_cfg c = sgd(0.05, 0.9, 0, 0, 0.01);
  run_against_reference(&c, DIST_FLOAT64, 1e-12);
  cr_assert_eq(distd_optim_state_count(&c), 1);
}

Test(optimizer, sgd_momentum_dampening_float32) {
  distd_optim_cfg c = sgd(0.05, 0.8, 0.3, 0, 0.001);
  run_against_reference(&c, DIST_FLOAT32, 2e-6);
}

Test(optimizer, sgd_nesterov_float64) {
  distd_optim_cfg c = sgd(0.02, 0.9, 0, 1, 0.05);
  run_against_reference(&c, DIST_FLOAT64, 1e-12);
}

Test(optimizer, adam_float64) {
  distd_optim_cfg c = adam(DISTD_OPT_ADAM, 1e-2, 0.9, 0.999, 1e-8, 0);
  run_against_reference(&c, DIST_FLOAT64, 1e-12);
}

Test(optimizer, adam_l2_weight_decay_float32) {
  distd_optim_cfg c = adam(DISTD_OPT_ADAM, 3e-3, 0.8, 0.99, 1e-6, 0.1);
  run_against_reference(&c, DIST_FLOAT32, 2e-6);
}

Test(optimizer, adamw_decoupled_weight_decay_float64) {
  distd_optim_cfg c = adam(DISTD_OPT_ADAMW, 1e-2, 0.9, 0.999, 1e-8, 0.1);
  run_against_reference(&c, DIST_FLOAT64, 1e-12);
}

Test(optimizer, adamw_float32) {
  distd_optim_cfg c = adam(DISTD_OPT_ADAMW, 1e-3, 0.9, 0.95, 1e-8, 0.01);
  run_against_reference(&c, DIST_FLOAT32, 2e-6);
}

/* Known values: Adam's first step moves every element by lr * g/|g| (with
 * eps 0), whatever the gradient's magnitude. */
Test(optimizer, adam_first_step_is_lr_times_sign) {
  distd_optim_cfg c = adam(DISTD_OPT_ADAM, 0.5, 0.9, 0.999, 0, 0);
  double p[3] = {1, 1, 1}, g[3] = {1e-3, -40, 7}, m[3] = {0}, v[3] = {0};
  void *st[2] = {m, v};
  distd_optim_step(&c, DIST_FLOAT64, 3, p, g, st, 1);
  cr_assert_float_eq(p[0], 0.5, 1e-12);
  cr_assert_float_eq(p[1], 1.5, 1e-12);
  cr_assert_float_eq(p[2], 0.5, 1e-12);
}

/* Known values: SGD momentum 0.5, lr 1, gradient 1 each step: buffers
 * 1, 1.5, 1.75 so the parameter goes 10 -> 9 -> 7.5 -> 5.75. */
Test(optimizer, sgd_momentum_known_values) {
  distd_optim_cfg c = sgd(1, 0.5, 0, 0, 0);
  float p = 10, g = 1, buf = 0;
  void *st[1] = {&buf};
  float want[3] = {9, 7.5f, 5.75f};
  for (int t = 1; t <= 3; t++) {
    distd_optim_step(&c, DIST_FLOAT32, 1, &p, &g, st, (uint64_t)t);
    cr_assert_float_eq(p, want[t - 1], 1e-6);
  }
}

Test(optimizer, rejects_bad_hyper_parameters) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_optim_cfg c = sgd(-1, 0, 0, 0, 0);
  cr_assert_eq(distd_optim_check(&c, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "lr"), "%s", eb.msg);
  c = sgd(0.1, 0, 0, 1, 0);
  cr_assert_eq(distd_optim_check(&c, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "nesterov"), "%s", eb.msg);
  c = adam(DISTD_OPT_ADAM, 0.1, 1.0, 0.999, 1e-8, 0);
  cr_assert_eq(distd_optim_check(&c, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "beta1"), "%s", eb.msg);
  c = adam(DISTD_OPT_ADAMW, 0.1, 0.9, -0.1, 1e-8, 0);
  cr_assert_eq(distd_optim_check(&c, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "beta2"), "%s", eb.msg);
  c.kind = (distd_optim_kind)7;
  cr_assert_eq(distd_optim_check(&c, &eb), DIST_EINVAL);
}

Test(optimizer, rejects_non_float_dtypes) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_optim_check_dtype(DIST_FLOAT32, &eb), 0);
  cr_assert_eq(distd_optim_check_dtype(DIST_FLOAT64, &eb), 0);
  dist_dtype bad[] = {DIST_FLOAT16, DIST_BFLOAT16, DIST_INT32, DIST_INT64, DIST_BOOL};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_assert_eq(distd_optim_check_dtype(bad[i], &eb), DIST_ENOTSUP);
    cr_assert(strstr(eb.msg, "float32 or float64"), "%s", eb.msg);
  }
}
