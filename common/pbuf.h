/* protobuf-c messages <-> gRPC byte buffers. */
#ifndef DIST_PBUF_H
#define DIST_PBUF_H

#include <grpc/byte_buffer.h>
#include <protobuf-c/protobuf-c.h>

/* malloc, asking for transparent huge pages on the inside of large
 * blocks (pbuf.c); free() releases it. */
void *dist_malloc_large(size_t n);
/* Packs msg into a new byte buffer (one copy); the caller destroys it. */
grpc_byte_buffer *dist_pb_to_bb(const ProtobufCMessage *msg);
/* Unpacks a received buffer, large bytes fields copied once, straight from
 * its slices (pbuf_recv.c); NULL when bb is NULL or not a valid message.
 * Free with protobuf_c_message_free_unpacked(m, NULL). */
ProtobufCMessage *dist_bb_to_pb(grpc_byte_buffer *bb,
                                const ProtobufCMessageDescriptor *desc);

#endif
