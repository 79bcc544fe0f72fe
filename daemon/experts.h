/* Expert shards (semantics.md "Expert shards"): the experts of MoE layers
 * this daemon hosts, their forward and backward on the rows a
 * global_scatter left in the store.
 *
 * A layer on this daemon is E experts with global ids first .. first+E-1,
 * each an FFN y = act(x @ w1 + b1) @ w2 + b2. Its parameters are ordinary
 * stored tensors, local to this daemon (a one-rank mesh, replicated), named
 * "<layer>.expert<k>.w1" [d_model, d_hidden], ".b1" [d_hidden],
 * ".w2" [d_hidden, d_model], ".b2" [d_model], each with a gradient
 * "<name>.grad" of its shape. Nothing here caches them: every forward reads
 * the current tensors, so the parameter service (param_service.h) can train
 * them in place between steps.
 *
 * Rows are expert-major: local expert e's rows are contiguous, after those
 * of experts 0..e-1. Each expert's rows go through two OpenBLAS GEMMs (the
 * LocalLayer engine's matmul kernel) around its activation.
 *
 * A forward with an invocation id keeps what its backward needs (the input
 * rows, the pre-activations, references to the weights it used) until the
 * backward, a release, or a later forward of the same (layer, id). At most
 * DISTD_EXPERT_KEPT_MAX invocations are kept per daemon.
 *
 * Thread-safe: the registry has a mutex; calls on one layer are serialized
 * (a backward's read-modify-write of the gradients must not interleave with
 * another's). Token counts per expert are recorded by the global_scatter
 * that delivers the rows (moe_scatter.c, expert_stats.h), not here. */
#ifndef DISTD_EXPERTS_H
#define DISTD_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"
#include "server.h"
#include "store.h"

#define DISTD_EXPERT_LAYER_NAME_MAX 200 /* room for ".expert<k>.w1.grad" */
#define DISTD_EXPERT_KEPT_MAX 1024

typedef enum { DISTD_EXPERT_GELU = 0, DISTD_EXPERT_SILU = 1 } distd_expert_act;

typedef struct distd_expert_layer_cfg {
  char name[DISTD_EXPERT_LAYER_NAME_MAX];
  int experts;          /* E, >= 1 */
  int first_expert;     /* global id of local expert 0 */
  int64_t d_model, d_hidden;
  distd_expert_act act;
  int bias;
  dist_dtype dtype;     /* DIST_FLOAT32 or DIST_FLOAT64 */
} distd_expert_layer_cfg;

/* One expert's initial values (each len bytes, row-major in the layer's
 * dtype); b1/b2 are read only with bias. */
typedef struct distd_expert_init {
  const void *w1, *b1, *w2, *b2;
  size_t w1_len, b1_len, w2_len, b2_len;
} distd_expert_init;

typedef struct distd_experts distd_experts;

/* A daemon's empty registry (distd_server.experts); NULL when out of
 * memory. */
distd_experts *distd_experts_new(void);
/* Drops every layer and kept invocation, returning the kept tensors' memory
 * to the store: call it before the store is freed. NULL is a no-op. */
void distd_experts_free(distd_experts *x);

/* A layer's parameters and zeroed gradients, made but not yet stored, so
 * that the daemons of the layer create it all or none (vote.h). */
typedef struct distd_expert_draft {
  distd_expert_layer_cfg cfg;
  distd_staged staged;    /* each parameter, then its gradient */
  char **names;           /* every name it stores: the parameters', then the
                             gradients' */
  int nnames;
  int nparams;            /* names[0..nparams) are the parameters' */
  struct layer *fresh;    /* the registry entry, should the layer be new */
} distd_expert_draft;

/* Checks cfg and starts d: the names a creation of it stores, so that a
 * caller can hold them (holds.h) before distd_experts_draft checks that
 * they are free. Free d with distd_expert_draft_free whatever it
 * returns. */
int distd_experts_name(const distd_expert_layer_cfg *cfg, distd_expert_draft *d,
                       dist_errbuf *eb);
/* Makes the parameters of d (named by distd_experts_name), from init
 * (cfg->experts entries) or, when init is NULL, drawn from seed
 * (distd_expert_seed_value), and their zeroed gradients; stores nothing.
 * An existing layer or tensor is an error unless replace. */
int distd_experts_draft(distd_experts *x, distd_server *s, uint64_t seed,
                        const distd_expert_init *init, int replace, distd_expert_draft *d,
                        dist_errbuf *eb);
/* Cannot fail: stores d's tensors and registers the layer, dropping the
 * kept invocations of the layer it replaces. */
void distd_experts_install(distd_experts *x, distd_server *s, distd_expert_draft *d);
void distd_expert_draft_free(distd_expert_draft *d);

/* The seed's value for element idx of tensor `which` (0 w1, 1 b1, 2 w2,
 * 3 b2) of expert `expert`: uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)). */
double distd_expert_seed_value(uint64_t seed, int expert, int which,
                               uint64_t idx, int64_t fan_in);

/* Forward of every local expert on the held tensor x_name ([rows, d_model],
 * expert-major). counts has E entries (rows per expert) or W*E (a
 * global_count: summed over the W source ranks). The result is stored under
 * out_name; *out (may be NULL) gets a new reference to it, and rows (may
 * be NULL; room for ncounts entries) the rows of each local expert, *nrows
 * (may be NULL) of them. invocation != 0 keeps the backward state. */
typedef struct distd_expert_fwd {
  const char *layer;
  const char *x_name;
  const int64_t *counts;
  size_t ncounts;
  const char *out_name;
  int replace;
  uint64_t invocation;
} distd_expert_fwd;
int distd_experts_forward(distd_experts *x, distd_server *s,
                          const distd_expert_fwd *f, distd_tensor **out,
                          int64_t *rows, int *nrows, dist_errbuf *eb);

/* Backward of kept invocation (layer, invocation), consuming it when it
 * succeeds: grad_name holds the gradient of its output rows. Weight
 * gradients are stored in the "<param>.grad" tensors (added to what they
 * hold with accumulate); the gradient of the input rows is stored under
 * out_name (*out: a new reference, may be NULL). */
typedef struct distd_expert_bwd {
  const char *layer;
  uint64_t invocation;
  const char *grad_name;
  const char *out_name;
  int replace;
  int accumulate;
} distd_expert_bwd;
int distd_experts_backward(distd_experts *x, distd_server *s,
                           const distd_expert_bwd *b, distd_tensor **out,
                           dist_errbuf *eb);

/* Drops kept invocation (layer, invocation), or every one of the layer for
 * invocation 0; *released (may be NULL) gets how many. An unknown layer is
 * DIST_ENOTFOUND; an unknown invocation releases nothing. */
int distd_experts_release(distd_experts *x, const char *layer,
                          uint64_t invocation, int *released,
                          dist_errbuf *eb);

#endif
