/* The built-in layers: Linear, Embedding, LayerNorm, RMSNorm, Sequence and
 * program layers; their deterministic initialization; and the forward
 * programs of the built-ins, built for the layouts of the call.
 *
 * Linear per mesh dim (W the weight, x the input):
 *   W Replicate, x Replicate      -> y Replicate
 *   W Replicate, x Shard(d<last)  -> y Shard(d)       (data parallel)
 *   W Shard(1),  x Replicate      -> y Shard(last)    (column parallel)
 *   W Shard(0),  x Replicate      -> y Partial(sum)   (row parallel: x sliced)
 *   W Shard(0),  x Shard(last)    -> y Partial(sum)
 * Slicing x, or a replicated bias to a column slice, is a matmul by a 0/1
 * selection matrix given per rank (any split, even uneven, and its gradient
 * scatters back). A bias under a Partial output is added where every
 * Partial mesh dim has coordinate 0, so the sum counts it once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer_internal.h"

/* ---------------------------------------------------------------- init */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void fill_stream(uint64_t *state, float *out, size_t n, double bound) {
  for (size_t i = 0; i < n; i++) {
    double u = (double)(splitmix64(state) >> 11) * 0x1.0p-53;
    out[i] = (float)(bound * (2.0 * u - 1.0));
  }
}

void dist_layer_fill_uniform(uint64_t seed, float *out, size_t n, double bound) {
  if (!out && n) {
    dist_null_handle(__func__, "out");
    return;
  }
  fill_stream(&seed, out, n, bound);
}

static void fill_ones(layer_param *p) {
  for (int64_t i = 0; i < dist_shape_numel(&p->shape); i++) p->init[i] = 1.0f;
}

/* ---------------------------------------------------------------- constructors */

/* A weight of rows x cols elements, positive and within the shape bound:
 * their product, taken unchecked, wrapped ([2^32, 2^32] became 0) and the
 * constructor filled a buffer of another size. */
static int weight_refused(const char *func, int64_t rows, int64_t cols) {
  dist_shape s;
  if (rows > 0 && cols > 0 && dist_shape_make(2, (int64_t[]){rows, cols}, &s, NULL) == 0)
    return 0;
  return dist_thread_fail(DIST_EINVAL, "%s: sizes %lld and %lld (each 1 or more, at most "
                          "2^48 elements)", func, (long long)rows, (long long)cols);
}

/* The constructors take no client: why one failed is the thread's
 * dist_errmsg(NULL). */
static int no_memory(const char *func) {
  return dist_thread_fail(DIST_ENOMEM, "%s: out of memory", func);
}

int dist_layer_linear(int64_t in, int64_t out, int bias, uint64_t seed,
                      dist_layer **l) {
  if (!l) return dist_null_handle(__func__, "l");
  *l = NULL;
  if (weight_refused(__func__, in, out)) return DIST_EINVAL;
  dist_layer *x = dist_layer_alloc(LAYER_LINEAR, "linear");
  int64_t ws[2] = {in, out}, bs[1] = {out};
  layer_param *w = x ? dist_layer_new_param(x, "weight", 0, 2, ws, NULL) : NULL;
  layer_param *b = w && bias ? dist_layer_new_param(x, "bias", 0, 1, bs, NULL) : NULL;
  if (!w || (bias && !b)) {
    dist_layer_free(x);
    return no_memory(__func__);
  }
  x->in = in, x->out = out, x->bias = bias != 0;
  w = &x->params[0]; /* adding the bias may have moved the array */
  b = bias ? &x->params[1] : NULL;
  double bound = 1.0 / sqrt((double)in);
  fill_stream(&seed, w->init, (size_t)(in * out), bound);
  if (b) fill_stream(&seed, b->init, (size_t)out, bound);
  *l = x;
  return 0;
}

