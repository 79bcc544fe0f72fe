/* A LocalLayer invocation's backward and its release: the gradients of a
 * call's inputs from the gradients of its outputs (ProgramBackward), or the
 * invocation freed without one (Release; dist.v1.LocalLayer,
 * program.proto). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program_internal.h"

static int take_grads(dist_client *c, fanout *f, const dist_backward_opts *o,
                      dist_invocation *v, dist_tensor **grads) {
  if (o->keep_local_values &&
      !(v->grads = calloc((size_t)(f->n * v->n_inputs) + 1, sizeof *v->grads)))
    return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int i = 0; i < f->n; i++) {
    const Dist__V1__ProgramBackwardReply *r = (const void *)f->calls[i].reply;
    if (r->n_grads != (size_t)v->n_inputs)
      return dist_client_fail(c, DIST_EPROTO, "rank %d returned %zu gradients, "
                              "expected %d", f->targets[i], r->n_grads,
                              v->n_inputs);
    for (size_t j = 0; o->keep_local_values && j < r->n_values; j++)
      if (j < r->n_has_grad && r->has_grad[j] &&
          dist_prog_keep_value(&v->grads[i * v->n_inputs + (int)j], r->values[j]))
        return dist_client_fail(c, DIST_ENOMEM, "out of memory keeping rank %d's gradient %zu",
                                f->targets[i], j);
  }
  const Dist__V1__ProgramBackwardReply *r0 = (const void *)f->calls[0].reply;
  for (int j = 0; grads && j < v->n_inputs; j++) {
    int stored = r0->grads[j]->name && r0->grads[j]->name[0];
    grads[j] = stored ? dist_tensor_from_meta(r0->grads[j]) : NULL;
    if (stored && !grads[j]) {
      dist_client_fail(c, DIST_ENOMEM, "out of memory for the handle of gradient '%s'",
                       r0->grads[j]->name);
      while (j > 0) dist_tensor_free(grads[--j]), grads[j] = NULL;
      return DIST_ENOMEM;
    }
  }
  return 0;
}

/* Whether a dist_backward that failed after the daemons stored its
 * gradients keeps them: as a call keeps its outputs
 * (dist_local_layer_keeps_failed_outputs), when they replaced names the
 * caller gave, or "<out0>.grad<i>" of an out0 the caller named (an
 * earlier backward's gradient of a call that replaced out0 may stand
 * there); of a name made up for out0 they are new. */
static int keeps_failed_grads(const dist_backward_opts *o, const dist_invocation *inv) {
  return o->replace && (o->grad_names || inv->outputs_named);
}

/* A failed backward may have stored gradients on daemons that applied it,
 * also on one whose reply was lost here (out of memory): deleted there by
 * the request's names, unless keeps_failed_grads, or by undo_names when a
 * caller of libdist's own gives them; a daemon's reply, when there is one,
 * says which it stored. A daemon that did not answer may have stored them
 * too: its names are deleted later rather than now, which would cost a
 * deadline a name; on later for a caller of libdist's own, else on the
 * client's list, and then only names libdist made up ("<out0>.grad<j>" of
 * a made-up out0): the caller may reuse its own, as undo_call's. */
static void undo_backward(dist_client *c, const fanout *f, const dist_backward_opts *o,
                          const dist_invocation *inv, const char *const *names,
                          int own_names, dist_later *later) {
  dist_errbuf keep = c->err;
  /* Made-up names an SPMD trainer shares with the others: as undo_call's. */
  int made_up = !o->grad_names && !inv->outputs_named;
  int shared = !later && made_up && !dist_client_later_takes_made_up_names(c);
  int drop_grads = !shared && (own_names || !keeps_failed_grads(o, inv));
  int note_grads = later ? drop_grads : made_up && !shared;
  dist_later *list = later ? later : &c->later;
  int n_inputs = inv->n_inputs;
  for (int i = 0; i < f->n; i++) {
    const Dist__V1__ProgramBackwardReply *r = (const void *)f->calls[i].reply;
    if (f->calls[i].unanswered) {
      /* A daemon the request reached used the invocation up; one it did
       * not reach (the connection lost) keeps it: "not found" is done. */
      dist_later_note_invocation(c, list, inv->id, f->targets[i]);
      for (int j = 0; note_grads && j < n_inputs; j++)
        if (names[j] && names[j][0]) dist_later_note(c, list, names[j], f->targets[i]);
    }
    if (!drop_grads || !f->calls[i].applied) continue;
    /* A delete that goes unanswered itself is noted for the next undo
     * point, under the same rule, and so, unsent, are the rest for that
     * daemon. */
    int silent = 0;
    for (int j = 0; j < n_inputs; j++) {
      int held = !r || ((size_t)j < r->n_grads && r->grads[j]->name && r->grads[j]->name[0]);
      if (names[j] && names[j][0] && held)
        dist_later_delete_or_note(c, note_grads ? list : NULL, names[j], f->targets[i],
                                  &silent);
    }
  }
  c->err = keep;
}

