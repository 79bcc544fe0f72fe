/* Expert shards: the registry of layers and kept invocations, parameter
 * creation, and each expert's FFN forward and backward on its contiguous
 * rows through the LocalLayer engine's kernels (matmul is OpenBLAS GEMM). */
#include "experts.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

enum { W1 = 0, B1 = 1, W2 = 2, B2 = 3, NPARAM = 4 };
static const char *const param_suffix[NPARAM] = {"w1", "b1", "w2", "b2"};

/* What one forward keeps for its backward. */
typedef struct kept {
  uint64_t id;
  distd_tensor *x;          /* the input rows (a stored tensor, referenced) */
  distd_tensor *h;          /* pre-activations [rows, d_hidden], private */
  distd_tensor **w;         /* E * NPARAM weights used (NULL without bias) */
  int64_t *rows;            /* E: rows per local expert */
  struct kept *next;
} kept;

typedef struct layer {
  distd_expert_layer_cfg cfg;
  pthread_mutex_t mu;       /* serializes forward/backward/create on it */
  kept *kept;
  struct layer *next;
} layer;

struct distd_experts {
  pthread_mutex_t mu;       /* the list of layers and nkept */
  layer *head;
  int nkept;
};

distd_experts *distd_experts_new(void) {
  distd_experts *x = calloc(1, sizeof *x);
  if (x) pthread_mutex_init(&x->mu, NULL);
  return x;
}

static layer *find_layer(distd_experts *x, const char *name) {
  pthread_mutex_lock(&x->mu);
  layer *l = x->head;
  while (l && strcmp(l->cfg.name, name) != 0) l = l->next;
  pthread_mutex_unlock(&x->mu);
  return l;
}

static int get_layer(distd_experts *x, const char *name, layer **out,
                     dist_errbuf *eb) {
  if (!name || !(*out = find_layer(x, name)))
    return dist_fail(eb, DIST_ENOTFOUND, "no expert layer '%s' on this daemon",
                     name ? name : "");
  return 0;
}

/* ---------------------------------------------------------------- kept */

static void kept_free(kept *k, int experts) {
  if (!k) return;
  distd_tensor_unref(k->x);
  distd_tensor_unref(k->h);
  for (int i = 0; k->w && i < experts * NPARAM; i++) distd_tensor_unref(k->w[i]);
  free(k->w);
  free(k->rows);
  free(k);
}

/* Unlinks kept id (every one for id 0) from l; l->mu held. */
static int drop_kept(distd_experts *x, layer *l, uint64_t id) {
  int n = 0;
  for (kept **p = &l->kept; *p;) {
    kept *k = *p;
    if (id && k->id != id) {
      p = &k->next;
      continue;
    }
    *p = k->next;
    kept_free(k, l->cfg.experts);
    n++;
  }
  pthread_mutex_lock(&x->mu);
  x->nkept -= n;
  pthread_mutex_unlock(&x->mu);
  return n;
}

void distd_experts_free(distd_experts *x) {
  if (!x) return;
  while (x->head) {
    layer *l = x->head;
    x->head = l->next;
    drop_kept(x, l, 0);
    pthread_mutex_destroy(&l->mu);
    free(l);
  }
  pthread_mutex_destroy(&x->mu);
  free(x);
}

static kept *take_kept(distd_experts *x, layer *l, uint64_t id) {
  for (kept **p = &l->kept; *p; p = &(*p)->next)
    if ((*p)->id == id) {
      kept *k = *p;
      *p = k->next;
      pthread_mutex_lock(&x->mu);
      x->nkept--;
      pthread_mutex_unlock(&x->mu);
      return k;
    }
  return NULL;
}

static int add_kept(distd_experts *x, layer *l, kept *k, dist_errbuf *eb) {
  drop_kept(x, l, k->id);
  pthread_mutex_lock(&x->mu);
  int full = x->nkept >= DISTD_EXPERT_KEPT_MAX;
  if (!full) x->nkept++;
  pthread_mutex_unlock(&x->mu);
  if (full)
    return dist_fail(eb, DIST_ETOOBIG, "%d expert invocations are kept already: "
                     "run their backward or release them", DISTD_EXPERT_KEPT_MAX);
  k->next = l->kept;
  l->kept = k;
  return 0;
}