int dist_layer_embedding(int64_t num, int64_t dim, uint64_t seed,
                         dist_layer **l) {
  if (!l) return dist_null_handle(__func__, "l");
  *l = NULL;
  if (weight_refused(__func__, num, dim)) return DIST_EINVAL;
  dist_layer *x = dist_layer_alloc(LAYER_EMBEDDING, "embedding");
  int64_t ws[2] = {num, dim};
  layer_param *w = x ? dist_layer_new_param(x, "weight", 0, 2, ws, NULL) : NULL;
  if (!w) {
    dist_layer_free(x);
    return no_memory(__func__);
  }
  x->in = num, x->out = dim;
  fill_stream(&seed, w->init, (size_t)(num * dim), 1.0);
  *l = x;
  return 0;
}

static int norm_layer(const char *func, layer_kind kind, int64_t dim, double eps,
                      dist_layer **l) {
  if (!l) return dist_null_handle(func, "l");
  *l = NULL;
  if (weight_refused(func, 1, dim)) return DIST_EINVAL;
  if (!(eps >= 0)) return dist_thread_fail(DIST_EINVAL, "%s: eps %g is negative", func, eps);
  dist_layer *x = dist_layer_alloc(kind, kind == LAYER_LAYER_NORM ? "layer_norm"
                                                                   : "rms_norm");
  int64_t s[1] = {dim};
  layer_param *w = x ? dist_layer_new_param(x, "weight", 0, 1, s, NULL) : NULL;
  layer_param *b = w && kind == LAYER_LAYER_NORM
                       ? dist_layer_new_param(x, "bias", 0, 1, s, NULL)
                       : NULL;
  if (!w || (kind == LAYER_LAYER_NORM && !b)) {
    dist_layer_free(x);
    return no_memory(func);
  }
  fill_ones(&x->params[0]); /* adding the bias may have moved the array */
  x->in = x->out = dim;
  x->bias = b != NULL;
  x->eps = eps;
  *l = x;
  return 0;
}

int dist_layer_layer_norm(int64_t dim, double eps, dist_layer **l) {
  return norm_layer(__func__, LAYER_LAYER_NORM, dim, eps, l);
}

int dist_layer_rms_norm(int64_t dim, double eps, dist_layer **l) {
  return norm_layer(__func__, LAYER_RMS_NORM, dim, eps, l);
}

int dist_layer_sequence(dist_layer **l) {
  if (!l) return dist_null_handle(__func__, "l");
  *l = dist_layer_alloc(LAYER_SEQUENCE, "sequence");
  return *l ? 0 : no_memory(__func__);
}

int dist_layer_program(dist_program *p, int n_inputs, dist_layer **l) {
  if (!l) return dist_null_handle(__func__, "l");
  *l = NULL;
  if (!p) return dist_null_handle(__func__, "p");
  if (n_inputs < 0)
    return dist_thread_fail(DIST_EINVAL, "%s: %d inputs", __func__, n_inputs);
  if (!(*l = dist_layer_alloc(LAYER_PROGRAM, "program"))) return no_memory(__func__);
  (*l)->program = p;
  (*l)->n_inputs = n_inputs;
  return 0;
}

/* ---------------------------------------------------------------- shard-time checks */

static const dist_placement *placements_of(const layer_param *p, int m) {
  static const dist_placement replicate = {DIST_REPLICATE, 0, DIST_REDUCE_SUM};
  return p && p->nplacements ? &p->placements[m] : &replicate;
}

static int is_shard(const dist_placement *q, int dim) {
  return q->kind == DIST_SHARD && q->dim == dim;
}

static int mesh_same(const dist_mesh *a, const dist_mesh *b) {
  return dist_mesh_equal(&a->d, &b->d);
}

/* A Linear's bias can be Shard(0) only where the weight is Shard(1): the
 * output is then split the same way. */
static int check_linear(const dist_layer *l, const char *path,
                        const dist_mesh *mesh, dist_errbuf *eb) {
  const layer_param *w = dist_layer_own_param(l, "weight");
  const layer_param *b = dist_layer_own_param(l, "bias");
  const char *sep = path[0] ? "." : "";
  int by_dim[2] = {0, 0};
  for (int m = 0; m < mesh->d.ndim; m++) {
    const dist_placement *wp = placements_of(w, m), *bp = placements_of(b, m);
    if (wp->kind == DIST_SHARD && ++by_dim[wp->dim] > 1)
      return dist_fail(eb, DIST_ENOTSUP, "%s%sweight: Shard(%d) on more than "
                       "one mesh dim is not supported by %s", path, sep, wp->dim,
                       dist_layer_kind_name(l->kind));
    if (b && bp->kind == DIST_SHARD && !is_shard(wp, 1))
      return dist_fail(eb, DIST_EINVAL, "%s%sbias is Shard(0) on mesh dim %d, "
                       "which needs %s%sweight Shard(1) there", path, sep, m,
                       path, sep);
  }
  return 0;
}

