/* A tiny builder of dist.v1.Program messages for the engine's tests (the
 * public builder is libdist's). Everything it allocates is freed by
 * pbb_free. Value ids are returned as the program numbers them: inputs
 * first, then each node's outputs. */
#ifndef TEST_PROGRAM_BUILD_H
#define TEST_PROGRAM_BUILD_H

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "program.pb-c.h"

#define PBB_MAX 256
#define PB_END (-1)

typedef struct pb_build {
  Dist__V1__Program prog;
  Dist__V1__ProgramInput *inputs[PBB_MAX];
  Dist__V1__ProgramNode *nodes[PBB_MAX];
  uint32_t outputs[PBB_MAX];
  Dist__V1__DistAttr *attrs[PBB_MAX];
  Dist__V1__ProgramNode *last; /* the node the attribute setters change */
  void *allocs[4 * PBB_MAX];
  int nallocs;
  uint32_t next_value;
} pb_build;

static inline void *pbb_alloc(pb_build *b, size_t n) {
  void *p = calloc(1, n ? n : 1);
  b->allocs[b->nallocs++] = p;
  return p;
}

static inline void pbb_init(pb_build *b) {
  memset(b, 0, sizeof *b);
  dist__v1__program__init(&b->prog);
  b->prog.version = 1;
  b->prog.inputs = b->inputs;
  b->prog.nodes = b->nodes;
  b->prog.outputs = b->outputs;
  b->prog.out_dist_attrs = b->attrs;
}

static inline void pbb_free(pb_build *b) {
  for (int i = 0; i < b->nallocs; i++) free(b->allocs[i]);
  b->nallocs = 0;
}

/* An input of a kind (DTENSOR_LOCAL, VALUE, RANK, COORD); dtype 0 = any. */
static inline uint32_t pbb_input(pb_build *b, Dist__V1__ProgramInput__Kind kind,
                                 Dist__V1__DType dtype) {
  Dist__V1__ProgramInput *in = pbb_alloc(b, sizeof *in);
  dist__v1__program_input__init(in);
  in->kind = kind;
  in->dtype = dtype;
  b->inputs[b->prog.n_inputs++] = in;
  return b->next_value++;
}

/* Declares the input's shape (checked at registration and invocation). */
static inline void pbb_input_shape(pb_build *b, uint32_t input, int n, ...) {
  Dist__V1__ProgramInput *in = b->inputs[input];
  va_list ap;
  va_start(ap, n);
  in->check_shape = 1;
  in->n_shape = (size_t)n;
  in->shape = pbb_alloc(b, sizeof(int64_t) * (size_t)n);
  for (int i = 0; i < n; i++) in->shape[i] = va_arg(ap, long long);
  va_end(ap);
}

/* A node with the given input value ids (ending with PB_END); returns the id
 * of its first output. */
static inline uint32_t pbb_node(pb_build *b, Dist__V1__OpKind op, ...) {
  Dist__V1__ProgramNode *n = pbb_alloc(b, sizeof *n);
  dist__v1__program_node__init(n);
  n->op = op;
  n->inputs = pbb_alloc(b, sizeof(uint32_t) * 64);
  va_list ap;
  va_start(ap, op);
  for (int v; (v = va_arg(ap, int)) != PB_END;) n->inputs[n->n_inputs++] = (uint32_t)v;
  va_end(ap);
  b->nodes[b->prog.n_nodes++] = n;
  b->last = n;
  uint32_t id = b->next_value;
  b->next_value += op == DIST__V1__OP_KIND__OP_TOPK ? 2 : 1;
  return id;
}

static inline int64_t *pbb_i64s(pb_build *b, size_t *count, int n, va_list ap) {
  int64_t *a = pbb_alloc(b, sizeof(int64_t) * (size_t)n);
  for (int i = 0; i < n; i++) a[i] = va_arg(ap, long long);
  *count = (size_t)n;
  return a;
}

#define PBB_SETTER(name, field)                                               \
  static inline void pbb_##name(pb_build *b, int n, ...) {                    \
    va_list ap;                                                               \
    va_start(ap, n);                                                          \
    b->last->field = pbb_i64s(b, &b->last->n_##field, n, ap);                 \
    va_end(ap);                                                               \
  }
PBB_SETTER(axes, axes)
PBB_SETTER(shape, shape)
PBB_SETTER(perm, perm)
PBB_SETTER(starts, starts)
PBB_SETTER(ends, ends)
PBB_SETTER(steps, steps)

/* A one-axis slice [start, end) of the last node. */
static inline void pbb_slice1(pb_build *b, long long axis, long long start,
                              long long end) {
  pbb_axes(b, 1, axis);
  pbb_starts(b, 1, start);
  pbb_ends(b, 1, end);
}

static inline void pbb_values(pb_build *b, int n, const double *v) {
  b->last->values = pbb_alloc(b, sizeof(double) * (size_t)n);
  memcpy(b->last->values, v, sizeof(double) * (size_t)n);
  b->last->n_values = (size_t)n;
}

/* An out_dist_attrs entry on a 1-d mesh [0, 1] with one placement. */
static inline void pbb_attr(pb_build *b, Dist__V1__Placement__Kind kind) {
  Dist__V1__DistAttr *a = pbb_alloc(b, sizeof *a);
  dist__v1__dist_attr__init(a);
  Dist__V1__Mesh *m = pbb_alloc(b, sizeof *m);
  dist__v1__mesh__init(m);
  m->n_shape = 1;
  m->shape = pbb_alloc(b, sizeof(uint32_t));
  m->shape[0] = 2;
  m->n_ranks = 2;
  m->ranks = pbb_alloc(b, 2 * sizeof(uint32_t));
  m->ranks[1] = 1;
  a->mesh = m;
  Dist__V1__Placement *p = pbb_alloc(b, sizeof *p);
  dist__v1__placement__init(p);
  p->kind = kind;
  a->placements = pbb_alloc(b, sizeof(Dist__V1__Placement *));
  a->placements[0] = p;
  a->n_placements = 1;
  b->attrs[b->prog.n_out_dist_attrs++] = a;
}

/* An output with a Partial(sum) out_dist_attrs entry. */
static inline void pbb_output(pb_build *b, uint32_t value) {
  b->outputs[b->prog.n_outputs++] = value;
  pbb_attr(b, DIST__V1__PLACEMENT__KIND__PARTIAL);
}

#endif
