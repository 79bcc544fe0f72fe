/* safetensors framing: see safetensors.h. Every number read from the file
 * is checked before it is used as a length or an offset. */
#include "safetensors.h"
#include "json_memory.h"
#include "utf8.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  dist_dtype dt;
  const char *name;
} dtype_names[] = {
    {DIST_BOOL, "BOOL"},     {DIST_INT8, "I8"},     {DIST_UINT8, "U8"},
    {DIST_INT32, "I32"},     {DIST_INT64, "I64"},   {DIST_FLOAT16, "F16"},
    {DIST_BFLOAT16, "BF16"}, {DIST_FLOAT32, "F32"}, {DIST_FLOAT64, "F64"},
};
enum { NDTYPES = sizeof dtype_names / sizeof dtype_names[0] };

const char *dist_st_dtype_name(dist_dtype dt) {
  for (int i = 0; i < NDTYPES; i++)
    if (dtype_names[i].dt == dt) return dtype_names[i].name;
  return NULL;
}

static dist_dtype dtype_parse(const char *name) {
  for (int i = 0; i < NDTYPES; i++)
    if (strcmp(dtype_names[i].name, name) == 0) return dtype_names[i].dt;
  return DIST_DTYPE_INVALID;
}

void dist_st_free(dist_st_file *f) {
  if (!f) return;
  for (int i = 0; i < f->nmeta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->meta_keys);
  free(f->meta_values);
  free(f->entries);
  free(f);
}

const dist_st_entry *dist_st_find(const dist_st_file *f, const char *name) {
  for (int i = 0; i < f->count; i++)
    if (strcmp(f->entries[i].name, name) == 0) return &f->entries[i];
  return NULL;
}

