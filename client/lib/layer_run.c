/* Forward and backward of a sharded layer. A forward walks the tree, runs
 * each layer as a LocalLayer program in the daemons and records a tape of
 * invocations; backward walks the tape in reverse, handing each invocation
 * the gradients of its outputs (resharded to the outputs' layouts) and
 * collecting the gradients of its inputs: activations' in a table by name
 * (summed in the daemons when one activation feeds several inputs),
 * parameters' as "<param>.grad" in the parameters' own placements. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer_internal.h"

struct fwd_ctx {
  dist_client *c;
  dist_layer *root;
  layer_step *s;
};

dist_client *dist_layer_ctx_client(fwd_ctx *x) { return x->c; }
const dist_mesh *dist_layer_ctx_mesh(fwd_ctx *x) { return &x->root->mesh; }

int dist_layer_ctx_fail(fwd_ctx *x, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  x->c->err.code = code;
  vsnprintf(x->c->err.msg, sizeof x->c->err.msg, fmt, ap);
  va_end(ap);
  return code;
}

/* ---------------------------------------------------------------- step bookkeeping */

static dist_tensor *dup_handle(const dist_tensor *t) {
  dist_tensor *d = malloc(sizeof *d);
  if (d) *d = *t;
  return d;
}

/* Appends to a growable array of elem-sized entries. */
static int push(void *arr, int *n, size_t elem, const void *item) {
  void **a = arr;
  void *q = realloc(*a, elem * (size_t)(*n + 1));
  if (!q) return DIST_ENOMEM;
  memcpy((char *)q + elem * (size_t)*n, item, elem);
  *a = q;
  (*n)++;
  return 0;
}

/* The step takes the handle (NULL is refused). */
static int keep_handle(layer_step *s, dist_tensor *t) {
  if (!t || push(&s->handles, &s->n_handles, sizeof t, &t)) {
    dist_tensor_free(t);
    return DIST_ENOMEM;
  }
  return 0;
}

/* t was just stored under a name a new layer of the same name makes
 * again (step numbers count per layer object; "<param>.grad" at every
 * step): a note of that name on the client's list for one of t's ranks
 * may be an older layer's delete, and goes (dist_later_forget_stored). A
 * note for a rank outside t's mesh stays: the older tensor may still be
 * there, and t is not. Should t be resharded there: if the older delete
 * was done (its reply lost), the reshard forgets the note; if it was not,
 * the older tensor still holds the name there and the reshard is refused
 * ("open it again") until an undo point deletes it. */
static void forget_notes_of(dist_client *c, const dist_tensor *t) {
  dist_later_forget_stored(c, t->name, &t->mesh.d);
}

/* The step deletes t at its free; forget_notes_of(t). */
static int keep_created(dist_client *c, layer_step *s, const dist_tensor *t) {
  forget_notes_of(c, t);
  char buf[256];
  snprintf(buf, sizeof buf, "%s", t->name);
  return push(&s->created, &s->n_created, sizeof buf, buf);
}

/* Deletes t, a tensor the step made but could not note for deletion
 * (keep_created failed), at once; c's error kept. */
static void delete_now(dist_client *c, const dist_tensor *t) {
  dist_errbuf keep = c->err;
  dist_tensor_delete_handle(c, t);
  c->err = keep;
}

static grad_slot *slot_of(const layer_step *s, const char *name) {
  for (int i = 0; i < s->n_grads; i++)
    if (strcmp(s->grads[i].name, name) == 0) return &s->grads[i];
  return NULL;
}

static dist_tensor *grad_of(const layer_step *s, const char *name) {
  grad_slot *slot = slot_of(s, name);
  return slot ? slot->grad : NULL;
}

static int put_grad(layer_step *s, const char *name, dist_tensor *g) {
  grad_slot slot = {{0}, g, 0};
  snprintf(slot.name, sizeof slot.name, "%s", name);
  return push(&s->grads, &s->n_grads, sizeof slot, &slot);
}

