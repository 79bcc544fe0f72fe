/* The tape's backward: the gradient of each tensor name in a slot, the
 * seeds, and the walk over the entries newest first (tape.c says how the
 * tape works and records).
 *
 * Gradients are tensors the daemons hold, named "tape<token>.<serial>.g<k>"
 * (dist_tape_new); only seeds given as bytes travel through the client. An
 * exchange's gradient lives per rank: each daemon of the group holds its
 * own rows under the name on a one-rank mesh, as a kept exchange result
 * does. Two gradients of one tensor are added in the daemons by a one-op
 * LocalLayer program. A reshard changes a tensor's layout under the same
 * name, so its backward takes the name's gradient, reshards it to the
 * layout before and files it again under the name, for the entries before
 * it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tape_internal.h"

/* ---------------------------------------------------------------- gradients */

static void next_grad_name(dist_tape *t, char *buf) {
  snprintf(buf, NAME_MAX_LEN, "%s.g%llu", t->prefix,
           (unsigned long long)t->next_grad++);
}

static slot *slot_of(dist_tape *t, const char *name) {
  slot *s = dist_tape_find(t->slots, t->n_slots, name);
  if (s) return s;
  if (dist_tape_reserve((void **)&t->slots, &t->cap_slots, t->n_slots, sizeof *t->slots))
    return NULL;
  s = &t->slots[t->n_slots++];
  memset(s, 0, sizeof *s);
  snprintf(s->name, sizeof s->name, "%s", name);
  return s;
}

/* A gradient tensor the tape made: per rank when name's pieces are (an
 * exchange read or wrote it), else distributed like handle h. */
static slot made_tensor(dist_tape *t, const char *of, const dist_tensor *h) {
  slot g = {.kind = G_TENSOR, .owned = 1, .t = *h};
  const slot *local = dist_tape_find(t->locals, t->n_locals, of);
  if (local) {
    g.per_rank = 1;
    g.ranks = local->ranks;
  }
  return g;
}

/* An SPMD trainer outside the exchange's group (no ranks of its own) or
 * outside the mesh of the gradient it would add or copy: it holds none of
 * it, so the step is a no-op, as in Paddle; it takes the op ids the
 * members' step takes, which the plan counts (tape_plan.c). */
static int outside_gradient(const dist_tape *t, const slot *g) {
  if (t->c->spmd_rank < 0) return 0;
  return g->per_rank ? g->ranks.n == 0 : dist_spmd_outside(t->c, &g->t.mesh.d);
}

/* An outsider's gradient add or copy into a tensor called name, laid out
 * as like: the ids taken, nothing sent, a handle without a piece. */
static void outsider_add(dist_tape *t, const dist_tensor *like, const char *name,
                         dist_tensor *out) {
  dist_take_ids(t->c, dist_grad_add_ids());
  *out = *like;
  snprintf(out->name, sizeof out->name, "%s", name);
  out->no_piece = 1;
}

/* acc + more into a new tensor: per rank on each daemon's one-rank mesh
 * when either is per rank, else on acc's mesh and placements (more
 * resharded to them first). */
static int add_tensors(dist_tape *t, const slot *acc, slot *more, slot *sum) {
  dist_client *c = t->c;
  char name[NAME_MAX_LEN];
  dist_tensor *out = NULL;
  int rc = 0;
  next_grad_name(t, name);
  *sum = *acc;
  sum->owned = 1;
  if (outside_gradient(t, acc)) {
    if (!acc->per_rank && !more->per_rank && !dist_same_layout(&acc->t, &more->t))
      rc = dist_reshard(c, &more->t, NULL, acc->t.placements); /* no-op, its id */
    outsider_add(t, &acc->t, name, &sum->t);
    if (more->per_rank) sum->per_rank = 1, sum->ranks = more->ranks;
    return rc;
  }
  if (acc->per_rank || more->per_rank) {
    sum->per_rank = 1;
    sum->ranks = acc->per_rank ? acc->ranks : more->ranks;
    dist_placement rep = DIST_REPLICATED;
    int added = 0; /* ranks whose add succeeded */
    while (rc == 0 && added < sum->ranks.n) {
      dist_mesh_desc one;
      dist_mesh_of_rank(&one, sum->ranks.ranks[added], NULL);
      rc = dist_grad_add(c, acc->t.name, more->t.name, &one, &rep, name, &out, &t->later);
      dist_tensor_free(out), out = NULL;
      if (rc == 0) added++;
    }
    /* A failed add undid itself (dist_grad_add); the ranks before it kept theirs. */
    if (rc) dist_delete_on(c, name, sum->ranks.ranks, added, &t->later);
  } else {
    rc = dist_grad_sum(c, acc->name, &acc->t, &more->t, name, &out, &t->later);
    if (rc == 0) sum->t = *out;
    dist_tensor_free(out);
  }
  snprintf(sum->t.name, sizeof sum->t.name, "%s", name);
  return rc;
}

