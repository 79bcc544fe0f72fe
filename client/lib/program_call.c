/* A call of a registered LocalLayer program (ProgramInvoke): its arguments
 * made into each daemon's request, its outputs and the invocation kept for
 * backward (dist.v1.LocalLayer, program.proto). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program_internal.h"

/* ---------------------------------------------------------------- arguments */

int dist_prog_arg_set_init(arg_set *s, int n) {
  s->n = n;
  s->args = calloc((size_t)n + 1, sizeof *s->args);
  s->ptrs = calloc((size_t)n + 1, sizeof *s->ptrs);
  s->shapes = calloc((size_t)n + 1, sizeof *s->shapes);
  for (int i = 0; s->args && s->ptrs && i < n; i++) {
    dist__v1__program_arg__init(&s->args[i]);
    s->ptrs[i] = &s->args[i];
  }
  return s->args && s->ptrs && s->shapes ? 0 : DIST_ENOMEM;
}

static void arg_set_free(arg_set *s) {
  free(s->args);
  free(s->ptrs);
  free(s->shapes);
}

static void set_value(arg_set *s, int j, const dist_value *v) {
  Dist__V1__ProgramArg *a = &s->args[j];
  a->dtype = (Dist__V1__DType)v->dtype;
  for (int d = 0; d < v->ndim && d < DIST_MAX_DIMS; d++)
    s->shapes[j][d] = (uint64_t)v->shape[d];
  a->n_shape = (size_t)v->ndim;
  a->shape = s->shapes[j];
  int64_t numel = 1;
  for (int d = 0; d < v->ndim; d++) numel *= v->shape[d];
  a->data.data = (uint8_t *)v->data;
  a->data.len = (size_t)numel * dist_dtype_size(v->dtype);
}

/* Argument j of target i from a: a tensor name, or the target's value. */
void dist_prog_fill_arg(const dist_client *c, arg_set *s, int j, const dist_arg *a, int i) {
  if (a->tensor) s->args[j].tensor = (char *)a->tensor->name;
  else if (a->values) set_value(s, j, &a->values[c->spmd_rank >= 0 ? 0 : i]);
}

int dist_prog_check_input(dist_client *c, const dist_program *p, int j, const dist_arg *a) {
  int kind = p->inputs[j]->kind;
  if (kind == DIST__V1__PROGRAM_INPUT__KIND__DTENSOR_LOCAL && !a->tensor)
    return dist_client_fail(c, DIST_EINVAL, "input %d needs a dist_tensor", j);
  if (kind == DIST__V1__PROGRAM_INPUT__KIND__VALUE && !a->values)
    return dist_client_fail(c, DIST_EINVAL, "input %d needs values", j);
  return 0;
}

int dist_prog_keep_value(kept_value *k, const Dist__V1__ProgramValue *v) {
  k->present = v->n_shape > 0 || v->data.len > 0 || v->dtype != 0;
  k->dtype = (dist_dtype)v->dtype;
  k->ndim = (int)v->n_shape;
  for (size_t d = 0; d < v->n_shape && d < DIST_MAX_DIMS; d++)
    k->shape[d] = (int64_t)v->shape[d];
  k->data = malloc(v->data.len + 1);
  if (!k->data) return DIST_ENOMEM;
  if (v->data.len) memcpy(k->data, v->data.data, v->data.len);
  return 0;
}

/* ---------------------------------------------------------------- call */

/* Whether this client calls p's daemon i: every one, an SPMD trainer its own. */
static int calls_rank(const dist_client *c, const dist_program *p, int i) {
  return c->spmd_rank < 0 || p->ranks[i] == c->spmd_rank;
}

static int fanout_init(dist_client *c, const dist_program *p, fanout *f,
                       int nargs) {
  f->n = 0;
  for (int i = 0; i < p->nranks; i++)
    if (calls_rank(c, p, i)) {
      f->index[f->n] = i;
      f->targets[f->n++] = p->ranks[i];
    }
  f->args = calloc((size_t)f->n + 1, sizeof *f->args);
  f->calls = calloc((size_t)f->n + 1, sizeof *f->calls);
  if (!f->args || !f->calls) return DIST_ENOMEM;
  for (int i = 0; i < f->n; i++)
    if (dist_prog_arg_set_init(&f->args[i], nargs)) return DIST_ENOMEM;
  return 0;
}

