/* Layers: the tree of sublayers with parameters and buffers, placing
 * parameters from shard_fn, reading them back, the parameter service for a
 * whole layer, and tearing it down. Sharding is layer_shard.c, the built-in
 * layers layer_builtin.c, forward and backward layer_run.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer_internal.h"
#include "param.pb-c.h"

static const char *const kind_names[] = {
    [LAYER_LINEAR] = "Linear",       [LAYER_EMBEDDING] = "Embedding",
    [LAYER_LAYER_NORM] = "LayerNorm", [LAYER_RMS_NORM] = "RMSNorm",
    [LAYER_SEQUENCE] = "Sequence",   [LAYER_PROGRAM] = "Program",
};

const char *dist_layer_kind_name(layer_kind k) { return kind_names[k]; }

dist_layer *dist_layer_alloc(layer_kind kind, const char *name) {
  dist_layer *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->kind = kind;
  snprintf(l->name, sizeof l->name, "%s", name);
  return l;
}

static void param_clear(layer_param *p) {
  free(p->init);
  dist_tensor_free(p->tensor);
  dist_tensor_free(p->grad);
}

void dist_layer_free(dist_layer *l) {
  if (!l) return;
  for (int i = 0; i < l->n_children; i++) dist_layer_free(l->children[i]);
  for (int i = 0; i < l->n_params; i++) param_clear(&l->params[i]);
  for (int i = 0; i < l->n_progs; i++) dist_program_free(l->progs[i].p);
  dist_layer_step_free(NULL, l->step);
  dist_later_free(&l->later);
  dist_program_free(l->program);
  free(l->children);
  free(l->params);
  free(l->progs);
  free(l);
}

/* Names of children, parameters and roots: no dots inside a path part. */
static int valid_part(const char *s, size_t max, int allow_dots) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n >= max) return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
             (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' ||
             (allow_dots && ch == '.');
    if (!ok) return 0;
  }
  return 1;
}

/* The calls building a layer take no client: why one failed is the
 * thread's dist_errmsg(NULL). */

int dist_layer_set_name(dist_layer *l, const char *name) {
  if (!l) return dist_null_handle(__func__, "l");
  if (!valid_part(name, 101, 1))
    return dist_thread_fail(DIST_EINVAL, "%s: name '%s' is not 1 to 100 characters of "
                            "[A-Za-z0-9_.-]", __func__, name ? name : "(null)");
  snprintf(l->name, sizeof l->name, "%s", name);
  return 0;
}

static int has_name(const dist_layer *l, const char *name) {
  for (int i = 0; i < l->n_children; i++)
    if (strcmp(l->children[i]->child_name, name) == 0) return 1;
  for (int i = 0; i < l->n_params; i++)
    if (strcmp(l->params[i].name, name) == 0) return 1;
  return 0;
}

/* Why child cannot go under parent as name (NULL when it can). */
static const char *add_refusal(const dist_layer *parent, const char *name,
                               const dist_layer *child) {
  if (child->parent) return "child already has a parent";
  if (child == parent) return "child is parent";
  if (parent->sharded || child->sharded) return "a sharded layer takes no children and is no child";
  if (!valid_part(name, sizeof child->child_name, 0)) return "name is not [A-Za-z0-9_-]+";
  if (has_name(parent, name)) return "parent has a child or parameter of that name";
  return NULL;
}

int dist_layer_add(dist_layer *parent, const char *name, dist_layer *child) {
  if (!parent) return dist_null_handle(__func__, "parent");
  if (!child) return dist_null_handle(__func__, "child");
  const char *why = add_refusal(parent, name, child);
  if (why)
    return dist_thread_fail(DIST_EINVAL, "%s: '%s': %s", __func__, name ? name : "(null)",
                            why);
  dist_layer **c = realloc(parent->children,
                           sizeof *c * (size_t)(parent->n_children + 1));
  if (!c) return dist_thread_fail(DIST_ENOMEM, "%s: out of memory", __func__);
  parent->children = c;
  c[parent->n_children++] = child;
  child->parent = parent;
  snprintf(child->child_name, sizeof child->child_name, "%s", name);
  return 0;
}

