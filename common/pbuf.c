#include "pbuf.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

grpc_byte_buffer *dist_pb_to_bb(const ProtobufCMessage *msg) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  grpc_slice s = grpc_slice_malloc(n);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

ProtobufCMessage *dist_bb_to_pb(grpc_byte_buffer *bb,
                                const ProtobufCMessageDescriptor *desc) {
  if (!bb) return NULL;
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  ProtobufCMessage *m = protobuf_c_message_unpack(
      desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
  grpc_slice_unref(s);
  return m;
}