/* 1 in a float dtype, for the loss's gradient. */
static const void *unit_of(dist_dtype dt) {
  static const float f32 = 1;
  static const double f64 = 1;
  static const uint16_t f16 = 0x3C00, bf16 = 0x3F80;
  switch (dt) {
  case DIST_FLOAT16: return &f16;
  case DIST_FLOAT32: return &f32;
  case DIST_FLOAT64: return &f64;
  case DIST_BFLOAT16: return &bf16;
  default: return NULL;
  }
}

static int not_a_scalar(dist_tape *t, const char *name) {
  return dist_client_fail(t->c, DIST_EINVAL, "'%s' is not a float scalar: give its "
                          "gradient", name);
}

/* Stores pieces (one per rank of `ranks`; SPMD: this trainer's) as name,
 * each on its own daemon's one-rank mesh, as an exchange result lives. A
 * failure deletes the pieces stored, one whose delete was not done noted
 * on later. */
static int store_per_rank(dist_client *c, const char *name, const void *const *pieces,
                          const int64_t *const *shapes, int ndim, dist_dtype dt,
                          const rank_set *ranks, dist_tensor **out, dist_later *later) {
  dist_placement rep = DIST_REPLICATED;
  int n = c->spmd_rank >= 0 ? 1 : ranks->n, rc = 0;
  if (c->spmd_rank >= 0 && ranks->n == 0) { /* outside the group: holds none */
    dist_next_op_id(c); /* the members' put of their piece */
    if (!(*out = calloc(1, sizeof **out)))
      return dist_client_fail(c, DIST_ENOMEM, "out of memory");
    snprintf((*out)->name, sizeof (*out)->name, "%s", name);
    (*out)->dtype = dt;
    (*out)->no_piece = 1;
    return 0;
  }
  for (int k = 0; rc == 0 && k < n; k++) {
    int r = c->spmd_rank >= 0 ? c->spmd_rank : ranks->ranks[k];
    dist_mesh one;
    dist_mesh_of_rank(&one.d, r, NULL);
    dist_tensor_free(*out), *out = NULL;
    rc = dist_dtensor_from_local(c, name, &pieces[k], dt, ndim, &shapes[k], &one, &rep, out);
  }
  if (rc && n > 1) dist_delete_on(c, name, ranks->ranks, n, later);
  return rc;
}

/* code, after store_seed refused a seed before dist_dtensor_from_local
 * took its op id: an SPMD trainer takes it, and has it aborted on the
 * output's mesh (per rank: nobody waits, as each stores its own piece). */
static int seed_refused(dist_client *c, const slot *local, const dist_tensor *o, int code) {
  if (c->spmd_rank < 0) return code;
  uint64_t id = dist_next_op_id(c);
  return local ? code : dist_spmd_refused_on(c, id, &o->mesh.d);
}

/* A seed given as values or as the loss's 1 (s), stored as a tensor the
 * tape owns, laid out as the output it is the gradient of (s->t, kept by
 * seed): per rank for an exchange's result, else on the output's mesh with
 * its placements. How such a seed is added to another gradient or
 * resharded. */