const char *dist_st_meta(const dist_st_file *f, const char *key) {
  for (int i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
  return NULL;
}

static int parse_metadata(json_t *meta, dist_st_file *f, dist_errbuf *eb) {
  if (!json_is_object(meta))
    return dist_fail(eb, DIST_EINVAL, "safetensors: __metadata__ is not an object");
  size_t n = json_object_size(meta);
  f->meta_keys = calloc(n + 1, sizeof *f->meta_keys);
  f->meta_values = calloc(n + 1, sizeof *f->meta_values);
  if (!f->meta_keys || !f->meta_values)
    return dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory");
  const char *k;
  json_t *v;
  json_object_foreach(meta, k, v) {
    if (!json_is_string(v))
      return dist_fail(eb, DIST_EINVAL, "safetensors: metadata '%.64s' is not a "
                       "string", k);
    f->meta_keys[f->nmeta] = strdup(k);
    f->meta_values[f->nmeta++] = strdup(json_string_value(v));
    if (!f->meta_keys[f->nmeta - 1] || !f->meta_values[f->nmeta - 1]) /* freed with f */
      return dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory");
  }
  return 0;
}

/* A JSON integer in [0, max]. */
static int get_uint(json_t *j, int64_t max, int64_t *out) {
  if (!json_is_integer(j)) return -1;
  json_int_t v = json_integer_value(j);
  if (v < 0 || v > max) return -1;
  *out = (int64_t)v;
  return 0;
}

static int parse_shape(const char *name, json_t *shape, dist_shape *s,
                       dist_errbuf *eb) {
  if (!json_is_array(shape))
    return dist_fail(eb, DIST_EINVAL, "safetensors: '%s': shape is not an array", name);
  if (json_array_size(shape) > DIST_MAX_DIMS)
    return dist_fail(eb, DIST_ENOTSUP, "safetensors: '%s' has %zu dims (at most "
                     "%d)", name, json_array_size(shape), DIST_MAX_DIMS);
  s->ndim = (int)json_array_size(shape);
  for (int d = 0; d < s->ndim; d++)
    if (get_uint(json_array_get(shape, (size_t)d), INT64_MAX, &s->dims[d]) != 0)
      return dist_fail(eb, DIST_EINVAL, "safetensors: '%s': shape entry %d is not "
                       "a non-negative integer", name, d);
  return 0;
}

/* Bytes the shape needs, or -1 on overflow past the data size. */
static int64_t shape_bytes(const dist_shape *s, size_t elem, size_t data_len) {
  uint64_t n = elem;
  for (int d = 0; d < s->ndim; d++) {
    uint64_t k = (uint64_t)s->dims[d];
    if (k != 0 && n > (uint64_t)data_len / k) {
      for (int e = d + 1; e < s->ndim; e++) /* a zero dim empties it */
        if (s->dims[e] == 0) return 0;
      return -1;
    }
    n *= k;
  }
  return n > (uint64_t)data_len ? -1 : (int64_t)n;
}

static int parse_entry(const char *name, json_t *e, const uint8_t *data,
                       size_t data_len, dist_st_entry *out, int64_t *begin,
                       dist_errbuf *eb) {
  if (strlen(name) >= DIST_ST_NAME_MAX)
    return dist_fail(eb, DIST_EINVAL, "safetensors: tensor name of %zu bytes "
                     "(at most %d)", strlen(name), DIST_ST_NAME_MAX - 1);
  if (!json_is_object(e))
    return dist_fail(eb, DIST_EINVAL, "safetensors: '%s' is not an object", name);
  json_t *dt = json_object_get(e, "dtype"), *offs = json_object_get(e, "data_offsets");
  if (!json_is_string(dt) || !offs || !json_object_get(e, "shape"))
    return dist_fail(eb, DIST_EINVAL, "safetensors: '%s' lacks dtype, shape or "
                     "data_offsets", name);
  snprintf(out->name, sizeof out->name, "%s", name);
  out->dtype = dtype_parse(json_string_value(dt));
  if (out->dtype == DIST_DTYPE_INVALID)
    return dist_fail(eb, DIST_ENOTSUP, "safetensors: '%s' has unsupported dtype "
                     "'%.16s'", name, json_string_value(dt));
  if (parse_shape(name, json_object_get(e, "shape"), &out->shape, eb) != 0)
    return eb ? eb->code : DIST_EINVAL;
  int64_t b, end;
  if (!json_is_array(offs) || json_array_size(offs) != 2 ||
      get_uint(json_array_get(offs, 0), (int64_t)data_len, &b) != 0 ||
      get_uint(json_array_get(offs, 1), (int64_t)data_len, &end) != 0 || end < b)
    return dist_fail(eb, DIST_EINVAL, "safetensors: '%s': data_offsets are not "
                     "[begin, end] within the %zu data bytes", name, data_len);
  int64_t need = shape_bytes(&out->shape, dist_dtype_size(out->dtype), data_len);
  if (need < 0 || need != end - b)
    return dist_fail(eb, DIST_EINVAL, "safetensors: '%s': data_offsets span %lld "
                     "bytes, its shape needs %lld", name, (long long)(end - b),
                     (long long)need);
  out->data = data + b;
  out->nbytes = (size_t)(end - b);
  *begin = b;
  return 0;
}

typedef struct ordered {
  int64_t begin;
  dist_st_entry e;
} ordered;

static int by_begin(const void *a, const void *b) {
  const ordered *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->e.nbytes > 0) - (y->e.nbytes > 0); /* empty ones first */
}

/* The entries must tile the data exactly: no overlap, no hole. */
static int check_tiling(ordered *o, int n, size_t data_len, dist_errbuf *eb) {
  qsort(o, (size_t)n, sizeof *o, by_begin);
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    if (o[i].begin != at)
      return dist_fail(eb, DIST_EINVAL, "safetensors: '%s' starts at data byte "
                       "%lld, expected %lld (overlap or hole)", o[i].e.name,
                       (long long)o[i].begin, (long long)at);
    at += (int64_t)o[i].e.nbytes;
  }
  if ((size_t)at != data_len)
    return dist_fail(eb, DIST_EINVAL, "safetensors: tensors cover %lld of %zu "
                     "data bytes", (long long)at, data_len);
  return 0;
}

