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
  /* An SPMD trainer outside some output mesh keeps the program as its
   * daemon would check it, to infer the members' shapes of the outputs it
   * holds no piece of (program_outside.c); NULL otherwise. */
  struct distd_program *checked;
  /* ... and outside every output mesh: registered nowhere, its calls
   * no-ops. */
  int outside;
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
  int outputs_named; /* out_names are the caller's (dist_call_opts.out_names) */
  int backward_done;
  int nvote;                /* the daemons that store its outputs and */
  uint32_t *vote_ranks;     /* gradients all or none (program.proto) */
  kept_value *outs;  /* n * n_outputs, with keep_local_values */
  kept_value *grads; /* n * n_inputs, with keep_local_values */
  /* An outsider's call (n is 0): per input, the layout its gradient's
   * handle takes (the tensor argument's, with its grad placements), or
   * no_piece 0 when the members store no gradient for it. */
  dist_tensor *outside_grads;
  /* Per output, its mesh (from out_dist_attrs): a daemon outside it holds
   * no piece of the output, so is sent no gradient of it. */
  dist_mesh_desc *out_meshes;
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
/* Sends one Release to daemon rank: a program's handle or an invocation
 * (the other 0); its code (c->err says why), and in *unanswered (NULL:
 * not told) whether the daemon said nothing. */
int dist_prog_release_one(dist_client *c, int rank, uint64_t handle, uint64_t invocation,
                          int *unanswered);
/* Best effort: keeps c's error as it was. */
void dist_prog_release_on(dist_client *c, const int *targets, int n, const uint64_t *handles);

/* ---------------------------------------------------------------- program_call.c */

int dist_prog_arg_set_init(arg_set *s, int n);
void dist_prog_fill_arg(const dist_client *c, arg_set *s, int j, const dist_arg *a, int i);
/* c->err's code when argument a lacks what input j of p needs: a tensor
 * for a DTENSOR_LOCAL input, values for a VALUE one. */
int dist_prog_check_input(dist_client *c, const dist_program *p, int j, const dist_arg *a);
/* 0, or DIST_ENOMEM (k->data NULL). */
int dist_prog_keep_value(kept_value *k, const Dist__V1__ProgramValue *v);
void dist_prog_fanout_free(fanout *f);
/* A new invocation of p under id, over n daemons (0: an outsider's). */
dist_invocation *dist_prog_invocation_new(const dist_program *p, int n, uint64_t id,
                                          int spmd_rank);
/* The call's output names into v->out_names, pointed at by names: the
 * caller's (checked), or "<program>.<id>.out<k>". */
int dist_prog_name_outputs(dist_client *c, const dist_program *p, const dist_call_opts *o,
                           dist_invocation *v, char **names);
int dist_prog_check_chosen_names(dist_client *c, const char *kind, const char *const *names,
                                 int n, int optional);

/* ---------------------------------------------------------------- program_backward.c */

/* The backward's gradient names into buf, pointed at by names: the
 * caller's (checked; NULL or "": none), or "<output 0>.grad<j>" for each
 * tensor input. */
int dist_prog_name_grads(dist_client *c, const dist_invocation *inv,
                         const dist_backward_opts *o, char **names, char (*buf)[256]);

/* ---------------------------------------------------------------- program_outside.c */

/* 1 when this SPMD trainer is in none of p's output meshes: its calls of
 * p are Paddle's no-op for a rank outside the process mesh. */
int dist_prog_outside(const dist_client *c, const dist_program *p);
/* 1 when this SPMD trainer is outside output k's mesh (holds no piece of
 * it). */
int dist_prog_output_elsewhere(const dist_client *c, const dist_program *p, int k);
/* An outsider's registration of p, whose message is pb: checked as a
 * member's daemon checks it, and kept in p->checked; nothing is sent. */
int dist_prog_register_outside(dist_client *c, dist_program *p, const Dist__V1__Program *pb);
/* A trainer outside some but not all output meshes, registered on its
 * daemon: keeps pb checked in p->checked, for the outputs it holds no
 * piece of. */
int dist_prog_keep_checked(dist_client *c, dist_program *p, const Dist__V1__Program *pb);
void dist_prog_unregister_outside(dist_program *p);
/* For each output k this SPMD trainer is outside of, outs[k]: a handle of
 * the members' global shape with no piece (the others stay NULL). */
int dist_prog_outputs_elsewhere(dist_client *c, const dist_program *p, const dist_arg *args,
                                char *const *names, dist_tensor **outs);
/* An outsider's call of p under op id `id` (its ids taken, its arguments
 * checked): output handles of the members' global shapes with no piece,
 * an invocation without daemons; nothing is sent. */
int dist_prog_call_outside(dist_client *c, const dist_program *p, const dist_arg *args,
                           const dist_call_opts *o, uint64_t id, dist_invocation **inv,
                           dist_tensor **outs);
/* An outsider's backward of inv: gradient handles with no piece. */
int dist_prog_backward_outside(dist_client *c, dist_invocation *inv,
                               const dist_arg *out_grads, const dist_backward_opts *o,
                               dist_tensor **grads);

#endif