int distd_experts_release(distd_experts *x, const char *name,
                          uint64_t invocation, int *released,
                          dist_errbuf *eb) {
  layer *l = NULL;
  int rc = get_layer(x, name, &l, eb);
  if (rc != 0) return rc;
  pthread_mutex_lock(&l->mu);
  int n = drop_kept(x, l, invocation);
  pthread_mutex_unlock(&l->mu);
  if (released) *released = n;
  return 0;
}

/* ---------------------------------------------------------------- tensors */

static void param_name(char *buf, size_t len, const distd_expert_layer_cfg *c,
                       int e, int p, int grad) {
  snprintf(buf, len, "%s.expert%d.%s%s", c->name, c->first_expert + e,
           param_suffix[p], grad ? ".grad" : "");
}

static dist_shape param_shape(const distd_expert_layer_cfg *c, int p) {
  dist_shape s = {0, {0}};
  switch (p) {
  case W1: s = (dist_shape){2, {c->d_model, c->d_hidden}}; break;
  case B1: s = (dist_shape){1, {c->d_hidden}}; break;
  case W2: s = (dist_shape){2, {c->d_hidden, c->d_model}}; break;
  default: s = (dist_shape){1, {c->d_model}}; break;
  }
  return s;
}

static int has_param(const distd_expert_layer_cfg *c, int p) {
  return c->bias || p == W1 || p == W2;
}

/* A zeroed tensor local to this daemon (a one-rank mesh, replicated), its
 * memory reserved; not in the store. */
static int new_local(distd_server *s, const char *name, dist_dtype dt,
                     const dist_shape *shape, distd_tensor **out,
                     dist_errbuf *eb) {
  dist_mesh_desc mesh;
  int rc = dist_mesh_of_rank(&mesh, s->rank, eb);
  if (rc != 0) return rc;
  dist_placement p = DIST_REPLICATED;
  return distd_tensor_new(s->store, name, dt, shape, &mesh, &p, s->rank, out, eb);
}

static int exists(distd_server *s, const char *name) {
  distd_tensor *t = NULL;
  if (distd_store_get(s->store, name, &t, NULL) != 0) return 0;
  distd_tensor_unref(t);
  return 1;
}

/* A stored parameter of layer c, checked against the shape it must have:
 * anyone may have replaced it. */
static int get_param(distd_server *s, const distd_expert_layer_cfg *c, int e,
                     int p, int grad, distd_tensor **out, dist_errbuf *eb) {
  char name[DISTD_NAME_MAX];
  param_name(name, sizeof name, c, e, p, grad);
  int rc = distd_store_get(s->store, name, out, eb);
  if (rc != 0) return rc;
  dist_shape want = param_shape(c, p);
  if ((*out)->dtype != c->dtype || !dist_shape_equal(&(*out)->local, &want)) {
    distd_tensor_unref(*out);
    *out = NULL;
    return dist_fail(eb, DIST_EMISMATCH, "tensor '%s' is no longer the %s "
                     "parameter the layer was created with", name,
                     dist_dtype_name(c->dtype));
  }
  return 0;
}

/* ---------------------------------------------------------------- create */

static uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double distd_expert_seed_value(uint64_t seed, int expert, int which,
                               uint64_t idx, int64_t fan_in) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ ((uint64_t)(uint32_t)expert << 8 | (uint64_t)which));
  h = splitmix64(h ^ idx);
  double u = (double)(h >> 11) * 0x1.0p-53; /* [0, 1) */
  double bound = 1.0 / sqrt((double)(fan_in > 0 ? fan_in : 1));
  return (2.0 * u - 1.0) * bound;
}

static int check_cfg(const distd_expert_layer_cfg *c, dist_errbuf *eb) {
  if (!c->name[0])
    return dist_fail(eb, DIST_EINVAL, "an expert layer needs a name");
  if (c->experts < 1 || c->first_expert < 0 || c->d_model < 1 || c->d_hidden < 1)
    return dist_fail(eb, DIST_EINVAL, "expert layer '%s': experts (%d), d_model "
                     "(%lld) and d_hidden (%lld) must be positive, first_expert "
                     "(%d) not negative", c->name, c->experts, (long long)c->d_model,
                     (long long)c->d_hidden, c->first_expert);
  if (c->dtype != DIST_FLOAT32 && c->dtype != DIST_FLOAT64)
    return dist_fail(eb, DIST_ENOTSUP, "expert layer '%s': dtype %s; experts are "
                     "float32 or float64", c->name, dist_dtype_name(c->dtype));
  if (c->act != DISTD_EXPERT_GELU && c->act != DISTD_EXPERT_SILU)
    return dist_fail(eb, DIST_EINVAL, "expert layer '%s': unknown activation %d",
                     c->name, (int)c->act);
  return 0;
}

