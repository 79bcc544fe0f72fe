/* protobuf-c messages <-> gRPC byte buffers. */
#ifndef DIST_PBUF_H
#define DIST_PBUF_H

#include <grpc/byte_buffer.h>
#include <protobuf-c/protobuf-c.h>

/* malloc for message blocks: large ones start on a 2 MiB boundary and ask
 * for transparent huge pages (pbuf.c); free() releases it. */
void *dist_malloc_large(size_t n);
/* Keeps freed heap memory in the process for the next message instead of
 * giving it back to the kernel: large blocks from the heap (M_MMAP_MAX 0)
 * and no trim at free (M_TRIM_THRESHOLD at its maximum). A fresh 4 KiB
 * page faults at 13-14 us on these VMs, and gRPC's receive slices of a
 * message of tens of MiB were fresh at every call. Process-wide. */
void dist_heap_keep(void);
/* With 0, large blocks are placed by malloc as any other and only their
 * aligned inside asks for huge pages: for a process whose heap keeps its
 * pages (the daemon, daemon/memory.c). Call before any thread starts. */
void dist_pbuf_align_large(int on);
/* Packs msg into a new byte buffer (one copy); the caller destroys it. */
grpc_byte_buffer *dist_pb_to_bb(const ProtobufCMessage *msg);
/* Unpacks a received buffer, large bytes fields copied once, straight from
 * its slices (pbuf_recv.c); NULL when bb is NULL or not a valid message, or
 * when a block could not be allocated: then *no_memory (may be NULL) is 1,
 * else 0. Free with protobuf_c_message_free_unpacked(m, NULL). */
ProtobufCMessage *dist_bb_to_pb(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                int *no_memory);
/* How many times bb's top-level field `field` occurs (0 when bb cannot be
 * read), and, when it is a varint, its last value (as protobuf reads it)
 * in *value. Read off the slices, allocating nothing: a request that
 * could not be unpacked for want of memory still names its op id and its
 * outputs. */
size_t dist_bb_scan_field(grpc_byte_buffer *bb, uint32_t field, uint64_t *value);
/* dist_bb_to_pb taking out bytes fields of split_min bytes and more (it
 * uses 64 KiB): lets tests and the fuzzer reach the walk with small
 * messages. */
ProtobufCMessage *dist_bb_to_pb_split(grpc_byte_buffer *bb,
                                      const ProtobufCMessageDescriptor *desc,
                                      size_t split_min, int *no_memory);

#endif