static int store_seed(dist_tape *t, slot *s) {
  if (s->kind != G_VALUES && s->kind != G_ONES) return 0;
  dist_client *c = t->c;
  const slot *local = dist_tape_find(t->locals, t->n_locals, s->name);
  const dist_tensor *o = &s->t;
  const void *unit = unit_of(o->dtype);
  if (s->kind == G_ONES && (local || !unit || dist_shape_numel(&o->shape) != 1))
    return seed_refused(c, local, o, not_a_scalar(t, s->name));
  int n = c->spmd_rank >= 0 ? 1 : local ? local->ranks.n : o->mesh.d.nranks;
  int ndim = s->kind == G_ONES ? o->shape.ndim : s->values[0].ndim;
  const void *pieces[DIST_MAX_MESH_RANKS];
  const int64_t *shapes[DIST_MAX_MESH_RANKS];
  for (int i = 0; i < n; i++) {
    pieces[i] = s->kind == G_ONES ? unit : s->values[i].data;
    shapes[i] = s->kind == G_ONES ? o->shape.dims : s->values[i].shape;
    if (s->kind == G_VALUES && (s->values[i].dtype != o->dtype || s->values[i].ndim != ndim))
      return seed_refused(c, local, o, dist_client_fail(
          c, DIST_EMISMATCH, "the gradient given for '%s': piece %d is %s with %d dims, the "
          "tensor %s with %d", s->name, i, dist_dtype_name(s->values[i].dtype),
          s->values[i].ndim, dist_dtype_name(o->dtype), ndim));
  }
  char name[NAME_MAX_LEN];
  next_grad_name(t, name);
  dist_tensor *h = NULL;
  dist_mesh mesh = {o->mesh.d};
  int rc = local ? store_per_rank(c, name, pieces, shapes, ndim, o->dtype, &local->ranks, &h,
                                  &t->later)
                 : dist_dtensor_from_local(c, name, pieces, o->dtype, ndim, shapes, &mesh,
                                           o->placements, &h);
  if (rc) {
    dist_errbuf_prefix(&c->err, "storing the gradient given for '%s': ", s->name);
    return rc;
  }
  /* An SPMD trainer outside the output's mesh gave an empty piece, from
   * which dist_dtensor_from_local cannot tell the global shape; the
   * gradient's is the output's. A reshard onto a mesh with this trainer
   * would take the daemons' shape (dist_reshard), but the steps before
   * it, and the gradient of an input whose mesh leaves this trainer out
   * (never resharded onto it), would carry the wrong whole. */
  if (!local && h->no_piece) h->shape = o->shape;
  slot g = made_tensor(t, s->name, h);
  dist_tensor_free(h);
  snprintf(g.name, sizeof g.name, "%s", s->name);
  *s = g;
  return 0;
}

/* Adds g into the gradient slot of name; g is consumed either way. */
static int accumulate(dist_tape *t, const char *name, slot *g) {
  slot *s = slot_of(t, name);
  if (!s) {
    dist_tape_slot_clear(t, g);
    return dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  }
  if (s->kind == G_NONE) {
    *s = *g;
    snprintf(s->name, sizeof s->name, "%s", name);
    return 0;
  }
  slot sum;
  int rc = store_seed(t, s);
  if (rc == 0) rc = store_seed(t, g);
  if (rc == 0) rc = add_tensors(t, s, g, &sum);
  dist_tape_slot_clear(t, g);
  dist_tape_slot_clear(t, s);
  if (rc == 0) {
    *s = sum;
    snprintf(s->name, sizeof s->name, "%s", name);
  }
  return rc;
}

/* ---------------------------------------------------------------- backward */

/* The gradient of an exchange's x: the other exchange, with the same
 * counts, applied to the gradient g of its result. */