void dist_prog_fanout_free(fanout *f) {
  if (f->calls) dist_calls_free(f->calls, f->n);
  for (int i = 0; f->args && i < f->n; i++) arg_set_free(&f->args[i]);
  free(f->args);
  free(f->calls);
}

dist_invocation *dist_prog_invocation_new(const dist_program *p, int n, uint64_t id,
                                          int spmd_rank) {
  dist_invocation *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  v->id = id;
  v->spmd_rank = spmd_rank;
  v->n = n;
  v->n_inputs = p->n_inputs;
  v->n_outputs = p->n_outputs;
  v->input_is_tensor = calloc((size_t)p->n_inputs + 1, sizeof(int));
  v->out_names = calloc((size_t)p->n_outputs + 1, sizeof *v->out_names);
  int ranks[DIST_MAX_MESH_RANKS];
  v->nvote = dist_prog_output_ranks(p, ranks);
  v->vote_ranks = calloc((size_t)v->nvote + 1, sizeof *v->vote_ranks);
  for (int i = 0; v->vote_ranks && i < v->nvote; i++) v->vote_ranks[i] = (uint32_t)ranks[i];
  v->out_meshes = calloc((size_t)p->n_outputs + 1, sizeof *v->out_meshes);
  for (int k = 0; v->out_meshes && k < p->n_outputs && k < p->n_attrs; k++)
    v->out_meshes[k] = p->attrs[k]->mesh;
  if (!v->input_is_tensor || !v->out_names || !v->vote_ranks || !v->out_meshes) {
    dist_invocation_free(v);
    return NULL;
  }
  for (int j = 0; j < p->n_inputs; j++)
    v->input_is_tensor[j] =
        p->inputs[j]->kind == DIST__V1__PROGRAM_INPUT__KIND__DTENSOR_LOCAL;
  return v;
}

void dist_invocation_free(dist_invocation *inv) {
  if (!inv) return;
  for (int i = 0; inv->outs && i < inv->n * inv->n_outputs; i++)
    free(inv->outs[i].data);
  for (int i = 0; inv->grads && i < inv->n * inv->n_inputs; i++)
    free(inv->grads[i].data);
  free(inv->outs);
  free(inv->grads);
  free(inv->input_is_tensor);
  free(inv->out_names);
  free(inv->vote_ranks);
  free(inv->outside_grads);
  free(inv->out_meshes);
  free(inv);
}

static int check_call(dist_client *c, const dist_program *p, int nargs) {
  if (!p->nranks)
    return dist_client_fail(c, DIST_EINVAL, "program '%s' is not registered "
                            "(dist_program_register)", p->name);
  if (nargs != p->n_inputs)
    return dist_client_fail(c, DIST_EINVAL, "program '%s' takes %d inputs, "
                            "%d arguments given", p->name, p->n_inputs, nargs);
  if (c->spmd_rank >= 0 && p->ranks[0] != c->spmd_rank)
    return dist_client_fail(c, DIST_EINVAL, "program '%s' is registered for "
                            "rank %d, this trainer is rank %d", p->name,
                            p->ranks[0], c->spmd_rank);
  return 0;
}

int dist_local_layer_keeps_failed_outputs(const dist_call_opts *o) {
  return o->replace && o->out_names;
}

/* What a daemon `rank` that did not answer a failed call may hold (its
 * reply lost after it stored): the outputs of the meshes it is in, when
 * their names are libdist's (names not NULL), and, unless no_grad, the
 * invocation kept for backward; undone later, as asking now would cost a
 * deadline each. */
static void note_unanswered(dist_client *c, const dist_program *p, int rank, uint64_t id,
                            char *const *names, const dist_call_opts *o, dist_later *later) {
  for (int k = 0; names && k < p->n_outputs; k++)
    if (dist_mesh_index_of(&p->attrs[k]->mesh, rank) >= 0)
      dist_later_note(c, later, names[k], rank);
  if (!o->no_grad) dist_later_note_invocation(c, later, id, rank);
}

