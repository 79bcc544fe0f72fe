/* Adding two gradients in the daemons, for the two reverse-mode walks that
 * meet a tensor used twice: the tape's backward (tape_backward.c) and a
 * sharded layer's backward (layer_run.c). */
#include <stdio.h>

#include "client_internal.h"

/* Pieces of a Partial(max), (min) or (prod) tensor added rank by rank do
 * not make the sum of the two values. */
static int sum_by_pieces(const dist_mesh_desc *m, const dist_placement *pl) {
  for (int d = 0; d < m->ndim; d++)
    if (pl[d].kind == DIST_PARTIAL && pl[d].reduce != DIST_REDUCE_SUM &&
        pl[d].reduce != DIST_REDUCE_AVG)
      return 0;
  return 1;
}

int dist_grad_add(dist_client *c, const char *a, const char *b, const dist_mesh_desc *m,
                  const dist_placement *pl, const char *out_name, dist_tensor **out,
                  dist_later *later) {
  if (b && !sum_by_pieces(m, pl))
    return dist_client_fail(c, DIST_ENOTSUP, "the gradients '%s' and '%s' are Partial "
                            "with a reduction other than sum or avg: their pieces do "
                            "not add up to their sum", a, b);
  dist_program *p = NULL;
  if (dist_program_new(b ? "grad.add" : "grad.copy", &p))
    return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  int ia = dist_input_dtensor(p, "a", DIST_DTYPE_INVALID);
  int ib = b ? dist_input_dtensor(p, "b", DIST_DTYPE_INVALID) : -1;
  dist_program_output(p, b ? dist_op_add(p, ia, ib) : dist_op_mul_scalar(p, ia, 1.0));
  dist_mesh mesh = {*m};
  dist_program_out_dist_attr(p, &mesh, pl, NULL);
  int rc = dist_program_register(c, p);
  dist_tensor ta = {0}, tb = {0};
  snprintf(ta.name, sizeof ta.name, "%s", a);
  if (b) snprintf(tb.name, sizeof tb.name, "%s", b);
  dist_arg args[2] = {{&ta, NULL}, {&tb, NULL}};
  const char *names[1] = {out_name};
  dist_call_opts o = {names, 1, 0, 1};
  dist_invocation *inv = NULL;
  /* out_name is libdist's (a step's or a tape's): a failure drops what it stored */
  if (rc == 0) rc = dist_local_layer_call_undoing(c, p, args, b ? 2 : 1, &o, &inv, out, later);
  dist_invocation_free(inv);
  dist_errbuf keep = c->err;
  dist_program_unregister(c, p); /* a no-op when registration failed */
  c->err = keep;
  dist_program_free(p);
  if (rc && b) dist_errbuf_prefix(&c->err, "adding the gradients '%s' and '%s': ", a, b);
  if (rc && !b) dist_errbuf_prefix(&c->err, "copying the gradient '%s': ", a);
  return rc;
}

int dist_grad_sum(dist_client *c, const char *of, const dist_tensor *acc,
                  dist_tensor *more, const char *out_name, dist_tensor **out,
                  dist_later *later) {
  if (!dist_mesh_equal(&acc->mesh.d, &more->mesh.d))
    return dist_client_fail(c, DIST_ENOTSUP, "the gradients of '%s' lie on different "
                            "meshes", of);
  int rc = dist_same_layout(acc, more) ? 0 : dist_reshard(c, more, NULL, acc->placements);
  if (rc == 0)
    rc = dist_grad_add(c, acc->name, more->name, &acc->mesh.d, acc->placements, out_name,
                       out, later);
  return rc;
}

/* Its one-output program's call. */
int dist_grad_add_ids(void) { return dist_local_layer_ids(1); }

/* A reshard of more to acc's layout (one id) when they differ, then the add. */
int dist_grad_sum_ids_max(void) { return 1 + dist_grad_add_ids(); }