static void init_part(const distd_expert_init *in, int p, const void **data,
                      size_t *len) {
  const void *d[NPARAM] = {in->w1, in->b1, in->w2, in->b2};
  size_t n[NPARAM] = {in->w1_len, in->b1_len, in->w2_len, in->b2_len};
  *data = d[p];
  *len = n[p];
}

/* Makes expert e's parameter p (from init, or drawn from seed) and its
 * zeroed gradient as entries 2i and 2i + 1 of d->staged; stores neither. */
static int make_param(distd_server *s, distd_expert_draft *d, int e, int p, size_t i,
                      uint64_t seed, const distd_expert_init *init, dist_errbuf *eb) {
  const distd_expert_layer_cfg *c = &d->cfg;
  char name[DISTD_NAME_MAX], gname[DISTD_NAME_MAX];
  param_name(name, sizeof name, c, e, p, 0);
  param_name(gname, sizeof gname, c, e, p, 1);
  dist_shape shape = param_shape(c, p);
  distd_tensor **t = &d->staged.tensors[2 * i], **g = &d->staged.tensors[2 * i + 1];
  int rc = new_local(s, name, c->dtype, &shape, t, eb);
  if (rc == 0) rc = new_local(s, gname, c->dtype, &shape, g, eb);
  if (rc != 0) return rc;
  distd_staged_note_version(s->store, &d->staged, name, NULL);
  distd_staged_note_version(s->store, &d->staged, gname, NULL);
  if (init) {
    const void *data;
    size_t len;
    init_part(&init[e], p, &data, &len);
    if (len != (*t)->nbytes || (len && !data))
      return dist_fail(eb, DIST_EMISMATCH, "initial %s of expert %d has %zu bytes, "
                       "expected %zu", param_suffix[p], c->first_expert + e, len,
                       (*t)->nbytes);
    memcpy((*t)->data, data, len);
    return 0;
  }
  int64_t fan_in = p == W1 || p == B1 ? c->d_model : c->d_hidden;
  for (int64_t k = 0; k < dist_shape_numel(&shape); k++)
    dist_elem_set((*t)->data, c->dtype, (size_t)k,
                  distd_expert_seed_value(seed, c->first_expert + e, p, (uint64_t)k, fan_in));
  return 0;
}

static int check_free_names(distd_server *s, const distd_expert_draft *d,
                            dist_errbuf *eb) {
  for (int i = 0; i < d->nnames; i++)
    if (exists(s, d->names[i]))
      return dist_fail(eb, DIST_EEXIST, "tensor '%s' already exists", d->names[i]);
  return 0;
}

/* Every parameter's name, then every gradient's. */
static int list_names(const distd_expert_layer_cfg *c, distd_expert_draft *d,
                      dist_errbuf *eb) {
  char name[DISTD_NAME_MAX];
  d->names = calloc((size_t)c->experts * NPARAM * 2, sizeof *d->names);
  if (!d->names) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (int grad = 0; grad < 2; grad++)
    for (int e = 0; e < c->experts; e++)
      for (int p = 0; p < NPARAM; p++) {
        if (!has_param(c, p)) continue;
        param_name(name, sizeof name, c, e, p, grad);
        if (!(d->names[d->nnames++] = strdup(name)))
          return dist_fail(eb, DIST_ENOMEM, "out of memory");
      }
  d->nparams = d->nnames / 2; /* one gradient per parameter */
  return 0;
}

static void names_free(char **names, int n) {
  for (int i = 0; names && i < n; i++) free(names[i]);
  free(names);
}

int distd_experts_name(const distd_expert_layer_cfg *cfg, distd_expert_draft *d,
                       dist_errbuf *eb) {
  memset(d, 0, sizeof *d);
  d->cfg = *cfg;
  int rc = check_cfg(cfg, eb);
  return rc == 0 ? list_names(cfg, d, eb) : rc;
}

