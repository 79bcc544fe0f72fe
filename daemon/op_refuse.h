/* An operation this daemon will never run its part of, refused before
 * that part (by its trainer through OpAbort, or by its own checks): the
 * operation's other daemons would wait for the part until their deadline.
 * Told, each fails at once naming this rank and the reason. */
#ifndef DISTD_OP_REFUSE_H
#define DISTD_OP_REFUSE_H

#include <stdint.h>

#include "server.h"

/* Aborts op_id, and the more_ids ids after it (a LocalLayer call's
 * outputs, a tape backward's plan), each with its steps, on ranks[0..n) (this rank and ranks outside the world are
 * skipped): every exchange their daemons may wait on first, whatever the
 * operation. `who` says who refused ("its trainer", "its daemon"); the
 * others read "rank R aborted op N: WHO refused it: WHY". */
void distd_refuse_op(distd_server *s, uint64_t op_id, uint32_t more_ids, const int *ranks, int n,
                     const char *who, const char *why);

/* This daemon's refusal (eb says why) of a request over group[0..n_group)
 * (the world when n_group is 0), before its part: distd_refuse_op to the
 * group, unless this rank is not in it (then nobody waits for its part).
 * Returns eb's code. */
int distd_refuse_group(distd_server *s, uint64_t op_id, const uint32_t *group, size_t n_group,
                       const dist_errbuf *eb);

#endif
