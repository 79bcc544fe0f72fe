/* The .npy format (versions 1.0 and 2.0): magic, version, header length, a
 * Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': ...}
 * padded with spaces to a multiple of 64 bytes and ending in '\n', then the
 * raw C-order little-endian data. The decoder reads untrusted bytes: every
 * access is checked against the end of the buffer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "tensor.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host"
#endif

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6

static const struct {
  const char *descr;
  dist_dtype dt;
} descr_table[] = {
    {"|b1", DIST_BOOL},    {"|i1", DIST_INT8},    {"|u1", DIST_UINT8},
    {"<i1", DIST_INT8},    {"<u1", DIST_UINT8},   {"<i4", DIST_INT32},
    {"<i8", DIST_INT64},   {"<f2", DIST_FLOAT16}, {"<f4", DIST_FLOAT32},
    {"<f8", DIST_FLOAT64},
};

/* The descr dist_npy_write uses for dt; bfloat16 has none in numpy. */
static const char *descr_of(dist_dtype dt) {
  if (dt == DIST_BFLOAT16) return "<u2";
  for (size_t i = 0; i < sizeof descr_table / sizeof descr_table[0]; i++)
    if (descr_table[i].dt == dt) /* '|i1' comes before '<i1' */
      return descr_table[i].descr;
  return NULL;
}

/* ---- header parsing ---------------------------------------------------- */

typedef struct cursor {
  const char *p, *end;
} cursor;

static void skip_space(cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' ||
                           *c->p == '\r'))
    c->p++;
}

/* Consumes ch after optional spaces; returns 1 when it was there. */
static int accept(cursor *c, char ch) {
  skip_space(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return 1;
  }
  return 0;
}

/* A quoted Python string without escapes, copied into out (NUL-ended). */
static int parse_string(cursor *c, char *out, size_t outlen, dist_errbuf *eb) {
  skip_space(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
    return dist_fail(eb, DIST_EINVAL, "npy: header: expected a quoted string");
  char quote = *c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != quote) {
    if (*c->p == '\\')
      return dist_fail(eb, DIST_EINVAL, "npy: header: escapes in strings are not supported");
    if (n + 1 >= outlen)
      return dist_fail(eb, DIST_EINVAL, "npy: header: string longer than %zu bytes", outlen - 1);
    out[n++] = *c->p++;
  }
  if (c->p >= c->end)
    return dist_fail(eb, DIST_EINVAL, "npy: header: unterminated string");
  c->p++;
  out[n] = 0;
  return 0;
}

static int parse_bool(cursor *c, int *out, dist_errbuf *eb) {
  skip_space(c);
  size_t left = (size_t)(c->end - c->p);
  if (left >= 4 && memcmp(c->p, "True", 4) == 0) {
    c->p += 4;
    *out = 1;
    return 0;
  }
  if (left >= 5 && memcmp(c->p, "False", 5) == 0) {
    c->p += 5;
    *out = 0;
    return 0;
  }
  return dist_fail(eb, DIST_EINVAL, "npy: header: fortran_order must be True or False");
}

/* A non-negative dimension; Python 2 era files may end it with 'L'. */
static int parse_dim(cursor *c, int64_t *out, dist_errbuf *eb) {
  skip_space(c);
  if (c->p >= c->end || *c->p < '0' || *c->p > '9')
    return dist_fail(eb, DIST_EINVAL, "npy: header: shape must be a tuple of non-negative integers");
  int64_t v = 0;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    if (v > (INT64_MAX - 9) / 10)
      return dist_fail(eb, DIST_EINVAL, "npy: header: shape dimension too large");
    v = v * 10 + (*c->p++ - '0');
  }
  if (c->p < c->end && *c->p == 'L') c->p++;
  *out = v;
  return 0;
}

