/* The safetensors framing (huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON header, then the data. The
 * header maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
 * end]} (offsets relative to the start of the data), plus an optional
 * "__metadata__" object of string values. Checkpoints write one such file
 * per rank.
 *
 * The parser trusts nothing: every length, offset and shape is checked
 * against the bytes actually given (it is fuzzed). */
#ifndef DIST_SAFETENSORS_H
#define DIST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"
#include "tensor.h"

#define DIST_ST_NAME_MAX 256
/* safetensors' own limit on the header: larger ones are refused. */
#define DIST_ST_HEADER_MAX (100u << 20)

/* One tensor of a parsed file; data points into the parsed bytes. */
typedef struct dist_st_entry {
  char name[DIST_ST_NAME_MAX];
  dist_dtype dtype;
  dist_shape shape;
  const void *data;
  size_t nbytes;
} dist_st_entry;

typedef struct dist_st_file {
  int count;
  dist_st_entry *entries; /* in data order */
  int nmeta;
  char **meta_keys, **meta_values; /* "__metadata__" pairs */
} dist_st_file;

/* Parses a whole file held in memory. Entries point into bytes, which must
 * outlive *out. Errors (DIST_EINVAL unless said): short file, header length
 * beyond the file or over DIST_ST_HEADER_MAX, header not a JSON object (or
 * with duplicate keys), an entry without dtype/shape/data_offsets, an
 * unknown dtype (DIST_ENOTSUP), a shape with negative or too many dims
 * (DIST_ENOTSUP past DIST_MAX_DIMS), offsets out of the data or not
 * matching the shape's size, overlapping entries or holes in the data,
 * names too long, non-string metadata. The message names the tensor. */
int dist_st_parse(const void *bytes, size_t len, dist_st_file **out,
                  dist_errbuf *eb);
void dist_st_free(dist_st_file *f); /* NULL is a no-op */
/* The entry named `name`, or NULL. */
const dist_st_entry *dist_st_find(const dist_st_file *f, const char *name);
/* The metadata value of key, or NULL. */
const char *dist_st_meta(const dist_st_file *f, const char *key);

/* What the writer needs of one tensor. */
typedef struct dist_st_tensor {
  const char *name;
  dist_dtype dtype;
  dist_shape shape;
  const void *data; /* numel * dtype size bytes */
} dist_st_tensor;

/* The 8-byte length and the JSON header (padded with spaces to a multiple
 * of 8, as the reference writer does) of a file holding tensors t[0..n) in
 * that order, their data following back to back. *out is malloc'd (free()).
 * meta_kv holds nmeta key/value pairs (keys at even indices), may be NULL. */
int dist_st_encode_header(const dist_st_tensor *t, int n,
                          const char *const *meta_kv, int nmeta, void **out,
                          size_t *len, dist_errbuf *eb);
/* The whole file in memory: header then every tensor's data. */
int dist_st_encode(const dist_st_tensor *t, int n, const char *const *meta_kv,
                   int nmeta, void **out, size_t *len, dist_errbuf *eb);
/* "F32", "BF16", "BOOL" ... for a dtype; NULL for invalid. */
const char *dist_st_dtype_name(dist_dtype dt);

#endif
