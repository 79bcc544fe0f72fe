/* The safetensors framing: what the writer produces parses back to the same
 * tensors, matches the published layout, and every malformed file is
 * refused with a message instead of being read out of bounds. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jansson_failing.h"
#include "safetensors.h"

static void *raw_file(const char *header, const void *data, size_t dlen,
                      size_t *len) {
  size_t hl = strlen(header);
  uint8_t *b = malloc(8 + hl + dlen + 1);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, header, hl);
  if (dlen) memcpy(b + 8 + hl, data, dlen);
  *len = 8 + hl + dlen;
  return b;
}

/* Parses a hand-made file and expects refusal with `code` and a message
 * containing `word`. */
static void expect_refused(const char *header, size_t dlen, int code,
                           const char *word) {
  uint8_t data[64] = {0};
  size_t len;
  void *b = raw_file(header, data, dlen, &len);
  dist_st_file *f = (void *)1;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = dist_st_parse(b, len, &f, &eb);
  cr_assert_eq(rc, code, "header %s: rc %d (%s)", header, rc, eb.msg);
  cr_assert_null(f);
  cr_assert(strstr(eb.msg, word), "header %s: message '%s' lacks '%s'", header,
            eb.msg, word);
  free(b);
}

Test(safetensors, round_trip_keeps_names_dtypes_shapes_and_bytes) {
  float w[6] = {1, 2, 3, 4, 5, 6};
  int64_t ids[3] = {-1, 0, 1LL << 40};
  double scalar = 3.5;
  uint16_t bf[2] = {0x3f80, 0xc000};
  dist_st_tensor t[] = {
      {"fc1.weight", DIST_FLOAT32, {2, {2, 3}}, w},
      {"ids", DIST_INT64, {1, {3}}, ids},
      {"step", DIST_FLOAT64, {0, {0}}, &scalar},
      {"empty", DIST_FLOAT32, {2, {0, 4}}, NULL},
      {"half", DIST_BFLOAT16, {1, {2}}, bf},
  };
  const char *meta[] = {"format", "distd", "rank", "1"};
  void *buf = NULL;
  size_t len = 0;
  cr_assert_eq(dist_st_encode(t, 5, meta, 2, &buf, &len, NULL), 0);
  dist_st_file *f = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_st_parse(buf, len, &f, &eb), 0, "%s", eb.msg);
  cr_assert_eq(f->count, 5);
  for (int i = 0; i < 5; i++) {
    const dist_st_entry *e = dist_st_find(f, t[i].name);
    cr_assert_not_null(e, "%s", t[i].name);
    cr_assert_eq(e->dtype, t[i].dtype);
    cr_assert(dist_shape_equal(&e->shape, &t[i].shape));
    size_t bytes = (size_t)dist_shape_numel(&t[i].shape) * dist_dtype_size(t[i].dtype);
    cr_assert_eq(e->nbytes, bytes);
    if (bytes) cr_assert_eq(memcmp(e->data, t[i].data, bytes), 0);
  }
  cr_assert_str_eq(dist_st_meta(f, "format"), "distd");
  cr_assert_str_eq(dist_st_meta(f, "rank"), "1");
  cr_assert_null(dist_st_meta(f, "nope"));
  cr_assert_null(dist_st_find(f, "nope"));
  dist_st_free(f);
  free(buf);
}

/* The layout of the published format: u64 little-endian length, a JSON
 * object padded with spaces to 8 bytes, data right after. */
Test(safetensors, writer_follows_the_published_layout) {
  float x[2] = {1.0f, -2.0f};
  dist_st_tensor t = {"x", DIST_FLOAT32, {1, {2}}, x};
  void *buf = NULL;
  size_t len = 0;
  cr_assert_eq(dist_st_encode(&t, 1, NULL, 0, &buf, &len, NULL), 0);
  const uint8_t *b = buf;
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
  cr_assert_eq(hl % 8, 0);
  cr_assert_eq(len, 8 + hl + sizeof x);
  char *header = strndup((const char *)b + 8, hl);
  cr_assert(strstr(header, "\"x\":{\"dtype\":\"F32\",\"shape\":[2],"
                           "\"data_offsets\":[0,8]}"), "%s", header);
  cr_assert_eq(memcmp(b + 8 + hl, x, sizeof x), 0);
  free(header);
  free(buf);
}

/* A file from the reference Python writer, byte for byte:
 * safetensors.numpy.save({"a": np.array([1, 2], dtype=np.int32)}). */