int dist_layer_step_free(dist_client *c, layer_step *s) {
  if (!s) return 0;
  dist_errbuf first = DIST_ERRBUF_INIT;
  for (int e = 0; e < s->n_entries; e++) {
    tape_entry *t = &s->entries[e];
    if (c) dist_invocation_release(c, t->inv); /* no-op after backward */
    dist_invocation_free(t->inv);
    free(t->in);
    free(t->out);
  }
  /* A delete that fails leaves the tensor: said, not swallowed; and where
   * it may be done later (a daemon that did not answer, or did nothing
   * for now), noted on the client's list, which outlives the step and the
   * layer: its next undo point (the next step's releases among them)
   * retries it, unless a step makes the name again first (keep_created:
   * a new layer of the same name counts its steps from 1 too); an SPMD
   * trainer notes none (every trainer makes the same names). A name
   * another path already deleted (a failed call's) is not found. */
  dist_later *later = dist_later_of_made_up(c, c ? &c->later : NULL);
  for (int i = 0; c && i < s->n_created; i++) {
    int rc = dist_tensor_delete_noting(c, s->created[i], later);
    dist_note_first_failure(c, rc == DIST_ENOTFOUND ? 0 : rc, &first);
  }
  for (int i = 0; i < s->n_handles; i++) dist_tensor_free(s->handles[i]);
  free(s->entries);
  free(s->created);
  free(s->handles);
  free(s->grads);
  free(s->in_names);
  free(s->out_names);
  free(s);
  /* The first failure, or none: a delete that found nothing to delete
   * leaves no error behind a release that succeeds. */
  if (c) c->err = first;
  return first.code;
}

/* Frees l's step (dist_layer_step_free), leaving its later list. */
static int release_step(dist_client *c, dist_layer *l) {
  int rc = dist_layer_step_free(c, l->step);
  l->step = NULL;
  return rc;
}

int dist_layer_release(dist_client *c, dist_layer *l) {
  if (c) c->err = (dist_errbuf)DIST_ERRBUF_INIT; /* a release that succeeds says nothing */
  if (!l || (!l->step && !l->later.n)) return 0; /* nothing to release: a no-op, NULL too */
  if (!c) return dist_no_client(__func__);
  dist_errbuf first = DIST_ERRBUF_INIT;
  dist_note_first_failure(c, release_step(c, l), &first);
  dist_note_first_failure(c, dist_later_undo(c, &l->later), &first);
  c->err = first;
  return first.code;
}

/* ---------------------------------------------------------------- one program call */

/* A layer's outputs are never Partial: the sum (or other reduction) is
 * done here, once, by an all-reduce. */
static int resolve_partial(dist_client *c, dist_tensor *t) {
  dist_placement pl[DIST_MAX_MESH_DIMS];
  int partial = 0;
  for (int m = 0; m < t->mesh.d.ndim; m++) {
    pl[m] = t->placements[m];
    if (pl[m].kind == DIST_PARTIAL) pl[m] = DIST_REPLICATED, partial = 1;
  }
  return partial ? dist_reshard(c, t, NULL, pl) : 0;
}

static int record_entry(fwd_ctx *x, dist_invocation *inv, const entry_input *ins,
                        int nargs, dist_tensor **outs, int n_out) {
  tape_entry t = {inv, nargs, calloc((size_t)nargs + 1, sizeof *ins), n_out,
                  calloc((size_t)n_out + 1, sizeof *outs[0])};
  if (!t.in || !t.out ||
      push(&x->s->entries, &x->s->n_entries, sizeof t, &t)) {
    free(t.in);
    free(t.out);
    return dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory");
  }
  memcpy(t.in, ins, sizeof *ins * (size_t)nargs);
  for (int k = 0; k < n_out; k++) t.out[k] = *outs[k];
  return 0;
}

int dist_layer_call(fwd_ctx *x, dist_program *p, const char *path,
                    const dist_arg *args, const entry_input *ins, int nargs,
                    dist_tensor ***out, int *n_out) {
  int n = dist_program_n_outputs(p), rc = 0, e = x->s->n_entries;
  char (*names)[256] = calloc((size_t)n + 1, sizeof *names);
  const char **name_ptrs = calloc((size_t)n + 1, sizeof *name_ptrs);
  dist_tensor **outs = calloc((size_t)n + 1, sizeof *outs);
  dist_invocation *inv = NULL;
  *out = NULL;
  if (!names || !name_ptrs || !outs) {
    rc = dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory");
    goto out;
  }
  for (int k = 0; k < n; k++) {
    snprintf(names[k], sizeof names[k], "%s.s%llu.%s.e%d.out%d", x->root->name,
             (unsigned long long)x->s->no, path[0] ? path : "root", e, k);
    name_ptrs[k] = names[k];
  }
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.out_names = name_ptrs;
  o.replace = 1;
  /* These names are the step's own: a failed call deletes what it stored
   * of them, though it replaces. */
  if ((rc = dist_local_layer_call_undoing(x->c, p, args, nargs, &o, &inv, outs,
                                          &x->root->later))) {
    dist_errbuf_prefix(&x->c->err, "%s: ", path[0] ? path : x->root->name);
    goto out;
  }
  for (int k = 0; k < n; k++) { /* the step owns every output from here */
    int r = keep_created(x->c, x->s, outs[k]);
    if (r) delete_now(x->c, outs[k]); /* not on the step's list of what to delete */
    if (keep_handle(x->s, outs[k])) r = DIST_ENOMEM, outs[k] = NULL;
    if (r && !rc) rc = dist_layer_ctx_fail(x, r, "out of memory");
  }
  for (int k = 0; k < n && rc == 0; k++) rc = resolve_partial(x->c, outs[k]);
  if (rc == 0 && (rc = record_entry(x, inv, ins, nargs, outs, n)) == 0) {
    inv = NULL;
    *out = outs;
    *n_out = n;
    outs = NULL;
  }
out:
  if (inv) { /* not recorded: released, the error kept */
    dist_errbuf keep = x->c->err;
    dist_invocation_release(x->c, inv);
    x->c->err = keep;
    dist_invocation_free(inv);
  }
  free(outs); /* the handles belong to the step */
  free(names);
  free(name_ptrs);
  return rc;
}

