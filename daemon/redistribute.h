/* The layout step of reshard (see redistribute.c). */
#ifndef DISTD_REDISTRIBUTE_H
#define DISTD_REDISTRIBUTE_H

#include <stdint.h>

#include "server.h"
#include "store.h"

/* Moves t (on this rank, a private tensor) to the shard/replicate layout of
 * dst_p. Mesh dims that are Partial in t stay Partial; dims that become
 * Partial in dst_p are laid out as Replicate. *out may be t itself (with a
 * new reference) when the layout does not change. */
int distd_redistribute(distd_server *s, distd_tensor *t,
                       const dist_placement *dst_p, uint64_t op_id,
                       int64_t deadline_ms, distd_tensor **out,
                       dist_errbuf *eb);

#endif
