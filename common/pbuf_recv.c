/* Unpacking a received message straight from gRPC's slices.
 *
 * A tensor arrives as one large `bytes` field of a message spread over many
 * slices. Gathering the slices into one block for protobuf-c, whose unpack
 * then copies the field out again, costs two copies and two fresh blocks,
 * and on this VM every 4 KiB page of a fresh block faults at 13-14 us
 * (docs/performance-notes.md). Instead the top-level fields are walked on
 * the slices themselves: a large singular bytes field is copied once,
 * straight into a block of its own, and only the rest of the message is
 * gathered for protobuf-c; the large fields are set into the unpacked
 * message afterwards. Anything the walk does not understand (groups, a
 * truncated field) falls back to gathering everything, so protobuf-c gives
 * its own verdict on it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "pbuf.h"

#define SPLIT_MIN (64u << 10) /* smaller fields are not worth a block of their own */
#define SPLIT_MAX 8           /* large fields taken out of one message */

/* allocator_data is the unpack's out-of-memory flag (unpack_state). */
static void *pb_alloc(void *data, size_t n) {
  void *p = dist_malloc_large(n);
  if (!p) *(int *)data = 1;
  return p;
}

static void pb_free(void *data, void *p) {
  (void)data;
  free(p);
}

/* Every block is an ordinary malloc'd one, so protobuf_c_message_free_unpacked
 * (m, NULL) frees a message unpacked here. protobuf-c answers NULL both for
 * a malformed message and for a block it could not get: the allocator
 * notes the second in *no_memory, so that a caller can tell them apart. */
static ProtobufCMessage *unpack(const ProtobufCMessageDescriptor *desc, size_t len,
                                const uint8_t *buf, int *no_memory) {
  ProtobufCAllocator large_aware = {pb_alloc, pb_free, no_memory};
  return protobuf_c_message_unpack(desc, &large_aware, len, buf);
}

/* The unread rest of a byte buffer. */
typedef struct cursor {
  grpc_byte_buffer_reader r;
  const uint8_t *p;
  size_t in_slice; /* bytes left at p */
  size_t left;     /* bytes left in the message */
} cursor;

static int cursor_open(cursor *c, grpc_byte_buffer *bb) {
  *c = (cursor){.left = grpc_byte_buffer_length(bb)};
  return grpc_byte_buffer_reader_init(&c->r, bb);
}

/* Copies the next n bytes to dst (NULL: passes over them); 0 if the
 * message ends first. */
static int take(cursor *c, uint8_t *dst, size_t n) {
  if (n > c->left) return 0;
  c->left -= n;
  while (n > 0) {
    grpc_slice *s;
    while (c->in_slice == 0) {
      if (!grpc_byte_buffer_reader_peek(&c->r, &s)) return 0;
      c->p = GRPC_SLICE_START_PTR(*s);
      c->in_slice = GRPC_SLICE_LENGTH(*s);
    }
    size_t k = n < c->in_slice ? n : c->in_slice;
    if (dst) memcpy(dst, c->p, k), dst += k;
    c->p += k, c->in_slice -= k, n -= k;
  }
  return 1;
}

/* A varint, whose raw bytes are appended at raw + *len (for the gathered
 * part, which keeps the field as it came). */
static int varint(cursor *c, uint64_t *v, uint8_t *raw, size_t *len) {
  *v = 0;
  for (int i = 0; i < 10; i++) {
    uint8_t b;
    if (!take(c, &b, 1)) return 0;
    raw[(*len)++] = b;
    *v |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) return 1;
  }
  return 0;
}

typedef struct split {
  const ProtobufCFieldDescriptor *f;
  uint8_t *data;
  size_t len;
} split;

typedef struct walk {
  cursor c;
  const ProtobufCMessageDescriptor *desc;
  size_t split_min; /* smallest field taken out */
  uint8_t *rest; /* the gathered part: room for the whole message, untouched
                    pages of which cost nothing */
  size_t rest_len;
  split sp[SPLIT_MAX];
  int n_sp;
  int *no_memory; /* set when a block could not be allocated */
} walk;

