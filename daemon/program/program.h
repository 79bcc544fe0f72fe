/* The LocalLayer engine: programs of tensor operations (program.proto) that
 * a daemon runs on its local pieces, with reverse-mode gradients.
 *
 * Life cycle:
 *   distd_program_new      checks a Program message and keeps a copy;
 *   distd_program_infer    shape/dtype inference for concrete inputs;
 *   distd_program_run      one invocation: inputs -> outputs, keeping what
 *                          backward needs;
 *   distd_invocation_backward  gradients of the inputs;
 *   distd_invocation_release   frees the invocation (before or after
 *                          backward).
 * Errors name the op and its position: "node 3 (matmul): inner dims differ:
 * [2, 3] x [4, 5]". Nothing here does I/O or communication: turning inputs
 * into local pieces and outputs into distributed tensors (with the
 * out_dist_attrs and grad placements of the message) is the caller's job. */
#ifndef DISTD_PROGRAM_H
#define DISTD_PROGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"
#include "program.pb-c.h"
#include "tensor_val.h"

typedef struct distd_program distd_program;
typedef struct distd_invocation distd_invocation;

/* Checks pb's structure (value ids defined before use, input counts and
 * attributes of every node, output count equal to the out_dist_attrs count)
 * and keeps a private copy; pb stays the caller's. When every input
 * declares its dtype and shape (check_shape, no -1), shapes are inferred
 * too, so shape errors show up here already. The program is reference
 * counted: *out holds one reference. */
int distd_program_new(const Dist__V1__Program *pb, distd_program **out,
                      dist_errbuf *eb);
distd_program *distd_program_ref(distd_program *p);
/* Drops a reference (invocations hold one each). NULL is a no-op. */
void distd_program_free(distd_program *p);

/* The program's private copy of its message (inputs, outputs,
 * out_dist_attrs ...), valid while the program lives. */
const Dist__V1__Program *distd_program_message(const distd_program *p);
size_t distd_program_n_inputs(const distd_program *p);
size_t distd_program_n_outputs(const distd_program *p);
/* Inputs, then every node's outputs (see program.proto). */
size_t distd_program_n_values(const distd_program *p);

/* Shape/dtype inference for concrete inputs: inputs has one entry per
 * program input (RANK/COORD entries are ignored); values, when not NULL,
 * receives the meta of every value. Checks inputs against their declared
 * dtype/shape. */
int distd_program_infer(const distd_program *p, const distd_vmeta *inputs,
                        distd_vmeta *values, dist_errbuf *eb);

/* What a program may know about where it runs. */
typedef struct distd_run_env {
  uint32_t rank; /* the rank id (RANK inputs; COORD looks it up in a mesh) */
} distd_run_env;

/* Runs p: inputs has one entry per program input; entries of RANK/COORD
 * inputs are ignored and may be NULL. The inputs are referenced, not
 * copied, and must not be changed while the invocation lives. On success
 * *out is a new invocation holding the outputs. */
int distd_program_run(distd_program *p, const distd_run_env *env,
                      distd_tval *const *inputs, distd_invocation **out,
                      dist_errbuf *eb);

size_t distd_invocation_n_outputs(const distd_invocation *inv);
/* The program inv ran (borrowed: the invocation holds a reference). */
distd_program *distd_invocation_program(const distd_invocation *inv);
/* Output i (borrowed: take a reference to keep it past the release). */
distd_tval *distd_invocation_output(const distd_invocation *inv, size_t i);

/* Reverse mode from the outputs to the inputs. out_grads has one entry per
 * output (NULL: that output has no gradient); out_grads == NULL means "from
 * the scalar output": the program must have exactly one output, with one
 * element, and its gradient is 1. Each given gradient must have its
 * output's shape (its dtype is converted). Runs once per invocation; the
 * values kept for it are freed afterwards. */
int distd_invocation_backward(distd_invocation *inv,
                              distd_tval *const *out_grads, dist_errbuf *eb);
/* The gradient of input i after backward (borrowed), or NULL when the input
 * has none (not a float dtype, no_grad, RANK/COORD). An input the outputs do
 * not depend on gets zeros. */
distd_tval *distd_invocation_input_grad(const distd_invocation *inv,
                                        size_t i);
/* Whether input `in`, given a value of dtype dt, gets a gradient from
 * backward: a DTENSOR_LOCAL or VALUE input of a float dtype without
 * no_grad. Whether an output depends on it does not count (it then gets
 * zeros), so a trainer that runs nothing can tell it too. */
int distd_input_wants_grad(const Dist__V1__ProgramInput *in, dist_dtype dt);
/* Frees the invocation and everything it keeps. NULL is a no-op. */
void distd_invocation_release(distd_invocation *inv);

/* The lowercase name of an op ("matmul"), "unknown" otherwise. */
const char *distd_op_name(int op);

#endif