int dist_layer_check_builtin(const dist_layer *l, const char *path,
                             const dist_mesh *mesh, dist_errbuf *eb) {
  if (l->kind == LAYER_LINEAR || l->kind == LAYER_EMBEDDING)
    return check_linear(l, path, mesh, eb);
  if (l->kind != LAYER_LAYER_NORM && l->kind != LAYER_RMS_NORM) return 0;
  for (int i = 0; i < l->n_params; i++)
    for (int m = 0; m < mesh->d.ndim; m++)
      if (placements_of(&l->params[i], m)->kind != DIST_REPLICATE)
        return dist_fail(eb, DIST_ENOTSUP, "%s%s%s: %s parameters stay "
                         "Replicate (mesh dim %d)", path, path[0] ? "." : "",
                         l->params[i].name, dist_layer_kind_name(l->kind), m);
  return 0;
}

/* ---------------------------------------------------------------- layouts */

/* Placements of the program's output and of the inputs' gradients. */
typedef struct plan {
  int out_ndim;
  int sel_x, sel_b, mask_b; /* which per-rank values the program takes */
  dist_placement out[DIST_MAX_MESH_DIMS];
  dist_placement gx[DIST_MAX_MESH_DIMS], gw[DIST_MAX_MESH_DIMS],
      gb[DIST_MAX_MESH_DIMS];
} plan;

static int input_partial(fwd_ctx *x, const char *path, int m) {
  return dist_layer_ctx_fail(x, DIST_EINVAL, "%s: the input is Partial on mesh "
                             "dim %d: reshard it first", path, m);
}

/* One mesh dim of a Linear (Embedding: x is the one-hot, never sharded on
 * its last dim). */
static int linear_dim(fwd_ctx *x, const char *path, int m, int xlast,
                      const dist_placement *xp, const dist_placement *wp,
                      plan *pl) {
  const dist_placement R = DIST_REPLICATED, S = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  if (xp->kind == DIST_PARTIAL) return input_partial(x, path, m);
  int x_last = xp->kind == DIST_SHARD && xp->dim == xlast;
  int x_batch = xp->kind == DIST_SHARD && !x_last;
  pl->gx[m] = *xp;
  pl->gw[m] = *wp;
  pl->out[m] = R;
  if (x_batch) {
    if (wp->kind != DIST_REPLICATE)
      return dist_layer_ctx_fail(x, DIST_ENOTSUP, "%s: the input is Shard(%d) "
                                 "and the weight Shard(%d) on mesh dim %d: "
                                 "reshard the input", path, xp->dim, wp->dim, m);
    pl->out[m] = *xp;
    pl->gw[m] = S;
  } else if (x_last && !is_shard(wp, 0)) {
    return dist_layer_ctx_fail(x, DIST_ENOTSUP, "%s: the input is Shard(%d) (its "
                               "last dim) on mesh dim %d, which needs the weight "
                               "Shard(0) there", path, xp->dim, m);
  } else if (is_shard(wp, 1)) {
    pl->out[m] = DIST_SHARD_DIM(pl->out_ndim - 1);
    pl->gx[m] = S;
  } else if (is_shard(wp, 0)) {
    pl->out[m] = S;
    if (!x_last) pl->gx[m] = S;
  }
  return 0;
}

/* The bias gradient: Partial wherever the bias is not used whole and as is
 * by every rank of the mesh dim. */
static void bias_grad(int m, const dist_placement *xp, const dist_placement *wp,
                      const dist_placement *bp, plan *pl) {
  const dist_placement S = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  int x_batch = xp->kind == DIST_SHARD && pl->out[m].kind == DIST_SHARD &&
                !is_shard(wp, 1);
  pl->gb[m] = *bp;
  if (x_batch || is_shard(wp, 0) || (is_shard(wp, 1) && bp->kind == DIST_REPLICATE))
    pl->gb[m] = S;
}