static int parse_header(json_t *h, const uint8_t *data, size_t data_len,
                        dist_st_file *f, dist_errbuf *eb) {
  size_t n = json_object_size(h);
  ordered *o = calloc(n + 1, sizeof *o);
  if (!o) return dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory");
  int rc = 0;
  const char *k;
  json_t *v;
  json_object_foreach(h, k, v) {
    if (strcmp(k, "__metadata__") == 0) rc = parse_metadata(v, f, eb);
    else rc = parse_entry(k, v, data, data_len, &o[f->count].e, &o[f->count].begin, eb),
         f->count += rc == 0;
    if (rc != 0) goto out;
  }
  if ((rc = check_tiling(o, f->count, data_len, eb)) != 0) goto out;
  f->entries = calloc((size_t)f->count + 1, sizeof *f->entries);
  if (!f->entries) {
    rc = dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory");
    goto out;
  }
  for (int i = 0; i < f->count; i++) f->entries[i] = o[i].e;
out:
  free(o);
  return rc;
}

int dist_st_parse(const void *bytes, size_t len, dist_st_file **out,
                  dist_errbuf *eb) {
  *out = NULL;
  const uint8_t *b = bytes;
  if (len < 8)
    return dist_fail(eb, DIST_EINVAL, "safetensors: %zu bytes, shorter than the "
                     "8-byte header length", len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
  if (hlen > len - 8 || hlen > DIST_ST_HEADER_MAX || hlen < 2)
    return dist_fail(eb, DIST_EINVAL, "safetensors: header length %llu does not "
                     "fit the %zu-byte file (truncated?)", (unsigned long long)hlen,
                     len);
  json_error_t jerr;
  int no_memory;
  json_t *h = dist_json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES,
                              &jerr, &no_memory);
  if (no_memory)
    return dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory reading the header");
  if (!h || !json_is_object(h)) {
    json_decref(h);
    return dist_fail(eb, DIST_EINVAL, "safetensors: header is not a JSON object%s%s",
                     h ? "" : ": ", h ? "" : jerr.text);
  }
  dist_st_file *f = calloc(1, sizeof *f);
  int rc = f ? parse_header(h, b + 8 + hlen, len - 8 - (size_t)hlen, f, eb)
             : dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory");
  json_decref(h);
  if (rc != 0) dist_st_free(f);
  else *out = f;
  return rc;
}

/* Each builder answers NULL when jansson could not allocate a step, never
 * a header with an entry or a dim left out (json_memory.h). */
static json_t *entry_json(const dist_st_tensor *t, uint64_t begin, uint64_t end) {
  json_t *shape = json_array();
  int failed = !shape;
  for (int d = 0; d < t->shape.ndim; d++)
    failed |= json_array_append_new(shape, json_integer((json_int_t)t->shape.dims[d])) != 0;
  if (failed) {
    json_decref(shape);
    return NULL;
  }
  return json_pack("{s:s, s:o, s:[I,I]}", "dtype", dist_st_dtype_name(t->dtype),
                   "shape", shape, "data_offsets", (json_int_t)begin,
                   (json_int_t)end);
}

/* The metadata object; its keys and values are the caller's strings. */
static int add_metadata(json_t *h, const char *const *meta_kv, int nmeta, dist_errbuf *eb) {
  for (int i = 0; i < 2 * nmeta; i++)
    if (!meta_kv[i] || !dist_utf8_valid(meta_kv[i], strlen(meta_kv[i])))
      return dist_fail(eb, DIST_EINVAL, "safetensors: metadata %s %d is %s", i % 2 ? "value" : "key",
                       i / 2, meta_kv[i] ? "not valid UTF-8" : "NULL");
  json_t *m = json_object();
  int failed = !m;
  for (int i = 0; i < nmeta; i++)
    failed |= json_object_set_new(m, meta_kv[2 * i], json_string(meta_kv[2 * i + 1])) != 0;
  failed |= json_object_set_new(h, "__metadata__", m) != 0;
  return failed ? dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory building the "
                            "header's metadata") : 0;
}

