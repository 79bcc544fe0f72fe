#include "pbuf.h"

#include <limits.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <grpc/slice.h>

/* Tensors travel in messages of megabytes, and their blocks are often fresh
 * (glibc maps large blocks anew, or trims freed ones away): each 4 KiB page
 * then faults on first touch, 13-14 us on this VM (docs/performance-notes.md).
 * Blocks of 1 MiB and more start on a 2 MiB boundary and ask for transparent
 * huge pages, up to the boundary after their end, so that a fresh block
 * faults once per 2 MiB (W=2 all-to-all end to end at 1 MiB per pair: 13-19
 * -> 7-8 ms). The hint may cover the few heap bytes after the block as well:
 * harmless. free() releases the block as any other. */
#define ALIGNED_MIN (1u << 20)
/* Unaligned blocks: only their 2 MiB-aligned inside gets the hint. */
#define HINTED_MIN (4u << 20)
#define HUGE_PAGE ((uintptr_t)2 << 20)

static uintptr_t huge_down(uintptr_t a) { return a & ~(HUGE_PAGE - 1); }
static uintptr_t huge_up(uintptr_t a) { return huge_down(a + HUGE_PAGE - 1); }

static int align_large = 1;

void dist_pbuf_align_large(int on) { align_large = on; }

void dist_heap_keep(void) {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
}

static void *malloc_hinted(size_t n) {
  void *p = malloc(n);
  if (p && n >= HINTED_MIN) {
    uintptr_t lo = huge_up((uintptr_t)p), hi = huge_down((uintptr_t)p + n);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint */
  }
  return p;
}

void *dist_malloc_large(size_t n) {
  if (n < ALIGNED_MIN || !align_large) return malloc_hinted(n);
  void *p = NULL;
  if (posix_memalign(&p, HUGE_PAGE, n)) return NULL;
  uintptr_t end = huge_up((uintptr_t)p + n);
  madvise(p, end - (uintptr_t)p, MADV_HUGEPAGE); /* a hint */
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