int distd_experts_draft(distd_experts *x, distd_server *s, uint64_t seed,
                        const distd_expert_init *init, int replace, distd_expert_draft *d,
                        dist_errbuf *eb) {
  const distd_expert_layer_cfg *cfg = &d->cfg;
  int rc = 0;
  if (!replace && find_layer(x, cfg->name))
    rc = dist_fail(eb, DIST_EEXIST, "expert layer '%s' already exists", cfg->name);
  if (rc == 0 && !replace) rc = check_free_names(s, d, eb);
  if (rc == 0 && !(d->fresh = calloc(1, sizeof *d->fresh)))
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory");
  if (rc == 0) rc = distd_staged_init(&d->staged, (size_t)d->nnames, eb);
  size_t i = 0;
  for (int e = 0; rc == 0 && e < cfg->experts; e++)
    for (int p = 0; rc == 0 && p < NPARAM; p++)
      if (has_param(cfg, p)) rc = make_param(s, d, e, p, i++, seed, init, eb);
  return rc;
}

void distd_experts_install(distd_experts *x, distd_server *s, distd_expert_draft *d) {
  pthread_mutex_lock(&x->mu);
  layer *l = x->head;
  while (l && strcmp(l->cfg.name, d->cfg.name) != 0) l = l->next;
  if (!l) { /* new: the entry made with the draft */
    l = d->fresh;
    d->fresh = NULL;
    l->cfg = d->cfg;
    pthread_mutex_init(&l->mu, NULL);
    l->next = x->head;
    x->head = l;
  }
  pthread_mutex_unlock(&x->mu);
  pthread_mutex_lock(&l->mu);
  drop_kept(x, l, 0);
  l->cfg = d->cfg;
  distd_staged_store(s->store, &d->staged);
  pthread_mutex_unlock(&l->mu);
}

void distd_expert_draft_free(distd_expert_draft *d) {
  distd_staged_free(&d->staged);
  names_free(d->names, d->nnames);
  free(d->fresh);
  memset(d, 0, sizeof *d);
}

/* ---------------------------------------------------------------- FFN math */

/* A kernel operand over borrowed memory: the kernels never modify their
 * inputs and release what they take, so the count never reaches zero. */
static distd_tval borrow(dist_dtype dt, int64_t rows, int64_t cols,
                         const void *data) {
  distd_tval v;
  memset(&v, 0, sizeof v);
  v.refs = 1;
  v.dtype = dt;
  v.shape = rows < 0 ? (dist_shape){1, {cols}} : (dist_shape){2, {rows, cols}};
  v.numel = (rows < 0 ? 1 : rows) * cols;
  v.data = (void *)data;
  return v;
}

static distd_op act_op(distd_expert_act a) {
  return a == DISTD_EXPERT_SILU ? DIST__V1__OP_KIND__OP_SILU : DIST__V1__OP_KIND__OP_GELU;
}

/* *v = *v + bias (broadcast over rows), when there is a bias. */
static int add_bias(distd_tval **v, const distd_tensor *b, dist_errbuf *eb) {
  if (!b) return 0;
  distd_tval bv = borrow(b->dtype, -1, b->local.dims[0], b->data), *sum = NULL;
  int rc = distd_k_binary(DIST__V1__OP_KIND__OP_ADD, *v, &bv, &sum, eb);
  if (rc != 0) return rc;
  distd_tval_unref(*v);
  *v = sum;
  return 0;
}

/* One expert's rows: y = act(x w1 + b1) w2 + b2; h (pre-activation) and y
 * are written at the expert's rows. */
static int expert_forward(const distd_expert_layer_cfg *c, distd_tensor *const *w,
                          const void *x, int64_t n, void *h_out, void *y_out,
                          dist_errbuf *eb) {
  distd_tval xv = borrow(c->dtype, n, c->d_model, x);
  distd_tval w1 = borrow(c->dtype, c->d_model, c->d_hidden, w[W1]->data);
  distd_tval w2 = borrow(c->dtype, c->d_hidden, c->d_model, w[W2]->data);
  distd_tval *h = NULL, *a = NULL, *y = NULL;
  int rc = distd_k_matmul(&xv, &w1, 0, 0, &h, eb);
  if (rc == 0) rc = add_bias(&h, w[B1], eb);
  if (rc == 0) rc = distd_k_unary(act_op(c->act), 0, h, &a, eb);
  if (rc == 0) rc = distd_k_matmul(a, &w2, 0, 0, &y, eb);
  if (rc == 0) rc = add_bias(&y, w[B2], eb);
  if (rc == 0) {
    if (h_out) memcpy(h_out, h->data, distd_tval_nbytes(h));
    memcpy(y_out, y->data, distd_tval_nbytes(y));
  }
  distd_tval_unref(h);
  distd_tval_unref(a);
  distd_tval_unref(y);
  return rc;
}

