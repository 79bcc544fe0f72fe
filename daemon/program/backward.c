/* Reverse mode over an invocation: seeds the output gradients, walks the
 * nodes backwards applying each op's gradient rule (grad_rules.c), and sums
 * the gradients reaching each value. Only values that depend on a
 * differentiable input get gradients; nodes that cannot reach one are
 * skipped. */
#include <stdlib.h>
#include <string.h>

#include "program_int.h"

/* needs[v]: value v depends on an input that wants a gradient. */
static void mark_needs(const distd_invocation *inv, uint8_t *needs) {
  const distd_program *p = inv->prog;
  const Dist__V1__Program *pb = p->pb;
  for (size_t i = 0; i < pb->n_inputs; i++)
    needs[i] = (uint8_t)distd_input_wants_grad(pb->inputs[i], inv->values[i]->dtype);
  for (size_t i = 0; i < pb->n_nodes; i++) {
    const Dist__V1__ProgramNode *n = pb->nodes[i];
    int any = 0;
    for (size_t j = 0; j < n->n_inputs; j++) any |= needs[n->inputs[j]];
    int nout = distd_op_info_get(n->op)->n_out;
    for (int k = 0; k < nout; k++) {
      int v = p->node_first_value[i] + k;
      needs[v] = (uint8_t)(any && distd_op_differentiable(n->op) &&
                           dist_dtype_is_float(inv->values[v]->dtype));
    }
  }
}

/* grads[v] += g, with g converted to v's dtype. Takes g's reference. */
static int accumulate(distd_tval **slot, const distd_tval *v, distd_tval *g,
                      dist_errbuf *eb) {
  distd_tval *cg = NULL, *sum = NULL;
  int rc = distd_tval_cast(g, v->dtype, &cg, eb);
  distd_tval_unref(g);
  if (rc) return rc;
  if (!dist_shape_equal(&cg->shape, &v->shape)) {
    distd_tval_unref(cg);
    return dist_fail(eb, DIST_EINTERNAL, "gradient shape differs from value");
  }
  if (!*slot) {
    *slot = cg;
    return 0;
  }
  rc = distd_k_binary(DIST__V1__OP_KIND__OP_ADD, *slot, cg, &sum, eb);
  distd_tval_unref(cg);
  if (rc) return rc;
  distd_tval_unref(*slot);
  *slot = sum;
  return 0;
}

/* Says which half of "a single one-element output" fails: a program with
 * one output of [2, 3] was told it "has 1 outputs". */
static int no_scalar_output(const Dist__V1__Program *pb, const distd_invocation *inv,
                            dist_errbuf *eb) {
  char shape[128] = "";
  if (pb->n_outputs == 1) dist_shape_format(&inv->outputs[0]->shape, shape, sizeof shape);
  return dist_fail(eb, DIST_EINVAL, "backward without output gradients needs a single "
                   "one-element output; the program has %zu outputs%s%s", pb->n_outputs,
                   shape[0] ? ", of shape " : "", shape);
}

/* An integer or bool output has no gradient to start from, given or 1. */
static int check_float_output(const distd_tval *o, size_t i, dist_errbuf *eb) {
  if (dist_dtype_is_float(o->dtype)) return 0;
  return dist_fail(eb, DIST_EINVAL, "output %zu is %s: it has no gradient", i,
                   dist_dtype_name(o->dtype));
}

static int seed(distd_invocation *inv, distd_tval *const *out_grads,
                distd_tval **grads, dist_errbuf *eb) {
  const Dist__V1__Program *pb = inv->prog->pb;
  if (!out_grads) {
    if (pb->n_outputs != 1 || inv->outputs[0]->numel != 1)
      return no_scalar_output(pb, inv, eb);
    distd_tval *one = NULL;
    const distd_tval *o = inv->outputs[0];
    int rc = check_float_output(o, 0, eb);
    if (rc) return rc;
    rc = distd_k_full(o->dtype, &o->shape, 1, &one, eb);
    return rc ? rc : accumulate(&grads[pb->outputs[0]], o, one, eb);
  }
  for (size_t i = 0; i < pb->n_outputs; i++) {
    const distd_tval *o = inv->outputs[i];
    if (!out_grads[i]) continue;
    if (!dist_shape_equal(&out_grads[i]->shape, &o->shape)) {
      char a[128], b[128];
      dist_shape_format(&out_grads[i]->shape, a, sizeof a);
      dist_shape_format(&o->shape, b, sizeof b);
      return dist_fail(eb, DIST_EMISMATCH, "gradient of output %zu has shape "
                       "%s, the output %s", i, a, b);
    }
    int rc = check_float_output(o, i, eb);
    if (rc) return rc;
    rc = accumulate(&grads[pb->outputs[i]], o, distd_tval_ref(out_grads[i]),
                        eb);
    if (rc) return rc;
  }
  return 0;
}

