/* Cluster files: the daemons of a cluster in rank order, one per line,
 *   HOST:PORT [PEER_HOST:PEER_PORT]   # comment
 * HOST:PORT is the daemon's gRPC address; the data plane listens at the
 * second field, or at PORT+1 when it is absent. Both distd and libdist read
 * them. */
#ifndef DIST_CLUSTER_H
#define DIST_CLUSTER_H

#include <stddef.h>

#include "errbuf.h"

typedef struct dist_member {
  char grpc_addr[256];
  char peer_addr[256];
} dist_member;

/* Parses cluster file text; path names the source in messages
 * ("cluster.conf:3: bad port 'x'"). *members is malloc'd (free()). An empty
 * cluster is an error. */
int dist_cluster_parse(const char *text, const char *path,
                       dist_member **members, int *count, dist_errbuf *eb);
int dist_cluster_load(const char *path, dist_member **members, int *count,
                      dist_errbuf *eb);
/* Splits "host:port" (IPv6 as "[::1]:port"); host is copied without
 * brackets. Returns 0 or DIST_EINVAL. */
int dist_split_hostport(const char *addr, char *host, size_t hostlen,
                        int *port, dist_errbuf *eb);

#endif
