/* Tokens routed to each expert this daemon hosts, as global_scatter
 * delivers them: for every expert, the total since start, the rows of the
 * last step and the sum over the last DISTD_EXPERT_WINDOW steps ("recent").
 * A step is one distd_expert_stats_record call for that expert: a
 * global_scatter records each of its local experts once, zero rows
 * included, so the window is the expert's last N exchanges.
 *
 * Expert ids are the MoE numbering of the exchange: position of this rank
 * in the group times experts-per-rank, plus the local index (rank-major,
 * as Paddle numbers experts). Thread-safe; NULL stats is a no-op. */
#ifndef DISTD_EXPERT_STATS_H
#define DISTD_EXPERT_STATS_H

#include <stdint.h>

#define DISTD_EXPERT_WINDOW 16 /* steps that count as "recent" */
#define DISTD_EXPERTS_MAX 4096 /* experts tracked; more are not counted */

typedef struct distd_expert_stats distd_expert_stats;

typedef struct distd_expert_count {
  int expert_id;
  uint64_t steps;         /* exchanges recorded */
  uint64_t tokens_total;
  uint64_t tokens_recent; /* over the last DISTD_EXPERT_WINDOW steps */
  uint64_t tokens_last;   /* the last step */
} distd_expert_count;

distd_expert_stats *distd_expert_stats_new(void); /* NULL: out of memory */
void distd_expert_stats_free(distd_expert_stats *s); /* NULL is a no-op */

/* One step of expert_id: rows tokens were routed to it. Negative ids are
 * ignored. */
void distd_expert_stats_record(distd_expert_stats *s, int expert_id,
                               uint64_t rows);

/* *out (malloc'd, caller frees; NULL when empty) gets every expert seen, by
 * ascending id. Returns 0 or DIST_ENOMEM. */
int distd_expert_stats_snapshot(distd_expert_stats *s, distd_expert_count **out,
                                int *n);

#endif