static const ProtobufCFieldDescriptor *splittable(const walk *w, uint64_t id, uint64_t len) {
  if (len < w->split_min || w->n_sp == SPLIT_MAX || id > UINT32_MAX) return NULL;
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field(w->desc, (unsigned)id);
  if (!f || f->type != PROTOBUF_C_TYPE_BYTES || (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
    return NULL;
  return f->label == PROTOBUF_C_LABEL_NONE || f->label == PROTOBUF_C_LABEL_OPTIONAL ? f : NULL;
}

/* A singular field seen again: the last one wins, as in protobuf, so an
 * earlier large value taken out is dropped. */
static void drop_split(walk *w, uint64_t id) {
  for (int i = 0; i < w->n_sp; i++)
    if (w->sp[i].f->id == id) {
      free(w->sp[i].data);
      w->sp[i] = w->sp[--w->n_sp];
      return;
    }
}

/* One top-level field: into a block of its own, or onto the rest. */
static int walk_field(walk *w) {
  uint8_t raw[20];
  size_t n = 0;
  uint64_t tag, len;
  if (!varint(&w->c, &tag, raw, &n)) return -1;
  switch (tag & 7) {
  case 0: /* varint: its raw bytes are the whole field */
    if (!varint(&w->c, &len, raw, &n)) return -1;
    len = 0;
    break;
  case 1: len = 8; break;
  case 5: len = 4; break;
  case 2: {
    if (!varint(&w->c, &len, raw, &n) || len > w->c.left) return -1;
    drop_split(w, tag >> 3);
    const ProtobufCFieldDescriptor *f = splittable(w, tag >> 3, len);
    if (!f) break;
    uint8_t *block = dist_malloc_large((size_t)len);
    if (!block) return *w->no_memory = 1, -1;
    w->sp[w->n_sp++] = (split){f, block, (size_t)len};
    return take(&w->c, block, (size_t)len) ? 0 : -1;
  }
  default: return -1; /* groups: left to protobuf-c */
  }
  memcpy(w->rest + w->rest_len, raw, n);
  w->rest_len += n;
  if (!take(&w->c, w->rest + w->rest_len, (size_t)len)) return -1;
  w->rest_len += (size_t)len;
  return 0;
}

static void set_split(ProtobufCMessage *m, const split *s) {
  ProtobufCBinaryData *bd = (ProtobufCBinaryData *)((uint8_t *)m + s->f->offset);
  const ProtobufCBinaryData *def = s->f->default_value;
  /* An earlier occurrence left in the rest: the large one came last, and
   * wins. A proto2 default is static, not freed. */
  if (!def || bd->data != def->data) free(bd->data);
  bd->data = s->data;
  bd->len = s->len;
  if (s->f->label == PROTOBUF_C_LABEL_OPTIONAL)
    *(protobuf_c_boolean *)((uint8_t *)m + s->f->quantifier_offset) = 1;
}

/* Unpacks by walking; NULL with *fallback set when the walk cannot tell. */
static ProtobufCMessage *unpack_split(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                      size_t split_min, int *fallback, int *no_memory) {
  walk w = {.desc = desc, .split_min = split_min, .no_memory = no_memory};
  *fallback = 1;
  if (!cursor_open(&w.c, bb)) return NULL;
  w.rest = malloc(w.c.left);
  int rc = w.rest ? 0 : (*no_memory = 1, -1);
  while (rc == 0 && w.c.left > 0) rc = walk_field(&w);
  grpc_byte_buffer_reader_destroy(&w.c.r);
  ProtobufCMessage *m = NULL;
  if (rc == 0) {
    *fallback = 0;
    m = unpack(desc, w.rest_len, w.rest, no_memory);
  }
  for (int i = 0; i < w.n_sp; i++) {
    if (m) set_split(m, &w.sp[i]);
    else free(w.sp[i].data);
  }
  free(w.rest);
  return m;
}

size_t dist_bb_scan_field(grpc_byte_buffer *bb, uint32_t field, uint64_t *value) {
  cursor c;
  if (!bb || !cursor_open(&c, bb)) return 0;
  size_t found = 0;
  while (c.left > 0) {
    uint8_t raw[20];
    size_t n = 0;
    uint64_t tag, v, len = 0;
    if (!varint(&c, &tag, raw, &n)) break;
    int wire = (int)(tag & 7), ok = 1;
    n = 0;
    found += tag >> 3 == field;
    if (wire == 0) {
      ok = varint(&c, &v, raw, &n);
      if (ok && tag >> 3 == field) *value = v;
    } else if (wire == 2) {
      ok = varint(&c, &len, raw, &n) && take(&c, NULL, (size_t)len);
    } else if (wire == 1 || wire == 5) {
      ok = take(&c, NULL, wire == 1 ? 8 : 4);
    } else {
      ok = 0; /* groups: not in our messages */
    }
    if (!ok) break;
  }
  grpc_byte_buffer_reader_destroy(&c.r);
  return found;
}

/* The message's bytes in one block: the slices copied in order. */
static uint8_t *gather(grpc_byte_buffer *bb, size_t *len, int *no_memory) {
  cursor c;
  if (!cursor_open(&c, bb)) return NULL;
  *len = c.left;
  uint8_t *buf = dist_malloc_large(*len ? *len : 1);
  if (!buf) *no_memory = 1;
  if (buf && !take(&c, buf, *len)) {
    free(buf);
    buf = NULL;
  }
  grpc_byte_buffer_reader_destroy(&c.r);
  return buf;
}

static ProtobufCMessage *unpack_gathered(grpc_byte_buffer *bb,
                                         const ProtobufCMessageDescriptor *desc, int *no_memory) {
  size_t len = 0;
  uint8_t *buf = gather(bb, &len, no_memory);
  if (!buf) return NULL;
  ProtobufCMessage *m = unpack(desc, len, buf, no_memory);
  free(buf);
  return m;
}

ProtobufCMessage *dist_bb_to_pb_split(grpc_byte_buffer *bb,
                                      const ProtobufCMessageDescriptor *desc,
                                      size_t split_min, int *no_memory) {
  int ignored = 0;
  if (!no_memory) no_memory = &ignored;
  *no_memory = 0;
  if (!bb) return NULL;
  if (split_min < 1) split_min = 1;
  if (grpc_byte_buffer_length(bb) < split_min) return unpack_gathered(bb, desc, no_memory);
  int fallback;
  ProtobufCMessage *m = unpack_split(bb, desc, split_min, &fallback, no_memory);
  return m || !fallback || *no_memory ? m : unpack_gathered(bb, desc, no_memory);
}

ProtobufCMessage *dist_bb_to_pb(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                int *no_memory) {
  return dist_bb_to_pb_split(bb, desc, SPLIT_MIN, no_memory);
}