/* "()", "(5,)", "(2, 3)" or "(2, 3,)". */
static int parse_shape(cursor *c, dist_shape *shape, dist_errbuf *eb) {
  shape->ndim = 0;
  if (!accept(c, '('))
    return dist_fail(eb, DIST_EINVAL, "npy: header: shape must be a tuple");
  if (accept(c, ')')) return 0;
  for (;;) {
    int64_t v = 0;
    int rc = parse_dim(c, &v, eb);
    if (rc) return rc;
    if (shape->ndim == DIST_MAX_DIMS)
      return dist_fail(eb, DIST_ENOTSUP, "npy: more than %d dims are not supported", DIST_MAX_DIMS);
    shape->dims[shape->ndim++] = v;
    int comma = accept(c, ',');
    if (accept(c, ')')) break;
    if (!comma)
      return dist_fail(eb, DIST_EINVAL, "npy: header: malformed shape tuple");
  }
  /* Python writes a 1-tuple as "(5,)"; "(5)" is just a parenthesised int,
   * which numpy would not produce. Accept it anyway: it is unambiguous. */
  return 0;
}

static int descr_dtype(const char *descr, dist_dtype want, dist_dtype *dt,
                       dist_errbuf *eb) {
  for (size_t i = 0; i < sizeof descr_table / sizeof descr_table[0]; i++)
    if (strcmp(descr, descr_table[i].descr) == 0) {
      *dt = descr_table[i].dt;
      return 0;
    }
  if (strcmp(descr, "<u2") == 0 && want == DIST_BFLOAT16) {
    *dt = DIST_BFLOAT16;
    return 0;
  }
  if (descr[0] == '>' && descr[1] && descr[2])
    return dist_fail(eb, DIST_ENOTSUP, "npy: big-endian descr '%s' is not supported", descr);
  if (strcmp(descr, "<u2") == 0)
    return dist_fail(eb, DIST_ENOTSUP,
                     "npy: descr '<u2' (uint16) is only read as bfloat16, when bfloat16 is asked for");
  return dist_fail(eb, DIST_ENOTSUP, "npy: unsupported descr '%s'", descr);
}

typedef struct header {
  char descr[32];
  int fortran;
  dist_shape shape;
  int have_descr, have_fortran, have_shape;
} header;

static int parse_entry(cursor *c, header *h, dist_errbuf *eb) {
  char key[32];
  int rc = parse_string(c, key, sizeof key, eb);
  if (rc) return rc;
  if (!accept(c, ':'))
    return dist_fail(eb, DIST_EINVAL, "npy: header: expected ':' after '%s'", key);
  if (strcmp(key, "descr") == 0 && !h->have_descr) {
    h->have_descr = 1;
    skip_space(c);
    if (c->p < c->end && *c->p == '[')
      return dist_fail(eb, DIST_ENOTSUP, "npy: structured dtypes are not supported");
    return parse_string(c, h->descr, sizeof h->descr, eb);
  }
  if (strcmp(key, "fortran_order") == 0 && !h->have_fortran) {
    h->have_fortran = 1;
    return parse_bool(c, &h->fortran, eb);
  }
  if (strcmp(key, "shape") == 0 && !h->have_shape) {
    h->have_shape = 1;
    return parse_shape(c, &h->shape, eb);
  }
  return dist_fail(eb, DIST_EINVAL, "npy: header: unexpected or repeated key '%s'", key);
}

static int parse_dict(const char *text, size_t len, header *h, dist_errbuf *eb) {
  cursor c = {text, text + len};
  memset(h, 0, sizeof *h);
  if (!accept(&c, '{'))
    return dist_fail(eb, DIST_EINVAL, "npy: header: expected '{'");
  while (!accept(&c, '}')) {
    int rc = parse_entry(&c, h, eb);
    if (rc) return rc;
    if (accept(&c, ',')) continue;
    skip_space(&c);
    if (c.p >= c.end || *c.p != '}')
      return dist_fail(eb, DIST_EINVAL, "npy: header: expected ',' or '}'");
  }
  skip_space(&c);
  if (c.p != c.end)
    return dist_fail(eb, DIST_EINVAL, "npy: header: trailing bytes after the dict");
  if (!h->have_descr || !h->have_fortran || !h->have_shape)
    return dist_fail(eb, DIST_EINVAL, "npy: header: missing key '%s'",
                     !h->have_descr ? "descr" : !h->have_fortran ? "fortran_order" : "shape");
  return 0;
}

