/* Starting and stopping the modules of one daemon, in order. */
#ifndef DISTD_DAEMON_H
#define DISTD_DAEMON_H

#include "errbuf.h"
#include "server.h"

/* Starts the loop, data plane, HTTP port and gRPC server for a loaded
 * configuration. On failure eb says which part and why; distd_stop still
 * cleans up what was started. */
int distd_start(distd_server *s, dist_errbuf *eb);
/* SIGHUP: reads what can change without a restart again: the bearer
 * tokens, and the TLS certificate, key and CA of the gRPC port and the
 * data plane (for connections made from then on). Each part that fails is
 * logged and keeps what it had; eb says why the first one failed. */
int distd_reload(distd_server *s, dist_errbuf *eb);
/* Stops everything distd_start started (in-flight calls get a grace
 * period), and frees the configuration. */
void distd_stop(distd_server *s);

#endif