/* ---------------------------------------------------------------- forward */

static int run_layer(fwd_ctx *x, dist_layer *l, const char *path,
                     dist_tensor *const *in, int n_in, dist_tensor ***out,
                     int *n_out);

static int sequence_forward(fwd_ctx *x, dist_layer *l, const char *path,
                            dist_tensor *const *in, int n_in,
                            dist_tensor ***out, int *n_out) {
  dist_tensor **cur = calloc((size_t)n_in + 1, sizeof *cur);
  int n = n_in;
  if (!cur) return dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory");
  memcpy(cur, in, sizeof *cur * (size_t)n_in);
  for (int i = 0; i < l->n_children; i++) {
    char sub[256];
    dist_tensor **next = NULL;
    snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "",
             l->children[i]->child_name);
    int rc = run_layer(x, l->children[i], sub, cur, n, &next, &n);
    free(cur);
    if (rc) return rc;
    cur = next;
  }
  *out = cur;
  *n_out = n;
  return 0;
}

/* A custom layer: its inputs, then its parameters and buffers. */
static int program_forward(fwd_ctx *x, dist_layer *l, const char *path,
                           dist_tensor *const *in, int n_in,
                           dist_tensor ***out, int *n_out) {
  if (n_in != l->n_inputs)
    return dist_layer_ctx_fail(x, DIST_EINVAL, "%s: the layer takes %d inputs, "
                               "%d given", path[0] ? path : x->root->name,
                               l->n_inputs, n_in);
  int n = n_in + l->n_params;
  dist_arg *args = calloc((size_t)n + 1, sizeof *args);
  entry_input *ins = calloc((size_t)n + 1, sizeof *ins);
  int rc = 0;
  if (!args || !ins) {
    rc = dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < n_in; i++) {
    args[i].tensor = in[i];
    ins[i].kind = IN_ACT;
    snprintf(ins[i].name, sizeof ins[i].name, "%s", in[i]->name);
  }
  for (int i = 0; i < l->n_params; i++) {
    layer_param *p = &l->params[i];
    args[n_in + i].tensor = p->tensor;
    ins[n_in + i].kind = p->is_buffer ? IN_OTHER : IN_PARAM;
    ins[n_in + i].param = p;
  }
  rc = dist_layer_call(x, l->program, path, args, ins, n, out, n_out);
out:
  free(args);
  free(ins);
  return rc;
}

static int run_layer(fwd_ctx *x, dist_layer *l, const char *path,
                     dist_tensor *const *in, int n_in, dist_tensor ***out,
                     int *n_out) {
  if (l->kind == LAYER_SEQUENCE)
    return sequence_forward(x, l, path, in, n_in, out, n_out);
  if (l->kind == LAYER_PROGRAM)
    return program_forward(x, l, path, in, n_in, out, n_out);
  return dist_layer_forward_builtin(x, l, path[0] ? path : x->root->name, in,
                                    n_in, out, n_out);
}