Test(safetensors, parses_a_reference_file) {
  const char *h = "{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  int32_t a[2] = {1, 2};
  size_t len;
  void *b = raw_file(h, a, sizeof a, &len);
  dist_st_file *f = NULL;
  cr_assert_eq(dist_st_parse(b, len, &f, NULL), 0);
  cr_assert_eq(f->count, 1);
  int32_t back[2];
  memcpy(back, f->entries[0].data, sizeof back); /* data may be unaligned */
  cr_assert_eq(back[1], 2);
  dist_st_free(f);
  free(b);
}

Test(safetensors, rejects_short_and_truncated_files) {
  dist_st_file *f = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  uint8_t tiny[5] = {0};
  cr_assert_eq(dist_st_parse(tiny, sizeof tiny, &f, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "shorter"), "%s", eb.msg);
  float x[4] = {1, 2, 3, 4};
  dist_st_tensor t = {"x", DIST_FLOAT32, {1, {4}}, x};
  void *buf = NULL;
  size_t len = 0;
  cr_assert_eq(dist_st_encode(&t, 1, NULL, 0, &buf, &len, NULL), 0);
  /* Every truncation fails: in the length, in the header, in the data. */
  for (size_t cut = 0; cut < len; cut++) {
    cr_assert_neq(dist_st_parse(buf, cut, &f, &eb), 0, "truncated at %zu", cut);
    cr_assert_null(f);
  }
  free(buf);
}

Test(safetensors, rejects_header_length_beyond_the_file) {
  uint8_t b[16] = {0};
  b[0] = 0xff, b[7] = 0x7f; /* huge */
  dist_st_file *f = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_st_parse(b, sizeof b, &f, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "header length"), "%s", eb.msg);
}

Test(safetensors, rejects_malformed_headers) {
  expect_refused("not json", 0, DIST_EINVAL, "not a JSON object");
  expect_refused("[1,2]   ", 0, DIST_EINVAL, "not a JSON object");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8, DIST_EINVAL, "not a JSON object"); /* duplicate key */
  expect_refused("{\"a\":3}", 0, DIST_EINVAL, "'a' is not an object");
  expect_refused("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DIST_EINVAL,
                 "lacks");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, DIST_EINVAL,
                 "lacks");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, DIST_EINVAL, "lacks");
  expect_refused("{\"__metadata__\":{\"k\":1}}", 0, DIST_EINVAL, "metadata");
  expect_refused("{\"__metadata__\":[]}", 0, DIST_EINVAL, "__metadata__");
}

Test(safetensors, rejects_bad_dtypes_and_shapes) {
  expect_refused("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                 1, DIST_ENOTSUP, "dtype");
  expect_refused("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                 DIST_EINVAL, "lacks");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
                 4, DIST_EINVAL, "shape entry 0");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
                 4, DIST_EINVAL, "shape entry 0");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}",
                 4, DIST_EINVAL, "not an array");
  expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                 "\"data_offsets\":[0,1]}}", 1, DIST_ENOTSUP, "9 dims");
  /* A shape whose size overflows 64 bits must not wrap to a small number. */
  expect_refused("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],"
                 "\"data_offsets\":[0,0]}}", 0, DIST_EINVAL, "shape needs");
}

Test(safetensors, rejects_bad_offsets) {
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                 4, DIST_EINVAL, "within"); /* past the data */
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,0]}}",
                 8, DIST_EINVAL, "within"); /* end before begin */
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}",
                 4, DIST_EINVAL, "shape needs"); /* size mismatch */
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
                 4, DIST_EINVAL, "within");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
                 4, DIST_EINVAL, "within");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[0,99999999999999999999]}}", 4, DIST_EINVAL,
                 "not a JSON object"); /* integer beyond 64 bits */
}

Test(safetensors, rejects_overlaps_and_holes) {
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 8, DIST_EINVAL, "overlap");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8, DIST_EINVAL, "overlap or hole");
  expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 8, DIST_EINVAL, "cover 4 of 8");
}

Test(safetensors, rejects_long_names) {
  char h[600];
  char name[300];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = 0;
  snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
           name);
  expect_refused(h, 0, DIST_EINVAL, "name");
}

Test(safetensors, writer_rejects_repeated_names_and_bad_dtypes) {
  float x = 1;
  dist_st_tensor t[2] = {{"x", DIST_FLOAT32, {0, {0}}, &x},
                         {"x", DIST_FLOAT32, {0, {0}}, &x}};
  void *buf = NULL;
  size_t len;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_st_encode(t, 2, NULL, 0, &buf, &len, &eb), DIST_EINVAL);
  cr_assert_null(buf);
  t[1].name = "y";
  t[1].dtype = DIST_DTYPE_INVALID;
  cr_assert_eq(dist_st_encode(t, 2, NULL, 0, &buf, &len, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "'y'"), "%s", eb.msg);
}