static int add_entries(json_t *h, const dist_st_tensor *t, int n, dist_errbuf *eb) {
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    if (!dist_st_dtype_name(t[i].dtype) || !t[i].name ||
        strlen(t[i].name) >= DIST_ST_NAME_MAX || !strcmp(t[i].name, "__metadata__") ||
        !dist_utf8_valid(t[i].name, strlen(t[i].name)) || json_object_get(h, t[i].name))
      return dist_fail(eb, DIST_EINVAL, "safetensors: cannot write tensor '%s' (bad or "
                       "repeated name, or dtype)", t[i].name ? t[i].name : "(null)");
    uint64_t bytes = (uint64_t)dist_shape_numel(&t[i].shape) * dist_dtype_size(t[i].dtype);
    if (json_object_set_new(h, t[i].name, entry_json(&t[i], at, at + bytes)) != 0)
      return dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory building the "
                       "header's entry for '%s'", t[i].name);
    at += bytes;
  }
  return 0;
}

static json_t *header_json(const dist_st_tensor *t, int n,
                           const char *const *meta_kv, int nmeta,
                           dist_errbuf *eb) {
  json_t *h = json_object();
  if (!h) {
    dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory building the header");
    return NULL;
  }
  if ((nmeta > 0 && add_metadata(h, meta_kv, nmeta, eb) != 0) ||
      add_entries(h, t, n, eb) != 0) {
    json_decref(h);
    return NULL;
  }
  return h;
}

int dist_st_encode_header(const dist_st_tensor *t, int n,
                          const char *const *meta_kv, int nmeta, void **out,
                          size_t *len, dist_errbuf *eb) {
  *out = NULL;
  dist_errbuf own = DIST_ERRBUF_INIT;
  if (!eb) eb = &own; /* the code is the answer, said or not */
  json_t *h = header_json(t, n, meta_kv, nmeta, eb);
  if (!h) return eb->code;
  char *text = dist_json_dumps(h, JSON_COMPACT);
  json_decref(h);
  if (!text) return dist_fail(eb, DIST_ENOMEM, "safetensors: cannot format header");
  size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
  uint8_t *buf = malloc(8 + padded);
  if (!buf) {
    free(text);
    return dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory");
  }
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  memcpy(buf + 8, text, tl);
  memset(buf + 8 + tl, ' ', padded - tl);
  free(text);
  *out = buf;
  *len = 8 + padded;
  return 0;
}

int dist_st_encode(const dist_st_tensor *t, int n, const char *const *meta_kv,
                   int nmeta, void **out, size_t *len, dist_errbuf *eb) {
  void *head = NULL;
  size_t hl = 0, total;
  int rc = dist_st_encode_header(t, n, meta_kv, nmeta, &head, &hl, eb);
  if (rc != 0) return rc;
  total = hl;
  for (int i = 0; i < n; i++)
    total += (size_t)dist_shape_numel(&t[i].shape) * dist_dtype_size(t[i].dtype);
  uint8_t *buf = realloc(head, total ? total : 1);
  if (!buf) {
    free(head);
    return dist_fail(eb, DIST_ENOMEM, "safetensors: out of memory");
  }
  size_t at = hl;
  for (int i = 0; i < n; i++) {
    size_t b = (size_t)dist_shape_numel(&t[i].shape) * dist_dtype_size(t[i].dtype);
    if (b) memcpy(buf + at, t[i].data, b);
    at += b;
  }
  *out = buf;
  *len = total;
  return 0;
}