/* Runs a hook on ts; entries it replaced become the step's handles. */
static int run_hook(fwd_ctx *x, dist_layer_io_fn fn, const char *what,
                    dist_tensor **ts, int n) {
  dist_tensor **before = calloc((size_t)n + 1, sizeof *before);
  if (!before) return dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory");
  memcpy(before, ts, sizeof *ts * (size_t)n);
  x->c->err = (dist_errbuf)DIST_ERRBUF_INIT;
  int rc = fn(x->c, ts, n, &x->root->mesh, x->root->user);
  for (int i = 0; i < n; i++) {
    if (ts[i] == before[i]) continue;
    int r = !ts[i] ? dist_layer_ctx_fail(x, DIST_EINVAL, "%s left entry %d NULL",
                                         what, i)
                   : keep_handle(x->s, ts[i]);
    if (r) ts[i] = before[i];
    if (r && !rc) rc = r;
  }
  free(before);
  if (rc && !x->c->err.code)
    dist_layer_ctx_fail(x, rc, "%s failed (%d)", what, rc);
  else if (rc)
    dist_errbuf_prefix(&x->c->err, "%s: ", what);
  return rc;
}

static int names_of(fwd_ctx *x, char (**names)[256], dist_tensor *const *ts, int n) {
  *names = calloc((size_t)n + 1, sizeof **names);
  if (!*names)
    return dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory for the names of %d tensors", n);
  for (int i = 0; i < n; i++)
    snprintf((*names)[i], sizeof (*names)[i], "%s", ts[i] ? ts[i]->name : "");
  return 0;
}

static int check_root(dist_client *c, const dist_layer *l) {
  if (l->parent)
    return dist_client_fail(c, DIST_EINVAL, "'%s' is a sublayer: call the root "
                            "given to dist_shard_layer", l->child_name);
  if (!l->sharded)
    return dist_client_fail(c, DIST_EINVAL, "layer '%s' is not sharded "
                            "(dist_shard_layer)", l->name);
  return 0;
}

static int forward_steps(fwd_ctx *x, dist_tensor *const *inputs, int n_in,
                         dist_tensor ***outs, int *n_out) {
  layer_step *s = x->s;
  dist_tensor **work = calloc((size_t)n_in + 1, sizeof *work);
  int rc = work ? 0 : DIST_ENOMEM;
  if (rc) dist_layer_ctx_fail(x, rc, "out of memory");
  for (int i = 0; rc == 0 && i < n_in; i++) {
    if (!inputs[i]) {
      rc = dist_layer_ctx_fail(x, DIST_EINVAL, "input %d is NULL", i);
    } else if (keep_handle(s, work[i] = dup_handle(inputs[i]))) {
      work[i] = NULL;
      rc = dist_layer_ctx_fail(x, DIST_ENOMEM, "out of memory");
    }
  }
  if (rc == 0 && x->root->input_fn)
    rc = run_hook(x, x->root->input_fn, "input_fn", work, n_in);
  /* A hook that resharded an input in place changed the caller's tensor:
   * its handle follows. */
  for (int i = 0; rc == 0 && i < n_in; i++)
    if (strcmp(work[i]->name, inputs[i]->name) == 0) *inputs[i] = *work[i];
  if (rc == 0 && (rc = names_of(x, &s->in_names, work, n_in)) == 0) s->n_in = n_in;
  if (rc == 0) rc = run_layer(x, x->root, "", work, n_in, outs, n_out);
  if (rc == 0 && (rc = names_of(x, &s->out_names, *outs, *n_out)) == 0)
    s->n_out = *n_out;
  if (rc == 0 && x->root->output_fn)
    rc = run_hook(x, x->root->output_fn, "output_fn", *outs, *n_out);
  free(work);
  return rc;
}

int dist_layer_forward(dist_client *c, dist_layer *l,
                       dist_tensor *const *inputs, int n_inputs,
                       dist_tensor **out, int max_out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  if (check_root(c, l)) return c->err.code;
  dist_layer_release(c, l);
  fwd_ctx x = {c, l, calloc(1, sizeof(layer_step))};
  dist_tensor **outs = NULL;
  int n_out = 0;
  if (!x.s) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  x.s->no = ++l->step_no;
  l->step = x.s;
  int rc = forward_steps(&x, inputs, n_inputs, &outs, &n_out);
  for (int k = 0; rc == 0 && k < n_out && k < max_out; k++)
    if (!(out[k] = dup_handle(outs[k]))) {
      while (k-- > 0) dist_tensor_free(out[k]);
      rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    }
  free(outs);
  if (rc) { /* the later list waits for the next release: a daemon just did not answer */
    dist_errbuf keep = c->err;
    release_step(c, l);
    c->err = keep;
    return rc;
  }
  return n_out;
}

/* ---------------------------------------------------------------- backward */