static int exchange_back(dist_tape *t, const entry *e, const slot *g) {
  dist_client *c = t->c;
  size_t len = (size_t)e->group_size * (size_t)e->experts;
  const int64_t *lcs[DIST_MAX_MESH_RANKS], *gcs[DIST_MAX_MESH_RANKS];
  const void *xs[DIST_MAX_MESH_RANKS];
  int64_t rows[DIST_MAX_MESH_RANKS];
  char name[NAME_MAX_LEN];
  next_grad_name(t, name);
  dist_moe_opts o = {NULL, name, 1, 1}; /* gradients, not routed tokens */
  for (int k = 0; k < e->parts.n; k++) {
    lcs[k] = e->lc + (size_t)k * len;
    gcs[k] = e->gc + (size_t)k * len;
    if (g->kind == G_VALUES) {
      xs[k] = g->values[k].data;
      rows[k] = g->values[k].ndim ? g->values[k].shape[0] : 0;
    }
  }
  if (g->kind == G_ONES) {
    dist_client_fail(c, DIST_EINVAL, "'%s' is an exchange result: its gradient must be "
                     "given (the loss's 1 is for LocalLayer outputs)", e->y);
    return dist_tape_exchange_refused(c, e->group, e->group_size);
  }
  if (g->kind == G_TENSOR) o.x_name = g->t.name;
  int rc = 0;
  if (e->parts.n == 0) /* outside the group: the other exchange's id, no rows */
    dist_next_op_id(c);
  else /* the name is the tape's: a failure deletes what it kept, though it replaces */
    rc = dist_global_exchange_undoing(
        c, e->kind != SCATTER, g->kind == G_VALUES ? xs : NULL,
        g->kind == G_VALUES ? rows : NULL, e->dt, e->d_model, lcs, gcs, e->experts,
        e->group, e->group_size, &o, &t->later);
  if (rc) {
    dist_errbuf_prefix(&c->err, "backward of %s '%s' -> '%s': ",
                       e->kind == SCATTER ? "global_scatter" : "global_gather",
                       e->x, e->y);
    return rc;
  }
  slot gx = {.kind = G_TENSOR, .owned = 1, .per_rank = 1, .ranks = e->parts};
  snprintf(gx.t.name, sizeof gx.t.name, "%s", name);
  gx.t.dtype = e->dt;
  gx.t.no_piece = e->parts.n == 0;
  return accumulate(t, e->x, &gx);
}

/* Output k's argument of dist_backward from its slot; ones[] has room for
 * the call's ranks (the loss's 1 as per-rank values). */
static int out_grad_arg(dist_tape *t, const entry *e, int k, const slot *s,
                        dist_value *ones, dist_arg *a) {
  *a = (dist_arg){NULL, NULL};
  if (!s || s->kind == G_NONE) return 0;
  if (s->kind == G_VALUES) a->values = s->values;
  if (s->kind == G_TENSOR) a->tensor = &s->t;
  if (s->kind != G_ONES) return 0;
  const dist_tensor *o = &e->outs[k];
  const void *unit = unit_of(o->dtype);
  if (!unit || dist_shape_numel(&o->shape) != 1) return not_a_scalar(t, o->name);
  for (int i = 0; i < e->nranks; i++) {
    ones[i] = (dist_value){unit, o->dtype, o->shape.ndim, {0}};
    memcpy(ones[i].shape, o->shape.dims, sizeof(int64_t) * (size_t)o->shape.ndim);
  }
  a->values = ones;
  return 0;
}

/* The output gradients of a LocalLayer entry; *any is 0 when none has one
 * and *only_loss when the one output is the loss. */
static int layer_out_grads(dist_tape *t, const entry *e, dist_arg *og,
                           dist_value *ones, int *any, int *only_loss) {
  *any = 0;
  for (int k = 0; k < e->n_out; k++) {
    const slot *s = dist_tape_find(t->slots, t->n_slots, e->outs[k].name);
    int rc = out_grad_arg(t, e, k, s, ones + (size_t)k * (size_t)e->nranks, &og[k]);
    if (rc) return rc;
    *any |= s && s->kind != G_NONE;
  }
  const slot *s0 = dist_tape_find(t->slots, t->n_slots, e->outs[0].name);
  *only_loss = e->n_out == 1 && s0 && s0->kind == G_ONES;
  return 0;
}

/* Moves the input gradients dist_backward stored into their slots. */
static int take_input_grads(dist_tape *t, const entry *e, dist_tensor **grads) {
  int rc = 0;
  for (int j = 0; j < e->n_in; j++) {
    if (!grads[j]) continue;
    slot g = made_tensor(t, e->in[j], grads[j]);
    dist_tensor_free(grads[j]);
    grads[j] = NULL;
    if (rc) dist_tape_slot_clear(t, &g);
    else rc = accumulate(t, e->in[j], &g);
  }
  return rc;
}