/* A failed call may have succeeded on some daemons, also on one whose
 * reply was lost here (out of memory): undo it on each that applied it,
 * its outputs deleted unless kept (dist_local_layer_keeps_failed_outputs,
 * for a caller's names; libdist's own callers, with later, drop theirs).
 * The names are the request's, not the reply's, which may be missing; a
 * daemon's reply, when there is one, says which outputs it holds, and
 * without one only the daemons of output k's mesh can have stored it (a
 * tensor of that name elsewhere is another's). */
static void undo_call(dist_client *c, const dist_program *p, fanout *f, uint64_t id,
                      char *const *names, const dist_call_opts *o, dist_later *later) {
  dist_errbuf keep = c->err;
  /* An SPMD trainer's made-up names are every trainer's, and when its own
   * daemon applied the call the others' calls got them: not its to delete. */
  int shared = !later && !o->out_names && !dist_client_later_takes_made_up_names(c);
  int kept = !later && (dist_local_layer_keeps_failed_outputs(o) || shared);
  /* The public call's go on the client's list, names libdist made up
   * only: the caller may reuse the names it gave. */
  dist_later *list = later ? later : &c->later;
  dist_later *name_list = later || (!o->out_names && !shared) ? list : NULL;
  for (int i = 0; i < f->n; i++) {
    const Dist__V1__ProgramInvokeReply *r = (const void *)f->calls[i].reply;
    if (f->calls[i].unanswered)
      note_unanswered(c, p, f->targets[i], id, name_list ? names : NULL, o, list);
    if (!f->calls[i].applied) continue;
    /* A no_grad call's daemons keep no invocation: a Release would cost a
     * round trip to find nothing. An undo that goes unanswered itself is
     * noted for the next undo point, and so, unsent, are the rest for
     * that daemon. c->err is restored below. */
    int silent = 0;
    if (!o->no_grad) dist_later_release_or_note(c, list, id, f->targets[i], &silent);
    for (int k = 0; !kept && k < p->n_outputs; k++) {
      int held = r ? (size_t)k < r->n_outputs && r->outputs[k]->name && r->outputs[k]->name[0]
                   : dist_mesh_index_of(&p->attrs[k]->mesh, f->targets[i]) >= 0;
      if (held) dist_later_delete_or_note(c, name_list, names[k], f->targets[i], &silent);
    }
  }
  c->err = keep;
}

/* Output k's description: from the first daemon that holds a piece of
 * it (outputs may lie on different meshes), or NULL. */
static const Dist__V1__TensorMeta *described(const fanout *f, int k) {
  for (int i = 0; i < f->n; i++) {
    const Dist__V1__ProgramInvokeReply *r = (const void *)f->calls[i].reply;
    if (r->outputs[k]->name && r->outputs[k]->name[0]) return r->outputs[k];
  }
  return NULL;
}

/* The invocation and output handles from the replies; an output no
 * daemon called holds a piece of takes its handle from elsewhere[k]
 * (program_outside.c). */
static int take_outputs(dist_client *c, fanout *f, const dist_call_opts *o,
                        dist_invocation *v, dist_tensor **elsewhere, dist_tensor **outs) {
  if (o->keep_local_values &&
      !(v->outs = calloc((size_t)(f->n * v->n_outputs) + 1, sizeof *v->outs)))
    return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int i = 0; i < f->n; i++) {
    const Dist__V1__ProgramInvokeReply *r = (const void *)f->calls[i].reply;
    v->targets[i] = f->targets[i];
    if (r->n_outputs != (size_t)v->n_outputs)
      return dist_client_fail(c, DIST_EPROTO, "rank %d returned %zu outputs, "
                              "expected %d", f->targets[i], r->n_outputs,
                              v->n_outputs);
    for (size_t k = 0; o->keep_local_values && k < r->n_values; k++)
      if (dist_prog_keep_value(&v->outs[i * v->n_outputs + (int)k], r->values[k]))
        return dist_client_fail(c, DIST_ENOMEM, "out of memory keeping rank %d's output %zu",
                                f->targets[i], k);
  }
  for (int k = 0; outs && k < v->n_outputs; k++) {
    const Dist__V1__TensorMeta *m = described(f, k);
    outs[k] = m ? dist_tensor_from_meta(m) : elsewhere[k];
    if (!m) elsewhere[k] = NULL;
    else if (!outs[k])
      return dist_client_fail(c, DIST_ENOMEM, "out of memory for the handle of output %d", k);
  }
  return 0;
}