/* Flipping any single byte of a valid file either still parses (data
 * bytes, padding) or is refused: it never reads out of bounds (ASan). */
Test(safetensors, single_byte_corruptions_never_overrun) {
  double x[3] = {1, 2, 3};
  dist_st_tensor t[2] = {{"x", DIST_FLOAT64, {1, {3}}, x},
                         {"y", DIST_FLOAT64, {2, {1, 1}}, x}};
  void *buf = NULL;
  size_t len;
  cr_assert_eq(dist_st_encode(t, 2, NULL, 0, &buf, &len, NULL), 0);
  uint8_t *b = buf;
  const uint8_t flips[] = {0x01, 0x80, 0xff, '0' ^ '9', '"' ^ ' '};
  for (size_t i = 0; i < len; i++)
    for (size_t k = 0; k < sizeof flips; k++) {
      uint8_t *copy = malloc(len);
      memcpy(copy, b, len);
      copy[i] ^= flips[k];
      dist_st_file *f = NULL;
      if (dist_st_parse(copy, len, &f, NULL) == 0) {
        for (int e = 0; e < f->count; e++) /* touch every byte it points at */
          for (size_t j = 0; j < f->entries[e].nbytes; j++)
            cr_assert(((const uint8_t *)f->entries[e].data)[j] == copy[(size_t)
                      ((const uint8_t *)f->entries[e].data - copy) + j]);
        dist_st_free(f);
      }
      free(copy);
    }
  free(buf);
}

/* Each of jansson's allocations failing in turn: the writer fails with
 * DIST_ENOMEM, or writes a header that reads back whole. It wrote headers
 * with a tensor, a dim or the metadata left out. */
Test(safetensors, a_header_jansson_cannot_allocate_for_is_an_error_never_a_short_one) {
  float w[6] = {0};
  dist_st_tensor t[] = {{"a", DIST_FLOAT32, {2, {2, 3}}, w}, {"b", DIST_FLOAT32, {1, {6}}, w}};
  const char *meta[] = {"format", "distd", "rank", "1"};
  long k = 0, counted = 0;
  /* until a run ends before its k-th allocation (bounded: 10,000 runs) */
  for (int clean = 0; !clean && k < 10000;) {
    k++;
    void *buf = NULL;
    size_t len = 0;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    jansson_fail_from_now(k);
    int rc = dist_st_encode(t, 2, meta, 2, &buf, &len, &eb);
    counted = jansson_restore();
    if (rc != 0) {
      cr_assert_eq(rc, DIST_ENOMEM, "k=%ld: %s", k, eb.msg);
      continue;
    }
    clean = counted < k;
    dist_st_file *f = NULL;
    cr_assert_eq(dist_st_parse(buf, len, &f, &eb), 0, "k=%ld: %s", k, eb.msg);
    cr_assert_eq(f->count, 2, "k=%ld: %d tensors", k, f->count);
    cr_assert(dist_shape_equal(&dist_st_find(f, "a")->shape, &t[0].shape), "k=%ld", k);
    cr_assert_not_null(dist_st_meta(f, "format"), "k=%ld: metadata lost", k);
    cr_assert_str_eq(dist_st_meta(f, "rank"), "1", "k=%ld", k);
    dist_st_free(f);
    free(buf);
  }
  cr_assert_gt(k, 5, "jansson allocated only %ld times", counted);
  cr_assert_lt(k, 10000);
}

/* Reading a header jansson cannot allocate for is DIST_ENOMEM, not a
 * header said to be malformed. */
Test(safetensors, a_header_jansson_cannot_allocate_for_reading_is_out_of_memory) {
  float w[6] = {0};
  dist_st_tensor t = {"a", DIST_FLOAT32, {2, {2, 3}}, w};
  void *buf = NULL;
  size_t len = 0;
  cr_assert_eq(dist_st_encode(&t, 1, NULL, 0, &buf, &len, NULL), 0);
  dist_st_file *f = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  jansson_fail_from_now(1);
  int rc = dist_st_parse(buf, len, &f, &eb);
  jansson_restore();
  cr_assert_eq(rc, DIST_ENOMEM, "%s", eb.msg);
  cr_assert_null(f);
  free(buf);
}

Test(safetensors, writer_rejects_metadata_that_is_not_utf8) {
  float w[1] = {0};
  dist_st_tensor t = {"a", DIST_FLOAT32, {1, {1}}, w};
  const char *meta[] = {"note", "caf\xe9"};
  void *buf = NULL;
  size_t len = 0;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_st_encode(&t, 1, meta, 1, &buf, &len, &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "metadata value 0 is not valid UTF-8"), "%s", eb.msg);
  cr_assert_null(buf);
}
