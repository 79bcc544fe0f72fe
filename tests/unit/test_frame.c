/* Peer frame header and HELLO: byte layout, round trips, and each rejection
 * with a message naming the field. */
#include <criterion/criterion.h>
#include <string.h>

#include "frame.h"

static dist_frame_header sample(void) {
  return (dist_frame_header){DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_DATA,
                             0x0102030405060708ull, 7, 0xa0b0c0d0u, 1ull << 40, 99};
}

Test(frame, header_round_trip) {
  dist_frame_header h = sample(), back;
  uint8_t buf[DIST_FRAME_HEADER_SIZE];
  dist_frame_encode(&h, buf);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_frame_decode(buf, &back, &eb), 0, "%s", eb.msg);
  cr_assert_eq(memcmp(&h, &back, sizeof h), 0);
}

Test(frame, header_is_little_endian_at_documented_offsets) {
  dist_frame_header h = sample();
  uint8_t buf[DIST_FRAME_HEADER_SIZE];
  dist_frame_encode(&h, buf);
  cr_assert_eq(memcmp(buf, "DSTD", 4), 0, "magic reads DSTD on the wire");
  cr_assert_eq(buf[4], 1);
  cr_assert_eq(buf[5], 0);
  cr_assert_eq(buf[6], DIST_FRAME_DATA);
  cr_assert_eq(buf[8], 0x08);
  cr_assert_eq(buf[15], 0x01);
  cr_assert_eq(buf[16], 7);
  cr_assert_eq(buf[20], 0xd0);
  cr_assert_eq(buf[24 + 5], 1, "length 2^40 has its bit in byte 5");
  cr_assert_eq(buf[32], 99);
}

Test(frame, bad_magic_names_the_magic) {
  dist_frame_header h = sample(), back;
  h.magic = 0x50545448; /* "HTTP" */
  uint8_t buf[DIST_FRAME_HEADER_SIZE];
  dist_frame_encode(&h, buf);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_frame_decode(buf, &back, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "bad magic 0x50545448, not a distd peer");
}

Test(frame, other_version_names_both_versions) {
  dist_frame_header h = sample(), back;
  h.version = 7;
  uint8_t buf[DIST_FRAME_HEADER_SIZE];
  dist_frame_encode(&h, buf);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_frame_decode(buf, &back, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "peer speaks protocol version 7, this daemon speaks 1");
}