/* Rows per local expert from counts of E or W*E entries. */
static int expert_rows(const distd_expert_layer_cfg *c, const int64_t *counts,
                       size_t n, int64_t *rows, int64_t *total,
                       dist_errbuf *eb) {
  size_t E = (size_t)c->experts;
  if (n == 0 || n % E)
    return dist_fail(eb, DIST_EINVAL, "expert layer '%s' has %zu experts here: "
                     "counts need E or W*E entries, got %zu", c->name, E, n);
  *total = 0;
  memset(rows, 0, E * sizeof *rows);
  for (size_t i = 0; i < n; i++) {
    if (counts[i] < 0)
      return dist_fail(eb, DIST_EINVAL, "count %zu is negative (%lld)", i,
                       (long long)counts[i]);
    rows[i % E] += counts[i];
    *total += counts[i];
  }
  return 0;
}

static int get_rows_input(distd_server *s, const distd_expert_layer_cfg *c,
                          const char *name, int64_t want_rows,
                          distd_tensor **out, dist_errbuf *eb) {
  int rc = distd_store_get(s->store, name ? name : "", out, eb);
  if (rc != 0) return rc;
  size_t want = (size_t)want_rows * (size_t)c->d_model * dist_dtype_size(c->dtype);
  if ((*out)->dtype != c->dtype || (*out)->nbytes != want)
    return dist_fail(eb, DIST_EMISMATCH, "tensor '%s' (%s, %zu bytes) is not "
                     "%lld rows of %lld %s", name, dist_dtype_name((*out)->dtype),
                     (*out)->nbytes, (long long)want_rows, (long long)c->d_model,
                     dist_dtype_name(c->dtype));
  return 0;
}

/* The E*NPARAM current weights of layer c (NULL entries without bias). */
static int get_weights(distd_server *s, const distd_expert_layer_cfg *c,
                       distd_tensor ***out, dist_errbuf *eb) {
  int rc = 0;
  *out = calloc((size_t)c->experts * NPARAM, sizeof **out);
  if (!*out) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (int e = 0; rc == 0 && e < c->experts; e++)
    for (int p = 0; rc == 0 && p < NPARAM; p++)
      if (has_param(c, p)) rc = get_param(s, c, e, p, 0, &(*out)[e * NPARAM + p], eb);
  return rc;
}

static int check_out_name(distd_server *s, const char *name, int replace,
                          dist_errbuf *eb) {
  if (!name || !name[0])
    return dist_fail(eb, DIST_EINVAL, "the result needs a name (out_name)");
  if (!replace && exists(s, name))
    return dist_fail(eb, DIST_EEXIST, "tensor '%s' already exists", name);
  return 0;
}

static int run_forward(distd_server *s, const distd_expert_layer_cfg *c,
                       const distd_expert_fwd *f, kept *k, distd_tensor **res,
                       dist_errbuf *eb) {
  int64_t total = 0;
  int rc = expert_rows(c, f->counts, f->ncounts, k->rows, &total, eb);
  if (rc == 0) rc = check_out_name(s, f->out_name, f->replace, eb);
  if (rc == 0) rc = get_rows_input(s, c, f->x_name, total, &k->x, eb);
  if (rc == 0) rc = get_weights(s, c, &k->w, eb);
  dist_shape ys = {2, {total, c->d_model}}, hs = {2, {total, c->d_hidden}};
  if (rc == 0) rc = new_local(s, f->out_name, c->dtype, &ys, res, eb);
  if (rc == 0 && f->invocation) rc = new_local(s, "", c->dtype, &hs, &k->h, eb);
  size_t esz = dist_dtype_size(c->dtype);
  for (int64_t e = 0, r0 = 0; rc == 0 && e < c->experts; r0 += k->rows[e++]) {
    if (k->rows[e] == 0) continue;
    rc = expert_forward(c, k->w + e * NPARAM,
                        (char *)k->x->data + (size_t)(r0 * c->d_model) * esz,
                        k->rows[e],
                        k->h ? (char *)k->h->data + (size_t)(r0 * c->d_hidden) * esz : NULL,
                        (char *)(*res)->data + (size_t)(r0 * c->d_model) * esz, eb);
  }
  if (rc == 0) rc = distd_store_put(s->store, *res, f->replace, eb);
  return rc;
}

