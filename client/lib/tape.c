/* The tape: libdist's reverse-mode walk over global_scatter, global_gather,
 * LocalLayer calls and reshards (dist.h, "Tape").
 *
 * Recording runs each operation and remembers what its backward needs: the
 * names of its input and output tensors, the counts of an exchange, the
 * invocation of a LocalLayer. Backward keeps one gradient slot per tensor
 * name and visits the entries newest first. At an entry, the gradients of
 * its outputs are complete (every consumer came later on the tape), so it
 * takes them, clears their slots (an earlier entry that read an older tensor
 * of the same name accumulates into a fresh slot), computes its inputs'
 * gradients and adds them into their slots. Recording is here; the gradient
 * slots and the backward walk are in tape_backward.c. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "process_token.h"
#include "tape_internal.h"

/* Counts this process's tapes; with its token, names each tape apart from
 * every other tape on the daemons. */
static atomic_uint_fast64_t tape_serial;
_Static_assert(sizeof ((dist_tape *)0)->prefix >= sizeof "tape" + DIST_PROCESS_TOKEN_LEN +
                                                     sizeof ".18446744073709551615" - 1,
               "a tape's prefix holds its token and any serial");

/* ---------------------------------------------------------------- basics */

int dist_tape_new(dist_client *c, dist_tape **out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out)) return c->err.code;
  *out = NULL;
  char token[DIST_PROCESS_TOKEN_LEN + 1];
  if (dist_process_token(c, token) != 0) return c->err.code;
  dist_tape *t = calloc(1, sizeof *t);
  if (!t) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  t->c = c;
  snprintf(t->prefix, sizeof t->prefix, "tape%s.%llu", token,
           (unsigned long long)atomic_fetch_add(&tape_serial, 1));
  *out = t;
  return 0;
}

int dist_tape_reserve(void **arr, int *cap, int n, size_t elem) {
  if (n < *cap) return 0;
  int nc = *cap ? *cap * 2 : 8;
  void *q = realloc(*arr, (size_t)nc * elem);
  if (!q) return DIST_ENOMEM;
  memset((char *)q + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
  *arr = q;
  *cap = nc;
  return 0;
}

int dist_tape_usable(dist_tape *t, const char *what) {
  if (t->released)
    return dist_client_fail(t->c, DIST_EINVAL, "%s: the tape was released", what);
  if (t->done)
    return dist_client_fail(t->c, DIST_EINVAL, "%s: the tape was already "
                            "backpropagated (a tape runs backward once)", what);
  return 0;
}

static int copy_name(dist_client *c, char *dst, const char *src,
                     const char *what) {
  if (!src || !src[0])
    return dist_client_fail(c, DIST_EINVAL, "the tape needs a name for %s", what);
  if (strlen(src) >= NAME_MAX_LEN)
    return dist_client_fail(c, DIST_EINVAL, "%s name '%.40s...' is too long", what, src);
  snprintf(dst, NAME_MAX_LEN, "%s", src);
  return 0;
}

slot *dist_tape_find(slot *s, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(s[i].name, name) == 0) return &s[i];
  return NULL;
}

/* Empties a slot, deleting the tensor when the tape made it; a delete not
 * done that may be later goes on the client's list, which outlives the
 * tape (its next undo point retries it). */
void dist_tape_slot_clear(dist_tape *t, slot *s) {
  dist_later *later = &t->c->later; /* this process's names (dist_later_of_made_up) */
  if (s->kind == G_TENSOR && s->owned) {
    if (s->per_rank) {
      dist_delete_on(t->c, s->t.name, s->ranks.ranks, s->ranks.n, later);
    } else {
      int targets[DIST_MAX_MESH_RANKS];
      int n = dist_targets(t->c, &s->t.mesh.d, targets);
      if (n > 0) dist_delete_on(t->c, s->t.name, targets, n, later);
    }
  }
  s->kind = G_NONE;
  s->values = NULL;
  s->owned = 0;
}

static void entry_free(entry *e) {
  free(e->lc);
  free(e->gc);
  dist_invocation_free(e->inv);
  free(e->in);
  free(e->outs);
}

