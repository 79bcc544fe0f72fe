#include "errbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int dist_fail(dist_errbuf *eb, int code, const char *fmt, ...) {
  if (eb) {
    va_list ap;
    va_start(ap, fmt);
    eb->code = code;
    vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

void dist_errbuf_prefix(dist_errbuf *eb, const char *fmt, ...) {
  if (!eb) return;
  /* As long as the message: a 128-byte prefix cut the restore's "what the
   * store now holds" at "the rest as loade", before "restore again". */
  char prefix[sizeof eb->msg], old[sizeof eb->msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, eb->msg, sizeof old);
  /* Build by hand: the prefix may push the tail of the message out. */
  size_t n = strlen(prefix);
  if (n >= sizeof eb->msg) n = sizeof eb->msg - 1;
  memcpy(eb->msg, prefix, n);
  size_t rest = strnlen(old, sizeof old - 1);
  if (rest > sizeof eb->msg - 1 - n) rest = sizeof eb->msg - 1 - n;
  memcpy(eb->msg + n, old, rest);
  eb->msg[n + rest] = 0;
}

const char *dist_errbuf_msg(const dist_errbuf *eb) {
  if (eb->msg[0]) return eb->msg;
  return dist_strerror(eb->code);
}