layer_param *dist_layer_new_param(dist_layer *l, const char *name,
                                  int is_buffer, int ndim,
                                  const int64_t *shape, const float *data) {
  dist_shape s;
  /* dist_shape_make bounds the element count: [2^22, 2^22, 2^20] wrapped
   * to 0 elements, a parameter of that shape over a 4-byte buffer. */
  if (dist_shape_make(ndim, shape, &s, NULL) != 0) return NULL;
  size_t n = (size_t)dist_shape_numel(&s);
  float *init = calloc(n + 1, sizeof *init);
  layer_param *p = realloc(l->params, sizeof *p * (size_t)(l->n_params + 1));
  if (!init || !p) {
    free(init);
    if (p) l->params = p;
    return NULL;
  }
  l->params = p;
  p = &l->params[l->n_params++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->is_buffer = is_buffer;
  p->shape = s;
  p->init = init;
  if (data) memcpy(init, data, n * sizeof *init);
  return p;
}

/* dist_layer_new_param for a public call: the checks of the caller's
 * name and layer, each refusal saying why. */
static int add_param(const char *func, dist_layer *l, const char *name, int is_buffer,
                     int ndim, const int64_t *shape, const float *data) {
  dist_shape s;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (!l) return dist_null_handle(func, "l");
  const char *what = is_buffer ? "buffer" : "parameter";
  const char *bad = name ? name : "(null)";
  if (l->sharded)
    return dist_thread_fail(DIST_EINVAL, "%s: '%s': the layer is sharded", func, bad);
  if (!valid_part(name, sizeof l->params->name, 0))
    return dist_thread_fail(DIST_EINVAL, "%s: %s name '%s' is not [A-Za-z0-9_-]+", func,
                            what, bad);
  if (has_name(l, name))
    return dist_thread_fail(DIST_EINVAL, "%s: the layer has a child or parameter '%s'",
                            func, name);
  if (dist_shape_make(ndim, shape, &s, &eb) != 0)
    return dist_thread_fail(DIST_EINVAL, "%s: '%s': %s", func, name, dist_errbuf_msg(&eb));
  if (!dist_layer_new_param(l, name, is_buffer, ndim, shape, data))
    return dist_thread_fail(DIST_ENOMEM, "%s: out of memory", func);
  return 0;
}

int dist_layer_add_param(dist_layer *l, const char *name, int ndim,
                         const int64_t *shape, const float *data) {
  return add_param(__func__, l, name, 0, ndim, shape, data);
}

int dist_layer_add_buffer(dist_layer *l, const char *name, int ndim,
                          const int64_t *shape, const float *data) {
  return add_param(__func__, l, name, 1, ndim, shape, data);
}

layer_param *dist_layer_own_param(const dist_layer *l, const char *name) {
  for (int i = 0; i < l->n_params; i++)
    if (strcmp(l->params[i].name, name) == 0) return &l->params[i];
  return NULL;
}

dist_layer *dist_layer_find(dist_layer *l, const char *path) {
  if (!l) return dist_null_handle(__func__, "l"), NULL;
  if (!path) return dist_null_handle(__func__, "path"), NULL;
  while (*path) {
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    dist_layer *next = NULL;
    for (int i = 0; i < l->n_children && !next; i++)
      if (strlen(l->children[i]->child_name) == n &&
          strncmp(l->children[i]->child_name, path, n) == 0)
        next = l->children[i];
    if (!next) return NULL;
    l = next;
    path += n + (dot != NULL);
  }
  return l;
}

layer_param *dist_layer_param_by_path(const dist_layer *l, const char *path) {
  const char *dot = path ? strrchr(path, '.') : NULL;
  char prefix[512];
  if (!path) return NULL;
  if (!dot) return dist_layer_own_param(l, path);
  snprintf(prefix, sizeof prefix, "%.*s", (int)(dot - path), path);
  dist_layer *owner = dist_layer_find((dist_layer *)l, prefix);
  return owner ? dist_layer_own_param(owner, dot + 1) : NULL;
}

int dist_layer_set_param(dist_layer *l, const char *path, const void *data,
                         size_t nbytes) {
  if (!l) return dist_null_handle(__func__, "l");
  if (!path) return dist_null_handle(__func__, "path");
  layer_param *p = dist_layer_param_by_path(l, path);
  if (!p) return dist_thread_fail(DIST_ENOTFOUND, "%s: no parameter '%s'", __func__, path);
  if (!p->init || p->tensor)
    return dist_thread_fail(DIST_EINVAL, "%s: '%s' is sharded already", __func__, path);
  if (!data && nbytes) return dist_null_handle(__func__, "data");
  size_t want = (size_t)dist_shape_numel(&p->shape) * sizeof(float);
  if (nbytes != want)
    return dist_thread_fail(DIST_EMISMATCH, "%s: '%s' takes %zu bytes, %zu given", __func__,
                            path, want, nbytes);
  memcpy(p->init, data, nbytes);
  return 0;
}

/* ---------------------------------------------------------------- listing */

typedef struct param_walk {
  int want, seen;
  dist_layer_param_info *out;
} param_walk;

/* Depth first: a layer's own parameters, then each child's. */
static int walk_params(const dist_layer *l, const char *path, param_walk *w) {
  for (int i = 0; i < l->n_params; i++, w->seen++) {
    if (w->seen != w->want) continue;
    const layer_param *p = &l->params[i];
    dist_layer_param_info *o = w->out;
    memset(o, 0, sizeof *o);
    snprintf(o->path, sizeof o->path, "%s%s%s", path, path[0] ? "." : "", p->name);
    if (p->tensor) snprintf(o->name, sizeof o->name, "%s", p->tensor->name);
    o->is_buffer = p->is_buffer;
    o->dtype = DIST_FLOAT32;
    o->ndim = p->shape.ndim;
    memcpy(o->shape, p->shape.dims, sizeof o->shape);
    if (p->tensor) {
      o->nplacements = p->tensor->mesh.d.ndim;
      memcpy(o->placements, p->tensor->placements, sizeof o->placements);
    }
    return 1;
  }
  for (int i = 0; i < l->n_children; i++) {
    char sub[256];
    snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "",
             l->children[i]->child_name);
    if (walk_params(l->children[i], sub, w)) return 1;
  }
  return 0;
}