/* ---------------------------------------------------------------- per-rank values */

/* The box (offset, extent) of tensor dim d that the rank at mesh index idx
 * holds under placements p. */
static void box_of(const dist_mesh *mesh, const dist_placement *p,
                   const dist_shape *global, int idx, int d, int64_t *off,
                   int64_t *len) {
  int coords[DIST_MAX_MESH_DIMS];
  dist_shape local;
  int64_t offset[DIST_MAX_DIMS];
  dist_mesh_coords(&mesh->d, idx, coords);
  dist_local_box(&mesh->d, p, global, coords, &local, offset);
  *off = offset[d];
  *len = local.dims[d];
}

/* In *out, a [have_len, want_len] 0/1 matrix taking columns want_off.. of
 * rank's piece `what` that starts at have_off; 0, or the call failed
 * (DIST_EINVAL when the piece does not cover them, DIST_ENOMEM). */
static int selection(fwd_ctx *x, const char *path, int rank, const char *what, int64_t have_off,
                     int64_t have_len, int64_t want_off, int64_t want_len, float **out) {
  if (want_off < have_off || want_off + want_len > have_off + have_len)
    return dist_layer_ctx_fail(x, DIST_EINVAL, "%s: rank %d's %s", path, rank, what);
  float *s = calloc((size_t)(have_len * want_len) + 1, sizeof *s);
  if (!s)
    return dist_layer_ctx_fail(x, DIST_ENOMEM, "%s: out of memory for rank %d's selection",
                               path, rank);
  for (int64_t j = 0; j < want_len; j++) s[(want_off - have_off + j) * want_len + j] = 1.0f;
  *out = s;
  return 0;
}

typedef struct rank_values {
  int n;           /* ranks given values: the mesh, or this trainer's */
  float **sx, **sb;
  float *mask;
  dist_value *vx, *vb, *vm;
} rank_values;

static void values_free(rank_values *v) {
  for (int i = 0; i < v->n; i++) {
    if (v->sx) free(v->sx[i]);
    if (v->sb) free(v->sb[i]);
  }
  free(v->sx);
  free(v->sb);
  free(v->mask);
  free(v->vx);
  free(v->vb);
  free(v->vm);
}

static dist_value matrix_value(const float *data, int64_t rows, int64_t cols) {
  dist_value v = {data, DIST_FLOAT32, 2, {rows, cols}};
  return v;
}

