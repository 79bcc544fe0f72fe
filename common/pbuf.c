#include "pbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <grpc/slice.h>

/* Tensors travel in messages of many megabytes, and every one gets fresh
 * buffers: glibc maps them anew and each 4 KiB page faults on first touch
 * (a third of the samples of a 16 MiB end-to-end all-to-all). Asking for
 * transparent huge pages on the 2 MiB-aligned inside of large blocks makes
 * that one fault per 2 MiB. The block stays an ordinary malloc'd one, which
 * free() releases. */
#define LARGE_BLOCK (4u << 20)
#define HUGE_PAGE ((uintptr_t)2 << 20)

void *dist_malloc_large(size_t n) {
  void *p = malloc(n);
  if (p && n >= LARGE_BLOCK) {
    uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(HUGE_PAGE - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint */
  }
  return p;
}

grpc_byte_buffer *dist_pb_to_bb(const ProtobufCMessage *msg) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = dist_malloc_large(n ? n : 1);
  grpc_slice s;
  if (buf) {
    protobuf_c_message_pack(msg, buf);
    s = grpc_slice_new(buf, n, free);
  } else { /* gRPC's allocator aborts with a message, as before */
    s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}