int dist_layer_n_params(const dist_layer *l) {
  if (!l) return dist_null_handle(__func__, "l"), -1;
  int n = l->n_params;
  for (int i = 0; i < l->n_children; i++) n += dist_layer_n_params(l->children[i]);
  return n;
}

int dist_layer_param_at(const dist_layer *l, int i, dist_layer_param_info *out) {
  if (!l) return dist_null_handle(__func__, "l");
  if (!out) return dist_null_handle(__func__, "out");
  param_walk w = {i, 0, out};
  if (i >= 0 && walk_params(l, "", &w)) return 0;
  return dist_thread_fail(DIST_ENOTFOUND, "%s: no parameter %d (the layer has %d)", __func__,
                          i, w.seen);
}

/* ---------------------------------------------------------------- placing */

/* Errors are kept in the layer's root, where dist_shard_layer reads them. */
static dist_layer *root_of(dist_layer *l) {
  while (l->parent) l = l->parent;
  return l;
}

/* A refusal of dist_layer_place_param: said at once in the thread's
 * dist_errmsg(NULL), as the other layer calls without a client say theirs,
 * and the root's first one kept for dist_shard_layer to report (shard_fn
 * may return another code, or go on after it). */
static int place_refused(dist_layer *root, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int place_refused(dist_layer *root, int code, const char *fmt, ...) {
  char msg[sizeof root->place_err.msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!root->place_err.code) dist_fail(&root->place_err, code, "%s", msg);
  return dist_thread_fail(code, "dist_layer_place_param: %s", msg);
}

int dist_layer_place_param(dist_layer *l, const char *param,
                           const dist_placement *placements, int n) {
  if (!l) return dist_null_handle(__func__, "l");
  if (!placements) return dist_null_handle(__func__, "placements");
  dist_layer *root = root_of(l);
  layer_param *p = dist_layer_own_param(l, param ? param : "");
  if (!p)
    return place_refused(root, DIST_ENOTFOUND, "shard_fn placed '%s', which this %s "
                         "layer does not have", param ? param : "(null)",
                         dist_layer_kind_name(l->kind));
  if (n < 1 || n > DIST_MAX_MESH_DIMS)
    return place_refused(root, DIST_EINVAL, "shard_fn placed '%s' with %d placements",
                         param, n);
  memcpy(p->placements, placements, sizeof *placements * (size_t)n);
  p->nplacements = n;
  return 0;
}

/* ---------------------------------------------------------------- reading */

/* What read_param says with no client (before dist_shard_layer) goes to
 * the thread's dist_errmsg(NULL), as the building calls' does. */
int dist_layer_read_param(dist_client *c, const dist_layer *l,
                          const char *path, void **data, size_t *nbytes) {
  const char *none = !l ? "l" : !data ? "data" : !nbytes ? "nbytes" : NULL;
  if (none) return c ? dist_client_null_arg(c, __func__, none) : dist_null_handle(__func__, none);
  const layer_param *p = dist_layer_param_by_path(l, path);
  *data = NULL;
  if (!p)
    return c ? dist_client_fail(c, DIST_ENOTFOUND, "layer has no parameter '%s'",
                                path ? path : "(null)")
             : dist_thread_fail(DIST_ENOTFOUND, "%s: layer has no parameter '%s'", __func__,
                                path ? path : "(null)");
  if (p->tensor) return dist_full_tensor(c, p->tensor, data, nbytes);
  *nbytes = (size_t)dist_shape_numel(&p->shape) * sizeof(float);
  if (!(*data = malloc(*nbytes + 1)))
    return c ? dist_client_fail(c, DIST_ENOMEM, "out of memory")
             : dist_thread_fail(DIST_ENOMEM, "%s: out of memory", __func__);
  memcpy(*data, p->init, *nbytes);
  return 0;
}

int dist_layer_read_grad(dist_client *c, const dist_layer *l, const char *path,
                         void **data, size_t *nbytes) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  const layer_param *p = dist_layer_param_by_path(l, path);
  *data = NULL;
  if (!p || !p->grad)
    return dist_client_fail(c, DIST_ENOTFOUND, "'%s' has no gradient%s", path,
                            p ? " (no backward reached it)" : ": no such parameter");
  return dist_full_tensor(c, p->grad, data, nbytes);
}