/* Whether any rank of the mesh needs its input sliced (the boxes differ). */
static int needs_slice(const dist_mesh *mesh, const dist_placement *have_p,
                       const dist_shape *have_g, int have_d,
                       const dist_placement *want_p, const dist_shape *want_g,
                       int want_d) {
  for (int i = 0; i < mesh->d.nranks; i++) {
    int64_t ho, hl, wo, wl;
    box_of(mesh, have_p, have_g, i, have_d, &ho, &hl);
    box_of(mesh, want_p, want_g, i, want_d, &wo, &wl);
    if (ho != wo || hl != wl) return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- Linear / Embedding */

typedef struct linear_call {
  dist_layer *l;
  const char *path;
  const dist_tensor *x;      /* the input (ids for Embedding) */
  layer_param *w, *b;
  dist_shape xg;             /* x's (one-hot's) global shape */
  dist_placement xp[DIST_MAX_MESH_DIMS]; /* and placements */
  plan pl;
} linear_call;

static int linear_plan(fwd_ctx *x, linear_call *lc) {
  const dist_mesh *mesh = dist_layer_ctx_mesh(x);
  int emb = lc->l->kind == LAYER_EMBEDDING, nd = lc->x->shape.ndim;
  if (emb ? lc->x->dtype != DIST_INT64 : lc->x->dtype != DIST_FLOAT32)
    return dist_layer_ctx_fail(x, DIST_EMISMATCH, "%s: the input is %s, %s takes "
                               "%s", lc->path, dist_dtype_name(lc->x->dtype),
                               dist_layer_kind_name(lc->l->kind),
                               emb ? "int64 ids" : "float32");
  if (!emb && (nd < 1 || lc->x->shape.dims[nd - 1] != lc->l->in))
    return dist_layer_ctx_fail(x, DIST_EMISMATCH, "%s: the input's last dim is "
                               "%lld, Linear(%lld, %lld) needs %lld", lc->path,
                               nd ? (long long)lc->x->shape.dims[nd - 1] : 0LL,
                               (long long)lc->l->in, (long long)lc->l->out,
                               (long long)lc->l->in);
  if (!mesh_same(mesh, &lc->x->mesh))
    return dist_layer_ctx_fail(x, DIST_EINVAL, "%s: the input lives on another "
                               "mesh than the layer", lc->path);
  lc->xg = lc->x->shape;
  if (emb) lc->xg.dims[lc->xg.ndim++] = lc->l->in; /* the one-hot */
  memcpy(lc->xp, lc->x->placements, sizeof lc->xp);
  lc->pl.out_ndim = lc->xg.ndim;
  for (int m = 0; m < mesh->d.ndim; m++) {
    const dist_placement *wp = placements_of(lc->w, m), *bp = placements_of(lc->b, m);
    int rc = linear_dim(x, lc->path, m, lc->xg.ndim - 1, &lc->xp[m], wp, &lc->pl);
    if (rc) return rc;
    bias_grad(m, &lc->xp[m], wp, bp, &lc->pl);
    lc->pl.mask_b |= lc->b && lc->pl.out[m].kind == DIST_PARTIAL;
  }
  lc->pl.sel_x = needs_slice(mesh, lc->xp, &lc->xg, lc->xg.ndim - 1,
                             lc->w->tensor->placements, &lc->w->shape, 0);
  lc->pl.sel_b = lc->b && needs_slice(mesh, lc->b->tensor->placements,
                                      &lc->b->shape, 0,
                                      lc->w->tensor->placements, &lc->w->shape, 1);
  return 0;
}

/* The per-rank selection matrices and bias masks of a Linear call. */
static int linear_values(fwd_ctx *x, linear_call *lc, rank_values *v) {
  dist_client *c = dist_layer_ctx_client(x);
  const dist_mesh *mesh = dist_layer_ctx_mesh(x);
  v->n = c->spmd_rank >= 0 ? 1 : mesh->d.nranks;
  v->sx = calloc((size_t)v->n + 1, sizeof *v->sx);
  v->sb = calloc((size_t)v->n + 1, sizeof *v->sb);
  v->mask = calloc((size_t)v->n + 1, sizeof *v->mask);
  v->vx = calloc((size_t)v->n + 1, sizeof *v->vx);
  v->vb = calloc((size_t)v->n + 1, sizeof *v->vb);
  v->vm = calloc((size_t)v->n + 1, sizeof *v->vm);
  if (!v->sx || !v->sb || !v->mask || !v->vx || !v->vb || !v->vm)
    return dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory");
  const dist_placement *wpl = lc->w->tensor->placements;
  for (int i = 0; i < v->n; i++) {
    int idx = c->spmd_rank >= 0 ? dist_mesh_index_of(&mesh->d, c->spmd_rank) : i;
    int coords[DIST_MAX_MESH_DIMS];
    int64_t ho, hl, wo, wl;
    dist_mesh_coords(&mesh->d, idx, coords);
    v->mask[i] = 1.0f;
    for (int m = 0; m < mesh->d.ndim; m++)
      if (lc->pl.out[m].kind == DIST_PARTIAL && coords[m] != 0) v->mask[i] = 0.0f;
    v->vm[i] = (dist_value){&v->mask[i], DIST_FLOAT32, 0, {0}};
    if (lc->pl.sel_x) {
      box_of(mesh, lc->xp, &lc->xg, idx, lc->xg.ndim - 1, &ho, &hl);
      box_of(mesh, wpl, &lc->w->shape, idx, 0, &wo, &wl);
      int rc = selection(x, lc->path, mesh->d.ranks[idx],
                         "input piece does not cover its weight rows", ho, hl, wo, wl, &v->sx[i]);
      if (rc) return rc;
      v->vx[i] = matrix_value(v->sx[i], hl, wl);
    }
    if (lc->pl.sel_b) {
      box_of(mesh, lc->b->tensor->placements, &lc->b->shape, idx, 0, &ho, &hl);
      box_of(mesh, wpl, &lc->w->shape, idx, 1, &wo, &wl);
      int rc = selection(x, lc->path, mesh->d.ranks[idx],
                         "bias piece does not cover its weight columns", ho, hl, wo, wl, &v->sb[i]);
      if (rc) return rc;
      v->vb[i] = matrix_value(v->sb[i], hl, wl);
    }
  }
  return 0;
}

/* A short code of placements for program keys: "S0.R.P0". */
static void placements_key(char *buf, size_t len, const dist_placement *p, int n) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int m = 0; m < n && pos + 6 < len; m++) {
    const char *sep = m ? "." : "";
    int w = p[m].kind == DIST_SHARD ? snprintf(buf + pos, len - pos, "%sS%d", sep, p[m].dim % 10)
          : p[m].kind == DIST_PARTIAL ? snprintf(buf + pos, len - pos, "%sP%d", sep, (int)p[m].reduce % 10)
                                      : snprintf(buf + pos, len - pos, "%sR", sep);
    pos += (size_t)w;
  }
}

