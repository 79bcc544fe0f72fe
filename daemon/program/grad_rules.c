/* The gradient rule of every op, written with the forward kernels. A rule
 * gets the node's inputs, outputs and output gradients and produces one
 * gradient per input that wants one, already reduced to that input's shape
 * (broadcasting is undone with a sum). Temporaries live in a small context
 * and are freed together; the first error sticks and makes later steps
 * no-ops, so a rule reads as straight-line math. */
#include <string.h>

#include "program_int.h"

#define MAX_TMP 40

typedef struct gctx {
  dist_errbuf *eb;
  int rc;
  int ntmp;
  distd_tval *tmp[MAX_TMP];
} gctx;

static distd_tval *track(gctx *c, int rc, distd_tval *v) {
  if (rc) {
    c->rc = rc;
    return NULL;
  }
  if (c->ntmp == MAX_TMP) {
    distd_tval_unref(v);
    c->rc = dist_fail(c->eb, DIST_EINTERNAL, "gradient rule too long");
    return NULL;
  }
  return c->tmp[c->ntmp++] = v;
}

static distd_tval *g_bin(gctx *c, distd_op op, distd_tval *a, distd_tval *b) {
  distd_tval *o = NULL;
  if (c->rc || !a || !b) return NULL;
  int rc = distd_k_binary(op, a, b, &o, c->eb);
  return track(c, rc, o);
}
#define ADD(a, b) g_bin(c, DIST__V1__OP_KIND__OP_ADD, a, b)
#define SUB(a, b) g_bin(c, DIST__V1__OP_KIND__OP_SUB, a, b)
#define MUL(a, b) g_bin(c, DIST__V1__OP_KIND__OP_MUL, a, b)
#define DIV(a, b) g_bin(c, DIST__V1__OP_KIND__OP_DIV, a, b)

static distd_tval *g_scalar(gctx *c, dist_dtype dt, double v) {
  distd_tval *o = NULL;
  if (c->rc) return NULL;
  int rc = distd_tval_scalar(dt, v, &o, c->eb);
  return track(c, rc, o);
}

static distd_tval *g_unary(gctx *c, distd_op op, distd_tval *x) {
  distd_tval *o = NULL;
  if (c->rc || !x) return NULL;
  int rc = distd_k_unary(op, 0, x, &o, c->eb);
  return track(c, rc, o);
}

static distd_tval *g_cast(gctx *c, distd_tval *x, dist_dtype dt) {
  distd_tval *o = NULL;
  if (c->rc || !x) return NULL;
  int rc = distd_tval_cast(x, dt, &o, c->eb);
  return track(c, rc, o);
}

static distd_tval *g_sum_to(gctx *c, distd_tval *x, const dist_shape *s) {
  distd_tval *o = NULL;
  if (c->rc || !x) return NULL;
  int rc = distd_k_sum_to(x, s, &o, c->eb);
  return track(c, rc, o);
}

static distd_tval *g_expand(gctx *c, distd_tval *x, const dist_shape *s) {
  distd_tval *o = NULL;
  if (c->rc || !x) return NULL;
  int rc = distd_k_expand(x, s, &o, c->eb);
  return track(c, rc, o);
}

static distd_tval *g_view(gctx *c, distd_tval *x, const dist_shape *s) {
  distd_tval *o = NULL;
  if (c->rc || !x) return NULL;
  int rc = distd_tval_view(x, s, &o, c->eb);
  return track(c, rc, o);
}

static distd_tval *g_where(gctx *c, distd_tval *k, distd_tval *a,
                           distd_tval *b) {
  distd_tval *o = NULL;
  if (c->rc || !k || !a || !b) return NULL;
  int rc = distd_k_where(k, a, b, &o, c->eb);
  return track(c, rc, o);
}

static distd_tval *g_sum(gctx *c, distd_tval *x, const int64_t *axes,
                         size_t n) {
  distd_tval *o = NULL;
  if (c->rc || !x) return NULL;
  int rc = distd_k_reduce(DIST__V1__OP_KIND__OP_SUM, x, axes, n, 1, &o,
                                 c->eb);
  return track(c, rc, o);
}

static distd_tval *g_matmul(gctx *c, distd_tval *a, distd_tval *b, int ta,
                            int tb) {
  distd_tval *o = NULL;
  if (c->rc || !a || !b) return NULL;
  int rc = distd_k_matmul(a, b, ta, tb, &o, c->eb);
  return track(c, rc, o);
}

static distd_tval *g_set_slice(gctx *c, distd_tval *x, const distd_slice *s,
                               distd_tval *v) {
  distd_tval *o = NULL;
  if (c->rc || !x || !v) return NULL;
  int rc = distd_k_set_slice(x, s, v, &o, c->eb);
  return track(c, rc, o);
}