static int layer_back(dist_tape *t, entry *e) {
  dist_client *c = t->c;
  dist_arg *og = calloc((size_t)e->n_out + 1, sizeof *og);
  dist_value *ones = calloc((size_t)(e->n_out * e->nranks) + 1, sizeof *ones);
  dist_tensor **grads = calloc((size_t)e->n_in + 1, sizeof *grads);
  char (*names)[NAME_MAX_LEN] = calloc((size_t)e->n_in + 1, sizeof *names);
  const char **np = calloc((size_t)e->n_in + 1, sizeof *np);
  int any = 0, only_loss = 0, rc = 0;
  if (!og || !ones || !grads || !names || !np)
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
  if (rc || (rc = layer_out_grads(t, e, og, ones, &any, &only_loss))) {
    dist_backward_refused(c, e->inv); /* the others wait in its vote */
    goto out;
  }
  if (!any) { /* nothing flows back through it */
    rc = dist_invocation_release(c, e->inv);
    goto out;
  }
  for (int j = 0; j < e->n_in; j++) {
    if (e->in[j][0]) next_grad_name(t, names[j]);
    np[j] = names[j];
  }
  dist_backward_opts bo = {np, 1, 0};
  /* A replacing backward keeps what it stored; the names are the tape's,
   * deleted where it applied when it fails. */
  rc = dist_backward_undoing(c, e->inv, only_loss ? NULL : og, &bo, grads, np, &t->later);
  for (int k = 0; k < e->n_out; k++) {
    slot *s = dist_tape_find(t->slots, t->n_slots, e->outs[k].name);
    if (s) dist_tape_slot_clear(t, s);
  }
  if (rc == 0) rc = take_input_grads(t, e, grads);
out:
  for (int j = 0; grads && j < e->n_in; j++) dist_tensor_free(grads[j]);
  free(og), free(ones), free(grads), free(names), free(np);
  return rc;
}

/* g as a tensor the tape owns: the caller's seed is copied (in its own
 * layout) rather than resharded in place. */
static int own_gradient(dist_tape *t, slot *g) {
  if (g->owned) return 0;
  char name[NAME_MAX_LEN];
  dist_tensor *copy = NULL;
  next_grad_name(t, name);
  if (outside_gradient(t, g)) {
    outsider_add(t, &g->t, name, &g->t);
    g->owned = 1;
    return 0;
  }
  int rc = dist_grad_add(t->c, g->t.name, NULL, &g->t.mesh.d, g->t.placements, name, &copy,
                         &t->later);
  if (rc) return rc;
  g->t = *copy;
  g->owned = 1;
  dist_tensor_free(copy);
  return 0;
}

/* The gradient of a reshard's tensor before it: its gradient after,
 * resharded back to the layout before (Paddle's reshard backward). */
static int reshard_back(dist_tape *t, const entry *e) {
  slot *s = dist_tape_find(t->slots, t->n_slots, e->x);
  if (!s || s->kind == G_NONE) return 0;
  int rc = store_seed(t, s);
  if (rc) return rc;
  if (s->per_rank) /* dist_tape_reshard refuses exchanges' tensors */
    return dist_client_fail(t->c, DIST_EINTERNAL, "'%s' was resharded on the tape, but "
                            "its gradient lives per rank", e->x);
  slot g = *s;
  s->kind = G_NONE; /* g now holds it; the slot takes the result below */
  s->owned = 0;
  const dist_tensor *b = &e->before;
  dist_mesh mesh = {b->mesh.d};
  rc = own_gradient(t, &g);
  if (rc == 0)
    rc = dist_reshard(t->c, &g.t, dist_mesh_equal(&g.t.mesh.d, &b->mesh.d) ? NULL : &mesh,
                      b->placements);
  if (rc) {
    dist_errbuf_prefix(&t->c->err, "backward of the reshard of '%s': ", e->x);
    dist_tape_slot_clear(t, &g);
    return rc;
  }
  return accumulate(t, e->x, &g);
}

static int entry_back(dist_tape *t, entry *e) {
  if (e->kind == LAYER) return layer_back(t, e);
  if (e->kind == RESHARD) return reshard_back(t, e);
  slot *s = dist_tape_find(t->slots, t->n_slots, e->y);
  if (!s || s->kind == G_NONE) return 0;
  slot g = *s;
  s->kind = G_NONE; /* g now holds it */
  int rc = exchange_back(t, e, &g);
  dist_tape_slot_clear(t, &g);
  return rc;
}