static void linear_key(const linear_call *lc, int nd, char *key, size_t len) {
  char o[48], gx[48], gw[48], gb[48];
  placements_key(o, sizeof o, lc->pl.out, nd);
  placements_key(gx, sizeof gx, lc->pl.gx, nd);
  placements_key(gw, sizeof gw, lc->pl.gw, nd);
  placements_key(gb, sizeof gb, lc->pl.gb, nd);
  snprintf(key, len, "lin nd%d sx%d sb%d m%d b%d o%s gx%s gw%s gb%s",
           lc->pl.out_ndim, lc->pl.sel_x, lc->pl.sel_b, lc->pl.mask_b,
           lc->b != NULL, o, gx, gw, gb);
}

/* y = (x [@ Sx]) @ W + (b [@ Sb]) [* mask], as a program. */
static int linear_build(const linear_call *lc, const dist_mesh *mesh,
                        dist_program *p) {
  int nd = mesh->d.ndim, emb = lc->l->kind == LAYER_EMBEDDING;
  int xin = dist_input_dtensor(p, "x", emb ? DIST_INT64 : DIST_FLOAT32);
  int w = dist_input_dtensor(p, "weight", DIST_FLOAT32);
  int b = lc->b ? dist_input_dtensor(p, "bias", DIST_FLOAT32) : -1;
  int sx = lc->pl.sel_x ? dist_input_value(p, "select_x", DIST_FLOAT32) : -1;
  int sb = lc->pl.sel_b ? dist_input_value(p, "select_bias", DIST_FLOAT32) : -1;
  int mk = lc->pl.mask_b ? dist_input_value(p, "bias_mask", DIST_FLOAT32) : -1;
  if (!emb) dist_input_set_grad_placements(p, xin, lc->pl.gx, nd);
  dist_input_set_grad_placements(p, w, lc->pl.gw, nd);
  if (b >= 0) dist_input_set_grad_placements(p, b, lc->pl.gb, nd);
  int vals[3] = {sx, sb, mk};
  for (int i = 0; i < 3; i++)
    if (vals[i] >= 0) dist_input_set_no_grad(p, vals[i]);
  int h = emb ? dist_op_one_hot(p, xin, lc->l->in, DIST_FLOAT32) : xin;
  if (sx >= 0) h = dist_op_matmul(p, h, sx, 0, 0);
  int y = dist_op_matmul(p, h, w, 0, 0);
  if (b >= 0) {
    int bb = sb >= 0 ? dist_op_matmul(p, b, sb, 0, 0) : b;
    if (mk >= 0) bb = dist_op_mul(p, bb, mk);
    y = dist_op_add(p, y, bb);
  }
  dist_program_output(p, y);
  return dist_program_out_dist_attr(p, mesh, lc->pl.out, NULL);
}

