/* The LocalLayer program and invocation, and the pieces their files share:
 * the builder (program_build.c) and its op builders (program_ops.c),
 * registration (program_register.c), calls (program_call.c) and backward
 * (program_backward.c). Not installed. */
#ifndef DIST_PROGRAM_INTERNAL_H
#define DIST_PROGRAM_INTERNAL_H

#include "client_internal.h"
#include "program.pb-c.h"
#include "wire.h"

#define LL_METHOD(m) "/dist.v1.LocalLayer/" m

/* A builder value: input `input`, or output `slot` of node `node`. */
typedef struct bvalue {
  int input, node, slot;
} bvalue;

typedef struct bnode {
  Dist__V1__ProgramNode pb;
  int *ins;      /* builder ids of the inputs */
  uint32_t *ids; /* pb.inputs: the program ids, filled when registering */
  int n_in;
} bnode;

typedef struct battr {
  Dist__V1__DistAttr pb;
  dist_mesh_desc mesh;
  dist_wire_meta *w;    /* mesh and placements */
  dist_wire_meta *grad; /* grad placements, or NULL */
} battr;

struct dist_program {
  char name[128];
  Dist__V1__ProgramInput **inputs;
  dist_wire_meta **input_w; /* COORD mesh / grad placements per input */
  int n_inputs;
  bnode **nodes;
  int n_nodes;
  bvalue *values;
  int n_values;
  int *outputs; /* builder ids */
  int n_outputs;
  battr **attrs;
  int n_attrs;
  int err;
  char errmsg[512];
  double invocation_ttl; /* seconds, 0: the daemons' default */
  /* registration */
  int nranks;
  int ranks[DIST_MAX_MESH_RANKS];
  uint64_t handles[DIST_MAX_MESH_RANKS];
};

/* One rank's local value kept in an invocation. */
typedef struct kept_value {
  int present;
  dist_dtype dtype;
  int ndim;
  int64_t shape[DIST_MAX_DIMS];
  void *data;
} kept_value;

struct dist_invocation {
  uint64_t id;
  int spmd_rank;
  int n, targets[DIST_MAX_MESH_RANKS];
  int n_inputs, n_outputs;
  int *input_is_tensor;
  char (*out_names)[256];
  int backward_done;
  int nvote;                /* the daemons that store its outputs and */
  uint32_t *vote_ranks;     /* gradients all or none (program.proto) */
  kept_value *outs;  /* n * n_outputs, with keep_local_values */
  kept_value *grads; /* n * n_inputs, with keep_local_values */
};

/* The request arguments of one daemon. */
typedef struct arg_set {
  int n;
  Dist__V1__ProgramArg *args;
  Dist__V1__ProgramArg **ptrs;
  uint64_t (*shapes)[DIST_MAX_DIMS];
} arg_set;

/* The daemons of one invocation, and their requests. */
typedef struct fanout {
  int n;
  int targets[DIST_MAX_MESH_RANKS];
  int index[DIST_MAX_MESH_RANKS]; /* position in the program's ranks */
  arg_set *args;
  dist_call *calls;
} fanout;

/* ---------------------------------------------------------------- program_build.c */

/* Keeps the first error of p (sticky, see dist.h); returns p's error code. */
int dist_prog_fail(dist_program *p, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int dist_prog_check_list(dist_program *p, const char *op, const char *what, const char *arg,
                         const void *list, int n, int least);
int dist_prog_add_node(dist_program *p, int op, const int *ins, int n_in,
                       bnode **out);

/* ---------------------------------------------------------------- program_register.c */

/* The ranks of p's output meshes, each once; returns how many. */
int dist_prog_output_ranks(const dist_program *p, int *ranks);
/* Best effort: keeps c's error as it was. */
void dist_prog_release_on(dist_client *c, const int *targets, int n,
                          const uint64_t *handles, uint64_t invocation);

/* ---------------------------------------------------------------- program_call.c */

int dist_prog_arg_set_init(arg_set *s, int n);
int dist_prog_fill_arg(dist_client *c, arg_set *s, int j, const dist_arg *a,
                       int i, int need_tensor, const char *what);
void dist_prog_keep_value(kept_value *k, const Dist__V1__ProgramValue *v);
void dist_prog_fanout_free(fanout *f);
int dist_prog_check_chosen_names(dist_client *c, const char *kind, const char *const *names,
                                 int n, int optional);

#endif
