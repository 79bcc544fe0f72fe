/* A LocalLayer program called by an SPMD trainer in none of its output
 * meshes, and the outputs whose meshes a trainer in some of them is not
 * in. In Paddle every rank runs the whole program, and a LocalLayer on
 * a rank outside the process mesh makes distributed tensors of which it
 * holds nothing; here the call is a no-op success for it, as the other
 * operations are (spmd_outside.c): nothing is registered, sent or stored
 * for it, and it takes the op ids a member takes (program_call.c takes
 * them before the checks), so the job's later operations stay in step.
 *
 * Its output handles describe what the members make: their dtype, mesh,
 * placements and global shape. Paddle's outsider derives the global shape
 * from its own (empty) local output, which says nothing of the members';
 * so the outsider keeps the program as its daemon would check it
 * (daemon/program/validate.c, linked in without kernels) and infers each
 * member's local outputs from that member's pieces of the tensor
 * arguments, then puts them together as the members' shape exchange
 * does (dist_global_of_pieces).
 *
 * A trainer in some of the output meshes but not all (a pipeline's
 * stages) is registered on its daemon, which runs the whole program and
 * stores the outputs of its own meshes (daemon/svc_program.c); for each
 * of the others libdist makes the outsider's handle in the same way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program.h"
#include "program_internal.h"

int dist_prog_outside(const dist_client *c, const dist_program *p) {
  if (c->spmd_rank < 0) return 0;
  int ranks[DIST_MAX_MESH_RANKS];
  int n = dist_prog_output_ranks(p, ranks);
  for (int i = 0; i < n; i++)
    if (ranks[i] == c->spmd_rank) return 0;
  return 1;
}

int dist_prog_output_elsewhere(const dist_client *c, const dist_program *p, int k) {
  return c->spmd_rank >= 0 && k < p->n_attrs &&
         dist_mesh_index_of(&p->attrs[k]->mesh, c->spmd_rank) < 0;
}

int dist_prog_keep_checked(dist_client *c, dist_program *p, const Dist__V1__Program *pb) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  struct distd_program *checked = NULL;
  if (distd_program_new(pb, &checked, &eb) != 0)
    return dist_client_fail(c, eb.code, "%s", eb.msg);
  dist_prog_unregister_outside(p);
  p->checked = checked;
  c->err = (dist_errbuf)DIST_ERRBUF_INIT;
  return 0;
}

int dist_prog_register_outside(dist_client *c, dist_program *p, const Dist__V1__Program *pb) {
  int ranks[DIST_MAX_MESH_RANKS];
  int n = dist_prog_output_ranks(p, ranks);
  for (int i = 0; i < n; i++) /* the members' daemons refuse it so */
    if (!dist_client_reaches(c, ranks[i]))
      return dist_refuse_unreached(c, "an out_dist_attr", ranks[i], "an out_dist_attr names "
                                   "rank %d, but the cluster has %d daemons", ranks[i], c->n);
  if (dist_prog_keep_checked(c, p, pb) != 0) return c->err.code;
  p->outside = 1;
  p->nranks = 1; /* as a member's registration on its own daemon */
  p->ranks[0] = c->spmd_rank;
  p->handles[0] = 0;
  return 0;
}

void dist_prog_unregister_outside(dist_program *p) {
  distd_program_free(p->checked);
  p->checked = NULL;
  p->outside = 0;
}

/* ---------------------------------------------------------------- shapes */

/* Argument j as the member of rank `rank` hands it to the program: its
 * piece of a tensor, or a value (each trainer gives its own; the members'
 * are taken to be shaped as this one's, as Paddle's dtensor_from_local
 * takes every rank's piece to be). */
