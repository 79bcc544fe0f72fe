/* LocalLayer in libdist: the program builder (dist_program); its op
 * builders are in program_ops.c, registration, calls, backward and release
 * over dist.v1.LocalLayer (program.proto) in program_register.c,
 * program_call.c and program_backward.c.
 *
 * The builder hands out its own value ids and translates them to the
 * program's ids (inputs first, then node outputs) when it registers, so
 * inputs may be declared after ops. Errors while building are sticky (see
 * dist.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program_internal.h"

/* ---------------------------------------------------------------- errors */

int dist_prog_fail(dist_program *p, int code, const char *fmt, ...) {
  if (p->err) return p->err; /* keep the first error */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->errmsg, sizeof p->errmsg, fmt, ap);
  va_end(ap);
  p->err = code;
  return code;
}

const char *dist_program_errmsg(const dist_program *p) {
  return p ? p->errmsg : "";
}

/* An array argument `what` (named `arg`) of n entries: at least `least`,
 * and a NULL list only when empty (it is copied from). */
int dist_prog_check_list(dist_program *p, const char *op, const char *what, const char *arg,
                         const void *list, int n, int least) {
  if (p->err) return p->err;
  if (n < least)
    return dist_prog_fail(p, DIST_EINVAL, "%s: %d %s (at least %d)", op, n, what, least);
  if (!list && n > 0)
    return dist_prog_fail(p, DIST_EINVAL, "%s: %s is NULL with %d entries", op, arg, n);
  return 0;
}

/* Every operand must be a value of p. */
static int check_ids(dist_program *p, const char *op, const int *ids, int n) {
  if (p->err) return p->err;
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= p->n_values)
      return dist_prog_fail(p, DIST_EINVAL, "%s: operand %d is value %d, which this "
                            "program does not have", op, i, ids[i]);
  return 0;
}

/* ---------------------------------------------------------------- builder */

/* Every builder refuses a NULL program first: with no program to keep the
 * error in, it is the thread's dist_errmsg(NULL). */

int dist_program_new(const char *name, dist_program **out) {
  if (!out) return dist_null_handle(__func__, "out");
  dist_program *p = calloc(1, sizeof *p);
  *out = NULL;
  if (!p) return dist_thread_fail(DIST_ENOMEM, "%s: out of memory", __func__);
  snprintf(p->name, sizeof p->name, "%s", name && name[0] ? name : "program");
  *out = p;
  return 0;
}

static void node_free(bnode *n) {
  if (!n) return;
  free(n->ins);
  free(n->ids);
  free(n->pb.axes);
  free(n->pb.shape);
  free(n->pb.perm);
  free(n->pb.starts);
  free(n->pb.ends);
  free(n->pb.steps);
  free(n->pb.values);
  if (n->pb.name != protobuf_c_empty_string) free(n->pb.name);
  free(n);
}

static void input_free(Dist__V1__ProgramInput *in) {
  if (!in) return;
  if (in->name != protobuf_c_empty_string) free(in->name);
  free(in->shape);
  free(in);
}

void dist_program_free(dist_program *p) {
  if (!p) return;
  dist_prog_unregister_outside(p); /* an outsider's, kept here only */
  for (int i = 0; i < p->n_inputs; i++) {
    input_free(p->inputs[i]);
    free(p->input_w[i]);
  }
  for (int i = 0; i < p->n_nodes; i++) node_free(p->nodes[i]);
  for (int i = 0; i < p->n_attrs; i++) {
    free(p->attrs[i]->w);
    free(p->attrs[i]->grad);
    free(p->attrs[i]);
  }
  free(p->inputs);
  free(p->input_w);
  free(p->nodes);
  free(p->values);
  free(p->outputs);
  free(p->attrs);
  free(p);
}

/* Makes room for element n of a growable array: the capacity is 4, then
 * doubles whenever n reaches a power of two, so none is stored. */
static int grow(void **arr, int n, size_t elem) {
  if (n != 0 && (n < 4 || (n & (n - 1)) != 0)) return 0;
  size_t cap = n ? (size_t)n * 2 : 4;
  void *q = realloc(*arr, cap * elem);
  if (!q) return DIST_ENOMEM;
  *arr = q;
  return 0;
}

static int add_value(dist_program *p, int input, int node, int slot) {
  if (grow((void **)&p->values, p->n_values, sizeof *p->values))
    return dist_prog_fail(p, DIST_ENOMEM, "out of memory");
  p->values[p->n_values] = (bvalue){input, node, slot};
  return p->n_values++;
}

