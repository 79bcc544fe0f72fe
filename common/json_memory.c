#include "json_memory.h"

#include <stdarg.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* jansson's allocations on this thread that came back NULL, counted by
 * watched_malloc, which stands in front of the allocator jansson had when
 * libdist or distd first loaded JSON (the system's, or one the program set
 * before) and passes every call on to it. */
static _Thread_local unsigned long failed_here;
static json_malloc_t watched_underlying;

static void *watched_malloc(size_t n) {
  void *p = watched_underlying(n);
  if (!p) failed_here++;
  return p;
}

static void install_watch(void) {
  json_free_t f;
  json_get_alloc_funcs(&watched_underlying, &f);
  json_set_alloc_funcs(watched_malloc, f);
}

/* Once per process, never again: put back in front of an allocator set
 * later, the watch and a program's wrapper of it (calling the allocator it
 * found, as jansson's docs show) called each other for ever, and an
 * allocator a program put back kept the watch's old one. One set later
 * without calling the watch takes it away: failures are then told only
 * by what jansson says. */
static void watch_jansson(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, install_watch);
}

json_t *dist_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err,
                        int *no_memory) {
  json_error_t own;
  if (!err) err = &own;
  watch_jansson();
  unsigned long before = failed_here;
  json_t *json = json_loadb(buf, len, flags, err);
  /* the empty error: jansson 2.14 leaves it so when its first allocation
   * fails; input that is not JSON always says why */
  *no_memory = failed_here != before ||
               (!json && (json_error_code(err) == json_error_out_of_memory || !err->text[0]));
  if (!*no_memory) return json;
  json_decref(json); /* read while an allocation failed: it may be wrong */
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
  watch_jansson();
  unsigned long before = failed_here;
  va_start(ap, fmt);
  int rc = json_vunpack_ex(root, &err, 0, fmt, ap);
  va_end(ap);
  if (failed_here != before) return -1;
  if (rc == 0) return 0;
  return json_error_code(&err) == json_error_out_of_memory ? -1 : 1;
}