int distd_experts_forward(distd_experts *x, distd_server *s,
                          const distd_expert_fwd *f, distd_tensor **out,
                          int64_t *rows, int *nrows, dist_errbuf *eb) {
  layer *l = NULL;
  distd_tensor *res = NULL;
  int rc = get_layer(x, f->layer, &l, eb);
  if (rc != 0) return rc;
  pthread_mutex_lock(&l->mu);
  const distd_expert_layer_cfg *c = &l->cfg;
  kept *k = calloc(1, sizeof *k);
  if (k) k->rows = calloc((size_t)c->experts, sizeof *k->rows);
  if (!k || !k->rows) {
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory");
    goto out;
  }
  k->id = f->invocation;
  if ((rc = run_forward(s, c, f, k, &res, eb)) != 0) goto out;
  if (rows) memcpy(rows, k->rows, (size_t)c->experts * sizeof *rows);
  if (nrows) *nrows = c->experts;
  if (f->invocation && (rc = add_kept(x, l, k, eb)) == 0) k = NULL;
out:
  kept_free(k, c->experts);
  pthread_mutex_unlock(&l->mu);
  if (rc == 0 && out) *out = res, res = NULL;
  distd_tensor_unref(res);
  return rc;
}

/* ---------------------------------------------------------------- backward */

/* The gradients of one expert: grads[p] (NULL without bias) of the params,
 * dx at dx_out. */
typedef struct expert_grads {
  distd_tval *g[NPARAM];
} expert_grads;

static void grads_clear(expert_grads *g) {
  for (int p = 0; p < NPARAM; p++) distd_tval_unref(g->g[p]), g->g[p] = NULL;
}

static int sum_rows(distd_tval *v, distd_tval **out, dist_errbuf *eb) {
  int64_t axis0 = 0;
  return distd_k_reduce(DIST__V1__OP_KIND__OP_SUM, v, &axis0, 1, 0, out, eb);
}

static int expert_backward(const distd_expert_layer_cfg *c, distd_tensor *const *w,
                           const void *x, const void *h, const void *dy,
                           int64_t n, void *dx_out, expert_grads *g,
                           dist_errbuf *eb) {
  distd_tval xv = borrow(c->dtype, n, c->d_model, x);
  distd_tval hv = borrow(c->dtype, n, c->d_hidden, h);
  distd_tval dyv = borrow(c->dtype, n, c->d_model, dy);
  distd_tval w1 = borrow(c->dtype, c->d_model, c->d_hidden, w[W1]->data);
  distd_tval w2 = borrow(c->dtype, c->d_hidden, c->d_model, w[W2]->data);
  distd_tval *a = NULL, *da = NULL, *dh = NULL, *dx = NULL;
  distd_op op = act_op(c->act);
  int rc = distd_k_unary(op, 0, &hv, &a, eb);
  if (rc == 0) rc = distd_k_matmul(a, &dyv, 1, 0, &g->g[W2], eb);
  if (rc == 0 && c->bias) rc = sum_rows(&dyv, &g->g[B2], eb);
  if (rc == 0) rc = distd_k_matmul(&dyv, &w2, 0, 1, &da, eb);
  if (rc == 0) rc = distd_k_unary_grad(op, 0, &hv, a, da, &dh, eb);
  if (rc == 0) rc = distd_k_matmul(&xv, dh, 1, 0, &g->g[W1], eb);
  if (rc == 0 && c->bias) rc = sum_rows(dh, &g->g[B1], eb);
  if (rc == 0) rc = distd_k_matmul(dh, &w1, 0, 1, &dx, eb);
  if (rc == 0) memcpy(dx_out, dx->data, distd_tval_nbytes(dx));
  distd_tval_unref(a);
  distd_tval_unref(da);
  distd_tval_unref(dh);
  distd_tval_unref(dx);
  return rc;
}