/* ---------------------------------------------------------------- program cache */

static int cached_program(fwd_ctx *x, dist_layer *l, const char *key,
                          int (*build)(const void *, const dist_mesh *,
                                       dist_program *),
                          const void *arg, dist_program **out) {
  for (int i = 0; i < l->n_progs; i++)
    if (strcmp(l->progs[i].key, key) == 0) {
      *out = l->progs[i].p;
      return 0;
    }
  dist_client *c = dist_layer_ctx_client(x);
  layer_prog *lp = realloc(l->progs, sizeof *lp * (size_t)(l->n_progs + 1));
  if (!lp) return dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory");
  l->progs = lp;
  dist_program *p = NULL;
  char name[160];
  snprintf(name, sizeof name, "%s.%s", dist_layer_kind_name(l->kind), l->name);
  if (dist_program_new(name, &p)) return dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory");
  build(arg, dist_layer_ctx_mesh(x), p);
  int rc = dist_program_register(c, p);
  if (rc) {
    dist_program_free(p);
    return rc;
  }
  lp = &l->progs[l->n_progs++];
  snprintf(lp->key, sizeof lp->key, "%s", key);
  lp->p = p;
  *out = p;
  return 0;
}

static int linear_build_cb(const void *arg, const dist_mesh *mesh, dist_program *p) {
  return linear_build(arg, mesh, p);
}

static int linear_forward(fwd_ctx *x, dist_layer *l, const char *path,
                          const dist_tensor *in, dist_tensor ***out, int *n_out) {
  const dist_mesh *mesh = dist_layer_ctx_mesh(x);
  linear_call lc = {.l = l, .path = path, .x = in,
                    .w = dist_layer_own_param(l, "weight"),
                    .b = dist_layer_own_param(l, "bias")};
  rank_values v = {0};
  dist_program *p = NULL;
  char key[LAYER_KEY_LEN];
  int rc = linear_plan(x, &lc);
  if (rc == 0) rc = linear_values(x, &lc, &v);
  if (rc) goto out;
  linear_key(&lc, mesh->d.ndim, key, sizeof key);
  if ((rc = cached_program(x, l, key, linear_build_cb, &lc, &p))) goto out;
  dist_arg args[6];
  entry_input ins[6];
  int n = 0;
  memset(ins, 0, sizeof ins);
  args[n] = (dist_arg){in, NULL};
  ins[n].kind = IN_ACT;
  snprintf(ins[n++].name, sizeof ins->name, "%s", in->name);
  layer_param *params[2] = {lc.w, lc.b};
  for (int i = 0; i < 2; i++) {
    if (!params[i]) continue;
    args[n] = (dist_arg){params[i]->tensor, NULL};
    ins[n].kind = IN_PARAM;
    ins[n++].param = params[i];
  }
  if (lc.pl.sel_x) args[n] = (dist_arg){NULL, v.vx}, ins[n++].kind = IN_OTHER;
  if (lc.pl.sel_b) args[n] = (dist_arg){NULL, v.vb}, ins[n++].kind = IN_OTHER;
  if (lc.pl.mask_b) args[n] = (dist_arg){NULL, v.vm}, ins[n++].kind = IN_OTHER;
  rc = dist_layer_call(x, p, path, args, ins, n, out, n_out);
out:
  values_free(&v);
  return rc;
}

/* ---------------------------------------------------------------- norms */

typedef struct norm_call {
  dist_layer *l;
  plan pl;
} norm_call;

static int norm_build(const void *arg, const dist_mesh *mesh, dist_program *p) {
  const norm_call *nc = arg;
  const dist_layer *l = nc->l;
  int64_t last[1] = {-1};
  int nd = mesh->d.ndim;
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  int w = dist_input_dtensor(p, "weight", DIST_FLOAT32);
  int b = l->bias ? dist_input_dtensor(p, "bias", DIST_FLOAT32) : -1;
  dist_input_set_grad_placements(p, x, nc->pl.gx, nd);
  dist_input_set_grad_placements(p, w, nc->pl.gw, nd);
  if (b >= 0) dist_input_set_grad_placements(p, b, nc->pl.gw, nd);
  int centred = x;
  if (l->kind == LAYER_LAYER_NORM)
    centred = dist_op_sub(p, x, dist_op_mean(p, x, last, 1, 1));
  int ms = dist_op_mean(p, dist_op_mul(p, centred, centred), last, 1, 1);
  int rstd = dist_op_sqrt(p, dist_op_add_scalar(p, ms, l->eps));
  int y = dist_op_mul(p, dist_op_div(p, centred, rstd), w);
  if (b >= 0) y = dist_op_add(p, y, b);
  dist_program_output(p, y);
  return dist_program_out_dist_attr(p, mesh, nc->pl.out, NULL);
}

