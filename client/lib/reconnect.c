/* After a connect fails, a channel sits in TRANSIENT_FAILURE, where a call
 * (not wait_for_ready) fails at once without polling. gRPC retries the
 * connect after its backoff (100 ms doubling to 1 s, client.c), but that
 * connect completes only when some thread polls the channel, and nothing
 * does until gRPC's backup poller, every 5 s: a client that outlived its
 * daemon's restart could not reach it for 5 to 10 s after it was back.
 * So before calls start, each channel in TRANSIENT_FAILURE is polled
 * through a connectivity watch for a short while, which lets a retry due
 * by then complete. The backoff is kept (not reset): a client calling a
 * daemon that is down in a loop, or many clients of a restarting one,
 * connect no more often than it allows. gRPC 1.51 keeps the channel in
 * TRANSIENT_FAILURE while it connects and when the connect is refused
 * (pick_first's sticky failure), so a refusal cannot be seen: a daemon
 * that is down costs each call the whole short wait. A connect that needs
 * longer goes on after it, and a later call's wait finishes it. */
#include "reconnect.h"

#include <grpc/support/time.h>

/* Whether channels[i] appeared before i: each channel is woken once. */
static int seen_before(grpc_channel *const *channels, int i) {
  for (int j = 0; j < i; j++)
    if (channels[j] == channels[i]) return 1;
  return 0;
}

/* Watches ch from its state now, on cq until until; 1 when a watch was
 * set (a completion will come), 0 when ch is READY (or IDLE, SHUTDOWN). */
static int watch_unsettled(grpc_channel *ch, gpr_timespec until, grpc_completion_queue *cq) {
  grpc_connectivity_state st = grpc_channel_check_connectivity_state(ch, 0);
  if (st != GRPC_CHANNEL_CONNECTING && st != GRPC_CHANNEL_TRANSIENT_FAILURE) return 0;
  grpc_channel_watch_connectivity_state(ch, st, until, cq, ch);
  return 1;
}

void dist_reconnect_failed(grpc_channel *const *channels, int n, gpr_timespec deadline) {
  gpr_timespec until = gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                    gpr_time_from_millis(DIST_RECONNECT_WAIT_MS, GPR_TIMESPAN));
  until = gpr_time_min(until, gpr_convert_clock_type(deadline, GPR_CLOCK_REALTIME));
  grpc_completion_queue *cq = NULL;
  int watching = 0;
  for (int i = 0; i < n; i++) {
    grpc_channel *ch = channels[i];
    if (grpc_channel_check_connectivity_state(ch, 0) != GRPC_CHANNEL_TRANSIENT_FAILURE ||
        seen_before(channels, i))
      continue;
    if (!cq) cq = grpc_completion_queue_create_for_next(NULL);
    grpc_channel_check_connectivity_state(ch, 1);
    watching += watch_unsettled(ch, until, cq);
  }
  /* Each watch completes by until at the latest: on a change of state
   * (success), after which the channel is watched again unless READY,
   * or at until (no success), which ends its wait. */
  while (watching > 0) {
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    watching--;
    if (ev.success) watching += watch_unsettled(ev.tag, until, cq);
  }
  if (!cq) return;
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}