/* Finds the header text after the magic and version; *data_off is where the
 * data starts. */
static int locate_header(const unsigned char *b, size_t len, const char **text,
                         size_t *text_len, size_t *data_off, dist_errbuf *eb) {
  if (len < NPY_MAGIC_LEN + 2 || memcmp(b, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
    return dist_fail(eb, DIST_EINVAL, "npy: not a .npy file (bad magic)");
  int major = b[6], minor = b[7];
  size_t pre;
  uint64_t hlen;
  if (major == 1 && minor == 0) {
    pre = 10;
    if (len < pre) return dist_fail(eb, DIST_EINVAL, "npy: truncated header");
    hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8;
  } else if (major == 2 && minor == 0) {
    pre = 12;
    if (len < pre) return dist_fail(eb, DIST_EINVAL, "npy: truncated header");
    hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8 | (uint64_t)b[10] << 16 |
           (uint64_t)b[11] << 24;
  } else {
    return dist_fail(eb, DIST_ENOTSUP, "npy: format version %d.%d is not supported (1.0 and 2.0 are)",
                     major, minor);
  }
  if (hlen > len - pre)
    return dist_fail(eb, DIST_EINVAL, "npy: truncated header (%llu bytes announced, %zu present)",
                     (unsigned long long)hlen, len - pre);
  *text = (const char *)b + pre;
  *text_len = (size_t)hlen;
  *data_off = pre + (size_t)hlen;
  return 0;
}

int dist_npy_parse(const void *bytes, size_t len, dist_dtype *dt,
                   dist_shape *shape, const void **data, size_t *nbytes,
                   dist_errbuf *eb) {
  const char *text = NULL;
  size_t text_len = 0, off = 0;
  header h;
  dist_dtype got = DIST_DTYPE_INVALID;
  int rc = locate_header(bytes, len, &text, &text_len, &off, eb);
  if (!rc) rc = parse_dict(text, text_len, &h, eb);
  if (!rc) rc = descr_dtype(h.descr, *dt, &got, eb);
  if (rc) return rc;
  if (h.fortran)
    return dist_fail(eb, DIST_ENOTSUP, "npy: fortran_order True is not supported (C order only)");
  /* The size of the non-empty dims must fit an int64_t even when another dim
   * is 0: callers multiply every dim in order ((2^62, 2, 0) holds 0 bytes,
   * yet 2^62 * 2 overflows on the way). */
  uint64_t need = dist_dtype_size(got);
  int empty = 0;
  for (int d = 0; d < h.shape.ndim; d++) {
    if (h.shape.dims[d] == 0) {
      empty = 1;
      continue;
    }
    if (__builtin_mul_overflow(need, (uint64_t)h.shape.dims[d], &need) ||
        need > INT64_MAX)
      return dist_fail(eb, DIST_EINVAL, "npy: shape overflows the addressable size");
  }
  if (empty) need = 0;
  char sbuf[160];
  dist_shape_format(&h.shape, sbuf, sizeof sbuf);
  if (need > len - off)
    return dist_fail(eb, DIST_EINVAL, "npy: truncated data: shape %s of %s needs %llu bytes, %zu present",
                     sbuf, dist_dtype_name(got), (unsigned long long)need, len - off);
  if (need < len - off)
    return dist_fail(eb, DIST_EMISMATCH, "npy: size mismatch: shape %s of %s needs %llu bytes, %zu present",
                     sbuf, dist_dtype_name(got), (unsigned long long)need, len - off);
  *dt = got;
  *shape = h.shape;
  *data = (const char *)bytes + off;
  *nbytes = (size_t)need;
  return 0;
}

/* ---- files ------------------------------------------------------------- */

int dist_npy_read(const char *path, dist_dtype *dt, dist_shape *shape,
                  void **data, size_t *nbytes, dist_errbuf *eb) {
  char *buf = NULL;
  size_t len = 0;
  const void *payload;
  int rc = dist_read_file(path, &buf, &len, eb);
  if (rc) return rc;
  rc = dist_npy_parse(buf, len, dt, shape, &payload, nbytes, eb);
  if (rc) {
    dist_errbuf_prefix(eb, "%s: ", path);
    goto out;
  }
  /* Hand back the file buffer itself, with the data moved to its front. */
  memmove(buf, payload, *nbytes);
  *data = buf;
  buf = NULL;
out:
  free(buf);
  return rc;
}

/* Builds the padded header (magic to '\n') into out; returns its length. */
static size_t build_header(dist_dtype dt, const dist_shape *shape, char *out,
                           size_t cap) {
  char dict[512], dims[256];
  size_t pos = 0;
  dims[0] = 0;
  for (int d = 0; d < shape->ndim; d++)
    pos += (size_t)snprintf(dims + pos, sizeof dims - pos, "%s%lld", d ? ", " : "",
                            (long long)shape->dims[d]);
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s%s), }",
                   descr_of(dt), dims, shape->ndim == 1 ? "," : "");
  /* Version 1.0 stores the header length in 16 bits; its total (10 + dict +
   * padding + '\n') is a multiple of 64, as numpy writes it. */
  size_t pre = 10, total = ((pre + (size_t)n + 1 + 63) / 64) * 64;
  if (total - pre > 0xffff) pre = 12, total = ((pre + (size_t)n + 1 + 63) / 64) * 64;
  if (total > cap) return 0;
  size_t hlen = total - pre;
  memcpy(out, NPY_MAGIC, NPY_MAGIC_LEN);
  out[6] = pre == 10 ? 1 : 2;
  out[7] = 0;
  for (size_t i = 0; i < pre - 8; i++) out[8 + i] = (char)(hlen >> (8 * i));
  memcpy(out + pre, dict, (size_t)n);
  memset(out + pre + n, ' ', total - pre - (size_t)n - 1);
  out[total - 1] = '\n';
  return total;
}