static int backward_one(distd_invocation *inv, size_t i, const uint8_t *needs,
                        distd_tval **grads, dist_errbuf *eb) {
  const distd_program *p = inv->prog;
  const Dist__V1__ProgramNode *n = p->pb->nodes[i];
  int first = p->node_first_value[i], nout = distd_op_info_get(n->op)->n_out;
  distd_tval *in[DISTD_MAX_NODE_INPUTS + 1], *gin[DISTD_MAX_NODE_INPUTS + 1];
  uint8_t need[DISTD_MAX_NODE_INPUTS + 1];
  int any_grad = 0, n_in, rc;
  for (int k = 0; k < nout; k++) any_grad |= grads[first + k] != NULL;
  if (!any_grad || !needs[first]) return 0;
  if ((rc = distd_node_inputs(n, inv->values, in, &n_in, eb))) return rc;
  for (int k = 0; k < n_in; k++) {
    int slot = distd_node_input_slot(n, k);
    need[k] = slot >= 0 && needs[n->inputs[slot]];
  }
  rc = distd_backward_node(n, in, n_in, need, inv->values + first,
                           grads + first, gin, eb);
  for (int k = 0; k < n_in; k++) {
    int slot = distd_node_input_slot(n, k);
    if (!rc && gin[k] && need[k]) {
      int v = (int)n->inputs[slot];
      rc = accumulate(&grads[v], inv->values[v], gin[k], eb);
    } else {
      distd_tval_unref(gin[k]);
    }
    distd_tval_unref(in[k]);
  }
  return rc ? distd_node_fail(eb, rc, i, n) : 0;
}

static int collect(distd_invocation *inv, const uint8_t *needs,
                   distd_tval **grads, dist_errbuf *eb) {
  size_t n = inv->prog->pb->n_inputs;
  if (!(inv->input_grads = calloc(n + 1, sizeof(distd_tval *))))
    return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    if (!needs[i]) continue;
    if (grads[i]) {
      inv->input_grads[i] = grads[i];
      grads[i] = NULL;
      continue;
    }
    const distd_tval *v = inv->values[i];
    int rc = distd_k_full(v->dtype, &v->shape, 0, &inv->input_grads[i], eb);
    if (rc) return rc;
  }
  return 0;
}

int distd_invocation_backward(distd_invocation *inv,
                              distd_tval *const *out_grads, dist_errbuf *eb) {
  size_t nv = inv->prog->n_values;
  distd_tval **grads = NULL;
  uint8_t *needs = NULL;
  int rc = 0;
  if (inv->backward_done)
    return dist_fail(eb, DIST_EINVAL, "backward already ran on this invocation");
  inv->backward_done = 1; /* once, even when it fails */
  if (!(grads = calloc(nv + 1, sizeof *grads)) || !(needs = calloc(nv + 1, 1))) {
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory");
    goto out;
  }
  mark_needs(inv, needs);
  if ((rc = seed(inv, out_grads, grads, eb))) goto out;
  for (size_t i = inv->prog->pb->n_nodes; i-- > 0;)
    if ((rc = backward_one(inv, i, needs, grads, eb))) goto out;
  if ((rc = collect(inv, needs, grads, eb))) goto out;
  distd_invocation_drop_values(inv);
out:
  for (size_t v = 0; grads && v < nv; v++) distd_tval_unref(grads[v]);
  free(grads);
  free(needs);
  return rc;
}