int dist_tape_release(dist_tape *t) {
  if (!t || t->released) return 0;
  int rc = 0;
  for (int i = 0; i < t->n_entries; i++) {
    int r = dist_invocation_release(t->c, t->entries[i].inv);
    if (r && !rc) rc = r;
  }
  t->released = 1;
  return rc;
}

void dist_tape_free(dist_tape *t) {
  if (!t) return;
  dist_errbuf keep = t->c->err;
  dist_tape_release(t);
  for (int i = 0; i < t->n_slots; i++) dist_tape_slot_clear(t, &t->slots[i]);
  for (int i = 0; i < t->n_entries; i++) entry_free(&t->entries[i]);
  dist_later_undo(t->c, &t->later);
  /* what its daemons did not let it undo outlives the tape */
  dist_later_hand_over(t->c, &t->later, &t->c->later);
  t->c->err = keep;
  free(t->entries);
  free(t->slots);
  free(t->locals);
  free(t->plan_room);
  free(t);
}

/* ---------------------------------------------------------------- recording */

/* Room for one more entry, and its x and y in the plan. */
static entry *new_entry(dist_tape *t) {
  if (dist_tape_reserve((void **)&t->entries, &t->cap_entries, t->n_entries, sizeof *t->entries) ||
      dist_tape_plan_reserve(t, 2))
    return NULL;
  entry *e = &t->entries[t->n_entries];
  memset(e, 0, sizeof *e);
  return e;
}

/* Remembers that name's pieces live per rank on these daemons. */
static int note_local(dist_tape *t, const char *name, const rank_set *ranks) {
  slot *s = dist_tape_find(t->locals, t->n_locals, name);
  if (!s) {
    if (dist_tape_reserve((void **)&t->locals, &t->cap_locals, t->n_locals, sizeof *t->locals))
      return DIST_ENOMEM;
    s = &t->locals[t->n_locals++];
    snprintf(s->name, sizeof s->name, "%s", name);
  }
  s->ranks = *ranks;
  return 0;
}

/* The daemons this client drives in an exchange over group (every rank it
 * reaches when NULL), in group order: all of it (single client) or this
 * trainer's rank (SPMD); none for an SPMD trainer outside the group,
 * whose exchange is a no-op that still takes its op id (spmd_outside.c),
 * as is its backward. The exchange itself checks the group's reach. */
static int exchange_parts(dist_client *c, const dist_tape_exchange *a,
                          entry *e) {
  int n = a->group ? a->group_size : c->n;
  if (n < 1 || n > DIST_MAX_MESH_RANKS)
    return dist_client_fail(c, DIST_EINVAL, "group of %d ranks", n);
  e->group_size = n;
  for (int i = 0; i < n; i++) {
    e->group[i] = a->group ? a->group[i] : dist_reached_rank(c, i);
    if (c->spmd_rank < 0 || e->group[i] == c->spmd_rank)
      e->parts.ranks[e->parts.n++] = e->group[i];
  }
  return 0;
}

/* How many entries of the exchange's per-rank arrays this client gives:
 * one per daemon it drives, and an outsider's own one, checked as a
 * member checks its own. */
static int own_entries(const entry *e) { return e->parts.n ? e->parts.n : 1; }

static int64_t *copy_counts(const int64_t *const *v, int n, size_t len) {
  int64_t *d = malloc(sizeof(int64_t) * ((size_t)n * len + 1));
  for (int k = 0; d && k < n; k++) memcpy(d + (size_t)k * len, v[k], sizeof(int64_t) * len);
  return d;
}