static distd_tval *g_slice(gctx *c, distd_tval *x, const distd_slice *s) {
  distd_tval *o = NULL;
  if (c->rc || !x) return NULL;
  int rc = distd_k_slice(x, s, &o, c->eb);
  return track(c, rc, o);
}

static void give(gctx *c, distd_tval **gin, int k, distd_tval *v) {
  if (!c->rc && v) gin[k] = distd_tval_ref(v);
}

/* ------------------------------------------------------------ rules */

static void grad_binary(gctx *c, distd_op op, distd_tval *a, distd_tval *b,
                        distd_tval *y, distd_tval *g, const uint8_t *need,
                        distd_tval **gin) {
  distd_tval *ga = NULL, *gb = NULL;
  dist_dtype dt = a->dtype;
  switch (op) {
  case DIST__V1__OP_KIND__OP_ADD: ga = gb = g; break;
  case DIST__V1__OP_KIND__OP_SUB:
    ga = g;
    if (need[1]) gb = g_unary(c, DIST__V1__OP_KIND__OP_NEG, g);
    break;
  case DIST__V1__OP_KIND__OP_MUL:
    if (need[0]) ga = MUL(g, b);
    if (need[1]) gb = MUL(g, a);
    break;
  case DIST__V1__OP_KIND__OP_DIV:
    if (need[0]) ga = DIV(g, b);
    if (need[1])
      gb = g_unary(c, DIST__V1__OP_KIND__OP_NEG, DIV(MUL(g, y), b));
    break;
  case DIST__V1__OP_KIND__OP_POW:
    /* d/da = b a^(b-1), 0 where b = 0 (a^0 is constant; at a = 0 the
     * formula is 0 * inf); d/db = y log(a), taken as 0 where a <= 0. */
    if (need[0]) {
      distd_tval *zero = g_scalar(c, dt, 0);
      distd_tval *d = MUL(b, g_bin(c, DIST__V1__OP_KIND__OP_POW, a,
                                   SUB(b, g_scalar(c, dt, 1))));
      ga = MUL(g, g_where(c, g_bin(c, DIST__V1__OP_KIND__OP_EQ, b, zero), zero, d));
    }
    if (need[1]) {
      distd_tval *pos = g_bin(c, DIST__V1__OP_KIND__OP_GT, a, g_scalar(c, dt, 0));
      distd_tval *la = g_unary(c, DIST__V1__OP_KIND__OP_LOG,
                               g_where(c, pos, a, g_scalar(c, dt, 1)));
      gb = MUL(g, MUL(y, la));
    }
    break;
  default: { /* maximum / minimum: ties split the gradient evenly */
    distd_op win = op == DIST__V1__OP_KIND__OP_MAXIMUM
                       ? DIST__V1__OP_KIND__OP_GT : DIST__V1__OP_KIND__OP_LT;
    distd_tval *wa = ADD(g_cast(c, g_bin(c, win, a, b), dt),
                         MUL(g_scalar(c, dt, 0.5),
                             g_cast(c, g_bin(c, DIST__V1__OP_KIND__OP_EQ, a, b),
                                    dt)));
    if (need[0]) ga = MUL(g, wa);
    if (need[1]) gb = MUL(g, SUB(g_scalar(c, dt, 1), wa));
    break;
  }
  }
  if (need[0]) give(c, gin, 0, g_sum_to(c, ga, &a->shape));
  if (need[1]) give(c, gin, 1, g_sum_to(c, gb, &b->shape));
}

