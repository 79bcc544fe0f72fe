/* dist_bb_to_pb (common/pbuf_recv.c) against protobuf-c's own unpack of the
 * same bytes: whatever slices the message arrives in, the unpacked message
 * must pack back to exactly what protobuf-c makes of it. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "dist.pb-c.h"
#include "pbuf.h"

typedef struct bytes {
  uint8_t *p;
  size_t n;
} bytes;

static bytes pack(const ProtobufCMessage *m) {
  bytes b = {malloc(protobuf_c_message_get_packed_size(m) + 1), 0};
  b.n = protobuf_c_message_pack(m, b.p);
  return b;
}

static bytes concat(bytes a, bytes b) {
  bytes c = {malloc(a.n + b.n + 1), a.n + b.n};
  memcpy(c.p, a.p, a.n);
  memcpy(c.p + a.n, b.p, b.n);
  free(a.p);
  free(b.p);
  return c;
}

/* b's bytes as a byte buffer of slices of `step` bytes (0: one slice). */
static grpc_byte_buffer *sliced(bytes b, size_t step) {
  size_t n = step ? (b.n + step - 1) / step : 1;
  grpc_slice *s = calloc(n ? n : 1, sizeof *s);
  for (size_t i = 0; i < n; i++) {
    size_t off = step ? i * step : 0, len = step ? b.n - off : b.n;
    if (step && len > step) len = step;
    s[i] = grpc_slice_from_copied_buffer((const char *)b.p + off, len);
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, n);
  for (size_t i = 0; i < n; i++) grpc_slice_unref(s[i]);
  free(s);
  return bb;
}

/* dist_bb_to_pb of b in slices of `step` bytes gives what protobuf-c's
 * unpack of the contiguous bytes gives (both NULL, or the same message). */
static void expect_same(bytes b, const ProtobufCMessageDescriptor *d, size_t step) {
  ProtobufCMessage *want = protobuf_c_message_unpack(d, NULL, b.n, b.p);
  grpc_byte_buffer *bb = sliced(b, step);
  ProtobufCMessage *got = dist_bb_to_pb(bb, d, NULL);
  grpc_byte_buffer_destroy(bb);
  cr_assert_eq(got == NULL, want == NULL, "step %zu: unpacked %s, protobuf-c %s", step,
               got ? "a message" : "nothing", want ? "a message" : "nothing");
  if (want) {
    bytes w = pack(want), g = pack(got);
    cr_assert_eq(g.n, w.n, "step %zu: %zu bytes packed again, want %zu", step, g.n, w.n);
    cr_assert(memcmp(g.p, w.p, w.n) == 0, "step %zu: the messages differ", step);
    free(w.p);
    free(g.p);
  }
  protobuf_c_message_free_unpacked(want, NULL);
  protobuf_c_message_free_unpacked(got, NULL);
}

static const size_t steps[] = {0, 1, 7, 4096, 65536, 100000};

static void expect_same_all(bytes b, const ProtobufCMessageDescriptor *d) {
  for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) expect_same(b, d, steps[i]);
  free(b.p);
}

/* A put request whose data is n bytes of a pattern seeded by `seed`. */
static bytes put_request(size_t n, unsigned seed) {
  static uint64_t shape[] = {3, 5, 7};
  Dist__V1__TensorMeta meta = DIST__V1__TENSOR_META__INIT;
  meta.name = "weights";
  meta.global_shape = shape, meta.n_global_shape = 3;
  Dist__V1__TensorPutRequest rq = DIST__V1__TENSOR_PUT_REQUEST__INIT;
  uint8_t *data = malloc(n + 1);
  for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i * 2654435761u + seed);
  rq.meta = &meta;
  rq.data.data = data, rq.data.len = n;
  rq.op_id = 0x123456789abcull + seed;
  rq.replace = 1;
  bytes b = pack(&rq.base);
  free(data);
  return b;
}

static const ProtobufCMessageDescriptor *put_desc = &dist__v1__tensor_put_request__descriptor;

Test(pbuf, large_field_any_slicing) {
  expect_same_all(put_request(1 << 20, 1), put_desc);
}

Test(pbuf, field_at_the_split_threshold) {
  expect_same_all(put_request((64 << 10) - 1, 2), put_desc);
  expect_same_all(put_request(64 << 10, 3), put_desc);
}