Test(frame, unknown_kind_is_rejected) {
  dist_frame_header h = sample(), back;
  uint8_t buf[DIST_FRAME_HEADER_SIZE];
  dist_errbuf eb = DIST_ERRBUF_INIT;
  h.kind = 0;
  dist_frame_encode(&h, buf);
  cr_assert_eq(dist_frame_decode(buf, &back, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "unknown frame kind 0");
  h.kind = DIST_FRAME_KIND_LAST + 1;
  dist_frame_encode(&h, buf);
  cr_assert_eq(dist_frame_decode(buf, &back, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "unknown frame kind 10");
  h.kind = DIST_FRAME_ABORT_RANGE;
  dist_frame_encode(&h, buf);
  cr_assert_eq(dist_frame_decode(buf, &back, &eb), 0, "%s", eb.msg);
}

/* Kind numbers are never reused: an older daemon meets 9 as unknown. */
Test(frame, abort_range_is_kind_9_after_close) {
  cr_assert_eq(DIST_FRAME_CLOSE, 8);
  cr_assert_eq(DIST_FRAME_ABORT_RANGE, 9);
  cr_assert_str_eq(dist_frame_kind_name(DIST_FRAME_ABORT_RANGE), "abort_range");
  cr_assert_str_eq(dist_frame_kind_name(10), "unknown");
}

Test(frame, abort_range_payload_round_trip) {
  uint8_t buf[DIST_ABORT_RANGE_MAX + 1];
  size_t len = dist_abort_range_encode(&(dist_abort_range){1001, "a plan refused"}, buf);
  cr_assert_eq(len, 8 + strlen("a plan refused"));
  cr_assert_eq(buf[0], 1001 & 0xff, "the count comes first, little-endian");
  cr_assert_eq(buf[1], 1001 >> 8);
  buf[len] = 0;
  dist_abort_range back;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_abort_range_decode(buf, len, &back, &eb), 0, "%s", eb.msg);
  cr_assert_eq(back.count, 1001);
  cr_assert_str_eq(back.reason, "a plan refused");
}

Test(frame, abort_range_reason_is_cut_to_fit) {
  char reason[2000];
  memset(reason, 'x', sizeof reason - 1);
  reason[sizeof reason - 1] = 0;
  uint8_t buf[DIST_ABORT_RANGE_MAX];
  cr_assert_eq(dist_abort_range_encode(&(dist_abort_range){1, reason}, buf),
               DIST_ABORT_RANGE_MAX);
}

Test(frame, abort_range_without_a_count_or_of_no_or_too_many_ids_is_refused) {
  uint8_t buf[16] = {0};
  dist_abort_range a;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_abort_range_decode(buf, 7, &a, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "abort range of 7 bytes has no count");
  cr_assert_eq(dist_abort_range_decode(buf, 8, &a, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "abort range of 0 ids");
  memset(buf, 0xff, 8); /* every id there is */
  cr_assert_eq(dist_abort_range_decode(buf, 8, &a, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "abort range of 18446744073709551615 ids");
}

/* The count's bounds: 1 and DIST_ABORT_RANGE_COUNT_MAX (2^32, an OpAbort's
 * id and its u32 more_ids) are taken, one past the maximum is not; a
 * payload of the count alone is an empty reason. */
Test(frame, abort_range_counts_of_1_and_2_to_the_32_are_taken_one_more_is_not) {
  uint8_t buf[DIST_ABORT_RANGE_MAX + 1] = {0};
  dist_abort_range a;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  buf[0] = 1;
  cr_assert_eq(dist_abort_range_decode(buf, 8, &a, &eb), 0, "%s", eb.msg);
  cr_assert_eq(a.count, 1);
  cr_assert_str_eq(a.reason, "");
  memset(buf, 0, 8);
  buf[4] = 1; /* 2^32 */
  cr_assert_eq(dist_abort_range_decode(buf, 8, &a, &eb), 0, "%s", eb.msg);
  cr_assert_eq(a.count, (uint64_t)1 << 32);
  buf[0] = 1; /* 2^32 + 1 */
  cr_assert_eq(dist_abort_range_decode(buf, 8, &a, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "abort range of 4294967297 ids");
}

/* A reason that fills the payload has no NUL in the frame: the decoder
 * reads it up to the caller's NUL at in[len], and encoding it gives the
 * same 1024 bytes. One byte more than a sender writes is refused. */
Test(frame, abort_range_of_the_largest_payload_is_taken_one_byte_more_is_not) {
  uint8_t buf[DIST_ABORT_RANGE_MAX + 2], again[DIST_ABORT_RANGE_MAX];
  memset(buf, 'r', sizeof buf);
  memcpy(buf, "\x05\0\0\0\0\0\0\0", 8);
  buf[DIST_ABORT_RANGE_MAX] = 0;
  dist_abort_range a;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_abort_range_decode(buf, DIST_ABORT_RANGE_MAX, &a, &eb), 0, "%s", eb.msg);
  cr_assert_eq(a.count, 5);
  cr_assert_eq(strlen(a.reason), DIST_ABORT_RANGE_MAX - 8);
  cr_assert_eq(dist_abort_range_encode(&a, again), DIST_ABORT_RANGE_MAX);
  cr_assert_eq(memcmp(again, buf, DIST_ABORT_RANGE_MAX), 0);
  buf[DIST_ABORT_RANGE_MAX] = 'r';
  buf[DIST_ABORT_RANGE_MAX + 1] = 0;
  cr_assert_eq(dist_abort_range_decode(buf, DIST_ABORT_RANGE_MAX + 1, &a, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "abort range of 1025 bytes, past the 1024 a sender writes");
}

/* A NUL inside the reason would cut it short of the frame's length (the
 * encoder never writes one): refused, naming where. */
Test(frame, abort_range_reason_with_a_nul_inside_is_refused) {
  uint8_t buf[32] = {2};
  memcpy(buf + 8, "plan\0refused", 12);
  dist_abort_range a;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_abort_range_decode(buf, 20, &a, &eb), DIST_EPROTO);
  cr_assert_str_eq(eb.msg, "abort range reason has a NUL at byte 4 of 12");
  cr_assert_eq(dist_abort_range_decode(buf, 12, &a, &eb), 0, "%s", eb.msg);
  cr_assert_str_eq(a.reason, "plan");
}

Test(frame, hello_round_trip) {
  dist_hello h = {.rank = 3, .world_size = 4, .boot_id = 0xdeadbeefcafef00dull}, back;
  strcpy(h.cluster_id, "prod-eu");
  uint8_t buf[DIST_HELLO_SIZE];
  dist_hello_encode(&h, buf);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_hello_decode(buf, &back, &eb), 0, "%s", eb.msg);
  cr_assert_eq(back.rank, 3);
  cr_assert_eq(back.world_size, 4);
  cr_assert_str_eq(back.cluster_id, "prod-eu");
  cr_assert_eq(back.boot_id, 0xdeadbeefcafef00dull);
  cr_assert_eq(buf[0], 3);
  cr_assert_eq(buf[4], 4);
  cr_assert_eq(memcmp(buf + 8, "prod-eu", 8), 0);
}

Test(frame, hello_cluster_id_must_be_terminated) {
  uint8_t buf[DIST_HELLO_SIZE];
  memset(buf, 'x', sizeof buf);
  dist_hello back;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_hello_decode(buf, &back, &eb), DIST_EPROTO);
  cr_assert(strstr(eb.msg, "cluster id"), "%s", eb.msg);
}

Test(frame, hello_world_size_zero_is_rejected) {
  dist_hello h = {.rank = 0, .world_size = 0}, back;
  uint8_t buf[DIST_HELLO_SIZE];
  dist_hello_encode(&h, buf);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_hello_decode(buf, &back, &eb), DIST_EPROTO);
  cr_assert(strstr(eb.msg, "world size"), "%s", eb.msg);
}