static void grad_reduce(gctx *c, const Dist__V1__ProgramNode *n,
                        distd_tval *x, distd_tval *y, distd_tval *g,
                        distd_tval **gin) {
  dist_shape ks;
  int64_t ax[1];
  const int64_t *axes = n->axes;
  size_t naxes = n->n_axes;
  distd_op op = n->op;
  int softmaxish = op >= DIST__V1__OP_KIND__OP_LOGSUMEXP;
  if (softmaxish) {
    int a;
    if ((c->rc = distd_norm_axis(n->axis, x->shape.ndim, &a, c->eb))) return;
    ax[0] = a;
    axes = ax;
    naxes = 1;
  }
  if ((c->rc = distd_shape_reduce(&x->shape, axes, naxes, 1, &ks, NULL, c->eb)))
    return;
  dist_dtype dt = x->dtype;
  distd_tval *gx = NULL;
  switch (op) {
  case DIST__V1__OP_KIND__OP_SUM:
    gx = g_expand(c, g_view(c, g, &ks), &x->shape);
    break;
  case DIST__V1__OP_KIND__OP_MEAN: {
    /* The count in x's dtype would be inf in float16 past 65504 (g / inf
     * = 0): divide in the compute dtype; accumulate casts back. */
    double cnt = (double)x->numel / (double)(y->numel ? y->numel : 1);
    dist_dtype ct = distd_compute_dtype(dt);
    gx = g_expand(c, DIV(g_cast(c, g_view(c, g, &ks), ct), g_scalar(c, ct, cnt)),
                  &x->shape);
    break;
  }
  case DIST__V1__OP_KIND__OP_MAX:
  case DIST__V1__OP_KIND__OP_MIN: { /* shared evenly between the extremes */
    distd_tval *hit = g_cast(c, g_bin(c, DIST__V1__OP_KIND__OP_EQ, x,
                                      g_view(c, y, &ks)), dt);
    gx = MUL(hit, DIV(g_view(c, g, &ks), g_sum(c, hit, axes, naxes)));
    break;
  }
  case DIST__V1__OP_KIND__OP_LOGSUMEXP:
    gx = MUL(g_view(c, g, &ks),
             g_unary(c, DIST__V1__OP_KIND__OP_EXP, SUB(x, g_view(c, y, &ks))));
    break;
  case DIST__V1__OP_KIND__OP_SOFTMAX:
    gx = MUL(y, SUB(g, g_sum(c, MUL(g, y), axes, naxes)));
    break;
  default: /* log_softmax */
    gx = SUB(g, MUL(g_unary(c, DIST__V1__OP_KIND__OP_EXP, y),
                    g_sum(c, g, axes, naxes)));
    break;
  }
  give(c, gin, 0, gx);
}

/* Promotes 1-d operands as the forward kernel does. */
static void grad_matmul(gctx *c, const Dist__V1__ProgramNode *n,
                        distd_tval *a, distd_tval *b, distd_tval *g,
                        const uint8_t *need, distd_tval **gin) {
  int ta = n->trans_a && a->shape.ndim > 1, tb = n->trans_b && b->shape.ndim > 1;
  dist_shape sa = a->shape, sb = b->shape, so;
  if (sa.ndim == 1) sa = (dist_shape){2, {1, a->shape.dims[0]}};
  if (sb.ndim == 1) sb = (dist_shape){2, {b->shape.dims[0], 1}};
  if ((c->rc = distd_shape_matmul(&sa, &sb, ta, tb, &so, c->eb))) return;
  distd_tval *a2 = g_view(c, a, &sa), *b2 = g_view(c, b, &sb);
  distd_tval *g2 = g_view(c, g, &so);
  if (need[0]) {
    distd_tval *da = ta ? g_matmul(c, b2, g2, tb, 1) : g_matmul(c, g2, b2, 0, !tb);
    give(c, gin, 0, g_view(c, g_sum_to(c, da, &sa), &a->shape));
  }
  if (need[1]) {
    distd_tval *db = tb ? g_matmul(c, g2, a2, 1, ta) : g_matmul(c, a2, g2, !ta, 0);
    give(c, gin, 1, g_view(c, g_sum_to(c, db, &sb), &b->shape));
  }
}

static int node_slice(gctx *c, const Dist__V1__ProgramNode *n, distd_tval *x,
                      distd_slice *s) {
  return c->rc = distd_slice_resolve(&x->shape, n->axes, n->n_axes, n->starts,
                                     n->n_starts, n->ends, n->n_ends, n->steps,
                                     n->n_steps, s, c->eb);
}

