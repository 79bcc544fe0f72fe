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
 * gradients and adds them into their slots.
 *
 * Gradients are tensors the daemons hold, named "tape<pid>.<serial>.g<k>";
 * only seeds given as bytes travel through the client. An exchange's
 * gradient lives per rank: each daemon of the group holds its own rows
 * under the name on a one-rank mesh, as a kept exchange result does. Two
 * gradients of one tensor are added in the daemons by a one-op LocalLayer
 * program. A reshard changes a tensor's layout under the same name, so its
 * backward takes the name's gradient, reshards it to the layout before and
 * files it again under the name, for the entries before it. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"

#define NAME_MAX_LEN 256

typedef enum { SCATTER, GATHER, LAYER, RESHARD } entry_kind;

/* Ranks whose daemons each hold their own piece under one name. */
typedef struct rank_set {
  int n;
  int ranks[DIST_MAX_MESH_RANKS];
} rank_set;

typedef struct entry {
  entry_kind kind;
  /* exchanges: x -> y; a reshard: x = y, the tensor it changed */
  char x[NAME_MAX_LEN], y[NAME_MAX_LEN];
  dist_tensor before; /* a reshard: the tensor's handle before it */
  dist_dtype dt;
  int64_t d_model;
  int experts, group_size;
  int group[DIST_MAX_MESH_RANKS];
  rank_set parts;      /* the daemons this client drove, in group order */
  int64_t *lc, *gc;    /* parts.n arrays of group_size * experts counts */
  /* LocalLayer */
  dist_invocation *inv;
  int nranks;                /* daemons of the call (VALUE order) */
  int n_in, n_out;
  char (*in)[NAME_MAX_LEN];  /* "" for non-tensor arguments */
  dist_tensor *outs;         /* copies of the output handles */
} entry;

typedef enum { G_NONE, G_ONES, G_VALUES, G_TENSOR } grad_kind;

/* The gradient of one tensor name. */
typedef struct slot {
  char name[NAME_MAX_LEN];
  grad_kind kind;
  const dist_value *values; /* G_VALUES: the caller's, during backward */
  dist_tensor t;            /* G_TENSOR: its name, and mesh when not per rank */
  int per_rank;             /* G_TENSOR: one piece per daemon of ranks */
  rank_set ranks;
  int owned;                /* G_TENSOR made by the tape: delete when done */
} slot;

struct dist_tape {
  dist_client *c;
  char prefix[64];
  uint64_t next_grad;
  entry *entries;
  int n_entries, cap_entries;
  slot *slots;
  int n_slots, cap_slots;
  /* Names the tape's exchanges read or wrote: their pieces are per rank. */
  slot *locals;
  int n_locals, cap_locals;
  int done;     /* backpropagated (or tried to) */
  int released;
};

static atomic_uint_fast64_t tape_serial;

/* ---------------------------------------------------------------- basics */

int dist_tape_new(dist_client *c, dist_tape **out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out)) return c->err.code;
  dist_tape *t = calloc(1, sizeof *t);
  *out = NULL;
  if (!t) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  t->c = c;
  snprintf(t->prefix, sizeof t->prefix, "tape%ld.%llu", (long)getpid(),
           (unsigned long long)atomic_fetch_add(&tape_serial, 1));
  *out = t;
  return 0;
}

