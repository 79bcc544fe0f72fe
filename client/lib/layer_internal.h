/* Bodies of dist_layer and the pieces its files share: the tree
 * (layer.c), shard_layer (layer_shard.c), the built-in layers and their
 * forward programs (layer_builtin.c) and the forward/backward tape
 * (layer_run.c). Not installed. */
#ifndef DIST_LAYER_INTERNAL_H
#define DIST_LAYER_INTERNAL_H

#include "client_internal.h"

typedef enum {
  LAYER_LINEAR,
  LAYER_EMBEDDING,
  LAYER_LAYER_NORM,
  LAYER_RMS_NORM,
  LAYER_SEQUENCE,
  LAYER_PROGRAM
} layer_kind;

typedef struct layer_param {
  char name[64];
  int is_buffer;
  dist_shape shape;
  float *init;            /* the client's value until sharded */
  int nplacements;        /* set by dist_layer_place_param, 0: Replicate */
  dist_placement placements[DIST_MAX_MESH_DIMS];
  dist_tensor *tensor;    /* the stored tensor, once sharded */
  dist_tensor *grad;      /* "<name>.grad", after a backward */
} layer_param;

/* A built-in forward program, cached by the layouts it was built for. */
#define LAYER_KEY_LEN 320
typedef struct layer_prog {
  char key[LAYER_KEY_LEN];
  dist_program *p;
} layer_prog;

/* How a program input of one tape entry gets its gradient. */
typedef enum { IN_ACT, IN_PARAM, IN_OTHER } entry_input_kind;

typedef struct entry_input {
  entry_input_kind kind;
  char name[256];         /* IN_ACT: the activation tensor */
  layer_param *param;     /* IN_PARAM */
} entry_input;

/* One program call of a forward, kept for backward. */
typedef struct tape_entry {
  dist_invocation *inv;
  int n_in;
  entry_input *in;
  int n_out;
  dist_tensor *out;       /* copies of the outputs as left by the forward:
                             the layouts their gradients must have */
} tape_entry;

/* A gradient of an activation, by the activation's name. */
typedef struct grad_slot {
  char name[256];
  dist_tensor *grad;
  int owned;              /* the step frees the handle */
} grad_slot;

/* What one forward leaves in the daemons, until the next one. */
typedef struct layer_step {
  uint64_t no;
  tape_entry *entries;
  int n_entries;
  char (*created)[256];   /* tensors to delete */
  int n_created;
  dist_tensor **handles;  /* handles to free */
  int n_handles;
  grad_slot *grads;
  int n_grads;
  int n_in, n_out;
  char (*in_names)[256];  /* the root's inputs after input_fn */
  char (*out_names)[256]; /* the root's outputs before output_fn */
  int backward_done;
} layer_step;

struct dist_layer {
  layer_kind kind;
  char name[128];         /* a root's prefix of stored names */
  dist_layer *parent;
  char child_name[64];
  dist_layer **children;
  int n_children;
  layer_param *params;
  int n_params;
  /* built-in configuration */
  int64_t in, out;        /* Linear in/out; Embedding num/dim; norms dim */
  int bias;
  double eps;
  /* LAYER_PROGRAM */
  dist_program *program;
  int n_inputs;
  /* built-in programs, registered as first used */
  layer_prog *progs;
  int n_progs;
  /* a root after dist_shard_layer */
  int sharded;
  dist_mesh mesh;
  dist_layer_io_fn input_fn, output_fn;
  void *user;
  layer_step *step;
  uint64_t step_no;
  /* Step names and invocations a failed call may have left on daemons
   * that did not answer it: undone by the next dist_layer_release (the
   * forward's, the destroy's), not by the failed forward's own release,
   * which would ask the daemon that just did not answer. */
  dist_later later;
  /* the first dist_layer_place_param error of a shard_layer */
  dist_errbuf place_err;
};

/* ---------------------------------------------------------------- layer.c */

dist_layer *dist_layer_alloc(layer_kind kind, const char *name);
/* Adds a float32 parameter or buffer with a copy of data (NULL: zeros);
 * NULL for a shape out of bounds or out of memory. The name, unique in l,
 * and l, not yet sharded, are the caller's to check (the public calls'
 * add_param does; the built-in constructors name their own). */
layer_param *dist_layer_new_param(dist_layer *l, const char *name,
                                  int is_buffer, int ndim,
                                  const int64_t *shape, const float *data);
layer_param *dist_layer_own_param(const dist_layer *l, const char *name);
/* The parameter at a dotted path from l ("fc1.weight"), or NULL. */
layer_param *dist_layer_param_by_path(const dist_layer *l, const char *path);
const char *dist_layer_kind_name(layer_kind k);

/* ---------------------------------------------------------------- layer_builtin.c */

/* Shard-time checks of a built-in layer's placements (names in messages
 * start with path). */
int dist_layer_check_builtin(const dist_layer *l, const char *path,
                             const dist_mesh *mesh, dist_errbuf *eb);

typedef struct fwd_ctx fwd_ctx;
/* A built-in layer's forward on one input. */
int dist_layer_forward_builtin(fwd_ctx *x, dist_layer *l, const char *path,
                               dist_tensor *const *in, int n_in,
                               dist_tensor ***out, int *n_out);

/* ---------------------------------------------------------------- layer_run.c */

/* One program call: runs p (registered) on args, names its outputs after
 * path, records a tape entry with inputs described by ins, reshards Partial
 * outputs to Replicate. *out is a malloc'd array of step-owned handles. */
int dist_layer_call(fwd_ctx *x, dist_program *p, const char *path,
                    const dist_arg *args, const entry_input *ins, int nargs,
                    dist_tensor ***out, int *n_out);
dist_client *dist_layer_ctx_client(fwd_ctx *x);
const dist_mesh *dist_layer_ctx_mesh(fwd_ctx *x);
/* Records an error on the context's client. */
int dist_layer_ctx_fail(fwd_ctx *x, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Frees a step, deleting its tensors and releasing its invocations (with
 * c; without, the handles only); returns the first failed delete's code,
 * c's error then saying it. A delete that may be done later is noted on
 * the client's list (dist_tensor_delete_noting). */
int dist_layer_step_free(dist_client *c, layer_step *s);

#endif
