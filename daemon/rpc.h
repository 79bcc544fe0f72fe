/* The gRPC control plane on the C core API. A method table maps full method
 * paths to handlers; handlers run on a pool of worker threads so a call that
 * waits on peers (a collective) never blocks the completion queue. Unknown
 * methods are answered UNIMPLEMENTED at once. */
#ifndef DISTD_RPC_H
#define DISTD_RPC_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stdint.h>

#include "errbuf.h"
#include "server.h"

/* What a handler gets besides its request. */
typedef struct distd_call_info {
  /* CLOCK_MONOTONIC ms (distd_now_ms): the client's deadline, bounded by
   * max_call_duration, so never "none". */
  int64_t deadline_ms;
  const char *method;  /* short name, e.g. "TensorPut" */
} distd_call_info;

/* Who may call a method when auth_tokens_file is set. The zero value is the
 * safe one: a row that says nothing needs a read-write token. */
typedef enum {
  DISTD_ACCESS_WRITE = 0, /* read-write tokens only */
  DISTD_ACCESS_READ,      /* inspection: read-only tokens too */
  DISTD_ACCESS_OPEN,      /* no token needed (health probes) */
} distd_access;

/* Handles one unpacked request. On success it returns 0 and sets *reply to a
 * packed reply (dist_pb_to_bb); on failure it returns a dist_err with eb
 * filled, and the call ends with the mapped gRPC status. */
typedef int (*distd_handler_fn)(distd_server *s, const distd_call_info *ci,
                                const ProtobufCMessage *req,
                                grpc_byte_buffer **reply, dist_errbuf *eb);

typedef struct distd_method {
  const char *path;  /* "/dist.v1.Dist/Info" */
  const char *name;  /* "Info" (metrics label) */
  const ProtobufCMessageDescriptor *request;
  distd_handler_fn handler;
  distd_access access; /* leave out for DISTD_ACCESS_WRITE */
} distd_method;

struct distd_tls_files; /* tls.h */

/* Binds s->cfg.listen (SO_REUSEPORT off: a taken port is an error naming
 * it) with TLS when tls has a certificate (the files tls_cert, tls_key
 * and tls_ca, read once by the caller), loads auth_tokens_file,
 * registers methods and starts the pollers and workers. Every call then
 * passes, in this order: the token check (UNAUTHENTICATED /
 * PERMISSION_DENIED), the per-client in-flight limit and the
 * max_tensor_bytes limit (RESOURCE_EXHAUSTED), before its handler runs. */
int distd_rpc_start(distd_server *s, const distd_method *methods, int n,
                    const struct distd_tls_files *tls, dist_errbuf *eb);
/* Stops accepting calls, waits up to grace_ms for in-flight calls and
 * cancels the rest (their clients see UNAVAILABLE or CANCELLED). Handlers
 * still running go on until they return. NULL is a no-op. */
void distd_rpc_shutdown(distd_rpc *r, int64_t grace_ms);
/* After distd_rpc_shutdown: joins the workers and frees everything. */
void distd_rpc_free(distd_rpc *r);
/* The port the server bound. */
int distd_rpc_port(const distd_rpc *r);
/* Reads auth_tokens_file again and, when it parses, swaps the tokens in:
 * calls checked from then on use the new set. On any error (no file
 * configured, unreadable, readable by others, a bad line, no tokens) the
 * tokens in use stay, and eb says why. */
int distd_rpc_reload_tokens(distd_rpc *r, dist_errbuf *eb);
/* The gRPC port's certificate, key and CA from tls for the connections
 * made from then on (a no-op without TLS). On error nothing changes. */
int distd_rpc_reload_certs(distd_rpc *r, const struct distd_tls_files *tls,
                           dist_errbuf *eb);

#endif