static int add_input(dist_program *p, int kind, const char *name,
                     dist_dtype dt, Dist__V1__ProgramInput **out) {
  if (p->err) return p->err;
  Dist__V1__ProgramInput *in = calloc(1, sizeof *in);
  if (!in || grow((void **)&p->inputs, p->n_inputs, sizeof *p->inputs) ||
      grow((void **)&p->input_w, p->n_inputs, sizeof *p->input_w)) {
    free(in);
    return dist_prog_fail(p, DIST_ENOMEM, "out of memory");
  }
  dist__v1__program_input__init(in);
  in->kind = (Dist__V1__ProgramInput__Kind)kind;
  in->dtype = (Dist__V1__DType)dt;
  if (name && name[0] && !(in->name = strdup(name))) {
    free(in);
    return dist_prog_fail(p, DIST_ENOMEM, "out of memory for input '%s'", name);
  }
  p->inputs[p->n_inputs] = in;
  p->input_w[p->n_inputs] = NULL;
  int id = add_value(p, p->n_inputs, -1, 0);
  p->n_inputs++;
  if (out) *out = in;
  return id;
}

int dist_input_dtensor(dist_program *p, const char *name, dist_dtype dt) {
  if (!p) return dist_null_handle(__func__, "p");
  return add_input(p, DIST__V1__PROGRAM_INPUT__KIND__DTENSOR_LOCAL, name, dt,
                   NULL);
}

int dist_input_value(dist_program *p, const char *name, dist_dtype dt) {
  if (!p) return dist_null_handle(__func__, "p");
  return add_input(p, DIST__V1__PROGRAM_INPUT__KIND__VALUE, name, dt, NULL);
}

int dist_input_rank(dist_program *p) {
  if (!p) return dist_null_handle(__func__, "p");
  return add_input(p, DIST__V1__PROGRAM_INPUT__KIND__RANK, "rank",
                   DIST_INT64, NULL);
}

int dist_input_coord(dist_program *p, const dist_mesh *mesh, int dim) {
  if (!p) return dist_null_handle(__func__, "p");
  if (!p->err && (!mesh || dim < 0 || dim >= mesh->d.ndim))
    return dist_prog_fail(p, DIST_EINVAL, "coord input: mesh dim %d out of range", dim);
  Dist__V1__ProgramInput *in = NULL;
  int id = add_input(p, DIST__V1__PROGRAM_INPUT__KIND__COORD, "coord",
                     DIST_INT64, &in);
  if (id < 0) return id;
  dist_wire_meta *w = calloc(1, sizeof *w);
  if (!w) return dist_prog_fail(p, DIST_ENOMEM, "out of memory");
  dist_mesh_to_pb(&mesh->d, w);
  in->mesh = &w->mesh;
  in->mesh_dim = (uint32_t)dim;
  p->input_w[p->values[id].input] = w;
  return id;
}

static Dist__V1__ProgramInput *input_of(dist_program *p, int id,
                                        const char *what) {
  if (check_ids(p, what, &id, 1)) return NULL;
  if (p->values[id].input < 0) {
    dist_prog_fail(p, DIST_EINVAL, "%s: value %d is not an input", what, id);
    return NULL;
  }
  return p->inputs[p->values[id].input];
}

int dist_input_set_shape(dist_program *p, int id, int ndim,
                         const int64_t *shape) {
  if (!p) return dist_null_handle(__func__, "p");
  Dist__V1__ProgramInput *in = input_of(p, id, "input shape");
  if (!in) return p->err;
  if (ndim < 0 || ndim > DIST_MAX_DIMS)
    return dist_prog_fail(p, DIST_EINVAL, "input shape: %d dims", ndim);
  if (dist_prog_check_list(p, "dist_input_set_shape", "dims", "shape", shape, ndim, 0))
    return p->err;
  free(in->shape);
  in->shape = malloc(sizeof(int64_t) * ((size_t)ndim + 1));
  if (ndim) memcpy(in->shape, shape, sizeof(int64_t) * (size_t)ndim);
  in->n_shape = (size_t)ndim;
  in->check_shape = 1;
  return 0;
}

int dist_input_set_no_grad(dist_program *p, int id) {
  if (!p) return dist_null_handle(__func__, "p");
  Dist__V1__ProgramInput *in = input_of(p, id, "no_grad");
  if (!in) return p->err;
  in->no_grad = 1;
  return 0;
}

int dist_input_set_grad_placements(dist_program *p, int id,
                                   const dist_placement *placements, int n) {
  if (!p) return dist_null_handle(__func__, "p");
  Dist__V1__ProgramInput *in = input_of(p, id, "grad placements");
  if (!in) return p->err;
  if (n < 0 || n > DIST_MAX_MESH_DIMS)
    return dist_prog_fail(p, DIST_EINVAL, "grad placements: %d given", n);
  if (dist_prog_check_list(p, "dist_input_set_grad_placements", "placements", "placements",
                           placements, n, 0))
    return p->err;
  int i = p->values[id].input;
  if (!p->input_w[i] && !(p->input_w[i] = calloc(1, sizeof(dist_wire_meta))))
    return dist_prog_fail(p, DIST_ENOMEM, "out of memory");
  dist_placements_to_pb(placements, n, p->input_w[i]);
  in->n_grad_placements = (size_t)n;
  in->grad_placements = p->input_w[i]->placement_ptrs;
  return 0;
}