static int reserve(void **arr, int *cap, int n, size_t elem) {
  if (n < *cap) return 0;
  int nc = *cap ? *cap * 2 : 8;
  void *q = realloc(*arr, (size_t)nc * elem);
  if (!q) return DIST_ENOMEM;
  memset((char *)q + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
  *arr = q;
  *cap = nc;
  return 0;
}

static int usable(dist_tape *t, const char *what) {
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

static slot *find(slot *s, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(s[i].name, name) == 0) return &s[i];
  return NULL;
}

/* Deletes name on the given daemons, best effort (keeps c's error). */
static void delete_on(dist_client *c, const char *name, const int *ranks,
                      int n) {
  dist_errbuf keep = c->err;
  for (int i = 0; i < n; i++) {
    Dist__V1__TensorDeleteRequest rq = DIST__V1__TENSOR_DELETE_REQUEST__INIT;
    ProtobufCMessage *rp = NULL;
    rq.name = (char *)name;
    dist_call_one(c, ranks[i], "/dist.v1.Dist/TensorDelete", &rq.base,
                  &dist__v1__tensor_delete_reply__descriptor, &rp);
    if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  }
  c->err = keep;
}

/* Empties a slot, deleting the tensor when the tape made it. */
static void slot_clear(dist_tape *t, slot *s) {
  if (s->kind == G_TENSOR && s->owned) {
    if (s->per_rank) {
      delete_on(t->c, s->t.name, s->ranks.ranks, s->ranks.n);
    } else {
      int targets[DIST_MAX_MESH_RANKS];
      int n = dist_targets(t->c, &s->t.mesh.d, targets);
      if (n > 0) delete_on(t->c, s->t.name, targets, n);
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
  for (int i = 0; i < t->n_slots; i++) slot_clear(t, &t->slots[i]);
  for (int i = 0; i < t->n_entries; i++) entry_free(&t->entries[i]);
  t->c->err = keep;
  free(t->entries);
  free(t->slots);
  free(t->locals);
  free(t);
}

/* ---------------------------------------------------------------- recording */

static entry *new_entry(dist_tape *t) {
  if (reserve((void **)&t->entries, &t->cap_entries, t->n_entries, sizeof *t->entries))
    return NULL;
  entry *e = &t->entries[t->n_entries];
  memset(e, 0, sizeof *e);
  return e;
}

/* Remembers that name's pieces live per rank on these daemons. */
static int note_local(dist_tape *t, const char *name, const rank_set *ranks) {
  slot *s = find(t->locals, t->n_locals, name);
  if (!s) {
    if (reserve((void **)&t->locals, &t->cap_locals, t->n_locals, sizeof *t->locals))
      return DIST_ENOMEM;
    s = &t->locals[t->n_locals++];
    snprintf(s->name, sizeof s->name, "%s", name);
  }
  s->ranks = *ranks;
  return 0;
}

/* The daemons this client drives in an exchange over group, in group
 * order: all of it (single client) or this trainer's rank (SPMD). */
static int exchange_parts(dist_client *c, const dist_tape_exchange *a,
                          entry *e) {
  int n = a->group ? a->group_size : c->n;
  if (n < 1 || n > DIST_MAX_MESH_RANKS)
    return dist_client_fail(c, DIST_EINVAL, "group of %d ranks", n);
  e->group_size = n;
  for (int i = 0; i < n; i++) {
    e->group[i] = a->group ? a->group[i] : i;
    if (c->spmd_rank < 0 || e->group[i] == c->spmd_rank)
      e->parts.ranks[e->parts.n++] = e->group[i];
  }
  if (e->parts.n == 0)
    return dist_client_fail(c, DIST_EINVAL, "this trainer (rank %d) is not in "
                            "the group", c->spmd_rank);
  return 0;
}

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
  for (int k = 0; k < e->parts.n; k++)
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
 * mesh (the only thing a LocalLayer argument needs is the name). */
static dist_tensor *result_handle(const entry *e, int64_t rows) {
  dist_tensor *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  snprintf(h->name, sizeof h->name, "%s", e->y);
  h->dtype = e->dt;
  h->shape = (dist_shape){2, {rows, e->d_model}};
  dist_mesh_of_rank(&h->mesh.d, e->parts.ranks[0], NULL);
  h->placements[0] = DIST_REPLICATED;
  return h;
}

/* c->err's code, after the tape refused an exchange over group[0..size)
 * before dist_global_scatter (or gather) took its op id: an SPMD trainer
 * takes it and has it aborted on the group's other daemons, as the
 * exchange does when it refuses, so that their trainers fail at once and
 * the op ids stay in step (a trainer outside the group takes it only). */
static int exchange_refused(dist_client *c, const int *group, int size) {
  if (c->spmd_rank < 0) return c->err.code;
  return dist_spmd_refused_group(c, dist_next_op_id(c), group, size);
}

/* The tape's own checks of an exchange, into a new entry *e (not yet
 * counted; freed by the caller). */
static int check_exchange(dist_tape *t, entry_kind kind, const dist_tape_exchange *a,
                          entry **e) {
  const char *func = kind == SCATTER ? "dist_tape_global_scatter" : "dist_tape_global_gather";
  int rc = usable(t, kind == SCATTER ? "global_scatter" : "global_gather");
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
    return exchange_refused(t->c, a ? a->group : NULL, a ? a->group_size : 0);
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
  if (out_rows) memcpy(out_rows, rows, sizeof(int64_t) * (size_t)e->parts.n);
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
  if (!e->in || !e->outs) return dist_client_fail(t->c, DIST_ENOMEM, "out of memory");
  for (int j = 0; j < nargs; j++)
    if (args[j].tensor) snprintf(e->in[j], NAME_MAX_LEN, "%s", args[j].tensor->name);
  for (int k = 0; k < e->n_out; k++) e->outs[k] = *outs[k];
  return 0;
}

int dist_tape_local_layer_call(dist_tape *t, dist_program *p,
                               const dist_arg *args, int nargs,
                               const dist_call_opts *opts, dist_tensor **outs) {
  if (!t) return dist_null_handle(__func__, "t");
  int rc = usable(t, "LocalLayer call");
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
  if (rc) {
    dist_invocation_release(t->c, e->inv);
    for (int k = 0; e->inv && k < dist_invocation_n_outputs(e->inv); k++)
      dist_tensor_free(outs[k]), outs[k] = NULL;
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
  int rc = usable(t, "reshard");
  if (!rc && find(t->locals, t->n_locals, x->name))
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

/* ---------------------------------------------------------------- gradients */

static void next_grad_name(dist_tape *t, char *buf) {
  snprintf(buf, NAME_MAX_LEN, "%s.g%llu", t->prefix,
           (unsigned long long)t->next_grad++);
}

static slot *slot_of(dist_tape *t, const char *name) {
  slot *s = find(t->slots, t->n_slots, name);
  if (s) return s;
  if (reserve((void **)&t->slots, &t->cap_slots, t->n_slots, sizeof *t->slots))
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
  const slot *local = find(t->locals, t->n_locals, of);
  if (local) {
    g.per_rank = 1;
    g.ranks = local->ranks;
  }
  return g;
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
  if (acc->per_rank || more->per_rank) {
    sum->per_rank = 1;
    sum->ranks = acc->per_rank ? acc->ranks : more->ranks;
    dist_placement rep = DIST_REPLICATED;
    for (int i = 0; rc == 0 && i < sum->ranks.n; i++) {
      dist_mesh_desc one;
      dist_mesh_of_rank(&one, sum->ranks.ranks[i], NULL);
      rc = dist_grad_add(c, acc->t.name, more->t.name, &one, &rep, name, &out);
      dist_tensor_free(out), out = NULL;
    }
  } else {
    rc = dist_grad_sum(c, acc->name, &acc->t, &more->t, name, &out);
    if (rc == 0) sum->t = *out;
    dist_tensor_free(out);
  }
  snprintf(sum->t.name, sizeof sum->t.name, "%s", name);
  if (rc && sum->per_rank) delete_on(c, name, sum->ranks.ranks, sum->ranks.n);
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
 * each on its own daemon's one-rank mesh, as an exchange result lives. */
static int store_per_rank(dist_client *c, const char *name, const void *const *pieces,
                          const int64_t *const *shapes, int ndim, dist_dtype dt,
                          const rank_set *ranks, dist_tensor **out) {
  dist_placement rep = DIST_REPLICATED;
  int n = c->spmd_rank >= 0 ? 1 : ranks->n, rc = 0;
  for (int k = 0; rc == 0 && k < n; k++) {
    int r = c->spmd_rank >= 0 ? c->spmd_rank : ranks->ranks[k];
    dist_mesh one;
    dist_mesh_of_rank(&one.d, r, NULL);
    dist_tensor_free(*out), *out = NULL;
    rc = dist_dtensor_from_local(c, name, &pieces[k], dt, ndim, &shapes[k], &one, &rep, out);
  }
  if (rc && n > 1) delete_on(c, name, ranks->ranks, n);
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
  const slot *local = find(t->locals, t->n_locals, s->name);
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
  int rc = local ? store_per_rank(c, name, pieces, shapes, ndim, o->dtype, &local->ranks, &h)
                 : dist_dtensor_from_local(c, name, pieces, o->dtype, ndim, shapes, &mesh,
                                           o->placements, &h);
  if (rc) {
    dist_errbuf_prefix(&c->err, "storing the gradient given for '%s': ", s->name);
    return rc;
  }
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
    slot_clear(t, g);
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
  slot_clear(t, g);
  slot_clear(t, s);
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
    return exchange_refused(c, e->group, e->group_size);
  }
  if (g->kind == G_TENSOR) o.x_name = g->t.name;
  int rc = (e->kind == SCATTER ? dist_global_gather : dist_global_scatter)(
      c, g->kind == G_VALUES ? xs : NULL, g->kind == G_VALUES ? rows : NULL,
      e->dt, e->d_model, lcs, gcs, e->experts, e->group, e->group_size, &o,
      NULL, NULL);
  if (rc) {
    dist_errbuf_prefix(&c->err, "backward of %s '%s' -> '%s': ",
                       e->kind == SCATTER ? "global_scatter" : "global_gather",
                       e->x, e->y);
    return rc;
  }
  slot gx = {.kind = G_TENSOR, .owned = 1, .per_rank = 1, .ranks = e->parts};
  snprintf(gx.t.name, sizeof gx.t.name, "%s", name);
  gx.t.dtype = e->dt;
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
    const slot *s = find(t->slots, t->n_slots, e->outs[k].name);
    int rc = out_grad_arg(t, e, k, s, ones + (size_t)k * (size_t)e->nranks, &og[k]);
    if (rc) return rc;
    *any |= s && s->kind != G_NONE;
  }
  const slot *s0 = find(t->slots, t->n_slots, e->outs[0].name);
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
    if (rc) slot_clear(t, &g);
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
  rc = dist_backward(c, e->inv, only_loss ? NULL : og, &bo, grads);
  for (int k = 0; k < e->n_out; k++) {
    slot *s = find(t->slots, t->n_slots, e->outs[k].name);
    if (s) slot_clear(t, s);
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
  int rc = dist_grad_add(t->c, g->t.name, NULL, &g->t.mesh.d, g->t.placements, name, &copy);
  if (rc) return rc;
  g->t = *copy;
  g->owned = 1;
  dist_tensor_free(copy);
  return 0;
}

/* The gradient of a reshard's tensor before it: its gradient after,
 * resharded back to the layout before (Paddle's reshard backward). */
static int reshard_back(dist_tape *t, const entry *e) {
  slot *s = find(t->slots, t->n_slots, e->x);
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
    slot_clear(t, &g);
    return rc;
  }
  return accumulate(t, e->x, &g);
}

static int entry_back(dist_tape *t, entry *e) {
  if (e->kind == LAYER) return layer_back(t, e);
  if (e->kind == RESHARD) return reshard_back(t, e);
  slot *s = find(t->slots, t->n_slots, e->y);
  if (!s || s->kind == G_NONE) return 0;
  slot g = *s;
  s->kind = G_NONE; /* g now holds it */
  int rc = exchange_back(t, e, &g);
  slot_clear(t, &g);
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
    const slot *local = find(t->locals, t->n_locals, out->name);
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
  for (int i = 0; i < t->n_slots; i++) slot_clear(t, &t->slots[i]);
}

/* How many per-rank values a single client's seed for out is read as: one
 * per daemon holding a piece (an exchange's ranks, or out's mesh:
 * store_seed reads these), or per rank of the LocalLayer call that made out
 * (its dist_backward reads these), whichever is more. */
static int seed_nvalues(dist_tape *t, const dist_tensor *out) {
  const slot *local = find(t->locals, t->n_locals, out->name);
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
 * left to that step: it aborts exactly its op on the other trainers
 * (OpAbort), where a refusal here aborts every first step they may run
 * (backward_refused). */
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

/* The most op ids a backward's first step takes up to its first wait on
 * another daemon: a reshard's backward from a stored seed (its copy, a
 * LocalLayer call of two ids, then the reshard). */
#define FIRST_STEP_IDS 3

static void take_ids_through(dist_client *c, uint64_t last) {
  while (c->op_base + c->op_seq < last) dist_next_op_id(c);
}

/* c->err's code, after an SPMD trainer refused a backward before its first
 * step, whose op ids start at first. Which entry the other trainers' first
 * step runs, and so what they wait on, depends on their seeds (this
 * trainer's may be a NULL output), so every exchange they may wait on
 * first is aborted: each LocalLayer call's backward (under its
 * invocation's id) and the first FIRST_STEP_IDS op ids, on every daemon.
 * A failed SPMD backward takes that many ids at least (dist_tape_backward),
 * so the trainers stay in step whichever step the others failed at. */
static int backward_refused(dist_tape *t, uint64_t first) {
  dist_client *c = t->c;
  if (c->spmd_rank < 0) return c->err.code;
  for (int i = 0; i < t->n_entries; i++)
    if (t->entries[i].kind == LAYER) dist_backward_refused(c, t->entries[i].inv);
  take_ids_through(c, first + FIRST_STEP_IDS - 1);
  for (uint64_t id = first; id < first + FIRST_STEP_IDS; id++)
    dist_spmd_refused_group(c, id, NULL, 0);
  return c->err.code;
}

int dist_tape_backward(dist_tape *t, const dist_tensor *const *outputs,
                       const dist_arg *grads, int n) {
  if (!t) return dist_null_handle(__func__, "t");
  uint64_t first = t->c->op_base + t->c->op_seq + 1;
  int rc = usable(t, "backward");
  if (rc == 0) rc = check_backward_args(t, outputs, grads, n);
  if (rc) return backward_refused(t, first);
  t->done = 1;
  for (int i = 0; rc == 0 && i < n; i++)
    rc = seed(t, outputs[i], grads ? &grads[i] : NULL);
  if (rc) backward_refused(t, first);
  for (int i = t->n_entries - 1; rc == 0 && i >= 0; i--)
    rc = entry_back(t, &t->entries[i]);
  if (rc) {
    dist_errbuf keep = t->c->err;
    if (t->c->spmd_rank >= 0) take_ids_through(t->c, first + FIRST_STEP_IDS - 1);
    clear_all(t);
    dist_tape_release(t);
    t->c->err = keep;
  }
  return rc;
}

static const slot *grad_slot(dist_tape *t, const char *name) {
  const slot *s = name ? find(t->slots, t->n_slots, name) : NULL;
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
