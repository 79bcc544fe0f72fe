/* UTF-8 validity, as RFC 3629 defines it: no overlong forms, no surrogates,
 * nothing past U+10FFFF. jansson checks the same before it makes a string,
 * but answers NULL for a string it could not allocate too, so a check made
 * through it called valid names invalid whenever memory ran out. */
#ifndef DIST_UTF8_H
#define DIST_UTF8_H

#include <stddef.h>

/* 1 when the len bytes at s are UTF-8 (NUL is a character like another). */
int dist_utf8_valid(const char *s, size_t len);

#endif