static void grad_shape(gctx *c, const Dist__V1__ProgramNode *n,
                       distd_tval *const *in, int n_in, distd_tval *const *out,
                       distd_tval *g, const uint8_t *need, distd_tval **gin) {
  distd_tval *x = in[0];
  distd_slice s;
  int a, perm[DIST_MAX_DIMS], inv[DIST_MAX_DIMS];
  dist_shape ts;
  switch (n->op) {
  case DIST__V1__OP_KIND__OP_RESHAPE:
    give(c, gin, 0, g_view(c, g, &x->shape));
    break;
  case DIST__V1__OP_KIND__OP_TRANSPOSE: {
    if ((c->rc = distd_shape_transpose(&x->shape, n->perm, n->n_perm, perm,
                                       &ts, c->eb)))
      return;
    for (int d = 0; d < x->shape.ndim; d++) inv[perm[d]] = d;
    distd_tval *o = NULL;
    int rc = distd_k_transpose(g, inv, &o, c->eb);
    give(c, gin, 0, track(c, rc, o));
    break;
  }
  case DIST__V1__OP_KIND__OP_SLICE: {
    distd_tval *z = NULL;
    if (node_slice(c, n, x, &s)) return;
    int rc = distd_k_full(g->dtype, &x->shape, 0, &z, c->eb);
    give(c, gin, 0, g_set_slice(c, track(c, rc, z), &s, g));
    break;
  }
  case DIST__V1__OP_KIND__OP_SET_SLICE:
    if (node_slice(c, n, x, &s)) return;
    if (need[0]) give(c, gin, 0, g_set_slice(c, g, &s, g_scalar(c, g->dtype, 0)));
    if (need[1]) give(c, gin, 1, g_sum_to(c, g_slice(c, g, &s), &in[1]->shape));
    break;
  case DIST__V1__OP_KIND__OP_CONCAT: {
    if ((c->rc = distd_norm_axis(n->axis, x->shape.ndim, &a, c->eb))) return;
    int64_t at = 0;
    for (int k = 0; k < n_in; k++) {
      distd_slice_resolve(&g->shape, NULL, 0, NULL, 0, NULL, 0, NULL, 0, &s,
                          NULL);
      s.start[a] = at;
      s.count[a] = in[k]->shape.dims[a];
      at += s.count[a];
      if (need[k]) give(c, gin, k, g_slice(c, g, &s));
    }
    break;
  }
  case DIST__V1__OP_KIND__OP_CAST:
    if (dist_dtype_is_float(x->dtype)) give(c, gin, 0, g_cast(c, g, x->dtype));
    break;
  case DIST__V1__OP_KIND__OP_TOPK: {
    distd_tval *o = NULL;
    if ((c->rc = distd_norm_axis(n->axis, x->shape.ndim, &a, c->eb))) return;
    int rc = distd_k_topk_grad(&x->shape, out[1], g, a, &o, c->eb);
    give(c, gin, 0, track(c, rc, o));
    break;
  }
  default: break;
  }
}

int distd_backward_node(const Dist__V1__ProgramNode *n, distd_tval *const *in,
                        int n_in, const uint8_t *need, distd_tval *const *out,
                        distd_tval *const *gout, distd_tval **gin,
                        dist_errbuf *eb) {
  gctx c = {eb, 0, 0, {0}};
  distd_tval *g = gout[0];
  distd_op op = n->op;
  for (int k = 0; k < n_in; k++) gin[k] = NULL;
  if (!g || !distd_op_differentiable(op)) return 0;
  if (op >= DIST__V1__OP_KIND__OP_ADD && op <= DIST__V1__OP_KIND__OP_MINIMUM) {
    grad_binary(&c, op, in[0], in[1], out[0], g, need, gin);
  } else if (op == DIST__V1__OP_KIND__OP_WHERE) {
    distd_tval *z = g_scalar(&c, g->dtype, 0);
    if (need[1]) give(&c, gin, 1, g_sum_to(&c, g_where(&c, in[0], g, z), &in[1]->shape));
    if (need[2]) give(&c, gin, 2, g_sum_to(&c, g_where(&c, in[0], z, g), &in[2]->shape));
  } else if (op >= DIST__V1__OP_KIND__OP_EXP && op <= DIST__V1__OP_KIND__OP_TANH) {
    distd_tval *o = NULL;
    int rc = distd_k_unary_grad(op, n->approximate, in[0], out[0], g, &o, eb);
    give(&c, gin, 0, track(&c, rc, o));
  } else if (op >= DIST__V1__OP_KIND__OP_SUM &&
             op <= DIST__V1__OP_KIND__OP_LOG_SOFTMAX) {
    grad_reduce(&c, n, in[0], out[0], g, gin);
  } else if (op == DIST__V1__OP_KIND__OP_CROSS_ENTROPY) {
    distd_ce_opts o = {n->use_ignore_index, n->ignore_index, n->reduction};
    distd_tval *r = NULL;
    int rc = distd_k_cross_entropy_grad(in[0], in[1], n_in > 2 ? in[2] : NULL,
                                        &o, g, &r, eb);
    give(&c, gin, 0, track(&c, rc, r));
  } else if (op == DIST__V1__OP_KIND__OP_MATMUL) {
    grad_matmul(&c, n, in[0], in[1], g, need, gin);
  } else {
    grad_shape(&c, n, in, n_in, out, g, need, gin);
  }
  for (int k = 0; k < c.ntmp; k++) distd_tval_unref(c.tmp[k]);
  if (c.rc)
    for (int k = 0; k < n_in; k++) {
      distd_tval_unref(gin[k]);
      gin[k] = NULL;
    }
  return c.rc;
}
