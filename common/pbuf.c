#include "pbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

/* Tensors travel in messages of many megabytes, and every one gets fresh
 * buffers: glibc maps them anew and each 4 KiB page faults on first touch
 * (a third of the samples of a 16 MiB end-to-end all-to-all). Asking for
 * transparent huge pages on the 2 MiB-aligned inside of large blocks makes
 * that one fault per 2 MiB. The block stays an ordinary malloc'd one: free()
 * releases it, so protobuf_c_message_free_unpacked(m, NULL) still works. */
#define LARGE_BLOCK (4u << 20)
#define HUGE_PAGE ((uintptr_t)2 << 20)

static void *malloc_large(size_t n) {
  void *p = malloc(n);
  if (p && n >= LARGE_BLOCK) {
    uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(HUGE_PAGE - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint */
  }
  return p;
}

static void *pb_alloc(void *data, size_t n) {
  (void)data;
  return malloc_large(n);
}

static void pb_free(void *data, void *p) {
  (void)data;
  free(p);
}

static ProtobufCAllocator large_aware = {pb_alloc, pb_free, NULL};

grpc_byte_buffer *dist_pb_to_bb(const ProtobufCMessage *msg) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = malloc_large(n ? n : 1);
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

/* The message's bytes in one block: the slices copied in order. */
static uint8_t *gather(grpc_byte_buffer *bb, size_t *len) {
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
  *len = grpc_byte_buffer_length(bb);
  uint8_t *buf = malloc_large(*len ? *len : 1);
  grpc_slice *s;
  for (size_t off = 0; buf && grpc_byte_buffer_reader_peek(&r, &s);) {
    memcpy(buf + off, GRPC_SLICE_START_PTR(*s), GRPC_SLICE_LENGTH(*s));
    off += GRPC_SLICE_LENGTH(*s);
  }
  grpc_byte_buffer_reader_destroy(&r);
  return buf;
}

ProtobufCMessage *dist_bb_to_pb(grpc_byte_buffer *bb,
                                const ProtobufCMessageDescriptor *desc) {
  if (!bb) return NULL;
  size_t len = 0;
  uint8_t *buf = gather(bb, &len);
  if (!buf) return NULL;
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, &large_aware, len, buf);
  free(buf);
  return m;
}
