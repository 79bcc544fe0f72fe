/* The table of ops: names and input/output counts. */
#include <stddef.h>

#include "program_int.h"

#define OP(name, lo, hi, nout)                                                \
  {DIST__V1__OP_KIND__OP_##name, #name, lo, hi, nout}

/* Binary ops (and set_slice) take 1
 * input when the other operand is the node's scalar. */
static const distd_op_info op_table[] = {
    OP(ADD, 1, 2, 1),         OP(SUB, 1, 2, 1),
    OP(MUL, 1, 2, 1),         OP(DIV, 1, 2, 1),
    OP(POW, 1, 2, 1),         OP(MAXIMUM, 1, 2, 1),
    OP(MINIMUM, 1, 2, 1),     OP(EQ, 1, 2, 1),
    OP(NE, 1, 2, 1),          OP(LT, 1, 2, 1),
    OP(LE, 1, 2, 1),          OP(GT, 1, 2, 1),
    OP(GE, 1, 2, 1),          OP(LOGICAL_AND, 1, 2, 1),
    OP(LOGICAL_OR, 1, 2, 1),  OP(LOGICAL_NOT, 1, 1, 1),
    OP(WHERE, 3, 3, 1),       OP(EXP, 1, 1, 1),
    OP(LOG, 1, 1, 1),         OP(SQRT, 1, 1, 1),
    OP(ABS, 1, 1, 1),         OP(NEG, 1, 1, 1),
    OP(RELU, 1, 1, 1),        OP(GELU, 1, 1, 1),
    OP(SILU, 1, 1, 1),        OP(SIGMOID, 1, 1, 1),
    OP(TANH, 1, 1, 1),        OP(SUM, 1, 1, 1),
    OP(MEAN, 1, 1, 1),        OP(MAX, 1, 1, 1),
    OP(MIN, 1, 1, 1),         OP(LOGSUMEXP, 1, 1, 1),
    OP(SOFTMAX, 1, 1, 1),     OP(LOG_SOFTMAX, 1, 1, 1),
    OP(CROSS_ENTROPY, 2, 3, 1), OP(MATMUL, 2, 2, 1),
    OP(RESHAPE, 1, 1, 1),     OP(TRANSPOSE, 1, 1, 1),
    OP(SLICE, 1, 1, 1),       OP(CONCAT, 1, DISTD_MAX_NODE_INPUTS, 1),
    OP(CAST, 1, 1, 1),        OP(FULL, 0, 0, 1),
    OP(ZEROS_LIKE, 1, 1, 1),  OP(ONES_LIKE, 1, 1, 1),
    OP(FULL_LIKE, 1, 1, 1),   OP(ARANGE, 0, 0, 1),
    OP(SET_SLICE, 1, 2, 1),   OP(TOPK, 1, 1, 2),
    OP(ONE_HOT, 1, 1, 1),     OP(CONSTANT, 0, 0, 1),
};


const distd_op_info *distd_op_info_get(int op) {
  for (size_t i = 0; i < sizeof op_table / sizeof op_table[0]; i++)
    if ((int)op_table[i].op == op) return &op_table[i];
  return NULL;
}

/* The protobuf enum names the ops; the lowercase form is what errors show. */
const char *distd_op_name(int op) {
  static const char *names[] = {
#define N(x, s) [DIST__V1__OP_KIND__OP_##x] = s
      N(ADD, "add"), N(SUB, "sub"), N(MUL, "mul"), N(DIV, "div"),
      N(POW, "pow"), N(MAXIMUM, "maximum"), N(MINIMUM, "minimum"),
      N(EQ, "eq"), N(NE, "ne"), N(LT, "lt"), N(LE, "le"), N(GT, "gt"),
      N(GE, "ge"), N(LOGICAL_AND, "logical_and"),
      N(LOGICAL_OR, "logical_or"), N(LOGICAL_NOT, "logical_not"),
      N(WHERE, "where"), N(EXP, "exp"), N(LOG, "log"), N(SQRT, "sqrt"),
      N(ABS, "abs"), N(NEG, "neg"), N(RELU, "relu"), N(GELU, "gelu"),
      N(SILU, "silu"), N(SIGMOID, "sigmoid"), N(TANH, "tanh"),
      N(SUM, "sum"), N(MEAN, "mean"), N(MAX, "max"), N(MIN, "min"),
      N(LOGSUMEXP, "logsumexp"), N(SOFTMAX, "softmax"),
      N(LOG_SOFTMAX, "log_softmax"), N(CROSS_ENTROPY, "cross_entropy"),
      N(MATMUL, "matmul"), N(RESHAPE, "reshape"), N(TRANSPOSE, "transpose"),
      N(SLICE, "slice"), N(CONCAT, "concat"), N(CAST, "cast"),
      N(FULL, "full"), N(ZEROS_LIKE, "zeros_like"),
      N(ONES_LIKE, "ones_like"), N(FULL_LIKE, "full_like"),
      N(ARANGE, "arange"), N(SET_SLICE, "set_slice"), N(TOPK, "topk"),
      N(ONE_HOT, "one_hot"), N(CONSTANT, "constant"),
#undef N
  };
  if (op < 0 || (size_t)op >= sizeof names / sizeof names[0] || !names[op])
    return "unknown";
  return names[op];
}

int distd_op_differentiable(distd_op op) {
  switch (op) {
  case DIST__V1__OP_KIND__OP_EQ:
  case DIST__V1__OP_KIND__OP_NE:
  case DIST__V1__OP_KIND__OP_LT:
  case DIST__V1__OP_KIND__OP_LE:
  case DIST__V1__OP_KIND__OP_GT:
  case DIST__V1__OP_KIND__OP_GE:
  case DIST__V1__OP_KIND__OP_LOGICAL_AND:
  case DIST__V1__OP_KIND__OP_LOGICAL_OR:
  case DIST__V1__OP_KIND__OP_LOGICAL_NOT:
  case DIST__V1__OP_KIND__OP_FULL:
  case DIST__V1__OP_KIND__OP_ZEROS_LIKE:
  case DIST__V1__OP_KIND__OP_ONES_LIKE:
  case DIST__V1__OP_KIND__OP_FULL_LIKE:
  case DIST__V1__OP_KIND__OP_ARANGE:
  case DIST__V1__OP_KIND__OP_ONE_HOT:
  case DIST__V1__OP_KIND__OP_CONSTANT: return 0;
  default: return 1;
  }
}