/* Whether the tape produced a tensor of this name. */
static int produced(const dist_tape *t, const char *name) {
  for (int i = 0; i < t->n_entries; i++) {
    const entry *e = &t->entries[i];
    if (e->kind != LAYER && strcmp(e->y, name) == 0) return 1;
    for (int k = 0; e->kind == LAYER && k < e->n_out; k++)
      if (strcmp(e->outs[k].name, name) == 0) return 1;
  }
  return 0;
}

static int seed(dist_tape *t, const dist_tensor *out, const dist_arg *g) {
  if (!out || !produced(t, out->name))
    return dist_client_fail(t->c, DIST_EINVAL, "backward from '%s', which no "
                            "operation on the tape produced",
                            out ? out->name : "(null)");
  slot *s = slot_of(t, out->name);
  if (!s) return dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  if (s->kind != G_NONE)
    return dist_client_fail(t->c, DIST_EINVAL, "'%s' is given two gradients",
                            out->name);
  if (!g) {
    s->kind = G_ONES;
  } else if (g->tensor) {
    s->kind = G_TENSOR;
    s->t = *g->tensor;
    const slot *local = dist_tape_find(t->locals, t->n_locals, out->name);
    s->per_rank = local != NULL;
    if (local) s->ranks = local->ranks;
  } else if (g->values) {
    s->kind = G_VALUES;
    s->values = g->values;
  }
  if (s->kind != G_TENSOR) s->t = *out; /* the layout store_seed gives it */
  return 0;
}

/* Drops every gradient (after a failed backward: they are incomplete). */
static void clear_all(dist_tape *t) {
  for (int i = 0; i < t->n_slots; i++) dist_tape_slot_clear(t, &t->slots[i]);
}

/* How many per-rank values a single client's seed for out is read as: one
 * per daemon holding a piece (an exchange's ranks, or out's mesh:
 * store_seed reads these), or per rank of the LocalLayer call that made out
 * (its dist_backward reads these), whichever is more. */
static int seed_nvalues(dist_tape *t, const dist_tensor *out) {
  const slot *local = dist_tape_find(t->locals, t->n_locals, out->name);
  int n = local ? local->ranks.n : out->mesh.d.nranks;
  for (int i = 0; i < t->n_entries; i++) {
    const entry *e = &t->entries[i];
    for (int k = 0; e->kind == LAYER && k < e->n_out; k++)
      if (strcmp(e->outs[k].name, out->name) == 0 && e->nranks > n) n = e->nranks;
  }
  return n;
}

/* outputs and grads, read entry by entry before anything is sent or the
 * tape marked done, so that a refusal leaves the tape as it was; before,
 * a value without data was first refused by whichever step read it, after
 * the steps before it had run in the daemons. An SPMD trainer's values are
 * left to that step, which aborts the rest of the backward on the other
 * trainers (backward_failed), as a refusal here aborts all of it. */
static int check_backward_args(dist_tape *t, const dist_tensor *const *outputs,
                               const dist_arg *grads, int n) {
  const char *func = "dist_tape_backward";
  if (n < 1)
    return dist_client_fail(t->c, DIST_EINVAL, "%s: needs at least one output (n is %d)",
                            func, n);
  if (!outputs)
    return dist_client_fail(t->c, DIST_EINVAL, "%s: outputs is NULL with %d entries", func, n);
  for (int i = 0; i < n; i++) {
    if (!outputs[i])
      return dist_client_fail(t->c, DIST_EINVAL, "%s: outputs[%d] is NULL", func, i);
    if (!grads || grads[i].tensor || t->c->spmd_rank >= 0)
      continue; /* a stored gradient is the daemons' to check; SPMD: above */
    int rc = dist_check_arg_values(t->c, func, "grads", i, grads[i].values,
                                   seed_nvalues(t, outputs[i]));
    if (rc) return rc;
  }
  return 0;
}

/* c->err's code, after an SPMD trainer refused or failed a backward whose
 * plan is the op ids first to last, at entry upto (the last entry before
 * its walk). The other trainers may wait at any step this trainer has not
 * run, and which step depends on their seeds: so each LocalLayer call's
 * backward not behind it (under its invocation's id) and every id of the
 * plan from the one it failed at are aborted, on every daemon, as a step
 * may not involve this trainer's; then it takes the rest of the plan, as
 * the others do. The ids go in one OpAbort (dist_spmd_refused_range):
 * the daemons remember them as one range, with each id's vote and reshard
 * steps. */