static int fill_exchange(dist_tape *t, const char *func, const dist_tape_exchange *a,
                         entry *e) {
  dist_client *c = t->c;
  int rc = copy_name(c, e->x, a->x_name, "x (x_name)");
  if (!rc) rc = copy_name(c, e->y, a->out_name, "the result (out_name)");
  if (!rc) rc = exchange_parts(c, a, e);
  if (rc) return rc;
  if (!a->local_count || !a->global_count || a->n_experts < 1 || a->d_model < 1)
    return dist_client_fail(c, DIST_EINVAL, "an exchange on a tape needs both "
                            "counts, n_experts >= 1 and d_model >= 1");
  /* copy_counts reads these before dist_global_scatter checks them */
  for (int k = 0; k < own_entries(e); k++)
    if (!a->local_count[k] || !a->global_count[k])
      return dist_client_fail(c, DIST_EINVAL, "%s: %s[%d] is NULL", func,
                              a->local_count[k] ? "global_count" : "local_count", k);
  size_t len = (size_t)e->group_size * (size_t)a->n_experts;
  e->dt = a->dtype;
  e->d_model = a->d_model;
  e->experts = a->n_experts;
  e->lc = copy_counts(a->local_count, e->parts.n, len);
  e->gc = copy_counts(a->global_count, e->parts.n, len);
  if (!e->lc || !e->gc) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  return 0;
}

/* The handle of an exchange result: its name on the first daemon's one-rank
 * mesh (the only thing a LocalLayer argument needs is the name). An
 * outsider's has no piece (0 rows), on the group's first rank's mesh. */
static dist_tensor *result_handle(const entry *e, int64_t rows) {
  dist_tensor *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  snprintf(h->name, sizeof h->name, "%s", e->y);
  h->dtype = e->dt;
  h->shape = (dist_shape){2, {rows, e->d_model}};
  h->no_piece = e->parts.n == 0;
  dist_mesh_of_rank(&h->mesh.d, h->no_piece ? e->group[0] : e->parts.ranks[0], NULL);
  h->placements[0] = DIST_REPLICATED;
  return h;
}

/* c->err's code, after the tape refused an exchange over group[0..size)
 * before dist_global_scatter (or gather) took its op id: an SPMD trainer
 * takes it and has it aborted on the group's other daemons, as the
 * exchange does when it refuses, so that their trainers fail at once and
 * the op ids stay in step (a trainer outside the group takes it only). */
int dist_tape_exchange_refused(dist_client *c, const int *group, int size) {
  if (c->spmd_rank < 0) return c->err.code;
  return dist_spmd_refused_group(c, dist_next_op_id(c), group, size);
}

/* The tape's own checks of an exchange, into a new entry *e (not yet
 * counted; freed by the caller). */
static int check_exchange(dist_tape *t, entry_kind kind, const dist_tape_exchange *a,
                          entry **e) {
  const char *func = kind == SCATTER ? "dist_tape_global_scatter" : "dist_tape_global_gather";
  int rc = dist_tape_usable(t, kind == SCATTER ? "global_scatter" : "global_gather");
  if (rc) return rc;
  if (!a) return dist_client_null_arg(t->c, func, "a");
  if (!(*e = new_entry(t))) return dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  (*e)->kind = kind;
  return fill_exchange(t, func, a, *e);
}

static int record_exchange(dist_tape *t, entry_kind kind,
                           const dist_tape_exchange *a, dist_tensor **out,
                           int64_t *out_rows) {
  if (out) *out = NULL;
  entry *e = NULL;
  int rc = check_exchange(t, kind, a, &e);
  if (rc) {
    if (e) entry_free(e);
    return dist_tape_exchange_refused(t->c, a ? a->group : NULL, a ? a->group_size : 0);
  }
  int64_t rows[DIST_MAX_MESH_RANKS] = {0};
  dist_moe_opts o = {a->x ? NULL : e->x, e->y, a->replace, 0};
  rc = (kind == SCATTER ? dist_global_scatter : dist_global_gather)(
      t->c, a->x, a->x_rows, a->dtype, a->d_model, a->local_count,
      a->global_count, a->n_experts, a->group, a->group_size, &o, NULL, rows);
  if (!rc && (note_local(t, e->y, &e->parts) || note_local(t, e->x, &e->parts)))
    rc = dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  if (!rc && out && !(*out = result_handle(e, rows[0])))
    rc = dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  if (rc) {
    entry_free(e);
    return rc;
  }
  if (out_rows) memcpy(out_rows, rows, sizeof(int64_t) * (size_t)own_entries(e));
  t->n_entries++;
  return 0;
}