/* Whether the daemon of `rank` holds a piece of output k. One that holds
 * none is sent no gradient of it: its local output went nowhere, so
 * nothing flows back through it there (as in Paddle, where the rank holds
 * no local gradient of a tensor outside its mesh). */
static int holds_output(const dist_invocation *v, int k, int rank) {
  return dist_mesh_index_of(&v->out_meshes[k], rank) >= 0;
}

static int build_backward(dist_client *c, dist_invocation *v, fanout *f,
                          const dist_arg *out_grads, char **names,
                          const dist_backward_opts *o,
                          Dist__V1__ProgramBackwardRequest *rq) {
  for (int i = 0; i < f->n; i++) {
    dist__v1__program_backward_request__init(&rq[i]);
    for (int k = 0; out_grads && k < v->n_outputs; k++)
      if (holds_output(v, k, f->targets[i]))
        dist_prog_fill_arg(c, &f->args[i], k, &out_grads[k], i);
    rq[i].invocation_id = v->id;
    rq[i].n_ranks = (size_t)v->nvote;
    rq[i].ranks = v->vote_ranks;
    rq[i].n_out_grads = out_grads ? (size_t)v->n_outputs : 0;
    rq[i].out_grads = f->args[i].ptrs;
    rq[i].n_grad_names = (size_t)v->n_inputs;
    rq[i].grad_names = names;
    rq[i].replace = o->replace != 0;
    rq[i].return_values = o->keep_local_values != 0;
    f->calls[i].target = f->targets[i];
    f->calls[i].request = &rq[i].base;
  }
  return 0;
}

int dist_prog_name_grads(dist_client *c, const dist_invocation *inv,
                         const dist_backward_opts *o, char **names, char (*buf)[256]) {
  if (o->grad_names &&
      dist_prog_check_chosen_names(c, "gradient", o->grad_names, inv->n_inputs, 1))
    return c->err.code;
  for (int j = 0; j < inv->n_inputs; j++) {
    if (o->grad_names)
      snprintf(buf[j], sizeof *buf, "%s", o->grad_names[j] ? o->grad_names[j] : "");
    else if (inv->input_is_tensor[j])
      snprintf(buf[j], sizeof *buf, "%s.grad%d", inv->out_names[0], j);
    names[j] = buf[j];
  }
  return 0;
}

/* The backward's gradient names (in buf) and requests, made and checked
 * before any is sent. */
static int prepare_backward(dist_client *c, dist_invocation *inv, fanout *f,
                            const dist_arg *out_grads, const dist_backward_opts *o,
                            char **names, char (*buf)[256],
                            Dist__V1__ProgramBackwardRequest *rq) {
  int rc = dist_check_call_args(c, "dist_backward", "out_grads", out_grads,
                                out_grads ? inv->n_outputs : 0, c->spmd_rank >= 0 ? 1 : inv->n);
  if (rc) return rc;
  if ((rc = dist_prog_name_grads(c, inv, o, names, buf))) return rc;
  return build_backward(c, inv, f, out_grads, names, o, rq);
}

/* dist_backward; with undo_names, a failure deletes those (libdist's own
 * names) rather than the request's, and notes them on later for the
 * daemons that did not answer (dist_backward_undoing). */
