/* Checking programs: their structure when registered, and the dtype and
 * shape of every value (inference) before anything runs. Every error names
 * the node and op, or the input, it is about. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program_int.h"
#include "wire.h"

#define FAILN(rc, ...) distd_node_fail(eb, dist_fail(eb, rc, __VA_ARGS__), i, n)

int distd_node_fail(dist_errbuf *eb, int rc, size_t i,
                    const Dist__V1__ProgramNode *n) {
  if (n->name && n->name[0])
    dist_errbuf_prefix(eb, "node %zu (%s '%s'): ", i, distd_op_name(n->op),
                       n->name);
  else
    dist_errbuf_prefix(eb, "node %zu (%s): ", i, distd_op_name(n->op));
  return rc;
}

dist_dtype distd_node_dtype(const Dist__V1__ProgramNode *n, dist_dtype dflt) {
  return n->dtype == DIST__V1__DTYPE__DTYPE_INVALID ? dflt
                                                   : (dist_dtype)n->dtype;
}

static int dtype_ok(int dt) {
  return dt >= DIST_BOOL && dt <= DIST_FLOAT64;
}

static int is_binary(distd_op op) {
  return (op >= DIST__V1__OP_KIND__OP_ADD &&
          op <= DIST__V1__OP_KIND__OP_MINIMUM) ||
         distd_op_is_compare(op) || distd_op_is_logical(op);
}

/* Ops whose second operand may be the node's scalar. */
static int takes_scalar(const Dist__V1__ProgramNode *n) {
  return n->n_inputs == 1 &&
         (is_binary(n->op) || n->op == DIST__V1__OP_KIND__OP_SET_SLICE);
}

int distd_node_input_slot(const Dist__V1__ProgramNode *n, int k) {
  if (!takes_scalar(n)) return k;
  if (n->scalar_first) return k == 1 ? 0 : -1;
  return k == 0 ? 0 : -1;
}

int distd_node_input_metas(const Dist__V1__ProgramNode *n,
                           const distd_vmeta *values, distd_vmeta *in, int *n_in,
                           dist_errbuf *eb) {
  (void)eb;
  int k = 0;
  for (size_t j = 0; j < n->n_inputs; j++) in[k++] = values[n->inputs[j]];
  if (takes_scalar(n)) {
    distd_vmeta s = {in[0].dtype, {0, {0}}};
    if (n->scalar_first) {
      in[1] = in[0];
      in[0] = s;
    } else {
      in[1] = s;
    }
    k = 2;
  }
  *n_in = k;
  return 0;
}

int distd_node_inputs(const Dist__V1__ProgramNode *n, distd_tval *const *values,
                      distd_tval **in, int *n_in, dist_errbuf *eb) {
  int k = 0;
  for (size_t j = 0; j < n->n_inputs; j++)
    in[k++] = distd_tval_ref(values[n->inputs[j]]);
  if (takes_scalar(n)) {
    distd_tval *s = NULL;
    int rc = distd_tval_scalar(in[0]->dtype, n->scalar, &s, eb);
    if (rc) {
      distd_tval_unref(in[0]);
      return rc;
    }
    in[1] = n->scalar_first ? in[0] : s;
    if (n->scalar_first) in[0] = s;
    k = 2;
  }
  *n_in = k;
  return 0;
}

/* ------------------------------------------------------- structure */

static int check_input_decl(const Dist__V1__ProgramInput *in, size_t i,
                            dist_errbuf *eb) {
  if (in->kind > DIST__V1__PROGRAM_INPUT__KIND__COORD)
    return dist_fail(eb, DIST_EINVAL, "input %zu: unknown kind %d", i,
                     (int)in->kind);
  if (in->dtype != 0 && !dtype_ok(in->dtype))
    return dist_fail(eb, DIST_EINVAL, "input %zu: unknown dtype %d", i,
                     (int)in->dtype);
  if (in->n_shape > DIST_MAX_DIMS)
    return dist_fail(eb, DIST_EINVAL, "input %zu: %zu dims, at most %d", i,
                     in->n_shape, DIST_MAX_DIMS);
  if (in->kind != DIST__V1__PROGRAM_INPUT__KIND__COORD) return 0;
  if (!in->mesh || in->mesh_dim >= in->mesh->n_shape)
    return dist_fail(eb, DIST_EINVAL, "input %zu: COORD needs a mesh with "
                     "dim %u", i, in->mesh_dim);
  /* Checked as every mesh is: a dim of size 0 would divide by zero when
   * the coordinate is computed. */
  dist_mesh_desc m;
  int rc = dist_mesh_from_pb(in->mesh, &m, eb);
  if (rc) dist_errbuf_prefix(eb, "input %zu: ", i);
  return rc;
}

/* arange's length needs no shapes: a bad step is refused at registration
 * rather than at the first call. */
