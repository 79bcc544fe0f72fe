/* The operations registry of one daemon: every collective, reshard and MoE
 * exchange this daemon takes part in registers itself when it starts and is
 * marked done or failed when it ends. The registry keeps the operations in
 * flight and a bounded ring of the most recent finished ones, so an
 * operator can see what a hung job is doing (distctl ops), and it reports
 * each finished operation to a callback (the daemon's Prometheus counters).
 *
 * Operations are identified by a serial number the registry hands out
 * (unique within this daemon); op_id is the cluster-wide id every member of
 * the group shares, which is what lines up the same operation on different
 * ranks. Which ranks an operation still waits on is not stored here: it is
 * read from the peer data plane when asked (distd_peers_waiting_on), using
 * the data-plane op ids the operation watches (its own op_id, plus any
 * sub-operation ids added with distd_ops_watch).
 *
 * Thread-safe; every function accepts a NULL registry and then does
 * nothing, so code that runs without a daemon (unit tests) needs no
 * registry. */
#ifndef DISTD_OPS_H
#define DISTD_OPS_H

#include <stdint.h>

#include "expert_stats.h"

#define DISTD_OPS_RECENT 256   /* finished operations kept */
#define DISTD_OPS_GROUP_MAX 64 /* group ranks recorded per operation */
#define DISTD_OPS_WATCH_MAX 12 /* data-plane op ids watched per operation */

typedef struct distd_ops distd_ops;

typedef enum {
  DISTD_OP_RUNNING = 0,
  DISTD_OP_DONE = 1,
  DISTD_OP_FAILED = 2,
} distd_op_state;

/* A copy of one operation's record. */
typedef struct distd_op_info {
  uint64_t serial;
  uint64_t op_id;
  char kind[32];          /* "all_reduce", "reshard", "global_scatter" ... */
  int group[DISTD_OPS_GROUP_MAX];
  int group_size;         /* the real size; group[] holds the first 64 */
  uint64_t bytes;         /* this rank's input bytes */
  double start;           /* CLOCK_MONOTONIC seconds */
  double seconds;         /* duration, once finished */
  distd_op_state state;
  char error[200];        /* why it failed */
  uint64_t watch[DISTD_OPS_WATCH_MAX];
  int nwatch;
} distd_op_info;

/* Called (outside the registry's lock) once per finished operation. */
typedef void (*distd_ops_finish_fn)(void *arg, const char *kind, int ok,
                                    uint64_t bytes, double seconds);

/* on_finish may be NULL. Returns NULL when out of memory. */
distd_ops *distd_ops_new(distd_ops_finish_fn on_finish, void *arg);
/* Operations still registered are dropped. NULL is a no-op. */
void distd_ops_free(distd_ops *r);

/* Registers a running operation and returns its serial, or 0 when r is NULL
 * or memory is short (later calls with serial 0 do nothing). group may be
 * NULL with size 0 (point to point); kind is copied. */
uint64_t distd_ops_begin(distd_ops *r, const char *kind, uint64_t op_id,
                         const int *group, int size, uint64_t bytes);
/* Adds a data-plane op id the operation's transfers use besides op_id (a
 * step of a multi-step operation). Extra ids past DISTD_OPS_WATCH_MAX are
 * ignored. */
void distd_ops_watch(distd_ops *r, uint64_t serial, uint64_t xfer_op_id);
/* Marks the operation finished: rc 0 is done, anything else failed with
 * error (may be NULL). Moves it to the recent ring. */
void distd_ops_end(distd_ops *r, uint64_t serial, int rc, const char *error);

/* A snapshot: *out (malloc'd, caller frees; NULL when empty) has the
 * operations in flight, oldest first, then the recent ones, newest first.
 * Returns 0, or DIST_ENOMEM. */
int distd_ops_snapshot(distd_ops *r, distd_op_info **out, int *n_in_flight,
                       int *n_recent);
int distd_ops_in_flight(distd_ops *r);

/* Per-expert token counters that MoE exchanges on this daemon record to;
 * owned by the registry. NULL when r is NULL. */
distd_expert_stats *distd_ops_experts(distd_ops *r);

#endif