static int backward_failed(dist_tape *t, uint64_t first, uint64_t last, int upto) {
  dist_client *c = t->c;
  if (c->spmd_rank < 0) return c->err.code;
  uint64_t from = dist_last_op_id(c);
  if (from < first) from = first;
  dist_take_ids_through(c, last);
  dist_spmd_refused_range(c, from, last);
  for (int i = upto; i >= 0; i--)
    if (t->entries[i].kind == LAYER) dist_backward_refused(c, t->entries[i].inv);
  return c->err.code;
}

/* 0, after a backward that ran: an SPMD trainer takes the rest of its
 * plan. One that took more would abort too few ids when it refuses. */
static int plan_kept(dist_tape *t, uint64_t last) {
  dist_client *c = t->c;
  if (c->spmd_rank < 0) return 0;
  if (dist_last_op_id(c) > last)
    return dist_client_fail(c, DIST_EINTERNAL, "the tape's backward took op ids through "
                            "%llu, past the %llu it planned",
                            (unsigned long long)dist_last_op_id(c), (unsigned long long)last);
  dist_take_ids_through(c, last);
  return 0;
}

/* The walk, newest entry first; *at gets the entry it failed at. */
static int walk(dist_tape *t, int *at) {
  int rc = 0;
  for (*at = t->n_entries - 1; *at >= 0; --*at)
    if ((rc = entry_back(t, &t->entries[*at]))) return rc;
  return 0;
}

int dist_tape_backward(dist_tape *t, const dist_tensor *const *outputs,
                       const dist_arg *grads, int n) {
  if (!t) return dist_null_handle(__func__, "t");
  dist_client *c = t->c;
  uint64_t first = dist_last_op_id(c) + 1;
  int plan = c->spmd_rank >= 0 ? dist_tape_plan_ids(t) : 0;
  uint64_t last = first + (uint64_t)plan - 1;
  int rc = dist_tape_usable(t, "backward");
  if (rc == 0) rc = check_backward_args(t, outputs, grads, n);
  if (rc) return backward_failed(t, first, last, t->n_entries - 1);
  t->done = 1;
  int at = t->n_entries - 1;
  for (int i = 0; rc == 0 && i < n; i++)
    rc = seed(t, outputs[i], grads ? &grads[i] : NULL);
  if (rc == 0) rc = walk(t, &at);
  if (rc == 0) rc = plan_kept(t, last);
  if (rc) {
    backward_failed(t, first, last, at);
    dist_errbuf keep = c->err;
    clear_all(t);
    dist_tape_release(t);
    c->err = keep;
  }
  return rc;
}

static const slot *grad_slot(dist_tape *t, const char *name) {
  const slot *s = name ? dist_tape_find(t->slots, t->n_slots, name) : NULL;
  if (s && s->kind == G_TENSOR) return s;
  dist_client_fail(t->c, DIST_ENOTFOUND, "the tape has no gradient of '%s'%s",
                   name ? name : "(null)",
                   t->done ? "" : " (backward has not run)");
  return NULL;
}

int dist_tape_grad(dist_tape *t, const char *name, dist_tensor **out) {
  if (!t) return dist_null_handle(__func__, "t");
  if (DIST_NEED(t->c, out)) return t->c->err.code;
  *out = NULL;
  const slot *s = grad_slot(t, name);
  if (!s) return DIST_ENOTFOUND;
  if (!(*out = malloc(sizeof **out)))
    return dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  **out = s->t;
  return 0;
}

int dist_tape_grad_local(dist_tape *t, const char *name, int rank, void **data,
                         size_t *nbytes, int64_t *shape) {
  if (!t) return dist_null_handle(__func__, "t");
  if (DIST_NEED(t->c, data)) return t->c->err.code;
  *data = NULL;
  const slot *s = grad_slot(t, name);
  if (!s) return DIST_ENOTFOUND;
  return dist_dtensor_to_local(t->c, &s->t, rank, data, nbytes, shape);
}