static int check_arange(const Dist__V1__ProgramNode *n, size_t i,
                        dist_errbuf *eb) {
  int64_t count;
  if (n->op != DIST__V1__OP_KIND__OP_ARANGE) return 0;
  int rc = distd_arange_count(n->scalar, n->end, n->step, &count, eb);
  return rc ? distd_node_fail(eb, rc, i, n) : 0;
}

static int check_node(const Dist__V1__ProgramNode *n, size_t i,
                      size_t n_defined, dist_errbuf *eb) {
  const distd_op_info *info = distd_op_info_get(n->op);
  if (!info)
    return dist_fail(eb, DIST_EINVAL, "node %zu: unknown op %d", i,
                     (int)n->op);
  if ((int)n->n_inputs < info->min_in || (int)n->n_inputs > info->max_in) {
    if (info->min_in == info->max_in)
      return FAILN(DIST_EINVAL, "takes %d inputs, got %zu", info->min_in,
                   n->n_inputs);
    return FAILN(DIST_EINVAL, "takes %d to %d inputs, got %zu", info->min_in,
                 info->max_in, n->n_inputs);
  }
  for (size_t j = 0; j < n->n_inputs; j++)
    if (n->inputs[j] >= n_defined)
      return FAILN(DIST_EINVAL, "input %zu is value %u, not defined before "
                   "this node (%zu values so far)", j, n->inputs[j],
                   n_defined);
  if (n->dtype != 0 && !dtype_ok(n->dtype))
    return FAILN(DIST_EINVAL, "unknown dtype %d", (int)n->dtype);
  if (n->op == DIST__V1__OP_KIND__OP_CAST && n->dtype == 0)
    return FAILN(DIST_EINVAL, "no target dtype");
  /* The kernel writes its output for the three reductions only. */
  if (n->op == DIST__V1__OP_KIND__OP_CROSS_ENTROPY &&
      ((int)n->reduction < 0 ||
       (int)n->reduction > DIST__V1__REDUCTION__REDUCTION_NONE))
    return FAILN(DIST_EINVAL, "unknown reduction %d", (int)n->reduction);
  if (n->n_shape > DIST_MAX_DIMS || n->n_axes > DIST_MAX_DIMS)
    return FAILN(DIST_EINVAL, "more than %d dims", DIST_MAX_DIMS);
  return check_arange(n, i, eb);
}

static int copy_message(const Dist__V1__Program *pb, Dist__V1__Program **out,
                        dist_errbuf *eb) {
  size_t len = dist__v1__program__get_packed_size(pb);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  dist__v1__program__pack(pb, buf);
  *out = dist__v1__program__unpack(NULL, len, buf);
  free(buf);
  if (!*out) return dist_fail(eb, DIST_EINVAL, "program does not encode");
  return 0;
}

static int declared_metas(const Dist__V1__Program *pb, distd_vmeta *m) {
  for (size_t i = 0; i < pb->n_inputs; i++) {
    const Dist__V1__ProgramInput *in = pb->inputs[i];
    if (in->kind >= DIST__V1__PROGRAM_INPUT__KIND__RANK) continue;
    if (!in->dtype || !in->check_shape) return 0;
    m[i].dtype = (dist_dtype)in->dtype;
    m[i].shape.ndim = (int)in->n_shape;
    for (size_t d = 0; d < in->n_shape; d++) {
      if (in->shape[d] < 0) return 0;
      m[i].shape.dims[d] = in->shape[d];
    }
  }
  return 1;
}

int distd_program_new(const Dist__V1__Program *pb, distd_program **out,
                      dist_errbuf *eb) {
  distd_program *p = NULL;
  distd_vmeta *metas = NULL;
  int rc = 0;
  *out = NULL;
  if (pb->version > 1) {
    rc = dist_fail(eb, DIST_ENOTSUP, "program version %u not supported",
                   pb->version);
    goto out;
  }
  size_t nv = pb->n_inputs;
  for (size_t i = 0; i < pb->n_inputs; i++)
    if ((rc = check_input_decl(pb->inputs[i], i, eb))) goto out;
  if (!(p = calloc(1, sizeof *p)) ||
      !(p->node_first_value = calloc(pb->n_nodes + 1, sizeof(int)))) {
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < pb->n_nodes; i++) {
    if ((rc = check_node(pb->nodes[i], i, nv, eb))) goto out;
    p->node_first_value[i] = (int)nv;
    nv += (size_t)distd_op_info_get(pb->nodes[i]->op)->n_out;
  }
  for (size_t i = 0; i < pb->n_outputs; i++)
    if (pb->outputs[i] >= nv) {
      rc = dist_fail(eb, DIST_EINVAL, "output %zu is value %u, but the "
                     "program has %zu values", i, pb->outputs[i], nv);
      goto out;
    }
  if (pb->n_outputs != pb->n_out_dist_attrs) {
    rc = dist_fail(eb, DIST_EMISMATCH, "program has %zu outputs but %zu "
                   "out_dist_attrs entries", pb->n_outputs,
                   pb->n_out_dist_attrs);
    goto out;
  }
  p->refs = 1;
  p->n_values = nv;
  if ((rc = copy_message(pb, &p->pb, eb))) goto out;
  metas = calloc(pb->n_inputs + 1, sizeof *metas);
  if (!metas) {
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory");
    goto out;
  }
  if (declared_metas(pb, metas) && (rc = distd_program_infer(p, metas, NULL, eb)))
    goto out;
  *out = p;
  p = NULL;
out:
  free(metas);
  distd_program_free(p);
  return rc;
}