static int member_input(dist_client *c, const dist_arg *a, int j, int rank, distd_vmeta *m) {
  if (a->values) {
    m->dtype = a->values[0].dtype;
    return dist_shape_make(a->values[0].ndim, a->values[0].shape, &m->shape, NULL) == 0
               ? 0
               : dist_client_fail(c, DIST_EINVAL, "argument %d: a value of %d dims", j,
                                  a->values[0].ndim);
  }
  const dist_tensor *t = a->tensor;
  int idx = dist_mesh_index_of(&t->mesh.d, rank);
  if (idx < 0) /* the member's daemon holds no piece of it to hand over */
    return dist_client_fail(c, DIST_EINVAL, "argument %d ('%s') has no piece on rank %d, "
                            "which runs the call", j, t->name, rank);
  int coords[DIST_MAX_MESH_DIMS];
  int64_t offset[DIST_MAX_DIMS];
  dist_mesh_coords(&t->mesh.d, idx, coords);
  m->dtype = t->dtype;
  dist_local_box(&t->mesh.d, t->placements, &t->shape, coords, &m->shape, offset);
  return 0;
}

/* Every value's dtype and shape on the member of rank `rank`. */
static int infer_member(dist_client *c, const dist_program *p, const dist_arg *args,
                        int rank, distd_vmeta *values) {
  int rc = 0;
  distd_vmeta *in = calloc((size_t)p->n_inputs + 1, sizeof *in);
  if (!in) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int j = 0; rc == 0 && j < p->n_inputs; j++)
    if (p->inputs[j]->kind <= DIST__V1__PROGRAM_INPUT__KIND__VALUE &&
        !(rc = dist_prog_check_input(c, p, j, &args[j])))
      rc = member_input(c, &args[j], j, rank, &in[j]);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (rc == 0 && distd_program_infer(p->checked, in, values, &eb) != 0)
    rc = dist_client_fail(c, eb.code, "program '%s' on rank %d: %s", p->name, rank, eb.msg);
  free(in);
  return rc;
}

/* Output k's handle: the global shape the members' local outputs make. */
static int output_handle(dist_client *c, const dist_program *p, const dist_arg *args, int k,
                         const char *name, distd_vmeta *values, dist_tensor **out) {
  const Dist__V1__Program *pb = distd_program_message(p->checked);
  const Dist__V1__DistAttr *attr = pb->out_dist_attrs[k];
  dist_mesh mesh;
  dist_placement pl[DIST_MAX_MESH_DIMS];
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (dist_mesh_from_pb(attr->mesh, &mesh.d, &eb) ||
      dist_placements_from_pb(attr->placements, attr->n_placements, pl, &eb))
    return dist_client_fail(c, eb.code, "out_dist_attrs[%d]: %s", k, eb.msg);
  dist_shape pieces[DIST_MAX_MESH_RANKS], global;
  dist_dtype dt = DIST_DTYPE_INVALID;
  for (int i = 0; i < mesh.d.nranks; i++) {
    int rc = infer_member(c, p, args, mesh.d.ranks[i], values);
    if (rc) return rc;
    pieces[i] = values[pb->outputs[k]].shape;
    dt = values[pb->outputs[k]].dtype;
  }
  dist_global_of_pieces(&mesh.d, pl, pieces, &global);
  return dist_tensor_outsider(c, name, dt, &global, &mesh, pl, out);
}

/* ---------------------------------------------------------------- gradients */

/* The layout of input j's gradient, as the members' daemons store it: the
 * tensor argument's mesh and global shape, its grad placements if the
 * program gives some; none (no_piece 0) for inputs the daemons give no
 * gradient, by their own rule (distd_input_wants_grad: an input no output
 * depends on gets zeros there, so a handle here). */
static void gradient_layout(const dist_program *p, const dist_arg *a, int j, dist_tensor *g) {
  const Dist__V1__ProgramInput *in = distd_program_message(p->checked)->inputs[j];
  memset(g, 0, sizeof *g);
  if (in->kind != DIST__V1__PROGRAM_INPUT__KIND__DTENSOR_LOCAL ||
      !distd_input_wants_grad(in, a->tensor->dtype))
    return;
  *g = *a->tensor;
  g->no_piece = 1;
  if (in->n_grad_placements == (size_t)g->mesh.d.ndim)
    dist_placements_from_pb(in->grad_placements, in->n_grad_placements, g->placements, NULL);
}

