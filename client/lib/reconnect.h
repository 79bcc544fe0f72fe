/* A call's channel back from TRANSIENT_FAILURE before the call starts. */
#ifndef DIST_CLIENT_RECONNECT_H
#define DIST_CLIENT_RECONNECT_H

#include <grpc/grpc.h>

/* How long at most the channels are given to connect before calls start:
 * a call to a daemon that is down fails this much later than it did
 * (gRPC does not tell a refused connect, reconnect.c). A loopback
 * connect to a running distd is READY in 6 to 11 ms on the 2-core test
 * machine; one that needs longer is finished by a later call's wait. */
enum { DIST_RECONNECT_WAIT_MS = 20 };

/* For each of channels[0..n) (a channel may repeat) in TRANSIENT_FAILURE:
 * polls it, all of them together, so that a connect gRPC retries (after
 * its backoff) completes, until each is READY, for DIST_RECONNECT_WAIT_MS
 * at most, never past deadline. Channels in any other state are left as
 * they are. */
void dist_reconnect_failed(grpc_channel *const *channels, int n, gpr_timespec deadline);

#endif