/* A new node of op with the given operands; returns its first value id and
 * the node in *out. */
int dist_prog_add_node(dist_program *p, int op, const int *ins, int n_in,
                       bnode **out) {
  char what[32];
  snprintf(what, sizeof what, "op %d", op);
  if (check_ids(p, what, ins, n_in)) return p->err;
  bnode *n = calloc(1, sizeof *n);
  if (!n || !(n->ins = malloc(sizeof(int) * ((size_t)n_in + 1))) ||
      !(n->ids = malloc(sizeof(uint32_t) * ((size_t)n_in + 1))) ||
      grow((void **)&p->nodes, p->n_nodes, sizeof *p->nodes)) {
    node_free(n);
    return dist_prog_fail(p, DIST_ENOMEM, "out of memory");
  }
  dist__v1__program_node__init(&n->pb);
  n->pb.op = (Dist__V1__OpKind)op;
  if (n_in) memcpy(n->ins, ins, sizeof(int) * (size_t)n_in);
  n->n_in = n_in;
  n->pb.inputs = n->ids;
  n->pb.n_inputs = (size_t)n_in;
  p->nodes[p->n_nodes] = n;
  int id = add_value(p, -1, p->n_nodes, 0);
  if (id >= 0 && op == DIST__V1__OP_KIND__OP_TOPK) add_value(p, -1, p->n_nodes, 1);
  p->n_nodes++;
  if (out) *out = n;
  return id;
}

int dist_op_set_label(dist_program *p, int id, const char *label) {
  if (!p) return dist_null_handle(__func__, "p");
  if (check_ids(p, "label", &id, 1)) return p->err;
  if (p->values[id].node < 0)
    return dist_prog_fail(p, DIST_EINVAL, "label: value %d is an input", id);
  bnode *n = p->nodes[p->values[id].node];
  char *copy = strdup(label ? label : "");
  if (!copy) return dist_prog_fail(p, DIST_ENOMEM, "out of memory for label '%s'", label ? label : "");
  if (n->pb.name != protobuf_c_empty_string) free(n->pb.name);
  n->pb.name = copy;
  return 0;
}

/* ---------------------------------------------------------------- outputs */

int dist_program_output(dist_program *p, int value) {
  if (!p) return dist_null_handle(__func__, "p");
  if (check_ids(p, "output", &value, 1)) return p->err;
  if (grow((void **)&p->outputs, p->n_outputs, sizeof *p->outputs))
    return dist_prog_fail(p, DIST_ENOMEM, "out of memory");
  p->outputs[p->n_outputs++] = value;
  return 0;
}

int dist_program_out_dist_attr(dist_program *p, const dist_mesh *mesh,
                               const dist_placement *placements,
                               const dist_placement *grad_placements) {
  if (!p) return dist_null_handle(__func__, "p");
  if (p->err) return p->err;
  if (!mesh || !placements)
    return dist_prog_fail(p, DIST_EINVAL, "out_dist_attr %d: no mesh or placements",
                          p->n_attrs);
  battr *a = calloc(1, sizeof *a);
  if (!a || !(a->w = calloc(1, sizeof *a->w)) ||
      (grad_placements && !(a->grad = calloc(1, sizeof *a->grad))) ||
      grow((void **)&p->attrs, p->n_attrs, sizeof *p->attrs)) {
    if (a) free(a->w), free(a->grad);
    free(a);
    return dist_prog_fail(p, DIST_ENOMEM, "out of memory");
  }
  dist__v1__dist_attr__init(&a->pb);
  a->mesh = mesh->d;
  dist_mesh_to_pb(&mesh->d, a->w);
  dist_placements_to_pb(placements, mesh->d.ndim, a->w);
  a->pb.mesh = &a->w->mesh;
  a->pb.n_placements = (size_t)mesh->d.ndim;
  a->pb.placements = a->w->placement_ptrs;
  if (grad_placements) {
    dist_placements_to_pb(grad_placements, mesh->d.ndim, a->grad);
    a->pb.n_grad_placements = (size_t)mesh->d.ndim;
    a->pb.grad_placements = a->grad->placement_ptrs;
  }
  p->attrs[p->n_attrs++] = a;
  return 0;
}

/* The accessors given no program return -1, which no program gives, and
 * say why in dist_errmsg(NULL). */
int dist_program_nranks(const dist_program *p) {
  if (!p) return dist_null_handle(__func__, "p"), -1;
  return p->nranks;
}
int dist_program_n_inputs(const dist_program *p) {
  if (!p) return dist_null_handle(__func__, "p"), -1;
  return p->n_inputs;
}
int dist_program_n_outputs(const dist_program *p) {
  if (!p) return dist_null_handle(__func__, "p"), -1;
  return p->n_outputs;
}

int dist_program_rank_at(const dist_program *p, int i) {
  if (!p) return dist_null_handle(__func__, "p"), -1;
  return i >= 0 && i < p->nranks ? p->ranks[i] : -1;
}
