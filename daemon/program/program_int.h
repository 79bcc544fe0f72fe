/* Internals shared by the files of the program engine. */
#ifndef DISTD_PROGRAM_INT_H
#define DISTD_PROGRAM_INT_H

#include "kernels.h"
#include "program.h"

/* Static facts about an op: its name and how many inputs and outputs it
 * has. */
typedef struct distd_op_info {
  distd_op op;
  const char *name;
  int min_in, max_in; /* max_in -1: any number */
  int n_out;
} distd_op_info;

/* NULL for an unknown op. */
const distd_op_info *distd_op_info_get(int op);

struct distd_program {
  int refs;
  Dist__V1__Program *pb; /* private copy */
  size_t n_values;
  int *node_first_value; /* first value id produced by each node */
};

struct distd_invocation {
  distd_program *prog;
  distd_run_env env;
  distd_tval **values;      /* n_values; inputs and intermediates */
  distd_tval **outputs;     /* n_outputs (referenced) */
  distd_tval **input_grads; /* n_inputs, after backward */
  int backward_done;
};

/* Prefixes eb with "node i (op): " (or "node i (op 'label'): "); returns rc. */
int distd_node_fail(dist_errbuf *eb, int rc, size_t i,
                    const Dist__V1__ProgramNode *n);

/* The dtype a node's dtype attribute gives, or dflt when unset. */
dist_dtype distd_node_dtype(const Dist__V1__ProgramNode *n, dist_dtype dflt);

/* Shape inference of one node from its input metas (scalar operands already
 * present as 0-d metas). */
int distd_infer_node(const Dist__V1__ProgramNode *n, const distd_vmeta *in,
                     int n_in, distd_vmeta *out, dist_errbuf *eb);

/* The node's input values as its kernel takes them: the scalar operand of a
 * one-input binary op is materialized as a 0-d value (hence the refs: the
 * caller unrefs every entry). Returns the count in *n_in. */
int distd_node_inputs(const Dist__V1__ProgramNode *n, distd_tval *const *values,
                      distd_tval **in, int *n_in, dist_errbuf *eb);
/* Same for metas. */
int distd_node_input_metas(const Dist__V1__ProgramNode *n,
                           const distd_vmeta *values, distd_vmeta *in, int *n_in,
                           dist_errbuf *eb);

/* Runs one node's kernel. */
int distd_forward_node(const Dist__V1__ProgramNode *n, distd_tval *const *in,
                       int n_in, distd_tval **out, dist_errbuf *eb);

/* Gradients of one node: gin[i] receives a new value or NULL (no gradient
 * for input i). gout[j] may be NULL (no gradient reached output j). */
/* need[i] says whether input i wants a gradient (rules skip the others). */
int distd_backward_node(const Dist__V1__ProgramNode *n, distd_tval *const *in,
                        int n_in, const uint8_t *need, distd_tval *const *out,
                        distd_tval *const *gout, distd_tval **gin,
                        dist_errbuf *eb);

/* Which node input the kernel input k is: -1 for a materialized scalar. */
int distd_node_input_slot(const Dist__V1__ProgramNode *n, int k);

/* Whether an op's outputs carry gradients back to (float) inputs. */
int distd_op_differentiable(distd_op op);

/* Frees the values an invocation keeps for backward (run.c). */
void distd_invocation_drop_values(distd_invocation *inv);

/* Max inputs a node may have in these internal arrays (concat). */
#define DISTD_MAX_NODE_INPUTS DISTD_CONCAT_MAX

#endif
