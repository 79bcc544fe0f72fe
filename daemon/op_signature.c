/* Signatures of SPMD collectives (op_signature.h). Layout, low byte first:
 * a constant 0x5a (never 0), the kind, the dtype (DIST_DTYPE_INVALID, 0,
 * for none), reduce + 1, root + 1 in the high 32 bits; 0 in a field means
 * "none". */
#include "op_signature.h"

#include <stdio.h>

#include "mesh.h"
#include "tensor.h"

#define SIG_MARK 0x5au

static const char *const kind_names[DISTD_SIG_KINDS] = {
    [DISTD_SIG_ALL_REDUCE] = "all_reduce",         [DISTD_SIG_ALL_GATHER] = "all_gather",
    [DISTD_SIG_REDUCE_SCATTER] = "reduce_scatter", [DISTD_SIG_ALL_TO_ALL] = "all_to_all",
    [DISTD_SIG_BROADCAST] = "broadcast",           [DISTD_SIG_BARRIER] = "barrier",
    [DISTD_SIG_GLOBAL_SCATTER] = "global_scatter", [DISTD_SIG_GLOBAL_GATHER] = "global_gather",
    [DISTD_SIG_P2P] = "p2p",
};

uint64_t distd_op_signature(distd_sig_kind kind, dist_dtype dt, int reduce, int root) {
  return SIG_MARK | (uint64_t)(kind & 0xff) << 8 | (uint64_t)((unsigned)dt & 0xff) << 16 |
         (uint64_t)((reduce + 1) & 0xff) << 24 | (uint64_t)(uint32_t)(root + 1) << 32;
}

void distd_op_signature_name(uint64_t signature, char *out, size_t n) {
  unsigned kind = (signature >> 8) & 0xff;
  int dt = (int)((signature >> 16) & 0xff), reduce = (int)((signature >> 24) & 0xff) - 1;
  long long root = (long long)(signature >> 32) - 1;
  const char *name = kind < DISTD_SIG_KINDS && kind_names[kind] ? kind_names[kind] : "?";
  int len = snprintf(out, n, "%s(%s", name, dt > 0 ? dist_dtype_name((dist_dtype)dt) : "");
  if (len >= 0 && (size_t)len < n && reduce >= 0)
    len += snprintf(out + len, n - (size_t)len, "%s%s", dt > 0 ? ", " : "",
                    dist_reduce_name((dist_reduce)reduce));
  if (len >= 0 && (size_t)len < n && root >= 0)
    len += snprintf(out + len, n - (size_t)len, "%sroot %lld", dt > 0 ? ", " : "", root);
  if (len >= 0 && (size_t)len < n) snprintf(out + len, n - (size_t)len, ")");
}