distd_program *distd_program_ref(distd_program *p) {
  if (p) __atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED);
  return p;
}

void distd_program_free(distd_program *p) {
  if (!p) return;
  /* A program that failed construction has refs 0 and is freed at once. */
  if (p->refs > 0 && __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) > 0)
    return;
  if (p->pb) dist__v1__program__free_unpacked(p->pb, NULL);
  free(p->node_first_value);
  free(p);
}

const Dist__V1__Program *distd_program_message(const distd_program *p) {
  return p->pb;
}
size_t distd_program_n_inputs(const distd_program *p) { return p->pb->n_inputs; }
size_t distd_program_n_outputs(const distd_program *p) {
  return p->pb->n_outputs;
}
size_t distd_program_n_values(const distd_program *p) { return p->n_values; }

/* ------------------------------------------------------- inference */

static int check_input_meta(const Dist__V1__ProgramInput *in, size_t i,
                            const distd_vmeta *m, dist_errbuf *eb) {
  const char *name = in->name && in->name[0] ? in->name : "";
  if (in->dtype && (int)m->dtype != (int)in->dtype)
    return dist_fail(eb, DIST_EMISMATCH, "input %zu%s%s%s: dtype %s, the "
                     "program expects %s", i, *name ? " '" : "", name,
                     *name ? "'" : "", dist_dtype_name(m->dtype),
                     dist_dtype_name((dist_dtype)in->dtype));
  int ok = !in->check_shape || (size_t)m->shape.ndim == in->n_shape;
  for (size_t d = 0; ok && in->check_shape && d < in->n_shape; d++)
    if (in->shape[d] >= 0 && in->shape[d] != m->shape.dims[d]) ok = 0;
  if (!ok) {
    char got[128], want[160] = "[";
    dist_shape_format(&m->shape, got, sizeof got);
    for (size_t d = 0; d < in->n_shape; d++) {
      size_t l = strlen(want);
      snprintf(want + l, sizeof want - l, "%s%lld", d ? ", " : "",
               (long long)in->shape[d]);
    }
    strncat(want, "]", sizeof want - strlen(want) - 1);
    return dist_fail(eb, DIST_EMISMATCH, "input %zu%s%s%s: shape %s, the "
                     "program expects %s", i, *name ? " '" : "", name,
                     *name ? "'" : "", got, want);
  }
  return 0;
}

/* Every value's shape within the bound of a tensor (dist_shape_make), so
 * that no later element count wraps: a declared input, a broadcast or a
 * concat could exceed it otherwise. */
static int meta_size_ok(const distd_vmeta *m, dist_errbuf *eb) {
  dist_shape s;
  return dist_shape_make(m->shape.ndim, m->shape.dims, &s, eb);
}

int distd_program_infer(const distd_program *p, const distd_vmeta *inputs,
                        distd_vmeta *values, dist_errbuf *eb) {
  const Dist__V1__Program *pb = p->pb;
  distd_vmeta *v = values ? values : calloc(p->n_values + 1, sizeof *v);
  int rc = 0;
  if (!v) return dist_fail(eb, DIST_ENOMEM, "out of memory");
  for (size_t i = 0; i < pb->n_inputs; i++) {
    if (pb->inputs[i]->kind >= DIST__V1__PROGRAM_INPUT__KIND__RANK) {
      v[i] = (distd_vmeta){DIST_INT64, {0, {0}}};
      continue;
    }
    if ((rc = check_input_meta(pb->inputs[i], i, &inputs[i], eb))) goto out;
    if ((rc = meta_size_ok(&inputs[i], eb))) {
      dist_errbuf_prefix(eb, "input %zu: ", i);
      goto out;
    }
    v[i] = inputs[i];
  }
  for (size_t i = 0; i < pb->n_nodes; i++) {
    const Dist__V1__ProgramNode *n = pb->nodes[i];
    distd_vmeta in[DISTD_MAX_NODE_INPUTS + 1];
    int n_in;
    distd_node_input_metas(n, v, in, &n_in, eb);
    int first = p->node_first_value[i], n_out = distd_op_info_get(n->op)->n_out;
    rc = distd_infer_node(n, in, n_in, v + first, eb);
    for (int k = 0; !rc && k < n_out; k++) rc = meta_size_ok(&v[first + k], eb);
    if (rc) {
      distd_node_fail(eb, rc, i, n);
      goto out;
    }
  }
out:
  if (!values) free(v);
  return rc;
}