/* A write that failed leaves no partial file behind, which a later reader
 * would take for the tensor (or fail on as truncated). Only a regular file
 * is removed: a FIFO or device named as the output stays. */
static int write_failed(const char *path, dist_errbuf *eb) {
  int err = errno;
  struct stat st;
  if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) unlink(path);
  return dist_fail(eb, DIST_EIO, "%s: write failed: %s", path, strerror(err));
}

int dist_npy_write(const char *path, dist_dtype dt, const dist_shape *shape,
                   const void *data, dist_errbuf *eb) {
  if (!descr_of(dt))
    return dist_fail(eb, DIST_EINVAL, "%s: npy: cannot write dtype %s", path,
                     dist_dtype_name(dt));
  if (shape->ndim < 0 || shape->ndim > DIST_MAX_DIMS)
    return dist_fail(eb, DIST_EINVAL, "%s: npy: bad ndim %d", path, shape->ndim);
  for (int d = 0; d < shape->ndim; d++)
    if (shape->dims[d] < 0)
      return dist_fail(eb, DIST_EINVAL, "%s: npy: negative dim %lld", path,
                       (long long)shape->dims[d]);
  char head[640];
  size_t hlen = build_header(dt, shape, head, sizeof head);
  size_t nbytes = (size_t)dist_shape_numel(shape) * dist_dtype_size(dt);
  FILE *f = fopen(path, "wb");
  if (!f) return dist_fail(eb, DIST_EIO, "%s: %s", path, strerror(errno));
  int ok = fwrite(head, 1, hlen, f) == hlen &&
           (nbytes == 0 || fwrite(data, 1, nbytes, f) == nbytes);
  ok = (fclose(f) == 0) && ok;
  return ok ? 0 : write_failed(path, eb);
}