/* Where input j's gradient is stored: a step tensor for an activation,
 * "<param>.grad" for a parameter, nowhere ("") for the rest. */
static int grad_name(dist_client *c, const layer_step *s, const dist_layer *root,
                     int e, const entry_input *in, int j, char *buf, size_t len) {
  int n = 0;
  buf[0] = '\0';
  if (in->kind == IN_ACT)
    n = snprintf(buf, len, "%s.s%llu.e%d.grad%d", root->name,
                 (unsigned long long)s->no, e, j);
  else if (in->kind == IN_PARAM)
    n = snprintf(buf, len, "%s.grad", in->param->tensor->name);
  if (n >= (int)len)
    return dist_client_fail(c, DIST_EINVAL, "gradient name of input %d is "
                            "longer than %zu characters", j, len - 1);
  return 0;
}

/* The gradients of entry e's outputs, in the outputs' layouts; *any says
 * whether one exists. */
static int out_grads_of(dist_client *c, layer_step *s, tape_entry *t,
                        dist_arg *og, int *any) {
  *any = 0;
  for (int k = 0; k < t->n_out; k++) {
    dist_tensor *g = grad_of(s, t->out[k].name);
    og[k] = (dist_arg){g, NULL};
    if (!g) continue;
    *any = 1;
    if (dist_same_layout(g, &t->out[k])) continue;
    const dist_mesh *mesh = dist_mesh_equal(&g->mesh.d, &t->out[k].mesh.d)
                                ? NULL : &t->out[k].mesh;
    int rc = dist_reshard(c, g, mesh, t->out[k].placements);
    if (rc) {
      dist_errbuf_prefix(&c->err, "gradient of '%s': ", t->out[k].name);
      return rc;
    }
  }
  return 0;
}

/* A further gradient g of an activation that feeds several inputs (two
 * layers, or one layer twice): the slot gets their sum, on the first
 * one's mesh and placements. g and the sum belong to the step. */
static int add_grad(dist_client *c, layer_step *s, grad_slot *slot, dist_tensor *g,
                    dist_later *later) {
  dist_tensor *sum = NULL;
  char name[256];
  if (snprintf(name, sizeof name, "%s.sum", g->name) >= (int)sizeof name)
    return dist_client_fail(c, DIST_EINVAL, "gradient name '%s.sum' is too long", g->name);
  int rc = dist_grad_sum(c, slot->name, slot->grad, g, name, &sum, later);
  if (rc) {
    dist_errbuf_prefix(&c->err, "summing the gradients of '%s': ", slot->name);
    return rc;
  }
  if (keep_created(c, s, sum)) {
    dist_client_fail(c, DIST_ENOMEM, "out of memory keeping gradient '%s'", name);
    delete_now(c, sum);
    dist_tensor_free(sum);
    return DIST_ENOMEM;
  }
  if (keep_handle(s, sum)) /* frees sum */
    return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  slot->grad = sum;
  return 0;
}

/* Files the gradient of input j of entry e; a sum that fails notes its
 * name on later for the daemons that did not answer. */
static int take_grad(dist_client *c, layer_step *s, const tape_entry *t, int j,
                     dist_tensor *g, dist_later *later) {
  const entry_input *in = &t->in[j];
  if (in->kind == IN_PARAM) {
    layer_param *p = in->param;
    dist_later_forget(later, g->name); /* an earlier step's failed backward noted it */
    forget_notes_of(c, g); /* a destroyed layer of this name's, handed to the client */
    dist_tensor_free(p->grad);
    p->grad = g;
    if (dist_same_layout(g, p->tensor)) return 0;
    return dist_reshard(c, g, NULL, p->tensor->placements);
  }
  if (in->kind != IN_ACT) {
    dist_tensor_free(g);
    return 0;
  }
  if (keep_created(c, s, g)) {
    dist_client_fail(c, DIST_ENOMEM, "out of memory keeping gradient '%s'", g->name);
    delete_now(c, g);
    dist_tensor_free(g);
    return DIST_ENOMEM;
  }
  if (keep_handle(s, g)) /* frees g */
    return dist_client_fail(c, DIST_ENOMEM, "out of memory keeping a gradient's handle");
  grad_slot *slot = slot_of(s, in->name);
  if (slot) return add_grad(c, s, slot, g, later);
  if (put_grad(s, in->name, g))
    return dist_client_fail(c, DIST_ENOMEM, "out of memory filing the gradient of '%s'",
                            in->name);
  return 0;
}

