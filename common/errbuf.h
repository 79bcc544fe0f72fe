/* An error code with its detail: every internal function that can fail
 * returns a dist_err code and, when given one, fills an errbuf with a message
 * that names what is wrong ("tensor 'w' not found"). */
#ifndef DIST_ERRBUF_H
#define DIST_ERRBUF_H

#include "dist/error.h"

typedef struct dist_errbuf {
  int code;
  char msg[512];
} dist_errbuf;

#define DIST_ERRBUF_INIT {0, {0}}

/* Records code and a printf-style message in eb (which may be NULL) and
 * returns code, so callers can write `return dist_fail(eb, DIST_EINVAL, ...)`. */
int dist_fail(dist_errbuf *eb, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes eb's message with a context string ("rank 1: "), keeping its code. */
void dist_errbuf_prefix(dist_errbuf *eb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message of eb, or the code's generic message when none was recorded. */
const char *dist_errbuf_msg(const dist_errbuf *eb);

#endif