static void add_into(dist_dtype dt, void *dst, const void *src, int64_t n) {
  if (dt == DIST_FLOAT32) {
    float *d = dst;
    const float *s = src;
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
  } else {
    double *d = dst;
    const double *s = src;
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
  }
}

/* Stores param p's gradient of local expert e: a new tensor (stored tensors
 * are immutable) holding the old gradient (accumulate) plus g (NULL: zero,
 * an expert that got no rows). */
static int store_grad(distd_server *s, const distd_expert_layer_cfg *c, int e,
                      int p, const distd_tval *g, int accumulate,
                      dist_errbuf *eb) {
  distd_tensor *old = NULL, *t = NULL;
  dist_shape shape = param_shape(c, p);
  char name[DISTD_NAME_MAX];
  param_name(name, sizeof name, c, e, p, 1);
  int rc = 0;
  if (accumulate && (rc = get_param(s, c, e, p, 1, &old, eb)) != 0) goto out;
  if ((rc = new_local(s, name, c->dtype, &shape, &t, eb)) != 0) goto out;
  if (old) memcpy(t->data, old->data, t->nbytes);
  if (g) add_into(c->dtype, t->data, g->data, g->numel);
  rc = distd_store_put(s->store, t, 1, eb);
out:
  distd_tensor_unref(old);
  distd_tensor_unref(t);
  return rc;
}

static int run_backward(distd_server *s, const distd_expert_layer_cfg *c,
                        const distd_expert_bwd *b, kept *k, distd_tensor **res,
                        dist_errbuf *eb) {
  distd_tensor *dy = NULL;
  int64_t total = (int64_t)(k->h->local.dims[0]);
  expert_grads g = {{NULL}};
  int rc = check_out_name(s, b->out_name, b->replace, eb);
  if (rc == 0) rc = get_rows_input(s, c, b->grad_name, total, &dy, eb);
  dist_shape xs = {2, {total, c->d_model}};
  if (rc == 0) rc = new_local(s, b->out_name, c->dtype, &xs, res, eb);
  size_t esz = dist_dtype_size(c->dtype);
  for (int64_t e = 0, r0 = 0; rc == 0 && e < c->experts; r0 += k->rows[e++]) {
    size_t xo = (size_t)(r0 * c->d_model) * esz, ho = (size_t)(r0 * c->d_hidden) * esz;
    if (k->rows[e])
      rc = expert_backward(c, k->w + e * NPARAM, (char *)k->x->data + xo,
                           (char *)k->h->data + ho, (char *)dy->data + xo,
                           k->rows[e], (char *)(*res)->data + xo, &g, eb);
    for (int p = 0; rc == 0 && p < NPARAM; p++)
      if (has_param(c, p)) rc = store_grad(s, c, (int)e, p, g.g[p], b->accumulate, eb);
    grads_clear(&g);
  }
  if (rc == 0) rc = distd_store_put(s->store, *res, b->replace, eb);
  grads_clear(&g);
  distd_tensor_unref(dy);
  return rc;
}

int distd_experts_backward(distd_experts *x, distd_server *s,
                           const distd_expert_bwd *b, distd_tensor **out,
                           dist_errbuf *eb) {
  layer *l = NULL;
  distd_tensor *res = NULL;
  int rc = get_layer(x, b->layer, &l, eb);
  if (rc != 0) return rc;
  pthread_mutex_lock(&l->mu);
  kept *k = b->invocation ? take_kept(x, l, b->invocation) : NULL;
  if (!k) {
    rc = dist_fail(eb, DIST_ENOTFOUND, "expert layer '%s' keeps no invocation "
                   "%llu: its backward ran, it was released, or its forward did "
                   "not keep it", b->layer, (unsigned long long)b->invocation);
    goto out;
  }
  rc = run_backward(s, &l->cfg, b, k, &res, eb);
  /* A failed backward (a wrong gradient name, say) leaves the invocation
   * for another try; gradients already stored are not rolled back. */
  if (rc != 0 && add_kept(x, l, k, NULL) == 0) k = NULL;
out:
  kept_free(k, l->cfg.experts);
  pthread_mutex_unlock(&l->mu);
  if (rc == 0 && out) *out = res, res = NULL;
  distd_tensor_unref(res);
  return rc;
}
