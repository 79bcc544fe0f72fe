#include "json_memory.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int said_out_of_memory(const json_error_t *err) {
  return json_error_code(err) == json_error_out_of_memory || !err->text[0];
}

static int same_failure(const json_error_t *a, const json_error_t *b) {
  return !said_out_of_memory(a) && a->position == b->position && strcmp(a->text, b->text) == 0;
}

json_t *dist_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err,
                        int *no_memory) {
  json_error_t again;
  json_t *first = json_loadb(buf, len, flags, err), *second = json_loadb(buf, len, flags, &again);
  int agree = first ? second && json_equal(first, second) : !second && same_failure(err, &again);
  json_decref(second);
  *no_memory = !agree;
  if (agree) return first;
  json_decref(first);
  return NULL;
}

/* The text so far. A write that fails stays failed: jansson goes on after
 * some failed writes, and a later one must not make the text look whole. */
typedef struct dump_buf {
  char *text;
  size_t len, cap;
  int failed;
} dump_buf;

static int dump_append(const char *bytes, size_t n, void *data) {
  dump_buf *b = data;
  if (b->failed) return -1;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *grown = realloc(b->text, cap);
    if (!grown) return b->failed = 1, -1;
    b->text = grown, b->cap = cap;
  }
  memcpy(b->text + b->len, bytes, n);
  b->len += n;
  return 0;
}

char *dist_json_dumps(const json_t *json, size_t flags) {
  dump_buf b = {0};
  if (json_dump_callback(json, dump_append, &b, flags) != 0 || b.failed || !b.text) {
    free(b.text);
    return NULL;
  }
  b.text[b.len] = '\0';
  return b.text;
}

int dist_json_unpack(json_t *root, const char *fmt, ...) {
  json_error_t err;
  va_list ap;
  va_start(ap, fmt);
  int rc = json_vunpack_ex(root, &err, 0, fmt, ap);
  va_end(ap);
  if (rc == 0) return 0;
  return json_error_code(&err) == json_error_out_of_memory ? -1 : 1;
}