Test(pbuf, large_field_value_is_exact) {
  bytes b = put_request(300000, 4);
  grpc_byte_buffer *bb = sliced(b, 4093);
  Dist__V1__TensorPutRequest *m = (void *)dist_bb_to_pb(bb, put_desc, NULL);
  cr_assert_not_null(m);
  cr_assert_eq(m->data.len, 300000);
  for (size_t i = 0; i < m->data.len; i++)
    if (m->data.data[i] != (uint8_t)(i * 2654435761u + 4)) cr_assert_fail("byte %zu differs", i);
  cr_assert_str_eq(m->meta->name, "weights");
  cr_assert_eq(m->op_id, 0x123456789abcull + 4);
  cr_assert(m->replace);
  protobuf_c_message_free_unpacked(&m->base, NULL);
  grpc_byte_buffer_destroy(bb);
  free(b.p);
}

/* A singular field given twice: the last one wins, large or small. */
Test(pbuf, repeated_singular_field_last_wins) {
  expect_same_all(concat(put_request(200000, 5), put_request(10, 6)), put_desc);
  expect_same_all(concat(put_request(10, 7), put_request(200000, 8)), put_desc);
  expect_same_all(concat(put_request(200000, 9), put_request(150000, 10)), put_desc);
}

/* A large message without a large bytes field (a long packed shape), and a
 * large field protobuf-c does not know (kept as an unknown field). */
Test(pbuf, large_without_large_bytes) {
  size_t n = 40000;
  uint64_t *shape = malloc(n * sizeof *shape);
  for (size_t i = 0; i < n; i++) shape[i] = i * 977;
  Dist__V1__TensorGetReply r = DIST__V1__TENSOR_GET_REPLY__INIT;
  r.shape = shape, r.n_shape = n;
  r.data.data = (uint8_t *)"abc", r.data.len = 3;
  expect_same_all(pack(&r.base), &dist__v1__tensor_get_reply__descriptor);
  free(shape);
  bytes unknown = {malloc(100010), 0};
  unknown.p[0] = (15 << 3) | 2; /* field 15, unknown to it, length-delimited */
  unknown.p[1] = 0xa0, unknown.p[2] = 0x8d, unknown.p[3] = 0x06; /* 100000 */
  memset(unknown.p + 4, 'u', 100000);
  unknown.n = 100004;
  expect_same_all(concat(put_request(70000, 11), unknown), put_desc);
}

Test(pbuf, malformed_is_null) {
  bytes b = put_request(100000, 12);
  b.n -= 1; /* the large field is cut short */
  expect_same_all(b, put_desc);
  bytes g = put_request(100000, 13);
  g.p[g.n++] = (5 << 3) | 3; /* a group start: left to protobuf-c */
  expect_same_all(g, put_desc);
  cr_assert_null(dist_bb_to_pb(NULL, put_desc, NULL));
}

/* Message blocks of 1 MiB and more start on a 2 MiB boundary (for huge
 * pages), unless the process turned that off (the daemon does). */
Test(pbuf, large_blocks_alignment) {
  const uintptr_t two_mib = (uintptr_t)2 << 20;
  uint8_t *big = dist_malloc_large(3u << 20), *small = dist_malloc_large(1000);
  cr_assert(big && small);
  cr_assert_eq((uintptr_t)big % two_mib, 0, "a 3 MiB block at %p", (void *)big);
  memset(big, 1, 3u << 20);
  free(big);
  free(small);
  dist_pbuf_align_large(0);
  uint8_t *blocks[4];
  int aligned = 0;
  for (int i = 0; i < 4; i++) { /* a malloc'd block starts past its chunk header */
    blocks[i] = dist_malloc_large((3u << 20) + (size_t)i * 4096);
    cr_assert_not_null(blocks[i]);
    aligned += (uintptr_t)blocks[i] % two_mib == 0;
  }
  for (int i = 0; i < 4; i++) free(blocks[i]);
  dist_pbuf_align_large(1);
  cr_assert_lt(aligned, 4, "every unaligned-mode block started on a 2 MiB boundary");
}

static void setup(void) { grpc_init(); }
static void teardown(void) { grpc_shutdown(); }
TestSuite(pbuf, .init = setup, .fini = teardown);
