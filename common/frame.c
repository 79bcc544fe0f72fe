/* Peer frame header and HELLO payload, in explicit little-endian byte order
 * so the wire format does not depend on the host. */
#include "frame.h"

#include <string.h>

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

void dist_frame_encode(const dist_frame_header *h,
                       uint8_t out[DIST_FRAME_HEADER_SIZE]) {
  put32(out + 0, h->magic);
  put16(out + 4, h->version);
  put16(out + 6, h->kind);
  put64(out + 8, h->op_id);
  put32(out + 16, h->src_rank);
  put32(out + 20, h->tag);
  put64(out + 24, h->length);
  put64(out + 32, h->aux);
}

int dist_frame_decode(const uint8_t in[DIST_FRAME_HEADER_SIZE],
                      dist_frame_header *h, dist_errbuf *eb) {
  h->magic = get32(in + 0);
  h->version = get16(in + 4);
  h->kind = get16(in + 6);
  h->op_id = get64(in + 8);
  h->src_rank = get32(in + 16);
  h->tag = get32(in + 20);
  h->length = get64(in + 24);
  h->aux = get64(in + 32);
  if (h->magic != DIST_FRAME_MAGIC)
    return dist_fail(eb, DIST_EPROTO, "bad magic 0x%08x, not a distd peer",
                     (unsigned)h->magic);
  if (h->version != DIST_FRAME_VERSION)
    return dist_fail(eb, DIST_EPROTO,
                     "peer speaks protocol version %u, this daemon speaks %d",
                     (unsigned)h->version, DIST_FRAME_VERSION);
  if (h->kind < DIST_FRAME_HELLO || h->kind > DIST_FRAME_KIND_LAST)
    return dist_fail(eb, DIST_EPROTO, "unknown frame kind %u",
                     (unsigned)h->kind);
  return 0;
}

void dist_hello_encode(const dist_hello *h, uint8_t out[DIST_HELLO_SIZE]) {
  memset(out, 0, DIST_HELLO_SIZE);
  put32(out + 0, h->rank);
  put32(out + 4, h->world_size);
  /* strnlen, not strlen: the struct's field need not be NUL-terminated. */
  memcpy(out + 8, h->cluster_id, strnlen(h->cluster_id, 63));
  put64(out + 72, h->boot_id);
}

int dist_hello_decode(const uint8_t in[DIST_HELLO_SIZE], dist_hello *h,
                      dist_errbuf *eb) {
  memset(h, 0, sizeof *h);
  h->rank = get32(in + 0);
  h->world_size = get32(in + 4);
  memcpy(h->cluster_id, in + 8, sizeof h->cluster_id);
  h->boot_id = get64(in + 72);
  if (memchr(h->cluster_id, 0, sizeof h->cluster_id) == NULL) {
    h->cluster_id[sizeof h->cluster_id - 1] = 0;
    return dist_fail(eb, DIST_EPROTO,
                     "hello cluster id is not NUL-terminated");
  }
  if (h->world_size == 0)
    return dist_fail(eb, DIST_EPROTO, "hello world size is 0");
  return 0;
}

const char *dist_frame_kind_name(unsigned kind) {
  static const char *const names[] = {
      [DIST_FRAME_HELLO] = "hello", [DIST_FRAME_HELLO_ACK] = "hello_ack",
      [DIST_FRAME_HELLO_REJECT] = "hello_reject", [DIST_FRAME_DATA] = "data",
      [DIST_FRAME_ABORT] = "abort", [DIST_FRAME_PING] = "ping", [DIST_FRAME_PONG] = "pong",
      [DIST_FRAME_CLOSE] = "close", [DIST_FRAME_ABORT_RANGE] = "abort_range"};
  return kind >= DIST_FRAME_HELLO && kind <= DIST_FRAME_KIND_LAST ? names[kind] : "unknown";
}

size_t dist_abort_range_encode(const dist_abort_range *a, uint8_t out[DIST_ABORT_RANGE_MAX]) {
  size_t len = strnlen(a->reason, DIST_ABORT_RANGE_MAX - DIST_ABORT_RANGE_COUNT_SIZE);
  put64(out, a->count);
  memcpy(out + DIST_ABORT_RANGE_COUNT_SIZE, a->reason, len);
  return DIST_ABORT_RANGE_COUNT_SIZE + len;
}

int dist_abort_range_decode(const uint8_t *in, size_t len, dist_abort_range *a,
                            dist_errbuf *eb) {
  if (len < DIST_ABORT_RANGE_COUNT_SIZE)
    return dist_fail(eb, DIST_EPROTO, "abort range of %zu bytes has no count", len);
  if (len > DIST_ABORT_RANGE_MAX)
    return dist_fail(eb, DIST_EPROTO, "abort range of %zu bytes, past the %d a sender writes",
                     len, DIST_ABORT_RANGE_MAX);
  a->count = get64(in);
  a->reason = (const char *)in + DIST_ABORT_RANGE_COUNT_SIZE;
  if (a->count == 0 || a->count > DIST_ABORT_RANGE_COUNT_MAX)
    return dist_fail(eb, DIST_EPROTO, "abort range of %llu ids", (unsigned long long)a->count);
  /* A NUL would cut the reason short of what the frame says it holds. */
  size_t reason_len = len - DIST_ABORT_RANGE_COUNT_SIZE;
  size_t nul_at = strnlen(a->reason, reason_len);
  if (nul_at < reason_len)
    return dist_fail(eb, DIST_EPROTO, "abort range reason has a NUL at byte %zu of %zu", nul_at,
                     reason_len);
  return 0;
}