/* What a failed backward of entry t deletes where it applied (it
 * replaces, so dist_backward alone would keep it): the gradients no handle
 * will name, an activation's (the step's own) and a parameter's that has
 * none yet, into undo; a parameter's gradient from an earlier step keeps
 * its handle and name (""). */
static void grads_to_undo(const tape_entry *t, const char *const *names, const char **undo) {
  for (int j = 0; j < t->n_in; j++) {
    const entry_input *in = &t->in[j];
    int unnamed = in->kind == IN_ACT || (in->kind == IN_PARAM && !in->param->grad);
    undo[j] = unnamed ? names[j] : "";
  }
}

static int backward_entry(dist_client *c, dist_layer *root, int e, int seed) {
  layer_step *s = root->step;
  tape_entry *t = &s->entries[e];
  dist_arg *og = calloc((size_t)t->n_out + 1, sizeof *og);
  char (*names)[256] = calloc((size_t)t->n_in + 1, sizeof *names);
  const char **ptrs = calloc(2 * ((size_t)t->n_in + 1), sizeof *ptrs); /* names, undo */
  dist_tensor **grads = calloc((size_t)t->n_in + 1, sizeof *grads);
  int any = 0, rc = og && names && ptrs && grads ? 0 : DIST_ENOMEM;
  if (rc) {
    rc = dist_client_fail(c, rc, "out of memory");
    goto out;
  }
  if (!seed && ((rc = out_grads_of(c, s, t, og, &any)) || !any)) {
    if (!any) dist_invocation_release(c, t->inv); /* nothing flows back */
    goto out;
  }
  for (int j = 0; j < t->n_in && rc == 0; j++) {
    rc = grad_name(c, s, root, e, &t->in[j], j, names[j], sizeof names[j]);
    ptrs[j] = names[j];
  }
  if (rc) goto out;
  dist_backward_opts o = DIST_BACKWARD_OPTS_INIT;
  o.grad_names = ptrs;
  o.replace = 1;
  const char **undo = ptrs + t->n_in + 1;
  grads_to_undo(t, ptrs, undo);
  rc = dist_backward_undoing(c, t->inv, seed ? NULL : og, &o, grads, undo, &root->later);
  if (rc) goto out;
  dist_errbuf first = DIST_ERRBUF_INIT;
  for (int j = 0; j < t->n_in; j++) { /* each is taken, or freed, past a failure */
    dist_note_first_failure(c, grads[j] ? take_grad(c, s, t, j, grads[j], &root->later) : 0, &first);
    grads[j] = NULL;
  }
  if ((rc = first.code)) c->err = first;
out:
  for (int j = 0; grads && j < t->n_in; j++) dist_tensor_free(grads[j]);
  free(og);
  free(names);
  free(ptrs);
  free(grads);
  return rc;
}

static int seed_grads(dist_client *c, layer_step *s, dist_tensor *const *out_grads) {
  if (!out_grads) {
    const tape_entry *last = s->n_entries ? &s->entries[s->n_entries - 1] : NULL;
    if (s->n_out != 1 || !last || strcmp(last->out[0].name, s->out_names[0]) != 0)
      return dist_client_fail(c, DIST_EINVAL, "backward without output "
                              "gradients needs one scalar output (the forward "
                              "gave %d)", s->n_out);
    return 0;
  }
  for (int k = 0; k < s->n_out; k++)
    if (out_grads[k] && put_grad(s, s->out_names[k], out_grads[k]))
      return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  return 0;
}

int dist_layer_backward(dist_client *c, dist_layer *l,
                        dist_tensor *const *out_grads, dist_tensor **in_grads) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  layer_step *s = l->step;
  int rc = check_root(c, l);
  for (int i = 0; in_grads && s && i < s->n_in; i++) in_grads[i] = NULL;
  if (rc) return rc;
  if (!s || s->backward_done)
    return dist_client_fail(c, DIST_EINVAL, "layer '%s': backward needs a "
                            "forward first (and runs once per forward)", l->name);
  s->backward_done = 1;
  if ((rc = seed_grads(c, s, out_grads))) return rc;
  for (int e = s->n_entries - 1; e >= 0 && rc == 0; e--)
    rc = backward_entry(c, l, e, !out_grads && e == s->n_entries - 1);
  for (int i = 0; rc == 0 && in_grads && i < s->n_in; i++) {
    const dist_tensor *g = grad_of(s, s->in_names[i]);
    if (g && !(in_grads[i] = dup_handle(g)))
      rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
  }
  return rc;
}