int dist_tape_global_scatter(dist_tape *t, const dist_tape_exchange *a,
                             dist_tensor **out, int64_t *out_rows) {
  if (!t) return dist_null_handle(__func__, "t");
  return record_exchange(t, SCATTER, a, out, out_rows);
}

int dist_tape_global_gather(dist_tape *t, const dist_tape_exchange *a,
                            dist_tensor **out, int64_t *out_rows) {
  if (!t) return dist_null_handle(__func__, "t");
  return record_exchange(t, GATHER, a, out, out_rows);
}

static int fill_layer(dist_tape *t, entry *e, const dist_program *p,
                      const dist_arg *args, int nargs, dist_tensor **outs) {
  e->kind = LAYER;
  e->nranks = t->c->spmd_rank >= 0 ? 1 : dist_program_nranks(p);
  e->n_in = nargs;
  e->n_out = dist_invocation_n_outputs(e->inv);
  e->in = calloc((size_t)nargs + 1, sizeof *e->in);
  e->outs = calloc((size_t)e->n_out + 1, sizeof *e->outs);
  if (!e->in || !e->outs || dist_tape_plan_reserve(t, nargs + e->n_out))
    return dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  for (int j = 0; j < nargs; j++)
    if (args[j].tensor) snprintf(e->in[j], NAME_MAX_LEN, "%s", args[j].tensor->name);
  for (int k = 0; k < e->n_out; k++) e->outs[k] = *outs[k];
  return 0;
}

int dist_tape_local_layer_call(dist_tape *t, dist_program *p,
                               const dist_arg *args, int nargs,
                               const dist_call_opts *opts, dist_tensor **outs) {
  if (!t) return dist_null_handle(__func__, "t");
  int rc = dist_tape_usable(t, "LocalLayer call");
  if (!rc && !outs)
    rc = dist_client_fail(t->c, DIST_EINVAL, "%s: outs is NULL (a LocalLayer call on "
                          "a tape needs outs)", __func__);
  entry *e = rc ? NULL : new_entry(t);
  if (!rc && !e) rc = dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  if (rc) return dist_local_layer_refused(t->c, p);
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  if (opts) o = *opts;
  o.no_grad = 0; /* the tape runs its backward */
  rc = dist_local_layer_call(t->c, p, args, nargs, &o, &e->inv, outs);
  if (rc == 0) rc = fill_layer(t, e, p, args, nargs, outs);
  if (rc) { /* undone as the call undoes itself: the invocation released,
              * its outputs deleted (unless the call keeps them), the error
              * kept */
    dist_errbuf keep = t->c->err;
    dist_invocation_release(t->c, e->inv);
    for (int k = 0; e->inv && k < dist_invocation_n_outputs(e->inv); k++) {
      if (outs[k] && !dist_local_layer_keeps_failed_outputs(&o))
        dist_tensor_delete_handle(t->c, outs[k]);
      dist_tensor_free(outs[k]), outs[k] = NULL;
    }
    t->c->err = keep;
    entry_free(e);
    return rc;
  }
  t->n_entries++;
  return 0;
}

int dist_tape_reshard(dist_tape *t, dist_tensor *x, const dist_mesh *mesh,
                      const dist_placement *placements) {
  if (!t) return dist_null_handle(__func__, "t");
  /* No op id without x, as in dist_reshard: no mesh to tell. */
  if (!x) return dist_client_fail(t->c, DIST_EINVAL, "reshard on a tape needs a tensor");
  int rc = dist_tape_usable(t, "reshard");
  if (!rc && dist_tape_find(t->locals, t->n_locals, x->name))
    rc = dist_client_fail(t->c, DIST_EINVAL, "'%s' lives per rank (an exchange on "
                          "the tape read or wrote it): it has no layout to reshard",
                          x->name);
  entry *e = rc ? NULL : new_entry(t);
  if (!rc && !e) rc = dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  if (rc) return dist_reshard_refused(t->c, x, mesh);
  e->kind = RESHARD;
  e->before = *x;
  snprintf(e->x, sizeof e->x, "%s", x->name);
  snprintf(e->y, sizeof e->y, "%s", x->name);
  if ((rc = dist_reshard(t->c, x, mesh, placements))) return rc;
  t->n_entries++;
  return 0;
}