static int build_invoke(dist_client *c, const dist_program *p, fanout *f,
                        const dist_arg *args,
                        Dist__V1__ProgramInvokeRequest *rq) {
  for (int i = 0; i < f->n; i++) {
    for (int j = 0; j < p->n_inputs; j++) {
      if (p->inputs[j]->kind > DIST__V1__PROGRAM_INPUT__KIND__VALUE) continue;
      int rc = dist_prog_check_input(c, p, j, &args[j]);
      if (rc) return rc;
      dist_prog_fill_arg(c, &f->args[i], j, &args[j], f->index[i]);
    }
    dist__v1__program_invoke_request__init(&rq[i]);
    rq[i].handle = p->handles[f->index[i]];
    rq[i].n_args = (size_t)p->n_inputs;
    rq[i].args = f->args[i].ptrs;
    f->calls[i].target = f->targets[i];
    f->calls[i].request = &rq[i].base;
  }
  return 0;
}

/* dist_client_check_name on each of names[0..n), the caller's names for a
 * call's outputs or a backward's gradients ("output 1: ..."); with
 * optional, a NULL or "" entry (a gradient not to store) is skipped. */
int dist_prog_check_chosen_names(dist_client *c, const char *kind, const char *const *names,
                                 int n, int optional) {
  for (int i = 0; i < n; i++) {
    if (optional && (!names[i] || !names[i][0])) continue;
    char what[32];
    snprintf(what, sizeof what, "%s %d", kind, i);
    if (dist_client_check_name(c, what, names[i]) != 0) return c->err.code;
  }
  return 0;
}

/* A name the caller chose for an output must not be held by a daemon
 * outside the output's mesh: the daemons of the call see only their own
 * (ARCHITECTURE.md, "Names"). Asked before the call, so that a refusal
 * changes nothing; names libdist makes up are new. */
static int check_out_names(dist_client *c, const dist_program *p, char *const *names) {
  if (p->n_attrs != p->n_outputs) return 0; /* the daemons report the count */
  for (int k = 0; k < p->n_outputs; k++) {
    int rc = dist_held_elsewhere(c, names[k], &p->attrs[k]->mesh);
    if (rc) return rc;
  }
  return 0;
}

int dist_prog_name_outputs(dist_client *c, const dist_program *p, const dist_call_opts *o,
                           dist_invocation *v, char **names) {
  if (o->out_names &&
      dist_prog_check_chosen_names(c, "output", o->out_names, p->n_outputs, 0))
    return c->err.code;
  v->outputs_named = o->out_names != NULL;
  for (int k = 0; k < p->n_outputs; k++) {
    if (o->out_names) snprintf(v->out_names[k], sizeof v->out_names[k], "%s", o->out_names[k]);
    else snprintf(v->out_names[k], sizeof v->out_names[k], "%s.%llu.out%d",
                  p->name, (unsigned long long)v->id, k);
    names[k] = v->out_names[k];
  }
  return 0;
}

/* The call's output names, requests and handles of the outputs this
 * trainer holds no piece of (in `elsewhere`), made and checked before
 * any is sent. */
static int prepare_call(dist_client *c, const dist_program *p, const dist_call_opts *o,
                        const dist_arg *args, fanout *f, dist_invocation *v, char **names,
                        Dist__V1__ProgramInvokeRequest *rq, dist_tensor **elsewhere) {
  int rc = dist_prog_name_outputs(c, p, o, v, names);
  if (rc == 0 && o->out_names) rc = check_out_names(c, p, names);
  if (rc == 0) rc = build_invoke(c, p, f, args, rq);
  if (rc == 0 && p->checked) rc = dist_prog_outputs_elsewhere(c, p, args, names, elsewhere);
  return rc;
}

