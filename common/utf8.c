#include "utf8.h"

/* The continuation bytes a lead byte announces, and the least code point
 * that needs them (anything smaller is an overlong form); -1: not a lead. */
static int continuations(unsigned char lead, unsigned *cp, unsigned *least) {
  if (lead >= 0xc2 && lead <= 0xdf) return *cp = lead & 0x1fu, *least = 0x80, 1;
  if ((lead & 0xf0) == 0xe0) return *cp = lead & 0x0fu, *least = 0x800, 2;
  if (lead >= 0xf0 && lead <= 0xf4) return *cp = lead & 0x07u, *least = 0x10000, 3;
  return -1;
}

int dist_utf8_valid(const char *s, size_t len) {
  const unsigned char *p = (const unsigned char *)s, *end = p + len;
  while (p < end) {
    unsigned char lead = *p++;
    if (lead < 0x80) continue;
    unsigned cp, least;
    int more = continuations(lead, &cp, &least);
    if (more < 0 || end - p < more) return 0;
    for (; more > 0; more--, p++) {
      if ((*p & 0xc0) != 0x80) return 0;
      cp = cp << 6 | (*p & 0x3fu);
    }
    if (cp < least || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  }
  return 1;
}
