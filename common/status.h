/* The one mapping between distd error codes and gRPC status codes. Over the
 * wire a failed call carries the gRPC code and details "ENAME: message", so
 * the client recovers the exact distd code. */
#ifndef DIST_STATUS_H
#define DIST_STATUS_H

#include <grpc/status.h>
#include <stddef.h>

#include "errbuf.h"

grpc_status_code dist_err_to_grpc(int err);
int dist_err_from_grpc(grpc_status_code code);

/* Formats "ENAME: message" for the status details of a failed call. */
void dist_status_details(const dist_errbuf *eb, char *buf, size_t len);
/* Fills eb from a received status and its details; returns eb->code. */
int dist_status_parse(grpc_status_code code, const char *details,
                      dist_errbuf *eb);

#endif