static int backward_run(dist_client *c, dist_invocation *inv, const dist_arg *out_grads,
                        const dist_backward_opts *opts, dist_tensor **grads,
                        const char *const *undo_names, dist_later *later) {
  /* named as the public call, which is the one a caller gave NULL */
  if (!inv) return dist_client_null_arg(c, "dist_backward", "inv");
  dist_backward_opts o = DIST_BACKWARD_OPTS_INIT;
  if (opts) o = *opts;
  for (int j = 0; grads && j < inv->n_inputs; j++) grads[j] = NULL;
  if (inv->outside_grads) return dist_prog_backward_outside(c, inv, out_grads, &o, grads);
  fanout f = {.n = inv->n};
  memcpy(f.targets, inv->targets, sizeof(int) * (size_t)inv->n);
  Dist__V1__ProgramBackwardRequest *rq = calloc((size_t)inv->n + 1, sizeof *rq);
  char **names = calloc((size_t)inv->n_inputs + 1, sizeof *names);
  char (*buf)[256] = calloc((size_t)inv->n_inputs + 1, sizeof *buf);
  int n_args = inv->n_outputs;
  f.args = calloc((size_t)f.n + 1, sizeof *f.args);
  f.calls = calloc((size_t)f.n + 1, sizeof *f.calls);
  int rc = rq && names && buf && f.args && f.calls ? 0 : DIST_ENOMEM;
  for (int i = 0; rc == 0 && i < f.n; i++) rc = dist_prog_arg_set_init(&f.args[i], n_args);
  if (rc) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    goto out;
  }
  if ((rc = prepare_backward(c, inv, &f, out_grads, &o, names, buf, rq))) {
    /* The daemons storing gradients wait for this rank's verdict. */
    dist_spmd_refused(c, inv->id, inv->vote_ranks, inv->nvote);
    goto out;
  }
  rc = dist_call_many(c, LL_METHOD("Backward"),
                      &dist__v1__program_backward_reply__descriptor, f.calls, f.n);
  inv->backward_done = 1; /* the daemons freed the invocation either way */
  if (rc == 0) rc = take_grads(c, &f, &o, inv, grads);
  if (rc)
    undo_backward(c, &f, &o, inv, undo_names ? undo_names : (const char *const *)names,
                  undo_names != NULL, later);
out:
  dist_prog_fanout_free(&f);
  free(rq);
  free(names);
  free(buf);
  return rc;
}

int dist_backward(dist_client *c, dist_invocation *inv,
                  const dist_arg *out_grads, const dist_backward_opts *opts,
                  dist_tensor **grads) {
  if (!c) return dist_no_client(__func__);
  return backward_run(c, inv, out_grads, opts, grads, NULL, NULL);
}

int dist_backward_undoing(dist_client *c, dist_invocation *inv, const dist_arg *out_grads,
                          const dist_backward_opts *opts, dist_tensor **grads,
                          const char *const *undo_names, dist_later *later) {
  return backward_run(c, inv, out_grads, opts, grads, undo_names, later);
}

int dist_backward_refused(dist_client *c, const dist_invocation *inv) {
  return dist_spmd_refused(c, inv->id, inv->vote_ranks, inv->nvote);
}

int dist_invocation_release_one(dist_client *c, uint64_t invocation, int rank, int *unanswered) {
  return dist_prog_release_one(c, rank, 0, invocation, unanswered);
}

int dist_invocation_release(dist_client *c, dist_invocation *inv) {
  int kept = inv && !inv->backward_done; /* else a no-op, NULL too */
  if (!c) return kept ? dist_no_client(__func__) : 0;
  /* each call clears the client's error: the first failure's is kept */
  dist_errbuf first = DIST_ERRBUF_INIT;
  int silent[DIST_MAX_MESH_RANKS], n_silent = 0;
  for (int i = 0; kept && i < inv->n; i++) {
    /* unanswered: noted, and tried again at the next undo point */
    int unanswered = 0;
    dist_note_first_failure(
        c, dist_later_release_or_note(c, &c->later, inv->id, inv->targets[i], &unanswered),
        &first);
    if (unanswered) silent[n_silent++] = inv->targets[i];
  }
  if (first.code) c->err = first;
  /* whatever inv, an undo point (dist.h): what a failed call left on a
   * daemon that did not answer; not asked again of a daemon that just let
   * this release wait out its deadline (the note above among them) */
  dist_client_later_undo_skipping(c, silent, n_silent);
  return first.code;
}