/* No layer: NULL, and dist_errmsg(NULL) says so. */
const dist_tensor *dist_layer_param_tensor(const dist_layer *l, const char *path) {
  if (!l) return dist_null_handle(__func__, "l"), NULL;
  const layer_param *p = dist_layer_param_by_path(l, path);
  return p ? p->tensor : NULL;
}

const dist_tensor *dist_layer_grad_tensor(const dist_layer *l, const char *path) {
  if (!l) return dist_null_handle(__func__, "l"), NULL;
  const layer_param *p = dist_layer_param_by_path(l, path);
  return p ? p->grad : NULL;
}

/* ---------------------------------------------------------------- training */

typedef int (*param_visit)(dist_client *c, layer_param *p, void *arg);

/* Every parameter (not buffer) of the tree, stopping at the first error;
 * *done counts those fn went through. */
static int each_param(dist_client *c, dist_layer *l, param_visit fn, void *arg, int *done) {
  for (int i = 0; i < l->n_params; i++) {
    if (l->params[i].is_buffer || !l->params[i].tensor) continue;
    int rc = fn(c, &l->params[i], arg);
    if (rc) return rc;
    ++*done;
  }
  for (int i = 0; i < l->n_children; i++) {
    int rc = each_param(c, l->children[i], fn, arg, done);
    if (rc) return rc;
  }
  return 0;
}

static int count_one(dist_client *c, layer_param *p, void *arg) {
  (void)c, (void)p, (void)arg;
  return 0;
}

/* The tree's stored parameters (not buffers), with their gradients'
 * names; with need_grad only those a gradient reached. */
typedef struct {
  const dist_tensor **params;
  const char **grads;
  int n, need_grad;
} param_list;

static int list_one(dist_client *c, layer_param *p, void *arg) {
  (void)c;
  param_list *s = arg;
  if (s->need_grad && !p->grad) return 0;
  s->params[s->n] = p->tensor;
  s->grads[s->n++] = p->grad ? p->grad->name : NULL;
  return 0;
}

static int param_list_make(dist_client *c, dist_layer *l, int need_grad, param_list *s) {
  int total = 0, listed = 0;
  each_param(c, l, count_one, NULL, &total);
  *s = (param_list){calloc((size_t)total + 1, sizeof *s->params),
                    calloc((size_t)total + 1, sizeof *s->grads), 0, need_grad};
  if (!s->params || !s->grads) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  return each_param(c, l, list_one, s, &listed);
}

static void param_list_free(param_list *s) {
  free(s->params);
  free(s->grads);
}

static int require_sharded(dist_client *c, const dist_layer *l) {
  if (l->sharded) return 0;
  return dist_client_fail(c, DIST_EINVAL, "layer '%s' is not sharded "
                          "(dist_shard_layer)", l->name);
}

/* Every parameter configured as one batch (dist_param_configure_batch):
 * by all of their daemons or by none. */
