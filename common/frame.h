/* Peer data-plane framing. Every frame starts with this fixed 40-byte
 * little-endian header; the payload (length bytes) follows. Kinds are never
 * renumbered; a retired kind's number is never reused.
 *
 *   0  u32 magic "DSTD" (0x44545344)   4  u16 version   6  u16 kind
 *   8  u64 op_id                      16  u32 src_rank  20  u32 tag
 *  24  u64 length                     32  u64 aux (kind-specific)          */
#ifndef DIST_FRAME_H
#define DIST_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"

#define DIST_FRAME_MAGIC 0x44545344u
#define DIST_FRAME_VERSION 1
#define DIST_FRAME_HEADER_SIZE 40

typedef enum {
  DIST_FRAME_HELLO = 1,     /* payload: dist_hello */
  DIST_FRAME_HELLO_ACK = 2, /* no payload; aux: DIST_ACK_READS_* bits, the
                               kinds past 8 the acceptor reads (0 from a
                               daemon built before ABORT_RANGE, 0.2.9 or
                               older, which ignores this aux) */
  DIST_FRAME_HELLO_REJECT = 3, /* payload: reason text */
  DIST_FRAME_DATA = 4,      /* payload: bytes for (op_id, src_rank, tag);
                               aux: the op's signature, 0 for none
                               (daemon/op_signature.h, since 0.2.5) */
  DIST_FRAME_ABORT = 5,     /* payload: reason text; aux: -(dist_err code);
                               fails op_id on the receiver */
  DIST_FRAME_PING = 6,      /* aux: sender's timestamp */
  DIST_FRAME_PONG = 7,      /* aux: echoed timestamp */
  DIST_FRAME_CLOSE = 8,     /* payload: why the sender closes the connection
                               after it, worded for the receiver; on a
                               greeted connection, either way (since 0.2.9;
                               a daemon before it fails the connection on
                               the unknown kind, which the sender is closing
                               anyway) */
  DIST_FRAME_ABORT_RANGE = 9 /* payload: dist_abort_range (u64 count, then
                               the reason text); aux: -(dist_err code);
                               fails op_id .. op_id + count - 1 on the
                               receiver, each with its refusal steps
                               (daemon/subop.h distd_refused_steps), as
                               an ABORT of each would. Sent only to a peer
                               whose HELLO_ACK set DIST_ACK_READS_ABORT_RANGE:
                               a daemon built before it fails the
                               connection on the unknown kind, and is sent
                               an ABORT per step per id instead */
} dist_frame_kind;
#define DIST_FRAME_KIND_LAST DIST_FRAME_ABORT_RANGE

/* HELLO_ACK aux bits. */
#define DIST_ACK_READS_ABORT_RANGE 1u

/* "data", "abort", ...: the kind's name in logs and metrics; "unknown"
 * for a kind this build does not know. */
const char *dist_frame_kind_name(unsigned kind);

typedef struct dist_frame_header {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint64_t op_id;
  uint32_t src_rank;
  uint32_t tag;
  uint64_t length;
  uint64_t aux;
} dist_frame_header;

/* HELLO payload: fixed 80 bytes. */
#define DIST_HELLO_SIZE 80
typedef struct dist_hello {
  uint32_t rank;
  uint32_t world_size;
  char cluster_id[64]; /* NUL-padded */
  uint64_t boot_id;    /* random per daemon start: tells a restart apart */
} dist_hello;

/* ABORT_RANGE payload: the count of ids (u64), then the reason, not
 * NUL-terminated; the reason is cut to fit DIST_ABORT_RANGE_MAX bytes in
 * all. The ids run from the header's op_id counted modulo 2^64: a range
 * may cross 2^64 - 1 to 0, as a single client's op ids start at a random
 * 64-bit base (subop.h distd_refused_range_covers counts them so). */
#define DIST_ABORT_RANGE_COUNT_SIZE 8
#define DIST_ABORT_RANGE_MAX 1024
/* An OpAbort's id and its more_ids (a u32) at most. */
#define DIST_ABORT_RANGE_COUNT_MAX ((uint64_t)1 << 32)
typedef struct dist_abort_range {
  uint64_t count;  /* 1 .. DIST_ABORT_RANGE_COUNT_MAX */
  const char *reason; /* decode: points into the payload, NUL-terminated by the caller */
} dist_abort_range;

void dist_frame_encode(const dist_frame_header *h,
                       uint8_t out[DIST_FRAME_HEADER_SIZE]);
/* Decodes and checks magic, version and kind; the message says which field
 * is wrong ("bad magic 0x..., not a distd peer", "protocol version 7, this
 * daemon speaks 1"). Payload lengths are bounded by the reader, per kind. */
int dist_frame_decode(const uint8_t in[DIST_FRAME_HEADER_SIZE],
                      dist_frame_header *h, dist_errbuf *eb);
void dist_hello_encode(const dist_hello *h, uint8_t out[DIST_HELLO_SIZE]);
int dist_hello_decode(const uint8_t in[DIST_HELLO_SIZE], dist_hello *h,
                      dist_errbuf *eb);
/* Writes a's payload into out (DIST_ABORT_RANGE_MAX bytes of room): the
 * count, then the reason up to its NUL, cut to fit; returns its length. */
size_t dist_abort_range_encode(const dist_abort_range *a, uint8_t out[DIST_ABORT_RANGE_MAX]);
/* Reads the payload in[0..len), whose byte in[len] the caller set to 0:
 * a->reason points at in + DIST_ABORT_RANGE_COUNT_SIZE. Accepts exactly
 * what dist_abort_range_encode writes, so encoding what it gives back
 * gives in[0..len) again: a count of 1 .. DIST_ABORT_RANGE_COUNT_MAX (a
 * count of 0 names no id, one past it ids nobody named, up to every id
 * there is) and a reason without a NUL (the encoder stops at one), in
 * DIST_ABORT_RANGE_MAX bytes at most. Anything else fails with DIST_EPROTO
 * and a message saying which rule it breaks. */
int dist_abort_range_decode(const uint8_t *in, size_t len, dist_abort_range *a,
                            dist_errbuf *eb);

#endif