/* What every daemon's request of one call shares: the op id, the daemons
 * that vote, the output names and the caller's options. */
static void fill_invoke_requests(Dist__V1__ProgramInvokeRequest *rq, int n,
                                 const dist_invocation *v, uint64_t id,
                                 const dist_program *p, char **names,
                                 const dist_call_opts *o) {
  for (int i = 0; i < n; i++) {
    rq[i].n_ranks = (size_t)v->nvote;
    rq[i].ranks = v->vote_ranks;
    rq[i].op_id = id;
    rq[i].n_out_names = (size_t)p->n_outputs;
    rq[i].out_names = names;
    rq[i].replace = o->replace != 0;
    rq[i].return_values = o->keep_local_values != 0;
    rq[i].no_grad = o->no_grad != 0;
  }
}

/* c->err's code, after an SPMD trainer refused its call of p under id:
 * the daemons that store the outputs would wait for its part in each
 * output's shape exchange and in the vote. */
static int refuse_call(dist_client *c, const dist_program *p, uint64_t id) {
  int ranks[DIST_MAX_MESH_RANKS];
  uint32_t named[DIST_MAX_MESH_RANKS];
  int n = dist_prog_output_ranks(p, ranks);
  for (int i = 0; i < n; i++) named[i] = (uint32_t)ranks[i];
  return dist_spmd_refused_ids(c, id, (uint32_t)p->n_outputs, named, n);
}

/* The ids a call of p takes, before its checks so that a trainer that
 * refuses it stays in step: the invocation's, then one per output's shape
 * exchange. Returns the first. */
static uint64_t take_call_ids(dist_client *c, const dist_program *p) {
  return dist_take_ids(c, dist_local_layer_ids(p->n_outputs));
}

int dist_local_layer_ids(int n_outputs) { return 1 + n_outputs; }

int dist_local_layer_refused(dist_client *c, const dist_program *p) {
  if (c->spmd_rank < 0 || !p) return c->err.code; /* no p: the call takes no id either */
  return refuse_call(c, p, take_call_ids(c, p));
}

/* dist_local_layer_call; with later, the output names are the caller's
 * (libdist's) to drop, so a failure deletes what it stored, replacing or
 * not, and notes them on later for the daemons that did not answer
 * (dist_local_layer_call_undoing). */
static int call_run(dist_client *c, dist_program *p, const dist_arg *args, int nargs,
                    const dist_call_opts *opts, dist_invocation **inv, dist_tensor **outs,
                    dist_later *later) {
  /* named as the public call, which is the one a caller gave NULL */
  if (!p) return dist_client_null_arg(c, "dist_local_layer_call", "p");
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  if (opts) o = *opts;
  if (inv) *inv = NULL;
  for (int k = 0; outs && k < p->n_outputs; k++) outs[k] = NULL;
  uint64_t id = take_call_ids(c, p);
  if ((!inv && dist_client_null_arg(c, "dist_local_layer_call", "inv")) ||
      check_call(c, p, nargs) ||
      dist_check_call_args(c, "dist_local_layer_call", "args", args, nargs,
                           c->spmd_rank >= 0 ? 1 : p->nranks))
    return refuse_call(c, p, id);
  if (p->outside) return dist_prog_call_outside(c, p, args, &o, id, inv, outs);
  fanout f = {0};
  dist_invocation *v = NULL;
  Dist__V1__ProgramInvokeRequest *rq = NULL;
  char **names = calloc((size_t)p->n_outputs + 1, sizeof *names);
  dist_tensor **elsewhere = calloc((size_t)p->n_outputs + 1, sizeof *elsewhere);
  int rc = names && elsewhere ? fanout_init(c, p, &f, p->n_inputs) : DIST_ENOMEM;
  if (!rc && !(v = dist_prog_invocation_new(p, f.n, id, c->spmd_rank))) rc = DIST_ENOMEM;
  if (!rc && !(rq = calloc((size_t)f.n + 1, sizeof *rq))) rc = DIST_ENOMEM;
  if (rc) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    goto out;
  }
  if ((rc = prepare_call(c, p, &o, args, &f, v, names, rq, elsewhere))) {
    refuse_call(c, p, id);
    goto out;
  }
  /* What an earlier public call left on a daemon that did not answer;
   * after every check of the arguments, so that a call refused for one
   * costs no deadline. */
  if (!later) dist_client_later_undo(c);
  fill_invoke_requests(rq, f.n, v, id, p, names, &o);
  rc = dist_call_many(c, LL_METHOD("Invoke"),
                      &dist__v1__program_invoke_reply__descriptor, f.calls, f.n);
  /* Asked again once stored, as a put asks: of a call and a put of one
   * name onto disjoint meshes at once, at least one then sees the other.
   * A replacing call cannot be undone without losing what it replaced, so
   * it is asked before only. */
  if (!rc && o.out_names && !o.replace) rc = check_out_names(c, p, names);
  if (rc) {
    undo_call(c, p, &f, id, names, &o, later);
    goto out;
  }
  if ((rc = take_outputs(c, &f, &o, v, elsewhere, outs))) {
    for (int k = 0; outs && k < p->n_outputs; k++) dist_tensor_free(outs[k]), outs[k] = NULL;
    undo_call(c, p, &f, id, names, &o, later);
    goto out;
  }
  v->backward_done = o.no_grad != 0;
  *inv = v;
  v = NULL;