int dist_layer_configure_optimizer(dist_client *c, dist_layer *l,
                                   const dist_param_opts *opts) {
  if (!c) return dist_no_client(__func__);
  uint64_t op_id = dist_next_op_id(c); /* by every SPMD trainer, first */
  if (DIST_NEED(c, l)) return c->err.code;
  if (require_sharded(c, l)) return c->err.code;
  Dist__V1__OptimizerConfig opt;
  Dist__V1__ParamConfigureRequest how;
  param_list s = {0};
  int rc = dist_param_configure_request(c, opts, 0, &how, &opt);
  if (rc == 0) rc = param_list_make(c, l, 0, &s);
  if (rc == 0) rc = dist_param_configure_batch(c, op_id, s.n, s.params, &how);
  if (rc != 0) dist_errbuf_prefix(&c->err, "layer '%s': configure refused: ", l->name);
  param_list_free(&s);
  return rc;
}

/* One step for every parameter with a gradient, applied by all of their
 * daemons or by none (dist_param_push_tensors). */
int dist_layer_step(dist_client *c, dist_layer *l, int trainer) {
  if (!c) return dist_no_client(__func__);
  uint64_t op_id = dist_next_op_id(c); /* by every SPMD trainer, first */
  if (DIST_NEED(c, l)) return c->err.code;
  if (require_sharded(c, l)) return c->err.code;
  if (dist_client_check_trainer(c, __func__, trainer)) return c->err.code;
  param_list s;
  int rc = param_list_make(c, l, 1, &s);
  if (rc == 0) rc = dist_param_push_batch(c, op_id, s.n, s.params, s.grads, trainer);
  if (rc != 0) dist_errbuf_prefix(&c->err, "layer '%s': step refused: ", l->name);
  param_list_free(&s);
  return rc;
}

int dist_layer_push_grad(dist_client *c, dist_layer *l, const char *path,
                         int trainer, const void *grad, size_t nbytes) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  if (require_sharded(c, l)) return c->err.code;
  layer_param *p = dist_layer_param_by_path(l, path);
  if (!p || p->is_buffer)
    return dist_client_fail(c, DIST_ENOTFOUND, "layer '%s' has no parameter '%s'",
                            l->name, path);
  size_t want = (size_t)dist_shape_numel(&p->shape) * sizeof(float);
  if (nbytes != want) {
    char s[96];
    dist_shape_format(&p->shape, s, sizeof s);
    return dist_client_fail(c, DIST_EMISMATCH, "gradient for %s has %zu bytes, "
                            "but %s is float32 %s = %zu bytes", path, nbytes,
                            path, s, want);
  }
  return dist_param_push(c, p->tensor->name, trainer, grad, nbytes, NULL);
}

/* ---------------------------------------------------------------- teardown */

/* Deletes the stored tensors and unregisters the programs of a tree, best
 * effort; the first failure is returned. */
/* Deletes and unregisters what l and its children stored; the first
 * failure goes to *first. */
static void unshard(dist_client *c, dist_layer *l, dist_errbuf *first) {
  for (int i = 0; i < l->n_params; i++) {
    layer_param *p = &l->params[i];
    if (p->grad) dist_note_first_failure(c, dist_tensor_delete(c, p->grad->name), first);
    if (p->tensor) dist_note_first_failure(c, dist_tensor_delete(c, p->tensor->name), first);
  }
  for (int i = 0; i < l->n_progs; i++)
    dist_note_first_failure(c, dist_program_unregister(c, l->progs[i].p), first);
  if (l->program) dist_note_first_failure(c, dist_program_unregister(c, l->program), first);
  for (int i = 0; i < l->n_children; i++) unshard(c, l->children[i], first);
}

int dist_layer_destroy(dist_client *c, dist_layer *l) {
  if (!l) return 0; /* documented as a no-op */
  if (!c) return dist_no_client(__func__);
  dist_errbuf first = DIST_ERRBUF_INIT;
  dist_note_first_failure(c, dist_layer_release(c, l), &first);
  if (l->sharded) unshard(c, l, &first);
  /* What the release's pass could not undo (a daemon not reached) outlives
   * the layer on the client's list, whose next undo point retries it; a new
   * layer of this name forgets the notes of the names it makes again
   * (keep_created, take_grad). An SPMD trainer notes none of these shared
   * names. */
  dist_later_hand_over(c, &l->later, dist_later_of_made_up(c, &c->later));
  dist_layer_free(l);
  if (first.code) c->err = first;
  return first.code;
}