/* ---------------------------------------------------------------- call, backward */

int dist_prog_outputs_elsewhere(dist_client *c, const dist_program *p, const dist_arg *args,
                                char *const *names, dist_tensor **outs) {
  distd_vmeta *values = calloc(distd_program_n_values(p->checked) + 1, sizeof *values);
  int rc = values ? 0 : dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int k = 0; rc == 0 && k < p->n_outputs; k++)
    if (dist_prog_output_elsewhere(c, p, k))
      rc = output_handle(c, p, args, k, names[k], values, &outs[k]);
  for (int k = 0; rc && k < p->n_outputs; k++) dist_tensor_free(outs[k]), outs[k] = NULL;
  free(values);
  return rc;
}

/* The invocation and the output handles, into *inv and outs. */
static int outside_results(dist_client *c, const dist_program *p, const dist_arg *args,
                           const dist_call_opts *o, dist_invocation *v, dist_tensor **outs) {
  char **names = calloc((size_t)p->n_outputs + 1, sizeof *names);
  v->outside_grads = calloc((size_t)p->n_inputs + 1, sizeof *v->outside_grads);
  int rc = names && v->outside_grads ? dist_prog_name_outputs(c, p, o, v, names)
                                     : dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int j = 0; rc == 0 && j < p->n_inputs; j++)
    if (args[j].tensor) gradient_layout(p, &args[j], j, &v->outside_grads[j]);
  if (rc == 0 && outs) rc = dist_prog_outputs_elsewhere(c, p, args, names, outs);
  free(names);
  return rc;
}

int dist_prog_call_outside(dist_client *c, const dist_program *p, const dist_arg *args,
                           const dist_call_opts *o, uint64_t id, dist_invocation **inv,
                           dist_tensor **outs) {
  dist_invocation *v = dist_prog_invocation_new(p, 0, id, c->spmd_rank);
  int rc = v ? outside_results(c, p, args, o, v, outs)
             : dist_client_fail(c, DIST_ENOMEM, "out of memory");
  if (rc) {
    dist_invocation_free(v);
    return rc;
  }
  v->backward_done = o->no_grad != 0;
  *inv = v;
  c->err = (dist_errbuf)DIST_ERRBUF_INIT;
  return 0;
}

int dist_prog_backward_outside(dist_client *c, dist_invocation *inv,
                               const dist_arg *out_grads, const dist_backward_opts *o,
                               dist_tensor **grads) {
  if (inv->backward_done) /* the members' daemons no longer know the invocation */
    return dist_client_fail(c, DIST_ENOTFOUND, "dist_backward: invocation %llu has no "
                            "backward left (it ran, or the call was no_grad)",
                            (unsigned long long)inv->id);
  char **names = calloc((size_t)inv->n_inputs + 1, sizeof *names);
  char(*buf)[256] = calloc((size_t)inv->n_inputs + 1, sizeof *buf);
  int rc = names && buf ? dist_check_call_args(c, "dist_backward", "out_grads", out_grads,
                                               out_grads ? inv->n_outputs : 0, 1)
                        : dist_client_fail(c, DIST_ENOMEM, "out of memory");
  if (rc == 0) rc = dist_prog_name_grads(c, inv, o, names, buf);
  if (rc == 0) inv->backward_done = 1; /* as the members' daemons free theirs */
  for (int j = 0; rc == 0 && grads && j < inv->n_inputs; j++) {
    const dist_tensor *g = &inv->outside_grads[j];
    if (g->no_piece && names[j][0])
      rc = dist_tensor_outsider(c, names[j], g->dtype, &g->shape, &g->mesh, g->placements,
                                &grads[j]);
  }
  for (int j = 0; rc && grads && j < inv->n_inputs; j++) dist_tensor_free(grads[j]), grads[j] = NULL;
  free(names);
  free(buf);
  return rc;
}