out:
  dist_invocation_free(v);
  dist_prog_fanout_free(&f);
  for (int k = 0; elsewhere && k < p->n_outputs; k++) dist_tensor_free(elsewhere[k]);
  free(elsewhere);
  free(rq);
  free(names);
  return rc;
}

int dist_local_layer_call(dist_client *c, dist_program *p, const dist_arg *args,
                          int nargs, const dist_call_opts *opts,
                          dist_invocation **inv, dist_tensor **outs) {
  if (!c) return dist_no_client(__func__);
  return call_run(c, p, args, nargs, opts, inv, outs, NULL);
}

int dist_local_layer_call_undoing(dist_client *c, dist_program *p, const dist_arg *args,
                                  int nargs, const dist_call_opts *opts,
                                  dist_invocation **inv, dist_tensor **outs,
                                  dist_later *later) {
  return call_run(c, p, args, nargs, opts, inv, outs, later);
}

/* Given no invocation: -1, and dist_errmsg(NULL) says why. */
int dist_invocation_n_outputs(const dist_invocation *inv) {
  if (!inv) return dist_null_handle(__func__, "inv"), -1;
  return inv->n_outputs;
}
int dist_invocation_n_inputs(const dist_invocation *inv) {
  if (!inv) return dist_null_handle(__func__, "inv"), -1;
  return inv->n_inputs;
}

static int kept_at(const dist_invocation *inv, const kept_value *table,
                   int per, int i, int rank, dist_value *out) {
  if (rank < 0) rank = inv->spmd_rank;
  if (!table || i < 0 || i >= per) return DIST_ENOTFOUND;
  for (int t = 0; t < inv->n; t++) {
    if (inv->targets[t] != rank) continue;
    const kept_value *k = &table[t * per + i];
    if (!k->present) return DIST_ENOTFOUND;
    out->data = k->data;
    out->dtype = k->dtype;
    out->ndim = k->ndim;
    memcpy(out->shape, k->shape, sizeof out->shape);
    return 0;
  }
  return DIST_ENOTFOUND;
}

int dist_invocation_local_output(const dist_invocation *inv, int k, int rank,
                                 dist_value *out) {
  if (!inv) return dist_null_handle(__func__, "inv");
  if (!out) return dist_null_handle(__func__, "out");
  return kept_at(inv, inv->outs, inv->n_outputs, k, rank, out);
}

int dist_invocation_local_grad(const dist_invocation *inv, int i, int rank,
                               dist_value *out) {
  if (!inv) return dist_null_handle(__func__, "inv");
  if (!out) return dist_null_handle(__func__, "out");
  return kept_at(inv, inv->grads, inv->n_inputs, i, rank, out);
}
