/* The table of gRPC methods distd serves, and the hooks the HTTP port
 * uses. Each service lives in its own svc_*.c file. */
#ifndef DISTD_METHODS_H
#define DISTD_METHODS_H

#include <stddef.h>

#include "rpc.h"

struct evbuffer;

extern const distd_method distd_methods[];
extern const int distd_method_count;

/* HTTP hooks (svc_info.c). */
void distd_write_metrics(void *server, struct evbuffer *out);
int distd_readiness(void *server, char *why, size_t len);

/* Handlers, one per method. */
#define DISTD_HANDLER(name)                                            \
  int distd_handle_##name(distd_server *s, const distd_call_info *ci,  \
                          const ProtobufCMessage *req,                 \
                          grpc_byte_buffer **reply, dist_errbuf *eb)
DISTD_HANDLER(health_check);
DISTD_HANDLER(info);
DISTD_HANDLER(tensor_put);
DISTD_HANDLER(tensor_get);
DISTD_HANDLER(tensor_list);
DISTD_HANDLER(tensor_show);
DISTD_HANDLER(tensor_delete);
DISTD_HANDLER(reshard);
DISTD_HANDLER(collective);

#endif
