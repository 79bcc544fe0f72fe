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
/* An SPMD trainer's refusal of an operation (svc_op_abort.c). */
DISTD_HANDLER(op_abort);
DISTD_HANDLER(global_scatter);
DISTD_HANDLER(global_gather);
/* Expert shards (svc_experts.c). */
DISTD_HANDLER(expert_layer_create);
DISTD_HANDLER(expert_forward);
DISTD_HANDLER(expert_backward);
DISTD_HANDLER(expert_release);
/* Inspection (svc_ops.c): the operations registry and expert tokens. */
DISTD_HANDLER(ops);
DISTD_HANDLER(experts);
struct distd_ops;
/* Creates the daemon's operations registry (ops.h), counting finished
 * operations in s->metrics, and hands it to the peers (distd_peers_ops).
 * Call after the peers started. */
int distd_ops_attach(distd_server *s, dist_errbuf *eb);
/* Frees it; call after distd_peers_free, with what distd_peers_ops gave. */
void distd_ops_detach(distd_server *s, struct distd_ops *ops);
/* Writes distd_ops_in_flight and distd_expert_tokens_total{expert}. */
void distd_ops_write_metrics(distd_server *s, struct evbuffer *out);
/* dist.v1.Program (svc_program.c). */
DISTD_HANDLER(program_register);
DISTD_HANDLER(program_invoke);
DISTD_HANDLER(program_backward);
DISTD_HANDLER(program_release);
/* Parameter service and checkpoints (helper h11). */
DISTD_HANDLER(param_configure);
DISTD_HANDLER(param_push);
DISTD_HANDLER(param_push_batch);
DISTD_HANDLER(param_configure_batch);
DISTD_HANDLER(param_pull);
DISTD_HANDLER(param_list);
/* Writes distd_param_state_bytes, distd_param_updates_total{param} and
 * distd_param_pushes_pending{param}. */
void distd_param_write_metrics(distd_server *s, struct evbuffer *out);
DISTD_HANDLER(checkpoint_save);
DISTD_HANDLER(checkpoint_commit);
DISTD_HANDLER(checkpoint_manifest);
DISTD_HANDLER(checkpoint_load);
DISTD_HANDLER(checkpoint_read);
DISTD_HANDLER(checkpoint_discard);

#endif