/* The input may be split on any dim but the normalized last one; the
 * parameters' gradients are then Partial on those mesh dims. */
static int norm_forward(fwd_ctx *x, dist_layer *l, const char *path,
                        const dist_tensor *in, dist_tensor ***out, int *n_out) {
  const dist_mesh *mesh = dist_layer_ctx_mesh(x);
  int nd = in->shape.ndim;
  norm_call nc = {.l = l};
  if (in->dtype != DIST_FLOAT32 || nd < 1 || in->shape.dims[nd - 1] != l->in)
    return dist_layer_ctx_fail(x, DIST_EMISMATCH, "%s: %s(%lld) takes float32 "
                               "[..., %lld]", path, dist_layer_kind_name(l->kind),
                               (long long)l->in, (long long)l->in);
  if (!mesh_same(mesh, &in->mesh))
    return dist_layer_ctx_fail(x, DIST_EINVAL, "%s: the input lives on another "
                               "mesh than the layer", path);
  for (int m = 0; m < mesh->d.ndim; m++) {
    const dist_placement *xp = &in->placements[m];
    if (xp->kind == DIST_PARTIAL) return input_partial(x, path, m);
    if (is_shard(xp, nd - 1))
      return dist_layer_ctx_fail(x, DIST_ENOTSUP, "%s: the input is Shard(%d) on "
                                 "mesh dim %d: %s needs its last dim whole",
                                 path, nd - 1, m, dist_layer_kind_name(l->kind));
    nc.pl.out[m] = nc.pl.gx[m] = *xp;
    nc.pl.gw[m] = xp->kind == DIST_SHARD ? DIST_PARTIAL_OF(DIST_REDUCE_SUM)
                                         : DIST_REPLICATED;
  }
  char key[LAYER_KEY_LEN], g[48];
  placements_key(g, sizeof g, nc.pl.gw, mesh->d.ndim);
  snprintf(key, sizeof key, "norm nd%d gw%s", nd, g);
  placements_key(g, sizeof g, nc.pl.out, mesh->d.ndim);
  snprintf(key + strlen(key), sizeof key - strlen(key), " o%s", g);
  dist_program *p = NULL;
  int rc = cached_program(x, l, key, norm_build, &nc, &p);
  if (rc) return rc;
  dist_arg args[3] = {{in, NULL}};
  entry_input ins[3];
  memset(ins, 0, sizeof ins);
  ins[0].kind = IN_ACT;
  snprintf(ins[0].name, sizeof ins->name, "%s", in->name);
  int n = 1;
  for (int i = 0; i < l->n_params; i++, n++) {
    args[n] = (dist_arg){l->params[i].tensor, NULL};
    ins[n].kind = IN_PARAM;
    ins[n].param = &l->params[i];
  }
  return dist_layer_call(x, p, path, args, ins, n, out, n_out);
}

/* ---------------------------------------------------------------- dispatch */

int dist_layer_forward_builtin(fwd_ctx *x, dist_layer *l, const char *path,
                               dist_tensor *const *in, int n_in,
                               dist_tensor ***out, int *n_out) {
  if (n_in != 1)
    return dist_layer_ctx_fail(x, DIST_EINVAL, "%s: %s takes 1 input, %d given",
                               path, dist_layer_kind_name(l->kind), n_in);
  if (l->kind == LAYER_LINEAR || l->kind == LAYER_EMBEDDING)
    return linear_forward(x, l, path, in[0], out, n_out);
  return norm_forward(x, l, path, in[0], out, n_out);
}
