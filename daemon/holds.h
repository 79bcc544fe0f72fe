/* Requests that read or change one stored name, ordered on each daemon.
 *
 * An in-place reshard replaces a tensor (and a parameter's state), a
 * reshard into another name reads it, a configure or tune resets or
 * changes a parameter, a delete drops both, a checkpoint restore replaces
 * or drops every name it loads, a put, a LocalLayer call or an expert
 * layer's creation stores one once its daemons agreed.
 * Each takes a hold on the name for as long
 * as it runs, so that none acts on what another is replacing: a configure
 * prepared for the layout a reshard replaces, or a tensor deleted while a
 * reshard reads it and then put back by the reshard.
 *
 * Whether a request waits for a hold or is refused at once follows one
 * rule: two requests that each wait for other daemons while holding (a
 * reshard's exchanges; a configure's or a restore's vote) must not both
 * wait for each other's holds, or two daemons that took them in opposite
 * orders would wait for each other until the deadline. Of two such kinds,
 * at most one waits for the other, and the other refuses it. The table is
 * in holds.c. */
#ifndef DISTD_HOLDS_H
#define DISTD_HOLDS_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"

typedef struct distd_holds distd_holds;

typedef enum {
  DISTD_HOLD_RESHARD,   /* an in-place reshard */
  DISTD_HOLD_READ,      /* a reshard into another name, of its source */
  DISTD_HOLD_CONFIGURE, /* a parameter's configure or tune */
  DISTD_HOLD_DELETE,
  DISTD_HOLD_RESTORE,   /* a checkpoint restore, of every name it loads */
  DISTD_HOLD_PUT,       /* a put (shard_tensor, dtensor_from_local), voted */
  DISTD_HOLD_OUTPUT,    /* a LocalLayer call or backward, of the names it
                           stores, voted */
  DISTD_HOLD_EXPERTS,   /* an expert layer's creation, of its parameters and
                           their gradients, voted */
  DISTD_HOLD_KINDS
} distd_hold_kind;

/* The holds of the daemon of rank `rank` (named in messages); NULL when
 * out of memory. */
distd_holds *distd_holds_new(int rank);
void distd_holds_free(distd_holds *h); /* NULL is a no-op */

/* Takes a hold of `kind` on name, after waiting (until deadline_ms,
 * distd_now_ms clock) for the holds it waits for. Fails with DIST_EUNAVAIL
 * and a message naming what runs, holding nothing, when a hold refuses it
 * or one it waits for is still there at the deadline. */
int distd_holds_take(distd_holds *h, const char *name, distd_hold_kind kind,
                     int64_t deadline_ms, dist_errbuf *eb);
/* distd_holds_take for every one of names[0..n) at once: it waits until
 * none of them has a hold it waits for, holding none meanwhile, so that a
 * request holding one of them never waits for it. On success *batch names
 * the holds for distd_holds_release_batch. */
int distd_holds_take_all(distd_holds *h, const char *const *names, size_t n,
                         distd_hold_kind kind, int64_t deadline_ms, uint64_t *batch,
                         dist_errbuf *eb);
/* Releases one hold of `kind` on name, taken with distd_holds_take. */
void distd_holds_release(distd_holds *h, const char *name, distd_hold_kind kind);
/* Releases the holds one distd_holds_take_all took, in one pass however
 * many names it held (an expert layer holds a few per expert). */
void distd_holds_release_batch(distd_holds *h, uint64_t batch);

#endif
